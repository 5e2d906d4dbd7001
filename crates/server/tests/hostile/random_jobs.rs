//! Random job bodies from proptest: each gets a 201 exactly when the wire type accepts it, and a
//! 400 with the error body otherwise, never a 5xx.

use crate::common::{Harness, Raw, Snapshot, job_request, on_every_backend};
use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, TestRunner};
use serde_json::Value;

/// The JSON values a fuzzer sends: scalars that sit on the limits, and small nested values.
pub(crate) fn json_value() -> impl Strategy<Value = Value> {
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
