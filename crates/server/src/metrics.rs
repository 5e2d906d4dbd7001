//! `/metrics` in the Prometheus text format: jobs by state, GPUs online and leased, decisions,
//! heartbeats, leases and their latency, refused signatures and the ledger's totals.

use std::fmt::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;

use crate::error::ApiResult;
use crate::state::AppState;

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

    fn render(&self, name: &str, help: &str, out: &mut String) {
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

pub async fn render(State(state): State<Arc<AppState>>) -> ApiResult<impl IntoResponse> {
    let mut out = String::new();
    let metrics = &state.metrics;
    let _ = writeln!(out, "# TYPE fallow_jobs gauge");
    for (job_state, count) in state.store.job_counts().await? {
        let _ = writeln!(out, "fallow_jobs{{state=\"{job_state}\"}} {count}");
    }
    let (leases, gpu_milli) = state.store.live_lease_totals().await?;
    let nodes = state.store.nodes().await?;
    let online: i64 = nodes
        .iter()
        .filter(|node| node.online)
        .map(|node| node.node.gpu_count)
        .sum();
    let _ = writeln!(out, "# TYPE fallow_gpus gauge");
    let _ = writeln!(out, "fallow_gpus{{state=\"online\"}} {online}");
    let _ = writeln!(out, "fallow_gpus{{state=\"leased\"}} {}", gpu_milli as f64 / 1000.0);
    let _ = writeln!(out, "# TYPE fallow_leases_live gauge\nfallow_leases_live {leases}");
    for (name, counter) in [
        ("fallow_jobs_submitted_total", &metrics.jobs_submitted),
        ("fallow_decisions_total", &metrics.decisions),
        ("fallow_placements_total", &metrics.placements),
        ("fallow_heartbeats_total", &metrics.heartbeats),
        ("fallow_leases_granted_total", &metrics.leases_granted),
        ("fallow_leases_lost_total", &metrics.leases_lost),
        ("fallow_leases_preempted_total", &metrics.leases_preempted),
        ("fallow_usage_records_total", &metrics.usage_records),
        ("fallow_signatures_refused_total", &metrics.signatures_refused),
        ("fallow_reconcile_passes_total", &metrics.reconcile_passes),
        ("fallow_view_rebuilds_total", &metrics.rebuilds),
        ("fallow_view_conflicts_total", &metrics.view_conflicts),
    ] {
        let _ = writeln!(out, "# TYPE {name} counter\n{name} {}", counter.load(Ordering::Relaxed));
    }
    let _ = writeln!(
        out,
        "# TYPE fallow_decision_seconds_total counter\nfallow_decision_seconds_total {}",
        metrics.decision_nanos.load(Ordering::Relaxed) as f64 / 1e9
    );
    metrics.lease_grant.render(
        "fallow_lease_grant_seconds",
        "From a job's submission to the grant of its leases (a requeued job counts from its first submission).",
        &mut out,
    );
    metrics.lease_pickup.render(
        "fallow_lease_pickup_seconds",
        "From a lease's grant to its agent's first report on it (staging or running).",
        &mut out,
    );
    let _ = writeln!(
        out,
        "# TYPE fallow_leader gauge\nfallow_leader {}",
        metrics.is_leader.load(Ordering::Relaxed)
    );
    let (balances, entries) = state.store.ledger_totals().await?;
    let _ = writeln!(out, "# TYPE fallow_ledger_sum_micros gauge");
    let _ = writeln!(out, "fallow_ledger_sum_micros{{of=\"balances\"}} {balances}");
    let _ = writeln!(out, "fallow_ledger_sum_micros{{of=\"entries\"}} {entries}");
    for (account, label) in [("platform:fees", "platform_fees"), ("external", "external")] {
        let _ = writeln!(
            out,
            "fallow_ledger_balance_micros{{account=\"{label}\"}} {}",
            state.store.balance(account).await?
        );
    }
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out))
}

#[cfg(test)]
mod tests {
    use super::*;

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
