//! The canary (`docs/trust-policy.md` § 3): a known-answer benchmark the coordinator orders on a
//! node. Each GPU of the order computes a chain of blake3 hashes from the order's seed and its own
//! index; the answer is a digest over every GPU's chain end, which the coordinator recomputes.
//!
//! The work is counted in units of [`ROUNDS_PER_UNIT`] hashes. The rate a GPU must reach is the
//! reference rate ([`REFERENCE_UNITS_PER_SECOND`] for one compute unit, an H100 SXM) scaled by the
//! claimed model's compute units.

use serde::{Deserialize, Serialize};

use crate::RecordBody;

/// Hashes in one unit of canary work.
pub const ROUNDS_PER_UNIT: u64 = 100;
/// Units per second one GPU of one compute unit (an H100 SXM5) does.
pub const REFERENCE_UNITS_PER_SECOND: u64 = 100;
/// The most units one order may ask of a GPU (the coordinator recomputes every answer).
pub const UNITS_MAX: u64 = 100_000;

/// The end of one GPU's hash chain: blake3 of `seed`, its index, then `units × ROUNDS_PER_UNIT`
/// times blake3 of the previous value.
pub fn gpu_chain(seed: &str, gpu: u8, units: u64) -> [u8; 32] {
    let mut hasher = blake3::Hasher::new();
    hasher.update(b"fallow-canary-v1\n");
    hasher.update(seed.as_bytes());
    hasher.update(&[b'\n', gpu]);
    let mut value = *hasher.finalize().as_bytes();
    for _ in 0..units.min(UNITS_MAX) * ROUNDS_PER_UNIT {
        value = *blake3::hash(&value).as_bytes();
    }
    value
}

/// The answer to an order: blake3 over the chain ends of `gpus` in the order given, as hex.
pub fn answer(seed: &str, gpus: &[u8], units: u64) -> String {
    answer_from_chains(gpus.iter().map(|gpu| gpu_chain(seed, *gpu, units)))
}

/// The answer from chain ends already computed (one per GPU, in the order's GPU order).
pub fn answer_from_chains(chains: impl IntoIterator<Item = [u8; 32]>) -> String {
    let mut hasher = blake3::Hasher::new();
    for chain in chains {
        hasher.update(&chain);
    }
    hasher.finalize().to_hex().to_string()
}

/// The rate (thousandths of a unit per second, per GPU) a GPU of `cu_milli` compute units must
/// reach: the reference rate scaled by its compute units.
pub fn expected_rate_milli(cu_milli: u32) -> u64 {
    REFERENCE_UNITS_PER_SECOND * u64::from(cu_milli)
}

/// Units that take `seconds` on a GPU of `cu_milli` compute units at the expected rate (at least 1).
pub fn units_for(seconds: u64, cu_milli: u32) -> u64 {
    (expected_rate_milli(cu_milli) * seconds / 1000).clamp(1, UNITS_MAX)
}

/// A rate in thousandths of a unit per second from `units` done in `elapsed_ms` (per GPU).
pub fn rate_milli(units: u64, elapsed_ms: u64) -> u64 {
    units.saturating_mul(1_000_000) / elapsed_ms.max(1)
}

/// What a node reports for a canary order, signed by the node's key like a usage record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CanaryResult {
    pub canary_id: i64,
    pub seed: String,
    pub units: i64,
    /// The answer: [`answer`] of the order.
    pub digest: String,
    /// Wall time the run took on the node, in milliseconds.
    pub elapsed_ms: i64,
    /// The rate per GPU the run measured, in thousandths of a unit per second; 0 when it
    /// measured none.
    pub rate_milli: i64,
    /// Whether every GPU could allocate the memory the order asked for.
    pub memory_allocated: bool,
    /// What the run measured on: `simulated:MODEL` for a simulated device, `cpu` when the
    /// digest was computed without a GPU kernel (no rate is measured then).
    pub measured_on: String,
}

impl RecordBody for CanaryResult {
    const TYPE_NAME: &'static str = "canary";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answer_depends_on_seed_gpus_and_units() {
        let base = answer("seed-a", &[0, 1], 3);
        assert_eq!(base, answer("seed-a", &[0, 1], 3), "deterministic");
        assert_ne!(base, answer("seed-b", &[0, 1], 3));
        assert_ne!(base, answer("seed-a", &[1, 0], 3));
        assert_ne!(base, answer("seed-a", &[0, 1], 4));
        assert_ne!(base, answer("seed-a", &[0], 3));
        assert_eq!(base.len(), 64);
    }

    #[test]
    fn rates_scale_with_compute_units() {
        assert_eq!(expected_rate_milli(1000), 100_000);
        assert_eq!(units_for(3, 1000), 300);
        assert_eq!(units_for(3, 315), 94);
        assert_eq!(units_for(0, 1000), 1, "at least one unit");
        assert_eq!(rate_milli(300, 3_000), 100_000);
        assert_eq!(rate_milli(300, 0), 300_000_000, "no division by zero");
    }
}
