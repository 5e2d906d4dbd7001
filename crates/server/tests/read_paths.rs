//! The read paths of a job that names what no node has (issue 17, defect 2), on SQLite and on
//! PostgreSQL: a region no node is in, a GPU model no node has, a gang no set of nodes holds.
//! Each is accepted and queued; `GET /v1/jobs/{id}`, the quote and the dashboard's job page
//! answer and say why it waits, where a handler once panicked and the connection closed.

mod common;

use common::{Account, Harness, Raw, job_request, on_every_backend};
use serde_json::{Value, json};

/// A job the fleet cannot take, and words its explanation must hold.
struct Case {
    label: &'static str,
    job: Value,
    says: &'static [&'static str],
}

fn cases() -> Vec<Case> {
    let with = |label: &'static str, edit: &dyn Fn(&mut Value)| {
        let mut job = job_request(label);
        edit(&mut job);
        job
    };
    vec![
        Case {
            label: "a region no node is in",
            job: with("nowhere", &|job| job["regions"] = json!(["mars-north"])),
            says: &["0 of 2 nodes: 2 outside region mars-north; no node is in mars-north (nodes are in eu-west)"],
        },
        Case {
            label: "a model no node has",
            job: with("blackwell", &|job| job["gpu_models"] = json!(["B200"])),
            says: &["0 of 2 nodes: 2 not B200"],
        },
        Case {
            label: "a region no node is in beside one with nodes, and a model no node has",
            job: with("both", &|job| {
                job["regions"] = json!(["eu-west", "mars-north"]);
                job["gpu_models"] = json!(["B200", "T4"]);
            }),
            says: &["0 of 2 nodes: 2 not B200 or T4"],
        },
        Case {
            label: "a gang no set of nodes holds",
            job: with("gang", &|job| {
                job["gpus"] = json!(8);
                job["replicas"] = json!(4);
                job["topology"] = json!("any");
            }),
            says: &["2 of 2 nodes; no set of nodes holds all 4 replicas (the best holds 2)"],
        },
    ]
}

fn text(value: &Value) -> &str {
    value.as_str().unwrap_or_default()
}

/// The dashboard's page of a job, signed in as `tenant` (the key in the session cookie).
async fn dashboard_job(h: &Harness, tenant: &Account, job_id: i64) -> common::Reply {
    h.send_raw(
        &Raw::new("dashboard job page", "GET", format!("/dashboard/jobs/{job_id}"))
            .header("cookie", format!("fallow_key={}", tenant.key)),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jobs_naming_what_no_node_has_are_explained_on_every_read_path() {
    on_every_backend(async |h: &Harness| {
        let tenant = h.tenant("acme").await;
        let provider = h.provider("gpu-farm").await;
        h.credit(&tenant, "100.00").await;
        let agents = [
            h.node(&provider, "eu-1", |_| {}).await,
            h.node(&provider, "eu-2", |_| {}).await,
        ];
        for case in cases() {
            let what = format!("{}: {}", h.backend, case.label);
            let job = h.submit(&tenant, case.job.clone()).await;
            let job_id = job["id"].as_i64().expect("job id");
            assert_eq!(job["state"], "queued", "{what}: {job}");

            // Until both nodes are online in the fleet view, the explanation counts them offline.
            let path = format!("/v1/jobs/{job_id}");
            let view = h
                .wait_for(&format!("{what}: an explanation naming the cause"), async || {
                    for agent in &agents {
                        agent.heartbeat().await;
                    }
                    let view = h.get(&tenant.key, &path).await.expect(200, &what);
                    let explanation = text(&view["explanation"]);
                    case.says
                        .iter()
                        .all(|words| explanation.contains(words))
                        .then_some(view)
                })
                .await;
            assert_eq!(view["state"], "queued", "{what}: {view}");
            let explanation = text(&view["explanation"]).to_string();
            assert!(
                !explanation.contains("region-"),
                "{what}: a sentinel id in {explanation:?}"
            );

            let quote = h
                .post(&tenant.key, "/v1/jobs/quote", case.job.clone())
                .await
                .expect(200, &format!("{what}: the quote"));
            assert_eq!(quote["price_micros_per_gpu_hour"], Value::Null, "{what}: {quote}");
            assert_eq!(quote["nodes_total"], 2, "{what}: {quote}");
            for words in case.says {
                assert!(text(&quote["explanation"]).contains(words), "{what}: {quote}");
            }

            let page = dashboard_job(h, &tenant, job_id).await;
            assert_eq!(page.status, 200, "{what}: the dashboard's job page: {}", page.text);
            assert!(page.text.contains("Why it waits"), "{what}: {}", page.text);
        }

        // The reconcile loop's reason reads on after "waiting: " and says where to look.
        let job = h
            .submit(&tenant, {
                let mut job = job_request("nowhere-again");
                job["regions"] = json!(["mars-north"]);
                job
            })
            .await;
        let job_id = job["id"].as_i64().expect("job id");
        let reason = h
            .wait_for(&format!("{}: a waiting reason", h.backend), async || {
                let view = h
                    .get(&tenant.key, &format!("/v1/jobs/{job_id}"))
                    .await
                    .expect(200, "job");
                let reason = text(&view["state_reason"]).to_string();
                reason.starts_with("waiting: ").then_some(reason)
            })
            .await;
        assert_eq!(
            reason,
            format!("waiting: no node can take it now; 'fallow job show {job_id}' says why"),
            "{}",
            h.backend
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn what_a_job_cannot_ask_for_is_refused_with_a_reason() {
    on_every_backend(async |h: &Harness| {
        let tenant = h.tenant("acme").await;
        h.credit(&tenant, "100.00").await;
        // More GPUs than one node holds: the refusal points to replicas.
        let mut wide = job_request("wide");
        wide["gpus"] = json!(64);
        for path in ["/v1/jobs", "/v1/jobs/quote"] {
            let message = h
                .post(&tenant.key, path, wide.clone())
                .await
                .refused(400, &format!("{}: {path} with 64 GPUs a replica", h.backend));
            assert!(
                message.contains("gpus: 64 is more than one node holds")
                    && message.contains("\"replicas\": 8, \"gpus\": 8"),
                "{}: {message}",
                h.backend
            );
        }
        // A job cannot name a site (only regions): the field is refused, not ignored.
        let mut sited = job_request("sited");
        sited["site"] = json!("ams9");
        let message = h
            .post(&tenant.key, "/v1/jobs", sited)
            .await
            .refused(400, &format!("{}: a job naming a site", h.backend));
        assert!(message.contains("site"), "{}: {message}", h.backend);
        // A model the catalog does not know is refused with the known ones.
        let mut unknown = job_request("voodoo");
        unknown["gpu_models"] = json!(["Voodoo2"]);
        let message = h
            .post(&tenant.key, "/v1/jobs/quote", unknown)
            .await
            .refused(400, &format!("{}: an unknown model", h.backend));
        assert!(message.contains("unknown model"), "{}: {message}", h.backend);
    })
    .await;
}
