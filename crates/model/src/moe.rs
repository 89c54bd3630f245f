//! Mixture-of-experts FFN (mixtral, qwen3moe): expert weights stacked in one tensor per
//! projection (a layout latent attention's per-head matrices share), and the layer's
//! sequence of contract ops (router product, routing, expert
//! products). It never computes a value itself.
//!
//! Routing is `ferrite_backend::Routing`'s rule (softmax, top k, ties to the lower id,
//! optional renormalisation). Tokens are then grouped by expert: each expert that at least one token of the chunk
//! selected runs one matmul over exactly those tokens' rows, so a decode step reads only the
//! `k` selected experts' weights and prefill reads each needed expert once. Each token's
//! output is the weighted sum of its experts' outputs in selection order, so the result does
//! not depend on how tokens are grouped into chunks beyond the kernels' own rounding.

use std::sync::OnceLock;

use ferrite_backend::{Act, ExpertBufs, ExpertFfn, HostMatrix, Routing};
use ferrite_cpu::{Matrix, PackedRows};
use ferrite_gguf::{GgmlType, Gguf};

use crate::ModelError;
use crate::features::MoeConfig;
use crate::model::{DenseFfn, Model, Weight};
use crate::session::{Faults, Weights};

/// One projection of every expert, stacked: GGUF dims `[cols, rows, n_expert]`, expert `e`
/// being the `e`-th contiguous `rows × cols` matrix.
#[derive(Debug)]
pub struct Experts {
    tensor: usize,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    n_expert: usize,
    /// Dequantized copy under [`crate::Precision::F32`].
    f32_copy: Option<Vec<f32>>,
    /// Each expert's rows packed for the CPU's 16-bit products, on its first CPU product
    /// (as [`crate::model`] packs a dense matrix).
    packed: Vec<OnceLock<Option<PackedRows>>>,
}

/// The weights of one expert FFN layer.
#[derive(Debug)]
pub(crate) struct MoeWeights {
    /// Router `n_expert × d_model` (`ffn_gate_inp`).
    pub(crate) router: Weight,
    /// The router's bias of its logits (gpt-oss).
    pub(crate) router_bias: Option<Vec<f32>>,
    /// Every expert's gate, up and down biases, expert after expert (gpt-oss).
    pub(crate) bias: Option<[Vec<f32>; 3]>,
    pub(crate) gate: Experts,
    pub(crate) up: Experts,
    pub(crate) down: Experts,
    /// The shared expert every token runs beside its routed ones (`ffn_*_shexp`; boxed,
    /// so that an expert layer stays the size of a dense one).
    pub(crate) shared: Option<Box<DenseFfn>>,
    /// The router's per-expert selection bias (`exp_probs_b.bias`).
    pub(crate) selection_bias: Option<Vec<f32>>,
    /// The shared expert's sigmoid gate, `1 × d_model` (`ffn_gate_inp_shexp`; Qwen3-Next;
    /// boxed like the shared expert).
    pub(crate) shared_gate: Option<Box<Weight>>,
}

impl Experts {
    /// Loads stacked tensor `name`, checking its dims against `rows × cols × n_expert`.
    pub(crate) fn load(
        g: &Gguf,
        name: &str,
        rows: usize,
        cols: usize,
        n_expert: usize,
        f32_copy: bool,
    ) -> Result<Experts, ModelError> {
        let want = [cols as u64, rows as u64, n_expert as u64];
        let tensor = crate::model::find_tensor(g, name, &want)?;
        let t = &g.tensors()[tensor];
        Ok(Experts {
            tensor,
            ty: t.ty,
            rows,
            cols,
            n_expert,
            f32_copy: if f32_copy {
                Some(crate::model::dequantize_tensor(g, name)?)
            } else {
                None
            },
            packed: (0..n_expert).map(|_| OnceLock::new()).collect(),
        })
    }

    /// Number of experts.
    pub(crate) fn n_expert(&self) -> usize {
        self.n_expert
    }

    /// Rows of each expert's matrix.
    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    /// Values per row.
    pub(crate) fn cols(&self) -> usize {
        self.cols
    }

    /// The stored type (`F32` under [`crate::Precision::F32`]).
    pub(crate) fn ty(&self) -> GgmlType {
        if self.f32_copy.is_some() {
            GgmlType::F32
        } else {
            self.ty
        }
    }

    /// The matrix of expert `e` (`e < n_expert`), with its packed rows (packed on the first
    /// call where the products take them; the packed spans' mapped pages are dropped).
    pub(crate) fn matrix<'a>(&'a self, g: &'a Gguf, e: usize) -> Matrix<'a> {
        crate::model::with_packed(g, &self.packed[e], self.raw_matrix(g, e))
    }

    /// Expert `e` as its file stores it (or as its f32 copy), for a backend to upload.
    pub fn host_matrix<'a>(&'a self, g: &'a Gguf, e: usize) -> HostMatrix<'a> {
        crate::model::host(self.raw_matrix(g, e))
    }

    /// Expert `e` as stored (or as its f32 copy), without packed rows.
    fn raw_matrix<'a>(&'a self, g: &'a Gguf, e: usize) -> Matrix<'a> {
        match &self.f32_copy {
            Some(v) => {
                let n = self.rows * self.cols;
                Matrix {
                    ty: GgmlType::F32,
                    rows: self.rows,
                    cols: self.cols,
                    data: bytemuck::cast_slice(&v[e * n..(e + 1) * n]),
                    packed: None,
                }
            }
            None => {
                let data = g.tensor_data(&g.tensors()[self.tensor]);
                // Every row is a whole number of blocks (checked by the dims at load and by
                // the kernels), so the experts split the bytes evenly.
                let per = data.len() / self.n_expert;
                Matrix {
                    ty: self.ty,
                    rows: self.rows,
                    cols: self.cols,
                    data: &data[e * per..(e + 1) * per],
                    packed: None,
                }
            }
        }
    }
}

/// Scratch of [`ffn`] for chunks of up to a session's chunk of tokens, allocated once per
/// session.
#[derive(Debug)]
pub(crate) struct MoeScratch<Buf> {
    /// The shared expert's output rows (`rows × d_model`; empty without one).
    pub(crate) shared_out: Buf,
    /// Router logits (`rows × n_expert`).
    pub(crate) router: Buf,
    pub(crate) routing: Routing,
    pub(crate) bufs: ExpertBufs<Buf>,
    /// Expert FFNs run and rows they processed, since the session started (path marker).
    pub(crate) experts_run: usize,
    pub(crate) expert_rows: usize,
}

/// The expert FFN of `n` normalised rows `xn` (`n × d_model`), written to `out`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn ffn<B: Weights>(
    b: &B,
    model: &Model,
    w: &MoeWeights,
    (cfg, faults): (&MoeConfig, Faults),
    act: Act,
    xn: &B::Buf,
    n: usize,
    out: &mut B::Buf,
    s: &mut MoeScratch<B::Buf>,
) -> Result<(), ModelError> {
    b.matmul(b.matrix(model, &w.router), xn, n, &mut s.router)?;
    if let Some(rb) = w.router_bias.as_ref().filter(|_| !faults.drop_expert_bias) {
        b.add_bias(&mut s.router, n * cfg.n_expert, b.param(rb)?, cfg.n_expert)?;
    }
    if !s.routing.begin(n, cfg.n_expert_used) {
        return Err(ModelError::InvalidArgument(format!(
            "{n} rows choosing {} experts do not fit the routing scratch",
            cfg.n_expert_used
        )));
    }
    b.moe_route(
        &s.router,
        &mut s.routing,
        &cfg.rule,
        w.selection_bias.as_deref(),
    )?;
    // Each expert's bias handles, made once per pass (the closure cannot fail).
    let bias = match w.bias.as_ref().filter(|_| !faults.drop_expert_bias) {
        None => None,
        Some([bg, bu, bd]) => {
            let (ff, d) = (w.gate.rows(), w.down.rows());
            let mut each = Vec::with_capacity(cfg.n_expert);
            for e in 0..cfg.n_expert {
                let (f, dd) = (e * ff..(e + 1) * ff, e * d..(e + 1) * d);
                each.push([
                    b.param(&bg[f.clone()])?,
                    b.param(&bu[f])?,
                    b.param(&bd[dd])?,
                ]);
            }
            Some(each)
        }
    };
    let experts = |e: usize| ExpertFfn {
        mats: [
            b.expert(model, &w.gate, e),
            b.expert(model, &w.up, e),
            b.expert(model, &w.down, e),
        ],
        bias: bias.as_ref().map(|v| v[e]),
    };
    b.moe_experts(xn, &s.routing, &experts, act, &mut s.bufs, out)?;
    let (runs, rows) = s.routing.runs();
    s.experts_run += runs;
    s.expert_rows += rows;
    Ok(())
}
