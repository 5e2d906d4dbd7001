//! The coordinator's durable state behind one interface, on SQLite (embedded, one file, WAL) or
//! PostgreSQL (several coordinator replicas). Only this crate knows SQL.
//!
//! One code path serves both backends: sqlx's `Any` driver, runtime queries with `$N`
//! placeholders, and only i64 / f64 / text values (booleans are 0/1, JSON is text, times are
//! microseconds since the Unix epoch, money is micro-dollars). Migrations are embedded, one
//! folder per backend, and applied at open. The conformance suite in `tests/` runs every test
//! against both.

mod rows;

use std::str::FromStr;
use std::time::Duration;

use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::{AnyConnection, AnyPool, Connection, Row};

pub use gangs::GangMember;
pub use jobs::{JobEnd, JobsWhere, PlacementWrite};
pub use ledger::LedgerOutcome;
/// The lease states are the model's: one enum from the matcher to the database.
pub use model::LeaseState;
pub use reservations::{LedgerWrite, NewReservation, RESERVATION_LIVE, ReservationNode, ReservationRecord};
pub use rows::*;
pub use services::{ServiceKeyRecord, ServiceRecord, ServiceReplica};
pub use serving::ServingLease;
pub use sites::SiteRecord;
pub use trust::{CanaryRow, FraudRow, NewCanary};

/// Connections per pool. SQLite serialises writers anyway; readers share the rest.
pub const POOL_CONNECTIONS_MAX: u32 = 16;
/// The fewest and the most SQLite connections per pool (see [`sqlite_connections`]).
pub const SQLITE_CONNECTIONS_MIN: u32 = 3;
pub const SQLITE_CONNECTIONS_MAX: u32 = 8;
/// How long a statement waits for SQLite's write lock before it fails.
pub const SQLITE_BUSY_TIMEOUT_MS: u64 = 10_000;
/// How much of a SQLite file each connection maps into memory.
pub const SQLITE_MMAP_BYTES: u64 = 4 << 30;
/// Each SQLite connection's page cache.
pub const SQLITE_CACHE_KIB: u64 = 64 << 10;
/// Write-ahead log frames (pages) past which the log should start over: 16,384
/// frames of 4 KiB pages is 64 MiB.
pub const WAL_RESTART_FRAMES: i64 = 16_384;
/// The rows of a multi-row `VALUES` list with numbered parameters: `rows` rows of one
/// parameter per entry of `types`, each cast to that type unless it is empty (a cast gives
/// the columns a type on PostgreSQL, where a `VALUES` list feeds an `UPDATE`).
pub(crate) fn values_rows(rows: usize, types: &[&str]) -> String {
    (0..rows)
        .map(|row| {
            let cells = types
                .iter()
                .enumerate()
                .map(|(column, kind)| {
                    let parameter = row * types.len() + column + 1;
                    if kind.is_empty() {
                        format!("${parameter}")
                    } else {
                        format!("CAST(${parameter} AS {kind})")
                    }
                })
                .collect::<Vec<_>>();
            format!("({})", cells.join(", "))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// SQLite connections per pool: one for the writer whose turn it is and one per core for
/// readers, from 3 to 8. Each connection is a thread of sqlx's and each statement a round trip
/// to it; SQLite writes one transaction at a time whatever the count, and readers beyond the
/// cores only wait for a CPU there. Under `bench api` on 2 cores, 8 connections against 3 (ten
/// runs each, interleaved): heartbeat p99 61 against 24 ms, submission p99 273 against 124 ms,
/// submission-to-grant p99 519 against 225 ms (medians; docs/decisions.md, "Fewer SQLite
/// connections").
fn sqlite_connections() -> u32 {
    let cores = std::thread::available_parallelism().map_or(1, |cores| cores.get());
    u32::try_from(cores)
        .unwrap_or(u32::MAX)
        .saturating_add(1)
        .clamp(SQLITE_CONNECTIONS_MIN, SQLITE_CONNECTIONS_MAX)
}

/// The settings of every SQLite connection.
fn sqlite_pragmas() -> [String; 6] {
    [
        format!("PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}"),
        // With WAL (set once per file, at open) readers run beside the writer; FULL makes
        // every commit durable across a power cut, not only a crash.
        "PRAGMA synchronous = FULL".to_string(),
        "PRAGMA foreign_keys = ON".to_string(),
        // The default page cache is 2 MiB per connection; a fleet of 125,000 nodes is a few
        // hundred MiB, and every miss was a read system call. Mapped pages are the kernel's
        // page cache, shared by every connection.
        format!("PRAGMA mmap_size = {SQLITE_MMAP_BYTES}"),
        format!("PRAGMA cache_size = -{SQLITE_CACHE_KIB}"),
        // A writer that filled the log past 1,000 pages copied it back into the file inside
        // its own commit, a stall of up to hundreds of milliseconds; `Store::checkpoint` does
        // it beside the writers instead.
        "PRAGMA wal_autocheckpoint = 0".to_string(),
    ]
}

/// The advisory lock key the reconcile leader holds on PostgreSQL ("fallow" in ASCII).
pub const LEADER_LOCK_KEY: i64 = 0x66_61_6c_6c_6f_77;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database URL {0:?} is not sqlite://PATH or postgres://…")]
    BadUrl(String),
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("migration failed: {0}")]
    Migration(#[from] sqlx::migrate::MigrateError),
    #[error("{0} already exists")]
    Conflict(String),
    #[error("{0} not found")]
    NotFound(String),
    #[error("refused: {0}")]
    Refused(String),
    #[error("fenced: another replica took the reconcile leadership (epoch {0} is stale)")]
    Fenced(i64),
    #[error("stored row is corrupt: {0}")]
    Corrupt(String),
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// The store: a pool on one database. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Store {
    pool: AnyPool,
    backend: Backend,
    url: String,
}

/// Holds the reconcile leadership while alive. On PostgreSQL it owns the connection that holds
/// the advisory lock: if the process dies, the server closes the session and the lock goes.
pub struct LeaderGuard {
    connection: Option<AnyConnection>,
}

impl LeaderGuard {
    /// Whether the lock is still held (the connection still answers).
    pub async fn still_held(&mut self) -> bool {
        match self.connection.as_mut() {
            None => true,
            Some(connection) => connection.ping().await.is_ok(),
        }
    }
}

impl Store {
    /// Opens (and for SQLite creates) the database and applies the migrations.
    pub async fn open(url: &str) -> Result<Store> {
        sqlx::any::install_default_drivers();
        let backend = if url.starts_with("sqlite:") {
            Backend::Sqlite
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Backend::Postgres
        } else {
            return Err(StoreError::BadUrl(url.to_string()));
        };
        let connect_url = match backend {
            Backend::Sqlite if !url.contains("mode=") => {
                let separator = if url.contains('?') { '&' } else { '?' };
                format!("{url}{separator}mode=rwc")
            }
            _ => url.to_string(),
        };
        let options = AnyConnectOptions::from_str(&connect_url).map_err(|_| StoreError::BadUrl(url.to_string()))?;
        let pool = AnyPoolOptions::new()
            .max_connections(if backend == Backend::Sqlite {
                sqlite_connections()
            } else {
                POOL_CONNECTIONS_MAX
            })
            .acquire_timeout(Duration::from_secs(30))
            .after_connect(move |connection, _| {
                Box::pin(async move {
                    if backend == Backend::Sqlite {
                        for pragma in sqlite_pragmas() {
                            sqlx::query(sqlx::AssertSqlSafe(pragma))
                                .execute(&mut *connection)
                                .await?;
                        }
                    }
                    Ok(())
                })
            })
            .connect_with(options)
            .await?;
        if backend == Backend::Sqlite {
            sqlx::query("PRAGMA journal_mode = WAL").execute(&pool).await?;
            sqlx::migrate!("migrations/sqlite").run(&pool).await?;
        } else {
            sqlx::migrate!("migrations/postgres").run(&pool).await?;
        }
        Ok(Store {
            pool,
            backend,
            url: url.to_string(),
        })
    }

    /// Begins a transaction that writes. On SQLite it takes the write lock at once
    /// (`BEGIN IMMEDIATE`): a deferred transaction that reads first and writes later fails with
    /// "database is locked" when another writer commits in between, whatever the busy timeout.
    pub(crate) async fn begin_write(&self) -> Result<sqlx::Transaction<'static, sqlx::Any>> {
        Ok(match self.backend {
            Backend::Sqlite => self.pool.begin_with("BEGIN IMMEDIATE").await?,
            Backend::Postgres => self.pool.begin().await?,
        })
    }

    /// Takes the reconcile leadership's next fencing epoch. Row locks make it wait for any
    /// placement still committing under the previous epoch; later ones fail with `Fenced`.
    pub async fn take_leadership(&self) -> Result<i64> {
        let mut transaction = self.begin_write().await?;
        let row = sqlx::query("UPDATE leadership SET epoch = epoch + 1 WHERE id = 1 RETURNING epoch")
            .fetch_one(&mut *transaction)
            .await?;
        transaction.commit().await?;
        Ok(row.try_get("epoch")?)
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn pool(&self) -> &AnyPool {
        &self.pool
    }

    /// Copies SQLite's write-ahead log back into the database file as far as readers allow,
    /// without waiting for anyone (a passive checkpoint), and returns how many frames the log
    /// holds; past [`WAL_RESTART_FRAMES`] the caller should `truncate_log`. Nothing on
    /// PostgreSQL. Call it every second or so.
    ///
    /// A passive checkpoint never starts the log over while reads keep coming, so under steady
    /// load the log would only grow (to gigabytes in `bench api`), and every page read searches
    /// one more hash table of it.
    pub async fn checkpoint(&self) -> Result<i64> {
        if self.backend != Backend::Sqlite {
            return Ok(0);
        }
        let (_busy, log_frames, _copied): (i64, i64, i64) = sqlx::query_as("PRAGMA wal_checkpoint(PASSIVE)")
            .fetch_one(&self.pool)
            .await?;
        Ok(log_frames)
    }

    /// Copies the whole log back and starts it over at zero bytes (SQLite). It waits for readers
    /// of older snapshots and keeps writers out meanwhile, so the caller should hold the writers'
    /// turn. Busy (readers outlasted the timeout) is not an error: the next call tries again.
    pub async fn truncate_log(&self) -> Result<()> {
        if self.backend == Backend::Sqlite {
            sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
                .execute(&self.pool)
                .await?;
        }
        Ok(())
    }

    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// Tries to become the reconcile leader. SQLite has one server per file, so it always leads;
    /// on PostgreSQL a session advisory lock decides, and the lock dies with its connection.
    pub async fn try_lead(&self) -> Result<Option<LeaderGuard>> {
        if self.backend == Backend::Sqlite {
            return Ok(Some(LeaderGuard { connection: None }));
        }
        let mut connection = AnyConnection::connect(&self.url).await?;
        let row = sqlx::query("SELECT CAST(pg_try_advisory_lock($1) AS INT) AS held")
            .bind(LEADER_LOCK_KEY)
            .fetch_one(&mut connection)
            .await?;
        let held: i32 = row.try_get("held")?;
        if held == 1 {
            Ok(Some(LeaderGuard {
                connection: Some(connection),
            }))
        } else {
            let _ = connection.close().await;
            Ok(None)
        }
    }
}

mod accounts;
mod gangs;
mod jobs;
mod ledger;
mod nodes;
mod records;
mod reservations;
mod services;
mod serving;
mod sites;
mod trust;
