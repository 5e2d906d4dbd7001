//! The `fallow` CLI against a real coordinator: each test starts `fallow server` on a free port
//! with a scratch data directory, makes accounts with the admin's key, and runs the real binary
//! as a user would, reading its tables and its `--json`.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use api::{NodeRegistration, NodeView, PolicyDoc};
use common::{Coordinator, Scratch, cli as fallow};
use serde_json::{Value, json};

/// A key that has the shape of an API key but that no coordinator issued.
const UNKNOWN_KEY: &str = "fallow_000000000000_0000000000000000000000000000000000000000000000000000000000000000";
/// How long a job run by a real agent may take to finish.
const JOB_FINISHES_WITHIN: Duration = Duration::from_secs(30);

/// Its stdout, after checking that it succeeded.
fn ok(output: Output, what: &str) -> String {
    common::succeeded(&output, what)
}

fn ok_json(output: Output, what: &str) -> Value {
    let stdout = ok(output, what);
    serde_json::from_str(&stdout).unwrap_or_else(|error| panic!("{what}: {error} in {stdout}"))
}

/// Its stderr, after checking that it failed with every one of `says` in it.
fn fails(output: Output, what: &str, says: &[&str]) -> String {
    common::failed_saying(&output, what, says)
}

/// One user of the CLI: a coordinator's URL and a key. Commands are given as a line split at
/// spaces, with `extra` arguments (that may hold spaces) after it.
struct User<'a> {
    home: &'a Path,
    url: String,
    key: String,
}

impl User<'_> {
    fn run(&self, line: &str, extra: &[&str]) -> Output {
        let args: Vec<&str> = line.split_whitespace().chain(extra.iter().copied()).collect();
        fallow(
            self.home,
            &[("FALLOW_URL", &self.url), ("FALLOW_API_KEY", &self.key)],
            &args,
        )
    }

    fn ok(&self, line: &str) -> String {
        ok(self.run(line, &[]), line)
    }

    fn ok_with(&self, line: &str, extra: &[&str]) -> String {
        ok(self.run(line, extra), line)
    }

    fn json(&self, line: &str) -> Value {
        ok_json(self.run(line, &[]), line)
    }

    fn fails(&self, line: &str, says: &[&str]) -> String {
        fails(self.run(line, &[]), line, says)
    }

    fn fails_with(&self, line: &str, extra: &[&str], says: &[&str]) -> String {
        fails(self.run(line, extra), line, says)
    }
}

async fn start(scratch: &Scratch) -> Coordinator {
    Coordinator::in_scratch(scratch).await
}

fn admin<'a>(scratch: &'a Scratch, coordinator: &Coordinator) -> User<'a> {
    User {
        home: &scratch.path,
        url: coordinator.url.clone(),
        key: coordinator.admin_key().expect("the coordinator wrote the admin key"),
    }
}

/// Creates an account through the CLI; its id and a user with its first key.
fn account<'a>(admin: &User<'a>, role: &str, name: &str) -> (i64, User<'a>) {
    let created = admin.json(&format!("admin account create {name} --role {role} --json"));
    let user = User {
        home: admin.home,
        url: admin.url.clone(),
        key: created["api_key"]["api_key"].as_str().expect("a key").to_string(),
    };
    (created["account"]["id"].as_i64().expect("an id"), user)
}

/// Registers a simulated two-GPU node through the API (no agent runs for it, so it stays
/// offline and jobs stay queued).
async fn register_node(provider: &User<'_>, name: &str) -> i64 {
    let registration = NodeRegistration {
        name: name.to_string(),
        public_key: trust::NodeKey::generate().public_hex(),
        fingerprint: format!("fp-{name}"),
        gpu_model: common::GPU_MODEL.to_string(),
        gpu_count: 2,
        cpu_milli: 64_000,
        memory_mib: 262_144,
        network_mbit_s: 10_000,
        region: "eu-west".to_string(),
        site: "ams1".to_string(),
        fabric: String::new(),
        nvlink_domain: String::new(),
        latitude: 0.0,
        longitude: 0.0,
        simulated: true,
        runtimes: Vec::new(),
        canary_kinds: Vec::new(),
        advertise_addr: String::new(),
        gang_ports: String::new(),
        nvlink_source: String::new(),
        nvlink_detected: String::new(),
        policy: PolicyDoc {
            asks: BTreeMap::from([("silver".to_string(), common::ASK_DOLLARS.to_string())]),
            ..PolicyDoc::default()
        },
    };
    let response = common::http()
        .post(format!("{}/v1/nodes", provider.url))
        .bearer_auth(&provider.key)
        .json(&registration)
        .send()
        .await
        .expect("register a node");
    assert_eq!(response.status(), reqwest::StatusCode::CREATED);
    response.json::<NodeView>().await.expect("a node view").id
}

/// Kills the child process when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn row_of<'a>(table: &'a str, first_cell: &str) -> Option<&'a str> {
    table
        .lines()
        .find(|line| line.split_whitespace().next() == Some(first_cell))
}

#[tokio::test]
async fn cli_tenant_submits_lists_quotes_cancels_and_reads_money() {
    let scratch = Scratch::new("fallow_cli_tenant");
    let coordinator = start(&scratch).await;
    let admin = admin(&scratch, &coordinator);
    let (tenant_id, tenant) = account(&admin, "tenant", "acme");
    let (_, provider) = account(&admin, "provider", "farm");
    let credited = admin.ok(&format!("admin credit {tenant_id} 100 --key first"));
    assert!(credited.contains("available now $100.00"), "{credited}");
    // The same idempotency key credits once.
    let again = admin.json(&format!("admin credit {tenant_id} 100 --key first --json"));
    assert_eq!(again["available_micros"], 100_000_000);
    register_node(&provider, "gpu-a").await;

    let submitted = tenant.json(
        "job submit --json --name hello --gpus 1 --tier silver --max-price 5 --region eu-west \
         --checkpoint-dir /ckpt --image busybox:latest -- echo hi",
    );
    let id = submitted["id"].as_i64().expect("the job's id");
    assert_eq!(submitted["state"], "queued");
    assert_eq!(submitted["spec"]["command"], json!(["echo", "hi"]));
    assert_eq!(submitted["spec"]["checkpoint_dir"], "/ckpt");
    assert_eq!(submitted["spec"]["regions"], json!(["eu-west"]));

    let table = tenant.ok("job list");
    assert!(table.starts_with("ID  NAME "), "{table}");
    let row = row_of(&table, &id.to_string()).unwrap_or_else(|| panic!("job {id} not in {table}"));
    assert!(
        row.contains("hello") && row.contains("queued") && row.contains("$5.00"),
        "{row}"
    );
    assert_eq!(tenant.json("job list --json")["jobs"][0]["id"], id);

    let shown = tenant.ok(&format!("job show {id}"));
    assert!(shown.contains("state:") && shown.contains("queued"), "{shown}");
    assert!(shown.contains("image:") && shown.contains("busybox:latest"), "{shown}");
    assert_eq!(tenant.json(&format!("job show {id} --json"))["state"], "queued");
    // No output yet: nothing on stdout, and why on stderr; `--json` is left as it was.
    let logs = tenant.run(&format!("job logs {id}"), &[]);
    let stderr = String::from_utf8_lossy(&logs.stderr).into_owned();
    assert_eq!(ok(logs, "job logs"), "");
    assert_eq!(stderr.trim(), "no output yet: the job is queued");
    let logs = tenant.run(&format!("job logs {id} --json"), &[]);
    assert!(logs.stderr.is_empty(), "{}", String::from_utf8_lossy(&logs.stderr));
    assert_eq!(ok_json(logs, "job logs --json")["chunks"], json!([]));

    // A job file, with flags over its fields.
    let file = scratch.path.join("job.json");
    std::fs::write(
        &file,
        r#"{"name": "from-file", "image": "busybox", "gpus": 2, "tier": "bronze", "max_price_per_gpu_hour": "0.50"}"#,
    )
    .expect("write the job file");
    let from_file = ok_json(
        tenant.run(
            "job submit --gpu-share 250 --max-price 1.5 --json --file",
            &[file.to_str().expect("UTF-8")],
        ),
        "submit a job file",
    );
    assert_eq!(from_file["spec"]["name"], "from-file");
    assert_eq!(from_file["spec"]["tier"], "bronze");
    assert_eq!(from_file["spec"]["gpus"], Value::Null);
    assert_eq!(from_file["spec"]["gpu_share_milli"], 250);
    assert_eq!(from_file["spec"]["max_price_per_gpu_hour"], "1.5");

    let quote = tenant.ok("job quote --gpus 1 --tier silver --max-price 5");
    assert!(quote.contains("nodes that fit:") && quote.contains("of 1"), "{quote}");
    assert_eq!(
        tenant.json("job quote --gpus 1 --tier silver --max-price 5 --json")["nodes_total"],
        1
    );

    let offers = tenant.ok("offers search gpu_model=H100-SXM5");
    assert!(
        offers.starts_with("NODE  GPU") && offers.contains("matching offers"),
        "{offers}"
    );
    assert!(tenant.json("offers search gpu_model=H100-SXM5 --json")["offers"].is_array());
    tenant.fails("offers search price<<", &["filter"]);

    assert!(tenant.ok(&format!("job cancel {id}")).contains("cancelled"));
    tenant.fails(&format!("job cancel {id}"), &["already ended"]);
    tenant.fails("job show 999999", &["not found", "fallow job list"]);

    let balance = tenant.ok("tenant balance");
    assert!(
        balance.contains("available:") && balance.contains("$100.00"),
        "{balance}"
    );
    assert_eq!(tenant.json("tenant balance --json")["available_micros"], 100_000_000);
    let usage = tenant.ok("tenant usage");
    assert!(usage.contains("payments:") && usage.contains("$100.00"), "{usage}");
    assert_eq!(tenant.json("tenant usage --json")["payments_micros"], 100_000_000);
    let ledger = tenant.json("tenant usage --ledger --json");
    assert!(
        !ledger["lines"].as_array().expect("ledger lines").is_empty(),
        "{ledger}"
    );
    tenant.fails("tenant usage --period 2026-1", &["YYYY-MM"]);

    // Keys: a second key works, and stops working once revoked.
    let key = admin.json(&format!("admin key create {tenant_id} --label ci --json"));
    let second = User {
        home: tenant.home,
        url: tenant.url.clone(),
        key: key["api_key"].as_str().expect("a key").to_string(),
    };
    second.ok("tenant balance");
    let keys = admin.ok(&format!("admin key list {tenant_id}"));
    assert!(keys.contains("ci") && keys.contains("first key"), "{keys}");
    let key_id = key["key_id"].as_str().expect("a key id");
    assert!(admin.ok(&format!("admin key revoke {key_id}")).contains("revoked"));
    second.fails("tenant balance", &["was refused", "FALLOW_API_KEY"]);
    let accounts = admin.ok("admin account list");
    assert!(accounts.contains("acme") && accounts.contains("farm"), "{accounts}");
}

#[tokio::test]
async fn cli_provider_sets_policy_calendar_and_reads_earnings() {
    let scratch = Scratch::new("fallow_cli_provider");
    let coordinator = start(&scratch).await;
    let admin = admin(&scratch, &coordinator);
    let (_, provider) = account(&admin, "provider", "farm");
    let node = register_node(&provider, "gpu-a").await;

    let table = provider.ok("node list");
    let row = row_of(&table, &node.to_string()).unwrap_or_else(|| panic!("node {node} not in {table}"));
    assert!(
        row.contains("gpu-a") && row.contains("H100-SXM5") && row.contains("eu-west"),
        "{row}"
    );
    assert_eq!(provider.json("node list --json")[0]["id"], node);
    assert!(
        provider
            .ok(&format!("node show {node}"))
            .contains("silver $2.00 per GPU-hour")
    );
    // The site's coordinates, set once by an admin, become the node's (it declared none).
    let set = admin.ok("admin site set ams1 --latitude 52.37 --longitude 4.9");
    assert!(set.contains("1 node(s)"), "{set}");
    let shown = provider.ok(&format!("node show {node}"));
    assert!(shown.contains("52.3700, 4.9000 (the site's"), "{shown}");
    assert!(shown.contains("NVLink domain"), "{shown}");
    assert!(admin.ok("admin site list").contains("ams1"));
    admin.fails(
        "admin site set ams1 --latitude -95 --longitude 0",
        &["latitude must be"],
    );
    provider.fails("admin site set ams1 --latitude 1 --longitude 1", &["admin"]);

    let set = provider.ok_with(
        &format!(
            "node policy set {node} --ask silver=2.10 --ask bronze=0.90 --allow-classes training,batch \
             --thermal-limit-c 83 --power-limit-w 700"
        ),
        &[
            "--peak",
            "mon-fri 09:00-18:00 x1.3",
            "--off-peak",
            "sat,sun 00:00-24:00 x0.7",
        ],
    );
    assert!(set.contains("silver $2.10, bronze $0.90"), "{set}");
    let policy = &provider.json(&format!("node show {node} --json"))["policy"];
    assert_eq!(policy["asks"], json!({"silver": "2.10", "bronze": "0.90"}));
    assert_eq!(
        policy["price_rules"],
        json!([
            {"days": [0, 1, 2, 3, 4], "start_minute": 540, "end_minute": 1080, "multiplier_permille": 1300},
            {"days": [5, 6], "start_minute": 0, "end_minute": 1440, "multiplier_permille": 700},
        ])
    );
    assert_eq!(policy["allowed_classes"], json!(["training", "batch"]));
    assert_eq!(
        (&policy["thermal_limit_c"], &policy["power_limit_w"]),
        (&json!(83), &json!(700))
    );
    let shown = provider.ok(&format!("node show {node}"));
    assert!(
        shown.contains("mon–fri 09:00–18:00 ×1.3") && shown.contains("83 °C"),
        "{shown}"
    );
    // What no flag names stays; `none` lifts a limit.
    provider.ok(&format!(
        "node policy set {node} --power-limit-w none --allow-classes all"
    ));
    let policy = &provider.json(&format!("node show {node} --json"))["policy"];
    assert_eq!(
        (&policy["power_limit_w"], &policy["thermal_limit_c"]),
        (&Value::Null, &json!(83))
    );
    assert_eq!(policy["allowed_classes"], json!([]));
    assert_eq!(policy["price_rules"].as_array().map(Vec::len), Some(2));
    provider.fails(&format!("node policy set {node}"), &["required"]);
    provider.fails(
        &format!("node policy set {node} --ask silver=off --ask bronze=off"),
        &["at least one tier"],
    );
    provider.fails_with(
        &format!("node policy set {node}"),
        &["--peak", "09:00-18:00 x0.5"],
        &["--off-peak"],
    );

    assert!(
        provider
            .ok(&format!("node calendar list {node}"))
            .contains("sells at all times")
    );
    let added = provider.ok_with(
        &format!("node calendar add {node}"),
        &["--weekly", "sat,sun 00:00-24:00"],
    );
    assert!(added.contains("sells only inside its windows"), "{added}");
    provider.ok(&format!(
        "node calendar add {node} --from 2030-12-24T18:00:00Z --until 2030-12-27T08:00Z"
    ));
    let calendar = provider.ok(&format!("node calendar list {node}"));
    let weekly = row_of(&calendar, "1").unwrap_or_else(|| panic!("no window 1 in {calendar}"));
    assert!(
        weekly.contains("weekly") && weekly.contains("sat,sun") && weekly.contains("24:00"),
        "{weekly}"
    );
    let once = row_of(&calendar, "2").unwrap_or_else(|| panic!("no window 2 in {calendar}"));
    assert!(once.contains("once") && once.contains("2030-12-24 18:00:00Z"), "{once}");
    let windows = provider.json(&format!("node calendar list {node} --json"));
    assert_eq!(windows["windows"][0]["days"], json!([5, 6]));
    assert_eq!(windows["windows"][1]["start_us"], 1_924_365_600_000_000i64);
    provider.ok(&format!("node calendar remove {node} 1"));
    let windows = provider.json(&format!("node calendar list {node} --json"));
    assert_eq!(windows["windows"].as_array().map(Vec::len), Some(1));
    assert_eq!(windows["windows"][0]["end_us"], 1_924_588_800_000_000i64);
    provider.fails(&format!("node calendar remove {node} 5"), &["numbers them from 1"]);
    provider.fails(
        &format!("node calendar add {node} --from 2030-12-24T18:00Z"),
        &["--until"],
    );
    provider.fails("node show 999999", &["not found", "fallow node list"]);

    let earnings = provider.ok("provider earnings");
    let row = row_of(&earnings, &node.to_string()).unwrap_or_else(|| panic!("node {node} not in {earnings}"));
    assert!(row.contains("gpu-a") && row.contains("$0.00"), "{row}");
    assert!(earnings.contains("earnings balance:"), "{earnings}");
    // Gross and net are told apart, and the difference named.
    assert!(
        earnings.contains("GROSS")
            && earnings.contains("platform fee:")
            && earnings.contains("net = gross less the fee"),
        "{earnings}"
    );
    assert_eq!(provider.json("provider earnings --json")["nodes"][0]["node_id"], node);
}

#[tokio::test]
async fn cli_errors_say_what_to_do_next_and_completions_print() {
    let scratch = Scratch::new("fallow_cli_errors");
    let coordinator = start(&scratch).await;
    let admin = admin(&scratch, &coordinator);
    let (tenant_id, tenant) = account(&admin, "tenant", "acme");
    let (_, provider) = account(&admin, "provider", "farm");
    let home = scratch.path.as_path();
    let url = coordinator.url.as_str();
    let list = ["job", "list"];

    let no_key = fallow(home, &[("FALLOW_URL", url)], &list);
    fails(
        no_key,
        "no key",
        &["no API key", "FALLOW_API_KEY", "--api-key", "tenant.key"],
    );
    let refused = fallow(home, &[("FALLOW_URL", url), ("FALLOW_API_KEY", UNKNOWN_KEY)], &list);
    fails(
        refused,
        "a refused key",
        &["was refused", "FALLOW_API_KEY", "tenant.key"],
    );
    let refused = fallow(home, &[("FALLOW_URL", url)], &["job", "list", "--api-key", UNKNOWN_KEY]);
    fails(
        refused,
        "a refused key by flag",
        &["API key from --api-key was refused"],
    );
    let file_name = fallow(
        home,
        &[("FALLOW_URL", url), ("FALLOW_API_KEY", "data/tenant.key")],
        &list,
    );
    fails(file_name, "a file name for a key", &["not a Fallow API key", "$(cat"]);
    let nobody = fallow(
        home,
        &[("FALLOW_URL", "http://127.0.0.1:9"), ("FALLOW_API_KEY", UNKNOWN_KEY)],
        &list,
    );
    fails(
        nobody,
        "no coordinator",
        &["cannot reach the coordinator", "FALLOW_URL"],
    );
    provider.fails("job list", &["tenant keys", "--api-key"]);
    admin.fails(&format!("admin credit {tenant_id} lots"), &["amount"]);

    let submit = "job submit --tier silver --max-price 5 --image busybox";
    tenant.fails(&format!("{submit} --gpus 0"), &["--gpus", "1..=16"]);
    tenant.fails(
        &format!("{submit} --gpus 1 --gpu-share 250"),
        &["--gpus", "--gpu-share", "cannot be used with"],
    );
    tenant.fails(&format!("{submit} --gpu-share 1000"), &["--gpu-share", "1..=999"]);
    tenant.fails("job submit --tier platinum", &["gold, silver, bronze"]);
    tenant.fails("job submit --gpus 1 --max-price 5 --image x", &["give --tier"]);
    tenant.fails("job submit --gpus 1 --tier gold --image x", &["give --max-price"]);
    tenant.fails(
        "job submit --gpus 1 --tier gold --max-price 1",
        &["--image", "--process"],
    );
    tenant.fails(
        "job submit --process --tier gold --max-price 1",
        &["program after `--`"],
    );
    // The balance is $0: the coordinator refuses, and the CLI says who can fix it.
    tenant.fails(&format!("{submit} --gpus 1"), &["balance", "fallow admin credit"]);

    // The config file gives the URL and the key when the environment does not.
    let config = scratch.path.join("config.toml");
    std::fs::write(
        &config,
        format!("# test\nurl = \"{url}\"\napi_key = \"{}\"\n", tenant.key),
    )
    .expect("write config");
    let by_config = [("FALLOW_CONFIG", config.to_str().expect("UTF-8"))];
    let balance = ok(
        fallow(home, &by_config, &["tenant", "balance", "--json"]),
        "balance by config file",
    );
    assert!(balance.contains("available_micros"), "{balance}");
    std::fs::write(&config, "url = http://nowhere\n").expect("write config");
    fails(
        fallow(home, &by_config, &["tenant", "balance"]),
        "a bad config file",
        &["line 1"],
    );

    for shell in ["bash", "zsh", "fish"] {
        let script = ok(fallow(home, &[], &["completions", shell]), shell);
        assert!(
            script.contains("fallow") && script.contains("submit"),
            "{shell}: {script}"
        );
    }
}

#[tokio::test]
async fn cli_process_job_runs_to_finished_and_prints_its_output() {
    let scratch = Scratch::new("fallow_cli_process");
    let coordinator = start(&scratch).await;
    let admin = admin(&scratch, &coordinator);
    let (tenant_id, tenant) = account(&admin, "tenant", "acme");
    let (_, provider) = account(&admin, "provider", "farm");
    admin.ok(&format!("admin credit {tenant_id} 50"));
    let agent_log = scratch.path.join("agent.log");
    let log = std::fs::File::create(&agent_log).expect("create the agent log");
    let _agent = Killed(
        Command::new(env!("CARGO_BIN_EXE_fallow"))
            .args([
                "agent",
                "--coordinator",
                &coordinator.url,
                "--provider-key",
                &provider.key,
                "--data-dir",
            ])
            .arg(scratch.path.join("agent"))
            .args([
                "--simulate-gpus",
                "H100-SXM5:1",
                "--executor",
                "process",
                "--usage-every-s",
                "1",
            ])
            .args(["--grace-s", "1"])
            .env_remove("FALLOW_COORDINATOR")
            .env_remove("FALLOW_PROVIDER_KEY")
            .env_remove("FALLOW_AGENT_DATA_DIR")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone the log handle"))
            .stderr(log)
            .spawn()
            .expect("start fallow agent"),
    );
    // The command line the issue checks, word for word.
    let submitted = ok_json(
        tenant.run(
            "job submit --json --gpus 1 --tier silver --max-price 5 --process -- sh -c",
            &["echo hi"],
        ),
        "submit a process job",
    );
    let id = submitted["id"].as_i64().expect("the job's id");
    assert_eq!(submitted["spec"]["runtime"], "process");
    assert_eq!(
        (&submitted["spec"]["image"], &submitted["spec"]["command"]),
        (&json!("sh"), &json!(["-c", "echo hi"]))
    );
    let deadline = Instant::now() + JOB_FINISHES_WITHIN;
    loop {
        let job = tenant.json(&format!("job show {id} --json"));
        if job["state"] == "finished" {
            break;
        }
        assert!(
            Instant::now() < deadline && !matches!(job["state"].as_str(), Some("failed" | "cancelled")),
            "job {id} did not finish: {job}\nagent log: {}",
            common::tail(&agent_log, 4000)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(tenant.ok(&format!("job logs {id}")), "hi\n");
    assert_eq!(tenant.ok(&format!("job logs {id} --follow")), "hi\n");
    assert_eq!(
        tenant.json(&format!("job logs {id} --json"))["chunks"][0]["text"],
        "hi\n"
    );
    // --wait prints the job's output as it comes and exits with the job's exit code, saying where
    // to look when it failed; `job logs --follow` exits the same way; --quiet shows the state.
    let submit = "job submit --wait --gpus 1 --tier silver --max-price 5 --process --";
    let streamed = tenant.run(&format!("{submit} sh -c"), &["echo streamed; exit 3"]);
    let stderr = String::from_utf8_lossy(&streamed.stderr).to_string();
    assert_eq!(streamed.status.code(), Some(3), "{stderr}");
    assert!(
        String::from_utf8_lossy(&streamed.stdout).contains("streamed\n"),
        "{streamed:?}"
    );
    assert!(
        stderr.contains("failed") && stderr.contains("fallow job logs"),
        "{stderr}"
    );
    let failed = tenant.json("job list --json --state failed")["jobs"].clone();
    let failed_id = failed[0]["id"].as_i64().expect("the failed job");
    assert!(
        failed
            .as_array()
            .is_some_and(|jobs| jobs.iter().all(|job| job["state"] == "failed")),
        "{failed}"
    );
    assert_eq!(tenant.json(&format!("job show {failed_id} --json"))["exit_code"], 3);
    let followed = tenant.run(&format!("job logs {failed_id} --follow"), &[]);
    assert_eq!(followed.status.code(), Some(3), "{followed:?}");
    assert_eq!(String::from_utf8_lossy(&followed.stdout), "streamed\n");
    let waited = tenant.ok("job submit --wait --quiet --gpus 1 --tier silver --max-price 5 --process -- true");
    assert!(waited.contains("state:") && waited.contains("finished"), "{waited}");
    let finished = tenant.json("job list --json --state finished --since 1h")["jobs"].clone();
    assert!(finished.as_array().is_some_and(|jobs| jobs.len() >= 2), "{finished}");
    let later = tenant.json("job list --json --since 2099-01-01T00:00Z");
    assert_eq!(later["jobs"], json!([]), "nothing submitted after 2099");
    tenant.fails(&format!("{submit} false"), &["failed", "fallow job logs", "exit 1"]);
    // Cancelled while it waits: 130.
    let (home, url, key) = (tenant.home.to_path_buf(), tenant.url.clone(), tenant.key.clone());
    let waiting = tokio::task::spawn_blocking(move || {
        let waiter = User { home: &home, url, key };
        waiter.run(
            "job submit --wait --quiet --gpus 1 --tier silver --max-price 5 --region nowhere --process -- true",
            &[],
        )
    });
    let deadline = Instant::now() + JOB_FINISHES_WITHIN;
    let queued = loop {
        let queued = tenant.json("job list --json --state queued");
        if let Some(id) = queued["jobs"][0]["id"].as_i64() {
            break id;
        }
        assert!(Instant::now() < deadline, "the waiting job was never listed as queued");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    tenant.ok(&format!("job cancel {queued}"));
    let cancelled = waiting.await.expect("the waiting CLI");
    assert_eq!(cancelled.status.code(), Some(130), "{cancelled:?}");

    // A lease's end reason too long for the lease table is shown in full under it.
    let missing = "/no/such/program/named/at/length/so/that/the/reason/for/its/failure/is/long";
    tenant.fails(&format!("{submit} {missing}"), &["failed"]);
    let id = tenant.json("job list --json")["jobs"][0]["id"]
        .as_i64()
        .expect("the job's id");
    let job = tenant.json(&format!("job show {id} --json"));
    let reason = job["leases"][0]["end_reason"].as_str().expect("an end reason");
    assert!(reason.contains(missing), "{job}");
    let shown = tenant.ok(&format!("job show {id}"));
    assert!(
        shown.contains(&format!("lease {}: {reason}", job["leases"][0]["id"])),
        "the whole reason: {shown}"
    );
    // A job that ended without output says so, and why.
    let logs = tenant.run(&format!("job logs {id}"), &[]);
    assert!(
        String::from_utf8_lossy(&logs.stderr)
            .contains(&format!("no output: the job failed without writing any ({reason})")),
        "{}",
        String::from_utf8_lossy(&logs.stderr)
    );
}

#[test]
fn the_catalog_lists_models_memory_compute_units_and_aliases_and_unknown_models_get_the_closest() {
    let scratch = Scratch::new("catalog");
    let listed = ok_json(fallow(&scratch.path, &[], &["catalog", "--json"]), "catalog --json");
    let rows = listed.as_array().expect("an array of models");
    let row = |name: &str| {
        rows.iter()
            .find(|row| row["name"] == name)
            .unwrap_or_else(|| panic!("{name} is not listed"))
    };
    for name in [
        "L40S",
        "L20",
        "RTX-5090",
        "RTX-PRO-6000",
        "B300",
        "GB300",
        "MI325X",
        "MI355X",
        "Gaudi3",
        "Ascend-910B",
        "Ascend-910C",
        "Ascend-950DT",
    ] {
        let model = row(name);
        assert!(model["memory_mib"].as_u64().unwrap() > 0, "{model}");
        assert!(model["compute_units"].as_f64().unwrap() > 0.0, "{model}");
    }
    assert_eq!(row("H100-SXM5")["compute_units"], 1.0);
    assert_eq!(row("H100-SXM5")["memory_mib"], 80 * 1024);
    assert!(row("H800-SXM5")["aliases"].as_array().unwrap().contains(&json!("H800")));
    assert_eq!(row("Ascend-950DT")["disclosed"], false);
    let table = ok(fallow(&scratch.path, &[], &["catalog"]), "catalog");
    assert!(table.starts_with("MODEL"), "{table}");
    let line = row_of(&table, "Ascend-910C").expect("a row for the 910C");
    assert!(line.contains("Huawei") && line.contains("0.760"), "{line}");

    // A node list naming a model the catalog does not know is refused with the closest names.
    let nodes = scratch.path.join("nodes.csv");
    std::fs::write(&nodes, "m1,H800,96,512,8\nm2,RTX 5080,16,64,2\n").unwrap();
    let nodes = nodes.to_str().unwrap();
    fails(
        fallow(
            &scratch.path,
            &[],
            &[
                "sim",
                "market",
                "--traces",
                concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/traces"),
                "--nodes",
                nodes,
                "--days",
                "1",
                "--policies",
                "fallow",
            ],
        ),
        "a node list with an unknown model",
        &["m2", "unknown model \"RTX 5080\"; closest: RTX-5090"],
    );
}

/// Every setting of `fallow server` and `fallow agent` can come from the environment, and
/// `--help` names the variable (issue 22, item 2).
#[test]
fn every_server_and_agent_flag_has_an_environment_variable_named_in_help() {
    for command in ["server", "agent"] {
        let output = Command::new(env!("CARGO_BIN_EXE_fallow"))
            .args([command, "--help"])
            .output()
            .expect("fallow runs");
        let help = ok(output, &format!("fallow {command} --help"));
        let options = help
            .split_once("Options:")
            .unwrap_or_else(|| panic!("no options in {help}"))
            .1;
        // One block per option: its line, then its paragraphs until the next option.
        let mut blocks: Vec<String> = Vec::new();
        for line in options.lines() {
            let trimmed = line.trim_start();
            if trimmed.starts_with("--") || (trimmed.starts_with('-') && line.starts_with("  -")) {
                blocks.push(String::new());
            }
            if let Some(block) = blocks.last_mut() {
                block.push_str(line);
                block.push('\n');
            }
        }
        let flags: Vec<&String> = blocks
            .iter()
            .filter(|block| !block.contains("--help") && !block.contains("--version"))
            .collect();
        assert!(
            flags.len() >= 10,
            "fallow {command}: {} options read from {help}",
            flags.len()
        );
        for block in flags {
            assert!(
                block.contains("[env: FALLOW_"),
                "fallow {command}: an option without an environment variable:\n{block}"
            );
        }
    }
}

/// A value from the environment counts as the flag would, and a bad one is refused naming it.
#[test]
fn an_agent_setting_from_the_environment_is_checked_as_its_flag() {
    let output = Command::new(env!("CARGO_BIN_EXE_fallow"))
        .args(["agent", "--executor", "process", "--simulate-gpus", "H100-SXM5:1"])
        .env("FALLOW_AGENT_GANG_PORTS", "not-ports")
        .env("FALLOW_COORDINATOR", "http://127.0.0.1:9")
        .output()
        .expect("fallow runs");
    fails(output, "a bad FALLOW_AGENT_GANG_PORTS", &["--gang-ports"]);
}

/// A retention past its bound is refused with the flag's name, from the flag or the environment.
#[test]
fn an_output_retention_past_a_century_is_refused_naming_the_flag() {
    let dir = std::env::temp_dir().join(format!("fallow-retention-{}", std::process::id()));
    let server = |args: &[&str], env: &[(&str, &str)]| {
        Command::new(env!("CARGO_BIN_EXE_fallow"))
            .args(["server", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(&dir)
            .args(args)
            .envs(env.iter().copied())
            .output()
            .expect("fallow runs")
    };
    fails(
        server(&["--output-retention-days", "4000000000"], &[]),
        "a retention of 4e9 days",
        &["--output-retention-days"],
    );
    fails(
        server(&[], &[("FALLOW_OUTPUT_RETENTION_DAYS", "36501")]),
        "a retention of 36501 days",
        &["--output-retention-days"],
    );
    assert!(!dir.exists(), "nothing was started");
}

/// `fallow agent --config FILE` (and `/etc/fallow/agent.toml`) gives settings by their flags'
/// names; a flag beats the environment, which beats the file; an unknown setting is refused
/// with its line (issue 22, item 2).
#[test]
fn agent_settings_come_from_a_config_file_below_flags_and_the_environment() {
    let dir = std::env::temp_dir().join(format!("fallow-settings-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("agent.toml");
    std::fs::write(
        &file,
        "# the node\ngang_ports = \"not-ports\"\ncoordinator = \"http://127.0.0.1:9\"\n",
    )
    .unwrap();
    let agent = |extra: &[&str], env: &[(&str, &str)]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_fallow"));
        command
            .args(["agent", "--executor", "process", "--simulate-gpus", "H100-SXM5:1"])
            .arg("--data-dir")
            .arg(dir.join("data"))
            .arg("--config")
            .arg(&file)
            .args(extra)
            .env_remove("FALLOW_AGENT_GANG_PORTS")
            .env_remove("FALLOW_PROVIDER_KEY")
            .env_remove("FALLOW_COORDINATOR");
        for (name, value) in env {
            command.env(name, value);
        }
        command.output().expect("fallow runs")
    };
    // From the file: its bad value is refused by the flag's own check.
    fails(agent(&[], &[]), "a bad gang_ports in the file", &["--gang-ports"]);
    // A flag, or the environment, beats the file: the start gets past the ports and stops
    // only for want of a provider key to register with.
    for output in [
        agent(&["--gang-ports", "29500-29599"], &[]),
        agent(&[], &[("FALLOW_AGENT_GANG_PORTS", "29500-29599")]),
    ] {
        let said = fails(output, "a start with no provider key", &["--provider-key"]);
        assert!(!said.contains("--gang-ports"), "{said}");
    }
    std::fs::write(&file, "regoin = \"eu-west\"\n").unwrap();
    fails(
        agent(&[], &[]),
        "an unknown setting",
        &["line 1", "regoin", "agent.toml"],
    );
    let _ = std::fs::remove_dir_all(&dir);
}
