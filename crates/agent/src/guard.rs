//! A replica's guard: a small process (`fallow agent guard`) that the agent starts beside each
//! replica and that stops the replica when the agent stops vouching for it. The agent writes a
//! byte to the guard's stdin, a pipe whose write end only the agent holds, each time it hears
//! from the coordinator; a guard that gets no byte for the fence time (half the coordinator's
//! heartbeat timeout), or sees the pipe end (the agent died), stops the replica as its executor
//! does (SIGTERM, a grace period, SIGKILL). So whatever becomes of the agent (killed, frozen, cut
//! off), its replicas are gone before the coordinator gives their leases to another node, which
//! it does a whole heartbeat timeout after the node's last heartbeat.
//!
//! A guard of a process group is a member of that group: it ignores the SIGTERM it sends there
//! and dies with the group's SIGKILL. A group's id is not given to another process while any
//! process is in the group, so the guard can never signal an unrelated group that took the id
//! after the replica ended.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};

use crate::exec::{ExecError, Executor};

/// What the agent writes to every guard each time it hears from the coordinator.
pub const FEED: &[u8] = b".";
/// What a guard writes to its stdout when it stops its replica, followed by the time (Unix
/// milliseconds) and a newline: an agent that is alive after all (it was frozen, or cut off)
/// then takes the replica as fenced, not as failed, and meters it up to that time.
pub const FIRED: &[u8] = b"stopping ";

/// The guard's report: [`FIRED`] and the time it fired.
pub fn fired_report(at_ms: i64) -> Vec<u8> {
    let mut report = FIRED.to_vec();
    report.extend_from_slice(format!("{at_ms}\n").as_bytes());
    report
}

/// The time in a guard's report, if it is one.
pub fn fired_at(report: &[u8]) -> Option<i64> {
    let text = std::str::from_utf8(report.strip_prefix(FIRED)?).ok()?;
    text.trim().parse().ok()
}

fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as i64)
}

/// A guard's times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fence {
    /// The longest wait for the next byte.
    pub fence: Duration,
    /// The longest wait for the first byte: the fence less how long before the guard started
    /// the agent last heard from the coordinator.
    pub first: Duration,
    /// Between SIGTERM and SIGKILL.
    pub grace: Duration,
}

/// Why a guard stopped its replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fired {
    /// No byte for the fence time: the agent is frozen, or has not heard from the coordinator.
    Silence,
    /// The feed ended: the agent died.
    AgentGone,
}

/// Guards replica `replica` (its `handle_id`) of `executor`: waits for bytes on `feed` and,
/// when none comes in time or the feed ends, writes [`FIRED`] to `report` and stops the
/// replica. Returns why, once the replica is stopped (a guard inside the replica's process
/// group does not return: the group's SIGKILL ends it).
pub async fn run_guard<E: Executor>(
    executor: &E,
    replica: &str,
    mut feed: impl AsyncRead + Unpin,
    report: &mut impl Write,
    fence: Fence,
) -> Result<Fired, ExecError> {
    let mut deadline = tokio::time::Instant::now() + fence.first;
    let mut bytes = [0u8; 64];
    let fired = loop {
        match tokio::time::timeout_at(deadline, feed.read(&mut bytes)).await {
            Err(_) => break Fired::Silence,
            Ok(Ok(0)) => break Fired::AgentGone,
            Ok(Ok(_)) => deadline = tokio::time::Instant::now() + fence.fence,
            Ok(Err(error)) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Ok(Err(error)) => {
                tracing::warn!(%error, "the guard's feed failed; taking the agent as gone");
                break Fired::AgentGone;
            }
        }
    };
    // The agent may not be there to read it; the replica is stopped all the same.
    let _ = report.write_all(&fired_report(unix_ms())).and_then(|()| report.flush());
    match fired {
        Fired::Silence => tracing::warn!(
            replica,
            fence_ms = fence.fence.as_millis() as u64,
            "the agent has not vouched for the replica for the fence time; stopping it"
        ),
        Fired::AgentGone => tracing::warn!(replica, "the agent is gone; stopping its replica"),
    }
    executor.stop_by_id(replica, fence.grace).await?;
    Ok(fired)
}

/// One guard process, as the agent holds it.
struct GuardProcess {
    child: Child,
    feed: ChildStdin,
    report: ChildStdout,
    /// It said it fired, or ended.
    fired: bool,
    /// When it said it fired (Unix ms).
    fired_at_ms: Option<i64>,
}

impl GuardProcess {
    fn look(&mut self) -> bool {
        if !self.fired {
            let mut bytes = [0u8; 64];
            self.fired = match self.report.read(&mut bytes) {
                Ok(read) => {
                    self.fired_at_ms = fired_at(&bytes[..read]);
                    true
                }
                Err(error) => error.kind() != std::io::ErrorKind::WouldBlock,
            };
        }
        self.fired
    }
}

/// The guards of an agent's replicas, by lease id: started and ended by the agent's loop, fed
/// from a task of their own (the loop may be busy, staging a dataset for instance). Dropping the
/// last handle closes every feed, so the guards stop their replicas, as if the agent died.
#[derive(Clone, Default)]
pub struct Guards(Arc<Mutex<HashMap<i64, GuardProcess>>>);

fn set_nonblocking(fd: &impl AsRawFd) -> std::io::Result<()> {
    let fd = fd.as_raw_fd();
    // SAFETY: fcntl on a descriptor this process owns; no memory is involved.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

impl Guards {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i64, GuardProcess>> {
        // A panic while the map was held leaves it usable: every operation on it is one step.
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Starts `program agent guard ...` (the `fallow` binary) for the replica of `lease_id`.
    ///
    /// Its stdin and stdout are pipes made close-on-exec (the standard library's), so no replica
    /// or other child inherits the agent's ends: the feed ends exactly when the agent does.
    pub fn start<E: Executor>(
        &self,
        lease_id: i64,
        program: &Path,
        executor: &E,
        handle: &E::Handle,
        fence: Fence,
    ) -> std::io::Result<()> {
        let mut command = Command::new(program);
        command
            .args(["agent", "guard", "--executor", E::NAME, "--replica"])
            .arg(executor.handle_id(handle))
            .arg("--fence-ms")
            .arg(fence.fence.as_millis().to_string())
            .arg("--first-fence-ms")
            .arg(fence.first.as_millis().to_string())
            .arg("--grace-ms")
            .arg(fence.grace.as_millis().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if let Some(group) = executor.guard_group(handle) {
            // SAFETY: only async-signal-safe calls (setpgid, signal) run between fork and exec.
            unsafe {
                command.pre_exec(move || {
                    if libc::setpgid(0, group) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    libc::signal(libc::SIGTERM, libc::SIG_IGN);
                    Ok(())
                });
            }
        }
        let mut child = command.spawn()?;
        let (Some(feed), Some(report)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(std::io::Error::other("the guard's pipes were not made"));
        };
        if let Err(error) = set_nonblocking(&feed).and_then(|()| set_nonblocking(&report)) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(error);
        }
        let guard = GuardProcess {
            child,
            feed,
            report,
            fired: false,
            fired_at_ms: None,
        };
        let replaced = self.lock().insert(lease_id, guard);
        if let Some(old) = replaced {
            end_process(old);
        }
        Ok(())
    }

    /// Writes a byte to every guard. A guard that does not read (its pipe is full) is skipped:
    /// the agent never waits for one.
    pub fn feed(&self) {
        for guard in self.lock().values_mut() {
            let _ = guard.feed.write(FEED);
        }
    }

    /// The leases whose guard has stopped, or is stopping, its replica (it said so, or ended).
    pub fn fired(&self) -> Vec<i64> {
        let mut fired: Vec<i64> = self
            .lock()
            .iter_mut()
            .filter_map(|(lease, guard)| guard.look().then_some(*lease))
            .collect();
        fired.sort_unstable();
        fired
    }

    /// When the guard of `lease_id` said it stopped its replica (Unix ms), if it said so.
    pub fn fired_at(&self, lease_id: i64) -> Option<i64> {
        self.lock().get_mut(&lease_id).and_then(|guard| {
            guard.look();
            guard.fired_at_ms
        })
    }

    /// Whether the guard of `lease_id` has stopped, or is stopping, its replica. A guard says so
    /// before it signals the replica, so a replica seen ended and then this false ended on its own.
    pub fn has_fired(&self, lease_id: i64) -> bool {
        self.lock().get_mut(&lease_id).is_some_and(GuardProcess::look)
    }

    /// Ends the guard of `lease_id` (SIGKILL) and reaps it.
    pub async fn end(&self, lease_id: i64) {
        let Some(guard) = self.lock().remove(&lease_id) else {
            return;
        };
        let _ = tokio::task::spawn_blocking(move || end_process(guard)).await;
    }
}

/// SIGKILL, then wait: the child is this process's, so its id is not reused before the wait.
fn end_process(mut guard: GuardProcess) {
    let _ = guard.child.kill();
    let _ = guard.child.wait();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_guard_fires_on_silence_and_on_a_closed_feed_and_not_while_fed() {
        // An executor that only records what it was asked to stop.
        #[derive(Default)]
        struct Recorder(Mutex<Vec<(String, Duration)>>);
        impl Executor for Recorder {
            type Handle = ();
            const NAME: &'static str = "recorder";
            fn runtimes(&self) -> Vec<String> {
                Vec::new()
            }
            async fn start(&self, _: &crate::exec::RunSpec) -> Result<(), ExecError> {
                Ok(())
            }
            async fn poll_exit(&self, _: &()) -> Result<Option<crate::exec::Exit>, ExecError> {
                Ok(None)
            }
            async fn stop(&self, _: &(), _: Duration) -> Result<crate::exec::Exit, ExecError> {
                Ok(crate::exec::Exit { code: 0 })
            }
            fn image_digest(&self, _: &()) -> String {
                String::new()
            }
            fn handle_id(&self, _: &()) -> String {
                String::new()
            }
            async fn stop_by_id(&self, id: &str, grace: Duration) -> Result<(), ExecError> {
                self.0.lock().unwrap().push((id.to_string(), grace));
                Ok(())
            }
            async fn stop_leftovers(&self, _: &[crate::state::RunRecord]) {}
            async fn clean_up(&self, _: &crate::exec::RunSpec) {}
        }
        let fence = Fence {
            fence: Duration::from_millis(300),
            first: Duration::from_millis(300),
            grace: Duration::from_millis(7),
        };

        // Fed every 100 ms for a second, then not: it fires on silence, after the feeding.
        let recorder = Recorder::default();
        let (mut sender, receiver) = tokio::net::unix::pipe::pipe().unwrap();
        let feeding = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            for _ in 0..10 {
                sender.write_all(FEED).await.unwrap();
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            sender
        });
        let started = tokio::time::Instant::now();
        let mut report = Vec::new();
        let fired = run_guard(&recorder, "17", receiver, &mut report, fence).await.unwrap();
        assert_eq!(fired, Fired::Silence);
        assert!(started.elapsed() >= Duration::from_millis(1_000), "it waited while fed");
        let at = fired_at(&report).expect("the report says when");
        assert!((unix_ms() - at).abs() < 5_000, "fired just now: {at}");
        assert_eq!(
            recorder.0.lock().unwrap().clone(),
            vec![("17".to_string(), Duration::from_millis(7))]
        );
        drop(feeding.await.unwrap());

        // A feed that ends (the agent died) fires at once.
        let recorder = Recorder::default();
        let (sender, receiver) = tokio::net::unix::pipe::pipe().unwrap();
        drop(sender);
        let started = tokio::time::Instant::now();
        let fired = run_guard(&recorder, "18", receiver, &mut Vec::new(), fence)
            .await
            .unwrap();
        assert_eq!(fired, Fired::AgentGone);
        assert!(started.elapsed() < Duration::from_millis(300));
        assert_eq!(recorder.0.lock().unwrap().len(), 1);
    }

    /// The inode of the pipe behind descriptor `fd` of this process.
    fn pipe_inode(fd: &impl AsRawFd) -> u64 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(format!("/proc/self/fd/{}", fd.as_raw_fd()))
            .unwrap()
            .ino()
    }

    /// The pipes process `pid` holds open, as `pipe:[INODE]`.
    fn pipes_of(pid: u32) -> Vec<String> {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .map(|entries| {
                entries
                    .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
                    .map(|target| target.display().to_string())
                    .filter(|target| target.starts_with("pipe:"))
                    .collect()
            })
            .unwrap_or_default()
    }

    fn group_of(pid: u32) -> i32 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let (_, rest) = stat.rsplit_once(") ").unwrap();
        rest.split_whitespace().nth(2).unwrap().parse().unwrap()
    }

    #[tokio::test]
    async fn a_guard_joins_its_replicas_group_and_no_other_child_holds_its_feed() {
        use crate::exec::process::ProcessExecutor;
        let dir = std::env::temp_dir().join(format!("fallow-guard-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // A stand-in for `fallow agent guard`: notes its arguments, then reads its feed to the end.
        let program = dir.join("guard.sh");
        std::fs::write(
            &program,
            format!(
                "#!/bin/sh\necho \"$@\" > {0}/args\ncat > /dev/null\necho eof > {0}/eof\n",
                dir.display()
            ),
        )
        .unwrap();
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let spec = |lease_id: i64| crate::exec::RunSpec {
            lease_id,
            epoch: 1,
            image: "/bin/sh".into(),
            command: vec!["-c".into(), "exec sleep 30".into()],
            env: Default::default(),
            gpu_indices: vec![0],
            memory_mib: 0,
            cpu_milli: 1000,
            network: "none".into(),
            shm_mib: 0,
            scratch_dir: dir.join(format!("scratch-{lease_id}")),
            checkpoint_dir: None,
            log_path: dir.join(format!("output-{lease_id}.log")),
            datasets_dir: None,
            runtime: None,
        };
        let executor = ProcessExecutor;
        let first = executor.start(&spec(1)).await.unwrap();
        let guards = Guards::default();
        let fence = Fence {
            fence: Duration::from_millis(1500),
            first: Duration::from_millis(1200),
            grace: Duration::from_millis(750),
        };
        guards.start(1, &program, &executor, &first, fence).unwrap();
        let (guard_pid, feed_inode) = {
            let map = guards.lock();
            (map[&1].child.id(), pipe_inode(&map[&1].feed))
        };
        let start = std::time::Instant::now();
        while !dir.join("args").exists() {
            assert!(start.elapsed() < Duration::from_secs(10), "the guard never started");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(
            std::fs::read_to_string(dir.join("args")).unwrap().trim(),
            format!(
                "agent guard --executor process --replica {} --fence-ms 1500 --first-fence-ms 1200 --grace-ms 750",
                first.pgid
            )
        );
        assert_eq!(group_of(guard_pid), first.pgid, "the guard is in its replica's group");

        // A replica started after the guard does not hold the guard's feed.
        let second = executor.start(&spec(2)).await.unwrap();
        let held = pipes_of(second.pgid as u32);
        assert!(
            !held.contains(&format!("pipe:[{feed_inode}]")),
            "a replica inherited a guard's feed: {held:?}"
        );
        guards.feed();
        assert!(guards.fired().is_empty(), "a fed guard has not fired");

        // Ended by the agent: killed and reaped, its replica untouched.
        guards.end(1).await;
        assert!(
            !std::path::Path::new(&format!("/proc/{guard_pid}")).exists(),
            "the guard was reaped"
        );
        assert!(
            executor.poll_exit(&first).await.unwrap().is_none(),
            "the replica runs on"
        );

        // A guard whose feed closes (the agent is gone) sees the end.
        guards.start(2, &program, &executor, &second, fence).unwrap();
        let _ = std::fs::remove_file(dir.join("eof"));
        drop(guards);
        let start = std::time::Instant::now();
        while !dir.join("eof").exists() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the guard never saw its feed end"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for handle in [first, second] {
            executor.stop(&handle, Duration::ZERO).await.unwrap();
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
