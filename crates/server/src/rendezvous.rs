//! A gang's rendezvous, pure over its live replicas: whether the start barrier is passed (every
//! replica picked up and staged, with the port its agent reserved), and each replica's place in
//! torchrun's contract — rank, world size, local and node ranks, the master's address and port,
//! and every peer's address in rank order.

use api::GangView;
use store::GangMember;

/// Each member's view of the gang, by lease id, once every one of `replicas` is staged; `None`
/// while the gang assembles (a replica missing, not staged, or on a node without an address).
///
/// Rank 0 is on the node that holds the most of the gang's GPUs (ties on the node's id); nodes
/// follow in that order, and the replicas of one node by replica number, so the replicas of a
/// node hold consecutive ranks (torchrun's `NODE_RANK` and `LOCAL_RANK`).
pub fn rendezvous(members: &[GangMember], replicas: u32, epoch: i64) -> Option<Vec<(i64, GangView)>> {
    if members.len() != replicas as usize || members.len() < 2 {
        return None;
    }
    let mut ports = Vec::with_capacity(members.len());
    for member in members {
        let port = u16::try_from(member.port?).ok()?;
        if member.advertise_addr.is_empty() {
            return None;
        }
        ports.push(port);
    }
    // GPUs of the gang per node, and the nodes in rank order.
    let mut nodes: Vec<(i64, u32)> = Vec::new();
    for member in members {
        match nodes.iter_mut().find(|(node, _)| *node == member.node_id) {
            Some((_, gpus)) => *gpus += member.gpus,
            None => nodes.push((member.node_id, member.gpus)),
        }
    }
    nodes.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut order: Vec<usize> = (0..members.len()).collect();
    let node_rank = |node: i64| nodes.iter().position(|(id, _)| *id == node).unwrap_or(usize::MAX);
    order.sort_by_key(|&index| {
        let member = &members[index];
        (node_rank(member.node_id), member.replica, member.lease_id)
    });
    let peers: Vec<String> = order
        .iter()
        .map(|&index| address(&members[index].advertise_addr, ports[index]))
        .collect();
    let master = &members[order[0]];
    let mut views = Vec::with_capacity(members.len());
    for (rank, &index) in order.iter().enumerate() {
        let member = &members[index];
        let on_node: Vec<usize> = order
            .iter()
            .copied()
            .filter(|&other| members[other].node_id == member.node_id)
            .collect();
        views.push((
            member.lease_id,
            GangView {
                epoch,
                rank: rank as u32,
                world_size: members.len() as u32,
                local_rank: on_node.iter().position(|&other| other == index).unwrap_or(0) as u32,
                local_world_size: on_node.len() as u32,
                node_rank: node_rank(member.node_id) as u32,
                master_addr: master.advertise_addr.clone(),
                master_port: ports[order[0]],
                peers: peers.clone(),
            },
        ));
    }
    Some(views)
}

/// `host:port`, with an IPv6 host in brackets.
fn address(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use store::LeaseState;

    fn member(lease_id: i64, replica: i64, node_id: i64, gpus: u32, port: Option<i64>) -> GangMember {
        GangMember {
            lease_id,
            replica,
            node_id,
            gpus,
            state: LeaseState::Staging,
            epoch: 1,
            port,
            advertise_addr: format!("10.0.0.{node_id}"),
        }
    }

    #[test]
    fn rank_zero_is_on_the_node_with_most_of_the_gangs_gpus_and_a_nodes_replicas_are_consecutive() {
        // Node 7 holds one replica of 4 GPUs; node 3 two of 2 (4 in all: a tie, broken by id);
        // node 9 two of 4 (8): first.
        let members = [
            member(100, 0, 7, 4, Some(29500)),
            member(101, 1, 3, 2, Some(29501)),
            member(102, 2, 9, 4, Some(29502)),
            member(103, 3, 3, 2, Some(29503)),
            member(104, 4, 9, 4, Some(29504)),
        ];
        let views = rendezvous(&members, 5, 2).expect("every replica staged");
        let by_lease = |lease: i64| &views.iter().find(|(id, _)| *id == lease).unwrap().1;
        assert_eq!(by_lease(102).rank, 0);
        assert_eq!(by_lease(104).rank, 1);
        assert_eq!(by_lease(101).rank, 2);
        assert_eq!(by_lease(103).rank, 3);
        assert_eq!(by_lease(100).rank, 4);
        assert_eq!(
            (
                by_lease(103).node_rank,
                by_lease(103).local_rank,
                by_lease(103).local_world_size
            ),
            (1, 1, 2)
        );
        assert_eq!((by_lease(100).node_rank, by_lease(100).local_world_size), (2, 1));
        for (_, view) in &views {
            assert_eq!(view.world_size, 5);
            assert_eq!(view.epoch, 2);
            assert_eq!((view.master_addr.as_str(), view.master_port), ("10.0.0.9", 29502));
            assert_eq!(
                view.peers,
                [
                    "10.0.0.9:29502",
                    "10.0.0.9:29504",
                    "10.0.0.3:29501",
                    "10.0.0.3:29503",
                    "10.0.0.7:29500"
                ]
            );
        }
    }

    #[test]
    fn the_barrier_holds_until_every_replica_is_staged_and_present() {
        let staged = [member(1, 0, 1, 1, Some(29500)), member(2, 1, 2, 1, Some(29500))];
        assert!(rendezvous(&staged, 2, 1).is_some());
        let waiting = [member(1, 0, 1, 1, Some(29500)), member(2, 1, 2, 1, None)];
        assert!(rendezvous(&waiting, 2, 1).is_none(), "replica 1 is not staged");
        assert!(
            rendezvous(&staged[..1], 2, 1).is_none(),
            "a replica is missing (lost, not yet replaced)"
        );
        assert!(rendezvous(&staged[..1], 1, 1).is_none(), "one replica is no gang");
        let mut nowhere = staged.clone();
        nowhere[1].advertise_addr.clear();
        assert!(
            rendezvous(&nowhere, 2, 1).is_none(),
            "a node without an address cannot be reached"
        );
    }

    #[test]
    fn an_ipv6_peer_is_bracketed() {
        let mut members = [member(1, 0, 1, 1, Some(29500)), member(2, 1, 2, 1, Some(29501))];
        members[1].advertise_addr = "fd00::2".into();
        let views = rendezvous(&members, 2, 1).unwrap();
        assert_eq!(views[0].1.peers, ["10.0.0.1:29500", "[fd00::2]:29501"]);
    }
}
