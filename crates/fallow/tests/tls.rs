//! TLS end to end: a private CA and a server certificate for 127.0.0.1 and localhost made in the
//! test (rcgen), `fallow server` and `fallow gateway` serving them, and the real binary as the
//! CLI and as an agent dialling `https://` with `--ca-cert`. Also: plain HTTP to the TLS port
//! gets no answer; the CLI without the CA fails with a certificate error that says what to do;
//! bad TLS flags fail the start naming the flag; `/metrics` answers only an admin's key or the
//! metrics token.

mod common;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{READY_WITHIN, Scratch, cli, eventually, free_port, succeeded, tail, terminate};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use reqwest::StatusCode;
use serde_json::Value;

/// How long a process may take to stop after SIGTERM.
const STOPS_WITHIN: Duration = Duration::from_secs(20);
/// The metrics token the coordinator is given in a file.
const METRICS_TOKEN: &str = "tls-test-metrics-token-9f8e7d6c5b4a";

/// The files a TLS deployment is given: the CA's certificate (for clients) and the server's
/// certificate and key (for the coordinator and the gateway).
struct Pki {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

/// Makes a CA, and a server certificate for `127.0.0.1` and `localhost` signed by it, in `dir`.
fn make_pki(dir: &Path) -> Pki {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, "Fallow test CA");
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().expect("a CA key")).expect("the CA");
    let server_key = KeyPair::generate().expect("a server key");
    let mut params =
        CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).expect("server parameters");
    params.distinguished_name.push(DnType::CommonName, "localhost");
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let cert = params.signed_by(&server_key, &ca).expect("the server certificate");
    let pki = Pki {
        ca: dir.join("ca.pem"),
        cert: dir.join("server.pem"),
        key: dir.join("server.key"),
    };
    std::fs::write(&pki.ca, ca.pem()).expect("write ca.pem");
    std::fs::write(&pki.cert, cert.pem()).expect("write server.pem");
    std::fs::write(&pki.key, server_key.serialize_pem()).expect("write server.key");
    pki
}

/// An HTTP client that trusts only the test's CA.
fn trusting(pki: &Pki) -> reqwest::Client {
    let pem = std::fs::read(&pki.ca).expect("read ca.pem");
    let ca = reqwest::Certificate::from_pem(&pem).expect("the CA parses");
    reqwest::Client::builder()
        .no_proxy()
        .timeout(common::REQUEST_TIMEOUT)
        .tls_certs_only([ca])
        .build()
        .expect("an HTTPS client builds")
}

/// A process the test started, killed when dropped; its stderr and stdout go to `log`.
struct Process {
    name: &'static str,
    child: Option<Child>,
    log: PathBuf,
}

impl Process {
    fn spawn(name: &'static str, scratch: &Scratch, args: &[&str]) -> Process {
        let log = scratch.path.join(format!("{name}.log"));
        let file = std::fs::File::create(&log).expect("create the log");
        let child = Command::new(env!("CARGO_BIN_EXE_fallow"))
            .args(args)
            .env_clear()
            .env("HOME", &scratch.path)
            .env("FALLOW_LOG", "info")
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("clone the log handle"))
            .stderr(file)
            .spawn()
            .expect("spawn fallow");
        Process {
            name,
            child: Some(child),
            log,
        }
    }

    fn log(&self) -> String {
        tail(&self.log, 16_000)
    }

    /// Whether it is still running (false once it exited, which a check reports with its log).
    fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|child| child.try_wait().expect("poll the child").is_none())
    }

    /// SIGTERM, and a clean exit within `STOPS_WITHIN`.
    fn stop_cleanly(&mut self) {
        let child = self.child.take().expect("running");
        let status = terminate(child, STOPS_WITHIN);
        assert!(
            status.is_some_and(|status| status.success()),
            "{} did not stop cleanly on SIGTERM ({status:?}); its log:\n{}",
            self.name,
            self.log()
        );
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Waits until `url`'s `/v1/health` answers 200 over TLS.
async fn wait_healthy(process: &mut Process, http: &reqwest::Client, url: &str) {
    let deadline = Instant::now() + READY_WITHIN;
    loop {
        assert!(
            process.running(),
            "{} exited; its log:\n{}",
            process.name,
            process.log()
        );
        if let Ok(response) = http.get(format!("{url}/v1/health")).send().await
            && response.status() == StatusCode::OK
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} did not answer at {url} within {READY_WITHIN:?}; its log:\n{}",
            process.name,
            process.log()
        );
        tokio::time::sleep(common::POLL_EVERY).await;
    }
}

fn failed(output: &Output, what: &str, says: &[&str]) {
    common::failed_saying(output, what, says);
}

/// What a plain-HTTP request to `addr` gets back: the bytes read until the server closes the
/// connection (or a few seconds pass).
fn plain_http_answer(addr: &str) -> Vec<u8> {
    let mut stream = std::net::TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("a read timeout");
    stream
        .write_all(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .expect("send a plain HTTP request");
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    answer
}

/// `/metrics` with `key` as the bearer (none: no `Authorization`): the status and the body.
async fn scrape(http: &reqwest::Client, url: &str, key: Option<&str>) -> (StatusCode, String) {
    let mut request = http.get(format!("{url}/metrics"));
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    let response = request.send().await.expect("/metrics answers");
    let status = response.status();
    (status, response.text().await.unwrap_or_default())
}

#[tokio::test]
async fn tls_serves_the_cli_agents_gateways_and_refuses_plain_http() {
    let scratch = Scratch::new("fallow_tls");
    let pki = make_pki(&scratch.path);
    let http = trusting(&pki);
    let data_dir = scratch.path.join("coordinator");
    let database = format!("sqlite://{}", scratch.path.join("fallow.db").display());
    let token_file = scratch.path.join("metrics.token");
    std::fs::write(&token_file, format!("{METRICS_TOKEN}\n")).expect("write the token file");
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let url = format!("https://{addr}");
    let mut server = Process::spawn(
        "coordinator",
        &scratch,
        &[
            "server",
            "--database",
            &database,
            "--listen",
            &addr,
            "--data-dir",
            data_dir.to_str().expect("a UTF-8 path"),
            "--tls-cert",
            pki.cert.to_str().expect("a UTF-8 path"),
            "--tls-key",
            pki.key.to_str().expect("a UTF-8 path"),
            "--metrics-token-file",
            token_file.to_str().expect("a UTF-8 path"),
            "--heartbeat-interval-ms",
            "500",
        ],
    );
    wait_healthy(&mut server, &http, &url).await;
    assert!(
        server.log().contains(&format!("listening on https://{addr}")),
        "{}",
        server.log()
    );
    let admin_key = std::fs::read_to_string(data_dir.join(server::ADMIN_KEY_FILE))
        .expect("the admin key")
        .trim()
        .to_string();

    // Plain HTTP on the TLS port: the handshake fails and no HTTP answer comes back.
    let answer = plain_http_answer(&addr);
    assert!(
        !answer.starts_with(b"HTTP/"),
        "plain HTTP got an answer: {}",
        String::from_utf8_lossy(&answer)
    );
    if let Ok(response) = common::http().get(format!("http://{addr}/v1/health")).send().await {
        assert_ne!(response.status(), StatusCode::OK, "plain HTTP was served");
    }

    // The CLI over https with the CA, by flag and by environment; without it, a certificate
    // error that says what to do.
    let home = &scratch.path;
    let ca = pki.ca.to_str().expect("a UTF-8 path");
    let with_key = [("FALLOW_API_KEY", admin_key.as_str())];
    let listed = succeeded(
        &cli(
            home,
            &with_key,
            &["admin", "account", "list", "--url", &url, "--ca-cert", ca],
        ),
        "account list with --ca-cert",
    );
    assert!(listed.contains("admin"), "{listed}");
    let provider: Value = serde_json::from_str(&succeeded(
        &cli(
            home,
            &[
                ("FALLOW_API_KEY", &admin_key),
                ("FALLOW_URL", &url),
                ("FALLOW_CA_CERT", ca),
            ],
            &["admin", "account", "create", "farm", "--role", "provider", "--json"],
        ),
        "account create with FALLOW_CA_CERT",
    ))
    .expect("JSON");
    let provider_key = provider["api_key"]["api_key"].as_str().expect("a key").to_string();
    let tenant: Value = serde_json::from_str(&succeeded(
        &cli(
            home,
            &with_key,
            &[
                "admin",
                "account",
                "create",
                "acme",
                "--role",
                "tenant",
                "--json",
                "--url",
                &url,
                "--ca-cert",
                ca,
            ],
        ),
        "account create",
    ))
    .expect("JSON");
    let tenant_key = tenant["api_key"]["api_key"].as_str().expect("a key").to_string();
    failed(
        &cli(home, &with_key, &["admin", "account", "list", "--url", &url]),
        "account list without the CA",
        &["certificate", "--ca-cert"],
    );
    failed(
        &cli(
            home,
            &with_key,
            &["admin", "account", "list", "--url", &url, "--ca-cert", "missing-ca.pem"],
        ),
        "account list with a missing CA file",
        &["--ca-cert", "missing-ca.pem", "cannot be read"],
    );

    // /metrics: an admin's key or the metrics token; nobody else, a tenant neither.
    let (status, body) = scrape(&http, &url, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    let error: api::ErrorBody = serde_json::from_str(&body).expect("the API's error body");
    assert!(error.error.message.contains("metrics token"), "{body}");
    let (status, body) = scrape(&http, &url, Some(&tenant_key)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "a tenant read /metrics: {body}");
    let (status, body) = scrape(&http, &url, Some("not-the-token-but-as-long-as-it")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    let (status, body) = scrape(&http, &url, Some(&admin_key)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.contains("fallow_ledger_balance_micros"), "{body}");
    let (status, body) = scrape(&http, &url, Some(METRICS_TOKEN)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.contains("fallow_ledger_sum_micros"), "{body}");

    // A gateway of its own, serving TLS too and reporting to the coordinator over https.
    let gateway_addr = format!("127.0.0.1:{}", free_port());
    let gateway_url = format!("https://{gateway_addr}");
    let admin_key_file = data_dir.join(server::ADMIN_KEY_FILE);
    let mut gateway = Process::spawn(
        "gateway",
        &scratch,
        &[
            "gateway",
            "--coordinator",
            &url,
            "--ca-cert",
            ca,
            "--listen",
            &gateway_addr,
            "--api-key-file",
            admin_key_file.to_str().expect("a UTF-8 path"),
            "--tls-cert",
            pki.cert.to_str().expect("a UTF-8 path"),
            "--tls-key",
            pki.key.to_str().expect("a UTF-8 path"),
        ],
    );
    wait_healthy(&mut gateway, &http, &gateway_url).await;
    let listed = eventually(READY_WITHIN, "the gateway reports to the coordinator", || async {
        let response = http
            .get(format!("{url}/v1/gateways"))
            .bearer_auth(&admin_key)
            .send()
            .await
            .ok()?;
        let list: Value = response.json().await.ok()?;
        list["gateways"]
            .as_array()?
            .iter()
            .any(|gateway| gateway["url"] == gateway_url.as_str())
            .then_some(list)
    })
    .await;
    assert_eq!(listed["gateways"].as_array().map(Vec::len), Some(1), "{listed}");

    // An agent over https with the CA: it registers, heartbeats, and keeps its tunnels to the
    // coordinator's gateway and to the gateway of its own, both over TLS.
    let agent_dir = scratch.path.join("agent");
    let mut agent = Process::spawn(
        "agent",
        &scratch,
        &[
            "agent",
            "--coordinator",
            &url,
            "--ca-cert",
            ca,
            "--provider-key",
            &provider_key,
            "--data-dir",
            agent_dir.to_str().expect("a UTF-8 path"),
            "--name",
            "tls-node",
            "--simulate-gpus",
            "H100-SXM5:1",
            "--executor",
            "process",
        ],
    );
    let deadline = Instant::now() + READY_WITHIN;
    loop {
        assert!(agent.running(), "the agent exited; its log:\n{}", agent.log());
        let nodes: Option<Value> = match http
            .get(format!("{url}/v1/nodes"))
            .bearer_auth(&provider_key)
            .send()
            .await
        {
            Ok(response) => response.json().await.ok(),
            Err(_) => None,
        };
        let online = nodes.as_ref().and_then(Value::as_array).is_some_and(|nodes| {
            nodes
                .iter()
                .any(|node| node["name"] == "tls-node" && node["online"] == true)
        });
        let log = agent.log();
        let tunnels = [&url, &gateway_url].into_iter().all(|to| {
            log.lines()
                .any(|line| line.contains("the gateway's tunnel is up") && line.contains(&format!("\"{to}\"")))
        });
        if online && tunnels {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the agent is not online with both tunnels up (online: {online}, tunnels: {tunnels}); nodes: {nodes:?}\n\
             agent log:\n{log}\ngateway log:\n{}",
            gateway.log()
        );
        tokio::time::sleep(common::POLL_EVERY).await;
    }

    // SIGTERM stops each cleanly, TLS listeners and all.
    agent.stop_cleanly();
    gateway.stop_cleanly();
    server.stop_cleanly();
}

#[test]
fn tls_flags_that_cannot_work_fail_the_start_naming_the_flag() {
    let scratch = Scratch::new("fallow_tls_flags");
    let pki = make_pki(&scratch.path);
    let other_key = scratch.path.join("other.key");
    std::fs::write(&other_key, KeyPair::generate().expect("a key").serialize_pem()).expect("write other.key");
    let not_pem = scratch.path.join("not.pem");
    std::fs::write(&not_pem, "just some text\n").expect("write not.pem");
    let short_token = scratch.path.join("short.token");
    std::fs::write(&short_token, "abc\n").expect("write short.token");
    let path = |path: &Path| path.to_str().expect("a UTF-8 path").to_string();
    let (cert, key) = (path(&pki.cert), path(&pki.key));
    let database = format!("sqlite://{}", scratch.path.join("fallow.db").display());
    let data_dir = path(&scratch.path.join("data"));
    let server_with = |extra: &[&str]| {
        let mut args = vec![
            "server",
            "--database",
            &database,
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            &data_dir,
        ];
        args.extend_from_slice(extra);
        cli(&scratch.path, &[], &args)
    };
    let missing = path(&scratch.path.join("missing.pem"));
    let (not_pem, other_key, short_token) = (path(&not_pem), path(&other_key), path(&short_token));
    for (extra, says) in [
        (vec!["--tls-cert", &cert], vec!["--tls-key"]),
        (vec!["--tls-key", &key], vec!["--tls-cert"]),
        (
            vec!["--tls-cert", &missing, "--tls-key", &key],
            vec!["--tls-cert", "missing.pem", "cannot be read"],
        ),
        (
            vec!["--tls-cert", &not_pem, "--tls-key", &key],
            vec!["--tls-cert", "not.pem", "PEM"],
        ),
        (
            vec!["--tls-cert", &cert, "--tls-key", &not_pem],
            vec!["--tls-key", "not.pem", "PEM"],
        ),
        (
            vec!["--tls-cert", &cert, "--tls-key", &other_key],
            vec!["--tls-cert and --tls-key"],
        ),
        (
            vec!["--metrics-token-file", &short_token],
            vec!["metrics token", "at least 16"],
        ),
    ] {
        failed(&server_with(&extra), &format!("fallow server {extra:?}"), &says);
    }
    failed(
        &cli(
            &scratch.path,
            &[],
            &[
                "gateway",
                "--coordinator",
                "https://127.0.0.1:1",
                "--api-key",
                "k",
                "--tls-cert",
                &cert,
            ],
        ),
        "a gateway with --tls-cert alone",
        &["--tls-key"],
    );
    failed(
        &cli(
            &scratch.path,
            &[],
            &["agent", "--coordinator", "https://127.0.0.1:1", "--ca-cert", &not_pem],
        ),
        "an agent with a CA file that is not PEM",
        &["--ca-cert", "not.pem", "no PEM certificate"],
    );
}
