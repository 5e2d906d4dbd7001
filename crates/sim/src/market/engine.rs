//! One policy's run: a discrete-event loop in virtual time over the shared world (fleet, node
//! failures, window and price ticks, demand), driving its own matcher. No clock is read for any
//! decision; an optional stopwatch only measures the matcher's time for the report.
//!
//! Work is accounted per job in milli-GPU-seconds: every second a lease is billed is exactly one
//! of useful (progress kept), checkpoint (writing checkpoints), lost (work since the last
//! checkpoint that a failure threw away), restart (starting again after a restart, or a gang
//! stalled while a replacement comes up) or grace (a preempted job checkpointing before it
//! stops). The run checks that identity, the ledger's balance and the matcher's
//! `consistency_check` as it goes.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

use matcher::{Matcher, PreemptionPlan};
use model::{GpuCatalog, Lease, LeaseId, Micros, Tier, Timestamp};

use super::policy::{PolicyName, Pricing, Rules};
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

/// FNV-1a: a fixed, seedless hash for maps that are looked up, never iterated in a decision.
#[derive(Default)]
pub(crate) struct Fnv(u64);

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        let mut hash = if self.0 == 0 { 0xcbf2_9ce4_8422_2325 } else { self.0 };
        for byte in bytes {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = hash;
    }
}

type FixedMap<K, V> = HashMap<K, V, BuildHasherDefault<Fnv>>;

/// The event trace's hash: FNV-1a over every event and decision, in order.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TraceHash(pub u64);

impl TraceHash {
    pub fn new() -> TraceHash {
        TraceHash(0xcbf2_9ce4_8422_2325)
    }
    pub fn add(&mut self, words: &[i64]) {
        for word in words {
            for byte in word.to_le_bytes() {
                self.0 ^= u64::from(byte);
                self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
            }
        }
    }
}

/// Kinds of work, for the goodput figures: jobs of one replica, gangs of the demand, the big gang.
pub const CLASSES: usize = 3;
pub(crate) fn class_of(job: &SimJob) -> usize {
    if job.kind == JobKind::BigGang {
        2
    } else if job.spec.replicas > 1 {
        1
    } else {
        0
    }
}

/// Billed milli-GPU-seconds by what they bought.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkTally {
    pub allocated: u64,
    pub useful: u64,
    pub checkpoint: u64,
    pub lost: u64,
    pub restart: u64,
    pub grace: u64,
}

impl WorkTally {
    pub fn accounted(&self) -> u64 {
        self.useful + self.checkpoint + self.lost + self.restart + self.grace
    }
}

/// One sample of the fleet, for the charts.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sample {
    pub at: Timestamp,
    pub used_gpus: f64,
    pub offered_gpus: f64,
    pub fragmentation_pct: f64,
    pub queued: [u32; 3],
}

/// Everything a policy's run counted.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    pub work: [WorkTally; CLASSES],
    /// Per tenant tier: milli-GPU-seconds billed, what tenants paid, what the same GPU-hours
    /// cost at the on-demand reference price, useful H100-equivalent milli-GPU-seconds.
    pub billed_milli_s: [u64; 3],
    pub paid: [Micros; 3],
    pub on_demand_cost: [Micros; 3],
    pub useful_h100_milli_s: [u64; 3],
    pub provider_earned: [Micros; 4],
    /// Milli-GPU-seconds sold, per provider kind.
    pub sold_milli_s: [u64; 4],
    pub platform_fees: Micros,
    pub transactions: u64,
    pub offered_gpu_s: [f64; 4],
    pub used_milli_s: f64,
    pub fleet_gpus: u64,
    /// Queue waits of jobs' first starts (seconds), per tier.
    pub waits: [Vec<u32>; 3],
    /// Seconds waited by jobs that never started (gave up, or still queued at the end).
    pub unserved_wait_s: [u64; 3],
    /// What the winners asked for the GPU-hours billed (their own ask in the lease's tier).
    pub asked: [Micros; 3],
    pub submitted: [u64; 3],
    pub started: [u64; 3],
    pub finished: [u64; 3],
    pub gave_up: [u64; 3],
    /// Refused at submission: no node of the fleet could ever run them under this policy.
    pub rejected: [u64; 3],
    pub unstarted_at_end: [u64; 3],
    /// Leases preempted (by gold or silver, or by a window closing), per tier.
    pub preempted_leases: [u64; 3],
    pub window_preempted_leases: [u64; 3],
    pub failed_leases: u64,
    pub node_failures: u64,
    pub repairs: u64,
    pub repairs_failed: u64,
    pub gang_restarts: u64,
    pub big_gang_failures: u64,
    pub big_gang_repairs: u64,
    pub big_gang_restarts: u64,
    pub big_gang_running_s: u64,
    /// Spare nodes the campus holds for the big gang (its last booking).
    pub spares_reserved: u64,
    pub events: u64,
    pub passes: u64,
    pub placements_tried: u64,
    pub preemptions_tried: u64,
    pub matcher_calls: u64,
    pub matcher_ns: u64,
    pub matcher_ns_by_call: [u64; 7],
    pub consistency_checks: u64,
    pub consistency_failures: Vec<String>,
    pub ledger_checks: u64,
    pub ledger_failures: Vec<String>,
    pub samples: Vec<Sample>,
    pub frag_sum: f64,
    pub frag_samples: u64,
    /// With `--fraud-rate`: what fraud cost, and what the trust policy caught.
    pub fraud: Option<super::fraud::FraudReport>,
}

/// Kinds of matcher call, for the time breakdown.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Call {
    Place = 0,
    PlaceGang = 1,
    Preempt = 2,
    Repair = 3,
    Release = 4,
    NodeState = 5,
    Clock = 6,
}

pub const CALL_NAMES: [&str; 7] = [
    "place",
    "place_gang",
    "preempt",
    "repair",
    "release",
    "node_state",
    "clock",
];

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

    // ---- trust (`--fraud-rate`) ----

    /// Runs the canary that is due.
    fn canary(&mut self) {
        let (Some(trust), Some(plan)) = (&mut self.trust, &self.world.fraud) else {
            return;
        };
        let (online, open) = (&self.online, &self.open);
        let found = trust.run_canary(plan, self.now, &|node| online[node] && open[node]);
        self.proven(found);
    }

    /// Fraud proven against a provider: its bond is slashed, its tenants paid back, its nodes
    /// cordoned (their running leases end as planned; nothing new is placed there).
    fn proven(&mut self, found: Option<(u32, trust::rules::Fraud)>) {
        let (Some((provider, fraud)), Some(trust), Some(plan)) = (found, &mut self.trust, &self.world.fraud) else {
            return;
        };
        trust.prove(plan, provider, fraud, self.now);
        let nodes = std::mem::take(&mut trust.cordoned_nodes);
        self.hash.add(&[self.now, 14, i64::from(provider), nodes.len() as i64]);
        for node in nodes {
            self.matcher.set_node_cordoned(model::NodeId(node), true);
        }
    }

    /// A dishonest provider abandons a lease while its node is up.
    fn drop_event(&mut self, job: u64, lease: u64) {
        let Some(run) = self.jobs.get(&job) else { return };
        let Some(entry) = run.leases.iter().find(|entry| entry.lease.id.0 == lease) else {
            return;
        };
        let node = entry.lease.node.index();
        if !self.online[node] {
            return;
        }
        let id = entry.lease.id;
        let Some(released) = self.timed(Call::Release, |matcher| matcher.release_lease(id)) else {
            return;
        };
        if let (Some(trust), Some(plan)) = (&mut self.trust, &self.world.fraud) {
            let found = trust.dropped(plan, node, self.now);
            self.proven(found);
        }
        self.hash.add(&[self.now, 15, job as i64]);
        self.queue_interrupts(vec![released], Cause::Dropped);
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

    fn add_lease(&mut self, run: &mut JobRun, lease: Lease, billed_from: Timestamp) {
        let node = lease.node.index();
        let ask = self.world.fleet.nodes[node]
            .policy
            .ask_at(run.job.spec.tier, self.now)
            .unwrap_or(lease.price);
        let price = match self.rules.pricing {
            Pricing::Auction => lease.price,
            Pricing::OwnAsk => ask,
            Pricing::ShadedAsk => ask.max(lease.price),
        };
        let milli = u64::from(lease.gpu_milli_total());
        self.hash.add(&[i64::from(lease.node.0), price.0]);
        self.node_leases[node].push((lease.id, run.job.spec.id.0));
        self.node_used_milli[node] += milli as u32;
        if run.job.spec.tier == Tier::Bronze {
            self.bronze_milli_by_model[self.world.fleet.nodes[node].gpu_model.index()] += milli;
        }
        if let Some(plan) = &self.world.fraud
            && plan.kind[node] == Some(super::fraud::FraudKind::DroppedJobs)
            && plan.unit(&[3, run.job.spec.id.0, u64::from(run.generation), lease.id.0])
                < f64::from(super::fraud::DROP_PERMILLE) / 1000.0
        {
            let within = super::fraud::DROP_WITHIN_S.min(i64::from(run.job.spec.max_runtime_s.max(1)));
            let after = plan.unit(&[4, run.job.spec.id.0, u64::from(run.generation), lease.id.0]) * within as f64;
            let (job, id) = (run.job.spec.id.0, lease.id.0);
            self.push(self.now + (after as Timestamp).max(1), Event::Drop { job, lease: id });
        }
        run.leases.push(LeaseRun {
            lease,
            milli,
            price,
            ask,
            billed_from,
        });
    }

    /// Takes a lease out of the job and the node's view and bills it up to `until`.
    fn drop_lease(&mut self, run: &mut JobRun, lease_id: LeaseId, until: Timestamp) -> Option<LeaseRun> {
        let position = run.leases.iter().position(|entry| entry.lease.id == lease_id)?;
        let entry = run.leases.swap_remove(position);
        let node = entry.lease.node.index();
        if let Some(slot) = self.node_leases[node].iter().position(|(id, _)| *id == lease_id) {
            self.node_leases[node].swap_remove(slot);
        }
        self.node_used_milli[node] -= entry.milli as u32;
        if run.job.spec.tier == Tier::Bronze {
            self.bronze_milli_by_model[self.world.fleet.nodes[node].gpu_model.index()] -= entry.milli;
        }
        self.freed_milli += entry.milli;
        self.bill(run, &entry, until);
        Some(entry)
    }

    fn bill(&mut self, run: &JobRun, entry: &LeaseRun, until: Timestamp) {
        let seconds = (until - entry.billed_from).max(0) as u64;
        if seconds == 0 {
            return;
        }
        let node = entry.lease.node.index();
        let milli_s = seconds * entry.milli;
        let tier = run.tier as usize;
        self.tally.work[run.class].allocated += milli_s;
        self.tally.billed_milli_s[tier] += milli_s;
        let cost = entry.price.cost_for(entry.milli, seconds).expect("costs fit in i64");
        let fee = Micros(cost.0 * FEE_PERMILLE / 1000);
        let earned = cost - fee;
        if earned + fee != cost {
            self.tally
                .ledger_failures
                .push(format!("a charge of {cost} split into {earned} + {fee}"));
        }
        self.tally.paid[tier] = self.tally.paid[tier] + cost;
        let kind = self.world.fleet.kinds[node] as usize;
        self.tally.provider_earned[kind] = self.tally.provider_earned[kind] + earned;
        self.tally.sold_milli_s[kind] += milli_s;
        self.tally.platform_fees = self.tally.platform_fees + fee;
        self.tally.transactions += 1;
        let reference = self.world.fleet.on_demand[node]
            .cost_for(entry.milli, seconds)
            .expect("costs fit in i64");
        self.tally.on_demand_cost[tier] = self.tally.on_demand_cost[tier] + reference;
        let asked = entry.ask.cost_for(entry.milli, seconds).expect("costs fit in i64");
        self.tally.asked[tier] = self.tally.asked[tier] + asked;
        self.bill_fraud(node, entry, cost, seconds);
    }

    /// What a dishonest node's lie adds to a bill: compute not delivered on a false GPU model;
    /// a last usage record inflated past the lease's end (refused where the trust policy checks
    /// usage, paid where it does not).
    fn bill_fraud(&mut self, node: usize, entry: &LeaseRun, cost: Micros, seconds: u64) {
        use super::fraud::FraudKind;
        let (Some(trust), Some(plan)) = (&mut self.trust, &self.world.fraud) else {
            return;
        };
        match plan.kind[node] {
            Some(FraudKind::FalseGpuModel) => {
                let undelivered = cost.0 * i64::from(1000 - plan.rate_permille[node].min(1000)) / 1000;
                trust.loss(plan, node, undelivered);
            }
            Some(FraudKind::InflatedUsage) => {
                let share = plan.unit(&[5, entry.lease.id.0]);
                let (low, high) = (
                    *super::fraud::INFLATION_PERMILLE.start(),
                    *super::fraud::INFLATION_PERMILLE.end(),
                );
                if trust.detect {
                    let found = trust.usage_violation(plan, node, self.now);
                    self.proven(found);
                } else {
                    let permille = low + (share * (high - low) as f64) as u64;
                    let extra_s = (seconds * permille / 1000).max(1);
                    let extra = entry.price.cost_for(entry.milli, extra_s).expect("costs fit in i64");
                    trust.usage_violation(plan, node, self.now);
                    trust.loss(plan, node, extra.0);
                }
            }
            _ => {}
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

    /// Sorts the GPU-time of the job's current leases since its phase began into the work
    /// tally, up to `until`, keeping its progress as `keep` says.
    fn categorize(&mut self, run: &mut JobRun, until: Timestamp, keep: Keep) {
        let class = run.class;
        let mut restart = 0u64;
        for entry in &run.leases {
            let from = entry.billed_from.max(run.phase_from);
            let to = until.min(run.run_from);
            if to > from {
                restart += (to - from) as u64 * entry.milli;
            }
        }
        self.tally.work[class].restart += restart;
        if until > run.run_from {
            let held: u64 = run.leases.iter().map(|entry| entry.milli).sum();
            let elapsed = (until - run.run_from) as u64;
            let interval = u64::from(run.job.spec.checkpoint_interval_s);
            let cost = u64::from(run.job.checkpoint_cost_s);
            let (cycles, computing, writing) = if interval > 0 {
                let cycle = interval + cost;
                let (full, rest) = (elapsed / cycle, elapsed % cycle);
                (full, rest.min(interval), rest.saturating_sub(interval))
            } else {
                (0, elapsed, 0)
            };
            let tally = &mut self.tally.work[class];
            tally.checkpoint += (cycles * cost + writing) * held;
            let kept = cycles * interval;
            let keep = if run.job.stateless { Keep::All } else { keep };
            let useful = match keep {
                Keep::All => {
                    run.saved_s += kept + computing;
                    (kept + computing) * held
                }
                Keep::Checkpointed => {
                    run.saved_s += kept;
                    tally.lost += computing * held;
                    kept * held
                }
                Keep::AllButLost(lost_milli) => {
                    run.saved_s += kept + computing;
                    tally.lost += computing * lost_milli;
                    (kept + computing) * held - computing * lost_milli
                }
            };
            tally.useful += useful;
            let h100_milli: u64 = run
                .leases
                .iter()
                .map(|entry| entry.milli * u64::from(self.cu_milli[entry.lease.node.index()]) / 1000)
                .sum();
            if held > 0 {
                self.tally.useful_h100_milli_s[run.tier as usize] +=
                    (u128::from(useful) * u128::from(h100_milli) / u128::from(held)) as u64;
            }
            if run.class == 2 {
                self.tally.big_gang_running_s += elapsed;
            }
        }
        run.phase_from = until.max(run.phase_from);
        run.run_from = run.run_from.max(run.phase_from);
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

    fn queue_interrupts(&mut self, lost: Vec<Lease>, cause: Cause) {
        // Grouped by job, in the order the leases came.
        let mut groups: Vec<(u64, Vec<Lease>)> = Vec::new();
        for lease in lost {
            match groups.iter_mut().find(|(job, _)| *job == lease.job.0) {
                Some((_, leases)) => leases.push(lease),
                None => groups.push((lease.job.0, vec![lease])),
            }
        }
        for (job, leases) in groups {
            self.interrupts.push((job, leases, cause));
        }
    }

    fn victims(&mut self, plan: &PreemptionPlan) {
        if !plan.victims.is_empty() {
            let grace = i64::from(self.matcher.config().preemption_grace_s);
            self.push(
                self.now + grace,
                Event::GraceEnd {
                    job: plan.placement.job.0,
                    victims: plan.victims.len() as u32,
                },
            );
        }
        let mut lost = Vec::with_capacity(plan.victims.len());
        for victim in &plan.victims {
            if let Some(run) = self.jobs.get(&victim.job.0)
                && let Some(entry) = run.leases.iter().find(|entry| entry.lease.id == victim.lease)
            {
                lost.push(entry.lease.clone());
            }
        }
        self.hash.add(&[self.now, 11, lost.len() as i64]);
        self.queue_interrupts(lost, Cause::Preempted);
    }

    fn drain_interrupts(&mut self) {
        while let Some((job, leases, cause)) = self.interrupts.pop() {
            if !cause.is_fraud() {
                self.interrupt(job, leases, cause);
                continue;
            }
            // The work a lie threw away, at the lost lease's price, is fraud's cost to the tenant.
            let lost_before: u64 = self.tally.work.iter().map(|work| work.lost).sum();
            let (node, price) = leases
                .first()
                .map_or((0, Micros::ZERO), |lease| (lease.node.index(), lease.price));
            self.interrupt(job, leases, cause);
            let lost: u64 = self.tally.work.iter().map(|work| work.lost).sum::<u64>() - lost_before;
            if let (Some(trust), Some(plan)) = (&mut self.trust, &self.world.fraud) {
                let micros = price.cost_for(lost, 1).map_or(0, |cost| cost.0);
                trust.loss(plan, node, micros);
            }
        }
    }

    /// A job lost `lost` leases (already released in the matcher): repair the gang, or stop it
    /// and queue it again.
    fn interrupt(&mut self, id: u64, lost: Vec<Lease>, cause: Cause) {
        let Some(mut run) = self.jobs.remove(&id) else { return };
        let now = self.now;
        let grace = i64::from(self.matcher.config().preemption_grace_s);
        let lost_ids: Vec<LeaseId> = lost
            .iter()
            .map(|lease| lease.id)
            .filter(|lease| run.leases.iter().any(|entry| entry.lease.id == *lease))
            .collect();
        if lost_ids.is_empty() {
            self.jobs.insert(id, run);
            return;
        }
        self.hash.add(&[now, 7, id as i64, cause.code(), lost_ids.len() as i64]);
        let tier = run.tier as usize;
        if !cause.is_fault() {
            self.tally.preempted_leases[tier] += lost_ids.len() as u64;
            if cause == Cause::WindowClosed {
                self.tally.window_preempted_leases[tier] += lost_ids.len() as u64;
            }
        }
        if run.class == 2 && cause.is_fault() {
            self.tally.big_gang_failures += 1;
        }
        let lost_milli: u64 = run
            .leases
            .iter()
            .filter(|entry| lost_ids.contains(&entry.lease.id))
            .map(|entry| entry.milli)
            .sum();
        let survivors = run.leases.len() > lost_ids.len();
        let can_checkpoint = run.job.spec.checkpoint_interval_s > 0 && run.job.checkpoint_cost_s as i64 <= grace;
        // SIGTERM came a grace period before a window closed.
        let cut = match cause {
            Cause::WindowClosed => (now - grace).max(run.phase_from).min(now),
            _ => now,
        };
        let repairable =
            lost_ids.len() as u64 * 1000 <= (u64::from(run.job.spec.replicas) * REPAIR_LOST_PERMILLE_MAX).max(1000);
        let plan = if self.rules.repair && survivors && run.job.spec.replicas > 1 && repairable {
            run.job.spec.max_runtime_s = self.runtime_estimate(&run);
            let lost_leases: Vec<Lease> = lost
                .iter()
                .filter(|lease| lost_ids.contains(&lease.id))
                .cloned()
                .collect();
            let spec = &run.job.spec;
            match self.timed(Call::Repair, |matcher| matcher.plan_repair(spec, &lost_leases, now)) {
                Ok(plan) if run.tier != Tier::Bronze || plan.victims.is_empty() => Some(plan),
                _ => None,
            }
        } else {
            None
        };
        let keep = match (cause, &plan) {
            (cause, Some(_)) if cause.is_fault() => Keep::AllButLost(lost_milli),
            (cause, None) if cause.is_fault() => Keep::Checkpointed,
            (_, _) if can_checkpoint => Keep::All,
            _ => Keep::Checkpointed,
        };
        self.categorize(&mut run, cut, keep);
        // The lost leases: a preempted one runs through its grace, a closing window's stops at the close.
        let lost_until = if cause == Cause::Preempted { now + grace } else { now };
        for lease in &lost_ids {
            let billed_from = run
                .leases
                .iter()
                .find(|entry| entry.lease.id == *lease)
                .map_or(now, |entry| entry.billed_from);
            let grace_from = billed_from.max(cut);
            if lost_until > grace_from {
                let milli = run
                    .leases
                    .iter()
                    .find(|entry| entry.lease.id == *lease)
                    .map_or(0, |entry| entry.milli);
                self.tally.work[run.class].grace += (lost_until - grace_from) as u64 * milli;
            }
            self.drop_lease(&mut run, *lease, lost_until);
        }
        if let Some(plan) = plan
            && let Ok(leases) = self.timed(Call::Repair, |matcher| matcher.commit_repair(&plan))
        {
            self.tally.repairs += 1;
            if run.class == 2 {
                self.tally.big_gang_repairs += 1;
            }
            self.hash.add(&[now, 8, id as i64, leases.len() as i64]);
            let victim_grace = if plan.victims.is_empty() { 0 } else { grace };
            for lease in leases {
                self.add_lease(&mut run, lease, now + victim_grace);
            }
            // Survivors stall from the cut while the replacement comes up.
            run.phase_from = cut;
            run.run_from = now + victim_grace + RESTART_S;
            self.schedule_completion(&mut run);
            self.reserve_spares(&run);
            self.jobs.insert(id, run);
            self.victims(&plan);
            return;
        }
        if self.rules.repair && survivors && run.job.spec.replicas > 1 {
            self.tally.repairs_failed += 1;
        }
        // Stop whatever is left of the job and queue it again.
        let rest: Vec<LeaseId> = run.leases.iter().map(|entry| entry.lease.id).collect();
        for lease in rest {
            // Survivors' time since the cut is lost with the rest of the gang.
            if let Some(entry) = run.leases.iter().find(|entry| entry.lease.id == lease)
                && now > entry.billed_from.max(cut)
            {
                self.tally.work[run.class].lost += (now - entry.billed_from.max(cut)) as u64 * entry.milli;
            }
            self.timed(Call::Release, |matcher| matcher.release_lease(lease));
            self.drop_lease(&mut run, lease, now);
        }
        if run.job.spec.replicas > 1 {
            self.tally.gang_restarts += 1;
            if run.class == 2 {
                self.tally.big_gang_restarts += 1;
            }
        }
        self.hash.add(&[now, 9, id as i64]);
        run.generation += 1;
        run.freed_at_last_try = None;
        run.failed_tries = 0;
        run.retry_at = now;
        self.jobs.insert(id, run);
        self.enqueue(id);
        self.pass_wanted = true;
        // Placed again at once where it can be (a gang's nodes were just freed).
        let allow = self.rules.preemption;
        if allow {
            self.preempt_budget = self.preempt_budget.max(1);
        }
        self.try_start(id, allow);
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

    fn check(&mut self) {
        self.next_check = self.now + self.world.check_every_s.max(1);
        self.tally.consistency_checks += 1;
        if let Err(message) = self.matcher.consistency_check()
            && self.tally.consistency_failures.len() < 10
        {
            self.tally
                .consistency_failures
                .push(format!("at {}: {message}", self.now));
        }
        let used: u64 = self.node_used_milli.iter().map(|milli| u64::from(*milli)).sum();
        if used != self.matcher.gpu_milli_used() && self.tally.consistency_failures.len() < 10 {
            self.tally.consistency_failures.push(format!(
                "at {}: the simulation holds {used} milli-GPU in leases, the matcher {}",
                self.now,
                self.matcher.gpu_milli_used()
            ));
        }
        self.check_ledger();
    }

    fn check_ledger(&mut self) {
        self.tally.ledger_checks += 1;
        let paid: i64 = self.tally.paid.iter().map(|micros| micros.0).sum();
        let earned: i64 = self.tally.provider_earned.iter().map(|micros| micros.0).sum();
        if paid != earned + self.tally.platform_fees.0 && self.tally.ledger_failures.len() < 10 {
            self.tally.ledger_failures.push(format!(
                "at {}: tenants paid {} but providers earned {} and the platform {}",
                self.now,
                Micros(paid),
                Micros(earned),
                self.tally.platform_fees
            ));
        }
    }

    /// The end of the run: running jobs are billed and their work counted up to it; queued ones
    /// that never started count their wait so far.
    fn finish(&mut self) {
        let end = self.world.end;
        let mut ids: Vec<u64> = self.jobs.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            let mut run = self.jobs.remove(&id).expect("listed above");
            if run.leases.is_empty() {
                if !run.started {
                    let tier = run.tier as usize;
                    self.tally.unstarted_at_end[tier] += 1;
                    self.tally.unserved_wait_s[tier] += (end - run.job.spec.submitted_at).max(0) as u64;
                }
                continue;
            }
            self.categorize(&mut run, end, Keep::All);
            for entry in std::mem::take(&mut run.leases) {
                self.bill(&run, &entry, end);
            }
        }
        if let (Some(trust), Some(plan)) = (&self.trust, &self.world.fraud) {
            let paid: i64 = self.tally.paid.iter().map(|paid| paid.0).sum();
            self.tally.fraud = Some(trust.report(plan, paid));
        }
        self.check();
        for (class, work) in self.tally.work.iter().enumerate() {
            if work.allocated != work.accounted() {
                self.tally.ledger_failures.push(format!(
                    "class {class}: {} milli-GPU-seconds billed but {} accounted for",
                    work.allocated,
                    work.accounted()
                ));
            }
        }
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
