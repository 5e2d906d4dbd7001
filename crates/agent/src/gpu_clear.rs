//! Clearing a GPU's memory before the next tenant's replica gets it: what to do when a replica
//! ends (`plan`, pure) and doing it (`clear`). On real GPUs that no other replica still holds,
//! the agent resets them (`nvidia-smi --gpu-reset`, which refuses while any process uses the
//! GPU); simulated GPUs have nothing to clear, and a GPU shared with a replica still running
//! (fractional leases) cannot be reset without killing that replica, so it is left as it is and
//! said so. Not verified on a real GPU (none was available when this was written): see
//! docs/decisions.md, "No trace left behind", for what is assumed and what remains to do
//! (zeroing free memory through CUDA).

use std::time::Duration;

/// How long one GPU's reset may take.
const RESET_TIMEOUT: Duration = Duration::from_secs(60);

/// What to do with the GPUs of a replica that ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GpuClearing {
    /// Nothing: the GPUs are simulated, or the replica had none.
    Nothing,
    /// Reset `reset`; leave `shared`, which other replicas still hold, as they are.
    Reset { reset: Vec<u8>, shared: Vec<u8> },
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
    let (shared, reset): (Vec<u8>, Vec<u8>) = gpus.into_iter().partition(|gpu| held.contains(gpu));
    GpuClearing::Reset { reset, shared }
}

/// Does what `plan` decided, one GPU at a time; failures are logged (the GPU is not withheld
/// from the market for them: a node whose GPUs cannot be reset would otherwise sell none).
pub async fn clear(clearing: &GpuClearing) {
    let GpuClearing::Reset { reset, shared } = clearing else {
        return;
    };
    if !shared.is_empty() {
        tracing::warn!(
            gpus = ?shared,
            "not clearing the memory of GPUs another replica still uses"
        );
    }
    for gpu in reset {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_gpus_nobody_else_holds_are_reset_and_shared_or_simulated_ones_are_not() {
        assert_eq!(plan(true, &[0, 1], &[]), GpuClearing::Nothing, "simulated");
        assert_eq!(plan(false, &[], &[0]), GpuClearing::Nothing, "no GPUs");
        assert_eq!(
            plan(false, &[3, 1, 3], &[]),
            GpuClearing::Reset {
                reset: vec![1, 3],
                shared: vec![]
            }
        );
        assert_eq!(
            plan(false, &[0, 1, 2], &[2, 5, 0]),
            GpuClearing::Reset {
                reset: vec![1],
                shared: vec![0, 2]
            },
            "a GPU another replica still uses is not reset under it"
        );
    }
}
