//! The cases of [`super::run`] and their naive references: plain f64 loops over the
//! inputs, written without reference to any backend's kernels. It never calls a backend
//! op to compute an expected value.

use ferrite_gguf::GgmlType;
use half::f16;

use super::{
    ATTENTION_TOL, ELEMENT_TOL, Out, PRODUCT_TOL, TestMatrix, attn_shape, buf, expert_bufs, host,
    random_routing, rope_args, segments, stores,
};
use crate::{Act, AttnShape, Backend, Gating, KvType, Op, RopeStyle, RouteRule, Routing, Values};

/// A xorshift generator: reproducible inputs without a dependency.
pub(super) struct Rng(pub(super) u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A value in `[-scale, scale)`.
    fn value(&mut self, scale: f32) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
    }

    /// `n` values in `[-scale, scale)`.
    pub(super) fn values(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.value(scale)).collect()
    }

    /// A random `rows × cols` matrix of `ty`: each block random bytes, kept when the
    /// reference dequantizer reads them as finite values of magnitude at most 8 (so every
    /// type is covered, also those with no quantizer). `None` when `cols` is not whole
    /// blocks or the type has no reference dequantizer.
    fn matrix(&mut self, ty: GgmlType, rows: usize, cols: usize) -> Option<TestMatrix> {
        let (bs, bb) = (ty.block_size() as usize, ty.type_size() as usize);
        if bs == 0 || !cols.is_multiple_of(bs) {
            return None;
        }
        let blocks = rows * cols / bs;
        let (mut bytes, mut values) = (Vec::with_capacity(blocks * bb), Vec::new());
        let mut block = vec![0u8; bb];
        let mut vals = vec![0.0f32; bs];
        for _ in 0..blocks {
            let mut tries = 0;
            loop {
                block.iter_mut().for_each(|b| *b = self.next() as u8);
                ferrite_quant::dequantize_ref(ty, &block, &mut vals).ok()?;
                if vals.iter().all(|v| v.is_finite() && v.abs() <= 8.0) {
                    break;
                }
                tries += 1;
                if tries > 10_000 {
                    return None;
                }
            }
            bytes.extend_from_slice(&block);
            values.extend_from_slice(&vals);
        }
        Some(TestMatrix {
            ty,
            rows,
            cols,
            bytes,
            values,
        })
    }
}

/// Column counts of whole blocks of `ty`: one block (or 7 values of a one-value block) and
/// three blocks (or 96 values).
fn widths(ty: GgmlType) -> [usize; 2] {
    match ty.block_size() as usize {
        1 => [7, 96],
        bs => [bs, 3 * bs],
    }
}

/// `y[t][r] = Σ_k W[r][k] x[t][k]` and the bounds `PRODUCT_TOL · Σ |W x|`.
fn product(w: &TestMatrix, x: &[f32], n: usize) -> (Vec<f64>, Vec<f64>) {
    let (mut want, mut bound) = (Vec::new(), Vec::new());
    for t in 0..n {
        for r in 0..w.rows {
            let (mut s, mut a) = (0.0f64, 0.0f64);
            for k in 0..w.cols {
                let p = f64::from(w.values[r * w.cols + k]) * f64::from(x[t * w.cols + k]);
                s += p;
                a += p.abs();
            }
            want.push(s);
            bound.push(PRODUCT_TOL * a + 1e-30);
        }
    }
    (want, bound)
}

const PRODUCT_RULE: &str = "1e-4 * sum|w*x|";

pub(super) fn embed<B: Backend>(b: &B, rng: &mut Rng, ty: GgmlType, out: &mut Out<'_>) {
    let cols = widths(ty)[1];
    let Some(table) = rng.matrix(ty, 11, cols) else {
        return out.push("11 rows", no_matrix(ty));
    };
    for (tokens, scale) in [(&[0u32][..], 1.0f32), (&[10, 3, 3, 0][..], 2.5)] {
        let shape = format!("11x{cols} table, {} tokens, scale {scale}", tokens.len());
        if out.refuses(b, Op::Embed { ty, cols }, &shape) {
            continue;
        }
        let want: Vec<f64> = tokens
            .iter()
            .flat_map(|&t| &table.values[t as usize * cols..(t as usize + 1) * cols])
            .map(|&v| f64::from(v) * f64::from(scale))
            .collect();
        let bound: Vec<f64> = want.iter().map(|w| ELEMENT_TOL * w.abs()).collect();
        let got = (|| {
            let mut x = b.alloc(tokens.len() * cols)?;
            b.embed(b.weight(table.host())?, tokens, scale, &mut x)?;
            host(b, &x, tokens.len() * cols)
        })();
        out.compare(shape, got, &want, &bound, "2e-6 relative");
    }
}

fn no_matrix(ty: GgmlType) -> super::Verdict {
    super::Verdict::Failed(format!("the harness cannot build {ty} test weights"))
}

pub(super) fn matmul<B: Backend>(b: &B, rng: &mut Rng, ty: GgmlType, out: &mut Out<'_>) {
    let [c1, c3] = widths(ty);
    // One row; rows that straddle the 16- and 64-row groups; token counts across the
    // single-token, multi-column (<= 16) and tiled (17) paths.
    for (rows, cols, n) in [(1, c1, 1), (67, c3, 1), (67, c3, 5), (33, c1, 17)] {
        let shape = format!("{rows}x{cols} x {n} rows");
        if out.refuses(b, Op::MatMul { ty, cols }, &shape) {
            continue;
        }
        let Some(w) = rng.matrix(ty, rows, cols) else {
            return out.push(format!("{rows}x{cols}"), no_matrix(ty));
        };
        let x = rng.values(n * cols, 1.0);
        let (want, bound) = product(&w, &x, n);
        let got = (|| {
            let xb = buf(b, &x)?;
            let mut y = b.alloc(n * rows)?;
            b.matmul(b.weight(w.host())?, &xb, n, &mut y)?;
            host(b, &y, n * rows)
        })();
        out.compare(shape, got, &want, &bound, PRODUCT_RULE);
    }
}

pub(super) fn matmul_shared<B: Backend>(b: &B, rng: &mut Rng, ty: GgmlType, out: &mut Out<'_>) {
    let cols = widths(ty)[1];
    for n in [1, 17] {
        let shape = format!("67+16+33 rows x {cols} x {n} rows");
        if out.refuses(b, Op::MatMulShared { ty, cols }, &shape) {
            continue;
        }
        let ws: Vec<TestMatrix> = [67, 16, 33]
            .iter()
            .filter_map(|&rows| rng.matrix(ty, rows, cols))
            .collect();
        let [a, bm, c] = &ws[..] else {
            return out.push(format!("3 x {cols} wide"), no_matrix(ty));
        };
        let x = rng.values(n * cols, 1.0);
        let (mut want, mut bound) = (Vec::new(), Vec::new());
        for w in [a, bm, c] {
            let (wa, bo) = product(w, &x, n);
            want.extend(wa);
            bound.extend(bo);
        }
        let got = (|| {
            let xb = buf(b, &x)?;
            let (mut ya, mut yb, mut yc) = (b.alloc(n * 67)?, b.alloc(n * 16)?, b.alloc(n * 33)?);
            let ws = [
                b.weight(a.host())?,
                b.weight(bm.host())?,
                b.weight(c.host())?,
            ];
            b.matmul_shared(ws, &xb, n, [&mut ya, &mut yb, &mut yc])?;
            let mut all = host(b, &ya, n * 67)?;
            all.extend(host(b, &yb, n * 16)?);
            all.extend(host(b, &yc, n * 33)?);
            Ok(all)
        })();
        out.compare(shape, got, &want, &bound, PRODUCT_RULE);
    }
}

pub(super) fn logits<B: Backend>(b: &B, rng: &mut Rng, ty: GgmlType, out: &mut Out<'_>) {
    let cols = widths(ty)[0];
    let shape = format!("vocab 97 x {cols} x 2 rows");
    if out.refuses(b, Op::Logits { ty, cols }, &shape) {
        return;
    }
    let Some(w) = rng.matrix(ty, 97, cols) else {
        return out.push("97 rows", no_matrix(ty));
    };
    let x = rng.values(2 * cols, 1.0);
    let (want, bound) = product(&w, &x, 2);
    let got = (|| {
        let xb = buf(b, &x)?;
        let mut y = vec![0.0f32; 2 * 97];
        b.logits(b.weight(w.host())?, &xb, 2, &mut y)?;
        Ok(y)
    })();
    out.compare(shape, got, &want, &bound, PRODUCT_RULE);
}

/// `act(gate) · up` in f64.
fn gated_f64(act: Act, gate: f64, up: f64) -> f64 {
    let silu = |x: f64, slope: f64| x / (1.0 + (-slope * x).exp());
    match act {
        Act::Silu => silu(gate, 1.0) * up,
        Act::GeluTanh => {
            let x = gate;
            0.5 * x
                * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh())
                * up
        }
        Act::SwigluOai => {
            let limit = f64::from(Act::SWIGLU_OAI_LIMIT);
            let g = gate.min(limit);
            silu(g, f64::from(Act::SWIGLU_OAI_ALPHA)) * (up.clamp(-limit, limit) + 1.0)
        }
        Act::Sigmoid => up / (1.0 + (-gate).exp()),
    }
}

pub(super) fn moe_experts<B: Backend>(
    b: &B,
    rng: &mut Rng,
    ty: GgmlType,
    (act, biased): (Act, bool),
    out: &mut Out<'_>,
) {
    let [d, _] = widths(ty);
    let ff = d;
    let (ne, k) = (4, 2);
    // Asked again at the case's width, as the matrix products are.
    let op = |cols| Op::MoeExperts {
        ty,
        act,
        bias: biased,
        cols,
    };
    if out.refuses(b, op(d), &format!("d={d} ff={ff}")) {
        return;
    }
    let mut ws = Vec::new();
    for _ in 0..ne {
        let (Some(g), Some(u), Some(dn)) = (
            rng.matrix(ty, ff, d),
            rng.matrix(ty, ff, d),
            rng.matrix(ty, d, ff),
        ) else {
            return out.push(format!("{ne} experts"), no_matrix(ty));
        };
        ws.push([g, u, dn]);
    }
    // Biases of the size of the products, so that they move which side of the clamp a
    // value falls on.
    let biases: Option<Vec<[Vec<f32>; 3]>> = biased.then(|| {
        (0..ne)
            .map(|_| [rng.values(ff, 4.0), rng.values(ff, 4.0), rng.values(d, 4.0)])
            .collect()
    });
    for rows in [1, 6] {
        let routing = random_routing(rng, ne, k, rows);
        let x = rng.values(rows * d, 1.0);
        let (want, bound) = moe_reference(&ws, biases.as_deref(), &routing, act, &x, (d, ff));
        let got = (|| {
            let handles = ws
                .iter()
                .enumerate()
                .map(|(e, [g, u, dn])| {
                    let bias = match &biases {
                        Some(bs) => Some([
                            b.vector(&bs[e][0])?,
                            b.vector(&bs[e][1])?,
                            b.vector(&bs[e][2])?,
                        ]),
                        None => None,
                    };
                    Ok(crate::ExpertFfn {
                        mats: [
                            b.weight(g.host())?,
                            b.weight(u.host())?,
                            b.weight(dn.host())?,
                        ],
                        bias,
                    })
                })
                .collect::<crate::Result<Vec<_>>>()?;
            let xb = buf(b, &x)?;
            let mut bufs = expert_bufs(b, rows, k, d, ff)?;
            let mut y = b.alloc(rows * d)?;
            b.moe_experts(&xb, &routing, &|e| handles[e], act, &mut bufs, &mut y)?;
            host(b, &y, rows * d)
        })();
        let shape = format!("{ne} experts top {k}, d={d} ff={ff}, biased {biased}, {rows} rows");
        out.compare(shape, got, &want, &bound, "1e-3 * sum|w*down*h|");
    }
}

/// Each token's `Σ_slot weight · (down(act(gate x + bg) · (up x + bu)) + bd)` and its
/// bounds (`biases`: each expert's `[bg, bu, bd]`, or none).
fn moe_reference(
    ws: &[[TestMatrix; 3]],
    biases: Option<&[[Vec<f32>; 3]]>,
    routing: &Routing,
    act: Act,
    x: &[f32],
    (d, ff): (usize, usize),
) -> (Vec<f64>, Vec<f64>) {
    let k = routing.k();
    let (mut want, mut bound) = (
        vec![0.0; routing.rows() * d],
        vec![1e-30; routing.rows() * d],
    );
    for t in 0..routing.rows() {
        let xt = &x[t * d..(t + 1) * d];
        for slot in 0..k {
            let i = t * k + slot;
            let e = routing.selected()[i];
            let [g, u, dn] = &ws[e];
            let bias = |which: usize, j: usize| biases.map_or(0.0, |bs| f64::from(bs[e][which][j]));
            let wt = f64::from(routing.weights()[i]);
            let h: Vec<f64> = (0..ff)
                .map(|j| {
                    let row = |m: &TestMatrix| -> f64 {
                        (0..d)
                            .map(|c| f64::from(m.values[j * d + c]) * f64::from(xt[c]))
                            .sum()
                    };
                    gated_f64(act, row(g) + bias(0, j), row(u) + bias(1, j))
                })
                .collect();
            for r in 0..d {
                let (mut s, mut a) = (bias(2, r), bias(2, r).abs());
                for (j, hj) in h.iter().enumerate() {
                    let p = f64::from(dn.values[r * ff + j]) * hj;
                    s += p;
                    a += p.abs();
                }
                want[t * d + r] += wt * s;
                bound[t * d + r] += 1e-3 * wt.abs() * a;
            }
        }
    }
    (want, bound)
}

fn rms_ref(x: &[f32], w: &[f32], eps: f32) -> Vec<f64> {
    let dim = w.len();
    x.chunks(dim)
        .flat_map(|row| {
            let ms = row.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / dim as f64;
            let inv = 1.0 / (ms + f64::from(eps)).sqrt();
            row.iter()
                .zip(w)
                .map(move |(&v, &g)| f64::from(v) * inv * f64::from(g))
        })
        .collect()
}

fn rel_bound(want: &[f64]) -> Vec<f64> {
    want.iter().map(|w| ELEMENT_TOL * w.abs() + 1e-30).collect()
}

pub(super) fn norms<B: Backend>(b: &B, rng: &mut Rng, op: Op, out: &mut Out<'_>) {
    // A one-value row, odd widths (the eight-lane sums' remainders), SmolLM2's width.
    for (dim, rows) in [(1, 1), (7, 3), (77, 2), (576, 3)] {
        let len = dim * rows;
        let (x, y, w) = (
            rng.values(len, 3.0),
            rng.values(len, 3.0),
            rng.values(dim, 2.0),
        );
        let eps = 1e-6;
        let got = (|| {
            let (mut xb, yb) = (buf(b, &x)?, buf(b, &y)?);
            let mut o = b.alloc(len)?;
            let wv = b.vector(&w)?;
            match op {
                Op::NormInto => b.norm_into(&xb, len, wv, dim, eps, &mut o)?,
                Op::AddNorm => {
                    b.add_norm(&mut xb, &yb, len, wv, dim, eps, &mut o)?;
                    // The sum stays in x.
                    let mut all = host(b, &o, len)?;
                    all.extend(host(b, &xb, len)?);
                    return Ok(all);
                }
                _ => {
                    b.rms_norm(&mut xb, len, wv, dim, eps)?;
                    return host(b, &xb, len);
                }
            }
            host(b, &o, len)
        })();
        let want = match op {
            Op::AddNorm => {
                let s: Vec<f32> = x.iter().zip(&y).map(|(a, c)| a + c).collect();
                let mut want = rms_ref(&s, &w, eps);
                want.extend(x.iter().zip(&y).map(|(&a, &c)| f64::from(a) + f64::from(c)));
                want
            }
            _ => rms_ref(&x, &w, eps),
        };
        let bound = rel_bound(&want);
        out.compare(
            format!("{rows} rows of {dim}"),
            got,
            &want,
            &bound,
            "2e-6 relative",
        );
    }
}

pub(super) fn adds<B: Backend>(b: &B, rng: &mut Rng, op: Op, out: &mut Out<'_>) {
    for (dim, rows) in [(1, 1), (7, 3), (576, 2)] {
        let len = dim * rows;
        let (x, y) = (rng.values(len, 3.0), rng.values(len, 3.0));
        let got = (|| {
            let (mut xb, yb) = (buf(b, &x)?, buf(b, &y)?);
            match op {
                Op::Add => b.add(&mut xb, &yb, len)?,
                Op::AddBias => b.add_bias(&mut xb, len, b.vector(&y[..dim])?, dim)?,
                _ => {
                    // Into another buffer at an offset, then within it (rows moved down).
                    let mut o = b.alloc(len + dim)?;
                    b.copy(Some(&xb), 0, &mut o, dim, len)?;
                    b.copy(None, dim, &mut o, 0, dim)?;
                    return host(b, &o, len + dim);
                }
            }
            host(b, &xb, len)
        })();
        let want: Vec<f64> = match op {
            Op::Add => x
                .iter()
                .zip(&y)
                .map(|(&a, &c)| f64::from(a) + f64::from(c))
                .collect(),
            Op::AddBias => x
                .iter()
                .enumerate()
                .map(|(i, &a)| f64::from(a) + f64::from(y[i % dim]))
                .collect(),
            _ => x[..dim].iter().chain(&x).map(|&v| f64::from(v)).collect(),
        };
        let (bound, rule) = match op {
            Op::Copy => (vec![0.0; want.len()], "exact"),
            _ => (rel_bound(&want), "2e-6 relative"),
        };
        out.compare(format!("{rows} rows of {dim}"), got, &want, &bound, rule);
    }
}

pub(super) fn gated_act<B: Backend>(b: &B, rng: &mut Rng, act: Act, out: &mut Out<'_>) {
    // One value, an odd tail, several rows of an odd width.
    for (n, width) in [(1, 1), (1, 17), (3, 4099)] {
        let len = n * width;
        // Past gpt-oss's clamps (±7) on both inputs.
        let (gs, us) = match act {
            Act::SwigluOai => (10.0, 10.0),
            Act::Silu | Act::GeluTanh | Act::Sigmoid => (6.0, 2.0),
        };
        let (g, u) = (rng.values(len, gs), rng.values(len, us));
        let want: Vec<f64> = g
            .iter()
            .zip(&u)
            .map(|(&a, &c)| gated_f64(act, f64::from(a), f64::from(c)))
            .collect();
        let bound: Vec<f64> = want
            .iter()
            .zip(&u)
            .map(|(w, &c)| ELEMENT_TOL * (w.abs() + f64::from(c).abs()))
            .collect();
        let got = (|| {
            let (mut gb, ub) = (buf(b, &g)?, buf(b, &u)?);
            b.gated_act(act, &mut gb, &ub, n, width)?;
            host(b, &gb, len)
        })();
        let shape = format!("{n} rows of {width}");
        out.compare(shape, got, &want, &bound, "2e-6 * (|want| + |up|)");
    }
}

/// `x` (rows of whole heads) rotated to the positions of `spans`, in f64.
fn rope_ref(
    x: &[f32],
    width: usize,
    hd: usize,
    style: RopeStyle,
    factors: Option<&[f32]>,
    long: Option<(&[f32], usize)>,
    spans: &[(usize, usize)],
) -> (Vec<f64>, Vec<f64>) {
    let mut want: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
    let mut bound = vec![1e-30; x.len()];
    // Each row's position and its segment's divisors (the long ones for a store of more
    // than `after` positions; the harness's stores hold exactly `pos0 + len`).
    let rows = spans.iter().flat_map(|&(p, n)| {
        let f = match long {
            Some((l, after)) if p + n > after => Some(l),
            _ => factors,
        };
        (p..p + n).map(move |pos| (pos, f))
    });
    for (row, (pos, factors)) in rows.enumerate() {
        for h in 0..width / hd {
            let at = row * width + h * hd;
            for i in 0..hd / 2 {
                let f = factors.map_or(1.0, |f| f64::from(f[i]));
                let theta = pos as f64 * 10_000f64.powf(-((2 * i) as f64) / hd as f64) / f;
                let (a, c) = match style {
                    RopeStyle::Interleaved => (at + 2 * i, at + 2 * i + 1),
                    RopeStyle::HalfSplit => (at + i, at + i + hd / 2),
                };
                let (x0, x1) = (f64::from(x[a]), f64::from(x[c]));
                want[a] = x0 * theta.cos() - x1 * theta.sin();
                want[c] = x0 * theta.sin() + x1 * theta.cos();
                bound[a] = ELEMENT_TOL * (x0.abs() + x1.abs()) + 1e-30;
                bound[c] = bound[a];
            }
        }
    }
    (want, bound)
}

pub(super) fn rope<B: Backend>(
    b: &B,
    rng: &mut Rng,
    style: RopeStyle,
    (scaled, long): (bool, bool),
    store: Option<KvType>,
    out: &mut Out<'_>,
) {
    // With `long`, the session at 1000 is past the switch point and the one at 5 is not.
    const AFTER: usize = 500;
    // Heads of 2 and of 64; one session at 0, and two at once, one deep in its context.
    for (hd, heads, spans) in [
        (2, 3, &[(0usize, 3usize)][..]),
        (64, 2, &[(1000, 2), (5, 3)][..]),
    ] {
        let rows: usize = spans.iter().map(|s| s.1).sum();
        let (qw, kw) = (2 * heads * hd, heads * hd);
        let (q, k, v) = (
            rng.values(rows * qw, 1.0),
            rng.values(rows * kw, 1.0),
            rng.values(rows * kw, 1.0),
        );
        let factors: Vec<f32> = (0..hd / 2).map(|i| 1.0 + i as f32 * 0.5).collect();
        let factors = scaled.then_some(&factors[..]);
        let long_f: Vec<f32> = (0..hd / 2).map(|i| 2.0 + i as f32 * 0.25).collect();
        let long = long.then_some((&long_f[..], AFTER));
        let (mut want, mut bound) = rope_ref(&q, qw, hd, style, factors, long, spans);
        if store.is_some() {
            let (wk, bk) = rope_ref(&k, kw, hd, style, factors, long, spans);
            want.extend(wk);
            bound.extend(bk);
        }
        let got = (|| {
            // Without a store the segments only place the rows; any KV type will do.
            let kv = store.unwrap_or_default();
            let mut kvs = stores(b, kv, (heads, hd), Values::Own, spans)?;
            let mut segs = segments(&mut kvs, spans);
            let mut angles = B::Angles::default();
            b.rope_prepare(
                &mut angles,
                hd,
                &mut [10_000.0, 10_000.0].into_iter(),
                &segs,
            )?;
            let long = match long {
                Some((f, after)) => Some((b.vector(f)?, after)),
                None => None,
            };
            let r = rope_args(hd, style, factors.map(|f| b.vector(f)).transpose()?, long);
            let (mut qb, mut kb, vb) = (buf(b, &q)?, buf(b, &k)?, buf(b, &v)?);
            if store.is_some() {
                b.rope_store(&r, &angles, 0, (&mut qb, qw), (&mut kb, &vb, kw), &mut segs)?;
                let mut all = host(b, &qb, rows * qw)?;
                all.extend(host(b, &kb, rows * kw)?);
                return Ok(all);
            }
            b.rope(&r, &angles, &mut qb, qw, &segs)?;
            host(b, &qb, rows * qw)
        })();
        let shape = format!("{} heads of {hd}, segments {spans:?}", 2 * heads);
        out.compare(shape, got, &want, &bound, "2e-6 * (|x0| + |x1|) per pair");
    }
}

/// `x` as a store of `kv` gives it back: f16 rounding, or per block of 32 values
/// `d = max|x| / 127` and `d · round(x / d)` (ties away from zero).
fn stored(kv: KvType, x: &[f32]) -> Vec<f32> {
    match kv {
        KvType::F32 => x.to_vec(),
        KvType::F16 => x.iter().map(|&v| f16::from_f32(v).to_f32()).collect(),
        KvType::Q8 => x
            .chunks(32)
            .flat_map(|blk| {
                let d = blk.iter().fold(0.0f32, |a, v| a.max(v.abs())) / 127.0;
                blk.iter().map(move |&v| {
                    if d == 0.0 {
                        0.0
                    } else {
                        d * (v * (1.0 / d)).round().clamp(-127.0, 127.0)
                    }
                })
            })
            .collect(),
    }
}

pub(super) fn kv_store<B: Backend>(b: &B, rng: &mut Rng, kv: KvType, out: &mut Out<'_>) {
    // Read back through attention with a window of one: each row sees only its own key,
    // so its output is its own stored value.
    let (heads, hd) = (2, 64);
    let spans = [(0usize, 4usize), (9, 1)];
    let rows = 5;
    let w = heads * hd;
    let (k, v, q) = (
        rng.values(rows * w, 1.0),
        rng.values(rows * w, 1.0),
        rng.values(rows * w, 1.0),
    );
    let want: Vec<f64> = stored(kv, &v).iter().map(|&x| f64::from(x)).collect();
    let bound = rel_bound(&want);
    let got = (|| {
        let mut kvs = stores(b, kv, (heads, hd), Values::Own, &spans)?;
        let mut segs = segments(&mut kvs, &spans);
        let (kb, vb, qb) = (buf(b, &k)?, buf(b, &v)?, buf(b, &q)?);
        b.kv_store(0, &kb, &vb, w, &mut segs)?;
        let mut o = b.alloc(rows * w)?;
        b.attention(
            &attn_shape(heads, heads, hd, Some(1), None, Values::Own),
            0,
            &qb,
            None,
            &segs,
            &mut o,
        )?;
        host(b, &o, rows * w)
    })();
    let shape = format!("{heads} heads of {hd}, segments {spans:?}, window 1");
    out.compare(shape, got, &want, &bound, "2e-6 relative");
}

/// Causal (windowed) attention of each span's rows over all positions `0..pos0 + len` of
/// its keys and values (`kvs[s]`: `(pos0 + len) × n_kv × hd` values each), in f64; with
/// `sinks`, each head's sink logit joins its softmax's denominator.
fn attention_ref(
    shape: &AttnShape,
    q: &[f32],
    sinks: Option<&[f32]>,
    kvs: &[(Vec<f32>, Vec<f32>)],
    spans: &[(usize, usize)],
) -> (Vec<f64>, Vec<f64>) {
    let (n_head, n_kv, hd, window) = (shape.n_head, shape.n_kv_head, shape.head_dim, shape.window);
    // Value rows hold `vd` values a head (the keys' own values where they lie in them).
    let vd = shape.values.dim(hd);
    let cap = |x: f64| match shape.softcap {
        Some(c) => f64::from(c) * (x / f64::from(c)).tanh(),
        None => x,
    };
    let (mut want, mut bound) = (Vec::new(), Vec::new());
    let scale = f64::from(shape.scale);
    let mut row = 0;
    for ((k, v), &(pos0, len)) in kvs.iter().zip(spans) {
        let vmax = v.iter().fold(0.0f64, |a, &x| a.max(f64::from(x).abs()));
        for t in 0..len {
            let p = pos0 + t;
            let lo = window.map_or(0, |w| (p + 1).saturating_sub(w));
            for h in 0..n_head {
                let g = h / (n_head / n_kv);
                let qh = &q[(row * n_head + h) * hd..][..hd];
                let s: Vec<f64> = (lo..=p)
                    .map(|j| {
                        let kj = &k[(j * n_kv + g) * hd..][..hd];
                        qh.iter()
                            .zip(kj)
                            .map(|(&a, &c)| f64::from(a) * f64::from(c))
                            .sum::<f64>()
                            * scale
                    })
                    .map(cap)
                    .collect();
                let sink = sinks.map(|v| f64::from(v[h]));
                let m = s
                    .iter()
                    .copied()
                    .chain(sink)
                    .fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = s.iter().chain(&sink).map(|x| (x - m).exp()).sum();
                for d in 0..vd {
                    let o: f64 = (lo..=p)
                        .zip(&s)
                        .map(|(j, &sj)| (sj - m).exp() / z * f64::from(v[(j * n_kv + g) * vd + d]))
                        .sum();
                    want.push(o);
                    bound.push(ATTENTION_TOL * vmax + 1e-30);
                }
            }
            row += 1;
        }
    }
    (want, bound)
}

/// Query heads, KV heads, window, and the sessions' `(pos0, len)` of one attention case.
type AttnCase = (usize, usize, Option<usize>, &'static [(usize, usize)]);

pub(super) fn attention<B: Backend>(
    b: &B,
    rng: &mut Rng,
    kv: KvType,
    (hd, values): (usize, Values),
    (softcap, sinks): (bool, bool),
    out: &mut Out<'_>,
) {
    let vd = values.dim(hd);
    // Scaled scores of unit-scale q and k spread about ±1: a cap of 0.8 changes them all.
    let softcap = softcap.then_some(0.8f32);
    // A prefill chunk; one query deep in a window; two sessions of a batch at different
    // depths, one past the attention's key blocks; a single KV head (Gemma 3's group of 4).
    let cases: [AttnCase; 4] = [
        (4, 2, None, &[(0, 9)]),
        (4, 2, Some(5), &[(37, 1)]),
        (4, 2, None, &[(600, 1), (3, 4)]),
        (4, 1, Some(3), &[(6, 2), (0, 1)]),
    ];
    for (n_head, n_kv, window, spans) in cases {
        let rows: usize = spans.iter().map(|s| s.1).sum();
        let q = rng.values(rows * n_head * hd, 1.0);
        let kw = n_kv * hd;
        let hist: Vec<(Vec<f32>, Vec<f32>)> = spans
            .iter()
            .map(|&(p, n)| (rng.values((p + n) * kw, 1.0), rng.values((p + n) * kw, 1.0)))
            .collect();
        let rounded: Vec<(Vec<f32>, Vec<f32>)> = hist
            .iter()
            .map(|(k, v)| {
                let k = stored(kv, k);
                let v = match values {
                    Values::Own => stored(kv, v),
                    // The values are the stored keys' own: columns `at..at + dim` of each
                    // key head.
                    Values::InKeys { at, dim } => k
                        .chunks_exact(hd)
                        .flat_map(|head| head[at..at + dim].to_vec())
                        .collect(),
                };
                (k, v)
            })
            .collect();
        let shape = attn_shape(n_head, n_kv, hd, window, softcap, values);
        // Sink logits about the scores' size: each takes a fair share of its softmax.
        let sink = sinks.then(|| rng.values(n_head, 2.0));
        let (want, bound) = attention_ref(&shape, &q, sink.as_deref(), &rounded, spans);
        let got = (|| {
            let mut kvs = stores(b, kv, (n_kv, hd), values, spans)?;
            // Every position's key and value first, one store call per session.
            for ((store, (k, v)), &(p, n)) in kvs.iter_mut().zip(&hist).zip(spans) {
                let (kb, vb) = (buf(b, k)?, buf(b, v)?);
                b.kv_store(
                    0,
                    &kb,
                    &vb,
                    kw,
                    &mut segments(std::slice::from_mut(store), &[(0, p + n)]),
                )?;
            }
            let segs = segments(&mut kvs, spans);
            let qb = buf(b, &q)?;
            let mut o = b.alloc(rows * n_head * vd)?;
            let sinks = sink.as_deref().map(|v| b.vector(v)).transpose()?;
            b.attention(&shape, 0, &qb, sinks, &segs, &mut o)?;
            host(b, &o, rows * n_head * vd)
        })();
        let shape = format!(
            "{n_head}/{n_kv} heads, window {window:?}, cap {softcap:?}, values {values:?}, \
             sinks {sinks}, segments {spans:?}"
        );
        out.compare(shape, got, &want, &bound, "1e-5 * max|v|");
    }
}

pub(super) fn moe_route<B: Backend>(b: &B, rng: &mut Rng, n_expert: usize, out: &mut Out<'_>) {
    let sigmoid = RouteRule {
        gating: Gating::Sigmoid,
        norm_topk: true,
        scale: 2.5,
        groups: None,
    };
    let cases = [
        (1, RouteRule::softmax(false), false),
        (2, RouteRule::softmax(true), false),
        (2, RouteRule::softmax(false), false),
        (2, sigmoid, true),
    ];
    for (k, rule, biased) in cases {
        let rows = 3;
        let mut logits = rng.values(rows * n_expert, 3.0);
        // A tie between two experts: the lower id must win.
        logits[1] = logits[0];
        let bias = biased.then(|| rng.values(n_expert, 0.3));
        let mut want = Vec::new();
        let mut sel = Vec::new();
        for row in logits.chunks(n_expert) {
            let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let p: Vec<f64> = match rule.gating {
                Gating::Softmax => {
                    let e: Vec<f64> = row.iter().map(|&l| f64::from(l - m).exp()).collect();
                    let z: f64 = e.iter().sum();
                    e.iter().map(|x| x / z).collect()
                }
                Gating::Sigmoid => row
                    .iter()
                    .map(|&l| 1.0 / (1.0 + (-f64::from(l)).exp()))
                    .collect(),
            };
            let c: Vec<f64> = (0..n_expert)
                .map(|e| p[e] + bias.as_ref().map_or(0.0, |b| f64::from(b[e])))
                .collect();
            let mut ids: Vec<usize> = (0..n_expert).collect();
            ids.sort_by(|&a, &d| c[d].total_cmp(&c[a]).then(a.cmp(&d)));
            let top = &ids[..k];
            let s: f64 = top.iter().map(|&e| p[e]).sum();
            for &e in top {
                sel.push(e);
                let norm = if rule.norm_topk { s } else { 1.0 };
                want.push(p[e] / norm * f64::from(rule.scale));
            }
        }
        let got = (|| {
            let lb = buf(b, &logits)?;
            let mut r = Routing::new(n_expert, k, rows);
            r.begin(rows, k);
            b.moe_route(&lb, &mut r, &rule, bias.as_deref())?;
            if r.selected() != sel {
                return Err(crate::BackendError::Shape {
                    op: "moe_route",
                    what: format!("selected {:?}, reference {sel:?}", r.selected()),
                });
            }
            Ok(r.weights().to_vec())
        })();
        let bound = rel_bound(&want);
        let shape = format!("{rows} rows, top {k} of {n_expert}, {rule:?}, bias {biased}");
        out.compare(
            shape,
            got,
            &want,
            &bound,
            "same experts, weights 2e-6 relative",
        );
    }
    // A rule that cannot route these experts (groups that do not split them) is refused.
    let unroutable = RouteRule {
        groups: Some((n_expert + 1, 1)),
        ..RouteRule::softmax(true)
    };
    let got = (|| {
        let lb = buf(b, &rng.values(n_expert, 1.0))?;
        let mut r = Routing::new(n_expert, 1, 1);
        r.begin(1, 1);
        match b.moe_route(&lb, &mut r, &unroutable, None) {
            Err(_) => Ok(Vec::new()),
            Ok(()) => Err(crate::BackendError::Shape {
                op: "moe_route",
                what: format!("accepted {unroutable:?} over {n_expert} experts"),
            }),
        }
    })();
    let shape = format!("{} groups of {n_expert} experts", n_expert + 1);
    out.compare(shape, got, &[], &[], "refused");
}

pub(super) fn top_k<B: Backend>(b: &B, rng: &mut Rng, k: usize, out: &mut Out<'_>) {
    for n_vocab in [5, 97, 1000] {
        if k > n_vocab {
            continue;
        }
        let mut logits = rng.values(2 * n_vocab, 4.0);
        // Ties (the lower id first) and, where the row has values to spare, a NaN (never
        // a candidate) in the second row.
        logits[n_vocab + 1] = logits[n_vocab + 3];
        if n_vocab > k {
            logits[n_vocab + 2] = f32::NAN;
        }
        let row = &logits[n_vocab..];
        let mut ids: Vec<usize> = (0..n_vocab).filter(|&i| !row[i].is_nan()).collect();
        ids.sort_by(|&a, &c| row[c].total_cmp(&row[a]).then(a.cmp(&c)));
        let want: Vec<f64> = ids[..k]
            .iter()
            .flat_map(|&i| [i as f64, f64::from(row[i])])
            .collect();
        let got = (|| {
            let lb = buf(b, &logits)?;
            let mut cand = vec![(0u32, 0.0f32); k];
            b.top_k(&lb, 1, n_vocab, &mut cand)?;
            Ok(cand.iter().flat_map(|&(i, v)| [i as f32, v]).collect())
        })();
        let bound = vec![0.0; want.len()];
        out.compare(
            format!("row 1 of 2, vocab {n_vocab}"),
            got,
            &want,
            &bound,
            "exact ids and values",
        );
    }
}
