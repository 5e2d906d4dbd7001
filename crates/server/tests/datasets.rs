//! Datasets staged ahead (`POST /v1/datasets/warm`) on both backends: the likeliest nodes for
//! a job's shape are asked through their heartbeats' answers until they say they hold it, and
//! `job quote` counts the nodes that do.

mod common;

use common::{Harness, job_request, on_every_backend};
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dataset_is_staged_ahead_on_the_likeliest_nodes_through_their_heartbeats() {
    on_every_backend(async |h: &Harness| {
        let tenant = h.tenant("acme").await;
        let provider = h.provider("gpu-farm").await;
        let asking = |silver: &'static str| {
            move |node: &mut Value| node["policy"]["asks"] = json!({"gold": "3.00", "silver": silver, "bronze": "0.50"})
        };
        let cheap = h.node(&provider, "cheap", asking("1.00")).await;
        let middle = h.node(&provider, "middle", asking("1.50")).await;
        let dear = h.node(&provider, "dear", asking("2.40")).await;
        for agent in [&cheap, &middle, &dear] {
            agent.heartbeat().await;
        }
        h.wait_for("three nodes that fit", async || {
            let quote = h
                .post(&tenant.key, "/v1/jobs/quote", job_request("shape"))
                .await
                .expect(200, "quote");
            (quote["nodes_feasible"] == 3).then_some(())
        })
        .await;
        let digest = format!("blake3:{}", "ab".repeat(32));
        let dataset = json!({"url": "https://data.example.com/corpus.tar", "digest": digest, "size_bytes": 1_000_000});
        let key = tenant.key.clone();
        let warm = async |nodes: u32| {
            let body = json!({"dataset": dataset, "job": job_request("shape"), "nodes": nodes});
            h.post(&key, "/v1/datasets/warm", body).await
        };
        let warmed = warm(2).await.expect(200, "warm");
        assert_eq!(
            warmed["nodes"],
            json!([cheap.node_id, middle.node_id]),
            "{}: the cheapest two",
            h.backend
        );
        assert_eq!(
            (&warmed["holding"], &warmed["explanation"]),
            (&json!(0), &json!("")),
            "{}",
            h.backend
        );

        // Their heartbeats' answers ask them to stage it, until they say they hold it.
        let beat = async |agent: &common::Agent, held: &[&str]| -> Value {
            agent
                .signed("POST", "/v1/agent/heartbeat", Some(&json!({"datasets": held})))
                .await
                .expect(200, "heartbeat")
        };
        for agent in [&cheap, &middle] {
            let answer = beat(agent, &[]).await;
            assert_eq!(answer["prefetch"], json!([dataset]), "{}: {answer}", h.backend);
        }
        assert!(
            beat(&dear, &[]).await.get("prefetch").is_none(),
            "{}: not the likeliest",
            h.backend
        );
        let answer = beat(&cheap, &[digest.as_str()]).await;
        assert!(answer.get("prefetch").is_none(), "{}: held now: {answer}", h.backend);

        // A quote counts the node that holds it; the likeliest nodes now start with it.
        let mut with_data = job_request("shape");
        with_data["datasets"] = json!([dataset]);
        h.wait_for("the quote to count the node holding the dataset", async || {
            let quote = h
                .post(&tenant.key, "/v1/jobs/quote", with_data.clone())
                .await
                .expect(200, "quote");
            (quote["nodes_with_data"] == 1).then_some(())
        })
        .await;
        let again = warm(2).await.expect(200, "warm again");
        assert_eq!(
            (&again["nodes"][0], &again["holding"]),
            (&json!(cheap.node_id), &json!(1)),
            "{}",
            h.backend
        );

        // More nodes than fit: those that do, and why not more.
        let all = warm(64).await.expect(200, "warm 64");
        assert_eq!(all["nodes"].as_array().map(Vec::len), Some(3), "{}: {all}", h.backend);
        assert!(
            all["explanation"]
                .as_str()
                .is_some_and(|why| why.starts_with("3 of 64 nodes fit now")),
            "{all}"
        );
        warm(0).await.refused(400, "no nodes");
        h.post(
            &provider.key,
            "/v1/datasets/warm",
            json!({"dataset": dataset, "job": job_request("x"), "nodes": 1}),
        )
        .await
        .refused(403, "a provider warms nothing");
    })
    .await;
}
