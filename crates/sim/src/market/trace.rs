//! The event trace's hash (FNV-1a over every event and decision of a policy's run, in order),
//! and the fixed, seedless hasher of the simulator's lookup maps.

use model::hash::{FNV_OFFSET, fnv1a};

pub(super) use model::hash::FixedMap;

/// The event trace's hash: FNV-1a over every event and decision, in order.
#[derive(Clone, Copy, Debug)]
pub(super) struct TraceHash(pub(super) u64);

impl TraceHash {
    pub(super) fn new() -> TraceHash {
        TraceHash(FNV_OFFSET)
    }
    pub(super) fn add(&mut self, words: &[i64]) {
        for word in words {
            self.0 = fnv1a(self.0, &word.to_le_bytes());
        }
    }
}
