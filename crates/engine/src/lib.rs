//! ferrite-engine (work in progress).
