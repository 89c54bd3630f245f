//! [`CpuBackend`]: the contract of `ferrite-backend` on the CPU, over this crate's pool,
//! quantized products, attention, rope with the KV store, and norms.
//!
//! Each op checks its operands' lengths and then calls the kernel the forward pass called
//! before the contract existed, so the bits are those kernels' bits: thread-count
//! independent and row independent. This module never computes anything the kernels
//! below it do not: it only slices, checks and dispatches.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use ferrite_backend::{
    Act, AttnShape, Backend, BackendError, ExpertBufs, ExpertFfn, HostMatrix, KvType, Op, Result,
    Rope, RouteRule, Routing, Segment, SsmParams, Support, Values,
};
use ferrite_quant::kernels::{GatedAct, gated_act};
use ferrite_quant::simd_level;

use ferrite_arch::{ConvShape, DeltaNetShape, Mamba2Shape};

use crate::attention::{AttnJob, attend_many};
use crate::kv::KvCache;
use crate::ops::{
    RopeTable, add_assign, add_rows, gated_scalar, rms_norm, rope_scaled, sigmoid, swiglu_oai,
};
use crate::positions::{Rotary, rotate_and_store};
use crate::recurrent;
use crate::{CpuError, Matrix, ThreadPool, matmul, matmul_shared};

/// The CPU backend: every op runs on `pool`.
#[derive(Debug, Clone, Copy)]
pub struct CpuBackend<'p> {
    pool: &'p ThreadPool,
}

impl<'p> CpuBackend<'p> {
    /// The backend over `pool`.
    pub fn new(pool: &'p ThreadPool) -> CpuBackend<'p> {
        CpuBackend { pool }
    }

    /// The pool the ops run on.
    pub fn pool(&self) -> &'p ThreadPool {
        self.pool
    }
}

/// The rope angles of one pass: one table per distinct base, the first `n` filled for the
/// current pass (the memory of the others is reused).
#[derive(Debug, Default)]
pub struct CpuAngles {
    tables: Vec<RopeTable>,
    n: usize,
}

impl CpuAngles {
    /// The table of this pass for `base`, covering `rows` rows of `rot_dim` rotations.
    fn table(&self, rot_dim: usize, base: f32, rows: usize) -> Result<&RopeTable> {
        self.tables[..self.n]
            .iter()
            .find(|t| t.covers(rot_dim, base, rows))
            .ok_or_else(|| bad("rope", format!("no angles prepared for base {base}")))
    }
}

fn bad(op: &'static str, what: impl Into<String>) -> BackendError {
    BackendError::Shape {
        op,
        what: what.into(),
    }
}

fn kernel(op: &'static str) -> impl Fn(CpuError) -> BackendError {
    move |e| BackendError::Kernel {
        backend: "cpu",
        op,
        source: Box::new(e),
    }
}

/// `buf[at..at + len]`, or the error naming `op`.
fn get<'b>(op: &'static str, buf: &'b [f32], at: usize, len: usize) -> Result<&'b [f32]> {
    at.checked_add(len)
        .and_then(|end| buf.get(at..end))
        .ok_or_else(|| {
            bad(
                op,
                format!("{len} values at {at} of a buffer of {}", buf.len()),
            )
        })
}

/// `buf[at..at + len]` to write, or the error naming `op`.
fn get_mut<'b>(
    op: &'static str,
    buf: &'b mut [f32],
    at: usize,
    len: usize,
) -> Result<&'b mut [f32]> {
    let n = buf.len();
    at.checked_add(len)
        .and_then(|end| buf.get_mut(at..end))
        .ok_or_else(|| bad(op, format!("{len} values at {at} of a buffer of {n}")))
}

/// `a * b` as a length, or the error naming `op`.
fn mul(op: &'static str, a: usize, b: usize) -> Result<usize> {
    a.checked_mul(b).ok_or_else(|| bad(op, "size overflows"))
}

/// Rows of the pass (all segments') and a check that each fits its store, with rows of
/// `width` values.
fn check_segs(op: &'static str, segs: &[Segment<'_, KvCache>], width: usize) -> Result<usize> {
    let mut rows = 0usize;
    for s in segs {
        if s.pos0.checked_add(s.len).is_none_or(|end| end > s.kv.ctx()) {
            return Err(bad(
                op,
                format!(
                    "positions {}+{} past a context of {}",
                    s.pos0,
                    s.len,
                    s.kv.ctx()
                ),
            ));
        }
        if s.kv.row_values() != width {
            return Err(bad(
                op,
                format!(
                    "rows of {width} values for a store of {}",
                    s.kv.row_values()
                ),
            ));
        }
        rows += s.len;
    }
    Ok(rows)
}

/// `len` values in whole rows of `dim`, with a weight of `w` values per row.
fn check_rows(op: &'static str, len: usize, w: usize, dim: usize) -> Result<()> {
    if w != dim || dim == 0 || !len.is_multiple_of(dim) {
        return Err(bad(
            op,
            format!("{len} values in rows of {dim} with a weight of {w}"),
        ));
    }
    Ok(())
}

/// State slot `slot` of `kv`, whose slots must hold `len` values.
fn state_of<'k>(
    op: &'static str,
    kv: &'k mut KvCache,
    slot: usize,
    len: usize,
) -> Result<&'k mut [f32]> {
    let have = kv.state_len();
    if have != len {
        return Err(bad(
            op,
            format!("a state of {len} values for slots of {have}"),
        ));
    }
    kv.state_mut(slot)
        .ok_or_else(|| bad(op, format!("no recurrent state slot {slot}")))
}

/// A Mamba-2 shape's convolution channels, inner width, convolution history and state
/// slot length, or `None` where they overflow or the kernel has no taps.
fn mamba2_sizes(s: &Mamba2Shape) -> Option<(usize, usize, usize, usize)> {
    let inner = s.n_heads.checked_mul(s.head_dim)?;
    let bc = s.n_groups.checked_mul(s.d_state)?.checked_mul(2)?;
    let c = inner.checked_add(bc)?;
    let hist = s.conv_kernel.checked_sub(1)?.checked_mul(c)?;
    let len = hist.checked_add(inner.checked_mul(s.d_state)?)?;
    Some((c, inner, hist, len))
}

/// Position of each row `t` of the pass, by segment.
fn positions<'a>(segs: &'a [Segment<'_, KvCache>]) -> impl Iterator<Item = usize> + 'a {
    segs.iter().flat_map(|s| s.pos0..s.pos0 + s.len)
}

/// The divisors of a segment whose store holds `ctx` positions: LongRoPE's long set when
/// that is past its switch point, else the plain factors.
pub(crate) fn factors_at<'a>(r: &Rope<&'a [f32]>, ctx: usize) -> Option<&'a [f32]> {
    match r.long {
        Some((long, after)) if ctx > after => Some(long),
        _ => r.factors,
    }
}

/// LongRoPE's long divisors need the plain ones (the rows before the switch point use them).
fn check_rope(op: &'static str, r: &Rope<&[f32]>) -> Result<()> {
    if r.long.is_some() && r.factors.is_none() {
        return Err(bad(op, "long rope factors without the short ones"));
    }
    if r.rot_dim < 2 || r.rot_dim > r.head_dim || !r.rot_dim.is_multiple_of(2) {
        return Err(bad(
            op,
            format!("{} rotated values in heads of {}", r.rot_dim, r.head_dim),
        ));
    }
    Ok(())
}

impl Backend for CpuBackend<'_> {
    type Buf = Vec<f32>;
    type Weight<'a>
        = Matrix<'a>
    where
        Self: 'a;
    type Vector<'a>
        = &'a [f32]
    where
        Self: 'a;
    type Kv = KvCache;
    type Angles = CpuAngles;

    fn name(&self) -> &'static str {
        "cpu"
    }

    fn supports(&self, op: &Op) -> Support {
        let weights = |ty| {
            if ferrite_quant::supports_dequantize(ty) {
                Support::Native
            } else {
                Support::Unsupported(format!("no CPU kernel reads {ty} weights"))
            }
        };
        match *op {
            Op::Embed { ty, .. }
            | Op::MatMul { ty, .. }
            | Op::MatMulShared { ty, .. }
            | Op::Logits { ty, .. }
            | Op::MoeExperts { ty, .. } => weights(ty),
            // Composed: the copy and the norm are the kernels' own, and a fused form would
            // save one pass over a row that is in cache anyway.
            Op::NormInto | Op::AddNorm => Support::Composed,
            Op::Attention {
                kv: KvType::Q8,
                head_dim,
                ..
            } if !head_dim.is_multiple_of(32) => {
                Support::Unsupported("q8 KV needs head sizes that are multiples of 32".into())
            }
            Op::Attention {
                kv: KvType::Q8,
                values: Values::InKeys { at, .. },
                ..
            } if !at.is_multiple_of(32) => Support::Unsupported(
                "q8 KV reads values in the keys from whole blocks of 32 only".into(),
            ),
            Op::TopK { k: 0 } => Support::Unsupported("no candidates asked for".into()),
            Op::DeltaRule { k_dim, .. } if k_dim > recurrent::MAX_K_DIM => Support::Unsupported(
                format!("key heads of more than {} values", recurrent::MAX_K_DIM),
            ),
            Op::RowGate
            | Op::GatedNorm
            | Op::GroupNorm
            | Op::ReluSq
            | Op::Conv1d { .. }
            | Op::DeltaRule { .. }
            | Op::SsmScan { .. } => Support::Native,
            Op::RmsNorm
            | Op::Add
            | Op::AddBias
            | Op::Copy
            | Op::Rope { .. }
            | Op::KvStore { .. }
            | Op::RopeStore { .. }
            | Op::Attention { .. }
            | Op::GatedAct { .. }
            | Op::MoeRoute { .. }
            | Op::TopK { .. } => Support::Native,
        }
    }

    fn alloc(&self, len: usize) -> Result<Vec<f32>> {
        let mut v = Vec::new();
        v.try_reserve_exact(len).map_err(|_| BackendError::Alloc {
            what: "activation buffer",
        })?;
        v.resize(len, 0.0);
        Ok(v)
    }

    fn upload(&self, src: &[f32], dst: &mut Vec<f32>, at: usize) -> Result<()> {
        get_mut("upload", dst, at, src.len())?.copy_from_slice(src);
        Ok(())
    }

    fn download(&self, src: &Vec<f32>, at: usize, dst: &mut [f32]) -> Result<()> {
        dst.copy_from_slice(get("download", src, at, dst.len())?);
        Ok(())
    }

    fn copy(
        &self,
        src: Option<&Vec<f32>>,
        from: usize,
        dst: &mut Vec<f32>,
        to: usize,
        len: usize,
    ) -> Result<()> {
        match src {
            Some(s) => get_mut("copy", dst, to, len)?.copy_from_slice(get("copy", s, from, len)?),
            None => {
                get("copy", dst, from, len)?;
                get("copy", dst, to, len)?;
                dst.copy_within(from..from + len, to);
            }
        }
        Ok(())
    }

    fn weight<'a>(&'a self, w: HostMatrix<'a>) -> Result<Matrix<'a>> {
        Ok(Matrix {
            ty: w.ty,
            rows: w.rows,
            cols: w.cols,
            data: w.data,
            packed: None,
        })
    }

    fn vector<'a>(&'a self, v: &'a [f32]) -> Result<&'a [f32]> {
        Ok(v)
    }

    fn kv(
        &self,
        ty: KvType,
        n_layer: usize,
        ctx: usize,
        shape: (usize, usize),
        values: Values,
    ) -> Result<KvCache> {
        KvCache::with_values(ty, n_layer, ctx, shape, values)
    }

    fn embed(&self, table: Matrix<'_>, tokens: &[u32], scale: f32, x: &mut Vec<f32>) -> Result<()> {
        let d = table.cols;
        let rb = table.data.len() / table.rows.max(1);
        let x = get_mut("embed", x, 0, mul("embed", tokens.len(), d)?)?;
        for (&tok, row) in tokens.iter().zip(x.chunks_exact_mut(d.max(1))) {
            let r = tok as usize;
            if r >= table.rows {
                return Err(bad(
                    "embed",
                    format!("token {tok} of a table of {} rows", table.rows),
                ));
            }
            ferrite_quant::dequantize(table.ty, &table.data[r * rb..(r + 1) * rb], row)
                .map_err(|e| kernel("embed")(CpuError::Quant(e)))?;
            if scale != 1.0 {
                row.iter_mut().for_each(|v| *v *= scale);
            }
        }
        Ok(())
    }

    fn matmul(&self, w: Matrix<'_>, x: &Vec<f32>, n: usize, y: &mut Vec<f32>) -> Result<()> {
        let x = get("matmul", x, 0, mul("matmul", n, w.cols)?)?;
        let y = get_mut("matmul", y, 0, mul("matmul", n, w.rows)?)?;
        matmul(self.pool, w, x, n, y).map_err(kernel("matmul"))
    }

    fn matmul_shared<const N: usize>(
        &self,
        ws: [Matrix<'_>; N],
        x: &Vec<f32>,
        n: usize,
        ys: [&mut Vec<f32>; N],
    ) -> Result<()> {
        let cols = ws.first().map_or(0, |w| w.cols);
        if ws.iter().any(|w| w.cols != cols) {
            return Err(bad("matmul_shared", "matrices of different widths"));
        }
        let x = get("matmul_shared", x, 0, mul("matmul_shared", n, cols)?)?;
        for (w, y) in ws.iter().zip(&ys) {
            get("matmul_shared", y, 0, mul("matmul_shared", n, w.rows)?)?;
        }
        let mut i = 0;
        let mut ys = ys.map(|y| {
            let len = n * ws[i].rows;
            i += 1;
            &mut y[..len]
        });
        matmul_shared(self.pool, &ws, x, n, &mut ys).map_err(kernel("matmul_shared"))
    }

    fn logits(&self, w: Matrix<'_>, x: &Vec<f32>, n: usize, out: &mut [f32]) -> Result<()> {
        let x = get("logits", x, 0, mul("logits", n, w.cols)?)?;
        let out = get_mut("logits", out, 0, mul("logits", n, w.rows)?)?;
        matmul(self.pool, w, x, n, out).map_err(kernel("logits"))
    }

    fn rms_norm(
        &self,
        x: &mut Vec<f32>,
        len: usize,
        w: &[f32],
        dim: usize,
        eps: f32,
    ) -> Result<()> {
        check_rows("rms_norm", len, w.len(), dim)?;
        rms_norm(get_mut("rms_norm", x, 0, len)?, w, eps);
        Ok(())
    }

    fn add(&self, x: &mut Vec<f32>, y: &Vec<f32>, len: usize) -> Result<()> {
        add_assign(get_mut("add", x, 0, len)?, get("add", y, 0, len)?);
        Ok(())
    }

    fn add_bias(&self, x: &mut Vec<f32>, len: usize, b: &[f32], dim: usize) -> Result<()> {
        if b.len() != dim || dim == 0 || !len.is_multiple_of(dim) {
            return Err(bad(
                "add_bias",
                format!("{len} values in rows of {dim} with a bias of {}", b.len()),
            ));
        }
        add_rows(get_mut("add_bias", x, 0, len)?, b);
        Ok(())
    }

    fn gated_act(
        &self,
        act: Act,
        gate: &mut Vec<f32>,
        up: &Vec<f32>,
        n: usize,
        width: usize,
    ) -> Result<()> {
        let len = mul("gated_act", n, width)?;
        let (gate, up) = (
            get_mut("gated_act", gate, 0, len)?,
            get("gated_act", up, 0, len)?,
        );
        let act = match act {
            Act::Silu => GatedAct::Silu,
            Act::GeluTanh => GatedAct::GeluTanh,
            // gpt-oss runs it in its experts only; no vector kernel.
            Act::SwigluOai => {
                for (g, &u) in gate.iter_mut().zip(up) {
                    *g = swiglu_oai(*g, u);
                }
                return Ok(());
            }
            // Qwen3-Next's attention gate: one pass over the heads' outputs.
            Act::Sigmoid => {
                for (g, &u) in gate.iter_mut().zip(up) {
                    *g = sigmoid(*g) * u;
                }
                return Ok(());
            }
        };
        let level = simd_level();
        let pool = self.pool;
        // Element-wise, the same bits wherever an element falls, so the split over the pool
        // (disjoint ranges, a multiple of 16) does not depend on the thread count. One row
        // is not worth waking the pool for.
        if n == 1 {
            return gated_act(level, act, gate, up).map_err(|e| kernel("gated_act")(e.into()));
        }
        let per = gate.len().div_ceil(16 * pool.n_threads()).max(1) * 16;
        let parts = Mutex::new(gate.chunks_mut(per).zip(up.chunks(per)));
        let failed = AtomicBool::new(false);
        pool.run(|_, _| {
            while let Some((g, u)) = parts.lock().ok().and_then(|mut it| it.next()) {
                if gated_act(level, act, g, u).is_err() {
                    failed.store(true, Ordering::Relaxed);
                }
            }
        });
        if failed.into_inner() {
            return Err(bad("gated_act", "the activation kernel rejected its level"));
        }
        Ok(())
    }

    fn row_gate(&self, x: &mut Vec<f32>, g: &Vec<f32>, n: usize, width: usize) -> Result<()> {
        let x = get_mut("row_gate", x, 0, mul("row_gate", n, width)?)?;
        let g = get("row_gate", g, 0, n)?;
        for (row, &gv) in x.chunks_exact_mut(width.max(1)).zip(g) {
            let s = sigmoid(gv);
            row.iter_mut().for_each(|v| *v *= s);
        }
        Ok(())
    }

    fn gated_norm(
        &self,
        x: &mut Vec<f32>,
        z: &Vec<f32>,
        len: usize,
        w: &[f32],
        dim: usize,
        eps: f32,
    ) -> Result<()> {
        check_rows("gated_norm", len, w.len(), dim)?;
        let z = get("gated_norm", z, 0, len)?;
        recurrent::gated_norm(get_mut("gated_norm", x, 0, len)?, z, w, eps);
        Ok(())
    }

    fn kv_state(&self, kv: &mut KvCache, slots: usize, len: usize) -> Result<()> {
        kv.set_state(slots, len)
    }

    fn state_get(&self, kv: &KvCache, out: &mut Vec<f32>) -> Result<()> {
        out.clear();
        out.extend_from_slice(kv.state());
        Ok(())
    }

    fn state_set(&self, kv: &mut KvCache, values: Option<&[f32]>) -> Result<()> {
        match values {
            None => kv.clear_state(),
            Some(v) if v.len() == kv.state().len() => kv.state_all_mut().copy_from_slice(v),
            Some(v) => {
                return Err(bad(
                    "state_set",
                    format!("{} values for a state of {}", v.len(), kv.state().len()),
                ));
            }
        }
        Ok(())
    }

    fn group_norm(
        &self,
        x: &mut Vec<f32>,
        len: usize,
        w: &[f32],
        width: usize,
        group: usize,
        eps: f32,
    ) -> Result<()> {
        check_rows("group_norm", len, w.len(), width)?;
        if group == 0 || !width.is_multiple_of(group) {
            return Err(bad(
                "group_norm",
                format!("groups of {group} in rows of {width}"),
            ));
        }
        recurrent::group_norm(get_mut("group_norm", x, 0, len)?, w, group, eps);
        Ok(())
    }

    fn relu_sq(&self, x: &mut Vec<f32>, len: usize) -> Result<()> {
        recurrent::relu_sq(get_mut("relu_sq", x, 0, len)?);
        Ok(())
    }

    fn conv1d(
        &self,
        s: ConvShape,
        slot: usize,
        x: &Vec<f32>,
        w: &[f32],
        bias: Option<&[f32]>,
        segs: &mut [Segment<'_, KvCache>],
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let (c, k) = (s.channels, s.kernel);
        let hist = if k >= 2 && c > 0 {
            (k - 1).checked_mul(c).filter(|&h| h <= s.state_len)
        } else {
            None
        };
        let Some(hist) = hist.filter(|_| Some(w.len()) == c.checked_mul(k)) else {
            return Err(bad(
                "conv1d",
                format!(
                    "{} taps for {c} channels of {k} in a state of {}",
                    w.len(),
                    s.state_len
                ),
            ));
        };
        if let Some(b) = bias.filter(|b| b.len() != c) {
            return Err(bad(
                "conv1d",
                format!("{} biases for {c} channels", b.len()),
            ));
        }
        let mut at = 0;
        for seg in segs.iter_mut() {
            let len = mul("conv1d", seg.len, c)?;
            let state = state_of("conv1d", seg.kv, slot, s.state_len)?;
            let state = &mut state[..hist];
            let xs = get("conv1d", x, at, len)?;
            let o = get_mut("conv1d", out, at, len)?;
            recurrent::conv1d((c, k), xs, (w, bias), state, o);
            at += len;
        }
        Ok(())
    }

    fn delta_rule(
        &self,
        s: &DeltaNetShape,
        slot: usize,
        qkv: &Vec<f32>,
        (beta, alpha): (&Vec<f32>, &Vec<f32>),
        (a, dt_bias): (&[f32], &[f32]),
        segs: &mut [Segment<'_, KvCache>],
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let (c, nv) = (s.conv_channels(), s.v_heads);
        if a.len() != nv || dt_bias.len() != nv || s.k_dim > recurrent::MAX_K_DIM {
            return Err(bad(
                "delta_rule",
                format!(
                    "{nv} value heads with {} rates and {} biases",
                    a.len(),
                    dt_bias.len()
                ),
            ));
        }
        let mut qk = [0.0f32; 2 * recurrent::MAX_K_DIM];
        let qk = &mut qk[..2 * s.k_dim];
        let (mut at, mut row) = (0, 0);
        for seg in segs.iter_mut() {
            let n = seg.len;
            let state = state_of("delta_rule", seg.kv, slot, s.state_len())?;
            let m = &mut state[(s.conv_kernel - 1) * c..];
            let gates = (
                get("delta_rule", beta, row * nv, n * nv)?,
                get("delta_rule", alpha, row * nv, n * nv)?,
            );
            let x = get("delta_rule", qkv, at, mul("delta_rule", n, c)?)?;
            let o = get_mut("delta_rule", out, row * s.inner(), n * s.inner())?;
            recurrent::delta_rule(s, x, gates, (a, dt_bias), m, qk, o);
            at += n * c;
            row += n;
        }
        Ok(())
    }

    fn ssm_scan(
        &self,
        s: &Mamba2Shape,
        slot: usize,
        xbc: &Vec<f32>,
        dt: &Vec<f32>,
        params: SsmParams<&[f32]>,
        segs: &mut [Segment<'_, KvCache>],
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let SsmParams { a, d, dt_bias, .. } = params;
        let (nh, ng) = (s.n_heads, s.n_groups);
        let sizes = mamba2_sizes(s);
        let Some((c, inner, hist, state_len)) = sizes.filter(|_| {
            nh > 0 && ng > 0 && nh.is_multiple_of(ng) && s.head_dim > 0 && s.d_state > 0
        }) else {
            return Err(bad(
                "ssm_scan",
                format!(
                    "{nh} heads of {} in {ng} groups of {} with {} taps",
                    s.head_dim, s.d_state, s.conv_kernel
                ),
            ));
        };
        if a.len() != nh || d.len() != nh || dt_bias.len() != nh {
            return Err(bad(
                "ssm_scan",
                format!(
                    "{nh} heads with {} rates, {} skips and {} biases",
                    a.len(),
                    d.len(),
                    dt_bias.len()
                ),
            ));
        }
        let (mut at, mut row) = (0, 0);
        for seg in segs.iter_mut() {
            let n = seg.len;
            let state = state_of("ssm_scan", seg.kv, slot, state_len)?;
            let m = &mut state[hist..];
            let x = get("ssm_scan", xbc, at, mul("ssm_scan", n, c)?)?;
            let steps = get(
                "ssm_scan",
                dt,
                mul("ssm_scan", row, nh)?,
                mul("ssm_scan", n, nh)?,
            )?;
            let o = get_mut(
                "ssm_scan",
                out,
                mul("ssm_scan", row, inner)?,
                mul("ssm_scan", n, inner)?,
            )?;
            recurrent::ssm_scan(s, x, steps, params, m, o);
            at += n * c;
            row += n;
        }
        Ok(())
    }

    fn rope_prepare(
        &self,
        angles: &mut CpuAngles,
        rot_dim: usize,
        bases: &mut dyn Iterator<Item = f32>,
        segs: &[Segment<'_, KvCache>],
    ) -> Result<()> {
        let rows: usize = segs.iter().map(|s| s.len).sum();
        angles.n = 0;
        for base in bases {
            if angles.tables[..angles.n]
                .iter()
                .any(|t| t.covers(rot_dim, base, rows))
            {
                continue;
            }
            if angles.n == angles.tables.len() {
                angles.tables.push(RopeTable::default());
            }
            angles.tables[angles.n].fill(rot_dim, base, positions(segs));
            angles.n += 1;
        }
        Ok(())
    }

    fn rope(
        &self,
        r: &Rope<&[f32]>,
        angles: &CpuAngles,
        x: &mut Vec<f32>,
        width: usize,
        segs: &[Segment<'_, KvCache>],
    ) -> Result<()> {
        let rows: usize = segs.iter().map(|s| s.len).sum();
        if r.head_dim == 0 || !width.is_multiple_of(r.head_dim) {
            return Err(bad(
                "rope",
                format!("rows of {width} values in heads of {}", r.head_dim),
            ));
        }
        check_rope("rope", r)?;
        let x = get_mut("rope", x, 0, mul("rope", rows, width)?)?;
        let table = match r.factors {
            Some(_) => None,
            None => Some(angles.table(r.rot_dim, r.base, rows)?),
        };
        let rows = segs.iter().flat_map(|s| {
            let f = factors_at(r, s.kv.ctx());
            (s.pos0..s.pos0 + s.len).map(move |pos| (pos, f))
        });
        for (t, (row, (pos, f))) in x.chunks_exact_mut(width).zip(rows).enumerate() {
            match (f, table) {
                (Some(f), _) => rope_scaled(row, (r.head_dim, r.rot_dim), pos, r.base, r.style, f),
                (None, Some(table)) => table.apply(row, r.head_dim, t, r.style),
                (None, None) => {}
            }
        }
        Ok(())
    }

    fn kv_store(
        &self,
        layer: usize,
        k: &Vec<f32>,
        v: &Vec<f32>,
        width: usize,
        segs: &mut [Segment<'_, KvCache>],
    ) -> Result<()> {
        let rows = check_segs("kv_store", segs, width)?;
        let len = mul("kv_store", rows, width)?;
        let (k, v) = (get("kv_store", k, 0, len)?, get("kv_store", v, 0, len)?);
        let mut at = 0;
        for s in segs.iter_mut() {
            if layer >= s.kv.n_layer() {
                return Err(bad(
                    "kv_store",
                    format!("layer {layer} of {}", s.kv.n_layer()),
                ));
            }
            let span = at * width..(at + s.len) * width;
            s.kv.store(layer, s.pos0, &k[span.clone()], &v[span]);
            at += s.len;
        }
        Ok(())
    }

    fn rope_store(
        &self,
        r: &Rope<&[f32]>,
        angles: &CpuAngles,
        layer: usize,
        (q, q_dim): (&mut Vec<f32>, usize),
        (k, v, kv_dim): (&mut Vec<f32>, &Vec<f32>, usize),
        segs: &mut [Segment<'_, KvCache>],
    ) -> Result<()> {
        let rows = check_segs("rope_store", segs, kv_dim)?;
        if segs.iter().any(|s| layer >= s.kv.n_layer()) {
            return Err(bad(
                "rope_store",
                format!("layer {layer} past a store's layers"),
            ));
        }
        if r.head_dim == 0
            || !q_dim.is_multiple_of(r.head_dim)
            || !kv_dim.is_multiple_of(r.head_dim)
        {
            return Err(bad("rope_store", "rows are not whole heads"));
        }
        check_rope("rope_store", r)?;
        let table = match r.factors {
            Some(_) => None,
            None => Some(angles.table(r.rot_dim, r.base, rows)?),
        };
        let rotary = Rotary {
            q_dim,
            kv_dim,
            rope: r,
            table,
        };
        let q = get_mut("rope_store", q, 0, mul("rope_store", rows, q_dim)?)?;
        let k = get_mut("rope_store", k, 0, mul("rope_store", rows, kv_dim)?)?;
        let v = get("rope_store", v, 0, rows * kv_dim)?;
        rotate_and_store(self.pool, &rotary, layer, q, k, v, segs);
        Ok(())
    }

    fn attention(
        &self,
        shape: &AttnShape,
        layer: usize,
        q: &Vec<f32>,
        sinks: Option<&[f32]>,
        segs: &[Segment<'_, KvCache>],
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let kv_dim = mul("attention", shape.n_kv_head, shape.head_dim)?;
        if let Some(s) = sinks
            && s.len() != shape.n_head
        {
            return Err(bad(
                "attention",
                format!("{} sink logits for {} heads", s.len(), shape.n_head),
            ));
        }
        let qd = mul("attention", shape.n_head, shape.head_dim)?;
        shape
            .values
            .check(shape.head_dim)
            .map_err(|why| bad("attention", why))?;
        let od = mul("attention", shape.n_head, shape.values.dim(shape.head_dim))?;
        if shape.n_kv_head == 0 || !shape.n_head.is_multiple_of(shape.n_kv_head) {
            return Err(bad(
                "attention",
                "query heads are not a multiple of the KV heads",
            ));
        }
        let rows = check_segs("attention", segs, kv_dim)?;
        if segs.iter().any(|s| layer >= s.kv.n_layer()) {
            return Err(bad(
                "attention",
                format!("layer {layer} past a store's layers"),
            ));
        }
        let (mut qs, mut att) = (
            get("attention", q, 0, mul("attention", rows, qd)?)?,
            get_mut("attention", out, 0, mul("attention", rows, od)?)?,
        );
        // The job list is the one allocation of a decode step: a few entries per layer.
        let mut jobs: Vec<AttnJob<'_>> = Vec::with_capacity(segs.len());
        for seg in segs {
            let (q_seg, q_rest) = qs.split_at(seg.len * qd);
            let (att_seg, att_rest) = att.split_at_mut(seg.len * od);
            (qs, att) = (q_rest, att_rest);
            jobs.push(AttnJob {
                cache: &*seg.kv,
                pos0: seg.pos0,
                q: q_seg,
                out: att_seg,
            });
        }
        attend_many(self.pool, shape, layer, sinks, &mut jobs);
        Ok(())
    }

    fn moe_route(
        &self,
        logits: &Vec<f32>,
        routing: &mut Routing,
        rule: &RouteRule,
        bias: Option<&[f32]>,
    ) -> Result<()> {
        let ne = routing.n_expert();
        // Once per pass: a rule that cannot route these experts is an error here, not a
        // fallback inside every token's routing.
        rule.check(ne, routing.k())
            .map_err(|why| bad("moe_route", why))?;
        let logits = get(
            "moe_route",
            logits,
            0,
            mul("moe_route", routing.rows(), ne)?,
        )?;
        for (t, row) in logits.chunks_exact(ne.max(1)).enumerate() {
            routing.route(t, row, rule, bias);
        }
        routing.group();
        Ok(())
    }

    fn moe_experts<'w>(
        &self,
        x: &Vec<f32>,
        routing: &Routing,
        experts: &dyn Fn(usize) -> ExpertFfn<Matrix<'w>, &'w [f32]>,
        act: Act,
        bufs: &mut ExpertBufs<Vec<f32>>,
        out: &mut Vec<f32>,
    ) -> Result<()>
    where
        Self: 'w,
    {
        const OP: &str = "moe_experts";
        let (n, k) = (routing.rows(), routing.k());
        let Some([g0, _, d0]) = (routing.n_expert() > 0).then(|| experts(0).mats) else {
            return Err(bad(OP, "no experts"));
        };
        let (d, ff) = (d0.rows, g0.rows);
        let x = get(OP, x, 0, mul(OP, n, d)?)?;
        get(OP, &bufs.x, 0, mul(OP, n, d)?)?;
        get(OP, &bufs.y, 0, n * d)?;
        get(OP, &bufs.gate, 0, mul(OP, n, ff)?)?;
        get(OP, &bufs.up, 0, n * ff)?;
        get(OP, &bufs.slots, 0, mul(OP, n * k, d)?)?;
        let out = get_mut(OP, out, 0, n * d)?;
        // The expert FFN's activation is the scalar one, element by element: a routed row's
        // bits then do not depend on where in the gathered block it falls.
        let f = gated_scalar(act);
        for e in 0..routing.n_expert() {
            let pairs = routing.pairs(e);
            let m = pairs.len();
            if m == 0 {
                continue;
            }
            let ExpertFfn {
                mats: [wg, wu, wd],
                bias,
            } = experts(e);
            if (wg.rows, wu.rows, wd.rows, wg.cols, wd.cols) != (ff, ff, d, d, ff) {
                return Err(bad(
                    OP,
                    format!("expert {e} has another shape than expert 0"),
                ));
            }
            if let Some([bg, bu, bd]) = bias
                && (bg.len(), bu.len(), bd.len()) != (ff, ff, d)
            {
                return Err(bad(
                    OP,
                    format!("expert {e}'s biases are not {ff}, {ff}, {d}"),
                ));
            }
            for (r, &i) in pairs.iter().enumerate() {
                let t = i / k;
                bufs.x[r * d..(r + 1) * d].copy_from_slice(&x[t * d..(t + 1) * d]);
            }
            let (xg, gate, up, y) = (
                &bufs.x[..m * d],
                &mut bufs.gate[..m * ff],
                &mut bufs.up[..m * ff],
                &mut bufs.y[..m * d],
            );
            matmul_shared(self.pool, &[wg, wu], xg, m, &mut [&mut *gate, &mut *up])
                .map_err(kernel(OP))?;
            if let Some([bg, bu, _]) = bias {
                add_rows(gate, bg);
                add_rows(up, bu);
            }
            for (a, &u) in gate.iter_mut().zip(up.iter()) {
                *a = f(*a, u);
            }
            matmul(self.pool, wd, gate, m, y).map_err(kernel(OP))?;
            if let Some([_, _, bd]) = bias {
                add_rows(y, bd);
            }
            for (r, &i) in pairs.iter().enumerate() {
                bufs.slots[i * d..(i + 1) * d].copy_from_slice(&y[r * d..(r + 1) * d]);
            }
        }
        let weights = routing.weights();
        for (t, o) in out.chunks_exact_mut(d.max(1)).enumerate() {
            o.fill(0.0);
            for slot in 0..k {
                let i = t * k + slot;
                let wt = weights[i];
                for (a, &b) in o.iter_mut().zip(&bufs.slots[i * d..(i + 1) * d]) {
                    *a += wt * b;
                }
            }
        }
        Ok(())
    }

    fn top_k(
        &self,
        logits: &Vec<f32>,
        row: usize,
        n_vocab: usize,
        out: &mut [(u32, f32)],
    ) -> Result<()> {
        let k = out.len();
        if k == 0 || k > n_vocab || u32::try_from(n_vocab).is_err() {
            return Err(bad("top_k", format!("{k} candidates of {n_vocab}")));
        }
        let row = get("top_k", logits, mul("top_k", row, n_vocab)?, n_vocab)?;
        let mut filled = 0;
        for (i, &v) in row.iter().enumerate() {
            // NaN is never a candidate; a later equal value never displaces an earlier one.
            if v.is_nan() || (filled == k && v <= out[k - 1].1) {
                continue;
            }
            let mut at = filled.min(k - 1);
            while at > 0 && out[at - 1].1 < v {
                out[at] = out[at - 1];
                at -= 1;
            }
            out[at] = (i as u32, v);
            filled = (filled + 1).min(k);
        }
        if filled < k {
            return Err(bad(
                "top_k",
                format!("only {filled} values that are not NaN"),
            ));
        }
        Ok(())
    }
}
