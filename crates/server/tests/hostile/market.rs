//! The market the seeded fuzz pass aims at: its accounts, nodes and jobs, the routes of the
//! OpenAPI document, and what refused requests must leave alone.

use crate::common::{self, Harness, job_request, run_until_placed};
use serde_json::{Value, json};

/// The accounts, nodes and jobs the fuzzer aims at. The bystander's key and jobs are never the
/// fuzzer's: only admin requests and wrong-owner requests reach them.
pub(crate) struct Market {
    pub(crate) tenant: common::Account,
    pub(crate) bystander: common::Account,
    pub(crate) provider: common::Account,
    pub(crate) north: common::Account,
    /// The node holding leases, then one that never heartbeats (none on the empty server).
    pub(crate) agents: Vec<common::Agent>,
    /// Signs the forger's agent requests.
    pub(crate) stranger: trust::NodeKey,
    pub(crate) jobs: Vec<i64>,
    /// Waits for a region no node is in: its explanation names a region the fleet lacks.
    pub(crate) nowhere: Option<i64>,
    /// The running lease on the first agent (usage and attestation templates are for it).
    pub(crate) lease: Option<Value>,
    pub(crate) leases: Vec<i64>,
    pub(crate) nodes: Vec<i64>,
    pub(crate) key_ids: Vec<String>,
}

/// The keys the fuzzer sends: keys of their own, beside the ones the test reads with, since an
/// accepted `POST /v1/keys/rotate` revokes its sender's (and then replaces it here).
pub(crate) struct FuzzKeys {
    pub(crate) tenant: String,
    pub(crate) provider: String,
    pub(crate) admin: String,
    pub(crate) forged: String,
}

/// One operation of the router: its method, its path with `{id}` or `{key_id}`, and the schema
/// of its body.
#[derive(Clone, Debug)]
pub(crate) struct Operation {
    pub(crate) method: &'static str,
    pub(crate) path: String,
    pub(crate) body: Option<String>,
}

fn method_name(name: &str) -> &'static str {
    match name.to_ascii_uppercase().as_str() {
        "GET" => "GET",
        "POST" => "POST",
        "PUT" => "PUT",
        "DELETE" => "DELETE",
        "PATCH" => "PATCH",
        "HEAD" => "HEAD",
        "OPTIONS" => "OPTIONS",
        other => panic!("the OpenAPI document names the method {other}"),
    }
}

/// Every operation of the OpenAPI document, and the routes it leaves out (the metrics, the
/// document itself, the explorer and the dashboard).
pub(crate) async fn operations(h: &Harness) -> Vec<Operation> {
    let document = h
        .call("GET", "/v1/openapi.json", None, None)
        .await
        .expect(200, "the OpenAPI document");
    let mut out = Vec::new();
    for (path, methods) in document["paths"].as_object().expect("paths") {
        for (method, operation) in methods.as_object().expect("methods") {
            let body = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
                .as_str()
                .and_then(|reference| reference.rsplit('/').next())
                .map(str::to_string);
            out.push(Operation {
                method: method_name(method),
                path: path.clone(),
                body,
            });
        }
    }
    assert!(out.len() >= 40, "the document lists {} operations", out.len());
    for (method, path) in [
        ("GET", "/metrics"),
        ("GET", "/v1/openapi.json"),
        ("GET", "/v1/explorer"),
        ("GET", "/dashboard"),
        ("GET", "/dashboard/login"),
        ("POST", "/dashboard/login"),
        ("GET", "/dashboard/logout"),
        ("POST", "/dashboard/logout"),
        ("GET", "/dashboard/tenant"),
        ("GET", "/dashboard/provider"),
        ("GET", "/dashboard/jobs/{id}"),
        ("GET", "/dashboard/style.css"),
    ] {
        if !out
            .iter()
            .any(|operation| operation.method == method && operation.path == path)
        {
            out.push(Operation {
                method,
                path: path.to_string(),
                body: None,
            });
        }
    }
    out
}

/// A registration edit: the node in `region` at `site`, with `gpu_count` GPUs of `gpu_model`.
fn located(region: &str, site: &str, gpu_model: &str, gpu_count: u8, at: (f64, f64)) -> impl FnOnce(&mut Value) {
    let (region, site, gpu_model) = (region.to_string(), site.to_string(), gpu_model.to_string());
    move |registration: &mut Value| {
        registration["region"] = json!(region);
        registration["fabric"] = json!(format!("{site}-ib0"));
        registration["site"] = json!(site);
        registration["gpu_model"] = json!(gpu_model);
        registration["gpu_count"] = json!(gpu_count);
        registration["latitude"] = json!(at.0);
        registration["longitude"] = json!(at.1);
    }
}

/// The tests' job with `fields` replaced, and a runtime that outlives any run of the pass.
pub(crate) fn job_with(name: &str, fields: Value) -> Value {
    let mut job = job_request(name);
    job["max_runtime_s"] = json!(86_400);
    for (field, value) in fields.as_object().expect("an object") {
        job[field] = value.clone();
    }
    job
}

/// The accounts only: two tenants with credit, two providers, and a spare provider key.
pub(crate) async fn open_market(h: &Harness) -> Market {
    let tenant = h.tenant("acme").await;
    let bystander = h.tenant("bystander").await;
    let provider = h.provider("gpu-farm").await;
    let north = h.provider("north").await;
    h.credit(&tenant, "100.00").await;
    h.credit(&bystander, "40.00").await;
    // Keys no one uses, for the fuzzer's revocations to aim at.
    let mut key_ids = Vec::new();
    for (owner_key, account) in [(&provider.key, &provider), (&h.admin, &bystander)] {
        key_ids.push(new_key(h, owner_key, account.id, "spare").await.0);
    }
    Market {
        key_ids,
        tenant,
        bystander,
        provider,
        north,
        agents: Vec::new(),
        stranger: trust::NodeKey::generate(),
        jobs: Vec::new(),
        nowhere: None,
        lease: None,
        leases: Vec::new(),
        nodes: Vec::new(),
    }
}

/// A new key for `account_id`, made with `owner_key`: its id and the key.
async fn new_key(h: &Harness, owner_key: &str, account_id: i64, label: &str) -> (String, String) {
    let created = h
        .post(
            owner_key,
            &format!("/v1/accounts/{account_id}/keys"),
            json!({"label": label}),
        )
        .await
        .expect(201, "a new API key");
    let text = |field: &str| created[field].as_str().expect("key fields").to_string();
    (text("key_id"), text("api_key"))
}

pub(crate) async fn fuzz_keys(h: &Harness, market: &Market) -> FuzzKeys {
    let accounts = h.get(&h.admin, "/v1/admin/accounts").await.expect(200, "accounts");
    let admin_id = accounts
        .as_array()
        .and_then(|accounts| accounts.iter().find(|account| account["name"] == "admin"))
        .and_then(|account| account["id"].as_i64())
        .expect("the bootstrap admin is listed");
    FuzzKeys {
        tenant: new_key(h, &market.tenant.key, market.tenant.id, "fuzzer").await.1,
        provider: new_key(h, &market.provider.key, market.provider.id, "fuzzer").await.1,
        admin: new_key(h, &h.admin, admin_id, "fuzzer").await.1,
        forged: trust::generate_api_key().display,
    }
}

/// Nodes in four regions (three online, one never heard from) and jobs in every state: queued
/// for a region no node is in, for a model no node has, under every ask; running with a lease
/// (the tenant's and the bystander's); finished, billed; cancelled.
pub(crate) async fn populate(h: &Harness, market: &mut Market) {
    let (tenant, bystander) = (&market.tenant, &market.bystander);
    let nyc = h
        .node(
            &market.provider,
            "nyc-h100",
            located("us-east", "nyc1", "H100-SXM5", 8, (40.7, -74.0)),
        )
        .await;
    let sin = h
        .node(
            &market.provider,
            "sin-a100",
            located("ap-southeast", "sin1", "A100-SXM4-80GB", 4, (1.35, 103.8)),
        )
        .await;
    let sfo = h
        .node(
            &market.provider,
            "sfo-l4",
            located("us-west", "sfo1", "L4", 2, (37.8, -122.4)),
        )
        .await;
    let osl = h
        .node(
            &market.north,
            "osl-h100",
            located("eu-north", "osl1", "H100-SXM5", 8, (59.9, 10.7)),
        )
        .await;
    for online in [&nyc, &sin, &osl] {
        online.heartbeat().await;
    }
    let submit = async |owner: &common::Account, name: &str, fields: Value| -> i64 {
        h.submit(owner, job_with(name, fields)).await["id"]
            .as_i64()
            .expect("a job id")
    };
    let nowhere = submit(tenant, "nowhere", json!({"regions": ["eu-west"]})).await;
    let mut jobs = vec![
        nowhere,
        submit(
            tenant,
            "eu-or-us-west",
            json!({"regions": ["eu-west", "us-west"], "gpus": 2}),
        )
        .await,
        submit(tenant, "no-b200", json!({"gpu_models": ["B200"]})).await,
        submit(tenant, "too-cheap", json!({"max_price_per_gpu_hour": "0.01"})).await,
        submit(bystander, "theirs-nowhere", json!({"regions": ["eu-west"]})).await,
    ];
    let running = submit(tenant, "running", json!({"regions": ["us-east"]})).await;
    let (_, lease) = run_until_placed(h, &nyc, tenant, running).await;
    nyc.event(&lease, "running").await.expect(200, "the lease runs");
    let finished = submit(tenant, "finished", json!({"regions": ["us-east"]})).await;
    let (_, done) = run_until_placed(h, &nyc, tenant, finished).await;
    for state in ["staging", "running"] {
        nyc.event(&done, state).await.expect(200, state);
    }
    nyc.signed("POST", "/v1/agent/usage", Some(&nyc.usage(&done, 1, 1000)))
        .await
        .expect(200, "usage");
    nyc.signed("POST", "/v1/agent/attestations", Some(&nyc.attestation(&done, 0)))
        .await
        .expect(200, "attestation");
    h.wait_for_job(&tenant.key, finished, "finished").await;
    let theirs = submit(bystander, "theirs-running", json!({"regions": ["eu-north"]})).await;
    let (_, their_lease) = run_until_placed(h, &osl, bystander, theirs).await;
    osl.event(&their_lease, "running").await.expect(200, "their lease runs");
    for (owner, name) in [(tenant, "cancelled"), (bystander, "theirs-cancelled")] {
        let id = submit(owner, name, json!({"gpu_models": ["B200"]})).await;
        h.post(&owner.key, &format!("/v1/jobs/{id}/cancel"), json!({}))
            .await
            .expect(200, "cancel");
        jobs.push(id);
    }
    jobs.extend([running, finished, theirs]);
    market.leases = [&lease, &done, &their_lease]
        .iter()
        .map(|lease| lease["id"].as_i64().expect("lease id"))
        .collect();
    market.nodes = [&nyc, &sin, &sfo, &osl].iter().map(|agent| agent.node_id).collect();
    market.jobs = jobs;
    market.nowhere = Some(nowhere);
    market.lease = Some(lease);
    market.agents = vec![nyc, sfo];
}

/// What refused requests must leave alone: the market's jobs and their leases, every account
/// and the money each holds (a tenant's as available + escrow, since accepted jobs move money
/// between the two as they place and end, on the coordinator's own time), the market's nodes
/// and policies, every key of the market's accounts, the jobs in all, and the money that came
/// in from outside.
pub(crate) async fn holdings(h: &Harness, market: &Market) -> Value {
    let read = async |key: &str, path: &str| -> Value {
        let reply = h.get(key, path).await;
        assert_eq!(reply.status, 200, "{}: holdings: GET {path}: {}", h.backend, reply.text);
        reply.body
    };
    let mut jobs = Vec::new();
    for key in [market.tenant.key.as_str(), market.bystander.key.as_str()] {
        for job in read(key, "/v1/jobs?limit=500").await["jobs"]
            .as_array()
            .expect("a job list")
        {
            if market.jobs.iter().any(|id| job["id"] == *id) {
                let leases: Vec<Value> = job["leases"]
                    .as_array()
                    .expect("leases")
                    .iter()
                    .map(|lease| json!([lease["id"], lease["state"], lease["epoch"], lease["node_id"]]))
                    .collect();
                jobs.push(json!([job["id"], job["state"], leases]));
            }
        }
    }
    let accounts: Vec<Value> = read(&h.admin, "/v1/admin/accounts")
        .await
        .as_array()
        .expect("accounts")
        .iter()
        .map(|account| json!([account["id"], account["name"], account["role"]]))
        .collect();
    let mut money = Vec::new();
    let mut api_keys = Vec::new();
    for account in [&market.tenant, &market.bystander, &market.provider, &market.north] {
        let balance = read(&h.admin, &format!("/v1/balance?account_id={}", account.id)).await;
        if [market.tenant.id, market.bystander.id].contains(&account.id) {
            let held = balance["available_micros"].as_i64().expect("available")
                + balance["escrow_micros"].as_i64().expect("escrow");
            money.push(json!([
                account.id,
                held,
                balance["earnings_micros"],
                balance["bond_micros"]
            ]));
        } else {
            money.push(balance);
        }
        let listed = read(&h.admin, &format!("/v1/accounts/{}/keys", account.id)).await;
        api_keys.push(json!([account.id, listed]));
    }
    let nodes: Vec<Value> = read(&h.admin, "/v1/nodes")
        .await
        .as_array()
        .expect("nodes")
        .iter()
        .filter(|node| market.nodes.iter().any(|id| node["id"] == *id))
        .map(|node| {
            json!([
                node["id"],
                node["name"],
                node["public_key"],
                node["region"],
                node["site"],
                node["gpu_model"],
                node["gpu_count"],
                node["policy"]
            ])
        })
        .collect();
    json!({
        "jobs": jobs,
        "jobs_in_all": h.job_count().await,
        "accounts": accounts,
        "money": money,
        "keys": api_keys,
        "nodes": nodes,
        "external_micros": h.metric("fallow_ledger_balance_micros{account=\"external\"}").await,
    })
}

/// [`holdings`] once they stop moving: what an accepted request set going (a job placed, a
/// lease given up) has happened before the next batch is judged.
pub(crate) async fn settled_holdings(h: &Harness, market: &Market) -> Value {
    let mut last = holdings(h, market).await;
    for _ in 0..20 {
        tokio::time::sleep(std::time::Duration::from_millis(400)).await;
        let now = holdings(h, market).await;
        if now == last {
            return now;
        }
        last = now;
    }
    panic!(
        "{}: what the coordinator holds kept moving after the fuzzer's writes: {last}",
        h.backend
    )
}
