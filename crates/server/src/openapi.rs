//! The OpenAPI document at `/v1/openapi.json` and a small API explorer page served from the
//! binary (no CDN, works offline). Schemas come from the wire types' derives; the paths are one
//! table here, next to the router, so the two are read together.

use axum::Json;
use axum::response::Html;
use serde_json::{Value, json};
use utoipa::OpenApi;

mod paths;

use paths::{Body, Operation, PATHS, Who};

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
        api::OutputUpload,
        api::OutputView,
        api::WarmRequest,
        api::WarmView,
        api::ReservationRequest,
        api::ReservationView,
        api::ReservationNodeView,
        api::ReservationList,
        api::CalendarView,
        api::CalendarEntry,
        api::OwnProviderRequest,
        api::OwnProviderView,
        api::OwnProviderList,
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
            json!({"allOf": [{"properties": {"replicas": {"const": 1}, "serve": {"type": "null"}, "client_token": {"type": "null"}, "reservation": {"type": "null"}}}]}),
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
            "WarmRequest",
            "nodes",
            json!({"minimum": 1, "maximum": api::WARM_NODES_MAX}),
        ),
        (
            "ReservationRequest",
            "gpus",
            json!({"minimum": 1, "maximum": api::RESERVATION_GPUS_MAX}),
        ),
        (
            "ReservationRequest",
            "hours",
            json!({"minimum": 1, "maximum": api::RESERVATION_HOURS_MAX}),
        ),
        ("ReservationRequest", "gpu_model", json!({"enum": models.clone()})),
        ("ReservationRequest", "topology", json!({"enum": topologies.clone()})),
        (
            "ReservationRequest",
            "max_price_per_gpu_hour",
            json!({"pattern": PRICE}),
        ),
        (
            "ReservationRequest",
            "regions",
            json!({"maxItems": api::REGIONS_MAX, "items": text.clone()}),
        ),
        ("JobRequest", "reservation", json!({"minimum": 1})),
        (
            "OwnProviderRequest",
            "provider_key",
            json!({"minLength": 1, "maxLength": 256, "pattern": PRINTABLE}),
        ),
        (
            "JobRequest",
            "output_url",
            json!({"maxLength": api::TEXT_FIELD_BYTES_MAX, "pattern": r"^https?://[^\x00]*$"}),
        ),
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
            json!({"maxLength": 512, "pattern": r"^https?://[^\s\x00-\x1f\x7f-\x9f]*$"}),
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
