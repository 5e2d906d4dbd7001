//! The gateway's routes: an agent's tunnel (`POST /v1/agent/tunnel`, signed, upgraded to
//! `fallow-tunnel`) and a service's endpoint (`/s/{service}/…`, the tenant's API key as a
//! bearer token), whose requests go to the service's ready replicas through their nodes'
//! tunnels (`crate::gateway`).

use axum::Json;
use axum::body::Body;
use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use std::sync::Arc;
use store::Role;

use crate::error::ApiError;
use crate::extract::{Auth, JsonBody, Path, Query, ServiceAuth, Signed};
use crate::gateway::{Endpoint, TUNNEL_PROTOCOL, WAKE_POLL, answer, not_woken, service_path};
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

/// An agent's tunnel: once the 101 answer is sent, the connection is the gateway's HTTP/2
/// client to the agent.
pub async fn agent_tunnel(State(state): AppStateRef, Upgrade(upgrade): Upgrade, signed: Signed<Value>) -> Response {
    state.gateway.accept(signed.node_id, upgrade)
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

/// A request found no ready replica. A deployed service's request waits for one (asking for
/// one when it is scaled to zero) up to its `wake_timeout_s`, then gets a 503 saying so; a name
/// no deployed service or running job serves is a 404.
async fn wait_for_replica(state: &AppState, tenant: i64, name: &str) -> Result<Arc<Vec<Endpoint>>, Response> {
    let woken = wake(state, tenant, name).await.map_err(IntoResponse::into_response)?;
    let Some((record, wake_timeout_s)) = woken else {
        return Err(no_such_service(name));
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(u64::from(wake_timeout_s));
    while std::time::Instant::now() < deadline {
        tokio::time::sleep(WAKE_POLL).await;
        let endpoints = ready_replicas(state, tenant, name)
            .await
            .map_err(IntoResponse::into_response)?;
        if !endpoints.is_empty() {
            return Ok(endpoints);
        }
    }
    Err(not_woken(name, wake_timeout_s, &record.status))
}

fn no_such_service(name: &str) -> Response {
    answer(StatusCode::NOT_FOUND, &no_such_service_message(name))
}

fn no_such_service_message(name: &str) -> String {
    format!("no service {name:?}: none is deployed by that name and none of your running jobs serves it")
}

/// A request waits for a replica of a deployed service: asks for one when it is scaled to
/// zero. None when no service of that name is deployed; else the service and how long a
/// request waits.
async fn wake(state: &AppState, tenant: i64, name: &str) -> Result<Option<(store::ServiceRecord, u32)>, ApiError> {
    let Some(record) = state.store.service(tenant, name).await? else {
        return Ok(None);
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
    Ok(Some((record, request.wake_timeout_s)))
}

/// A request for a service: `/s/{service}/PATH?QUERY` goes to `/PATH?QUERY` on one of the
/// caller's ready replicas serving `service`.
pub async fn serve(State(state): AppStateRef, ServiceAuth(caller, only): ServiceAuth, request: Request) -> Response {
    if caller.role != Role::Tenant && caller.role != Role::Admin {
        return ApiError::Forbidden("services are called with a tenant's key".into()).into_response();
    }
    let started = std::time::Instant::now();
    let (parts, body) = request.into_parts();
    let (name, path_and_query) = match service_path(&parts.uri) {
        Ok(found) => found,
        Err(response) => return *response,
    };
    if only.as_deref().is_some_and(|only| only != name) {
        return ApiError::Forbidden(format!("this key calls its own service only, not {name:?}")).into_response();
    }
    let endpoints = match ready_replicas(&state, caller.account_id, &name).await {
        Ok(endpoints) => endpoints,
        Err(error) => return error.into_response(),
    };
    let wait = wait_for_replica(&state, caller.account_id, &name);
    state
        .gateway
        .relay(
            started,
            caller.account_id,
            &name,
            endpoints,
            wait,
            &path_and_query,
            parts,
            Body::new(body),
        )
        .await
}

/// A gateway running on its own reports (an admin's key): it is given to agents for their
/// tunnels, and its counts join the coordinator's. Answers the gateways now live.
pub async fn report_gateway(
    State(state): AppStateRef,
    Auth(caller): Auth,
    JsonBody(report): JsonBody<api::GatewayReport>,
) -> Result<Json<api::GatewayList>, ApiError> {
    require(&caller, &[Role::Admin])?;
    // As the document's pattern says: no blank or control character anywhere (JSON Schema's
    // `\s` and Rust's whitespace differ at U+0085 and U+FEFF: both are refused), at most 512
    // characters.
    let url = report.url.as_str();
    if !(url.starts_with("http://") || url.starts_with("https://"))
        || url.chars().count() > 512
        || url.contains(|c: char| c.is_whitespace() || c.is_control() || c == '\u{feff}')
    {
        return Err(ApiError::BadRequest(format!(
            "url: {url:?} is not an http:// or https:// URL agents can dial"
        )));
    }
    // Counts are kept as u64 and shown as i64: past that, a report is not a count.
    let past_i64 = |count: u64| count > i64::MAX as u64;
    if report.services.iter().any(|service| {
        [
            service.requests,
            service.errors,
            service.prompt_tokens,
            service.completion_tokens,
        ]
        .into_iter()
        .chain(service.latency.iter().map(|bucket| bucket.count))
        .any(past_i64)
    }) {
        return Err(ApiError::BadRequest("services: a count past 2^63 - 1".into()));
    }
    if report.services.len() > 100_000 || report.in_flight.len() > 1_000_000 {
        return Err(ApiError::BadRequest("a report of more than 100,000 services".into()));
    }
    state.gateway.report(&report);
    Ok(Json(gateway_list(&state)))
}

/// The gateways running on their own that reported lately (an admin's key).
pub async fn list_gateways(State(state): AppStateRef, Auth(caller): Auth) -> Result<Json<api::GatewayList>, ApiError> {
    require(&caller, &[Role::Admin])?;
    Ok(Json(gateway_list(&state)))
}

fn gateway_list(state: &AppState) -> api::GatewayList {
    api::GatewayList {
        gateways: state
            .gateway
            .others()
            .into_iter()
            .map(|(url, region, since)| api::GatewayView {
                url,
                region,
                reported_ms_ago: since.as_millis() as u64,
            })
            .collect(),
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteQuery {
    /// A request found no replica and waits: ask for one when the service is scaled to zero.
    #[serde(default)]
    wake: bool,
}

/// Where a gateway on its own sends the caller's requests for a service, asked with the
/// caller's key (a tenant's, or the service's own): its ready replicas (`?wake=true` when a
/// request found none and waits, which asks for one when it is scaled to zero).
pub async fn service_route(
    State(state): AppStateRef,
    ServiceAuth(caller, only): ServiceAuth,
    Path(name): Path<String>,
    Query(query): Query<RouteQuery>,
) -> Result<Json<api::ServiceRoute>, ApiError> {
    if caller.role != Role::Tenant && caller.role != Role::Admin {
        return Err(ApiError::Forbidden("services are called with a tenant's key".into()));
    }
    api::check_service_name("service", &name).map_err(|error| ApiError::NotFound(error.0))?;
    if only.as_deref().is_some_and(|only| only != name) {
        return Err(ApiError::Forbidden(format!(
            "this key calls its own service only, not {name:?}"
        )));
    }
    let tenant = caller.account_id;
    let endpoints = ready_replicas(&state, tenant, &name).await?;
    let (status, wake_timeout_s) = if query.wake && endpoints.is_empty() {
        match wake(&state, tenant, &name).await? {
            Some((record, timeout)) => (record.status, timeout),
            None => return Err(ApiError::NotFound(no_such_service_message(&name))),
        }
    } else {
        match state.store.service(tenant, &name).await? {
            Some(record) => {
                let timeout = crate::wire::service_request(&record.spec)?.wake_timeout_s;
                (record.status, timeout)
            }
            // A running job that serves under this name, deployed as no service.
            None if !endpoints.is_empty() => (String::new(), 0),
            None => return Err(ApiError::NotFound(no_such_service_message(&name))),
        }
    };
    Ok(Json(api::ServiceRoute {
        tenant_id: tenant,
        replicas: endpoints.iter().map(Endpoint::route).collect(),
        wake_timeout_s,
        status,
    }))
}

/// A node's public key, for a gateway on its own checking its tunnel's signature (an admin's
/// key).
pub async fn gateway_node(
    State(state): AppStateRef,
    Auth(caller): Auth,
    Path(node_id): Path<i64>,
) -> Result<Json<api::GatewayNode>, ApiError> {
    require(&caller, &[Role::Admin])?;
    let record = state.store.node(node_id).await?.ok_or_else(|| {
        ApiError::NotFound(format!(
            "no node {node_id} is registered: `fallow node list` shows those that are"
        ))
    })?;
    Ok(Json(api::GatewayNode {
        node_id,
        public_key: record.node.public_key,
    }))
}
