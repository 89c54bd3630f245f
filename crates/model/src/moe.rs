//! Mixture-of-experts FFN on the CPU (mixtral, qwen3moe): routing, expert weights stacked
//! in one tensor per projection, and the grouped execution.
//!
//! Routing follows llama.cpp and Hugging Face: softmax over all experts' router logits, the
//! `k` largest probabilities (ties to the lower expert id), optionally renormalised to sum 1.
//! Tokens are then grouped by expert: each expert that at least one token of the chunk
//! selected runs one matmul over exactly those tokens' rows, so a decode step reads only the
//! `k` selected experts' weights and prefill reads each needed expert once. Each token's
//! output is the weighted sum of its experts' outputs in selection order, so the result does
//! not depend on how tokens are grouped into chunks beyond the kernels' own rounding.

use std::sync::OnceLock;

use ferrite_cpu::{Matrix, PackedRows, ThreadPool, matmul, matmul_shared};
use ferrite_gguf::{GgmlType, Gguf};

use crate::ModelError;
use crate::config::Activation;
use crate::features::MoeConfig;
use crate::model::{Model, Weight};
use crate::ops::{gelu_tanh, silu};

/// One projection of every expert, stacked: GGUF dims `[cols, rows, n_expert]`, expert `e`
/// being the `e`-th contiguous `rows × cols` matrix.
#[derive(Debug)]
pub(crate) struct Experts {
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
    pub(crate) gate: Experts,
    pub(crate) up: Experts,
    pub(crate) down: Experts,
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

    /// The matrix of expert `e` (`e < n_expert`), with its packed rows (packed on the first
    /// call where the products take them; the packed spans' mapped pages are dropped).
    pub(crate) fn matrix<'a>(&'a self, g: &'a Gguf, e: usize) -> Matrix<'a> {
        crate::model::with_packed(g, &self.packed[e], self.raw_matrix(g, e))
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

/// Scratch of [`ffn`] for chunks of up to `chunk` tokens, allocated once per session.
#[derive(Debug)]
pub(crate) struct MoeScratch {
    router: Vec<f32>,
    /// Selected expert of each (token, slot).
    selected: Vec<usize>,
    /// Routing weight of each (token, slot).
    weight: Vec<f32>,
    /// (token, slot) pairs ordered by expert.
    order: Vec<usize>,
    /// Start of each expert's run in `order` (`n_expert + 1` entries).
    start: Vec<usize>,
    /// Next free place of each expert's run while filling `order`.
    fill: Vec<usize>,
    xg: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    y: Vec<f32>,
    /// Output of each (token, slot), `d_model` values.
    slot_out: Vec<f32>,
    probs: Vec<f64>,
    /// Expert FFNs run and rows they processed, since the session started (path marker).
    pub(crate) experts_run: usize,
    pub(crate) expert_rows: usize,
}

impl MoeScratch {
    /// Scratch for `cfg` with chunks of `chunk` rows, `d_model` wide, expert width `d_ff`
    /// (sized like the session's other per-chunk buffers).
    pub(crate) fn new(cfg: &MoeConfig, chunk: usize, d_model: usize, d_ff: usize) -> MoeScratch {
        let slots = chunk * cfg.n_expert_used;
        MoeScratch {
            router: vec![0.0; chunk * cfg.n_expert],
            selected: vec![0; slots],
            weight: vec![0.0; slots],
            order: vec![0; slots],
            start: vec![0; cfg.n_expert + 1],
            fill: vec![0; cfg.n_expert + 1],
            xg: vec![0.0; chunk * d_model],
            gate: vec![0.0; chunk * d_ff],
            up: vec![0.0; chunk * d_ff],
            y: vec![0.0; chunk * d_model],
            slot_out: vec![0.0; slots * d_model],
            probs: vec![0.0; cfg.n_expert],
            experts_run: 0,
            expert_rows: 0,
        }
    }
}

/// Picks the top `k` experts of one token's router logits: writes their ids (descending
/// probability, ties to the lower id) and routing weights.
pub(crate) fn route(
    logits: &[f32],
    k: usize,
    norm_topk: bool,
    probs: &mut [f64],
    selected: &mut [usize],
    weight: &mut [f32],
) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f64;
    for (p, &l) in probs.iter_mut().zip(logits) {
        *p = f64::from(l - max).exp();
        sum += *p;
    }
    for p in probs.iter_mut() {
        *p /= sum;
    }
    let mut picked_sum = 0.0f64;
    for slot in 0..k {
        let mut best = usize::MAX;
        for (e, &p) in probs.iter().enumerate() {
            if selected[..slot].contains(&e) {
                continue;
            }
            if best == usize::MAX || p > probs[best] {
                best = e;
            }
        }
        selected[slot] = best;
        picked_sum += probs[best];
    }
    let scale = if norm_topk { 1.0 / picked_sum } else { 1.0 };
    for slot in 0..k {
        weight[slot] = (probs[selected[slot]] * scale) as f32;
    }
}

/// The expert FFN of `n` normalised rows `xn` (`n × d_model`), written to `out`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn ffn(
    pool: &ThreadPool,
    model: &Model,
    w: &MoeWeights,
    cfg: &MoeConfig,
    act: Activation,
    xn: &[f32],
    n: usize,
    out: &mut [f32],
    s: &mut MoeScratch,
) -> Result<(), ModelError> {
    let d = w.down.rows;
    let ff = w.gate.rows;
    let (ne, k) = (cfg.n_expert, cfg.n_expert_used);
    let g = model.gguf();
    let router = &mut s.router[..n * ne];
    matmul(pool, model.matrix(&w.router), xn, n, router)?;
    for t in 0..n {
        route(
            &router[t * ne..(t + 1) * ne],
            k,
            cfg.norm_topk,
            &mut s.probs,
            &mut s.selected[t * k..(t + 1) * k],
            &mut s.weight[t * k..(t + 1) * k],
        );
    }
    // Counting sort of the (token, slot) pairs by expert.
    s.start.fill(0);
    for &e in &s.selected[..n * k] {
        s.start[e + 1] += 1;
    }
    for e in 0..ne {
        s.start[e + 1] += s.start[e];
    }
    s.fill.copy_from_slice(&s.start);
    for (i, &e) in s.selected[..n * k].iter().enumerate() {
        s.order[s.fill[e]] = i;
        s.fill[e] += 1;
    }
    let f: fn(f32) -> f32 = match act {
        Activation::Silu => silu,
        Activation::GeluTanh => gelu_tanh,
    };
    for e in 0..ne {
        let pairs = &s.order[s.start[e]..s.start[e + 1]];
        let m = pairs.len();
        if m == 0 {
            continue;
        }
        for (r, &i) in pairs.iter().enumerate() {
            let t = i / k;
            s.xg[r * d..(r + 1) * d].copy_from_slice(&xn[t * d..(t + 1) * d]);
        }
        let (xg, gate, up, y) = (
            &s.xg[..m * d],
            &mut s.gate[..m * ff],
            &mut s.up[..m * ff],
            &mut s.y[..m * d],
        );
        let gate_up = [w.gate.matrix(g, e), w.up.matrix(g, e)];
        matmul_shared(pool, &gate_up, xg, m, &mut [&mut *gate, &mut *up])?;
        for (a, &u) in gate.iter_mut().zip(up.iter()) {
            *a = f(*a) * u;
        }
        matmul(pool, w.down.matrix(g, e), gate, m, y)?;
        for (r, &i) in pairs.iter().enumerate() {
            s.slot_out[i * d..(i + 1) * d].copy_from_slice(&y[r * d..(r + 1) * d]);
        }
        s.experts_run += 1;
        s.expert_rows += m;
    }
    for t in 0..n {
        let o = &mut out[t * d..(t + 1) * d];
        o.fill(0.0);
        for slot in 0..k {
            let i = t * k + slot;
            let wt = s.weight[i];
            for (a, &b) in o.iter_mut().zip(&s.slot_out[i * d..(i + 1) * d]) {
                *a += wt * b;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_picks_top_k_by_probability_and_renormalises() {
        let logits = [0.1f32, 2.0, -1.0, 1.5, 2.0];
        let mut probs = vec![0.0; 5];
        let (mut sel, mut w) = ([0usize; 2], [0.0f32; 2]);
        route(&logits, 2, true, &mut probs, &mut sel, &mut w);
        // Experts 1 and 4 tie at the top: lower id first.
        assert_eq!(sel, [1, 4]);
        assert!((w[0] - 0.5).abs() < 1e-7 && (w[1] - 0.5).abs() < 1e-7);
        route(&logits, 2, false, &mut probs, &mut sel, &mut w);
        let z: f64 = logits.iter().map(|&l| f64::from(l).exp()).sum();
        let p1 = (2.0f64.exp() / z) as f32;
        assert!((w[0] - p1).abs() < 1e-6, "{} vs {p1}", w[0]);
        let mut sel3 = [0usize; 3];
        route(&logits, 3, true, &mut probs, &mut sel3, &mut [0.0; 3]);
        assert_eq!(sel3, [1, 4, 3]);
    }
}
