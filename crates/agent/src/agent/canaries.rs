//! Running the coordinator's canary orders at low priority (they give way to leases) and
//! sending their signed results; `crate::canary` (hash) and `crate::matmul` (matmul) are the
//! canaries' computations themselves. A matmul canary's products wait in the canary's directory
//! under the data directory until its challenge is answered, and are deleted then.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use api::{CanaryKind, CanaryOrder};
use trust::NodeKey;

use super::{Agent, now_ms};
use crate::client::{Client, ClientError};
use crate::exec::Executor;
use crate::matmul::{MatmulDevice, MatmulWork};

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
                Runner {
                    program: self.config.canary_program.clone(),
                    simulated_device: self.inventory.simulated_device.clone(),
                    matmul_device: self.config.matmul_device,
                    product_dir: self
                        .config
                        .data_dir
                        .join(CANARY_PRODUCTS_DIR)
                        .join(order.id.to_string()),
                },
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

/// Where a matmul canary's products wait for the challenge, under the data directory (one
/// directory per canary, by id).
pub const CANARY_PRODUCTS_DIR: &str = "canaries";

/// How a canary runs on this node.
struct Runner {
    /// The `fallow` binary to run `canary run` as a child; `None`: in this process.
    program: Option<PathBuf>,
    simulated_device: Option<String>,
    matmul_device: Option<MatmulDevice>,
    /// Where a matmul canary keeps its products.
    product_dir: PathBuf,
}

/// Deletes a matmul canary's products when dropped: when its challenge is answered, or its
/// run or report given up or aborted.
struct Products(PathBuf);

impl Drop for Products {
    fn drop(&mut self) {
        if self.0.exists()
            && let Err(error) = std::fs::remove_dir_all(&self.0)
        {
            tracing::warn!(path = %self.0.display(), %error, "could not delete a canary's products");
        }
    }
}

/// Runs a canary (the `fallow canary run` child, or in this process without a program), then
/// hands its result to a task of its own to report. Aborting this task before the run ends
/// kills the child and reports nothing.
async fn run_and_report_canary(
    order: CanaryOrder,
    runner: Runner,
    run_for: Duration,
    client: Arc<Client>,
    key: Arc<NodeKey>,
    node_id: i64,
) {
    let id = order.id;
    let products = Products(runner.product_dir.clone());
    let ran = match order.kind {
        CanaryKind::Hash => {
            tokio::time::timeout(run_for, run_canary(&order, runner.program, runner.simulated_device)).await
        }
        CanaryKind::Matmul => tokio::time::timeout(run_for, run_matmul_canary(&order, &runner)).await,
    };
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
    let proving = (order.kind == CanaryKind::Matmul).then(|| Proving {
        products,
        n: order.units,
    });
    tokio::spawn(report_canary(result, proving, client, key, node_id));
}

/// Runs one matmul order on the node's matmul device (a child `fallow canary run --kind matmul`
/// or in this process), keeping the products in the runner's directory.
async fn run_matmul_canary(order: &CanaryOrder, runner: &Runner) -> Result<crate::canary::CanaryOutput, String> {
    let Some(device) = runner.matmul_device else {
        return Err("a matmul canary was ordered, but this node cannot run one (no CUDA); it registered none".into());
    };
    let Some(program) = &runner.program else {
        let work = MatmulWork {
            seed: order.seed.clone(),
            n: order.units,
            gpus: order.gpus.clone(),
            memory_mib: order.memory_mib,
            product_dir: Some(runner.product_dir.clone()),
        };
        return tokio::task::spawn_blocking(move || crate::matmul::run_matmul(&work, device))
            .await
            .map_err(|error| error.to_string())?
            .map_err(|error| error.to_string());
    };
    let gpus = order.gpus.iter().map(u8::to_string).collect::<Vec<_>>().join(",");
    let device = match device {
        MatmulDevice::Cuda => "cuda",
        MatmulDevice::CpuReference => "cpu-reference",
    };
    let mut command = tokio::process::Command::new(program);
    command
        .args(["canary", "run", "--kind", "matmul", "--seed", &order.seed])
        .args(["--n", &order.units.to_string()])
        .args(["--gpus", &gpus])
        .args(["--memory-mib", &order.memory_mib.to_string()])
        .args(["--device", device])
        .arg("--product-dir")
        .arg(&runner.product_dir)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    child_output(program, command).await
}

/// A matmul canary's products and size, kept for its challenge.
struct Proving {
    products: Products,
    n: u64,
}

/// The proof a challenge asks for, from the kept products.
async fn prove(proving: &Proving, challenge: &api::CanaryChallenge) -> Result<api::CanaryProof, String> {
    let (dir, n, challenge) = (proving.products.0.clone(), proving.n, challenge.clone());
    tokio::task::spawn_blocking(move || {
        let mut gpus = Vec::with_capacity(challenge.gpus.len());
        for asked in &challenge.gpus {
            let openings =
                crate::matmul::reveal(&dir, n, &[asked.gpu], &asked.rows).map_err(|error| error.to_string())?;
            gpus.extend(openings.into_iter().map(|openings| {
                api::CanaryGpuOpenings {
                    gpu: openings.gpu,
                    rows: openings
                        .rows
                        .into_iter()
                        .map(|opening| api::CanaryRowOpening {
                            index: opening.index,
                            row: opening.row,
                            path: opening.path,
                        })
                        .collect(),
                }
            }));
        }
        Ok(api::CanaryProof { gpus })
    })
    .await
    .map_err(|error| error.to_string())?
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
    child_output(&program, command).await
}

/// Runs a `fallow canary run` child and reads the line it printed.
async fn child_output(
    program: &std::path::Path,
    mut command: tokio::process::Command,
) -> Result<crate::canary::CanaryOutput, String> {
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
/// refusal (4xx) is logged and dropped. A matmul canary's challenge is answered with its proof.
async fn report_canary(
    result: trust::canary::CanaryResult,
    proving: Option<Proving>,
    client: Arc<Client>,
    key: Arc<NodeKey>,
    node_id: i64,
) {
    let id = result.canary_id;
    let mut backoff = api::backoff::Backoff::agent(api::backoff::seed_from_clock(id as u64));
    for attempt in 1..=CANARY_REPORT_ATTEMPTS_MAX {
        match client.canary_result(&key, node_id, &result).await {
            Ok(api::CanaryAccepted {
                challenge: Some(challenge),
                ..
            }) => {
                let Some(proving) = proving else {
                    tracing::warn!(canary = id, "challenged for a canary that kept no products");
                    return;
                };
                tracing::info!(
                    canary = id,
                    rate_milli = result.rate_milli,
                    "canary reported; answering its challenge"
                );
                send_proof(id, &proving, &challenge, &client, &key, node_id).await;
                return;
            }
            Ok(accepted) => {
                tracing::info!(canary = id, finding = %accepted.finding, reason = ?accepted.reason, rate_milli = result.rate_milli, "canary reported");
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

/// Answers a matmul canary's challenge with its proof, again after a failure the coordinator
/// may recover from; the products are deleted when this returns.
async fn send_proof(
    id: i64,
    proving: &Proving,
    challenge: &api::CanaryChallenge,
    client: &Client,
    key: &NodeKey,
    node_id: i64,
) {
    let proof = match prove(proving, challenge).await {
        Ok(proof) => proof,
        Err(error) => {
            tracing::warn!(canary = id, %error, "could not read the canary's products for its challenge");
            return;
        }
    };
    let mut backoff = api::backoff::Backoff::agent(api::backoff::seed_from_clock(id as u64 ^ 1));
    for attempt in 1..=CANARY_REPORT_ATTEMPTS_MAX {
        match client.canary_proof(key, node_id, id, &proof).await {
            Ok(accepted) => {
                tracing::info!(canary = id, finding = %accepted.finding, reason = ?accepted.reason, "canary's proof taken");
                return;
            }
            Err(ClientError::Refused { status, message, .. }) if (400..500).contains(&status) && status != 429 => {
                tracing::warn!(canary = id, status, %message, "the canary's proof was refused");
                return;
            }
            Err(error @ ClientError::BadAnswer(_)) => {
                tracing::warn!(canary = id, %error, "the canary's proof was taken, its finding not read");
                return;
            }
            Err(error) => {
                tracing::warn!(canary = id, attempt, %error, "the canary's proof waits to be sent again");
                tokio::time::sleep(backoff.failed(error.retry_after())).await;
            }
        }
    }
    tracing::warn!(canary = id, "the canary's proof could not be sent; dropped");
}
