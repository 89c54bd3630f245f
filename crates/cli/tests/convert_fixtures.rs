//! `ferrite convert` over every tiny transformers checkpoint in `fixtures/arch/` (or the
//! directory in FERRITE_ARCH_FIXTURES): the GGUF must carry the architecture and
//! hyper-parameters of its config.json, load in ferrite-model, and its tokenizer metadata
//! must reproduce the prompt ids transformers recorded in the logits fixture. Logit accuracy
//! of the converted models is checked by the architecture tests, not here.

mod common;

use std::path::{Path, PathBuf};

use common::{run, text};
use serde_json::Value;

fn fixture_root() -> (PathBuf, bool) {
    match std::env::var_os("FERRITE_ARCH_FIXTURES") {
        Some(dir) if !dir.is_empty() => (PathBuf::from(dir), true),
        _ => (
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/arch"),
            false,
        ),
    }
}

fn checkpoint_dirs(root: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("config.json").is_file())
        .collect();
    dirs.sort();
    dirs
}

/// The GGUF architecture each transformers class converts to. A class missing here fails the
/// test rather than being checked against a guess.
fn expected_arch(config: &Value) -> &'static str {
    match config["architectures"][0].as_str().unwrap_or("") {
        "LlamaForCausalLM" | "MistralForCausalLM" | "MixtralForCausalLM" => "llama",
        "Qwen2ForCausalLM" => "qwen2",
        "Qwen3ForCausalLM" => "qwen3",
        "Qwen3MoeForCausalLM" => "qwen3moe",
        "Gemma2ForCausalLM" => "gemma2",
        "Gemma3ForCausalLM" => "gemma3",
        "Phi3ForCausalLM" => "phi3",
        "Glm4MoeForCausalLM" => "glm4moe",
        "DeepseekV2ForCausalLM" | "DeepseekV3ForCausalLM" => "deepseek2",
        "GptOssForCausalLM" => "gpt-oss",
        other => panic!("no expected GGUF architecture for transformers class {other:?}"),
    }
}

#[test]
fn every_arch_fixture_converts_loads_and_tokenizes_like_transformers() {
    let (root, requested) = fixture_root();
    if !root.is_dir() {
        assert!(
            !requested,
            "FERRITE_ARCH_FIXTURES={} is not a directory",
            root.display()
        );
        println!("skipped: {} not present", root.display());
        return;
    }
    let dirs = checkpoint_dirs(&root);
    assert!(
        !dirs.is_empty(),
        "{} holds no checkpoint directory",
        root.display()
    );
    let out_dir = tempfile::tempdir().unwrap();
    for dir in &dirs {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let out = out_dir.path().join(format!("{name}.gguf"));
        let o = run(&[
            "convert",
            dir.to_str().unwrap(),
            out.to_str().unwrap(),
            "--type",
            "f32",
        ]);
        assert!(o.status.success(), "{name}: {}", text(&o));
        let config: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap())
                .unwrap();
        let g = ferrite_gguf::Gguf::open(&out).unwrap();
        let arch = expected_arch(&config);
        assert_eq!(g.get_str("general.architecture").unwrap(), arch, "{name}");
        let k = |s: &str| format!("{arch}.{s}");
        let num = |key: &str| config[key].as_u64().unwrap();
        assert_eq!(
            g.get_u64(&k("block_count")).unwrap(),
            num("num_hidden_layers"),
            "{name}"
        );
        assert_eq!(
            g.get_u64(&k("embedding_length")).unwrap(),
            num("hidden_size"),
            "{name}"
        );
        // Latent attention is written as one KV head, the latent (llama.cpp's layout).
        let kv_heads = match config.get("kv_lora_rank") {
            Some(rank) => {
                let rope = num("qk_rope_head_dim");
                assert_eq!(
                    g.get_u64(&k("attention.key_length")).unwrap(),
                    rank.as_u64().unwrap() + rope,
                    "{name}"
                );
                1
            }
            None => num("num_key_value_heads"),
        };
        assert_eq!(
            g.get_u64(&k("attention.head_count_kv")).unwrap(),
            kv_heads,
            "{name}"
        );
        let experts = config
            .get("num_local_experts")
            .or_else(|| config.get("num_experts"))
            .or_else(|| config.get("n_routed_experts"))
            .and_then(Value::as_u64);
        assert_eq!(g.get_u64(&k("expert_count")).ok(), experts, "{name}");
        if experts.is_some() {
            // The first expert layer follows the leading dense ones (DeepSeek, GLM).
            let first = config["first_k_dense_replace"].as_u64().unwrap_or(0);
            let stack = format!("blk.{first}.ffn_gate_exps.weight");
            assert!(g.tensor(&stack).is_some(), "{name}: {stack}");
        }
        let rope = config
            .get("rope_parameters")
            .or_else(|| config.get("rope_scaling"));
        let llama3 = rope
            .and_then(|r| r.get("rope_type"))
            .and_then(Value::as_str)
            == Some("llama3");
        assert_eq!(g.tensor("rope_freqs.weight").is_some(), llama3, "{name}");
        if matches!(arch, "llama" | "gpt-oss") {
            assert_eq!(
                g.get_u64(&k("attention.sliding_window")).ok(),
                config.get("sliding_window").and_then(Value::as_u64),
                "{name}"
            );
        }
        let tied = config["tie_word_embeddings"].as_bool().unwrap_or(false);
        assert_eq!(g.tensor("output.weight").is_none(), tied, "{name}");
        if let Ok(t) = std::fs::read_to_string(dir.join("chat_template.jinja")) {
            assert_eq!(g.get_str("tokenizer.chat_template").unwrap(), t, "{name}");
        }
        let tok = ferrite_tokenizer::Tokenizer::from_gguf(&g).unwrap();
        let mut checked = 0;
        for logits in std::fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| e.ok().map(|e| e.path()))
        {
            if logits.extension().is_none_or(|e| e != "jsonl") {
                continue;
            }
            for line in std::fs::read_to_string(&logits).unwrap().lines() {
                let rec: Value = serde_json::from_str(line).unwrap();
                let prompt = rec["prompt"].as_str().unwrap();
                let want: Vec<u32> = rec["prompt_ids"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_u64().unwrap() as u32)
                    .collect();
                assert_eq!(tok.encode(prompt, false, true), want, "{name}: {prompt:?}");
                checked += 1;
            }
        }
        assert!(checked > 0, "{name}: no logits fixture with prompts");
        ferrite_model::Model::load(&out, ferrite_model::LoadOptions::default())
            .unwrap_or_else(|e| panic!("{name}: converted GGUF does not load: {e}"));
        println!(
            "{name}: {arch}, {} tensors, {checked} prompts tokenized",
            g.tensors().len()
        );
    }
}
