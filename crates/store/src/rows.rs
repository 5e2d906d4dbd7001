//! The records the store reads and writes: plain data, no SQL types. Times are microseconds
//! since the Unix epoch; money is micro-dollars.

use crate::StoreError;

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

text_enum!(
    /// A lease's life. `Pending` until the agent picks it up; the last five are ends.
    LeaseState {
        Pending = "pending",
        Staging = "staging",
        Running = "running",
        Finished = "finished",
        Failed = "failed",
        Preempted = "preempted",
        Lost = "lost",
        Cancelled = "cancelled",
    }
);

impl LeaseState {
    pub const LIVE: [LeaseState; 3] = [LeaseState::Pending, LeaseState::Staging, LeaseState::Running];

    pub fn is_live(self) -> bool {
        LeaseState::LIVE.contains(&self)
    }
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
