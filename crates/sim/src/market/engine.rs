//! One policy's run: a discrete-event loop in virtual time over the shared world (fleet, node
//! failures, window and price ticks, demand), driving its own matcher. No clock is read for any
//! decision; an optional stopwatch only measures the matcher's time for the report.
//!
//! The loop, the jobs' lives and the passes are here; beside them, leases' billing, the work
//! they bought and the run's checks (`accounting.rs`), jobs losing leases (`interrupts.rs`) and
//! fraud's events (`fraud_events.rs`). What the run counts is `market::tally`'s, its trace hash
//! `market::trace`'s.

mod accounting;
mod fraud_events;
mod interrupts;

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};

use matcher::Matcher;
use model::{GpuCatalog, Lease, LeaseId, Micros, Tier, Timestamp};

use super::policy::{PolicyName, Rules};
use super::tally::{Call, Sample, Tally, class_of};
use super::trace::{FixedMap, TraceHash};
use super::workload::{JobKind, JobSource, SimJob, UNCAPPED};
use super::{Stopwatch, World};

/// Queued jobs are tried again at most this often (and only when something changed).
pub const PASS_INTERVAL_S: Timestamp = 30;
/// A pass looks at most this many queued jobs per tier …
pub const PASS_SCAN_MAX: usize = 2_000;
/// … and gives up on a tier after this many jobs that could not be placed.
pub const PASS_FAILURES_MAX: usize = 200;
/// Preemption plans scan the whole fleet: at most this many per pass.
pub const PREEMPTIONS_TRIED_PER_PASS_MAX: u32 = 2;
/// A job that did not fit is tried again after a backoff that doubles from the pass interval
/// up to this (as Kubernetes backs off unschedulable pods) …
pub const RETRY_BACKOFF_MAX_S: Timestamp = 900;
/// … and one whose preemption plan found nothing waits from ten minutes up to this.
pub const PREEMPT_BACKOFF_MAX_S: Timestamp = 3600;
/// A gang is repaired when it lost at most this share (per mille) of its replicas at once, or
/// one; past that (a lab's window closing under a bronze gang) it restarts whole, as
/// replacing replicas one by one would cost more than a restart.
pub const REPAIR_LOST_PERMILLE_MAX: u64 = 125;
/// The campus books a third of its spare nodes for the big gang (the rest may be busy when
/// the booking is made: a reservation starts when all its nodes are free).
pub const SPARES_RESERVED_DIVISOR: u32 = 3;
/// Starting a job again after a failure or preemption, or bringing up a gang's replacement
/// replica, takes this long (the restart cost R of the Young/Daly estimate in
/// reference/anchors-schedulers.md, part d).
pub const RESTART_S: Timestamp = 60;
/// The platform's fee on every charge, as the ledger takes it (rounded down).
pub const FEE_PERMILLE: i64 = 100;

/// Why a job lost leases.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cause {
    Failure,
    Preempted,
    WindowClosed,
    /// A dishonest provider abandoned the lease (`--fraud-rate`).
    Dropped,
    /// A dishonest node left inside its window (`--fraud-rate`).
    Vanished,
}

impl Cause {
    fn code(self) -> i64 {
        match self {
            Cause::Failure => 1,
            Cause::Preempted => 2,
            Cause::WindowClosed => 3,
            Cause::Dropped => 4,
            Cause::Vanished => 5,
        }
    }

    /// Lost without warning: the job keeps only what it checkpointed.
    fn is_fault(self) -> bool {
        matches!(self, Cause::Failure | Cause::Dropped | Cause::Vanished)
    }

    /// A lie of a dishonest provider.
    fn is_fraud(self) -> bool {
        matches!(self, Cause::Dropped | Cause::Vanished)
    }
}

/// What a stop keeps of the work since the last checkpoint.
#[derive(Clone, Copy, Debug)]
enum Keep {
    All,
    Checkpointed,
    /// All of it, except these milli-GPU's share (the lost replicas of a repaired gang, counted lost).
    AllButLost(u64),
}

#[derive(Clone, Debug)]
struct LeaseRun {
    lease: Lease,
    milli: u64,
    price: Micros,
    /// The winner's own ask for the lease's tier when it was placed.
    ask: Micros,
    billed_from: Timestamp,
}

#[derive(Clone, Debug)]
struct JobRun {
    job: SimJob,
    /// The tenant's tier (the policy may submit it as another).
    tier: Tier,
    queue: usize,
    class: usize,
    shape: u64,
    queued_key: Option<(Timestamp, u64)>,
    generation: u32,
    saved_s: u64,
    started: bool,
    leases: Vec<LeaseRun>,
    phase_from: Timestamp,
    run_from: Timestamp,
    /// `freed_milli` when the job last failed to start (gangs wait for half their size to free).
    freed_at_last_try: Option<u64>,
    /// Failed tries in a row, and when the next may come (with and without preemption).
    failed_tries: u32,
    retry_at: Timestamp,
    failed_preemptions: u32,
    preempt_retry_at: Timestamp,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Complete {
        job: u64,
        generation: u32,
    },
    /// A preempted victim's grace period ends: its GPUs pass to the job that preempted it
    /// (the billing of both already says so; the event marks it in the trace).
    GraceEnd {
        job: u64,
        victims: u32,
    },
    /// A dishonest provider abandons a lease (`--fraud-rate`).
    Drop {
        job: u64,
        lease: u64,
    },
}

/// One policy's simulation state.
pub(crate) struct PolicySim<'w> {
    world: &'w World,
    policy: PolicyName,
    rules: Rules,
    stopwatch: &'w dyn Stopwatch,
    matcher: Matcher,
    admission: super::admission::Admission,
    cu_milli: Vec<u32>,
    now: Timestamp,
    last_advance: Timestamp,
    seq: u64,
    heap: BinaryHeap<Reverse<(Timestamp, u64, Event)>>,
    /// Per tier, when each queued job gives up, in order (a tier's patience is one length).
    patience: [std::collections::VecDeque<(Timestamp, u64)>; 3],
    source: JobSource,
    next_arrival: Option<SimJob>,
    node_cursor: usize,
    tick_cursor: usize,
    /// The ticks whose boundaries the matcher's clock has seen, and its minute.
    clock_cursor: usize,
    clock_minute: i64,
    changed: Vec<u32>,
    next_sample: Timestamp,
    next_check: Timestamp,
    pass_due: Timestamp,
    pass_wanted: bool,
    jobs: FixedMap<u64, JobRun>,
    queues: [BTreeSet<(Timestamp, u64)>; 3],
    node_leases: Vec<Vec<(LeaseId, u64)>>,
    node_used_milli: Vec<u32>,
    open: Vec<bool>,
    online: Vec<bool>,
    offered_gpus: [u64; 4],
    bronze_milli_by_model: Vec<u64>,
    /// GPU capacity freed or added (leases ended, nodes back, windows opened), in milli-GPU, ever.
    freed_milli: u64,
    interrupts: Vec<(u64, Vec<Lease>, Cause)>,
    memo: FixedMap<u64, (Micros, u32)>,
    /// Admission answers by (shape, stated runtime in hours).
    admitted: FixedMap<(u64, u32), bool>,
    preempt_budget: u32,
    hash: TraceHash,
    tally: Tally,
    /// With `--fraud-rate`: the trust policy (detecting in Fallow's market only) and fraud's costs.
    trust: Option<super::fraud::TrustState>,
}

impl<'w> PolicySim<'w> {
    pub fn new(world: &'w World, policy: PolicyName, stopwatch: &'w dyn Stopwatch) -> PolicySim<'w> {
        let fleet = &world.fleet;
        let nodes = policy.matcher_nodes(&fleet.nodes);
        let admission = super::admission::Admission::new(&nodes, world.start);
        let matcher = Matcher::new(fleet.topology.clone(), nodes, policy.matcher_config());
        let catalog = GpuCatalog::embedded();
        let open = world.open_at_start.clone();
        let mut offered_gpus = [0u64; 4];
        for (index, node) in fleet.nodes.iter().enumerate() {
            if open[index] {
                offered_gpus[fleet.kinds[index] as usize] += u64::from(node.gpu_count);
            }
        }
        PolicySim {
            world,
            policy,
            rules: policy.rules(world.pay_as_bid_bidding),
            stopwatch,
            matcher,
            admission,
            cu_milli: fleet
                .nodes
                .iter()
                .map(|node| catalog.spec(node.gpu_model).cu_milli)
                .collect(),
            now: world.start,
            last_advance: world.start,
            seq: 0,
            heap: BinaryHeap::new(),
            patience: Default::default(),
            source: world.job_source(),
            next_arrival: None,
            node_cursor: 0,
            tick_cursor: 0,
            clock_cursor: 0,
            clock_minute: world.start.div_euclid(60),
            changed: Vec::new(),
            next_sample: world.start,
            next_check: world.start + world.check_every_s.max(1),
            pass_due: world.start,
            pass_wanted: false,
            jobs: FixedMap::default(),
            queues: [BTreeSet::new(), BTreeSet::new(), BTreeSet::new()],
            node_leases: vec![Vec::new(); fleet.nodes.len()],
            node_used_milli: vec![0; fleet.nodes.len()],
            open,
            online: vec![true; fleet.nodes.len()],
            offered_gpus,
            bronze_milli_by_model: vec![0; catalog.len()],
            freed_milli: 0,
            interrupts: Vec::new(),
            memo: FixedMap::default(),
            admitted: FixedMap::default(),
            preempt_budget: 0,
            hash: TraceHash::new(),
            tally: Tally {
                fleet_gpus: fleet.gpu_count(),
                ..Tally::default()
            },
            trust: world.fraud.as_ref().map(|plan| {
                super::fraud::TrustState::new(plan, policy == PolicyName::Fallow, world.start, &world.open_at_start)
            }),
        }
    }

    /// Runs to the world's end; returns the tally and the trace hash.
    pub fn run(mut self) -> (Tally, u64) {
        self.hash.add(&[self.policy as i64]);
        self.matcher.advance_clock(self.now);
        self.next_arrival = self.source.next_job();
        if let Some(gang) = self.world.big_gang.clone() {
            self.arrive(gang);
        }
        loop {
            let (at, source) = self.next_source();
            if at >= self.world.end {
                break;
            }
            self.advance(at);
            self.sync_clock();
            self.tally.events += 1;
            match source {
                0 => self.node_event(),
                1 => self.tick(),
                2 => self.heap_event(),
                3 => self.give_up(),
                4 => {
                    let job = self.next_arrival.take().expect("chosen because it is there");
                    self.next_arrival = self.source.next_job();
                    self.arrive(job);
                }
                5 => self.pass(),
                6 => {
                    self.tally.events -= 1;
                    self.sample();
                }
                7 => {
                    self.tally.events -= 1;
                    self.check();
                }
                _ => self.canary(),
            }
            self.drain_interrupts();
            if self.world.check_every_s == 0 {
                self.check();
            }
        }
        self.advance(self.world.end);
        self.finish();
        (self.tally, self.hash.0)
    }

    /// The earliest thing to do, ties in a fixed order: node events, ticks, completions and
    /// grace ends, give-ups, arrivals, a pass, a sample, a check.
    fn next_source(&self) -> (Timestamp, u8) {
        let world = self.world;
        let candidates = [
            world.node_events.get(self.node_cursor).map(|event| event.at),
            world.ticks.get(self.tick_cursor).map(|tick| tick.at),
            self.heap.peek().map(|Reverse((at, _, _))| *at),
            self.patience
                .iter()
                .filter_map(|deque| deque.front().map(|(at, _)| *at))
                .min(),
            self.next_arrival.as_ref().map(|job| job.spec.submitted_at),
            self.pass_wanted.then_some(self.pass_due.max(self.now)),
            Some(self.next_sample),
            (self.world.check_every_s > 0).then_some(self.next_check),
            self.trust.as_ref().and_then(|trust| trust.next_canary_at()),
        ];
        let mut best = (Timestamp::MAX, 9u8);
        for (rank, candidate) in candidates.iter().enumerate() {
            if let Some(at) = candidate
                && *at < best.0
            {
                best = (*at, rank as u8);
            }
        }
        best
    }

    fn advance(&mut self, at: Timestamp) {
        let elapsed = (at - self.last_advance).max(0) as f64;
        for kind in 0..4 {
            self.tally.offered_gpu_s[kind] += self.offered_gpus[kind] as f64 * elapsed;
        }
        self.tally.used_milli_s += self.matcher.gpu_milli_used() as f64 * elapsed;
        self.last_advance = at.max(self.last_advance);
        self.now = at;
    }

    /// Moves the matcher's clock to `now`'s minute, telling it which nodes' windows or prices
    /// changed since (every minute's change is in the ticks when all windows are weekly).
    fn sync_clock(&mut self) {
        let minute = self.now.div_euclid(60);
        if minute == self.clock_minute {
            return;
        }
        self.clock_minute = minute;
        let now = self.now;
        if !self.world.ticks_complete {
            self.timed(Call::Clock, |matcher| matcher.advance_clock(now));
            return;
        }
        let mut changed = std::mem::take(&mut self.changed);
        changed.clear();
        while let Some(tick) = self.world.ticks.get(self.clock_cursor)
            && tick.at.div_euclid(60) <= minute
        {
            changed.extend_from_slice(&tick.closed);
            changed.extend_from_slice(&tick.opened);
            changed.extend_from_slice(&tick.repriced);
            self.clock_cursor += 1;
        }
        self.timed(Call::Clock, |matcher| matcher.advance_clock_for(now, &changed));
        self.changed = changed;
    }

    fn timed<T>(&mut self, kind: Call, call: impl FnOnce(&mut Matcher) -> T) -> T {
        let started = self.stopwatch.elapsed_ns();
        let result = call(&mut self.matcher);
        let elapsed = self.stopwatch.elapsed_ns().saturating_sub(started);
        self.tally.matcher_ns += elapsed;
        self.tally.matcher_ns_by_call[kind as usize] += elapsed;
        self.tally.matcher_calls += 1;
        result
    }

    fn push(&mut self, at: Timestamp, event: Event) {
        self.seq += 1;
        self.heap.push(Reverse((at, self.seq, event)));
    }

    // ---- exogenous events ----

    fn node_event(&mut self) {
        let event = self.world.node_events[self.node_cursor];
        self.node_cursor += 1;
        let node = event.node as usize;
        self.hash
            .add(&[self.now, 4 + i64::from(event.up), i64::from(event.node)]);
        if event.up == self.online[node] {
            return;
        }
        self.online[node] = event.up;
        if let Some(trust) = &mut self.trust {
            trust.availability(node, event.up && self.open[node], self.now);
        }
        let kind = self.world.fleet.kinds[node] as usize;
        let gpus = u64::from(self.world.fleet.nodes[node].gpu_count);
        if self.open[node] {
            if event.up {
                self.offered_gpus[kind] += gpus;
            } else {
                self.offered_gpus[kind] -= gpus;
            }
        }
        let id = model::NodeId(event.node);
        if event.up {
            self.timed(Call::NodeState, |matcher| matcher.set_node_offline(id, false));
            self.freed_milli += gpus * 1000;
            self.pass_wanted = true;
        } else {
            if !event.vanish {
                self.tally.node_failures += 1;
            }
            if self.open[node]
                && let (Some(trust), Some(plan)) = (&mut self.trust, &self.world.fraud)
            {
                let found = trust.absent(plan, node, event.vanish, self.now);
                self.proven(found);
            }
            let lost = self.timed(Call::NodeState, |matcher| matcher.set_node_offline(id, true));
            self.tally.failed_leases += lost.len() as u64;
            self.queue_interrupts(lost, if event.vanish { Cause::Vanished } else { Cause::Failure });
        }
    }

    fn tick(&mut self) {
        let tick = &self.world.ticks[self.tick_cursor];
        self.tick_cursor += 1;
        self.hash
            .add(&[self.now, 6, tick.closed.len() as i64, tick.opened.len() as i64]);
        for &node in &tick.closed {
            let node = node as usize;
            if !self.open[node] {
                continue;
            }
            self.open[node] = false;
            if let Some(trust) = &mut self.trust {
                trust.availability(node, false, self.now);
            }
            if self.online[node] {
                let kind = self.world.fleet.kinds[node] as usize;
                self.offered_gpus[kind] -= u64::from(self.world.fleet.nodes[node].gpu_count);
            }
            if self.node_leases[node].is_empty() {
                continue;
            }
            let ids: Vec<LeaseId> = self.node_leases[node].iter().map(|(lease, _)| *lease).collect();
            let mut lost = Vec::with_capacity(ids.len());
            for id in ids {
                if let Some(lease) = self.timed(Call::Release, |matcher| matcher.release_lease(id)) {
                    lost.push(lease);
                }
            }
            self.queue_interrupts(lost, Cause::WindowClosed);
        }
        for &node in &tick.opened {
            let node = node as usize;
            if self.open[node] {
                continue;
            }
            self.open[node] = true;
            if let Some(trust) = &mut self.trust {
                trust.availability(node, self.online[node], self.now);
            }
            if self.online[node] {
                let kind = self.world.fleet.kinds[node] as usize;
                let gpus = u64::from(self.world.fleet.nodes[node].gpu_count);
                self.offered_gpus[kind] += gpus;
                self.freed_milli += gpus * 1000;
            }
        }
        self.pass_wanted = true;
    }

    fn heap_event(&mut self) {
        let Reverse((_, _, event)) = self.heap.pop().expect("chosen because it is there");
        match event {
            Event::Complete { job, generation } => self.complete(job, generation),
            Event::GraceEnd { job, victims } => self.hash.add(&[self.now, 13, job as i64, i64::from(victims)]),
            Event::Drop { job, lease } => self.drop_event(job, lease),
        }
    }

    // ---- jobs ----

    /// The spec this policy submits for a tenant's job.
    fn policy_job(&self, mut job: SimJob) -> SimJob {
        // A memory floor is the list of the fleet's models that meet it: the same jobs fit,
        // and the matcher's index skips the other models' ranges instead of trying their nodes.
        let resources = &mut job.spec.resources;
        if resources.gpu_models.is_empty() && resources.gpu_memory_mib_min > 0 {
            resources.gpu_models = self
                .world
                .fleet_models
                .iter()
                .filter(|(_, memory)| *memory >= resources.gpu_memory_mib_min)
                .map(|(model, _)| *model)
                .collect();
        }
        if !self.rules.tiers {
            job.spec.tier = Tier::Silver;
            job.spec.preemptible = false;
        }
        if !self.rules.capped {
            job.spec.max_price = UNCAPPED;
        }
        job
    }

    fn arrive(&mut self, job: SimJob) {
        let tier = job.spec.tier;
        let id = job.spec.id.0;
        let submitted = job.spec.submitted_at;
        let patience = job.patience_s;
        let job = self.policy_job(job);
        let queue = job.spec.tier as usize;
        let mut run = JobRun {
            class: class_of(&job),
            shape: shape_of(&job),
            job,
            tier,
            queue,
            queued_key: None,
            generation: 0,
            saved_s: 0,
            started: false,
            leases: Vec::new(),
            phase_from: submitted,
            run_from: submitted,
            freed_at_last_try: None,
            failed_tries: 0,
            retry_at: submitted,
            failed_preemptions: 0,
            preempt_retry_at: submitted,
        };
        self.hash.add(&[self.now, 1, id as i64]);
        self.tally.submitted[tier as usize] += 1;
        run.job.spec.max_runtime_s = self.runtime_estimate(&run);
        let hours = run.job.spec.max_runtime_s.div_ceil(3600);
        let admission = &self.admission;
        let admitted = *self.admitted.entry((run.shape, hours)).or_insert_with(|| {
            let mut stated = run.job.spec.clone();
            stated.max_runtime_s = hours * 3600;
            admission.could_ever_run(&stated)
        });
        if !admitted {
            self.hash.add(&[self.now, 12, id as i64]);
            self.tally.rejected[tier as usize] += 1;
            return;
        }
        if run.job.kind != JobKind::BigGang {
            self.patience[tier as usize].push_back((submitted + i64::from(patience), id));
        }
        self.jobs.insert(id, run);
        let queue_empty = self.queues[queue].is_empty();
        let started = if self.rules.head_of_line && !queue_empty {
            false
        } else {
            self.try_start(id, false)
        };
        if !started {
            self.enqueue(id);
            if self.rules.preemption && tier != Tier::Bronze {
                self.pass_wanted = true;
            }
        }
    }

    fn enqueue(&mut self, id: u64) {
        let run = self.jobs.get_mut(&id).expect("a live job");
        let key = (run.job.spec.submitted_at, id);
        run.queued_key = Some(key);
        self.queues[run.queue].insert(key);
    }

    fn dequeue(&mut self, id: u64) {
        let run = self.jobs.get_mut(&id).expect("a live job");
        if let Some(key) = run.queued_key.take() {
            self.queues[run.queue].remove(&key);
        }
    }

    /// The runtime a tenant states for what is left of a job: its work and checkpoints, a
    /// restart, and a tenth more.
    fn runtime_estimate(&self, run: &JobRun) -> u32 {
        let left = run.job.work_s as u64 - run.saved_s.min(run.job.work_s as u64);
        let interval = u64::from(run.job.spec.checkpoint_interval_s);
        let checkpoints = left.checked_div(interval).unwrap_or(0);
        let wall = left + checkpoints * u64::from(run.job.checkpoint_cost_s) + RESTART_S as u64;
        u32::try_from(wall + wall / 10 + 300).unwrap_or(u32::MAX)
    }

    /// Tries to start a queued or arriving job now; with `allow_preempt`, gold and silver may
    /// displace bronze. Returns whether it started.
    fn try_start(&mut self, id: u64, allow_preempt: bool) -> bool {
        let Some(mut run) = self.jobs.remove(&id) else {
            return false;
        };
        run.job.spec.max_runtime_s = self.runtime_estimate(&run);
        let job_milli = run.job.gpu_milli();
        let free_milli = self.matcher.gpu_milli_total() - self.matcher.gpu_milli_used();
        let gang_waits = run.job.spec.replicas > 1
            && run
                .freed_at_last_try
                .is_some_and(|last| self.freed_milli - last < job_milli / 2);
        let now = self.now;
        let mut started = false;
        if free_milli >= job_milli && !gang_waits {
            self.tally.placements_tried += 1;
            let place_kind = if run.job.spec.replicas > 1 {
                Call::PlaceGang
            } else {
                Call::Place
            };
            let spec = &run.job.spec;
            if let Ok(placement) = self.timed(place_kind, |matcher| matcher.place(spec, now)) {
                self.start(&mut run, placement.leases, 0);
                started = true;
            }
        }
        if !started
            && allow_preempt
            && self.rules.preemption
            && run.job.spec.tier != Tier::Bronze
            && self.preempt_budget > 0
            && run.preempt_retry_at <= now
            && free_milli + self.bronze_milli_for(&run) >= job_milli
        {
            self.preempt_budget -= 1;
            self.tally.preemptions_tried += 1;
            let spec = &run.job.spec;
            if let Ok(plan) = self.timed(Call::Preempt, |matcher| matcher.plan_preemption(spec, now))
                && let Ok(leases) = self.timed(Call::Preempt, |matcher| matcher.commit_preemption(&plan))
            {
                let grace = if plan.victims.is_empty() {
                    0
                } else {
                    i64::from(self.matcher.config().preemption_grace_s)
                };
                self.start(&mut run, leases, grace);
                self.victims(&plan);
                started = true;
            } else {
                run.failed_preemptions += 1;
                let backoff = (600i64 << run.failed_preemptions.min(8)).min(PREEMPT_BACKOFF_MAX_S);
                run.preempt_retry_at = now + backoff;
            }
        }
        if started {
            run.failed_tries = 0;
            run.failed_preemptions = 0;
        } else {
            run.freed_at_last_try = Some(self.freed_milli);
            run.failed_tries += 1;
            let backoff = (PASS_INTERVAL_S << run.failed_tries.min(8)).min(RETRY_BACKOFF_MAX_S);
            run.retry_at = now + backoff;
        }
        self.jobs.insert(id, run);
        started
    }

    fn bronze_milli_for(&self, run: &JobRun) -> u64 {
        let models = &run.job.spec.resources.gpu_models;
        if models.is_empty() {
            self.bronze_milli_by_model.iter().sum()
        } else {
            models
                .iter()
                .map(|model| self.bronze_milli_by_model[model.index()])
                .sum()
        }
    }

    /// Starts (or restarts) a job on its new leases; billing starts after `grace` (the victims'
    /// grace period), work after a restart's start-up.
    fn start(&mut self, run: &mut JobRun, leases: Vec<Lease>, grace: Timestamp) {
        let now = self.now;
        let id = run.job.spec.id.0;
        self.dequeue_run(run);
        let restarted = run.started;
        if !run.started {
            run.started = true;
            let tier = run.tier as usize;
            self.tally.started[tier] += 1;
            let wait = (now - run.job.spec.submitted_at).max(0);
            self.tally.waits[tier].push(u32::try_from(wait).unwrap_or(u32::MAX));
        }
        self.hash.add(&[now, 2, id as i64, leases.len() as i64]);
        for lease in leases {
            self.add_lease(run, lease, now + grace);
        }
        run.phase_from = now;
        run.run_from = now + grace + if restarted { RESTART_S } else { 0 };
        self.schedule_completion(run);
        self.reserve_spares(run);
    }

    /// The campus books part of its hot spares for the big gang (a matcher reservation in the
    /// gang's name, from now): firm market work cannot take them, bronze can and is preempted
    /// when a repair needs them. A commit of the gang drops its reservation, so it is made again
    /// after each. Only policies with the matcher's tiers have reservations.
    fn reserve_spares(&mut self, run: &JobRun) {
        if run.class != 2 || !self.rules.tiers {
            return;
        }
        let Some(campus) = &self.world.fleet.campus else { return };
        let mut spares = run.job.spec.clone();
        spares.replicas = (campus.spare_nodes / SPARES_RESERVED_DIVISOR).max(1);
        spares.max_runtime_s = u32::try_from(self.world.end - self.now).unwrap_or(u32::MAX).max(1);
        let now = self.now;
        if let Ok(reservation) = self.timed(Call::Repair, |matcher| matcher.reserve(&spares, now, now)) {
            self.tally.spares_reserved = reservation.nodes.len() as u64;
        }
    }

    fn dequeue_run(&mut self, run: &mut JobRun) {
        if let Some(key) = run.queued_key.take() {
            self.queues[run.queue].remove(&key);
        }
    }

    /// When the job's work is done, from its saved progress and where its compute starts.
    fn finish_time(run: &JobRun) -> Timestamp {
        let left = (run.job.work_s as u64).saturating_sub(run.saved_s);
        if left == 0 {
            return run.run_from;
        }
        let interval = u64::from(run.job.spec.checkpoint_interval_s);
        let checkpoints = (left - 1).checked_div(interval).unwrap_or(0);
        run.run_from + (left + checkpoints * u64::from(run.job.checkpoint_cost_s)) as Timestamp
    }

    fn schedule_completion(&mut self, run: &mut JobRun) {
        run.generation += 1;
        let at = Self::finish_time(run);
        self.push(
            at,
            Event::Complete {
                job: run.job.spec.id.0,
                generation: run.generation,
            },
        );
    }

    fn complete(&mut self, id: u64, generation: u32) {
        let Some(mut run) = self.jobs.remove(&id) else { return };
        if run.generation != generation || run.leases.is_empty() {
            self.jobs.insert(id, run);
            return;
        }
        let now = self.now;
        self.hash.add(&[now, 3, id as i64]);
        self.categorize(&mut run, now, Keep::All);
        let ids: Vec<LeaseId> = run.leases.iter().map(|entry| entry.lease.id).collect();
        for lease in ids {
            self.timed(Call::Release, |matcher| matcher.release_lease(lease));
            self.drop_lease(&mut run, lease, now);
        }
        self.tally.finished[run.tier as usize] += 1;
        self.pass_wanted = true;
    }

    fn give_up(&mut self) {
        let Some(tier) = (0..3).min_by_key(|tier| self.patience[*tier].front().map_or(Timestamp::MAX, |(at, _)| *at))
        else {
            return;
        };
        let Some((_, id)) = self.patience[tier].pop_front() else {
            return;
        };
        let Some(run) = self.jobs.get(&id) else { return };
        if run.started {
            return;
        }
        let tier = run.tier as usize;
        let wait = (self.now - run.job.spec.submitted_at).max(0);
        self.hash.add(&[self.now, 10, id as i64]);
        self.dequeue(id);
        self.jobs.remove(&id);
        self.tally.gave_up[tier] += 1;
        self.tally.unserved_wait_s[tier] += wait as u64;
    }

    // ---- passes ----

    fn pass(&mut self) {
        self.pass_wanted = false;
        self.pass_due = self.now + PASS_INTERVAL_S;
        self.tally.passes += 1;
        self.preempt_budget = PREEMPTIONS_TRIED_PER_PASS_MAX;
        let queues: &[usize] = if self.rules.tiers { &[0, 1, 2] } else { &[1] };
        for &queue in queues {
            let ids: Vec<u64> = self.queues[queue]
                .iter()
                .take(PASS_SCAN_MAX)
                .map(|(_, id)| *id)
                .collect();
            self.memo.clear();
            let mut failures = 0;
            for id in ids {
                let Some(run) = self.jobs.get(&id) else { continue };
                if run.queued_key.is_none() {
                    continue;
                }
                if run.retry_at > self.now && !self.rules.head_of_line {
                    continue;
                }
                let (shape, price, runtime) = (run.shape, run.job.spec.max_price, self.runtime_estimate(run));
                if let Some(&(failed_price, failed_runtime)) = self.memo.get(&shape)
                    && price <= failed_price
                    && runtime >= failed_runtime
                {
                    if self.rules.head_of_line {
                        break;
                    }
                    continue;
                }
                if self.try_start(id, true) {
                    continue;
                }
                self.memo.insert(shape, (price, runtime));
                failures += 1;
                if self.rules.head_of_line || failures >= PASS_FAILURES_MAX {
                    break;
                }
            }
            self.drain_interrupts();
        }
    }

    // ---- observation ----

    fn sample(&mut self) {
        self.next_sample = self.now + self.world.sample_every_s;
        let fleet = &self.world.fleet;
        let (mut partial_free, mut free) = (0u64, 0u64);
        for (node, used) in self.node_used_milli.iter().enumerate() {
            if !self.open[node] || !self.online[node] {
                continue;
            }
            let capacity = u64::from(fleet.nodes[node].gpu_count) * 1000;
            let whole_free = capacity.saturating_sub(u64::from(*used)) / 1000;
            free += whole_free;
            if *used > 0 {
                partial_free += whole_free;
            }
        }
        let fragmentation_pct = if free > 0 {
            partial_free as f64 * 100.0 / free as f64
        } else {
            0.0
        };
        self.tally.frag_sum += fragmentation_pct;
        self.tally.frag_samples += 1;
        self.tally.samples.push(Sample {
            at: self.now,
            used_gpus: self.matcher.gpu_milli_used() as f64 / 1000.0,
            offered_gpus: self.offered_gpus.iter().sum::<u64>() as f64,
            fragmentation_pct,
            queued: [0, 1, 2].map(|queue| self.queues[queue].len() as u32),
        });
    }
}

/// A digest of everything about a job that decides whether it fits, but its price cap and
/// runtime (a pass skips a job whose twin with a higher cap and a shorter runtime did not fit).
fn shape_of(job: &SimJob) -> u64 {
    let spec = &job.spec;
    let mut hash = TraceHash::new();
    let demand = match spec.resources.gpu {
        model::GpuDemand::None => 0,
        model::GpuDemand::Whole { count } => 1000 + i64::from(count),
        model::GpuDemand::Share { milli } => 2000 + i64::from(milli),
        model::GpuDemand::ComputeUnits { cu_milli } => 1_000_000 + i64::from(cu_milli),
    };
    hash.add(&[
        spec.tier as i64,
        spec.class as i64,
        demand,
        i64::from(spec.resources.gpu_memory_mib_min),
        i64::from(spec.resources.cpu_milli),
        spec.resources.memory_mib as i64,
        i64::from(spec.reliability_min_ppm),
        spec.topology as i64,
        i64::from(spec.replicas),
        i64::from(spec.preemptible),
    ]);
    for model in &spec.resources.gpu_models {
        hash.add(&[100 + i64::from(model.0)]);
    }
    for region in &spec.regions {
        hash.add(&[200 + i64::from(region.0)]);
    }
    for dataset in &spec.datasets {
        hash.add(&[dataset.content_hash as i64]);
    }
    hash.0
}
