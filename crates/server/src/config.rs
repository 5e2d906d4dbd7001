//! The coordinator's configuration (`fallow server`'s flags) and its fixed limits.

use std::path::PathBuf;
use std::time::Duration;

use matcher::MatcherConfig;

use crate::tls::TlsFiles;

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
    /// The matmul canary's product size n (`trust::matmul::N_DEFAULT`; smaller in tests, where
    /// the agent's CPU reference stands in for the GPU).
    pub canary_matmul_n: u64,
    pub matcher: MatcherConfig,
    /// A rebuilt view that cannot hold a stored live lease fails the reconcile pass (tests),
    /// instead of cordoning the lease's node and carrying on (a running coordinator).
    pub strict_view: bool,
    /// Whether this replica competes for the leader lock and runs the reconcile loop (on by
    /// default; a test that drives the passes itself, through `reconcile::lead` and
    /// `reconcile::pass`, turns it off).
    pub reconcile: bool,
    /// A gang whose replicas are not all picked up and staged this long after its placement (or
    /// repair) is placed again, without the nodes that did not stage (the start barrier's
    /// deadline: image pulls and dataset staging must fit in it).
    pub gang_start_timeout_ms: u64,
    /// Serve the API over TLS with this certificate chain and key (`--tls-cert`, `--tls-key`);
    /// `None`: plain HTTP, for a loopback address or behind a proxy that ends TLS.
    pub tls: Option<TlsFiles>,
    /// A bearer token that reads `/metrics` besides an admin's API key (`--metrics-token-file`,
    /// `FALLOW_METRICS_TOKEN`): what a Prometheus server is given instead of an admin's key.
    pub metrics_token: Option<String>,
    /// Output archives the coordinator keeps are removed this many days after they arrive
    /// (`--output-retention-days`, at most `OUTPUT_RETENTION_DAYS_MAX`; 0: kept as long as
    /// their job).
    pub output_retention_days: u32,
}

/// The longest retention `--output-retention-days` takes: a century.
pub const OUTPUT_RETENTION_DAYS_MAX: u32 = 36_500;

impl Config {
    pub fn heartbeat_interval_us(&self) -> i64 {
        micros_of_ms(self.heartbeat_interval_ms)
    }

    pub fn heartbeat_timeout_us(&self) -> i64 {
        micros_of_ms(self.heartbeat_timeout_ms)
    }

    pub fn gang_start_timeout_us(&self) -> i64 {
        micros_of_ms(self.gang_start_timeout_ms)
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
            canary_matmul_n: trust::matmul::N_DEFAULT,
            matcher: MatcherConfig::default(),
            strict_view: false,
            reconcile: true,
            gang_start_timeout_ms: 600_000,
            tls: None,
            metrics_token: None,
            output_retention_days: 14,
        }
    }
}
