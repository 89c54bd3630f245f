//! ferrite-quant (work in progress).
