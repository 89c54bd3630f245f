//! AVX-512 VNNI kernels of the 16-bit activation products (`q16`): sixteen weight rows per
//! vector, one lane per row.
//!
//! A group of up to sixteen rows is first packed: each row's block is read with 16-byte
//! loads and transposed in registers, so that lane `r` holds row `r`'s words (gathers of
//! the same words measured slower than the f32 kernels on Zen 5), and stored with the
//! blocks' scales in a buffer the thread reuses. Every tile of activation columns then
//! walks that buffer: each lane builds the integer sum `I_b` of its row inside the lane (no
//! horizontal reduction), and the per-block scale step is one vector operation for sixteen
//! rows. Integer sums are exact, so the number of partial accumulators (chosen per tile
//! width, for latency) does not change a bit; the floating-point steps follow the module
//! docs of `q16` lane by lane.

use std::arch::x86_64::*;

use super::q16::{BLOCK, PAIRS, Q16Acts};
use ferrite_gguf::GgmlType;

/// Rows per group: one per lane.
const ROWS: usize = 16;

/// How one weight format's block is packed and unpacked.
///
/// Packing runs in two passes over a group's blocks, so that only one row pointer is live
/// at a time: [`Format::gather`] copies each row's bytes into the block's slots (a 16-byte
/// chunk of row `r` goes to lane `r / 4` of chunk vector `r % 4`, a scale word to lane `r`
/// of the scale vector), then [`Format::finish`] transposes the chunks in place into words
/// (lane `r` = row `r`) and widens the scales.
trait Format {
    /// Bytes per 32-value block.
    const BYTES: usize;
    /// Packed vectors of weight words per block.
    const WORDS: usize;
    /// Whether the block has a minimum (`x = d · q + m`).
    const MIN: bool;
    /// Copies row `r`'s block at `src` into the packed block `dst` (`WORDS + 2` vectors).
    ///
    /// # Safety
    /// `BYTES` bytes readable at `src`; `r < 16`; `dst` has room for `WORDS + 2` vectors.
    unsafe fn gather(src: *const u8, r: usize, dst: *mut u8);
    /// Turns the gathered block `blk` into `WORDS` vectors of words, the scales and the
    /// minimums (zeros without one).
    ///
    /// # Safety
    /// AVX-512 F/BW/VL present; every row's bytes were gathered into `blk`.
    unsafe fn finish(blk: &mut [__m512i]);
    /// Pair `p` of 16-bit weights from the packed words.
    ///
    /// # Safety
    /// AVX-512 F/BW present; `words` holds `WORDS` vectors.
    unsafe fn unpack(words: &[__m512i], p: usize) -> __m512i;
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

/// The IEEE halves in the low 16 bits of each lane, widened exactly.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn halves(x: __m512i) -> __m512i {
    _mm512_castps_si512(_mm512_cvtph_ps(_mm512_cvtepi32_epi16(x)))
}

struct Q41;

impl Format for Q41 {
    const BYTES: usize = 20;
    const WORDS: usize = 4;
    const MIN: bool = true;

    #[inline]
    unsafe fn gather(src: *const u8, r: usize, dst: *mut u8) {
        // SAFETY: forwarded contract: the nibbles are bytes 4..20, the scale and minimum
        // bytes 0..4; the scale word goes to lane r of vector 4 (byte 256 + 4r < 384).
        unsafe {
            copy_chunk(src.add(4), r, dst);
            std::ptr::copy_nonoverlapping(src, dst.add(256 + 4 * r), 4);
        }
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn finish(blk: &mut [__m512i]) {
        transpose(&mut blk[..4]);
        let dm = blk[4];
        blk[4] = halves(dm);
        blk[5] = halves(_mm512_srli_epi32::<16>(dm));
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

struct Q80;

impl Format for Q80 {
    const BYTES: usize = 34;
    const WORDS: usize = 8;
    const MIN: bool = false;

    #[inline]
    unsafe fn gather(src: *const u8, r: usize, dst: *mut u8) {
        // SAFETY: forwarded contract: the quants are bytes 2..34, the scale bytes 0..2
        // (copied with the next two, which `halves` ignores) to lane r of vector 8.
        unsafe {
            copy_chunk(src.add(2), r, dst);
            copy_chunk(src.add(18), r, dst.add(256));
            std::ptr::copy_nonoverlapping(src, dst.add(512 + 4 * r), 4);
        }
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn finish(blk: &mut [__m512i]) {
        transpose(&mut blk[..4]);
        transpose(&mut blk[4..8]);
        blk[8] = halves(blk[8]);
        blk[9] = _mm512_setzero_si512();
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

/// Every output of [`super::q16::matmul`] (which checked the shapes).
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
    // SAFETY: forwarded contract.
    unsafe {
        if ty == GgmlType::Q4_1 {
            run::<Q41>(w, nr, rb, acts, out, stride);
        } else {
            run::<Q80>(w, nr, rb, acts, out, stride);
        }
    }
}

/// Rows in groups of sixteen: pack the group, then multiply it with every column tile.
///
/// # Safety
/// As [`matmul`], with `F` the format of `w`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
unsafe fn run<F: Format>(
    w: &[u8],
    nr: usize,
    rb: usize,
    acts: &Q16Acts,
    out: *mut f32,
    stride: usize,
) {
    let nb = acts.k() / BLOCK;
    let per_block = F::WORDS + 2;
    PACKED.with_borrow_mut(|packed| {
        if packed.len() < nb * per_block {
            packed.resize(nb * per_block, _mm512_setzero_si512());
        }
        // SAFETY: forwarded contract; packed holds nb blocks.
        unsafe { groups::<F>(w, nr, rb, acts, out, stride, &mut packed[..nb * per_block]) };
    });
}

thread_local! {
    /// Each thread's packed group of rows, reused across calls.
    static PACKED: std::cell::RefCell<Vec<__m512i>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The groups of [`run`], packed into `packed` (`nb` blocks of `WORDS + 2` vectors).
///
/// # Safety
/// As [`run`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
unsafe fn groups<F: Format>(
    w: &[u8],
    nr: usize,
    rb: usize,
    acts: &Q16Acts,
    out: *mut f32,
    stride: usize,
    packed: &mut [__m512i],
) {
    let nb = acts.k() / BLOCK;
    let per_block = F::WORDS + 2;
    let mut r0 = 0;
    while r0 < nr {
        let rows = ROWS.min(nr - r0);
        let mask: __mmask16 = if rows == ROWS {
            0xFFFF
        } else {
            (1u16 << rows) - 1
        };
        let dst = packed.as_mut_ptr().cast::<u8>();
        for r in 0..ROWS {
            // Lanes past the last row take the group's first row; their outputs are not
            // stored.
            let row = &w[(r0 + if r < rows { r } else { 0 }) * rb..][..rb];
            for b in 0..nb {
                let src = row.as_ptr().wrapping_add(b * F::BYTES);
                // The same block of the next group (sixteen rows on), fetched while this
                // group is packed and multiplied, so the weight stream overlaps the
                // arithmetic. Prefetches never fault; the pointer uses wrapping arithmetic.
                _mm_prefetch::<_MM_HINT_T0>(src.wrapping_add(ROWS * rb).cast());
                // SAFETY: block b lies inside the row (b < nb, rb = nb * BYTES); packed
                // block b starts at b * per_block vectors of 64 bytes.
                unsafe { F::gather(src, r, dst.add(b * per_block * 64)) };
            }
        }
        for blk in packed.chunks_exact_mut(per_block) {
            // SAFETY: AVX-512 present (this function's features); every row was gathered.
            unsafe { F::finish(blk) };
        }
        for t in 0..acts.tiles() {
            let (width, pairs, scale, sum) = acts.tile(t);
            macro_rules! go {
                ($($c:literal => $p:literal),*) => {
                    match width {
                        // SAFETY: the outputs of the tile's columns and the group's rows
                        // lie inside out (contract); the tile holds nb blocks per column.
                        $($c => unsafe {
                            tile::<F, $c, $p>(packed, nb, pairs, scale, sum, mask,
                                out.add(t * super::q16::TILE * stride + r0),
                                stride)
                        },)*
                        _ => unreachable!("tiles hold 1..=8 columns"),
                    }
                };
            }
            go!(1 => 4, 2 => 2, 3 => 2, 4 => 1, 5 => 1, 6 => 1, 7 => 1, 8 => 1);
        }
        r0 += rows;
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

/// One packed group of rows against one tile of `C` columns, with `P` partial integer
/// accumulators per column; writes `out[c * stride + r]` for the rows in `mask`.
///
/// # Safety
/// As [`run`]; `packed` holds `nb` packed blocks, the tile's slices hold `nb` blocks of
/// `C` columns, and `out` has room for `(C - 1) * stride + 16` values, of which only the
/// lanes in `mask` are written.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile<F: Format, const C: usize, const P: usize>(
    packed: &[__m512i],
    nb: usize,
    pairs: &[u32],
    scale: &[f32],
    sum: &[f32],
    mask: __mmask16,
    out: *mut f32,
    stride: usize,
) {
    let mut acc = [_mm512_setzero_ps(); C];
    for (b, blk) in packed.chunks_exact(F::WORDS + 2).take(nb).enumerate() {
        let (words, dm) = blk.split_at(F::WORDS);
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
        let d = _mm512_castsi512_ps(dm[0]);
        let m = _mm512_castsi512_ps(dm[1]);
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
