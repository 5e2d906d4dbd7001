//! Canaries (docs/trust-policy.md § 3): the leader orders known-answer benchmarks on nodes at
//! the times the rules give, heartbeat answers on any replica carry them to their nodes, and
//! the node's signed result is checked against the recomputed answer and the claimed GPU
//! model's rate. Two failures of a kind in a row prove fraud (`fraud::prove`).
//!
//! Nodes whose agents run CUDA get the matmul canary (`trust::matmul`) instead: their signed
//! result commits to each GPU's product by a Merkle root, the coordinator answers it with a
//! challenge drawn then, and the finding comes with the proof (`take_proof`).

use std::collections::{HashMap, HashSet};

use api::{CanaryAccepted, CanaryKind, CanaryOrder, CanaryProof, SignedCanaryResult};
use model::GpuCatalog;
use store::{CanaryRow, NewCanary, NodeRecord};
use trust::canary::CanaryResult;
use trust::rules::{self, CanaryFinding, CanaryHistory, CanaryRun, CanaryState, Evidence, Fraud};

use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// Slack on a canary's deadline past its run on a GPU at the slow line, for its delivery (a few
/// heartbeats) and its report.
pub const DEADLINE_SLACK_US: i64 = 60_000_000;
/// The heartbeat intervals a canary's deadline allows for its delivery.
pub const DEADLINE_HEARTBEATS: i64 = 3;
/// Canaries written per transaction.
pub const CANARIES_PER_COMMIT_MAX: usize = 512;
/// A canary's answers a node has to prove fraud from, read back at most.
const FINDINGS_READ_MAX: i64 = 16;
/// The seed's length in bytes.
const SEED_BYTES: usize = 16;

/// The canaries a heartbeat answer carries to `node`: those open and not past their deadline.
/// The first delivery is noted: the coordinator's clock for the canary's rate starts there.
pub async fn orders_for(state: &AppState, node: i64, now: i64) -> ApiResult<Vec<CanaryOrder>> {
    if !state
        .canary_hints
        .may_have(node, state.store.open_canary_nodes())
        .await?
    {
        return Ok(Vec::new());
    }
    let mut orders = Vec::new();
    for canary in state.store.open_canaries_of_node(node).await? {
        if canary.canary.deadline_at <= now {
            continue;
        }
        if canary.delivered_at.is_none() {
            state.canary_deliveries.submit((canary.id, now)).await?;
        }
        orders.push(order_of(&canary));
    }
    Ok(orders)
}

fn gpus_of(canary: &CanaryRow) -> Vec<u8> {
    serde_json::from_str(&canary.canary.gpus).unwrap_or_default()
}

fn kind_of(canary: &CanaryRow) -> CanaryKind {
    CanaryKind::parse(&canary.canary.kind).unwrap_or_default()
}

fn order_of(canary: &CanaryRow) -> CanaryOrder {
    CanaryOrder {
        id: canary.id,
        kind: kind_of(canary),
        seed: canary.canary.seed.clone(),
        units: u64::try_from(canary.canary.units).unwrap_or(0),
        gpus: gpus_of(canary),
        memory_mib: u64::try_from(canary.canary.memory_mib).unwrap_or(0),
        deadline_ms: canary.canary.deadline_at / 1000,
    }
}

fn new_seed() -> String {
    let mut bytes = [0u8; SEED_BYTES];
    getrandom::fill(&mut bytes).expect("the operating system's random source is available");
    hex::encode(bytes)
}

/// A canary for a node claiming `gpu_model`, on `gpus` (its idle ones): the work the claimed
/// model does in `canary_seconds`, 90 % of its memory on each GPU. With `matmul` (its agent runs
/// CUDA) and an NVIDIA model, the matmul canary: a product of `canary_matmul_n` per GPU, held to
/// the model's dense BF16 TFLOPS. `None` for an unknown model or no idle GPU.
fn new_canary(
    state: &AppState,
    node_id: i64,
    gpu_model: &str,
    fingerprint: &str,
    gpus: Vec<u8>,
    matmul: bool,
    now: i64,
) -> Option<NewCanary> {
    let catalog = GpuCatalog::embedded();
    let spec = catalog.spec(catalog.find(gpu_model)?);
    if gpus.is_empty() {
        return None;
    }
    let kind = if matmul && spec.vendor == "NVIDIA" {
        CanaryKind::Matmul
    } else {
        CanaryKind::Hash
    };
    let (units, expected_rate_milli) = match kind {
        CanaryKind::Hash => (
            trust::canary::units_for(state.config.canary_seconds, spec.cu_milli),
            trust::canary::expected_rate_milli(spec.cu_milli),
        ),
        CanaryKind::Matmul => (
            state.config.canary_matmul_n,
            trust::matmul::expected_rate_milli_tflops(spec.dense_tflops),
        ),
    };
    // A run at the slow line takes this long; the deadline leaves it that and the slack.
    let slow_run_us = i64::try_from(
        state.config.canary_seconds.saturating_mul(1_000_000) * 1000 / u64::from(rules::CANARY_SLOW_PERMILLE),
    )
    .unwrap_or(i64::MAX / 4);
    let deadline = now
        .saturating_add(slow_run_us)
        .saturating_add(DEADLINE_HEARTBEATS * state.config.heartbeat_interval_us())
        .saturating_add(DEADLINE_SLACK_US);
    Some(NewCanary {
        node_id,
        kind: kind.name().to_string(),
        seed: new_seed(),
        units: i64::try_from(units).unwrap_or(i64::MAX),
        gpus: serde_json::to_string(&gpus).expect("indexes serialise"),
        memory_mib: i64::from(spec.memory_mib) * i64::from(rules::CANARY_MEMORY_PERMILLE) / 1000,
        claimed_model: spec.name.clone(),
        expected_rate_milli: i64::try_from(expected_rate_milli).unwrap_or(i64::MAX),
        fingerprint: fingerprint.to_string(),
        created_at: now,
        deadline_at: deadline,
    })
}

/// Writes canaries in one transaction, in the writers' turn, and notes their nodes.
async fn insert(state: &AppState, canaries: &[NewCanary]) -> ApiResult<Vec<i64>> {
    if canaries.is_empty() {
        return Ok(Vec::new());
    }
    let ids = {
        let _turn = state.writer_turn().await;
        state.store.insert_canaries(canaries).await?
    };
    for (canary, id) in canaries.iter().zip(&ids) {
        state.canary_hints.add(canary.node_id);
        tracing::info!(node = canary.node_id, canary = id, units = canary.units, gpus = %canary.gpus, "canary ordered");
    }
    Ok(ids)
}

/// Orders a canary on the idle GPUs of `node` now (none when every GPU is leased); its id.
pub async fn order(state: &AppState, node: &NodeRecord, now: i64) -> ApiResult<Option<i64>> {
    let mut busy: u32 = 0;
    for lease in state.store.live_leases_of_node(node.id).await? {
        busy |= lease.lease.gpu_mask as u32;
    }
    let gpus: Vec<u8> = (0..node.node.gpu_count.clamp(0, 16) as u8)
        .filter(|gpu| busy & (1 << gpu) == 0)
        .collect();
    let matmul = !node.node.simulated && runs_matmul(&state.store.node_canary_kinds(node.id).await?);
    let Some(canary) = new_canary(
        state,
        node.id,
        &node.node.gpu_model,
        &node.node.fingerprint,
        gpus,
        matmul,
        now,
    ) else {
        return Ok(None);
    };
    Ok(insert(state, &[canary]).await?.first().copied())
}

/// A fast generator for the schedule's draws, seeded from the operating system at each look:
/// a node cannot tell when its canaries come (splitmix64).
struct Draws(u64);

impl Draws {
    fn new() -> Draws {
        let mut bytes = [0u8; 8];
        getrandom::fill(&mut bytes).expect("the operating system's random source is available");
        Draws(u64::from_le_bytes(bytes))
    }

    /// A uniform draw in [0, 1).
    fn unit(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (((z ^ (z >> 31)) >> 11) as f64) / (1u64 << 53) as f64
    }
}

/// Whether every GPU of a canary's (`gpus`, its stored JSON list) is idle in the view; a list
/// that cannot be read counts as idle (the canary then runs its course to its deadline).
fn all_idle(capacity: &model::NodeCapacity, gpus: &str) -> bool {
    serde_json::from_str::<Vec<u8>>(gpus).map_or(true, |gpus| {
        gpus.iter().all(|gpu| {
            capacity
                .gpu_milli_free
                .get(usize::from(*gpu))
                .is_none_or(|free| *free == model::GPU_MILLI_WHOLE)
        })
    })
}

/// The leader's look at canaries: those past their deadline are given up as unanswered, and
/// each online node whose next canary is due by the rules (a random draw for the `step_us` since
/// the last look) gets one on the GPUs its view has idle, all written in one transaction.
pub async fn schedule(state: &AppState, step_us: i64, now: i64) -> ApiResult<()> {
    let given_up = {
        let _turn = state.writer_turn().await;
        state.store.give_up_overdue_canaries(now).await?
    };
    for overdue in given_up {
        tracing::info!(
            node = overdue.node_id,
            canary = overdue.canary_id,
            "canary unanswered by its deadline"
        );
    }
    let latest: HashMap<i64, CanaryRow> = state
        .store
        .latest_canaries()
        .await?
        .into_iter()
        .map(|canary| (canary.canary.node_id, canary))
        .collect();
    let now_ms = now / 1000;
    let within_ms = i64::try_from(state.config.canary_within_ms).unwrap_or(i64::MAX);
    let matmul_nodes: HashSet<i64> = state.store.nodes_with_canary_kind(CanaryKind::Matmul.name()).await?;
    let mut draws = Draws::new();
    let mut due = Vec::new();
    let mut gave_way = Vec::new();
    {
        let view = state.view.lock().await;
        let Some(view) = view.as_ref() else { return Ok(()) };
        for (position, node) in view.records.iter().enumerate() {
            if !node.online {
                continue;
            }
            // Work took an open canary's GPUs: its node stops it unreported, so it is withdrawn
            // now rather than given up at its deadline, and the next comes on the idle GPUs.
            if let Some(open) = latest.get(&node.id).filter(|canary| canary.finding.is_none())
                && !all_idle(
                    &view.matcher.node_capacity(model::NodeId(position as u32)),
                    &open.canary.gpus,
                )
            {
                gave_way.push(open.id);
                continue;
            }
            // A node cordoned for fraud gets canaries again only on new hardware (or when its
            // provider asks for one: `POST /v1/nodes/{id}/verify`).
            if let Some(cordoned_at) = node.fraud_cordoned_at
                && node.fingerprint_changed_at.is_none_or(|changed| changed <= cordoned_at)
            {
                continue;
            }
            let history = CanaryHistory {
                registered_ms: node.registered_at / 1000,
                fingerprint_changed_ms: node.fingerprint_changed_at.map(|at| at / 1000),
                latest: latest.get(&node.id).map(|canary| {
                    let state = match canary.finding.as_deref() {
                        None => CanaryState::Open,
                        Some(name) => CanaryFinding::parse(name).map_or(CanaryState::Unanswered, CanaryState::Answered),
                    };
                    (
                        canary.canary.created_at / 1000,
                        canary.finished_at.map(|at| at / 1000),
                        state,
                    )
                }),
            };
            let chance = rules::canary_due(&history, now_ms, within_ms).chance_within(now_ms, step_us / 1000);
            if chance == 0.0 || draws.unit() >= chance {
                continue;
            }
            let capacity = view.matcher.node_capacity(model::NodeId(position as u32));
            let idle: Vec<u8> = (0..capacity.gpu_milli_free.len() as u8)
                .filter(|gpu| capacity.gpu_milli_free[usize::from(*gpu)] == model::GPU_MILLI_WHOLE)
                .collect();
            due.extend(new_canary(
                state,
                node.id,
                &node.node.gpu_model,
                &node.node.fingerprint,
                idle,
                !node.node.simulated && matmul_nodes.contains(&node.id),
                now,
            ));
        }
    }
    if !gave_way.is_empty() {
        let _turn = state.writer_turn().await;
        for id in gave_way {
            if state.store.withdraw_canary(id, now).await? {
                tracing::info!(canary = id, "canary withdrawn: work took its GPUs");
            }
        }
    }
    for batch in due.chunks(CANARIES_PER_COMMIT_MAX) {
        insert(state, batch).await?;
    }
    Ok(())
}

/// `POST /v1/agent/canaries`: a node's signed result. The signature is checked, then the order
/// (this node's, still open, the same seed and units), then the answer and the rate.
pub async fn take_result(state: &AppState, node_id: i64, signed: &SignedCanaryResult) -> ApiResult<CanaryAccepted> {
    let now = state.now_us();
    let body = &signed.body;
    let record = trust::SignedRecord {
        body: CanaryResult {
            canary_id: body.canary_id,
            seed: body.seed.clone(),
            units: body.units,
            digest: body.digest.clone(),
            elapsed_ms: body.elapsed_ms,
            rate_milli: body.rate_milli,
            memory_allocated: body.memory_allocated,
            measured_on: body.measured_on.clone(),
        },
        signature_hex: signed.signature_hex.clone(),
    };
    let identity = state.node_identity(node_id).await?;
    if let Err(error) = trust::verify_record(&identity.key, node_id, &record) {
        state
            .store
            .record_evidence(
                Some(node_id),
                "bad_canary_signature",
                &format!("canary {}", body.canary_id),
                now,
            )
            .await?;
        return Err(error.into());
    }
    let canary = ordered_on(state, node_id, body.canary_id, "result", now).await?;
    if let Some(finding) = &canary.finding {
        return Err(ApiError::Conflict(format!(
            "canary {} is over already ({finding}); a result is taken once, by its deadline",
            canary.id
        )));
    }
    if body.seed != canary.canary.seed || body.units != canary.canary.units {
        state
            .store
            .record_evidence(
                Some(node_id),
                "canary_mismatch",
                &format!("canary {}: another seed or unit count than ordered", canary.id),
                now,
            )
            .await?;
        return Err(ApiError::BadRequest(format!(
            "canary {}: the seed and units must be the ones ordered ({} units)",
            canary.id, canary.canary.units
        )));
    }
    let node = state
        .store
        .node(node_id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("node {node_id} not found")))?;
    let body_json = serde_json::to_string(body).map_err(|error| ApiError::Internal(error.to_string()))?;
    if kind_of(&canary) == CanaryKind::Matmul {
        return challenge(state, &node, &canary, body, (&body_json, &signed.signature_hex), now).await;
    }
    let (seed, gpus, units) = (
        canary.canary.seed.clone(),
        gpus_of(&canary),
        u64::try_from(canary.canary.units).unwrap_or(0),
    );
    let expected_digest = tokio::task::spawn_blocking(move || trust::canary::answer(&seed, &gpus, units))
        .await
        .map_err(|error| ApiError::Internal(format!("recomputing the canary's answer: {error}")))?;
    let rate = measured_rate(&canary, body, node.node.simulated, now);
    let run = CanaryRun {
        expected_digest,
        returned_digest: body.digest.clone(),
        rate: rate.map_or(canary.canary.expected_rate_milli, |rate| rate).max(0) as u64,
        expected_rate: canary.canary.expected_rate_milli.max(0) as u64,
        memory_allocated: body.memory_allocated,
    };
    let finding = run.finding();
    let reason = reason_of(&canary, &run, finding, rules::CANARY_SLOW_PERMILLE, "units/s");
    conclude(
        state,
        &node,
        &canary,
        finding,
        rate,
        Some((&body_json, &signed.signature_hex)),
        reason,
        now,
    )
    .await
}

/// Why a finding is what it is, in words a provider can act on; none for a pass.
fn reason_of(
    canary: &CanaryRow,
    run: &CanaryRun,
    finding: CanaryFinding,
    slow_permille: u32,
    unit: &str,
) -> Option<String> {
    match finding {
        CanaryFinding::Passed => None,
        CanaryFinding::WrongAnswer => Some("the answer is not the known one".to_string()),
        CanaryFinding::Slow if !run.memory_allocated => Some(format!(
            "a GPU could not allocate {} MiB, {} ‰ of the claimed {}'s memory",
            canary.canary.memory_mib,
            rules::CANARY_MEMORY_PERMILLE,
            canary.canary.claimed_model
        )),
        CanaryFinding::Slow => Some(format!(
            "{:.1} {unit} per GPU, under {:.1} % of the claimed {}'s {:.1}",
            run.rate as f64 / 1000.0,
            f64::from(slow_permille) / 10.0,
            canary.canary.claimed_model,
            run.expected_rate as f64 / 1000.0
        )),
    }
}

/// A matmul canary's committed result: its shape is checked (one Merkle root per GPU), a
/// challenge is drawn now, from the coordinator's random source, and stored with the signed
/// result; the answer names the rows each GPU must reveal. A result of the wrong shape is a
/// wrong answer at once.
async fn challenge(
    state: &AppState,
    node: &NodeRecord,
    canary: &CanaryRow,
    body: &api::CanaryResultBody,
    result: (&str, &str),
    now: i64,
) -> ApiResult<CanaryAccepted> {
    let gpus = gpus_of(canary);
    let roots: Vec<&str> = body.digest.split(',').collect();
    let well_formed = roots.len() == gpus.len()
        && roots
            .iter()
            .all(|root| root.len() == 64 && root.bytes().all(|byte| byte.is_ascii_hexdigit()));
    if !well_formed {
        let reason = format!(
            "the digest must list {} Merkle roots (64 hex characters each, comma-separated), one per GPU",
            gpus.len()
        );
        return conclude(
            state,
            node,
            canary,
            CanaryFinding::WrongAnswer,
            Some(body.rate_milli.max(0)),
            Some(result),
            Some(reason),
            now,
        )
        .await;
    }
    // The same result again (its answer was lost on the way): the same challenge again.
    if let Some(stored) = &canary.challenge {
        let mut seed = [0u8; trust::matmul::CHALLENGE_SEED_BYTES];
        if canary.result.as_deref() == Some(result.0) && hex::decode_to_slice(stored, &mut seed).is_ok() {
            return Ok(challenged(canary, &gpus, &seed));
        }
        return Err(ApiError::Conflict(format!(
            "canary {} was answered already with another result; a result is taken once",
            canary.id
        )));
    }
    let seed = trust::matmul::new_challenge_seed();
    let taken = {
        let _turn = state.writer_turn().await;
        state
            .store
            .challenge_canary(canary.id, &hex::encode(seed), result, body.rate_milli.max(0), now)
            .await?
    };
    if !taken {
        return Err(ApiError::Conflict(format!(
            "canary {} was answered meanwhile; a result is taken once",
            canary.id
        )));
    }
    tracing::info!(
        node = node.id,
        canary = canary.id,
        "matmul canary committed; challenged"
    );
    Ok(challenged(canary, &gpus, &seed))
}

/// The answer that carries a matmul canary's challenge: the rows each GPU must reveal.
fn challenged(canary: &CanaryRow, gpus: &[u8], seed: &[u8; trust::matmul::CHALLENGE_SEED_BYTES]) -> CanaryAccepted {
    let n = usize::try_from(canary.canary.units).unwrap_or(0);
    let challenge = api::CanaryChallenge {
        gpus: gpus
            .iter()
            .map(|gpu| api::CanaryChallengeRows {
                gpu: *gpu,
                rows: trust::matmul::challenge_rows(&trust::matmul::gpu_challenge(seed, *gpu), n),
            })
            .collect(),
    };
    CanaryAccepted {
        finding: "challenged".to_string(),
        fraud: None,
        challenge: Some(challenge),
        reason: None,
    }
}

/// Canary `canary_id`, when it was ordered on `node_id`; otherwise the attempt (a `what`: a
/// result or a proof) is kept as evidence and refused.
async fn ordered_on(
    state: &AppState,
    node_id: i64,
    canary_id: i64,
    what: &str,
    now: i64,
) -> ApiResult<store::CanaryRow> {
    match state.store.canary(canary_id).await? {
        Some(canary) if canary.canary.node_id == node_id => Ok(canary),
        _ => {
            state
                .store
                .record_evidence(
                    Some(node_id),
                    "foreign_canary",
                    &format!("{what} for canary {canary_id}"),
                    now,
                )
                .await?;
            Err(ApiError::Forbidden(format!(
                "canary {canary_id} was not ordered on node {node_id}; the attempt is recorded"
            )))
        }
    }
}

/// `POST /v1/agent/canaries/{id}/proof`: a matmul canary's proof. The rows must be those its
/// challenge asked for, in order, for every GPU of the order (else it is refused, and may be
/// sent again until the deadline); each must lead to the committed root and pass Freivalds'
/// check (else a wrong answer); then the node's measured rate is held to the claimed model's.
pub async fn take_proof(
    state: &AppState,
    node_id: i64,
    canary_id: i64,
    proof: &CanaryProof,
) -> ApiResult<CanaryAccepted> {
    let now = state.now_us();
    let canary = ordered_on(state, node_id, canary_id, "proof", now).await?;
    if let Some(finding) = &canary.finding {
        return Err(ApiError::Conflict(format!(
            "canary {canary_id} is over already ({finding}); a proof is taken once, by its deadline"
        )));
    }
    let Some(challenge_hex) = canary.challenge.clone() else {
        return Err(ApiError::Conflict(format!(
            "canary {canary_id} has no challenge: send its signed result to POST /v1/agent/canaries first"
        )));
    };
    let mut challenge = [0u8; trust::matmul::CHALLENGE_SEED_BYTES];
    hex::decode_to_slice(&challenge_hex, &mut challenge)
        .map_err(|error| ApiError::Internal(format!("canary {canary_id}'s stored challenge: {error}")))?;
    let body: api::CanaryResultBody = canary
        .result
        .as_deref()
        .and_then(|text| serde_json::from_str(text).ok())
        .ok_or_else(|| ApiError::Internal(format!("canary {canary_id}'s stored result cannot be read")))?;
    let gpus = gpus_of(&canary);
    let given: Vec<u8> = proof.gpus.iter().map(|openings| openings.gpu).collect();
    if given != gpus {
        return Err(ApiError::BadRequest(format!(
            "the proof must give the GPUs {gpus:?}, in that order, not {given:?}"
        )));
    }
    let checks: Vec<(String, String, Vec<trust::matmul::RowOpening>, u8)> = proof
        .gpus
        .iter()
        .zip(body.digest.split(','))
        .map(|(openings, root)| {
            let rows = openings
                .rows
                .iter()
                .map(|opening| trust::matmul::RowOpening {
                    index: opening.index,
                    row: opening.row.clone(),
                    path: opening.path.clone(),
                })
                .collect();
            (
                trust::matmul::gpu_seed(&canary.canary.seed, openings.gpu),
                root.to_string(),
                rows,
                openings.gpu,
            )
        })
        .collect();
    let n = u64::try_from(canary.canary.units).unwrap_or(0);
    let checked = tokio::task::spawn_blocking(move || {
        for (seed, root, rows, gpu) in &checks {
            trust::matmul::verify(seed, n, root, &trust::matmul::gpu_challenge(&challenge, *gpu), rows)
                .map_err(|error| (*gpu, error))?;
        }
        Ok::<(), (u8, trust::matmul::MatmulError)>(())
    })
    .await
    .map_err(|error| ApiError::Internal(format!("checking the canary's proof: {error}")))?;
    let node = state
        .store
        .node(node_id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("node {node_id} not found")))?;
    let rate = body.rate_milli.max(0);
    let (finding, reason) = match checked {
        Err((gpu, error @ (trust::matmul::MatmulError::Malformed(_) | trust::matmul::MatmulError::BadSize(_)))) => {
            return Err(ApiError::BadRequest(format!("canary {canary_id}, GPU {gpu}: {error}")));
        }
        Err((gpu, error)) => (CanaryFinding::WrongAnswer, Some(format!("GPU {gpu}: {error}"))),
        Ok(()) => {
            let run = CanaryRun {
                expected_digest: String::new(),
                returned_digest: String::new(),
                rate: rate as u64,
                expected_rate: canary.canary.expected_rate_milli.max(0) as u64,
                memory_allocated: body.memory_allocated,
            };
            let finding = run.finding_at(rules::MATMUL_SLOW_PERMILLE);
            let reason = reason_of(&canary, &run, finding, rules::MATMUL_SLOW_PERMILLE, "TFLOPS");
            (finding, reason)
        }
    };
    conclude(state, &node, &canary, finding, Some(rate), None, reason, now).await
}

/// Records a canary's finding (with the signed result when it is not stored yet, and why) and
/// what follows from it: the node's outcome, a cordon lifted by a pass on its current hardware,
/// fraud proven by a row of failures.
#[allow(clippy::too_many_arguments)]
async fn conclude(
    state: &AppState,
    node: &NodeRecord,
    canary: &CanaryRow,
    finding: CanaryFinding,
    rate: Option<i64>,
    result: Option<(&str, &str)>,
    reason: Option<String>,
    now: i64,
) -> ApiResult<CanaryAccepted> {
    let node_id = node.id;
    let name = finding.name();
    let finished = {
        let _turn = state.writer_turn().await;
        state
            .store
            .finish_canary(canary.id, name, rate, result, reason.as_deref(), now)
            .await?
    };
    if !finished {
        return Err(ApiError::Conflict(format!(
            "canary {} was answered meanwhile; a result is taken once",
            canary.id
        )));
    }
    let outcome = if finding == CanaryFinding::Passed {
        rules::Outcome::CanaryPassed
    } else {
        rules::Outcome::CanaryFailed
    };
    state.store.record_outcome(node_id, outcome.name(), now).await?;
    tracing::info!(node = node_id, canary = canary.id, finding = name, rate_milli = ?rate, reason = ?reason, "canary answered");
    let mut fraud = None;
    if finding == CanaryFinding::Passed {
        if node.fraud_cordoned_at.is_some() && canary.canary.fingerprint == node.node.fingerprint {
            tracing::info!(
                node = node_id,
                "a canary passed on the node's current hardware: its cordon is lifted"
            );
            state.store.lift_fraud_cordon(node_id, now).await?;
        }
    } else if let Some((proven, row)) = proof(state, node).await? {
        let first = row.first().map_or(canary.id, |canary| canary.id);
        let since = canary_evidence_since(state, node, first).await?;
        let evidence = serde_json::json!({
            "rule": format!("{} of {}: {} canaries of the same failure in a row", proven.section(), rules::POLICY_DOCUMENT, rules::CANARY_FAILURES_TO_PROVE),
            "canaries": row.iter().map(evidence_of).collect::<Vec<_>>(),
        });
        let key = format!("canary-{first}");
        if crate::fraud::prove(state, node, proven, evidence, since, key, now)
            .await?
            .is_some()
        {
            fraud = Some(proven.name().to_string());
        }
    }
    // Gold eligibility and reputation moved: every replica's matcher view is built again.
    state.store.touch_node(node_id, now).await?;
    state.wake.notify_one();
    Ok(CanaryAccepted {
        finding: name.to_string(),
        fraud,
        challenge: None,
        // The hash canary's answer stays as it was; its reason is in the canary's view.
        reason: reason.filter(|_| kind_of(canary) == CanaryKind::Matmul),
    })
}

/// The rate a canary is held to, in thousandths of a unit per second per GPU: the lower of the
/// node's own measure and the coordinator's (from the first delivery to the result). `None`
/// when no rate could be measured: a real GPU without a GPU kernel in this build (`cpu`), whose
/// answer alone is checked. A simulated device always measures one.
fn measured_rate(canary: &CanaryRow, body: &api::CanaryResultBody, simulated: bool, now: i64) -> Option<i64> {
    if body.measured_on == "cpu" && !simulated {
        return None;
    }
    let units = u64::try_from(canary.canary.units).unwrap_or(0);
    let coordinator = canary
        .delivered_at
        .map(|delivered| trust::canary::rate_milli(units, u64::try_from((now - delivered) / 1000).unwrap_or(0)))
        .map_or(i64::MAX, |rate| i64::try_from(rate).unwrap_or(i64::MAX));
    Some(body.rate_milli.max(0).min(coordinator))
}

/// The fraud a node's answered canaries since its last fraud decision prove, with the row of
/// canaries that proves it (oldest first).
async fn proof(state: &AppState, node: &NodeRecord) -> ApiResult<Option<(Fraud, Vec<CanaryRow>)>> {
    let last_fraud = state.store.last_fraud_of_node(node.id).await?.unwrap_or(i64::MIN);
    let mut answered: Vec<CanaryRow> = state
        .store
        .canaries_of_node(node.id, FINDINGS_READ_MAX)
        .await?
        .into_iter()
        .filter(|canary| {
            canary.canary.created_at > last_fraud && canary.finding.as_deref().and_then(CanaryFinding::parse).is_some()
        })
        .collect();
    answered.reverse();
    let mut evidence = Evidence::default();
    let mut proven = None;
    for canary in &answered {
        proven = canary
            .finding
            .as_deref()
            .and_then(CanaryFinding::parse)
            .and_then(|finding| evidence.canary(finding));
    }
    Ok(proven.map(|fraud| {
        let row = answered[answered.len() - rules::CANARY_FAILURES_TO_PROVE..].to_vec();
        (fraud, row)
    }))
}

/// Where a canary proof's period starts: at the node's last passed canary before the row (the
/// hardware was as claimed then), or at its registration.
async fn canary_evidence_since(state: &AppState, node: &NodeRecord, first: i64) -> ApiResult<i64> {
    let passed = state
        .store
        .canaries_of_node(node.id, FINDINGS_READ_MAX)
        .await?
        .into_iter()
        .filter(|canary| canary.id < first && canary.finding.as_deref() == Some(CanaryFinding::Passed.name()))
        .filter_map(|canary| canary.finished_at)
        .max();
    Ok(passed.unwrap_or(node.registered_at))
}

/// A canary as evidence: what was ordered, what came back signed, and what was found.
pub fn evidence_of(canary: &CanaryRow) -> serde_json::Value {
    serde_json::json!({
        "canary_id": canary.id,
        "kind": canary.canary.kind,
        "claimed_model": canary.canary.claimed_model,
        "units": canary.canary.units,
        "gpus": gpus_of(canary),
        "expected_rate_milli": canary.canary.expected_rate_milli,
        "rate_milli": canary.rate_milli,
        "finding": canary.finding,
        "reason": canary.reason,
        "challenge": canary.challenge,
        "fingerprint": canary.canary.fingerprint,
        "ordered_at_us": canary.canary.created_at,
        "delivered_at_us": canary.delivered_at,
        "answered_at_us": canary.finished_at,
        "result": canary.result.as_deref().and_then(|text| serde_json::from_str::<serde_json::Value>(text).ok()),
        "signature_hex": canary.signature,
    })
}

/// A canary as the API shows it.
pub fn view_of(canary: &CanaryRow) -> api::CanaryView {
    api::CanaryView {
        id: canary.id,
        node_id: canary.canary.node_id,
        kind: canary.canary.kind.clone(),
        units: canary.canary.units,
        gpus: gpus_of(canary),
        claimed_model: canary.canary.claimed_model.clone(),
        created_at_us: canary.canary.created_at,
        delivered_at_us: canary.delivered_at,
        finished_at_us: canary.finished_at,
        finding: canary.finding.clone(),
        reason: canary.reason.clone(),
        rate_milli: canary.rate_milli,
        expected_rate_milli: canary.canary.expected_rate_milli,
        result: canary
            .result
            .as_deref()
            .and_then(|text| serde_json::from_str(text).ok()),
        signature_hex: canary.signature.clone(),
    }
}

/// Whether a node's stored canary kinds (comma-separated) include matmul.
fn runs_matmul(kinds: &str) -> bool {
    kinds.split(',').any(|kind| kind == CanaryKind::Matmul.name())
}
