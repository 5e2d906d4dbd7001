//! The fraud service's books (docs/trust-policy.md §§ 1, 5): leases missing from their nodes'
//! signed heartbeats (`Drops`) and the leader's count of committed window hours
//! (`WindowHours`). Plain data: `fraud` acts on what they find.

use std::collections::HashMap;
use std::sync::Mutex;

use api::AgentLease;
use serde_json::Value;
use trust::rules::Outcome;

pub const HOUR_US: i64 = 3_600_000_000;
/// Heartbeats in a row without a running lease that make it dropped (§ 5).
pub const DROP_HEARTBEATS: usize = 3;
/// A lease younger than this many heartbeat intervals is not looked for in heartbeats yet.
pub const DROP_MIN_AGE_HEARTBEATS: i64 = 2;
/// How often the leader samples which nodes are in their advertised windows, and how often
/// it writes the window hours up as reputation outcomes (§ 1).
pub const WINDOW_SAMPLE_EVERY_US: i64 = 60_000_000;
pub const WINDOW_FLUSH_EVERY_US: i64 = HOUR_US;

/// A lease missing from a node's heartbeats, and the signed heartbeats that leave it out.
struct Missing {
    epoch: i64,
    heartbeats: Vec<Value>,
}

/// Leases missing from the heartbeats of the nodes that hold them (§ 5), per replica.
#[derive(Default)]
pub struct Drops {
    missing: Mutex<HashMap<i64, HashMap<i64, Missing>>>,
}

/// A lease proven dropped: its id, epoch and the heartbeats that leave it out.
pub struct Dropped {
    pub lease: i64,
    pub epoch: i64,
    pub heartbeats: Vec<Value>,
}

impl Drops {
    /// Takes a signed heartbeat from `node` that lists `held` as the leases it runs or still
    /// reports on, against `live`, the leases the coordinator has live on it. A running lease
    /// older than `min_age_us` missing from [`DROP_HEARTBEATS`] heartbeats in a row is dropped.
    pub fn note(
        &self,
        node: i64,
        held: &[i64],
        live: &[AgentLease],
        heartbeat: Value,
        min_age_us: i64,
        now: i64,
    ) -> Vec<Dropped> {
        let mut table = self.missing.lock().expect("drops lock");
        let missing = table.entry(node).or_default();
        missing.retain(|lease, entry| {
            live.iter()
                .any(|live| live.lease.id == *lease && live.lease.epoch == entry.epoch)
        });
        let mut dropped = Vec::new();
        for live in live {
            let lease = &live.lease;
            let watched = lease.state == "running" && now - lease.created_at_us >= min_age_us;
            if !watched || held.contains(&lease.id) {
                missing.remove(&lease.id);
                continue;
            }
            let entry = missing.entry(lease.id).or_insert(Missing {
                epoch: lease.epoch,
                heartbeats: Vec::new(),
            });
            entry.heartbeats.push(heartbeat.clone());
            if entry.heartbeats.len() >= DROP_HEARTBEATS
                && let Some(entry) = missing.remove(&lease.id)
            {
                dropped.push(Dropped {
                    lease: lease.id,
                    epoch: entry.epoch,
                    heartbeats: entry.heartbeats,
                });
            }
        }
        if missing.is_empty() {
            table.remove(&node);
        }
        dropped
    }
}

/// The leader's count of committed window hours per node (§ 1): sampled every
/// `WINDOW_SAMPLE_EVERY_US`, written up as outcomes every `WINDOW_FLUSH_EVERY_US`.
#[derive(Default)]
pub struct WindowHours {
    sampled_at: i64,
    flushed_at: i64,
    /// Per node: microseconds inside its windows with heartbeats, and without.
    spans: HashMap<i64, (i64, i64)>,
}

impl WindowHours {
    /// Adds the time since the last sample to each node inside its window now: to its present
    /// time if it is heard, to its missed time if not. `in_window` lists (node, in window, heard).
    pub fn sample(&mut self, in_window: impl IntoIterator<Item = (i64, bool, bool)>, now: i64) {
        if self.sampled_at == 0 {
            self.sampled_at = now;
            self.flushed_at = now;
            return;
        }
        let step = (now - self.sampled_at).clamp(0, 2 * WINDOW_SAMPLE_EVERY_US);
        self.sampled_at = now;
        for (node, open, heard) in in_window {
            if !open {
                continue;
            }
            let span = self.spans.entry(node).or_default();
            if heard {
                span.0 += step;
            } else {
                span.1 += step;
            }
        }
    }

    /// The window hours counted for `node` and not yet written up, in thousandths.
    pub fn pending_milli(&self, node: i64) -> i64 {
        self.spans
            .get(&node)
            .map_or(0, |(present, missed)| (present + missed) * 1000 / HOUR_US)
    }

    /// Whether a sample is due.
    pub fn sample_due(&self, now: i64) -> bool {
        self.sampled_at == 0 || now - self.sampled_at >= WINDOW_SAMPLE_EVERY_US
    }

    /// The outcomes to write when a flush is due (hours as thousandths), and forgets them.
    pub fn take_due(&mut self, now: i64) -> Vec<(i64, String, i64, i64)> {
        if self.flushed_at == 0 || now - self.flushed_at < WINDOW_FLUSH_EVERY_US {
            return Vec::new();
        }
        self.flushed_at = now;
        let mut outcomes = Vec::new();
        let mut spans: Vec<(i64, (i64, i64))> = self.spans.drain().collect();
        spans.sort_unstable();
        for (node, (present, missed)) in spans {
            for (outcome, span) in [
                (Outcome::WindowHourPresent, present),
                (Outcome::WindowHourMissed, missed),
            ] {
                let weight_milli = span * 1000 / HOUR_US;
                if weight_milli > 0 {
                    outcomes.push((node, outcome.name().to_string(), weight_milli, now));
                }
            }
        }
        outcomes
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn live(id: i64, state: &str, created_at_us: i64) -> AgentLease {
        AgentLease {
            lease: api::LeaseView {
                id,
                job_id: id,
                replica: 0,
                node_id: 1,
                gpu_indices: vec![0],
                gpu_milli: 1000,
                cpu_milli: 0,
                memory_mib: 0,
                epoch: 1,
                state: state.into(),
                price_micros_per_gpu_hour: 0,
                gpu_model: String::new(),
                region: String::new(),
                created_at_us,
                expected_end_us: 0,
                preempt_at_us: None,
                ended_at_us: None,
                end_reason: String::new(),
                exit_code: None,
                output: None,
            },
            job: api::JobRequest::default(),
            gang: None,
        }
    }

    #[test]
    fn a_running_lease_missing_from_three_heartbeats_in_a_row_is_dropped() {
        let drops = Drops::default();
        let leases = [live(7, "running", 0), live(8, "running", 0), live(9, "pending", 0)];
        let beat = |n: i64| json!({"beat": n});
        // Lease 8 is listed; 9 is not running yet; 7 is missing.
        assert!(drops.note(1, &[8], &leases, beat(1), 10, 100).is_empty());
        assert!(drops.note(1, &[8], &leases, beat(2), 10, 200).is_empty());
        let dropped = drops.note(1, &[8], &leases, beat(3), 10, 300);
        assert_eq!(dropped.len(), 1);
        assert_eq!((dropped[0].lease, dropped[0].epoch), (7, 1));
        assert_eq!(dropped[0].heartbeats, vec![beat(1), beat(2), beat(3)], "the evidence");
        // Listed again in between: the count starts over.
        assert!(drops.note(1, &[], &leases, beat(4), 10, 400).is_empty());
        assert!(drops.note(1, &[7, 8], &leases, beat(5), 10, 500).is_empty());
        assert!(drops.note(1, &[8], &leases, beat(6), 10, 600).is_empty());
        assert!(drops.note(1, &[8], &leases, beat(7), 10, 700).is_empty());
        // A lease too young to be looked for, or no longer live, is never dropped.
        let young = [live(10, "running", 650)];
        for at in [700, 710, 720] {
            assert!(drops.note(2, &[], &young, beat(at), 100, at).is_empty());
        }
        assert!(drops.note(1, &[], &[], beat(8), 10, 800).is_empty());
        assert!(drops.missing.lock().unwrap().is_empty(), "ended leases are forgotten");
    }

    #[test]
    fn window_hours_count_the_time_inside_windows_heard_and_not() {
        let mut hours = WindowHours::default();
        let start = 1_000 * HOUR_US;
        hours.sample([(1, true, true)], start);
        for minute in 1..=60 {
            let at = start + minute * WINDOW_SAMPLE_EVERY_US;
            // Node 1 is in its window and heard; node 2 in its window and silent for the last
            // quarter of the hour; node 3 outside its window.
            hours.sample([(1, true, true), (2, true, minute <= 45), (3, false, true)], at);
        }
        assert_eq!(hours.pending_milli(2), 1000, "an hour counted, not yet written");
        let outcomes = hours.take_due(start + HOUR_US);
        assert_eq!(
            outcomes,
            vec![
                (1, "window_hour_present".to_string(), 1000, start + HOUR_US),
                (2, "window_hour_present".to_string(), 750, start + HOUR_US),
                (2, "window_hour_missed".to_string(), 250, start + HOUR_US),
            ]
        );
        assert!(hours.take_due(start + HOUR_US + 1).is_empty(), "written once");
    }
}
