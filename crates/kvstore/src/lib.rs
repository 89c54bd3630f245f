//! ferrite-kvstore: KV snapshot files and the on-disk prefix cache.
//!
//! A snapshot is a session's state ([`ferrite_model::SessionState`]: token ids, every
//! layer's K/V rows of the used prefix, the next-token logits when known) plus opaque
//! application bytes, in a versioned binary file (docs/kv-snapshot-format.md). The header
//! names everything that makes KV rows reusable ([`Compat`]: model file SHA-256,
//! architecture, weight precision, KV type, context size, shape, the backend that computed
//! the rows) and the ferrite version;
//! a snapshot is used only when all of it matches, and only after both checksums (header
//! and payload) hold.
//!
//! Design choices: reading validates every length against the file size before allocating
//! anything ([`decode`]); writes go to a temporary file that is fsynced and renamed
//! (`ferrite_files::write_atomic`), so a killed writer leaves no file a reader would open; the cache
//! directory ([`DiskCache`]) names files by chained block hashes ([`chain_hashes`]) and
//! evicts least-recently-used files within a byte budget, never the one just written.
//!
//! ```
//! use ferrite_kvstore::{Compat, SnapshotBackend, decode, encode};
//! use ferrite_model::{KvType, SessionState};
//! let compat = Compat { model_sha256: [0; 32], arch: "llama".into(), precision: 0,
//!     kv_type: KvType::F16, ctx: 8, n_layer: 1, kv_row: 2, n_vocab: 4,
//!     backend: SnapshotBackend::Cpu, state: (0, 0) };
//! let state = SessionState { kv_type: KvType::F16, n_layer: 1, row: 2, tokens: vec![3],
//!     kv: vec![0; 8], logits: None, recurrent: Default::default() };
//! let mut bytes = Vec::new();
//! encode(&compat, &state, b"", &mut bytes)?;
//! let back = decode(&mut &bytes[..], bytes.len() as u64, &compat)?;
//! assert_eq!(back.state, state);
//! # Ok::<(), ferrite_kvstore::KvStoreError>(())
//! ```

#![deny(missing_docs)]

mod dir;
mod error;
mod file;
mod format;

pub use dir::{DiskCache, DiskEntry, DiskUsage, SNAPSHOT_EXT, chain_hashes, compat_seed};
pub use error::KvStoreError;
pub use file::{model_sha256, read_snapshot, read_snapshot_tokens, write_snapshot};
pub use format::{
    Compat, FERRITE_VERSION, FORMAT_VERSION, HEADER_LEN, HEADER_SEALED, Header, MAGIC, Snapshot,
    SnapshotBackend, check_compat, decode, encode, parse_header, read_header, read_tokens,
};
