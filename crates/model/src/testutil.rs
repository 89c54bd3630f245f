//! Tiny synthetic models for unit tests: a llama-like and a gemma3-like GGUF built in memory
//! with pseudo-random weights, small enough that the naive reference runs in milliseconds.

use ferrite_gguf::{GgmlType, Gguf, GgufWriter, Value};

use crate::{LoadOptions, Model, Precision};

/// Deterministic values in [-1, 1).
pub(crate) fn pseudo(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

pub(crate) const VOCAB: usize = 97;

/// Builds the GGUF bytes of a tiny model. `skip_key` / `skip_tensor` leave one entry out.
pub(crate) fn tiny_gguf(arch: &str, wty: GgmlType, skip_key: &str, skip_tensor: &str) -> Vec<u8> {
    let gemma = arch == "gemma3";
    let (d, n_head, n_kv, hd, ff) = if gemma {
        (64, 4, 1, 32, 128)
    } else {
        (64, 4, 2, 16, 128)
    };
    let n_layer = if gemma { 6 } else { 2 };
    let mut meta: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(arch.into())),
        (format!("{arch}.block_count"), Value::U32(n_layer)),
        (format!("{arch}.context_length"), Value::U32(2048)),
        (format!("{arch}.embedding_length"), Value::U32(d as u32)),
        (format!("{arch}.feed_forward_length"), Value::U32(ff as u32)),
        (
            format!("{arch}.attention.head_count"),
            Value::U32(n_head as u32),
        ),
        (
            format!("{arch}.attention.head_count_kv"),
            Value::U32(n_kv as u32),
        ),
        (
            format!("{arch}.attention.layer_norm_rms_epsilon"),
            Value::F32(1e-5),
        ),
        (
            format!("{arch}.rope.freq_base"),
            Value::F32(if gemma { 1e6 } else { 1e4 }),
        ),
    ];
    if gemma {
        meta.push((
            format!("{arch}.attention.key_length"),
            Value::U32(hd as u32),
        ));
        meta.push((
            format!("{arch}.attention.value_length"),
            Value::U32(hd as u32),
        ));
        meta.push((format!("{arch}.attention.sliding_window"), Value::U32(4)));
    }
    let mut w = GgufWriter::new();
    for (k, v) in meta {
        if k != skip_key {
            w.add_metadata(k, v).expect("metadata");
        }
    }
    let mut seed = 1;
    let mut tensors: Vec<(String, GgmlType, Vec<u64>, Vec<u8>)> = Vec::new();
    let mut add_matrix = |name: String, rows: usize, cols: usize, seed: &mut u64| {
        *seed += 1;
        let scale = 1.5 / (cols as f32).sqrt();
        let v: Vec<f32> = pseudo(rows * cols, *seed)
            .iter()
            .map(|x| x * scale)
            .collect();
        let bytes = if wty == GgmlType::F32 {
            v.iter().flat_map(|x| x.to_le_bytes()).collect()
        } else {
            let mut q =
                vec![0u8; wty.row_bytes((rows * cols) as u64).expect("whole blocks") as usize];
            ferrite_quant::quantize(wty, &v, &mut q).expect("quantize");
            q
        };
        tensors.push((name, wty, vec![cols as u64, rows as u64], bytes));
    };
    add_matrix("token_embd.weight".into(), VOCAB, d, &mut seed);
    let mut norms: Vec<(String, usize)> = vec![("output_norm.weight".into(), d)];
    for l in 0..n_layer as usize {
        let n = |s: &str| format!("blk.{l}.{s}.weight");
        add_matrix(n("attn_q"), n_head * hd, d, &mut seed);
        add_matrix(n("attn_k"), n_kv * hd, d, &mut seed);
        add_matrix(n("attn_v"), n_kv * hd, d, &mut seed);
        add_matrix(n("attn_output"), d, n_head * hd, &mut seed);
        add_matrix(n("ffn_gate"), ff, d, &mut seed);
        add_matrix(n("ffn_up"), ff, d, &mut seed);
        add_matrix(n("ffn_down"), d, ff, &mut seed);
        norms.push((n("attn_norm"), d));
        norms.push((n("ffn_norm"), d));
        if gemma {
            norms.push((n("attn_q_norm"), hd));
            norms.push((n("attn_k_norm"), hd));
            norms.push((n("post_attention_norm"), d));
            norms.push((n("post_ffw_norm"), d));
        }
    }
    for (name, len) in norms {
        seed += 1;
        let v: Vec<u8> = pseudo(len, seed)
            .iter()
            .flat_map(|x| (1.0 + 0.2 * x).to_le_bytes())
            .collect();
        tensors.push((name, GgmlType::F32, vec![len as u64], v));
    }
    for (name, ty, dims, data) in tensors {
        if name != skip_tensor {
            w.add_tensor(name, ty, &dims, data).expect("tensor");
        }
    }
    w.to_bytes().expect("gguf bytes")
}

/// A tiny model of `arch` ("llama" or "gemma3") with weights of type `wty`.
pub(crate) fn tiny_model(arch: &str, wty: GgmlType, precision: Precision) -> Model {
    let g = Gguf::from_bytes(tiny_gguf(arch, wty, "", "")).expect("tiny gguf parses");
    Model::from_gguf(g, LoadOptions { precision }).expect("tiny model loads")
}
