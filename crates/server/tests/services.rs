//! Deployed services, on SQLite and on PostgreSQL, with test agents that report their replicas
//! ready or not: the controller keeps a service at its replica count, rolls a new version out
//! one replica at a time (an old one ends only when a new one is ready), stops a version whose
//! replicas never become healthy and keeps the old ones serving, renews a replica's escrow as it
//! runs past its period, scales to zero when idle and back up on a request, and a deleted
//! service's replicas stop. (Requests through the gateway and autoscaling on load, with real
//! agents and tunnels, are in `crates/fallow/tests/e2e_serve.rs`.)

mod common;

use common::{Account, Agent, Harness, job_request, live_leases, on_every_backend_with};
use serde_json::{Value, json};

fn service(name: &str, min: u32, max: u32) -> Value {
    let mut replica = job_request("replica");
    replica.as_object_mut().expect("an object").remove("name");
    replica["max_runtime_s"] = json!(4);
    json!({
        "name": name,
        "replica": replica,
        "min_replicas": min,
        "max_replicas": max,
        "health_timeout_s": 2,
        "scale_down_after_s": 2,
        "wake_timeout_s": 1,
    })
}

/// The service's replicas as `GET /v1/services/{name}` lists them.
async fn replicas(h: &Harness, tenant: &Account, name: &str) -> Vec<Value> {
    let view = h
        .get(&tenant.key, &format!("/v1/services/{name}"))
        .await
        .expect(200, "the service");
    view["replica_states"].as_array().cloned().unwrap_or_default()
}

/// Beats for every node, and reports each placed replica running, and ready when `ready` says
/// so of its version. Returns the service's view.
async fn tend(h: &Harness, tenant: &Account, agents: &[&Agent], name: &str, ready: impl Fn(i64) -> bool) -> Value {
    for agent in agents {
        agent.heartbeat().await;
    }
    for replica in replicas(h, tenant, name).await {
        let Some(node) = replica["node_id"].as_i64() else {
            continue;
        };
        let agent = agents
            .iter()
            .find(|agent| agent.node_id == node)
            .expect("a node of the test");
        let job = h
            .get(&tenant.key, &format!("/v1/jobs/{}", replica["job_id"]))
            .await
            .expect(200, "a replica's job");
        for lease in live_leases(&job) {
            if lease["state"] != "running" {
                agent.event(&lease, "running").await.expect(200, "running");
            }
            if ready(replica["version"].as_i64().unwrap_or(0)) && replica["state"] != "ready" {
                let path = format!("/v1/agent/leases/{}/events", lease["id"]);
                agent
                    .signed(
                        "POST",
                        &path,
                        Some(&json!({"epoch": lease["epoch"], "state": "ready", "detail": "", "port": 8000})),
                    )
                    .await
                    .expect(200, "ready");
            }
        }
    }
    h.get(&tenant.key, &format!("/v1/services/{name}"))
        .await
        .expect(200, "the service")
}

fn states(view: &Value) -> Vec<(i64, String)> {
    let mut states: Vec<(i64, String)> = view["replica_states"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|replica| {
            (
                replica["version"].as_i64().unwrap_or(0),
                replica["state"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    states.sort();
    states
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_service_keeps_its_replicas_rolls_out_safely_and_scales_to_zero() {
    on_every_backend_with(
        |config| config.heartbeat_timeout_ms = 30_000,
        async |h: &Harness| {
            let tenant = h.tenant("acme").await;
            let provider = h.provider("gpu-farm").await;
            h.credit(&tenant, "500.00").await;
            let a = h.node(&provider, "a", |_| {}).await;
            let b = h.node(&provider, "b", |_| {}).await;
            let agents = [&a, &b];

            // Bad input.
            let mut bad = service("chat", 3, 2);
            h.post(&tenant.key, "/v1/services", bad.clone())
                .await
                .refused(400, "min above max");
            bad = service("-chat", 1, 1);
            h.post(&tenant.key, "/v1/services", bad)
                .await
                .refused(400, "a bad name");
            h.get(&tenant.key, "/v1/services/nothing")
                .await
                .refused(404, "no such service");

            let deployed = h
                .post(&tenant.key, "/v1/services", service("chat", 2, 3))
                .await
                .expect(201, "deployed");
            assert_eq!(deployed["deployed"]["version"], 1);
            h.post(&tenant.key, "/v1/services", service("chat", 2, 3))
                .await
                .refused(409, "a second service of the name");

            let ready_v1 = h
                .wait_for("two ready replicas of version 1", async || {
                    let view = tend(h, &tenant, &agents, "chat", |_| true).await;
                    (states(&view) == [(1, "ready".to_string()), (1, "ready".to_string())]).then_some(view)
                })
                .await;
            assert_eq!(ready_v1["replicas"].as_array().map(Vec::len), Some(2));
            let first_jobs: Vec<i64> = ready_v1["replica_states"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|replica| replica["job_id"].as_i64())
                .collect();

            // The escrow is renewed as the replicas run past their 4 s period: their jobs live on.
            let escrow_at = |job: &Value| job["escrow_micros"].as_i64().unwrap_or(0);
            let job_path = format!("/v1/jobs/{}", first_jobs[0]);
            let before = escrow_at(&h.get(&tenant.key, &job_path).await.expect(200, "job"));
            h.wait_for("a renewed escrow", async || {
                tend(h, &tenant, &agents, "chat", |_| true).await;
                let job = h.get(&tenant.key, &job_path).await.expect(200, "job");
                (escrow_at(&job) > before).then_some(())
            })
            .await;
            let started = std::time::Instant::now();
            while started.elapsed() < std::time::Duration::from_secs(7) {
                tend(h, &tenant, &agents, "chat", |_| true).await;
                tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            }
            let job = h.get(&tenant.key, &job_path).await.expect(200, "job");
            assert_eq!(job["state"], "running", "a service replica outlives its period: {job}");

            // A version whose replicas never become healthy: the roll-out stops after three,
            // one at a time, and version 1 serves on.
            let mut broken = service("chat", 2, 3);
            broken["replica"]["command"] = json!(["broken"]);
            let updated = h
                .put(&tenant.key, "/v1/services/chat", broken)
                .await
                .expect(200, "updated");
            assert_eq!(updated["deployed"]["version"], 2);
            let halted = h
                .wait_for("the roll-out of version 2 to stop", async || {
                    let view = tend(h, &tenant, &agents, "chat", |version| version == 1).await;
                    let v2 = states(&view).iter().filter(|(version, _)| *version == 2).count();
                    assert!(v2 <= 1, "one new replica at a time: {view}");
                    let ready_v1 = states(&view)
                        .iter()
                        .filter(|(version, state)| *version == 1 && state == "ready")
                        .count();
                    assert_eq!(ready_v1, 2, "the old replicas serve on: {view}");
                    let status = view["deployed"]["status"].as_str().unwrap_or("").to_string();
                    status.starts_with("roll-out of version 2 stopped").then_some(view)
                })
                .await;
            let status = halted["deployed"]["status"].as_str().unwrap_or("");
            assert!(
                status.contains("3 replicas of version 2 never became healthy"),
                "{status}"
            );
            assert!(status.contains("did not answer within 2 s"), "{status}");
            assert_eq!(halted["deployed"]["stable_version"], 1);

            // A good version 3 replaces them one by one, an old one ending only once a new one
            // is ready.
            let mut good = service("chat", 2, 3);
            good["replica"]["command"] = json!(["sleep", "3600"]);
            h.put(&tenant.key, "/v1/services/chat", good)
                .await
                .expect(200, "updated again");
            h.wait_for("version 3 everywhere", async || {
                let view = tend(h, &tenant, &agents, "chat", |_| true).await;
                let ready = states(&view).iter().filter(|(_, state)| state == "ready").count();
                assert!(ready >= 2 || states(&view).iter().any(|(v, _)| *v == 3), "{view}");
                (states(&view) == [(3, "ready".to_string()), (3, "ready".to_string())]
                    && view["deployed"]["stable_version"] == 3)
                    .then_some(())
            })
            .await;

            // Scale to zero when idle; a request wakes it.
            h.post(
                &tenant.key,
                "/v1/services/chat/scale",
                json!({"min_replicas": 0, "max_replicas": 2}),
            )
            .await
            .expect(200, "scaled");
            h.wait_for("no replica", async || {
                let view = tend(h, &tenant, &agents, "chat", |_| true).await;
                (view["replica_states"].as_array().is_some_and(Vec::is_empty)
                    && view["deployed"]["desired_replicas"] == 0)
                    .then_some(())
            })
            .await;
            let woken = h.call("GET", "/s/chat/v1/models", Some(&tenant.key), None).await;
            assert_eq!(
                woken.status, 503,
                "no replica came within the wake timeout: {:?}",
                woken.body
            );
            assert!(
                woken.error_message("the wake").contains("became ready within 1 s"),
                "{:?}",
                woken.body
            );
            h.wait_for("a replica woken by the request", async || {
                let view = tend(h, &tenant, &agents, "chat", |_| true).await;
                (states(&view) == [(3, "ready".to_string())]).then_some(())
            })
            .await;

            // A per-service key calls this service and nothing else.
            let key = h
                .post(&tenant.key, "/v1/services/chat/keys", json!({}))
                .await
                .expect(201, "a service key")["api_key"]
                .as_str()
                .expect("the key")
                .to_string();
            let through = h.call("GET", "/s/chat/v1/models", Some(&key), None).await;
            assert_eq!(
                through.status, 503,
                "taken; no tunnel reaches the test's replica: {:?}",
                through.body
            );
            // The service's root, with or without its slash, is the service's, not a 404.
            for root in ["/s/chat", "/s/chat/"] {
                let at_root = h.call("GET", root, Some(&key), None).await;
                assert_eq!(at_root.status, 503, "{root} is routed: {:?}", at_root.body);
            }
            let other = h.call("GET", "/s/other/v1/models", Some(&key), None).await;
            assert_eq!(other.status, 403, "{:?}", other.body);
            h.get(&key, "/v1/services")
                .await
                .refused(401, "a service key is not an API key");
            let key_id = key
                .trim_start_matches("fallow_")
                .split('_')
                .next()
                .expect("a key id")
                .to_string();
            h.call(
                "DELETE",
                &format!("/v1/services/chat/keys/{key_id}"),
                Some(&tenant.key),
                None,
            )
            .await
            .expect(204, "revoked");
            let revoked = h.call("GET", "/s/chat/v1/models", Some(&key), None).await;
            assert_eq!(revoked.status, 401, "{:?}", revoked.body);

            // Listed; then deleted: its replicas stop and the name is free.
            let list = h.get(&tenant.key, "/v1/services").await.expect(200, "list");
            assert_eq!(list["services"][0]["name"], "chat");
            let last = replicas(h, &tenant, "chat").await;
            h.call("DELETE", "/v1/services/chat", Some(&tenant.key), None)
                .await
                .expect(200, "deleted");
            h.get(&tenant.key, "/v1/services/chat").await.refused(404, "gone");
            let job = h
                .get(&tenant.key, &format!("/v1/jobs/{}", last[0]["job_id"]))
                .await
                .expect(200, "job");
            assert_eq!(job["state"], "cancelled", "{job}");
            let other = h.tenant("other").await;
            h.get(&other.key, "/v1/services").await.expect(200, "an empty list");
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_replica_without_bronze_capacity_goes_on_the_base_tier() {
    on_every_backend_with(
        |config| config.heartbeat_timeout_ms = 30_000,
        async |h: &Harness| {
            let tenant = h.tenant("acme").await;
            let provider = h.provider("gpu-farm").await;
            h.credit(&tenant, "500.00").await;
            // The only node sells no bronze.
            let node = h
                .node(&provider, "a", |registration| {
                    registration["policy"] = json!({"asks": {"gold": "3.00", "silver": "2.00"}});
                })
                .await;
            let mut burst = service("burst", 0, 2);
            burst["burst_tier"] = json!("bronze");
            burst["scale_up_after_s"] = json!(1);
            burst["scale_down_after_s"] = json!(600);
            h.post(&tenant.key, "/v1/services", burst).await.expect(201, "deployed");
            let first = h
                .wait_for("a bronze replica waiting", async || {
                    node.heartbeat().await;
                    let replicas = replicas(h, &tenant, "burst").await;
                    (replicas.len() == 1).then(|| replicas[0].clone())
                })
                .await;
            assert_eq!(
                (first["tier"].as_str(), first["state"].as_str()),
                (Some("bronze"), Some("queued"))
            );
            h.wait_for("the replica on silver", async || {
                let view = tend(h, &tenant, &[&node], "burst", |_| true).await;
                let replicas = view["replica_states"].as_array().cloned().unwrap_or_default();
                (replicas.len() == 1 && replicas[0]["tier"] == "silver" && replicas[0]["state"] == "ready")
                    .then_some(())
            })
            .await;
            let job = h
                .get(&tenant.key, &format!("/v1/jobs/{}", first["job_id"]))
                .await
                .expect(200, "the bronze job");
            assert_eq!(job["state"], "cancelled", "{job}");
            assert!(
                job["state_reason"]
                    .as_str()
                    .unwrap_or("")
                    .contains("no bronze capacity within 3 s"),
                "{job}"
            );
        },
    )
    .await;
}
