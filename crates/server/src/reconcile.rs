//! The reconcile loop: one replica (the leader) turns queued jobs into leases. Each pass
//! fetches what a decision needs from the store, lets the pure matcher decide, and writes the
//! result: placements, their escrow holds and their leases in one group-committed transaction.
//! It also takes silent nodes' leases away (epoch bumped, jobs requeued), carries out
//! preemptions when their grace ends, and frees the capacity of leases that ended.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ledger::Account;
use matcher::Placement;
use model::{GpuCatalog, Micros, Tier};
use store::{JobState, LeaseState, NewLease, PlacementWrite};
use trust::rules::Outcome;

use crate::books::reputation::NodeFacts;
use crate::config::{RECONCILE_JOBS_MAX, micros_of_ms};
use crate::error::ApiError;
use crate::fleet::FleetView;
use crate::lifecycle::{end_preempted, lose_leases_of_node, restart_jobs, settle_job, why_preempted};
use crate::metrics::Metrics;
use crate::state::AppState;

/// Placements written per transaction.
pub const PLACEMENTS_PER_COMMIT_MAX: usize = 64;
/// The shortest time between a pass and the next one a submission wakes.
pub const PASS_GAP_MIN: Duration = Duration::from_millis(50);
/// A replica that does not lead rebuilds its read-only view (quotes, offers) at most this often.
pub const FOLLOWER_VIEW_MAX_AGE: Duration = Duration::from_secs(5);

async fn build_view(state: &AppState) -> Result<FleetView, ApiError> {
    let version = state.store.nodes_version().await?;
    let nodes = state.store.nodes().await?;
    let leases = state.store.live_leases().await?;
    let standings = crate::reputation::standings(state, &NodeFacts::all(&nodes), state.now_us()).await?;
    Metrics::add(&state.metrics.rebuilds, 1);
    let view = FleetView::build(nodes, &leases, &standings, version, state.config.matcher.clone());
    if !view.conflicts.is_empty() {
        Metrics::add(&state.metrics.view_conflicts, view.conflicts.len() as u64);
        if state.config.strict_view {
            let conflicts: Vec<String> = view.conflicts.iter().map(ToString::to_string).collect();
            return Err(ApiError::Internal(format!(
                "the rebuilt view disagrees with the store: {}",
                conflicts.join("; ")
            )));
        }
    }
    Ok(view)
}

/// Makes sure a view exists for quotes and offer searches. The leader keeps its own current;
/// other replicas rebuild theirs when the fleet changed and it is older than a few seconds.
pub async fn ensure_view(state: &AppState) -> Result<(), ApiError> {
    let leader = state.leads();
    let stale = {
        let view = state.view.lock().await;
        match view.as_ref() {
            None => true,
            Some(view) if !leader => {
                let old = state
                    .view_built_at
                    .lock()
                    .expect("view age lock")
                    .is_none_or(|at| at.elapsed() > FOLLOWER_VIEW_MAX_AGE);
                old && state.store.nodes_version().await? != view.version
            }
            Some(_) => false,
        }
    };
    if stale {
        let view = build_view(state).await?;
        *state.view.lock().await = Some(view);
        *state.view_built_at.lock().expect("view age lock") = Some(Instant::now());
    }
    Ok(())
}

/// Takes the lead, the leader lock being held: fences off the previous leader (this waits for
/// its last placement to commit, so the view built next sees it, and makes any later one fail)
/// and starts from the store, not from what this replica saw as a follower. Returns the cursor
/// the passes start from.
pub async fn lead(state: &AppState) -> Result<Cursor, ApiError> {
    let epoch = state.store.take_leadership().await?;
    state.fence.store(epoch, std::sync::atomic::Ordering::SeqCst);
    tracing::info!("this replica now leads the reconcile loop");
    *state.view.lock().await = None;
    state.lease_hints.forget();
    state.metrics.is_leader.store(1, std::sync::atomic::Ordering::Relaxed);
    Ok(Cursor {
        led_since: state.now_us(),
        ..Cursor::default()
    })
}

/// Runs until `shutdown` turns true: tries to lead, and while leading, reconciles.
pub async fn run(state: Arc<AppState>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    let mut guard = None;
    let mut cursor = Cursor::default();
    let mut reasons: HashMap<i64, String> = HashMap::new();
    loop {
        if *shutdown.borrow() {
            return;
        }
        if guard.is_none() {
            match state.store.try_lead().await {
                Ok(Some(held)) => match lead(&state).await {
                    Ok(led) => {
                        cursor = led;
                        reasons.clear();
                        guard = Some(held);
                    }
                    Err(error) => {
                        tracing::warn!(%error, "could not take the leadership epoch");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        continue;
                    }
                },
                Ok(None) => {}
                Err(error) => tracing::warn!(%error, "could not ask for leadership"),
            }
        }
        if let Some(held) = guard.as_mut() {
            if held.still_held().await {
                match pass(&state, &mut cursor, &mut reasons).await {
                    Ok(()) => {}
                    Err(ApiError::Unavailable(message)) if message.contains("fenced") => {
                        tracing::warn!(%message, "another replica leads now; following");
                        guard = None;
                        state.metrics.is_leader.store(0, std::sync::atomic::Ordering::Relaxed);
                        state.lease_hints.forget();
                    }
                    Err(error) => tracing::warn!(%error, "reconcile pass failed; retrying"),
                }
                Metrics::add(&state.metrics.reconcile_passes, 1);
            } else {
                tracing::warn!("lost the leader lock; following");
                guard = None;
                state.metrics.is_leader.store(0, std::sync::atomic::Ordering::Relaxed);
                state.lease_hints.forget();
            }
        }
        let wait = if guard.is_some() {
            Duration::from_millis(state.config.reconcile_interval_ms)
        } else {
            Duration::from_secs(1)
        };
        tokio::select! {
            _ = state.wake.notified() => {
                // Submissions wake the loop one by one; a short gap lets a pass take them by the
                // dozen, each pass's reads and commit shared among them.
                tokio::select! {
                    _ = tokio::time::sleep(PASS_GAP_MIN) => {}
                    _ = shutdown.changed() => {}
                }
            }
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.changed() => {}
        }
    }
}

/// Changes are re-read this far behind the cursor: a replica's write stamped just before the
/// cursor moved may commit just after it. Applying a change twice is harmless.
pub const CHANGE_OVERLAP_US: i64 = 5_000_000;

/// How far the leader has read the store's changes (microseconds).
#[derive(Clone, Copy, Debug, Default)]
pub struct Cursor {
    /// Leases that ended at or after this are released from the matcher.
    pub ended_since: i64,
    /// Nodes that went on or off line at or after this are updated in the matcher.
    pub online_since: i64,
    /// Nodes that went over their owner's limits, or back within them, at or after this are
    /// cordoned or freed in the matcher.
    pub over_limit_since: i64,
    /// When the last pass looked for nodes over their limits for long enough to preempt bronze.
    pub over_limit_checked_at: i64,
    /// When the last pass looked for silent nodes.
    pub silence_checked_at: i64,
    /// When this replica began to lead: it finds no node silent for a heartbeat timeout after.
    pub led_since: i64,
    /// When the last pass looked whether reputations or gold eligibility moved.
    pub trust_checked_at: i64,
    /// When the last pass looked whether canaries are due.
    pub canaries_checked_at: i64,
}

/// How often the leader looks whether reputations moved enough to build its view again.
pub const TRUST_CHECK_EVERY_US: i64 = 30_000_000;

/// The longest gap between two looks for silent nodes (a scan of the nodes table); never more
/// than a quarter of the heartbeat timeout.
pub const SILENCE_CHECK_EVERY_MAX_US: i64 = 5_000_000;

/// A lease the store now holds: the view maps it, and heartbeats from its node ask for it.
fn record_lease(state: &AppState, view: &mut FleetView, record: &store::LeaseRecord, id: model::LeaseId) {
    view.record_lease(record.id, id);
    state.lease_hints.leased(record.lease.node_id);
}

/// One reconcile pass. Public so tests can drive the loop step by step.
pub async fn pass(state: &AppState, cursor: &mut Cursor, reasons: &mut HashMap<i64, String>) -> Result<(), ApiError> {
    let now = state.now_us();
    let version = state.store.nodes_version().await?;
    let mut rebuild = state
        .view
        .lock()
        .await
        .as_ref()
        .is_none_or(|view| view.version != version || view.stale);
    if !rebuild && now - cursor.trust_checked_at >= TRUST_CHECK_EVERY_US {
        cursor.trust_checked_at = now;
        let facts = view_facts(state).await;
        let standings = crate::reputation::standings(state, &facts, now).await?;
        rebuild = state
            .view
            .lock()
            .await
            .as_ref()
            .is_none_or(|view| view.trust_moved(&standings));
    }
    if rebuild {
        // Everything that changes after `now` is read again below; applying it twice is harmless.
        let built = build_view(state).await?;
        *state.view.lock().await = Some(built);
        cursor.ended_since = now;
        cursor.online_since = now;
        cursor.over_limit_since = now;
    }
    if rebuild || !state.lease_hints.known() {
        // Only this task writes leases while it leads, so the store's answer is exact now.
        let leases = state.store.live_leases().await?;
        state.lease_hints.know(leases.iter().map(|lease| lease.lease.node_id));
    }
    // Nodes that came back (heartbeats reach any replica) or went away.
    let changes = state
        .store
        .online_changes_since(cursor.online_since - CHANGE_OVERLAP_US)
        .await?;
    if !changes.is_empty() {
        let mut view = state.view.lock().await;
        let view = view.as_mut().expect("built above");
        for (node, online, at) in changes {
            view.set_online(node, online);
            cursor.online_since = cursor.online_since.max(at);
        }
    }
    // Whatever was stamped before `now` is read by now, or committed within the overlap.
    // (Kept at the newest change alone, the cursor stood still while nothing changed, and every
    // pass re-read the last burst: 43,000 rows and half a second a pass after 125,000 nodes
    // came on line.)
    cursor.online_since = cursor.online_since.max(now);
    over_limits(state, cursor, now).await?;
    // A new leader finds no node silent before it has led for a whole timeout: until then, a
    // node it has not heard from may have beaten to the replica that led before, whose rows of
    // those beats lag (see `beats`). Kubernetes' node controller waits the same way.
    let timeout = state.config.heartbeat_timeout_us();
    let check_every = (timeout / 4).min(SILENCE_CHECK_EVERY_MAX_US);
    if now - cursor.led_since >= timeout && now - cursor.silence_checked_at >= check_every {
        lose_silent_nodes(state, now).await?;
        cursor.silence_checked_at = now;
    }
    // Leases that ended (reported to any replica) free their capacity.
    let ended = state
        .store
        .leases_ended_since(cursor.ended_since - CHANGE_OVERLAP_US)
        .await?;
    if !ended.is_empty() {
        let mut view = state.view.lock().await;
        let view = view.as_mut().expect("built above");
        for (lease, at) in &ended {
            view.release(*lease);
            cursor.ended_since = cursor.ended_since.max(*at);
        }
        // A node cordoned for a conflict may be free of it now.
        view.stale |= !view.conflicts.is_empty();
    }
    cursor.ended_since = cursor.ended_since.max(now);
    // Preemptions whose grace has run out: the victim's lease ends and its job queues again.
    // A lease a grace period past its job's maximum runtime, which its agent should have
    // stopped, fails, and so does its job.
    let grace_us = i64::from(state.config.matcher.preemption_grace_s) * 1_000_000;
    for lease in state.store.leases_due(now, now - grace_us).await? {
        if lease.lease.preempt_at.is_some_and(|at| at <= now) {
            let reason = why_preempted(state, &lease).await;
            end_preempted(state, lease.id, &reason, now).await?;
            continue;
        }
        let reason = "ran past the job's max_runtime_s; stopped by the coordinator";
        let Some(ended) = state.store.end_lease(lease.id, LeaseState::Failed, reason, now).await? else {
            continue;
        };
        state.view.lock().await.as_mut().expect("built above").release(ended.id);
        tracing::warn!(
            lease = ended.id,
            job = ended.job_id,
            "a lease ran past its maximum runtime"
        );
        settle_job(state, ended.job_id).await?;
    }
    place_queued(state, now, reasons).await?;
    // After the placements: canaries take only the GPUs work left idle.
    trust_duties(state, cursor, now).await
}

/// The leader's share of the trust policy (docs/trust-policy.md): canaries that are due, and
/// the committed window hours that reputation counts.
async fn trust_duties(state: &AppState, cursor: &mut Cursor, now: i64) -> Result<(), ApiError> {
    let check_every = micros_of_ms(state.config.canary_check_every_ms);
    let canaries_due = now - cursor.canaries_checked_at >= check_every;
    let window_due = state.window_hours.lock().expect("window hours lock").sample_due(now);
    if !canaries_due && !window_due {
        return Ok(());
    }
    if canaries_due {
        let step = if cursor.canaries_checked_at == 0 {
            check_every
        } else {
            now - cursor.canaries_checked_at
        };
        cursor.canaries_checked_at = now;
        crate::canaries::schedule(state, step, now).await?;
    }
    if window_due {
        let now_s = now / 1_000_000;
        let outcomes = {
            let view = state.view.lock().await;
            let Some(view) = view.as_ref() else { return Ok(()) };
            let mut hours = state.window_hours.lock().expect("window hours lock");
            hours.sample(
                view.records
                    .iter()
                    .zip(view.matcher.nodes())
                    .map(|(record, node)| (record.id, node.policy.available_until(now_s).is_some(), record.online)),
                now,
            );
            hours.take_due(now)
        };
        // A whole fleet's hours, a batch at a time, each in the writers' turn: a submission
        // waits for one batch at most.
        for batch in outcomes.chunks(OUTCOMES_PER_COMMIT_MAX) {
            let _turn = state.writer_turn().await;
            state.store.record_outcomes(batch).await?;
        }
    }
    Ok(())
}

/// Window-hour outcomes written per transaction.
pub const OUTCOMES_PER_COMMIT_MAX: usize = 512;

/// What standings and canaries need of each node of the view (none before it is built).
async fn view_facts(state: &AppState) -> Vec<NodeFacts> {
    let view = state.view.lock().await;
    view.as_ref()
        .map(|view| NodeFacts::all(&view.records))
        .unwrap_or_default()
}

/// How often a pass looks for nodes that have been over their limits long enough.
const OVER_LIMIT_CHECK_EVERY_US: i64 = 1_000_000;

/// Cordons the nodes that went over their owner's limits (heartbeats reach any replica) and
/// frees those back within them; a node over them for `over_limit_preempt_after_ms` has its
/// bronze leases preempted (the agent gets SIGTERM, a grace period, then kill). A preemption once
/// started goes on even if the node cools down within the grace.
async fn over_limits(state: &AppState, cursor: &mut Cursor, now: i64) -> Result<(), ApiError> {
    let changes = state
        .store
        .over_limit_changes_since(cursor.over_limit_since - CHANGE_OVERLAP_US)
        .await?;
    if !changes.is_empty() {
        let mut view = state.view.lock().await;
        let view = view.as_mut().expect("built above");
        for (node, since, _) in changes {
            view.set_over_limit(node, since);
        }
    }
    cursor.over_limit_since = cursor.over_limit_since.max(now);
    if now - cursor.over_limit_checked_at < OVER_LIMIT_CHECK_EVERY_US {
        return Ok(());
    }
    cursor.over_limit_checked_at = now;
    let grace_us = i64::from(state.config.matcher.preemption_grace_s) * 1_000_000;
    let persisted = now.saturating_sub(state.config.over_limit_preempt_after_us());
    for node in state.store.nodes_over_limit_since(persisted).await? {
        for lease in state.store.live_leases_of_node(node).await? {
            if lease.lease.tier == Tier::Bronze.name() && lease.lease.preempt_at.is_none() {
                tracing::warn!(node, lease = lease.id, "node stayed over its limits; preempting bronze");
                state.store.set_lease_preempt_at(lease.id, Some(now + grace_us)).await?;
            }
        }
    }
    Ok(())
}

async fn lose_silent_nodes(state: &AppState, now: i64) -> Result<(), ApiError> {
    let cutoff = now.saturating_sub(state.config.heartbeat_timeout_us());
    for node in state.store.silent_nodes(cutoff).await? {
        // The row of a beat this replica took may lag (see `beats`); its memory does not.
        if state.beats.heard_since(node, cutoff) {
            continue;
        }
        if !state.store.set_node_offline(node, now).await? {
            continue;
        }
        tracing::warn!(node, "node went silent; its leases are lost");
        let (freed, in_window) = match state.view.lock().await.as_mut() {
            Some(view) => {
                // An absence begins at the node's last heartbeat, a timeout ago.
                let in_window = view.dense.get(&node).is_some_and(|dense| {
                    view.matcher.nodes()[dense.index()]
                        .policy
                        .available_until(cutoff / 1_000_000)
                        .is_some()
                });
                (view.set_online(node, false), in_window)
            }
            None => (Vec::new(), false),
        };
        state.store.record_outcome(node, Outcome::NodeFault.name(), now).await?;
        let jobs = lose_leases_of_node(state, node, "node stopped sending heartbeats", now).await?;
        let mut unrepaired = Vec::new();
        for job in jobs {
            let lost: Vec<model::Lease> = freed
                .iter()
                .filter(|lease| lease.job.0 == job as u64)
                .cloned()
                .collect();
            if !repair_gang(state, job, &lost, now).await? {
                unrepaired.push(job);
            }
        }
        restart_jobs(state, &unrepaired, "its node went silent; queued again", now).await?;
        if in_window && let Some(record) = state.store.node(node).await? {
            crate::fraud::absence(state, &record, cutoff, now).await?;
        }
    }
    Ok(())
}

/// Replaces a running gang's lost replicas next to its survivors (same NVLink domain, then
/// fabric, preempting bronze if needed). False when the job is not a gang with survivors or no
/// replacement fits: then the caller restarts it whole.
async fn repair_gang(state: &AppState, job_id: i64, lost: &[model::Lease], now: i64) -> Result<bool, ApiError> {
    let Some(job) = state.store.job(job_id).await? else {
        return Ok(false);
    };
    if lost.is_empty() || job.state != JobState::Running {
        return Ok(false);
    }
    let now_s = now / 1_000_000;
    let catalog = GpuCatalog::embedded();
    let (writes, victims_due) = {
        let mut guard = state.view.lock().await;
        let Some(view) = guard.as_mut() else { return Ok(false) };
        let request = crate::wire::job_request(&job);
        let Ok(spec) = request.to_spec(job.id, job.tenant_id, job.submitted_at / 1_000_000, |name| {
            view.region(name)
        }) else {
            return Ok(false);
        };
        if spec.replicas < 2 || view.matcher.job_leases(spec.id).is_empty() {
            return Ok(false);
        }
        let Ok(plan) = view.matcher.plan_repair(&spec, lost, now_s) else {
            return Ok(false);
        };
        let victims = victim_leases(view, &plan.victims);
        let Ok(committed) = view.matcher.commit_repair(&plan) else {
            return Ok(false);
        };
        let victims_due = take_victims(view, &victims, job_id, now);
        let leases = new_leases(view, &plan.placement, &committed, &spec, catalog, now);
        (
            leases
                .into_iter()
                .zip(committed.iter().map(|lease| lease.id))
                .collect::<Vec<_>>(),
            victims_due,
        )
    };
    let (new, ids): (Vec<NewLease>, Vec<model::LeaseId>) = writes.into_iter().unzip();
    let fence = state.fence.load(std::sync::atomic::Ordering::SeqCst);
    let records = match state.store.add_leases(job_id, &new, &victims_due, now, fence).await {
        Ok(records) => records,
        Err(error) => {
            // The matcher took the replacements and let the victims go: neither happened.
            if let Some(view) = state.view.lock().await.as_mut() {
                view.stale = true;
            }
            return Err(error.into());
        }
    };
    if let Some(view) = state.view.lock().await.as_mut() {
        for (record, id) in records.iter().zip(ids) {
            record_lease(state, view, record, id);
        }
    }
    Metrics::add(&state.metrics.leases_granted, records.len() as u64);
    tracing::info!(
        job = job_id,
        replicas = records.len(),
        "repaired a gang after a node loss"
    );
    Ok(true)
}

struct Pending {
    submitted_at: i64,
    matcher_job: model::JobId,
    matcher_leases: Vec<model::LeaseId>,
    /// Whether the placement preempts: the matcher let its victims go.
    preempts: bool,
}

/// A plan's victims as the matcher held them, read before the plan commits (which releases
/// them).
fn victim_leases(view: &FleetView, victims: &[matcher::Victim]) -> Vec<(matcher::Victim, Option<model::Lease>)> {
    victims
        .iter()
        .map(|victim| (victim.clone(), view.matcher.lease(victim.lease).cloned()))
        .collect()
}

/// The store leases of a committed plan's victims, each with the end of its grace period. The
/// matcher released them whole; what their preemptor (`job`) does not hold stays held until they
/// end (`FleetView::hold_victim`).
fn take_victims(
    view: &mut FleetView,
    victims: &[(matcher::Victim, Option<model::Lease>)],
    job: i64,
    now: i64,
) -> Vec<store::Victim> {
    let mut out = Vec::with_capacity(victims.len());
    for (victim, lease) in victims {
        let Some(store_lease) = view.store_of_lease.remove(&victim.lease) else {
            continue;
        };
        view.lease_of_store.remove(&store_lease);
        if let Some(lease) = lease {
            let hold = crate::fleet::VictimHold {
                node: lease.node,
                gpu_mask: lease.gpu_mask,
                gpu_milli: lease.gpu_milli,
                by_job: job,
            };
            if let Err(error) = view.hold_victim(store_lease, hold) {
                // Released GPUs always fit; a failure is a bug, and the next view finds it.
                tracing::error!(lease = store_lease, %error, "a victim's other GPUs could not be held");
                view.stale = true;
            }
        }
        out.push(store::Victim {
            lease_id: store_lease,
            preempt_at: now + i64::from(victim.grace_s) * 1_000_000,
        });
    }
    out
}

async fn place_queued(state: &AppState, now: i64, reasons: &mut HashMap<i64, String>) -> Result<(), ApiError> {
    let mut queued = state.store.jobs_in_states(&[JobState::Queued]).await?;
    if queued.is_empty() {
        return Ok(());
    }
    queued.sort_by_key(|job| (Tier::parse(&job.tier).map_or(3, |tier| tier as u8), job.id));
    queued.truncate(RECONCILE_JOBS_MAX);
    let now_s = now / 1_000_000;
    let catalog = GpuCatalog::embedded();
    let mut balances: HashMap<i64, Micros> = HashMap::new();
    let mut writes = Vec::new();
    let mut pending = Vec::new();
    let mut reason_updates = Vec::new();
    {
        let mut guard = state.view.lock().await;
        let view = guard.as_mut().expect("built before placing");
        view.matcher.advance_clock(now_s);
        for job in &queued {
            let request = crate::wire::job_request(job);
            let spec = match request.to_spec(job.id, job.tenant_id, job.submitted_at / 1_000_000, |name| {
                view.region(name)
            }) {
                Ok(spec) => spec,
                Err(error) => {
                    reason_updates.push((job.id, format!("invalid spec: {error}")));
                    continue;
                }
            };
            let available = match balances.get(&job.tenant_id) {
                Some(balance) => *balance,
                None => {
                    let balance = Micros(
                        state
                            .store
                            .balance(&Account::TenantAvailable(job.tenant_id).key())
                            .await?,
                    );
                    balances.insert(job.tenant_id, balance);
                    balance
                }
            };
            if available.0 <= 0 {
                reason_updates.push((job.id, "waiting: the tenant's balance is $0; add credit".to_string()));
                continue;
            }
            let decided = Instant::now();
            let planned = view.matcher.plan(&spec, now_s);
            let (placement, victims) = match planned {
                Ok(placement) => (placement, Vec::new()),
                Err(unplaced) if spec.tier != Tier::Bronze => match view.matcher.plan_preemption(&spec, now_s) {
                    Ok(plan) => (plan.placement.clone(), plan.victims.clone()),
                    Err(_) => {
                        reason_updates.push((job.id, waiting(state, &spec, &unplaced)));
                        continue;
                    }
                },
                Err(unplaced) => {
                    reason_updates.push((job.id, waiting(state, &spec, &unplaced)));
                    continue;
                }
            };
            Metrics::add(&state.metrics.decisions, 1);
            let gpu_milli_total: u64 = placement
                .leases
                .iter()
                .map(|lease| u64::from(lease.gpu_milli_total()))
                .sum();
            let wanted = ledger::hold_amount(spec.max_price, gpu_milli_total.max(1), u64::from(spec.max_runtime_s))
                .unwrap_or(available);
            let hold = match ledger::hold(
                job.tenant_id,
                job.id,
                wanted,
                available,
                format!("hold:job-{}", job.id),
                now,
            ) {
                Ok(hold) => hold,
                Err(error) => {
                    reason_updates.push((job.id, format!("waiting: {error}")));
                    continue;
                }
            };
            let victims = victim_leases(view, &victims);
            let committed = if victims.is_empty() {
                view.matcher.commit(&placement)
            } else {
                let plan = matcher::PreemptionPlan {
                    placement: placement.clone(),
                    victims: victims.iter().map(|(victim, _)| victim.clone()).collect(),
                };
                view.matcher.commit_preemption(&plan)
            };
            let committed = match committed {
                Ok(leases) => leases,
                Err(error) => {
                    tracing::error!(job = job.id, %error, "a fresh plan did not commit");
                    continue;
                }
            };
            Metrics::add(&state.metrics.decision_nanos, decided.elapsed().as_nanos() as u64);
            let victims = take_victims(view, &victims, job.id, now);
            let held = hold
                .entries
                .iter()
                .find(|entry| matches!(entry.account, Account::Escrow(_)))
                .map_or(0, |entry| entry.amount.0);
            balances.insert(job.tenant_id, Micros(available.0 - held));
            let leases = new_leases(view, &placement, &committed, &spec, catalog, now);
            pending.push(Pending {
                submitted_at: job.submitted_at,
                matcher_job: spec.id,
                matcher_leases: committed.iter().map(|lease| lease.id).collect(),
                preempts: !victims.is_empty(),
            });
            writes.push(PlacementWrite {
                job_id: job.id,
                leases,
                hold: Some(crate::money::row(&hold)),
                victims,
            });
            reasons.remove(&job.id);
        }
    }
    for (writes, pending) in writes
        .chunks(PLACEMENTS_PER_COMMIT_MAX)
        .zip(pending.chunks(PLACEMENTS_PER_COMMIT_MAX))
    {
        let result = {
            let _turn = state.writer_turn().await;
            state
                .store
                .commit_placements(writes, now, state.fence.load(std::sync::atomic::Ordering::SeqCst))
                .await
        };
        let mut guard = state.view.lock().await;
        let view = guard.as_mut().expect("built before placing");
        match result {
            Ok(results) => {
                for (outcome, pending) in results.into_iter().zip(pending) {
                    match outcome {
                        Some(records) => {
                            Metrics::add(&state.metrics.placements, 1);
                            state.metrics.lease_grant.observe_us(now - pending.submitted_at);
                            Metrics::add(&state.metrics.leases_granted, records.len() as u64);
                            for (record, id) in records.iter().zip(&pending.matcher_leases) {
                                record_lease(state, view, record, *id);
                            }
                        }
                        None => {
                            view.matcher.release_job(pending.matcher_job, now / 1_000_000);
                            // Its victims were not marked and run on: the matcher must hold
                            // them again.
                            view.stale |= pending.preempts;
                        }
                    }
                }
            }
            Err(error) => {
                tracing::warn!(%error, "placements were not written; their jobs stay queued");
                for pending in pending {
                    view.matcher.release_job(pending.matcher_job, now / 1_000_000);
                    view.stale |= pending.preempts;
                }
                if matches!(error, store::StoreError::Fenced(_)) {
                    return Err(error.into());
                }
            }
        }
    }
    reason_updates.retain(|(job, reason)| reasons.get(job) != Some(reason));
    if !reason_updates.is_empty() {
        {
            let _turn = state.writer_turn().await;
            state.store.set_queued_reasons(&reason_updates, now).await?;
        }
        reasons.extend(reason_updates);
    }
    Ok(())
}

/// Why a job waits, in words: the matcher's account, and for gold work the rule that narrows
/// where it may go.
fn waiting(state: &AppState, spec: &model::JobSpec, unplaced: &impl std::fmt::Display) -> String {
    if spec.tier == Tier::Gold && state.config.gold_needs_badge {
        format!(
            "waiting: {unplaced}; gold work goes only to nodes of gold-badge providers whose last canary passed \
             (docs/trust-policy.md § 2)"
        )
    } else {
        format!("waiting: {unplaced}")
    }
}

fn new_leases(
    view: &FleetView,
    placement: &Placement,
    committed: &[model::Lease],
    spec: &model::JobSpec,
    catalog: &GpuCatalog,
    now: i64,
) -> Vec<NewLease> {
    committed
        .iter()
        .map(|lease| {
            let node = &view.matcher.nodes()[lease.node.index()];
            NewLease {
                replica: i64::from(lease.replica),
                node_id: view.node_ids[lease.node.index()],
                gpu_mask: i64::from(lease.gpu_mask),
                gpu_milli: i64::from(lease.gpu_milli),
                cpu_milli: i64::from(lease.cpu_milli),
                memory_mib: lease.memory_mib as i64,
                price_micros: lease.price.0,
                tier: spec.tier.name().to_string(),
                gpu_model: catalog.spec(node.gpu_model).name.clone(),
                region: view.matcher.topology().region_name(node.path.region).to_string(),
                expected_end: now + i64::from(spec.max_runtime_s) * 1_000_000,
                preempt_at: preempt_at(node, placement, spec, now, view.matcher.config().preemption_grace_s),
            }
        })
        .collect()
}

/// When an interruptible lease must stop: before a reservation takes its GPUs, or when the
/// provider's availability window closes (SIGTERM a grace period before the end, so the node is
/// free when the window ends). Gold and silver only go where the window covers their runtime.
fn preempt_at(node: &model::Node, placement: &Placement, spec: &model::JobSpec, now: i64, grace_s: u32) -> Option<i64> {
    let reservation = placement.preempt_at.map(|at| at * 1_000_000);
    if !spec.interruptible() {
        return reservation;
    }
    let grace_us = i64::from(grace_s) * 1_000_000;
    let expected_end = now + i64::from(spec.max_runtime_s) * 1_000_000;
    let window_end = node
        .policy
        .available_until(now / 1_000_000)
        .filter(|end| *end != i64::MAX)
        .map(|end| (end * 1_000_000 - grace_us).max(now))
        .filter(|at| *at < expected_end);
    match (reservation, window_end) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}
