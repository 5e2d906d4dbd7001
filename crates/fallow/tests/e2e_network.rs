//! Several hosts on a Docker network: the coordinator and three agents, each in a container of
//! its own. The agent running a job is cut off (`docker network disconnect`) and later
//! reconnected. It must stop its replica (it fences itself after half a heartbeat timeout
//! without an answer) before the coordinator, finding the node silent for a whole timeout, ends
//! the lease as `lost` and starts the job on a second agent. Back on the network, the first
//! agent starts nothing again and its node comes back online. The replicas write the kernel's
//! uptime (one clock for every container) as they run, so their lives can be compared: they
//! never overlap. The tenant pays exactly the usage records metered for the job's leases, and
//! the lost lease what its replica ran up to the fence (sent once contact returned), no more.
//!
//! Docker is needed: without it the test is skipped loudly, unless
//! `FALLOW_CI_REQUIRE_SERVICES=1`, where it fails. The containers run this build's `fallow`
//! (bind-mounted) on an image made here with `docker import`: busybox-static as the shell and
//! tools, the shared libraries `ldd` lists for the binary, and the CA certificates.

mod common;

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use api::{BalanceView, JobView, LeaseView, NewAccountResponse, NodeView};
use common::{Scratch, http, now_ms, unique};
use model::Micros;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

/// The coordinator ends a silent node's leases after this; agents fence themselves after half.
const HEARTBEAT_TIMEOUT_MS: u64 = 4_000;
const HEARTBEAT_INTERVAL_MS: u64 = 500;
const AGENTS: usize = 3;
/// Where `fallow` is mounted in every container.
const FALLOW_IN_CONTAINER: &str = "/usr/local/bin/fallow";
/// The busybox applets the image links: the replicas' shell and the test's `ps`.
const APPLETS: [&str; 4] = ["sh", "ps", "sleep", "cat"];
/// In every replica's command line, so `ps` finds it.
const MARKER: &str = "fallow-e2e-replica";
/// A replica writes this many beats, one every [`BEAT_S`] seconds, then ends with exit 0.
const BEATS: u32 = 40;
const BEAT_S: &str = "0.2";
/// The first replica is cut off once it has written this many beats (usage is metered every
/// second, so some is billed by then).
const BEATS_BEFORE_CUT: usize = 8;
const CREDIT_DOLLARS: &str = "100.00";
const CREDIT_MICROS: i64 = 100_000_000;
const READY_WITHIN: Duration = Duration::from_secs(30);
/// From the cut until the job runs on a second agent: a heartbeat timeout, a silence check and
/// a placement, with room for a slow machine.
const MOVED_WITHIN: Duration = Duration::from_secs(20);
/// Heartbeats reconnect after the cut; a request sent while cut off may wait for its timeout.
const BACK_ONLINE_WITHIN: Duration = Duration::from_secs(45);
/// How long the reconnected agent is watched for a replica it should not start.
const WATCH_AFTER_RECONNECT: Duration = Duration::from_secs(2);
const FINISHED_WITHIN: Duration = Duration::from_secs(40);
const POLL_EVERY: Duration = Duration::from_millis(100);
/// The uptime clock's resolution (centiseconds), and the agent's metering starting as it
/// starts a replica: billed time must match a replica's life within this.
const METERING_SLACK_MS: i64 = 300;
/// A finished replica's last usage record runs to when its agent noticed the exit (a tick of
/// 250 ms, on a loaded machine more).
const EXIT_NOTICED_SLACK_MS: i64 = 1_500;
/// The cut-off replica is metered to a fence after its agent's last contact, and its guard stops
/// it then: its last line may come up to a grace period (SIGTERM handled) and a beat later.
const LOST_METERING_SLACK_MS: i64 = 700;

fn required() -> bool {
    std::env::var("FALLOW_CI_REQUIRE_SERVICES").is_ok_and(|value| value == "1")
}

/// Runs `docker ARGS`; its trimmed stdout, or what went wrong.
fn docker(args: &[&str]) -> Result<String, String> {
    let output = Command::new("docker")
        .args(args)
        .output()
        .map_err(|error| format!("docker {}: {error}", args.join(" ")))?;
    if !output.status.success() {
        return Err(format!(
            "docker {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
}

fn docker_ok(args: &[&str]) -> String {
    docker(args).unwrap_or_else(|error| panic!("{error}"))
}

fn busybox() -> Option<&'static Path> {
    ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .map(Path::new)
        .find(|path| path.is_file())
}

/// The shared libraries (and the dynamic loader) `ldd` lists for `binary`.
fn shared_libraries(binary: &Path) -> Result<Vec<PathBuf>, String> {
    let output = Command::new("ldd")
        .arg(binary)
        .output()
        .map_err(|error| format!("ldd: {error}"))?;
    let text = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        // A static binary needs none.
        return if text.contains("not a dynamic executable") || text.contains("statically linked") {
            Ok(Vec::new())
        } else {
            Err(format!(
                "ldd {}: {}",
                binary.display(),
                String::from_utf8_lossy(&output.stderr)
            ))
        };
    }
    Ok(text
        .lines()
        .filter_map(|line| {
            let path = match line.split_once("=>") {
                Some((_, target)) => target.split_whitespace().next(),
                None => line.split_whitespace().next(),
            }?;
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect())
}

/// Where Debian keeps the CA certificates: `fallow`'s HTTP client will not build without them,
/// though the test speaks plain HTTP.
const CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// The image every container runs: busybox with [`APPLETS`], the libraries `fallow` needs, the
/// CA certificates and /tmp; `fallow` itself is bind-mounted, so a rebuild needs no new image.
/// Tagged by a hash of its contents, so a rerun finds it and keeps it.
fn node_image(busybox: &Path, binary: &Path) -> Result<String, String> {
    let mut files = shared_libraries(binary)?;
    files.push(PathBuf::from(CA_BUNDLE));
    let mut hasher = std::hash::DefaultHasher::new();
    for path in std::iter::once(busybox).chain(files.iter().map(PathBuf::as_path)) {
        path.hash(&mut hasher);
        std::fs::read(path)
            .map_err(|error| format!("{}: {error}", path.display()))?
            .hash(&mut hasher);
    }
    APPLETS.hash(&mut hasher);
    let tag = format!("fallow-e2e-node:{:016x}", hasher.finish());
    if docker(&["image", "inspect", "--format", "{{.Id}}", &tag]).is_ok() {
        return Ok(tag);
    }
    let root = std::env::temp_dir().join(unique("fallow-e2e-image"));
    let tarball = root.with_extension("tar");
    let built = (|| {
        let io = |error: std::io::Error| error.to_string();
        std::fs::create_dir_all(root.join("bin")).map_err(io)?;
        std::fs::copy(busybox, root.join("bin/busybox")).map_err(io)?;
        for applet in APPLETS {
            std::os::unix::fs::symlink("busybox", root.join("bin").join(applet)).map_err(io)?;
        }
        for file in &files {
            let inside = root.join(file.strip_prefix("/").expect("absolute paths"));
            std::fs::create_dir_all(inside.parent().expect("a file lies in a folder")).map_err(io)?;
            std::fs::copy(file, &inside).map_err(|error| format!("{}: {error}", file.display()))?;
        }
        std::fs::create_dir_all(root.join("tmp")).map_err(io)?;
        std::fs::set_permissions(root.join("tmp"), std::os::unix::fs::PermissionsExt::from_mode(0o1777)).map_err(io)?;
        let status = Command::new("tar")
            .arg("-C")
            .arg(&root)
            .arg("-cf")
            .arg(&tarball)
            .arg(".")
            .status()
            .map_err(|error| format!("tar: {error}"))?;
        if !status.success() {
            return Err("tar failed".to_string());
        }
        docker(&["import", &tarball.to_string_lossy(), &tag]).map(|_| ())
    })();
    let _ = std::fs::remove_dir_all(&root);
    let _ = std::fs::remove_file(&tarball);
    built.map(|()| tag)
}

/// The network and the containers of one run: removed when dropped, on a panic too (after
/// printing the containers' last log lines).
struct Cluster {
    network: String,
    containers: Vec<String>,
}

impl Cluster {
    /// Starts a detached container on the cluster's network running `fallow ARGS`.
    fn run(&mut self, name: &str, image: &str, options: &[String], args: &[&str]) {
        self.containers.push(name.to_string());
        let binary_mount = format!("{}:{FALLOW_IN_CONTAINER}:ro", env!("CARGO_BIN_EXE_fallow"));
        let mut command = vec![
            "run",
            "--detach",
            "--name",
            name,
            "--hostname",
            name,
            "--network",
            &self.network,
            "--volume",
            &binary_mount,
            "--env",
            "FALLOW_LOG=info",
        ];
        command.extend(options.iter().map(String::as_str));
        command.push(image);
        command.push(FALLOW_IN_CONTAINER);
        command.extend(args);
        docker_ok(&command);
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for container in &self.containers {
                if let Ok(output) = Command::new("docker")
                    .args(["logs", "--tail", "30", container])
                    .output()
                {
                    eprintln!(
                        "--- the last lines of {container}:\n{}{}",
                        String::from_utf8_lossy(&output.stdout),
                        String::from_utf8_lossy(&output.stderr)
                    );
                }
            }
        }
        for container in &self.containers {
            let _ = Command::new("docker").args(["rm", "--force", container]).output();
        }
        let _ = Command::new("docker").args(["network", "rm", &self.network]).output();
    }
}

/// What one replica wrote: the container it ran in, and the kernel's uptime (seconds) at its
/// first and last line; `end` is how it ended: "done" (all beats) or "end" (stopped by SIGTERM),
/// or None while it runs or when it was killed outright.
#[derive(Debug)]
struct Replica {
    host: String,
    beats: Vec<u32>,
    first_s: f64,
    last_s: f64,
    end: Option<String>,
}

/// Reads a replica's output (lines `beat UPTIME HOST N`, then `done UPTIME HOST` or
/// `end UPTIME HOST`); None before its first line.
fn replica(log: &Path) -> Option<Replica> {
    let text = std::fs::read_to_string(log).ok()?;
    // Only whole lines: the last may be being written.
    let (complete, _) = text.rsplit_once('\n')?;
    let mut replica: Option<Replica> = None;
    // The shell reports its `sleep` ended by SIGTERM with a line of its own.
    for line in complete.lines().filter(|line| *line != "Terminated") {
        let words: Vec<&str> = line.split_whitespace().collect();
        let (kind, uptime_s, host) = match words[..] {
            [kind, uptime, host, ..] => (kind, uptime.parse::<f64>().ok()?, host),
            _ => panic!("{}: a line the replica did not write: {line:?}", log.display()),
        };
        let replica = replica.get_or_insert_with(|| Replica {
            host: host.to_string(),
            beats: Vec::new(),
            first_s: uptime_s,
            last_s: uptime_s,
            end: None,
        });
        assert_eq!(replica.host, host, "{}: one replica, two hosts", log.display());
        assert!(
            replica.end.is_none(),
            "{}: a line after the replica's end",
            log.display()
        );
        replica.last_s = uptime_s;
        match kind {
            "beat" => replica.beats.push(
                words
                    .get(3)
                    .and_then(|number| number.parse().ok())
                    .unwrap_or_else(|| panic!("{}: a beat without its number: {line:?}", log.display())),
            ),
            "done" | "end" => replica.end = Some(kind.to_string()),
            _ => panic!("{}: a line the replica did not write: {line:?}", log.display()),
        }
    }
    replica
}

/// The job's shell script: [`BEATS`] beats with the uptime and the host's name, a last line
/// when it ends or is stopped.
fn script() -> String {
    format!(
        ": {MARKER}\n\
         read host < /proc/sys/kernel/hostname\n\
         now() {{ read up rest < /proc/uptime; }}\n\
         trap 'now; echo \"end $up $host\"; exit 143' TERM\n\
         i=0\n\
         while [ $i -lt {BEATS} ]; do now; echo \"beat $up $host $i\"; i=$((i + 1)); sleep {BEAT_S}; done\n\
         now; echo \"done $up $host\"\n"
    )
}

/// Whether a replica of the test's job runs in `container` (by its process list), and the
/// kernel's uptime just after the list was taken: a replica not listed had ended by then.
fn replica_running(container: &str) -> (bool, f64) {
    let listing = docker_ok(&[
        "exec",
        container,
        "/bin/sh",
        "-c",
        "ps -o args; read up rest < /proc/uptime; echo \"uptime $up\"",
    ]);
    let running = listing.lines().any(|line| line.contains(MARKER));
    let uptime_s = listing
        .lines()
        .find_map(|line| line.strip_prefix("uptime "))
        .and_then(|uptime| uptime.trim().parse().ok())
        .unwrap_or_else(|| panic!("no uptime from {container}: {listing}"));
    (running, uptime_s)
}

async fn send(
    http: &reqwest::Client,
    method: Method,
    url: &str,
    key: &str,
    body: Option<&Value>,
) -> (StatusCode, String) {
    let mut request = http.request(method, url).bearer_auth(key);
    if let Some(body) = body {
        request = request.json(body);
    }
    let response = request.send().await.unwrap_or_else(|error| panic!("{url}: {error}"));
    let status = response.status();
    (status, response.text().await.unwrap_or_default())
}

/// A request that must answer `expect`; its answer parsed.
async fn call<R: serde::de::DeserializeOwned>(
    http: &reqwest::Client,
    method: Method,
    url: &str,
    key: &str,
    body: Option<&Value>,
    expect: StatusCode,
) -> R {
    let (status, text) = send(http, method, url, key, body).await;
    assert_eq!(status, expect, "{url}: {text}");
    serde_json::from_str(&text).unwrap_or_else(|error| panic!("{url}: {error} in {text}"))
}

/// The test's view of the coordinator in its container.
struct Market {
    http: reqwest::Client,
    base: String,
    admin_key: String,
    tenant_key: String,
    provider_key: String,
}

impl Market {
    async fn job(&self, id: i64) -> JobView {
        let url = format!("{}/v1/jobs/{id}", self.base);
        call(&self.http, Method::GET, &url, &self.tenant_key, None, StatusCode::OK).await
    }

    async fn nodes(&self) -> Vec<NodeView> {
        let url = format!("{}/v1/nodes", self.base);
        call(&self.http, Method::GET, &url, &self.admin_key, None, StatusCode::OK).await
    }
}

/// Polls `probe` every [`POLL_EVERY`] until it gives Some; panics with `what` after `within`.
async fn wait_for<T, F, Fut>(within: Duration, what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(Instant::now() < deadline, "not within {within:?}: {what}");
        tokio::time::sleep(POLL_EVERY).await;
    }
}

fn lease_log(agent_dir: &Path, lease: &LeaseView) -> PathBuf {
    agent_dir.join("leases").join(lease.id.to_string()).join("output.log")
}

/// Checks what the tenant paid for the finished job (`paid_micros`) against the usage records
/// in the coordinator's `database`: each record charged at its lease's price, none past its
/// lease's end, each lease billed no more than its replica ran (`replicas`, in lease order),
/// the whole job's cost paid, and the ledger balanced.
async fn check_billing(database: &Path, finished: &JobView, replicas: [&Replica; 2], paid_micros: i64) {
    let [first, second] = replicas;
    let store = store::Store::open(&format!("sqlite://{}", database.display()))
        .await
        .expect("open the coordinator's database");
    let mut charged_micros = 0;
    // The second replica ran uninterrupted, so its whole life is billed. The lost lease's
    // agent metered its replica up to the fence (its guard stopped it then) and sent what the
    // coordinator could not take while cut off once contact returned: it is billed what it
    // ran too, within a metering interval's worth of slack below.
    let [lost, done] = &finished.leases[..] else {
        panic!("the job has two leases: {:?}", finished.leases)
    };
    for (lease, replica, below_ms, above_ms) in [
        (lost, first, LOST_METERING_SLACK_MS, METERING_SLACK_MS),
        (done, second, METERING_SLACK_MS, EXIT_NOTICED_SLACK_MS),
    ] {
        let records = store.usage_of_lease(lease.id).await.expect("read usage records");
        assert!(!records.is_empty(), "lease {} was metered", lease.id);
        let ended_at_ms = lease.ended_at_us.expect("the job's leases have ended") / 1000;
        let mut billed_ms = 0;
        for record in &records {
            let expected = Micros(lease.price_micros_per_gpu_hour)
                .cost_for(record.gpu_seconds_milli as u64, 1)
                .expect("a small charge");
            assert_eq!(
                record.charged_micros, expected.0,
                "usage record {record:?} at its lease's price"
            );
            assert!(
                record.charged_micros > 0,
                "simulated usage is billed (--bill-simulated)"
            );
            let body: Value = serde_json::from_str(&record.body).expect("a usage record's body");
            let period_end_ms = body["period_end_ms"].as_i64().expect("period_end_ms");
            assert!(
                period_end_ms <= ended_at_ms,
                "lease {} is billed past its end at {ended_at_ms} ms: {record:?}",
                lease.id
            );
            billed_ms += record.gpu_seconds_milli;
            charged_micros += record.charged_micros;
        }
        let ran_ms = ((replica.last_s - replica.first_s) * 1000.0).round() as i64;
        eprintln!(
            "lease {} ({}): {} usage records, {billed_ms} GPU-ms billed, its replica ran {ran_ms} ms",
            lease.id,
            lease.state,
            records.len()
        );
        assert!(
            billed_ms <= ran_ms + above_ms,
            "lease {} billed {billed_ms} GPU-ms for a replica that ran {ran_ms} ms",
            lease.id
        );
        assert!(
            billed_ms >= ran_ms - below_ms,
            "lease {} billed {billed_ms} GPU-ms for a replica that ran {ran_ms} ms to its end",
            lease.id
        );
    }
    assert_eq!(
        paid_micros, charged_micros,
        "the tenant paid what the job's usage records charged"
    );
    assert_eq!(finished.cost_micros, charged_micros, "the job's cost");
    assert_eq!(
        store.ledger_totals().await.expect("ledger totals"),
        store::LedgerTotals {
            balances: 0,
            entries: 0
        },
        "the ledger balances"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_network_an_agent_cut_off_mid_job_fences_itself_and_the_job_moves_without_overlap() {
    let test = "e2e_network (coordinator and three agents in containers on a Docker network)";
    let missing = match (docker(&["version", "--format", "{{.Server.Version}}"]), busybox()) {
        (Err(error), _) => Some(format!("no Docker Engine: {error}")),
        (Ok(_), None) => Some("no static busybox on this machine (apt-get install busybox-static)".to_string()),
        (Ok(_), Some(_)) => None,
    };
    if let Some(missing) = missing {
        assert!(
            !required(),
            "{test} must run here (FALLOW_CI_REQUIRE_SERVICES=1): {missing}"
        );
        eprintln!("SKIPPED: {test}: {missing}");
        return;
    }
    let started = Instant::now();
    let binary = Path::new(env!("CARGO_BIN_EXE_fallow"));
    let image = match node_image(busybox().expect("checked above"), binary) {
        Ok(image) => image,
        Err(error) => {
            assert!(!required(), "{test}: the node image could not be built: {error}");
            eprintln!("SKIPPED: {test}: the node image could not be built: {error}");
            return;
        }
    };
    eprintln!("image {image} ready after {:?}", started.elapsed());

    let scratch = Scratch::new("fallow-e2e-network");
    let prefix = unique("fallow-e2e").replace('_', "-");
    let mut cluster = Cluster {
        network: format!("{prefix}-net"),
        containers: Vec::new(),
    };
    docker_ok(&["network", "create", "--driver", "bridge", &cluster.network]);
    let coordinator = format!("{prefix}-coordinator");
    let coordinator_dir = scratch.path.join("coordinator");
    std::fs::create_dir_all(&coordinator_dir).expect("create the coordinator's folder");
    cluster.run(
        &coordinator,
        &image,
        &[
            "--volume".to_string(),
            format!("{}:/data", coordinator_dir.display()),
            "--publish".to_string(),
            "127.0.0.1::7070".to_string(),
        ],
        &[
            "server",
            "--listen",
            "0.0.0.0:7070",
            "--data-dir",
            "/data",
            "--heartbeat-timeout-ms",
            &HEARTBEAT_TIMEOUT_MS.to_string(),
            "--heartbeat-interval-ms",
            &HEARTBEAT_INTERVAL_MS.to_string(),
            "--bill-simulated",
        ],
    );
    let published = docker_ok(&["port", &coordinator, "7070/tcp"]);
    let base = format!("http://{}", published.lines().next().expect("a published port"));
    let http = http();
    wait_for(READY_WITHIN, "the coordinator answers /v1/health", || async {
        let response = http.get(format!("{base}/v1/health")).send().await.ok()?;
        (response.status() == StatusCode::OK).then_some(())
    })
    .await;
    let admin_key = wait_for(READY_WITHIN, "the coordinator writes its admin key", || async {
        std::fs::read_to_string(coordinator_dir.join(server::ADMIN_KEY_FILE))
            .ok()
            .map(|key| key.trim().to_string())
            .filter(|key| !key.is_empty())
    })
    .await;
    let accounts = format!("{base}/v1/admin/accounts");
    let tenant: NewAccountResponse = call(
        &http,
        Method::POST,
        &accounts,
        &admin_key,
        Some(&json!({"role": "tenant", "name": "acme"})),
        StatusCode::CREATED,
    )
    .await;
    let provider: NewAccountResponse = call(
        &http,
        Method::POST,
        &accounts,
        &admin_key,
        Some(&json!({"role": "provider", "name": "farm"})),
        StatusCode::CREATED,
    )
    .await;
    let _: BalanceView = call(
        &http,
        Method::POST,
        &format!("{base}/v1/admin/credits"),
        &admin_key,
        Some(&json!({"account_id": tenant.account.id, "amount": CREDIT_DOLLARS, "key": "e2e-network"})),
        StatusCode::OK,
    )
    .await;
    let market = Market {
        http: http.clone(),
        base: base.clone(),
        admin_key,
        tenant_key: tenant.api_key.api_key,
        provider_key: provider.api_key.api_key,
    };

    // Three agents, each on a host of its own, reaching the coordinator by its name.
    let coordinator_url = format!("http://{coordinator}:7070");
    let agents: Vec<(String, PathBuf)> = (1..=AGENTS)
        .map(|index| {
            let name = format!("{prefix}-agent-{index}");
            let dir = scratch.path.join(format!("agent-{index}"));
            std::fs::create_dir_all(&dir).expect("create an agent's folder");
            cluster.run(
                &name,
                &image,
                &[
                    "--volume".to_string(),
                    format!("{}:/agent", dir.display()),
                    "--env".to_string(),
                    format!("FALLOW_PROVIDER_KEY={}", market.provider_key),
                ],
                &[
                    "agent",
                    "--coordinator",
                    &coordinator_url,
                    "--name",
                    &name,
                    "--data-dir",
                    "/agent",
                    "--executor",
                    "process",
                    "--simulate-gpus",
                    "H100-SXM5:1",
                    "--usage-every-s",
                    "1",
                    "--grace-s",
                    "2",
                ],
            );
            (name, dir)
        })
        .collect();
    let nodes = wait_for(READY_WITHIN, "three nodes registered and online", || async {
        let nodes = market.nodes().await;
        (nodes.len() == AGENTS && nodes.iter().all(|node| node.online)).then_some(nodes)
    })
    .await;
    // Node id → (container, data folder on this host).
    let agent_of = |node_id: i64| -> (String, PathBuf) {
        let node = nodes
            .iter()
            .find(|node| node.id == node_id)
            .unwrap_or_else(|| panic!("node {node_id} is none of the test's"));
        agents
            .iter()
            .find(|(name, _)| *name == node.name)
            .cloned()
            .unwrap_or_else(|| panic!("node {} runs no agent of the test's", node.name))
    };
    eprintln!("coordinator and {AGENTS} agents up after {:?}", started.elapsed());

    let job: JobView = call(
        &http,
        Method::POST,
        &format!("{base}/v1/jobs"),
        &market.tenant_key,
        Some(&json!({
            "name": "beats",
            "image": "/bin/sh",
            "command": ["-c", script()],
            "gpus": 1,
            "tier": "silver",
            "max_price_per_gpu_hour": "5.00",
            "max_runtime_s": 600,
        })),
        StatusCode::CREATED,
    )
    .await;
    let first_lease = wait_for(READY_WITHIN, "the job runs on an agent", || async {
        let view = market.job(job.id).await;
        view.leases.into_iter().find(|lease| lease.state == "running")
    })
    .await;
    let (first_agent, first_dir) = agent_of(first_lease.node_id);
    let first_log = lease_log(&first_dir, &first_lease);
    wait_for(READY_WITHIN, "the first replica writes its beats", || async {
        replica(&first_log).filter(|replica| replica.beats.len() >= BEATS_BEFORE_CUT)
    })
    .await;
    assert!(
        replica_running(&first_agent).0,
        "ps in {first_agent} does not list the replica that writes {}",
        first_log.display()
    );

    // Cut the first agent off. Within half a heartbeat timeout it must stop its replica; after
    // a whole one the coordinator ends the lease and places the job elsewhere.
    docker_ok(&["network", "disconnect", &cluster.network, &first_agent]);
    let cut_at = Instant::now();
    eprintln!("{first_agent} cut off after {:?}", started.elapsed());
    let mut first_gone_s: Option<f64> = None;
    let moved_by = cut_at + MOVED_WITHIN;
    let (second_lease, second_start_s) = loop {
        if first_gone_s.is_none() {
            let (running, uptime_s) = replica_running(&first_agent);
            if !running {
                eprintln!("the cut-off replica was gone {:?} after the cut", cut_at.elapsed());
                first_gone_s = Some(uptime_s);
            }
        }
        let view = market.job(job.id).await;
        if let Some(lease) = view.leases.into_iter().find(|lease| lease.id != first_lease.id)
            && let Some(second) = replica(&lease_log(&agent_of(lease.node_id).1, &lease))
        {
            break (lease, second.first_s);
        }
        assert!(
            Instant::now() < moved_by,
            "not within {MOVED_WITHIN:?}: the job runs on a second agent"
        );
        tokio::time::sleep(POLL_EVERY).await;
    };
    eprintln!("the job moved {:?} after the cut", cut_at.elapsed());
    let first = replica(&first_log).expect("the first replica wrote");
    assert!(
        first_gone_s.is_some_and(|gone_s| gone_s < second_start_s),
        "the job ran twice at once: the second replica started at uptime {second_start_s} s while \
         the cut-off one was {} (its last line at {} s)",
        first_gone_s.map_or("still running".to_string(), |gone_s| format!("gone only at {gone_s} s")),
        first.last_s
    );
    assert!(
        first.last_s < second_start_s,
        "the cut-off replica wrote at {} s, after the second started at {second_start_s} s",
        first.last_s
    );
    assert_eq!(
        first.end.as_deref(),
        Some("end"),
        "the cut-off replica was stopped by SIGTERM: {first:?}"
    );
    let (second_agent, second_dir) = agent_of(second_lease.node_id);
    assert_ne!(second_agent, first_agent, "the job moved to another agent");
    let view = market.job(job.id).await;
    let cut_off = view
        .leases
        .iter()
        .find(|lease| lease.id == first_lease.id)
        .expect("the first lease is listed");
    assert_eq!(cut_off.state, "lost", "the cut-off agent's lease: {cut_off:?}");
    let lost_ended_at_us = cut_off.ended_at_us.expect("a lost lease has ended");
    assert!(
        second_lease.created_at_us >= lost_ended_at_us,
        "the second lease ({}) began before the first ended ({lost_ended_at_us})",
        second_lease.created_at_us
    );

    // Reconnected, the first agent runs nothing again and its node comes back online.
    let first_log_bytes = std::fs::metadata(&first_log).map_or(0, |metadata| metadata.len());
    let reconnected_at_us = now_ms() * 1000;
    docker_ok(&["network", "connect", &cluster.network, &first_agent]);
    let reconnect_at = Instant::now();
    wait_for(
        BACK_ONLINE_WITHIN,
        "the reconnected agent's node is online again",
        || async {
            market
                .nodes()
                .await
                .into_iter()
                .find(|node| node.id == first_lease.node_id)
                .filter(|node| node.online && node.last_heartbeat_at_us.is_some_and(|at| at > reconnected_at_us))
        },
    )
    .await;
    eprintln!(
        "{first_agent} back online {:?} after reconnecting",
        reconnect_at.elapsed()
    );
    let watch_until = Instant::now() + WATCH_AFTER_RECONNECT;
    while Instant::now() < watch_until {
        assert!(
            !replica_running(&first_agent).0,
            "the reconnected agent runs a replica again"
        );
        tokio::time::sleep(POLL_EVERY).await;
    }
    let leases_there: Vec<String> = std::fs::read_dir(first_dir.join("leases"))
        .expect("the first agent's leases folder")
        .map(|entry| {
            entry
                .expect("a leases folder entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    assert_eq!(
        leases_there,
        vec![first_lease.id.to_string()],
        "the reconnected agent started another replica"
    );
    assert_eq!(
        std::fs::metadata(&first_log).map_or(0, |metadata| metadata.len()),
        first_log_bytes,
        "the stale replica wrote again after the reconnection"
    );
    let back = market.job(job.id).await;
    assert_eq!(
        back.leases
            .iter()
            .find(|lease| lease.id == first_lease.id)
            .map(|lease| lease.state.as_str()),
        Some("lost"),
        "the stale lease stays lost"
    );

    // The job ends on the second agent, which ran all its beats from the start.
    let finished = wait_for(FINISHED_WITHIN, "the job finishes", || async {
        let view = market.job(job.id).await;
        (view.state == "finished").then_some(view)
    })
    .await;
    let second = replica(&lease_log(&second_dir, &second_lease)).expect("the second replica wrote");
    assert_eq!(second.end.as_deref(), Some("done"), "{second:?}");
    assert_eq!(
        second.beats,
        (0..BEATS).collect::<Vec<_>>(),
        "the second replica's beats"
    );
    assert_eq!(
        first.host, first_agent,
        "the first replica ran in the first agent's container"
    );
    assert_eq!(second.host, second_agent, "the second replica ran in the second's");
    let states: Vec<(i64, &str)> = finished
        .leases
        .iter()
        .map(|lease| (lease.id, lease.state.as_str()))
        .collect();
    assert_eq!(
        states,
        vec![(first_lease.id, "lost"), (second_lease.id, "finished")],
        "the job's leases"
    );

    // Billing: the tenant paid what the usage records of the two leases charged, each record at
    // its lease's price, and each lease no more than its replica ran.
    let balance: BalanceView = call(
        &http,
        Method::GET,
        &format!("{base}/v1/balance"),
        &market.tenant_key,
        None,
        StatusCode::OK,
    )
    .await;
    assert_eq!(balance.escrow_micros, 0, "nothing is held once the job ended");
    let paid_micros = CREDIT_MICROS - balance.available_micros;
    // The database is read once the coordinator is gone, so nothing changes under the checks.
    docker_ok(&["kill", &coordinator]);
    check_billing(
        &coordinator_dir.join("fallow.db"),
        &finished,
        [&first, &second],
        paid_micros,
    )
    .await;
    eprintln!("{test}: passed in {:?}", started.elapsed());
}
