//! The OpenAPI document at `/v1/openapi.json` and a small API explorer page served from the
//! binary (no CDN, works offline). Schemas come from the wire types' derives; the paths are one
//! table here, next to the router, so the two are read together.

use axum::Json;
use axum::response::Html;
use serde_json::{Value, json};
use utoipa::OpenApi;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Fallow coordinator API",
        description = "A market and scheduler for idle GPU time."
    ),
    components(schemas(
        api::ErrorBody,
        api::ErrorDetail,
        api::JobRequest,
        api::DatasetRequest,
        api::ClientRequest,
        api::JobView,
        api::LeaseView,
        api::JobList,
        api::QuoteView,
        api::OfferView,
        api::OfferList,
        api::NodeRegistration,
        api::NodeBatchRegistration,
        api::NodeBatchView,
        api::NodeView,
        api::ReputationView,
        api::PolicyDoc,
        api::PriceRuleDoc,
        api::WindowDoc,
        api::HeartbeatRequest,
        api::GpuTelemetry,
        api::HeartbeatResponse,
        api::AgentLease,
        api::LeaseEventRequest,
        api::SignedUsage,
        api::UsageBody,
        api::SignedAttestation,
        api::AttestationBody,
        api::UsageAccepted,
        api::NewAccountRequest,
        api::AccountView,
        api::NewAccountResponse,
        api::NewKeyRequest,
        api::NewKeyResponse,
        api::KeyView,
        api::CreditRequest,
        api::BalanceView,
        api::LedgerLine,
        api::StatementView,
        api::InvoiceView,
        api::LogChunkRequest,
        api::KeyRotation,
        api::ReclaimRequest,
        api::NodeRestatement,
        api::ReclaimView,
        api::ReclaimedLease,
        api::ProgressRequest,
        api::ProgressView,
        api::LogChunkAccepted,
        api::JobLogs,
        api::LogChunkView,
        api::InvoiceLine,
        api::EarningsView,
        api::NodeEarnings,
        api::MarketView,
        api::PriceBucket,
        api::UtilisationRow,
        api::EvidenceView,
        api::CanaryOrder,
        api::SignedCanaryResult,
        api::CanaryResultBody,
        api::CanaryAccepted,
        api::CanaryKind,
        api::CanaryChallenge,
        api::CanaryChallengeRows,
        api::CanaryProof,
        api::CanaryGpuOpenings,
        api::CanaryRowOpening,
        api::CanaryView,
        api::BondRequest,
        api::RefundView,
        api::FraudView,
        api::NodeTrustView,
        api::TrustView,
        api::LeaseSet,
        api::SiteRequest,
        api::SiteView,
        api::ServeSpec,
        api::ServiceView,
        api::ServiceRequest,
        api::ServiceScale,
        api::ServiceList,
        api::ServiceLogs,
        api::GatewayReport,
        api::GatewayServiceStats,
        api::LatencyBucket,
        api::ReplicaLoad,
        api::GatewayView,
        api::GatewayList,
        api::ServiceRoute,
        api::RouteReplica,
        api::GatewayNode,
        api::ServiceDeployment,
        api::ServiceReplicaView,
    ))
)]
struct Schemas;

/// One operation of the API, as the document describes it.
struct Operation {
    method: &'static str,
    path: &'static str,
    /// The `operationId`: what a generated client names the call.
    id: &'static str,
    who: Who,
    summary: &'static str,
    /// The request body's schema, if the operation takes one.
    request: Option<&'static str>,
    response: Body,
    /// The status of success.
    status: u16,
    query: &'static [Param],
}

/// Who may call an operation, and how the caller proves it.
enum Who {
    Anyone,
    /// An API key as a bearer token; the text names the roles the operation serves.
    Key(&'static str),
    /// A node's agent, by the node's signature over the request.
    Agent,
}

/// What a successful answer carries.
enum Body {
    Empty,
    Schema(&'static str),
    ListOf(&'static str),
    /// A JSON object with no fixed schema.
    Object,
    /// Not JSON: the media type.
    Media(&'static str),
}

/// A query parameter.
struct Param {
    name: &'static str,
    kind: Kind,
    required: bool,
    about: &'static str,
}

enum Kind {
    Int64,
    UInt64,
    Bool,
    Text,
    /// A job's state (`store::JobState`).
    JobState,
    /// A page's size: 1 to this many.
    Limit(i64),
    /// A month, `YYYY-MM`.
    Month,
}

impl Kind {
    fn schema(&self) -> Value {
        match self {
            Kind::Int64 => json!({"type": "integer", "format": "int64"}),
            Kind::UInt64 => json!({"type": "integer", "minimum": 0, "maximum": u64::MAX}),
            Kind::Bool => json!({"type": "boolean"}),
            Kind::JobState => {
                json!({"type": "string", "enum": store::JobState::ALL.iter().map(|state| state.as_str()).collect::<Vec<_>>()})
            }
            Kind::Limit(most) => json!({"type": "integer", "format": "int64", "minimum": 1, "maximum": most}),
            Kind::Text => json!({"type": "string"}),
            Kind::Month => json!({"type": "string", "pattern": "^(19[7-9][0-9]|[2-9][0-9]{3})-(0[1-9]|1[0-2])$"}),
        }
    }
}

const fn param(name: &'static str, kind: Kind, about: &'static str) -> Param {
    Param {
        name,
        kind,
        required: false,
        about,
    }
}

const PAGE: &[Param] = &[
    param("before", Kind::Int64, "Jobs with an id below this one (the next page)"),
    param(
        "limit",
        Kind::Limit(api::PAGE_SIZE_MAX),
        "At most this many (default 50)",
    ),
    param("state", Kind::JobState, "Only jobs in this state"),
    param(
        "since_us",
        Kind::Int64,
        "Only jobs submitted at or after this time (µs since the Unix epoch)",
    ),
];
const LOG_PAGE: &[Param] = &[
    param("after", Kind::Int64, "Chunks after this one (the next page)"),
    param(
        "limit",
        Kind::Limit(api::PAGE_SIZE_MAX),
        "At most this many chunks (default the most)",
    ),
];
const MARKET_QUERY: &[Param] = &[
    param(
        "bucket_s",
        Kind::Int64,
        "Bucket width in seconds (default an hour; 60 s to 7 days)",
    ),
    param(
        "since_s",
        Kind::Int64,
        "How far back, in seconds (default a day; 60 s to 90 days)",
    ),
];
const OFFER_QUERY: &[Param] = &[
    param(
        "filter",
        Kind::Text,
        "A filter such as `gpu_model=H100 price<2.5 region in [us-east]`",
    ),
    param(
        "limit",
        Kind::Limit(api::OFFERS_PAGE_MAX),
        "At most this many offers (default 100)",
    ),
];
const ACCOUNT: &[Param] = &[param("account_id", Kind::Int64, "Admins: another account's")];
const INVOICE_QUERY: &[Param] = &[
    Param {
        name: "period",
        kind: Kind::Month,
        required: true,
        about: "The month, YYYY-MM (UTC, 1970-01 on)",
    },
    param("account_id", Kind::Int64, "Admins: another account's"),
];
const PROVIDER: &[Param] = &[param("provider_id", Kind::Int64, "Admins: another provider's")];
const LEASE_POLL: &[Param] = &[
    param(
        "wait_ms",
        Kind::UInt64,
        "Wait up to this long for the lease set to differ from `known`",
    ),
    param(
        "known",
        Kind::Text,
        "The `version` of the lease set the agent already has",
    ),
];
const ROUTE_QUERY: &[Param] = &[param(
    "wake",
    Kind::Bool,
    "A request found no replica and waits: ask for one when the service is scaled to zero",
)];

const PATHS: &[Operation] = &[
    Operation {
        method: "get",
        path: "/v1/health",
        id: "healthCheck",
        who: Who::Anyone,
        summary: "Liveness",
        request: None,
        response: Body::Object,
        status: 200,
        query: &[],
    },
    Operation {
        method: "get",
        path: "/v1/market",
        id: "getMarket",
        who: Who::Anyone,
        summary: "Clearing prices per GPU model, region and tier over time; utilisation now",
        request: None,
        response: Body::Schema("MarketView"),
        status: 200,
        query: MARKET_QUERY,
    },
    Operation {
        method: "post",
        path: "/v1/jobs",
        id: "submitJob",
        who: Who::Key("tenant"),
        summary: "Submit a job (idempotent with client_token)",
        request: Some("JobRequest"),
        response: Body::Schema("JobView"),
        status: 201,
        query: &[],
    },
    Operation {
        method: "get",
        path: "/v1/jobs",
        id: "listJobs",
        who: Who::Key("tenant"),
        summary: "List your jobs, newest first (?before=&limit=&state=&since_us=)",
        request: None,
        response: Body::Schema("JobList"),
        status: 200,
        query: PAGE,
    },
    Operation {
        method: "post",
        path: "/v1/jobs/quote",
        id: "quoteJob",
        who: Who::Key("tenant"),
        summary: "What a job would clear at now, and how many GPUs could take it",
        request: Some("JobRequest"),
        response: Body::Schema("QuoteView"),
        status: 200,
        query: &[],
    },
    Operation {
        method: "get",
        path: "/v1/jobs/{id}",
        id: "getJob",
        who: Who::Key("tenant"),
        summary: "One of your jobs with its leases and cost",
        request: None,
        response: Body::Schema("JobView"),
        status: 200,
        query: &[],
    },
    Operation {
        method: "post",
        path: "/v1/jobs/{id}/cancel",
        id: "cancelJob",
        who: Who::Key("tenant"),
        summary: "Cancel a job; its leases stop and its escrow is released",
        request: None,
        response: Body::Schema("JobView"),
        status: 200,
        query: &[],
    },
    Operation {
        method: "get",
        path: "/v1/jobs/{id}/logs",
        id: "getJobLogs",
        who: Who::Key("tenant"),
        summary: "A job's output from every replica, oldest first (?after=&limit=)",
        request: None,
        response: Body::Schema("JobLogs"),
        status: 200,
        query: LOG_PAGE,
    },
    Operation {
        method: "get",
        path: "/v1/offers",
        id: "searchOffers",
        who: Who::Key("any key"),
        summary: "Search offers with a filter (?filter=gpu_model=H100 price<2.5&limit=)",
        request: None,
        response: Body::Schema("OfferList"),
        status: 200,
        query: OFFER_QUERY,
    },
    Operation {
        method: "get",
        path: "/v1/balance",
        id: "getBalance",
        who: Who::Key("any key"),
        summary: "Your balances (admins: ?account_id=)",
        request: None,
        response: Body::Schema("BalanceView"),
        status: 200,
        query: ACCOUNT,
    },
    Operation {
        method: "get",
        path: "/v1/statement",
        id: "getStatement",
        who: Who::Key("any key"),
        summary: "Your ledger lines: usage, holds, credits, earnings",
        request: None,
        response: Body::Schema("StatementView"),
        status: 200,
        query: ACCOUNT,
    },
    Operation {
        method: "get",
        path: "/v1/invoices",
        id: "getInvoice",
        who: Who::Key("tenant"),
        summary: "Your invoice for a month (?period=YYYY-MM; admins add &account_id=)",
        request: None,
        response: Body::Schema("InvoiceView"),
        status: 200,
        query: INVOICE_QUERY,
    },
    Operation {
        method: "post",
        path: "/v1/nodes",
        id: "registerNode",
        who: Who::Key("provider"),
        summary: "Register a node with its agent's public key",
        request: Some("NodeRegistration"),
        response: Body::Schema("NodeView"),
        status: 201,
        query: &[],
    },
    Operation {
        method: "get",
        path: "/v1/nodes",
        id: "listNodes",
        who: Who::Key("provider"),
        summary: "Your nodes",
        request: None,
        response: Body::ListOf("NodeView"),
        status: 200,
        query: &[],
    },
    Operation {
        method: "post",
        path: "/v1/nodes/batch",
        id: "registerNodes",
        who: Who::Key("provider"),
        summary: "Register up to 1,000 nodes in one request, all or none",
        request: Some("NodeBatchRegistration"),
        response: Body::Schema("NodeBatchView"),
        status: 201,
        query: &[],
    },
    Operation {
        method: "get",
        path: "/v1/nodes/{id}",
        id: "getNode",
        who: Who::Key("provider"),
        summary: "One of your nodes, with reliability and telemetry",
        request: None,
        response: Body::Schema("NodeView"),
        status: 200,
        query: &[],
    },
    Operation {
        method: "put",
        path: "/v1/nodes/{id}/policy",
        id: "setNodePolicy",
        who: Who::Key("provider"),
        summary: "Set a node's prices, schedule, calendar and limits",
        request: Some("PolicyDoc"),
        response: Body::Schema("NodeView"),
        status: 200,
        query: &[],
    },
    Operation {
        method: "post",
        path: "/v1/nodes/{id}/reclaim",
        id: "reclaimNode",
        who: Who::Key("provider"),
        summary: "Take GPUs of a node back: idle first, bronze on them stops after the grace, firm work runs on unless forced (docs/trust-policy.md § 8)",
        request: Some("ReclaimRequest"),
        response: Body::Schema("ReclaimView"),
        status: 200,
        query: &[],
    },
    Operation {
        method: "delete",
        path: "/v1/nodes/{id}/reclaim",
        id: "resumeNode",
        who: Who::Key("provider"),
        summary: "Give a node's reclaimed GPUs back to the market",
        request: None,
        response: Body::Schema("ReclaimView"),
        status: 200,
        query: &[],
    },
    Operation {
        method: "post",
        path: "/v1/services",
        id: "deployService",
        who: Who::Key("tenant"),
        summary: "Deploy a service: replicas of a job behind the gateway at /s/{name}/, autoscaled",
        request: Some("ServiceRequest"),
        response: Body::Schema("ServiceView"),
        status: 201,
        query: &[],
    },
    Operation {
        method: "get",
        path: "/v1/services",
        id: "listServices",
        who: Who::Key("tenant"),
        summary: "Your services",
        request: None,
        response: Body::Schema("ServiceList"),
        status: 200,
        query: &[],
    },
    Operation {
        method: "get",
        path: "/v1/services/{name}",
        id: "getService",
        who: Who::Key("tenant"),
        summary: "A service served through the gateway: replicas, requests, errors, latency, tokens",
        request: None,
        response: Body::Schema("ServiceView"),
        status: 200,
        query: &[],
    },
    Operation {
        method: "put",
        path: "/v1/services/{name}",
        id: "updateService",
        who: Who::Key("tenant"),
        summary: "A new spec for a service: a changed replica rolls out one at a time",
        request: Some("ServiceRequest"),
        response: Body::Schema("ServiceView"),
        status: 200,
        query: &[],
    },
    Operation {
        method: "delete",
        path: "/v1/services/{name}",
        id: "deleteService",
        who: Who::Key("tenant"),
        summary: "Delete a service: its replicas stop",
        request: None,
        response: Body::Schema("ServiceView"),
        status: 200,
        query: &[],
    },
    Operation {
        method: "post",
        path: "/v1/services/{name}/scale",
        id: "scaleService",
        who: Who::Key("tenant"),
        summary: "New bounds for a service's replicas",
        request: Some("ServiceScale"),
        response: Body::Schema("ServiceView"),
        status: 200,
        query: &[],
    },
    Operation {
        method: "post",
        path: "/v1/services/{name}/keys",
        id: "createServiceKey",
        who: Who::Key("tenant"),
        summary: "A key that calls this service through the gateway and nothing else (shown once)",
        request: None,
        response: Body::Schema("NewKeyResponse"),
        status: 201,
        query: &[],
    },
    Operation {
        method: "delete",
        path: "/v1/services/{name}/keys/{key_id}",
        id: "revokeServiceKey",
        who: Who::Key("tenant"),
        summary: "Revoke a key of this service",
        request: None,
        response: Body::Empty,
        status: 204,
        query: &[],
    },
    Operation {
        method: "get",
        path: "/v1/services/{name}/logs",
        id: "getServiceLogs",
        who: Who::Key("tenant"),
        summary: "The output of a service's live replicas",
        request: None,
        response: Body::Schema("ServiceLogs"),
        status: 200,
        query: LOG_PAGE,
    },
    Operation {
        method: "post",
        path: "/v1/gateways",
        id: "reportGateway",
        who: Who::Key("admin"),
        summary: "A gateway running on its own reports where agents reach it and what its callers got",
        request: Some("GatewayReport"),
        response: Body::Schema("GatewayList"),
        status: 200,
        query: &[],
    },
    Operation {
        method: "get",
        path: "/v1/gateways",
        id: "listGateways",
        who: Who::Key("admin"),
        summary: "The gateways running on their own that reported lately",
        request: None,
        response: Body::Schema("GatewayList"),
        status: 200,
        query: &[],
    },
    Operation {
        method: "get",
        path: "/v1/gateway/services/{name}",
        id: "getServiceRoute",
        who: Who::Key("tenant"),
        summary: "Where a gateway sends the caller's requests for a service: its ready replicas",
        request: None,
        response: Body::Schema("ServiceRoute"),
        status: 200,
        query: ROUTE_QUERY,
    },
    Operation {
        method: "get",
        path: "/v1/gateway/nodes/{id}",
        id: "getGatewayNode",
        who: Who::Key("admin"),
        summary: "A node's public key, for a gateway checking its tunnel's signature",
        request: None,
        response: Body::Schema("GatewayNode"),
        status: 200,
        query: &[],
    },
    Operation {
        method: "get",
        path: "/v1/sites",
        id: "listSites",
        who: Who::Key("any key"),
        summary: "Sites with the coordinates admins set for them",
        request: None,
        response: Body::ListOf("SiteView"),
        status: 200,
        query: &[],
    },
    Operation {
        method: "put",
        path: "/v1/sites/{name}",
        id: "setSite",
        who: Who::Key("admin"),
        summary: "Set a site's coordinates: its nodes that declare none take them",
        request: Some("SiteRequest"),
        response: Body::Schema("SiteView"),
        status: 200,
        query: &[],
    },
    Operation {
        method: "get",
        path: "/v1/earnings",
        id: "getEarnings",
        who: Who::Key("provider"),
        summary: "Earnings, fill rate and reliability per node",
        request: None,
        response: Body::Schema("EarningsView"),
        status: 200,
        query: &[],
    },
    Operation {
        method: "post",
        path: "/v1/agent/heartbeat",
        id: "agentHeartbeat",
        who: Who::Agent,
        summary: "Heartbeat with telemetry; answers the leases to run",
        request: Some("HeartbeatRequest"),
        response: Body::Schema("HeartbeatResponse"),
        status: 200,
        query: &[],
    },
    Operation {
        method: "get",
        path: "/v1/agent/leases",
        id: "agentPollLeases",
        who: Who::Agent,
        summary: "Long-poll the node's leases (?wait_ms=&known=)",
        request: None,
        response: Body::Schema("LeaseSet"),
        status: 200,
        query: LEASE_POLL,
    },
    Operation {
        method: "post",
        path: "/v1/agent/leases/{id}/events",
        id: "agentLeaseEvent",
        who: Who::Agent,
        summary: "Report a lease's state (fenced by epoch)",
        request: Some("LeaseEventRequest"),
        response: Body::Schema("LeaseView"),
        status: 200,
        query: &[],
    },
    Operation {
        method: "post",
        path: "/v1/agent/leases/{id}/progress",
        id: "agentLeaseProgress",
        who: Who::Agent,
        summary: "Report what a replica has done so far (tokens, samples…), fenced by epoch",
        request: Some("ProgressRequest"),
        response: Body::Object,
        status: 200,
        query: &[],
    },
    Operation {
        method: "post",
        path: "/v1/agent/key",
        id: "agentRotateKey",
        who: Who::Agent,
        summary: "Replace the node's key with a new one (signed by the current key)",
        request: Some("KeyRotation"),
        response: Body::Schema("NodeView"),
        status: 200,
        query: &[],
    },
    Operation {
        method: "put",
        path: "/v1/agent/node",
        id: "agentRestateNode",
        who: Who::Agent,
        summary: "Restate the node's name, place, NVLink domain, gang ports and runtimes (and asks and limits when given) on start",
        request: Some("NodeRestatement"),
        response: Body::Schema("NodeView"),
        status: 200,
        query: &[],
    },
    Operation {
        method: "post",
        path: "/v1/agent/reclaim",
        id: "agentReclaim",
        who: Who::Agent,
        summary: "Take GPUs of this node back from its host (`fallow agent reclaim`, `pause`)",
        request: Some("ReclaimRequest"),
        response: Body::Schema("ReclaimView"),
        status: 200,
        query: &[],
    },
    Operation {
        method: "post",
        path: "/v1/agent/resume",
        id: "agentResume",
        who: Who::Agent,
        summary: "Give this node's reclaimed GPUs back to the market from its host",
        request: None,
        response: Body::Schema("ReclaimView"),
        status: 200,
        query: &[],
    },
    Operation {
        method: "post",
        path: "/v1/agent/leases/{id}/logs",
        id: "agentLeaseLogs",
        who: Who::Agent,
        summary: "Send a chunk of a replica's output (fenced by epoch; idempotent by byte offset)",
        request: Some("LogChunkRequest"),
        response: Body::Schema("LogChunkAccepted"),
        status: 200,
        query: &[],
    },
    Operation {
        method: "post",
        path: "/v1/agent/usage",
        id: "agentUsage",
        who: Who::Agent,
        summary: "A signed usage record (accepted once)",
        request: Some("SignedUsage"),
        response: Body::Schema("UsageAccepted"),
        status: 200,
        query: &[],
    },
    Operation {
        method: "post",
        path: "/v1/agent/attestations",
        id: "agentAttestation",
        who: Who::Agent,
        summary: "A signed completion attestation",
        request: Some("SignedAttestation"),
        response: Body::Schema("LeaseView"),
        status: 200,
        query: &[],
    },
    Operation {
        method: "post",
        path: "/v1/admin/accounts",
        id: "createAccount",
        who: Who::Key("admin"),
        summary: "Create an account and its first API key",
        request: Some("NewAccountRequest"),
        response: Body::Schema("NewAccountResponse"),
        status: 201,
        query: &[],
    },
    Operation {
        method: "get",
        path: "/v1/admin/accounts",
        id: "listAccounts",
        who: Who::Key("admin"),
        summary: "List accounts",
        request: None,
        response: Body::ListOf("AccountView"),
        status: 200,
        query: &[],
    },
    Operation {
        method: "post",
        path: "/v1/accounts/{id}/keys",
        id: "createKey",
        who: Who::Key("admin or owner"),
        summary: "Create another API key",
        request: Some("NewKeyRequest"),
        response: Body::Schema("NewKeyResponse"),
        status: 201,
        query: &[],
    },
    Operation {
        method: "get",
        path: "/v1/accounts/{id}/keys",
        id: "listKeys",
        who: Who::Key("admin or owner"),
        summary: "List an account's keys (never the secrets)",
        request: None,
        response: Body::ListOf("KeyView"),
        status: 200,
        query: &[],
    },
    Operation {
        method: "post",
        path: "/v1/keys/{key_id}/revoke",
        id: "revokeKey",
        who: Who::Key("admin or owner"),
        summary: "Revoke a key",
        request: None,
        response: Body::Empty,
        status: 204,
        query: &[],
    },
    Operation {
        method: "post",
        path: "/v1/keys/rotate",
        id: "rotateKey",
        who: Who::Key("any key"),
        summary: "A new key for your account; the one used is revoked",
        request: None,
        response: Body::Schema("NewKeyResponse"),
        status: 201,
        query: &[],
    },
    Operation {
        method: "post",
        path: "/v1/admin/credits",
        id: "creditAccount",
        who: Who::Key("admin"),
        summary: "Credit a tenant (the stand-in for a payment provider)",
        request: Some("CreditRequest"),
        response: Body::Schema("BalanceView"),
        status: 200,
        query: &[],
    },
    Operation {
        method: "get",
        path: "/v1/admin/evidence",
        id: "listEvidence",
        who: Who::Key("admin"),
        summary: "Refused signatures, replays, reports for foreign leases, violating usage records, drops and absences",
        request: None,
        response: Body::ListOf("EvidenceView"),
        status: 200,
        query: &[],
    },
    Operation {
        method: "post",
        path: "/v1/agent/canaries",
        id: "agentCanaryResult",
        who: Who::Agent,
        summary: "A canary's signed result (docs/trust-policy.md § 3); answers the finding, or a matmul canary's challenge",
        request: Some("SignedCanaryResult"),
        response: Body::Schema("CanaryAccepted"),
        status: 200,
        query: &[],
    },
    Operation {
        method: "post",
        path: "/v1/agent/canaries/{id}/proof",
        id: "agentCanaryProof",
        who: Who::Agent,
        summary: "A matmul canary's proof: the rows of each GPU's product its challenge asked for, with their Merkle paths; answers the finding",
        request: Some("CanaryProof"),
        response: Body::Schema("CanaryAccepted"),
        status: 200,
        query: &[],
    },
    Operation {
        method: "get",
        path: "/v1/trust",
        id: "getTrust",
        who: Who::Key("provider, admin"),
        summary: "A provider's standing: badge, bond, reputation with its inputs, nodes' canaries, fraud decided (admins: ?provider_id=)",
        request: None,
        response: Body::Schema("TrustView"),
        status: 200,
        query: PROVIDER,
    },
    Operation {
        method: "post",
        path: "/v1/provider/bond",
        id: "postBond",
        who: Who::Key("provider"),
        summary: "Post a bond from your earnings (idempotent by key)",
        request: Some("OwnBondRequest"),
        response: Body::Schema("TrustView"),
        status: 200,
        query: &[],
    },
    Operation {
        method: "post",
        path: "/v1/admin/bonds",
        id: "adminPostBond",
        who: Who::Key("admin"),
        summary: "Post a bond paid in from outside for a provider (idempotent by key)",
        request: Some("AdminBondRequest"),
        response: Body::Schema("TrustView"),
        status: 200,
        query: &[],
    },
    Operation {
        method: "get",
        path: "/v1/frauds",
        id: "listFrauds",
        who: Who::Key("tenant, provider, admin"),
        summary: "Fraud decisions that concern you, with the rule, the amounts, the refunds and the evidence",
        request: None,
        response: Body::ListOf("FraudView"),
        status: 200,
        query: &[],
    },
    Operation {
        method: "get",
        path: "/v1/nodes/{id}/canaries",
        id: "listNodeCanaries",
        who: Who::Key("provider, admin"),
        summary: "A node's canaries with their signed results, newest first",
        request: None,
        response: Body::ListOf("CanaryView"),
        status: 200,
        query: &[],
    },
    Operation {
        method: "post",
        path: "/v1/nodes/{id}/verify",
        id: "verifyNode",
        who: Who::Key("provider, admin"),
        summary: "Order a canary on the node now (re-verification after a cordon)",
        request: None,
        response: Body::Schema("CanaryView"),
        status: 201,
        query: &[],
    },
    Operation {
        method: "get",
        path: "/v1/openapi.json",
        id: "getOpenApi",
        who: Who::Anyone,
        summary: "This document",
        request: None,
        response: Body::Object,
        status: 200,
        query: &[],
    },
    Operation {
        method: "get",
        path: "/v1/explorer",
        id: "apiExplorer",
        who: Who::Anyone,
        summary: "An explorer of this document, for people (HTML)",
        request: None,
        response: Body::Media("text/html"),
        status: 200,
        query: &[],
    },
    Operation {
        method: "get",
        path: "/metrics",
        id: "getMetrics",
        who: Who::Key("admin, or the metrics token"),
        summary: "Counters and gauges in the Prometheus text format",
        request: None,
        response: Body::Media("text/plain"),
        status: 200,
        query: &[],
    },
    Operation {
        method: "post",
        path: "/v1/agent/tunnel",
        id: "agentTunnel",
        who: Who::Agent,
        summary: "Open the node's reverse tunnel: an HTTP/1.1 upgrade to `fallow-tunnel`, over which the gateway sends requests to the node's replicas",
        request: None,
        response: Body::Empty,
        status: 101,
        query: &[],
    },
];

fn reference(name: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{name}")})
}

/// The node's signature: four headers, all required together (`trust::request`).
const NODE_HEADERS: [(&str, &str, &str); 4] = [
    ("nodeId", "x-fallow-node", "The node's id"),
    (
        "nodeTimestamp",
        "x-fallow-timestamp",
        "Milliseconds since the Unix epoch, within the allowed skew",
    ),
    ("nodeNonce", "x-fallow-nonce", "A value never used before by this node"),
    (
        "nodeSignature",
        "x-fallow-signature",
        "ed25519 over the canonical request (method, path and query, the body's blake3, timestamp, nonce, node id), hex",
    ),
];

fn error(description: &str) -> Value {
    json!({"description": description, "content": {"application/json": {"schema": reference("ErrorBody")}}})
}

fn operation(op: &Operation) -> Value {
    let caller = match op.who {
        Who::Anyone => "anyone".to_string(),
        Who::Key(roles) => format!("{roles}, with an API key (Authorization: Bearer <key>)"),
        Who::Agent => "a node's agent, signing the request with the node's key".to_string(),
    };
    let mut responses = serde_json::Map::new();
    let mut success = json!({"description": "success"});
    match op.response {
        Body::Empty => {}
        Body::Schema(name) => success["content"] = json!({"application/json": {"schema": reference(name)}}),
        Body::ListOf(name) => {
            success["content"] = json!({"application/json": {"schema": {"type": "array", "items": reference(name)}}})
        }
        Body::Object => success["content"] = json!({"application/json": {"schema": {"type": "object"}}}),
        Body::Media(media) => success["content"] = json!({media: {"schema": {"type": "string"}}}),
    }
    responses.insert(op.status.to_string(), success);
    let path_params: Vec<&str> = op
        .path
        .split('{')
        .skip(1)
        .filter_map(|rest| rest.split_once('}').map(|(name, _)| name))
        .collect();
    if op.request.is_some() || !op.query.is_empty() || !path_params.is_empty() || !matches!(op.who, Who::Anyone) {
        responses.insert(
            "400".into(),
            error("the request is malformed or a value is out of range; the message says which"),
        );
    }
    if !matches!(op.who, Who::Anyone) {
        responses.insert("401".into(), error("no credentials, or credentials that are not valid"));
        responses.insert("403".into(), error("the caller may not do this"));
    }
    if !path_params.is_empty() {
        responses.insert("404".into(), error("no such thing, or not the caller's"));
    }
    responses.insert("4XX".into(), error("what is wrong, in words (402: not enough credit, 409: a conflict, 413: too large, 415: not JSON, 429: too many requests)"));
    let mut operation = json!({
        "operationId": op.id,
        "summary": op.summary,
        "description": format!("Caller: {caller}."),
        "responses": responses,
        "security": match op.who {
            Who::Anyone => json!([]),
            Who::Key(_) => json!([{"apiKey": []}]),
            Who::Agent => json!([NODE_HEADERS.iter().map(|(scheme, _, _)| (scheme.to_string(), json!([]))).collect::<serde_json::Map<_, _>>()]),
        },
    });
    if let Some(request) = op.request {
        operation["requestBody"] =
            json!({"required": true, "content": {"application/json": {"schema": reference(request)}}});
    }
    let mut parameters: Vec<Value> = path_params
        .iter()
        .map(|name| {
            let schema = if name.ends_with("id") && *name != "key_id" {
                json!({"type": "integer", "format": "int64"})
            } else if op.path.starts_with("/v1/sites/") {
                json!({"type": "string", "minLength": 1, "maxLength": 128, "pattern": NAME})
            } else {
                json!({"type": "string", "minLength": 1})
            };
            json!({"name": name, "in": "path", "required": true, "schema": schema})
        })
        .collect();
    parameters.extend(op.query.iter().map(|param| {
        json!({"name": param.name, "in": "query", "required": param.required, "description": param.about, "schema": param.kind.schema()})
    }));
    if op.status == 101 {
        // Switching protocols: the request asks for the upgrade in its headers.
        parameters.push(json!({"name": "Connection", "in": "header", "required": true, "schema": {"type": "string", "enum": ["upgrade"]}}));
        parameters.push(json!({"name": "Upgrade", "in": "header", "required": true, "schema": {"type": "string", "enum": [crate::gateway::TUNNEL_PROTOCOL]}}));
    }
    if !parameters.is_empty() {
        operation["parameters"] = Value::Array(parameters);
    }
    operation
}

pub fn build() -> Value {
    let mut document = serde_json::to_value(Schemas::openapi()).expect("the schemas serialise");
    let mut paths = serde_json::Map::new();
    for op in PATHS {
        let entry = paths.entry(op.path.to_string()).or_insert_with(|| json!({}));
        entry[op.method] = operation(op);
    }
    document["paths"] = Value::Object(paths);
    let mut schemes = serde_json::Map::new();
    schemes.insert(
        "apiKey".into(),
        json!({"type": "http", "scheme": "bearer", "description": "An account's API key (tenant, provider or admin), or a service's key for its gateway route"}),
    );
    for (scheme, header, about) in NODE_HEADERS {
        schemes.insert(
            scheme.into(),
            json!({"type": "apiKey", "in": "header", "name": header, "description": about}),
        );
    }
    document["components"]["securitySchemes"] = Value::Object(schemes);
    constrain(&mut document["components"]["schemas"]);
    let schemas = &mut document["components"]["schemas"];
    // At most one of the three ways to ask for GPUs (null is the same as absent).
    let set = |field: &str| json!({"required": [field], "properties": {field: {"not": {"type": "null"}}}});
    schemas["JobRequest"]["not"] = json!({"anyOf": [
        {"allOf": [set("gpus"), set("gpu_share_milli")]},
        {"allOf": [set("gpus"), set("compute_units")]},
        {"allOf": [set("gpu_share_milli"), set("compute_units")]},
    ]});
    // A window is weekly (minutes of the day, on days) or once (an interval), never both.
    let unset = |field: &str| json!({"properties": {field: {"type": "null"}}});
    schemas["WindowDoc"]["oneOf"] = json!([
        {"allOf": [set("start_minute"), set("end_minute"), unset("start_us"), unset("end_us")]},
        {"allOf": [set("start_us"), set("end_us"), unset("start_minute"), unset("end_minute"), {"properties": {"days": {"maxItems": 0}}}]},
    ]);
    // A job's spec as the server shows it is what was sent, model names spelled as they were.
    let mut shown = schemas["JobRequest"].clone();
    if let Some(items) = shown["properties"]["gpu_models"]["items"].as_object_mut() {
        items.remove("enum");
    }
    schemas["JobSpecView"] = shown;
    schemas["JobView"]["properties"]["spec"] = reference("JobSpecView");
    // A serving job has one replica.
    schemas["JobRequest"]["not"]["anyOf"]
        .as_array_mut()
        .expect("the list above")
        .push(json!({"allOf": [set("serve"), {"required": ["replicas"], "properties": {"replicas": {"minimum": 2}}}]}));
    // A provider's own bond names no provider; the admins' form names one.
    schemas["OwnBondRequest"] = json!({
        "description": "A provider's bond from its earnings: a BondRequest without provider_id.",
        "allOf": [reference("BondRequest")],
        "properties": {"provider_id": {"type": "null"}},
    });
    schemas["AdminBondRequest"] = json!({
        "description": "A bond paid in from outside: a BondRequest that names the provider.",
        "allOf": [reference("BondRequest")],
        "required": ["provider_id"],
        "properties": {"provider_id": {"type": "integer", "format": "int64"}},
    });
    integer_bounds(&mut document["components"]["schemas"]);
    document["info"]["version"] = json!(env!("CARGO_PKG_VERSION"));
    document
}

/// A name people give: not blank, at most 128 characters, none of them a control character
/// (`routes::check_name`).
const NAME: &str = r"^[^\x00-\x1f\x7f-\x9f]*[^\s\x00-\x1f\x7f-\x9f][^\x00-\x1f\x7f-\x9f]*$";
/// Text of at most 128 characters with no control character; may be empty.
const PRINTABLE: &str = r"^[^\x00-\x1f\x7f-\x9f]*$";
/// A price in dollars above 0 and at most 1,000, with at most six decimals (`Micros::parse_dollars`).
const PRICE: &str = r"^\$?(?!0*\.?0*$)(1000(\.0{1,6})?|[0-9]{1,3}(\.[0-9]{1,6})?|\.[0-9]{1,6})$";
/// An amount of dollars above 0 and at most 10,000,000 (credits and bonds).
const AMOUNT: &str = r"^\$?(?!0*\.?0*$)(10000000(\.0{1,6})?|[0-9]{1,7}(\.[0-9]{1,6})?|\.[0-9]{1,6})$";
/// Compute units: a decimal above 0 and at most 64, at most six decimals (read as dollars are).
const COMPUTE_UNITS: &str =
    r"^\s*\$?(?!0*\.?0*\s*$)(64(\.0{1,6})?|[0-5]?[0-9](\.[0-9]{1,6})?|6[0-3](\.[0-9]{1,6})?|\.[0-9]{1,6})\s*$";
/// A port, 1 to 65535.
const PORT: &str = "([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])";
/// A service's name (`api::check_service_name`).
const SERVICE_NAME: &str = "^[A-Za-z0-9][A-Za-z0-9-]{0,62}$";

/// What the server checks of fields that the wire types hold as plain text or numbers, as JSON
/// Schema: (schema, field, keywords added to the field's schema). Words come from the model's
/// own lists, so the document cannot drift from what the parsers take.
fn constraints() -> Vec<(&'static str, &'static str, Value)> {
    use model::{LeaseState, Runtime, Tier, TopologyLevel, WorkloadClass};
    let tiers: Vec<&str> = Tier::ALL.iter().map(|tier| tier.name()).collect();
    let topologies: Vec<&str> = TopologyLevel::ALL.iter().map(|level| level.name()).collect();
    let classes: Vec<&str> = WorkloadClass::ALL.iter().map(|class| class.name()).collect();
    let runtimes: Vec<&str> = Runtime::ALL.iter().map(|runtime| runtime.name()).collect();
    let roles: Vec<&str> = store::Role::ALL.iter().map(|role| role.as_str()).collect();
    let job_states: Vec<&str> = store::JobState::ALL.iter().map(|state| state.as_str()).collect();
    let lease_states: Vec<&str> = LeaseState::ALL.iter().map(|state| state.as_str()).collect();
    let name = json!({"minLength": 1, "maxLength": 128, "pattern": NAME});
    let printable = json!({"maxLength": 128, "pattern": PRINTABLE});
    let days = json!({"items": {"maximum": 6}});
    // Catalog names and aliases as written there (the server also ignores case and vendor words).
    let models: Vec<&str> = model::GpuCatalog::embedded()
        .models()
        .flat_map(|(_, spec)| std::iter::once(spec.name.as_str()).chain(spec.aliases.iter().map(String::as_str)))
        .collect();
    let service_replicas = api::SERVICE_REPLICAS_MAX;
    let seconds = json!({"minimum": 1, "maximum": api::SERVICE_SECONDS_MAX});
    // Free text a job carries: at most TEXT_FIELD_BYTES_MAX bytes, no NUL.
    let text = json!({"maxLength": api::TEXT_FIELD_BYTES_MAX, "pattern": r"^[^\x00]*$"});
    vec![
        ("JobRequest", "tier", json!({"enum": tiers})),
        ("JobRequest", "topology", json!({"enum": topologies})),
        ("JobRequest", "class", json!({"enum": classes})),
        ("JobRequest", "runtime", json!({"enum": runtimes})),
        ("JobRequest", "network", json!({"enum": ["none", "bridge"]})),
        ("JobRequest", "gang_repair", json!({"enum": ["restart", "keep"]})),
        (
            "JobRequest",
            "image",
            json!({"maxLength": api::TEXT_FIELD_BYTES_MAX, "pattern": r"^[^\x00]*[^\s\x00][^\x00]*$"}),
        ),
        ("JobRequest", "max_price_per_gpu_hour", json!({"pattern": PRICE})),
        ("JobView", "tier", json!({"enum": tiers})),
        ("JobView", "state", json!({"enum": job_states})),
        ("LeaseView", "state", json!({"enum": lease_states})),
        ("NewAccountRequest", "role", json!({"enum": roles})),
        ("AccountView", "role", json!({"enum": roles})),
        ("NewAccountRequest", "name", name.clone()),
        ("NodeRegistration", "name", name.clone()),
        ("NodeRegistration", "region", name.clone()),
        ("NodeRegistration", "site", name.clone()),
        ("NodeRegistration", "fabric", printable.clone()),
        ("NodeRegistration", "nvlink_domain", printable.clone()),
        ("NodeRegistration", "fingerprint", printable.clone()),
        ("NodeRegistration", "advertise_addr", printable.clone()),
        ("NodeRegistration", "nvlink_detected", printable.clone()),
        (
            "NodeRegistration",
            "nvlink_source",
            json!({"enum": ["", "flag", "nvml-fabric", "nvswitch", "node"]}),
        ),
        (
            "NodeRegistration",
            "public_key",
            json!({"pattern": "^[0-9a-fA-F]{64}$"}),
        ),
        ("NodeRegistration", "gpu_model", json!({"enum": models})),
        ("NodeRegistration", "gpu_count", json!({"minimum": 1, "maximum": 16})),
        ("NodeRegistration", "cpu_milli", json!({"minimum": 1})),
        (
            "NodeRegistration",
            "memory_mib",
            json!({"maximum": api::MEMORY_MIB_MAX}),
        ),
        (
            "NodeRegistration",
            "latitude",
            json!({"minimum": -90.0, "maximum": 90.0}),
        ),
        (
            "NodeRegistration",
            "longitude",
            json!({"minimum": -180.0, "maximum": 180.0}),
        ),
        (
            "NodeRegistration",
            "gang_ports",
            json!({"pattern": format!("^({PORT}-{PORT})?$")}),
        ),
        ("NewKeyRequest", "label", printable),
        ("BondRequest", "amount", json!({"pattern": AMOUNT})),
        ("CreditRequest", "amount", json!({"pattern": AMOUNT})),
        ("BondRequest", "key", name.clone()),
        ("CreditRequest", "key", name),
        (
            "PolicyDoc",
            "asks",
            json!({"minProperties": 1, "propertyNames": {"enum": tiers}, "additionalProperties": {"pattern": PRICE}}),
        ),
        ("PriceRuleDoc", "days", days.clone()),
        ("WindowDoc", "days", days),
        ("WindowDoc", "start_minute", json!({"maximum": 1439})),
        ("WindowDoc", "end_minute", json!({"minimum": 1, "maximum": 1440})),
        ("ServiceRequest", "name", json!({"pattern": SERVICE_NAME})),
        ("ServiceRequest", "min_replicas", json!({"maximum": service_replicas})),
        ("ServiceRequest", "target_in_flight", json!({"minimum": 1})),
        ("ServiceRequest", "burst_tier", json!({"enum": tiers})),
        ("ServiceRequest", "scale_up_after_s", seconds.clone()),
        ("ServiceRequest", "scale_down_after_s", seconds.clone()),
        ("ServiceRequest", "health_timeout_s", seconds.clone()),
        ("ServiceRequest", "wake_timeout_s", seconds),
        // A service's replica is one job replica; the service serves it.
        (
            "ServiceRequest",
            "replica",
            json!({"allOf": [{"properties": {"replicas": {"const": 1}, "serve": {"type": "null"}, "client_token": {"type": "null"}}}]}),
        ),
        (
            "JobRequest",
            "replicas",
            json!({"minimum": 1, "maximum": api::REPLICAS_MAX}),
        ),
        ("JobRequest", "memory_mib", json!({"maximum": api::MEMORY_MIB_MAX})),
        ("JobRequest", "name", text.clone()),
        (
            "JobRequest",
            "command",
            json!({"maxItems": api::COMMAND_ARGS_MAX, "items": text.clone()}),
        ),
        (
            "JobRequest",
            "env",
            json!({"maxProperties": api::ENV_ENTRIES_MAX, "propertyNames": {"minLength": 1, "pattern": "^[^=]*$"}, "additionalProperties": text.clone()}),
        ),
        (
            "JobRequest",
            "gpus",
            json!({"minimum": 1, "maximum": model::GPUS_PER_NODE_MAX}),
        ),
        ("JobRequest", "gpu_share_milli", json!({"minimum": 1, "maximum": 999})),
        ("JobRequest", "compute_units", json!({"pattern": COMPUTE_UNITS})),
        ("JobRequest", "gpu_models", json!({"items": {"enum": models}})),
        (
            "JobRequest",
            "regions",
            json!({"maxItems": api::REGIONS_MAX, "items": text.clone()}),
        ),
        ("JobRequest", "datasets", json!({"maxItems": api::DATASETS_MAX})),
        ("JobRequest", "min_reliability", json!({"minimum": 0.0, "maximum": 1.0})),
        (
            "JobRequest",
            "max_runtime_s",
            json!({"minimum": 1, "maximum": api::RUNTIME_S_MAX}),
        ),
        ("JobRequest", "repair_billing", json!({"enum": ["bill", "pause"]})),
        ("JobRequest", "max_restarts", json!({"maximum": 100})),
        (
            "JobRequest",
            "checkpoint_dir",
            json!({"maxLength": api::TEXT_FIELD_BYTES_MAX, "pattern": r"^/(?!(.*/)?\.\.(/|$))[^\x00]*$"}),
        ),
        (
            "JobRequest",
            "client_token",
            json!({"minLength": 1, "maxLength": 128, "pattern": PRINTABLE}),
        ),
        (
            "DatasetRequest",
            "url",
            json!({"maxLength": api::TEXT_FIELD_BYTES_MAX, "pattern": r"^(https?|file)://[^\x00]*$"}),
        ),
        (
            "DatasetRequest",
            "digest",
            json!({"pattern": "^(blake3|sha256):[0-9a-fA-F]{64}$"}),
        ),
        ("ClientRequest", "latitude", json!({"minimum": -90.0, "maximum": 90.0})),
        (
            "ClientRequest",
            "longitude",
            json!({"minimum": -180.0, "maximum": 180.0}),
        ),
        ("ClientRequest", "latency_target_ms", json!({"minimum": 1})),
        ("ServeSpec", "name", json!({"pattern": SERVICE_NAME})),
        (
            "ServeSpec",
            "health_path",
            json!({"maxLength": api::TEXT_FIELD_BYTES_MAX, "pattern": r"^(/[^\x00]*)?$"}),
        ),
        (
            "ReclaimRequest",
            "for_s",
            json!({"minimum": 1, "maximum": api::RECLAIM_FOR_S_MAX}),
        ),
        ("ServiceRequest", "target_p95_ms", json!({"minimum": 1})),
        (
            "ServiceRequest",
            "max_replicas",
            json!({"minimum": 1, "maximum": service_replicas}),
        ),
        ("ServiceScale", "min_replicas", json!({"maximum": service_replicas})),
        (
            "ServiceScale",
            "max_replicas",
            json!({"minimum": 1, "maximum": service_replicas}),
        ),
        ("SiteRequest", "latitude", json!({"minimum": -90.0, "maximum": 90.0})),
        ("SiteRequest", "longitude", json!({"minimum": -180.0, "maximum": 180.0})),
        (
            "GatewayReport",
            "url",
            json!({"maxLength": 512, "pattern": r"^https?://\S*$"}),
        ),
    ]
}

/// Gives every integer the bounds of its Rust type (the derives name it in `format`, e.g.
/// `u-int16`), so that a value the server cannot hold is one the document refuses too; the
/// formats become OpenAPI's own (`int32`, `int64`).
fn integer_bounds(value: &mut Value) {
    match value {
        Value::Object(fields) => {
            let bounds: Option<(Value, Value, &str)> = match fields.get("format").and_then(Value::as_str) {
                Some("int8") => Some((json!(i8::MIN), json!(i8::MAX), "int32")),
                Some("uint8" | "u-int8") => Some((json!(0), json!(u8::MAX), "int32")),
                Some("int16") => Some((json!(i16::MIN), json!(i16::MAX), "int32")),
                Some("uint16" | "u-int16") => Some((json!(0), json!(u16::MAX), "int32")),
                Some("int32") => Some((json!(i32::MIN), json!(i32::MAX), "int32")),
                Some("uint32" | "u-int32") => Some((json!(0), json!(u32::MAX), "int64")),
                Some("int64") => Some((json!(i64::MIN), json!(i64::MAX), "int64")),
                // What the store keeps is an i64; the server refuses more.
                Some("uint64" | "u-int64") => Some((json!(0), json!(i64::MAX), "int64")),
                _ => None,
            };
            if let Some((minimum, maximum, format)) = bounds {
                // A bound the derive set already (`#[schema(minimum = 1)]`) is tighter: kept.
                fields.entry("minimum").or_insert(minimum);
                fields.entry("maximum").or_insert(maximum);
                fields.insert("format".into(), json!(format));
            }
            fields.values_mut().for_each(integer_bounds);
        }
        Value::Array(items) => items.iter_mut().for_each(integer_bounds),
        _ => {}
    }
}

/// Adds the keywords of `constraints` to their fields (an `enum` on a field that may be null
/// takes null too).
fn constrain(schemas: &mut Value) {
    for (schema, field, keywords) in constraints() {
        let property = &mut schemas[schema]["properties"][field];
        assert!(property.is_object(), "{schema}.{field} is not in the document");
        let nullable = property["type"]
            .as_array()
            .is_some_and(|types| types.iter().any(|kind| kind == "null"));
        let mut keywords = keywords;
        if nullable && let Some(words) = keywords.get_mut("enum").and_then(Value::as_array_mut) {
            words.push(Value::Null);
        }
        merge(property, keywords);
    }
}

/// Writes `from`'s keywords into `into`, object into object.
fn merge(into: &mut Value, from: Value) {
    match (into, from) {
        (Value::Object(into), Value::Object(from)) => {
            for (key, value) in from {
                merge(into.entry(key).or_insert(Value::Null), value);
            }
        }
        (into, from) => *into = from,
    }
}

pub async fn document() -> Json<Value> {
    Json(build())
}

pub async fn explorer() -> Html<&'static str> {
    Html(include_str!("explorer.html"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_referenced_schema_exists() {
        let document = super::build();
        let schemas = document["components"]["schemas"].as_object().expect("schemas");
        let text = document["paths"].to_string();
        for part in text.split("#/components/schemas/").skip(1) {
            let name: String = part.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            assert!(schemas.contains_key(&name), "{name} is referenced but not defined");
        }
        assert!(document["paths"]["/v1/jobs"]["post"]["requestBody"].is_object());
    }

    #[test]
    fn the_router_and_the_document_have_the_same_routes() {
        use std::collections::BTreeSet;
        let routed: BTreeSet<(&str, &str)> = crate::api_routes().added.into_iter().collect();
        let documented: BTreeSet<(&str, &str)> = super::PATHS.iter().map(|op| (op.method, op.path)).collect();
        let undocumented: Vec<_> = routed.difference(&documented).collect();
        let unrouted: Vec<_> = documented.difference(&routed).collect();
        assert!(
            undocumented.is_empty() && unrouted.is_empty(),
            "routed but not in the document: {undocumented:?}; in the document but not routed: {unrouted:?}"
        );
        assert_eq!(routed.len(), crate::api_routes().added.len(), "a route is added twice");
    }

    #[test]
    fn every_operation_has_an_id_its_security_and_its_parameters() {
        let document = super::build();
        let mut ids = std::collections::BTreeSet::new();
        let schemes = document["components"]["securitySchemes"]
            .as_object()
            .expect("security schemes");
        for (path, methods) in document["paths"].as_object().expect("paths") {
            for (method, operation) in methods.as_object().expect("methods") {
                let id = operation["operationId"].as_str().expect("an operationId");
                assert!(ids.insert(id.to_string()), "operationId {id} used twice");
                for requirement in operation["security"].as_array().expect("security") {
                    for scheme in requirement.as_object().expect("a requirement").keys() {
                        assert!(schemes.contains_key(scheme), "{method} {path}: no scheme {scheme}");
                    }
                }
                let named: Vec<&str> = operation["parameters"]
                    .as_array()
                    .map(|parameters| {
                        parameters
                            .iter()
                            .filter(|p| p["in"] == "path")
                            .filter_map(|p| p["name"].as_str())
                            .collect()
                    })
                    .unwrap_or_default();
                let in_path = path.matches('{').count();
                assert_eq!(named.len(), in_path, "{method} {path}: path parameters {named:?}");
            }
        }
        let formats: std::collections::BTreeSet<&str> = document
            .to_string()
            .split("\"format\":\"")
            .skip(1)
            .filter_map(|rest| rest.split('"').next())
            .map(|format| match format {
                "int32" | "int64" | "float" | "double" => "standard",
                _ => "other",
            })
            .collect::<std::collections::BTreeSet<_>>();
        assert_eq!(formats, ["standard"].into(), "a format OpenAPI does not define is left");
        let tier = &document["components"]["schemas"]["JobRequest"]["properties"]["tier"]["enum"];
        assert_eq!(tier, &serde_json::json!(["gold", "silver", "bronze"]));
        assert_eq!(
            document["paths"]["/v1/invoices"]["get"]["parameters"][0]["required"],
            true
        );
        assert_eq!(
            document["paths"]["/v1/agent/heartbeat"]["post"]["security"][0]
                .as_object()
                .map(|r| r.len()),
            Some(4)
        );
        assert_eq!(
            document["paths"]["/v1/health"]["get"]["security"],
            serde_json::json!([])
        );
    }
}
