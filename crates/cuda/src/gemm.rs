//! Batched-prefill products, one launch for all tokens of a prefill chunk, two ways (the
//! [`PrefillProducts`] setting):
//! - dequantize: the weight matrix as f16 (a kept copy, or dequantized into a scratch buffer
//!   per chunk), the activations rounded to f16, one cuBLAS GEMM (f16 tensor cores, f32
//!   accumulation and output);
//! - MMQ (mmq.cu): the weights in their GGUF blocks against the activations quantized to
//!   int8 blocks as the decode products read them, on the integer tensor cores.
//!
//! It never decides numerics per chunk size: a setting applies to every chunk.

use std::ffi::c_void;

use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
use cudarc::driver::{CudaSlice, DevicePtr, LaunchConfig, PushKernelArg};
use ferrite_gguf::GgmlType;

use crate::device::{grid_1d, weight_kernels};
use crate::ops::{ActQ, DeviceMatrix, act_q8_bytes};
use crate::{CudaBackend, CudaError};

/// How batched prefill multiplies a weight matrix with a chunk of tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PrefillProducts {
    /// f16 weights and activations through cuBLAS.
    Dequant,
    /// Integer tensor-core products (MMQ) of Q4_1, Q8_0, Q4_K and Q6_K weights with the
    /// activations in the decode products' int8 planes ([`crate::Activations`]); other
    /// formats, f32 activations and devices before sm_80 keep the cuBLAS path.
    Mmq,
}

impl PrefillProducts {
    /// The name `FERRITE_CUDA_PREFILL` takes: `dequant` or `mmq`.
    pub fn name(self) -> &'static str {
        match self {
            PrefillProducts::Dequant => "dequant",
            PrefillProducts::Mmq => "mmq",
        }
    }

    /// The setting of that name.
    pub fn from_name(name: &str) -> Option<PrefillProducts> {
        [PrefillProducts::Dequant, PrefillProducts::Mmq]
            .into_iter()
            .find(|p| p.name() == name)
    }

    pub(crate) fn code(self) -> u8 {
        match self {
            PrefillProducts::Dequant => 0,
            PrefillProducts::Mmq => 1,
        }
    }

    pub(crate) fn from_code(c: u8) -> PrefillProducts {
        if c == 1 {
            PrefillProducts::Mmq
        } else {
            PrefillProducts::Dequant
        }
    }
}

/// The setting a backend starts with when `FERRITE_CUDA_PREFILL` is unset (or not a name).
pub const DEFAULT_PREFILL: PrefillProducts = PrefillProducts::Dequant;

/// The environment variable read by [`CudaBackend::new`] to choose [`PrefillProducts`].
pub const PREFILL_ENV: &str = "FERRITE_CUDA_PREFILL";

/// Weight rows and tokens of one MMQ block (`MMQ_ROWS`, `MMQ_TOKS` in mmq.cu).
const MMQ_TILE: (usize, usize) = (64, 64);

/// Column blocks of 32 one MMQ block stages at a time (`MMQ_KB`): a split of the columns is
/// a multiple of it, so K-quant super-blocks are never cut.
const MMQ_KB: usize = 8;

/// MMQ blocks a launch aims for (several per SM, so that some compute while others load).
const MMQ_TARGET_BLOCKS: usize = 1024;

/// Column blocks per split and the number of splits for an MMQ product of `rows × cols`
/// with `n` tokens, at most `max_splits`: enough splits to reach MMQ_TARGET_BLOCKS, each
/// split a whole number of stages and none empty.
fn mmq_splits(rows: usize, cols: usize, n: usize, max_splits: usize) -> (usize, usize) {
    let stages = (cols / 32).div_ceil(MMQ_KB);
    let blocks = rows.div_ceil(MMQ_TILE.0) * n.div_ceil(MMQ_TILE.1);
    let want = MMQ_TARGET_BLOCKS.div_ceil(blocks).clamp(1, stages.max(1));
    let splits = want.min(max_splits).max(1);
    let kb_per = stages.div_ceil(splits) * MMQ_KB;
    (kb_per, (cols / 32).div_ceil(kb_per).max(1))
}

/// The MMQ kernel of a weight type with activations in `planes` planes.
pub(crate) fn mmq_kernel(ty: GgmlType, planes: usize) -> Option<&'static str> {
    use GgmlType as T;
    Some(match (ty, planes) {
        (T::Q4_1, 1) => "mmq_i8_q4_1",
        (T::Q8_0, 1) => "mmq_i8_q8_0",
        (T::Q4_K, 1) => "mmq_i8_q4_k",
        (T::Q6_K, 1) => "mmq_i8_q6_k",
        (T::Q4_1, 2) => "mmq_i8x2_q4_1",
        (T::Q8_0, 2) => "mmq_i8x2_q8_0",
        (T::Q4_K, 2) => "mmq_i8x2_q4_k",
        (T::Q6_K, 2) => "mmq_i8x2_q6_k",
        _ => return None,
    })
}

/// Scratch buffers of the prefill products.
#[derive(Debug)]
pub(crate) struct ProductScratch {
    /// One dequantized weight matrix (cuBLAS without a kept f16 copy).
    pub(crate) w16: CudaSlice<u16>,
    /// MMQ's partial sums when it splits the columns.
    pub(crate) part: CudaSlice<f32>,
}

/// How the products of one prefill chunk run, fixed at the chunk's start: the int8 planes
/// MMQ reads, or `None` for cuBLAS everywhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PrefillMode {
    mmq_planes: Option<usize>,
}

impl PrefillMode {
    /// The MMQ kernel `w` runs under this mode, if any.
    fn mmq(self, w: &DeviceMatrix) -> Option<(&'static str, usize)> {
        let planes = self.mmq_planes?;
        mmq_kernel(w.ty, planes).map(|k| (k, planes))
    }

    /// The int8 planes MMQ reads under this mode; `None` when every product is cuBLAS's.
    pub(crate) fn mmq_planes(self) -> Option<usize> {
        self.mmq_planes
    }

    /// Whether `w` takes the MMQ path (so needs no f16 copy).
    pub(crate) fn is_mmq(self, w: &DeviceMatrix) -> bool {
        self.mmq(w).is_some()
    }

    /// Writes the forms of `x` (`n` token rows of `cols`) that the products of `ws` read:
    /// f16 into `x16` for cuBLAS, int8 blocks into `xq` for MMQ.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn prepare(
        self,
        b: &CudaBackend,
        ws: &[&DeviceMatrix],
        x: &CudaSlice<f32>,
        n: usize,
        cols: usize,
        x16: &CudaSlice<u16>,
        xq: &CudaSlice<u8>,
    ) -> Result<(), CudaError> {
        if ws.iter().any(|w| !self.is_mmq(w)) {
            b.to_f16(x, x16, n * cols)?;
        }
        if let Some(planes) = ws.iter().find_map(|w| self.mmq(w).map(|(_, p)| p)) {
            b.quantize_act(x, ActQ { buf: xq, planes }, n * cols)?;
        }
        Ok(())
    }

    /// `y = x · Wᵀ` for the `n` token rows prepared by [`PrefillMode::prepare`]; `scratch`
    /// holds the f16 weights (cuBLAS) or MMQ's partial sums.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn product(
        self,
        b: &CudaBackend,
        w: &DeviceMatrix,
        x16: &CudaSlice<u16>,
        xq: &CudaSlice<u8>,
        n: usize,
        y: &CudaSlice<f32>,
        scratch: &ProductScratch,
    ) -> Result<(), CudaError> {
        match self.mmq(w) {
            Some((kernel, planes)) => {
                b.mmq(kernel, w, ActQ { buf: xq, planes }, n, y, &scratch.part)
            }
            None => b.matmul(w, x16, n, y, &scratch.w16),
        }
    }
}

impl CudaBackend {
    /// The prefill mode of the current settings: MMQ needs int8 activations and the
    /// integer mma of sm_80.
    pub(crate) fn prefill_mode(&self) -> PrefillMode {
        let planes = self.activations().planes();
        let mma = self.info().compute_capability >= (8, 0);
        let on = self.prefill_products() == PrefillProducts::Mmq && mma && planes > 0;
        PrefillMode {
            mmq_planes: on.then_some(planes),
        }
    }

    /// `y[n × rows] = x · Wᵀ` by the MMQ `kernel` of `w`'s type, `x` being `n` token rows
    /// quantized as one vector into `xq`. When the rows and tokens make few blocks, the
    /// columns are split over up to `part.len() / (n · rows)` blocks whose partial sums
    /// `part` holds until they are added in order.
    pub(crate) fn mmq(
        &self,
        kernel: &'static str,
        w: &DeviceMatrix,
        xq: ActQ<'_>,
        n: usize,
        y: &CudaSlice<f32>,
        part: &CudaSlice<f32>,
    ) -> Result<(), CudaError> {
        let int = |v: usize| {
            i32::try_from(v).map_err(|_| CudaError::InvalidArgument(format!("MMQ size {v}")))
        };
        if n == 0 || xq.buf.len() < act_q8_bytes(n * w.cols, xq.planes) || y.len() < n * w.rows {
            return Err(CudaError::InvalidArgument(format!(
                "MMQ {n}×{} by {}×{}: buffers too small",
                w.cols, w.rows, w.cols
            )));
        }
        let len = n * w.rows;
        let (kb_per, splits) = mmq_splits(w.rows, w.cols, n, part.len() / len);
        let (rows, cols, nn, rb) = (
            int(w.rows)?,
            int(w.cols)?,
            int(n)?,
            int(w.row_bytes as usize)?,
        );
        let kb = int(kb_per)?;
        let cfg = LaunchConfig {
            grid_dim: (
                w.rows.div_ceil(MMQ_TILE.0) as u32,
                n.div_ceil(MMQ_TILE.1) as u32,
                splits as u32,
            ),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.kernel(kernel)?;
        b.arg(&w.data)
            .arg(xq.buf)
            .arg(y)
            .arg(part)
            .arg(&rows)
            .arg(&cols)
            .arg(&nn)
            .arg(&rb)
            .arg(&kb);
        // SAFETY: reads rows × row_bytes bytes of w (checked at upload) and the n × cols int8
        // values and scales of xq; writes n × rows values of y, or with several splits
        // splits × n × rows values of part (mmq_splits keeps that within part.len()).
        unsafe { b.launch(cfg) }?;
        if splits > 1 {
            let (len32, s32) = (int(len)?, int(splits)?);
            let mut r = self.kernel("mmq_reduce")?;
            r.arg(part).arg(y).arg(&len32).arg(&s32);
            // SAFETY: reads splits × len values of part and writes len values of y (both
            // within their lengths, as above).
            unsafe { r.launch(grid_1d(len)) }?;
        }
        Ok(())
    }

    /// Writes `w` as `rows × cols` f16 values, row-major, into `out`.
    pub(crate) fn dequant_f16(
        &self,
        w: &DeviceMatrix,
        out: &CudaSlice<u16>,
    ) -> Result<(), CudaError> {
        let n = w.rows * w.cols;
        if out.len() < n {
            return Err(CudaError::InvalidArgument(format!(
                "f16 scratch of {} values below {n}",
                out.len()
            )));
        }
        let name = weight_kernels(w.ty).map_or("none", |k| k.dequant_f16);
        let (rows, cols) = (w.rows as i32, w.cols as i32);
        let mut b = self.kernel(name)?;
        b.arg(&w.data)
            .arg(out)
            .arg(&rows)
            .arg(&cols)
            .arg(&w.row_bytes);
        // SAFETY: reads rows × row_bytes bytes of w (checked at upload) and writes
        // rows × cols values of out (checked above).
        unsafe { b.launch(grid_1d(n)) }?;
        Ok(())
    }

    /// The first `n` values of `x` rounded to f16 into `y`.
    pub(crate) fn to_f16(
        &self,
        x: &CudaSlice<f32>,
        y: &CudaSlice<u16>,
        n: usize,
    ) -> Result<(), CudaError> {
        if x.len() < n || y.len() < n {
            return Err(CudaError::InvalidArgument(format!(
                "f16 conversion of {n} values"
            )));
        }
        let n64 = n as u64;
        let mut b = self.kernel("f32_to_f16")?;
        b.arg(x).arg(y).arg(&n64);
        // SAFETY: touches n values of x and y (checked above).
        unsafe { b.launch(grid_1d(n)) }?;
        Ok(())
    }

    /// `y[n × rows] = x[n × cols] · Wᵀ` for a row-major f16 `W` of `rows × cols` and f16
    /// activations `x` (one token per row); f32 accumulation and output. Any of the three
    /// may be a view into a larger buffer (the expert groups of MoE prefill).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gemm_f16(
        &self,
        w16: &impl DevicePtr<u16>,
        rows: usize,
        cols: usize,
        x16: &impl DevicePtr<u16>,
        n: usize,
        y: &impl DevicePtr<f32>,
    ) -> Result<(), CudaError> {
        let blas = self
            .blas
            .as_ref()
            .map_err(|e| CudaError::InvalidArgument(format!("no GEMM: {e}")))?;
        if w16.len() < rows * cols || x16.len() < n * cols || y.len() < n * rows {
            return Err(CudaError::InvalidArgument(format!(
                "GEMM {n}×{cols} by {rows}×{cols}: buffers too small"
            )));
        }
        let int = |v: usize| {
            i32::try_from(v).map_err(|_| CudaError::InvalidArgument(format!("GEMM size {v}")))
        };
        let (m, nn, k) = (int(rows)?, int(n)?, int(cols)?);
        let (alpha, beta) = (1.0f32, 0.0f32);
        let (a, _ga) = w16.device_ptr(&self.stream);
        let (b, _gb) = x16.device_ptr(&self.stream);
        let (c, _gc) = y.device_ptr(&self.stream);
        // Column-major view: W row-major is Wᵀ (cols × rows, ld cols), so C (rows × n,
        // ld rows) = op_T(W) · x, with x row-major n × cols = column-major cols × n.
        // SAFETY: the handle is bound to this backend's stream; the pointers are live
        // device buffers of at least the sizes checked above; alpha and beta are host f32
        // scalars (the handle's default pointer mode) that outlive the call.
        unsafe {
            cudarc::cublas::result::gemm_ex(
                *blas.handle(),
                cublasOperation_t::CUBLAS_OP_T,
                cublasOperation_t::CUBLAS_OP_N,
                m,
                nn,
                k,
                (&alpha as *const f32).cast::<c_void>(),
                a as *const c_void,
                cudaDataType::CUDA_R_16F,
                k,
                b as *const c_void,
                cudaDataType::CUDA_R_16F,
                k,
                (&beta as *const f32).cast::<c_void>(),
                c as *mut c_void,
                cudaDataType::CUDA_R_32F,
                m,
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| CudaError::InvalidArgument(format!("cuBLAS GEMM: {e}")))?;
        self.count_gemm();
        Ok(())
    }

    /// `y = x · Wᵀ` for `n` token rows of f16 activations `x16`, from `w`'s cached f16
    /// copy or, without one, dequantized into the scratch `w16` first.
    pub(crate) fn matmul(
        &self,
        w: &DeviceMatrix,
        x16: &CudaSlice<u16>,
        n: usize,
        y: &CudaSlice<f32>,
        w16: &CudaSlice<u16>,
    ) -> Result<(), CudaError> {
        if let Some(cached) = &w.f16 {
            return self.gemm_f16(cached, w.rows, w.cols, x16, n, y);
        }
        self.dequant_f16(w, w16)?;
        self.gemm_f16(w16, w.rows, w.cols, x16, n, y)
    }

    /// Gives `w` a cached f16 copy.
    pub(crate) fn cache_f16(&self, w: &mut DeviceMatrix) -> Result<(), CudaError> {
        let copy = self.stream.alloc_zeros::<u16>(w.rows * w.cols)?;
        self.dequant_f16(w, &copy)?;
        w.f16 = Some(copy);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mmq_splits_cover_the_columns_in_whole_stages() {
        for (rows, cols, n, max) in [
            (4096, 4096, 16, 64),
            (4096, 4096, 512, 4),
            (14336, 4096, 512, 2),
            (1024, 4096, 512, 1),
            (576, 576, 7, 64),
            (130, 96, 70, 16),
            (8195, 256, 1, 16),
            (1, 9216, 1, 16),
        ] {
            let nblk = cols / 32;
            let (kb_per, splits) = mmq_splits(rows, cols, n, max);
            assert!(
                kb_per.is_multiple_of(MMQ_KB) && splits >= 1,
                "{rows}x{cols}"
            );
            assert!(
                splits <= max.max(1),
                "{rows}x{cols} n {n}: {splits} > {max}"
            );
            assert!(splits * kb_per >= nblk, "{rows}x{cols}: columns left over");
            assert!(
                (splits - 1) * kb_per < nblk,
                "{rows}x{cols}: an empty split"
            );
        }
        assert_eq!(mmq_splits(4096, 4096, 16, 64), (8, 16));
        assert_eq!(mmq_splits(14336, 4096, 512, 64).1, 1);
    }
}
