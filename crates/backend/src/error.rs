//! The error type of the contract: what a backend returns when it cannot or will not run an
//! op. It never carries a partial result.

/// Everything a backend op can refuse or fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    /// The backend does not implement this op for this data type (its
    /// [`crate::Backend::supports`] said so before evaluation).
    #[error("{backend} backend: {op} is not supported for {dtype}: {reason}")]
    Unsupported {
        /// The op ([`crate::Op::name`]).
        op: &'static str,
        /// The data type asked for (weight type, KV type or activation).
        dtype: String,
        /// The backend ([`crate::Backend::name`]).
        backend: &'static str,
        /// Why not.
        reason: String,
    },
    /// Operands do not fit the op's shape (a buffer too short, widths that disagree).
    #[error("{op}: {what}")]
    Shape {
        /// The op.
        op: &'static str,
        /// Which check failed.
        what: String,
    },
    /// A KV store of this type cannot hold rows of this shape.
    #[error(
        "a {ty} KV cache cannot hold {heads} heads of {head_dim} values{}",
        if *ty == "q8" { " (q8 needs head sizes that are multiples of 32)" } else { "" }
    )]
    KvShape {
        /// [`crate::KvType::name`].
        ty: &'static str,
        /// KV heads.
        heads: usize,
        /// Values per head.
        head_dim: usize,
    },
    /// Memory for a buffer or a KV store could not be had.
    #[error("cannot allocate the {what}")]
    Alloc {
        /// What was being allocated.
        what: &'static str,
    },
    /// A kernel of the backend failed on a shape the contract accepted.
    #[error("{backend} backend: {op}: {source}")]
    Kernel {
        /// The backend.
        backend: &'static str,
        /// The op.
        op: &'static str,
        /// The kernel's own error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}
