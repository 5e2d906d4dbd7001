//! The dashboard against a real coordinator. One test reads its pages over HTTP: who may see
//! what (another tenant's job is a 404), sign-in and its cookie, escaping of what users wrote.
//! The other loads each page in headless Chromium (driven through chromedriver with fantoccini)
//! from a running `fallow dev` after real process jobs ran on its local agent (simulated GPUs,
//! billed with play money), checks what the pages say, and saves a screenshot of each (PNG) under `$FALLOW_TEST_ARTIFACTS/dashboard/`, or else
//! `target/test-artifacts/dashboard/`.
//!
//! Without `chromium` and `chromedriver` the browser test is skipped with a loud message, unless
//! `FALLOW_CI_REQUIRE_SERVICES=1`, where it fails.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{Scratch, eventually, free_port, http};
use fantoccini::{Client, ClientBuilder, Locator};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// How long the jobs of the browser test may take to run and be billed.
/// The local image the container job runs (busybox-static, imported: no registry is reachable).
const CONTAINER_IMAGE: &str = "fallow-dashboard-test-busybox:1";
const JOBS_DONE_WITHIN: Duration = Duration::from_secs(40);
/// How long a page element may take to show what is expected.
const PAGE_WITHIN: Duration = Duration::from_secs(10);
/// How long chromedriver and the processes started here may take to answer.
const READY_WITHIN: Duration = Duration::from_secs(30);
/// A job name that would run a script if a page did not escape it.
const SCRIPT_NAME: &str = "<script>alert(1)</script>";
/// Simulated GPUs of `fallow dev`'s node (even where the host has real ones): enough for the
/// jobs to run side by side.
const SIMULATED_GPUS: &str = "H100-SXM5:2";
/// The name `fallow dev` gives its local node.
const DEV_NODE: &str = "dev-node";

/// A child process killed (and reaped) when dropped; its output goes to a log file.
struct Process {
    name: String,
    log: PathBuf,
    child: Child,
}

impl Process {
    fn start(name: &str, command: &mut Command, log_dir: &Path) -> Process {
        let log = log_dir.join(format!("{name}.log"));
        let file = std::fs::File::create(&log).expect("create a process log");
        let child = command
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("clone the log handle"))
            .stderr(file)
            .spawn()
            .unwrap_or_else(|error| panic!("start {name}: {error}"));
        Process {
            name: name.to_string(),
            log,
            child,
        }
    }

    /// Ctrl-C, as a person stops it; a kill if it has not stopped within `within`.
    fn interrupt(mut self, within: Duration) {
        let _ = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        eprintln!("{} did not stop on Ctrl-C within {within:?}; killing it", self.name);
    }

    fn log_tail(&self) -> String {
        format!("{} log:\n{}", self.name, common::tail(&self.log, 4000))
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A program on the PATH (or the path in `override_env`), if there is one.
fn program(override_env: &str, names: &[&str]) -> Option<PathBuf> {
    if let Ok(path) = std::env::var(override_env) {
        return Some(PathBuf::from(path));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|dir| names.iter().map(move |name| dir.join(name)))
        .find(|candidate| candidate.is_file())
}

/// Where the screenshots go; made if missing.
fn artifacts_dir() -> PathBuf {
    let dir = match std::env::var_os("FALLOW_TEST_ARTIFACTS") {
        Some(root) => PathBuf::from(root).join("dashboard"),
        // The test binary is target/<profile>/deps/dashboard-<hash>.
        None => std::env::current_exe()
            .expect("the test binary's path")
            .ancestors()
            .nth(3)
            .expect("the target directory")
            .join("test-artifacts")
            .join("dashboard"),
    };
    std::fs::create_dir_all(&dir).expect("create the artifacts directory");
    dir
}

/// A coordinator (`fallow server`, billing simulated GPUs with play money so that costs show)
/// on a fresh SQLite database; its URL and admin key.
async fn start_coordinator(scratch: &Scratch) -> (Process, String, String) {
    let data_dir = scratch.path.join("server");
    std::fs::create_dir_all(&data_dir).expect("create the data directory");
    let url = format!("http://127.0.0.1:{}", free_port());
    let server = Process::start(
        "server",
        Command::new(env!("CARGO_BIN_EXE_fallow"))
            .args(["server", "--bill-simulated", "--listen"])
            .arg(url.trim_start_matches("http://"))
            .arg("--database")
            .arg(format!("sqlite://{}", data_dir.join("fallow.db").display()))
            .arg("--data-dir")
            .arg(&data_dir)
            .env_remove("FALLOW_DATABASE")
            .env_remove("FALLOW_LISTEN")
            .env_remove("FALLOW_DATA_DIR"),
        &scratch.path,
    );
    let client = http();
    let health = format!("{url}/v1/health");
    let deadline = Instant::now() + READY_WITHIN;
    while !matches!(client.get(&health).send().await, Ok(response) if response.status() == StatusCode::OK) {
        assert!(
            Instant::now() < deadline,
            "the coordinator did not start; {}",
            server.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let admin_key = std::fs::read_to_string(data_dir.join(server::ADMIN_KEY_FILE))
        .expect("the coordinator wrote the admin key")
        .trim()
        .to_string();
    (server, url, admin_key)
}

/// `fallow dev` (a coordinator, a local agent with simulated GPUs, demo tenant and provider) on
/// a free port; its process, URL and data directory once its node's keys are written.
async fn start_dev(scratch: &Scratch) -> (Process, String, PathBuf) {
    let data_dir = scratch.path.join("dev");
    let url = format!("http://127.0.0.1:{}", free_port());
    let dev = Process::start(
        "dev",
        Command::new(env!("CARGO_BIN_EXE_fallow"))
            .args(["dev", "--simulate-gpus", SIMULATED_GPUS, "--listen"])
            .arg(url.trim_start_matches("http://"))
            .arg("--data-dir")
            .arg(&data_dir)
            .env_remove("FALLOW_DATA_DIR")
            .env_remove("FALLOW_LISTEN"),
        &scratch.path,
    );
    let client = http();
    let health = format!("{url}/v1/health");
    let deadline = Instant::now() + READY_WITHIN;
    loop {
        let up = matches!(client.get(&health).send().await, Ok(response) if response.status() == StatusCode::OK);
        if up && data_dir.join("tenant.key").exists() && data_dir.join("provider.key").exists() {
            return (dev, url, data_dir);
        }
        assert!(
            Instant::now() < deadline,
            "fallow dev did not start; {}",
            dev.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn call(method: reqwest::Method, url: &str, key: &str, body: Option<Value>) -> (StatusCode, Value) {
    let mut request = http().request(method, url).bearer_auth(key);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap_or_else(|error| panic!("{url}: {error}"));
    let status = response.status();
    let text = response.text().await.unwrap_or_default();
    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

/// A new account of `role`; its id and API key. Tenants get $100 of credit.
async fn account(base: &str, admin_key: &str, role: &str, name: &str) -> (i64, String) {
    let (status, created) = call(
        reqwest::Method::POST,
        &format!("{base}/v1/admin/accounts"),
        admin_key,
        Some(json!({"role": role, "name": name})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let id = created["account"]["id"].as_i64().expect("an account id");
    let key = created["api_key"]["api_key"].as_str().expect("a key").to_string();
    if role == "tenant" {
        let (status, body) = call(
            reqwest::Method::POST,
            &format!("{base}/v1/admin/credits"),
            admin_key,
            Some(json!({"account_id": id, "amount": "100.00", "key": format!("credit-{name}")})),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    (id, key)
}

/// Submits a one-GPU silver job that runs `script` with `sh` (a process job); its id.
async fn submit(base: &str, tenant_key: &str, name: &str, script: &str) -> i64 {
    let (status, job) = call(
        reqwest::Method::POST,
        &format!("{base}/v1/jobs"),
        tenant_key,
        Some(json!({
            "name": name,
            "image": "sh",
            "command": ["-c", script],
            "runtime": "process",
            "gpus": 1,
            "tier": "silver",
            "max_price_per_gpu_hour": "5.00",
            "max_runtime_s": 600,
        })),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{job}");
    job["id"].as_i64().expect("a job id")
}

/// An HTTP client that does not follow redirects, to see them.
fn plain_http() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(20))
        .build()
        .expect("an HTTP client builds")
}

/// GET a dashboard page signed in with `key` (or not): its status, headers and text.
async fn page(url: &str, key: Option<&str>) -> (StatusCode, reqwest::header::HeaderMap, String) {
    let mut request = plain_http().get(url);
    if let Some(key) = key {
        request = request.header(reqwest::header::COOKIE, format!("fallow_key={key}"));
    }
    let response = request.send().await.unwrap_or_else(|error| panic!("{url}: {error}"));
    let (status, headers) = (response.status(), response.headers().clone());
    (status, headers, response.text().await.unwrap_or_default())
}

/// Posts the sign-in form with `key` (as a browser would, naming the page's origin if given).
async fn sign_in(login: &str, key: &str, origin: Option<&str>) -> reqwest::Response {
    let mut request = plain_http()
        .post(login)
        .header(reqwest::header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        // API keys are letters, digits and underscores: nothing to encode.
        .body(format!("key={key}"));
    if let Some(origin) = origin {
        request = request.header(reqwest::header::ORIGIN, origin);
    }
    request
        .send()
        .await
        .unwrap_or_else(|error| panic!("post {login}: {error}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_pages_show_each_party_only_its_own_and_escape_what_users_wrote() {
    let scratch = Scratch::new("fallow_dashboard_http");
    let (server, base, admin_key) = start_coordinator(&scratch).await;
    let (_, tenant_key) = account(&base, &admin_key, "tenant", "acme").await;
    let (_, other_key) = account(&base, &admin_key, "tenant", "rival").await;
    let (_, provider_key) = account(&base, &admin_key, "provider", "farm").await;
    // No node exists: the jobs stay queued, which is all this test needs.
    let job = submit(&base, &tenant_key, SCRIPT_NAME, "echo hi").await;
    let rivals_job = submit(&base, &other_key, "rivals-job", "echo hi").await;

    // The market is public; the pages of a party need its key.
    let (status, headers, market) = page(&format!("{base}/dashboard"), None).await;
    assert_eq!(status, StatusCode::OK, "{market}");
    assert!(market.contains("<svg class=\"chart\""), "an SVG chart: {market}");
    let policy = headers["content-security-policy"].to_str().unwrap();
    assert!(
        policy.starts_with("default-src 'none'") && !policy.contains("script-src"),
        "{policy}"
    );
    for path in [
        "/dashboard/tenant",
        "/dashboard/provider",
        &format!("/dashboard/jobs/{job}"),
    ] {
        let (status, headers, _) = page(&format!("{base}{path}"), None).await;
        assert_eq!(status, StatusCode::SEE_OTHER, "{path} without a key");
        assert_eq!(headers["location"], "/dashboard/login", "{path}");
    }
    let (status, _, _) = page(&format!("{base}/dashboard/tenant"), Some("fallow_000000000000_00")).await;
    assert_eq!(
        status,
        StatusCode::SEE_OTHER,
        "a key that does not authenticate signs no one in"
    );

    // Signing in checks the key and keeps it in a cookie scripts cannot read or other sites send.
    let login = format!("{base}/dashboard/login");
    let response = sign_in(&login, &tenant_key, None).await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    assert_eq!(response.headers()["location"], "/dashboard/tenant");
    let cookie = response.headers()["set-cookie"].to_str().unwrap().to_string();
    assert!(cookie.starts_with(&format!("fallow_key={tenant_key};")), "{cookie}");
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/dashboard"] {
        assert!(cookie.contains(attribute), "{attribute} in {cookie}");
    }
    let response = sign_in(&login, "fallow_000000000000_0000", None).await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert!(response.headers().get("set-cookie").is_none());
    let response = sign_in(&login, &tenant_key, Some("https://elsewhere.example")).await;
    assert_eq!(response.status(), StatusCode::FORBIDDEN, "a post from another site");
    assert!(response.headers().get("set-cookie").is_none());

    // The tenant's own job, with its name escaped everywhere it shows.
    let (status, _, tenant_page) = page(&format!("{base}/dashboard/tenant"), Some(&tenant_key)).await;
    assert_eq!(status, StatusCode::OK, "{tenant_page}");
    let (status, _, job_page) = page(&format!("{base}/dashboard/jobs/{job}"), Some(&tenant_key)).await;
    assert_eq!(status, StatusCode::OK, "{job_page}");
    for (what, html) in [("tenant page", &tenant_page), ("job page", &job_page)] {
        assert!(
            html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
            "{what}: the name, escaped: {html}"
        );
        assert!(!html.contains("<script"), "{what}: no script element: {html}");
    }
    assert!(
        !tenant_page.contains("rivals-job"),
        "another tenant's job is not listed"
    );

    // Another tenant's job is a 404, as in the API; so is any job for a provider.
    let (status, _, body) = page(&format!("{base}/dashboard/jobs/{rivals_job}"), Some(&tenant_key)).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert!(body.contains(&format!("job {rivals_job} not found")), "{body}");
    let (status, _, _) = page(&format!("{base}/dashboard/jobs/{job}"), Some(&other_key)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _, _) = page(&format!("{base}/dashboard/jobs/{job}"), Some(&provider_key)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // Each role's page is for that role.
    let (status, _, body) = page(&format!("{base}/dashboard/provider"), Some(&tenant_key)).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(body.contains("This page is for provider keys"), "{body}");
    let (status, _, body) = page(&format!("{base}/dashboard/provider"), Some(&provider_key)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.contains("No nodes yet"), "{body}");
    assert!(
        body.contains("<h2>Trust</h2>") && body.contains("The bronze badge needs a lower bound"),
        "the provider's standing: {body}"
    );

    // Signing out forgets the cookie.
    let response = plain_http()
        .get(format!("{base}/dashboard/logout"))
        .send()
        .await
        .expect("sign out");
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    assert!(response.headers()["set-cookie"].to_str().unwrap().contains("Max-Age=0"));
    drop(server);
}

/// chromedriver and a headless Chromium session through it.
struct Browser {
    client: Client,
    _driver: Process,
    shots: PathBuf,
}

impl Browser {
    async fn start(chromium: &Path, chromedriver: &Path, log_dir: &Path) -> Browser {
        let port = free_port();
        let driver = Process::start(
            "chromedriver",
            Command::new(chromedriver).arg(format!("--port={port}")),
            log_dir,
        );
        let webdriver = format!("http://127.0.0.1:{port}");
        eventually(READY_WITHIN, "chromedriver answers", || async {
            let response = http().get(format!("{webdriver}/status")).send().await.ok()?;
            response.status().is_success().then_some(())
        })
        .await;
        let mut capabilities = serde_json::Map::new();
        capabilities.insert(
            "goog:chromeOptions".to_string(),
            json!({
                "binary": chromium,
                "args": [
                    "--headless=new",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    "--disable-background-networking",
                    "--window-size=1280,1800",
                ],
            }),
        );
        let client = ClientBuilder::rustls()
            .expect("rustls for the WebDriver client")
            .capabilities(capabilities)
            .connect(&webdriver)
            .await
            .unwrap_or_else(|error| panic!("a Chromium session: {error}; {}", driver.log_tail()));
        let shots = artifacts_dir();
        // What an earlier failed run left would read as this run's failure.
        for entry in std::fs::read_dir(&shots)
            .expect("read the artifacts directory")
            .flatten()
        {
            if entry.file_name().to_string_lossy().starts_with("failed-") {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        Browser {
            client,
            _driver: driver,
            shots,
        }
    }

    async fn goto(&self, url: &str) {
        self.client
            .goto(url)
            .await
            .unwrap_or_else(|error| panic!("load {url}: {error}"));
    }

    async fn path(&self) -> String {
        self.client
            .current_url()
            .await
            .expect("the current URL")
            .path()
            .to_string()
    }

    /// Saves what the window shows as `NAME.png`.
    async fn shot(&self, name: &str) {
        let png = self.client.screenshot().await.expect("a screenshot");
        std::fs::write(self.shots.join(format!("{name}.png")), png).expect("write the screenshot");
    }

    /// The text of the first element matching `css` once it contains every one of `needles`;
    /// after `PAGE_WITHIN` without, saves `failed-STEP.png` and the page's HTML, and panics.
    async fn expect_text(&self, step: &str, css: &str, needles: &[&str]) -> String {
        let deadline = Instant::now() + PAGE_WITHIN;
        let mut last = String::new();
        loop {
            if let Ok(element) = self.client.find(Locator::Css(css)).await
                && let Ok(text) = element.text().await
            {
                if needles.iter().all(|needle| text.contains(needle)) {
                    return text;
                }
                last = text;
            }
            if Instant::now() >= deadline {
                let _ = self.shot(&format!("failed-{step}")).await;
                let source = self.client.source().await.unwrap_or_default();
                let _ = std::fs::write(self.shots.join(format!("failed-{step}.html")), &source);
                panic!("{step}: {css} never showed {needles:?}; it shows: {last:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn sign_in(&self, base: &str, key: &str, shot: Option<&str>) {
        self.goto(&format!("{base}/dashboard/login")).await;
        let input = self
            .client
            .find(Locator::Css("input#key"))
            .await
            .expect("the key field");
        input.send_keys(key).await.expect("type the key");
        if let Some(name) = shot {
            self.shot(name).await;
        }
        self.client
            .find(Locator::Css("form.login button"))
            .await
            .expect("the sign-in button")
            .click()
            .await
            .expect("sign in");
    }
}

/// Dollars in a text like `$0.001234`, as micro-dollars.
fn micros_in(text: &str) -> Option<i64> {
    let start = text.find('$')? + 1;
    let number: String = text[start..]
        .chars()
        .take_while(|character| character.is_ascii_digit() || *character == '.')
        .collect();
    model::Micros::parse_dollars(&number).map(|micros| micros.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_in_a_real_browser_shows_jobs_logs_costs_nodes_and_the_market() {
    let tools = (
        program("FALLOW_CHROMIUM", &["chromium", "chromium-browser", "google-chrome"]),
        program("FALLOW_CHROMEDRIVER", &["chromedriver"]),
    );
    let (Some(chromium), Some(chromedriver)) = tools else {
        if std::env::var("FALLOW_CI_REQUIRE_SERVICES").as_deref() == Ok("1") {
            panic!(
                "chromium and chromedriver are needed (FALLOW_CI_REQUIRE_SERVICES=1): apt-get install chromium chromium-driver"
            );
        }
        eprintln!(
            "SKIPPED: dashboard_in_a_real_browser_shows_jobs_logs_costs_nodes_and_the_market \
             (install chromium and chromium-driver, or set FALLOW_CHROMIUM and FALLOW_CHROMEDRIVER)"
        );
        return;
    };
    let started = Instant::now();
    let scratch = Scratch::new("fallow_dashboard_browser");
    let (dev, base, data_dir) = start_dev(&scratch).await;
    let key = |file: &str| {
        std::fs::read_to_string(data_dir.join(file))
            .unwrap_or_else(|error| panic!("fallow dev wrote {file}: {error}"))
            .trim()
            .to_string()
    };
    let (admin_key, tenant_key, provider_key) = (key("admin.key"), key("tenant.key"), key("provider.key"));
    let (_, other_key) = account(&base, &admin_key, "tenant", "rival").await;
    let nodes_url = format!("{base}/v1/nodes");
    eventually(READY_WITHIN, "the local agent's node online", || async {
        let (_, nodes) = call(reqwest::Method::GET, &nodes_url, &provider_key, None).await;
        nodes
            .as_array()?
            .iter()
            .any(|node| node["online"] == true)
            .then_some(())
    })
    .await;

    let hello = submit(
        &base,
        &tenant_key,
        "hello-job",
        "echo hello-dashboard; echo 128000 tokens >> \"$FALLOW_PROGRESS_FILE\"; sleep 1",
    )
    .await;
    let scripted = submit(&base, &tenant_key, SCRIPT_NAME, "echo '<b>not bold</b>'").await;
    let rivals = submit(&base, &other_key, "rivals-job", "echo rival").await;
    // A container job too, where a Docker Engine runs (required in CI).
    let container = match common::busybox_image(CONTAINER_IMAGE) {
        Ok(()) => {
            let (status, job) = call(
                reqwest::Method::POST,
                &format!("{base}/v1/jobs"),
                &tenant_key,
                Some(json!({
                    "name": "container-job",
                    "image": CONTAINER_IMAGE,
                    "command": ["/bin/sh", "-c", "echo hello-from-a-container; sleep 1"],
                    "runtime": "container",
                    "gpus": 1,
                    "tier": "silver",
                    "max_price_per_gpu_hour": "5.00",
                    "max_runtime_s": 600,
                })),
            )
            .await;
            assert_eq!(status, StatusCode::CREATED, "{job}");
            job["id"].as_i64()
        }
        Err(why) if std::env::var("FALLOW_CI_REQUIRE_SERVICES").as_deref() == Ok("1") => {
            panic!("the dashboard's container job must run here (FALLOW_CI_REQUIRE_SERVICES=1): {why}")
        }
        Err(why) => {
            eprintln!("SKIPPED the dashboard's container job: {why}");
            None
        }
    };
    let deadline = Instant::now() + JOBS_DONE_WITHIN;
    let mut jobs = vec![(hello, &tenant_key), (scripted, &tenant_key), (rivals, &other_key)];
    jobs.extend(container.map(|id| (id, &tenant_key)));
    for (id, key) in jobs {
        let url = format!("{base}/v1/jobs/{id}");
        loop {
            let (_, job) = call(reqwest::Method::GET, &url, key, None).await;
            if job["state"] == "finished" && job["cost_micros"].as_i64() > Some(0) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "job {id} not finished and billed within {JOBS_DONE_WITHIN:?}: {job}\n{}",
                dev.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    let browser = Browser::start(&chromium, &chromedriver, &scratch.path).await;

    // The market, public: GPUs online (simulated, and said so) and the price index as SVG.
    browser.goto(&format!("{base}/dashboard")).await;
    browser
        .expect_text("market", "section.stats", &["GPUs online", "2 (2 simulated)"])
        .await;
    browser
        .expect_text("market-gpus", "table.gpus", &["H100-SXM5", "simulated"])
        .await;
    browser
        .expect_text("market-index", "ul.legend", &["H100-SXM5 silver"])
        .await;
    let charts = browser
        .client
        .find_all(Locator::Css("svg.chart circle"))
        .await
        .expect("chart dots");
    assert!(!charts.is_empty(), "the price index has points");
    browser
        .expect_text("market-queue", "table.queue", &["silver", "100.0 %"])
        .await;
    browser.shot("market").await;

    // A party's page sends to the sign-in form; the key goes in, the tenant's page comes out.
    browser.goto(&format!("{base}/dashboard/tenant")).await;
    assert_eq!(browser.path().await, "/dashboard/login");
    browser.sign_in(&base, &tenant_key, Some("login")).await;
    browser
        .expect_text("tenant", "table.jobs", &["hello-job", "finished", SCRIPT_NAME])
        .await;
    assert_eq!(browser.path().await, "/dashboard/tenant");
    let cookie = browser
        .client
        .get_named_cookie("fallow_key")
        .await
        .expect("the sign-in cookie");
    assert_eq!(cookie.http_only(), Some(true));
    assert_eq!(format!("{:?}", cookie.same_site()), "Some(Strict)");
    let rows = browser
        .client
        .find_all(Locator::Css("table.jobs tbody tr"))
        .await
        .expect("job rows");
    let mut texts = Vec::new();
    for row in rows {
        texts.push(row.text().await.expect("a row's text"));
    }
    let hello_row = texts
        .iter()
        .find(|text| text.contains("hello-job"))
        .expect("the hello job's row");
    let cost = hello_row.rsplit(' ').next().and_then(micros_in);
    assert!(cost > Some(0), "the hello job's cost: {hello_row}");
    assert!(!texts.iter().any(|text| text.contains("rivals-job")), "{texts:?}");
    assert!(
        browser.client.get_alert_text().await.is_err(),
        "no script ran from a job's name"
    );
    browser.expect_text("tenant-spend", "ul.legend", &["spent"]).await;
    browser.shot("tenant").await;

    // The job's page: timeline, price, cost, tokens and logs.
    browser
        .client
        .find(Locator::LinkText("hello-job"))
        .await
        .expect("the job's link")
        .click()
        .await
        .expect("open the job");
    browser.expect_text("job", "h1", &["hello-job", "finished"]).await;
    assert_eq!(browser.path().await, format!("/dashboard/jobs/{hello}"));
    browser
        .expect_text(
            "job-timeline",
            "ol.events",
            &["submitted", "granted on node", "simulated", "running", "finished"],
        )
        .await;
    browser
        .client
        .find(Locator::Css("svg.timeline"))
        .await
        .expect("the timeline's drawing");
    let stats = browser
        .expect_text(
            "job-stats",
            "section.stats",
            &[
                "$2.00/GPU-h",
                "cost",
                "tokens done",
                "128000",
                "cost per million tokens",
            ],
        )
        .await;
    let lines: Vec<&str> = stats.lines().map(str::trim).collect();
    let cost = lines
        .iter()
        .position(|line| *line == "cost")
        .and_then(|label| micros_in(lines[label.checked_sub(1)?]));
    assert!(cost > Some(0), "a cost above $0: {stats}");
    browser.expect_text("job-logs", "pre.logs", &["hello-dashboard"]).await;
    browser.shot("job").await;

    // The container job's page: its image, its cost and its output.
    if let Some(container) = container {
        browser.goto(&format!("{base}/dashboard/jobs/{container}")).await;
        browser
            .expect_text("container-job", "section.stats", &["$2.00/GPU-h", "cost"])
            .await;
        browser
            .expect_text("container-job-logs", "pre.logs", &["hello-from-a-container"])
            .await;
        browser.shot("job-container").await;
    }

    // What a user wrote is shown as text, never as markup.
    browser.goto(&format!("{base}/dashboard/jobs/{scripted}")).await;
    let name = browser.expect_text("escaped", "h1 .job-name", &[SCRIPT_NAME]).await;
    assert_eq!(name, SCRIPT_NAME);
    browser
        .expect_text("escaped-logs", "pre.logs", &["<b>not bold</b>"])
        .await;
    assert!(
        browser.client.find(Locator::Css("pre.logs b")).await.is_err(),
        "no element from the logs"
    );
    assert!(browser.client.get_alert_text().await.is_err(), "no script ran");
    browser.shot("job-escaped").await;

    // Another tenant's job is not found.
    browser.goto(&format!("{base}/dashboard/jobs/{rivals}")).await;
    browser
        .expect_text("foreign", "main", &["Not Found", &format!("job {rivals} not found")])
        .await;
    browser.shot("job-of-another-tenant").await;

    // The provider: its node, marked simulated, with what its work earned.
    browser.goto(&format!("{base}/dashboard/logout")).await;
    assert_eq!(browser.path().await, "/dashboard");
    browser.sign_in(&base, &provider_key, None).await;
    let nodes = browser
        .expect_text(
            "provider",
            "table.nodes",
            &[DEV_NODE, "simulated", "online", "2 × H100-SXM5"],
        )
        .await;
    assert_eq!(browser.path().await, "/dashboard/provider");
    let node_row = nodes.lines().find(|line| line.contains(DEV_NODE)).unwrap_or(&nodes);
    assert!(
        micros_in(node_row).is_some_and(|micros| micros > 0),
        "the node's work was charged: {nodes}"
    );
    let stats = browser
        .expect_text("provider-stats", "section.stats", &["earnings balance"])
        .await;
    assert!(
        micros_in(&stats).is_some_and(|micros| micros > 0),
        "the provider earned: {stats}"
    );
    browser.expect_text("provider-earnings", "ul.legend", &["earned"]).await;
    browser.shot("provider").await;

    let _ = browser.client.close().await;
    dev.interrupt(READY_WITHIN);
    eprintln!(
        "dashboard browser test: {:.1} s; screenshots in {}",
        started.elapsed().as_secs_f64(),
        artifacts_dir().display()
    );
}
