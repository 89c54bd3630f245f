//! A SentencePiece `tokenizer.model` converts to `tokenizer.ggml.model = "llama"` metadata
//! with which ferrite's tokenizer reproduces sentencepiece's own ids. Oracle:
//! `data/spm-tiny/ids.jsonl`, written by sentencepiece (see data/spm-tiny/README.md).

mod common;

use std::path::Path;

use common::{f32_tensor, write_safetensors};
use ferrite_convert::{HfModel, OutType};
use ferrite_gguf::Gguf;

fn spm_dir(dir: &Path) {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/spm-tiny");
    std::fs::copy(data.join("tokenizer.model"), dir.join("tokenizer.model")).unwrap();
    let (d, v) = (16, 512);
    let l = |s: &str| format!("model.layers.0.{s}");
    let t = vec![
        f32_tensor("model.embed_tokens.weight", &[v, d], 1),
        f32_tensor("model.norm.weight", &[d], 2),
        f32_tensor(&l("input_layernorm.weight"), &[d], 3),
        f32_tensor(&l("self_attn.q_proj.weight"), &[d, d], 4),
        f32_tensor(&l("self_attn.k_proj.weight"), &[d, d], 5),
        f32_tensor(&l("self_attn.v_proj.weight"), &[d, d], 6),
        f32_tensor(&l("self_attn.o_proj.weight"), &[d, d], 7),
        f32_tensor(&l("post_attention_layernorm.weight"), &[d], 8),
        f32_tensor(&l("mlp.gate_proj.weight"), &[d, d], 9),
        f32_tensor(&l("mlp.up_proj.weight"), &[d, d], 10),
        f32_tensor(&l("mlp.down_proj.weight"), &[d, d], 11),
    ];
    write_safetensors(&dir.join("model.safetensors"), &t);
    std::fs::write(
        dir.join("config.json"),
        format!(
            r#"{{"architectures":["MistralForCausalLM"],"num_hidden_layers":1,"hidden_size":{d},
            "intermediate_size":{d},"num_attention_heads":2,"vocab_size":{v},
            "bos_token_id":1,"eos_token_id":2,"tie_word_embeddings":true,"sliding_window":null}}"#
        ),
    )
    .unwrap();
    std::fs::write(
        dir.join("tokenizer_config.json"),
        r#"{"add_bos_token":true,"bos_token":"<s>","eos_token":"</s>",
        "added_tokens_decoder":{"1":{"content":"<s>","special":true},"2":{"content":"</s>","special":true}}}"#,
    )
    .unwrap();
}

#[test]
fn sentencepiece_model_converts_and_tokenizes_like_sentencepiece() {
    let dir = tempfile::tempdir().unwrap();
    spm_dir(dir.path());
    let m = HfModel::open(dir.path()).unwrap();
    let g = Gguf::from_bytes(
        m.to_gguf(OutType::F32, &mut |_| {})
            .unwrap()
            .0
            .to_bytes()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(g.get_str("tokenizer.ggml.model").unwrap(), "llama");
    assert!(g.get("tokenizer.ggml.merges").is_none());
    assert!(
        g.get("llama.attention.sliding_window").is_none(),
        "null window"
    );
    let tokens = g.get_str_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(
        (tokens.len(), tokens[1], tokens[511]),
        (512, "<s>", "[PAD511]")
    );
    let types = g.get_i32_array("tokenizer.ggml.token_type").unwrap();
    assert_eq!((types[0], types[1], types[4], types[511]), (2, 3, 6, 5));
    assert_eq!(
        g.get_f32_array("tokenizer.ggml.scores").unwrap()[511],
        -10000.0
    );
    assert!(g.get_bool("tokenizer.ggml.add_bos_token").unwrap());
    let tok = ferrite_tokenizer::Tokenizer::from_gguf(&g).unwrap();
    let ids = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/spm-tiny/ids.jsonl"),
    )
    .unwrap();
    let mut n = 0;
    for line in ids.lines() {
        let rec: serde_json::Value = serde_json::from_str(line).unwrap();
        let text = rec["text"].as_str().unwrap();
        let want: Vec<u32> = rec["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(tok.encode(text, false, false), want, "{text:?}");
        let mut with_bos = vec![1];
        with_bos.extend(&want);
        assert_eq!(tok.encode(text, true, false), with_bos, "{text:?}");
        n += 1;
    }
    assert_eq!(n, 10);
}
