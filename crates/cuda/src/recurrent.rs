//! Launches of the recurrent layers' kernels (`kernels/recurrent.cu`): the causal
//! convolution, the gated delta rule and the Mamba-2 selective scan over one segment's rows
//! and its state, and the element-wise ops of hybrid models (sigmoid gate, row gate, gated
//! norm, grouped norm, squared ReLU).
//!
//! This module owns the geometry of those launches and checks every buffer a kernel touches
//! against its length before launching. It never keeps state of its own (the state lives in
//! the caller's buffers, e.g. `CudaKv`'s slots) and never splits a recurrence over several
//! launches or blocks in a way that depends on the rows of a pass: one launch per segment,
//! one block per head, the step form row after row.

use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, LaunchConfig, PushKernelArg};
use ferrite_arch::{DeltaNetShape, Mamba2Shape};

use crate::device::grid_1d;
use crate::ops::i32_of;
use crate::{CudaBackend, CudaError};

/// Every kernel of `kernels/recurrent.cu`, by name.
pub(crate) const RECURRENT_KERNELS: &[&str] = &[
    "gate_sigmoid_f32",
    "row_gate_f32",
    "gated_norm_f32",
    "group_norm_f32",
    "relu_sq_f32",
    "conv1d_f32",
    "conv1d_bias_f32",
    "delta_rule_f32",
    "ssm_scan_f32",
];

/// The widest key head of the delta rule: its normalised query and key sit in shared
/// memory (2 × k_dim floats, within the 48 KiB a block gets without opting in).
pub(crate) const DELTA_MAX_K_DIM: usize = 4096;

/// Threads of a block whose threads each take columns (or rows) `i, i + blockDim, ...` of
/// `n`: a whole number of warps (the block sums need it), at most 256. Fixed by the layer's
/// shape, so the order of every sum is too.
fn block_for(n: usize) -> u32 {
    (n.div_ceil(32) * 32).clamp(32, 256) as u32
}

fn too_small(what: &str) -> CudaError {
    CudaError::InvalidArgument(format!("{what}: buffer too small"))
}

/// One segment of a recurrent launch: its rows and whether it starts at position 0 (then
/// the kernel reads its incoming state as zero).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rows {
    pub(crate) n: usize,
    pub(crate) fresh: bool,
}

impl CudaBackend {
    /// `g = sigmoid(g) · u` over `n` values.
    pub(crate) fn gate_sigmoid(
        &self,
        g: &CudaSlice<f32>,
        u: &CudaSlice<f32>,
        n: usize,
    ) -> Result<(), CudaError> {
        if g.len() < n || u.len() < n {
            return Err(too_small("sigmoid gate"));
        }
        let n32 = i32_of(n, "values")?;
        let mut b = self.kernel("gate_sigmoid_f32")?;
        b.arg(g).arg(u).arg(&n32);
        // SAFETY: touches n values of g and u (checked above).
        unsafe { b.launch(grid_1d(n)) }?;
        Ok(())
    }

    /// `x[r][i] *= sigmoid(g[r])` for `n` rows of `width` values.
    pub(crate) fn row_gate(
        &self,
        x: &CudaSlice<f32>,
        g: &CudaSlice<f32>,
        n: usize,
        width: usize,
    ) -> Result<(), CudaError> {
        let len = n * width;
        if x.len() < len || g.len() < n {
            return Err(too_small("row gate"));
        }
        if len == 0 {
            return Ok(());
        }
        let (w32, n32) = (i32_of(width, "width")?, i32_of(len, "values")?);
        let mut b = self.kernel("row_gate_f32")?;
        b.arg(x).arg(g).arg(&w32).arg(&n32);
        // SAFETY: touches n × width values of x and reads the n values of g their rows
        // index (checked above).
        unsafe { b.launch(grid_1d(len)) }?;
        Ok(())
    }

    /// `x = rms_norm(x) · w · silu(z)` for `rows` rows of `w.len()` values.
    pub(crate) fn gated_norm(
        &self,
        x: &CudaSlice<f32>,
        z: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        rows: usize,
        eps: f32,
    ) -> Result<(), CudaError> {
        let dim = w.len();
        if x.len() < rows * dim || z.len() < rows * dim {
            return Err(too_small("gated norm"));
        }
        if rows == 0 {
            return Ok(());
        }
        let d32 = i32_of(dim, "width")?;
        let cfg = LaunchConfig {
            grid_dim: (i32_of(rows, "rows")? as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.kernel("gated_norm_f32")?;
        b.arg(x).arg(z).arg(w).arg(&d32).arg(&eps);
        // SAFETY: block r touches row r (dim values) of x and z, and the dim values of w;
        // x and z hold rows × dim values (checked above).
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// RMS normalisation of each run of `group` values of `rows` rows of `w.len()` values,
    /// scaled by `w`.
    pub(crate) fn group_norm(
        &self,
        x: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        rows: usize,
        group: usize,
        eps: f32,
    ) -> Result<(), CudaError> {
        let width = w.len();
        if group == 0 || !width.is_multiple_of(group) {
            return Err(CudaError::InvalidArgument(format!(
                "groups of {group} in rows of {width}"
            )));
        }
        if x.len() < rows * width {
            return Err(too_small("group norm"));
        }
        let groups = rows * (width / group);
        if groups == 0 {
            return Ok(());
        }
        let (w32, g32) = (i32_of(width, "width")?, i32_of(group, "group")?);
        let cfg = LaunchConfig {
            grid_dim: (i32_of(groups, "groups")? as u32, 1, 1),
            block_dim: (block_for(group), 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.kernel("group_norm_f32")?;
        b.arg(x).arg(w).arg(&w32).arg(&g32).arg(&eps);
        // SAFETY: block i touches group i (group values) of x and the group's run of w;
        // x holds rows × width values and groups divide width (checked above).
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// `x = max(x, 0)²` over `n` values.
    pub(crate) fn relu_sq(&self, x: &CudaSlice<f32>, n: usize) -> Result<(), CudaError> {
        if x.len() < n {
            return Err(too_small("squared ReLU"));
        }
        if n == 0 {
            return Ok(());
        }
        let n32 = i32_of(n, "values")?;
        let mut b = self.kernel("relu_sq_f32")?;
        b.arg(x).arg(&n32);
        // SAFETY: touches n values of x (checked above).
        unsafe { b.launch(grid_1d(n)) }?;
        Ok(())
    }

    /// The causal convolution and SiLU of one segment's `rows.n` rows of `c` channels with
    /// `k` taps (`w`: `c × k`, `bias`: `c` or none); `state` holds the segment's `(k-1) × c`
    /// previous inputs and keeps its last ones.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn conv1d(
        &self,
        (c, k): (usize, usize),
        x: &CudaView<'_, f32>,
        w: &CudaSlice<f32>,
        bias: Option<&CudaSlice<f32>>,
        state: &mut CudaViewMut<'_, f32>,
        out: &mut CudaViewMut<'_, f32>,
        rows: Rows,
    ) -> Result<(), CudaError> {
        let len = rows.n * c;
        if k < 2
            || w.len() != c * k
            || bias.is_some_and(|b| b.len() != c)
            || state.len() != (k - 1) * c
            || x.len() < len
            || out.len() < len
        {
            return Err(CudaError::InvalidArgument(format!(
                "convolution of {} rows of {c} channels with {k} taps",
                rows.n
            )));
        }
        if len == 0 {
            return Ok(());
        }
        let (n32, c32, k32) = (
            i32_of(rows.n, "rows")?,
            i32_of(c, "channels")?,
            i32_of(k, "taps")?,
        );
        let fresh = i32::from(rows.fresh);
        // Both variants keep one sum order (taps, then the bias): a bias of zero is not the
        // same bits as no bias (-0 + 0 is +0).
        let mut b = self.kernel(if bias.is_some() {
            "conv1d_bias_f32"
        } else {
            "conv1d_f32"
        })?;
        b.arg(x).arg(w);
        if let Some(bias) = bias {
            b.arg(bias);
        }
        b.arg(state)
            .arg(out)
            .arg(&n32)
            .arg(&c32)
            .arg(&k32)
            .arg(&fresh);
        // SAFETY: thread ch reads rows × c values of x, c × k of w and c of the bias, and
        // touches (k-1) × c values of state and rows × c of out, all within their lengths
        // (checked above).
        unsafe { b.launch(grid_1d(c)) }?;
        Ok(())
    }

    /// The gated delta rule over one segment's `rows.n` rows: `qkv` holds `conv_channels`
    /// values a row, `beta` and `alpha` `v_heads`, `a` and `dt_bias` one value per value
    /// head; `state` holds the value heads' matrices (`v_heads × k_dim × v_dim`) and keeps
    /// the result; `out` gets `v_heads × v_dim` values a row.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn delta_rule(
        &self,
        s: &DeltaNetShape,
        qkv: &CudaView<'_, f32>,
        (beta, alpha): (&CudaView<'_, f32>, &CudaView<'_, f32>),
        (a, dt_bias): (&CudaSlice<f32>, &CudaSlice<f32>),
        state: &mut CudaViewMut<'_, f32>,
        out: &mut CudaViewMut<'_, f32>,
        rows: Rows,
    ) -> Result<(), CudaError> {
        let (kh, nv, dk, dv) = (s.k_heads, s.v_heads, s.k_dim, s.v_dim);
        let n = rows.n;
        if kh == 0
            || dk == 0
            || dv == 0
            || dk > DELTA_MAX_K_DIM
            || !nv.is_multiple_of(kh)
            || nv == 0
            || a.len() != nv
            || dt_bias.len() != nv
            || state.len() != nv * dk * dv
            || qkv.len() < n * s.conv_channels()
            || beta.len() < n * nv
            || alpha.len() < n * nv
            || out.len() < n * nv * dv
        {
            return Err(CudaError::InvalidArgument(format!(
                "delta rule of {n} rows: {kh} key heads of {dk}, {nv} value heads of {dv}"
            )));
        }
        if n == 0 {
            return Ok(());
        }
        // Each size below is at most one of these, which the kernel indexes in i32.
        i32_of(n * s.conv_channels(), "values")?;
        i32_of(dk * dv, "state values")?;
        let fresh = i32::from(rows.fresh);
        let args = [n, kh, nv, dk, dv].map(|v| v as i32);
        let cfg = LaunchConfig {
            grid_dim: (nv as u32, 1, 1),
            block_dim: (block_for(dv.max(dk)), 1, 1),
            shared_mem_bytes: (2 * dk * std::mem::size_of::<f32>()) as u32,
        };
        let mut b = self.kernel("delta_rule_f32")?;
        b.arg(qkv).arg(beta).arg(alpha).arg(a).arg(dt_bias);
        b.arg(state).arg(out);
        for v in &args {
            b.arg(v);
        }
        b.arg(&fresh);
        // SAFETY: block h reads rows × conv_channels values of qkv and rows × v_heads of
        // beta and alpha, value h of a and dt_bias, touches matrix h (k_dim × v_dim) of
        // state and writes column block h of rows × v_heads × v_dim of out, all within
        // their lengths (checked above); the shared memory holds the 2 × k_dim floats it
        // indexes.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// The Mamba-2 selective scan over one segment's `rows.n` rows: `xbc` holds
    /// `conv_channels` values a row, `dt` `n_heads`, `(a, d, dt_bias)` one value per head,
    /// `dt_min` the floor of the time steps; `state` holds the heads' matrices (`n_heads ×
    /// head_dim × d_state`) and keeps the result; `out` gets `inner` values a row.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn ssm_scan(
        &self,
        s: &Mamba2Shape,
        xbc: &CudaView<'_, f32>,
        dt: &CudaView<'_, f32>,
        (a, d, dt_bias, dt_min): (&CudaSlice<f32>, &CudaSlice<f32>, &CudaSlice<f32>, f32),
        state: &mut CudaViewMut<'_, f32>,
        out: &mut CudaViewMut<'_, f32>,
        rows: Rows,
    ) -> Result<(), CudaError> {
        let (nh, hd, ng, ds) = (s.n_heads, s.head_dim, s.n_groups, s.d_state);
        let n = rows.n;
        if nh == 0
            || ng == 0
            || hd == 0
            || ds == 0
            || !nh.is_multiple_of(ng)
            || [a.len(), d.len(), dt_bias.len()] != [nh; 3]
            || state.len() != nh * hd * ds
            || xbc.len() < n * s.conv_channels()
            || dt.len() < n * nh
            || out.len() < n * s.inner()
        {
            return Err(CudaError::InvalidArgument(format!(
                "selective scan of {n} rows: {nh} heads of {hd} in {ng} groups of {ds}"
            )));
        }
        if n == 0 {
            return Ok(());
        }
        // Each size below is at most one of these, which the kernel indexes in i32.
        i32_of(n * s.conv_channels(), "values")?;
        let fresh = i32::from(rows.fresh);
        let args = [n, nh, hd, ng, ds].map(|v| v as i32);
        let cfg = LaunchConfig {
            grid_dim: (nh as u32, 1, 1),
            block_dim: (block_for(hd), 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.kernel("ssm_scan_f32")?;
        b.arg(xbc).arg(dt).arg(a).arg(d).arg(dt_bias);
        b.arg(state).arg(out);
        for v in &args {
            b.arg(v);
        }
        b.arg(&dt_min);
        b.arg(&fresh);
        // SAFETY: block h reads rows × conv_channels values of xbc and rows × n_heads of
        // dt, value h of a, d and dt_bias, touches matrix h (head_dim × d_state) of state
        // and writes head h of rows × inner values of out, all within their lengths
        // (checked above).
        unsafe { b.launch(cfg) }?;
        Ok(())
    }
}
