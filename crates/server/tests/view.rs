//! The leader's view of the fleet while nodes register: when it is built from the whole store,
//! and when it grows by the new nodes' rows alone (docs/decisions.md, "New nodes and the view's
//! rebuild"). On SQLite and on PostgreSQL.

mod common;

use common::{Account, Harness, job_request, on_every_backend_with};
use serde_json::{Value, json};

fn id(value: &Value) -> i64 {
    value.as_i64().unwrap_or_else(|| panic!("{value} is not an integer"))
}

/// The view's builds so far, and how many of them grew it by new nodes alone.
async fn builds(h: &Harness) -> (f64, f64) {
    (
        h.metric("fallow_view_rebuilds_total").await,
        h.metric("fallow_view_grows_total").await,
    )
}

/// Whether the tenant's view of a job lists a lease on `node_id`.
fn leased_on(view: &Value, node_id: i64) -> bool {
    view["leases"]
        .as_array()
        .is_some_and(|leases| leases.iter().any(|lease| lease["node_id"] == node_id))
}

/// The owner changes the asks of a node the view holds (a change the view must be rebuilt for).
async fn change_asks(h: &Harness, owner: &Account, node_id: i64) {
    h.put(
        &owner.key,
        &format!("/v1/nodes/{node_id}/policy"),
        json!({"asks": {"gold": "0.01"}}),
    )
    .await
    .expect(200, "the owner changes a node the view holds");
}

/// A fleet registering node after node: each rebuild of the leader's view reads the whole
/// fleet, so while nodes keep registering and nothing else changed, the new ones wait for the
/// view (until the last rebuild is a few times its own length old) instead of rebuilding it at
/// every pass; the first pass that sees no new node takes them in, and a change to a node the
/// view holds rebuilds at once, the new nodes with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_registering_fleet_joins_the_view_without_rebuilding_it_at_every_pass() {
    on_every_backend_with(
        |config| config.reconcile = false,
        async |h: &Harness| {
            let provider = h.provider("rack-owner").await;
            let state = &h.running.state;
            let in_view = async || {
                state
                    .view
                    .lock()
                    .await
                    .as_ref()
                    .map_or(0, |view| view.matcher.nodes().len())
            };
            // As if each rebuild took an hour: new nodes alone would wait three.
            const AN_HOUR_US: i64 = 3_600_000_000;
            let mut leader = h.lead().await;
            let first = h.node(&provider, "first", |_| {}).await;
            leader.pass(h, "the first view").await;
            assert_eq!(in_view().await, 1, "{}", h.backend);

            leader.cursor.rebuild_took_us = AN_HOUR_US;
            h.node(&provider, "second", |_| {}).await;
            leader.pass(h, "a node registered").await;
            assert_eq!(
                in_view().await,
                1,
                "{}: the new node waits while nodes keep registering",
                h.backend
            );
            leader.pass(h, "no node registered since").await;
            assert_eq!(
                in_view().await,
                2,
                "{}: the first pass that sees no new node takes it in",
                h.backend
            );

            leader.cursor.rebuild_took_us = AN_HOUR_US;
            h.node(&provider, "third", |_| {}).await;
            change_asks(h, &provider, first.node_id).await;
            leader.pass(h, "a node registered and another changed").await;
            assert_eq!(
                in_view().await,
                3,
                "{}: a changed node rebuilds the view at once, with the new node",
                h.backend
            );
        },
    )
    .await;
}

/// Nodes registered since the view was built join it with their own rows alone: the view's
/// records stand for the nodes it holds, as the passes left them. A lease placed before stays
/// held (its GPU is not sold twice), the new node sells at once, and a change to a node the view
/// holds still builds the view from the whole store.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn new_nodes_join_the_view_from_their_own_rows() {
    on_every_backend_with(
        |config| config.reconcile = false,
        async |h: &Harness| {
            let tenant = h.tenant("grower").await;
            h.credit(&tenant, "100.00").await;
            let provider = h.provider("rack-owner").await;
            let one_gpu = |registration: &mut Value| registration["gpu_count"] = json!(1);
            let state = &h.running.state;
            let mut leader = h.lead().await;
            let first = h.node(&provider, "first", one_gpu).await;
            first.heartbeat().await;
            leader.pass(h, "the first view").await;
            let held = id(&h.submit(&tenant, job_request("held")).await["id"]);
            leader.pass(h, "the first job is placed").await;
            let view = h.wait_for_job(&tenant.key, held, "running").await;
            assert!(leased_on(&view, first.node_id), "{}: {view}", h.backend);
            let (rebuilds, _) = builds(h).await;

            let second = h.node(&provider, "second", one_gpu).await;
            second.heartbeat().await;
            let joins = id(&h.submit(&tenant, job_request("joins")).await["id"]);
            let waits = id(&h.submit(&tenant, job_request("waits")).await["id"]);
            leader.cursor.rebuild_took_us = 0;
            leader.pass(h, "a node registered").await;
            assert_eq!(
                builds(h).await,
                (rebuilds + 1.0, 1.0),
                "{}: the view grew by the new node",
                h.backend
            );
            let placed = h.wait_for_job(&tenant.key, joins, "running").await;
            assert!(
                leased_on(&placed, second.node_id),
                "{}: the new node sells at once: {placed}",
                h.backend
            );
            let view = h
                .get(&tenant.key, &format!("/v1/jobs/{waits}"))
                .await
                .expect(200, "job");
            assert_eq!(
                view["state"], "queued",
                "{}: the first node's GPU stays held in the grown view",
                h.backend
            );
            {
                let view = state.view.lock().await;
                let view = view.as_ref().expect("built");
                assert_eq!(view.matcher.nodes().len(), 2, "{}", h.backend);
                assert_eq!(view.matcher.running_jobs(), 2, "{}", h.backend);
                assert!(view.conflicts.is_empty(), "{}: {:?}", h.backend, view.conflicts);
            }

            change_asks(h, &provider, first.node_id).await;
            h.node(&provider, "third", one_gpu).await;
            leader.pass(h, "a node registered and another changed").await;
            assert_eq!(
                builds(h).await,
                (rebuilds + 2.0, 1.0),
                "{}: a changed node builds the view from the whole store",
                h.backend
            );
        },
    )
    .await;
}
