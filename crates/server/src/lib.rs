//! ferrite-server: the OpenAI- and Anthropic-compatible HTTP front end.
//!
//! Design: the HTTP layer never sees tensors or sessions. It talks to an engine through the
//! narrow [`Backend`] trait (render and tokenize prompts, submit a [`GenRequest`], read
//! [`GenEvent`]s from a channel whose drop cancels the work). [`router`] builds the whole
//! API as an axum `Router` over an [`AppState`], separate from binding a socket, so tests
//! drive it with `tower::ServiceExt::oneshot`. The real engine ([`engine::Engine`]) runs on
//! a dedicated thread that owns the model and its slots.
//!
//! Endpoints: `GET /health` (503 while loading), `GET /v1/models[/{id}]`, `GET /metrics`
//! (Prometheus text), `POST /v1/chat/completions`, `/v1/completions`, `/v1/responses`
//! (stateless), `/v1/messages` and `/v1/messages/count_tokens` (Anthropic), `/tokenize`,
//! `/detokenize`. Errors use each API's own JSON shape; streams are SSE with keep-alive
//! comments.
//!
//! Prefix reuse ([`engine::prefix`]): besides each slot's own KV, a block-hashed cache of
//! finished sequences shared by all slots (memory, and snapshot files with `--kv-disk-dir`
//! that survive restarts); responses report `cache_source` and `cached_tokens`.
//!
//! Scheduling ([`engine::scheduler`]): up to N slots each keeping its KV cache, a bounded
//! FIFO queue (429 when full), longest-prefix slot reuse, a shared per-step prefill budget,
//! and one decode token per active slot per step. Slots are evaluated one after another:
//! there is no fused multi-sequence forward pass yet, so aggregate decode speed does not
//! grow with concurrency.
//!
//! ```
//! use ferrite_server::{AppState, ServerConfig, router};
//! let state = AppState::new(ServerConfig::default());
//! // No backend yet: /health answers 503 until `state.set_backend(...)` is called.
//! let _app = router(state);
//! ```

#![deny(missing_docs)]

mod anthropic;
mod backend;
mod chat;
mod cors;
pub mod engine;
mod error;
mod generate;
#[cfg(test)]
mod http_api_tests;
#[cfg(test)]
mod http_tests;
mod metrics;
mod openai;
mod parse;
mod responses;
mod routes;
mod stops;
#[cfg(test)]
mod testing;
mod tool_choice;
mod tools;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

pub use backend::{
    Backend, BackendError, CacheSource, ChatPrompt, EngineStats, FinishReason, GenEvent,
    GenRequest, OutputFormat, SamplingParams, SubmitError, Timings, TokenLogprob, TopLogprob,
    Usage,
};
pub use cors::{Cors, CorsError};
pub use error::{ApiError, Flavor};
pub use routes::{route_table, router};
pub use stops::{Scanned, StopScanner};

use metrics::{Metrics, RequestIds};

/// Settings of the HTTP layer.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// When set, every endpoint except `/health` requires `Authorization: Bearer KEY` or
    /// `x-api-key: KEY`.
    pub api_key: Option<String>,
    /// Largest accepted request body; larger ones get 413.
    pub max_body_bytes: usize,
    /// Which web pages' origins may call the API from a browser.
    pub cors: Cors,
    /// Interval of SSE keep-alive comments while a stream has nothing to send (long prefill,
    /// queue wait).
    pub keepalive: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            api_key: None,
            max_body_bytes: 8 << 20,
            cors: Cors::Off,
            keepalive: Duration::from_secs(10),
        }
    }
}

struct Shared {
    backend: OnceLock<Arc<dyn Backend>>,
    config: ServerConfig,
    metrics: Arc<Metrics>,
    ids: RequestIds,
}

/// State shared by all handlers: the backend (set once loading finishes), settings and
/// counters. Cheap to clone.
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

impl AppState {
    /// State with no backend yet (the server reports 503 while loading).
    pub fn new(config: ServerConfig) -> AppState {
        AppState(Arc::new(Shared {
            backend: OnceLock::new(),
            config,
            metrics: Arc::new(Metrics::default()),
            ids: RequestIds::default(),
        }))
    }

    /// Install the loaded backend; later calls are ignored (returns false).
    pub fn set_backend(&self, backend: Arc<dyn Backend>) -> bool {
        self.0.backend.set(backend).is_ok()
    }

    /// The backend, or 503 while the model is loading.
    fn backend(&self) -> Result<&Arc<dyn Backend>, ApiError> {
        self.0.backend.get().ok_or_else(|| {
            ApiError::new(
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                "the model is still loading",
            )
        })
    }

    fn config(&self) -> &ServerConfig {
        &self.0.config
    }
}
