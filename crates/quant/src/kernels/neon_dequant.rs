//! NEON block decoders, and the dequantizers and fused matrix-vector kernels built from them
//! (what `avx2_dequant` is on x86-64), for BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K,
//! Q6_K, IQ4_NL, IQ4_XS and MXFP4 (F16 has none: its conversion intrinsics are not stable
//! Rust, so F16 rows take the scalar dequantizer and the NEON dot).
//!
//! Each format has one decoder that sends a block's values, in ascending order and four at
//! a time, to a [`Sink`] holding exactly the bits of the scalar reference: integer unpacking
//! is exact, and the float steps are the same IEEE operations in the same order (`d * q`,
//! `d * q + m` and `d * q - m` as separate multiply and add, never fused). The dequantizer's
//! sink stores them; the fused matvec's sink feeds them straight into the canonical-order
//! FMA accumulator of its row (`neon`'s order), so a row's product is the bits of
//! dequantizing it and calling the NEON f32 dot, with no row staged in memory.
//!
//! This module never chooses a level or a path, and must never hand out a kernel for a
//! format it does not decode bit-exactly: `kernels` asks it only at `SimdLevel::Neon`.

use std::arch::aarch64::*;

use super::neon::hsum;
use super::{DequantFn, MatvecFn};
use crate::block::{Block, cast_blocks, f16_le, impl_block};
use crate::kquants::{BlockQ4K, BlockQ5K, BlockQ6K, scale_min_k4};
use crate::legacy::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0};
use crate::nonlinear::{
    BlockIq4Nl, BlockIq4Xs, BlockMxfp4, KVALUES_IQ4NL, KVALUES_MXFP4, e8m0_to_f32_half,
};
use ferrite_gguf::GgmlType;

/// The NEON dequantizer of `ty`, if one exists.
pub(super) fn lookup(ty: GgmlType) -> Option<DequantFn> {
    lookup_both(ty).map(|(d, _)| d)
}

/// The NEON fused matvec of `ty`, if one exists.
pub(super) fn lookup_matvec(ty: GgmlType) -> Option<MatvecFn> {
    lookup_both(ty).map(|(_, m)| m)
}

fn lookup_both(ty: GgmlType) -> Option<(DequantFn, MatvecFn)> {
    Some(match ty {
        GgmlType::BF16 => (bf16, bf16_mv),
        GgmlType::Q4_0 => (q4_0, q4_0_mv),
        GgmlType::Q4_1 => (q4_1, q4_1_mv),
        GgmlType::Q5_0 => (q5_0, q5_0_mv),
        GgmlType::Q5_1 => (q5_1, q5_1_mv),
        GgmlType::Q8_0 => (q8_0, q8_0_mv),
        GgmlType::Q4_K => (q4k, q4k_mv),
        GgmlType::Q5_K => (q5k, q5k_mv),
        GgmlType::Q6_K => (q6k, q6k_mv),
        GgmlType::IQ4_NL => (iq4nl, iq4nl_mv),
        GgmlType::IQ4_XS => (iq4xs, iq4xs_mv),
        GgmlType::MXFP4 => (mxfp4, mxfp4_mv),
        _ => return None,
    })
}

/// Declares, for each format, the safe dequantizer and fused matvec around its decoder.
macro_rules! wrapper {
    ($($format:ident => $deq:ident, $mv:ident);* $(;)?) => {$(
        fn $deq(src: &[u8], dst: &mut [f32]) {
            // SAFETY: reachable only through `lookup`, which `kernels::dequant_simd` calls
            // only after checking NEON is present.
            unsafe { dequant::<$format>(src, dst) }
        }
        fn $mv(rows: &[&[u8]], x: &[f32], out: &mut [f32]) {
            // SAFETY: reachable only through `lookup_matvec`, which `kernels::fused_matvec`
            // calls only after checking NEON is present.
            unsafe { matvec::<$format>(rows, x, out) }
        }
    )*};
}

wrapper!(
    Bf16 => bf16, bf16_mv; Q40 => q4_0, q4_0_mv; Q41 => q4_1, q4_1_mv;
    Q50 => q5_0, q5_0_mv; Q51 => q5_1, q5_1_mv; Q80 => q8_0, q8_0_mv; Q4K => q4k, q4k_mv;
    Q5K => q5k, q5k_mv; Q6K => q6k, q6k_mv; Iq4Nl => iq4nl, iq4nl_mv;
    Iq4Xs => iq4xs, iq4xs_mv; Mxfp4 => mxfp4, mxfp4_mv;
);

/// Where a decoder sends a block's values, four at a time in ascending order.
trait Sink {
    /// Takes the next four values (its slice bounds are checked).
    ///
    /// # Safety
    /// NEON present.
    unsafe fn put4(&mut self, v: float32x4_t);
}

/// Stores the values into consecutive slots of a slice.
struct Store<'a> {
    dst: &'a mut [f32],
    at: usize,
}

impl Sink for Store<'_> {
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn put4(&mut self, v: float32x4_t) {
        let d = &mut self.dst[self.at..self.at + 4];
        // SAFETY: `d` is exactly 4 writable f32s; the store has no alignment requirement.
        unsafe { vst1q_f32(d.as_mut_ptr(), v) };
        self.at += 4;
    }
}

/// Multiplies the values by consecutive activations into one canonical-order accumulator.
struct Dot<'a> {
    x: &'a [f32],
    at: usize,
    acc: float32x4_t,
}

impl Sink for Dot<'_> {
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn put4(&mut self, v: float32x4_t) {
        let x = &self.x[self.at..self.at + 4];
        // SAFETY: `x` is exactly 4 readable f32s; the load has no alignment requirement.
        let xv = unsafe { vld1q_f32(x.as_ptr()) };
        self.acc = vfmaq_f32(self.acc, v, xv);
        self.at += 4;
    }
}

/// A format's block and its decoder.
trait Format {
    /// The block.
    type Block: Block;
    /// Values per block.
    const VALUES: usize;
    /// Sends the block's values, in ascending order, to `s`.
    ///
    /// # Safety
    /// NEON present.
    unsafe fn decode<S: Sink>(b: &Self::Block, s: &mut S);
    /// Dequantizes what follows the whole blocks (only BF16, whose unit is four values,
    /// can leave a partial one).
    fn rest(_src: &[u8], _dst: &mut [f32]) {}
}

/// The dequantizer of `F`: every whole block of `src` that fits in `dst`, then `F::rest`.
#[target_feature(enable = "neon")]
fn dequant<F: Format>(src: &[u8], dst: &mut [f32]) {
    let blocks = cast_blocks::<F::Block>(src);
    let done = blocks.len().min(dst.len() / F::VALUES);
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(F::VALUES)) {
        // SAFETY: NEON present (this function's feature).
        unsafe { F::decode(b, &mut Store { dst: out, at: 0 }) };
    }
    let size = std::mem::size_of::<F::Block>();
    F::rest(&src[done * size..], &mut dst[done * F::VALUES..]);
}

/// The fused matvec of `F`: `out[r] = dot(rows[r], x)` for 1..=4 rows holding the
/// `x.len() / F::VALUES` blocks of `x`, each in the canonical order (one accumulator per
/// row, the rows' FMA chains interleaved block by block).
#[target_feature(enable = "neon")]
fn matvec<F: Format>(rows: &[&[u8]], x: &[f32], out: &mut [f32]) {
    let blocks: [&[F::Block]; 4] =
        std::array::from_fn(|r| rows.get(r).map_or(&[][..], |row| cast_blocks(row)));
    let mut acc = [vdupq_n_f32(0.0); 4];
    for (bi, xb) in x.chunks_exact(F::VALUES).enumerate() {
        for (acc, row) in acc.iter_mut().zip(&blocks[..rows.len()]) {
            let mut s = Dot {
                x: xb,
                at: 0,
                acc: *acc,
            };
            // SAFETY: NEON present (this function's feature).
            unsafe { F::decode(&row[bi], &mut s) };
            *acc = s.acc;
        }
    }
    for (o, a) in out.iter_mut().zip(&acc[..rows.len()]) {
        *o = hsum(*a);
    }
}

/// The float step applied to integer lanes before they are sent on.
#[derive(Clone, Copy)]
enum Step {
    /// `d * q`.
    Scale(f32),
    /// `d * q + m`.
    AddMin(f32, f32),
    /// `d * q - m`.
    SubMin(f32, f32),
}

/// Sends 16 integer values (four lanes of four) to `s` after applying `step`.
#[inline]
#[target_feature(enable = "neon")]
fn put16<S: Sink>(s: &mut S, q: [int32x4_t; 4], step: Step) {
    for qv in q {
        let f = vcvtq_f32_s32(qv);
        let v = match step {
            Step::Scale(d) => vmulq_f32(vdupq_n_f32(d), f),
            Step::AddMin(d, m) => vaddq_f32(vmulq_f32(vdupq_n_f32(d), f), vdupq_n_f32(m)),
            Step::SubMin(d, m) => vsubq_f32(vmulq_f32(vdupq_n_f32(d), f), vdupq_n_f32(m)),
        };
        // SAFETY: NEON present (this function's feature).
        unsafe { s.put4(v) };
    }
}

/// Bytes `at..at + 16` of `b`.
#[inline]
#[target_feature(enable = "neon")]
fn load16(b: &[u8], at: usize) -> uint8x16_t {
    let s = &b[at..at + 16];
    // SAFETY: `s` is exactly 16 readable bytes; the load has no alignment requirement.
    unsafe { vld1q_u8(s.as_ptr()) }
}

/// 16 signed bytes widened to i32, in order.
#[inline]
#[target_feature(enable = "neon")]
fn widen_i8(b: int8x16_t) -> [int32x4_t; 4] {
    let (lo, hi) = (vmovl_s8(vget_low_s8(b)), vmovl_high_s8(b));
    [
        vmovl_s16(vget_low_s16(lo)),
        vmovl_high_s16(lo),
        vmovl_s16(vget_low_s16(hi)),
        vmovl_high_s16(hi),
    ]
}

/// 16 unsigned bytes widened to i32, in order.
#[inline]
#[target_feature(enable = "neon")]
fn widen_u8(b: uint8x16_t) -> [int32x4_t; 4] {
    let (lo, hi) = (vmovl_u8(vget_low_u8(b)), vmovl_high_u8(b));
    [
        vmovl_u16(vget_low_u16(lo)),
        vmovl_high_u16(lo),
        vmovl_u16(vget_low_u16(hi)),
        vmovl_high_u16(hi),
    ]
    .map(|v| vreinterpretq_s32_u32(v))
}

/// Low and high nibbles of 16 bytes, as bytes.
#[inline]
#[target_feature(enable = "neon")]
fn nibbles(b: uint8x16_t) -> (uint8x16_t, uint8x16_t) {
    (vandq_u8(b, vdupq_n_u8(0x0f)), vshrq_n_u8::<4>(b))
}

/// Bit `j` of the two bytes `bits` (little-endian) as bit 4 of byte `j`, for j < 16.
#[inline]
#[target_feature(enable = "neon")]
fn bits_to_fifth(bits: u16) -> uint8x16_t {
    let [b0, b1] = bits.to_le_bytes();
    let spread = vcombine_u8(vdup_n_u8(b0), vdup_n_u8(b1));
    let masks: [u8; 16] = std::array::from_fn(|j| 1 << (j % 8));
    let set = vtstq_u8(spread, load16(&masks, 0));
    vandq_u8(set, vdupq_n_u8(0x10))
}

/// Bit `s` (< 8) of each of 16 bytes, moved to bit 4.
#[inline]
#[target_feature(enable = "neon")]
fn bit_to_fifth(qh: uint8x16_t, s: usize) -> uint8x16_t {
    vandq_u8(vshlq_u8(qh, vdupq_n_s8(4 - s as i8)), vdupq_n_u8(0x10))
}

/// Low and high nibbles of 16 bytes looked up in a 16-entry signed table, widened to i32.
#[inline]
#[target_feature(enable = "neon")]
fn table_nibbles(b: uint8x16_t, table: &[i8; 16]) -> ([int32x4_t; 4], [int32x4_t; 4]) {
    // SAFETY: the table is exactly 16 readable bytes; the load has no alignment requirement.
    let t = unsafe { vld1q_s8(table.as_ptr()) };
    let (lo, hi) = nibbles(b);
    (widen_i8(vqtbl1q_s8(t, lo)), widen_i8(vqtbl1q_s8(t, hi)))
}

/// The two affine steps of Q4_K/Q5_K sub-blocks `2c` and `2c + 1`.
#[inline]
fn k_steps(d: f32, dmin: f32, scales: &[u8; 12], c: usize) -> (Step, Step) {
    let (sa, ma) = scale_min_k4(2 * c, scales);
    let (sb, mb) = scale_min_k4(2 * c + 1, scales);
    (
        Step::SubMin(d * f32::from(sa), dmin * f32::from(ma)),
        Step::SubMin(d * f32::from(sb), dmin * f32::from(mb)),
    )
}

/// Four bfloat16 values: the BF16 decoder's unit (fused rows hold whole ones).
#[repr(C)]
struct Half4([u8; 8]);
impl_block!(Half4, 8);

/// Declares a format's marker type and its [`Format`] impl.
macro_rules! format {
    ($name:ident, $block:ty, $values:expr, |$b:ident, $s:ident| $body:block $(, rest = $rest:path)?) => {
        struct $name;
        impl Format for $name {
            type Block = $block;
            const VALUES: usize = $values;
            #[inline]
            #[target_feature(enable = "neon")]
            unsafe fn decode<S: Sink>($b: &$block, $s: &mut S) $body
            $(fn rest(src: &[u8], dst: &mut [f32]) {
                $rest(src, dst)
            })?
        }
    };
}

format!(
    Bf16,
    Half4,
    4,
    |b, s| {
        // SAFETY: the block is exactly 8 readable bytes; the load has no alignment
        // requirement.
        let h = unsafe { vld1_u8(b.0.as_ptr()) };
        // Each little-endian bfloat16 is the high half of its f32.
        let w = vshlq_n_u32::<16>(vmovl_u16(vreinterpret_u16_u8(h)));
        // SAFETY: NEON present (this function's feature).
        unsafe { s.put4(vreinterpretq_f32_u32(w)) };
    },
    rest = crate::float::dequant_bf16_ref
);

format!(Q40, BlockQ4_0, 32, |b, s| {
    let d = f16_le(b.d);
    let (lo, hi) = nibbles(load16(&b.qs, 0));
    let eight = vdupq_n_s8(8);
    put16(
        s,
        widen_i8(vsubq_s8(vreinterpretq_s8_u8(lo), eight)),
        Step::Scale(d),
    );
    put16(
        s,
        widen_i8(vsubq_s8(vreinterpretq_s8_u8(hi), eight)),
        Step::Scale(d),
    );
});

format!(Q41, BlockQ4_1, 32, |b, s| {
    let step = Step::AddMin(f16_le(b.d), f16_le(b.m));
    let (lo, hi) = nibbles(load16(&b.qs, 0));
    put16(s, widen_u8(lo), step);
    put16(s, widen_u8(hi), step);
});

format!(Q50, BlockQ5_0, 32, |b, s| {
    // Value j < 16 is the low nibble of byte j with bit j of qh above it; value 16 + j the
    // high nibble with bit 16 + j.
    let d = f16_le(b.d);
    let qh = u32::from_le_bytes(b.qh);
    let (lo, hi) = nibbles(load16(&b.qs, 0));
    let sixteen = vdupq_n_s8(16);
    for (n, bits) in [(lo, qh as u16), (hi, (qh >> 16) as u16)] {
        let q = vreinterpretq_s8_u8(vorrq_u8(n, bits_to_fifth(bits)));
        put16(s, widen_i8(vsubq_s8(q, sixteen)), Step::Scale(d));
    }
});

format!(Q51, BlockQ5_1, 32, |b, s| {
    let step = Step::AddMin(f16_le(b.d), f16_le(b.m));
    let qh = u32::from_le_bytes(b.qh);
    let (lo, hi) = nibbles(load16(&b.qs, 0));
    for (n, bits) in [(lo, qh as u16), (hi, (qh >> 16) as u16)] {
        put16(s, widen_u8(vorrq_u8(n, bits_to_fifth(bits))), step);
    }
});

format!(Q80, BlockQ8_0, 32, |b, s| {
    let step = Step::Scale(f16_le(b.d));
    put16(s, widen_i8(vreinterpretq_s8_u8(load16(&b.qs, 0))), step);
    put16(s, widen_i8(vreinterpretq_s8_u8(load16(&b.qs, 16))), step);
});

format!(Q4K, BlockQ4K, 256, |b, s| {
    let (d, dmin) = (f16_le(b.d), f16_le(b.dmin));
    for c in 0..4 {
        // Values 64c..64c+32 are the low nibbles of bytes 32c..32c+32, the next 32 the
        // high nibbles.
        let (sa, sb) = k_steps(d, dmin, &b.scales, c);
        let (lo0, hi0) = nibbles(load16(&b.qs, 32 * c));
        let (lo1, hi1) = nibbles(load16(&b.qs, 32 * c + 16));
        put16(s, widen_u8(lo0), sa);
        put16(s, widen_u8(lo1), sa);
        put16(s, widen_u8(hi0), sb);
        put16(s, widen_u8(hi1), sb);
    }
});

format!(Q5K, BlockQ5K, 256, |b, s| {
    let (d, dmin) = (f16_le(b.d), f16_le(b.dmin));
    let qh = [load16(&b.qh, 0), load16(&b.qh, 16)];
    for c in 0..4 {
        // As Q4_K, with bit 2c (low nibbles) or 2c + 1 (high) of the matching qh byte as
        // the fifth bit.
        let (sa, sb) = k_steps(d, dmin, &b.scales, c);
        let (lo0, hi0) = nibbles(load16(&b.qs, 32 * c));
        let (lo1, hi1) = nibbles(load16(&b.qs, 32 * c + 16));
        put16(s, widen_u8(vorrq_u8(lo0, bit_to_fifth(qh[0], 2 * c))), sa);
        put16(s, widen_u8(vorrq_u8(lo1, bit_to_fifth(qh[1], 2 * c))), sa);
        put16(
            s,
            widen_u8(vorrq_u8(hi0, bit_to_fifth(qh[0], 2 * c + 1))),
            sb,
        );
        put16(
            s,
            widen_u8(vorrq_u8(hi1, bit_to_fifth(qh[1], 2 * c + 1))),
            sb,
        );
    }
});

format!(Q6K, BlockQ6K, 256, |b, s| {
    let d = f16_le(b.d);
    let (m4, m2, off) = (vdupq_n_u8(0x0f), vdupq_n_u8(0x03), vdupq_n_s8(32));
    for c in 0..2 {
        // Value 128c + 32j + l (l < 32) is nibble j / 2 of ql byte 64c + 32(j % 2) + l, with
        // bits 2j..2j+2 of qh byte 32c + l above it; scale 8c + 2j covers l < 16, the next
        // scale l >= 16.
        for j in 0..4 {
            let g = 8 * c + 2 * j;
            for h in 0..2 {
                let ql = load16(&b.ql, 64 * c + 32 * (j % 2) + 16 * h);
                let qh = load16(&b.qh, 32 * c + 16 * h);
                let lo = vandq_u8(vshlq_u8(ql, vdupq_n_s8(-4 * (j / 2) as i8)), m4);
                let hi = vandq_u8(vshlq_u8(qh, vdupq_n_s8(-2 * j as i8)), m2);
                let q = vreinterpretq_s8_u8(vorrq_u8(lo, vshlq_n_u8::<4>(hi)));
                let step = Step::Scale(d * f32::from(b.scales[g + h] as i8));
                put16(s, widen_i8(vsubq_s8(q, off)), step);
            }
        }
    }
});

format!(Iq4Nl, BlockIq4Nl, 32, |b, s| {
    let step = Step::Scale(f16_le(b.d));
    let (lo, hi) = table_nibbles(load16(&b.qs, 0), &KVALUES_IQ4NL);
    put16(s, lo, step);
    put16(s, hi, step);
});

format!(Iq4Xs, BlockIq4Xs, 256, |b, s| {
    let d = f16_le(b.d);
    let sh = u16::from_le_bytes(b.scales_h);
    for i in 0..8 {
        let lo = (b.scales_l[i / 2] >> (4 * (i % 2))) & 0x0f;
        let hi = ((sh >> (2 * i)) & 3) as u8;
        let step = Step::Scale(d * f32::from(((lo | (hi << 4)) as i8) - 32));
        let (a, c) = table_nibbles(load16(&b.qs, 16 * i), &KVALUES_IQ4NL);
        put16(s, a, step);
        put16(s, c, step);
    }
});

format!(Mxfp4, BlockMxfp4, 32, |b, s| {
    let step = Step::Scale(e8m0_to_f32_half(b.e[0]));
    let (lo, hi) = table_nibbles(load16(&b.qs, 0), &KVALUES_MXFP4);
    put16(s, lo, step);
    put16(s, hi, step);
});
