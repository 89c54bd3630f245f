//! ferrite-tokenizer (work in progress).
