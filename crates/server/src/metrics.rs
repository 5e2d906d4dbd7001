//! The coordinator's counters and latency histograms, rendered at `/metrics`
//! (`routes::metrics`).

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// The upper bounds (seconds) of the latency histograms' buckets.
pub const LATENCY_BUCKETS_S: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// A Prometheus histogram of durations, with the buckets of `LATENCY_BUCKETS_S`.
#[derive(Default)]
pub struct Histogram {
    /// Observations at or under each bound (not cumulative; summed when rendered).
    buckets: [AtomicU64; LATENCY_BUCKETS_S.len()],
    sum_micros: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    /// Counts one duration in microseconds (a negative one, from clocks apart, as zero).
    pub fn observe_us(&self, micros: i64) {
        let micros = micros.max(0) as u64;
        let seconds = micros as f64 / 1e6;
        if let Some(bucket) = LATENCY_BUCKETS_S.iter().position(|bound| seconds <= *bound) {
            self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        }
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    pub fn render(&self, name: &str, help: &str, out: &mut String) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (bound, bucket) in LATENCY_BUCKETS_S.iter().zip(&self.buckets) {
            cumulative += bucket.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(
            out,
            "{name}_sum {}\n{name}_count {count}",
            self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6
        );
    }
}

/// Counters for `/metrics`.
#[derive(Default)]
pub struct Metrics {
    pub jobs_submitted: AtomicU64,
    pub decisions: AtomicU64,
    pub placements: AtomicU64,
    pub decision_nanos: AtomicU64,
    pub heartbeats: AtomicU64,
    pub leases_granted: AtomicU64,
    pub leases_lost: AtomicU64,
    pub leases_preempted: AtomicU64,
    pub usage_records: AtomicU64,
    pub signatures_refused: AtomicU64,
    pub reconcile_passes: AtomicU64,
    pub rebuilds: AtomicU64,
    /// Rebuilds that read only the nodes registered since (`reconcile::grow_view`).
    pub grows: AtomicU64,
    /// Stored live leases a rebuilt view could not hold (always a bug; see `fleet::Conflict`).
    pub view_conflicts: AtomicU64,
    pub is_leader: AtomicU64,
    pub lease_grant: Histogram,
    pub lease_pickup: Histogram,
    /// Each placement's job and when its write committed, while switched on (`bench api`).
    pub grants: GrantLog,
}

/// Which jobs were granted leases, and when their placement committed (µs on the coordinator's
/// clock): kept only while on, for a benchmark to time every submission to its grant.
#[derive(Default)]
pub struct GrantLog {
    on: std::sync::atomic::AtomicBool,
    granted: std::sync::Mutex<Vec<(i64, i64)>>,
}

impl GrantLog {
    /// Starts keeping grants (forgetting any kept).
    pub fn start(&self) {
        self.granted.lock().expect("grant log lock").clear();
        self.on.store(true, Ordering::Relaxed);
    }

    /// Job `job_id` was granted its leases, committed at `at`.
    pub fn granted(&self, job_id: i64, at: i64) {
        if self.on.load(Ordering::Relaxed) {
            self.granted.lock().expect("grant log lock").push((job_id, at));
        }
    }

    /// The grants kept so far: (job, committed at µs).
    pub fn taken(&self) -> Vec<(i64, i64)> {
        self.granted.lock().expect("grant log lock").clone()
    }
}

impl Metrics {
    pub fn add(counter: &AtomicU64, value: u64) {
        counter.fetch_add(value, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_are_kept_only_once_started() {
        let log = GrantLog::default();
        log.granted(1, 10);
        assert!(log.taken().is_empty(), "off until started");
        log.start();
        log.granted(2, 20);
        log.granted(3, 30);
        assert_eq!(log.taken(), vec![(2, 20), (3, 30)]);
        log.start();
        assert!(log.taken().is_empty(), "a start forgets what was kept");
    }

    #[test]
    fn a_histogram_renders_cumulative_buckets_a_sum_and_a_count() {
        let histogram = Histogram::default();
        for micros in [-5, 3_000, 10_000, 40_000, 400_000_000] {
            histogram.observe_us(micros);
        }
        let mut out = String::new();
        histogram.render("x_seconds", "test", &mut out);
        let value = |series: &str| {
            out.lines()
                .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
                .unwrap_or_else(|| panic!("no {series} in\n{out}"))
                .to_string()
        };
        assert_eq!(
            value("x_seconds_bucket{le=\"0.005\"}"),
            "2",
            "the negative one counts as zero"
        );
        assert_eq!(value("x_seconds_bucket{le=\"0.01\"}"), "3", "a bound is inclusive");
        assert_eq!(value("x_seconds_bucket{le=\"0.05\"}"), "4");
        assert_eq!(value("x_seconds_bucket{le=\"300\"}"), "4", "past the last bound");
        assert_eq!(value("x_seconds_bucket{le=\"+Inf\"}"), "5");
        assert_eq!(value("x_seconds_count"), "5");
        assert_eq!(value("x_seconds_sum"), "400.053");
        assert!(out.contains("# TYPE x_seconds histogram"));
    }
}
