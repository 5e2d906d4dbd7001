//! What the agent keeps in its data directory: the node's key (owner-only), the node id the
//! coordinator gave it, the replicas it started (so a restarted agent can stop those whose
//! leases it no longer holds), and beside each lease's log how much of it the coordinator has.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use trust::NodeKey;

/// The node's ed25519 secret key, 64 hex characters, mode 0600.
pub const KEY_FILE: &str = "node.key";
/// The registration: node id and coordinator.
pub const NODE_FILE: &str = "node.json";
/// Replicas started and not yet known to be gone.
pub const RUNS_FILE: &str = "runs.json";

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeState {
    pub node_id: i64,
    pub coordinator: String,
}

/// A replica this agent started: enough to stop it after a restart.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRecord {
    pub lease_id: i64,
    pub epoch: i64,
    /// What the executor needs to find it again: a process group id, a container id.
    pub id: String,
}

/// How much of a replica's log the coordinator has, kept beside the log (`log_cursor_path`) so
/// that an agent that runs the lease again, at the same epoch, sends on from there: the log
/// file keeps what the earlier replica wrote, and the coordinator keeps a chunk per offset, the
/// first it was sent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogCursor {
    pub epoch: i64,
    /// Bytes of the log the coordinator has taken.
    pub sent: u64,
    /// The end of the chunk last sent and not yet known to be taken; `sent` when none. It is
    /// sent again exactly as it was: the coordinator may have stored it before the answer was
    /// lost, and a longer chunk at the same offset would be dropped whole as a repeat.
    pub sending: u64,
}

/// Where the cursor of the log at `log_path` is kept.
pub fn log_cursor_path(log_path: &Path) -> PathBuf {
    log_path.with_extension("cursor.json")
}

pub fn read_log_cursor(log_path: &Path) -> std::io::Result<Option<LogCursor>> {
    read_json(&log_cursor_path(log_path))
}

pub fn write_log_cursor(log_path: &Path, cursor: &LogCursor) -> std::io::Result<()> {
    write_atomically(
        &log_cursor_path(log_path),
        &serde_json::to_vec(cursor).map_err(std::io::Error::other)?,
    )
}

fn io_error(path: &Path, error: std::io::Error) -> std::io::Error {
    std::io::Error::new(error.kind(), format!("{}: {error}", path.display()))
}

/// Writes `contents` to `path` through a temporary file and a rename, owner-only.
fn write_atomically(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    let temporary: PathBuf = path.with_extension("tmp");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&temporary)
        .map_err(|error| io_error(&temporary, error))?;
    file.write_all(contents)?;
    file.sync_all()?;
    std::fs::rename(&temporary, path).map_err(|error| io_error(path, error))
}

/// The node's key from the data directory, made (mode 0600) on first start. True when new.
pub fn load_or_create_key(dir: &Path) -> std::io::Result<(NodeKey, bool)> {
    std::fs::create_dir_all(dir).map_err(|error| io_error(dir, error))?;
    let path = dir.join(KEY_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let key = NodeKey::from_hex(&text).map_err(|error| {
                std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{}: {error}", path.display()))
            })?;
            Ok((key, false))
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            let key = NodeKey::generate();
            write_atomically(&path, format!("{}\n", key.to_hex()).as_bytes())?;
            Ok((key, true))
        }
        Err(error) => Err(io_error(&path, error)),
    }
}

/// A new key waiting for the coordinator to accept it (`rotate_key`).
pub const PENDING_KEY_FILE: &str = "node.key.new";

/// The node's key, which must exist (an error names the file otherwise).
pub fn load_key(dir: &Path) -> std::io::Result<NodeKey> {
    let path = dir.join(KEY_FILE);
    let text = std::fs::read_to_string(&path).map_err(|error| io_error(&path, error))?;
    NodeKey::from_hex(&text)
        .map_err(|error| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{}: {error}", path.display())))
}

/// Writes `key` beside the current one (mode 0600) until the coordinator accepts it.
pub fn write_pending_key(dir: &Path, key: &NodeKey) -> std::io::Result<()> {
    write_atomically(&dir.join(PENDING_KEY_FILE), format!("{}\n", key.to_hex()).as_bytes())
}

/// Makes the pending key the node's key.
pub fn commit_pending_key(dir: &Path) -> std::io::Result<()> {
    let (from, to) = (dir.join(PENDING_KEY_FILE), dir.join(KEY_FILE));
    std::fs::rename(&from, &to).map_err(|error| io_error(&to, error))
}

fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> std::io::Result<Option<T>> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|error| {
            std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{}: {error}", path.display()))
        }),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(io_error(path, error)),
    }
}

pub fn read_node(dir: &Path) -> std::io::Result<Option<NodeState>> {
    read_json(&dir.join(NODE_FILE))
}

pub fn write_node(dir: &Path, node: &NodeState) -> std::io::Result<()> {
    write_atomically(
        &dir.join(NODE_FILE),
        &serde_json::to_vec_pretty(node).map_err(std::io::Error::other)?,
    )
}

pub fn read_runs(dir: &Path) -> std::io::Result<Vec<RunRecord>> {
    Ok(read_json(&dir.join(RUNS_FILE))?.unwrap_or_default())
}

pub fn write_runs(dir: &Path, runs: &[RunRecord]) -> std::io::Result<()> {
    write_atomically(
        &dir.join(RUNS_FILE),
        &serde_json::to_vec(runs).map_err(std::io::Error::other)?,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_key_is_made_once_owner_only_and_read_back() {
        let dir = std::env::temp_dir().join(format!("fallow-agent-state-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (first, created) = load_or_create_key(&dir).unwrap();
        assert!(created);
        let mode = std::fs::metadata(dir.join(KEY_FILE)).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "the private key is the owner's alone");
        let (again, created) = load_or_create_key(&dir).unwrap();
        assert!(!created);
        assert_eq!(first.public_hex(), again.public_hex());
        std::fs::write(dir.join(KEY_FILE), "not hex").unwrap();
        let error = load_or_create_key(&dir).unwrap_err();
        assert!(error.to_string().contains(KEY_FILE), "{error}");

        assert_eq!(read_node(&dir).unwrap(), None);
        let node = NodeState {
            node_id: 7,
            coordinator: "http://x".into(),
        };
        write_node(&dir, &node).unwrap();
        assert_eq!(read_node(&dir).unwrap(), Some(node));
        let runs = vec![RunRecord {
            lease_id: 3,
            epoch: 1,
            id: "99".into(),
        }];
        write_runs(&dir, &runs).unwrap();
        assert_eq!(read_runs(&dir).unwrap(), runs);

        let log = dir.join("output.log");
        assert_eq!(read_log_cursor(&log).unwrap(), None);
        let cursor = LogCursor {
            epoch: 2,
            sent: 10,
            sending: 25,
        };
        write_log_cursor(&log, &cursor).unwrap();
        assert_eq!(read_log_cursor(&log).unwrap(), Some(cursor));
        assert_eq!(log_cursor_path(&log), dir.join("output.cursor.json"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
