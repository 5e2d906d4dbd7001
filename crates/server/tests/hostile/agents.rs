//! Hostile agent traffic: badly signed requests, forged and impossible agent reports, and bad
//! key rotations.

use crate::common::{Harness, Raw, job_request, now_ms, on_every_backend, run_until_placed};
use serde_json::{Value, json};

use super::{check_refused, expect, expect_saying};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_signed_requests_are_refused() {
    on_every_backend(async |h: &Harness| {
        let provider = h.provider("gpu-farm").await;
        let target = h.node(&provider, "target", |_| {}).await;
        let other = h.node(&provider, "other", |_| {}).await;
        let path = "/v1/agent/heartbeat";
        let body = serde_json::to_vec(&json!({"over_limit": false})).unwrap();
        // The target's properly signed heartbeat, with its headers then changed one at a time.
        let signed = |label: &str, timestamp_ms: i64| -> Raw {
            let mut raw = Raw::new(label, "POST", path).json_bytes(body.clone());
            raw.headers.extend(
                target
                    .key
                    .sign_request_now(target.node_id, "POST", path, &body, timestamp_ms)
                    .header_pairs()
                    .into_iter()
                    .map(|(name, value)| (name.to_string(), value.into_bytes())),
            );
            raw
        };
        let replace = |mut raw: Raw, name: &str, value: &[u8]| -> Raw {
            for header in raw.headers.iter_mut().filter(|(n, _)| n == name) {
                header.1 = value.to_vec();
            }
            raw
        };
        let remove = |mut raw: Raw, name: &str| -> Raw {
            raw.headers.retain(|(n, _)| n != name);
            raw
        };
        let now = now_ms();
        let forged_signature = hex(&[7u8; 64]);
        let by_other_key = other.key.sign_request_now(target.node_id, "POST", path, &body, now);
        let mut cases = vec![
            expect_saying(
                Raw::new("no signing headers", "POST", path).json_bytes(body.clone()),
                401,
                "missing",
            ),
            expect(remove(signed("no timestamp", now), trust::HEADER_TIMESTAMP), 401),
            expect(remove(signed("no nonce", now), trust::HEADER_NONCE), 401),
            expect(remove(signed("no signature", now), trust::HEADER_SIGNATURE), 401),
            expect(remove(signed("no node", now), trust::HEADER_NODE), 401),
            expect(
                replace(signed("node not a number", now), trust::HEADER_NODE, b"node-1"),
                401,
            ),
            expect(
                replace(signed("timestamp not a number", now), trust::HEADER_TIMESTAMP, b"soon"),
                401,
            ),
            expect_saying(
                replace(signed("unregistered node", now), trust::HEADER_NODE, b"987654321"),
                401,
                "not registered",
            ),
            expect(
                replace(signed("nonce too short", now), trust::HEADER_NONCE, b"abc"),
                401,
            ),
            expect(
                replace(
                    signed("nonce uppercase", now),
                    trust::HEADER_NONCE,
                    b"00112233445566778899AABBCCDDEEFF",
                ),
                401,
            ),
            expect(
                replace(signed("signature not hex", now), trust::HEADER_SIGNATURE, b"zz"),
                401,
            ),
            expect_saying(
                replace(
                    signed("forged signature", now),
                    trust::HEADER_SIGNATURE,
                    forged_signature.as_bytes(),
                ),
                401,
                "signature",
            ),
            expect_saying(
                replace(
                    replace(
                        signed("signed by another node's key", now),
                        trust::HEADER_SIGNATURE,
                        by_other_key.signature_hex.as_bytes(),
                    ),
                    trust::HEADER_NONCE,
                    by_other_key.nonce.as_bytes(),
                ),
                401,
                "signature",
            ),
            expect_saying(signed("a minute old", now - 60_000), 401, "clock"),
            expect_saying(signed("a minute ahead", now + 60_000), 401, "clock"),
            expect(signed("year 1970", 0), 401),
            expect(
                replace(
                    signed("timestamp i64::MAX", now),
                    trust::HEADER_TIMESTAMP,
                    i64::MAX.to_string().as_bytes(),
                ),
                401,
            ),
            expect(
                replace(
                    signed("timestamp i64::MIN", now),
                    trust::HEADER_TIMESTAMP,
                    i64::MIN.to_string().as_bytes(),
                ),
                401,
            ),
            {
                let mut tampered = signed("body changed after signing", now);
                tampered.body = serde_json::to_vec(&json!({"over_limit": true})).unwrap();
                expect_saying(tampered, 401, "signature")
            },
            {
                let mut tampered = signed("body with a space added", now);
                tampered.body.push(b' ');
                expect(tampered, 401)
            },
            {
                let mut moved = signed("signed for another path", now);
                moved.path = "/v1/agent/leases".to_string();
                moved.method = "GET";
                expect(moved, 401)
            },
            {
                let mut query = signed("query added after signing", now);
                query.path = format!("{path}?x=1");
                expect(query, 401)
            },
            expect(
                replace(
                    signed("another node's id on the target's signature", now),
                    trust::HEADER_NODE,
                    other.node_id.to_string().as_bytes(),
                ),
                401,
            ),
        ];
        // Signed correctly, but the body is wrong: refused after the signature check.
        for (label, body, says) in [
            ("not JSON", b"{".to_vec(), "JSON"),
            ("unknown field", br#"{"free_gpus": 8}"#.to_vec(), "unknown field"),
            (
                "GPU index 300",
                br#"{"gpus": [{"index": 300}]}"#.to_vec(),
                "invalid value",
            ),
            (
                "17 GPUs",
                serde_json::to_vec(&json!({"gpus": vec![json!({"index": 0}); 17]})).unwrap(),
                "gpus",
            ),
            (
                "fingerprint with a newline",
                br#"{"fingerprint": "a\nb"}"#.to_vec(),
                "fingerprint",
            ),
            (
                "4097 held leases",
                serde_json::to_vec(&json!({"leases": vec![1; 4097]})).unwrap(),
                "leases",
            ),
            ("held leases not numbers", br#"{"leases": ["one"]}"#.to_vec(), "leases"),
        ] {
            let mut raw = Raw::new(format!("signed heartbeat: {label}"), "POST", path).json_bytes(body.clone());
            raw.headers.extend(other.headers("POST", path, &body));
            cases.push(expect_saying(raw, 400, says));
        }
        let before = h.snapshot().await;
        check_refused(h, cases).await;
        assert_eq!(h.snapshot().await, before, "{}: nothing written", h.backend);
        assert!(
            h.has_evidence(target.node_id, "bad_signature").await,
            "{}: forgeries are evidence",
            h.backend
        );
        let node = h
            .get(&provider.key, &format!("/v1/nodes/{}", target.node_id))
            .await
            .expect(200, "node");
        assert_eq!(
            node["last_heartbeat_at_us"],
            Value::Null,
            "{}: no refused heartbeat counted",
            h.backend
        );
        assert_eq!(node["online"], false, "{}", h.backend);

        // Replay: the same signed request twice; the second is refused.
        let once = signed("replayed heartbeat", now_ms());
        h.send_raw(&once).await.expect(200, "the first time");
        let message = h.send_raw(&once).await.refused(409, "the replay");
        assert!(message.contains("nonce"), "{}: {message}", h.backend);
        h.wait_for("the genuine heartbeat to count", async || {
            let node = h
                .get(&provider.key, &format!("/v1/nodes/{}", target.node_id))
                .await
                .expect(200, "node");
            (node["online"] == true).then_some(())
        })
        .await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forged_and_impossible_agent_reports_are_refused() {
    on_every_backend(async |h: &Harness| {
        let tenant = h.tenant("acme").await;
        let provider = h.provider("gpu-farm").await;
        h.credit(&tenant, "100.00").await;
        let holder = h.node(&provider, "holder", |_| {}).await;
        let other = h.node(&provider, "other", |_| {}).await;
        let job = h.submit(&tenant, job_request("target")).await;
        let job_id = job["id"].as_i64().unwrap();
        let (_, lease) = run_until_placed(h, &holder, &tenant, job_id).await;
        let lease_id = lease["id"].as_i64().unwrap();
        let events = format!("/v1/agent/leases/{lease_id}/events");

        let usage = |edit: &dyn Fn(&mut Value)| -> Value {
            let mut record = holder.usage(&lease, 1, 1000);
            edit(&mut record);
            record
        };
        let resigned = |edit: &dyn Fn(&mut trust::UsageRecord)| -> Value {
            let signed: trust::SignedRecord<trust::UsageRecord> =
                serde_json::from_value(holder.usage(&lease, 1, 1000)).unwrap();
            let mut body = signed.body;
            edit(&mut body);
            serde_json::to_value(trust::sign_record(&holder.key, holder.node_id, &body)).unwrap()
        };
        let signed_by_other: Value = {
            let signed: trust::SignedRecord<trust::UsageRecord> =
                serde_json::from_value(holder.usage(&lease, 1, 1000)).unwrap();
            serde_json::to_value(trust::sign_record(&other.key, holder.node_id, &signed.body)).unwrap()
        };
        let attestation_by_other: Value = {
            let signed: trust::SignedRecord<trust::Attestation> =
                serde_json::from_value(holder.attestation(&lease, 0)).unwrap();
            serde_json::to_value(trust::sign_record(&other.key, holder.node_id, &signed.body)).unwrap()
        };
        let report = |label: &str, path: &str, body: &Value| holder.raw(label, "POST", path, Some(body));
        let cases = vec![
            expect_saying(
                report("usage signed by another key", "/v1/agent/usage", &signed_by_other),
                401,
                "signature",
            ),
            expect_saying(
                report(
                    "usage changed after signing",
                    "/v1/agent/usage",
                    &usage(&|record| record["body"]["gpu_seconds_milli"] = json!(999)),
                ),
                401,
                "signature",
            ),
            expect(
                report(
                    "usage with a short signature",
                    "/v1/agent/usage",
                    &usage(&|record| record["signature_hex"] = json!("00")),
                ),
                401,
            ),
            expect(
                report(
                    "usage with an unknown field",
                    "/v1/agent/usage",
                    &usage(&|record| record["body"]["bonus"] = json!(1)),
                ),
                400,
            ),
            expect_saying(
                report(
                    "usage at an old epoch",
                    "/v1/agent/usage",
                    &resigned(&|body| body.epoch -= 1),
                ),
                409,
                "epoch",
            ),
            expect(
                report(
                    "usage with sequence -1",
                    "/v1/agent/usage",
                    &resigned(&|body| body.sequence = -1),
                ),
                400,
            ),
            expect_saying(
                report(
                    "usage period backwards",
                    "/v1/agent/usage",
                    &resigned(&|body| body.period_end_ms = body.period_start_ms - 1),
                ),
                400,
                "outside",
            ),
            expect(
                report(
                    "negative usage",
                    "/v1/agent/usage",
                    &resigned(&|body| body.gpu_seconds_milli = -1000),
                ),
                400,
            ),
            expect_saying(
                report(
                    "attestation signed by another key",
                    "/v1/agent/attestations",
                    &attestation_by_other,
                ),
                401,
                "signature",
            ),
            expect_saying(
                report(
                    "event with an unknown state",
                    &events,
                    &json!({"epoch": lease["epoch"], "state": "exploded"}),
                ),
                400,
                "state",
            ),
            expect_saying(
                report(
                    "event at an old epoch",
                    &events,
                    &json!({"epoch": -1, "state": "running"}),
                ),
                409,
                "epoch",
            ),
            expect_saying(
                report(
                    "event with a NUL in its detail",
                    &events,
                    &json!({"epoch": lease["epoch"], "state": "running", "detail": "a\u{0}b"}),
                ),
                400,
                "detail",
            ),
            expect(
                report("event without an epoch", &events, &json!({"state": "running"})),
                400,
            ),
        ];
        check_refused(h, cases).await;
        for kind in ["bad_usage_signature", "bad_attestation_signature"] {
            assert!(
                h.has_evidence(holder.node_id, kind).await,
                "{}: {kind} is evidence",
                h.backend
            );
        }
        let view = h
            .get(&tenant.key, &format!("/v1/jobs/{job_id}"))
            .await
            .expect(200, "job");
        assert_eq!(view["state"], "running", "{}: {view}", h.backend);
        assert_eq!(view["leases"][0]["state"], "pending", "{}: {view}", h.backend);
        assert_eq!(view["cost_micros"], 0, "{}: nothing billed", h.backend);
        // A long detail is cut to what the coordinator stores, whatever follows the cut.
        let long_detail = format!("{}\u{0}", "d".repeat(200));
        let reported = holder
            .signed(
                "POST",
                &events,
                Some(&json!({"epoch": lease["epoch"], "state": "staging", "detail": long_detail})),
            )
            .await
            .expect(200, "an event with a long detail");
        assert_eq!(reported["end_reason"], "d".repeat(128), "{}: {reported}", h.backend);
        // The genuine record is still accepted: the refusals spent nothing of it.
        let accepted = holder
            .signed("POST", "/v1/agent/usage", Some(&holder.usage(&lease, 1, 1000)))
            .await
            .expect(200, "the genuine usage");
        assert_eq!(accepted["new"], true, "{}", h.backend);

        // Records no honest node signs: each is refused and kept as evidence, and three within
        // a day prove inflated usage (docs/trust-policy.md § 4): the holder is cordoned, its
        // lease ends and the job queues again.
        // (Sequence 2: the genuine record took 1.)
        let violating = |edit: &dyn Fn(&mut trust::UsageRecord)| -> Value {
            resigned(&|body| {
                body.sequence = 2;
                edit(body);
            })
        };
        let violations = vec![
            expect(
                report(
                    "usage from last year",
                    "/v1/agent/usage",
                    &violating(&|body| {
                        body.period_start_ms -= 365 * 86_400_000;
                        body.period_end_ms -= 365 * 86_400_000;
                    }),
                ),
                400,
            ),
            expect(
                report(
                    "usage in the far future",
                    "/v1/agent/usage",
                    &violating(&|body| body.period_end_ms = i64::MAX),
                ),
                400,
            ),
            expect_saying(
                report(
                    "usage over capacity",
                    "/v1/agent/usage",
                    &violating(&|body| body.gpu_seconds_milli = 5000),
                ),
                400,
                "more than",
            ),
            expect(
                report(
                    "usage i64::MAX",
                    "/v1/agent/usage",
                    &violating(&|body| body.gpu_seconds_milli = i64::MAX),
                ),
                400,
            ),
            expect_saying(
                report(
                    "usage for a lease that does not exist",
                    "/v1/agent/usage",
                    &violating(&|body| body.lease_id = 987_654_321),
                ),
                403,
                "recorded",
            ),
        ];
        check_refused(h, violations).await;
        for kind in ["usage_violation", "foreign_lease_record"] {
            assert!(
                h.has_evidence(holder.node_id, kind).await,
                "{}: {kind} is evidence",
                h.backend
            );
        }
        let frauds = h.get(&h.admin, "/v1/frauds").await.expect(200, "frauds");
        let frauds = frauds.as_array().expect("a list");
        assert_eq!(
            frauds.len(),
            1,
            "{}: one proof, however many records follow: {frauds:?}",
            h.backend
        );
        assert_eq!(frauds[0]["node_id"], holder.node_id, "{}", h.backend);
        assert_eq!(frauds[0]["kind"], "inflated_usage", "{}", h.backend);
        assert_eq!(frauds[0]["share_permille"], 250, "{}", h.backend);
        let view = h
            .get(&tenant.key, &format!("/v1/jobs/{job_id}"))
            .await
            .expect(200, "job");
        assert_eq!(view["leases"][0]["state"], "lost", "{}: {view}", h.backend);
        assert_eq!(view["state"], "queued", "{}: {view}", h.backend);
        let standing = h.get(&provider.key, "/v1/trust").await.expect(200, "trust");
        let cordoned: Vec<&Value> = standing["nodes"]
            .as_array()
            .expect("nodes")
            .iter()
            .filter(|node| node["fraud_cordoned_at_us"].is_i64())
            .collect();
        assert_eq!(cordoned.len(), 1, "{}: {standing}", h.backend);
        assert_eq!(cordoned[0]["node_id"], holder.node_id, "{}: only the holder", h.backend);
    })
    .await;
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// Key rotation (`POST /v1/agent/key`, signed by the node's current key) refuses a key that is
/// not one, the current key, another node's key, an unsigned request and extra fields; every
/// refusal leaves the old key working. After a rotation the old key is refused and cannot
/// rotate again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_key_rotations_are_refused_and_change_nothing() {
    on_every_backend(async |h: &Harness| {
        let provider = h.provider("gpu-farm").await;
        let node = h.node(&provider, "rotating", |_| {}).await;
        let other = h.node(&provider, "neighbour", |_| {}).await;
        let path = "/v1/agent/key";
        let rotation = |label: &str, body: Value| node.raw(label, "POST", path, Some(&body));
        let fresh = trust::NodeKey::generate().public_hex();
        let cases = vec![
            expect_saying(
                rotation("not hex", json!({"public_key": "zz".repeat(32)})),
                400,
                "public",
            ),
            expect_saying(
                rotation("too short", json!({"public_key": &fresh[..62]})),
                400,
                "public",
            ),
            expect_saying(rotation("empty", json!({"public_key": ""})), 400, "public"),
            expect(rotation("not a string", json!({"public_key": 7})), 400),
            expect(rotation("no key", json!({})), 400),
            expect(
                rotation("an unknown field", json!({"public_key": fresh, "private_key": "x"})),
                400,
            ),
            expect_saying(
                rotation("the current key", json!({"public_key": node.key.public_hex()})),
                400,
                "current key",
            ),
            expect(
                rotation("another node's key", json!({"public_key": other.key.public_hex()})),
                409,
            ),
            expect_saying(
                Raw::new("unsigned", "POST", path)
                    .json_bytes(serde_json::to_vec(&json!({"public_key": fresh})).unwrap()),
                401,
                "x-fallow-node",
            ),
        ];
        check_refused(h, cases).await;
        node.heartbeat().await;

        let new_key = trust::NodeKey::generate();
        let rotated = node
            .signed("POST", path, Some(&json!({"public_key": new_key.public_hex()})))
            .await
            .expect(200, "a good rotation");
        assert_eq!(rotated["public_key"], new_key.public_hex(), "{}", h.backend);
        // The old key no longer signs for the node, not even another rotation.
        h.wait_for("the old key to be refused", async || {
            let reply = node.signed("POST", "/v1/agent/heartbeat", Some(&json!({}))).await;
            (reply.status == 401).then_some(())
        })
        .await;
        let again = node.signed("POST", path, Some(&json!({"public_key": fresh}))).await;
        assert_eq!(again.status, 401, "{}: {}", h.backend, again.text);
        other.heartbeat().await;
    })
    .await;
}

/// A node over its request rate is refused with 429 and told when to come back (`Retry-After`,
/// which the agent's backoff takes as its floor); answers that went through name no wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_over_its_rate_is_told_when_to_come_back() {
    on_every_backend(async |h: &Harness| {
        let provider = h.provider("eager-farm").await;
        let node = h.node(&provider, "eager", |_| {}).await;
        let mut refused = None;
        for _ in 0..1_000 {
            let reply = node.signed("POST", "/v1/agent/heartbeat", Some(&json!({}))).await;
            if reply.status == 429 {
                refused = Some(reply);
                break;
            }
            assert_eq!(reply.status, 200, "a heartbeat within the rate: {}", reply.text);
            assert_eq!(reply.retry_after, None, "a 200 names no wait");
        }
        let refused = refused.expect("1,000 heartbeats at once exceed a node's rate");
        refused.refused(429, "a heartbeat over the rate");
        assert_eq!(
            refused.retry_after.as_deref(),
            Some("1"),
            "a 429 says when to come back"
        );
    })
    .await;
}
