//! The agent: register once, then heartbeat with telemetry and tend the replicas every tick
//! until shut down. This file holds the agent's state, its start and its loop; what the loop does
//! lives beside it: `leases` (following the lease set, starting and stopping replicas, fencing,
//! attesting each replica's end), `metering` (signed usage records), `logs` (shipping replicas'
//! output), `progress` (reporting it) and `canaries` (the coordinator's canary orders).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use api::{AgentLease, CanaryOrder, HeartbeatRequest, NodeRegistration, PolicyDoc};
use tokio::sync::watch;
use trust::NodeKey;

use crate::client::{Client, ClientError, LeaseSet};
use crate::exec::{Executor, Exit, RunSpec};
use crate::gpu::Inventory;
use crate::guard::Guards;
use crate::state::{self, NodeState, RunRecord};

mod canaries;
mod gang;
mod leases;
mod logs;
mod metering;
mod pacer;
mod prefetch;
mod progress;

use leases::{feed_guards, poll_leases};

pub use canaries::{
    CANARIES_RUNNING_MAX, CANARY_IDS_REMEMBERED_MAX, CANARY_PRODUCTS_DIR, CANARY_REPORT_ATTEMPTS_MAX, CANARY_RUN_MAX,
};
pub use gang::{PORT_VAR, RENDEZVOUS_FILE, gang_env, reserve_port};
pub use leases::LEASE_POLL_WAIT_MS;
pub use logs::{LOG_CHUNK_BYTES, LOG_SETTLE};

/// How often the loop looks at its replicas (exits, usage, preemption times).
pub const TICK: Duration = Duration::from_millis(250);
/// How many times the agent tries to register before it gives up (and its service manager
/// starts it again): with backoff from 0.5 s, about a minute.
pub const REGISTER_ATTEMPTS_MAX: u32 = 8;

/// What the agent is told at start.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    pub coordinator: String,
    /// Whether the policy's asks and limits were set for this start (a flag, the environment,
    /// a config file): a registered node's agent then restates them, replacing what the owner
    /// set at the coordinator; otherwise the coordinator's stand.
    pub policy_given: bool,
    /// Certificates trusted besides the system's roots when dialling the coordinator and its
    /// gateways over https (a private CA's, `--ca-cert`).
    pub ca_certs: Vec<reqwest::Certificate>,
    /// The provider's API key; needed only to register the node the first time.
    pub provider_key: Option<String>,
    pub data_dir: PathBuf,
    /// The node's name in the provider's fleet.
    pub name: String,
    pub region: String,
    pub site: String,
    pub fabric: String,
    pub cpu_milli: u32,
    pub memory_mib: u64,
    pub policy: PolicyDoc,
    /// A usage record is signed and sent this often for each running replica.
    pub usage_every: Duration,
    /// SIGTERM comes this long before a preempted replica must be gone.
    pub grace: Duration,
    /// Whether jobs may name datasets by `file://` URL (tests, air-gapped sites); off by default.
    pub allow_file_datasets: bool,
    /// What the dataset cache keeps at most, in bytes (`None`: no limit); the datasets used
    /// least recently go first (`crate::datasets::DatasetCache::with_limit`).
    pub dataset_cache_bytes: Option<u64>,
    /// The `fallow` binary, started as `PROGRAM agent guard ...` beside each replica to stop it
    /// when this agent stops vouching for it (`crate::guard`); `None` starts no guards.
    pub guard_program: Option<PathBuf>,
    /// The `fallow` binary, started as `PROGRAM canary run ...` for each canary order; `None`
    /// runs `crate::canary::run_canary` on a blocking thread of this process instead.
    pub canary_program: Option<PathBuf>,
    /// Where the matmul canary runs (docs/trust-policy.md § 3): CUDA where the driver and cuBLAS
    /// load and see the GPUs (`crate::matmul::probe_cuda`), the CPU reference in tests; `None`:
    /// the node offers the hash canary only.
    pub matmul_device: Option<crate::matmul::MatmulDevice>,
    /// Where the node sits and how its gang replicas are reached.
    pub topology: NodeTopology,
    /// Whether replicas' scratch directories are encrypted volumes with a key per lease
    /// (`crate::scratch`).
    pub scratch_encryption: crate::scratch::ScratchEncryption,
}

/// Where a node sits in the interconnect and on the map, and how a gang's other replicas reach
/// its replicas: what it registers, and what its gang replicas are started with.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeTopology {
    /// The NVLink domain's name ("": the node alone), where it came from ("flag",
    /// "nvml-fabric", "nvswitch", "node") and what NVML reported ("" when nothing).
    pub nvlink_domain: String,
    pub nvlink_source: String,
    pub nvlink_detected: String,
    /// The site's coordinates (0, 0: unknown; the coordinator's sites table may know them).
    pub latitude: f64,
    pub longitude: f64,
    /// The address gang peers reach this node at ("": the one the coordinator sees).
    pub advertise_addr: String,
    /// The ports handed to gang replicas, first and last.
    pub gang_ports: (u16, u16),
    /// `/dev/shm` for each replica in MiB (NCCL's buffers); 0: the executor's default.
    pub shm_mib: u64,
}

/// The ports handed to gang replicas unless told otherwise (torchrun's default master port
/// is the first).
pub const GANG_PORTS_DEFAULT: (u16, u16) = (29_500, 29_999);
/// A replica's `/dev/shm` unless told otherwise: NCCL wants far more than Docker's 64 MiB.
pub const SHM_MIB_DEFAULT: u64 = 8 * 1024;

impl Default for NodeTopology {
    fn default() -> NodeTopology {
        NodeTopology {
            nvlink_domain: String::new(),
            nvlink_source: "node".to_string(),
            nvlink_detected: String::new(),
            latitude: 0.0,
            longitude: 0.0,
            advertise_addr: String::new(),
            gang_ports: GANG_PORTS_DEFAULT,
            shm_mib: SHM_MIB_DEFAULT,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("this node is not registered yet: give the provider's API key (--provider-key)")]
    NoProviderKey,
    #[error("{0}")]
    Config(String),
}

/// One replica this agent runs.
struct Run<H> {
    lease: AgentLease,
    spec: RunSpec,
    handle: H,
    started_ms: i64,
    /// Usage is metered up to here.
    metered_to_ms: i64,
    /// The last usage record's sequence number (the first is the run's start in ms, plus one).
    sequence: i64,
    gpu_seconds_milli: i64,
    /// Thousandths of a GPU the lease holds in all.
    gpu_milli: i64,
    /// SIGTERM sent (preempted, or its lease ended).
    stopping: bool,
    /// How much of the log the coordinator has (kept beside the log as well).
    log: state::LogCursor,
    /// The last progress reported: (count, unit).
    progress_sent: Option<(i64, String)>,
    /// The utilisation (per mille) of the replica's GPUs at each heartbeat the coordinator took
    /// since metering last moved, summed, and how many: a usage record claims their mean,
    /// which is what the coordinator's copy of those heartbeats says too.
    utilisation_sum_permille: i64,
    utilisation_samples: i64,
}

pub struct Agent<E: Executor> {
    config: AgentConfig,
    key: Arc<NodeKey>,
    node_id: i64,
    client: Arc<Client>,
    executor: Arc<E>,
    inventory: Inventory,
    runs: HashMap<i64, Run<E::Handle>>,
    /// Replicas being stopped in the background, by lease id, with the GPUs they still hold.
    stopping: HashMap<i64, (Vec<u8>, tokio::task::JoinHandle<Option<Exit>>)>,
    /// The coordinator's last lease set.
    wanted: Vec<AgentLease>,
    /// A lease of `wanted` waits for its GPUs to be free (a preempted replica in its grace).
    launch_waiting: bool,
    /// Leases (id, epoch) whose replica ended here: never started again, though the
    /// coordinator may list them until it ends them (a preempted one, until `preempt_at`).
    ended: std::collections::HashSet<(i64, i64)>,
    /// Leases (id, epoch) whose replica an earlier run of this agent left running: when one runs
    /// again, its log says where output may be missing (`restart_marker`).
    left_running: std::collections::HashSet<(i64, i64)>,
    datasets: crate::datasets::DatasetCache,
    /// Fetches datasets.
    http: reqwest::Client,
    /// Datasets being staged ahead at the coordinator's word, by digest, and when those that
    /// failed did (not tried again for `PREFETCH_RETRY_AFTER`).
    prefetching: HashMap<String, tokio::task::JoinHandle<()>>,
    prefetch_failed: Arc<std::sync::Mutex<HashMap<String, tokio::time::Instant>>>,
    /// The last time the coordinator answered (a heartbeat or a lease poll).
    contact: tokio::sync::watch::Sender<tokio::time::Instant>,
    /// The coordinator's heartbeat timeout, from its last heartbeat answer.
    heartbeat_timeout: Option<Duration>,
    /// The replicas' guards, by lease id (none without `AgentConfig::guard_program`).
    guards: Guards,
    /// This node's ready serving replicas, reached through the gateway's tunnel, and the
    /// health probes of those not ready yet (stopped with their replica).
    serving: crate::tunnel::Routes,
    /// Gateways running on their own, from the last heartbeat answer: a tunnel to each.
    gateways: watch::Sender<Vec<String>>,
    probes: HashMap<i64, watch::Sender<bool>>,
    /// Usage records the coordinator could not be reached for, oldest first: sent again when
    /// contact returns (each once per sequence; the coordinator bills it up to the lease's end).
    unsent: std::collections::VecDeque<trust::UsageRecord>,
    /// When `tend` last began (ms): a frozen agent's replicas were stopped by their guards
    /// about a fence after it.
    tended_ms: i64,
    /// Canaries running, by order id: each task runs the canary and, once it ends, hands its
    /// result to a task of its own to report (so stopping a canary never stops a report).
    canaries: HashMap<i64, (CanaryOrder, tokio::task::JoinHandle<()>)>,
    /// Canary ids seen, oldest first (each runs at most once), with a set to look them up.
    canaries_seen: std::collections::VecDeque<i64>,
    canaries_seen_set: std::collections::HashSet<i64>,
    /// Gang replicas staged and waiting for their gang's start barrier, by lease id.
    staged: HashMap<i64, gang::Staged>,
    /// When the loop may send again what the coordinator failed (`pacer`).
    pacer: pacer::Pacer,
    /// How replicas' scratch directories are kept: encrypted volumes, or plain directories.
    scratch: crate::scratch::Scratch,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis() as i64)
}

impl<E: Executor> Agent<E> {
    /// Loads or makes the node's key and registers the node if this data directory has not yet.
    pub async fn start(mut config: AgentConfig, inventory: Inventory, executor: E) -> Result<Agent<E>, AgentError> {
        // Before anything is written: a start refused for want of gocryptfs leaves nothing.
        let scratch = crate::scratch::Scratch::resolve(config.scratch_encryption)
            .map_err(|error| AgentError::Config(error.to_string()))?;
        // Replicas run in directories of their own: every path handed to them is absolute.
        std::fs::create_dir_all(&config.data_dir)?;
        config.data_dir = std::path::absolute(&config.data_dir)?;
        // Matmul canaries' products left by a run that ended before its challenge: none runs now.
        let products = config.data_dir.join(canaries::CANARY_PRODUCTS_DIR);
        if products.exists() {
            std::fs::remove_dir_all(&products)?;
        }
        let (key, created) = state::load_or_create_key(&config.data_dir)?;
        if created {
            tracing::info!(
                path = %config.data_dir.join(state::KEY_FILE).display(),
                public_key = %key.public_hex(),
                "made the node's key (mode 0600)"
            );
        }
        let client = Client::trusting(&config.coordinator, &config.ca_certs)?;
        let gpu_count = u8::try_from(inventory.gpus.len())
            .map_err(|_| AgentError::Config("more than 255 GPUs on one node".into()))?;
        let registration = NodeRegistration {
            name: config.name.clone(),
            public_key: key.public_hex(),
            fingerprint: inventory.fingerprint(),
            gpu_model: inventory.model.clone(),
            gpu_count,
            cpu_milli: config.cpu_milli,
            memory_mib: config.memory_mib,
            network_mbit_s: 10_000,
            region: config.region.clone(),
            site: config.site.clone(),
            fabric: config.fabric.clone(),
            nvlink_domain: config.topology.nvlink_domain.clone(),
            nvlink_source: config.topology.nvlink_source.clone(),
            nvlink_detected: config.topology.nvlink_detected.clone(),
            latitude: config.topology.latitude,
            longitude: config.topology.longitude,
            advertise_addr: config.topology.advertise_addr.clone(),
            gang_ports: format!("{}-{}", config.topology.gang_ports.0, config.topology.gang_ports.1),
            simulated: inventory.simulated,
            policy: config.policy.clone(),
            runtimes: executor.runtimes(),
            canary_kinds: match config.matmul_device {
                Some(_) if !inventory.simulated => vec![api::CanaryKind::Matmul.name().to_string()],
                _ => Vec::new(),
            },
        };
        let node_id = match state::read_node(&config.data_dir)? {
            Some(node) => {
                restate(&client, &key, node.node_id, registration, config.policy_given).await?;
                node.node_id
            }
            None => {
                let provider_key = config.provider_key.as_deref().ok_or(AgentError::NoProviderKey)?;
                let node = register(&client, provider_key, &registration).await?;
                state::write_node(
                    &config.data_dir,
                    &NodeState {
                        node_id: node.id,
                        coordinator: config.coordinator.clone(),
                    },
                )?;
                tracing::info!(node = node.id, simulated = inventory.simulated, "registered the node");
                node.id
            }
        };
        let datasets = crate::datasets::DatasetCache::new(config.data_dir.join("datasets"), config.allow_file_datasets)
            .with_limit(config.dataset_cache_bytes);
        Ok(Agent {
            config,
            key: Arc::new(key),
            node_id,
            client: Arc::new(client),
            executor: Arc::new(executor),
            inventory,
            runs: HashMap::new(),
            stopping: HashMap::new(),
            datasets,
            http: reqwest::Client::new(),
            prefetching: HashMap::new(),
            prefetch_failed: Arc::default(),
            wanted: Vec::new(),
            launch_waiting: false,
            ended: std::collections::HashSet::new(),
            left_running: std::collections::HashSet::new(),
            contact: tokio::sync::watch::Sender::new(tokio::time::Instant::now()),
            unsent: std::collections::VecDeque::new(),
            tended_ms: 0,
            heartbeat_timeout: None,
            guards: Guards::default(),
            serving: crate::tunnel::Routes::default(),
            gateways: watch::channel(Vec::new()).0,
            probes: HashMap::new(),
            canaries: HashMap::new(),
            canaries_seen: std::collections::VecDeque::new(),
            canaries_seen_set: std::collections::HashSet::new(),
            staged: HashMap::new(),
            pacer: pacer::Pacer::new(node_id as u64),
            scratch,
        })
    }

    pub fn node_id(&self) -> i64 {
        self.node_id
    }

    /// Stops what a previous run of this agent left: their leases are started again below when
    /// the coordinator still lists them, so nothing runs twice.
    async fn stop_leftovers(&mut self) -> Result<(), AgentError> {
        let leftovers = state::read_runs(&self.config.data_dir)?;
        for leftover in &leftovers {
            tracing::warn!(
                lease = leftover.lease_id,
                "stopping a replica left by an earlier run of the agent"
            );
            self.left_running.insert((leftover.lease_id, leftover.epoch));
        }
        self.executor.stop_leftovers(&leftovers).await;
        // Their scratch volumes' keys died with that run: unmount and remove what is left.
        self.scratch.clean_stale(&self.config.data_dir.join("leases")).await;
        state::write_runs(&self.config.data_dir, &[])?;
        Ok(())
    }

    fn save_runs(&self) {
        let records: Vec<RunRecord> = self
            .runs
            .values()
            .map(|run| RunRecord {
                lease_id: run.lease.lease.id,
                epoch: run.lease.lease.epoch,
                id: self.executor.handle_id(&run.handle),
            })
            .collect();
        if let Err(error) = state::write_runs(&self.config.data_dir, &records) {
            tracing::warn!(%error, "could not record the running replicas");
        }
    }

    /// Runs until `shutdown` turns true; then stops its replicas (their leases stay live, so a
    /// restarted agent runs them again, and a node that stays away loses them).
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) -> Result<(), AgentError> {
        self.stop_leftovers().await?;
        let (sets, mut set_changes) = watch::channel::<Option<LeaseSet>>(None);
        let poller = tokio::spawn(poll_leases(
            Client::trusting(&self.config.coordinator, &self.config.ca_certs)?,
            NodeKey::from_hex(&self.key.to_hex()).map_err(|error| AgentError::Config(error.to_string()))?,
            self.node_id,
            sets,
            self.contact.clone(),
            shutdown.clone(),
        ));
        // The gateways reach this node's serving replicas through them; no inbound port.
        tokio::spawn(crate::tunnel::keep(
            self.config.coordinator.clone(),
            self.config.ca_certs.clone(),
            Arc::clone(&self.key),
            self.node_id,
            self.serving.clone(),
            self.gateways.subscribe(),
            shutdown.clone(),
        ));
        // Ends when the agent does (its contact sender with it), or with the process.
        tokio::spawn(feed_guards(self.contact.subscribe(), self.guards.clone()));
        let mut heartbeat_every = Duration::from_secs(10);
        let mut next_heartbeat = tokio::time::Instant::now();
        loop {
            tokio::select! {
                _ = shutdown.changed() => {}
                changed = set_changes.changed() => {
                    if changed.is_ok() {
                        let set = set_changes.borrow_and_update().clone();
                        if let Some(set) = set {
                            self.reconcile(&set.leases).await;
                        }
                    }
                }
                () = tokio::time::sleep_until(next_heartbeat) => {
                    self.inventory.refresh();
                    let beat = HeartbeatRequest {
                        gpus: self.inventory.telemetry(),
                        fingerprint: Some(self.inventory.fingerprint()),
                        datasets: Some(self.datasets.digests()),
                        over_limit: self
                            .inventory
                            .over_limit(self.config.policy.thermal_limit_c, self.config.policy.power_limit_w),
                        leases: Some(self.held_leases()),
                    };
                    // Taken after the answer: the first one sets the interval the next beat keeps.
                    let mut next_wait = None;
                    match self.client.heartbeat(&self.key, self.node_id, &beat).await {
                        Ok(answer) => {
                            self.contact.send_replace(tokio::time::Instant::now());
                            self.pacer.succeeded();
                            for run in self.runs.values_mut() {
                                run.utilisation_sum_permille +=
                                    self.inventory.utilisation_permille(&run.lease.lease.gpu_indices);
                                run.utilisation_samples += 1;
                            }
                            heartbeat_every = Duration::from_millis(answer.heartbeat_interval_ms.max(100));
                            self.heartbeat_timeout = (answer.heartbeat_timeout_ms > 0)
                                .then(|| Duration::from_millis(answer.heartbeat_timeout_ms));
                            if let Some(timeout) = self.heartbeat_timeout {
                                // A request to an unreachable coordinator gives up well
                                // before this agent must fence itself (half the timeout).
                                self.client
                                    .set_request_timeout((timeout / 4).max(Duration::from_millis(500)));
                            }
                            // The lease set comes from the long poll alone: it is versioned,
                            // while a heartbeat answered late may carry an older set, which
                            // would stop a replica the newer one just started.
                            if let Some(limits) = answer.limits {
                                self.take_limits(limits);
                            }
                            self.start_canaries(answer.canaries);
                            self.prefetch(answer.prefetch);
                            self.gateways.send_if_modified(|gateways| {
                                let changed = *gateways != answer.gateways;
                                if changed {
                                    gateways.clone_from(&answer.gateways);
                                }
                                changed
                            });
                        }
                        Err(error) => {
                            tracing::warn!(%error, "heartbeat failed");
                            // Again within the usual interval, at a time of this node's own:
                            // nodes that failed together do not come back together.
                            if let Some(wait) = self.pacer.failed(&error) {
                                next_wait = Some(wait.min(heartbeat_every));
                            }
                        }
                    }
                    next_heartbeat = tokio::time::Instant::now() + next_wait.unwrap_or(heartbeat_every);
                }
                () = tokio::time::sleep(TICK) => {}
            }
            if *shutdown.borrow() {
                break;
            }
            self.tend().await;
        }
        for (id, (_, task)) in self.canaries.drain() {
            tracing::info!(canary = id, "the agent stops; stopping the canary unreported");
            task.abort();
        }
        // All at once: the agent stops within one grace period, however many replicas it runs.
        let leases: Vec<i64> = self.runs.keys().copied().collect();
        for lease in leases {
            if let Some(run) = self.runs.remove(&lease) {
                self.stop_in_background(run, self.config.grace);
            }
        }
        for (_, (_, stopping)) in self.stopping.drain() {
            let _ = stopping.await;
        }
        self.save_runs();
        let _ = poller.await;
        Ok(())
    }

    /// Takes the limits the coordinator holds for this node (set there with `fallow node policy
    /// set`): the next heartbeat says whether the node is over them.
    fn take_limits(&mut self, limits: api::NodeLimits) {
        let policy = &mut self.config.policy;
        if policy.thermal_limit_c == limits.thermal_limit_c && policy.power_limit_w == limits.power_limit_w {
            return;
        }
        tracing::info!(
            thermal_limit_c = ?limits.thermal_limit_c,
            power_limit_w = ?limits.power_limit_w,
            "the node's limits changed at the coordinator; taking them"
        );
        policy.thermal_limit_c = limits.thermal_limit_c;
        policy.power_limit_w = limits.power_limit_w;
    }

    /// Meters usage, notices ends, and starts the grace period of preempted replicas.
    async fn tend(&mut self) {
        self.fence_if_cut_off();
        self.take_guarded_stops();
        self.tended_ms = now_ms();
        if !self.unsent.is_empty()
            && self.pacer.ready()
            && self
                .fence()
                .is_none_or(|fence| self.contact.borrow().elapsed() < fence.fence)
        {
            self.send_unsent_usage().await;
        }
        self.stopping.retain(|_, (_, task)| !task.is_finished());
        self.canaries.retain(|_, (_, task)| !task.is_finished());
        if self.launch_waiting && self.pacer.ready() {
            let wanted = self.wanted.clone();
            self.reconcile(&wanted).await;
        }
        let now = now_ms();
        let ids: Vec<i64> = self.runs.keys().copied().collect();
        for id in ids {
            let exit = match self.runs.get(&id) {
                Some(run) => self.executor.poll_exit(&run.handle).await,
                None => continue,
            };
            match exit {
                Ok(Some(exit)) => {
                    if self.guards.has_fired(id) {
                        // Stopped by its guard, not ended on its own.
                        self.take_guarded_stops();
                    } else if let Some(run) = self.runs.remove(&id) {
                        self.finish(run, exit).await;
                    }
                    continue;
                }
                Ok(None) => {}
                Err(error) => tracing::warn!(lease = id, %error, "could not look at the replica"),
            }
            let Some(run) = self.runs.get_mut(&id) else { continue };
            if !run.stopping
                && let Some(at_ms) = run.lease.lease.preempt_at_us.map(|at| at / 1000)
                && now + self.config.grace.as_millis() as i64 >= at_ms
            {
                run.stopping = true;
                let grace = Duration::from_millis(u64::try_from(at_ms - now).unwrap_or(0));
                tracing::info!(
                    lease = id,
                    grace_ms = grace.as_millis() as u64,
                    "preempted: stopping the replica"
                );
                let executor = self.executor.clone();
                let handle = run.handle.clone();
                // The exit is noticed above like any other; the grace runs meanwhile.
                tokio::spawn(async move {
                    let _ = executor.stop(&handle, grace).await;
                });
            }
            if now - run.metered_to_ms >= self.config.usage_every.as_millis() as i64 {
                self.meter(id, now).await;
            }
            if self.pacer.ready() {
                self.ship_log(id).await;
                self.report_progress(id).await;
            }
        }
        self.save_runs();
    }
}

/// Restates what this start says of the registered node (`api::NodeRestatement`): a change of
/// name, place, domain, ports or runtimes, and of asks and limits when `policy_given`, reaches the
/// coordinator without registering again. A refusal (a bad value, named) stops the start; an
/// unreachable coordinator does not (the node runs on as the coordinator knows it).
async fn restate(
    client: &Client,
    key: &NodeKey,
    node_id: i64,
    registration: NodeRegistration,
    policy_given: bool,
) -> Result<(), AgentError> {
    let restatement = api::NodeRestatement {
        registration,
        policy_given,
    };
    match client.restate(key, node_id, &restatement).await {
        Ok(_) => Ok(()),
        Err(error) if error.is_transient() => {
            tracing::warn!(%error, "could not restate the node's facts; the coordinator keeps what it has");
            Ok(())
        }
        Err(ClientError::Refused { status: 404, .. }) => {
            // An old coordinator without the route, or a node it forgot.
            tracing::warn!("the coordinator does not take restated facts; it keeps what it has");
            Ok(())
        }
        Err(error) => Err(error.into()),
    }
}

/// Registers the node, asking again with backoff while the coordinator is unreachable, busy or
/// failing; a refusal (a bad key, a bad fact) is returned at once.
async fn register(
    client: &Client,
    provider_key: &str,
    registration: &NodeRegistration,
) -> Result<api::NodeView, AgentError> {
    let mut backoff = api::backoff::Backoff::agent(api::backoff::seed_from_clock(0));
    let mut attempt = 1;
    loop {
        match client.register(provider_key, registration).await {
            Ok(node) => return Ok(node),
            Err(error) if error.is_transient() && attempt < REGISTER_ATTEMPTS_MAX => {
                let wait = backoff.failed(error.retry_after());
                tracing::warn!(%error, attempt, wait_ms = wait.as_millis() as u64, "registration failed; asking again");
                tokio::time::sleep(wait).await;
                attempt += 1;
            }
            Err(error) => return Err(error.into()),
        }
    }
}

/// Makes a new key for the node registered in `data_dir` and has the coordinator take it, in a
/// request signed by the current key; the old key stops working. Run it while the agent is
/// stopped (a running agent keeps signing with the key it loaded). Returns the new public key.
/// `ca_certs`: trusted besides the system's roots (`AgentConfig::ca_certs`).
pub async fn rotate_key(
    data_dir: &std::path::Path,
    coordinator: &str,
    ca_certs: &[reqwest::Certificate],
) -> Result<String, AgentError> {
    let old = state::load_key(data_dir)?;
    let node = state::read_node(data_dir)?.ok_or_else(|| {
        AgentError::Config(format!(
            "{} has no registered node: start the agent once first",
            data_dir.display()
        ))
    })?;
    let new = NodeKey::generate();
    // On disk before the coordinator knows it, so no answer lost on the way leaves a node whose
    // only key is gone.
    state::write_pending_key(data_dir, &new)?;
    Client::trusting(coordinator, ca_certs)?
        .rotate_key(&old, node.node_id, &new)
        .await?;
    state::commit_pending_key(data_dir)?;
    tracing::info!(node = node.node_id, public_key = %new.public_hex(), "rotated the node's key");
    Ok(new.public_hex())
}
