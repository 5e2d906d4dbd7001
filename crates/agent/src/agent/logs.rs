//! Shipping each replica's output to the coordinator in chunks, with a cursor kept beside the log
//! so that a restarted agent sends on from where the coordinator has it, and a line in the log
//! where output may be missing after a restart.

use std::time::Duration;

use super::{Agent, now_ms};
use crate::exec::{Executor, RunSpec};
use crate::state;

/// The most bytes of a replica's output sent in one chunk.
pub const LOG_CHUNK_BYTES: usize = 48 * 1024;
/// How long a replica's end waits for the last of its output to reach its log file.
pub const LOG_SETTLE: Duration = Duration::from_millis(200);

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

impl<E: Executor> Agent<E> {
    /// Where shipping the log of a replica about to start begins (`resume_log`); when an
    /// earlier run of this agent left this lease's replica running, a line in the log says that
    /// output may be missing before the new replica's.
    pub(super) fn resume_log_of(&mut self, spec: &RunSpec) -> state::LogCursor {
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
    pub(super) async fn ship_log(&mut self, id: i64) -> bool {
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
                self.pacer.succeeded();
                true
            }
            Err(error) => {
                tracing::warn!(lease = id, %error, "a chunk of output was not taken");
                self.pacer.failed(&error);
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
