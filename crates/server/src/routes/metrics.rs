//! `/metrics` in the Prometheus text format: jobs by state, GPUs online and leased, decisions,
//! heartbeats, leases and their latency, refused signatures and the ledger's totals. Read with an
//! admin's API key or the metrics token (`MetricsReader`).

use std::fmt::Write;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;

use crate::error::ApiResult;
use crate::extract::MetricsReader;
use crate::state::AppState;

pub async fn metrics(_reader: MetricsReader, State(state): State<Arc<AppState>>) -> ApiResult<impl IntoResponse> {
    let mut out = String::new();
    let metrics = &state.metrics;
    let _ = writeln!(out, "# TYPE fallow_jobs gauge");
    for count in state.store.job_counts().await? {
        let _ = writeln!(out, "fallow_jobs{{state=\"{}\"}} {}", count.state, count.jobs);
    }
    let live = state.store.live_lease_totals().await?;
    let (leases, gpu_milli) = (live.leases, live.gpu_milli);
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
        ("fallow_view_grows_total", &metrics.grows),
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
    let totals = state.store.ledger_totals().await?;
    let (balances, entries) = (totals.balances, totals.entries);
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
    let services = state.gateway.all_stats();
    if !services.is_empty() {
        let _ = writeln!(out, "# TYPE fallow_service_requests_total counter");
        let _ = writeln!(out, "# TYPE fallow_service_errors_total counter");
        let _ = writeln!(out, "# TYPE fallow_service_tokens_total counter");
        let _ = writeln!(out, "# TYPE fallow_service_latency_ms gauge");
    }
    for ((tenant, name), stats) in &services {
        let labels = format!("tenant=\"{tenant}\",service=\"{name}\"");
        let _ = writeln!(out, "fallow_service_requests_total{{{labels}}} {}", stats.requests);
        let _ = writeln!(out, "fallow_service_errors_total{{{labels}}} {}", stats.errors);
        let _ = writeln!(
            out,
            "fallow_service_tokens_total{{{labels},kind=\"prompt\"}} {}",
            stats.prompt_tokens
        );
        let _ = writeln!(
            out,
            "fallow_service_tokens_total{{{labels},kind=\"completion\"}} {}",
            stats.completion_tokens
        );
        for (quantile, label) in [(0.5, "0.5"), (0.95, "0.95"), (0.99, "0.99")] {
            if let Some(ms) = stats.quantile_ms(quantile) {
                let _ = writeln!(
                    out,
                    "fallow_service_latency_ms{{{labels},quantile=\"{label}\"}} {ms:.3}"
                );
            }
        }
    }
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out))
}
