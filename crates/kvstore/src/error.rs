//! The error type of this crate, split by what the caller should do with the file: a
//! snapshot of another model or setting is left alone (another server may use it), a
//! damaged one can be deleted.

/// Why a snapshot could not be written or used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KvStoreError {
    /// Reading or writing the file failed.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// The file does not start with the snapshot magic.
    #[error("not a ferrite KV snapshot (bad magic)")]
    NotASnapshot,
    /// The file is a snapshot of a format version this build does not read.
    #[error("snapshot format version {found}, this build reads version {supported}")]
    Version {
        /// Version in the file.
        found: u32,
        /// Version this build reads and writes.
        supported: u32,
    },
    /// The snapshot is intact but belongs to another model, setting or ferrite version.
    #[error("snapshot {field} is {found}, expected {expected}")]
    Mismatch {
        /// The header field that differs.
        field: &'static str,
        /// What the current session needs.
        expected: String,
        /// What the file holds.
        found: String,
    },
    /// The file is damaged: truncated, a checksum fails, or its lengths are inconsistent
    /// with each other or with the file size.
    #[error("corrupt snapshot: {0}")]
    Corrupt(String),
    /// The state does not fit the session (reported by the model crate).
    #[error("session state: {0}")]
    Model(#[from] ferrite_model::ModelError),
}

impl KvStoreError {
    /// Whether the file itself is damaged (as opposed to valid but not for this session, or
    /// unreadable for an i/o reason), so a cache may delete it.
    pub fn is_corrupt(&self) -> bool {
        matches!(self, KvStoreError::Corrupt(_) | KvStoreError::NotASnapshot)
    }
}

/// A failed atomic write keeps its system error (the snapshot's path is the caller's).
impl From<ferrite_files::FileError> for KvStoreError {
    fn from(e: ferrite_files::FileError) -> KvStoreError {
        KvStoreError::Io(e.source)
    }
}
