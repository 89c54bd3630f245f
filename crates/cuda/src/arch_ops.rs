//! Launches of the architecture extras (`kernels/moe.cu`): attention biases (Qwen 2) and
//! the mixture-of-experts FFN (router logits, routing, the selected experts' gated and down
//! products). Expert stacks live on the device as one buffer per projection, expert `e`
//! being the `e`-th run of `expert_bytes`; the kernels find the selected experts through the
//! device-side selection, so a decode step needs no host round trip.

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use ferrite_gguf::GgmlType;
use ferrite_model::Activation;

use crate::device::{grid_1d, weight_kernels};
use crate::ops::{DeviceMatrix, check_matrix};
use crate::{CudaBackend, CudaError};

/// Rows (warps) per block of the expert and router kernels.
const ROWS_PER_BLOCK: usize = 4;
/// Most blocks along a launch's y axis (the (token, slot) pairs of one expert launch).
const MAX_GRID_Y: usize = 65_535;
/// Most experts per layer the routing kernel holds (n_expert doubles of shared memory).
pub(crate) const MOE_MAX_EXPERTS: usize = 4096;

/// One projection of every expert of a layer, stacked as in the GGUF file.
#[derive(Debug)]
pub(crate) struct DeviceExperts {
    pub(crate) ty: GgmlType,
    /// Rows of one expert's matrix.
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) row_bytes: u64,
    pub(crate) expert_bytes: u64,
    pub(crate) n_expert: usize,
    pub(crate) data: CudaSlice<u8>,
}

fn expert_grid(rows: usize, y: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows.div_ceil(ROWS_PER_BLOCK) as u32, y as u32, 1),
        block_dim: (32 * ROWS_PER_BLOCK as u32, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The gated kernels' code of `act` (`gated` in common.cuh).
pub(crate) fn act_code(act: Activation) -> Result<i32, CudaError> {
    Ok(match act {
        Activation::Silu => 0,
        Activation::GeluTanh => 1,
        Activation::SwigluOai => 2,
    })
}

impl CudaBackend {
    /// Uploads `data` as `n_expert` stacked `rows × cols` matrices of `ty`.
    pub(crate) fn upload_experts(
        &self,
        ty: GgmlType,
        rows: usize,
        cols: usize,
        n_expert: usize,
        data: &[u8],
    ) -> Result<DeviceExperts, CudaError> {
        let row_bytes = check_matrix(ty, rows, cols)?;
        let expert_bytes = row_bytes * rows as u64;
        if n_expert == 0 || data.len() as u64 != expert_bytes * n_expert as u64 {
            return Err(CudaError::InvalidArgument(format!(
                "{n_expert} {ty} experts of {rows}×{cols} need {} bytes, got {}",
                expert_bytes * n_expert as u64,
                data.len()
            )));
        }
        Ok(DeviceExperts {
            ty,
            rows,
            cols,
            row_bytes,
            expert_bytes,
            n_expert,
            data: self.stream.clone_htod(data)?,
        })
    }

    /// Adds the q, k, v biases to `n` rows of `q`, `k`, `v`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn qkv_bias(
        &self,
        q: &CudaSlice<f32>,
        k: &CudaSlice<f32>,
        v: &CudaSlice<f32>,
        [bq, bk, bv]: [&CudaSlice<f32>; 3],
        n: usize,
    ) -> Result<(), CudaError> {
        let (qd, kvd) = (bq.len(), bk.len());
        if bv.len() != kvd || q.len() < n * qd || k.len() < n * kvd || v.len() < n * kvd {
            return Err(CudaError::InvalidArgument(format!(
                "q/k/v bias over {n} rows: buffers too small"
            )));
        }
        let (qd32, kvd32, n32) = (qd as i32, kvd as i32, n as i32);
        let mut b = self.kernel("qkv_bias_f32")?;
        b.arg(q)
            .arg(k)
            .arg(v)
            .arg(bq)
            .arg(bk)
            .arg(bv)
            .arg(&qd32)
            .arg(&kvd32)
            .arg(&n32);
        // SAFETY: touches n rows of qd (q) and kvd (k, v) values, checked above, and reads
        // the whole of each bias.
        unsafe { b.launch(grid_1d(n * (qd + 2 * kvd))) }?;
        Ok(())
    }

    /// `x[t] += bias` over `n` rows of `bias.len()` values.
    pub(crate) fn add_bias(
        &self,
        x: &CudaSlice<f32>,
        bias: &CudaSlice<f32>,
        n: usize,
    ) -> Result<(), CudaError> {
        let dim = bias.len();
        if x.len() < n * dim {
            return Err(CudaError::InvalidArgument(format!(
                "bias over {n} rows of {dim}: buffer too small"
            )));
        }
        let (d32, n32) = (dim as i32, n as i32);
        let mut b = self.kernel("add_bias_f32")?;
        b.arg(x).arg(bias).arg(&d32).arg(&n32);
        // SAFETY: touches n × dim values of x (checked above) and dim of the bias.
        unsafe { b.launch(grid_1d(n * dim)) }?;
        Ok(())
    }

    /// `y[t] = W · x[t]` for `n` token rows, in f32.
    pub(crate) fn matvec_rows(
        &self,
        w: &DeviceMatrix,
        x: &CudaSlice<f32>,
        n: usize,
        y: &CudaSlice<f32>,
    ) -> Result<(), CudaError> {
        if x.len() < n * w.cols || y.len() < n * w.rows {
            return Err(CudaError::InvalidArgument(format!(
                "row products of {n} rows: buffers too small"
            )));
        }
        let name = weight_kernels(w.ty).map_or("none", |k| k.rows);
        let (rows, cols) = (w.rows as i32, w.cols as i32);
        let mut b = self.kernel(name)?;
        b.arg(&w.data)
            .arg(x)
            .arg(y)
            .arg(&rows)
            .arg(&cols)
            .arg(&w.row_bytes);
        // SAFETY: reads the matrix (rows × row_bytes, checked at upload) and n rows of x,
        // writes n rows of y (both checked above).
        unsafe { b.launch(expert_grid(w.rows, n)) }?;
        Ok(())
    }

    /// Routes `n` tokens from their router logits (`n × n_expert`): `k` expert ids per
    /// token into `sel` and their weights into `wts`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn moe_route(
        &self,
        logits: &CudaSlice<f32>,
        sel: &CudaSlice<i32>,
        wts: &CudaSlice<f32>,
        n: usize,
        n_expert: usize,
        k: usize,
        norm: bool,
    ) -> Result<(), CudaError> {
        if n_expert > MOE_MAX_EXPERTS
            || k == 0
            || k > n_expert
            || logits.len() < n * n_expert
            || sel.len() < n * k
            || wts.len() < n * k
        {
            return Err(CudaError::InvalidArgument(format!(
                "routing {n} tokens over {n_expert} experts, top {k}"
            )));
        }
        let cfg = LaunchConfig {
            grid_dim: (n as u32, 1, 1),
            // One warp: the kernel synchronises with __syncwarp.
            block_dim: (32, 1, 1),
            shared_mem_bytes: (8 * n_expert) as u32,
        };
        let (ne, k32, norm32) = (n_expert as i32, k as i32, i32::from(norm));
        let mut b = self.kernel("moe_route")?;
        b.arg(logits)
            .arg(sel)
            .arg(wts)
            .arg(&ne)
            .arg(&k32)
            .arg(&norm32);
        // SAFETY: reads n × n_expert logits, writes n × k ids and weights (checked above);
        // the shared memory holds the n_expert doubles the kernel uses.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// Gated input of the selected experts: `y[p] = act(Wg_e · x[p / k]) · (Wu_e · x[p / k])`
    /// with `e = sel[p]`, for the `n × k` (token, slot) pairs.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn moe_gated(
        &self,
        act: Activation,
        wg: &DeviceExperts,
        wu: &DeviceExperts,
        x: &CudaSlice<f32>,
        y: &CudaSlice<f32>,
        sel: &CudaSlice<i32>,
        n: usize,
        k: usize,
    ) -> Result<(), CudaError> {
        let same = wg.ty == wu.ty
            && wg.rows == wu.rows
            && wg.cols == wu.cols
            && wg.n_expert == wu.n_expert;
        if !same
            || n * k > MAX_GRID_Y
            || x.len() < n * wg.cols
            || y.len() < n * k * wg.rows
            || sel.len() < n * k
        {
            return Err(CudaError::InvalidArgument(format!(
                "expert gate/up of {n} tokens: stacks differ or buffers too small"
            )));
        }
        let name = weight_kernels(wg.ty).map_or("none", |kn| kn.moe_gated);
        let (rows, cols, a, k32) = (wg.rows as i32, wg.cols as i32, act_code(act)?, k as i32);
        let mut b = self.kernel(name)?;
        b.arg(&wg.data)
            .arg(&wu.data)
            .arg(x)
            .arg(y)
            .arg(sel)
            .arg(&rows)
            .arg(&cols)
            .arg(&wg.row_bytes)
            .arg(&wg.expert_bytes)
            .arg(&a)
            .arg(&k32);
        // SAFETY: the ids in sel come from moe_route (< n_expert), so every matrix read
        // lies inside both stacks (n_expert × expert_bytes, checked at upload); x has n rows
        // and y n × k rows (checked above).
        unsafe { b.launch(expert_grid(wg.rows, n * k)) }?;
        Ok(())
    }

    /// Down products of the selected experts, weighted and summed per token:
    /// `y[t] = Σ_s wts[t,s] · W_sel[t,s] · x[t·k + s]`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn moe_down(
        &self,
        w: &DeviceExperts,
        x: &CudaSlice<f32>,
        y: &CudaSlice<f32>,
        sel: &CudaSlice<i32>,
        wts: &CudaSlice<f32>,
        n: usize,
        k: usize,
    ) -> Result<(), CudaError> {
        if x.len() < n * k * w.cols
            || y.len() < n * w.rows
            || sel.len() < n * k
            || wts.len() < n * k
        {
            return Err(CudaError::InvalidArgument(format!(
                "expert down of {n} tokens: buffers too small"
            )));
        }
        let name = weight_kernels(w.ty).map_or("none", |kn| kn.moe_down);
        let (rows, cols, k32) = (w.rows as i32, w.cols as i32, k as i32);
        let mut b = self.kernel(name)?;
        b.arg(&w.data)
            .arg(x)
            .arg(y)
            .arg(sel)
            .arg(wts)
            .arg(&rows)
            .arg(&cols)
            .arg(&w.row_bytes)
            .arg(&w.expert_bytes)
            .arg(&k32);
        // SAFETY: as moe_gated: ids from moe_route stay inside the stack; x has n × k rows,
        // y n rows, sel and wts n × k values (checked above).
        unsafe { b.launch(expert_grid(w.rows, n)) }?;
        Ok(())
    }

    /// Expert `e` of `w` as `rows × cols` f16 values, row-major, into `out`.
    pub(crate) fn dequant_expert_f16(
        &self,
        w: &DeviceExperts,
        e: usize,
        out: &CudaSlice<u16>,
    ) -> Result<(), CudaError> {
        let n = w.rows * w.cols;
        if e >= w.n_expert || out.len() < n {
            return Err(CudaError::InvalidArgument(format!(
                "expert {e} of {} into {} f16 values",
                w.n_expert,
                out.len()
            )));
        }
        let eb = w.expert_bytes as usize;
        let expert = w.data.slice(e * eb..(e + 1) * eb);
        let name = weight_kernels(w.ty).map_or("none", |k| k.dequant_f16);
        let (rows, cols) = (w.rows as i32, w.cols as i32);
        let mut b = self.kernel(name)?;
        b.arg(&expert)
            .arg(out)
            .arg(&rows)
            .arg(&cols)
            .arg(&w.row_bytes);
        // SAFETY: reads the expert's rows × row_bytes bytes (the view) and writes rows × cols
        // values of out (checked above).
        unsafe { b.launch(grid_1d(n)) }?;
        Ok(())
    }

    /// Row `r < rows` of `out` (f16) = row `order[r] / k` of `xn` (`cols` values each).
    pub(crate) fn moe_gather_f16(
        &self,
        xn: &CudaSlice<f32>,
        order: &CudaSlice<i32>,
        out: &CudaSlice<u16>,
        cols: usize,
        k: usize,
        rows: usize,
    ) -> Result<(), CudaError> {
        if order.len() < rows || out.len() < rows * cols || xn.len() < rows.div_ceil(k) * cols {
            return Err(CudaError::InvalidArgument(format!(
                "gather of {rows} expert rows: buffers too small"
            )));
        }
        let (c32, k32, r32) = (cols as i32, k as i32, rows as i32);
        let mut b = self.kernel("moe_gather_f16")?;
        b.arg(xn).arg(order).arg(out).arg(&c32).arg(&k32).arg(&r32);
        // SAFETY: the order holds pair ids < rows (a permutation made by the caller), so the
        // token rows read are < rows / k of xn; writes rows × cols values (checked above).
        unsafe { b.launch(grid_1d(rows * cols)) }?;
        Ok(())
    }

    /// Row `r < rows` of `out` = row `order[r] / k` of `xn` (`tokens` rows of `cols`
    /// values), in f32.
    pub(crate) fn moe_gather_f32(
        &self,
        xn: &CudaSlice<f32>,
        order: &CudaSlice<i32>,
        out: &CudaSlice<f32>,
        cols: usize,
        k: usize,
        (rows, tokens): (usize, usize),
    ) -> Result<(), CudaError> {
        if order.len() < rows || out.len() < rows * cols || xn.len() < tokens * cols {
            return Err(CudaError::InvalidArgument(format!(
                "gather of {rows} expert rows: buffers too small"
            )));
        }
        let (c32, k32, r32) = (cols as i32, k as i32, rows as i32);
        let mut b = self.kernel("moe_gather_f32")?;
        b.arg(xn).arg(order).arg(out).arg(&c32).arg(&k32).arg(&r32);
        // SAFETY: the caller's order holds pair ids < tokens × k (the host routing's), so
        // every row read is one of the `tokens` rows of xn; writes rows × cols values of out
        // (both checked above).
        unsafe { b.launch(grid_1d(rows * cols)) }?;
        Ok(())
    }

    /// `out[t] = Σ_s wts[t·k+s] · ys[pos[t·k+s]]` for `n` tokens of `cols` values.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn moe_combine(
        &self,
        ys: &CudaSlice<f32>,
        pos: &CudaSlice<i32>,
        wts: &CudaSlice<f32>,
        out: &CudaSlice<f32>,
        cols: usize,
        k: usize,
        n: usize,
    ) -> Result<(), CudaError> {
        let pairs = n * k;
        if pos.len() < pairs || wts.len() < pairs || ys.len() < pairs * cols || out.len() < n * cols
        {
            return Err(CudaError::InvalidArgument(format!(
                "combine of {n} tokens: buffers too small"
            )));
        }
        let (c32, k32, n32) = (cols as i32, k as i32, n as i32);
        let mut b = self.kernel("moe_combine")?;
        b.arg(ys)
            .arg(pos)
            .arg(wts)
            .arg(out)
            .arg(&c32)
            .arg(&k32)
            .arg(&n32);
        // SAFETY: pos holds grouped rows < pairs (the caller's permutation), so ys reads stay
        // inside its pairs × cols values; writes n × cols values of out (checked above).
        unsafe { b.launch(grid_1d(n * cols)) }?;
        Ok(())
    }
}
