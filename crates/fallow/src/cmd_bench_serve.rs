//! `fallow bench serve`: the gateway's data plane under load. An in-process coordinator (SQLite
//! in a fresh folder) with `--replicas` simulated nodes, each running one serving job whose
//! replica is a tiny HTTP responder on this host, reached through its node's tunnel (the
//! agent's own tunnel code, `agent::tunnel`). `--concurrency` callers, each on its own
//! keep-alive connection, send `--requests` GETs through the gateway (`/s/bench/ping` with the
//! tenant's key), then the same number straight to the responders. Reports requests per second
//! and latency percentiles of both, and the gateway's overhead at the 99th percentile.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use agent::client::Client;
use agent::tunnel::Routes;
use anyhow::{Context, bail, ensure};
use api::{LeaseEventRequest, NewAccountResponse, NodeRegistration, NodeView, PolicyDoc};
use bytes::Bytes;
use clap::Args;
use http_body_util::{BodyExt, Empty, Full};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use trust::NodeKey;

#[derive(Args, Clone, Debug)]
pub struct ServeArgs {
    /// Serving replicas, one per simulated node.
    #[arg(long, default_value_t = 4)]
    replicas: usize,
    /// Requests through the gateway (and as many straight to the responders).
    #[arg(long, default_value_t = 100_000)]
    requests: u64,
    /// Callers at once, each on its own keep-alive connection.
    #[arg(long, default_value_t = 256)]
    concurrency: usize,
    /// Print one JSON object instead of a summary.
    #[arg(long)]
    json: bool,
}

pub fn run(args: &ServeArgs) -> anyhow::Result<()> {
    ensure!((1..=64).contains(&args.replicas), "--replicas must be 1–64");
    ensure!(args.requests > 0, "--requests must be positive");
    ensure!((1..=4096).contains(&args.concurrency), "--concurrency must be 1–4096");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let report = runtime.block_on(bench(args))?;
    runtime.shutdown_timeout(Duration::from_secs(2));
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "through the gateway: {} requests/s, p50 {} ms, p99 {} ms, {} failed; direct: {} requests/s, p50 {} ms, \
             p99 {} ms; overhead at p99 {} ms ({} cores)",
            report["requests_per_sec"],
            report["p50_ms"],
            report["p99_ms"],
            report["failed"],
            report["direct_requests_per_sec"],
            report["direct_p50_ms"],
            report["direct_p99_ms"],
            report["overhead_p99_ms"],
            report["cores"],
        );
    }
    Ok(())
}

async fn bench(args: &ServeArgs) -> anyhow::Result<Value> {
    let folder = std::env::temp_dir().join(format!("fallow-bench-serve-{}", std::process::id()));
    std::fs::create_dir_all(&folder)?;
    let database = format!("sqlite://{}", folder.join("fallow.db").display());
    let config = server::Config {
        listen: "127.0.0.1:0".to_string(),
        data_dir: folder.clone(),
        ..server::Config::default()
    };
    let running = server::start(&database, config)
        .await
        .map_err(|error| anyhow::anyhow!("{error}"))
        .context("starting the coordinator")?;
    let result = drive(args, &running, &folder).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), running.stop()).await;
    let _ = std::fs::remove_dir_all(&folder);
    result
}

async fn drive(args: &ServeArgs, running: &server::Running, folder: &std::path::Path) -> anyhow::Result<Value> {
    let base = format!("http://{}", running.addr);
    let http = reqwest::Client::new();
    let admin_key = std::fs::read_to_string(folder.join(server::ADMIN_KEY_FILE))?
        .trim()
        .to_string();
    let tenant = account(&http, &base, &admin_key, "tenant", "bench-tenant").await?;
    let provider = account(&http, &base, &admin_key, "provider", "bench-provider").await?;
    let credit = json!({"account_id": tenant.account.id, "amount": "1000000.00", "key": "bench-serve"});
    check(
        http.post(format!("{base}/v1/admin/credits"))
            .bearer_auth(&admin_key)
            .json(&credit)
            .send()
            .await?,
        "credit",
    )
    .await?;

    // The responders, then one simulated node and one serving job per replica.
    let mut ports = Vec::new();
    for _ in 0..args.replicas {
        ports.push(responder().await?);
    }
    let client = Arc::new(Client::new(&base).map_err(|error| anyhow::anyhow!("{error}"))?);
    let mut nodes = Vec::new();
    for index in 0..args.replicas {
        let key = NodeKey::generate();
        let registration = registration(&key, index);
        let view: NodeView = client
            .register(&provider.api_key.api_key, &registration)
            .await
            .map_err(|error| anyhow::anyhow!("registering node {index}: {error}"))?;
        nodes.push((Arc::new(key), view.id));
    }
    for index in 0..args.replicas {
        let job = json!({
            "name": format!("bench-{index}"),
            "image": "bench-responder",
            "gpus": 1,
            "tier": "silver",
            "max_price_per_gpu_hour": "9.00",
            "max_runtime_s": 3600,
            "serve": {"name": "bench"},
        });
        check(
            http.post(format!("{base}/v1/jobs"))
                .bearer_auth(&tenant.api_key.api_key)
                .json(&job)
                .send()
                .await?,
            "submit",
        )
        .await?;
    }
    // Each node picks up its lease, reports it running, and opens its tunnel with the lease
    // routed to its responder.
    let (stop, stopped) = watch::channel(false);
    let beat = api::HeartbeatRequest::default();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut routed = 0;
    for (index, (key, node_id)) in nodes.iter().enumerate() {
        let routes = Routes::default();
        let lease = loop {
            let answer = client
                .heartbeat(key, *node_id, &beat)
                .await
                .map_err(|error| anyhow::anyhow!("{error}"))?;
            if let Some(lease) = answer.leases.first() {
                break lease.clone();
            }
            if Instant::now() > deadline {
                bail!("node {node_id} got no lease within 30 s");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let event = LeaseEventRequest {
            epoch: lease.lease.epoch,
            state: "running".to_string(),
            exit_code: None,
            detail: String::new(),
            port: None,
        };
        client
            .event(key, *node_id, lease.lease.id, &event)
            .await
            .map_err(|error| anyhow::anyhow!("{error}"))?;
        // The responder answers at once: ready, as the agent reports once a health check passes.
        let ready = LeaseEventRequest {
            state: "ready".to_string(),
            port: Some(ports[index]),
            ..event
        };
        client
            .event(key, *node_id, lease.lease.id, &ready)
            .await
            .map_err(|error| anyhow::anyhow!("{error}"))?;
        routes.ready(lease.lease.id, ports[index]);
        routed += 1;
        tokio::spawn(agent::tunnel::run(
            base.clone(),
            Vec::new(),
            Arc::clone(key),
            *node_id,
            routes,
            stopped.clone(),
        ));
    }
    ensure!(routed == args.replicas, "only {routed} replicas routed");
    let gateway = running.addr;
    let path = "/s/bench/ping";
    let key = tenant.api_key.api_key.clone();
    // Warm: every tunnel up and the service's replicas known.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let answer = http.get(format!("{base}{path}")).bearer_auth(&key).send().await?;
        if answer.status().is_success() && running.state.gateway_tunnels() >= args.replicas {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "the gateway did not reach every replica within 30 s ({})",
                answer.status()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let through = load(args, move |_| (gateway, path.to_string(), Some(key.clone()))).await?;
    let direct_ports = ports.clone();
    let direct = load(args, move |caller| {
        let port = direct_ports[caller % direct_ports.len()];
        (
            std::net::SocketAddr::from(([127, 0, 0, 1], port)),
            "/ping".to_string(),
            None,
        )
    })
    .await?;
    let _ = stop.send(true);
    let cores = std::thread::available_parallelism().map_or(1, |cores| cores.get());
    Ok(json!({
        "replicas": args.replicas,
        "requests": args.requests,
        "concurrency": args.concurrency,
        "cores": cores,
        "requests_per_sec": through.per_sec.round(),
        "p50_ms": round3(through.p50_ms),
        "p99_ms": round3(through.p99_ms),
        "failed": through.failed,
        "direct_requests_per_sec": direct.per_sec.round(),
        "direct_p50_ms": round3(direct.p50_ms),
        "direct_p99_ms": round3(direct.p99_ms),
        "direct_failed": direct.failed,
        "overhead_p99_ms": round3(through.p99_ms - direct.p99_ms),
        "first_failure": through.first_failure.or(direct.first_failure),
    }))
}

fn round3(value: f64) -> f64 {
    (value * 1000.0).round() / 1000.0
}

async fn check(response: reqwest::Response, what: &str) -> anyhow::Result<Vec<u8>> {
    let status = response.status();
    let body = response.bytes().await?.to_vec();
    ensure!(
        status.is_success(),
        "{what}: {status}: {}",
        String::from_utf8_lossy(&body)
    );
    Ok(body)
}

async fn account(
    http: &reqwest::Client,
    base: &str,
    admin_key: &str,
    role: &str,
    name: &str,
) -> anyhow::Result<NewAccountResponse> {
    let response = http
        .post(format!("{base}/v1/admin/accounts"))
        .bearer_auth(admin_key)
        .json(&json!({"role": role, "name": name}))
        .send()
        .await?;
    let body = check(response, &format!("creating the {role} account")).await?;
    Ok(serde_json::from_slice(&body)?)
}

fn registration(key: &NodeKey, index: usize) -> NodeRegistration {
    NodeRegistration {
        name: format!("serve-{index}"),
        public_key: key.public_hex(),
        fingerprint: format!("bench-serve-{index}"),
        gpu_model: "H100-SXM5".to_string(),
        gpu_count: 1,
        cpu_milli: 16_000,
        memory_mib: 65_536,
        network_mbit_s: 10_000,
        region: "local".to_string(),
        site: "local".to_string(),
        fabric: String::new(),
        nvlink_domain: String::new(),
        latitude: 0.0,
        longitude: 0.0,
        simulated: true,
        runtimes: Vec::new(),
        canary_kinds: Vec::new(),
        advertise_addr: String::new(),
        gang_ports: String::new(),
        nvlink_source: String::new(),
        nvlink_detected: String::new(),
        policy: PolicyDoc {
            asks: [("silver".to_string(), "1.00".to_string())].into_iter().collect(),
            ..PolicyDoc::default()
        },
    }
}

/// A tiny HTTP/1.1 responder on a loopback port: "ok" to every request.
async fn responder() -> anyhow::Result<u16> {
    let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|_request: Request<hyper::body::Incoming>| async {
                    Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(port)
}

struct Measured {
    per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
    failed: u64,
    /// What the first failed request got, to say why.
    first_failure: Option<String>,
}

/// `--requests` GETs from `--concurrency` callers; `target(caller)` gives a caller's address,
/// path and bearer key.
async fn load(
    args: &ServeArgs,
    target: impl Fn(usize) -> (std::net::SocketAddr, String, Option<String>),
) -> anyhow::Result<Measured> {
    let next = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let first_failure = Arc::new(std::sync::OnceLock::<String>::new());
    let total = args.requests;
    let started = Instant::now();
    let mut callers = Vec::with_capacity(args.concurrency);
    for caller in 0..args.concurrency {
        let (address, path, key) = target(caller);
        let (next, failed, first_failure) = (Arc::clone(&next), Arc::clone(&failed), Arc::clone(&first_failure));
        callers.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut sender = None;
            while next.fetch_add(1, Ordering::Relaxed) < total {
                if sender.is_none() {
                    sender = connect(address).await;
                }
                let Some(open) = sender.as_mut() else {
                    failed.fetch_add(1, Ordering::Relaxed);
                    continue;
                };
                let mut request = Request::get(path.as_str()).header(hyper::header::HOST, "bench");
                if let Some(key) = &key {
                    request = request.header(hyper::header::AUTHORIZATION, format!("Bearer {key}"));
                }
                let request = request.body(Empty::<Bytes>::new()).expect("a valid request");
                let sent = Instant::now();
                let answered = match open.send_request(request).await {
                    Ok(response) if response.status().is_success() => response.into_body().collect().await.is_ok(),
                    Ok(response) => {
                        let status = response.status();
                        let body = response
                            .into_body()
                            .collect()
                            .await
                            .map(|body| body.to_bytes())
                            .unwrap_or_default();
                        first_failure.get_or_init(|| format!("{status}: {}", String::from_utf8_lossy(&body)));
                        false
                    }
                    Err(error) => {
                        first_failure.get_or_init(|| error.to_string());
                        sender = None;
                        false
                    }
                };
                if answered {
                    latencies.push(sent.elapsed());
                } else {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
            }
            latencies
        }));
    }
    let mut latencies = Vec::with_capacity(total as usize);
    for caller in callers {
        latencies.extend(caller.await?);
    }
    let elapsed = started.elapsed().as_secs_f64();
    latencies.sort_unstable();
    let at = |quantile: f64| {
        latencies
            .get(((latencies.len() as f64 * quantile) as usize).min(latencies.len().saturating_sub(1)))
            .map_or(f64::NAN, |latency| latency.as_secs_f64() * 1000.0)
    };
    Ok(Measured {
        per_sec: latencies.len() as f64 / elapsed,
        p50_ms: at(0.50),
        p99_ms: at(0.99),
        failed: failed.load(Ordering::Relaxed),
        first_failure: first_failure.get().cloned(),
    })
}

async fn connect(address: std::net::SocketAddr) -> Option<hyper::client::conn::http1::SendRequest<Empty<Bytes>>> {
    let stream = TcpStream::connect(address).await.ok()?;
    stream.set_nodelay(true).ok()?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.ok()?;
    tokio::spawn(connection);
    Some(sender)
}
