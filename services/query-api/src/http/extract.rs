//! A JSON extractor whose rejections are [`ApiError`]s, so that a malformed body gets the same
//! JSON error shape as everything else (axum's own rejections are plain text).

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use super::error::ApiError;
use crate::startup::AppState;

#[derive(Debug)]
pub struct ApiJson<T>(pub T);

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
