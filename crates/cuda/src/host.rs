//! Host-level wrappers of each kernel: upload the inputs, run one op, download the result.
//! Slow (a round trip per call) and meant for checking every kernel against the CPU on
//! boundary shapes, as the GPU test lane does.

use ferrite_gguf::GgmlType;
use ferrite_model::Activation;
use ferrite_model::ops::RopeStyle;

use crate::device::i8_kernels;
use crate::gemm::mmq_kernel;
use crate::model::ARGMAX_PICK_WORDS;
use crate::ops::{ActQ, act_q8_bytes};
use crate::{AttnShape, CudaBackend, CudaError, Greedy};

/// Activations as the int8 decode products read them (see [`CudaBackend::quantize_act_host`]).
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizedAct {
    /// One signed value per activation.
    pub q: Vec<i8>,
    /// The second plane (empty with one): the rounding error of `q` in 256ths of `d`.
    pub q2: Vec<i8>,
    /// Per block of 32: the scale `d` (a value is `d · (q + q2/256)`) and `d · Σ(q + q2/256)`.
    pub ds: Vec<(f32, f32)>,
}

impl QuantizedAct {
    /// From the device layout of `n` values in `planes` planes.
    fn from_device(bytes: &[u8], n: usize, planes: usize) -> QuantizedAct {
        let plane = |p: usize| bytes[p * n..(p + 1) * n].iter().map(|&b| b as i8).collect();
        let q = plane(0);
        let q2 = if planes > 1 { plane(1) } else { Vec::new() };
        let ds = bytes[planes * n..act_q8_bytes(n, planes)]
            .chunks_exact(8)
            .map(|c| {
                let f = |i: usize| f32::from_le_bytes([c[i], c[i + 1], c[i + 2], c[i + 3]]);
                (f(0), f(4))
            })
            .collect();
        QuantizedAct { q, q2, ds }
    }

    /// The values the int8 products multiply, `d · (q + q2/256)`, in f64 (exact).
    pub fn values(&self) -> Vec<f64> {
        self.q
            .iter()
            .enumerate()
            .map(|(i, &q)| {
                let lo = self.q2.get(i).map_or(0.0, |&v| f64::from(v) / 256.0);
                f64::from(self.ds[i / 32].0) * (f64::from(q) + lo)
            })
            .collect()
    }
}

/// One decode attention launch's output and, when asked for, its int8 copy.
pub type AttnOutput = (Vec<f32>, Option<QuantizedAct>);

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
        self.matvec(&m, &xd, None, &y)?;
        Ok(self.stream.clone_dtoh(&y)?)
    }

    /// The device greedy choice over `logits` (the decode path's `argmax_f32`).
    pub fn argmax_host(&self, logits: &[f32]) -> Result<Greedy, CudaError> {
        let x = self.stream.clone_htod(logits)?;
        let pick = self.stream.alloc_zeros::<i32>(ARGMAX_PICK_WORDS)?;
        self.argmax(&x, &pick)
    }

    /// `x` (a multiple of 32 values) quantized to int8 blocks in `planes` (1 or 2) planes
    /// on the device.
    pub fn quantize_act_host(&self, x: &[f32], planes: usize) -> Result<QuantizedAct, CudaError> {
        let xd = self.stream.clone_htod(x)?;
        let buf = self
            .stream
            .alloc_zeros::<u8>(act_q8_bytes(x.len(), planes))?;
        self.quantize_act(&xd, ActQ { buf: &buf, planes }, x.len())?;
        Ok(QuantizedAct::from_device(
            &self.stream.clone_dtoh(&buf)?,
            x.len(),
            planes,
        ))
    }

    /// Checks an int8 product request; returns the quantized-activation buffer.
    fn i8_input(
        &self,
        ty: GgmlType,
        planes: usize,
        x: &[f32],
        cols: usize,
    ) -> Result<
        (
            cudarc::driver::CudaSlice<f32>,
            cudarc::driver::CudaSlice<u8>,
        ),
        CudaError,
    > {
        if i8_kernels(ty, planes).is_none() || x.len() != cols {
            return Err(CudaError::InvalidArgument(format!(
                "no int8 product of {ty} in {planes} planes over {} values",
                x.len()
            )));
        }
        Ok((
            self.stream.clone_htod(x)?,
            self.stream.alloc_zeros::<u8>(act_q8_bytes(cols, planes))?,
        ))
    }

    /// `W · x` through the int8-activation kernel of `ty` (Q4_1, Q8_0, Q4_K, Q6_K) with x in
    /// `planes` planes, quantized on the device first; returns the product and that x.
    pub fn matvec_i8_host(
        &self,
        ty: GgmlType,
        planes: usize,
        w: &[u8],
        rows: usize,
        cols: usize,
        x: &[f32],
    ) -> Result<(Vec<f32>, QuantizedAct), CudaError> {
        let (xd, buf) = self.i8_input(ty, planes, x, cols)?;
        let m = self.upload_matrix(ty, rows, cols, w)?;
        let y = self.stream.alloc_zeros::<f32>(rows)?;
        let xq = ActQ { buf: &buf, planes };
        self.quantize_act(&xd, xq, cols)?;
        self.matvec(&m, &xd, Some(xq), &y)?;
        let q = QuantizedAct::from_device(&self.stream.clone_dtoh(&buf)?, cols, planes);
        Ok((self.stream.clone_dtoh(&y)?, q))
    }

    /// [`CudaBackend::gated_matvec_host`] through the int8-activation kernel; also returns
    /// the quantized x.
    #[allow(clippy::too_many_arguments)]
    pub fn gated_matvec_i8_host(
        &self,
        act: Activation,
        ty: GgmlType,
        planes: usize,
        wg: &[u8],
        wu: &[u8],
        rows: usize,
        cols: usize,
        x: &[f32],
    ) -> Result<(Vec<f32>, QuantizedAct), CudaError> {
        let (xd, buf) = self.i8_input(ty, planes, x, cols)?;
        let g = self.upload_matrix(ty, rows, cols, wg)?;
        let u = self.upload_matrix(ty, rows, cols, wu)?;
        let y = self.stream.alloc_zeros::<f32>(rows)?;
        let scratch = self.stream.alloc_zeros::<f32>(rows)?;
        let xq = ActQ { buf: &buf, planes };
        self.quantize_act(&xd, xq, cols)?;
        self.matvec_gated(act, &g, &u, &xd, Some(xq), &y, &scratch)?;
        let q = QuantizedAct::from_device(&self.stream.clone_dtoh(&buf)?, cols, planes);
        Ok((self.stream.clone_dtoh(&y)?, q))
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
        self.matvec_gated(act, &g, &u, &xd, None, &y, &scratch)?;
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
        self.residual_norm(&xd, &od, pd.as_ref(), &wd, &xn, None, 1, eps)?;
        Ok((self.stream.clone_dtoh(&xd)?, self.stream.clone_dtoh(&xn)?))
    }

    /// The fused end of a sub-layer with int8 output: returns xn (as
    /// [`CudaBackend::residual_norm_host`] does, no post norm) and its int8 blocks written by
    /// the same kernel. `next_w` holds a multiple of 32 values.
    pub fn residual_norm_q8_host(
        &self,
        x: &[f32],
        o: &[f32],
        next_w: &[f32],
        eps: f32,
        planes: usize,
    ) -> Result<(Vec<f32>, QuantizedAct), CudaError> {
        let n = next_w.len();
        if x.len() != n || o.len() != n {
            return Err(CudaError::InvalidArgument(
                "residual_norm lengths differ".into(),
            ));
        }
        let xd = self.stream.clone_htod(x)?;
        let od = self.stream.clone_htod(o)?;
        let wd = self.stream.clone_htod(next_w)?;
        let xn = self.stream.alloc_zeros::<f32>(n)?;
        let buf = self.stream.alloc_zeros::<u8>(act_q8_bytes(n, planes))?;
        self.residual_norm(
            &xd,
            &od,
            None,
            &wd,
            &xn,
            Some(ActQ { buf: &buf, planes }),
            1,
            eps,
        )?;
        let q = QuantizedAct::from_device(&self.stream.clone_dtoh(&buf)?, n, planes);
        Ok((self.stream.clone_dtoh(&xn)?, q))
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
        self.rope(
            &xd,
            x.len() / head_dim,
            (head_dim, head_dim),
            pos,
            (base, style),
            None,
        )?;
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
    /// which go through the f16 cache store kernel first; keys split over `splits` blocks;
    /// `sinks` one logit per query head, or none. With values in the keys (`shape`'s), `v`
    /// is empty and the store keeps keys only.
    pub fn attention_host(
        &self,
        shape: &AttnShape,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        splits: usize,
        sinks: Option<&[f32]>,
    ) -> Result<Vec<f32>, CudaError> {
        let kv_dim = shape.kv_dim();
        let n = k.len() / kv_dim;
        let qdim = shape.n_head * shape.head_dim;
        let nq = q.len() / qdim;
        let own_values = shape.values_in_keys.is_none();
        if n == 0
            || k.len() != n * kv_dim
            || v.len() != if own_values { k.len() } else { 0 }
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
            let row = p * kv_dim..(p + 1) * kv_dim;
            let kd = self.stream.clone_htod(&k[row.clone()])?;
            if own_values {
                let vd = self.stream.clone_htod(&v[row])?;
                self.kv_store(&kd, (&vd, Some(&vc)), &kc, kv_dim, p)?;
            } else {
                self.kv_store(&kd, (&kd, None), &kc, kv_dim, p)?;
            }
        }
        let vc = if own_values { &vc } else { &kc };
        let qd = self.stream.clone_htod(q)?;
        let vd = shape.v_dim();
        let out = self.stream.alloc_zeros::<f32>(nq * shape.n_head * vd)?;
        let part = self
            .stream
            .alloc_zeros::<f32>(nq * shape.n_head * splits.max(1) * (vd + 2))?;
        let tp = self.stream.clone_htod(&[0i32, (n - nq) as i32])?;
        let sinks = sinks.map(|s| self.stream.clone_htod(s)).transpose()?;
        self.attention(
            shape,
            &qd,
            &kc,
            vc,
            &out,
            &part,
            &tp,
            nq,
            splits,
            sinks.as_ref(),
        )?;
        Ok(self.stream.clone_dtoh(&out)?)
    }

    /// Decode attention of one query (`q`: n_head × head_dim values) at the last of the
    /// positions of `k` and `v` (row-major `[pos][kv_dim]`, stored through the f16 cache
    /// kernel), keys split over up to `splits` blocks per query head, the output also
    /// quantized to int8 in `planes` planes when `planes > 0`, as a decode step runs it.
    /// Launched `runs` times on the same buffers (the split counters must come back to
    /// zero); returns each run's output. `sinks`: one logit per query head, or none.
    #[allow(clippy::too_many_arguments)]
    pub fn decode_attention_host(
        &self,
        shape: &AttnShape,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        splits: usize,
        planes: usize,
        runs: usize,
        sinks: Option<&[f32]>,
    ) -> Result<Vec<AttnOutput>, CudaError> {
        let kv_dim = shape.kv_dim();
        let n = k.len() / kv_dim;
        let qdim = shape.n_head * shape.head_dim;
        if n == 0 || k.len() != n * kv_dim || v.len() != k.len() || q.len() != qdim || planes > 2 {
            return Err(CudaError::InvalidArgument(
                "decode attention inputs disagree in shape".into(),
            ));
        }
        let kc = self.stream.clone_htod(&to_f16_bits(k))?;
        let vc = self.stream.clone_htod(&to_f16_bits(v))?;
        let qd = self.stream.clone_htod(q)?;
        let mut out = self.stream.alloc_zeros::<f32>(qdim)?;
        let part = self
            .stream
            .alloc_zeros::<f32>(shape.n_head * splits.max(1) * (shape.head_dim + 2))?;
        let cnt = self.stream.alloc_zeros::<u32>(shape.n_head)?;
        let mut buf = self
            .stream
            .alloc_zeros::<u8>(act_q8_bytes(qdim, planes.max(1)))?;
        let tp = self.stream.clone_htod(&[0i32, (n - 1) as i32])?;
        let sinks = sinks.map(|s| self.stream.clone_htod(s)).transpose()?;
        let mut res = Vec::with_capacity(runs);
        for _ in 0..runs {
            // Cleared so that a run that writes nothing cannot pass for its predecessor.
            self.stream.memset_zeros(&mut out)?;
            self.stream.memset_zeros(&mut buf)?;
            let xq = (planes > 0).then_some(ActQ { buf: &buf, planes });
            self.decode_attention(
                shape,
                &qd,
                &kc,
                &vc,
                &out,
                &part,
                &cnt,
                &tp,
                splits,
                xq,
                sinks.as_ref(),
            )?;
            let q8 = match planes {
                1.. => Some(QuantizedAct::from_device(
                    &self.stream.clone_dtoh(&buf)?,
                    qdim,
                    planes,
                )),
                0 => None,
            };
            res.push((self.stream.clone_dtoh(&out)?, q8));
        }
        Ok(res)
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

    /// `x · Wᵀ` for `n = x.len() / cols` token rows through the MMQ kernel of `ty` (Q4_1,
    /// Q8_0, Q4_K, Q6_K) with x quantized on the device, as one vector, into `planes`
    /// planes; returns the product and that x.
    pub fn matmul_mmq_host(
        &self,
        ty: GgmlType,
        planes: usize,
        w: &[u8],
        rows: usize,
        cols: usize,
        x: &[f32],
    ) -> Result<(Vec<f32>, QuantizedAct), CudaError> {
        let kernel = mmq_kernel(ty, planes).ok_or_else(|| {
            CudaError::InvalidArgument(format!("no MMQ product of {ty} in {planes} planes"))
        })?;
        let n = x.len() / cols.max(1);
        if n == 0 || x.len() != n * cols {
            return Err(CudaError::InvalidArgument(format!(
                "x has {} values, not rows of {cols}",
                x.len()
            )));
        }
        let m = self.upload_matrix(ty, rows, cols, w)?;
        let xd = self.stream.clone_htod(x)?;
        let buf = self
            .stream
            .alloc_zeros::<u8>(act_q8_bytes(n * cols, planes))?;
        let y = self.stream.alloc_zeros::<f32>(n * rows)?;
        let part = self.stream.alloc_zeros::<f32>(16 * n * rows)?;
        let xq = ActQ { buf: &buf, planes };
        self.quantize_act(&xd, xq, n * cols)?;
        self.mmq(kernel, &m, xq, n, &y, &part)?;
        let q = QuantizedAct::from_device(&self.stream.clone_dtoh(&buf)?, n * cols, planes);
        Ok((self.stream.clone_dtoh(&y)?, q))
    }
}

/// f16 bit patterns of `v` (round to nearest even), as the cache store kernel writes them.
fn to_f16_bits(v: &[f32]) -> Vec<u16> {
    v.iter()
        .map(|&x| half::f16::from_f32(x).to_bits())
        .collect()
}
