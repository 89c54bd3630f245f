//! Each kernel against a CPU reference (ferrite_quant::dequantize plus naive f64 loops) on
//! boundary shapes: one row, odd block counts, rows not a multiple of the warp tiling,
//! more units per row than lanes.

use ferrite_cuda::AttnShape;
use ferrite_gguf::GgmlType;
use ferrite_model::Activation;
use ferrite_model::ops::RopeStyle;

use crate::{assert_close, backend, err_tuple, pseudo};

const TYPES: [GgmlType; 9] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q8_0,
    GgmlType::Q5_0,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
];

pub fn quantized(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> (Vec<u8>, Vec<f32>) {
    let v = pseudo(rows * cols, seed);
    let mut q = vec![0u8; ty.row_bytes((rows * cols) as u64).unwrap() as usize];
    ferrite_quant::quantize(ty, &v, &mut q).unwrap();
    let mut deq = vec![0f32; rows * cols];
    ferrite_quant::dequantize(ty, &q, &mut deq).unwrap();
    (q, deq)
}

pub fn naive_matvec(w: &[f32], rows: usize, cols: usize, x: &[f32]) -> Vec<f64> {
    (0..rows)
        .map(|r| {
            (0..cols)
                .map(|c| f64::from(w[r * cols + c]) * f64::from(x[c]))
                .sum()
        })
        .collect()
}

pub fn shapes(ty: GgmlType) -> Vec<(usize, usize)> {
    let k = matches!(ty, GgmlType::Q4_K | GgmlType::Q6_K);
    let cols: &[usize] = if k {
        &[256, 768, 2304, 4096, 9216]
    } else {
        &[32, 96, 576, 1056, 2080]
    };
    let mut v = Vec::new();
    for &c in cols {
        for r in [1, 7, 33, 130] {
            v.push((r, c));
        }
    }
    // Past MULTI_ROW_FROM (two, then four rows per warp), not a multiple of the rows per
    // block; the wide shapes above with few rows split each row over 2 or 4 warps.
    v.push((2053, cols[1]));
    v.push((8195, cols[0]));
    v
}

#[test]
fn matvec_matches_dequantized_cpu_product() {
    let Some(b) = backend() else { return };
    for ty in TYPES {
        for (rows, cols) in shapes(ty) {
            let (q, deq) = quantized(ty, rows, cols, (rows * 31 + cols) as u64);
            let x = pseudo(cols, 7);
            let got = b.matvec_host(ty, &q, rows, cols, &x).unwrap();
            let want = naive_matvec(&deq, rows, cols, &x);
            let e = err_tuple(&got, &want);
            println!("matvec {ty} {rows}x{cols}: {e:?}");
            assert_close(&format!("matvec {ty} {rows}x{cols}"), &got, &want, 1e-5);
        }
    }
    let counts = b.launch_counts();
    for s in [
        "q4_0", "q4_1", "q8_0", "q5_0", "q4_k", "q6_k", "f32", "f16", "bf16",
    ] {
        assert!(
            counts[format!("matvec_{s}").as_str()] > 0,
            "matvec_{s} never ran"
        );
    }
}

#[test]
fn matvec_check_catches_a_flipped_nibble() {
    // Test of the test: one changed Q4_K nibble must push the comparison past its bound.
    let Some(b) = backend() else { return };
    let (rows, cols) = (3, 512);
    let (mut q, deq) = quantized(GgmlType::Q4_K, rows, cols, 99);
    let x = vec![1.0f32; cols];
    let byte = 144 + 16 + 5; // second block of row 0, a quant byte
    q[byte] ^= 0x0f;
    let got = b.matvec_host(GgmlType::Q4_K, &q, rows, cols, &x).unwrap();
    let want = naive_matvec(&deq, rows, cols, &x);
    let e = err_tuple(&got, &want);
    assert!(e.max_rel > 1e-5, "mutation not detected: {e:?}");
}

#[test]
fn embed_matches_dequantized_row() {
    let Some(b) = backend() else { return };
    for ty in TYPES {
        let (rows, cols) = (
            37,
            if matches!(ty, GgmlType::Q4_K | GgmlType::Q6_K) {
                768
            } else {
                576
            },
        );
        let (q, deq) = quantized(ty, rows, cols, 5);
        for tok in [0u32, 17, 36] {
            let got = b.embed_host(ty, &q, rows, cols, tok, 2.5).unwrap();
            let want: Vec<f64> = deq[tok as usize * cols..(tok as usize + 1) * cols]
                .iter()
                .map(|&v| f64::from(v) * 2.5)
                .collect();
            assert_close(&format!("embed {ty} row {tok}"), &got, &want, 1e-6);
        }
        assert!(
            b.embed_host(ty, &q, rows, cols, 37, 1.0).is_err(),
            "token out of range"
        );
    }
}

#[test]
fn rms_norm_matches_f64() {
    let Some(b) = backend() else { return };
    for (rows, dim) in [(1, 576), (9, 64), (4, 1000), (1, 7)] {
        let x = pseudo(rows * dim, 3);
        let w = pseudo(dim, 4);
        let got = b.rms_norm_host(&x, &w, 1e-6).unwrap();
        let mut want = vec![0f64; rows * dim];
        for r in 0..rows {
            let row = &x[r * dim..(r + 1) * dim];
            let ms = row.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / dim as f64;
            let inv = 1.0 / (ms + 1e-6).sqrt();
            for c in 0..dim {
                want[r * dim + c] = f64::from(row[c]) * inv * f64::from(w[c]);
            }
        }
        assert_close(&format!("rms_norm {rows}x{dim}"), &got, &want, 1e-5);
    }
}

#[test]
fn rope_matches_cpu_for_both_layouts() {
    let Some(b) = backend() else { return };
    for style in [RopeStyle::Interleaved, RopeStyle::HalfSplit] {
        for (heads, hd, pos, base) in [
            (9, 64, 0, 1e4),
            (3, 64, 7, 1e4),
            (4, 256, 5000, 1e6),
            (1, 2, 31, 1e4),
        ] {
            let x = pseudo(heads * hd, 11);
            let got = b.rope_host(&x, hd, pos, base, style).unwrap();
            let mut cpu = x.clone();
            ferrite_model::ops::rope(&mut cpu, hd, pos, base, style);
            let want: Vec<f64> = cpu.iter().map(|&v| f64::from(v)).collect();
            assert_close(
                &format!("rope {style:?} {heads}x{hd} @{pos}"),
                &got,
                &want,
                1e-5,
            );
        }
    }
}

#[test]
fn gated_activations_and_add_match_cpu() {
    let Some(b) = backend() else { return };
    let n = 1537;
    let g: Vec<f32> = pseudo(n, 1).iter().map(|v| v * 6.0).collect();
    let u = pseudo(n, 2);
    for (act, f) in [
        (Activation::Silu, ferrite_model::ops::silu as fn(f32) -> f32),
        (Activation::GeluTanh, ferrite_model::ops::gelu_tanh),
    ] {
        let got = b.gated_host(act, &g, &u).unwrap();
        let want: Vec<f64> = g
            .iter()
            .zip(&u)
            .map(|(&a, &c)| f64::from(f(a) * c))
            .collect();
        assert_close(&format!("gated {act:?}"), &got, &want, 1e-5);
    }
    let got = b.add_host(&g, &u).unwrap();
    let want: Vec<f64> = g
        .iter()
        .zip(&u)
        .map(|(&a, &c)| f64::from(a) + f64::from(c))
        .collect();
    assert_close("add", &got, &want, 1e-6);
}

/// Attention of the `q.len() / (n_head × head_dim)` queries at the last positions, scores
/// soft-capped at `shape.softcap`, each head's `sinks` logit (if any) in its denominator;
/// values from `v`, or from inside the keys when `shape` reads them there (`v` unused).
pub fn naive_attention(
    shape: &AttnShape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    sinks: Option<&[f32]>,
) -> Vec<f64> {
    let hd = shape.head_dim;
    let kvd = shape.kv_dim();
    let n = k.len() / kvd;
    let qdim = shape.n_head * hd;
    let nq = q.len() / qdim;
    let h16 = |x: f32| f64::from(half::f16::from_f32(x).to_f32());
    let (v, v_at) = match shape.values_in_keys {
        Some((at, _)) => (k, at),
        None => (v, 0),
    };
    let vd = shape.v_dim();
    let mut out = vec![0f64; nq * shape.n_head * vd];
    for qi in 0..nq {
        let pos = n - nq + qi;
        for h in 0..shape.n_head {
            let g = h / (shape.n_head / shape.n_kv_head);
            let vis: Vec<usize> = (0..=pos)
                .filter(|&j| shape.window.is_none_or(|w| pos - j < w))
                .collect();
            let s: Vec<f64> = vis
                .iter()
                .map(|&j| {
                    (0..hd)
                        .map(|d| {
                            f64::from(q[qi * qdim + h * hd + d]) * h16(k[j * kvd + g * hd + d])
                        })
                        .sum::<f64>()
                        * f64::from(shape.scale)
                })
                .map(|x| {
                    shape
                        .softcap
                        .map_or(x, |c| f64::from(c) * (x / f64::from(c)).tanh())
                })
                .collect();
            let sink = sinks.map(|s| f64::from(s[h]));
            let m = s
                .iter()
                .copied()
                .chain(sink)
                .fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = s.iter().chain(&sink).map(|x| (x - m).exp()).sum();
            for (i, &j) in vis.iter().enumerate() {
                let p = (s[i] - m).exp() / z;
                for d in 0..vd {
                    out[(qi * shape.n_head + h) * vd + d] +=
                        p * h16(v[j * kvd + g * hd + v_at + d]);
                }
            }
        }
    }
    out
}

#[test]
fn attention_matches_naive_with_causal_and_window_masks() {
    let Some(b) = backend() else { return };
    let cases = [
        (9, 3, 64, None, 1),
        (9, 3, 64, None, 37),
        (4, 1, 256, Some(4), 1),
        (4, 1, 256, Some(4), 11),
        (4, 1, 256, Some(512), 700),
        (2, 2, 32, None, 300),
        (32, 8, 128, None, 1000),
    ];
    for (nh, nkv, hd, window, n) in cases {
        let shape = AttnShape::new(nh, nkv, hd, 1.0 / (hd as f32).sqrt(), window).unwrap();
        let k = pseudo(n * shape.kv_dim(), 2);
        let v = pseudo(n * shape.kv_dim(), 3);
        // Decode (one query, keys in 1, 3 or 64 splits) and prefill (many queries, causal).
        for (nq, splits) in [(1, 1), (1, 3), (1, 64), (n.min(45), 1), (n, 1)] {
            let q: Vec<f32> = pseudo(nq * nh * hd, 1).iter().map(|v| v * 3.0).collect();
            let got = b.attention_host(&shape, &q, &k, &v, splits, None).unwrap();
            let want = naive_attention(&shape, &q, &k, &v, None);
            assert_close(
                &format!("attention {nh}/{nkv}x{hd} {window:?} n={n} queries {nq} splits {splits}"),
                &got,
                &want,
                1e-5,
            );
        }
    }
    let counts = b.launch_counts();
    for k in ["attn_f16", "attn_combine", "kv_store_f16"] {
        assert!(counts[k] > 0, "{k} never ran");
    }
}

/// Soft-capped scores (Gemma 2) and sink logits (gpt-oss) on every attention path: the
/// decode kernel with its own merge (head sizes 64 and 256, one split and many), the
/// general kernel with its merge launch (head size 32, and decode and prefill queries),
/// within the same 1e-5 of the naive f64 reference as plain attention. The sinks range
/// from below the scores to far above them, where each head's output shrinks toward zero:
/// a sink left out, or folded into every split's partial instead of once, misses that.
#[test]
fn soft_caps_and_sinks_match_naive_on_every_path() {
    let Some(b) = backend() else { return };
    for (nh, nkv, hd, window, n) in [
        (4, 2, 64, None, 300),
        (4, 1, 256, Some(40), 130),
        (4, 2, 32, None, 200),
    ] {
        let sinks: Vec<f32> = (0..nh).map(|h| [-2.0, 0.5, 3.0, 8.0][h % 4]).collect();
        for (cap, sink) in [
            (Some(1.5), None),
            (None, Some(&sinks[..])),
            (Some(1.5), Some(&sinks[..])),
        ] {
            let shape = AttnShape::new(nh, nkv, hd, 1.0 / (hd as f32).sqrt(), window)
                .unwrap()
                .with_softcap(cap);
            let k = pseudo(n * shape.kv_dim(), 2);
            let v = pseudo(n * shape.kv_dim(), 3);
            for (nq, splits) in [(1, 1), (1, 3), (1, 64), (45, 1), (45, 3)] {
                let q: Vec<f32> = pseudo(nq * nh * hd, 1).iter().map(|v| v * 3.0).collect();
                let want = naive_attention(&shape, &q, &k, &v, sink);
                let what = format!(
                    "{nh}/{nkv}x{hd} {window:?} n={n} cap {cap:?} sinks {} queries {nq} splits {splits}",
                    sink.is_some()
                );
                let got = b.attention_host(&shape, &q, &k, &v, splits, sink).unwrap();
                assert_close(&format!("attention {what}"), &got, &want, 1e-5);
                if nq == 1 {
                    let runs = b
                        .decode_attention_host(&shape, &q, &k, &v, splits, 0, 1, sink)
                        .unwrap();
                    assert_close(&format!("decode attention {what}"), &runs[0].0, &want, 1e-5);
                }
            }
        }
    }
    let counts = b.launch_counts();
    for k in [
        "attn_decode_f16_64",
        "attn_decode_f16_256",
        "attn_f16",
        "attn_combine",
    ] {
        assert!(counts[k] > 0, "{k} never ran");
    }
}

/// MLA's latent attention: values read from inside the key rows (after the rope part),
/// fewer values than key values per head, on the general kernel and its merge (decode
/// queries with one split and many, prefill queries). DeepSeek's 16 heads of 64 + 512
/// over one latent take more query heads than one block holds, so they run four heads a
/// block; one case has two key heads, so each group's values come from its own key head.
#[test]
fn values_in_the_keys_match_naive_on_every_path() {
    let Some(b) = backend() else { return };
    for (nh, nkv, hd, (at, dim), window, n) in [
        (16, 1, 576, (64, 512), None, 300),
        (4, 1, 40, (8, 32), Some(50), 130),
        (8, 2, 64, (16, 40), None, 200),
    ] {
        let shape = AttnShape::new(nh, nkv, hd, 1.0 / (hd as f32).sqrt(), window)
            .unwrap()
            .with_values_in_keys(at, dim)
            .unwrap();
        let k = pseudo(n * shape.kv_dim(), 2);
        for (nq, splits) in [(1, 1), (1, 3), (1, 64), (45, 1), (45, 3)] {
            let q: Vec<f32> = pseudo(nq * nh * hd, 1).iter().map(|v| v * 3.0).collect();
            let want = naive_attention(&shape, &q, &k, &[], None);
            assert_eq!(want.len(), nq * nh * dim);
            let what = format!(
                "{nh}/{nkv}x{hd} values {at}..+{dim} {window:?} n={n} queries {nq} splits {splits}"
            );
            let got = b.attention_host(&shape, &q, &k, &[], splits, None).unwrap();
            assert_close(&format!("attention {what}"), &got, &want, 1e-5);
        }
    }
    assert!(
        AttnShape::new(4, 1, 40, 1.0, None)
            .unwrap()
            .with_values_in_keys(16, 32)
            .is_err(),
        "values past the key head"
    );
}

#[test]
fn prefill_matmul_matches_f16_rounded_product() {
    let Some(b) = backend() else { return };
    let h16 = |x: f32| half::f16::from_f32(x).to_f32();
    for ty in TYPES {
        for (rows, cols) in shapes(ty).into_iter().filter(|&(r, _)| r != 1) {
            let (q, deq) = quantized(ty, rows, cols, 41);
            let w16: Vec<f32> = deq.iter().map(|&v| h16(v)).collect();
            for n in [1, 5, 33] {
                let x = pseudo(n * cols, 42);
                let got = b.matmul_host(ty, &q, rows, cols, &x).unwrap();
                let mut want = Vec::with_capacity(n * rows);
                for t in 0..n {
                    let xt: Vec<f32> = x[t * cols..(t + 1) * cols]
                        .iter()
                        .map(|&v| h16(v))
                        .collect();
                    want.extend(naive_matvec(&w16, rows, cols, &xt));
                }
                assert_close(
                    &format!("matmul {ty} {rows}x{cols} n={n}"),
                    &got,
                    &want,
                    1e-4,
                );
            }
        }
    }
    assert!(b.launch_counts()["gemm_f16"] > 0, "cuBLAS never ran");
}

#[test]
fn fused_gated_matvec_matches_cpu() {
    let Some(b) = backend() else { return };
    for ty in TYPES {
        let cols = if matches!(ty, GgmlType::Q4_K | GgmlType::Q6_K) {
            768
        } else {
            96
        };
        for rows in [1, 33, 2049] {
            let (qg, dg) = quantized(ty, rows, cols, 21);
            let (qu, du) = quantized(ty, rows, cols, 22);
            let x = pseudo(cols, 23);
            let g = naive_matvec(&dg, rows, cols, &x);
            let u = naive_matvec(&du, rows, cols, &x);
            for (act, f) in [
                (Activation::Silu, ferrite_model::ops::silu as fn(f32) -> f32),
                (Activation::GeluTanh, ferrite_model::ops::gelu_tanh),
            ] {
                let got = b
                    .gated_matvec_host(act, ty, &qg, &qu, rows, cols, &x)
                    .unwrap();
                let want: Vec<f64> = g
                    .iter()
                    .zip(&u)
                    .map(|(&a, &c)| f64::from(f(a as f32)) * c)
                    .collect();
                assert_close(
                    &format!("gated matvec {ty} {act:?} {rows}x{cols}"),
                    &got,
                    &want,
                    1e-5,
                );
            }
        }
    }
}

#[test]
fn fused_residual_norm_matches_cpu() {
    let Some(b) = backend() else { return };
    for dim in [7, 576, 2049] {
        let x = pseudo(dim, 31);
        let o = pseudo(dim, 32);
        let post = pseudo(dim, 33);
        let next = pseudo(dim, 34);
        for with_post in [false, true] {
            let p = with_post.then_some(post.as_slice());
            let (gx, gxn) = b.residual_norm_host(&x, &o, p, &next, 1e-6).unwrap();
            let mut oo = o.clone();
            if with_post {
                ferrite_model::ops::rms_norm(&mut oo, &post, 1e-6);
            }
            let mut cx = x.clone();
            ferrite_model::ops::add_assign(&mut cx, &oo);
            let mut cxn = cx.clone();
            ferrite_model::ops::rms_norm(&mut cxn, &next, 1e-6);
            let f = |v: &[f32]| v.iter().map(|&a| f64::from(a)).collect::<Vec<_>>();
            assert_close(&format!("residual x {dim} {with_post}"), &gx, &f(&cx), 1e-5);
            assert_close(
                &format!("residual xn {dim} {with_post}"),
                &gxn,
                &f(&cxn),
                1e-5,
            );
        }
    }
}
