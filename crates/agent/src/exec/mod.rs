//! Executors run one replica of a lease: a process on the host (`process`), or a container
//! (Docker). The agent drives them through one trait, so one conformance suite checks
//! every executor the same way.

pub mod docker;
pub mod dual;
pub mod process;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// The file in a replica's scratch directory where it may append lines `COUNT UNIT` (e.g.
/// `128000 tokens`, the total so far); the agent reports the last one. Named to the replica by
/// `FALLOW_PROGRESS_FILE`.
pub const PROGRESS_FILE: &str = ".fallow-progress";

/// Makes a replica's output directory (`$FALLOW_OUTPUT_DIR`, `crate::output`) in its scratch
/// directory, as open to the replica as the scratch directory is; returns it.
fn make_output_dir(scratch_dir: &std::path::Path) -> Result<PathBuf, ExecError> {
    let dir = scratch_dir.join(crate::output::OUTPUT_DIR);
    let made = std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::metadata(scratch_dir))
        .and_then(|scratch| std::fs::set_permissions(&dir, scratch.permissions()));
    made.map_err(|error| ExecError::Start(format!("{}: {error}", dir.display())))?;
    Ok(dir)
}

/// Everything an executor needs to run one replica.
#[derive(Clone, Debug, PartialEq)]
pub struct RunSpec {
    pub lease_id: i64,
    pub epoch: i64,
    /// The container image, or for the process executor the program (empty: the command's
    /// first word is the program).
    pub image: String,
    pub command: Vec<String>,
    pub env: BTreeMap<String, String>,
    /// The host's GPU indices this replica may use.
    pub gpu_indices: Vec<u8>,
    pub memory_mib: u64,
    pub cpu_milli: u32,
    /// "none", "bridge", or "host" (a gang's replicas: they reach each other on the hosts'
    /// addresses and the ports their agents reserved).
    pub network: String,
    /// Shared memory for the replica in MiB (`/dev/shm`; NCCL needs far more than Docker's
    /// 64 MiB); 0: the executor's default.
    pub shm_mib: u64,
    /// The replica's scratch directory, removed after it ends. The agent makes it before the
    /// replica starts, as an encrypted volume where it encrypts scratch (`crate::scratch`), and
    /// removes that volume after the executor's `clean_up`.
    pub scratch_dir: PathBuf,
    /// Kept across preemptions and restarts when the job asked for one.
    pub checkpoint_dir: Option<PathBuf>,
    /// Where the replica's output goes (stdout and stderr, interleaved).
    pub log_path: PathBuf,
    /// The dataset cache, when the job asked for datasets (read-only for the replica where the
    /// executor can enforce it).
    pub datasets_dir: Option<PathBuf>,
    /// The runtime the job asked for ("container" or "process"); `None`: the executor's own.
    pub runtime: Option<String>,
}

/// How a replica ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exit {
    /// The exit code; 128 + the signal's number when a signal ended it.
    pub code: i64,
}

#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("could not start the replica: {0}")]
    Start(String),
    /// The image is not on the node and could not be pulled; the message names the image and
    /// starts with why, unprefixed, since the lease's failure detail keeps only its start.
    #[error("{0}")]
    Image(String),
    #[error("executor: {0}")]
    Other(String),
}

/// Runs replicas. `Handle` identifies one running replica; it outlives the agent's process
/// where the executor can find it again (`adopt`).
pub trait Executor: Send + Sync + 'static {
    type Handle: Send + Sync + Clone + std::fmt::Debug + 'static;

    /// The executor's name on the command line (`fallow agent --executor NAME`), which a guard
    /// process is told so that it stops the replica the same way (`crate::guard`).
    const NAME: &'static str;

    /// The runtimes this executor runs replicas in ("container", "process"): the node registers
    /// them, and jobs that name another runtime are not placed on it.
    fn runtimes(&self) -> Vec<String>;

    /// Makes sure the replica could start here (its image is on the node, pulled if need be;
    /// its program exists), without starting it: a gang's replicas do this before the start
    /// barrier, so none runs its command while another cannot start.
    fn prepare(&self, _spec: &RunSpec) -> impl Future<Output = Result<(), ExecError>> + Send {
        async { Ok(()) }
    }

    /// Starts a replica; returns once it runs.
    fn start(&self, spec: &RunSpec) -> impl Future<Output = Result<Self::Handle, ExecError>> + Send;

    /// Whether the replica has ended, and how; `None` while it runs.
    fn poll_exit(&self, handle: &Self::Handle) -> impl Future<Output = Result<Option<Exit>, ExecError>> + Send;

    /// Asks the replica to stop (SIGTERM) and kills it if it still runs after `grace`. Returns
    /// how it ended.
    fn stop(&self, handle: &Self::Handle, grace: Duration) -> impl Future<Output = Result<Exit, ExecError>> + Send;

    /// A digest of what ran (the image's content digest, or the program file's).
    fn image_digest(&self, handle: &Self::Handle) -> String;

    /// What a restarted agent needs to find the replica again (see `stop_leftovers`).
    fn handle_id(&self, handle: &Self::Handle) -> String;

    /// Stops a replica known only by its id (`handle_id`) from another process than the one that
    /// started it (a guard): SIGTERM, `grace`, then SIGKILL, like `stop`.
    fn stop_by_id(&self, id: &str, grace: Duration) -> impl Future<Output = Result<(), ExecError>> + Send;

    /// The process group a guard joins, so that the group's id cannot be taken by an unrelated
    /// group while the guard lives (`None` where replicas are not process groups of this host).
    fn guard_group(&self, _handle: &Self::Handle) -> Option<i32> {
        None
    }

    /// Stops what an earlier run of the agent started (`runs`, as it recorded them): a restarted
    /// agent runs the leases it still holds again, so none runs twice at once.
    fn stop_leftovers(&self, runs: &[crate::state::RunRecord]) -> impl Future<Output = ()> + Send;

    /// Removes what the replica left behind (its scratch directory).
    fn clean_up(&self, spec: &RunSpec) -> impl Future<Output = ()> + Send;
}
