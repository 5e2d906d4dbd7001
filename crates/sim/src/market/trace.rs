//! The event trace's hash (FNV-1a over every event and decision of a policy's run, in order),
//! and the fixed, seedless hasher of the simulator's lookup maps.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// FNV-1a: a fixed, seedless hash for maps that are looked up, never iterated in a decision.
#[derive(Default)]
pub(super) struct Fnv(u64);

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        let mut hash = if self.0 == 0 { 0xcbf2_9ce4_8422_2325 } else { self.0 };
        for byte in bytes {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = hash;
    }
}

pub(super) type FixedMap<K, V> = HashMap<K, V, BuildHasherDefault<Fnv>>;

/// The event trace's hash: FNV-1a over every event and decision, in order.
#[derive(Clone, Copy, Debug)]
pub(super) struct TraceHash(pub(super) u64);

impl TraceHash {
    pub(super) fn new() -> TraceHash {
        TraceHash(0xcbf2_9ce4_8422_2325)
    }
    pub(super) fn add(&mut self, words: &[i64]) {
        for word in words {
            for byte in word.to_le_bytes() {
                self.0 ^= u64::from(byte);
                self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
            }
        }
    }
}
