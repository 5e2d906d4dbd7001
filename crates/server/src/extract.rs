//! Request extractors: JSON bodies that refuse bad input with a precise 400, the API-key
//! caller, and agents' signed requests (signature, clock skew, nonce replay, rate limit).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::state::{AppState, Caller};

/// A JSON request body, read whole (the body limit layer turns an oversized one into a 413).
pub struct JsonBody<T>(pub T);

async fn read_body(request: Request) -> Result<Bytes, ApiError> {
    Bytes::from_request(request, &()).await.map_err(|rejection| {
        if rejection.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::TooLarge(format!(
                "request body is larger than {} bytes",
                api::REQUEST_BODY_BYTES_MAX
            ))
        } else {
            ApiError::BadRequest(format!("could not read the request body: {rejection}"))
        }
    })
}

/// A body sent with a request whose route takes none (a GET, HEAD, DELETE or OPTIONS of the
/// API) is read and dropped before the route answers: left unread, it would make the
/// connection close under the answer and cut a long one short. One over the body limit is
/// refused with a 413, as any is. The gateway's routes (`/s/…`) pass their bodies through.
pub async fn read_unused_body(request: Request, next: axum::middleware::Next) -> axum::response::Response {
    use axum::http::Method;
    use axum::response::IntoResponse;
    let bodiless = matches!(
        *request.method(),
        Method::GET | Method::HEAD | Method::DELETE | Method::OPTIONS
    );
    let has_body = request.headers().contains_key(axum::http::header::CONTENT_LENGTH)
        || request.headers().contains_key(axum::http::header::TRANSFER_ENCODING);
    if !bodiless || !has_body || request.uri().path().starts_with("/s/") {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    if axum::body::to_bytes(body, api::REQUEST_BODY_BYTES_MAX).await.is_err() {
        return ApiError::TooLarge(format!(
            "request body is larger than {} bytes (and this request takes none)",
            api::REQUEST_BODY_BYTES_MAX
        ))
        .into_response();
    }
    next.run(Request::from_parts(parts, axum::body::Body::empty())).await
}

/// Parses a JSON body; a refusal names the field at fault (`leases[0]: invalid type …`).
///
/// A number with no fraction written as a float (`8.0`) is the integer it equals, as JSON Schema
/// reads it: a body refused for a float where an integer belongs is read again with such
/// numbers made integers (only then, so the common path parses once).
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    // Every body of the API is an object; serde would read a struct from an array too.
    if bytes.iter().find(|byte| !byte.is_ascii_whitespace()) == Some(&b'[') {
        return Err(ApiError::BadRequest(
            "invalid JSON body: give an object, not an array".into(),
        ));
    }
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let parsed: T = match serde_path_to_error::deserialize(&mut deserializer) {
        Ok(parsed) => parsed,
        Err(error) if error.inner().to_string().starts_with("invalid type: floating point") => {
            let Ok(mut value) = serde_json::from_slice::<serde_json::Value>(bytes) else {
                return Err(refusal(error));
            };
            integral_floats_as_integers(&mut value);
            // Read again, a refusal names what is wrong with the integers made integers.
            return serde_path_to_error::deserialize(value).map_err(refusal);
        }
        Err(error) => return Err(refusal(error)),
    };
    deserializer
        .end()
        .map_err(|error| ApiError::BadRequest(format!("invalid JSON body: {error}")))?;
    Ok(parsed)
}

fn refusal(error: serde_path_to_error::Error<serde_json::Error>) -> ApiError {
    let path = error.path().to_string();
    let inner = error.into_inner();
    if path.is_empty() || path == "." {
        ApiError::BadRequest(format!("invalid JSON body: {inner}"))
    } else {
        ApiError::BadRequest(format!("invalid JSON body: {path}: {inner}"))
    }
}

/// `8.0` becomes `8` wherever it is in `value`, within i64 or u64. An integer written past
/// their ranges reads as a float too: past u64's, it rounds to 2^64 or more and stays a float;
/// below i64's, it rounds to -2^63 or less and stays a float (so does -2^63 written as a float).
fn integral_floats_as_integers(value: &mut serde_json::Value) {
    const TWO_63: f64 = 9_223_372_036_854_775_808.0;
    match value {
        serde_json::Value::Number(number) => {
            if let Some(float) = number.as_f64().filter(|_| number.is_f64())
                && float.fract() == 0.0
            {
                if float > -TWO_63 && float < TWO_63 {
                    *number = (float as i64).into();
                } else if (TWO_63..2.0 * TWO_63).contains(&float) {
                    *number = (float as u64).into();
                }
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(integral_floats_as_integers),
        serde_json::Value::Object(fields) => fields.values_mut().for_each(integral_floats_as_integers),
        _ => {}
    }
}

fn check_content_type(parts: &Parts) -> Result<(), ApiError> {
    match parts.headers.get(axum::http::header::CONTENT_TYPE) {
        None => Ok(()),
        Some(value) => {
            let text = value.to_str().unwrap_or("");
            if text.starts_with("application/json") {
                Ok(())
            } else {
                Err(ApiError::UnsupportedMediaType(format!(
                    "content-type {text:?}: send application/json"
                )))
            }
        }
    }
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, _state: &S) -> Result<Self, ApiError> {
        let (parts, body) = request.into_parts();
        check_content_type(&parts)?;
        let bytes = read_body(Request::from_parts(parts, body)).await?;
        Ok(JsonBody(parse_json(&bytes)?))
    }
}

/// The caller of a tenant / provider / admin endpoint, from `Authorization: Bearer <API key>`.
pub struct Auth(pub Caller);

/// The caller of a service through the gateway: the tenant's API key as a bearer token, or a
/// per-service key (then the service it calls, the only one it may), not counted against the
/// API's rate limit.
pub struct ServiceAuth(pub Caller, pub Option<String>);

/// The API key in an `Authorization: Bearer` header.
fn bearer(parts: &Parts) -> Result<&str, ApiError> {
    let header = parts
        .headers
        .get(axum::http::header::AUTHORIZATION)
        .ok_or_else(|| ApiError::Unauthorized("send Authorization: Bearer <API key>".into()))?;
    let text = header
        .to_str()
        .map_err(|_| ApiError::Unauthorized("Authorization header is not text".into()))?;
    let key = text
        .strip_prefix("Bearer ")
        .ok_or_else(|| ApiError::Unauthorized("Authorization must be \"Bearer <API key>\"".into()))?;
    Ok(key.trim())
}

impl FromRequestParts<Arc<AppState>> for Auth {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<AppState>) -> Result<Self, ApiError> {
        Ok(Auth(state.authenticate(bearer(parts)?).await?))
    }
}

impl FromRequestParts<Arc<AppState>> for ServiceAuth {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<AppState>) -> Result<Self, ApiError> {
        let presented = bearer(parts)?;
        match state.caller_of_key(presented).await {
            Ok(caller) => Ok(ServiceAuth(caller, None)),
            Err(error) => match state.service_of_key(presented).await {
                Ok((caller, service)) => Ok(ServiceAuth(caller, Some(service))),
                Err(_) => Err(error),
            },
        }
    }
}

/// The reader of `/metrics`: an admin's API key, or the metrics token (`Config::metrics_token`,
/// what a Prometheus server is given). Anyone else gets a 401, a tenant's or provider's key too:
/// the metrics show the platform's fee balance and every tenant's services.
pub struct MetricsReader;

impl FromRequestParts<Arc<AppState>> for MetricsReader {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<AppState>) -> Result<Self, ApiError> {
        let refused = || {
            ApiError::Unauthorized(
                "/metrics is read with an admin's API key or the metrics token (fallow server \
                 --metrics-token-file): send Authorization: Bearer <key or token>"
                    .into(),
            )
        };
        let presented = bearer(parts).map_err(|_| refused())?;
        // Compared as hashes: `verify_secret` compares in constant time.
        if let Some(token) = &state.config.metrics_token
            && trust::verify_secret(presented, &trust::hash_secret(token))
        {
            return Ok(MetricsReader);
        }
        match state.authenticate(presented).await {
            Ok(caller) if caller.role == store::Role::Admin => Ok(MetricsReader),
            Ok(_) | Err(ApiError::Unauthorized(_)) => Err(refused()),
            Err(error) => Err(error),
        }
    }
}

/// A request signed by a node's key: verified, fresh, never seen before (checked against this
/// replica's memory and, through a group commit, against every replica's record).
///
/// `IDEMPOTENT` requests (a heartbeat, a lease poll) are checked against this replica's memory
/// only, which saves a write per heartbeat. Replayed at another replica or after a restart,
/// within the allowed clock skew, such a request moves no money and no lease: at worst an old
/// telemetry reading counts once more as the node's latest.
pub struct Signed<T, const IDEMPOTENT: bool = false> {
    pub node_id: i64,
    pub provider_id: i64,
    pub body: T,
    /// The signing headers and the body as sent: with the method and path, enough for anyone
    /// to check the signature again (kept as evidence where the request is).
    pub headers: trust::SignedHeaders,
    pub raw_body: String,
}

impl<T, const IDEMPOTENT: bool> Signed<T, IDEMPOTENT> {
    /// The request as evidence: what was signed, and the signature.
    pub fn evidence(&self, method: &str, path: &str) -> serde_json::Value {
        serde_json::json!({
            "method": method,
            "path": path,
            "timestamp_ms": self.headers.timestamp_ms,
            "nonce": self.headers.nonce,
            "signature_hex": self.headers.signature_hex,
            "body": self.raw_body,
        })
    }

    /// How far the node's clock is ahead of the coordinator's (ms), from when it signed.
    pub fn clock_offset_ms(&self, now_us: i64) -> i64 {
        self.headers.timestamp_ms - now_us / 1000
    }
}

impl<T: DeserializeOwned, const IDEMPOTENT: bool> FromRequest<Arc<AppState>> for Signed<T, IDEMPOTENT> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &Arc<AppState>) -> Result<Self, ApiError> {
        let (parts, body) = request.into_parts();
        check_content_type(&parts)?;
        let headers = trust::SignedHeaders::from_headers(|name| parts.headers.get(name).and_then(|v| v.to_str().ok()))?;
        let method = parts.method.as_str().to_string();
        let path = parts
            .uri
            .path_and_query()
            .map_or_else(|| parts.uri.path().to_string(), |path| path.as_str().to_string());
        let bytes = read_body(Request::from_parts(parts, body)).await?;
        let node_id = headers.node_id;
        let identity = state.node_identity(node_id).await?;
        let now_ms = state.now_us() / 1000;
        let checked = match trust::prepare_request(
            &identity.key,
            node_id,
            &method,
            &path,
            &bytes,
            &headers,
            now_ms,
            state.config.max_skew_ms,
        ) {
            Ok(check) => {
                if state.signatures.verify(check).await {
                    Ok(())
                } else {
                    Err(trust::TrustError::BadSignature)
                }
            }
            Err(error) => Err(error),
        };
        if let Err(error) = checked {
            Metrics::add(&state.metrics.signatures_refused, 1);
            if matches!(error, trust::TrustError::BadSignature) {
                let _ = state
                    .store
                    .record_evidence(
                        Some(node_id),
                        "bad_signature",
                        &format!("{method} {path}"),
                        state.now_us(),
                    )
                    .await;
            }
            return Err(error.into());
        }
        state.rate_limit(true, node_id)?;
        let remembered = state.nonce_cache.lock().expect("nonce cache lock").check_and_remember(
            node_id,
            &headers.nonce,
            headers.timestamp_ms,
            now_ms,
        );
        if let Err(error) = remembered {
            Metrics::add(&state.metrics.signatures_refused, 1);
            if matches!(error, trust::TrustError::Replayed) {
                let _ = state
                    .store
                    .record_evidence(
                        Some(node_id),
                        "replayed_nonce",
                        &format!("{method} {path}"),
                        state.now_us(),
                    )
                    .await;
            }
            return Err(error.into());
        }
        let fresh = IDEMPOTENT
            || state
                .nonces
                .submit((node_id, headers.nonce.clone(), headers.timestamp_ms * 1000))
                .await?;
        if !fresh {
            Metrics::add(&state.metrics.signatures_refused, 1);
            let _ = state
                .store
                .record_evidence(
                    Some(node_id),
                    "replayed_nonce",
                    &format!("{method} {path}"),
                    state.now_us(),
                )
                .await;
            return Err(trust::TrustError::Replayed.into());
        }
        let body = if bytes.is_empty() {
            parse_json(b"null").or_else(|_| parse_json(b"{}"))?
        } else {
            parse_json(&bytes)?
        };
        Ok(Signed {
            node_id,
            provider_id: identity.provider_id,
            body,
            headers,
            raw_body: String::from_utf8_lossy(&bytes).into_owned(),
        })
    }
}

/// A path parameter (`axum::extract::Path`) whose refusal is the API's JSON 400, not plain text;
/// one with a NUL character is refused.
pub struct Path<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for Path<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        // A NUL reaches no name, key or id (and PostgreSQL refuses it in text): bad input.
        if parts.uri.path().to_ascii_lowercase().contains("%00") {
            return Err(ApiError::BadRequest(
                "a path parameter contains a NUL character (%00)".into(),
            ));
        }
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Path(value)| Path(value))
            .map_err(|rejection| ApiError::BadRequest(rejection.body_text()))
    }
}

/// The address the request came from, where the server knows it (served with connect info;
/// `None` for a router called in-process).
pub struct PeerAddr(pub Option<std::net::IpAddr>);

impl<S: Send + Sync> FromRequestParts<S> for PeerAddr {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        Ok(PeerAddr(
            parts
                .extensions
                .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
                .map(|info| info.0.ip()),
        ))
    }
}

/// A query string (`axum::extract::Query`) whose refusal is the API's JSON 400, not plain text.
pub struct Query<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for Query<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Query(value)| Query(value))
            .map_err(|rejection| ApiError::BadRequest(rejection.body_text()))
    }
}

#[cfg(test)]
mod tests {
    use super::parse_json;

    #[derive(serde::Deserialize, Debug, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Counts {
        small: u32,
        signed: i64,
        large: u64,
    }

    #[test]
    fn integers_written_as_floats_are_the_integers_they_equal() {
        let counts: Counts = parse_json(br#"{"small": 1529.0, "signed": -5.0, "large": 1.5e19}"#).expect("integral");
        assert_eq!(
            counts,
            Counts {
                small: 1529,
                signed: -5,
                large: 15_000_000_000_000_000_000
            }
        );
        for refused in [
            r#"{"small": 1.5, "signed": 0, "large": 0}"#,
            r#"{"small": 0, "signed": -9223372036854775809, "large": 0}"#,
            r#"{"small": 0, "signed": 0, "large": 18446744073709551616}"#,
            r#"{"small": 4294967296.0, "signed": 0, "large": 0}"#,
            r#"[0, 0, 0]"#,
        ] {
            let error = parse_json::<Counts>(refused.as_bytes()).expect_err(refused);
            assert!(error.to_string().contains("invalid JSON body"), "{refused}: {error}");
        }
    }
}
