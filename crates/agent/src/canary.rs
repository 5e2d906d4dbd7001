//! The canary's run on this node (docs/trust-policy.md § 3): the known-answer computation of
//! `trust::canary` on every GPU of an order, timed, with what the run measured.
//!
//! This build has no GPU kernel. On a simulated device (`FALLOW_SIMULATED_GPU=MODEL`, set by the
//! agent from its simulated inventory) the run paces itself like that catalog model, so a node
//! that claims a faster model than it simulates is found slow, as a real one would be. Without a
//! simulated device the digest is computed on the CPU and no rate is measured (`rate_milli` 0,
//! `measured_on` "cpu"): the coordinator then checks only the answer.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// Names the catalog model of the simulated physical device a canary runs on.
pub const SIMULATED_GPU_ENV: &str = "FALLOW_SIMULATED_GPU";
/// The most GPUs one order may name (a node has at most 16).
pub const CANARY_GPUS_MAX: usize = 16;

/// One order's work: what `fallow canary run` is given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CanaryWork {
    pub seed: String,
    /// Units per GPU (`trust::canary::ROUNDS_PER_UNIT` hashes each).
    pub units: u64,
    /// The GPU indexes, in the order's order (the answer depends on it).
    pub gpus: Vec<u8>,
    /// Memory to allocate on each GPU.
    pub memory_mib: u64,
}

/// Where the run happens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CanaryDevice {
    /// No GPU kernel: the digest is computed on the CPU and no rate is measured.
    Cpu,
    /// A simulated device of this catalog model: the run paces itself like one.
    Simulated(String),
}

impl CanaryDevice {
    /// The device named by `FALLOW_SIMULATED_GPU`, or the CPU when it is unset or empty.
    pub fn from_env() -> CanaryDevice {
        match std::env::var(SIMULATED_GPU_ENV) {
            Ok(model) if !model.trim().is_empty() => CanaryDevice::Simulated(model.trim().to_string()),
            _ => CanaryDevice::Cpu,
        }
    }
}

/// What a run reports: the line `fallow canary run` prints, in this field order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CanaryOutput {
    /// `trust::canary::answer` of the order.
    pub digest: String,
    pub elapsed_ms: u64,
    /// Thousandths of a unit per second per GPU; 0 when none was measured.
    pub rate_milli: u64,
    pub memory_allocated: bool,
    /// `simulated:MODEL` or `cpu`.
    pub measured_on: String,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CanaryError {
    #[error("{SIMULATED_GPU_ENV}={0:?} is not a model of Fallow's GPU catalog (e.g. H100-SXM5, A100-SXM4-80GB)")]
    UnknownDevice(String),
    #[error("a canary needs at least one GPU")]
    NoGpus,
    #[error("a canary runs on at most {CANARY_GPUS_MAX} GPUs, not {0}")]
    TooManyGpus(usize),
    #[error("GPU {0} is named twice")]
    GpuTwice(u8),
    #[error("units must be 1 to {max}, not {0}", max = trust::canary::UNITS_MAX)]
    BadUnits(u64),
    #[error("the canary was stopped")]
    Stopped,
}

impl CanaryWork {
    /// The order's shape, checked before any work.
    pub fn check(&self) -> Result<(), CanaryError> {
        if self.gpus.is_empty() {
            return Err(CanaryError::NoGpus);
        }
        if self.gpus.len() > CANARY_GPUS_MAX {
            return Err(CanaryError::TooManyGpus(self.gpus.len()));
        }
        for (position, gpu) in self.gpus.iter().enumerate() {
            if self.gpus[..position].contains(gpu) {
                return Err(CanaryError::GpuTwice(*gpu));
            }
        }
        if !(1..=trust::canary::UNITS_MAX).contains(&self.units) {
            return Err(CanaryError::BadUnits(self.units));
        }
        Ok(())
    }
}

/// The simulated device's compute units and memory, from the catalog.
fn simulated_spec(model: &str) -> Result<(u32, u64), CanaryError> {
    let catalog = model::GpuCatalog::embedded();
    let found = catalog
        .find(model)
        .ok_or_else(|| CanaryError::UnknownDevice(model.to_string()))?;
    let spec = catalog.spec(found);
    Ok((spec.cu_milli, u64::from(spec.memory_mib)))
}

/// How often a paced run looks whether it was told to stop.
const STOP_CHECK_EVERY: Duration = Duration::from_millis(50);

/// Runs `work` on `device`: every GPU's chain on a thread of its own, each paced (on a simulated
/// device) to take as long as the device would, then the answer over the chains.
pub fn run_canary(work: &CanaryWork, device: &CanaryDevice) -> Result<CanaryOutput, CanaryError> {
    run_canary_until(work, device, &AtomicBool::new(false))
}

/// [`run_canary`], given up (`CanaryError::Stopped`) when `stop` turns true while it waits out
/// a simulated device's pace: a canary in this process gives way to a lease like a child would.
pub fn run_canary_until(
    work: &CanaryWork,
    device: &CanaryDevice,
    stop: &AtomicBool,
) -> Result<CanaryOutput, CanaryError> {
    work.check()?;
    let simulated = match device {
        CanaryDevice::Cpu => None,
        CanaryDevice::Simulated(model) => Some((model.as_str(), simulated_spec(model)?)),
    };
    // What one GPU's units take on the simulated device: units / (cu × reference rate).
    let paced = simulated.map(|(_, (cu_milli, _))| {
        let rate_milli = trust::canary::expected_rate_milli(cu_milli).max(1);
        Duration::from_micros(work.units.saturating_mul(1_000_000_000) / rate_milli)
    });
    let started = Instant::now();
    let chains: Vec<[u8; 32]> = std::thread::scope(|scope| {
        let threads: Vec<_> = work
            .gpus
            .iter()
            .map(|gpu| {
                scope.spawn(move || {
                    let chain = trust::canary::gpu_chain(&work.seed, *gpu, work.units);
                    if let Some(paced) = paced {
                        while !stop.load(Ordering::Relaxed) {
                            let left = paced.saturating_sub(started.elapsed());
                            if left.is_zero() {
                                break;
                            }
                            std::thread::sleep(left.min(STOP_CHECK_EVERY));
                        }
                    }
                    chain
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|thread| thread.join().expect("a canary thread only hashes and sleeps"))
            .collect()
    });
    if stop.load(Ordering::Relaxed) {
        return Err(CanaryError::Stopped);
    }
    let elapsed_ms = started.elapsed().as_millis() as u64;
    let digest = trust::canary::answer_from_chains(chains);
    Ok(match simulated {
        None => CanaryOutput {
            digest,
            elapsed_ms,
            rate_milli: 0,
            memory_allocated: true,
            measured_on: "cpu".to_string(),
        },
        Some((model, (_, device_memory_mib))) => CanaryOutput {
            digest,
            elapsed_ms,
            rate_milli: trust::canary::rate_milli(work.units, elapsed_ms),
            memory_allocated: device_memory_mib >= work.memory_mib,
            measured_on: format!("simulated:{model}"),
        },
    })
}

/// The result to sign for `order` from what its run reported.
pub fn result_of(order: &api::CanaryOrder, output: &CanaryOutput) -> trust::canary::CanaryResult {
    trust::canary::CanaryResult {
        canary_id: order.id,
        seed: order.seed.clone(),
        units: i64::try_from(order.units).unwrap_or(i64::MAX),
        digest: output.digest.clone(),
        elapsed_ms: i64::try_from(output.elapsed_ms).unwrap_or(i64::MAX),
        rate_milli: i64::try_from(output.rate_milli).unwrap_or(i64::MAX),
        memory_allocated: output.memory_allocated,
        measured_on: output.measured_on.clone(),
    }
}

/// The wire form of a signed result: the same field values as the body that was signed.
pub fn signed_wire(signed: trust::SignedRecord<trust::canary::CanaryResult>) -> api::SignedCanaryResult {
    let trust::SignedRecord { body, signature_hex } = signed;
    api::SignedCanaryResult {
        body: api::CanaryResultBody {
            canary_id: body.canary_id,
            seed: body.seed,
            units: body.units,
            digest: body.digest,
            elapsed_ms: body.elapsed_ms,
            rate_milli: body.rate_milli,
            memory_allocated: body.memory_allocated,
            measured_on: body.measured_on,
        },
        signature_hex,
    }
}

/// The tag `fallow canary image` gives the container variant by default.
pub fn default_image_tag() -> String {
    format!("fallow-canary:{}", env!("CARGO_PKG_VERSION"))
}

/// Builds the container variant of the canary locally (`crate::image`): `executable` at
/// `/fallow` with the libraries it links, `fallow canary run` as its entry point.
pub fn build_image(executable: &std::path::Path, tag: &str) -> Result<(), String> {
    crate::image::build_image(
        executable,
        &crate::image::ImageSpec {
            tag,
            entrypoint: &["/fallow", "canary", "run"],
            env: &[],
            host_files: &[],
            dirs: &[],
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const H100_RATE_MILLI: u64 = 100_000;

    fn work(units: u64, gpus: &[u8], memory_mib: u64) -> CanaryWork {
        CanaryWork {
            seed: "unit-test-seed".to_string(),
            units,
            gpus: gpus.to_vec(),
            memory_mib,
        }
    }

    fn simulated(model: &str) -> CanaryDevice {
        CanaryDevice::Simulated(model.to_string())
    }

    #[test]
    fn the_digest_is_the_known_answer() {
        let order = work(3, &[1, 0], 1024);
        let expected = trust::canary::answer("unit-test-seed", &[1, 0], 3);
        let on_cpu = run_canary(&order, &CanaryDevice::Cpu).unwrap();
        assert_eq!(on_cpu.digest, expected);
        assert_eq!(
            (on_cpu.rate_milli, on_cpu.memory_allocated, on_cpu.measured_on.as_str()),
            (0, true, "cpu"),
            "the CPU measures no rate"
        );
        let simulated_run = run_canary(&order, &simulated("H100-SXM5")).unwrap();
        assert_eq!(simulated_run.digest, expected);
        assert_eq!(simulated_run.measured_on, "simulated:H100-SXM5");
    }

    #[test]
    fn an_a100_is_slow_for_an_h100s_canary() {
        // 0.3 s of an H100's work on two GPUs: an A100 (315 cu_milli) takes 0.3 / 0.315 s.
        let units = trust::canary::units_for(1, 1000) * 3 / 10;
        let output = run_canary(&work(units, &[0, 1], 1024), &simulated("A100-SXM4-80GB")).unwrap();
        assert!((900..=1400).contains(&output.elapsed_ms), "about 952 ms: {output:?}");
        assert!(output.rate_milli < H100_RATE_MILLI * 60 / 100, "{output:?}");
        assert!(output.memory_allocated);
    }

    #[test]
    fn an_honest_h100_keeps_its_rate() {
        let units = trust::canary::units_for(1, 1000) * 3 / 10;
        let output = run_canary(&work(units, &[0], 1024), &simulated("H100-SXM5")).unwrap();
        assert!(output.rate_milli >= H100_RATE_MILLI * 90 / 100, "{output:?}");
        assert!(
            output.rate_milli <= H100_RATE_MILLI,
            "never faster than the device: {output:?}"
        );
    }

    #[test]
    fn an_h100_cannot_allocate_an_h200s_memory() {
        let h200_memory_mib = 141 * 1024;
        let output = run_canary(&work(1, &[0], h200_memory_mib * 9 / 10), &simulated("H100-SXM5")).unwrap();
        assert!(!output.memory_allocated, "80 GB cannot hold 90 % of 141 GB: {output:?}");
        let output = run_canary(&work(1, &[0], h200_memory_mib * 9 / 10), &simulated("H200-SXM")).unwrap();
        assert!(output.memory_allocated, "{output:?}");
    }

    #[test]
    fn bad_orders_and_unknown_devices_are_refused() {
        let check = |order: CanaryWork, device: CanaryDevice, expect: CanaryError| {
            assert_eq!(run_canary(&order, &device), Err(expect));
        };
        check(work(1, &[], 0), CanaryDevice::Cpu, CanaryError::NoGpus);
        check(work(0, &[0], 0), CanaryDevice::Cpu, CanaryError::BadUnits(0));
        check(
            work(trust::canary::UNITS_MAX + 1, &[0], 0),
            CanaryDevice::Cpu,
            CanaryError::BadUnits(trust::canary::UNITS_MAX + 1),
        );
        check(work(1, &[0, 2, 0], 0), CanaryDevice::Cpu, CanaryError::GpuTwice(0));
        check(
            work(1, &[0], 0),
            simulated("B300-IMAGINARY"),
            CanaryError::UnknownDevice("B300-IMAGINARY".into()),
        );
    }

    #[test]
    fn a_stopped_run_reports_nothing() {
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let stopper = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                stop.store(true, Ordering::Relaxed);
            })
        };
        let started = Instant::now();
        // Ten seconds of an H100's work.
        let run = run_canary_until(&work(1_000, &[0], 1), &simulated("H100-SXM5"), &stop);
        stopper.join().unwrap();
        assert_eq!(run, Err(CanaryError::Stopped));
        assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    }

    #[test]
    fn the_signed_wire_form_carries_the_signed_values() {
        let order = api::CanaryOrder {
            id: 7,
            kind: api::CanaryKind::Hash,
            seed: "s".into(),
            units: 2,
            gpus: vec![0],
            memory_mib: 10,
            deadline_ms: 0,
        };
        let output = run_canary(&work(2, &[0], 10), &CanaryDevice::Cpu).unwrap();
        let key = trust::NodeKey::generate();
        let signed = trust::sign_record(&key, 3, &result_of(&order, &output));
        let wire = signed_wire(signed.clone());
        assert_eq!(
            serde_json::to_value(&wire.body).unwrap(),
            serde_json::to_value(&signed.body).unwrap(),
            "the same fields, the same values, the same order"
        );
        assert!(trust::verify_record(&key.verifying_key(), 3, &signed).is_ok());
    }
}
