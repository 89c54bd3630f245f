//! The disk cache directory: one snapshot file per checkpoint, named by the chained hash of
//! its tokens, least-recently-used eviction within a byte budget.
//!
//! Several servers may share a directory. Files appear only by rename, so a reader sees a
//! complete file or none; a file deleted by another server while being read stays readable
//! through the open handle (POSIX). "Used" is the file's modification time, refreshed on
//! every restore. Temporary files name their writer's pid: those of writers that are gone
//! are removed when the cache is opened, those of live writers count against the budget
//! (they become entries on rename). Whether a pid is alive is read from `/proc`, so servers
//! sharing a directory must share a pid namespace; where `/proc` is absent, or the pid is
//! alive but the file is an hour old (the pid was reused), the age decides.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use ferrite_files::process_alive;
use ferrite_model::SessionState;

use crate::KvStoreError;
use crate::file::{read_snapshot, write_snapshot};
use crate::format::{Compat, Snapshot};

/// File extension of cache entries.
pub const SNAPSHOT_EXT: &str = "kvsnap";

/// Age after which a temporary file is taken to be left over by a killed writer even when
/// its pid answers (pids are reused) or liveness cannot be read.
const STALE_PARTIAL: Duration = Duration::from_secs(3600);

/// The writer's pid of a partial cache entry (`.<key>.kvsnap.<pid>.<n>.partial`, named by
/// `ferrite_files::partial_path`), or `None` when the name is not one of ours.
fn partial_writer(name: &str) -> Option<u32> {
    ferrite_files::partial_writer(name)
        .filter(|(target, _)| target.ends_with(SNAPSHOT_EXT))
        .map(|(_, pid)| pid)
}

/// A temporary file of the directory and whether its writer may still be writing it.
struct Partial {
    path: PathBuf,
    len: u64,
    live: bool,
}

/// The temporary files of `dir`; a file of a dead writer, or an hour old, is not live.
fn partials(dir: &Path) -> std::io::Result<Vec<Partial>> {
    let now = SystemTime::now();
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)?.flatten() {
        let name = e.file_name();
        let Some(pid) = partial_writer(&name.to_string_lossy()) else {
            continue;
        };
        // Renamed or removed by its writer between listing and stat.
        let Ok(meta) = e.metadata() else { continue };
        let old = meta
            .modified()
            .is_ok_and(|t| now.duration_since(t).unwrap_or_default() > STALE_PARTIAL);
        let live = !old && process_alive(pid) != Some(false);
        out.push(Partial {
            path: e.path(),
            len: meta.len(),
            live,
        });
    }
    Ok(out)
}

fn mix(mut z: u64) -> u64 {
    // splitmix64's finalizer: every input bit affects every output bit.
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A seed that differs for every [`Compat`], so cache keys of different models or
/// settings never collide by construction (and a file from another setting is not found).
pub fn compat_seed(c: &Compat) -> u64 {
    let mut h = 0x6b76_7374_6f72_6531u64;
    let fields = [
        u64::from(c.precision),
        u64::from(crate::format::kv_code(c.kv_type)),
        c.ctx,
        u64::from(c.n_layer),
        u64::from(c.kv_row),
        u64::from(c.n_vocab),
        u64::from(c.backend.code()),
    ];
    for x in c
        .model_sha256
        .chunks(8)
        .map(|b| b.iter().fold(0u64, |a, &y| a << 8 | u64::from(y)))
        .chain(c.arch.bytes().map(u64::from))
        .chain(fields)
    {
        h = mix(h ^ x);
    }
    h
}

/// Chained block hashes: entry `i` identifies `tokens[..(i + 1) * block]` (and the seed),
/// because each block's hash starts from the previous one. Only whole blocks are hashed.
pub fn chain_hashes(seed: u64, tokens: &[u32], block: usize) -> Vec<u64> {
    let mut h = seed;
    tokens
        .chunks_exact(block.max(1))
        .map(|b| {
            for &t in b {
                h = mix(h ^ u64::from(t) ^ 0x9e37_79b9_0000_0000);
            }
            h
        })
        .collect()
}

/// One complete file of the cache directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskEntry {
    /// Its path.
    pub path: PathBuf,
    /// Its size in bytes.
    pub len: u64,
    /// Last use (modification time).
    pub used: SystemTime,
}

/// The size of a cache directory as its budget counts it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskUsage {
    /// Complete entries.
    pub files: u64,
    /// Bytes of the complete entries and of the temporary files of live writers.
    pub bytes: u64,
}

/// A snapshot directory with a byte budget.
#[derive(Debug, Clone)]
pub struct DiskCache {
    dir: PathBuf,
    budget: u64,
}

impl DiskCache {
    /// Opens (creating) `dir` with a budget of `budget` bytes and removes the temporary
    /// files of writers that are gone (killed mid-write).
    pub fn open(dir: &Path, budget: u64) -> std::io::Result<DiskCache> {
        std::fs::create_dir_all(dir)?;
        for p in partials(dir)?.into_iter().filter(|p| !p.live) {
            // Already gone (its writer finished or another server cleaned it) is fine.
            let _ = std::fs::remove_file(&p.path);
        }
        Ok(DiskCache {
            dir: dir.to_path_buf(),
            budget,
        })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The byte budget.
    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// Path of the entry with key `key`.
    pub fn path_for(&self, key: u64) -> PathBuf {
        self.dir.join(format!("{key:016x}.{SNAPSHOT_EXT}"))
    }

    /// The complete entries (temporary files are never listed).
    pub fn entries(&self) -> std::io::Result<Vec<DiskEntry>> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(&self.dir)?.flatten() {
            let path = e.path();
            let name = e.file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.') || path.extension().is_none_or(|x| x != SNAPSHOT_EXT) {
                continue;
            }
            // Another server may delete a file between listing and stat.
            let Ok(meta) = e.metadata() else { continue };
            if meta.is_file() {
                out.push(DiskEntry {
                    path,
                    len: meta.len(),
                    used: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                });
            }
        }
        Ok(out)
    }

    /// Writes the entry `key` (unless it exists already, which only refreshes its use
    /// time), then evicts least-recently-used entries other than this one until the
    /// directory fits the budget. An entry larger than the whole budget is not written.
    /// Returns the written size, or `None` when nothing was written.
    pub fn put(
        &self,
        key: u64,
        compat: &Compat,
        state: &SessionState,
        meta: &[u8],
    ) -> Result<Option<u64>, KvStoreError> {
        let path = self.path_for(key);
        if path.is_file() {
            touch(&path);
            return Ok(None);
        }
        // Header + tokens + KV rows + logits is a close lower bound of the file size.
        let approx = (state.kv.len() + 4 * state.tokens.len()) as u64;
        if approx > self.budget {
            return Ok(None);
        }
        let len = write_snapshot(&path, compat, state, meta)?;
        self.evict(&path)?;
        Ok(Some(len))
    }

    /// Reads entry `path` for a session described by `want`. A damaged file is deleted;
    /// a valid file of another setting is left for whoever can use it. A successful read
    /// counts as a use for eviction.
    pub fn get(&self, path: &Path, want: &Compat) -> Result<Snapshot, KvStoreError> {
        match read_snapshot(path, want) {
            Ok(s) => {
                touch(path);
                Ok(s)
            }
            Err(e) => {
                if e.is_corrupt() {
                    let _ = std::fs::remove_file(path);
                }
                Err(e)
            }
        }
    }

    /// Bytes of the temporary files of live writers (they are entries soon).
    fn writing(&self) -> std::io::Result<u64> {
        Ok(partials(&self.dir)?
            .iter()
            .filter(|p| p.live)
            .map(|p| p.len)
            .sum())
    }

    /// What the directory holds now, as the budget counts it: the complete entries plus
    /// the temporary files of live writers.
    pub fn usage(&self) -> std::io::Result<DiskUsage> {
        let entries = self.entries()?;
        Ok(DiskUsage {
            files: entries.len() as u64,
            bytes: entries.iter().map(|e| e.len).sum::<u64>() + self.writing()?,
        })
    }

    /// Deletes least-recently-used entries, never `keep`, until the total size, with the
    /// temporary files of live writers (they are entries soon), fits the budget. Returns the
    /// deleted paths.
    pub fn evict(&self, keep: &Path) -> std::io::Result<Vec<PathBuf>> {
        let mut entries = self.entries()?;
        let mut total: u64 = entries.iter().map(|e| e.len).sum::<u64>() + self.writing()?;
        entries.sort_by_key(|e| e.used);
        let mut removed = Vec::new();
        for e in entries {
            if total <= self.budget {
                break;
            }
            if e.path == keep {
                continue;
            }
            // Already gone (another server evicted it) counts as removed.
            match std::fs::remove_file(&e.path) {
                Ok(()) => removed.push(e.path),
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                Err(err) => return Err(err),
            }
            total -= e.len;
        }
        Ok(removed)
    }
}

/// Marks a file as used now (best effort: a failure only makes eviction less precise).
fn touch(path: &Path) {
    if let Ok(f) = std::fs::File::options().append(true).open(path) {
        let _ = f.set_modified(SystemTime::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::tests::sample;
    use ferrite_files::PARTIAL_SUFFIX;
    use ferrite_model::KvType;

    #[test]
    fn chained_hashes_identify_whole_prefixes() {
        let a: Vec<u32> = (0..20).collect();
        let mut b = a.clone();
        b[5] = 99;
        let (ha, hb) = (chain_hashes(1, &a, 4), chain_hashes(1, &b, 4));
        assert_eq!(ha.len(), 5);
        assert_eq!(ha[0], hb[0]);
        // A change in block 1 changes every later hash, not just its own.
        assert!(ha[1..].iter().zip(&hb[1..]).all(|(x, y)| x != y));
        assert_ne!(chain_hashes(2, &a, 4)[0], ha[0], "the seed matters");
        let (c, _) = sample(1, KvType::F16, false);
        let other = Compat {
            ctx: 65,
            ..c.clone()
        };
        assert_ne!(compat_seed(&c), compat_seed(&other));
        let gpu = Compat {
            backend: crate::SnapshotBackend::Cuda,
            ..c.clone()
        };
        assert_ne!(
            compat_seed(&c),
            compat_seed(&gpu),
            "the backend is in the seed"
        );
    }

    fn set_used(path: &Path, secs_ago: u64) {
        let f = std::fs::File::options().append(true).open(path).unwrap();
        f.set_modified(SystemTime::now() - Duration::from_secs(secs_ago))
            .unwrap();
    }

    #[test]
    fn eviction_is_lru_within_budget_and_keeps_the_newest() {
        let dir = tempfile::tempdir().unwrap();
        let (c, s) = sample(8, KvType::F32, false);
        let one = write_snapshot(&dir.path().join("probe"), &c, &s, &[]).unwrap();
        std::fs::remove_file(dir.path().join("probe")).unwrap();
        // Room for three entries.
        let cache = DiskCache::open(dir.path(), 3 * one + one / 2).unwrap();
        for key in 0..3 {
            assert_eq!(cache.put(key, &c, &s, &[]).unwrap(), Some(one));
            set_used(&cache.path_for(key), 100 - key * 10);
        }
        // Entry 0 is the oldest but gets used, so entry 1 is now least recent.
        cache.get(&cache.path_for(0), &c).unwrap();
        cache.put(3, &c, &s, &[]).unwrap();
        let left: Vec<bool> = (0..4).map(|k| cache.path_for(k).is_file()).collect();
        assert_eq!(left, [true, false, true, true]);
        let total: u64 = cache.entries().unwrap().iter().map(|e| e.len).sum();
        assert!(total <= cache.budget());
        // Many more puts: never over budget, the newest always present.
        for key in 4..12 {
            cache.put(key, &c, &s, &[]).unwrap();
            let total: u64 = cache.entries().unwrap().iter().map(|e| e.len).sum();
            assert!(total <= cache.budget(), "{total}");
            assert!(cache.path_for(key).is_file());
        }
        // An entry bigger than the whole budget is not written at all.
        let tiny = DiskCache::open(&dir.path().join("tiny"), one / 2).unwrap();
        assert_eq!(tiny.put(1, &c, &s, &[]).unwrap(), None);
        assert!(tiny.entries().unwrap().is_empty());
    }

    #[test]
    fn damaged_entries_are_deleted_and_foreign_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let cache = DiskCache::open(dir.path(), 1 << 20).unwrap();
        let (c, s) = sample(4, KvType::F16, true);
        cache.put(1, &c, &s, &[]).unwrap();
        cache.put(2, &c, &s, &[]).unwrap();
        let other = Compat {
            model_sha256: [0; 32],
            ..c.clone()
        };
        assert!(matches!(
            cache.get(&cache.path_for(1), &other),
            Err(KvStoreError::Mismatch { .. })
        ));
        assert!(cache.path_for(1).is_file(), "kept for its own model");
        let p = cache.path_for(2);
        let len = std::fs::metadata(&p).unwrap().len();
        std::fs::File::options()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(len - 1)
            .unwrap();
        assert!(cache.get(&p, &c).unwrap_err().is_corrupt());
        assert!(!p.exists(), "a truncated file is removed");
        // Restoring the same entry twice works and keeps it.
        for _ in 0..2 {
            assert_eq!(cache.get(&cache.path_for(1), &c).unwrap().state, s);
        }
        assert!(cache.path_for(1).is_file());
    }

    /// A pid that belonged to a process which has exited (and been reaped).
    fn dead_pid() -> u32 {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        pid
    }

    fn partial(dir: &Path, key: &str, pid: u32) -> PathBuf {
        let p = dir.join(format!(".{key}.{SNAPSHOT_EXT}.{pid}.0{PARTIAL_SUFFIX}"));
        std::fs::write(&p, b"half").unwrap();
        p
    }

    /// Regression (issue 35): temporary files of SIGKILLed servers stayed for an hour and
    /// repeated crashes pushed the directory past its budget.
    #[test]
    fn partials_of_dead_writers_are_removed_at_open_and_live_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let dead = partial(dir.path(), "00000000000000aa", dead_pid());
        let live = partial(dir.path(), "00000000000000bb", std::process::id());
        let reused = partial(dir.path(), "00000000000000cc", std::process::id());
        set_used(&reused, 7200);
        let foreign = dir.path().join(".notes.partial");
        std::fs::write(&foreign, b"not ours").unwrap();
        let cache = DiskCache::open(dir.path(), 1 << 20).unwrap();
        assert!(
            cache.entries().unwrap().is_empty(),
            "partials are never listed"
        );
        assert!(!dead.exists(), "its writer is gone");
        assert!(live.exists(), "its writer (this process) is alive");
        assert!(!reused.exists(), "an hour old: the pid was reused");
        assert!(foreign.exists(), "a name that is not ours is left alone");
    }

    #[test]
    fn partial_names_give_their_writer() {
        let key = "00000000000000aa.kvsnap";
        assert_eq!(partial_writer(&format!(".{key}.42.7.partial")), Some(42));
        for bad in [
            format!("{key}.42.7.partial"),
            format!(".{key}.x.7.partial"),
            format!(".{key}.42.partial"),
            ".other.42.7.partial".to_string(),
            format!(".{key}.42.7"),
        ] {
            assert_eq!(partial_writer(&bad), None, "{bad}");
        }
    }

    #[test]
    fn live_partials_count_against_the_budget() {
        let dir = tempfile::tempdir().unwrap();
        let (c, s) = sample(8, KvType::F32, false);
        let one = write_snapshot(&dir.path().join("probe"), &c, &s, &[]).unwrap();
        std::fs::remove_file(dir.path().join("probe")).unwrap();
        let cache = DiskCache::open(dir.path(), 3 * one + one / 2).unwrap();
        // Another writer of this process, as large as an entry, is busy.
        let writing = partial(dir.path(), "00000000000000ff", std::process::id());
        std::fs::write(&writing, vec![0u8; one as usize]).unwrap();
        for key in 0..3 {
            cache.put(key, &c, &s, &[]).unwrap();
            set_used(&cache.path_for(key), 100 - key * 10);
        }
        let total: u64 = cache.entries().unwrap().iter().map(|e| e.len).sum();
        assert!(total + one <= cache.budget(), "{total} + {one}");
        assert_eq!(cache.entries().unwrap().len(), 2);
        assert!(writing.exists());
        let usage = cache.usage().unwrap();
        assert_eq!(usage.files, 2);
        assert_eq!(usage.bytes, total + one, "the live partial is counted");
        assert!(usage.bytes <= cache.budget());
    }
}
