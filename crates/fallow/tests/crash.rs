//! Crash tests of the coordinator process, on SQLite and on PostgreSQL: SIGKILL `fallow server`
//! while jobs are being submitted (group-committed) and placed (leases and escrow holds
//! committed), restart it on the same database and data directory, and check that every
//! acknowledged job survived and keeps its id, that nothing was leased twice, that matching
//! resumes, and that the ledger balances. Three rounds, each killing at another moment. And a
//! SIGTERM, which must stop it cleanly (exit status 0) with the same guarantees.

mod common;

use std::time::{Duration, Instant};

use common::*;
use store::Store;

/// When, in a round, the coordinator is killed.
#[derive(Clone, Copy, Debug)]
enum Moment {
    /// Once this many of the round's submissions were acknowledged.
    Acked(usize),
    /// Once this process granted this many more leases in the round (placements committed
    /// while more are being decided and written).
    Granted(u64),
}

const ROUNDS: [Moment; 3] = [Moment::Acked(1), Moment::Acked(16), Moment::Granted(4)];
const NODES: usize = 4;
const GPUS_PER_NODE: u8 = 16;
const SUBMITTERS: usize = 8;
/// Jobs submitted per round at most, plus the probes after the restart: all fit the fleet's
/// 64 GPUs, so every one of them must be placed.
const JOBS_PER_ROUND_MAX: u64 = 48;
const PROBES: usize = 4;
const SUBMIT_PAUSE: Duration = Duration::from_millis(20);
const MOMENT_WITHIN: Duration = Duration::from_secs(30);
const PLACED_WITHIN: Duration = Duration::from_secs(30);

async fn leases_granted(http: &reqwest::Client, base: &str) -> u64 {
    metric(http, base, "fallow_leases_granted_total").await.unwrap_or(0.0) as u64
}

async fn crash_rounds(backend: &str, database: &str, scratch: &Scratch) {
    let http = http();
    let data_dir = scratch.path.join("data");
    let mut server = Coordinator::start("coordinator", database, &data_dir, &scratch.path).await;
    let admin_key = server.admin_key().expect("the first start writes admin.key");
    let market = set_up_market(&http, &server.url, &admin_key, NODES, GPUS_PER_NODE).await;
    let targets = Targets::new(vec![server.url.clone()]);
    let heartbeats = Heartbeats::start(&http, market.agents.clone(), targets.clone());
    wait_online(&http, &server.url, &market, Duration::from_secs(20)).await;
    let store = Store::open(database).await.expect("the test opens the database");
    let mut earlier_jobs = 0;
    for (round, moment) in ROUNDS.into_iter().enumerate() {
        let round_started = Instant::now();
        let granted_before = leases_granted(&http, &server.url).await;
        let storm = Storm::start(
            &http,
            targets.clone(),
            &market.tenant_key,
            &format!("r{round}"),
            SUBMITTERS,
            JOBS_PER_ROUND_MAX,
            SUBMIT_PAUSE,
        );
        let deadline = Instant::now() + MOMENT_WITHIN;
        loop {
            let reached = match moment {
                Moment::Acked(count) => storm.acked() >= count,
                Moment::Granted(count) => leases_granted(&http, &server.url).await >= granted_before + count,
            };
            if reached {
                break;
            }
            // Placements may come after the last submission; acknowledgements may not.
            assert!(
                matches!(moment, Moment::Granted(_)) || !storm.finished(),
                "{backend} round {round}: the submissions ended before {moment:?}; log:\n{}",
                server.log_tail()
            );
            assert!(
                Instant::now() < deadline,
                "{backend} round {round}: {moment:?} not within {MOMENT_WITHIN:?}; log:\n{}",
                server.log_tail()
            );
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let (acked_at_kill, submitting_at_kill) = (storm.acked(), !storm.finished());
        server.kill();
        let outcomes = storm.stop().await;
        eprintln!(
            "{backend} round {round}: killed at {moment:?} after {:?} (submissions still arriving: \
             {submitting_at_kill}): {acked_at_kill} acknowledged then, {} in all, {} without an answer",
            round_started.elapsed(),
            outcomes.acked.len(),
            outcomes.unknown.len()
        );
        // What the crash left: nothing acknowledged lost, nothing leased twice, money held
        // exactly for placed jobs.
        let at_crash = assert_invariants(&store, market.tenant_id, &outcomes.acked).await;
        assert_eq!(at_crash.ended, earlier_jobs, "{backend} round {round}: {at_crash:?}");
        eprintln!(
            "{backend} round {round}: at the crash {} jobs queued, {} running",
            at_crash.queued, at_crash.running
        );

        server = Coordinator::start("coordinator", database, &data_dir, &scratch.path).await;
        assert_eq!(
            server.admin_key().as_deref(),
            Some(admin_key.as_str()),
            "a restart leaves admin.key alone"
        );
        targets.set(vec![server.url.clone()]);
        // The same token names the same job; unanswered ones exist once after this.
        let jobs = resubmit(&http, &targets, &market.tenant_key, &outcomes).await;
        let mut acked: Vec<(String, i64)> = jobs.into_iter().collect();
        // Matching resumed: what was queued at the crash and jobs submitted now are placed.
        for probe in 0..PROBES {
            let token = format!("r{round}-probe-{probe}");
            match submit(&http, &server.url, &market.tenant_key, &token).await {
                Submitted::Acked(id) => acked.push((token, id)),
                other => panic!("{backend} round {round}: probe {probe} after the restart: {other:?}"),
            }
        }
        let placed_from = Instant::now();
        wait_all_placed(&store, PLACED_WITHIN).await;
        let placed_in = placed_from.elapsed();
        let counts = assert_invariants(&store, market.tenant_id, &acked).await;
        assert_eq!(
            counts,
            Counts {
                queued: 0,
                running: acked.len(),
                ended: earlier_jobs
            },
            "{backend} round {round}"
        );
        assert_metrics_balanced(&http, &server.url).await;
        // Free the fleet for the next round; the ledger still balances and nothing stays held.
        cancel_all(&http, &server.url, &store, &market).await;
        earlier_jobs += acked.len();
        let counts = assert_invariants(&store, market.tenant_id, &[]).await;
        assert_eq!(counts.ended, earlier_jobs, "{backend} round {round}: after cancelling");
        eprintln!(
            "{backend} round {round}: {} jobs placed {placed_in:?} after the restart; round took {:?}",
            acked.len(),
            round_started.elapsed()
        );
    }
    assert_metrics_balanced(&http, &server.url).await;
    heartbeats.stop().await;
    store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_coordinator_killed_mid_submission_and_placement_loses_nothing() {
    let scratch = Scratch::new("fallow_crash_sqlite");
    let database = format!("sqlite://{}", scratch.path.join("fallow.db").display());
    crash_rounds("sqlite", &database, &scratch).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_coordinator_killed_mid_submission_and_placement_loses_nothing() {
    let Some(base) = postgres_url("the PostgreSQL crash test") else {
        return;
    };
    let scratch = Scratch::new("fallow_crash_postgres");
    let database = fresh_postgres_database(&base).await;
    crash_rounds("postgres", &database, &scratch).await;
    drop_postgres_database(&base, &database).await;
}

/// SIGTERM mid-submission: the coordinator exits 0 within seconds, every job it acknowledged is
/// there after a restart, and matching resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_coordinator_stops_cleanly_on_sigterm() {
    let scratch = Scratch::new("fallow_sigterm_sqlite");
    let database = format!("sqlite://{}", scratch.path.join("fallow.db").display());
    let http = http();
    let data_dir = scratch.path.join("data");
    let mut server = Coordinator::start("coordinator", &database, &data_dir, &scratch.path).await;
    let admin_key = server.admin_key().expect("the first start writes admin.key");
    let market = set_up_market(&http, &server.url, &admin_key, NODES, GPUS_PER_NODE).await;
    let targets = Targets::new(vec![server.url.clone()]);
    let heartbeats = Heartbeats::start(&http, market.agents.clone(), targets.clone());
    wait_online(&http, &server.url, &market, Duration::from_secs(20)).await;
    let storm = Storm::start(
        &http,
        targets.clone(),
        &market.tenant_key,
        "term",
        SUBMITTERS,
        JOBS_PER_ROUND_MAX,
        SUBMIT_PAUSE,
    );
    let deadline = Instant::now() + MOMENT_WITHIN;
    while storm.acked() < 8 {
        assert!(Instant::now() < deadline, "8 acknowledgements within {MOMENT_WITHIN:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let status = server.terminate(Duration::from_secs(30));
    let outcomes = storm.stop().await;
    assert!(
        status.is_some_and(|status| status.success()),
        "exit status {status:?} after SIGTERM; log:\n{}",
        server.log_tail()
    );
    assert!(server.log_tail().contains("SIGTERM: stopping"), "{}", server.log_tail());
    let store = Store::open(&database).await.expect("the test opens the database");
    assert_invariants(&store, market.tenant_id, &outcomes.acked).await;
    server = Coordinator::start("coordinator", &database, &data_dir, &scratch.path).await;
    targets.set(vec![server.url.clone()]);
    let jobs = resubmit(&http, &targets, &market.tenant_key, &outcomes).await;
    let acked: Vec<(String, i64)> = jobs.into_iter().collect();
    wait_all_placed(&store, PLACED_WITHIN).await;
    let counts = assert_invariants(&store, market.tenant_id, &acked).await;
    assert_eq!(
        counts.running,
        acked.len(),
        "every job placed after the restart: {counts:?}"
    );
    heartbeats.stop().await;
    store.close().await;
}
