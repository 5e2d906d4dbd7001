//! An owner takes GPUs back (docs/trust-policy.md § 8), on SQLite and on PostgreSQL: idle GPUs
//! first, bronze work on the GPUs taken stops after its grace, firm work runs on unless forced,
//! a forced stop pays the tenant an hour of the lease from the provider's earnings, the GPUs
//! sell nothing until the time given ends or the owner resumes, and the node's own key can do
//! it from its host.

mod common;

use common::{Account, Agent, Harness, job_request, on_every_backend_with, run_until_placed};
use serde_json::{Value, json};

const GRACE_S: u32 = 2;

fn micros(value: &Value) -> i64 {
    value.as_i64().unwrap_or_else(|| panic!("{value} is not an integer"))
}

fn gpus(value: &Value) -> Vec<i64> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("{value} is not a list"))
        .iter()
        .map(micros)
        .collect()
}

/// A tenant's job of `gpus` GPUs in `tier`, placed on `agent`'s node and running: its id and
/// lease.
async fn running(h: &Harness, agent: &Agent, tenant: &Account, name: &str, tier: &str, count: i64) -> (i64, Value) {
    let mut job = job_request(name);
    job["gpus"] = json!(count);
    job["tier"] = json!(tier);
    job["max_price_per_gpu_hour"] = json!("5.00");
    if tier == "bronze" {
        job["preemptible"] = json!(true);
    }
    let id = micros(&h.submit(tenant, job).await["id"]);
    let (_, lease) = run_until_placed(h, agent, tenant, id).await;
    agent.event(&lease, "running").await.expect(200, "the replica runs");
    (id, lease)
}

/// The tenant "acme" with $100 of credit and the provider "basement".
async fn tenant_and_owner(h: &Harness) -> (Account, Account) {
    let tenant = h.tenant("acme").await;
    let provider = h.provider("basement").await;
    h.credit(&tenant, "100.00").await;
    (tenant, provider)
}

async fn node_view(h: &Harness, provider: &Account, agent: &Agent) -> Value {
    h.get(&provider.key, &format!("/v1/nodes/{}", agent.node_id))
        .await
        .expect(200, "the provider reads its node")
}

async fn available(h: &Harness, tenant: &Account) -> i64 {
    micros(&h.get(&tenant.key, "/v1/balance").await.expect(200, "balance")["available_micros"])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_owner_takes_gpus_back_bronze_stops_firm_runs_on_unless_forced_and_nothing_new_lands() {
    on_every_backend_with(
        |config| config.matcher.preemption_grace_s = GRACE_S,
        async |h: &Harness| {
            let (tenant, provider) = tenant_and_owner(h).await;
            let agent = h.node(&provider, "rack", |_| {}).await;
            let (bronze_id, bronze) = running(h, &agent, &tenant, "sweep", "bronze", 2).await;
            let (_, gold) = running(h, &agent, &tenant, "train", "gold", 2).await;
            let reclaim = format!("/v1/nodes/{}/reclaim", agent.node_id);

            // Six of eight: the four idle GPUs, then the bronze job's two; gold is not touched.
            let before = server::now_us();
            let taken = h
                .post(&provider.key, &reclaim, json!({"gpus": 6, "for_s": 3600}))
                .await
                .expect(200, "the owner reclaims six GPUs");
            let reclaimed = gpus(&taken["gpus"]);
            assert_eq!(reclaimed.len(), 6, "{}: {taken}", h.backend);
            for gpu in gpus(&gold["gpu_indices"]) {
                assert!(
                    !reclaimed.contains(&gpu),
                    "{}: a gold GPU was taken first: {taken}",
                    h.backend
                );
            }
            for gpu in gpus(&bronze["gpu_indices"]) {
                assert!(
                    reclaimed.contains(&gpu),
                    "{}: bronze GPUs go before firm ones: {taken}",
                    h.backend
                );
            }
            let until = micros(&taken["until_us"]);
            assert!(
                until >= before + 3_600_000_000 && until <= server::now_us() + 3_600_000_000,
                "{}: reclaimed for the hour asked: {taken}",
                h.backend
            );
            let stopping = taken["stopping"].as_array().expect("stopping");
            assert_eq!(stopping.len(), 1, "{}: {taken}", h.backend);
            assert_eq!(stopping[0]["lease_id"], bronze["id"], "{}", h.backend);
            let stop_at = micros(&stopping[0]["stop_at_us"]);
            assert!(
                stop_at >= before + i64::from(GRACE_S) * 1_000_000,
                "{}: bronze gets its grace: {taken}",
                h.backend
            );
            assert_eq!(stopping[0]["credit_micros"], 0, "{}: bronze is owed nothing", h.backend);
            assert_eq!(taken["running_on"], json!([]), "{}", h.backend);
            let shown = node_view(h, &provider, &agent).await;
            assert_eq!(shown["reclaimed_gpus"], taken["gpus"], "{}: {shown}", h.backend);
            assert_eq!(shown["reclaimed_until_us"], taken["until_us"], "{}", h.backend);

            // The bronze job stops after its grace and queues again, and nothing takes the
            // reclaimed GPUs: a one-GPU job waits although six GPUs are idle.
            let stopped = h.wait_for_job(&tenant.key, bronze_id, "queued").await;
            let ended = stopped["leases"]
                .as_array()
                .and_then(|leases| leases.iter().find(|lease| lease["id"] == bronze["id"]))
                .cloned()
                .expect("the bronze lease is listed");
            assert_eq!(ended["state"], "preempted", "{}: {stopped}", h.backend);
            assert!(
                ended["end_reason"]
                    .as_str()
                    .unwrap_or("")
                    .contains("took the GPUs back"),
                "{}: the reason says the owner took them: {ended}",
                h.backend
            );
            let mut small = job_request("small");
            small["max_price_per_gpu_hour"] = json!("5.00");
            let small_id = micros(&h.submit(&tenant, small).await["id"]);
            for _ in 0..6 {
                agent.heartbeat().await;
                tokio::time::sleep(std::time::Duration::from_millis(250)).await;
            }
            let waiting = h
                .get(&tenant.key, &format!("/v1/jobs/{small_id}"))
                .await
                .expect(200, "the small job");
            assert_eq!(waiting["state"], "queued", "{}: {waiting}", h.backend);
            let bronze_now = h
                .get(&tenant.key, &format!("/v1/jobs/{bronze_id}"))
                .await
                .expect(200, "the bronze job");
            assert_eq!(
                bronze_now["state"], "queued",
                "{}: it waits too: {bronze_now}",
                h.backend
            );

            // All eight, not forced: gold runs on and is named with its end.
            let all = h
                .post(&provider.key, &reclaim, json!({}))
                .await
                .expect(200, "the owner reclaims every GPU");
            assert_eq!(gpus(&all["gpus"]), (0..8).collect::<Vec<i64>>(), "{}: {all}", h.backend);
            assert_eq!(all["until_us"], Value::Null, "{}: until resumed", h.backend);
            let running_on = all["running_on"].as_array().expect("running_on");
            assert_eq!(running_on.len(), 1, "{}: {all}", h.backend);
            assert_eq!(running_on[0]["lease_id"], gold["id"], "{}", h.backend);
            assert_eq!(
                running_on[0]["expected_end_us"], gold["expected_end_us"],
                "{}",
                h.backend
            );
            assert_eq!(running_on[0]["stop_at_us"], Value::Null, "{}", h.backend);

            // Forced: gold stops after its grace and the tenant is paid an hour of it.
            let paid_before = available(h, &tenant).await;
            let forced = h
                .post(&provider.key, &reclaim, json!({"force": true}))
                .await
                .expect(200, "the owner forces the reclaim");
            let stopping = forced["stopping"].as_array().expect("stopping");
            let gold_stop = stopping
                .iter()
                .find(|lease| lease["lease_id"] == gold["id"])
                .unwrap_or_else(|| panic!("{}: gold is stopped: {forced}", h.backend));
            let hour_of_gold = micros(&gold["price_micros_per_gpu_hour"]) * 2;
            assert_eq!(
                micros(&gold_stop["credit_micros"]),
                hour_of_gold,
                "{}: {forced}",
                h.backend
            );
            assert_eq!(
                available(h, &tenant).await - paid_before,
                hour_of_gold,
                "{}: the tenant has the credit",
                h.backend
            );
            // Asked again, nothing is paid twice.
            let again = h
                .post(&provider.key, &reclaim, json!({"force": true}))
                .await
                .expect(200, "forced again");
            assert!(
                again["stopping"]
                    .as_array()
                    .expect("stopping")
                    .iter()
                    .all(|lease| lease["credit_micros"] == 0),
                "{}: {again}",
                h.backend
            );
            assert_eq!(available(h, &tenant).await - paid_before, hour_of_gold, "{}", h.backend);

            // Resumed: the small job runs.
            let resumed = h
                .call("DELETE", &reclaim, Some(&provider.key), None)
                .await
                .expect(200, "the owner resumes");
            assert_eq!(resumed["gpus"], json!([]), "{}", h.backend);
            assert_eq!(node_view(h, &provider, &agent).await["reclaimed_gpus"], json!([]));
            run_until_placed(h, &agent, &tenant, small_id).await;
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reclaim_ends_when_its_time_is_up_and_the_host_can_pause_with_the_nodes_key() {
    on_every_backend_with(
        |config| config.matcher.preemption_grace_s = GRACE_S,
        async |h: &Harness| {
            let (tenant, provider) = tenant_and_owner(h).await;
            let agent = h
                .node(&provider, "desk", |registration| registration["gpu_count"] = json!(1))
                .await;
            agent.heartbeat().await;
            // From the host, signed with the node's key: every GPU, for two seconds.
            let paused = agent
                .signed("POST", "/v1/agent/reclaim", Some(&json!({"for_s": 2})))
                .await
                .expect(200, "the host pauses its node");
            assert_eq!(gpus(&paused["gpus"]), vec![0], "{}: {paused}", h.backend);
            let paused_at = server::now_us();
            let mut job = job_request("waits");
            job["max_price_per_gpu_hour"] = json!("5.00");
            let id = micros(&h.submit(&tenant, job).await["id"]);
            agent.heartbeat().await;
            let (view, _) = run_until_placed(h, &agent, &tenant, id).await;
            let placed_at = view["leases"][0]["created_at_us"].as_i64().expect("created_at_us");
            assert!(
                placed_at >= paused_at + 1_500_000,
                "{}: placed {} ms after the pause, before it ended",
                h.backend,
                (placed_at - paused_at) / 1000
            );
            assert_eq!(
                node_view(h, &provider, &agent).await["reclaimed_gpus"],
                json!([]),
                "{}: the reclaim is over",
                h.backend
            );
            // Paused with no end, then resumed from the host.
            agent
                .signed("POST", "/v1/agent/reclaim", Some(&json!({})))
                .await
                .expect(200, "paused until resumed");
            assert_eq!(node_view(h, &provider, &agent).await["reclaimed_until_us"], Value::Null);
            assert_eq!(node_view(h, &provider, &agent).await["reclaimed_gpus"], json!([0]));
            agent
                .signed("POST", "/v1/agent/resume", Some(&json!({})))
                .await
                .expect(200, "resumed from the host");
            assert_eq!(node_view(h, &provider, &agent).await["reclaimed_gpus"], json!([]));
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bad_reclaim_is_refused_with_the_field_and_only_the_owner_may_reclaim() {
    on_every_backend_with(
        |_| {},
        async |h: &Harness| {
            let tenant = h.tenant("acme").await;
            let provider = h.provider("basement").await;
            let other = h.provider("neighbour").await;
            let agent = h.node(&provider, "rack", |_| {}).await;
            let reclaim = format!("/v1/nodes/{}/reclaim", agent.node_id);
            for (body, field) in [
                (json!({"gpus": 0}), "gpus"),
                (json!({"gpus": 9}), "gpus"),
                (json!({"for_s": 0}), "for_s"),
                (json!({"for_s": 400 * 24 * 3600}), "for_s"),
                (json!({"gpu": 1}), "gpu"),
            ] {
                let message = h
                    .post(&provider.key, &reclaim, body.clone())
                    .await
                    .refused(400, "a bad reclaim");
                assert!(message.contains(field), "{}: {body} → {message}", h.backend);
            }
            h.post(&other.key, &reclaim, json!({}))
                .await
                .refused(404, "another provider's node");
            h.post(&tenant.key, &reclaim, json!({})).await.refused(403, "a tenant");
            assert_eq!(node_view(h, &provider, &agent).await["reclaimed_gpus"], json!([]));
        },
    )
    .await;
}
