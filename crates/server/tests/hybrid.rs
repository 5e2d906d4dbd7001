//! Hybrid, on both backends: a tenant links a provider account of its own organisation (its key
//! proves it); its jobs go to that account's nodes first, at no market price and with nothing
//! held, whatever their asks; what does not fit there goes to the market under the job's cap;
//! the own nodes still sell their idle time to others; `job show` says which happened; a team
//! with no credit runs on its own nodes all the same.

mod common;

use serde_json::{Value, json};

fn eight_h100(name: &str, max_price: &str) -> Value {
    let mut job = common::job_request(name);
    job["gpus"] = json!(8);
    job["max_price_per_gpu_hour"] = json!(max_price);
    job["max_runtime_s"] = json!(3600);
    job
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_nodes_first_at_no_price_then_the_market_and_the_own_nodes_sell_their_idle_time() {
    common::on_every_backend_with(
        |config| config.reconcile = false,
        async |h| {
            let own = h.provider("lab-cluster").await;
            let market = h.provider("market-farm").await;
            // The lab's node asks more than the tenant would pay on the market: its own work goes
            // there anyway, at no price.
            let lab = h
                .node(&own, "lab-node", |node| {
                    node["policy"]["asks"] = json!({"gold": "9.00", "silver": "9.00", "bronze": "9.00"});
                })
                .await;
            let farm = h.node(&market, "farm-node", |_| {}).await;
            lab.heartbeat().await;
            farm.heartbeat().await;
            h.wait_online(&[&lab, &farm]).await;
            let tenant = h.tenant("lab").await;
            let other = h.tenant("someone-else").await;
            h.credit(&tenant, "1000").await;
            h.credit(&other, "1000").await;

            // A key that is not a provider's proves nothing.
            h.post(&tenant.key, "/v1/own-providers", json!({"provider_key": other.key}))
                .await
                .refused(404, "a tenant's key");
            h.post(
                &tenant.key,
                "/v1/own-providers",
                json!({"provider_key": "fk_nothing.nothing"}),
            )
            .await
            .refused(404, "no key at all");
            let linked = h
                .post(&tenant.key, "/v1/own-providers", json!({"provider_key": own.key}))
                .await
                .expect(201, "the lab links its own provider account");
            assert_eq!(linked["providers"][0]["provider_id"], own.id, "{linked}");
            assert_eq!(linked["providers"][0]["nodes"], 1, "{linked}");
            assert_eq!(linked["providers"][0]["gpus"], 8, "{linked}");

            let mut leader = h.lead().await;
            leader.pass(h, "building the view").await;
            // A quote counts the lab's own node, whose asks are over the cap, apart: the job
            // would run there at no price. Another tenant has no own nodes to count.
            let quote = async |key: &str| {
                h.post(key, "/v1/jobs/quote", eight_h100("quoted", "5"))
                    .await
                    .expect(200, "a quote")
            };
            let quoted = quote(&tenant.key).await;
            assert_eq!(quoted["nodes_feasible"], 1, "the farm alone under the cap: {quoted}");
            assert_eq!(quoted["own_nodes_feasible"], 1, "{quoted}");
            let theirs = quote(&other.key).await;
            assert!(theirs.get("own_nodes_feasible").is_none(), "{theirs}");
            let show = async |key: &str, job: &Value| {
                h.get(key, &format!("/v1/jobs/{}", job["id"]))
                    .await
                    .expect(200, "a job")
            };

            // First job: the lab's own node, unpriced, nothing held.
            let first = h.submit(&tenant, eight_h100("first", "5")).await;
            leader.pass(h, "placing the first job").await;
            let first_view = show(&tenant.key, &first).await;
            assert_eq!(first_view["state"], "running", "{first_view}");
            assert_eq!(first_view["leases"][0]["node_id"], lab.node_id, "{first_view}");
            assert_eq!(first_view["leases"][0]["price_micros_per_gpu_hour"], 0, "{first_view}");
            assert_eq!(first_view["escrow_micros"], 0, "{first_view}");
            assert_eq!(first_view["capacity"], "own", "{first_view}");

            let quoted = quote(&tenant.key).await;
            assert_eq!(quoted["own_nodes_feasible"], 0, "the own node is full: {quoted}");

            // Second: the own node is full, so the market, under the cap, with its hold.
            let second = h.submit(&tenant, eight_h100("second", "5")).await;
            leader.pass(h, "placing the second job").await;
            let second_view = show(&tenant.key, &second).await;
            assert_eq!(second_view["leases"][0]["node_id"], farm.node_id, "{second_view}");
            let price = second_view["leases"][0]["price_micros_per_gpu_hour"]
                .as_i64()
                .unwrap_or(0);
            assert!(price > 0 && price <= 5_000_000, "{second_view}");
            assert!(second_view["escrow_micros"].as_i64().unwrap_or(0) > 0, "{second_view}");
            assert_eq!(second_view["capacity"], "market", "{second_view}");

            // The own node idle again: another tenant buys its time at its ask.
            h.post(&tenant.key, &format!("/v1/jobs/{}/cancel", first["id"]), json!({}))
                .await
                .expect(200, "the first job cancelled");
            leader.pass(h, "freeing the own node").await;
            let theirs = h.submit(&other, eight_h100("theirs", "10")).await;
            leader.pass(h, "placing another tenant's job").await;
            let theirs_view = show(&other.key, &theirs).await;
            assert_eq!(theirs_view["leases"][0]["node_id"], lab.node_id, "{theirs_view}");
            assert_eq!(
                theirs_view["leases"][0]["price_micros_per_gpu_hour"], 9_000_000,
                "{theirs_view}"
            );
            assert_eq!(theirs_view["capacity"], "market", "{theirs_view}");

            // Unlinked, the lab's node is the market's to the lab too.
            let unlinked = h
                .call(
                    "DELETE",
                    &format!("/v1/own-providers/{}", own.id),
                    Some(&tenant.key),
                    None,
                )
                .await
                .expect(200, "unlinked");
            assert_eq!(unlinked["providers"], json!([]), "{unlinked}");
            h.call(
                "DELETE",
                &format!("/v1/own-providers/{}", own.id),
                Some(&tenant.key),
                None,
            )
            .await
            .refused(404, "unlinked twice");

            // A team with no credit at all runs on its own nodes: nothing to pay.
            let unfunded = h.tenant("lab-unfunded").await;
            h.post(&unfunded.key, "/v1/jobs", eight_h100("refused", "5"))
                .await
                .refused(402, "no credit and no nodes of its own");
            h.post(&unfunded.key, "/v1/own-providers", json!({"provider_key": own.key}))
                .await
                .expect(201, "it links the lab's provider account");
            h.post(&other.key, &format!("/v1/jobs/{}/cancel", theirs["id"]), json!({}))
                .await
                .expect(200, "the other tenant's job cancelled");
            leader.pass(h, "freeing the own node again").await;
            let free = h.submit(&unfunded, eight_h100("free", "5")).await;
            leader.pass(h, "placing the unfunded team's job").await;
            let free_view = show(&unfunded.key, &free).await;
            assert_eq!(free_view["state"], "running", "{free_view}");
            assert_eq!(free_view["leases"][0]["node_id"], lab.node_id, "{free_view}");
            assert_eq!(free_view["capacity"], "own", "{free_view}");
        },
    )
    .await;
}
