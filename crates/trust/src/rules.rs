//! The trust policy's rules as code: reputation, badges, canary findings, usage cross-checks,
//! the test for dropped jobs and missed windows, and slash shares. Every constant cites the
//! section of `docs/trust-policy.md` it comes from; the two change together.
//!
//! Pure functions of their inputs: no IO, no clock (times are milliseconds since the Unix epoch,
//! passed in).

use serde::{Deserialize, Serialize};

use crate::UsageRecord;

/// The policy document these rules implement, relative to the repository root.
pub const POLICY_DOCUMENT: &str = "docs/trust-policy.md";

const DAY_MS: i64 = 86_400_000;

// ---------------------------------------------------------------------------------------------
// § 1 Reputation

/// § 1: a new node starts at Beta(8, 2).
pub const PRIOR_SUCCESSES: f64 = 8.0;
pub const PRIOR_FAILURES: f64 = 2.0;
/// § 1: an outcome's weight halves every 30 days.
pub const HALF_LIFE_MS: i64 = 30 * DAY_MS;

/// What a node did, as reputation counts it (§ 1's table).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    LeaseFinished,
    NodeFault,
    WindowHourPresent,
    WindowHourMissed,
    CanaryPassed,
    CanaryFailed,
}

impl Outcome {
    pub const ALL: [Outcome; 6] = [
        Outcome::LeaseFinished,
        Outcome::NodeFault,
        Outcome::WindowHourPresent,
        Outcome::WindowHourMissed,
        Outcome::CanaryPassed,
        Outcome::CanaryFailed,
    ];

    /// Whether it counts as a success, and its weight (§ 1's table).
    pub fn weight(self) -> (bool, f64) {
        match self {
            Outcome::LeaseFinished | Outcome::WindowHourPresent => (true, 1.0),
            Outcome::NodeFault | Outcome::WindowHourMissed => (false, 1.0),
            Outcome::CanaryPassed => (true, 2.0),
            Outcome::CanaryFailed => (false, 5.0),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Outcome::LeaseFinished => "lease_finished",
            Outcome::NodeFault => "node_fault",
            Outcome::WindowHourPresent => "window_hour_present",
            Outcome::WindowHourMissed => "window_hour_missed",
            Outcome::CanaryPassed => "canary_passed",
            Outcome::CanaryFailed => "canary_failed",
        }
    }

    pub fn parse(text: &str) -> Option<Outcome> {
        Outcome::ALL.into_iter().find(|outcome| outcome.name() == text)
    }

    /// Its place in [`Outcome::ALL`] (and in [`Reputation::inputs`]).
    pub fn slot(self) -> usize {
        self as usize
    }
}

/// A Beta posterior over a node's (or a provider's) outcomes, with its inputs: the decayed
/// weight of each kind of outcome, so a provider can see why its score is what it is.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Reputation {
    pub alpha: f64,
    pub beta: f64,
    /// Decayed weight per outcome kind, in [`Outcome::ALL`]'s order.
    pub inputs: [f64; 6],
}

impl Default for Reputation {
    fn default() -> Reputation {
        Reputation {
            alpha: PRIOR_SUCCESSES,
            beta: PRIOR_FAILURES,
            inputs: [0.0; 6],
        }
    }
}

impl Reputation {
    /// The posterior from outcomes at their times, seen at `now_ms` (outcomes after it weigh 1).
    pub fn from_outcomes<'a>(outcomes: impl IntoIterator<Item = &'a (Outcome, i64)>, now_ms: i64) -> Reputation {
        let mut reputation = Reputation::default();
        for &(outcome, at_ms) in outcomes {
            reputation.add(outcome, at_ms, now_ms);
        }
        reputation
    }

    /// Adds one outcome that happened at `at_ms`, seen at `now_ms`.
    pub fn add(&mut self, outcome: Outcome, at_ms: i64, now_ms: i64) {
        self.add_many(outcome, 1.0, at_ms, now_ms);
    }

    /// Adds `count` outcomes of one kind (a fraction for part of a window hour) that happened at
    /// `at_ms`, seen at `now_ms`.
    pub fn add_many(&mut self, outcome: Outcome, count: f64, at_ms: i64, now_ms: i64) {
        let age_ms = (now_ms - at_ms).max(0) as f64;
        let decay = 0.5f64.powf(age_ms / HALF_LIFE_MS as f64);
        let (success, weight) = outcome.weight();
        let weight = weight * count * decay;
        if success {
            self.alpha += weight;
        } else {
            self.beta += weight;
        }
        self.inputs[outcome.slot()] += weight;
    }

    /// The posterior from decayed, weighted inputs (per kind, in [`Outcome::ALL`]'s order).
    pub fn from_inputs(inputs: [f64; 6]) -> Reputation {
        let mut reputation = Reputation {
            inputs,
            ..Reputation::default()
        };
        for (outcome, weight) in Outcome::ALL.iter().zip(inputs) {
            if outcome.weight().0 {
                reputation.alpha += weight;
            } else {
                reputation.beta += weight;
            }
        }
        reputation
    }

    /// § 1: the posterior mean.
    pub fn score(&self) -> f64 {
        self.alpha / (self.alpha + self.beta)
    }

    /// § 1: the mean less two posterior standard deviations (never below 0).
    pub fn lower_bound(&self) -> f64 {
        let total = self.alpha + self.beta;
        let variance = self.alpha * self.beta / (total * total * (total + 1.0));
        (self.score() - 2.0 * variance.sqrt()).max(0.0)
    }

    /// The decayed weight of all outcomes (the prior left out).
    pub fn evidence(&self) -> f64 {
        self.inputs.iter().sum()
    }

    /// The score in parts per million, as the matcher takes reliability.
    pub fn score_ppm(&self) -> u32 {
        (self.score() * 1e6).round().clamp(0.0, 1e6) as u32
    }
}

// ---------------------------------------------------------------------------------------------
// § 2 Badges

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Badge {
    None,
    Bronze,
    Silver,
    Gold,
}

impl Badge {
    pub fn name(self) -> &'static str {
        match self {
            Badge::None => "none",
            Badge::Bronze => "bronze",
            Badge::Silver => "silver",
            Badge::Gold => "gold",
        }
    }
}

/// § 2's table: (badge, lower bound, decayed outcomes, days since the first node registered).
pub const BADGE_THRESHOLDS: [(Badge, f64, f64, i64); 3] = [
    (Badge::Gold, 0.97, 200.0, 30),
    (Badge::Silver, 0.93, 50.0, 7),
    (Badge::Bronze, 0.85, 10.0, 0),
];
/// § 2: a gold provider's bond per GPU it offers, in micro-dollars ($50).
pub const GOLD_BOND_PER_GPU_MICROS: i64 = 50_000_000;
/// § 2: a silver badge needs no proven fraud in this many days.
pub const SILVER_CLEAN_DAYS: i64 = 180;

/// What a badge is decided from, besides the reputation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct History {
    /// When the provider's first node registered.
    pub first_registered_ms: i64,
    /// When fraud was last proven against the provider, if ever.
    pub last_fraud_ms: Option<i64>,
    pub bond_micros: i64,
    pub gpus_offered: u32,
}

/// § 2: the best badge the provider qualifies for.
pub fn badge(reputation: &Reputation, history: &History, now_ms: i64) -> Badge {
    let days = (now_ms - history.first_registered_ms).max(0) / DAY_MS;
    let bound = reputation.lower_bound();
    let evidence = reputation.evidence();
    let clean_for = |days_clean: i64| history.last_fraud_ms.is_none_or(|at| now_ms - at > days_clean * DAY_MS);
    for (badge, min_bound, min_evidence, min_days) in BADGE_THRESHOLDS {
        if bound < min_bound || evidence < min_evidence || days < min_days {
            continue;
        }
        let other = match badge {
            Badge::Gold => {
                history.last_fraud_ms.is_none()
                    && history.bond_micros >= GOLD_BOND_PER_GPU_MICROS * i64::from(history.gpus_offered.max(1))
            }
            Badge::Silver => clean_for(SILVER_CLEAN_DAYS),
            Badge::Bronze | Badge::None => true,
        };
        if other {
            return badge;
        }
    }
    Badge::None
}

/// § 2: the next badge above the one the provider has, and in words each threshold of it the
/// provider misses (empty when it meets them all: it shows at the next look). `None` above gold.
pub fn next_badge(reputation: &Reputation, history: &History, now_ms: i64) -> Option<(Badge, Vec<String>)> {
    let current = badge(reputation, history, now_ms);
    // The thresholds run from gold down: the next one up is just before the current badge.
    let index = BADGE_THRESHOLDS
        .iter()
        .position(|(badge, ..)| *badge == current)
        .unwrap_or(BADGE_THRESHOLDS.len());
    let &(next, min_bound, min_evidence, min_days) = BADGE_THRESHOLDS.get(index.checked_sub(1)?)?;
    let mut missing = Vec::new();
    if reputation.lower_bound() < min_bound {
        missing.push(format!(
            "a lower bound of {min_bound:.2} (now {:.3})",
            reputation.lower_bound()
        ));
    }
    if reputation.evidence() < min_evidence {
        missing.push(format!("{min_evidence:.0} outcomes (now {:.1})", reputation.evidence()));
    }
    let days = (now_ms - history.first_registered_ms).max(0) / DAY_MS;
    if days < min_days {
        missing.push(format!("{min_days} days since the first node registered (now {days})"));
    }
    match next {
        Badge::Gold => {
            if history.last_fraud_ms.is_some() {
                missing.push("no proven fraud ever".to_string());
            }
            let needed = GOLD_BOND_PER_GPU_MICROS * i64::from(history.gpus_offered.max(1));
            if history.bond_micros < needed {
                missing.push(format!(
                    "a bond of {} (now {})",
                    dollars(needed),
                    dollars(history.bond_micros)
                ));
            }
        }
        Badge::Silver => {
            if history
                .last_fraud_ms
                .is_some_and(|at| now_ms - at <= SILVER_CLEAN_DAYS * DAY_MS)
            {
                missing.push(format!("no proven fraud in the last {SILVER_CLEAN_DAYS} days"));
            }
        }
        Badge::Bronze | Badge::None => {}
    }
    Some((next, missing))
}

/// Micro-dollars as dollars and cents, rounded down: `$50.00`.
fn dollars(micros: i64) -> String {
    let cents = micros.max(0) / 10_000;
    format!("${}.{:02}", cents / 100, cents % 100)
}

// ---------------------------------------------------------------------------------------------
// § 3 Canaries

/// § 3: a canary under this share (per mille) of the claimed model's rate is slow.
pub const CANARY_SLOW_PERMILLE: u32 = 600;
/// § 3: a matmul canary (`crate::matmul`) under this share (per mille) of the claimed model's
/// dense BF16 TFLOPS is slow. cuBLAS reaches 60–75 % of the datasheet figure on a 4096² bf16
/// product; a GPU of the next class down (an A100 claimed as an H100: 32 %) falls well under.
pub const MATMUL_SLOW_PERMILLE: u32 = 450;
/// § 3: the canary allocates this share (per mille) of the claimed model's memory per GPU.
pub const CANARY_MEMORY_PERMILLE: u32 = 900;
/// § 3: this many failed canaries of one kind in a row prove fraud.
pub const CANARY_FAILURES_TO_PROVE: usize = 2;
/// § 3: a node's canaries: about daily in its first week, weekly after.
pub const CANARY_MEAN_INTERVAL_NEW_MS: i64 = DAY_MS;
pub const CANARY_MEAN_INTERVAL_MS: i64 = 7 * DAY_MS;
pub const CANARY_NEW_NODE_MS: i64 = 7 * DAY_MS;

/// What a canary run reported, against what the claimed GPU model should give.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CanaryRun {
    pub expected_digest: String,
    pub returned_digest: String,
    /// The rate measured and the claimed model's reference rate, in the same unit.
    pub rate: u64,
    pub expected_rate: u64,
    /// Whether every GPU could allocate [`CANARY_MEMORY_PERMILLE`] of the claimed memory.
    pub memory_allocated: bool,
}

/// § 3: one canary's finding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CanaryFinding {
    Passed,
    WrongAnswer,
    /// Too slow or too little memory for the claimed model.
    Slow,
}

impl CanaryFinding {
    pub const ALL: [CanaryFinding; 3] = [CanaryFinding::Passed, CanaryFinding::WrongAnswer, CanaryFinding::Slow];

    /// Its stored and wire name.
    pub fn name(self) -> &'static str {
        match self {
            CanaryFinding::Passed => "passed",
            CanaryFinding::WrongAnswer => "wrong_answer",
            CanaryFinding::Slow => "slow",
        }
    }

    pub fn parse(text: &str) -> Option<CanaryFinding> {
        CanaryFinding::ALL.into_iter().find(|finding| finding.name() == text)
    }
}

impl CanaryRun {
    /// The hash canary's finding: slow under [`CANARY_SLOW_PERMILLE`] of the expected rate.
    pub fn finding(&self) -> CanaryFinding {
        self.finding_at(CANARY_SLOW_PERMILLE)
    }

    /// The finding with the slow line at `slow_permille` of the expected rate (the matmul
    /// canary's is [`MATMUL_SLOW_PERMILLE`]).
    pub fn finding_at(&self, slow_permille: u32) -> CanaryFinding {
        if self.returned_digest != self.expected_digest {
            CanaryFinding::WrongAnswer
        } else if !self.memory_allocated
            || u128::from(self.rate) * 1000 < u128::from(self.expected_rate) * u128::from(slow_permille)
        {
            CanaryFinding::Slow
        } else {
            CanaryFinding::Passed
        }
    }
}

/// The mean time to a node's next canary (§ 3), by the node's age.
pub fn canary_mean_interval_ms(node_age_ms: i64) -> i64 {
    if node_age_ms < CANARY_NEW_NODE_MS {
        CANARY_MEAN_INTERVAL_NEW_MS
    } else {
        CANARY_MEAN_INTERVAL_MS
    }
}

/// § 3: a node's first canary comes within this time of its registration, and one comes within
/// it after its hardware fingerprint changes or a canary went unanswered.
pub const CANARY_WITHIN_MS: i64 = 3_600_000;
/// § 3: this many canaries in a row unanswered take a node off gold work until one passes.
pub const CANARY_UNANSWERED_OFF_GOLD: u32 = 3;

/// Where a node's latest canary stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CanaryState {
    /// Ordered, not yet answered nor past its deadline.
    Open,
    Answered(CanaryFinding),
    /// Its deadline passed without an answer.
    Unanswered,
}

/// What the next canary of a node depends on (times in ms).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CanaryHistory {
    pub registered_ms: i64,
    pub fingerprint_changed_ms: Option<i64>,
    /// The latest canary: when it was ordered, when it was answered or given up, and its state.
    pub latest: Option<(i64, Option<i64>, CanaryState)>,
}

/// When a node's next canary is due (§ 3).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum CanaryDue {
    /// One is open: none now.
    No,
    /// At once (the last one failed).
    Now,
    /// At a random time before this deadline (ms), uniformly over what is left of it.
    By(i64),
    /// At random times, this far apart on average (ms): a Poisson process.
    Every(i64),
}

impl CanaryDue {
    /// The chance that the next canary is ordered in the `step_ms` from `now_ms`.
    pub fn chance_within(self, now_ms: i64, step_ms: i64) -> f64 {
        match self {
            CanaryDue::No => 0.0,
            CanaryDue::Now => 1.0,
            CanaryDue::By(deadline_ms) => {
                let left_ms = deadline_ms - now_ms;
                if left_ms <= step_ms {
                    1.0
                } else {
                    step_ms as f64 / left_ms as f64
                }
            }
            CanaryDue::Every(mean_ms) => 1.0 - (-(step_ms as f64) / mean_ms.max(1) as f64).exp(),
        }
    }
}

/// § 3: when a node's next canary is due. `within_ms` is [`CANARY_WITHIN_MS`] (shorter in tests).
pub fn canary_due(history: &CanaryHistory, now_ms: i64, within_ms: i64) -> CanaryDue {
    let Some((ordered_ms, finished_ms, state)) = history.latest else {
        return CanaryDue::By(history.registered_ms + within_ms);
    };
    if state == CanaryState::Open {
        return CanaryDue::No;
    }
    if let Some(changed_ms) = history.fingerprint_changed_ms
        && changed_ms > ordered_ms
    {
        return CanaryDue::By(changed_ms + within_ms);
    }
    match state {
        CanaryState::Answered(CanaryFinding::Passed) => {
            CanaryDue::Every(canary_mean_interval_ms(now_ms - history.registered_ms))
        }
        CanaryState::Answered(_) => CanaryDue::Now,
        CanaryState::Unanswered | CanaryState::Open => CanaryDue::By(finished_ms.unwrap_or(ordered_ms) + within_ms),
    }
}

/// What decides whether a node may take gold work, besides its provider's badge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeCanaries {
    /// The finding of its latest answered canary, and when it came.
    pub last_answered: Option<(CanaryFinding, i64)>,
    /// Canaries unanswered since then.
    pub unanswered_since: u32,
    pub fingerprint_changed_ms: Option<i64>,
}

/// §§ 2–3: a node takes gold work when its provider has the gold badge, its latest answered
/// canary passed on its current hardware, fewer than [`CANARY_UNANSWERED_OFF_GOLD`] canaries
/// went unanswered since, and it is not cordoned for fraud.
pub fn gold_eligible(provider_badge: Badge, canaries: &NodeCanaries, fraud_cordoned: bool) -> bool {
    let verified = match canaries.last_answered {
        Some((CanaryFinding::Passed, at_ms)) => canaries.fingerprint_changed_ms.is_none_or(|changed| changed <= at_ms),
        _ => false,
    };
    provider_badge == Badge::Gold
        && verified
        && canaries.unanswered_since < CANARY_UNANSWERED_OFF_GOLD
        && !fraud_cordoned
}

// ---------------------------------------------------------------------------------------------
// § 4 Usage cross-checks

/// § 4: slack on GPU-seconds for clock granularity, per mille.
pub const USAGE_SLACK_PERMILLE: i64 = 10;
/// § 4: clock skew allowed at a lease's edges (once the node's measured offset is taken out).
pub const USAGE_SKEW_MS: i64 = 5_000;
/// § 4: after the coordinator ends a lease, the time its agent may take to notice (billed up
/// to the end only).
pub const USAGE_END_NOTICE_MS: i64 = 30_000;
/// § 4: the activity check needs at least this many heartbeats over the record's period.
pub const TELEMETRY_HEARTBEATS_MIN: usize = 3;
/// § 4: a record claims activity at this utilisation (per mille) or more …
pub const USAGE_ACTIVE_PERMILLE: i64 = 100;
/// § 4: … which the node's heartbeats contradict when they averaged under this.
pub const TELEMETRY_IDLE_PERMILLE: i64 = 20;
/// § 4: this many violating records from one node within [`USAGE_PROOF_WINDOW_MS`] prove
/// inflated usage.
pub const USAGE_VIOLATIONS_TO_PROVE: usize = 3;
pub const USAGE_PROOF_WINDOW_MS: i64 = DAY_MS;

/// The lease as the coordinator knows it, for checking a usage record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseTerms {
    /// The lease's GPU share in milli-GPUs (1000 = one whole GPU).
    pub gpu_milli: i64,
    pub start_ms: i64,
    /// The lease's end, or now if it still runs.
    pub end_ms: i64,
    /// GPU-milli-seconds already accepted for this lease from earlier records.
    pub accepted_gpu_seconds_milli: i64,
}

/// Why a usage record was refused (§ 4).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "check")]
pub enum UsageViolation {
    #[error("the record's period is empty or reversed ({start_ms}..{end_ms})")]
    BadPeriod { start_ms: i64, end_ms: i64 },
    #[error(
        "the record claims {claimed} GPU-milli-seconds, more than the lease's GPUs could deliver in its period ({capacity})"
    )]
    OverCapacity { claimed: i64, capacity: i64 },
    #[error("the record's period {start_ms}..{end_ms} lies outside the lease ({lease_start_ms}..{lease_end_ms})")]
    OutsideLease {
        start_ms: i64,
        end_ms: i64,
        lease_start_ms: i64,
        lease_end_ms: i64,
    },
    #[error("with this record the lease's usage ({total}) exceeds its GPUs × its elapsed time ({capacity})")]
    Overlapping { total: i64, capacity: i64 },
    #[error(
        "the record claims {claimed_permille} ‰ GPU utilisation while the node's heartbeats reported {telemetry_permille} ‰"
    )]
    ActiveWhileIdle {
        claimed_permille: i64,
        telemetry_permille: i64,
    },
}

fn with_slack(value: i64) -> i64 {
    value.saturating_add(value.saturating_mul(USAGE_SLACK_PERMILLE) / 1000)
}

/// § 4: checks a usage record against the lease and the node's own telemetry over the record's
/// period: the highest utilisation (per mille) any of its heartbeats there reported for the
/// lease's GPUs, when at least [`TELEMETRY_HEARTBEATS_MIN`] fall there.
pub fn check_usage(
    record: &UsageRecord,
    lease: &LeaseTerms,
    telemetry_utilisation_permille: Option<i64>,
) -> Result<(), UsageViolation> {
    let (start_ms, end_ms) = (record.period_start_ms, record.period_end_ms);
    if end_ms <= start_ms {
        return Err(UsageViolation::BadPeriod { start_ms, end_ms });
    }
    if start_ms < lease.start_ms - USAGE_SKEW_MS || end_ms > lease.end_ms + USAGE_SKEW_MS {
        return Err(UsageViolation::OutsideLease {
            start_ms,
            end_ms,
            lease_start_ms: lease.start_ms,
            lease_end_ms: lease.end_ms,
        });
    }
    let claimed = record.gpu_seconds_milli;
    let capacity = with_slack(lease.gpu_milli.saturating_mul(end_ms - start_ms) / 1000);
    if claimed > capacity {
        return Err(UsageViolation::OverCapacity { claimed, capacity });
    }
    let elapsed_ms = (lease.end_ms - lease.start_ms).max(0) + 2 * USAGE_SKEW_MS;
    let lease_capacity = with_slack(lease.gpu_milli.saturating_mul(elapsed_ms) / 1000);
    let total = lease.accepted_gpu_seconds_milli.saturating_add(claimed);
    if total > lease_capacity {
        return Err(UsageViolation::Overlapping {
            total,
            capacity: lease_capacity,
        });
    }
    if let Some(telemetry_permille) = telemetry_utilisation_permille
        && record.gpu_utilisation_permille >= USAGE_ACTIVE_PERMILLE
        && telemetry_permille < TELEMETRY_IDLE_PERMILLE
    {
        return Err(UsageViolation::ActiveWhileIdle {
            claimed_permille: record.gpu_utilisation_permille,
            telemetry_permille,
        });
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// § 8 An owner takes GPUs back

/// § 8: firm work (gold, silver) an owner stops by force (`fallow node reclaim --force`) pays
/// its tenant this many hours of the lease at its price, from the provider's earnings.
pub const RECLAIM_CREDIT_HOURS: u64 = 1;

// ---------------------------------------------------------------------------------------------
// § 5 Dropped jobs and missed windows

/// § 5: this many dropped leases from one node within [`DROP_WINDOW_MS`] prove dropped jobs.
pub const DROPS_TO_PROVE: usize = 2;
pub const DROP_WINDOW_MS: i64 = 7 * DAY_MS;
/// § 5: the rate of absences per advertised window hour an honest node may show …
pub const HONEST_ABSENCES_PER_HOUR: f64 = 1e-3;
/// § 5: … fraud is proven when an honest node would show as many or more with less than this chance …
pub const ABSENCE_TAIL_PROBABILITY: f64 = 1e-9;
/// § 5: … and there are at least this many absences …
pub const ABSENCES_MIN: u64 = 3;
/// § 5: … over this window.
pub const ABSENCE_WINDOW_MS: i64 = 7 * DAY_MS;

/// The chance that `trials` independent tries at rate `p` give `events` or more: the upper tail
/// of the binomial distribution, summed in log space (exact for any size this is used at).
pub fn binomial_upper_tail(events: u64, trials: u64, p: f64) -> f64 {
    if events == 0 {
        return 1.0;
    }
    if events > trials {
        return 0.0;
    }
    let (ln_p, ln_q) = (p.ln(), (1.0 - p).ln());
    // ln C(n, k) by ln-gamma through a running sum of logs (n stays modest: hours or leases in a week).
    let ln_choose = |n: u64, k: u64| -> f64 {
        let k = k.min(n - k);
        (0..k).map(|i| ((n - i) as f64).ln() - ((i + 1) as f64).ln()).sum()
    };
    let mut total = 0.0;
    for k in events..=trials {
        let term = (ln_choose(trials, k) + k as f64 * ln_p + (trials - k) as f64 * ln_q).exp();
        total += term;
        // Past the mode the terms only fall; stop once they no longer change the sum.
        if k as f64 > trials as f64 * p && term < total * 1e-17 {
            break;
        }
    }
    total.min(1.0)
}

/// § 5: whether `absences` over `window_hours` of advertised windows in the last 7 days are
/// beyond what an honest node could show by chance.
pub fn absences_beyond_chance(absences: u64, window_hours: u64) -> bool {
    absences >= ABSENCES_MIN
        && binomial_upper_tail(absences, window_hours.max(absences), HONEST_ABSENCES_PER_HOUR)
            < ABSENCE_TAIL_PROBABILITY
}

// ---------------------------------------------------------------------------------------------
// § 6 Bonds and slashing

/// Proven fraud, by the rule that proved it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fraud {
    /// § 3: two wrong answers in a row.
    WrongAnswers,
    /// § 3: two slow canaries in a row.
    FalseHardware,
    /// § 4: three violating usage records within a day.
    InflatedUsage,
    /// § 5: two dropped leases within a week.
    DroppedJobs,
    /// § 5: absences in advertised windows beyond chance.
    MissedWindows,
}

impl Fraud {
    pub const ALL: [Fraud; 5] = [
        Fraud::WrongAnswers,
        Fraud::FalseHardware,
        Fraud::InflatedUsage,
        Fraud::DroppedJobs,
        Fraud::MissedWindows,
    ];

    /// § 6's table: the share of the bond slashed, per mille.
    pub fn slash_permille(self) -> u32 {
        match self {
            Fraud::WrongAnswers => 1000,
            Fraud::FalseHardware => 500,
            Fraud::InflatedUsage => 250,
            Fraud::DroppedJobs | Fraud::MissedWindows => 100,
        }
    }

    /// The section of the policy document that proves it.
    pub fn section(self) -> &'static str {
        match self {
            Fraud::WrongAnswers | Fraud::FalseHardware => "§ 3",
            Fraud::InflatedUsage => "§ 4",
            Fraud::DroppedJobs | Fraud::MissedWindows => "§ 5",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Fraud::WrongAnswers => "wrong_answers",
            Fraud::FalseHardware => "false_hardware",
            Fraud::InflatedUsage => "inflated_usage",
            Fraud::DroppedJobs => "dropped_jobs",
            Fraud::MissedWindows => "missed_windows",
        }
    }
}

/// A node's evidence so far, fed event by event; says when fraud is proven (§ 3–5).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Evidence {
    /// The last canary findings, newest last (only as many as a proof needs).
    canaries: Vec<CanaryFinding>,
    /// When the node's recent usage violations happened.
    usage_violations_ms: Vec<i64>,
    /// When the node's recent dropped leases happened.
    drops_ms: Vec<i64>,
}

impl Evidence {
    /// § 3: adds a canary's finding; returns the fraud it proves, if any.
    pub fn canary(&mut self, finding: CanaryFinding) -> Option<Fraud> {
        self.canaries.push(finding);
        if self.canaries.len() > CANARY_FAILURES_TO_PROVE {
            self.canaries.remove(0);
        }
        let last = &self.canaries;
        if last.len() < CANARY_FAILURES_TO_PROVE || last.iter().any(|found| *found != finding) {
            return None;
        }
        match finding {
            CanaryFinding::Passed => None,
            CanaryFinding::WrongAnswer => Some(Fraud::WrongAnswers),
            CanaryFinding::Slow => Some(Fraud::FalseHardware),
        }
    }

    /// § 4: adds a violating usage record seen at `at_ms`; returns the fraud it proves, if any.
    pub fn usage_violation(&mut self, at_ms: i64) -> Option<Fraud> {
        self.usage_violations_ms
            .retain(|seen| at_ms - *seen < USAGE_PROOF_WINDOW_MS);
        self.usage_violations_ms.push(at_ms);
        (self.usage_violations_ms.len() >= USAGE_VIOLATIONS_TO_PROVE).then_some(Fraud::InflatedUsage)
    }

    /// § 5: adds a lease the node dropped at `at_ms`; returns the fraud it proves, if any.
    pub fn dropped_lease(&mut self, at_ms: i64) -> Option<Fraud> {
        self.drops_ms.retain(|seen| at_ms - *seen < DROP_WINDOW_MS);
        self.drops_ms.push(at_ms);
        (self.drops_ms.len() >= DROPS_TO_PROVE).then_some(Fraud::DroppedJobs)
    }

    /// After a proof and the slash that follows: the node starts over.
    pub fn clear(&mut self) {
        *self = Evidence::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000_000;

    #[test]
    fn a_new_node_starts_low_and_history_moves_it() {
        let fresh = Reputation::default();
        assert!((fresh.score() - 0.8).abs() < 1e-12);
        assert_eq!(fresh.evidence(), 0.0);
        let good: Vec<(Outcome, i64)> = (0..300)
            .map(|i| (Outcome::LeaseFinished, NOW - i * 3_600_000))
            .collect();
        let reputation = Reputation::from_outcomes(&good, NOW);
        assert!(reputation.score() > 0.97, "{}", reputation.score());
        assert!(reputation.lower_bound() < reputation.score());
        let mut faulty = reputation.clone();
        for _ in 0..20 {
            faulty.add(Outcome::NodeFault, NOW, NOW);
        }
        assert!(faulty.score() < reputation.score());
        assert_eq!(faulty.inputs[1], 20.0, "the inputs show the faults");
    }

    #[test]
    fn old_outcomes_weigh_less_by_the_half_life() {
        let mut reputation = Reputation::default();
        reputation.add(Outcome::NodeFault, NOW - HALF_LIFE_MS, NOW);
        assert!((reputation.inputs[1] - 0.5).abs() < 1e-12);
        reputation.add(Outcome::CanaryFailed, NOW - 2 * HALF_LIFE_MS, NOW);
        assert!((reputation.inputs[5] - 5.0 / 4.0).abs() < 1e-12);
        assert!((reputation.beta - (PRIOR_FAILURES + 0.5 + 1.25)).abs() < 1e-12);
    }

    #[test]
    fn inputs_give_the_same_posterior_as_outcomes() {
        let outcomes = [
            (Outcome::LeaseFinished, NOW - DAY_MS),
            (Outcome::CanaryPassed, NOW - 40 * DAY_MS),
            (Outcome::CanaryFailed, NOW),
            (Outcome::WindowHourMissed, NOW - HALF_LIFE_MS),
        ];
        let added = Reputation::from_outcomes(&outcomes, NOW);
        let rebuilt = Reputation::from_inputs(added.inputs);
        assert!((added.alpha - rebuilt.alpha).abs() < 1e-12 && (added.beta - rebuilt.beta).abs() < 1e-12);
        let mut half = Reputation::default();
        half.add_many(Outcome::WindowHourPresent, 0.5, NOW, NOW);
        assert!((half.inputs[Outcome::WindowHourPresent.slot()] - 0.5).abs() < 1e-12);
        for (slot, outcome) in Outcome::ALL.iter().enumerate() {
            assert_eq!(outcome.slot(), slot);
        }
    }

    #[test]
    fn outcome_names_round_trip() {
        for outcome in Outcome::ALL {
            assert_eq!(Outcome::parse(outcome.name()), Some(outcome));
        }
        assert_eq!(Outcome::parse("ok"), None);
    }

    fn history(days: i64, bond_micros: i64) -> History {
        History {
            first_registered_ms: NOW - days * DAY_MS,
            last_fraud_ms: None,
            bond_micros,
            gpus_offered: 8,
        }
    }

    #[test]
    fn badges_need_score_history_and_for_gold_a_bond_and_no_fraud() {
        let record = |n: i64| -> Reputation {
            let outcomes: Vec<(Outcome, i64)> = (0..n).map(|_| (Outcome::LeaseFinished, NOW)).collect();
            Reputation::from_outcomes(&outcomes, NOW)
        };
        let bond = GOLD_BOND_PER_GPU_MICROS * 8;
        assert_eq!(badge(&Reputation::default(), &history(100, bond), NOW), Badge::None);
        assert_eq!(
            badge(&record(20), &history(0, 0), NOW),
            Badge::None,
            "the prior still weighs"
        );
        assert_eq!(badge(&record(30), &history(0, 0), NOW), Badge::Bronze);
        assert_eq!(badge(&record(80), &history(10, 0), NOW), Badge::Silver);
        assert_eq!(
            badge(&record(80), &history(3, 0), NOW),
            Badge::Bronze,
            "too young for silver"
        );
        assert_eq!(badge(&record(400), &history(40, bond), NOW), Badge::Gold);
        assert_eq!(
            badge(&record(400), &history(40, bond - 1), NOW),
            Badge::Silver,
            "bond short"
        );
        let mut caught = history(40, bond);
        caught.last_fraud_ms = Some(NOW - 200 * DAY_MS);
        assert_eq!(badge(&record(400), &caught, NOW), Badge::Silver, "no gold after fraud");
        caught.last_fraud_ms = Some(NOW - DAY_MS);
        assert_eq!(badge(&record(400), &caught, NOW), Badge::Bronze);
    }

    #[test]
    fn the_next_badge_names_every_threshold_the_provider_misses() {
        let (next, missing) = next_badge(&Reputation::default(), &history(0, 0), NOW).unwrap();
        assert_eq!(next, Badge::Bronze);
        assert_eq!(
            missing,
            ["a lower bound of 0.85 (now 0.559)", "10 outcomes (now 0.0)"],
            "a new provider: its prior and no history"
        );
        let outcomes: Vec<(Outcome, i64)> = (0..400).map(|_| (Outcome::LeaseFinished, NOW)).collect();
        let strong = Reputation::from_outcomes(&outcomes, NOW);
        let (next, missing) = next_badge(&strong, &history(10, 100_000_000), NOW).unwrap();
        assert_eq!(next, Badge::Gold, "silver now");
        assert_eq!(
            missing,
            [
                "30 days since the first node registered (now 10)",
                "a bond of $400.00 (now $100.00)"
            ]
        );
        assert_eq!(
            next_badge(&strong, &history(40, GOLD_BOND_PER_GPU_MICROS * 8), NOW),
            None,
            "gold: none above"
        );
    }

    fn run(rate: u64, digest: &str, memory_allocated: bool) -> CanaryRun {
        CanaryRun {
            expected_digest: "abc".into(),
            returned_digest: digest.into(),
            rate,
            expected_rate: 1000,
            memory_allocated,
        }
    }

    #[test]
    fn canary_findings() {
        assert_eq!(run(950, "abc", true).finding(), CanaryFinding::Passed);
        assert_eq!(run(700, "abc", true).finding(), CanaryFinding::Passed, "throttled");
        assert_eq!(run(600, "abc", true).finding(), CanaryFinding::Passed, "at the line");
        assert_eq!(run(599, "abc", true).finding(), CanaryFinding::Slow);
        assert_eq!(run(1000, "abc", false).finding(), CanaryFinding::Slow, "memory short");
        assert_eq!(run(1000, "abd", true).finding(), CanaryFinding::WrongAnswer);
        // The matmul canary's line: an A100 (312 of an H100's 989.4 TFLOPS) is slow.
        assert_eq!(
            run(450, "abc", true).finding_at(MATMUL_SLOW_PERMILLE),
            CanaryFinding::Passed
        );
        assert_eq!(
            run(449, "abc", true).finding_at(MATMUL_SLOW_PERMILLE),
            CanaryFinding::Slow
        );
        assert_eq!(
            run(315, "abc", true).finding_at(MATMUL_SLOW_PERMILLE),
            CanaryFinding::Slow
        );
    }

    #[test]
    fn two_failed_canaries_of_a_kind_in_a_row_prove_fraud() {
        let mut evidence = Evidence::default();
        assert_eq!(evidence.canary(CanaryFinding::Slow), None);
        assert_eq!(
            evidence.canary(CanaryFinding::Passed),
            None,
            "a pass between breaks the row"
        );
        assert_eq!(evidence.canary(CanaryFinding::Slow), None);
        assert_eq!(evidence.canary(CanaryFinding::Slow), Some(Fraud::FalseHardware));
        evidence.clear();
        assert_eq!(evidence.canary(CanaryFinding::WrongAnswer), None);
        assert_eq!(evidence.canary(CanaryFinding::Slow), None, "two kinds are no row");
        assert_eq!(evidence.canary(CanaryFinding::Slow), Some(Fraud::FalseHardware));
        evidence.clear();
        evidence.canary(CanaryFinding::WrongAnswer);
        assert_eq!(evidence.canary(CanaryFinding::WrongAnswer), Some(Fraud::WrongAnswers));
    }

    #[test]
    fn canaries_come_first_within_the_hour_at_once_after_a_failure_and_at_random_after() {
        let history = |latest, changed| CanaryHistory {
            registered_ms: NOW - 10 * DAY_MS,
            fingerprint_changed_ms: changed,
            latest,
        };
        let fresh = CanaryHistory {
            latest: None,
            ..history(None, None)
        };
        assert_eq!(
            canary_due(&fresh, NOW, CANARY_WITHIN_MS),
            CanaryDue::By(NOW - 10 * DAY_MS + CANARY_WITHIN_MS)
        );
        let open = history(Some((NOW - 1, None, CanaryState::Open)), None);
        assert_eq!(canary_due(&open, NOW, CANARY_WITHIN_MS), CanaryDue::No);
        let failed = history(
            Some((NOW - 10, Some(NOW - 5), CanaryState::Answered(CanaryFinding::Slow))),
            None,
        );
        assert_eq!(canary_due(&failed, NOW, CANARY_WITHIN_MS), CanaryDue::Now);
        let passed = history(
            Some((NOW - 10, Some(NOW - 5), CanaryState::Answered(CanaryFinding::Passed))),
            None,
        );
        assert_eq!(
            canary_due(&passed, NOW, CANARY_WITHIN_MS),
            CanaryDue::Every(CANARY_MEAN_INTERVAL_MS)
        );
        let changed = history(
            Some((NOW - 10, Some(NOW - 5), CanaryState::Answered(CanaryFinding::Passed))),
            Some(NOW - 2),
        );
        assert_eq!(
            canary_due(&changed, NOW, CANARY_WITHIN_MS),
            CanaryDue::By(NOW - 2 + CANARY_WITHIN_MS)
        );
        let unanswered = history(Some((NOW - 10, Some(NOW - 5), CanaryState::Unanswered)), None);
        assert_eq!(
            canary_due(&unanswered, NOW, CANARY_WITHIN_MS),
            CanaryDue::By(NOW - 5 + CANARY_WITHIN_MS)
        );
        // The chance of an order by a deadline rises to one at the deadline.
        assert_eq!(CanaryDue::By(NOW + 1000).chance_within(NOW, 1000), 1.0);
        assert!((CanaryDue::By(NOW + 4000).chance_within(NOW, 1000) - 0.25).abs() < 1e-12);
        let daily = CanaryDue::Every(DAY_MS).chance_within(NOW, 60_000);
        assert!((daily - 60_000.0 / DAY_MS as f64).abs() < 1e-6, "{daily}");
    }

    #[test]
    fn gold_work_needs_the_badge_and_a_passed_canary_on_current_hardware() {
        let canaries = |last, unanswered, changed| NodeCanaries {
            last_answered: last,
            unanswered_since: unanswered,
            fingerprint_changed_ms: changed,
        };
        let passed = Some((CanaryFinding::Passed, NOW));
        assert!(gold_eligible(Badge::Gold, &canaries(passed, 0, None), false));
        assert!(!gold_eligible(Badge::Silver, &canaries(passed, 0, None), false));
        assert!(
            !gold_eligible(Badge::Gold, &canaries(None, 0, None), false),
            "never verified"
        );
        assert!(!gold_eligible(
            Badge::Gold,
            &canaries(Some((CanaryFinding::Slow, NOW)), 0, None),
            false
        ));
        assert!(
            !gold_eligible(Badge::Gold, &canaries(passed, 3, None), false),
            "three unanswered"
        );
        assert!(gold_eligible(Badge::Gold, &canaries(passed, 2, None), false));
        assert!(
            !gold_eligible(Badge::Gold, &canaries(passed, 0, Some(NOW + 1)), false),
            "new hardware"
        );
        assert!(
            !gold_eligible(Badge::Gold, &canaries(passed, 0, None), true),
            "cordoned"
        );
    }

    #[test]
    fn three_usage_violations_within_a_day_prove_inflation() {
        let mut evidence = Evidence::default();
        assert_eq!(evidence.usage_violation(NOW), None);
        assert_eq!(
            evidence.usage_violation(NOW + DAY_MS),
            None,
            "the first fell out of the day"
        );
        assert_eq!(evidence.usage_violation(NOW + DAY_MS + 1), None);
        assert_eq!(evidence.usage_violation(NOW + DAY_MS + 2), Some(Fraud::InflatedUsage));
    }

    fn record(start_ms: i64, end_ms: i64, gpu_seconds_milli: i64, utilisation: i64) -> UsageRecord {
        UsageRecord {
            lease_id: 1,
            epoch: 1,
            sequence: 1,
            period_start_ms: start_ms,
            period_end_ms: end_ms,
            gpu_seconds_milli,
            gpu_utilisation_permille: utilisation,
            telemetry_digest: String::new(),
        }
    }

    #[test]
    fn usage_cross_checks() {
        // Two GPUs from NOW for an hour; a minute's record of two GPUs is 120,000 milli-GPU-s.
        let lease = LeaseTerms {
            gpu_milli: 2000,
            start_ms: NOW,
            end_ms: NOW + 3_600_000,
            accepted_gpu_seconds_milli: 0,
        };
        let minute = |from: i64| (NOW + from, NOW + from + 60_000);
        let (start, end) = minute(0);
        assert_eq!(
            check_usage(&record(start, end, 120_000, 900), &lease, Some(850)),
            Ok(())
        );
        assert_eq!(
            check_usage(&record(start, end, 121_000, 900), &lease, None),
            Ok(()),
            "1 % slack"
        );
        assert!(matches!(
            check_usage(&record(start, end, 122_000, 900), &lease, None),
            Err(UsageViolation::OverCapacity { .. })
        ));
        let (late_start, late_end) = minute(3_600_000);
        assert!(matches!(
            check_usage(&record(late_start, late_end, 1_000, 900), &lease, None),
            Err(UsageViolation::OutsideLease { .. })
        ));
        assert!(matches!(
            check_usage(&record(end, start, 1_000, 900), &lease, None),
            Err(UsageViolation::BadPeriod { .. })
        ));
        let full = LeaseTerms {
            accepted_gpu_seconds_milli: 2000 * 3_600,
            ..lease
        };
        assert!(matches!(
            check_usage(&record(start, end, 120_000, 900), &full, None),
            Err(UsageViolation::Overlapping { .. })
        ));
        assert!(matches!(
            check_usage(&record(start, end, 120_000, 900), &lease, Some(5)),
            Err(UsageViolation::ActiveWhileIdle { .. })
        ));
        // A job that leaves its GPUs idle and says so is not flagged.
        assert_eq!(check_usage(&record(start, end, 120_000, 10), &lease, Some(5)), Ok(()));
    }

    #[test]
    fn the_binomial_tail_matches_small_cases() {
        // P(X ≥ 1) for n = 3, p = 0.5 is 7/8; P(X ≥ 3) = 1/8.
        assert!((binomial_upper_tail(1, 3, 0.5) - 0.875).abs() < 1e-12);
        assert!((binomial_upper_tail(3, 3, 0.5) - 0.125).abs() < 1e-12);
        assert_eq!(binomial_upper_tail(0, 10, 0.1), 1.0);
        assert_eq!(binomial_upper_tail(11, 10, 0.1), 0.0);
        let tail = binomial_upper_tail(10, 1000, 0.02);
        assert!(tail > 0.99, "far below the mean of 20: {tail}");
    }

    #[test]
    fn absences_beyond_chance_need_a_rate_no_honest_node_shows() {
        // A week of an always-open node (168 hours): one or two failures are honest.
        assert!(!absences_beyond_chance(2, 168));
        // Three or four in a week: rare for an honest node, but not 1e-9.
        assert!(!absences_beyond_chance(4, 168));
        // Three a day for two days.
        assert!(absences_beyond_chance(6, 48));
        // Never proven under the minimum count, however few the hours.
        assert!(!absences_beyond_chance(2, 2));
    }

    #[test]
    fn two_drops_within_a_week_prove_dropped_jobs() {
        let mut evidence = Evidence::default();
        assert_eq!(evidence.dropped_lease(NOW), None);
        assert_eq!(evidence.dropped_lease(NOW + DROP_WINDOW_MS), None, "the first fell out");
        assert_eq!(
            evidence.dropped_lease(NOW + DROP_WINDOW_MS + 1),
            Some(Fraud::DroppedJobs)
        );
    }

    #[test]
    fn slash_shares_follow_the_table() {
        let shares: Vec<u32> = Fraud::ALL.iter().map(|fraud| fraud.slash_permille()).collect();
        assert_eq!(shares, [1000, 500, 250, 100, 100]);
        assert!(Fraud::ALL.iter().all(|fraud| fraud.section().starts_with('§')));
    }

    #[test]
    fn the_policy_document_states_the_constants() {
        let document = include_str!("../../../docs/trust-policy.md");
        for stated in [
            "Beta(8, 2)",
            "halves every 30 days",
            "**60 %**",
            "90 % of the claimed model's memory",
            "**two wrong answers in a row**",
            "Within the hour after a node registers",
            "**three in a row unanswered**",
            "**1 %**",
            "**5 s**",
            "**30 s**",
            "at least **three**",
            "**10 %** or more",
            "under **2 %**",
            "**Three violating records from one node within\n  24 hours**",
            "**two drops from one node\n  within 7 days**",
            "**one\n  absence per 1,000 window hours**",
            "**10⁻⁹**",
            "at least **3**",
            "| wrong answers (section 3) | 100 % |",
            "| false hardware (section 3) | 50 % |",
            "| inflated usage (section 4) | 25 % |",
            "| dropped jobs or missed windows beyond chance (section 5) | 10 % |",
            "| gold | 0.97 | 200 | 30 |",
            "| silver | 0.93 | 50 | 7 |",
            "| bronze | 0.85 | 10 | 0 |",
            "$50 per GPU",
            "last 180 days",
        ] {
            assert!(
                document.contains(stated),
                "the policy document no longer says {stated:?}"
            );
        }
    }
}
