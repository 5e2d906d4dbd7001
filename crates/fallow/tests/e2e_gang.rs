//! Gangs that train, with the real `fallow` binary and Debian's CPU PyTorch: a coordinator and
//! agents with simulated GPUs on this host. A 2-replica gang placed by the market all-reduces a
//! tensor over gloo with the rendezvous the agents hand it, as processes and in Docker
//! containers; a 3-replica training gang loses a node (its agent SIGKILLed), is repaired onto a
//! spare, resumes from its checkpoint and ends with the loss of an uninterrupted run; a gang
//! whose replica cannot start on one node runs none of its commands there and is placed again
//! without it. Without `/usr/bin/python3` and torch (or Docker, for the container test) a test
//! prints SKIPPED; with `FALLOW_CI_REQUIRE_SERVICES=1` it fails instead.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::eventually;
use common::world::{AgentProcess, PYTHON, TORCH_IMAGE, WITHIN, World, skip, torch_missing};
use serde_json::{Value, json};

fn gang_script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gang").join(name)
}

fn allreduce_job(image: &str, command: Vec<String>, runtime: &str) -> Value {
    json!({
        "name": "allreduce",
        "image": image,
        "command": command,
        "runtime": runtime,
        "env": {"GLOO_SOCKET_IFNAME": "lo", "FALLOW_GANG_TIMEOUT_S": "60"},
        "replicas": 2,
        "gpus": 1,
        "topology": "site",
        "tier": "silver",
        "max_price_per_gpu_hour": "5.00",
        "max_runtime_s": 600,
    })
}

/// Both replicas' output shows the reduced value (1 + 2), each with its own rank.
async fn assert_all_reduced(world: &World, job: i64, agents: &[&AgentProcess]) {
    let view = world.ended(job, agents).await;
    let outputs = world.outputs(job).await;
    assert_eq!(view["state"], "finished", "{view}\noutputs: {outputs:#?}");
    let mut ranks = Vec::new();
    for text in outputs.values() {
        let line = text
            .lines()
            .find(|line| line.starts_with("allreduce "))
            .unwrap_or_else(|| panic!("no allreduce line in {text}"));
        assert!(line.ends_with("world=2 sum=3"), "{line}");
        ranks.push(line.split_whitespace().nth(1).unwrap().to_string());
    }
    ranks.sort();
    assert_eq!(ranks, ["rank=0", "rank=1"], "{outputs:#?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_gang_placed_by_the_market_all_reduces_as_processes() {
    if let Some(why) = torch_missing() {
        return skip("a_gang_placed_by_the_market_all_reduces_as_processes", &why);
    }
    let world = World::new("gang-allreduce").await;
    let (first, second) = (
        world.agent("rig-1", "process", "2.00", None),
        world.agent("rig-2", "process", "2.00", None),
    );
    world.nodes_online(2).await;
    let script = gang_script("allreduce.py").display().to_string();
    let job = world.submit(allreduce_job(PYTHON, vec![script], "process")).await;
    assert_all_reduced(&world, job, &[&first, &second]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_gang_placed_by_the_market_all_reduces_in_containers() {
    let test = "a_gang_placed_by_the_market_all_reduces_in_containers";
    if let Some(why) = torch_missing() {
        return skip(test, &why);
    }
    let built = Command::new("bash")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/torch-image.sh"))
        .arg(TORCH_IMAGE)
        .output();
    match built {
        Ok(output) if output.status.success() => {}
        Ok(output) => {
            return skip(
                test,
                &format!(
                    "scripts/torch-image.sh could not build {TORCH_IMAGE}: {}",
                    String::from_utf8_lossy(&output.stderr)
                ),
            );
        }
        Err(error) => return skip(test, &format!("bash: {error}")),
    }
    let world = World::new("gang-allreduce-docker").await;
    let (first, second) = (
        world.agent("box-1", "docker", "2.00", None),
        world.agent("box-2", "docker", "2.00", None),
    );
    world.nodes_online(2).await;
    let job = world
        .submit(allreduce_job(
            TORCH_IMAGE,
            vec!["python3".into(), "/opt/fallow-gang/allreduce.py".into()],
            "container",
        ))
        .await;
    assert_all_reduced(&world, job, &[&first, &second]).await;
}

/// The final loss a run printed (`final loss=… steps=…`), if it got there.
fn final_loss(text: &str) -> Option<f64> {
    text.lines().rev().find_map(|line| {
        let (_, rest) = line.split_once("final loss=")?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

const TRAIN_ARGS: [&str; 6] = ["--steps", "60", "--checkpoint-every", "5", "--step-sleep", "0.2"];

#[tokio::test(flavor = "multi_thread")]
async fn training_survives_a_lost_node() {
    if let Some(why) = torch_missing() {
        return skip("training_survives_a_lost_node", &why);
    }
    let script = gang_script("train.py").display().to_string();
    // The loss of the same run, uninterrupted: three local ranks.
    let reference = Command::new("bash")
        .arg(gang_script("run_local.sh"))
        .arg("3")
        .arg(&script)
        .args(TRAIN_ARGS)
        .output()
        .expect("run the reference");
    let reference_text = String::from_utf8_lossy(&reference.stdout).into_owned();
    assert!(
        reference.status.success(),
        "the reference run failed:\n{reference_text}"
    );
    let expected = final_loss(&reference_text).expect("the reference's final loss");

    let world = World::new("gang-repair").await;
    let mut agents: Vec<AgentProcess> = (1..=3)
        .map(|index| world.agent(&format!("rig-{index}"), "process", "2.00", None))
        .collect();
    world.nodes_online(3).await;
    let mut command = vec![script.clone(), "--timeout-s".to_string(), "30".to_string()];
    command.extend(TRAIN_ARGS.iter().map(|arg| arg.to_string()));
    let job = world
        .submit(json!({
            "name": "train",
            "image": PYTHON,
            "command": command,
            "runtime": "process",
            "env": {"GLOO_SOCKET_IFNAME": "lo"},
            "replicas": 3,
            "gpus": 1,
            "topology": "site",
            "tier": "silver",
            "max_price_per_gpu_hour": "5.00",
            "max_runtime_s": 900,
            "checkpoint_dir": "/checkpoint",
        }))
        .await;
    // The spare comes once the gang runs on the first three.
    let first_leases: Vec<Value> = eventually(WITHIN, "the gang checkpointed step 15", || async {
        let outputs = world.outputs(job).await;
        let checkpointed = outputs.values().any(|text| text.contains("checkpoint step 15"));
        let view = world.get(&format!("/v1/jobs/{job}")).await;
        checkpointed.then(|| view["leases"].as_array().cloned().unwrap_or_default())
    })
    .await;
    agents.push(world.agent("spare", "process", "2.00", None));
    world.nodes_online(4).await;
    // Kill the agent of the replica that is not rank 0's (any would do; rank 0's shows the
    // master moving too) — here the agent of the lease of replica 1.
    let victim_lease = first_leases
        .iter()
        .find(|lease| lease["replica"] == 1)
        .expect("replica 1's lease")
        .clone();
    let victim_node = victim_lease["node_id"].as_i64().unwrap();
    let nodes = world.admin_get("/v1/nodes").await;
    let victim_name = nodes
        .as_array()
        .unwrap()
        .iter()
        .find(|node| node["id"] == victim_node)
        .expect("the victim's node")["name"]
        .as_str()
        .unwrap()
        .to_string();
    let killed_at_us = common::now_ms() * 1000;
    agents
        .iter_mut()
        .find(|agent| agent.name == victim_name)
        .expect("the victim's agent")
        .kill();
    let agent_refs: Vec<&AgentProcess> = agents.iter().collect();
    let view = world.ended(job, &agent_refs).await;
    let outputs = world.outputs(job).await;
    assert_eq!(view["state"], "finished", "{view}\n{outputs:#?}");
    let leases = view["leases"].as_array().unwrap();
    let lost = leases
        .iter()
        .find(|lease| lease["id"] == victim_lease["id"])
        .expect("the lost lease");
    assert_eq!(lost["state"], "lost", "{lost}");
    let replacement = leases
        .iter()
        .find(|lease| lease["replica"] == 1 && lease["id"] != victim_lease["id"])
        .expect("a replacement for replica 1");
    assert_ne!(replacement["node_id"], victim_node, "{replacement}");
    // Every replica that ran to the end resumed and ended with the uninterrupted run's loss.
    for lease in leases.iter().filter(|lease| lease["state"] == "finished") {
        let text = &outputs[&lease["id"].as_i64().unwrap()];
        assert!(
            text.contains("resumed from step"),
            "lease {} did not resume:\n{text}",
            lease["id"]
        );
        let loss = final_loss(text).unwrap_or_else(|| panic!("no final loss in {text}"));
        assert!(
            (loss - expected).abs() <= 1e-6 * expected.abs().max(1.0),
            "lease {}: final loss {loss} after the repair, {expected} uninterrupted",
            lease["id"]
        );
    }
    assert_eq!(leases.iter().filter(|lease| lease["state"] == "finished").count(), 3);
    // Billed only the seconds the replicas ran: what each lease metered, at its price, is what
    // the job cost; the lost lease metered nothing after its agent died.
    let store = store::Store::open(&world.database).await.expect("open the database");
    let mut charged = 0;
    for lease in leases {
        for record in store.usage_of_lease(lease["id"].as_i64().unwrap()).await.unwrap() {
            charged += record.charged_micros;
            if lease["id"] == victim_lease["id"] {
                let body: Value = serde_json::from_str(&record.body).unwrap();
                assert!(body["period_end_ms"].as_i64().unwrap() * 1000 <= killed_at_us, "{body}");
            }
        }
    }
    assert!(charged > 0);
    assert_eq!(view["cost_micros"], charged, "{view}");
    assert_eq!(view["escrow_micros"], 0, "{view}");
    // The repair's timeline, for the record: detection, decision, start, rendezvous.
    let lost_events = world.lease_events(victim_lease["id"].as_i64().unwrap()).await;
    let replacement_events = world.lease_events(replacement["id"].as_i64().unwrap()).await;
    let lost_at = lost["ended_at_us"].as_i64().unwrap();
    let decided_at = replacement["created_at_us"].as_i64().unwrap();
    let staged_at = replacement_events
        .iter()
        .find(|(kind, _)| kind == "staged")
        .map_or(0, |(_, at)| *at);
    let running_at = replacement_events
        .iter()
        .find(|(kind, _)| kind == "running")
        .map_or(0, |(_, at)| *at);
    eprintln!(
        "repair timeline (ms after the SIGKILL): lost {} (detection), replacement decided {}, staged {}, \
         running {} (the gang's rendezvous passed); lost lease events {lost_events:?}",
        (lost_at - killed_at_us) / 1000,
        (decided_at - killed_at_us) / 1000,
        (staged_at - killed_at_us) / 1000,
        (running_at - killed_at_us) / 1000,
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_gang_whose_replica_cannot_start_is_placed_again_without_that_node() {
    let world = World::new("gang-missing-image").await;
    // `gang-replica` is a program on two nodes' PATH and not on the third's, which asks least
    // and so is placed on first.
    let bin = world.scratch.path.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let marks = world.scratch.path.join("marks");
    std::fs::create_dir_all(&marks).unwrap();
    let program = bin.join("gang-replica");
    std::fs::write(
        &program,
        format!(
            "#!/bin/sh\necho started > {}/ran-$FALLOW_LEASE_ID\necho rank=$RANK world=$WORLD_SIZE peers=$FALLOW_PEERS\n",
            marks.display()
        ),
    )
    .unwrap();
    std::os::unix::fs::PermissionsExt::set_mode(&mut std::fs::metadata(&program).unwrap().permissions(), 0o755);
    std::fs::set_permissions(&program, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let path = std::env::var("PATH").unwrap_or_default();
    let with = format!("{}:{path}", bin.display());
    let agents = [
        world.agent("has-1", "process", "2.00", Some(&with)),
        world.agent("has-2", "process", "2.00", Some(&with)),
        world.agent("lacks", "process", "1.00", Some(&path)),
    ];
    world.nodes_online(3).await;
    let job = world
        .submit(json!({
            "name": "gang",
            "image": "gang-replica",
            "runtime": "process",
            "replicas": 2,
            "gpus": 1,
            "topology": "site",
            "tier": "silver",
            "max_price_per_gpu_hour": "5.00",
            "max_runtime_s": 600,
        }))
        .await;
    let refs: Vec<&AgentProcess> = agents.iter().collect();
    let view = world.ended(job, &refs).await;
    assert_eq!(view["state"], "finished", "{view}");
    let leases = view["leases"].as_array().unwrap();
    let nodes = world.admin_get("/v1/nodes").await;
    let lacks = nodes
        .as_array()
        .unwrap()
        .iter()
        .find(|node| node["name"] == "lacks")
        .unwrap()["id"]
        .clone();
    let failed = leases
        .iter()
        .find(|lease| lease["state"] == "failed")
        .unwrap_or_else(|| panic!("the first placement tried the node without the program: {view}"));
    assert_eq!(failed["node_id"], lacks, "{failed}");
    assert!(
        failed["end_reason"].as_str().unwrap().contains("not on this node"),
        "{failed}"
    );
    // Its partner never ran its command: it was stopped at the barrier, with the reason.
    let cancelled: Vec<&Value> = leases.iter().filter(|lease| lease["state"] == "cancelled").collect();
    assert_eq!(cancelled.len(), 1, "{view}");
    let reason = cancelled[0]["end_reason"].as_str().unwrap();
    assert!(
        reason.contains("could not start on node \"lacks\"") && reason.contains("without that node"),
        "{reason}"
    );
    let finished: Vec<&Value> = leases.iter().filter(|lease| lease["state"] == "finished").collect();
    assert_eq!(finished.len(), 2, "{view}");
    assert!(finished.iter().all(|lease| lease["node_id"] != lacks), "{view}");
    let ran: Vec<String> = std::fs::read_dir(&marks)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let mut expected: Vec<String> = finished.iter().map(|lease| format!("ran-{}", lease["id"])).collect();
    let mut ran_sorted = ran.clone();
    ran_sorted.sort();
    expected.sort();
    assert_eq!(
        ran_sorted, expected,
        "only the second placement's replicas ran their command"
    );
}
