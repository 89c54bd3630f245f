//! Round-to-nearest quantization into the k-quant formats Q4_K, Q5_K, Q6_K and Q8_K.
//!
//! This is reference *quality*, not ggml's exact search: ggml's `make_qkx2_quants` iterates
//! over candidate scales, while here each sub-block takes `scale = (max - min) / qmax` and
//! the 6/8-bit sub-block scales are rounded against the super-block scale. It produces valid
//! blocks that any GGML reader decodes; error bounds are checked in the tests.

use crate::block::{cast_blocks_mut, f16_bytes, f16_le, round_i32};
use crate::kquants::{BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K};

/// Per-sub-block affine parameters for Q4_K/Q5_K, quantized to 6 bits, plus the packed
/// header. Returns the codes (0..=qmax) of all 256 values.
fn affine_k(
    x: &[f32],
    qmax: f32,
    d_out: &mut [u8; 2],
    dmin_out: &mut [u8; 2],
    scales: &mut [u8; 12],
) -> [u8; 256] {
    let mut sc = [0f32; 8];
    let mut mn = [0f32; 8];
    for (s, sub) in x.chunks_exact(32).enumerate() {
        let lo = sub.iter().fold(0.0f32, |a, &v| a.min(v));
        let hi = sub.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
        sc[s] = (hi - lo) / qmax;
        mn[s] = -lo;
    }
    let max_sc = sc.iter().fold(0.0f32, |a, &v| a.max(v));
    let max_mn = mn.iter().fold(0.0f32, |a, &v| a.max(v));
    *d_out = f16_bytes(max_sc / 63.0);
    *dmin_out = f16_bytes(max_mn / 63.0);
    let (d, dmin) = (f16_le(*d_out), f16_le(*dmin_out));
    let ls: [u8; 8] = std::array::from_fn(|s| {
        if d > 0.0 {
            round_i32(sc[s] / d).clamp(0, 63) as u8
        } else {
            0
        }
    });
    let lm: [u8; 8] = std::array::from_fn(|s| {
        if dmin > 0.0 {
            round_i32(mn[s] / dmin).clamp(0, 63) as u8
        } else {
            0
        }
    });
    for j in 0..4 {
        scales[j] = (ls[j] & 63) | ((ls[j + 4] >> 4) << 6);
        scales[j + 4] = (lm[j] & 63) | ((lm[j + 4] >> 4) << 6);
        scales[j + 8] = (ls[j + 4] & 0x0f) | ((lm[j + 4] & 0x0f) << 4);
    }
    let mut q = [0u8; 256];
    for (s, sub) in x.chunks_exact(32).enumerate() {
        let d1 = d * f32::from(ls[s]);
        let m1 = dmin * f32::from(lm[s]);
        for (l, &v) in sub.iter().enumerate() {
            q[32 * s + l] = if d1 > 0.0 {
                round_i32((v + m1) / d1).clamp(0, qmax as i32) as u8
            } else {
                0
            };
        }
    }
    q
}

/// Round-to-nearest Q4_K quantization.
pub(crate) fn quant_q4k(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(256).zip(cast_blocks_mut::<BlockQ4K>(dst)) {
        let q = affine_k(x, 15.0, &mut b.d, &mut b.dmin, &mut b.scales);
        for c in 0..4 {
            for l in 0..32 {
                b.qs[32 * c + l] = q[64 * c + l] | (q[64 * c + 32 + l] << 4);
            }
        }
    }
}

/// Round-to-nearest Q5_K quantization.
pub(crate) fn quant_q5k(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(256).zip(cast_blocks_mut::<BlockQ5K>(dst)) {
        let q = affine_k(x, 31.0, &mut b.d, &mut b.dmin, &mut b.scales);
        b.qh = [0; 32];
        for c in 0..4 {
            for l in 0..32 {
                let (a, h) = (q[64 * c + l], q[64 * c + 32 + l]);
                b.qs[32 * c + l] = (a & 0x0f) | ((h & 0x0f) << 4);
                b.qh[l] |= ((a >> 4) << (2 * c)) | ((h >> 4) << (2 * c + 1));
            }
        }
    }
}

/// Round-to-nearest Q6_K quantization.
pub(crate) fn quant_q6k(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(256).zip(cast_blocks_mut::<BlockQ6K>(dst)) {
        // Sub-block scale maps the value of largest magnitude to -32.
        let sc: [f32; 16] = std::array::from_fn(|s| {
            let sub = &x[16 * s..16 * s + 16];
            let mx = sub
                .iter()
                .fold(0.0f32, |a, &v| if v.abs() > a.abs() { v } else { a });
            mx / -32.0
        });
        let max_sc = sc
            .iter()
            .fold(0.0f32, |a, &v| if v.abs() > a.abs() { v } else { a });
        b.d = f16_bytes(max_sc / -128.0);
        let d = f16_le(b.d);
        let mut q = [0u8; 256];
        for (s, &scale) in sc.iter().enumerate() {
            let ls = if d != 0.0 {
                round_i32(scale / d).clamp(-128, 127)
            } else {
                0
            };
            b.scales[s] = ls as i8 as u8;
            let d1 = d * ls as f32;
            for l in 0..16 {
                let e = 16 * s + l;
                let v = if d1 != 0.0 {
                    round_i32(x[e] / d1).clamp(-32, 31)
                } else {
                    0
                };
                q[e] = (v + 32) as u8;
            }
        }
        b.ql = [0; 128];
        b.qh = [0; 64];
        for (e, &v) in q.iter().enumerate() {
            let (c, r) = (e / 128, e % 128);
            b.ql[64 * c + r % 64] |= (v & 0x0f) << (4 * (r / 64));
            b.qh[32 * c + r % 32] |= (v >> 4) << (2 * (r / 32));
        }
    }
}

/// Round-to-nearest Q8_K quantization (ggml `quantize_row_q8_K_ref`): the value of largest
/// magnitude maps to -127, block sums are kept for the k-quant dot products.
pub(crate) fn quant_q8k(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(256).zip(cast_blocks_mut::<BlockQ8K>(dst)) {
        let max = x
            .iter()
            .fold(0.0f32, |a, &v| if v.abs() > a.abs() { v } else { a });
        if max == 0.0 {
            b.d = 0f32.to_le_bytes();
            b.qs = [0; 256];
            b.bsums = [0; 32];
            continue;
        }
        let iscale = -127.0 / max;
        for (q, &v) in b.qs.iter_mut().zip(x) {
            *q = round_i32(iscale * v).min(127) as i8 as u8;
        }
        for s in 0..16 {
            let sum: i16 = b.qs[16 * s..16 * s + 16]
                .iter()
                .map(|&q| i16::from(q as i8))
                .sum();
            b.bsums[2 * s..2 * s + 2].copy_from_slice(&sum.to_le_bytes());
        }
        b.d = (1.0 / iscale).to_le_bytes();
    }
}
