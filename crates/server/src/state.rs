//! The coordinator's shared state: the store, caches of API keys and node keys, the group
//! commit writers, the fleet view the matcher decides on, rate limits and metrics.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use store::{Backend, JobRecord, NewJob, Role, Store};
use trust::{NonceCache, VerifyingKey};

use crate::batch::{Batcher, WriterHome, WriterThread};
use crate::beats::Beats;
use crate::clock::{Clock, SystemClock};
use crate::config::{
    ACCOUNT_BURST, ACCOUNT_RATE_PER_S, API_KEY_CACHE_TTL, BATCH_ROWS_MAX, Config, FUNDED_CACHE_TTL, NODE_BURST,
    NODE_RATE_PER_S,
};
use crate::error::ApiError;
use crate::fleet::FleetView;
use crate::lease_hints::LeaseHints;
use crate::metrics::Metrics;
use crate::turns::{Precedence, Turn, Turns};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caller {
    pub account_id: i64,
    pub role: Role,
}

#[derive(Clone, Debug)]
pub struct NodeIdentity {
    pub key: VerifyingKey,
    pub provider_id: i64,
    /// The limits of its policy, sent back in heartbeat answers.
    pub limits: api::NodeLimits,
    read_at: Instant,
}

/// How long a replica trusts its cached copy of a node's identity and limits: a key rotated or
/// a policy set at another replica reaches this one within it (at once at the replica that
/// took the change, `forget_node`). A read per node per this, beside its heartbeats.
pub const NODE_CACHE_TTL: Duration = Duration::from_secs(300);

/// Cached node identities, and how many times one was forgotten: a read that began before a
/// forget may have read the old key or limits, and is not cached (else it would stand for
/// `NODE_CACHE_TTL`: a policy set while the node's heartbeat read it never reached the agent).
#[derive(Default)]
struct NodeCache {
    identities: HashMap<i64, NodeIdentity>,
    forgets: u64,
}

impl NodeCache {
    /// The node's cached identity, or the count of forgets to give `keep` after reading it.
    fn get(&self, node_id: i64) -> Result<NodeIdentity, u64> {
        match self.identities.get(&node_id) {
            Some(found) if found.read_at.elapsed() < NODE_CACHE_TTL => Ok(found.clone()),
            _ => Err(self.forgets),
        }
    }

    /// Keeps an identity read after `get` answered `forgets`, unless a node was forgotten since.
    fn keep(&mut self, node_id: i64, identity: NodeIdentity, forgets: u64) {
        if self.forgets == forgets {
            self.identities.insert(node_id, identity);
        }
    }

    fn forget(&mut self, node_id: i64) {
        self.identities.remove(&node_id);
        self.forgets += 1;
    }
}

struct Bucket {
    tokens: f64,
    at: Instant,
}

pub struct AppState {
    pub store: Store,
    pub config: Config,
    /// Where every time the coordinator stamps or decides on comes from.
    pub clock: Arc<dyn Clock>,
    keys: Mutex<HashMap<String, (Caller, String, Instant)>>,
    /// Per-service keys: key id → (tenant, service, secret hash, when read).
    service_keys: Mutex<HashMap<String, (i64, String, String, Instant)>>,
    /// Tenants found with a positive balance, and when.
    funded: Mutex<HashMap<i64, Instant>>,
    nodes: Mutex<NodeCache>,
    pub nonce_cache: Mutex<NonceCache>,
    /// Agents' signatures, verified in batches (`signatures`).
    pub signatures: crate::signatures::Signatures,
    /// Where the leader's placements are committed (see [`WriterThread`]).
    pub writes: WriterThread,
    pub nonces: Batcher<(i64, String, i64), bool>,
    pub beats: Beats,
    /// The gateway's tunnels, requests in flight and services' replicas (`gateway`).
    pub gateway: Arc<crate::gateway::Gateway>,
    /// Which nodes may hold live leases, while this replica leads.
    pub lease_hints: LeaseHints,
    turns: WriterTurns,
    pub submissions: Batcher<NewJob, JobRecord>,
    /// Canaries' first deliveries in heartbeat answers, noted a batch a transaction: one
    /// transaction each held the writers' turn a thousand times in 20 s of `bench api`, and
    /// placements waited behind them.
    pub canary_deliveries: Batcher<(i64, i64), ()>,
    pub view: tokio::sync::Mutex<Option<FleetView>>,
    /// When a follower last built its read-only view (`reconcile::ensure_view`).
    pub view_built_at: Mutex<Option<Instant>>,
    pub metrics: Metrics,
    limits: Mutex<HashMap<(bool, i64), Bucket>>,
    pub wake: tokio::sync::Notify,
    /// The leadership epoch this replica placed under (fencing token; 0 when not leading).
    pub fence: AtomicI64,
    /// Every node's decayed outcomes (`reputation`).
    pub reputations: tokio::sync::Mutex<crate::books::reputation::Book>,
    /// Which nodes have canaries to deliver (`canaries`).
    pub canary_hints: crate::books::canaries::Hints,
    /// The nodes asked to stage datasets ahead (`crate::warm`).
    pub warm_hints: crate::books::canaries::Hints,
    /// Leases missing from their nodes' heartbeats (`fraud::Drops`).
    pub drops: crate::books::fraud::Drops,
    /// The leader's count of committed window hours (`fraud::WindowHours`).
    pub window_hours: Mutex<crate::books::fraud::WindowHours>,
}

/// The writers' turns on SQLite (`crate::turns`); none on PostgreSQL, which locks rows, so there
/// the writers commit side by side.
#[derive(Clone)]
struct WriterTurns(Option<Turns>);

impl WriterTurns {
    fn for_store(store: &Store) -> WriterTurns {
        match store.backend() {
            Backend::Sqlite => WriterTurns(Some(Turns::default())),
            Backend::Postgres => WriterTurns(None),
        }
    }

    /// Waits for this writer's turn; the turn ends when dropped.
    async fn take(&self, precedence: Precedence) -> Option<Turn> {
        match &self.0 {
            Some(turns) => Some(turns.take(precedence).await),
            None => None,
        }
    }
}

impl AppState {
    pub fn new(store: Store, config: Config) -> AppState {
        AppState::with_clock(store, config, Arc::new(SystemClock))
    }

    /// A coordinator whose time comes from `clock` (a test's `ManualClock`).
    pub fn with_clock(store: Store, config: Config, clock: Arc<dyn Clock>) -> AppState {
        let turns = WriterTurns::for_store(&store);
        let home = match store.backend() {
            Backend::Sqlite => WriterHome::Thread,
            Backend::Postgres => WriterHome::Task,
        };
        let (nonce_store, nonce_turns) = (store.clone(), turns.clone());
        let nonces = Batcher::start("nonce", BATCH_ROWS_MAX, home, move |items: Vec<(i64, String, i64)>| {
            let (store, turns) = (nonce_store.clone(), nonce_turns.clone());
            async move {
                let _turn = turns.take(Precedence::InTurn).await;
                store.remember_nonces(&items).await.map_err(|error| error.to_string())
            }
        });
        let (job_store, job_turns) = (store.clone(), turns.clone());
        let submissions = Batcher::start("submission", BATCH_ROWS_MAX, home, move |items: Vec<NewJob>| {
            let (store, turns) = (job_store.clone(), job_turns.clone());
            async move {
                let _turn = turns.take(Precedence::InTurn).await;
                store.insert_jobs(&items).await.map_err(|error| error.to_string())
            }
        });
        let (delivery_store, delivery_turns) = (store.clone(), turns.clone());
        let canary_deliveries = Batcher::start(
            "canary delivery",
            BATCH_ROWS_MAX,
            home,
            move |items: Vec<(i64, i64)>| {
                let (store, turns) = (delivery_store.clone(), delivery_turns.clone());
                async move {
                    let _turn = turns.take(Precedence::InTurn).await;
                    let count = items.len();
                    store
                        .mark_canaries_delivered(&items)
                        .await
                        .map(|()| vec![(); count])
                        .map_err(|error| error.to_string())
                }
            },
        );
        AppState {
            store,
            canary_deliveries,
            signatures: crate::signatures::Signatures::start(),
            writes: WriterThread::start(home),
            nonce_cache: Mutex::new(NonceCache::new(
                config.max_skew_ms.saturating_mul(2),
                trust::NONCES_MAX,
                trust::NONCES_PER_NODE_MAX,
            )),
            config,
            clock,
            keys: Mutex::new(HashMap::new()),
            service_keys: Mutex::new(HashMap::new()),
            funded: Mutex::new(HashMap::new()),
            nodes: Mutex::default(),
            nonces,
            beats: Beats::default(),
            gateway: Arc::default(),
            lease_hints: LeaseHints::default(),
            turns,
            submissions,
            view: tokio::sync::Mutex::new(None),
            view_built_at: Mutex::new(None),
            metrics: Metrics::default(),
            limits: Mutex::new(HashMap::new()),
            wake: tokio::sync::Notify::new(),
            fence: AtomicI64::new(0),
            reputations: tokio::sync::Mutex::new(crate::books::reputation::Book::default()),
            canary_hints: crate::books::canaries::Hints::default(),
            warm_hints: crate::books::canaries::Hints::default(),
            drops: crate::books::fraud::Drops::default(),
            window_hours: Mutex::new(crate::books::fraud::WindowHours::default()),
        }
    }

    /// The coordinator's time now, in microseconds since 1970.
    pub fn now_us(&self) -> i64 {
        self.clock.now_us()
    }

    /// The caller a presented API key belongs to, counted against its account's API rate limit.
    pub async fn authenticate(&self, presented: &str) -> Result<Caller, ApiError> {
        let caller = self.caller_of_key(presented).await?;
        self.rate_limit(false, caller.account_id)?;
        Ok(caller)
    }

    /// The tenant and service a presented per-service key calls (`service key create`): it
    /// calls that service through the gateway and nothing else.
    pub async fn service_of_key(&self, presented: &str) -> Result<(Caller, String), ApiError> {
        let (key_id, secret) =
            trust::parse_api_key(presented).map_err(|error| ApiError::Unauthorized(error.to_string()))?;
        let cached = {
            let keys = self.service_keys.lock().expect("service key cache lock");
            keys.get(key_id)
                .filter(|(_, _, _, at)| at.elapsed() < API_KEY_CACHE_TTL)
                .map(|(tenant, service, hash, _)| (*tenant, service.clone(), hash.clone()))
        };
        let (tenant, service, hash) = match cached {
            Some(found) => found,
            None => {
                let record = self
                    .store
                    .service_key(key_id)
                    .await?
                    .filter(|record| record.revoked_at.is_none())
                    .ok_or_else(|| ApiError::Unauthorized("key unknown or revoked".into()))?;
                self.service_keys.lock().expect("service key cache lock").insert(
                    key_id.to_string(),
                    (
                        record.tenant_id,
                        record.service.clone(),
                        record.secret_hash.clone(),
                        Instant::now(),
                    ),
                );
                (record.tenant_id, record.service, record.secret_hash)
            }
        };
        if !trust::verify_secret(secret, &hash) {
            return Err(ApiError::Unauthorized("key does not match; check for a typo".into()));
        }
        let caller = Caller {
            account_id: tenant,
            role: Role::Tenant,
        };
        Ok((caller, service))
    }

    /// The caller a presented API key belongs to, not counted against the API's rate limit:
    /// the gateway's requests to a tenant's services are the service's traffic, not API calls.
    pub async fn caller_of_key(&self, presented: &str) -> Result<Caller, ApiError> {
        let (key_id, secret) =
            trust::parse_api_key(presented).map_err(|error| ApiError::Unauthorized(error.to_string()))?;
        let cached = {
            let keys = self.keys.lock().expect("key cache lock");
            keys.get(key_id)
                .filter(|(_, _, at)| at.elapsed() < API_KEY_CACHE_TTL)
                .map(|(caller, hash, _)| (*caller, hash.clone()))
        };
        let (caller, hash) = match cached {
            Some(found) => found,
            None => {
                let record = self
                    .store
                    .api_key(key_id)
                    .await?
                    .filter(|record| record.revoked_at.is_none())
                    .ok_or_else(|| {
                        ApiError::Unauthorized("API key unknown or revoked; ask an admin for a new one".into())
                    })?;
                let account = self
                    .store
                    .account(record.account_id)
                    .await?
                    .ok_or_else(|| ApiError::Unauthorized("the API key's account no longer exists".into()))?;
                let caller = Caller {
                    account_id: account.id,
                    role: account.role,
                };
                self.keys
                    .lock()
                    .expect("key cache lock")
                    .insert(key_id.to_string(), (caller, record.secret_hash.clone(), Instant::now()));
                (caller, record.secret_hash)
            }
        };
        if !trust::verify_secret(secret, &hash) {
            return Err(ApiError::Unauthorized(
                "API key does not match; check for a typo".into(),
            ));
        }
        Ok(caller)
    }

    /// Whether `tenant` had money less than `FUNDED_CACHE_TTL` ago.
    pub fn recently_funded(&self, tenant: i64) -> bool {
        let funded = self.funded.lock().expect("funded lock");
        funded.get(&tenant).is_some_and(|at| at.elapsed() < FUNDED_CACHE_TTL)
    }

    /// Remembers that `tenant` has money now.
    pub fn note_funded(&self, tenant: i64) {
        self.funded.lock().expect("funded lock").insert(tenant, Instant::now());
    }

    pub fn forget_key(&self, key_id: &str) {
        self.keys.lock().expect("key cache lock").remove(key_id);
        self.service_keys.lock().expect("service key cache lock").remove(key_id);
    }

    /// Forgets a node's cached key and limits (its key was rotated, its policy set).
    pub fn forget_node(&self, node_id: i64) {
        self.nodes.lock().expect("node cache lock").forget(node_id);
    }

    /// The node's registered public key and provider (cached; a rotation here or on another
    /// replica makes it forgotten, see `forget_node`).
    pub async fn node_identity(&self, node_id: i64) -> Result<NodeIdentity, ApiError> {
        let forgets = match self.nodes.lock().expect("node cache lock").get(node_id) {
            Ok(found) => return Ok(found),
            Err(forgets) => forgets,
        };
        let record = self
            .store
            .node(node_id)
            .await?
            .ok_or_else(|| ApiError::Unauthorized(format!("node {node_id} is not registered")))?;
        let key = trust::parse_public_key(&record.node.public_key)?;
        let policy = serde_json::from_str::<api::PolicyDoc>(&record.node.policy).unwrap_or_default();
        let identity = NodeIdentity {
            key,
            provider_id: record.node.provider_id,
            limits: api::NodeLimits {
                thermal_limit_c: policy.thermal_limit_c,
                power_limit_w: policy.power_limit_w,
            },
            read_at: Instant::now(),
        };
        self.nodes
            .lock()
            .expect("node cache lock")
            .keep(node_id, identity.clone(), forgets);
        Ok(identity)
    }

    /// Waits for this replica's turn to write (on SQLite; at once on PostgreSQL), first come,
    /// first served but behind the leader's placements (`crate::turns`).
    pub async fn writer_turn(&self) -> Option<Turn> {
        self.turns.take(Precedence::InTurn).await
    }

    /// The leader's turn to commit placements: ahead of the writers waiting, but never twice in
    /// a row while one waits (`crate::turns`).
    pub async fn placement_turn(&self) -> Option<Turn> {
        self.turns.take(Precedence::First).await
    }

    /// Whether this replica runs the reconcile loop now.
    pub fn leads(&self) -> bool {
        self.metrics.is_leader.load(Ordering::Relaxed) == 1
    }

    /// Nodes whose tunnel to the gateway is up.
    pub fn gateway_tunnels(&self) -> usize {
        self.gateway.tunnels_up()
    }

    /// A token bucket per account (`node` false) or per node (`node` true).
    pub fn rate_limit(&self, node: bool, id: i64) -> Result<(), ApiError> {
        let (rate, burst) = if node {
            (NODE_RATE_PER_S, NODE_BURST)
        } else {
            (ACCOUNT_RATE_PER_S, ACCOUNT_BURST)
        };
        let mut limits = self.limits.lock().expect("rate limit lock");
        let bucket = limits.entry((node, id)).or_insert(Bucket {
            tokens: f64::from(burst),
            at: Instant::now(),
        });
        let elapsed = bucket.at.elapsed().as_secs_f64();
        bucket.at = Instant::now();
        bucket.tokens = (bucket.tokens + elapsed * f64::from(rate)).min(f64::from(burst));
        if bucket.tokens < 1.0 {
            return Err(ApiError::RateLimited(rate));
        }
        bucket.tokens -= 1.0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(thermal_limit_c: Option<u16>) -> NodeIdentity {
        NodeIdentity {
            key: trust::NodeKey::generate().verifying_key(),
            provider_id: 1,
            limits: api::NodeLimits {
                thermal_limit_c,
                power_limit_w: None,
            },
            read_at: Instant::now(),
        }
    }

    #[test]
    fn a_node_read_before_it_was_forgotten_is_not_kept() {
        let mut cache = NodeCache::default();
        let before = cache.get(7).expect_err("nothing cached");
        // The owner sets a limit while the old policy is being read.
        cache.forget(7);
        cache.keep(7, identity(None), before);
        let after = cache.get(7).expect_err("the old read is not kept");
        cache.keep(7, identity(Some(70)), after);
        let kept = cache.get(7).expect("a read begun after the change is kept");
        assert_eq!(kept.limits.thermal_limit_c, Some(70));
        cache.forget(7);
        assert!(cache.get(7).is_err(), "forgotten");
    }
}
