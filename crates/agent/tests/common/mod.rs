//! What the agent's test suites share: temporary paths, and the Docker executor with a test
//! image built here from Debian's busybox-static (no registry is reachable). Without Docker a
//! Docker test prints SKIPPED; with `FALLOW_CI_REQUIRE_SERVICES=1` (set by `.ci/run`) it fails.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use agent::exec::docker::DockerExecutor;

pub const DEADLINE: Duration = Duration::from_secs(30);

/// The test image: a static busybox and nothing else.
pub const IMAGE: &str = "fallow-test-busybox:1";

pub fn unique(prefix: &str) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::env::temp_dir().join(format!("{prefix}-{}-{n}", std::process::id()))
}

fn required() -> bool {
    std::env::var("FALLOW_CI_REQUIRE_SERVICES").is_ok_and(|value| value == "1")
}

/// Builds the test image with `docker import` of a tarball holding a static busybox.
fn build_image() -> Result<(), String> {
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .map(Path::new)
        .find(|path| path.is_file())
        .ok_or("no static busybox on this machine (apt-get install busybox-static)")?;
    let root = unique("fallow-image");
    std::fs::create_dir_all(root.join("bin")).map_err(|error| error.to_string())?;
    std::fs::copy(busybox, root.join("bin/busybox")).map_err(|error| error.to_string())?;
    for applet in ["sh", "sleep", "echo", "cat", "true"] {
        std::os::unix::fs::symlink("busybox", root.join("bin").join(applet)).map_err(|error| error.to_string())?;
    }
    let tarball = root.with_extension("tar");
    let status = std::process::Command::new("tar")
        .arg("-C")
        .arg(&root)
        .arg("-cf")
        .arg(&tarball)
        .arg("bin")
        .status()
        .map_err(|error| format!("tar: {error}"))?;
    if !status.success() {
        return Err("tar failed".into());
    }
    let output = std::process::Command::new("docker")
        .arg("import")
        .arg(&tarball)
        .arg(IMAGE)
        .output()
        .map_err(|error| format!("docker import: {error}"))?;
    let _ = std::fs::remove_dir_all(&root);
    let _ = std::fs::remove_file(&tarball);
    if !output.status.success() {
        return Err(format!("docker import: {}", String::from_utf8_lossy(&output.stderr)));
    }
    Ok(())
}

/// The Docker executor with the test image, or why there is none.
pub async fn docker() -> Option<DockerExecutor> {
    let executor = match DockerExecutor::connect(false).await {
        Ok(executor) => executor,
        Err(error) => {
            assert!(
                !required(),
                "Docker is required here (FALLOW_CI_REQUIRE_SERVICES=1): {error}"
            );
            eprintln!("SKIPPED: the Docker leg of the executor suite: {error}");
            return None;
        }
    };
    static BUILT: tokio::sync::OnceCell<Result<(), String>> = tokio::sync::OnceCell::const_new();
    let built = BUILT
        .get_or_init(|| async {
            tokio::task::spawn_blocking(build_image)
                .await
                .unwrap_or_else(|error| Err(error.to_string()))
        })
        .await;
    if let Err(error) = built {
        assert!(!required(), "the test image could not be built: {error}");
        eprintln!("SKIPPED: the Docker leg of the executor suite: {error}");
        return None;
    }
    Some(executor)
}

/// A replica's command running `script` with /bin/sh: its arguments for the process executor
/// (whose `image` is the program), the whole line for a container image.
pub fn sh_command(image: &str, script: &str) -> Vec<String> {
    if image == "/bin/sh" {
        vec!["-c".into(), script.into()]
    } else {
        vec!["/bin/sh".into(), "-c".into(), script.into()]
    }
}
