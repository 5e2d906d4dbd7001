//! The coordinator under random histories (issue 17): seeded submissions of every tier and
//! shape, preemptions with their grace periods, replicas that exit within them (with code 0
//! too), replicas that finish or fail, node losses and returns, cancellations, and view
//! rebuilds and leader restarts at random points, grace periods included. Everything goes
//! through the real HTTP handlers, reconcile pass and store, on both backends; the test drives
//! the passes itself and moves the coordinator's clock forward (this binary holds this one
//! test: the clock is the process's). After every pass it checks:
//!
//! - no GPU is in two live leases, but a preemption's victim beside its preemptor's leases in
//!   its grace period (`Store::overbooked_gpus`);
//! - the matcher's `consistency_check`, and the view against the store: every live lease but
//!   the victims held, nothing else held, no conflict;
//! - every running job has a live lease, and a replica that stopped in its grace period (with
//!   code 0 too) left its job queued again, never finished;
//! - the ledger balances.
//!
//! `FALLOW_RANDOM_STEPS` (default 200) and `FALLOW_RANDOM_SEED` (default 1) run longer or
//! other histories; a failure names its seed and step.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::Ordering;

use common::{Agent, Harness, Reply, on_every_backend_with};
use serde_json::{Value, json};

/// The preemption grace (seconds) and heartbeat timeout the histories run with.
const GRACE_S: u32 = 30;
const HEARTBEAT_TIMEOUT_MS: u64 = 60_000;
/// The nodes a history starts with, and the most it registers on the way.
const NODES: usize = 5;
const NODES_MAX: usize = 8;

/// splitmix64: a small seeded generator, so a history can be run again from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> Option<&'a T> {
        (!items.is_empty()).then(|| &items[self.below(items.len() as u64) as usize])
    }
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

/// A simulated node's agent: whether it is up (heartbeats), and the leases whose replicas it
/// runs (started, not yet ended) by (lease id, epoch), with their GPUs.
struct Node {
    agent: Agent,
    up: bool,
    running: BTreeMap<(i64, i64), Vec<u8>>,
}

/// What the history did, for the checks and for a failure's message.
struct History {
    seed: u64,
    step: u64,
    /// Replicas that stopped within their grace period, attested with code 0.
    stopped_in_grace: u64,
    jobs: Vec<i64>,
    log: Vec<String>,
}

impl History {
    fn note(&mut self, what: String) {
        self.log.push(format!("step {}: {what}", self.step));
    }

    fn context(&self, backend: &str) -> String {
        let tail: Vec<&String> = self.log.iter().rev().take(12).collect();
        let tail: Vec<&str> = tail.into_iter().rev().map(String::as_str).collect();
        format!(
            "{backend}, seed {} (FALLOW_RANDOM_SEED={}), step {}; last actions:\n{}",
            self.seed,
            self.seed,
            self.step,
            tail.join("\n")
        )
    }
}

fn job(rng: &mut Rng, index: usize) -> Value {
    let tier = *rng.pick(&["gold", "silver", "bronze", "bronze"]).expect("tiers");
    let gang = rng.chance(25);
    let gpus = if gang {
        1 + rng.below(2)
    } else {
        *rng.pick(&[1u64, 1, 2, 3, 4]).expect("sizes")
    };
    json!({
        "name": format!("random-{index}"),
        "image": "busybox:latest",
        "command": ["sleep", "1"],
        "gpus": gpus,
        "replicas": if gang { 2 } else { 1 },
        "topology": if gang { "any" } else { "node" },
        "gpu_models": ["H100-SXM5"],
        "tier": tier,
        "max_price_per_gpu_hour": "5.00",
        "max_runtime_s": 600 + rng.below(3000),
    })
}

/// Sends a signed agent request, again after a moment when the node's rate limit refuses it.
async fn signed(agent: &Agent, path: &str, body: &Value) -> Reply {
    for _ in 0..50 {
        let reply = agent.signed("POST", path, Some(body)).await;
        if reply.status != 429 {
            return reply;
        }
        tokio::time::sleep(std::time::Duration::from_millis(60)).await;
    }
    panic!("{path}: still rate-limited after 3 s");
}

/// One heartbeat of `node`'s simulated agent, and what it does with the lease set: starts a
/// pending replica when its GPUs are free (as the agent does), lets a running one finish or
/// fail now and then, and in a preemption's grace period stops it (attested with code 0 or
/// not at all) or ignores the SIGTERM.
async fn agent_step(h: &Harness, tenant: &str, node: &mut Node, rng: &mut Rng, history: &mut History) {
    let answer = signed(&node.agent, "/v1/agent/heartbeat", &json!({})).await;
    let answer = answer.expect(200, "agent heartbeats");
    let listed: Vec<Value> = answer["leases"].as_array().cloned().unwrap_or_default();
    let listed_keys: BTreeSet<(i64, i64)> = listed
        .iter()
        .map(|item| {
            (
                item["lease"]["id"].as_i64().unwrap(),
                item["lease"]["epoch"].as_i64().unwrap(),
            )
        })
        .collect();
    // A lease no longer listed (or listed at a newer epoch) is stopped by the agent.
    node.running.retain(|key, _| listed_keys.contains(key));
    let now = server::now_us();
    for item in &listed {
        let lease = &item["lease"];
        let key = (lease["id"].as_i64().unwrap(), lease["epoch"].as_i64().unwrap());
        let gpus: Vec<u8> = lease["gpu_indices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|gpu| gpu.as_u64().unwrap() as u8)
            .collect();
        if node.running.contains_key(&key) {
            let in_grace = lease["preempt_at_us"]
                .as_i64()
                .is_some_and(|at| now >= at - i64::from(GRACE_S) * 1_000_000);
            if in_grace {
                match rng.below(3) {
                    0 => {
                        // Stops within the grace period with code 0: not the job's end.
                        let reply =
                            signed(&node.agent, "/v1/agent/attestations", &node.agent.attestation(lease, 0)).await;
                        node.running.remove(&key);
                        if reply.status == 409 {
                            // Ended meanwhile (another replica of its gang ended first).
                            continue;
                        }
                        let ended = reply.expect(200, "an attestation in the grace period");
                        let job = lease["job_id"].as_i64().unwrap();
                        history.stopped_in_grace += 1;
                        history.note(format!("lease {} stops in its grace period, exit 0", key.0));
                        // Defect 3: the job queues again, whatever the replica's code.
                        let context = history.context(h.backend);
                        assert_eq!(ended["state"], "preempted", "{ended}\n{context}");
                        let view = h.get(tenant, &format!("/v1/jobs/{job}")).await.expect(200, "job");
                        assert_eq!(view["state"], "queued", "{view}\n{context}");
                    }
                    1 => {
                        // Killed by SIGTERM: the real agent attests nothing.
                        node.running.remove(&key);
                        history.note(format!("lease {} stops in its grace period, unattested", key.0));
                    }
                    _ => {}
                }
            } else if rng.chance(8) {
                let code = if rng.chance(25) { 1 } else { 0 };
                let reply = signed(
                    &node.agent,
                    "/v1/agent/attestations",
                    &node.agent.attestation(lease, code),
                )
                .await;
                assert!(
                    reply.status == 200 || reply.status == 409,
                    "an attestation: {} {}",
                    reply.status,
                    reply.text
                );
                node.running.remove(&key);
                history.note(format!("lease {} ends with exit code {code}", key.0));
            }
            continue;
        }
        if lease["state"] != "pending" && lease["state"] != "staging" {
            // Running but not ours (this agent "restarted"): it stops, unreported.
            continue;
        }
        let busy = node
            .running
            .values()
            .any(|held| held.iter().any(|gpu| gpus.contains(gpu)));
        if busy || !rng.chance(70) {
            continue;
        }
        let path = format!("/v1/agent/leases/{}/events", key.0);
        for state in ["staging", "running"] {
            let body = json!({"epoch": key.1, "state": state, "detail": "random history"});
            let reply = signed(&node.agent, &path, &body).await;
            assert!(
                reply.status == 200 || reply.status == 409,
                "{}: {state} for lease {}: {} {}",
                h.backend,
                key.0,
                reply.status,
                reply.text
            );
            if reply.status == 409 {
                break;
            }
            if state == "running" {
                node.running.insert(key, gpus.clone());
                history.note(format!("lease {} runs on node {}", key.0, node.agent.node_id));
            }
        }
    }
}

/// What must hold after every pass (see the file's head); `before` is the clock read before
/// the pass, which ended every grace period that was over by then.
async fn check(h: &Harness, history: &History, before: i64) {
    let context = history.context(h.backend);
    let state = &h.running.state;
    let over = state.store.overbooked_gpus(before).await.expect("the store answers");
    if !over.is_empty() {
        let mut leases = Vec::new();
        for lease in over.iter().flat_map(|over| &over.leases) {
            leases.push(format!(
                "{:?}",
                state.store.lease(*lease).await.expect("the store answers")
            ));
        }
        let view = state.view.lock().await;
        let held = view
            .as_ref()
            .map(|view| format!("victims {:?}; held {:?}", view.victims, view.lease_of_store));
        panic!(
            "GPUs booked twice: {over:?}\n{}\n{held:?}\n{context}",
            leases.join("\n")
        );
    }
    let live = state.store.live_leases().await.expect("the store answers");
    {
        let view = state.view.lock().await;
        let view = view
            .as_ref()
            .unwrap_or_else(|| panic!("no view after a pass\n{context}"));
        if let Err(problem) = view.matcher.consistency_check() {
            panic!("the matcher is inconsistent: {problem}\n{context}");
        }
        assert!(view.conflicts.is_empty(), "conflicts: {:?}\n{context}", view.conflicts);
        // Every live lease is held, but a victim, of which only the GPUs its preemptor did not
        // take are (if any); nothing else is.
        let live_ids: BTreeSet<i64> = live.iter().map(|lease| lease.id).collect();
        let must: BTreeSet<i64> = live
            .iter()
            .filter(|lease| lease.preempted_by.is_none())
            .map(|lease| lease.id)
            .collect();
        let held: BTreeSet<i64> = view.lease_of_store.keys().copied().collect();
        let missing: Vec<&i64> = must.difference(&held).collect();
        let extra: Vec<&i64> = held.difference(&live_ids).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "the view misses live leases {missing:?} and holds ended ones {extra:?}\n{context}"
        );
    }
    assert_eq!(state.metrics.view_conflicts.load(Ordering::Relaxed), 0, "{context}");
    let mut live_per_job: HashMap<i64, usize> = HashMap::new();
    for lease in &live {
        *live_per_job.entry(lease.job_id).or_default() += 1;
    }
    for job in state
        .store
        .jobs_in_states(&[store::JobState::Running])
        .await
        .expect("jobs")
    {
        assert!(
            live_per_job.contains_key(&job.id),
            "job {} runs without a live lease\n{context}",
            job.id
        );
    }
    let totals = state.store.ledger_totals().await.expect("ledger totals");
    assert_eq!(
        (totals.balances, totals.entries),
        (0, 0),
        "the ledger does not balance\n{context}"
    );
}

/// Registers the history's node `index`: 4 GPUs, two nodes to an NVLink board.
async fn register(h: &Harness, provider: &common::Account, index: usize) -> Node {
    let agent = h
        .node(provider, &format!("random-{index}"), |registration| {
            registration["gpu_count"] = json!(4);
            registration["nvlink_domain"] = json!(format!("random-board-{}", index / 2));
        })
        .await;
    Node {
        agent,
        up: true,
        running: BTreeMap::new(),
    }
}

async fn history(h: &Harness, seed: u64, steps: u64) {
    let mut rng = Rng(seed);
    let tenant = h.tenant("random-tenant").await;
    h.credit(&tenant, "100000.00").await;
    let provider = h.provider("random-provider").await;
    let mut nodes = Vec::new();
    for index in 0..NODES {
        nodes.push(register(h, &provider, index).await);
    }
    let state = &h.running.state;
    let (_lock, mut cursor) = h.take_lead().await;
    let mut reasons = HashMap::new();
    let mut history = History {
        seed,
        step: 0,
        stopped_in_grace: 0,
        jobs: Vec::new(),
        log: Vec::new(),
    };
    for step in 0..steps {
        history.step = step;
        match rng.below(100) {
            0..=29 => {
                let request = job(&mut rng, history.jobs.len());
                let submitted = h.submit(&tenant, request.clone()).await;
                let id = submitted["id"].as_i64().expect("job id");
                history.jobs.push(id);
                history.note(format!("job {id} submitted: {request}"));
            }
            30..=34 => {
                if let Some(&id) = rng.pick(&history.jobs) {
                    let reply = h.post(&tenant.key, &format!("/v1/jobs/{id}/cancel"), json!({})).await;
                    assert!(reply.status == 200 || reply.status == 409, "cancel: {}", reply.text);
                    history.note(format!("job {id} cancelled ({})", reply.status));
                }
            }
            35..=39 => {
                let index = rng.below(nodes.len() as u64) as usize;
                let node = &mut nodes[index];
                node.up = !node.up;
                if !node.up {
                    node.running.clear();
                }
                history.note(format!(
                    "node {} {}",
                    node.agent.node_id,
                    if node.up { "back" } else { "down" }
                ));
            }
            40..=47 => {
                *state.view.lock().await = None;
                history.note("the view is rebuilt".into());
            }
            48..=51 => {
                cursor = server::reconcile::lead(state).await.expect("takes the lead again");
                reasons.clear();
                history.note("the leader restarts".into());
            }
            52..=69 => {
                let by = if rng.chance(30) {
                    i64::from(GRACE_S) * 1_000_000 / 2 + rng.below(40_000_000) as i64
                } else {
                    rng.below(8_000_000) as i64
                };
                server::advance_clock_for_tests(by);
                history.note(format!("the clock moves {} ms", by / 1000));
            }
            70..=71 if nodes.len() < NODES_MAX => {
                let node = register(h, &provider, nodes.len()).await;
                history.note(format!("node {} registers", node.agent.node_id));
                nodes.push(node);
            }
            _ => {}
        }
        for node in nodes.iter_mut().filter(|node| node.up) {
            agent_step(h, &tenant.key, node, &mut rng, &mut history).await;
        }
        let before = server::now_us();
        if let Err(error) = server::reconcile::pass(state, &mut cursor, &mut reasons).await {
            panic!("the pass failed: {error}\n{}", history.context(h.backend));
        }
        check(h, &history, before).await;
    }
    let preempted = h.metric("fallow_leases_preempted_total").await;
    let rebuilds = h.metric("fallow_view_rebuilds_total").await;
    let grows = h.metric("fallow_view_grows_total").await;
    eprintln!(
        "{}: seed {seed}: {steps} steps, {} jobs, {} nodes, {preempted} leases preempted, {} stopped in their grace, \
         {rebuilds} view rebuilds ({grows} by new nodes alone)",
        h.backend,
        history.jobs.len(),
        nodes.len(),
        history.stopped_in_grace
    );
    assert!(preempted > 0.0, "{}: the history preempted nothing", h.backend);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn random_histories_keep_the_store_the_view_and_the_ledger_in_agreement() {
    let seed = env_number("FALLOW_RANDOM_SEED", 1);
    let steps = env_number("FALLOW_RANDOM_STEPS", 200);
    on_every_backend_with(
        |config| {
            config.reconcile = false;
            config.heartbeat_interval_ms = 5_000;
            config.heartbeat_timeout_ms = HEARTBEAT_TIMEOUT_MS;
            config.matcher.preemption_grace_s = GRACE_S;
            // Canaries have their own tests; here they would only take idle GPUs.
            config.canary_check_every_ms = 1_000_000_000;
        },
        async |h: &Harness| history(h, seed, steps).await,
    )
    .await;
}
