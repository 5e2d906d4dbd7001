//! The coordinator end to end, on SQLite and on PostgreSQL: accounts and credit, a node that
//! heartbeats, a job placed by the reconcile loop, the agent's signed reports, billing and
//! settlement; cancellation, a silent node, idempotent submission, quotes, offers and a
//! tenant without money.

mod common;

use common::{Harness, job_request, on_every_backend, on_every_backend_with, run_until_placed};
use serde_json::{Value, json};

const CREDIT_MICROS: i64 = 100_000_000;

async fn balance(harness: &Harness, key: &str) -> Value {
    harness.get(key, "/v1/balance").await.expect(200, "balance")
}

/// The tenant "acme" with $100 of credit and the provider "gpu-farm".
async fn tenant_and_provider(h: &Harness) -> (common::Account, common::Account) {
    let tenant = h.tenant("acme").await;
    let provider = h.provider("gpu-farm").await;
    h.credit(&tenant, "100.00").await;
    (tenant, provider)
}

fn text(value: &Value) -> &str {
    value.as_str().unwrap_or_default()
}

fn micros(value: &Value) -> i64 {
    value.as_i64().unwrap_or_else(|| panic!("{value} is not an integer"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_job_runs_from_submission_to_settlement() {
    on_every_backend(async |h: &Harness| {
        let tenant = h.tenant("acme").await;
        let provider = h.provider("gpu-farm").await;
        let credited = h.credit(&tenant, "100.00").await;
        assert_eq!(credited["available_micros"], CREDIT_MICROS, "{}", h.backend);
        let agent = h.node(&provider, "rack1-node1", |_| {}).await;

        assert!(
            agent.heartbeat().await.is_empty(),
            "{}: a new node has no leases",
            h.backend
        );
        let node_path = format!("/v1/nodes/{}", agent.node_id);
        h.wait_for("the node to be online", async || {
            let node = h
                .get(&provider.key, &node_path)
                .await
                .expect(200, "provider reads its node");
            (node["online"] == true).then_some(())
        })
        .await;

        // The agent long-polls for a change of its (empty) lease set while the tenant submits.
        let empty = agent
            .signed("GET", "/v1/agent/leases", None)
            .await
            .expect(200, "agent reads its leases");
        assert_eq!(empty["leases"], json!([]), "{}", h.backend);
        let poll_path = format!(
            "/v1/agent/leases?wait_ms=15000&known={}",
            empty["version"].as_str().unwrap()
        );
        let (polled, job) = tokio::join!(
            agent.signed("GET", &poll_path, None),
            h.submit(&tenant, job_request("train"))
        );
        let job_id = micros(&job["id"]);
        assert_eq!(job["state"], "queued", "{}", h.backend);
        let polled = polled.expect(200, "long poll");
        assert_ne!(polled["version"], empty["version"], "{}", h.backend);
        let lease = polled["leases"][0]["lease"].clone();
        assert_eq!(
            lease["job_id"], job_id,
            "{}: the long poll brings the new lease",
            h.backend
        );
        assert_eq!(polled["leases"][0]["job"]["image"], "busybox:latest", "{}", h.backend);

        let view = h.wait_for_job(&tenant.key, job_id, "running").await;
        assert_eq!(view["leases"].as_array().map(Vec::len), Some(1), "{}", h.backend);
        let price = micros(&lease["price_micros_per_gpu_hour"]);
        assert!(
            (1..=2_500_000).contains(&price),
            "{}: price {price} is within the bid",
            h.backend
        );
        assert!(
            micros(&view["escrow_micros"]) > 0,
            "{}: placing holds escrow: {view}",
            h.backend
        );

        let beat = agent.heartbeat().await;
        assert_eq!(beat.len(), 1, "{}", h.backend);
        assert_eq!(
            beat[0]["lease"]["id"], lease["id"],
            "{}: the heartbeat lists the lease",
            h.backend
        );

        for state in ["staging", "running"] {
            let reported = agent.event(&lease, state).await.expect(200, state);
            assert_eq!(reported["state"], state, "{}", h.backend);
        }
        assert_eq!(h.metric("fallow_lease_grant_seconds_count").await, 1.0, "{}", h.backend);
        assert_eq!(
            h.metric("fallow_lease_pickup_seconds_count").await,
            1.0,
            "{}: the first report on a lease is its pickup, the second is not",
            h.backend
        );
        assert_eq!(
            h.metric("fallow_lease_pickup_seconds_bucket{le=\"+Inf\"}").await,
            1.0,
            "{}",
            h.backend
        );
        assert!(h.metric("fallow_lease_pickup_seconds_sum").await > 0.0, "{}", h.backend);

        let first = agent
            .signed("POST", "/v1/agent/usage", Some(&agent.usage(&lease, 1, 1000)))
            .await
            .expect(200, "first usage record");
        let second_record = agent.usage(&lease, 2, 800);
        let second = agent
            .signed("POST", "/v1/agent/usage", Some(&second_record))
            .await
            .expect(200, "second usage record");
        let replay = agent
            .signed("POST", "/v1/agent/usage", Some(&second_record))
            .await
            .expect(200, "the second record again");
        assert_eq!(first["new"], true, "{}", h.backend);
        assert_eq!(second["new"], true, "{}", h.backend);
        assert_eq!(replay, json!({"new": false, "charged_micros": 0}), "{}", h.backend);
        let charged = [micros(&first["charged_micros"]), micros(&second["charged_micros"])];
        assert!(charged.iter().all(|&amount| amount > 0), "{}: {charged:?}", h.backend);
        let billed: i64 = charged.iter().sum();
        let view = h
            .get(&tenant.key, &format!("/v1/jobs/{job_id}"))
            .await
            .expect(200, "job");
        assert_eq!(view["cost_micros"], billed, "{}: the replay is not billed", h.backend);

        let attested = agent
            .signed("POST", "/v1/agent/attestations", Some(&agent.attestation(&lease, 0)))
            .await
            .expect(200, "attestation");
        assert_eq!(attested["state"], "finished", "{}", h.backend);
        let view = h.wait_for_job(&tenant.key, job_id, "finished").await;
        assert_eq!(view["escrow_micros"], 0, "{}: escrow released", h.backend);
        assert_eq!(view["cost_micros"], billed, "{}", h.backend);
        assert!(agent.heartbeat().await.is_empty(), "{}: nothing left to run", h.backend);
        let again = agent
            .signed("POST", "/v1/agent/attestations", Some(&agent.attestation(&lease, 0)))
            .await;
        again.refused(409, "a second attestation");

        let tenant_money = balance(h, &tenant.key).await;
        let provider_money = balance(h, &provider.key).await;
        let fees = h
            .metric("fallow_ledger_balance_micros{account=\"platform_fees\"}")
            .await as i64;
        let expected_fees: i64 = charged.iter().map(|amount| amount * 100 / 1000).sum();
        assert_eq!(tenant_money["escrow_micros"], 0, "{}", h.backend);
        assert_eq!(
            tenant_money["available_micros"],
            CREDIT_MICROS - billed,
            "{}",
            h.backend
        );
        assert_eq!(fees, expected_fees, "{}: the platform keeps 10%", h.backend);
        assert_eq!(provider_money["earnings_micros"], billed - fees, "{}", h.backend);
        assert_eq!(
            micros(&tenant_money["available_micros"])
                + micros(&tenant_money["escrow_micros"])
                + micros(&provider_money["earnings_micros"])
                + fees,
            CREDIT_MICROS,
            "{}: every micro-dollar is somewhere",
            h.backend
        );
        assert_eq!(
            h.metric("fallow_ledger_sum_micros{of=\"balances\"}").await,
            0.0,
            "{}",
            h.backend
        );
        assert_eq!(
            h.metric("fallow_ledger_balance_micros{account=\"external\"}").await as i64,
            -CREDIT_MICROS,
            "{}",
            h.backend
        );
        let earnings = h.get(&provider.key, "/v1/earnings").await.expect(200, "earnings");
        assert_eq!(earnings["earnings_micros"], billed - fees, "{}", h.backend);
        assert_eq!(earnings["nodes"][0]["earned_micros"], billed, "{}", h.backend);

        let month = month_of(server::now_us());
        let invoice = h
            .get(&tenant.key, &format!("/v1/invoices?period={month}"))
            .await
            .expect(200, "the month's invoice");
        assert_eq!(
            invoice["lines"],
            json!([{"job_id": job_id, "job_name": "train", "usage_records": 2, "charged_micros": billed}]),
            "{}: one line for the job, both records: {invoice}",
            h.backend
        );
        assert_eq!(
            (micros(&invoice["usage_micros"]), micros(&invoice["total_micros"])),
            (billed, billed),
            "{}",
            h.backend
        );
        assert_eq!(micros(&invoice["payments_micros"]), CREDIT_MICROS, "{}", h.backend);
        assert_eq!(micros(&invoice["sla_credits_micros"]), 0, "{}", h.backend);
        let before = month_of(micros(&invoice["from_us"]) - 1);
        let earlier = h
            .get(&tenant.key, &format!("/v1/invoices?period={before}"))
            .await
            .expect(200, "last month's invoice");
        assert_eq!(earlier["lines"], json!([]), "{}: {earlier}", h.backend);
        assert_eq!(earlier["to_us"], invoice["from_us"], "{}", h.backend);
        assert_eq!(micros(&earlier["total_micros"]), 0, "{}", h.backend);
        h.get(&provider.key, &format!("/v1/invoices?period={month}"))
            .await
            .refused(403, "a provider has no invoice");
        let stranger = h.tenant("globex").await;
        h.get(
            &stranger.key,
            &format!("/v1/invoices?period={month}&account_id={}", tenant.id),
        )
        .await
        .refused(404, "another tenant's invoice");
        let as_admin = h
            .get(
                &h.admin,
                &format!("/v1/invoices?period={month}&account_id={}", tenant.id),
            )
            .await
            .expect(200, "an admin reads any tenant's invoice");
        assert_eq!(as_admin, invoice, "{}", h.backend);
        for bad in ["2026-13", "26-01", "2026-1", "2026-01-01", "next"] {
            h.get(&tenant.key, &format!("/v1/invoices?period={bad}"))
                .await
                .refused(400, bad);
        }
    })
    .await;
}

/// The `YYYY-MM` month (UTC) of a time in microseconds since 1970.
fn month_of(at_us: i64) -> String {
    // Howard Hinnant's civil_from_days.
    let days = at_us.div_euclid(86_400_000_000) + 719_468;
    let era = days.div_euclid(146_097);
    let day_of_era = days - era * 146_097;
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancelling_a_running_job_ends_its_lease() {
    on_every_backend(async |h: &Harness| {
        let (tenant, provider) = tenant_and_provider(h).await;
        let agent = h.node(&provider, "node1", |_| {}).await;
        let job = h.submit(&tenant, job_request("to-cancel")).await;
        let job_id = micros(&job["id"]);
        let (_, lease) = run_until_placed(h, &agent, &tenant, job_id).await;
        agent.event(&lease, "running").await.expect(200, "running");

        let cancelled = h
            .post(&tenant.key, &format!("/v1/jobs/{job_id}/cancel"), json!({}))
            .await
            .expect(200, "tenant cancels");
        assert_eq!(cancelled["state"], "cancelled", "{}", h.backend);
        assert_eq!(cancelled["leases"][0]["state"], "cancelled", "{}", h.backend);
        assert_eq!(cancelled["escrow_micros"], 0, "{}", h.backend);
        assert!(
            agent.heartbeat().await.is_empty(),
            "{}: the agent is told to stop",
            h.backend
        );
        let late = agent.event(&lease, "running").await;
        assert!(
            late.refused(409, "an event for the ended lease").contains("stop it"),
            "{}",
            h.backend
        );
        h.post(&tenant.key, &format!("/v1/jobs/{job_id}/cancel"), json!({}))
            .await
            .refused(409, "cancelling twice");
        let money = balance(h, &tenant.key).await;
        assert_eq!(
            money["available_micros"], CREDIT_MICROS,
            "{}: nothing billed",
            h.backend
        );
        assert_eq!(money["escrow_micros"], 0, "{}", h.backend);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_silent_node_loses_its_lease_and_the_job_queues_again() {
    on_every_backend_with(
        |config| config.heartbeat_timeout_ms = 1500,
        async |h: &Harness| {
            let (tenant, provider) = tenant_and_provider(h).await;
            let silent = h.node(&provider, "flaky", |_| {}).await;
            let job = h.submit(&tenant, job_request("survivor")).await;
            let job_id = micros(&job["id"]);
            let (_, lost) = run_until_placed(h, &silent, &tenant, job_id).await;

            // No more heartbeats from `silent`.
            let view = h.wait_for_job(&tenant.key, job_id, "queued").await;
            let old = view["leases"]
                .as_array()
                .and_then(|leases| leases.iter().find(|lease| lease["id"] == lost["id"]))
                .cloned()
                .expect("the old lease is still listed");
            assert_eq!(old["state"], "lost", "{}: {view}", h.backend);
            assert!(h.metric("fallow_leases_lost_total").await >= 1.0, "{}", h.backend);
            let node = h
                .get(&provider.key, &format!("/v1/nodes/{}", silent.node_id))
                .await
                .expect(200, "node");
            assert_eq!(node["online"], false, "{}", h.backend);
            // The fault shows in the node's reputation, with its input (the prior is Beta(8, 2)).
            let reputation = &node["reputation"];
            assert!(
                reputation["inputs"]["node_fault"]
                    .as_f64()
                    .is_some_and(|weight| weight > 0.99),
                "{}: {node}",
                h.backend
            );
            assert!(
                reputation["score"].as_f64().is_some_and(|score| score < 0.8),
                "{}: {node}",
                h.backend
            );

            let healthy = h.node(&provider, "steady", |_| {}).await;
            let (_, moved) = run_until_placed(h, &healthy, &tenant, job_id).await;
            assert_ne!(moved["id"], lost["id"], "{}: a new lease", h.backend);
            assert!(
                silent.heartbeat().await.is_empty(),
                "{}: the silent node gets nothing back",
                h.backend
            );
            silent
                .event(&lost, "running")
                .await
                .refused(409, "an event for the lost lease");
            // What the replica delivered before the lease ended is still owed: a record at the
            // epoch it ran under, for a second before the end, is taken (an agent cut off sends
            // it when contact returns); one for a time after the end is not, nor an event.
            let delivered = silent
                .signed("POST", "/v1/agent/usage", Some(&silent.usage(&lost, 1, 1000)))
                .await
                .expect(200, "usage delivered before the lease was lost");
            assert!(micros(&delivered["charged_micros"]) > 0, "{}: {delivered}", h.backend);
            silent
                .signed("POST", "/v1/agent/usage", Some(&silent.usage(&lost, 600, 1000)))
                .await
                .refused(400, "usage for a time after the lease was lost");
        },
    )
    .await;
}

/// The leader rewrites the rows of beats it takes itself only every minute and finds nodes
/// silent from its memory as well: a node that keeps beating keeps its lease through several
/// timeouts while its row is older than one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_beating_to_the_leader_keeps_its_lease_while_its_row_lags() {
    on_every_backend_with(
        |config| config.heartbeat_timeout_ms = 1500,
        async |h: &Harness| {
            let (tenant, provider) = tenant_and_provider(h).await;
            let steady = h.node(&provider, "steady", |_| {}).await;
            let job = h.submit(&tenant, job_request("keeps-running")).await;
            let job_id = micros(&job["id"]);
            let (_, lease) = run_until_placed(h, &steady, &tenant, job_id).await;
            let beating_until = std::time::Instant::now() + std::time::Duration::from_millis(4 * 1500);
            while std::time::Instant::now() < beating_until {
                assert_eq!(steady.heartbeat().await.len(), 1, "{}: the lease stays", h.backend);
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            let row = h
                .running
                .state
                .store
                .node(steady.node_id)
                .await
                .unwrap()
                .expect("the node's row");
            let stored = row.last_heartbeat_at.expect("a stored heartbeat");
            let age_us = server::now_us() - stored;
            assert!(
                age_us > 1_500_000,
                "{}: the row is older than a timeout ({age_us} µs)",
                h.backend
            );
            let view = h
                .get(&tenant.key, &format!("/v1/jobs/{job_id}"))
                .await
                .expect(200, "job");
            assert_eq!(view["state"], "running", "{}: {view}", h.backend);
            let kept = view["leases"]
                .as_array()
                .and_then(|leases| leases.iter().find(|listed| listed["id"] == lease["id"]))
                .cloned()
                .expect("the lease is listed");
            assert_eq!(kept["state"], "pending", "{}: {view}", h.backend);
            assert_eq!(h.metric("fallow_leases_lost_total").await, 0.0, "{}", h.backend);
            let node = h
                .get(&provider.key, &format!("/v1/nodes/{}", steady.node_id))
                .await
                .expect(200, "node");
            assert_eq!(node["online"], true, "{}", h.backend);
            assert!(
                micros(&node["last_heartbeat_at_us"]) > stored,
                "{}: the API shows the leader's newer beat: {node}",
                h.backend
            );
        },
    )
    .await;
}

/// The lease of `job` on `node`, from the tenant's view of the job.
fn lease_on(view: &Value, node_id: i64) -> Option<Value> {
    view["leases"]
        .as_array()?
        .iter()
        .find(|lease| lease["node_id"] == node_id)
        .cloned()
}

/// A tenant's bronze job placed on the whole of a node: the tenant, the node's agent, the job and
/// its lease.
async fn bronze_on_a_whole_node(h: &Harness) -> (common::Account, common::Agent, i64, Value) {
    let (tenant, provider) = tenant_and_provider(h).await;
    let agent = h.node(&provider, "busy", |_| {}).await;
    let mut bronze = job_request("bronze-sweep");
    bronze["gpus"] = json!(8);
    bronze["tier"] = json!("bronze");
    bronze["preemptible"] = json!(true);
    let bronze_id = micros(&h.submit(&tenant, bronze).await["id"]);
    let (_, victim) = run_until_placed(h, &agent, &tenant, bronze_id).await;
    (tenant, agent, bronze_id, victim)
}

/// Gold work needs a node that bronze work fills: the bronze lease is told when it must stop
/// (now plus the grace period), and when that time comes the coordinator ends it as preempted
/// and queues its job again, while the gold job holds the node.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn gold_preempts_bronze_after_the_grace_period() {
    on_every_backend_with(
        |config| config.matcher.preemption_grace_s = 2,
        async |h: &Harness| {
            let (tenant, agent, bronze_id, victim) = bronze_on_a_whole_node(h).await;
            assert_eq!(
                victim["preempt_at_us"],
                Value::Null,
                "{}: nothing preempts it yet",
                h.backend
            );
            agent.event(&victim, "running").await.expect(200, "bronze runs");

            let mut gold = job_request("gold-train");
            gold["gpus"] = json!(8);
            gold["tier"] = json!("gold");
            gold["max_price_per_gpu_hour"] = json!("5.00");
            let submitted = server::now_us();
            let gold_id = micros(&h.submit(&tenant, gold).await["id"]);
            let told = h
                .wait_for("the bronze lease to be told when to stop", async || {
                    agent.heartbeat().await;
                    let view = h
                        .get(&tenant.key, &format!("/v1/jobs/{bronze_id}"))
                        .await
                        .expect(200, "bronze");
                    let lease = lease_on(&view, agent.node_id)?;
                    lease["preempt_at_us"].as_i64()
                })
                .await;
            // The deciding pass takes its clock when it starts, which may be a little before
            // the submission it then reads lands (a pass every 200 ms at most).
            assert!(
                told >= submitted + 2_000_000 - 200_000 && told <= server::now_us() + 2_000_000,
                "{}: the stop comes one grace period after the decision ({} µs after the submission)",
                h.backend,
                told - submitted
            );
            let stopped = h.wait_for_job(&tenant.key, bronze_id, "queued").await;
            let ended = stopped["leases"]
                .as_array()
                .and_then(|leases| leases.iter().find(|lease| lease["id"] == victim["id"]))
                .cloned()
                .expect("the bronze lease is listed");
            assert_eq!(ended["state"], "preempted", "{}: {stopped}", h.backend);
            assert!(
                micros(&ended["ended_at_us"]) >= told,
                "{}: not ended before its grace ran out: {ended}",
                h.backend
            );
            assert!(h.metric("fallow_leases_preempted_total").await >= 1.0, "{}", h.backend);
            let gold_view = h.wait_for_job(&tenant.key, gold_id, "running").await;
            assert!(
                lease_on(&gold_view, agent.node_id).is_some(),
                "{}: gold holds the node: {gold_view}",
                h.backend
            );
            agent
                .event(&victim, "running")
                .await
                .refused(409, "a report on the preempted lease");
        },
    )
    .await;
}

/// Issue 17, defects 3 and 4: while a preemption's grace runs, the gold job says it waits for
/// the bronze one's GPUs and the bronze job says when it stops; a bronze replica that exits with
/// code 0 in its grace period ends as preempted and its job queues again (it did not finish);
/// each state change is on the lease's timeline once; and the gold job's wait counts to its
/// first run, not to its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_exiting_zero_in_its_grace_is_preempted_and_both_jobs_say_why() {
    on_every_backend_with(
        |config| config.matcher.preemption_grace_s = 30,
        async |h: &Harness| {
            let (tenant, agent, bronze_id, victim) = bronze_on_a_whole_node(h).await;
            for state in ["staging", "running", "running", "staging"] {
                agent
                    .event(&victim, state)
                    .await
                    .expect(200, "a report, repeated or late");
            }

            let mut gold = job_request("gold-train");
            gold["gpus"] = json!(4);
            gold["tier"] = json!("gold");
            gold["max_price_per_gpu_hour"] = json!("5.00");
            let gold_id = micros(&h.submit(&tenant, gold).await["id"]);
            let stops_at = h
                .wait_for("the bronze lease to be told when to stop", async || {
                    let view = h
                        .get(&tenant.key, &format!("/v1/jobs/{bronze_id}"))
                        .await
                        .expect(200, "bronze");
                    lease_on(&view, agent.node_id)?["preempt_at_us"].as_i64()
                })
                .await;
            let grace_until = model::time::utc(stops_at);
            let gold_view = h.wait_for_job(&tenant.key, gold_id, "running").await;
            assert_eq!(
                gold_view["state_reason"],
                format!("waiting for GPUs (preempting job {bronze_id}, grace until {grace_until})"),
                "{}: {gold_view}",
                h.backend
            );
            let bronze_view = h
                .get(&tenant.key, &format!("/v1/jobs/{bronze_id}"))
                .await
                .expect(200, "bronze");
            assert_eq!(
                bronze_view["state_reason"],
                format!("preempting: stops at {grace_until} (for job {gold_id})"),
                "{}: {bronze_view}",
                h.backend
            );
            let listed = h.get(&tenant.key, "/v1/jobs").await.expect(200, "the tenant's jobs");
            let reasons: Vec<&Value> = listed["jobs"]
                .as_array()
                .expect("jobs")
                .iter()
                .map(|job| &job["state_reason"])
                .collect();
            assert_eq!(
                reasons,
                vec![&gold_view["state_reason"], &bronze_view["state_reason"]],
                "{}: the list says the same",
                h.backend
            );

            // The bronze replica stops cleanly on SIGTERM, well within its grace.
            let attested = agent
                .signed("POST", "/v1/agent/attestations", Some(&agent.attestation(&victim, 0)))
                .await
                .expect(200, "an attestation in the grace period");
            assert_eq!(attested["state"], "preempted", "{}: {attested}", h.backend);
            assert!(
                text(&attested["end_reason"]).starts_with(&format!("preempted for job {gold_id}")),
                "{}: {attested}",
                h.backend
            );
            let requeued = h.wait_for_job(&tenant.key, bronze_id, "queued").await;
            assert_eq!(requeued["state_reason"], "preempted; queued again", "{}", h.backend);
            let events = h
                .running
                .state
                .store
                .lease_events(micros(&victim["id"]))
                .await
                .expect("events");
            let kinds: Vec<&str> = events.iter().map(|event| event.kind.as_str()).collect();
            assert_eq!(
                kinds,
                vec!["staging", "running", "preempted"],
                "{}: each change once",
                h.backend
            );

            // The gold replica starts once the GPUs are free; its wait ends there.
            let leases = agent.heartbeat().await;
            let lease = leases
                .iter()
                .map(|item| &item["lease"])
                .find(|lease| lease["job_id"] == gold_id)
                .cloned()
                .expect("the gold lease is listed");
            agent.event(&lease, "staging").await.expect(200, "gold stages");
            agent.event(&lease, "running").await.expect(200, "gold runs");
            let gold_view = h
                .get(&tenant.key, &format!("/v1/jobs/{gold_id}"))
                .await
                .expect(200, "gold");
            assert_eq!(gold_view["state_reason"], "", "{}: {gold_view}", h.backend);
            let ran_at = h
                .running
                .state
                .store
                .lease_events(micros(&lease["id"]))
                .await
                .expect("events")
                .iter()
                .find(|event| event.kind == "running")
                .map(|event| event.at)
                .expect("a running event");
            let waits = h.running.state.store.run_waits_since(0, 100).await.expect("waits");
            let gold_wait = waits
                .iter()
                .find(|wait| wait.tier == "gold")
                .expect("the gold job's wait");
            assert_eq!(
                gold_wait.first_run_at,
                Some(ran_at),
                "{}: the wait ends at the first run",
                h.backend
            );
            assert!(
                ran_at > micros(&lease["created_at_us"]),
                "{}: later than the lease's grant",
                h.backend
            );
        },
    )
    .await;
}

/// A node sold until a window's end takes interruptible work that would outlast it: the lease
/// is told to stop one grace period before the end, and the coordinator ends it then.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_interruptible_lease_stops_a_grace_period_before_the_window_ends() {
    on_every_backend_with(
        |config| config.matcher.preemption_grace_s = 1,
        async |h: &Harness| {
            let tenant = h.tenant("acme").await;
            let provider = h.provider("night-lab").await;
            h.credit(&tenant, "100.00").await;
            // The window's end is a whole second at least four seconds away.
            let window_end_s = server::now_us() / 1_000_000 + 5;
            let agent = h
                .node(&provider, "lab-1", |registration| {
                    registration["policy"]["windows"] = json!([{
                        "start_us": (window_end_s - 3600) * 1_000_000,
                        "end_us": window_end_s * 1_000_000,
                    }]);
                })
                .await;
            let mut silver = job_request("needs-an-hour");
            silver["max_runtime_s"] = json!(3600);
            let silver_id = micros(&h.submit(&tenant, silver).await["id"]);
            let mut bronze = job_request("fills-the-night");
            bronze["tier"] = json!("bronze");
            bronze["preemptible"] = json!(true);
            bronze["max_runtime_s"] = json!(3600);
            let bronze_id = micros(&h.submit(&tenant, bronze).await["id"]);
            let (_, lease) = run_until_placed(h, &agent, &tenant, bronze_id).await;
            assert_eq!(
                micros(&lease["preempt_at_us"]),
                (window_end_s - 1) * 1_000_000,
                "{}: stop one grace period before the window ends",
                h.backend
            );
            let waiting = h
                .get(&tenant.key, &format!("/v1/jobs/{silver_id}"))
                .await
                .expect(200, "silver");
            assert_eq!(
                waiting["state"], "queued",
                "{}: silver only goes where the window covers its runtime: {waiting}",
                h.backend
            );
            let stopped = h.wait_for_job(&tenant.key, bronze_id, "queued").await;
            let ended = stopped["leases"]
                .as_array()
                .and_then(|leases| leases.iter().find(|listed| listed["id"] == lease["id"]))
                .cloned()
                .expect("the lease is listed");
            assert_eq!(ended["state"], "preempted", "{}: {stopped}", h.backend);
            assert!(
                micros(&ended["ended_at_us"]) >= (window_end_s - 1) * 1_000_000,
                "{}: {ended}",
                h.backend
            );
        },
    )
    .await;
}

/// A lease whose agent never stops it is ended by the coordinator a grace period after the
/// job's maximum runtime: the lease and the job fail, and the escrow goes back to the tenant.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lease_past_its_maximum_runtime_is_ended_and_its_job_fails() {
    on_every_backend_with(
        |config| config.matcher.preemption_grace_s = 1,
        async |h: &Harness| {
            let (tenant, provider) = tenant_and_provider(h).await;
            let agent = h.node(&provider, "forgetful", |_| {}).await;
            let mut job = job_request("never-stops");
            job["max_runtime_s"] = json!(1);
            let job_id = micros(&h.submit(&tenant, job).await["id"]);
            let (_, lease) = run_until_placed(h, &agent, &tenant, job_id).await;
            agent.event(&lease, "running").await.expect(200, "the job runs");
            let failed = h.wait_for_job(&tenant.key, job_id, "failed").await;
            let ended = lease_on(&failed, agent.node_id).expect("the lease is listed");
            assert_eq!(ended["state"], "failed", "{}: {failed}", h.backend);
            assert!(
                ended["end_reason"].as_str().unwrap_or("").contains("max_runtime_s"),
                "{}: the reason says why: {ended}",
                h.backend
            );
            assert!(
                micros(&ended["ended_at_us"]) >= micros(&lease["expected_end_us"]) + 1_000_000,
                "{}: not before the grace period after the expected end: {ended}",
                h.backend
            );
            assert_eq!(micros(&failed["escrow_micros"]), 0, "{}: {failed}", h.backend);
            assert!(agent.heartbeat().await.is_empty(), "{}: nothing left to run", h.backend);
        },
    )
    .await;
}

/// An agent sends its replica's output in chunks at byte offsets of the replica's log; the
/// tenant reads them in order, and nobody else can.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replicas_output_reaches_its_tenant_and_no_one_else() {
    on_every_backend(async |h: &Harness| {
        let (tenant, provider) = tenant_and_provider(h).await;
        let agent = h.node(&provider, "talkative", |_| {}).await;
        let other = h.node(&provider, "nosy", |_| {}).await;
        let job_id = micros(&h.submit(&tenant, job_request("chatty")).await["id"]);
        let (_, lease) = run_until_placed(h, &agent, &tenant, job_id).await;
        let path = format!("/v1/agent/leases/{}/logs", lease["id"]);
        let epoch = micros(&lease["epoch"]);
        let chunk = |offset: i64, text: &str| json!({"epoch": epoch, "byte_offset": offset, "text": text});
        let sent = agent
            .signed("POST", &path, Some(&chunk(0, "step 1\n")))
            .await
            .expect(200, "a chunk");
        assert_eq!(sent["stored"], true, "{}", h.backend);
        let again = agent
            .signed("POST", &path, Some(&chunk(0, "step 1\n")))
            .await
            .expect(200, "again");
        assert_eq!(again["stored"], false, "{}: the same offset is stored once", h.backend);
        agent
            .signed("POST", &path, Some(&chunk(7, "step 2\n")))
            .await
            .expect(200, "the next chunk");
        agent
            .signed(
                "POST",
                &path,
                Some(&json!({"epoch": epoch + 1, "byte_offset": 14, "text": "x"})),
            )
            .await
            .refused(409, "another epoch");
        agent
            .signed("POST", &path, Some(&chunk(-1, "x")))
            .await
            .refused(400, "a negative offset");
        agent
            .signed(
                "POST",
                &path,
                Some(&chunk(14, &"y".repeat(api::LOG_CHUNK_CHARS_MAX + 1))),
            )
            .await
            .refused(400, "an oversized chunk");
        other
            .signed("POST", &path, Some(&chunk(14, "forged")))
            .await
            .refused(403, "another node's lease");
        let logs = h
            .get(&tenant.key, &format!("/v1/jobs/{job_id}/logs"))
            .await
            .expect(200, "logs");
        let texts: Vec<&str> = logs["chunks"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|chunk| chunk["text"].as_str())
            .collect();
        assert_eq!(texts, vec!["step 1\n", "step 2\n"], "{}: {logs}", h.backend);
        let rest = h
            .get(
                &tenant.key,
                &format!("/v1/jobs/{job_id}/logs?after={}", logs["next_after"]),
            )
            .await
            .expect(200, "nothing newer");
        assert_eq!(rest["chunks"], json!([]), "{}", h.backend);
        let stranger = h.tenant("globex").await;
        h.get(&stranger.key, &format!("/v1/jobs/{job_id}/logs"))
            .await
            .refused(404, "another tenant's logs");

        let progress_path = format!("/v1/agent/leases/{}/progress", lease["id"]);
        let progress = |done: i64| json!({"epoch": epoch, "unit": "tokens", "done": done});
        agent
            .signed("POST", &progress_path, Some(&progress(900)))
            .await
            .expect(200, "progress");
        agent
            .signed("POST", &progress_path, Some(&progress(400)))
            .await
            .expect(200, "an older count");
        other
            .signed("POST", &progress_path, Some(&progress(5)))
            .await
            .refused(403, "progress for another node's lease");
        agent
            .signed("POST", &progress_path, Some(&progress(-1)))
            .await
            .refused(400, "a negative count");
        agent
            .signed(
                "POST",
                &progress_path,
                Some(&json!({"epoch": epoch + 1, "unit": "tokens", "done": 1})),
            )
            .await
            .refused(409, "another epoch");
        agent.event(&lease, "running").await.expect(200, "running");
        agent
            .signed("POST", "/v1/agent/usage", Some(&agent.usage(&lease, 1, 1000)))
            .await
            .expect(200, "a usage record");
        let view = h
            .get(&tenant.key, &format!("/v1/jobs/{job_id}"))
            .await
            .expect(200, "job");
        assert_eq!(
            (view["progress"]["unit"].as_str(), view["progress"]["done"].as_i64()),
            (Some("tokens"), Some(900)),
            "{}: a count never goes back: {view}",
            h.backend
        );
        let cost = micros(&view["cost_micros"]);
        assert!(cost > 0, "{}: {view}", h.backend);
        assert_eq!(
            micros(&view["progress"]["cost_micros_per_million_units"]),
            cost * 1_000_000 / 900,
            "{}: {view}",
            h.backend
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_same_client_token_returns_the_same_job() {
    on_every_backend(async |h: &Harness| {
        let tenant = h.tenant("acme").await;
        let other = h.tenant("globex").await;
        h.credit(&tenant, "10.00").await;
        h.credit(&other, "10.00").await;
        let mut request = job_request("once");
        request["client_token"] = json!("retry-7");
        let first = h.submit(&tenant, request.clone()).await;
        let again = h.submit(&tenant, request.clone()).await;
        assert_eq!(again["id"], first["id"], "{}", h.backend);
        let concurrent = futures_join(h, &tenant.key, &request, 6).await;
        assert!(
            concurrent.iter().all(|id| *id == first["id"]),
            "{}: concurrent retries {concurrent:?} vs {}",
            h.backend,
            first["id"]
        );
        let theirs = h.submit(&other, request.clone()).await;
        assert_ne!(theirs["id"], first["id"], "{}: tokens are per tenant", h.backend);
        request["client_token"] = json!("retry-8");
        let different = h.submit(&tenant, request).await;
        assert_ne!(different["id"], first["id"], "{}", h.backend);
        let listed = h.get(&tenant.key, "/v1/jobs").await.expect(200, "list");
        assert_eq!(
            listed["jobs"].as_array().map(Vec::len),
            Some(2),
            "{}: {listed}",
            h.backend
        );
        assert_eq!(h.job_count().await, 3.0, "{}", h.backend);
    })
    .await;
}

/// Sends the same submission `count` times at once; returns the job ids answered.
async fn futures_join(h: &Harness, key: &str, request: &Value, count: usize) -> Vec<Value> {
    let mut tasks = Vec::new();
    for _ in 0..count {
        let (http, url, key, request) = (h.http.clone(), h.url("/v1/jobs"), key.to_string(), request.clone());
        tasks.push(tokio::spawn(async move {
            let response = http
                .post(url)
                .bearer_auth(key)
                .json(&request)
                .send()
                .await
                .expect("answer");
            assert_eq!(response.status().as_u16(), 201);
            response.json::<Value>().await.expect("JSON")["id"].clone()
        }));
    }
    let mut ids = Vec::new();
    for task in tasks {
        ids.push(task.await.expect("the submission task"));
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quotes_and_offer_searches_answer_from_the_fleet() {
    on_every_backend(async |h: &Harness| {
        let tenant = h.tenant("acme").await;
        let provider = h.provider("gpu-farm").await;
        let cheap = h.node(&provider, "cheap-h100", |_| {}).await;
        let dear = h
            .node(&provider, "dear-h100", |node| {
                node["policy"]["asks"] = json!({"gold": "4.00", "silver": "3.00", "bronze": "2.60"});
            })
            .await;
        let ampere = h
            .node(&provider, "a100", |node| {
                node["gpu_model"] = json!("A100-SXM4-80GB");
                node["policy"]["asks"] = json!({"silver": "1.50"});
            })
            .await;
        for agent in [&cheap, &dear, &ampere] {
            agent.heartbeat().await;
        }
        let search = async |filter: &str| -> Value {
            let path = format!("/v1/offers?filter={}", url_encode(filter));
            h.get(&tenant.key, &path).await.expect(200, filter)
        };
        let everything = h
            .wait_for("all three nodes online in the offers", async || {
                let found = search("online=true").await;
                (found["total_matching"] == 3).then_some(found)
            })
            .await;
        // Nothing in those regions: the answer says which clause excluded the nodes.
        let elsewhere = search("region in [us-east,ap-south] gpus_free>0").await;
        assert_eq!(elsewhere["total_matching"], 0, "{}: {elsewhere}", h.backend);
        assert_eq!(
            elsewhere["explanation"],
            "0 of 3 nodes: 3 excluded by `region in [us-east,ap-south]` (nodes are in eu-west)",
            "{}",
            h.backend
        );
        assert_eq!(everything["explanation"], Value::Null, "{}", h.backend);
        let ids = |found: &Value| -> Vec<i64> {
            found["offers"]
                .as_array()
                .expect("offers")
                .iter()
                .map(|offer| micros(&offer["node_id"]))
                .collect()
        };
        // Sorted by the lowest ask in any tier: $1.00 bronze, $1.50 silver, $2.60 bronze.
        assert_eq!(
            ids(&everything),
            [cheap.node_id, ampere.node_id, dear.node_id],
            "{}",
            h.backend
        );

        let found = search("gpu_model=H100 price<2.5").await;
        assert_eq!(found["total_matching"], 1, "{}: {found}", h.backend);
        let offer = &found["offers"][0];
        assert_eq!(offer["node_id"], cheap.node_id, "{}", h.backend);
        assert_eq!(offer["gpu_model"], "H100-SXM5", "{}", h.backend);
        assert_eq!(offer["gpu_count"], 8, "{}", h.backend);
        assert_eq!(
            offer["price_micros_per_gpu_hour"],
            json!({"gold": 3_000_000, "silver": 2_000_000, "bronze": 1_000_000}),
            "{}",
            h.backend
        );
        let silver = search("tier=silver").await;
        assert_eq!(
            ids(&silver),
            [ampere.node_id, cheap.node_id, dear.node_id],
            "{}",
            h.backend
        );
        assert_eq!(search("gpu_model=B200").await["total_matching"], 0, "{}", h.backend);
        let bad = h
            .get(&tenant.key, &format!("/v1/offers?filter={}", url_encode("price<<2")))
            .await;
        bad.refused(400, "a filter that does not parse");

        let quote = h
            .post(&tenant.key, "/v1/jobs/quote", job_request("ask"))
            .await
            .expect(200, "quote");
        assert_eq!(quote["nodes_total"], 3, "{}: {quote}", h.backend);
        assert!(micros(&quote["nodes_feasible"]) >= 1, "{}: {quote}", h.backend);
        let price = micros(&quote["price_micros_per_gpu_hour"]);
        assert!((1..=2_500_000).contains(&price), "{}: {quote}", h.backend);
        assert!(
            quote.get("nodes_with_data").is_none(),
            "{}: no datasets named: {quote}",
            h.backend
        );
        let mut with_data = job_request("with data");
        with_data["datasets"] = json!([{
            "url": "https://data.example.com/a.tar",
            "digest": format!("blake3:{}", "ab".repeat(32)),
            "size_bytes": 1_000_000,
        }]);
        let quote = h
            .post(&tenant.key, "/v1/jobs/quote", with_data)
            .await
            .expect(200, "quote with a dataset");
        assert!(micros(&quote["nodes_feasible"]) >= 1, "{}: {quote}", h.backend);
        assert_eq!(
            quote["nodes_with_data"], 0,
            "{}: no node holds it yet: {quote}",
            h.backend
        );
        let mut too_big = job_request("too big");
        too_big["gpus"] = json!(16);
        let quote = h
            .post(&tenant.key, "/v1/jobs/quote", too_big)
            .await
            .expect(200, "quote");
        assert_eq!(
            quote["price_micros_per_gpu_hour"],
            Value::Null,
            "{}: {quote}",
            h.backend
        );
        assert_eq!(quote["nodes_feasible"], 0, "{}: {quote}", h.backend);
        assert!(
            !quote["explanation"].as_str().unwrap_or_default().is_empty(),
            "{}: an infeasible quote says why: {quote}",
            h.backend
        );
        assert_eq!(h.job_count().await, 0.0, "{}: quoting submits nothing", h.backend);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_without_balance_gets_402() {
    on_every_backend(async |h: &Harness| {
        let tenant = h.tenant("broke").await;
        let reply = h.post(&tenant.key, "/v1/jobs", job_request("free lunch")).await;
        let message = reply.refused(402, "a job with no balance");
        assert_eq!(reply.body["error"]["code"], "payment_required", "{}", h.backend);
        assert!(
            message.contains("credit"),
            "{}: the message says what to do: {message}",
            h.backend
        );
        assert_eq!(h.job_count().await, 0.0, "{}: nothing was written", h.backend);
        h.credit(&tenant, "1.00").await;
        h.submit(&tenant, job_request("paid lunch")).await;
        assert_eq!(h.job_count().await, 1.0, "{}", h.backend);
    })
    .await;
}

/// Percent-encodes a query value (everything but unreserved characters).
pub fn url_encode(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (byte as char).to_string(),
            _ => format!("%{byte:02X}"),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn losing_a_gold_lease_to_a_node_fault_credits_the_tenant() {
    on_every_backend_with(
        |config| config.heartbeat_timeout_ms = 1500,
        async |h: &Harness| {
            let (tenant, provider) = tenant_and_provider(h).await;
            let silent = h.node(&provider, "flaky", |_| {}).await;
            let mut request = job_request("reserved");
            request["tier"] = json!("gold");
            request["max_price_per_gpu_hour"] = json!("5.00");
            let job = h.submit(&tenant, request).await;
            let job_id = micros(&job["id"]);
            let (_, lost) = run_until_placed(h, &silent, &tenant, job_id).await;
            let held = micros(&balance(h, &tenant.key).await["available_micros"]);
            h.wait_for_job(&tenant.key, job_id, "queued").await;
            let price = micros(&lost["price_micros_per_gpu_hour"]);
            // One GPU for one hour at the lease's price, from the platform's SLA pot.
            let after = micros(&balance(h, &tenant.key).await["available_micros"]);
            assert_eq!(
                after - held,
                price,
                "{}: the tenant is credited an hour of the lost lease",
                h.backend
            );
            assert_eq!(
                h.metric("fallow_ledger_sum_micros{of=\"balances\"}").await,
                0.0,
                "{}",
                h.backend
            );
        },
    )
    .await;
}

/// The live leases of a job view: (lease id, node id) pairs.
fn live_leases(view: &Value) -> Vec<(Value, Value)> {
    view["leases"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|lease| ["pending", "staging", "running"].contains(&lease["state"].as_str().unwrap_or("")))
        .map(|lease| (lease["id"].clone(), lease["node_id"].clone()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_gang_that_loses_a_node_is_repaired_beside_its_survivor() {
    on_every_backend_with(
        |config| config.heartbeat_timeout_ms = 1500,
        async |h: &Harness| {
            let tenant = h.tenant("acme").await;
            let provider = h.provider("gpu-farm").await;
            h.credit(&tenant, "500.00").await;
            // Two 8-GPU nodes in one fabric take a two-replica gang, one replica each.
            let survivor = h.node(&provider, "a", |_| {}).await;
            let doomed = h.node(&provider, "b", |_| {}).await;
            let mut gang = job_request("gang");
            gang["gpus"] = json!(8);
            gang["replicas"] = json!(2);
            gang["topology"] = json!("fabric");
            let job_id = micros(&h.submit(&tenant, gang).await["id"]);
            let path = format!("/v1/jobs/{job_id}");
            let placed = h
                .wait_for("the gang to run on both nodes", async || {
                    survivor.heartbeat().await;
                    doomed.heartbeat().await;
                    let view = h.get(&tenant.key, &path).await.expect(200, "job");
                    (live_leases(&view).len() == 2).then_some(view)
                })
                .await;
            let before = live_leases(&placed);
            let kept = before
                .iter()
                .find(|(_, node)| *node == survivor.node_id)
                .cloned()
                .expect("one replica on the survivor");
            // A spare node joins the fabric (all three beat until the store has it on line);
            // then `doomed` falls silent.
            let spare = h.node(&provider, "c", |_| {}).await;
            let spare_path = format!("/v1/nodes/{}", spare.node_id);
            h.wait_for("the spare node to come on line", async || {
                survivor.heartbeat().await;
                doomed.heartbeat().await;
                spare.heartbeat().await;
                let node = h.get(&provider.key, &spare_path).await.expect(200, "node");
                (node["online"] == true).then_some(())
            })
            .await;
            let repaired = h
                .wait_for("the lost replica to move to the spare node", async || {
                    survivor.heartbeat().await;
                    spare.heartbeat().await;
                    let view = h.get(&tenant.key, &path).await.expect(200, "job");
                    live_leases(&view)
                        .iter()
                        .any(|(_, node)| *node == spare.node_id)
                        .then_some(view)
                })
                .await;
            assert_eq!(
                repaired["state"], "running",
                "{}: repaired, not requeued: {repaired}",
                h.backend
            );
            let after = live_leases(&repaired);
            assert_eq!(after.len(), 2, "{}: {repaired}", h.backend);
            assert!(
                after.contains(&kept),
                "{}: the survivor's lease is untouched",
                h.backend
            );
            assert!(
                !after.iter().any(|(_, node)| *node == doomed.node_id),
                "{}: nothing left on the silent node",
                h.backend
            );
            let lost = repaired["leases"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|lease| lease["node_id"] == doomed.node_id)
                .map(|lease| lease["state"].clone())
                .collect::<Vec<_>>();
            assert_eq!(lost, vec![json!("lost")], "{}: {repaired}", h.backend);
            assert!(h.metric("fallow_leases_lost_total").await >= 1.0, "{}", h.backend);
        },
    )
    .await;
}

/// A node over its owner's thermal or power limit (its heartbeats say so) takes no new work at
/// once; when that lasts, its bronze work is preempted and queued again; back within its limits
/// it takes work again. The node's view shows since when it has been over.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_over_its_limits_takes_no_new_work_and_sheds_bronze_if_it_lasts() {
    on_every_backend_with(
        |config| {
            config.matcher.preemption_grace_s = 1;
            config.over_limit_preempt_after_ms = 1500;
        },
        async |h: &Harness| {
            let (tenant, provider) = tenant_and_provider(h).await;
            let hot = h.node(&provider, "hot", |_| {}).await;
            let mut bronze = job_request("bronze-sweep");
            bronze["tier"] = json!("bronze");
            bronze["preemptible"] = json!(true);
            let bronze_id = micros(&h.submit(&tenant, bronze).await["id"]);
            let (_, running) = run_until_placed(h, &hot, &tenant, bronze_id).await;
            hot.event(&running, "running").await.expect(200, "bronze runs");

            let beat = async |over: bool| {
                hot.signed("POST", "/v1/agent/heartbeat", Some(&json!({"over_limit": over})))
                    .await
                    .expect(200, "heartbeat with over_limit");
            };
            let before = server::now_us();
            beat(true).await;
            let node = h
                .get(&provider.key, &format!("/v1/nodes/{}", hot.node_id))
                .await
                .expect(200, "node");
            let since = micros(&node["over_limit_since_us"]);
            assert!(
                since >= before,
                "{}: over since the heartbeat that said so: {node}",
                h.backend
            );
            assert_eq!(node["telemetry"]["over_limit"], true, "{}: {node}", h.backend);

            // New work waits, though the node has free GPUs, and says why.
            let silver_id = micros(&h.submit(&tenant, job_request("silver-infer")).await["id"]);
            let waiting = h
                .wait_for("the silver job to be refused the hot node", async || {
                    beat(true).await;
                    let view = h
                        .get(&tenant.key, &format!("/v1/jobs/{silver_id}"))
                        .await
                        .expect(200, "silver");
                    let why = view["explanation"].as_str().unwrap_or_default().to_string();
                    (view["state"] == "queued" && why.contains("1 over its owner's thermal or power limit"))
                        .then_some(view)
                })
                .await;
            assert!(
                waiting["leases"].as_array().is_none_or(|leases| leases.is_empty()),
                "{}: {waiting}",
                h.backend
            );

            // It lasts: the bronze lease is told to stop, then ended and its job queued again.
            let stopped = h
                .wait_for("the bronze lease to be preempted", async || {
                    beat(true).await;
                    let view = h
                        .get(&tenant.key, &format!("/v1/jobs/{bronze_id}"))
                        .await
                        .expect(200, "bronze");
                    let lease = view["leases"]
                        .as_array()?
                        .iter()
                        .find(|lease| lease["id"] == running["id"])?
                        .clone();
                    (lease["state"] == "preempted").then_some(lease)
                })
                .await;
            assert!(
                stopped["end_reason"].as_str().unwrap_or_default().contains("limit"),
                "{}: {stopped}",
                h.backend
            );
            assert!(
                micros(&stopped["ended_at_us"]) >= since + 1_500_000,
                "{}: not before the condition lasted: {stopped}",
                h.backend
            );
            let view = h
                .get(&tenant.key, &format!("/v1/jobs/{silver_id}"))
                .await
                .expect(200, "silver");
            assert_eq!(
                view["state"], "queued",
                "{}: still nothing placed on it: {view}",
                h.backend
            );

            // Back within its limits: it takes work again.
            beat(false).await;
            let node = h
                .get(&provider.key, &format!("/v1/nodes/{}", hot.node_id))
                .await
                .expect(200, "node");
            assert_eq!(node["over_limit_since_us"], Value::Null, "{}: {node}", h.backend);
            run_until_placed(h, &hot, &tenant, silver_id).await;
        },
    )
    .await;
}

/// Nodes say which runtimes their agent runs (container, process); a job that names its
/// runtime goes only where that runs, and a bad name is refused with the field named.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_process_job_goes_to_a_node_that_runs_processes() {
    on_every_backend(async |h: &Harness| {
        let (tenant, provider) = tenant_and_provider(h).await;
        let containers = h
            .node(&provider, "containers-only", |registration| {
                registration["runtimes"] = json!(["container"]);
                registration["policy"]["asks"] = json!({"silver": "1.00"});
            })
            .await;
        let bare = h
            .node(&provider, "bare-metal", |registration| {
                registration["runtimes"] = json!(["process"]);
            })
            .await;
        let view = h
            .get(&provider.key, &format!("/v1/nodes/{}", bare.node_id))
            .await
            .expect(200, "node");
        assert_eq!(view["runtimes"], json!(["process"]), "{}: {view}", h.backend);
        let view = h
            .get(&provider.key, &format!("/v1/nodes/{}", containers.node_id))
            .await
            .expect(200, "node");
        assert_eq!(view["runtimes"], json!(["container"]), "{}: {view}", h.backend);
        containers.heartbeat().await;

        let mut request = job_request("bare");
        request["runtime"] = json!("process");
        request["image"] = json!("sh");
        let id = micros(&h.submit(&tenant, request).await["id"]);
        let (placed, _) = run_until_placed(h, &bare, &tenant, id).await;
        assert_eq!(placed["spec"]["runtime"], "process", "{}: {placed}", h.backend);

        let mut bad = job_request("bad-runtime");
        bad["runtime"] = json!("vm");
        let reply = h.post(&tenant.key, "/v1/jobs", bad).await;
        assert_eq!(reply.status, 400, "{}: {}", h.backend, reply.text);
        assert!(reply.text.contains("runtime"), "{}: {}", h.backend, reply.text);
        let mut registration = common::node_registration(&trust::NodeKey::generate(), "weird");
        registration["runtimes"] = json!(["vm"]);
        let reply = h.post(&provider.key, "/v1/nodes", registration).await;
        assert_eq!(reply.status, 400, "{}: {}", h.backend, reply.text);
        assert!(reply.text.contains("runtimes"), "{}: {}", h.backend, reply.text);
    })
    .await;
}
