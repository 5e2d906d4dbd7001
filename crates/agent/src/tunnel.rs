//! The agent's end of the gateway's tunnel. The agent dials out (a provider's node is often
//! behind NAT and opens no inbound port): one HTTP/1.1 request to `POST /v1/agent/tunnel`,
//! signed like every agent request, upgraded to `fallow-tunnel`. Over that connection the
//! coordinator's gateway is the HTTP/2 client and the agent the server: each request names its
//! replica (`x-fallow-lease`), and the agent forwards it to the replica's port on this host and
//! streams the answer back. A replica is reachable only once its health check answered
//! (`Routes::ready`); a request for one that is not is answered here, marked unreached, so the
//! gateway may send it to another replica. A tunnel that breaks is dialled again. Gateways
//! running as their own processes (`fallow gateway`) are named in the heartbeat's answer; the
//! agent keeps one tunnel to each as well (`keep`). An `https://` gateway is dialled over TLS,
//! trusting the system's roots and the agent's `--ca-cert`; the upgrade then runs inside TLS.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use api::backoff::Backoff;
use bytes::Bytes;
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Request, Response, StatusCode};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::sync::watch;
use trust::NodeKey;

/// The header naming the replica a request is for (its lease id).
pub const LEASE_HEADER: &str = "x-fallow-lease";
/// Marks an answer the agent gave because the replica could not be reached.
pub const UNREACHED_HEADER: &str = "x-fallow-unreached";
/// Marks an answer the agent gave because the replica broke the connection after it got the
/// request: it may have acted on it.
pub const FAILED_HEADER: &str = "x-fallow-replica-failed";
const PROTOCOL: &str = "fallow-tunnel";
const PATH: &str = "/v1/agent/tunnel";

/// The ports of this node's ready serving replicas, by lease id.
#[derive(Clone, Default)]
pub struct Routes(Arc<RwLock<HashMap<i64, u16>>>);

impl Routes {
    /// The replica of `lease_id` answers on `port`.
    pub fn ready(&self, lease_id: i64, port: u16) {
        self.0.write().expect("routes lock").insert(lease_id, port);
    }

    /// The replica of `lease_id` takes no more requests.
    pub fn remove(&self, lease_id: i64) {
        self.0.write().expect("routes lock").remove(&lease_id);
    }

    pub fn port(&self, lease_id: i64) -> Option<u16> {
        self.0.read().expect("routes lock").get(&lease_id).copied()
    }
}

type Answer = Response<Either<Incoming, Full<Bytes>>>;

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis() as i64)
}

/// Keeps a tunnel to the coordinator's gateway and one to each gateway running on its own that
/// `gateways` lists (it changes with the heartbeats' answers), until `shutdown` turns true.
pub async fn keep(
    coordinator: String,
    ca_certs: Vec<reqwest::Certificate>,
    key: Arc<NodeKey>,
    node_id: i64,
    routes: Routes,
    mut gateways: watch::Receiver<Vec<String>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let own = coordinator.trim_end_matches('/').to_string();
    let mut running: HashMap<String, watch::Sender<bool>> = HashMap::new();
    loop {
        let wanted: std::collections::HashSet<String> = std::iter::once(own.clone())
            .chain(
                gateways
                    .borrow_and_update()
                    .iter()
                    .map(|url| url.trim_end_matches('/').to_string()),
            )
            .collect();
        running.retain(|url, stop| {
            let keep = wanted.contains(url);
            if !keep {
                tracing::info!(gateway = url, "no longer listed: closing its tunnel");
                let _ = stop.send(true);
            }
            keep
        });
        for url in wanted {
            if let std::collections::hash_map::Entry::Vacant(entry) = running.entry(url) {
                let (stop, stopped) = watch::channel(false);
                tokio::spawn(run(
                    entry.key().clone(),
                    ca_certs.clone(),
                    Arc::clone(&key),
                    node_id,
                    routes.clone(),
                    stopped,
                ));
                entry.insert(stop);
            }
        }
        tokio::select! {
            _ = shutdown.wait_for(|stop| *stop) => break,
            changed = gateways.changed() => if changed.is_err() { break },
        }
    }
    for stop in running.values() {
        let _ = stop.send(true);
    }
}

/// Keeps the node's tunnel to one gateway up until `shutdown` turns true: dials, serves, and dials again after
/// a pause drawn with full jitter from a window that doubles from 250 ms to 10 s while the gateway cannot be
/// reached (`api::backoff`), so a restarted gateway is not dialled by every node at once.
pub async fn run(
    coordinator: String,
    ca_certs: Vec<reqwest::Certificate>,
    key: Arc<NodeKey>,
    node_id: i64,
    routes: Routes,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut backoff = Backoff::new(
        Duration::from_millis(250),
        Duration::from_secs(10),
        api::backoff::seed_from_clock(node_id as u64),
    );
    let replicas: HttpClient<HttpConnector, Incoming> = HttpClient::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .build_http();
    loop {
        if *shutdown.borrow() {
            return;
        }
        let started = std::time::Instant::now();
        tokio::select! {
            _ = shutdown.changed() => return,
            result = serve_once(&coordinator, &ca_certs, &key, node_id, &routes, &replicas) => {
                match result {
                    Ok(()) => tracing::info!(gateway = coordinator, "the gateway's tunnel closed; dialling again"),
                    Err(error) => tracing::warn!(gateway = coordinator, %error, "the gateway's tunnel: dialling again"),
                }
            }
        }
        if started.elapsed() > Duration::from_secs(30) {
            backoff.succeeded();
        }
        let pause = backoff.failed(None);
        tokio::select! {
            _ = shutdown.changed() => return,
            () = tokio::time::sleep(pause) => {}
        }
    }
}

/// One tunnel: dial, upgrade, serve until the connection ends.
async fn serve_once(
    coordinator: &str,
    ca_certs: &[reqwest::Certificate],
    key: &NodeKey,
    node_id: i64,
    routes: &Routes,
    replicas: &HttpClient<HttpConnector, Incoming>,
) -> Result<(), String> {
    // HTTP/1.1 (its ALPN too, over TLS): the upgrade is an HTTP/1.1 mechanism.
    let http = reqwest::Client::builder()
        .http1_only()
        .tcp_nodelay(true)
        .tls_certs_merge(ca_certs.iter().cloned())
        .build()
        .map_err(|error| error.to_string())?;
    let body = b"{}".to_vec();
    let signed = key.sign_request_now(node_id, "POST", PATH, &body, now_ms());
    let mut request = http
        .post(format!("{}{PATH}", coordinator.trim_end_matches('/')))
        .header(header::CONNECTION, "upgrade")
        .header(header::UPGRADE, PROTOCOL)
        .header(header::CONTENT_TYPE, "application/json")
        .timeout(Duration::from_secs(30))
        .body(body);
    for (name, value) in signed.header_pairs() {
        request = request.header(name, value);
    }
    let response = request
        .send()
        .await
        .map_err(|error| crate::client::with_causes(&error))?;
    if response.status() != reqwest::StatusCode::SWITCHING_PROTOCOLS {
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        return Err(format!("the gateway answered {status}: {text}"));
    }
    let upgraded = response.upgrade().await.map_err(|error| error.to_string())?;
    tracing::info!(gateway = coordinator, "the gateway's tunnel is up");
    let routes = routes.clone();
    let replicas = replicas.clone();
    let service = hyper::service::service_fn(move |request| {
        let routes = routes.clone();
        let replicas = replicas.clone();
        async move { Ok::<_, Infallible>(forward(request, &routes, &replicas).await) }
    });
    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    builder
        .timer(hyper_util::rt::TokioTimer::new())
        .initial_stream_window_size(1 << 20)
        .initial_connection_window_size(8 << 20)
        .max_concurrent_streams(4096)
        .keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(20));
    builder
        .serve_connection(TokioIo::new(upgraded), service)
        .await
        .map_err(|error| error.to_string())
}

/// One request from the gateway, to its replica on this host.
async fn forward(
    request: Request<Incoming>,
    routes: &Routes,
    replicas: &HttpClient<HttpConnector, Incoming>,
) -> Answer {
    let lease = request
        .headers()
        .get(LEASE_HEADER)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<i64>().ok());
    let Some(lease) = lease else {
        return unreached(StatusCode::BAD_REQUEST, "no x-fallow-lease header");
    };
    let Some(port) = routes.port(lease) else {
        return unreached(StatusCode::SERVICE_UNAVAILABLE, "the replica is not ready on this node");
    };
    let (mut parts, body) = request.into_parts();
    let path = parts.uri.path_and_query().map_or("/", |path| path.as_str());
    let Ok(uri) = format!("http://127.0.0.1:{port}{path}").parse() else {
        return unreached(StatusCode::BAD_REQUEST, "the path is not a valid URI");
    };
    parts.uri = uri;
    parts.version = hyper::Version::HTTP_11;
    parts.headers.remove(LEASE_HEADER);
    parts.headers.insert(
        header::HOST,
        HeaderValue::from_str(&format!("127.0.0.1:{port}")).expect("a valid host"),
    );
    match replicas.request(Request::from_parts(parts, body)).await {
        Ok(response) => response.map(Either::Left),
        // The replica refused the connection, or the request was never written to it (a pooled
        // connection it had closed): it did not get the request.
        Err(error) if error.is_connect() || never_sent(&error) => {
            unreached(StatusCode::BAD_GATEWAY, &format!("the replica: {error}"))
        }
        Err(error) => {
            let mut answer = Response::new(Either::Right(Full::new(Bytes::from(format!(
                "{{\"error\":{{\"code\":\"bad_gateway\",\"message\":\"the replica failed: {}\"}}}}",
                error.to_string().replace('"', "'")
            )))));
            *answer.status_mut() = StatusCode::BAD_GATEWAY;
            answer
                .headers_mut()
                .insert(FAILED_HEADER, HeaderValue::from_static("1"));
            answer
        }
    }
}

/// Whether hyper gave up on the request before writing it (the connection was closed first).
fn never_sent(error: &hyper_util::client::legacy::Error) -> bool {
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        if let Some(hyper) = cause.downcast_ref::<hyper::Error>() {
            return hyper.is_canceled();
        }
        source = cause.source();
    }
    false
}

fn unreached(status: StatusCode, message: &str) -> Answer {
    let body = format!("{{\"error\":{{\"code\":\"unreached\",\"message\":\"{message}\"}}}}");
    let mut answer = Response::new(Either::Right(Full::new(Bytes::from(body))));
    *answer.status_mut() = status;
    answer
        .headers_mut()
        .insert(UNREACHED_HEADER, HeaderValue::from_static("1"));
    answer
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    answer
}

/// Probes a serving replica until it answers its health check (any 2xx on `path`), then makes
/// it reachable and returns true; gives up (false) when `stop` turns true.
pub async fn wait_ready(
    routes: Routes,
    lease_id: i64,
    port: u16,
    path: String,
    mut stop: watch::Receiver<bool>,
) -> bool {
    let probe = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .expect("a plain HTTP client builds");
    let url = format!(
        "http://127.0.0.1:{port}{}",
        if path.is_empty() { "/" } else { path.as_str() }
    );
    loop {
        if *stop.borrow() {
            return false;
        }
        if probe
            .get(&url)
            .send()
            .await
            .is_ok_and(|response| response.status().is_success())
        {
            routes.ready(lease_id, port);
            tracing::info!(lease = lease_id, port, "serving replica ready");
            return true;
        }
        tokio::select! {
            _ = stop.changed() => return false,
            () = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
    }
}

/// A free TCP port on this host for a serving replica (`PORT`): the kernel's choice.
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind(("0.0.0.0", 0))?.local_addr()?.port())
}
