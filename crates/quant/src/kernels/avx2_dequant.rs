//! AVX2 block decoders, and the dequantizers and fused matrix-vector kernels built from
//! them (what `avx512_dequant` is at 512 bits).
//!
//! Each format has one decoder that sends a block's values, in ascending order and eight
//! at a time, to a [`Sink`] holding exactly the bits of the scalar reference: integer
//! unpacking is exact, and the float steps are the same IEEE operations in the same order
//! (`d * q`, `d * q + m` and `d * q - m` as separate multiply and add, never fused). The
//! dequantizer's sink stores them; the fused matvec's sink feeds them straight into the
//! canonical-order FMA accumulator of its row (`avx2`'s order), so a row's product is the
//! bits of dequantizing it and calling the f32 dot, with no row staged in memory.
//!
//! This module never chooses a level or a path: `kernels` hands its functions out only
//! after checking AVX2/FMA/F16C are present.

use std::arch::x86_64::*;

use super::avx2::hsum;
use super::{DequantFn, MatvecFn, prefetch_ahead};
use crate::block::{Block, cast_blocks, f16_le, impl_block};
use crate::kquants::{BlockQ4K, BlockQ5K, BlockQ6K, scale_min_k4};
use crate::legacy::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0};
use crate::nonlinear::{
    BlockIq4Nl, BlockIq4Xs, BlockMxfp4, KVALUES_IQ4NL, KVALUES_MXFP4, e8m0_to_f32_half,
};
use ferrite_gguf::GgmlType;

/// The AVX2 dequantizer of `ty`, if one exists.
pub(super) fn lookup(ty: GgmlType) -> Option<DequantFn> {
    lookup_both(ty).map(|(d, _)| d)
}

/// The AVX2 fused matvec of `ty`, if one exists. Rows must hold whole 8-value chunks.
pub(super) fn lookup_matvec(ty: GgmlType) -> Option<MatvecFn> {
    lookup_both(ty).map(|(_, m)| m)
}

fn lookup_both(ty: GgmlType) -> Option<(DequantFn, MatvecFn)> {
    Some(match ty {
        GgmlType::F16 => (f16, f16_mv),
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
            // only after checking AVX2/FMA/F16C are present.
            unsafe { dequant::<$format>(src, dst) }
        }
        fn $mv(rows: &[&[u8]], x: &[f32], out: &mut [f32]) {
            // SAFETY: reachable only through `lookup_matvec`, which `kernels::fused_matvec`
            // calls only after checking AVX2/FMA/F16C are present.
            unsafe { matvec::<$format>(rows, x, out) }
        }
    )*};
}

wrapper!(
    F16 => f16, f16_mv; Bf16 => bf16, bf16_mv; Q40 => q4_0, q4_0_mv; Q41 => q4_1, q4_1_mv;
    Q50 => q5_0, q5_0_mv; Q51 => q5_1, q5_1_mv; Q80 => q8_0, q8_0_mv; Q4K => q4k, q4k_mv;
    Q5K => q5k, q5k_mv; Q6K => q6k, q6k_mv; Iq4Nl => iq4nl, iq4nl_mv;
    Iq4Xs => iq4xs, iq4xs_mv; Mxfp4 => mxfp4, mxfp4_mv;
);

/// Where a decoder sends a block's values, eight at a time in ascending order.
trait Sink {
    /// Takes the next eight values.
    ///
    /// # Safety
    /// AVX2/FMA/F16C present; the sink has room for them (its constructor's contract).
    unsafe fn put8(&mut self, v: __m256);
}

/// Stores the values at consecutive addresses.
struct Store(*mut f32);

impl Sink for Store {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn put8(&mut self, v: __m256) {
        // SAFETY: the destination has room for these eight values (contract).
        unsafe {
            _mm256_storeu_ps(self.0, v);
            self.0 = self.0.add(8);
        }
    }
}

/// Multiplies the values by consecutive activations into one canonical-order accumulator.
struct Dot {
    x: *const f32,
    acc: __m256,
}

impl Sink for Dot {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn put8(&mut self, v: __m256) {
        // SAFETY: eight activations are readable at x (contract).
        unsafe {
            self.acc = _mm256_fmadd_ps(v, _mm256_loadu_ps(self.x), self.acc);
            self.x = self.x.add(8);
        }
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
    /// AVX2/FMA/F16C present; `s` takes `VALUES` values.
    unsafe fn decode<S: Sink>(b: &Self::Block, s: &mut S);
    /// Dequantizes what follows the whole blocks (only the unblocked float formats can
    /// leave a partial chunk).
    fn rest(_src: &[u8], _dst: &mut [f32]) {}
}

/// The dequantizer of `F`: every whole block of `src` that fits in `dst`, then `F::rest`.
///
/// # Safety
/// AVX2/FMA/F16C present.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dequant<F: Format>(src: &[u8], dst: &mut [f32]) {
    let blocks = cast_blocks::<F::Block>(src);
    let done = blocks.len().min(dst.len() / F::VALUES);
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(F::VALUES)) {
        // SAFETY: AVX2 present (contract); `out` has room for the block's values.
        unsafe { F::decode(b, &mut Store(out.as_mut_ptr())) };
    }
    let size = std::mem::size_of::<F::Block>();
    F::rest(&src[done * size..], &mut dst[done * F::VALUES..]);
}

/// The fused matvec of `F`: `out[r] = dot(rows[r], x)` for 1..=4 rows holding the
/// `x.len() / F::VALUES` blocks of `x`, each in the canonical order. Shapes it does not
/// cover (checked by `kernels::matvec`) leave `out` untouched.
///
/// # Safety
/// AVX2/FMA/F16C present.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn matvec<F: Format>(rows: &[&[u8]], x: &[f32], out: &mut [f32]) {
    let nb = x.len() / F::VALUES;
    let blocks: [&[F::Block]; 4] =
        std::array::from_fn(|r| rows.get(r).map_or(&[][..], |row| cast_blocks(row)));
    let n = rows.len();
    if n > 4 || out.len() < n || blocks[..n].iter().any(|b| b.len() < nb) {
        return;
    }
    // SAFETY: AVX2 present (contract); the first n rows hold nb blocks each (checked), x
    // holds nb blocks' values and out has n slots.
    unsafe {
        match n {
            1 => rows_dot::<F, 1>(&blocks, x.as_ptr(), nb, out),
            2 => rows_dot::<F, 2>(&blocks, x.as_ptr(), nb, out),
            3 => rows_dot::<F, 3>(&blocks, x.as_ptr(), nb, out),
            4 => rows_dot::<F, 4>(&blocks, x.as_ptr(), nb, out),
            _ => {}
        }
    }
}

/// Prefetch distance of the fused matvec, in bytes. Measured (`ferrite-cpu`'s `matvec_cpu`,
/// 64 MiB from memory, one thread, median GB/s by thread CPU time, on a 2-core AVX2 EPYC
/// busy with other work, so +-30 %): without prefetch / 16 KiB, Q5_0 2.5/3.4, Q6_K
/// 1.6/3.5, Q4_K 1.5/2.2, Q8_0 4.7/5.6, F16 8.8/7.3 (F16's long rows stream well alone).
const PF: usize = 16384;

/// `R` rows at once: block by block, each row's decoder feeds its own accumulator (`R`
/// independent FMA chains sharing the activation loads).
///
/// # Safety
/// AVX2/FMA/F16C present; `blocks[..R]` hold `nb` blocks each; `x` has `nb * F::VALUES`
/// readable values; `out` has `R` slots.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_dot<F: Format, const R: usize>(
    blocks: &[&[F::Block]; 4],
    x: *const f32,
    nb: usize,
    out: &mut [f32],
) {
    let mut acc = [_mm256_setzero_ps(); R];
    // The rows are a matvec's consecutive rows, adjacent in memory: fetch the linear region
    // PF bytes ahead of the group's frontier, as `avx512_dequant` does.
    let size = std::mem::size_of::<F::Block>();
    let base = blocks[0].as_ptr().cast::<i8>();
    let mut fetched = PF;
    for bi in 0..nb {
        prefetch_ahead(base, &mut fetched, R * (bi + 1) * size + PF);
        for (r, acc) in acc.iter_mut().enumerate() {
            // SAFETY: bi < nb blocks of row r < R, and block bi's values of x (contract).
            unsafe {
                let mut s = Dot {
                    x: x.add(bi * F::VALUES),
                    acc: *acc,
                };
                F::decode(blocks[r].get_unchecked(bi), &mut s);
                *acc = s.acc;
            }
        }
    }
    for (o, a) in out.iter_mut().zip(acc) {
        *o = hsum(a);
    }
}

/// 16 integer lanes as two 8-lane halves.
type I16x = [__m256i; 2];

/// The float step applied to 16 integer lanes before storing.
#[derive(Clone, Copy)]
enum Step {
    /// `d * q`.
    Scale(f32),
    /// `d * q + m`.
    AddMin(f32, f32),
    /// `d * q - m`.
    SubMin(f32, f32),
}

/// Sends 16 lanes to `s` after applying `step`.
///
/// # Safety
/// AVX2/FMA/F16C present; `s` takes 16 values.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn put<S: Sink>(s: &mut S, q: I16x, step: Step) {
    for qh in q {
        let f = _mm256_cvtepi32_ps(qh);
        let v = match step {
            Step::Scale(d) => _mm256_mul_ps(_mm256_set1_ps(d), f),
            Step::AddMin(d, m) => {
                _mm256_add_ps(_mm256_mul_ps(_mm256_set1_ps(d), f), _mm256_set1_ps(m))
            }
            Step::SubMin(d, m) => {
                _mm256_sub_ps(_mm256_mul_ps(_mm256_set1_ps(d), f), _mm256_set1_ps(m))
            }
        };
        // SAFETY: forwarded contract (two of the 16 values' halves).
        unsafe { s.put8(v) };
    }
}

/// Loads bytes `at..at + 16` of `b`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load16(b: &[u8], at: usize) -> __m128i {
    let s = &b[at..at + 16];
    // SAFETY: s is exactly 16 readable bytes; the load is unaligned.
    unsafe { _mm_loadu_si128(s.as_ptr().cast()) }
}

/// 16 unsigned bytes widened to i32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn widen_u8(b: __m128i) -> I16x {
    [
        _mm256_cvtepu8_epi32(b),
        _mm256_cvtepu8_epi32(_mm_srli_si128::<8>(b)),
    ]
}

/// 16 signed bytes widened to i32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn widen_i8(b: __m128i) -> I16x {
    [
        _mm256_cvtepi8_epi32(b),
        _mm256_cvtepi8_epi32(_mm_srli_si128::<8>(b)),
    ]
}

/// Low and high nibbles of 16 bytes, as bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn nibble_bytes(b: __m128i) -> (__m128i, __m128i) {
    let mask = _mm_set1_epi8(0x0f);
    (
        _mm_and_si128(b, mask),
        _mm_and_si128(_mm_srli_epi16::<4>(b), mask),
    )
}

/// The 32 nibbles of 16 bytes as bytes in value order (low nibbles are values 0..16), with
/// bit j of `qh` as bit 4 of value j: the Q5 formats' quants, 0..32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn fifth_bit_bytes(qs: __m128i, qh: u32) -> __m256i {
    let (lo, hi) = nibble_bytes(qs);
    // Byte j takes byte j / 8 of qh, is ORed with every bit but its own (j % 8) set, and
    // compares equal to all ones exactly when its bit is set.
    let shuf = _mm256_setr_epi64x(
        0,
        0x0101_0101_0101_0101,
        0x0202_0202_0202_0202,
        0x0303_0303_0303_0303,
    );
    let spread = _mm256_shuffle_epi8(_mm256_set1_epi32(qh as i32), shuf);
    let others = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe_u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_or_si256(spread, others), _mm256_set1_epi8(-1));
    let five = _mm256_and_si256(set, _mm256_set1_epi8(0x10));
    _mm256_or_si256(_mm256_set_m128i(hi, lo), five)
}

/// 32 signed bytes widened to i32: values 0..16, then 16..32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn widen32_i8(v: __m256i) -> (I16x, I16x) {
    (
        widen_i8(_mm256_castsi256_si128(v)),
        widen_i8(_mm256_extracti128_si256::<1>(v)),
    )
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

/// Bit `s` of each of 16 widened bytes, moved to bit 4.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn bit_to_16(qh: I16x, s: usize) -> I16x {
    let sh = _mm256_set1_epi32(s as i32);
    let one = _mm256_set1_epi32(1);
    qh.map(|v| _mm256_slli_epi32::<4>(_mm256_and_si256(_mm256_srlv_epi32(v, sh), one)))
}

/// Low and high nibbles of 16 bytes looked up in a 16-entry signed table, widened to i32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn table_nibbles(b: __m128i, table: &[i8; 16]) -> (I16x, I16x) {
    // SAFETY: the table is exactly 16 readable bytes.
    let t = unsafe { _mm_loadu_si128(table.as_ptr().cast()) };
    let (lo, hi) = nibble_bytes(b);
    (
        widen_i8(_mm_shuffle_epi8(t, lo)),
        widen_i8(_mm_shuffle_epi8(t, hi)),
    )
}

/// Eight IEEE halves: the F16 and BF16 decoders' unit (rows hold whole ones when fused).
#[repr(C)]
struct Half8([u8; 16]);
impl_block!(Half8, 16);

/// Declares a format's marker type and its [`Format`] impl.
macro_rules! format {
    ($name:ident, $block:ty, $values:expr, |$b:ident, $s:ident| $body:block $(, rest = $rest:path)?) => {
        struct $name;
        impl Format for $name {
            type Block = $block;
            const VALUES: usize = $values;
            #[inline]
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn decode<S: Sink>($b: &$block, $s: &mut S) {
                // SAFETY: AVX2 present and `s` takes the block's values (contract); the
                // body sends exactly VALUES values.
                unsafe { $body }
            }
            $(fn rest(src: &[u8], dst: &mut [f32]) {
                $rest(src, dst)
            })?
        }
    };
}

format!(
    F16,
    Half8,
    8,
    |b, s| {
        s.put8(_mm256_cvtph_ps(load16(&b.0, 0)));
    },
    rest = crate::float::dequant_f16_ref
);

format!(
    Bf16,
    Half8,
    8,
    |b, s| {
        let w = _mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(load16(&b.0, 0)));
        s.put8(_mm256_castsi256_ps(w));
    },
    rest = crate::float::dequant_bf16_ref
);

format!(Q40, BlockQ4_0, 32, |b, s| {
    let d = f16_le(b.d);
    let (lo, hi) = nibble_bytes(load16(&b.qs, 0));
    let eight = _mm_set1_epi8(8);
    put(s, widen_i8(_mm_sub_epi8(lo, eight)), Step::Scale(d));
    put(s, widen_i8(_mm_sub_epi8(hi, eight)), Step::Scale(d));
});

format!(Q41, BlockQ4_1, 32, |b, s| {
    let step = Step::AddMin(f16_le(b.d), f16_le(b.m));
    let (lo, hi) = nibble_bytes(load16(&b.qs, 0));
    put(s, widen_u8(lo), step);
    put(s, widen_u8(hi), step);
});

format!(Q50, BlockQ5_0, 32, |b, s| {
    let d = f16_le(b.d);
    let qh = u32::from_le_bytes(b.qh);
    let q = _mm256_sub_epi8(fifth_bit_bytes(load16(&b.qs, 0), qh), _mm256_set1_epi8(16));
    let (lo, hi) = widen32_i8(q);
    put(s, lo, Step::Scale(d));
    put(s, hi, Step::Scale(d));
});

format!(Q51, BlockQ5_1, 32, |b, s| {
    let step = Step::AddMin(f16_le(b.d), f16_le(b.m));
    let qh = u32::from_le_bytes(b.qh);
    let (lo, hi) = widen32_i8(fifth_bit_bytes(load16(&b.qs, 0), qh));
    put(s, lo, step);
    put(s, hi, step);
});

format!(Q80, BlockQ8_0, 32, |b, s| {
    let step = Step::Scale(f16_le(b.d));
    put(s, widen_i8(load16(&b.qs, 0)), step);
    put(s, widen_i8(load16(&b.qs, 16)), step);
});

format!(Q4K, BlockQ4K, 256, |b, s| {
    let (d, dmin) = (f16_le(b.d), f16_le(b.dmin));
    for c in 0..4 {
        // Values 64c..64c+32 are the low nibbles of bytes 32c..32c+32, the next 32 the
        // high nibbles.
        let (sa, sb) = k_steps(d, dmin, &b.scales, c);
        let (lo0, hi0) = nibble_bytes(load16(&b.qs, 32 * c));
        let (lo1, hi1) = nibble_bytes(load16(&b.qs, 32 * c + 16));
        put(s, widen_u8(lo0), sa);
        put(s, widen_u8(lo1), sa);
        put(s, widen_u8(hi0), sb);
        put(s, widen_u8(hi1), sb);
    }
});

format!(Q5K, BlockQ5K, 256, |b, s| {
    let (d, dmin) = (f16_le(b.d), f16_le(b.dmin));
    let qh = [widen_u8(load16(&b.qh, 0)), widen_u8(load16(&b.qh, 16))];
    let or = |a: I16x, h: I16x| [_mm256_or_si256(a[0], h[0]), _mm256_or_si256(a[1], h[1])];
    for c in 0..4 {
        // As Q4_K, with bit 2c (low nibbles) or 2c + 1 (high) of the matching qh byte as
        // the fifth bit.
        let (sa, sb) = k_steps(d, dmin, &b.scales, c);
        let (lo0, hi0) = nibble_bytes(load16(&b.qs, 32 * c));
        let (lo1, hi1) = nibble_bytes(load16(&b.qs, 32 * c + 16));
        put(s, or(widen_u8(lo0), bit_to_16(qh[0], 2 * c)), sa);
        put(s, or(widen_u8(lo1), bit_to_16(qh[1], 2 * c)), sa);
        put(s, or(widen_u8(hi0), bit_to_16(qh[0], 2 * c + 1)), sb);
        put(s, or(widen_u8(hi1), bit_to_16(qh[1], 2 * c + 1)), sb);
    }
});

format!(Q6K, BlockQ6K, 256, |b, s| {
    let d = f16_le(b.d);
    let load32 = |v: &[u8], at: usize| _mm256_loadu_si256(v[at..at + 32].as_ptr().cast());
    let (m4, m2) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(0x03));
    for c in 0..2 {
        // Value 128c + 32j + l (l < 32) is nibble j / 2 of ql byte 64c + 32(j % 2) + l, with
        // bits 2j..2j+2 of qh byte 32c + l above it; bytes are shifted as 16-bit lanes and
        // masked, so no bit crosses into a neighbour.
        let ql = [load32(&b.ql, 64 * c), load32(&b.ql, 64 * c + 32)];
        let qh = load32(&b.qh, 32 * c);
        for j in 0..4 {
            let lo = if j < 2 {
                ql[j]
            } else {
                _mm256_srli_epi16::<4>(ql[j - 2])
            };
            let hi = match j {
                0 => qh,
                1 => _mm256_srli_epi16::<2>(qh),
                2 => _mm256_srli_epi16::<4>(qh),
                _ => _mm256_srli_epi16::<6>(qh),
            };
            let q = _mm256_or_si256(
                _mm256_and_si256(lo, m4),
                _mm256_slli_epi16::<4>(_mm256_and_si256(hi, m2)),
            );
            let (a, z) = widen32_i8(_mm256_sub_epi8(q, _mm256_set1_epi8(32)));
            let g = 8 * c + 2 * j;
            put(s, a, Step::Scale(d * f32::from(b.scales[g] as i8)));
            put(s, z, Step::Scale(d * f32::from(b.scales[g + 1] as i8)));
        }
    }
});

format!(Iq4Nl, BlockIq4Nl, 32, |b, s| {
    let step = Step::Scale(f16_le(b.d));
    let (lo, hi) = table_nibbles(load16(&b.qs, 0), &KVALUES_IQ4NL);
    put(s, lo, step);
    put(s, hi, step);
});

format!(Iq4Xs, BlockIq4Xs, 256, |b, s| {
    let d = f16_le(b.d);
    let sh = u16::from_le_bytes(b.scales_h);
    for i in 0..8 {
        let lo = (b.scales_l[i / 2] >> (4 * (i % 2))) & 0x0f;
        let hi = ((sh >> (2 * i)) & 3) as u8;
        let step = Step::Scale(d * f32::from(((lo | (hi << 4)) as i8) - 32));
        let (a, c) = table_nibbles(load16(&b.qs, 16 * i), &KVALUES_IQ4NL);
        put(s, a, step);
        put(s, c, step);
    }
});

format!(Mxfp4, BlockMxfp4, 32, |b, s| {
    let step = Step::Scale(e8m0_to_f32_half(b.e[0]));
    let (lo, hi) = table_nibbles(load16(&b.qs, 0), &KVALUES_MXFP4);
    put(s, lo, step);
    put(s, hi, step);
});
