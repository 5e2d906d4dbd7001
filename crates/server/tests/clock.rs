//! The leader's decisions on a `ManualClock`: the coordinator's time is the test's, so a node's
//! silence and its consequences are decided at the times the test sets, with no waiting and no
//! process-wide clock offset.

mod common;

use common::{Account, Agent, Harness};

/// A provider with one node on line, and a tenant with credit and a job submitted (not placed:
/// the test's own passes place it): `NAME-provider`, `NAME-node`, `NAME-tenant`, `NAME-job`.
async fn one_node_and_a_job(h: &Harness, name: &str) -> (Account, Agent, Account, i64) {
    let provider = h.provider(&format!("{name}-provider")).await;
    let agent = h.node(&provider, &format!("{name}-node"), |_| {}).await;
    agent.heartbeat().await;
    let tenant = h.tenant(&format!("{name}-tenant")).await;
    h.credit(&tenant, "100").await;
    let job = h.submit(&tenant, common::job_request(&format!("{name}-job"))).await;
    let id = job["id"].as_i64().expect("job id");
    (provider, agent, tenant, id)
}

/// A node that stops beating loses its leases exactly when the leader's clock passes the
/// heartbeat timeout, not before, however long the test really takes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_node_loses_its_leases_when_the_leaders_clock_passes_the_timeout() {
    common::on_every_backend_on(
        true,
        |config| config.reconcile = false,
        async |h| {
            let clock = h.clock.as_ref().expect("a manual clock");
            let (provider, agent, tenant, id) = one_node_and_a_job(h, "clock").await;
            let state = &h.running.state;
            let mut leader = h.lead().await;
            let mut pass = async |what: &str| {
                leader.pass(h, what).await;
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

/// A replica's output archive the coordinator keeps is served until its retention is over by
/// the leader's clock, then removed: its digest and size stay on the job, marked expired, and
/// asking for it says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_output_archive_is_removed_when_its_retention_is_over() {
    common::on_every_backend_on(
        true,
        |config| {
            config.reconcile = false;
            config.output_retention_days = 2;
        },
        async |h| {
            let clock = h.clock.as_ref().expect("a manual clock");
            let (_, agent, tenant, id) = one_node_and_a_job(h, "keep").await;
            let mut leader = h.lead().await;
            leader.pass(h, "placing").await;
            let view = h
                .get(&tenant.key, &format!("/v1/jobs/{id}"))
                .await
                .expect(200, "the job");
            let lease = &view["leases"][0];
            // "results\n", as the agent sends a kept archive: base64 in its signed request.
            let upload = serde_json::json!({"epoch": lease["epoch"], "archive_base64": "cmVzdWx0cwo="});
            agent
                .signed(
                    "POST",
                    &format!("/v1/agent/leases/{}/output", lease["id"]),
                    Some(&upload),
                )
                .await
                .expect(200, "the archive kept");
            let path = format!("/v1/jobs/{id}/output");
            let served = h.get(&tenant.key, &path).await;
            assert_eq!((served.status, served.text.as_str()), (200, "results\n"));

            let retention_us = 2 * 86_400_000_000;
            clock.advance(retention_us - 3_600_000_000);
            leader.pass(h, "an hour before the end of its retention").await;
            assert_eq!(h.get(&tenant.key, &path).await.status, 200, "still kept");

            clock.advance(2 * 3_600_000_000);
            leader.pass(h, "an hour after").await;
            let why = h.get(&tenant.key, &path).await.refused(404, "removed");
            assert!(why.contains("retention (2 days)"), "{why}");
            let view = h
                .get(&tenant.key, &format!("/v1/jobs/{id}"))
                .await
                .expect(200, "the job");
            let output = &view["leases"][0]["output"];
            assert_eq!(output["kept"], false, "{view}");
            assert_eq!(output["size_bytes"], 8, "{view}");
            assert!(output["expired_at_us"].is_i64(), "{view}");
        },
    )
    .await;
}
