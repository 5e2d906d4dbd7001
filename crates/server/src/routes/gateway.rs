//! The gateway's routes: an agent's tunnel (`POST /v1/agent/tunnel`, signed, upgraded to
//! `fallow-tunnel`) and a service's endpoint (`/s/{service}/…`, the tenant's API key as a
//! bearer token), whose requests go to the service's ready replicas through their nodes'
//! tunnels (`crate::gateway`).

use api::ServiceView;
use axum::Json;
use axum::body::Body;
use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use std::sync::Arc;
use store::Role;

use crate::error::ApiError;
use crate::extract::{Auth, Path, ServiceAuth, Signed};
use crate::gateway::{Endpoint, Outcome, Preference, REQUEST_BYTES_MAX, TUNNEL_PROTOCOL, Unanswered, answer};
use crate::state::AppState;

use super::{AppStateRef, require};

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

fn endpoint(replica: &store::ServingLease) -> Endpoint {
    Endpoint {
        lease_id: replica.lease_id,
        node_id: replica.node_id,
        region: replica.region.clone(),
        bronze: replica.tier == "bronze",
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

/// A service's replicas and its callers' requests, errors, latency and tokens at this gateway.
pub async fn show_service(
    State(state): AppStateRef,
    Auth(caller): Auth,
    Path(name): Path<String>,
) -> Result<Json<ServiceView>, ApiError> {
    require(&caller, &[Role::Tenant])?;
    let replicas = state.store.serving_leases(caller.account_id, &name).await?;
    let stats = state.gateway.stats(caller.account_id, &name);
    if replicas.is_empty() && stats.requests == 0 {
        return Err(ApiError::NotFound(format!(
            "no service {name:?}: none of your running jobs serves it (serve.name)"
        )));
    }
    let endpoints: Vec<Endpoint> = replicas.iter().map(endpoint).collect();
    Ok(Json(ServiceView {
        replicas_ready: state.gateway.reachable(&endpoints) as u64,
        replicas: replicas.iter().map(|replica| replica.lease_id).collect(),
        name,
        requests: stats.requests,
        errors: stats.errors,
        p50_ms: stats.quantile_ms(0.50),
        p95_ms: stats.quantile_ms(0.95),
        p99_ms: stats.quantile_ms(0.99),
        prompt_tokens: stats.prompt_tokens,
        completion_tokens: stats.completion_tokens,
        tokens: stats.prompt_tokens + stats.completion_tokens,
    }))
}

/// A request for a service: `/s/{service}/PATH?QUERY` goes to `/PATH?QUERY` on one of the
/// caller's ready replicas serving `service`.
pub async fn serve(State(state): AppStateRef, ServiceAuth(caller): ServiceAuth, request: Request) -> Response {
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
    let path_and_query = match parts.uri.query() {
        Some(query) => format!("{path}?{query}"),
        None => path.to_string(),
    };
    let endpoints = match state.gateway.cached(caller.account_id, name) {
        Some(endpoints) => endpoints,
        None => match state.store.serving_leases(caller.account_id, name).await {
            Ok(found) => state
                .gateway
                .remember(caller.account_id, name, found.iter().map(endpoint).collect()),
            Err(error) => return ApiError::from(error).into_response(),
        },
    };
    if endpoints.is_empty() {
        return answer(
            StatusCode::NOT_FOUND,
            &format!("no running replica serves {name:?} for you: `fallow job list` shows your jobs"),
        );
    }
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
