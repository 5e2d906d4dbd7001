//! `fallow canary`: the real binary runs canary orders (on the CPU and on simulated devices, and
//! the matmul canary on its CPU reference), refuses bad flags in words, and builds its container
//! variant, whose run gives the same answer. Without Docker the container test prints SKIPPED;
//! with `FALLOW_CI_REQUIRE_SERVICES=1` it fails instead.

use std::process::{Command, Output, Stdio};

use serde_json::Value;

fn canary(env: &[(&str, &str)], args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fallow"))
        .arg("canary")
        .args(args)
        .env_remove("FALLOW_SIMULATED_GPU")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("run the fallow binary")
}

/// The one JSON line a successful run prints.
fn output_line(output: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "canary failed: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "exactly one line: {stdout}");
    serde_json::from_str(lines[0]).expect("the line is JSON")
}

const ORDER: [&str; 8] = [
    "run",
    "--seed",
    "cli-seed",
    "--units",
    "20",
    "--gpus",
    "0,1",
    "--memory-mib",
];

fn order(memory_mib: &str) -> Vec<&str> {
    let mut args = ORDER.to_vec();
    args.push(memory_mib);
    args
}

#[test]
fn canary_run_prints_the_known_answer_as_one_json_line() {
    let expected = trust::canary::answer("cli-seed", &[0, 1], 20);
    let on_cpu = output_line(&canary(&[], &order("1024")));
    let fields: Vec<&str> = on_cpu.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(
        fields.len(),
        5,
        "digest, elapsed_ms, rate_milli, memory_allocated, measured_on: {on_cpu}"
    );
    assert_eq!(on_cpu["digest"], expected.as_str());
    assert_eq!(on_cpu["rate_milli"], 0, "no rate is measured on the CPU");
    assert_eq!(on_cpu["memory_allocated"], true);
    assert_eq!(on_cpu["measured_on"], "cpu");
    assert!(on_cpu["elapsed_ms"].is_u64());

    // 20 units take 0.2 s on an H100 and 20 / 31.5 s on an A100.
    let h100 = output_line(&canary(&[("FALLOW_SIMULATED_GPU", "H100-SXM5")], &order("1024")));
    assert_eq!(h100["digest"], expected.as_str());
    assert_eq!(h100["measured_on"], "simulated:H100-SXM5");
    assert!(h100["rate_milli"].as_u64().unwrap() >= 90_000, "{h100}");
    let a100 = output_line(&canary(&[("FALLOW_SIMULATED_GPU", "A100-SXM4-80GB")], &order("1024")));
    assert!(a100["rate_milli"].as_u64().unwrap() < 60_000, "{a100}");
    assert!(a100["elapsed_ms"].as_u64().unwrap() >= 600, "{a100}");
    let too_big = output_line(&canary(&[("FALLOW_SIMULATED_GPU", "H100-SXM5")], &order("130000")));
    assert_eq!(too_big["memory_allocated"], false, "{too_big}");
}

#[test]
fn bad_flags_and_unknown_devices_are_refused_in_words() {
    let check = |env: &[(&str, &str)], args: &[&str], expect: &str| {
        let output = canary(env, args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{args:?} succeeded");
        assert!(output.stdout.is_empty(), "{args:?} printed a result");
        assert!(stderr.contains(expect), "{args:?}: {stderr:?} does not say {expect:?}");
    };
    check(
        &[],
        &["run", "--seed", "s", "--units", "5", "--memory-mib", "1"],
        "--gpus",
    );
    check(
        &[],
        &[
            "run",
            "--seed",
            "s",
            "--units",
            "lots",
            "--gpus",
            "0",
            "--memory-mib",
            "1",
        ],
        "--units",
    );
    check(
        &[],
        &[
            "run",
            "--seed",
            "s",
            "--units",
            "5",
            "--gpus",
            "0,x",
            "--memory-mib",
            "1",
        ],
        "--gpus",
    );
    check(
        &[],
        &["run", "--seed", "s", "--units", "0", "--gpus", "0", "--memory-mib", "1"],
        "units must be 1 to",
    );
    check(
        &[],
        &[
            "run",
            "--seed",
            "s",
            "--units",
            "5",
            "--gpus",
            "1,1",
            "--memory-mib",
            "1",
        ],
        "GPU 1 is named twice",
    );
    check(
        &[("FALLOW_SIMULATED_GPU", "B300-IMAGINARY")],
        &order("1"),
        "\"B300-IMAGINARY\" is not a model of Fallow's GPU catalog",
    );
}

/// Why Docker cannot be used here, if it cannot.
fn docker_missing() -> Option<String> {
    match Command::new("docker").arg("info").output() {
        Ok(output) if output.status.success() => None,
        Ok(output) => Some(format!(
            "docker info: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )),
        Err(error) => Some(format!("docker: {error}")),
    }
}

#[test]
fn the_container_variant_gives_the_same_answer() {
    if let Some(why) = docker_missing() {
        assert!(
            std::env::var("FALLOW_CI_REQUIRE_SERVICES").as_deref() != Ok("1"),
            "Docker is required here (FALLOW_CI_REQUIRE_SERVICES=1): {why}"
        );
        eprintln!("SKIPPED: the canary's container variant was not built or run: {why}");
        return;
    }
    let tag = format!("fallow-canary:test-{}", std::process::id());
    let built = canary(&[], &["image", "--tag", &tag]);
    assert!(
        built.status.success(),
        "fallow canary image: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&built.stdout).trim(), tag);
    let ran = Command::new("docker")
        .args(["run", "--rm", "-e", "FALLOW_SIMULATED_GPU=H100-SXM5", &tag])
        .args([
            "--seed",
            "cli-seed",
            "--units",
            "20",
            "--gpus",
            "0,1",
            "--memory-mib",
            "1024",
        ])
        .output()
        .expect("run docker");
    let _ = Command::new("docker").args(["rmi", "--force", &tag]).output();
    let result = output_line(&ran);
    assert_eq!(
        result["digest"],
        trust::canary::answer("cli-seed", &[0, 1], 20).as_str()
    );
    assert_eq!(result["measured_on"], "simulated:H100-SXM5");
}

/// The matmul canary on the CPU reference (no GPU here): one line with a Merkle root per GPU,
/// its own check passes, the kept products answer a challenge that `trust::matmul` verifies,
/// and a machine without CUDA says so in words.
#[test]
fn the_matmul_canary_commits_checks_itself_and_reveals_rows() {
    let dir = std::env::temp_dir().join(format!("fallow-canary-matmul-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let dir_text = dir.to_str().expect("a UTF-8 temporary directory");
    let run = [
        "run",
        "--kind",
        "matmul",
        "--device",
        "cpu-reference",
        "--n",
        "64",
        "--seed",
        "cli-seed",
        "--gpus",
        "2,0",
        "--self-check",
        "--product-dir",
        dir_text,
    ];
    let line = output_line(&canary(&[], &run));
    assert_eq!(line["measured_on"], "cpu-reference", "{line}");
    let roots: Vec<String> = line["digest"]
        .as_str()
        .unwrap()
        .split(',')
        .map(str::to_string)
        .collect();
    assert_eq!(roots.len(), 2, "one root per GPU, in the order's order: {line}");

    let challenge = [7u8; 32];
    let gpu_challenge = trust::matmul::gpu_challenge(&challenge, 0);
    let rows = trust::matmul::challenge_rows(&gpu_challenge, 64);
    let rows_text = rows.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    let reveal = canary(
        &[],
        &[
            "reveal",
            "--n",
            "64",
            "--gpus",
            "0",
            "--rows",
            &rows_text,
            "--product-dir",
            dir_text,
        ],
    );
    assert!(reveal.status.success(), "{}", String::from_utf8_lossy(&reveal.stderr));
    let revealed: Value = serde_json::from_slice(&reveal.stdout).expect("JSON");
    let openings: Vec<trust::matmul::RowOpening> =
        serde_json::from_value(revealed[0]["rows"].clone()).expect("the rows with their paths");
    let seed = trust::matmul::gpu_seed("cli-seed", 0);
    assert_eq!(
        trust::matmul::verify(&seed, 64, &roots[1], &gpu_challenge, &openings),
        Ok(()),
        "GPU 0's rows prove its root, the second of the digest"
    );
    let _ = std::fs::remove_dir_all(&dir);

    let refused = canary(
        &[],
        &["run", "--kind", "matmul", "--n", "64", "--seed", "s", "--gpus", "0"],
    );
    let stderr = String::from_utf8_lossy(&refused.stderr);
    if !refused.status.success() {
        assert!(
            stderr.contains("CUDA") || stderr.contains("cuBLAS") || stderr.contains("GPU 0"),
            "{stderr}"
        );
    }
    let refused = canary(
        &[],
        &[
            "run",
            "--kind",
            "matmul",
            "--device",
            "cpu-reference",
            "--n",
            "100",
            "--seed",
            "s",
            "--gpus",
            "0",
        ],
    );
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("power of two"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
}
