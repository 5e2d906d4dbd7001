//! The gateway as its own process (`fallow gateway --coordinator URL`), for scale: several
//! beside each other, each serving `/s/{service}/…` like the coordinator's own gateway and
//! holding nothing that cannot be rebuilt from the coordinators.
//!
//! - It reports to every coordinator it is given, each second (`POST /v1/gateways`, an admin's
//!   key): its URL, which the coordinators hand to agents in their heartbeat answers so that
//!   each keeps a tunnel here too, and its counts, which join the coordinator's in `service
//!   show`, `/metrics` and the autoscaler's windows.
//! - A tunnel is checked as the coordinator checks it: the node's signature, with the node's
//!   public key from a coordinator (`GET /v1/gateway/nodes/{id}`), and its nonce.
//! - A caller's key is checked by a coordinator, which answers where the service's ready
//!   replicas are (`GET /v1/gateway/services/{name}`, with the caller's own key): the answer,
//!   or the refusal, is kept for `DIRECTORY_TTL`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use axum::routing::{any, get, post};
use tokio::sync::watch;
use trust::NonceCache;

use crate::gateway::{DIRECTORY_TTL, Endpoint, Gateway, TUNNEL_PROTOCOL, WAKE_POLL, answer, not_woken, service_path};
use crate::tls::{Listening, TlsFiles};

/// How a gateway of its own runs.
#[derive(Clone, Debug)]
pub struct EdgeConfig {
    /// The address to listen on.
    pub listen: String,
    /// The URL agents dial for their tunnels (default: `http://`, or `https://` with `tls`, and
    /// the address listened on).
    pub url: Option<String>,
    /// The region it serves from (reported; for operators).
    pub region: String,
    /// The coordinators it reports to and asks; the first that answers is asked.
    pub coordinators: Vec<String>,
    /// An admin's API key, for reporting and for nodes' public keys.
    pub admin_key: String,
    /// How far a tunnel's signed time may be from this host's clock (ms).
    pub max_skew_ms: i64,
    /// Serve over TLS with this certificate chain and key (`--tls-cert`, `--tls-key`).
    pub tls: Option<TlsFiles>,
    /// Certificates trusted besides the system's roots when dialling the coordinators (a
    /// private CA's, `--ca-cert`).
    pub ca_certs: Vec<reqwest::Certificate>,
}

/// How often the gateway reports to the coordinators.
pub const REPORT_EVERY: Duration = Duration::from_secs(1);
/// How long a node's public key is kept before it is asked for again.
const NODE_KEY_TTL: Duration = Duration::from_secs(60);

/// A coordinator's word on a caller's service: where it runs, or why not (the status and the
/// body to pass on).
#[derive(Clone)]
enum Route {
    Found(Arc<FoundRoute>),
    Refused(StatusCode, Bytes),
}

struct FoundRoute {
    tenant_id: i64,
    endpoints: Arc<Vec<Endpoint>>,
    wake_timeout_s: u32,
    status: String,
}

struct Edge {
    gateway: Arc<Gateway>,
    config: EdgeConfig,
    url: String,
    http: reqwest::Client,
    /// Routes by (the caller's `Authorization`, service), and when they were read.
    routes: Mutex<HashMap<(String, String), (Instant, Route)>>,
    node_keys: Mutex<HashMap<i64, (Instant, trust::VerifyingKey)>>,
    nonces: Mutex<NonceCache>,
}

/// A gateway of its own, serving until `stop`.
pub struct RunningEdge {
    pub addr: SocketAddr,
    shutdown: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl RunningEdge {
    /// Stops serving and reporting, and waits for both.
    pub async fn stop(self) {
        let _ = self.shutdown.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

/// Starts a gateway of its own: listens, and reports to the coordinators each second.
pub async fn start_edge(config: EdgeConfig) -> std::io::Result<RunningEdge> {
    if config.coordinators.is_empty() {
        return Err(std::io::Error::other("a gateway needs at least one --coordinator URL"));
    }
    if let Some(bad) = config
        .coordinators
        .iter()
        .find(|url| !(url.starts_with("http://") || url.starts_with("https://")))
    {
        return Err(std::io::Error::other(format!(
            "--coordinator {bad:?} is not an http:// or https:// URL"
        )));
    }
    let tls = match &config.tls {
        Some(files) => Some(crate::tls::server_config(files).map_err(std::io::Error::other)?),
        None => None,
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    let listening = Listening::bind(&config.listen, tls).await?;
    let addr = listening.local_addr()?;
    let url = config
        .url
        .clone()
        .unwrap_or_else(|| format!("{scheme}://{addr}"))
        .trim_end_matches('/')
        .to_string();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .tcp_nodelay(true)
        .tls_certs_merge(config.ca_certs.clone())
        .build()
        .map_err(std::io::Error::other)?;
    let edge = Arc::new(Edge {
        gateway: Arc::new(Gateway::default()),
        config,
        url,
        http,
        routes: Mutex::new(HashMap::new()),
        node_keys: Mutex::new(HashMap::new()),
        nonces: Mutex::new(NonceCache::default()),
    });
    let (shutdown, watch) = watch::channel(false);
    let app = Router::new()
        .route(
            "/v1/health",
            get(|| async { axum::Json(serde_json::json!({"status": "ok", "role": "gateway"})) }),
        )
        .route("/v1/agent/tunnel", post(tunnel))
        .route("/s/{service}", any(serve))
        // `/s/NAME/` is the service's root, as `/s/NAME` is (a wildcard matches no empty path).
        .route("/s/{service}/", any(serve))
        .route("/s/{service}/{*path}", any(serve))
        .fallback(|| async { answer(StatusCode::NOT_FOUND, "a gateway serves /s/{service}/… only") })
        .layer(axum::middleware::map_response(crate::error::name_the_wait))
        .with_state(Arc::clone(&edge));
    let mut serve_watch = watch.clone();
    let server = tokio::spawn(async move {
        let stop = async move {
            let _ = serve_watch.wait_for(|stop| *stop).await;
        };
        if let Err(error) = listening.serve(app, stop).await {
            tracing::error!(%error, "the gateway stopped");
        }
    });
    let reports = tokio::spawn(report(Arc::clone(&edge), watch));
    tracing::info!(%addr, url = edge.url, "gateway listening");
    Ok(RunningEdge {
        addr,
        shutdown,
        tasks: vec![server, reports],
    })
}

/// Reports to every coordinator each `REPORT_EVERY` until `shutdown`.
async fn report(edge: Arc<Edge>, mut shutdown: watch::Receiver<bool>) {
    loop {
        let report = edge.gateway.own_report(&edge.url, &edge.config.region);
        for coordinator in &edge.config.coordinators {
            let sent = edge
                .http
                .post(format!("{}/v1/gateways", coordinator.trim_end_matches('/')))
                .bearer_auth(&edge.config.admin_key)
                .json(&report)
                .send()
                .await;
            match sent {
                Ok(response) if response.status().is_success() => {}
                Ok(response) => {
                    let status = response.status();
                    let text = response.text().await.unwrap_or_default();
                    tracing::warn!(coordinator, %status, text, "a coordinator refused the gateway's report");
                }
                Err(error) => tracing::warn!(coordinator, %error, "could not report to a coordinator"),
            }
        }
        edge.gateway.prune();
        tokio::select! {
            _ = shutdown.wait_for(|stop| *stop) => return,
            () = tokio::time::sleep(REPORT_EVERY) => {}
        }
    }
}

impl Edge {
    /// GETs `path` from the first coordinator that answers, with `authorization`.
    async fn ask(&self, path: &str, authorization: &str) -> Result<reqwest::Response, Response> {
        let mut last = String::new();
        for coordinator in &self.config.coordinators {
            let sent = self
                .http
                .get(format!("{}{path}", coordinator.trim_end_matches('/')))
                .header(header::AUTHORIZATION, authorization)
                .send()
                .await;
            match sent {
                Ok(response) if !response.status().is_server_error() => return Ok(response),
                Ok(response) => last = format!("{coordinator} answered {}", response.status()),
                Err(error) => last = format!("{coordinator}: {error}"),
            }
        }
        Err(answer(
            StatusCode::SERVICE_UNAVAILABLE,
            &format!("the gateway cannot reach a coordinator ({last})"),
        ))
    }

    /// A caller's service as a coordinator tells it (`wake`: a request waits, ask for a
    /// replica), kept for `DIRECTORY_TTL` unless `wake`.
    async fn route(&self, authorization: &str, name: &str, wake: bool) -> Result<Route, Response> {
        let key = (authorization.to_string(), name.to_string());
        if !wake
            && let Some((at, route)) = self.routes.lock().expect("routes lock").get(&key)
            && at.elapsed() < DIRECTORY_TTL
        {
            return Ok(route.clone());
        }
        let path = format!("/v1/gateway/services/{name}{}", if wake { "?wake=true" } else { "" });
        let response = self.ask(&path, authorization).await?;
        let status = response.status();
        let bytes = response.bytes().await.unwrap_or_default();
        let route = if status.is_success() {
            let found: api::ServiceRoute = serde_json::from_slice(&bytes).map_err(|error| {
                answer(
                    StatusCode::BAD_GATEWAY,
                    &format!("a coordinator's route could not be read: {error}"),
                )
            })?;
            Route::Found(Arc::new(FoundRoute {
                tenant_id: found.tenant_id,
                endpoints: Arc::new(found.replicas.iter().map(Endpoint::of_route).collect()),
                wake_timeout_s: found.wake_timeout_s,
                status: found.status,
            }))
        } else {
            Route::Refused(status, bytes)
        };
        let mut routes = self.routes.lock().expect("routes lock");
        if routes.len() > 100_000 {
            routes.retain(|_, (at, _)| at.elapsed() < DIRECTORY_TTL);
        }
        routes.insert(key, (Instant::now(), route.clone()));
        Ok(route)
    }

    /// Waits for a replica of a service a request found none of, asking for one, up to the
    /// service's `wake_timeout_s`.
    async fn wait(&self, authorization: &str, name: &str, found: &FoundRoute) -> Result<Arc<Vec<Endpoint>>, Response> {
        let woken = self.route(authorization, name, true).await?;
        let mut latest = match woken {
            Route::Found(route) => route,
            Route::Refused(status, bytes) => return Err(passed_on(status, bytes)),
        };
        let deadline = Instant::now() + Duration::from_secs(u64::from(found.wake_timeout_s));
        while latest.endpoints.is_empty() && Instant::now() < deadline {
            tokio::time::sleep(WAKE_POLL).await;
            if let Route::Found(route) = self.route(authorization, name, false).await? {
                latest = route;
            }
        }
        if latest.endpoints.is_empty() {
            return Err(not_woken(name, found.wake_timeout_s, &latest.status));
        }
        Ok(Arc::clone(&latest.endpoints))
    }

    /// A node's public key, from a coordinator, kept for `NODE_KEY_TTL`.
    async fn node_key(&self, node_id: i64) -> Result<trust::VerifyingKey, Response> {
        if let Some((at, key)) = self.node_keys.lock().expect("node keys lock").get(&node_id)
            && at.elapsed() < NODE_KEY_TTL
        {
            return Ok(*key);
        }
        let authorization = format!("Bearer {}", self.config.admin_key);
        let response = self
            .ask(&format!("/v1/gateway/nodes/{node_id}"), &authorization)
            .await?;
        let status = response.status();
        if !status.is_success() {
            return Err(answer(
                StatusCode::UNAUTHORIZED,
                &format!("node {node_id} is not known to the coordinator ({status})"),
            ));
        }
        let node: api::GatewayNode = response.json().await.map_err(|error| {
            answer(
                StatusCode::BAD_GATEWAY,
                &format!("a coordinator's node key could not be read: {error}"),
            )
        })?;
        let key = trust::parse_public_key(&node.public_key)
            .map_err(|error| answer(StatusCode::BAD_GATEWAY, &error.to_string()))?;
        self.node_keys
            .lock()
            .expect("node keys lock")
            .insert(node_id, (Instant::now(), key));
        Ok(key)
    }
}

fn passed_on(status: StatusCode, bytes: Bytes) -> Response {
    let mut response = Response::new(Body::from(bytes));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// An agent's tunnel, signed by its node like every agent request to a coordinator.
async fn tunnel(State(edge): State<Arc<Edge>>, request: Request) -> Response {
    let (mut parts, body) = request.into_parts();
    let asks = parts
        .headers
        .get(header::UPGRADE)
        .is_some_and(|value| value.as_bytes().eq_ignore_ascii_case(TUNNEL_PROTOCOL.as_bytes()));
    let Some(upgrade) = parts.extensions.remove::<hyper::upgrade::OnUpgrade>().filter(|_| asks) else {
        return answer(
            StatusCode::BAD_REQUEST,
            &format!("a tunnel is an HTTP/1.1 request with Connection: upgrade and Upgrade: {TUNNEL_PROTOCOL}"),
        );
    };
    let signed = trust::SignedHeaders::from_headers(|name| parts.headers.get(name).and_then(|v| v.to_str().ok()));
    let signed = match signed {
        Ok(signed) => signed,
        Err(error) => return answer(StatusCode::UNAUTHORIZED, &error.to_string()),
    };
    let Ok(bytes) = axum::body::to_bytes(body, 64 << 10).await else {
        return answer(StatusCode::PAYLOAD_TOO_LARGE, "a tunnel's request body is small");
    };
    let key = match edge.node_key(signed.node_id).await {
        Ok(key) => key,
        Err(response) => return response,
    };
    let path = parts.uri.path_and_query().map_or("/", |path| path.as_str());
    let now_ms = crate::now_us() / 1000;
    let checked = trust::verify_request(
        &key,
        signed.node_id,
        parts.method.as_str(),
        path,
        &bytes,
        &signed,
        now_ms,
        edge.config.max_skew_ms,
    )
    .and_then(|()| {
        edge.nonces.lock().expect("nonces lock").check_and_remember(
            signed.node_id,
            &signed.nonce,
            signed.timestamp_ms,
            now_ms,
        )
    });
    if let Err(error) = checked {
        tracing::warn!(node = signed.node_id, %error, "a tunnel was refused");
        return answer(StatusCode::UNAUTHORIZED, &error.to_string());
    }
    edge.gateway.accept(signed.node_id, upgrade)
}

/// A caller's request for a service, as the coordinator's own gateway serves it.
async fn serve(State(edge): State<Arc<Edge>>, request: Request) -> Response {
    let started = Instant::now();
    let (parts, body) = request.into_parts();
    let (name, path_and_query) = match service_path(&parts.uri) {
        Ok(found) => found,
        Err(response) => return *response,
    };
    let Some(authorization) = parts
        .headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .map(str::to_string)
    else {
        return answer(StatusCode::UNAUTHORIZED, "send Authorization: Bearer <API key>");
    };
    let found = match edge.route(&authorization, &name, false).await {
        Ok(Route::Found(found)) => found,
        Ok(Route::Refused(status, bytes)) => return passed_on(status, bytes),
        Err(response) => return response,
    };
    let wait = edge.wait(&authorization, &name, &found);
    edge.gateway
        .relay(
            started,
            found.tenant_id,
            &name,
            Arc::clone(&found.endpoints),
            wait,
            &path_and_query,
            parts,
            body,
        )
        .await
}
