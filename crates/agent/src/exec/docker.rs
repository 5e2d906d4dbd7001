//! The Docker executor, through the Docker Engine API (bollard): one container per replica,
//! never privileged, every capability dropped, `no-new-privileges`, memory and pids limits, the
//! network the job asks for (none or bridge), GPUs by device request (real GPUs only), a
//! scratch directory mounted at `/scratch` and removed afterwards, the checkpoint directory at
//! `/checkpoint` when the job asked for one, and the output copied to the lease's log.

use std::collections::HashMap;
use std::time::Duration;

use bollard::Docker;
use bollard::models::{ContainerCreateBody, DeviceRequest, HostConfig};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, InspectContainerOptions, LogsOptionsBuilder, RemoveContainerOptionsBuilder,
    StopContainerOptionsBuilder,
};
use futures_util::StreamExt;

use super::{ExecError, Executor, Exit, RunSpec};

/// Processes one container may run.
pub const PIDS_MAX: i64 = 4096;
/// The label that marks containers this agent started (with the lease id as value).
pub const LEASE_LABEL: &str = "dev.fallow.lease";

#[derive(Clone)]
pub struct DockerExecutor {
    docker: Docker,
    /// Whether GPUs are real (device requests to the NVIDIA runtime) or simulated (none).
    real_gpus: bool,
}

#[derive(Clone, Debug)]
pub struct DockerHandle {
    pub container: String,
    image_digest: String,
}

fn docker_error(what: &str, error: bollard::errors::Error) -> ExecError {
    ExecError::Other(format!("{what}: {error}"))
}

/// Why a pull failed, as the Engine said it: its message without bollard's wrapping (an HTTP
/// error's status line, a stream error's prefix), never empty.
fn pull_error_text(error: bollard::errors::Error) -> String {
    use bollard::errors::Error;
    let text = match error {
        Error::DockerResponseServerError { status_code, message } => {
            if message.trim().is_empty() {
                format!("the Docker Engine answered {status_code} and gave no reason")
            } else {
                message
            }
        }
        Error::DockerStreamError { error } => error,
        other => other.to_string(),
    };
    let text = text.trim();
    if text.is_empty() {
        "the Docker Engine gave no reason".to_string()
    } else {
        text.to_string()
    }
}

/// A chain of errors as Go writes them (`outer: inner: root`) with the root first and the rest
/// after it in brackets, so that a detail cut short still says what went wrong:
/// `Get "https://r.example/v2/": dial tcp: lookup r.example: no such host` becomes
/// `no such host (Get "https://r.example/v2/": dial tcp: lookup r.example)`.
fn cause_first(chain: &str) -> String {
    match chain.trim().rsplit_once(": ") {
        Some((context, root)) if !root.trim().is_empty() && !context.trim().is_empty() => {
            format!("{} ({})", root.trim(), context.trim())
        }
        _ => chain.trim().to_string(),
    }
}

impl DockerExecutor {
    /// Connects to the local Docker Engine (`DOCKER_HOST` or its socket).
    pub async fn connect(real_gpus: bool) -> Result<DockerExecutor, ExecError> {
        let docker =
            Docker::connect_with_local_defaults().map_err(|error| docker_error("connecting to Docker", error))?;
        docker
            .ping()
            .await
            .map_err(|error| docker_error("the Docker Engine does not answer", error))?;
        Ok(DockerExecutor { docker, real_gpus })
    }

    /// Removes a container and its anonymous volumes, whatever its state.
    pub async fn remove(&self, container: &str) {
        let options = RemoveContainerOptionsBuilder::new().force(true).v(true).build();
        let _ = self.docker.remove_container(container, Some(options)).await;
    }

    /// The replica's image, pulled first when it is not on the node.
    async fn image(&self, spec: &RunSpec) -> Result<bollard::models::ImageInspect, ExecError> {
        if spec.image.is_empty() {
            return Err(ExecError::Start("the job names no image".into()));
        }
        if let Ok(image) = self.docker.inspect_image(&spec.image).await {
            return Ok(image);
        }
        // Not here yet: pull it (from the registry its name says), then look again.
        self.pull(&spec.image).await.map_err(|cause| {
            ExecError::Image(format!(
                "image '{}' is not on this node and could not be pulled: {}",
                spec.image,
                cause_first(&cause)
            ))
        })?;
        self.docker.inspect_image(&spec.image).await.map_err(|error| {
            ExecError::Image(format!(
                "image '{}' is not on this node after its pull: {}",
                spec.image,
                cause_first(&pull_error_text(error))
            ))
        })
    }

    /// Pulls `image` (a name with a tag or digest; `latest` when it has neither), waiting for the
    /// pull to end. The error is why, in the Engine's words (what `docker pull` prints).
    async fn pull(&self, image: &str) -> Result<(), String> {
        let options = bollard::query_parameters::CreateImageOptionsBuilder::default()
            .from_image(image)
            .build();
        let mut progress = self.docker.create_image(Some(options), None, None);
        while let Some(step) = progress.next().await {
            match step {
                // An error item without a message (bollard passes those on as progress).
                Ok(info) if info.error_detail.is_some() => {
                    return Err("the Docker Engine ended the pull with an error and no message".into());
                }
                Ok(_) => {}
                Err(error) => return Err(pull_error_text(error)),
            }
        }
        Ok(())
    }

    /// Copies the container's output to `path` as it comes, until the container ends.
    fn follow_logs(&self, container: &str, path: std::path::PathBuf) {
        let docker = self.docker.clone();
        let container = container.to_string();
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            let Ok(mut file) = tokio::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .await
            else {
                return;
            };
            let options = LogsOptionsBuilder::new().follow(true).stdout(true).stderr(true).build();
            let mut logs = docker.logs(&container, Some(options));
            while let Some(Ok(chunk)) = logs.next().await {
                if file.write_all(&chunk.into_bytes()).await.is_err() {
                    return;
                }
            }
            let _ = file.flush().await;
        });
    }

    /// Docker sends SIGTERM, waits the grace period (whole seconds, rounded down: never longer
    /// than asked), then SIGKILL.
    async fn stop_container(&self, container: &str, grace: Duration) {
        let seconds = i32::try_from(grace.as_secs()).unwrap_or(i32::MAX);
        let options = StopContainerOptionsBuilder::new().t(seconds).build();
        let _ = self.docker.stop_container(container, Some(options)).await;
    }

    async fn exit_of(&self, container: &str) -> Result<Option<Exit>, ExecError> {
        let inspected = self
            .docker
            .inspect_container(container, None::<InspectContainerOptions>)
            .await
            .map_err(|error| docker_error("inspecting the container", error))?;
        let state = inspected.state.unwrap_or_default();
        if state.running.unwrap_or(false) || state.restarting.unwrap_or(false) {
            return Ok(None);
        }
        if state.status == Some(bollard::models::ContainerStateStatusEnum::CREATED) {
            return Ok(None);
        }
        Ok(Some(Exit {
            code: state.exit_code.unwrap_or(-1),
        }))
    }
}

impl Executor for DockerExecutor {
    type Handle = DockerHandle;

    const NAME: &'static str = "docker";

    fn runtimes(&self) -> Vec<String> {
        vec!["container".to_string()]
    }

    async fn prepare(&self, spec: &RunSpec) -> Result<(), ExecError> {
        self.image(spec).await.map(|_| ())
    }

    async fn start(&self, spec: &RunSpec) -> Result<DockerHandle, ExecError> {
        let image = self.image(spec).await?;
        let image_digest = image
            .repo_digests
            .as_ref()
            .and_then(|digests| digests.first().cloned())
            .or(image.id.clone())
            .unwrap_or_default();
        std::fs::create_dir_all(&spec.scratch_dir)
            .map_err(|error| ExecError::Start(format!("{}: {error}", spec.scratch_dir.display())))?;
        super::make_output_dir(&spec.scratch_dir)?;
        let mut binds = vec![format!("{}:/scratch", spec.scratch_dir.display())];
        if let Some(dir) = &spec.checkpoint_dir {
            std::fs::create_dir_all(dir).map_err(|error| ExecError::Start(format!("{}: {error}", dir.display())))?;
            binds.push(format!("{}:/checkpoint", dir.display()));
        }
        if let Some(dir) = &spec.datasets_dir {
            binds.push(format!("{}:/datasets:ro", dir.display()));
        }
        let devices = spec.gpu_indices.iter().map(u8::to_string).collect::<Vec<_>>();
        let device_requests = (self.real_gpus && !devices.is_empty()).then(|| {
            vec![DeviceRequest {
                driver: Some("nvidia".into()),
                device_ids: Some(devices.clone()),
                capabilities: Some(vec![vec!["gpu".into()]]),
                ..DeviceRequest::default()
            }]
        });
        let mut env: Vec<String> = spec.env.iter().map(|(name, value)| format!("{name}={value}")).collect();
        env.push(format!("FALLOW_LEASE_ID={}", spec.lease_id));
        env.push(format!("FALLOW_EPOCH={}", spec.epoch));
        env.push("FALLOW_SCRATCH_DIR=/scratch".into());
        env.push(format!("FALLOW_OUTPUT_DIR=/scratch/{}", crate::output::OUTPUT_DIR));
        env.push(format!("FALLOW_PROGRESS_FILE=/scratch/{}", super::PROGRESS_FILE));
        env.push(format!(
            "FALLOW_RENDEZVOUS_FILE=/scratch/{}",
            crate::agent::RENDEZVOUS_FILE
        ));
        if spec.checkpoint_dir.is_some() {
            env.push("FALLOW_CHECKPOINT_DIR=/checkpoint".into());
        }
        if spec.datasets_dir.is_some() {
            env.push("FALLOW_DATASETS_DIR=/datasets".into());
        }
        let memory = i64::try_from(spec.memory_mib.saturating_mul(1 << 20)).unwrap_or(i64::MAX);
        let host_config = HostConfig {
            privileged: Some(false),
            cap_drop: Some(vec!["ALL".into()]),
            security_opt: Some(vec!["no-new-privileges:true".into()]),
            memory: (memory > 0).then_some(memory),
            memory_swap: (memory > 0).then_some(memory),
            pids_limit: Some(PIDS_MAX),
            nano_cpus: (spec.cpu_milli > 0).then(|| i64::from(spec.cpu_milli) * 1_000_000),
            network_mode: Some(
                match spec.network.as_str() {
                    "bridge" => "bridge",
                    "host" => "host",
                    _ => "none",
                }
                .into(),
            ),
            shm_size: (spec.shm_mib > 0).then(|| i64::try_from(spec.shm_mib << 20).unwrap_or(i64::MAX)),
            binds: Some(binds),
            device_requests,
            ..HostConfig::default()
        };
        let body = ContainerCreateBody {
            image: Some(spec.image.clone()),
            cmd: (!spec.command.is_empty()).then(|| spec.command.clone()),
            env: Some(env),
            working_dir: Some("/scratch".into()),
            labels: Some(HashMap::from([(LEASE_LABEL.to_string(), spec.lease_id.to_string())])),
            host_config: Some(host_config),
            ..ContainerCreateBody::default()
        };
        let name = format!("fallow-lease-{}-{}", spec.lease_id, spec.epoch);
        // A container of the same name is a leftover of this lease at this epoch.
        self.remove(&name).await;
        let created = self
            .docker
            .create_container(Some(CreateContainerOptionsBuilder::new().name(&name).build()), body)
            .await
            .map_err(|error| ExecError::Start(format!("creating the container: {error}")))?;
        if let Err(error) = self
            .docker
            .start_container(&created.id, None::<bollard::query_parameters::StartContainerOptions>)
            .await
        {
            self.remove(&created.id).await;
            return Err(ExecError::Start(format!("starting the container: {error}")));
        }
        self.follow_logs(&created.id, spec.log_path.clone());
        Ok(DockerHandle {
            container: created.id,
            image_digest,
        })
    }

    async fn poll_exit(&self, handle: &DockerHandle) -> Result<Option<Exit>, ExecError> {
        self.exit_of(&handle.container).await
    }

    async fn stop(&self, handle: &DockerHandle, grace: Duration) -> Result<Exit, ExecError> {
        self.stop_container(&handle.container, grace).await;
        Ok(self.exit_of(&handle.container).await?.unwrap_or(Exit { code: 137 }))
    }

    async fn stop_by_id(&self, id: &str, grace: Duration) -> Result<(), ExecError> {
        self.stop_container(id, grace).await;
        match self.exit_of(id).await {
            Ok(Some(_)) => Ok(()),
            Ok(None) => Err(ExecError::Other(format!(
                "container {id} still runs after it was stopped"
            ))),
            // Gone already (removed by the agent): nothing runs.
            Err(_) => Ok(()),
        }
    }

    fn image_digest(&self, handle: &DockerHandle) -> String {
        handle.image_digest.clone()
    }

    fn handle_id(&self, handle: &DockerHandle) -> String {
        handle.container.clone()
    }

    async fn stop_leftovers(&self, runs: &[crate::state::RunRecord]) {
        for run in runs {
            self.remove(&run.id).await;
        }
    }

    async fn clean_up(&self, spec: &RunSpec) {
        self.remove(&format!("fallow-lease-{}-{}", spec.lease_id, spec.epoch))
            .await;
        let _ = tokio::fs::remove_dir_all(&spec.scratch_dir).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pull_error_says_its_root_cause_first() {
        for (chain, expect) in [
            (
                "Get \"https://nosuch.example/v2/\": dial tcp: lookup nosuch.example on 10.0.0.53:53: no such host",
                "no such host (Get \"https://nosuch.example/v2/\": dial tcp: lookup nosuch.example on 10.0.0.53:53)",
            ),
            ("manifest unknown", "manifest unknown"),
            ("  trailing: ", "trailing:"),
        ] {
            assert_eq!(cause_first(chain), expect, "{chain}");
        }
        let empty = bollard::errors::Error::DockerResponseServerError {
            status_code: 500,
            message: String::new(),
        };
        assert_eq!(
            pull_error_text(empty),
            "the Docker Engine answered 500 and gave no reason"
        );
        let streamed = bollard::errors::Error::DockerStreamError {
            error: "denied: requested access to the resource is denied".into(),
        };
        assert_eq!(
            pull_error_text(streamed),
            "denied: requested access to the resource is denied"
        );
    }
}
