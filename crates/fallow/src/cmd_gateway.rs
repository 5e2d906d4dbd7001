//! `fallow gateway`: the gateway as its own process, beside the coordinator's own, for scale.
//! It serves `/s/{service}/…` as the coordinator does, reports to the coordinators each second
//! (agents learn its URL from their heartbeats and keep a tunnel to it), and keeps nothing that
//! cannot be rebuilt from them: run several, behind a load balancer or in several regions.

use anyhow::Context;
use clap::Args;

#[derive(Args)]
pub struct GatewayArgs {
    /// A coordinator's URL; repeat (or separate with commas) for every coordinator replica:
    /// the gateway reports to each and asks the first that answers.
    #[arg(long, env = "FALLOW_COORDINATOR", value_delimiter = ',', required = true)]
    coordinator: Vec<String>,
    /// Address to serve on.
    #[arg(long, default_value = "127.0.0.1:7080", env = "FALLOW_GATEWAY_LISTEN")]
    listen: String,
    /// The URL agents dial for their tunnels (default: http://, or https:// with --tls-cert,
    /// and the address served on).
    #[arg(long, env = "FALLOW_GATEWAY_URL")]
    advertise: Option<String>,
    /// The region the gateway serves from (shown to operators).
    #[arg(long, default_value = "")]
    region: String,
    /// An admin's API key: the gateway reports with it and reads nodes' public keys.
    #[arg(long, env = "FALLOW_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// A file holding the admin's API key (a coordinator's data directory's admin.key).
    #[arg(long, conflicts_with = "api_key")]
    api_key_file: Option<std::path::PathBuf>,
    /// Serve over TLS with this PEM certificate chain; needs --tls-key. Plain HTTP to the port
    /// is then refused.
    #[arg(long, env = "FALLOW_GATEWAY_TLS_CERT", value_name = "PATH", requires = "tls_key")]
    tls_cert: Option<std::path::PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, env = "FALLOW_GATEWAY_TLS_KEY", value_name = "PATH", requires = "tls_cert")]
    tls_key: Option<std::path::PathBuf>,
    /// A PEM file of a private CA to trust, besides the system's roots, for https://
    /// coordinators.
    #[arg(long, env = "FALLOW_CA_CERT", value_name = "PATH")]
    ca_cert: Option<std::path::PathBuf>,
}

pub fn run(args: GatewayArgs) -> anyhow::Result<()> {
    crate::cmd_server::init_logging();
    let admin_key = match (args.api_key, args.api_key_file) {
        (Some(key), _) => key,
        (None, Some(path)) => {
            std::fs::read_to_string(&path).with_context(|| format!("reading the admin key from {}", path.display()))?
        }
        (None, None) => anyhow::bail!(
            "a gateway needs an admin's API key: --api-key-file DATA_DIR/admin.key, --api-key or FALLOW_API_KEY"
        ),
    };
    let ca_certs = match &args.ca_cert {
        Some(path) => agent::client::read_ca_certs(path).map_err(|error| anyhow::anyhow!("--ca-cert {error}"))?,
        None => Vec::new(),
    };
    let tls = match (args.tls_cert, args.tls_key) {
        (Some(cert), Some(key)) => Some(server::TlsFiles { cert, key }),
        _ => None,
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    let config = server::EdgeConfig {
        tls,
        ca_certs,
        listen: args.listen,
        url: args.advertise,
        region: args.region,
        coordinators: args.coordinator,
        admin_key: admin_key.trim().to_string(),
        max_skew_ms: trust::DEFAULT_MAX_SKEW_MS,
    };
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(async move {
        let running = server::start_edge(config).await.context("starting the gateway")?;
        eprintln!(
            "fallow: gateway listening on {scheme}://{} (services at /s/{{service}}/…)",
            running.addr
        );
        let signal = crate::signals::stop_requested().await?;
        eprintln!("fallow: {signal}: stopping");
        running.stop().await;
        Ok(())
    })
}
