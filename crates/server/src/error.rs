//! The API's errors: each a status code and a JSON body `{"error": {"code", "message"}}` that
//! says what is wrong. Nothing reaches the client as a bare 500 without a message.

use api::{ErrorBody, ErrorDetail, InputError};
use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use store::StoreError;
use trust::TrustError;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Unauthorized(String),
    #[error("{0}")]
    PaymentRequired(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    MethodNotAllowed(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    TooLarge(String),
    #[error("{0}")]
    UnsupportedMediaType(String),
    #[error("too many requests: at most {0} per second; retry after a pause")]
    RateLimited(u32),
    #[error("{0}")]
    Unavailable(String),
    #[error("internal error: {0}")]
    Internal(String),
}

impl ApiError {
    fn parts(&self) -> (StatusCode, &'static str) {
        match self {
            ApiError::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            ApiError::Unauthorized(_) => (StatusCode::UNAUTHORIZED, "unauthorized"),
            ApiError::PaymentRequired(_) => (StatusCode::PAYMENT_REQUIRED, "payment_required"),
            ApiError::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden"),
            ApiError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            ApiError::MethodNotAllowed(_) => (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"),
            ApiError::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            ApiError::TooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
            ApiError::UnsupportedMediaType(_) => (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type"),
            ApiError::RateLimited(_) => (StatusCode::TOO_MANY_REQUESTS, "rate_limited"),
            ApiError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            ApiError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.parts();
        if status.is_server_error() {
            tracing::error!(error = %self, "request failed");
        }
        let body = ErrorBody {
            error: ErrorDetail {
                code: code.to_string(),
                message: self.to_string(),
            },
        };
        let mut response = (status, Json(body)).into_response();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            // The rest of the body stays unread, so this connection cannot serve another
            // request; saying so keeps the client from sending its next one down it.
            response.headers_mut().insert(
                axum::http::header::CONNECTION,
                axum::http::HeaderValue::from_static("close"),
            );
        }
        response
    }
}

impl From<InputError> for ApiError {
    fn from(error: InputError) -> ApiError {
        ApiError::BadRequest(error.0)
    }
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> ApiError {
        match error {
            StoreError::Conflict(what) => ApiError::Conflict(format!("{what} already exists")),
            StoreError::NotFound(what) => ApiError::NotFound(format!("{what} not found")),
            StoreError::Refused(why) => ApiError::Conflict(why),
            other => ApiError::Unavailable(format!("the database could not serve this request ({other}); retry")),
        }
    }
}

impl From<TrustError> for ApiError {
    fn from(error: TrustError) -> ApiError {
        match error {
            TrustError::NonceCacheFull => ApiError::Unavailable(error.to_string()),
            TrustError::BadKey(_) => ApiError::BadRequest(error.to_string()),
            // A signing header missing or malformed: the request proves no node, as a missing or
            // malformed API key proves no party (401, not 400).
            // As the trust crate documents: the request was authentic, but already served.
            TrustError::Replayed => ApiError::Conflict(error.to_string()),
            _ => ApiError::Unauthorized(error.to_string()),
        }
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

/// Seconds a client told 429 or 503 waits before it asks again: the rate limits refill per
/// second, and a store or a leader that is briefly away is back within that order. Clients add
/// their own jitter on top (`api::backoff`), so a crowd told the same second spreads out.
pub const RETRY_AFTER_S: u64 = 1;

/// Names a wait on every 429 and 503 that does not name one already, whichever part of the
/// server (a handler, an extractor, the gateway) refused: layered over the whole router.
pub async fn name_the_wait(mut response: Response) -> Response {
    let status = response.status();
    if (status == StatusCode::TOO_MANY_REQUESTS || status == StatusCode::SERVICE_UNAVAILABLE)
        && !response.headers().contains_key(axum::http::header::RETRY_AFTER)
    {
        response.headers_mut().insert(
            axum::http::header::RETRY_AFTER,
            axum::http::HeaderValue::from(RETRY_AFTER_S),
        );
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_429_and_503_names_a_wait_and_nothing_else_does() {
        for error in [
            ApiError::RateLimited(10),
            ApiError::Unavailable("the store is away".into()),
        ] {
            let response = name_the_wait(error.into_response()).await;
            let wait = response.headers().get(axum::http::header::RETRY_AFTER);
            assert_eq!(wait.and_then(|value| value.to_str().ok()), Some("1"));
        }
        for error in [
            ApiError::BadRequest("no".into()),
            ApiError::Conflict("taken".into()),
            ApiError::Internal("broken".into()),
        ] {
            let response = name_the_wait(error.into_response()).await;
            assert!(response.headers().get(axum::http::header::RETRY_AFTER).is_none());
        }
        let mut told = ApiError::RateLimited(1).into_response();
        told.headers_mut()
            .insert(axum::http::header::RETRY_AFTER, axum::http::HeaderValue::from(30u64));
        let kept = name_the_wait(told).await;
        assert_eq!(kept.headers()[axum::http::header::RETRY_AFTER], "30");
    }
}
