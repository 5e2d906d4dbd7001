//! Which nodes may hold live leases, as the leading replica knows it, so that a heartbeat from
//! a node with none (most of a fleet, most of the time) is answered without asking the store.
//!
//! Only the leader creates leases (placements, gang repairs), and it marks their nodes here
//! after each commit; leases that end (on any replica) only make the hints too cautious until
//! a heartbeat finds the node's lease list empty and clears its mark. A replica that does not
//! lead, or has not yet built its view, knows nothing (`None`) and always asks the store.

use std::collections::HashMap;
use std::sync::Mutex;

#[derive(Default)]
pub struct LeaseHints {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Node → the mark of its newest lease (or of `know`); `None` while unknown.
    marks: Option<HashMap<i64, u64>>,
    /// The last mark given: marks are never reused, so an answer about an older mark never
    /// clears a newer one.
    last: u64,
}

/// What the hints say about one node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hint {
    /// The node holds no live lease.
    None,
    /// Ask the store; if it finds none, `clear(node, mark)`.
    Ask(Option<u64>),
}

impl LeaseHints {
    /// Starts knowing: the nodes with live leases now (the leader's view).
    pub fn know(&self, nodes: impl IntoIterator<Item = i64>) {
        let mut inner = self.inner.lock().expect("lease hints lock");
        inner.last += 1;
        let mark = inner.last;
        inner.marks = Some(nodes.into_iter().map(|node| (node, mark)).collect());
    }

    /// Stops knowing (this replica no longer leads).
    pub fn forget(&self) {
        self.inner.lock().expect("lease hints lock").marks = None;
    }

    pub fn known(&self) -> bool {
        self.inner.lock().expect("lease hints lock").marks.is_some()
    }

    /// A lease on `node` was committed to the store.
    pub fn leased(&self, node: i64) {
        let mut inner = self.inner.lock().expect("lease hints lock");
        inner.last += 1;
        let mark = inner.last;
        if let Some(marks) = inner.marks.as_mut() {
            marks.insert(node, mark);
        }
    }

    pub fn of(&self, node: i64) -> Hint {
        match self.inner.lock().expect("lease hints lock").marks.as_ref() {
            None => Hint::Ask(None),
            Some(marks) => marks.get(&node).map_or(Hint::None, |mark| Hint::Ask(Some(*mark))),
        }
    }

    /// The store found no live lease on `node`, asked after `of` gave `mark`: unmarks the node
    /// unless a lease was committed on it since, or the hints were rebuilt (the mark moved).
    pub fn clear(&self, node: i64, mark: u64) {
        if let Some(marks) = self.inner.lock().expect("lease hints lock").marks.as_mut()
            && marks.get(&node) == Some(&mark)
        {
            marks.remove(&node);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_until_told_and_cautious_after() {
        let hints = LeaseHints::default();
        assert_eq!(hints.of(7), Hint::Ask(None), "a follower always asks");
        hints.know([7]);
        let Hint::Ask(Some(seven)) = hints.of(7) else {
            panic!("a node with a lease is asked about");
        };
        assert_eq!(hints.of(8), Hint::None, "a node without one is not");
        hints.leased(8);
        // A lease committed between the question and the empty answer keeps the mark.
        let Hint::Ask(Some(asked)) = hints.of(8) else {
            panic!("a new lease marks its node");
        };
        hints.leased(8);
        hints.clear(8, asked);
        let Hint::Ask(Some(newer)) = hints.of(8) else {
            panic!("the newer lease keeps its node marked");
        };
        hints.clear(8, newer);
        assert_eq!(hints.of(8), Hint::None);
        // Rebuilt hints are not cleared by an answer to a question asked before.
        hints.know([7]);
        hints.clear(7, seven);
        assert!(matches!(hints.of(7), Hint::Ask(Some(_))));
        hints.forget();
        assert_eq!(hints.of(8), Hint::Ask(None));
    }
}
