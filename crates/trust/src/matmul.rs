//! The matmul canary (`docs/trust-policy.md` § 3): a seeded matrix product a node computes on its
//! GPU, commits to with a Merkle root, and then proves row by row against a challenge the
//! coordinator draws only after the commitment arrived. The coordinator never needs the product
//! and never trusts the node's floating point.
//!
//! # Why the product is exact
//!
//! A and B are n×n with entries in {-2, …, 2} ([`ENTRY_MAX`]). Such small integers are exact in
//! bf16 (and in any float format), a product of two entries is an integer of magnitude at most 4,
//! and every partial sum of a row-by-column dot product, in whatever order it is summed, is an
//! integer of magnitude at most 4n. For n ≤ [`N_MAX`] that is at most 2^16, far below 2^24, and
//! every integer below 2^24 is exact in fp32: no addition ever rounds. So a GEMM with bf16 (or
//! fp32) inputs and fp32 accumulation gives every entry of C = A·B exactly, bit for bit, whatever
//! the summation order, blocking or tensor-core path. The check needs no tolerance: a node either
//! reports the true integers or it is wrong.
//!
//! # The protocol
//!
//! 1. The coordinator orders (seed, n). The node derives A and B from them ([`a_row`],
//!    [`b_matrix`]), computes C on its device and reports the Merkle root of C's rows
//!    ([`MerkleTree`]: each row as little-endian i32 bytes) with the time the product took, in
//!    its signed result.
//! 2. Once the result is in, the coordinator draws a challenge seed from its own random source.
//!    It gives [`CHALLENGE_ROWS`] row indexes ([`challenge_rows`], told to the node) and a vector
//!    r with entries in 0..2^16 ([`challenge_vector`], never told).
//! 3. The node answers with those rows of C and their Merkle paths ([`RowOpening`]).
//! 4. [`verify`]: each path leads to the committed root, and for each row i, C_i·r = A_i·(B·r)
//!    exactly in i64 (Freivalds' check per row; B·r costs n² once, each row n).
//!
//! A row that differs from A_i·B passes Freivalds' check with chance at most 2^-16 (a nonzero
//! difference d has d·r = 0 for at most one value of r's entry at a position where d is nonzero).
//! A node that computed only a fraction f of the rows correctly, and committed to guesses for the
//! rest, passes with chance about f^k for k challenged rows (the rows are drawn after the root is
//! fixed, so it cannot choose which rows are right).
//!
//! Pure code: no IO, no clock; randomness is the seeds passed in.

use rand_chacha::ChaCha20Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// Entries of A and B are in `-ENTRY_MAX..=ENTRY_MAX`.
pub const ENTRY_MAX: i8 = 2;
/// The smallest n an order may ask for (a power of two).
pub const N_MIN: u64 = 64;
/// The largest n an order may ask for (a power of two): 4·n = 2^16 < 2^24 keeps every fp32 partial
/// sum exact; C is then 1 GiB of fp32.
pub const N_MAX: u64 = 16_384;
// The bound the exactness argument rests on, checked when this compiles: every partial sum at
// the largest n stays below 2^24.
const _: () = assert!(4 * N_MAX < 1 << 24, "fp32 holds every partial sum exactly");
/// The n the coordinator orders: a 4096×4096 product (2·4096³ ≈ 137 GFLOP), large enough for
/// cuBLAS to run near its peak, small enough to prove cheaply (C is 64 MiB on the node).
pub const N_DEFAULT: u64 = 4_096;
/// The rows the coordinator challenges (§ 3): a node that computed a fraction f of the rows
/// passes with chance about f^16 (under 3 % for f = 0.8).
pub const CHALLENGE_ROWS: usize = 16;
/// The entries of the secret challenge vector are in `0..CHALLENGE_VECTOR_BOUND`.
pub const CHALLENGE_VECTOR_BOUND: u32 = 1 << 16;
/// Bytes of a challenge seed.
pub const CHALLENGE_SEED_BYTES: usize = 32;

/// Why a proof or an order is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MatmulError {
    /// The order's n is not a power of two in [`N_MIN`]..=[`N_MAX`].
    #[error("n must be a power of two from {N_MIN} to {N_MAX}, not {0}")]
    BadSize(u64),
    /// The proof's shape is wrong (rows, lengths, paths, hex): it proves nothing either way.
    #[error("malformed proof: {0}")]
    Malformed(String),
    /// A revealed row is not in the committed tree.
    #[error("row {0} does not lead to the committed root")]
    NotCommitted(u32),
    /// A revealed row is not that row of A·B.
    #[error("row {0} is not that row of A·B (Freivalds' check failed)")]
    WrongRow(u32),
}

/// Checks an order's n: a power of two in [`N_MIN`]..=[`N_MAX`].
pub fn check_n(n: u64) -> Result<usize, MatmulError> {
    if (N_MIN..=N_MAX).contains(&n) && n.is_power_of_two() {
        Ok(n as usize)
    } else {
        Err(MatmulError::BadSize(n))
    }
}

/// The seed of one GPU's operands in a multi-GPU order: every GPU multiplies matrices of its own,
/// so no GPU's product can stand in for another's.
pub fn gpu_seed(seed: &str, gpu: u8) -> String {
    format!("{seed}/gpu{gpu}")
}

/// One GPU's challenge seed, from the order's challenge.
pub fn gpu_challenge(challenge: &[u8; CHALLENGE_SEED_BYTES], gpu: u8) -> [u8; CHALLENGE_SEED_BYTES] {
    let mut hasher = blake3::Hasher::new();
    hasher.update(b"fallow-matmul-challenge-v1\n");
    hasher.update(challenge);
    hasher.update(&[gpu]);
    *hasher.finalize().as_bytes()
}

/// The key every row's generator starts from: blake3 of the seed and n.
fn operand_key(seed: &str, n: usize) -> [u8; 32] {
    let mut hasher = blake3::Hasher::new();
    hasher.update(b"fallow-matmul-v1\n");
    hasher.update(seed.as_bytes());
    hasher.update(b"\n");
    hasher.update(&(n as u64).to_le_bytes());
    *hasher.finalize().as_bytes()
}

/// One row of one operand (`matrix` 0 for A, 1 for B): ChaCha20 keyed by [`operand_key`] on a
/// stream of its own, so the coordinator can make any row of A without the rest. Each byte
/// below 250 gives one entry (`byte % 5 - 2`, uniform); the others are skipped.
fn operand_row(key: &[u8; 32], matrix: u64, row: usize, n: usize, out: &mut [i8]) {
    let mut rng = ChaCha20Rng::from_seed(*key);
    rng.set_stream((matrix << 32) | row as u64);
    let mut filled = 0;
    while filled < n {
        for byte in rng.next_u64().to_le_bytes() {
            if byte < 250 && filled < n {
                out[filled] = (byte % 5) as i8 - ENTRY_MAX;
                filled += 1;
            }
        }
    }
}

/// Row `row` of A for (seed, n).
pub fn a_row(seed: &str, n: usize, row: usize) -> Vec<i8> {
    let mut out = vec![0; n];
    operand_row(&operand_key(seed, n), 0, row, n, &mut out);
    out
}

/// A for (seed, n), row-major.
pub fn a_matrix(seed: &str, n: usize) -> Vec<i8> {
    matrix(seed, n, 0)
}

/// B for (seed, n), row-major.
pub fn b_matrix(seed: &str, n: usize) -> Vec<i8> {
    matrix(seed, n, 1)
}

fn matrix(seed: &str, n: usize, which: u64) -> Vec<i8> {
    let key = operand_key(seed, n);
    let mut out = vec![0; n * n];
    for (row, chunk) in out.chunks_exact_mut(n).enumerate() {
        operand_row(&key, which, row, n, chunk);
    }
    out
}

/// C = A·B on the CPU in i32 (row-major): the reference the device's product must equal, for the
/// sizes a test or a CPU-only node can afford (n³ multiply-adds).
pub fn cpu_product(a: &[i8], b: &[i8], n: usize) -> Vec<i32> {
    let mut c = vec![0i32; n * n];
    for (a_row, c_row) in a.chunks_exact(n).zip(c.chunks_exact_mut(n)) {
        for (a_value, b_row) in a_row.iter().zip(b.chunks_exact(n)) {
            let a_value = i32::from(*a_value);
            if a_value == 0 {
                continue;
            }
            for (c_value, b_value) in c_row.iter_mut().zip(b_row) {
                *c_value += a_value * i32::from(*b_value);
            }
        }
    }
    c
}

/// A row of C as the device returns it (fp32) in the commitment's integers; `None` when an entry
/// is not an integer in range, which no correct product has.
pub fn row_from_f32(row: &[f32]) -> Option<Vec<i32>> {
    let bound = 4.0 * N_MAX as f32;
    row.iter()
        .map(|value| (value.fract() == 0.0 && value.abs() <= bound).then_some(*value as i32))
        .collect()
}

/// A Merkle leaf: blake3 of 0x00 and the row's entries as little-endian i32.
pub fn leaf(row: &[i32]) -> [u8; 32] {
    let mut hasher = blake3::Hasher::new();
    hasher.update(&[0]);
    for value in row {
        hasher.update(&value.to_le_bytes());
    }
    *hasher.finalize().as_bytes()
}

/// An inner node: blake3 of 0x01, the left child and the right one.
fn parent(left: &[u8; 32], right: &[u8; 32]) -> [u8; 32] {
    let mut hasher = blake3::Hasher::new();
    hasher.update(&[1]);
    hasher.update(left);
    hasher.update(right);
    *hasher.finalize().as_bytes()
}

/// The Merkle tree over C's rows (n a power of two, so every level halves evenly).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MerkleTree {
    /// Level 0 is the leaves; the last level is the root alone.
    levels: Vec<Vec<[u8; 32]>>,
}

impl MerkleTree {
    /// The tree over `leaves` (a power of two of them, at least one).
    pub fn from_leaves(leaves: Vec<[u8; 32]>) -> Result<MerkleTree, MatmulError> {
        if leaves.is_empty() || !leaves.len().is_power_of_two() {
            return Err(MatmulError::Malformed(format!(
                "a tree needs a power of two of rows, not {}",
                leaves.len()
            )));
        }
        let mut levels = vec![leaves];
        while levels.last().expect("at least the leaves").len() > 1 {
            let below = levels.last().expect("at least the leaves");
            let above = below.chunks_exact(2).map(|pair| parent(&pair[0], &pair[1])).collect();
            levels.push(above);
        }
        Ok(MerkleTree { levels })
    }

    /// The tree over the rows of a row-major n×n C.
    pub fn of_product(c: &[i32], n: usize) -> Result<MerkleTree, MatmulError> {
        MerkleTree::from_leaves(c.chunks_exact(n.max(1)).map(leaf).collect())
    }

    pub fn root(&self) -> [u8; 32] {
        self.levels.last().expect("at least the leaves")[0]
    }

    pub fn root_hex(&self) -> String {
        hex::encode(self.root())
    }

    /// The siblings from leaf `index` up to the root, as hex; `None` past the last leaf.
    pub fn path(&self, index: usize) -> Option<Vec<String>> {
        if index >= self.levels[0].len() {
            return None;
        }
        let mut at = index;
        let mut path = Vec::with_capacity(self.levels.len() - 1);
        for level in &self.levels[..self.levels.len() - 1] {
            path.push(hex::encode(level[at ^ 1]));
            at /= 2;
        }
        Some(path)
    }
}

/// The root a leaf's path leads to.
fn root_from_path(leaf: [u8; 32], index: usize, path: &[[u8; 32]]) -> [u8; 32] {
    let mut value = leaf;
    let mut at = index;
    for sibling in path {
        value = if at.is_multiple_of(2) {
            parent(&value, sibling)
        } else {
            parent(sibling, &value)
        };
        at /= 2;
    }
    value
}

/// One revealed row of C with its Merkle path (siblings from the leaf up, hex).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RowOpening {
    pub index: u32,
    pub row: Vec<i32>,
    pub path: Vec<String>,
}

/// The openings of `indexes` from a product and its tree.
pub fn open_rows(c: &[i32], n: usize, tree: &MerkleTree, indexes: &[u32]) -> Result<Vec<RowOpening>, MatmulError> {
    indexes
        .iter()
        .map(|index| {
            let at = *index as usize;
            let path = tree
                .path(at)
                .ok_or_else(|| MatmulError::Malformed(format!("row {index} is past the last row ({n})")))?;
            Ok(RowOpening {
                index: *index,
                row: c[at * n..(at + 1) * n].to_vec(),
                path,
            })
        })
        .collect()
}

/// A fresh challenge seed from the operating system's random source (the coordinator's, drawn
/// after the node's root arrived).
pub fn new_challenge_seed() -> [u8; CHALLENGE_SEED_BYTES] {
    let mut seed = [0u8; CHALLENGE_SEED_BYTES];
    getrandom::fill(&mut seed).expect("the operating system's random source is available");
    seed
}

fn challenge_rng(challenge: &[u8; CHALLENGE_SEED_BYTES], stream: u64) -> ChaCha20Rng {
    let mut rng = ChaCha20Rng::from_seed(*challenge);
    rng.set_stream(stream);
    rng
}

/// The rows a challenge asks for: `min(CHALLENGE_ROWS, n)` distinct indexes below n, ascending.
pub fn challenge_rows(challenge: &[u8; CHALLENGE_SEED_BYTES], n: usize) -> Vec<u32> {
    let mut rng = challenge_rng(challenge, 0);
    let wanted = CHALLENGE_ROWS.min(n);
    let mut rows = std::collections::BTreeSet::new();
    while rows.len() < wanted {
        // Uniform for the powers of two orders use; any n ends (every index can come).
        rows.insert((rng.next_u32() as usize % n) as u32);
    }
    rows.into_iter().collect()
}

/// The secret vector r of a challenge: n entries in `0..CHALLENGE_VECTOR_BOUND`.
pub fn challenge_vector(challenge: &[u8; CHALLENGE_SEED_BYTES], n: usize) -> Vec<i64> {
    let mut rng = challenge_rng(challenge, 1);
    (0..n)
        .map(|_| i64::from(rng.next_u32() % CHALLENGE_VECTOR_BOUND))
        .collect()
}

fn dot(row: impl IntoIterator<Item = i64>, r: &[i64]) -> i64 {
    // |entries| ≤ 4n and r < 2^16: each sum is below 4·N_MAX²·2^16 = 2^46, far from i64's edge.
    row.into_iter().zip(r).map(|(value, weight)| value * weight).sum()
}

/// Checks a node's openings against its committed root (hex) for the order (seed, n) and the
/// challenge: the rows asked for, in order, each in the tree and each equal to A_i·B by
/// Freivalds' check. Never panics on what the node sent.
pub fn verify(
    seed: &str,
    n: u64,
    root_hex: &str,
    challenge: &[u8; CHALLENGE_SEED_BYTES],
    openings: &[RowOpening],
) -> Result<(), MatmulError> {
    let n = check_n(n)?;
    let root = decode_hash(root_hex)
        .ok_or_else(|| MatmulError::Malformed(format!("root {root_hex:?} is not 32 bytes of hex")))?;
    let asked = challenge_rows(challenge, n);
    let given: Vec<u32> = openings.iter().map(|opening| opening.index).collect();
    if given != asked {
        return Err(MatmulError::Malformed(format!(
            "the rows asked for are {asked:?}, in that order; the proof has {given:?}"
        )));
    }
    let depth = n.trailing_zeros() as usize;
    for opening in openings {
        if opening.row.len() != n {
            return Err(MatmulError::Malformed(format!(
                "row {} has {} entries, not {n}",
                opening.index,
                opening.row.len()
            )));
        }
        if opening.path.len() != depth {
            return Err(MatmulError::Malformed(format!(
                "row {}'s path has {} hashes, not {depth}",
                opening.index,
                opening.path.len()
            )));
        }
        let path: Vec<[u8; 32]> = opening
            .path
            .iter()
            .map(|hash| decode_hash(hash))
            .collect::<Option<_>>()
            .ok_or_else(|| {
                MatmulError::Malformed(format!(
                    "row {}'s path has a hash that is not 32 bytes of hex",
                    opening.index
                ))
            })?;
        if root_from_path(leaf(&opening.row), opening.index as usize, &path) != root {
            return Err(MatmulError::NotCommitted(opening.index));
        }
    }
    let r = challenge_vector(challenge, n);
    let b = b_matrix(seed, n);
    let b_r: Vec<i64> = b
        .chunks_exact(n)
        .map(|b_row| dot(b_row.iter().map(|v| i64::from(*v)), &r))
        .collect();
    for opening in openings {
        let a = a_row(seed, n, opening.index as usize);
        let expected = dot(a.iter().map(|v| i64::from(*v)), &b_r);
        let given = dot(opening.row.iter().map(|v| i64::from(*v)), &r);
        if given != expected {
            return Err(MatmulError::WrongRow(opening.index));
        }
    }
    Ok(())
}

fn decode_hash(text: &str) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    hex::decode_to_slice(text, &mut out).ok()?;
    Some(out)
}

/// The floating-point operations of one n×n product (2n³).
pub fn flops(n: u64) -> u128 {
    2 * u128::from(n).pow(3)
}

/// The rate in thousandths of a TFLOPS (GFLOPS) from `repetitions` products of size n done in
/// `elapsed_us` microseconds.
pub fn rate_milli_tflops(n: u64, repetitions: u64, elapsed_us: u64) -> u64 {
    // flops / µs = MFLOPS; / 1000 = GFLOPS = thousandths of a TFLOPS.
    let rate = flops(n) * u128::from(repetitions) / u128::from(elapsed_us.max(1)) / 1000;
    u64::try_from(rate).unwrap_or(u64::MAX)
}

/// The rate (thousandths of a TFLOPS) a GPU of the claimed model's dense BF16 figure gives.
pub fn expected_rate_milli_tflops(dense_tflops: f64) -> u64 {
    (dense_tflops.max(0.0) * 1000.0).round() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEED: &str = "unit-test-seed";

    fn product(seed: &str, n: usize) -> Vec<i32> {
        cpu_product(&a_matrix(seed, n), &b_matrix(seed, n), n)
    }

    fn honest(n: usize, challenge: &[u8; 32]) -> (String, Vec<RowOpening>) {
        let c = product(SEED, n);
        let tree = MerkleTree::of_product(&c, n).unwrap();
        let openings = open_rows(&c, n, &tree, &challenge_rows(challenge, n)).unwrap();
        (tree.root_hex(), openings)
    }

    #[test]
    fn operands_are_seeded_small_and_row_addressable() {
        let a = a_matrix(SEED, 64);
        assert_eq!(a, a_matrix(SEED, 64), "deterministic");
        assert_ne!(a, a_matrix("another", 64));
        assert_ne!(a, b_matrix(SEED, 64), "A and B differ");
        assert!(a.iter().all(|v| (-ENTRY_MAX..=ENTRY_MAX).contains(v)));
        for value in -ENTRY_MAX..=ENTRY_MAX {
            assert!(a.contains(&value), "{value} occurs");
        }
        assert_eq!(a_row(SEED, 64, 17), a[17 * 64..18 * 64].to_vec());
    }

    #[test]
    fn the_product_is_exact_in_f32_whatever_the_summation_order() {
        let n = 256;
        let (a, b) = (a_matrix(SEED, n), b_matrix(SEED, n));
        let exact = cpu_product(&a, &b, n);
        let terms = |i: usize, j: usize| -> Vec<f32> {
            (0..n)
                .map(|k| f32::from(a[i * n + k]) * f32::from(b[k * n + j]))
                .collect()
        };
        fn pairwise(values: &[f32]) -> f32 {
            if values.len() == 1 {
                values[0]
            } else {
                let (left, right) = values.split_at(values.len() / 2);
                pairwise(left) + pairwise(right)
            }
        }
        for i in (0..n).step_by(7) {
            for j in (0..n).step_by(5) {
                let terms = terms(i, j);
                let forward: f32 = terms.iter().sum();
                let backward: f32 = terms.iter().rev().sum();
                // A tensor core's blocked order: sums of 16, then the blocks.
                let blocked: f32 = terms.chunks(16).map(|block| block.iter().sum::<f32>()).sum();
                let expected = exact[i * n + j] as f32;
                for sum in [forward, backward, blocked, pairwise(&terms)] {
                    assert_eq!(sum.to_bits(), expected.to_bits(), "({i}, {j})");
                }
            }
        }
        // And a float C comes back to the same integers.
        let floats: Vec<f32> = exact[..n].iter().map(|v| *v as f32).collect();
        assert_eq!(row_from_f32(&floats).unwrap(), exact[..n].to_vec());
        assert_eq!(row_from_f32(&[0.5]), None, "not an integer");
        assert_eq!(row_from_f32(&[f32::NAN]), None);
    }

    #[test]
    fn an_honest_proof_passes() {
        for (n, challenge) in [(64, [1u8; 32]), (128, [2u8; 32]), (256, [3u8; 32])] {
            let (root, openings) = honest(n, &challenge);
            assert_eq!(openings.len(), CHALLENGE_ROWS);
            assert_eq!(verify(SEED, n as u64, &root, &challenge, &openings), Ok(()));
        }
    }

    #[test]
    fn challenges_are_distinct_rows_and_secret_vectors() {
        let rows = challenge_rows(&[9; 32], 64);
        assert_eq!(rows.len(), CHALLENGE_ROWS);
        assert!(rows.windows(2).all(|pair| pair[0] < pair[1]), "distinct, ascending");
        assert!(rows.iter().all(|row| *row < 64));
        assert_ne!(rows, challenge_rows(&[10; 32], 64));
        assert_eq!(
            challenge_rows(&[9; 32], 3),
            [0, 1, 2],
            "fewer rows than asked: all of them"
        );
        assert!(challenge_rows(&[9; 32], 0).is_empty());
        let r = challenge_vector(&[9; 32], 64);
        assert!(r.iter().all(|v| (0..i64::from(CHALLENGE_VECTOR_BOUND)).contains(v)));
        assert_ne!(r, challenge_vector(&[10; 32], 64));
    }

    #[test]
    fn a_wrong_entry_in_a_challenged_row_is_caught() {
        let n = 64;
        let challenge = [4u8; 32];
        let mut c = product(SEED, n);
        let rows = challenge_rows(&challenge, n);
        let wrong = rows[3] as usize;
        c[wrong * n + 5] += 1;
        // The node commits to its wrong C: the paths are right, the row is not.
        let tree = MerkleTree::of_product(&c, n).unwrap();
        let openings = open_rows(&c, n, &tree, &rows).unwrap();
        assert_eq!(
            verify(SEED, n as u64, &tree.root_hex(), &challenge, &openings),
            Err(MatmulError::WrongRow(wrong as u32))
        );
    }

    #[test]
    fn rows_that_are_not_the_committed_ones_are_caught() {
        let n = 64;
        let challenge = [5u8; 32];
        let (root, mut openings) = honest(n, &challenge);
        // Committed to one C, revealing the right rows of another: a changed leaf.
        openings[0].row[0] += 1;
        let index = openings[0].index;
        assert_eq!(
            verify(SEED, n as u64, &root, &challenge, &openings),
            Err(MatmulError::NotCommitted(index))
        );
        // The honest rows against another root.
        let (_, openings) = honest(n, &challenge);
        let other_root = hex::encode([7u8; 32]);
        assert!(matches!(
            verify(SEED, n as u64, &other_root, &challenge, &openings),
            Err(MatmulError::NotCommitted(_))
        ));
        // Another seed's product, honestly committed, fails Freivalds' check.
        let c = product("another", n);
        let tree = MerkleTree::of_product(&c, n).unwrap();
        let openings = open_rows(&c, n, &tree, &challenge_rows(&challenge, n)).unwrap();
        assert!(matches!(
            verify(SEED, n as u64, &tree.root_hex(), &challenge, &openings),
            Err(MatmulError::WrongRow(_))
        ));
    }

    #[test]
    fn malformed_proofs_are_refused_without_panicking() {
        let n = 64;
        let challenge = [6u8; 32];
        let (root, openings) = honest(n, &challenge);
        let refused = |openings: Vec<RowOpening>, root: &str, n: u64| {
            let found = verify(SEED, n, root, &challenge, &openings);
            assert!(
                matches!(found, Err(MatmulError::Malformed(_)) | Err(MatmulError::BadSize(_))),
                "{found:?}"
            );
        };
        refused(openings[1..].to_vec(), &root, 64);
        let mut reordered = openings.clone();
        reordered.swap(0, 1);
        refused(reordered, &root, 64);
        let mut other_index = openings.clone();
        other_index[0].index = u32::MAX;
        refused(other_index, &root, 64);
        let mut short_path = openings.clone();
        short_path[2].path.pop();
        refused(short_path, &root, 64);
        let mut long_path = openings.clone();
        long_path[2].path.push(hex::encode([0u8; 32]));
        refused(long_path, &root, 64);
        let mut bad_hex = openings.clone();
        bad_hex[2].path[0] = "zz".into();
        refused(bad_hex, &root, 64);
        let mut short_row = openings.clone();
        short_row[4].row.pop();
        refused(short_row, &root, 64);
        refused(openings.clone(), "not hex", 64);
        refused(openings.clone(), &root, 100);
        refused(openings.clone(), &root, 0);
        refused(openings, &root, N_MAX * 2);
        assert!(
            open_rows(
                &product(SEED, n),
                n,
                &MerkleTree::of_product(&product(SEED, n), n).unwrap(),
                &[64]
            )
            .is_err()
        );
        assert!(MerkleTree::from_leaves(vec![[0; 32]; 3]).is_err());
        assert!(MerkleTree::from_leaves(Vec::new()).is_err());
    }

    #[test]
    fn sizes_and_rates() {
        assert_eq!(check_n(4096), Ok(4096));
        assert_eq!(check_n(N_MIN), Ok(64));
        assert_eq!(check_n(N_MAX), Ok(16_384));
        assert!(check_n(32).is_err() && check_n(1000).is_err() && check_n(N_MAX * 2).is_err());
        assert_eq!(flops(4096), 137_438_953_472);
        // 10 products of 4096 (1.37 PFLOP) in 2 ms: 687.2 TFLOPS; in 0.2 s: 6.9.
        assert_eq!(rate_milli_tflops(4096, 10, 2_000), 687_194);
        assert_eq!(rate_milli_tflops(4096, 10, 200_000), 6_871);
        assert_eq!(rate_milli_tflops(4096, 1, 0), 137_438_953, "no division by zero");
        assert_eq!(expected_rate_milli_tflops(989.4), 989_400);
    }
}
