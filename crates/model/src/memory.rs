//! Whether the KV caches a run asks for fit in the machine's memory, and how much memory the
//! machine has.
//!
//! A session's cache is allocated whole when the session is made, but the OS backs it with
//! memory only as positions are written. So too many sessions, or too long a context, start
//! fine and are killed for memory once the caches fill, mid-run. Callers that make many
//! sessions check first, here. This module only reads the machine's memory size; it never
//! allocates.

use crate::{KvType, ModelConfig, ModelError, SessionState};

/// Checks that `sessions` caches of `ctx` positions of `config`'s attention layers in `kv`,
/// all full, with a hybrid's recurrent state and its checkpoints, fit in the machine's
/// physical memory (no bound where that is unknown).
pub fn check_kv_memory(
    config: &ModelConfig,
    kv: KvType,
    sessions: usize,
    ctx: usize,
) -> Result<(), ModelError> {
    check_slot_memory(config, kv, (sessions, ctx), 0, physical_memory())
}

/// As [`check_kv_memory`], with `per_slot` more bytes beside each session (what a server's
/// slot holds besides its own cache: a draft model's session, its verify rows' logits), in
/// `memory` bytes (the caller's budget, usually [`physical_memory`]; `None`: no bound).
pub fn check_slot_memory(
    config: &ModelConfig,
    kv: KvType,
    (sessions, ctx): (usize, usize),
    per_slot: usize,
    memory: Option<usize>,
) -> Result<(), ModelError> {
    kv_fits(
        sessions,
        (ctx, per_token_bytes(config, kv)?),
        state_bytes(config).and_then(|s| s.checked_add(per_slot)),
        memory,
    )
    .map_err(ModelError::InvalidArgument)
}

/// Bytes of one full session of `config` over `ctx` positions in `kv`, recurrent state
/// and its checkpoints included (`None` on overflow).
pub fn session_bytes(
    config: &ModelConfig,
    kv: KvType,
    ctx: usize,
) -> Result<Option<usize>, ModelError> {
    Ok(per_token_bytes(config, kv)?
        .and_then(|b| b.checked_mul(ctx)?.checked_add(state_bytes(config)?)))
}

/// Bytes of K/V cache one position takes (`None` on overflow).
fn per_token_bytes(config: &ModelConfig, kv: KvType) -> Result<Option<usize>, ModelError> {
    let row = kv.check_row(config.n_kv_head, config.head_dim)?;
    // A cache whose values lie in its keys (latent attention) holds the keys only.
    Ok(
        SessionState::kv_bytes(kv, config.kv_layers(), row, 1).map(|b| {
            if config.kv_values().stored() {
                b
            } else {
                b / 2
            }
        }),
    )
}

/// Bytes of one session's recurrent state with the checkpoints it keeps (`None` on
/// overflow; 0 for models of attention only).
fn state_bytes(config: &ModelConfig) -> Option<usize> {
    let (slots, len) = config.state_slots();
    slots
        .checked_mul(len)?
        .checked_mul(4)?
        .checked_mul(1 + crate::CHECKPOINTS_KEPT)
}

/// Whether `sessions` caches of `ctx` positions of `per_token` bytes, each with
/// `per_session` bytes of recurrent state, fit in `memory` bytes; the reason when not.
fn kv_fits(
    sessions: usize,
    (ctx, per_token): (usize, Option<usize>),
    per_session: Option<usize>,
    memory: Option<usize>,
) -> Result<(), String> {
    let Some(memory) = memory else {
        return Ok(());
    };
    let one = per_token.and_then(|b| b.checked_mul(ctx)?.checked_add(per_session?));
    let need = one.and_then(|b| b.checked_mul(sessions));
    match need {
        Some(need) if need <= memory => Ok(()),
        _ => {
            let need = match (per_token, per_session) {
                (Some(b), Some(s)) => (b as f64 * ctx as f64 + s as f64) * sessions as f64,
                _ => f64::INFINITY,
            };
            Err(format!(
                "{sessions} sequences of {ctx} positions need {:.1} GB of KV cache when full, \
                 more than this machine's {:.1} GB of memory",
                need / 1e9,
                memory as f64 / 1e9
            ))
        }
    }
}

/// The machine's physical memory in bytes (`MemTotal` of `/proc/meminfo`), where known.
pub fn physical_memory() -> Option<usize> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb = info
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse::<usize>()
        .ok()?;
    kb.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_whose_full_kv_caches_exceed_memory_are_refused() {
        // SmolLM2-135M: 30 layers, rows of 192 f16 values: 23,040 bytes a position.
        let per_token = SessionState::kv_bytes(KvType::F16, 30, 192, 1);
        assert_eq!(per_token, Some(23_040));
        let gb = 1usize << 30;
        let none = Some(0);
        assert!(kv_fits(16, (4096, per_token), none, Some(2 * gb)).is_ok());
        let err = kv_fits(100_000, (4096, per_token), none, Some(32 * gb)).unwrap_err();
        assert!(
            err.contains("100000 sequences of 4096 positions need 9437.2 GB")
                && err.contains("34.4 GB"),
            "{err}"
        );
        assert!(kv_fits(16, (4096, per_token), none, Some(gb)).is_err());
        assert!(kv_fits(usize::MAX, (usize::MAX, per_token), none, Some(gb)).is_err());
        assert!(kv_fits(16, (4096, None), none, Some(gb)).is_err());
        assert!(kv_fits(100_000, (4096, per_token), none, None).is_ok());
        // A hybrid's state counts once per session, whatever the context: 16 sessions of
        // 80 MB of state do not fit in 1 GiB even without any K/V.
        assert!(kv_fits(16, (4096, Some(0)), Some(80_000_000), Some(gb)).is_err());
        assert!(kv_fits(12, (4096, Some(0)), Some(80_000_000), Some(gb)).is_ok());
        assert!(kv_fits(1, (1, per_token), None, Some(gb)).is_err());
        assert!(physical_memory().is_none_or(|m| m > 0));
    }
}
