//! AVX-512 VNNI kernels of the 16-bit activation products (`q16`): sixteen weight rows per
//! vector, one lane per row.
//!
//! A group of up to sixteen rows is packed first: each row's block is read with 16-byte
//! loads and transposed in registers, so that lane `r` holds row `r`'s words (gathers of
//! the same words measured slower than the f32 kernels on Zen 5), and the blocks' scales
//! are laid side by side. A matrix is packed either once, whole ([`pack`], kept by the
//! caller), or a group at a time into a buffer the thread reuses ([`matmul`]). Every tile of
//! activation columns then walks the packed group: each lane builds the integer sum `I_b` of
//! its row inside the lane (no horizontal reduction), and the per-block scale step is one
//! vector operation for sixteen rows. Integer sums are exact, so the number of partial
//! accumulators (chosen per tile width, for latency) does not change a bit; the
//! floating-point steps follow the module docs of `q16` lane by lane.

use std::arch::x86_64::*;

use super::amx_q16::{self, Tiles};
use super::q16::{BLOCK, Layout, PAIRS, Q16Acts};
use ferrite_gguf::GgmlType;

/// Rows per group: one per lane.
pub(super) const ROWS: usize = 16;

/// How one weight format's block is packed and unpacked.
///
/// A packed group of sixteen rows holds, for its `nb` blocks in order, `WORDS` vectors of
/// 32-bit weight words each (lane `r` = row `r`), then, for the blocks in order again,
/// `SCALE_BYTES` bytes of scales each: the sixteen rows' f16 scales `d`, then (with a
/// minimum) their sixteen f16 minimums `m`. That is exactly the rows' own bytes, rearranged
/// (`16 · BYTES` per block). Packing runs in two passes over a group's blocks, so that only
/// one row pointer is live at a time: [`Format::gather`] copies each row's bytes (a 16-byte
/// chunk of row `r` goes to lane `r / 4` of chunk vector `r % 4`, its scales to slot `r`),
/// then [`transpose`] turns every four chunk vectors into words in place.
pub(super) trait Format {
    /// Bytes per unit of the rows: one 32-value block, or a super-block of [`Format::SUPER`]
    /// of them.
    const BYTES: usize;
    /// Packed 32-value blocks per unit of the rows (8 for a K-quant's 256 values).
    const SUPER: usize = 1;
    /// Packed vectors of weight words per block.
    const WORDS: usize;
    /// Packed bytes of scales (and minimums) per block.
    const SCALE_BYTES: usize;
    /// Whether the block has a minimum (`x = d · q + m`).
    const MIN: bool;
    /// Copies row `r`'s unit at `src` into the packed blocks' words at `words` and their
    /// scales at `scales` (`SUPER` packed blocks, `WORDS` vectors and `SCALE_BYTES` bytes
    /// apart).
    ///
    /// # Safety
    /// `BYTES` bytes readable at `src`; `r < 16`; `SUPER * WORDS` vectors writable at
    /// `words` and `SUPER * SCALE_BYTES` bytes at `scales`.
    unsafe fn gather(src: *const u8, r: usize, words: *mut u8, scales: *mut u8);
    /// The sixteen rows' scales and minimums (zeros without one) of a packed block.
    ///
    /// # Safety
    /// AVX-512 F present; `SCALE_BYTES` bytes readable at `scales`.
    unsafe fn scales(scales: *const u8) -> (__m512, __m512);
    /// Pair `p` of 16-bit weights from the packed words.
    ///
    /// # Safety
    /// AVX-512 F/BW present; `words` holds `WORDS` vectors.
    unsafe fn unpack(words: &[__m512i], p: usize) -> __m512i;
    /// A packed group's blocks as eight 64-byte rows of bytes each, one block after the
    /// other, row `j` lane `r` holding row `r`'s values `4j..4j + 4` (the second operand of
    /// an AMX byte product): the packed words themselves where they already are that, else
    /// unpacked into `buf`.
    ///
    /// # Safety
    /// AVX-512 F/BW present; `words` holds whole blocks of `WORDS` vectors.
    unsafe fn byte_rows(words: &[__m512i], buf: &mut Vec<__m512i>) -> *const u8;
}

/// Copies 16 bytes of row `r` into chunk vector `r % 4`, lane `r / 4`, of the four vectors
/// at `dst`: then [`transpose`] puts row `r`'s words in lane `r`.
///
/// # Safety
/// 16 bytes readable at `src`; 256 bytes writable at `dst`.
#[inline]
unsafe fn copy_chunk(src: *const u8, r: usize, dst: *mut u8) {
    // SAFETY: forwarded contract; (r % 4) * 64 + (r / 4) * 16 + 16 <= 256.
    unsafe { std::ptr::copy_nonoverlapping(src, dst.add((r % 4) * 64 + (r / 4) * 16), 16) };
}

/// Four gathered chunk vectors to four vectors of 32-bit words: output `w` lane `r` is
/// word `w` of row `r`'s 16 bytes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn transpose(z: &mut [__m512i]) {
    let t0 = _mm512_unpacklo_epi32(z[0], z[1]);
    let t1 = _mm512_unpackhi_epi32(z[0], z[1]);
    let t2 = _mm512_unpacklo_epi32(z[2], z[3]);
    let t3 = _mm512_unpackhi_epi32(z[2], z[3]);
    z[0] = _mm512_unpacklo_epi64(t0, t2);
    z[1] = _mm512_unpackhi_epi64(t0, t2);
    z[2] = _mm512_unpacklo_epi64(t1, t3);
    z[3] = _mm512_unpackhi_epi64(t1, t3);
}

/// Sixteen IEEE halves at `p`, widened exactly.
///
/// # Safety
/// AVX-512 F present; 32 bytes readable at `p`.
#[inline]
#[target_feature(enable = "avx512f,f16c")]
unsafe fn halves(p: *const u8) -> __m512 {
    // SAFETY: forwarded contract.
    _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(p.cast()) })
}

pub(super) struct Q41;

impl Format for Q41 {
    const BYTES: usize = 20;
    const WORDS: usize = 4;
    const SCALE_BYTES: usize = 64;
    const MIN: bool = true;

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn byte_rows(words: &[__m512i], buf: &mut Vec<__m512i>) -> *const u8 {
        // Word j of a row holds its nibble bytes 4j..4j + 4: values 4j.. in the low
        // nibbles, 16 + 4j.. in the high ones.
        let nib = _mm512_set1_epi8(0x0F);
        let blocks = words.len() / Self::WORDS;
        buf.resize(blocks * 8, _mm512_setzero_si512());
        for (block, rows) in words.chunks_exact(Self::WORDS).zip(buf.chunks_exact_mut(8)) {
            let (lo, hi) = rows.split_at_mut(Self::WORDS);
            for ((w, lo), hi) in block.iter().zip(lo).zip(hi) {
                *lo = _mm512_and_si512(*w, nib);
                *hi = _mm512_and_si512(_mm512_srli_epi16::<4>(*w), nib);
            }
        }
        buf.as_ptr().cast()
    }

    #[inline]
    unsafe fn gather(src: *const u8, r: usize, words: *mut u8, scales: *mut u8) {
        // SAFETY: forwarded contract: the nibbles are bytes 4..20, the scale bytes 0..2 and
        // the minimum bytes 2..4, copied to slot r of the scales (2r + 2 <= 32) and of the
        // minimums (32 + 2r + 2 <= 64).
        unsafe {
            copy_chunk(src.add(4), r, words);
            std::ptr::copy_nonoverlapping(src, scales.add(2 * r), 2);
            std::ptr::copy_nonoverlapping(src.add(2), scales.add(32 + 2 * r), 2);
        }
    }

    #[inline]
    #[target_feature(enable = "avx512f,f16c")]
    unsafe fn scales(scales: *const u8) -> (__m512, __m512) {
        // SAFETY: 64 bytes readable (contract).
        unsafe { (halves(scales), halves(scales.add(32))) }
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn unpack(words: &[__m512i], p: usize) -> __m512i {
        // Word i holds bytes b0..b3 of the nibbles: low nibbles are values 4i..4i+3, high
        // nibbles 4i+16..4i+19 (pair order of `q16::pair_order`).
        let x = words[p / 4];
        let nib = _mm512_set1_epi32(0x000F_000F);
        let shifted = match p % 4 {
            0 => x,
            1 => _mm512_srli_epi32::<8>(x),
            2 => _mm512_srli_epi32::<4>(x),
            _ => _mm512_srli_epi32::<12>(x),
        };
        _mm512_and_si512(shifted, nib)
    }
}

pub(super) struct Q80;

impl Format for Q80 {
    const BYTES: usize = 34;
    const WORDS: usize = 8;
    const SCALE_BYTES: usize = 32;
    const MIN: bool = false;

    #[inline]
    unsafe fn byte_rows(words: &[__m512i], _: &mut Vec<__m512i>) -> *const u8 {
        // Word j of a row already holds its values 4j..4j + 4.
        words.as_ptr().cast()
    }

    #[inline]
    unsafe fn gather(src: *const u8, r: usize, words: *mut u8, scales: *mut u8) {
        // SAFETY: forwarded contract: the quants are bytes 2..34 (two chunks of four
        // vectors), the scale bytes 0..2, copied to slot r of the scales (2r + 2 <= 32).
        unsafe {
            copy_chunk(src.add(2), r, words);
            copy_chunk(src.add(18), r, words.add(256));
            std::ptr::copy_nonoverlapping(src, scales.add(2 * r), 2);
        }
    }

    #[inline]
    #[target_feature(enable = "avx512f,f16c")]
    unsafe fn scales(scales: *const u8) -> (__m512, __m512) {
        // SAFETY: 32 bytes readable (contract).
        (unsafe { halves(scales) }, _mm512_setzero_ps())
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn unpack(words: &[__m512i], p: usize) -> __m512i {
        // Word i holds signed bytes q0..q3 of values 4i..4i+3: pairs (q0, q2), (q1, q3).
        let x = words[p / 2];
        if p.is_multiple_of(2) {
            _mm512_srai_epi16::<8>(_mm512_slli_epi16::<8>(x))
        } else {
            _mm512_srai_epi16::<8>(x)
        }
    }
}

/// Q5_0 packed as Q8_0: each block's integers `q - 16` (-16..15) become the signed bytes of
/// a Q8_0 block with the same f16 scale, so a packed Q5_0 group is exactly a packed Q8_0
/// group (the same words, scales and kernels) whose values are those of the Q5_0 rows. It
/// costs 34 packed bytes per block instead of 22, and buys Q8_0's unpacking (two shifts per
/// pair) instead of the fifth-bit shuffle.
pub(super) struct Q50;

impl Format for Q50 {
    const BYTES: usize = 22;
    const WORDS: usize = Q80::WORDS;
    const SCALE_BYTES: usize = Q80::SCALE_BYTES;
    const MIN: bool = false;

    #[inline]
    unsafe fn byte_rows(words: &[__m512i], buf: &mut Vec<__m512i>) -> *const u8 {
        // SAFETY: forwarded contract; the packed words are Q8_0's.
        unsafe { Q80::byte_rows(words, buf) }
    }

    #[inline]
    unsafe fn gather(src: *const u8, r: usize, words: *mut u8, scales: *mut u8) {
        // SAFETY: forwarded contract: the block is 22 readable bytes (d, qh, qs).
        let block = unsafe { &*src.cast::<[u8; 22]>() };
        let qh = u32::from_le_bytes([block[2], block[3], block[4], block[5]]);
        let qs = &block[6..22];
        // Value j: nibble j of qs (low nibbles first) with bit j of qh above it, minus 16.
        let q: [u8; BLOCK] = std::array::from_fn(|j| {
            let lo = if j < 16 {
                qs[j] & 0x0f
            } else {
                qs[j - 16] >> 4
            };
            ((lo | ((((qh >> j) & 1) as u8) << 4)) as i8 - 16) as u8
        });
        // SAFETY: forwarded contract, as Q8_0's gather with its quants from `q`.
        unsafe {
            copy_chunk(q.as_ptr(), r, words);
            copy_chunk(q.as_ptr().add(16), r, words.add(256));
            std::ptr::copy_nonoverlapping(src, scales.add(2 * r), 2);
        }
    }

    #[inline]
    #[target_feature(enable = "avx512f,f16c")]
    unsafe fn scales(scales: *const u8) -> (__m512, __m512) {
        // SAFETY: forwarded contract.
        unsafe { Q80::scales(scales) }
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn unpack(words: &[__m512i], p: usize) -> __m512i {
        // SAFETY: forwarded contract.
        unsafe { Q80::unpack(words, p) }
    }
}

/// Q4_K packed as Q4_1 with f32 scales: each 256-value super-block becomes eight packed
/// 32-value blocks whose nibbles are in Q4_1's order and whose scale and minimum are the
/// sub-block's `d · sc` and `-(dmin · m)` in f32 (exact: an f16 times a 6-bit integer), so
/// that `x = d_b · q + m_b` is the reference dequantization's `d · sc · q - dmin · m` bit
/// for bit. Scales: the sixteen rows' `d_b`, then their sixteen `m_b` (128 bytes a block).
pub(super) struct Q4K;

impl Format for Q4K {
    const BYTES: usize = 144;
    const SUPER: usize = 8;
    const WORDS: usize = Q41::WORDS;
    const SCALE_BYTES: usize = 128;
    const MIN: bool = true;

    #[inline]
    unsafe fn byte_rows(words: &[__m512i], buf: &mut Vec<__m512i>) -> *const u8 {
        // SAFETY: forwarded contract; the packed words are Q4_1's.
        unsafe { Q41::byte_rows(words, buf) }
    }

    #[inline]
    unsafe fn gather(src: *const u8, r: usize, words: *mut u8, scales: *mut u8) {
        // SAFETY: forwarded contract: the super-block is 144 readable bytes (d, dmin, 12
        // bytes of scales, 128 of nibbles).
        let b = unsafe { &*src.cast::<[u8; 144]>() };
        let half = |o: usize| half::f16::from_le_bytes([b[o], b[o + 1]]).to_f32();
        let (d, dmin) = (half(0), half(2));
        let sc: &[u8; 12] = b[4..16].try_into().expect("12 scale bytes");
        let qs = &b[16..144];
        for j in 0..Self::SUPER {
            let (s, m) = crate::kquants::scale_min_k4(j, sc);
            let (dj, mj) = (d * f32::from(s), -(dmin * f32::from(m)));
            // Sub-block j is the low (j even) or high nibbles of bytes 32(j / 2)..+32; Q4_1
            // holds values l and l + 16 in the low and high nibbles of its byte l.
            let c = 32 * (j / 2);
            let q: [u8; 16] = std::array::from_fn(|l| {
                let (a, z) = (qs[c + l], qs[c + 16 + l]);
                if j % 2 == 0 {
                    (a & 0x0f) | (z << 4)
                } else {
                    (a >> 4) | (z & 0xf0)
                }
            });
            // SAFETY: packed block j's words and scales lie in the caller's SUPER blocks;
            // slot r of the scales (4r + 4 <= 64) and of the minimums (64 + 4r + 4 <= 128).
            unsafe {
                let sj = scales.add(j * Self::SCALE_BYTES);
                copy_chunk(q.as_ptr(), r, words.add(j * Self::WORDS * 64));
                std::ptr::copy_nonoverlapping(dj.to_le_bytes().as_ptr(), sj.add(4 * r), 4);
                std::ptr::copy_nonoverlapping(mj.to_le_bytes().as_ptr(), sj.add(64 + 4 * r), 4);
            }
        }
    }

    #[inline]
    #[target_feature(enable = "avx512f,f16c")]
    unsafe fn scales(scales: *const u8) -> (__m512, __m512) {
        // SAFETY: 128 bytes readable (contract).
        unsafe {
            (
                _mm512_loadu_ps(scales.cast()),
                _mm512_loadu_ps(scales.add(64).cast()),
            )
        }
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn unpack(words: &[__m512i], p: usize) -> __m512i {
        // SAFETY: forwarded contract.
        unsafe { Q41::unpack(words, p) }
    }
}

/// Q6_K packed as Q8_0 with two f32 scales per block: each 256-value super-block becomes
/// eight packed 32-value blocks of signed bytes `q - 32` (-32..31) in Q8_0's layout, whose
/// scales are the two 16-value halves' `d · sc` (exact: an f16 times an 8-bit integer), so
/// that `x = d_half · q` is the reference dequantization bit for bit. Scales: the sixteen
/// rows' first-half scales, then their sixteen second-half scales (128 bytes a block). Only
/// the AVX2 kernel multiplies it (its split block step); [`Format::scales`] here gives the
/// two halves' scales for completeness.
pub(super) struct Q6K;

impl Format for Q6K {
    const BYTES: usize = 210;
    const SUPER: usize = 8;
    const WORDS: usize = Q80::WORDS;
    const SCALE_BYTES: usize = 128;
    const MIN: bool = false;

    #[inline]
    unsafe fn byte_rows(words: &[__m512i], buf: &mut Vec<__m512i>) -> *const u8 {
        // SAFETY: forwarded contract; the packed words are Q8_0's.
        unsafe { Q80::byte_rows(words, buf) }
    }

    #[inline]
    unsafe fn gather(src: *const u8, r: usize, words: *mut u8, scales: *mut u8) {
        // SAFETY: forwarded contract: the super-block is 210 readable bytes, a BlockQ6K
        // (byte arrays only, so any address is aligned for it).
        let b = unsafe { &*src.cast::<crate::kquants::BlockQ6K>() };
        let d = half::f16::from_le_bytes(b.d).to_f32();
        for j in 0..Self::SUPER {
            // Value e = 32j + l: nibble (e % 128) / 64 of ql byte 64(e / 128) + e % 64, with
            // bits 2((e % 128) / 32).. of qh byte 32(e / 128) + e % 32 above it.
            let q: [u8; BLOCK] = std::array::from_fn(|l| {
                let e = 32 * j + l;
                let (c, r) = (e / 128, e % 128);
                let lo = (b.ql[64 * c + r % 64] >> (4 * (r / 64))) & 0x0f;
                let hi = (b.qh[32 * c + r % 32] >> (2 * (r / 32))) & 3;
                ((lo | (hi << 4)) as i8 - 32) as u8
            });
            let dl = d * f32::from(b.scales[2 * j] as i8);
            let dh = d * f32::from(b.scales[2 * j + 1] as i8);
            // SAFETY: packed block j's words and scales lie in the caller's SUPER blocks;
            // slot r of the first halves (4r + 4 <= 64) and of the second (64 + 4r + 4).
            unsafe {
                let (wj, sj) = (
                    words.add(j * Self::WORDS * 64),
                    scales.add(j * Self::SCALE_BYTES),
                );
                copy_chunk(q.as_ptr(), r, wj);
                copy_chunk(q.as_ptr().add(16), r, wj.add(256));
                std::ptr::copy_nonoverlapping(dl.to_le_bytes().as_ptr(), sj.add(4 * r), 4);
                std::ptr::copy_nonoverlapping(dh.to_le_bytes().as_ptr(), sj.add(64 + 4 * r), 4);
            }
        }
    }

    #[inline]
    #[target_feature(enable = "avx512f,f16c")]
    unsafe fn scales(scales: *const u8) -> (__m512, __m512) {
        // SAFETY: 128 bytes readable (contract).
        unsafe {
            (
                _mm512_loadu_ps(scales.cast()),
                _mm512_loadu_ps(scales.add(64).cast()),
            )
        }
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn unpack(words: &[__m512i], p: usize) -> __m512i {
        // SAFETY: forwarded contract.
        unsafe { Q80::unpack(words, p) }
    }
}

/// One block of activations quantized as `q16` defines, written in the pair order (`perm`:
/// `q16::pair_order` as 16-bit lane indices); returns `s` and `S`. Bit-identical to
/// `q16::quantize_block`.
///
/// # Safety
/// AVX-512 F/BW/VL present.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(super) unsafe fn quantize_block(
    a: &[f32; BLOCK],
    perm: &[u16; BLOCK],
    pairs: &mut [u32; PAIRS],
) -> (f32, f32) {
    // SAFETY: a holds 32 values.
    let (lo, hi) = unsafe {
        (
            _mm512_loadu_ps(a.as_ptr()),
            _mm512_loadu_ps(a.as_ptr().add(16)),
        )
    };
    let (alo, ahi) = (_mm512_abs_ps(lo), _mm512_abs_ps(hi));
    let inf = _mm512_set1_ps(f32::INFINITY);
    let finite =
        _mm512_cmp_ps_mask::<_CMP_LT_OQ>(alo, inf) & _mm512_cmp_ps_mask::<_CMP_LT_OQ>(ahi, inf);
    if finite != 0xFFFF {
        *pairs = [0; PAIRS];
        return (f32::NAN, f32::NAN);
    }
    let amax = _mm512_reduce_max_ps(_mm512_max_ps(alo, ahi));
    let inv = 32767.0 / amax;
    if amax == 0.0 || !inv.is_finite() {
        *pairs = [0; PAIRS];
        return (0.0, 0.0);
    }
    let vinv = _mm512_set1_ps(inv);
    let (lim_lo, lim_hi) = (_mm512_set1_epi32(-32767), _mm512_set1_epi32(32767));
    let round = |v: __m512| {
        let q = _mm512_cvt_roundps_epi32::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm512_mul_ps(v, vinv),
        );
        _mm512_min_epi32(_mm512_max_epi32(q, lim_lo), lim_hi)
    };
    let (qlo, qhi) = (round(lo), round(hi));
    let total = _mm512_reduce_add_epi32(_mm512_add_epi32(qlo, qhi));
    let natural = _mm512_inserti64x4::<1>(
        _mm512_castsi256_si512(_mm512_cvtepi32_epi16(qlo)),
        _mm512_cvtepi32_epi16(qhi),
    );
    // SAFETY: perm and pairs are 64 bytes each.
    unsafe {
        let v = _mm512_permutexvar_epi16(_mm512_loadu_si512(perm.as_ptr().cast()), natural);
        _mm512_storeu_si512(pairs.as_mut_ptr().cast(), v);
    }
    let s = amax / 32767.0;
    (s, s * total as f32)
}

/// A block's 16-bit values in natural order (as [`quantize_block`] writes them with the
/// identity order) rewritten in the byte layout of the AMX kernel: the 32 high bytes, then
/// the 32 low bytes.
///
/// # Safety
/// AVX-512 F/BW/VL present.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(super) unsafe fn split_bytes(words: &mut [u32; PAIRS]) {
    // SAFETY: words is 64 bytes.
    unsafe {
        let v = _mm512_loadu_si512(words.as_ptr().cast());
        let hi = _mm512_cvtepi16_epi8(_mm512_srai_epi16::<8>(v));
        let lo = _mm512_cvtepi16_epi8(v);
        let bytes = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(hi), lo);
        _mm512_storeu_si512(words.as_mut_ptr().cast(), bytes);
    }
}

/// Every output of [`super::q16::matmul`] (which checked the shapes): each group of
/// sixteen rows is packed into a buffer the thread reuses, then multiplied.
///
/// # Safety
/// AVX-512 F/BW/VL and VNNI present; `w` holds `nr` rows of `rb` bytes of blocks of `ty`
/// (Q4_1 or Q8_0) covering `acts.k()` values; `out.add(c * stride + r)` is writable and
/// unaliased for every column `c` and row `r < nr`, and `stride >= nr`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
pub(super) unsafe fn matmul(
    ty: GgmlType,
    w: &[u8],
    nr: usize,
    rb: usize,
    acts: &Q16Acts,
    out: *mut f32,
    stride: usize,
) {
    let lines = (ROWS * rb).div_ceil(64);
    // SAFETY: the bytes layout exists only where AMX is available (`Layout::for_columns`).
    let _tiles = (acts.layout() == Layout::Bytes).then(|| unsafe { Tiles::load(acts.n()) });
    PACKED.with_borrow_mut(|packed| {
        if packed.len() < lines {
            packed.resize(lines, _mm512_setzero_si512());
        }
        let dst = packed.as_mut_ptr().cast::<u8>();
        let mut r0 = 0;
        while r0 < nr {
            let rows = ROWS.min(nr - r0);
            // SAFETY: forwarded contract; the buffer holds one group (16 rows of rb bytes);
            // rows r0..r0 + rows exist and their outputs are the caller's.
            unsafe {
                if ty == GgmlType::Q4_1 {
                    pack_group::<Q41>(w, r0, rows, rb, dst, true);
                    multiply_group::<Q41>(dst, acts, rows, out.add(r0), stride, 0);
                } else {
                    pack_group::<Q80>(w, r0, rows, rb, dst, true);
                    multiply_group::<Q80>(dst, acts, rows, out.add(r0), stride, 0);
                }
            }
            r0 += rows;
        }
    });
}

thread_local! {
    /// Each thread's packed group of rows, reused across calls.
    static PACKED: std::cell::RefCell<Vec<__m512i>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Packs the `nr` rows of `w` (`rb` bytes each, blocks of `ty`), in groups of sixteen, into
/// `dst`: group `g` at byte `g * group_bytes`, in the layout [`Format`] describes.
///
/// # Safety
/// AVX-512 F/BW/VL present; `w` holds `nr` rows of `rb` bytes of whole blocks of `ty`
/// (Q4_1 or Q8_0); `dst` is 64-byte aligned and has room for `nr.div_ceil(16)` groups;
/// `group_bytes >= 16 * rb` is a multiple of 64.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(super) unsafe fn pack(
    ty: GgmlType,
    w: &[u8],
    nr: usize,
    rb: usize,
    dst: *mut u8,
    group_bytes: usize,
) {
    let mut r0 = 0;
    while r0 < nr {
        let rows = ROWS.min(nr - r0);
        // SAFETY: forwarded contract; group r0 / 16 starts inside dst.
        unsafe {
            let g = dst.add(r0 / ROWS * group_bytes);
            if ty == GgmlType::Q4_1 {
                pack_group::<Q41>(w, r0, rows, rb, g, false);
            } else {
                pack_group::<Q80>(w, r0, rows, rb, g, false);
            }
        }
        r0 += rows;
    }
}

/// Every output of the packed `groups` (`group_bytes` apart at `packed`) of a matrix
/// of `nr` rows: `out[c * stride + r]` for the rows `r` of those groups.
///
/// # Safety
/// AVX-512 F/BW/VL and VNNI present; `packed` holds the groups of a matrix of `ty` (Q4_1 or
/// Q8_0) with `acts.k()` values per row, packed by [`pack`]; `groups.end <= nr.div_ceil(16)`;
/// `out.add(c * stride + r)` is writable and unaliased for every column `c` and every row
/// `r` of those groups below `nr`, and `stride >= nr`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn matmul_packed(
    ty: GgmlType,
    packed: *const u8,
    group_bytes: usize,
    nr: usize,
    groups: std::ops::Range<usize>,
    acts: &Q16Acts,
    out: *mut f32,
    stride: usize,
) {
    // SAFETY: the bytes layout exists only where AMX is available (`Layout::for_columns`).
    let _tiles = (acts.layout() == Layout::Bytes).then(|| unsafe { Tiles::load(acts.n()) });
    for g in groups {
        let r0 = g * ROWS;
        let rows = ROWS.min(nr - r0);
        // SAFETY: forwarded contract: group g lies in `packed`, its rows' outputs in `out`.
        unsafe {
            let group = packed.add(g * group_bytes);
            if ty == GgmlType::Q4_1 {
                multiply_group::<Q41>(group, acts, rows, out.add(r0), stride, group_bytes);
            } else {
                multiply_group::<Q80>(group, acts, rows, out.add(r0), stride, group_bytes);
            }
        }
    }
}

/// Packs rows `r0..r0 + rows` (`rows <= 16`) of `w` into one group at `dst`. With
/// `prefetch`, the same blocks of the next group are fetched while this one is packed, so a
/// caller that multiplies each group right after packing it overlaps the weight stream with
/// the arithmetic.
///
/// # Safety
/// AVX-512 F/BW/VL present; the rows exist in `w` (`rb` bytes each, whole blocks of `F`);
/// `dst` is 64-byte aligned with room for `16 * rb` bytes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn pack_group<F: Format>(
    w: &[u8],
    r0: usize,
    rows: usize,
    rb: usize,
    dst: *mut u8,
    prefetch: bool,
) {
    // SAFETY: forwarded contract.
    unsafe { gather_group::<F>(w, r0, rows, rb, dst, prefetch) };
    let nb = rb / F::BYTES * F::SUPER;
    // SAFETY: the words region is nb * WORDS aligned vectors at dst (contract), WORDS a
    // multiple of four.
    let chunks = unsafe { std::slice::from_raw_parts_mut(dst.cast::<__m512i>(), nb * F::WORDS) };
    for chunk in chunks.chunks_exact_mut(4) {
        transpose(chunk);
    }
}

/// The first pass of packing rows `r0..r0 + rows` (`rows <= 16`) of `w` into one group at
/// `dst`: every row's blocks copied by [`Format::gather`], so that only the in-register
/// transpose of each four chunk vectors (this level's or the AVX2 one) is left. Plain
/// copies, for every level that reads this layout.
///
/// # Safety
/// The rows exist in `w` (`rb` bytes each, whole blocks of `F`); `dst` has room for
/// `16 * rb` bytes.
#[inline]
pub(super) unsafe fn gather_group<F: Format>(
    w: &[u8],
    r0: usize,
    rows: usize,
    rb: usize,
    dst: *mut u8,
    prefetch: bool,
) {
    let nb = rb / F::BYTES;
    let words = F::WORDS * 64;
    let scales = nb * F::SUPER * words;
    for r in 0..ROWS {
        // Lanes past the last row take the group's first row; their outputs are never
        // stored.
        let row = &w[(r0 + if r < rows { r } else { 0 }) * rb..][..rb];
        for b in 0..nb {
            let src = row.as_ptr().wrapping_add(b * F::BYTES);
            if prefetch {
                // SAFETY: SSE is in every x86-64 CPU; prefetches never fault, and the
                // pointer uses wrapping arithmetic.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(src.wrapping_add(ROWS * rb).cast()) };
            }
            // SAFETY: unit b lies inside the row (b < nb, rb = nb * BYTES); its packed
            // blocks' words and scales lie inside the group (contract).
            unsafe {
                F::gather(
                    src,
                    r,
                    dst.add(b * F::SUPER * words),
                    dst.add(scales + b * F::SUPER * F::SCALE_BYTES),
                );
            }
        }
    }
}

/// One packed group (of `rows` real rows) times every tile of `acts`: `out[c * stride + r]`
/// for `r < rows`. With `ahead` > 0, the first tile fetches the bytes `ahead` past each block
/// it reads (the next group's, for packed groups in a row), since the hardware prefetcher
/// alone left the stream of packed groups at about half the speed of row-wise reads.
///
/// # Safety
/// As [`matmul_packed`], for the one group at `group` and `out` at its first row.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
unsafe fn multiply_group<F: Format>(
    group: *const u8,
    acts: &Q16Acts,
    rows: usize,
    out: *mut f32,
    stride: usize,
    ahead: usize,
) {
    let nb = acts.k() / BLOCK;
    let mask: __mmask16 = if rows == ROWS {
        0xFFFF
    } else {
        (1u16 << rows) - 1
    };
    // SAFETY: the group starts with nb * WORDS aligned vectors of words, then the scales
    // (contract).
    let (words, scales) = unsafe {
        (
            std::slice::from_raw_parts(group.cast::<__m512i>(), nb * F::WORDS),
            group.add(nb * F::WORDS * 64),
        )
    };
    if acts.layout() == Layout::Bytes {
        // SAFETY: forwarded contract; the entry points loaded the tiles for this layout.
        return unsafe {
            amx_q16::multiply_group::<F>(words, scales, acts, mask, out, stride, ahead)
        };
    }
    for t in 0..acts.tiles() {
        let (width, pairs, scale, sum) = acts.tile(t);
        macro_rules! go {
            ($($c:literal => $p:literal),*) => {
                match width {
                    // SAFETY: the outputs of the tile's columns and the group's rows lie
                    // inside out (contract); the tile holds nb blocks per column.
                    $($c => unsafe {
                        tile::<F, $c, $p>(words, scales, pairs, scale, sum, mask,
                            out.add(t * Layout::Pairs.tile() * stride), stride,
                            if t == 0 { ahead } else { 0 })
                    },)*
                    _ => unreachable!("tiles hold 1..=8 columns"),
                }
            };
        }
        go!(1 => 4, 2 => 2, 3 => 2, 4 => 2, 5 => 2, 6 => 2, 7 => 2, 8 => 2);
    }
}

/// `acc + Σ` of the products of the 16-bit pairs of `w` with the pair at `pair`, broadcast
/// to every lane (`vpdpwssd` with a broadcast memory operand).
///
/// Written as assembly because LLVM splits the intrinsic into `vpmaddwd` + `vpaddd` for a
/// generic x86-64 target, twice the instructions of the kernel's inner loop (measured:
/// 1,080 `vpmaddwd` against 72 `vpdpwssd` in the compiled kernels).
///
/// # Safety
/// AVX-512 F and VNNI present; 4 bytes readable at `pair`.
#[inline]
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn dpwssd_bcast(acc: __m512i, w: __m512i, pair: *const u32) -> __m512i {
    let mut acc = acc;
    // SAFETY: the instruction reads 4 bytes at `pair` (caller's contract) and writes only
    // `acc`; the features it needs are enabled on this function.
    unsafe {
        std::arch::asm!(
            "vpdpwssd {acc}, {w}, dword ptr [{pair}]{{1to16}}",
            acc = inout(zmm_reg) acc,
            w = in(zmm_reg) w,
            pair = in(reg) pair,
            options(pure, readonly, nostack, preserves_flags),
        );
    }
    acc
}

/// One packed group of rows (`words`, `scales`) against one tile of `C` columns, with `P`
/// partial integer accumulators per column; writes `out[c * stride + r]` for the rows in
/// `mask`. With `ahead` > 0, each block's lines `ahead` bytes on are prefetched.
///
/// # Safety
/// AVX-512 F/BW/VL, VNNI, FMA and F16C present; `words` holds `nb · WORDS` vectors and
/// `scales` `nb · SCALE_BYTES` readable bytes of one packed group; the tile's slices hold
/// `nb` blocks of `C` columns; `out` has room for `(C - 1) * stride + 16` values, of which
/// only the lanes in `mask` are written.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile<F: Format, const C: usize, const P: usize>(
    words: &[__m512i],
    scales: *const u8,
    pairs: &[u32],
    scale: &[f32],
    sum: &[f32],
    mask: __mmask16,
    out: *mut f32,
    stride: usize,
    ahead: usize,
) {
    let mut acc = [_mm512_setzero_ps(); C];
    for (b, words) in words.chunks_exact(F::WORDS).enumerate() {
        if ahead != 0 {
            let (w, s) = (
                words.as_ptr().cast::<u8>(),
                scales.wrapping_add(b * F::SCALE_BYTES),
            );
            for line in 0..F::WORDS {
                // Prefetches never fault; the pointers use wrapping arithmetic.
                _mm_prefetch::<_MM_HINT_T0>(w.wrapping_add(ahead + line * 64).cast());
            }
            _mm_prefetch::<_MM_HINT_T0>(s.wrapping_add(ahead).cast());
        }
        let mut part = [[_mm512_setzero_si512(); P]; C];
        macro_rules! pairs {
            ($($p:literal)*) => {$(
                // SAFETY: AVX-512 present (this function's features); words holds WORDS
                // vectors.
                let wv = unsafe { F::unpack(words, $p) };
                for (c, pc) in part.iter_mut().enumerate() {
                    // SAFETY: (b * C + c) * PAIRS + p < nb * C * PAIRS, the tile's length;
                    // AVX-512 VNNI present (this function's features).
                    pc[$p % P] = unsafe {
                        dpwssd_bcast(pc[$p % P], wv, pairs.as_ptr().add((b * C + c) * PAIRS + $p))
                    };
                }
            )*};
        }
        // Unrolled: the pair index picks shifts and accumulators at compile time.
        pairs!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15);
        // SAFETY: block b's scales lie inside `scales` (b < nb, contract).
        let (d, m) = unsafe { F::scales(scales.add(b * F::SCALE_BYTES)) };
        for (c, (a, pc)) in acc.iter_mut().zip(&part).enumerate() {
            let isum = pc[1..].iter().fold(pc[0], |s, v| _mm512_add_epi32(s, *v));
            // SAFETY: b * C + c < nb * C, the length of the tile's scales and sums.
            let (s, t) = unsafe {
                (
                    *scale.get_unchecked(b * C + c),
                    *sum.get_unchecked(b * C + c),
                )
            };
            let ds = _mm512_mul_ps(d, _mm512_set1_ps(s));
            *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), ds, *a);
            if F::MIN {
                *a = _mm512_fmadd_ps(m, _mm512_set1_ps(t), *a);
            }
        }
    }
    for (c, a) in acc.iter().enumerate() {
        // SAFETY: out + c * stride + r is inside the caller's output for every lane in mask.
        unsafe { _mm512_mask_storeu_ps(out.add(c * stride), mask, *a) };
    }
}
