//! The int8-activation decode products (matvec_i8.cu), in one and two planes, and the
//! activation quantizer.
//!
//! Bounds: the quantizer is checked bit for bit against its definition (d = max|x|/127 per
//! block of 32, q = x/d rounded half to even; with two planes q2 = (x − d·q)/(d/256)
//! rounded likewise; d·Σ(q + q2/256)). The products are checked two ways: against the f64
//! product of the dequantized weights with the rounded activations `d·(q + q2/256)` the
//! kernel read (what it computes up to f32 rounding: max rel 1e-5, as the f32 kernels), and
//! against the exact product with the f32 activations, where each row must lie within the
//! rounding bound Σ_blocks e_b·Σ|w| (e = d/2 with one plane, d/256 with two: the largest
//! rounding error of a value) plus 1e-5 of the largest |y|; the bound holds for any x, the
//! measured error is printed.

use ferrite_cuda::QuantizedAct;
use ferrite_gguf::GgmlType;
use ferrite_model::Activation;

use crate::kernels::{naive_matvec, quantized, shapes};
use crate::{assert_close, backend, err_tuple, pseudo};

pub const TYPES_I8: [GgmlType; 4] = [
    GgmlType::Q4_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
];

/// Activations with the cases the quantizer must get right: an all-zero block, a block with
/// one large outlier, a negative extreme and a spread of magnitudes.
pub fn activations(n: usize, seed: u64) -> Vec<f32> {
    let mut x: Vec<f32> = pseudo(n, seed)
        .iter()
        .enumerate()
        .map(|(i, v)| v * (1.0 + (i % 97) as f32 / 8.0))
        .collect();
    x[..32.min(n)].fill(0.0);
    if n >= 96 {
        x[40] = 250.0;
        x[70] = -3.0e-3;
        x[64..96].iter_mut().for_each(|v| *v *= 1e-3);
    }
    x
}

/// `v / step` rounded half to even into -127..=127 (0 for a zero step).
fn round8(v: f32, step: f32) -> i8 {
    if step > 0.0 {
        (v / step).round_ties_even().clamp(-127.0, 127.0) as i8
    } else {
        0
    }
}

/// The quantizer's definition, computed on the host in f32 as the kernel does.
pub fn quantize_ref(x: &[f32], planes: usize) -> QuantizedAct {
    let (mut q, mut q2, mut ds) = (Vec::new(), Vec::new(), Vec::new());
    for b in x.chunks(32) {
        let amax = b.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let qb: Vec<i8> = b.iter().map(|&v| round8(v, d)).collect();
        let mut s = qb.iter().map(|&v| i32::from(v)).sum::<i32>() as f32;
        if planes > 1 {
            let lo: Vec<i8> = b
                .iter()
                .zip(&qb)
                .map(|(&v, &h)| round8((-d).mul_add(f32::from(h), v), d * (1.0 / 256.0)))
                .collect();
            s += lo.iter().map(|&v| i32::from(v)).sum::<i32>() as f32 * (1.0 / 256.0);
            q2.extend(lo);
        }
        ds.push((d, d * s));
        q.extend(qb);
    }
    QuantizedAct { q, q2, ds }
}

pub fn naive_matvec64(w: &[f32], rows: usize, cols: usize, x: &[f64]) -> Vec<f64> {
    (0..rows)
        .map(|r| (0..cols).map(|c| f64::from(w[r * cols + c]) * x[c]).sum())
        .collect()
}

/// Per row: |y − W·x| ≤ Σ_b e_b·Σ_{i∈b}|w_i| + slack, e_b the block's largest rounding
/// error (d/2 with one plane, d/256 with two).
fn within_rounding_bound(what: &str, y: &[f32], exact: &[f64], deq: &[f32], q: &QuantizedAct) {
    let cols = q.q.len();
    let step = if q.q2.is_empty() { 0.5 } else { 1.0 / 256.0 };
    let slack = 1e-5 * exact.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    for (r, (&g, &e)) in y.iter().zip(exact).enumerate() {
        let row = &deq[r * cols..(r + 1) * cols];
        let bound: f64 = row
            .chunks(32)
            .zip(&q.ds)
            .map(|(wb, &(d, _))| {
                f64::from(d) * step * wb.iter().map(|w| f64::from(w.abs())).sum::<f64>()
            })
            .sum();
        let err = (f64::from(g) - e).abs();
        assert!(
            err <= bound * (1.0 + 1e-6) + slack,
            "{what} row {r}: |Δ| {err:e} above the rounding bound {bound:e}"
        );
    }
}

#[test]
fn quantizer_matches_its_definition_bit_for_bit() {
    let Some(b) = backend() else { return };
    let bits = |v: &[(f32, f32)]| {
        v.iter()
            .map(|(a, c)| (a.to_bits(), c.to_bits()))
            .collect::<Vec<_>>()
    };
    for planes in [1, 2] {
        for n in [32, 96, 576, 4096, 14336] {
            let x = activations(n, n as u64);
            let got = b.quantize_act_host(&x, planes).unwrap();
            let want = quantize_ref(&x, planes);
            assert_eq!(got.q, want.q, "q of {n} values, {planes} planes");
            assert_eq!(got.q2, want.q2, "q2 of {n} values, {planes} planes");
            assert_eq!(
                bits(&got.ds),
                bits(&want.ds),
                "scales and sums of {n} values"
            );
        }
        // The fused copy written by the sub-layer end is the same quantization of its xn.
        for dim in [64, 576, 2048] {
            let (x, o, w) = (pseudo(dim, 1), pseudo(dim, 2), pseudo(dim, 3));
            let (xn, q) = b.residual_norm_q8_host(&x, &o, &w, 1e-6, planes).unwrap();
            assert_eq!(
                q,
                quantize_ref(&xn, planes),
                "residual_norm int8 copy of {dim}"
            );
        }
    }
}

#[test]
fn int8_matvec_matches_rounded_product_and_rounding_bound() {
    let Some(b) = backend() else { return };
    for planes in [1, 2] {
        for ty in TYPES_I8 {
            let mut worst = 0.0f64;
            for (rows, cols) in shapes(ty) {
                let what = format!("int8x{planes} matvec {ty} {rows}x{cols}");
                let (q, deq) = quantized(ty, rows, cols, (rows * 17 + cols) as u64);
                let x = activations(cols, 9);
                let (got, qa) = b.matvec_i8_host(ty, planes, &q, rows, cols, &x).unwrap();
                assert_eq!(qa, quantize_ref(&x, planes), "{what}: quantized x");
                let tight = naive_matvec64(&deq, rows, cols, &qa.values());
                assert_close(&what, &got, &tight, 1e-5);
                let exact = naive_matvec(&deq, rows, cols, &x);
                within_rounding_bound(&what, &got, &exact, &deq, &qa);
                let e = err_tuple(&got, &exact);
                worst = worst.max(e.max_rel);
                println!(
                    "{what}: vs rounded x max_rel {:.2e}; vs f32 x max_rel {:.2e} cos {:.10}",
                    err_tuple(&got, &tight).max_rel,
                    e.max_rel,
                    e.cosine
                );
            }
            println!("int8x{planes} matvec {ty}: worst max_rel vs the f32-x product {worst:.2e}");
        }
    }
    let counts = b.launch_counts();
    for s in ["q4_1", "q8_0", "q4_k", "q6_k"] {
        for k in [format!("matvec_i8_{s}"), format!("matvec_i8x2_{s}")] {
            assert!(counts[k.as_str()] > 0, "{k} never ran");
        }
    }
    assert!(counts["quantize_q8_f32"] > 0);
}

#[test]
fn int8_gated_matvec_matches_rounded_product() {
    let Some(b) = backend() else { return };
    for (planes, ty) in [1, 2].into_iter().flat_map(|p| TYPES_I8.map(|t| (p, t))) {
        let cols = if matches!(ty, GgmlType::Q4_K | GgmlType::Q6_K) {
            768
        } else {
            96
        };
        for rows in [1, 33, 2049] {
            let (qg, dg) = quantized(ty, rows, cols, 21);
            let (qu, du) = quantized(ty, rows, cols, 22);
            let x = activations(cols, 23);
            for (act, f) in [
                (Activation::Silu, ferrite_model::ops::silu as fn(f32) -> f32),
                (Activation::GeluTanh, ferrite_model::ops::gelu_tanh),
            ] {
                let (got, qa) = b
                    .gated_matvec_i8_host(act, ty, planes, &qg, &qu, rows, cols, &x)
                    .unwrap();
                let xr = qa.values();
                let g = naive_matvec64(&dg, rows, cols, &xr);
                let u = naive_matvec64(&du, rows, cols, &xr);
                let want: Vec<f64> = g
                    .iter()
                    .zip(&u)
                    .map(|(&a, &c)| f64::from(f(a as f32)) * c)
                    .collect();
                assert_close(
                    &format!("int8x{planes} gated matvec {ty} {act:?} {rows}x{cols}"),
                    &got,
                    &want,
                    1e-5,
                );
            }
        }
    }
    for s in ["q4_1", "q8_0", "q4_k", "q6_k"] {
        for k in [
            format!("matvec_gated_i8_{s}"),
            format!("matvec_gated_i8x2_{s}"),
        ] {
            assert!(b.launch_counts()[k.as_str()] > 0, "{k} never ran");
        }
    }
}
