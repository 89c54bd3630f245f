//! API errors and their two wire shapes (OpenAI and Anthropic).
//!
//! Handlers build one [`ApiError`]; the API family decides the JSON shape. A 4xx names its
//! cause; a 5xx gets a generic message and the detail goes to the request log.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// Which API family's error shape to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    /// `{"error":{"message","type","param","code"}}`
    OpenAi,
    /// `{"type":"error","error":{"type","message"}}`
    Anthropic,
}

/// An error answer of the HTTP API.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// What went wrong, for the client.
    pub message: String,
    /// The offending request field, if one.
    pub param: Option<String>,
    /// Machine-readable code (OpenAI `code`), if one.
    pub code: Option<&'static str>,
}

impl ApiError {
    /// 400 with a message.
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param: None,
            code: None,
        }
    }

    /// 400 naming the offending field.
    pub fn invalid_param(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            param: Some(param.to_string()),
            code: Some("invalid_value"),
            ..ApiError::bad_request(message)
        }
    }

    /// 400 for a missing required field.
    pub fn missing(param: &str) -> ApiError {
        ApiError {
            code: Some("missing_required_parameter"),
            ..ApiError::invalid_param(param, format!("missing required parameter: '{param}'"))
        }
    }

    /// Any status with a message.
    pub fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            param: None,
            code: None,
        }
    }

    /// 500 with a generic message; the detail is logged, not sent.
    pub fn internal(detail: &str) -> ApiError {
        eprintln!("internal error: {detail}");
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal server error")
    }

    /// The OpenAI `type` for this status.
    fn openai_type(&self) -> &'static str {
        match self.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::PAYLOAD_TOO_LARGE => "invalid_request_error",
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            StatusCode::SERVICE_UNAVAILABLE => "service_unavailable_error",
            s if s.is_server_error() => "server_error",
            _ => "invalid_request_error",
        }
    }

    /// The Anthropic `error.type` for this status.
    fn anthropic_type(&self) -> &'static str {
        match self.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::PAYLOAD_TOO_LARGE => "request_too_large",
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            StatusCode::SERVICE_UNAVAILABLE => "overloaded_error",
            s if s.is_server_error() => "api_error",
            _ => "invalid_request_error",
        }
    }

    /// The JSON body in the given shape.
    pub fn body(&self, flavor: Flavor) -> serde_json::Value {
        match flavor {
            Flavor::OpenAi => json!({"error": {
                "message": self.message,
                "type": self.openai_type(),
                "param": self.param,
                "code": self.code,
            }}),
            Flavor::Anthropic => json!({"type": "error", "error": {
                "type": self.anthropic_type(),
                "message": self.message,
            }}),
        }
    }

    /// The full HTTP response in the given shape.
    pub fn into_response(self, flavor: Flavor) -> Response {
        (self.status, Json(self.body(flavor))).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_follow_the_api_family() {
        let e = ApiError::invalid_param("n", "bad n");
        let o = e.body(Flavor::OpenAi);
        assert_eq!(o["error"]["param"], "n");
        assert_eq!(o["error"]["type"], "invalid_request_error");
        let a = e.body(Flavor::Anthropic);
        assert_eq!(a["type"], "error");
        assert_eq!(a["error"]["type"], "invalid_request_error");
        assert_eq!(a["error"]["message"], "bad n");
    }

    #[test]
    fn server_errors_are_generic() {
        let e = ApiError::internal("secret detail");
        assert_eq!(e.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(!e.message.contains("secret"));
    }
}
