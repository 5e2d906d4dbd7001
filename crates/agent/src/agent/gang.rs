//! A gang replica's start: staged first (its image present, its datasets fetched, a port
//! reserved, `staged` reported), it waits for the coordinator's start barrier and starts only
//! once the lease set brings its gang's rendezvous, with torchrun's environment; a running
//! replica of a gang that re-rendezvous itself (`gang_repair: keep`) finds each new epoch's
//! peers in its rendezvous file.

use std::collections::BTreeMap;
use std::net::TcpListener;

use api::{AgentLease, GangView};

use super::Agent;
use crate::exec::{Executor, RunSpec};

/// The file in a replica's scratch directory holding its gang's current rendezvous (JSON:
/// the `GangView`), rewritten at each new epoch; named to the replica by
/// `FALLOW_RENDEZVOUS_FILE`.
pub const RENDEZVOUS_FILE: &str = ".fallow-rendezvous.json";

/// The environment variable a replica's reserved port is kept in (its own, for gang traffic).
pub const PORT_VAR: &str = "FALLOW_PORT";

/// A gang replica staged and waiting for its gang's start barrier.
pub(super) struct Staged {
    pub epoch: i64,
    pub port: u16,
    pub spec: RunSpec,
}

/// Whether a lease's job is a gang: its replicas start together, after the barrier.
pub(super) fn is_gang(lease: &AgentLease) -> bool {
    lease.job.replicas > 1
}

/// torchrun's environment (and Fallow's names for the same) for one replica of a gang.
pub fn gang_env(gang: &GangView) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    let mut set = |name: &str, value: String| {
        env.insert(name.to_string(), value);
    };
    set("FALLOW_REPLICA", gang.rank.to_string());
    set("FALLOW_REPLICAS", gang.world_size.to_string());
    set("FALLOW_PEERS", gang.peers.join(","));
    set("FALLOW_GANG_EPOCH", gang.epoch.to_string());
    set("MASTER_ADDR", gang.master_addr.clone());
    set("MASTER_PORT", gang.master_port.to_string());
    set("RANK", gang.rank.to_string());
    set("WORLD_SIZE", gang.world_size.to_string());
    set("LOCAL_RANK", gang.local_rank.to_string());
    set("LOCAL_WORLD_SIZE", gang.local_world_size.to_string());
    set("NODE_RANK", gang.node_rank.to_string());
    env
}

/// A port of `first..=last` that no replica here holds (`taken`) and that can be bound now,
/// looking from a place that depends on the lease so that agents sharing a host rarely pick
/// the same one. `None` when every port is taken.
pub fn reserve_port(first: u16, last: u16, taken: &[u16], lease_id: i64) -> Option<u16> {
    if first == 0 || first > last {
        return None;
    }
    let span = u32::from(last - first) + 1;
    let start = (lease_id.unsigned_abs() % u64::from(span)) as u32;
    (0..span)
        .map(|step| first + ((start + step) % span) as u16)
        .find(|port| !taken.contains(port) && TcpListener::bind(("0.0.0.0", *port)).is_ok())
}

impl<E: Executor> Agent<E> {
    /// Ports held by this agent's replicas, running or staged.
    fn ports_taken(&self) -> Vec<u16> {
        self.runs
            .values()
            .filter_map(|run| run.spec.env.get(PORT_VAR)?.parse().ok())
            .chain(self.staged.values().map(|staged| staged.port))
            .collect()
    }

    /// Stages a gang replica whose datasets are fetched: checks that it could start here,
    /// reserves its port and reports it staged; it starts when the gang's rendezvous comes.
    pub(super) async fn stage_gang_replica(&mut self, lease: &AgentLease, mut spec: RunSpec) {
        let id = lease.lease.id;
        if let Err(error) = self.executor.prepare(&spec).await {
            tracing::warn!(lease = id, %error, "the gang replica cannot start here");
            self.ended.insert((id, lease.lease.epoch));
            if let Err(report) = self.report(lease, "failed", None, &error.to_string()).await {
                tracing::warn!(lease = id, error = %report, "could not report the failure");
            }
            return;
        }
        let (first, last) = self.config.topology.gang_ports;
        let Some(port) = reserve_port(first, last, &self.ports_taken(), id) else {
            let reason = format!("no free port in {first}-{last} for the gang's traffic");
            tracing::warn!(lease = id, %reason, "the gang replica cannot start here");
            self.ended.insert((id, lease.lease.epoch));
            if let Err(report) = self.report(lease, "failed", None, &reason).await {
                tracing::warn!(lease = id, error = %report, "could not report the failure");
            }
            return;
        };
        spec.env.insert(PORT_VAR.to_string(), port.to_string());
        match self.report_staged(lease, port).await {
            Ok(()) => {
                tracing::info!(lease = id, port, "gang replica staged; waiting for its gang");
                self.staged.insert(
                    id,
                    Staged {
                        epoch: lease.lease.epoch,
                        port,
                        spec,
                    },
                );
            }
            Err(error) => {
                tracing::warn!(lease = id, %error, "could not report the replica staged; trying again");
                self.launch_waiting = true;
            }
        }
    }

    /// Starts a staged gang replica with its gang's rendezvous.
    pub(super) async fn start_gang_replica(&mut self, lease: &AgentLease, staged: Staged, gang: &GangView) {
        let mut spec = staged.spec;
        spec.env.extend(gang_env(gang));
        // The rendezvous file goes inside the scratch volume, so it is opened first.
        if !self.open_scratch(lease, &spec).await {
            return;
        }
        write_rendezvous(&spec, gang);
        tracing::info!(
            lease = lease.lease.id,
            rank = gang.rank,
            world = gang.world_size,
            gang_epoch = gang.epoch,
            "the gang assembled; starting its replica"
        );
        self.start_replica(lease, spec).await;
    }

    /// A running replica's gang moved to a new epoch (repaired, and the job keeps its
    /// survivors running): its rendezvous file says so.
    pub(super) fn gang_moved(&self, id: i64, gang: &GangView) {
        if let Some(run) = self.runs.get(&id) {
            tracing::info!(lease = id, gang_epoch = gang.epoch, "the gang moved to a new epoch");
            write_rendezvous(&run.spec, gang);
        }
    }
}

/// Writes the gang's rendezvous to the replica's rendezvous file (atomically: a new file moved
/// over the old one).
fn write_rendezvous(spec: &RunSpec, gang: &GangView) {
    let path = spec.scratch_dir.join(RENDEZVOUS_FILE);
    let written = std::fs::create_dir_all(&spec.scratch_dir).and_then(|()| {
        let text = serde_json::to_string_pretty(gang).map_err(std::io::Error::other)?;
        let partial = path.with_extension("partial");
        std::fs::write(&partial, text)?;
        std::fs::rename(&partial, &path)
    });
    if let Err(error) = written {
        tracing::warn!(path = %path.display(), %error, "could not write the gang's rendezvous file");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replica_gets_torchruns_names_and_fallows() {
        let gang = GangView {
            epoch: 3,
            rank: 2,
            world_size: 4,
            local_rank: 0,
            local_world_size: 1,
            node_rank: 2,
            master_addr: "10.0.0.9".into(),
            master_port: 29_517,
            peers: vec!["10.0.0.9:29517".into(), "10.0.0.3:29500".into()],
        };
        let env = gang_env(&gang);
        let get = |name: &str| env.get(name).map(String::as_str);
        assert_eq!(get("RANK"), Some("2"));
        assert_eq!(get("FALLOW_REPLICA"), Some("2"));
        assert_eq!(get("WORLD_SIZE"), Some("4"));
        assert_eq!(get("FALLOW_REPLICAS"), Some("4"));
        assert_eq!(get("MASTER_ADDR"), Some("10.0.0.9"));
        assert_eq!(get("MASTER_PORT"), Some("29517"));
        assert_eq!(get("NODE_RANK"), Some("2"));
        assert_eq!(get("LOCAL_RANK"), Some("0"));
        assert_eq!(get("LOCAL_WORLD_SIZE"), Some("1"));
        assert_eq!(get("FALLOW_GANG_EPOCH"), Some("3"));
        assert_eq!(get("FALLOW_PEERS"), Some("10.0.0.9:29517,10.0.0.3:29500"));
    }

    #[test]
    fn a_port_is_reserved_from_the_range_skipping_taken_and_bound_ones() {
        let held = TcpListener::bind(("0.0.0.0", 0)).expect("a free port");
        let bound = held.local_addr().unwrap().port();
        // A range of the bound port alone has nothing to give.
        assert_eq!(reserve_port(bound, bound, &[], 1), None);
        // One more port beside it: that one, whatever the lease.
        if let Some(next) = bound.checked_add(1)
            && TcpListener::bind(("0.0.0.0", next)).is_ok()
        {
            for lease in 0..4 {
                assert_eq!(reserve_port(bound, next, &[], lease), Some(next));
            }
            assert_eq!(reserve_port(bound, next, &[next], 0), None, "taken by another replica");
        }
        assert_eq!(reserve_port(0, 10, &[], 1), None, "no range");
    }
}
