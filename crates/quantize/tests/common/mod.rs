//! Synthetic f32 llama models for the integration tests, built in memory with the GGUF writer.

#![allow(dead_code)] // each test binary uses a different part

use ferrite_gguf::{GgmlType, Gguf, GgufWriter, Value};

/// Normal(0, std) values from a fixed seed (xorshift64* + Box-Muller).
pub fn normal(n: usize, seed: u64, std: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut unit = || {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        ((s.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) + 1) as f64 / (1u64 << 53) as f64
    };
    (0..n)
        .map(|_| {
            let r = (-2.0 * unit().ln()).sqrt();
            (r * (std::f64::consts::TAU * unit()).cos()) as f32 * std
        })
        .collect()
}

/// How strongly `output.weight` row `t` leans towards token `t`'s embedding.
pub const HEAD_ALIGNMENT: f32 = 0.15;

/// Shape of a synthetic llama model.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub d: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub ff: usize,
    pub vocab: usize,
    pub layers: usize,
    /// Write `output.weight` (false: tied to `token_embd.weight`).
    pub untied: bool,
    /// Seed of every weight.
    pub seed: u64,
}

impl Shape {
    /// Rows a multiple of 256, so every K-quant fits without fallback.
    pub const K_FRIENDLY: Shape = Shape {
        d: 256,
        heads: 4,
        kv_heads: 2,
        ff: 512,
        vocab: 384,
        layers: 8,
        untied: true,
        seed: 7,
    };
    /// SmolLM2-like widths (576 = 18 x 32): K-quants must fall back.
    pub const ODD: Shape = Shape {
        d: 96,
        heads: 3,
        kv_heads: 1,
        ff: 288,
        vocab: 200,
        layers: 2,
        untied: false,
        seed: 7,
    };
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// GGUF bytes of an all-F32 llama model of `s`; `extra` tensors (name, dims) are appended
/// with random values (they need not be loadable by the model).
pub fn llama_f32(s: Shape, extra: &[(&str, Vec<u64>)]) -> Vec<u8> {
    let hd = s.d / s.heads;
    let u = |v: usize| Value::U32(v as u32);
    let mut w = GgufWriter::new();
    let meta = [
        ("general.architecture", Value::String("llama".into())),
        ("general.name", Value::String("quantize-test".into())),
        ("general.file_type", Value::U32(0)),
        ("llama.block_count", u(s.layers)),
        ("llama.context_length", u(512)),
        ("llama.embedding_length", u(s.d)),
        ("llama.feed_forward_length", u(s.ff)),
        ("llama.attention.head_count", u(s.heads)),
        ("llama.attention.head_count_kv", u(s.kv_heads)),
        ("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
        ("llama.rope.freq_base", Value::F32(1e4)),
    ];
    for (k, v) in meta {
        w.add_metadata(k, v).expect("metadata");
    }
    let mut seed = s.seed * 1000;
    // Embeddings of unit RMS, and an output head that leans towards each token's own
    // embedding: like a trained model (and unlike a purely random one) the top token then has
    // a margin over the runner-up, so top-1 agreement measures damage, not coin flips
    // between near-equal logits.
    seed += 1;
    let embd = normal(s.d * s.vocab, seed, 1.0);
    w.add_tensor(
        "token_embd.weight",
        GgmlType::F32,
        &[s.d as u64, s.vocab as u64],
        f32_bytes(&embd),
    )
    .expect("token_embd");
    if s.untied {
        seed += 1;
        let head: Vec<f32> = normal(s.d * s.vocab, seed, 1.0)
            .iter()
            .zip(&embd)
            .map(|(n, e)| (HEAD_ALIGNMENT * e + n) / (s.d as f32).sqrt())
            .collect();
        w.add_tensor(
            "output.weight",
            GgmlType::F32,
            &[s.d as u64, s.vocab as u64],
            f32_bytes(&head),
        )
        .expect("output");
    }
    // Matrices that write into the residual stream get GPT-2's scaled init (another
    // 1/sqrt(2 * layers)): without it a random deep stack is chaotic and amplifies any
    // perturbation far more than a trained model does.
    let residual_scale = 1.0 / (2.0 * s.layers as f32).sqrt();
    let mut matrix = |w: &mut GgufWriter, name: String, cols: usize, rows: usize| {
        seed += 1;
        let scale = if name.ends_with("attn_output.weight") || name.ends_with("ffn_down.weight") {
            residual_scale
        } else {
            1.0
        };
        let v = normal(cols * rows, seed, scale / (cols as f32).sqrt());
        w.add_tensor(
            name,
            GgmlType::F32,
            &[cols as u64, rows as u64],
            f32_bytes(&v),
        )
        .expect("tensor");
    };
    for l in 0..s.layers {
        let n = |t: &str| format!("blk.{l}.{t}.weight");
        matrix(&mut w, n("attn_q"), s.d, s.heads * hd);
        matrix(&mut w, n("attn_k"), s.d, s.kv_heads * hd);
        matrix(&mut w, n("attn_v"), s.d, s.kv_heads * hd);
        matrix(&mut w, n("attn_output"), s.heads * hd, s.d);
        matrix(&mut w, n("ffn_gate"), s.d, s.ff);
        matrix(&mut w, n("ffn_up"), s.d, s.ff);
        matrix(&mut w, n("ffn_down"), s.ff, s.d);
    }
    let mut norm = |w: &mut GgufWriter, name: String| {
        seed += 1;
        let v: Vec<f32> = normal(s.d, seed, 0.1).iter().map(|x| 1.0 + x).collect();
        w.add_tensor(name, GgmlType::F32, &[s.d as u64], f32_bytes(&v))
            .expect("norm");
    };
    norm(&mut w, "output_norm.weight".into());
    for l in 0..s.layers {
        norm(&mut w, format!("blk.{l}.attn_norm.weight"));
        norm(&mut w, format!("blk.{l}.ffn_norm.weight"));
    }
    for (name, dims) in extra {
        seed += 1;
        let n: u64 = dims.iter().product();
        w.add_tensor(
            *name,
            GgmlType::F32,
            dims,
            f32_bytes(&normal(n as usize, seed, 0.05)),
        )
        .expect("extra");
    }
    w.to_bytes().expect("bytes")
}

/// All values of a tensor as f32.
pub fn values(g: &Gguf, name: &str) -> Vec<f32> {
    let t = g.tensor(name).expect("tensor present");
    let mut out = vec![0f32; t.n_elements() as usize];
    ferrite_quant::dequantize(t.ty, g.tensor_data(t), &mut out).expect("dequantize");
    out
}
