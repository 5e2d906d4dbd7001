//! The provider's installs, tried as a provider would (docs/packaging.md):
//!
//! - The Debian package, made with cargo-deb from the binary these tests built: `lintian` finds
//!   no error in it; it installs with `dpkg -i` into a clean Debian root (made with mmdebstrap
//!   and `docker import`: no registry is reachable), which then has the `fallow` user, the data
//!   directories and the config files with their owners and modes; `systemd-analyze verify`
//!   passes on its units there; the agent started as the unit starts it (the `fallow` user, the
//!   unit's environment, /etc/fallow/agent.toml) joins a coordinator; `docker stop` stops it
//!   with exit status 0; a purge removes /var/lib/fallow.
//! - The agent's container image (`fallow agent image`) run with the host's Docker socket and its
//!   data directory at the same path joins `fallow dev`'s coordinator, runs a container job
//!   through the host's Docker Engine, and stops with status 0 on `docker stop`.
//!
//! Each needs a Docker Engine; the package also needs cargo-deb, lintian, mmdebstrap and
//! Debian's mirror. Without them a test is skipped loudly, unless `FALLOW_CI_REQUIRE_SERVICES=1`,
//! where it fails.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{Coordinator, Scratch, User};
use serde_json::Value;

/// How long a node may take to come online, and a job to finish.
const WITHIN: Duration = Duration::from_secs(60);
/// The clean Debian root the package is installed into (made once, then reused).
const DEBIAN_IMAGE: &str = "fallow-test-debian";
/// What the clean root holds beyond Debian's minimal base: systemd's tools (for
/// `systemd-analyze`) and the package's dependencies, as `apt install` would have fetched them.
const DEBIAN_INCLUDE: &str = "adduser,ca-certificates,systemd";
/// The local image the image agent's job runs (busybox-static, imported).
const JOB_IMAGE: &str = "fallow-packaging-test-busybox:1";

/// Skips the test loudly with `why`, or fails it where CI requires every service.
fn unavailable(test: &str, why: &str) {
    if std::env::var("FALLOW_CI_REQUIRE_SERVICES").as_deref() == Ok("1") {
        panic!("{test} must run here (FALLOW_CI_REQUIRE_SERVICES=1): {why}");
    }
    eprintln!("SKIPPED {test}: {why}");
}

/// Whether `program ARGS` runs and succeeds.
fn works(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// Runs `program ARGS`; its output, or why it could not start.
fn run(program: &str, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|error| panic!("{program} {}: {error}", args.join(" ")))
}

/// Its stdout, after checking that it succeeded.
fn ok(output: Output, what: &str) -> String {
    common::succeeded(&output, what)
}

/// Removes a container when dropped.
struct Container(String);

impl Drop for Container {
    fn drop(&mut self) {
        let _ = Command::new("docker")
            .args(["rm", "-f", &self.0])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

impl Container {
    /// `docker run -d` on the host's network of `args` (options, the image, its arguments), as
    /// a container named after `what`.
    fn start(what: &str, args: &[&str]) -> Container {
        let container = Container(common::unique(what));
        let mut line = vec!["run", "-d", "--name", &container.0, "--network", "host"];
        line.extend_from_slice(args);
        ok(run("docker", &line), &format!("starting {what}"));
        container
    }

    fn logs(&self) -> String {
        let output = run("docker", &["logs", &self.0]);
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    }

    /// `docker stop` (SIGTERM, then SIGKILL after `grace_s`), and the status it exited with.
    fn stop(&self, grace_s: u32) -> i64 {
        ok(
            run("docker", &["stop", "-t", &grace_s.to_string(), &self.0]),
            "docker stop",
        );
        let code = ok(
            run("docker", &["inspect", "--format", "{{.State.ExitCode}}", &self.0]),
            "docker inspect",
        );
        code.trim().parse().expect("an exit code")
    }
}

/// Waits until the provider's node named `name` is online; its view.
fn wait_online(provider: &User<'_>, name: &str, container: &Container) -> Value {
    let deadline = Instant::now() + WITHIN;
    loop {
        let nodes = provider.json("node list --json");
        let found = nodes
            .as_array()
            .and_then(|nodes| nodes.iter().find(|node| node["name"] == name && node["online"] == true));
        if let Some(node) = found {
            return node.clone();
        }
        assert!(
            Instant::now() < deadline,
            "node {name} is not online: {nodes}\ncontainer log:\n{}",
            container.logs()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The host's Debian release (`VERSION_CODENAME` of /etc/os-release): the clean root is made
/// of the same release, so the binary built here finds the C library it was linked against.
fn host_codename() -> Option<String> {
    let release = std::fs::read_to_string("/etc/os-release").ok()?;
    release
        .lines()
        .find_map(|line| line.strip_prefix("VERSION_CODENAME="))
        .map(|name| name.trim_matches('"').to_string())
        .filter(|name| !name.is_empty())
}

/// A clean Debian root of the host's release with `DEBIAN_INCLUDE`, imported into Docker unless
/// it is there already; its tag.
fn clean_debian(codename: &str) -> Result<String, String> {
    let tag = format!("{DEBIAN_IMAGE}:{codename}-{}", DEBIAN_INCLUDE.replace(',', "-"));
    if works("docker", &["image", "inspect", &tag]) {
        return Ok(tag);
    }
    let scratch = Scratch::new("fallow-debian-root");
    let tarball = scratch.path.join("root.tar");
    let made = Command::new("mmdebstrap")
        .args([
            "--variant=minbase",
            &format!("--include={DEBIAN_INCLUDE}"),
            "--quiet",
            codename,
        ])
        .arg(&tarball)
        .arg("http://deb.debian.org/debian")
        .stdin(Stdio::null())
        .output()
        .map_err(|error| format!("mmdebstrap: {error}"))?;
    if !made.status.success() {
        return Err(format!(
            "mmdebstrap {codename}: {}",
            String::from_utf8_lossy(&made.stderr).trim()
        ));
    }
    let imported = run("docker", &["import", &tarball.display().to_string(), &tag]);
    if !imported.status.success() {
        return Err(format!(
            "docker import: {}",
            String::from_utf8_lossy(&imported.stderr).trim()
        ));
    }
    Ok(tag)
}

/// The workspace's root (where `cargo deb` runs).
fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("the workspace holds crates/fallow")
        .to_path_buf()
}

/// The target directory these tests' binary is in (`target/debug/fallow` → `target`).
fn target_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_fallow"))
        .ancestors()
        .nth(2)
        .expect("the binary sits in TARGET/PROFILE/")
        .to_path_buf()
}

/// The .deb of the binary these tests built, written to `out`.
fn build_deb(out: &Path) -> Result<PathBuf, String> {
    let deb = out.join("fallow.deb");
    let built = Command::new("cargo")
        .current_dir(workspace())
        .args(["deb", "-p", "fallow", "--no-build", "--profile", "dev", "--output"])
        .arg(&deb)
        .env("CARGO_TARGET_DIR", target_dir())
        .stdin(Stdio::null())
        .output()
        .map_err(|error| format!("cargo deb: {error}"))?;
    if !built.status.success() {
        return Err(format!("cargo deb: {}", String::from_utf8_lossy(&built.stderr).trim()));
    }
    Ok(deb)
}

#[tokio::test]
async fn the_deb_passes_lintian_installs_into_clean_debian_and_its_agent_joins_a_coordinator() {
    const TEST: &str = "the .deb test";
    for (tool, args) in [
        ("docker", &["version"][..]),
        ("cargo", &["deb", "--version"][..]),
        ("lintian", &["--version"][..]),
        ("mmdebstrap", &["--version"][..]),
    ] {
        if !works(tool, args) {
            return unavailable(TEST, &format!("`{tool} {}` does not run", args.join(" ")));
        }
    }
    let Some(codename) = host_codename() else {
        return unavailable(TEST, "this host is not Debian (no VERSION_CODENAME in /etc/os-release)");
    };
    let image = match clean_debian(&codename) {
        Ok(image) => image,
        Err(why) => return unavailable(TEST, &why),
    };
    let scratch = Scratch::new("fallow_packaging_deb");
    let deb = build_deb(&scratch.path).expect("cargo deb builds the package");

    // lintian: no error (warnings and notes are printed for whoever reads the log).
    let linted = run(
        "lintian",
        &[
            "--fail-on",
            "error",
            "--tag-display-limit",
            "0",
            &deb.display().to_string(),
        ],
    );
    let tags = String::from_utf8_lossy(&linted.stdout).into_owned();
    eprintln!("lintian:\n{tags}");
    assert!(
        linted.status.success() && !tags.lines().any(|line| line.starts_with("E:")),
        "lintian finds errors:\n{tags}{}",
        String::from_utf8_lossy(&linted.stderr)
    );

    // Installed into the clean root: the user, the directories, the config files, the units.
    let pkg = format!("{}:/pkg:ro", scratch.path.display());
    let installed = ok(
        run(
            "docker",
            &[
                "run",
                "--rm",
                "-v",
                &pkg,
                &image,
                "sh",
                "-ec",
                "dpkg -i /pkg/fallow.deb >/dev/null
                 id -u fallow >/dev/null && echo user=$(id -nG fallow)
                 echo shell=$(getent passwd fallow | cut -d: -f7)
                 stat -c '%n %a %U:%G' /var/lib/fallow /var/lib/fallow/agent /var/lib/fallow/server \
                   /etc/fallow/agent.toml /etc/fallow/server.toml
                 units=$(dpkg -L fallow | grep '\\.service$' | sort | tr '\\n' ' ')
                 echo units=$units
                 systemd-analyze verify $units && echo verify=ok
                 fallow --version
                 fallow agent --help | grep -q FALLOW_AGENT_CONFIG && echo help=ok
                 dpkg --purge fallow >/dev/null
                 test ! -e /var/lib/fallow && echo purged=ok",
            ],
        ),
        "installing the .deb",
    );
    eprintln!("in the clean root:\n{installed}");
    for line in [
        "shell=/usr/sbin/nologin",
        "/var/lib/fallow 750 fallow:fallow",
        "/var/lib/fallow/agent 750 fallow:fallow",
        "/var/lib/fallow/server 750 fallow:fallow",
        "/etc/fallow/agent.toml 640 root:fallow",
        "/etc/fallow/server.toml 640 root:fallow",
        "/fallow-agent.service",
        "/fallow-server.service",
        "verify=ok",
        "help=ok",
        "purged=ok",
    ] {
        assert!(installed.contains(line), "{line:?} not in:\n{installed}");
    }

    // The packaged agent, started as its unit starts it, joins a coordinator on this host.
    let coordinator = Coordinator::in_scratch(&scratch).await;
    let admin = User {
        home: &scratch.path,
        url: coordinator.url.clone(),
        key: coordinator.admin_key().expect("the coordinator wrote the admin key"),
    };
    let created = admin.json("admin account create basement --role provider --json");
    let provider = User {
        home: &scratch.path,
        url: coordinator.url.clone(),
        key: created["api_key"]["api_key"].as_str().expect("a key").to_string(),
    };
    let name = common::unique("packaged");
    let settings = format!(
        "coordinator = \"{}\"\nprovider-key = \"{}\"\nname = \"{name}\"\nsimulate-gpus = \"H100-SXM5:1\"\nexecutor = \"process\"\n",
        coordinator.url, provider.key
    );
    std::fs::write(scratch.path.join("settings.toml"), settings).expect("write the settings");
    let container = Container::start(
        "fallow-deb-agent",
        &[
            "-v",
            &pkg,
            &image,
            "sh",
            "-ec",
            // The unit's user, environment and working directory; exec, so that the agent gets
            // `docker stop`'s SIGTERM itself, as it gets systemd's.
            "dpkg -i /pkg/fallow.deb >/dev/null
             cat /pkg/settings.toml >> /etc/fallow/agent.toml
             cd /var/lib/fallow/agent
             exec setpriv --reuid=fallow --regid=fallow --init-groups env \
               FALLOW_AGENT_DATA_DIR=/var/lib/fallow/agent FALLOW_AGENT_CONFIG=/etc/fallow/agent.toml \
               /usr/bin/fallow agent",
        ],
    );
    let node = wait_online(&provider, &name, &container);
    assert_eq!(node["simulated"], true, "{node}");
    assert_eq!(
        container.stop(30),
        0,
        "the agent's exit on SIGTERM:\n{}",
        container.logs()
    );
}

#[tokio::test]
async fn the_agent_image_joins_fallow_dev_and_runs_a_container_job() {
    const TEST: &str = "the agent image test";
    if !works("docker", &["version"]) {
        return unavailable(TEST, "no Docker Engine answers");
    }
    if let Err(why) = common::busybox_image(JOB_IMAGE) {
        return unavailable(TEST, &why);
    }
    let scratch = Scratch::new("fallow_packaging_image");
    let tag = format!("{}:1", common::unique("fallow-agent-test"));
    let built = ok(
        run(env!("CARGO_BIN_EXE_fallow"), &["agent", "image", "--tag", &tag]),
        "fallow agent image",
    );
    assert_eq!(built.trim(), tag, "it prints the tag");
    struct Image(String);
    impl Drop for Image {
        fn drop(&mut self) {
            let _ = Command::new("docker").args(["rmi", "-f", &self.0]).output();
        }
    }
    let _image = Image(tag.clone());

    // fallow dev without its own agent: the image's agent is the only node.
    let port = common::free_port();
    let url = format!("http://127.0.0.1:{port}");
    let data_dir = scratch.path.join("dev");
    let log = scratch.path.join("dev.log");
    let mut dev = Command::new(env!("CARGO_BIN_EXE_fallow"))
        .args([
            "dev",
            "--no-agent",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--data-dir",
        ])
        .arg(&data_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("the log file"))
        .spawn()
        .expect("start fallow dev");
    let started = Instant::now();
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("Ctrl-C stops everything")
    {
        assert!(
            started.elapsed() < WITHIN && dev.try_wait().expect("wait").is_none(),
            "fallow dev is not ready:\n{}",
            common::tail(&log, 4000)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let key = |file: &str| {
        std::fs::read_to_string(data_dir.join(file))
            .expect("a key file")
            .trim()
            .to_string()
    };
    let provider = User {
        home: &scratch.path,
        url: url.clone(),
        key: key("provider.key"),
    };
    let tenant = User {
        home: &scratch.path,
        url: url.clone(),
        key: key("tenant.key"),
    };

    // The agent's data directory at the same path inside and out: the Docker daemon it drives
    // mounts the replicas' scratch directories from the host.
    let agent_dir = scratch.path.join("agent");
    std::fs::create_dir_all(&agent_dir).expect("the agent's directory");
    let agent_dir = agent_dir.display().to_string();
    let name = common::unique("imaged");
    let container = Container::start(
        "fallow-image-agent",
        &[
            "-v",
            "/var/run/docker.sock:/var/run/docker.sock",
            "-v",
            &format!("{agent_dir}:{agent_dir}"),
            "-e",
            &format!("FALLOW_AGENT_DATA_DIR={agent_dir}"),
            "-e",
            &format!("FALLOW_COORDINATOR={url}"),
            "-e",
            &format!("FALLOW_PROVIDER_KEY={}", provider.key),
            &tag,
            "--name",
            &name,
            "--simulate-gpus",
            "H100-SXM5:1",
            "--usage-every-s",
            "1",
        ],
    );
    let node = wait_online(&provider, &name, &container);
    assert_eq!(node["simulated"], true, "{node}");

    let submitted = tenant.json(&format!(
        "job submit --json --image {JOB_IMAGE} --gpus 1 --tier silver --max-price 5 -- echo hi-from-the-image-agent"
    ));
    let id = submitted["id"].as_i64().expect("an id");
    let deadline = Instant::now() + WITHIN;
    loop {
        let job = tenant.json(&format!("job show {id} --json"));
        match job["state"].as_str() {
            Some("finished") => break,
            Some("failed" | "cancelled") => panic!("job {id} ended badly: {job}\nagent:\n{}", container.logs()),
            _ => {}
        }
        assert!(
            Instant::now() < deadline,
            "job {id} is not finished: {job}\nagent:\n{}",
            container.logs()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let logs = tenant.ok(&format!("job logs {id}"));
    assert!(logs.contains("hi-from-the-image-agent"), "{logs}");
    assert_eq!(
        container.stop(30),
        0,
        "the agent's exit on SIGTERM:\n{}",
        container.logs()
    );
    let _ = Command::new("kill").args(["-TERM", &dev.id().to_string()]).status();
    let status = dev.wait().expect("fallow dev exits");
    assert!(status.success(), "fallow dev: {status}");
}
