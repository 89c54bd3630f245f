//! Host-level wrappers of each kernel: upload the inputs, run one op, download the result.
//! Slow (a round trip per call) and meant for checking every kernel against the CPU on
//! boundary shapes, as the GPU test lane does.

use ferrite_gguf::GgmlType;
use ferrite_model::Activation;
use ferrite_model::ops::RopeStyle;

use crate::{AttnShape, CudaBackend, CudaError};

impl CudaBackend {
    /// `W · x` for a `rows × cols` matrix of `ty` stored as GGUF blocks in `w`.
    pub fn matvec_host(
        &self,
        ty: GgmlType,
        w: &[u8],
        rows: usize,
        cols: usize,
        x: &[f32],
    ) -> Result<Vec<f32>, CudaError> {
        let m = self.upload_matrix(ty, rows, cols, w)?;
        if x.len() != cols {
            return Err(CudaError::InvalidArgument(format!(
                "x has {} values, not {cols}",
                x.len()
            )));
        }
        let xd = self.stream.clone_htod(x)?;
        let y = self.stream.alloc_zeros::<f32>(rows)?;
        self.matvec(&m, &xd, &y)?;
        Ok(self.stream.clone_dtoh(&y)?)
    }

    /// `act(Wg · x) · (Wu · x)` for two `rows × cols` matrices of `ty` (the fused FFN input).
    #[allow(clippy::too_many_arguments)]
    pub fn gated_matvec_host(
        &self,
        act: Activation,
        ty: GgmlType,
        wg: &[u8],
        wu: &[u8],
        rows: usize,
        cols: usize,
        x: &[f32],
    ) -> Result<Vec<f32>, CudaError> {
        let g = self.upload_matrix(ty, rows, cols, wg)?;
        let u = self.upload_matrix(ty, rows, cols, wu)?;
        if x.len() != cols {
            return Err(CudaError::InvalidArgument(format!(
                "x has {} values, not {cols}",
                x.len()
            )));
        }
        let xd = self.stream.clone_htod(x)?;
        let y = self.stream.alloc_zeros::<f32>(rows)?;
        let scratch = self.stream.alloc_zeros::<f32>(rows)?;
        self.matvec_gated(act, &g, &u, &xd, &y, &scratch)?;
        Ok(self.stream.clone_dtoh(&y)?)
    }

    /// The fused end of a sub-layer: returns `(x + post_norm?(o), rms_norm(that) · next_w)`.
    pub fn residual_norm_host(
        &self,
        x: &[f32],
        o: &[f32],
        post_w: Option<&[f32]>,
        next_w: &[f32],
        eps: f32,
    ) -> Result<(Vec<f32>, Vec<f32>), CudaError> {
        let n = next_w.len();
        if x.len() != n || o.len() != n || post_w.is_some_and(|p| p.len() != n) {
            return Err(CudaError::InvalidArgument(
                "residual_norm lengths differ".into(),
            ));
        }
        let xd = self.stream.clone_htod(x)?;
        let od = self.stream.clone_htod(o)?;
        let pd = post_w.map(|p| self.stream.clone_htod(p)).transpose()?;
        let wd = self.stream.clone_htod(next_w)?;
        let xn = self.stream.alloc_zeros::<f32>(n)?;
        self.residual_norm(&xd, &od, pd.as_ref(), &wd, &xn, 1, eps)?;
        Ok((self.stream.clone_dtoh(&xd)?, self.stream.clone_dtoh(&xn)?))
    }

    /// Row `token` of a `rows × cols` matrix of `ty`, times `scale`.
    pub fn embed_host(
        &self,
        ty: GgmlType,
        w: &[u8],
        rows: usize,
        cols: usize,
        token: u32,
        scale: f32,
    ) -> Result<Vec<f32>, CudaError> {
        let m = self.upload_matrix(ty, rows, cols, w)?;
        if token as usize >= rows {
            return Err(CudaError::InvalidArgument(format!(
                "token {token} outside a vocabulary of {rows}"
            )));
        }
        let tp = self.stream.clone_htod(&[token as i32, 0])?;
        let y = self.stream.alloc_zeros::<f32>(cols)?;
        self.embed(&m, &tp, 1, scale, &y)?;
        Ok(self.stream.clone_dtoh(&y)?)
    }

    /// RMSNorm of every `w.len()`-value row of `x`.
    pub fn rms_norm_host(&self, x: &[f32], w: &[f32], eps: f32) -> Result<Vec<f32>, CudaError> {
        if w.is_empty() || !x.len().is_multiple_of(w.len()) {
            return Err(CudaError::InvalidArgument(
                "x is not whole rows of w".into(),
            ));
        }
        let xd = self.stream.clone_htod(x)?;
        let wd = self.stream.clone_htod(w)?;
        self.rms_norm(&xd, &wd, &xd, x.len() / w.len(), eps)?;
        Ok(self.stream.clone_dtoh(&xd)?)
    }

    /// Rope of every `head_dim`-value head of `x` at `pos`.
    pub fn rope_host(
        &self,
        x: &[f32],
        head_dim: usize,
        pos: usize,
        base: f32,
        style: RopeStyle,
    ) -> Result<Vec<f32>, CudaError> {
        if head_dim < 2 || !head_dim.is_multiple_of(2) || !x.len().is_multiple_of(head_dim) {
            return Err(CudaError::InvalidArgument(
                "x is not whole even heads".into(),
            ));
        }
        let xd = self.stream.clone_htod(x)?;
        self.rope(&xd, x.len() / head_dim, head_dim, pos, base, style)?;
        Ok(self.stream.clone_dtoh(&xd)?)
    }

    /// `act(g) · u`.
    pub fn gated_host(&self, act: Activation, g: &[f32], u: &[f32]) -> Result<Vec<f32>, CudaError> {
        if g.len() != u.len() {
            return Err(CudaError::InvalidArgument(
                "g and u differ in length".into(),
            ));
        }
        let gd = self.stream.clone_htod(g)?;
        let ud = self.stream.clone_htod(u)?;
        self.gated(act, &gd, &ud, g.len())?;
        Ok(self.stream.clone_dtoh(&gd)?)
    }

    /// `x + y`.
    pub fn add_host(&self, x: &[f32], y: &[f32]) -> Result<Vec<f32>, CudaError> {
        if x.len() != y.len() {
            return Err(CudaError::InvalidArgument(
                "x and y differ in length".into(),
            ));
        }
        let xd = self.stream.clone_htod(x)?;
        let yd = self.stream.clone_htod(y)?;
        self.add(&xd, &yd, x.len())?;
        Ok(self.stream.clone_dtoh(&xd)?)
    }

    /// Attention of the `nq = q.len() / (n_head × head_dim)` queries at the last `nq`
    /// positions over keys and values of every position so far (row-major `[pos][kv_dim]`),
    /// which go through the f16 cache store kernel first; keys split over `splits` blocks.
    pub fn attention_host(
        &self,
        shape: &AttnShape,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        splits: usize,
    ) -> Result<Vec<f32>, CudaError> {
        let kv_dim = shape.kv_dim();
        let n = k.len() / kv_dim;
        let qdim = shape.n_head * shape.head_dim;
        let nq = q.len() / qdim;
        if n == 0
            || k.len() != n * kv_dim
            || v.len() != k.len()
            || nq == 0
            || nq > n
            || q.len() != nq * qdim
        {
            return Err(CudaError::InvalidArgument(
                "attention inputs disagree in shape".into(),
            ));
        }
        let kc = self.stream.alloc_zeros::<u16>(n * kv_dim)?;
        let vc = self.stream.alloc_zeros::<u16>(n * kv_dim)?;
        for p in 0..n {
            let kd = self.stream.clone_htod(&k[p * kv_dim..(p + 1) * kv_dim])?;
            let vd = self.stream.clone_htod(&v[p * kv_dim..(p + 1) * kv_dim])?;
            self.kv_store(&kd, &vd, &kc, &vc, kv_dim, p)?;
        }
        let qd = self.stream.clone_htod(q)?;
        let out = self.stream.alloc_zeros::<f32>(q.len())?;
        let part = self
            .stream
            .alloc_zeros::<f32>(nq * shape.n_head * splits.max(1) * (shape.head_dim + 2))?;
        let tp = self.stream.clone_htod(&[0i32, (n - nq) as i32])?;
        self.attention(shape, &qd, &kc, &vc, &out, &part, &tp, nq, splits)?;
        Ok(self.stream.clone_dtoh(&out)?)
    }

    /// `x · Wᵀ` for `n = x.len() / cols` token rows and a `rows × cols` matrix of `ty`,
    /// through the batched-prefill path (f16 dequantization, f16 activations, cuBLAS).
    pub fn matmul_host(
        &self,
        ty: GgmlType,
        w: &[u8],
        rows: usize,
        cols: usize,
        x: &[f32],
    ) -> Result<Vec<f32>, CudaError> {
        let m = self.upload_matrix(ty, rows, cols, w)?;
        let n = x.len() / cols;
        if n == 0 || x.len() != n * cols {
            return Err(CudaError::InvalidArgument(format!(
                "x has {} values, not rows of {cols}",
                x.len()
            )));
        }
        let xd = self.stream.clone_htod(x)?;
        let x16 = self.stream.alloc_zeros::<u16>(n * cols)?;
        let w16 = self.stream.alloc_zeros::<u16>(rows * cols)?;
        let y = self.stream.alloc_zeros::<f32>(n * rows)?;
        self.to_f16(&xd, &x16, n * cols)?;
        self.matmul(&m, &x16, n, &y, &w16)?;
        Ok(self.stream.clone_dtoh(&y)?)
    }
}
