//! Converts hand-built tiny Hugging Face directories and checks the GGUF against the inputs.
//! Oracles: the bytes written into the safetensors files (exact for unchanged tensors), the
//! rope pairing definition for the Q/K permutation (GGUF rows 2j, 2j+1 of a head must be the
//! HF rotate-half pair j, j + d/2), and ferrite's own tokenizer loading the metadata.

use std::path::Path;

mod common;

use common::{Tensor, bf16_tensor, f32_tensor, values, write_safetensors};
use ferrite_convert::{ConvertError, HfModel, OutType};
use ferrite_gguf::{GgmlType, Gguf};

const D: usize = 32;
const HEADS: usize = 4;
const KV: usize = 2;
const HD: usize = 8;
const FF: usize = 64;
const VOCAB: usize = 8;

const TOKENIZER: &str = r#"{
  "added_tokens": [{"id": 5, "content": "<|im_start|>", "special": true},
                   {"id": 6, "content": "<|im_end|>", "special": true}],
  "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
  "post_processor": {"type": "ByteLevel"},
  "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "Ġ": 3, "Ġab": 4},
            "merges": [["a", "b"], "Ġ ab"]}
}"#;

const TOKENIZER_CONFIG: &str = r#"{"bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
  "chat_template": "{% for m in messages %}<|im_start|>{{ m.content }}<|im_end|>{% endfor %}"}"#;

fn config(arch: &str, extra: &str) -> String {
    format!(
        r#"{{"architectures":["{arch}"],"num_hidden_layers":1,"hidden_size":{D},
        "intermediate_size":{FF},"num_attention_heads":{HEADS},"num_key_value_heads":{KV},
        "vocab_size":{VOCAB},"rms_norm_eps":1e-5,"rope_theta":10000.0,
        "max_position_embeddings":128{extra}}}"#
    )
}

/// A dense llama-style directory; `tied` drops lm_head.
fn dense_dir(dir: &Path, arch: &str, extra: &str, tied: bool) -> Vec<Tensor> {
    let l = "model.layers.0.";
    let mut t = vec![
        bf16_tensor("model.embed_tokens.weight", &[VOCAB, D], 1),
        f32_tensor("model.norm.weight", &[D], 2),
        f32_tensor(&format!("{l}input_layernorm.weight"), &[D], 3),
        f32_tensor(&format!("{l}self_attn.q_proj.weight"), &[HEADS * HD, D], 4),
        f32_tensor(&format!("{l}self_attn.k_proj.weight"), &[KV * HD, D], 5),
        f32_tensor(&format!("{l}self_attn.v_proj.weight"), &[KV * HD, D], 6),
        f32_tensor(&format!("{l}self_attn.o_proj.weight"), &[D, HEADS * HD], 7),
        f32_tensor(&format!("{l}post_attention_layernorm.weight"), &[D], 8),
        f32_tensor(&format!("{l}mlp.gate_proj.weight"), &[FF, D], 9),
        f32_tensor(&format!("{l}mlp.up_proj.weight"), &[FF, D], 10),
        f32_tensor(&format!("{l}mlp.down_proj.weight"), &[D, FF], 11),
    ];
    if !tied {
        t.push(f32_tensor("lm_head.weight", &[VOCAB, D], 12));
    }
    let tie = if tied {
        r#","tie_word_embeddings":true"#
    } else {
        ""
    };
    std::fs::write(
        dir.join("config.json"),
        config(arch, &format!("{extra}{tie}")),
    )
    .unwrap();
    std::fs::write(dir.join("tokenizer.json"), TOKENIZER).unwrap();
    std::fs::write(dir.join("tokenizer_config.json"), TOKENIZER_CONFIG).unwrap();
    write_safetensors(&dir.join("model.safetensors"), &t);
    t
}

fn convert(dir: &Path, ty: OutType) -> Result<Gguf, ConvertError> {
    let m = HfModel::open(dir)?;
    let mut seen = 0;
    let (w, summary) = m.to_gguf(ty, &mut |p| {
        seen += 1;
        assert_eq!(p.index, seen);
    })?;
    assert_eq!(summary.n_tensors, seen);
    Ok(Gguf::from_bytes(w.to_bytes()?)?)
}

fn f32s(g: &Gguf, name: &str) -> Vec<f32> {
    let t = g.tensor(name).unwrap_or_else(|| panic!("{name} missing"));
    let mut out = vec![0f32; t.n_elements() as usize];
    ferrite_quant::dequantize(t.ty, g.tensor_data(t), &mut out).unwrap();
    out
}

#[test]
fn llama_round_trips_names_shapes_values_and_permutes_qk() {
    let dir = tempfile::tempdir().unwrap();
    let src = dense_dir(dir.path(), "LlamaForCausalLM", "", false);
    let g = convert(dir.path(), OutType::Stored).unwrap();
    assert_eq!(g.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(g.get_u32("llama.block_count").unwrap(), 1);
    assert_eq!(
        g.get_u32("llama.attention.head_count_kv").unwrap(),
        KV as u32
    );
    assert_eq!(g.get_u32("llama.rope.dimension_count").unwrap(), HD as u32);
    assert_eq!(g.get_f32("llama.rope.freq_base").unwrap(), 10000.0);
    assert_eq!(
        g.get_u32("general.file_type").unwrap(),
        32,
        "auto follows the BF16 embedding"
    );
    let names: Vec<&str> = g.tensors().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names.len(), 12, "{names:?}");
    // Unchanged tensors: exact bytes, reversed shape, stored type.
    let embd = g.tensor("token_embd.weight").unwrap();
    assert_eq!(
        (embd.ty, embd.dims.as_slice()),
        (GgmlType::BF16, &[D as u64, VOCAB as u64][..])
    );
    assert_eq!(g.tensor_data(embd), src[0].bytes.as_slice());
    let down = g.tensor("blk.0.ffn_down.weight").unwrap();
    assert_eq!(down.dims, [FF as u64, D as u64]);
    assert_eq!(g.tensor_data(down), src[10].bytes.as_slice());
    assert_eq!(
        g.tensor_data(g.tensor("output.weight").unwrap()),
        src[11].bytes.as_slice()
    );
    // Q/K: GGUF rows (2j, 2j+1) of head h are HF rows (j, j + HD/2) of that head.
    for (name, seed, heads) in [
        ("blk.0.attn_q.weight", 4, HEADS),
        ("blk.0.attn_k.weight", 5, KV),
    ] {
        let got = f32s(&g, name);
        let hf = values(seed, heads * HD * D);
        let row = |v: &[f32], r: usize| v[r * D..(r + 1) * D].to_vec();
        for h in 0..heads {
            for j in 0..HD / 2 {
                assert_eq!(
                    row(&got, h * HD + 2 * j),
                    row(&hf, h * HD + j),
                    "{name} h{h} j{j}"
                );
                assert_eq!(row(&got, h * HD + 2 * j + 1), row(&hf, h * HD + j + HD / 2));
            }
        }
    }
    // The tokenizer metadata builds ferrite's tokenizer.
    let tok = ferrite_tokenizer::Tokenizer::from_gguf(&g).unwrap();
    assert_eq!(tok.encode("ab ab", false, false), vec![2, 4]);
    assert_eq!(tok.encode("<|im_start|>", false, true), vec![5]);
    assert_eq!(g.get_u32("tokenizer.ggml.bos_token_id").unwrap(), 5);
    assert_eq!(g.get_u32("tokenizer.ggml.eos_token_id").unwrap(), 6);
    assert!(!g.get_bool("tokenizer.ggml.add_bos_token").unwrap());
    assert!(
        g.get_str("tokenizer.chat_template")
            .unwrap()
            .contains("im_start")
    );
    let tokens = g.get_str_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(tokens[7], "[PAD7]");
    assert_eq!(
        g.get_i32_array("tokenizer.ggml.token_type").unwrap(),
        [1, 1, 1, 1, 1, 3, 3, 5]
    );
    assert_eq!(
        g.get_str_array("tokenizer.ggml.merges").unwrap(),
        ["a b", "Ġ ab"]
    );
}

#[test]
fn qwen2_is_not_permuted_and_keeps_biases_f32() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = dense_dir(dir.path(), "Qwen2ForCausalLM", "", true);
    t.push(f32_tensor(
        "model.layers.0.self_attn.q_proj.bias",
        &[HEADS * HD],
        20,
    ));
    write_safetensors(&dir.path().join("model.safetensors"), &t);
    let g = convert(dir.path(), OutType::F16).unwrap();
    assert_eq!(g.get_str("general.architecture").unwrap(), "qwen2");
    assert!(
        g.tensor("output.weight").is_none(),
        "tied: no output.weight"
    );
    assert_eq!(g.get_u32("general.file_type").unwrap(), 1);
    let q = g.tensor("blk.0.attn_q.weight").unwrap();
    assert_eq!(q.ty, GgmlType::F16);
    let got = f32s(&g, "blk.0.attn_q.weight");
    let want = values(4, HEADS * HD * D);
    for (a, b) in got.iter().zip(&want) {
        assert_eq!(*a, half_round(*b), "qwen2 Q rows stay in HF order");
    }
    let bias = g.tensor("blk.0.attn_q.bias").unwrap();
    assert_eq!(bias.ty, GgmlType::F32);
    assert_eq!(
        g.tensor("blk.0.attn_norm.weight").unwrap().ty,
        GgmlType::F32
    );
}

fn half_round(x: f32) -> f32 {
    let mut b = [0u8; 2];
    ferrite_quant::quantize(GgmlType::F16, &[x], &mut b).unwrap();
    let mut y = [0f32];
    ferrite_quant::dequantize(GgmlType::F16, &b, &mut y).unwrap();
    y[0]
}

#[test]
fn q8_0_quantizes_matrices_only() {
    let dir = tempfile::tempdir().unwrap();
    dense_dir(
        dir.path(),
        "MistralForCausalLM",
        r#","sliding_window":64"#,
        false,
    );
    let g = convert(dir.path(), OutType::Q8_0).unwrap();
    assert_eq!(g.get_u32("general.file_type").unwrap(), 7);
    assert_eq!(g.get_u32("llama.attention.sliding_window").unwrap(), 64);
    assert_eq!(g.tensor("blk.0.ffn_up.weight").unwrap().ty, GgmlType::Q8_0);
    assert_eq!(g.tensor("output_norm.weight").unwrap().ty, GgmlType::F32);
    let got = f32s(&g, "blk.0.ffn_up.weight");
    let want = values(10, FF * D);
    let max = want.iter().fold(0f32, |m, x| m.max(x.abs()));
    for (a, b) in got.iter().zip(&want) {
        assert!((a - b).abs() <= max / 127.0, "{a} vs {b}");
    }
}

fn moe_dir(dir: &Path, fused: bool) {
    let l = "model.layers.0.";
    let e = 3;
    let mut t = vec![
        f32_tensor("model.embed_tokens.weight", &[VOCAB, D], 1),
        f32_tensor("model.norm.weight", &[D], 2),
        f32_tensor(&format!("{l}input_layernorm.weight"), &[D], 3),
        f32_tensor(&format!("{l}self_attn.q_proj.weight"), &[HEADS * HD, D], 4),
        f32_tensor(&format!("{l}self_attn.k_proj.weight"), &[KV * HD, D], 5),
        f32_tensor(&format!("{l}self_attn.v_proj.weight"), &[KV * HD, D], 6),
        f32_tensor(&format!("{l}self_attn.o_proj.weight"), &[D, HEADS * HD], 7),
        f32_tensor(&format!("{l}self_attn.q_norm.weight"), &[HD], 13),
        f32_tensor(&format!("{l}self_attn.k_norm.weight"), &[HD], 14),
        f32_tensor(&format!("{l}post_attention_layernorm.weight"), &[D], 8),
        f32_tensor(&format!("{l}mlp.gate.weight"), &[e, D], 9),
    ];
    if fused {
        // gate_up[x] = [gate_x; up_x] with gate_x = values(30+x), up_x = values(40+x).
        let mut gu = Vec::new();
        let mut down = Vec::new();
        for x in 0..e {
            gu.extend(values(30 + x, FF * D));
            gu.extend(values(40 + x, FF * D));
            down.extend(values(50 + x, D * FF));
        }
        let bytes = |v: Vec<f32>| v.iter().flat_map(|x| x.to_le_bytes()).collect();
        t.push(Tensor {
            name: format!("{l}mlp.experts.gate_up_proj"),
            dtype: "F32",
            shape: vec![e, 2 * FF, D],
            bytes: bytes(gu),
        });
        t.push(Tensor {
            name: format!("{l}mlp.experts.down_proj"),
            dtype: "F32",
            shape: vec![e, D, FF],
            bytes: bytes(down),
        });
    } else {
        for x in 0..e {
            t.push(f32_tensor(
                &format!("{l}mlp.experts.{x}.gate_proj.weight"),
                &[FF, D],
                30 + x,
            ));
            t.push(f32_tensor(
                &format!("{l}mlp.experts.{x}.up_proj.weight"),
                &[FF, D],
                40 + x,
            ));
            t.push(f32_tensor(
                &format!("{l}mlp.experts.{x}.down_proj.weight"),
                &[D, FF],
                50 + x,
            ));
        }
    }
    let extra = r#","num_experts":3,"num_experts_per_tok":2,"moe_intermediate_size":64,"norm_topk_prob":true,"head_dim":8,"tie_word_embeddings":true"#;
    std::fs::write(
        dir.join("config.json"),
        config("Qwen3MoeForCausalLM", extra),
    )
    .unwrap();
    std::fs::write(dir.join("tokenizer.json"), TOKENIZER).unwrap();
    write_safetensors(&dir.join("model.safetensors"), &t);
}

#[test]
fn qwen3moe_experts_stack_the_same_from_both_checkpoint_layouts() {
    for fused in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        moe_dir(dir.path(), fused);
        let g = convert(dir.path(), OutType::F32).unwrap();
        assert_eq!(g.get_str("general.architecture").unwrap(), "qwen3moe");
        assert_eq!(g.get_u32("qwen3moe.expert_count").unwrap(), 3);
        assert_eq!(g.get_u32("qwen3moe.expert_used_count").unwrap(), 2);
        assert_eq!(
            g.get_u32("qwen3moe.expert_feed_forward_length").unwrap(),
            64
        );
        assert_eq!(g.get_u32("qwen3moe.attention.key_length").unwrap(), 8);
        assert!(g.get_bool("qwen3moe.expert_weights_norm").unwrap());
        for (part, seed0) in [("gate", 30), ("up", 40), ("down", 50)] {
            let name = format!("blk.0.ffn_{part}_exps.weight");
            let t = g.tensor(&name).unwrap();
            let want_dims = if part == "down" {
                [FF, D, 3]
            } else {
                [D, FF, 3]
            };
            assert_eq!(t.dims, want_dims.map(|d| d as u64), "{name} fused={fused}");
            let want: Vec<f32> = (0..3).flat_map(|x| values(seed0 + x, FF * D)).collect();
            assert_eq!(f32s(&g, &name), want, "{name} fused={fused}");
        }
        assert_eq!(
            g.tensor("blk.0.ffn_gate_inp.weight").unwrap().dims,
            [D as u64, 3]
        );
        assert!(g.tensor("blk.0.attn_k_norm.weight").is_some());
    }
}

#[test]
fn llama3_rope_scaling_writes_rope_freqs() {
    let dir = tempfile::tempdir().unwrap();
    let rope = r#","rope_scaling":{"rope_type":"llama3","factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":16}"#;
    dense_dir(dir.path(), "LlamaForCausalLM", rope, false);
    let g = convert(dir.path(), OutType::F32).unwrap();
    let t = g.tensor("rope_freqs.weight").unwrap();
    assert_eq!(
        (t.ty, t.dims.as_slice()),
        (GgmlType::F32, &[HD as u64 / 2][..])
    );
}

#[test]
fn errors_name_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let e = HfModel::open(dir.path()).unwrap_err();
    assert!(matches!(e, ConvertError::MissingFile { .. }), "{e}");
    dense_dir(dir.path(), "GPT2LMHeadModel", "", false);
    let e = HfModel::open(dir.path()).unwrap_err();
    assert!(e.to_string().contains("GPT2LMHeadModel"), "{e}");
    // Untied without lm_head.
    let mut t = dense_dir(dir.path(), "LlamaForCausalLM", "", false);
    t.pop();
    write_safetensors(&dir.path().join("model.safetensors"), &t);
    let e = convert(dir.path(), OutType::F32).unwrap_err();
    assert!(matches!(e, ConvertError::MissingTensor(_)), "{e}");
    // A tensor nobody maps.
    t.push(f32_tensor("lm_head.weight", &[VOCAB, D], 12));
    t.push(f32_tensor("model.layers.0.mystery.weight", &[2], 1));
    write_safetensors(&dir.path().join("model.safetensors"), &t);
    let e = convert(dir.path(), OutType::F32).unwrap_err();
    assert!(e.to_string().contains("mystery"), "{e}");
    // A layer the config does not have, and expert weights in a dense model.
    t.pop();
    t.push(f32_tensor("model.layers.5.mlp.up_proj.weight", &[FF, D], 1));
    write_safetensors(&dir.path().join("model.safetensors"), &t);
    let e = convert(dir.path(), OutType::F32).unwrap_err();
    assert!(e.to_string().contains("num_hidden_layers"), "{e}");
    t.pop();
    t.push(f32_tensor(
        "model.layers.0.mlp.experts.0.up_proj.weight",
        &[FF, D],
        1,
    ));
    write_safetensors(&dir.path().join("model.safetensors"), &t);
    let e = convert(dir.path(), OutType::F32).unwrap_err();
    assert!(matches!(e, ConvertError::UnmappedTensor(_)), "{e}");
}

#[test]
fn sharded_checkpoint_converts_to_the_same_file_as_one_shard() {
    let one = tempfile::tempdir().unwrap();
    let t = dense_dir(one.path(), "LlamaForCausalLM", "", false);
    let whole = HfModel::open(one.path()).unwrap();
    let whole = whole
        .to_gguf(OutType::F16, &mut |_| {})
        .unwrap()
        .0
        .to_bytes()
        .unwrap();

    let sharded = tempfile::tempdir().unwrap();
    dense_dir(sharded.path(), "LlamaForCausalLM", "", false);
    std::fs::remove_file(sharded.path().join("model.safetensors")).unwrap();
    let (a, b) = t.split_at(5);
    write_safetensors(&sharded.path().join("model-00001-of-00002.safetensors"), a);
    write_safetensors(&sharded.path().join("model-00002-of-00002.safetensors"), b);
    let map: Vec<String> = t
        .iter()
        .enumerate()
        .map(|(i, x)| {
            format!(
                r#""{}":"model-0000{}-of-00002.safetensors""#,
                x.name,
                1 + usize::from(i >= 5)
            )
        })
        .collect();
    std::fs::write(
        sharded.path().join("model.safetensors.index.json"),
        format!(
            r#"{{"metadata":{{"total_size":0}},"weight_map":{{{}}}}}"#,
            map.join(",")
        ),
    )
    .unwrap();
    let m = HfModel::open(sharded.path()).unwrap();
    assert_eq!(m.checkpoint().files().len(), 2);
    let bytes = m
        .to_gguf(OutType::F16, &mut |_| {})
        .unwrap()
        .0
        .to_bytes()
        .unwrap();
    // general.name is the directory name, so compare the tensor tables and data.
    let (g1, g2) = (
        Gguf::from_bytes(whole).unwrap(),
        Gguf::from_bytes(bytes).unwrap(),
    );
    assert_eq!(g1.tensors(), g2.tensors());
    for t in g1.tensors() {
        assert_eq!(
            g1.tensor_data(t),
            g2.tensor_data(g2.tensor(&t.name).unwrap()),
            "{}",
            t.name
        );
    }
}

#[test]
fn llama_attention_biases_are_permuted_like_their_weights() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = dense_dir(
        dir.path(),
        "LlamaForCausalLM",
        r#","attention_bias":true"#,
        false,
    );
    t.push(f32_tensor(
        "model.layers.0.self_attn.q_proj.bias",
        &[HEADS * HD],
        21,
    ));
    t.push(f32_tensor(
        "model.layers.0.self_attn.k_proj.bias",
        &[KV * HD],
        22,
    ));
    t.push(f32_tensor(
        "model.layers.0.self_attn.v_proj.bias",
        &[KV * HD],
        23,
    ));
    write_safetensors(&dir.path().join("model.safetensors"), &t);
    let g = convert(dir.path(), OutType::F16).unwrap();
    for (name, seed, heads) in [
        ("blk.0.attn_q.bias", 21, HEADS),
        ("blk.0.attn_k.bias", 22, KV),
    ] {
        let got = f32s(&g, name);
        let hf = values(seed, heads * HD);
        for h in 0..heads {
            for j in 0..HD / 2 {
                assert_eq!(got[h * HD + 2 * j], hf[h * HD + j], "{name}");
                assert_eq!(got[h * HD + 2 * j + 1], hf[h * HD + j + HD / 2], "{name}");
            }
        }
        assert_eq!(g.tensor(name).unwrap().ty, GgmlType::F32);
    }
    assert_eq!(
        f32s(&g, "blk.0.attn_v.bias"),
        values(23, KV * HD),
        "V is never permuted"
    );
}

/// The streaming writer must give exactly the bytes of the in-memory one (which the other
/// tests check against their oracles), for every kind of tensor source and output type.
#[test]
fn streamed_file_equals_the_in_memory_gguf() {
    let cases: [(&str, OutType); 4] = [
        ("llama", OutType::Stored),
        ("mistral", OutType::Q8_0),
        ("llama3", OutType::F16),
        ("moe", OutType::BF16),
    ];
    for (kind, ty) in cases {
        let dir = tempfile::tempdir().unwrap();
        match kind {
            "llama" => {
                dense_dir(dir.path(), "LlamaForCausalLM", "", false);
            }
            "mistral" => {
                dense_dir(
                    dir.path(),
                    "MistralForCausalLM",
                    r#","sliding_window":4"#,
                    false,
                );
            }
            "llama3" => {
                dense_dir(
                    dir.path(),
                    "LlamaForCausalLM",
                    r#","rope_scaling":{"rope_type":"llama3","factor":8.0,"original_max_position_embeddings":16}"#,
                    false,
                );
            }
            _ => moe_dir(dir.path(), true),
        }
        let m = HfModel::open(dir.path()).unwrap();
        let (w, s1) = m.to_gguf(ty, &mut |_| {}).unwrap();
        let memory = w.to_bytes().unwrap();
        let path = dir.path().join("out.gguf");
        let mut seen = 0;
        let s2 = m.write_gguf(&path, ty, &mut |_| seen += 1).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), memory, "{kind} {ty:?}");
        assert_eq!(s1, s2);
        assert_eq!(seen, s2.n_tensors);
    }
}

/// Regression: config counts above u32::MAX were truncated into the GGUF's u32 keys
/// (`num_hidden_layers` = 2^32 + 1 was written as block_count 1 and the conversion
/// succeeded), and `vocab_size` sized the padded token table before anything checked it
/// against the weights (2^40 aborted the process on a 35 TB allocation, 2^62 panicked with a
/// capacity overflow). A negative norm epsilon or a rope base of 0 was written too, and the
/// loader refuses such files. Each must be a `BadConfig` naming the key, from
/// `HfModel::open`.
#[test]
fn config_claims_are_bounded_before_use() {
    let dir = tempfile::tempdir().unwrap();
    let over_u32 = 1u64 << 32;
    for (key, value) in [
        ("num_hidden_layers", (over_u32 + 1).to_string()),
        ("intermediate_size", (over_u32 + FF as u64).to_string()),
        ("max_position_embeddings", over_u32.to_string()),
        ("vocab_size", (1u64 << 40).to_string()),
        ("vocab_size", (1u64 << 62).to_string()),
        ("vocab_size", (VOCAB + 1).to_string()),
        ("rms_norm_eps", "-1".into()),
        ("rope_theta", "0".into()),
        ("rope_theta", "-10000.0".into()),
    ] {
        dense_dir(
            dir.path(),
            "LlamaForCausalLM",
            &format!(r#","{key}":{value}"#),
            false,
        );
        let e = HfModel::open(dir.path()).unwrap_err();
        assert!(
            matches!(&e, ConvertError::BadConfig { key: k, .. } if k == key),
            "{key} = {value}: {e}"
        );
    }
}

/// A one-layer Gemma 3 text directory (Gemma's four norms, q/k norms, tied output); with
/// `multimodal`, the same weights as `Gemma3ForConditionalGeneration` saves them (text
/// config nested, `model.language_model.` names, a vision tensor beside them).
fn gemma3_dir(dir: &Path, multimodal: bool) -> Vec<Tensor> {
    let l = "model.layers.0.";
    let mut t = vec![
        f32_tensor("model.embed_tokens.weight", &[VOCAB, D], 1),
        bf16_tensor("model.norm.weight", &[D], 2),
        f32_tensor(&format!("{l}input_layernorm.weight"), &[D], 3),
        f32_tensor(&format!("{l}self_attn.q_proj.weight"), &[HEADS * HD, D], 4),
        f32_tensor(&format!("{l}self_attn.k_proj.weight"), &[KV * HD, D], 5),
        f32_tensor(&format!("{l}self_attn.v_proj.weight"), &[KV * HD, D], 6),
        f32_tensor(&format!("{l}self_attn.o_proj.weight"), &[D, HEADS * HD], 7),
        f32_tensor(&format!("{l}self_attn.q_norm.weight"), &[HD], 8),
        f32_tensor(&format!("{l}self_attn.k_norm.weight"), &[HD], 9),
        f32_tensor(&format!("{l}post_attention_layernorm.weight"), &[D], 10),
        f32_tensor(&format!("{l}pre_feedforward_layernorm.weight"), &[D], 11),
        f32_tensor(&format!("{l}post_feedforward_layernorm.weight"), &[D], 12),
        f32_tensor(&format!("{l}mlp.gate_proj.weight"), &[FF, D], 13),
        f32_tensor(&format!("{l}mlp.up_proj.weight"), &[FF, D], 14),
        f32_tensor(&format!("{l}mlp.down_proj.weight"), &[D, FF], 15),
    ];
    let text = config(
        "Gemma3ForCausalLM",
        &format!(
            r#","head_dim":{HD},"sliding_window":4,"hidden_activation":"gelu_pytorch_tanh",
            "rope_scaling":{{"rope_type":"linear","factor":8.0}},"rope_local_base_freq":10000.0"#
        ),
    );
    let cfg = if multimodal {
        for x in &mut t {
            x.name = x.name.replacen("model.", "model.language_model.", 1);
        }
        t.push(f32_tensor(
            "model.vision_tower.vision_model.post_layernorm.weight",
            &[D],
            16,
        ));
        format!(
            r#"{{"architectures":["Gemma3ForConditionalGeneration"],"model_type":"gemma3",
            "text_config":{text},"vision_config":{{"hidden_size":{D}}}}}"#
        )
    } else {
        text
    };
    std::fs::write(dir.join("config.json"), cfg).unwrap();
    std::fs::write(dir.join("tokenizer.json"), TOKENIZER).unwrap();
    std::fs::write(dir.join("tokenizer_config.json"), TOKENIZER_CONFIG).unwrap();
    write_safetensors(&dir.join("model.safetensors"), &t);
    t
}

#[test]
fn gemma3_norms_are_stored_as_one_plus_w_under_gemma_names() {
    let dir = tempfile::tempdir().unwrap();
    gemma3_dir(dir.path(), false);
    let g = convert(dir.path(), OutType::Stored).unwrap();
    assert_eq!(g.get_str("general.architecture").unwrap(), "gemma3");
    assert_eq!(g.get_str("gemma3.rope.scaling.type").unwrap(), "linear");
    assert!(g.tensor("output.weight").is_none(), "Gemma ties its output");
    for (name, seed, len) in [
        ("output_norm.weight", 2, D),
        ("blk.0.attn_norm.weight", 3, D),
        ("blk.0.attn_q_norm.weight", 8, HD),
        ("blk.0.attn_k_norm.weight", 9, HD),
        ("blk.0.post_attention_norm.weight", 10, D),
        ("blk.0.ffn_norm.weight", 11, D),
        ("blk.0.post_ffw_norm.weight", 12, D),
    ] {
        assert_eq!(g.tensor(name).unwrap().ty, GgmlType::F32, "{name}");
        // The output norm is stored bf16: its values truncated to bf16 (as the test file
        // writes them), then shifted in f32.
        let stored = |v: f32| match name {
            "output_norm.weight" => f32::from_bits(v.to_bits() >> 16 << 16),
            _ => v,
        };
        let want: Vec<f32> = values(seed, len).iter().map(|&v| stored(v) + 1.0).collect();
        assert_eq!(f32s(&g, name), want, "{name}");
    }
    // Matrices are not shifted.
    assert_eq!(f32s(&g, "blk.0.ffn_up.weight"), values(14, FF * D));
}

#[test]
fn multimodal_gemma3_converts_its_text_model_to_the_same_tensors() {
    let (text, mm) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    gemma3_dir(text.path(), false);
    gemma3_dir(mm.path(), true);
    let (a, b) = (
        convert(text.path(), OutType::F16).unwrap(),
        convert(mm.path(), OutType::F16).unwrap(),
    );
    assert_eq!(a.tensors(), b.tensors());
    for t in a.tensors() {
        let other = b.tensor(&t.name).unwrap();
        assert_eq!(a.tensor_data(t), b.tensor_data(other), "{}", t.name);
    }
    for (k, v) in a.metadata() {
        if k != "general.name" {
            assert_eq!(b.get(k), Some(v), "{k}");
        }
    }
}
