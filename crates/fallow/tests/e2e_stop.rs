//! Service life of the real `fallow agent`: a service manager's stop (SIGTERM, what systemd,
//! `docker stop` and the kubelet send) stops the agent as Ctrl-C does, with exit status 0, while
//! it runs a replica. (The coordinator's and `fallow dev`'s SIGTERM are in `crash.rs` and
//! `dev.rs`.)

mod common;

use std::time::Duration;

use common::eventually;
use common::world::World;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_running_a_replica_stops_cleanly_on_sigterm() {
    let world = World::new("fallow_e2e_stop").await;
    let mut agent = world.agent("rig", "process", "2.00", None);
    world.nodes_online(1).await;
    let job = world
        .submit(json!({
            "name": "long",
            "image": "/bin/sh",
            "command": ["-c", "sleep 120"],
            "runtime": "process",
            "gpus": 1,
            "tier": "silver",
            "max_price_per_gpu_hour": "5.00",
            "max_runtime_s": 600,
        }))
        .await;
    eventually(Duration::from_secs(60), "the replica running", || async {
        let view = world.get(&format!("/v1/jobs/{job}")).await;
        (view["state"] == "running").then_some(())
    })
    .await;
    let status = agent.terminate(Duration::from_secs(30));
    assert!(
        status.is_some_and(|status| status.success()),
        "exit status {status:?} after SIGTERM; {}",
        agent.log_tail()
    );
    assert!(
        agent.log_tail().contains("SIGTERM: agent stopping"),
        "{}",
        agent.log_tail()
    );
}
