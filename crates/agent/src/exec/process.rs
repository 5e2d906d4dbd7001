//! The process executor, for bare-metal hosts: the replica is a process group of its own, with
//! `CUDA_VISIBLE_DEVICES` naming its GPUs, a clean environment, its scratch directory as working
//! directory and home, output appended to the lease's log, and resource limits set before it
//! starts (no core dumps; its private writable memory capped at the lease's memory).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;

use super::{ExecError, Executor, Exit, RunSpec};

/// How often `stop` looks whether the replica has ended within its grace period.
const STOP_POLL: Duration = Duration::from_millis(50);

#[derive(Clone, Debug, Default)]
pub struct ProcessExecutor;

/// A running replica: its process group, and the child to reap.
#[derive(Clone, Debug)]
pub struct ProcessHandle {
    /// The process group id (the replica's first process's id).
    pub pgid: i32,
    child: Arc<Mutex<Child>>,
    digest: String,
}

#[derive(Debug)]
struct Child {
    process: tokio::process::Child,
    exit: Option<Exit>,
}

impl Child {
    fn try_exit(&mut self) -> Result<Option<Exit>, ExecError> {
        if self.exit.is_none()
            && let Some(status) = self
                .process
                .try_wait()
                .map_err(|error| ExecError::Other(format!("waiting for the replica: {error}")))?
        {
            self.exit = Some(exit_of(status));
        }
        Ok(self.exit)
    }
}

fn exit_of(status: std::process::ExitStatus) -> Exit {
    use std::os::unix::process::ExitStatusExt;
    let code = match (status.code(), status.signal()) {
        (Some(code), _) => i64::from(code),
        (None, Some(signal)) => 128 + i64::from(signal),
        (None, None) => -1,
    };
    Exit { code }
}

/// Sends `signal` to every process of the group.
pub fn signal_group(pgid: i32, signal: i32) {
    if pgid > 1 {
        // SAFETY: kill(2) with a negative pid signals a process group; no memory is involved.
        unsafe {
            libc::kill(-pgid, signal);
        }
    }
}

/// Whether process `pid` has ended: it is gone, or a zombie waiting for its parent.
fn ended(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| stat.rsplit_once(") ").map(|(_, rest)| rest.starts_with('Z')))
        .unwrap_or(true)
}

/// The program file a command names: a path as given, or the first match on `PATH`.
fn resolve(program: &str) -> Option<PathBuf> {
    if program.contains('/') {
        return Some(PathBuf::from(program));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

/// `blake3:` and the hex digest of the program file (or of its name when it cannot be read).
fn program_digest(program: &str) -> String {
    let digest = resolve(program)
        .and_then(|path| std::fs::read(path).ok())
        .map_or_else(|| blake3::hash(program.as_bytes()), |bytes| blake3::hash(&bytes));
    format!("blake3:{}", digest.to_hex())
}

fn open_log(path: &Path) -> Result<std::fs::File, ExecError> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|error| ExecError::Start(format!("{}: {error}", parent.display())))?;
    }
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|error| ExecError::Start(format!("{}: {error}", path.display())))
}

impl Executor for ProcessExecutor {
    type Handle = ProcessHandle;

    const NAME: &'static str = "process";

    fn runtimes(&self) -> Vec<String> {
        vec!["process".to_string()]
    }

    async fn prepare(&self, spec: &RunSpec) -> Result<(), ExecError> {
        let program = if spec.image.is_empty() {
            spec.command.first().cloned().unwrap_or_default()
        } else {
            spec.image.clone()
        };
        if program.is_empty() {
            return Err(ExecError::Start(
                "the job names no program: give an image or a command".into(),
            ));
        }
        let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
        let found = if program.contains('/') {
            executable(std::path::Path::new(&program))
        } else {
            std::env::split_paths(&path).any(|dir| executable(&dir.join(&program)))
        };
        if found {
            Ok(())
        } else {
            Err(ExecError::Image(format!(
                "program '{program}' is not on this node (or not executable)"
            )))
        }
    }

    async fn start(&self, spec: &RunSpec) -> Result<ProcessHandle, ExecError> {
        let (program, args) = if spec.image.is_empty() {
            let (first, rest) = spec
                .command
                .split_first()
                .ok_or_else(|| ExecError::Start("the job names no program: give an image or a command".into()))?;
            (first.clone(), rest.to_vec())
        } else {
            (spec.image.clone(), spec.command.clone())
        };
        std::fs::create_dir_all(&spec.scratch_dir)
            .map_err(|error| ExecError::Start(format!("{}: {error}", spec.scratch_dir.display())))?;
        let output_dir = super::make_output_dir(&spec.scratch_dir)?;
        if let Some(dir) = &spec.checkpoint_dir {
            std::fs::create_dir_all(dir).map_err(|error| ExecError::Start(format!("{}: {error}", dir.display())))?;
        }
        let log = open_log(&spec.log_path)?;
        let log_err = log
            .try_clone()
            .map_err(|error| ExecError::Start(format!("{}: {error}", spec.log_path.display())))?;
        let devices = spec.gpu_indices.iter().map(u8::to_string).collect::<Vec<_>>().join(",");
        let mut command = tokio::process::Command::new(&program);
        command
            .args(&args)
            .current_dir(&spec.scratch_dir)
            .env_clear()
            .env(
                "PATH",
                std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into()),
            )
            .env("HOME", &spec.scratch_dir)
            .env("CUDA_VISIBLE_DEVICES", &devices)
            .env(
                "NVIDIA_VISIBLE_DEVICES",
                if devices.is_empty() { "none" } else { &devices },
            )
            .env("FALLOW_LEASE_ID", spec.lease_id.to_string())
            .env("FALLOW_EPOCH", spec.epoch.to_string())
            .env("FALLOW_SCRATCH_DIR", &spec.scratch_dir)
            .env("FALLOW_OUTPUT_DIR", &output_dir)
            .env("FALLOW_PROGRESS_FILE", spec.scratch_dir.join(super::PROGRESS_FILE))
            .env(
                "FALLOW_RENDEZVOUS_FILE",
                spec.scratch_dir.join(crate::agent::RENDEZVOUS_FILE),
            )
            .envs(&spec.env)
            .stdin(std::process::Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .process_group(0)
            .kill_on_drop(false);
        if let Some(dir) = &spec.checkpoint_dir {
            command.env("FALLOW_CHECKPOINT_DIR", dir);
        }
        if let Some(dir) = &spec.datasets_dir {
            command.env("FALLOW_DATASETS_DIR", dir);
        }
        let data_bytes = spec.memory_mib.saturating_mul(1 << 20);
        // SAFETY: only async-signal-safe calls (setrlimit) run between fork and exec.
        unsafe {
            command.pre_exec(move || {
                let none = libc::rlimit {
                    rlim_cur: 0,
                    rlim_max: 0,
                };
                libc::setrlimit(libc::RLIMIT_CORE, &none);
                if data_bytes > 0 {
                    let data = libc::rlimit {
                        rlim_cur: data_bytes as libc::rlim_t,
                        rlim_max: data_bytes as libc::rlim_t,
                    };
                    libc::setrlimit(libc::RLIMIT_DATA, &data);
                }
                Ok(())
            });
        }
        let process = command
            .spawn()
            .map_err(|error| ExecError::Start(format!("{program}: {error}")))?;
        let pgid = process
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .ok_or_else(|| ExecError::Start(format!("{program}: ended before it could be tracked")))?;
        Ok(ProcessHandle {
            pgid,
            child: Arc::new(Mutex::new(Child { process, exit: None })),
            digest: program_digest(&program),
        })
    }

    async fn poll_exit(&self, handle: &ProcessHandle) -> Result<Option<Exit>, ExecError> {
        handle.child.lock().await.try_exit()
    }

    async fn stop(&self, handle: &ProcessHandle, grace: Duration) -> Result<Exit, ExecError> {
        let mut child = handle.child.lock().await;
        if let Some(exit) = child.try_exit()? {
            signal_group(handle.pgid, libc::SIGKILL);
            return Ok(exit);
        }
        signal_group(handle.pgid, libc::SIGTERM);
        let deadline = tokio::time::Instant::now() + grace;
        while tokio::time::Instant::now() < deadline {
            if let Some(exit) = child.try_exit()? {
                // What the replica started and left behind goes too.
                signal_group(handle.pgid, libc::SIGKILL);
                return Ok(exit);
            }
            tokio::time::sleep(STOP_POLL).await;
        }
        signal_group(handle.pgid, libc::SIGKILL);
        let status = child
            .process
            .wait()
            .await
            .map_err(|error| ExecError::Other(format!("waiting for the killed replica: {error}")))?;
        let exit = exit_of(status);
        child.exit = Some(exit);
        Ok(exit)
    }

    fn image_digest(&self, handle: &ProcessHandle) -> String {
        handle.digest.clone()
    }

    fn handle_id(&self, handle: &ProcessHandle) -> String {
        handle.pgid.to_string()
    }

    /// Without the child to reap, the group's first process (whose id is the group's) counts
    /// as ended once it is gone or a zombie. A caller inside the group (a guard) must ignore
    /// SIGTERM, and dies with the group's SIGKILL.
    async fn stop_by_id(&self, id: &str, grace: Duration) -> Result<(), ExecError> {
        let pgid: i32 = id
            .parse()
            .map_err(|_| ExecError::Other(format!("{id:?} is not a process group id")))?;
        signal_group(pgid, libc::SIGTERM);
        let deadline = tokio::time::Instant::now() + grace;
        while tokio::time::Instant::now() < deadline && !ended(pgid) {
            tokio::time::sleep(STOP_POLL).await;
        }
        signal_group(pgid, libc::SIGKILL);
        Ok(())
    }

    fn guard_group(&self, handle: &ProcessHandle) -> Option<i32> {
        Some(handle.pgid)
    }

    async fn stop_leftovers(&self, runs: &[crate::state::RunRecord]) {
        for run in runs {
            if let Ok(pgid) = run.id.parse() {
                signal_group(pgid, libc::SIGKILL);
            }
        }
    }

    async fn clean_up(&self, spec: &RunSpec) {
        let _ = tokio::fs::remove_dir_all(&spec.scratch_dir).await;
    }
}

/// Whether `path` is a file this process may execute.
fn executable(path: &std::path::Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}
