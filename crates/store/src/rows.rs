//! The records the store reads and writes: plain data, no SQL types. Times are microseconds
//! since the Unix epoch; money is micro-dollars.

use crate::{LeaseState, StoreError};

macro_rules! text_enum {
    ($(#[$doc:meta])* $name:ident { $($variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum $name { $($variant),+ }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }

            pub fn parse(text: &str) -> Option<$name> {
                match text { $($text => Some($name::$variant),)+ _ => None }
            }

            pub(crate) fn decode(text: &str) -> Result<$name, StoreError> {
                $name::parse(text).ok_or_else(|| StoreError::Corrupt(format!(concat!(stringify!($name), " {:?}"), text)))
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

text_enum!(
    /// Who an account is, and so what its keys may do.
    Role { Tenant = "tenant", Provider = "provider", Admin = "admin" }
);

text_enum!(
    /// A job's life: queued until placed, running while it holds leases, then one end state.
    JobState {
        Queued = "queued",
        Running = "running",
        Finished = "finished",
        Failed = "failed",
        Cancelled = "cancelled",
    }
);

impl JobState {
    pub fn is_final(self) -> bool {
        matches!(self, JobState::Finished | JobState::Failed | JobState::Cancelled)
    }
}

/// Reads a stored lease state: `StoreError::Corrupt` for a name `LeaseState::parse` does not know.
pub(crate) fn decode_lease_state(text: &str) -> Result<LeaseState, StoreError> {
    LeaseState::parse(text).ok_or_else(|| StoreError::Corrupt(format!("LeaseState {text:?}")))
}

#[derive(Clone, Debug, PartialEq)]
pub struct AccountRecord {
    pub id: i64,
    pub role: Role,
    pub name: String,
    pub created_at: i64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ApiKeyRecord {
    pub key_id: String,
    pub account_id: i64,
    pub secret_hash: String,
    pub label: String,
    pub created_at: i64,
    pub revoked_at: Option<i64>,
}

/// What a provider registers; the store gives it an id.
#[derive(Clone, Debug, PartialEq)]
pub struct NewNode {
    pub provider_id: i64,
    pub name: String,
    pub public_key: String,
    pub fingerprint: String,
    pub region: String,
    pub site: String,
    pub fabric: String,
    pub nvlink_domain: String,
    pub latitude: f64,
    pub longitude: f64,
    pub gpu_model: String,
    pub gpu_count: i64,
    pub cpu_milli: i64,
    pub memory_mib: i64,
    pub network_mbit_s: i64,
    pub simulated: bool,
    /// The provider's policy as JSON (the `api` crate's wire form).
    pub policy: String,
    /// Content hashes of the datasets the node holds, as a JSON array.
    pub datasets: String,
    /// The runtimes its agent runs replicas in, comma-separated ("container,process").
    pub runtimes: String,
    /// Where gang peers reach its replicas, and the ports its agent hands out ("29500-29999").
    pub advertise_addr: String,
    pub gang_ports: String,
    /// Where its NVLink domain came from, and what NVML reported (see `api::NodeRegistration`).
    pub nvlink_source: String,
    pub nvlink_detected: String,
    /// Where its latitude and longitude came from: "flag" (declared at registration), "site"
    /// (the coordinator's sites table), empty (none: 0, 0).
    pub location_source: String,
}

#[derive(Clone, Debug, PartialEq)]
pub struct NodeRecord {
    pub id: i64,
    pub node: NewNode,
    pub fingerprint_changed_at: Option<i64>,
    pub registered_at: i64,
    pub updated_at: i64,
    pub last_heartbeat_at: Option<i64>,
    pub online: bool,
    pub telemetry: Option<String>,
    /// Since when the node has been over its owner's thermal or power limits, if it is.
    pub over_limit_since: Option<i64>,
    /// Cordoned for proven fraud since then, until a canary passes on its current hardware.
    pub fraud_cordoned_at: Option<i64>,
    /// The GPUs its owner reclaimed (bit i: GPU i; 0: none), until `reclaim_until` (`None`:
    /// until resumed). They take no new work; see `Store::set_node_reclaim`.
    pub reclaim_gpu_mask: i64,
    pub reclaim_until: Option<i64>,
}

/// One heartbeat to record: batched, many per transaction.
#[derive(Clone, Debug, PartialEq)]
pub struct Heartbeat {
    pub node_id: i64,
    pub at: i64,
    pub telemetry: String,
    /// The datasets the node now holds (JSON array), when the agent reported them.
    pub datasets: Option<String>,
    /// The node says it is within its owner's limits: a flag the store has set is cleared.
    pub within_limits: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct NewJob {
    pub tenant_id: i64,
    /// The tenant's idempotency token: a resubmission with the same token returns the first job.
    pub client_token: Option<String>,
    /// The job's spec as JSON (the `api` crate's wire form).
    pub spec: String,
    pub tier: String,
    pub submitted_at: i64,
    /// The reservation the job runs inside, if any.
    pub reservation_id: Option<i64>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct JobRecord {
    pub id: i64,
    pub tenant_id: i64,
    pub client_token: Option<String>,
    pub spec: String,
    pub tier: String,
    pub state: JobState,
    pub state_reason: String,
    pub submitted_at: i64,
    pub updated_at: i64,
    /// Grows at each placement and gang repair: a new rendezvous of the gang's replicas.
    pub gang_epoch: i64,
    /// When the gang's current start barrier began (its last placement or repair).
    pub gang_since: Option<i64>,
    /// Store ids of the nodes the job is not placed on (a replica could not start there), sorted.
    pub avoid_nodes: Vec<i64>,
    /// How often the gang started again, whole, after a replica failed.
    pub gang_restarts: i64,
    /// When every replica of the gang's current epoch was staged (its start barrier met); None
    /// while it assembles.
    pub gang_assembled_at: Option<i64>,
}

/// A lease the matcher decided; the store gives it an id and epoch 1.
#[derive(Clone, Debug, PartialEq)]
pub struct NewLease {
    pub replica: i64,
    pub node_id: i64,
    pub gpu_mask: i64,
    pub gpu_milli: i64,
    pub cpu_milli: i64,
    pub memory_mib: i64,
    pub price_micros: i64,
    pub tier: String,
    pub gpu_model: String,
    pub region: String,
    pub expected_end: i64,
    pub preempt_at: Option<i64>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct LeaseRecord {
    pub id: i64,
    pub job_id: i64,
    pub lease: NewLease,
    pub epoch: i64,
    pub state: LeaseState,
    pub created_at: i64,
    pub ended_at: Option<i64>,
    pub end_reason: String,
    /// The job whose placement (or gang repair) preempted this lease: set, with `preempt_at`,
    /// in the transaction that placed that job. The matcher no longer counts such a lease.
    pub preempted_by: Option<i64>,
}

impl LeaseRecord {
    /// Whether the lease is in a preemption's grace period at `now` (`grace_s` long): its
    /// replica has been told to stop (SIGTERM) and ends at its `preempt_at`.
    pub fn in_preemption_grace(&self, grace_s: u32, now: i64) -> bool {
        self.lease
            .preempt_at
            .is_some_and(|at| now >= at - i64::from(grace_s) * 1_000_000)
    }
}

/// A live lease a placement preempts: it stops at `preempt_at` (its grace period's end).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Victim {
    pub lease_id: i64,
    pub preempt_at: i64,
}

/// What a report of a lease's state did (`Store::move_lease`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseMove {
    /// The lease moved to the state reported.
    Moved,
    /// The lease is live at that epoch and already there or past it (a repeated report, or a
    /// replica started again after a fence): nothing changed.
    Already,
    /// The lease is not live at that epoch.
    NotLive,
}

/// A GPU booked beyond its whole by live leases (`Store::overbooked_gpus`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Overbooking {
    pub node_id: i64,
    pub gpu: u8,
    /// The leases that together pass the GPU's thousand thousandths, and what they hold.
    pub leases: Vec<i64>,
    pub milli: i64,
}

/// A piece of a replica's output, at a byte offset of its log.
#[derive(Clone, Debug, PartialEq)]
pub struct LogChunk {
    /// Assigned by the store (0 before).
    pub id: i64,
    pub lease_id: i64,
    pub epoch: i64,
    pub byte_offset: i64,
    pub text: String,
    pub at: i64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct LeaseEvent {
    pub id: i64,
    pub lease_id: i64,
    pub epoch: i64,
    pub kind: String,
    pub detail: String,
    pub at: i64,
}

/// A signed usage record as received, with what it was charged.
#[derive(Clone, Debug, PartialEq)]
pub struct UsageRow {
    pub lease_id: i64,
    pub sequence: i64,
    pub node_id: i64,
    pub gpu_seconds_milli: i64,
    pub charged_micros: i64,
    pub body: String,
    pub signature: String,
    pub received_at: i64,
}

/// A dataset a node is asked to stage ahead (`fallow dataset warm`), until `expires_at`.
#[derive(Clone, Debug, PartialEq)]
pub struct WarmupRow {
    pub node_id: i64,
    pub digest: String,
    pub url: String,
    pub size_bytes: i64,
    pub tenant_id: i64,
    pub requested_at: i64,
    pub expires_at: i64,
}

/// A replica's output archive: its digest and size, and its bytes where the coordinator keeps
/// them (`None`: it went to the job's `output_url`).
#[derive(Clone, Debug, PartialEq)]
pub struct JobOutputRow {
    pub lease_id: i64,
    pub epoch: i64,
    pub job_id: i64,
    pub replica: i64,
    pub digest: String,
    pub size_bytes: i64,
    pub archive: Option<Vec<u8>>,
    pub received_at: i64,
}

/// A replica's output archive as a job's view lists it: without its bytes, whether the
/// coordinator keeps them.
#[derive(Clone, Debug, PartialEq)]
pub struct JobOutputInfo {
    pub lease_id: i64,
    pub replica: i64,
    pub digest: String,
    pub size_bytes: i64,
    pub kept: bool,
    /// When the coordinator removed its bytes after its retention.
    pub expired_at: Option<i64>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct AttestationRow {
    pub lease_id: i64,
    pub epoch: i64,
    pub node_id: i64,
    pub body: String,
    pub signature: String,
    pub received_at: i64,
}

/// One balanced ledger transaction, as the `ledger` crate built and checked it.
#[derive(Clone, Debug, PartialEq)]
pub struct LedgerTransactionRow {
    pub key: String,
    pub kind: String,
    pub memo: String,
    pub at: i64,
    /// (account key, amount in micro-dollars); the amounts sum to zero.
    pub entries: Vec<(String, i64)>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct EvidenceRow {
    pub id: i64,
    pub node_id: Option<i64>,
    pub kind: String,
    pub detail: String,
    pub at: i64,
}

/// One lease's clearing price, for the market index.
#[derive(Clone, Debug, PartialEq)]
pub struct PricePoint {
    pub at: i64,
    pub gpu_model: String,
    pub region: String,
    pub tier: String,
    pub price_micros: i64,
    /// Thousandths of a GPU the lease holds.
    pub gpu_milli_total: i64,
}

/// How many jobs are in one state (`Store::job_counts`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JobCount {
    pub state: JobState,
    pub jobs: i64,
}

/// The live leases, all together (`Store::live_lease_totals`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveLeaseTotals {
    pub leases: i64,
    /// Thousandths of a GPU the live leases hold, summed over their GPUs.
    pub gpu_milli: i64,
}

/// What a matcher view of the fleet was built from (`Store::nodes_version`): a view is stale
/// when either part moved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodesVersion {
    /// The highest `updated_at` of any node: moves with a registration, a policy, a fingerprint
    /// or the datasets held, not with a node going on or off line.
    pub updated_at: i64,
    /// The highest node id: nodes are never deleted, so it stands for their count.
    pub highest_id: i64,
}

/// A node's over-limit state changed (`Store::over_limit_changes_since`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OverLimitChange {
    pub node_id: i64,
    /// Since when the node is over its owner's limits; `None` when it is back within them.
    pub over_limit_since: Option<i64>,
    pub changed_at: i64,
}

/// A node went on or off line (`Store::online_changes_since`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OnlineChange {
    pub node_id: i64,
    pub online: bool,
    pub changed_at: i64,
}

/// A ledger account's balance (`Store::balances`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccountBalance {
    /// The account's key ("tenant:1:available").
    pub account: String,
    /// Micro-dollars.
    pub balance: i64,
}

/// The ledger's sums, both zero in a sound ledger (`Store::ledger_totals`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LedgerTotals {
    /// The sum of every account's balance.
    pub balances: i64,
    /// The sum of every entry's amount.
    pub entries: i64,
}

/// One entry of a ledger transaction on one account (`Store::ledger_entries_of`,
/// `Store::tenant_entries_between`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LedgerEntry {
    /// The key (idempotency key) of the transaction the entry belongs to.
    pub tx_key: String,
    /// The transaction's kind ("deposit", "usage", "refund"…).
    pub kind: String,
    /// The key of the account the entry moves.
    pub account: String,
    /// Micro-dollars: positive into the account, negative out of it.
    pub amount: i64,
    pub at: i64,
}

/// A lease's progress as its replica last reported it (`Store::lease_progress`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseProgress {
    pub lease_id: i64,
    /// What the replica counts ("tokens", "steps"…).
    pub unit: String,
    /// How many of `unit` it has done.
    pub done: i64,
}

/// One reputation outcome of a node (`Store::outcomes`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeOutcome {
    /// The outcome's name ("lease_ok", "node_fault", "canary_passed"…).
    pub outcome: String,
    /// Its weight in thousandths (1000 for one whole outcome).
    pub weight_milli: i64,
    pub at: i64,
}

/// One recorded reputation outcome, with its id and node (`Store::outcomes_since`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReputationEvent {
    /// Its id: a replica applies each event once.
    pub id: i64,
    pub node_id: i64,
    /// The outcome's name ("lease_ok", "node_fault", "canary_passed"…).
    pub outcome: String,
    /// Its weight in thousandths (1000 for one whole outcome).
    pub weight_milli: i64,
    pub at: i64,
}

/// A lease that ended (`Store::leases_ended_since`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EndedLease {
    pub lease_id: i64,
    pub ended_at: i64,
}

/// What one job's usage records were charged and metered (`Store::usage_totals_of_jobs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JobUsage {
    pub job_id: i64,
    /// Micro-dollars charged, summed over the job's usage records.
    pub charged_micros: i64,
    /// GPU time metered, in thousandths of a GPU-second, summed over them.
    pub gpu_seconds_milli: i64,
}

/// One usage record of a tenant's, as charged (`Store::usage_of_tenant_since`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UsageCharge {
    /// When the coordinator received the record.
    pub received_at: i64,
    pub job_id: i64,
    /// Micro-dollars charged for it.
    pub charged_micros: i64,
    /// GPU time it metered, in thousandths of a GPU-second.
    pub gpu_seconds_milli: i64,
}

/// How many jobs of one tier wait for placement (`Store::queued_per_tier`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TierCount {
    pub tier: String,
    pub jobs: i64,
}

/// How long a job waited to run (`Store::run_waits_since`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunWait {
    pub tier: String,
    pub submitted_at: i64,
    /// When a replica of the job first ran, if one did.
    pub first_run_at: Option<i64>,
}

/// A canary given up as unanswered (`Store::give_up_overdue_canaries`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OverdueCanary {
    pub canary_id: i64,
    pub node_id: i64,
}

/// A node's canaries that decide whether it may take gold work (`Store::canary_standings`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CanaryStanding {
    pub node_id: i64,
    /// The finding of its latest answered canary (passed, wrong_answer or slow), if any.
    pub finding: Option<String>,
    /// When that canary finished.
    pub finished_at: Option<i64>,
    /// How many canaries went unanswered after it.
    pub unanswered: i64,
}

/// When fraud was last proven against a provider (`Store::last_frauds_of_providers`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProviderFraud {
    pub provider_id: i64,
    /// When the latest fraud decision against it was made.
    pub decided_at: i64,
}

/// What one tenant was charged for usage on a node (`Store::charges_on_node_since`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TenantCharge {
    pub tenant_id: i64,
    /// Micro-dollars.
    pub charged_micros: i64,
}
