//! The leader's decisions on a `ManualClock`: the coordinator's time is the test's, so a node's
//! silence and its consequences are decided at the times the test sets, with no waiting and no
//! process-wide clock offset.

mod common;

use std::collections::HashMap;

/// A node that stops beating loses its leases exactly when the leader's clock passes the
/// heartbeat timeout, not before, however long the test really takes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_node_loses_its_leases_when_the_leaders_clock_passes_the_timeout() {
    common::on_every_backend_on(
        true,
        |config| config.reconcile = false,
        async |h| {
            let clock = h.clock.as_ref().expect("a manual clock");
            let provider = h.provider("clock-provider").await;
            let agent = h.node(&provider, "clock-node", |_| {}).await;
            agent.heartbeat().await;
            let tenant = h.tenant("clock-tenant").await;
            h.credit(&tenant, "100").await;
            let job = h.submit(&tenant, common::job_request("clock-job")).await;
            let id = job["id"].as_i64().expect("job id");
            let state = &h.running.state;
            let (_lock, mut cursor) = h.take_lead().await;
            let mut reasons = HashMap::new();
            let mut pass = async |what: &str| {
                server::reconcile::pass(state, &mut cursor, &mut reasons)
                    .await
                    .unwrap_or_else(|error| panic!("{what}: the pass fails: {error}"));
                h.get(&tenant.key, &format!("/v1/jobs/{id}")).await.expect(200, what)
            };
            let placed = pass("placing").await;
            assert_eq!(placed["state"], "running", "{placed}");
            assert_eq!(placed["leases"][0]["state"], "pending", "{placed}");

            let timeout_us = state.config.heartbeat_timeout_us();
            clock.advance(timeout_us - 1_000_000);
            let before = pass("a second before the timeout").await;
            assert_eq!(before["leases"][0]["state"], "pending", "not silent yet: {before}");

            clock.advance(2_000_000);
            let after = pass("a second past the timeout").await;
            assert_eq!(after["leases"][0]["state"], "lost", "{after}");
            assert_eq!(after["state"], "queued", "{after}");
            let node = h.get(&provider.key, &format!("/v1/nodes/{}", agent.node_id)).await;
            let node = node.expect(200, "the node");
            assert_eq!(node["online"], false, "{node}");
        },
    )
    .await;
}
