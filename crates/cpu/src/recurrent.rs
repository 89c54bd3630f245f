//! Recurrent layers on the CPU: the causal convolution at the head of a gated DeltaNet or
//! a Mamba-2 mixer, the gated delta rule and the Mamba-2 selective scan, each over one
//! session's rows and its state slot, and the small element-wise ops beside them (the gated
//! norm, the grouped norm, the squared ReLU, the row gate, the sigmoid).
//!
//! One function serves prefill and decode alike (the delta rule and the scan in their step
//! form, row after row), so a chunk of prompt and the same tokens decoded one by one leave
//! the same state bit for bit. Each loop runs in one fixed order, never split over threads,
//! so the bits do not depend on the thread count. This module never allocates per row and
//! never reads past the slices it is handed.

use ferrite_arch::{DeltaNetShape, Mamba2Shape};
use ferrite_backend::SsmParams;

use crate::ops::{sigmoid, silu};

/// The widest key head the delta rule takes (its scratch lives on the stack).
pub const MAX_K_DIM: usize = 256;

/// `ln(1 + e^x)`, `x` itself past 20 (where the two agree in f32), as torch computes it.
fn softplus(x: f32) -> f32 {
    if x > 20.0 { x } else { x.exp().ln_1p() }
}

/// The convolution of one segment over `channels` channels (`w`: `channels × kernel`
/// taps, `bias`: `channels` values or none): `x` and `out` hold its `rows × channels`
/// values, `state` the previous `kernel - 1` inputs (oldest first), updated to the last
/// ones. Without a bias the sum alone goes into the SiLU (no `+ 0`, which would turn a
/// `-0` into `+0`).
pub fn conv1d(
    (c, k): (usize, usize),
    x: &[f32],
    (w, bias): (&[f32], Option<&[f32]>),
    state: &mut [f32],
    out: &mut [f32],
) {
    let rows = x.len() / c;
    let hist = k - 1;
    // The input of tap `j` for row `t`: row `t - hist + j` of [state; x].
    let input = |state: &[f32], t: usize, j: usize, ch: usize| {
        let r = t + j;
        if r < hist {
            state[r * c + ch]
        } else {
            x[(r - hist) * c + ch]
        }
    };
    for t in 0..rows {
        for ch in 0..c {
            let taps = &w[ch * k..(ch + 1) * k];
            let mut acc = 0.0f32;
            for (j, &wj) in taps.iter().enumerate() {
                acc += wj * input(state, t, j, ch);
            }
            if let Some(b) = bias {
                acc += b[ch];
            }
            out[t * c + ch] = silu(acc);
        }
    }
    // The last `hist` rows of [state; x] become the state.
    if rows < hist {
        state.copy_within(rows * c.., 0);
        state[(hist - rows) * c..].copy_from_slice(&x[..rows * c]);
    } else {
        state.copy_from_slice(&x[(rows - hist) * c..rows * c]);
    }
}

/// `v / sqrt(Σ v² + 1e-6) · scale`, in place.
fn l2_normalize(v: &mut [f32], scale: f32) {
    let ss: f32 = v.iter().map(|x| x * x).sum();
    let inv = 1.0 / (ss + 1e-6).sqrt() * scale;
    v.iter_mut().for_each(|x| *x *= inv);
}

/// The gated delta rule over one segment's rows (`Backend::delta_rule`): `qkv` holds
/// `rows × conv_channels` values, `beta` and `alpha` `rows × v_heads`, `s_all` the value
/// heads' matrices (`v_heads × k_dim × v_dim`), `out` `rows × v_heads × v_dim`. `qk`
/// is scratch of `2 × k_dim` values.
#[allow(clippy::too_many_arguments)]
pub fn delta_rule(
    s: &DeltaNetShape,
    qkv: &[f32],
    (beta, alpha): (&[f32], &[f32]),
    (a, dt_bias): (&[f32], &[f32]),
    s_all: &mut [f32],
    qk: &mut [f32],
    out: &mut [f32],
) {
    let (dk, dv, nv) = (s.k_dim, s.v_dim, s.v_heads);
    let c = s.conv_channels();
    let per_k = nv / s.k_heads;
    let keys_at = s.k_heads * dk;
    let values_at = 2 * keys_at;
    let scale = 1.0 / (dk as f32).sqrt();
    let rows = qkv.len() / c;
    let (q, k) = qk.split_at_mut(dk);
    for t in 0..rows {
        let row = &qkv[t * c..(t + 1) * c];
        for h in 0..nv {
            let kh = h / per_k;
            q.copy_from_slice(&row[kh * dk..(kh + 1) * dk]);
            k.copy_from_slice(&row[keys_at + kh * dk..keys_at + (kh + 1) * dk]);
            l2_normalize(q, scale);
            l2_normalize(k, 1.0);
            let v = &row[values_at + h * dv..values_at + (h + 1) * dv];
            let g = (a[h] * softplus(alpha[t * nv + h] + dt_bias[h])).exp();
            let b = sigmoid(beta[t * nv + h]);
            let m = &mut s_all[h * dk * dv..(h + 1) * dk * dv];
            m.iter_mut().for_each(|x| *x *= g);
            let o = &mut out[(t * nv + h) * dv..(t * nv + h + 1) * dv];
            // o first holds (Sᵀk), then the update's delta, then the output.
            o.fill(0.0);
            for (i, &ki) in k.iter().enumerate() {
                for (oj, &sij) in o.iter_mut().zip(&m[i * dv..(i + 1) * dv]) {
                    *oj += sij * ki;
                }
            }
            for (oj, &vj) in o.iter_mut().zip(v) {
                *oj = (vj - *oj) * b;
            }
            for (i, &ki) in k.iter().enumerate() {
                for (sij, &dj) in m[i * dv..(i + 1) * dv].iter_mut().zip(o.iter()) {
                    *sij += ki * dj;
                }
            }
            o.fill(0.0);
            for (i, &qi) in q.iter().enumerate() {
                for (oj, &sij) in o.iter_mut().zip(&m[i * dv..(i + 1) * dv]) {
                    *oj += sij * qi;
                }
            }
        }
    }
}

/// `x = x / sqrt(mean(x²) + eps) · w · silu(z)` in rows of `w.len()` values.
pub fn gated_norm(x: &mut [f32], z: &[f32], w: &[f32], eps: f32) {
    let dim = w.len();
    for (row, zr) in x.chunks_exact_mut(dim).zip(z.chunks_exact(dim)) {
        let ss: f32 = row.iter().map(|v| v * v).sum();
        let inv = 1.0 / (ss / dim as f32 + eps).sqrt();
        for ((v, &g), &zv) in row.iter_mut().zip(w).zip(zr) {
            *v = *v * inv * g * silu(zv);
        }
    }
}

/// The Mamba-2 selective scan over one segment's rows (`Backend::ssm_scan`): `xbc` holds
/// `rows × conv_channels` values (x, then the groups' B, then their C), `dt` `rows ×
/// n_heads` raw time steps, `s_all` the heads' matrices (`n_heads × head_dim × d_state`),
/// `out` `rows × inner`; `a`, `d` and `dt_bias` one value per head.
pub fn ssm_scan(
    s: &Mamba2Shape,
    xbc: &[f32],
    dt: &[f32],
    p: SsmParams<&[f32]>,
    s_all: &mut [f32],
    out: &mut [f32],
) {
    let SsmParams {
        a,
        d,
        dt_bias,
        dt_min,
    } = p;
    let (nh, hd, ds) = (s.n_heads, s.head_dim, s.d_state);
    let c = s.conv_channels();
    let inner = s.inner();
    let per_group = nh / s.n_groups;
    let b_at = inner;
    let c_at = inner + s.n_groups * ds;
    let rows = xbc.len() / c;
    for t in 0..rows {
        let row = &xbc[t * c..(t + 1) * c];
        for h in 0..nh {
            let g = h / per_group;
            let x = &row[h * hd..(h + 1) * hd];
            let bg = &row[b_at + g * ds..b_at + (g + 1) * ds];
            let cg = &row[c_at + g * ds..c_at + (g + 1) * ds];
            let delta = softplus(dt[t * nh + h] + dt_bias[h]);
            // Not `f32::max`, which would turn a NaN step into the floor.
            let delta = if delta < dt_min { dt_min } else { delta };
            let da = (delta * a[h]).exp();
            let m = &mut s_all[h * hd * ds..(h + 1) * hd * ds];
            let o = &mut out[t * inner + h * hd..t * inner + (h + 1) * hd];
            for ((sp, &xp), op) in m.chunks_exact_mut(ds).zip(x).zip(o.iter_mut()) {
                let dx = delta * xp;
                let mut y = 0.0f32;
                for ((sn, &bn), &cn) in sp.iter_mut().zip(bg).zip(cg) {
                    *sn = *sn * da + dx * bn;
                    y += *sn * cn;
                }
                *op = y + d[h] * xp;
            }
        }
    }
}

/// `x = x / sqrt(mean(x²) + eps) · w` in rows of `w.len()` values, each run of `group`
/// values normalised on its own.
pub fn group_norm(x: &mut [f32], w: &[f32], group: usize, eps: f32) {
    let width = w.len();
    for row in x.chunks_exact_mut(width) {
        for (part, wg) in row.chunks_exact_mut(group).zip(w.chunks_exact(group)) {
            let ss: f32 = part.iter().map(|v| v * v).sum();
            let inv = 1.0 / (ss / group as f32 + eps).sqrt();
            for (v, &g) in part.iter_mut().zip(wg) {
                *v = *v * inv * g;
            }
        }
    }
}

/// `x = max(x, 0)²`, in place (a NaN stays NaN, as in torch).
pub fn relu_sq(x: &mut [f32]) {
    for v in x {
        *v = if *v < 0.0 { 0.0 } else { *v * *v };
    }
}
