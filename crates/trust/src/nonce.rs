//! Replay protection: remembers each node's recent request nonces for as long as their
//! timestamps would still pass the freshness check.

use std::collections::{BTreeMap, BTreeSet};

use crate::request::check_nonce_format;
use crate::{DEFAULT_MAX_SKEW_MS, TrustError};

/// Most nonces remembered at once. An entry costs roughly 100 bytes across the two indexes, so
/// about 100 MB when full; with the default 30 s window an entry lives at most 60 s, which allows
/// about 16,000 requests a second sustained.
pub const NONCES_MAX: usize = 1_000_000;

/// Most nonces remembered for one node, so that one misbehaving (but correctly signing) node
/// fills only its own share and cannot lock every other node out.
pub const NONCES_PER_NODE_MAX: usize = 100_000;

type Nonce = [u8; 16];

/// Recently seen (node, nonce) pairs, in memory and bounded.
///
/// A nonce is remembered until its request's timestamp falls out of the window, after which
/// the freshness check refuses that request anyway, so forgetting it is safe. When the cache is
/// full, new requests are refused ([`TrustError::NonceCacheFull`]) instead of evicting unexpired
/// entries: an evicted nonce could be replayed while its timestamp is still fresh.
///
/// Outcomes depend only on the calls made, never on hash order: both indexes are B-trees.
#[derive(Debug)]
pub struct NonceCache {
    window_ms: i64,
    entries_max: usize,
    entries_per_node_max: usize,
    /// (node, nonce) → request timestamp: the replay lookup.
    seen: BTreeMap<(i64, Nonce), i64>,
    /// (request timestamp, node, nonce): expiry order.
    by_time: BTreeSet<(i64, i64, Nonce)>,
    entries_per_node: BTreeMap<i64, usize>,
    /// Entries with timestamps before this were forgotten. Requests this old are refused even if
    /// `now_ms` later moves backwards (a clock step), since their nonces are no longer known.
    forgotten_before_ms: i64,
}

impl Default for NonceCache {
    fn default() -> NonceCache {
        NonceCache::new(DEFAULT_MAX_SKEW_MS, NONCES_MAX, NONCES_PER_NODE_MAX)
    }
}

impl NonceCache {
    /// `window_ms` must be at least the `max_skew_ms` given to [`crate::verify_request`]; the
    /// cache itself refuses timestamps outside ±`window_ms` of `now_ms`, so it stays correct
    /// even if the two differ.
    pub fn new(window_ms: i64, entries_max: usize, entries_per_node_max: usize) -> NonceCache {
        assert!(window_ms >= 0, "window_ms is a duration, got {window_ms}");
        assert!(
            entries_per_node_max <= entries_max,
            "a node's share cannot exceed the whole cache"
        );
        NonceCache {
            window_ms,
            entries_max,
            entries_per_node_max,
            seen: BTreeMap::new(),
            by_time: BTreeSet::new(),
            entries_per_node: BTreeMap::new(),
            forgotten_before_ms: i64::MIN,
        }
    }

    pub fn len(&self) -> usize {
        self.seen.len()
    }

    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }

    /// Accepts a request's nonce once. Call only after [`crate::verify_request`] succeeded, so
    /// that forged requests cannot fill the cache or use up a node's nonces.
    ///
    /// Errors: `Stale` for timestamps outside the window, `BadHeader` for a malformed nonce,
    /// `Replayed` for a nonce this node used within the window, `NonceCacheFull` when the cache
    /// or this node's share of it is full.
    pub fn check_and_remember(
        &mut self,
        node_id: i64,
        nonce: &str,
        timestamp_ms: i64,
        now_ms: i64,
    ) -> Result<(), TrustError> {
        self.forget_expired(now_ms);
        let skew_ms = timestamp_ms.saturating_sub(now_ms);
        if skew_ms.unsigned_abs() > self.window_ms.unsigned_abs() || timestamp_ms < self.forgotten_before_ms {
            return Err(TrustError::Stale { skew_ms });
        }
        let nonce = check_nonce_format(nonce)?;
        if self.seen.contains_key(&(node_id, nonce)) {
            return Err(TrustError::Replayed);
        }
        let node_entries = self.entries_per_node.get(&node_id).copied().unwrap_or(0);
        if self.seen.len() >= self.entries_max || node_entries >= self.entries_per_node_max {
            return Err(TrustError::NonceCacheFull);
        }
        self.seen.insert((node_id, nonce), timestamp_ms);
        self.by_time.insert((timestamp_ms, node_id, nonce));
        *self.entries_per_node.entry(node_id).or_insert(0) += 1;
        Ok(())
    }

    /// Drops entries whose timestamps are older than `now_ms - window_ms`: requests that old
    /// fail the freshness check, so their nonces need not be remembered.
    fn forget_expired(&mut self, now_ms: i64) {
        let horizon_ms = now_ms.saturating_sub(self.window_ms);
        if horizon_ms <= self.forgotten_before_ms {
            return;
        }
        self.forgotten_before_ms = horizon_ms;
        while let Some(&(timestamp_ms, node_id, nonce)) = self.by_time.first() {
            if timestamp_ms >= horizon_ms {
                break;
            }
            self.by_time.pop_first();
            let removed = self.seen.remove(&(node_id, nonce));
            assert_eq!(removed, Some(timestamp_ms), "the two indexes hold the same entries");
            let count = self
                .entries_per_node
                .get_mut(&node_id)
                .expect("every entry's node is counted");
            *count -= 1;
            if *count == 0 {
                self.entries_per_node.remove(&node_id);
            }
        }
    }

    /// Recomputes the indexes' agreement and the limits from scratch; O(n), for tests.
    pub fn consistency_check(&self) {
        assert_eq!(self.seen.len(), self.by_time.len());
        assert!(self.seen.len() <= self.entries_max);
        let mut entries_per_node = BTreeMap::<i64, usize>::new();
        for (&(node_id, nonce), &timestamp_ms) in &self.seen {
            assert!(self.by_time.contains(&(timestamp_ms, node_id, nonce)));
            assert!(timestamp_ms >= self.forgotten_before_ms, "an expired entry was kept");
            *entries_per_node.entry(node_id).or_insert(0) += 1;
        }
        assert_eq!(entries_per_node, self.entries_per_node);
        assert!(
            entries_per_node
                .values()
                .all(|&count| count <= self.entries_per_node_max)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW_MS: i64 = 30_000;
    const NOW_MS: i64 = 1_750_000_000_000;

    fn nonce(n: u8) -> String {
        format!("{n:02x}{}", "0".repeat(30))
    }

    /// One request: (node, nonce number, request timestamp, coordinator time) and the verdict.
    type Step = (i64, u8, i64, i64, Result<(), TrustError>);

    /// Runs `steps` against a cache with these limits, checking each verdict and the indexes.
    fn check(entries_max: usize, entries_per_node_max: usize, steps: &[Step]) -> NonceCache {
        let mut cache = NonceCache::new(WINDOW_MS, entries_max, entries_per_node_max);
        for (index, (node_id, n, timestamp_ms, now_ms, expect)) in steps.iter().cloned().enumerate() {
            let verdict = cache.check_and_remember(node_id, &nonce(n), timestamp_ms, now_ms);
            assert_eq!(verdict, expect, "step {index}");
            cache.consistency_check();
        }
        cache
    }

    #[test]
    fn a_nonce_is_accepted_once_per_node() {
        check(
            10,
            10,
            &[
                (1, 1, NOW_MS, NOW_MS, Ok(())),
                (1, 1, NOW_MS, NOW_MS + 5, Err(TrustError::Replayed)),
                // The same nonce with another timestamp is still a reuse.
                (1, 1, NOW_MS + 1, NOW_MS + 5, Err(TrustError::Replayed)),
                (2, 1, NOW_MS, NOW_MS + 5, Ok(())),
                (1, 2, NOW_MS, NOW_MS + 5, Ok(())),
            ],
        );
    }

    #[test]
    fn expired_nonces_are_forgotten_and_their_requests_are_stale() {
        let cache = check(
            10,
            10,
            &[
                (1, 1, NOW_MS, NOW_MS, Ok(())),
                (1, 2, NOW_MS + 10_000, NOW_MS + 10_000, Ok(())),
                // At the window's edge the first entry is still remembered.
                (1, 1, NOW_MS, NOW_MS + WINDOW_MS, Err(TrustError::Replayed)),
                // One ms later it is forgotten, and its request is refused as stale instead.
                (
                    1,
                    1,
                    NOW_MS,
                    NOW_MS + WINDOW_MS + 1,
                    Err(TrustError::Stale {
                        skew_ms: -WINDOW_MS - 1,
                    }),
                ),
                // A fresh request may use the forgotten nonce again.
                (1, 1, NOW_MS + WINDOW_MS + 1, NOW_MS + WINDOW_MS + 1, Ok(())),
            ],
        );
        assert_eq!(cache.len(), 2);
    }

    #[test]
    fn timestamps_outside_the_window_are_refused() {
        check(
            10,
            10,
            &[
                (
                    1,
                    1,
                    NOW_MS + WINDOW_MS + 1,
                    NOW_MS,
                    Err(TrustError::Stale { skew_ms: WINDOW_MS + 1 }),
                ),
                (1, 1, i64::MIN, NOW_MS, Err(TrustError::Stale { skew_ms: i64::MIN })),
                (1, 1, NOW_MS + WINDOW_MS, NOW_MS, Ok(())),
            ],
        );
    }

    #[test]
    fn a_clock_step_back_does_not_revive_forgotten_nonces() {
        let later_ms = NOW_MS + 100_000;
        check(
            10,
            10,
            &[
                (1, 1, NOW_MS, NOW_MS, Ok(())),
                (1, 2, later_ms, later_ms, Ok(())),
                // The coordinator's clock steps back to where the first request is fresh again,
                // but its nonce was forgotten, so it must not be accepted.
                (1, 1, NOW_MS, NOW_MS + 1, Err(TrustError::Stale { skew_ms: -1 })),
            ],
        );
    }

    #[test]
    fn a_full_cache_refuses_new_nonces_until_old_ones_expire() {
        check(
            3,
            3,
            &[
                (1, 1, NOW_MS, NOW_MS, Ok(())),
                (2, 2, NOW_MS, NOW_MS, Ok(())),
                (3, 3, NOW_MS + 1_000, NOW_MS, Ok(())),
                (4, 4, NOW_MS, NOW_MS, Err(TrustError::NonceCacheFull)),
                // Replays are still recognised as such.
                (1, 1, NOW_MS, NOW_MS, Err(TrustError::Replayed)),
                // Two entries expire; room again.
                (4, 4, NOW_MS + WINDOW_MS + 1, NOW_MS + WINDOW_MS + 1, Ok(())),
                (5, 5, NOW_MS + WINDOW_MS + 1, NOW_MS + WINDOW_MS + 1, Ok(())),
                (
                    6,
                    6,
                    NOW_MS + WINDOW_MS + 1,
                    NOW_MS + WINDOW_MS + 1,
                    Err(TrustError::NonceCacheFull),
                ),
            ],
        );
    }

    #[test]
    fn one_node_cannot_fill_the_whole_cache() {
        check(
            10,
            2,
            &[
                (1, 1, NOW_MS, NOW_MS, Ok(())),
                (1, 2, NOW_MS, NOW_MS, Ok(())),
                (1, 3, NOW_MS, NOW_MS, Err(TrustError::NonceCacheFull)),
                (2, 3, NOW_MS, NOW_MS, Ok(())),
            ],
        );
    }

    #[test]
    fn malformed_nonces_are_bad_headers() {
        let mut cache = NonceCache::default();
        let verdict = cache.check_and_remember(1, "not-a-nonce", NOW_MS, NOW_MS);
        assert!(
            matches!(
                verdict,
                Err(TrustError::BadHeader {
                    name: crate::HEADER_NONCE,
                    ..
                })
            ),
            "{verdict:?}"
        );
        assert!(cache.is_empty());
    }

    proptest::proptest! {
        /// Whatever the order of requests and however the clock moves, one signed request
        /// (node, nonce, timestamp) is accepted at most once, and the limits hold.
        #[test]
        fn a_request_is_never_accepted_twice(
            steps in proptest::collection::vec((0i64..3, 0u8..6, 0i64..100_000, 0i64..100_000), 1..200),
        ) {
            let mut cache = NonceCache::new(WINDOW_MS, 8, 4);
            let mut accepted = BTreeSet::new();
            for (node_id, n, timestamp_ms, now_ms) in steps {
                if cache.check_and_remember(node_id, &nonce(n), timestamp_ms, now_ms).is_ok() {
                    proptest::prop_assert!(accepted.insert((node_id, n, timestamp_ms)), "accepted twice");
                }
                cache.consistency_check();
            }
        }
    }
}
