//! Cross-origin access for H5 pages (`[http.cors]`): a preflight from a listed origin is
//! answered `204` by the edge with the methods and headers the public API takes; an actual
//! request from a listed origin gets `Access-Control-Allow-Origin` and the headers a page may
//! read; any other origin gets no CORS header at all (its preflight goes on to the router,
//! which answers `405`). Every answer of a listener with a list says `Vary: Origin`, so a shared
//! cache never hands one origin's answer to another.
//!
//! Written here rather than taken from `tower_http::cors` (docs/ARCHITECTURE.md): that layer
//! answers every `OPTIONS` as a preflight, sends the preflight's method and header lists to
//! origins it does not allow, answers `200`, and allocates a header map per request — and the
//! edge's hot path answers without a tower service to wrap.

use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::Response;

use crate::config::CorsSettings;

/// The methods of the public API.
const ALLOW_METHODS: HeaderValue = HeaderValue::from_static("GET, POST");
/// The request headers a page may send (beyond the CORS-safelisted ones).
const ALLOW_HEADERS: HeaderValue = HeaderValue::from_static(
    "content-type, x-client-id, x-request-class, traceparent, if-none-match",
);
/// The response headers a page may read (beyond the CORS-safelisted ones).
const EXPOSE_HEADERS: HeaderValue =
    HeaderValue::from_static("x-trace-id, retry-after, x-shed-level, server-timing, etag");
const TRUE: HeaderValue = HeaderValue::from_static("true");
const ANY: HeaderValue = HeaderValue::from_static("*");

/// The origins allowed to call the public API from a browser.
#[derive(Debug, Clone)]
pub struct Cors {
    origins: Origins,
    allow_credentials: bool,
    max_age: HeaderValue,
}

#[derive(Debug, Clone)]
enum Origins {
    Any,
    List(Vec<HeaderValue>),
}

impl Cors {
    /// `None` when no origin is listed: no CORS header is ever sent.
    pub fn from_settings(settings: &CorsSettings) -> Option<Self> {
        if settings.allowed_origins.is_empty() {
            return None;
        }
        let origins = if settings.allowed_origins.iter().any(|origin| origin == "*") {
            Origins::Any
        } else {
            Origins::List(
                settings
                    .allowed_origins
                    .iter()
                    // Validated by the config: printable ASCII.
                    .filter_map(|origin| HeaderValue::from_str(origin).ok())
                    .collect(),
            )
        };
        Some(Self {
            origins,
            allow_credentials: settings.allow_credentials,
            max_age: HeaderValue::from(settings.max_age_secs),
        })
    }

    /// The request's `Origin` when it is allowed.
    fn allowed<'a>(&self, headers: &'a HeaderMap) -> Option<&'a HeaderValue> {
        let origin = headers.get(header::ORIGIN)?;
        match &self.origins {
            Origins::Any => Some(origin),
            Origins::List(origins) => origins.contains(origin).then_some(origin),
        }
    }

    /// The `204` for a preflight from an allowed origin asking for a method the API takes;
    /// `None` for anything else (it goes on as an ordinary request).
    pub fn preflight(&self, request: &Request) -> Option<Response> {
        if request.method() != Method::OPTIONS {
            return None;
        }
        let headers = request.headers();
        let asked = headers.get(header::ACCESS_CONTROL_REQUEST_METHOD)?;
        if asked != "GET" && asked != "POST" && asked != "HEAD" {
            return None;
        }
        let origin = self.allowed(headers)?.clone();
        let mut response = Response::new(axum::body::Body::empty());
        *response.status_mut() = StatusCode::NO_CONTENT;
        let out = response.headers_mut();
        self.allow_origin(out, origin);
        out.insert(header::ACCESS_CONTROL_ALLOW_METHODS, ALLOW_METHODS);
        out.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, ALLOW_HEADERS);
        out.insert(header::ACCESS_CONTROL_MAX_AGE, self.max_age.clone());
        Some(response)
    }

    /// The request's `Origin` header, if it has one worth remembering for [`Cors::decorate`].
    pub fn origin_of(&self, headers: &HeaderMap) -> Option<HeaderValue> {
        self.allowed(headers).cloned()
    }

    /// Adds what an actual request's answer needs: `Vary: Origin` always (with a list), and for
    /// an allowed `origin` the origin itself and the headers its page may read.
    pub fn decorate(&self, origin: Option<HeaderValue>, response: &mut Response) {
        let headers = response.headers_mut();
        if headers.contains_key(header::ACCESS_CONTROL_ALLOW_ORIGIN) {
            return; // a preflight's answer, already complete
        }
        if let Origins::List(_) = self.origins {
            headers.append(header::VARY, HeaderValue::from_static("origin"));
        }
        if let Some(origin) = origin {
            self.allow_origin(headers, origin);
            headers.insert(header::ACCESS_CONTROL_EXPOSE_HEADERS, EXPOSE_HEADERS);
        }
    }

    fn allow_origin(&self, headers: &mut HeaderMap, origin: HeaderValue) {
        let value = match self.origins {
            Origins::Any if !self.allow_credentials => ANY,
            _ => origin,
        };
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, value);
        if self.allow_credentials {
            headers.insert(header::ACCESS_CONTROL_ALLOW_CREDENTIALS, TRUE);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cors(origins: &[&str]) -> Cors {
        Cors::from_settings(&CorsSettings {
            allowed_origins: origins.iter().map(|origin| (*origin).to_owned()).collect(),
            max_age_secs: 600,
            allow_credentials: false,
        })
        .unwrap()
    }

    fn preflight(origin: &str, method: &str) -> Request {
        Request::builder()
            .method(Method::OPTIONS)
            .uri("/api/v1/items:batch")
            .header(header::ORIGIN, origin)
            .header(header::ACCESS_CONTROL_REQUEST_METHOD, method)
            .body(axum::body::Body::empty())
            .unwrap()
    }

    #[test]
    fn an_allowed_origins_preflight_is_answered_and_others_are_not() {
        let cors = cors(&["https://h5.example.com"]);
        let answer = cors
            .preflight(&preflight("https://h5.example.com", "POST"))
            .unwrap();
        assert_eq!(answer.status(), StatusCode::NO_CONTENT);
        let headers = answer.headers();
        assert_eq!(
            headers[header::ACCESS_CONTROL_ALLOW_ORIGIN],
            "https://h5.example.com"
        );
        assert_eq!(headers[header::ACCESS_CONTROL_ALLOW_METHODS], "GET, POST");
        assert_eq!(headers[header::ACCESS_CONTROL_MAX_AGE], "600");
        assert!(
            headers
                .get(header::ACCESS_CONTROL_ALLOW_CREDENTIALS)
                .is_none()
        );
        assert!(
            cors.preflight(&preflight("https://evil.example", "POST"))
                .is_none()
        );
        assert!(
            cors.preflight(&preflight("https://h5.example.com", "DELETE"))
                .is_none()
        );
        // An OPTIONS without Access-Control-Request-Method is not a preflight.
        let plain = Request::builder()
            .method(Method::OPTIONS)
            .uri("/")
            .header(header::ORIGIN, "https://h5.example.com")
            .body(axum::body::Body::empty())
            .unwrap();
        assert!(cors.preflight(&plain).is_none());
    }

    #[test]
    fn answers_vary_by_origin_and_only_allowed_ones_are_named() {
        let cors = cors(&["https://h5.example.com"]);
        let mut headers = HeaderMap::new();
        headers.insert(
            header::ORIGIN,
            HeaderValue::from_static("https://evil.example"),
        );
        assert_eq!(cors.origin_of(&headers), None);
        let mut response = Response::new(axum::body::Body::empty());
        cors.decorate(None, &mut response);
        assert_eq!(response.headers()[header::VARY], "origin");
        assert!(
            response
                .headers()
                .get(header::ACCESS_CONTROL_ALLOW_ORIGIN)
                .is_none()
        );

        headers.insert(
            header::ORIGIN,
            HeaderValue::from_static("https://h5.example.com"),
        );
        let mut response = Response::new(axum::body::Body::empty());
        cors.decorate(cors.origin_of(&headers), &mut response);
        assert_eq!(
            response.headers()[header::ACCESS_CONTROL_ALLOW_ORIGIN],
            "https://h5.example.com"
        );
        assert!(
            response.headers()[header::ACCESS_CONTROL_EXPOSE_HEADERS]
                .to_str()
                .unwrap()
                .contains("x-trace-id")
        );
    }

    #[test]
    fn any_origin_is_a_star_unless_credentials_are_allowed() {
        let star = cors(&["*"]);
        let mut headers = HeaderMap::new();
        headers.insert(
            header::ORIGIN,
            HeaderValue::from_static("https://a.example"),
        );
        let mut response = Response::new(axum::body::Body::empty());
        star.decorate(star.origin_of(&headers), &mut response);
        assert_eq!(response.headers()[header::ACCESS_CONTROL_ALLOW_ORIGIN], "*");
        assert!(response.headers().get(header::VARY).is_none());
    }
}
