//! ferrite-cuda: the CUDA backend.
//!
//! Not implemented yet (issue 6). It will load CUDA at run time through cudarc's dynamic
//! loading, so the workspace builds and tests on machines without a CUDA toolkit.
