//! Snapshot files on disk: atomic writes (temporary file in the same directory, fsync,
//! rename, fsync of the directory) and validated reads; plus the cached SHA-256 of model
//! files that identifies the model in every header.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::UNIX_EPOCH;

use sha2::{Digest, Sha256};

use crate::KvStoreError;
use crate::format::{Compat, Snapshot, decode, encode, read_tokens};

/// Suffix of temporary files; readers never open them.
pub const PARTIAL_SUFFIX: &str = ".partial";

/// A name for a temporary file next to `path`, unique within this process and across
/// processes (pid), so concurrent writers never share one.
fn temp_path(path: &Path) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let name = path
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(
        ".{name}.{}.{n}{PARTIAL_SUFFIX}",
        std::process::id()
    ))
}

/// Writes `bytes` producer output to `path` atomically: readers see either no file or
/// the complete one, even if this process is killed at any point.
pub fn write_atomic(
    path: &Path,
    produce: impl FnOnce(&mut dyn Write) -> Result<(), KvStoreError>,
) -> Result<u64, KvStoreError> {
    let tmp = temp_path(path);
    let result = (|| {
        let file = File::create(&tmp)?;
        let mut w = BufWriter::with_capacity(1 << 20, file);
        produce(&mut w)?;
        let file = w.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        let len = file.metadata()?.len();
        drop(file);
        std::fs::rename(&tmp, path)?;
        // The rename itself must survive a crash too.
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            File::open(dir)?.sync_all()?;
        }
        Ok(len)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Writes a snapshot file atomically; returns its size.
pub fn write_snapshot(
    path: &Path,
    compat: &Compat,
    state: &ferrite_model::SessionState,
    meta: &[u8],
) -> Result<u64, KvStoreError> {
    write_atomic(path, |w| encode(compat, state, meta, w))
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

fn sha256_file(path: &Path) -> std::io::Result<[u8; 32]> {
    let mut f = File::open(path)?;
    let mut sha = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok(sha.finalize().into());
        }
        sha.update(&buf[..n]);
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// SHA-256 of a model file. With `cache_dir`, the digest is remembered in
/// `cache_dir/model-sha256/` under a key made of the canonical path, size and modification
/// time, so it is computed once per file version rather than at every start.
pub fn model_sha256(path: &Path, cache_dir: Option<&Path>) -> std::io::Result<[u8; 32]> {
    let Some(cache_dir) = cache_dir else {
        return sha256_file(path);
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
    let sha = sha256_file(path)?;
    std::fs::create_dir_all(&dir)?;
    // A failed cache write only costs recomputing next time.
    let _ = write_atomic(&entry, |w| Ok(w.write_all(hex(&sha).as_bytes())?));
    Ok(sha)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::tests::sample;
    use ferrite_model::KvType;

    #[test]
    fn atomic_write_leaves_no_temporary_files() {
        let dir = tempfile::tempdir().unwrap();
        let (c, s) = sample(5, KvType::F16, true);
        let path = dir.path().join("a.kvsnap");
        let len = write_snapshot(&path, &c, &s, b"m").unwrap();
        assert_eq!(len, std::fs::metadata(&path).unwrap().len());
        assert_eq!(read_snapshot(&path, &c).unwrap().state, s);
        assert_eq!(read_snapshot_tokens(&path, &c).unwrap(), s.tokens);
        // A failing producer leaves neither the target nor a temporary file.
        let bad = dir.path().join("b.kvsnap");
        let err = write_atomic(&bad, |w| {
            w.write_all(b"half")?;
            Err(KvStoreError::Corrupt("producer failed".into()))
        });
        assert!(err.is_err());
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["a.kvsnap"]);
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
