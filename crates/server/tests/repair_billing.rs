//! A repair's idle seconds, on SQLite and on PostgreSQL: a gang that keeps its survivors
//! running through a repair (`gang_repair: keep`) and asked not to pay for the wait
//! (`repair_billing: pause`) is billed nothing for the survivor's usage from the repair until
//! every replica of the new epoch is staged, and the full price before and after.

mod common;

use common::{Agent, Harness, job_request, live_leases, now_ms, on_every_backend_with};
use serde_json::{Value, json};

/// A staged event with the port the agent reserved.
async fn stage(agent: &Agent, lease: &Value, port: u16) {
    let path = format!("/v1/agent/leases/{}/events", lease["id"]);
    agent
        .signed(
            "POST",
            &path,
            Some(&json!({"epoch": lease["epoch"], "state": "staged", "detail": "staged", "port": port})),
        )
        .await
        .expect(200, "staged");
}

/// A signed usage record of one whole GPU for the second from `start_ms`; the micros charged.
async fn charge(agent: &Agent, lease: &Value, sequence: i64, start_ms: i64) -> i64 {
    let signed = agent.usage_at(lease, sequence, start_ms, 1000);
    let accepted = agent
        .signed("POST", "/v1/agent/usage", Some(&signed))
        .await
        .expect(200, "usage accepted");
    accepted["charged_micros"].as_i64().expect("charged_micros")
}

/// Waits until the wall clock is past `at_ms`, the nodes beating meanwhile (a silent one is lost).
async fn wait_past(at_ms: i64, agents: &[&Agent]) {
    while now_ms() <= at_ms + 50 {
        for agent in agents {
            agent.heartbeat().await;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paused_repair_bills_the_survivor_nothing_until_the_gang_is_staged() {
    on_every_backend_with(
        |config| config.heartbeat_timeout_ms = 1500,
        async |h: &Harness| {
            let tenant = h.tenant("acme").await;
            let provider = h.provider("gpu-farm").await;
            h.credit(&tenant, "500.00").await;
            let survivor = h.node(&provider, "a", |_| {}).await;
            let doomed = h.node(&provider, "b", |_| {}).await;
            let mut gang = job_request("gang");
            gang["gpus"] = json!(8);
            gang["replicas"] = json!(2);
            gang["topology"] = json!("fabric");
            gang["gang_repair"] = json!("keep");
            gang["repair_billing"] = json!("pause");
            let job_id = h.submit(&tenant, gang).await["id"].as_i64().expect("job id");
            let path = format!("/v1/jobs/{job_id}");
            let placed = h
                .wait_for("the gang to run on both nodes", async || {
                    survivor.heartbeat().await;
                    doomed.heartbeat().await;
                    let view = h.get(&tenant.key, &path).await.expect(200, "job");
                    (live_leases(&view).len() == 2).then_some(view)
                })
                .await;
            let mine = |view: &Value, agent: &Agent| {
                live_leases(view)
                    .into_iter()
                    .find(|lease| lease["node_id"] == agent.node_id)
                    .expect("a replica on the node")
            };
            let kept = mine(&placed, &survivor);
            stage(&survivor, &kept, 29500).await;
            stage(&doomed, &mine(&placed, &doomed), 29500).await;

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
                        .any(|lease| lease["node_id"] == spare.node_id)
                        .then_some(view)
                })
                .await;
            let replacement = mine(&repaired, &spare);
            let kept_now = mine(&repaired, &survivor);
            assert_eq!(
                (kept_now["id"].clone(), kept_now["epoch"].clone()),
                (kept["id"].clone(), kept["epoch"].clone()),
                "{}: keep leaves the survivor running at its epoch",
                h.backend
            );
            let repaired_ms = replacement["created_at_us"].as_i64().expect("created_at_us") / 1000;

            // Before the repair: the full price.
            let before = charge(&survivor, &kept, 1, repaired_ms - 1300).await;
            assert!(before > 0, "{}: a second before the repair is billed", h.backend);
            // Between the repair and the barrier: nothing.
            wait_past(repaired_ms + 1000, &[&survivor, &spare]).await;
            let during = charge(&survivor, &kept, 2, repaired_ms).await;
            assert_eq!(during, 0, "{}: the survivor waits for its peer, unbilled", h.backend);
            // The replacement staged: the gang is whole again, and billed again.
            stage(&spare, &replacement, 29501).await;
            let assembled_ms = now_ms();
            wait_past(assembled_ms + 1100, &[&survivor, &spare]).await;
            let after = charge(&survivor, &kept, 3, assembled_ms + 100).await;
            assert_eq!(
                after, before,
                "{}: a second after the barrier costs a full second",
                h.backend
            );
        },
    )
    .await;
}
