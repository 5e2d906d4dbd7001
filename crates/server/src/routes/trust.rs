//! The trust policy's part of the API (docs/trust-policy.md): canary results from agents, a
//! provider's standing (badge, bond, reputation with its inputs, canaries, fraud decided),
//! bonds, re-verification, and fraud decisions with their evidence for everyone they concern.

use api::*;
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use ledger::Account;
use model::Micros;
use serde::Deserialize;
use store::{FraudRow, Role};

use crate::books::reputation::{NodeFacts, ProviderStanding};
use crate::canaries;
use crate::error::{ApiError, ApiResult};
use crate::extract::{Auth, JsonBody, Path, Query, Signed};
use crate::money;
use crate::reputation;
use crate::state::{AppState, Caller};
use crate::wire::reputation_view;

use super::{AppStateRef, check_name, own_node, require};

/// The most fraud decisions one answer lists.
pub const FRAUDS_LISTED_MAX: i64 = 500;
/// The most canaries of a node one answer lists.
pub const CANARIES_LISTED_MAX: i64 = 100;
/// The largest bond one request posts.
pub const BOND_DOLLARS_MAX: i64 = 10_000_000;
/// A provider asks for a canary on a node at most this often.
pub const VERIFY_EVERY_US: i64 = 60_000_000;

/// `POST /v1/agent/canaries`: a canary's signed result.
pub async fn canary_result(
    State(state): AppStateRef,
    signed: Signed<SignedCanaryResult>,
) -> ApiResult<Json<CanaryAccepted>> {
    Ok(Json(canaries::take_result(&state, signed.node_id, &signed.body).await?))
}

/// `POST /v1/agent/canaries/{id}/proof`: a matmul canary's proof (the rows its challenge asked
/// for); answers the finding.
pub async fn canary_proof(
    State(state): AppStateRef,
    Path(id): Path<i64>,
    signed: Signed<api::CanaryProof>,
) -> ApiResult<Json<CanaryAccepted>> {
    Ok(Json(
        canaries::take_proof(&state, signed.node_id, id, &signed.body).await?,
    ))
}

fn fraud_view(row: &FraudRow) -> FraudView {
    FraudView {
        id: row.id,
        node_id: row.node_id,
        provider_id: row.provider_id,
        kind: row.kind.clone(),
        section: row.section.clone(),
        share_permille: row.share_permille,
        bond_before_micros: row.bond_before,
        slashed_micros: row.slashed,
        refunds: serde_json::from_str(&row.refunds).unwrap_or_default(),
        to_platform_micros: row.to_platform,
        evidence: serde_json::from_str(&row.evidence).unwrap_or(serde_json::Value::Null),
        decided_at_us: row.decided_at,
    }
}

/// A provider's standing now.
pub(crate) async fn trust_view(state: &AppState, provider_id: i64) -> ApiResult<TrustView> {
    let now = state.now_us();
    let records = state.store.nodes_of_provider(provider_id).await?;
    let standings = reputation::standings(state, &NodeFacts::all(&records), now).await?;
    let bond_micros = money::balance(&state.store, Account::ProviderBond(provider_id))
        .await?
        .0;
    // A provider without nodes has the prior and no history yet.
    let provider = match standings.providers.get(&provider_id) {
        Some(provider) => provider.clone(),
        None => {
            let history = trust::rules::History {
                first_registered_ms: now / 1000,
                last_fraud_ms: None,
                bond_micros,
                gpus_offered: 0,
            };
            let reputation = trust::rules::Reputation::default();
            ProviderStanding {
                badge: trust::rules::badge(&reputation, &history, now / 1000),
                reputation,
                history,
            }
        }
    };
    let mut last_canaries: std::collections::HashMap<i64, CanaryView> = state
        .store
        .latest_canaries_of_provider(provider_id)
        .await?
        .iter()
        .map(|canary| (canary.canary.node_id, canaries::view_of(canary)))
        .collect();
    let mut nodes = Vec::with_capacity(records.len());
    for record in &records {
        let Some(standing) = standings.nodes.get(&record.id) else {
            continue;
        };
        nodes.push(NodeTrustView {
            node_id: record.id,
            name: record.node.name.clone(),
            reputation: reputation_view(&standing.reputation),
            fraud_cordoned_at_us: standing.fraud_cordoned_at,
            gold_eligible: standing.gold_eligible,
            last_canary: last_canaries.remove(&record.id),
        });
    }
    let gpus_offered = provider.history.gpus_offered;
    let (next_badge, next_badge_needs) = trust::rules::next_badge(&provider.reputation, &provider.history, now / 1000)
        .map_or((None, Vec::new()), |(badge, needs)| {
            (Some(badge.name().to_string()), needs)
        });
    Ok(TrustView {
        provider_id,
        bond_micros,
        badge: provider.badge.name().to_string(),
        next_badge,
        next_badge_needs,
        reputation: reputation_view(&provider.reputation),
        gpus_offered,
        gold_bond_needed_micros: trust::rules::GOLD_BOND_PER_GPU_MICROS * i64::from(gpus_offered.max(1)),
        first_registered_at_us: records.iter().map(|record| record.registered_at).min(),
        last_fraud_at_us: provider.history.last_fraud_ms.map(|at| at * 1000),
        nodes,
        frauds: state
            .store
            .frauds(Some(provider_id), FRAUDS_LISTED_MAX)
            .await?
            .iter()
            .map(fraud_view)
            .collect(),
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderQuery {
    provider_id: Option<i64>,
}

/// `GET /v1/trust`: the caller's standing (a provider), or a provider's (an admin names it).
pub async fn trust(
    State(state): AppStateRef,
    Auth(caller): Auth,
    Query(query): Query<ProviderQuery>,
) -> ApiResult<Json<TrustView>> {
    require(&caller, &[Role::Provider, Role::Admin])?;
    let provider = match (caller.role, query.provider_id) {
        (Role::Admin, Some(id)) => id,
        (Role::Admin, None) => {
            // The caller's own standing, and an admin has none.
            return Err(ApiError::NotFound(
                "an admin has no standing of its own; name the provider with provider_id".into(),
            ));
        }
        (_, Some(id)) if id != caller.account_id => {
            return Err(ApiError::NotFound(format!("provider {id} not found")));
        }
        _ => caller.account_id,
    };
    match state.store.account(provider).await? {
        Some(account) if account.role == Role::Provider => {}
        _ => return Err(ApiError::NotFound(format!("provider {provider} not found"))),
    }
    Ok(Json(trust_view(&state, provider).await?))
}

fn bond_amount(request: &BondRequest) -> ApiResult<Micros> {
    check_name("key", &request.key, true)?;
    Micros::parse_dollars(&request.amount)
        .filter(|amount| amount.0 > 0 && amount.0 <= BOND_DOLLARS_MAX * Micros::PER_DOLLAR)
        .ok_or_else(|| {
            ApiError::BadRequest(format!(
                "amount: {:?} is not 0.000001–{BOND_DOLLARS_MAX} dollars",
                request.amount
            ))
        })
}

/// `POST /v1/provider/bond`: a provider posts a bond from its earnings.
pub async fn post_bond(
    State(state): AppStateRef,
    Auth(caller): Auth,
    JsonBody(request): JsonBody<BondRequest>,
) -> ApiResult<Json<TrustView>> {
    require(&caller, &[Role::Provider])?;
    if request.provider_id.is_some_and(|id| id != caller.account_id) {
        return Err(ApiError::BadRequest(
            "provider_id: a provider posts its own bond; leave it out".into(),
        ));
    }
    let amount = bond_amount(&request)?;
    let earnings = money::balance(&state.store, Account::ProviderEarnings(caller.account_id)).await?;
    let transaction = ledger::bond_post(
        caller.account_id,
        amount,
        format!("bond:provider-{}:{}", caller.account_id, request.key),
        state.now_us(),
    )
    .map_err(money::ledger_error)?;
    match money::apply(&state.store, &transaction).await {
        Ok(_) => {}
        Err(ApiError::Conflict(why)) if why.contains("floor") => {
            return Err(ApiError::PaymentRequired(format!(
                "your earnings are {earnings}, less than the bond of {amount}: earn more first, or ask an admin to post \
                 the bond for you (POST /v1/admin/bonds)"
            )));
        }
        Err(error) => return Err(error),
    }
    Ok(Json(trust_view(&state, caller.account_id).await?))
}

/// `POST /v1/admin/bonds`: an admin posts a bond paid in from outside for a provider.
pub async fn admin_bond(
    State(state): AppStateRef,
    Auth(caller): Auth,
    JsonBody(request): JsonBody<BondRequest>,
) -> ApiResult<Json<TrustView>> {
    require(&caller, &[Role::Admin])?;
    let provider = request
        .provider_id
        .ok_or_else(|| ApiError::BadRequest("provider_id: name the provider whose bond this is".into()))?;
    match state.store.account(provider).await? {
        Some(account) if account.role == Role::Provider => {}
        Some(account) => {
            return Err(ApiError::NotFound(format!(
                "provider {provider} not found: account {provider} is a {} account, and bonds are for providers",
                account.role
            )));
        }
        None => return Err(ApiError::NotFound(format!("provider {provider} not found"))),
    }
    let amount = bond_amount(&request)?;
    let transaction = ledger::bond_post_external(
        provider,
        amount,
        format!("bond:provider-{provider}:{}", request.key),
        state.now_us(),
    )
    .map_err(money::ledger_error)?;
    money::apply(&state.store, &transaction).await?;
    Ok(Json(trust_view(&state, provider).await?))
}

/// Whether `caller` may read a fraud decision: its provider, a tenant it owed a refund (paid
/// or, the slashed money short, not), and admins.
fn concerns(caller: &Caller, fraud: &FraudView) -> bool {
    match caller.role {
        Role::Admin => true,
        Role::Provider => fraud.provider_id == caller.account_id,
        Role::Tenant => fraud.refunds.iter().any(|refund| refund.tenant_id == caller.account_id),
    }
}

/// `GET /v1/frauds`: the fraud decisions that concern the caller, newest first, each with the
/// rule applied, the amounts and the evidence (signed records and canary results).
pub async fn frauds(State(state): AppStateRef, Auth(caller): Auth) -> ApiResult<Json<Vec<FraudView>>> {
    let rows = match caller.role {
        Role::Admin => state.store.frauds(None, FRAUDS_LISTED_MAX).await?,
        Role::Provider => state.store.frauds(Some(caller.account_id), FRAUDS_LISTED_MAX).await?,
        Role::Tenant => {
            state
                .store
                .frauds_refunding(caller.account_id, FRAUDS_LISTED_MAX)
                .await?
        }
    };
    Ok(Json(
        rows.iter()
            .map(fraud_view)
            .filter(|fraud| concerns(&caller, fraud))
            .collect(),
    ))
}

/// `GET /v1/nodes/{id}/canaries`: a node's canaries, newest first, with their signed results.
pub async fn node_canaries(
    State(state): AppStateRef,
    Auth(caller): Auth,
    Path(id): Path<i64>,
) -> ApiResult<Json<Vec<CanaryView>>> {
    require(&caller, &[Role::Provider, Role::Admin])?;
    own_node(&state, &caller, id).await?;
    let rows = state.store.canaries_of_node(id, CANARIES_LISTED_MAX).await?;
    Ok(Json(rows.iter().map(canaries::view_of).collect()))
}

/// `POST /v1/nodes/{id}/verify`: orders a canary on the node now, as re-verification (a node
/// cordoned for fraud leaves the cordon when one passes on its current hardware, § 6).
pub async fn verify_node(
    State(state): AppStateRef,
    Auth(caller): Auth,
    Path(id): Path<i64>,
) -> ApiResult<(StatusCode, Json<CanaryView>)> {
    require(&caller, &[Role::Provider, Role::Admin])?;
    let node = own_node(&state, &caller, id).await?;
    let now = state.now_us();
    if let Some(latest) = state.store.canaries_of_node(id, 1).await?.first() {
        if latest.finding.is_none() {
            return Err(ApiError::Conflict(format!(
                "canary {} is still open on node {id}; wait for its answer",
                latest.id
            )));
        }
        if now - latest.canary.created_at < VERIFY_EVERY_US {
            return Err(ApiError::Conflict(format!(
                "node {id} had a canary less than {} s ago; ask again later",
                VERIFY_EVERY_US / 1_000_000
            )));
        }
    }
    if !node.online {
        return Err(ApiError::Conflict(format!(
            "node {id} is off line; start its agent first, a canary runs on the node"
        )));
    }
    let Some(canary) = canaries::order(&state, &node, now).await? else {
        return Err(ApiError::Conflict(format!(
            "every GPU of node {id} is leased; a canary runs on idle GPUs, ask again when one is free"
        )));
    };
    let row = state
        .store
        .canary(canary)
        .await?
        .ok_or_else(|| ApiError::Internal(format!("canary {canary} vanished")))?;
    Ok((StatusCode::CREATED, Json(canaries::view_of(&row))))
}
