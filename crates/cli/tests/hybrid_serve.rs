//! `ferrite serve` on each hybrid recurrent model of fixtures/hybrid (Qwen3-Next's gated
//! DeltaNet, Nemotron-H's Mamba-2; `FERRITE_HYBRID_FIXTURES` overrides the directory),
//! converted to f32 GGUF: continuous batching and the prefix cache with the recurrent state. Oracles:
//! greedy answers and their top log-probs from two slots batched equal those of a server
//! answering one request at a time (bit for bit: the JSON numbers are equal); a slot that
//! holds the prompt reuses it up to its nearest recurrent-state checkpoint and reports only
//! that as cached; after a restart, the disk cache restores the block-aligned prefix with
//! its state (`cache_source = disk`) and the answer is again the one computed from scratch.

mod common;
mod server_util;

use std::path::Path;

use serde_json::{Value, json};
use server_util::Server;

const BLOCK: usize = 64;

fn start(model: &Path, parallel: &str, disk: &Path) -> Server {
    let (model, disk) = (model.display().to_string(), disk.display().to_string());
    Server::start(&[
        "-m",
        &model,
        "--ctx",
        "512",
        "--threads",
        "2",
        "--parallel",
        parallel,
        "--kv-disk-dir",
        &disk,
    ])
}

fn prompt(n: usize, salt: usize) -> Vec<u32> {
    (0..n).map(|i| (3 + (i * 37 + salt) % 500) as u32).collect()
}

/// (choice with its log-probs, cached_tokens, cache_source) of a greedy completion.
fn complete(server: &Server, prompt: &[u32]) -> (Value, u64, String) {
    let body = json!({"prompt": prompt, "max_tokens": 6, "temperature": 0, "logprobs": 3});
    let r = server.post("/v1/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let v: Value = r.json();
    let u = &v["usage"]["ferrite"];
    (
        v["choices"][0].clone(),
        u["cached_tokens"].as_u64().unwrap(),
        u["cache_source"].as_str().unwrap().to_owned(),
    )
}

#[test]
fn hybrid_sessions_batch_exactly_and_restore_from_the_disk_cache() {
    for dir in common::model_dirs("FERRITE_HYBRID_FIXTURES", "hybrid") {
        println!("{}", dir.display());
        batch_and_restore(&dir);
    }
}

fn batch_and_restore(dir: &Path) {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("hybrid.gguf");
    let o = common::run(&[
        "convert",
        dir.to_str().unwrap(),
        model.to_str().unwrap(),
        "--type",
        "f32",
    ]);
    assert!(o.status.success(), "{}", common::text(&o));
    let prompts = [prompt(150, 0), prompt(90, 11)];
    // One request at a time, from scratch.
    let alone: Vec<Value> = {
        let disk = tempfile::tempdir().unwrap();
        let s = start(&model, "1", disk.path());
        prompts.iter().map(|p| complete(&s, p).0).collect()
    };
    let disk = tempfile::tempdir().unwrap();
    {
        let s = start(&model, "2", disk.path());
        let batched: Vec<Value> = std::thread::scope(|sc| {
            let hs: Vec<_> = prompts
                .iter()
                .map(|p| {
                    let s = &s;
                    sc.spawn(move || complete(s, p).0)
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(
            batched, alone,
            "batched slots against one request at a time"
        );
        // The disk writer runs in the background: wait for the first prompt's checkpoint.
        let written = (0..200).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(50));
            s.log().matches("kv-cache: wrote").count() == prompts.len()
        });
        assert!(written, "checkpoints not written:\n{}", s.log());
        // The same prompt again: a slot reuses what it holds only up to the recurrent
        // state's nearest checkpoint, and reports no more than that as cached.
        let (choice, cached, _) = complete(&s, &prompts[0]);
        assert_eq!(cached, (150 / BLOCK * BLOCK) as u64, "{}", s.log());
        assert_eq!(choice, alone[0], "continued from a held checkpoint");
    }
    // A restarted server restores the first prompt's block-aligned prefix from disk.
    let s = start(&model, "1", disk.path());
    let (choice, cached, source) = complete(&s, &prompts[0]);
    assert_eq!(
        (cached, source.as_str()),
        ((150 / BLOCK * BLOCK) as u64, "disk")
    );
    assert_eq!(choice, alone[0], "continued from the disk cache");
}
