//! Hostile input, on SQLite and on PostgreSQL: hundreds of malformed, oversized, mistyped,
//! unauthenticated and forged requests. Each must get the 4xx it deserves with the API's JSON
//! error body and a message that says something, never a 5xx, and must write nothing. Then a
//! seeded fuzz pass over every route, as every kind of caller, on an empty server and on one
//! with nodes and jobs in every state (`FALLOW_FUZZ_CASES`, `FALLOW_FUZZ_SEED` for longer or
//! other runs).

mod common;

use common::{Harness, Raw, job_request};
use serde_json::Value;

#[path = "hostile/agents.rs"]
mod agents;
#[path = "hostile/fuzz.rs"]
mod fuzz;
#[path = "hostile/market.rs"]
mod market;
#[path = "hostile/random_jobs.rs"]
mod random_jobs;
#[path = "hostile/requests.rs"]
mod requests;

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
