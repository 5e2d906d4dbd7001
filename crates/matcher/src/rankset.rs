//! A set of ranks (dense `u32` positions in one node ordering) as a hierarchical bitmap:
//! insert, remove and "first member at or after i" in a handful of word operations, so the
//! matcher finds the cheapest node of a capacity level without scanning.

/// Sets a rank's bit in a word array laid out like a set's bottom level (a static filter).
pub(crate) fn set_bit(words: &mut [u64], rank: usize) {
    words[rank / 64] |= 1 << (rank % 64);
}

/// Whether a rank's bit is set in a word array laid out like a set's bottom level.
pub(crate) fn has_bit(words: &[u64], rank: usize) -> bool {
    words[rank / 64] >> (rank % 64) & 1 == 1
}

#[derive(Clone, Debug)]
pub struct RankSet {
    /// `levels[0]` holds one bit per rank; each higher level one bit per non-zero word below.
    levels: Vec<Vec<u64>>,
    len: usize,
}

impl RankSet {
    pub fn new(capacity: usize) -> RankSet {
        let mut levels = Vec::new();
        let mut words = capacity.div_ceil(64).max(1);
        loop {
            levels.push(vec![0u64; words]);
            if words <= 1 {
                break;
            }
            words = words.div_ceil(64);
        }
        RankSet { levels, len: 0 }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn contains(&self, rank: usize) -> bool {
        self.levels[0][rank / 64] & (1 << (rank % 64)) != 0
    }

    pub fn insert(&mut self, rank: usize) {
        let mut position = rank;
        for (depth, level) in self.levels.iter_mut().enumerate() {
            let word = &mut level[position / 64];
            let was_empty = *word == 0;
            let bit = 1u64 << (position % 64);
            if depth == 0 {
                if *word & bit != 0 {
                    return;
                }
                self.len += 1;
            }
            *word |= bit;
            if !was_empty {
                return;
            }
            position /= 64;
        }
    }

    pub fn remove(&mut self, rank: usize) {
        let mut position = rank;
        for (depth, level) in self.levels.iter_mut().enumerate() {
            let word = &mut level[position / 64];
            let bit = 1u64 << (position % 64);
            if depth == 0 {
                if *word & bit == 0 {
                    return;
                }
                self.len -= 1;
            }
            *word &= !bit;
            if *word != 0 {
                return;
            }
            position /= 64;
        }
    }

    /// The smallest member `>= from`, if any.
    pub fn next_at_or_after(&self, from: usize) -> Option<usize> {
        if self.len == 0 {
            return None;
        }
        self.next_in_level(0, from)
    }

    fn next_in_level(&self, depth: usize, from: usize) -> Option<usize> {
        let words = &self.levels[depth];
        let word_index = from / 64;
        if word_index >= words.len() {
            return None;
        }
        let bits = words[word_index] & (!0u64 << (from % 64));
        if bits != 0 {
            return Some(word_index * 64 + bits.trailing_zeros() as usize);
        }
        let next_word = if depth + 1 < self.levels.len() {
            self.next_in_level(depth + 1, word_index + 1)?
        } else {
            (word_index + 1..words.len()).find(|&index| words[index] != 0)?
        };
        Some(next_word * 64 + words[next_word].trailing_zeros() as usize)
    }

    /// The smallest member in `from..end` whose bit is also set in every mask (word arrays as
    /// long as the set's), if any: filters by word, without touching the members.
    pub fn next_masked(&self, from: usize, end: usize, masks: [&[u64]; 3]) -> Option<usize> {
        let words = &self.levels[0];
        let mut index = from / 64;
        if from >= end || index >= words.len() {
            return None;
        }
        let masked = |index: usize| words[index] & masks[0][index] & masks[1][index] & masks[2][index];
        let mut bits = masked(index) & (!0u64 << (from % 64));
        loop {
            if bits != 0 {
                let rank = index * 64 + bits.trailing_zeros() as usize;
                return (rank < end).then_some(rank);
            }
            index = if self.levels.len() > 1 {
                self.next_in_level(1, index + 1)?
            } else {
                (index + 1..words.len()).find(|&next| words[next] != 0)?
            };
            if index * 64 >= end {
                return None;
            }
            bits = masked(index);
        }
    }

    /// Members in `start..end`, in order.
    pub fn iter_range(&self, start: usize, end: usize) -> impl Iterator<Item = usize> + '_ {
        let mut cursor = start;
        std::iter::from_fn(move || {
            let rank = self.next_at_or_after(cursor).filter(|&rank| rank < end)?;
            cursor = rank + 1;
            Some(rank)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    proptest! {
        #[test]
        fn behaves_like_a_btreeset(ops in prop::collection::vec((any::<bool>(), 0usize..5000), 0..400), probes in prop::collection::vec(0usize..5100, 1..50)) {
            let mut set = RankSet::new(5000);
            let mut reference = BTreeSet::new();
            for (insert, rank) in ops {
                if insert { set.insert(rank); reference.insert(rank); } else { set.remove(rank); reference.remove(&rank); }
            }
            prop_assert_eq!(set.len(), reference.len());
            for probe in probes {
                prop_assert_eq!(set.next_at_or_after(probe), reference.range(probe..).next().copied());
            }
            let first_mask: Vec<u64> = (0..79u64).map(|word| word.wrapping_mul(0x9e37_79b9_7f4a_7c15)).collect();
            let second_mask: Vec<u64> = (0..79u64).map(|word| !(word.wrapping_mul(0xc2b2_ae3d_27d4_eb4f) >> 3)).collect();
            let third_mask: Vec<u64> = (0..79u64).map(|word| word.wrapping_mul(0x1656_67b1_9e37_79f9) | 0x0f0f).collect();
            let masked = |rank: usize| has_bit(&first_mask, rank) && has_bit(&second_mask, rank) && has_bit(&third_mask, rank);
            for probe in [0usize, 99, 100, 2500, 3999] {
                prop_assert_eq!(
                    set.next_masked(probe, 4000, [&first_mask, &second_mask, &third_mask]),
                    reference.range(probe..4000).copied().find(|rank| masked(*rank))
                );
            }
            prop_assert_eq!(set.iter_range(100, 4000).collect::<Vec<_>>(), reference.range(100..4000).copied().collect::<Vec<_>>());
        }
    }

    #[test]
    fn spans_three_levels() {
        let mut set = RankSet::new(300_000);
        set.insert(299_999);
        set.insert(5);
        assert_eq!(set.next_at_or_after(6), Some(299_999));
        set.remove(299_999);
        assert_eq!(set.next_at_or_after(6), None);
        assert_eq!(set.next_at_or_after(0), Some(5));
    }
}
