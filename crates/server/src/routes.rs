//! The router, its middleware (request log, API key, CORS when asked) and the small endpoints: health,
//! models, metrics, tokenize and detokenize.

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::MethodRouter;
use serde_json::{Value, json};

use crate::error::{ApiError, Flavor};
use crate::metrics::RequestLog;
use crate::parse::{body_object, field, opt_bool, opt_str};
use crate::{AppState, anthropic, openai, responses};

/// Declares the API's routes once: [`route_table`] lists them (the README's endpoint table
/// is checked against it) and [`router`] registers them, so the two cannot differ.
macro_rules! routes {
    ($($method:ident $path:literal => $handler:expr,)*) => {
        fn routes() -> Vec<(&'static str, MethodRouter<AppState>)> {
            vec![$(($path, axum::routing::$method($handler)),)*]
        }

        /// Method and path of every route of [`router`], in registration order.
        pub fn route_table() -> Vec<(&'static str, &'static str)> {
            vec![$((stringify!($method), $path),)*]
        }
    };
}

routes! {
    get "/health" => health,
    get "/v1/models" => models,
    get "/v1/models/{*id}" => model,
    get "/metrics" => metrics,
    post "/v1/chat/completions" => openai::chat_completions,
    post "/v1/completions" => openai::completions,
    post "/v1/messages" => anthropic::messages,
    post "/v1/messages/count_tokens" => anthropic::count_tokens,
    post "/v1/responses" => responses::responses,
    post "/tokenize" => tokenize,
    post "/detokenize" => detokenize,
}

/// The whole HTTP API over `state`.
pub fn router(state: AppState) -> Router {
    let limit = state.config().max_body_bytes;
    let api = routes()
        .into_iter()
        .fold(Router::new(), |api, (path, handler)| {
            api.route(path, handler)
        })
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(limit))
        .layer(middleware::from_fn_with_state(state.clone(), auth));
    // Outside the key check: a browser's preflight carries no key.
    let api = match state.config().cors.layer() {
        Some(cors) => api.layer(cors),
        None => api,
    };
    api.layer(middleware::from_fn_with_state(state.clone(), log_request))
        .with_state(state)
}

/// Error shape by path: the Anthropic endpoints answer in Anthropic's shape.
fn flavor_of(path: &str) -> Flavor {
    if path.starts_with("/v1/messages") {
        Flavor::Anthropic
    } else {
        Flavor::OpenAi
    }
}

/// Outermost layer: one [`RequestLog`] per request, written when the response (or its
/// stream) is done.
async fn log_request(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let id = state.0.ids.next();
    let log = RequestLog::new(
        id,
        req.method().as_str(),
        req.uri().path(),
        state.0.metrics.clone(),
    );
    req.extensions_mut().insert(log.clone());
    let response = next.run(req).await;
    log.set_status(response.status().as_u16());
    response
}

/// API-key check (when configured); `/health` stays open for probes.
async fn auth(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let Some(key) = state.config().api_key.as_deref() else {
        return next.run(req).await;
    };
    let path = req.uri().path();
    if path == "/health" || key_matches(req.headers(), key) {
        return next.run(req).await;
    }
    ApiError::new(StatusCode::UNAUTHORIZED, "invalid or missing API key")
        .into_response(flavor_of(path))
}

fn key_matches(headers: &HeaderMap, key: &str) -> bool {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let x_api_key = headers.get("x-api-key").and_then(|v| v.to_str().ok());
    bearer == Some(key) || x_api_key == Some(key)
}

async fn not_found(req: Request) -> Response {
    let path = req.uri().path().to_string();
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("no route for {} {path}", req.method()),
    )
    .into_response(flavor_of(&path))
}

async fn method_not_allowed(req: Request) -> Response {
    let path = req.uri().path().to_string();
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{} is not allowed on {path}", req.method()),
    )
    .into_response(flavor_of(&path))
}

async fn health(State(state): State<AppState>) -> Response {
    let (status, message) = match state.backend() {
        Ok(b) if b.healthy() => return Json(json!({"status": "ok"})).into_response(),
        Ok(_) => ("error", "the engine has stopped"),
        Err(_) => ("loading", "the model is still loading"),
    };
    let error = json!({"message": message, "type": "service_unavailable_error", "param": null, "code": null});
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(json!({"status": status, "error": error})),
    )
        .into_response()
}

fn model_object(id: &str) -> Value {
    json!({"id": id, "object": "model", "created": 0, "owned_by": "ferrite"})
}

async fn models(State(state): State<AppState>) -> Response {
    match state.backend() {
        Ok(b) => {
            Json(json!({"object": "list", "data": [model_object(b.model_id())]})).into_response()
        }
        Err(e) => e.into_response(Flavor::OpenAi),
    }
}

async fn model(State(state): State<AppState>, Path(id): Path<String>) -> Response {
    let result = state.backend().and_then(|b| {
        if crate::generate::model_matches(b.as_ref(), &id) {
            Ok(Json(model_object(b.model_id())).into_response())
        } else {
            Err(ApiError {
                code: Some("model_not_found"),
                ..ApiError::new(
                    StatusCode::NOT_FOUND,
                    format!("model '{id}' does not exist"),
                )
            })
        }
    });
    result.unwrap_or_else(|e| e.into_response(Flavor::OpenAi))
}

async fn metrics(State(state): State<AppState>) -> Response {
    let stats = state.backend().ok().map(|b| b.stats());
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.0.metrics.render(stats),
    )
        .into_response()
}

async fn tokenize(State(state): State<AppState>, body: Result<Bytes, BytesRejection>) -> Response {
    let result = (|| {
        let obj = body_object(body)?;
        let backend = state.backend()?;
        let content = opt_str(&obj, "content")?.ok_or_else(|| ApiError::missing("content"))?;
        let add_special = opt_bool(&obj, "add_special")?.unwrap_or(false);
        let parse_special = opt_bool(&obj, "parse_special")?.unwrap_or(true);
        let tokens = backend.tokenize(content, add_special, parse_special);
        Ok::<_, ApiError>(Json(json!({"tokens": tokens})).into_response())
    })();
    result.unwrap_or_else(|e| e.into_response(Flavor::OpenAi))
}

async fn detokenize(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let result = (|| {
        let obj = body_object(body)?;
        let backend = state.backend()?;
        let tokens = crate::generate::token_array(
            field(&obj, "tokens").ok_or_else(|| ApiError::missing("tokens"))?,
            "tokens",
            backend.as_ref(),
        )?;
        let content = backend
            .detokenize(&tokens)
            .map_err(|e| ApiError::invalid_param("tokens", e.to_string()))?;
        Ok::<_, ApiError>(Json(json!({"content": content})).into_response())
    })();
    result.unwrap_or_else(|e| e.into_response(Flavor::OpenAi))
}
