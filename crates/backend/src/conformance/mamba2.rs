//! The Mamba-2 ops' cases of [`super::run`] and their naive references: the mixer's biased
//! convolution and its selective scan in f64 over whole sequences, fed to the backend in
//! two calls over three sessions at once (so the state a call leaves is the state the next
//! one reads), for one group of B and C and for two; a chunk of rows against the same rows
//! one call each, which must leave the same state bit for bit (the scan's step form); and
//! the grouped norm and squared ReLU of Nemotron-H. It never calls a backend op to compute
//! an expected value.

use ferrite_arch::Mamba2Shape;

use super::recurrent::{RECURRENT_TOL, conv_f64};
use super::reference::Rng;
use super::{ELEMENT_TOL, Out, buf, host, segments};
use crate::{Backend, KvType, SsmParams, Values};

/// The shape of the cases with `n_groups` groups: four heads, odd sizes, heads of another
/// width than the state (so that `[p][n]` and `[n][p]` differ).
fn shape(n_groups: usize) -> Mamba2Shape {
    Mamba2Shape {
        conv_kernel: 4,
        n_groups,
        d_state: 5,
        n_heads: 4,
        head_dim: 3,
    }
}

/// The selective scan over one whole sequence from zero state, as the contract states it:
/// `xbc` holds `rows × conv_channels` values, `dt` `rows × n_heads`.
fn scan_f64(s: &Mamba2Shape, xbc: &[f32], dt: &[f32], p: SsmParams<&[f32]>) -> Vec<f64> {
    let SsmParams {
        a,
        d,
        dt_bias,
        dt_min,
    } = p;
    let (nh, hd, ds, ng) = (s.n_heads, s.head_dim, s.d_state, s.n_groups);
    let inner = nh * hd;
    let c = inner + 2 * ng * ds;
    let rows = xbc.len() / c;
    let mut m = vec![vec![0.0f64; hd * ds]; nh];
    let mut out = vec![0.0; rows * inner];
    for t in 0..rows {
        let row = &xbc[t * c..(t + 1) * c];
        for (h, m) in m.iter_mut().enumerate() {
            let g = h / (nh / ng);
            let raw = f64::from(dt[t * nh + h]) + f64::from(dt_bias[h]);
            let delta = if raw > 20.0 { raw } else { raw.exp().ln_1p() };
            let delta = delta.max(f64::from(dt_min));
            let da = (delta * f64::from(a[h])).exp();
            for p in 0..hd {
                let xp = f64::from(row[h * hd + p]);
                let mut y = 0.0;
                for n in 0..ds {
                    let bn = f64::from(row[inner + g * ds + n]);
                    let cn = f64::from(row[inner + ng * ds + g * ds + n]);
                    m[p * ds + n] = m[p * ds + n] * da + delta * xp * bn;
                    y += m[p * ds + n] * cn;
                }
                out[t * inner + h * hd + p] = y + f64::from(d[h]) * xp;
            }
        }
    }
    out
}

/// The per-head parameters of a case: decay rates `a < 0`, skips `d`, time-step biases.
fn params(rng: &mut Rng, nh: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let a = rng.values(nh, 1.0).iter().map(|x| -x.abs() - 0.1).collect();
    (a, rng.values(nh, 1.0), rng.values(nh, 1.0))
}

/// `params`' vectors with the floor `dt_min`, as the contract takes them.
fn with_floor<V>((a, d, dt_bias): (V, V, V), dt_min: f32) -> SsmParams<V> {
    SsmParams {
        a,
        d,
        dt_bias,
        dt_min,
    }
}

/// Bounds of `RECURRENT_TOL` of the largest magnitude of `want`.
fn bound(want: &[f64]) -> Vec<f64> {
    let top = want.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    vec![RECURRENT_TOL * top + 1e-30; want.len()]
}

/// Per session, the convolution's and the scan's outputs of all calls.
type PerSession = (Vec<Vec<f32>>, Vec<Vec<f32>>);

/// The biased convolution then the scan of three sessions, each fed in two calls (all
/// sessions in each call, as a batch does), for `n_groups` groups; `scan` checks the scan's
/// output, else the convolution's.
fn chain<B: Backend>(b: &B, rng: &mut Rng, n_groups: usize, scan: bool, out: &mut Out<'_>) {
    let s = shape(n_groups);
    let (c, k, nh, inner) = (s.conv_channels(), s.conv_kernel, s.n_heads, s.inner());
    // A prefill of 7 then a step; a step then a chunk past the kernel; two rows (shorter
    // than the convolution's history) then three.
    let plans: [(usize, usize); 3] = [(8, 7), (6, 1), (5, 2)];
    let (w, bias) = (rng.values(c * k, 0.5), rng.values(c, 0.5));
    let (a, d, dtb) = params(rng, nh);
    // Two groups also floor the time steps (about a quarter of them fall below 0.3).
    let dt_min = if n_groups == 2 { 0.3 } else { 0.0 };
    let inputs: Vec<_> = plans
        .iter()
        .map(|&(n, _)| (rng.values(n * c, 2.0), rng.values(n * nh, 3.0)))
        .collect();
    let mut conv_want = Vec::new();
    let mut scan_want = Vec::new();
    for (x, dt) in &inputs {
        let conv = conv_f64(x, &w, Some(&bias), (c, k));
        let conv32: Vec<f32> = conv.iter().map(|&v| v as f32).collect();
        let p = with_floor((&a[..], &d[..], &dtb[..]), dt_min);
        scan_want.push(scan_f64(&s, &conv32, dt, p));
        conv_want.push(conv);
    }
    let got = (|| -> crate::Result<PerSession> {
        let mut stores = Vec::new();
        for &(n, _) in &plans {
            let mut kv = b.kv(KvType::F32, 1, n, (1, 32), Values::Own)?;
            b.kv_state(&mut kv, 2, s.state_len())?;
            stores.push(kv);
        }
        let (wv, bv) = (b.vector(&w)?, b.vector(&bias)?);
        let ps = with_floor((b.vector(&a)?, b.vector(&d)?, b.vector(&dtb)?), dt_min);
        let mut conv_got = vec![Vec::new(); plans.len()];
        let mut scan_got = vec![Vec::new(); plans.len()];
        for call in 0..2 {
            let spans: Vec<(usize, usize)> = plans
                .iter()
                .map(|&(n, cut)| if call == 0 { (0, cut) } else { (cut, n - cut) })
                .collect();
            let (mut xs, mut dts) = (Vec::new(), Vec::new());
            for ((x, dt), &(p, n)) in inputs.iter().zip(&spans) {
                xs.extend_from_slice(&x[p * c..(p + n) * c]);
                dts.extend_from_slice(&dt[p * nh..(p + n) * nh]);
            }
            let rows: usize = spans.iter().map(|s| s.1).sum();
            let (xb, dtbuf) = (buf(b, &xs)?, buf(b, &dts)?);
            let mut conv = b.alloc(rows * c)?;
            let mut y = b.alloc(rows * inner)?;
            // Slot 1: a slot other than the first must be the one read and written.
            let mut segs = segments(&mut stores, &spans);
            b.conv1d(s.conv(), 1, &xb, wv, Some(bv), &mut segs, &mut conv)?;
            b.ssm_scan(&s, 1, &conv, &dtbuf, ps, &mut segs, &mut y)?;
            let (conv, y) = (host(b, &conv, rows * c)?, host(b, &y, rows * inner)?);
            let (mut at_c, mut at_y) = (0, 0);
            for (i, &(_, n)) in spans.iter().enumerate() {
                conv_got[i].extend_from_slice(&conv[at_c..at_c + n * c]);
                scan_got[i].extend_from_slice(&y[at_y..at_y + n * inner]);
                at_c += n * c;
                at_y += n * inner;
            }
        }
        Ok((conv_got, scan_got))
    })();
    let want = if scan { scan_want } else { conv_want }.concat();
    let got = got.map(|(conv, y)| if scan { y.concat() } else { conv.concat() });
    let floor = if scan {
        format!(", time steps floored at {dt_min}")
    } else {
        String::new()
    };
    let shape = format!(
        "{n_groups} group(s){floor}, 3 sessions of 8, 6, 5 rows in two calls (7+1, 1+5, 2+3)"
    );
    out.compare(shape, got, &want, &bound(&want), "1e-5 of the largest");
}

/// Six rows and two more fed to one session as two chunks, and to another one row a call:
/// every output, so every state the rows leave, must agree bit for bit.
fn chunk_vs_steps<B: Backend>(b: &B, rng: &mut Rng, out: &mut Out<'_>) {
    let s = shape(2);
    let (c, nh, inner) = (s.conv_channels(), s.n_heads, s.inner());
    let (n, probe) = (6, 2);
    let rows = n + probe;
    let (xbc, dt) = (rng.values(rows * c, 2.0), rng.values(rows * nh, 3.0));
    let (a, d, dtb) = params(rng, nh);
    // The outputs of `rows` rows fed in calls of the given sizes, in order.
    let feed = |calls: &[usize]| -> crate::Result<Vec<f32>> {
        let mut kv = [b.kv(KvType::F32, 1, rows, (1, 32), Values::Own)?];
        b.kv_state(&mut kv[0], 2, s.state_len())?;
        let ps = with_floor((b.vector(&a)?, b.vector(&d)?, b.vector(&dtb)?), 0.0);
        let (mut got, mut p) = (Vec::new(), 0);
        for &len in calls {
            let xb = buf(b, &xbc[p * c..(p + len) * c])?;
            let db = buf(b, &dt[p * nh..(p + len) * nh])?;
            let mut y = b.alloc(len * inner)?;
            let mut segs = segments(&mut kv, &[(p, len)]);
            b.ssm_scan(&s, 1, &xb, &db, ps, &mut segs, &mut y)?;
            got.extend(host(b, &y, len * inner)?);
            p += len;
        }
        Ok(got)
    };
    let shape = "a chunk of 6 then 2 against 8 rows one call each";
    match feed(&[n, probe]) {
        Err(e) => out.push(shape, super::Verdict::Failed(e.to_string())),
        Ok(chunk) => {
            let want: Vec<f64> = chunk.iter().map(|&v| f64::from(v)).collect();
            let got = feed(&[1; 8]);
            out.compare(shape, got, &want, &vec![0.0; want.len()], "bit for bit");
        }
    }
}

/// The convolution with a bias per channel (a Mamba-2 mixer's), its output checked.
pub(super) fn conv_bias<B: Backend>(b: &B, rng: &mut Rng, out: &mut Out<'_>) {
    chain(b, rng, 2, false, out);
}

/// The selective scan on the biased convolution's output, for one group and for two, and
/// a chunk against the same rows one call each.
pub(super) fn ssm_scan<B: Backend>(b: &B, rng: &mut Rng, out: &mut Out<'_>) {
    for n_groups in [1, 2] {
        chain(b, rng, n_groups, true, out);
    }
    chunk_vs_steps(b, rng, out);
}

/// `x / sqrt(mean over its group(x²) + eps) · w` per group of each row, and `max(x, 0)²`.
pub(super) fn group_norm_relu_sq<B: Backend>(b: &B, rng: &mut Rng, norm: bool, out: &mut Out<'_>) {
    // Groups of odd size, groups of a wide row, one group the whole row.
    for (n, width, group) in [(1, 6, 3), (3, 64, 16), (2, 8, 8)] {
        let len = n * width;
        let (x, w) = (rng.values(len, 3.0), rng.values(width, 2.0));
        let eps = 1e-5;
        let want: Vec<f64> = if norm {
            let mut want = Vec::with_capacity(len);
            for (i, part) in x.chunks(group).enumerate() {
                let ms = part.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / group as f64;
                let inv = 1.0 / (ms + f64::from(eps)).sqrt();
                for (j, &v) in part.iter().enumerate() {
                    let wi = w[(i * group + j) % width];
                    want.push(f64::from(v) * inv * f64::from(wi));
                }
            }
            want
        } else {
            x.iter().map(|&v| f64::from(v).max(0.0).powi(2)).collect()
        };
        let bound: Vec<f64> = want
            .iter()
            .map(|v| 8.0 * ELEMENT_TOL * v.abs() + 1e-30)
            .collect();
        let got = (|| {
            // One row more than asked for, which must stay as it was.
            let mut padded = x.clone();
            padded.extend(rng_free_tail(width));
            let mut xb = buf(b, &padded)?;
            if norm {
                b.group_norm(&mut xb, len, b.vector(&w)?, width, group, eps)?;
            } else {
                b.relu_sq(&mut xb, len)?;
            }
            let all = host(b, &xb, len + width)?;
            if all[len..] != rng_free_tail(width)[..] {
                return Err(crate::BackendError::Shape {
                    op: if norm { "group_norm" } else { "relu_sq" },
                    what: "changed values past len".into(),
                });
            }
            Ok(all[..len].to_vec())
        })();
        let shape = if norm {
            format!("{n} rows of {width} in groups of {group}")
        } else {
            format!("{n} rows of {width}")
        };
        out.compare(shape, got, &want, &bound, "1.6e-5 relative");
    }
}

/// Values past the ones an op is asked for: negative and positive, so that neither op
/// would leave them as they are.
fn rng_free_tail(n: usize) -> Vec<f32> {
    (0..n).map(|i| i as f32 * 0.5 - 1.25).collect()
}
