//! The job page: what the job asked for, its timeline (queued, pending, staging, running,
//! preempted…), its price and cost (and cost per unit of work where the job reports progress),
//! its leases and its logs. Only the job's tenant (or an admin) sees it; anyone else gets 404.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Arc;

use api::{JobView, LeaseView};
use axum::extract::{Query, State};
use axum::response::Response;
use store::LeaseEvent;

use super::chart::{Span, timeline};
use super::html::{badge, dollars, escape, per_gpu_hour, stat, table, utc};
use super::tenant::{price_paid, resources, state_badge};
use super::{PageError, PageQuery, Session, render};
use crate::extract::{Auth, Path};
use crate::state::AppState;

/// One moment of the job's life, for the list under the timeline.
struct Moment {
    at_us: i64,
    what: String,
}

/// A lease's states in time order, from its grant (pending) to its end (if it ended), each
/// with when it began.
fn lease_states(lease: &LeaseView, events: &[LeaseEvent]) -> Vec<(String, i64)> {
    let mut states = vec![("pending".to_string(), lease.created_at_us)];
    for event in events.iter().filter(|event| event.epoch <= lease.epoch) {
        if states.last().is_none_or(|(state, _)| *state != event.kind) {
            states.push((event.kind.clone(), event.at));
        }
    }
    if let Some(ended_at) = lease.ended_at_us
        && states.last().is_none_or(|(state, _)| *state != lease.state)
    {
        states.push((lease.state.clone(), ended_at));
    }
    states
}

/// The timeline's rows: the job's waits in the queue, then one row per lease.
fn timeline_rows(job: &JobView, states: &[(&LeaseView, Vec<(String, i64)>)], now_us: i64) -> Vec<(String, Vec<Span>)> {
    // The wait for the first lease, and, for a job queued again (preempted, lost), the wait since
    // its last lease ended.
    let first_lease = job.leases.iter().map(|lease| lease.created_at_us).min();
    let mut waits = vec![Span {
        state: "queued".into(),
        from_us: job.submitted_at_us,
        to_us: first_lease.unwrap_or(now_us),
    }];
    if job.state == "queued"
        && let Some(last_end) = job.leases.iter().filter_map(|lease| lease.ended_at_us).max()
    {
        waits.push(Span {
            state: "queued".into(),
            from_us: last_end,
            to_us: now_us,
        });
    }
    let mut rows = vec![("job".to_string(), waits)];
    for (lease, states) in states {
        let live = lease.ended_at_us.is_none();
        let spans = states
            .iter()
            .enumerate()
            .map(|(index, (state, from_us))| {
                let to_us = match states.get(index + 1) {
                    Some((_, next)) => *next,
                    None if live => now_us,
                    None => *from_us,
                };
                Span {
                    state: state.clone(),
                    from_us: *from_us,
                    to_us,
                }
            })
            .collect();
        rows.push((format!("replica {} · lease {}", lease.replica, lease.id), spans));
    }
    rows
}

pub async fn page(
    State(state): State<Arc<AppState>>,
    session: Session,
    Path(id): Path<i64>,
    query: Result<Query<PageQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, PageError> {
    let query = query.map(|Query(query)| query).unwrap_or_default();
    let caller = session.caller;
    // The API's own read: another tenant's job answers 404 here exactly as there.
    let job = crate::routes::show_job(State(state.clone()), Auth(caller), Path(id))
        .await?
        .0;
    let after = query.after.unwrap_or(0).max(0);
    let logs = crate::routes::job_logs_page(state.clone(), caller, id, after).await?;
    let now = state.now_us();
    let mut leases: Vec<&LeaseView> = job.leases.iter().collect();
    leases.sort_by_key(|lease| (lease.created_at_us, lease.id));
    let mut lease_states_of = Vec::with_capacity(leases.len());
    let mut nodes: BTreeMap<i64, (String, bool)> = BTreeMap::new();
    for lease in &leases {
        let events = state.store.lease_events(lease.id).await?;
        lease_states_of.push((*lease, lease_states(lease, &events)));
        if let std::collections::btree_map::Entry::Vacant(entry) = nodes.entry(lease.node_id)
            && let Some(node) = state.store.node(lease.node_id).await?
        {
            entry.insert((node.node.region.clone(), node.node.simulated));
        }
    }
    let node_label = |node_id: i64| {
        let mut label = format!("node {node_id}");
        if let Some((region, simulated)) = nodes.get(&node_id) {
            let _ = write!(label, " ({})", escape(region));
            if *simulated {
                label.push(' ');
                label.push_str(&badge("simulated", "simulated"));
            }
        }
        label
    };

    let name = if job.spec.name.is_empty() {
        "(no name)"
    } else {
        job.spec.name.as_str()
    };
    let mut body = format!(
        "<h1>Job #{}: <span class=\"job-name\">{}</span> {}</h1>",
        job.id,
        escape(name),
        state_badge(&job.state)
    );
    if !job.state_reason.is_empty() {
        body.push_str(&format!("<p class=\"reason\">{}</p>", escape(&job.state_reason)));
    }
    if let Some(explanation) = &job.explanation {
        body.push_str(&format!(
            "<p class=\"explanation\">Why it waits: {}</p>",
            escape(explanation)
        ));
    }

    body.push_str("<section class=\"stats\">");
    let paid = price_paid(&job);
    body.push_str(&stat(
        "price",
        &paid.map_or_else(|| "not placed yet".to_string(), per_gpu_hour),
    ));
    body.push_str(&stat("cost", &dollars(job.cost_micros)));
    body.push_str(&stat("held in escrow", &dollars(job.escrow_micros)));
    if let Some(progress) = &job.progress {
        body.push_str(&stat(&format!("{} done", progress.unit), &progress.done.to_string()));
        body.push_str(&stat(
            &format!("cost per million {}", progress.unit),
            &dollars(progress.cost_micros_per_million_units),
        ));
    }
    body.push_str("</section>");

    let spec = &job.spec;
    let command = spec.command.iter().map(|arg| escape(arg)).collect::<Vec<_>>().join(" ");
    let facts = [
        ("tier", escape(&job.tier)),
        ("class", escape(&spec.class)),
        ("asks for", escape(&resources(spec))),
        (
            "runtime",
            escape(spec.runtime.as_deref().unwrap_or("whatever the node runs")),
        ),
        ("image or program", format!("<code>{}</code>", escape(&spec.image))),
        ("command", format!("<code>{command}</code>")),
        (
            "most it pays",
            escape(&format!("${}/GPU-h", spec.max_price_per_gpu_hour)),
        ),
        ("submitted", utc(job.submitted_at_us)),
        ("last change", utc(job.updated_at_us)),
    ];
    body.push_str("<dl class=\"facts\">");
    for (term, value) in facts {
        let _ = write!(body, "<dt>{term}</dt><dd>{value}</dd>");
    }
    body.push_str("</dl>");

    body.push_str("<h2>Timeline</h2>");
    let end = if job.state == "queued" || job.leases.iter().any(|lease| lease.ended_at_us.is_none()) {
        now
    } else {
        job.leases
            .iter()
            .filter_map(|lease| lease.ended_at_us)
            .max()
            .unwrap_or(job.updated_at_us)
            .max(job.submitted_at_us + 1)
    };
    body.push_str(&timeline(
        &timeline_rows(&job, &lease_states_of, now),
        job.submitted_at_us,
        end,
    ));
    let mut moments = vec![Moment {
        at_us: job.submitted_at_us,
        what: "submitted".to_string(),
    }];
    for (lease, states) in &lease_states_of {
        for (index, (state, at)) in states.iter().enumerate() {
            let what = if index == 0 {
                format!(
                    "lease {} granted on {} at {}",
                    lease.id,
                    node_label(lease.node_id),
                    per_gpu_hour(lease.price_micros_per_gpu_hour)
                )
            } else if lease.ended_at_us == Some(*at) && *state == lease.state && !lease.end_reason.is_empty() {
                format!("lease {} {} ({})", lease.id, escape(state), escape(&lease.end_reason))
            } else {
                format!("lease {} {}", lease.id, escape(state))
            };
            moments.push(Moment { at_us: *at, what });
        }
    }
    if !matches!(job.state.as_str(), "queued" | "running") {
        moments.push(Moment {
            at_us: job.updated_at_us,
            what: format!("job {}", escape(&job.state)),
        });
    }
    moments.sort_by_key(|moment| moment.at_us);
    body.push_str("<ol class=\"events\">");
    for moment in &moments {
        let _ = write!(body, "<li><time>{}</time> {}</li>", utc(moment.at_us), moment.what);
    }
    body.push_str("</ol>");

    body.push_str("<h2>Leases</h2>");
    let rows: Vec<Vec<String>> = leases
        .iter()
        .map(|lease| {
            vec![
                lease.id.to_string(),
                lease.replica.to_string(),
                node_label(lease.node_id),
                format!(
                    "{} × {} ({}‰ each)",
                    lease.gpu_indices.len(),
                    escape(&lease.gpu_model),
                    lease.gpu_milli
                ),
                state_badge(&lease.state),
                per_gpu_hour(lease.price_micros_per_gpu_hour),
                utc(lease.created_at_us),
                lease.ended_at_us.map_or_else(|| "–".to_string(), utc),
                escape(&lease.end_reason),
            ]
        })
        .collect();
    body.push_str(&table(
        "leases",
        &[
            "lease", "replica", "node", "GPUs", "state", "price", "granted", "ended", "end",
        ],
        &rows,
        "No leases yet.",
    ));

    body.push_str("<h2>Logs</h2>");
    if logs.chunks.is_empty() {
        body.push_str("<p class=\"empty\">No output yet.</p>");
    } else {
        let mut per_lease: BTreeMap<(i64, i64), String> = BTreeMap::new();
        for chunk in &logs.chunks {
            per_lease
                .entry((chunk.replica, chunk.lease_id))
                .or_default()
                .push_str(&chunk.text);
        }
        for ((replica, lease), text) in &per_lease {
            let _ = write!(
                body,
                "<h3>replica {replica} · lease {lease}</h3><pre class=\"logs\">{}</pre>",
                escape(text)
            );
        }
        if logs.chunks.len() as i64 == api::PAGE_SIZE_MAX {
            let _ = write!(
                body,
                "<p><a href=\"/dashboard/jobs/{}?after={}\">more output</a></p>",
                job.id, logs.next_after
            );
        }
    }
    let refresh = query.refresh_s.filter(|seconds| *seconds > 0);
    if refresh.is_none() && matches!(job.state.as_str(), "queued" | "running") {
        let _ = write!(
            body,
            "<p class=\"controls\"><a href=\"/dashboard/jobs/{}?refresh_s=5\">reload every 5 s while it runs</a></p>",
            job.id
        );
    }
    Ok(render(&format!("Job #{}", job.id), Some(&session), &body, refresh))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(state: &str, created: i64, ended: Option<i64>) -> LeaseView {
        LeaseView {
            id: 7,
            job_id: 1,
            replica: 0,
            node_id: 3,
            gpu_indices: vec![0],
            gpu_milli: 1000,
            cpu_milli: 1000,
            memory_mib: 1024,
            epoch: 1,
            state: state.into(),
            price_micros_per_gpu_hour: 2_000_000,
            gpu_model: "H100-SXM5".into(),
            region: "local".into(),
            created_at_us: created,
            expected_end_us: 0,
            preempt_at_us: None,
            ended_at_us: ended,
            end_reason: String::new(),
            exit_code: None,
            output: None,
        }
    }

    fn event(kind: &str, at: i64) -> LeaseEvent {
        LeaseEvent {
            id: 0,
            lease_id: 7,
            epoch: 1,
            kind: kind.into(),
            detail: String::new(),
            at,
        }
    }

    #[test]
    fn a_lease_runs_through_its_states_to_its_end() {
        let ended = lease("finished", 10, Some(50));
        let events = [event("staging", 20), event("running", 30), event("finished", 50)];
        let states = lease_states(&ended, &events);
        let names: Vec<(&str, i64)> = states.iter().map(|(state, at)| (state.as_str(), *at)).collect();
        assert_eq!(
            names,
            [("pending", 10), ("staging", 20), ("running", 30), ("finished", 50)]
        );

        let preempted = lease("preempted", 10, Some(40));
        let states = lease_states(&preempted, &[event("running", 30)]);
        assert_eq!(
            states.last(),
            Some(&("preempted".to_string(), 40)),
            "the coordinator's end"
        );
    }

    #[test]
    fn the_timeline_shows_the_wait_then_each_lease() {
        let ended = lease("finished", 10, Some(50));
        let job = JobView {
            id: 1,
            tenant_id: 2,
            state: "finished".into(),
            state_reason: String::new(),
            tier: "silver".into(),
            submitted_at_us: 0,
            updated_at_us: 50,
            spec: api::JobRequest::default(),
            leases: vec![ended.clone()],
            cost_micros: 0,
            escrow_micros: 0,
            explanation: None,
            progress: None,
            exit_code: None,
            capacity: None,
        };
        let states = [(
            &ended,
            lease_states(&ended, &[event("running", 30), event("finished", 50)]),
        )];
        let rows = timeline_rows(&job, &states, 100);
        assert_eq!(rows.len(), 2);
        let wait: Vec<(&str, i64, i64)> = rows[0]
            .1
            .iter()
            .map(|span| (span.state.as_str(), span.from_us, span.to_us))
            .collect();
        assert_eq!(wait, [("queued", 0, 10)]);
        let spans: Vec<(&str, i64, i64)> = rows[1]
            .1
            .iter()
            .map(|span| (span.state.as_str(), span.from_us, span.to_us))
            .collect();
        assert_eq!(spans, [("pending", 10, 30), ("running", 30, 50), ("finished", 50, 50)]);
    }
}
