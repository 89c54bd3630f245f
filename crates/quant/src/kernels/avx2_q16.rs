//! AVX2 kernels of the 16-bit activation products (`q16`): the packed groups of sixteen
//! rows of `avx512_q16` (lane `r` = row `r`), read as two 256-bit halves of eight rows.
//!
//! `vpmaddwd` multiplies 16-bit pairs and adds each pair into a 32-bit lane exactly (a
//! weight times an activation is at most 128 · 32767 in magnitude, a block's sum at most
//! 2^27), so each lane builds the same integer block sum `I_b` as `vpdpwssd` does, and the
//! per-block scale steps are the same IEEE operations lane by lane: the outputs are
//! bit-identical to the AVX-512 kernels' and to the definition in `q16`'s module docs.
//! Columns are worked in chunks that fit sixteen registers (a chunk's shape changes which
//! columns share a pass over the weights, never an output's operations).
//!
//! At this level only, Q5_0 rows are packed as Q8_0 (`avx512_q16::Q50`) and multiplied by
//! the Q8_0 kernel (the same integers and scale), and Q4_K rows as Q4_1 with f32 scales and
//! minimums (`avx512_q16::Q4K`, eight blocks per super-block), multiplied by the Q4_1
//! kernel with those scales; Q6_K rows as Q8_0 with an f32 scale per 16-value half
//! (`avx512_q16::Q6K`), whose two halves' integer sums take a block step each.
//!
//! This module never defines a layout of its own: packing copies rows with
//! `avx512_q16::gather_group` and only the in-register transpose is AVX2 code.

use std::arch::x86_64::*;

use super::avx512_q16::{Format, Q4K, Q6K, Q41, Q50, Q80, ROWS, gather_group};
use super::q16::{BLOCK, PAIRS, Q16Acts, packed_row_bytes};
use ferrite_gguf::GgmlType;

/// Rows per 256-bit half of a packed group.
const HALF: usize = 8;

/// How a packed format's words and scales are read eight rows at a time.
trait Lanes8: Format {
    /// Pair `p` of 16-bit weights of eight rows, from the block's word halves `w`.
    ///
    /// # Safety
    /// AVX2 present; `w` holds the block's `WORDS` word halves.
    unsafe fn unpack8(w: &[__m256i; 8], p: usize) -> __m256i;
    /// Whether each block has a scale per 16-value half (its two `scales8` vectors), whose
    /// integer sums take one block step each, in order.
    const SPLIT: bool = false;
    /// The scales and minimums (zeros without one) of rows `8h..8h + 8` of a packed block;
    /// for a split format, the two halves' scales.
    ///
    /// # Safety
    /// AVX2 and F16C present; `sc` holds the block's `SCALE_BYTES` bytes; `h < 2`.
    unsafe fn scales8(sc: *const u8, h: usize) -> (__m256, __m256) {
        // SAFETY: the block's 16 f16 `d`, then (with a minimum) 16 f16 `m` (contract).
        unsafe {
            let d = _mm256_cvtph_ps(_mm_loadu_si128(sc.add(16 * h).cast()));
            let m = if Self::MIN {
                _mm256_cvtph_ps(_mm_loadu_si128(sc.add(32 + 16 * h).cast()))
            } else {
                _mm256_setzero_ps()
            };
            (d, m)
        }
    }
}

impl Lanes8 for Q41 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack8(w: &[__m256i; 8], p: usize) -> __m256i {
        // As `avx512_q16`'s Q4_1 unpack: word i holds nibble bytes 4i..4i+4.
        let x = w[p / 4];
        let nib = _mm256_set1_epi32(0x000F_000F);
        let shifted = match p % 4 {
            0 => x,
            1 => _mm256_srli_epi32::<8>(x),
            2 => _mm256_srli_epi32::<4>(x),
            _ => _mm256_srli_epi32::<12>(x),
        };
        _mm256_and_si256(shifted, nib)
    }
}

impl Lanes8 for Q4K {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack8(w: &[__m256i; 8], p: usize) -> __m256i {
        // SAFETY: forwarded contract; the packed words are Q4_1's.
        unsafe { Q41::unpack8(w, p) }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scales8(sc: *const u8, h: usize) -> (__m256, __m256) {
        // SAFETY: the block's 16 f32 `d`, then 16 f32 `m` (contract).
        unsafe {
            (
                _mm256_loadu_ps(sc.add(32 * h).cast()),
                _mm256_loadu_ps(sc.add(64 + 32 * h).cast()),
            )
        }
    }
}

impl Lanes8 for Q6K {
    const SPLIT: bool = true;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack8(w: &[__m256i; 8], p: usize) -> __m256i {
        // SAFETY: forwarded contract; the packed words are Q8_0's.
        unsafe { Q80::unpack8(w, p) }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scales8(sc: *const u8, h: usize) -> (__m256, __m256) {
        // SAFETY: the block's 16 f32 first-half scales, then 16 second-half (contract).
        unsafe {
            (
                _mm256_loadu_ps(sc.add(32 * h).cast()),
                _mm256_loadu_ps(sc.add(64 + 32 * h).cast()),
            )
        }
    }
}

impl Lanes8 for Q80 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack8(w: &[__m256i; 8], p: usize) -> __m256i {
        // As `avx512_q16`'s Q8_0 unpack: pairs (q0, q2), (q1, q3) of word p / 2.
        let x = w[p / 2];
        if p.is_multiple_of(2) {
            _mm256_srai_epi16::<8>(_mm256_slli_epi16::<8>(x))
        } else {
            _mm256_srai_epi16::<8>(x)
        }
    }
}

/// One block of activations quantized as `q16` defines, written in the pair order (`perm`:
/// `q16::pair_order` as indices); returns `s` and `S`. Bit-identical to
/// `q16::quantize_block`: the scaling product is the same f32 multiply, `vcvtps2dq` rounds
/// to nearest even (Rust never changes MXCSR's rounding), and the integer sum is exact.
///
/// # Safety
/// AVX2 present.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn quantize_block(
    a: &[f32; BLOCK],
    perm: &[u16; BLOCK],
    pairs: &mut [u32; PAIRS],
) -> (f32, f32) {
    // SAFETY: a holds 32 values, four vectors of eight.
    let v: [__m256; 4] = std::array::from_fn(|i| unsafe { _mm256_loadu_ps(a.as_ptr().add(8 * i)) });
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
    let abs = v.map(|v| _mm256_and_ps(v, abs_mask));
    let inf = _mm256_set1_ps(f32::INFINITY);
    // A NaN compares unordered, so it fails `< inf` as ±inf does.
    let finite = abs
        .iter()
        .fold(_mm256_castsi256_ps(_mm256_set1_epi32(-1)), |m, &x| {
            _mm256_and_ps(m, _mm256_cmp_ps::<_CMP_LT_OQ>(x, inf))
        });
    if _mm256_movemask_ps(finite) != 0xFF {
        *pairs = [0; PAIRS];
        return (f32::NAN, f32::NAN);
    }
    let m8 = _mm256_max_ps(_mm256_max_ps(abs[0], abs[1]), _mm256_max_ps(abs[2], abs[3]));
    let m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps::<1>(m8));
    let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    let amax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_shuffle_ps::<1>(m2, m2)));
    let inv = 32767.0 / amax;
    if amax == 0.0 || !inv.is_finite() {
        *pairs = [0; PAIRS];
        return (0.0, 0.0);
    }
    let vinv = _mm256_set1_ps(inv);
    let (lim_lo, lim_hi) = (_mm256_set1_epi32(-32767), _mm256_set1_epi32(32767));
    let q = v.map(|v| {
        let q = _mm256_cvtps_epi32(_mm256_mul_ps(v, vinv));
        _mm256_min_epi32(_mm256_max_epi32(q, lim_lo), lim_hi)
    });
    let t8 = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    let t4 = _mm_add_epi32(
        _mm256_castsi256_si128(t8),
        _mm256_extracti128_si256::<1>(t8),
    );
    let t2 = _mm_add_epi32(t4, _mm_unpackhi_epi64(t4, t4));
    let total = _mm_cvtsi128_si32(_mm_add_epi32(t2, _mm_shuffle_epi32::<1>(t2)));
    // packs works within 128-bit lanes; the 64-bit permute puts the values back in order.
    let mut natural = [0i16; BLOCK];
    for (half, q) in q.chunks_exact(2).enumerate() {
        let packed = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(q[0], q[1]));
        // SAFETY: natural holds 32 values, two vectors of sixteen.
        unsafe { _mm256_storeu_si256(natural.as_mut_ptr().add(16 * half).cast(), packed) };
    }
    for (p, pair) in pairs.iter_mut().enumerate() {
        let lo = natural[usize::from(perm[2 * p])] as u16;
        let hi = natural[usize::from(perm[2 * p + 1])] as u16;
        *pair = u32::from(lo) | (u32::from(hi) << 16);
    }
    let s = amax / 32767.0;
    (s, s * total as f32)
}

/// Four gathered chunk vectors (64 bytes each, at `z`) to four vectors of 32-bit words,
/// exactly as `avx512_q16::transpose` does: its unpacks work within 128-bit lanes, so the
/// two 256-bit halves are transposed one after the other.
///
/// # Safety
/// AVX2 present; 256 bytes readable and writable at `z`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn transpose(z: *mut u8) {
    for h in 0..2 {
        // SAFETY: vector v's half h is 32 bytes at v * 64 + h * 32 < 256 (contract).
        unsafe {
            let at = |v: usize| z.add(v * 64 + h * 32).cast::<__m256i>();
            let (z0, z1) = (_mm256_loadu_si256(at(0)), _mm256_loadu_si256(at(1)));
            let (z2, z3) = (_mm256_loadu_si256(at(2)), _mm256_loadu_si256(at(3)));
            let t0 = _mm256_unpacklo_epi32(z0, z1);
            let t1 = _mm256_unpackhi_epi32(z0, z1);
            let t2 = _mm256_unpacklo_epi32(z2, z3);
            let t3 = _mm256_unpackhi_epi32(z2, z3);
            _mm256_storeu_si256(at(0), _mm256_unpacklo_epi64(t0, t2));
            _mm256_storeu_si256(at(1), _mm256_unpackhi_epi64(t0, t2));
            _mm256_storeu_si256(at(2), _mm256_unpacklo_epi64(t1, t3));
            _mm256_storeu_si256(at(3), _mm256_unpackhi_epi64(t1, t3));
        }
    }
}

/// Packs rows `r0..r0 + rows` (`rows <= 16`) of `w` into one group at `dst`, in
/// `avx512_q16`'s layout.
///
/// # Safety
/// AVX2 present; the rows exist in `w` (`rb` bytes each, whole blocks of `F`); `dst` has
/// room for sixteen packed rows (`16 * q16::packed_row_bytes(ty, rb)` bytes).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pack_group<F: Format>(
    w: &[u8],
    r0: usize,
    rows: usize,
    rb: usize,
    dst: *mut u8,
    prefetch: bool,
) {
    // SAFETY: forwarded contract; the words region is nb * WORDS vectors of 64 bytes at
    // dst, WORDS a multiple of four.
    unsafe {
        gather_group::<F>(w, r0, rows, rb, dst, prefetch);
        for chunk in 0..rb / F::BYTES * F::SUPER * F::WORDS / 4 {
            transpose(dst.add(chunk * 256));
        }
    }
}

/// Packs the `nr` rows of `w` (`rb` bytes each, blocks of `ty`), in groups of sixteen, into
/// `dst`: group `g` at byte `g * group_bytes` (`avx512_q16::pack`'s bytes).
///
/// # Safety
/// AVX2 present; `w` holds `nr` rows of `rb` bytes of whole blocks of `ty` (Q4_1, Q4_K,
/// Q5_0, Q6_K or Q8_0); `dst` has room for `nr.div_ceil(16)` groups; `group_bytes >= 16 *
/// q16::packed_row_bytes(ty, rb)`.
#[target_feature(enable = "avx2,fma,f16c")]
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
            match ty {
                GgmlType::Q4_1 => pack_group::<Q41>(w, r0, rows, rb, g, false),
                GgmlType::Q5_0 => pack_group::<Q50>(w, r0, rows, rb, g, false),
                GgmlType::Q4_K => pack_group::<Q4K>(w, r0, rows, rb, g, false),
                GgmlType::Q6_K => pack_group::<Q6K>(w, r0, rows, rb, g, false),
                _ => pack_group::<Q80>(w, r0, rows, rb, g, false),
            }
        }
        r0 += rows;
    }
}

thread_local! {
    /// Each thread's packed group of rows, reused across calls.
    static PACKED: std::cell::RefCell<Vec<__m256i>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Every output of `q16::matmul` (which checked the shapes) for activations in the pairs
/// layout: each group of sixteen rows is packed into a buffer the thread reuses, then
/// multiplied.
///
/// # Safety
/// AVX2, FMA and F16C present; `w` holds `nr` rows of `rb` bytes of blocks of `ty` (Q4_1,
/// Q4_K, Q5_0, Q6_K or Q8_0) covering `acts.k()` values; `acts` is in the pairs layout;
/// `out.add(c * stride + r)` is writable and unaliased for every column `c` and row
/// `r < nr`, and `stride >= nr`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn matmul(
    ty: GgmlType,
    w: &[u8],
    nr: usize,
    rb: usize,
    acts: &Q16Acts,
    out: *mut f32,
    stride: usize,
) {
    PACKED.with_borrow_mut(|packed| {
        let vectors = (ROWS * packed_row_bytes(ty, rb)).div_ceil(32);
        if packed.len() < vectors {
            packed.resize(vectors, _mm256_setzero_si256());
        }
        let dst = packed.as_mut_ptr().cast::<u8>();
        let mut r0 = 0;
        while r0 < nr {
            let rows = ROWS.min(nr - r0);
            // SAFETY: forwarded contract; the buffer holds one group (16 rows of rb bytes);
            // rows r0..r0 + rows exist and their outputs are the caller's.
            unsafe {
                match ty {
                    GgmlType::Q4_1 => {
                        pack_group::<Q41>(w, r0, rows, rb, dst, true);
                        multiply_group::<Q41>(dst, acts, rows, out.add(r0), stride, 0);
                    }
                    GgmlType::Q5_0 => {
                        // Packed as Q8_0 (`Q50`), so multiplied as Q8_0.
                        pack_group::<Q50>(w, r0, rows, rb, dst, true);
                        multiply_group::<Q80>(dst, acts, rows, out.add(r0), stride, 0);
                    }
                    GgmlType::Q4_K => {
                        pack_group::<Q4K>(w, r0, rows, rb, dst, true);
                        multiply_group::<Q4K>(dst, acts, rows, out.add(r0), stride, 0);
                    }
                    GgmlType::Q6_K => {
                        pack_group::<Q6K>(w, r0, rows, rb, dst, true);
                        multiply_group::<Q6K>(dst, acts, rows, out.add(r0), stride, 0);
                    }
                    _ => {
                        pack_group::<Q80>(w, r0, rows, rb, dst, true);
                        multiply_group::<Q80>(dst, acts, rows, out.add(r0), stride, 0);
                    }
                }
            }
            r0 += rows;
        }
    });
}

/// Every output of the packed `groups` (`group_bytes` apart at `packed`) of a matrix of
/// `nr` rows: `out[c * stride + r]` for the rows `r` of those groups.
///
/// # Safety
/// AVX2, FMA and F16C present; `packed` holds the groups of a matrix of `ty` (Q4_1, Q4_K,
/// Q5_0, Q6_K or Q8_0) with `acts.k()` values per row, packed by [`pack`] or
/// `avx512_q16::pack`; `acts` is in the pairs layout; `groups.end <= nr.div_ceil(16)`; `out.add(c * stride + r)` is writable
/// and unaliased for every column `c` and every row `r` of those groups below `nr`, and
/// `stride >= nr`.
#[target_feature(enable = "avx2,fma,f16c")]
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
    for g in groups {
        let r0 = g * ROWS;
        let rows = ROWS.min(nr - r0);
        // SAFETY: forwarded contract: group g lies in `packed`, its rows' outputs in `out`.
        unsafe {
            let group = packed.add(g * group_bytes);
            match ty {
                GgmlType::Q4_1 => {
                    multiply_group::<Q41>(group, acts, rows, out.add(r0), stride, group_bytes);
                }
                GgmlType::Q4_K => {
                    multiply_group::<Q4K>(group, acts, rows, out.add(r0), stride, group_bytes);
                }
                GgmlType::Q6_K => {
                    multiply_group::<Q6K>(group, acts, rows, out.add(r0), stride, group_bytes);
                }
                // Q8_0, or Q5_0 packed as Q8_0.
                _ => multiply_group::<Q80>(group, acts, rows, out.add(r0), stride, group_bytes),
            }
        }
    }
}

/// One packed group (of `rows` real rows) times every tile of `acts`: `out[c * stride + r]`
/// for `r < rows`. Up to two columns take both halves of the group in one pass (decode);
/// wider tiles take each half in chunks of up to four columns. With `ahead` > 0, the first
/// pass fetches the bytes `ahead` past each block it reads (the next packed group's).
///
/// # Safety
/// As [`matmul_packed`], for the one group at `group` and `out` at its first row.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn multiply_group<F: Lanes8>(
    group: *const u8,
    acts: &Q16Acts,
    rows: usize,
    out: *mut f32,
    stride: usize,
    ahead: usize,
) {
    let nb = acts.k() / BLOCK;
    let mut ahead = ahead;
    for t in 0..acts.tiles() {
        let (width, pairs, scale, sum) = acts.tile(t);
        let tile = Tile {
            group,
            nb,
            pairs: pairs.as_ptr(),
            scale: scale.as_ptr(),
            sum: sum.as_ptr(),
            width,
            rows,
            // SAFETY: tile t's columns start at column 8t (the pairs layout's tiles).
            out: unsafe { out.add(t * super::q16::Layout::Pairs.tile() * stride) },
            stride,
        };
        // SAFETY: forwarded contract; every chunk's columns lie in the tile and its halves
        // in the group.
        unsafe {
            match width {
                1 => tile.run::<F, 2, 1>(0, 0, ahead),
                2 => tile.run::<F, 2, 2>(0, 0, ahead),
                _ => {
                    for h in (0..2).filter(|h| rows > h * HALF) {
                        let mut c0 = 0;
                        while c0 < width {
                            match width - c0 {
                                1 => tile.run::<F, 1, 1>(h, c0, ahead),
                                2 => tile.run::<F, 1, 2>(h, c0, ahead),
                                3 => tile.run::<F, 1, 3>(h, c0, ahead),
                                _ => tile.run::<F, 1, 4>(h, c0, ahead),
                            }
                            c0 += 4;
                            ahead = 0;
                        }
                    }
                }
            }
        }
        ahead = 0;
    }
}

/// One packed group against one tile of activation columns in the pairs layout.
struct Tile {
    /// The packed group: `nb · WORDS` vectors of 64 bytes of words, then the scales.
    group: *const u8,
    /// Blocks per row.
    nb: usize,
    /// The tile's words: block `b` of column `c` at `(b · width + c) · 16`.
    pairs: *const u32,
    /// The tile's `s`, block `b` of column `c` at `b · width + c`.
    scale: *const f32,
    /// The tile's `S`, as `scale`.
    sum: *const f32,
    /// Columns in the tile.
    width: usize,
    /// Real rows in the group.
    rows: usize,
    /// Output of the tile's first column and the group's first row.
    out: *mut f32,
    /// Distance between two columns' outputs.
    stride: usize,
}

impl Tile {
    /// Rows `8 · h0 .. 8 · (h0 + H)` of the group times columns `c0 .. c0 + C` of the tile.
    ///
    /// # Safety
    /// AVX2, FMA and F16C present; the fields describe one packed group of `F` and one tile
    /// of `acts.k()` values per column as their docs say; `c0 + C <= width`, `h0 + H <= 2`;
    /// the outputs of those columns and of the real rows are writable and unaliased.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn run<F: Lanes8, const H: usize, const C: usize>(
        &self,
        h0: usize,
        c0: usize,
        ahead: usize,
    ) {
        let block_bytes = F::WORDS * 64;
        // SAFETY: the scales follow the nb blocks of words (contract).
        let scales = unsafe { self.group.add(self.nb * block_bytes) };
        let mut acc = [[_mm256_setzero_ps(); C]; H];
        for b in 0..self.nb {
            let words = self.group.wrapping_add(b * block_bytes);
            let sc = scales.wrapping_add(b * F::SCALE_BYTES);
            if ahead != 0 {
                for line in 0..F::WORDS {
                    // Prefetches never fault; the pointers use wrapping arithmetic.
                    _mm_prefetch::<_MM_HINT_T0>(words.wrapping_add(ahead + line * 64).cast());
                }
                _mm_prefetch::<_MM_HINT_T0>(sc.wrapping_add(ahead).cast());
            }
            let mut w = [[_mm256_setzero_si256(); 8]; H];
            for (h, w) in w.iter_mut().enumerate() {
                for (v, w) in w.iter_mut().enumerate().take(F::WORDS) {
                    // SAFETY: word vector v < WORDS of block b < nb, half h0 + h < 2.
                    *w = unsafe { _mm256_loadu_si256(words.add(v * 64 + (h0 + h) * 32).cast()) };
                }
            }
            // SAFETY: column c0 + c < width of block b < nb lies in the tile (contract).
            let at = |c: usize| unsafe { self.pairs.add((b * self.width + c0 + c) * PAIRS) };
            let mut part = [[_mm256_setzero_si256(); C]; H];
            macro_rules! pairs {
                ($($p:literal)*) => {$(
                    // SAFETY: AVX2 present (this function's features).
                    let wv: [__m256i; H] = std::array::from_fn(|h| unsafe { F::unpack8(&w[h], $p) });
                    for c in 0..C {
                        // SAFETY: pair $p < 16 of a slot of sixteen words.
                        let a = _mm256_set1_epi32(unsafe { *at(c).add($p) } as i32);
                        for h in 0..H {
                            part[h][c] = _mm256_add_epi32(part[h][c], _mm256_madd_epi16(wv[h], a));
                        }
                    }
                )*};
            }
            // The block step: `acc = fma(I, d · s, acc)`, then with a minimum
            // `acc = fma(m, S, acc)`; `half` picks a split format's scale (and leaves out
            // the minimum, which split formats do not have).
            macro_rules! step {
                ($half:expr) => {
                    for h in 0..H {
                        // SAFETY: sc is the block's scales; h0 + h < 2.
                        let (d, m) = unsafe { F::scales8(sc, h0 + h) };
                        let d = if $half == 1 { m } else { d };
                        for c in 0..C {
                            let i = b * self.width + c0 + c;
                            // SAFETY: i < nb · width, the length of the tile's scales and sums.
                            let (s, t) = unsafe { (*self.scale.add(i), *self.sum.add(i)) };
                            let ds = _mm256_mul_ps(d, _mm256_set1_ps(s));
                            let a = &mut acc[h][c];
                            *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(part[h][c]), ds, *a);
                            if F::MIN {
                                *a = _mm256_fmadd_ps(m, _mm256_set1_ps(t), *a);
                            }
                        }
                    }
                };
            }
            // Unrolled: the pair index picks shifts at compile time.
            if F::SPLIT {
                // Pairs 0..8 hold values 0..16 in Q8_0's pair order.
                pairs!(0 1 2 3 4 5 6 7);
                step!(0);
                part = [[_mm256_setzero_si256(); C]; H];
                pairs!(8 9 10 11 12 13 14 15);
                step!(1);
            } else {
                pairs!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15);
                step!(0);
            }
        }
        let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        for (h, acc) in acc.iter().enumerate() {
            let first = (h0 + h) * HALF;
            let n = self.rows.saturating_sub(first).min(HALF);
            if n == 0 {
                continue;
            }
            let mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32), lanes);
            for (c, a) in acc.iter().enumerate() {
                // SAFETY: the lanes in mask are real rows of column c0 + c, whose outputs
                // are the caller's (contract); maskstore writes only those.
                unsafe {
                    let dst = self.out.add((c0 + c) * self.stride + first);
                    _mm256_maskstore_ps(dst, mask, *a);
                }
            }
        }
    }
}
