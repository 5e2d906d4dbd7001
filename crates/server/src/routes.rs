//! The HTTP API under `/v1`: tenants, providers, agents (signed), admins, and the public
//! market index. Every party sees only its own jobs, nodes and money: another party's job or
//! node answers 404, exactly as one that does not exist.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use api::*;
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use ledger::Account;
use model::{GpuCatalog, Micros};
use serde::Deserialize;
use store::{JobRecord, JobState, LeaseMove, LeaseState, NewJob, NewNode, Role};

use crate::beats::{self, OverLimitChange};
use crate::error::{ApiError, ApiResult};
use crate::extract::{Auth, JsonBody, Path, Query, Signed};
use crate::lease_hints::Hint;
use crate::lifecycle::{end_job, replica_ended};
use crate::money;
use crate::state::{AppState, Caller, LONG_POLL_MS_MAX, Metrics, now_us};
use crate::views::{job_request, job_view, lease_view, node_view};

type AppStateRef = State<Arc<AppState>>;

pub(crate) fn require(caller: &Caller, roles: &[Role]) -> ApiResult<()> {
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

/// A running job's wait in a preemption (see `views::preemption_reason`); reads the victims it
/// waits for only when none of its leases has started.
async fn running_reason(state: &AppState, job: &JobRecord, leases: &[store::LeaseRecord]) -> ApiResult<Option<String>> {
    if job.state != JobState::Running {
        return Ok(None);
    }
    let waiting = leases
        .iter()
        .any(|lease| lease.state == LeaseState::Pending && lease.lease.preempt_at.is_none());
    let victims = if waiting {
        state.store.live_victims_of(job.id).await?
    } else {
        Vec::new()
    };
    let grace_s = state.config.matcher.preemption_grace_s;
    Ok(crate::views::preemption_reason(
        job,
        leases,
        &victims,
        grace_s,
        now_us(),
    ))
}

async fn full_job_view(state: &AppState, job: &JobRecord) -> ApiResult<JobView> {
    let leases = state.store.leases_of_job(job.id).await?;
    let escrow = state.store.balance(&Account::Escrow(job.id).key()).await?;
    let mut cost = 0;
    for lease in &leases {
        for usage in state.store.usage_of_lease(lease.id).await? {
            cost += usage.charged_micros;
        }
    }
    let mut view = job_view(job, &leases, cost, escrow);
    if let Some(reason) = running_reason(state, job, &leases).await? {
        view.state_reason = reason;
    }
    let ids: Vec<i64> = leases.iter().map(|lease| lease.id).collect();
    let progress = state.store.lease_progress(&ids).await?;
    if let Some((_, unit, _)) = progress.first() {
        let done: i64 = progress
            .iter()
            .filter(|(_, other, _)| other == unit)
            .map(|(_, _, done)| *done)
            .sum();
        view.progress = Some(ProgressView {
            unit: unit.clone(),
            done,
            cost_micros_per_million_units: if done > 0 {
                i64::try_from(i128::from(cost) * 1_000_000 / i128::from(done)).unwrap_or(i64::MAX)
            } else {
                0
            },
        });
    }
    Ok(view)
}

// ---------------------------------------------------------------- tenants

pub async fn submit_job(
    State(state): AppStateRef,
    Auth(caller): Auth,
    JsonBody(request): JsonBody<JobRequest>,
) -> ApiResult<(StatusCode, Json<JobView>)> {
    require(&caller, &[Role::Tenant])?;
    request.to_spec(0, caller.account_id, 0, |_| None)?;
    if !state.recently_funded(caller.account_id) {
        let available = money::balance(&state.store, Account::TenantAvailable(caller.account_id)).await?;
        if available.0 <= 0 {
            return Err(ApiError::PaymentRequired(
                "your balance is $0: ask an admin to credit your account before submitting jobs".into(),
            ));
        }
        state.note_funded(caller.account_id);
    }
    let spec = serde_json::to_string(&request).map_err(|error| ApiError::Internal(error.to_string()))?;
    let record = state
        .submissions
        .submit(NewJob {
            tenant_id: caller.account_id,
            client_token: request.client_token.clone(),
            spec,
            tier: request.tier.clone(),
            submitted_at: now_us(),
        })
        .await?;
    Metrics::add(&state.metrics.jobs_submitted, 1);
    state.wake.notify_one();
    Ok((StatusCode::CREATED, Json(job_view(&record, &[], 0, 0))))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Page {
    before: Option<i64>,
    limit: Option<i64>,
}

pub async fn list_jobs(
    State(state): AppStateRef,
    Auth(caller): Auth,
    Query(page): Query<Page>,
) -> ApiResult<Json<JobList>> {
    require(&caller, &[Role::Tenant])?;
    let limit = page.limit.unwrap_or(50);
    if !(1..=PAGE_SIZE_MAX).contains(&limit) {
        return Err(ApiError::BadRequest(format!("limit: {limit} is not 1–{PAGE_SIZE_MAX}")));
    }
    let jobs = state
        .store
        .jobs_of_tenant(caller.account_id, page.before, limit)
        .await?;
    let next_before = if jobs.len() as i64 == limit {
        jobs.last().map(|job| job.id)
    } else {
        None
    };
    let mut views = Vec::with_capacity(jobs.len());
    for job in &jobs {
        let leases = state.store.leases_of_job(job.id).await?;
        let mut view = job_view(job, &leases, 0, 0);
        if let Some(reason) = running_reason(&state, job, &leases).await? {
            view.state_reason = reason;
        }
        views.push(view);
    }
    Ok(Json(JobList {
        jobs: views,
        next_before,
    }))
}

pub async fn show_job(State(state): AppStateRef, Auth(caller): Auth, Path(id): Path<i64>) -> ApiResult<Json<JobView>> {
    let job = own_job(&state, &caller, id).await?;
    let mut view = full_job_view(&state, &job).await?;
    if job.state == JobState::Queued {
        view.explanation = explain_queued(&state, &job).await?;
    }
    Ok(Json(view))
}

/// Why a queued job waits: the matcher's per-constraint account (O(nodes), on request only).
async fn explain_queued(state: &AppState, job: &JobRecord) -> ApiResult<Option<String>> {
    crate::reconcile::ensure_view(state).await?;
    let fleet = state.view.lock().await;
    let Some(fleet) = fleet.as_ref() else { return Ok(None) };
    let now_s = now_us() / 1_000_000;
    let request = job_request(job);
    let Ok(spec) = request.to_spec(job.id, job.tenant_id, now_s, |name| fleet.region(name)) else {
        return Ok(None);
    };
    // The regions by the names the job gave: one no node is in has no id to name it by.
    Ok(Some(
        fleet.matcher.explain_naming(&spec, now_s, &request.regions).message,
    ))
}

pub async fn cancel_job(
    State(state): AppStateRef,
    Auth(caller): Auth,
    Path(id): Path<i64>,
) -> ApiResult<Json<JobView>> {
    let job = own_job(&state, &caller, id).await?;
    if job.state.is_final() {
        return Err(ApiError::Conflict(format!("job {id} already ended ({})", job.state)));
    }
    let ended = end_job(
        &state,
        &job,
        &[JobState::Queued, JobState::Running],
        JobState::Cancelled,
        LeaseState::Cancelled,
        "cancelled by its tenant",
    )
    .await?;
    if ended.is_none() {
        return Err(ApiError::Conflict(format!(
            "job {id} ended meanwhile; nothing to cancel"
        )));
    }
    let job = own_job(&state, &caller, id).await?;
    Ok(Json(full_job_view(&state, &job).await?))
}

pub async fn quote_job(
    State(state): AppStateRef,
    Auth(caller): Auth,
    JsonBody(request): JsonBody<JobRequest>,
) -> ApiResult<Json<QuoteView>> {
    require(&caller, &[Role::Tenant, Role::Admin])?;
    crate::reconcile::ensure_view(&state).await?;
    let view = state.view.lock().await;
    let view = view
        .as_ref()
        .ok_or_else(|| ApiError::Unavailable("the fleet view is not built yet".into()))?;
    let now_s = now_us() / 1_000_000;
    let spec = request.to_spec(0, caller.account_id, now_s, |name| view.region(name))?;
    let quote = view.matcher.quote_naming(&spec, now_s, &request.regions);
    Ok(Json(QuoteView {
        price_micros_per_gpu_hour: quote.price_per_gpu_hour.map(|price| price.0),
        nodes_feasible: quote.nodes_feasible,
        gpus_feasible: quote.gpus_available,
        nodes_total: view.node_ids.len() as u64,
        explanation: quote
            .explanation
            .map(|explanation| explanation.message)
            .unwrap_or_default(),
    }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OfferQuery {
    #[serde(default)]
    filter: String,
    limit: Option<usize>,
}

/// Offers are searchable by anyone with a key: they are the market's public face.
pub async fn search_offers(
    State(state): AppStateRef,
    Auth(_caller): Auth,
    Query(query): Query<OfferQuery>,
) -> ApiResult<Json<OfferList>> {
    let filter = OfferFilter::parse(&query.filter)?;
    let limit = query.limit.unwrap_or(100).clamp(1, 1000);
    crate::reconcile::ensure_view(&state).await?;
    let view = state.view.lock().await;
    let view = view
        .as_ref()
        .ok_or_else(|| ApiError::Unavailable("the fleet view is not built yet".into()))?;
    let catalog = GpuCatalog::embedded();
    let now_s = now_us() / 1_000_000;
    let mut offers = Vec::new();
    let mut total = 0u64;
    let mut excluded: BTreeMap<String, u64> = BTreeMap::new();
    for (position, record) in view.records.iter().enumerate() {
        let node = &view.matcher.nodes()[position];
        let spec = catalog.spec(node.gpu_model);
        let capacity = view.matcher.node_capacity(node.id);
        let mut prices = BTreeMap::new();
        for tier in model::Tier::ALL {
            if node.policy.allowed_tiers.contains(tier)
                && let Some(ask) = node.policy.ask_at(tier, now_s)
            {
                prices.insert(tier.name().to_string(), ask.0);
            }
        }
        let offer = OfferView {
            node_id: record.id,
            provider_id: record.node.provider_id,
            gpu_model: record.node.gpu_model.clone(),
            gpu_count: node.gpu_count,
            gpus_free: capacity.whole_gpus_free() as u8,
            gpu_memory_mib: spec.memory_mib,
            compute_units: f64::from(spec.cu_milli) / 1000.0,
            region: record.node.region.clone(),
            site: record.node.site.clone(),
            reliability: f64::from(node.reliability_ppm) / 1e6,
            price_micros_per_gpu_hour: prices,
            online: record.online,
            simulated: record.node.simulated,
        };
        match filter.excluded_by(&offer) {
            None => {
                total += 1;
                offers.push(offer);
            }
            Some(clause) => *excluded.entry(clause.to_string()).or_default() += 1,
        }
    }
    let explanation = (total == 0).then(|| offers_excluded(&view.records, &excluded));
    let tier = filter.tier().map(str::to_string);
    let price_of = |offer: &OfferView| match &tier {
        Some(tier) => offer.price_micros_per_gpu_hour.get(tier).copied().unwrap_or(i64::MAX),
        None => offer
            .price_micros_per_gpu_hour
            .values()
            .copied()
            .min()
            .unwrap_or(i64::MAX),
    };
    offers.sort_by_key(|offer| (price_of(offer), offer.node_id));
    offers.truncate(limit);
    Ok(Json(OfferList {
        offers,
        total_matching: total,
        explanation,
    }))
}

/// Why no offer matched: how many nodes each clause excluded, and where the nodes are.
fn offers_excluded(records: &[store::NodeRecord], excluded: &BTreeMap<String, u64>) -> String {
    if records.is_empty() {
        return "no node is registered yet".into();
    }
    let mut parts: Vec<(u64, &String)> = excluded.iter().map(|(clause, count)| (*count, clause)).collect();
    parts.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(b.1)));
    let parts: Vec<String> = parts
        .iter()
        .map(|(count, clause)| format!("{count} excluded by `{clause}`"))
        .collect();
    let mut regions: Vec<&str> = records.iter().map(|record| record.node.region.as_str()).collect();
    regions.sort_unstable();
    regions.dedup();
    format!(
        "0 of {} nodes: {} (nodes are in {})",
        records.len(),
        parts.join(", "),
        regions.join(", ")
    )
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccountQuery {
    account_id: Option<i64>,
}

fn account_in_view(caller: &Caller, query: &AccountQuery) -> ApiResult<i64> {
    match query.account_id {
        Some(id) if caller.role == Role::Admin => Ok(id),
        Some(id) if id != caller.account_id => Err(ApiError::NotFound(format!("account {id} not found"))),
        _ => Ok(caller.account_id),
    }
}

pub async fn balance(
    State(state): AppStateRef,
    Auth(caller): Auth,
    Query(query): Query<AccountQuery>,
) -> ApiResult<Json<BalanceView>> {
    let id = account_in_view(&caller, &query)?;
    let escrow: i64 = state
        .store
        .balances("escrow:job:")
        .await?
        .into_iter()
        .map(|(_, amount)| amount)
        .sum::<i64>();
    let escrow = if caller.role == Role::Admin && query.account_id.is_none() {
        escrow
    } else {
        let mut own = 0;
        for job in state.store.jobs_of_tenant(id, None, PAGE_SIZE_MAX).await? {
            if !job.state.is_final() {
                own += state.store.balance(&Account::Escrow(job.id).key()).await?;
            }
        }
        own
    };
    Ok(Json(BalanceView {
        account_id: id,
        available_micros: state.store.balance(&Account::TenantAvailable(id).key()).await?,
        escrow_micros: escrow,
        earnings_micros: state.store.balance(&Account::ProviderEarnings(id).key()).await?,
        bond_micros: state.store.balance(&Account::ProviderBond(id).key()).await?,
    }))
}

pub async fn statement(
    State(state): AppStateRef,
    Auth(caller): Auth,
    Query(query): Query<AccountQuery>,
) -> ApiResult<Json<StatementView>> {
    let id = account_in_view(&caller, &query)?;
    let account = match state.store.account(id).await?.map(|account| account.role) {
        Some(Role::Provider) => Account::ProviderEarnings(id),
        _ => Account::TenantAvailable(id),
    };
    let lines = state
        .store
        .ledger_entries_of(&account.key(), 1000)
        .await?
        .into_iter()
        .map(|(transaction, kind, amount, at)| LedgerLine {
            transaction,
            kind,
            amount_micros: amount,
            at_us: at,
        })
        .collect();
    Ok(Json(StatementView { account_id: id, lines }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InvoiceQuery {
    /// The month, `YYYY-MM` (UTC).
    period: String,
    account_id: Option<i64>,
}

/// Days from 1970-01-01 to the first of `month` in `year` (proleptic Gregorian).
fn days_to_month(year: i64, month: i64) -> i64 {
    model::time::days_from_civil(year, month, 1)
}

/// The first microsecond of a `YYYY-MM` month and of the next one.
pub fn month_bounds(period: &str) -> ApiResult<(i64, i64)> {
    let bad = || {
        ApiError::BadRequest(format!(
            "period: {period:?} is not a month as YYYY-MM (1970-01 to 9999-12)"
        ))
    };
    let (year, month) = period.split_once('-').ok_or_else(bad)?;
    if year.len() != 4 || month.len() != 2 || !(year.bytes().chain(month.bytes())).all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let (year, month): (i64, i64) = (year.parse().map_err(|_| bad())?, month.parse().map_err(|_| bad())?);
    if !(1970..=9999).contains(&year) || !(1..=12).contains(&month) {
        return Err(bad());
    }
    let (next_year, next_month) = if month == 12 { (year + 1, 1) } else { (year, month + 1) };
    const DAY_US: i64 = 86_400_000_000;
    Ok((
        days_to_month(year, month) * DAY_US,
        days_to_month(next_year, next_month) * DAY_US,
    ))
}

/// A tenant's invoice for a month (admins name the tenant with `account_id`).
pub async fn invoice(
    State(state): AppStateRef,
    Auth(caller): Auth,
    Query(query): Query<InvoiceQuery>,
) -> ApiResult<Json<InvoiceView>> {
    require(&caller, &[Role::Tenant, Role::Admin])?;
    if caller.role == Role::Admin && query.account_id.is_none() {
        return Err(ApiError::BadRequest("account_id: name the tenant to invoice".into()));
    }
    let id = account_in_view(
        &caller,
        &AccountQuery {
            account_id: query.account_id,
        },
    )?;
    let (from_us, to_us) = month_bounds(&query.period)?;
    let escrow_prefix = Account::Escrow(0).key().trim_end_matches('0').to_string();
    let entries = state
        .store
        .tenant_entries_between(
            id,
            &Account::TenantAvailable(id).key(),
            &escrow_prefix,
            (from_us, to_us),
        )
        .await?;
    // Entries of one transaction are consecutive (inserted together).
    let mut lines: std::collections::BTreeMap<i64, (i64, i64)> = std::collections::BTreeMap::new();
    let (mut usage, mut credits, mut refunds, mut payments) = (0i64, 0i64, 0i64, 0i64);
    let mut index = 0;
    while index < entries.len() {
        let key = &entries[index].0;
        let end = entries[index..]
            .iter()
            .position(|entry| &entry.0 != key)
            .map_or(entries.len(), |offset| index + offset);
        let transaction = &entries[index..end];
        let sum: i64 = transaction.iter().map(|entry| entry.3).sum();
        match transaction[0].1.as_str() {
            "usage" => {
                let job = match transaction.iter().find_map(|entry| match Account::parse(&entry.2) {
                    Ok(Account::Escrow(job)) => Some(job),
                    _ => None,
                }) {
                    Some(job) => job,
                    None => usage_job(&state, key).await?,
                };
                let line = lines.entry(job).or_insert((0, 0));
                line.0 += 1;
                line.1 -= sum;
                usage -= sum;
            }
            "sla_credit" => credits += sum,
            // A slash's entries on the tenant's account are what it paid the tenant back.
            "refund" | "slash" => refunds += sum,
            "deposit" => payments += sum,
            _ => {}
        }
        index = end;
    }
    let mut invoice_lines = Vec::with_capacity(lines.len());
    for (job_id, (usage_records, charged_micros)) in lines {
        let job_name = match state.store.job(job_id).await? {
            Some(job) => crate::views::job_request(&job).name,
            None => String::new(),
        };
        invoice_lines.push(InvoiceLine {
            job_id,
            job_name,
            usage_records,
            charged_micros,
        });
    }
    Ok(Json(InvoiceView {
        account_id: id,
        period: query.period,
        from_us,
        to_us,
        lines: invoice_lines,
        usage_micros: usage,
        sla_credits_micros: credits,
        refunds_micros: refunds,
        total_micros: usage - credits - refunds,
        payments_micros: payments,
    }))
}

/// The job a usage transaction (`usage:lease-N:seq-M`) billed, through its lease.
async fn usage_job(state: &AppState, key: &str) -> ApiResult<i64> {
    let lease = key
        .strip_prefix("usage:lease-")
        .and_then(|rest| rest.split(':').next())
        .and_then(|id| id.parse::<i64>().ok())
        .ok_or_else(|| ApiError::Internal(format!("usage transaction {key} names no lease")))?;
    let record = state
        .store
        .lease(lease)
        .await?
        .ok_or_else(|| ApiError::Internal(format!("usage transaction {key}: lease {lease} is gone")))?;
    Ok(record.job_id)
}

// ---------------------------------------------------------------- providers

pub(crate) fn check_name(field: &str, value: &str, required: bool) -> ApiResult<()> {
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

pub async fn register_node(
    State(state): AppStateRef,
    Auth(caller): Auth,
    JsonBody(registration): JsonBody<NodeRegistration>,
) -> ApiResult<(StatusCode, Json<NodeView>)> {
    require(&caller, &[Role::Provider])?;
    check_name("name", &registration.name, true)?;
    check_name("region", &registration.region, true)?;
    check_name("site", &registration.site, true)?;
    check_name("fabric", &registration.fabric, false)?;
    check_name("nvlink_domain", &registration.nvlink_domain, false)?;
    check_name("fingerprint", &registration.fingerprint, false)?;
    trust::parse_public_key(&registration.public_key)?;
    let catalog = GpuCatalog::embedded();
    if catalog.find(&registration.gpu_model).is_none() {
        let known: Vec<&str> = catalog.models().map(|(_, spec)| spec.name.as_str()).collect();
        return Err(ApiError::BadRequest(format!(
            "gpu_model: unknown model {:?}; known: {}",
            registration.gpu_model,
            known.join(", ")
        )));
    }
    if !(1..=16).contains(&registration.gpu_count) {
        return Err(ApiError::BadRequest(format!(
            "gpu_count: {} is not 1–16",
            registration.gpu_count
        )));
    }
    if !(-90.0..=90.0).contains(&registration.latitude) || !(-180.0..=180.0).contains(&registration.longitude) {
        return Err(ApiError::BadRequest(
            "latitude must be −90…90 and longitude −180…180".into(),
        ));
    }
    if registration.memory_mib > 1 << 40 || registration.cpu_milli == 0 {
        return Err(ApiError::BadRequest(
            "cpu_milli must be positive and memory_mib at most 2^40".into(),
        ));
    }
    registration.policy.to_model()?;
    let mut runtimes: Vec<model::Runtime> = Vec::new();
    for name in &registration.runtimes {
        let runtime = model::Runtime::parse(name)
            .ok_or_else(|| ApiError::BadRequest(format!("runtimes: {name:?} is not container or process")))?;
        if !runtimes.contains(&runtime) {
            runtimes.push(runtime);
        }
    }
    if runtimes.is_empty() {
        runtimes = model::Runtime::ALL.to_vec();
    }
    runtimes.sort();
    let runtimes = runtimes
        .iter()
        .map(|runtime| runtime.name())
        .collect::<Vec<_>>()
        .join(",");
    let policy = serde_json::to_string(&registration.policy).map_err(|error| ApiError::Internal(error.to_string()))?;
    let record = state
        .store
        .insert_node(
            &NewNode {
                provider_id: caller.account_id,
                name: registration.name.clone(),
                public_key: registration.public_key.clone(),
                fingerprint: registration.fingerprint.clone(),
                region: registration.region.clone(),
                site: registration.site.clone(),
                fabric: registration.fabric.clone(),
                nvlink_domain: registration.nvlink_domain.clone(),
                latitude: registration.latitude,
                longitude: registration.longitude,
                gpu_model: registration.gpu_model.clone(),
                gpu_count: i64::from(registration.gpu_count),
                cpu_milli: i64::from(registration.cpu_milli),
                memory_mib: registration.memory_mib as i64,
                network_mbit_s: i64::from(registration.network_mbit_s),
                simulated: registration.simulated,
                policy,
                datasets: "[]".to_string(),
                runtimes,
            },
            now_us(),
        )
        .await?;
    state.wake.notify_one();
    Ok((
        StatusCode::CREATED,
        Json(node_view(&record, trust::rules::Reputation::default().score(), 0, 0)),
    ))
}

pub(crate) async fn own_node(state: &AppState, caller: &Caller, id: i64) -> ApiResult<store::NodeRecord> {
    match state.store.node(id).await? {
        Some(node) if caller.role == Role::Admin || node.node.provider_id == caller.account_id => Ok(node),
        _ => Err(ApiError::NotFound(format!("node {id} not found"))),
    }
}

async fn full_node_view(state: &AppState, record: &store::NodeRecord) -> ApiResult<NodeView> {
    let mut views = full_node_views(state, std::slice::from_ref(record)).await?;
    Ok(views.remove(0))
}

/// Nodes as the API shows them, with their reputations read from one catch-up of the book.
async fn full_node_views(state: &AppState, records: &[store::NodeRecord]) -> ApiResult<Vec<NodeView>> {
    crate::reputation::catch_up(state).await?;
    let now_ms = now_us() / 1000;
    let mut views = Vec::with_capacity(records.len());
    for record in records {
        let live = state.store.live_leases_of_node(record.id).await?.len() as i64;
        let reputation = state.reputations.lock().await.node(record.id, now_ms);
        let mut view = node_view(record, reputation.score(), live, 0);
        view.reputation = Some(crate::views::reputation_view(&reputation));
        // This replica may have heard the node since the store did (see `beats`).
        if let Some((at, telemetry)) = state.beats.last(record.id)
            && record.last_heartbeat_at.is_none_or(|stored| stored < at)
        {
            view.last_heartbeat_at_us = Some(at);
            view.telemetry = serde_json::from_str(&telemetry).ok();
        }
        views.push(view);
    }
    Ok(views)
}

pub async fn list_nodes(State(state): AppStateRef, Auth(caller): Auth) -> ApiResult<Json<Vec<NodeView>>> {
    require(&caller, &[Role::Provider, Role::Admin])?;
    let records = if caller.role == Role::Admin {
        state.store.nodes().await?
    } else {
        state.store.nodes_of_provider(caller.account_id).await?
    };
    Ok(Json(full_node_views(&state, &records).await?))
}

pub async fn show_node(
    State(state): AppStateRef,
    Auth(caller): Auth,
    Path(id): Path<i64>,
) -> ApiResult<Json<NodeView>> {
    let record = own_node(&state, &caller, id).await?;
    Ok(Json(full_node_view(&state, &record).await?))
}

pub async fn set_policy(
    State(state): AppStateRef,
    Auth(caller): Auth,
    Path(id): Path<i64>,
    JsonBody(policy): JsonBody<PolicyDoc>,
) -> ApiResult<Json<NodeView>> {
    require(&caller, &[Role::Provider, Role::Admin])?;
    own_node(&state, &caller, id).await?;
    policy.to_model()?;
    let text = serde_json::to_string(&policy).map_err(|error| ApiError::Internal(error.to_string()))?;
    state.store.set_node_policy(id, &text, now_us()).await?;
    state.wake.notify_one();
    let record = own_node(&state, &caller, id).await?;
    Ok(Json(full_node_view(&state, &record).await?))
}

pub async fn earnings(State(state): AppStateRef, Auth(caller): Auth) -> ApiResult<Json<EarningsView>> {
    require(&caller, &[Role::Provider])?;
    let now = now_us();
    let mut nodes = Vec::new();
    let records = state.store.nodes_of_provider(caller.account_id).await?;
    let views = full_node_views(&state, &records).await?;
    for (record, view) in records.into_iter().zip(views) {
        let mut earned = 0i64;
        let mut gpu_milli_seconds = 0i64;
        for lease in state.store.leases_of_node(record.id).await? {
            for usage in state.store.usage_of_lease(lease.id).await? {
                earned += usage.charged_micros;
                gpu_milli_seconds += usage.gpu_seconds_milli;
            }
        }
        let offered_seconds = ((now - record.registered_at) / 1_000_000).max(1);
        let capacity = offered_seconds * record.node.gpu_count.max(1) * 1000;
        nodes.push(NodeEarnings {
            node_id: record.id,
            name: record.node.name.clone(),
            earned_micros: earned,
            gpu_hours_sold: gpu_milli_seconds as f64 / 1000.0 / 3600.0,
            fill_rate: (gpu_milli_seconds as f64 / capacity as f64).min(1.0),
            reliability: view.reliability,
        });
    }
    Ok(Json(EarningsView {
        provider_id: caller.account_id,
        earnings_micros: state
            .store
            .balance(&Account::ProviderEarnings(caller.account_id).key())
            .await?,
        nodes,
    }))
}

// ---------------------------------------------------------------- agents

async fn agent_leases(state: &AppState, node_id: i64) -> ApiResult<Vec<AgentLease>> {
    let mut out = Vec::new();
    for lease in state.store.live_leases_of_node(node_id).await? {
        let job = state.store.job(lease.job_id).await?;
        out.push(AgentLease {
            lease: lease_view(&lease),
            job: job.as_ref().map(job_request).unwrap_or_default(),
        });
    }
    Ok(out)
}

/// `agent_leases`, without asking the store when the leader knows the node holds none.
async fn agent_leases_hinted(state: &AppState, node_id: i64) -> ApiResult<Vec<AgentLease>> {
    match state.lease_hints.of(node_id) {
        Hint::None => Ok(Vec::new()),
        Hint::Ask(mark) => {
            let leases = agent_leases(state, node_id).await?;
            if let Some(mark) = mark
                && leases.is_empty()
            {
                state.lease_hints.clear(node_id, mark);
            }
            Ok(leases)
        }
    }
}

/// The most leases a heartbeat may say its node holds.
pub const HELD_LEASES_MAX: usize = 4096;

pub async fn heartbeat(
    State(state): AppStateRef,
    signed: Signed<HeartbeatRequest, true>,
) -> ApiResult<Json<HeartbeatResponse>> {
    let now = now_us();
    let request = &signed.body;
    if request.gpus.len() > 16 {
        return Err(ApiError::BadRequest("gpus: at most 16".into()));
    }
    if let Some(datasets) = &request.datasets
        && datasets.len() > 10_000
    {
        return Err(ApiError::BadRequest("datasets: at most 10,000 digests".into()));
    }
    if let Some(fingerprint) = &request.fingerprint {
        check_name("fingerprint", fingerprint, false)?;
    }
    if request.leases.as_ref().is_some_and(|held| held.len() > HELD_LEASES_MAX) {
        return Err(ApiError::BadRequest(format!("leases: at most {HELD_LEASES_MAX}")));
    }
    let telemetry = serde_json::json!({"gpus": request.gpus, "over_limit": request.over_limit}).to_string();
    let datasets = request
        .datasets
        .as_ref()
        .map(|digests| serde_json::to_string(digests).unwrap_or_else(|_| "[]".into()));
    let noted = state.beats.note(
        signed.node_id,
        now,
        telemetry,
        request.fingerprint.as_deref(),
        datasets,
        beats::persist(&state.config, state.leads()),
    );
    if noted.fingerprint_to_check
        && let Some(fingerprint) = &request.fingerprint
        && state
            .store
            .set_node_fingerprint(signed.node_id, fingerprint, now)
            .await?
    {
        state
            .store
            .record_evidence(Some(signed.node_id), "fingerprint_changed", fingerprint, now)
            .await?;
    }
    match state.beats.over_limit_change(signed.node_id, request.over_limit) {
        OverLimitChange::Unchanged => {}
        OverLimitChange::Changed => {
            state
                .store
                .set_node_over_limit(signed.node_id, request.over_limit, now)
                .await?;
        }
    }
    state.beats.note_utilisation(signed.node_id, now, &request.gpus);
    Metrics::add(&state.metrics.heartbeats, 1);
    let mut leases = agent_leases_hinted(&state, signed.node_id).await?;
    if let Some(held) = &request.leases {
        let min_age_us = crate::fraud::DROP_MIN_AGE_HEARTBEATS * state.config.heartbeat_interval_us();
        let evidence = signed.evidence("POST", "/v1/agent/heartbeat");
        let dropped = state
            .drops
            .note(signed.node_id, held, &leases, evidence, min_age_us, now);
        if !dropped.is_empty() {
            let node = state
                .store
                .node(signed.node_id)
                .await?
                .ok_or_else(|| ApiError::NotFound("node".into()))?;
            for drop in dropped {
                crate::fraud::dropped(&state, &node, drop, now).await?;
            }
            leases = agent_leases(&state, signed.node_id).await?;
        }
    }
    Ok(Json(HeartbeatResponse {
        leases,
        heartbeat_interval_ms: state.config.heartbeat_interval_ms,
        heartbeat_timeout_ms: state.config.heartbeat_timeout_ms,
        canaries: crate::canaries::orders_for(&state, signed.node_id, now).await?,
    }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeasePoll {
    /// Wait up to this long for the lease set to differ from `known`.
    wait_ms: Option<u64>,
    /// The `version` of the lease set the agent already has.
    known: Option<String>,
}

fn lease_set_version(leases: &[AgentLease]) -> String {
    let mut text = String::new();
    for lease in leases {
        text.push_str(&format!(
            "{}:{}:{}:{:?};",
            lease.lease.id, lease.lease.epoch, lease.lease.state, lease.lease.preempt_at_us
        ));
    }
    trust::body_digest_hex(text.as_bytes())[..16].to_string()
}

/// The leases the node should run (long-poll): answers at once if they differ from `known`,
/// else when they change, or after `wait_ms`.
pub async fn poll_leases(
    State(state): AppStateRef,
    Query(poll): Query<LeasePoll>,
    signed: Signed<serde_json::Value, true>,
) -> ApiResult<Json<LeaseSet>> {
    let wait = Duration::from_millis(poll.wait_ms.unwrap_or(0).min(LONG_POLL_MS_MAX));
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let leases = agent_leases_hinted(&state, signed.node_id).await?;
        let version = lease_set_version(&leases);
        if poll.known.as_deref() != Some(version.as_str()) || tokio::time::Instant::now() >= deadline {
            return Ok(Json(LeaseSet { version, leases }));
        }
        tokio::time::sleep(Duration::from_millis(250).min(deadline - tokio::time::Instant::now())).await;
    }
}

/// The lease `node_id` reports on, if it holds it. A report for one it does not hold is
/// refused and kept as evidence: `foreign_lease`, or `foreign_lease_record` for a signed usage
/// record or attestation, which counts with the usage checks (docs/trust-policy.md § 7).
async fn node_lease(state: &AppState, node_id: i64, lease_id: i64, record: bool) -> ApiResult<store::LeaseRecord> {
    match state.store.lease(lease_id).await? {
        Some(lease) if lease.lease.node_id == node_id => Ok(lease),
        _ => {
            let now = now_us();
            let detail = format!("report for lease {lease_id}");
            if record {
                crate::fraud::usage_evidence(state, node_id, "foreign_lease_record", &detail, now).await?;
            } else {
                state
                    .store
                    .record_evidence(Some(node_id), "foreign_lease", &detail, now)
                    .await?;
            }
            Err(ApiError::Forbidden(format!(
                "lease {lease_id} is not held by node {node_id}; the attempt is recorded"
            )))
        }
    }
}

pub async fn lease_event(
    State(state): AppStateRef,
    Path(lease_id): Path<i64>,
    signed: Signed<LeaseEventRequest>,
) -> ApiResult<Json<LeaseView>> {
    let lease = node_lease(&state, signed.node_id, lease_id, false).await?;
    let event = &signed.body;
    let to = match event.state.as_str() {
        "staging" => LeaseState::Staging,
        "running" => LeaseState::Running,
        "finished" => LeaseState::Finished,
        "failed" => LeaseState::Failed,
        other => {
            return Err(ApiError::BadRequest(format!(
                "state: {other:?} is not staging, running, finished or failed"
            )));
        }
    };
    // A long detail is cut to 128 characters; what is stored is exactly what was checked.
    let reported: String = event.detail.chars().take(128).collect();
    check_name("detail", &reported, false)?;
    let now = now_us();
    let detail = match event.exit_code {
        Some(code) => format!("exit code {code}; {reported}"),
        None => reported.clone(),
    };
    let moved = if to.is_live() {
        match state
            .store
            .move_lease(lease_id, event.epoch, to, &reported, now)
            .await?
        {
            LeaseMove::Moved => {
                state
                    .store
                    .append_lease_event(lease_id, event.epoch, to.as_str(), &detail, now)
                    .await?;
                true
            }
            // Already there or past it: the timeline keeps each change once.
            LeaseMove::Already => true,
            LeaseMove::NotLive => false,
        }
    } else {
        replica_ended(&state, signed.node_id, &lease, event.epoch, to, &reported, &detail, now).await?
    };
    if !moved {
        return Err(ApiError::Conflict(format!(
            "lease {lease_id} is not live at epoch {} (now epoch {}, {}): stop it",
            event.epoch, lease.epoch, lease.state
        )));
    }
    if lease.state == LeaseState::Pending {
        state.metrics.lease_pickup.observe_us(now - lease.created_at);
    }
    let lease = state
        .store
        .lease(lease_id)
        .await?
        .ok_or_else(|| ApiError::NotFound("lease".into()))?;
    Ok(Json(lease_view(&lease)))
}

/// Replaces the node's key with a new one, in a request signed by the current key: from then on
/// only the new key signs for the node (on other replicas within about a second).
pub async fn rotate_node_key(State(state): AppStateRef, signed: Signed<KeyRotation>) -> ApiResult<Json<NodeView>> {
    let new = signed.body.public_key.trim().to_lowercase();
    trust::parse_public_key(&new)?;
    // The key that signed this request: a key rotated away meanwhile changes nothing.
    let old_hex = trust::public_key_hex(&state.node_identity(signed.node_id).await?.key);
    if new == old_hex {
        return Err(ApiError::BadRequest(
            "public_key: that is the node's current key".into(),
        ));
    }
    let rotated = state
        .store
        .rotate_node_key(signed.node_id, &old_hex, &new, now_us())
        .await?;
    state.forget_node(signed.node_id);
    if !rotated {
        return Err(ApiError::Conflict(
            "the node's key changed meanwhile; sign with the current key".into(),
        ));
    }
    tracing::info!(node = signed.node_id, "node key rotated");
    let record = state
        .store
        .node(signed.node_id)
        .await?
        .ok_or_else(|| ApiError::NotFound("node".into()))?;
    Ok(Json(crate::views::node_view(&record, 0.0, 0, 0)))
}

/// A replica's progress from its agent, at the lease's current epoch.
pub async fn lease_progress(
    State(state): AppStateRef,
    Path(lease_id): Path<i64>,
    signed: Signed<ProgressRequest>,
) -> ApiResult<Json<serde_json::Value>> {
    let lease = node_lease(&state, signed.node_id, lease_id, false).await?;
    let progress = &signed.body;
    check_name("unit", &progress.unit, true)?;
    if progress.done < 0 {
        return Err(ApiError::BadRequest(format!("done: {} is negative", progress.done)));
    }
    if progress.epoch != lease.epoch {
        return Err(ApiError::Conflict(format!(
            "lease {lease_id} is at epoch {}, not {}: stop it",
            lease.epoch, progress.epoch
        )));
    }
    state
        .store
        .set_lease_progress(lease_id, &progress.unit, progress.done, now_us())
        .await?;
    Ok(Json(serde_json::json!({"recorded": true})))
}

/// The most a lease's stored output may hold (characters); later chunks are not stored.
pub const LEASE_LOG_CHARS_MAX: i64 = 8 << 20;

/// A chunk of a replica's output from its agent, at the lease's current epoch.
pub async fn lease_log(
    State(state): AppStateRef,
    Path(lease_id): Path<i64>,
    signed: Signed<LogChunkRequest>,
) -> ApiResult<Json<LogChunkAccepted>> {
    let lease = node_lease(&state, signed.node_id, lease_id, false).await?;
    let chunk = &signed.body;
    if chunk.byte_offset < 0 {
        return Err(ApiError::BadRequest(format!(
            "byte_offset: {} is negative",
            chunk.byte_offset
        )));
    }
    if chunk.text.chars().count() > LOG_CHUNK_CHARS_MAX {
        return Err(ApiError::BadRequest(format!(
            "text: at most {LOG_CHUNK_CHARS_MAX} characters a chunk"
        )));
    }
    if chunk.epoch != lease.epoch {
        return Err(ApiError::Conflict(format!(
            "lease {lease_id} is at epoch {}, not {}: stop it",
            lease.epoch, chunk.epoch
        )));
    }
    let stored = state
        .store
        .append_lease_log(
            &store::LogChunk {
                id: 0,
                lease_id,
                epoch: chunk.epoch,
                byte_offset: chunk.byte_offset,
                text: chunk.text.clone(),
                at: now_us(),
            },
            LEASE_LOG_CHARS_MAX,
        )
        .await?;
    Ok(Json(LogChunkAccepted { stored }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogQuery {
    after: Option<i64>,
    limit: Option<i64>,
}

/// A job's output, from every replica, oldest first.
pub async fn job_logs(
    State(state): AppStateRef,
    Auth(caller): Auth,
    Path(id): Path<i64>,
    Query(query): Query<LogQuery>,
) -> ApiResult<Json<JobLogs>> {
    let job = own_job(&state, &caller, id).await?;
    let limit = query.limit.unwrap_or(PAGE_SIZE_MAX);
    if !(1..=PAGE_SIZE_MAX).contains(&limit) {
        return Err(ApiError::BadRequest(format!("limit: {limit} is not 1–{PAGE_SIZE_MAX}")));
    }
    let after = query.after.unwrap_or(0);
    let leases = state.store.leases_of_job(job.id).await?;
    let replicas: std::collections::HashMap<i64, i64> =
        leases.iter().map(|lease| (lease.id, lease.lease.replica)).collect();
    let ids: Vec<i64> = leases.iter().map(|lease| lease.id).collect();
    let chunks: Vec<LogChunkView> = state
        .store
        .lease_logs(&ids, after, limit)
        .await?
        .into_iter()
        .map(|chunk| LogChunkView {
            id: chunk.id,
            lease_id: chunk.lease_id,
            replica: replicas.get(&chunk.lease_id).copied().unwrap_or(0),
            byte_offset: chunk.byte_offset,
            text: chunk.text,
            at_us: chunk.at,
        })
        .collect();
    let next_after = chunks.last().map_or(after, |chunk| chunk.id);
    Ok(Json(JobLogs {
        job_id: job.id,
        chunks,
        next_after,
    }))
}

fn usage_record(body: &UsageBody) -> trust::UsageRecord {
    trust::UsageRecord {
        lease_id: body.lease_id,
        epoch: body.epoch,
        sequence: body.sequence,
        period_start_ms: body.period_start_ms,
        period_end_ms: body.period_end_ms,
        gpu_seconds_milli: body.gpu_seconds_milli,
        gpu_utilisation_permille: body.gpu_utilisation_permille,
        telemetry_digest: body.telemetry_digest.clone(),
    }
}

/// Checks a signed record against the node's key (a forgery is recorded as evidence of `kind`)
/// and the lease's current epoch (an old epoch is fenced off).
async fn check_record<T: trust::RecordBody>(
    state: &AppState,
    node_id: i64,
    record: &trust::SignedRecord<T>,
    lease: &store::LeaseRecord,
    epoch: i64,
    kind: &str,
    usage: bool,
) -> ApiResult<()> {
    let identity = state.node_identity(node_id).await?;
    if let Err(error) = trust::verify_record(&identity.key, node_id, record) {
        state
            .store
            .record_evidence(Some(node_id), kind, &format!("lease {}", lease.id), now_us())
            .await?;
        return Err(error.into());
    }
    // Usage a replica delivered before the coordinator ended its lease (which moved the epoch
    // on) is still owed: an agent cut off sends it when contact returns. Its period is checked
    // against the lease's end by the caller.
    let delivered_before_the_end = usage && !lease.state.is_live() && epoch == lease.epoch - 1;
    if epoch != lease.epoch && !delivered_before_the_end {
        return Err(ApiError::Conflict(format!(
            "lease {} is at epoch {}, not {}: reports for an old epoch are refused",
            lease.id, lease.epoch, epoch
        )));
    }
    Ok(())
}

pub async fn report_usage(State(state): AppStateRef, signed: Signed<SignedUsage>) -> ApiResult<Json<UsageAccepted>> {
    let body = &signed.body.body;
    let lease = node_lease(&state, signed.node_id, body.lease_id, true).await?;
    let record = trust::SignedRecord {
        body: usage_record(body),
        signature_hex: signed.body.signature_hex.clone(),
    };
    check_record(
        &state,
        signed.node_id,
        &record,
        &lease,
        body.epoch,
        "bad_usage_signature",
        true,
    )
    .await?;
    let now = now_us();
    if body.sequence < 0 || body.gpu_seconds_milli < 0 || body.period_end_ms <= body.period_start_ms {
        return Err(ApiError::BadRequest(format!(
            "usage record: sequence and gpu_seconds_milli must not be negative, and the period must end after it starts \
             (the period {}..{} ms is outside any lease)",
            body.period_start_ms, body.period_end_ms
        )));
    }
    // A record taken before (an answer lost on the way, so the agent sent it again) is
    // answered as taken, not checked again: its GPU-seconds are already in the lease's total.
    if let Some(stored) = state.store.usage_row(lease.id, body.sequence).await? {
        if stored.signature != signed.body.signature_hex {
            return Err(ApiError::Conflict(format!(
                "lease {} already has usage record {} with other contents",
                lease.id, body.sequence
            )));
        }
        return Ok(Json(UsageAccepted {
            new: false,
            charged_micros: 0,
        }));
    }
    let lease_gpu_milli = i64::from(lease.lease.gpu_mask.count_ones() as u16) * lease.lease.gpu_milli;
    // The record's period on the coordinator's clock: the node's clock offset, measured from
    // the time it signed this request, is taken out (docs/trust-policy.md § 4).
    let offset_ms = signed.clock_offset_ms(now);
    let (start_ms, end_ms) = (
        body.period_start_ms.saturating_sub(offset_ms),
        body.period_end_ms.saturating_sub(offset_ms),
    );
    let lease_end_ms = lease.ended_at.map(|end| end / 1000);
    let terms = trust::rules::LeaseTerms {
        gpu_milli: lease_gpu_milli,
        start_ms: lease.created_at / 1000,
        // An ended lease allows the time its agent may take to notice the end.
        end_ms: lease_end_ms.map_or(now / 1000, |end| end.saturating_add(trust::rules::USAGE_END_NOTICE_MS)),
        accepted_gpu_seconds_milli: state.store.usage_total(lease.id).await?,
    };
    let checked = trust::UsageRecord {
        period_start_ms: start_ms,
        period_end_ms: end_ms,
        ..usage_record(body)
    };
    let gpus = crate::views::gpu_indices(lease.lease.gpu_mask);
    let telemetry = state.beats.utilisation_over(
        signed.node_id,
        &gpus,
        (start_ms.saturating_mul(1000), end_ms.saturating_mul(1000)),
        trust::rules::TELEMETRY_HEARTBEATS_MIN,
    );
    if let Err(violation) = trust::rules::check_usage(&checked, &terms, telemetry) {
        let detail = serde_json::json!({
            "lease_id": lease.id,
            "epoch": body.epoch,
            "violation": violation,
            "record": body,
            "signature_hex": signed.body.signature_hex,
            "clock_offset_ms": offset_ms,
        });
        crate::fraud::usage_evidence(&state, signed.node_id, "usage_violation", &detail.to_string(), now).await?;
        return Err(ApiError::BadRequest(format!(
            "usage record refused and kept as evidence (docs/trust-policy.md § 4): {violation}"
        )));
    }
    // What the lease can be billed for: a record running past an ended lease (its agent had not
    // noticed yet) is billed up to the end only.
    let billable_gpu_seconds_milli = match lease_end_ms {
        Some(end) if end_ms > end => {
            let inside = (end - start_ms).clamp(0, end_ms - start_ms);
            i64::try_from(i128::from(body.gpu_seconds_milli) * i128::from(inside) / i128::from(end_ms - start_ms))
                .unwrap_or(0)
        }
        _ => body.gpu_seconds_milli,
    };
    let job = state
        .store
        .job(lease.job_id)
        .await?
        .ok_or_else(|| ApiError::NotFound("job".into()))?;
    let node = state
        .store
        .node(signed.node_id)
        .await?
        .ok_or_else(|| ApiError::NotFound("node".into()))?;
    // Simulated devices sell nothing real: their usage is recorded, never billed (unless the
    // coordinator bills play money for them, `Config::bill_simulated`).
    let amount = if node.node.simulated && !state.config.bill_simulated {
        Micros::ZERO
    } else {
        Micros(lease.lease.price_micros)
            .cost_for(billable_gpu_seconds_milli as u64, 1)
            .ok_or_else(|| ApiError::BadRequest("usage charge overflows".into()))?
    };
    let key = format!("usage:lease-{}:seq-{}", lease.id, body.sequence);
    let mut charged = 0;
    let mut unbilled = Micros::ZERO;
    if amount.0 > 0 {
        let escrow = money::balance(&state.store, Account::Escrow(job.id)).await?;
        let available = money::balance(&state.store, Account::TenantAvailable(job.tenant_id)).await?;
        let charge = ledger::usage(
            &ledger::BillableUsage {
                tenant: job.tenant_id,
                job: job.id,
                provider: signed.provider_id,
                amount,
                fee_permille: state.config.platform_fee_permille,
            },
            escrow,
            available,
            key.clone(),
            now,
        )
        .map_err(money::ledger_error)?;
        if let Some(transaction) = &charge.tx {
            let mut transaction = transaction.clone();
            if node.node.simulated {
                transaction.memo.push_str(" (simulated devices: play money)");
            }
            match money::apply(&state.store, &transaction).await {
                Ok(_) | Err(ApiError::Conflict(_)) => {}
                Err(error) => return Err(error),
            }
        }
        charged = charge.billed.0;
        unbilled = charge.unbilled;
    }
    let fresh = state
        .store
        .insert_usage(&store::UsageRow {
            lease_id: lease.id,
            sequence: body.sequence,
            node_id: signed.node_id,
            gpu_seconds_milli: body.gpu_seconds_milli,
            charged_micros: charged,
            body: serde_json::to_string(body).unwrap_or_default(),
            signature: signed.body.signature_hex.clone(),
            received_at: now,
        })
        .await?;
    Metrics::add(&state.metrics.usage_records, 1);
    if unbilled.0 > 0 {
        end_job(
            &state,
            &job,
            &[JobState::Running],
            JobState::Failed,
            LeaseState::Cancelled,
            "the tenant's balance ran out",
        )
        .await?;
    }
    Ok(Json(UsageAccepted {
        new: fresh,
        charged_micros: if fresh { charged } else { 0 },
    }))
}

pub async fn attest(State(state): AppStateRef, signed: Signed<SignedAttestation>) -> ApiResult<Json<LeaseView>> {
    let body = &signed.body.body;
    let lease = node_lease(&state, signed.node_id, body.lease_id, true).await?;
    let record = trust::SignedRecord {
        body: trust::Attestation {
            lease_id: body.lease_id,
            epoch: body.epoch,
            image_digest: body.image_digest.clone(),
            start_ms: body.start_ms,
            end_ms: body.end_ms,
            exit_code: body.exit_code,
            gpu_seconds_milli: body.gpu_seconds_milli,
            telemetry_digest: body.telemetry_digest.clone(),
            log_digest: body.log_digest.clone(),
        },
        signature_hex: signed.body.signature_hex.clone(),
    };
    check_record(
        &state,
        signed.node_id,
        &record,
        &lease,
        body.epoch,
        "bad_attestation_signature",
        false,
    )
    .await?;
    let now = now_us();
    let stored = state
        .store
        .insert_attestation(&store::AttestationRow {
            lease_id: lease.id,
            epoch: body.epoch,
            node_id: signed.node_id,
            body: serde_json::to_string(body).unwrap_or_default(),
            signature: signed.body.signature_hex.clone(),
            received_at: now,
        })
        .await?;
    if !stored {
        return Err(ApiError::Conflict(format!(
            "lease {} already has an attestation",
            lease.id
        )));
    }
    let to = if body.exit_code == 0 {
        LeaseState::Finished
    } else {
        LeaseState::Failed
    };
    let reason = format!("exit code {}", body.exit_code);
    replica_ended(&state, signed.node_id, &lease, body.epoch, to, &reason, "attested", now).await?;
    let lease = state
        .store
        .lease(lease.id)
        .await?
        .ok_or_else(|| ApiError::NotFound("lease".into()))?;
    Ok(Json(lease_view(&lease)))
}

// ---------------------------------------------------------------- admins

fn account_view(account: &store::AccountRecord) -> AccountView {
    AccountView {
        id: account.id,
        role: account.role.as_str().to_string(),
        name: account.name.clone(),
        created_at_us: account.created_at,
    }
}

/// Makes an API key for an account and stores its hash; the key itself is returned once.
pub async fn issue_key(state: &AppState, account_id: i64, label: &str) -> ApiResult<NewKeyResponse> {
    let key = trust::generate_api_key();
    state
        .store
        .insert_api_key(&store::ApiKeyRecord {
            key_id: key.key_id.clone(),
            account_id,
            secret_hash: key.secret_hash.clone(),
            label: label.to_string(),
            created_at: now_us(),
            revoked_at: None,
        })
        .await?;
    Ok(NewKeyResponse {
        key_id: key.key_id,
        api_key: key.display,
    })
}

pub async fn create_account(
    State(state): AppStateRef,
    Auth(caller): Auth,
    JsonBody(request): JsonBody<NewAccountRequest>,
) -> ApiResult<(StatusCode, Json<NewAccountResponse>)> {
    require(&caller, &[Role::Admin])?;
    let role = Role::parse(&request.role)
        .ok_or_else(|| ApiError::BadRequest(format!("role: {:?} is not tenant, provider or admin", request.role)))?;
    check_name("name", &request.name, true)?;
    let account = state.store.create_account(role, &request.name, now_us()).await?;
    let api_key = issue_key(&state, account.id, "first key").await?;
    Ok((
        StatusCode::CREATED,
        Json(NewAccountResponse {
            account: account_view(&account),
            api_key,
        }),
    ))
}

pub async fn list_accounts(State(state): AppStateRef, Auth(caller): Auth) -> ApiResult<Json<Vec<AccountView>>> {
    require(&caller, &[Role::Admin])?;
    Ok(Json(state.store.accounts().await?.iter().map(account_view).collect()))
}

pub async fn create_key(
    State(state): AppStateRef,
    Auth(caller): Auth,
    Path(account_id): Path<i64>,
    JsonBody(request): JsonBody<NewKeyRequest>,
) -> ApiResult<(StatusCode, Json<NewKeyResponse>)> {
    if caller.role != Role::Admin && caller.account_id != account_id {
        return Err(ApiError::NotFound(format!("account {account_id} not found")));
    }
    check_name("label", &request.label, false)?;
    if state.store.account(account_id).await?.is_none() {
        return Err(ApiError::NotFound(format!("account {account_id} not found")));
    }
    Ok((
        StatusCode::CREATED,
        Json(issue_key(&state, account_id, &request.label).await?),
    ))
}

pub async fn list_keys(
    State(state): AppStateRef,
    Auth(caller): Auth,
    Path(account_id): Path<i64>,
) -> ApiResult<Json<Vec<KeyView>>> {
    if caller.role != Role::Admin && caller.account_id != account_id {
        return Err(ApiError::NotFound(format!("account {account_id} not found")));
    }
    let keys = state.store.api_keys_of(account_id).await?;
    Ok(Json(
        keys.into_iter()
            .map(|key| KeyView {
                key_id: key.key_id,
                account_id: key.account_id,
                label: key.label,
                created_at_us: key.created_at,
                revoked_at_us: key.revoked_at,
            })
            .collect(),
    ))
}

pub async fn revoke_key(
    State(state): AppStateRef,
    Auth(caller): Auth,
    Path(key_id): Path<String>,
) -> ApiResult<StatusCode> {
    let key = state.store.api_key(&key_id).await?;
    match key {
        Some(key) if caller.role == Role::Admin || key.account_id == caller.account_id => {
            if !state.store.revoke_api_key(&key_id, now_us()).await? {
                return Err(ApiError::Conflict(format!("key {key_id} is already revoked")));
            }
            state.forget_key(&key_id);
            Ok(StatusCode::NO_CONTENT)
        }
        _ => Err(ApiError::NotFound(format!("key {key_id} not found"))),
    }
}

/// Rotation: a new key for the caller's account, and the key used for this request revoked.
pub async fn rotate_key(
    State(state): AppStateRef,
    headers: axum::http::HeaderMap,
    Auth(caller): Auth,
) -> ApiResult<(StatusCode, Json<NewKeyResponse>)> {
    let presented = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .unwrap_or("");
    let (old_id, _) =
        trust::parse_api_key(presented.trim()).map_err(|error| ApiError::Unauthorized(error.to_string()))?;
    let old_id = old_id.to_string();
    let fresh = issue_key(&state, caller.account_id, "rotated").await?;
    state.store.revoke_api_key(&old_id, now_us()).await?;
    state.forget_key(&old_id);
    Ok((StatusCode::CREATED, Json(fresh)))
}

pub async fn credit(
    State(state): AppStateRef,
    Auth(caller): Auth,
    JsonBody(request): JsonBody<CreditRequest>,
) -> ApiResult<Json<BalanceView>> {
    require(&caller, &[Role::Admin])?;
    let account = state
        .store
        .account(request.account_id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("account {} not found", request.account_id)))?;
    if account.role != Role::Tenant {
        return Err(ApiError::BadRequest(format!("account {} is not a tenant", account.id)));
    }
    let amount = Micros::parse_dollars(&request.amount)
        .filter(|amount| amount.0 > 0 && amount.0 <= 10_000_000 * Micros::PER_DOLLAR)
        .ok_or_else(|| {
            ApiError::BadRequest(format!(
                "amount: {:?} is not 0.000001–10,000,000 dollars",
                request.amount
            ))
        })?;
    check_name("key", &request.key, true)?;
    let transaction = ledger::deposit(account.id, amount, format!("deposit:{}", request.key), now_us())
        .map_err(money::ledger_error)?;
    money::apply(&state.store, &transaction).await?;
    balance(
        State(state.clone()),
        Auth(caller),
        Query(AccountQuery {
            account_id: Some(account.id),
        }),
    )
    .await
}

pub async fn evidence(State(state): AppStateRef, Auth(caller): Auth) -> ApiResult<Json<Vec<EvidenceView>>> {
    require(&caller, &[Role::Admin])?;
    let rows = state.store.evidence(None, 1000).await?;
    Ok(Json(
        rows.into_iter()
            .map(|row| EvidenceView {
                id: row.id,
                node_id: row.node_id,
                kind: row.kind,
                detail: row.detail,
                at_us: row.at,
            })
            .collect(),
    ))
}

// ---------------------------------------------------------------- everyone

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MarketQuery {
    /// Bucket width in seconds (default an hour).
    bucket_s: Option<i64>,
    /// How far back, in seconds (default a day).
    since_s: Option<i64>,
}

/// The market index: clearing prices per model, region and tier over time, and utilisation now.
pub async fn market(State(state): AppStateRef, Query(query): Query<MarketQuery>) -> ApiResult<Json<MarketView>> {
    let bucket_us = query.bucket_s.unwrap_or(3600).clamp(60, 86_400 * 7) * 1_000_000;
    let since_us = now_us() - query.since_s.unwrap_or(86_400).clamp(60, 86_400 * 90) * 1_000_000;
    let points = state.store.price_points(since_us, 200_000).await?;
    let mut groups: BTreeMap<(i64, String, String, String), Vec<i64>> = BTreeMap::new();
    for point in points {
        groups
            .entry((
                point.at.div_euclid(bucket_us) * bucket_us,
                point.gpu_model,
                point.region,
                point.tier,
            ))
            .or_default()
            .push(point.price_micros);
    }
    let prices = groups
        .into_iter()
        .map(|((bucket_start_us, gpu_model, region, tier), mut prices)| {
            prices.sort_unstable();
            PriceBucket {
                bucket_start_us,
                gpu_model,
                region,
                tier,
                leases: prices.len() as u64,
                median_price_micros_per_gpu_hour: prices[prices.len() / 2],
                min_price_micros_per_gpu_hour: prices[0],
                max_price_micros_per_gpu_hour: prices[prices.len() - 1],
            }
        })
        .collect();
    let mut utilisation: BTreeMap<(String, String), (u64, u64)> = BTreeMap::new();
    for node in state.store.nodes().await? {
        if node.online {
            let entry = utilisation
                .entry((node.node.gpu_model.clone(), node.node.region.clone()))
                .or_default();
            entry.0 += node.node.gpu_count.max(0) as u64;
        }
    }
    for lease in state.store.live_leases().await? {
        if let Some(entry) = utilisation.get_mut(&(lease.lease.gpu_model.clone(), lease.lease.region.clone())) {
            entry.1 += u64::from(lease.lease.gpu_mask.count_ones() as u16) * lease.lease.gpu_milli.max(0) as u64;
        }
    }
    Ok(Json(MarketView {
        prices,
        utilisation: utilisation
            .into_iter()
            .map(|((gpu_model, region), (gpus, used))| UtilisationRow {
                gpu_model,
                region,
                gpus_online: gpus,
                gpu_milli_used: used,
                utilisation: if gpus == 0 {
                    0.0
                } else {
                    used as f64 / (gpus * 1000) as f64
                },
            })
            .collect(),
    }))
}

pub async fn health(State(state): AppStateRef) -> ApiResult<Json<serde_json::Value>> {
    let (nodes, _) = state.store.nodes_version().await?;
    Ok(Json(serde_json::json!({"status": "ok", "nodes_version": nodes})))
}

// ---------------------------------------------------------------- the dashboard's reads

/// The caller's jobs, newest first, exactly as `GET /v1/jobs` answers them.
pub(crate) async fn jobs_page(
    state: Arc<AppState>,
    caller: Caller,
    before: Option<i64>,
    limit: i64,
) -> ApiResult<JobList> {
    let page = Page {
        before,
        limit: Some(limit),
    };
    Ok(list_jobs(State(state), Auth(caller), Query(page)).await?.0)
}

/// A page of a job's output after chunk `after`, exactly as `GET /v1/jobs/{id}/logs` answers.
pub(crate) async fn job_logs_page(state: Arc<AppState>, caller: Caller, id: i64, after: i64) -> ApiResult<JobLogs> {
    let query = LogQuery {
        after: Some(after),
        limit: None,
    };
    Ok(job_logs(State(state), Auth(caller), Path(id), Query(query)).await?.0)
}

/// The caller's own balance, exactly as `GET /v1/balance` answers it.
pub(crate) async fn own_balance(state: Arc<AppState>, caller: Caller) -> ApiResult<BalanceView> {
    let query = AccountQuery { account_id: None };
    Ok(balance(State(state), Auth(caller), Query(query)).await?.0)
}

/// The market index over the last `since_s` seconds in buckets of `bucket_s`, as `GET /v1/market`.
pub(crate) async fn market_index(state: Arc<AppState>, bucket_s: i64, since_s: i64) -> ApiResult<MarketView> {
    let query = MarketQuery {
        bucket_s: Some(bucket_s),
        since_s: Some(since_s),
    };
    Ok(market(State(state), Query(query)).await?.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY_US: i64 = 86_400_000_000;

    #[test]
    fn a_month_is_its_days_in_microseconds_from_1970() {
        assert_eq!(month_bounds("1970-01").unwrap(), (0, 31 * DAY_US));
        let (from, to) = month_bounds("2024-02").unwrap();
        assert_eq!((to - from) / DAY_US, 29, "a leap February");
        assert_eq!(from, 19_754 * DAY_US, "2024-02-01 is day 19,754");
        let (_, end) = month_bounds("2026-12").unwrap();
        assert_eq!(end, month_bounds("2027-01").unwrap().0, "December runs into January");
        assert_eq!(
            (month_bounds("2100-02").unwrap().1 - month_bounds("2100-02").unwrap().0) / DAY_US,
            28
        );
        for bad in [
            "2026-13",
            "2026-00",
            "1969-12",
            "26-01",
            "2026-1",
            "2026-01-01",
            "+026-01",
            "",
            "-",
        ] {
            assert!(month_bounds(bad).is_err(), "{bad:?}");
        }
    }
}
