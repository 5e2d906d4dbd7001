//! Clearing a GPU's memory before the next tenant's replica gets it: what to do when a replica
//! ends (`plan`, pure) and doing it (`clear`). On real GPUs that no other replica still holds,
//! the agent writes zeros over all of each GPU's free memory from a fresh CUDA context (the
//! driver loaded at run time through cudarc, as the matmul canary loads it), and where the CUDA
//! driver cannot be loaded it asks for a reset instead (`nvidia-smi --gpu-reset`, which needs
//! root and refuses while any process uses the GPU). Simulated GPUs have nothing to clear, and a
//! GPU shared with a replica still running (fractional leases) is left as it is, and said so:
//! zeroing its free memory would leave the other replica's and take memory from under it. Not
//! verified on a real GPU (none was available when this was written): see docs/decisions.md,
//! "No trace left behind".

use std::time::Duration;

/// How long one GPU's reset may take.
const RESET_TIMEOUT: Duration = Duration::from_secs(60);

/// The largest allocation zeroed at once; smaller ones follow until the GPU has no more to give.
const ZERO_CHUNK: usize = 1 << 30;

/// Below this the remaining free memory is left: the driver keeps a little for itself, and
/// chasing it byte by byte would never end.
const ZERO_FLOOR: usize = 1 << 20;

/// What to do with the GPUs of a replica that ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GpuClearing {
    /// Nothing: the GPUs are simulated, or the replica had none.
    Nothing,
    /// Clear `clear`; leave `shared`, which other replicas still hold, as they are.
    Clear { clear: Vec<u8>, shared: Vec<u8> },
}

/// What to clear of `ended` (the GPUs of a replica that ended), given the GPUs that other
/// replicas of this node still hold (`held`). Sorted and without repeats.
pub fn plan(simulated: bool, ended: &[u8], held: &[u8]) -> GpuClearing {
    if simulated || ended.is_empty() {
        return GpuClearing::Nothing;
    }
    let mut gpus = ended.to_vec();
    gpus.sort_unstable();
    gpus.dedup();
    let (shared, clear): (Vec<u8>, Vec<u8>) = gpus.into_iter().partition(|gpu| held.contains(gpu));
    GpuClearing::Clear { clear, shared }
}

/// Does what `plan` decided, one GPU at a time; failures are logged (the GPU is not withheld
/// from the market for them: a node whose GPUs cannot be cleared would otherwise sell none).
pub async fn clear(clearing: &GpuClearing) {
    let GpuClearing::Clear { clear, shared } = clearing else {
        return;
    };
    if !shared.is_empty() {
        tracing::warn!(
            gpus = ?shared,
            "not clearing the memory of GPUs another replica still uses"
        );
    }
    for &gpu in clear {
        match tokio::task::spawn_blocking(move || zero_free_memory(gpu)).await {
            Ok(Ok(zeroed)) => tracing::info!(
                gpu,
                zeroed_mib = zeroed.bytes >> 20,
                free_mib = zeroed.free_before >> 20,
                total_mib = zeroed.total >> 20,
                elapsed_ms = zeroed.elapsed.as_millis() as u64,
                "zeroed the GPU's free memory before the next replica"
            ),
            Ok(Err(ZeroError::NoDriver)) => reset(gpu).await,
            Ok(Err(ZeroError::Cuda(message))) => {
                tracing::warn!(gpu, error = %message, "could not zero the GPU's memory; trying a reset");
                reset(gpu).await;
            }
            Err(error) => tracing::warn!(gpu, %error, "the GPU's clearing stopped"),
        }
    }
}

/// What zeroing one GPU did.
#[derive(Clone, Copy, Debug)]
pub struct Zeroed {
    /// Bytes written with zeros.
    pub bytes: usize,
    /// Free and total device memory before, as the driver said.
    pub free_before: usize,
    pub total: usize,
    pub elapsed: Duration,
}

/// Why a GPU's memory could not be zeroed.
#[derive(Debug)]
pub enum ZeroError {
    /// The CUDA driver library is not on this host.
    NoDriver,
    Cuda(String),
}

/// Writes zeros over all the free memory of GPU `gpu` (its CUDA ordinal): from a fresh context,
/// allocations of at most `ZERO_CHUNK` zeroed and held until the device has no more (down to
/// `ZERO_FLOOR`), then a synchronise and every allocation given back. What the ended replica
/// held is free once its processes are gone, so it is among what is written.
pub fn zero_free_memory(gpu: u8) -> Result<Zeroed, ZeroError> {
    use cudarc::driver::{CudaContext, sys as driver};

    // SAFETY: only tries to dlopen the driver by its usual names.
    if !unsafe { driver::is_culib_present() } {
        return Err(ZeroError::NoDriver);
    }
    let started = std::time::Instant::now();
    let cuda = |what: &str, error: cudarc::driver::DriverError| ZeroError::Cuda(format!("{what}: {error}"));
    let context = CudaContext::new(usize::from(gpu)).map_err(|error| cuda("opening the device", error))?;
    let (free_before, total) =
        cudarc::driver::result::mem_get_info().map_err(|error| cuda("its free memory", error))?;
    let stream = context.default_stream();
    let mut held = Vec::new();
    let mut bytes = 0usize;
    let mut chunk = ZERO_CHUNK.min(free_before.max(ZERO_FLOOR));
    while chunk >= ZERO_FLOOR {
        match stream.alloc_zeros::<u8>(chunk) {
            Ok(zeros) => {
                bytes += chunk;
                held.push(zeros);
            }
            Err(_) => chunk /= 2,
        }
    }
    stream.synchronize().map_err(|error| cuda("zeroing", error))?;
    drop(held);
    Ok(Zeroed {
        bytes,
        free_before,
        total,
        elapsed: started.elapsed(),
    })
}

/// Asks the driver to reset GPU `gpu`, for hosts where CUDA could not be loaded.
async fn reset(gpu: u8) {
    let run = tokio::process::Command::new("nvidia-smi")
        .args(["--gpu-reset", "-i", &gpu.to_string()])
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    match tokio::time::timeout(RESET_TIMEOUT, run).await {
        Ok(Ok(output)) if output.status.success() => {
            tracing::info!(gpu, "reset the GPU, clearing its memory before the next replica");
        }
        Ok(Ok(output)) => tracing::warn!(
            gpu,
            said = %String::from_utf8_lossy(&output.stdout).trim(),
            error = %String::from_utf8_lossy(&output.stderr).trim(),
            "could not reset the GPU; its memory is left to the driver"
        ),
        Ok(Err(error)) => tracing::warn!(gpu, %error, "could not run nvidia-smi to reset the GPU"),
        Err(_) => tracing::warn!(gpu, "nvidia-smi --gpu-reset did not answer in time"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_gpus_nobody_else_holds_are_cleared_and_shared_or_simulated_ones_are_not() {
        assert_eq!(plan(true, &[0, 1], &[]), GpuClearing::Nothing, "simulated");
        assert_eq!(plan(false, &[], &[0]), GpuClearing::Nothing, "no GPUs");
        assert_eq!(
            plan(false, &[3, 1, 3], &[]),
            GpuClearing::Clear {
                clear: vec![1, 3],
                shared: vec![]
            }
        );
        assert_eq!(
            plan(false, &[0, 1, 2], &[2, 5, 0]),
            GpuClearing::Clear {
                clear: vec![1],
                shared: vec![0, 2]
            },
            "a GPU another replica still uses is not cleared under it"
        );
    }

    #[test]
    fn zeroing_says_when_there_is_no_driver_and_writes_most_free_memory_where_there_is() {
        match zero_free_memory(0) {
            // This crate's tests run on machines without a GPU: then the agent falls back to a
            // reset, which reports its own failure.
            Err(ZeroError::NoDriver) => assert!(!unsafe { cudarc::driver::sys::is_culib_present() }),
            Err(ZeroError::Cuda(message)) => assert!(!message.is_empty()),
            Ok(zeroed) => {
                assert!(zeroed.total >= zeroed.free_before, "{zeroed:?}");
                assert!(
                    zeroed.bytes >= zeroed.free_before / 10 * 9,
                    "zeroed less than nine tenths of the free memory: {zeroed:?}"
                );
            }
        }
    }
}
