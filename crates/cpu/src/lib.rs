//! ferrite-cpu (work in progress).
