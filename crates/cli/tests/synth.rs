//! `ferrite synth`: tiny random models load, run to finite log-probabilities, and are
//! byte-identical for one seed and different for another.

mod common;

use std::path::Path;

fn synth(out: &Path, extra: &[&str]) {
    let mut args = vec!["synth", "-o", out.to_str().unwrap()];
    args.extend_from_slice(extra);
    let o = common::run(&args);
    assert!(o.status.success(), "{}", common::text(&o));
}

const TINY: [&str; 10] = [
    "--hidden",
    "64",
    "--layers",
    "2",
    "--heads",
    "4",
    "--kv-heads",
    "2",
    "--ffn",
    "128",
];

/// `inspect` succeeds and `run --raw --temp 0` produces 4 tokens with finite log-probs.
fn loads_and_runs(model: &Path) {
    let m = model.to_str().unwrap();
    let o = common::run(&["inspect", m]);
    assert!(o.status.success(), "{}", common::text(&o));
    let dir = tempfile::tempdir().unwrap();
    let dump = dir.path().join("lp.jsonl");
    let o = common::run(&[
        "run",
        "-m",
        m,
        "--raw",
        "--max-tokens",
        "4",
        "--temp",
        "0",
        "--dump-logprobs",
        dump.to_str().unwrap(),
        "hello world",
    ]);
    assert!(o.status.success(), "{}", common::text(&o));
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&dump)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        !lines.is_empty(),
        "no tokens generated: {}",
        common::text(&o)
    );
    for l in &lines {
        let lp = l["logprob"].as_f64();
        assert!(
            lp.is_some_and(|v| v.is_finite() && v <= 0.0),
            "bad logprob {l}"
        );
    }
}

#[test]
fn tiny_llama_loads_runs_and_is_deterministic() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b, c) = (
        dir.path().join("a.gguf"),
        dir.path().join("b.gguf"),
        dir.path().join("c.gguf"),
    );
    let with = |seed: &'static str| {
        let mut v = TINY.to_vec();
        v.extend(["--vocab", "300", "--type", "q8_0", "--seed", seed]);
        v
    };
    synth(&a, &with("1"));
    synth(&b, &with("1"));
    synth(&c, &with("2"));
    let (ba, bb, bc) = (
        std::fs::read(&a).unwrap(),
        std::fs::read(&b).unwrap(),
        std::fs::read(&c).unwrap(),
    );
    assert_eq!(ba, bb, "same seed must give identical bytes");
    assert_eq!(ba.len(), bc.len());
    assert_ne!(ba, bc, "a different seed must change the weights");
    // The pre-tokenizer name is the one llama.cpp's loader accepts, so both engines can be
    // measured on a synthetic file.
    let g = ferrite_gguf::Gguf::open(&a).unwrap();
    assert_eq!(
        g.get("tokenizer.ggml.pre").and_then(|v| v.as_str()),
        Some("gpt-2")
    );
    loads_and_runs(&a);
}

#[test]
fn tiny_gemma3_q4_k_m_loads_and_runs() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("g.gguf");
    // hidden 256 keeps rows whole Q4_K/Q6_K blocks, so the K-quant path is the one tested.
    synth(
        &out,
        &[
            "--arch",
            "gemma3",
            "--hidden",
            "256",
            "--layers",
            "2",
            "--heads",
            "4",
            "--kv-heads",
            "1",
            "--ffn",
            "512",
            "--vocab",
            "260",
            "--type",
            "q4_k_m",
        ],
    );
    let o = common::run(&["inspect", out.to_str().unwrap(), "--json"]);
    assert!(o.status.success(), "{}", common::text(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let types: Vec<&str> = j["totals_by_type"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["type"].as_str().unwrap())
        .collect();
    for t in ["Q4_K", "Q6_K", "F32"] {
        assert!(types.contains(&t), "{t} missing from {types:?}");
    }
    loads_and_runs(&out);
}

#[test]
fn tokenizer_copied_from_a_real_model() {
    let model = common::pull("smollm2-135m-instruct");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t.gguf");
    let mut args = TINY.to_vec();
    args.extend([
        "--tokenizer-from",
        model.to_str().unwrap(),
        "--type",
        "q4_1",
    ]);
    synth(&out, &args);
    let o = common::run(&["inspect", out.to_str().unwrap(), "--json"]);
    assert!(o.status.success(), "{}", common::text(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["architecture"]["vocab"], 49152);
    loads_and_runs(&out);
}

#[test]
fn missing_shape_and_bad_heads_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.gguf");
    let o = common::run(&["synth", "-o", out.to_str().unwrap(), "--hidden", "64"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--layers is required"));
    let o = common::run(&[
        "synth",
        "-o",
        out.to_str().unwrap(),
        "--hidden",
        "64",
        "--layers",
        "1",
        "--heads",
        "4",
        "--kv-heads",
        "3",
        "--ffn",
        "64",
        "--vocab",
        "256",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("must divide"));
    // A shape no machine holds is refused before any tensor is made (this aborted on a failed
    // allocation before).
    let o = common::run(&[
        "synth",
        "-o",
        out.to_str().unwrap(),
        "--hidden",
        "1000000000",
        "--layers",
        "1",
        "--heads",
        "2",
        "--kv-heads",
        "1",
        "--ffn",
        "128",
        "--vocab",
        "300",
    ]);
    let text = common::text(&o);
    assert_eq!(o.status.code(), Some(1), "{text}");
    assert!(text.contains("this machine's memory"), "{text}");
    assert!(!out.exists());
}

#[test]
fn preset_shape_with_a_flag_override() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("p.gguf");
    // The SmolLM2 shape with one layer instead of 30; 576-wide rows are not whole Q4_K
    // blocks, so q4_k_m falls back to Q5_0 / Q8_0 (the documented rule).
    synth(
        &out,
        &[
            "--preset",
            "smollm2-135m",
            "--layers",
            "1",
            "--type",
            "q4_k_m",
        ],
    );
    let o = common::run(&["inspect", out.to_str().unwrap(), "--json"]);
    assert!(o.status.success(), "{}", common::text(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let a = &j["architecture"];
    assert_eq!(
        (
            &a["layers"],
            &a["embedding"],
            &a["heads"],
            &a["kv_heads"],
            &a["ffn"],
            &a["vocab"]
        ),
        (
            &1.into(),
            &576.into(),
            &9.into(),
            &3.into(),
            &1536.into(),
            &49152.into()
        )
    );
    let types: Vec<&str> = j["totals_by_type"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["type"].as_str().unwrap())
        .collect();
    assert!(
        types.contains(&"Q5_0") && types.contains(&"Q8_0"),
        "{types:?}"
    );
    assert!(!types.contains(&"Q4_K"), "{types:?}");
}

#[test]
fn tiny_qwen3_loads_as_qwen3_and_runs() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("q.gguf");
    let mut args = TINY.to_vec();
    args.extend(["--arch", "qwen3", "--vocab", "300", "--type", "q8_0"]);
    synth(&out, &args);
    let g = ferrite_gguf::Gguf::open(&out).unwrap();
    assert_eq!(
        g.get_str("general.architecture").unwrap(),
        "qwen3",
        "written as qwen3"
    );
    // Qwen 3's q/k norms are present, Gemma's post norms are not.
    assert!(g.tensor("blk.0.attn_q_norm.weight").is_some());
    assert!(g.tensor("blk.0.post_attention_norm.weight").is_none());
    let m = ferrite_model::Model::load(&out, ferrite_model::LoadOptions::default()).unwrap();
    assert_eq!(m.config().arch, ferrite_model::Arch::Qwen3);
    loads_and_runs(&out);
}

#[test]
fn tiny_qwen3next_loads_as_a_hybrid_and_runs() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("h.gguf");
    let mut args = TINY.to_vec();
    args.extend(["--arch", "qwen3next", "--vocab", "300", "--type", "q8_0"]);
    synth(&out, &args);
    let m = ferrite_model::Model::load(&out, ferrite_model::LoadOptions::default()).unwrap();
    let c = m.config();
    assert_eq!(c.arch, ferrite_model::Arch::Qwen3Next);
    // Layers 0..3 are DeltaNets, every fourth one attention: recurrent state beside K/V.
    assert!(c.is_delta_net(0) && !c.is_delta_net(3));
    assert!(c.state_slots().0 > 0 && c.kv_layers() < c.n_layer);
    loads_and_runs(&out);
}

#[test]
fn tiny_nemotron_h_loads_its_blocks_and_runs() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("h.gguf");
    let mut args = TINY.to_vec();
    args.extend(["--arch", "nemotron_h", "--vocab", "300", "--type", "q8_0"]);
    // Its first attention block is the seventh.
    let o = common::run(&[&["synth", "-o", out.to_str().unwrap()], &args[..]].concat());
    let said = common::text(&o);
    assert!(
        !o.status.success() && said.contains("at least 7 --layers"),
        "{said}"
    );
    args[3] = "8";
    synth(&out, &args);
    let m = ferrite_model::Model::load(&out, ferrite_model::LoadOptions::default()).unwrap();
    let c = m.config();
    assert_eq!(c.arch, ferrite_model::Arch::NemotronH);
    use ferrite_model::Kept;
    let kept: Vec<Kept> = (0..c.n_layer).map(|l| c.kept(l)).collect();
    // Mamba-2 and MLP blocks alternate; block 6 is attention.
    assert_eq!(kept[..2], [Kept::State, Kept::Nothing]);
    assert_eq!((kept[6], c.kv_layers()), (Kept::Kv, 1));
    loads_and_runs(&out);
}
