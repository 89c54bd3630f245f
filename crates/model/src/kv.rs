//! The key/value cache of one session: per layer, one key and one value row per position.
//!
//! Layout per layer: `ctx` key rows then `ctx` value rows, each row `n_kv_head × head_dim`
//! values. f16 halves the memory and matches llama.cpp's default; f32 is there for exactness
//! checks. Rows are widened to f32 into caller scratch before attention reads them, so the
//! attention code is the same for both types.

use ferrite_quant::kernels::{DequantFn, dequant_fn};
use ferrite_quant::{GgmlType, simd_level};
use half::f16;
use half::slice::HalfFloatSliceExt;

use crate::ModelError;

/// A vector of `n` copies of `v`, or an error instead of an abort when the size overflows
/// or the allocation fails (context sizes come from users).
pub(crate) fn try_vec<T: Clone>(n: Option<usize>, v: T, what: &str) -> Result<Vec<T>, ModelError> {
    let fail = || ModelError::InvalidArgument(format!("cannot allocate the {what}"));
    let n = n.ok_or_else(fail)?;
    let mut out = Vec::new();
    out.try_reserve_exact(n).map_err(|_| fail())?;
    out.resize(n, v);
    Ok(out)
}

/// Element type of the KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvType {
    /// IEEE half precision (default).
    #[default]
    F16,
    /// IEEE single precision.
    F32,
}

#[derive(Debug)]
pub(crate) enum Store {
    F16(Vec<f16>),
    F32(Vec<f32>),
}

/// Key/value rows for `n_layer` layers and `ctx` positions.
#[derive(Debug)]
pub struct KvCache {
    pub(crate) store: Store,
    ctx: usize,
    pub(crate) row: usize,
    /// The widest f16 to f32 conversion the machine has (the F16 weight dequantizer):
    /// batched decode widens every cached row of every session at every step, and the
    /// eight-lane slice conversion was a quarter of a 16-session step's time.
    widen: DequantFn,
}

impl KvCache {
    /// A zeroed cache. `row` is `n_kv_head × head_dim`. Fails cleanly when the cache
    /// cannot be allocated.
    pub fn new(ty: KvType, n_layer: usize, ctx: usize, row: usize) -> Result<KvCache, ModelError> {
        let n = n_layer
            .checked_mul(2)
            .and_then(|x| x.checked_mul(ctx))
            .and_then(|x| x.checked_mul(row));
        let store = match ty {
            KvType::F16 => Store::F16(try_vec(n, f16::ZERO, "KV cache")?),
            KvType::F32 => Store::F32(try_vec(n, 0.0, "KV cache")?),
        };
        let widen =
            dequant_fn(simd_level(), GgmlType::F16).map_err(|source| ModelError::Quant {
                name: "KV cache".into(),
                source,
            })?;
        Ok(KvCache {
            store,
            ctx,
            row,
            widen,
        })
    }

    /// Number of positions the cache holds.
    pub fn ctx(&self) -> usize {
        self.ctx
    }

    /// Element type.
    pub fn ty(&self) -> KvType {
        match self.store {
            Store::F16(_) => KvType::F16,
            Store::F32(_) => KvType::F32,
        }
    }

    pub(crate) fn offset(&self, layer: usize, value: bool, pos: usize) -> usize {
        ((layer * 2 + usize::from(value)) * self.ctx + pos) * self.row
    }

    /// Writes the key and value rows of consecutive positions starting at `pos`
    /// (`k` and `v` hold `n × row` values). The caller checks `pos + n <= ctx`.
    pub fn store(&mut self, layer: usize, pos: usize, k: &[f32], v: &[f32]) {
        for (value, src) in [(false, k), (true, v)] {
            let o = self.offset(layer, value, pos);
            match &mut self.store {
                // The slice conversions use F16C eight lanes at a time; per-element
                // `f16::from_f32` calls were a tenth of decode time.
                Store::F16(d) => d[o..o + src.len()].convert_from_f32_slice(src),
                Store::F32(d) => d[o..o + src.len()].copy_from_slice(src),
            }
        }
    }

    /// Widens the whole key (`value == false`) or value rows of `layer` at positions
    /// `range` into `dst` (`range.len() × row` values, position-major): one contiguous
    /// conversion, exact for either element type.
    pub fn load_rows(
        &self,
        layer: usize,
        value: bool,
        range: std::ops::Range<usize>,
        dst: &mut [f32],
    ) {
        let o = self.offset(layer, value, range.start);
        let n = range.len() * self.row;
        match &self.store {
            Store::F16(d) => (self.widen)(bytemuck::cast_slice(&d[o..o + n]), &mut dst[..n]),
            Store::F32(d) => dst[..n].copy_from_slice(&d[o..o + n]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_round_trip_per_layer() {
        for ty in [KvType::F16, KvType::F32] {
            let mut kv = KvCache::new(ty, 2, 4, 6).unwrap();
            let k: Vec<f32> = (0..12).map(|i| i as f32).collect();
            let v: Vec<f32> = (0..12).map(|i| -(i as f32)).collect();
            kv.store(1, 2, &k, &v);
            let mut dst = vec![f32::NAN; 12];
            kv.load_rows(1, false, 2..4, &mut dst);
            assert_eq!(dst, k);
            kv.load_rows(1, true, 3..4, &mut dst[..6]);
            assert_eq!(&dst[..6], &v[6..]);
            // Layer 0 was never written.
            kv.load_rows(0, false, 2..3, &mut dst[..6]);
            assert_eq!(&dst[..6], &[0.0; 6]);
            assert_eq!(kv.ty(), ty);
        }
    }

    /// Every non-NaN half value widens to the f32 `half` gives it, bit for bit (zeros of
    /// both signs, subnormals, infinities), through rows long enough for the vector path
    /// and a tail shorter than a vector.
    #[test]
    fn widening_is_exact_for_every_half() {
        let halves: Vec<f16> = (0..=u16::MAX)
            .map(f16::from_bits)
            .filter(|h| !h.is_nan())
            .collect();
        let row = 97;
        let n = halves.len() / row;
        let mut kv = KvCache::new(KvType::F16, 1, n, row).unwrap();
        let Store::F16(d) = &mut kv.store else {
            unreachable!()
        };
        d[..n * row].copy_from_slice(&halves[..n * row]);
        let mut got = vec![f32::NAN; n * row];
        kv.load_rows(0, false, 0..n, &mut got);
        for (h, g) in halves.iter().zip(&got) {
            assert_eq!(g.to_bits(), h.to_f32().to_bits(), "{:#06x}", h.to_bits());
        }
    }

    #[test]
    fn f16_rounds_to_half_precision() {
        let mut kv = KvCache::new(KvType::F16, 1, 1, 1).unwrap();
        kv.store(0, 0, &[1.0 + 1e-4], &[0.1]);
        let mut d = [0.0];
        kv.load_rows(0, false, 0..1, &mut d);
        assert_eq!(d[0], 1.0);
        kv.load_rows(0, true, 0..1, &mut d);
        assert_eq!(d[0], f16::from_f32(0.1).to_f32());
    }

    #[test]
    fn impossible_sizes_are_errors_not_aborts() {
        assert!(KvCache::new(KvType::F16, 30, usize::MAX / 4, 192).is_err());
        assert!(KvCache::new(KvType::F32, 1, 1 << 60, 1).is_err());
    }
}
