//! Dishonest providers and the trust policy that catches them (`--fraud-rate`).
//!
//! The world seeds a share of providers as dishonest, one kind of lie each, and every policy's
//! market suffers them alike: a false GPU model (the node is listed as a faster model than it
//! is), inflated usage (each lease's last usage record claims time past the lease's end),
//! dropped jobs (the provider abandons half of its leases part-way, to sell the GPUs again) and
//! missed windows (the node vanishes for hours inside its advertised windows, about six times a
//! day). Only Fallow's market runs the trust policy (`docs/trust-policy.md`, through
//! `trust::rules`): canaries on every node about once a day, usage cross-checks, the drop and
//! absence tests, and slashing with refunds. The other markets only count what fraud cost
//! their tenants.
//!
//! What the simulation leaves out: honest agents never drop a lease or send a record that fails
//! a cross-check (no agent bugs are modelled), so the only honest evidence is canary noise and
//! honest failures' absences; canaries run beside the node's work without taking a GPU from the
//! matcher (a five-minute canary a day is 0.3 % of a GPU).

use std::collections::{BTreeMap, BinaryHeap};

use model::Timestamp;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use trust::rules::{self, CanaryFinding, Evidence, Fraud};

use super::failures::NodeEvent;
use super::fleet::{MarketFleet, ProviderKind};

/// The lies a dishonest provider tells, one each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum FraudKind {
    FalseGpuModel = 0,
    InflatedUsage = 1,
    DroppedJobs = 2,
    MissedWindows = 3,
}

impl FraudKind {
    pub const ALL: [FraudKind; 4] = [
        FraudKind::FalseGpuModel,
        FraudKind::InflatedUsage,
        FraudKind::DroppedJobs,
        FraudKind::MissedWindows,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FraudKind::FalseGpuModel => "false_gpu_model",
            FraudKind::InflatedUsage => "inflated_usage",
            FraudKind::DroppedJobs => "dropped_jobs",
            FraudKind::MissedWindows => "missed_windows",
        }
    }
}

/// A dropper abandons this share (per mille) of its leases …
pub const DROP_PERMILLE: u32 = 500;
/// … at a uniform point of the lease's first this many seconds (or its runtime, if shorter).
pub const DROP_WITHIN_S: Timestamp = 86_400;
/// A vanishing node leaves this many times a day on average, for 1–3 hours each time.
pub const VANISHES_PER_DAY: f64 = 6.0;
pub const VANISH_MIN_S: Timestamp = 3600;
pub const VANISH_MAX_S: Timestamp = 3 * 3600;
/// A false GPU model delivers this share (per mille) of the claimed model's rate (an A100 sold
/// as an H100 SXM delivers 315).
pub const FALSE_RATE_PERMILLE: std::ops::RangeInclusive<u32> = 300..=550;
/// Honest nodes' canary rates: most at 900–1000 ‰ of their model's, one in ten throttled (by
/// heat or an owner's power limit) to 720–900 ‰; each run varies by up to ±30 ‰.
pub const HONEST_RATE_PERMILLE: std::ops::RangeInclusive<u32> = 900..=1000;
pub const THROTTLED_RATE_PERMILLE: std::ops::RangeInclusive<u32> = 720..=900;
pub const THROTTLED_PERMILLE: u32 = 100;
pub const CANARY_NOISE_PERMILLE: i64 = 30;
/// An inflated last record claims this share (per mille) of the lease's time on top.
pub const INFLATION_PERMILLE: std::ops::RangeInclusive<u64> = 200..=500;
/// A failed canary is run again this soon (policy § 3: "at once").
pub const CANARY_RERUN_S: Timestamp = 3600;
/// A node that is down or outside its window when its canary is due is tried this much later.
pub const CANARY_RETRY_S: Timestamp = 3600;
/// Every provider has posted a bond of this per GPU (policy § 2's gold minimum), in micro-dollars.
pub const BOND_PER_GPU_MICROS: i64 = rules::GOLD_BOND_PER_GPU_MICROS;

/// Who lies, and how, drawn once per run from the seed and shared by every policy.
#[derive(Clone, Debug)]
pub struct FraudPlan {
    pub rate: f64,
    /// Per node: the lie its provider tells, if any.
    pub kind: Vec<Option<FraudKind>>,
    /// Per node: the rate (per mille of the listed model's) a canary measures before noise.
    pub rate_permille: Vec<u32>,
    /// Per node: the provider, densely numbered, and each provider's GPUs (its bond's base).
    pub provider: Vec<u32>,
    pub provider_gpus: Vec<u64>,
    pub provider_kind: Vec<Option<FraudKind>>,
    pub seed: u64,
}

impl FraudPlan {
    /// Seeds `rate` of the providers (not the big-training campus) as dishonest, the kinds in
    /// turn so each gets a quarter; returns the plan and the vanishing nodes' down and up events
    /// (outside their honest failures).
    pub fn draw(
        fleet: &MarketFleet,
        rate: f64,
        seed: u64,
        start: Timestamp,
        end: Timestamp,
        failures: &[NodeEvent],
    ) -> (FraudPlan, Vec<NodeEvent>) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x66_7261_7564);
        let mut dense: BTreeMap<u32, u32> = BTreeMap::new();
        let provider: Vec<u32> = fleet
            .nodes
            .iter()
            .map(|node| {
                let next = dense.len() as u32;
                *dense.entry(node.provider.0).or_insert(next)
            })
            .collect();
        let providers = dense.len();
        let mut provider_gpus = vec![0u64; providers];
        let mut campus = vec![false; providers];
        for (index, node) in fleet.nodes.iter().enumerate() {
            provider_gpus[provider[index] as usize] += u64::from(node.gpu_count);
            campus[provider[index] as usize] |= fleet.kinds[index] == ProviderKind::Campus;
        }
        let mut provider_kind = vec![None; providers];
        let mut turn = 0usize;
        for (slot, kind) in provider_kind.iter_mut().enumerate() {
            if !campus[slot] && rng.random::<f64>() < rate {
                *kind = Some(FraudKind::ALL[turn % FraudKind::ALL.len()]);
                turn += 1;
            }
        }
        let kind: Vec<Option<FraudKind>> = provider.iter().map(|p| provider_kind[*p as usize]).collect();
        let rate_permille = kind
            .iter()
            .map(|kind| match kind {
                Some(FraudKind::FalseGpuModel) => rng.random_range(FALSE_RATE_PERMILLE),
                _ if rng.random_range(0..1000u32) < THROTTLED_PERMILLE => rng.random_range(THROTTLED_RATE_PERMILLE),
                _ => rng.random_range(HONEST_RATE_PERMILLE),
            })
            .collect();
        let mut down_spans: BTreeMap<u32, Vec<(Timestamp, Timestamp)>> = BTreeMap::new();
        let mut open_down: BTreeMap<u32, Timestamp> = BTreeMap::new();
        for event in failures {
            if event.up {
                if let Some(from) = open_down.remove(&event.node) {
                    down_spans.entry(event.node).or_default().push((from, event.at));
                }
            } else {
                open_down.insert(event.node, event.at);
            }
        }
        for (node, from) in open_down {
            down_spans.entry(node).or_default().push((from, end));
        }
        let mut vanishes = Vec::new();
        for (index, kind) in kind.iter().enumerate() {
            if *kind != Some(FraudKind::MissedWindows) {
                continue;
            }
            let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x7661_6e69_7368);
            rng.set_stream(index as u64);
            let mut at = start as f64;
            let spans = down_spans.get(&(index as u32)).map_or(&[][..], Vec::as_slice);
            loop {
                at += -(1.0 - rng.random::<f64>()).ln() * 86_400.0 / VANISHES_PER_DAY;
                let from = at.ceil() as Timestamp;
                let until = from + rng.random_range(VANISH_MIN_S..=VANISH_MAX_S);
                if until >= end {
                    break;
                }
                at = until as f64;
                // Never inside (or touching) an honest failure of the same node.
                if spans.iter().any(|(down, up)| from <= *up && until >= *down) {
                    continue;
                }
                vanishes.push(NodeEvent {
                    at: from,
                    node: index as u32,
                    up: false,
                    vanish: true,
                });
                vanishes.push(NodeEvent {
                    at: until,
                    node: index as u32,
                    up: true,
                    vanish: true,
                });
            }
        }
        (
            FraudPlan {
                rate,
                kind,
                rate_permille,
                provider,
                provider_gpus,
                provider_kind,
                seed,
            },
            vanishes,
        )
    }

    /// A uniform draw in [0, 1) fixed by the seed and a few words (the same in every policy).
    pub fn unit(&self, words: &[u64]) -> f64 {
        let mut trace = super::trace::TraceHash(0xcbf2_9ce4_8422_2325u64 ^ self.seed);
        trace.add(&words.iter().map(|word| *word as i64).collect::<Vec<_>>());
        let mut hash = trace.0;
        // A final mix (splitmix64), so nearby inputs give unrelated draws.
        hash ^= hash >> 30;
        hash = hash.wrapping_mul(0xbf58_476d_1ce4_e5b9);
        hash ^= hash >> 27;
        hash = hash.wrapping_mul(0x94d0_49bb_1331_11eb);
        hash ^= hash >> 31;
        (hash >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Per policy: what fraud cost, and (in Fallow's market) the trust policy's evidence and verdicts.
pub(crate) struct TrustState {
    /// Whether this market runs the trust policy.
    pub detect: bool,
    evidence: Vec<Evidence>,
    /// Per node: absences inside its windows (times), and its open spans within the last week.
    absences: Vec<Vec<Timestamp>>,
    open_spans: Vec<Vec<(Timestamp, Timestamp)>>,
    open_since: Vec<Option<Timestamp>>,
    canaries: BinaryHeap<std::cmp::Reverse<(Timestamp, u32)>>,
    canary_runs: Vec<u32>,
    /// Per provider: when it first lied, when it was proven and by which rule, what it cost
    /// tenants, and what they were paid back.
    pub first_act: Vec<Option<Timestamp>>,
    pub proven: Vec<Option<(Timestamp, Fraud)>>,
    pub loss_micros: Vec<i64>,
    pub refunded_micros: Vec<i64>,
    pub slashed_micros: i64,
    pub canaries_run: u64,
    pub canaries_failed: u64,
    pub inflated_records: u64,
    pub dropped_leases: u64,
    pub cordoned_nodes: Vec<u32>,
}

impl TrustState {
    pub fn new(plan: &FraudPlan, detect: bool, start: Timestamp, open: &[bool]) -> TrustState {
        let nodes = plan.kind.len();
        let providers = plan.provider_gpus.len();
        let mut canaries = BinaryHeap::new();
        if detect {
            for node in 0..nodes {
                canaries.push(std::cmp::Reverse((
                    start + next_canary_in(plan, node as u32, 0),
                    node as u32,
                )));
            }
        }
        TrustState {
            detect,
            evidence: vec![Evidence::default(); if detect { nodes } else { 0 }],
            absences: vec![Vec::new(); nodes],
            open_spans: vec![Vec::new(); nodes],
            open_since: open.iter().map(|open| open.then_some(start)).collect(),
            canaries,
            canary_runs: vec![0; nodes],
            first_act: plan
                .provider_kind
                .iter()
                .map(|kind| (*kind == Some(FraudKind::FalseGpuModel)).then_some(start))
                .collect(),
            proven: vec![None; providers],
            loss_micros: vec![0; providers],
            refunded_micros: vec![0; providers],
            slashed_micros: 0,
            canaries_run: 0,
            canaries_failed: 0,
            inflated_records: 0,
            dropped_leases: 0,
            cordoned_nodes: Vec::new(),
        }
    }

    pub fn next_canary_at(&self) -> Option<Timestamp> {
        self.canaries.peek().map(|std::cmp::Reverse((at, _))| *at)
    }

    /// Runs the due canary on its node if the node is up and open (else tries again later).
    /// Returns the provider it proved fraudulent, if it did.
    pub fn run_canary(
        &mut self,
        plan: &FraudPlan,
        now: Timestamp,
        available: &dyn Fn(usize) -> bool,
    ) -> Option<(u32, Fraud)> {
        let std::cmp::Reverse((_, node)) = self.canaries.pop()?;
        let index = node as usize;
        let provider = plan.provider[index];
        if self.proven[provider as usize].is_some() {
            return None;
        }
        if !available(index) {
            self.canaries.push(std::cmp::Reverse((now + CANARY_RETRY_S, node)));
            return None;
        }
        self.canary_runs[index] += 1;
        self.canaries_run += 1;
        let noise = plan.unit(&[1, u64::from(node), u64::from(self.canary_runs[index])]);
        let noise = ((noise * 2.0 - 1.0) * CANARY_NOISE_PERMILLE as f64).round() as i64;
        let measured = (i64::from(plan.rate_permille[index]) + noise).max(0) as u64;
        let run = rules::CanaryRun {
            expected_digest: "known".into(),
            returned_digest: "known".into(),
            rate: measured,
            expected_rate: 1000,
            memory_allocated: true,
        };
        let finding = run.finding();
        let proof = self.evidence[index].canary(finding);
        let next = if finding == CanaryFinding::Passed {
            next_canary_in(plan, node, self.canary_runs[index])
        } else {
            self.canaries_failed += 1;
            CANARY_RERUN_S
        };
        self.canaries.push(std::cmp::Reverse((now + next, node)));
        proof.map(|fraud| (provider, fraud))
    }

    /// A node's last usage record of a lease claimed time past the lease (refused where the
    /// trust policy runs).
    pub fn usage_violation(&mut self, plan: &FraudPlan, node: usize, now: Timestamp) -> Option<(u32, Fraud)> {
        self.inflated_records += 1;
        self.lie(plan, node, now, Evidence::usage_violation)
    }

    /// A node dropped a lease while up.
    pub fn dropped(&mut self, plan: &FraudPlan, node: usize, now: Timestamp) -> Option<(u32, Fraud)> {
        self.dropped_leases += 1;
        self.lie(plan, node, now, Evidence::dropped_lease)
    }

    /// A lie seen at `now`: marks the provider's first, and adds it to the node's evidence where
    /// the trust policy runs. Returns the fraud it proves, if any.
    fn lie(
        &mut self,
        plan: &FraudPlan,
        node: usize,
        now: Timestamp,
        add: fn(&mut Evidence, i64) -> Option<Fraud>,
    ) -> Option<(u32, Fraud)> {
        let provider = plan.provider[node];
        self.first_act[provider as usize].get_or_insert(now);
        if !self.detect || self.proven[provider as usize].is_some() {
            return None;
        }
        add(&mut self.evidence[node], now * 1000).map(|fraud| (provider, fraud))
    }

    /// A node's window opened or closed, or the node went down or came back: `available` is
    /// whether it is now both up and inside its window.
    pub fn availability(&mut self, node: usize, available: bool, now: Timestamp) {
        match (self.open_since[node], available) {
            (None, true) => self.open_since[node] = Some(now),
            (Some(since), false) => {
                self.open_since[node] = None;
                if now > since {
                    self.open_spans[node].push((since, now));
                }
            }
            _ => {}
        }
    }

    /// A node went down inside its window: an absence (an honest failure or a vanishing).
    /// Returns the provider it proved fraudulent, if it did.
    pub fn absent(&mut self, plan: &FraudPlan, node: usize, vanish: bool, now: Timestamp) -> Option<(u32, Fraud)> {
        let provider = plan.provider[node];
        if vanish {
            self.first_act[provider as usize].get_or_insert(now);
        }
        if !self.detect || self.proven[provider as usize].is_some() {
            return None;
        }
        let since = now - rules::ABSENCE_WINDOW_MS / 1000;
        self.absences[node].retain(|at| *at >= since);
        self.absences[node].push(now);
        self.open_spans[node].retain(|(_, until)| *until > since);
        let mut open_s: i64 = self.open_spans[node]
            .iter()
            .map(|(from, until)| until - (*from).max(since))
            .sum();
        if let Some(from) = self.open_since[node] {
            open_s += now - from.max(since);
        }
        let hours = (open_s.max(0) as u64).div_ceil(3600);
        rules::absences_beyond_chance(self.absences[node].len() as u64, hours)
            .then_some((provider, Fraud::MissedWindows))
    }

    /// What a lie cost a tenant on a node (undelivered compute paid for, or work lost).
    pub fn loss(&mut self, plan: &FraudPlan, node: usize, micros: i64) {
        if micros > 0 {
            self.loss_micros[plan.provider[node] as usize] += micros;
        }
    }

    /// Proven fraud: slashes the provider's bond by the rule's share, pays its tenants back what
    /// it cost them so far (as far as the slashed money goes). The caller cordons its nodes.
    pub fn prove(&mut self, plan: &FraudPlan, provider: u32, fraud: Fraud, now: Timestamp) {
        let slot = provider as usize;
        if self.proven[slot].is_some() {
            return;
        }
        self.proven[slot] = Some((now, fraud));
        let bond = BOND_PER_GPU_MICROS * plan.provider_gpus[slot] as i64;
        let slashed = bond * i64::from(fraud.slash_permille()) / 1000;
        self.slashed_micros += slashed;
        self.refunded_micros[slot] = self.loss_micros[slot].min(slashed);
        for (node, owner) in plan.provider.iter().enumerate() {
            if *owner == provider {
                self.cordoned_nodes.push(node as u32);
            }
        }
    }

    pub fn report(&self, plan: &FraudPlan, paid_micros: i64) -> FraudReport {
        let mut by_kind = BTreeMap::new();
        let mut days_all = Vec::new();
        let (mut acted_all, mut detected_all) = (0u64, 0u64);
        for kind in FraudKind::ALL {
            let (mut providers, mut acted, mut detected) = (0u64, 0u64, 0u64);
            let mut days = Vec::new();
            for (slot, provider_kind) in plan.provider_kind.iter().enumerate() {
                if *provider_kind != Some(kind) {
                    continue;
                }
                providers += 1;
                let Some(first) = self.first_act[slot] else { continue };
                acted += 1;
                if let Some((at, _)) = self.proven[slot] {
                    detected += 1;
                    days.push((at - first).max(0) as f64 / 86_400.0);
                }
            }
            acted_all += acted;
            detected_all += detected;
            days_all.extend_from_slice(&days);
            by_kind.insert(
                kind.name(),
                FraudKindReport {
                    providers,
                    acted,
                    detected,
                    median_days_to_detect: median(&mut days),
                },
            );
        }
        let honest_slashed = plan
            .provider_kind
            .iter()
            .zip(&self.proven)
            .filter(|(kind, proven)| kind.is_none() && proven.is_some())
            .count() as u64;
        let loss: i64 = self.loss_micros.iter().sum();
        let refunded: i64 = self.refunded_micros.iter().sum();
        let pct = |value: i64| {
            (paid_micros > 0).then(|| (value as f64 * 100.0 / paid_micros as f64 * 10_000.0).round() / 10_000.0)
        };
        FraudReport {
            dishonest_providers: plan.provider_kind.iter().filter(|kind| kind.is_some()).count() as u64,
            acted: acted_all,
            detected: detected_all,
            fraud_detected_pct: (acted_all > 0)
                .then(|| (detected_all as f64 * 100.0 / acted_all as f64 * 100.0).round() / 100.0),
            median_days_to_detect: median(&mut days_all),
            honest_slashed,
            tenant_loss_to_fraud_pct: pct(loss - refunded),
            tenant_loss_before_refunds_pct: pct(loss),
            refunded_usd: refunded as f64 / 1e6,
            slashed_usd: self.slashed_micros as f64 / 1e6,
            canaries_run: self.canaries_run,
            canaries_failed: self.canaries_failed,
            inflated_usage_records: self.inflated_records,
            dropped_leases: self.dropped_leases,
            by_kind,
        }
    }
}

/// The time to a node's next canary: exponential around the policy's mean, from a draw fixed by
/// the seed, the node and its run count.
fn next_canary_in(plan: &FraudPlan, node: u32, runs: u32) -> Timestamp {
    let unit = plan.unit(&[2, u64::from(node), u64::from(runs)]);
    let mean_s = rules::CANARY_MEAN_INTERVAL_NEW_MS as f64 / 1000.0;
    (-(1.0 - unit).ln() * mean_s).ceil().max(1.0) as Timestamp
}

fn median(values: &mut [f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let middle = values.len() / 2;
    let value = if values.len() % 2 == 1 {
        values[middle]
    } else {
        (values[middle - 1] + values[middle]) / 2.0
    };
    Some((value * 10_000.0).round() / 10_000.0)
}

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct FraudKindReport {
    pub providers: u64,
    /// Providers that lied at least once (a false GPU model lies from the start).
    pub acted: u64,
    pub detected: u64,
    pub median_days_to_detect: Option<f64>,
}

/// What fraud did in one market, and what the trust policy caught (null figures where this
/// market runs no trust policy or nothing happened).
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct FraudReport {
    pub dishonest_providers: u64,
    pub acted: u64,
    pub detected: u64,
    /// Dishonest providers proven, of those that lied at least once.
    pub fraud_detected_pct: Option<f64>,
    /// From a provider's first lie to its proof, over the providers proven.
    pub median_days_to_detect: Option<f64>,
    /// Honest providers slashed.
    pub honest_slashed: u64,
    /// What fraud cost tenants (undelivered compute paid for, work lost to drops and
    /// vanishings), less what slashes paid back, over everything tenants paid.
    pub tenant_loss_to_fraud_pct: Option<f64>,
    pub tenant_loss_before_refunds_pct: Option<f64>,
    pub refunded_usd: f64,
    pub slashed_usd: f64,
    pub canaries_run: u64,
    pub canaries_failed: u64,
    /// Usage records inflated past a lease's end: refused where the trust policy runs, paid elsewhere.
    pub inflated_usage_records: u64,
    pub dropped_leases: u64,
    pub by_kind: BTreeMap<&'static str, FraudKindReport>,
}
