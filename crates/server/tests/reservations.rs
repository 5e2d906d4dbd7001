//! Booking capacity ahead, on both backends: a booking holds the cheapest GPUs free at its
//! start at the auction's price with the whole of it in escrow; one that cannot be met is
//! refused with the reason and takes nothing; bronze uses the booked GPUs until the start, a
//! job inside the booking runs there after it, paid by the booking; the end pays the providers;
//! a node lost before the start is replaced, and refunded when nothing can replace it.

mod common;

use serde_json::{Value, json};

const HOUR_US: i64 = 3_600_000_000;
const DAY_US: i64 = 24 * HOUR_US;

fn booking(gpus: u32, starts_at_us: i64, hours: u32) -> Value {
    json!({
        "gpus": gpus,
        "gpu_model": "H100",
        "starts_at_us": starts_at_us,
        "hours": hours,
        "max_price_per_gpu_hour": "5",
    })
}

fn eight_h100(name: &str, tier: &str, runtime_s: i64) -> Value {
    let mut job = common::job_request(name);
    job["gpus"] = json!(8);
    job["tier"] = json!(tier);
    job["max_price_per_gpu_hour"] = json!("5");
    job["max_runtime_s"] = json!(runtime_s);
    job
}

/// The test drives the passes, and days pass on the coordinator's clock while the test's agents
/// beat in real time: no node falls silent meanwhile.
fn days_pass(config: &mut server::Config) {
    config.reconcile = false;
    config.heartbeat_timeout_ms = 30 * 24 * 3600 * 1000;
}

async fn balance(h: &common::Harness, key: &str) -> Value {
    h.get(key, "/v1/balance").await.expect(200, "the balance")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_booking_holds_the_cheapest_gpus_at_a_price_fixed_ahead_and_pays_their_providers() {
    common::on_every_backend_on(true, days_pass, async |h| {
        let clock = h.clock.as_ref().expect("a manual clock");
        let state = &h.running.state;
        let provider = h.provider("booked-provider").await;
        let cheap = h
            .node(&provider, "booked-cheap", |node| {
                node["policy"]["asks"] = json!({"gold": "3.00", "silver": "2.00", "bronze": "1.00"});
            })
            .await;
        let dear = h
            .node(&provider, "booked-dear", |node| {
                node["policy"]["asks"] = json!({"gold": "4.00", "silver": "2.00", "bronze": "1.50"});
            })
            .await;
        cheap.heartbeat().await;
        dear.heartbeat().await;
        h.wait_online(&[&cheap, &dear]).await;
        let tenant = h.tenant("booker").await;
        // Enough for the booking and for the holds of two jobs of three days.
        h.credit(&tenant, "10000").await;
        let mut leader = h.lead().await;
        leader.pass(h, "building the view").await;

        let starts_at = (state.now_us() / 1_000_000 + 2 * 86_400) * 1_000_000;
        let booked = h
            .post(&tenant.key, "/v1/reservations", booking(8, starts_at, 8))
            .await
            .expect(201, "eight H100s booked two days ahead");
        let id = booked["id"].as_i64().expect("reservation id");
        assert_eq!(booked["state"], "booked", "{booked}");
        assert_eq!(booked["nodes"].as_array().map(Vec::len), Some(1), "{booked}");
        assert_eq!(
            booked["nodes"][0]["node_id"], cheap.node_id,
            "the cheaper gold ask wins: {booked}"
        );
        // The first slot left out, the dearer node's $4, sets the price.
        assert_eq!(booked["nodes"][0]["price_micros_per_gpu_hour"], 4_000_000, "{booked}");
        let cost = 8 * 8 * 4_000_000i64;
        assert_eq!(booked["hold_micros"], cost, "{booked}");
        assert_eq!(booked["escrow_micros"], cost, "{booked}");
        assert_eq!(booked["refund_if_cancelled_micros"], cost, "two days ahead: all back");
        let held = balance(h, &tenant.key).await;
        assert_eq!(held["available_micros"], 10_000_000_000i64 - cost, "{held}");
        assert_eq!(held["escrow_micros"], cost, "{held}");

        // The provider sees the window on its node's calendar.
        let calendar = h
            .get(&provider.key, &format!("/v1/nodes/{}/calendar", cheap.node_id))
            .await
            .expect(200, "the node's calendar");
        assert_eq!(calendar["entries"][0]["reservation_id"], id, "{calendar}");
        assert_eq!(calendar["entries"][0]["from_us"], starts_at, "{calendar}");
        assert_eq!(
            calendar["entries"][0]["until_us"],
            starts_at + 8 * HOUR_US,
            "{calendar}"
        );

        // Sixteen more cannot be met: refused with the count and the reason, nothing held.
        let refused = h
            .post(&tenant.key, "/v1/reservations", booking(16, starts_at, 8))
            .await
            .refused(409, "a booking the fleet cannot meet");
        assert!(refused.contains("only 8 of the 16 GPUs"), "{refused}");
        let after = balance(h, &tenant.key).await;
        assert_eq!(
            after["available_micros"], held["available_micros"],
            "nothing more held: {after}"
        );

        // Before the start: bronze may use the booked node and is told to leave at the start;
        // long silver work goes where no booking needs the GPUs.
        let bronze = h
            .submit(&tenant, eight_h100("before-bronze", "bronze", 3 * 86_400))
            .await;
        let silver = h.submit(&tenant, eight_h100("long-silver", "silver", 3 * 86_400)).await;
        let mut inside = eight_h100("inside", "gold", 4 * 3600);
        inside["reservation"] = json!(id);
        let inside = h.submit(&tenant, inside).await;
        leader.pass(h, "placing before the start").await;
        let job = async |job: &Value| {
            h.get(&tenant.key, &format!("/v1/jobs/{}", job["id"]))
                .await
                .expect(200, "a job")
        };
        let bronze_view = job(&bronze).await;
        assert_eq!(bronze_view["leases"][0]["node_id"], cheap.node_id, "{bronze_view}");
        assert_eq!(bronze_view["leases"][0]["preempt_at_us"], starts_at, "{bronze_view}");
        let silver_view = job(&silver).await;
        assert_eq!(silver_view["leases"][0]["node_id"], dear.node_id, "{silver_view}");
        let waiting = job(&inside).await;
        assert_eq!(waiting["state"], "queued", "{waiting}");
        assert!(
            waiting["state_reason"]
                .as_str()
                .unwrap_or("")
                .contains(&format!("reservation {id} starts at")),
            "{waiting}"
        );

        // At the start the bronze lease is gone and the job inside runs there, unpriced.
        clock.advance(starts_at - state.now_us());
        leader.pass(h, "the start").await;
        leader.pass(h, "placing inside the booking").await;
        let bronze_view = job(&bronze).await;
        assert_ne!(bronze_view["leases"][0]["state"], "pending", "preempted: {bronze_view}");
        let running = job(&inside).await;
        assert_eq!(running["state"], "running", "{running}");
        assert_eq!(running["leases"][0]["node_id"], cheap.node_id, "{running}");
        assert_eq!(running["leases"][0]["price_micros_per_gpu_hour"], 0, "{running}");
        let shown = h
            .get(&tenant.key, &format!("/v1/reservations/{id}"))
            .await
            .expect(200, "the reservation");
        assert_eq!(shown["state"], "active", "{shown}");

        // At the end the provider is paid the hours its node held, less the platform's fee.
        let earned_before = balance(h, &provider.key).await["earnings_micros"].as_i64().unwrap_or(0);
        clock.advance(8 * HOUR_US);
        leader.pass(h, "the end").await;
        let ended = h
            .get(&tenant.key, &format!("/v1/reservations/{id}"))
            .await
            .expect(200, "the reservation");
        assert_eq!(ended["state"], "ended", "{ended}");
        assert_eq!(ended["escrow_micros"], 0, "{ended}");
        let earned = balance(h, &provider.key).await["earnings_micros"].as_i64().unwrap_or(0);
        assert_eq!(earned - earned_before, cost - cost / 10, "paid less the 10 % fee");
        let inside_after = job(&inside).await;
        assert_eq!(inside_after["state"], "cancelled", "{inside_after}");
        assert!(
            inside_after["state_reason"]
                .as_str()
                .unwrap_or("")
                .contains("reservation ended"),
            "{inside_after}"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_lost_before_the_start_is_replaced_and_refunded_when_nothing_can_replace_it() {
    common::on_every_backend_on(
        false,
        |config| {
            config.reconcile = false;
            config.heartbeat_timeout_ms = 1_500;
        },
        async |h| {
            let state = &h.running.state;
            let provider = h.provider("lost-provider").await;
            let first = h.node(&provider, "lost-first", |_| {}).await;
            let second = h
                .node(&provider, "lost-second", |node| {
                    node["policy"]["asks"] = json!({"gold": "3.50", "silver": "2.00", "bronze": "1.00"});
                })
                .await;
            first.heartbeat().await;
            second.heartbeat().await;
            h.wait_online(&[&first, &second]).await;
            let tenant = h.tenant("lost-booker").await;
            h.credit(&tenant, "1000").await;
            let mut leader = h.lead().await;
            leader.pass(h, "building the view").await;
            let starts_at = state.now_us() + DAY_US;
            let booked = h
                .post(&tenant.key, "/v1/reservations", booking(8, starts_at, 4))
                .await
                .expect(201, "eight H100s booked a day ahead");
            let id = booked["id"].as_i64().expect("reservation id");
            assert_eq!(booked["nodes"][0]["node_id"], first.node_id, "{booked}");
            let price = booked["nodes"][0]["price_micros_per_gpu_hour"].as_i64().expect("price");
            let cost = booked["hold_micros"].as_i64().expect("hold");
            let available = balance(h, &tenant.key).await["available_micros"]
                .as_i64()
                .expect("balance");

            // The first node falls silent while the second beats: the booking moves there at
            // the price booked.
            for _ in 0..8 {
                second.heartbeat().await;
                tokio::time::sleep(std::time::Duration::from_millis(250)).await;
            }
            leader.pass(h, "the first node is silent").await;
            let moved = h
                .get(&tenant.key, &format!("/v1/reservations/{id}"))
                .await
                .expect(200, "the reservation");
            let nodes = moved["nodes"].as_array().cloned().unwrap_or_default();
            assert_eq!(nodes.len(), 2, "{moved}");
            assert_eq!(nodes[0]["node_id"], first.node_id, "{moved}");
            assert!(nodes[0]["lost_at_us"].is_i64(), "{moved}");
            assert_eq!(nodes[1]["node_id"], second.node_id, "{moved}");
            assert_eq!(nodes[1]["price_micros_per_gpu_hour"], price, "{moved}");
            assert_eq!(moved["escrow_micros"], cost, "nothing refunded: {moved}");
            let calendar = h
                .get(&provider.key, &format!("/v1/nodes/{}/calendar", second.node_id))
                .await
                .expect(200, "the second node's calendar");
            assert_eq!(calendar["entries"][0]["reservation_id"], id, "{calendar}");
            let calendar = h
                .get(&provider.key, &format!("/v1/nodes/{}/calendar", first.node_id))
                .await
                .expect(200, "the lost node's calendar");
            assert_eq!(
                calendar["entries"],
                json!([]),
                "the lost node holds nothing: {calendar}"
            );

            // Then the second falls silent too, and nothing is left to take its place: the
            // tenant gets the booking's hours back.
            tokio::time::sleep(std::time::Duration::from_millis(2_000)).await;
            leader.pass(h, "the second node is silent").await;
            let refunded = h
                .get(&tenant.key, &format!("/v1/reservations/{id}"))
                .await
                .expect(200, "the reservation");
            assert_eq!(refunded["escrow_micros"], 0, "{refunded}");
            assert_eq!(refunded["cost_micros"], 0, "no hour was held: {refunded}");
            let after = balance(h, &tenant.key).await["available_micros"]
                .as_i64()
                .expect("balance");
            assert_eq!(after, available + cost, "the whole hold back");

            // A cancellation of what is left ends it; a second one is refused.
            let cancelled = h
                .post(&tenant.key, &format!("/v1/reservations/{id}/cancel"), json!({}))
                .await
                .expect(200, "cancelled");
            assert_eq!(cancelled["state"], "cancelled", "{cancelled}");
            h.post(&tenant.key, &format!("/v1/reservations/{id}/cancel"), json!({}))
                .await
                .refused(409, "cancelled twice");
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_cancellation_forfeits_half_to_the_providers_and_bad_bookings_say_why() {
    common::on_every_backend_on(true, days_pass, async |h| {
        let clock = h.clock.as_ref().expect("a manual clock");
        let state = &h.running.state;
        let provider = h.provider("cancel-provider").await;
        let node = h.node(&provider, "cancel-node", |_| {}).await;
        node.heartbeat().await;
        h.wait_online(&[&node]).await;
        let tenant = h.tenant("canceller").await;
        h.credit(&tenant, "100").await;
        let mut leader = h.lead().await;
        leader.pass(h, "building the view").await;
        let now = state.now_us();

        // Refused with the rule each breaks.
        let past = h
            .post(&tenant.key, "/v1/reservations", booking(4, now - HOUR_US, 2))
            .await
            .refused(400, "a start in the past");
        assert!(past.contains("starts_at_us"), "{past}");
        let poor = h
            .post(&tenant.key, "/v1/reservations", booking(8, now + 2 * DAY_US, 8))
            .await
            .refused(402, "more than the balance covers");
        assert!(poor.contains("holds"), "{poor}");
        let cheap = h
            .post(
                &tenant.key,
                "/v1/reservations",
                json!({"gpus": 2, "gpu_model": "H100", "starts_at_us": now + DAY_US, "hours": 1,
                           "max_price_per_gpu_hour": "0.50"}),
            )
            .await
            .refused(409, "a cap under every ask");
        assert!(
            cheap.contains("only 0 of the 2 GPUs") && cheap.contains("ask above $0.50"),
            "{cheap}"
        );

        // Two GPUs for two hours, cancelled an hour before the start: half back.
        let starts_at = now + 2 * DAY_US;
        let booked = h
            .post(&tenant.key, "/v1/reservations", booking(2, starts_at, 2))
            .await
            .expect(201, "booked");
        let id = booked["id"].as_i64().expect("id");
        let cost = booked["hold_micros"].as_i64().expect("hold");
        let available = balance(h, &tenant.key).await["available_micros"]
            .as_i64()
            .expect("balance");
        clock.advance(starts_at - HOUR_US - state.now_us());
        let quoted = h
            .get(&tenant.key, &format!("/v1/reservations/{id}"))
            .await
            .expect(200, "shown");
        assert_eq!(quoted["refund_if_cancelled_micros"], cost / 2, "{quoted}");
        let earned_before = balance(h, &provider.key).await["earnings_micros"].as_i64().unwrap_or(0);
        let cancelled = h
            .post(&tenant.key, &format!("/v1/reservations/{id}/cancel"), json!({}))
            .await
            .expect(200, "cancelled late");
        assert_eq!(cancelled["state"], "cancelled", "{cancelled}");
        assert_eq!(cancelled["escrow_micros"], 0, "{cancelled}");
        let after = balance(h, &tenant.key).await["available_micros"]
            .as_i64()
            .expect("balance");
        assert_eq!(after - available, cost / 2, "half back");
        let earned = balance(h, &provider.key).await["earnings_micros"].as_i64().unwrap_or(0);
        assert_eq!(
            earned - earned_before,
            cost / 2 - cost / 2 / 10,
            "half to the provider, less the fee"
        );
        let calendar = h
            .get(&provider.key, &format!("/v1/nodes/{}/calendar", node.node_id))
            .await
            .expect(200, "the calendar");
        assert_eq!(calendar["entries"], json!([]), "nothing booked now: {calendar}");
    })
    .await;
}
