//! backend_ops, the conformance harness every backend runs (in the spirit of llama.cpp's
//! test-backend-ops): each [`Op`], each weight type in [`ALL_TYPES`], boundary shapes (one
//! row, odd rows, rows and columns that straddle the kernels' tiles, long and windowed
//! contexts, several sessions' segments in one call), run through the contract and compared
//! with a naive f64 reference written here with plain loops.
//!
//! The reference shares no code with any backend's kernels: weights are read through
//! `ferrite_quant::dequantize_ref`, the scalar dequantizers checked against external
//! vectors, and everything else is computed here. Each case reports whether every value
//! was finite, the largest absolute and relative errors, and its bound; an op the backend
//! refuses in [`Backend::supports`] is listed as refused, never counted as a pass. A new
//! backend plugs in by implementing [`Backend`] and calling [`run`] from its tests.
//!
//! This module never decides what a backend may refuse; it only reports it.

use std::fmt;

use ferrite_gguf::{ALL_TYPES, GgmlType};

use crate::{
    Act, AttnShape, Backend, ExpertBufs, HostMatrix, KvType, Op, Rope, RopeStyle, Routing, Segment,
    Support, Values,
};

mod mamba2;
mod recurrent;
mod reference;

use reference::Rng;

/// Allowed error of a weight product, relative to `Σ |w_k · x_k|` of its output: covers
/// 16-bit activations (each rounded to within 2^-16 of its block's largest value); f32
/// activations stay near 1e-7.
pub const PRODUCT_TOL: f64 = 1e-4;
/// Allowed relative error of element-wise and row-wise f32 ops (a few ulp).
pub const ELEMENT_TOL: f64 = 2e-6;
/// Allowed error of attention outputs, relative to the largest value magnitude in the
/// attended rows.
pub const ATTENTION_TOL: f64 = 1e-5;

/// What one case found.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// The op ran and was compared.
    Checked {
        /// Every output value was finite.
        finite: bool,
        /// Largest absolute error.
        max_abs: f64,
        /// Largest error relative to the reference value (where it is not zero).
        max_rel: f64,
        /// Largest ratio of an error to its bound: the case passes at 1 or below.
        ratio: f64,
        /// The bound, in words.
        bound: &'static str,
    },
    /// The backend refused the op before evaluation (its reason).
    Refused(String),
    /// The op returned an error, or the result did not have the reference's shape.
    Failed(String),
}

/// One case: an op, its data type and shape, and the verdict.
#[derive(Debug, Clone, PartialEq)]
pub struct Case {
    /// [`Op::name`].
    pub op: &'static str,
    /// [`Op::dtype`].
    pub dtype: String,
    /// The shape, in words.
    pub shape: String,
    /// What was found.
    pub verdict: Verdict,
}

impl Case {
    /// Whether the case ran, was finite and stayed within its bound.
    pub fn passed(&self) -> bool {
        matches!(self.verdict, Verdict::Checked { finite: true, ratio, .. } if ratio <= 1.0)
    }
}

/// Every case of one backend's run.
#[derive(Debug, Clone)]
pub struct Report {
    /// [`Backend::name`].
    pub backend: &'static str,
    /// The cases, in order.
    pub cases: Vec<Case>,
}

impl Report {
    /// Cases that passed.
    pub fn passed(&self) -> usize {
        self.cases.iter().filter(|c| c.passed()).count()
    }

    /// Cases the backend refused.
    pub fn refused(&self) -> usize {
        let refused = |c: &&Case| matches!(c.verdict, Verdict::Refused(_));
        self.cases.iter().filter(refused).count()
    }

    /// Cases that ran and failed (an error, a non-finite value or an error past its bound).
    pub fn failures(&self) -> Vec<&Case> {
        let failed = |c: &&Case| !c.passed() && !matches!(c.verdict, Verdict::Refused(_));
        self.cases.iter().filter(failed).collect()
    }

    /// The ops (by name) that at least one case checked, in order.
    pub fn ops_checked(&self) -> Vec<&'static str> {
        let mut ops: Vec<&'static str> = Vec::new();
        for c in self.cases.iter().filter(|c| c.passed()) {
            if !ops.contains(&c.op) {
                ops.push(c.op);
            }
        }
        ops
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "backend_ops on {}:", self.backend)?;
        for c in &self.cases {
            let head = format!("{:<13} {:<8} {:<44}", c.op, c.dtype, c.shape);
            match &c.verdict {
                Verdict::Checked {
                    finite,
                    max_abs,
                    max_rel,
                    ratio,
                    bound,
                } => writeln!(
                    f,
                    "{head} {} finite={finite} max_abs={max_abs:.2e} max_rel={max_rel:.2e} \
                     err/bound={ratio:.3} bound: {bound}",
                    if c.passed() { "ok  " } else { "FAIL" }
                )?,
                Verdict::Refused(why) => writeln!(f, "{head} refused: {why}")?,
                Verdict::Failed(why) => writeln!(f, "{head} FAIL {why}")?,
            }
        }
        writeln!(
            f,
            "{} passed, {} refused (not passes), {} failed",
            self.passed(),
            self.refused(),
            self.failures().len()
        )
    }
}

/// The row width [`ops`] asks about for the weight ops: whole blocks of every type and
/// whole 32-value units; each case then asks again for its own width.
pub const LISTED_COLS: usize = 256;

/// Every op of the contract the harness runs: the weight ops once per type of
/// [`ALL_TYPES`], the others once per variant that changes the code path.
pub fn ops() -> Vec<Op> {
    let mut ops = Vec::new();
    for ty in ALL_TYPES {
        let cols = LISTED_COLS;
        ops.extend([
            Op::Embed { ty, cols },
            Op::MatMul { ty, cols },
            Op::MatMulShared { ty, cols },
            Op::Logits { ty, cols },
            Op::MoeExperts {
                ty,
                act: Act::Silu,
                bias: false,
                cols,
            },
        ]);
    }
    ops.push(Op::MoeExperts {
        ty: GgmlType::F32,
        act: Act::GeluTanh,
        bias: false,
        cols: LISTED_COLS,
    });
    // gpt-oss's experts: biased products and the clamped SwiGLU.
    for ty in [GgmlType::F32, GgmlType::MXFP4] {
        ops.push(Op::MoeExperts {
            ty,
            act: Act::SwigluOai,
            bias: true,
            cols: LISTED_COLS,
        });
    }
    ops.extend([
        Op::RmsNorm,
        Op::NormInto,
        Op::AddNorm,
        Op::Add,
        Op::AddBias,
        Op::Copy,
    ]);
    for style in [RopeStyle::Interleaved, RopeStyle::HalfSplit] {
        for (scaled, long) in [(false, false), (true, false), (true, true)] {
            ops.push(Op::Rope {
                style,
                scaled,
                long,
            });
            ops.push(Op::RopeStore {
                style,
                scaled,
                long,
                kv: KvType::F16,
            });
        }
    }
    for kv in [KvType::F32, KvType::F16, KvType::Q8] {
        ops.push(Op::KvStore { kv });
        for head_dim in [8, 64] {
            for softcap in [false, true] {
                ops.push(Op::Attention {
                    kv,
                    head_dim,
                    softcap,
                    values: Values::Own,
                    sinks: false,
                });
            }
            ops.push(Op::Attention {
                kv,
                head_dim,
                softcap: false,
                values: Values::Own,
                sinks: true,
            });
        }
        // MLA's latent: values in the keys, after their rope part (DeepSeek's 64 + 512, and
        // a head that q8 blocks cannot split).
        for (head_dim, at) in [(64, 32), (40, 8)] {
            ops.push(Op::Attention {
                kv,
                head_dim,
                softcap: false,
                values: Values::InKeys { at, dim: 32 },
                sinks: false,
            });
        }
    }
    ops.extend([
        Op::GatedAct { act: Act::Silu },
        Op::GatedAct { act: Act::GeluTanh },
        Op::GatedAct {
            act: Act::SwigluOai,
        },
        Op::GatedAct { act: Act::Sigmoid },
        Op::RowGate,
        Op::GatedNorm,
        Op::Conv1d {
            kernel: 4,
            bias: false,
        },
        Op::DeltaRule { k_dim: 6, v_dim: 5 },
        Op::Conv1d {
            kernel: 4,
            bias: true,
        },
        Op::SsmScan {
            d_state: 5,
            head_dim: 3,
        },
        Op::GroupNorm,
        Op::ReluSq,
        Op::MoeRoute { n_expert: 4 },
        Op::MoeRoute { n_expert: 9 },
        Op::TopK { k: 0 },
        Op::TopK { k: 1 },
        Op::TopK { k: 5 },
    ]);
    ops
}

/// Runs every op of [`ops`] on `b`.
pub fn run<B: Backend>(b: &B) -> Report {
    let mut report = Report {
        backend: b.name(),
        cases: Vec::new(),
    };
    let mut rng = Rng(0x0BAC_4E4D_0005);
    for op in ops() {
        let mut out = Out {
            op,
            cases: &mut report.cases,
        };
        if let Support::Unsupported(why) = b.supports(&op) {
            out.push("any", Verdict::Refused(why));
            continue;
        }
        let r = &mut rng;
        match op {
            Op::Embed { ty, .. } => reference::embed(b, r, ty, &mut out),
            Op::MatMul { ty, .. } => reference::matmul(b, r, ty, &mut out),
            Op::MatMulShared { ty, .. } => reference::matmul_shared(b, r, ty, &mut out),
            Op::Logits { ty, .. } => reference::logits(b, r, ty, &mut out),
            Op::MoeExperts { ty, act, bias, .. } => {
                reference::moe_experts(b, r, ty, (act, bias), &mut out)
            }
            Op::RmsNorm | Op::NormInto | Op::AddNorm => reference::norms(b, r, op, &mut out),
            Op::Add | Op::AddBias | Op::Copy => reference::adds(b, r, op, &mut out),
            Op::Rope {
                style,
                scaled,
                long,
            } => reference::rope(b, r, style, (scaled, long), None, &mut out),
            Op::RopeStore {
                style,
                scaled,
                long,
                kv,
            } => reference::rope(b, r, style, (scaled, long), Some(kv), &mut out),
            Op::KvStore { kv } => reference::kv_store(b, r, kv, &mut out),
            Op::Attention {
                kv,
                head_dim,
                softcap,
                values,
                sinks,
            } => reference::attention(b, r, kv, (head_dim, values), (softcap, sinks), &mut out),
            Op::GatedAct { act } => reference::gated_act(b, r, act, &mut out),
            Op::RowGate => recurrent::gates(b, r, false, &mut out),
            Op::GatedNorm => recurrent::gates(b, r, true, &mut out),
            // The delta rule runs on the convolution's output: one case, each op's half.
            Op::Conv1d { bias: false, .. } => recurrent::delta_net(b, r, false, &mut out),
            Op::DeltaRule { .. } => recurrent::delta_net(b, r, true, &mut out),
            // A Mamba-2 mixer's: the biased convolution, then the scan on its output.
            Op::Conv1d { bias: true, .. } => mamba2::conv_bias(b, r, &mut out),
            Op::SsmScan { .. } => mamba2::ssm_scan(b, r, &mut out),
            Op::GroupNorm => mamba2::group_norm_relu_sq(b, r, true, &mut out),
            Op::ReluSq => mamba2::group_norm_relu_sq(b, r, false, &mut out),
            Op::MoeRoute { n_expert } => reference::moe_route(b, r, n_expert, &mut out),
            Op::TopK { k } => reference::top_k(b, r, k, &mut out),
        }
    }
    report
}

/// Where the cases of one op go.
struct Out<'a> {
    op: Op,
    cases: &'a mut Vec<Case>,
}

impl Out<'_> {
    /// Records `b`'s refusal of `op`, the op of one case `shape`, and answers whether it
    /// refused: a backend may refuse some widths of a weight type it runs.
    fn refuses<B: Backend>(&mut self, b: &B, op: Op, shape: &str) -> bool {
        match b.supports(&op) {
            Support::Unsupported(why) => {
                self.push(shape, Verdict::Refused(why));
                true
            }
            Support::Native | Support::Composed => false,
        }
    }

    fn push(&mut self, shape: impl Into<String>, verdict: Verdict) {
        self.cases.push(Case {
            op: self.op.name(),
            dtype: self.op.dtype(),
            shape: shape.into(),
            verdict,
        });
    }

    /// Records `got` against `want` with the per-value bounds `bound` (described by `rule`),
    /// or the error that kept the op from producing `got`.
    fn compare(
        &mut self,
        shape: impl Into<String>,
        got: crate::Result<Vec<f32>>,
        want: &[f64],
        bound: &[f64],
        rule: &'static str,
    ) {
        let verdict = match got {
            Err(e) => Verdict::Failed(e.to_string()),
            Ok(got) if got.len() != want.len() => {
                Verdict::Failed(format!("{} values, expected {}", got.len(), want.len()))
            }
            Ok(got) => {
                let (mut max_abs, mut max_rel, mut ratio) = (0.0f64, 0.0f64, 0.0f64);
                let finite = got.iter().all(|v| v.is_finite());
                for ((&g, &w), &bd) in got.iter().zip(want).zip(bound) {
                    let e = (f64::from(g) - w).abs();
                    max_abs = max_abs.max(e);
                    if w != 0.0 {
                        max_rel = max_rel.max(e / w.abs());
                    }
                    ratio = ratio.max(if bd > 0.0 {
                        e / bd
                    } else if e == 0.0 {
                        0.0
                    } else {
                        f64::INFINITY
                    });
                }
                Verdict::Checked {
                    finite,
                    max_abs,
                    max_rel,
                    ratio,
                    bound: rule,
                }
            }
        };
        self.push(shape, verdict);
    }
}

/// `src` in a new buffer of `b`.
fn buf<B: Backend>(b: &B, src: &[f32]) -> crate::Result<B::Buf> {
    let mut x = b.alloc(src.len())?;
    b.upload(src, &mut x, 0)?;
    Ok(x)
}

/// The first `len` values of `x`.
fn host<B: Backend>(b: &B, x: &B::Buf, len: usize) -> crate::Result<Vec<f32>> {
    let mut out = vec![0.0; len];
    b.download(x, 0, &mut out)?;
    Ok(out)
}

/// A host matrix of `ty` with its values as the reference dequantizer reads them.
struct TestMatrix {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    bytes: Vec<u8>,
    values: Vec<f32>,
}

impl TestMatrix {
    fn host(&self) -> HostMatrix<'_> {
        HostMatrix {
            ty: self.ty,
            rows: self.rows,
            cols: self.cols,
            data: &self.bytes,
        }
    }
}

/// KV stores of `ctx` positions for segments at `(pos0, len)`, and the segments.
fn stores<B: Backend>(
    b: &B,
    kv: KvType,
    (heads, head_dim): (usize, usize),
    values: Values,
    spans: &[(usize, usize)],
) -> crate::Result<Vec<B::Kv>> {
    spans
        .iter()
        .map(|&(p, n)| b.kv(kv, 1, p + n, (heads, head_dim), values))
        .collect()
}

/// The segments of `stores` at `spans`.
fn segments<'a, K>(stores: &'a mut [K], spans: &[(usize, usize)]) -> Vec<Segment<'a, K>> {
    stores
        .iter_mut()
        .zip(spans)
        .map(|(kv, &(pos0, len))| Segment { kv, pos0, len })
        .collect()
}

/// The rope of one layer for the harness's shapes.
fn rope_args<V>(
    head_dim: usize,
    style: RopeStyle,
    factors: Option<V>,
    long: Option<(V, usize)>,
) -> Rope<V> {
    Rope {
        head_dim,
        rot_dim: head_dim,
        base: 10_000.0,
        style,
        factors,
        long,
    }
}

/// Shape and masking of the harness's attention cases.
fn attn_shape(
    n_head: usize,
    n_kv_head: usize,
    head_dim: usize,
    window: Option<usize>,
    softcap: Option<f32>,
    values: Values,
) -> AttnShape {
    AttnShape {
        n_head,
        n_kv_head,
        head_dim,
        scale: 1.0 / (head_dim as f32).sqrt(),
        window,
        softcap,
        values,
    }
}

/// Expert scratch of `rows` rows, `k` slots, width `d` and expert width `ff`.
fn expert_bufs<B: Backend>(
    b: &B,
    rows: usize,
    k: usize,
    d: usize,
    ff: usize,
) -> crate::Result<ExpertBufs<B::Buf>> {
    Ok(ExpertBufs {
        x: b.alloc(rows * d)?,
        gate: b.alloc(rows * ff)?,
        up: b.alloc(rows * ff)?,
        y: b.alloc(rows * d)?,
        slots: b.alloc(rows * k * d)?,
    })
}

/// A routing of `rows` tokens over `n_expert` experts, `k` each, by random router logits.
fn random_routing(rng: &mut Rng, n_expert: usize, k: usize, rows: usize) -> Routing {
    let mut r = Routing::new(n_expert, k, rows);
    r.begin(rows, k);
    for t in 0..rows {
        let logits = rng.values(n_expert, 2.0);
        r.route(t, &logits, &crate::RouteRule::softmax(true), None);
    }
    r.group();
    r
}
