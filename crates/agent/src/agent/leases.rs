//! Following the lease set: the long-poll that brings it (versioned; heartbeat answers are not
//! used for it), starting replicas of new leases, stopping those whose leases ended or moved to
//! a newer epoch, fencing every replica when the coordinator falls silent (and the guards that do
//! so for a frozen agent), and attesting each replica's end, never a preempted one's.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use api::{AgentLease, LeaseEventRequest};
use tokio::sync::watch;
use trust::NodeKey;

use super::{Agent, LOG_SETTLE, Run, now_ms};
use crate::client::{Client, ClientError, LeaseSet};
use crate::exec::{Executor, Exit, RunSpec};
use crate::gpu_clear::GpuClearing;
use crate::guard::{Fence, Guards};
use crate::scratch::Scratch;

/// How long a lease long-poll waits for a change.
pub const LEASE_POLL_WAIT_MS: u64 = 25_000;

/// The directory, in a lease's, holding the job's datasets for its replica (links into the
/// cache): `FALLOW_DATASETS_DIR` there, `/datasets` in a container.
const DATASETS_DIR: &str = "datasets";

impl<E: Executor> Agent<E> {
    /// The leases a heartbeat says this node holds: those it runs or is about to run (every
    /// lease of the coordinator's set it follows), stops, or has not yet seen the end of taken.
    /// A running lease missing here, with no attestation, was dropped (docs/trust-policy.md § 5).
    pub(super) fn held_leases(&self) -> Vec<i64> {
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
    pub(super) async fn reconcile(&mut self, leases: &[AgentLease]) {
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
        // A staged replica whose lease ended or moved on waits for nothing; its view of its
        // datasets goes (nothing else of it exists yet).
        self.staged.retain(|id, staged| {
            let keep = listed.contains(&(*id, staged.epoch));
            if !keep && let Some(dir) = &staged.spec.datasets_dir {
                let _ = std::fs::remove_dir_all(dir);
            }
            keep
        });
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
                let moved = lease
                    .gang
                    .as_ref()
                    .filter(|gang| run.lease.gang.as_ref().is_some_and(|before| before.epoch != gang.epoch));
                let moved = moved.cloned();
                run.lease = lease.clone();
                if let Some(gang) = moved {
                    self.gang_moved(id, &gang);
                }
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
            if self.staged.contains_key(&id) {
                // Staged: it starts once the coordinator hands it its gang's rendezvous.
                if let Some(gang) = &lease.gang
                    && let Some(staged) = self.staged.remove(&id)
                {
                    self.start_gang_replica(lease, staged, gang).await;
                }
                continue;
            }
            self.stop_canaries_on(&lease.lease.gpu_indices);
            self.launch(lease).await;
        }
        self.save_runs();
    }

    /// Reports a gang replica staged, with the port reserved for it.
    pub(super) async fn report_staged(&self, lease: &AgentLease, port: u16) -> Result<(), ClientError> {
        let event = LeaseEventRequest {
            epoch: lease.lease.epoch,
            state: "staged".to_string(),
            exit_code: None,
            detail: String::new(),
            port: Some(port),
        };
        self.client.event(&self.key, self.node_id, lease.lease.id, &event).await
    }

    pub(super) async fn report(
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
            port: None,
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
            // A gang's replicas reach each other on their hosts' addresses and reserved ports.
            network: if super::gang::is_gang(lease) {
                "host".to_string()
            } else {
                job.network.clone()
            },
            shm_mib: self.config.topology.shm_mib,
            scratch_dir: lease_dir.join(crate::scratch::SCRATCH_DIR),
            checkpoint_dir: job.checkpoint_dir.as_ref().map(|_| {
                self.config
                    .data_dir
                    .join("checkpoints")
                    .join(lease.lease.job_id.to_string())
            }),
            log_path: lease_dir.join("output.log"),
            datasets_dir: (!job.datasets.is_empty()).then(|| lease_dir.join(DATASETS_DIR)),
            runtime: job.runtime.clone(),
        };
        if let Err(error) = self.report(lease, "staging", None, "").await {
            tracing::warn!(lease = id, %error, "could not report staging; not starting");
            if self.pacer.failed(&error).is_some() {
                // The coordinator could not be reached or take it now: try again after a wait.
                self.launch_waiting = true;
            }
            return;
        }
        if let Err(error) = self.stage_datasets(&job.datasets, spec.datasets_dir.as_deref()).await {
            tracing::warn!(lease = id, %error, "a dataset could not be staged");
            self.ended.insert((id, lease.lease.epoch));
            if let Err(report) = self.report(lease, "failed", None, &error.to_string()).await {
                tracing::warn!(lease = id, error = %report, "could not report the failure");
            }
            return;
        }
        if super::gang::is_gang(lease) {
            self.stage_gang_replica(lease, spec).await;
            return;
        }
        let Some(serve) = job.serve.clone() else {
            self.start_replica(lease, spec).await;
            return;
        };
        // A serving replica listens on a free port of this host, named in PORT (a container
        // runs on the host's network to be reached there); the gateway reaches it through the
        // tunnel once its health check answers.
        let port = match crate::tunnel::free_port() {
            Ok(port) => port,
            Err(error) => {
                let reason = format!("no free port for the serving replica: {error}");
                if let Err(report) = self.report(lease, "failed", None, &reason).await {
                    tracing::warn!(lease = id, error = %report, "could not report the failure");
                }
                return;
            }
        };
        let mut spec = spec;
        spec.env.insert("PORT".to_string(), port.to_string());
        spec.network = "host".to_string();
        self.start_replica(lease, spec).await;
        if self.runs.contains_key(&id) {
            let (stop, stopped) = tokio::sync::watch::channel(false);
            self.probes.insert(id, stop);
            // Once ready it is reported, so the coordinator routes to it and its service
            // counts it healthy (a replica never ready is replaced by the service).
            let (client, key, node_id) = (Arc::clone(&self.client), Arc::clone(&self.key), self.node_id);
            let event = LeaseEventRequest {
                epoch: lease.lease.epoch,
                state: "ready".to_string(),
                exit_code: None,
                detail: String::new(),
                port: Some(port),
            };
            let routes = self.serving.clone();
            tokio::spawn(async move {
                if crate::tunnel::wait_ready(routes, id, port, serve.health_path, stopped).await
                    && let Err(error) = client.event(&key, node_id, id, &event).await
                {
                    tracing::warn!(lease = id, %error, "could not report the replica ready");
                }
            });
        }
    }

    /// A serving replica stops taking requests (it ends, or is being stopped).
    fn unserve(&mut self, id: i64) {
        self.serving.remove(id);
        if let Some(stop) = self.probes.remove(&id) {
            let _ = stop.send(true);
        }
    }

    /// Starts a replica whose lease is staged (and, for a gang, whose gang assembled).
    pub(super) async fn start_replica(&mut self, lease: &AgentLease, spec: RunSpec) {
        let id = lease.lease.id;
        if !self.open_scratch(lease, &spec).await {
            return;
        }
        let log = self.resume_log_of(&spec);
        match self.executor.start(&spec).await {
            Ok(handle) => {
                if let Err(error) = self.start_guard(id, &handle) {
                    tracing::error!(lease = id, %error, "the replica's guard did not start; stopping the replica");
                    let _ = self.executor.stop(&handle, Duration::ZERO).await;
                    self.clean_up(id, &spec).await;
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
                self.clean_up(id, &spec).await;
            }
        }
    }

    /// Makes the replica's scratch directory (an encrypted volume with a new key, where the
    /// agent encrypts scratch); if it cannot, reports the lease failed and returns false.
    pub(super) async fn open_scratch(&mut self, lease: &AgentLease, spec: &RunSpec) -> bool {
        let Err(error) = self.scratch.open(&spec.scratch_dir).await else {
            return true;
        };
        let id = lease.lease.id;
        tracing::warn!(lease = id, %error, "the replica's scratch could not be made");
        self.scratch.close(&spec.scratch_dir).await;
        let reason = format!("the node could not make the replica's scratch: {error}");
        if let Err(report) = self.report(lease, "failed", None, &reason).await {
            tracing::warn!(lease = id, error = %report, "could not report the failure");
        }
        false
    }

    /// What to clear of lease `id`'s GPUs once its replica is gone: those no other replica of
    /// this node holds (`gpu_clear::plan`).
    fn gpu_clearing(&self, id: i64, gpus: &[u8]) -> GpuClearing {
        let held: Vec<u8> = self
            .runs
            .iter()
            .filter(|(other, _)| **other != id)
            .flat_map(|(_, run)| run.lease.lease.gpu_indices.iter().copied())
            .chain(
                self.stopping
                    .iter()
                    .filter(|(other, _)| **other != id)
                    .flat_map(|(_, (gpus, _))| gpus.iter().copied()),
            )
            .collect();
        crate::gpu_clear::plan(self.inventory.simulated, gpus, &held)
    }

    /// Fetches a job's datasets into the cache (each verified) and puts them in the replica's
    /// own directory, where it sees those and no others.
    async fn stage_datasets(
        &self,
        datasets: &[api::DatasetRequest],
        dir: Option<&std::path::Path>,
    ) -> Result<(), crate::datasets::DatasetError> {
        for dataset in datasets {
            self.datasets.fetch(&self.http, dataset).await?;
        }
        match dir {
            Some(dir) => self.datasets.link_into(datasets, dir).await,
            None => Ok(()),
        }
    }

    /// Removes what an ended replica of lease `id` left: its container or files and its scratch
    /// volume now; its GPUs' memory in the background, the GPUs held meanwhile (as a stopping
    /// replica's are), so no new lease gets them first.
    async fn clean_up(&mut self, id: i64, spec: &RunSpec) {
        clean_up_replica(self.executor.as_ref(), &self.scratch, spec).await;
        let clearing = self.gpu_clearing(id, &spec.gpu_indices);
        if clearing != GpuClearing::Nothing {
            let task = tokio::spawn(async move {
                crate::gpu_clear::clear(&clearing).await;
                None
            });
            self.stopping.insert(id, (spec.gpu_indices.clone(), task));
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
    pub(super) fn fence(&self) -> Option<Fence> {
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
    pub(super) fn stop_in_background(&mut self, run: Run<E::Handle>, grace: Duration) {
        self.unserve(run.lease.lease.id);
        let executor = self.executor.clone();
        let guards = self.guards.clone();
        let scratch = self.scratch.clone();
        let id = run.lease.lease.id;
        let gpus = run.lease.lease.gpu_indices.clone();
        let clearing = self.gpu_clearing(id, &gpus);
        self.stopping.insert(
            id,
            (
                gpus,
                tokio::spawn(async move {
                    let exit = executor.stop(&run.handle, grace).await.ok();
                    guards.end(id).await;
                    clean_up_replica(executor.as_ref(), &scratch, &run.spec).await;
                    crate::gpu_clear::clear(&clearing).await;
                    exit
                }),
            ),
        );
    }

    /// Stops every replica when the coordinator has not answered for half its heartbeat
    /// timeout: by the time it finds the node silent and moves the leases elsewhere (a whole
    /// timeout), they are gone, so no lease runs twice at once. Their leases stay as the
    /// coordinator has them; if it still lists them when contact returns, they run again.
    pub(super) fn fence_if_cut_off(&mut self) {
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
    pub(super) fn take_guarded_stops(&mut self) {
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

    /// A replica ended on its own (or in its grace period): its last usage, then the
    /// attestation, which ends the lease as finished (exit 0) or failed; a preempted replica
    /// that did not finish its work is left for the coordinator to end as preempted.
    pub(super) async fn finish(&mut self, run: Run<E::Handle>, exit: Exit) {
        let id = run.lease.lease.id;
        self.unserve(id);
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
            self.clean_up(id, &run.spec).await;
            self.save_runs();
            return;
        }
        let mut attestation = trust::Attestation {
            lease_id: id,
            epoch: run.lease.lease.epoch,
            image_digest: self.executor.image_digest(&run.handle),
            start_ms: run.started_ms,
            end_ms: run.metered_to_ms,
            exit_code: exit.code,
            gpu_seconds_milli: run.gpu_seconds_milli,
            telemetry_digest: String::new(),
            log_digest: digest_of_file(&run.spec.log_path),
            output_digest: String::new(),
            output_bytes: 0,
        };
        if !crate::output::has_output(&run.spec.scratch_dir) {
            attest(&self.client, &self.key, self.node_id, &attestation).await;
            self.clean_up(id, &run.spec).await;
            self.save_runs();
            return;
        }
        // Packed, shipped and attested in the background: an upload may take minutes, and this
        // loop (the node's heartbeats) must not wait for it. The replica's GPUs stay held, as a
        // stopping replica's are, until its output is gone and its scratch space with it.
        let destination = api::output_url_of(run.lease.job.output_url.as_deref(), run.lease.lease.replica);
        let (client, key, node_id) = (Arc::clone(&self.client), Arc::clone(&self.key), self.node_id);
        let (executor, scratch) = (self.executor.clone(), self.scratch.clone());
        let clearing = self.gpu_clearing(id, &run.spec.gpu_indices);
        let epoch = run.lease.lease.epoch;
        let log_offset = i64::try_from(run.log.sent).unwrap_or(i64::MAX);
        let spec = run.spec;
        let gpus = spec.gpu_indices.clone();
        let task = tokio::spawn(async move {
            let shipped = crate::output::ship(
                &client,
                &key,
                node_id,
                id,
                epoch,
                &spec.scratch_dir,
                destination.as_deref(),
            );
            match shipped.await {
                Ok(archive) => {
                    tracing::info!(lease = id, bytes = archive.bytes, digest = %archive.digest, "the replica's output shipped");
                    attestation.output_digest = archive.digest;
                    attestation.output_bytes = i64::try_from(archive.bytes).unwrap_or(i64::MAX);
                }
                Err(why) => {
                    tracing::warn!(lease = id, %why, "the replica's output was not shipped");
                    // Said where the tenant looks: at the end of the replica's output.
                    let note = api::LogChunkRequest {
                        epoch,
                        byte_offset: log_offset,
                        text: format!("\nfallow: what the replica left in $FALLOW_OUTPUT_DIR was not kept: {why}\n"),
                    };
                    if let Err(error) = client.log(&key, node_id, id, &note).await {
                        tracing::warn!(lease = id, %error, "could not say why in the replica's output");
                    }
                }
            }
            attest(&client, &key, node_id, &attestation).await;
            clean_up_replica(executor.as_ref(), &scratch, &spec).await;
            crate::gpu_clear::clear(&clearing).await;
            None
        });
        self.stopping.insert(id, (gpus, task));
        self.save_runs();
    }
}

/// Sends a replica's attestation, which ends its lease; says how that went in the agent's log.
async fn attest(client: &crate::client::Client, key: &trust::NodeKey, node_id: i64, attestation: &trust::Attestation) {
    let (id, code) = (attestation.lease_id, attestation.exit_code);
    match client.attest(key, node_id, attestation).await {
        Ok(()) => tracing::info!(lease = id, exit = code, "replica ended; attested"),
        Err(error) if error.is_conflict() => {
            tracing::info!(lease = id, %error, "replica ended after its lease did");
        }
        Err(error) => tracing::warn!(lease = id, %error, "the attestation was refused"),
    }
}

/// Removes what a replica left once it is gone: the executor's leftovers (its container, its
/// files), then its scratch volume (unmounted and its cipher files removed; its key is long
/// gone), then its view of its datasets (links: the cache keeps them).
async fn clean_up_replica<E: Executor>(executor: &E, scratch: &Scratch, spec: &RunSpec) {
    executor.clean_up(spec).await;
    scratch.close(&spec.scratch_dir).await;
    if let Some(dir) = &spec.datasets_dir {
        let _ = tokio::fs::remove_dir_all(dir).await;
    }
}

fn digest_of_file(path: &std::path::Path) -> String {
    let bytes = std::fs::read(path).unwrap_or_default();
    format!("blake3:{}", blake3::hash(&bytes).to_hex())
}

/// Writes a byte to every guard each time the agent hears from the coordinator, until the agent
/// is gone.
pub(super) async fn feed_guards(mut contact: watch::Receiver<tokio::time::Instant>, guards: Guards) {
    while contact.changed().await.is_ok() {
        guards.feed();
    }
}

/// Follows the lease set by long-poll and publishes each new one.
pub(super) async fn poll_leases(
    client: Client,
    key: NodeKey,
    node_id: i64,
    sets: watch::Sender<Option<LeaseSet>>,
    contact: watch::Sender<tokio::time::Instant>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut known: Option<String> = None;
    let mut backoff = api::backoff::Backoff::agent(api::backoff::seed_from_clock(node_id as u64));
    loop {
        let asked = client.leases(&key, node_id, LEASE_POLL_WAIT_MS, known.as_deref());
        let answer = tokio::select! {
            answer = asked => answer,
            _ = shutdown.changed() => return,
        };
        match answer {
            Ok(set) => {
                contact.send_replace(tokio::time::Instant::now());
                backoff.succeeded();
                if known.as_deref() != Some(set.version.as_str()) {
                    known = Some(set.version.clone());
                    let _ = sets.send(Some(set));
                }
            }
            Err(error) => {
                let wait = backoff.failed(error.retry_after());
                tracing::warn!(%error, wait_ms = wait.as_millis() as u64, "lease poll failed; asking again");
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    _ = shutdown.changed() => return,
                }
            }
        }
    }
}
