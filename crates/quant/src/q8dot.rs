//! Integer dot products of quantized weights with quantized activations, as llama.cpp's
//! CPU backend computes them (`ggml_vec_dot_<w>_<act>`): activations are quantized to Q8_0
//! (32-value formats) or Q8_K (256-value k-quants), products are summed exactly in integers
//! per block and scaled once.
//!
//! This is the fast-path building block for later speed work, not the default precision:
//! quantizing activations moves results away from the f32 reference (see
//! fixtures/reference/README.md, caveat 3). Scalar reference implementations only.

use crate::block::{cast_blocks, f16_le};
use crate::kquants::{BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K};
use crate::kquants::{q3k_scales, scale_min_k4};
use crate::legacy::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0};
use crate::nonlinear::{BlockIq4Nl, BlockIq4Xs, KVALUES_IQ4NL};
use crate::{GgmlType, QuantError};

/// The activation format whose blocks pair with `ty`'s in [`dot_quantized`], if any.
pub fn activation_type(ty: GgmlType) -> Option<GgmlType> {
    use GgmlType as T;
    match ty {
        T::Q4_0 | T::Q4_1 | T::Q5_0 | T::Q5_1 | T::Q8_0 | T::IQ4_NL => Some(T::Q8_0),
        T::Q2_K | T::Q3_K | T::Q4_K | T::Q5_K | T::Q6_K | T::IQ4_XS => Some(T::Q8_K),
        _ => None,
    }
}

/// Dot product of `n` values: a row of `ty` weights with activations already quantized to
/// [`activation_type`]`(ty)`.
pub fn dot_quantized(ty: GgmlType, row: &[u8], act: &[u8], n: usize) -> Result<f32, QuantError> {
    let at = activation_type(ty).ok_or(QuantError::Unsupported {
        ty,
        op: "dot_quantized",
    })?;
    crate::check_row(ty, row.len(), n)?;
    crate::check_row(at, act.len(), n)?;
    use GgmlType as T;
    Ok(match ty {
        T::Q4_0 => legacy(cast_blocks::<BlockQ4_0>(row), act, |b| {
            (
                f16_le(b.d),
                0.0,
                std::array::from_fn(|j| i32::from(nib(&b.qs, j)) - 8),
            )
        }),
        T::Q4_1 => legacy(cast_blocks::<BlockQ4_1>(row), act, |b| {
            (
                f16_le(b.d),
                f16_le(b.m),
                std::array::from_fn(|j| i32::from(nib(&b.qs, j))),
            )
        }),
        T::Q5_0 => legacy(cast_blocks::<BlockQ5_0>(row), act, |b| {
            let qh = u32::from_le_bytes(b.qh);
            (
                f16_le(b.d),
                0.0,
                std::array::from_fn(|j| q5(&b.qs, qh, j) - 16),
            )
        }),
        T::Q5_1 => legacy(cast_blocks::<BlockQ5_1>(row), act, |b| {
            let qh = u32::from_le_bytes(b.qh);
            (
                f16_le(b.d),
                f16_le(b.m),
                std::array::from_fn(|j| q5(&b.qs, qh, j)),
            )
        }),
        T::Q8_0 => legacy(cast_blocks::<BlockQ8_0>(row), act, |b| {
            (
                f16_le(b.d),
                0.0,
                std::array::from_fn(|j| i32::from(b.qs[j] as i8)),
            )
        }),
        T::IQ4_NL => legacy(cast_blocks::<BlockIq4Nl>(row), act, |b| {
            let kv = |j| i32::from(KVALUES_IQ4NL[usize::from(nib(&b.qs, j))]);
            (f16_le(b.d), 0.0, std::array::from_fn(kv))
        }),
        T::Q2_K => kdot(cast_blocks::<BlockQ2K>(row), act, |b| {
            let q = std::array::from_fn(|e| {
                let (c, j, l) = (e / 128, (e % 128) / 32, e % 32);
                i32::from((b.qs[32 * c + l] >> (2 * j)) & 3)
            });
            let sc = std::array::from_fn(|s| i32::from(b.scales[s] & 0x0f));
            let mn = std::array::from_fn(|s| i32::from(b.scales[s] >> 4));
            KBlock {
                d: f16_le(b.d),
                dmin: f16_le(b.dmin),
                q,
                sc16: Some(sc),
                mn16: Some(mn),
                sc32: None,
            }
        }),
        T::Q3_K => kdot(cast_blocks::<BlockQ3K>(row), act, |b| {
            let q = std::array::from_fn(|e| {
                let (c, j, l) = (e / 128, (e % 128) / 32, e % 32);
                let lo = i32::from((b.qs[32 * c + l] >> (2 * j)) & 3);
                lo - if (b.hmask[l] >> (e / 32)) & 1 == 0 {
                    4
                } else {
                    0
                }
            });
            let s = q3k_scales(&b.scales);
            let sc = std::array::from_fn(|i| i32::from(s[i]));
            KBlock {
                d: f16_le(b.d),
                dmin: 0.0,
                q,
                sc16: Some(sc),
                mn16: None,
                sc32: None,
            }
        }),
        T::Q4_K => kdot(cast_blocks::<BlockQ4K>(row), act, |b| {
            let q = std::array::from_fn(|e| {
                let (s, l) = (e / 32, e % 32);
                i32::from((b.qs[32 * (s / 2) + l] >> (4 * (s % 2))) & 0x0f)
            });
            k_affine(f16_le(b.d), f16_le(b.dmin), &b.scales, q)
        }),
        T::Q5_K => kdot(cast_blocks::<BlockQ5K>(row), act, |b| {
            let q = std::array::from_fn(|e| {
                let (s, l) = (e / 32, e % 32);
                let lo = (b.qs[32 * (s / 2) + l] >> (4 * (s % 2))) & 0x0f;
                i32::from(lo | (((b.qh[l] >> s) & 1) << 4))
            });
            k_affine(f16_le(b.d), f16_le(b.dmin), &b.scales, q)
        }),
        T::Q6_K => kdot(cast_blocks::<BlockQ6K>(row), act, |b| {
            let q = std::array::from_fn(|e| {
                let (c, r) = (e / 128, e % 128);
                let lo = (b.ql[64 * c + r % 64] >> (4 * (r / 64))) & 0x0f;
                let hi = (b.qh[32 * c + r % 32] >> (2 * (r / 32))) & 3;
                i32::from(lo | (hi << 4)) - 32
            });
            let sc = std::array::from_fn(|s| i32::from(b.scales[s] as i8));
            KBlock {
                d: f16_le(b.d),
                dmin: 0.0,
                q,
                sc16: Some(sc),
                mn16: None,
                sc32: None,
            }
        }),
        T::IQ4_XS => kdot(cast_blocks::<BlockIq4Xs>(row), act, |b| {
            let sh = u16::from_le_bytes(b.scales_h);
            let q = std::array::from_fn(|e| {
                let (i, j) = (e / 32, e % 32);
                let byte = b.qs[16 * i + j % 16];
                let idx = if j < 16 { byte & 0x0f } else { byte >> 4 };
                i32::from(KVALUES_IQ4NL[usize::from(idx)])
            });
            let sc = std::array::from_fn(|i| {
                let lo = (b.scales_l[i / 2] >> (4 * (i % 2))) & 0x0f;
                let hi = ((sh >> (2 * i)) & 3) as u8;
                i32::from(lo | (hi << 4)) - 32
            });
            KBlock {
                d: f16_le(b.d),
                dmin: 0.0,
                q,
                sc16: None,
                mn16: None,
                sc32: Some((sc, [0; 8])),
            }
        }),
        _ => {
            return Err(QuantError::Unsupported {
                ty,
                op: "dot_quantized",
            });
        }
    })
}

/// Nibble `j` of a 32-value block (low nibbles first).
#[inline]
fn nib(qs: &[u8; 16], j: usize) -> u8 {
    if j < 16 {
        qs[j] & 0x0f
    } else {
        qs[j - 16] >> 4
    }
}

/// The 5-bit value `j` of a Q5 block.
#[inline]
fn q5(qs: &[u8; 16], qh: u32, j: usize) -> i32 {
    i32::from(nib(qs, j)) | ((((qh >> j) & 1) as i32) << 4)
}

/// 32-value formats against Q8_0: `sum(d * da * sum(q * a) + m * da * sum(a))`.
fn legacy<B>(w: &[B], act: &[u8], decode: impl Fn(&B) -> (f32, f32, [i32; 32])) -> f32 {
    let mut sum = 0.0f32;
    for (b, a) in w.iter().zip(cast_blocks::<BlockQ8_0>(act)) {
        let (d, m, q) = decode(b);
        let da = f16_le(a.d);
        let (mut qa, mut asum) = (0i32, 0i32);
        for (qj, &aj) in q.iter().zip(&a.qs) {
            let aj = i32::from(aj as i8);
            qa += qj * aj;
            asum += aj;
        }
        sum += d * da * qa as f32 + m * da * asum as f32;
    }
    sum
}

/// A k-quant block's integer quants and scales: 16-value sub-blocks (`sc16`, optional mins
/// `mn16`) or 32-value ones (`sc32`: scales, mins).
struct KBlock {
    d: f32,
    dmin: f32,
    q: [i32; 256],
    sc16: Option<[i32; 16]>,
    mn16: Option<[i32; 16]>,
    sc32: Option<([i32; 8], [i32; 8])>,
}

/// The Q4_K/Q5_K scale and min layout.
fn k_affine(d: f32, dmin: f32, scales: &[u8; 12], q: [i32; 256]) -> KBlock {
    let mut sc = [0i32; 8];
    let mut mn = [0i32; 8];
    for s in 0..8 {
        let (a, b) = scale_min_k4(s, scales);
        sc[s] = i32::from(a);
        mn[s] = i32::from(b);
    }
    KBlock {
        d,
        dmin,
        q,
        sc16: None,
        mn16: None,
        sc32: Some((sc, mn)),
    }
}

/// k-quants against Q8_K: `da * (d * sum(sc * sum(q * a)) - dmin * sum(m * bsum))`.
fn kdot<B>(w: &[B], act: &[u8], decode: impl Fn(&B) -> KBlock) -> f32 {
    let mut sum = 0.0f32;
    for (b, a) in w.iter().zip(cast_blocks::<BlockQ8K>(act)) {
        let k = decode(b);
        let da = f32::from_le_bytes(a.d);
        let bsum = |i: usize| i32::from(i16::from_le_bytes([a.bsums[2 * i], a.bsums[2 * i + 1]]));
        let qa = |from: usize, len: usize| -> i32 {
            (from..from + len)
                .map(|e| k.q[e] * i32::from(a.qs[e] as i8))
                .sum()
        };
        let (mut isum, mut msum) = (0i32, 0i32);
        if let Some(sc) = k.sc16 {
            for (s, &scale) in sc.iter().enumerate() {
                isum += scale * qa(16 * s, 16);
            }
        }
        if let Some(mn) = k.mn16 {
            for (s, &m) in mn.iter().enumerate() {
                msum += m * bsum(s);
            }
        }
        if let Some((sc, mn)) = k.sc32 {
            for s in 0..8 {
                isum += sc[s] * qa(32 * s, 32);
                msum += mn[s] * (bsum(2 * s) + bsum(2 * s + 1));
            }
        }
        sum += da * (k.d * isum as f32) - da * (k.dmin * msum as f32);
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{dequantize_ref, quantize};
    use ferrite_testkit::XorShift as Rng;

    /// Checks one weight row against the oracle: the f64 dot of the dequantized weights and
    /// the dequantized activations. The integer sums are exact, so only the per-block f32
    /// scaling and the accumulation round.
    fn check(ty: GgmlType, wq: &[u8], n: usize, rng: &mut Rng) {
        let at = activation_type(ty).expect("activation type");
        let x: Vec<f32> = (0..n).map(|_| rng.f32()).collect();
        let mut xq = vec![0u8; at.row_bytes(n as u64).expect("blocks") as usize];
        quantize(at, &x, &mut xq).expect("quantize x");
        let mut wd = vec![0f32; n];
        let mut xd = vec![0f32; n];
        dequantize_ref(ty, wq, &mut wd).expect("dequantize w");
        dequantize_ref(at, &xq, &mut xd).expect("dequantize x");
        let prods = wd
            .iter()
            .zip(&xd)
            .map(|(a, b)| f64::from(*a) * f64::from(*b));
        let exact: f64 = prods.clone().sum();
        let abs: f64 = prods.map(f64::abs).sum();
        let got = dot_quantized(ty, wq, &xq, n).expect("dot");
        let err = (f64::from(got) - exact).abs();
        assert!(err <= 1e-5 * abs, "{ty}: {got} vs {exact} (sum|wx| {abs})");
    }

    #[test]
    fn integer_dots_match_dequantized_f64_dot() {
        let mut rng = Rng(5);
        let n = 512;
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q5_0,
            GgmlType::Q5_1,
            GgmlType::Q8_0,
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
        ] {
            let w: Vec<f32> = (0..n).map(|_| rng.f32()).collect();
            let mut wq = vec![0u8; ty.row_bytes(n as u64).expect("blocks") as usize];
            quantize(ty, &w, &mut wq).expect("quantize w");
            check(ty, &wq, n, &mut rng);
        }
        // Formats without a quantizer here: real blocks from the reference fixtures.
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/reference/quant");
        for ty in [
            GgmlType::Q2_K,
            GgmlType::Q3_K,
            GgmlType::IQ4_NL,
            GgmlType::IQ4_XS,
        ] {
            let wq = std::fs::read(dir.join(format!("{}.bin", ty.name()))).expect("fixture");
            let n = wq.len() / ty.type_size() as usize * ty.block_size() as usize;
            check(ty, &wq, n, &mut rng);
        }
    }

    #[test]
    fn unsupported_and_mismatched_inputs_are_errors() {
        assert!(dot_quantized(GgmlType::F32, &[0; 128], &[0; 34], 32).is_err());
        assert!(dot_quantized(GgmlType::Q4_0, &[0; 18], &[0; 33], 32).is_err());
        assert!(dot_quantized(GgmlType::Q4_K, &[0; 144], &[0; 292], 32).is_err());
    }
}
