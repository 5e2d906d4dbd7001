//! `fallow dev` as a new user meets it: the binary started with a data directory and a port,
//! then the CLI run against it with the keys it wrote, exactly as the README says. A process job
//! and a container job run to `finished` and their output and cost are read back; Ctrl-C stops
//! everything cleanly, and a restart keeps the jobs and the keys.
//!
//! The container job needs a Docker Engine and Debian's busybox-static (for a local image:
//! no registry is reachable). Without them that part is skipped loudly, unless
//! `FALLOW_CI_REQUIRE_SERVICES=1`, where it fails.

mod common;

use std::process::Output;
use std::time::{Duration, Instant};

use common::dev::{Dev, WITHIN, fallow, json};
use common::{Scratch, free_port};
use serde_json::Value;

/// The local image the container job runs (busybox-static, imported).
const IMAGE: &str = "fallow-dev-test-busybox:1";

fn ok(output: Output, what: &str) -> String {
    common::succeeded(&output, what)
}

/// Polls `fallow job show ID --json` until the job is finished; returns that view.
fn wait_finished(url: &str, key: &str, id: i64, dev: &Dev) -> Value {
    let start = Instant::now();
    loop {
        let view = json(
            fallow(url, key, &["job", "show", &id.to_string(), "--json"]),
            "job show",
        );
        match view["state"].as_str() {
            Some("finished") => return view,
            Some("failed" | "cancelled") => panic!("job {id} ended badly: {view}\n{}", dev.log()),
            _ => {}
        }
        assert!(
            start.elapsed() < WITHIN,
            "job {id} is not finished: {view}\n{}",
            dev.log()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[test]
fn dev_runs_a_process_job_and_a_container_job_from_the_cli_and_keeps_its_state() {
    let scratch = Scratch::new("fallow-dev");
    let data_dir = scratch.path.join("data");
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let mut dev = Dev::start(&data_dir, port, scratch.path.join("dev.log"));
    dev.wait_ready();
    let said = dev.log();
    assert!(
        said.contains(&format!("{url}/dashboard")),
        "the dashboard's address: {said}"
    );
    assert!(
        said.contains("(simulated)") || said.contains("× "),
        "what the node offers: {said}"
    );
    let tenant_key = std::fs::read_to_string(data_dir.join("tenant.key")).expect("tenant.key");
    let tenant_key = tenant_key.trim();
    let provider_key = std::fs::read_to_string(data_dir.join("provider.key")).expect("provider.key");
    let provider_key = provider_key.trim();
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(data_dir.join("tenant.key"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "keys are the owner's alone");

    // The command line, word for word.
    let submitted = json(
        fallow(
            &url,
            tenant_key,
            &[
                "job",
                "submit",
                "--json",
                "--gpus",
                "1",
                "--tier",
                "silver",
                "--max-price",
                "5",
                "--process",
                "--",
                "sh",
                "-c",
                "echo hi",
            ],
        ),
        "job submit",
    );
    let id = submitted["id"].as_i64().unwrap_or_else(|| panic!("an id: {submitted}"));
    let finished = wait_finished(&url, tenant_key, id, &dev);
    assert_eq!(finished["spec"]["runtime"], "process", "{finished}");
    let logs = ok(fallow(&url, tenant_key, &["job", "logs", &id.to_string()]), "job logs");
    assert_eq!(logs.trim(), "hi", "the job's output");
    // Simulated devices are billed with play money in dev, so the cost shows.
    let cost = finished["cost_micros"].as_i64().expect("cost_micros");
    assert!(cost > 0, "a cost: {finished}");

    // A container job, when Docker and busybox are here.
    let mut jobs = vec![id];
    match common::busybox_image(IMAGE) {
        Ok(()) => {
            let submitted = json(
                fallow(
                    &url,
                    tenant_key,
                    &[
                        "job",
                        "submit",
                        "--json",
                        "--image",
                        IMAGE,
                        "--gpus",
                        "1",
                        "--tier",
                        "silver",
                        "--max-price",
                        "5",
                        "--",
                        "sh",
                        "-c",
                        "echo hi from a container",
                    ],
                ),
                "container job submit",
            );
            let id = submitted["id"].as_i64().expect("an id");
            let finished = wait_finished(&url, tenant_key, id, &dev);
            assert!(
                finished["cost_micros"].as_i64().is_some_and(|cost| cost > 0),
                "{finished}"
            );
            let logs = ok(
                fallow(&url, tenant_key, &["job", "logs", &id.to_string()]),
                "container logs",
            );
            assert_eq!(logs.trim(), "hi from a container");
            jobs.push(id);
        }
        Err(why) if std::env::var("FALLOW_CI_REQUIRE_SERVICES").as_deref() == Ok("1") => {
            panic!("the container job must run here (FALLOW_CI_REQUIRE_SERVICES=1): {why}")
        }
        Err(why) => eprintln!("SKIPPED the container job of fallow dev: {why}"),
    }
    let nodes = json(fallow(&url, provider_key, &["node", "list", "--json"]), "node list");
    let node = &nodes.as_array().expect("a list")[0];
    assert_eq!(node["simulated"], true, "labelled simulated: {node}");

    // SIGTERM (a service manager's stop) stops everything cleanly; a restart keeps the jobs
    // and the keys.
    let status = dev.stop_with("-TERM");
    assert!(status.success(), "exit status {status}:\n{}", dev.log());
    assert!(dev.log().contains("SIGTERM: stopping"), "{}", dev.log());
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "nothing listens after SIGTERM"
    );
    drop(dev);
    let mut dev = Dev::start(&data_dir, port, scratch.path.join("dev-again.log"));
    dev.wait_ready();
    let again = std::fs::read_to_string(data_dir.join("tenant.key")).expect("tenant.key");
    assert_eq!(again.trim(), tenant_key, "the same key after a restart");
    let listed = json(fallow(&url, tenant_key, &["job", "list", "--json"]), "job list");
    let listed: Vec<i64> = listed
        .as_array()
        .or_else(|| listed["jobs"].as_array())
        .unwrap_or_else(|| panic!("a list of jobs: {listed}"))
        .iter()
        .filter_map(|job| job["id"].as_i64())
        .collect();
    for id in &jobs {
        assert!(listed.contains(id), "job {id} is kept: {listed:?}");
    }
    let nodes = json(
        fallow(&url, provider_key, &["node", "list", "--json"]),
        "node list again",
    );
    assert_eq!(
        nodes.as_array().map(Vec::len),
        Some(1),
        "the same node, not a second: {nodes}"
    );
    // Ctrl-C does the same.
    let status = dev.stop_with("-INT");
    assert!(status.success(), "exit status {status}:\n{}", dev.log());
}
