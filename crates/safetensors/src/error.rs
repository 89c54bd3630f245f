//! The one error type of this crate: every way a safetensors file or a sharded checkpoint can
//! be unreadable or malformed. Variants name the file and, where there is one, the tensor.

/// Everything that can go wrong opening a safetensors file or checkpoint.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SafetensorsError {
    /// A file could not be opened, read or mapped.
    #[error("{path}: {source}")]
    Io {
        /// The file involved.
        path: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The file is shorter than the 8-byte header length field.
    #[error("{file}: {len} bytes is too short for a safetensors file (needs at least 8)")]
    TooShort {
        /// The file.
        file: String,
        /// Its length.
        len: u64,
    },
    /// The header length field is larger than the limit or than the rest of the file.
    #[error(
        "{file}: header length {header_len} is impossible: {available} bytes follow, limit {limit}"
    )]
    HeaderLength {
        /// The file.
        file: String,
        /// The length field as read.
        header_len: u64,
        /// Bytes after the length field.
        available: u64,
        /// [`crate::MAX_HEADER_LEN`].
        limit: u64,
    },
    /// The header is not valid UTF-8 JSON of the expected shape.
    #[error("{file}: bad header: {reason}")]
    BadHeader {
        /// The file.
        file: String,
        /// What is wrong.
        reason: String,
    },
    /// A tensor's dtype is not one the format defines.
    #[error("{file}: tensor {tensor:?} has unknown dtype {dtype:?}")]
    UnknownDtype {
        /// The file.
        file: String,
        /// The tensor.
        tensor: String,
        /// The name found.
        dtype: String,
    },
    /// A tensor's data range does not hold exactly `shape × dtype` bytes (or the size
    /// overflows 64 bits).
    #[error(
        "{file}: tensor {tensor:?}: shape {shape:?} of {dtype} needs {expected} bytes, range holds {actual}"
    )]
    SizeMismatch {
        /// The file.
        file: String,
        /// The tensor.
        tensor: String,
        /// Its dtype.
        dtype: crate::Dtype,
        /// Its shape.
        shape: Vec<u64>,
        /// Bytes the shape needs (`u64::MAX` when that overflows).
        expected: u64,
        /// Bytes the data range holds.
        actual: u64,
    },
    /// A data range is reversed or ends past the data section.
    #[error(
        "{file}: tensor {tensor:?}: data range {begin}..{end} is outside the data section of {data_len} bytes"
    )]
    OutOfBounds {
        /// The file.
        file: String,
        /// The tensor.
        tensor: String,
        /// Range start, relative to the data section.
        begin: u64,
        /// Range end.
        end: u64,
        /// Size of the data section.
        data_len: u64,
    },
    /// Two tensors' data ranges share bytes.
    #[error("{file}: tensors {first:?} and {second:?} overlap")]
    Overlap {
        /// The file.
        file: String,
        /// The tensor whose range starts first.
        first: String,
        /// The tensor overlapping it.
        second: String,
    },
    /// The same tensor name appears twice (in one header or in two shards).
    #[error("tensor {tensor:?} appears in both {first} and {second}")]
    DuplicateTensor {
        /// The tensor.
        tensor: String,
        /// The first file holding it.
        first: String,
        /// The second.
        second: String,
    },
    /// The sharding index is not valid JSON of the expected shape, or names a shard file
    /// outside its directory.
    #[error("{file}: bad index: {reason}")]
    BadIndex {
        /// The index file.
        file: String,
        /// What is wrong.
        reason: String,
    },
    /// The index names a shard file that does not exist.
    #[error("{index}: shard {shard:?} (holding {tensor:?}) does not exist")]
    MissingShard {
        /// The index file.
        index: String,
        /// The shard file name.
        shard: String,
        /// One tensor the index places there.
        tensor: String,
    },
    /// The index places a tensor in a shard that does not hold it.
    #[error("{index}: tensor {tensor:?} is not in its shard {shard:?}")]
    MissingTensor {
        /// The index file.
        index: String,
        /// The tensor.
        tensor: String,
        /// The shard the index names.
        shard: String,
    },
    /// A directory holds no `*.safetensors` file and no index.
    #[error("{dir}: no model.safetensors.index.json and no *.safetensors file")]
    NoWeights {
        /// The directory.
        dir: String,
    },
}
