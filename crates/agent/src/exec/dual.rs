//! Both runtimes on one node (`fallow agent --executor both`, and `fallow dev`): a job that asks
//! for the process runtime runs as a process of the host, every other job in a Docker container.
//! Without a Docker Engine only processes run, and the node registers only that runtime.
//!
//! A replica's id (`handle_id`, kept in `runs.json` and given to its guard) is the inner
//! executor's id behind `process:` or `docker:`, so whoever finds it again stops it the right way.

use std::time::Duration;

use super::docker::{DockerExecutor, DockerHandle};
use super::process::{ProcessExecutor, ProcessHandle};
use super::{ExecError, Executor, Exit, RunSpec};
use crate::state::RunRecord;

const PROCESS_PREFIX: &str = "process:";
const DOCKER_PREFIX: &str = "docker:";

/// Processes always; containers when a Docker Engine answered.
pub struct DualExecutor {
    process: ProcessExecutor,
    docker: Option<DockerExecutor>,
}

#[derive(Clone, Debug)]
pub enum DualHandle {
    Process(ProcessHandle),
    Docker(DockerHandle),
}

impl DualExecutor {
    pub fn new(docker: Option<DockerExecutor>) -> DualExecutor {
        DualExecutor {
            process: ProcessExecutor,
            docker,
        }
    }

    /// Whether containers run here.
    pub fn has_docker(&self) -> bool {
        self.docker.is_some()
    }

    fn docker(&self) -> Result<&DockerExecutor, ExecError> {
        self.docker
            .as_ref()
            .ok_or_else(|| ExecError::Start("this node runs no containers (no Docker Engine answered)".into()))
    }

    /// Whether a replica runs as a process: it asked for that, or named no runtime on a node
    /// without Docker.
    fn as_process(&self, spec: &RunSpec) -> bool {
        match spec.runtime.as_deref() {
            Some("process") => true,
            Some(_) => false,
            None => self.docker.is_none(),
        }
    }
}

impl Executor for DualExecutor {
    type Handle = DualHandle;

    const NAME: &'static str = "both";

    fn runtimes(&self) -> Vec<String> {
        let mut runtimes = self.process.runtimes();
        if let Some(docker) = &self.docker {
            runtimes.extend(docker.runtimes());
        }
        runtimes
    }

    async fn prepare(&self, spec: &RunSpec) -> Result<(), ExecError> {
        if self.as_process(spec) {
            self.process.prepare(spec).await
        } else {
            self.docker()?.prepare(spec).await
        }
    }

    async fn start(&self, spec: &RunSpec) -> Result<DualHandle, ExecError> {
        if self.as_process(spec) {
            Ok(DualHandle::Process(self.process.start(spec).await?))
        } else {
            Ok(DualHandle::Docker(self.docker()?.start(spec).await?))
        }
    }

    async fn poll_exit(&self, handle: &DualHandle) -> Result<Option<Exit>, ExecError> {
        match handle {
            DualHandle::Process(inner) => self.process.poll_exit(inner).await,
            DualHandle::Docker(inner) => self.docker()?.poll_exit(inner).await,
        }
    }

    async fn stop(&self, handle: &DualHandle, grace: Duration) -> Result<Exit, ExecError> {
        match handle {
            DualHandle::Process(inner) => self.process.stop(inner, grace).await,
            DualHandle::Docker(inner) => self.docker()?.stop(inner, grace).await,
        }
    }

    fn image_digest(&self, handle: &DualHandle) -> String {
        match (handle, &self.docker) {
            (DualHandle::Process(inner), _) => self.process.image_digest(inner),
            (DualHandle::Docker(inner), Some(docker)) => docker.image_digest(inner),
            (DualHandle::Docker(_), None) => String::new(),
        }
    }

    fn handle_id(&self, handle: &DualHandle) -> String {
        match (handle, &self.docker) {
            (DualHandle::Process(inner), _) => format!("{PROCESS_PREFIX}{}", self.process.handle_id(inner)),
            (DualHandle::Docker(inner), Some(docker)) => format!("{DOCKER_PREFIX}{}", docker.handle_id(inner)),
            (DualHandle::Docker(inner), None) => format!("{DOCKER_PREFIX}{}", inner.container),
        }
    }

    async fn stop_by_id(&self, id: &str, grace: Duration) -> Result<(), ExecError> {
        if let Some(inner) = id.strip_prefix(PROCESS_PREFIX) {
            self.process.stop_by_id(inner, grace).await
        } else if let Some(inner) = id.strip_prefix(DOCKER_PREFIX) {
            self.docker()?.stop_by_id(inner, grace).await
        } else {
            Err(ExecError::Other(format!(
                "{id:?} is not a process: or docker: replica id"
            )))
        }
    }

    fn guard_group(&self, handle: &DualHandle) -> Option<i32> {
        match handle {
            DualHandle::Process(inner) => self.process.guard_group(inner),
            DualHandle::Docker(_) => None,
        }
    }

    async fn stop_leftovers(&self, runs: &[RunRecord]) {
        let (mut processes, mut containers) = (Vec::new(), Vec::new());
        for run in runs {
            if let Some(inner) = run.id.strip_prefix(PROCESS_PREFIX) {
                processes.push(RunRecord {
                    id: inner.to_string(),
                    ..run.clone()
                });
            } else if let Some(inner) = run.id.strip_prefix(DOCKER_PREFIX) {
                containers.push(RunRecord {
                    id: inner.to_string(),
                    ..run.clone()
                });
            }
        }
        self.process.stop_leftovers(&processes).await;
        if let Some(docker) = &self.docker {
            docker.stop_leftovers(&containers).await;
        } else if !containers.is_empty() {
            tracing::warn!(
                count = containers.len(),
                "containers an earlier run started are left: no Docker Engine answers"
            );
        }
    }

    async fn clean_up(&self, spec: &RunSpec) {
        if self.as_process(spec) {
            self.process.clean_up(spec).await;
        } else if let Some(docker) = &self.docker {
            docker.clean_up(spec).await;
        }
    }
}
