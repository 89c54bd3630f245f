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

/// Counters and gauges of the prefix cache (read by `/metrics`, tests and logs). The gauges
/// say what the cache holds now against its budgets, so a reader can tell a cache filling
/// up to its budget from memory growing elsewhere.
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
    /// Bytes of the checkpoints held in memory (KV rows, token ids, logits).
    pub memory_bytes: AtomicU64,
    /// The memory budget (0 when there is no memory cache).
    pub memory_budget: AtomicU64,
    /// Checkpoints held in memory.
    pub memory_entries: AtomicU64,
    /// Bytes of the disk directory as its budget counts them, after the last write.
    pub disk_bytes: AtomicU64,
    /// The disk budget (0 when there is no disk cache).
    pub disk_budget: AtomicU64,
    /// Complete files of the disk directory, after the last write.
    pub disk_files: AtomicU64,
}

impl CacheStats {
    fn set_disk(&self, usage: ferrite_kvstore::DiskUsage) {
        self.disk_bytes.store(usage.bytes, Ordering::Relaxed);
        self.disk_files.store(usage.files, Ordering::Relaxed);
    }
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
    /// The heap bytes a checkpoint holds: what the budget counts.
    fn size(state: &SessionState) -> u64 {
        let logits = state.logits.as_ref().map_or(0, Vec::len);
        (state.kv.len() + 4 * state.tokens.len() + 4 * logits) as u64
    }

    fn publish(&self, stats: &CacheStats) {
        stats.memory_bytes.store(self.bytes, Ordering::Relaxed);
        stats
            .memory_entries
            .store(self.entries.len() as u64, Ordering::Relaxed);
    }

    /// Adds a checkpoint, then evicts least-recently-used ones until the budget holds.
    fn insert(
        &mut self,
        state: Arc<SessionState>,
        hashes: Vec<u64>,
        tick: u64,
        stats: &CacheStats,
    ) {
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
        self.publish(stats);
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
    /// Adds files of the directory not seen before to the index and drops the files that
    /// are gone (evicted by the writer or another server), so the index stays as large as
    /// the directory.
    fn refresh(&mut self, seed: u64, block: usize, stats: &CacheStats) {
        let Ok(entries) = self.cache.entries() else {
            return;
        };
        // A file still queued for the writer is dropped too; once written it is found
        // again as a new file.
        let present: HashSet<&PathBuf> = entries.iter().map(|e| &e.path).collect();
        self.known.retain(|p| present.contains(p));
        self.index.retain(|_, p| present.contains(p));
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
                stats.disk_budget.store(*budget, Ordering::Relaxed);
                stats.set_disk(cache.usage()?);
                let (tx, rx) = sync_channel::<(u64, Arc<SessionState>)>(2);
                let (wcache, wcompat, wstats) = (cache.clone(), compat.clone(), stats.clone());
                let thread = std::thread::Builder::new()
                    .name("ferrite-kv-writer".into())
                    .spawn(move || {
                        for (key, state) in rx {
                            match wcache.put(key, &wcompat, &state, &[]) {
                                Ok(Some(len)) => {
                                    wstats.written.fetch_add(1, Ordering::Relaxed);
                                    if let Ok(usage) = wcache.usage() {
                                        wstats.set_disk(usage);
                                    }
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
        stats
            .memory_budget
            .store(cfg.memory_bytes, Ordering::Relaxed);
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
                self.memory
                    .insert(Arc::new(snap.state), all, self.tick, &self.stats);
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
                    self.memory
                        .insert(s.clone(), hashes.clone(), self.tick, &self.stats);
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

    fn state(tokens: usize, kv: usize, logits: bool) -> Arc<SessionState> {
        Arc::new(SessionState {
            kv_type: KvType::F16,
            n_layer: 1,
            row: 2,
            tokens: (0..tokens as u32).collect(),
            kv: vec![0; kv],
            logits: logits.then(|| vec![0.0; 100]),
            recurrent: Default::default(),
        })
    }

    /// The memory part never holds more than its budget, its gauges say what it holds
    /// (logits included), and the newest checkpoint survives eviction. Oracle: the sum of
    /// the sizes of the entries left, recomputed here from their fields.
    #[test]
    fn memory_stays_within_its_budget_and_reports_it() {
        let stats = CacheStats::default();
        let budget = 10_000;
        let mut m = Memory {
            budget,
            bytes: 0,
            next_id: 0,
            entries: HashMap::new(),
            index: HashMap::new(),
        };
        for i in 0..50u64 {
            let s = state(10 + i as usize, 1_000 + 37 * i as usize, i % 3 == 0);
            m.insert(s, vec![i, 1000 + i], i, &stats);
            let held: u64 = m
                .entries
                .values()
                .map(|e| {
                    let s = &e.state;
                    (s.kv.len() + 4 * s.tokens.len() + 4 * s.logits.as_ref().map_or(0, Vec::len))
                        as u64
                })
                .sum();
            assert_eq!(m.bytes, held);
            assert!(held <= budget, "{held} > {budget}");
            assert_eq!(stats.memory_bytes.load(Ordering::Relaxed), held);
            assert_eq!(
                stats.memory_entries.load(Ordering::Relaxed),
                m.entries.len() as u64
            );
            assert_eq!(m.index.get(&i), Some(&i), "the newest entry is kept");
            // The index names only entries that are held.
            assert!(m.index.values().all(|id| m.entries.contains_key(id)));
        }
        // A checkpoint larger than the whole budget is not kept.
        m.insert(state(1, budget as usize + 1, false), vec![7777], 99, &stats);
        assert!(!m.index.contains_key(&7777));
    }

    /// The disk index forgets files that left the directory (evicted by the writer or
    /// another server), so it grows only with the directory. Oracle: the directory listing.
    #[test]
    fn disk_index_follows_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let compat = Compat {
            model_sha256: [1; 32],
            arch: "llama".into(),
            precision: 0,
            kv_type: KvType::F16,
            ctx: 64,
            n_layer: 1,
            kv_row: 2,
            n_vocab: 4,
            backend: ferrite_kvstore::SnapshotBackend::Cpu,
            state: (0, 0),
        };
        let stats = Arc::new(CacheStats::default());
        let cfg = PrefixCacheConfig {
            block: 4,
            disk: Some((dir.path().to_path_buf(), 1 << 20)),
            ..PrefixCacheConfig::default()
        };
        let cache = DiskCache::open(dir.path(), 1 << 20).unwrap();
        for key in 0..3 {
            let s = SessionState {
                tokens: (key..key + 8).collect(),
                kv: vec![0; 2 * 2 * 2 * 8],
                ..(*state(0, 0, false)).clone()
            };
            cache.put(u64::from(key), &compat, &s, &[]).unwrap();
        }
        let mut pc = PrefixCache::new(cfg, compat, stats.clone()).unwrap();
        let disk = pc.disk.as_mut().unwrap();
        assert_eq!(disk.known.len(), 3);
        assert_eq!(disk.index.len(), 6, "two blocks per file");
        assert_eq!(stats.disk_files.load(Ordering::Relaxed), 3);
        let on_disk: u64 = cache.entries().unwrap().iter().map(|e| e.len).sum();
        assert_eq!(stats.disk_bytes.load(Ordering::Relaxed), on_disk);
        assert_eq!(stats.disk_budget.load(Ordering::Relaxed), 1 << 20);
        std::fs::remove_file(cache.path_for(1)).unwrap();
        disk.refresh(pc.seed, 4, &stats);
        assert_eq!(disk.known.len(), 2);
        assert_eq!(disk.index.len(), 4);
        assert!(disk.index.values().all(|p| p.is_file()));
    }

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
