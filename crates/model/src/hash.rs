//! FNV-1a: a fixed, seedless hash, so that nothing depends on a random hasher seed. The
//! matcher's and the simulator's maps use it (they are only looked up, never iterated, on
//! decision paths), and the simulator's event trace hash is FNV-1a over its events.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// FNV-1a's offset basis: the hash of nothing.
pub const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0100_0000_01b3;

/// Extends an FNV-1a hash by `bytes`.
pub fn fnv1a(mut hash: u64, bytes: &[u8]) -> u64 {
    for byte in bytes {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(FNV_PRIME);
    }
    hash
}

/// A `Hasher` for lookup maps: FNV-1a over bytes, and one multiply-xorshift round for a whole
/// `u64` (ids are dense, so this spreads them enough, faster than eight FNV steps).
#[derive(Default)]
pub struct Fnv(u64);

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        let hash = if self.0 == 0 { FNV_OFFSET } else { self.0 };
        self.0 = fnv1a(hash, bytes);
    }
    fn write_u64(&mut self, value: u64) {
        let mixed = (value ^ 0x9e37_79b9_7f4a_7c15).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        self.0 = mixed ^ (mixed >> 31);
    }
}

/// A map with the fixed hasher.
pub type FixedMap<K, V> = HashMap<K, V, BuildHasherDefault<Fnv>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_matches_its_published_test_vectors() {
        assert_eq!(fnv1a(FNV_OFFSET, b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(FNV_OFFSET, b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(FNV_OFFSET, b"foobar"), 0x8594_4171_f739_67e8);
    }
}
