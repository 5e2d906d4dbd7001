//! The coordinator's shared state: the store, caches of API keys and node keys, the group
//! commit writers, the fleet view the matcher decides on, rate limits and metrics.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use matcher::MatcherConfig;
use store::{Backend, JobRecord, NewJob, Role, Store};
use trust::{NonceCache, VerifyingKey};

use crate::batch::{Batcher, WriterHome};
use crate::beats::Beats;
use crate::error::ApiError;
use crate::lease_hints::LeaseHints;
use crate::view::FleetView;

/// How long a verified API key is trusted without asking the store again. A key revoked on
/// another replica stops working within this time; on this replica, at once.
pub const API_KEY_CACHE_TTL: Duration = Duration::from_secs(2);
/// How long a tenant found with money may submit without its balance being read again. The
/// check at submission only turns away tenants with nothing; the escrow hold at placement is
/// what guards the money, so a job accepted on a balance spent meanwhile waits in the queue
/// ("the tenant's balance is $0"), as any queued job does when the money runs out.
pub const FUNDED_CACHE_TTL: Duration = Duration::from_secs(1);
/// Requests per second per account (tenants, providers, admins), with this burst.
pub const ACCOUNT_RATE_PER_S: u32 = 2_000;
pub const ACCOUNT_BURST: u32 = 4_000;
/// Requests per second per node (agents), with this burst.
pub const NODE_RATE_PER_S: u32 = 20;
pub const NODE_BURST: u32 = 100;
/// Rows per group-commit transaction.
pub const BATCH_ROWS_MAX: usize = 512;
/// Jobs one reconcile pass considers.
pub const RECONCILE_JOBS_MAX: usize = 20_000;
/// Longest long-poll for leases.
pub const LONG_POLL_MS_MAX: u64 = 30_000;

#[derive(Clone, Debug)]
pub struct Config {
    pub listen: String,
    pub data_dir: PathBuf,
    /// Agents heartbeat this often; a node silent for `heartbeat_timeout_ms` loses its leases.
    pub heartbeat_interval_ms: u64,
    pub heartbeat_timeout_ms: u64,
    pub reconcile_interval_ms: u64,
    /// The platform's share of every usage charge, in thousandths.
    pub platform_fee_permille: u32,
    /// How far an agent's clock may be from the coordinator's.
    pub max_skew_ms: i64,
    /// Bill usage on simulated nodes as if it were real (demos and tests that check metering:
    /// play money). Off by default: a simulated node's usage is recorded and never billed. When
    /// on, the ledger's memo of each such charge says it was simulated.
    pub bill_simulated: bool,
    /// A node over its owner's thermal or power limits takes no new work at once; when it has
    /// been over them this long, its bronze leases are preempted (SIGTERM, grace, kill).
    pub over_limit_preempt_after_ms: u64,
    /// Gold work goes only to nodes of gold-badge providers (docs/trust-policy.md § 2). Off for
    /// `fallow dev` and tests of gold work, where no provider has the month of history a badge
    /// needs.
    pub gold_needs_badge: bool,
    /// The trust policy's canaries (docs/trust-policy.md § 3): how long one runs on the claimed
    /// GPU model, how soon one follows a registration, a fingerprint change or an unanswered one
    /// (the policy's hour; shorter in tests), and how often the leader looks whether one is due.
    pub canary_seconds: u64,
    pub canary_within_ms: u64,
    pub canary_check_every_ms: u64,
    pub matcher: MatcherConfig,
    /// A rebuilt view that cannot hold a stored live lease fails the reconcile pass (tests),
    /// instead of cordoning the lease's node and carrying on (a running coordinator).
    pub strict_view: bool,
    /// Whether this replica competes for the leader lock and runs the reconcile loop (on by
    /// default; a test that drives the passes itself, through `reconcile::lead` and
    /// `reconcile::pass`, turns it off).
    pub reconcile: bool,
}

impl Config {
    pub fn heartbeat_interval_us(&self) -> i64 {
        micros_of_ms(self.heartbeat_interval_ms)
    }

    pub fn heartbeat_timeout_us(&self) -> i64 {
        micros_of_ms(self.heartbeat_timeout_ms)
    }

    pub fn over_limit_preempt_after_us(&self) -> i64 {
        micros_of_ms(self.over_limit_preempt_after_ms)
    }
}

/// Milliseconds as microseconds, saturating.
pub fn micros_of_ms(ms: u64) -> i64 {
    i64::try_from(ms).map_or(i64::MAX, |ms| ms.saturating_mul(1000))
}

impl Default for Config {
    fn default() -> Config {
        Config {
            listen: "127.0.0.1:7070".to_string(),
            data_dir: PathBuf::from("fallow-data"),
            heartbeat_interval_ms: 10_000,
            heartbeat_timeout_ms: 45_000,
            reconcile_interval_ms: 200,
            platform_fee_permille: 100,
            max_skew_ms: trust::DEFAULT_MAX_SKEW_MS,
            bill_simulated: false,
            over_limit_preempt_after_ms: 60_000,
            gold_needs_badge: true,
            canary_seconds: 30,
            canary_within_ms: trust::rules::CANARY_WITHIN_MS as u64,
            canary_check_every_ms: 10_000,
            matcher: MatcherConfig::default(),
            strict_view: false,
            reconcile: true,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caller {
    pub account_id: i64,
    pub role: Role,
}

#[derive(Clone, Debug)]
pub struct NodeIdentity {
    pub key: VerifyingKey,
    pub provider_id: i64,
}

struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Counters for `/metrics`.
#[derive(Default)]
pub struct Metrics {
    pub jobs_submitted: AtomicU64,
    pub decisions: AtomicU64,
    pub placements: AtomicU64,
    pub decision_nanos: AtomicU64,
    pub heartbeats: AtomicU64,
    pub leases_granted: AtomicU64,
    pub leases_lost: AtomicU64,
    pub leases_preempted: AtomicU64,
    pub usage_records: AtomicU64,
    pub signatures_refused: AtomicU64,
    pub reconcile_passes: AtomicU64,
    pub rebuilds: AtomicU64,
    /// Stored live leases a rebuilt view could not hold (always a bug; see `view::Conflict`).
    pub view_conflicts: AtomicU64,
    pub is_leader: AtomicU64,
    pub lease_grant: crate::metrics::Histogram,
    pub lease_pickup: crate::metrics::Histogram,
}

impl Metrics {
    pub fn add(counter: &AtomicU64, value: u64) {
        counter.fetch_add(value, Ordering::Relaxed);
    }
}

pub struct AppState {
    pub store: Store,
    pub config: Config,
    keys: Mutex<HashMap<String, (Caller, String, Instant)>>,
    /// Tenants found with a positive balance, and when.
    funded: Mutex<HashMap<i64, Instant>>,
    nodes: Mutex<HashMap<i64, NodeIdentity>>,
    pub nonce_cache: Mutex<NonceCache>,
    pub nonces: Batcher<(i64, String, i64), bool>,
    pub beats: Beats,
    /// Which nodes may hold live leases, while this replica leads.
    pub lease_hints: LeaseHints,
    turns: WriterTurns,
    pub submissions: Batcher<NewJob, JobRecord>,
    pub view: tokio::sync::Mutex<Option<FleetView>>,
    /// When a follower last built its read-only view (`reconcile::ensure_view`).
    pub view_built_at: Mutex<Option<Instant>>,
    pub metrics: Metrics,
    limits: Mutex<HashMap<(bool, i64), Bucket>>,
    pub wake: tokio::sync::Notify,
    /// The leadership epoch this replica placed under (fencing token; 0 when not leading).
    pub fence: AtomicI64,
    /// Every node's decayed outcomes (`reputation`).
    pub reputations: tokio::sync::Mutex<crate::reputation::Book>,
    /// Which nodes have canaries to deliver (`canaries`).
    pub canary_hints: crate::canaries::Hints,
    /// Leases missing from their nodes' heartbeats (`fraud::Drops`).
    pub drops: crate::fraud::Drops,
    /// The leader's count of committed window hours (`fraud::WindowHours`).
    pub window_hours: Mutex<crate::fraud::WindowHours>,
}

/// On SQLite the group-commit writers take turns here rather than at SQLite's write lock, where
/// the loser's busy handler sleeps 1–100 ms between tries: with three writers meeting there, a
/// commit waited tens of milliseconds for a lock long free while the CPUs idled (under
/// `bench api`, 210 such sleeps and 3.6 s asleep in 5 s; 25 and 0.6 s with turns). PostgreSQL
/// locks rows, so there the writers commit side by side (`None`).
#[derive(Clone)]
struct WriterTurns(Option<Arc<tokio::sync::Mutex<()>>>);

impl WriterTurns {
    fn for_store(store: &Store) -> WriterTurns {
        match store.backend() {
            Backend::Sqlite => WriterTurns(Some(Arc::new(tokio::sync::Mutex::new(())))),
            Backend::Postgres => WriterTurns(None),
        }
    }

    /// Waits for this writer's turn (first come, first served); the turn ends when dropped.
    async fn take(&self) -> Option<tokio::sync::OwnedMutexGuard<()>> {
        match &self.0 {
            Some(lock) => Some(lock.clone().lock_owned().await),
            None => None,
        }
    }
}

/// How far the coordinator's clock runs ahead of the system's: zero but in a test that runs the
/// leader's decisions over hours of grace periods and timeouts in seconds (one per process).
static CLOCK_AHEAD_US: AtomicI64 = AtomicI64::new(0);

/// Moves the coordinator's clock forward by `by_us` (tests only: see `CLOCK_AHEAD_US`).
#[doc(hidden)]
pub fn advance_clock_for_tests(by_us: i64) {
    CLOCK_AHEAD_US.fetch_add(by_us.max(0), Ordering::SeqCst);
}

/// The coordinator's clock, in microseconds since 1970: every time it stamps or decides on.
pub fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_micros() as i64)
        + CLOCK_AHEAD_US.load(Ordering::SeqCst)
}

impl AppState {
    pub fn new(store: Store, config: Config) -> AppState {
        let turns = WriterTurns::for_store(&store);
        let home = match store.backend() {
            Backend::Sqlite => WriterHome::Thread,
            Backend::Postgres => WriterHome::Task,
        };
        let (nonce_store, nonce_turns) = (store.clone(), turns.clone());
        let nonces = Batcher::start("nonce", BATCH_ROWS_MAX, home, move |items: Vec<(i64, String, i64)>| {
            let (store, turns) = (nonce_store.clone(), nonce_turns.clone());
            async move {
                let _turn = turns.take().await;
                store.remember_nonces(&items).await.map_err(|error| error.to_string())
            }
        });
        let (job_store, job_turns) = (store.clone(), turns.clone());
        let submissions = Batcher::start("submission", BATCH_ROWS_MAX, home, move |items: Vec<NewJob>| {
            let (store, turns) = (job_store.clone(), job_turns.clone());
            async move {
                let _turn = turns.take().await;
                store.insert_jobs(&items).await.map_err(|error| error.to_string())
            }
        });
        AppState {
            store,
            nonce_cache: Mutex::new(NonceCache::new(
                config.max_skew_ms.saturating_mul(2),
                trust::NONCES_MAX,
                trust::NONCES_PER_NODE_MAX,
            )),
            config,
            keys: Mutex::new(HashMap::new()),
            funded: Mutex::new(HashMap::new()),
            nodes: Mutex::new(HashMap::new()),
            nonces,
            beats: Beats::default(),
            lease_hints: LeaseHints::default(),
            turns,
            submissions,
            view: tokio::sync::Mutex::new(None),
            view_built_at: Mutex::new(None),
            metrics: Metrics::default(),
            limits: Mutex::new(HashMap::new()),
            wake: tokio::sync::Notify::new(),
            fence: AtomicI64::new(0),
            reputations: tokio::sync::Mutex::new(crate::reputation::Book::default()),
            canary_hints: crate::canaries::Hints::default(),
            drops: crate::fraud::Drops::default(),
            window_hours: Mutex::new(crate::fraud::WindowHours::default()),
        }
    }

    /// Checks an API key (`fallow_<id>_<secret>`) and returns who holds it.
    pub async fn authenticate(&self, presented: &str) -> Result<Caller, ApiError> {
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
        self.rate_limit(false, caller.account_id)?;
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
    }

    /// Forgets a node's cached key (it was rotated).
    pub fn forget_node(&self, node_id: i64) {
        self.nodes.lock().expect("node cache lock").remove(&node_id);
    }

    /// The node's registered public key and provider (cached; a rotation here or on another
    /// replica makes it forgotten, see `forget_node`).
    pub async fn node_identity(&self, node_id: i64) -> Result<NodeIdentity, ApiError> {
        if let Some(found) = self.nodes.lock().expect("node cache lock").get(&node_id) {
            return Ok(found.clone());
        }
        let record = self
            .store
            .node(node_id)
            .await?
            .ok_or_else(|| ApiError::Unauthorized(format!("node {node_id} is not registered")))?;
        let key = trust::parse_public_key(&record.node.public_key)?;
        let identity = NodeIdentity {
            key,
            provider_id: record.node.provider_id,
        };
        self.nodes
            .lock()
            .expect("node cache lock")
            .insert(node_id, identity.clone());
        Ok(identity)
    }

    /// Waits for this replica's turn to write (on SQLite; at once on PostgreSQL).
    pub async fn writer_turn(&self) -> Option<tokio::sync::OwnedMutexGuard<()>> {
        self.turns.take().await
    }

    /// Whether this replica runs the reconcile loop now.
    pub fn leads(&self) -> bool {
        self.metrics.is_leader.load(Ordering::Relaxed) == 1
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
