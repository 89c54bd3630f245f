//! `ferrite run`'s session files (`--load-session`, `--save-session`, the chat's `/save`
//! and `/load`): the KV cache, tokens and chat messages written and restored through
//! `ferrite-kvstore`'s snapshot format. A file that does not fit is reported and never
//! used; this module must never write over an input of the run.

use std::time::Instant;

use anyhow::Context;
use ferrite_engine::AnySession;
use ferrite_kvstore::{Compat, SnapshotBackend};
use ferrite_model::KvType;

use super::Loaded;
use crate::outputs::check_not_an_input;

/// What a session file must agree with: this model file, precision, KV type, context and
/// backend (the CUDA cache is always f16; see docs/kv-snapshot-format.md on backends).
fn session_compat(loaded: &Loaded) -> anyhow::Result<Compat> {
    // Digests are remembered under the ferrite home, keyed by file version.
    let cache = ferrite_files::home();
    let sha = ferrite_kvstore::model_sha256(&loaded.path, cache.as_deref())
        .with_context(|| format!("hashing {}", loaded.path.display()))?;
    Ok(match loaded.cuda {
        Some(_) => Compat {
            backend: SnapshotBackend::Cuda,
            ..Compat::for_session(&loaded.model, sha, KvType::F16, loaded.ctx)
        },
        None => Compat::for_session(&loaded.model, sha, loaded.kv, loaded.ctx),
    })
}

/// Writes the session's KV cache, tokens and chat messages to `path` (atomically).
pub(super) fn save_session(
    loaded: &Loaded,
    session: &AnySession<'_>,
    path: &std::path::Path,
    messages: &[serde_json::Value],
) -> anyhow::Result<()> {
    // Also reached from the chat's `/save PATH`, whose path no flag check saw.
    check_not_an_input("the session file", path, &[("model", &loaded.path)])?;
    let state = session.export_state()?;
    let meta = serde_json::to_vec(&serde_json::json!({ "messages": messages }))?;
    let bytes = ferrite_kvstore::write_snapshot(path, &session_compat(loaded)?, &state, &meta)
        .with_context(|| format!("saving the session to {}", path.display()))?;
    eprintln!(
        "session: saved {} tokens ({bytes} bytes) to {}",
        state.n_tokens(),
        path.display()
    );
    Ok(())
}

/// Restores a session file into `session`: its tokens and, when it has them, its chat
/// messages. A file that cannot be used (another model or setting, damaged, missing) is
/// reported and `None` returned, so the caller starts fresh.
#[allow(clippy::type_complexity)]
pub(super) fn try_load(
    loaded: &Loaded,
    session: &mut AnySession<'_>,
    path: &std::path::Path,
) -> anyhow::Result<Option<(Vec<u32>, Option<Vec<serde_json::Value>>)>> {
    let sha_start = Instant::now();
    let compat = session_compat(loaded)?;
    let sha_ms = sha_start.elapsed().as_secs_f64() * 1e3;
    let read_start = Instant::now();
    let snap = match ferrite_kvstore::read_snapshot(path, &compat) {
        Ok(s) => s,
        Err(e) => {
            eprintln!(
                "note: not using session file {}: {e}; starting fresh",
                path.display()
            );
            return Ok(None);
        }
    };
    let read_ms = read_start.elapsed().as_secs_f64() * 1e3;
    let n = snap.state.n_tokens();
    let import_start = Instant::now();
    if let Err(e) = session.import_state(&snap.state) {
        eprintln!(
            "note: not using session file {}: {e:#}; starting fresh",
            path.display()
        );
        return Ok(None);
    }
    eprintln!(
        "session: model sha256 {sha_ms:.1} ms, read and checked {} KV bytes in {read_ms:.1} ms, \
         restored in {:.1} ms",
        snap.state.kv.len(),
        import_start.elapsed().as_secs_f64() * 1e3
    );
    let messages = serde_json::from_slice::<serde_json::Value>(&snap.meta)
        .ok()
        .and_then(|v| v.get("messages").and_then(|m| m.as_array()).cloned());
    eprintln!("session: restored {n} tokens from {}", path.display());
    Ok(Some((snap.state.tokens, messages)))
}
