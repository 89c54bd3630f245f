//! The real engine: a dedicated thread owning the model, the thread pool and one session
//! per slot, fed through a channel; [`Engine`] is its [`crate::Backend`] handle.

pub mod scheduler;
