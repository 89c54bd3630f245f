//! AMX kernel of the 16-bit activation products (`q16`): sixteen weight rows times sixteen
//! activation columns per tile instruction, for batches.
//!
//! A tile product `C[m][n] += Σ_k A[m][k] · B[k / 4][4n + k % 4]` over bytes is exact in
//! 32 bits. Here the rows of `A` are activation columns (a block's 32 high or low bytes,
//! `Layout::Bytes`), and `B` is a packed group's block as it lies (lane `n` = weight row
//! `n`; Q4_1 nibbles are split into bytes first). So row `m` of `C` is, lane by lane, the
//! very vector of integer sums the `vpdpwssd` kernel builds for column `m`, and the scale
//! steps that follow are that kernel's, in the same order: the outputs are bit-identical.
//! Each block takes two tile products (high bytes signed, low bytes unsigned), and
//! `I = 256 · C_hi + C_lo` is exact (|I| < 2^31 for both formats).
//!
//! Owns the tile unit's state on the threads that run it: the configuration is loaded at
//! the start of a call and released at its end ([`Tiles`]), so a thread never holds tile
//! state between calls. Never used without [`available`].

use std::arch::asm;
use std::arch::x86_64::*;
use std::sync::OnceLock;

use super::avx512_q16::Format;
use super::q16::{BLOCK, PAIRS, Q16Acts};

/// Rows of a tile: weight rows in `B`'s lanes, activation columns in `A` and `C`.
const ROWS: usize = 16;

/// Bytes between two rows of every tile in memory (a packed block's vectors, a slot of the
/// activations, a row of the integer sums).
const ROW_STRIDE: usize = 64;

/// Whether the CPU has AMX with INT8 products and the kernel granted this process the tile
/// state, probed once; `FERRITE_AMX=off` (a diagnostic switch, for comparing kernels on one
/// machine) turns it off, and so does a process level below AVX-512 (`FERRITE_SIMD=avx2`),
/// whose kernels do not read the tiles' byte layout.
pub(super) fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        let off = std::env::var("FERRITE_AMX").is_ok_and(|v| v.trim().eq_ignore_ascii_case("off"));
        let level = crate::simd_level() == crate::SimdLevel::Avx512;
        !off && level && cpu_has_amx_int8() && os_grants_tiles()
    })
}

/// CPUID: AMX-TILE and AMX-INT8, with the palette this kernel configures (palette 1: eight
/// tiles of up to 16 rows of 64 bytes).
fn cpu_has_amx_int8() -> bool {
    if !std::arch::is_x86_feature_detected!("avx512bw") {
        return false;
    }
    // CPUID is safe on x86-64; leaf 7 exists where AVX-512 does.
    let leaf7 = __cpuid_count(7, 0);
    let (tile, int8) = (leaf7.edx >> 24 & 1 == 1, leaf7.edx >> 25 & 1 == 1);
    let max_leaf = __cpuid(0).eax;
    if !(tile && int8) || max_leaf < 0x1D {
        return false;
    }
    // Leaf 0x1D: the tile palettes.
    let (palettes, palette1) = (__cpuid_count(0x1D, 0).eax, __cpuid_count(0x1D, 1));
    let bytes_per_row = palette1.ebx & 0xFFFF;
    let (names, max_rows) = (palette1.ebx >> 16, palette1.ecx & 0xFFFF);
    palettes >= 1 && bytes_per_row >= 64 && names >= 8 && max_rows >= 16
}

/// Linux hands the tile data state to a process only on request (`arch_prctl`
/// `ARCH_REQ_XCOMP_PERM`); other systems are not supported here.
#[cfg(target_os = "linux")]
fn os_grants_tiles() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: the request takes two integers and changes only this process's permissions.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

#[cfg(not(target_os = "linux"))]
fn os_grants_tiles() -> bool {
    false
}

/// The tile configuration of one call, loaded by [`Tiles::load`] and released when dropped.
///
/// Tiles: the high- and low-byte sums `C` of even blocks in 0 and 1, of odd blocks in 5 and
/// 6 (rows × 64 bytes), the high and low activation bytes `A` in 2 and 3 (rows × 32), the
/// weight bytes `B` of even blocks in 4, of odd ones in 7 (8 × 64). Alternating lets a
/// block's products start while the previous block's sums are still being stored.
pub(super) struct Tiles(());

/// The 64-byte `ldtilecfg` operand.
#[repr(C, align(64))]
struct Config([u8; 64]);

impl Tiles {
    /// Loads the configuration on this thread, for products of `n` columns (tiles of up to
    /// 16 rows: a tile product's time grows with its rows).
    ///
    /// # Safety
    /// [`available`] returned true.
    pub(super) unsafe fn load(n: usize) -> Tiles {
        let rows = n.clamp(1, ROWS) as u8;
        let mut cfg = Config([0; 64]);
        cfg.0[0] = 1; // palette 1
        let shapes: [(u8, u16); 8] = [
            (rows, 64),
            (rows, 64),
            (rows, 32),
            (rows, 32),
            (8, 64),
            (rows, 64),
            (rows, 64),
            (8, 64),
        ];
        for (t, (rows, colsb)) in shapes.into_iter().enumerate() {
            cfg.0[16 + 2 * t..18 + 2 * t].copy_from_slice(&colsb.to_le_bytes());
            cfg.0[48 + t] = rows;
        }
        // SAFETY: AMX is present and granted (contract); the operand is 64 readable bytes
        // describing shapes palette 1 allows (checked by `cpu_has_amx_int8`).
        unsafe { asm!("ldtilecfg [{0}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly)) };
        Tiles(())
    }
}

impl Drop for Tiles {
    fn drop(&mut self) {
        // SAFETY: a `Tiles` exists only once the configuration was loaded on this thread
        // (AMX present); releasing returns the tile state to its initial, empty form.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }
}

/// Each thread's buffers, reused across groups and calls.
struct Scratch {
    /// The weight bytes of one group, for formats that are unpacked first.
    byte_rows: Vec<__m512i>,
    /// The integer sums of the last two blocks (even, odd).
    sums: [Sums; 2],
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = const {
        std::cell::RefCell::new(Scratch {
            byte_rows: Vec::new(),
            sums: [Sums([[0; 16]; 2 * ROWS]); 2],
        })
    };
}

/// One packed group (its `words` and `scales`) times every tile of `acts` (in
/// `Layout::Bytes`): `out[c * stride + r]` for the rows `r` in `mask`, bit-identical to the
/// `vpdpwssd` kernel. With `ahead` > 0, the first tile prefetches the bytes `ahead` past
/// each block it reads (the next packed group's).
///
/// # Safety
/// [`Tiles::load`]`(acts.n())` ran on this thread; AVX-512 F/BW/VL, FMA and F16C present;
/// `words` and `scales` are one packed group of `F` with `acts.k()` values per row (its
/// `nb · WORDS` vectors and `nb · SCALE_BYTES` bytes of scales); `out.add(c * stride + r)`
/// is writable and unaliased for every column `c` and row `r` in `mask`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
pub(super) unsafe fn multiply_group<F: Format>(
    words: &[__m512i],
    scales: *const u8,
    acts: &Q16Acts,
    mask: __mmask16,
    out: *mut f32,
    stride: usize,
    ahead: usize,
) {
    SCRATCH.with_borrow_mut(|scratch| {
        // Unpacked for the whole group before any tile reads them: a tile load of bytes
        // that vector stores have just written waits for them to reach the cache.
        // SAFETY: words holds nb whole blocks; AVX-512 present (this function's features).
        let weights = unsafe { F::byte_rows(words, &mut scratch.byte_rows) };
        for t in 0..acts.tiles() {
            let (width, bytes, scale, sum) = acts.tile(t);
            let out = out.wrapping_add(t * ROWS * stride);
            let ahead = if t == 0 { ahead } else { 0 };
            macro_rules! go {
                ($($c:literal)*) => {
                    match width {
                        // SAFETY: the outputs of the tile's columns and the group's rows
                        // lie inside out (contract); the tile holds nb blocks per column
                        // and its words are followed by a tile of slack; `weights` holds
                        // nb blocks of eight rows.
                        $($c => unsafe {
                            tile::<F, $c>(words, weights, scales, bytes, scale, sum,
                                &mut scratch.sums, mask, out, stride, ahead)
                        },)*
                        _ => unreachable!("tiles hold 1..=16 columns"),
                    }
                };
            }
            go!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16);
        }
    });
}

/// Tile-aligned integer sums of one block: rows 0..16 the high-byte sums, 16..32 the
/// low-byte sums, one row (64 bytes) per activation column.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Sums([[i32; 16]; 2 * ROWS]);

/// Loads block `b`'s tiles and issues its two tile products into the even or odd sums
/// tiles (high bytes signed, low bytes unsigned; the weights signed for both formats, as
/// Q4_1's 0..15 read the same either way: the signed-by-unsigned product `tdpbsud`
/// measured 1.6 times the time of the other three).
///
/// # Safety
/// The tiles are configured ([`Tiles::load`]); 8 rows of 64 bytes readable at `weights`;
/// the configured rows of 64 bytes (the first 32 of each read) at `hi` and `lo`.
#[inline]
unsafe fn products(odd: bool, weights: *const u8, hi: *const u8, lo: *const u8) {
    macro_rules! issue {
        ($c0:literal, $c1:literal, $b:literal) => {
            // SAFETY: forwarded contract.
            unsafe {
                asm!(
                    concat!("tileloadd ", $b, ", [{w} + {s}*1]"),
                    "tileloadd tmm2, [{hi} + {s}*1]",
                    "tileloadd tmm3, [{lo} + {s}*1]",
                    concat!("tilezero ", $c0),
                    concat!("tilezero ", $c1),
                    concat!("tdpbssd ", $c0, ", tmm2, ", $b),
                    concat!("tdpbusd ", $c1, ", tmm3, ", $b),
                    w = in(reg) weights, hi = in(reg) hi, lo = in(reg) lo, s = in(reg) ROW_STRIDE,
                    options(nostack, readonly),
                )
            }
        };
    }
    if odd {
        issue!("tmm5", "tmm6", "tmm7");
    } else {
        issue!("tmm0", "tmm1", "tmm4");
    }
}

/// Stores the even or odd sums tiles into `sums`.
///
/// # Safety
/// The tiles are configured ([`Tiles::load`]) and hold the products of [`products`].
#[inline]
unsafe fn store(odd: bool, sums: &mut Sums) {
    let out_hi = sums.0.as_mut_ptr().cast::<u8>();
    let out_lo = sums.0[ROWS..].as_mut_ptr().cast::<u8>();
    macro_rules! issue {
        ($c0:literal, $c1:literal) => {
            // SAFETY: the tiles write the configured rows (at most 16) of 64 bytes into
            // each half of `sums`, which holds 16 rows for each.
            unsafe {
                asm!(
                    concat!("tilestored [{ohi} + {s}*1], ", $c0),
                    concat!("tilestored [{olo} + {s}*1], ", $c1),
                    ohi = in(reg) out_hi, olo = in(reg) out_lo, s = in(reg) ROW_STRIDE,
                    options(nostack),
                )
            }
        };
    }
    if odd {
        issue!("tmm5", "tmm6");
    } else {
        issue!("tmm0", "tmm1");
    }
}

/// One packed group against one tile of `C` columns: writes `out[c * stride + r]` for the
/// rows in `mask`. Block `b`'s scale steps run after block `b + 1`'s products are issued
/// and before their sums are stored (a vector load waits for every older tile store), so
/// that the tile unit and the vector units overlap. With `ahead` > 0, each block's
/// packed lines `ahead` bytes on are prefetched.
///
/// # Safety
/// As [`multiply_group`]; `words` holds the group's `nb · WORDS` vectors, `weights` its `nb`
/// blocks of eight 64-byte rows and `scales` its `nb · SCALE_BYTES` bytes of scales; `bytes` holds the tile's `nb · C` slots of 16
/// words, then at least 16 slots more; `scale` and `sum` hold `nb · C` values; `out` has
/// room for `(C - 1) * stride + 16` values, of which only the lanes in `mask` are written.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile<F: Format, const C: usize>(
    words: &[__m512i],
    weights: *const u8,
    scales: *const u8,
    bytes: &[u32],
    scale: &[f32],
    sum: &[f32],
    sums: &mut [Sums; 2],
    mask: __mmask16,
    out: *mut f32,
    stride: usize,
    ahead: usize,
) {
    let nb = words.len() / F::WORDS;
    let mut acc = [_mm512_setzero_ps(); C];
    for b in 0..=nb {
        if b < nb {
            if ahead != 0 {
                let w = words.as_ptr().wrapping_add(b * F::WORDS).cast::<u8>();
                for line in 0..F::WORDS {
                    // Prefetches never fault; the pointers use wrapping arithmetic.
                    _mm_prefetch::<_MM_HINT_T0>(w.wrapping_add(ahead + line * 64).cast());
                }
                let s = scales.wrapping_add(b * F::SCALE_BYTES + ahead);
                _mm_prefetch::<_MM_HINT_T0>(s.cast());
            }
            // Block b's 16 slots: column c's high bytes at slot (b · C + c), low bytes 32
            // bytes on. Rows past C read the slots that follow (inside `bytes`, contract);
            // their sums land in rows of `sums` that are never read.
            let hi = bytes[b * C * PAIRS..].as_ptr().cast::<u8>();
            // SAFETY: block b's eight rows lie inside `weights`, its slots inside `bytes`
            // (contract); the tiles are configured.
            unsafe { products(b % 2 == 1, weights.add(b * 8 * 64), hi, hi.add(BLOCK)) };
        }
        if let Some(p) = b.checked_sub(1) {
            // SAFETY: block p < nb: its scales lie inside `scales`, its columns' scales and
            // sums inside `scale` and `sum` (contract); AVX-512 and FMA present (this
            // function's features).
            unsafe { scale_steps::<F, C>(&mut acc, &sums[p % 2], p, scales, scale, sum) };
        }
        if b < nb {
            // SAFETY: block b's products were issued above.
            unsafe { store(b % 2 == 1, &mut sums[b % 2]) };
        }
    }
    for (c, a) in acc.iter().enumerate() {
        // SAFETY: out + c * stride + r is inside the caller's output for every lane in mask.
        unsafe { _mm512_mask_storeu_ps(out.add(c * stride), mask, *a) };
    }
}

/// Block `b`'s scale steps for the `C` columns, from its integer sums: the `vpdpwssd`
/// kernel's, operation for operation.
///
/// # Safety
/// AVX-512 F and FMA present; block `b`'s scales lie at `scales`; `scale` and `sum` hold
/// `(b + 1) · C` values.
#[inline]
#[target_feature(enable = "avx512f,fma,f16c")]
unsafe fn scale_steps<F: Format, const C: usize>(
    acc: &mut [__m512; C],
    sums: &Sums,
    b: usize,
    scales: *const u8,
    scale: &[f32],
    sum: &[f32],
) {
    // SAFETY: block b's scales lie inside `scales` (b < nb, contract).
    let (d, m) = unsafe { F::scales(scales.add(b * F::SCALE_BYTES)) };
    let step = |c: usize, a: &mut __m512| {
        // SAFETY: rows c and 16 + c of `sums` are 64-byte aligned vectors.
        let (h, l) = unsafe {
            (
                _mm512_load_si512(sums.0[c].as_ptr().cast()),
                _mm512_load_si512(sums.0[ROWS + c].as_ptr().cast()),
            )
        };
        let isum = _mm512_add_epi32(_mm512_slli_epi32::<8>(h), l);
        // SAFETY: b * C + c < nb * C, the length of the tile's scales and sums.
        let (s, t) = unsafe {
            (
                *scale.get_unchecked(b * C + c),
                *sum.get_unchecked(b * C + c),
            )
        };
        // The `vpdpwssd` kernel's scale step, operation for operation.
        let ds = _mm512_mul_ps(d, _mm512_set1_ps(s));
        *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), ds, *a);
        if F::MIN {
            *a = _mm512_fmadd_ps(m, _mm512_set1_ps(t), *a);
        }
    };
    // Unrolled by hand (the column is a constant in each arm), so that the accumulators
    // stay in registers instead of memory, where their stores would queue behind the
    // tile stores.
    macro_rules! columns {
            ($($c:literal)*) => {$(
                if $c < C {
                    step($c, &mut acc[$c]);
                }
            )*};
        }
    columns!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15);
}
