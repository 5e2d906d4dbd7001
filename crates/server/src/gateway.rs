//! The gateway's data plane: the agents' tunnels and the requests sent through them.
//!
//! Provider nodes are often behind NAT, so the gateway never dials a node. Each agent keeps one
//! outbound connection to the coordinator (`POST /v1/agent/tunnel`, signed like every agent
//! request), upgraded to the `fallow-tunnel` protocol; over it the gateway is the HTTP/2 client
//! and the agent the server. A request for a service goes to one of its ready replicas, named in
//! the `x-fallow-lease` header; the agent forwards it to the replica's port and streams the
//! answer back, so server-sent events and chunked answers pass through as they come.
//!
//! Which replicas serve which service is the routes' business (they read the store); this module
//! keeps the tunnels by node, the requests in flight by replica (least outstanding wins), a short
//! cache of each service's replicas, and the retry of a request no replica answered. It holds
//! nothing that cannot be rebuilt: tunnels come back when agents reconnect, the cache refills.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, Uri, header};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::TokioExecutor;

/// The header naming the replica (its lease id) a tunnelled request is for.
pub const LEASE_HEADER: &str = "x-fallow-lease";
/// Set by the agent on an answer it gave itself because the replica could not be reached (not
/// running, not ready, refused the connection): the request never reached it, so it may go to
/// another replica whatever its method.
pub const UNREACHED_HEADER: &str = "x-fallow-unreached";
/// Set by the agent on an answer it gave itself because the replica broke the connection after
/// it got the request (it may have acted on it): repeated only when the request may be.
pub const FAILED_HEADER: &str = "x-fallow-replica-failed";
/// The protocol a tunnel's connection upgrades to.
pub const TUNNEL_PROTOCOL: &str = "fallow-tunnel";
/// A request marked safe to send twice by its caller (besides the idempotent methods).
pub const RETRY_HEADER: &str = "x-fallow-retry";
/// How long a service's replicas are read from the cache before the store is asked again.
pub const DIRECTORY_TTL: Duration = Duration::from_millis(500);
/// The largest request body the gateway takes (it is kept, to send again on a retry).
pub const REQUEST_BYTES_MAX: usize = 16 << 20;

/// Answers up to this size (by their `content-length`) are read whole before they are passed on.
pub const BUFFERED_BYTES_MAX: u64 = 1 << 20;

/// The most replicas one request is tried on.
pub const ATTEMPTS_MAX: usize = 8;

/// A replica that serves: its lease, the node whose tunnel reaches it, the node's region, and
/// whether it is bronze (interruptible, the cheapest).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    pub lease_id: i64,
    pub node_id: i64,
    pub region: String,
    pub bronze: bool,
}

impl Endpoint {
    /// A ready replica as a coordinator tells a gateway running on its own.
    pub fn of_route(replica: &api::RouteReplica) -> Endpoint {
        Endpoint {
            lease_id: replica.lease_id,
            node_id: replica.node_id,
            region: replica.region.clone(),
            bronze: replica.bronze,
        }
    }

    pub fn route(&self) -> api::RouteReplica {
        api::RouteReplica {
            lease_id: self.lease_id,
            node_id: self.node_id,
            region: self.region.clone(),
            bronze: self.bronze,
        }
    }

    /// A ready replica as the store lists it.
    pub fn of(replica: &store::ServingLease) -> Endpoint {
        Endpoint {
            lease_id: replica.lease_id,
            node_id: replica.node_id,
            region: replica.region.clone(),
            bronze: replica.tier == "bronze",
        }
    }
}

/// How a request wants to be routed: from the caller's region (`x-fallow-region`), and whether
/// it is non-urgent (`x-fallow-priority: low`: bronze replicas first).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Preference {
    pub region: Option<String>,
    pub low_priority: bool,
}

impl Preference {
    pub fn of(headers: &HeaderMap) -> Preference {
        let text = |name: &str| headers.get(name).and_then(|value| value.to_str().ok()).map(str::trim);
        Preference {
            region: text(REGION_HEADER)
                .filter(|region| !region.is_empty())
                .map(str::to_string),
            low_priority: text(PRIORITY_HEADER).is_some_and(|priority| priority.eq_ignore_ascii_case("low")),
        }
    }
}

/// The caller's region, for routing to the nearest replicas.
pub const REGION_HEADER: &str = "x-fallow-region";
/// `low`: a non-urgent request, sent to bronze replicas when the service has any.
pub const PRIORITY_HEADER: &str = "x-fallow-priority";
/// A replica outside the caller's region counts as this many more requests in flight: the
/// nearest replicas take the traffic until they are this much busier than a far one.
pub const OTHER_REGION_LOAD: u32 = 4;

/// The candidate to send to: `(in flight, region matches, bronze)` of each connected, untried
/// replica. A low-priority request goes to bronze replicas when there are any; every request
/// prefers its own region by `OTHER_REGION_LOAD`; the first of equals wins (the caller rotates
/// the order).
pub fn choose(candidates: &[(u32, bool, bool)], low_priority: bool) -> Option<usize> {
    let bronze_only = low_priority && candidates.iter().any(|(_, _, bronze)| *bronze);
    candidates
        .iter()
        .enumerate()
        .filter(|(_, (_, _, bronze))| !bronze_only || *bronze)
        .min_by_key(|(index, (load, near, _))| (load.saturating_add(if *near { 0 } else { OTHER_REGION_LOAD }), *index))
        .map(|(index, _)| index)
}

struct Tunnel {
    generation: u64,
    sender: SendRequest<Body>,
}

type Services = HashMap<(i64, String), (Instant, Arc<Vec<Endpoint>>)>;
/// A service's stats as sampled: (µs, stats then), oldest first.
type Samples = VecDeque<(i64, ServiceStats)>;

/// Latency buckets: each 10 % above the last, from 50 µs (the last catches everything past
/// about 7 minutes), so a quantile read from them is within 10 %.
const LATENCY_BUCKETS: usize = 160;
const LATENCY_FIRST_US: f64 = 50.0;
const LATENCY_GROWTH: f64 = 1.1;

/// What a service's callers got from the gateway since it started: requests, errors (5xx and
/// unanswered), latency to the answer (its whole body when buffered, its head when streamed),
/// and the tokens that OpenAI-style answers reported in their `usage`.
#[derive(Clone, Debug)]
pub struct ServiceStats {
    pub requests: u64,
    pub errors: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    latency: Vec<u64>,
}

impl Default for ServiceStats {
    fn default() -> ServiceStats {
        ServiceStats {
            requests: 0,
            errors: 0,
            prompt_tokens: 0,
            completion_tokens: 0,
            latency: vec![0; LATENCY_BUCKETS],
        }
    }
}

impl ServiceStats {
    /// Adds `other`'s counts (another gateway's) to these.
    fn add(&mut self, other: &ServiceStats) {
        // Saturating: the counts come from other processes' reports.
        self.requests = self.requests.saturating_add(other.requests);
        self.errors = self.errors.saturating_add(other.errors);
        self.prompt_tokens = self.prompt_tokens.saturating_add(other.prompt_tokens);
        self.completion_tokens = self.completion_tokens.saturating_add(other.completion_tokens);
        for (mine, theirs) in self.latency.iter_mut().zip(&other.latency) {
            *mine = mine.saturating_add(*theirs);
        }
    }

    /// These counts as a gateway reports them.
    pub fn report(&self, tenant_id: i64, name: &str) -> api::GatewayServiceStats {
        api::GatewayServiceStats {
            tenant_id,
            name: name.to_string(),
            requests: self.requests,
            errors: self.errors,
            prompt_tokens: self.prompt_tokens,
            completion_tokens: self.completion_tokens,
            latency: self
                .latency
                .iter()
                .enumerate()
                .filter(|(_, count)| **count > 0)
                .map(|(bucket, count)| api::LatencyBucket {
                    bucket: bucket as u32,
                    count: *count,
                })
                .collect(),
        }
    }

    /// A gateway's reported counts (buckets past the last are counted in the last).
    pub fn of_report(report: &api::GatewayServiceStats) -> ServiceStats {
        let mut stats = ServiceStats {
            requests: report.requests,
            errors: report.errors,
            prompt_tokens: report.prompt_tokens,
            completion_tokens: report.completion_tokens,
            ..ServiceStats::default()
        };
        for bucket in &report.latency {
            let count = &mut stats.latency[(bucket.bucket as usize).min(LATENCY_BUCKETS - 1)];
            *count = count.saturating_add(bucket.count);
        }
        stats
    }

    fn bucket(micros: f64) -> usize {
        if micros <= LATENCY_FIRST_US {
            return 0;
        }
        (((micros / LATENCY_FIRST_US).ln() / LATENCY_GROWTH.ln()).ceil() as usize).min(LATENCY_BUCKETS - 1)
    }

    /// What happened between `earlier` (a sample of the same service) and these.
    pub fn since(&self, earlier: &ServiceStats) -> ServiceStats {
        ServiceStats {
            requests: self.requests.saturating_sub(earlier.requests),
            errors: self.errors.saturating_sub(earlier.errors),
            prompt_tokens: self.prompt_tokens.saturating_sub(earlier.prompt_tokens),
            completion_tokens: self.completion_tokens.saturating_sub(earlier.completion_tokens),
            latency: self
                .latency
                .iter()
                .zip(&earlier.latency)
                .map(|(now, then)| now.saturating_sub(*then))
                .collect(),
        }
    }

    /// The latency (ms) under which `quantile` of the requests were answered: the upper bound of
    /// its bucket; None before the first request.
    pub fn quantile_ms(&self, quantile: f64) -> Option<f64> {
        let total = self
            .latency
            .iter()
            .fold(0u64, |total, count| total.saturating_add(*count));
        if total == 0 {
            return None;
        }
        let rank = ((total as f64) * quantile).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (bucket, count) in self.latency.iter().enumerate() {
            seen = count.saturating_add(seen);
            if seen >= rank {
                return Some(LATENCY_FIRST_US * LATENCY_GROWTH.powi(bucket as i32) / 1000.0);
            }
        }
        None
    }
}

/// One answered (or unanswered) request, for its service's stats.
#[derive(Clone, Copy, Debug, Default)]
pub struct Outcome {
    pub error: bool,
    pub micros: u64,
    /// Prompt and completion tokens of an OpenAI-style `usage` object in a buffered answer.
    pub tokens: Option<(u64, u64)>,
}

impl Outcome {
    /// A request that got an error without reaching a replica, `started` when it came.
    pub fn failed(started: Instant) -> Outcome {
        Outcome {
            error: true,
            micros: started.elapsed().as_micros() as u64,
            tokens: None,
        }
    }
}

/// The gateway's state: tunnels by node, requests in flight by lease, services' replicas cached.
#[derive(Default)]
pub struct Gateway {
    tunnels: RwLock<HashMap<i64, Tunnel>>,
    generation: AtomicU64,
    in_flight: Mutex<HashMap<i64, Arc<AtomicU32>>>,
    services: Mutex<Services>,
    /// Spreads ties between equally loaded replicas.
    turn: AtomicU64,
    stats: Mutex<HashMap<(i64, String), ServiceStats>>,
    /// Each service's stats as sampled by the leader's controller (`sample`), oldest first:
    /// the windows its autoscaler reads, and the dashboard's charts.
    history: Mutex<HashMap<(i64, String), Samples>>,
    /// When a request last found a service scaled to zero and asked for a replica.
    wakes: Mutex<HashMap<(i64, String), Instant>>,
    /// What gateways running as their own processes last reported, by their URL.
    others: Mutex<HashMap<String, Other>>,
}

/// A gateway running as its own process, as it last reported.
struct Other {
    region: String,
    at: Instant,
    stats: HashMap<(i64, String), ServiceStats>,
    in_flight: HashMap<i64, u32>,
}

/// A gateway that has not reported for this long is no longer given to agents, and its
/// requests in flight no longer count.
pub const OTHER_LIVE: Duration = Duration::from_secs(15);
/// A gateway silent this long is forgotten, its counts with it (they are cumulative: while it
/// is kept, a service's totals do not drop when it stops).
pub const OTHER_KEPT: Duration = Duration::from_secs(600);

/// Samples of a service's stats kept, at most (one a second: ten minutes).
pub const HISTORY_SAMPLES_MAX: usize = 600;

/// Why a request could not be answered by a replica.
#[derive(Debug, PartialEq, Eq)]
pub enum Unanswered {
    /// No replica of the service is ready with its node's tunnel up.
    NoReplica,
    /// Every replica tried failed before answering (the last error).
    Failed(String),
}

impl Gateway {
    /// Takes over an upgraded connection from node `node_id` as its tunnel: the gateway's HTTP/2
    /// client runs over it until it closes (a newer tunnel of the node replaces it). Returns
    /// the 101 answer that hands the connection over.
    pub fn accept(self: &Arc<Self>, node_id: i64, upgrade: hyper::upgrade::OnUpgrade) -> Response<Body> {
        let gateway = Arc::clone(self);
        tokio::spawn(async move {
            let upgraded = match upgrade.await {
                Ok(upgraded) => upgraded,
                Err(error) => {
                    tracing::warn!(node = node_id, %error, "a tunnel's upgrade failed");
                    return;
                }
            };
            let mut builder = hyper::client::conn::http2::Builder::new(TokioExecutor::new());
            builder
                .timer(hyper_util::rt::TokioTimer::new())
                .initial_stream_window_size(1 << 20)
                .initial_connection_window_size(8 << 20)
                .max_concurrent_reset_streams(1024)
                .keep_alive_interval(Duration::from_secs(10))
                .keep_alive_timeout(Duration::from_secs(20));
            let (sender, connection) = match builder.handshake(upgraded).await {
                Ok(pair) => pair,
                Err(error) => {
                    tracing::warn!(node = node_id, %error, "a tunnel's HTTP/2 handshake failed");
                    return;
                }
            };
            let generation = gateway.generation.fetch_add(1, Ordering::Relaxed) + 1;
            gateway
                .tunnels
                .write()
                .expect("tunnels lock")
                .insert(node_id, Tunnel { generation, sender });
            tracing::info!(node = node_id, "tunnel up");
            if let Err(error) = connection.await {
                tracing::info!(node = node_id, %error, "tunnel closed");
            }
            let mut tunnels = gateway.tunnels.write().expect("tunnels lock");
            if tunnels
                .get(&node_id)
                .is_some_and(|tunnel| tunnel.generation == generation)
            {
                tunnels.remove(&node_id);
            }
        });
        let mut response = Response::new(Body::empty());
        *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        let headers = response.headers_mut();
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(header::UPGRADE, HeaderValue::from_static(TUNNEL_PROTOCOL));
        response
    }

    /// Counts a request to `tenant_id`'s service `name`.
    pub fn record(&self, tenant_id: i64, name: &str, outcome: Outcome) {
        let mut stats = self.stats.lock().expect("stats lock");
        let entry = stats.entry((tenant_id, name.to_string())).or_default();
        entry.requests += 1;
        entry.errors += u64::from(outcome.error);
        entry.latency[ServiceStats::bucket(outcome.micros as f64)] += 1;
        if let Some((prompt, completion)) = outcome.tokens {
            entry.prompt_tokens += prompt;
            entry.completion_tokens += completion;
        }
    }

    /// A service's stats at this gateway and those that report to it (default when it has
    /// had no request).
    pub fn stats(&self, tenant_id: i64, name: &str) -> ServiceStats {
        let key = (tenant_id, name.to_string());
        let mut total = self
            .stats
            .lock()
            .expect("stats lock")
            .get(&key)
            .cloned()
            .unwrap_or_default();
        for other in self.others.lock().expect("others lock").values() {
            if let Some(theirs) = other.stats.get(&key) {
                total.add(theirs);
            }
        }
        total
    }

    /// Every service's stats, by tenant and name, with those of the gateways that report here.
    pub fn all_stats(&self) -> Vec<((i64, String), ServiceStats)> {
        let mut all: HashMap<(i64, String), ServiceStats> = self.stats.lock().expect("stats lock").clone();
        for other in self.others.lock().expect("others lock").values() {
            for (key, theirs) in &other.stats {
                all.entry(key.clone()).or_default().add(theirs);
            }
        }
        let mut all: Vec<_> = all.into_iter().collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// This gateway's own stats, as it reports them to the coordinators.
    pub fn own_report(&self, url: &str, region: &str) -> api::GatewayReport {
        let services = self
            .stats
            .lock()
            .expect("stats lock")
            .iter()
            .map(|((tenant_id, name), stats)| stats.report(*tenant_id, name))
            .collect();
        let in_flight = self
            .in_flight
            .lock()
            .expect("in-flight lock")
            .iter()
            .map(|(lease_id, counter)| api::ReplicaLoad {
                lease_id: *lease_id,
                in_flight: counter.load(Ordering::Relaxed),
            })
            .filter(|load| load.in_flight > 0)
            .collect();
        api::GatewayReport {
            url: url.to_string(),
            region: region.to_string(),
            services,
            in_flight,
        }
    }

    /// Keeps what a gateway running on its own reported; forgets those silent past
    /// `OTHER_KEPT`.
    pub fn report(&self, report: &api::GatewayReport) {
        let stats = report
            .services
            .iter()
            .map(|service| {
                (
                    (service.tenant_id, service.name.clone()),
                    ServiceStats::of_report(service),
                )
            })
            .collect();
        let in_flight = report
            .in_flight
            .iter()
            .map(|load| (load.lease_id, load.in_flight))
            .collect();
        let mut others = self.others.lock().expect("others lock");
        others.retain(|_, other| other.at.elapsed() < OTHER_KEPT);
        others.insert(
            report.url.clone(),
            Other {
                region: report.region.clone(),
                at: Instant::now(),
                stats,
                in_flight,
            },
        );
    }

    /// The gateways that reported within `OTHER_LIVE`: (URL, region, since their report).
    pub fn others(&self) -> Vec<(String, String, Duration)> {
        let others = self.others.lock().expect("others lock");
        let mut live: Vec<_> = others
            .iter()
            .filter(|(_, other)| other.at.elapsed() < OTHER_LIVE)
            .map(|(url, other)| (url.clone(), other.region.clone(), other.at.elapsed()))
            .collect();
        live.sort();
        live
    }

    /// Keeps a sample of a service's stats at `now` (µs), forgetting those past
    /// `HISTORY_SAMPLES_MAX`.
    pub fn sample(&self, tenant_id: i64, name: &str, now: i64) {
        let stats = self.stats(tenant_id, name);
        let mut history = self.history.lock().expect("history lock");
        let samples = history.entry((tenant_id, name.to_string())).or_default();
        samples.push_back((now, stats));
        while samples.len() > HISTORY_SAMPLES_MAX {
            samples.pop_front();
        }
    }

    /// What a service's callers got over the last `span` µs before `now`, from the samples:
    /// the seconds the window really covers and the stats in it; None without two samples.
    pub fn window(&self, tenant_id: i64, name: &str, now: i64, span: i64) -> Option<(f64, ServiceStats)> {
        let history = self.history.lock().expect("history lock");
        let samples = history.get(&(tenant_id, name.to_string()))?;
        let (last_at, last) = samples.back()?;
        let (first_at, first) = samples.iter().find(|(at, _)| *at >= now - span)?;
        (last_at > first_at).then(|| ((last_at - first_at) as f64 / 1e6, last.since(first)))
    }

    /// A service's samples, oldest first: (µs, stats then).
    pub fn history(&self, tenant_id: i64, name: &str) -> Vec<(i64, ServiceStats)> {
        let history = self.history.lock().expect("history lock");
        history
            .get(&(tenant_id, name.to_string()))
            .map(|samples| samples.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Forgets what is kept of a service (it was deleted).
    pub fn forget(&self, tenant_id: i64, name: &str) {
        let key = (tenant_id, name.to_string());
        self.history.lock().expect("history lock").remove(&key);
        self.stats.lock().expect("stats lock").remove(&key);
        for other in self.others.lock().expect("others lock").values_mut() {
            other.stats.remove(&key);
        }
        self.services.lock().expect("services lock").remove(&key);
        self.wakes.lock().expect("wakes lock").remove(&key);
    }

    /// A request found the service with no replica and waits for one.
    pub fn wake(&self, tenant_id: i64, name: &str) {
        let mut wakes = self.wakes.lock().expect("wakes lock");
        wakes.insert((tenant_id, name.to_string()), Instant::now());
    }

    /// Whether a request asked for a replica of the service within `within`.
    pub fn woken_within(&self, tenant_id: i64, name: &str, within: Duration) -> bool {
        let wakes = self.wakes.lock().expect("wakes lock");
        wakes
            .get(&(tenant_id, name.to_string()))
            .is_some_and(|at| at.elapsed() < within)
    }

    /// Forgets the cached replicas of a service, so the next request reads the store.
    pub fn invalidate(&self, tenant_id: i64, name: &str) {
        self.services
            .lock()
            .expect("services lock")
            .remove(&(tenant_id, name.to_string()));
    }

    /// How many of `endpoints` are reachable: their node's tunnel is up.
    pub fn reachable(&self, endpoints: &[Endpoint]) -> usize {
        let tunnels = self.tunnels.read().expect("tunnels lock");
        endpoints
            .iter()
            .filter(|endpoint| {
                tunnels
                    .get(&endpoint.node_id)
                    .is_some_and(|tunnel| !tunnel.sender.is_closed())
            })
            .count()
    }

    /// How many nodes have a tunnel up.
    pub fn tunnels_up(&self) -> usize {
        self.tunnels.read().expect("tunnels lock").len()
    }

    /// A service's replicas as last read from the store, while fresh.
    pub fn cached(&self, tenant_id: i64, name: &str) -> Option<Arc<Vec<Endpoint>>> {
        let services = self.services.lock().expect("services lock");
        let (at, endpoints) = services.get(&(tenant_id, name.to_string()))?;
        (at.elapsed() < DIRECTORY_TTL).then(|| Arc::clone(endpoints))
    }

    /// Keeps a service's replicas as just read from the store.
    pub fn remember(&self, tenant_id: i64, name: &str, endpoints: Vec<Endpoint>) -> Arc<Vec<Endpoint>> {
        let endpoints = Arc::new(endpoints);
        let mut services = self.services.lock().expect("services lock");
        if services.len() > 100_000 {
            services.retain(|_, (at, _)| at.elapsed() < DIRECTORY_TTL);
        }
        services.insert((tenant_id, name.to_string()), (Instant::now(), Arc::clone(&endpoints)));
        endpoints
    }

    /// Requests in flight to the replica of `lease_id`, here and at the gateways that report
    /// here.
    pub fn in_flight(&self, lease_id: i64) -> u32 {
        let elsewhere: u32 = self
            .others
            .lock()
            .expect("others lock")
            .values()
            .filter(|other| other.at.elapsed() < OTHER_LIVE)
            .filter_map(|other| other.in_flight.get(&lease_id))
            .fold(0u32, |total, count| total.saturating_add(*count));
        self.counter(lease_id).load(Ordering::Relaxed).saturating_add(elsewhere)
    }

    /// Forgets the counters of replicas with nothing in flight (a counter at zero says nothing;
    /// one is made again on the next request), so ended leases leave none behind.
    pub fn prune(&self) {
        let mut counters = self.in_flight.lock().expect("in-flight lock");
        counters.retain(|_, counter| counter.load(Ordering::Relaxed) > 0);
    }

    fn counter(&self, lease_id: i64) -> Arc<AtomicU32> {
        let mut counters = self.in_flight.lock().expect("in-flight lock");
        Arc::clone(counters.entry(lease_id).or_default())
    }

    /// The replica to try next among the connected, untried ones (see `choose`), with its
    /// tunnel.
    fn pick(&self, endpoints: &[Endpoint], tried: &[i64], preference: &Preference) -> Option<(i64, SendRequest<Body>)> {
        let tunnels = self.tunnels.read().expect("tunnels lock");
        let turn = self.turn.fetch_add(1, Ordering::Relaxed) as usize;
        let count = endpoints.len();
        let mut candidates = Vec::with_capacity(count);
        let mut senders = Vec::with_capacity(count);
        for offset in 0..count {
            let endpoint = &endpoints[(turn + offset) % count];
            if tried.contains(&endpoint.lease_id) {
                continue;
            }
            let Some(tunnel) = tunnels.get(&endpoint.node_id) else {
                continue;
            };
            if tunnel.sender.is_closed() {
                continue;
            }
            let near = preference
                .region
                .as_deref()
                .is_none_or(|region| region == endpoint.region);
            candidates.push((
                self.counter(endpoint.lease_id).load(Ordering::Relaxed),
                near,
                endpoint.bronze,
            ));
            senders.push((endpoint.lease_id, &tunnel.sender));
        }
        let chosen = choose(&candidates, preference.low_priority)?;
        let (lease_id, sender) = senders[chosen];
        Some((lease_id, sender.clone()))
    }

    /// Sends a request to one of `endpoints` and returns its answer as it streams. A replica
    /// that fails before answering (its tunnel broke, the agent could not reach it) costs one
    /// retry on another replica when the request may be sent twice: the agent did not reach
    /// the replica, or the method is idempotent, or the caller said so (`x-fallow-retry: 1`).
    pub async fn forward(
        &self,
        endpoints: &[Endpoint],
        preference: &Preference,
        method: Method,
        path_and_query: &str,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Result<(Response<Body>, Option<(u64, u64)>), Unanswered> {
        let may_repeat = is_idempotent(&method) || headers.get(RETRY_HEADER).is_some_and(|value| value == "1");
        let uri: Uri = format!("http://replica{path_and_query}")
            .parse()
            .map_err(|error: axum::http::uri::InvalidUri| Unanswered::Failed(error.to_string()))?;
        let mut tried = Vec::new();
        let mut last_error = None;
        // A request no replica got may go to each replica in turn; one a replica may have
        // acted on goes to one other at most, and only when it may be repeated.
        let mut repeated = false;
        while tried.len() < ATTEMPTS_MAX {
            let Some((lease_id, mut sender)) = self.pick(endpoints, &tried, preference) else {
                break;
            };
            tried.push(lease_id);
            let mut request = Request::builder()
                .method(method.clone())
                .uri(uri.clone())
                .body(Body::from(body.clone()))
                .expect("a request from parts that parsed");
            copy_end_to_end(headers, request.headers_mut());
            request.headers_mut().insert(LEASE_HEADER, HeaderValue::from(lease_id));
            let counter = self.counter(lease_id);
            let guard = InFlight::enter(counter);
            if let Err(error) = sender.ready().await {
                last_error = Some(format!("replica {}: its tunnel: {error}", lease_id));
                continue;
            }
            match sender.send_request(request).await {
                Ok(response) if response.headers().contains_key(UNREACHED_HEADER) => {
                    last_error = Some(format!("replica {}: {}", lease_id, response.status()));
                }
                Ok(response) if response.headers().contains_key(FAILED_HEADER) && may_repeat && !repeated => {
                    last_error = Some(format!("replica {}: {}", lease_id, response.status()));
                    repeated = true;
                }
                Ok(response) => {
                    let (mut parts, incoming) = response.into_parts();
                    strip_hop_by_hop(&mut parts.headers);
                    // A whole answer of known, modest size is read before it is passed on, so
                    // one cut short (its node lost mid-answer) can still go to another replica;
                    // a stream passes through as it comes.
                    if declared_length(&parts.headers).is_some_and(|length| length <= BUFFERED_BYTES_MAX) {
                        match http_body_util::BodyExt::collect(incoming).await {
                            Ok(collected) => {
                                let bytes = collected.to_bytes();
                                let tokens = usage_tokens(&bytes);
                                return Ok((Response::from_parts(parts, Body::from(bytes)), tokens));
                            }
                            Err(error) => {
                                last_error = Some(format!("replica {}: its answer broke off: {error}", lease_id));
                                if !may_repeat || repeated {
                                    break;
                                }
                                repeated = true;
                                continue;
                            }
                        }
                    }
                    return Ok((
                        Response::from_parts(
                            parts,
                            Body::new(Guarded {
                                inner: incoming,
                                _guard: guard,
                            }),
                        ),
                        None,
                    ));
                }
                Err(error) => {
                    last_error = Some(format!("replica {}: {error}", lease_id));
                    if !may_repeat || repeated {
                        break;
                    }
                    repeated = true;
                }
            }
        }
        Err(last_error.map_or(Unanswered::NoReplica, Unanswered::Failed))
    }
}

/// A request's service and where it goes on a replica: `/s/{service}/PATH?QUERY` is
/// (`service`, `/PATH?QUERY`); a name no service can have is answered 404.
pub fn service_path(uri: &Uri) -> Result<(String, String), Box<Response<Body>>> {
    let rest = uri.path().strip_prefix("/s/").unwrap_or_default();
    let (name, path) = match rest.find('/') {
        Some(at) => (&rest[..at], &rest[at..]),
        None => (rest, "/"),
    };
    if api::check_service_name("service", name).is_err() {
        return Err(Box::new(answer(
            StatusCode::NOT_FOUND,
            &format!("no service {name:?}: a service's name is letters, digits and '-'"),
        )));
    }
    let path_and_query = match uri.query() {
        Some(query) => format!("{path}?{query}"),
        None => path.to_string(),
    };
    Ok((name.to_string(), path_and_query))
}

impl Gateway {
    /// Sends a caller's request for `tenant_id`'s service `name` to one of `endpoints` (when
    /// there is none, to those `wait` finds, or answers what `wait` says), and counts what the
    /// caller got. `started` is when the request came.
    #[allow(clippy::too_many_arguments)]
    pub async fn relay(
        &self,
        started: Instant,
        tenant_id: i64,
        name: &str,
        endpoints: Arc<Vec<Endpoint>>,
        wait: impl Future<Output = Result<Arc<Vec<Endpoint>>, Response<Body>>>,
        path_and_query: &str,
        parts: axum::http::request::Parts,
        body: Body,
    ) -> Response<Body> {
        let endpoints = if endpoints.is_empty() {
            match wait.await {
                Ok(endpoints) => endpoints,
                // No such service: nothing to count.
                Err(response) if response.status() == StatusCode::NOT_FOUND => return response,
                Err(response) => {
                    self.record(tenant_id, name, Outcome::failed(started));
                    return response;
                }
            }
        } else {
            endpoints
        };
        let body = match axum::body::to_bytes(body, REQUEST_BYTES_MAX).await {
            Ok(body) => body,
            Err(_) => {
                return answer(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    &format!("a request body is at most {REQUEST_BYTES_MAX} bytes"),
                );
            }
        };
        let forwarded = self
            .forward(
                &endpoints,
                &Preference::of(&parts.headers),
                parts.method,
                path_and_query,
                &parts.headers,
                body,
            )
            .await;
        let (response, tokens) = match forwarded {
            Ok(answered) => answered,
            Err(Unanswered::NoReplica) => (
                answer(
                    StatusCode::SERVICE_UNAVAILABLE,
                    &format!("no replica of {name:?} is reachable now (their nodes' tunnels are down)"),
                ),
                None,
            ),
            Err(Unanswered::Failed(error)) => (
                answer(
                    StatusCode::BAD_GATEWAY,
                    &format!("no replica of {name:?} answered: {error}"),
                ),
                None,
            ),
        };
        let outcome = Outcome {
            error: response.status().is_server_error(),
            micros: started.elapsed().as_micros() as u64,
            tokens,
        };
        self.record(tenant_id, name, outcome);
        response
    }
}

/// How often a request waiting for a service's first replica looks again.
pub const WAKE_POLL: Duration = Duration::from_millis(200);

/// The 503 of a request that waited `wake_timeout_s` for a replica in vain.
pub fn not_woken(name: &str, wake_timeout_s: u32, status: &str) -> Response<Body> {
    let status = if status.is_empty() {
        String::new()
    } else {
        format!(" ({status})")
    };
    answer(
        StatusCode::SERVICE_UNAVAILABLE,
        &format!(
            "no replica of {name:?} became ready within {wake_timeout_s} s{status}: `fallow service show {name}` says why"
        ),
    )
}

/// The prompt and completion tokens of an OpenAI-style answer's `usage` object.
fn usage_tokens(bytes: &[u8]) -> Option<(u64, u64)> {
    if !bytes.windows(7).any(|window| window == b"\"usage\"") {
        return None;
    }
    let answer: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    let usage = answer.get("usage")?;
    let count = |field: &str| usage.get(field).and_then(serde_json::Value::as_u64).unwrap_or(0);
    Some((count("prompt_tokens"), count("completion_tokens")))
}

fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers.get(header::CONTENT_LENGTH)?.to_str().ok()?.parse().ok()
}

fn is_idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::PUT | Method::DELETE | Method::TRACE
    )
}

/// Headers that describe one hop, not the message (RFC 9110 § 7.6.1), and the caller's key.
fn hop_by_hop(name: &header::HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "host"
    )
}

fn copy_end_to_end(from: &HeaderMap, to: &mut HeaderMap) {
    for (name, value) in from {
        // The tenant's key is for the gateway, never for the provider's node.
        if hop_by_hop(name)
            || name == header::AUTHORIZATION
            || [LEASE_HEADER, REGION_HEADER, PRIORITY_HEADER].contains(&name.as_str())
        {
            continue;
        }
        to.append(name.clone(), value.clone());
    }
}

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let names: Vec<_> = headers.keys().filter(|name| hop_by_hop(name)).cloned().collect();
    for name in names {
        headers.remove(name);
    }
}

/// Counts a request in flight to a replica until its answer's body is done (or dropped).
struct InFlight(Arc<AtomicU32>);

impl InFlight {
    fn enter(counter: Arc<AtomicU32>) -> InFlight {
        counter.fetch_add(1, Ordering::Relaxed);
        InFlight(counter)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A replica's answer, holding its in-flight count until the last byte.
struct Guarded {
    inner: Incoming,
    _guard: InFlight,
}

impl hyper::body::Body for Guarded {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        Pin::new(&mut self.inner).poll_frame(context)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// An answer the gateway gives itself.
pub fn answer(status: StatusCode, message: &str) -> Response<Body> {
    let body = serde_json::json!({"error": {"code": status.canonical_reason().unwrap_or("error").to_lowercase().replace(' ', "_"), "message": message}});
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .expect("a response from fixed parts")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_callers_key_and_hop_headers_stay_at_the_gateway() {
        let mut from = HeaderMap::new();
        from.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer secret"));
        from.insert(header::CONNECTION, HeaderValue::from_static("keep-alive"));
        from.insert(header::HOST, HeaderValue::from_static("gateway"));
        from.insert(LEASE_HEADER, HeaderValue::from_static("7"));
        from.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        let mut to = HeaderMap::new();
        copy_end_to_end(&from, &mut to);
        assert_eq!(to.len(), 1, "{to:?}");
        assert_eq!(to[header::CONTENT_TYPE], "application/json");
    }

    #[test]
    fn counts_reported_by_other_gateways_saturate() {
        let report = api::GatewayServiceStats {
            tenant_id: 1,
            name: "chat".into(),
            requests: u64::MAX,
            errors: u64::MAX,
            prompt_tokens: u64::MAX,
            completion_tokens: u64::MAX,
            latency: vec![
                api::LatencyBucket {
                    bucket: u32::MAX,
                    count: u64::MAX - 1,
                },
                api::LatencyBucket {
                    bucket: u32::MAX - 1,
                    count: 3,
                },
            ],
        };
        let mut stats = ServiceStats::of_report(&report);
        assert_eq!(stats.latency[LATENCY_BUCKETS - 1], u64::MAX);
        stats.add(&ServiceStats::of_report(&report));
        assert_eq!(stats.requests, u64::MAX);
        assert!(stats.quantile_ms(0.99).is_some());
    }

    #[test]
    fn only_idempotent_methods_repeat_by_themselves() {
        assert!(is_idempotent(&Method::GET));
        assert!(is_idempotent(&Method::PUT));
        assert!(!is_idempotent(&Method::POST));
        assert!(!is_idempotent(&Method::PATCH));
    }

    #[test]
    fn tokens_come_from_an_openai_usage_object() {
        let answer = br#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":5,"total_tokens":8}}"#;
        assert_eq!(usage_tokens(answer), Some((3, 5)));
        assert_eq!(usage_tokens(b"{\"ok\":true}"), None);
        assert_eq!(usage_tokens(b"not json \"usage\""), None);
    }

    #[test]
    fn latency_quantiles_are_within_ten_percent() {
        let gateway = Gateway::default();
        assert_eq!(gateway.stats(1, "llm").quantile_ms(0.5), None);
        for millis in 1..=100u64 {
            let outcome = Outcome {
                error: millis > 98,
                micros: millis * 1000,
                tokens: Some((1, 2)),
            };
            gateway.record(1, "llm", outcome);
        }
        let stats = gateway.stats(1, "llm");
        assert_eq!((stats.requests, stats.errors), (100, 2));
        assert_eq!((stats.prompt_tokens, stats.completion_tokens), (100, 200));
        for (quantile, exact) in [(0.5, 50.0), (0.95, 95.0), (0.99, 99.0)] {
            let read = stats.quantile_ms(quantile).expect("requests were counted");
            assert!(read >= exact && read <= exact * 1.1, "p{quantile}: {read} for {exact}");
        }
    }

    #[test]
    fn the_nearest_least_loaded_replica_wins_and_low_priority_goes_to_bronze() {
        // (in flight, in the caller's region, bronze)
        let replicas = [(3, false, false), (5, true, false), (0, false, true)];
        assert_eq!(choose(&replicas, false), Some(2), "the idle one, far as it is");
        let replicas = [(3, false, false), (5, true, false), (4, false, true)];
        assert_eq!(choose(&replicas, false), Some(1), "near beats far until 4 busier");
        let replicas = [(0, false, false), (5, true, false)];
        assert_eq!(choose(&replicas, false), Some(0), "near but 5 busier: far");
        let replicas = [(0, true, false), (9, false, true)];
        assert_eq!(choose(&replicas, true), Some(1), "low priority waits on bronze");
        assert_eq!(choose(&[(0, true, false)], true), Some(0), "no bronze: any replica");
        assert_eq!(choose(&[], false), None);
    }

    #[test]
    fn a_preference_is_read_from_the_callers_headers() {
        let mut headers = HeaderMap::new();
        assert_eq!(Preference::of(&headers), Preference::default());
        headers.insert(REGION_HEADER, HeaderValue::from_static("us-east"));
        headers.insert(PRIORITY_HEADER, HeaderValue::from_static("LOW"));
        assert_eq!(
            Preference::of(&headers),
            Preference {
                region: Some("us-east".into()),
                low_priority: true
            }
        );
    }

    #[test]
    fn a_gateway_of_its_own_adds_its_counts_and_load_to_the_coordinators() {
        let edge = Gateway::default();
        for millis in [2u64, 40, 900] {
            edge.record(
                1,
                "llm",
                Outcome {
                    error: millis == 900,
                    micros: millis * 1000,
                    tokens: Some((3, 4)),
                },
            );
        }
        let mut report = edge.own_report("http://edge:7080", "eu-west");
        report.in_flight.push(api::ReplicaLoad {
            lease_id: 7,
            in_flight: 5,
        });
        let wire: api::GatewayReport =
            serde_json::from_str(&serde_json::to_string(&report).expect("a report serializes")).expect("and parses");
        let coordinator = Gateway::default();
        coordinator.record(1, "llm", Outcome::default());
        coordinator.report(&wire);
        let stats = coordinator.stats(1, "llm");
        assert_eq!((stats.requests, stats.errors, stats.prompt_tokens), (4, 1, 9));
        let alone = edge.stats(1, "llm");
        assert_eq!(
            stats.quantile_ms(0.99),
            alone.quantile_ms(0.99),
            "the histogram crossed whole"
        );
        assert_eq!(coordinator.in_flight(7), 5, "the gateway's requests in flight count");
        assert_eq!(coordinator.all_stats().len(), 1);
        assert_eq!(coordinator.others()[0].0, "http://edge:7080");
        // A second report replaces the first (counts are cumulative), never adds to it.
        coordinator.report(&wire);
        assert_eq!(coordinator.stats(1, "llm").requests, 4);
        coordinator.forget(1, "llm");
        assert_eq!(coordinator.stats(1, "llm").requests, 0, "a deleted service's counts go");
    }

    #[test]
    fn a_service_is_cached_only_briefly() {
        let gateway = Gateway::default();
        assert_eq!(gateway.cached(1, "llm"), None);
        let endpoints = vec![Endpoint {
            lease_id: 3,
            node_id: 9,
            region: "eu-west".into(),
            bronze: false,
        }];
        gateway.remember(1, "llm", endpoints.clone());
        assert_eq!(gateway.cached(1, "llm").as_deref(), Some(&endpoints));
        assert_eq!(gateway.cached(2, "llm"), None, "another tenant's service of that name");
    }
}
