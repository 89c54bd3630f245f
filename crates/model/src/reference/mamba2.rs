//! The naive Mamba-2 mixer of the reference pass: the input projection split into the gate
//! `z`, the convolved `xBC` and the time steps, the causal convolution with its bias over
//! the whole sequence from zero inputs, the selective scan step by step in f64 over
//! explicit per-head matrices, the gated grouped RMS norm and the output projection,
//! written from the transformers layer (`NemotronHMamba2Mixer.torch_forward` and
//! `MambaRMSNormGated`), sharing no code with `ferrite_cpu`.

use ferrite_arch::Mamba2Shape;
use ferrite_gguf::Gguf;

use super::delta_net::sigmoid;
use super::{linear, load};
use crate::ModelError;

fn silu(x: f64) -> f64 {
    x * sigmoid(x)
}

/// Layer `l`'s Mamba-2 mixer over the normalised rows `h` (`n × d`), projected back to
/// `n × d`.
pub(super) fn layer(
    g: &Gguf,
    s: &Mamba2Shape,
    l: usize,
    (h, d): (&[f64], usize),
    eps: f64,
) -> Result<Vec<f64>, ModelError> {
    let get = |name: &str| load(g, &format!("blk.{l}.{name}"));
    let (nh, hd, ds, ng, k) = (s.n_heads, s.head_dim, s.d_state, s.n_groups, s.conv_kernel);
    let inner = nh * hd;
    let c = inner + 2 * ng * ds;
    let rows = inner + c + nh;
    let n = h.len() / d;
    let proj = linear(&get("ssm_in.weight")?, h, rows, d);
    let taps = get("ssm_conv1d.weight")?;
    let bias = get("ssm_conv1d.bias")?;
    let (a, skip, dt_bias) = (get("ssm_a")?, get("ssm_d")?, get("ssm_dt.bias")?);
    let norm_w = get("ssm_norm.weight")?;
    let dt_min = f64::from(crate::mamba2::dt_min(g)?);
    // Row t of the projection: z (inner), xBC (c), dt (nh).
    let z = |t: usize| &proj[t * rows..t * rows + inner];
    let xbc = |t: usize, ch: usize| proj[t * rows + inner + ch];
    let dt = |t: usize, hh: usize| proj[t * rows + inner + c + hh];
    // The convolution: tap j of row t reads row t - (k - 1) + j, zero before the start.
    let mut conv = vec![0.0; n * c];
    for t in 0..n {
        for ch in 0..c {
            let acc: f64 = (0..k)
                .filter_map(|j| (t + j).checked_sub(k - 1).map(|r| (j, r)))
                .map(|(j, r)| taps[ch * k + j] * xbc(r, ch))
                .sum();
            conv[t * c + ch] = silu(acc + bias[ch]);
        }
    }
    let mut state = vec![vec![0.0f64; hd * ds]; nh];
    let mut y = vec![0.0; n * inner];
    for t in 0..n {
        let row = &conv[t * c..(t + 1) * c];
        for (hh, m) in state.iter_mut().enumerate() {
            let grp = hh / (nh / ng);
            let bg = &row[inner + grp * ds..inner + (grp + 1) * ds];
            let cg = &row[inner + ng * ds + grp * ds..inner + ng * ds + (grp + 1) * ds];
            let raw = dt(t, hh) + dt_bias[hh];
            let delta = if raw > 20.0 { raw } else { raw.exp().ln_1p() };
            // transformers' torch path: `torch.clamp(dt, time_step_min)`.
            let delta = if delta < dt_min { dt_min } else { delta };
            let decay = (delta * a[hh]).exp();
            for p in 0..hd {
                let xp = row[hh * hd + p];
                let sp = &mut m[p * ds..(p + 1) * ds];
                for (sn, &bn) in sp.iter_mut().zip(bg) {
                    *sn = *sn * decay + delta * xp * bn;
                }
                let out: f64 = sp.iter().zip(cg).map(|(a, b)| a * b).sum();
                y[t * inner + hh * hd + p] = out + skip[hh] * xp;
            }
        }
    }
    // The gated norm: y · silu(z), then an RMS norm over each group of inner / n_groups
    // values, times the weight.
    let group = inner / ng;
    for t in 0..n {
        let yr = &mut y[t * inner..(t + 1) * inner];
        for (v, &zv) in yr.iter_mut().zip(z(t)) {
            *v *= silu(zv);
        }
        for (part, wg) in yr.chunks_mut(group).zip(norm_w.chunks(group)) {
            let ms = part.iter().map(|v| v * v).sum::<f64>() / group as f64;
            let inv = 1.0 / (ms + eps).sqrt();
            part.iter_mut().zip(wg).for_each(|(v, &w)| *v *= inv * w);
        }
    }
    Ok(linear(&get("ssm_out.weight")?, &y, d, inner))
}
