//! Seeded choices: a chooser of indices, for harnesses that end a random running job, and a
//! draw from a weighted table (the job streams here and the market simulator's demand).

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

#[derive(Clone, Debug)]
pub struct IndexPicker {
    rng: ChaCha8Rng,
}

impl IndexPicker {
    pub fn new(seed: u64) -> IndexPicker {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        // Apart from the fleet's stream (0) and the job stream's (1).
        rng.set_stream(2);
        IndexPicker { rng }
    }

    /// An index in `0..len`; `len` must not be 0.
    pub fn pick(&mut self, len: usize) -> usize {
        assert!(len > 0, "cannot pick from nothing");
        self.rng.random_range(0..len)
    }
}

/// A value drawn from `table` with probability proportional to its weight; the weights must not
/// all be 0. One draw of `rng` (`0..total`), so a seeded stream stays the same.
pub fn pick_weighted<T: Copy>(rng: &mut ChaCha8Rng, table: &[(T, u32)]) -> T {
    let total: u32 = table.iter().map(|(_, weight)| weight).sum();
    let mut draw = rng.random_range(0..total);
    for &(value, weight) in table {
        if draw < weight {
            return value;
        }
        draw -= weight;
    }
    unreachable!("the draw is below the total weight")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_picks() {
        let mut a = IndexPicker::new(3);
        let mut b = IndexPicker::new(3);
        let picks: Vec<usize> = (0..100).map(|_| a.pick(10)).collect();
        assert_eq!(picks, (0..100).map(|_| b.pick(10)).collect::<Vec<_>>());
        assert!(picks.iter().all(|&index| index < 10));
    }
}
