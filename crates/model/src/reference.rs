//! The naive reference forward pass: f64 activations, plain loops, no KV cache, no chunking
//! and no `ferrite_cpu` code. It shares only the configuration and the dequantizer
//! (`ferrite_quant::dequantize`, itself checked bit-exact against gguf-py) with the optimized
//! path, so agreement between the two is evidence about the optimized kernels, ops, cache
//! and attention. Meant for short sequences in tests: every weight is dequantized anew.

use ferrite_gguf::Gguf;

use crate::ModelError;
use crate::config::{Activation, ModelConfig};
use crate::features::MoeConfig;
use crate::model::Model;
use crate::ops::RopeStyle;
use ferrite_arch::{BlockKind, MlaShape};
use ferrite_backend::{Act, Gating};

mod delta_net;
mod mamba2;

/// Output of [`forward`].
#[derive(Debug, Clone)]
pub struct RefOutput {
    /// Residual stream after each layer: `hidden[l]` is `n × d_model`.
    pub hidden: Vec<Vec<f64>>,
    /// Logits of every position: `n × n_vocab`.
    pub logits: Vec<f64>,
}

fn load(g: &Gguf, name: &str) -> Result<Vec<f64>, ModelError> {
    let t = g
        .tensor(name)
        .ok_or_else(|| ModelError::MissingTensor(name.to_owned()))?;
    let n = t.n_elements() as usize;
    let mut out = vec![0.0f32; n];
    ferrite_quant::dequantize(t.ty, g.tensor_data(t), &mut out).map_err(|source| {
        ModelError::Quant {
            name: name.to_owned(),
            source,
        }
    })?;
    Ok(out.into_iter().map(f64::from).collect())
}

/// `y[t][r] = Σ_c w[r][c] · x[t][c]` for a `rows × cols` matrix.
fn linear(w: &[f64], x: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    let n = x.len() / cols;
    let mut y = vec![0.0; n * rows];
    for t in 0..n {
        for r in 0..rows {
            let mut acc = 0.0;
            for c in 0..cols {
                acc += w[r * cols + c] * x[t * cols + c];
            }
            y[t * rows + r] = acc;
        }
    }
    y
}

fn norm(x: &[f64], w: &[f64], eps: f64) -> Vec<f64> {
    let d = w.len();
    let mut y = x.to_vec();
    for row in y.chunks_mut(d) {
        let ms = row.iter().map(|v| v * v).sum::<f64>() / d as f64;
        let inv = 1.0 / (ms + eps).sqrt();
        for (v, g) in row.iter_mut().zip(w) {
            *v = *v * inv * g;
        }
    }
    y
}

/// Rope of the first `rot` values of each `head_dim` head (all of them but for partial
/// rotary), at the frequencies of a `rot`-value head.
fn rotate(
    x: &mut [f64],
    (head_dim, rot): (usize, usize),
    pos: usize,
    base: f64,
    style: RopeStyle,
    factors: Option<&[f32]>,
) {
    let half = rot / 2;
    for head in x.chunks_mut(head_dim) {
        for i in 0..half {
            let divisor = factors.map_or(1.0, |f| f64::from(f[i]));
            let theta = pos as f64 / base.powf(2.0 * i as f64 / rot as f64) / divisor;
            let (a, b) = match style {
                RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                RopeStyle::HalfSplit => (i, i + half),
            };
            let (x0, x1) = (head[a], head[b]);
            head[a] = x0 * theta.cos() - x1 * theta.sin();
            head[b] = x0 * theta.sin() + x1 * theta.cos();
        }
    }
}

/// `act(gate) · up`, element by element (gpt-oss's SwiGLU clamps both first and adds 1
/// to `up`).
fn gated(gate: &[f64], up: &[f64], activation: Activation) -> Vec<f64> {
    let sigmoid = |x: f64| 1.0 / (1.0 + (-x).exp());
    gate.iter()
        .zip(up)
        .map(|(&gv, &u)| match activation {
            Activation::Silu => gv * sigmoid(gv) * u,
            Activation::GeluTanh => {
                let k0 = (2.0 / std::f64::consts::PI).sqrt();
                0.5 * gv * (1.0 + (k0 * (gv + 0.044715 * gv * gv * gv)).tanh()) * u
            }
            Activation::SwigluOai => {
                let limit = f64::from(Act::SWIGLU_OAI_LIMIT);
                let alpha = f64::from(Act::SWIGLU_OAI_ALPHA);
                let g = gv.min(limit);
                g * sigmoid(alpha * g) * (u.clamp(-limit, limit) + 1.0)
            }
        })
        .collect()
}

/// `y[t] += b` for each row of `y`.
fn add_bias(y: &mut [f64], b: &[f64]) {
    for row in y.chunks_mut(b.len()) {
        row.iter_mut().zip(b).for_each(|(y, b)| *y += b);
    }
}

/// One layer's expert weights, dequantized (stacked: expert `e` is the `e`-th matrix).
struct Experts {
    router: Vec<f64>,
    gate: Vec<f64>,
    up: Vec<f64>,
    down: Vec<f64>,
    bias: Option<Vec<f64>>,
    /// The router's bias and every expert's gate, up and down biases (gpt-oss).
    ffn_bias: Option<[Vec<f64>; 4]>,
}

/// A gated FFN of width `ff` over the rows `h`, with biases of its three products where
/// given.
fn dense(
    [wg, wu, wd]: [&[f64]; 3],
    bias: Option<[&[f64]; 3]>,
    h: &[f64],
    ff: usize,
    c: &ModelConfig,
) -> Vec<f64> {
    let d = c.d_model;
    let mut gate = linear(wg, h, ff, d);
    let mut up = linear(wu, h, ff, d);
    if let Some([bg, bu, _]) = bias {
        add_bias(&mut gate, bg);
        add_bias(&mut up, bu);
    }
    let mut y = linear(wd, &gated(&gate, &up, c.activation), d, ff);
    if let Some([_, _, bd]) = bias {
        add_bias(&mut y, bd);
    }
    y
}

/// The experts one token chooses from its scores `p` and choice values `choice`, best
/// first: sort the groups by the sum of their two best choices, keep the best groups, sort
/// their experts by choice (stable sorts: ties to the lower id), take the first `k`.
fn choose(choice: &[f64], moe: &MoeConfig) -> Vec<usize> {
    let ne = choice.len();
    let (groups, kept) = moe.rule.groups.unwrap_or((1, 1));
    let size = ne / groups;
    let mut order: Vec<usize> = (0..groups).collect();
    let score = |g: usize| {
        let mut c: Vec<f64> = choice[g * size..(g + 1) * size].to_vec();
        c.sort_by(|a, b| b.total_cmp(a));
        c.iter().take(2).sum::<f64>()
    };
    order.sort_by(|&a, &b| score(b).total_cmp(&score(a)));
    let mut ids: Vec<usize> = order[..kept]
        .iter()
        .flat_map(|&g| g * size..(g + 1) * size)
        .collect();
    ids.sort();
    ids.sort_by(|&a, &b| choice[b].total_cmp(&choice[a]));
    ids.truncate(moe.n_expert_used);
    ids
}

/// Mixture of experts, token by token: softmax or sigmoid scores of the router logits, the
/// `k` best (by score plus selection bias, within the best groups), weights their scores
/// optionally renormalised and scaled, weighted sum of their FFN outputs.
fn experts_ffn(w: &Experts, moe: &MoeConfig, c: &ModelConfig, h: &[f64]) -> Vec<f64> {
    let (d, ff, ne) = (c.d_model, c.d_ff, moe.n_expert);
    let mut out = vec![0.0; h.len()];
    for (x, o) in h.chunks(d).zip(out.chunks_mut(d)) {
        let mut logits = linear(&w.router, x, ne, d);
        if let Some([rb, ..]) = &w.ffn_bias {
            add_bias(&mut logits, rb);
        }
        let p: Vec<f64> = match moe.rule.gating {
            Gating::Softmax => {
                let mx = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = logits.iter().map(|l| (l - mx).exp()).sum();
                logits.iter().map(|l| (l - mx).exp() / z).collect()
            }
            Gating::Sigmoid => logits.iter().map(|l| 1.0 / (1.0 + (-l).exp())).collect(),
        };
        let choice: Vec<f64> = match &w.bias {
            Some(b) => p.iter().zip(b).map(|(p, b)| p + b).collect(),
            None => p.clone(),
        };
        let top = choose(&choice, moe);
        let sum: f64 = top.iter().map(|&e| p[e]).sum();
        for &e in &top {
            let norm = if moe.rule.norm_topk { sum } else { 1.0 };
            let wt = p[e] / norm * f64::from(moe.rule.scale);
            let m = ff * d;
            let span = e * m..(e + 1) * m;
            let bias = w.ffn_bias.as_ref().map(|[_, bg, bu, bd]| {
                [
                    &bg[e * ff..(e + 1) * ff],
                    &bu[e * ff..(e + 1) * ff],
                    &bd[e * d..(e + 1) * d],
                ]
            });
            let mats = [&w.gate[span.clone()], &w.up[span.clone()], &w.down[span]];
            let y = dense(mats, bias, x, ff, c);
            for (a, b) in o.iter_mut().zip(&y) {
                *a += wt * b;
            }
        }
    }
    out
}

/// Runs `tokens` from position 0 through the whole model.
pub fn forward(model: &Model, tokens: &[u32]) -> Result<RefOutput, ModelError> {
    let g = model.gguf();
    let c: &ModelConfig = model.config();
    let (n, d, hd) = (tokens.len(), c.d_model, c.head_dim);
    let eps = f64::from(c.rms_eps);
    let embd = g
        .tensor("token_embd.weight")
        .ok_or_else(|| ModelError::MissingTensor("token_embd.weight".into()))?;
    let embd_data = g.tensor_data(embd);
    let row_bytes = embd_data.len() / c.n_vocab;
    let mut x = Vec::with_capacity(n * d);
    let mut row = vec![0.0f32; d];
    for &t in tokens {
        let t = t as usize;
        if t >= c.n_vocab {
            return Err(ModelError::TokenOutOfRange {
                token: t as u32,
                n_vocab: c.n_vocab,
            });
        }
        ferrite_quant::dequantize(
            embd.ty,
            &embd_data[t * row_bytes..(t + 1) * row_bytes],
            &mut row,
        )
        .map_err(|source| ModelError::Quant {
            name: embd.name.clone(),
            source,
        })?;
        x.extend(row.iter().map(|&v| f64::from(v) * f64::from(c.embed_scale)));
    }

    let mut hidden = Vec::with_capacity(c.n_layer);
    let (qd, kd) = (c.n_head * hd, c.n_kv_head * hd);
    for l in 0..c.n_layer {
        let w = |s: &str| load(g, &format!("blk.{l}.{s}.weight"));
        let lc = c.layers[l];
        let fused = c.arch.features().fused;
        // A Nemotron-H block has one of the two halves; every other block both.
        if lc.block != Some(BlockKind::Mlp) {
            let h = norm(&x, &w("attn_norm")?, eps);
            let mamba = c.mamba.filter(|_| lc.block == Some(BlockKind::Mamba2));
            let mut o = match (c.delta_net.filter(|_| c.is_delta_net(l)), mamba) {
                (Some(s), _) => delta_net::layer(g, &s, l, (&h, d), eps)?,
                (None, Some(s)) => mamba2::layer(g, &s, l, (&h, d), eps)?,
                (None, None) => {
                    let base = f64::from(lc.rope_base);
                    // A context of exactly the prompt: LongRoPE's long set when that is past the
                    // switch point.
                    let f = match &c.rope_long {
                        Some((long, after)) if n > *after => Some(&long[..]),
                        _ => c.rope_freq_factors.as_deref(),
                    }
                    .filter(|_| lc.rope_scaled);
                    // Per head: query and key values (`khd`), value values (`vhd`); `n_kv` key/value
                    // heads of each position.
                    let (q, k, v, (khd, vhd, n_kv)) = match &c.mla {
                        Some(mla) => latent_heads(g, c, mla, l, &h, (base, f))?,
                        None => {
                            // Phi-3's fused `attn_qkv` holds the Q, K and V rows in that order.
                            let (wq, wk, wv) = if fused {
                                let qkv = w("attn_qkv")?;
                                let (q, rest) = qkv.split_at(qd * d);
                                let (k, v) = rest.split_at(kd * d);
                                (q.to_vec(), k.to_vec(), v.to_vec())
                            } else {
                                (w("attn_q")?, w("attn_k")?, w("attn_v")?)
                            };
                            let mut q = linear(&wq, &h, qd, d);
                            let mut k = linear(&wk, &h, kd, d);
                            let mut v = linear(&wv, &h, kd, d);
                            if c.qkv_bias {
                                for (y, s) in
                                    [(&mut q, "attn_q"), (&mut k, "attn_k"), (&mut v, "attn_v")]
                                {
                                    let b = load(g, &format!("blk.{l}.{s}.bias"))?;
                                    for (i, y) in y.iter_mut().enumerate() {
                                        *y += b[i % b.len()];
                                    }
                                }
                            }
                            if c.qk_norm {
                                q = norm(&q, &w("attn_q_norm")?, eps);
                                k = norm(&k, &w("attn_k_norm")?, eps);
                            }
                            for t in 0..n {
                                let dims = (hd, c.rope_dim);
                                rotate(
                                    &mut q[t * qd..(t + 1) * qd],
                                    dims,
                                    t,
                                    base,
                                    c.rope_style,
                                    f,
                                );
                                rotate(
                                    &mut k[t * kd..(t + 1) * kd],
                                    dims,
                                    t,
                                    base,
                                    c.rope_style,
                                    f,
                                );
                            }
                            (q, k, v, (hd, hd, c.n_kv_head))
                        }
                    };
                    let (qw, kw, vw) = (c.n_head * khd, n_kv * khd, n_kv * vhd);
                    let sinks = match c.arch.features().sinks {
                        true => Some(w("attn_sinks")?),
                        false => None,
                    };
                    let mut att = vec![0.0; n * c.n_head * vhd];
                    let group = c.n_head / n_kv;
                    for t in 0..n {
                        for hh in 0..c.n_head {
                            let kvh = hh / group;
                            let qv = &q[t * qw + hh * khd..t * qw + (hh + 1) * khd];
                            let visible: Vec<usize> = (0..=t)
                                .filter(|&j| lc.window.is_none_or(|win| t - j < win))
                                .collect();
                            let scores: Vec<f64> = visible
                                .iter()
                                .map(|&j| {
                                    let kv = &k[j * kw + kvh * khd..j * kw + (kvh + 1) * khd];
                                    let s = qv.iter().zip(kv).map(|(a, b)| a * b).sum::<f64>()
                                        * f64::from(c.attn_scale);
                                    soft_cap(s, c.attn_softcap)
                                })
                                .collect();
                            // A sink is one more score in the softmax, with no value.
                            let sink = sinks.as_ref().map(|s| s[hh]);
                            let mx = scores
                                .iter()
                                .chain(&sink)
                                .copied()
                                .fold(f64::NEG_INFINITY, f64::max);
                            let z: f64 = scores.iter().chain(&sink).map(|s| (s - mx).exp()).sum();
                            for (s, &j) in scores.iter().zip(&visible) {
                                let p = (s - mx).exp() / z;
                                for i in 0..vhd {
                                    att[(t * c.n_head + hh) * vhd + i] +=
                                        p * v[j * vw + kvh * vhd + i];
                                }
                            }
                        }
                    }
                    // Qwen3-Next's gated attention: each head's output times sigmoid(gate · h).
                    if c.delta_net.is_some() {
                        let gate = linear(&w("attn_gate")?, &h, c.n_head * vhd, d);
                        att.iter_mut()
                            .zip(&gate)
                            .for_each(|(a, g)| *a *= delta_net::sigmoid(*g));
                    }
                    let mut o = linear(&w("attn_output")?, &att, d, c.n_head * vhd);
                    if c.out_bias {
                        let b = load(g, &format!("blk.{l}.attn_output.bias"))?;
                        for (i, y) in o.iter_mut().enumerate() {
                            *y += b[i % d];
                        }
                    }
                    o
                }
            };
            if c.post_norms {
                o = norm(&o, &w("post_attention_norm")?, eps);
            }
            for (a, b) in x.iter_mut().zip(&o) {
                *a += b;
            }
        }
        if matches!(lc.block, None | Some(BlockKind::Mlp)) {
            let h = norm(&x, &load(g, &c.arch.features().ffn_norm.weight(l))?, eps);
            let mut o = match c.moe.as_ref().filter(|m| m.is_expert_layer(l)) {
                // Nemotron-H's MLP block: `down(relu(up · h)²)`.
                None if lc.block == Some(BlockKind::Mlp) => {
                    let mut up = linear(&w("ffn_up")?, &h, c.d_ff, d);
                    up.iter_mut().for_each(|v| *v = v.max(0.0).powi(2));
                    linear(&w("ffn_down")?, &up, d, c.d_ff)
                }
                None => {
                    let ff = c.moe.as_ref().map_or(c.d_ff, |m| m.dense_ff);
                    // Phi-3's fused `ffn_up` holds the gate rows, then the up rows.
                    let (wg, wu) = if fused {
                        let both = w("ffn_up")?;
                        let (g, u) = both.split_at(ff * d);
                        (g.to_vec(), u.to_vec())
                    } else {
                        (w("ffn_gate")?, w("ffn_up")?)
                    };
                    dense([&wg, &wu, &w("ffn_down")?], None, &h, ff, c)
                }
                Some(moe) => {
                    let t = Experts {
                        router: w("ffn_gate_inp")?,
                        gate: w("ffn_gate_exps")?,
                        up: w("ffn_up_exps")?,
                        down: w("ffn_down_exps")?,
                        bias: if moe.selection_bias {
                            Some(load(g, &format!("blk.{l}.exp_probs_b.bias"))?)
                        } else {
                            None
                        },
                        ffn_bias: if c.arch.features().expert_bias {
                            let b = |s: &str| load(g, &format!("blk.{l}.{s}.bias"));
                            Some([
                                b("ffn_gate_inp")?,
                                b("ffn_gate_exps")?,
                                b("ffn_up_exps")?,
                                b("ffn_down_exps")?,
                            ])
                        } else {
                            None
                        },
                    };
                    let mut o = experts_ffn(&t, moe, c, &h);
                    if moe.shared_ff > 0 {
                        let (wg, wu, wd) = (
                            w("ffn_gate_shexp")?,
                            w("ffn_up_shexp")?,
                            w("ffn_down_shexp")?,
                        );
                        let mut y = dense([&wg, &wu, &wd], None, &h, moe.shared_ff, c);
                        // Qwen3-Next's shared expert: its output times sigmoid(gate · h).
                        if c.delta_net.is_some() {
                            let gate = linear(&w("ffn_gate_inp_shexp")?, &h, 1, d);
                            for (row, &gt) in y.chunks_mut(d).zip(&gate) {
                                row.iter_mut().for_each(|v| *v *= delta_net::sigmoid(gt));
                            }
                        }
                        o.iter_mut().zip(&y).for_each(|(a, b)| *a += b);
                    }
                    o
                }
            };
            if c.post_norms {
                o = norm(&o, &w("post_ffw_norm")?, eps);
            }
            for (a, b) in x.iter_mut().zip(&o) {
                *a += b;
            }
        }
        hidden.push(x.clone());
    }

    let h = norm(&x, &load(g, "output_norm.weight")?, eps);
    let out_name = if g.tensor("output.weight").is_some() {
        "output.weight"
    } else {
        "token_embd.weight"
    };
    let out = g
        .tensor(out_name)
        .ok_or_else(|| ModelError::MissingTensor(out_name.into()))?;
    let data = g.tensor_data(out);
    let rb = data.len() / c.n_vocab;
    // Stream the output matrix in blocks of rows: the full f64 copy would be gigabytes.
    const BLOCK: usize = 1024;
    let mut logits = vec![0.0; n * c.n_vocab];
    let mut buf = vec![0.0f32; BLOCK * d];
    let mut r0 = 0;
    while r0 < c.n_vocab {
        let rows = BLOCK.min(c.n_vocab - r0);
        let dst = &mut buf[..rows * d];
        ferrite_quant::dequantize(out.ty, &data[r0 * rb..(r0 + rows) * rb], dst).map_err(
            |source| ModelError::Quant {
                name: out_name.into(),
                source,
            },
        )?;
        for t in 0..n {
            let hv = &h[t * d..(t + 1) * d];
            for r in 0..rows {
                let wr = &dst[r * d..(r + 1) * d];
                let logit = wr.iter().zip(hv).map(|(&a, b)| f64::from(a) * b).sum();
                logits[t * c.n_vocab + r0 + r] = soft_cap(logit, c.final_softcap);
            }
        }
        r0 += rows;
    }
    Ok(RefOutput { hidden, logits })
}

/// Latent attention's full heads, decompressed as transformers computes them (not the
/// absorbed form the forward pass runs): per head the query `[nope | rope]`, the key
/// `[K_h c | rope key]` and the value `V_h c` of each position's normed latent `c`, with
/// `K_h` and `V_h` read back from `attn_k_b` and `attn_v_b`. Returns queries, keys, values
/// and `(key head size, value head size, KV heads)`.
#[allow(clippy::type_complexity)]
fn latent_heads(
    g: &Gguf,
    c: &ModelConfig,
    mla: &MlaShape,
    l: usize,
    h: &[f64],
    (base, factors): (f64, Option<&[f32]>),
) -> Result<(Vec<f64>, Vec<f64>, Vec<f64>, (usize, usize, usize)), ModelError> {
    let w = |s: &str| load(g, &format!("blk.{l}.{s}.weight"));
    let (d, nh, eps) = (c.d_model, c.n_head, f64::from(c.rms_eps));
    let (nope, rope, rank, vd) = (mla.nope_dim, mla.rope_dim, mla.kv_lora_rank, mla.v_dim);
    let qk = nope + rope;
    let n = h.len() / d;
    let mut q = match mla.q_lora_rank {
        None => linear(&w("attn_q")?, h, nh * qk, d),
        Some(r) => {
            let a = norm(&linear(&w("attn_q_a")?, h, r, d), &w("attn_q_a_norm")?, eps);
            linear(&w("attn_q_b")?, &a, nh * qk, r)
        }
    };
    let kv_a = linear(&w("attn_kv_a_mqa")?, h, rank + rope, d);
    let (kb, vb, latent_norm) = (w("attn_k_b")?, w("attn_v_b")?, w("attn_kv_a_norm")?);
    let (mut k, mut v) = (vec![0.0; n * nh * qk], vec![0.0; n * nh * vd]);
    for t in 0..n {
        let row = &kv_a[t * (rank + rope)..(t + 1) * (rank + rope)];
        let latent = norm(&row[..rank], &latent_norm, eps);
        let mut rope_key = row[rank..].to_vec();
        rotate(&mut rope_key, (rope, rope), t, base, c.rope_style, factors);
        for hh in 0..nh {
            let qh = &mut q[(t * nh + hh) * qk..(t * nh + hh + 1) * qk];
            rotate(
                &mut qh[nope..],
                (rope, rope),
                t,
                base,
                c.rope_style,
                factors,
            );
            let kh = &mut k[(t * nh + hh) * qk..(t * nh + hh + 1) * qk];
            // attn_k_b holds K_hᵀ: `kv_lora_rank` rows of `nope` values per head.
            for j in 0..nope {
                kh[j] = (0..rank)
                    .map(|i| kb[(hh * rank + i) * nope + j] * latent[i])
                    .sum();
            }
            kh[nope..].copy_from_slice(&rope_key);
            for j in 0..vd {
                v[(t * nh + hh) * vd + j] = (0..rank)
                    .map(|i| vb[(hh * vd + j) * rank + i] * latent[i])
                    .sum();
            }
        }
    }
    Ok((q, k, v, (qk, vd, nh)))
}

/// `cap · tanh(x / cap)` (Gemma 2's soft cap), or `x` without a cap.
fn soft_cap(x: f64, cap: Option<f32>) -> f64 {
    match cap {
        Some(c) => f64::from(c) * (x / f64::from(c)).tanh(),
        None => x,
    }
}
