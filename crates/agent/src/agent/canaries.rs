//! Running the coordinator's canary orders at low priority (they give way to leases) and
//! sending their signed results; `crate::canary` is the canary's computation itself.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use api::CanaryOrder;
use trust::NodeKey;

use super::{Agent, now_ms};
use crate::client::{Client, ClientError};
use crate::exec::Executor;

/// The longest a canary may run, whatever its deadline says.
pub const CANARY_RUN_MAX: Duration = Duration::from_secs(30 * 60);
/// How many times a canary's result is sent before it is dropped (the coordinator then finds
/// the canary unanswered).
pub const CANARY_REPORT_ATTEMPTS_MAX: u32 = 5;
/// Canary ids remembered as seen, so none runs twice; the oldest are forgotten first.
pub const CANARY_IDS_REMEMBERED_MAX: usize = 4_096;
/// The most canaries running at once (the coordinator orders one at a time).
pub const CANARIES_RUNNING_MAX: usize = 16;

impl<E: Executor> Agent<E> {
    /// Starts the canary orders not seen before. An order whose GPUs a replica holds, or whose
    /// deadline passed, is dropped unreported: canaries give way to work, and the coordinator
    /// orders another later.
    pub(super) fn start_canaries(&mut self, orders: Vec<CanaryOrder>) {
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
    pub(super) fn stop_canaries_on(&mut self, gpus: &[u8]) {
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
    let mut backoff = api::backoff::Backoff::agent(api::backoff::seed_from_clock(id as u64));
    for attempt in 1..=CANARY_REPORT_ATTEMPTS_MAX {
        match client.canary_result(&key, node_id, &result).await {
            Ok(finding) => {
                tracing::info!(canary = id, %finding, rate_milli = result.rate_milli, "canary reported");
                return;
            }
            Err(ClientError::Refused { status, message, .. }) if (400..500).contains(&status) && status != 429 => {
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
                tokio::time::sleep(backoff.failed(error.retry_after())).await;
            }
        }
    }
    tracing::warn!(canary = id, "the canary's result could not be sent; dropped");
}
