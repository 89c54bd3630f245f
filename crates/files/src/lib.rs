//! ferrite-files: ferrite's conventions on disk, written once. Where ferrite keeps its
//! files ([`home`]: `$FERRITE_HOME`, else `~/.cache/ferrite`); how a file is written so
//! that a reader sees either none of it or all of it, even when the writer is killed at any
//! point ([`write_atomic`]: a partial file next to the target, fsync, rename, fsync of the
//! directory); how a partial file names its writer, so that whoever owns a directory can
//! remove the partials of dead writers ([`partial_writer`], [`process_alive`]); and a
//! file's SHA-256 ([`sha256_file`]).
//!
//! This crate never knows what the files hold, and never deletes anything itself: the
//! owner of a directory decides what to clean.
//!
//! ```
//! let dir = tempfile::tempdir().unwrap();
//! let path = dir.path().join("notes.txt");
//! let n = ferrite_files::write_atomic(&path, |w| {
//!     w.write_all(b"hello").map_err(|e| ferrite_files::FileError::new(&path, e))
//! })
//! .unwrap();
//! assert_eq!((n, std::fs::read(&path).unwrap()), (5, b"hello".to_vec()));
//! assert_eq!(
//!     ferrite_files::hex(&ferrite_files::sha256_file(&path).unwrap())[..8],
//!     *"2cf24dba"
//! );
//! ```

#![deny(missing_docs)]

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest, Sha256};

/// The environment variable naming ferrite's home directory.
pub const HOME_ENV: &str = "FERRITE_HOME";

/// Suffix of partial files; readers never open them.
pub const PARTIAL_SUFFIX: &str = ".partial";

/// A file operation that failed, with the path it failed on.
#[derive(Debug, thiserror::Error)]
#[error("{}: {source}", path.display())]
pub struct FileError {
    /// The file or directory.
    pub path: PathBuf,
    /// What the system said.
    #[source]
    pub source: std::io::Error,
}

impl FileError {
    /// `source` at `path`.
    pub fn new(path: &Path, source: std::io::Error) -> FileError {
        FileError {
            path: path.to_owned(),
            source,
        }
    }
}

/// ferrite's home directory: `$FERRITE_HOME` when set and not empty, else
/// `$HOME/.cache/ferrite`; `None` when neither variable is set.
pub fn home() -> Option<PathBuf> {
    let set = |var: &str| std::env::var_os(var).filter(|v| !v.is_empty());
    set(HOME_ENV)
        .map(PathBuf::from)
        .or_else(|| set("HOME").map(|h| Path::new(&h).join(".cache").join("ferrite")))
}

/// A partial file's name next to `path`: `.<name>.<pid>.<n>.partial`, unique within this
/// process (`n`) and across processes (`pid`), so concurrent writers never share one and
/// [`partial_writer`] can tell whose it is.
pub fn partial_path(path: &Path) -> PathBuf {
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

/// The target's file name and the writer's pid of a partial file named by
/// [`partial_path`], or `None` when `file_name` is not one.
pub fn partial_writer(file_name: &str) -> Option<(&str, u32)> {
    let stem = file_name.strip_prefix('.')?.strip_suffix(PARTIAL_SUFFIX)?;
    let mut parts = stem.rsplitn(3, '.');
    let _n: u64 = parts.next()?.parse().ok()?;
    let pid = parts.next()?.parse().ok()?;
    let target = parts.next().filter(|t| !t.is_empty())?;
    Some((target, pid))
}

/// Whether process `pid` exists, where the system says (`/proc`); `None` elsewhere.
pub fn process_alive(pid: u32) -> Option<bool> {
    Path::new("/proc/self")
        .exists()
        .then(|| Path::new("/proc").join(pid.to_string()).exists())
}

/// Writes what `produce` writes to `path` atomically and returns its size: readers see
/// either the old file (or none) or the complete new one, whatever happens to this process.
/// When `produce` or any step fails, the partial file is removed and the error returned.
pub fn write_atomic<E: From<FileError>>(
    path: &Path,
    produce: impl FnOnce(&mut dyn Write) -> Result<(), E>,
) -> Result<u64, E> {
    let tmp = partial_path(path);
    let result = (|| {
        let at = |p: &Path| {
            let p = p.to_owned();
            move |source| E::from(FileError { path: p, source })
        };
        let file = File::create(&tmp).map_err(at(&tmp))?;
        let mut w = BufWriter::with_capacity(1 << 20, file);
        produce(&mut w)?;
        let file = w.into_inner().map_err(|e| at(&tmp)(e.into_error()))?;
        file.sync_all().map_err(at(&tmp))?;
        let len = file.metadata().map_err(at(&tmp))?.len();
        drop(file);
        std::fs::rename(&tmp, path).map_err(at(path))?;
        // The rename itself must survive a crash too.
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(at(dir))?;
        }
        Ok(len)
    })();
    if result.is_err() {
        // Best effort: the error being returned matters more than a failed cleanup.
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// SHA-256 of the file at `path`, read in 1 MiB pieces.
pub fn sha256_file(path: &Path) -> Result<[u8; 32], FileError> {
    sha256_file_with(path, &mut |_| ())
}

/// [`sha256_file`], telling `progress` the size of each piece read.
pub fn sha256_file_with(
    path: &Path,
    progress: &mut dyn FnMut(usize),
) -> Result<[u8; 32], FileError> {
    let at = |source| FileError::new(path, source);
    let mut f = File::open(path).map_err(at)?;
    let mut sha = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(at)?;
        if n == 0 {
            return Ok(sha.finalize().into());
        }
        sha.update(&buf[..n]);
        progress(n);
    }
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_write_replaces_the_file_and_leaves_no_partial() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.bin");
        std::fs::write(&path, b"old").unwrap();
        let n = write_atomic(&path, |w| {
            w.write_all(b"new bytes")
                .map_err(|e| FileError::new(&path, e))
        })
        .unwrap();
        assert_eq!(n, 9);
        assert_eq!(std::fs::read(&path).unwrap(), b"new bytes");
        assert_eq!(names(dir.path()), ["a.bin"]);
    }

    #[test]
    fn a_failed_write_keeps_the_old_file_and_removes_its_partial() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.bin");
        std::fs::write(&path, b"old").unwrap();
        let err = write_atomic(&path, |w| {
            w.write_all(b"half").map_err(|e| FileError::new(&path, e))?;
            Err(FileError::new(&path, std::io::Error::other("disk full")))
        })
        .unwrap_err();
        assert!(err.to_string().ends_with("a.bin: disk full"), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), b"old");
        assert_eq!(names(dir.path()), ["a.bin"]);
    }

    #[test]
    fn a_write_into_a_missing_directory_names_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("no/such/a.bin");
        let err = write_atomic(&path, |_| Ok::<(), FileError>(())).unwrap_err();
        // The partial file could not be created: the error names it, in the missing dir.
        assert_eq!(err.path.parent(), path.parent());
        let name = err.path.file_name().unwrap().to_str().unwrap();
        assert_eq!(partial_writer(name).map(|w| w.0), Some("a.bin"));
    }

    #[test]
    fn partial_names_say_their_target_and_writer() {
        let p = partial_path(Path::new("/x/model.kvsnap"));
        let name = p.file_name().unwrap().to_str().unwrap();
        assert_eq!(
            partial_writer(name),
            Some(("model.kvsnap", std::process::id()))
        );
        assert_eq!(
            partial_writer(".k.kvsnap.42.7.partial"),
            Some(("k.kvsnap", 42))
        );
        for foreign in [
            "k.kvsnap.42.7.partial",
            ".k.kvsnap.x.7.partial",
            ".k.kvsnap.42.partial",
            ".42.7.partial",
            ".notes.partial",
            ".k.kvsnap.42.7",
        ] {
            assert_eq!(partial_writer(foreign), None, "{foreign}");
        }
        assert_eq!(process_alive(std::process::id()), Some(true));
    }

    #[test]
    fn sha256_of_a_known_text() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("abc");
        std::fs::write(&path, b"abc").unwrap();
        let mut read = 0;
        let digest = sha256_file_with(&path, &mut |n| read += n).unwrap();
        assert_eq!(
            hex(&digest),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(read, 3);
        let missing = sha256_file(&dir.path().join("none")).unwrap_err();
        assert!(missing.path.ends_with("none"));
    }
}
