//! The HTTP API under `/v1`: tenants, providers, agents (signed), admins, and the public
//! market index. Every party sees only its own jobs, nodes and money: another party's job or
//! node answers 404, exactly as one that does not exist. One file per area; this one holds what
//! several share: the role check, name checks, and the job and node ownership lookups.

mod admin;
mod agent;
mod billing;
mod datasets;
mod gateway;
mod jobs;
mod market;
mod metrics;
mod nodes;
mod offers;
mod outputs;
mod records;
mod reservations;
mod services;
mod trust;

pub(crate) use admin::{
    create_account, create_key, credit, evidence, list_accounts, list_keys, revoke_key, rotate_key,
};
pub(crate) use agent::{
    agent_reclaim, agent_resume, heartbeat, lease_event, lease_log, lease_progress, poll_leases, restate_node,
    rotate_node_key,
};
pub(crate) use billing::{balance, invoice, own_balance, statement};
pub(crate) use datasets::warm_dataset;
pub(crate) use gateway::{agent_tunnel, gateway_node, list_gateways, report_gateway, serve, service_route};
pub(crate) use jobs::{cancel_job, job_logs, job_logs_page, jobs_page, list_jobs, quote_job, show_job, submit_job};
pub(crate) use market::{health, market, market_index};
pub(crate) use metrics::metrics;
pub(crate) use nodes::{
    earnings, list_nodes, list_sites, reclaim_node, register_node, register_nodes, resume_node, set_policy, set_site,
    show_node,
};
pub(crate) use offers::search_offers;
pub(crate) use outputs::{job_output, lease_output};
pub(crate) use records::{attest, report_usage};
pub(crate) use reservations::{
    cancel_reservation, create_reservation, link_own_provider, list_own_providers, list_reservations, node_calendar,
    show_reservation, unlink_own_provider,
};
pub(crate) use services::{
    create_service_key, delete_service, deploy_service, list_services, revoke_service_key, scale_service, service_logs,
    services_page, show_service, update_service,
};
pub(crate) use trust::{
    admin_bond, canary_proof, canary_result, frauds, node_canaries, post_bond, trust, trust_view, verify_node,
};

use std::sync::Arc;

use axum::extract::State;
use store::{JobRecord, Role};

use crate::error::{ApiError, ApiResult};
use crate::state::{AppState, Caller};

type AppStateRef = State<Arc<AppState>>;

fn require(caller: &Caller, roles: &[Role]) -> ApiResult<()> {
    if roles.contains(&caller.role) {
        Ok(())
    } else {
        let names: Vec<&str> = roles.iter().map(|role| role.as_str()).collect();
        Err(ApiError::Forbidden(format!(
            "this endpoint is for {} keys; yours is a {} key",
            names.join(" or "),
            caller.role
        )))
    }
}

async fn own_job(state: &AppState, caller: &Caller, id: i64) -> ApiResult<JobRecord> {
    let job = state.store.job(id).await?;
    match job {
        Some(job) if caller.role == Role::Admin || job.tenant_id == caller.account_id => Ok(job),
        _ => Err(ApiError::NotFound(format!("job {id} not found"))),
    }
}

fn check_name(field: &str, value: &str, required: bool) -> ApiResult<()> {
    if required && value.trim().is_empty() {
        return Err(ApiError::BadRequest(format!("{field}: must not be empty")));
    }
    if value.chars().count() > 128 || value.chars().any(char::is_control) {
        return Err(ApiError::BadRequest(format!(
            "{field}: at most 128 printable characters"
        )));
    }
    Ok(())
}

async fn own_node(state: &AppState, caller: &Caller, id: i64) -> ApiResult<store::NodeRecord> {
    match state.store.node(id).await? {
        Some(node) if caller.role == Role::Admin || node.node.provider_id == caller.account_id => Ok(node),
        _ => Err(ApiError::NotFound(format!("node {id} not found"))),
    }
}
