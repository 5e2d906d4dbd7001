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

/// One operation: method, path, who may call, summary, request schema, response schema, success status.
type Operation = (
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    Option<&'static str>,
    Option<&'static str>,
    u16,
);

const PATHS: &[Operation] = &[
    ("get", "/v1/health", "anyone", "Liveness", None, None, 200),
    (
        "get",
        "/v1/market",
        "anyone",
        "Clearing prices per GPU model, region and tier over time; utilisation now",
        None,
        Some("MarketView"),
        200,
    ),
    (
        "post",
        "/v1/jobs",
        "tenant",
        "Submit a job (idempotent with client_token)",
        Some("JobRequest"),
        Some("JobView"),
        201,
    ),
    (
        "get",
        "/v1/jobs",
        "tenant",
        "List your jobs, newest first (?before=&limit=)",
        None,
        Some("JobList"),
        200,
    ),
    (
        "post",
        "/v1/jobs/quote",
        "tenant",
        "What a job would clear at now, and how many GPUs could take it",
        Some("JobRequest"),
        Some("QuoteView"),
        200,
    ),
    (
        "get",
        "/v1/jobs/{id}",
        "tenant",
        "One of your jobs with its leases and cost",
        None,
        Some("JobView"),
        200,
    ),
    (
        "post",
        "/v1/jobs/{id}/cancel",
        "tenant",
        "Cancel a job; its leases stop and its escrow is released",
        None,
        Some("JobView"),
        200,
    ),
    (
        "get",
        "/v1/jobs/{id}/logs",
        "tenant",
        "A job's output from every replica, oldest first (?after=&limit=)",
        None,
        Some("JobLogs"),
        200,
    ),
    (
        "get",
        "/v1/offers",
        "any key",
        "Search offers with a filter (?filter=gpu_model=H100 price<2.5&limit=)",
        None,
        Some("OfferList"),
        200,
    ),
    (
        "get",
        "/v1/balance",
        "any key",
        "Your balances (admins: ?account_id=)",
        None,
        Some("BalanceView"),
        200,
    ),
    (
        "get",
        "/v1/statement",
        "any key",
        "Your ledger lines: usage, holds, credits, earnings",
        None,
        Some("StatementView"),
        200,
    ),
    (
        "get",
        "/v1/invoices",
        "tenant",
        "Your invoice for a month (?period=YYYY-MM; admins add &account_id=)",
        None,
        Some("InvoiceView"),
        200,
    ),
    (
        "post",
        "/v1/nodes",
        "provider",
        "Register a node with its agent's public key",
        Some("NodeRegistration"),
        Some("NodeView"),
        201,
    ),
    ("get", "/v1/nodes", "provider", "Your nodes", None, None, 200),
    (
        "post",
        "/v1/nodes/batch",
        "provider",
        "Register up to 1,000 nodes in one request, all or none",
        Some("NodeBatchRegistration"),
        Some("NodeBatchView"),
        201,
    ),
    (
        "get",
        "/v1/nodes/{id}",
        "provider",
        "One of your nodes, with reliability and telemetry",
        None,
        Some("NodeView"),
        200,
    ),
    (
        "put",
        "/v1/nodes/{id}/policy",
        "provider",
        "Set a node's prices, schedule, calendar and limits",
        Some("PolicyDoc"),
        Some("NodeView"),
        200,
    ),
    (
        "post",
        "/v1/nodes/{id}/reclaim",
        "provider",
        "Take GPUs of a node back: idle first, bronze on them stops after the grace, firm work runs on unless forced (docs/trust-policy.md § 8)",
        Some("ReclaimRequest"),
        Some("ReclaimView"),
        200,
    ),
    (
        "delete",
        "/v1/nodes/{id}/reclaim",
        "provider",
        "Give a node's reclaimed GPUs back to the market",
        None,
        Some("ReclaimView"),
        200,
    ),
    (
        "post",
        "/v1/services",
        "tenant",
        "Deploy a service: replicas of a job behind the gateway at /s/{name}/, autoscaled",
        Some("ServiceRequest"),
        Some("ServiceView"),
        201,
    ),
    (
        "get",
        "/v1/services",
        "tenant",
        "Your services",
        None,
        Some("ServiceList"),
        200,
    ),
    (
        "get",
        "/v1/services/{name}",
        "tenant",
        "A service served through the gateway: replicas, requests, errors, latency, tokens",
        None,
        Some("ServiceView"),
        200,
    ),
    (
        "put",
        "/v1/services/{name}",
        "tenant",
        "A new spec for a service: a changed replica rolls out one at a time",
        Some("ServiceRequest"),
        Some("ServiceView"),
        200,
    ),
    (
        "delete",
        "/v1/services/{name}",
        "tenant",
        "Delete a service: its replicas stop",
        None,
        Some("ServiceView"),
        200,
    ),
    (
        "post",
        "/v1/services/{name}/scale",
        "tenant",
        "New bounds for a service's replicas",
        Some("ServiceScale"),
        Some("ServiceView"),
        200,
    ),
    (
        "post",
        "/v1/services/{name}/keys",
        "tenant",
        "A key that calls this service through the gateway and nothing else (shown once)",
        None,
        Some("NewKeyResponse"),
        201,
    ),
    (
        "delete",
        "/v1/services/{name}/keys/{key_id}",
        "tenant",
        "Revoke a key of this service",
        None,
        None,
        204,
    ),
    (
        "get",
        "/v1/services/{name}/logs",
        "tenant",
        "The output of a service's live replicas",
        None,
        Some("ServiceLogs"),
        200,
    ),
    (
        "post",
        "/v1/gateways",
        "admin",
        "A gateway running on its own reports where agents reach it and what its callers got",
        Some("GatewayReport"),
        Some("GatewayList"),
        200,
    ),
    (
        "get",
        "/v1/gateways",
        "admin",
        "The gateways running on their own that reported lately",
        None,
        Some("GatewayList"),
        200,
    ),
    (
        "get",
        "/v1/gateway/services/{name}",
        "tenant",
        "Where a gateway sends the caller's requests for a service: its ready replicas",
        None,
        Some("ServiceRoute"),
        200,
    ),
    (
        "get",
        "/v1/gateway/nodes/{id}",
        "admin",
        "A node's public key, for a gateway checking its tunnel's signature",
        None,
        Some("GatewayNode"),
        200,
    ),
    (
        "get",
        "/v1/sites",
        "any key",
        "Sites with the coordinates admins set for them",
        None,
        None,
        200,
    ),
    (
        "put",
        "/v1/sites/{name}",
        "admin",
        "Set a site's coordinates: its nodes that declare none take them",
        Some("SiteRequest"),
        Some("SiteView"),
        200,
    ),
    (
        "get",
        "/v1/earnings",
        "provider",
        "Earnings, fill rate and reliability per node",
        None,
        Some("EarningsView"),
        200,
    ),
    (
        "post",
        "/v1/agent/heartbeat",
        "agent (signed)",
        "Heartbeat with telemetry; answers the leases to run",
        Some("HeartbeatRequest"),
        Some("HeartbeatResponse"),
        200,
    ),
    (
        "get",
        "/v1/agent/leases",
        "agent (signed)",
        "Long-poll the node's leases (?wait_ms=&known=)",
        None,
        Some("LeaseSet"),
        200,
    ),
    (
        "post",
        "/v1/agent/leases/{id}/events",
        "agent (signed)",
        "Report a lease's state (fenced by epoch)",
        Some("LeaseEventRequest"),
        Some("LeaseView"),
        200,
    ),
    (
        "post",
        "/v1/agent/leases/{id}/progress",
        "agent (signed)",
        "Report what a replica has done so far (tokens, samples…), fenced by epoch",
        Some("ProgressRequest"),
        None,
        200,
    ),
    (
        "post",
        "/v1/agent/key",
        "agent (signed)",
        "Replace the node's key with a new one (signed by the current key)",
        Some("KeyRotation"),
        Some("NodeView"),
        200,
    ),
    (
        "put",
        "/v1/agent/node",
        "agent (signed)",
        "Restate the node's name, place, NVLink domain, gang ports and runtimes (and asks and limits when given) on start",
        Some("NodeRestatement"),
        Some("NodeView"),
        200,
    ),
    (
        "post",
        "/v1/agent/reclaim",
        "agent (signed)",
        "Take GPUs of this node back from its host (`fallow agent reclaim`, `pause`)",
        Some("ReclaimRequest"),
        Some("ReclaimView"),
        200,
    ),
    (
        "post",
        "/v1/agent/resume",
        "agent (signed)",
        "Give this node's reclaimed GPUs back to the market from its host",
        None,
        Some("ReclaimView"),
        200,
    ),
    (
        "post",
        "/v1/agent/leases/{id}/logs",
        "agent (signed)",
        "Send a chunk of a replica's output (fenced by epoch; idempotent by byte offset)",
        Some("LogChunkRequest"),
        Some("LogChunkAccepted"),
        200,
    ),
    (
        "post",
        "/v1/agent/usage",
        "agent (signed)",
        "A signed usage record (accepted once)",
        Some("SignedUsage"),
        Some("UsageAccepted"),
        200,
    ),
    (
        "post",
        "/v1/agent/attestations",
        "agent (signed)",
        "A signed completion attestation",
        Some("SignedAttestation"),
        Some("LeaseView"),
        200,
    ),
    (
        "post",
        "/v1/admin/accounts",
        "admin",
        "Create an account and its first API key",
        Some("NewAccountRequest"),
        Some("NewAccountResponse"),
        201,
    ),
    ("get", "/v1/admin/accounts", "admin", "List accounts", None, None, 200),
    (
        "post",
        "/v1/accounts/{id}/keys",
        "admin or owner",
        "Create another API key",
        Some("NewKeyRequest"),
        Some("NewKeyResponse"),
        201,
    ),
    (
        "get",
        "/v1/accounts/{id}/keys",
        "admin or owner",
        "List an account's keys (never the secrets)",
        None,
        None,
        200,
    ),
    (
        "post",
        "/v1/keys/{key_id}/revoke",
        "admin or owner",
        "Revoke a key",
        None,
        None,
        204,
    ),
    (
        "post",
        "/v1/keys/rotate",
        "any key",
        "A new key for your account; the one used is revoked",
        None,
        Some("NewKeyResponse"),
        201,
    ),
    (
        "post",
        "/v1/admin/credits",
        "admin",
        "Credit a tenant (the stand-in for a payment provider)",
        Some("CreditRequest"),
        Some("BalanceView"),
        200,
    ),
    (
        "get",
        "/v1/admin/evidence",
        "admin",
        "Refused signatures, replays, reports for foreign leases, violating usage records, drops and absences",
        None,
        None,
        200,
    ),
    (
        "post",
        "/v1/agent/canaries",
        "agent (signed)",
        "A canary's signed result (docs/trust-policy.md § 3); answers the finding, or a matmul canary's challenge",
        Some("SignedCanaryResult"),
        Some("CanaryAccepted"),
        200,
    ),
    (
        "post",
        "/v1/agent/canaries/{id}/proof",
        "agent (signed)",
        "A matmul canary's proof: the rows of each GPU's product its challenge asked for, with their Merkle paths; answers the finding",
        Some("CanaryProof"),
        Some("CanaryAccepted"),
        200,
    ),
    (
        "get",
        "/v1/trust",
        "provider, admin",
        "A provider's standing: badge, bond, reputation with its inputs, nodes' canaries, fraud decided (admins: ?provider_id=)",
        None,
        Some("TrustView"),
        200,
    ),
    (
        "post",
        "/v1/provider/bond",
        "provider",
        "Post a bond from your earnings (idempotent by key)",
        Some("BondRequest"),
        Some("TrustView"),
        200,
    ),
    (
        "post",
        "/v1/admin/bonds",
        "admin",
        "Post a bond paid in from outside for a provider (idempotent by key)",
        Some("BondRequest"),
        Some("TrustView"),
        200,
    ),
    (
        "get",
        "/v1/frauds",
        "tenant, provider, admin",
        "Fraud decisions that concern you, with the rule, the amounts, the refunds and the evidence",
        None,
        None,
        200,
    ),
    (
        "get",
        "/v1/nodes/{id}/canaries",
        "provider, admin",
        "A node's canaries with their signed results, newest first",
        None,
        None,
        200,
    ),
    (
        "post",
        "/v1/nodes/{id}/verify",
        "provider, admin",
        "Order a canary on the node now (re-verification after a cordon)",
        None,
        Some("CanaryView"),
        201,
    ),
];

fn reference(name: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{name}")})
}

pub fn build() -> Value {
    let mut document = serde_json::to_value(Schemas::openapi()).expect("the schemas serialise");
    let mut paths = serde_json::Map::new();
    for (method, path, who, summary, request, response, status) in PATHS {
        let mut operation = json!({
            "summary": summary,
            "description": format!("Caller: {who}. Agents sign requests with x-fallow-node, x-fallow-timestamp, x-fallow-nonce and x-fallow-signature; others send Authorization: Bearer <API key>."),
            "responses": {
                status.to_string(): {"description": "success"},
                "4XX": {"description": "what is wrong, in words", "content": {"application/json": {"schema": reference("ErrorBody")}}}
            }
        });
        if let Some(response) = response {
            operation["responses"][status.to_string()]["content"] =
                json!({"application/json": {"schema": reference(response)}});
        }
        if let Some(request) = request {
            operation["requestBody"] =
                json!({"required": true, "content": {"application/json": {"schema": reference(request)}}});
        }
        let names: Vec<&str> = path
            .split('{')
            .skip(1)
            .filter_map(|rest| rest.split_once('}').map(|(name, _)| name))
            .collect();
        if !names.is_empty() {
            operation["parameters"] = names
                .iter()
                .map(|name| json!({"name": name, "in": "path", "required": true, "schema": {"type": "string"}}))
                .collect();
        }
        let entry = paths.entry(path.to_string()).or_insert_with(|| json!({}));
        entry[*method] = operation;
    }
    document["paths"] = Value::Object(paths);
    document["info"]["version"] = json!(env!("CARGO_PKG_VERSION"));
    document
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
}
