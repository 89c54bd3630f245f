//! ferrite-server: the OpenAI- and Anthropic-compatible HTTP front end.
//!
//! Not implemented yet (issue 5). It will talk to `ferrite-engine` in tokens, sessions and
//! sampling parameters only; it must never see tensors or backend types.
