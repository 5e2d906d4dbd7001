//! Failover of the reconcile leader: three `fallow server` replicas on one PostgreSQL database.
//! Jobs arrive through every replica and the nodes heartbeat through every replica; the leader
//! is SIGKILLed while jobs arrive and are placed. Another replica must take the lead within
//! seconds (PostgreSQL drops the dead session's advisory lock when its connection closes), no
//! acknowledged job may be lost, no lease granted twice, and the new leader must place both
//! the jobs queued at the kill and the ones submitted after it.

mod common;

use std::time::{Duration, Instant};

use common::*;
use store::Store;

const REPLICAS: [&str; 3] = ["a", "b", "c"];
const NODES: usize = 4;
const GPUS_PER_NODE: u8 = 16;
/// Jobs submitted in all, plus the probes after the failover: all fit the fleet's 64 GPUs.
const JOBS_MAX: u64 = 56;
const PROBES: usize = 4;
const SUBMITTERS: usize = 6;
/// Paced so the submissions outlast the failover.
const SUBMIT_PAUSE: Duration = Duration::from_millis(150);
/// The leader is killed once it granted this many leases.
const KILL_AFTER_GRANTED: f64 = 4.0;
const KILL_AFTER_ACKED: u64 = JOBS_MAX / 3;
const TAKEOVER_WITHIN: Duration = Duration::from_secs(15);
const PLACED_WITHIN: Duration = Duration::from_secs(30);

/// Waits until exactly one of `bases` reports `fallow_leader 1`, and returns it.
async fn single_leader(http: &reqwest::Client, bases: &[String], within: Duration) -> String {
    eventually(within, "exactly one replica leading", || async {
        let mut leading = leaders(http, bases).await;
        (leading.len() == 1).then(|| leading.remove(0))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_leader_is_replaced_within_seconds_and_nothing_is_lost_or_leased_twice() {
    let Some(base) = postgres_url("the failover test") else {
        return;
    };
    let database = fresh_postgres_database(&base).await;
    let scratch = Scratch::new("fallow_failover");
    let http = http();
    // All at once, as an orchestrator starts them: exactly one creates the admin account (and
    // writes admin.key to its data directory); the others find it in the database.
    let start = |name: &'static str| {
        let (database, scratch) = (database.clone(), scratch.path.clone());
        async move { Coordinator::start(name, &database, &scratch.join(name), &scratch).await }
    };
    let (a, b, c) = tokio::join!(start(REPLICAS[0]), start(REPLICAS[1]), start(REPLICAS[2]));
    let mut replicas = vec![a, b, c];
    let admin_keys: Vec<String> = replicas.iter().filter_map(Coordinator::admin_key).collect();
    assert_eq!(admin_keys.len(), 1, "exactly one replica writes admin.key");
    let admin_key = admin_keys[0].clone();
    let urls: Vec<String> = replicas.iter().map(|replica| replica.url.clone()).collect();
    let leader = single_leader(&http, &urls, TAKEOVER_WITHIN).await;
    let leader_index = urls.iter().position(|url| *url == leader).expect("a replica leads");

    let market = set_up_market(&http, &urls[1], &admin_key, NODES, GPUS_PER_NODE).await;
    let targets = Targets::new(urls.clone());
    let heartbeats = Heartbeats::start(&http, market.agents.clone(), targets.clone());
    wait_online(&http, &urls[2], &market, Duration::from_secs(20)).await;
    let store = Store::open(&database).await.expect("the test opens the database");

    let storm = Storm::start(
        &http,
        targets.clone(),
        &market.tenant_key,
        "f",
        SUBMITTERS,
        JOBS_MAX,
        SUBMIT_PAUSE,
    );
    // Kill once the leader is placing jobs (on a slow machine, at the latest once a third of
    // the jobs are in), while more arrive.
    let granted_at_kill = eventually(PLACED_WITHIN, "the leader placing jobs", || async {
        let granted = metric(&http, &leader, "fallow_leases_granted_total").await?;
        (granted >= KILL_AFTER_GRANTED || storm.acked() as u64 >= KILL_AFTER_ACKED).then_some(granted)
    })
    .await;
    let acked_at_kill = storm.acked();
    replicas[leader_index].kill();
    let killed_at = Instant::now();
    let survivors: Vec<String> = urls.iter().filter(|url| **url != leader).cloned().collect();
    targets.set(survivors.clone());

    let new_leader = single_leader(&http, &survivors, TAKEOVER_WITHIN).await;
    let takeover = killed_at.elapsed();
    let new_leader_index = urls
        .iter()
        .position(|url| *url == new_leader)
        .expect("a survivor leads");
    assert!(
        replicas[new_leader_index]
            .log_tail()
            .contains("this replica now leads the reconcile loop"),
        "the new leader says so in its log:\n{}",
        replicas[new_leader_index].log_tail()
    );
    let outcomes = storm.finish().await;
    eprintln!(
        "leader {} killed with {acked_at_kill} jobs acknowledged and {granted_at_kill} leases granted; \
         {} took over after {takeover:?}; \
         {} acknowledged in all, {} without an answer",
        REPLICAS[leader_index],
        REPLICAS[new_leader_index],
        outcomes.acked.len(),
        outcomes.unknown.len()
    );
    assert!(
        outcomes.acked.len() > acked_at_kill,
        "the surviving replicas kept acknowledging submissions during the failover"
    );

    // Every acknowledged job exists and keeps its id; unanswered tokens exist once after this.
    let jobs = resubmit(&http, &targets, &market.tenant_key, &outcomes).await;
    let mut acked: Vec<(String, i64)> = jobs.into_iter().collect();
    for probe in 0..PROBES {
        let token = format!("probe-{probe}");
        match submit(&http, &survivors[probe % survivors.len()], &market.tenant_key, &token).await {
            Submitted::Acked(id) => acked.push((token, id)),
            other => panic!("probe {probe} after the failover: {other:?}"),
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
            ended: 0
        }
    );
    let granted_by_new_leader = metric(&http, &new_leader, "fallow_leases_granted_total")
        .await
        .expect("the new leader's metrics");
    assert!(
        granted_by_new_leader >= PROBES as f64,
        "the new leader placed the probes ({granted_by_new_leader} leases granted)"
    );
    assert_eq!(
        leaders(&http, &survivors).await,
        vec![new_leader.clone()],
        "one leader at the end"
    );
    for survivor in &survivors {
        assert_metrics_balanced(&http, survivor).await;
    }
    eprintln!(
        "all {} jobs placed {placed_in:?} after the last submission; the new leader granted {granted_by_new_leader} leases",
        acked.len()
    );
    heartbeats.stop().await;
    store.close().await;
    drop(replicas);
    drop_postgres_database(&base, &database).await;
}
