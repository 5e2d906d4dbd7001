//! `fallow dev` started as a user starts it, and the CLI run against it with the keys it wrote.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// How long `fallow dev` may take to start or stop, and a job there to end.
pub const WITHIN: Duration = Duration::from_secs(40);

/// `fallow dev`, its stderr in a file of the scratch directory.
pub struct Dev {
    child: Child,
    log: PathBuf,
}

impl Dev {
    pub fn start(data_dir: &Path, port: u16, log: PathBuf) -> Dev {
        Dev::start_with(data_dir, port, log, &[])
    }

    /// Started with these environment variables besides the test's.
    pub fn start_with(data_dir: &Path, port: u16, log: PathBuf, env: &[(&str, &str)]) -> Dev {
        let child = Command::new(env!("CARGO_BIN_EXE_fallow"))
            .envs(env.iter().copied())
            .args(["dev", "--data-dir"])
            .arg(data_dir)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("start fallow dev");
        Dev { child, log }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until it says it is ready (it prints the dashboard's address last).
    pub fn wait_ready(&mut self) {
        let start = Instant::now();
        while !self.log().contains("Ctrl-C stops everything") {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("fallow dev exited with {status}:\n{}", self.log());
            }
            assert!(start.elapsed() < WITHIN, "fallow dev is not ready:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A signal (`-INT`: Ctrl-C; `-TERM`: what systemd and `docker stop` send), and how it exited.
    pub fn stop_with(&mut self, signal: &str) -> std::process::ExitStatus {
        send_signal(self.child.id(), signal);
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            assert!(start.elapsed() < WITHIN, "fallow dev did not stop:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A signal through kill(1) (`-INT` as a terminal's Ctrl-C would send it).
pub fn send_signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .expect("kill(1) runs");
    assert!(status.success());
}

/// The CLI with `FALLOW_URL` and `FALLOW_API_KEY` set, as the README says.
pub fn fallow(url: &str, key: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fallow"))
        .args(args)
        .env("FALLOW_URL", url)
        .env("FALLOW_API_KEY", key)
        .env("FALLOW_CONFIG", "/dev/null")
        .stdin(Stdio::null())
        .output()
        .expect("run the fallow binary")
}

/// A successful command's stdout as JSON.
pub fn json(output: Output, what: &str) -> serde_json::Value {
    let stdout = super::succeeded(&output, what);
    serde_json::from_str(&stdout).unwrap_or_else(|error| panic!("{what}: {error} in {stdout}"))
}

/// A `fallow dev` started in a scratch directory of its own and ready: its URL and the demo
/// tenant's key (the scratch directory is removed when this is dropped, after `dev`).
pub struct Started {
    pub dev: Dev,
    pub url: String,
    pub tenant_key: String,
    pub scratch: super::Scratch,
}

pub fn start_ready(name: &str) -> Started {
    let scratch = super::Scratch::new(name);
    let data_dir = scratch.path.join("data");
    let port = super::free_port();
    let mut dev = Dev::start(&data_dir, port, scratch.path.join("dev.log"));
    dev.wait_ready();
    let key = std::fs::read_to_string(data_dir.join("tenant.key")).expect("tenant.key");
    Started {
        dev,
        url: format!("http://127.0.0.1:{port}"),
        tenant_key: key.trim().to_string(),
        scratch,
    }
}
