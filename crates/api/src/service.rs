//! Services on the wire: a long-running inference service (`POST /v1/services`), its scale,
//! what `GET /v1/services/{name}` shows, and the checks of each. A service's replicas are jobs:
//! `replica` is the job each one runs (its image or program, resources, tier, price cap,
//! regions), which the coordinator submits with `serve` naming the service and its version.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::{InputError, JobRequest, ServeSpec};

/// Replicas of one service, at most.
pub const SERVICE_REPLICAS_MAX: u32 = 64;
/// A service's windows and timeouts, seconds, at most.
pub const SERVICE_SECONDS_MAX: u32 = 86_400;

fn one() -> u32 {
    1
}
fn ten() -> u32 {
    10
}
fn two_minutes() -> u32 {
    120
}
fn five_minutes() -> u32 {
    300
}
fn one_minute() -> u32 {
    60
}

/// A service: replicas of `replica` behind the gateway at `/s/{name}/…`, between
/// `min_replicas` and `max_replicas`, scaled on in-flight requests per replica and/or p95
/// latency. A service has no maximum runtime: each replica's escrow covers
/// `replica.max_runtime_s` ahead and is renewed while it runs.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ServiceRequest {
    /// Letters, digits and `-`, 1–63 characters, not first.
    pub name: String,
    /// The job each replica runs (`replicas` 1; `serve` is set by the service).
    pub replica: JobRequest,
    /// The port the replica listens on in a container; a process gets a free port in `PORT`.
    #[serde(default)]
    pub port: u16,
    /// The HTTP path answered 2xx when a replica is ready (default `/`).
    #[serde(default)]
    pub health_path: String,
    #[serde(default = "one")]
    pub min_replicas: u32,
    /// Default: `min_replicas` (at least 1).
    #[serde(default)]
    pub max_replicas: Option<u32>,
    /// Replicas above `min_replicas` run on this tier ("bronze": burst on interruptible, the
    /// cheapest capacity); absent: the replica's own tier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst_tier: Option<String>,
    /// Scale up when requests in flight per ready replica pass this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_in_flight: Option<u32>,
    /// Scale up when the p95 latency of the last window passes this (ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_p95_ms: Option<u32>,
    /// How long a target must be passed before a replica is added (default 10 s).
    #[serde(default = "ten")]
    pub scale_up_after_s: u32,
    /// How long the load must stay under half the target before a replica is removed, and
    /// without requests before the last one goes at `min_replicas` 0 (default 120 s).
    #[serde(default = "two_minutes")]
    pub scale_down_after_s: u32,
    /// A replica whose health check has not answered this long after it was placed is ended
    /// and replaced (default 300 s); three such in a row stop the version.
    #[serde(default = "five_minutes")]
    pub health_timeout_s: u32,
    /// At `min_replicas` 0 with none running, how long a request waits for one (default 60 s).
    #[serde(default = "one_minute")]
    pub wake_timeout_s: u32,
}

/// `POST /v1/services/{name}/scale`: new bounds (the autoscaler keeps within them).
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ServiceScale {
    pub min_replicas: u32,
    #[serde(default)]
    pub max_replicas: Option<u32>,
}

/// One replica of a service.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct ServiceReplicaView {
    pub job_id: i64,
    pub lease_id: Option<i64>,
    pub node_id: Option<i64>,
    /// The service version it runs.
    pub version: u32,
    pub tier: String,
    /// queued, starting (placed, its health check not answered yet), ready, or draining
    /// (being preempted: no new requests).
    pub state: String,
    /// Requests in flight to it at this gateway.
    pub in_flight: u32,
}

/// A service: its spec's version and scale, its replicas, and what its callers got from this
/// gateway since it started.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct ServiceView {
    pub name: String,
    /// Lease ids of the ready replicas that serve it.
    pub replicas: Vec<i64>,
    /// Those whose node's tunnel to the gateway is up.
    pub replicas_ready: u64,
    pub requests: u64,
    /// Answers of 5xx, and requests no replica answered.
    pub errors: u64,
    /// Latency to the answer, ms (none before the first request).
    pub p50_ms: Option<f64>,
    pub p95_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    /// From the OpenAI-style `usage` objects of the answers.
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub tokens: u64,
    /// Requests per second over the last minute.
    #[serde(default)]
    pub requests_per_sec: f64,
    /// Set for a deployed service (`service deploy`); absent for jobs that serve a name alone.
    #[serde(default)]
    pub deployed: Option<ServiceDeployment>,
    /// Every live replica (a deployed service's; else the ready ones).
    #[serde(default)]
    pub replica_states: Vec<ServiceReplicaView>,
    /// What its replicas' GPU time cost so far, over the tokens served, per million tokens.
    #[serde(default)]
    pub cost_micros: i64,
    #[serde(default)]
    pub cost_per_million_tokens_micros: Option<i64>,
}

/// A deployed service's spec version and scale.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct ServiceDeployment {
    pub version: i64,
    /// The last version whose roll-out completed (below `version` while one rolls out).
    pub stable_version: i64,
    pub desired_replicas: i64,
    pub min_replicas: u32,
    pub max_replicas: u32,
    /// A stopped roll-out, a version that does not become healthy; empty when all is well.
    pub status: String,
    pub request: ServiceRequest,
}

/// The output of a service's live replicas, oldest first; each chunk's `replica` is the job id
/// of the replica that wrote it.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct ServiceLogs {
    pub name: String,
    pub chunks: Vec<crate::LogChunkView>,
    pub next_after: i64,
}

/// A tenant's services.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct ServiceList {
    pub services: Vec<ServiceView>,
}

fn bad<T>(message: impl Into<String>) -> Result<T, InputError> {
    Err(InputError(message.into()))
}

/// Checks a service or replica name: 1–63 letters, digits and `-`, not first.
pub fn check_service_name(field: &str, name: &str) -> Result<(), InputError> {
    let ok = (1..=63).contains(&name.len())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        && !name.starts_with('-');
    if ok {
        Ok(())
    } else {
        bad(format!(
            "{field}: {name:?} is not 1–63 letters, digits and '-' (not first)"
        ))
    }
}

impl ServiceRequest {
    /// The most replicas it may run.
    pub fn max(&self) -> u32 {
        self.max_replicas.unwrap_or(self.min_replicas.max(1))
    }

    /// Checks the service; its replica's job is checked as a job would be.
    pub fn check(&self) -> Result<(), InputError> {
        check_service_name("name", &self.name)?;
        check_bounds(self.min_replicas, self.max_replicas)?;
        if let Some(tier) = &self.burst_tier
            && !matches!(tier.as_str(), "gold" | "silver" | "bronze")
        {
            return bad(format!("burst_tier: {tier:?} is not gold, silver or bronze"));
        }
        if self.target_in_flight == Some(0) || self.target_p95_ms == Some(0) {
            return bad("target_in_flight and target_p95_ms: above 0 when given");
        }
        for (field, value) in [
            ("scale_up_after_s", self.scale_up_after_s),
            ("scale_down_after_s", self.scale_down_after_s),
            ("health_timeout_s", self.health_timeout_s),
            ("wake_timeout_s", self.wake_timeout_s),
        ] {
            if !(1..=SERVICE_SECONDS_MAX).contains(&value) {
                return bad(format!("{field}: {value} is not 1–{SERVICE_SECONDS_MAX}"));
            }
        }
        if self.replica.replicas != 1 {
            return bad("replica.replicas: a service's replica is one job replica; give min_replicas and max_replicas");
        }
        if self.replica.reservation.is_some() {
            return bad("replica.reservation: a service's replicas run on the market, not inside a booking");
        }
        if self.replica.client_token.is_some() {
            return bad("replica.client_token: the service submits its replicas itself; leave it out");
        }
        if self.replica.serve.is_some() {
            return bad("replica.serve: set by the service (give name, port and health_path on the service)");
        }
        self.replica_job(1, None).to_spec(0, 0, 0, |_| None)?;
        Ok(())
    }

    /// The job of one replica of version `version`, on `tier` (None: the replica's own).
    pub fn replica_job(&self, version: u32, tier: Option<&str>) -> JobRequest {
        let mut job = self.replica.clone();
        if job.name.is_empty() {
            job.name = format!("{}-v{version}", self.name);
        }
        if let Some(tier) = tier {
            job.tier = tier.to_string();
            job.preemptible = tier == "bronze";
        }
        job.client_token = None;
        job.serve = Some(ServeSpec {
            name: self.name.clone(),
            port: self.port,
            health_path: self.health_path.clone(),
            version,
        });
        job
    }
}

/// Checks a service's bounds: 0 ≤ min ≤ max ≤ `SERVICE_REPLICAS_MAX`, max ≥ 1.
pub fn check_bounds(min: u32, max: Option<u32>) -> Result<(), InputError> {
    let max = max.unwrap_or(min.max(1));
    if max == 0 || max > SERVICE_REPLICAS_MAX {
        return bad(format!("max_replicas: {max} is not 1–{SERVICE_REPLICAS_MAX}"));
    }
    if min > max {
        return bad(format!("min_replicas: {min} is more than max_replicas {max}"));
    }
    Ok(())
}

/// What a gateway running as its own process (`fallow gateway`) tells each coordinator it
/// serves for, every second (`POST /v1/gateways`, an admin's key): where agents reach it, and
/// what its callers got, so that `service show`, `/metrics` and the autoscaler count its
/// traffic beside the coordinator's own.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields)]
pub struct GatewayReport {
    /// The URL agents dial for their tunnels (`http://` or `https://`).
    pub url: String,
    #[serde(default)]
    pub region: String,
    /// Each service's counts since the gateway started.
    #[serde(default)]
    pub services: Vec<GatewayServiceStats>,
    /// Requests in flight at the gateway, by replica.
    #[serde(default)]
    pub in_flight: Vec<ReplicaLoad>,
}

/// A service's counts at one gateway since it started.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields)]
pub struct GatewayServiceStats {
    pub tenant_id: i64,
    pub name: String,
    pub requests: u64,
    pub errors: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// The latency histogram's non-empty buckets (the gateway's buckets: each 10 % above the
    /// last, from 50 µs).
    #[serde(default)]
    pub latency: Vec<LatencyBucket>,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, ToSchema, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields)]
pub struct LatencyBucket {
    pub bucket: u32,
    pub count: u64,
}

/// Requests in flight to one replica (its lease).
#[derive(Clone, Copy, Debug, Serialize, Deserialize, ToSchema, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields)]
pub struct ReplicaLoad {
    pub lease_id: i64,
    pub in_flight: u32,
}

/// A gateway that reported recently.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct GatewayView {
    pub url: String,
    pub region: String,
    pub reported_ms_ago: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct GatewayList {
    pub gateways: Vec<GatewayView>,
}

/// Where a gateway sends a caller's requests for a service (`GET /v1/gateway/services/{name}`,
/// with the caller's own key): the service's ready replicas, and how long a request may wait
/// for one.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct ServiceRoute {
    pub tenant_id: i64,
    pub replicas: Vec<RouteReplica>,
    /// A request that finds no replica waits this long for one.
    pub wake_timeout_s: u32,
    /// What the controller last said of the service.
    pub status: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct RouteReplica {
    pub lease_id: i64,
    pub node_id: i64,
    pub region: String,
    pub bronze: bool,
}

/// A node's public key, for a gateway checking the signature of its tunnel.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct GatewayNode {
    pub node_id: i64,
    pub public_key: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(extra: &str) -> Result<ServiceRequest, String> {
        let text = format!(
            r#"{{"name": "chat", "replica": {{"image": "/usr/bin/python3", "tier": "silver",
                "max_price_per_gpu_hour": "2"}}{extra}}}"#
        );
        let request: ServiceRequest = serde_json::from_str(&text).map_err(|error| error.to_string())?;
        request.check().map_err(|error| error.0)?;
        Ok(request)
    }

    #[test]
    fn a_service_defaults_to_one_replica_and_its_jobs_name_it() {
        let request = service("").expect("valid");
        assert_eq!((request.min_replicas, request.max()), (1, 1));
        let job = request.replica_job(3, Some("bronze"));
        let serve = job.serve.expect("serves");
        assert_eq!((serve.name.as_str(), serve.version), ("chat", 3));
        assert_eq!((job.tier.as_str(), job.preemptible), ("bronze", true));
        // The job's spec text names the service first, which the store's lookup relies on.
        let spec = serde_json::to_string(&request.replica_job(1, None)).expect("serialises");
        assert!(spec.contains(r#""serve":{"name":"chat","#), "{spec}");
    }

    #[test]
    fn bad_services_say_what_is_wrong() {
        for (extra, says) in [
            (
                r#", "min_replicas": 3, "max_replicas": 2"#,
                "min_replicas: 3 is more than max_replicas 2",
            ),
            (r#", "max_replicas": 0"#, "max_replicas: 0 is not 1–64"),
            (r#", "max_replicas": 65"#, "max_replicas: 65 is not 1–64"),
            (r#", "burst_tier": "platinum""#, "burst_tier: \"platinum\""),
            (r#", "target_in_flight": 0"#, "target_in_flight and target_p95_ms"),
            (r#", "scale_down_after_s": 0"#, "scale_down_after_s: 0 is not 1–86400"),
        ] {
            let error = service(extra).expect_err(extra);
            assert!(error.contains(says), "{extra}: {error}");
        }
        let bad_name = serde_json::from_str::<ServiceRequest>(
            r#"{"name": "-x", "replica": {"image": "i", "tier": "silver", "max_price_per_gpu_hour": "2"}}"#,
        )
        .expect("parses")
        .check()
        .expect_err("a bad name");
        assert!(bad_name.0.starts_with("name: \"-x\""), "{}", bad_name.0);
        let replicas = serde_json::from_str::<ServiceRequest>(
            r#"{"name": "x", "replica": {"image": "i", "tier": "silver", "max_price_per_gpu_hour": "2", "replicas": 2}}"#,
        )
        .expect("parses")
        .check()
        .expect_err("two replicas per job");
        assert!(replicas.0.starts_with("replica.replicas"), "{}", replicas.0);
        let price = serde_json::from_str::<ServiceRequest>(
            r#"{"name": "x", "replica": {"image": "i", "tier": "silver", "max_price_per_gpu_hour": "-1"}}"#,
        )
        .expect("parses")
        .check()
        .expect_err("a bad price");
        assert!(price.0.contains("max_price_per_gpu_hour"), "{}", price.0);
        let token = serde_json::from_str::<ServiceRequest>(
            r#"{"name": "x", "replica": {"image": "i", "tier": "silver", "max_price_per_gpu_hour": "2", "client_token": "t"}}"#,
        )
        .expect("parses")
        .check()
        .expect_err("a token of the service's own");
        assert!(token.0.starts_with("replica.client_token"), "{}", token.0);
    }
}
