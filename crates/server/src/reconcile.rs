//! The reconcile loop: one replica (the leader) turns queued jobs into leases. Each pass
//! fetches what a decision needs from the store, lets the pure matcher decide, and writes the
//! result: placements, their escrow holds and their leases in one group-committed transaction.
//! It also takes silent nodes' leases away (epoch bumped, jobs requeued), carries out
//! preemptions when their grace ends, and frees the capacity of leases that ended.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ledger::Account;
use model::{Micros, Tier};
use store::{JobState, LeaseState, NewLease, PlacementWrite};
use trust::rules::Outcome;

use crate::books::reputation::NodeFacts;
use crate::config::{RECONCILE_JOBS_MAX, micros_of_ms};
use crate::decide::{Owned, Pending, Repair, Rules, decide, decide_repair};
use crate::error::ApiError;
use crate::fleet::FleetView;
use crate::lifecycle::{end_preempted, lose_leases_of_node, restart_jobs, settle_job, why_preempted};
use crate::metrics::Metrics;
use crate::state::AppState;

/// Placements written per transaction.
pub const PLACEMENTS_PER_COMMIT_MAX: usize = 256;
/// The shortest time between a pass and the next one a submission wakes.
pub const PASS_GAP_MIN: Duration = Duration::from_millis(50);
/// A replica that does not lead rebuilds its read-only view (quotes, offers) at most this often.
pub const FOLLOWER_VIEW_MAX_AGE: Duration = Duration::from_secs(5);

async fn build_view(state: &AppState) -> Result<FleetView, ApiError> {
    let version = state.store.nodes_version().await?;
    let nodes = state.store.nodes().await?;
    build_view_of(state, nodes, version).await
}

/// The view `built` with the nodes registered since it was built added (up to `version`'s
/// highest id): its own records (kept current as the passes apply changes to them) and the new
/// nodes' rows, not the whole nodes table again. Only for a view no node of which changed since
/// (`Store::nodes_changed_since`); the changes a pass reads (nodes on and off line, over their
/// limits, leases ended) are read from where the last pass left off, not from the rebuild.
async fn grow_view(state: &AppState, version: store::NodesVersion) -> Result<FleetView, ApiError> {
    let mut records = {
        let view = state.view.lock().await;
        view.as_ref().map(|view| view.records.clone()).unwrap_or_default()
    };
    let after = records.last().map_or(0, |record| record.id);
    records.extend(state.store.nodes_between(after, version.highest_id).await?);
    Metrics::add(&state.metrics.grows, 1);
    build_view_of(state, records, version).await
}

/// Builds the view from `nodes` (every node, in id order) and the leases, standings and
/// bookings the store holds now.
async fn build_view_of(
    state: &AppState,
    nodes: Vec<store::NodeRecord>,
    version: store::NodesVersion,
) -> Result<FleetView, ApiError> {
    let started = Instant::now();
    let leases = state.store.live_leases().await?;
    let leases_read = started.elapsed();
    let standings = crate::reputation::standings(state, &NodeFacts::all(&nodes), state.now_us()).await?;
    let standings_read = started.elapsed();
    Metrics::add(&state.metrics.rebuilds, 1);
    let mut view = FleetView::build(nodes, &leases, &standings, version, state.config.matcher.clone());
    let matcher_built = started.elapsed();
    crate::reservations::restore_all(state, &mut view).await?;
    tracing::debug!(
        leases = leases.len(),
        leases_ms = leases_read.as_millis(),
        standings_ms = (standings_read - leases_read).as_millis(),
        matcher_ms = (matcher_built - standings_read).as_millis(),
        bookings_ms = (started.elapsed() - matcher_built).as_millis(),
        "built the view from the records"
    );
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
    let mut services = crate::services::Memory::default();
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
                        services = crate::services::Memory::default();
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
                let passed = match pass(&state, &mut cursor, &mut reasons).await {
                    Ok(()) => crate::services::tend(&state, &mut services, state.now_us()).await,
                    Err(error) => Err(error),
                };
                match passed {
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
    /// When the last pass looked for gangs past their start barrier's deadline.
    pub gangs_checked_at: i64,
    /// When the last pass looked for owners' reclaims whose time is up.
    pub reclaims_checked_at: i64,
    /// When the last pass looked for bookings that start or end.
    pub reservations_checked_at: i64,
    /// When the last pass removed output archives past their retention.
    pub outputs_expired_at: i64,
    /// When the last rebuild of the view began, and how long it took.
    pub rebuilt_at: i64,
    pub rebuild_took_us: i64,
    /// The highest node id the last pass saw: more now means nodes are still registering.
    pub highest_node_seen: i64,
}

/// While nodes keep registering, those registered since the view was built wait for it until
/// the last rebuild is this many times its own length old (unless something else needs a
/// rebuild): rebuilding then takes at most a quarter of the leader's time while a fleet
/// registers, a small fleet (whose rebuild takes milliseconds) hardly waits, and the pass after
/// the last registration rebuilds at once.
pub const NEW_NODES_REBUILD_GAP: i64 = 3;

/// How often the leader looks for gangs past their start barrier's deadline.
pub const GANG_CHECK_EVERY_US: i64 = 1_000_000;

/// How often the leader removes output archives past their retention (an archive outlives its
/// retention by at most this).
pub const OUTPUT_EXPIRY_EVERY_US: i64 = 600_000_000;

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
    let built_from = state.view.lock().await.as_ref().map(|view| {
        let held = view.records.last().map_or(0, |record| record.id);
        (view.version, view.stale, held)
    });
    let mut rebuild = built_from.is_none_or(|(built, stale, _)| built != version || stale);
    // When nothing but new nodes moved the version, they join the view without the whole fleet
    // being read again (`grow_view`). Nodes registering by the thousand would still have the
    // leader build its matcher back to back: while nodes keep registering (more than at the
    // last pass), they wait for the view until the last rebuild is `NEW_NODES_REBUILD_GAP`
    // times its own length old.
    let growing = version.highest_id > cursor.highest_node_seen;
    cursor.highest_node_seen = version.highest_id;
    let mut grow = false;
    if let Some((built, false, held)) = built_from
        && rebuild
        && version.highest_id > built.highest_id
        && !state
            .store
            .nodes_changed_since(store::NodesVersion {
                updated_at: built.updated_at,
                highest_id: built.highest_id.max(held),
            })
            .await?
    {
        if growing && now - cursor.rebuilt_at < NEW_NODES_REBUILD_GAP.saturating_mul(cursor.rebuild_took_us) {
            rebuild = false;
        } else {
            grow = true;
        }
    }
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
        let started = std::time::Instant::now();
        let built = if grow {
            grow_view(state, version).await?
        } else {
            build_view(state).await?
        };
        cursor.rebuilt_at = now;
        cursor.rebuild_took_us = i64::try_from(started.elapsed().as_micros()).unwrap_or(i64::MAX);
        tracing::debug!(
            nodes = built.matcher.nodes().len(),
            grown = grow,
            ms = cursor.rebuild_took_us / 1000,
            "rebuilt the view"
        );
        *state.view.lock().await = Some(built);
        // A grown view holds the old one's records as the passes left them: what changed since
        // is read from where the last pass left off.
        if !grow {
            cursor.ended_since = now;
            cursor.online_since = now;
            cursor.over_limit_since = now;
        }
    }
    if (rebuild && !grow) || !state.lease_hints.known() {
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
        for change in changes {
            view.set_online(change.node_id, change.online);
            cursor.online_since = cursor.online_since.max(change.changed_at);
        }
    }
    // Whatever was stamped before `now` is read by now, or committed within the overlap.
    // (Kept at the newest change alone, the cursor stood still while nothing changed, and every
    // pass re-read the last burst: 43,000 rows and half a second a pass after 125,000 nodes
    // came on line.)
    cursor.online_since = cursor.online_since.max(now);
    over_limits(state, cursor, now).await?;
    if now - cursor.reclaims_checked_at >= crate::reclaim::EXPIRY_CHECK_EVERY_US {
        cursor.reclaims_checked_at = now;
        crate::reclaim::end_expired(state, now).await?;
    }
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
        for lease in &ended {
            view.release(lease.lease_id);
            cursor.ended_since = cursor.ended_since.max(lease.ended_at);
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
    if now - cursor.reservations_checked_at >= crate::reservations::CHECK_EVERY_US {
        cursor.reservations_checked_at = now;
        crate::reservations::tend(state, now).await?;
    }
    if now - cursor.gangs_checked_at >= GANG_CHECK_EVERY_US {
        cursor.gangs_checked_at = now;
        crate::lifecycle::unassembled_gangs(state, state.config.gang_start_timeout_us(), now).await?;
    }
    if state.config.output_retention_days > 0 && now - cursor.outputs_expired_at >= OUTPUT_EXPIRY_EVERY_US {
        cursor.outputs_expired_at = now;
        let retention = i64::from(state.config.output_retention_days).saturating_mul(86_400_000_000);
        let removed = state.store.expire_output_archives(now - retention, now).await?;
        if removed > 0 {
            tracing::info!(
                removed,
                days = state.config.output_retention_days,
                "output archives past their retention removed"
            );
        }
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
        for change in changes {
            view.set_over_limit(change.node_id, change.over_limit_since);
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
        crate::reservations::node_lost(state, node, now).await?;
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
    let repair = {
        let mut guard = state.view.lock().await;
        let Some(view) = guard.as_mut() else { return Ok(false) };
        let Some(repair) = decide_repair(view, &job, lost, now) else {
            return Ok(false);
        };
        repair
    };
    let Repair {
        leases: writes,
        victims: victims_due,
    } = repair;
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
    // A new epoch of the gang's rendezvous: by default its survivors start again with the new
    // peers, from the job's checkpoint; a job that re-rendezvous itself keeps them running.
    let keep = crate::wire::job_request(&job).gang_repair.as_deref() == Some("keep");
    if !keep {
        let new: Vec<i64> = records.iter().map(|record| record.id).collect();
        for survivor in state.store.leases_of_job(job_id).await? {
            if survivor.state.is_live()
                && !new.contains(&survivor.id)
                && let Some(restarted) = state.store.restart_lease(survivor.id).await?
            {
                state
                    .store
                    .append_lease_event(
                        survivor.id,
                        restarted.epoch,
                        "restarted",
                        "its gang was repaired after a node loss: starting again with the new peers",
                        now,
                    )
                    .await?;
            }
        }
    }
    tracing::info!(
        job = job_id,
        replicas = records.len(),
        keep,
        "repaired a gang after a node loss"
    );
    Ok(true)
}

/// Places queued jobs: prefetch (the queued jobs, their tenants' balances) → `decide::decide`,
/// pure, over the view → write (placements in group-committed transactions of
/// `PLACEMENTS_PER_COMMIT_MAX`, then the reasons of jobs that wait, where they changed).
async fn place_queued(state: &AppState, now: i64, reasons: &mut HashMap<i64, String>) -> Result<(), ApiError> {
    let started = Instant::now();
    let mut queued = state.store.jobs_in_states(&[JobState::Queued]).await?;
    let read = started.elapsed();
    if queued.is_empty() {
        return Ok(());
    }
    queued.sort_by_key(|job| (Tier::parse(&job.tier).map_or(3, |tier| tier as u8), job.id));
    queued.truncate(RECONCILE_JOBS_MAX);
    let mut balances: HashMap<i64, Micros> = HashMap::new();
    for job in &queued {
        if let std::collections::hash_map::Entry::Vacant(entry) = balances.entry(job.tenant_id) {
            let key = Account::TenantAvailable(job.tenant_id).key();
            entry.insert(Micros(state.store.balance(&key).await?));
        }
    }
    let mut owned = Owned::default();
    for (tenant, provider, _) in state.store.own_provider_links().await? {
        if balances.contains_key(&tenant) {
            owned.providers.entry(tenant).or_default().push(provider);
        }
    }
    let rules = Rules {
        gold_needs_badge: state.config.gold_needs_badge,
    };
    let decisions = {
        let mut guard = state.view.lock().await;
        let view = guard.as_mut().expect("built before placing");
        let started = Instant::now();
        let decisions = decide(view, &queued, &balances, &owned, rules, now);
        Metrics::add(&state.metrics.decision_nanos, started.elapsed().as_nanos() as u64);
        decisions
    };
    Metrics::add(&state.metrics.decisions, decisions.plans);
    for pending in &decisions.pending {
        reasons.remove(&pending.job_id);
    }
    let decided = started.elapsed();
    let placing = decisions.pending.len();
    write_placements(state, decisions.writes, decisions.pending, now).await?;
    tracing::debug!(
        queued = queued.len(),
        placing,
        read_ms = read.as_millis() as u64,
        decide_ms = (decided - read).as_millis() as u64,
        write_ms = (started.elapsed() - decided).as_millis() as u64,
        "placed"
    );
    let mut reason_updates = decisions.waiting;
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

/// Writes decided placements, a transaction per `PLACEMENTS_PER_COMMIT_MAX`, and records their
/// leases in the view; a placement refused or not written is released from the matcher again
/// (and the view rebuilt when it preempted: its victims run on). A fenced write ends the pass.
async fn write_placements(
    state: &AppState,
    writes: Vec<PlacementWrite>,
    pending: Vec<Pending>,
    now: i64,
) -> Result<(), ApiError> {
    for (writes, pending) in writes
        .chunks(PLACEMENTS_PER_COMMIT_MAX)
        .zip(pending.chunks(PLACEMENTS_PER_COMMIT_MAX))
    {
        let result = {
            let asked = Instant::now();
            let turn = state.placement_turn().await;
            let turned = asked.elapsed();
            let (store, writes) = (state.store.clone(), writes.to_vec());
            let fence = state.fence.load(std::sync::atomic::Ordering::SeqCst);
            let committed = state
                .writes
                .run(async move { store.commit_placements(&writes, now, fence).await })
                .await
                .unwrap_or_else(|stopped| Err(store::StoreError::Refused(stopped.to_string())));
            drop(turn);
            tracing::debug!(
                placements = pending.len(),
                turn_wait_ms = turned.as_millis() as u64,
                commit_ms = (asked.elapsed() - turned).as_millis() as u64,
                "committed placements"
            );
            committed
        };
        let committed_at = state.now_us();
        let mut guard = state.view.lock().await;
        let view = guard.as_mut().expect("built before placing");
        match result {
            Ok(results) => {
                for (outcome, pending) in results.into_iter().zip(pending) {
                    match outcome {
                        Some(records) => {
                            state.metrics.grants.granted(pending.job_id, committed_at);
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
    Ok(())
}
