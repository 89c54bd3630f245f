//! Kernel launches on device buffers (used by the forward pass) and host-level wrappers of
//! each op (upload, run, download) that the GPU test lane compares with the CPU. The
//! attention launches and their geometry are in `attn_ops`.
//!
//! In-place kernels take the same buffer as input and output, so every device buffer is
//! passed by shared reference: the device memory is written by the kernel, never through a
//! host view while a launch is pending (all work is on one stream).

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use ferrite_gguf::GgmlType;
use ferrite_model::Activation;
use ferrite_model::ops::RopeStyle;

use crate::attn_ops::AttnShape;
use crate::device::{grid_1d, i8_kernels, kernel_suffix, row_multiple, weight_kernels};
use crate::{CudaBackend, CudaError};

/// Rows per block of the matvec kernels (one warp each).
const MATVEC_ROWS_PER_BLOCK: usize = 4;

pub(crate) fn i32_of(v: usize, what: &str) -> Result<i32, CudaError> {
    i32::try_from(v).map_err(|_| CudaError::InvalidArgument(format!("{what} {v} is too large")))
}

/// Rows from which a warp takes several rows at once (`MV_MAX_ROWS` in matvec.cu for the
/// plain product, two for the gated one): large matrices, where the activation loads from
/// L1, not DRAM, limit a one-row warp, and there are still enough warps to fill the device.
const MULTI_ROW_FROM: usize = 2048;

/// Rows per warp of the plain and the gated matvec for a matrix of `rows` rows: the most
/// for very tall matrices, two for tall ones, else one.
fn rows_per_warp(rows: usize, max: usize) -> usize {
    if rows >= 4 * MULTI_ROW_FROM {
        max
    } else if rows >= MULTI_ROW_FROM {
        2.min(max)
    } else {
        1
    }
}

/// Widest row of `residual_norm_f32`: RN_PER_THREAD values for each of its 1024 threads.
pub(crate) const RESIDUAL_NORM_MAX_DIM: usize = 8 * 1024;

/// Warps in flight the plain matvec aims for (132 SMs × 32).
const MATVEC_WARPS_WANTED: usize = 4224;

/// Warps sharing each row group of the plain matvec (1, 2 or 4): enough for
/// MATVEC_WARPS_WANTED warps, but never so many that a lane has no unit of the row.
fn warps_per_row(rows: usize, nr: usize, units: usize) -> usize {
    let want = (MATVEC_WARPS_WANTED * nr).div_ceil(rows.max(1));
    let most = (units / 32).clamp(1, MATVEC_ROWS_PER_BLOCK);
    let mut ks = 1;
    while ks < want && ks * 2 <= most {
        ks *= 2;
    }
    ks
}

/// log2 of the values per unit of the matvec kernels (SH in matvec.cu).
fn unit_shift(ty: GgmlType) -> usize {
    if ty == GgmlType::Q4_K { 6 } else { 5 }
}

/// Launch shape of the matvec kernels for `rows` rows, `nr` per warp.
fn matvec_grid(rows: usize, nr: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows.div_ceil(MATVEC_ROWS_PER_BLOCK * nr) as u32, 1, 1),
        block_dim: (32 * MATVEC_ROWS_PER_BLOCK as u32, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Warps sharing each row of the plain matvec of `w` (its `ks`). The batched products
/// (model/batch.rs) split their sums the same way, so each column equals this product.
pub(crate) fn matvec_split(w: &DeviceMatrix) -> usize {
    warps_per_row(w.rows, rows_per_warp(w.rows, 4), w.cols >> unit_shift(w.ty))
}

/// Bytes of `n` activations as int8 blocks in `planes` planes: the planes, then an f32
/// pair per 32 values.
pub(crate) fn act_q8_bytes(n: usize, planes: usize) -> usize {
    planes * n + n / 4
}

/// A product input quantized to int8 blocks (see [`CudaBackend::quantize_act`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ActQ<'a> {
    /// The planes and the per-block scales.
    pub(crate) buf: &'a CudaSlice<u8>,
    /// Int8 planes: 1 or 2.
    pub(crate) planes: usize,
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
    /// A dequantized f16 copy (row-major) kept for prefill GEMMs when memory allows.
    pub(crate) f16: Option<CudaSlice<u16>>,
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
            f16: None,
        })
    }

    /// `y[..rows] = W · x[..cols]`; with `xq` (x as int8 blocks, see
    /// [`CudaBackend::quantize_act`]) and a weight type that has int8 kernels, the product
    /// takes those instead of `x`.
    pub(crate) fn matvec(
        &self,
        w: &DeviceMatrix,
        x: &CudaSlice<f32>,
        xq: Option<ActQ<'_>>,
        y: &CudaSlice<f32>,
    ) -> Result<(), CudaError> {
        let i8k = xq.and_then(|q| Some((q.buf, i8_kernels(w.ty, q.planes)?)));
        let name = match i8k {
            Some((_, k)) => k.matvec,
            None => weight_kernels(w.ty).map_or("none", |k| k.matvec),
        };
        let (rows, cols) = (w.rows as i32, w.cols as i32);
        let nr = rows_per_warp(w.rows, 4);
        let ks = matvec_split(w);
        let (nr32, ks32) = (nr as i32, ks as i32);
        let mut cfg = matvec_grid(w.rows, nr);
        cfg.grid_dim.0 = (w.rows.div_ceil(nr) * ks).div_ceil(MATVEC_ROWS_PER_BLOCK) as u32;
        let mut b = self.kernel(name)?;
        b.arg(&w.data);
        match i8k {
            Some((q, _)) => b.arg(q),
            None => b.arg(x),
        };
        b.arg(y)
            .arg(&rows)
            .arg(&cols)
            .arg(&w.row_bytes)
            .arg(&nr32)
            .arg(&ks32);
        // SAFETY: the kernel reads rows × row_bytes bytes of `w.data` (checked at upload),
        // cols values of `x` (or their int8 blocks in `xq`) and writes rows values of `y`;
        // callers size x, xq and y for that.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// `xq` = the `n` values of `x` as int8 blocks of 32 in `xq.planes` planes (plane p at
    /// bytes `p·n..(p+1)·n`) followed by one `(d, d·Σ)` f32 pair per block: what the int8
    /// decode products read (matvec_i8.cu).
    pub(crate) fn quantize_act(
        &self,
        x: &CudaSlice<f32>,
        xq: ActQ<'_>,
        n: usize,
    ) -> Result<(), CudaError> {
        if !n.is_multiple_of(32)
            || !(1..=2).contains(&xq.planes)
            || x.len() < n
            || xq.buf.len() < act_q8_bytes(n, xq.planes)
        {
            return Err(CudaError::InvalidArgument(format!(
                "int8 activations of {n} values in {} planes",
                xq.planes
            )));
        }
        let n32 = i32_of(n, "activations")?;
        let planes = xq.planes as i32;
        let mut b = self.kernel("quantize_q8_f32")?;
        b.arg(x).arg(xq.buf).arg(&n32).arg(&planes);
        // SAFETY: reads n values of x and writes act_q8_bytes(n, planes) bytes of xq
        // (checked above).
        unsafe { b.launch(grid_1d(n)) }?;
        Ok(())
    }

    /// `ys[i] = ws[i] · x` for two or three matrices; one launch when they share type and
    /// width, else one per matrix.
    pub(crate) fn matvec_multi(
        &self,
        ws: &[&DeviceMatrix],
        x: &CudaSlice<f32>,
        xq: Option<ActQ<'_>>,
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
                self.matvec(w, x, xq, y)?;
            }
            return Ok(());
        };
        let i8k = xq.and_then(|q| Some((q.buf, i8_kernels(first.ty, q.planes)?)));
        let rows = |i: usize| ws.get(i).map_or(0, |w| w.rows as i32);
        let (r0, r1, r2) = (rows(0), rows(1), rows(2));
        let w = |i: usize| &ws.get(i).unwrap_or(first).data;
        let y = |i: usize| *ys.get(i).unwrap_or(&ys[0]);
        let cols = first.cols as i32;
        let total = ws.iter().map(|w| w.rows).sum::<usize>();
        let mut b = self.kernel(i8k.map_or(k.matvec3, |(_, k8)| k8.matvec3))?;
        b.arg(w(0)).arg(w(1)).arg(w(2));
        match i8k {
            Some((q, _)) => b.arg(q),
            None => b.arg(x),
        };
        b.arg(y(0))
            .arg(y(1))
            .arg(y(2))
            .arg(&r0)
            .arg(&r1)
            .arg(&r2)
            .arg(&cols)
            .arg(&first.row_bytes);
        // SAFETY: matrix i (absent ones have 0 rows and are never read) gets rows r_i of
        // row_bytes each, all checked at upload; x has cols values and y_i r_i values.
        unsafe { b.launch(matvec_grid(total, 1)) }?;
        Ok(())
    }

    /// `y = act(Wg·x) · (Wu·x)`: one launch when the two share type and shape, else two
    /// products and an element-wise pass that uses `scratch` for `Wu·x`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn matvec_gated(
        &self,
        act: Activation,
        wg: &DeviceMatrix,
        wu: &DeviceMatrix,
        x: &CudaSlice<f32>,
        xq: Option<ActQ<'_>>,
        y: &CudaSlice<f32>,
        scratch: &CudaSlice<f32>,
    ) -> Result<(), CudaError> {
        let same = wg.ty == wu.ty && wg.rows == wu.rows && wg.cols == wu.cols;
        let Some(k) = weight_kernels(wg.ty).filter(|_| same) else {
            self.matvec(wg, x, xq, y)?;
            self.matvec(wu, x, xq, scratch)?;
            return self.gated(act, y, scratch, wg.rows);
        };
        let i8k = xq.and_then(|q| Some((q.buf, i8_kernels(wg.ty, q.planes)?)));
        let (rows, cols) = (wg.rows as i32, wg.cols as i32);
        let a = crate::arch_ops::act_code(act)?;
        let nr = rows_per_warp(wg.rows, 2);
        let nr32 = nr as i32;
        let mut b = self.kernel(i8k.map_or(k.gated, |(_, k8)| k8.gated))?;
        b.arg(&wg.data).arg(&wu.data);
        match i8k {
            Some((q, _)) => b.arg(q),
            None => b.arg(x),
        };
        b.arg(y)
            .arg(&rows)
            .arg(&cols)
            .arg(&wg.row_bytes)
            .arg(&a)
            .arg(&nr32);
        // SAFETY: both matrices have rows × row_bytes bytes (same shape, checked at
        // upload); x has cols values and y rows values.
        unsafe { b.launch(matvec_grid(wg.rows, nr)) }?;
        Ok(())
    }

    /// End of a sub-layer over `rows` token rows: `x += post_norm?(o)`, then
    /// `xn = rms_norm(x) · next_w`; with `xq` (one row only), also xn as int8 blocks (see
    /// [`CudaBackend::quantize_act`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn residual_norm(
        &self,
        x: &CudaSlice<f32>,
        o: &CudaSlice<f32>,
        post_w: Option<&CudaSlice<f32>>,
        next_w: &CudaSlice<f32>,
        xn: &CudaSlice<f32>,
        xq: Option<ActQ<'_>>,
        rows: usize,
        eps: f32,
    ) -> Result<(), CudaError> {
        let dim = next_w.len() as i32;
        if next_w.len() > RESIDUAL_NORM_MAX_DIM {
            return Err(CudaError::InvalidArgument(format!(
                "residual_norm rows of {dim} values (at most {RESIDUAL_NORM_MAX_DIM})"
            )));
        }
        if [x.len(), o.len(), xn.len()]
            .iter()
            .any(|&l| l < rows * next_w.len())
        {
            return Err(CudaError::InvalidArgument(format!(
                "residual_norm buffers smaller than {rows} rows"
            )));
        }
        if xq.is_some_and(|q| {
            rows != 1
                || !next_w.len().is_multiple_of(32)
                || !(1..=2).contains(&q.planes)
                || q.buf.len() < act_q8_bytes(next_w.len(), q.planes)
        }) {
            return Err(CudaError::InvalidArgument(format!(
                "int8 activations of {rows} rows of {dim}"
            )));
        }
        let has_post = i32::from(post_w.is_some());
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
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
        let null = 0u64;
        let planes = xq.map_or(0, |q| q.planes as i32);
        match xq {
            Some(q) => b.arg(q.buf),
            None => b.arg(&null),
        };
        b.arg(&planes);
        // SAFETY: every buffer holds rows × dim values (checked above); xq, when given (a
        // null pointer otherwise, which the kernel tests), holds act_q8_bytes(dim, planes)
        // bytes.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// Rope of `n` tokens' q and k at positions `tp[1]..tp[1]+n` and the f16 store of their
    /// k and v at those cache rows; the first `rot_dim` values of each head turn (all of
    /// them for full rope); with `factors` (`rot_dim / 2` Llama 3 divisors), the
    /// scaled-frequency rope.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn rope_store(
        &self,
        n: usize,
        (shape, rot_dim): (&AttnShape, usize),
        q: &CudaSlice<f32>,
        k: &CudaSlice<f32>,
        v: &CudaSlice<f32>,
        kc: &CudaSlice<u16>,
        vc: &CudaSlice<u16>,
        tp: &CudaSlice<i32>,
        base: f32,
        style: RopeStyle,
        factors: Option<&CudaSlice<f32>>,
    ) -> Result<(), CudaError> {
        let kv_dim = shape.kv_dim();
        check_rot(rot_dim, shape.head_dim)?;
        if factors.is_some_and(|f| f.len() < rot_dim / 2) {
            return Err(CudaError::InvalidArgument(
                "fewer rope factors than rot_dim / 2".into(),
            ));
        }
        if kc.len() != vc.len() {
            return Err(CudaError::InvalidArgument("K and V caches differ".into()));
        }
        let (nh, nkv, hd) = (
            shape.n_head as i32,
            shape.n_kv_head as i32,
            shape.head_dim as i32,
        );
        let half = i32::from(style == RopeStyle::HalfSplit);
        let rot = rot_dim as i32;
        let threads = ((shape.n_head + shape.n_kv_head) * rot_dim / 2).max(kv_dim);
        if q.len() < n * shape.n_head * shape.head_dim
            || k.len() < n * kv_dim
            || v.len() < n * kv_dim
        {
            return Err(CudaError::InvalidArgument(format!(
                "rope_store buffers below {n} rows"
            )));
        }
        let mut cfg = grid_1d(threads);
        cfg.grid_dim.1 = n as u32;
        let name = if factors.is_some() {
            "rope_store_scaled_f16"
        } else {
            "rope_store_f16"
        };
        let mut b = self.kernel(name)?;
        b.arg(q)
            .arg(k)
            .arg(v)
            .arg(kc)
            .arg(vc)
            .arg(&nh)
            .arg(&nkv)
            .arg(&hd)
            .arg(&rot)
            .arg(tp)
            .arg(&base)
            .arg(&half);
        if let Some(f) = factors {
            b.arg(f);
        }
        // SAFETY: touches n rows of n_head × head_dim values of q and kv_dim of k and v
        // (checked above), and rows tp[1]..tp[1]+n of both caches; callers keep those below
        // the cache's rows. rot_dim ≤ head_dim and the factors hold rot_dim / 2 values
        // (checked above).
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// Row `i` of `y` = `scale · W[tokens[i], :]` for `i < n`; the caller checks the tokens
    /// against the rows (decode passes `tp`, whose first value is the token).
    pub(crate) fn embed(
        &self,
        w: &DeviceMatrix,
        tokens: &CudaSlice<i32>,
        n: usize,
        scale: f32,
        y: &CudaSlice<f32>,
    ) -> Result<(), CudaError> {
        if tokens.len() < n || y.len() < n * w.cols {
            return Err(CudaError::InvalidArgument(format!(
                "embed buffers below {n} rows"
            )));
        }
        let name = weight_kernels(w.ty).map_or("none", |k| k.embed);
        let cols = w.cols as i32;
        let mut cfg = grid_1d(w.cols);
        cfg.grid_dim.1 = n as u32;
        let mut b = self.kernel(name)?;
        b.arg(&w.data)
            .arg(y)
            .arg(tokens)
            .arg(&cols)
            .arg(&w.row_bytes)
            .arg(&scale);
        // SAFETY: reads n rows (callers keep the tokens < rows) and writes n × cols values
        // of y (checked above).
        unsafe { b.launch(cfg) }?;
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

    /// Rope in place over `n_heads` heads at position `pos`, turning the first `rot_dim`
    /// values of each head.
    pub(crate) fn rope(
        &self,
        x: &CudaSlice<f32>,
        n_heads: usize,
        (head_dim, rot_dim): (usize, usize),
        pos: usize,
        (base, style): (f32, RopeStyle),
        factors: Option<&CudaSlice<f32>>,
    ) -> Result<(), CudaError> {
        check_rot(rot_dim, head_dim)?;
        if x.len() < n_heads * head_dim {
            return Err(CudaError::InvalidArgument(format!(
                "rope of {n_heads} heads of {head_dim}: buffer too small"
            )));
        }
        if factors.is_some_and(|f| f.len() < rot_dim / 2) {
            return Err(CudaError::InvalidArgument(format!(
                "fewer than {} rope frequency factors",
                rot_dim / 2
            )));
        }
        let (nh, hd, p) = (n_heads as i32, head_dim as i32, i32_of(pos, "position")?);
        let (rot, half) = (rot_dim as i32, i32::from(style == RopeStyle::HalfSplit));
        let null = 0u64;
        let mut b = self.kernel("rope_f32")?;
        b.arg(x)
            .arg(&nh)
            .arg(&hd)
            .arg(&rot)
            .arg(&p)
            .arg(&base)
            .arg(&half);
        match factors {
            Some(f) => b.arg(f),
            None => b.arg(&null),
        };
        // SAFETY: touches the first rot_dim ≤ head_dim values of n_heads heads of x and
        // reads rot_dim / 2 factors when they are given (both checked above).
        unsafe { b.launch(grid_1d(n_heads * rot_dim / 2)) }?;
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
        let name = match crate::arch_ops::act_code(act)? {
            0 => "gate_silu_f32",
            1 => "gate_gelu_f32",
            _ => "gate_swiglu_oai_f32",
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

    /// Stores one token's `k`, `v` (kv_dim values) as f16 at row `pos` of the caches;
    /// `k` alone into a store without value rows (`vc` none: values in the keys).
    pub(crate) fn kv_store(
        &self,
        k: &CudaSlice<f32>,
        (v, vc): (&CudaSlice<f32>, Option<&CudaSlice<u16>>),
        kc: &CudaSlice<u16>,
        kv_dim: usize,
        pos: usize,
    ) -> Result<(), CudaError> {
        if (pos + 1) * kv_dim > kc.len() || vc.is_some_and(|vc| kc.len() != vc.len()) {
            return Err(CudaError::InvalidArgument(format!(
                "KV row {pos} outside the cache"
            )));
        }
        let (d, p) = (kv_dim as i32, pos as i32);
        let null = 0u64;
        let mut b = self.kernel("kv_store_f16")?;
        b.arg(k).arg(v).arg(kc);
        match vc {
            Some(vc) => b.arg(vc),
            None => b.arg(&null),
        };
        b.arg(&d).arg(&p);
        // SAFETY: writes row pos of kc and, when given, of vc, inside them (checked above).
        unsafe { b.launch(grid_1d(kv_dim)) }?;
        Ok(())
    }
}

/// Refuses a rotated part that is odd, empty or wider than the head.
fn check_rot(rot_dim: usize, head_dim: usize) -> Result<(), CudaError> {
    if rot_dim == 0 || !rot_dim.is_multiple_of(2) || rot_dim > head_dim {
        return Err(CudaError::InvalidArgument(format!(
            "rope over {rot_dim} of {head_dim} values per head"
        )));
    }
    Ok(())
}
