//! The provider page: the provider's nodes (simulated ones marked), their reliability, how much
//! of the GPU time they offered was sold, and earnings over time.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::response::Response;
use ledger::Account;
use store::Role;

use super::chart::{LineChart, Series, line_chart};
use super::html::{badge, dollars, duration, escape, gpu_time, percent, stat, table};
use super::market::window_links;
use super::tenant::running_total;
use super::{PageError, PageQuery, Session, render};
use crate::extract::Auth;
use crate::state::{AppState, now_us};

/// Ledger entries of the earnings account read for the chart, newest first, at most.
const EARNINGS_ENTRIES_MAX: i64 = 10_000;

pub async fn page(
    State(state): State<Arc<AppState>>,
    session: Session,
    query: Result<Query<PageQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, PageError> {
    session.require(Role::Provider)?;
    let query = query.map(|Query(query)| query).unwrap_or_default();
    let caller = session.caller;
    let hours = query.window_hours();
    let now = now_us();
    let from = now - hours * 3_600_000_000;
    let nodes = crate::routes::list_nodes(State(state.clone()), Auth(caller)).await?.0;
    let earnings = crate::routes::earnings(State(state.clone()), Auth(caller)).await?.0;
    let per_node: BTreeMap<i64, &api::NodeEarnings> = earnings.nodes.iter().map(|node| (node.node_id, node)).collect();
    let mut entries = state
        .store
        .ledger_entries_of(
            &Account::ProviderEarnings(caller.account_id).key(),
            EARNINGS_ENTRIES_MAX,
        )
        .await?;
    let complete = (entries.len() as i64) < EARNINGS_ENTRIES_MAX;
    entries.retain(|(_, kind, amount, at)| kind == "usage" && *amount > 0 && *at >= from);
    entries.reverse();
    let earned_in_window: i64 = entries.iter().map(|(_, _, amount, _)| amount).sum();

    let online = nodes.iter().filter(|node| node.online).count();
    let gpus: i64 = nodes.iter().map(|node| node.gpu_count).sum();
    let simulated = nodes.iter().filter(|node| node.simulated).count();
    let sold_hours: f64 = earnings.nodes.iter().map(|node| node.gpu_hours_sold).sum();
    let sold = (sold_hours * 3_600_000.0).round() as i64;

    let mut body = format!("<h1>Provider: {}</h1>", escape(&session.name));
    body.push_str(&window_links("/dashboard/provider", hours));
    body.push_str("<section class=\"stats\">");
    body.push_str(&stat("earnings balance", &dollars(earnings.earnings_micros)));
    body.push_str(&stat(
        &format!("earned in the last {hours} h"),
        &dollars(earned_in_window),
    ));
    let nodes_text = if simulated > 0 {
        format!("{online} of {} ({simulated} simulated)", nodes.len())
    } else {
        format!("{online} of {}", nodes.len())
    };
    body.push_str(&stat("nodes online", &nodes_text));
    body.push_str(&stat("GPUs", &gpus.to_string()));
    body.push_str(&stat("GPU time sold", &gpu_time(sold)));
    body.push_str("</section>");

    body.push_str("<h2>Nodes</h2>");
    let rows: Vec<Vec<String>> = nodes
        .iter()
        .map(|node| {
            let mut name = escape(&node.name);
            if node.simulated {
                name.push(' ');
                name.push_str(&badge("simulated", "simulated"));
            }
            if node.over_limit_since_us.is_some() {
                name.push(' ');
                name.push_str(&badge("warning", "over its limits"));
            }
            let status = if node.online {
                badge("state-running", "online")
            } else {
                badge("state-failed", "offline")
            };
            let heard = node
                .last_heartbeat_at_us
                .map_or_else(|| "never".to_string(), |at| format!("{} ago", duration(now - at)));
            let sold = per_node.get(&node.id);
            vec![
                node.id.to_string(),
                name,
                format!("{} × {}", node.gpu_count, escape(&node.gpu_model)),
                format!("{} / {}", escape(&node.region), escape(&node.site)),
                status,
                heard,
                percent(node.reliability),
                node.live_leases.to_string(),
                sold.map_or_else(
                    || "–".to_string(),
                    |sold| gpu_time((sold.gpu_hours_sold * 3_600_000.0).round() as i64),
                ),
                sold.map_or_else(|| "–".to_string(), |sold| percent(sold.fill_rate)),
                sold.map_or_else(|| "–".to_string(), |sold| dollars(sold.earned_micros)),
            ]
        })
        .collect();
    body.push_str(&table(
        "nodes",
        &[
            "id",
            "node",
            "GPUs",
            "region / site",
            "status",
            "last heartbeat",
            "reliability",
            "live leases",
            "GPU time sold",
            "fill rate",
            "charged for its work",
        ],
        &rows,
        "No nodes yet: start fallow agent with your provider key.",
    ));
    body.push_str(
        "<p class=\"note\">Fill rate: the share of the node's GPU time since it registered that was sold. \
         Charged for its work: what tenants were charged for the node's leases, before the platform's fee. \
         Simulated nodes offer no real GPUs: their work is not billed unless the coordinator bills it as \
         play money.</p>",
    );

    body.push_str("<h2>Earnings over time</h2>");
    let series = [Series {
        label: "earned (running total)".to_string(),
        points: running_total(entries.iter().map(|(_, _, amount, at)| (*at, *amount)), from, now),
    }];
    body.push_str(&line_chart(&LineChart {
        title: "earnings over time",
        from_us: from,
        to_us: now,
        series: if earned_in_window > 0 { &series } else { &[] },
        value_label: dollars,
        running_total: true,
    }));
    if !complete {
        body.push_str(&format!(
            "<p class=\"note\">From the newest {EARNINGS_ENTRIES_MAX} ledger entries only.</p>"
        ));
    }
    Ok(render("Provider", Some(&session), &body, query.refresh_s))
}
