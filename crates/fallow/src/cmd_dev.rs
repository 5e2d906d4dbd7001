//! `fallow dev`: the whole market in one process, like `nomad agent -dev`. A coordinator on
//! SQLite in the data directory, one local agent (real GPUs when found, otherwise simulated
//! devices, labelled so everywhere), a demo tenant with play money and a demo provider, their API
//! keys written to the data directory, and the dashboard's address printed. A restart keeps the
//! state: the database, the node's key and the demo accounts' keys stay in the data directory.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;

/// The demo tenant's API key, in the data directory.
pub const TENANT_KEY_FILE: &str = "tenant.key";
/// The demo provider's API key, in the data directory.
pub const PROVIDER_KEY_FILE: &str = "provider.key";
/// The play money the demo tenant starts with, in dollars.
const DEMO_CREDIT_DOLLARS: &str = "1000.00";
/// What the local node offers when the host has no NVIDIA GPU.
const SIMULATED_DEFAULT: &str = "H100-SXM5:2";

#[derive(Args)]
pub struct DevArgs {
    /// Where everything is kept: the database, the keys, the agent's files.
    #[arg(long, default_value = "fallow-dev", env = "FALLOW_DATA_DIR")]
    data_dir: PathBuf,
    /// Address to serve the API and the dashboard on.
    #[arg(long, default_value = "127.0.0.1:7070", env = "FALLOW_LISTEN")]
    listen: String,
    /// Offer these simulated GPUs (e.g. H100-SXM5:2) even if the host has real ones. Without
    /// real GPUs the node offers H100-SXM5:2, simulated.
    #[arg(long)]
    simulate_gpus: Option<String>,
    /// Run no local agent (only the coordinator and the demo accounts).
    #[arg(long)]
    no_agent: bool,
}

pub fn run(args: DevArgs) -> anyhow::Result<()> {
    crate::cmd_server::init_logging_at("warn");
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("creating the data directory {}", args.data_dir.display()))?;
    let database = format!("sqlite://{}", args.data_dir.join("fallow.db").display());
    let config = server::Config {
        listen: args.listen.clone(),
        data_dir: args.data_dir.clone(),
        // A short timeout and interval, so that a stopped local agent is noticed quickly.
        heartbeat_interval_ms: 2_000,
        heartbeat_timeout_ms: 10_000,
        // Simulated devices are billed with play money here, so costs show.
        bill_simulated: true,
        // The demo provider is new: without this no gold job would ever place. Canaries still
        // run (the first within a minute, a few seconds long), so the trust pages show them.
        gold_needs_badge: false,
        canary_seconds: 5,
        canary_within_ms: 60_000,
        ..server::Config::default()
    };
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(async move {
        let running = server::start(&database, config)
            .await
            .map_err(|error| anyhow::anyhow!("{error}"))
            .with_context(|| format!("starting the coordinator on {} (is the port free?)", args.listen))?;
        let base = format!("http://{}", running.addr);
        let outcome = serve(&args, &base).await;
        running.stop().await;
        outcome
    })
}

/// Everything after the coordinator is up, until SIGTERM or Ctrl-C.
async fn serve(args: &DevArgs, base: &str) -> anyhow::Result<()> {
    let http = reqwest::Client::new();
    let admin_key = read_key(&args.data_dir.join(server::ADMIN_KEY_FILE))
        .context("the admin key the coordinator wrote (delete the data directory to start afresh)")?;
    let tenant = demo_account(&http, base, &admin_key, &args.data_dir, "tenant").await?;
    let provider = demo_account(&http, base, &admin_key, &args.data_dir, "provider").await?;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let agent = if args.no_agent {
        None
    } else {
        Some(
            crate::cmd_agent::start_dev_agent(
                base,
                &provider,
                &args.data_dir.join("agent"),
                args.simulate_gpus.as_deref(),
                SIMULATED_DEFAULT,
                stopped,
            )
            .await?,
        )
    };
    let data_dir = args.data_dir.display();
    eprintln!("fallow dev: coordinator on {base} (SQLite in {data_dir}/fallow.db)");
    if let Some(agent) = &agent {
        eprintln!("fallow dev: {}", agent.summary);
        if !market_sees_a_node(&http, base, &tenant).await {
            eprintln!("fallow dev: the market does not list the local node yet (`fallow offers` shows when it does)");
        }
    }
    eprintln!("fallow dev: dashboard at {base}/dashboard (sign in with a key below)");
    eprintln!(
        "fallow dev: demo tenant key in {data_dir}/{TENANT_KEY_FILE}, provider key in {data_dir}/{PROVIDER_KEY_FILE}"
    );
    eprintln!("fallow dev: try, in another terminal:");
    eprintln!("  export FALLOW_URL={base} FALLOW_API_KEY=$(cat {data_dir}/{TENANT_KEY_FILE})");
    eprintln!("  fallow job submit --gpus 1 --tier silver --max-price 5 --process -- sh -c 'echo hi'");
    eprintln!("fallow dev: Ctrl-C stops everything (SIGTERM too); a restart keeps the state");
    let signal = crate::signals::stop_requested().await?;
    eprintln!("fallow dev: {signal}: stopping");
    let _ = stop.send(true);
    if let Some(agent) = agent {
        agent.task.await.context("the agent's loop")??;
    }
    Ok(())
}

/// How long the ready line waits for the market to list the local node.
const MARKET_SEES_NODE_WITHIN: std::time::Duration = std::time::Duration::from_secs(20);

/// Waits until the coordinator's view of the fleet lists an online node (the leader takes a
/// node in at its next pass, a moment after the agent's first heartbeat), so that a quote or a
/// warm-up run right after the ready line sees it. False when it did not within the limit.
async fn market_sees_a_node(http: &reqwest::Client, base: &str, tenant_key: &str) -> bool {
    let started = std::time::Instant::now();
    while started.elapsed() < MARKET_SEES_NODE_WITHIN {
        let listed = async {
            let reply = http
                .get(format!("{base}/v1/offers"))
                .bearer_auth(tenant_key)
                .send()
                .await
                .ok()?;
            let offers: api::OfferList = reply.json().await.ok()?;
            Some(offers.offers.iter().any(|offer| offer.online))
        };
        if listed.await == Some(true) {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    false
}

fn read_key(path: &Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(text.trim().to_string())
}

/// The demo account of `role`: its key from the data directory if the coordinator takes it,
/// otherwise a new key for the existing account or a new account (a tenant gets play money).
async fn demo_account(
    http: &reqwest::Client,
    base: &str,
    admin_key: &str,
    data_dir: &Path,
    role: &str,
) -> anyhow::Result<String> {
    let path = data_dir.join(format!("{role}.key"));
    if let Ok(key) = read_key(&path) {
        let check = http.get(format!("{base}/v1/balance")).bearer_auth(&key).send().await?;
        if check.status().is_success() {
            return Ok(key);
        }
    }
    let name = format!("demo-{role}");
    let accounts: Vec<api::AccountView> =
        admin_call(http, reqwest::Method::GET, base, admin_key, "/v1/admin/accounts", None).await?;
    let (account_id, key) = match accounts.iter().find(|account| account.name == name) {
        Some(account) => {
            let created: api::NewKeyResponse = admin_call(
                http,
                reqwest::Method::POST,
                base,
                admin_key,
                &format!("/v1/accounts/{}/keys", account.id),
                Some(serde_json::json!({"label": "fallow dev"})),
            )
            .await?;
            (account.id, created.api_key)
        }
        None => {
            let created: api::NewAccountResponse = admin_call(
                http,
                reqwest::Method::POST,
                base,
                admin_key,
                "/v1/admin/accounts",
                Some(serde_json::json!({"role": role, "name": name})),
            )
            .await?;
            (created.account.id, created.api_key.api_key)
        }
    };
    if role == "tenant" {
        let _: serde_json::Value = admin_call(
            http,
            reqwest::Method::POST,
            base,
            admin_key,
            "/v1/admin/credits",
            Some(serde_json::json!({
                "account_id": account_id,
                "amount": DEMO_CREDIT_DOLLARS,
                "key": format!("fallow-dev-credit-{account_id}"),
            })),
        )
        .await?;
    }
    server::write_secret(&path, &format!("{key}\n")).with_context(|| format!("writing {}", path.display()))?;
    Ok(key)
}

async fn admin_call<T: serde::de::DeserializeOwned>(
    http: &reqwest::Client,
    method: reqwest::Method,
    base: &str,
    admin_key: &str,
    path: &str,
    body: Option<serde_json::Value>,
) -> anyhow::Result<T> {
    let mut request = http
        .request(method.clone(), format!("{base}{path}"))
        .bearer_auth(admin_key);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let reply = request.send().await.with_context(|| format!("{method} {path}"))?;
    let status = reply.status();
    let text = reply.text().await?;
    anyhow::ensure!(status.is_success(), "{method} {path}: {status}: {text}");
    serde_json::from_str(&text).with_context(|| format!("{method} {path}: reading {text}"))
}
