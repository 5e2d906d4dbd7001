//! A provider's nodes: registration, list and show (with reputations), policy, and earnings.

use api::*;
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use ledger::Account;
use model::GpuCatalog;
use store::{NewNode, Role};

use crate::error::{ApiError, ApiResult};
use crate::extract::{Auth, JsonBody, Path, PeerAddr};
use crate::state::AppState;
use crate::wire::node_view;

use super::{AppStateRef, check_name, own_node, require};

pub async fn register_node(
    State(state): AppStateRef,
    Auth(caller): Auth,
    PeerAddr(peer): PeerAddr,
    JsonBody(registration): JsonBody<NodeRegistration>,
) -> ApiResult<(StatusCode, Json<NodeView>)> {
    require(&caller, &[Role::Provider])?;
    let node = new_node(&state, caller.account_id, peer, &registration, &[], None).await?;
    let canary_kinds = canary_kinds_of(&registration)?;
    let record = state.store.insert_node(&node, state.now_us()).await?;
    if !canary_kinds.is_empty() {
        state.store.set_node_canary_kinds(record.id, &canary_kinds).await?;
    }
    state.wake.notify_one();
    Ok((StatusCode::CREATED, Json(registered_view(&record))))
}

/// Registers up to `api::NODE_BATCH_MAX` nodes in one request and one transaction, all or
/// none: a fleet's operator registers 100,000 nodes in a hundred requests, not 100,000. An
/// error names the first node (`nodes[i]`) it is about; nodes within the batch are checked
/// against each other as against those already registered (names, keys, NVLink domains).
pub async fn register_nodes(
    State(state): AppStateRef,
    Auth(caller): Auth,
    PeerAddr(peer): PeerAddr,
    JsonBody(batch): JsonBody<NodeBatchRegistration>,
) -> ApiResult<(StatusCode, Json<NodeBatchView>)> {
    require(&caller, &[Role::Provider])?;
    if batch.nodes.is_empty() || batch.nodes.len() > NODE_BATCH_MAX {
        return Err(ApiError::BadRequest(format!(
            "nodes: {} nodes; a batch holds 1–{NODE_BATCH_MAX}",
            batch.nodes.len()
        )));
    }
    let mut nodes: Vec<NewNode> = Vec::with_capacity(batch.nodes.len());
    let mut canary_kinds: Vec<String> = Vec::with_capacity(batch.nodes.len());
    for (index, registration) in batch.nodes.iter().enumerate() {
        let node = new_node(&state, caller.account_id, peer, registration, &nodes, None)
            .await
            .map_err(|error| in_batch(index, error))?;
        canary_kinds.push(canary_kinds_of(registration).map_err(|error| in_batch(index, error))?);
        if let Some(twin) = nodes
            .iter()
            .position(|other| other.name == node.name || other.public_key == node.public_key)
        {
            return Err(ApiError::Conflict(format!(
                "nodes[{index}]: its name or public key is also nodes[{twin}]'s"
            )));
        }
        nodes.push(node);
    }
    let records = {
        // A thousand rows hold SQLite's write lock for a while: take the writers' turn, so
        // that the group-commit writers wait here rather than in SQLite's busy handler.
        let _turn = state.writer_turn().await;
        state.store.insert_nodes(&nodes, state.now_us()).await?
    };
    for (record, kinds) in records.iter().zip(&canary_kinds) {
        if !kinds.is_empty() {
            state.store.set_node_canary_kinds(record.id, kinds).await?;
        }
    }
    state.wake.notify_one();
    Ok((
        StatusCode::CREATED,
        Json(NodeBatchView {
            nodes: records.iter().map(registered_view).collect(),
        }),
    ))
}

/// The canary kinds a registration says its agent runs besides hash, checked, as the store
/// keeps them (comma-separated); none for simulated devices, which only the hash canary paces
/// (docs/trust-policy.md § 3).
pub(super) fn canary_kinds_of(registration: &NodeRegistration) -> ApiResult<String> {
    let mut kinds: Vec<&str> = Vec::new();
    for name in &registration.canary_kinds {
        match api::CanaryKind::parse(name) {
            Some(api::CanaryKind::Hash) => {}
            Some(kind) => {
                if !kinds.contains(&kind.name()) {
                    kinds.push(kind.name());
                }
            }
            None => {
                return Err(ApiError::BadRequest(format!(
                    "canary_kinds: {name:?} is not a canary kind (hash, matmul)"
                )));
            }
        }
    }
    if registration.simulated {
        kinds.clear();
    }
    Ok(kinds.join(","))
}

/// Says which node of a batch an error is about.
fn in_batch(index: usize, error: ApiError) -> ApiError {
    match error {
        ApiError::BadRequest(message) => ApiError::BadRequest(format!("nodes[{index}]: {message}")),
        ApiError::Conflict(message) => ApiError::Conflict(format!("nodes[{index}]: {message}")),
        other => other,
    }
}

fn registered_view(record: &store::NodeRecord) -> NodeView {
    node_view(record, trust::rules::Reputation::default().score(), 0, 0)
}

/// Checks one registration and makes the node to store; `batch` holds the nodes registered in
/// the same request before it; `restating` is the node's id when it is registered already.
pub(super) async fn new_node(
    state: &AppState,
    provider_id: i64,
    peer: Option<std::net::IpAddr>,
    registration: &NodeRegistration,
    batch: &[NewNode],
    restating: Option<i64>,
) -> ApiResult<NewNode> {
    check_name("advertise_addr", &registration.advertise_addr, false)?;
    check_name("nvlink_detected", &registration.nvlink_detected, false)?;
    if !matches!(
        registration.nvlink_source.as_str(),
        "" | "flag" | "nvml-fabric" | "nvswitch" | "node"
    ) {
        return Err(ApiError::BadRequest(format!(
            "nvlink_source: {:?} is not flag, nvml-fabric, nvswitch or node",
            registration.nvlink_source
        )));
    }
    if !registration.gang_ports.is_empty() && parse_port_range(&registration.gang_ports).is_none() {
        return Err(ApiError::BadRequest(format!(
            "gang_ports: {:?} is not a port range FIRST-LAST within 1–65535",
            registration.gang_ports
        )));
    }
    check_name("name", &registration.name, true)?;
    check_name("region", &registration.region, true)?;
    check_name("site", &registration.site, true)?;
    check_name("fabric", &registration.fabric, false)?;
    check_name("nvlink_domain", &registration.nvlink_domain, false)?;
    check_name("fingerprint", &registration.fingerprint, false)?;
    trust::parse_public_key(&registration.public_key)?;
    let catalog = GpuCatalog::embedded();
    if let Err(unknown) = catalog.find_or_explain(&registration.gpu_model) {
        return Err(ApiError::BadRequest(format!("gpu_model: {unknown}")));
    }
    if !(1..=16).contains(&registration.gpu_count) {
        return Err(ApiError::BadRequest(format!(
            "gpu_count: {} is not 1–16",
            registration.gpu_count
        )));
    }
    check_coordinates(registration.latitude, registration.longitude)?;
    if registration.memory_mib > api::MEMORY_MIB_MAX || registration.cpu_milli == 0 {
        return Err(ApiError::BadRequest(
            "cpu_milli must be positive and memory_mib at most 2^40".into(),
        ));
    }
    registration.policy.to_model()?;
    check_nvlink_domain(state, registration, batch, restating).await?;
    // Coordinates the node declares beat its site's; a node that declares none takes the
    // site's from the sites table (now, or when an admin sets them).
    let (latitude, longitude, location_source) = if registration.latitude != 0.0 || registration.longitude != 0.0 {
        (registration.latitude, registration.longitude, "flag")
    } else if let Some(site) = state.store.site(&registration.site).await? {
        (site.latitude, site.longitude, "site")
    } else {
        (0.0, 0.0, "")
    };
    let advertise_addr = if registration.advertise_addr.is_empty() {
        peer.map(|ip| ip.to_string()).unwrap_or_default()
    } else {
        registration.advertise_addr.clone()
    };
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
    Ok(NewNode {
        provider_id,
        name: registration.name.clone(),
        public_key: registration.public_key.clone(),
        fingerprint: registration.fingerprint.clone(),
        region: registration.region.clone(),
        site: registration.site.clone(),
        fabric: registration.fabric.clone(),
        nvlink_domain: registration.nvlink_domain.clone(),
        latitude,
        longitude,
        gpu_model: registration.gpu_model.clone(),
        gpu_count: i64::from(registration.gpu_count),
        cpu_milli: i64::from(registration.cpu_milli),
        memory_mib: registration.memory_mib as i64,
        network_mbit_s: i64::from(registration.network_mbit_s),
        simulated: registration.simulated,
        policy,
        datasets: "[]".to_string(),
        runtimes,
        advertise_addr,
        gang_ports: registration.gang_ports.clone(),
        nvlink_source: registration.nvlink_source.clone(),
        nvlink_detected: registration.nvlink_detected.clone(),
        location_source: location_source.to_string(),
    })
}

/// `FIRST-LAST` with 1 ≤ FIRST ≤ LAST ≤ 65535.
fn parse_port_range(text: &str) -> Option<(u16, u16)> {
    let (first, last) = text.split_once('-')?;
    let (first, last): (u16, u16) = (first.trim().parse().ok()?, last.trim().parse().ok()?);
    (first >= 1 && first <= last).then_some((first, last))
}

/// Refuses a node whose declared NVLink domain disagrees with what NVML reported: a domain
/// whose members NVML puts in different fabrics (or a node NVML says is NVLinked only inside
/// itself, joining a domain with other nodes), or an NVML fabric split across declared domains.
/// The others are the registered nodes (but `restating`, the node itself) and `batch`, those
/// registered in the same request.
async fn check_nvlink_domain(
    state: &AppState,
    registration: &NodeRegistration,
    batch: &[NewNode],
    restating: Option<i64>,
) -> ApiResult<()> {
    let detected = registration.nvlink_detected.as_str();
    if detected.is_empty() {
        return Ok(());
    }
    let domain = registration.nvlink_domain.as_str();
    let stored = state
        .store
        .nodes_sharing_nvlink(&registration.site, &registration.fabric, domain, detected)
        .await?;
    let others = stored.iter().filter(|record| Some(record.id) != restating);
    for other in others.map(|record| &record.node).chain(batch) {
        let theirs = other.nvlink_detected.as_str();
        let same_domain = !domain.is_empty()
            && other.site == registration.site
            && other.fabric == registration.fabric
            && other.nvlink_domain == domain;
        if same_domain && detected == "node-local" {
            return Err(ApiError::BadRequest(format!(
                "nvlink_domain: {domain:?} is shared with node {:?}, but NVML reports this node's NVLink \
                 reaches only its own GPUs (no multi-node fabric)",
                other.name
            )));
        }
        if same_domain && !theirs.is_empty() && theirs != detected {
            return Err(ApiError::BadRequest(format!(
                "nvlink_domain: {domain:?} is shared with node {:?}, but NVML puts this node in fabric {detected} \
                 and that node in {theirs}",
                other.name
            )));
        }
        if !same_domain && theirs == detected && detected.starts_with("nvl-") {
            return Err(ApiError::BadRequest(format!(
                "nvlink_domain: NVML puts this node in fabric {detected} with node {:?}, which declares domain {:?}; \
                 declare the same domain (or none, to take NVML's)",
                other.name, other.nvlink_domain
            )));
        }
    }
    Ok(())
}

async fn full_node_view(state: &AppState, record: &store::NodeRecord) -> ApiResult<NodeView> {
    let mut views = full_node_views(state, std::slice::from_ref(record)).await?;
    Ok(views.remove(0))
}

/// Nodes as the API shows them, with their reputations read from one catch-up of the book.
async fn full_node_views(state: &AppState, records: &[store::NodeRecord]) -> ApiResult<Vec<NodeView>> {
    crate::reputation::catch_up(state).await?;
    let now_ms = state.now_us() / 1000;
    let mut views = Vec::with_capacity(records.len());
    for record in records {
        let live = state.store.live_leases_of_node(record.id).await?.len() as i64;
        let reputation = state.reputations.lock().await.node(record.id, now_ms);
        let mut view = node_view(record, reputation.score(), live, 0);
        view.reputation = Some(crate::wire::reputation_view(&reputation));
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
    state.store.set_node_policy(id, &text, state.now_us()).await?;
    // Its limits reach the running agent with its next heartbeat.
    state.forget_node(id);
    state.wake.notify_one();
    let record = own_node(&state, &caller, id).await?;
    Ok(Json(full_node_view(&state, &record).await?))
}

/// An owner takes GPUs of a node back (docs/trust-policy.md § 8).
pub async fn reclaim_node(
    State(state): AppStateRef,
    Auth(caller): Auth,
    Path(id): Path<i64>,
    JsonBody(request): JsonBody<ReclaimRequest>,
) -> ApiResult<Json<ReclaimView>> {
    require(&caller, &[Role::Provider, Role::Admin])?;
    own_node(&state, &caller, id).await?;
    Ok(Json(
        crate::reclaim::reclaim(&state, id, &request, state.now_us()).await?,
    ))
}

/// Gives a node's reclaimed GPUs back to the market.
pub async fn resume_node(
    State(state): AppStateRef,
    Auth(caller): Auth,
    Path(id): Path<i64>,
) -> ApiResult<Json<ReclaimView>> {
    require(&caller, &[Role::Provider, Role::Admin])?;
    own_node(&state, &caller, id).await?;
    Ok(Json(crate::reclaim::resume(&state, id, state.now_us()).await?))
}

/// Sets a site's coordinates (admins): its nodes that declare none move to them, and the
/// matcher sees them at its next rebuild.
pub async fn set_site(
    State(state): AppStateRef,
    Auth(caller): Auth,
    Path(name): Path<String>,
    JsonBody(request): JsonBody<SiteRequest>,
) -> ApiResult<Json<SiteView>> {
    require(&caller, &[Role::Admin])?;
    check_name("site", &name, true)?;
    check_coordinates(request.latitude, request.longitude)?;
    let site = store::SiteRecord {
        name,
        latitude: request.latitude,
        longitude: request.longitude,
        updated_at: state.now_us(),
    };
    let nodes = state.store.set_site(&site).await?;
    state.wake.notify_one();
    Ok(Json(site_view(&site, nodes)))
}

/// The sites with coordinates, and how many nodes take each one's.
pub async fn list_sites(State(state): AppStateRef, Auth(_caller): Auth) -> ApiResult<Json<Vec<SiteView>>> {
    let nodes = state.store.nodes().await?;
    let sites = state.store.sites().await?;
    Ok(Json(
        sites
            .iter()
            .map(|site| {
                let taking = nodes
                    .iter()
                    .filter(|node| node.node.site == site.name && node.node.location_source == "site")
                    .count();
                site_view(site, taking as u64)
            })
            .collect(),
    ))
}

fn site_view(site: &store::SiteRecord, nodes: u64) -> SiteView {
    SiteView {
        name: site.name.clone(),
        latitude: site.latitude,
        longitude: site.longitude,
        updated_at_us: site.updated_at,
        nodes,
    }
}

fn check_coordinates(latitude: f64, longitude: f64) -> ApiResult<()> {
    if (-90.0..=90.0).contains(&latitude) && (-180.0..=180.0).contains(&longitude) {
        Ok(())
    } else {
        Err(ApiError::BadRequest(
            "latitude must be −90…90 and longitude −180…180".into(),
        ))
    }
}

pub async fn earnings(State(state): AppStateRef, Auth(caller): Auth) -> ApiResult<Json<EarningsView>> {
    require(&caller, &[Role::Provider])?;
    let now = state.now_us();
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
