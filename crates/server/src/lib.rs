//! ferrite-server: the OpenAI- and Anthropic-compatible HTTP front end.
//!
//! Design: the HTTP layer never sees tensors, sessions or the scheduler. It talks to an
//! engine only through the narrow [`ferrite_engine::Backend`] trait (render and tokenize
//! prompts, submit a `GenRequest`, read `GenEvent`s from a channel whose drop cancels the
//! work). [`router`] builds the whole API as an axum `Router` over an [`AppState`], separate
//! from binding a socket, so tests drive it with `tower::ServiceExt::oneshot` over a fake
//! engine. The real engine (`ferrite_engine::Engine`: slot scheduler, prefix cache in memory
//! and on disk, CPU and CUDA runtimes) lives in `ferrite-engine`; this crate depends on no
//! model, kernel or cache crate.
//!
//! Endpoints: `GET /health` (503 while loading), `GET /v1/models[/{id}]`, `GET /metrics`
//! (Prometheus text), `POST /v1/chat/completions`, `/v1/completions`, `/v1/responses`
//! (stateless), `/v1/messages` and `/v1/messages/count_tokens` (Anthropic), `/tokenize`,
//! `/detokenize`. Errors use each API's own JSON shape; streams are SSE with keep-alive
//! comments. Responses report the engine's `cache_source` and `cached_tokens`.
//!
//! ```
//! use ferrite_server::{AppState, ServerConfig, router};
//! let state = AppState::new(ServerConfig::default());
//! // No backend yet: /health answers 503 until `state.set_backend(...)` is called.
//! let _app = router(state);
//! ```

#![deny(missing_docs)]

mod anthropic;
mod chat;
mod cors;
mod error;
mod generate;
#[cfg(test)]
mod http_api_tests;
#[cfg(test)]
mod http_reasoning_tests;
#[cfg(test)]
mod http_tests;
mod metrics;
mod openai;
mod parse;
mod responses;
mod routes;
mod speculative;
mod structured;
#[cfg(test)]
mod testing;
mod tool_choice;
mod tools;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use ferrite_engine::Backend;

pub use cors::{Cors, CorsError};
pub use error::{ApiError, Flavor};
pub use routes::{route_table, router};

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
    /// How reasoning is marked in chat output (`--reasoning-format`).
    pub reasoning_format: ferrite_engine::output::ReasoningFormat,
    /// Most reasoning tokens of a generation that sets no budget itself
    /// (`--reasoning-budget`); `None`: no limit.
    pub reasoning_budget: Option<usize>,
    /// The tool-call syntax parsed out of chat output (`--tool-syntax`); `None`: the one the
    /// model's template shows.
    pub tool_syntax: Option<ferrite_engine::output::ToolSyntax>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            api_key: None,
            max_body_bytes: 8 << 20,
            cors: Cors::Off,
            keepalive: Duration::from_secs(10),
            reasoning_format: ferrite_engine::output::ReasoningFormat::Auto,
            reasoning_budget: None,
            tool_syntax: None,
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
