//! `fallow server`: the coordinator. SQLite in the data directory by default; a postgres:// URL
//! for several replicas on one database.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

#[derive(Args)]
pub struct ServerArgs {
    /// A file of settings named as these flags (`listen = "0.0.0.0:7070"`; default:
    /// /etc/fallow/server.toml when present); a flag or its environment variable beats it.
    #[arg(long, env = "FALLOW_SERVER_CONFIG", value_name = "PATH")]
    config: Option<PathBuf>,
    /// sqlite://PATH or postgres://USER@HOST:PORT/DB (default: sqlite in the data directory).
    #[arg(long, env = "FALLOW_DATABASE")]
    database: Option<String>,
    /// Address to serve the API on.
    #[arg(long, default_value = "127.0.0.1:7070", env = "FALLOW_LISTEN")]
    listen: String,
    /// Where the coordinator keeps its files (the SQLite database, admin.key).
    #[arg(long, default_value = "fallow-data", env = "FALLOW_DATA_DIR")]
    data_dir: PathBuf,
    /// A node silent this long loses its leases.
    #[arg(long, default_value_t = 45_000, env = "FALLOW_HEARTBEAT_TIMEOUT_MS")]
    heartbeat_timeout_ms: u64,
    /// How often agents should heartbeat.
    #[arg(long, default_value_t = 10_000, env = "FALLOW_HEARTBEAT_INTERVAL_MS")]
    heartbeat_interval_ms: u64,
    /// Bill usage on simulated nodes as if it were real, with play money (demos, metering
    /// tests). By default a simulated node's usage is recorded and never billed.
    #[arg(long, env = "FALLOW_BILL_SIMULATED")]
    bill_simulated: bool,
    /// A node over its owner's thermal or power limits takes no new work; after this long over
    /// them its bronze work is preempted.
    #[arg(long, default_value_t = 60_000, env = "FALLOW_OVER_LIMIT_PREEMPT_AFTER_MS")]
    over_limit_preempt_after_ms: u64,
    /// Let gold work go to any node, not only to gold-badge providers' (docs/trust-policy.md
    /// § 2): for trials and tests, where no provider has a badge's month of history yet.
    #[arg(long, env = "FALLOW_GOLD_WITHOUT_BADGE")]
    gold_without_badge: bool,
    /// How long a canary runs on the claimed GPU model (docs/trust-policy.md § 3).
    #[arg(long, default_value_t = 30, env = "FALLOW_CANARY_SECONDS")]
    canary_seconds: u64,
    /// A canary comes within this long of a node's registration, a hardware change or an
    /// unanswered canary (the policy's hour; shorter for trials and tests).
    #[arg(long, default_value_t = 3_600_000, env = "FALLOW_CANARY_WITHIN_MS")]
    canary_within_ms: u64,
    /// A gang not assembled this long after its placement or repair (every replica picked up,
    /// its image present and its datasets staged) is placed again without the nodes that lag.
    #[arg(long, default_value_t = 600_000, env = "FALLOW_GANG_START_TIMEOUT_MS")]
    gang_start_timeout_ms: u64,
    /// Serve the API over TLS with this PEM certificate chain (the server's certificate first,
    /// then any intermediates); needs --tls-key. Plain HTTP to the port is then refused.
    #[arg(long, env = "FALLOW_TLS_CERT", value_name = "PATH", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, env = "FALLOW_TLS_KEY", value_name = "PATH", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// A file holding a token that reads /metrics besides an admin's API key: give Prometheus
    /// the same file (`authorization: {credentials_file: PATH}`). Or the token itself in the
    /// environment, FALLOW_METRICS_TOKEN. Without either, only admins' keys read /metrics.
    #[arg(long, value_name = "PATH", env = "FALLOW_METRICS_TOKEN_FILE")]
    metrics_token_file: Option<PathBuf>,
    /// Output archives the coordinator keeps (jobs without an --output-url) are removed this
    /// many days after they arrive (at most 36500); their digest and size stay on the job. 0
    /// keeps them.
    #[arg(
        long,
        default_value_t = 14,
        env = "FALLOW_OUTPUT_RETENTION_DAYS",
        value_parser = clap::value_parser!(u32).range(0..=i64::from(server::OUTPUT_RETENTION_DAYS_MAX))
    )]
    output_retention_days: u32,
}

/// The fewest characters a metrics token may have: it guards the platform's books.
pub const METRICS_TOKEN_CHARS_MIN: usize = 16;

/// The metrics token from `--metrics-token-file` or `FALLOW_METRICS_TOKEN` (trimmed, as
/// Prometheus trims its credentials file), if either is given.
fn metrics_token(file: Option<&std::path::Path>) -> anyhow::Result<Option<String>> {
    let from_env = std::env::var("FALLOW_METRICS_TOKEN")
        .ok()
        .filter(|token| !token.trim().is_empty());
    let (token, source) = match (file, from_env) {
        (Some(_), Some(_)) => anyhow::bail!("give --metrics-token-file or FALLOW_METRICS_TOKEN, not both"),
        (Some(path), None) => (
            std::fs::read_to_string(path)
                .with_context(|| format!("--metrics-token-file {}: cannot be read", path.display()))?,
            format!("--metrics-token-file {}", path.display()),
        ),
        (None, Some(token)) => (token, "FALLOW_METRICS_TOKEN".to_string()),
        (None, None) => return Ok(None),
    };
    let token = token.trim().to_string();
    anyhow::ensure!(
        token.chars().count() >= METRICS_TOKEN_CHARS_MIN && !token.contains(char::is_whitespace),
        "the metrics token from {source} must be at least {METRICS_TOKEN_CHARS_MIN} characters without spaces; \
         make one with `openssl rand -hex 32`"
    );
    Ok(Some(token))
}

pub fn init_logging() {
    init_logging_at("info");
}

/// Logs as JSON lines on stderr, at `FALLOW_LOG`'s filter or else `level`.
pub fn init_logging_at(level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("FALLOW_LOG").unwrap_or_else(|_| level.into());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .json()
        .try_init();
}

pub fn run(args: ServerArgs) -> anyhow::Result<()> {
    init_logging();
    if let Some(config) = &args.config {
        tracing::info!(path = %config.display(), "settings from a config file");
    }
    let database = args
        .database
        .unwrap_or_else(|| format!("sqlite://{}", args.data_dir.join("fallow.db").display()));
    let tls = match (args.tls_cert, args.tls_key) {
        (Some(cert), Some(key)) => Some(server::TlsFiles { cert, key }),
        _ => None,
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    let config = server::Config {
        tls,
        metrics_token: metrics_token(args.metrics_token_file.as_deref())?,
        listen: args.listen,
        data_dir: args.data_dir,
        heartbeat_timeout_ms: args.heartbeat_timeout_ms,
        heartbeat_interval_ms: args.heartbeat_interval_ms,
        bill_simulated: args.bill_simulated,
        over_limit_preempt_after_ms: args.over_limit_preempt_after_ms,
        gold_needs_badge: !args.gold_without_badge,
        canary_seconds: args.canary_seconds.clamp(1, 3_600),
        canary_within_ms: args.canary_within_ms,
        gang_start_timeout_ms: args.gang_start_timeout_ms.max(1_000),
        output_retention_days: args.output_retention_days,
        ..server::Config::default()
    };
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(async move {
        let running = server::start(&database, config)
            .await
            .map_err(|error| anyhow::anyhow!("{error}"))
            .with_context(|| format!("starting the coordinator on {database}"))?;
        eprintln!(
            "fallow: coordinator listening on {scheme}://{} (API explorer at /v1/explorer)",
            running.addr
        );
        let signal = crate::signals::stop_requested().await?;
        eprintln!("fallow: {signal}: stopping");
        running.stop().await;
        Ok(())
    })
}
