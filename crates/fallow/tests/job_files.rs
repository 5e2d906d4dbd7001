//! Job files (`docs/job-files.md`) as a tenant uses them: every file in `examples/` is read,
//! submitted (or deployed) against a real `fallow dev` with the CLI, and the ones that can run
//! there run to their end; a file with a mistake is refused with its line and column and
//! nothing is submitted.
//!
//! `examples/gang.yaml` needs `/usr/bin/python3` with torch (Debian's python3-torch); without
//! it that example is skipped loudly, unless `FALLOW_CI_REQUIRE_SERVICES=1`, where it fails.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::dev::{Dev, WITHIN, fallow, json};
use common::world::{skip, torch_missing};
use common::{Scratch, free_port, succeeded};
use serde_json::Value;

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

fn example(name: &str) -> String {
    examples().join(name).display().to_string()
}

/// A GET's status code, over a plain socket.
fn get_status(port: u16, path: &str, key: &str) -> Result<String, String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).map_err(|error| error.to_string())?;
    stream
        .set_read_timeout(Some(Duration::from_secs(90)))
        .map_err(|error| error.to_string())?;
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {key}\r\nConnection: close\r\n\r\n"
    );
    stream
        .write_all(request.as_bytes())
        .map_err(|error| error.to_string())?;
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    let status_line = answer.lines().next().unwrap_or_default().to_string();
    status_line
        .split_whitespace()
        .nth(1)
        .map(str::to_string)
        .ok_or_else(|| format!("no status line: {answer:?}"))
}

fn job_count(url: &str, key: &str) -> usize {
    let listed = json(fallow(url, key, &["job", "list", "--json"]), "job list");
    listed["jobs"].as_array().map_or(0, Vec::len)
}

#[test]
fn the_examples_run_on_fallow_dev_and_a_mistake_is_refused_where_it_is() {
    let scratch = Scratch::new("fallow-job-files");
    let data_dir = scratch.path.join("data");
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    // Process jobs run the host's `python3`: Debian's, where torch is.
    let path = format!("/usr/bin:{}", std::env::var("PATH").unwrap_or_default());
    let mut dev = Dev::start_with(&data_dir, port, scratch.path.join("dev.log"), &[("PATH", &path)]);
    dev.wait_ready();
    let key = std::fs::read_to_string(data_dir.join("tenant.key")).expect("tenant.key");
    let key = key.trim();

    // Every example is a file the CLI reads: a service file as a service, the rest as jobs.
    let mut names: Vec<String> = std::fs::read_dir(examples())
        .expect("examples/")
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter(|name| name.ends_with(".yaml"))
        .collect();
    names.sort();
    assert!(names.len() >= 4, "the examples: {names:?}");
    for name in &names {
        let text = std::fs::read_to_string(examples().join(name)).expect("an example");
        let form = if text.lines().any(|line| line.starts_with("service:")) {
            ["service", "deploy"]
        } else {
            ["job", "submit"]
        };
        let request = json(
            fallow(&url, "", &[form[0], form[1], &example(name), "--dry-run"]),
            &format!("{name} --dry-run"),
        );
        assert!(request.is_object(), "{name}: {request}");
    }

    // hello.yaml runs to its end, its output streamed by --wait.
    let output = fallow(&url, key, &["job", "submit", &example("hello.yaml"), "--wait"]);
    let said = succeeded(&output, "hello.yaml --wait");
    assert!(said.contains("hello from lease "), "its output: {said}");
    // Flags win over the file.
    let output = fallow(
        &url,
        key,
        &[
            "job",
            "submit",
            &example("hello.yaml"),
            "--env",
            "GREETING=hi",
            "--tier",
            "silver",
            "--wait",
        ],
    );
    let said = succeeded(&output, "hello.yaml with flags");
    assert!(said.contains("hi from lease "), "the flag's environment: {said}");
    let listed = json(
        fallow(&url, key, &["job", "list", "--json", "--limit", "1"]),
        "job list",
    );
    assert_eq!(listed["jobs"][0]["spec"]["tier"], "silver", "{listed}");

    // finetune.yaml (two nodes of eight H100s) is taken and waits: dev has two GPUs.
    let quote = json(
        fallow(&url, key, &["job", "quote", &example("finetune.yaml"), "--json"]),
        "finetune.yaml quote",
    );
    assert_eq!(quote["nodes_feasible"], 0, "{quote}");
    let job = json(
        fallow(&url, key, &["job", "submit", &example("finetune.yaml"), "--json"]),
        "finetune.yaml",
    );
    assert_eq!(job["state"], "queued", "{job}");
    assert_eq!(
        (&job["spec"]["gpus"], &job["spec"]["replicas"]),
        (&Value::from(8), &Value::from(2))
    );
    assert_eq!(job["spec"]["datasets"][0]["size_bytes"], 40u64 << 30, "{job}");
    let id = job["id"].as_i64().expect("an id").to_string();
    succeeded(&fallow(&url, key, &["job", "cancel", &id]), "cancel finetune");

    // serve.yaml: deployed, its replica answers through the gateway.
    succeeded(
        &fallow(&url, key, &["service", "deploy", &example("serve.yaml")]),
        "serve.yaml deploy",
    );
    let start = Instant::now();
    loop {
        let status = get_status(port, "/s/files/", key);
        if status.as_deref() == Ok("200") {
            break;
        }
        assert!(
            start.elapsed() < WITHIN * 2,
            "the service never answered: {status:?}\n{}",
            dev.log()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    succeeded(&fallow(&url, key, &["service", "delete", "files"]), "service delete");

    // gang.yaml: two replicas find each other with torch.distributed.
    match torch_missing() {
        Some(why) => skip("examples/gang.yaml", &why),
        None => {
            let output = fallow(&url, key, &["job", "submit", &example("gang.yaml"), "--wait"]);
            let said = succeeded(&output, "gang.yaml --wait");
            for rank in 0..2 {
                assert!(
                    said.contains(&format!("rank {rank} of 2: sum 3")),
                    "{said}\n{}",
                    dev.log()
                );
            }
        }
    }

    // A mistake: refused with its file, line and column, and nothing is submitted.
    let bad = scratch.path.join("bad.yaml");
    std::fs::write(
        &bad,
        "name: spot\nresources:\n  accelerators: H100:1\n  use_spot: true\ntier: bronze\nmax_price: 2\nrun: echo\n",
    )
    .expect("write bad.yaml");
    let before = job_count(&url, key);
    let output = fallow(&url, key, &["job", "submit", &bad.display().to_string()]);
    let said = common::failed_saying(
        &output,
        "bad.yaml",
        &["bad.yaml:4:3: unknown key `use_spot` in resources"],
    );
    assert!(said.contains("tier: bronze"), "the hint: {said}");
    assert_eq!(job_count(&url, key), before, "nothing submitted");

    let status = dev.stop_with("-TERM");
    assert!(status.success(), "exit status {status}:\n{}", dev.log());
}
