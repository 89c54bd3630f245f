//! Kernel launches on device buffers (used by the forward pass) and host-level wrappers of
//! each op (upload, run, download) that the GPU test lane compares with the CPU.
//!
//! In-place kernels take the same buffer as input and output, so every device buffer is
//! passed by shared reference: the device memory is written by the kernel, never through a
//! host view while a launch is pending (all work is on one stream).

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use ferrite_gguf::GgmlType;
use ferrite_model::Activation;
use ferrite_model::ops::RopeStyle;

use crate::device::{grid_1d, kernel_suffix, row_multiple, weight_kernels};
use crate::{CudaBackend, CudaError};

/// Rows per block of the matvec kernels (one warp each).
const MATVEC_ROWS_PER_BLOCK: usize = 4;
/// Largest head size the attention kernel's shared query buffer holds.
pub(crate) const MAX_HEAD_DIM: usize = 512;

fn i32_of(v: usize, what: &str) -> Result<i32, CudaError> {
    i32::try_from(v).map_err(|_| CudaError::InvalidArgument(format!("{what} {v} is too large")))
}

/// Launch shape of the matvec kernels for `rows` rows.
fn matvec_grid(rows: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows.div_ceil(MATVEC_ROWS_PER_BLOCK) as u32, 1, 1),
        block_dim: (32 * MATVEC_ROWS_PER_BLOCK as u32, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Checks that a `rows × cols` matrix of `ty` fits the kernels; returns its row bytes.
pub(crate) fn check_matrix(ty: GgmlType, rows: usize, cols: usize) -> Result<u64, CudaError> {
    if kernel_suffix(ty).is_none() {
        return Err(CudaError::UnsupportedType {
            name: "matrix".into(),
            ty,
        });
    }
    if rows == 0 || cols == 0 || !cols.is_multiple_of(row_multiple(ty)) {
        return Err(CudaError::InvalidArgument(format!(
            "{ty} matrix {rows}×{cols}: rows must be > 0 and cols a multiple of {}",
            row_multiple(ty)
        )));
    }
    i32_of(rows, "rows")?;
    i32_of(cols, "cols")?;
    ty.row_bytes(cols as u64)
        .ok_or_else(|| CudaError::InvalidArgument(format!("{ty}: {cols} is not whole blocks")))
}

/// A weight matrix on the device in its GGUF layout.
#[derive(Debug)]
pub(crate) struct DeviceMatrix {
    pub(crate) ty: GgmlType,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) row_bytes: u64,
    pub(crate) data: CudaSlice<u8>,
}

impl CudaBackend {
    /// Uploads `data` as a `rows × cols` matrix of `ty`.
    pub(crate) fn upload_matrix(
        &self,
        ty: GgmlType,
        rows: usize,
        cols: usize,
        data: &[u8],
    ) -> Result<DeviceMatrix, CudaError> {
        let row_bytes = check_matrix(ty, rows, cols)?;
        if data.len() as u64 != row_bytes * rows as u64 {
            return Err(CudaError::InvalidArgument(format!(
                "{ty} matrix {rows}×{cols} needs {} bytes, got {}",
                row_bytes * rows as u64,
                data.len()
            )));
        }
        Ok(DeviceMatrix {
            ty,
            rows,
            cols,
            row_bytes,
            data: self.stream.clone_htod(data)?,
        })
    }

    /// `y[..rows] = W · x[..cols]`.
    pub(crate) fn matvec(
        &self,
        w: &DeviceMatrix,
        x: &CudaSlice<f32>,
        y: &CudaSlice<f32>,
    ) -> Result<(), CudaError> {
        let name = weight_kernels(w.ty).map_or("none", |k| k.matvec);
        let (rows, cols) = (w.rows as i32, w.cols as i32);
        let cfg = matvec_grid(w.rows);
        let mut b = self.kernel(name)?;
        b.arg(&w.data)
            .arg(x)
            .arg(y)
            .arg(&rows)
            .arg(&cols)
            .arg(&w.row_bytes);
        // SAFETY: the kernel reads rows × row_bytes bytes of `w.data` (checked at upload),
        // cols values of `x` and writes rows values of `y`; callers size x and y for that.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// `ys[i] = ws[i] · x` for two or three matrices; one launch when they share type and
    /// width, else one per matrix.
    pub(crate) fn matvec_multi(
        &self,
        ws: &[&DeviceMatrix],
        x: &CudaSlice<f32>,
        ys: &[&CudaSlice<f32>],
    ) -> Result<(), CudaError> {
        let (Some(first), true) = (ws.first(), ws.len() == ys.len() && ws.len() <= 3) else {
            return Err(CudaError::InvalidArgument(
                "matvec_multi takes 1 to 3 matrices".into(),
            ));
        };
        let fusable = ws.iter().all(|w| w.ty == first.ty && w.cols == first.cols);
        let Some(k) = weight_kernels(first.ty).filter(|_| fusable) else {
            for (w, y) in ws.iter().zip(ys) {
                self.matvec(w, x, y)?;
            }
            return Ok(());
        };
        let rows = |i: usize| ws.get(i).map_or(0, |w| w.rows as i32);
        let (r0, r1, r2) = (rows(0), rows(1), rows(2));
        let w = |i: usize| &ws.get(i).unwrap_or(first).data;
        let y = |i: usize| *ys.get(i).unwrap_or(&ys[0]);
        let cols = first.cols as i32;
        let total = ws.iter().map(|w| w.rows).sum::<usize>();
        let mut b = self.kernel(k.matvec3)?;
        b.arg(w(0))
            .arg(w(1))
            .arg(w(2))
            .arg(x)
            .arg(y(0))
            .arg(y(1))
            .arg(y(2))
            .arg(&r0)
            .arg(&r1)
            .arg(&r2)
            .arg(&cols)
            .arg(&first.row_bytes);
        // SAFETY: matrix i (absent ones have 0 rows and are never read) gets rows r_i of
        // row_bytes each, all checked at upload; x has cols values and y_i r_i values.
        unsafe { b.launch(matvec_grid(total)) }?;
        Ok(())
    }

    /// `y = act(Wg·x) · (Wu·x)`: one launch when the two share type and shape, else two
    /// products and an element-wise pass that uses `scratch` for `Wu·x`.
    pub(crate) fn matvec_gated(
        &self,
        act: Activation,
        wg: &DeviceMatrix,
        wu: &DeviceMatrix,
        x: &CudaSlice<f32>,
        y: &CudaSlice<f32>,
        scratch: &CudaSlice<f32>,
    ) -> Result<(), CudaError> {
        let same = wg.ty == wu.ty && wg.rows == wu.rows && wg.cols == wu.cols;
        let Some(k) = weight_kernels(wg.ty).filter(|_| same) else {
            self.matvec(wg, x, y)?;
            self.matvec(wu, x, scratch)?;
            return self.gated(act, y, scratch, wg.rows);
        };
        let (rows, cols) = (wg.rows as i32, wg.cols as i32);
        let a = match act {
            Activation::Silu => 0i32,
            Activation::GeluTanh => 1,
        };
        let mut b = self.kernel(k.gated)?;
        b.arg(&wg.data)
            .arg(&wu.data)
            .arg(x)
            .arg(y)
            .arg(&rows)
            .arg(&cols)
            .arg(&wg.row_bytes)
            .arg(&a);
        // SAFETY: both matrices have rows × row_bytes bytes (same shape, checked at
        // upload); x has cols values and y rows values.
        unsafe { b.launch(matvec_grid(wg.rows)) }?;
        Ok(())
    }

    /// End of a sub-layer: `x += post_norm?(o)`, then `xn = rms_norm(x) · next_w`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn residual_norm(
        &self,
        x: &CudaSlice<f32>,
        o: &CudaSlice<f32>,
        post_w: Option<&CudaSlice<f32>>,
        next_w: &CudaSlice<f32>,
        xn: &CudaSlice<f32>,
        eps: f32,
    ) -> Result<(), CudaError> {
        let dim = next_w.len() as i32;
        let has_post = i32::from(post_w.is_some());
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1024, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.kernel("residual_norm_f32")?;
        b.arg(x)
            .arg(o)
            .arg(post_w.unwrap_or(next_w))
            .arg(&has_post)
            .arg(next_w)
            .arg(xn)
            .arg(&dim)
            .arg(&eps);
        // SAFETY: every buffer holds dim values (the session sizes them by d_model).
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// Rope of q and k at position `tp[1]` and the f16 store of k and v at that cache row.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn rope_store(
        &self,
        shape: &AttnShape,
        q: &CudaSlice<f32>,
        k: &CudaSlice<f32>,
        v: &CudaSlice<f32>,
        kc: &CudaSlice<u16>,
        vc: &CudaSlice<u16>,
        tp: &CudaSlice<i32>,
        base: f32,
        style: RopeStyle,
    ) -> Result<(), CudaError> {
        let kv_dim = shape.kv_dim();
        if kc.len() != vc.len() {
            return Err(CudaError::InvalidArgument("K and V caches differ".into()));
        }
        let (nh, nkv, hd) = (
            shape.n_head as i32,
            shape.n_kv_head as i32,
            shape.head_dim as i32,
        );
        let half = i32::from(style == RopeStyle::HalfSplit);
        let threads = ((shape.n_head + shape.n_kv_head) * shape.head_dim / 2).max(kv_dim);
        let mut b = self.kernel("rope_store_f16")?;
        b.arg(q)
            .arg(k)
            .arg(v)
            .arg(kc)
            .arg(vc)
            .arg(&nh)
            .arg(&nkv)
            .arg(&hd)
            .arg(tp)
            .arg(&base)
            .arg(&half);
        // SAFETY: touches n_head × head_dim values of q, kv_dim of k and v, and row tp[1] of
        // both caches; callers keep tp[1] below the cache's rows.
        unsafe { b.launch(grid_1d(threads)) }?;
        Ok(())
    }

    /// `y[..cols] = scale · W[tp[0], :]`; the caller checks the token against the rows.
    pub(crate) fn embed(
        &self,
        w: &DeviceMatrix,
        tp: &CudaSlice<i32>,
        scale: f32,
        y: &CudaSlice<f32>,
    ) -> Result<(), CudaError> {
        let name = weight_kernels(w.ty).map_or("none", |k| k.embed);
        let cols = w.cols as i32;
        let mut b = self.kernel(name)?;
        b.arg(&w.data)
            .arg(y)
            .arg(tp)
            .arg(&cols)
            .arg(&w.row_bytes)
            .arg(&scale);
        // SAFETY: reads one row (callers keep tp[0] < rows) and writes cols values of y.
        unsafe { b.launch(grid_1d(w.cols)) }?;
        Ok(())
    }

    /// RMSNorm of `rows` rows of `w.len()` values from `x` into `y` (may be the same).
    pub(crate) fn rms_norm(
        &self,
        x: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        y: &CudaSlice<f32>,
        rows: usize,
        eps: f32,
    ) -> Result<(), CudaError> {
        let dim = w.len() as i32;
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.kernel("rms_norm_f32")?;
        b.arg(x).arg(w).arg(y).arg(&dim).arg(&eps);
        // SAFETY: reads and writes rows × dim values; callers size x and y for that.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// Rope in place over `n_heads` heads at position `pos`.
    pub(crate) fn rope(
        &self,
        x: &CudaSlice<f32>,
        n_heads: usize,
        head_dim: usize,
        pos: usize,
        base: f32,
        style: RopeStyle,
    ) -> Result<(), CudaError> {
        let (nh, hd, p) = (n_heads as i32, head_dim as i32, i32_of(pos, "position")?);
        let half = i32::from(style == RopeStyle::HalfSplit);
        let mut b = self.kernel("rope_f32")?;
        b.arg(x).arg(&nh).arg(&hd).arg(&p).arg(&base).arg(&half);
        // SAFETY: touches n_heads × head_dim values of x.
        unsafe { b.launch(grid_1d(n_heads * head_dim / 2)) }?;
        Ok(())
    }

    /// `g = act(g) · u` over `n` values.
    pub(crate) fn gated(
        &self,
        act: Activation,
        g: &CudaSlice<f32>,
        u: &CudaSlice<f32>,
        n: usize,
    ) -> Result<(), CudaError> {
        let name = match act {
            Activation::Silu => "gate_silu_f32",
            Activation::GeluTanh => "gate_gelu_f32",
        };
        let n32 = n as i32;
        let mut b = self.kernel(name)?;
        b.arg(g).arg(u).arg(&n32);
        // SAFETY: touches n values of g and u.
        unsafe { b.launch(grid_1d(n)) }?;
        Ok(())
    }

    /// `x += y` over `n` values.
    pub(crate) fn add(
        &self,
        x: &CudaSlice<f32>,
        y: &CudaSlice<f32>,
        n: usize,
    ) -> Result<(), CudaError> {
        let n32 = n as i32;
        let mut b = self.kernel("add_f32")?;
        b.arg(x).arg(y).arg(&n32);
        // SAFETY: touches n values of x and y.
        unsafe { b.launch(grid_1d(n)) }?;
        Ok(())
    }

    /// Stores one token's `k`, `v` (kv_dim values) as f16 at row `pos` of the caches.
    pub(crate) fn kv_store(
        &self,
        k: &CudaSlice<f32>,
        v: &CudaSlice<f32>,
        kc: &CudaSlice<u16>,
        vc: &CudaSlice<u16>,
        kv_dim: usize,
        pos: usize,
    ) -> Result<(), CudaError> {
        if (pos + 1) * kv_dim > kc.len() || kc.len() != vc.len() {
            return Err(CudaError::InvalidArgument(format!(
                "KV row {pos} outside the cache"
            )));
        }
        let (d, p) = (kv_dim as i32, pos as i32);
        let mut b = self.kernel("kv_store_f16")?;
        b.arg(k).arg(v).arg(kc).arg(vc).arg(&d).arg(&p);
        // SAFETY: writes row pos of both caches, inside them (checked above).
        unsafe { b.launch(grid_1d(kv_dim)) }?;
        Ok(())
    }

    /// Decode attention of one query (n_head heads) over cache rows `..=tp[1]`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn attention(
        &self,
        shape: &AttnShape,
        q: &CudaSlice<f32>,
        kc: &CudaSlice<u16>,
        vc: &CudaSlice<u16>,
        out: &CudaSlice<f32>,
        scores: &CudaSlice<f32>,
        tp: &CudaSlice<i32>,
    ) -> Result<(), CudaError> {
        let ctx = kc.len() / shape.kv_dim().max(1);
        if scores.len() < shape.n_head * ctx {
            return Err(CudaError::InvalidArgument(format!(
                "attention scores smaller than {} heads × {ctx}",
                shape.n_head
            )));
        }
        let (nh, nkv, hd) = (
            shape.n_head as i32,
            shape.n_kv_head as i32,
            shape.head_dim as i32,
        );
        let (win, c) = (shape.window.unwrap_or(0) as i32, ctx as i32);
        let cfg = LaunchConfig {
            grid_dim: (shape.n_head as u32, 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.kernel("attn_decode_f16")?;
        b.arg(q)
            .arg(kc)
            .arg(vc)
            .arg(out)
            .arg(scores)
            .arg(&nh)
            .arg(&nkv)
            .arg(&hd)
            .arg(tp)
            .arg(&win)
            .arg(&c)
            .arg(&shape.scale);
        // SAFETY: reads rows ..=tp[1] of the caches (callers keep tp[1] < ctx), writes n_head × ctx scores and
        // n_head × head_dim outputs; head_dim ≤ MAX_HEAD_DIM is checked by AttnShape::new.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }
}

/// Attention geometry of one layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnShape {
    /// Query heads.
    pub n_head: usize,
    /// KV heads (divides n_head).
    pub n_kv_head: usize,
    /// Values per head (at most 512).
    pub head_dim: usize,
    /// Multiplier of q·k.
    pub scale: f32,
    /// Sliding window length; `None` for full causal attention.
    pub window: Option<usize>,
}

impl AttnShape {
    /// Checks the geometry against the kernel's limits.
    pub fn new(
        n_head: usize,
        n_kv_head: usize,
        head_dim: usize,
        scale: f32,
        window: Option<usize>,
    ) -> Result<AttnShape, CudaError> {
        if n_kv_head == 0
            || !n_head.is_multiple_of(n_kv_head)
            || head_dim == 0
            || head_dim > MAX_HEAD_DIM
        {
            return Err(CudaError::InvalidArgument(format!(
                "attention {n_head} heads / {n_kv_head} KV heads of {head_dim}"
            )));
        }
        Ok(AttnShape {
            n_head,
            n_kv_head,
            head_dim,
            scale,
            window,
        })
    }

    /// `n_kv_head × head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_head * self.head_dim
    }
}
