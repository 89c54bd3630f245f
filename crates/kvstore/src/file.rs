//! Snapshot files on disk: atomic writes (`ferrite_files::write_atomic`) and validated
//! reads; plus the cached SHA-256 of model files that identifies the model in every header.

use std::fs::File;
use std::io::BufReader;
use std::path::Path;
use std::time::UNIX_EPOCH;

use ferrite_files::{FileError, hex};
use sha2::{Digest, Sha256};

use crate::KvStoreError;
use crate::format::{Compat, Snapshot, decode, encode, read_tokens};

/// Writes a snapshot file atomically; returns its size.
pub fn write_snapshot(
    path: &Path,
    compat: &Compat,
    state: &ferrite_model::SessionState,
    meta: &[u8],
) -> Result<u64, KvStoreError> {
    ferrite_files::write_atomic(path, |w| encode(compat, state, meta, w))
}

/// Reads and fully validates a snapshot file for a session described by `want`.
pub fn read_snapshot(path: &Path, want: &Compat) -> Result<Snapshot, KvStoreError> {
    let file = File::open(path)?;
    let len = file.metadata()?.len();
    decode(&mut BufReader::with_capacity(1 << 20, file), len, want)
}

/// Reads the header and token ids of a snapshot file (for indexing; no payload check).
pub fn read_snapshot_tokens(path: &Path, want: &Compat) -> Result<Vec<u32>, KvStoreError> {
    let file = File::open(path)?;
    let len = file.metadata()?.len();
    read_tokens(&mut BufReader::new(file), len, want)
}

/// SHA-256 of a model file. With `cache_dir`, the digest is remembered in
/// `cache_dir/model-sha256/` under a key made of the canonical path, size and modification
/// time, so it is computed once per file version rather than at every start.
pub fn model_sha256(path: &Path, cache_dir: Option<&Path>) -> std::io::Result<[u8; 32]> {
    let Some(cache_dir) = cache_dir else {
        return ferrite_files::sha256_file(path).map_err(|e| e.source);
    };
    let meta = std::fs::metadata(path)?;
    let mtime = meta
        .modified()?
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let canonical = std::fs::canonicalize(path)?;
    let key = Sha256::digest(format!("{}\n{}\n{mtime}", canonical.display(), meta.len()));
    let dir = cache_dir.join("model-sha256");
    let entry = dir.join(hex(&key[..16]));
    if let Ok(text) = std::fs::read_to_string(&entry) {
        let text = text.trim();
        if text.len() == 64 {
            let mut out = [0u8; 32];
            let ok = (0..32).all(|i| {
                u8::from_str_radix(&text[2 * i..2 * i + 2], 16)
                    .map(|b| out[i] = b)
                    .is_ok()
            });
            if ok {
                return Ok(out);
            }
        }
    }
    let sha = ferrite_files::sha256_file(path).map_err(|e| e.source)?;
    std::fs::create_dir_all(&dir)?;
    // A failed cache write only costs recomputing next time.
    let _ = ferrite_files::write_atomic(&entry, |w| {
        w.write_all(hex(&sha).as_bytes())
            .map_err(|e| FileError::new(&entry, e))
    });
    Ok(sha)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::tests::sample;
    use ferrite_model::KvType;

    #[test]
    fn a_snapshot_is_written_whole_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let (c, s) = sample(5, KvType::F16, true);
        let path = dir.path().join("a.kvsnap");
        let len = write_snapshot(&path, &c, &s, b"m").unwrap();
        assert_eq!(len, std::fs::metadata(&path).unwrap().len());
        assert_eq!(read_snapshot(&path, &c).unwrap().state, s);
        assert_eq!(read_snapshot_tokens(&path, &c).unwrap(), s.tokens);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["a.kvsnap"], "no partial file is left");
    }

    #[test]
    fn model_digest_is_cached_per_file_version() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("m.gguf");
        std::fs::write(&model, b"weights v1").unwrap();
        let want: [u8; 32] = Sha256::digest(b"weights v1").into();
        let cache = dir.path().join("cache");
        assert_eq!(model_sha256(&model, Some(&cache)).unwrap(), want);
        assert_eq!(model_sha256(&model, None).unwrap(), want);
        // Served from the cache: poison the cached entry and see it come back.
        let entry = std::fs::read_dir(cache.join("model-sha256"))
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path();
        std::fs::write(&entry, hex(&[1; 32])).unwrap();
        assert_eq!(model_sha256(&model, Some(&cache)).unwrap(), [1; 32]);
        // A new file version (other size) gets a new key.
        std::fs::write(&model, b"weights v2!").unwrap();
        let want2: [u8; 32] = Sha256::digest(b"weights v2!").into();
        assert_eq!(model_sha256(&model, Some(&cache)).unwrap(), want2);
    }
}
