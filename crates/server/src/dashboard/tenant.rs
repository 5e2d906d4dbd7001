//! The tenant page: the tenant's money, its jobs with their state, price and cost, spend over
//! time, and what it paid per GPU-hour against the on-demand reference price.

use std::collections::BTreeMap;
use std::sync::Arc;

use api::{JobRequest, JobView};
use axum::extract::{Query, State};
use axum::response::Response;
use store::Role;

use super::chart::{LineChart, Series, line_chart};
use super::html::{badge, dollars, escape, gpu_time, per_gpu_hour, percent, stat, table, utc};
use super::market::{PRICE_POINTS_MAX, silver_reference, window_links};
use super::{PageError, PageQuery, Session, render};
use crate::state::AppState;

/// The newest jobs listed.
const JOBS_SHOWN: i64 = 100;
/// Usage records read for the spend chart, at most.
const USAGE_ROWS_MAX: i64 = 100_000;
/// GPU-milli-seconds in a GPU-hour.
const GPU_MILLI_SECONDS_PER_HOUR: i128 = 3_600_000;

/// What a job asks for, in a few words: `2 × 1 GPU`, `0.5 GPU`, `2.5 CU`, `CPU only`.
pub(super) fn resources(spec: &JobRequest) -> String {
    let each = match (spec.gpus, spec.gpu_share_milli, &spec.compute_units) {
        (Some(gpus), _, _) => format!("{gpus} GPU"),
        (_, Some(share), _) => format!("{:.3} GPU", f64::from(share) / 1000.0),
        (_, _, Some(units)) => format!("{units} CU"),
        _ => "CPU only".to_string(),
    };
    if spec.replicas > 1 {
        format!("{} × {each}", spec.replicas)
    } else {
        each
    }
}

/// The clearing price a job pays per GPU-hour: its leases' prices weighted by the GPU share each
/// holds; None before it has a lease.
pub(super) fn price_paid(job: &JobView) -> Option<i64> {
    let mut weighted: i128 = 0;
    let mut weights: i128 = 0;
    for lease in &job.leases {
        let weight = i128::from(lease.gpu_milli) * lease.gpu_indices.len() as i128;
        weighted += i128::from(lease.price_micros_per_gpu_hour) * weight;
        weights += weight;
    }
    if weights > 0 {
        i64::try_from(weighted / weights).ok()
    } else {
        job.leases.first().map(|lease| lease.price_micros_per_gpu_hour)
    }
}

/// A price as a share of a reference price, e.g. `92.0 %`.
pub(super) fn against(price: i64, reference: Option<i64>) -> String {
    match reference {
        Some(reference) if reference > 0 => percent(price as f64 / reference as f64),
        _ => "–".to_string(),
    }
}

/// A state as a coloured label.
pub(super) fn state_badge(state: &str) -> String {
    badge(&format!("state-{state}"), state)
}

/// The running total of `(at, amount)` from zero at `from_us` to `to_us`.
pub(super) fn running_total(amounts: impl Iterator<Item = (i64, i64)>, from_us: i64, to_us: i64) -> Vec<(i64, i64)> {
    let mut total = 0i64;
    let mut points = vec![(from_us, 0)];
    for (at, amount) in amounts {
        total = total.saturating_add(amount);
        points.push((at, total));
    }
    points.push((to_us, total));
    points
}

pub async fn page(
    State(state): State<Arc<AppState>>,
    session: Session,
    query: Result<Query<PageQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, PageError> {
    session.require(Role::Tenant)?;
    let query = query.map(|Query(query)| query).unwrap_or_default();
    let caller = session.caller;
    let hours = query.window_hours();
    let now = state.now_us();
    let from = now - hours * 3_600_000_000;
    let balance = crate::routes::own_balance(state.clone(), caller).await?;
    let jobs = crate::routes::jobs_page(state.clone(), caller, None, JOBS_SHOWN)
        .await?
        .jobs;
    let ids: Vec<i64> = jobs.iter().map(|job| job.id).collect();
    let totals: BTreeMap<i64, (i64, i64)> = state
        .store
        .usage_totals_of_jobs(&ids)
        .await?
        .into_iter()
        .map(|usage| (usage.job_id, (usage.charged_micros, usage.gpu_seconds_milli)))
        .collect();
    let usage = state
        .store
        .usage_of_tenant_since(caller.account_id, from, USAGE_ROWS_MAX)
        .await?;
    let reference = silver_reference(&state.store.price_points(from, PRICE_POINTS_MAX).await?);

    let spent: i64 = usage.iter().map(|row| row.charged_micros).sum();
    let metered: i64 = usage.iter().map(|row| row.gpu_seconds_milli).sum();
    // Paid against the reference, over the listed jobs with metered GPU time.
    let (mut paid_total, mut reference_total) = (0i128, 0i128);
    for job in &jobs {
        let (Some((charged, metered)), Some(lease)) = (totals.get(&job.id), job.leases.first()) else {
            continue;
        };
        if let Some(price) = reference.get(&lease.gpu_model) {
            paid_total += i128::from(*charged);
            reference_total += i128::from(*price) * i128::from(*metered) / GPU_MILLI_SECONDS_PER_HOUR;
        }
    }

    let mut body = format!("<h1>Tenant: {}</h1>", escape(&session.name));
    body.push_str(&window_links("/dashboard/tenant", hours));
    body.push_str("<section class=\"stats\">");
    body.push_str(&stat("available", &dollars(balance.available_micros)));
    body.push_str(&stat("held in escrow", &dollars(balance.escrow_micros)));
    body.push_str(&stat(&format!("spent in the last {hours} h"), &dollars(spent)));
    body.push_str(&stat("GPU time used", &gpu_time(metered)));
    if metered > 0 {
        let average = i128::from(spent) * GPU_MILLI_SECONDS_PER_HOUR / i128::from(metered);
        // To the cent: usage is charged in whole micro-dollars, so the average is off in its last digits.
        let average = (average + 5_000) / 10_000 * 10_000;
        body.push_str(&stat("paid per GPU-hour", &per_gpu_hour(average as i64)));
    }
    if reference_total > 0 {
        body.push_str(&stat(
            "paid against on-demand reference",
            &percent(paid_total as f64 / reference_total as f64),
        ));
    }
    body.push_str("</section>");

    body.push_str("<h2>Jobs</h2>");
    let rows: Vec<Vec<String>> = jobs
        .iter()
        .map(|job| {
            let name = if job.spec.name.is_empty() {
                "(no name)"
            } else {
                job.spec.name.as_str()
            };
            let paid = price_paid(job);
            let model_reference = job
                .leases
                .first()
                .and_then(|lease| reference.get(&lease.gpu_model).copied());
            let (charged, _) = totals.get(&job.id).copied().unwrap_or((0, 0));
            vec![
                format!("<a href=\"/dashboard/jobs/{id}\">#{id}</a>", id = job.id),
                format!("<a href=\"/dashboard/jobs/{}\">{}</a>", job.id, escape(name)),
                state_badge(&job.state),
                escape(&job.tier),
                escape(&resources(&job.spec)),
                utc(job.submitted_at_us),
                paid.map_or_else(|| "–".to_string(), per_gpu_hour),
                model_reference.map_or_else(|| "–".to_string(), per_gpu_hour),
                paid.map_or_else(|| "–".to_string(), |paid| against(paid, model_reference)),
                dollars(charged),
            ]
        })
        .collect();
    body.push_str(&table(
        "jobs",
        &[
            "job",
            "name",
            "state",
            "tier",
            "asks for",
            "submitted",
            "price paid",
            "on-demand reference",
            "paid / reference",
            "cost",
        ],
        &rows,
        "No jobs yet: submit one with fallow job submit or POST /v1/jobs.",
    ));
    if jobs.len() as i64 == JOBS_SHOWN {
        body.push_str(&format!("<p class=\"note\">The newest {JOBS_SHOWN} jobs.</p>"));
    }

    body.push_str(&services_section(&state, &caller).await?);

    body.push_str("<h2>Spend over time</h2>");
    let series = [Series {
        label: "spent (running total)".to_string(),
        points: running_total(usage.iter().map(|row| (row.received_at, row.charged_micros)), from, now),
    }];
    body.push_str(&line_chart(&LineChart {
        title: "spend over time",
        from_us: from,
        to_us: now,
        series: if spent > 0 { &series } else { &[] },
        value_label: dollars,
        running_total: true,
    }));
    body.push_str(
        "<p class=\"note\">Price paid: the clearing price of the job's leases. On-demand reference: the median \
         silver (on-demand) clearing price of the same GPU model in this window; the coordinator reads no outside \
         price feed. Usage on simulated GPUs is billed only as play money, when the coordinator is told to.</p>",
    );
    Ok(render("Tenant", Some(&session), &body, query.refresh_s))
}

/// A chart's points: (µs, value).
type Points = Vec<(i64, i64)>;

/// Seconds per point of a service's charts (its stats are sampled each second).
const SERVICE_CHART_STEP_S: usize = 10;

/// Requests/s and p95 latency (ms) of a service, one point per `SERVICE_CHART_STEP_S` of its
/// samples (µs, stats then).
pub(super) fn service_series(samples: &[(i64, crate::gateway::ServiceStats)]) -> (Points, Points) {
    let (mut rate, mut p95) = (Vec::new(), Vec::new());
    let points: Vec<&(i64, crate::gateway::ServiceStats)> = samples.iter().step_by(SERVICE_CHART_STEP_S).collect();
    for pair in points.windows(2) {
        let ((from, before), (to, after)) = (pair[0], pair[1]);
        let window = after.since(before);
        let seconds = ((to - from) as f64 / 1e6).max(1e-3);
        rate.push((*to, (window.requests as f64 / seconds).round() as i64));
        if let Some(ms) = window.quantile_ms(0.95) {
            p95.push((*to, ms.round() as i64));
        }
    }
    (rate, p95)
}

/// The tenant's services: scale, traffic, latency, tokens, cost per million tokens, and charts
/// of requests/s and p95 latency over the last minutes (as this gateway sampled them).
async fn services_section(state: &AppState, caller: &crate::state::Caller) -> Result<String, PageError> {
    let services = crate::routes::services_page(state, caller).await?.services;
    let mut out = String::from("<h2>Services</h2>");
    let rows: Vec<Vec<String>> = services
        .iter()
        .map(|service| {
            let deployed = service.deployed.as_ref();
            vec![
                escape(&service.name),
                deployed.map_or("–".into(), |d| d.version.to_string()),
                format!(
                    "{} / {}",
                    service.replicas.len(),
                    deployed.map_or(0, |d| d.desired_replicas)
                ),
                format!("{:.1}", service.requests_per_sec),
                service.p95_ms.map_or("–".into(), |ms| format!("{ms:.1} ms")),
                service.errors.to_string(),
                service.tokens.to_string(),
                dollars(service.cost_micros),
                service.cost_per_million_tokens_micros.map_or("–".into(), dollars),
                escape(deployed.map_or("", |d| d.status.as_str())),
            ]
        })
        .collect();
    out.push_str(&table(
        "services",
        &[
            "service",
            "version",
            "ready / wanted",
            "requests/s",
            "p95",
            "errors",
            "tokens",
            "GPU cost",
            "per 1M tokens",
            "status",
        ],
        &rows,
        "No services: deploy one with fallow service deploy or POST /v1/services.",
    ));
    for service in &services {
        let samples = state.gateway.history(caller.account_id, &service.name);
        let (Some((from, _)), Some((to, _))) = (samples.first(), samples.last()) else {
            continue;
        };
        let (rate, p95) = service_series(&samples);
        out.push_str(&format!("<h3>{}</h3>", escape(&service.name)));
        let charts = [
            (
                "requests per second",
                "requests/s",
                rate,
                (|value| format!("{value}/s")) as fn(i64) -> String,
            ),
            ("p95 latency", "p95 (ms)", p95, |value| format!("{value} ms")),
        ];
        for (title, label, points, value_label) in charts {
            let series = [Series {
                label: label.to_string(),
                points,
            }];
            out.push_str(&line_chart(&LineChart {
                title,
                from_us: *from,
                to_us: *to,
                series: if series[0].points.is_empty() { &[] } else { &series },
                value_label,
                running_total: false,
            }));
        }
    }
    out.push_str(
        "<p class=\"note\">Per 1M tokens: the usage billed for the service's replicas over the tokens its \
         answers reported (OpenAI-style usage objects). Requests, latency and tokens are this gateway's since it \
         started; the charts cover the last ten minutes at most.</p>",
    );
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_services_charts_read_its_samples_in_steps() {
        use crate::gateway::{Gateway, Outcome};
        let gateway = Gateway::default();
        // Twenty-one samples a second apart; in the second ten seconds, 50 requests of 20 ms.
        for second in 0..=20i64 {
            if second > 10 {
                for _ in 0..5 {
                    let outcome = Outcome {
                        error: false,
                        micros: 20_000,
                        tokens: None,
                    };
                    gateway.record(1, "chat", outcome);
                }
            }
            gateway.sample(1, "chat", second * 1_000_000);
        }
        let (rate, p95) = service_series(&gateway.history(1, "chat"));
        assert_eq!(rate, [(10_000_000, 0), (20_000_000, 5)]);
        assert_eq!(p95.len(), 1);
        assert_eq!(p95[0].0, 20_000_000);
        // Within the 10 % of its bucket.
        assert!((20..=22).contains(&p95[0].1), "{p95:?}");
    }

    #[test]
    fn resources_read_in_a_few_words() {
        let mut spec = JobRequest {
            gpus: Some(2),
            replicas: 3,
            ..JobRequest::default()
        };
        assert_eq!(resources(&spec), "3 × 2 GPU");
        spec.gpus = None;
        spec.gpu_share_milli = Some(500);
        spec.replicas = 1;
        assert_eq!(resources(&spec), "0.500 GPU");
        spec.gpu_share_milli = None;
        assert_eq!(resources(&spec), "CPU only");
    }

    #[test]
    fn a_running_total_starts_at_zero_and_ends_now() {
        assert_eq!(
            running_total([(5, 10), (7, 5)].into_iter(), 0, 9),
            [(0, 0), (5, 10), (7, 15), (9, 15)]
        );
        assert_eq!(against(1_500_000, Some(2_000_000)), "75.0 %");
        assert_eq!(against(1_500_000, None), "–");
    }
}
