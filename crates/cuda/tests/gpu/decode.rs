//! The decode-step kernels of `src/decode.rs`: split attention with its merge and int8
//! quantization in one launch, the gated product that quantizes its own output, and the
//! Q/K/V product over weights of different types.
//!
//! Bounds: attention within 1e-5 of the f64 reference on f16-rounded keys and values (the
//! general kernel's bound), at positions on both sides of every split and tile boundary;
//! the int8 copies bit-identical to the quantizer's definition applied to the f32 output
//! they come with; every launch repeated on the same buffers (output cleared in between)
//! gives the same bits, so the split counters come back to zero. Products as in
//! kernels_i8.rs: 1e-5 of the f64 product with the rounded activations the kernel read.

use ferrite_cuda::AttnShape;
use ferrite_gguf::GgmlType;
use ferrite_model::Activation;

use crate::kernels::{naive_attention, quantized};
use crate::kernels_i8::{activations, naive_matvec64, quantize_ref};
use crate::{assert_close, backend, pseudo};

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn decode_attention_matches_naive_and_quantizes_its_output() {
    let Some(b) = backend() else { return };
    // (heads, KV heads, head_dim, window, positions): the decode kernel's head sizes and
    // group widths (1..8), a sliding window shorter and longer than the context, and two
    // shapes it does not cover (the fallback path).
    let cases = [
        (9, 3, 64, None, vec![1, 31, 33, 128, 129, 257, 700]),
        (32, 8, 128, None, vec![1, 32, 127, 128, 129, 1000, 4100]),
        (4, 1, 256, Some(4), vec![1, 5, 300]),
        (4, 1, 256, Some(200), vec![199, 200, 201, 777]),
        (8, 1, 128, None, vec![2, 385]),
        (16, 2, 64, None, vec![513]),
        (2, 2, 32, None, vec![1, 300]),
        (16, 1, 64, None, vec![1, 300]),
    ];
    for (nh, nkv, hd, window, ns) in cases {
        let shape = AttnShape::new(nh, nkv, hd, 1.0 / (hd as f32).sqrt(), window).unwrap();
        for n in ns {
            let k = pseudo(n * shape.kv_dim(), 2);
            let v = pseudo(n * shape.kv_dim(), 3);
            let q: Vec<f32> = pseudo(nh * hd, 1).iter().map(|v| v * 3.0).collect();
            let want = naive_attention(&shape, &q, &k, &v);
            for (splits, planes) in [(1, 2), (3, 0), (128, 1), (128, 2)] {
                let what = format!(
                    "decode attention {nh}/{nkv}x{hd} {window:?} n={n} splits {splits} planes {planes}"
                );
                let runs = b
                    .decode_attention_host(&shape, &q, &k, &v, splits, planes, 2)
                    .unwrap();
                let (got, q8) = &runs[0];
                assert_close(&what, got, &want, 1e-5);
                if planes > 0 {
                    let q8 = q8.as_ref().unwrap();
                    assert_eq!(*q8, quantize_ref(got, planes), "{what}: int8 copy");
                }
                assert_eq!(bits(got), bits(&runs[1].0), "{what}: second launch");
                assert_eq!(*q8, runs[1].1, "{what}: second int8 copy");
            }
        }
    }
    let counts = b.launch_counts();
    for k in [
        "attn_decode_f16_64",
        "attn_decode_f16_128",
        "attn_decode_f16_256",
        "attn_f16",
    ] {
        assert!(counts[k] > 0, "{k} never ran");
    }
}

#[test]
fn gated_matvec_quantizes_its_output_in_the_same_launch() {
    let Some(b) = backend() else { return };
    for (planes, ty) in [1, 2]
        .into_iter()
        .flat_map(|p| [GgmlType::Q4_1, GgmlType::Q4_K, GgmlType::Q6_K].map(|t| (p, t)))
    {
        let cols = if ty == GgmlType::Q4_1 { 96 } else { 512 };
        // One group of 32 rows, several, and row counts where warps take two rows each.
        for rows in [32, 96, 2048, 4096 + 32] {
            let (qg, _) = quantized(ty, rows, cols, 31);
            let (qu, _) = quantized(ty, rows, cols, 32);
            let x = activations(cols, 33);
            let what = format!("int8x{planes} gated+quantize {ty} {rows}x{cols}");
            let (plain, _) = b
                .gated_matvec_i8_host(Activation::Silu, ty, planes, &qg, &qu, rows, cols, &x)
                .unwrap();
            let runs = b
                .gated_matvec_i8_q_host(Activation::Silu, ty, planes, &qg, &qu, rows, cols, &x, 2)
                .unwrap();
            for (i, (y, yq)) in runs.iter().enumerate() {
                assert!(y.iter().all(|v| v.is_finite()), "{what}: non-finite");
                assert_eq!(bits(y), bits(&plain), "{what} run {i}: output");
                assert_eq!(*yq, quantize_ref(y, planes), "{what} run {i}: int8 copy");
            }
        }
    }
}

#[test]
fn qkv_product_over_mixed_types_matches_rounded_product() {
    let Some(b) = backend() else { return };
    let (q4k, q6k, q41, q80) = (
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::Q4_1,
        GgmlType::Q8_0,
    );
    let cases: [(&[(GgmlType, usize)], usize); 4] = [
        (&[(q4k, 4096), (q4k, 1024), (q6k, 1024)], 4096),
        (&[(q4k, 576), (q4k, 192), (q6k, 192)], 256),
        (&[(q41, 33), (q80, 7), (q6k, 1)], 512),
        (&[(q6k, 65), (q4k, 3)], 768),
    ];
    for planes in [1, 2] {
        for (mats, cols) in cases {
            let data: Vec<(Vec<u8>, Vec<f32>)> = mats
                .iter()
                .enumerate()
                .map(|(i, &(ty, rows))| quantized(ty, rows, cols, 40 + i as u64))
                .collect();
            let arg: Vec<(GgmlType, &[u8], usize)> = mats
                .iter()
                .zip(&data)
                .map(|(&(ty, rows), (q, _))| (ty, q.as_slice(), rows))
                .collect();
            let x = activations(cols, 41);
            let (ys, qa) = b.matvec_multi_i8_host(&arg, planes, cols, &x).unwrap();
            assert_eq!(qa, quantize_ref(&x, planes));
            for ((&(ty, rows), (_, deq)), y) in mats.iter().zip(&data).zip(&ys) {
                let want = naive_matvec64(deq, rows, cols, &qa.values());
                assert_close(
                    &format!("int8x{planes} mixed Q/K/V {ty} {rows}x{cols}"),
                    y,
                    &want,
                    1e-5,
                );
            }
        }
    }
    assert!(b.launch_counts()["matvec3_i8_mixed"] > 0);
}
