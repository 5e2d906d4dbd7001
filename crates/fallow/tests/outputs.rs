//! Results out of a job: what a replica leaves in `$FALLOW_OUTPUT_DIR` is packed as a tar
//! archive when it ends and PUT to the job's `--output-url` (here a real HTTP server in the
//! test, as a presigned object-store URL would be), or kept by the coordinator for `fallow job
//! output`; either way the archive's digest is in the lease, as the node attested it. An upload
//! refused by the URL's server is said in the job's output, and the job still ends as it did.

mod common;

use std::io::Read;
use std::time::{Duration, Instant};

use common::bucket::Bucket;
use common::dev::{Dev, WITHIN, fallow, json};
use common::succeeded;
use serde_json::Value;

/// What the writing script leaves: a file, and one in a directory.
const WRITES: &str = "mkdir -p \"$FALLOW_OUTPUT_DIR/metrics\" && echo 'loss 0.25' > \"$FALLOW_OUTPUT_DIR/result.txt\" \
                      && echo 'step,loss' > \"$FALLOW_OUTPUT_DIR/metrics/epoch-1.csv\" && echo done";

/// The archive's entries: (name, text of a file or "" for a directory).
fn entries(archive: &[u8]) -> Vec<(String, String)> {
    let mut read = tar::Archive::new(archive);
    read.entries()
        .expect("a tar archive")
        .map(|entry| {
            let mut entry = entry.expect("an entry");
            let name = entry.path().expect("a path").display().to_string();
            let mut text = String::new();
            entry.read_to_string(&mut text).expect("its text");
            (name, text)
        })
        .collect()
}

fn digest(bytes: &[u8]) -> String {
    format!("blake3:{}", blake3::hash(bytes).to_hex())
}

/// Submits a process job running `script`, with these flags besides; waits for its end.
fn run(url: &str, key: &str, script: &str, flags: &[&str], dev: &Dev) -> Value {
    let mut args = vec![
        "job",
        "submit",
        "--json",
        "--gpus",
        "1",
        "--tier",
        "silver",
        "--max-price",
        "5",
    ];
    args.extend_from_slice(flags);
    args.extend_from_slice(&["--process", "--", "sh", "-c", script]);
    let submitted = json(fallow(url, key, &args), "job submit");
    let id = submitted["id"].as_i64().expect("an id").to_string();
    let start = Instant::now();
    loop {
        let view = json(fallow(url, key, &["job", "show", &id, "--json"]), "job show");
        if matches!(view["state"].as_str(), Some("finished" | "failed" | "cancelled")) {
            return view;
        }
        assert!(start.elapsed() < WITHIN, "job {id} did not end: {view}\n{}", dev.log());
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn expected() -> Vec<(String, String)> {
    vec![
        ("metrics".to_string(), String::new()),
        ("metrics/epoch-1.csv".to_string(), "step,loss\n".to_string()),
        ("result.txt".to_string(), "loss 0.25\n".to_string()),
    ]
}

#[test]
fn a_replicas_output_goes_to_its_url_or_stays_with_the_coordinator() {
    let started = common::dev::start_ready("fallow-outputs");
    let (mut dev, url, key, scratch) = (started.dev, started.url, started.tenant_key.as_str(), &started.scratch);
    let bucket = Bucket::start();

    // To the URL, `{replica}` filled in.
    let target = format!("http://127.0.0.1:{}/results/run-{{replica}}.tar", bucket.port);
    let job = run(&url, key, WRITES, &["--output-url", &target], &dev);
    assert_eq!(job["state"], "finished", "{job}\n{}", dev.log());
    let archive = bucket.object("/results/run-0.tar").expect("the archive was PUT");
    assert_eq!(entries(&archive), expected());
    let output = &job["leases"][0]["output"];
    assert_eq!(
        output["digest"],
        digest(&archive),
        "the attested digest is the archive's: {job}"
    );
    assert_eq!(output["size_bytes"], archive.len(), "{job}");
    assert_eq!(output["kept"], false, "{job}");
    let id = job["id"].as_i64().expect("an id").to_string();
    let refused = fallow(&url, key, &["job", "output", &id, "-o", "/dev/null"]);
    common::failed_saying(&refused, "job output of a URL's job", &["output_url"]);

    // Kept by the coordinator, read back with the CLI.
    let job = run(&url, key, WRITES, &[], &dev);
    assert_eq!(job["state"], "finished", "{job}\n{}", dev.log());
    let id = job["id"].as_i64().expect("an id").to_string();
    let file = scratch.path.join("out.tar");
    succeeded(
        &fallow(&url, key, &["job", "output", &id, "-o", &file.display().to_string()]),
        "job output",
    );
    let archive = std::fs::read(&file).expect("the archive");
    assert_eq!(entries(&archive), expected());
    let output = &job["leases"][0]["output"];
    assert_eq!(
        (&output["digest"], &output["kept"]),
        (&Value::from(digest(&archive)), &Value::from(true))
    );
    let shown = succeeded(&fallow(&url, key, &["job", "show", &id]), "job show");
    assert!(shown.contains(&digest(&archive)), "job show names the archive: {shown}");

    // A URL that refuses: the job ends as it did, and its output says why nothing was kept.
    let denied = format!("http://127.0.0.1:{}/denied/x.tar", bucket.port);
    let job = run(&url, key, WRITES, &["--output-url", &denied], &dev);
    assert_eq!(job["state"], "finished", "{job}");
    assert!(job["leases"][0].get("output").is_none(), "{job}");
    let id = job["id"].as_i64().expect("an id").to_string();
    let logs = succeeded(&fallow(&url, key, &["job", "logs", &id]), "job logs");
    assert!(logs.contains("done"), "{logs}");
    assert!(logs.contains("was not kept: the output URL answered 403"), "{logs}");

    // Nothing left: no archive.
    let job = run(&url, key, "echo nothing to keep", &[], &dev);
    assert!(job["leases"][0].get("output").is_none(), "{job}");
    let id = job["id"].as_i64().expect("an id").to_string();
    let none = fallow(&url, key, &["job", "output", &id, "-o", "/dev/null"]);
    common::failed_saying(
        &none,
        "job output of an empty one",
        &["left nothing in $FALLOW_OUTPUT_DIR"],
    );

    let status = dev.stop_with("-TERM");
    assert!(status.success(), "exit status {status}:\n{}", dev.log());
}
