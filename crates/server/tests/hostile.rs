//! Hostile input, on SQLite and on PostgreSQL: hundreds of malformed, oversized, mistyped,
//! unauthenticated and forged requests. Each must get the 4xx it deserves with the API's JSON
//! error body and a message that says something, never a 5xx, and must write nothing. Then a
//! seeded fuzz pass over every route, as every kind of caller, on an empty server and on one
//! with nodes and jobs in every state (`FALLOW_FUZZ_CASES`, `FALLOW_FUZZ_SEED` for longer or
//! other runs).

mod common;

use common::{Harness, Raw, Snapshot, job_request, now_ms, on_every_backend, run_until_placed};
use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, TestRunner};
use serde_json::{Value, json};

/// A hostile request and what must come back: the status, and words the message must contain.
struct Hostile {
    raw: Raw,
    status: u16,
    says: &'static str,
}

fn expect(raw: Raw, status: u16) -> Hostile {
    Hostile { raw, status, says: "" }
}

fn expect_saying(raw: Raw, status: u16, says: &'static str) -> Hostile {
    Hostile { raw, status, says }
}

/// Sends every request and fails once, listing each that got the wrong status, a body that is
/// not the API's error body, or a message without the expected words.
async fn check_refused(h: &Harness, cases: Vec<Hostile>) {
    let mut wrong = Vec::new();
    for case in &cases {
        let reply = h.send_raw(&case.raw).await;
        let label = format!("{} ({} {})", case.raw.label, case.raw.method, case.raw.path);
        if reply.status >= 500 {
            wrong.push(format!("{label}: SERVER ERROR {}: {}", reply.status, reply.text));
            continue;
        }
        if reply.status != case.status {
            wrong.push(format!(
                "{label}: got {} (want {}): {}",
                reply.status, case.status, reply.text
            ));
            continue;
        }
        match reply.error_shape() {
            Ok(message) if message.to_lowercase().contains(&case.says.to_lowercase()) => {}
            Ok(message) => wrong.push(format!("{label}: message {message:?} does not say {:?}", case.says)),
            Err(problem) => wrong.push(format!("{label}: {problem}: {}", reply.text)),
        }
    }
    assert!(
        wrong.is_empty(),
        "{}: {} of {} hostile requests answered wrongly:\n{}",
        h.backend,
        wrong.len(),
        cases.len(),
        wrong.join("\n")
    );
}

fn with(field: &str, value: Value) -> Value {
    let mut job = job_request("hostile");
    job[field] = value;
    job
}

fn without(field: &str) -> Value {
    let mut job = job_request("hostile");
    job.as_object_mut().expect("an object").remove(field);
    job
}

/// A job submission with these exact body bytes.
fn submit_bytes(key: &str, label: &str, body: impl Into<Vec<u8>>) -> Raw {
    Raw::new(label, "POST", "/v1/jobs").bearer(key).json_bytes(body)
}

fn submit(key: &str, label: &str, body: &Value) -> Raw {
    Raw::new(label, "POST", "/v1/jobs").bearer(key).json(body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn malformed_job_submissions_get_a_precise_400() {
    on_every_backend(async |h: &Harness| {
        let tenant = h.tenant("acme").await;
        h.credit(&tenant, "100.00").await;
        let k = tenant.key.as_str();
        let valid = serde_json::to_vec(&job_request("ok")).unwrap();
        let mut cases = vec![
            // Not JSON, or not an object.
            expect_saying(submit_bytes(k, "empty body", ""), 400, "JSON"),
            expect_saying(submit_bytes(k, "truncated", r#"{"image": "#), 400, "JSON"),
            expect_saying(submit_bytes(k, "prose", "please run my job"), 400, "JSON"),
            expect(submit_bytes(k, "null", "null"), 400),
            expect(submit_bytes(k, "array", "[]"), 400),
            expect(submit_bytes(k, "number", "42"), 400),
            expect(submit_bytes(k, "string", r#""job""#), 400),
            expect(
                submit_bytes(k, "trailing garbage", [valid.as_slice(), b"}}"].concat()),
                400,
            ),
            expect(
                submit_bytes(k, "two documents", [valid.as_slice(), valid.as_slice()].concat()),
                400,
            ),
            expect(submit_bytes(k, "deep nesting", "[".repeat(100_000)), 400),
            expect(
                submit_bytes(k, "invalid UTF-8", b"{\"image\": \"\xff\xfe\"}".to_vec()),
                400,
            ),
            expect(submit_bytes(k, "single quotes", "{'image': 'busybox'}"), 400),
            expect(
                submit_bytes(k, "comment", [b"/* hi */".as_slice(), valid.as_slice()].concat()),
                400,
            ),
            expect_saying(
                submit_bytes(
                    k,
                    "duplicate field",
                    r#"{"image": "a", "image": "b", "tier": "silver", "max_price_per_gpu_hour": "2"}"#,
                ),
                400,
                "duplicate",
            ),
            // Wrong types.
            expect_saying(
                submit(k, "image a number", &with("image", json!(5))),
                400,
                "invalid type",
            ),
            expect_saying(
                submit(k, "gpus a word", &with("gpus", json!("two"))),
                400,
                "invalid type",
            ),
            expect(submit(k, "gpus a fraction", &with("gpus", json!(1.5))), 400),
            expect(submit(k, "command a string", &with("command", json!("sleep 1"))), 400),
            expect(submit(k, "command of numbers", &with("command", json!([1, 2]))), 400),
            expect(submit(k, "env a list", &with("env", json!(["A=1"]))), 400),
            expect(submit(k, "env of numbers", &with("env", json!({"A": 1}))), 400),
            expect(submit(k, "tier a number", &with("tier", json!(1))), 400),
            expect(
                submit(k, "price a number", &with("max_price_per_gpu_hour", json!(2.5))),
                400,
            ),
            expect(submit(k, "preemptible a word", &with("preemptible", json!("yes"))), 400),
            expect(
                submit(k, "reliability a word", &with("min_reliability", json!("high"))),
                400,
            ),
            expect(submit(k, "regions a string", &with("regions", json!("eu-west"))), 400),
            expect(submit(k, "datasets an object", &with("datasets", json!({}))), 400),
            expect(submit(k, "client a list", &with("client", json!([1, 2]))), 400),
            expect(submit(k, "image null", &with("image", Value::Null)), 400),
            // Unknown and missing fields.
            expect_saying(
                submit(k, "unknown field", &with("surprise", json!(true))),
                400,
                "unknown field",
            ),
            expect_saying(
                submit(k, "field in the wrong case", &with("GPUs", json!(1))),
                400,
                "unknown field",
            ),
            expect_saying(
                submit(
                    k,
                    "unknown field in a dataset",
                    &with(
                        "datasets",
                        json!([{"url": "https://x", "digest": "sha256:00", "size_bytes": 1, "mirror": "y"}]),
                    ),
                ),
                400,
                "unknown field",
            ),
            expect_saying(
                submit(
                    k,
                    "unknown field in client",
                    &with(
                        "client",
                        json!({"latitude": 1.0, "longitude": 1.0, "latency_target_ms": 5, "ip": "1.2.3.4"}),
                    ),
                ),
                400,
                "unknown field",
            ),
            expect_saying(submit(k, "no image", &without("image")), 400, "image"),
            expect_saying(submit(k, "no tier", &without("tier")), 400, "tier"),
            expect_saying(
                submit(k, "no price", &without("max_price_per_gpu_hour")),
                400,
                "max_price_per_gpu_hour",
            ),
            expect(submit(k, "empty object", &json!({})), 400),
            // Absurd numbers.
            expect(submit(k, "300 GPUs", &with("gpus", json!(300))), 400),
            expect_saying(submit(k, "17 GPUs", &with("gpus", json!(17))), 400, "gpus"),
            expect_saying(submit(k, "0 GPUs", &with("gpus", json!(0))), 400, "gpus"),
            expect(submit(k, "-1 GPUs", &with("gpus", json!(-1))), 400),
            expect_saying(submit(k, "0 replicas", &with("replicas", json!(0))), 400, "replicas"),
            expect_saying(
                submit(k, "4097 replicas", &with("replicas", json!(4097))),
                400,
                "replicas",
            ),
            expect(submit(k, "2^40 replicas", &with("replicas", json!(1u64 << 40))), 400),
            expect_saying(
                submit(k, "runtime 0", &with("max_runtime_s", json!(0))),
                400,
                "max_runtime_s",
            ),
            expect_saying(
                submit(k, "runtime 31 days", &with("max_runtime_s", json!(31 * 86_400))),
                400,
                "max_runtime_s",
            ),
            expect(submit(k, "runtime negative", &with("max_runtime_s", json!(-5))), 400),
            expect_saying(
                submit(k, "reliability 1.5", &with("min_reliability", json!(1.5))),
                400,
                "min_reliability",
            ),
            expect_saying(
                submit(k, "reliability -0.1", &with("min_reliability", json!(-0.1))),
                400,
                "min_reliability",
            ),
            expect(
                submit_bytes(
                    k,
                    "reliability 1e400",
                    r#"{"image": "a", "tier": "silver", "max_price_per_gpu_hour": "2", "min_reliability": 1e400}"#,
                ),
                400,
            ),
            expect_saying(
                submit(k, "share 1000", &with("gpu_share_milli", json!(1000))),
                400,
                "gpu_share_milli",
            ),
            expect_saying(
                submit(k, "compute units 0", &with("compute_units", json!("0"))),
                400,
                "compute_units",
            ),
            expect_saying(
                submit(k, "compute units 65", &with("compute_units", json!("65"))),
                400,
                "compute_units",
            ),
            expect_saying(
                submit(k, "gpus and a share", &with("gpu_share_milli", json!(500))),
                400,
                "at most one",
            ),
            expect(submit(k, "memory negative", &with("memory_mib", json!(-1))), 400),
            expect(submit(k, "cpu 1e20", &with("cpu_milli", json!(1e20))), 400),
            expect_saying(
                submit(
                    k,
                    "latency 0",
                    &with(
                        "client",
                        json!({"latitude": 1.0, "longitude": 1.0, "latency_target_ms": 0}),
                    ),
                ),
                400,
                "latency",
            ),
            expect_saying(
                submit(
                    k,
                    "latitude 91",
                    &with(
                        "client",
                        json!({"latitude": 91.0, "longitude": 1.0, "latency_target_ms": 5}),
                    ),
                ),
                400,
                "latitude",
            ),
        ];
        for price in [
            "-1",
            "1e9",
            "NaN",
            "",
            "0",
            "1000.000001",
            "abc",
            "1,000",
            "2.5.0",
            "99999999999999999999",
            "0.0000001",
            " ",
        ] {
            cases.push(expect_saying(
                submit(
                    k,
                    &format!("price {price:?}"),
                    &with("max_price_per_gpu_hour", json!(price)),
                ),
                400,
                "max_price_per_gpu_hour",
            ));
        }
        let long = "x".repeat(api::TEXT_FIELD_BYTES_MAX + 1);
        for (label, field, value, says) in [
            ("empty image", "image", json!(""), "image"),
            ("blank image", "image", json!("   "), "image"),
            ("long image", "image", json!(long), "image"),
            ("image with NUL", "image", json!("busy\u{0}box"), "NUL"),
            ("long name", "name", json!(long), "name"),
            ("257 arguments", "command", json!(vec!["a"; 257]), "command"),
            ("long argument", "command", json!([long]), "command"),
            ("env name with =", "env", json!({"A=B": "1"}), "env"),
            ("env name empty", "env", json!({"": "1"}), "env"),
            ("empty client token", "client_token", json!(""), "client_token"),
            (
                "long client token",
                "client_token",
                json!("t".repeat(129)),
                "client_token",
            ),
            (
                "client token with NUL",
                "client_token",
                json!("retry\u{0}1"),
                "client_token",
            ),
            (
                "checkpoint outside",
                "checkpoint_dir",
                json!("/ckpt/../../etc"),
                "checkpoint_dir",
            ),
            ("checkpoint relative", "checkpoint_dir", json!("ckpt"), "checkpoint_dir"),
            ("host network", "network", json!("host"), "network"),
            ("galaxy topology", "topology", json!("galaxy"), "topology"),
            ("platinum tier", "tier", json!("platinum"), "tier"),
            ("mining class", "class", json!("mining"), "class"),
            ("unknown GPU", "gpu_models", json!(["Voodoo2"]), "gpu_models"),
            ("33 regions", "regions", json!(vec!["eu"; 33]), "regions"),
            (
                "dataset by ftp",
                "datasets",
                json!([{"url": "ftp://x/y", "digest": format!("sha256:{}", "0".repeat(64)), "size_bytes": 1}]),
                "datasets.url",
            ),
            (
                "dataset without digest",
                "datasets",
                json!([{"url": "https://x/y", "digest": "md5:abc", "size_bytes": 1}]),
                "datasets.digest",
            ),
        ] {
            cases.push(expect_saying(submit(k, label, &with(field, value)), 400, says));
        }
        let count = cases.len();
        assert!(count > 90, "{count} cases");
        let before = h.snapshot().await;
        check_refused(h, cases).await;
        assert_eq!(
            h.snapshot().await,
            before,
            "{}: refused submissions wrote nothing",
            h.backend
        );
        // The same tenant's valid job goes through, so the refusals were about the bodies.
        h.submit(&tenant, job_request("fine")).await;
        assert_eq!(h.job_count().await as i64, before.jobs + 1, "{}", h.backend);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn oversized_and_mistyped_bodies_are_refused() {
    on_every_backend(async |h: &Harness| {
        let tenant = h.tenant("acme").await;
        let provider = h.provider("gpu-farm").await;
        h.credit(&tenant, "100.00").await;
        let agent = h.node(&provider, "node1", |_| {}).await;
        let limit = api::REQUEST_BODY_BYTES_MAX;
        // A job whose name pads the body to exactly `size` bytes.
        let padded = |size: usize| -> Vec<u8> {
            let head = br#"{"image": "busybox", "tier": "silver", "max_price_per_gpu_hour": "2", "name": ""#;
            let tail = br#""}"#;
            let mut body = head.to_vec();
            body.resize(size - tail.len(), b'a');
            body.extend_from_slice(tail);
            body
        };
        let (t, p) = (tenant.key.as_str(), provider.key.as_str());
        let valid_job = serde_json::to_vec(&job_request("typed")).unwrap();
        let huge = vec![b' '; limit + 1];
        let node_path = format!("/v1/nodes/{}/policy", agent.node_id);
        let mut heartbeat = agent.raw("oversized heartbeat", "POST", "/v1/agent/heartbeat", None);
        heartbeat.headers = agent.headers("POST", "/v1/agent/heartbeat", &huge);
        let heartbeat = heartbeat.json_bytes(huge.clone());
        let cases = vec![
            // At the limit the body is read (and refused for its content); one byte over, not read.
            expect_saying(
                submit_bytes(t, "a body of exactly the limit", padded(limit)),
                400,
                "name",
            ),
            expect_saying(
                submit_bytes(t, "one byte over the limit", padded(limit + 1)),
                413,
                "larger than",
            ),
            expect(submit_bytes(t, "a megabyte", padded(1 << 20)), 413),
            expect(
                Raw::new("oversized quote", "POST", "/v1/jobs/quote")
                    .bearer(t)
                    .json_bytes(huge.clone()),
                413,
            ),
            expect(
                Raw::new("oversized node", "POST", "/v1/nodes")
                    .bearer(p)
                    .json_bytes(huge.clone()),
                413,
            ),
            expect(
                Raw::new("oversized policy", "PUT", node_path.as_str())
                    .bearer(p)
                    .json_bytes(huge.clone()),
                413,
            ),
            expect(
                Raw::new("oversized account", "POST", "/v1/admin/accounts")
                    .bearer(&h.admin)
                    .json_bytes(huge.clone()),
                413,
            ),
            expect(heartbeat, 413),
            // Not JSON by its content type.
            expect_saying(
                Raw::new("text/plain", "POST", "/v1/jobs")
                    .bearer(t)
                    .header("content-type", "text/plain")
                    .body(valid_job.clone()),
                415,
                "application/json",
            ),
            expect(
                Raw::new("form", "POST", "/v1/jobs")
                    .bearer(t)
                    .header("content-type", "application/x-www-form-urlencoded")
                    .body(b"image=busybox".to_vec()),
                415,
            ),
            expect(
                Raw::new("multipart", "POST", "/v1/nodes")
                    .bearer(p)
                    .header("content-type", "multipart/form-data; boundary=x"),
                415,
            ),
            expect(
                Raw::new("binary content type", "POST", "/v1/admin/accounts")
                    .bearer(&h.admin)
                    .header("content-type", b"\xff\xfe".as_slice()),
                415,
            ),
            expect(
                agent
                    .raw("signed text/plain", "POST", "/v1/agent/heartbeat", Some(&json!({})))
                    .header("content-type", "text/plain"),
                415,
            ),
        ];
        let before = h.snapshot().await;
        check_refused(h, cases).await;
        assert_eq!(h.snapshot().await, before, "{}: nothing written", h.backend);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_paths_methods_and_queries_are_refused() {
    on_every_backend(async |h: &Harness| {
        let tenant = h.tenant("acme").await;
        let provider = h.provider("gpu-farm").await;
        let agent = h.node(&provider, "node1", |_| {}).await;
        let (t, p) = (tenant.key.as_str(), provider.key.as_str());
        let get = |label: &str, key: &str, path: &str| Raw::new(label, "GET", path).bearer(key);
        let mut cases = Vec::new();
        for (id, status) in [
            ("abc", 400),
            ("-1", 404),
            ("0", 404),
            ("99999999999999999999", 400),
            ("1.5", 400),
            ("1e3", 400),
            ("%00", 400),
            ("%F0%9F%92%A3", 400),
            ("9223372036854775807", 404),
        ] {
            cases.push(expect(
                get(&format!("job id {id}"), t, &format!("/v1/jobs/{id}")),
                status,
            ));
            cases.push(expect(
                Raw::new(format!("cancel job {id}"), "POST", format!("/v1/jobs/{id}/cancel")).bearer(t),
                status,
            ));
            cases.push(expect(
                get(&format!("node id {id}"), p, &format!("/v1/nodes/{id}")),
                status,
            ));
            cases.push(expect(
                get(&format!("keys of account {id}"), p, &format!("/v1/accounts/{id}/keys")),
                status,
            ));
        }
        let signed_bad_id = agent.raw(
            "event for lease abc",
            "POST",
            "/v1/agent/leases/abc/events",
            Some(&json!({"epoch": 1, "state": "running"})),
        );
        cases.extend([
            expect_saying(get("a job id that is not a number", t, "/v1/jobs/abc"), 400, "abc"),
            expect(
                Raw::new("policy of node abc", "PUT", "/v1/nodes/abc/policy")
                    .bearer(p)
                    .json(&json!({"asks": {"gold": "1"}})),
                400,
            ),
            expect(signed_bad_id, 400),
            expect(
                Raw::new("revoke an unknown key", "POST", "/v1/keys/000000000000/revoke").bearer(t),
                404,
            ),
            expect(get("no such endpoint", t, "/v1/nope"), 404),
            expect(get("no such endpoint, no key", "", "/v2/jobs"), 404),
            // Wrong methods.
            expect(Raw::new("DELETE jobs", "DELETE", "/v1/jobs").bearer(t), 405),
            expect(Raw::new("PATCH a job", "PATCH", "/v1/jobs/1").bearer(t), 405),
            expect(Raw::new("GET cancel", "GET", "/v1/jobs/1/cancel").bearer(t), 405),
            expect(Raw::new("PUT heartbeat", "PUT", "/v1/agent/heartbeat"), 405),
            // Bad queries.
            expect_saying(get("limit 0", t, "/v1/jobs?limit=0"), 400, "limit"),
            expect_saying(get("limit 501", t, "/v1/jobs?limit=501"), 400, "limit"),
            expect(get("limit a word", t, "/v1/jobs?limit=ten"), 400),
            expect(get("limit huge", t, "/v1/jobs?limit=99999999999999999999"), 400),
            expect(get("before a word", t, "/v1/jobs?before=yesterday"), 400),
            expect(get("unknown query field", t, "/v1/jobs?sort=desc"), 400),
            expect(get("offers limit negative", t, "/v1/offers?limit=-1"), 400),
            expect(get("offers filter invalid UTF-8", t, "/v1/offers?filter=%FF"), 400),
            expect_saying(
                get("offers filter garbage", t, "/v1/offers?filter=%3C%3C%3C"),
                400,
                "filter",
            ),
            expect(
                get(
                    "offers filter with 400 clauses",
                    t,
                    &format!("/v1/offers?filter={}", "a%3D1%20".repeat(400)),
                ),
                400,
            ),
            expect(get("balance of account abc", t, "/v1/balance?account_id=abc"), 400),
            expect(
                Raw::new("market bucket a word", "GET", "/v1/market?bucket_s=hourly"),
                400,
            ),
            expect(
                agent.raw("lease poll wait a word", "GET", "/v1/agent/leases?wait_ms=long", None),
                400,
            ),
        ]);
        let before = h.snapshot().await;
        check_refused(h, cases).await;
        assert_eq!(h.snapshot().await, before, "{}: nothing written", h.backend);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_api_keys_get_401() {
    on_every_backend(async |h: &Harness| {
        let tenant = h.tenant("acme").await;
        let revoked = h.tenant("gone").await;
        h.call(
            "POST",
            &format!("/v1/keys/{}/revoke", revoked.key_id),
            Some(&revoked.key),
            None,
        )
        .await
        .expect(204, "revoke own key");
        let secret = tenant.key.rsplit('_').next().unwrap().to_string();
        let unknown = trust::generate_api_key().display;
        let wrong_secret = format!("fallow_{}_{}", tenant.key_id, "0".repeat(64));
        let with_header = |label: &str, value: &[u8]| Raw::new(label, "GET", "/v1/jobs").header("authorization", value);
        let mut cases = vec![
            expect_saying(Raw::new("no header", "GET", "/v1/jobs"), 401, "Authorization"),
            expect(with_header("Bearer alone", b"Bearer"), 401),
            expect(with_header("Bearer and a space", b"Bearer "), 401),
            expect(with_header("Basic", b"Basic dXNlcjpwYXNz"), 401),
            expect(
                with_header("lowercase bearer", format!("bearer {}", tenant.key).as_bytes()),
                401,
            ),
            expect(with_header("garbage", b"Bearer garbage"), 401),
            expect_saying(
                with_header("wrong prefix", format!("Bearer sk_live_{secret}").as_bytes()),
                401,
                "fallow_",
            ),
            expect(
                with_header("truncated", format!("Bearer {}", &tenant.key[..40]).as_bytes()),
                401,
            ),
            expect(
                with_header("one character more", format!("Bearer {}0", tenant.key).as_bytes()),
                401,
            ),
            expect(
                with_header("uppercase", format!("Bearer {}", tenant.key.to_uppercase()).as_bytes()),
                401,
            ),
            expect_saying(
                with_header("unknown key", format!("Bearer {unknown}").as_bytes()),
                401,
                "unknown or revoked",
            ),
            expect_saying(
                with_header("wrong secret", format!("Bearer {wrong_secret}").as_bytes()),
                401,
                "does not match",
            ),
            expect_saying(
                with_header("revoked key", format!("Bearer {}", revoked.key).as_bytes()),
                401,
                "revoked",
            ),
            expect(with_header("not text", b"Bearer \xff\xfe"), 401),
            expect(
                with_header("very long", format!("Bearer {}", "a".repeat(16_000)).as_bytes()),
                401,
            ),
        ];
        for (method, path) in [
            ("POST", "/v1/jobs"),
            ("POST", "/v1/nodes"),
            ("GET", "/v1/balance"),
            ("POST", "/v1/admin/accounts"),
            ("POST", "/v1/admin/credits"),
            ("POST", "/v1/keys/rotate"),
        ] {
            cases.push(expect(
                Raw::new(format!("unknown key on {path}"), method, path)
                    .bearer(&unknown)
                    .json(&json!({})),
                401,
            ));
        }
        let before = h.snapshot().await;
        let replies: Vec<String> = {
            let mut texts = Vec::new();
            for case in &cases {
                texts.push(h.send_raw(&case.raw).await.text);
            }
            texts
        };
        for text in replies {
            assert!(
                !text.contains(&secret),
                "{}: a refusal repeats the secret: {text}",
                h.backend
            );
        }
        check_refused(h, cases).await;
        assert_eq!(h.snapshot().await, before, "{}: nothing written", h.backend);
        h.get(&tenant.key, "/v1/jobs")
            .await
            .expect(200, "the real key still works");
    })
    .await;
}

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
                400,
                "missing",
            ),
            expect(remove(signed("no timestamp", now), trust::HEADER_TIMESTAMP), 400),
            expect(remove(signed("no nonce", now), trust::HEADER_NONCE), 400),
            expect(remove(signed("no signature", now), trust::HEADER_SIGNATURE), 400),
            expect(remove(signed("no node", now), trust::HEADER_NODE), 400),
            expect(
                replace(signed("node not a number", now), trust::HEADER_NODE, b"node-1"),
                400,
            ),
            expect(
                replace(signed("timestamp not a number", now), trust::HEADER_TIMESTAMP, b"soon"),
                400,
            ),
            expect_saying(
                replace(signed("unregistered node", now), trust::HEADER_NODE, b"987654321"),
                401,
                "not registered",
            ),
            expect(
                replace(signed("nonce too short", now), trust::HEADER_NONCE, b"abc"),
                400,
            ),
            expect(
                replace(
                    signed("nonce uppercase", now),
                    trust::HEADER_NONCE,
                    b"00112233445566778899AABBCCDDEEFF",
                ),
                400,
            ),
            expect(
                replace(signed("signature not hex", now), trust::HEADER_SIGNATURE, b"zz"),
                400,
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn malformed_provider_and_admin_bodies_are_refused() {
    on_every_backend(async |h: &Harness| {
        let tenant = h.tenant("acme").await;
        let provider = h.provider("gpu-farm").await;
        let agent = h.node(&provider, "node1", |_| {}).await;
        let p = provider.key.as_str();
        let a = h.admin.as_str();
        let node = |label: &str, edit: &dyn Fn(&mut Value)| -> Raw {
            let mut registration = common::node_registration(&trust::NodeKey::generate(), "new-node");
            edit(&mut registration);
            Raw::new(label, "POST", "/v1/nodes").bearer(p).json(&registration)
        };
        let policy_path = format!("/v1/nodes/{}/policy", agent.node_id);
        let policy = |label: &str, body: Value| Raw::new(label, "PUT", policy_path.as_str()).bearer(p).json(&body);
        let account = |label: &str, body: Value| Raw::new(label, "POST", "/v1/admin/accounts").bearer(a).json(&body);
        let credit = |label: &str, body: Value| Raw::new(label, "POST", "/v1/admin/credits").bearer(a).json(&body);
        let mut cases = vec![
            expect_saying(node("no name", &|n| n["name"] = json!("")), 400, "name"),
            expect_saying(node("name with a newline", &|n| n["name"] = json!("a\nb")), 400, "name"),
            expect_saying(node("name too long", &|n| n["name"] = json!("n".repeat(200))), 400, "name"),
            expect_saying(node("region with NUL", &|n| n["region"] = json!("eu\u{0}")), 400, "region"),
            expect_saying(node("unknown GPU", &|n| n["gpu_model"] = json!("Voodoo2")), 400, "gpu_model"),
            expect_saying(node("0 GPUs", &|n| n["gpu_count"] = json!(0)), 400, "gpu_count"),
            expect_saying(node("17 GPUs", &|n| n["gpu_count"] = json!(17)), 400, "gpu_count"),
            expect(node("300 GPUs", &|n| n["gpu_count"] = json!(300)), 400),
            expect_saying(node("public key not hex", &|n| n["public_key"] = json!("z".repeat(64))), 400, "key"),
            expect_saying(node("public key short", &|n| n["public_key"] = json!("abcd")), 400, "key"),
            expect_saying(node("weak public key", &|n| n["public_key"] = json!(format!("01{}", "0".repeat(62)))), 400, "key"),
            expect_saying(node("latitude 91", &|n| n["latitude"] = json!(91.0)), 400, "latitude"),
            expect_saying(node("no CPU", &|n| n["cpu_milli"] = json!(0)), 400, "cpu_milli"),
            expect_saying(node("memory 2^41", &|n| n["memory_mib"] = json!(1u64 << 41)), 400, "memory_mib"),
            expect_saying(node("no asks", &|n| n["policy"] = json!({"asks": {}})), 400, "asks"),
            expect_saying(node("negative ask", &|n| n["policy"] = json!({"asks": {"gold": "-1"}})), 400, "gold"),
            expect_saying(node("unknown field", &|n| n["colour"] = json!("red")), 400, "unknown field"),
            expect(node("no policy", &|n| {
                n.as_object_mut().unwrap().remove("policy");
            }), 400),
            expect_saying(policy("no asks", json!({"asks": {}})), 400, "asks"),
            expect_saying(policy("platinum ask", json!({"asks": {"platinum": "1"}})), 400, "tier"),
            expect_saying(policy("ask 1e3", json!({"asks": {"gold": "1e3"}})), 400, "gold"),
            expect_saying(policy("day 9", json!({"asks": {"gold": "1"}, "windows": [{"days": [9], "start_minute": 0, "end_minute": 10}]})), 400, "day 9"),
            expect(policy("half a window", json!({"asks": {"gold": "1"}, "windows": [{"start_minute": 10}]})), 400),
            expect(policy("multiplier 5", json!({"asks": {"gold": "1"}, "price_rules": [{"start_minute": 0, "end_minute": 10, "multiplier_permille": 5}]})), 400),
            expect(policy("policy a list", json!([])), 400),
            expect_saying(account("role god", json!({"role": "god", "name": "zeus"})), 400, "role"),
            expect_saying(account("empty name", json!({"role": "tenant", "name": ""})), 400, "name"),
            expect_saying(account("name with a tab", json!({"role": "tenant", "name": "a\tb"})), 400, "name"),
            expect_saying(account("taken name", json!({"role": "tenant", "name": "acme"})), 409, "already exists"),
            expect(account("no role", json!({"name": "x"})), 400),
            expect(account("extra field", json!({"role": "tenant", "name": "x", "balance": 100})), 400),
            expect_saying(credit("to a provider", json!({"account_id": provider.id, "amount": "5", "key": "k1"})), 400, "not a tenant"),
            expect_saying(credit("to nobody", json!({"account_id": 987_654_321, "amount": "5", "key": "k2"})), 404, "not found"),
            expect_saying(credit("empty key", json!({"account_id": tenant.id, "amount": "5", "key": ""})), 400, "key"),
            expect(credit("account id a word", json!({"account_id": "acme", "amount": "5", "key": "k3"})), 400),
            expect(credit("amount a number", json!({"account_id": tenant.id, "amount": 5, "key": "k4"})), 400),
            expect_saying(
                Raw::new("key label with a newline", "POST", format!("/v1/accounts/{}/keys", provider.id))
                    .bearer(p)
                    .json(&json!({"label": "a\nb"})),
                400,
                "label",
            ),
        ];
        for amount in ["-5", "0", "1e3", "abc", "10000000.000001", "", "NaN", "0.0000001"] {
            cases.push(expect_saying(
                credit(&format!("credit {amount:?}"), json!({"account_id": tenant.id, "amount": amount, "key": "k5"})),
                400,
                "amount",
            ));
        }
        let before = h.snapshot().await;
        let policy_before = h.get(p, &format!("/v1/nodes/{}", agent.node_id)).await.expect(200, "node")["policy"].clone();
        check_refused(h, cases).await;
        assert_eq!(h.snapshot().await, before, "{}: nothing written", h.backend);
        let policy_after = h.get(p, &format!("/v1/nodes/{}", agent.node_id)).await.expect(200, "node")["policy"].clone();
        assert_eq!(policy_after, policy_before, "{}", h.backend);
        let keys = h.get(p, &format!("/v1/accounts/{}/keys", provider.id)).await.expect(200, "keys");
        assert_eq!(keys.as_array().map(Vec::len), Some(1), "{}", h.backend);
        let money = h.get(&tenant.key, "/v1/balance").await.expect(200, "balance");
        assert_eq!(money["available_micros"], 0, "{}", h.backend);
    })
    .await;
}

/// The JSON values a fuzzer sends: scalars that sit on the limits, and small nested values.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        prop_oneof![
            Just(0i64),
            Just(-1),
            Just(1),
            Just(16),
            Just(17),
            Just(255),
            Just(256),
            Just(999),
            Just(1000)
        ]
        .prop_map(Value::from),
        (-1e12f64..1e12).prop_map(Value::from),
        "[a-z0-9 .:/_=-]{0,12}".prop_map(Value::from),
        prop_oneof![
            Just("2.50"),
            Just("-1"),
            Just("1e9"),
            Just("NaN"),
            Just("silver"),
            Just("bronze"),
            Just("H100-SXM5"),
            Just("/ckpt"),
            Just("bridge"),
            Just("retry\u{0}"),
            Just("")
        ]
        .prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map("[a-z_]{1,10}", inner, 0..4)
                .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

const JOB_FIELDS: &[&str] = &[
    "name",
    "image",
    "command",
    "env",
    "gpus",
    "gpu_share_milli",
    "compute_units",
    "gpu_models",
    "gpu_memory_mib_min",
    "cpu_milli",
    "memory_mib",
    "replicas",
    "topology",
    "tier",
    "class",
    "max_price_per_gpu_hour",
    "preemptible",
    "regions",
    "datasets",
    "client",
    "min_reliability",
    "max_runtime_s",
    "checkpoint_interval_s",
    "checkpoint_dir",
    "network",
    "client_token",
    "surprise",
];

/// A job body: any JSON value, or (mostly) a valid job with a few fields replaced or removed.
fn job_body() -> impl Strategy<Value = Value> {
    let edits = prop::collection::vec((0..JOB_FIELDS.len(), prop::option::weighted(0.8, json_value())), 1..4);
    prop_oneof![
        1 => json_value(),
        3 => edits.prop_map(|edits| {
            let mut job = job_request("random");
            for (field, value) in edits {
                match value {
                    Some(value) => job[JOB_FIELDS[field]] = value,
                    None => {
                        job.as_object_mut().expect("an object").remove(JOB_FIELDS[field]);
                    }
                }
            }
            job
        }),
    ]
}

/// Whether the coordinator must accept this body: exactly when the wire type parses it and
/// its checks pass (the tenant has money, so nothing else can refuse it).
fn acceptable(body: &Value) -> bool {
    serde_json::from_value::<api::JobRequest>(body.clone())
        .ok()
        .is_some_and(|request| request.to_spec(0, 1, 0, |_| None).is_ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn random_job_bodies_get_201_or_a_400_never_a_5xx() {
    on_every_backend(async |h: &Harness| {
        let tenant = h.tenant("fuzzer").await;
        h.credit(&tenant, "1000.00").await;
        let before: Snapshot = h.snapshot().await;
        let accepted = std::sync::Mutex::new(std::collections::BTreeSet::new());
        let refused = std::sync::atomic::AtomicU32::new(0);
        let mut runner = TestRunner::new(ProptestConfig {
            cases: 150,
            failure_persistence: None,
            ..ProptestConfig::default()
        });
        let handle = tokio::runtime::Handle::current();
        let outcome = tokio::task::block_in_place(|| {
            runner.run(&job_body(), |body| {
                let reply = handle
                    .block_on(h.send_raw(&Raw::new("random", "POST", "/v1/jobs").bearer(&tenant.key).json(&body)));
                let want = if acceptable(&body) { 201 } else { 400 };
                prop_assert_eq!(reply.status, want, "body {} answered {}", body, reply.text);
                if want == 201 {
                    accepted
                        .lock()
                        .unwrap()
                        .insert(reply.body["id"].as_i64().expect("a job id"));
                } else {
                    refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let shaped = reply.error_shape();
                    prop_assert!(
                        shaped.is_ok(),
                        "body {} got a malformed refusal ({:?}): {}",
                        body,
                        shaped,
                        reply.text
                    );
                }
                Ok(())
            })
        });
        if let Err(failure) = outcome {
            panic!("{}: {failure}", h.backend);
        }
        let accepted = accepted.into_inner().unwrap().len() as i64;
        let refused = refused.into_inner();
        // Both sides of the oracle were exercised (proptest also counts the cases it shrank).
        assert!(
            accepted > 0 && refused > 0,
            "{}: {accepted} accepted, {refused} refused",
            h.backend
        );
        eprintln!(
            "{}: random job bodies: {accepted} accepted, {refused} refused",
            h.backend
        );
        assert_eq!(
            h.job_count().await as i64,
            before.jobs + accepted,
            "{}: exactly the accepted bodies made jobs",
            h.backend
        );
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
                400,
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

// A populated market under a seeded fuzz pass: every route, as every kind of caller, with
// random ids, queries and bodies, first on a server with only accounts, then on one with nodes
// in several regions (online and offline) and jobs in every state. The tables above aim at one
// route each on a nearly empty server; this pass reaches the handlers that only run when there
// is something to find (a queued job's explanation, a lease's reports, a node's pages).

/// Random requests per backend on the populated server (a quarter of that on the empty one);
/// `FALLOW_FUZZ_CASES` asks for a longer run, `FALLOW_FUZZ_SEED` for another seed.
const FUZZ_CASES_DEFAULT: usize = 1200;
const FUZZ_SEED_DEFAULT: u64 = 17;
/// Requests between two readings of what the coordinator holds.
const FUZZ_BATCH: usize = 20;
/// Longer than an agent's long poll (30 s): a request still unanswered then hung.
const FUZZ_REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(40);
/// Bodies larger than this go on a connection of their own (see [`Fuzzer::send`]).
const UNREAD_BODY_BYTES: usize = 16 * 1024;
/// Failures listed in full when the pass fails (all are counted).
const FUZZ_FAILURES_SHOWN: usize = 40;

/// Who sends a fuzzed request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sender {
    Anonymous,
    Tenant,
    Provider,
    Admin,
    /// Signed by the node that holds the market's leases.
    Agent,
    /// Signed by a registered node that never heartbeats.
    OfflineAgent,
    /// A well-formed API key that does not exist, and agent headers signed by a stranger's key
    /// in the name of the market's busiest node.
    Forger,
}

const SENDERS: [Sender; 7] = [
    Sender::Anonymous,
    Sender::Tenant,
    Sender::Provider,
    Sender::Admin,
    Sender::Agent,
    Sender::OfflineAgent,
    Sender::Forger,
];

/// The accounts, nodes and jobs the fuzzer aims at. The bystander's key and jobs are never the
/// fuzzer's: only admin requests and wrong-owner requests reach them.
struct Market {
    tenant: common::Account,
    bystander: common::Account,
    provider: common::Account,
    north: common::Account,
    /// The node holding leases, then one that never heartbeats (none on the empty server).
    agents: Vec<common::Agent>,
    /// Signs the forger's agent requests.
    stranger: trust::NodeKey,
    jobs: Vec<i64>,
    /// Waits for a region no node is in: its explanation names a region the fleet lacks.
    nowhere: Option<i64>,
    /// The running lease on the first agent (usage and attestation templates are for it).
    lease: Option<Value>,
    leases: Vec<i64>,
    nodes: Vec<i64>,
    key_ids: Vec<String>,
}

/// The keys the fuzzer sends: keys of their own, beside the ones the test reads with, since an
/// accepted `POST /v1/keys/rotate` revokes its sender's (and then replaces it here).
struct FuzzKeys {
    tenant: String,
    provider: String,
    admin: String,
    forged: String,
}

/// One operation of the router: its method, its path with `{id}` or `{key_id}`, and the schema
/// of its body.
#[derive(Clone, Debug)]
struct Operation {
    method: &'static str,
    path: String,
    body: Option<String>,
}

fn method_name(name: &str) -> &'static str {
    match name.to_ascii_uppercase().as_str() {
        "GET" => "GET",
        "POST" => "POST",
        "PUT" => "PUT",
        "DELETE" => "DELETE",
        "PATCH" => "PATCH",
        "HEAD" => "HEAD",
        "OPTIONS" => "OPTIONS",
        other => panic!("the OpenAPI document names the method {other}"),
    }
}

/// Every operation of the OpenAPI document, and the routes it leaves out (the metrics, the
/// document itself, the explorer and the dashboard).
async fn operations(h: &Harness) -> Vec<Operation> {
    let document = h
        .call("GET", "/v1/openapi.json", None, None)
        .await
        .expect(200, "the OpenAPI document");
    let mut out = Vec::new();
    for (path, methods) in document["paths"].as_object().expect("paths") {
        for (method, operation) in methods.as_object().expect("methods") {
            let body = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
                .as_str()
                .and_then(|reference| reference.rsplit('/').next())
                .map(str::to_string);
            out.push(Operation {
                method: method_name(method),
                path: path.clone(),
                body,
            });
        }
    }
    assert!(out.len() >= 40, "the document lists {} operations", out.len());
    for (method, path) in [
        ("GET", "/metrics"),
        ("GET", "/v1/openapi.json"),
        ("GET", "/v1/explorer"),
        ("GET", "/dashboard"),
        ("GET", "/dashboard/login"),
        ("POST", "/dashboard/login"),
        ("GET", "/dashboard/logout"),
        ("POST", "/dashboard/logout"),
        ("GET", "/dashboard/tenant"),
        ("GET", "/dashboard/provider"),
        ("GET", "/dashboard/jobs/{id}"),
        ("GET", "/dashboard/style.css"),
    ] {
        if !out
            .iter()
            .any(|operation| operation.method == method && operation.path == path)
        {
            out.push(Operation {
                method,
                path: path.to_string(),
                body: None,
            });
        }
    }
    out
}

/// A registration edit: the node in `region` at `site`, with `gpu_count` GPUs of `gpu_model`.
fn located(region: &str, site: &str, gpu_model: &str, gpu_count: u8, at: (f64, f64)) -> impl FnOnce(&mut Value) {
    let (region, site, gpu_model) = (region.to_string(), site.to_string(), gpu_model.to_string());
    move |registration: &mut Value| {
        registration["region"] = json!(region);
        registration["fabric"] = json!(format!("{site}-ib0"));
        registration["site"] = json!(site);
        registration["gpu_model"] = json!(gpu_model);
        registration["gpu_count"] = json!(gpu_count);
        registration["latitude"] = json!(at.0);
        registration["longitude"] = json!(at.1);
    }
}

/// The tests' job with `fields` replaced, and a runtime that outlives any run of the pass.
fn job_with(name: &str, fields: Value) -> Value {
    let mut job = job_request(name);
    job["max_runtime_s"] = json!(86_400);
    for (field, value) in fields.as_object().expect("an object") {
        job[field] = value.clone();
    }
    job
}

/// The accounts only: two tenants with credit, two providers, and a spare provider key.
async fn open_market(h: &Harness) -> Market {
    let tenant = h.tenant("acme").await;
    let bystander = h.tenant("bystander").await;
    let provider = h.provider("gpu-farm").await;
    let north = h.provider("north").await;
    h.credit(&tenant, "100.00").await;
    h.credit(&bystander, "40.00").await;
    // Keys no one uses, for the fuzzer's revocations to aim at.
    let mut key_ids = Vec::new();
    for (owner_key, account) in [(&provider.key, &provider), (&h.admin, &bystander)] {
        key_ids.push(new_key(h, owner_key, account.id, "spare").await.0);
    }
    Market {
        key_ids,
        tenant,
        bystander,
        provider,
        north,
        agents: Vec::new(),
        stranger: trust::NodeKey::generate(),
        jobs: Vec::new(),
        nowhere: None,
        lease: None,
        leases: Vec::new(),
        nodes: Vec::new(),
    }
}

/// A new key for `account_id`, made with `owner_key`: its id and the key.
async fn new_key(h: &Harness, owner_key: &str, account_id: i64, label: &str) -> (String, String) {
    let created = h
        .post(
            owner_key,
            &format!("/v1/accounts/{account_id}/keys"),
            json!({"label": label}),
        )
        .await
        .expect(201, "a new API key");
    let text = |field: &str| created[field].as_str().expect("key fields").to_string();
    (text("key_id"), text("api_key"))
}

async fn fuzz_keys(h: &Harness, market: &Market) -> FuzzKeys {
    let accounts = h.get(&h.admin, "/v1/admin/accounts").await.expect(200, "accounts");
    let admin_id = accounts
        .as_array()
        .and_then(|accounts| accounts.iter().find(|account| account["name"] == "admin"))
        .and_then(|account| account["id"].as_i64())
        .expect("the bootstrap admin is listed");
    FuzzKeys {
        tenant: new_key(h, &market.tenant.key, market.tenant.id, "fuzzer").await.1,
        provider: new_key(h, &market.provider.key, market.provider.id, "fuzzer").await.1,
        admin: new_key(h, &h.admin, admin_id, "fuzzer").await.1,
        forged: trust::generate_api_key().display,
    }
}

/// Nodes in four regions (three online, one never heard from) and jobs in every state: queued
/// for a region no node is in, for a model no node has, under every ask; running with a lease
/// (the tenant's and the bystander's); finished, billed; cancelled.
async fn populate(h: &Harness, market: &mut Market) {
    let (tenant, bystander) = (&market.tenant, &market.bystander);
    let nyc = h
        .node(
            &market.provider,
            "nyc-h100",
            located("us-east", "nyc1", "H100-SXM5", 8, (40.7, -74.0)),
        )
        .await;
    let sin = h
        .node(
            &market.provider,
            "sin-a100",
            located("ap-southeast", "sin1", "A100-SXM4-80GB", 4, (1.35, 103.8)),
        )
        .await;
    let sfo = h
        .node(
            &market.provider,
            "sfo-l4",
            located("us-west", "sfo1", "L4", 2, (37.8, -122.4)),
        )
        .await;
    let osl = h
        .node(
            &market.north,
            "osl-h100",
            located("eu-north", "osl1", "H100-SXM5", 8, (59.9, 10.7)),
        )
        .await;
    for online in [&nyc, &sin, &osl] {
        online.heartbeat().await;
    }
    let submit = async |owner: &common::Account, name: &str, fields: Value| -> i64 {
        h.submit(owner, job_with(name, fields)).await["id"]
            .as_i64()
            .expect("a job id")
    };
    let nowhere = submit(tenant, "nowhere", json!({"regions": ["eu-west"]})).await;
    let mut jobs = vec![
        nowhere,
        submit(
            tenant,
            "eu-or-us-west",
            json!({"regions": ["eu-west", "us-west"], "gpus": 2}),
        )
        .await,
        submit(tenant, "no-b200", json!({"gpu_models": ["B200"]})).await,
        submit(tenant, "too-cheap", json!({"max_price_per_gpu_hour": "0.01"})).await,
        submit(bystander, "theirs-nowhere", json!({"regions": ["eu-west"]})).await,
    ];
    let running = submit(tenant, "running", json!({"regions": ["us-east"]})).await;
    let (_, lease) = run_until_placed(h, &nyc, tenant, running).await;
    nyc.event(&lease, "running").await.expect(200, "the lease runs");
    let finished = submit(tenant, "finished", json!({"regions": ["us-east"]})).await;
    let (_, done) = run_until_placed(h, &nyc, tenant, finished).await;
    for state in ["staging", "running"] {
        nyc.event(&done, state).await.expect(200, state);
    }
    nyc.signed("POST", "/v1/agent/usage", Some(&nyc.usage(&done, 1, 1000)))
        .await
        .expect(200, "usage");
    nyc.signed("POST", "/v1/agent/attestations", Some(&nyc.attestation(&done, 0)))
        .await
        .expect(200, "attestation");
    h.wait_for_job(&tenant.key, finished, "finished").await;
    let theirs = submit(bystander, "theirs-running", json!({"regions": ["eu-north"]})).await;
    let (_, their_lease) = run_until_placed(h, &osl, bystander, theirs).await;
    osl.event(&their_lease, "running").await.expect(200, "their lease runs");
    for (owner, name) in [(tenant, "cancelled"), (bystander, "theirs-cancelled")] {
        let id = submit(owner, name, json!({"gpu_models": ["B200"]})).await;
        h.post(&owner.key, &format!("/v1/jobs/{id}/cancel"), json!({}))
            .await
            .expect(200, "cancel");
        jobs.push(id);
    }
    jobs.extend([running, finished, theirs]);
    market.leases = [&lease, &done, &their_lease]
        .iter()
        .map(|lease| lease["id"].as_i64().expect("lease id"))
        .collect();
    market.nodes = [&nyc, &sin, &sfo, &osl].iter().map(|agent| agent.node_id).collect();
    market.jobs = jobs;
    market.nowhere = Some(nowhere);
    market.lease = Some(lease);
    market.agents = vec![nyc, sfo];
}

/// Unreserved characters stay, every other byte is percent-encoded.
fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (byte as char).to_string(),
            _ => format!("%{byte:02X}"),
        })
        .collect()
}

/// The fuzzer's dice: proptest strategies drawn from one seeded generator, without shrinking
/// (the server's state moves on, so a smaller case would not mean the same).
struct Dice(TestRunner);

impl Dice {
    fn new(seed: u64) -> Dice {
        let mut bytes = [0u8; 32];
        bytes[..8].copy_from_slice(&seed.to_le_bytes());
        let rng = proptest::test_runner::TestRng::from_seed(proptest::test_runner::RngAlgorithm::ChaCha, &bytes);
        Dice(TestRunner::new_with_rng(ProptestConfig::default(), rng))
    }

    fn draw<S: Strategy>(&mut self, strategy: S) -> S::Value {
        use proptest::strategy::ValueTree;
        strategy
            .new_tree(&mut self.0)
            .expect("the fuzzer's strategies always generate")
            .current()
    }

    fn below(&mut self, bound: usize) -> usize {
        self.draw(0..bound.max(1))
    }

    fn percent(&mut self, chance: usize) -> bool {
        self.below(100) < chance
    }

    fn pick<T: Clone>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())].clone()
    }
}

/// JSON values for the fuzzer: the limits' neighbours, unicode, huge and tiny numbers, small
/// nested values.
fn wild_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => json_value(),
        1 => any::<String>().prop_map(Value::from),
        1 => prop_oneof![
            Just(json!(u64::MAX)),
            Just(json!(i64::MIN)),
            Just(json!(1e308)),
            Just(json!(-1e-308)),
            Just(json!(4_294_967_296u64)),
            Just(json!(65_536)),
            Just(json!("\u{202e}\u{0}\u{fffd}☃💣")),
            Just(json!("x".repeat(5000))),
            Just(Value::from(vec!["eu-west"; 40])),
            Just(json!({"": ""})),
        ],
    ]
}

/// Bodies no parser should take kindly to.
fn garbage_body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(b"{".to_vec()),
        Just(b"null".to_vec()),
        Just(b"[]".to_vec()),
        Just(b"\"\"".to_vec()),
        Just(b"{\"epoch\": 1e999}".to_vec()),
        Just(b"{\"amount\": 99999999999999999999999999999}".to_vec()),
        Just(b"{\"a\": 1, \"a\": 2}".to_vec()),
        Just(b"\xff\xfe\x00{}".to_vec()),
        Just(b"\xef\xbb\xbf{}".to_vec()),
        Just("[".repeat(512).into_bytes()),
        Just(format!("{{\"x\": \"{}\"}}", "\\u0000".repeat(2000)).into_bytes()),
        Just(vec![b' '; api::REQUEST_BODY_BYTES_MAX + 1]),
        prop::collection::vec(any::<u8>(), 0..64),
    ]
}

/// Offer filters: ones the grammar takes, and ones it must refuse in words.
const FILTERS: &[&str] = &[
    "gpu_model=H100",
    "region in [eu-west,us-east] price<2.5",
    "reliability>0.95 tier=gold",
    "online=true gpus_free>=1",
    "region notin [us-west] gpu_memory_gb>=80",
    "site=\"nyc1\" compute_units>1.5",
    "node_id=1 provider_id!=2 simulated=false",
    "price<<2",
    "region in [",
    "region in []",
    "gpu_model=",
    "\"unterminated",
    "tier=platinum",
    "tier=gold tier=silver",
    "price<NaN",
    "price<1e999",
    "gpu_count>99999999999999999999",
    "online=maybe",
    "node_id=abc",
    "☃=1",
    "price<2.5 \u{0}",
    "=",
    "in [a,b]",
];

const QUERY_KEYS: &[&str] = &[
    "limit",
    "before",
    "after",
    "filter",
    "account_id",
    "provider_id",
    "period",
    "bucket_s",
    "since_s",
    "wait_ms",
    "known",
    "hours",
    "refresh_s",
    "sort",
    "",
];

const QUERY_VALUES: &[&str] = &[
    "0",
    "-1",
    "1",
    "500",
    "501",
    "9223372036854775807",
    "-9223372036854775808",
    "99999999999999999999",
    "1e3",
    "1.5",
    "abc",
    "",
    "true",
    "2026-01",
    "2026-13",
    "0000-00",
    "☃",
    "\u{0}",
    "x x",
];

const WILD_IDS: &[&str] = &[
    "0",
    "-1",
    "1",
    "4294967296",
    "9223372036854775807",
    "-9223372036854775808",
    "99999999999999999999",
    "abc",
    "1.5",
    "1e3",
    "0x10",
    "+7",
    "007",
    "%00",
    "%20",
    "%FF",
    "%E2%98%83",
    "%F0%9F%92%A3",
    "1%2F2",
];

const CONTENT_TYPES: &[&[u8]] = &[
    b"text/plain",
    b"application/x-www-form-urlencoded",
    b"application/json; charset=utf-8",
    b"Application/JSON",
    b"application/jsonx",
    b"multipart/form-data; boundary=x",
    b"\xff\xfe",
];

const METHODS: &[&str] = &["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"];

/// One request as sent, for the failure list.
struct Sent {
    sender: Sender,
    method: &'static str,
    path: String,
    content_type: Option<Vec<u8>>,
    body: Vec<u8>,
}

impl std::fmt::Display for Sent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let body = String::from_utf8_lossy(&self.body);
        let shown: String = body.chars().take(300).collect();
        let more = if body.chars().count() > 300 { "…" } else { "" };
        write!(f, "{} {} as {:?}", self.method, self.path, self.sender)?;
        if let Some(content_type) = &self.content_type {
            write!(f, " ({})", String::from_utf8_lossy(content_type))?;
        }
        if !self.body.is_empty() {
            write!(f, " body {} bytes {shown:?}{more}", self.body.len())?;
        }
        Ok(())
    }
}

/// Why a refusal's body is not what a caller can act on, if it is not: the API's JSON error
/// with a message, or (on the dashboard) an HTML page that says what went wrong.
fn refusal_problem(path: &str, content_type: &str, text: &str) -> Option<String> {
    if path.starts_with("/dashboard") && content_type.starts_with("text/html") {
        let message = text
            .split("class=\"error\">")
            .nth(1)
            .and_then(|rest| rest.split('<').next())
            .unwrap_or_default();
        return message
            .trim()
            .is_empty()
            .then(|| "an HTML refusal without an error message".to_string());
    }
    let reply = common::Reply {
        status: 400,
        body: serde_json::from_str(text).unwrap_or(Value::Null),
        text: text.to_string(),
    };
    match reply.error_shape() {
        Ok(message) if message.chars().filter(|c| c.is_alphabetic()).count() < 8 => {
            Some(format!("the message {message:?} says too little"))
        }
        Ok(_) => None,
        Err(problem) => Some(format!("{problem} (content-type {content_type:?})")),
    }
}

/// Whether a successful request of this method and path may have written something.
fn writes(method: &str, path: &str) -> bool {
    let path = path.split('?').next().unwrap_or_default();
    !matches!(method, "GET" | "HEAD" | "OPTIONS")
        && !matches!(path, "/v1/jobs/quote" | "/dashboard/login" | "/dashboard/logout")
}

struct Fuzzer<'a> {
    h: &'a Harness,
    market: &'a Market,
    keys: FuzzKeys,
    http: reqwest::Client,
    failures: Vec<String>,
    sent: usize,
    /// Accepted requests that may have written, since the last reading of the holdings.
    writes: Vec<String>,
    writes_total: usize,
    statuses: std::collections::BTreeMap<u16, usize>,
    /// The request before, and its status: a dropped connection may be its doing.
    previous: String,
}

impl<'a> Fuzzer<'a> {
    fn new(h: &'a Harness, market: &'a Market, keys: FuzzKeys) -> Fuzzer<'a> {
        Fuzzer {
            h,
            market,
            keys,
            http: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .timeout(FUZZ_REQUEST_TIMEOUT)
                .build()
                .expect("a client"),
            failures: Vec::new(),
            sent: 0,
            writes: Vec::new(),
            writes_total: 0,
            statuses: std::collections::BTreeMap::new(),
            previous: String::new(),
        }
    }

    fn api_key(&self, sender: Sender) -> Option<&str> {
        match sender {
            Sender::Tenant => Some(&self.keys.tenant),
            Sender::Provider => Some(&self.keys.provider),
            Sender::Admin => Some(&self.keys.admin),
            Sender::Forger => Some(&self.keys.forged),
            Sender::Anonymous | Sender::Agent | Sender::OfflineAgent => None,
        }
    }

    /// The four signing headers of an agent request, for the senders that sign.
    fn signature(&self, sent: &Sent) -> Vec<(&'static str, String)> {
        let agents = &self.market.agents;
        let (node_id, key) = match (sent.sender, agents.first(), agents.get(1)) {
            (Sender::Agent, Some(agent), _) => (agent.node_id, &agent.key),
            (Sender::OfflineAgent, _, Some(agent)) => (agent.node_id, &agent.key),
            (Sender::Agent | Sender::OfflineAgent, ..) => (1, &self.market.stranger),
            (Sender::Forger, first, _) => (first.map_or(1, |agent| agent.node_id), &self.market.stranger),
            _ => return Vec::new(),
        };
        key.sign_request_now(node_id, sent.method, &sent.path, &sent.body, now_ms())
            .header_pairs()
            .to_vec()
    }

    /// Sends one request and records what is wrong with its answer. Returns the status, or
    /// `None` when no answer came.
    async fn send(&mut self, sent: Sent) -> Option<(u16, Value)> {
        self.sent += 1;
        let mut request = self
            .http
            .request(
                reqwest::Method::from_bytes(sent.method.as_bytes()).expect("a method"),
                self.h.url(&sent.path),
            )
            .body(sent.body.clone());
        if let Some(key) = self.api_key(sent.sender) {
            request = request
                .header("authorization", format!("Bearer {key}"))
                .header("cookie", format!("fallow_key={key}"));
        }
        for (name, value) in self.signature(&sent) {
            request = request.header(name, value);
        }
        if let Some(content_type) = &sent.content_type {
            let value = reqwest::header::HeaderValue::from_bytes(content_type).expect("a header value");
            request = request.header("content-type", value);
        }
        if sent.body.len() > UNREAD_BODY_BYTES {
            // A request refused before its body is read leaves the rest of the body on the
            // connection, and the server closes it: the next request must not be sent there.
            request = request.header("connection", "close");
        }
        let response = match request.send().await {
            Ok(response) => response,
            Err(error) => {
                self.failures.push(format!(
                    "{sent}: NO ANSWER (dropped or hung): {error:?} (the request before: {})",
                    self.previous
                ));
                self.previous = format!("{sent} -> no answer");
                return None;
            }
        };
        let status = response.status().as_u16();
        self.previous = format!("{sent} -> {status}");
        *self.statuses.entry(status).or_default() += 1;
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let text = match response.bytes().await {
            Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            Err(error) => {
                self.failures
                    .push(format!("{sent}: {status} with a body cut short: {error:?}"));
                return None;
            }
        };
        let shown: String = text.chars().take(400).collect();
        if status >= 500 {
            self.failures.push(format!("{sent}: SERVER ERROR {status}: {shown}"));
        } else if status >= 400
            && sent.method != "HEAD"
            && let Some(problem) = refusal_problem(&sent.path, &content_type, &text)
        {
            self.failures
                .push(format!("{sent}: {status} refusal: {problem}: {shown}"));
        }
        let body: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        if (200..300).contains(&status) && writes(sent.method, &sent.path) {
            self.writes.push(format!("{sent} -> {status}"));
            self.writes_total += 1;
            if sent.path.split('?').next() == Some("/v1/keys/rotate")
                && let Some(key) = body["api_key"].as_str()
            {
                match sent.sender {
                    Sender::Tenant => self.keys.tenant = key.to_string(),
                    Sender::Provider => self.keys.provider = key.to_string(),
                    Sender::Admin => self.keys.admin = key.to_string(),
                    _ => {}
                }
            }
        }
        Some((status, body))
    }

    /// Sends a request and also checks its status against what its sender must get.
    async fn expect_status(&mut self, sent: Sent, want: u16) {
        let label = sent.to_string();
        if let Some((status, body)) = self.send(sent).await
            && status != want
            && status < 500
        {
            self.failures
                .push(format!("{label}: got {status}, want {want}: {body}"));
        }
    }

    async fn health(&mut self) {
        let sent = Sent {
            sender: Sender::Anonymous,
            method: "GET",
            path: "/v1/health".into(),
            content_type: None,
            body: Vec::new(),
        };
        self.expect_status(sent, 200).await;
    }

    /// The ids a path's parameter may name: the market's ones of its kind, or none.
    fn known_ids(&self, path: &str) -> Vec<String> {
        let market = self.market;
        let ids: Vec<i64> = if path.contains("{key_id}") {
            return market.key_ids.clone();
        } else if path.starts_with("/v1/jobs/") || path.starts_with("/dashboard/jobs/") {
            market.jobs.clone()
        } else if path.starts_with("/v1/nodes/") {
            market.nodes.clone()
        } else if path.starts_with("/v1/accounts/") {
            [&market.tenant, &market.bystander, &market.provider, &market.north]
                .iter()
                .map(|account| account.id)
                .collect()
        } else if path.starts_with("/v1/agent/leases/") {
            market.leases.clone()
        } else {
            Vec::new()
        };
        ids.iter().map(i64::to_string).collect()
    }

    /// A valid body for a schema, when the fuzzer has one to spoil.
    fn template(&self, schema: &str) -> Option<Value> {
        let market = self.market;
        let epoch = market.lease.as_ref().map_or(json!(1), |lease| lease["epoch"].clone());
        Some(match schema {
            "JobRequest" => job_with("fuzzed", json!({})),
            "NodeRegistration" => common::node_registration(&trust::NodeKey::generate(), "fuzzed"),
            "PolicyDoc" => json!({"asks": {"gold": "3.00", "silver": "2.00"}}),
            "HeartbeatRequest" => json!({"gpus": [{"index": 0}], "over_limit": false}),
            "LeaseEventRequest" => json!({"epoch": epoch, "state": "running", "detail": "fuzz"}),
            "ProgressRequest" => json!({"epoch": epoch, "unit": "steps", "done": 10}),
            "LogChunkRequest" => json!({"epoch": epoch, "byte_offset": 0, "text": "hello"}),
            "KeyRotation" => json!({"public_key": trust::NodeKey::generate().public_hex()}),
            "NewAccountRequest" => json!({"role": "tenant", "name": "fuzzed"}),
            "NewKeyRequest" => json!({"label": "fuzzed"}),
            "CreditRequest" => json!({"account_id": market.bystander.id, "amount": "1.00", "key": "fuzz"}),
            "BondRequest" => json!({"amount": "1.00", "key": "fuzz-bond"}),
            "SignedUsage" | "SignedAttestation" => {
                let (agent, lease) = (market.agents.first()?, market.lease.as_ref()?);
                if schema == "SignedUsage" {
                    agent.usage(lease, 1, 1000)
                } else {
                    agent.attestation(lease, 0)
                }
            }
            _ => return None,
        })
    }

    /// A random request for `operation`.
    fn random_request(&self, dice: &mut Dice, operation: &Operation) -> Sent {
        // Mostly a sender the route is for, so that requests get past authentication.
        let sender = if dice.percent(30) {
            dice.pick(&SENDERS)
        } else if operation.path.starts_with("/v1/agent/") {
            dice.pick(&[Sender::Agent, Sender::Agent, Sender::OfflineAgent])
        } else {
            dice.pick(&[Sender::Tenant, Sender::Provider, Sender::Admin])
        };
        let method = if dice.percent(8) {
            dice.pick(METHODS)
        } else {
            operation.method
        };
        let mut path = operation.path.clone();
        for parameter in ["{id}", "{key_id}"] {
            if path.contains(parameter) {
                let known = self.known_ids(&operation.path);
                let value = if !known.is_empty() && dice.percent(60) {
                    dice.pick(&known)
                } else if parameter == "{key_id}" && dice.percent(50) {
                    dice.draw("[0-9a-f]{12}|[a-z]{1,300}")
                } else if dice.percent(20) {
                    dice.draw(any::<u32>()).to_string()
                } else {
                    dice.pick(WILD_IDS).to_string()
                };
                path = path.replace(parameter, &value);
            }
        }
        if dice.percent(45) {
            let pairs: Vec<String> = (0..1 + dice.below(3))
                .map(|_| {
                    let key = if operation.path == "/v1/offers" && dice.percent(50) {
                        "filter"
                    } else {
                        dice.pick(QUERY_KEYS)
                    };
                    let value = if key == "filter" {
                        match dice.below(20) {
                            0..=2 => "a=1 ".repeat(40),
                            3 => "x".repeat(3000),
                            _ => dice.pick(FILTERS).to_string(),
                        }
                    } else if !self.market.jobs.is_empty() && dice.percent(20) {
                        dice.pick(&self.market.jobs).to_string()
                    } else {
                        dice.pick(QUERY_VALUES).to_string()
                    };
                    format!("{}={}", percent_encode(key), percent_encode(&value))
                })
                .collect();
            path = format!("{path}?{}", pairs.join("&"));
        }
        let template = operation.body.as_deref().and_then(|schema| self.template(schema));
        let roll = dice.below(100);
        let body: Vec<u8> = if operation.path == "/dashboard/login" && method == "POST" {
            let key = if dice.percent(30) {
                self.keys.tenant.clone()
            } else {
                dice.draw(any::<String>())
            };
            format!("key={}", percent_encode(&key)).into_bytes()
        } else if method == "GET" && roll < 80 {
            Vec::new()
        } else if let Some(mut body) = template.filter(|_| roll < 55) {
            let mut fields: Vec<String> = body
                .as_object()
                .map(|object| object.keys().cloned().collect())
                .unwrap_or_default();
            fields.push("surprise".into());
            for _ in 0..1 + dice.below(3) {
                let field = dice.pick(&fields);
                if dice.percent(20) {
                    if let Some(object) = body.as_object_mut() {
                        object.remove(&field);
                    }
                } else {
                    body[field.as_str()] = dice.draw(wild_value());
                }
            }
            serde_json::to_vec(&body).expect("JSON serialises")
        } else if roll < 80 {
            serde_json::to_vec(&dice.draw(wild_value())).expect("JSON serialises")
        } else if roll < 95 {
            dice.draw(garbage_body())
        } else {
            Vec::new()
        };
        let content_type = if operation.path == "/dashboard/login" && dice.percent(70) {
            Some(b"application/x-www-form-urlencoded".to_vec())
        } else if body.is_empty() && dice.percent(70) {
            None
        } else if dice.percent(85) {
            Some(b"application/json".to_vec())
        } else if dice.percent(20) {
            None
        } else {
            Some(dice.pick(CONTENT_TYPES).to_vec())
        };
        Sent {
            sender,
            method,
            path,
            content_type,
            body,
        }
    }

    /// Every read (and the quote) as every sender, on every id of the market: the handlers that
    /// answer from what is stored. The owner and an admin must get each job; the quote of a job
    /// for a region no node is in is still a quote.
    async fn sweep(&mut self, operations: &[Operation]) {
        let market = self.market;
        let own: Vec<i64> = self
            .h
            .get(&market.tenant.key, "/v1/jobs?limit=500")
            .await
            .expect(200, "the tenant's jobs")["jobs"]
            .as_array()
            .expect("a job list")
            .iter()
            .filter_map(|job| job["id"].as_i64())
            .collect();
        for operation in operations {
            if operation.method != "GET" && operation.path != "/v1/jobs/quote" {
                continue;
            }
            let mut ids = self.known_ids(&operation.path);
            ids.extend(["abc".to_string(), "0".to_string()]);
            let paths: Vec<String> = if operation.path.contains('{') {
                ids.iter()
                    .map(|id| operation.path.replace("{id}", id).replace("{key_id}", id))
                    .collect()
            } else {
                vec![operation.path.clone()]
            };
            for path in paths {
                for sender in SENDERS {
                    let sent = Sent {
                        sender,
                        method: operation.method,
                        path: path.clone(),
                        content_type: None,
                        body: Vec::new(),
                    };
                    if operation.path == "/v1/jobs/quote" {
                        for regions in [json!([]), json!(["eu-west"]), json!(["eu-west", "us-east"])] {
                            let body = serde_json::to_vec(&job_with("quote", json!({"regions": regions})))
                                .expect("JSON serialises");
                            let sent = Sent {
                                content_type: Some(b"application/json".to_vec()),
                                body,
                                ..sent_clone(&sent)
                            };
                            if matches!(sender, Sender::Tenant | Sender::Admin) {
                                self.expect_status(sent, 200).await;
                            } else {
                                self.send(sent).await;
                            }
                        }
                        continue;
                    }
                    let job = operation
                        .path
                        .strip_prefix("/v1/jobs/{id}")
                        .filter(|rest| rest.is_empty() || *rest == "/logs")
                        .and_then(|_| path.split('/').nth(3)?.parse::<i64>().ok())
                        .filter(|id| market.jobs.contains(id));
                    match (job, sender) {
                        (Some(_), Sender::Admin) => self.expect_status(sent, 200).await,
                        (Some(id), Sender::Tenant) => {
                            let want = if own.contains(&id) { 200 } else { 404 };
                            self.expect_status(sent, want).await;
                        }
                        _ => {
                            self.send(sent).await;
                        }
                    }
                }
            }
        }
        // The job no node's region can take says why it waits.
        if let Some(nowhere) = market.nowhere {
            let sent = Sent {
                sender: Sender::Tenant,
                method: "GET",
                path: format!("/v1/jobs/{nowhere}"),
                content_type: None,
                body: Vec::new(),
            };
            let label = sent.to_string();
            if let Some((status, view)) = self.send(sent).await {
                let explained = view["explanation"]
                    .as_str()
                    .is_some_and(|explanation| !explanation.trim().is_empty());
                if status != 200 || !explained {
                    self.failures.push(format!(
                        "{label}: a job for a region no node is in, unexplained: {status} {view}"
                    ));
                }
            }
        }
    }

    /// `cases` random requests in batches; after each batch the server must be alive, and when
    /// none of the batch's requests was accepted and could write, what it holds must be
    /// exactly as before (a batch with an accepted write instead sets the next reference).
    /// Returns how many batches were checked that way.
    async fn random_pass(&mut self, operations: &[Operation], dice: &mut Dice, cases: usize) -> usize {
        let mut before = settled_holdings(self.h, self.market).await;
        let mut checked = 0;
        for batch in 0..cases.div_ceil(FUZZ_BATCH) {
            self.writes.clear();
            for _ in 0..FUZZ_BATCH.min(cases - batch * FUZZ_BATCH) {
                let operation = dice.pick(operations);
                let sent = self.random_request(dice, &operation);
                self.send(sent).await;
            }
            self.health().await;
            if !self.writes.is_empty() {
                before = settled_holdings(self.h, self.market).await;
                continue;
            }
            let after = holdings(self.h, self.market).await;
            checked += 1;
            if after != before {
                self.failures.push(format!(
                    "batch {batch}: requests all refused changed what the coordinator holds:\nbefore {before}\nafter  {after}"
                ));
            }
            before = after;
        }
        checked
    }
}

fn sent_clone(sent: &Sent) -> Sent {
    Sent {
        sender: sent.sender,
        method: sent.method,
        path: sent.path.clone(),
        content_type: sent.content_type.clone(),
        body: sent.body.clone(),
    }
}

/// What refused requests must leave alone: the market's jobs and their leases, every account
/// and the money each holds (a tenant's as available + escrow, since accepted jobs move money
/// between the two as they place and end, on the coordinator's own time), the market's nodes
/// and policies, every key of the market's accounts, the jobs in all, and the money that came
/// in from outside.
async fn holdings(h: &Harness, market: &Market) -> Value {
    let read = async |key: &str, path: &str| -> Value {
        let reply = h.get(key, path).await;
        assert_eq!(reply.status, 200, "{}: holdings: GET {path}: {}", h.backend, reply.text);
        reply.body
    };
    let mut jobs = Vec::new();
    for key in [market.tenant.key.as_str(), market.bystander.key.as_str()] {
        for job in read(key, "/v1/jobs?limit=500").await["jobs"]
            .as_array()
            .expect("a job list")
        {
            if market.jobs.iter().any(|id| job["id"] == *id) {
                let leases: Vec<Value> = job["leases"]
                    .as_array()
                    .expect("leases")
                    .iter()
                    .map(|lease| json!([lease["id"], lease["state"], lease["epoch"], lease["node_id"]]))
                    .collect();
                jobs.push(json!([job["id"], job["state"], leases]));
            }
        }
    }
    let accounts: Vec<Value> = read(&h.admin, "/v1/admin/accounts")
        .await
        .as_array()
        .expect("accounts")
        .iter()
        .map(|account| json!([account["id"], account["name"], account["role"]]))
        .collect();
    let mut money = Vec::new();
    let mut api_keys = Vec::new();
    for account in [&market.tenant, &market.bystander, &market.provider, &market.north] {
        let balance = read(&h.admin, &format!("/v1/balance?account_id={}", account.id)).await;
        if [market.tenant.id, market.bystander.id].contains(&account.id) {
            let held = balance["available_micros"].as_i64().expect("available")
                + balance["escrow_micros"].as_i64().expect("escrow");
            money.push(json!([
                account.id,
                held,
                balance["earnings_micros"],
                balance["bond_micros"]
            ]));
        } else {
            money.push(balance);
        }
        let listed = read(&h.admin, &format!("/v1/accounts/{}/keys", account.id)).await;
        api_keys.push(json!([account.id, listed]));
    }
    let nodes: Vec<Value> = read(&h.admin, "/v1/nodes")
        .await
        .as_array()
        .expect("nodes")
        .iter()
        .filter(|node| market.nodes.iter().any(|id| node["id"] == *id))
        .map(|node| {
            json!([
                node["id"],
                node["name"],
                node["public_key"],
                node["region"],
                node["site"],
                node["gpu_model"],
                node["gpu_count"],
                node["policy"]
            ])
        })
        .collect();
    json!({
        "jobs": jobs,
        "jobs_in_all": h.job_count().await,
        "accounts": accounts,
        "money": money,
        "keys": api_keys,
        "nodes": nodes,
        "external_micros": h.metric("fallow_ledger_balance_micros{account=\"external\"}").await,
    })
}

/// [`holdings`] once they stop moving: what an accepted request set going (a job placed, a
/// lease given up) has happened before the next batch is judged.
async fn settled_holdings(h: &Harness, market: &Market) -> Value {
    let mut last = holdings(h, market).await;
    for _ in 0..20 {
        tokio::time::sleep(std::time::Duration::from_millis(400)).await;
        let now = holdings(h, market).await;
        if now == last {
            return now;
        }
        last = now;
    }
    panic!(
        "{}: what the coordinator holds kept moving after the fuzzer's writes: {last}",
        h.backend
    )
}

fn fuzz_cases() -> usize {
    std::env::var("FALLOW_FUZZ_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(FUZZ_CASES_DEFAULT)
}

fn fuzz_seed() -> u64 {
    std::env::var("FALLOW_FUZZ_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or(FUZZ_SEED_DEFAULT)
}

/// Every route, as every kind of caller, with random ids (the market's own among them),
/// queries, offer filters, content types and bodies, on an empty server and then on a market
/// with nodes and jobs in every state. Never a dropped connection or a 5xx; every refusal is
/// the API's error (or the dashboard's error page) with a message; the owner and an admin can
/// read every job and quote one for a region no node is in; `/v1/health` answers after every
/// batch; a batch of refusals changes nothing stored; and nothing of the market is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_populated_market_survives_a_seeded_fuzz_of_every_route() {
    let (cases, seed) = (fuzz_cases(), fuzz_seed());
    common::on_every_backend_with(
        |config| {
            // Nodes stay online for the whole pass, and canaries (leases of their own on the
            // market's nodes) are rare.
            config.heartbeat_timeout_ms = 3_600_000;
            config.canary_within_ms = 30 * 86_400_000;
        },
        async |h: &Harness| {
            let started = std::time::Instant::now();
            let operations = operations(h).await;
            let mut market = open_market(h).await;
            let keys = fuzz_keys(h, &market).await;
            let mut dice = Dice::new(seed);
            let (keys, empty_checked, empty_failures) = {
                let mut fuzzer = Fuzzer::new(h, &market, keys);
                fuzzer.sweep(&operations).await;
                let checked = fuzzer.random_pass(&operations, &mut dice, cases / 4).await;
                (fuzzer.keys, checked, fuzzer.failures)
            };
            populate(h, &mut market).await;
            let mut fuzzer = Fuzzer::new(h, &market, keys);
            fuzzer.sweep(&operations).await;
            let checked = fuzzer.random_pass(&operations, &mut dice, cases).await;
            fuzzer.health().await;
            let after = settled_holdings(h, &market).await;
            let mut failures = empty_failures;
            failures.append(&mut fuzzer.failures);
            eprintln!(
                "{}: fuzz seed {seed}: {} requests in {:.1} s; {} accepted writes; {} batches of {FUZZ_BATCH} checked unchanged ({} on the empty server); statuses {:?}",
                h.backend,
                fuzzer.sent,
                started.elapsed().as_secs_f64(),
                fuzzer.writes_total,
                checked,
                empty_checked,
                fuzzer.statuses
            );
            assert!(
                failures.is_empty(),
                "{}: fuzz seed {seed}: {} wrong answers (first {FUZZ_FAILURES_SHOWN}):\n{}",
                h.backend,
                failures.len(),
                failures
                    .iter()
                    .take(FUZZ_FAILURES_SHOWN)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("\n")
            );
            // Nothing of the market is lost, whatever was accepted, and the ledger balances.
            let listed = after["jobs"].as_array().map_or(0, Vec::len);
            assert_eq!(listed, market.jobs.len(), "{}: every job is still there: {after}", h.backend);
            assert_eq!(after["nodes"].as_array().map(Vec::len), Some(market.nodes.len()), "{}", h.backend);
            assert_eq!(
                h.metric("fallow_ledger_sum_micros{of=\"balances\"}").await,
                0.0,
                "{}: the ledger balances",
                h.backend
            );
            assert!(
                checked * 4 >= cases.div_ceil(FUZZ_BATCH),
                "{}: only {checked} batches held no accepted write: the check of refusals means little",
                h.backend
            );
        },
    )
    .await;
}
