//! Quantized weight x f32 activation matrix products.
//!
//! The weight types of [`ferrite_quant::kernels::q16::applies`] (Q4_1 and Q8_0 on AVX-512
//! VNNI and AVX2; Q5_0, Q4_K and Q6_K on AVX2) take one path for every token count: the activations are rounded to 16-bit integers per
//! 32-value block once per call (a batch's blocks split over the threads), and each thread
//! multiplies its rows with exact integer block sums, writing them straight into the
//! output. Every other format and level takes the f32 paths below.
//!
//! Output rows are split into a few ranges per thread, each computed by the thread that
//! claims it first (so a descheduled thread cannot hold up a call by a fixed share). Decode
//! (one token) uses the fused kernel ([`ferrite_quant::kernels::matvec`]): weights are
//! dequantized in registers and fed to the FMAs, streaming each weight byte once. A decode batch of up to
//! `MULTI_MAX_TOKENS` tokens (one per session) uses the fused multi-column kernel where the
//! level has one ([`ferrite_quant::kernels::multi_matvec`]): each weight block is decoded in
//! registers once per group of up to eight tokens. Prefill dequantizes a tile of weight rows
//! (bit-exact, SIMD) into the thread's reusable f32 scratch and multiplies that tile
//! against all tokens with the register-blocked f32 kernel
//! ([`ferrite_quant::kernels::gemm_f32`]), so weights are decoded once per call whatever
//! the token count and the work is compute-bound.
//!
//! Determinism: every output is computed by exactly one thread in the canonical order of
//! the SIMD level, which does not depend on tile position or shape. Results are therefore
//! identical for any thread count, and a token's outputs do not depend on the other tokens
//! in the batch.

use std::sync::{Mutex, PoisonError};

use ferrite_gguf::GgmlType;
use ferrite_quant::kernels::q16::{self, GROUP_ROWS, PackedRows};
use ferrite_quant::kernels::{
    MAX_TILE, dequant_fn, gemm_f32, has_fused_multi_matvec, matvec, multi_matvec,
};
use ferrite_quant::{SimdLevel, simd_level};

use crate::pool::Claims;
use crate::{CpuError, ThreadPool};

/// A weight matrix in GGUF layout: `rows` rows of `cols` values each (GGUF dims =
/// `[cols, rows]`), row-major blocks.
#[derive(Debug, Clone, Copy)]
pub struct Matrix<'a> {
    /// Element type of the stored rows.
    pub ty: GgmlType,
    /// Number of rows (output features).
    pub rows: usize,
    /// Values per row (input features).
    pub cols: usize,
    /// The raw rows, `rows * ty.row_bytes(cols)` bytes.
    pub data: &'a [u8],
    /// The same rows packed for the 16-bit products ([`pack`]), when the caller keeps them:
    /// the products then read these instead of packing `data` on every call.
    pub packed: Option<&'a PackedRows>,
}

impl Matrix<'_> {
    /// Bytes of one row, after checking the whole matrix is consistent.
    fn row_bytes(&self) -> Result<usize, CpuError> {
        let rb = self.ty.row_bytes(self.cols as u64).ok_or(CpuError::Shape {
            what: "cols is not a whole number of blocks",
        })?;
        let total = rb.checked_mul(self.rows as u64).ok_or(CpuError::Shape {
            what: "matrix size overflows",
        })?;
        if total != self.data.len() as u64 {
            return Err(CpuError::Shape {
                what: "data length does not match rows x cols",
            });
        }
        if self
            .packed
            .is_some_and(|p| (p.ty(), p.rows(), p.k()) != (self.ty, self.rows, self.cols))
        {
            return Err(CpuError::Shape {
                what: "packed rows are not of this matrix's type and shape",
            });
        }
        usize::try_from(rb).map_err(|_| CpuError::Shape {
            what: "row too large",
        })
    }
}

/// `w`'s rows packed for the 16-bit products, where [`matmul`] takes them for its type at
/// this machine's SIMD level; `None` where it does not (the products then read `data`).
/// `packed` is called with each span of `data` once it has been copied
/// ([`PackedRows::new`]).
pub fn pack(w: Matrix<'_>, packed: impl FnMut(&[u8])) -> Result<Option<PackedRows>, CpuError> {
    let level = simd_level();
    if !q16::applies(level, w.ty) {
        return Ok(None);
    }
    w.row_bytes()?;
    Ok(Some(PackedRows::new(
        level, w.ty, w.data, w.rows, w.cols, packed,
    )?))
}

/// `y[t*rows + r] = sum_k W[r,k] * x[t*cols + k]` for `t in 0..n_tokens`, with the kernels
/// of [`simd_level`]. Weights are dequantized exactly; activations stay f32, except in the
/// 16-bit products of the types `q16::applies` names (module docs).
pub fn matmul(
    pool: &ThreadPool,
    w: Matrix<'_>,
    x: &[f32],
    n_tokens: usize,
    y: &mut [f32],
) -> Result<(), CpuError> {
    matmul_with(pool, simd_level(), w, x, n_tokens, y)
}

/// [`matmul`] with the kernels of an explicit SIMD level.
pub fn matmul_with(
    pool: &ThreadPool,
    level: SimdLevel,
    w: Matrix<'_>,
    x: &[f32],
    n_tokens: usize,
    y: &mut [f32],
) -> Result<(), CpuError> {
    let rb = checked_row_bytes(&w, x, n_tokens, y)?;
    let deq = dequant_fn(level, w.ty)?;
    if n_tokens == 0 || w.rows == 0 {
        return Ok(());
    }
    if q16::applies(level, w.ty) {
        return matmul_q16(pool, level, &[(w, rb)], x, n_tokens, &mut [y]);
    }
    let multi = n_tokens <= MULTI_MAX_TOKENS && has_fused_multi_matvec(level, w.ty, w.cols);
    let tile_rows = tile_rows(w.cols, n_tokens);
    let out = OutPtr(y.as_mut_ptr());
    let (rows, cols) = (w.rows, w.cols);
    let failed = std::sync::atomic::AtomicBool::new(false);
    let align = match n_tokens {
        1 => MAX_TILE,
        _ if multi => MULTI_ROWS,
        _ => tile_rows,
    };
    // Rows start..end, by whichever thread claimed them.
    let rows_of = |start: usize, end: usize, scratch: &mut Vec<f32>| {
        if n_tokens == 1 {
            // Decode: fused dequantize-and-dot, weights never leave registers.
            // SAFETY: [start, end) is a claimed row range, disjoint from every other
            // claim, inside y (n_tokens == 1 so y.len() == rows); `y` stays exclusively
            // borrowed by this call until `run` has waited for all threads.
            let ys = unsafe { out.slice(start, end - start) };
            if matvec(level, w.ty, &w.data[start * rb..end * rb], x, ys).is_err() {
                failed.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            return;
        }
        if multi {
            // A decode batch: every weight block decoded once for a group of columns.
            let need = n_tokens * MULTI_ROWS;
            if scratch.len() < need {
                scratch.resize(need, 0.0);
            }
            let mut r0 = start;
            while r0 < end {
                let nr = MULTI_ROWS.min(end - r0);
                let part = &mut scratch[..n_tokens * nr];
                if multi_matvec(
                    level,
                    w.ty,
                    &w.data[r0 * rb..(r0 + nr) * rb],
                    x,
                    n_tokens,
                    part,
                )
                .is_err()
                {
                    failed.store(true, std::sync::atomic::Ordering::Relaxed);
                    return;
                }
                for (t, prow) in part.chunks_exact(nr).enumerate() {
                    // SAFETY: t * rows + r0 + nr <= n_tokens * rows == y.len() (checked
                    // above), and rows r0..r0 + nr lie in this claimed [start, end) range,
                    // which no other thread writes; `y` is borrowed mutably for the whole
                    // call, which outlives `run`.
                    let dst = unsafe { out.slice(t * rows + r0, nr) };
                    dst.copy_from_slice(prow);
                }
                r0 += nr;
            }
            return;
        }
        // The scratch holds the dequantized tile, then the products of one token block.
        let tile_len = tile_rows * cols;
        let need = tile_len + MAX_TILE * tile_rows;
        if scratch.len() < need {
            scratch.resize(need, 0.0);
        }
        let (tile_buf, part) = scratch.split_at_mut(tile_len);
        let mut r0 = start;
        while r0 < end {
            let nr = tile_rows.min(end - r0);
            let tile = &mut tile_buf[..nr * cols];
            deq(&w.data[r0 * rb..(r0 + nr) * rb], tile);
            let tile = &*tile;
            let mut t0 = 0;
            while t0 < n_tokens {
                let nt = MAX_TILE.min(n_tokens - t0);
                let xs = &x[t0 * cols..(t0 + nt) * cols];
                let part = &mut part[..nt * nr];
                if gemm_f32(level, tile, xs, cols, part).is_err() {
                    failed.store(true, std::sync::atomic::Ordering::Relaxed);
                } else {
                    for (j, prow) in part.chunks_exact(nr).enumerate() {
                        // SAFETY: (t0 + j) * rows + r0 + nr <= n_tokens * rows == y.len()
                        // (checked above), and rows r0..r0 + nr lie in this claimed
                        // [start, end) range, which no other thread writes; `y` is borrowed
                        // mutably for the whole call, which outlives `run`.
                        let dst = unsafe { out.slice((t0 + j) * rows + r0, nr) };
                        dst.copy_from_slice(prow);
                    }
                }
                t0 += nt;
            }
            r0 += nr;
        }
    };
    let claims = Claims::new(rows, pool.n_threads(), align);
    pool.run(|_, scratch| {
        while let Some(range) = claims.claim() {
            rows_of(range.start, range.end, scratch);
        }
    });
    // Shapes were validated above, so the kernels cannot refuse; this is a backstop.
    if failed.into_inner() {
        return Err(CpuError::Shape {
            what: "kernel rejected a validated shape",
        });
    }
    Ok(())
}

/// Products of several matrices with one input (a layer's query, key and value
/// projections, or its gate and up projections): `ys[i] = ws[i] · x`, each output with the
/// bits [`matmul`] gives it. Where the 16-bit products apply to every matrix (one Q4_1 or
/// Q8_0 type, equal widths), the input is quantized once and the rows of all the matrices
/// share one pass over the pool, instead of a quantization and a wait for the threads per
/// matrix. Otherwise each matrix takes its own [`matmul`].
pub fn matmul_shared(
    pool: &ThreadPool,
    ws: &[Matrix<'_>],
    x: &[f32],
    n_tokens: usize,
    ys: &mut [&mut [f32]],
) -> Result<(), CpuError> {
    if ws.len() != ys.len() {
        return Err(CpuError::Shape {
            what: "not one output per matrix",
        });
    }
    let level = simd_level();
    let fused = ws.first().is_some_and(|f| {
        q16::applies(level, f.ty) && ws.iter().all(|w| w.ty == f.ty && w.cols == f.cols)
    });
    if !fused {
        for (w, y) in ws.iter().zip(ys.iter_mut()) {
            matmul_with(pool, level, *w, x, n_tokens, y)?;
        }
        return Ok(());
    }
    let mut parts = Vec::with_capacity(ws.len());
    for (w, y) in ws.iter().zip(ys.iter()) {
        parts.push((*w, checked_row_bytes(w, x, n_tokens, y)?));
    }
    if n_tokens == 0 {
        return Ok(());
    }
    matmul_q16(pool, level, &parts, x, n_tokens, ys)
}

/// The row bytes of `w`, after checking that `x` holds `n_tokens` inputs of its width and
/// `y` room for as many outputs.
fn checked_row_bytes(
    w: &Matrix<'_>,
    x: &[f32],
    n_tokens: usize,
    y: &[f32],
) -> Result<usize, CpuError> {
    let rb = w.row_bytes()?;
    if Some(x.len()) != n_tokens.checked_mul(w.cols) {
        return Err(CpuError::Shape {
            what: "x length is not n_tokens x cols",
        });
    }
    if Some(y.len()) != n_tokens.checked_mul(w.rows) {
        return Err(CpuError::Shape {
            what: "y length is not n_tokens x rows",
        });
    }
    Ok(rb)
}

/// Every token count of a format with 16-bit activation kernels (one path, so a token's
/// outputs never depend on the batch): the columns are quantized once, then each thread
/// multiplies its share of the row groups of the matrices `ws` (each with its row bytes, all
/// of one type and width, shapes checked) straight into their outputs `ys`. A matrix with
/// packed rows is read from them; one without is packed a group at a time on the way.
fn matmul_q16(
    pool: &ThreadPool,
    level: SimdLevel,
    ws: &[(Matrix<'_>, usize)],
    x: &[f32],
    n_tokens: usize,
    ys: &mut [&mut [f32]],
) -> Result<(), CpuError> {
    let Some(&(first, _)) = ws.first() else {
        return Ok(());
    };
    ACTS.with_borrow_mut(|acts| {
        let threads = pool.n_threads();
        if n_tokens < SPLIT_QUANTIZE_TOKENS || threads == 1 {
            acts.quantize(first.ty, x, first.cols, n_tokens)?;
        } else {
            let fills = Mutex::new(acts.fills(first.ty, x, first.cols, n_tokens, threads)?);
            pool.run(|_, _| {
                // The lock is held only while taking the next fill (the guard ends with
                // the statement), so the fills run in parallel, each on one thread.
                loop {
                    let next = fills.lock().unwrap_or_else(PoisonError::into_inner).next();
                    let Some(fill) = next else { break };
                    fill.run();
                }
            });
        }
        multiply_q16(pool, level, ws, acts, ys)
    })
}

/// Fewest columns whose quantization is split over the pool. A batch's quantization was a
/// few percent of the step as serial work while the other threads waited (measured at 16
/// columns). One decode column's 18 to 48 blocks take a few hundred nanoseconds, about what
/// an extra pass over the pool costs, so small counts stay on the calling thread; 4 is a
/// judgement, not a measured crossover.
const SPLIT_QUANTIZE_TOKENS: usize = 4;

thread_local! {
    /// The calling thread's quantized activations, reused by every 16-bit product it runs.
    static ACTS: std::cell::RefCell<q16::Q16Acts> = std::cell::RefCell::new(q16::Q16Acts::empty());
}

/// The threads' part of [`matmul_q16`], once the columns are quantized into `acts`.
fn multiply_q16(
    pool: &ThreadPool,
    level: SimdLevel,
    ws: &[(Matrix<'_>, usize)],
    acts: &q16::Q16Acts,
    ys: &mut [&mut [f32]],
) -> Result<(), CpuError> {
    let outs: Vec<OutPtr> = ys.iter_mut().map(|y| OutPtr(y.as_mut_ptr())).collect();
    let total: usize = ws.iter().map(|(w, _)| w.rows.div_ceil(GROUP_ROWS)).sum();
    let failed = std::sync::atomic::AtomicBool::new(false);
    // A claimed range of all the matrices' row groups, as one range over them in turn.
    let groups_of = |start: usize, end: usize| {
        let mut offset = 0;
        for ((w, rb), out) in ws.iter().zip(&outs) {
            let groups = w.rows.div_ceil(GROUP_ROWS);
            let lo = start.clamp(offset, offset + groups) - offset;
            let hi = end.clamp(offset, offset + groups) - offset;
            offset += groups;
            if lo >= hi {
                continue;
            }
            // SAFETY: each output holds n_tokens * rows values of its matrix (checked by
            // the caller), so y[t * rows + r] exists for every token t and row r; this
            // claim writes only the rows of groups [lo, hi) of this matrix, which no other
            // claim touches, while the outputs stay borrowed by this call until `run` has
            // waited for all threads.
            let res = unsafe {
                match w.packed {
                    Some(p) => q16::matmul_packed_to(level, p, lo..hi, acts, out.ptr(), w.rows),
                    None => {
                        let (r0, r1) = (lo * GROUP_ROWS, (hi * GROUP_ROWS).min(w.rows));
                        let wr = &w.data[r0 * rb..r1 * rb];
                        q16::matmul_to(level, wr, r1 - r0, acts, out.ptr().add(r0), w.rows)
                    }
                }
            };
            if res.is_err() {
                failed.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
    };
    let claims = Claims::new(total, pool.n_threads(), 1);
    pool.run(|_, _| {
        while let Some(range) = claims.claim() {
            groups_of(range.start, range.end);
        }
    });
    if failed.into_inner() {
        return Err(CpuError::Shape {
            what: "kernel rejected a validated shape",
        });
    }
    Ok(())
}

/// Largest token count sent to the multi-column matvec; more tokens take the tile GEMM.
/// Measured (`examples/batch_matmul`, one thread, Zen 5 AVX-512, tokens per CPU-second of
/// the weight products of one step): SmolLM2 Q4_1 multi/GEMM 431/301 at 8 tokens, 440/403
/// at 16, 441/453 at 24, 444/486 at 32; gemma3 Q4_K_M 207/137, 217/192, 222/221, 226/237.
/// Both are bound by FMA throughput there; the GEMM's 4 x 4 register tile wins past ~20.
const MULTI_MAX_TOKENS: usize = 16;

/// Output rows per call of the multi-column matvec (its outputs go through the thread's
/// scratch: `n_tokens * MULTI_ROWS` floats).
const MULTI_ROWS: usize = 64;

/// Weight rows dequantized per tile: small enough to stay in L1 for few tokens (32 KiB) and
/// in L2 for prefill (256 KiB), a multiple of the kernel tile.
fn tile_rows(cols: usize, n_tokens: usize) -> usize {
    let budget = if n_tokens <= 2 { 8 * 1024 } else { 64 * 1024 };
    let rows = (budget / cols.max(1)).clamp(MAX_TILE, 256);
    rows - rows % MAX_TILE
}

/// The output pointer shared by the workers; each writes a disjoint set of elements.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);

impl OutPtr {
    /// The output's first element (a method, so closures capture the `Sync` wrapper).
    fn ptr(self) -> *mut f32 {
        self.0
    }

    /// The elements `start..start + len` as a slice.
    ///
    /// # Safety
    /// The range is in bounds of the borrowed output and no other thread accesses it while
    /// the slice lives.
    #[allow(clippy::mut_from_ref)]
    unsafe fn slice(&self, start: usize, len: usize) -> &mut [f32] {
        // SAFETY: forwarded caller contract.
        unsafe { std::slice::from_raw_parts_mut(self.0.add(start), len) }
    }
}
// SAFETY: workers only write through the pointer to disjoint elements (the claimed ranges)
// while `matmul_with` holds the exclusive borrow of `y` and waits for them in `run`.
unsafe impl Sync for OutPtr {}
// SAFETY: as above.
unsafe impl Send for OutPtr {}
