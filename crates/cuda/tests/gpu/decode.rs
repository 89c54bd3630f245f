//! Decode attention (`src/decode.rs`): the split-merging kernel for the head sizes it
//! covers, the general kernel with its merge launch for the others, both quantizing their
//! output to int8 in the merge. (Whole models run the decode kernel in every decode step
//! of model.rs's comparisons with the CPU backend.)
//!
//! Bounds: attention within 1e-5 of the f64 reference on f16-rounded keys and values (the
//! general kernel's bound), at positions on both sides of every split and tile boundary;
//! the int8 copies bit-identical to the quantizer's definition applied to the f32 output
//! they come with; every launch repeated on the same buffers (output cleared in between)
//! gives the same bits, so the split counters come back to zero.

use ferrite_cuda::AttnShape;

use crate::kernels::naive_attention;
use crate::kernels_i8::quantize_ref;
use crate::{assert_close, backend, pseudo};

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn decode_attention_matches_naive_and_quantizes_its_output() {
    let Some(b) = backend() else { return };
    // (heads, KV heads, head_dim, window, positions): the decode kernel's head sizes and
    // group widths (1..16), a sliding window shorter and longer than the context, and a
    // head size it does not cover (the fallback path).
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
            let want = naive_attention(&shape, &q, &k, &v, None);
            for (splits, planes) in [1, 3, 128]
                .into_iter()
                .flat_map(|sp| [(sp, 0), (sp, 1), (sp, 2)])
            {
                let what = format!(
                    "decode attention {nh}/{nkv}x{hd} {window:?} n={n} splits {splits} planes {planes}"
                );
                let runs = b
                    .decode_attention_host(&shape, &q, &k, &v, splits, planes, 2, None)
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
        "attn_combine",
    ] {
        assert!(counts[k] > 0, "{k} never ran");
    }
}
