//! The CUDA backend on the backend contract: [`CudaOps`] implements
//! `ferrite_backend::Backend` over the kernels the CUDA forward pass launches, so that the
//! contract's conformance harness (backend_ops) checks those kernels, op by op, against the
//! same f64 reference the CPU backend answers to.
//!
//! Each op picks the launch the CUDA model uses for that shape: one row's products read
//! int8 activations when [`CudaBackend::activations`] asks for them (the decode products),
//! several rows take the f32 row products; one query's attention takes the decode kernel,
//! several the tiled prefill kernel with its key splits. The kernels address their buffers
//! from the start, so an op on rows inside a buffer (one segment of a pass, one row of a
//! product) stages them through a scratch buffer first: correct, not fast. The recurrent
//! layers' kernels (`recurrent.rs`: the convolution, the gated delta rule, the Mamba-2
//! scan) take each segment's rows and state slot in place, one launch per segment; a
//! [`CudaKv`] keeps those slots as f32 device values, and a segment at position 0 reads its
//! slot as zero. Expert routing is the contract's host data (`Routing`): the router logits
//! come back and the shared rule picks the experts, as on the CPU; each used expert's rows
//! are gathered on the device and its products run over them, and one launch sums every
//! token's slots. This module never computes a value on the host that a kernel computes;
//! what has no kernel here (KV rows other than f16) is refused by [`CudaOps::supports`]
//! with the reason. MLA's store keeps key rows only: attention reads its values (the
//! latent) from inside them.

mod tables;
mod weights;

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaViewMut};
use ferrite_backend::{
    Act, AttnShape as ContractShape, Backend, BackendError, ExpertBufs, ExpertFfn, HostMatrix,
    KvType, Op, Rope, RouteRule, Routing, Segment, SsmParams, Support, Values,
};
use ferrite_model::Activation;

use crate::decode::decode_splits;
use crate::device::{i8_kernels, row_multiple, weight_kernels};
use crate::model::TOPK_MAX;
use crate::ops::{ActQ, DeviceMatrix, act_q8_bytes};
use crate::recurrent::{DELTA_MAX_K_DIM, Rows};
use crate::{AttnShape, CudaBackend, CudaError};

type Result<T> = ferrite_backend::Result<T>;

const NAME: &str = "cuda";

/// A weight matrix uploaded through [`CudaOps`]: an index into its table.
#[derive(Debug, Clone, Copy)]
pub struct MatrixId(usize);

/// A vector (norm weight, bias, rope factors) uploaded through [`CudaOps`].
#[derive(Debug, Clone, Copy)]
pub struct VectorId(usize);

/// The KV store of one session: f16 keys and values of every layer, `ctx` rows of `row`
/// values each (the layout the CUDA sessions use), and the recurrent state slots of a
/// hybrid model's layers that keep no K/V rows ([`Backend::kv_state`]).
///
/// A store of a type other than f16 has no K/V rows (no CUDA kernel reads them, and
/// [`CudaOps::supports`] refuses its `kv_store` and `attention`); it holds recurrent state
/// only. A store of values in the keys keeps an empty value buffer per layer.
#[derive(Debug)]
pub struct CudaKv {
    ty: KvType,
    values: Values,
    layers: Vec<(CudaSlice<u16>, CudaSlice<u16>)>,
    ctx: usize,
    row: usize,
    /// `slots × state_len` f32 values, slot after slot; `None` without slots.
    state: Option<CudaSlice<f32>>,
    slots: usize,
    state_len: usize,
}

/// The contract's ops on one CUDA device. Matrices and vectors uploaded through
/// [`Backend::weight`] and [`Backend::vector`] (or a model's, through
/// [`ferrite_model::Weights`]) live as long as this value and its clones, which share them:
/// clone it for each session of one model.
#[derive(Debug, Clone)]
pub struct CudaOps {
    dev: Arc<CudaBackend>,
    tables: Arc<tables::Tables>,
}

/// A kernel's failure as the contract reports it.
fn kernel(op: &'static str) -> impl Fn(CudaError) -> BackendError {
    move |e| BackendError::Kernel {
        backend: NAME,
        op,
        source: Box::new(e),
    }
}

fn driver(op: &'static str) -> impl Fn(cudarc::driver::DriverError) -> BackendError {
    move |e| kernel(op)(CudaError::Driver(e))
}

fn shape(op: &'static str, what: String) -> BackendError {
    BackendError::Shape { op, what }
}

/// `len` values at `at` lie inside a buffer of `have` values.
fn check(op: &'static str, have: usize, at: usize, len: usize) -> Result<()> {
    match at.checked_add(len) {
        Some(end) if end <= have => Ok(()),
        _ => Err(shape(
            op,
            format!("{len} values at {at} outside a buffer of {have}"),
        )),
    }
}

/// The kernel of a gated activation.
enum Gate {
    /// The FFN gates the CUDA model launches.
    Ffn(Activation),
    /// Qwen3-Next's sigmoid gate (`recurrent.rs`).
    Sigmoid,
}

/// The kernel computing `act`.
fn gate_kernel(act: Act) -> Gate {
    match act {
        Act::Silu => Gate::Ffn(Activation::Silu),
        Act::GeluTanh => Gate::Ffn(Activation::GeluTanh),
        Act::Sigmoid => Gate::Sigmoid,
        Act::SwigluOai => Gate::Ffn(Activation::SwigluOai),
    }
}

/// The kernels' geometry for a contract shape.
fn attn_shape(s: &ContractShape) -> Result<AttnShape> {
    let g = AttnShape::new(s.n_head, s.n_kv_head, s.head_dim, s.scale, s.window)
        .map_err(kernel("attention"))?
        .with_softcap(s.softcap);
    match s.values {
        Values::Own => Ok(g),
        Values::InKeys { at, dim } => g.with_values_in_keys(at, dim).map_err(kernel("attention")),
    }
}

impl CudaOps {
    /// The contract's ops on `dev`.
    pub fn new(dev: Arc<CudaBackend>) -> CudaOps {
        CudaOps {
            dev,
            tables: Arc::default(),
        }
    }

    fn matrix(&self, id: MatrixId) -> Result<Arc<DeviceMatrix>> {
        self.tables.matrix("matmul", id)
    }

    fn vec(&self, id: VectorId) -> Result<Arc<CudaSlice<f32>>> {
        self.tables.vector("vector", id)
    }

    /// `len` values of `src` from `at` in a new buffer.
    fn stage(
        &self,
        op: &'static str,
        src: &CudaSlice<f32>,
        at: usize,
        len: usize,
    ) -> Result<CudaSlice<f32>> {
        check(op, src.len(), at, len)?;
        let mut tmp = self
            .dev
            .stream
            .alloc_zeros::<f32>(len.max(1))
            .map_err(driver(op))?;
        if len > 0 {
            self.dev
                .stream
                .memcpy_dtod(&src.slice(at..at + len), &mut tmp.slice_mut(..len))
                .map_err(driver(op))?;
        }
        Ok(tmp)
    }

    /// The first `len` values of `tmp` back into `dst` at `at`.
    fn unstage(
        &self,
        op: &'static str,
        tmp: &CudaSlice<f32>,
        dst: &mut CudaSlice<f32>,
        at: usize,
        len: usize,
    ) -> Result<()> {
        check(op, dst.len(), at, len)?;
        if len > 0 {
            self.dev
                .stream
                .memcpy_dtod(&tmp.slice(..len), &mut dst.slice_mut(at..at + len))
                .map_err(driver(op))?;
        }
        Ok(())
    }

    /// `(0, pos)`: the (token, position) pair the rope, store and attention kernels read.
    fn position(&self, op: &'static str, pos: usize) -> Result<CudaSlice<i32>> {
        let p = i32::try_from(pos).map_err(|_| shape(op, format!("position {pos}")))?;
        self.dev.stream.clone_htod(&[0, p]).map_err(driver(op))
    }

    /// `x` (`cols` values) quantized for the decode products of `w`, when the device's
    /// activation setting and `w`'s type have int8 kernels.
    fn decode_input(&self, w: &DeviceMatrix, x: &CudaSlice<f32>) -> Result<Option<CudaSlice<u8>>> {
        let planes = self.dev.activations().planes();
        if planes == 0 || i8_kernels(w.ty, planes).is_none() || !w.cols.is_multiple_of(32) {
            return Ok(None);
        }
        let buf = self
            .dev
            .stream
            .alloc_zeros::<u8>(act_q8_bytes(w.cols, planes))
            .map_err(driver("matmul"))?;
        self.dev
            .quantize_act(x, ActQ { buf: &buf, planes }, w.cols)
            .map_err(kernel("matmul"))?;
        Ok(Some(buf))
    }

    fn check_product(
        op: &'static str,
        w: &DeviceMatrix,
        x: &CudaSlice<f32>,
        n: usize,
        y: usize,
    ) -> Result<()> {
        check(op, x.len(), 0, n * w.cols)?;
        check(op, y, 0, n * w.rows)
    }

    /// The KV rows of layer `layer` of `kv`, checked to hold `width`-value rows up to
    /// position `end`.
    fn layer<'k>(
        op: &'static str,
        kv: &'k CudaKv,
        layer: usize,
        width: usize,
        end: usize,
    ) -> Result<&'k (CudaSlice<u16>, CudaSlice<u16>)> {
        if kv.ty != KvType::F16 {
            return Err(f16_rows(op, kv.ty));
        }
        if width != kv.row || end > kv.ctx {
            return Err(shape(
                op,
                format!(
                    "rows of {width} up to position {end} in a store of {} rows of {}",
                    kv.ctx, kv.row
                ),
            ));
        }
        kv.layers
            .get(layer)
            .ok_or_else(|| shape(op, format!("layer {layer} of {}", kv.layers.len())))
    }

    /// State slot `slot` of `kv`, whose slots must hold `len` values.
    fn slot<'k>(
        op: &'static str,
        kv: &'k mut CudaKv,
        slot: usize,
        len: usize,
    ) -> Result<CudaViewMut<'k, f32>> {
        if kv.state_len != len {
            return Err(shape(
                op,
                format!("a state of {len} values for slots of {}", kv.state_len),
            ));
        }
        match &mut kv.state {
            Some(state) if slot < kv.slots => Ok(state.slice_mut(slot * len..(slot + 1) * len)),
            _ => Err(shape(op, format!("no recurrent state slot {slot}"))),
        }
    }

    /// The frequency divisors of `r` on the device: the short set and LongRoPE's long set
    /// with its switch point.
    #[allow(clippy::type_complexity)]
    fn rope_factors(
        &self,
        op: &'static str,
        r: &Rope<VectorId>,
    ) -> Result<(
        Option<Arc<CudaSlice<f32>>>,
        Option<(Arc<CudaSlice<f32>>, usize)>,
    )> {
        if r.long.is_some() && r.factors.is_none() {
            return Err(shape(op, "long rope factors without the short ones".into()));
        }
        let factors = r.factors.map(|f| self.vec(f)).transpose()?;
        let long = r
            .long
            .map(|(f, after)| self.vec(f).map(|f| (f, after)))
            .transpose()?;
        Ok((factors, long))
    }

    fn upload_matrix(&self, w: HostMatrix<'_>) -> Result<DeviceMatrix> {
        self.dev
            .upload_matrix(w.ty, w.rows, w.cols, w.data)
            .map_err(kernel("weight"))
    }

    fn upload_vector(&self, v: &[f32]) -> Result<CudaSlice<f32>> {
        self.dev.stream.clone_htod(v).map_err(driver("vector"))
    }
}

/// The divisors a segment's rows turn by: LongRoPE's long set for a session whose context
/// is past its switch point, else the short set (none for plain frequencies).
fn seg_factors<'f>(
    factors: Option<&'f CudaSlice<f32>>,
    long: Option<&'f (Arc<CudaSlice<f32>>, usize)>,
    seg: &Segment<'_, CudaKv>,
) -> Option<&'f CudaSlice<f32>> {
    match long {
        Some((f, after)) if seg.kv.ctx > *after => Some(f),
        _ => factors,
    }
}

/// The refusal of K/V rows of a type other than f16.
fn f16_rows(op: &'static str, ty: KvType) -> BackendError {
    BackendError::Unsupported {
        op,
        dtype: format!("{} KV", ty.name()),
        backend: NAME,
        reason: "the CUDA KV cache is f16".into(),
    }
}

impl Backend for CudaOps {
    type Buf = CudaSlice<f32>;
    type Weight<'a>
        = MatrixId
    where
        Self: 'a;
    type Vector<'a>
        = VectorId
    where
        Self: 'a;
    type Kv = CudaKv;
    /// The kernels form each rotation angle from the position and base themselves.
    type Angles = ();

    fn name(&self) -> &'static str {
        NAME
    }

    fn supports(&self, op: &Op) -> Support {
        let weights = |ty, cols: usize| {
            let unit = row_multiple(ty);
            match weight_kernels(ty) {
                None => Support::Unsupported(format!("no CUDA kernel reads {ty} weights")),
                Some(_) if !cols.is_multiple_of(unit) => Support::Unsupported(format!(
                    "the CUDA kernels read {ty} rows in whole units of {unit} values, not {cols}"
                )),
                Some(_) => Support::Native,
            }
        };
        let f16_only = |kv: KvType| match kv {
            KvType::F16 => Support::Native,
            other => Support::Unsupported(format!(
                "the CUDA KV cache is f16; {} rows have no kernels",
                other.name()
            )),
        };
        match *op {
            Op::Embed { ty, cols }
            | Op::MatMul { ty, cols }
            | Op::MatMulShared { ty, cols }
            | Op::Logits { ty, cols } => weights(ty, cols),
            Op::MoeRoute { .. } => Support::Native,
            // Every gate has a kernel (`gated_act` runs each expert's).
            Op::MoeExperts { ty, cols, .. } => weights(ty, cols),
            Op::Rope { .. }
            | Op::RmsNorm
            | Op::NormInto
            | Op::AddNorm
            | Op::Add
            | Op::AddBias
            | Op::Copy
            | Op::GatedAct { .. }
            | Op::RowGate
            | Op::GatedNorm
            | Op::GroupNorm
            | Op::ReluSq
            | Op::Conv1d { .. }
            | Op::SsmScan { .. } => Support::Native,
            Op::DeltaRule { k_dim, .. } if k_dim <= DELTA_MAX_K_DIM => Support::Native,
            Op::DeltaRule { k_dim, .. } => Support::Unsupported(format!(
                "the delta rule kernel holds key heads of up to {DELTA_MAX_K_DIM} values in \
                 shared memory, not {k_dim}"
            )),
            Op::KvStore { kv } | Op::RopeStore { kv, .. } => f16_only(kv),
            Op::Attention { kv, head_dim, .. } if head_dim.is_multiple_of(8) => f16_only(kv),
            Op::Attention { .. } => Support::Unsupported(
                "the attention kernels need head sizes that are multiples of 8".into(),
            ),
            Op::TopK { k } if (1..=TOPK_MAX).contains(&k) => Support::Native,
            Op::TopK { k } => Support::Unsupported(format!(
                "the device selection takes 1 to {TOPK_MAX} candidates, not {k}"
            )),
        }
    }

    fn alloc(&self, len: usize) -> Result<CudaSlice<f32>> {
        self.dev
            .stream
            .alloc_zeros::<f32>(len.max(1))
            .map_err(|_| BackendError::Alloc {
                what: "activation buffer",
            })
    }

    fn upload(&self, src: &[f32], dst: &mut CudaSlice<f32>, at: usize) -> Result<()> {
        check("upload", dst.len(), at, src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        self.dev
            .stream
            .memcpy_htod(src, &mut dst.slice_mut(at..at + src.len()))
            .map_err(driver("upload"))
    }

    fn download(&self, src: &CudaSlice<f32>, at: usize, dst: &mut [f32]) -> Result<()> {
        check("download", src.len(), at, dst.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        self.dev
            .stream
            .memcpy_dtoh(&src.slice(at..at + dst.len()), dst)
            .map_err(driver("download"))
    }

    fn copy(
        &self,
        src: Option<&CudaSlice<f32>>,
        from: usize,
        dst: &mut CudaSlice<f32>,
        to: usize,
        len: usize,
    ) -> Result<()> {
        // A copy within one buffer may overlap, which a device-to-device copy does not
        // allow: it goes through a staging buffer.
        let tmp = match src {
            Some(s) => {
                check("copy", s.len(), from, len)?;
                check("copy", dst.len(), to, len)?;
                if len > 0 {
                    self.dev
                        .stream
                        .memcpy_dtod(&s.slice(from..from + len), &mut dst.slice_mut(to..to + len))
                        .map_err(driver("copy"))?;
                }
                return Ok(());
            }
            None => self.stage("copy", dst, from, len)?,
        };
        self.unstage("copy", &tmp, dst, to, len)
    }

    fn weight<'a>(&'a self, w: HostMatrix<'a>) -> Result<MatrixId> {
        Ok(self.tables.push_matrix(self.upload_matrix(w)?))
    }

    fn vector<'a>(&'a self, v: &'a [f32]) -> Result<VectorId> {
        Ok(self.tables.push_vector(self.upload_vector(v)?))
    }

    fn kv(
        &self,
        ty: KvType,
        n_layer: usize,
        ctx: usize,
        (heads, head_dim): (usize, usize),
        values: Values,
    ) -> Result<CudaKv> {
        let row = ty.check_row(heads, head_dim)?;
        // Rows of another type have no kernels: such a store keeps recurrent state only.
        let n_layer = if ty == KvType::F16 { n_layer } else { 0 };
        let len = row
            .checked_mul(ctx)
            .ok_or_else(|| shape("kv", format!("{ctx} rows of {row}")))?;
        let zeros = |len: usize| {
            self.dev
                .stream
                .alloc_zeros::<u16>(len.max(1))
                .map_err(|_| BackendError::Alloc { what: "KV store" })
        };
        let v_len = if values.stored() { len } else { 0 };
        let layers = (0..n_layer)
            .map(|_| Ok((zeros(len)?, zeros(v_len)?)))
            .collect::<Result<_>>()?;
        Ok(CudaKv {
            ty,
            values,
            layers,
            ctx,
            row,
            state: None,
            slots: 0,
            state_len: 0,
        })
    }

    fn embed(
        &self,
        table: MatrixId,
        tokens: &[u32],
        scale: f32,
        x: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let w = self.matrix(table)?;
        check("embed", x.len(), 0, tokens.len() * w.cols)?;
        let ids = tokens
            .iter()
            .map(|&t| match i32::try_from(t) {
                Ok(i) if (t as usize) < w.rows => Ok(i),
                _ => Err(shape("embed", format!("token {t} of {} rows", w.rows))),
            })
            .collect::<Result<Vec<i32>>>()?;
        if ids.is_empty() {
            return Ok(());
        }
        let ids = self.dev.stream.clone_htod(&ids).map_err(driver("embed"))?;
        self.dev
            .embed(&w, &ids, tokens.len(), scale, x)
            .map_err(kernel("embed"))
    }

    fn matmul(
        &self,
        w: MatrixId,
        x: &CudaSlice<f32>,
        n: usize,
        y: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let w = self.matrix(w)?;
        Self::check_product("matmul", &w, x, n, y.len())?;
        match n {
            0 => Ok(()),
            1 => {
                let xq = self.decode_input(&w, x)?;
                let xq = xq.as_ref().map(|buf| ActQ {
                    buf,
                    planes: self.dev.activations().planes(),
                });
                self.dev.matvec(&w, x, xq, y).map_err(kernel("matmul"))
            }
            _ => self.dev.matvec_rows(&w, x, n, y).map_err(kernel("matmul")),
        }
    }

    fn matmul_shared<const N: usize>(
        &self,
        ws: [MatrixId; N],
        x: &CudaSlice<f32>,
        n: usize,
        ys: [&mut CudaSlice<f32>; N],
    ) -> Result<()> {
        // One row of up to three matrices is the decode step's fused q/k/v (or gate/up)
        // launch over one quantized input; anything else is one product per matrix.
        if n != 1 || N == 0 || N > 3 {
            for (w, y) in ws.into_iter().zip(ys) {
                self.matmul(w, x, n, y)?;
            }
            return Ok(());
        }
        let ms: Vec<Arc<DeviceMatrix>> =
            ws.iter().map(|&w| self.matrix(w)).collect::<Result<_>>()?;
        for (m, y) in ms.iter().zip(&ys) {
            Self::check_product("matmul_shared", m, x, 1, y.len())?;
        }
        let xq = self.decode_input(&ms[0], x)?;
        let xq = xq.as_ref().map(|buf| ActQ {
            buf,
            planes: self.dev.activations().planes(),
        });
        let refs: Vec<&DeviceMatrix> = ms.iter().map(|m| &**m).collect();
        let outs: Vec<&CudaSlice<f32>> = ys.iter().map(|y| &**y).collect();
        self.dev
            .matvec_multi(&refs, x, xq, &outs)
            .map_err(kernel("matmul_shared"))
    }

    fn logits(&self, w: MatrixId, x: &CudaSlice<f32>, n: usize, out: &mut [f32]) -> Result<()> {
        let rows = self.matrix(w)?.rows;
        check("logits", out.len(), 0, n * rows)?;
        let mut y = self.alloc(n * rows)?;
        self.matmul(w, x, n, &mut y)?;
        self.download(&y, 0, &mut out[..n * rows])
    }

    fn rms_norm(
        &self,
        x: &mut CudaSlice<f32>,
        len: usize,
        w: VectorId,
        dim: usize,
        eps: f32,
    ) -> Result<()> {
        let w = self.vec(w)?;
        let rows = norm_rows("rms_norm", x.len(), len, w.len(), dim)?;
        self.dev
            .rms_norm(x, &w, x, rows, eps)
            .map_err(kernel("rms_norm"))
    }

    fn norm_into(
        &self,
        x: &CudaSlice<f32>,
        len: usize,
        w: VectorId,
        dim: usize,
        eps: f32,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let w = self.vec(w)?;
        let rows = norm_rows("norm_into", x.len().min(out.len()), len, w.len(), dim)?;
        self.dev
            .rms_norm(x, &w, out, rows, eps)
            .map_err(kernel("norm_into"))
    }

    fn add_norm(
        &self,
        x: &mut CudaSlice<f32>,
        y: &CudaSlice<f32>,
        len: usize,
        w: VectorId,
        dim: usize,
        eps: f32,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let w = self.vec(w)?;
        let have = x.len().min(y.len()).min(out.len());
        let rows = norm_rows("add_norm", have, len, w.len(), dim)?;
        self.dev
            .residual_norm(x, y, None, &w, out, None, rows, eps)
            .map_err(kernel("add_norm"))
    }

    fn add(&self, x: &mut CudaSlice<f32>, y: &CudaSlice<f32>, len: usize) -> Result<()> {
        check("add", x.len().min(y.len()), 0, len)?;
        self.dev.add(x, y, len).map_err(kernel("add"))
    }

    fn add_bias(&self, x: &mut CudaSlice<f32>, len: usize, b: VectorId, dim: usize) -> Result<()> {
        let b = self.vec(b)?;
        let rows = norm_rows("add_bias", x.len(), len, b.len(), dim)?;
        self.dev.add_bias(x, &b, rows).map_err(kernel("add_bias"))
    }

    fn gated_act(
        &self,
        act: Act,
        gate: &mut CudaSlice<f32>,
        up: &CudaSlice<f32>,
        n: usize,
        width: usize,
    ) -> Result<()> {
        let len = n * width;
        check("gated_act", gate.len().min(up.len()), 0, len)?;
        match gate_kernel(act) {
            Gate::Ffn(a) => self.dev.gated(a, gate, up, len),
            Gate::Sigmoid => self.dev.gate_sigmoid(gate, up, len),
        }
        .map_err(kernel("gated_act"))
    }

    fn rope_prepare(
        &self,
        _angles: &mut (),
        _head_dim: usize,
        _bases: &mut dyn Iterator<Item = f32>,
        _segs: &[Segment<'_, CudaKv>],
    ) -> Result<()> {
        Ok(())
    }

    fn rope(
        &self,
        r: &Rope<VectorId>,
        _angles: &(),
        x: &mut CudaSlice<f32>,
        width: usize,
        segs: &[Segment<'_, CudaKv>],
    ) -> Result<()> {
        let heads = heads("rope", width, r.head_dim)?;
        let (factors, long) = self.rope_factors("rope", r)?;
        let mut row = 0;
        for seg in segs {
            let factors = seg_factors(factors.as_deref(), long.as_ref(), seg);
            for t in 0..seg.len {
                let tmp = self.stage("rope", x, row * width, width)?;
                self.dev
                    .rope(
                        &tmp,
                        heads,
                        (r.head_dim, r.rot_dim),
                        seg.pos0 + t,
                        (r.base, r.style),
                        factors,
                    )
                    .map_err(kernel("rope"))?;
                self.unstage("rope", &tmp, x, row * width, width)?;
                row += 1;
            }
        }
        Ok(())
    }

    fn kv_store(
        &self,
        layer: usize,
        k: &CudaSlice<f32>,
        v: &CudaSlice<f32>,
        width: usize,
        segs: &mut [Segment<'_, CudaKv>],
    ) -> Result<()> {
        let mut row = 0;
        for seg in segs.iter() {
            let (kc, vc) = Self::layer("kv_store", seg.kv, layer, width, seg.pos0 + seg.len)?;
            // A store of values in the keys keeps the keys only.
            let vc = seg.kv.values.stored().then_some(vc);
            for t in 0..seg.len {
                let kt = self.stage("kv_store", k, row * width, width)?;
                let vt = self.stage("kv_store", v, row * width, width)?;
                self.dev
                    .kv_store(&kt, (&vt, vc), kc, width, seg.pos0 + t)
                    .map_err(kernel("kv_store"))?;
                row += 1;
            }
        }
        Ok(())
    }

    fn rope_store(
        &self,
        r: &Rope<VectorId>,
        _angles: &(),
        layer: usize,
        (q, q_dim): (&mut CudaSlice<f32>, usize),
        (k, v, kv_dim): (&mut CudaSlice<f32>, &CudaSlice<f32>, usize),
        segs: &mut [Segment<'_, CudaKv>],
    ) -> Result<()> {
        let op = "rope_store";
        // The rope and store kernel has none of the attention kernels' limits on heads.
        let geometry = AttnShape {
            n_head: heads(op, q_dim, r.head_dim)?,
            n_kv_head: heads(op, kv_dim, r.head_dim)?,
            head_dim: r.head_dim,
            scale: 1.0,
            window: None,
            softcap: None,
            values_in_keys: None,
        };
        let (factors, long) = self.rope_factors(op, r)?;
        let mut row = 0;
        for seg in segs.iter() {
            let factors = seg_factors(factors.as_deref(), long.as_ref(), seg);
            if !seg.kv.values.stored() {
                return Err(shape(
                    op,
                    "a store of values in the keys takes its rows through kv_store".into(),
                ));
            }
            let (kc, vc) = Self::layer(op, seg.kv, layer, kv_dim, seg.pos0 + seg.len)?;
            let n = seg.len;
            let qs = self.stage(op, q, row * q_dim, n * q_dim)?;
            let ks = self.stage(op, k, row * kv_dim, n * kv_dim)?;
            let vs = self.stage(op, v, row * kv_dim, n * kv_dim)?;
            let tp = self.position(op, seg.pos0)?;
            if n > 0 {
                self.dev
                    .rope_store(
                        n,
                        (&geometry, r.rot_dim),
                        &qs,
                        &ks,
                        &vs,
                        kc,
                        vc,
                        &tp,
                        r.base,
                        r.style,
                        factors,
                    )
                    .map_err(kernel(op))?;
            }
            self.unstage(op, &qs, q, row * q_dim, n * q_dim)?;
            self.unstage(op, &ks, k, row * kv_dim, n * kv_dim)?;
            row += n;
        }
        Ok(())
    }

    fn attention(
        &self,
        s: &ContractShape,
        layer: usize,
        q: &CudaSlice<f32>,
        sinks: Option<VectorId>,
        segs: &[Segment<'_, CudaKv>],
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let op = "attention";
        let geometry = attn_shape(s)?;
        let sinks = sinks.map(|v| self.vec(v)).transpose()?;
        if let Some(logits) = &sinks
            && logits.len() != s.n_head
        {
            return Err(shape(
                op,
                format!("{} sink logits for {} heads", logits.len(), s.n_head),
            ));
        }
        let (qdim, kv_dim) = (s.n_head * s.head_dim, geometry.kv_dim());
        let odim = s.n_head * geometry.v_dim();
        let mut row = 0;
        for seg in segs {
            if seg.kv.values != s.values {
                return Err(shape(
                    op,
                    format!(
                        "values {:?} over a store of values {:?}",
                        s.values, seg.kv.values
                    ),
                ));
            }
            let (kc, vc) = Self::layer(op, seg.kv, layer, kv_dim, seg.pos0 + seg.len)?;
            // MLA's values are the latent inside the key rows.
            let vc = if s.values.stored() { vc } else { kc };
            let n = seg.len;
            if n == 0 {
                continue;
            }
            let qs = self.stage(op, q, row * qdim, n * qdim)?;
            let os = self.alloc(n * odim)?;
            let tp = self.position(op, seg.pos0)?;
            // The launches the CUDA model makes for this many queries at this depth.
            let splits = if n == 1 {
                decode_splits(s.n_head, seg.pos0 + 1)
            } else {
                crate::attn_ops::prefill_splits(&geometry, n, seg.pos0 + n)
            };
            let part = self.alloc(n * s.n_head * splits * (geometry.v_dim() + 2))?;
            if n == 1 {
                let cnt = self
                    .dev
                    .stream
                    .alloc_zeros::<u32>(s.n_head.max(1))
                    .map_err(driver(op))?;
                self.dev
                    .decode_attention(
                        &geometry,
                        &qs,
                        kc,
                        vc,
                        &os,
                        &part,
                        &cnt,
                        &tp,
                        splits,
                        None,
                        sinks.as_deref(),
                    )
                    .map_err(kernel(op))?;
            } else {
                self.dev
                    .attention(
                        &geometry,
                        &qs,
                        kc,
                        vc,
                        &os,
                        &part,
                        &tp,
                        n,
                        splits,
                        sinks.as_deref(),
                    )
                    .map_err(kernel(op))?;
            }
            self.unstage(op, &os, out, row * odim, n * odim)?;
            row += n;
        }
        Ok(())
    }

    fn row_gate(
        &self,
        x: &mut CudaSlice<f32>,
        g: &CudaSlice<f32>,
        n: usize,
        width: usize,
    ) -> Result<()> {
        let op = "row_gate";
        let len = n
            .checked_mul(width)
            .ok_or_else(|| shape(op, format!("{n} rows of {width}")))?;
        check(op, x.len(), 0, len)?;
        check(op, g.len(), 0, n)?;
        self.dev.row_gate(x, g, n, width).map_err(kernel(op))
    }

    fn gated_norm(
        &self,
        x: &mut CudaSlice<f32>,
        z: &CudaSlice<f32>,
        len: usize,
        w: VectorId,
        dim: usize,
        eps: f32,
    ) -> Result<()> {
        let op = "gated_norm";
        let w = self.vec(w)?;
        let rows = norm_rows(op, x.len().min(z.len()), len, w.len(), dim)?;
        self.dev.gated_norm(x, z, &w, rows, eps).map_err(kernel(op))
    }

    fn group_norm(
        &self,
        x: &mut CudaSlice<f32>,
        len: usize,
        w: VectorId,
        width: usize,
        group: usize,
        eps: f32,
    ) -> Result<()> {
        let op = "group_norm";
        let w = self.vec(w)?;
        let rows = norm_rows(op, x.len(), len, w.len(), width)?;
        if group == 0 || !width.is_multiple_of(group) {
            return Err(shape(op, format!("groups of {group} in rows of {width}")));
        }
        self.dev
            .group_norm(x, &w, rows, group, eps)
            .map_err(kernel(op))
    }

    fn relu_sq(&self, x: &mut CudaSlice<f32>, len: usize) -> Result<()> {
        check("relu_sq", x.len(), 0, len)?;
        self.dev.relu_sq(x, len).map_err(kernel("relu_sq"))
    }

    fn kv_state(&self, kv: &mut CudaKv, slots: usize, len: usize) -> Result<()> {
        let total = slots
            .checked_mul(len)
            .ok_or_else(|| shape("kv_state", format!("{slots} slots of {len}")))?;
        kv.state = if total == 0 {
            None
        } else {
            let zeros =
                self.dev
                    .stream
                    .alloc_zeros::<f32>(total)
                    .map_err(|_| BackendError::Alloc {
                        what: "recurrent state",
                    })?;
            Some(zeros)
        };
        kv.slots = slots;
        kv.state_len = len;
        Ok(())
    }

    fn state_get(&self, kv: &CudaKv, out: &mut Vec<f32>) -> Result<()> {
        out.clear();
        if let Some(state) = &kv.state {
            out.resize(state.len(), 0.0);
            self.dev
                .stream
                .memcpy_dtoh(state, out.as_mut_slice())
                .map_err(driver("state_get"))?;
        }
        Ok(())
    }

    fn state_set(&self, kv: &mut CudaKv, values: Option<&[f32]>) -> Result<()> {
        let Some(state) = kv.state.as_mut() else {
            return match values {
                Some(v) if !v.is_empty() => Err(shape(
                    "state_set",
                    format!("{} values for a store without state", v.len()),
                )),
                _ => Ok(()),
            };
        };
        let stream = &self.dev.stream;
        match values {
            None => stream.memset_zeros(state).map_err(driver("state_set")),
            Some(v) if v.len() == state.len() => {
                stream.memcpy_htod(v, state).map_err(driver("state_set"))
            }
            Some(v) => Err(shape(
                "state_set",
                format!("{} values for a state of {}", v.len(), state.len()),
            )),
        }
    }

    fn conv1d(
        &self,
        s: ferrite_arch::ConvShape,
        slot: usize,
        x: &CudaSlice<f32>,
        w: VectorId,
        bias: Option<VectorId>,
        segs: &mut [Segment<'_, Self::Kv>],
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let op = "conv1d";
        let (c, k) = (s.channels, s.kernel);
        let (w, bias) = (self.vec(w)?, bias.map(|b| self.vec(b)).transpose()?);
        let hist = if k >= 2 && c > 0 {
            (k - 1).checked_mul(c).filter(|&h| h <= s.state_len)
        } else {
            None
        };
        let Some(hist) = hist.filter(|_| Some(w.len()) == c.checked_mul(k)) else {
            return Err(shape(
                op,
                format!(
                    "{} taps for {c} channels of {k} in a state of {}",
                    w.len(),
                    s.state_len
                ),
            ));
        };
        if let Some(b) = bias.as_ref().filter(|b| b.len() != c) {
            return Err(shape(op, format!("{} biases for {c} channels", b.len())));
        }
        let mut at = 0;
        for seg in segs.iter_mut() {
            let len = seg
                .len
                .checked_mul(c)
                .ok_or_else(|| shape(op, format!("{} rows of {c}", seg.len)))?;
            let mut state = Self::slot(op, seg.kv, slot, s.state_len)?;
            check(op, x.len(), at, len)?;
            check(op, out.len(), at, len)?;
            self.dev
                .conv1d(
                    (c, k),
                    &x.slice(at..at + len),
                    &w,
                    bias.as_deref(),
                    &mut state.slice_mut(..hist),
                    &mut out.slice_mut(at..at + len),
                    Rows {
                        n: seg.len,
                        fresh: seg.pos0 == 0,
                    },
                )
                .map_err(kernel(op))?;
            at += len;
        }
        Ok(())
    }

    fn delta_rule(
        &self,
        s: &ferrite_arch::DeltaNetShape,
        slot: usize,
        qkv: &CudaSlice<f32>,
        (beta, alpha): (&CudaSlice<f32>, &CudaSlice<f32>),
        (a, dt_bias): (VectorId, VectorId),
        segs: &mut [Segment<'_, Self::Kv>],
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let op = "delta_rule";
        self.require(&Op::DeltaRule {
            k_dim: s.k_dim,
            v_dim: s.v_dim,
        })?;
        let (a, dt_bias) = (self.vec(a)?, self.vec(dt_bias)?);
        let (c, nv, inner) = (s.conv_channels(), s.v_heads, s.inner());
        let fits = s.conv_kernel >= 2
            && [s.k_heads, nv, s.k_dim, s.v_dim].iter().all(|&d| d > 0)
            && nv.is_multiple_of(s.k_heads);
        if !fits || a.len() != nv || dt_bias.len() != nv {
            return Err(shape(
                op,
                format!(
                    "{nv} value heads over {} key heads with {} rates and {} biases",
                    s.k_heads,
                    a.len(),
                    dt_bias.len()
                ),
            ));
        }
        let hist = (s.conv_kernel - 1) * c;
        let mut row = 0;
        for seg in segs.iter_mut() {
            let n = seg.len;
            let mut state = Self::slot(op, seg.kv, slot, s.state_len())?;
            check(op, qkv.len(), row * c, n * c)?;
            check(op, beta.len().min(alpha.len()), row * nv, n * nv)?;
            check(op, out.len(), row * inner, n * inner)?;
            self.dev
                .delta_rule(
                    s,
                    &qkv.slice(row * c..(row + n) * c),
                    (
                        &beta.slice(row * nv..(row + n) * nv),
                        &alpha.slice(row * nv..(row + n) * nv),
                    ),
                    (&a, &dt_bias),
                    &mut state.slice_mut(hist..),
                    &mut out.slice_mut(row * inner..(row + n) * inner),
                    Rows {
                        n,
                        fresh: seg.pos0 == 0,
                    },
                )
                .map_err(kernel(op))?;
            row += n;
        }
        Ok(())
    }

    fn ssm_scan(
        &self,
        s: &ferrite_arch::Mamba2Shape,
        slot: usize,
        xbc: &CudaSlice<f32>,
        dt: &CudaSlice<f32>,
        params: SsmParams<VectorId>,
        segs: &mut [Segment<'_, Self::Kv>],
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let op = "ssm_scan";
        let (a, d, dt_bias) = (
            self.vec(params.a)?,
            self.vec(params.d)?,
            self.vec(params.dt_bias)?,
        );
        let (nh, ng) = (s.n_heads, s.n_groups);
        let fits = s.conv_kernel >= 2
            && [nh, ng, s.head_dim, s.d_state].iter().all(|&d| d > 0)
            && nh.is_multiple_of(ng);
        if !fits || [a.len(), d.len(), dt_bias.len()] != [nh; 3] {
            return Err(shape(
                op,
                format!(
                    "{nh} heads in {ng} groups with {} rates, {} skips and {} biases",
                    a.len(),
                    d.len(),
                    dt_bias.len()
                ),
            ));
        }
        let (c, inner) = (s.conv_channels(), s.inner());
        let hist = (s.conv_kernel - 1) * c;
        let mut row = 0;
        for seg in segs.iter_mut() {
            let n = seg.len;
            let mut state = Self::slot(op, seg.kv, slot, s.state_len())?;
            check(op, xbc.len(), row * c, n * c)?;
            check(op, dt.len(), row * nh, n * nh)?;
            check(op, out.len(), row * inner, n * inner)?;
            self.dev
                .ssm_scan(
                    s,
                    &xbc.slice(row * c..(row + n) * c),
                    &dt.slice(row * nh..(row + n) * nh),
                    (&a, &d, &dt_bias, params.dt_min),
                    &mut state.slice_mut(hist..),
                    &mut out.slice_mut(row * inner..(row + n) * inner),
                    Rows {
                        n,
                        fresh: seg.pos0 == 0,
                    },
                )
                .map_err(kernel(op))?;
            row += n;
        }
        Ok(())
    }

    fn moe_route(
        &self,
        logits: &CudaSlice<f32>,
        routing: &mut Routing,
        rule: &RouteRule,
        bias: Option<&[f32]>,
    ) -> Result<()> {
        const OP: &str = "moe_route";
        let ne = routing.n_expert();
        rule.check(ne, routing.k()).map_err(|why| shape(OP, why))?;
        // Routing is host data of the contract (`Routing`), filled the same way on every
        // backend: the router logits come back and the shared rule picks the experts.
        let mut host = vec![0.0f32; routing.rows() * ne];
        self.download(logits, 0, &mut host)?;
        for (t, row) in host.chunks_exact(ne.max(1)).enumerate() {
            routing.route(t, row, rule, bias);
        }
        routing.group();
        Ok(())
    }

    fn moe_experts<'w>(
        &self,
        x: &CudaSlice<f32>,
        routing: &Routing,
        experts: &dyn Fn(usize) -> ExpertFfn<MatrixId, VectorId>,
        act: Act,
        bufs: &mut ExpertBufs<CudaSlice<f32>>,
        out: &mut CudaSlice<f32>,
    ) -> Result<()>
    where
        Self: 'w,
    {
        const OP: &str = "moe_experts";
        let (n, k, ne) = (routing.rows(), routing.k(), routing.n_expert());
        if ne == 0 {
            return Err(shape(OP, "no experts".into()));
        }
        let first = experts(0);
        let (g0, d0) = (self.matrix(first.mats[0])?, self.matrix(first.mats[2])?);
        for cols in [g0.cols, d0.cols] {
            self.require(&Op::MoeExperts {
                ty: g0.ty,
                act,
                bias: first.bias.is_some(),
                cols,
            })?;
        }
        let (d, ff) = (d0.rows, g0.rows);
        check(OP, x.len(), 0, n * d)?;
        check(OP, bufs.x.len(), 0, n * d)?;
        check(OP, bufs.y.len(), 0, n * d)?;
        check(OP, bufs.gate.len().min(bufs.up.len()), 0, n * ff)?;
        check(OP, bufs.slots.len(), 0, n * k * d)?;
        check(OP, out.len(), 0, n * d)?;
        let pairs = n * k;
        // Each expert's outputs land in one run of `slots` (the pairs grouped by expert,
        // each expert's in token order); `pos` tells the combine where pair i's row is.
        let mut pos = vec![0i32; pairs];
        let mut row = 0usize;
        for e in 0..ne {
            let pe = routing.pairs(e);
            let m = pe.len();
            if m == 0 {
                continue;
            }
            let ExpertFfn {
                mats: [wg, wu, wd],
                bias,
            } = experts(e);
            let (mg, mu, md) = (self.matrix(wg)?, self.matrix(wu)?, self.matrix(wd)?);
            if (mg.rows, mu.rows, md.rows, mg.cols, md.cols) != (ff, ff, d, d, ff) {
                return Err(shape(
                    OP,
                    format!("expert {e} has another shape than expert 0"),
                ));
            }
            let order = pe
                .iter()
                .map(|&i| i32::try_from(i).map_err(|_| shape(OP, format!("pair {i}"))))
                .collect::<Result<Vec<i32>>>()?;
            let order = self.dev.stream.clone_htod(&order).map_err(driver(OP))?;
            self.dev
                .moe_gather_f32(x, &order, &bufs.x, d, k, (m, n))
                .map_err(kernel(OP))?;
            self.matmul_shared([wg, wu], &bufs.x, m, [&mut bufs.gate, &mut bufs.up])?;
            if let Some([bg, bu, _]) = bias {
                self.add_bias(&mut bufs.gate, m * ff, bg, ff)?;
                self.add_bias(&mut bufs.up, m * ff, bu, ff)?;
            }
            self.gated_act(act, &mut bufs.gate, &bufs.up, m, ff)?;
            self.matmul(wd, &bufs.gate, m, &mut bufs.y)?;
            if let Some([_, _, bd]) = bias {
                self.add_bias(&mut bufs.y, m * d, bd, d)?;
            }
            self.copy(Some(&bufs.y), 0, &mut bufs.slots, row * d, m * d)?;
            for (r, &i) in pe.iter().enumerate() {
                pos[i] = i32::try_from(row + r).map_err(|_| shape(OP, format!("row {row}")))?;
            }
            row += m;
        }
        if row != pairs {
            return Err(shape(OP, format!("{row} routed rows of {pairs} pairs")));
        }
        let pos = self.dev.stream.clone_htod(&pos).map_err(driver(OP))?;
        let wts = self
            .dev
            .stream
            .clone_htod(routing.weights())
            .map_err(driver(OP))?;
        self.dev
            .moe_combine(&bufs.slots, &pos, &wts, out, d, k, n)
            .map_err(kernel(OP))
    }

    fn top_k(
        &self,
        logits: &CudaSlice<f32>,
        row: usize,
        n_vocab: usize,
        out: &mut [(u32, f32)],
    ) -> Result<()> {
        let op = "top_k";
        let k = out.len();
        self.require(&Op::TopK { k })?;
        if k > n_vocab {
            return Err(shape(op, format!("{k} candidates of {n_vocab}")));
        }
        let at = row
            .checked_mul(n_vocab)
            .ok_or_else(|| shape(op, format!("row {row} of {n_vocab}")))?;
        let tmp = self.stage(op, logits, at, n_vocab)?;
        let words = self
            .dev
            .stream
            .alloc_zeros::<u32>(4 + 2 * k)
            .map_err(driver(op))?;
        let picked = self
            .dev
            .top_candidates(&tmp, k, &words)
            .map_err(kernel(op))?;
        if picked.best.len() < k {
            return Err(shape(
                op,
                format!("only {} values that are not NaN", picked.best.len()),
            ));
        }
        out.copy_from_slice(&picked.best);
        Ok(())
    }
}

/// Rows of a row-wise op over `len` values in rows of `dim`, its vector holding `w` values
/// and its buffers `have`.
fn norm_rows(op: &'static str, have: usize, len: usize, w: usize, dim: usize) -> Result<usize> {
    if dim == 0 || w != dim || !len.is_multiple_of(dim) {
        return Err(shape(
            op,
            format!("{len} values in rows of {dim} with a vector of {w}"),
        ));
    }
    check(op, have, 0, len)?;
    Ok(len / dim)
}

/// Heads of `head_dim` in rows of `width` values.
fn heads(op: &'static str, width: usize, head_dim: usize) -> Result<usize> {
    if head_dim == 0 || !width.is_multiple_of(head_dim) || !head_dim.is_multiple_of(2) {
        return Err(shape(op, format!("rows of {width} in heads of {head_dim}")));
    }
    Ok(width / head_dim)
}
