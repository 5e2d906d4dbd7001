//! The matmul canary's run on this node (docs/trust-policy.md § 3, `trust::matmul`): every GPU of
//! an order multiplies its seeded A and B (bf16 in, fp32 out, through cuBLAS), the product is
//! timed on the device, and its Merkle root is reported; the product is kept on disk until the
//! coordinator's challenge asks for some of its rows.
//!
//! The CUDA driver and cuBLAS are loaded at run time (`cudarc` with dynamic loading), so this
//! builds and runs on machines without CUDA: there [`run_matmul`] on [`MatmulDevice::Cuda`] says
//! why it cannot run, and the agent keeps to the hash canary. [`MatmulDevice::CpuReference`]
//! computes the same product and commitment on the CPU, for the sizes a CPU affords: tests use it
//! in the device's place, and it measures no rate.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use trust::matmul::{self, MatmulError, MerkleTree, RowOpening};

use crate::canary::CanaryOutput;

/// Products per GPU timed together: at an H100's pace a 4096² product takes about 0.2 ms, too
/// short to time alone; fifty take about 10 ms. One more runs first, untimed, to warm up.
pub const REPETITIONS: u64 = 50;
/// The largest n the CPU reference runs (n³ multiply-adds: about a second at 1024).
pub const CPU_REFERENCE_N_MAX: u64 = 1024;
/// What `measured_on` says for the CPU reference.
pub const CPU_REFERENCE: &str = "cpu-reference";

/// One matmul order's work: what `fallow canary run --kind matmul` is given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MatmulWork {
    pub seed: String,
    /// The product's size (n×n); a power of two, `trust::matmul::check_n`.
    pub n: u64,
    /// The GPU indexes, in the order's order (the digest lists their roots in it).
    pub gpus: Vec<u8>,
    /// Memory to allocate on each GPU before the product, in MiB (0: none).
    pub memory_mib: u64,
    /// Where each GPU's product is kept for the challenge ([`product_path`]); none: not kept.
    pub product_dir: Option<PathBuf>,
}

/// Where the product runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatmulDevice {
    /// The GPUs, through the CUDA driver and cuBLAS loaded at run time.
    Cuda,
    /// The CPU, for n up to [`CPU_REFERENCE_N_MAX`]; no rate is measured.
    CpuReference,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MatmulRunError {
    #[error(transparent)]
    Order(#[from] MatmulError),
    #[error("a canary needs at least one GPU")]
    NoGpus,
    #[error("GPU {0} is named twice")]
    GpuTwice(u8),
    #[error("a canary runs on at most {max} GPUs, not {0}", max = crate::canary::CANARY_GPUS_MAX)]
    TooManyGpus(usize),
    #[error("the CPU reference multiplies at most {CPU_REFERENCE_N_MAX}², not {0}²")]
    TooLargeForCpu(u64),
    /// libcuda (the NVIDIA driver) cannot be loaded: no GPU path on this machine.
    #[error("the CUDA driver (libcuda.so) cannot be loaded: no NVIDIA driver on this machine")]
    NoDriver,
    /// libcublas cannot be loaded.
    #[error("cuBLAS (libcublas.so) cannot be loaded: install the CUDA 12 runtime libraries or set LD_LIBRARY_PATH")]
    NoCublas,
    #[error("GPU {gpu}: {message}")]
    Cuda { gpu: u8, message: String },
    /// The device returned an entry that is not an integer: no correct product has one.
    #[error("GPU {0} returned a product that is not exact (a non-integer entry): the device is faulty")]
    Inexact(u8),
    #[error("{0}")]
    Io(String),
}

impl MatmulWork {
    /// The order's shape, checked before any work; n as a size.
    pub fn check(&self) -> Result<usize, MatmulRunError> {
        let n = matmul::check_n(self.n)?;
        if self.gpus.is_empty() {
            return Err(MatmulRunError::NoGpus);
        }
        if self.gpus.len() > crate::canary::CANARY_GPUS_MAX {
            return Err(MatmulRunError::TooManyGpus(self.gpus.len()));
        }
        for (position, gpu) in self.gpus.iter().enumerate() {
            if self.gpus[..position].contains(gpu) {
                return Err(MatmulRunError::GpuTwice(*gpu));
            }
        }
        Ok(n)
    }
}

/// The file a GPU's product is kept in: C's rows as little-endian i32, row after row.
pub fn product_path(dir: &Path, gpu: u8) -> PathBuf {
    dir.join(format!("matmul-gpu{gpu}.i32"))
}

/// Whether the GPU path can run here: the driver and cuBLAS load and the driver sees at least one
/// device; the number of devices. The agent offers the matmul canary only then, and keeps to the
/// hash canary otherwise.
pub fn probe_cuda() -> Result<usize, MatmulRunError> {
    cuda::check_libraries()?;
    let count = std::panic::catch_unwind(cudarc::driver::CudaContext::device_count)
        .map_err(|_| MatmulRunError::NoDriver)?
        .map_err(|error| MatmulRunError::Cuda {
            gpu: 0,
            message: format!("counting devices: {error}"),
        })?;
    match usize::try_from(count) {
        Ok(count) if count > 0 => Ok(count),
        _ => Err(MatmulRunError::Cuda {
            gpu: 0,
            message: "the driver sees no device".into(),
        }),
    }
}

/// What one GPU's run gave.
struct GpuRun {
    product: Vec<i32>,
    /// Time on the device for the timed products, in microseconds; none for the CPU reference.
    elapsed_us: Option<u64>,
    memory_allocated: bool,
    device_name: String,
}

/// Runs `work` on `device`: every GPU's product (on a thread of its own), each kept as the work
/// says, and what `fallow canary run` prints: the digest lists the GPUs' Merkle roots (hex,
/// comma-separated, in the order's GPU order); the rate is the slowest GPU's, in thousandths of
/// a TFLOPS; `elapsed_ms` the slowest GPU's time on the device.
pub fn run_matmul(work: &MatmulWork, device: MatmulDevice) -> Result<CanaryOutput, MatmulRunError> {
    let n = work.check()?;
    if device == MatmulDevice::CpuReference && work.n > CPU_REFERENCE_N_MAX {
        return Err(MatmulRunError::TooLargeForCpu(work.n));
    }
    if device == MatmulDevice::Cuda {
        cuda::check_libraries()?;
    }
    let runs: Vec<Result<GpuRun, MatmulRunError>> = std::thread::scope(|scope| {
        let threads: Vec<_> = work
            .gpus
            .iter()
            .map(|gpu| {
                scope.spawn(move || {
                    let seed = matmul::gpu_seed(&work.seed, *gpu);
                    match device {
                        MatmulDevice::CpuReference => Ok(GpuRun {
                            product: matmul::cpu_product(&matmul::a_matrix(&seed, n), &matmul::b_matrix(&seed, n), n),
                            elapsed_us: None,
                            memory_allocated: true,
                            device_name: CPU_REFERENCE.to_string(),
                        }),
                        MatmulDevice::Cuda => cuda::run(*gpu, &seed, n, work.memory_mib),
                    }
                })
            })
            .collect();
        threads
            .into_iter()
            .zip(&work.gpus)
            .map(|(thread, gpu)| {
                thread.join().unwrap_or_else(|_| {
                    Err(MatmulRunError::Cuda {
                        gpu: *gpu,
                        message: "the run panicked (a CUDA library without a symbol it needs?)".into(),
                    })
                })
            })
            .collect()
    });
    let mut roots = Vec::with_capacity(runs.len());
    let mut slowest: Option<u64> = None;
    let mut memory_allocated = true;
    let mut names = Vec::new();
    for (run, gpu) in runs.into_iter().zip(&work.gpus) {
        let run = run?;
        roots.push(MerkleTree::of_product(&run.product, n)?.root_hex());
        if let Some(elapsed_us) = run.elapsed_us {
            slowest = Some(slowest.map_or(elapsed_us, |slowest| slowest.max(elapsed_us)));
        }
        memory_allocated &= run.memory_allocated;
        if !names.contains(&run.device_name) {
            names.push(run.device_name);
        }
        if let Some(dir) = &work.product_dir {
            write_product(&product_path(dir, *gpu), &run.product)?;
        }
    }
    let measured_on = match device {
        MatmulDevice::CpuReference => CPU_REFERENCE.to_string(),
        MatmulDevice::Cuda => format!("cuda:{}", names.join("+")),
    };
    Ok(CanaryOutput {
        digest: roots.join(","),
        elapsed_ms: slowest.map_or(0, |us| us.div_ceil(1000)),
        rate_milli: slowest.map_or(0, |us| matmul::rate_milli_tflops(work.n, REPETITIONS, us)),
        memory_allocated,
        measured_on,
    })
}

fn write_product(path: &Path, product: &[i32]) -> Result<(), MatmulRunError> {
    let bytes: Vec<u8> = product.iter().flat_map(|value| value.to_le_bytes()).collect();
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|error| MatmulRunError::Io(format!("{}: {error}", parent.display())))?;
    }
    std::fs::write(path, bytes).map_err(|error| MatmulRunError::Io(format!("{}: {error}", path.display())))
}

/// A product kept by [`run_matmul`], read back (n×n).
pub fn read_product(path: &Path, n: u64) -> Result<Vec<i32>, MatmulRunError> {
    let n = matmul::check_n(n)?;
    let bytes = std::fs::read(path).map_err(|error| MatmulRunError::Io(format!("{}: {error}", path.display())))?;
    if bytes.len() != n * n * 4 {
        return Err(MatmulRunError::Io(format!(
            "{}: {} bytes, not the {} of a {n}² product",
            path.display(),
            bytes.len(),
            n * n * 4
        )));
    }
    Ok(bytes
        .chunks_exact(4)
        .map(|word| i32::from_le_bytes([word[0], word[1], word[2], word[3]]))
        .collect())
}

/// One GPU's answer to a challenge: the rows asked for, with their Merkle paths.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuOpenings {
    pub gpu: u8,
    pub rows: Vec<RowOpening>,
}

/// The rows `rows` of each kept product in `dir` (the order's `gpus`), with their paths.
pub fn reveal(dir: &Path, n: u64, gpus: &[u8], rows: &[u32]) -> Result<Vec<GpuOpenings>, MatmulRunError> {
    let size = matmul::check_n(n)?;
    gpus.iter()
        .map(|gpu| {
            let product = read_product(&product_path(dir, *gpu), n)?;
            let tree = MerkleTree::of_product(&product, size)?;
            Ok(GpuOpenings {
                gpu: *gpu,
                rows: matmul::open_rows(&product, size, &tree, rows)?,
            })
        })
        .collect()
}

/// The GPU path: cuBLAS's bf16 GEMM with fp32 accumulation, timed with CUDA events.
mod cuda {
    use std::ffi::c_void;

    use cudarc::cublas::{CudaBlas, sys as blas};
    use cudarc::driver::{CudaContext, DevicePtr, DevicePtrMut, sys as driver};

    use super::{GpuRun, MatmulRunError, REPETITIONS};

    /// Whether the driver and cuBLAS load at all: cudarc panics on a library it cannot load.
    pub(super) fn check_libraries() -> Result<(), MatmulRunError> {
        // SAFETY: only tries to dlopen the libraries by their usual names.
        if !unsafe { driver::is_culib_present() } {
            return Err(MatmulRunError::NoDriver);
        }
        // SAFETY: as above.
        if !unsafe { blas::is_culib_present() } {
            return Err(MatmulRunError::NoCublas);
        }
        Ok(())
    }

    /// A small integer's bf16 bits: the upper half of its f32 (exact, the lower half is zero).
    fn bf16_bits(value: i8) -> u16 {
        (f32::from(value).to_bits() >> 16) as u16
    }

    pub(super) fn run(gpu: u8, seed: &str, n: usize, memory_mib: u64) -> Result<GpuRun, MatmulRunError> {
        let failed = |message: String| MatmulRunError::Cuda { gpu, message };
        let context = CudaContext::new(usize::from(gpu)).map_err(|error| failed(format!("no such device: {error}")))?;
        let device_name = context.name().map_err(|error| failed(format!("its name: {error}")))?;
        let stream = context.default_stream();
        // Memory first, alone: the claimed model's share must fit, then it is given back.
        let memory_allocated = memory_mib == 0
            || stream
                .alloc_zeros::<u8>(usize::try_from(memory_mib.saturating_mul(1 << 20)).unwrap_or(usize::MAX))
                .is_ok();
        let to_device = |values: Vec<i8>| {
            let bits: Vec<u16> = values.into_iter().map(bf16_bits).collect();
            stream
                .clone_htod(&bits)
                .map_err(|error| failed(format!("copying an operand to the device: {error}")))
        };
        let a = to_device(trust::matmul::a_matrix(seed, n))?;
        let b = to_device(trust::matmul::b_matrix(seed, n))?;
        let mut c = stream
            .alloc_zeros::<f32>(n * n)
            .map_err(|error| failed(format!("allocating the product: {error}")))?;
        let blas_handle = CudaBlas::new(stream.clone()).map_err(|error| failed(format!("cuBLAS: {error}")))?;
        let size = i32::try_from(n).map_err(|_| failed(format!("n = {n} is too large")))?;
        let (alpha, beta) = (1.0f32, 0.0f32);
        let mut gemm = || -> Result<(), MatmulRunError> {
            let (a_ptr, _a_read) = a.device_ptr(&stream);
            let (b_ptr, _b_read) = b.device_ptr(&stream);
            let (c_ptr, _c_write) = c.device_ptr_mut(&stream);
            // cuBLAS is column-major: row-major A·B is column-major Bᵀ·Aᵀ, so B goes first.
            // SAFETY: the pointers are live device allocations of n² elements of the types
            // named, on the stream the handle uses; alpha and beta are host f32s.
            unsafe {
                cudarc::cublas::result::gemm_ex(
                    *blas_handle.handle(),
                    blas::cublasOperation_t::CUBLAS_OP_N,
                    blas::cublasOperation_t::CUBLAS_OP_N,
                    size,
                    size,
                    size,
                    (&alpha as *const f32).cast::<c_void>(),
                    b_ptr as *const c_void,
                    blas::cudaDataType::CUDA_R_16BF,
                    size,
                    a_ptr as *const c_void,
                    blas::cudaDataType::CUDA_R_16BF,
                    size,
                    (&beta as *const f32).cast::<c_void>(),
                    c_ptr as *mut c_void,
                    blas::cudaDataType::CUDA_R_32F,
                    size,
                    blas::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    blas::cublasGemmAlgo_t::CUBLAS_GEMM_DFALT,
                )
            }
            .map_err(|error| failed(format!("cublasGemmEx: {error}")))
        };
        gemm()?;
        let timing = Some(driver::CUevent_flags::CU_EVENT_DEFAULT);
        let start = context
            .new_event(timing)
            .map_err(|error| failed(format!("an event: {error}")))?;
        let end = context
            .new_event(timing)
            .map_err(|error| failed(format!("an event: {error}")))?;
        start
            .record(&stream)
            .map_err(|error| failed(format!("recording: {error}")))?;
        for _ in 0..REPETITIONS {
            gemm()?;
        }
        end.record(&stream)
            .map_err(|error| failed(format!("recording: {error}")))?;
        end.synchronize()
            .map_err(|error| failed(format!("the product: {error}")))?;
        let elapsed_ms = start
            .elapsed_ms(&end)
            .map_err(|error| failed(format!("timing: {error}")))?;
        let floats = stream
            .clone_dtoh(&c)
            .map_err(|error| failed(format!("copying the product back: {error}")))?;
        let product = trust::matmul::row_from_f32(&floats).ok_or(MatmulRunError::Inexact(gpu))?;
        Ok(GpuRun {
            product,
            elapsed_us: Some((f64::from(elapsed_ms) * 1000.0).round().max(1.0) as u64),
            memory_allocated,
            device_name,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn work(n: u64, gpus: &[u8], dir: Option<PathBuf>) -> MatmulWork {
        MatmulWork {
            seed: "unit-test-seed".into(),
            n,
            gpus: gpus.to_vec(),
            memory_mib: 0,
            product_dir: dir,
        }
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("fallow-matmul-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn the_cpu_reference_commits_to_a_product_the_protocol_verifies() {
        let dir = scratch("verify");
        let output = run_matmul(&work(64, &[1, 0], Some(dir.clone())), MatmulDevice::CpuReference).unwrap();
        assert_eq!(
            (output.rate_milli, output.elapsed_ms, output.measured_on.as_str()),
            (0, 0, CPU_REFERENCE),
            "the CPU reference measures no rate"
        );
        let roots: Vec<&str> = output.digest.split(',').collect();
        assert_eq!(roots.len(), 2, "one root per GPU, in the order's order");
        let challenge = [42u8; 32];
        let rows = matmul::challenge_rows(&matmul::gpu_challenge(&challenge, 1), 64);
        let openings = reveal(&dir, 64, &[1], &rows).unwrap();
        assert_eq!(
            matmul::verify(
                &matmul::gpu_seed("unit-test-seed", 1),
                64,
                roots[0],
                &matmul::gpu_challenge(&challenge, 1),
                &openings[0].rows
            ),
            Ok(())
        );
        // GPU 0's rows do not prove GPU 1's root: each GPU has operands of its own.
        let zero = reveal(&dir, 64, &[0], &rows).unwrap();
        assert!(
            matmul::verify(
                &matmul::gpu_seed("unit-test-seed", 1),
                64,
                roots[0],
                &matmul::gpu_challenge(&challenge, 1),
                &zero[0].rows
            )
            .is_err()
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn bad_orders_are_refused_and_a_machine_without_cuda_says_so() {
        let check = |order: MatmulWork, device: MatmulDevice, expect: MatmulRunError| {
            assert_eq!(run_matmul(&order, device), Err(expect));
        };
        check(work(64, &[], None), MatmulDevice::CpuReference, MatmulRunError::NoGpus);
        check(
            work(64, &[0, 0], None),
            MatmulDevice::CpuReference,
            MatmulRunError::GpuTwice(0),
        );
        check(
            work(100, &[0], None),
            MatmulDevice::CpuReference,
            MatmulRunError::Order(MatmulError::BadSize(100)),
        );
        check(
            work(4096, &[0], None),
            MatmulDevice::CpuReference,
            MatmulRunError::TooLargeForCpu(4096),
        );
        // This crate's tests run on machines without a GPU; where the driver loads, the device
        // path is the smoke test's (scripts/gpu-smoke.sh).
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            check(work(64, &[0], None), MatmulDevice::Cuda, MatmulRunError::NoDriver);
        }
    }

    #[test]
    fn a_product_that_is_missing_or_cut_short_is_an_error() {
        let dir = scratch("missing");
        assert!(matches!(reveal(&dir, 64, &[0], &[1]), Err(MatmulRunError::Io(_))));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(product_path(&dir, 0), [0u8; 12]).unwrap();
        assert!(matches!(reveal(&dir, 64, &[0], &[1]), Err(MatmulRunError::Io(_))));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
