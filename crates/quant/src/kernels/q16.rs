//! Weight products with 16-bit activations: the integer path of Q4_1 and Q8_0 weights on
//! AVX-512 VNNI and on AVX2.
//!
//! Why: a quantized weight times an f32 activation costs one f32 fused multiply-add per
//! value. With the activations rounded to 16-bit integers per 32-value block, the products
//! of a block are exact 32-bit integer sums (`vpdpwssd`, two products per lane and
//! instruction, sixteen weight rows per vector), and only one scale step per block stays in
//! floating point. Measured against the transformers fixtures (SmolLM2 logits, 25 prompts),
//! this moves the mean |Δ log-prob| from 0.00123 to 0.00134, where 8-bit activations (what
//! llama.cpp does) give 0.10.
//!
//! What a product is, per output row `r` and activation column `c` (every kernel computes
//! exactly this, so results do not depend on the kernel, the batch, the tile or the thread):
//!
//! - each 32-value block `b` of the column is quantized once: `amax` = the largest |a|,
//!   `s = amax / 32767`, `A_i = round_ties_even(a_i · (32767 / amax))` clamped to ±32767,
//!   `S = s · ΣA_i` (a block of zeros has `s = S = 0`; a block holding a non-finite value
//!   has `A = 0` and `s = S = NaN`, so the output is NaN; a block too small for the
//!   reciprocal to be finite counts as zeros);
//! - `I_b = Σ q_i · A_i` exactly, with `q` the block's integer weights (Q4_1: 0..15,
//!   Q8_0: −128..127, Q5_0: its 5-bit value − 16, −16..15; Q4_K: the 32-value sub-block's
//!   nibbles, 0..15; Q6_K: its 6-bit value − 32, −32..31);
//! - `acc = 0`, then for each block in order: `acc = fma(I_b as f32, d_b · s_b, acc)`, and
//!   for Q4_1 and Q4_K `acc = fma(m_b, S_b, acc)` (`d`, `m`: the block's f16 scale and
//!   minimum; for Q4_K, the sub-block's `d · sc` and `-(dmin · m)` in f32, both exact);
//!   Q6_K's blocks have a scale `d · sc` per 16-value half (f32, exact), so each block
//!   takes two steps, `acc = fma(I_lo, d_lo · s_b, acc)` then the same for the second half,
//!   with `I_lo`, `I_hi` the halves' exact integer sums.
//!
//! On CPUs with AMX (Intel's tile unit, INT8), batches of [`TILES_MIN_COLUMNS`] columns or
//! more take a second kernel (`amx_q16`) that computes the same `I_b` with tile
//! instructions: each 16-bit `A_i` is split into a signed high byte and an unsigned low byte
//! (`A_i = 256 · hi + lo`), the two byte products are exact 32-bit sums, and
//! `I_b = 256 · Σ q·hi + Σ q·lo` is the same integer. The floating-point steps are the ones
//! above, lane by lane, so the tile kernel's outputs are bit-identical to the `vpdpwssd`
//! kernels', and a token's outputs still do not depend on the batch.
//!
//! On AVX2 (`avx2_q16`), `vpmaddwd` computes the same exact `I_b`, eight rows per vector,
//! on the same packed groups, and the floating-point steps are again the ones above lane by
//! lane: an AVX2 CPU gives the bits an AVX-512 VNNI CPU gives for Q4_1 and Q8_0. Q5_0, Q4_K
//! and Q6_K take this path on AVX2 only (packed as Q8_0, as Q4_1 with f32 scales, and as
//! Q8_0 with two f32 scales per block); on AVX-512 they stay on the f32 kernels, so for
//! those weights the two levels' bits differ.
//!
//! This module never touches other formats or levels: it applies only where [`applies`]
//! says so, and every other product stays on the f32 kernels.

// Off x86-64 no level applies, so the 16-bit kernels are compiled out and the plumbing that
// feeds them (layouts, packing, output pointers) is unused there.
#![cfg_attr(
    not(target_arch = "x86_64"),
    allow(dead_code, unused_variables, unused_mut)
)]

use ferrite_gguf::GgmlType;

use crate::{QuantError, SimdLevel};

/// Values per quantized activation block (the weight formats' block size).
pub(crate) const BLOCK: usize = 32;

/// 32-bit words (pairs of 16-bit activations) per block.
pub(crate) const PAIRS: usize = BLOCK / 2;

/// Whether products with weights of type `ty` take the 16-bit activation path at `level`.
///
/// Q5_0, Q4_K and Q6_K take it on AVX2 only: there their f32 kernels were compute-bound
/// (Gemma 3's layers), while the AVX-512 kernels keep the products they had.
pub fn applies(level: SimdLevel, ty: GgmlType) -> bool {
    let formats = match level {
        SimdLevel::Avx2 => matches!(
            ty,
            GgmlType::Q4_1 | GgmlType::Q4_K | GgmlType::Q5_0 | GgmlType::Q6_K | GgmlType::Q8_0
        ),
        _ => matches!(ty, GgmlType::Q4_1 | GgmlType::Q8_0),
    };
    formats
        && level.is_available()
        && match level {
            SimdLevel::Avx512 => has_vnni(),
            SimdLevel::Avx2 => true,
            SimdLevel::Scalar => false,
            #[cfg(target_arch = "aarch64")]
            SimdLevel::Neon => false,
        }
}

#[cfg(target_arch = "x86_64")]
fn has_vnni() -> bool {
    std::arch::is_x86_feature_detected!("avx512vnni")
}

#[cfg(not(target_arch = "x86_64"))]
fn has_vnni() -> bool {
    false
}

/// Fewest columns quantized for the AMX tile kernel, where the CPU has one (below, the
/// `vpdpwssd` kernels multiply). Measured on a 2-core Xeon with AMX (SmolLM2 decode in
/// process, tile kernel against `vpdpwssd`, receipt `cpu-amx-2026-11-30.md`): 16 columns
/// +15 % to +27 %, 8 columns within noise (+4 %, −5 %), 4 columns −17 % (with an earlier
/// version of the kernel).
pub const TILES_MIN_COLUMNS: usize = 8;

/// How a [`Q16Acts`] lays out each block's sixteen words, which picks the kernel that
/// multiplies it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout {
    /// Pairs of 16-bit values in the type's `pair_order`, tiles of 8 columns: the
    /// `vpdpwssd` kernels.
    Pairs,
    /// The 32 high bytes (signed), then the 32 low bytes (unsigned) of the 16-bit values in
    /// natural order, tiles of 16 columns: the AMX kernel, whose tile rows are columns.
    Bytes,
}

impl Layout {
    /// The layout for a product of `n` columns on this CPU.
    fn for_columns(n: usize) -> Layout {
        if n >= TILES_MIN_COLUMNS && amx_available() {
            Layout::Bytes
        } else {
            Layout::Pairs
        }
    }

    /// Columns per tile.
    pub(crate) const fn tile(self) -> usize {
        match self {
            Layout::Pairs => 8,
            Layout::Bytes => 16,
        }
    }
}

/// Whether this CPU and OS let the process use AMX INT8 tiles (probed once), unless the
/// diagnostic `FERRITE_AMX=off` says not to.
pub fn amx_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        super::amx_q16::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `n` activation columns of `k` values, quantized for weights of one type.
///
/// Stored in tiles of columns (`layout.tile()`; the last may be narrower), so that a kernel
/// walks one tile with one pointer: in a tile of `C` columns, block `b` of its column `c` has
/// its sixteen words at `(b · C + c) · 16` of the tile's `pairs` (laid out as `layout` says)
/// and its `s` and `S` at `b · C + c` of the tile's `scale` and `sum`. One tile of slack
/// words follows the last block, so that a kernel may read whole 16-column tiles.
#[derive(Debug, Clone)]
pub struct Q16Acts {
    ty: GgmlType,
    k: usize,
    n: usize,
    layout: Layout,
    pairs: Vec<u32>,
    scale: Vec<f32>,
    sum: Vec<f32>,
}

impl Q16Acts {
    /// Values per column.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Number of columns.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Blocks per column.
    fn nb(&self) -> usize {
        self.k / BLOCK
    }

    /// How the blocks are laid out.
    pub(crate) fn layout(&self) -> Layout {
        self.layout
    }

    /// Number of column tiles.
    pub(crate) fn tiles(&self) -> usize {
        self.n.div_ceil(self.layout.tile())
    }

    /// Tile `t`: its width, words (followed by at least one tile of slack words), scales and
    /// sums.
    pub(crate) fn tile(&self, t: usize) -> (usize, &[u32], &[f32], &[f32]) {
        let nb = self.nb();
        let c0 = t * self.layout.tile();
        let width = self.layout.tile().min(self.n - c0);
        let (b0, b1) = (c0 * nb, (c0 + width) * nb);
        (
            width,
            &self.pairs[b0 * PAIRS..],
            &self.scale[b0..b1],
            &self.sum[b0..b1],
        )
    }
}

/// For weights of type `ty`: the natural index (0..32) of the activation that goes in each
/// 16-bit half of each pair, `order[2p + half]`. It mirrors how the kernel unpacks a
/// block's weight bytes (see `avx512_q16`), so pair `p` of weights meets pair `p` of
/// activations.
pub(crate) fn pair_order(ty: GgmlType) -> [usize; BLOCK] {
    std::array::from_fn(|i| {
        let (p, half) = (i / 2, i % 2);
        if matches!(ty, GgmlType::Q4_1 | GgmlType::Q4_K) {
            // Dword w of the nibbles (Q4_K: packed as Q4_1) yields low nibbles (4w, 4w+2),
            // (4w+1, 4w+3), then high nibbles (4w+16, 4w+18), (4w+17, 4w+19).
            let (w, t) = (p / 4, p % 4);
            4 * w + (t & 1) + 16 * (t >> 1) + 2 * half
        } else {
            // Dword w of the bytes yields (4w, 4w+2), (4w+1, 4w+3).
            let (w, t) = (p / 2, p % 2);
            4 * w + t + 2 * half
        }
    })
}

/// Quantizes `n` columns of `k` values (`x.len() == n * k`, `k` a multiple of 32) for
/// weights of type `ty`, as the module docs define.
pub fn quantize(ty: GgmlType, x: &[f32], k: usize, n: usize) -> Result<Q16Acts, QuantError> {
    let mut acts = Q16Acts::empty();
    acts.quantize(ty, x, k, n)?;
    Ok(acts)
}

impl Q16Acts {
    /// No columns: a buffer for [`Q16Acts::quantize`] to fill.
    pub fn empty() -> Q16Acts {
        Q16Acts {
            ty: GgmlType::Q8_0,
            k: 0,
            n: 0,
            layout: Layout::Pairs,
            pairs: Vec::new(),
            scale: Vec::new(),
            sum: Vec::new(),
        }
    }

    /// [`quantize`] into this buffer, reusing its memory: for a caller that quantizes on
    /// every call, where allocating (and zeroing) fresh buffers measured a few percent of a
    /// batched decode step.
    pub fn quantize(
        &mut self,
        ty: GgmlType,
        x: &[f32],
        k: usize,
        n: usize,
    ) -> Result<(), QuantError> {
        self.fills(ty, x, k, n, 1)?.for_each(Q16Fill::run);
        Ok(())
    }

    /// Sizes this buffer for [`quantize`]`(ty, x, k, n)` and splits the work into at most
    /// `parts` fills of about equal numbers of blocks, each writing its own slots: running
    /// every fill, on any threads and in any order, leaves the bits [`Q16Acts::quantize`]
    /// gives. For a batch, whose quantization is otherwise serial work the other threads
    /// wait on.
    pub fn fills<'a>(
        &'a mut self,
        ty: GgmlType,
        x: &'a [f32],
        k: usize,
        n: usize,
        parts: usize,
    ) -> Result<Q16Fills<'a>, QuantError> {
        self.fills_as(ty, x, k, n, parts, Layout::for_columns(n))
    }

    /// [`Q16Acts::fills`] into the given layout.
    pub(crate) fn fills_as<'a>(
        &'a mut self,
        ty: GgmlType,
        x: &'a [f32],
        k: usize,
        n: usize,
        parts: usize,
        layout: Layout,
    ) -> Result<Q16Fills<'a>, QuantError> {
        if !matches!(
            ty,
            GgmlType::Q4_1 | GgmlType::Q4_K | GgmlType::Q5_0 | GgmlType::Q6_K | GgmlType::Q8_0
        ) {
            return Err(QuantError::Unsupported {
                ty,
                op: "16-bit activation products",
            });
        }
        if !k.is_multiple_of(BLOCK) || Some(x.len()) != n.checked_mul(k) {
            return Err(QuantError::PartialBlock {
                ty,
                n: x.len(),
                block: BLOCK as u64,
            });
        }
        let blocks = x.len() / BLOCK;
        (self.ty, self.k, self.n, self.layout) = (ty, k, n, layout);
        // Every element is written by the fills, so only growth needs initializing; the
        // slack tile is never written.
        let slack = Layout::Bytes.tile() * PAIRS;
        self.pairs.resize(blocks * PAIRS + slack, 0);
        self.scale.resize(blocks, 0.0);
        self.sum.resize(blocks, 0.0);
        Ok(Q16Fills {
            rest: Q16Fill {
                ty,
                layout,
                x,
                nb: k / BLOCK,
                n,
                first: 0,
                pairs: &mut self.pairs[..blocks * PAIRS],
                scale: &mut self.scale,
                sum: &mut self.sum,
            },
            per: blocks.div_ceil(parts.max(1)).max(1),
        })
    }
}

/// The fills of one [`Q16Acts::fills`] call, in slot order.
#[derive(Debug)]
pub struct Q16Fills<'a> {
    /// The slots not handed out yet.
    rest: Q16Fill<'a>,
    /// Blocks per fill (the last may hold fewer).
    per: usize,
}

impl<'a> Iterator for Q16Fills<'a> {
    type Item = Q16Fill<'a>;

    fn next(&mut self) -> Option<Q16Fill<'a>> {
        (!self.rest.scale.is_empty()).then(|| self.rest.take_front(self.per))
    }
}

/// Consecutive slots of a [`Q16Acts`] and the input blocks that go in them.
#[derive(Debug)]
pub struct Q16Fill<'a> {
    ty: GgmlType,
    layout: Layout,
    x: &'a [f32],
    nb: usize,
    n: usize,
    /// Slot of `scale[0]`.
    first: usize,
    pairs: &'a mut [u32],
    scale: &'a mut [f32],
    sum: &'a mut [f32],
}

impl<'a> Q16Fill<'a> {
    /// Splits off this fill's first `len` slots (all of them, if fewer) as a fill of their
    /// own.
    fn take_front(&mut self, len: usize) -> Q16Fill<'a> {
        let len = len.min(self.scale.len());
        let (scale, rest) = std::mem::take(&mut self.scale).split_at_mut(len);
        self.scale = rest;
        let (sum, rest) = std::mem::take(&mut self.sum).split_at_mut(len);
        self.sum = rest;
        let (pairs, rest) = std::mem::take(&mut self.pairs).split_at_mut(len * PAIRS);
        self.pairs = rest;
        let first = self.first;
        self.first += len;
        Q16Fill {
            ty: self.ty,
            layout: self.layout,
            x: self.x,
            nb: self.nb,
            n: self.n,
            first,
            pairs,
            scale,
            sum,
        }
    }

    /// Quantizes this fill's blocks into its slots.
    pub fn run(self) {
        let order = match self.layout {
            Layout::Pairs => pair_order(self.ty),
            Layout::Bytes => std::array::from_fn(|i| i),
        };
        #[cfg(target_arch = "x86_64")]
        let simd = applies(SimdLevel::Avx512, self.ty);
        #[cfg(target_arch = "x86_64")]
        let avx2 = self.layout == Layout::Pairs && applies(SimdLevel::Avx2, self.ty);
        #[cfg(target_arch = "x86_64")]
        let perm: [u16; BLOCK] = order.map(|o| o as u16);
        let tile = self.layout.tile();
        let tile_slots = tile * self.nb;
        for (i, (words, (scale, sum))) in self
            .pairs
            .chunks_exact_mut(PAIRS)
            .zip(self.scale.iter_mut().zip(self.sum.iter_mut()))
            .enumerate()
        {
            // Which block goes in this slot (the layout of `Q16Acts`; every tile but the
            // last is `tile` wide).
            let slot = self.first + i;
            let c0 = slot / tile_slots * tile;
            let width = tile.min(self.n - c0);
            let within = slot - c0 * self.nb;
            let (c, b) = (c0 + within % width, within / width);
            let at = (c * self.nb + b) * BLOCK;
            let a: &[f32; BLOCK] = self.x[at..at + BLOCK].try_into().expect("32 values");
            let words: &mut [u32; PAIRS] = words.try_into().expect("16 words");
            #[cfg(target_arch = "x86_64")]
            if simd {
                // SAFETY: `applies` proved AVX-512 F/BW/VL (and VNNI).
                unsafe {
                    (*scale, *sum) = super::avx512_q16::quantize_block(a, &perm, words);
                    if self.layout == Layout::Bytes {
                        super::avx512_q16::split_bytes(words);
                    }
                }
                continue;
            }
            #[cfg(target_arch = "x86_64")]
            if avx2 {
                // SAFETY: `applies` proved AVX2/FMA/F16C.
                (*scale, *sum) = unsafe { super::avx2_q16::quantize_block(a, &perm, words) };
                continue;
            }
            let (q, s, t) = quantize_block(a);
            let q: [i16; BLOCK] = order.map(|o| q[o]);
            match self.layout {
                Layout::Pairs => *words = pair_words(&q),

                Layout::Bytes => {
                    let mut bytes = [0u8; 2 * BLOCK];
                    for (i, v) in q.iter().enumerate() {
                        let [lo, hi] = v.to_le_bytes();
                        (bytes[i], bytes[BLOCK + i]) = (hi, lo);
                    }
                    for (word, b) in words.iter_mut().zip(bytes.chunks_exact(4)) {
                        *word = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                    }
                }
            }
            (*scale, *sum) = (s, t);
        }
    }
}

/// A block's 16-bit values, already in pair order, as its sixteen words.
fn pair_words(q: &[i16; BLOCK]) -> [u32; PAIRS] {
    std::array::from_fn(|p| u32::from(q[2 * p] as u16) | (u32::from(q[2 * p + 1] as u16) << 16))
}

impl Q16Acts {
    /// Index of the slot of block `b` of column `c` (the layout in the type's docs).
    fn slot(&self, c: usize, b: usize) -> usize {
        let tile = self.layout.tile();
        let c0 = c / tile * tile;
        let width = tile.min(self.n - c0);
        c0 * self.nb() + b * width + (c - c0)
    }

    /// These activations in the pairs layout: themselves, or, in the byte layout, the same
    /// integers, `s` and `S` moved. For a kernel without the byte layout given activations
    /// quantized for the AMX kernel (an AMX CPU asked for another level).
    pub(crate) fn in_pairs(&self) -> std::borrow::Cow<'_, Q16Acts> {
        match self.layout {
            Layout::Pairs => std::borrow::Cow::Borrowed(self),
            Layout::Bytes => std::borrow::Cow::Owned(self.bytes_to_pairs()),
        }
    }

    /// [`Q16Acts::in_pairs`] of activations in the byte layout.
    fn bytes_to_pairs(&self) -> Q16Acts {
        let order = pair_order(self.ty);
        let blocks = self.scale.len();
        let mut out = Q16Acts {
            layout: Layout::Pairs,
            pairs: vec![0; blocks * PAIRS + Layout::Bytes.tile() * PAIRS],
            ..self.clone()
        };
        for c in 0..self.n {
            for b in 0..self.nb() {
                let (from, to) = (self.slot(c, b), out.slot(c, b));
                let words = &self.pairs[from * PAIRS..(from + 1) * PAIRS];
                let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
                // The 16-bit value is 256 · hi + lo (hi signed, lo unsigned), exactly.
                let q: [i16; BLOCK] = std::array::from_fn(|i| {
                    (256 * i32::from(bytes[i] as i8) + i32::from(bytes[BLOCK + i])) as i16
                });
                let words = pair_words(&order.map(|o| q[o]));
                out.pairs[to * PAIRS..(to + 1) * PAIRS].copy_from_slice(&words);
                out.scale[to] = self.scale[from];
                out.sum[to] = self.sum[from];
            }
        }
        out
    }
}

/// One block's integers, `s` and `S`.
pub(crate) fn quantize_block(a: &[f32; BLOCK]) -> ([i16; BLOCK], f32, f32) {
    if a.iter().any(|v| !v.is_finite()) {
        return ([0; BLOCK], f32::NAN, f32::NAN);
    }
    let amax = a.iter().fold(0f32, |m, v| m.max(v.abs()));
    let inv = 32767.0 / amax;
    if amax == 0.0 || !inv.is_finite() {
        return ([0; BLOCK], 0.0, 0.0);
    }
    let q: [i16; BLOCK] =
        std::array::from_fn(|i| (a[i] * inv).round_ties_even().clamp(-32767.0, 32767.0) as i16);
    let s = amax / 32767.0;
    let total: i32 = q.iter().map(|&v| i32::from(v)).sum();
    (q, s, s * total as f32)
}

/// `out[c * stride + r] = product(row r of w, column c of acts)` for the `nr` rows of `w`
/// (weights of the type `acts` was quantized for, `acts.k()` values per row) and every
/// column. Requires [`applies`]`(level, ty)`.
pub fn matmul(
    level: SimdLevel,
    w: &[u8],
    nr: usize,
    acts: &Q16Acts,
    out: &mut [f32],
    stride: usize,
) -> Result<(), QuantError> {
    let fits = acts
        .n
        .checked_sub(1)
        .map(|c| c * stride + nr)
        .is_none_or(|f| out.len() >= f);
    if !fits {
        return Err(QuantError::BadTile {
            rows: nr,
            cols: acts.n,
            k: acts.k,
        });
    }
    // SAFETY: every out[c * stride + r] with c < n, r < nr lies in the borrowed slice
    // (checked above), which no one else can access while it is borrowed.
    unsafe { matmul_to(level, w, nr, acts, out.as_mut_ptr(), stride) }
}

/// [`matmul`] writing through a pointer: for threads that share one output matrix, each
/// writing its own rows of every column.
///
/// # Safety
/// `out.add(c * stride + r)` is valid for writes for every column `c < acts.n()` and row
/// `r < nr`, and nothing else accesses those elements during the call.
pub unsafe fn matmul_to(
    level: SimdLevel,
    w: &[u8],
    nr: usize,
    acts: &Q16Acts,
    out: *mut f32,
    stride: usize,
) -> Result<(), QuantError> {
    let ty = acts.ty;
    if !applies(level, ty) {
        return Err(QuantError::Unsupported {
            ty,
            op: "16-bit activation products at this level",
        });
    }
    let rb = ty.row_bytes(acts.k as u64).unwrap_or(0) as usize;
    if Some(w.len()) != nr.checked_mul(rb) || stride < nr {
        return Err(QuantError::BadTile {
            rows: nr,
            cols: acts.n,
            k: acts.k,
        });
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `applies` proved AVX-512 F/BW/VL and VNNI, or AVX2/FMA/F16C, for the level
    // that runs; w holds nr rows of rb bytes (checked above) and every output is writable
    // (caller's contract); the AVX2 kernel is given the pairs layout.
    unsafe {
        if level == SimdLevel::Avx512 {
            super::avx512_q16::matmul(ty, w, nr, rb, acts, out, stride);
        } else {
            let pairs = acts.in_pairs();
            super::avx2_q16::matmul(ty, w, nr, rb, &pairs, out, stride);
        }
    }
    Ok(())
}

/// Rows per packed group (one per vector lane of the kernels).
pub const GROUP_ROWS: usize = 16;

/// Bytes one row of `rb` bytes of `ty` takes once packed: its own, except Q5_0, packed as
/// Q8_0 (34 bytes per 22-byte block), and Q4_K, packed as eight blocks of 16 bytes of
/// nibbles and an f32 scale and minimum (192 bytes per 144-byte super-block), and Q6_K,
/// packed as eight blocks of 32 signed bytes and two f32 scales (320 bytes per 210).
pub(crate) fn packed_row_bytes(ty: GgmlType, rb: usize) -> usize {
    match ty {
        GgmlType::Q5_0 => rb / 22 * 34,
        GgmlType::Q4_K => rb / 144 * 192,
        GgmlType::Q6_K => rb / 210 * 320,
        _ => rb,
    }
}

/// Bytes of rows [`PackedRows::new`] packs between two reports of its progress.
pub const PACK_SPAN: usize = 1 << 20;

/// One cache line of packed weights; the alignment lets the kernels load whole vectors.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// The rows of a Q4_1 or Q8_0 matrix (or, on AVX2, Q5_0, Q4_K or Q6_K) rearranged once
/// into the layout the kernels multiply (groups of [`GROUP_ROWS`] rows, each row's weights
/// in one vector lane), so that a product reads them straight instead of rearranging every
/// group on every call. It holds the same bytes as the rows, moved (the AVX2-only formats:
/// widened, see `packed_row_bytes`): a caller that also keeps the originals holds the
/// matrix twice (`new` reports each packed span so that it need not). Products with it are
/// bit-identical to [`matmul`] on the rows it was packed from.
pub struct PackedRows {
    ty: GgmlType,
    rows: usize,
    k: usize,
    group_bytes: usize,
    lines: Vec<Line>,
}

impl std::fmt::Debug for PackedRows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackedRows")
            .field("ty", &self.ty)
            .field("rows", &self.rows)
            .field("k", &self.k)
            .finish_non_exhaustive()
    }
}

impl PackedRows {
    /// Packs the `rows` rows of `k` values of `w` (weights of type `ty`). Requires
    /// [`applies`]`(level, ty)`. The rows are packed a span of about [`PACK_SPAN`] bytes at
    /// a time, and `packed` is called with each span of `w` once it has been copied, so that
    /// a caller can let go of the originals as it goes (the two copies then never coexist
    /// whole).
    pub fn new(
        level: SimdLevel,
        ty: GgmlType,
        w: &[u8],
        rows: usize,
        k: usize,
        mut packed: impl FnMut(&[u8]),
    ) -> Result<PackedRows, QuantError> {
        if !applies(level, ty) {
            return Err(QuantError::Unsupported {
                ty,
                op: "16-bit activation products at this level",
            });
        }
        let rb = ty.row_bytes(k as u64).unwrap_or(0) as usize;
        if !k.is_multiple_of(BLOCK) || Some(w.len()) != rows.checked_mul(rb) {
            return Err(QuantError::BadTile { rows, cols: 0, k });
        }
        let group_bytes = (GROUP_ROWS * packed_row_bytes(ty, rb)).next_multiple_of(64);
        let groups = rows.div_ceil(GROUP_ROWS);
        let mut lines = vec![Line([0; 64]); groups * group_bytes / 64];
        let step = (PACK_SPAN / (GROUP_ROWS * rb).max(1)).max(1);
        for g0 in (0..groups).step_by(step) {
            let (r0, r1) = (g0 * GROUP_ROWS, ((g0 + step) * GROUP_ROWS).min(rows));
            let span = &w[r0 * rb..r1 * rb];
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `applies` proved AVX-512 F/BW/VL or AVX2 for the level that packs; span
            // holds r1 - r0 rows of rb bytes of whole blocks (checked above); group g0 starts
            // inside `lines`, which is 64-byte aligned with room for the span's groups of
            // group_bytes, a multiple of 64 and at least 16 rows' bytes.
            unsafe {
                let dst = lines.as_mut_ptr().add(g0 * group_bytes / 64).cast();
                if level == SimdLevel::Avx512 {
                    super::avx512_q16::pack(ty, span, r1 - r0, rb, dst, group_bytes);
                } else {
                    super::avx2_q16::pack(ty, span, r1 - r0, rb, dst, group_bytes);
                }
            }
            packed(span);
        }
        Ok(PackedRows {
            ty,
            rows,
            k,
            group_bytes,
            lines,
        })
    }

    /// The weights' type.
    pub fn ty(&self) -> GgmlType {
        self.ty
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Values per row.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Number of groups of [`GROUP_ROWS`] rows (the last may hold fewer).
    pub fn groups(&self) -> usize {
        self.rows.div_ceil(GROUP_ROWS)
    }
}

/// [`matmul_to`] for the rows of the packed `groups` of `w`: `out[c * stride + r]` for
/// every column `c` and every row `r` of those groups (rows `16 · groups.start` up to
/// `16 · groups.end` or the last row), with `out` at row 0. For threads that share one output
/// matrix, each writing the rows of its own groups.
///
/// # Safety
/// `out.add(c * stride + r)` is valid for writes for every column `c < acts.n()` and every
/// row `r` of the groups, and nothing else accesses those elements during the call.
pub unsafe fn matmul_packed_to(
    level: SimdLevel,
    w: &PackedRows,
    groups: std::ops::Range<usize>,
    acts: &Q16Acts,
    out: *mut f32,
    stride: usize,
) -> Result<(), QuantError> {
    if !applies(level, w.ty) || w.ty != acts.ty {
        return Err(QuantError::Unsupported {
            ty: w.ty,
            op: "16-bit activation products at this level",
        });
    }
    if w.k != acts.k || groups.end > w.groups() || stride < w.rows {
        return Err(QuantError::BadTile {
            rows: w.rows,
            cols: acts.n,
            k: acts.k,
        });
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `applies` proved AVX-512 F/BW/VL and VNNI, or AVX2/FMA/F16C, for the level
    // that runs; `w` was packed (in the one layout both levels read) for its type and
    // width, which match the activations' (checked above), and holds the groups; every
    // output is writable (caller's contract); the AVX2 kernel is given the pairs layout.
    unsafe {
        let lines = w.lines.as_ptr().cast();
        let (ty, gb, rows) = (w.ty, w.group_bytes, w.rows);
        if level == SimdLevel::Avx512 {
            super::avx512_q16::matmul_packed(ty, lines, gb, rows, groups, acts, out, stride);
        } else {
            let pairs = acts.in_pairs();
            super::avx2_q16::matmul_packed(ty, lines, gb, rows, groups, &pairs, out, stride);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
