//! Deterministic random weights and their quantization for `ferrite synth`.
//!
//! Every row of every tensor has its own random stream, seeded from (seed, tensor name, row),
//! so the bytes do not depend on how rows are split across threads. Values are
//! normal(0, 1/sqrt(fan_in)) (Box–Muller over xorshift64*): with RMS-normalised inputs each
//! matrix keeps activations near unit scale, so the stack stays finite. Rows are generated
//! and quantized in place, one row buffer per thread; no f32 copy of a tensor is ever held.

use anyhow::{Context, bail};
use ferrite_gguf::GgmlType;

/// SplitMix64 finalizer: turns structured seeds into well-mixed ones.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// FNV-1a of a tensor name.
fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// xorshift64* stream of one row.
struct Rng(u64);

impl Rng {
    fn new(seed: u64, tensor: u64, row: u64) -> Rng {
        // A zero state would stay zero; `| 1` rules it out.
        Rng(mix(seed ^ mix(tensor ^ mix(row))) | 1)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in (0, 1].
    fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Fills `out` with normal(0, std) values, two per Box–Muller pair.
    fn fill_normal(&mut self, out: &mut [f32], std: f64) {
        for pair in out.chunks_mut(2) {
            let r = (-2.0 * self.unit().ln()).sqrt() * std;
            let theta = std::f64::consts::TAU * self.unit();
            pair[0] = (r * theta.cos()) as f32;
            if let Some(second) = pair.get_mut(1) {
                *second = (r * theta.sin()) as f32;
            }
        }
    }
}

/// How a tensor's values are made.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    /// normal(0, 1/sqrt(row length)).
    Normal,
    /// Every value this constant (RMSNorm weights: 1).
    Const(f32),
}

/// One tensor to write: GGUF dims (`dims[0]` is the row length), type and init.
#[derive(Debug, Clone)]
pub struct Spec {
    /// Tensor name.
    pub name: String,
    /// GGUF dims.
    pub dims: Vec<u64>,
    /// Storage type.
    pub ty: GgmlType,
    /// Values.
    pub init: Init,
}

/// Generates and quantizes one tensor on `threads` threads.
pub fn make(spec: &Spec, seed: u64, threads: usize) -> anyhow::Result<Vec<u8>> {
    // Rows of every further dimension (a stack of experts is rows of each expert's).
    let (cols, rows) = match spec.dims.as_slice() {
        [c, rest @ ..] => (*c as usize, rest.iter().product::<u64>() as usize),
        [] => bail!("{}: a tensor without dimensions", spec.name),
    };
    let row_bytes = spec.ty.row_bytes(cols as u64).with_context(|| {
        format!(
            "{}: {cols} is not a whole number of {} blocks",
            spec.name, spec.ty
        )
    })? as usize;
    let mut out = vec![0u8; row_bytes * rows];
    let tensor = name_hash(&spec.name);
    let std = 1.0 / (cols as f64).sqrt();
    let per = rows.div_ceil(threads.max(1)).max(1);
    let work = |first: usize, chunk: &mut [u8]| -> anyhow::Result<()> {
        let mut buf = vec![0f32; cols];
        for (i, dst) in chunk.chunks_mut(row_bytes).enumerate() {
            match spec.init {
                Init::Const(v) => buf.fill(v),
                Init::Normal => {
                    Rng::new(seed, tensor, (first + i) as u64).fill_normal(&mut buf, std)
                }
            }
            ferrite_quant::quantize(spec.ty, &buf, dst)
                .with_context(|| format!("quantizing {} to {}", spec.name, spec.ty))?;
        }
        Ok(())
    };
    std::thread::scope(|s| {
        let handles: Vec<_> = out
            .chunks_mut(per * row_bytes)
            .enumerate()
            .map(|(t, chunk)| s.spawn(move || work(t * per, chunk)))
            .collect();
        handles.into_iter().try_for_each(|h| {
            h.join()
                .map_err(|_| anyhow::anyhow!("a quantization thread panicked"))?
        })
    })?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(ty: GgmlType) -> Spec {
        Spec {
            name: "blk.0.attn_q.weight".into(),
            dims: vec![256, 8],
            ty,
            init: Init::Normal,
        }
    }

    #[test]
    fn bytes_do_not_depend_on_thread_count() {
        let one = make(&spec(GgmlType::Q4_K), 7, 1).unwrap();
        assert_eq!(one, make(&spec(GgmlType::Q4_K), 7, 3).unwrap());
        assert_ne!(one, make(&spec(GgmlType::Q4_K), 8, 3).unwrap());
    }

    #[test]
    fn normal_values_have_the_intended_scale() {
        let bytes = make(&spec(GgmlType::F32), 1, 2).unwrap();
        let v: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let mean = v.iter().map(|x| f64::from(*x)).sum::<f64>() / v.len() as f64;
        let var = v
            .iter()
            .map(|x| (f64::from(*x) - mean).powi(2))
            .sum::<f64>()
            / v.len() as f64;
        // 2048 samples of normal(0, 1/16): the variance is 1/256 within a few percent.
        assert!(mean.abs() < 0.01, "{mean}");
        assert!((var * 256.0 - 1.0).abs() < 0.1, "{var}");
    }

    #[test]
    fn partial_blocks_are_an_error() {
        let mut s = spec(GgmlType::Q4_K);
        s.dims = vec![64, 2];
        assert!(make(&s, 1, 1).is_err());
    }
}
