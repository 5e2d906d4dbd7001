//! The store's conformance suite: every test runs on SQLite (a real file) and on PostgreSQL (a
//! real server, from `FALLOW_TEST_POSTGRES_URL`). Without that variable the PostgreSQL leg is
//! skipped with a loud message, unless `FALLOW_CI_REQUIRE_SERVICES=1`, where it fails.

mod common;

use common::{on_every_backend, unique};
use store::{
    AccountBalance, ApiKeyRecord, CanaryStanding, FraudRow, Heartbeat, JobRecord, JobState, LeaseMove, LeaseState,
    LedgerOutcome, LedgerTotals, LedgerTransactionRow, LiveLeaseTotals, NewCanary, NewJob, NewLease, NewNode,
    NodeOutcome, NodesVersion, OnlineChange, OverLimitChange, Overbooking, OverdueCanary, ProviderFraud, Role, Store,
    StoreError, TenantCharge, UsageRow, Victim,
};

fn online(node_id: i64, online: bool, changed_at: i64) -> OnlineChange {
    OnlineChange {
        node_id,
        online,
        changed_at,
    }
}

fn over_limit(node_id: i64, over_limit_since: Option<i64>, changed_at: i64) -> OverLimitChange {
    OverLimitChange {
        node_id,
        over_limit_since,
        changed_at,
    }
}

fn node(provider_id: i64, name: &str) -> NewNode {
    NewNode {
        provider_id,
        name: name.to_string(),
        public_key: unique("key"),
        fingerprint: "fp1".to_string(),
        region: "eu-west".to_string(),
        site: "ams1".to_string(),
        fabric: "ams1-ib0".to_string(),
        nvlink_domain: format!("{name}-board"),
        latitude: 52.37,
        longitude: 4.9,
        gpu_model: "H100-SXM5".to_string(),
        gpu_count: 8,
        cpu_milli: 128_000,
        memory_mib: 1_048_576,
        network_mbit_s: 100_000,
        simulated: true,
        policy: "{}".to_string(),
        datasets: "[]".to_string(),
        runtimes: "container,process".to_string(),
        advertise_addr: String::new(),
        gang_ports: String::new(),
        nvlink_source: String::new(),
        nvlink_detected: String::new(),
        location_source: String::new(),
    }
}

/// Replica `replica`'s lease: two whole GPUs of the node, its own (replica 0 holds GPUs 0 and 1).
fn lease(node_id: i64, replica: i64) -> NewLease {
    NewLease {
        replica,
        node_id,
        gpu_mask: 0b11 << (2 * replica),
        gpu_milli: 1000,
        cpu_milli: 8000,
        memory_mib: 65536,
        price_micros: 2_100_000,
        tier: "silver".to_string(),
        gpu_model: "H100-SXM5".to_string(),
        region: "eu-west".to_string(),
        expected_end: 10_000_000,
        preempt_at: None,
    }
}

fn job(tenant_id: i64, token: Option<&str>) -> NewJob {
    NewJob {
        tenant_id,
        client_token: token.map(str::to_string),
        spec: r#"{"image":"busybox"}"#.to_string(),
        tier: "silver".to_string(),
        submitted_at: 1_000,
        reservation_id: None,
    }
}

#[tokio::test]
async fn accounts_and_keys() {
    on_every_backend(|backend, store| async move {
        let tenant = store.create_account(Role::Tenant, "acme", 5).await.unwrap();
        assert_eq!(
            store.account(tenant.id).await.unwrap().as_ref(),
            Some(&tenant),
            "{backend}"
        );
        assert!(
            matches!(
                store.create_account(Role::Provider, "acme", 6).await,
                Err(StoreError::Conflict(_))
            ),
            "{backend}: names are unique"
        );
        let key = ApiKeyRecord {
            key_id: "abc123".to_string(),
            account_id: tenant.id,
            secret_hash: "hash".to_string(),
            label: "laptop".to_string(),
            created_at: 7,
            revoked_at: None,
        };
        store.insert_api_key(&key).await.unwrap();
        assert_eq!(store.api_key("abc123").await.unwrap(), Some(key.clone()), "{backend}");
        assert!(store.revoke_api_key("abc123", 9).await.unwrap());
        assert!(
            !store.revoke_api_key("abc123", 10).await.unwrap(),
            "{backend}: revoking twice is a no-op"
        );
        assert_eq!(store.api_key("abc123").await.unwrap().unwrap().revoked_at, Some(9));
        assert_eq!(store.api_keys_of(tenant.id).await.unwrap().len(), 1);
        assert_eq!(store.api_key("missing").await.unwrap(), None);
    })
    .await;
}

#[tokio::test]
async fn nodes_heartbeats_and_nonces() {
    on_every_backend(|backend, store| async move {
        let provider = store.create_account(Role::Provider, "gpu-farm", 1).await.unwrap();
        let first = store.insert_node(&node(provider.id, "n1"), 10).await.unwrap();
        let second = store.insert_node(&node(provider.id, "n2"), 11).await.unwrap();
        assert!(
            matches!(
                store.insert_node(&node(provider.id, "n1"), 12).await,
                Err(StoreError::Conflict(_))
            ),
            "{backend}: a provider's node names are unique"
        );
        assert_eq!(store.node(first.id).await.unwrap().unwrap(), first);
        assert_eq!(store.nodes().await.unwrap().len(), 2);
        assert_eq!(
            store.nodes_version().await.unwrap(),
            NodesVersion {
                updated_at: 11,
                highest_id: second.id
            }
        );
        store
            .record_heartbeats(&[
                Heartbeat {
                    node_id: first.id,
                    at: 100,
                    telemetry: "{\"t\":1}".to_string(),
                    datasets: None,
                    within_limits: true,
                },
                Heartbeat {
                    node_id: second.id,
                    at: 100,
                    telemetry: "{}".to_string(),
                    datasets: Some("[1]".to_string()),
                    within_limits: true,
                },
            ])
            .await
            .unwrap();
        let seen = store.node(second.id).await.unwrap().unwrap();
        assert!(seen.online, "{backend}");
        assert_eq!(seen.last_heartbeat_at, Some(100));
        assert_eq!(seen.node.datasets, "[1]");
        assert_eq!(
            store.nodes_version().await.unwrap().updated_at,
            100,
            "{backend}: new datasets move the version"
        );
        assert_eq!(
            store.online_changes_since(100).await.unwrap(),
            vec![online(first.id, true, 100), online(second.id, true, 100)],
            "{backend}: coming online is a change of its own"
        );
        // Over its owner's limits: set at once, kept by heartbeats that say so, cleared by the
        // first batched heartbeat within them; each change is in the feed.
        assert!(store.set_node_over_limit(first.id, true, 150).await.unwrap());
        assert!(
            !store.set_node_over_limit(first.id, true, 151).await.unwrap(),
            "{backend}: already"
        );
        assert_eq!(store.nodes_over_limit_since(150).await.unwrap(), vec![first.id]);
        assert!(store.nodes_over_limit_since(149).await.unwrap().is_empty());
        assert_eq!(
            store.over_limit_changes_since(150).await.unwrap(),
            vec![over_limit(first.id, Some(150), 150)],
            "{backend}"
        );
        let beat = |at: i64, within_limits: bool| Heartbeat {
            node_id: first.id,
            at,
            telemetry: "{}".to_string(),
            datasets: None,
            within_limits,
        };
        store.record_heartbeats(&[beat(160, false)]).await.unwrap();
        // A heartbeat from before the flag was set (written late) does not clear it.
        store.record_heartbeats(&[beat(140, true)]).await.unwrap();
        assert_eq!(store.node(first.id).await.unwrap().unwrap().over_limit_since, Some(150));
        store.record_heartbeats(&[beat(170, true)]).await.unwrap();
        assert_eq!(
            store.node(first.id).await.unwrap().unwrap().over_limit_since,
            None,
            "{backend}"
        );
        assert_eq!(
            store.over_limit_changes_since(160).await.unwrap(),
            vec![over_limit(first.id, None, 170)],
            "{backend}"
        );
        store
            .record_heartbeats(&[Heartbeat {
                node_id: first.id,
                at: 200,
                telemetry: "{}".to_string(),
                datasets: None,
                within_limits: true,
            }])
            .await
            .unwrap();
        assert_eq!(store.silent_nodes(150).await.unwrap(), vec![second.id], "{backend}");
        assert!(store.set_node_offline(second.id, 300).await.unwrap());
        assert_eq!(
            store.online_changes_since(300).await.unwrap(),
            vec![online(second.id, false, 300)]
        );
        assert_eq!(
            store.nodes_version().await.unwrap().updated_at,
            100,
            "{backend}: going offline does not rebuild"
        );
        assert!(!store.set_node_offline(second.id, 301).await.unwrap());
        assert!(store.silent_nodes(150).await.unwrap().is_empty());
        store
            .record_heartbeats(&[Heartbeat {
                node_id: second.id,
                at: 350,
                telemetry: "{\"t\":2}".to_string(),
                datasets: Some("[1]".to_string()),
                within_limits: true,
            }])
            .await
            .unwrap();
        let back = store.node(second.id).await.unwrap().unwrap();
        assert!(back.online, "{backend}: a heartbeat brings an offline node back");
        assert_eq!(
            (back.last_heartbeat_at, back.telemetry.as_deref()),
            (Some(350), Some("{\"t\":2}"))
        );
        assert_eq!(
            store.online_changes_since(350).await.unwrap(),
            vec![online(second.id, true, 350)],
            "{backend}: coming back is a change"
        );
        assert_eq!(
            store.nodes_version().await.unwrap().updated_at,
            100,
            "{backend}: the same datasets again do not move the version"
        );
        assert!(store.set_node_policy(first.id, "{\"x\":1}", 400).await.unwrap());
        assert!(!store.set_node_policy(9999, "{}", 400).await.unwrap());
        assert!(store.set_node_fingerprint(first.id, "fp2", 401).await.unwrap());
        assert!(
            !store.set_node_fingerprint(first.id, "fp2", 402).await.unwrap(),
            "{backend}: unchanged"
        );
        let fresh = store
            .remember_nonces(&[
                (first.id, "aa".to_string(), 1),
                (first.id, "bb".to_string(), 1),
                (second.id, "aa".to_string(), 1),
            ])
            .await
            .unwrap();
        assert_eq!(fresh, vec![true, true, true], "{backend}");
        let again = store.remember_nonces(&[(first.id, "aa".to_string(), 2)]).await.unwrap();
        assert_eq!(again, vec![false], "{backend}: a replayed nonce is refused");
        // A replay inside one batch: the first is new, the second not; a batch longer than one
        // statement keeps its order.
        let mut batch: Vec<(i64, String, i64)> = (0..600).map(|n| (second.id, format!("n{n}"), 1)).collect();
        batch.insert(10, (second.id, "n3".to_string(), 1));
        batch.insert(300, (second.id, "n7".to_string(), 1));
        batch.push((first.id, "bb".to_string(), 1));
        let fresh = store.remember_nonces(&batch).await.unwrap();
        let replays = [10, 300, 602];
        let expected: Vec<bool> = (0..batch.len()).map(|at| !replays.contains(&at)).collect();
        assert_eq!(fresh, expected, "{backend}: replays within and before the batch");
        assert_eq!(store.forget_nonces_before(2).await.unwrap(), 603);
    })
    .await;
}

#[tokio::test]
async fn nodes_changed_since_tells_new_nodes_from_changed_ones() {
    on_every_backend(|backend, store| async move {
        let provider = store.create_account(Role::Provider, "rack-owner", 1).await.unwrap();
        let first = store.insert_node(&node(provider.id, "n1"), 10).await.unwrap();
        let built = store.nodes_version().await.unwrap();
        assert!(
            !store.nodes_changed_since(built).await.unwrap(),
            "{backend}: nothing since"
        );
        let second = store.insert_node(&node(provider.id, "n2"), 20).await.unwrap();
        let now = store.nodes_version().await.unwrap();
        assert_eq!(now.highest_id, second.id);
        assert_ne!(now, built, "{backend}: a registration moves the version");
        assert!(
            !store.nodes_changed_since(built).await.unwrap(),
            "{backend}: only a new node since"
        );
        assert!(store.set_node_policy(first.id, "{\"x\":1}", 30).await.unwrap());
        assert!(
            store.nodes_changed_since(built).await.unwrap(),
            "{backend}: a node the view holds changed"
        );
        assert!(
            store.nodes_changed_since(now).await.unwrap(),
            "{backend}: and it changed after the second registration too"
        );
        let after = store.nodes_version().await.unwrap();
        assert!(!store.nodes_changed_since(after).await.unwrap(), "{backend}");
        let third = store.insert_node(&node(provider.id, "n3"), 40).await.unwrap();
        let ids = |records: Vec<store::NodeRecord>| records.iter().map(|record| record.id).collect::<Vec<_>>();
        assert_eq!(
            ids(store.nodes_between(first.id, third.id).await.unwrap()),
            [second.id, third.id],
            "{backend}: the nodes after the first, in id order"
        );
        assert_eq!(
            ids(store.nodes_between(first.id, second.id).await.unwrap()),
            [second.id],
            "{backend}: none past the bound"
        );
        assert!(
            store.nodes_between(third.id, third.id).await.unwrap().is_empty(),
            "{backend}"
        );
        let read = store.nodes_between(second.id, third.id).await.unwrap();
        assert_eq!(
            read[0],
            store.node(third.id).await.unwrap().unwrap(),
            "{backend}: whole rows"
        );
    })
    .await;
}

#[tokio::test]
async fn jobs_leases_and_fencing() {
    on_every_backend(|backend, store| async move {
        let tenant = store.create_account(Role::Tenant, "t", 1).await.unwrap();
        let provider = store.create_account(Role::Provider, "p", 1).await.unwrap();
        let host = store.insert_node(&node(provider.id, "n1"), 1).await.unwrap();
        let jobs = store
            .insert_jobs(&[
                job(tenant.id, Some("once")),
                job(tenant.id, None),
                job(tenant.id, Some("once")),
            ])
            .await
            .unwrap();
        assert_eq!(
            jobs[0].id, jobs[2].id,
            "{backend}: the same client token gives the same job"
        );
        assert_ne!(jobs[0].id, jobs[1].id);
        let again = store.insert_jobs(&[job(tenant.id, Some("once"))]).await.unwrap();
        assert_eq!(again[0].id, jobs[0].id, "{backend}: also across batches");
        assert_eq!(store.jobs_in_states(&[JobState::Queued]).await.unwrap().len(), 2);
        let leases = store
            .commit_placement(jobs[0].id, &[lease(host.id, 0), lease(host.id, 1)], 50)
            .await
            .unwrap()
            .expect("a queued job commits");
        assert_eq!(leases.len(), 2);
        assert!(
            leases
                .iter()
                .all(|lease| lease.epoch == 1 && lease.state == LeaseState::Pending)
        );
        assert_eq!(
            store
                .commit_placement(jobs[0].id, &[lease(host.id, 0)], 51)
                .await
                .unwrap(),
            None,
            "{backend}: a job is placed once"
        );
        assert_eq!(store.job(jobs[0].id).await.unwrap().unwrap().state, JobState::Running);
        store
            .set_queued_reasons(
                &[
                    (jobs[0].id, "waiting: late".to_string()),
                    (jobs[1].id, "waiting: no H100 under $1.00".to_string()),
                ],
                52,
            )
            .await
            .unwrap();
        let (running, queued) = (
            store.job(jobs[0].id).await.unwrap().unwrap(),
            store.job(jobs[1].id).await.unwrap().unwrap(),
        );
        assert_eq!(
            (running.state, running.state_reason.as_str()),
            (JobState::Running, ""),
            "{backend}: a job no longer queued keeps its state and reason"
        );
        assert_eq!(
            (queued.state, queued.state_reason.as_str()),
            (JobState::Queued, "waiting: no H100 under $1.00"),
            "{backend}"
        );
        assert_eq!(store.live_leases().await.unwrap().len(), 2);
        assert_eq!(store.live_leases_of_node(host.id).await.unwrap().len(), 2);
        assert_eq!(
            store.live_lease_totals().await.unwrap(),
            LiveLeaseTotals {
                leases: 2,
                gpu_milli: 4000
            }
        );
        let first = leases[0].id;
        assert_eq!(
            store.move_lease(first, 1, LeaseState::Running, "", 60).await.unwrap(),
            LeaseMove::Moved
        );
        assert_eq!(
            store.move_lease(first, 1, LeaseState::Staging, "", 61).await.unwrap(),
            LeaseMove::Already,
            "{backend}: a lease never moves back (a replica started again after a fence)"
        );
        assert_eq!(
            store.move_lease(first, 1, LeaseState::Running, "", 62).await.unwrap(),
            LeaseMove::Already,
            "{backend}: a repeated report changes nothing"
        );
        assert_eq!(store.lease(first).await.unwrap().unwrap().state, LeaseState::Running);
        assert_eq!(store.overbooked_gpus(63).await.unwrap(), Vec::new(), "{backend}");
        let lost = store
            .end_lease(first, LeaseState::Lost, "node silent", 70)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(lost.epoch, 2, "{backend}: losing a lease bumps its epoch");
        assert_eq!(
            store.move_lease(first, 1, LeaseState::Finished, "", 80).await.unwrap(),
            LeaseMove::NotLive,
            "{backend}: an old epoch is fenced off"
        );
        assert_eq!(store.end_lease(first, LeaseState::Lost, "", 90).await.unwrap(), None);
        assert_eq!(store.live_leases().await.unwrap().len(), 1);
        assert!(
            store
                .set_job_state(jobs[1].id, &[JobState::Queued], JobState::Cancelled, "by tenant", 99)
                .await
                .unwrap()
        );
        assert!(
            !store
                .set_job_state(jobs[1].id, &[JobState::Queued], JobState::Running, "", 99)
                .await
                .unwrap()
        );
        assert_eq!(
            store
                .commit_placement(jobs[1].id, &[lease(host.id, 0)], 100)
                .await
                .unwrap(),
            None
        );
        let tenant_jobs = store.jobs_of_tenant(tenant.id, None, 10).await.unwrap();
        assert_eq!(
            tenant_jobs.iter().map(|job| job.id).collect::<Vec<_>>(),
            vec![jobs[1].id, jobs[0].id]
        );
        assert_eq!(
            store
                .jobs_of_tenant(tenant.id, Some(jobs[1].id), 10)
                .await
                .unwrap()
                .len(),
            1
        );
        let listed = |filter: store::JobsWhere| {
            let store = &store;
            async move {
                let jobs = store.jobs_of_tenant_where(tenant.id, &filter).await.unwrap();
                jobs.iter().map(|job| job.id).collect::<Vec<_>>()
            }
        };
        let second = store.job(jobs[1].id).await.unwrap().unwrap();
        let first_state = store.job(jobs[0].id).await.unwrap().unwrap().state;
        assert_ne!(
            second.state, first_state,
            "{backend}: the two jobs are in different states"
        );
        let limit = 10;
        let state = Some(second.state);
        assert_eq!(
            listed(store::JobsWhere {
                limit,
                state,
                ..Default::default()
            })
            .await,
            vec![jobs[1].id],
            "{backend}"
        );
        let since_us = Some(second.submitted_at);
        assert_eq!(
            listed(store::JobsWhere {
                limit,
                since_us,
                ..Default::default()
            })
            .await
            .len(),
            2,
            "{backend}"
        );
        let since_us = Some(second.submitted_at + 1);
        assert_eq!(
            listed(store::JobsWhere {
                limit,
                since_us,
                ..Default::default()
            })
            .await,
            Vec::<i64>::new(),
            "{backend}"
        );
        let points = store.price_points(0, 10).await.unwrap();
        assert_eq!(points.len(), 2, "{backend}");
        assert_eq!(points[0].gpu_milli_total, 2000);
        store.append_lease_event(first, 1, "running", "", 60).await.unwrap();
        assert_eq!(store.lease_events(first).await.unwrap().len(), 1);
    })
    .await;
}

#[tokio::test]
async fn usage_and_attestations_are_accepted_once() {
    on_every_backend(|backend, store| async move {
        let usage = UsageRow {
            lease_id: 7,
            sequence: 1,
            node_id: 3,
            gpu_seconds_milli: 60_000,
            charged_micros: 35_000,
            body: "{}".to_string(),
            signature: "sig".to_string(),
            received_at: 5,
        };
        assert!(store.insert_usage(&usage).await.unwrap());
        assert!(
            !store.insert_usage(&usage).await.unwrap(),
            "{backend}: a usage record counts once"
        );
        assert!(
            store
                .insert_usage(&UsageRow {
                    sequence: 2,
                    ..usage.clone()
                })
                .await
                .unwrap()
        );
        assert_eq!(store.usage_total(7).await.unwrap(), 120_000);
        assert_eq!(store.usage_of_lease(7).await.unwrap().len(), 2);
        let attestation = store::AttestationRow {
            lease_id: 7,
            epoch: 1,
            node_id: 3,
            body: "{}".to_string(),
            signature: "sig".to_string(),
            received_at: 9,
        };
        assert!(store.insert_attestation(&attestation).await.unwrap());
        assert!(!store.insert_attestation(&attestation).await.unwrap(), "{backend}");
        assert_eq!(store.attestation(7).await.unwrap(), Some(attestation));

        store.record_evidence(Some(3), "bad_signature", "x", 1).await.unwrap();
        assert_eq!(store.evidence(Some(3), 10).await.unwrap().len(), 1);
        store.record_outcome(3, "lease_ok", 1).await.unwrap();
        assert_eq!(
            store.outcomes(3, 0).await.unwrap(),
            vec![NodeOutcome {
                outcome: "lease_ok".to_string(),
                weight_milli: 1000,
                at: 1
            }]
        );
    })
    .await;
}

fn canary(node_id: i64, created_at: i64, deadline_at: i64) -> NewCanary {
    NewCanary {
        node_id,
        kind: "hash".to_string(),
        seed: format!("seed-{created_at}"),
        units: 100,
        gpus: "[0,1]".to_string(),
        memory_mib: 73_728,
        claimed_model: "H100-SXM5".to_string(),
        expected_rate_milli: 100_000,
        fingerprint: "fp1".to_string(),
        created_at,
        deadline_at,
    }
}

#[tokio::test]
async fn matmul_canaries_are_challenged_once_and_finish_with_a_reason() {
    on_every_backend(|backend, store| async move {
        let provider = store.create_account(Role::Provider, "p", 1).await.unwrap();
        let host = store.insert_node(&node(provider.id, "n1"), 1).await.unwrap();
        let other = store.insert_node(&node(provider.id, "n2"), 1).await.unwrap();
        assert_eq!(
            store.node_canary_kinds(host.id).await.unwrap(),
            "",
            "{backend}: hash only"
        );
        store.set_node_canary_kinds(host.id, "matmul").await.unwrap();
        assert_eq!(store.node_canary_kinds(host.id).await.unwrap(), "matmul", "{backend}");
        let capable = store.nodes_with_canary_kind("matmul").await.unwrap();
        assert!(capable.contains(&host.id) && !capable.contains(&other.id), "{backend}");

        let id = store
            .insert_canary(&NewCanary {
                kind: "matmul".to_string(),
                ..canary(host.id, 10, 100)
            })
            .await
            .unwrap();
        assert!(
            store
                .challenge_canary(id, "c0ffee", ("{\"digest\":\"r\"}", "sig"), 700_000, 20)
                .await
                .unwrap()
        );
        assert!(
            !store
                .challenge_canary(id, "other", ("{}", "sig2"), 1, 21)
                .await
                .unwrap(),
            "{backend}: challenged once"
        );
        let challenged = store.canary(id).await.unwrap().unwrap();
        assert_eq!(
            (
                challenged.canary.kind.as_str(),
                challenged.challenge.as_deref(),
                challenged.challenged_at,
                challenged.finding.as_deref(),
                challenged.signature.as_deref()
            ),
            ("matmul", Some("c0ffee"), Some(20), None, Some("sig")),
            "{backend}: challenged, still open"
        );
        assert!(
            store
                .finish_canary(id, "wrong_answer", Some(700_000), None, Some("row 3 is wrong"), 30)
                .await
                .unwrap()
        );
        let finished = store.canary(id).await.unwrap().unwrap();
        assert_eq!(
            (
                finished.finding.as_deref(),
                finished.reason.as_deref(),
                finished.result.as_deref(),
                finished.signature.as_deref()
            ),
            (
                Some("wrong_answer"),
                Some("row 3 is wrong"),
                Some("{\"digest\":\"r\"}"),
                Some("sig")
            ),
            "{backend}: the signed result kept"
        );
    })
    .await;
}

#[tokio::test]
async fn canaries_outcomes_and_fraud_decisions() {
    on_every_backend(|backend, store| async move {
        let tenant = store.create_account(Role::Tenant, "t", 1).await.unwrap();
        let provider = store.create_account(Role::Provider, "p", 1).await.unwrap();
        let host = store.insert_node(&node(provider.id, "n1"), 1).await.unwrap();
        let other = store.insert_node(&node(provider.id, "n2"), 1).await.unwrap();

        // Canaries: ordered, delivered once, answered once, given up past their deadline.
        let first = store.insert_canary(&canary(host.id, 10, 100)).await.unwrap();
        let second = store.insert_canary(&canary(other.id, 20, 30)).await.unwrap();
        assert_eq!(store.open_canary_nodes().await.unwrap().len(), 2, "{backend}");
        store.mark_canaries_delivered(&[(first, 11)]).await.unwrap();
        store
            .mark_canaries_delivered(&[(first, 12), (second, 21)])
            .await
            .unwrap();
        let open = store.open_canaries_of_node(host.id).await.unwrap();
        assert_eq!(
            (open.len(), open[0].delivered_at),
            (1, Some(11)),
            "{backend}: the first delivery counts"
        );
        let open = store.open_canaries_of_node(other.id).await.unwrap();
        assert_eq!(
            open[0].delivered_at,
            Some(21),
            "{backend}: each of a batch at its own time"
        );
        assert_eq!(
            store.give_up_overdue_canaries(50).await.unwrap(),
            [OverdueCanary {
                canary_id: second,
                node_id: other.id
            }],
            "{backend}: past its deadline, given up"
        );
        assert!(
            store.give_up_overdue_canaries(50).await.unwrap().is_empty(),
            "{backend}: once"
        );
        assert!(
            !store.withdraw_canary(second, 51).await.unwrap(),
            "{backend}: a canary given up is not withdrawn as well"
        );
        assert!(
            store
                .finish_canary(
                    first,
                    "slow",
                    Some(31_500),
                    Some(("{\"rate_milli\":31500}", "sig")),
                    None,
                    40
                )
                .await
                .unwrap()
        );
        assert!(
            !store
                .finish_canary(first, "passed", None, None, None, 41)
                .await
                .unwrap(),
            "{backend}: a canary is answered once"
        );
        let answered = store.canary(first).await.unwrap().unwrap();
        assert_eq!(
            (
                answered.finding.as_deref(),
                answered.rate_milli,
                answered.signature.as_deref()
            ),
            (Some("slow"), Some(31_500), Some("sig")),
            "{backend}"
        );
        let open_on_other = store.insert_canary(&canary(other.id, 60, 900)).await.unwrap();
        let mut latest: Vec<(i64, Option<String>)> = store
            .latest_canaries()
            .await
            .unwrap()
            .into_iter()
            .map(|c| (c.canary.node_id, c.finding))
            .collect();
        latest.sort();
        assert_eq!(
            latest,
            [(host.id, Some("slow".to_string())), (other.id, None)],
            "{backend}"
        );
        let standings = store.canary_standings().await.unwrap();
        assert_eq!(
            standings,
            [
                CanaryStanding {
                    node_id: host.id,
                    finding: Some("slow".to_string()),
                    finished_at: Some(40),
                    unanswered: 0
                },
                CanaryStanding {
                    node_id: other.id,
                    finding: None,
                    finished_at: None,
                    unanswered: 1
                }
            ],
            "{backend}: the latest answered canary, and the unanswered ones since"
        );
        // A canary that gave way to work is withdrawn: finished, and counted as nothing.
        assert!(store.withdraw_canary(open_on_other, 70).await.unwrap(), "{backend}");
        assert!(
            !store.withdraw_canary(open_on_other, 71).await.unwrap(),
            "{backend}: once"
        );
        let withdrawn = store.canary(open_on_other).await.unwrap().unwrap();
        assert_eq!(
            (withdrawn.finding.as_deref(), withdrawn.finished_at),
            (Some("withdrawn"), Some(70)),
            "{backend}"
        );
        assert_eq!(
            store.canary_standings().await.unwrap(),
            standings,
            "{backend}: a withdrawn canary is neither answered nor unanswered"
        );

        // Outcomes with weights, read incrementally, and summed over a window.
        store.record_outcome(host.id, "canary_failed", 40).await.unwrap();
        store
            .record_outcomes(&[
                (host.id, "window_hour_present".to_string(), 750, 3_600),
                (host.id, "window_hour_missed".to_string(), 250, 3_600),
            ])
            .await
            .unwrap();
        let since: Vec<(String, i64)> = store
            .outcomes_since(41, 10)
            .await
            .unwrap()
            .into_iter()
            .map(|event| (event.outcome, event.weight_milli))
            .collect();
        assert_eq!(
            since,
            [
                ("window_hour_present".to_string(), 750),
                ("window_hour_missed".to_string(), 250)
            ],
            "{backend}"
        );
        assert_eq!(
            store
                .outcome_weight_since(host.id, "window_hour_present", 0)
                .await
                .unwrap(),
            750
        );
        assert_eq!(
            store
                .outcome_weight_since(host.id, "window_hour_present", 3_601)
                .await
                .unwrap(),
            0
        );

        // What the node's tenants paid since a time, in the order they first paid.
        let jobs = store.insert_jobs(&[job(tenant.id, None)]).await.unwrap();
        let leases = store
            .commit_placement(jobs[0].id, &[lease(host.id, 0)], 50)
            .await
            .unwrap()
            .unwrap();
        for (sequence, charged, at) in [(1, 400, 100), (2, 600, 200), (3, 0, 300)] {
            let usage = UsageRow {
                lease_id: leases[0].id,
                sequence,
                node_id: host.id,
                gpu_seconds_milli: 1000,
                charged_micros: charged,
                body: "{}".to_string(),
                signature: format!("sig-{sequence}"),
                received_at: at,
            };
            store.insert_usage(&usage).await.unwrap();
        }
        assert_eq!(
            store.charges_on_node_since(host.id, 0).await.unwrap(),
            [TenantCharge {
                tenant_id: tenant.id,
                charged_micros: 1000
            }]
        );
        assert_eq!(
            store.charges_on_node_since(host.id, 150).await.unwrap(),
            [TenantCharge {
                tenant_id: tenant.id,
                charged_micros: 600
            }]
        );
        assert_eq!(store.charges_on_node_since(other.id, 0).await.unwrap(), []);
        assert_eq!(
            store.usage_row(leases[0].id, 2).await.unwrap().unwrap().signature,
            "sig-2"
        );
        assert_eq!(store.usage_row(leases[0].id, 9).await.unwrap(), None);

        // Evidence by kind since a time.
        let kept = store
            .record_evidence(Some(host.id), "usage_violation", "{}", 500)
            .await
            .unwrap();
        store
            .record_evidence(Some(host.id), "bad_signature", "x", 501)
            .await
            .unwrap();
        store
            .record_evidence(Some(host.id), "usage_violation", "{}", 400)
            .await
            .unwrap();
        let found = store
            .evidence_of_kinds_since(host.id, &["usage_violation"], 450)
            .await
            .unwrap();
        assert_eq!(found.iter().map(|row| row.id).collect::<Vec<_>>(), [kept], "{backend}");

        // A fraud decision with its slash and the node's cordon, once per ledger key.
        let bond = transaction(
            "bond:p",
            &[(&format!("provider:{}:bond", provider.id), 1_000), ("external", -1_000)],
        );
        store.apply_ledger(&bond, &[0, i64::MIN]).await.unwrap();
        let slash = LedgerTransactionRow {
            kind: "slash".to_string(),
            ..transaction(
                "slash:node-1:false_hardware:canary-1",
                &[
                    (&format!("provider:{}:bond", provider.id), -500),
                    (&format!("tenant:{}:available", tenant.id), 300),
                    ("platform:fees", 200),
                ],
            )
        };
        let fraud = FraudRow {
            id: 0,
            node_id: host.id,
            provider_id: provider.id,
            kind: "false_hardware".to_string(),
            section: "§ 3".to_string(),
            share_permille: 500,
            bond_before: 1_000,
            slashed: 500,
            refunds: "[]".to_string(),
            to_platform: 200,
            evidence: "{}".to_string(),
            decided_at: 600,
            ledger_key: slash.key.clone(),
        };
        let decided = store.record_fraud(&fraud, Some((&slash, &[0, 0, 0]))).await.unwrap();
        assert!(decided.is_some(), "{backend}");
        assert_eq!(
            store.record_fraud(&fraud, Some((&slash, &[0, 0, 0]))).await.unwrap(),
            None,
            "{backend}: decided once"
        );
        assert_eq!(
            store.balance(&format!("provider:{}:bond", provider.id)).await.unwrap(),
            500
        );
        assert_eq!(
            store.balance(&format!("tenant:{}:available", tenant.id)).await.unwrap(),
            300
        );
        assert_eq!(store.node(host.id).await.unwrap().unwrap().fraud_cordoned_at, Some(600));
        assert_eq!(store.last_fraud_of_node(host.id).await.unwrap(), Some(600));
        assert_eq!(store.last_fraud_of_node(other.id).await.unwrap(), None);
        assert_eq!(
            store.last_frauds_of_providers().await.unwrap(),
            [ProviderFraud {
                provider_id: provider.id,
                decided_at: 600
            }]
        );
        assert_eq!(
            store.frauds(Some(provider.id), 10).await.unwrap()[0].kind,
            "false_hardware"
        );
        assert!(store.frauds(Some(tenant.id), 10).await.unwrap().is_empty());
        // A slash that would take a bond below zero leaves no decision behind.
        let too_much = LedgerTransactionRow {
            kind: "slash".to_string(),
            ..transaction(
                "slash:node-2:dropped_jobs:drop-1",
                &[
                    (&format!("provider:{}:bond", provider.id), -5_000),
                    ("platform:fees", 5_000),
                ],
            )
        };
        let refused = FraudRow {
            node_id: other.id,
            ledger_key: too_much.key.clone(),
            ..fraud.clone()
        };
        assert!(store.record_fraud(&refused, Some((&too_much, &[0, 0]))).await.is_err());
        assert_eq!(
            store.frauds(None, 10).await.unwrap().len(),
            1,
            "{backend}: nothing half-written"
        );
        assert_eq!(store.node(other.id).await.unwrap().unwrap().fraud_cordoned_at, None);
        store.lift_fraud_cordon(host.id, 700).await.unwrap();
        assert_eq!(store.node(host.id).await.unwrap().unwrap().fraud_cordoned_at, None);
    })
    .await;
}

fn transaction(key: &str, entries: &[(&str, i64)]) -> LedgerTransactionRow {
    LedgerTransactionRow {
        key: key.to_string(),
        kind: "deposit".to_string(),
        memo: String::new(),
        at: 1,
        entries: entries
            .iter()
            .map(|(account, amount)| (account.to_string(), *amount))
            .collect(),
    }
}

#[tokio::test]
async fn ledger_balances_idempotency_and_floors() {
    on_every_backend(|backend, store| async move {
        let deposit = transaction("d1", &[("external", -100), ("tenant:1:available", 100)]);
        let floors = [i64::MIN, 0];
        assert_eq!(store.apply_ledger(&deposit, &floors).await.unwrap(), LedgerOutcome::New);
        assert_eq!(
            store.apply_ledger(&deposit, &floors).await.unwrap(),
            LedgerOutcome::Duplicate,
            "{backend}"
        );
        assert!(matches!(
            store
                .apply_ledger(
                    &transaction("d1", &[("external", -5), ("tenant:1:available", 5)]),
                    &floors
                )
                .await,
            Err(StoreError::Conflict(_))
        ));
        let overspend = transaction("h1", &[("tenant:1:available", -150), ("escrow:job:1", 150)]);
        assert!(
            matches!(
                store.apply_ledger(&overspend, &[0, 0]).await,
                Err(StoreError::Refused(_))
            ),
            "{backend}: a balance never breaks its floor"
        );
        let hold = transaction("h1", &[("tenant:1:available", -60), ("escrow:job:1", 60)]);
        assert_eq!(
            store.apply_ledger(&hold, &[0, 0]).await.unwrap(),
            LedgerOutcome::New,
            "{backend}: a refused key stays free"
        );
        assert!(matches!(
            store
                .apply_ledger(&transaction("bad", &[("a", 1), ("b", 2)]), &[0, 0])
                .await,
            Err(StoreError::Refused(_))
        ));
        assert_eq!(store.balance("tenant:1:available").await.unwrap(), 40);
        assert_eq!(store.balance("escrow:job:1").await.unwrap(), 60);
        assert_eq!(store.balance("nobody").await.unwrap(), 0);
        assert_eq!(
            store.ledger_totals().await.unwrap(),
            LedgerTotals {
                balances: 0,
                entries: 0
            },
            "{backend}"
        );
        assert_eq!(
            store.balances("tenant:").await.unwrap(),
            vec![AccountBalance {
                account: "tenant:1:available".to_string(),
                balance: 40
            }]
        );
        assert_eq!(
            store.ledger_entries_of("tenant:1:available", 10).await.unwrap().len(),
            2
        );
        assert_eq!(store.ledger_sum("tenant:1:available", "deposit", 0).await.unwrap(), 40);
    })
    .await;
}

#[tokio::test]
async fn leadership() {
    on_every_backend(|backend, store| async move {
        let mut first = store.try_lead().await.unwrap().expect("the first replica leads");
        assert!(first.still_held().await);
        if backend == "postgres" {
            assert!(store.try_lead().await.unwrap().is_none(), "only one replica leads");
            drop(first);
            // The lock goes with its session; the server notices the closed socket shortly.
            let mut took_over = false;
            for _ in 0..50 {
                if store.try_lead().await.unwrap().is_some() {
                    took_over = true;
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            assert!(took_over, "another replica takes over when the leader's session ends");
        }
    })
    .await;
}

/// The check that no GPU is in two live leases: a preemption's victim shares its GPUs with its
/// preemptor's leases during its grace period, and with nothing else; GPU shares add up.
#[tokio::test]
async fn a_gpu_is_booked_once_but_for_a_preemption_in_its_grace() {
    on_every_backend(|backend, store| async move {
        let tenant = store.create_account(Role::Tenant, "t", 1).await.unwrap();
        let provider = store.create_account(Role::Provider, "p", 1).await.unwrap();
        let host = store.insert_node(&node(provider.id, "n1"), 1).await.unwrap();
        let jobs = store
            .insert_jobs(&[job(tenant.id, None), job(tenant.id, None), job(tenant.id, None)])
            .await
            .unwrap();
        let fence = store.take_leadership().await.unwrap();
        let on = |gpu_mask: i64, gpu_milli: i64| NewLease {
            gpu_mask,
            gpu_milli,
            ..lease(host.id, 0)
        };
        let place = |job_id: i64, lease: NewLease, victims: Vec<Victim>| store::PlacementWrite {
            job_id,
            leases: vec![lease],
            hold: None,
            victims,
        };
        let placed = store
            .commit_placements(&[place(jobs[0].id, on(0b11, 1000), Vec::new())], 10, fence)
            .await
            .unwrap();
        let victim = placed[0].as_ref().expect("placed")[0].id;
        // The preemptor takes GPU 0 and marks the victim in the same transaction.
        let grace_end = 1_000;
        let placed = store
            .commit_placements(
                &[place(
                    jobs[1].id,
                    on(0b1, 1000),
                    vec![Victim {
                        lease_id: victim,
                        preempt_at: grace_end,
                    }],
                )],
                20,
                fence,
            )
            .await
            .unwrap();
        let preemptor = placed[0].as_ref().expect("placed")[0].id;
        let marked = store.lease(victim).await.unwrap().unwrap();
        assert_eq!(
            (marked.preempted_by, marked.lease.preempt_at),
            (Some(jobs[1].id), Some(grace_end)),
            "{backend}"
        );
        assert_eq!(
            store.overbooked_gpus(500).await.unwrap(),
            Vec::new(),
            "{backend}: victim and preemptor share GPU 0 in the grace period"
        );
        let late = store.overbooked_gpus(grace_end).await.unwrap();
        assert_eq!(
            late,
            vec![Overbooking {
                node_id: host.id,
                gpu: 0,
                leases: vec![victim, preemptor],
                milli: 2000,
            }],
            "{backend}: a victim still live after its grace is a double booking"
        );
        // A third job on GPU 1, the victim's other GPU, is a double booking at once: the
        // victim shares its GPUs with its preemptor alone.
        let placed = store
            .commit_placements(&[place(jobs[2].id, on(0b10, 1000), Vec::new())], 30, fence)
            .await
            .unwrap();
        let third = placed[0].as_ref().expect("placed")[0].id;
        assert_eq!(
            store.overbooked_gpus(500).await.unwrap(),
            vec![Overbooking {
                node_id: host.id,
                gpu: 1,
                leases: vec![victim, third],
                milli: 2000,
            }],
            "{backend}"
        );
        store.end_lease(victim, LeaseState::Preempted, "", 40).await.unwrap();
        assert_eq!(store.overbooked_gpus(2_000).await.unwrap(), Vec::new(), "{backend}");
        // Shares of one GPU add up: 400 + 600 fit, one more 100 does not.
        let shares = store
            .insert_jobs(&[job(tenant.id, None), job(tenant.id, None), job(tenant.id, None)])
            .await
            .unwrap();
        let share = |job: &JobRecord, milli| place(job.id, on(0b1000, milli), Vec::new());
        store
            .commit_placements(&[share(&shares[0], 400), share(&shares[1], 600)], 50, fence)
            .await
            .unwrap();
        assert_eq!(store.overbooked_gpus(60).await.unwrap(), Vec::new(), "{backend}");
        store
            .commit_placements(&[share(&shares[2], 100)], 70, fence)
            .await
            .unwrap();
        let over = store.overbooked_gpus(80).await.unwrap();
        assert_eq!(
            over.iter().map(|over| (over.gpu, over.milli)).collect::<Vec<_>>(),
            vec![(3, 1100)],
            "{backend}"
        );
    })
    .await;
}

#[tokio::test]
async fn placements_commit_together_with_their_holds_each_job_once() {
    on_every_backend(|backend, store| async move {
        let tenant = store.create_account(Role::Tenant, "t", 1).await.unwrap();
        let provider = store.create_account(Role::Provider, "p", 1).await.unwrap();
        let host = store.insert_node(&node(provider.id, "n1"), 1).await.unwrap();
        let available = format!("tenant:{}:available", tenant.id);
        store
            .apply_ledger(
                &transaction("credit", &[("external", -1_000), (available.as_str(), 1_000)]),
                &[i64::MIN, 0],
            )
            .await
            .unwrap();
        let jobs = store
            .insert_jobs(&(0..5).map(|_| job(tenant.id, None)).collect::<Vec<_>>())
            .await
            .unwrap();
        let fence = store.take_leadership().await.unwrap();
        let hold = |job_id: i64, amount: i64| {
            let escrow = format!("escrow:job:{job_id}");
            (
                transaction(
                    &format!("hold:{job_id}"),
                    &[(available.as_str(), -amount), (escrow.as_str(), amount)],
                ),
                vec![0, 0],
            )
        };
        let write = |job_id: i64, replicas: i64, amount: i64| store::PlacementWrite {
            job_id,
            leases: (0..replicas).map(|replica| lease(host.id, replica)).collect(),
            hold: Some(hold(job_id, amount)),
            victims: Vec::new(),
        };
        // Job 3 was cancelled meanwhile; job 1's escrow is still held from an earlier placement.
        assert!(
            store
                .set_job_state(jobs[3].id, &[JobState::Queued], JobState::Cancelled, "cancelled", 5)
                .await
                .unwrap()
        );
        let (earlier, floors) = hold(jobs[1].id, 100);
        store.apply_ledger(&earlier, &floors).await.unwrap();
        let batch = [
            write(jobs[0].id, 1, 100),
            write(jobs[1].id, 3, 100),
            write(jobs[2].id, 2, 200),
            write(jobs[3].id, 1, 100),
        ];
        let placed = store.commit_placements(&batch, 10, fence).await.unwrap();
        assert_eq!(placed.len(), 4, "{backend}");
        assert!(placed[3].is_none(), "{backend}: a job no longer queued is not placed");
        for (placement, write) in placed.iter().zip(&batch).take(3) {
            let records = placement.as_ref().expect("placed");
            assert_eq!(records.len(), write.leases.len(), "{backend}");
            for (record, lease) in records.iter().zip(&write.leases) {
                assert_eq!(
                    (record.job_id, record.lease.replica),
                    (write.job_id, lease.replica),
                    "{backend}"
                );
                let stored = store.lease(record.id).await.unwrap().expect("stored");
                assert_eq!(
                    (stored.job_id, stored.lease.replica),
                    (write.job_id, lease.replica),
                    "{backend}"
                );
                assert_eq!(stored.state, LeaseState::Pending, "{backend}");
            }
            let job = store.job(write.job_id).await.unwrap().unwrap();
            assert_eq!(job.state, JobState::Running, "{backend}");
        }
        assert_eq!(
            store.balance(&available).await.unwrap(),
            1_000 - 100 - 100 - 200,
            "{backend}: jobs 0 and 2 held now, job 1 once before; the cancelled job holds nothing"
        );
        assert_eq!(
            store.balance(&format!("escrow:job:{}", jobs[2].id)).await.unwrap(),
            200,
            "{backend}"
        );
        assert_eq!(
            store.balance(&format!("escrow:job:{}", jobs[3].id)).await.unwrap(),
            0,
            "{backend}"
        );
        // A batch whose holds together break the tenant's floor writes nothing, though each
        // alone would fit.
        let more = store
            .insert_jobs(&[job(tenant.id, None), job(tenant.id, None)])
            .await
            .unwrap();
        let refused = store
            .commit_placements(&[write(more[0].id, 1, 400), write(more[1].id, 1, 400)], 20, fence)
            .await;
        assert!(matches!(refused, Err(StoreError::Refused(_))), "{backend}: {refused:?}");
        assert_eq!(store.balance(&available).await.unwrap(), 600, "{backend}");
        for job in &more {
            assert_eq!(
                store.job(job.id).await.unwrap().unwrap().state,
                JobState::Queued,
                "{backend}"
            );
            assert!(store.leases_of_job(job.id).await.unwrap().is_empty(), "{backend}");
        }
        // A job twice in one batch is placed once, by its first placement, and held once.
        let twice = store
            .commit_placements(&[write(more[0].id, 1, 100), write(more[0].id, 2, 100)], 30, fence)
            .await
            .unwrap();
        assert_eq!(twice[0].as_ref().map(Vec::len), Some(1), "{backend}");
        assert!(twice[1].is_none(), "{backend}");
        assert_eq!(store.leases_of_job(more[0].id).await.unwrap().len(), 1, "{backend}");
        assert_eq!(store.balance(&available).await.unwrap(), 500, "{backend}");
        assert_eq!(
            store.ledger_totals().await.unwrap(),
            LedgerTotals {
                balances: 0,
                entries: 0
            },
            "{backend}: balances and entries agree"
        );
    })
    .await;
}

#[tokio::test]
async fn a_deposed_leader_cannot_place() {
    on_every_backend(|backend, store| async move {
        let tenant = store.create_account(Role::Tenant, "t", 1).await.unwrap();
        let provider = store.create_account(Role::Provider, "p", 1).await.unwrap();
        let host = store.insert_node(&node(provider.id, "n1"), 1).await.unwrap();
        let jobs = store
            .insert_jobs(&[job(tenant.id, None), job(tenant.id, None)])
            .await
            .unwrap();
        let old = store.take_leadership().await.unwrap();
        let write = |job_id| store::PlacementWrite {
            job_id,
            leases: vec![lease(host.id, 0)],
            hold: None,
            victims: Vec::new(),
        };
        let placed = store.commit_placements(&[write(jobs[0].id)], 10, old).await.unwrap();
        assert!(placed[0].is_some(), "{backend}: the leader places");
        let new = store.take_leadership().await.unwrap();
        assert_eq!(new, old + 1);
        assert!(
            matches!(
                store.commit_placements(&[write(jobs[1].id)], 11, old).await,
                Err(StoreError::Fenced(_))
            ),
            "{backend}: the old epoch is fenced off"
        );
        assert_eq!(
            store.job(jobs[1].id).await.unwrap().unwrap().state,
            JobState::Queued,
            "nothing written"
        );
        assert!(matches!(
            store.add_leases(jobs[0].id, &[lease(host.id, 1)], &[], 12, old).await,
            Err(StoreError::Fenced(_))
        ));
        assert!(store.commit_placements(&[write(jobs[1].id)], 13, new).await.unwrap()[0].is_some());
    })
    .await;
}

/// SQLite's write-ahead log: a checkpoint under the restart threshold copies pages back but
/// leaves the log in place; past it the log is copied back whole and truncated, and the data
/// is all still there.
#[tokio::test]
async fn sqlite_log_is_counted_and_truncated() {
    let path = std::env::temp_dir().join(format!("{}.db", unique("fallow_wal")));
    let store = Store::open(&format!("sqlite://{}", path.display())).await.unwrap();
    let log = path.with_extension("db-wal");
    let log_len = || std::fs::metadata(&log).map_or(0, |meta| meta.len());
    for index in 0..20 {
        store
            .create_account(Role::Tenant, &format!("tenant-{index}"), 1)
            .await
            .unwrap();
    }
    assert!(log_len() > 0, "writes go to the log first");
    let frames = store.checkpoint().await.unwrap();
    assert!(frames > 0, "the log's frames are counted ({frames})");
    assert!(log_len() > 0, "a passive checkpoint leaves the log in place");
    store.truncate_log().await.unwrap();
    assert_eq!(log_len(), 0, "the log is truncated");
    store.create_account(Role::Tenant, "after", 1).await.unwrap();
    let count: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM accounts")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert!(count >= 21, "every account written is still there ({count})");
}
