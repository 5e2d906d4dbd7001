//! The agent's loop: register once, then heartbeat with telemetry, follow the lease set by
//! long-poll (versioned; heartbeat answers are not used for it), start replicas of new leases, stop those whose leases ended or moved to a newer
//! epoch, stop preempted ones in their grace period, meter usage into signed records, attest
//! each replica's end, and run the coordinator's canary orders at low priority.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use api::{AgentLease, CanaryOrder, HeartbeatRequest, LeaseEventRequest, NodeRegistration, PolicyDoc};
use tokio::sync::watch;
use trust::NodeKey;

use crate::client::{Client, ClientError, LeaseSet};
use crate::exec::{Executor, Exit, RunSpec};
use crate::gpu::Inventory;
use crate::guard::{Fence, Guards};
use crate::state::{self, NodeState, RunRecord};

/// How long a lease long-poll waits for a change.
pub const LEASE_POLL_WAIT_MS: u64 = 25_000;
/// How often the loop looks at its replicas (exits, usage, preemption times).
pub const TICK: Duration = Duration::from_millis(250);
/// The most bytes of a replica's output sent in one chunk.
pub const LOG_CHUNK_BYTES: usize = 48 * 1024;
/// How long a replica's end waits for the last of its output to reach its log file.
pub const LOG_SETTLE: Duration = Duration::from_millis(200);
/// How long the agent waits before asking again after the coordinator could not be reached.
pub const RETRY_AFTER: Duration = Duration::from_secs(1);
/// The longest a canary may run, whatever its deadline says.
pub const CANARY_RUN_MAX: Duration = Duration::from_secs(30 * 60);
/// How many times a canary's result is sent before it is dropped (the coordinator then finds
/// the canary unanswered).
pub const CANARY_REPORT_ATTEMPTS_MAX: u32 = 5;
/// Canary ids remembered as seen, so none runs twice; the oldest are forgotten first.
pub const CANARY_IDS_REMEMBERED_MAX: usize = 4_096;
/// The most canaries running at once (the coordinator orders one at a time).
pub const CANARIES_RUNNING_MAX: usize = 16;

/// What the agent is told at start.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    pub coordinator: String,
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
    /// The `fallow` binary, started as `PROGRAM agent guard ...` beside each replica to stop it
    /// when this agent stops vouching for it (`crate::guard`); `None` starts no guards.
    pub guard_program: Option<PathBuf>,
    /// The `fallow` binary, started as `PROGRAM canary run ...` for each canary order; `None`
    /// runs `crate::canary::run_canary` on a blocking thread of this process instead.
    pub canary_program: Option<PathBuf>,
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

/// The last complete `COUNT UNIT` line of a progress file.
///
/// Only the file's tail is read (a valid line is far shorter), since a replica may append to it
/// for its whole life and the agent looks every tick.
fn read_progress(path: &std::path::Path) -> Option<(i64, String)> {
    use std::io::{Read, Seek, SeekFrom};
    const TAIL_BYTES: u64 = 4096;
    let mut file = std::fs::File::open(path).ok()?;
    let length = file.metadata().ok()?.len();
    file.seek(SeekFrom::Start(length.saturating_sub(TAIL_BYTES))).ok()?;
    let mut bytes = Vec::with_capacity(TAIL_BYTES as usize);
    file.read_to_end(&mut bytes).ok()?;
    let text = String::from_utf8_lossy(&bytes);
    let complete = text.rsplit_once('\n').map_or("", |(lines, _)| lines);
    let line = complete.lines().rev().find(|line| !line.trim().is_empty())?;
    let (count, unit) = line.trim().split_once(char::is_whitespace)?;
    let count: i64 = count.parse().ok().filter(|count| *count >= 0)?;
    let unit = unit.trim();
    (!unit.is_empty() && unit.len() <= 32 && unit.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
        .then(|| (count, unit.to_string()))
}

/// Where shipping a replica's log to the coordinator starts, from the cursor kept beside the log
/// (`saved`) and the log's length now: on from the cursor when it is this epoch's (the lease
/// runs again here: the coordinator has that much, and the log file still holds the rest);
/// otherwise at the log's end, since what is in the file already is another epoch's, which the
/// coordinator has under that epoch.
fn resume_log(saved: Option<state::LogCursor>, epoch: i64, log_bytes: u64) -> state::LogCursor {
    match saved {
        Some(cursor) if cursor.epoch == epoch && cursor.sent <= cursor.sending && cursor.sending <= log_bytes => cursor,
        _ => state::LogCursor {
            epoch,
            sent: log_bytes,
            sending: log_bytes,
        },
    }
}

/// The line put in a lease's log where a replica left running by an agent that ended (killed,
/// crashed) is followed by the one its restart runs: the output the first wrote after its agent
/// ended, until the new agent stopped it, may not have reached the log (a container's output
/// is copied by the agent).
fn restart_marker(at_ms: i64) -> String {
    let seconds = at_ms.div_euclid(1000);
    let (year, month, day) = model::time::civil_from_days(seconds.div_euclid(86_400));
    let of_day = seconds.rem_euclid(86_400);
    format!(
        "--- agent restarted at {year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z; output between may be missing ---\n",
        of_day / 3600,
        of_day / 60 % 60,
        of_day % 60
    )
}

/// Appends `line` to the log at `path` on a line of its own.
fn append_to_log(path: &std::path::Path, line: &str) -> std::io::Result<()> {
    use std::io::{Read, Seek, SeekFrom, Write};
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .read(true)
        .append(true)
        .open(path)?;
    let length = file.metadata()?.len();
    let mut last = [0u8; 1];
    if length > 0 {
        file.seek(SeekFrom::Start(length - 1))?;
        file.read_exact(&mut last)?;
    }
    let text = if length > 0 && last[0] != b'\n' {
        format!("\n{line}")
    } else {
        line.to_string()
    };
    file.write_all(text.as_bytes())
}

/// The bytes of `path` from `offset` on, at most `max`, cut at a character boundary.
fn read_log(path: &std::path::Path, offset: u64, max: usize) -> Option<(String, u64)> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = std::fs::File::open(path).ok()?;
    file.seek(SeekFrom::Start(offset)).ok()?;
    let mut bytes = Vec::with_capacity(max);
    file.take(max as u64).read_to_end(&mut bytes).ok()?;
    if bytes.is_empty() {
        return None;
    }
    let valid = match std::str::from_utf8(&bytes) {
        Ok(_) => bytes.len(),
        // A character cut by the chunk's end waits for the next chunk; bytes that are not
        // UTF-8 at all are sent replaced.
        Err(error) if error.error_len().is_none() && error.valid_up_to() > 0 => error.valid_up_to(),
        Err(_) => bytes.len(),
    };
    bytes.truncate(valid);
    let text = String::from_utf8_lossy(&bytes).into_owned();
    Some((text, valid as u64))
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
    /// The last time the coordinator answered (a heartbeat or a lease poll).
    contact: tokio::sync::watch::Sender<tokio::time::Instant>,
    /// The coordinator's heartbeat timeout, from its last heartbeat answer.
    heartbeat_timeout: Option<Duration>,
    /// The replicas' guards, by lease id (none without `AgentConfig::guard_program`).
    guards: Guards,
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
}

/// The most usage records kept for a coordinator that cannot be reached (a day of one replica
/// metered every 10 s); older ones are dropped first.
const UNSENT_USAGE_MAX: usize = 8_640;

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis() as i64)
}

fn digest_of_file(path: &std::path::Path) -> String {
    let bytes = std::fs::read(path).unwrap_or_default();
    format!("blake3:{}", blake3::hash(&bytes).to_hex())
}

impl<E: Executor> Agent<E> {
    /// Loads or makes the node's key and registers the node if this data directory has not yet.
    pub async fn start(mut config: AgentConfig, inventory: Inventory, executor: E) -> Result<Agent<E>, AgentError> {
        // Replicas run in directories of their own: every path handed to them is absolute.
        std::fs::create_dir_all(&config.data_dir)?;
        config.data_dir = std::path::absolute(&config.data_dir)?;
        let (key, created) = state::load_or_create_key(&config.data_dir)?;
        if created {
            tracing::info!(
                path = %config.data_dir.join(state::KEY_FILE).display(),
                public_key = %key.public_hex(),
                "made the node's key (mode 0600)"
            );
        }
        let client = Client::new(&config.coordinator)?;
        let node_id = match state::read_node(&config.data_dir)? {
            Some(node) => node.node_id,
            None => {
                let provider_key = config.provider_key.as_deref().ok_or(AgentError::NoProviderKey)?;
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
                    nvlink_domain: format!("{}-board", config.name),
                    latitude: 0.0,
                    longitude: 0.0,
                    simulated: inventory.simulated,
                    policy: config.policy.clone(),
                    runtimes: executor.runtimes(),
                };
                let node = client.register(provider_key, &registration).await?;
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
        let datasets = crate::datasets::DatasetCache::new(config.data_dir.join("datasets"), config.allow_file_datasets);
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
            wanted: Vec::new(),
            launch_waiting: false,
            ended: std::collections::HashSet::new(),
            left_running: std::collections::HashSet::new(),
            contact: tokio::sync::watch::Sender::new(tokio::time::Instant::now()),
            unsent: std::collections::VecDeque::new(),
            tended_ms: 0,
            heartbeat_timeout: None,
            guards: Guards::default(),
            canaries: HashMap::new(),
            canaries_seen: std::collections::VecDeque::new(),
            canaries_seen_set: std::collections::HashSet::new(),
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
            Client::new(&self.config.coordinator)?,
            NodeKey::from_hex(&self.key.to_hex()).map_err(|error| AgentError::Config(error.to_string()))?,
            self.node_id,
            sets,
            self.contact.clone(),
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
                    match self.client.heartbeat(&self.key, self.node_id, &beat).await {
                        Ok(answer) => {
                            self.contact.send_replace(tokio::time::Instant::now());
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
                            self.start_canaries(answer.canaries);
                        }
                        Err(error) => tracing::warn!(%error, "heartbeat failed"),
                    }
                    next_heartbeat = tokio::time::Instant::now() + heartbeat_every;
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

    /// The leases a heartbeat says this node holds: those it runs or is about to run (every
    /// lease of the coordinator's set it follows), stops, or has not yet seen the end of taken.
    /// A running lease missing here, with no attestation, was dropped (docs/trust-policy.md § 5).
    fn held_leases(&self) -> Vec<i64> {
        let mut held: Vec<i64> = self
            .wanted
            .iter()
            .map(|lease| lease.lease.id)
            .chain(self.runs.keys().copied())
            .chain(self.stopping.keys().copied())
            .chain(self.ended.iter().map(|(lease, _)| *lease))
            .collect();
        held.sort_unstable();
        held.dedup();
        held
    }

    /// Whether the coordinator has been silent for the fence: replicas stop, and none starts
    /// until it answers again.
    fn cut_off(&self) -> bool {
        self.fence()
            .is_some_and(|fence| self.contact.borrow().elapsed() >= fence.fence)
    }

    /// Makes what runs match the coordinator's lease set.
    async fn reconcile(&mut self, leases: &[AgentLease]) {
        let wanted: HashMap<i64, &AgentLease> = leases.iter().map(|lease| (lease.lease.id, lease)).collect();
        // Leases that ended, or moved to a newer epoch (fenced): stop what runs for them.
        let ended: Vec<i64> = self
            .runs
            .iter()
            .filter(|(id, run)| {
                wanted
                    .get(id)
                    .is_none_or(|lease| lease.lease.epoch != run.lease.lease.epoch)
            })
            .map(|(id, _)| *id)
            .collect();
        for id in ended {
            if let Some(run) = self.runs.remove(&id) {
                tracing::info!(lease = id, "the lease ended or moved on; stopping its replica");
                self.stop_in_background(run, self.config.grace);
            }
        }
        self.wanted = leases.to_vec();
        self.launch_waiting = false;
        // Once the coordinator no longer lists a lease, it need not be remembered as ended.
        let listed: std::collections::HashSet<(i64, i64)> =
            leases.iter().map(|lease| (lease.lease.id, lease.lease.epoch)).collect();
        self.ended.retain(|lease| listed.contains(lease));
        self.left_running.retain(|lease| listed.contains(lease));
        // GPUs still held: by running replicas (a preempted one in its grace period among them)
        // and by replicas being stopped. A new lease on them waits until they are free.
        let mut busy: Vec<u8> = self
            .runs
            .values()
            .flat_map(|run| run.lease.lease.gpu_indices.iter().copied())
            .chain(self.stopping.values().flat_map(|(gpus, _)| gpus.iter().copied()))
            .collect();
        for lease in leases {
            let id = lease.lease.id;
            if let Some(run) = self.runs.get_mut(&id) {
                run.lease = lease.clone();
                continue;
            }
            if !matches!(lease.lease.state.as_str(), "pending" | "staging" | "running")
                || self.ended.contains(&(id, lease.lease.epoch))
            {
                continue;
            }
            if self.stopping.contains_key(&id) || lease.lease.gpu_indices.iter().any(|gpu| busy.contains(gpu)) {
                self.launch_waiting = true;
                continue;
            }
            if self.config.guard_program.is_some() && self.fence().is_none() {
                // A guard needs the fence time, which the first heartbeat answer brings.
                self.launch_waiting = true;
                continue;
            }
            if self.cut_off() {
                // A replica stopped at the fence starts again once the coordinator answers and
                // still lists its lease.
                self.launch_waiting = true;
                continue;
            }
            busy.extend(lease.lease.gpu_indices.iter().copied());
            self.stop_canaries_on(&lease.lease.gpu_indices);
            self.launch(lease).await;
        }
        self.save_runs();
    }

    async fn report(
        &self,
        lease: &AgentLease,
        state: &str,
        exit_code: Option<i64>,
        detail: &str,
    ) -> Result<(), ClientError> {
        let event = LeaseEventRequest {
            epoch: lease.lease.epoch,
            state: state.to_string(),
            exit_code,
            detail: detail.chars().take(128).collect::<String>().replace(['\n', '\r'], " "),
        };
        self.client.event(&self.key, self.node_id, lease.lease.id, &event).await
    }

    async fn launch(&mut self, lease: &AgentLease) {
        let id = lease.lease.id;
        let lease_dir = self.config.data_dir.join("leases").join(id.to_string());
        let job = &lease.job;
        let spec = RunSpec {
            lease_id: id,
            epoch: lease.lease.epoch,
            image: job.image.clone(),
            command: job.command.clone(),
            env: job.env.clone(),
            gpu_indices: lease.lease.gpu_indices.clone(),
            memory_mib: u64::try_from(lease.lease.memory_mib).unwrap_or(0),
            cpu_milli: u32::try_from(lease.lease.cpu_milli).unwrap_or(0),
            network: job.network.clone(),
            scratch_dir: lease_dir.join("scratch"),
            checkpoint_dir: job.checkpoint_dir.as_ref().map(|_| {
                self.config
                    .data_dir
                    .join("checkpoints")
                    .join(lease.lease.job_id.to_string())
            }),
            log_path: lease_dir.join("output.log"),
            datasets_dir: (!job.datasets.is_empty()).then(|| self.datasets.dir().to_path_buf()),
            runtime: job.runtime.clone(),
        };
        if let Err(error) = self.report(lease, "staging", None, "").await {
            tracing::warn!(lease = id, %error, "could not report staging; not starting");
            if !matches!(error, ClientError::Refused { .. }) {
                // The coordinator could not be reached: try again.
                self.launch_waiting = true;
            }
            return;
        }
        for dataset in &job.datasets {
            if let Err(error) = self.datasets.fetch(&self.http, dataset).await {
                tracing::warn!(lease = id, %error, "a dataset could not be staged");
                self.ended.insert((id, lease.lease.epoch));
                if let Err(report) = self.report(lease, "failed", None, &error.to_string()).await {
                    tracing::warn!(lease = id, error = %report, "could not report the failure");
                }
                return;
            }
        }
        let log = self.resume_log_of(&spec);
        match self.executor.start(&spec).await {
            Ok(handle) => {
                if let Err(error) = self.start_guard(id, &handle) {
                    tracing::error!(lease = id, %error, "the replica's guard did not start; stopping the replica");
                    let _ = self.executor.stop(&handle, Duration::ZERO).await;
                    self.executor.clean_up(&spec).await;
                    let reason = format!("the node could not guard the replica: {error}");
                    if let Err(report) = self.report(lease, "failed", None, &reason).await {
                        tracing::warn!(lease = id, error = %report, "could not report the failure");
                    }
                    return;
                }
                let now = now_ms();
                let gpu_milli = lease.lease.gpu_indices.len() as i64 * lease.lease.gpu_milli;
                if let Err(error) = self.report(lease, "running", None, "").await {
                    tracing::warn!(lease = id, %error, "could not report running");
                }
                tracing::info!(lease = id, job = lease.lease.job_id, "replica started");
                self.runs.insert(
                    id,
                    Run {
                        lease: lease.clone(),
                        spec,
                        handle,
                        started_ms: now,
                        metered_to_ms: now,
                        // Past every sequence an earlier run of this lease used (a replica
                        // started again after a fence, or by a restarted agent): records are
                        // taken once per (lease, sequence), and one fewer than a millisecond
                        // apart never catches up with the clock.
                        sequence: now,
                        gpu_seconds_milli: 0,
                        gpu_milli,
                        stopping: false,
                        log,
                        progress_sent: None,
                        utilisation_sum_permille: 0,
                        utilisation_samples: 0,
                    },
                );
            }
            Err(error) => {
                tracing::warn!(lease = id, %error, "the replica did not start");
                if let Err(report) = self.report(lease, "failed", None, &error.to_string()).await {
                    tracing::warn!(lease = id, error = %report, "could not report the failure");
                }
                self.executor.clean_up(&spec).await;
            }
        }
    }

    /// Starts the guard of replica `id` when the agent has a guard program.
    fn start_guard(&self, id: i64, handle: &E::Handle) -> std::io::Result<()> {
        let Some(program) = &self.config.guard_program else {
            return Ok(());
        };
        let fence = self
            .fence()
            .ok_or_else(|| std::io::Error::other("the coordinator's heartbeat timeout is not known yet"))?;
        self.guards.start(id, program, self.executor.as_ref(), handle, fence)
    }

    /// How long the agent (and each guard) lets a replica run without word from the coordinator:
    /// half its heartbeat timeout, with at most a quarter of it as grace, so the replica is gone
    /// before the coordinator moves its lease a whole timeout after the node's last heartbeat.
    /// `None` before the first heartbeat answer.
    fn fence(&self) -> Option<Fence> {
        let timeout = self.heartbeat_timeout?;
        let fence = timeout / 2;
        Some(Fence {
            fence,
            first: fence.saturating_sub(self.contact.borrow().elapsed()),
            grace: self.config.grace.min(timeout / 4),
        })
    }

    /// Stops a replica in the background; its guard is ended once it is stopped (it keeps
    /// watching meanwhile).
    fn stop_in_background(&mut self, run: Run<E::Handle>, grace: Duration) {
        let executor = self.executor.clone();
        let guards = self.guards.clone();
        let id = run.lease.lease.id;
        let gpus = run.lease.lease.gpu_indices.clone();
        self.stopping.insert(
            id,
            (
                gpus,
                tokio::spawn(async move {
                    let exit = executor.stop(&run.handle, grace).await.ok();
                    guards.end(id).await;
                    executor.clean_up(&run.spec).await;
                    exit
                }),
            ),
        );
    }

    /// Stops every replica when the coordinator has not answered for half its heartbeat
    /// timeout: by the time it finds the node silent and moves the leases elsewhere (a whole
    /// timeout), they are gone, so no lease runs twice at once. Their leases stay as the
    /// coordinator has them; if it still lists them when contact returns, they run again.
    fn fence_if_cut_off(&mut self) {
        let Some(fence) = self.fence() else { return };
        if self.runs.is_empty() || self.contact.borrow().elapsed() < fence.fence {
            return;
        }
        let grace = fence.grace;
        tracing::warn!(
            replicas = self.runs.len(),
            "the coordinator has not answered for half the heartbeat timeout; stopping every replica"
        );
        let ids: Vec<i64> = self.runs.keys().copied().collect();
        // Metered to a fence after the last contact, not to now: the guards stop the replicas
        // then, and this loop may notice late (a request to the unreachable coordinator held it).
        let fenced_at = now_ms() - self.contact.borrow().elapsed().as_millis() as i64 + fence.fence.as_millis() as i64;
        for id in ids {
            self.meter_for_later(id, fenced_at);
            if let Some(run) = self.runs.remove(&id) {
                self.stop_in_background(run, grace);
            }
        }
        self.launch_waiting = true;
    }

    /// Takes the replicas whose guard stopped them (this agent was frozen, or slow to hear from
    /// the coordinator) as fenced: stopped without an attestation, their leases left as the
    /// coordinator has them, like `fence_if_cut_off`.
    fn take_guarded_stops(&mut self) {
        let Some(fence) = self.fence() else { return };
        // Metered up to when the guard stopped it (this agent may have been frozen much longer
        // since); without its word, at most a fence after this agent last looked.
        let fenced_at = self.tended_ms + fence.fence.as_millis() as i64;
        for id in self.guards.fired() {
            self.meter_for_later(id, self.guards.fired_at(id).unwrap_or(fenced_at));
            if let Some(run) = self.runs.remove(&id) {
                tracing::warn!(lease = id, "the replica's guard stopped it; leaving its lease as it is");
                self.stop_in_background(run, fence.grace);
                self.launch_waiting = true;
            }
        }
    }

    /// Meters usage, notices ends, and starts the grace period of preempted replicas.
    async fn tend(&mut self) {
        self.fence_if_cut_off();
        self.take_guarded_stops();
        self.tended_ms = now_ms();
        if !self.unsent.is_empty()
            && self
                .fence()
                .is_none_or(|fence| self.contact.borrow().elapsed() < fence.fence)
        {
            self.send_unsent_usage().await;
        }
        self.stopping.retain(|_, (_, task)| !task.is_finished());
        self.canaries.retain(|_, (_, task)| !task.is_finished());
        if self.launch_waiting {
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
            self.ship_log(id).await;
            self.report_progress(id).await;
        }
        self.save_runs();
    }

    /// Starts the canary orders not seen before. An order whose GPUs a replica holds, or whose
    /// deadline passed, is dropped unreported: canaries give way to work, and the coordinator
    /// orders another later.
    fn start_canaries(&mut self, orders: Vec<CanaryOrder>) {
        for order in orders {
            if !self.canaries_seen_set.insert(order.id) {
                continue;
            }
            self.canaries_seen.push_back(order.id);
            if self.canaries_seen.len() > CANARY_IDS_REMEMBERED_MAX
                && let Some(forgotten) = self.canaries_seen.pop_front()
            {
                self.canaries_seen_set.remove(&forgotten);
            }
            let busy = self
                .runs
                .values()
                .flat_map(|run| run.lease.lease.gpu_indices.iter())
                .chain(self.stopping.values().flat_map(|(gpus, _)| gpus.iter()))
                .chain(self.canaries.values().flat_map(|(running, _)| running.gpus.iter()))
                .any(|gpu| order.gpus.contains(gpu));
            let run_for = Duration::from_millis(u64::try_from(order.deadline_ms - now_ms()).unwrap_or(0));
            let why_not = if busy {
                Some("its GPUs are busy")
            } else if run_for.is_zero() {
                Some("its deadline has passed")
            } else if self.canaries.len() >= CANARIES_RUNNING_MAX {
                Some("too many canaries run already")
            } else {
                None
            };
            if let Some(why_not) = why_not {
                tracing::info!(canary = order.id, why_not, "not running a canary");
                continue;
            }
            tracing::info!(canary = order.id, units = order.units, gpus = ?order.gpus, "running a canary");
            let task = tokio::spawn(run_and_report_canary(
                order.clone(),
                self.config.canary_program.clone(),
                self.inventory.simulated_device.clone(),
                run_for.min(CANARY_RUN_MAX),
                self.client.clone(),
                self.key.clone(),
                self.node_id,
            ));
            self.canaries.insert(order.id, (order, task));
        }
    }

    /// Stops the canaries running on any of `gpus` (a lease needs them), unreported.
    fn stop_canaries_on(&mut self, gpus: &[u8]) {
        self.canaries.retain(|id, (order, task)| {
            let in_the_way = order.gpus.iter().any(|gpu| gpus.contains(gpu)) && !task.is_finished();
            if in_the_way {
                tracing::info!(canary = id, "a lease needs the canary's GPUs; stopping it unreported");
                // Dropping the run kills its child process (`kill_on_drop`).
                task.abort();
            }
            !in_the_way
        });
    }

    /// Reports replica `id`'s progress when its progress file says something new.
    async fn report_progress(&mut self, id: i64) {
        let Some(run) = self.runs.get(&id) else { return };
        let path = run.spec.scratch_dir.join(crate::exec::PROGRESS_FILE);
        let Some(progress) = read_progress(&path) else { return };
        if run.progress_sent.as_ref() == Some(&progress) {
            return;
        }
        let request = api::ProgressRequest {
            epoch: run.lease.lease.epoch,
            unit: progress.1.clone(),
            done: progress.0,
        };
        match self.client.progress(&self.key, self.node_id, id, &request).await {
            Ok(()) => {
                if let Some(run) = self.runs.get_mut(&id) {
                    run.progress_sent = Some(progress);
                }
            }
            Err(error) => tracing::warn!(lease = id, %error, "progress was not taken"),
        }
    }

    /// Where shipping the log of a replica about to start begins (`resume_log`); when an
    /// earlier run of this agent left this lease's replica running, a line in the log says that
    /// output may be missing before the new replica's.
    fn resume_log_of(&mut self, spec: &RunSpec) -> state::LogCursor {
        let saved = state::read_log_cursor(&spec.log_path).unwrap_or_else(|error| {
            tracing::warn!(lease = spec.lease_id, %error, "the log's cursor cannot be read; sending from the log's end");
            None
        });
        let log_bytes = std::fs::metadata(&spec.log_path).map_or(0, |metadata| metadata.len());
        let cursor = resume_log(saved, spec.epoch, log_bytes);
        if saved != Some(cursor) {
            // A new start, kept before the replica writes: output it writes before its first
            // chunk is sent is sent by a restarted agent too.
            let kept = spec
                .log_path
                .parent()
                .map_or(Ok(()), std::fs::create_dir_all)
                .and_then(|()| state::write_log_cursor(&spec.log_path, &cursor));
            if let Err(error) = kept {
                tracing::warn!(lease = spec.lease_id, %error, "could not keep the log's cursor");
            }
        }
        if self.left_running.remove(&(spec.lease_id, spec.epoch))
            && let Err(error) = append_to_log(&spec.log_path, &restart_marker(now_ms()))
        {
            tracing::warn!(lease = spec.lease_id, %error, "could not mark the restart in the log");
        }
        cursor
    }

    /// Sends what replica `id` wrote to its log since the last chunk; true when it sent some.
    async fn ship_log(&mut self, id: i64) -> bool {
        let Some(run) = self.runs.get_mut(&id) else {
            return false;
        };
        let cursor = &mut run.log;
        // A chunk sent before without an answer goes again exactly as it was.
        let chunk_bytes_max = if cursor.sending > cursor.sent {
            usize::try_from(cursor.sending - cursor.sent).unwrap_or(LOG_CHUNK_BYTES)
        } else {
            LOG_CHUNK_BYTES
        };
        let Some((text, bytes)) = read_log(&run.spec.log_path, cursor.sent, chunk_bytes_max) else {
            return false;
        };
        if cursor.sending != cursor.sent + bytes {
            // On disk before it is sent: a restarted agent sends this chunk again, the same.
            cursor.sending = cursor.sent + bytes;
            if let Err(error) = state::write_log_cursor(&run.spec.log_path, cursor) {
                tracing::warn!(lease = id, %error, "could not keep the log's cursor");
            }
        }
        let chunk = api::LogChunkRequest {
            epoch: run.lease.lease.epoch,
            byte_offset: i64::try_from(cursor.sent).unwrap_or(i64::MAX),
            text,
        };
        match self.client.log(&self.key, self.node_id, id, &chunk).await {
            Ok(_) => {
                // Kept on disk with the next chunk: until then a restarted agent sends this one
                // again, which the coordinator takes as a repeat.
                run.log.sent = run.log.sending;
                true
            }
            Err(error) => {
                tracing::warn!(lease = id, %error, "a chunk of output was not taken");
                false
            }
        }
    }

    /// Sends the usage of replica `id` from where metering stopped to `now_ms`; kept to send
    /// again if the coordinator cannot be reached.
    async fn meter(&mut self, id: i64, now: i64) {
        let Some(record) = self.usage_record(id, now) else {
            return;
        };
        self.send_usage(record).await;
    }

    /// Sends a usage record; one the coordinator could not be reached for waits in `unsent`.
    /// Returns false when it could not be reached.
    async fn send_usage(&mut self, record: trust::UsageRecord) -> bool {
        match self.client.usage(&self.key, self.node_id, &record).await {
            Ok(_) => true,
            Err(error @ ClientError::Refused { .. }) => {
                tracing::warn!(lease = record.lease_id, %error, "a usage record was refused");
                true
            }
            Err(error) => {
                tracing::warn!(lease = record.lease_id, %error, "a usage record waits to be sent again");
                if self.unsent.len() >= UNSENT_USAGE_MAX {
                    self.unsent.pop_front();
                }
                self.unsent.push_back(record);
                false
            }
        }
    }

    /// Sends the usage records that waited for the coordinator, oldest first, while it answers.
    async fn send_unsent_usage(&mut self) {
        while let Some(record) = self.unsent.pop_front() {
            let sequence = record.sequence;
            if !self.send_usage(record).await {
                // Put back in front, where it was (`send_usage` queued it last).
                if let Some(record) = self.unsent.pop_back() {
                    debug_assert_eq!(record.sequence, sequence);
                    self.unsent.push_front(record);
                }
                return;
            }
        }
    }

    /// Signs nothing yet: the usage of replica `id` from where metering stopped to `now`, and
    /// metering moves there.
    fn usage_record(&mut self, id: i64, now: i64) -> Option<trust::UsageRecord> {
        let run = self.runs.get_mut(&id)?;
        let period_ms = now - run.metered_to_ms;
        if period_ms <= 0 {
            return None;
        }
        let gpu_seconds_milli = run.gpu_milli * period_ms / 1000;
        run.sequence += 1;
        let utilisation_permille = if run.utilisation_samples > 0 {
            run.utilisation_sum_permille / run.utilisation_samples
        } else {
            self.inventory.utilisation_permille(&run.lease.lease.gpu_indices)
        };
        (run.utilisation_sum_permille, run.utilisation_samples) = (0, 0);
        let record = trust::UsageRecord {
            lease_id: id,
            epoch: run.lease.lease.epoch,
            sequence: run.sequence,
            period_start_ms: run.metered_to_ms,
            period_end_ms: now,
            gpu_seconds_milli,
            gpu_utilisation_permille: utilisation_permille,
            telemetry_digest: format!(
                "blake3:{}",
                blake3::hash(
                    serde_json::to_string(&self.inventory.telemetry())
                        .unwrap_or_default()
                        .as_bytes()
                )
                .to_hex()
            ),
        };
        run.metered_to_ms = now;
        run.gpu_seconds_milli += gpu_seconds_milli;
        Some(record)
    }

    /// Meters replica `id` up to `until_ms` and keeps the record for when the coordinator
    /// answers again: it is being stopped because the coordinator cannot be heard.
    fn meter_for_later(&mut self, id: i64, until_ms: i64) {
        if let Some(record) = self.usage_record(id, until_ms.min(now_ms())) {
            if self.unsent.len() >= UNSENT_USAGE_MAX {
                self.unsent.pop_front();
            }
            self.unsent.push_back(record);
        }
    }

    /// A replica ended on its own (or in its grace period): its last usage, then the
    /// attestation, which ends the lease as finished (exit 0) or failed; a preempted replica
    /// that did not finish its work is left for the coordinator to end as preempted.
    async fn finish(&mut self, run: Run<E::Handle>, exit: Exit) {
        let id = run.lease.lease.id;
        // The replica ended on its own: its guard has nothing left to stop.
        self.guards.end(id).await;
        let now = now_ms();
        self.runs.insert(id, run);
        self.meter(id, now).await;
        // The last of the output may still be on its way to the log file (Docker's stream).
        tokio::time::sleep(LOG_SETTLE).await;
        while self.ship_log(id).await {}
        self.report_progress(id).await;
        let Some(run) = self.runs.remove(&id) else { return };
        self.ended.insert((id, run.lease.lease.epoch));
        if run.stopping {
            // Stopped for a preemption, whatever its exit code: the coordinator ends the lease as
            // preempted at its `preempt_at` and queues the job again. An attestation now would end
            // the job (finished on 0, failed otherwise) although its work was cut short.
            tracing::info!(lease = id, exit = exit.code, "preempted replica stopped; not attested");
            self.executor.clean_up(&run.spec).await;
            self.save_runs();
            return;
        }
        let attestation = trust::Attestation {
            lease_id: id,
            epoch: run.lease.lease.epoch,
            image_digest: self.executor.image_digest(&run.handle),
            start_ms: run.started_ms,
            end_ms: run.metered_to_ms,
            exit_code: exit.code,
            gpu_seconds_milli: run.gpu_seconds_milli,
            telemetry_digest: String::new(),
            log_digest: digest_of_file(&run.spec.log_path),
        };
        match self.client.attest(&self.key, self.node_id, &attestation).await {
            Ok(()) => tracing::info!(lease = id, exit = exit.code, "replica ended; attested"),
            Err(error) if error.is_conflict() => {
                tracing::info!(lease = id, %error, "replica ended after its lease did");
            }
            Err(error) => tracing::warn!(lease = id, %error, "the attestation was refused"),
        }
        self.executor.clean_up(&run.spec).await;
        self.save_runs();
    }
}

/// Makes a new key for the node registered in `data_dir` and has the coordinator take it, in a
/// request signed by the current key; the old key stops working. Run it while the agent is
/// stopped (a running agent keeps signing with the key it loaded). Returns the new public key.
pub async fn rotate_key(data_dir: &std::path::Path, coordinator: &str) -> Result<String, AgentError> {
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
    Client::new(coordinator)?.rotate_key(&old, node.node_id, &new).await?;
    state::commit_pending_key(data_dir)?;
    tracing::info!(node = node.node_id, public_key = %new.public_hex(), "rotated the node's key");
    Ok(new.public_hex())
}

/// Runs a canary (the `fallow canary run` child, or in this process without a program), then
/// hands its result to a task of its own to report. Aborting this task before the run ends
/// kills the child and reports nothing.
async fn run_and_report_canary(
    order: CanaryOrder,
    program: Option<PathBuf>,
    simulated_device: Option<String>,
    run_for: Duration,
    client: Arc<Client>,
    key: Arc<NodeKey>,
    node_id: i64,
) {
    let id = order.id;
    let ran = tokio::time::timeout(run_for, run_canary(&order, program, simulated_device)).await;
    let output = match ran {
        Ok(Ok(output)) => output,
        Ok(Err(error)) => {
            tracing::warn!(canary = id, %error, "the canary failed to run; not reporting it");
            return;
        }
        Err(_) => {
            tracing::warn!(canary = id, "the canary ran past its deadline; stopped, not reported");
            return;
        }
    };
    let result = crate::canary::result_of(&order, &output);
    tokio::spawn(report_canary(result, client, key, node_id));
}

/// Runs one canary order and reads what it measured.
async fn run_canary(
    order: &CanaryOrder,
    program: Option<PathBuf>,
    simulated_device: Option<String>,
) -> Result<crate::canary::CanaryOutput, String> {
    let Some(program) = program else {
        let work = crate::canary::CanaryWork {
            seed: order.seed.clone(),
            units: order.units,
            gpus: order.gpus.clone(),
            memory_mib: order.memory_mib,
        };
        let device = simulated_device.map_or(crate::canary::CanaryDevice::Cpu, crate::canary::CanaryDevice::Simulated);
        /// Tells the run to stop when this future is dropped (the canary's task aborted).
        struct StopOnDrop(Arc<std::sync::atomic::AtomicBool>);
        impl Drop for StopOnDrop {
            fn drop(&mut self) {
                self.0.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
        let stop = StopOnDrop(Arc::new(std::sync::atomic::AtomicBool::new(false)));
        let stop_flag = stop.0.clone();
        let ran =
            tokio::task::spawn_blocking(move || crate::canary::run_canary_until(&work, &device, &stop_flag)).await;
        drop(stop);
        return ran
            .map_err(|error| error.to_string())?
            .map_err(|error| error.to_string());
    };
    let gpus = order.gpus.iter().map(u8::to_string).collect::<Vec<_>>().join(",");
    let mut command = tokio::process::Command::new(&program);
    command
        .args(["canary", "run", "--seed", &order.seed])
        .args(["--units", &order.units.to_string()])
        .args(["--gpus", &gpus])
        .args(["--memory-mib", &order.memory_mib.to_string()])
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    match &simulated_device {
        Some(model) => command.env(crate::canary::SIMULATED_GPU_ENV, model),
        None => command.env_remove(crate::canary::SIMULATED_GPU_ENV),
    };
    let output = command
        .output()
        .await
        .map_err(|error| format!("{}: {error}", program.display()))?;
    if !output.status.success() {
        return Err(format!(
            "{} canary run: {}: {}",
            program.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout.lines().rev().find(|line| !line.trim().is_empty()).unwrap_or("");
    serde_json::from_str(line).map_err(|error| format!("the canary's output {line:?}: {error}"))
}

/// Sends a canary's signed result, again after a failure the coordinator may recover from; a
/// refusal (4xx) is logged and dropped.
async fn report_canary(result: trust::canary::CanaryResult, client: Arc<Client>, key: Arc<NodeKey>, node_id: i64) {
    let id = result.canary_id;
    for attempt in 1..=CANARY_REPORT_ATTEMPTS_MAX {
        match client.canary_result(&key, node_id, &result).await {
            Ok(finding) => {
                tracing::info!(canary = id, %finding, rate_milli = result.rate_milli, "canary reported");
                return;
            }
            Err(ClientError::Refused { status, message }) if (400..500).contains(&status) => {
                tracing::warn!(canary = id, status, %message, "the canary's result was refused");
                return;
            }
            Err(error @ ClientError::BadAnswer(_)) => {
                // It was taken; sending it again would only be refused as a duplicate.
                tracing::warn!(canary = id, %error, "the canary's result was taken, its finding not read");
                return;
            }
            Err(error) => {
                tracing::warn!(canary = id, attempt, %error, "the canary's result waits to be sent again");
                tokio::time::sleep(RETRY_AFTER * attempt).await;
            }
        }
    }
    tracing::warn!(canary = id, "the canary's result could not be sent; dropped");
}

/// Writes a byte to every guard each time the agent hears from the coordinator, until the agent
/// is gone.
async fn feed_guards(mut contact: watch::Receiver<tokio::time::Instant>, guards: Guards) {
    while contact.changed().await.is_ok() {
        guards.feed();
    }
}

/// Follows the lease set by long-poll and publishes each new one.
async fn poll_leases(
    client: Client,
    key: NodeKey,
    node_id: i64,
    sets: watch::Sender<Option<LeaseSet>>,
    contact: watch::Sender<tokio::time::Instant>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut known: Option<String> = None;
    loop {
        let asked = client.leases(&key, node_id, LEASE_POLL_WAIT_MS, known.as_deref());
        let answer = tokio::select! {
            answer = asked => answer,
            _ = shutdown.changed() => return,
        };
        match answer {
            Ok(set) => {
                contact.send_replace(tokio::time::Instant::now());
                if known.as_deref() != Some(set.version.as_str()) {
                    known = Some(set.version.clone());
                    let _ = sets.send(Some(set));
                }
            }
            Err(error) => {
                tracing::warn!(%error, "lease poll failed; asking again shortly");
                tokio::select! {
                    () = tokio::time::sleep(RETRY_AFTER) => {}
                    _ = shutdown.changed() => return,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_complete_progress_line_counts() {
        let path = std::env::temp_dir().join(format!("fallow-progress-{}", std::process::id()));
        let read = |text: &str| {
            std::fs::write(&path, text).unwrap();
            read_progress(&path)
        };
        assert_eq!(read("100 tokens\n250 tokens\n"), Some((250, "tokens".into())));
        assert_eq!(
            read("100 tokens\n25"),
            Some((100, "tokens".into())),
            "a line being written waits"
        );
        assert_eq!(read("7 samples\n\n"), Some((7, "samples".into())));
        assert_eq!(read("-3 tokens\n"), None);
        assert_eq!(read("12 to kens\n"), None);
        assert_eq!(read("lots tokens\n"), None);
        assert_eq!(read(""), None);
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn a_log_is_shipped_on_from_where_the_coordinator_has_it() {
        let cursor = |epoch, sent, sending| state::LogCursor { epoch, sent, sending };
        for (saved, log_bytes, expect, why) in [
            (None, 0, cursor(2, 0, 0), "a first run sends from the start"),
            (
                Some(cursor(2, 40, 40)),
                90,
                cursor(2, 40, 40),
                "the same epoch again: on from what the coordinator has",
            ),
            (
                Some(cursor(2, 40, 64)),
                90,
                cursor(2, 40, 64),
                "a chunk sent without an answer goes again as it was",
            ),
            (
                Some(cursor(1, 40, 40)),
                90,
                cursor(2, 90, 90),
                "another epoch's output stays unsent",
            ),
            (
                None,
                90,
                cursor(2, 90, 90),
                "output no cursor accounts for is not sent under this epoch",
            ),
            (Some(cursor(2, 40, 64)), 10, cursor(2, 10, 10), "a log cut short"),
        ] {
            assert_eq!(resume_log(saved, 2, log_bytes), expect, "{why}");
        }
    }

    #[test]
    fn a_restart_is_marked_on_a_line_of_its_own_and_resent_chunks_are_the_same() {
        assert_eq!(
            restart_marker(1_764_424_987_250),
            "--- agent restarted at 2025-11-29T14:03:07Z; output between may be missing ---\n"
        );
        let path = std::env::temp_dir().join(format!("fallow-log-marker-{}", std::process::id()));
        std::fs::write(&path, "one\ntw").unwrap();
        append_to_log(&path, "--- mark ---\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "one\ntw\n--- mark ---\n");
        append_to_log(&path, "--- again ---\n").unwrap();
        assert!(
            std::fs::read_to_string(&path)
                .unwrap()
                .ends_with("---\n--- again ---\n")
        );

        // A chunk read again up to where it ended is the same chunk, though the log grew.
        std::fs::write(&path, "héllo\n").unwrap();
        let (first, bytes) = read_log(&path, 0, 2).unwrap();
        assert_eq!((first.as_str(), bytes), ("h", 1), "a character cut by the chunk waits");
        std::fs::write(&path, "héllo\nmore output\n").unwrap();
        assert_eq!(read_log(&path, 0, 1).unwrap(), (first, bytes));
        let _ = std::fs::remove_file(&path);
    }
}
