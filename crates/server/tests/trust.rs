//! The trust policy in the coordinator (docs/trust-policy.md), on both backends, with agents
//! played by the test through signed requests: canaries ordered on registration and answered
//! honestly or not, two slow or two wrong answers proving fraud (bond slashed by the rule's
//! share, the node's tenants paid back, the node cordoned and its work moved), refused canary
//! results kept as evidence, leases dropped from heartbeats, bonds, and gold work waiting for
//! a gold badge. An honest node beside every liar is left alone.

mod common;

use common::{Account, Agent, Harness, job_request, on_every_backend_with, run_until_placed};
use serde_json::{Value, json};

/// Canaries at once after registration, looked for every 100 ms, one second long on the
/// claimed GPU; gold work only for gold-badge providers.
fn trust_config(config: &mut server::Config) {
    config.gold_needs_badge = true;
    config.canary_within_ms = 0;
    config.canary_check_every_ms = 100;
    config.canary_seconds = 1;
    config.heartbeat_interval_ms = 100;
}

/// An H100 SXM5's canary rate: `trust::canary::expected_rate_milli(1000)`.
const H100_RATE_MILLI: i64 = 100_000;
/// $50 for each of a node's eight GPUs: the gold badge's bond.
const BOND_DOLLARS: &str = "400.00";
const BOND_MICROS: i64 = 400_000_000;

/// Heartbeats until the coordinator orders a canary other than `answered`; returns it.
async fn next_canary(h: &Harness, agent: &Agent, answered: &[i64]) -> Value {
    h.wait_for(&format!("a canary for node {}", agent.node_id), async || {
        let beat = agent
            .signed("POST", "/v1/agent/heartbeat", Some(&json!({})))
            .await
            .expect(200, "heartbeat");
        beat["canaries"]
            .as_array()?
            .iter()
            .find(|order| !answered.contains(&order["id"].as_i64().unwrap_or(0)))
            .cloned()
    })
    .await
}

/// The signed result of `order` as `agent` sends it: the known answer (or `digest`), run at
/// `rate_permille` of an H100's rate.
fn result(agent: &Agent, order: &Value, rate_permille: i64, digest: Option<&str>) -> Value {
    let seed = order["seed"].as_str().expect("seed").to_string();
    let units = order["units"].as_u64().expect("units");
    let gpus: Vec<u8> = serde_json::from_value(order["gpus"].clone()).expect("gpus");
    let rate_milli = H100_RATE_MILLI * rate_permille / 1000;
    let body = trust::canary::CanaryResult {
        canary_id: order["id"].as_i64().expect("id"),
        seed: seed.clone(),
        units: units as i64,
        digest: digest.map_or_else(|| trust::canary::answer(&seed, &gpus, units), str::to_string),
        elapsed_ms: (units as i64 * 1_000_000) / rate_milli.max(1),
        rate_milli,
        memory_allocated: true,
        measured_on: "simulated:H100-SXM5".to_string(),
    };
    serde_json::to_value(trust::sign_record(&agent.key, agent.node_id, &body)).expect("serialises")
}

async fn answer(agent: &Agent, signed: &Value) -> common::Reply {
    agent.signed("POST", "/v1/agent/canaries", Some(signed)).await
}

async fn bond(h: &Harness, provider: &Account) -> Value {
    h.post(
        &h.admin,
        "/v1/admin/bonds",
        json!({"provider_id": provider.id, "amount": BOND_DOLLARS, "key": common::unique("bond")}),
    )
    .await
    .expect(200, "admin posts a bond")
}

async fn standing(h: &Harness, provider: &Account) -> Value {
    h.get(&provider.key, "/v1/trust")
        .await
        .expect(200, "the provider's standing")
}

/// Every canary of a fraud decision's evidence verifies under the node's key, as anyone with
/// the decision can check.
fn check_evidence_signatures(fraud: &Value, agent: &Agent) {
    let canaries = fraud["evidence"]["canaries"]
        .as_array()
        .expect("canaries in the evidence");
    assert_eq!(canaries.len(), 2, "two canaries in a row: {fraud}");
    for canary in canaries {
        let body: trust::canary::CanaryResult =
            serde_json::from_value(canary["result"].clone()).expect("the signed result is kept");
        let signed = trust::SignedRecord {
            body,
            signature_hex: canary["signature_hex"].as_str().expect("its signature").to_string(),
        };
        trust::verify_record(&agent.key.verifying_key(), agent.node_id, &signed)
            .expect("the kept result verifies under the node's key");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_false_gpu_model_fails_two_canaries_and_is_slashed_while_an_honest_node_passes() {
    on_every_backend_with(trust_config, async |h: &Harness| {
        let tenant = h.tenant("acme").await;
        h.credit(&tenant, "100.00").await;
        let honest_provider = h.provider("honest-farm").await;
        let liar_provider = h.provider("liar-farm").await;
        bond(h, &honest_provider).await;
        let bonded = bond(h, &liar_provider).await;
        assert_eq!(bonded["bond_micros"], BOND_MICROS, "{}: {bonded}", h.backend);
        // The liar claims H100s (its GPUs are A100s: a third of the rate) and asks less.
        let liar = h
            .node(&liar_provider, "liar", |registration| {
                registration["policy"]["asks"]["silver"] = json!("1.50");
            })
            .await;
        let honest = h.node(&honest_provider, "honest", |_| {}).await;

        // The tenant's job runs on the liar and is billed.
        let job = h.submit(&tenant, job_request("on-the-liar")).await;
        let job_id = job["id"].as_i64().unwrap();
        let (_, lease) = run_until_placed(h, &liar, &tenant, job_id).await;
        liar.event(&lease, "running").await.expect(200, "running");
        let usage = liar
            .signed("POST", "/v1/agent/usage", Some(&liar.usage(&lease, 1, 1000)))
            .await
            .expect(200, "usage");
        let charged = usage["charged_micros"].as_i64().unwrap();
        assert!(charged > 0, "{}: {usage}", h.backend);

        // The honest node answers its canary at its full rate.
        let order = next_canary(h, &honest, &[]).await;
        assert_eq!(
            order["units"], 100,
            "{}: a second of an H100's work: {order}",
            h.backend
        );
        assert_eq!(
            order["gpus"].as_array().unwrap().len(),
            8,
            "{}: every idle GPU",
            h.backend
        );
        assert_eq!(
            order["memory_mib"],
            80 * 1024 * 9 / 10,
            "{}: 90 % of an H100's memory",
            h.backend
        );
        let found = answer(&honest, &result(&honest, &order, 980, None))
            .await
            .expect(200, "honest");
        assert_eq!(found, json!({"finding": "passed", "fraud": null}), "{}", h.backend);

        // The liar's first canary, on its seven idle GPUs, is slow: a failed canary only.
        let first = next_canary(h, &liar, &[]).await;
        assert_eq!(
            first["gpus"].as_array().unwrap().len(),
            7,
            "{}: not the leased GPU",
            h.backend
        );
        let found = answer(&liar, &result(&liar, &first, 315, None))
            .await
            .expect(200, "slow");
        assert_eq!(found["finding"], "slow", "{}", h.backend);
        assert_eq!(
            found["fraud"],
            Value::Null,
            "{}: one slow canary proves nothing",
            h.backend
        );
        // The next comes at once; slow again, it proves false hardware (§ 3).
        let second = next_canary(h, &liar, &[first["id"].as_i64().unwrap()]).await;
        let found = answer(&liar, &result(&liar, &second, 315, None))
            .await
            .expect(200, "slow again");
        assert_eq!(
            found,
            json!({"finding": "slow", "fraud": "false_hardware"}),
            "{}",
            h.backend
        );

        // Half the bond is slashed; the tenant gets back what it paid for the liar's work.
        let frauds = h.get(&h.admin, "/v1/frauds").await.expect(200, "frauds");
        let frauds = frauds.as_array().unwrap();
        assert_eq!(frauds.len(), 1, "{}: {frauds:?}", h.backend);
        let fraud = &frauds[0];
        assert_eq!(
            (
                &fraud["node_id"],
                &fraud["kind"],
                &fraud["section"],
                &fraud["share_permille"]
            ),
            (
                &json!(liar.node_id),
                &json!("false_hardware"),
                &json!("§ 3"),
                &json!(500)
            ),
            "{}",
            h.backend
        );
        assert_eq!(fraud["bond_before_micros"], BOND_MICROS, "{}", h.backend);
        assert_eq!(fraud["slashed_micros"], BOND_MICROS / 2, "{}", h.backend);
        assert_eq!(
            fraud["refunds"],
            json!([{"tenant_id": tenant.id, "owed_micros": charged, "paid_micros": charged}]),
            "{}",
            h.backend
        );
        assert_eq!(fraud["to_platform_micros"], BOND_MICROS / 2 - charged, "{}", h.backend);
        check_evidence_signatures(fraud, &liar);
        let tenant_frauds = h
            .get(&tenant.key, "/v1/frauds")
            .await
            .expect(200, "the tenant's frauds");
        assert_eq!(
            tenant_frauds.as_array().unwrap().len(),
            1,
            "{}: the refunded tenant sees it",
            h.backend
        );
        let honest_frauds = h.get(&honest_provider.key, "/v1/frauds").await.expect(200, "frauds");
        assert_eq!(
            honest_frauds,
            json!([]),
            "{}: none concern the honest provider",
            h.backend
        );

        // The liar is cordoned, its lease lost and the job queued again.
        let liar_standing = standing(h, &liar_provider).await;
        assert_eq!(liar_standing["bond_micros"], BOND_MICROS / 2, "{}", h.backend);
        assert!(
            liar_standing["nodes"][0]["fraud_cordoned_at_us"].is_i64(),
            "{}: {liar_standing}",
            h.backend
        );
        assert_eq!(
            liar_standing["nodes"][0]["last_canary"]["finding"], "slow",
            "{}",
            h.backend
        );
        assert!(liar_standing["last_fraud_at_us"].is_i64(), "{}", h.backend);
        let view = h
            .get(&tenant.key, &format!("/v1/jobs/{job_id}"))
            .await
            .expect(200, "job");
        assert_eq!(view["leases"][0]["state"], "lost", "{}: {view}", h.backend);
        assert_ne!(view["state"], "failed", "{}: the job queues again: {view}", h.backend);
        let inputs = &liar_standing["nodes"][0]["reputation"]["inputs"];
        assert_eq!(
            inputs["canary_failed"], 10.0,
            "{}: two failures of weight 5: {inputs}",
            h.backend
        );

        // The honest node is untouched: bond whole, its canary counted, no cordon; the job
        // moves to it.
        let honest_standing = standing(h, &honest_provider).await;
        assert_eq!(honest_standing["bond_micros"], BOND_MICROS, "{}", h.backend);
        assert_eq!(honest_standing["frauds"], json!([]), "{}", h.backend);
        let node = &honest_standing["nodes"][0];
        assert_eq!(node["fraud_cordoned_at_us"], Value::Null, "{}", h.backend);
        assert_eq!(node["last_canary"]["finding"], "passed", "{}", h.backend);
        assert_eq!(
            node["reputation"]["inputs"]["canary_passed"], 2.0,
            "{}: {node}",
            h.backend
        );
        assert!(
            node["reputation"]["score"].as_f64().unwrap() > 0.8,
            "{}: {node}",
            h.backend
        );
        let moved = h
            .wait_for("the job to move to the honest node", async || {
                honest.heartbeat().await;
                let view = h
                    .get(&tenant.key, &format!("/v1/jobs/{job_id}"))
                    .await
                    .expect(200, "job");
                view["leases"]
                    .as_array()?
                    .iter()
                    .find(|lease| lease["state"] != "lost")
                    .cloned()
            })
            .await;
        assert_eq!(moved["node_id"], honest.node_id, "{}: {moved}", h.backend);

        // The tenant got its money back: the slash paid it, as its statement shows.
        let statement = h.get(&tenant.key, "/v1/statement").await.expect(200, "statement");
        let refunds: Vec<i64> = statement["lines"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|line| line["kind"] == "slash")
            .map(|line| line["amount_micros"].as_i64().unwrap())
            .collect();
        assert_eq!(refunds, vec![charged], "{}: {statement}", h.backend);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_wrong_answers_in_a_row_slash_the_whole_bond() {
    on_every_backend_with(trust_config, async |h: &Harness| {
        let provider = h.provider("broken-farm").await;
        bond(h, &provider).await;
        let node = h.node(&provider, "wrong", |_| {}).await;
        let first = next_canary(h, &node, &[]).await;
        let found = answer(&node, &result(&node, &first, 1000, Some(&"0".repeat(64))))
            .await
            .expect(200, "wrong");
        assert_eq!(
            found,
            json!({"finding": "wrong_answer", "fraud": null}),
            "{}",
            h.backend
        );
        let message = h
            .post(&provider.key, &format!("/v1/nodes/{}/verify", node.node_id), json!({}))
            .await
            .refused(409, "a canary less than a minute after the last");
        assert!(
            message.contains("ago") || message.contains("open"),
            "{}: {message}",
            h.backend
        );
        // The next comes at once after a failure; wrong again, the row proves it (§ 3).
        let second = next_canary(h, &node, &[first["id"].as_i64().unwrap()]).await;
        let found = answer(&node, &result(&node, &second, 1000, Some(&"f".repeat(64))))
            .await
            .expect(200, "wrong again");
        assert_eq!(
            found,
            json!({"finding": "wrong_answer", "fraud": "wrong_answers"}),
            "{}",
            h.backend
        );
        let standing = standing(h, &provider).await;
        assert_eq!(
            standing["bond_micros"], 0,
            "{}: wrong answers cost the whole bond",
            h.backend
        );
        assert_eq!(standing["frauds"][0]["share_permille"], 1000, "{}", h.backend);
        assert_eq!(
            standing["frauds"][0]["refunds"],
            json!([]),
            "{}: nobody to refund",
            h.backend
        );
        assert_eq!(
            standing["frauds"][0]["to_platform_micros"], BOND_MICROS,
            "{}",
            h.backend
        );
        assert_eq!(standing["badge"], "none", "{}", h.backend);
        assert!(standing["nodes"][0]["fraud_cordoned_at_us"].is_i64(), "{}", h.backend);

        // The provider replaces the GPUs: the new hardware gets a canary. Wrong again, it is
        // kept but proves nothing more while the node is cordoned; a right one lifts the cordon.
        node.signed(
            "POST",
            "/v1/agent/heartbeat",
            Some(&json!({"fingerprint": "fp-replaced"})),
        )
        .await
        .expect(200, "heartbeat with new hardware");
        let mut answered = vec![first["id"].as_i64().unwrap(), second["id"].as_i64().unwrap()];
        for _ in 0..2 {
            let order = next_canary(h, &node, &answered).await;
            answered.push(order["id"].as_i64().unwrap());
            let found = answer(&node, &result(&node, &order, 1000, Some(&"e".repeat(64))))
                .await
                .expect(200, "wrong while cordoned");
            assert_eq!(found["finding"], "wrong_answer", "{}", h.backend);
        }
        let last = next_canary(h, &node, &answered).await;
        let found = answer(&node, &result(&node, &last, 1000, None))
            .await
            .expect(200, "right");
        assert_eq!(found["finding"], "passed", "{}", h.backend);
        let standing = h.get(&provider.key, "/v1/trust").await.expect(200, "standing");
        assert_eq!(
            standing["frauds"].as_array().unwrap().len(),
            1,
            "{}: one proof, one slash",
            h.backend
        );
        assert_eq!(
            standing["nodes"][0]["fraud_cordoned_at_us"],
            Value::Null,
            "{}: verified again",
            h.backend
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forged_foreign_replayed_and_mismatched_canary_results_are_refused_and_kept() {
    on_every_backend_with(trust_config, async |h: &Harness| {
        let provider = h.provider("farm").await;
        let node = h.node(&provider, "target", |_| {}).await;
        let other = h.node(&provider, "other", |_| {}).await;
        let order = next_canary(h, &node, &[]).await;
        let honest = result(&node, &order, 1000, None);

        let mut forged = honest.clone();
        forged["body"]["rate_milli"] = json!(H100_RATE_MILLI * 2);
        let message = answer(&node, &forged)
            .await
            .refused(401, "a result changed after signing");
        assert!(message.contains("signature"), "{}: {message}", h.backend);

        let by_other = result(&other, &order, 1000, None);
        let message = answer(&other, &by_other).await.refused(403, "another node's canary");
        assert!(message.contains("recorded"), "{}: {message}", h.backend);

        let mut mismatched = order.clone();
        mismatched["seed"] = json!("a-seed-never-ordered");
        let message = answer(&node, &result(&node, &mismatched, 1000, None))
            .await
            .refused(400, "another seed");
        assert!(message.contains("seed"), "{}: {message}", h.backend);

        // The same signed request twice: the second is a replay.
        let raw = node.raw("canary", "POST", "/v1/agent/canaries", Some(&honest));
        let found = h.send_raw(&raw).await.expect(200, "the honest result");
        assert_eq!(found["finding"], "passed", "{}", h.backend);
        let message = h.send_raw(&raw).await.refused(409, "the replay");
        assert!(message.contains("nonce"), "{}: {message}", h.backend);
        // Sent again with a fresh signature: taken once only.
        let message = answer(&node, &honest).await.refused(409, "a second answer");
        assert!(message.contains("over already"), "{}: {message}", h.backend);

        for (node_id, kind) in [
            (node.node_id, "bad_canary_signature"),
            (other.node_id, "foreign_canary"),
            (node.node_id, "canary_mismatch"),
            (node.node_id, "replayed_nonce"),
        ] {
            assert!(h.has_evidence(node_id, kind).await, "{}: {kind} is evidence", h.backend);
        }
        let frauds = h.get(&h.admin, "/v1/frauds").await.expect(200, "frauds");
        assert_eq!(frauds, json!([]), "{}: refused input is no fraud by itself", h.backend);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leases_missing_from_heartbeats_are_dropped_and_two_prove_dropped_jobs() {
    on_every_backend_with(trust_config, async |h: &Harness| {
        let tenant = h.tenant("acme").await;
        h.credit(&tenant, "100.00").await;
        let provider = h.provider("flaky-farm").await;
        bond(h, &provider).await;
        let dropper = h.node(&provider, "dropper", |_| {}).await;
        let beat = |leases: Vec<i64>| json!({"leases": leases});
        for round in 0..2 {
            let job = h.submit(&tenant, job_request(&format!("dropped-{round}"))).await;
            let job_id = job["id"].as_i64().unwrap();
            let (_, lease) = run_until_placed(h, &dropper, &tenant, job_id).await;
            let lease_id = lease["id"].as_i64().unwrap();
            dropper.event(&lease, "running").await.expect(200, "running");
            // Heartbeats that list the lease keep it, however many.
            for _ in 0..5 {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                dropper
                    .signed("POST", "/v1/agent/heartbeat", Some(&beat(vec![lease_id])))
                    .await
                    .expect(200, "heartbeat listing the lease");
            }
            let view = h
                .get(&tenant.key, &format!("/v1/jobs/{job_id}"))
                .await
                .expect(200, "job");
            assert_eq!(view["leases"][0]["state"], "running", "{}: {view}", h.backend);
            // Three that leave it out, with no attestation: dropped.
            for _ in 0..3 {
                dropper
                    .signed("POST", "/v1/agent/heartbeat", Some(&beat(Vec::new())))
                    .await
                    .expect(200, "heartbeat without the lease");
            }
            let view = h
                .wait_for("the dropped lease to be lost", async || {
                    let view = h
                        .get(&tenant.key, &format!("/v1/jobs/{job_id}"))
                        .await
                        .expect(200, "job");
                    (view["leases"][0]["state"] == "lost").then_some(view)
                })
                .await;
            assert_ne!(view["state"], "failed", "{}: the job queues again: {view}", h.backend);
            assert!(
                view["leases"][0]["end_reason"].as_str().unwrap().contains("dropped"),
                "{}: {view}",
                h.backend
            );
            let frauds = h.get(&h.admin, "/v1/frauds").await.expect(200, "frauds");
            let expected = if round == 0 { 0 } else { 1 };
            assert_eq!(frauds.as_array().unwrap().len(), expected, "{}: {frauds}", h.backend);
            h.post(&tenant.key, &format!("/v1/jobs/{job_id}/cancel"), json!({}))
                .await
                .expect(200, "cancel the job");
        }
        let standing = standing(h, &provider).await;
        assert_eq!(
            standing["frauds"][0]["kind"], "dropped_jobs",
            "{}: {standing}",
            h.backend
        );
        assert_eq!(
            standing["bond_micros"],
            BOND_MICROS * 9 / 10,
            "{}: 10 % slashed",
            h.backend
        );
        let drops = standing["frauds"][0]["evidence"]["drops"].as_array().unwrap().len();
        assert_eq!(drops, 2, "{}: both drops are the evidence", h.backend);
        assert!(h.has_evidence(dropper.node_id, "dropped_lease").await, "{}", h.backend);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn gold_work_waits_for_a_gold_badge_and_bonds_are_posted_by_the_rules() {
    on_every_backend_with(trust_config, async |h: &Harness| {
        let tenant = h.tenant("acme").await;
        h.credit(&tenant, "100.00").await;
        let provider = h.provider("new-farm").await;
        let node = h.node(&provider, "fresh", |_| {}).await;
        node.heartbeat().await;
        let mut gold = job_request("gold-work");
        gold["tier"] = json!("gold");
        gold["max_price_per_gpu_hour"] = json!("5.00");
        let gold_job = h.submit(&tenant, gold).await;
        let silver_job = h.submit(&tenant, job_request("silver-work")).await;
        run_until_placed(h, &node, &tenant, silver_job["id"].as_i64().unwrap()).await;
        let waiting = h
            .wait_for("the gold job's reason", async || {
                node.heartbeat().await;
                let view = h
                    .get(&tenant.key, &format!("/v1/jobs/{}", gold_job["id"]))
                    .await
                    .expect(200, "job");
                view["state_reason"]
                    .as_str()
                    .filter(|reason| reason.contains("gold"))
                    .map(str::to_string)
            })
            .await;
        assert!(waiting.contains("gold-badge"), "{}: {waiting}", h.backend);
        let offers = h
            .get(&tenant.key, "/v1/offers?filter=tier%3Dgold")
            .await
            .expect(200, "offers");
        assert_eq!(
            offers["total_matching"], 0,
            "{}: no gold is sold without the badge: {offers}",
            h.backend
        );
        let standing = standing(h, &provider).await;
        assert_eq!(
            standing["badge"], "none",
            "{}: a new provider starts without one",
            h.backend
        );
        assert_eq!(standing["gold_bond_needed_micros"], BOND_MICROS, "{}", h.backend);
        assert_eq!(standing["nodes"][0]["gold_eligible"], false, "{}", h.backend);

        // Bonds: from earnings (none yet), and by an admin, once per key.
        let message = h
            .post(
                &provider.key,
                "/v1/provider/bond",
                json!({"amount": "10.00", "key": "first"}),
            )
            .await
            .refused(402, "a bond larger than the earnings");
        assert!(message.contains("earnings"), "{}: {message}", h.backend);
        for _ in 0..2 {
            let posted = h
                .post(
                    &h.admin,
                    "/v1/admin/bonds",
                    json!({"provider_id": provider.id, "amount": "25.00", "key": "once"}),
                )
                .await
                .expect(200, "an admin posts a bond");
            assert_eq!(
                posted["bond_micros"], 25_000_000,
                "{}: posted once: {posted}",
                h.backend
            );
        }
        let balance = h.get(&provider.key, "/v1/balance").await.expect(200, "balance");
        assert_eq!(balance["bond_micros"], 25_000_000, "{}", h.backend);
        for (body, status, says) in [
            (
                json!({"provider_id": tenant.id, "amount": "1.00", "key": "k"}),
                404,
                "providers",
            ),
            (
                json!({"provider_id": 987_654, "amount": "1.00", "key": "k"}),
                404,
                "not found",
            ),
            (
                json!({"provider_id": provider.id, "amount": "-1", "key": "k"}),
                400,
                "amount",
            ),
            (
                json!({"provider_id": provider.id, "amount": "1.00", "key": ""}),
                400,
                "key",
            ),
            (json!({"amount": "1.00", "key": "k"}), 400, "provider_id"),
        ] {
            let message = h
                .post(&h.admin, "/v1/admin/bonds", body.clone())
                .await
                .refused(status, &body.to_string());
            assert!(message.contains(says), "{}: {body}: {message}", h.backend);
        }
        let message = h
            .post(&tenant.key, "/v1/provider/bond", json!({"amount": "1.00", "key": "k"}))
            .await
            .refused(403, "a tenant posts a bond");
        assert!(message.contains("provider"), "{}: {message}", h.backend);
        h.get(&tenant.key, "/v1/trust")
            .await
            .refused(403, "a tenant reads a standing");
        h.get(&h.admin, "/v1/trust")
            .await
            .refused(404, "an admin has no standing of its own");
        let other = h.provider("other-farm").await;
        h.get(&other.key, &format!("/v1/trust?provider_id={}", provider.id))
            .await
            .refused(404, "another provider's standing");
        let shown = h
            .get(&h.admin, &format!("/v1/trust?provider_id={}", provider.id))
            .await
            .expect(200, "an admin reads a standing");
        assert_eq!(shown["bond_micros"], 25_000_000, "{}", h.backend);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn absences_inside_advertised_windows_beyond_chance_prove_missed_windows() {
    let fast_silence = |config: &mut server::Config| {
        trust_config(config);
        config.heartbeat_timeout_ms = 400;
    };
    on_every_backend_with(fast_silence, async |h: &Harness| {
        let provider = h.provider("vanishing-farm").await;
        bond(h, &provider).await;
        let honest_provider = h.provider("steady-farm").await;
        // Both nodes are always available: every hour is a committed window hour.
        let vanishing = h.node(&provider, "vanishing", |_| {}).await;
        let flaky = h.node(&honest_provider, "flaky", |_| {}).await;
        let admin_nodes = async || h.get(&h.admin, "/v1/nodes").await.expect(200, "nodes");
        let online = async |node: i64, wanted: bool| {
            h.wait_for(&format!("node {node} online={wanted}"), async || {
                let nodes = admin_nodes().await;
                nodes
                    .as_array()?
                    .iter()
                    .any(|view| view["id"] == node && view["online"] == wanted)
                    .then_some(())
            })
            .await
        };
        // The flaky node goes away twice (an honest node may), the vanishing one four times.
        for round in 0..4 {
            vanishing.heartbeat().await;
            if round < 2 {
                flaky.heartbeat().await;
                online(flaky.node_id, true).await;
            }
            online(vanishing.node_id, true).await;
            online(vanishing.node_id, false).await;
            if round < 2 {
                online(flaky.node_id, false).await;
            }
        }
        let proven = h
            .wait_for("the proof of missed windows", async || {
                let view = standing(h, &provider).await;
                (!view["frauds"].as_array()?.is_empty()).then_some(view)
            })
            .await;
        let fraud = &proven["frauds"][0];
        assert_eq!(fraud["kind"], "missed_windows", "{}: {fraud}", h.backend);
        assert_eq!(fraud["share_permille"], 100, "{}", h.backend);
        assert_eq!(
            fraud["evidence"]["absences"].as_array().unwrap().len(),
            4,
            "{}: {fraud}",
            h.backend
        );
        assert!(h.has_evidence(flaky.node_id, "window_absence").await, "{}", h.backend);
        let honest = standing(h, &honest_provider).await;
        assert_eq!(
            honest["frauds"],
            json!([]),
            "{}: two absences are chance: {honest}",
            h.backend
        );
        let faults = honest["nodes"][0]["reputation"]["inputs"]["node_fault"]
            .as_f64()
            .unwrap();
        assert!(faults >= 2.0, "{}: they cost reputation only: {honest}", h.backend);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_changed_hardware_fingerprint_is_verified_again_by_a_canary() {
    on_every_backend_with(trust_config, async |h: &Harness| {
        let provider = h.provider("upgrading-farm").await;
        let node = h.node(&provider, "upgraded", |_| {}).await;
        let first = next_canary(h, &node, &[]).await;
        answer(&node, &result(&node, &first, 1000, None))
            .await
            .expect(200, "passed");
        // New GPUs: the heartbeat's fingerprint changes.
        node.signed(
            "POST",
            "/v1/agent/heartbeat",
            Some(&json!({"fingerprint": "fp-new-gpus"})),
        )
        .await
        .expect(200, "heartbeat with a new fingerprint");
        assert!(
            h.has_evidence(node.node_id, "fingerprint_changed").await,
            "{}",
            h.backend
        );
        let again = next_canary(h, &node, &[first["id"].as_i64().unwrap()]).await;
        assert_ne!(again["id"], first["id"], "{}", h.backend);
        let canaries = h
            .get(&provider.key, &format!("/v1/nodes/{}/canaries", node.node_id))
            .await
            .expect(200, "the node's canaries");
        assert_eq!(canaries.as_array().unwrap().len(), 2, "{}: {canaries}", h.backend);
        assert_eq!(canaries[0]["finding"], Value::Null, "{}: the new one runs", h.backend);
        assert_eq!(canaries[1]["finding"], "passed", "{}", h.backend);
        let found = answer(&node, &result(&node, &again, 990, None))
            .await
            .expect(200, "passed again");
        assert_eq!(found["finding"], "passed", "{}", h.backend);
    })
    .await;
}

/// The matmul canary's size in these tests: the test computes the products on the CPU (as the
/// agent's CPU reference does), standing in for the GPU.
const MATMUL_N: u64 = 64;
/// An H100 SXM5's dense BF16 figure in thousandths of a TFLOPS: the matmul canary's rate.
const H100_TFLOPS_MILLI: i64 = 989_400;

fn matmul_config(config: &mut server::Config) {
    trust_config(config);
    config.canary_matmul_n = MATMUL_N;
}

/// A node whose agent says it runs the matmul canary (CUDA and cuBLAS loaded).
async fn matmul_node(h: &Harness, provider: &Account, name: &str) -> Agent {
    h.node(provider, name, |registration| {
        registration["canary_kinds"] = json!(["matmul"]);
    })
    .await
}

/// Each GPU's product of a matmul order, computed here; `tamper` may change it before the
/// commitment.
fn products(order: &Value, tamper: impl Fn(&mut Vec<i32>)) -> Vec<(u8, Vec<i32>)> {
    let seed = order["seed"].as_str().expect("seed");
    let n = order["units"].as_u64().expect("n") as usize;
    let gpus: Vec<u8> = serde_json::from_value(order["gpus"].clone()).expect("gpus");
    gpus.into_iter()
        .map(|gpu| {
            let gpu_seed = trust::matmul::gpu_seed(seed, gpu);
            let mut c = trust::matmul::cpu_product(
                &trust::matmul::a_matrix(&gpu_seed, n),
                &trust::matmul::b_matrix(&gpu_seed, n),
                n,
            );
            tamper(&mut c);
            (gpu, c)
        })
        .collect()
}

/// The signed result committing to `products`, at `rate_milli` thousandths of a TFLOPS.
fn matmul_result(agent: &Agent, order: &Value, products: &[(u8, Vec<i32>)], rate_milli: i64) -> Value {
    let n = order["units"].as_u64().expect("n") as usize;
    let roots: Vec<String> = products
        .iter()
        .map(|(_, c)| trust::matmul::MerkleTree::of_product(c, n).expect("a tree").root_hex())
        .collect();
    let body = trust::canary::CanaryResult {
        canary_id: order["id"].as_i64().expect("id"),
        seed: order["seed"].as_str().expect("seed").to_string(),
        units: n as i64,
        digest: roots.join(","),
        elapsed_ms: 10,
        rate_milli,
        memory_allocated: true,
        measured_on: "cuda:NVIDIA H100 80GB HBM3".to_string(),
    };
    serde_json::to_value(trust::sign_record(&agent.key, agent.node_id, &body)).expect("serialises")
}

/// The proof of `products` for the challenge the coordinator answered with.
fn proof(order: &Value, products: &[(u8, Vec<i32>)], accepted: &Value) -> Value {
    let n = order["units"].as_u64().expect("n") as usize;
    let asked = accepted["challenge"]["gpus"].as_array().expect("a challenge");
    let gpus: Vec<Value> = asked
        .iter()
        .map(|asked| {
            let gpu = asked["gpu"].as_u64().expect("gpu") as u8;
            let rows: Vec<u32> = serde_json::from_value(asked["rows"].clone()).expect("rows");
            let (_, c) = products.iter().find(|(g, _)| *g == gpu).expect("the GPU's product");
            let tree = trust::matmul::MerkleTree::of_product(c, n).expect("a tree");
            let openings = trust::matmul::open_rows(c, n, &tree, &rows).expect("the rows");
            json!({"gpu": gpu, "rows": openings})
        })
        .collect();
    json!({ "gpus": gpus })
}

async fn send_proof(agent: &Agent, order: &Value, proof: &Value) -> common::Reply {
    let path = format!("/v1/agent/canaries/{}/proof", order["id"]);
    agent.signed("POST", &path, Some(proof)).await
}

/// The node's latest canary as its provider sees it.
async fn latest_canary(h: &Harness, provider: &Account, agent: &Agent) -> Value {
    let canaries = h
        .get(&provider.key, &format!("/v1/nodes/{}/canaries", agent.node_id))
        .await
        .expect(200, "the node's canaries");
    canaries[0].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_matmul_canary_is_committed_challenged_and_proven_row_by_row() {
    on_every_backend_with(matmul_config, async |h: &Harness| {
        let provider = h.provider("cuda-farm").await;
        let gpu_node = matmul_node(h, &provider, "cuda").await;
        let plain = h.node(&provider, "plain", |_| {}).await;
        let simulated = h
            .node(&provider, "simulated", |registration| {
                registration["canary_kinds"] = json!(["matmul"]);
                registration["simulated"] = json!(true);
            })
            .await;
        let mut odd = common::node_registration(&trust::NodeKey::generate(), "odd-kinds");
        odd["canary_kinds"] = json!(["quantum"]);
        let message = h
            .post(&provider.key, "/v1/nodes", odd)
            .await
            .refused(400, "an unknown kind");
        assert!(message.contains("canary_kinds"), "{}: {message}", h.backend);

        // Agents without CUDA, and simulated devices, keep the hash canary.
        for agent in [&plain, &simulated] {
            let order = next_canary(h, agent, &[]).await;
            assert_eq!(order["kind"], "hash", "{}: {order}", h.backend);
        }

        // The CUDA node: a product per GPU, committed, then challenged.
        let order = next_canary(h, &gpu_node, &[]).await;
        assert_eq!(
            (&order["kind"], &order["units"]),
            (&json!("matmul"), &json!(MATMUL_N)),
            "{}: {order}",
            h.backend
        );
        let honest = products(&order, |_| {});
        let accepted = answer(
            &gpu_node,
            &matmul_result(&gpu_node, &order, &honest, H100_TFLOPS_MILLI * 7 / 10),
        )
        .await
        .expect(200, "the committed result");
        assert_eq!(accepted["finding"], "challenged", "{}: {accepted}", h.backend);
        let asked = accepted["challenge"]["gpus"].as_array().expect("a challenge");
        assert_eq!(asked.len(), 8, "{}: every GPU is challenged", h.backend);
        assert_eq!(
            asked[0]["rows"].as_array().map(Vec::len),
            Some(trust::matmul::CHALLENGE_ROWS),
            "{}",
            h.backend
        );
        let open = latest_canary(h, &provider, &gpu_node).await;
        assert_eq!(
            (&open["kind"], &open["finding"]),
            (&json!("matmul"), &Value::Null),
            "{}: open until proven: {open}",
            h.backend
        );
        let message = answer(&gpu_node, &matmul_result(&gpu_node, &order, &honest, H100_TFLOPS_MILLI))
            .await
            .refused(409, "a second, other result");
        assert!(message.contains("once"), "{}: {message}", h.backend);
        // The same result again (an answer lost on the way): the same challenge again.
        let again = answer(
            &gpu_node,
            &matmul_result(&gpu_node, &order, &honest, H100_TFLOPS_MILLI * 7 / 10),
        )
        .await
        .expect(200, "the same result again");
        assert_eq!(again["challenge"], accepted["challenge"], "{}", h.backend);

        // A proof of the wrong shape is refused, and the right one may follow.
        let mut short = proof(&order, &honest, &accepted);
        short["gpus"].as_array_mut().unwrap().pop();
        let message = send_proof(&gpu_node, &order, &short)
            .await
            .refused(400, "a GPU missing");
        assert!(message.contains("GPUs"), "{}: {message}", h.backend);
        let mut cut = proof(&order, &honest, &accepted);
        cut["gpus"][2]["rows"][0]["path"].as_array_mut().unwrap().pop();
        let message = send_proof(&gpu_node, &order, &cut).await.refused(400, "a short path");
        assert!(message.contains("path"), "{}: {message}", h.backend);
        let message = send_proof(&plain, &order, &proof(&order, &honest, &accepted))
            .await
            .refused(403, "another node's proof");
        assert!(message.contains("recorded"), "{}: {message}", h.backend);

        let found = send_proof(&gpu_node, &order, &proof(&order, &honest, &accepted))
            .await
            .expect(200, "the honest proof");
        assert_eq!(found["finding"], "passed", "{}: {found}", h.backend);
        let message = send_proof(&gpu_node, &order, &proof(&order, &honest, &accepted))
            .await
            .refused(409, "a second proof");
        assert!(message.contains("over already"), "{}: {message}", h.backend);
        let passed = latest_canary(h, &provider, &gpu_node).await;
        assert_eq!(
            (
                &passed["finding"],
                &passed["rate_milli"],
                &passed["expected_rate_milli"]
            ),
            (
                &json!("passed"),
                &json!(H100_TFLOPS_MILLI * 7 / 10),
                &json!(H100_TFLOPS_MILLI)
            ),
            "{}: {passed}",
            h.backend
        );
        // The signed result is kept for anyone to re-check.
        let body: trust::canary::CanaryResult = serde_json::from_value(passed["result"].clone()).expect("kept");
        let signed = trust::SignedRecord {
            body,
            signature_hex: passed["signature_hex"].as_str().expect("signature").to_string(),
        };
        trust::verify_record(&gpu_node.key.verifying_key(), gpu_node.node_id, &signed).expect("verifies");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wrong_product_or_a_slow_gpu_fails_the_matmul_canary_and_two_prove_fraud() {
    on_every_backend_with(matmul_config, async |h: &Harness| {
        let provider = h.provider("cuda-farm").await;
        let wrong = matmul_node(h, &provider, "wrong").await;
        let slow = matmul_node(h, &provider, "slow").await;
        let shapeless = matmul_node(h, &provider, "shapeless").await;

        // One wrong entry in every row: whichever rows are asked, Freivalds' check fails.
        let order = next_canary(h, &wrong, &[]).await;
        let bad = products(&order, |c| {
            for row in c.chunks_exact_mut(MATMUL_N as usize) {
                row[5] += 1;
            }
        });
        let accepted = answer(&wrong, &matmul_result(&wrong, &order, &bad, H100_TFLOPS_MILLI))
            .await
            .expect(200, "a committed wrong product");
        let found = send_proof(&wrong, &order, &proof(&order, &bad, &accepted))
            .await
            .expect(200, "its proof");
        assert_eq!(found["finding"], "wrong_answer", "{}: {found}", h.backend);
        let reason = found["reason"].as_str().unwrap_or_default();
        assert!(reason.contains("Freivalds"), "{}: {reason}", h.backend);
        let view = latest_canary(h, &provider, &wrong).await;
        assert_eq!(view["reason"], json!(reason), "{}: the provider reads why", h.backend);

        // A right product at an A100's rate (312 of 989.4 TFLOPS), claimed as an H100: slow.
        let mut answered = Vec::new();
        for round in 0..2 {
            let order = next_canary(h, &slow, &answered).await;
            answered.push(order["id"].as_i64().unwrap());
            let honest = products(&order, |_| {});
            let accepted = answer(&slow, &matmul_result(&slow, &order, &honest, 312_000))
                .await
                .expect(200, "the committed result");
            let found = send_proof(&slow, &order, &proof(&order, &honest, &accepted))
                .await
                .expect(200, "its proof");
            assert_eq!(found["finding"], "slow", "{}: round {round}: {found}", h.backend);
            let reason = found["reason"].as_str().unwrap_or_default();
            assert!(
                reason.contains("TFLOPS") && reason.contains("45"),
                "{}: {reason}",
                h.backend
            );
            if round == 1 {
                assert_eq!(
                    found["fraud"], "false_hardware",
                    "{}: two slow in a row: {found}",
                    h.backend
                );
            }
        }

        // A digest that is not one root per GPU is a wrong answer at once, unchallenged.
        let order = next_canary(h, &shapeless, &[]).await;
        let honest = products(&order, |_| {});
        let signed = matmul_result(&shapeless, &order, &honest[..1], H100_TFLOPS_MILLI);
        let found = answer(&shapeless, &signed).await.expect(200, "a one-root digest");
        assert_eq!(
            (&found["finding"], &found["challenge"]),
            (&json!("wrong_answer"), &Value::Null),
            "{}: {found}",
            h.backend
        );
    })
    .await;
}
