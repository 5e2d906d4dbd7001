//! An NVL72 rack through the API, on SQLite and on PostgreSQL: 18 GB200 nodes of 4 GPUs that
//! declare one NVLink domain take an 18-replica, 4-GPU gang under `topology: "nvlink"`
//! together, one replica each; a 19th replica makes the gang wait, and its explanation says
//! that it needs 76 GPUs in one domain where the largest has 72. Two cheaper nodes of another
//! domain in the same fabric are there to be passed over.

mod common;

use std::collections::BTreeSet;

use common::{Agent, Harness, job_request, live_leases, node_registration, on_every_backend};
use serde_json::{Value, json};
use trust::NodeKey;

/// A gang of `replicas` GB200 replicas of 4 GPUs each in one NVLink domain.
fn nvlink_gang(name: &str, replicas: u32) -> Value {
    let mut job = job_request(name);
    job["gpus"] = json!(4);
    job["gpu_models"] = json!(["GB200"]);
    job["replicas"] = json!(replicas);
    job["topology"] = json!("nvlink");
    job["max_price_per_gpu_hour"] = json!("6.00");
    job
}

async fn heartbeat_all(agents: &[Agent]) {
    for agent in agents {
        agent.heartbeat().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_nvl72_rack_takes_18_replicas_of_4_and_explains_a_19th() {
    on_every_backend(async |h: &Harness| {
        let tenant = h.tenant("acme").await;
        let provider = h.provider("rack-farm").await;
        h.credit(&tenant, "1000.00").await;
        let mut rack_1 = Vec::new();
        for index in 0..18 {
            rack_1.push(
                h.node(&provider, &format!("rack-1-{index:02}"), |registration| {
                    registration["gpu_model"] = json!("GB200");
                    registration["gpu_count"] = json!(4);
                    registration["nvlink_domain"] = json!("rack-1");
                    registration["policy"] = json!({"asks": {"gold": "5.00", "silver": "4.00", "bronze": "3.00"}});
                })
                .await,
            );
        }
        // Cheaper, in the same site and fabric, but another NVLink domain: a gang that looked
        // at price and fabric alone would take them first.
        let mut rack_2 = Vec::new();
        for index in 0..2 {
            rack_2.push(
                h.node(&provider, &format!("rack-2-{index:02}"), |registration| {
                    registration["gpu_model"] = json!("GB200");
                    registration["gpu_count"] = json!(4);
                    registration["nvlink_domain"] = json!("rack-2");
                    registration["policy"] = json!({"asks": {"gold": "3.00", "silver": "2.00", "bronze": "1.00"}});
                })
                .await,
            );
        }
        let agents: Vec<Agent> = rack_1.into_iter().chain(rack_2).collect();
        let rack_1_ids: BTreeSet<i64> = agents[..18].iter().map(|agent| agent.node_id).collect();

        // 19 replicas of 4: 76 GPUs in one domain, and the largest joins 72. On an idle fleet
        // it waits, and says why.
        let too_wide = nvlink_gang("nvl76", 19);
        let job = h.submit(&tenant, too_wide.clone()).await;
        let wide_id = job["id"].as_i64().expect("job id");
        let wide_path = format!("/v1/jobs/{wide_id}");
        let explained = "20 of 20 nodes; no NVLink domain holds all 19 replicas (the best holds 18); 19 replicas \
                         of 4 GPUs need 76 GPUs in one NVLink domain, and the largest has 72 (on 18 nodes)";
        // The reason is the leader's, from its last pass: one that ran before every node was
        // on line counted fewer replicas, so wait for a pass over the whole fleet.
        let waiting = "waiting: no NVLink domain can hold all 19 replicas now (the best holds 18)";
        let view = h
            .wait_for(
                &format!("{}: job {wide_id} explained as waiting", h.backend),
                async || {
                    heartbeat_all(&agents).await;
                    let view = h.get(&tenant.key, &wide_path).await.expect(200, "tenant reads its job");
                    (view["explanation"] == explained && view["state_reason"] == waiting).then_some(view)
                },
            )
            .await;
        assert_eq!(view["state"], "queued", "{}: {view}", h.backend);
        assert!(live_leases(&view).is_empty(), "{}: {view}", h.backend);
        let quote = h
            .post(&tenant.key, "/v1/jobs/quote", too_wide)
            .await
            .expect(200, "the quote of the 19-replica gang");
        assert_eq!(
            quote["price_micros_per_gpu_hour"],
            Value::Null,
            "{}: {quote}",
            h.backend
        );
        assert_eq!(quote["explanation"], explained, "{}: {quote}", h.backend);
        h.post(&tenant.key, &format!("{wide_path}/cancel"), json!({}))
            .await
            .expect(200, "tenant cancels the 19-replica gang");

        // 18 replicas of 4: the whole rack, one replica of 4 GPUs on each of its nodes, and
        // nothing on the cheaper rack beside it.
        let job = h.submit(&tenant, nvlink_gang("nvl72", 18)).await;
        let rack_id = job["id"].as_i64().expect("job id");
        let rack_path = format!("/v1/jobs/{rack_id}");
        let view = h
            .wait_for(
                &format!("{}: job {rack_id} placed on the rack", h.backend),
                async || {
                    heartbeat_all(&agents).await;
                    let view = h.get(&tenant.key, &rack_path).await.expect(200, "tenant reads its job");
                    // Both: the job's row and its leases are separate reads, so a view read
                    // while the placement commits can show its leases beside "queued".
                    (view["state"] == "running" && live_leases(&view).len() == 18).then_some(view)
                },
            )
            .await;
        let leases = live_leases(&view);
        let nodes: BTreeSet<i64> = leases
            .iter()
            .map(|lease| lease["node_id"].as_i64().expect("node id"))
            .collect();
        assert_eq!(
            nodes, rack_1_ids,
            "{}: one lease on every rack-1 node: {view}",
            h.backend
        );
        let replicas: BTreeSet<i64> = leases
            .iter()
            .map(|lease| lease["replica"].as_i64().expect("replica"))
            .collect();
        assert_eq!(replicas, (0..18).collect(), "{}: {view}", h.backend);
        for lease in &leases {
            let gpus: BTreeSet<i64> = lease["gpu_indices"]
                .as_array()
                .expect("gpu indices")
                .iter()
                .map(|gpu| gpu.as_i64().expect("a GPU index"))
                .collect();
            assert_eq!(gpus, (0..4).collect(), "{}: all 4 GPUs of its node: {lease}", h.backend);
            assert_eq!(lease["gpu_milli"], 1000, "{}: {lease}", h.backend);
            assert_eq!(lease["gpu_model"], "GB200", "{}: {lease}", h.backend);
        }
    })
    .await;
}

/// A rack's registration in one batch: `count` nodes of 4 GB200 GPUs, fresh keys.
fn rack_batch(rack: &str, count: usize) -> Vec<Value> {
    (0..count)
        .map(|index| {
            let mut registration = node_registration(&NodeKey::generate(), &format!("{rack}-{index:02}"));
            registration["gpu_model"] = json!("GB200");
            registration["gpu_count"] = json!(4);
            registration["nvlink_domain"] = json!(rack);
            registration
        })
        .collect()
}

async fn node_names(h: &Harness, provider: &common::Account) -> BTreeSet<String> {
    let nodes = h
        .get(&provider.key, "/v1/nodes")
        .await
        .expect(200, "provider lists its nodes");
    nodes
        .as_array()
        .expect("a list")
        .iter()
        .map(|node| node["name"].as_str().expect("name").to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rack_registers_in_one_batch_all_or_none() {
    on_every_backend(async |h: &Harness| {
        let provider = h.provider("rack-batch").await;
        let tenant = h.tenant("rack-batch-tenant").await;

        let rack = rack_batch("rack-9", 18);
        let registered = h
            .post(&provider.key, "/v1/nodes/batch", json!({"nodes": rack}))
            .await
            .expect(201, "provider registers a rack in one batch");
        let nodes = registered["nodes"].as_array().expect("nodes");
        assert_eq!(nodes.len(), 18, "{}: every node of the batch", h.backend);
        for (index, node) in nodes.iter().enumerate() {
            assert_eq!(
                node["name"],
                json!(format!("rack-9-{index:02}")),
                "{}: in the order given",
                h.backend
            );
            assert_eq!(node["nvlink_domain"], json!("rack-9"));
        }
        let ids: BTreeSet<i64> = nodes.iter().map(|node| node["id"].as_i64().expect("id")).collect();
        assert_eq!(ids.len(), 18, "{}: eighteen distinct ids", h.backend);
        let before = node_names(h, &provider).await;
        assert_eq!(before.len(), 18);

        // One bad node refuses the whole batch, and the error says which.
        let mut bad = rack_batch("rack-10", 3);
        bad[1]["gpu_count"] = json!(17);
        let message = h
            .post(&provider.key, "/v1/nodes/batch", json!({"nodes": bad}))
            .await
            .refused(400, "a batch with a bad node");
        assert!(message.starts_with("nodes[1]: gpu_count"), "{}: {message}", h.backend);

        // A name already registered: the store refuses it inside the transaction, and the
        // nodes before it in the batch are not kept either.
        let mut clash = rack_batch("rack-11", 3);
        clash[2]["name"] = json!("rack-9-05");
        let reply = h.post(&provider.key, "/v1/nodes/batch", json!({"nodes": clash})).await;
        assert_eq!(reply.status, 409, "{}: {}", h.backend, reply.text);

        // Two nodes of one batch with one name.
        let mut twins = rack_batch("rack-12", 2);
        twins[1]["name"] = twins[0]["name"].clone();
        let message = h
            .post(&provider.key, "/v1/nodes/batch", json!({"nodes": twins}))
            .await
            .refused(409, "two nodes of a batch with one name");
        assert!(
            message.contains("nodes[1]") && message.contains("nodes[0]"),
            "{}: {message}",
            h.backend
        );

        // NVML's fabric is checked between the nodes of one batch, as against registered ones.
        let mut split = rack_batch("rack-13", 2);
        split[0]["nvlink_detected"] = json!("nvl-aaaa-1");
        split[1]["nvlink_detected"] = json!("nvl-bbbb-1");
        let message = h
            .post(&provider.key, "/v1/nodes/batch", json!({"nodes": split}))
            .await
            .refused(400, "a batch whose domain NVML splits");
        assert!(
            message.starts_with("nodes[1]: nvlink_domain") && message.contains("rack-13-00"),
            "{}: {message}",
            h.backend
        );

        let message = h
            .post(&provider.key, "/v1/nodes/batch", json!({"nodes": []}))
            .await
            .refused(400, "an empty batch");
        assert!(message.contains("1–1000"), "{}: {message}", h.backend);
        let reply = h
            .post(
                &tenant.key,
                "/v1/nodes/batch",
                json!({"nodes": rack_batch("rack-14", 1)}),
            )
            .await;
        assert_eq!(
            reply.status, 403,
            "{}: a tenant registers no nodes: {}",
            h.backend, reply.text
        );

        assert_eq!(
            node_names(h, &provider).await,
            before,
            "{}: no refused batch left a node behind",
            h.backend
        );
    })
    .await;
}
