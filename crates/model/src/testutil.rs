//! Tiny synthetic models for unit tests, built in memory with pseudo-random weights, small
//! enough that the naive reference runs in milliseconds: `llama`, `gemma3`, and the variants
//! `mistral` (llama + sliding window 4), `llama3` (llama + `rope_freqs.weight`), `mixtral`
//! (llama + 4 experts, top-2), `qwen2` (q/k/v biases), `qwen3` (q/k norms, head dim 32 with
//! 4 heads on d=64), `qwen3moe` (qwen3 attention, 4 experts, top-2, not renormalised),
//! `llama_bias` (llama + q/k/v/o biases, Llama's `attention_bias = true`), `gemma2` (no q/k
//! norms, soft caps small enough to bite, even layers sliding) and `gemma3_linear` (gemma3 +
//! linear rope scaling by 4 on its global layer), `phi3` (fused `attn_qkv` and `ffn_up`,
//! LongRoPE switching to its long factors past 4 positions, attention factor 1.2),
//! `gpt-oss` (4 experts, top-2, with router and expert biases, q/k/v/o biases, a sink
//! logit per head, YaRN by 4, layer 0 sliding with window 4, the FFN norm named
//! `post_attention_norm`).

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

/// Experts of the MoE variants.
pub(crate) const N_EXPERT: usize = 4;

/// Builds the GGUF bytes of a tiny model of `variant` (see the module doc). `skip_key` /
/// `skip_tensor` leave one entry out.
pub(crate) fn tiny_gguf(
    variant: &str,
    wty: GgmlType,
    skip_key: &str,
    skip_tensor: &str,
) -> Vec<u8> {
    let arch = match variant {
        "mistral" | "llama3" | "mixtral" | "llama_bias" => "llama",
        "gemma3_linear" => "gemma3",
        other => other,
    };
    let gemma = matches!(arch, "gemma3" | "gemma2");
    let qwen3 = matches!(arch, "qwen3" | "qwen3moe");
    let oss = arch == "gpt-oss";
    let moe = matches!(variant, "mixtral" | "qwen3moe" | "gpt-oss");
    let fused = arch == "phi3";
    let (d, n_head, n_kv, hd, ff) = if gemma {
        (64, 4, 1, 32, 128)
    } else if qwen3 {
        (64, 4, 2, 32, if moe { 32 } else { 128 })
    } else if moe {
        (64, 4, 2, 16, 32)
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
    match variant {
        "mistral" => meta.push((format!("{arch}.attention.sliding_window"), Value::U32(4))),
        "mixtral" | "qwen3moe" | "gpt-oss" => {
            meta.push((format!("{arch}.expert_count"), Value::U32(N_EXPERT as u32)));
            meta.push((format!("{arch}.expert_used_count"), Value::U32(2)));
        }
        _ => {}
    }
    if oss {
        meta.push((format!("{arch}.attention.sliding_window"), Value::U32(4)));
        meta.push((
            format!("{arch}.rope.scaling.type"),
            Value::String("yarn".into()),
        ));
        meta.push((format!("{arch}.rope.scaling.factor"), Value::F32(4.0)));
        meta.push((
            format!("{arch}.rope.scaling.original_context_length"),
            Value::U32(16),
        ));
    }
    if variant == "qwen3moe" || oss {
        meta.push((
            format!("{arch}.expert_feed_forward_length"),
            Value::U32(ff as u32),
        ));
        meta.push((format!("{arch}.expert_weights_norm"), Value::Bool(false)));
    }
    if gemma || qwen3 {
        meta.push((
            format!("{arch}.attention.key_length"),
            Value::U32(hd as u32),
        ));
        meta.push((
            format!("{arch}.attention.value_length"),
            Value::U32(hd as u32),
        ));
    }
    if gemma {
        meta.push((format!("{arch}.attention.sliding_window"), Value::U32(4)));
    }
    if arch == "gemma2" {
        // Scores of these weights spread about ±2 and logits about ±6: both caps bite.
        meta.push((format!("{arch}.attn_logit_softcapping"), Value::F32(1.5)));
        meta.push((format!("{arch}.final_logit_softcapping"), Value::F32(3.0)));
    }
    if arch == "phi3" {
        meta.push((
            format!("{arch}.rope.scaling.original_context_length"),
            Value::U32(4),
        ));
        meta.push((format!("{arch}.rope.scaling.attn_factor"), Value::F32(1.2)));
    }
    if variant == "gemma3_linear" {
        meta.push((
            format!("{arch}.rope.scaling.type"),
            Value::String("linear".into()),
        ));
        meta.push((format!("{arch}.rope.scaling.factor"), Value::F32(4.0)));
    }
    let mut w = GgufWriter::new();
    for (k, v) in meta {
        if k != skip_key {
            w.add_metadata(k, v).expect("metadata");
        }
    }
    let mut seed = 1;
    let mut tensors: Vec<(String, GgmlType, Vec<u64>, Vec<u8>)> = Vec::new();
    // `stack` > 1 makes a stacked expert tensor of `stack` matrices.
    let mut add_stack = |name: String, rows: usize, cols: usize, stack: usize, seed: &mut u64| {
        *seed += 1;
        let scale = 1.5 / (cols as f32).sqrt();
        let v: Vec<f32> = pseudo(rows * cols * stack, *seed)
            .iter()
            .map(|x| x * scale)
            .collect();
        let bytes = if wty == GgmlType::F32 {
            v.iter().flat_map(|x| x.to_le_bytes()).collect()
        } else {
            let n = (rows * cols * stack) as u64;
            let mut q = vec![0u8; wty.row_bytes(n).expect("whole blocks") as usize];
            ferrite_quant::quantize(wty, &v, &mut q).expect("quantize");
            q
        };
        let mut dims = vec![cols as u64, rows as u64];
        if stack > 1 {
            dims.push(stack as u64);
        }
        tensors.push((name, wty, dims, bytes));
    };
    add_stack("token_embd.weight".into(), VOCAB, d, 1, &mut seed);
    let mut norms: Vec<(String, usize)> = vec![("output_norm.weight".into(), d)];
    // Biases and other small tensors, with their dims.
    let mut biases: Vec<(String, Vec<usize>)> = Vec::new();
    for l in 0..n_layer as usize {
        let n = |s: &str| format!("blk.{l}.{s}.weight");
        if fused {
            add_stack(n("attn_qkv"), (n_head + 2 * n_kv) * hd, d, 1, &mut seed);
        } else {
            add_stack(n("attn_q"), n_head * hd, d, 1, &mut seed);
            add_stack(n("attn_k"), n_kv * hd, d, 1, &mut seed);
            add_stack(n("attn_v"), n_kv * hd, d, 1, &mut seed);
        }
        add_stack(n("attn_output"), d, n_head * hd, 1, &mut seed);
        if moe {
            add_stack(n("ffn_gate_inp"), N_EXPERT, d, 1, &mut seed);
            add_stack(n("ffn_gate_exps"), ff, d, N_EXPERT, &mut seed);
            add_stack(n("ffn_up_exps"), ff, d, N_EXPERT, &mut seed);
            add_stack(n("ffn_down_exps"), d, ff, N_EXPERT, &mut seed);
        } else if fused {
            add_stack(n("ffn_up"), 2 * ff, d, 1, &mut seed);
            add_stack(n("ffn_down"), d, ff, 1, &mut seed);
        } else {
            add_stack(n("ffn_gate"), ff, d, 1, &mut seed);
            add_stack(n("ffn_up"), ff, d, 1, &mut seed);
            add_stack(n("ffn_down"), d, ff, 1, &mut seed);
        }
        norms.push((n("attn_norm"), d));
        norms.push((
            n(if oss {
                "post_attention_norm"
            } else {
                "ffn_norm"
            }),
            d,
        ));
        if oss {
            let b = |s: &str| format!("blk.{l}.{s}.bias");
            biases.push((n("attn_sinks"), vec![n_head]));
            biases.push((b("attn_output"), vec![d]));
            biases.push((b("ffn_gate_inp"), vec![N_EXPERT]));
            biases.push((b("ffn_gate_exps"), vec![ff, N_EXPERT]));
            biases.push((b("ffn_up_exps"), vec![ff, N_EXPERT]));
            biases.push((b("ffn_down_exps"), vec![d, N_EXPERT]));
        }
        if qwen3 {
            norms.push((n("attn_q_norm"), hd));
            norms.push((n("attn_k_norm"), hd));
        }
        if variant == "llama_bias" {
            biases.push((format!("blk.{l}.attn_output.bias"), vec![d]));
        }
        if arch == "qwen2" || variant == "llama_bias" || oss {
            for (s, len) in [
                ("attn_q", n_head * hd),
                ("attn_k", n_kv * hd),
                ("attn_v", n_kv * hd),
            ] {
                biases.push((format!("blk.{l}.{s}.bias"), vec![len]));
            }
        }
        if arch == "gemma3" {
            norms.push((n("attn_q_norm"), hd));
            norms.push((n("attn_k_norm"), hd));
        }
        if gemma {
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
    for (name, dims) in biases {
        seed += 1;
        // Sinks of about the scores' size, so that each takes a share of its softmax.
        let scale = if name.contains("attn_sinks") {
            2.0
        } else {
            0.5
        };
        let v: Vec<u8> = pseudo(dims.iter().product(), seed)
            .iter()
            .flat_map(|x| (scale * x).to_le_bytes())
            .collect();
        let dims = dims.iter().map(|&n| n as u64).collect();
        tensors.push((name, GgmlType::F32, dims, v));
    }
    if arch == "phi3" {
        for (name, first) in [
            ("rope_factors_short.weight", 1.0f32),
            ("rope_factors_long.weight", 2.0),
        ] {
            let f: Vec<u8> = (0..hd / 2)
                .flat_map(|i| (first + 0.5 * i as f32).to_le_bytes())
                .collect();
            tensors.push((name.into(), GgmlType::F32, vec![(hd / 2) as u64], f));
        }
    }
    if variant == "llama3" {
        // Llama 3 style divisors: 1 for the fastest pairs, up to 8 for the slowest.
        let f: Vec<u8> = (0..hd / 2)
            .flat_map(|i| (1.0f32 + 7.0 * i as f32 / (hd / 2 - 1) as f32).to_le_bytes())
            .collect();
        tensors.push((
            "rope_freqs.weight".into(),
            GgmlType::F32,
            vec![(hd / 2) as u64],
            f,
        ));
    }
    for (name, ty, dims, data) in tensors {
        if name != skip_tensor {
            w.add_tensor(name, ty, &dims, data).expect("tensor");
        }
    }
    w.to_bytes().expect("gguf bytes")
}

/// Every variant [`tiny_gguf`] builds.
pub(crate) const VARIANTS: [&str; 13] = [
    "llama",
    "gemma3",
    "gemma2",
    "gemma3_linear",
    "phi3",
    "mistral",
    "llama3",
    "mixtral",
    "qwen2",
    "qwen3",
    "qwen3moe",
    "llama_bias",
    "gpt-oss",
];

/// A tiny model of `arch` (a variant of [`tiny_gguf`]) with weights of type `wty`.
pub(crate) fn tiny_model(arch: &str, wty: GgmlType, precision: Precision) -> Model {
    let g = Gguf::from_bytes(tiny_gguf(arch, wty, "", "")).expect("tiny gguf parses");
    Model::from_gguf(g, LoadOptions { precision }).expect("tiny model loads")
}

/// `bytes` (a GGUF) with metadata `extra` added or replacing keys of the same name.
pub(crate) fn with_metadata(bytes: Vec<u8>, extra: Vec<(String, Value)>) -> Vec<u8> {
    let g = Gguf::from_bytes(bytes).expect("gguf parses");
    let mut w = GgufWriter::new();
    for (k, v) in g.metadata() {
        if !extra.iter().any(|(e, _)| e == k) {
            w.add_metadata(k.clone(), v.clone()).expect("metadata");
        }
    }
    for (k, v) in extra {
        w.add_metadata(k, v).expect("metadata");
    }
    for t in g.tensors() {
        w.add_tensor(t.name.clone(), t.ty, &t.dims, g.tensor_data(t).to_vec())
            .expect("tensor");
    }
    w.to_bytes().expect("gguf bytes")
}

/// `bytes` (a GGUF) with f32 tensors `extra` (`name`, values) added as 1-D tensors.
pub(crate) fn with_vectors(bytes: Vec<u8>, extra: &[(&str, Vec<f32>)]) -> Vec<u8> {
    let g = Gguf::from_bytes(bytes).expect("gguf parses");
    let mut w = GgufWriter::new();
    for (k, v) in g.metadata() {
        w.add_metadata(k.clone(), v.clone()).expect("metadata");
    }
    for t in g.tensors() {
        w.add_tensor(t.name.clone(), t.ty, &t.dims, g.tensor_data(t).to_vec())
            .expect("tensor");
    }
    for (name, v) in extra {
        let data: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        w.add_tensor(*name, GgmlType::F32, &[v.len() as u64], data)
            .expect("tensor");
    }
    w.to_bytes().expect("gguf bytes")
}
