//! The canary service's book: which nodes have canaries open (`Hints`), so that a heartbeat
//! asks the store only for those. The same hints keep the nodes asked to stage datasets
//! (`crate::warm`).

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A replica's list of nodes with canaries open is read again when older than this.
pub const HINTS_FRESH_FOR: Duration = Duration::from_secs(1);

/// Which nodes have canaries open, so that a heartbeat asks the store only for those.
#[derive(Default)]
pub struct Hints {
    open: Mutex<OpenCanaries>,
}

#[derive(Default)]
struct OpenCanaries {
    read_at: Option<Instant>,
    nodes: HashSet<i64>,
    /// A heartbeat is reading them again: the others answer from what is known meanwhile.
    reading: bool,
    /// Nodes this replica ordered canaries on since that read began.
    added: HashSet<i64>,
}

impl Hints {
    /// Whether `node` may have an open canary (read again from the store once a second, by one
    /// heartbeat at a time).
    pub async fn may_have(
        &self,
        node: i64,
        read: impl Future<Output = store::Result<Vec<i64>>>,
    ) -> store::Result<bool> {
        {
            let mut open = self.open.lock().expect("canary hints lock");
            let fresh = open.read_at.is_some_and(|at| at.elapsed() < HINTS_FRESH_FOR);
            // While one heartbeat reads them, the others answer from what is known (a node
            // ordered a canary meanwhile gets it at its next heartbeat).
            if fresh || open.reading {
                return Ok(open.nodes.contains(&node));
            }
            open.reading = true;
            open.added.clear();
        }
        let read = read.await;
        let mut open = self.open.lock().expect("canary hints lock");
        open.reading = false;
        let mut nodes: HashSet<i64> = read?.into_iter().collect();
        nodes.extend(open.added.drain());
        open.nodes = nodes;
        open.read_at = Some(Instant::now());
        Ok(open.nodes.contains(&node))
    }

    pub fn add(&self, node: i64) {
        let mut open = self.open.lock().expect("canary hints lock");
        open.nodes.insert(node);
        open.added.insert(node);
    }
}
