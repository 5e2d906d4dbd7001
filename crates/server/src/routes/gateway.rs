//! The gateway's routes: an agent's tunnel (`POST /v1/agent/tunnel`, signed, upgraded to
//! `fallow-tunnel`) and a service's endpoint (`/s/{service}/…`, the tenant's API key as a
//! bearer token), whose requests go to the service's ready replicas through their nodes'
//! tunnels (`crate::gateway`).

use axum::body::Body;
use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use std::sync::Arc;
use store::Role;

use crate::error::ApiError;
use crate::extract::{ServiceAuth, Signed};
use crate::gateway::{Endpoint, Outcome, Preference, REQUEST_BYTES_MAX, TUNNEL_PROTOCOL, Unanswered, answer};
use crate::state::AppState;

use super::AppStateRef;

/// The connection upgrade a tunnel request asks for.
pub struct Upgrade(hyper::upgrade::OnUpgrade);

impl FromRequestParts<Arc<AppState>> for Upgrade {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &Arc<AppState>) -> Result<Self, ApiError> {
        let asks = parts
            .headers
            .get(header::UPGRADE)
            .is_some_and(|value| value.as_bytes().eq_ignore_ascii_case(TUNNEL_PROTOCOL.as_bytes()));
        let upgrade = parts.extensions.remove::<hyper::upgrade::OnUpgrade>();
        match upgrade {
            Some(upgrade) if asks => Ok(Upgrade(upgrade)),
            _ => Err(ApiError::BadRequest(format!(
                "a tunnel is an HTTP/1.1 request with Connection: upgrade and Upgrade: {TUNNEL_PROTOCOL}"
            ))),
        }
    }
}

/// An agent's tunnel: once the 101 answer is sent, the connection is the gateway's HTTP/2
/// client to the agent.
pub async fn agent_tunnel(State(state): AppStateRef, Upgrade(upgrade): Upgrade, signed: Signed<Value>) -> Response {
    state.gateway.accept(signed.node_id, upgrade);
    let mut response = StatusCode::SWITCHING_PROTOCOLS.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static(TUNNEL_PROTOCOL));
    response
}

/// A service's ready replicas: from the gateway's cache while fresh, else from the store.
async fn ready_replicas(state: &AppState, tenant: i64, name: &str) -> Result<Arc<Vec<Endpoint>>, ApiError> {
    if let Some(endpoints) = state.gateway.cached(tenant, name) {
        return Ok(endpoints);
    }
    let found = state.store.serving_leases(tenant, name).await?;
    Ok(state
        .gateway
        .remember(tenant, name, found.iter().map(Endpoint::of).collect()))
}

/// How often a request waiting for a service's first replica looks again.
const WAKE_POLL: std::time::Duration = std::time::Duration::from_millis(200);

/// A request found no ready replica. A deployed service's request waits for one (asking for
/// one when it is scaled to zero) up to its `wake_timeout_s`, then gets a 503 saying so; a name
/// no deployed service or running job serves is a 404.
async fn wait_for_replica(
    state: &AppState,
    tenant: i64,
    name: &str,
) -> Result<Result<Arc<Vec<Endpoint>>, Response>, ApiError> {
    let Some(record) = state.store.service(tenant, name).await? else {
        return Ok(Err(answer(
            StatusCode::NOT_FOUND,
            &format!("no service {name:?}: none is deployed by that name and none of your running jobs serves it"),
        )));
    };
    let request = crate::wire::service_request(&record.spec)?;
    state.gateway.wake(tenant, name);
    if record.desired == 0 {
        state
            .store
            .set_service_desired(record.id, 1, &record.status, state.now_us())
            .await?;
        state.wake.notify_one();
        tracing::info!(service = name, "woken by a request");
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(u64::from(request.wake_timeout_s));
    while std::time::Instant::now() < deadline {
        tokio::time::sleep(WAKE_POLL).await;
        let endpoints = ready_replicas(state, tenant, name).await?;
        if !endpoints.is_empty() {
            return Ok(Ok(endpoints));
        }
    }
    let status = if record.status.is_empty() {
        String::new()
    } else {
        format!(" ({})", record.status)
    };
    Ok(Err(answer(
        StatusCode::SERVICE_UNAVAILABLE,
        &format!(
            "no replica of {name:?} became ready within {} s{status}: `fallow service show {name}` says why",
            request.wake_timeout_s
        ),
    )))
}

/// A request for a service: `/s/{service}/PATH?QUERY` goes to `/PATH?QUERY` on one of the
/// caller's ready replicas serving `service`.
pub async fn serve(State(state): AppStateRef, ServiceAuth(caller, only): ServiceAuth, request: Request) -> Response {
    if caller.role != Role::Tenant && caller.role != Role::Admin {
        return ApiError::Forbidden("services are called with a tenant's key".into()).into_response();
    }
    let started = std::time::Instant::now();
    let (parts, body) = request.into_parts();
    let rest = parts.uri.path().strip_prefix("/s/").unwrap_or_default();
    let (name, path) = match rest.find('/') {
        Some(at) => (&rest[..at], &rest[at..]),
        None => (rest, "/"),
    };
    if api::check_service_name("service", name).is_err() {
        return answer(
            StatusCode::NOT_FOUND,
            &format!("no service {name:?}: a service's name is letters, digits and '-'"),
        );
    }
    if only.as_deref().is_some_and(|only| only != name) {
        return ApiError::Forbidden(format!("this key calls its own service only, not {name:?}")).into_response();
    }
    let path_and_query = match parts.uri.query() {
        Some(query) => format!("{path}?{query}"),
        None => path.to_string(),
    };
    let endpoints = match ready_replicas(&state, caller.account_id, name).await {
        Ok(endpoints) => endpoints,
        Err(error) => return error.into_response(),
    };
    let endpoints = if endpoints.is_empty() {
        match wait_for_replica(&state, caller.account_id, name).await {
            Ok(Ok(endpoints)) => endpoints,
            Ok(Err(response)) if response.status() == StatusCode::NOT_FOUND => return response,
            Ok(Err(response)) => {
                state.gateway.record(
                    caller.account_id,
                    name,
                    Outcome {
                        error: true,
                        micros: started.elapsed().as_micros() as u64,
                        tokens: None,
                    },
                );
                return response;
            }
            Err(error) => return error.into_response(),
        }
    } else {
        endpoints
    };
    let body = match axum::body::to_bytes(Body::new(body), REQUEST_BYTES_MAX).await {
        Ok(body) => body,
        Err(_) => {
            return answer(
                StatusCode::PAYLOAD_TOO_LARGE,
                &format!("a request body is at most {REQUEST_BYTES_MAX} bytes"),
            );
        }
    };
    let forwarded = state
        .gateway
        .forward(
            &endpoints,
            &Preference::of(&parts.headers),
            parts.method,
            &path_and_query,
            &parts.headers,
            body,
        )
        .await;
    let (response, tokens) = match forwarded {
        Ok(answered) => answered,
        Err(Unanswered::NoReplica) => (
            answer(
                StatusCode::SERVICE_UNAVAILABLE,
                &format!("no replica of {name:?} is reachable now (their nodes' tunnels are down)"),
            ),
            None,
        ),
        Err(Unanswered::Failed(error)) => (
            answer(
                StatusCode::BAD_GATEWAY,
                &format!("no replica of {name:?} answered: {error}"),
            ),
            None,
        ),
    };
    let outcome = Outcome {
        error: response.status().is_server_error(),
        micros: started.elapsed().as_micros() as u64,
        tokens,
    };
    state.gateway.record(caller.account_id, name, outcome);
    response
}
