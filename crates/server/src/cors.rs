//! Cross-origin access (CORS) for browser clients: which web pages' origins may call the
//! API, as `ferrite serve --cors-origin` names them. Off unless asked: a local server that
//! answered every origin would let any website its user visits drive the model.
//!
//! Owns parsing the origins and building the layer that answers preflights and labels
//! responses. Never decides authentication: a preflight carries no key, and the real request
//! that follows it is still checked.

use std::time::Duration;

use axum::http::{HeaderValue, Method};
use tower_http::cors::{AllowHeaders, AllowOrigin, CorsLayer};

/// Which origins may call the API from a browser.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Cors {
    /// None: no CORS headers, so browsers refuse cross-origin calls.
    #[default]
    Off,
    /// Every origin (`*`).
    AnyOrigin,
    /// These origins, exactly.
    Origins(Vec<HeaderValue>),
}

/// An origin that is neither `*` nor `scheme://host[:port]`.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("CORS origin {origin:?} is not `*` or `http(s)://host[:port]` ({why})")]
pub struct CorsError {
    origin: String,
    why: &'static str,
}

impl Cors {
    /// The setting for `origins`: none is [`Cors::Off`], any `*` is [`Cors::AnyOrigin`].
    /// Each other origin must be what a browser sends in `Origin`: a scheme, a host and an
    /// optional port, with no path (a trailing `/` would never match).
    pub fn parse<S: AsRef<str>>(origins: &[S]) -> Result<Cors, CorsError> {
        let origins: Vec<&str> = origins.iter().map(AsRef::as_ref).collect();
        if origins.is_empty() {
            return Ok(Cors::Off);
        }
        if origins.contains(&"*") {
            return Ok(Cors::AnyOrigin);
        }
        origins
            .into_iter()
            .map(origin)
            .collect::<Result<_, _>>()
            .map(Cors::Origins)
    }

    /// The layer that answers preflights and labels responses; `None` when off.
    pub(crate) fn layer(&self) -> Option<CorsLayer> {
        let origins = match self {
            Cors::Off => return None,
            Cors::AnyOrigin => AllowOrigin::any(),
            Cors::Origins(list) => AllowOrigin::list(list.iter().cloned()),
        };
        Some(
            CorsLayer::new()
                .allow_origin(origins)
                .allow_methods([Method::GET, Method::POST])
                // The SDKs send headers of their own (the OpenAI SDK's `x-stainless-*`,
                // Anthropic's `anthropic-version`): whatever a preflight asks for is allowed.
                .allow_headers(AllowHeaders::mirror_request())
                .max_age(Duration::from_secs(24 * 60 * 60)),
        )
    }
}

/// One origin checked: `http://` or `https://`, then a host and an optional port.
fn origin(text: &str) -> Result<HeaderValue, CorsError> {
    let err = |why| CorsError {
        origin: text.to_owned(),
        why,
    };
    let rest = text
        .strip_prefix("http://")
        .or_else(|| text.strip_prefix("https://"))
        .ok_or_else(|| err("it must start with http:// or https://"))?;
    // An IPv6 host is bracketed, and holds colons of its own.
    let (host, port, host_byte): (_, _, fn(u8) -> bool) = match rest.strip_prefix('[') {
        Some(v6) => {
            let (host, after) = v6
                .split_once(']')
                .ok_or_else(|| err("its IPv6 host has no closing bracket"))?;
            let port = match after {
                "" => None,
                _ => Some(
                    after
                        .strip_prefix(':')
                        .ok_or_else(|| err("a path, query or other character follows the host"))?,
                ),
            };
            (host, port, |b| b.is_ascii_hexdigit() || b":.".contains(&b))
        }
        None => {
            let (host, port) = rest
                .rsplit_once(':')
                .map_or((rest, None), |(h, p)| (h, Some(p)));
            (host, port, |b| {
                b.is_ascii_alphanumeric() || b"-.".contains(&b)
            })
        }
    };
    if host.is_empty() {
        return Err(err("it has no host"));
    }
    if !host.bytes().all(host_byte) {
        return Err(err("a path, query or other character follows the host"));
    }
    if port.is_some_and(|p| p.parse::<u16>().is_err()) {
        return Err(err("its port is not a number up to 65535"));
    }
    HeaderValue::from_str(text).map_err(|_| err("it is not a header value"))
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::{Request, StatusCode, header};
    use tower::ServiceExt;

    use super::*;
    use crate::ServerConfig;
    use crate::http_tests::{REPLY, app_with};
    use crate::testing::Fake;

    const PAGE: &str = "http://localhost:3000";

    /// Status and headers of `method path` sent from a page of `origin`, with `headers`.
    async fn from_page(
        cors: Cors,
        method: &str,
        path: &str,
        origin: &str,
        headers: &[(&str, &str)],
    ) -> (StatusCode, axum::http::HeaderMap) {
        let config = ServerConfig {
            api_key: Some("sekret".into()),
            cors,
            ..ServerConfig::default()
        };
        let (app, _) = app_with(Fake::new(REPLY), config);
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header(header::ORIGIN, origin);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let resp = app.oneshot(req.body(Body::empty()).unwrap()).await.unwrap();
        (resp.status(), resp.headers().clone())
    }

    fn preflight(method: &str) -> [(&'static str, &str); 2] {
        [
            ("access-control-request-method", method),
            (
                "access-control-request-headers",
                "authorization,content-type,x-stainless-os",
            ),
        ]
    }

    fn allowed(headers: &axum::http::HeaderMap) -> Option<&str> {
        headers
            .get(header::ACCESS_CONTROL_ALLOW_ORIGIN)
            .map(|v| v.to_str().unwrap())
    }

    #[tokio::test]
    async fn a_named_origin_gets_its_preflight_answered_without_a_key() {
        let cors = Cors::parse(&[PAGE, "https://chat.example:8443"]).unwrap();
        let path = "/v1/chat/completions";
        let (status, h) = from_page(cors.clone(), "OPTIONS", path, PAGE, &preflight("POST")).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(allowed(&h), Some(PAGE));
        let methods = h[header::ACCESS_CONTROL_ALLOW_METHODS].to_str().unwrap();
        assert!(
            methods.contains("POST") && methods.contains("GET"),
            "{methods}"
        );
        assert_eq!(
            h[header::ACCESS_CONTROL_ALLOW_HEADERS],
            "authorization,content-type,x-stainless-os"
        );
        // The real request is labelled, and still needs the key.
        let key = [("authorization", "Bearer sekret")];
        let (status, h) = from_page(cors.clone(), "GET", "/v1/models", PAGE, &key).await;
        assert_eq!((status, allowed(&h)), (StatusCode::OK, Some(PAGE)));
        let (status, _) = from_page(cors.clone(), "GET", "/v1/models", PAGE, &[]).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        // Another origin gets no permission, whatever it asks.
        let other = "http://evil.example";
        let (_, h) = from_page(cors, "OPTIONS", path, other, &preflight("POST")).await;
        assert_eq!(allowed(&h), None);
    }

    #[tokio::test]
    async fn any_origin_is_star_and_off_answers_no_preflight() {
        let (_, h) = from_page(
            Cors::AnyOrigin,
            "OPTIONS",
            "/v1/messages",
            "http://x.example",
            &preflight("POST"),
        )
        .await;
        assert_eq!(allowed(&h), Some("*"));
        let (status, h) = from_page(
            Cors::Off,
            "OPTIONS",
            "/v1/messages",
            PAGE,
            &preflight("POST"),
        )
        .await;
        // Refused like any request without the key, and with no permission for the page.
        assert_eq!((status, allowed(&h)), (StatusCode::UNAUTHORIZED, None));
    }

    #[test]
    fn origins_parse_as_browsers_send_them() {
        assert_eq!(Cors::parse::<&str>(&[]), Ok(Cors::Off));
        assert_eq!(Cors::parse(&[PAGE, "*"]), Ok(Cors::AnyOrigin));
        let ok = [
            "http://localhost:3000",
            "https://a-b.example",
            "http://[::1]:8080",
        ];
        assert!(matches!(Cors::parse(&ok), Ok(Cors::Origins(v)) if v.len() == 3));
        for bad in [
            "localhost:3000",
            "http://",
            "http://a.example/",
            "http://a.example/chat",
            "http://a.example:99999",
            "http://a.example:x",
            "ftp://a.example",
            "http://a b",
            "http://[::1",
            "http://[::1]x",
            "http://[::g]",
        ] {
            let err = Cors::parse(&[bad]).unwrap_err();
            assert!(err.to_string().contains(bad), "{err}");
        }
    }
}
