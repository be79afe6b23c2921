//! JSON body and path extractors whose rejections are [`ApiError`]s, so that a malformed body
//! or path segment (`%FF`, say) gets the same JSON error shape, with the trace id, as everything
//! else (axum's own rejections are plain text). Every body this service takes is a JSON object:
//! anything else is refused before it is decoded (serde would read `[null]` as a struct's
//! fields in order).

use axum::body::Bytes;
use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use serde::de::DeserializeOwned;

use super::error::ApiError;
use crate::state::AppState;

#[derive(Debug)]
pub(super) struct ApiJson<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        let limit = state.limits.body_limit_bytes;
        if !is_json(request.headers()) {
            return Err(ApiError::UnsupportedMediaType);
        }
        let bytes = Bytes::from_request(request, state)
            .await
            .map_err(|rejection| {
                if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                    ApiError::PayloadTooLarge { limit }
                } else {
                    ApiError::InvalidBody(rejection.body_text())
                }
            })?;
        let object = bytes.iter().find(|byte| !byte.is_ascii_whitespace()) == Some(&b'{');
        match axum::Json::<T>::from_bytes(&bytes) {
            Ok(axum::Json(value)) if object => Ok(Self(value)),
            // serde's message names what was expected (`an object with an `items` list`).
            Err(rejection) => Err(map_rejection(rejection, limit)),
            Ok(_) => Err(ApiError::InvalidBody(
                "the body must be a JSON object, not an array".to_owned(),
            )),
        }
    }
}

/// Whether the request says its body is JSON: `application/json` or `application/…+json`,
/// parameters aside, as axum's `Json` decides.
fn is_json(headers: &HeaderMap) -> bool {
    let Some(value) = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
    else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or("").trim();
    let Some((kind, subtype)) = essence.split_once('/') else {
        return false;
    };
    kind.eq_ignore_ascii_case("application")
        && (subtype.eq_ignore_ascii_case("json")
            || subtype.len() > 5
                && subtype.is_char_boundary(subtype.len() - 5)
                && subtype[subtype.len() - 5..].eq_ignore_ascii_case("+json"))
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    #[test]
    fn json_media_types_are_told_as_axum_tells_them() {
        let with = |value: &'static str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(value));
            is_json(&headers)
        };
        for json in [
            "application/json",
            "Application/JSON; charset=utf-8",
            "application/problem+json",
        ] {
            assert!(with(json), "{json}");
        }
        for other in [
            "text/plain",
            "application/jsonx",
            "application/+json",
            "json",
            "",
        ] {
            assert!(!with(other), "{other}");
        }
        assert!(!is_json(&HeaderMap::new()));
    }
}

fn map_rejection(rejection: JsonRejection, limit: usize) -> ApiError {
    match rejection {
        JsonRejection::MissingJsonContentType(_) => ApiError::UnsupportedMediaType,
        rejection if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            ApiError::PayloadTooLarge { limit }
        }
        JsonRejection::JsonDataError(error) => ApiError::InvalidBody(error.body_text()),
        JsonRejection::JsonSyntaxError(error) => ApiError::InvalidBody(error.body_text()),
        other => ApiError::InvalidBody(other.body_text()),
    }
}

/// Path parameters; a segment that is not valid percent-encoded UTF-8 is a 400 `invalid_query`.
#[derive(Debug)]
pub(super) struct ApiPath<T>(pub T);

impl<T, S> FromRequestParts<S> for ApiPath<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(value)) => Ok(Self(value)),
            Err(rejection) => Err(ApiError::InvalidQuery(format!(
                "a path segment is malformed: {}",
                rejection.body_text()
            ))),
        }
    }
}
