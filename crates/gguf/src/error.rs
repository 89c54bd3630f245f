//! The one error type of this crate: every way a GGUF file can be unreadable, malformed or
//! asked for something it does not hold, and every way a writer can be given bad input.
//!
//! Variants name the offending key or tensor and, where the problem sits at a place in the
//! file, the absolute byte offset, so a user can locate the damage with a hex dump.

use crate::GgmlType;

/// Everything that can go wrong reading or writing a GGUF file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    /// The file could not be opened, mapped, created or written.
    #[error("{path}: {source}")]
    Io {
        /// The file involved (empty when writing to a plain stream).
        path: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The first four bytes are not `GGUF`.
    #[error("not a GGUF file: magic bytes are {found:02x?}, expected \"GGUF\"")]
    BadMagic {
        /// The bytes found at offset 0 (fewer when the file is shorter).
        found: Vec<u8>,
    },
    /// The version is not 2 or 3 (a big-endian file also lands here: its version reads
    /// byte-swapped).
    #[error("unsupported GGUF version {version} (supported: 2, 3)")]
    UnsupportedVersion {
        /// The version field as read little-endian.
        version: u32,
    },
    /// The file ends before a field that must be there.
    #[error("file truncated at byte {offset}: {what} needs {needed} bytes, {available} left")]
    Truncated {
        /// Where the field starts.
        offset: u64,
        /// What was being read.
        what: &'static str,
        /// Bytes the field needs.
        needed: u64,
        /// Bytes left in the file from `offset`.
        available: u64,
    },
    /// A count (of metadata entries, tensors or array items) is larger than the rest of the
    /// file could hold even at the smallest encoding; rejected before anything is allocated.
    #[error(
        "{what} count {count} at byte {offset} is impossible: the remaining {remaining} bytes hold at most {max}"
    )]
    CountTooLarge {
        /// What is being counted.
        what: &'static str,
        /// The count read from the file.
        count: u64,
        /// Where the count field starts.
        offset: u64,
        /// Bytes left after the count field.
        remaining: u64,
        /// The largest count those bytes could back.
        max: u64,
    },
    /// A string's bytes are not valid UTF-8.
    #[error("string at byte {offset} is not valid UTF-8")]
    InvalidUtf8 {
        /// Where the string's length field starts.
        offset: u64,
    },
    /// A metadata value type id that GGUF does not define.
    #[error("metadata key {key:?}: unknown value type {type_id} at byte {offset}")]
    UnknownValueType {
        /// The key whose value (or array element type) is bad.
        key: String,
        /// The type id read.
        type_id: u32,
        /// Where the type id starts.
        offset: u64,
    },
    /// Arrays nested deeper than [`crate::MAX_ARRAY_DEPTH`]; refused so a tiny file cannot
    /// exhaust the stack.
    #[error("metadata key {key:?}: arrays nested deeper than {max} at byte {offset}")]
    NestingTooDeep {
        /// The key holding the array.
        key: String,
        /// The depth limit.
        max: usize,
        /// Where the too-deep array starts.
        offset: u64,
    },
    /// The same metadata key appears twice.
    #[error("duplicate metadata key {key:?} at byte {offset}")]
    DuplicateKey {
        /// The repeated key.
        key: String,
        /// Where the second occurrence starts (0 when raised by the writer).
        offset: u64,
    },
    /// `general.alignment` is zero, negative or not a power of two.
    #[error("general.alignment is {value}; it must be a nonzero power of two")]
    BadAlignment {
        /// The value given, printed.
        value: String,
    },
    /// A bool value byte other than 0 or 1.
    #[error("metadata key {key:?}: bool byte {byte} at byte {offset} is neither 0 nor 1")]
    InvalidBool {
        /// The key holding the bool.
        key: String,
        /// The byte read.
        byte: u8,
        /// Where the byte is.
        offset: u64,
    },
    /// A tensor type id ferrite does not know.
    #[error("tensor {tensor:?}: unknown tensor type {type_id} at byte {offset}")]
    UnknownTensorType {
        /// The tensor's name.
        tensor: String,
        /// The type id read.
        type_id: u32,
        /// Where the type id starts.
        offset: u64,
    },
    /// A tensor with zero or more than four dimensions, or a zero-length dimension.
    #[error("tensor {tensor:?}: invalid shape {dims:?} (need 1 to 4 dimensions, none zero)")]
    BadDims {
        /// The tensor's name.
        tensor: String,
        /// The dimensions read (only the count is meaningful when there are more than 4).
        dims: Vec<u64>,
    },
    /// A tensor declares more than 4 dimensions (caught before reading them).
    #[error("tensor {tensor:?}: {n_dims} dimensions at byte {offset} (need 1 to 4)")]
    TooManyDims {
        /// The tensor's name.
        tensor: String,
        /// The dimension count read.
        n_dims: u32,
        /// Where the count starts.
        offset: u64,
    },
    /// The element count or byte size of a tensor does not fit in 64 bits.
    #[error("tensor {tensor:?}: size of shape {dims:?} overflows 64 bits")]
    SizeOverflow {
        /// The tensor's name.
        tensor: String,
        /// Its dimensions.
        dims: Vec<u64>,
    },
    /// The row length (`dims[0]`) is not a whole number of the type's blocks.
    #[error("tensor {tensor:?}: row length {row} is not a multiple of {ty}'s block size {block}")]
    PartialBlock {
        /// The tensor's name.
        tensor: String,
        /// Its type.
        ty: GgmlType,
        /// `dims[0]`.
        row: u64,
        /// The type's block size.
        block: u64,
    },
    /// A tensor's data offset is not a multiple of the file's alignment.
    #[error(
        "tensor {tensor:?}: data offset {offset} is not a multiple of the alignment {alignment}"
    )]
    UnalignedTensor {
        /// The tensor's name.
        tensor: String,
        /// Its offset, relative to the data section.
        offset: u64,
        /// The file's alignment.
        alignment: u64,
    },
    /// A tensor's data extends past the end of the file.
    #[error(
        "tensor {tensor:?}: data at offset {offset} + {n_bytes} bytes runs past the data section ({data_size} bytes)"
    )]
    TensorOutOfBounds {
        /// The tensor's name.
        tensor: String,
        /// Its offset, relative to the data section.
        offset: u64,
        /// Its size in bytes.
        n_bytes: u64,
        /// Size of the data section.
        data_size: u64,
    },
    /// Two tensors' data ranges overlap.
    #[error(
        "tensors {first:?} and {second:?} overlap: {second:?} starts at offset {offset}, inside {first:?}"
    )]
    OverlappingTensors {
        /// The tensor that starts first.
        first: String,
        /// The tensor that starts inside it.
        second: String,
        /// Where `second` starts, relative to the data section.
        offset: u64,
    },
    /// The same tensor name appears twice.
    #[error("duplicate tensor name {tensor:?} at byte {offset}")]
    DuplicateTensor {
        /// The repeated name.
        tensor: String,
        /// Where the second occurrence starts (0 when raised by the writer).
        offset: u64,
    },
    /// A key that was asked for is absent.
    #[error("metadata key {key:?} is missing")]
    MissingKey {
        /// The key asked for.
        key: String,
    },
    /// A key holds a value of another type than the one asked for.
    #[error("metadata key {key:?}: expected {expected}, found {actual}")]
    WrongType {
        /// The key asked for.
        key: String,
        /// The type the caller wanted.
        expected: &'static str,
        /// The type the file holds.
        actual: String,
    },
    /// A numeric key's value does not fit the type asked for without loss.
    #[error("metadata key {key:?}: value {value} does not fit in {expected}")]
    OutOfRange {
        /// The key asked for.
        key: String,
        /// The type the caller wanted.
        expected: &'static str,
        /// The value, printed.
        value: String,
    },
    /// The writer was given tensor bytes of the wrong length for the tensor's type and shape.
    #[error("tensor {tensor:?}: {actual} data bytes given, type and shape need {expected}")]
    TensorDataSize {
        /// The tensor's name.
        tensor: String,
        /// Bytes the type and shape need.
        expected: u64,
        /// Bytes given.
        actual: u64,
    },
}
