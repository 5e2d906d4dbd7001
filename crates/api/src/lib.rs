//! Fallow's wire types: the JSON bodies of the coordinator's HTTP API, with their OpenAPI
//! schemas, and their checked conversion into the domain model. Requests refuse unknown fields,
//! and every limit is a named constant, so bad input gets a precise 400 before it reaches the
//! matcher or the store.
//!
//! Money on the wire: requests give dollars as decimal strings ("2.10", exact, no floats);
//! responses give integer micro-dollars in fields ending `_micros`.

pub mod backoff;
mod convert;
mod filter;
mod policy;
mod reservation;
mod service;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

pub use convert::*;
pub use filter::*;
pub use policy::*;
pub use reservation::*;
pub use service::*;

/// The largest request body the coordinator reads.
pub const REQUEST_BODY_BYTES_MAX: usize = 256 * 1024;
/// Replicas of one job.
pub const REPLICAS_MAX: u32 = 4096;
/// Arguments and environment entries of a job, and their lengths.
pub const COMMAND_ARGS_MAX: usize = 256;
pub const ENV_ENTRIES_MAX: usize = 256;
pub const TEXT_FIELD_BYTES_MAX: usize = 4096;
pub const DATASETS_MAX: usize = 64;
pub const REGIONS_MAX: usize = 32;
/// The longest a job may ask to run: 30 days.
pub const RUNTIME_S_MAX: u32 = 30 * 24 * 3600;
/// The highest price a job may offer, per GPU-hour: $1,000.
pub const PRICE_MICROS_MAX: i64 = 1_000 * 1_000_000;
/// Jobs per page in listings.
pub const PAGE_SIZE_MAX: i64 = 500;
/// The most memory a job's replica or a node may have, MiB (2^40: a pebibyte).
pub const MEMORY_MIB_MAX: u64 = 1 << 40;
/// The most offers one search answers (`GET /v1/offers?limit=`).
pub const OFFERS_PAGE_MAX: i64 = 1000;
/// The largest output archive the coordinator keeps for a replica (`GET /v1/jobs/{id}/output`);
/// a larger one needs an `output_url`.
pub const OUTPUT_ARCHIVE_BYTES_MAX: usize = 16 * 1024 * 1024;
/// The largest body of an output upload: the archive in base64, and the rest of the JSON.
pub const OUTPUT_UPLOAD_BODY_BYTES_MAX: usize = OUTPUT_ARCHIVE_BYTES_MAX / 3 * 4 + 64 * 1024;
/// In an `output_url`, replaced by the replica's number (0, 1, …).
pub const OUTPUT_URL_REPLICA: &str = "{replica}";

/// Where replica `replica` of a job puts its output archive: the job's `output_url` with
/// `{replica}` replaced; without `{replica}`, replica 0 alone uses it (the others', like a job's
/// without a URL, are kept by the coordinator). `None`: the coordinator keeps it.
pub fn output_url_of(output_url: Option<&str>, replica: i64) -> Option<String> {
    let url = output_url?;
    if url.contains(OUTPUT_URL_REPLICA) {
        Some(url.replace(OUTPUT_URL_REPLICA, &replica.to_string()))
    } else {
        (replica == 0).then(|| url.to_string())
    }
}

/// Every error the API returns: `{"error": {"code": "...", "message": "..."}}`.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct ErrorDetail {
    /// A stable machine-readable code: `bad_request`, `unauthorized`, `payment_required`,
    /// `forbidden`, `not_found`, `method_not_allowed`, `conflict`, `payload_too_large`,
    /// `unsupported_media_type`, `rate_limited`, `unavailable`, `internal`.
    pub code: String,
    /// What is wrong, in words a user can act on.
    pub message: String,
}

/// A tenant's job as submitted.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct JobRequest {
    /// A name for people; need not be unique.
    #[serde(default)]
    pub name: String,
    /// Container image (for the Docker executor) or program path (for the process executor).
    pub image: String,
    #[serde(default)]
    pub command: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Whole GPUs per replica. Give one of `gpus`, `gpu_share_milli` or `compute_units`, or none
    /// for a CPU-only job.
    #[serde(default)]
    pub gpus: Option<u8>,
    /// A share of one GPU, in thousandths (1–999).
    #[serde(default)]
    pub gpu_share_milli: Option<u16>,
    /// Compute units per replica (1.0 = one H100 SXM), as a decimal string, e.g. "2.5".
    #[serde(default)]
    pub compute_units: Option<String>,
    /// GPU models allowed (catalog names, e.g. "H100-SXM5"); empty = any.
    #[serde(default)]
    pub gpu_models: Vec<String>,
    #[serde(default)]
    pub gpu_memory_mib_min: u32,
    #[serde(default)]
    pub cpu_milli: u32,
    #[serde(default)]
    pub memory_mib: u64,
    #[serde(default = "one")]
    pub replicas: u32,
    /// Where all replicas must be: node, nvlink, fabric, site, region or any.
    #[serde(default = "any")]
    pub topology: String,
    /// gold, silver or bronze.
    pub tier: String,
    /// training, inference, batch or eval.
    #[serde(default = "batch")]
    pub class: String,
    /// The most the tenant pays per GPU-hour, in dollars ("2.50").
    pub max_price_per_gpu_hour: String,
    /// May be preempted (bronze always may).
    #[serde(default)]
    pub preemptible: bool,
    /// Regions allowed; empty = any.
    #[serde(default)]
    pub regions: Vec<String>,
    #[serde(default)]
    pub datasets: Vec<DatasetRequest>,
    #[serde(default)]
    pub client: Option<ClientRequest>,
    /// Lowest node reliability accepted, 0–1.
    #[serde(default)]
    pub min_reliability: f64,
    #[serde(default = "hour")]
    pub max_runtime_s: u32,
    #[serde(default)]
    pub checkpoint_interval_s: u32,
    /// A directory kept across preemptions and restarts of the job.
    #[serde(default)]
    pub checkpoint_dir: Option<String>,
    /// "none" (default) or "bridge".
    #[serde(default = "network_none")]
    pub network: String,
    /// An idempotency token: submitting again with the same token returns the first job.
    #[serde(default)]
    pub client_token: Option<String>,
    /// "container" (`image` is a container image) or "process" (bare metal: `image` is the
    /// program, `command` its arguments); absent: whatever the node runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
    /// What a gang's surviving replicas do when a lost one is replaced: "restart" (default:
    /// stopped and started again with the new peers, resuming from the job's checkpoint) or
    /// "keep" (left running, for frameworks that re-rendezvous themselves, e.g. torchrun's
    /// elastic agent: the new peers are written to `FALLOW_RENDEZVOUS_FILE`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gang_repair: Option<String>,
    /// How many times a gang starts again, whole and in place, after one of its replicas fails
    /// once it has started (a peer lost mid-step fails the others' collectives); absent: 3.
    /// The next failure fails the job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_restarts: Option<u32>,
    /// Whether the survivors of a repair are billed while the gang waits for its replacement:
    /// "bill" (default: a kept survivor runs on, and what runs is billed) or "pause" (the
    /// survivors' usage from the repair until every replica of the new epoch is staged is not
    /// billed). Restarted survivors run nothing while they wait, so are billed nothing anyway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repair_billing: Option<String>,
    /// A replica that serves requests through the gateway (`/s/{name}/…`), reached through its
    /// node's tunnel; absent: a batch replica no one calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serve: Option<ServeSpec>,
    /// An http(s) URL to which the agent PUTs the replica's `$FALLOW_OUTPUT_DIR` as a tar
    /// archive when it ends (a presigned object-store URL, say); `{replica}` in it is replaced
    /// by the replica's number, and without it only replica 0 uses it. A replica without a URL
    /// has its archive kept by the coordinator, up to 16 MiB (`GET /v1/jobs/{id}/output`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_url: Option<String>,
    /// The reservation to run inside (`POST /v1/reservations`): placed only on its nodes, within
    /// the GPUs it holds, while it lasts, and paid for by the booking rather than by usage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation: Option<i64>,
}

/// How a serving replica is reached: the gateway sends `/s/{name}/PATH` to `PATH` on the
/// replica's port, once its health check answers.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct ServeSpec {
    /// The service's name in the gateway's path: letters, digits and `-`, 1–63 characters. The
    /// tenant's replicas that give the same name serve it together.
    pub name: String,
    /// The port the replica listens on. A process replica is given a free port of its node in
    /// `PORT` instead and must listen there (as Cloud Run and Heroku do); so is a container,
    /// which runs on its host's network.
    #[serde(default)]
    pub port: u16,
    /// The HTTP path answered 2xx when the replica is ready (default `/`).
    #[serde(default)]
    pub health_path: String,
    /// The version of its service's spec it runs (set by a deployed service; 0 otherwise).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub version: u32,
}

fn is_zero(value: &u32) -> bool {
    *value == 0
}

fn is_zero_i64(value: &i64) -> bool {
    *value == 0
}

/// A gang's restarts after a replica failed, unless the job says otherwise (`max_restarts`).
pub const GANG_RESTARTS_DEFAULT: u32 = 3;

fn one() -> u32 {
    1
}
fn any() -> String {
    "any".to_string()
}
fn batch() -> String {
    "batch".to_string()
}
fn hour() -> u32 {
    3600
}
fn network_none() -> String {
    "none".to_string()
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DatasetRequest {
    pub url: String,
    /// "blake3:<64 hex>" or "sha256:<64 hex>"; the agent verifies it before the job starts.
    pub digest: String,
    pub size_bytes: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ClientRequest {
    pub latitude: f64,
    pub longitude: f64,
    pub latency_target_ms: u32,
}

/// A job as the coordinator knows it.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct JobView {
    pub id: i64,
    pub tenant_id: i64,
    pub state: String,
    pub state_reason: String,
    pub tier: String,
    pub submitted_at_us: i64,
    pub updated_at_us: i64,
    pub spec: JobRequest,
    pub leases: Vec<LeaseView>,
    /// What the job has been billed so far.
    pub cost_micros: i64,
    /// Money held in escrow for it now.
    pub escrow_micros: i64,
    /// For a queued job: why no node can take it now, per constraint, in words and numbers.
    #[serde(default)]
    pub explanation: Option<String>,
    /// What the job reports it has done, and its cost per million units so far.
    #[serde(default)]
    pub progress: Option<ProgressView>,
    /// The job's exit code once it has ended: 0 when it finished; when it failed, the code of
    /// the replica that failed first (absent when none exited with one: a node lost, a
    /// replica stopped). What `fallow job submit --wait` exits with.
    #[serde(default)]
    pub exit_code: Option<i64>,
    /// Where it was placed last: "own" (the tenant's own nodes, at no market price), "market"
    /// (other providers' nodes, at the auction's price) or "reservation" (inside a booking ahead,
    /// paid by it); absent before its first lease.
    #[serde(default)]
    pub capacity: Option<String>,
}

/// A job's progress as its replicas report it (lines `COUNT UNIT` appended to the file named
/// by `FALLOW_PROGRESS_FILE`), summed over its leases.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct ProgressView {
    /// e.g. "tokens", "samples".
    pub unit: String,
    pub done: i64,
    /// The job's cost so far per million units done, in micro-dollars (rounded down; 0 before
    /// anything is done), e.g. the price of a million tokens.
    pub cost_micros_per_million_units: i64,
}

/// An agent's report of what a replica has done so far.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ProgressRequest {
    pub epoch: i64,
    pub unit: String,
    pub done: i64,
}

/// One replica of a job bound to GPUs of one node.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct LeaseView {
    pub id: i64,
    pub job_id: i64,
    pub replica: i64,
    pub node_id: i64,
    /// Indices of the node's GPUs the lease holds.
    pub gpu_indices: Vec<u8>,
    /// Thousandths of each of those GPUs.
    pub gpu_milli: i64,
    pub cpu_milli: i64,
    pub memory_mib: i64,
    /// Fencing token: an agent acts only on a lease's newest epoch.
    pub epoch: i64,
    pub state: String,
    pub price_micros_per_gpu_hour: i64,
    pub gpu_model: String,
    pub region: String,
    pub created_at_us: i64,
    pub expected_end_us: i64,
    pub preempt_at_us: Option<i64>,
    pub ended_at_us: Option<i64>,
    pub end_reason: String,
    /// The replica's exit code, when it ended by exiting (finished or failed) and said so.
    #[serde(default)]
    pub exit_code: Option<i64>,
    /// The archive of what the replica left in `$FALLOW_OUTPUT_DIR`, as its node attested it;
    /// absent when it left nothing there, or has not ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<OutputView>,
}

/// A replica's output archive (a tar of `$FALLOW_OUTPUT_DIR`).
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct OutputView {
    /// "blake3:<64 hex>" of the archive.
    pub digest: String,
    pub size_bytes: i64,
    /// True when the coordinator keeps it (`GET /v1/jobs/{id}/output?replica=N`); false when it
    /// went to the job's `output_url` or its retention is over.
    pub kept: bool,
    /// When the coordinator removed a kept archive at the end of its retention (µs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expired_at_us: Option<i64>,
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct JobList {
    pub jobs: Vec<JobView>,
    /// Pass as `before` for the next page; absent on the last page.
    pub next_before: Option<i64>,
}

/// What a job would clear at now.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct QuoteView {
    pub price_micros_per_gpu_hour: Option<i64>,
    pub nodes_feasible: u64,
    /// Of the nodes that fit, those that already hold every dataset the job names (it starts
    /// there without fetching them); absent when the job names none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes_with_data: Option<u64>,
    pub gpus_feasible: u64,
    pub nodes_total: u64,
    /// Why nodes were excluded, in words.
    pub explanation: String,
    /// For a tenant with nodes of its own (`POST /v1/own-providers`): how many of them could
    /// take the job now, whatever their asks; a job that fits there runs there at no price.
    /// Absent for a tenant with none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub own_nodes_feasible: Option<u64>,
}

/// One node's offer in a search.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct OfferView {
    pub node_id: i64,
    pub provider_id: i64,
    pub gpu_model: String,
    pub gpu_count: u8,
    pub gpus_free: u8,
    pub gpu_memory_mib: u32,
    pub compute_units: f64,
    pub region: String,
    pub site: String,
    pub reliability: f64,
    pub price_micros_per_gpu_hour: BTreeMap<String, i64>,
    pub online: bool,
    pub simulated: bool,
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct OfferList {
    pub offers: Vec<OfferView>,
    pub total_matching: u64,
    /// When nothing matches: how many nodes each clause excluded (the first it failed), e.g.
    /// "0 of 1 nodes: 1 excluded by `region in [eu-west,eu-north]` (nodes are in us-east)".
    #[serde(default)]
    pub explanation: Option<String>,
}

/// A site's coordinates, as an admin sets them once (`PUT /v1/sites/{name}`): every node that
/// names the site and declares no coordinates of its own takes them.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SiteRequest {
    pub latitude: f64,
    pub longitude: f64,
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct SiteView {
    pub name: String,
    pub latitude: f64,
    pub longitude: f64,
    pub updated_at_us: i64,
    /// Nodes at the site that take its coordinates (they declared none).
    pub nodes: u64,
}

/// A node as its provider registers it.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NodeRegistration {
    pub name: String,
    /// The agent's ed25519 public key, 64 hex characters.
    pub public_key: String,
    /// Hardware fingerprint: digest of GPU UUIDs, PCI ids, VBIOS and driver.
    pub fingerprint: String,
    pub gpu_model: String,
    pub gpu_count: u8,
    pub cpu_milli: u32,
    pub memory_mib: u64,
    #[serde(default = "network_default")]
    pub network_mbit_s: u32,
    pub region: String,
    pub site: String,
    #[serde(default)]
    pub fabric: String,
    #[serde(default)]
    pub nvlink_domain: String,
    /// The node's coordinates; (0, 0), the default, declares none: the node takes its site's
    /// from the coordinator's sites table once an admin sets them.
    #[serde(default)]
    pub latitude: f64,
    #[serde(default)]
    pub longitude: f64,
    /// Simulated devices (no real GPU): shown as such everywhere and never billed as real.
    #[serde(default)]
    pub simulated: bool,
    pub policy: PolicyDoc,
    /// The runtimes the agent runs replicas in: "container", "process"; empty: both.
    #[serde(default)]
    pub runtimes: Vec<String>,
    /// The canary kinds the agent can run besides hash: "matmul" when it loaded CUDA and
    /// cuBLAS and saw its GPUs (docs/trust-policy.md § 3); empty: the hash canary only.
    #[serde(default)]
    pub canary_kinds: Vec<String>,
    /// The address a gang's other replicas reach this node's replicas at (a host name or IP);
    /// empty: the address the coordinator saw the registration come from.
    #[serde(default)]
    pub advertise_addr: String,
    /// The ports the agent may hand to replicas for gang traffic ("29500-29999").
    #[serde(default)]
    pub gang_ports: String,
    /// Where `nvlink_domain` came from: "flag", "nvml-fabric", "nvswitch" or "node" (none given
    /// or detected: the node alone).
    #[serde(default)]
    pub nvlink_source: String,
    /// What NVML reported, whatever was declared: `nvl-<cluster uuid>-<clique>` for a
    /// multi-node NVLink fabric, `node-local` for NVSwitch boards, empty when NVML said nothing.
    /// A declared domain that disagrees with it is refused.
    #[serde(default)]
    pub nvlink_detected: String,
}

/// The most nodes one `POST /v1/nodes/batch` registers.
pub const NODE_BATCH_MAX: usize = 1_000;
/// The largest body of a `POST /v1/nodes/batch` (other requests: [`REQUEST_BODY_BYTES_MAX`]).
pub const NODE_BATCH_BODY_BYTES_MAX: usize = 2 * 1024 * 1024;

/// Nodes registered in one request, all or none (a fleet's operator registering racks).
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NodeBatchRegistration {
    /// 1 to [`NODE_BATCH_MAX`] nodes, each as `POST /v1/nodes` takes it.
    pub nodes: Vec<NodeRegistration>,
}

/// The nodes a batch registered, in the order given.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct NodeBatchView {
    pub nodes: Vec<NodeView>,
}

fn network_default() -> u32 {
    10_000
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct NodeView {
    pub id: i64,
    pub provider_id: i64,
    pub name: String,
    pub public_key: String,
    pub fingerprint: String,
    pub fingerprint_changed_at_us: Option<i64>,
    pub gpu_model: String,
    pub gpu_count: i64,
    pub cpu_milli: i64,
    pub memory_mib: i64,
    pub region: String,
    pub site: String,
    pub fabric: String,
    pub nvlink_domain: String,
    /// Where the NVLink domain came from ("flag", "nvml-fabric", "nvswitch", "node") and what
    /// NVML reported (empty: nothing).
    #[serde(default)]
    pub nvlink_source: String,
    #[serde(default)]
    pub nvlink_detected: String,
    /// The address gang peers reach the node's replicas at, and the ports its agent hands out.
    #[serde(default)]
    pub advertise_addr: String,
    #[serde(default)]
    pub gang_ports: String,
    pub latitude: f64,
    pub longitude: f64,
    /// Where the coordinates came from: "flag" (declared at registration), "site" (the
    /// coordinator's sites table: `PUT /v1/sites/{name}`), empty (none).
    #[serde(default)]
    pub location_source: String,
    pub simulated: bool,
    /// The runtimes its agent runs replicas in.
    pub runtimes: Vec<String>,
    pub online: bool,
    pub last_heartbeat_at_us: Option<i64>,
    pub reliability: f64,
    pub policy: PolicyDoc,
    pub telemetry: Option<serde_json::Value>,
    /// Since when the node has been over its owner's thermal or power limits: it takes no new
    /// work, and its bronze work is preempted if that lasts.
    pub over_limit_since_us: Option<i64>,
    /// The GPUs its owner reclaimed (`fallow node reclaim`, `fallow agent pause`), and until
    /// when (none: until resumed).
    #[serde(default)]
    pub reclaimed_gpus: Vec<u8>,
    #[serde(default)]
    pub reclaimed_until_us: Option<i64>,
    pub live_leases: i64,
    pub earnings_micros: i64,
    /// The trust policy's reputation (docs/trust-policy.md § 1) with its inputs; in a single
    /// node's view only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reputation: Option<ReputationView>,
}

/// A node's reputation by the trust policy (docs/trust-policy.md § 1): a Beta posterior over its
/// outcomes, each weighing half as much every 30 days, from a prior of Beta(8, 2).
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq, Default)]
pub struct ReputationView {
    /// The posterior mean.
    pub score: f64,
    /// The mean less two standard deviations: what badges use.
    pub lower_bound: f64,
    /// The decayed weight of all outcomes, the prior left out.
    pub evidence: f64,
    /// The decayed weight per kind of outcome (`lease_finished`, `node_fault`, …).
    pub inputs: BTreeMap<String, f64>,
}

/// A signed heartbeat from an agent.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct HeartbeatRequest {
    #[serde(default)]
    pub gpus: Vec<GpuTelemetry>,
    /// The hardware fingerprint now; a change is flagged.
    #[serde(default)]
    pub fingerprint: Option<String>,
    /// Content digests of the datasets in the node's cache.
    #[serde(default)]
    pub datasets: Option<Vec<String>>,
    /// Over the provider's thermal or power limit: take no new work.
    #[serde(default)]
    pub over_limit: bool,
    /// The leases the node runs or is about to run (the coordinator's lease set as it follows
    /// it), and those it is stopping or has yet to report the end of. A running lease missing
    /// from several heartbeats in a row, with no attestation, was dropped
    /// (docs/trust-policy.md § 5). `None` from agents that do not say.
    #[serde(default)]
    pub leases: Option<Vec<i64>>,
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct GpuTelemetry {
    pub index: u8,
    #[serde(default)]
    pub temperature_c: f64,
    #[serde(default)]
    pub power_w: f64,
    #[serde(default)]
    pub utilisation_pct: f64,
    #[serde(default)]
    pub memory_used_mib: u64,
}

/// What the coordinator answers a heartbeat: the leases the node should be running (newest
/// epochs); anything else it runs must stop.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct HeartbeatResponse {
    pub leases: Vec<AgentLease>,
    pub heartbeat_interval_ms: u64,
    /// A node silent this long loses its leases: an agent cut off from the coordinator stops
    /// its replicas well before, so that a lease moved elsewhere never runs twice at once.
    #[serde(default)]
    pub heartbeat_timeout_ms: u64,
    /// Canaries the node should run (docs/trust-policy.md § 3), at low priority on the GPUs
    /// named, answered with `POST /v1/agent/canaries`.
    #[serde(default)]
    pub canaries: Vec<CanaryOrder>,
    /// Gateways running as their own processes (`fallow gateway`): the agent keeps a tunnel to
    /// each, besides the one to the coordinator's own gateway.
    #[serde(default)]
    pub gateways: Vec<String>,
    /// The node's thermal and power limits as its policy says now: a change made with
    /// `fallow node policy set` reaches the running agent with its next heartbeat (none: an
    /// older coordinator, the agent keeps its own).
    #[serde(default)]
    pub limits: Option<NodeLimits>,
    /// Datasets to stage ahead into the node's cache (`fallow dataset warm`): fetched and
    /// verified in the background, then named in the next heartbeats' `datasets`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prefetch: Vec<DatasetRequest>,
}

/// The most nodes one warm-up stages a dataset on.
pub const WARM_NODES_MAX: u32 = 64;
/// How long nodes are asked to stage a dataset before the warm-up lapses.
pub const WARM_FOR_S: i64 = 24 * 3600;

/// `POST /v1/datasets/warm`: stage a dataset ahead on the nodes a job of this shape would most
/// likely get, so that it starts there without fetching it.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WarmRequest {
    pub dataset: DatasetRequest,
    /// The job's shape, as `POST /v1/jobs/quote` takes it (its own `datasets`, checked, are
    /// replaced by `dataset`).
    pub job: JobRequest,
    /// How many of the likeliest nodes (1–64).
    pub nodes: u32,
}

/// What a warm-up asked.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct WarmView {
    pub digest: String,
    /// The likeliest nodes for the job, best first: those asked to stage the dataset and those
    /// that hold it already.
    pub nodes: Vec<i64>,
    /// Of those, the ones that already hold it.
    pub holding: u64,
    /// Until when the others are asked to (they fetch it in the background).
    pub until_us: i64,
    /// Why fewer nodes than asked fit the job now; empty when enough did.
    pub explanation: String,
}

/// A node's thermal and power limits (`PolicyDoc::thermal_limit_c`, `power_limit_w`): over
/// either, it takes no new work and its bronze work is preempted if that lasts.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct NodeLimits {
    pub thermal_limit_c: Option<u16>,
    pub power_limit_w: Option<u32>,
}

/// A canary's kind (docs/trust-policy.md § 3).
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum CanaryKind {
    /// Hash chains whose answer the coordinator recomputes (`trust::canary`).
    #[default]
    Hash,
    /// A seeded bf16 matrix product on each GPU, committed by a Merkle root and proven row by
    /// row against a challenge drawn after the result (`trust::matmul`).
    Matmul,
}

impl CanaryKind {
    /// Its stored and wire name.
    pub fn name(self) -> &'static str {
        match self {
            CanaryKind::Hash => "hash",
            CanaryKind::Matmul => "matmul",
        }
    }

    pub fn parse(text: &str) -> Option<CanaryKind> {
        [CanaryKind::Hash, CanaryKind::Matmul]
            .into_iter()
            .find(|kind| kind.name() == text)
    }
}

/// The largest body of a `POST /v1/agent/canaries/{id}/proof` (16 rows of a 4096² product per
/// GPU, up to 16 GPUs, as JSON numbers).
pub const CANARY_PROOF_BODY_BYTES_MAX: usize = 8 * 1024 * 1024;

/// A known-answer benchmark the coordinator orders on a node (docs/trust-policy.md § 3).
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct CanaryOrder {
    pub id: i64,
    /// hash (the default, for coordinators that do not say) or matmul.
    #[serde(default)]
    pub kind: CanaryKind,
    pub seed: String,
    /// Work units per GPU (`trust::canary`); for a matmul canary, the product's size n.
    pub units: u64,
    /// The GPU indexes to run on (idle when ordered).
    pub gpus: Vec<u8>,
    /// Memory to allocate on each GPU: 90 % of the claimed model's.
    pub memory_mib: u64,
    /// Answer by then (ms since the Unix epoch).
    pub deadline_ms: i64,
}

/// A canary's result, signed by the node's key over its body (`trust::canary::CanaryResult`).
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SignedCanaryResult {
    pub body: CanaryResultBody,
    pub signature_hex: String,
}

/// What the coordinator found in a canary's result.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct CanaryAccepted {
    /// passed, wrong_answer or slow; `challenged` for a matmul canary's result, whose finding
    /// comes with its proof.
    pub finding: String,
    /// The fraud this result proved (docs/trust-policy.md § 3), if it did.
    #[serde(default)]
    pub fraud: Option<String>,
    /// A matmul canary's challenge: the rows of each GPU's product to reveal, with their Merkle
    /// paths, in `POST /v1/agent/canaries/{id}/proof`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub challenge: Option<CanaryChallenge>,
    /// Why a matmul canary's finding is what it is, in words (a hash canary's is in its view).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The rows a matmul canary's challenge asks for, per GPU.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct CanaryChallenge {
    pub gpus: Vec<CanaryChallengeRows>,
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct CanaryChallengeRows {
    pub gpu: u8,
    /// Row indexes of the GPU's product, ascending; the proof gives them in this order.
    pub rows: Vec<u32>,
}

/// A matmul canary's proof: the rows its challenge asked for, per GPU in the order's GPU order.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct CanaryProof {
    pub gpus: Vec<CanaryGpuOpenings>,
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct CanaryGpuOpenings {
    pub gpu: u8,
    pub rows: Vec<CanaryRowOpening>,
}

/// One row of a GPU's product, with its Merkle path (sibling hashes from the leaf up, hex).
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct CanaryRowOpening {
    pub index: u32,
    pub row: Vec<i32>,
    pub path: Vec<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct CanaryResultBody {
    pub canary_id: i64,
    pub seed: String,
    pub units: i64,
    /// The hash canary's answer; a matmul canary's Merkle roots, one per GPU, comma-separated.
    pub digest: String,
    pub elapsed_ms: i64,
    /// Thousandths of a unit per second per GPU (a matmul canary: of a TFLOPS, the slowest
    /// GPU's); 0 when none was measured.
    pub rate_milli: i64,
    pub memory_allocated: bool,
    /// `simulated:MODEL`, `cuda:DEVICE NAME`, or `cpu` when no GPU kernel ran.
    pub measured_on: String,
}

/// One canary and what the coordinator found.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct CanaryView {
    pub id: i64,
    pub node_id: i64,
    /// hash or matmul.
    pub kind: String,
    pub units: i64,
    pub gpus: Vec<u8>,
    /// The model the node claims, whose rate the run is held to.
    pub claimed_model: String,
    pub created_at_us: i64,
    pub delivered_at_us: Option<i64>,
    pub finished_at_us: Option<i64>,
    /// passed, wrong_answer, slow or unanswered; none while it runs.
    pub finding: Option<String>,
    /// Why, in words (a matmul canary's failed check names the row).
    pub reason: Option<String>,
    /// The rate used (the lower of the node's and the coordinator's clock), thousandths of a
    /// unit per second per GPU, and the rate the claimed model gives.
    pub rate_milli: Option<i64>,
    pub expected_rate_milli: i64,
    /// The signed result as received, for anyone to re-check.
    pub result: Option<serde_json::Value>,
    pub signature_hex: Option<String>,
}

/// A provider's bond, paid in from its earnings (`POST /v1/provider/bond`) or by an admin for
/// it (`POST /v1/admin/bonds`).
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct BondRequest {
    /// Dollars, e.g. "100.00".
    pub amount: String,
    /// Idempotency key: the same key posts once.
    pub key: String,
    /// Only for `POST /v1/admin/bonds`: the provider's account id.
    #[serde(default)]
    pub provider_id: Option<i64>,
}

/// A refund paid out of a slashed bond.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct RefundView {
    pub tenant_id: i64,
    /// What the tenant paid for leases on the node over the evidence's period.
    pub owed_micros: i64,
    pub paid_micros: i64,
}

/// A decision that fraud is proven (docs/trust-policy.md § 6), with the evidence it rests on.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct FraudView {
    pub id: i64,
    pub node_id: i64,
    pub provider_id: i64,
    /// wrong_answers, false_hardware, inflated_usage, dropped_jobs or missed_windows.
    pub kind: String,
    /// The policy section applied.
    pub section: String,
    pub share_permille: i64,
    pub bond_before_micros: i64,
    pub slashed_micros: i64,
    pub refunds: Vec<RefundView>,
    pub to_platform_micros: i64,
    /// The signed records and canary results the decision rests on.
    pub evidence: serde_json::Value,
    pub decided_at_us: i64,
}

/// A node's standing under the trust policy.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct NodeTrustView {
    pub node_id: i64,
    pub name: String,
    pub reputation: ReputationView,
    /// Cordoned for proven fraud since then, until a canary passes on its current hardware.
    pub fraud_cordoned_at_us: Option<i64>,
    /// Whether gold work may go to it: its provider has the gold badge and its last canary did
    /// not fail.
    pub gold_eligible: bool,
    pub last_canary: Option<CanaryView>,
}

/// A provider's standing: bond, badge, reputation over all its nodes, and fraud decided.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct TrustView {
    pub provider_id: i64,
    pub bond_micros: i64,
    /// none, bronze, silver or gold (docs/trust-policy.md § 2).
    pub badge: String,
    /// The badge above it (none above gold), and each of its thresholds the provider misses, in
    /// words ("10 outcomes (now 3.0)"); none missing: it shows at the coordinator's next look.
    #[serde(default)]
    pub next_badge: Option<String>,
    #[serde(default)]
    pub next_badge_needs: Vec<String>,
    pub reputation: ReputationView,
    pub gpus_offered: u32,
    /// The gold badge's bond: $50 per GPU offered.
    pub gold_bond_needed_micros: i64,
    pub first_registered_at_us: Option<i64>,
    pub last_fraud_at_us: Option<i64>,
    pub nodes: Vec<NodeTrustView>,
    pub frauds: Vec<FraudView>,
}

/// A lease as the agent receives it: everything needed to run the replica.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct AgentLease {
    pub lease: LeaseView,
    pub job: JobRequest,
    /// A gang's rendezvous, once every replica's lease is picked up and staged (the start
    /// barrier); absent for a gang still assembling (its replicas wait) and for one-replica jobs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gang: Option<GangView>,
}

/// Where a replica stands in its gang, and how it reaches the others (torchrun's contract:
/// rank 0 is the replica on the node holding the most of the gang's GPUs, ties on node id).
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq, Eq, Default)]
pub struct GangView {
    /// Grows at each placement and repair of the gang: a new set of peers.
    pub epoch: i64,
    pub rank: u32,
    pub world_size: u32,
    pub local_rank: u32,
    pub local_world_size: u32,
    pub node_rank: u32,
    pub master_addr: String,
    pub master_port: u16,
    /// Every replica's `host:port`, in rank order.
    pub peers: Vec<String>,
}

/// The leases a node should run, as a long poll answers them: `version` changes whenever the
/// set does (ids, epochs, states, preemption times), so an agent can ask for changes only.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct LeaseSet {
    pub version: String,
    pub leases: Vec<AgentLease>,
}

/// An agent's report of a lease's progress.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LeaseEventRequest {
    pub epoch: i64,
    /// staging, running, finished or failed.
    pub state: String,
    #[serde(default)]
    pub exit_code: Option<i64>,
    #[serde(default)]
    pub detail: String,
    /// With `staged` (a gang replica ready to start: datasets staged, image present): the port
    /// its agent reserved for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
}

/// An owner takes GPUs of a node back (`POST /v1/nodes/{id}/reclaim`, or from the node's host,
/// signed with its key: `POST /v1/agent/reclaim`). The GPUs taken take no new work for `for_s`
/// (none: until resumed); bronze work on them stops after the grace period, firm work (gold,
/// silver) runs on to its end unless `force`, which stops it too and pays its tenant the credit
/// of docs/trust-policy.md § 8 from the provider's earnings.
#[derive(Clone, Debug, Default, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ReclaimRequest {
    /// How many GPUs (none: all of them). Idle GPUs are taken first, then those running bronze
    /// work, then those running firm work.
    #[serde(default)]
    pub gpus: Option<u32>,
    /// For how long, in seconds (none: until `resume`).
    #[serde(default)]
    pub for_s: Option<u64>,
    /// Stop firm work on the GPUs too.
    #[serde(default)]
    pub force: bool,
}

/// What a registered node's agent says of it on start (`PUT /v1/agent/node`, signed): its
/// registration as it would send it now. Its name, region, site, fabric, NVLink domain,
/// coordinates, gang address and ports and runtimes replace the coordinator's; its GPUs, key and
/// fingerprint do not (the fingerprint moves with heartbeats, judged by the trust policy).
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NodeRestatement {
    pub registration: NodeRegistration,
    /// Whether the registration's asks and limits were set for this start (a flag, the
    /// environment, a config file) and replace the coordinator's; otherwise the policy set with
    /// `fallow node policy set` stands.
    #[serde(default)]
    pub policy_given: bool,
}

/// The longest reclaim with an end: a year (longer, or for good, is a reclaim without one).
pub const RECLAIM_FOR_S_MAX: u64 = 366 * 24 * 3600;

/// A node's reclaim: the GPUs its owner holds, until when, and what happens to the work on them.
#[derive(Clone, Debug, Default, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct ReclaimView {
    pub node_id: i64,
    /// The GPUs reclaimed (empty: none, the node sells all of them).
    pub gpus: Vec<u8>,
    /// When they go back on sale (none: when the owner resumes the node).
    pub until_us: Option<i64>,
    /// Work on those GPUs that stops: bronze, and firm work when forced.
    pub stopping: Vec<ReclaimedLease>,
    /// Firm work on those GPUs that runs on to its end; the GPUs are the owner's after it.
    pub running_on: Vec<ReclaimedLease>,
}

/// A lease on reclaimed GPUs.
#[derive(Clone, Debug, Default, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct ReclaimedLease {
    pub lease_id: i64,
    pub job_id: i64,
    pub tier: String,
    pub gpus: Vec<u8>,
    /// When its replica is stopped (SIGTERM now, the kill at this time), if it stops.
    pub stop_at_us: Option<i64>,
    pub expected_end_us: i64,
    /// What its tenant is paid for firm work stopped by force, from the provider's earnings.
    pub credit_micros: i64,
}

/// A node's new public key, in a request signed by its current key.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct KeyRotation {
    /// The new ed25519 public key, 64 hex characters.
    pub public_key: String,
}

/// The most characters one chunk of a replica's output may carry.
pub const LOG_CHUNK_CHARS_MAX: usize = 64 * 1024;

/// A piece of a replica's output, sent by its agent: `text` is what the replica wrote from
/// `byte_offset` of its log on (sending the same chunk again stores nothing more).
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LogChunkRequest {
    pub epoch: i64,
    pub byte_offset: i64,
    pub text: String,
}

/// An agent's upload of a replica's output archive, for the coordinator to keep
/// (`POST /v1/agent/leases/{id}/output`).
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OutputUpload {
    pub epoch: i64,
    /// The tar archive, base64 (standard alphabet, padded); at most 16 MiB decoded.
    pub archive_base64: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct LogChunkAccepted {
    /// False when this chunk was stored before, or the lease's log is full.
    pub stored: bool,
}

/// A job's output, oldest first; ask again with `after=next_after` for more.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct JobLogs {
    pub job_id: i64,
    pub chunks: Vec<LogChunkView>,
    pub next_after: i64,
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct LogChunkView {
    pub id: i64,
    pub lease_id: i64,
    pub replica: i64,
    pub byte_offset: i64,
    pub text: String,
    pub at_us: i64,
}

/// A usage record for one interval, signed by the node's key over its body.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SignedUsage {
    pub body: UsageBody,
    pub signature_hex: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct UsageBody {
    pub lease_id: i64,
    pub epoch: i64,
    pub sequence: i64,
    pub period_start_ms: i64,
    pub period_end_ms: i64,
    /// Thousandths of a GPU × seconds (1000 = one GPU for one second).
    pub gpu_seconds_milli: i64,
    pub gpu_utilisation_permille: i64,
    pub telemetry_digest: String,
}

/// A completion attestation, signed by the node's key over its body.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SignedAttestation {
    pub body: AttestationBody,
    pub signature_hex: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AttestationBody {
    pub lease_id: i64,
    pub epoch: i64,
    pub image_digest: String,
    pub start_ms: i64,
    pub end_ms: i64,
    pub exit_code: i64,
    pub gpu_seconds_milli: i64,
    pub telemetry_digest: String,
    pub log_digest: String,
    /// "blake3:<64 hex>" of the replica's output archive, where it left one (absent: none).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub output_digest: String,
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub output_bytes: i64,
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct UsageAccepted {
    /// False when this (lease, sequence) was already recorded: nothing was charged again.
    pub new: bool,
    pub charged_micros: i64,
}

/// Admin: a new account and its first API key (shown once).
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NewAccountRequest {
    /// tenant, provider or admin.
    pub role: String,
    pub name: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct AccountView {
    pub id: i64,
    pub role: String,
    pub name: String,
    pub created_at_us: i64,
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct NewAccountResponse {
    pub account: AccountView,
    pub api_key: NewKeyResponse,
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct NewKeyRequest {
    #[serde(default)]
    pub label: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct NewKeyResponse {
    pub key_id: String,
    /// The key itself: shown once, stored only hashed.
    pub api_key: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct KeyView {
    pub key_id: String,
    pub account_id: i64,
    pub label: String,
    pub created_at_us: i64,
    pub revoked_at_us: Option<i64>,
}

/// Admin: credit a tenant's balance (the stand-in for a payment provider).
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CreditRequest {
    pub account_id: i64,
    /// Dollars, e.g. "100.00".
    pub amount: String,
    /// Idempotency key: the same key credits once.
    pub key: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct BalanceView {
    pub account_id: i64,
    pub available_micros: i64,
    pub escrow_micros: i64,
    pub earnings_micros: i64,
    pub bond_micros: i64,
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct LedgerLine {
    pub transaction: String,
    pub kind: String,
    pub amount_micros: i64,
    pub at_us: i64,
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct StatementView {
    pub account_id: i64,
    pub lines: Vec<LedgerLine>,
}

/// A tenant's invoice for one calendar month (UTC): the usage charged per job, and the month's
/// credits, refunds and payments. Built from the ledger, so it agrees with the statement.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct InvoiceView {
    pub account_id: i64,
    /// The month, `YYYY-MM`.
    pub period: String,
    /// The month's first microsecond, and the next month's.
    pub from_us: i64,
    pub to_us: i64,
    /// One line per job with usage charged in the month, by job id.
    pub lines: Vec<InvoiceLine>,
    pub usage_micros: i64,
    pub sla_credits_micros: i64,
    pub refunds_micros: i64,
    /// Usage less SLA credits and refunds.
    pub total_micros: i64,
    /// Money paid in during the month (credits by an admin).
    pub payments_micros: i64,
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct InvoiceLine {
    pub job_id: i64,
    pub job_name: String,
    /// Usage records charged in the month.
    pub usage_records: i64,
    pub charged_micros: i64,
}

/// Per node: what its provider sees.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct EarningsView {
    pub provider_id: i64,
    pub earnings_micros: i64,
    pub nodes: Vec<NodeEarnings>,
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct NodeEarnings {
    pub node_id: i64,
    pub name: String,
    pub earned_micros: i64,
    pub gpu_hours_sold: f64,
    /// Share of the node's GPU time sold since it registered, 0–1.
    pub fill_rate: f64,
    pub reliability: f64,
}

/// The market index: recent clearing prices and utilisation per GPU model, region and tier.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct MarketView {
    pub prices: Vec<PriceBucket>,
    pub utilisation: Vec<UtilisationRow>,
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct PriceBucket {
    pub bucket_start_us: i64,
    pub gpu_model: String,
    pub region: String,
    pub tier: String,
    pub leases: u64,
    pub median_price_micros_per_gpu_hour: i64,
    pub min_price_micros_per_gpu_hour: i64,
    pub max_price_micros_per_gpu_hour: i64,
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct UtilisationRow {
    pub gpu_model: String,
    pub region: String,
    pub gpus_online: u64,
    pub gpu_milli_used: u64,
    pub utilisation: f64,
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct EvidenceView {
    pub id: i64,
    pub node_id: Option<i64>,
    pub kind: String,
    pub detail: String,
    pub at_us: i64,
}
