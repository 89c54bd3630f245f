//! The naive gated DeltaNet of the reference pass: the causal convolution over the whole
//! sequence from zero inputs, the delta rule step by step in f64 over explicit per-head
//! matrices, the gated norm, and the output projection, written from the transformers
//! layer (`Qwen3NextGatedDeltaNet` with `torch_recurrent_gated_delta_rule`), sharing no
//! code with `ferrite_cpu`.

use ferrite_arch::DeltaNetShape;
use ferrite_gguf::Gguf;

use super::{linear, load};
use crate::ModelError;

pub(super) fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn silu(x: f64) -> f64 {
    x * sigmoid(x)
}

/// `v / sqrt(Σ v² + 1e-6)`.
fn l2(v: &[f64]) -> Vec<f64> {
    let ss: f64 = v.iter().map(|x| x * x).sum();
    v.iter().map(|x| x / (ss + 1e-6).sqrt()).collect()
}

/// Layer `l`'s DeltaNet over the normalised rows `h` (`n × d`), projected back to `n × d`.
pub(super) fn layer(
    g: &Gguf,
    s: &DeltaNetShape,
    l: usize,
    (h, d): (&[f64], usize),
    eps: f64,
) -> Result<Vec<f64>, ModelError> {
    let w = |name: &str| load(g, &format!("blk.{l}.{name}.weight"));
    let (c, nv, nk, dk, dv) = (s.conv_channels(), s.v_heads, s.k_heads, s.k_dim, s.v_dim);
    let n = h.len() / d;
    let qkv = linear(&w("attn_qkv")?, h, c, d);
    let z = linear(&w("attn_gate")?, h, nv * dv, d);
    let beta = linear(&w("ssm_beta")?, h, nv, d);
    let alpha = linear(&w("ssm_alpha")?, h, nv, d);
    let taps = w("ssm_conv1d")?;
    let k = s.conv_kernel;
    let a = load(g, &format!("blk.{l}.ssm_a"))?;
    let dt = load(g, &format!("blk.{l}.ssm_dt.bias"))?;
    let norm_w = w("ssm_norm")?;
    // The convolution: tap j of row t reads row t - (k - 1) + j, zero before the start.
    let mut conv = vec![0.0; n * c];
    for t in 0..n {
        for ch in 0..c {
            let acc: f64 = (0..k)
                .filter_map(|j| (t + j).checked_sub(k - 1).map(|r| (j, r)))
                .map(|(j, r)| taps[ch * k + j] * qkv[r * c + ch])
                .sum();
            conv[t * c + ch] = silu(acc);
        }
    }
    let mut state = vec![vec![0.0f64; dk * dv]; nv];
    let mut out = vec![0.0; n * nv * dv];
    for t in 0..n {
        let row = &conv[t * c..(t + 1) * c];
        for (hh, m) in state.iter_mut().enumerate() {
            let kh = hh / (nv / nk);
            let q: Vec<f64> = l2(&row[kh * dk..(kh + 1) * dk])
                .iter()
                .map(|x| x / (dk as f64).sqrt())
                .collect();
            let kv = l2(&row[(nk + kh) * dk..(nk + kh + 1) * dk]);
            let v = &row[2 * nk * dk + hh * dv..2 * nk * dk + (hh + 1) * dv];
            let x = alpha[t * nv + hh] + dt[hh];
            let softplus = if x > 20.0 { x } else { x.exp().ln_1p() };
            let decay = (a[hh] * softplus).exp();
            let b = sigmoid(beta[t * nv + hh]);
            m.iter_mut().for_each(|e| *e *= decay);
            for j in 0..dv {
                let mem: f64 = (0..dk).map(|i| m[i * dv + j] * kv[i]).sum();
                let delta = (v[j] - mem) * b;
                for i in 0..dk {
                    m[i * dv + j] += kv[i] * delta;
                }
            }
            let o = &mut out[(t * nv + hh) * dv..(t * nv + hh + 1) * dv];
            for (j, oj) in o.iter_mut().enumerate() {
                *oj = (0..dk).map(|i| m[i * dv + j] * q[i]).sum();
            }
            // The gated norm of the head's output.
            let ms = o.iter().map(|v| v * v).sum::<f64>() / dv as f64;
            let inv = 1.0 / (ms + eps).sqrt();
            let zr = &z[(t * nv + hh) * dv..(t * nv + hh + 1) * dv];
            for ((oj, &wj), &zj) in o.iter_mut().zip(&norm_w).zip(zr) {
                *oj = *oj * inv * wj * silu(zj);
            }
        }
    }
    Ok(linear(&w("ssm_out")?, &out, d, nv * dv))
}
