//! The restart half of item `kv-snapshot`: a prompt-prefix snapshot written to the disk
//! cache by one server is reused by a new server (a new engine, a new process's state)
//! started on the same directory.
//!
//! The oracle: the second server reports the prefix as cached from disk
//! (`cached_tokens` > 0, `cache_source` "disk") and its answer (text and every token's
//! log-probability, as JSON numbers that round-trip the f32 bits) equals the first
//! server's, which computed the whole prompt. The planted defect is a server started on an
//! empty directory: it reuses nothing, and the oracle must say so. The snapshots live in a
//! temporary directory removed afterwards; nothing here touches the user's cache.

use std::time::Duration;

use serde_json::{Value, json};

use super::http::{GateServer, MODEL_ID, ServerOpts, wait_for};
use super::{Proof, Target};

/// A server on `dir` with no memory cache (so only the disk can supply a prefix).
fn on(t: &Target, dir: &std::path::Path) -> anyhow::Result<GateServer> {
    GateServer::start(
        t.path()?,
        ServerOpts {
            ctx: 512,
            parallel: 1,
            prefill_chunk: 128,
            kv_mem_bytes: 0,
            kv_disk_dir: Some(dir.to_path_buf()),
        },
    )
}

/// The greedy answer of the restart prompt: (choice, cached tokens, cache source).
fn answer(s: &GateServer) -> anyhow::Result<(Value, u64, String)> {
    let prompt = "A short history of the lighthouse keepers of the northern coast. ".repeat(20);
    let body = json!({"model": MODEL_ID, "prompt": prompt, "max_tokens": 4, "temperature": 0,
        "logprobs": 1});
    let r = s.post("/v1/completions", &body)?;
    let v = r
        .json()
        .filter(|_| r.status == 200)
        .ok_or_else(|| anyhow::anyhow!("/v1/completions answered {}: {}", r.status, r.excerpt()))?;
    let u = &v["usage"];
    Ok((
        v["choices"][0].clone(),
        u["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0),
        u["ferrite"]["cache_source"]
            .as_str()
            .unwrap_or("")
            .to_owned(),
    ))
}

/// `None` when `got` reused a disk snapshot and answered exactly `want`.
fn problem(got: &(Value, u64, String), want: &Value) -> Option<String> {
    let (choice, cached, source) = got;
    if *cached == 0 || source != "disk" {
        return Some(format!(
            "the restarted server reused nothing ({cached} cached tokens, source {source:?})"
        ));
    }
    (choice != want).then(|| format!("the reused answer differs: {choice} vs {want}"))
}

/// (planted, real) proofs of restart reuse.
pub fn reuse(t: &Target) -> anyhow::Result<(Proof, Proof)> {
    let dir = tempfile::tempdir()?;
    let first = on(t, dir.path())?;
    let (want, cached, _) = answer(&first)?;
    anyhow::ensure!(
        cached == 0,
        "the first server found {cached} tokens cached in an empty directory"
    );
    let written = wait_for(Duration::from_secs(30), || {
        Ok(first.metric("ferrite_kv_disk_written_total")? >= 1.0)
    })?;
    drop(first);
    let second = on(t, dir.path())?;
    let got = answer(&second)?;
    drop(second);
    let empty = tempfile::tempdir()?;
    let fresh = answer(&on(t, empty.path())?)?;
    let planted = match problem(&fresh, &want) {
        Some(p) => Proof::new(false, format!("server on an empty directory: {p}")),
        None => Proof::new(true, "a server with no snapshot passed as reusing one"),
    };
    let real = match (written, problem(&got, &want)) {
        (false, _) => Proof::new(false, "the first server wrote no snapshot within 30 s"),
        (true, Some(p)) => Proof::new(false, p),
        (true, None) => Proof::new(
            true,
            format!(
                "a restarted server reused {} prompt tokens from disk and answered the same text \
                 and log-probabilities",
                got.1
            ),
        ),
    };
    Ok((planted, real.count("restart_cached_tokens", got.1 as usize)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reuse_needs_a_disk_hit_and_the_same_answer() {
        let want = json!({"text": " the", "logprobs": {"token_logprobs": [-0.5]}});
        assert_eq!(problem(&(want.clone(), 192, "disk".into()), &want), None);
        let other = json!({"text": " the", "logprobs": {"token_logprobs": [-0.25]}});
        for got in [
            (want.clone(), 0, "none".to_owned()),
            (want.clone(), 192, "memory".to_owned()),
            (other, 192, "disk".to_owned()),
        ] {
            assert!(problem(&got, &want).is_some(), "{got:?}");
        }
    }
}
