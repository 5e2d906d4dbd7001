//! Issue 22, item 9, "No trace left behind": a replica's scratch is an encrypted volume
//! (gocryptfs over FUSE) with a key made for its lease, so nothing it wrote is readable on the
//! host after the lease. Real gocryptfs, real replicas (a process, a Docker container): a
//! replica writes a marker into its scratch; a copy of the cipher directory taken during the
//! lease (what someone reading the host's disk would find) holds no trace of it; at the lease's
//! end the volume is unmounted and removed. Without gocryptfs or FUSE these tests print SKIPPED;
//! with `FALLOW_CI_REQUIRE_SERVICES=1` (set by `.ci/run`, which installs gocryptfs) they fail.
//! That the key never reaches the disk is checked beside the key itself, in `agent::scratch`'s
//! own tests.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use agent::exec::process::ProcessExecutor;
use agent::exec::{Executor, RunSpec};
use agent::scratch::{Scratch, ScratchEncryption, cipher_dir_of, is_mounted};
use common::{DEADLINE, IMAGE, docker, unique};

fn required() -> bool {
    std::env::var("FALLOW_CI_REQUIRE_SERVICES").is_ok_and(|value| value == "1")
}

/// Encrypted scratch, or why there is none on this host.
fn encrypted() -> Option<Scratch> {
    match Scratch::resolve(ScratchEncryption::Gocryptfs) {
        Ok(scratch) => Some(scratch),
        Err(error) => {
            assert!(
                !required(),
                "gocryptfs is required here (FALLOW_CI_REQUIRE_SERVICES=1): {error}"
            );
            eprintln!("SKIPPED: the encrypted scratch tests: {error}");
            None
        }
    }
}

/// A marker no file could hold by chance, different in every run.
fn marker() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("TENANT-SECRET-{nanos:x}-{}", std::process::id())
}

/// A replica of lease `lease_id` in `data_dir`, laid out as the agent lays it out
/// (`leases/ID/scratch`), running `script` with /bin/sh.
fn spec(data_dir: &Path, lease_id: i64, image: &str, script: &str) -> RunSpec {
    let lease_dir = data_dir.join("leases").join(lease_id.to_string());
    RunSpec {
        lease_id,
        epoch: 1,
        image: image.to_string(),
        command: common::sh_command(image, script),
        env: Default::default(),
        gpu_indices: vec![0],
        memory_mib: 256,
        cpu_milli: 1000,
        network: "none".into(),
        shm_mib: 0,
        scratch_dir: lease_dir.join(agent::scratch::SCRATCH_DIR),
        checkpoint_dir: None,
        log_path: lease_dir.join("output.log"),
        datasets_dir: None,
        runtime: None,
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

/// Every file under `dir` with its bytes, and every name in it (not following links).
fn tree(dir: &Path) -> (Vec<(PathBuf, Vec<u8>)>, Vec<String>) {
    let (mut files, mut names) = (Vec::new(), Vec::new());
    let mut pending = vec![dir.to_path_buf()];
    while let Some(next) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&next) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            names.push(entry.file_name().to_string_lossy().into_owned());
            match entry.file_type() {
                Ok(kind) if kind.is_dir() => pending.push(path),
                Ok(kind) if kind.is_file() => {
                    let bytes = std::fs::read(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
                    files.push((path, bytes));
                }
                _ => {}
            }
        }
    }
    (files, names)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|window| window == needle)
}

/// Copies `from` into `to` as it is now (cp -a), as someone reading the disk would.
fn copy_tree(from: &Path, to: &Path) {
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .expect("cp runs");
    assert!(status.success(), "copying {}", from.display());
}

/// The same lease with either executor: the replica writes `marker` into a file of its scratch
/// (and into a file's name); it reads back through the volume while the lease lasts; the cipher
/// directory holds no trace of it; after the lease nothing is mounted or left, and the copy of
/// the cipher directory still holds no trace.
async fn no_trace_left<E: Executor>(name: &str, executor: &E, image: &str, scratch: &Scratch) {
    let data_dir = unique(&format!("fallow-scratch-{name}"));
    let marker = marker();
    // The marker is written twice, by the replica and by the agent's own files' way in (the
    // progress file), and a marker-named file made.
    let script = format!(
        "echo '{marker}' > \"$FALLOW_SCRATCH_DIR/secret.txt\"; i=0; while [ $i -lt 200 ]; do echo '{marker}'; i=$((i+1)); done > \"$FALLOW_SCRATCH_DIR/big.txt\"; : > \"$FALLOW_SCRATCH_DIR/{marker}\"; echo '7 tokens' >> \"$FALLOW_PROGRESS_FILE\""
    );
    let ran = spec(&data_dir, 41, image, &script);
    scratch
        .open(&ran.scratch_dir)
        .await
        .unwrap_or_else(|error| panic!("{name}: {error}"));
    assert!(
        is_mounted(&ran.scratch_dir),
        "{name}: the scratch is an encrypted volume"
    );
    let handle = executor
        .start(&ran)
        .await
        .unwrap_or_else(|error| panic!("{name}: starts: {error}"));
    assert_eq!(
        wait_exit(executor, &handle).await,
        0,
        "{name}: {}",
        std::fs::read_to_string(&ran.log_path).unwrap_or_default()
    );
    // Readable through the volume while the lease lasts (the agent reads progress there).
    assert_eq!(
        std::fs::read_to_string(ran.scratch_dir.join("secret.txt")).unwrap_or_default(),
        format!("{marker}\n"),
        "{name}: the replica's file reads back through the volume"
    );
    assert_eq!(
        std::fs::read_to_string(ran.scratch_dir.join(agent::exec::PROGRESS_FILE)).unwrap_or_default(),
        "7 tokens\n",
        "{name}: the progress file works through the volume"
    );
    // On the disk: only ciphertext, with encrypted names.
    let cipher_dir = cipher_dir_of(&ran.scratch_dir);
    let copy = data_dir.join("cipher-copy");
    copy_tree(&cipher_dir, &copy);
    let (files, names) = tree(&copy);
    assert!(files.len() >= 4, "{name}: the copy holds the volume's files: {names:?}");
    let total: usize = files.iter().map(|(_, bytes)| bytes.len()).sum();
    assert!(
        total > 200 * marker.len(),
        "{name}: the big file is in there, encrypted ({total} bytes)"
    );
    for (path, bytes) in &files {
        assert!(
            !contains(bytes, marker.as_bytes()),
            "{name}: {} holds the tenant's plaintext",
            path.display()
        );
        assert!(
            !contains(bytes, b"7 tokens"),
            "{name}: {} holds the progress in plaintext",
            path.display()
        );
    }
    assert!(
        names.iter().all(|file| !file.contains(&marker) && file != "secret.txt"),
        "{name}: file names are encrypted too: {names:?}"
    );

    // The lease ends: the executor's clean-up, then the volume's.
    executor.clean_up(&ran).await;
    scratch.close(&ran.scratch_dir).await;
    assert!(!is_mounted(&ran.scratch_dir), "{name}: unmounted");
    assert!(!ran.scratch_dir.exists(), "{name}: the mount point is removed");
    assert!(!cipher_dir.exists(), "{name}: the cipher directory is removed");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(&data_dir.to_string_lossy().into_owned()),
        "{name}: nothing of the lease is mounted: {mounts}"
    );
    // Whatever is left under the data directory (the lease's log, the copy) holds no plaintext.
    for (path, bytes) in tree(&data_dir).0 {
        assert!(
            !contains(&bytes, marker.as_bytes()),
            "{name}: {} holds the tenant's plaintext after the lease",
            path.display()
        );
    }
    let _ = std::fs::remove_dir_all(&data_dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_replicas_scratch_leaves_no_readable_trace() {
    let Some(scratch) = encrypted() else { return };
    no_trace_left("process", &ProcessExecutor, "/bin/sh", &scratch).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_containers_scratch_leaves_no_readable_trace() {
    let Some(scratch) = encrypted() else { return };
    let Some(executor) = docker().await else { return };
    no_trace_left("docker", &executor, IMAGE, &scratch).await;
}

/// A lease started again (after a fence, or by a restarted agent) gets a new volume with a new
/// key: the earlier one's files are not there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_started_again_gets_a_fresh_volume() {
    let Some(scratch) = encrypted() else { return };
    let data_dir = unique("fallow-scratch-again");
    let scratch_dir = data_dir.join("leases/5").join(agent::scratch::SCRATCH_DIR);
    scratch.open(&scratch_dir).await.unwrap();
    std::fs::write(scratch_dir.join("before"), b"from the first run").unwrap();
    // Opening a mounted volume again (a gang replica: its rendezvous file, then its start) keeps it.
    scratch.open(&scratch_dir).await.unwrap();
    assert!(scratch_dir.join("before").exists(), "the same volume");
    scratch.close(&scratch_dir).await;
    scratch.open(&scratch_dir).await.unwrap();
    assert!(is_mounted(&scratch_dir));
    assert!(!scratch_dir.join("before").exists(), "a new volume, empty");
    scratch.close(&scratch_dir).await;
    let _ = std::fs::remove_dir_all(&data_dir);
}

/// What a crashed agent left (a mounted volume whose key is gone, a cipher directory) is
/// unmounted and removed when the agent starts again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_removes_the_volumes_a_crash_left() {
    let Some(scratch) = encrypted() else { return };
    let data_dir = unique("fallow-scratch-stale");
    let leases = data_dir.join("leases");
    let mounted = leases.join("8").join(agent::scratch::SCRATCH_DIR);
    let unmounted = leases.join("9").join(agent::scratch::SCRATCH_DIR);
    for dir in [&mounted, &unmounted] {
        scratch.open(dir).await.unwrap();
        std::fs::write(dir.join("left"), b"left by the crashed run").unwrap();
    }
    // Lease 9's volume was unmounted (say, by a reboot) but its cipher directory stayed.
    let status = std::process::Command::new("fusermount3")
        .arg("-u")
        .arg(&unmounted)
        .status()
        .or_else(|_| {
            std::process::Command::new("fusermount")
                .arg("-u")
                .arg(&unmounted)
                .status()
        })
        .expect("fusermount runs");
    assert!(status.success());
    assert!(cipher_dir_of(&unmounted).exists());
    // Another lease's files beside them are not touched.
    std::fs::write(leases.join("8").join("output.log"), b"log").unwrap();

    Scratch::resolve(ScratchEncryption::Auto)
        .unwrap()
        .clean_stale(&leases)
        .await;
    for dir in [&mounted, &unmounted] {
        assert!(!is_mounted(dir), "{} is unmounted", dir.display());
        assert!(!dir.exists(), "{} is removed", dir.display());
        assert!(
            !cipher_dir_of(dir).exists(),
            "{}'s cipher directory is removed",
            dir.display()
        );
    }
    assert!(leases.join("8").join("output.log").exists(), "the lease's log stays");
    let _ = std::fs::remove_dir_all(&data_dir);
}

/// `off` keeps plain directories, removed at the end, even where gocryptfs is installed.
#[tokio::test]
async fn off_keeps_plain_directories() {
    let scratch = Scratch::resolve(ScratchEncryption::Off).unwrap();
    assert!(!scratch.encrypted());
    let data_dir = unique("fallow-scratch-off");
    let scratch_dir = data_dir.join("leases/3").join(agent::scratch::SCRATCH_DIR);
    scratch.open(&scratch_dir).await.unwrap();
    assert!(scratch_dir.is_dir() && !is_mounted(&scratch_dir));
    assert!(!cipher_dir_of(&scratch_dir).exists());
    std::fs::write(scratch_dir.join("plain"), b"plain").unwrap();
    scratch.close(&scratch_dir).await;
    assert!(!scratch_dir.exists());
    let _ = std::fs::remove_dir_all(&data_dir);
}
