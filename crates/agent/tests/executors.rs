//! One conformance suite for every executor: the same replicas run (and stopped by a guard) by
//! the process executor and by the Docker executor (a real Docker Engine, with an image built here from Debian's
//! busybox-static: no registry is reachable). Without Docker the Docker leg prints SKIPPED, and
//! with `FALLOW_CI_REQUIRE_SERVICES=1` (set by `.ci/run`) it fails instead.

mod common;

use std::time::{Duration, Instant};

use agent::exec::process::ProcessExecutor;
use agent::exec::{Executor, RunSpec};
use agent::guard;
use common::{DEADLINE, IMAGE, docker, unique};

/// A replica running `script` with /bin/sh, for either executor.
fn spec(image: &str, script: &str) -> RunSpec {
    static NEXT: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(1);
    let lease_id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + i64::from(std::process::id()) * 1000;
    let dir = unique("fallow-exec");
    RunSpec {
        lease_id,
        epoch: 1,
        image: image.to_string(),
        command: common::sh_command(image, script),
        env: [("GREETING".to_string(), "hello".to_string())].into_iter().collect(),
        gpu_indices: vec![1],
        memory_mib: 256,
        cpu_milli: 1000,
        network: "none".into(),
        shm_mib: 0,
        scratch_dir: dir.join("scratch"),
        checkpoint_dir: Some(dir.join("checkpoint")),
        log_path: dir.join("output.log"),
        datasets_dir: None,
        // Ignored by the process and Docker executors; tells the dual one which to use.
        runtime: Some(if image == "/bin/sh" { "process" } else { "container" }.to_string()),
    }
}

async fn wait_exit<E: Executor>(executor: &E, handle: &E::Handle) -> i64 {
    let start = Instant::now();
    loop {
        if let Some(exit) = executor.poll_exit(handle).await.expect("the executor answers") {
            return exit.code;
        }
        assert!(start.elapsed() < DEADLINE, "the replica never ended");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn log_of(spec: &RunSpec, wanted: &str) -> String {
    let start = Instant::now();
    loop {
        let log = std::fs::read_to_string(&spec.log_path).unwrap_or_default();
        if log.contains(wanted) || start.elapsed() > Duration::from_secs(5) {
            return log;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What every executor must do.
async fn conformance<E: Executor>(name: &str, executor: &E, image: &str) {
    // Runs, sees its environment, writes its scratch and checkpoint directories, and its output
    // reaches the log.
    let ran = spec(
        image,
        "echo \"$GREETING lease $FALLOW_LEASE_ID\"; echo kept > \"$FALLOW_CHECKPOINT_DIR/state\"; echo x > \"$FALLOW_SCRATCH_DIR/tmp\"",
    );
    let handle = executor
        .start(&ran)
        .await
        .unwrap_or_else(|error| panic!("{name}: starts: {error}"));
    assert_eq!(wait_exit(executor, &handle).await, 0, "{name}");
    let wanted = format!("hello lease {}", ran.lease_id);
    let log = log_of(&ran, &wanted).await;
    assert!(log.contains(&wanted), "{name}: the output is in the log: {log:?}");
    assert!(
        !executor.image_digest(&handle).is_empty(),
        "{name}: what ran is named by digest"
    );
    let checkpoint = ran.checkpoint_dir.clone().unwrap();
    assert_eq!(
        std::fs::read_to_string(checkpoint.join("state")).unwrap_or_default(),
        "kept\n",
        "{name}"
    );
    executor.clean_up(&ran).await;
    assert!(!ran.scratch_dir.exists(), "{name}: the scratch directory is removed");
    assert!(
        checkpoint.join("state").exists(),
        "{name}: the checkpoint directory survives"
    );

    // A non-zero exit is reported as it is.
    let failing = spec(image, "exit 3");
    let handle = executor.start(&failing).await.unwrap();
    assert_eq!(wait_exit(executor, &handle).await, 3, "{name}");
    executor.clean_up(&failing).await;

    // SIGTERM first: a replica that saves its checkpoint and exits within the grace period.
    let graceful = spec(
        image,
        "trap 'echo saved > \"$FALLOW_CHECKPOINT_DIR/on-term\"; exit 0' TERM; echo ready; while true; do sleep 0.1; done",
    );
    let handle = executor.start(&graceful).await.unwrap();
    log_of(&graceful, "ready").await;
    let exit = executor.stop(&handle, Duration::from_secs(5)).await.unwrap();
    assert_eq!(exit.code, 0, "{name}: it exits on its own within the grace period");
    assert_eq!(
        std::fs::read_to_string(graceful.checkpoint_dir.as_ref().unwrap().join("on-term")).unwrap_or_default(),
        "saved\n",
        "{name}: the checkpoint written on SIGTERM survives"
    );
    executor.clean_up(&graceful).await;

    // …then SIGKILL when the grace period runs out.
    let stubborn = spec(image, "trap '' TERM; echo ready; while true; do sleep 0.1; done");
    let handle = executor.start(&stubborn).await.unwrap();
    log_of(&stubborn, "ready").await;
    let asked = Instant::now();
    let exit = executor.stop(&handle, Duration::from_secs(1)).await.unwrap();
    assert_eq!(exit.code, 137, "{name}: killed");
    assert!(
        asked.elapsed() >= Duration::from_millis(900),
        "{name}: not before the grace period ended"
    );
    executor.clean_up(&stubborn).await;

    // A program that does not exist does not start, and says why.
    let missing = RunSpec {
        image: if image == "/bin/sh" {
            "/no/such/program".into()
        } else {
            "fallow-no-such-image:0".into()
        },
        ..spec(image, "true")
    };
    let error = executor.start(&missing).await.expect_err("nothing to run");
    assert!(error.to_string().contains("no"), "{name}: {error}");
}

/// A guard stops its replica by id, from outside the executor that started it, once its feed
/// goes quiet, and not while it is fed.
async fn guard_conformance<E: Executor>(name: &str, executor: &E, image: &str) {
    use tokio::io::AsyncWriteExt;
    let guarded = spec(image, "echo ready; while true; do sleep 0.1; done");
    let handle = executor.start(&guarded).await.unwrap();
    log_of(&guarded, "ready").await;
    let (mut sender, receiver) = tokio::net::unix::pipe::pipe().unwrap();
    let fence = guard::Fence {
        fence: Duration::from_millis(400),
        first: Duration::from_millis(400),
        grace: Duration::from_secs(1),
    };
    let feeding = tokio::spawn(async move {
        for _ in 0..6 {
            sender.write_all(guard::FEED).await.unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        sender
    });
    let started = Instant::now();
    let mut report = Vec::new();
    let fired = guard::run_guard(executor, &executor.handle_id(&handle), receiver, &mut report, fence)
        .await
        .unwrap_or_else(|error| panic!("{name}: the guard stops the replica: {error}"));
    assert_eq!(fired, guard::Fired::Silence, "{name}");
    assert!(guard::fired_at(&report).is_some(), "{name}: it says so, and when");
    assert!(
        started.elapsed() >= Duration::from_millis(600),
        "{name}: not while it was fed ({:?})",
        started.elapsed()
    );
    let code = wait_exit(executor, &handle).await;
    assert!(matches!(code, 143 | 137), "{name}: stopped by a signal, not {code}");
    drop(feeding.await.unwrap());
    executor.clean_up(&guarded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_process_executor_conforms() {
    conformance("process", &ProcessExecutor, "/bin/sh").await;
    guard_conformance("process", &ProcessExecutor, "/bin/sh").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_docker_executor_conforms() {
    let Some(executor) = docker().await else { return };
    conformance("docker", &executor, IMAGE).await;
    guard_conformance("docker", &executor, IMAGE).await;
}

/// What the agent keeps of a lease's failure detail when it reports it (agent.rs, `report`).
const DETAIL_CHARS_KEPT: usize = 128;

/// An image that no registry serves (`.invalid` names never resolve) fails to start with the
/// Engine's reason, as `docker pull` prints it, within what the lease's failure detail keeps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unpullable_image_fails_with_the_engines_reason() {
    let Some(executor) = docker().await else { return };
    let image = "fallow-unpullable.invalid/nothing:1";
    let unpullable = RunSpec {
        image: image.into(),
        ..spec(IMAGE, "true")
    };
    let error = executor
        .start(&unpullable)
        .await
        .expect_err("no registry serves the image")
        .to_string();
    let detail: String = error.chars().take(DETAIL_CHARS_KEPT).collect();
    let (named, cause) = detail
        .split_once(" could not be pulled: ")
        .unwrap_or_else(|| panic!("the detail says the pull failed: {error}"));
    assert!(
        named.contains(&format!("'{image}'")),
        "the detail names the image: {error}"
    );
    assert!(
        cause.trim().len() >= 3 && !cause.contains("status code"),
        "the detail carries the Engine's reason, not an HTTP status: {error}"
    );
    executor.clean_up(&unpullable).await;
}

/// `--executor both`: a process job as a process, a container job in Docker, each found again
/// and stopped by its prefixed id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dual_executor_conforms_in_both_runtimes() {
    let docker = docker().await;
    let with_docker = docker.is_some();
    let executor = agent::exec::dual::DualExecutor::new(docker);
    let expected: Vec<String> = if with_docker {
        vec!["process".into(), "container".into()]
    } else {
        vec!["process".into()]
    };
    assert_eq!(executor.runtimes(), expected);
    conformance("both (process)", &executor, "/bin/sh").await;
    guard_conformance("both (process)", &executor, "/bin/sh").await;
    if with_docker {
        conformance("both (docker)", &executor, IMAGE).await;
        guard_conformance("both (docker)", &executor, IMAGE).await;
    }
}
