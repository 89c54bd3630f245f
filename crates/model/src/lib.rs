//! ferrite-model (work in progress).
