//! Items `batched` and `kv-snapshot`: the two exactness promises of the CPU engine. A row of
//! a batch step equals the session stepped alone, and a session restored from a snapshot
//! continues exactly as the session that wrote it (docs/ARCHITECTURE.md, "Decisions").
//!
//! The oracle is bit equality of logits rows, computed in the same run; nothing here compares
//! with a tolerance, and nothing here may write outside memory (snapshots are encoded to
//! bytes, which is what the file reader reads). `kv-snapshot` also runs `restart`'s check,
//! which goes through the disk cache of two servers.

use ferrite_kvstore::{Compat, encode};
use ferrite_model::{Batch, KvType, Outputs, Precision, Session};

use super::{Env, Outcome, Proof, Target, argmax, same_bits};
use crate::run::Loaded;

/// Prompts of the sessions; any text works, they only need to differ.
pub(super) const PROMPTS: [&str; 3] = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:",
    "Once upon a time, in a village by the sea, there lived",
];

/// Each session's prompt, then the rows of `steps` single-token steps fed `inputs[i][k]`,
/// every session alone.
fn alone(
    l: &Loaded,
    prompts: &[Vec<u32>],
    inputs: &[Vec<u32>],
) -> anyhow::Result<Vec<Vec<Vec<f32>>>> {
    let mut out = Vec::new();
    for (p, feed) in prompts.iter().zip(inputs) {
        let mut s = Session::new(&l.model, &l.pool, 256, KvType::F16)?;
        s.eval(p, Outputs::Last)?;
        let mut rows = Vec::new();
        for &t in feed {
            rows.push(s.eval(&[t], Outputs::Last)?.data.to_vec());
        }
        out.push(rows);
    }
    Ok(out)
}

/// The first (session, step) whose batched row differs from `want`'s.
fn first_difference(got: &[Vec<Vec<f32>>], want: &[Vec<Vec<f32>>]) -> Option<(usize, usize)> {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        for (k, (a, b)) in g.iter().zip(w).enumerate() {
            if !same_bits(a, b) {
                return Some((i, k));
            }
        }
    }
    None
}

pub(super) fn exact_proof(got: &[Vec<Vec<f32>>], want: &[Vec<Vec<f32>>], what: &str) -> Proof {
    let rows: usize = got.iter().map(Vec::len).sum();
    match first_difference(got, want) {
        None => Proof::new(true, format!("{rows} {what} rows bit-identical")),
        Some((i, k)) => Proof::new(false, format!("session {i} step {k}: {what} row differs")),
    }
    .count("rows", rows)
}

/// Item `batched`.
pub fn batched(env: &Env, t: &Target) -> anyhow::Result<Outcome> {
    let l = t.cpu(env, Precision::Default)?;
    let steps = if env.quick { 4 } else { 12 };
    let prompts: Vec<Vec<u32>> = PROMPTS
        .iter()
        .map(|p| l.tokenizer.encode(p, true, false))
        .collect();
    // Each session is fed its own greedy continuation, so the batch sees the tokens a
    // server would.
    let mut inputs = Vec::new();
    for p in &prompts {
        let mut s = Session::new(&l.model, &l.pool, 256, KvType::F16)?;
        let mut next = argmax(s.eval(p, Outputs::Last)?.data);
        let mut feed = Vec::new();
        for _ in 0..steps {
            feed.push(next);
            next = argmax(s.eval(&[next], Outputs::Last)?.data);
        }
        inputs.push(feed);
    }
    let mut sessions = Vec::new();
    for p in &prompts {
        let mut s = Session::new(&l.model, &l.pool, 256, KvType::F16)?;
        s.eval(p, Outputs::Last)?;
        sessions.push(s);
    }
    let mut batch = Batch::new(PROMPTS.len())?;
    let mut got = vec![Vec::new(); PROMPTS.len()];
    for k in 0..steps {
        let feed: Vec<[u32; 1]> = inputs.iter().map(|f| [f[k]]).collect();
        let feed: Vec<&[u32]> = feed.iter().map(|f| &f[..]).collect();
        let mut refs: Vec<&mut Session<'_>> = sessions.iter_mut().collect();
        let logits = batch.step(&mut refs, &feed)?;
        for (i, rows) in got.iter_mut().enumerate() {
            let row = logits
                .row(i)
                .ok_or_else(|| anyhow::anyhow!("batch step returned no row {i}"))?;
            rows.push(row.to_vec());
        }
    }
    let mut swapped = inputs.clone();
    swapped[0][1] = swapped[0][1].wrapping_add(1) % l.model.config().n_vocab as u32;
    let planted = exact_proof(
        &got,
        &alone(l, &prompts, &swapped)?,
        "batched vs swapped-token",
    );
    let real = exact_proof(&got, &alone(l, &prompts, &inputs)?, "batched vs alone");
    Ok(Outcome::Judged { planted, real })
}

/// Byte offsets to flip: every header byte, then `n` spread over the payload.
fn flip_offsets(len: usize, n: usize) -> Vec<usize> {
    let header = ferrite_kvstore::HEADER_LEN.min(len);
    let mut at: Vec<usize> = (0..header).collect();
    let payload = len - header;
    if payload > 0 {
        at.extend((0..n).map(|i| header + i * payload / n));
        at.push(len - 1);
    }
    at.dedup();
    at
}

/// Item `kv-snapshot`.
pub fn kv_snapshot(env: &Env, t: &Target) -> anyhow::Result<Outcome> {
    let l = t.cpu(env, Precision::Default)?;
    let sha = t
        .sha256
        .as_deref()
        .ok_or_else(|| anyhow::anyhow!("no sha256 of the model file"))?;
    let mut digest = [0u8; 32];
    for (d, pair) in digest.iter_mut().zip(sha.as_bytes().chunks(2)) {
        *d = u8::from_str_radix(std::str::from_utf8(pair)?, 16)?;
    }
    let (ctx, kv) = (256, KvType::F16);
    let prompt = l.tokenizer.encode(PROMPTS[2], true, false);
    let mut s = Session::new(&l.model, &l.pool, ctx, kv)?;
    let mut next = argmax(s.eval(&prompt, Outputs::Last)?.data);
    let state = s.export_state(s.n_past())?;
    let compat = Compat::for_session(&l.model, digest, kv, ctx);
    let mut bytes = Vec::new();
    encode(&compat, &state, b"ferrite gate release", &mut bytes)?;
    let mut feed = Vec::new();
    let mut want = Vec::new();
    for _ in 0..4 {
        feed.push(next);
        let row = s.eval(&[next], Outputs::Last)?.data.to_vec();
        next = argmax(&row);
        want.push(row);
    }
    let continue_from = |restored: &ferrite_model::SessionState| -> anyhow::Result<Vec<Vec<f32>>> {
        let mut r = Session::new(&l.model, &l.pool, ctx, kv)?;
        r.import_state(restored, restored.n_tokens())?;
        feed.iter()
            .map(|&t| Ok(r.eval(&[t], Outputs::Last)?.data.to_vec()))
            .collect()
    };
    let snap = (env.parts.read_snapshot)(&bytes, &compat)?;
    let mut poisoned = snap.state.clone();
    if let Some(b) = poisoned.kv.get_mut(1) {
        *b ^= 0x40;
    }
    let planted = exact_proof(
        &[continue_from(&poisoned)?],
        std::slice::from_ref(&want),
        "restored (one K/V value flipped) vs uninterrupted",
    );
    let restored = exact_proof(
        &[continue_from(&snap.state)?],
        std::slice::from_ref(&want),
        "restored vs uninterrupted",
    );
    let offsets = flip_offsets(bytes.len(), if env.quick { 64 } else { 512 });
    let mut accepted = Vec::new();
    for &at in &offsets {
        let mut bad = bytes.clone();
        bad[at] ^= 1 << (at % 8);
        if (env.parts.read_snapshot)(&bad, &compat).is_ok() {
            accepted.push(at);
        }
    }
    let (restart_planted, restart) = super::restart::reuse(t)?;
    let ok = restored.ok && accepted.is_empty() && restart.ok;
    let detail = match accepted.first() {
        Some(at) => format!(
            "{} of {} flipped snapshots accepted (first at byte {at} of {})",
            accepted.len(),
            offsets.len(),
            bytes.len()
        ),
        None if !restart.ok => restart.detail.clone(),
        None => format!(
            "{}; {} flipped snapshots of {} bytes all refused; {}",
            restored.detail,
            offsets.len(),
            bytes.len(),
            restart.detail
        ),
    };
    let real = Proof::new(ok, detail)
        .count("flips", offsets.len())
        .count("flips_accepted", accepted.len())
        .count("snapshot_bytes", bytes.len())
        .count("restored_rows", want.len());
    let real = restart
        .counts
        .into_iter()
        .fold(real, |p, (k, v)| p.count(&k, v as usize));
    // Both planted defects must be caught: either one unnoticed fails the item.
    let planted = Proof::new(
        planted.ok || restart_planted.ok,
        format!("{}; {}", planted.detail, restart_planted.detail),
    );
    Ok(Outcome::Judged { planted, real })
}
