//! The trust policy's commands against a real coordinator: `fallow admin bond`, `fallow provider
//! trust|bond|frauds`, `fallow admin frauds` and `fallow node canaries|verify`, run as the real
//! binary with each party's key, reading their text and their `--json`.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use api::{NodeRegistration, NodeView, PolicyDoc};
use common::{Coordinator, Scratch};
use serde_json::Value;

/// One user of the CLI: a coordinator's URL and a key, and a home without a config file.
struct User<'a> {
    home: &'a Path,
    url: String,
    key: String,
}

impl User<'_> {
    fn run(&self, line: &str) -> Output {
        Command::new(env!("CARGO_BIN_EXE_fallow"))
            .args(line.split_whitespace())
            .env_clear()
            .env("HOME", self.home)
            .env("FALLOW_URL", &self.url)
            .env("FALLOW_API_KEY", &self.key)
            .stdin(Stdio::null())
            .output()
            .expect("run the fallow binary")
    }

    /// Its stdout, after checking that it succeeded.
    fn ok(&self, line: &str) -> String {
        let output = self.run(line);
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "{line} failed:\nstdout: {stdout}\nstderr: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        stdout
    }

    fn json(&self, line: &str) -> Value {
        let stdout = self.ok(&format!("{line} --json"));
        serde_json::from_str(&stdout).unwrap_or_else(|error| panic!("{line}: {error} in {stdout}"))
    }

    /// Its stderr, after checking that it failed with every one of `says` in it.
    fn fails(&self, line: &str, says: &[&str]) -> String {
        let output = self.run(line);
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(
            !output.status.success(),
            "{line} succeeded: {}",
            String::from_utf8_lossy(&output.stdout)
        );
        for text in says {
            assert!(stderr.contains(text), "{line}: {text:?} not in: {stderr}");
        }
        stderr
    }
}

/// Creates an account through the CLI; its id and a user with its first key.
fn account<'a>(admin: &User<'a>, role: &str, name: &str) -> (i64, User<'a>) {
    let created = admin.json(&format!("admin account create {name} --role {role}"));
    let user = User {
        home: admin.home,
        url: admin.url.clone(),
        key: created["api_key"]["api_key"].as_str().expect("a key").to_string(),
    };
    (created["account"]["id"].as_i64().expect("an id"), user)
}

/// Registers a simulated two-GPU node through the API; no agent runs for it, so it stays
/// offline.
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

/// The value of a `key: value` line of the CLI's output.
fn field<'a>(text: &'a str, key: &str) -> &'a str {
    text.lines()
        .find_map(|line| line.strip_prefix(&format!("{key}:")))
        .unwrap_or_else(|| panic!("no {key:?} in {text}"))
        .trim()
}

/// The cells of the table row whose first cell is `first`.
fn row<'a>(text: &'a str, first: &str) -> Vec<&'a str> {
    text.lines()
        .map(|line| line.split_whitespace().collect::<Vec<_>>())
        .find(|cells| cells.first() == Some(&first))
        .unwrap_or_else(|| panic!("no row {first:?} in {text}"))
}

#[tokio::test]
async fn cli_bonds_standing_frauds_and_canaries() {
    let scratch = Scratch::new("fallow_trust_cli");
    let coordinator = Coordinator::in_scratch(&scratch).await;
    let admin = User {
        home: &scratch.path,
        url: coordinator.url.clone(),
        key: coordinator.admin_key().expect("the coordinator wrote the admin key"),
    };
    let (provider_id, provider) = account(&admin, "provider", "farm");
    let (tenant_id, tenant) = account(&admin, "tenant", "acme");
    let (_, rival) = account(&admin, "provider", "rival");
    let node = register_node(&provider, "gpu-a").await;

    // A new provider: no bond, no badge, the prior's reputation, and what bronze needs.
    let fresh = provider.json("provider trust");
    assert_eq!(fresh["provider_id"], provider_id);
    assert_eq!(fresh["badge"], "none");
    assert_eq!(fresh["bond_micros"], 0);
    assert_eq!(fresh["gpus_offered"], 2);
    assert_eq!(fresh["gold_bond_needed_micros"], 100_000_000, "$50 per GPU offered");
    assert_eq!(fresh["reputation"]["score"], 0.8, "the prior Beta(8, 2)");
    assert_eq!(fresh["nodes"][0]["node_id"], node);
    let text = provider.ok("provider trust");
    assert_eq!(field(&text, "bond"), "$0.00");
    assert!(
        field(&text, "next badge").starts_with("bronze needs a lower bound of 0.85"),
        "{text}"
    );

    // An admin posts a bond paid in from outside; the same key posts once.
    let posted = admin.ok(&format!("admin bond --provider {provider_id} 150 --key first-bond"));
    assert!(
        posted.contains(&format!("provider {provider_id}: bond now $150.00, badge none"))
            && posted.starts_with("bond of $150.00 posted for provider")
            && posted.contains("the bond covers the gold badge's $100.00"),
        "{posted}"
    );
    let again = admin.json(&format!("admin bond --provider {provider_id} 150 --key first-bond"));
    assert_eq!(again["bond_micros"], 150_000_000, "the same key posted twice: {again}");
    admin.fails(
        &format!("admin bond --provider {tenant_id} 10 --key t"),
        &["tenant account"],
    );
    admin.fails(
        "admin bond --provider 999999 10 --key t",
        &["provider 999999 not found"],
    );
    admin.fails(&format!("admin bond --provider {provider_id} 10"), &["--key"]);
    provider.fails(
        &format!("admin bond --provider {provider_id} 10 --key p"),
        &["for admin keys", "yours is a provider key"],
    );

    // The provider's standing, in words and in JSON.
    let text = provider.ok("provider trust");
    assert_eq!(field(&text, "badge"), "none");
    assert_eq!(field(&text, "bond"), "$150.00");
    assert!(field(&text, "gold bond needed").starts_with("$100.00"), "{text}");
    assert!(field(&text, "reputation").starts_with("0.800, lower bound"), "{text}");
    assert_eq!(
        row(&text, "lease")[..4],
        ["lease", "finished", "success", "0.0"],
        "{text}"
    );
    assert_eq!(row(&text, "canary")[..3], ["canary", "failed", "failure"], "{text}");
    let node_row = row(&text, &node.to_string());
    assert_eq!(node_row[1..3], ["gpu-a", "0.800"], "name and score: {text}");
    assert!(
        node_row[3].parse::<f64>().is_ok_and(|bound| bound < 0.8),
        "the lower bound is under the score: {text}"
    );
    assert_eq!(node_row[4..6], ["no", "no"], "not gold-eligible, not cordoned: {text}");
    assert!(text.contains("no fraud decided against this provider"), "{text}");
    let standing = provider.json("provider trust");
    assert_eq!(standing["bond_micros"], 150_000_000);
    assert_eq!(standing["badge"], "none");
    assert_eq!(standing["nodes"][0]["gold_eligible"], false);
    assert!(
        standing["reputation"]["inputs"]
            .as_object()
            .is_some_and(|inputs| inputs.contains_key("lease_finished") && inputs.contains_key("canary_failed")),
        "{standing}"
    );

    // An admin names the provider; a provider sees only its own.
    assert_eq!(
        admin.json(&format!("provider trust --provider {provider_id}"))["bond_micros"],
        150_000_000
    );
    admin.fails("provider trust", &["provider_id", "--provider ID"]);
    rival.fails(
        &format!("provider trust --provider {provider_id}"),
        &[&format!("provider {provider_id} not found")],
    );
    tenant.fails("provider trust", &["for provider or admin keys"]);

    // A bond from earnings needs earnings: the refusal says so and what else can be done.
    let refused = provider.fails(
        "provider bond 10 --key from-earnings",
        &[
            "earnings are $0.00",
            "less than the bond of $10.00",
            "fallow admin bond",
        ],
    );
    assert!(!refused.contains("fallow admin credit"), "a tenant's hint: {refused}");
    provider.fails("provider bond 10", &["--key"]);
    provider.fails("provider bond ten --key x", &["amount"]);
    assert_eq!(provider.json("provider trust")["bond_micros"], 150_000_000);

    // No fraud decided: every party's list is empty.
    assert!(provider.ok("provider frauds").contains("no fraud decided"));
    assert_eq!(provider.json("provider frauds"), Value::Array(Vec::new()));
    assert_eq!(admin.json("admin frauds"), Value::Array(Vec::new()));

    // Canaries: a node's own provider reads and orders them; a node of someone else's, or none,
    // is not found.
    let canaries = provider.json(&format!("node canaries {node}"));
    let listed = provider.ok(&format!("node canaries {node}"));
    match canaries.as_array().map(Vec::len) {
        Some(0) => assert!(
            listed.contains(&format!("`fallow node verify {node}` orders one")),
            "{listed}"
        ),
        Some(_) => assert!(listed.starts_with("ID  ORDERED"), "{listed}"),
        None => panic!("not a list: {canaries}"),
    }
    // No agent runs for the node: the coordinator refuses a canary it could not deliver (or
    // one the leader ordered at registration is still open).
    let refused = provider.fails(&format!("node verify {node}"), &[&format!("node {node}")]);
    assert!(
        refused.contains("off line") || refused.contains("still open"),
        "{refused}"
    );
    for line in [
        "node canaries 999999",
        "node verify 999999",
        &format!("node canaries {node}"),
        &format!("node verify {node}"),
    ] {
        let who = if line.contains("999999") { &provider } else { &rival };
        who.fails(line, &["not found", "fallow node list"]);
    }
    assert!(admin.json(&format!("node canaries {node}")).is_array());
    drop(coordinator);
}
