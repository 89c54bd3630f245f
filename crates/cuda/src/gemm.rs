//! Batched-prefill products: a weight matrix dequantized to f16 into a scratch buffer, the
//! activations rounded to f16, and one cuBLAS GEMM (f16 inputs on the tensor cores, f32
//! accumulation and output) for all tokens of a prefill chunk.

use std::ffi::c_void;

use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
use cudarc::driver::{CudaSlice, DevicePtr, PushKernelArg};

use crate::device::{grid_1d, weight_kernels};
use crate::ops::DeviceMatrix;
use crate::{CudaBackend, CudaError};

impl CudaBackend {
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
