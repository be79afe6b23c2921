//! JSON body and path extractors whose rejections are [`ApiError`]s, so that a malformed body
//! or path segment (`%FF`, say) gets the same JSON error shape, with the trace id, as everything
//! else (axum's own rejections are plain text).

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use super::error::ApiError;
use crate::state::AppState;

#[derive(Debug)]
pub(super) struct ApiJson<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        match axum::Json::<T>::from_request(request, state).await {
            Ok(axum::Json(value)) => Ok(Self(value)),
            Err(rejection) => Err(map_rejection(rejection, state.limits.body_limit_bytes)),
        }
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
