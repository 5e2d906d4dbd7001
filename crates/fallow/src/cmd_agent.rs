//! `fallow agent`: the provider agent. It makes the node's key on first start, registers the
//! node with the provider's API key, and from then on signs every request. Its subcommands act
//! for the node's owner from the node's host, signed with the same key: rotate it, and take the
//! node's GPUs back from the market (`reclaim`, `pause`) or give them back (`resume`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

#[derive(Args)]
#[command(args_conflicts_with_subcommands = false)]
pub struct AgentArgs {
    #[command(subcommand)]
    command: Option<AgentCommand>,
    /// The coordinator's URL.
    #[arg(
        long,
        global = true,
        env = "FALLOW_COORDINATOR",
        default_value = "http://127.0.0.1:7070"
    )]
    coordinator: String,
    /// A PEM file of a private CA to trust, besides the system's roots, for an https://
    /// coordinator and its gateways.
    #[arg(long, global = true, env = "FALLOW_CA_CERT", value_name = "PATH")]
    ca_cert: Option<PathBuf>,
    /// A file of settings named as these flags (`region = "eu-west"`; default:
    /// /etc/fallow/agent.toml when present); a flag or its environment variable beats it.
    #[arg(long, global = true, env = "FALLOW_AGENT_CONFIG", value_name = "PATH")]
    config: Option<PathBuf>,
    /// The provider's API key (needed the first time, to register the node).
    #[arg(long, env = "FALLOW_PROVIDER_KEY")]
    provider_key: Option<String>,
    /// Where the agent keeps its key (node.key, mode 0600), its node id and its leases' files.
    #[arg(long, global = true, default_value = "fallow-agent", env = "FALLOW_AGENT_DATA_DIR")]
    data_dir: PathBuf,
    /// Offer simulated GPUs instead of real ones, e.g. H100-SXM5:8; the node is marked simulated
    /// everywhere and never billed as real.
    #[arg(long, env = "FALLOW_AGENT_SIMULATE_GPUS")]
    simulate_gpus: Option<String>,
    /// The node's name (default: the host's name).
    #[arg(long, env = "FALLOW_AGENT_NAME")]
    name: Option<String>,
    #[arg(long, default_value = "local", env = "FALLOW_AGENT_REGION")]
    region: String,
    /// The site the node is in (a building or a cloud zone); its coordinates come from
    /// --latitude/--longitude, else from the coordinator's sites table.
    #[arg(long, default_value = "local", env = "FALLOW_AGENT_SITE")]
    site: String,
    /// The node's InfiniBand/RoCE island inside its site (default: SITE-net).
    #[arg(long, env = "FALLOW_AGENT_FABRIC")]
    fabric: Option<String>,
    /// The NVLink domain the node's GPUs share with other nodes' (e.g. a GB200 NVL72 rack's
    /// name). Default: what NVML reports (the NVL72 fabric's cluster and clique), else the node
    /// alone. A domain that disagrees with NVML is refused at registration.
    #[arg(long, env = "FALLOW_AGENT_NVLINK_DOMAIN")]
    nvlink_domain: Option<String>,
    /// The site's latitude and longitude in degrees (for latency-aware placement).
    #[arg(long, allow_negative_numbers = true, env = "FALLOW_AGENT_LATITUDE")]
    latitude: Option<f64>,
    #[arg(long, allow_negative_numbers = true, env = "FALLOW_AGENT_LONGITUDE")]
    longitude: Option<f64>,
    /// The address a gang's other replicas reach this node's replicas at (default: the
    /// address the coordinator sees the agent at).
    #[arg(long, env = "FALLOW_AGENT_ADVERTISE_ADDR")]
    advertise_addr: Option<String>,
    /// The ports the agent hands to gang replicas (MASTER_PORT among them), FIRST-LAST.
    #[arg(long, default_value = "29500-29999", env = "FALLOW_AGENT_GANG_PORTS")]
    gang_ports: String,
    /// Shared memory (/dev/shm) for each container, e.g. 8g or 512m (NCCL needs far more than
    /// Docker's 64m).
    #[arg(long, default_value = "8g", env = "FALLOW_AGENT_SHM_SIZE")]
    shm_size: String,
    /// Asks per GPU-hour in dollars, per tier sold (at first registration, when not given:
    /// gold=3.00,silver=2.00,bronze=1.00). Given, with the limits below, on a later start they
    /// replace the asks and limits set with `fallow node policy set`; not given, those stand.
    #[arg(long, env = "FALLOW_AGENT_ASKS")]
    asks: Option<String>,
    /// Above this GPU temperature (°C) the node reports itself over its limit.
    #[arg(long, env = "FALLOW_AGENT_THERMAL_LIMIT_C")]
    thermal_limit_c: Option<u16>,
    /// Above this GPU power draw (W) the node reports itself over its limit.
    #[arg(long, env = "FALLOW_AGENT_POWER_LIMIT_W")]
    power_limit_w: Option<u32>,
    /// Seconds between signed usage records of a running replica.
    #[arg(long, default_value_t = 30, env = "FALLOW_AGENT_USAGE_EVERY_S")]
    usage_every_s: u64,
    /// Seconds between SIGTERM and SIGKILL when a replica must stop.
    #[arg(long, default_value_t = 30, env = "FALLOW_AGENT_GRACE_S")]
    grace_s: u64,
    /// Let jobs name datasets by file:// URL (tests, air-gapped sites): a job could then read
    /// any file of this host whose digest it knows.
    #[arg(long, env = "FALLOW_AGENT_ALLOW_FILE_DATASETS")]
    allow_file_datasets: bool,
    /// What the dataset cache under the data directory keeps at most, in GiB (0: no limit):
    /// before a fetch, the datasets used least recently, and by no running replica, are removed
    /// until the new one fits.
    #[arg(long, default_value_t = 100, env = "FALLOW_AGENT_DATASET_CACHE_GIB")]
    dataset_cache_gib: u64,
    /// How replicas run: in Docker containers (the Docker Engine on this host), as processes
    /// (bare metal: `image` is the program), or both (jobs that ask for the process runtime as
    /// processes, the others in containers).
    #[arg(long, value_enum, default_value_t = ExecutorKind::Docker, env = "FALLOW_AGENT_EXECUTOR")]
    executor: ExecutorKind,
    /// How replicas' scratch directories are kept: encrypted volumes (gocryptfs over FUSE) with
    /// a key made for each lease, held only in the agent's memory, and the volume removed at the
    /// lease's end; `auto` does so where gocryptfs and /dev/fuse are available (and, for an
    /// agent not run as root, user_allow_other in /etc/fuse.conf) and otherwise uses plain
    /// directories, with a warning; `gocryptfs` refuses to start without them.
    #[arg(long, value_enum, default_value_t = ScratchEncryptionKind::Auto, env = "FALLOW_AGENT_SCRATCH_ENCRYPTION")]
    scratch_encryption: ScratchEncryptionKind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum ScratchEncryptionKind {
    Auto,
    Gocryptfs,
    Off,
}

impl From<ScratchEncryptionKind> for agent::ScratchEncryption {
    fn from(kind: ScratchEncryptionKind) -> agent::ScratchEncryption {
        match kind {
            ScratchEncryptionKind::Auto => agent::ScratchEncryption::Auto,
            ScratchEncryptionKind::Gocryptfs => agent::ScratchEncryption::Gocryptfs,
            ScratchEncryptionKind::Off => agent::ScratchEncryption::Off,
        }
    }
}

/// The asks a node registers with when none are given.
const DEFAULT_ASKS: &str = "gold=3.00,silver=2.00,bronze=1.00";

#[derive(clap::Subcommand)]
enum AgentCommand {
    /// Make a new key for this node and have the coordinator take it (signed by the current
    /// key, which then stops working). Stop the agent first; start it again after.
    RotateKey,
    /// Take GPUs of this node back from the market, signed with the node's key (no provider key
    /// needed): they take no new work, bronze work on them stops after its grace period, and
    /// firm work (gold, silver) runs on to its end unless --force (docs/trust-policy.md § 8).
    Reclaim {
        #[command(flatten)]
        reclaim: crate::cli::node::ReclaimFlags,
        /// Print the coordinator's answer as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Take every GPU of this node off the market, never forced: bronze work stops after its
    /// grace period, firm work runs on to its end, and no new work comes.
    Pause {
        /// For how long, e.g. 90s, 30m, 2h, 1d or 1h30m (default: until `fallow agent resume`).
        #[arg(long = "for", value_name = "DURATION", value_parser = crate::cli::node::parse_reclaim_for_s)]
        for_s: Option<u64>,
        /// Print the coordinator's answer as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Give every reclaimed GPU of this node back to the market.
    Resume {
        /// Print the coordinator's answer as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print the node's NVLink domain as NVML reports it (and what --nvlink-domain would
    /// change), then exit.
    DetectTopology,
    /// Write zeros over all the free memory of one GPU from a fresh CUDA context, as the agent
    /// does when a replica leaves a GPU, print what was written (JSON), then exit.
    ClearGpu {
        /// The GPU's CUDA ordinal.
        #[arg(long)]
        gpu: u8,
    },
    /// Build the agent's container image from this binary (and the libraries it links), as a
    /// local Docker image, and print its tag. Run it with the host's Docker socket, its data
    /// directory at the same path, the host's network and the GPUs (README: "A provider on
    /// Docker").
    Image {
        /// The image's tag (default fallow-agent:VERSION).
        #[arg(long)]
        tag: Option<String>,
    },
    /// A replica's guard, started by the agent beside each replica (stdin: the agent's feed);
    /// not for people.
    #[command(hide = true)]
    Guard(GuardArgs),
}

#[derive(Args)]
struct GuardArgs {
    /// The executor that started the replica.
    #[arg(long, value_enum)]
    executor: ExecutorKind,
    /// The replica: its process group id, or its container id.
    #[arg(long)]
    replica: String,
    /// The longest wait for the agent's next byte.
    #[arg(long)]
    fence_ms: u64,
    /// The longest wait for the agent's first byte.
    #[arg(long)]
    first_fence_ms: u64,
    /// Between SIGTERM and SIGKILL.
    #[arg(long)]
    grace_ms: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum ExecutorKind {
    Docker,
    Process,
    Both,
}

/// Runs a replica's guard until it has stopped the replica (`agent::guard`); its stdin is the
/// agent's feed.
fn guard(args: GuardArgs) -> anyhow::Result<()> {
    use std::os::fd::AsFd;
    let fence = agent::guard::Fence {
        fence: std::time::Duration::from_millis(args.fence_ms),
        first: std::time::Duration::from_millis(args.first_fence_ms),
        grace: std::time::Duration::from_millis(args.grace_ms),
    };
    // One per replica: a thread is enough.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let stdin = std::io::stdin()
            .as_fd()
            .try_clone_to_owned()
            .context("the guard's stdin")?;
        let feed = tokio::net::unix::pipe::Receiver::from_owned_fd(stdin)
            .context("the guard's stdin must be the agent's pipe")?;
        let mut report = std::io::stdout();
        let fired = match args.executor {
            ExecutorKind::Process => {
                let executor = agent::exec::process::ProcessExecutor;
                agent::guard::run_guard(&executor, &args.replica, feed, &mut report, fence).await
            }
            ExecutorKind::Docker => {
                let executor = agent::exec::docker::DockerExecutor::connect(false)
                    .await
                    .context("the guard's Docker executor")?;
                agent::guard::run_guard(&executor, &args.replica, feed, &mut report, fence).await
            }
            ExecutorKind::Both => {
                let docker = if args.replica.starts_with("docker:") {
                    Some(
                        agent::exec::docker::DockerExecutor::connect(false)
                            .await
                            .context("the guard's Docker executor")?,
                    )
                } else {
                    None
                };
                let executor = agent::exec::dual::DualExecutor::new(docker);
                agent::guard::run_guard(&executor, &args.replica, feed, &mut report, fence).await
            }
        }
        .context("stopping the replica")?;
        tracing::info!(replica = %args.replica, ?fired, "the guard stopped its replica");
        anyhow::Ok(())
    })
}

/// An agent running in this process.
pub struct RunningAgent {
    /// What it offers, in words: node, GPUs, runtimes.
    pub summary: String,
    pub task: tokio::task::JoinHandle<Result<(), agent::AgentError>>,
}

/// Starts the agent with `executor`; it runs until `stopped` says so.
async fn launch<E: agent::exec::Executor>(
    config: agent::AgentConfig,
    inventory: agent::gpu::Inventory,
    executor: E,
    stopped: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<RunningAgent> {
    let simulated = inventory.simulated;
    let (model, count) = (inventory.model.clone(), inventory.gpus.len());
    let runtimes = executor.runtimes().join(" and ");
    let mut config = config;
    // The matmul canary where CUDA and cuBLAS load and see the GPUs; the hash canary elsewhere.
    if !simulated && config.matmul_device.is_none() {
        config.matmul_device = match agent::matmul::probe_cuda() {
            Ok(devices) => {
                tracing::info!(devices, "the matmul canary runs on CUDA");
                Some(agent::matmul::MatmulDevice::Cuda)
            }
            Err(error) => {
                tracing::info!(%error, "no matmul canary on this node; the hash canary stays");
                None
            }
        };
    }
    let agent = agent::Agent::start(config, inventory, executor)
        .await
        .context("starting the agent")?;
    let summary = format!(
        "agent of node {} with {count} × {model}{}, running {runtimes} jobs",
        agent.node_id(),
        if simulated { " (simulated)" } else { "" }
    );
    Ok(RunningAgent {
        summary,
        task: tokio::spawn(agent.run(stopped)),
    })
}

/// Starts the agent with `executor` and runs it until SIGTERM or Ctrl-C.
async fn serve<E: agent::exec::Executor>(
    config: agent::AgentConfig,
    inventory: agent::gpu::Inventory,
    executor: E,
) -> anyhow::Result<()> {
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let running = launch(config, inventory, executor, stopped).await?;
    eprintln!("fallow: {}", running.summary);
    let signal = crate::signals::stop_requested().await?;
    eprintln!("fallow: {signal}: agent stopping");
    let _ = stop.send(true);
    running.task.await.context("the agent's loop")??;
    Ok(())
}

/// The local agent of `fallow dev`: real GPUs when found (or `simulate`), otherwise
/// `simulate_default`; processes always, and containers when a Docker Engine answers.
pub async fn start_dev_agent(
    coordinator: &str,
    provider_key: &str,
    data_dir: &std::path::Path,
    simulate: Option<&str>,
    simulate_default: &str,
    stopped: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<RunningAgent> {
    let known = |name: &str| model::GpuCatalog::embedded().find(name).is_some();
    let inventory = match simulate {
        Some(text) => agent::gpu::simulated(text, known)?,
        None => match agent::gpu::detect() {
            Ok(found) => agent::gpu::inventory_of(found)?,
            Err(error) => {
                tracing::info!(%error, "no GPU found; the dev node offers simulated GPUs");
                agent::gpu::simulated(simulate_default, known)?
            }
        },
    };
    let docker = agent::exec::docker::DockerExecutor::connect(!inventory.simulated)
        .await
        .ok();
    let config = agent_config(
        coordinator.to_string(),
        Some(provider_key.to_string()),
        data_dir.to_path_buf(),
        "dev-node".to_string(),
        "local",
        api::PolicyDoc {
            asks: asks(DEFAULT_ASKS)?,
            ..api::PolicyDoc::default()
        },
    )?;
    launch(
        agent::AgentConfig {
            usage_every: std::time::Duration::from_secs(5),
            grace: std::time::Duration::from_secs(10),
            ..config
        },
        inventory,
        agent::exec::dual::DualExecutor::new(docker),
        stopped,
    )
    .await
}

/// An agent's configuration with this host's cores and memory, the guard program (this binary)
/// and default timings.
fn agent_config(
    coordinator: String,
    provider_key: Option<String>,
    data_dir: std::path::PathBuf,
    name: String,
    site: &str,
    policy: api::PolicyDoc,
) -> anyhow::Result<agent::AgentConfig> {
    let cores = std::thread::available_parallelism().map_or(1, |cores| cores.get());
    Ok(agent::AgentConfig {
        coordinator,
        ca_certs: Vec::new(),
        policy_given: false,
        provider_key,
        data_dir,
        name,
        region: "local".to_string(),
        site: site.to_string(),
        fabric: format!("{site}-net"),
        cpu_milli: u32::try_from(cores * 1000).unwrap_or(u32::MAX),
        memory_mib: memory_mib(),
        policy,
        usage_every: std::time::Duration::from_secs(30),
        grace: std::time::Duration::from_secs(30),
        allow_file_datasets: false,
        dataset_cache_bytes: None,
        // This binary, as every replica's guard.
        guard_program: Some(std::env::current_exe().context("finding the fallow binary, for the replicas' guards")?),
        // This binary again, as `fallow canary run` for the coordinator's canary orders.
        canary_program: Some(std::env::current_exe().context("finding the fallow binary, for canaries")?),
        matmul_device: None,
        topology: agent::NodeTopology::default(),
        // Encrypted where this host can (gocryptfs and /dev/fuse), plain otherwise, said once.
        scratch_encryption: agent::ScratchEncryption::Auto,
    })
}

/// `FIRST-LAST` as a port range.
fn port_range(text: &str) -> anyhow::Result<(u16, u16)> {
    let (first, last) = text
        .split_once('-')
        .with_context(|| format!("--gang-ports: {text:?} is not FIRST-LAST"))?;
    let first: u16 = first
        .trim()
        .parse()
        .with_context(|| format!("--gang-ports: {first:?} is not a port"))?;
    let last: u16 = last
        .trim()
        .parse()
        .with_context(|| format!("--gang-ports: {last:?} is not a port"))?;
    anyhow::ensure!(
        first >= 1 && first <= last,
        "--gang-ports: {text:?} is not 1 ≤ FIRST ≤ LAST"
    );
    Ok((first, last))
}

/// A size like `8g`, `512m` or `1048576k` (no suffix: bytes), in MiB.
fn size_mib(text: &str) -> anyhow::Result<u64> {
    let text = text.trim().to_ascii_lowercase();
    let (number, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text.as_str(), ""),
    };
    let number: u64 = number
        .parse()
        .with_context(|| format!("--shm-size: {text:?} is not a size like 8g"))?;
    let bytes = match unit.trim_end_matches('b') {
        "" => number,
        "k" => number << 10,
        "m" => number << 20,
        "g" => number << 30,
        other => anyhow::bail!("--shm-size: unit {other:?} is not k, m or g"),
    };
    Ok(bytes >> 20)
}

/// The node's place in the interconnect: flags beat what NVML reports; the NVLink domain
/// falls back to the node alone.
fn topology(args: &AgentArgs, name: &str, simulated: bool) -> anyhow::Result<agent::NodeTopology> {
    let readings = if simulated { None } else { agent::gpu::read_nvlink() };
    let domain = agent::topology::nvlink_domain(args.nvlink_domain.as_deref(), readings.as_ref(), name);
    tracing::info!(
        domain = %domain.name,
        source = domain.source.as_str(),
        detected = ?domain.detected,
        "the node's NVLink domain"
    );
    Ok(agent::NodeTopology {
        nvlink_domain: domain.name.clone(),
        nvlink_source: domain.source.as_str().to_string(),
        nvlink_detected: domain.detected.clone().unwrap_or_default(),
        latitude: args.latitude.unwrap_or(0.0),
        longitude: args.longitude.unwrap_or(0.0),
        advertise_addr: args.advertise_addr.clone().unwrap_or_default(),
        gang_ports: port_range(&args.gang_ports)?,
        shm_mib: size_mib(&args.shm_size)?,
    })
}

fn asks(text: &str) -> anyhow::Result<BTreeMap<String, String>> {
    text.split(',')
        .map(|pair| {
            let (tier, price) = pair
                .split_once('=')
                .with_context(|| format!("--asks: {pair:?} is not TIER=DOLLARS"))?;
            Ok((tier.trim().to_string(), price.trim().to_string()))
        })
        .collect()
}

/// What the node's owner asks of the coordinator from the node's host.
enum OwnerRequest {
    Reclaim(api::ReclaimRequest),
    Resume,
}

/// Sends `request` signed with the key of the node registered in `--data-dir`, and prints the
/// coordinator's answer (as JSON with `json`).
fn owner_request(
    args: &AgentArgs,
    ca_certs: &[reqwest::Certificate],
    request: OwnerRequest,
    json: bool,
) -> anyhow::Result<()> {
    let data_dir = &args.data_dir;
    let node = agent::state::read_node(data_dir)
        .context("reading the node's id")?
        .with_context(|| {
            format!(
                "{} has no registered node: give the agent's data directory (--data-dir or \
                 FALLOW_AGENT_DATA_DIR), or start the agent once to register the node",
                data_dir.display()
            )
        })?;
    let key = agent::state::load_key(data_dir).context("reading the node's key")?;
    let client = agent::client::Client::trusting(&args.coordinator, ca_certs)?;
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    let view = runtime.block_on(async {
        match &request {
            OwnerRequest::Reclaim(reclaim) => client.reclaim(&key, node.node_id, reclaim).await,
            OwnerRequest::Resume => client.resume(&key, node.node_id).await,
        }
    });
    let view = view.with_context(|| match request {
        OwnerRequest::Reclaim(_) => format!("reclaiming node {}'s GPUs at {}", node.node_id, args.coordinator),
        OwnerRequest::Resume => format!("resuming node {} at {}", node.node_id, args.coordinator),
    })?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&view).context("encoding the coordinator's answer")?
        );
        return Ok(());
    }
    let hints = crate::cli::node::ReclaimHints {
        resume: "fallow agent resume".to_string(),
        force: "fallow agent reclaim --force".to_string(),
    };
    print!(
        "{}",
        crate::cli::node::reclaim_text(&view, &hints, crate::cli::output::now_us())
    );
    Ok(())
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_string())
        .ok()
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "node".to_string())
}

/// Total memory from /proc/meminfo, in MiB.
fn memory_mib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|line| line.strip_prefix("MemTotal:"))
                .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(1024, |kib| kib / 1024)
}

pub fn run(args: AgentArgs) -> anyhow::Result<()> {
    crate::cmd_server::init_logging();
    if let Some(config) = &args.config {
        tracing::info!(path = %config.display(), "settings from a config file");
    }
    if let Some(AgentCommand::Guard(guard_args)) = args.command {
        return guard(guard_args);
    }
    if let Some(AgentCommand::DetectTopology) = args.command {
        let readings = agent::gpu::read_nvlink();
        let domain = agent::topology::nvlink_domain(args.nvlink_domain.as_deref(), readings.as_ref(), &host_name());
        println!("{}", agent::topology::describe(&domain, readings.as_ref()));
        return Ok(());
    }
    if let Some(AgentCommand::ClearGpu { gpu }) = args.command {
        let zeroed = agent::gpu_clear::zero_free_memory(gpu).map_err(|error| match error {
            agent::gpu_clear::ZeroError::NoDriver => anyhow::anyhow!("GPU {gpu}: the CUDA driver is not on this host"),
            agent::gpu_clear::ZeroError::Cuda(message) => anyhow::anyhow!("GPU {gpu}: {message}"),
        })?;
        println!(
            "{}",
            serde_json::json!({
                "gpu": gpu,
                "zeroed_bytes": zeroed.bytes,
                "free_bytes_before": zeroed.free_before,
                "total_bytes": zeroed.total,
                "elapsed_ms": zeroed.elapsed.as_secs_f64() * 1000.0,
            })
        );
        return Ok(());
    }
    if let Some(AgentCommand::Image { tag }) = args.command {
        let tag = tag.unwrap_or_else(agent::image::default_agent_tag);
        let executable = std::env::current_exe().context("finding the fallow binary")?;
        agent::image::build_agent_image(&executable, &tag)
            .map_err(anyhow::Error::msg)
            .context("building the agent's image")?;
        println!("{tag}");
        return Ok(());
    }
    let ca_certs = match &args.ca_cert {
        Some(path) => agent::client::read_ca_certs(path).map_err(|error| anyhow::anyhow!("--ca-cert {error}"))?,
        None => Vec::new(),
    };
    match &args.command {
        Some(AgentCommand::Reclaim { reclaim, json }) => {
            return owner_request(&args, &ca_certs, OwnerRequest::Reclaim(reclaim.request()), *json);
        }
        Some(AgentCommand::Pause { for_s, json }) => {
            let pause = api::ReclaimRequest {
                gpus: None,
                for_s: *for_s,
                force: false,
            };
            return owner_request(&args, &ca_certs, OwnerRequest::Reclaim(pause), *json);
        }
        Some(AgentCommand::Resume { json }) => return owner_request(&args, &ca_certs, OwnerRequest::Resume, *json),
        _ => {}
    }
    if let Some(AgentCommand::RotateKey) = args.command {
        let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
        let public = runtime
            .block_on(agent::rotate_key(&args.data_dir, &args.coordinator, &ca_certs))
            .context("rotating the node's key")?;
        eprintln!(
            "fallow: the node's new key is {public}; {} holds it (mode 0600)",
            args.data_dir.join(agent::state::KEY_FILE).display()
        );
        return Ok(());
    }
    let inventory = match &args.simulate_gpus {
        Some(text) => agent::gpu::simulated(text, |name| model::GpuCatalog::embedded().find(name).is_some())?,
        None => agent::gpu::inventory_of(agent::gpu::detect()?)?,
    };
    let name = args.name.clone().unwrap_or_else(host_name);
    let topology = topology(&args, &name, inventory.simulated)?;
    let config = agent_config(
        args.coordinator,
        args.provider_key,
        args.data_dir,
        name,
        &args.site,
        api::PolicyDoc {
            asks: asks(args.asks.as_deref().unwrap_or(DEFAULT_ASKS))?,
            thermal_limit_c: args.thermal_limit_c,
            power_limit_w: args.power_limit_w,
            ..api::PolicyDoc::default()
        },
    )?;
    let config = agent::AgentConfig {
        ca_certs,
        policy_given: args.asks.is_some() || args.thermal_limit_c.is_some() || args.power_limit_w.is_some(),
        region: args.region,
        fabric: args.fabric.unwrap_or(config.fabric.clone()),
        topology,
        usage_every: std::time::Duration::from_secs(args.usage_every_s.max(1)),
        grace: std::time::Duration::from_secs(args.grace_s),
        allow_file_datasets: args.allow_file_datasets,
        dataset_cache_bytes: (args.dataset_cache_gib > 0).then(|| args.dataset_cache_gib.saturating_mul(1 << 30)),
        scratch_encryption: args.scratch_encryption.into(),
        ..config
    };
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(async move {
        match args.executor {
            ExecutorKind::Process => serve(config, inventory, agent::exec::process::ProcessExecutor).await,
            ExecutorKind::Docker => {
                let executor = agent::exec::docker::DockerExecutor::connect(!inventory.simulated)
                    .await
                    .context("the Docker executor (or start the agent with --executor process)")?;
                serve(config, inventory, executor).await
            }
            ExecutorKind::Both => {
                let docker = agent::exec::docker::DockerExecutor::connect(!inventory.simulated)
                    .await
                    .context("the Docker executor (or start the agent with --executor process)")?;
                serve(config, inventory, agent::exec::dual::DualExecutor::new(Some(docker))).await
            }
        }
    })
}
