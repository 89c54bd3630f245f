//! The recurrent ops' cases of [`super::run`] and their naive references: the gated
//! DeltaNet's convolution and delta rule in f64 over whole sequences, fed to the backend in
//! two calls over two sessions at once (so the state a call leaves is the state the next
//! one reads), and the gated norm and row gate. It never calls a backend op to compute an
//! expected value.

use ferrite_arch::DeltaNetShape;

use super::reference::Rng;
use super::{ELEMENT_TOL, Out, buf, host, segments};
use crate::{Backend, KvType, Values};

/// The shape of the cases: two key heads serving two value heads each, odd sizes.
const SHAPE: DeltaNetShape = DeltaNetShape {
    conv_kernel: 4,
    k_heads: 2,
    v_heads: 4,
    k_dim: 6,
    v_dim: 5,
    interval: 1,
};

/// Allowed error of the recurrences, relative to the largest output magnitude (the sums
/// run over a whole sequence of f32 steps).
pub(super) const RECURRENT_TOL: f64 = 1e-5;

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

pub(super) fn silu(x: f64) -> f64 {
    x * sigmoid(x)
}

/// The convolution and SiLU of one whole sequence (`rows × channels`) from zero state, over
/// `c` channels of `k` taps, with a bias per channel or none.
pub(super) fn conv_f64(
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    (c, k): (usize, usize),
) -> Vec<f64> {
    let rows = x.len() / c;
    let mut out = vec![0.0; x.len()];
    for t in 0..rows {
        for ch in 0..c {
            let mut acc = bias.map_or(0.0, |b| f64::from(b[ch]));
            for j in 0..k {
                // Tap j reads row t - (k - 1) + j; rows before 0 are zero.
                if let Some(r) = (t + j).checked_sub(k - 1) {
                    acc += f64::from(w[ch * k + j]) * f64::from(x[r * c + ch]);
                }
            }
            out[t * c + ch] = silu(acc);
        }
    }
    out
}

/// The gated delta rule over one whole sequence from zero state, as the contract states it.
fn delta_f64(qkv: &[f32], beta: &[f32], alpha: &[f32], a: &[f32], dt: &[f32]) -> Vec<f64> {
    let s = SHAPE;
    let (dk, dv, nv, c) = (s.k_dim, s.v_dim, s.v_heads, s.conv_channels());
    let rows = qkv.len() / c;
    let mut m = vec![vec![0.0f64; dk * dv]; nv];
    let mut out = vec![0.0; rows * nv * dv];
    let norm = |v: &[f32], scale: f64| -> Vec<f64> {
        let ss: f64 = v.iter().map(|&x| f64::from(x) * f64::from(x)).sum();
        v.iter()
            .map(|&x| f64::from(x) / (ss + 1e-6).sqrt() * scale)
            .collect()
    };
    for t in 0..rows {
        let row = &qkv[t * c..(t + 1) * c];
        for (h, m) in m.iter_mut().enumerate() {
            let kh = h / (nv / s.k_heads);
            let q = norm(&row[kh * dk..(kh + 1) * dk], 1.0 / (dk as f64).sqrt());
            let k = norm(&row[(s.k_heads + kh) * dk..(s.k_heads + kh + 1) * dk], 1.0);
            let v = &row[2 * s.k_heads * dk + h * dv..2 * s.k_heads * dk + (h + 1) * dv];
            let x = f64::from(alpha[t * nv + h]) + f64::from(dt[h]);
            let g = (f64::from(a[h]) * x.exp().ln_1p()).exp();
            let b = sigmoid(f64::from(beta[t * nv + h]));
            m.iter_mut().for_each(|x| *x *= g);
            for j in 0..dv {
                let mem: f64 = (0..dk).map(|i| m[i * dv + j] * k[i]).sum();
                let delta = (f64::from(v[j]) - mem) * b;
                for i in 0..dk {
                    m[i * dv + j] += k[i] * delta;
                }
            }
            for j in 0..dv {
                out[(t * nv + h) * dv + j] = (0..dk).map(|i| m[i * dv + j] * q[i]).sum();
            }
        }
    }
    out
}

/// Per session, the convolution's and the delta rule's outputs of both calls.
type PerSession = (Vec<Vec<f32>>, Vec<Vec<f32>>);

/// The convolution then the delta rule of two sessions, each fed in two calls (both
/// sessions in one call, as a batch does); `delta` checks the delta rule's output, else the
/// convolution's.
pub(super) fn delta_net<B: Backend>(b: &B, rng: &mut Rng, delta: bool, out: &mut Out<'_>) {
    let s = SHAPE;
    let (c, nv, inner) = (s.conv_channels(), s.v_heads, s.inner());
    // A prefill of 7 then a step of 1; a decode of 1 then a chunk past the kernel.
    let plans: [(usize, usize); 2] = [(8, 7), (6, 1)];
    let w = rng.values(c * s.conv_kernel, 0.5);
    let (a, dt) = (rng.values(nv, 1.0), rng.values(nv, 1.0));
    let a: Vec<f32> = a.iter().map(|x| -x.abs() - 0.1).collect();
    let inputs: Vec<_> = plans
        .iter()
        .map(|&(n, _)| {
            (
                rng.values(n * c, 2.0),
                rng.values(n * nv, 3.0),
                rng.values(n * nv, 3.0),
            )
        })
        .collect();
    let mut conv_want = Vec::new();
    let mut delta_want = Vec::new();
    for (x, beta, alpha) in &inputs {
        let conv = conv_f64(x, &w, None, (c, s.conv_kernel));
        let conv32: Vec<f32> = conv.iter().map(|&v| v as f32).collect();
        delta_want.push(delta_f64(&conv32, beta, alpha, &a, &dt));
        conv_want.push(conv);
    }
    let got = (|| -> crate::Result<PerSession> {
        let mut stores = Vec::new();
        for &(n, _) in &plans {
            let mut kv = b.kv(KvType::F32, 1, n, (1, 32), Values::Own)?;
            b.kv_state(&mut kv, 2, s.state_len())?;
            stores.push(kv);
        }
        let (wv, av, dv) = (b.vector(&w)?, b.vector(&a)?, b.vector(&dt)?);
        let mut conv_got = vec![Vec::new(); plans.len()];
        let mut delta_got = vec![Vec::new(); plans.len()];
        for call in 0..2 {
            let spans: Vec<(usize, usize)> = plans
                .iter()
                .map(|&(n, cut)| if call == 0 { (0, cut) } else { (cut, n - cut) })
                .collect();
            let (mut xs, mut bs, mut als) = (Vec::new(), Vec::new(), Vec::new());
            for ((x, beta, alpha), &(p, n)) in inputs.iter().zip(&spans) {
                xs.extend_from_slice(&x[p * c..(p + n) * c]);
                bs.extend_from_slice(&beta[p * nv..(p + n) * nv]);
                als.extend_from_slice(&alpha[p * nv..(p + n) * nv]);
            }
            let rows: usize = spans.iter().map(|s| s.1).sum();
            let (xb, bb, ab) = (buf(b, &xs)?, buf(b, &bs)?, buf(b, &als)?);
            let mut conv = b.alloc(rows * c)?;
            let mut delta = b.alloc(rows * inner)?;
            // Slot 1: a slot other than the first must be the one read and written.
            let mut segs = segments(&mut stores, &spans);
            b.conv1d(s.conv(), 1, &xb, wv, None, &mut segs, &mut conv)?;
            b.delta_rule(&s, 1, &conv, (&bb, &ab), (av, dv), &mut segs, &mut delta)?;
            let (conv, delta) = (host(b, &conv, rows * c)?, host(b, &delta, rows * inner)?);
            let (mut at_c, mut at_d) = (0, 0);
            for (i, &(_, n)) in spans.iter().enumerate() {
                conv_got[i].extend_from_slice(&conv[at_c..at_c + n * c]);
                delta_got[i].extend_from_slice(&delta[at_d..at_d + n * inner]);
                at_c += n * c;
                at_d += n * inner;
            }
        }
        Ok((conv_got, delta_got))
    })();
    let flat = |v: &[Vec<f64>]| v.concat();
    let bound = |w: &[f64]| {
        let top = w.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        vec![RECURRENT_TOL * top + 1e-30; w.len()]
    };
    let want = flat(if delta { &delta_want } else { &conv_want });
    let got = got.map(|(conv, d)| if delta { d.concat() } else { conv.concat() });
    let shape = "2 sessions of 8 and 6 rows in two calls (7+1, 1+5)";
    out.compare(shape, got, &want, &bound(&want), "1e-5 of the largest");
}

/// `rms_norm(x) · w · silu(z)` and `x · sigmoid(g)` per row.
pub(super) fn gates<B: Backend>(b: &B, rng: &mut Rng, norm: bool, out: &mut Out<'_>) {
    for (n, width) in [(1, 5), (3, 64)] {
        let len = n * width;
        let (x, z, w) = (
            rng.values(len, 3.0),
            rng.values(len, 4.0),
            rng.values(width, 2.0),
        );
        let g = rng.values(n, 4.0);
        let want: Vec<f64> = if norm {
            x.chunks(width)
                .zip(z.chunks(width))
                .flat_map(|(r, zr)| {
                    let ms = r.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / width as f64;
                    let inv = 1.0 / (ms + 1e-6).sqrt();
                    r.iter()
                        .zip(&w)
                        .zip(zr)
                        .map(move |((&v, &wv), &zv)| {
                            f64::from(v) * inv * f64::from(wv) * silu(f64::from(zv))
                        })
                        .collect::<Vec<_>>()
                })
                .collect()
        } else {
            x.iter()
                .enumerate()
                .map(|(i, &v)| f64::from(v) * sigmoid(f64::from(g[i / width])))
                .collect()
        };
        let bound: Vec<f64> = want
            .iter()
            .map(|v| 8.0 * ELEMENT_TOL * v.abs() + 1e-30)
            .collect();
        let got = (|| {
            let mut xb = buf(b, &x)?;
            if norm {
                b.gated_norm(&mut xb, &buf(b, &z)?, len, b.vector(&w)?, width, 1e-6)?;
            } else {
                b.row_gate(&mut xb, &buf(b, &g)?, n, width)?;
            }
            host(b, &xb, len)
        })();
        out.compare(
            format!("{n} rows of {width}"),
            got,
            &want,
            &bound,
            "1.6e-5 relative",
        );
    }
}
