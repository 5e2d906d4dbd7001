//! Malformed, oversized and mistyped requests: job submissions, bodies past the limits, bad
//! paths, methods and queries, bad API keys, and bad provider and admin bodies.

use crate::common::{self, Harness, Raw, job_request, on_every_backend};
use serde_json::{Value, json};

use super::{check_refused, expect, expect_saying, submit, submit_bytes, with, without};

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
            expect_saying(credit("to a provider", json!({"account_id": provider.id, "amount": "5", "key": "k1"})), 404, "credit is for tenants"),
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
