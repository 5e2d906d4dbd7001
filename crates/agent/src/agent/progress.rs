//! Reporting a replica's progress: the last complete `COUNT UNIT` line of its progress file,
//! sent when it says something new.

use super::Agent;
use crate::exec::Executor;

/// The last complete `COUNT UNIT` line of a progress file.
///
/// Only the file's tail is read (a valid line is far shorter), since a replica may append to it
/// for its whole life and the agent looks every tick.
fn read_progress(path: &std::path::Path) -> Option<(i64, String)> {
    use std::io::{Read, Seek, SeekFrom};
    const TAIL_BYTES: u64 = 4096;
    let mut file = std::fs::File::open(path).ok()?;
    let length = file.metadata().ok()?.len();
    file.seek(SeekFrom::Start(length.saturating_sub(TAIL_BYTES))).ok()?;
    let mut bytes = Vec::with_capacity(TAIL_BYTES as usize);
    file.read_to_end(&mut bytes).ok()?;
    let text = String::from_utf8_lossy(&bytes);
    let complete = text.rsplit_once('\n').map_or("", |(lines, _)| lines);
    let line = complete.lines().rev().find(|line| !line.trim().is_empty())?;
    let (count, unit) = line.trim().split_once(char::is_whitespace)?;
    let count: i64 = count.parse().ok().filter(|count| *count >= 0)?;
    let unit = unit.trim();
    (!unit.is_empty() && unit.len() <= 32 && unit.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
        .then(|| (count, unit.to_string()))
}

impl<E: Executor> Agent<E> {
    /// Reports replica `id`'s progress when its progress file says something new.
    pub(super) async fn report_progress(&mut self, id: i64) {
        let Some(run) = self.runs.get(&id) else { return };
        let path = run.spec.scratch_dir.join(crate::exec::PROGRESS_FILE);
        let Some(progress) = read_progress(&path) else { return };
        if run.progress_sent.as_ref() == Some(&progress) {
            return;
        }
        let request = api::ProgressRequest {
            epoch: run.lease.lease.epoch,
            unit: progress.1.clone(),
            done: progress.0,
        };
        match self.client.progress(&self.key, self.node_id, id, &request).await {
            Ok(()) => {
                if let Some(run) = self.runs.get_mut(&id) {
                    run.progress_sent = Some(progress);
                }
            }
            Err(error) => {
                tracing::warn!(lease = id, %error, "progress was not taken");
                self.pacer.failed(&error);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_complete_progress_line_counts() {
        let path = std::env::temp_dir().join(format!("fallow-progress-{}", std::process::id()));
        let read = |text: &str| {
            std::fs::write(&path, text).unwrap();
            read_progress(&path)
        };
        assert_eq!(read("100 tokens\n250 tokens\n"), Some((250, "tokens".into())));
        assert_eq!(
            read("100 tokens\n25"),
            Some((100, "tokens".into())),
            "a line being written waits"
        );
        assert_eq!(read("7 samples\n\n"), Some((7, "samples".into())));
        assert_eq!(read("-3 tokens\n"), None);
        assert_eq!(read("12 to kens\n"), None);
        assert_eq!(read("lots tokens\n"), None);
        assert_eq!(read(""), None);
        let _ = std::fs::remove_file(&path);
    }
}
