//! Heartbeats, kept in memory and written to the store in batches.
//!
//! A fleet of 125,000 nodes beating every 10 s is 12,500 heartbeats a second; writing each one
//! (a row of the nodes table) cost more than the rest of the request. So this replica remembers
//! each node's last heartbeat and telemetry, and `flush` writes a node's row only when it
//! matters (`heartbeats` writes them):
//! - at once (`urgent`): at the node's first heartbeat here, when its datasets change, after a
//!   gap of half a heartbeat timeout (the leader may have found it silent), and when its row is
//!   old enough that a leader elsewhere may;
//! - otherwise at most every `Persist::every_us`, in one batch a second.
//!
//! How stale a row may be depends on who reads it. The leader finds nodes silent from the
//! store's rows *and* its own memory (`Beats::heard_since`), and a new leader finds no node
//! silent before it has led for a whole heartbeat timeout (see `reconcile`). So the rows of
//! beats the leader took itself may lag by `LEADER_PERSIST_EVERY_US`; they matter only to
//! other replicas' readers. A follower's rows are what the leader sees of its nodes: they lag
//! the truth by at most `Persist::every_us` plus one heartbeat interval, which stays inside the
//! heartbeat timeout, so no beating node is ever found silent. The API shows this replica's
//! newer telemetry where it has it.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use store::Heartbeat;

use crate::config::Config;

/// The longest a follower's stored heartbeat may go unrefreshed while the node beats.
pub const PERSIST_EVERY_MAX_US: i64 = 15_000_000;
/// The longest the leader's stored heartbeat may go unrefreshed while the node beats: with
/// 125,000 nodes it writes about 2,100 rows a second, not the 8,300 of a 15 s interval.
pub const LEADER_PERSIST_EVERY_US: i64 = 60_000_000;
/// When a replica writes a beating node's row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Persist {
    /// A beating node's row is rewritten at most this often.
    pub every_us: i64,
    /// A beat this long after the previous one here is written at once.
    pub after_gap_us: i64,
}

/// How this replica persists heartbeats. A follower keeps its rows fresh enough for the leader:
/// at most `PERSIST_EVERY_MAX_US`, and short enough that the stored time plus one interval stays
/// inside the timeout with room for another interval (0, every beat written, when the timeout is
/// that short). The leader reads its own memory, and writes every `LEADER_PERSIST_EVERY_US`.
pub fn persist(config: &Config, leading: bool) -> Persist {
    let (timeout, interval) = (config.heartbeat_timeout_us(), config.heartbeat_interval_us());
    let every_us = if leading {
        LEADER_PERSIST_EVERY_US
    } else {
        (timeout.saturating_sub(interval.saturating_mul(2)) / 2).clamp(0, PERSIST_EVERY_MAX_US)
    };
    Persist {
        every_us,
        after_gap_us: timeout / 2,
    }
}

/// A node's own interval between routine writes of its row: `every_us` less up to half of it,
/// by node. Rows written together (a fleet's first heartbeats after a start or a failover)
/// would otherwise all come due again in the same second, `every_us` later, and keep the
/// writers' turn from submissions and placements; spread, they come due over half an interval
/// and drift further apart with each write.
fn spread_every(every_us: i64, node: i64) -> i64 {
    // Fibonacci hashing: consecutive node ids land far apart in [0, 1).
    let share = (node as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 11;
    let share = share as f64 / (1u64 << 53) as f64;
    every_us - (every_us as f64 * share / 2.0) as i64
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
    /// Whether the last heartbeat said the node was over its owner's limits.
    over_limit: Option<bool>,
}

/// What the caller must still do for a heartbeat `Beats::note` took.
pub struct Noted {
    /// The fingerprint differs from the last one this replica saw (or it saw none): check it
    /// against the store.
    pub fingerprint_to_check: bool,
}

/// What a heartbeat's over-limit flag means for the store (see `Beats::over_limit_change`).
/// A node within its limits that the store has over them (another replica, or this one before
/// a restart, set the flag) is cleared by the batched heartbeat write (`Heartbeat::within_limits`),
/// so the first heartbeat here reads nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OverLimitChange {
    Unchanged,
    /// Write the flag now.
    Changed,
}

#[derive(Default)]
struct Table {
    nodes: HashMap<i64, Beat>,
    /// The nodes whose `due` turned true, in that order (each once).
    due: VecDeque<i64>,
}

impl Table {
    fn mark_due(&mut self, node: i64) {
        if let Some(beat) = self.nodes.get_mut(&node)
            && !beat.due
        {
            beat.due = true;
            self.due.push_back(node);
        }
    }
}

/// Heartbeats whose GPU utilisation is kept per node, for the usage cross-check
/// (docs/trust-policy.md § 4): enough to cover a usage record's period several times over.
pub const UTILISATION_SAMPLES_KEPT: usize = 8;
/// A heartbeat's time and each GPU's utilisation in percent ([`NOT_READ`] where it said nothing).
type UtilisationSample = (i64, [u8; 16]);
/// A GPU a heartbeat did not report on.
const NOT_READ: u8 = u8::MAX;

#[derive(Default)]
pub struct Beats {
    table: Mutex<Table>,
    pub urgent: tokio::sync::Notify,
    /// Per node, its last heartbeats' time and each GPU's utilisation in percent.
    utilisation: Mutex<HashMap<i64, VecDeque<UtilisationSample>>>,
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
        persist: Persist,
    ) -> Noted {
        let mut table = self.table.lock().expect("beats lock");
        let beat = table.nodes.entry(node).or_insert_with(|| Beat {
            at: 0,
            telemetry: String::new(),
            fingerprint: None,
            datasets: None,
            persisted_at: 0,
            due: false,
            datasets_changed: false,
            over_limit: None,
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
        let urgent = beat.persisted_at == 0
            || datasets_changed
            || now - beat.at >= persist.after_gap_us
            || quiet >= 2 * persist.every_us;
        beat.at = now;
        beat.telemetry = telemetry;
        if urgent || quiet >= spread_every(persist.every_us, node) {
            table.mark_due(node);
        }
        drop(table);
        if urgent {
            self.urgent.notify_one();
        }
        Noted { fingerprint_to_check }
    }

    /// Notes whether `node` (whose heartbeat `note` took) says it is over its owner's limits,
    /// and says what the store must learn of it. Call after `note`.
    pub fn over_limit_change(&self, node: i64, over: bool) -> OverLimitChange {
        let mut table = self.table.lock().expect("beats lock");
        let Some(beat) = table.nodes.get_mut(&node) else {
            return OverLimitChange::Unchanged;
        };
        match beat.over_limit.replace(over) {
            Some(before) if before == over => OverLimitChange::Unchanged,
            Some(_) => OverLimitChange::Changed,
            None if over => OverLimitChange::Changed,
            None => OverLimitChange::Unchanged,
        }
    }

    /// Keeps the GPU utilisation a heartbeat of `node` reported at `at`.
    pub fn note_utilisation(&self, node: i64, at: i64, gpus: &[api::GpuTelemetry]) {
        if gpus.is_empty() {
            return;
        }
        let mut percent = [NOT_READ; 16];
        for gpu in gpus {
            if let Some(slot) = percent.get_mut(usize::from(gpu.index)) {
                *slot = gpu.utilisation_pct.clamp(0.0, 100.0).round() as u8;
            }
        }
        let mut kept = self.utilisation.lock().expect("utilisation lock");
        let samples = kept.entry(node).or_default();
        if samples.len() >= UTILISATION_SAMPLES_KEPT {
            samples.pop_front();
        }
        samples.push_back((at, percent));
    }

    /// The highest mean utilisation of `gpus` (per mille) among the heartbeats of `node` this
    /// replica took from `from` to `to` that read all of them, when there are at least
    /// `at_least` of those.
    pub fn utilisation_over(&self, node: i64, gpus: &[u8], (from, to): (i64, i64), at_least: usize) -> Option<i64> {
        if gpus.is_empty() {
            return None;
        }
        let kept = self.utilisation.lock().expect("utilisation lock");
        let means: Vec<i64> = kept
            .get(&node)?
            .iter()
            .filter(|(at, _)| (from..=to).contains(at))
            .filter_map(|(_, percent)| {
                let read: Vec<i64> = gpus
                    .iter()
                    .map(|gpu| percent.get(usize::from(*gpu)).copied().unwrap_or(NOT_READ))
                    .take_while(|value| *value != NOT_READ)
                    .map(i64::from)
                    .collect();
                (read.len() == gpus.len()).then(|| read.iter().sum::<i64>() * 10 / gpus.len() as i64)
            })
            .collect();
        (means.len() >= at_least).then(|| means.into_iter().max().unwrap_or(0))
    }

    /// The last heartbeat this replica took from `node`: its time and telemetry (JSON).
    pub fn last(&self, node: i64) -> Option<(i64, String)> {
        let table = self.table.lock().expect("beats lock");
        table.nodes.get(&node).map(|beat| (beat.at, beat.telemetry.clone()))
    }

    /// Whether this replica took a heartbeat of `node` at or after `since`.
    pub fn heard_since(&self, node: i64, since: i64) -> bool {
        let table = self.table.lock().expect("beats lock");
        table.nodes.get(&node).is_some_and(|beat| beat.at >= since)
    }

    /// Takes up to `max` heartbeats due to be written, the longest due first.
    pub fn take_due(&self, max: usize) -> Vec<Heartbeat> {
        let mut table = self.table.lock().expect("beats lock");
        let Table { nodes, due } = &mut *table;
        let mut taken = Vec::new();
        while taken.len() < max
            && let Some(node) = due.pop_front()
        {
            let Some(beat) = nodes.get_mut(&node) else { continue };
            beat.due = false;
            taken.push(Heartbeat {
                node_id: node,
                at: beat.at,
                telemetry: beat.telemetry.clone(),
                datasets: if std::mem::take(&mut beat.datasets_changed) {
                    beat.datasets.clone()
                } else {
                    None
                },
                within_limits: beat.over_limit == Some(false),
            });
        }
        taken
    }

    /// Makes every heartbeat newer than its stored row due (before a clean stop).
    pub fn all_due(&self) {
        let mut table = self.table.lock().expect("beats lock");
        let unwritten: Vec<i64> = table
            .nodes
            .iter()
            .filter(|(_, beat)| beat.at > beat.persisted_at)
            .map(|(node, _)| *node)
            .collect();
        for node in unwritten {
            table.mark_due(node);
        }
    }

    /// Marks heartbeats written, or due again when the write failed.
    pub fn written(&self, beats: &[Heartbeat], ok: bool) {
        let mut table = self.table.lock().expect("beats lock");
        for written in beats {
            if ok {
                if let Some(beat) = table.nodes.get_mut(&written.node_id) {
                    beat.persisted_at = beat.persisted_at.max(written.at);
                }
            } else {
                table.mark_due(written.node_id);
                if let Some(beat) = table.nodes.get_mut(&written.node_id) {
                    beat.datasets_changed |= written.datasets.is_some();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EVERY: i64 = 10_000_000;
    const PERSIST: Persist = Persist {
        every_us: EVERY,
        after_gap_us: 4 * EVERY,
    };

    fn note(beats: &Beats, node: i64, now: i64, datasets: Option<&str>) {
        beats.note(
            node,
            now,
            format!("t{now}"),
            Some("fp"),
            datasets.map(str::to_string),
            PERSIST,
        );
    }

    #[test]
    fn utilisation_is_read_over_a_period_when_enough_heartbeats_fall_in_it() {
        let beats = Beats::default();
        let gpu = |index: u8, pct: f64| api::GpuTelemetry {
            index,
            utilisation_pct: pct,
            ..api::GpuTelemetry::default()
        };
        for (at, busy) in [(10, 0.0), (20, 1.0), (30, 90.0), (40, 0.4)] {
            beats.note_utilisation(7, at, &[gpu(0, busy), gpu(1, 50.0)]);
        }
        assert_eq!(
            beats.utilisation_over(7, &[0], (10, 20), 2),
            Some(10),
            "1 % is 10 per mille"
        );
        assert_eq!(
            beats.utilisation_over(7, &[0], (10, 40), 3),
            Some(900),
            "the highest heartbeat"
        );
        assert_eq!(
            beats.utilisation_over(7, &[0, 1], (40, 40), 1),
            Some(250),
            "the mean of the GPUs"
        );
        assert_eq!(beats.utilisation_over(7, &[0], (10, 20), 3), None, "too few heartbeats");
        assert_eq!(beats.utilisation_over(8, &[0], (0, 100), 1), None, "a node not heard");
        assert_eq!(
            beats.utilisation_over(7, &[2], (0, 100), 1),
            None,
            "a GPU never reported"
        );
        beats.note_utilisation(9, 10, &[]);
        assert_eq!(
            beats.utilisation_over(9, &[0], (0, 100), 1),
            None,
            "a heartbeat without telemetry"
        );
        for at in 100..120 {
            beats.note_utilisation(7, at, &[gpu(0, 0.0)]);
        }
        assert_eq!(beats.utilisation_over(7, &[0], (0, 1000), 1), Some(0));
        assert_eq!(
            beats.utilisation.lock().unwrap()[&7].len(),
            UTILISATION_SAMPLES_KEPT,
            "only the last heartbeats are kept"
        );
    }

    #[test]
    fn rows_written_together_come_due_spread_over_half_an_interval() {
        let every = 60_000_000;
        let mut buckets = [0usize; 10];
        for node in 1..=10_000 {
            let own = spread_every(every, node);
            assert!((every / 2..=every).contains(&own), "node {node}: {own}");
            buckets[((every - own) * 20 / every).min(9) as usize] += 1;
        }
        for (bucket, count) in buckets.iter().enumerate() {
            assert!(
                (800..=1_200).contains(count),
                "tenth {bucket} of the spread holds {count} of 10,000"
            );
        }
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
                .note(1, 1, String::new(), fingerprint, None, PERSIST)
                .fingerprint_to_check
        };
        assert!(check(Some("a")));
        assert!(!check(Some("a")));
        assert!(!check(None));
        assert!(check(Some("b")));
    }

    #[test]
    fn a_beat_after_a_long_gap_is_written_at_once() {
        let beats = Beats::default();
        let persist = Persist {
            every_us: 60 * EVERY,
            after_gap_us: 2 * EVERY,
        };
        let note = |now| beats.note(7, now, format!("t{now}"), None, None, persist);
        note(100);
        beats.written(&beats.take_due(10), true);
        note(100 + EVERY);
        assert!(beats.take_due(10).is_empty(), "a beat on time waits for its row's age");
        note(100 + 3 * EVERY);
        assert_eq!(
            beats.take_due(10).iter().map(|beat| beat.at).collect::<Vec<_>>(),
            vec![100 + 3 * EVERY],
            "a beat after a gap is written, though the row is young"
        );
        assert!(beats.heard_since(7, 100 + 3 * EVERY));
        assert!(!beats.heard_since(7, 101 + 3 * EVERY));
        assert!(!beats.heard_since(8, 0), "never heard");
    }

    #[test]
    fn due_beats_leave_in_order_at_most_max_at_a_time_and_all_unwritten_ones_before_a_stop() {
        let beats = Beats::default();
        for node in [5, 3, 9] {
            note(&beats, node, 100, None);
        }
        let first = beats.take_due(2);
        assert_eq!(first.iter().map(|beat| beat.node_id).collect::<Vec<_>>(), vec![5, 3]);
        let rest = beats.take_due(2);
        assert_eq!(rest.iter().map(|beat| beat.node_id).collect::<Vec<_>>(), vec![9]);
        beats.written(&first, true);
        beats.written(&rest, true);
        note(&beats, 3, 200, None);
        assert!(beats.take_due(10).is_empty(), "a recent row is not rewritten");
        beats.all_due();
        let before_stop = beats.take_due(10);
        assert_eq!(
            before_stop
                .iter()
                .map(|beat| (beat.node_id, beat.at))
                .collect::<Vec<_>>(),
            vec![(3, 200)],
            "only the beat newer than its row is written before a stop"
        );
        beats.all_due();
        beats.all_due();
        assert_eq!(beats.take_due(10).len(), 1, "a node is due once, however often marked");
    }

    #[test]
    fn the_stored_beat_stays_inside_the_timeout() {
        let config = |interval_ms, timeout_ms| Config {
            heartbeat_interval_ms: interval_ms,
            heartbeat_timeout_ms: timeout_ms,
            ..Config::default()
        };
        for (interval_ms, timeout_ms) in [(10_000, 45_000), (10_000, 600_000), (10_000, 1_500), (1_000, 3_000)] {
            let timeout = timeout_ms as i64 * 1000;
            let every = persist(&config(interval_ms, timeout_ms), false).every_us;
            let interval = interval_ms as i64 * 1000;
            assert!((0..=PERSIST_EVERY_MAX_US).contains(&every));
            assert!(
                every == 0 || every + interval < timeout,
                "{interval_ms}/{timeout_ms}: a row {every} µs old plus an interval is past the timeout"
            );
            let leading = persist(&config(interval_ms, timeout_ms), true);
            assert_eq!(leading.every_us, LEADER_PERSIST_EVERY_US, "the leader reads its memory");
            assert!(
                leading.after_gap_us < timeout,
                "a beat after a gap the leader may have called silence is written at once"
            );
        }
    }
}
