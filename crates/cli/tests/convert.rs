//! `ferrite convert` and `-m HF_DIR` end to end on a tiny hand-built Hugging Face directory:
//! the written GGUF loads in ferrite's reader, model and tokenizer; `run -m DIR` converts
//! once into the cache under FERRITE_HOME and reuses it; errors name the problem.

mod common;

use std::path::Path;

use common::{ferrite, run, text};

const D: usize = 32;
const FF: usize = 64;
const HEADS: usize = 4;
const KV: usize = 2;
const VOCAB: usize = 8;

fn write_safetensors(path: &Path, tensors: &[(&str, Vec<usize>)]) {
    let mut header = String::from("{");
    let mut data = Vec::new();
    for (i, (name, shape)) in tensors.iter().enumerate() {
        let n: usize = shape.iter().product();
        let begin = data.len();
        // Small deterministic values: a well-behaved random-looking model.
        data.extend((0..n).flat_map(|k| {
            let x = (((k * 7919 + i * 104_729) % 1000) as f32 / 1000.0 - 0.5) * 0.2;
            x.to_le_bytes()
        }));
        if i > 0 {
            header.push(',');
        }
        header += &format!(
            r#""{name}":{{"dtype":"F32","shape":{shape:?},"data_offsets":[{begin},{}]}}"#,
            data.len()
        );
    }
    header.push('}');
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(&data);
    std::fs::write(path, out).unwrap();
}

fn tiny_llama(dir: &Path, arch: &str) {
    let l = |s: &str| format!("model.layers.0.{s}");
    let names = [
        ("model.embed_tokens.weight".to_owned(), vec![VOCAB, D]),
        ("model.norm.weight".into(), vec![D]),
        (l("input_layernorm.weight"), vec![D]),
        (l("self_attn.q_proj.weight"), vec![HEADS * 8, D]),
        (l("self_attn.k_proj.weight"), vec![KV * 8, D]),
        (l("self_attn.v_proj.weight"), vec![KV * 8, D]),
        (l("self_attn.o_proj.weight"), vec![D, HEADS * 8]),
        (l("post_attention_layernorm.weight"), vec![D]),
        (l("mlp.gate_proj.weight"), vec![FF, D]),
        (l("mlp.up_proj.weight"), vec![FF, D]),
        (l("mlp.down_proj.weight"), vec![D, FF]),
    ];
    let refs: Vec<(&str, Vec<usize>)> =
        names.iter().map(|(n, s)| (n.as_str(), s.clone())).collect();
    write_safetensors(&dir.join("model.safetensors"), &refs);
    let config = format!(
        r#"{{"architectures":["{arch}"],"num_hidden_layers":1,"hidden_size":{D},
        "intermediate_size":{FF},"num_attention_heads":{HEADS},"num_key_value_heads":{KV},
        "vocab_size":{VOCAB},"rms_norm_eps":1e-5,"rope_theta":10000.0,
        "max_position_embeddings":64,"tie_word_embeddings":true}}"#
    );
    std::fs::write(dir.join("config.json"), config).unwrap();
    let tokenizer = r#"{"added_tokens":[{"id":6,"content":"<|im_end|>","special":true}],
      "pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false,"use_regex":true},
      "model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2,"Ġ":3,"Ġab":4,"c":5},
               "merges":["a b","Ġ ab"]}}"#;
    std::fs::write(dir.join("tokenizer.json"), tokenizer).unwrap();
    std::fs::write(
        dir.join("tokenizer_config.json"),
        r#"{"eos_token":"<|im_end|>"}"#,
    )
    .unwrap();
}

#[test]
fn convert_writes_a_gguf_that_ferrite_loads() {
    let dir = tempfile::tempdir().unwrap();
    let hf = dir.path().join("tiny-llama");
    std::fs::create_dir(&hf).unwrap();
    tiny_llama(&hf, "LlamaForCausalLM");
    let out = dir.path().join("tiny.gguf");
    let o = run(&[
        "convert",
        hf.to_str().unwrap(),
        out.to_str().unwrap(),
        "--type",
        "q8_0",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("arch llama, 11 tensors"), "{stdout}");
    assert!(stdout.contains("Q8_0"), "{stdout}");
    let g = ferrite_gguf::Gguf::open(&out).unwrap();
    assert_eq!(g.get_u32("general.file_type").unwrap(), 7);
    ferrite_model::Model::load(&out, ferrite_model::LoadOptions::default())
        .expect("converted GGUF loads in ferrite-model");
    let tok = ferrite_tokenizer::Tokenizer::from_gguf(&g).unwrap();
    assert_eq!(tok.encode("ab ab", false, false), [2, 4]);
    // No temporary file is left next to the output.
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .contains(".ferrite-convert-")
        })
        .collect();
    assert!(leftovers.is_empty());
}

#[test]
fn run_takes_a_hf_dir_and_converts_it_once_into_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let hf = dir.path().join("m");
    std::fs::create_dir(&hf).unwrap();
    tiny_llama(&hf, "LlamaForCausalLM");
    let go = || {
        ferrite()
            .env("FERRITE_HOME", &home)
            .args(["run", "-m", hf.to_str().unwrap(), "--raw", "--temp", "0"])
            .args(["--max-tokens", "3", "ab"])
            .output()
            .unwrap()
    };
    let first = go();
    assert!(first.status.success(), "{}", text(&first));
    assert!(
        String::from_utf8_lossy(&first.stderr).contains("converting"),
        "{}",
        text(&first)
    );
    let cached: Vec<_> = std::fs::read_dir(home.join("converted")).unwrap().collect();
    assert_eq!(cached.len(), 1, "one cache file");
    let second = go();
    assert!(second.status.success(), "{}", text(&second));
    assert!(
        !String::from_utf8_lossy(&second.stderr).contains("converting"),
        "reused"
    );
    assert_eq!(first.stdout, second.stdout, "same model, same greedy text");
}

#[test]
fn convert_applies_quantization_mixes_through_the_quantizer() {
    let dir = tempfile::tempdir().unwrap();
    let hf = dir.path().join("tiny-llama");
    std::fs::create_dir(&hf).unwrap();
    tiny_llama(&hf, "LlamaForCausalLM");
    // llama.cpp's file_type codes of the mixes.
    for (mix, file_type) in [("q4_0", 2), ("q4_k_m", 15)] {
        let out = dir.path().join(format!("tiny-{mix}.gguf"));
        let o = run(&[
            "convert",
            hf.to_str().unwrap(),
            out.to_str().unwrap(),
            "--type",
            mix,
        ]);
        assert!(o.status.success(), "{}", text(&o));
        let g = ferrite_gguf::Gguf::open(&out).unwrap();
        assert_eq!(g.get_u32("general.file_type").unwrap(), file_type, "{mix}");
        ferrite_model::Model::load(&out, ferrite_model::LoadOptions::default())
            .expect("the quantized conversion loads");
    }
    let g = ferrite_gguf::Gguf::open(&dir.path().join("tiny-q4_0.gguf")).unwrap();
    assert!(
        g.tensors()
            .iter()
            .any(|t| t.ty == ferrite_gguf::GgmlType::Q4_0)
    );
    // Neither the stored intermediate nor any temporary file is left behind.
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| !n.starts_with('.')), "{names:?}");
}

#[test]
fn errors_name_the_missing_file_unsupported_arch_and_type() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("o.gguf");
    let o = run(&[
        "convert",
        dir.path().to_str().unwrap(),
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("config.json"),
        "{}",
        text(&o)
    );

    tiny_llama(dir.path(), "FalconForCausalLM");
    let o = run(&[
        "convert",
        dir.path().to_str().unwrap(),
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains("unsupported architecture \"FalconForCausalLM\""),
        "{stderr}"
    );
    assert!(!out.exists(), "no output on failure");

    tiny_llama(dir.path(), "LlamaForCausalLM");
    let o = run(&[
        "convert",
        dir.path().to_str().unwrap(),
        out.to_str().unwrap(),
        "--type",
        "q3_xyz",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains("q3_xyz") && stderr.contains("q4_k_m"),
        "{stderr}"
    );

    let o = run(&["inspect", dir.path().join("nope").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    let empty = tempfile::tempdir().unwrap();
    let o = run(&["inspect", empty.path().to_str().unwrap()]);
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("without config.json"),
        "{}",
        text(&o)
    );
}
