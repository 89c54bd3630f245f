//! The prefix cache shared by all slots: block-hashed checkpoints of finished sequences in
//! memory (LRU within a byte budget) and, with `--kv-disk-dir`, as snapshot files that
//! survive restarts ([`ferrite_kvstore::DiskCache`]).
//!
//! Keys: the prompt is cut into blocks of `block` tokens; block `i`'s hash continues from
//! block `i - 1`'s ([`ferrite_kvstore::chain_hashes`]), so one hash names a whole prefix.
//! A checkpoint of `L` tokens (`L` a multiple of `block`, the sequence's tail trimmed by
//! `trim` tokens so a continued conversation may re-render its last tokens differently) is
//! indexed under all its block boundaries, so a prompt that shares only an earlier part
//! (an edited message) reuses that part. A hash only finds a candidate: its tokens are
//! compared with the prompt before any row is used.
//!
//! Disk files are written by a background thread so the engine never waits for the disk;
//! the index of disk files is built at start and refreshed from the directory on a miss,
//! so files written by another server sharing the directory are found too. Restoring a
//! file validates it completely ([`ferrite_kvstore::decode`]); a rejected file is logged,
//! counted and skipped, and the request computes its prompt.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError, sync_channel};

use ferrite_kvstore::{Compat, DiskCache, chain_hashes, compat_seed, read_snapshot_tokens};
use ferrite_model::{Session, SessionState};

use crate::inference::CacheSource;
use crate::scheduler::PrefixStore;

/// Settings of the shared prefix cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrefixCacheConfig {
    /// Tokens per hashed block; checkpoints and reuse happen at multiples of it.
    pub block: usize,
    /// Tail tokens left out of a checkpoint.
    pub trim: usize,
    /// Byte budget of checkpoints kept in memory (0 = no memory cache).
    pub memory_bytes: u64,
    /// Snapshot directory and its byte budget (`None` = no disk cache).
    pub disk: Option<(PathBuf, u64)>,
}

impl Default for PrefixCacheConfig {
    fn default() -> Self {
        PrefixCacheConfig {
            block: 64,
            trim: 4,
            memory_bytes: 512 << 20,
            disk: None,
        }
    }
}

/// Counters of the prefix cache (read by tests and logged).
#[derive(Debug, Default)]
pub struct CacheStats {
    /// Restores from memory.
    pub memory_hits: AtomicU64,
    /// Restores from disk.
    pub disk_hits: AtomicU64,
    /// Disk files rejected (other model or setting, corrupt, unreadable).
    pub rejected: AtomicU64,
    /// Disk files written.
    pub written: AtomicU64,
}

struct MemEntry {
    state: Arc<SessionState>,
    hashes: Vec<u64>,
    used: u64,
}

/// Memory checkpoints, indexed by every block boundary.
struct Memory {
    budget: u64,
    bytes: u64,
    next_id: u64,
    entries: HashMap<u64, MemEntry>,
    index: HashMap<u64, u64>,
}

impl Memory {
    fn size(state: &SessionState) -> u64 {
        (state.kv.len() + 4 * state.tokens.len()) as u64
    }

    fn insert(&mut self, state: Arc<SessionState>, hashes: Vec<u64>, tick: u64) {
        let size = Self::size(&state);
        if size > self.budget {
            return;
        }
        let id = self.next_id;
        self.next_id += 1;
        for &h in &hashes {
            self.index.insert(h, id);
        }
        self.bytes += size;
        self.entries.insert(
            id,
            MemEntry {
                state,
                hashes,
                used: tick,
            },
        );
        // Least recently used first; the new entry is the most recent, so it stays.
        while self.bytes > self.budget {
            let Some((&old, _)) = self
                .entries
                .iter()
                .filter(|(k, _)| **k != id)
                .min_by_key(|(_, e)| e.used)
            else {
                break;
            };
            if let Some(e) = self.entries.remove(&old) {
                self.bytes -= Self::size(&e.state);
                for h in e.hashes {
                    if self.index.get(&h) == Some(&old) {
                        self.index.remove(&h);
                    }
                }
            }
        }
    }
}

/// The disk side: the directory, the compatibility block of this engine's sessions, an
/// index of known files and the writer thread's queue.
struct Disk {
    cache: DiskCache,
    compat: Compat,
    index: HashMap<u64, PathBuf>,
    known: HashSet<PathBuf>,
    writer: Option<SyncSender<(u64, Arc<SessionState>)>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Disk {
    /// Adds files of the directory not seen before to the index.
    fn refresh(&mut self, seed: u64, block: usize, stats: &CacheStats) {
        let Ok(entries) = self.cache.entries() else {
            return;
        };
        for e in entries {
            if !self.known.insert(e.path.clone()) {
                continue;
            }
            match read_snapshot_tokens(&e.path, &self.compat) {
                Ok(tokens) => {
                    for h in chain_hashes(seed, &tokens, block) {
                        self.index.insert(h, e.path.clone());
                    }
                }
                Err(err) => {
                    stats.rejected.fetch_add(1, Ordering::Relaxed);
                    eprintln!("kv-cache: skipping {}: {err}", e.path.display());
                    if err.is_corrupt() {
                        let _ = std::fs::remove_file(&e.path);
                    }
                }
            }
        }
    }

    fn forget(&mut self, path: &PathBuf) {
        self.index.retain(|_, p| p != path);
        self.known.remove(path);
    }
}

impl Drop for Disk {
    fn drop(&mut self) {
        // Let queued checkpoints reach the disk before the engine exits.
        self.writer.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The shared prefix cache over CPU sessions.
pub struct PrefixCache {
    cfg: PrefixCacheConfig,
    seed: u64,
    tick: u64,
    memory: Memory,
    disk: Option<Disk>,
    stats: Arc<CacheStats>,
}

impl PrefixCache {
    /// A cache for sessions described by `compat` (its fields seed the block hashes, so
    /// keys of different models or settings never meet). Opens the disk directory when
    /// configured and indexes the usable files in it. Counts go to `stats`.
    pub fn new(
        cfg: PrefixCacheConfig,
        compat: Compat,
        stats: Arc<CacheStats>,
    ) -> std::io::Result<PrefixCache> {
        let seed = compat_seed(&compat);
        let disk = match &cfg.disk {
            None => None,
            Some((dir, budget)) => {
                let cache = DiskCache::open(dir, *budget)?;
                let (tx, rx) = sync_channel::<(u64, Arc<SessionState>)>(2);
                let (wcache, wcompat, wstats) = (cache.clone(), compat.clone(), stats.clone());
                let thread = std::thread::Builder::new()
                    .name("ferrite-kv-writer".into())
                    .spawn(move || {
                        for (key, state) in rx {
                            match wcache.put(key, &wcompat, &state, &[]) {
                                Ok(Some(len)) => {
                                    wstats.written.fetch_add(1, Ordering::Relaxed);
                                    eprintln!(
                                        "kv-cache: wrote {} tokens ({len} bytes) to {key:016x}",
                                        state.n_tokens()
                                    );
                                }
                                Ok(None) => {}
                                Err(e) => eprintln!("kv-cache: writing {key:016x} failed: {e}"),
                            }
                        }
                    })?;
                let mut d = Disk {
                    cache,
                    compat,
                    index: HashMap::new(),
                    known: HashSet::new(),
                    writer: Some(tx),
                    thread: Some(thread),
                };
                d.refresh(seed, cfg.block, &stats);
                Some(d)
            }
        };
        Ok(PrefixCache {
            memory: Memory {
                budget: cfg.memory_bytes,
                bytes: 0,
                next_id: 0,
                entries: HashMap::new(),
                index: HashMap::new(),
            },
            cfg,
            seed,
            tick: 0,
            disk,
            stats,
        })
    }

    /// The counters.
    pub fn stats(&self) -> Arc<CacheStats> {
        self.stats.clone()
    }

    /// Loads `n` tokens of `state` into `seq` if they equal `prompt[..n]`.
    fn load(seq: &mut Session<'_>, state: &SessionState, prompt: &[u32], n: usize) -> bool {
        state.tokens.get(..n) == prompt.get(..n) && seq.import_state(state, n).is_ok()
    }

    fn restore_from_disk(
        &mut self,
        seq: &mut Session<'_>,
        prompt: &[u32],
        n: usize,
        path: PathBuf,
    ) -> bool {
        let Some(disk) = self.disk.as_mut() else {
            return false;
        };
        match disk.cache.get(&path, &disk.compat) {
            Ok(snap) if Self::load(seq, &snap.state, prompt, n) => {
                // Keep it in memory too: the next request of this conversation is near.
                let all = chain_hashes(self.seed, &snap.state.tokens, self.cfg.block);
                self.tick += 1;
                self.memory.insert(Arc::new(snap.state), all, self.tick);
                true
            }
            // A hash collision or a file replaced under the same name: not this prefix.
            Ok(_) => false,
            Err(e) => {
                let gone = matches!(&e, ferrite_kvstore::KvStoreError::Io(io)
                    if io.kind() == std::io::ErrorKind::NotFound);
                if !gone {
                    self.stats.rejected.fetch_add(1, Ordering::Relaxed);
                    eprintln!("kv-cache: rejected {}: {e}", path.display());
                }
                disk.forget(&path);
                false
            }
        }
    }
}

impl<'m> PrefixStore<Session<'m>> for PrefixCache {
    fn restore(
        &mut self,
        seq: &mut Session<'m>,
        prompt: &[u32],
        have: usize,
    ) -> Option<(usize, CacheSource)> {
        let block = self.cfg.block;
        // The last prompt token is always evaluated (its logits pick the first token).
        let usable = prompt.len().saturating_sub(1);
        let hashes = chain_hashes(self.seed, &prompt[..usable], block);
        if let Some(d) = self.disk.as_mut() {
            d.refresh(self.seed, block, &self.stats);
        }
        for (i, h) in hashes.iter().enumerate().rev() {
            let n = (i + 1) * block;
            if n <= have {
                return None;
            }
            if let Some(entry) = self
                .memory
                .index
                .get(h)
                .and_then(|id| self.memory.entries.get_mut(id))
            {
                self.tick += 1;
                entry.used = self.tick;
                let state = entry.state.clone();
                if Self::load(seq, &state, prompt, n) {
                    self.stats.memory_hits.fetch_add(1, Ordering::Relaxed);
                    return Some((n, CacheSource::Memory));
                }
            }
            let path = self.disk.as_ref().and_then(|d| d.index.get(h).cloned());
            if let Some(path) = path
                && self.restore_from_disk(seq, prompt, n, path)
            {
                self.stats.disk_hits.fetch_add(1, Ordering::Relaxed);
                return Some((n, CacheSource::Disk));
            }
        }
        None
    }

    fn checkpoint(&mut self, seq: &Session<'m>, tokens: &[u32]) {
        let block = self.cfg.block;
        let len = tokens.len().saturating_sub(self.cfg.trim) / block * block;
        if len == 0 {
            return;
        }
        let hashes = chain_hashes(self.seed, &tokens[..len], block);
        let Some(&key) = hashes.last() else {
            return;
        };
        self.tick += 1;
        let in_memory = match self
            .memory
            .index
            .get(&key)
            .and_then(|id| self.memory.entries.get_mut(id))
        {
            Some(e) if e.state.tokens.get(..len) == Some(&tokens[..len]) => {
                e.used = self.tick;
                Some(e.state.clone())
            }
            _ => None,
        };
        let on_disk = self
            .disk
            .as_ref()
            .is_none_or(|d| d.index.contains_key(&key));
        if in_memory.is_some() && on_disk {
            return;
        }
        let state = match in_memory {
            Some(s) => s,
            None => match seq.export_state(len) {
                Ok(s) => {
                    let s = Arc::new(s);
                    self.memory.insert(s.clone(), hashes.clone(), self.tick);
                    s
                }
                Err(e) => {
                    eprintln!("kv-cache: checkpoint failed: {e}");
                    return;
                }
            },
        };
        if let Some(d) = self.disk.as_mut().filter(|_| !on_disk) {
            // A covering memory entry may hold more than `len` tokens: name the file by
            // everything it holds, so file names always match their contents.
            let hashes = if state.n_tokens() == len {
                hashes
            } else {
                chain_hashes(self.seed, &state.tokens, block)
            };
            let key = hashes.last().copied().unwrap_or(key);
            let path = d.cache.path_for(key);
            match d.writer.as_ref().map(|w| w.try_send((key, state))) {
                Some(Ok(())) => {
                    for h in hashes {
                        d.index.insert(h, path.clone());
                    }
                    d.known.insert(path);
                }
                // The writer is behind: skip this checkpoint rather than stall decoding.
                Some(Err(TrySendError::Full(_))) => {
                    eprintln!("kv-cache: disk writer busy, checkpoint skipped")
                }
                Some(Err(TrySendError::Disconnected(_))) | None => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use ferrite_cpu::ThreadPool;
    use ferrite_model::{KvType, LoadOptions, Model, Outputs};

    use super::*;

    fn prompt(n: usize) -> Vec<u32> {
        (0..n as u32).map(|i| 300 + (i * 31 + 5) % 2000).collect()
    }

    fn last_bits(s: &mut Session<'_>, tokens: &[u32]) -> Vec<u32> {
        let l = s.eval(tokens, Outputs::Last).unwrap();
        l.last().unwrap().iter().map(|x| x.to_bits()).collect()
    }

    /// Real SmolLM2 on CPU: checkpoints restored from memory, from disk after a "restart"
    /// (a new cache over the same directory), twice, after an edit, and rejected files
    /// (other setting, corrupt) fall back to computing. Oracle: the logits after the
    /// restored prefix plus the computed suffix equal a fresh computation bit for bit.
    #[test]
    fn restores_are_exact_and_survive_restarts_and_rejections() {
        let Some(path) = ferrite_testkit::real_model(ferrite_testkit::SMOLLM2) else {
            return;
        };
        let model = Model::load(&path, LoadOptions::default()).unwrap();
        let pool = ThreadPool::new(2).unwrap();
        let ctx = 512;
        let dir = tempfile::tempdir().unwrap();
        let sha = ferrite_kvstore::model_sha256(&path, Some(dir.path())).unwrap();
        let compat = Compat::for_session(&model, sha, KvType::F16, ctx);
        let cfg = PrefixCacheConfig {
            disk: Some((dir.path().to_path_buf(), 1 << 30)),
            ..PrefixCacheConfig::default()
        };
        let a = prompt(300);
        let mut b = a[..280].to_vec();
        b.extend(prompt(20).iter().map(|t| t + 7));
        let mut fresh = Session::new(&model, &pool, ctx, KvType::F16).unwrap();
        let want = last_bits(&mut fresh, &b);
        let mut s = Session::new(&model, &pool, ctx, KvType::F16).unwrap();
        let check = |cache: &mut PrefixCache, s: &mut Session<'_>, src: CacheSource| {
            assert_eq!(cache.restore(s, &b, 0), Some((256, src)));
            assert_eq!(last_bits(s, &b[256..]), want, "{src:?}");
        };
        {
            let mut cache = PrefixCache::new(cfg.clone(), compat.clone(), Arc::default()).unwrap();
            let mut first = Session::new(&model, &pool, ctx, KvType::F16).unwrap();
            first.eval(&a, Outputs::Last).unwrap();
            cache.checkpoint(&first, &a);
            check(&mut cache, &mut s, CacheSource::Memory);
            // A prompt already holding more than the cache offers gets nothing.
            assert_eq!(cache.restore(&mut s, &b, 256), None);
        } // dropping the cache waits for the disk writer
        for _ in 0..2 {
            let mut cache = PrefixCache::new(cfg.clone(), compat.clone(), Arc::default()).unwrap();
            check(&mut cache, &mut s, CacheSource::Disk);
            check(&mut cache, &mut s, CacheSource::Memory);
        }
        // An edit at token 100 keeps only the first block.
        let mut edited = a.clone();
        edited[100] += 1;
        let mut cache = PrefixCache::new(cfg.clone(), compat.clone(), Arc::default()).unwrap();
        assert_eq!(
            cache.restore(&mut s, &edited, 0),
            Some((64, CacheSource::Disk))
        );
        assert_eq!(s.tokens(), &a[..64]);
        // Another context size: the file is valid but not ours; it is left and not used.
        let other = Compat {
            ctx: 1024,
            ..compat.clone()
        };
        let mut cache = PrefixCache::new(cfg.clone(), other, Arc::default()).unwrap();
        assert_eq!(cache.restore(&mut s, &b, 0), None);
        assert_eq!(cache.stats().rejected.load(Ordering::Relaxed), 1);
        let files = DiskCache::open(dir.path(), 1 << 30)
            .unwrap()
            .entries()
            .unwrap();
        assert_eq!(files.len(), 1);
        // A corrupted payload: indexed (the header is intact), rejected at restore,
        // deleted, and the prompt is computed instead.
        let mut bytes = std::fs::read(&files[0].path).unwrap();
        let at = bytes.len() / 2;
        bytes[at] ^= 0x10;
        std::fs::write(&files[0].path, &bytes).unwrap();
        let mut cache = PrefixCache::new(cfg.clone(), compat.clone(), Arc::default()).unwrap();
        assert_eq!(cache.restore(&mut s, &b, 0), None);
        assert_eq!(cache.stats().rejected.load(Ordering::Relaxed), 1);
        assert!(!files[0].path.exists());
        s.reset();
        assert_eq!(last_bits(&mut s, &b), want);
    }
}
