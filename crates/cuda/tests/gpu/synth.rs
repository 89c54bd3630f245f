//! Synthetic GGUF models with pseudo-random weights in chosen block types, built in memory
//! with `ferrite_gguf::GgufWriter` and `ferrite_quant::quantize`.

use ferrite_gguf::{GgmlType, Gguf, GgufWriter, Value};
use ferrite_model::{LoadOptions, Model};

use crate::pseudo;

/// Shape and weight types of a synthetic model.
#[derive(Debug, Clone)]
pub struct Spec {
    pub arch: &'static str,
    pub n_layer: usize,
    pub d: usize,
    pub n_head: usize,
    pub n_kv: usize,
    pub hd: usize,
    pub ff: usize,
    pub vocab: usize,
    pub embed: GgmlType,
    pub attn_qk: GgmlType,
    pub attn_v: GgmlType,
    pub attn_o: GgmlType,
    pub ffn_up: GgmlType,
    pub ffn_down: GgmlType,
    /// Untied output projection type; `None` ties it to the embedding.
    pub output: Option<GgmlType>,
}

fn matrix(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let scale = 1.5 / (cols as f32).sqrt();
    let v: Vec<f32> = pseudo(rows * cols, seed)
        .iter()
        .map(|x| x * scale)
        .collect();
    let mut q = vec![0u8; ty.row_bytes((rows * cols) as u64).unwrap() as usize];
    ferrite_quant::quantize(ty, &v, &mut q).unwrap();
    q
}

/// The model described by `s`.
pub fn model(s: &Spec) -> Model {
    let a = s.arch;
    let gemma = a == "gemma3";
    let mut w = GgufWriter::new();
    let mut meta: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(a.into())),
        (format!("{a}.block_count"), Value::U32(s.n_layer as u32)),
        (format!("{a}.context_length"), Value::U32(4096)),
        (format!("{a}.embedding_length"), Value::U32(s.d as u32)),
        (format!("{a}.feed_forward_length"), Value::U32(s.ff as u32)),
        (
            format!("{a}.attention.head_count"),
            Value::U32(s.n_head as u32),
        ),
        (
            format!("{a}.attention.head_count_kv"),
            Value::U32(s.n_kv as u32),
        ),
        (
            format!("{a}.attention.layer_norm_rms_epsilon"),
            Value::F32(1e-6),
        ),
        (
            format!("{a}.rope.freq_base"),
            Value::F32(if gemma { 1e6 } else { 1e5 }),
        ),
        (format!("{a}.attention.key_length"), Value::U32(s.hd as u32)),
        (
            format!("{a}.attention.value_length"),
            Value::U32(s.hd as u32),
        ),
    ];
    if gemma {
        meta.push((format!("{a}.attention.sliding_window"), Value::U32(4)));
    }
    for (k, v) in meta {
        w.add_metadata(k, v).unwrap();
    }
    let mut seed = 10;
    let mut next = || {
        seed += 1;
        seed
    };
    let mut tensors: Vec<(String, GgmlType, Vec<u64>, Vec<u8>)> = Vec::new();
    let mut add = |name: String, ty: GgmlType, rows: usize, cols: usize, seed: u64| {
        tensors.push((
            name,
            ty,
            vec![cols as u64, rows as u64],
            matrix(ty, rows, cols, seed),
        ));
    };
    add("token_embd.weight".into(), s.embed, s.vocab, s.d, next());
    if let Some(ty) = s.output {
        add("output.weight".into(), ty, s.vocab, s.d, next());
    }
    let mut norms: Vec<(String, usize)> = vec![("output_norm.weight".into(), s.d)];
    for l in 0..s.n_layer {
        let n = |x: &str| format!("blk.{l}.{x}.weight");
        add(n("attn_q"), s.attn_qk, s.n_head * s.hd, s.d, next());
        add(n("attn_k"), s.attn_qk, s.n_kv * s.hd, s.d, next());
        add(n("attn_v"), s.attn_v, s.n_kv * s.hd, s.d, next());
        add(n("attn_output"), s.attn_o, s.d, s.n_head * s.hd, next());
        add(n("ffn_gate"), s.ffn_up, s.ff, s.d, next());
        add(n("ffn_up"), s.ffn_up, s.ff, s.d, next());
        add(n("ffn_down"), s.ffn_down, s.d, s.ff, next());
        norms.push((n("attn_norm"), s.d));
        norms.push((n("ffn_norm"), s.d));
        if gemma {
            norms.push((n("attn_q_norm"), s.hd));
            norms.push((n("attn_k_norm"), s.hd));
            norms.push((n("post_attention_norm"), s.d));
            norms.push((n("post_ffw_norm"), s.d));
        }
    }
    for (name, len) in norms {
        let v: Vec<u8> = pseudo(len, next())
            .iter()
            .flat_map(|x| (1.0 + 0.2 * x).to_le_bytes())
            .collect();
        tensors.push((name, GgmlType::F32, vec![len as u64], v));
    }
    for (name, ty, dims, data) in tensors {
        w.add_tensor(name, ty, &dims, data).unwrap();
    }
    let g = Gguf::from_bytes(w.to_bytes().unwrap()).unwrap();
    Model::from_gguf(g, LoadOptions::default()).unwrap()
}

/// A llama model with SmolLM2's weight types (Q8_0 embedding, Q4_1 layers, tied output).
pub fn llama_small() -> Spec {
    Spec {
        arch: "llama",
        n_layer: 3,
        d: 256,
        n_head: 4,
        n_kv: 2,
        hd: 64,
        ff: 544,
        vocab: 301,
        embed: GgmlType::Q8_0,
        attn_qk: GgmlType::Q4_1,
        attn_v: GgmlType::Q4_1,
        attn_o: GgmlType::Q8_0,
        ffn_up: GgmlType::Q4_1,
        ffn_down: GgmlType::Q4_1,
        output: None,
    }
}

/// `llama_small` in the formats no real model of ours uses: Q4_0 and BF16 matrices, a BF16
/// embedding and an untied Q4_0 output.
pub fn llama_q4_0_bf16() -> Spec {
    Spec {
        embed: GgmlType::BF16,
        attn_qk: GgmlType::Q4_0,
        attn_v: GgmlType::Q4_0,
        attn_o: GgmlType::BF16,
        ffn_up: GgmlType::BF16,
        ffn_down: GgmlType::Q4_0,
        output: Some(GgmlType::Q4_0),
        ..llama_small()
    }
}

/// A gemma3 model with Gemma 3 270M's weight types, 7 layers (sliding and global).
pub fn gemma_small() -> Spec {
    Spec {
        arch: "gemma3",
        n_layer: 7,
        d: 256,
        n_head: 2,
        n_kv: 1,
        hd: 256,
        ff: 512,
        vocab: 263,
        embed: GgmlType::Q8_0,
        attn_qk: GgmlType::Q5_0,
        attn_v: GgmlType::Q6_K,
        attn_o: GgmlType::Q4_K,
        ffn_up: GgmlType::Q4_K,
        ffn_down: GgmlType::Q6_K,
        output: Some(GgmlType::Q6_K),
    }
}

/// A llama model with Q4_K_M's weight types (Q4_K Q and K, Q6_K V and FFN down): the
/// Q/K/V products run as separate launches of two types.
pub fn llama_q4_k_m() -> Spec {
    Spec {
        arch: "llama",
        n_layer: 3,
        d: 256,
        n_head: 4,
        n_kv: 1,
        hd: 64,
        ff: 512,
        vocab: 301,
        embed: GgmlType::Q8_0,
        attn_qk: GgmlType::Q4_K,
        attn_v: GgmlType::Q6_K,
        attn_o: GgmlType::Q4_K,
        ffn_up: GgmlType::Q4_K,
        ffn_down: GgmlType::Q6_K,
        output: Some(GgmlType::Q6_K),
    }
}

/// The SmolLM2 anchor shape of /work/shared/anchors (Q4_1, untied output).
pub fn smollm2_shape() -> Spec {
    Spec {
        arch: "llama",
        n_layer: 30,
        d: 576,
        n_head: 9,
        n_kv: 3,
        hd: 64,
        ff: 1536,
        vocab: 49152,
        embed: GgmlType::Q4_1,
        attn_qk: GgmlType::Q4_1,
        attn_v: GgmlType::Q4_1,
        attn_o: GgmlType::Q4_1,
        ffn_up: GgmlType::Q4_1,
        ffn_down: GgmlType::Q4_1,
        output: Some(GgmlType::Q4_1),
    }
}
