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
mod routes;
mod services;
mod signatures;
mod state;
mod tls;
mod usage;
mod wire;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{any, delete, get, post, put};
use store::{Role, Store};
use tower_http::catch_panic::CatchPanicLayer;

pub use clock::{Clock, ManualClock, SystemClock, advance_clock_for_tests};
pub use config::Config;
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
    Router::new()
        .route("/v1/health", get(routes::health))
        .route("/v1/openapi.json", get(openapi::document))
        .route("/v1/explorer", get(openapi::explorer))
        .route("/v1/market", get(routes::market))
        .route("/metrics", get(routes::metrics))
        .route("/v1/jobs", post(routes::submit_job).get(routes::list_jobs))
        .route("/v1/jobs/quote", post(routes::quote_job))
        .route("/v1/jobs/{id}", get(routes::show_job))
        .route("/v1/jobs/{id}/cancel", post(routes::cancel_job))
        .route("/v1/jobs/{id}/logs", get(routes::job_logs))
        .route("/v1/offers", get(routes::search_offers))
        .route("/v1/balance", get(routes::balance))
        .route("/v1/statement", get(routes::statement))
        .route("/v1/invoices", get(routes::invoice))
        .route("/v1/nodes", post(routes::register_node).get(routes::list_nodes))
        .route(
            "/v1/nodes/batch",
            post(routes::register_nodes).layer(DefaultBodyLimit::max(api::NODE_BATCH_BODY_BYTES_MAX)),
        )
        .route("/v1/nodes/{id}", get(routes::show_node))
        .route("/v1/nodes/{id}/policy", put(routes::set_policy))
        .route(
            "/v1/nodes/{id}/reclaim",
            post(routes::reclaim_node).delete(routes::resume_node),
        )
        .route("/v1/agent/tunnel", post(routes::agent_tunnel))
        .route("/v1/gateways", post(routes::report_gateway).get(routes::list_gateways))
        .route("/v1/gateway/services/{name}", get(routes::service_route))
        .route("/v1/gateway/nodes/{id}", get(routes::gateway_node))
        .route("/v1/services", post(routes::deploy_service).get(routes::list_services))
        .route(
            "/v1/services/{name}",
            get(routes::show_service)
                .put(routes::update_service)
                .delete(routes::delete_service),
        )
        .route("/v1/services/{name}/scale", post(routes::scale_service))
        .route("/v1/services/{name}/logs", get(routes::service_logs))
        .route("/v1/services/{name}/keys", post(routes::create_service_key))
        .route("/v1/services/{name}/keys/{key_id}", delete(routes::revoke_service_key))
        .route("/s/{service}", any(routes::serve))
        .route("/s/{service}/{*path}", any(routes::serve))
        .route("/v1/sites", get(routes::list_sites))
        .route("/v1/sites/{name}", put(routes::set_site))
        .route("/v1/earnings", get(routes::earnings))
        .route("/v1/agent/heartbeat", post(routes::heartbeat))
        .route("/v1/agent/leases", get(routes::poll_leases))
        .route("/v1/agent/leases/{id}/events", post(routes::lease_event))
        .route("/v1/agent/leases/{id}/logs", post(routes::lease_log))
        .route("/v1/agent/key", post(routes::rotate_node_key))
        .route("/v1/agent/reclaim", post(routes::agent_reclaim))
        .route("/v1/agent/node", put(routes::restate_node))
        .route("/v1/agent/resume", post(routes::agent_resume))
        .route("/v1/agent/leases/{id}/progress", post(routes::lease_progress))
        .route("/v1/agent/usage", post(routes::report_usage))
        .route("/v1/agent/attestations", post(routes::attest))
        .route("/v1/agent/canaries", post(routes::canary_result))
        .route(
            "/v1/agent/canaries/{id}/proof",
            post(routes::canary_proof).layer(DefaultBodyLimit::max(api::CANARY_PROOF_BODY_BYTES_MAX)),
        )
        .route("/v1/trust", get(routes::trust))
        .route("/v1/frauds", get(routes::frauds))
        .route("/v1/provider/bond", post(routes::post_bond))
        .route("/v1/admin/bonds", post(routes::admin_bond))
        .route("/v1/nodes/{id}/canaries", get(routes::node_canaries))
        .route("/v1/nodes/{id}/verify", post(routes::verify_node))
        .route(
            "/v1/admin/accounts",
            post(routes::create_account).get(routes::list_accounts),
        )
        .route(
            "/v1/accounts/{id}/keys",
            post(routes::create_key).get(routes::list_keys),
        )
        .route("/v1/keys/{key_id}/revoke", post(routes::revoke_key))
        .route("/v1/keys/rotate", post(routes::rotate_key))
        .route("/v1/admin/credits", post(routes::credit))
        .route("/v1/admin/evidence", get(routes::evidence))
        .merge(dashboard::routes())
        .method_not_allowed_fallback(|method: axum::http::Method| async move {
            ApiError::MethodNotAllowed(format!("{method} is not allowed here; see /v1/openapi.json"))
        })
        .fallback(|| async { ApiError::NotFound("no such endpoint; see /v1/openapi.json".into()) })
        .layer(DefaultBodyLimit::max(api::REQUEST_BODY_BYTES_MAX))
        .layer(catch_panics())
        .layer(axum::middleware::map_response(error::name_the_wait))
        .with_state(state)
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
