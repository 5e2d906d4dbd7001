//! The coordinator: the HTTP API both sides talk to, the durable state behind it, and the
//! reconcile loop that turns queued jobs into leases with the pure matcher. Several replicas may
//! share one PostgreSQL database: all serve the API, one (holding an advisory lock) reconciles.

mod batch;
mod beats;
mod books;
mod canaries;
mod clock;
mod config;
mod dashboard;
mod decide;
mod edge;
mod error;
mod extract;
mod fleet;
mod fraud;
mod gateway;
mod heartbeats;
mod lease_hints;
pub mod lifecycle;
mod metrics;
mod money;
mod openapi;
mod reclaim;
pub mod reconcile;
mod rendezvous;
mod reputation;
mod reservations;
mod routes;
mod services;
mod signatures;
mod state;
mod tls;
mod turns;
mod usage;
mod warm;
mod wire;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::handler::Handler;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, any, delete, get, post, put};
use store::{Role, Store};
use tower_http::catch_panic::CatchPanicLayer;

pub use clock::{Clock, ManualClock, SystemClock, advance_clock_for_tests};
pub use config::{Config, OUTPUT_RETENTION_DAYS_MAX};
pub use edge::{EdgeConfig, RunningEdge, start_edge};
pub use error::ApiError;
pub use state::AppState;
pub use tls::{HANDSHAKE_TIMEOUT, TlsError, TlsFiles};

/// The system clock (wall time plus a test's offset), what a running coordinator reads.
pub fn now_us() -> i64 {
    clock::system_now_us()
}

/// The file in the data directory that holds the first admin's API key.
pub const ADMIN_KEY_FILE: &str = "admin.key";

pub fn router(state: Arc<AppState>) -> Router {
    api_routes()
        .router
        // The gateway's data plane: a service's own requests and answers, not the API's.
        .route("/s/{service}", any(routes::serve))
        // `/s/NAME/` is the service's root, as `/s/NAME` is (a wildcard matches no empty path).
        .route("/s/{service}/", any(routes::serve))
        .route("/s/{service}/{*path}", any(routes::serve))
        .merge(dashboard::routes())
        .method_not_allowed_fallback(|method: axum::http::Method| async move {
            ApiError::MethodNotAllowed(format!("{method} is not allowed here; see /v1/openapi.json"))
        })
        .fallback(|| async { ApiError::NotFound("no such endpoint; see /v1/openapi.json".into()) })
        .layer(DefaultBodyLimit::max(api::REQUEST_BODY_BYTES_MAX))
        .layer(axum::middleware::from_fn(extract::read_unused_body))
        .layer(catch_panics())
        .layer(axum::middleware::map_response(error::name_the_wait))
        .with_state(state)
}

/// The API's routes, each recorded as it is added: the OpenAPI document's table
/// (`openapi::PATHS`) is held against this list by a test, so neither has a route the other lacks.
pub(crate) fn api_routes() -> ApiRoutes {
    ApiRoutes::default()
        .get("/v1/health", routes::health)
        .get("/v1/openapi.json", openapi::document)
        .get("/v1/explorer", openapi::explorer)
        .get("/v1/market", routes::market)
        .get("/metrics", routes::metrics)
        .post("/v1/jobs", routes::submit_job)
        .get("/v1/jobs", routes::list_jobs)
        .post("/v1/jobs/quote", routes::quote_job)
        .get("/v1/jobs/{id}", routes::show_job)
        .post("/v1/jobs/{id}/cancel", routes::cancel_job)
        .get("/v1/jobs/{id}/logs", routes::job_logs)
        .get("/v1/jobs/{id}/output", routes::job_output)
        .get("/v1/offers", routes::search_offers)
        .post("/v1/datasets/warm", routes::warm_dataset)
        .post("/v1/reservations", routes::create_reservation)
        .get("/v1/reservations", routes::list_reservations)
        .get("/v1/reservations/{id}", routes::show_reservation)
        .post("/v1/reservations/{id}/cancel", routes::cancel_reservation)
        .post("/v1/own-providers", routes::link_own_provider)
        .get("/v1/own-providers", routes::list_own_providers)
        .delete("/v1/own-providers/{id}", routes::unlink_own_provider)
        .get("/v1/balance", routes::balance)
        .get("/v1/statement", routes::statement)
        .get("/v1/invoices", routes::invoice)
        .post("/v1/nodes", routes::register_node)
        .get("/v1/nodes", routes::list_nodes)
        .add(
            "post",
            "/v1/nodes/batch",
            post(routes::register_nodes).layer(DefaultBodyLimit::max(api::NODE_BATCH_BODY_BYTES_MAX)),
        )
        .get("/v1/nodes/{id}", routes::show_node)
        .get("/v1/nodes/{id}/calendar", routes::node_calendar)
        .put("/v1/nodes/{id}/policy", routes::set_policy)
        .post("/v1/nodes/{id}/reclaim", routes::reclaim_node)
        .delete("/v1/nodes/{id}/reclaim", routes::resume_node)
        .post("/v1/agent/tunnel", routes::agent_tunnel)
        .post("/v1/gateways", routes::report_gateway)
        .get("/v1/gateways", routes::list_gateways)
        .get("/v1/gateway/services/{name}", routes::service_route)
        .get("/v1/gateway/nodes/{id}", routes::gateway_node)
        .post("/v1/services", routes::deploy_service)
        .get("/v1/services", routes::list_services)
        .get("/v1/services/{name}", routes::show_service)
        .put("/v1/services/{name}", routes::update_service)
        .delete("/v1/services/{name}", routes::delete_service)
        .post("/v1/services/{name}/scale", routes::scale_service)
        .get("/v1/services/{name}/logs", routes::service_logs)
        .post("/v1/services/{name}/keys", routes::create_service_key)
        .delete("/v1/services/{name}/keys/{key_id}", routes::revoke_service_key)
        .get("/v1/sites", routes::list_sites)
        .put("/v1/sites/{name}", routes::set_site)
        .get("/v1/earnings", routes::earnings)
        .post("/v1/agent/heartbeat", routes::heartbeat)
        .get("/v1/agent/leases", routes::poll_leases)
        .post("/v1/agent/leases/{id}/events", routes::lease_event)
        .post("/v1/agent/leases/{id}/logs", routes::lease_log)
        .add(
            "post",
            "/v1/agent/leases/{id}/output",
            post(routes::lease_output).layer(DefaultBodyLimit::max(api::OUTPUT_UPLOAD_BODY_BYTES_MAX)),
        )
        .post("/v1/agent/key", routes::rotate_node_key)
        .post("/v1/agent/reclaim", routes::agent_reclaim)
        .put("/v1/agent/node", routes::restate_node)
        .post("/v1/agent/resume", routes::agent_resume)
        .post("/v1/agent/leases/{id}/progress", routes::lease_progress)
        .post("/v1/agent/usage", routes::report_usage)
        .post("/v1/agent/attestations", routes::attest)
        .post("/v1/agent/canaries", routes::canary_result)
        .add(
            "post",
            "/v1/agent/canaries/{id}/proof",
            post(routes::canary_proof).layer(DefaultBodyLimit::max(api::CANARY_PROOF_BODY_BYTES_MAX)),
        )
        .get("/v1/trust", routes::trust)
        .get("/v1/frauds", routes::frauds)
        .post("/v1/provider/bond", routes::post_bond)
        .post("/v1/admin/bonds", routes::admin_bond)
        .get("/v1/nodes/{id}/canaries", routes::node_canaries)
        .post("/v1/nodes/{id}/verify", routes::verify_node)
        .post("/v1/admin/accounts", routes::create_account)
        .get("/v1/admin/accounts", routes::list_accounts)
        .post("/v1/accounts/{id}/keys", routes::create_key)
        .get("/v1/accounts/{id}/keys", routes::list_keys)
        .post("/v1/keys/{key_id}/revoke", routes::revoke_key)
        .post("/v1/keys/rotate", routes::rotate_key)
        .post("/v1/admin/credits", routes::credit)
        .get("/v1/admin/evidence", routes::evidence)
}

/// A router that remembers the (method, path) of every route added to it.
#[derive(Default)]
pub(crate) struct ApiRoutes {
    router: Router<Arc<AppState>>,
    pub(crate) added: Vec<(&'static str, &'static str)>,
}

impl ApiRoutes {
    /// One method of a path (axum merges the methods of a path added more than once).
    fn add(mut self, method: &'static str, path: &'static str, route: MethodRouter<Arc<AppState>>) -> Self {
        self.added.push((method, path));
        self.router = self.router.route(path, route);
        self
    }

    fn get<H: Handler<T, Arc<AppState>>, T: 'static>(self, path: &'static str, handler: H) -> Self {
        self.add("get", path, get(handler))
    }

    fn post<H: Handler<T, Arc<AppState>>, T: 'static>(self, path: &'static str, handler: H) -> Self {
        self.add("post", path, post(handler))
    }

    fn put<H: Handler<T, Arc<AppState>>, T: 'static>(self, path: &'static str, handler: H) -> Self {
        self.add("put", path, put(handler))
    }

    fn delete<H: Handler<T, Arc<AppState>>, T: 'static>(self, path: &'static str, handler: H) -> Self {
        self.add("delete", path, delete(handler))
    }
}

/// Answers a request whose handler panicked with a 500 and the API's error body, and logs the
/// panic, instead of dropping the connection: a client then learns that the server failed, not
/// that the network did, and the other requests on the connection go on.
fn catch_panics() -> CatchPanicLayer<PanicResponder> {
    CatchPanicLayer::custom(panic_response as PanicResponder)
}

type PanicResponder = fn(Box<dyn std::any::Any + Send>) -> Response;

fn panic_response(panic: Box<dyn std::any::Any + Send>) -> Response {
    let message = panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(a panic without a message)");
    tracing::error!(panic = message, "a request handler panicked; answered 500");
    let body = api::ErrorBody {
        error: api::ErrorDetail {
            code: "internal".to_string(),
            message: "internal error: the server hit a bug serving this request (it is logged); retry, or report it \
                      if it persists"
                .to_string(),
        },
    };
    (StatusCode::INTERNAL_SERVER_ERROR, axum::Json(body)).into_response()
}

/// Creates the first admin account and writes its key to `DATA_DIR/admin.key` (mode 0600),
/// once: later starts find the account and leave the file alone.
pub async fn bootstrap_admin(store: &Store, data_dir: &Path) -> anyhow_like::Result<Option<String>> {
    let path = data_dir.join(ADMIN_KEY_FILE);
    let pending = data_dir.join(format!("{ADMIN_KEY_FILE}.pending"));
    if store.account_by_name("admin").await?.is_some() {
        // A start that crashed after committing the admin but before publishing its key.
        if pending.exists() && !path.exists() {
            std::fs::rename(&pending, &path)?;
            return Ok(Some(path.display().to_string()));
        }
        return Ok(None);
    }
    // The key is on disk before the account exists, so no crash leaves an admin without a key.
    let key = trust::generate_api_key();
    write_secret(&pending, &format!("{}\n", key.display))?;
    let record = store::ApiKeyRecord {
        key_id: key.key_id.clone(),
        account_id: 0,
        secret_hash: key.secret_hash.clone(),
        label: "bootstrap".to_string(),
        created_at: now_us(),
        revoked_at: None,
    };
    match store
        .create_account_with_key(Role::Admin, "admin", &record, now_us())
        .await
    {
        Ok(_) => {}
        // Replicas started together on a new database: another one made it between our check
        // and our insert, and wrote the key to its own data directory.
        Err(store::StoreError::Conflict(_)) => {
            let _ = std::fs::remove_file(&pending);
            return Ok(None);
        }
        Err(error) => return Err(error.into()),
    }
    std::fs::rename(&pending, &path)?;
    Ok(Some(path.display().to_string()))
}

/// Writes a file only its owner can read.
pub fn write_secret(path: &Path, contents: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(contents.as_bytes())?;
    file.sync_all()
}

/// Errors of starting the server, as text for the binary to print.
pub mod anyhow_like {
    pub type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;
}

/// A running coordinator.
pub struct Running {
    pub addr: SocketAddr,
    pub state: Arc<AppState>,
    shutdown: tokio::sync::watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Running {
    /// Stops serving and reconciling, and waits for both.
    pub async fn stop(self) {
        let _ = self.shutdown.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
        self.state.store.close().await;
    }
}

/// Copies SQLite's log back into its file every `CHECKPOINT_EVERY` until `shutdown`, and starts
/// it over past `WAL_RESTART_FRAMES`, in the writers' turn: that checkpoint keeps writers out
/// while it waits for readers, and a writer meeting it in SQLite's busy handler sleeps up to
/// 100 ms a try, where one waiting for the turn starts as soon as it ends.
async fn checkpoints(state: Arc<AppState>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(CHECKPOINT_EVERY) => {
                let result = match state.store.checkpoint().await {
                    Ok(frames) if frames >= store::WAL_RESTART_FRAMES => {
                        let _turn = state.writer_turn().await;
                        state.store.truncate_log().await
                    }
                    Ok(_) => Ok(()),
                    Err(error) => Err(error),
                };
                if let Err(error) = result {
                    tracing::warn!(%error, "checkpoint failed; trying again later");
                }
            }
            _ = shutdown.changed() => return,
        }
    }
}

/// Forgets the cached keys of nodes whose key another replica rotated, every
/// `KEY_ROTATIONS_EVERY`, until `shutdown`.
async fn key_rotations(state: Arc<AppState>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    let mut since = state.now_us();
    loop {
        tokio::select! {
            () = tokio::time::sleep(KEY_ROTATIONS_EVERY) => {
                let now = state.now_us();
                match state.store.keys_rotated_since(since - reconcile::CHANGE_OVERLAP_US).await {
                    Ok(nodes) => {
                        for node in nodes {
                            state.forget_node(node);
                        }
                        since = now;
                    }
                    Err(error) => tracing::warn!(%error, "could not read key rotations; trying again"),
                }
            }
            _ = shutdown.changed() => return,
        }
    }
}

/// How often a replica looks for node keys rotated on other replicas.
pub const KEY_ROTATIONS_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// How often SQLite's write-ahead log is copied back into the database file.
pub const CHECKPOINT_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Opens the store, bootstraps the admin, binds, and starts the API and the reconcile loop.
pub async fn start(database_url: &str, config: Config) -> anyhow_like::Result<Running> {
    start_with_clock(database_url, config, Arc::new(SystemClock)).await
}

/// As [`start`], with the coordinator's time from `clock` (a test's `ManualClock`).
pub async fn start_with_clock(
    database_url: &str,
    config: Config,
    clock: Arc<dyn Clock>,
) -> anyhow_like::Result<Running> {
    // The certificate and key first: a mistake in them fails the start before anything else.
    let tls = config.tls.as_ref().map(tls::server_config).transpose()?;
    std::fs::create_dir_all(&config.data_dir)?;
    let store = Store::open(database_url).await?;
    if let Some(path) = bootstrap_admin(&store, &config.data_dir).await? {
        tracing::info!(
            path,
            "created the admin account; its API key is in this file (mode 0600)"
        );
        eprintln!("fallow: created the admin account; its API key is in {path}");
    }
    let listening = tls::Listening::bind(&config.listen, tls).await?;
    let addr = listening.local_addr()?;
    let state = Arc::new(AppState::with_clock(store, config, clock));
    let (shutdown, watch) = tokio::sync::watch::channel(false);
    let mut serve_watch = watch.clone();
    let app = router(state.clone());
    let serve = tokio::spawn(async move {
        let stop = async move {
            let _ = serve_watch.wait_for(|stop| *stop).await;
        };
        if let Err(error) = listening.serve(app, stop).await {
            tracing::error!(%error, "the API server stopped");
        }
    });
    let beats = tokio::spawn(heartbeats::run(state.clone(), watch.clone()));
    let checkpoints = tokio::spawn(checkpoints(state.clone(), watch.clone()));
    let rotations = tokio::spawn(key_rotations(state.clone(), watch.clone()));
    let mut tasks = vec![serve, beats, checkpoints, rotations];
    if state.config.reconcile {
        tasks.push(tokio::spawn(reconcile::run(state.clone(), watch)));
    }
    Ok(Running {
        addr,
        state,
        shutdown,
        tasks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A handler that panics is answered with a 500 and the usual error body, and the server
    /// goes on serving (the connection is not just closed).
    #[tokio::test]
    async fn a_panicking_handler_gets_a_500_with_an_error_body() {
        let app = Router::new()
            .route(
                "/boom",
                get(|| async {
                    let empty: Vec<u32> = Vec::new();
                    let index = empty.len() + 65_535;
                    // Indexing past the end, the way the defect of issue 17 did.
                    format!("{}", empty[index])
                }),
            )
            .route("/fine", get(|| async { "fine" }))
            .layer(catch_panics());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a free port");
        let addr = listener.local_addr().expect("bound");
        let server = tokio::spawn(async move { axum::serve(listener, app).await });
        let client = reqwest::Client::new();
        let response = client
            .get(format!("http://{addr}/boom"))
            .send()
            .await
            .expect("an answer, not a closed connection");
        assert_eq!(response.status(), reqwest::StatusCode::INTERNAL_SERVER_ERROR);
        let body: api::ErrorBody = response.json().await.expect("the API's error body");
        assert_eq!(body.error.code, "internal");
        assert!(body.error.message.contains("bug"), "{}", body.error.message);
        let fine = client
            .get(format!("http://{addr}/fine"))
            .send()
            .await
            .expect("still serving");
        assert_eq!(fine.status(), reqwest::StatusCode::OK);
        server.abort();
    }
}
