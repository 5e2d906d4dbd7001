//! Heartbeats, kept in memory and written to the store in batches.
//!
//! A fleet of 125,000 nodes beating every 10 s is 12,500 heartbeats a second; writing each one
//! (a row of the nodes table, rewritten whole) cost more than the rest of the request. So this
//! replica remembers each node's last heartbeat and telemetry, and `flush` writes a node's row
//! only when it matters:
//! - at the node's first heartbeat here, when its datasets change, and when it was quiet long
//!   enough that the leader may have taken it off line: at once (`urgent`);
//! - otherwise at most every `persist_every_us`, in one batch a second.
//!
//! The row's `last_heartbeat_at` thus lags the truth by at most `persist_every_us` plus one
//! heartbeat interval, which `persist_every` keeps under the heartbeat timeout, so no beating
//! node is ever found silent. The API shows this replica's newer telemetry where it has it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use store::Heartbeat;

use crate::state::{AppState, Config};

/// How often the batch of due heartbeats is written.
pub const FLUSH_EVERY: Duration = Duration::from_secs(1);
/// The longest a node's stored heartbeat may go unrefreshed while it beats.
pub const PERSIST_EVERY_MAX_US: i64 = 15_000_000;
/// Rows per flush transaction: the writers' turn passes between them, so a submission waits
/// for one of these at most, not for the whole flush.
const FLUSH_ROWS_MAX: usize = 512;

/// How long a node's stored heartbeat may go unrefreshed: at most `PERSIST_EVERY_MAX_US`, and
/// short enough that the stored time plus one interval stays inside the timeout with room for
/// another interval (0, every beat written, when the timeout is that short).
pub fn persist_every_us(config: &Config) -> i64 {
    let (timeout, interval) = (config.heartbeat_timeout_us(), config.heartbeat_interval_us());
    (timeout.saturating_sub(interval.saturating_mul(2)) / 2).clamp(0, PERSIST_EVERY_MAX_US)
}

/// What this replica last heard from one node.
struct Beat {
    at: i64,
    telemetry: String,
    fingerprint: Option<String>,
    datasets: Option<String>,
    /// When the store last got this node's heartbeat (0: never from this replica).
    persisted_at: i64,
    /// A heartbeat waits to be written; `datasets_changed` says whether with its datasets.
    due: bool,
    datasets_changed: bool,
}

/// What the caller must still do for a heartbeat `Beats::note` took.
pub struct Noted {
    /// The fingerprint differs from the last one this replica saw (or it saw none): check it
    /// against the store.
    pub fingerprint_to_check: bool,
}

#[derive(Default)]
pub struct Beats {
    nodes: Mutex<HashMap<i64, Beat>>,
    urgent: tokio::sync::Notify,
}

impl Beats {
    /// Takes a heartbeat of `node` at `now`.
    pub fn note(
        &self,
        node: i64,
        now: i64,
        telemetry: String,
        fingerprint: Option<&str>,
        datasets: Option<String>,
        persist_every_us: i64,
    ) -> Noted {
        let mut nodes = self.nodes.lock().expect("beats lock");
        let beat = nodes.entry(node).or_insert_with(|| Beat {
            at: 0,
            telemetry: String::new(),
            fingerprint: None,
            datasets: None,
            persisted_at: 0,
            due: false,
            datasets_changed: false,
        });
        let fingerprint_to_check = fingerprint.is_some_and(|new| beat.fingerprint.as_deref() != Some(new));
        if let Some(new) = fingerprint {
            beat.fingerprint = Some(new.to_string());
        }
        let datasets_changed = datasets.is_some() && datasets != beat.datasets;
        if datasets_changed {
            beat.datasets = datasets;
            beat.datasets_changed = true;
        }
        let quiet = now - beat.persisted_at;
        let urgent = beat.persisted_at == 0 || datasets_changed || quiet >= 2 * persist_every_us;
        beat.at = now;
        beat.telemetry = telemetry;
        beat.due |= urgent || quiet >= persist_every_us;
        drop(nodes);
        if urgent {
            self.urgent.notify_one();
        }
        Noted { fingerprint_to_check }
    }

    /// The last heartbeat this replica took from `node`: its time and telemetry (JSON).
    pub fn last(&self, node: i64) -> Option<(i64, String)> {
        let nodes = self.nodes.lock().expect("beats lock");
        nodes.get(&node).map(|beat| (beat.at, beat.telemetry.clone()))
    }

    /// Takes up to `max` heartbeats due to be written.
    fn take_due(&self, max: usize) -> Vec<Heartbeat> {
        let mut nodes = self.nodes.lock().expect("beats lock");
        let mut due = Vec::new();
        for (node, beat) in nodes.iter_mut().filter(|(_, beat)| beat.due).take(max) {
            beat.due = false;
            due.push(Heartbeat {
                node_id: *node,
                at: beat.at,
                telemetry: beat.telemetry.clone(),
                datasets: if std::mem::take(&mut beat.datasets_changed) {
                    beat.datasets.clone()
                } else {
                    None
                },
            });
        }
        due
    }

    /// Marks heartbeats written, or due again when the write failed.
    fn written(&self, beats: &[Heartbeat], ok: bool) {
        let mut nodes = self.nodes.lock().expect("beats lock");
        for written in beats {
            if let Some(beat) = nodes.get_mut(&written.node_id) {
                if ok {
                    beat.persisted_at = beat.persisted_at.max(written.at);
                } else {
                    beat.due = true;
                    beat.datasets_changed |= written.datasets.is_some();
                }
            }
        }
    }
}

/// Writes due heartbeats every `FLUSH_EVERY`, or at once for an urgent one, until `shutdown`
/// turns true; then writes what is left.
pub async fn run(state: Arc<AppState>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    loop {
        let stopping = *shutdown.borrow();
        flush(&state).await;
        if stopping {
            return;
        }
        tokio::select! {
            () = state.beats.urgent.notified() => {}
            () = tokio::time::sleep(FLUSH_EVERY) => {}
            _ = shutdown.changed() => {}
        }
    }
}

/// Writes every heartbeat due now; a failed batch stays due for the next flush.
pub async fn flush(state: &AppState) {
    loop {
        let due = state.beats.take_due(FLUSH_ROWS_MAX);
        if due.is_empty() {
            return;
        }
        let result = {
            let _turn = state.writer_turn().await;
            state.store.record_heartbeats(&due).await
        };
        let full = due.len() == FLUSH_ROWS_MAX;
        state.beats.written(&due, result.is_ok());
        if let Err(error) = result {
            tracing::warn!(%error, rows = due.len(), "could not write heartbeats; retrying");
            return;
        }
        if !full {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EVERY: i64 = 10_000_000;

    fn note(beats: &Beats, node: i64, now: i64, datasets: Option<&str>) {
        beats.note(
            node,
            now,
            format!("t{now}"),
            Some("fp"),
            datasets.map(str::to_string),
            EVERY,
        );
    }

    #[test]
    fn a_beat_is_written_when_new_when_its_datasets_change_and_when_its_row_is_old() {
        let beats = Beats::default();
        note(&beats, 1, 100, None);
        let first = beats.take_due(10);
        assert_eq!(first.len(), 1, "the first heartbeat is written");
        beats.written(&first, true);
        note(&beats, 1, 100 + EVERY / 2, None);
        assert!(beats.take_due(10).is_empty(), "a recent row is not rewritten");
        assert_eq!(beats.last(1), Some((100 + EVERY / 2, format!("t{}", 100 + EVERY / 2))));
        note(&beats, 1, 100 + EVERY / 2 + 1, Some("[\"d\"]"));
        let changed = beats.take_due(10);
        assert_eq!(
            changed[0].datasets.as_deref(),
            Some("[\"d\"]"),
            "new datasets are written"
        );
        beats.written(&changed, false);
        let retried = beats.take_due(10);
        assert_eq!(
            retried[0].datasets.as_deref(),
            Some("[\"d\"]"),
            "a failed write is retried whole"
        );
        beats.written(&retried, true);
        note(&beats, 1, 100 + EVERY, Some("[\"d\"]"));
        assert!(beats.take_due(10).is_empty(), "the same datasets again are no change");
        note(&beats, 1, 200 + EVERY * 2, Some("[\"d\"]"));
        let old = beats.take_due(10);
        assert_eq!(
            (old.len(), old[0].datasets.as_deref()),
            (1, None),
            "an old row is refreshed"
        );
    }

    #[test]
    fn a_fingerprint_is_checked_when_it_differs_from_the_last_one_seen() {
        let beats = Beats::default();
        let check = |fingerprint: Option<&str>| {
            beats
                .note(1, 1, String::new(), fingerprint, None, EVERY)
                .fingerprint_to_check
        };
        assert!(check(Some("a")));
        assert!(!check(Some("a")));
        assert!(!check(None));
        assert!(check(Some("b")));
    }

    #[test]
    fn the_stored_beat_stays_inside_the_timeout() {
        let config = |interval_ms, timeout_ms| Config {
            heartbeat_interval_ms: interval_ms,
            heartbeat_timeout_ms: timeout_ms,
            ..Config::default()
        };
        for (interval_ms, timeout_ms) in [(10_000, 45_000), (10_000, 600_000), (10_000, 1_500), (1_000, 3_000)] {
            let every = persist_every_us(&config(interval_ms, timeout_ms));
            let interval = interval_ms as i64 * 1000;
            assert!((0..=PERSIST_EVERY_MAX_US).contains(&every));
            assert!(
                every == 0 || every + interval < timeout_ms as i64 * 1000,
                "{interval_ms}/{timeout_ms}: a row {every} µs old plus an interval is past the timeout"
            );
        }
    }
}
