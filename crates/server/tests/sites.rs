//! Sites through the API, on SQLite and on PostgreSQL: an admin sets a site's coordinates once;
//! nodes there that declared none take them (at registration and later), nodes that declared
//! their own keep them, `node show` says where each node's came from, and the matcher places by
//! the new coordinates (a job near its users moves to the node that was nowhere before).

mod common;

use common::{Harness, job_request, on_every_backend};
use serde_json::{Value, json};

/// The node a job's single live lease is on, once it has one.
async fn placed_on(h: &Harness, key: &str, job_id: i64, agents: &[&common::Agent]) -> i64 {
    let path = format!("/v1/jobs/{job_id}");
    h.wait_for(&format!("job {job_id} to be placed"), async || {
        for agent in agents {
            agent.heartbeat().await;
        }
        let view = h.get(key, &path).await.expect(200, "job");
        view["leases"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|lease| ["pending", "staging", "running"].contains(&lease["state"].as_str().unwrap_or("")))
            .and_then(|lease| lease["node_id"].as_i64())
    })
    .await
}

/// One GPU for users in Stockholm who want a round trip under 10 ms.
fn near_stockholm(name: &str) -> Value {
    let mut job = job_request(name);
    job["client"] = json!({"latitude": 59.33, "longitude": 18.06, "latency_target_ms": 10});
    job
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sites_coordinates_reach_its_nodes_that_declared_none() {
    on_every_backend(async |h: &Harness| {
        let tenant = h.tenant("acme").await;
        let provider = h.provider("basement").await;
        h.credit(&tenant, "100.00").await;
        let site = common::unique("sto");
        // Registered first (the lower id wins a tie), at a site with no coordinates yet.
        let undeclared = h
            .node(&provider, "sto-a", |registration| {
                registration["site"] = json!(site);
                registration["latitude"] = json!(0.0);
                registration["longitude"] = json!(0.0);
            })
            .await;
        // Same site, its own coordinates (declared beats the site's).
        let declared = h
            .node(&provider, "sto-b", |registration| {
                registration["site"] = json!(site);
                registration["fabric"] = json!("sto-ib1");
                registration["latitude"] = json!(10.0);
                registration["longitude"] = json!(20.0);
            })
            .await;
        // Amsterdam (the default registration), as cheap as the others.
        let amsterdam = h.node(&provider, "ams-a", |_| {}).await;
        let node_path = |agent: &common::Agent| format!("/v1/nodes/{}", agent.node_id);
        let shown = h.get(&provider.key, &node_path(&undeclared)).await.expect(200, "node");
        assert_eq!(
            (shown["latitude"].as_f64(), shown["location_source"].as_str()),
            (Some(0.0), Some("")),
            "{}: no coordinates yet: {shown}",
            h.backend
        );

        // Users in Stockholm: Amsterdam is nearer than a node at (0, 0).
        let agents = [&undeclared, &declared, &amsterdam];
        let first = h.submit(&tenant, near_stockholm("before")).await["id"]
            .as_i64()
            .expect("job id");
        assert_eq!(
            placed_on(h, &tenant.key, first, &agents).await,
            amsterdam.node_id,
            "{}: before its site has coordinates, the node at (0, 0) is the farthest",
            h.backend
        );
        h.post(&tenant.key, &format!("/v1/jobs/{first}/cancel"), json!({}))
            .await
            .expect(200, "cancel");

        // Only an admin sets a site, with coordinates on the globe.
        let path = format!("/v1/sites/{site}");
        let body = json!({"latitude": 59.33, "longitude": 18.06});
        h.put(&provider.key, &path, body.clone())
            .await
            .expect(403, "a provider sets a site");
        h.put(&h.admin, &path, json!({"latitude": 91.0, "longitude": 0.0}))
            .await
            .expect(400, "a latitude past the pole");
        let set = h.put(&h.admin, &path, body).await.expect(200, "admin sets the site");
        assert_eq!(set["nodes"], 1, "{}: one node there declared none: {set}", h.backend);

        let shown = h.get(&provider.key, &node_path(&undeclared)).await.expect(200, "node");
        assert_eq!(
            (
                shown["latitude"].as_f64(),
                shown["longitude"].as_f64(),
                shown["location_source"].as_str()
            ),
            (Some(59.33), Some(18.06), Some("site")),
            "{}: {shown}",
            h.backend
        );
        let shown = h.get(&provider.key, &node_path(&declared)).await.expect(200, "node");
        assert_eq!(
            (shown["latitude"].as_f64(), shown["location_source"].as_str()),
            (Some(10.0), Some("flag")),
            "{}: declared coordinates are kept: {shown}",
            h.backend
        );
        // A node that joins the site later takes its coordinates at registration.
        let later = h
            .node(&provider, "sto-c", |registration| {
                registration["site"] = json!(site);
                registration["fabric"] = json!("sto-ib2");
                registration["latitude"] = json!(0.0);
                registration["longitude"] = json!(0.0);
            })
            .await;
        let shown = h.get(&provider.key, &node_path(&later)).await.expect(200, "node");
        assert_eq!(
            (shown["latitude"].as_f64(), shown["location_source"].as_str()),
            (Some(59.33), Some("site")),
            "{}: {shown}",
            h.backend
        );
        let sites = h.get(&tenant.key, "/v1/sites").await.expect(200, "sites");
        let listed = sites
            .as_array()
            .into_iter()
            .flatten()
            .find(|listed| listed["name"] == json!(site))
            .cloned()
            .unwrap_or(Value::Null);
        assert_eq!(listed["nodes"], 2, "{}: {sites}", h.backend);

        // The matcher sees the site where it is now.
        let agents = [&undeclared, &declared, &amsterdam, &later];
        let second = h.submit(&tenant, near_stockholm("after")).await["id"]
            .as_i64()
            .expect("job id");
        let node = placed_on(h, &tenant.key, second, &agents).await;
        assert!(
            [undeclared.node_id, later.node_id].contains(&node),
            "{}: users in Stockholm are served from the Stockholm site now, not node {node}",
            h.backend
        );
    })
    .await;
}
