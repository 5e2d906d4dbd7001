//! `fallow canary`: the known-answer benchmark the coordinator orders on nodes
//! (docs/trust-policy.md § 3). `run` computes one order's answer and prints what it measured as
//! one JSON line (the agent starts it as a child); `reveal` answers a matmul canary's challenge
//! from the products `run` kept; `image` builds its container variant locally. The work itself
//! is `agent::canary` (the hash canary) and `agent::matmul` (the matmul canary).

use anyhow::Context;
use clap::{Args, Subcommand};

#[derive(Subcommand)]
pub enum CanaryCommand {
    /// Runs one canary order and prints {"digest", "elapsed_ms", "rate_milli",
    /// "memory_allocated", "measured_on"} as one JSON line. The hash canary (the default):
    /// FALLOW_SIMULATED_GPU=MODEL paces the run like that catalog model; without it the digest is
    /// computed on the CPU and no rate is measured. The matmul canary (--kind matmul): a seeded
    /// n×n bf16 product on each GPU through cuBLAS; the digest lists each GPU's Merkle root, the
    /// rate is the slowest GPU's in thousandths of a TFLOPS.
    Run(RunArgs),
    /// Answers a matmul canary's challenge: prints the rows asked for of each GPU's kept product,
    /// with their Merkle paths, as one JSON line ([{"gpu", "rows": [{"index", "row", "path"}]}]).
    Reveal(RevealArgs),
    /// Builds the container variant (this binary and its libraries) as a local Docker image and
    /// prints its tag.
    Image(ImageArgs),
}

/// The canary's kinds (`api::CanaryKind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    /// Hash chains on the CPU, or paced like a simulated device.
    Hash,
    /// A seeded matrix product on the GPU (cuBLAS), proven row by row.
    Matmul,
}

/// Where the matmul canary runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Device {
    /// The GPUs, through the CUDA driver and cuBLAS loaded at run time.
    Cuda,
    /// The CPU, for n up to 1024, measuring no rate (for tests and checks without a GPU).
    CpuReference,
}

#[derive(Args)]
pub struct RunArgs {
    /// The order's seed.
    #[arg(long)]
    seed: String,
    /// The canary's kind.
    #[arg(long, value_enum, default_value = "hash")]
    kind: Kind,
    /// Hash canary: work units per GPU (1 to 100000).
    #[arg(long)]
    units: Option<u64>,
    /// Matmul canary: the product's size n (a power of two, 64 to 16384).
    #[arg(long, default_value_t = trust::matmul::N_DEFAULT)]
    n: u64,
    /// Matmul canary: where the product runs.
    #[arg(long, value_enum, default_value = "cuda")]
    device: Device,
    /// Matmul canary: keep each GPU's product in this directory for `fallow canary reveal`.
    #[arg(long)]
    product_dir: Option<std::path::PathBuf>,
    /// Matmul canary: check the product here too, against a challenge drawn now, and fail
    /// when the check fails (for smoke tests; the coordinator draws its own).
    #[arg(long)]
    self_check: bool,
    /// The GPU indexes, comma-separated, in the order's order (e.g. 0,1).
    #[arg(long, value_delimiter = ',', required = true)]
    gpus: Vec<u8>,
    /// Memory to allocate on each GPU, in MiB.
    #[arg(long, default_value_t = 0)]
    memory_mib: u64,
}

#[derive(Args)]
pub struct RevealArgs {
    /// The product's size n, as ordered.
    #[arg(long)]
    n: u64,
    /// The GPU indexes, comma-separated, in the order's order.
    #[arg(long, value_delimiter = ',', required = true)]
    gpus: Vec<u8>,
    /// The rows asked for, comma-separated, in the challenge's order.
    #[arg(long, value_delimiter = ',', required = true)]
    rows: Vec<u32>,
    /// The directory `fallow canary run --product-dir` kept the products in.
    #[arg(long)]
    product_dir: std::path::PathBuf,
}

#[derive(Args)]
pub struct ImageArgs {
    /// The image's tag (default fallow-canary:VERSION).
    #[arg(long)]
    tag: Option<String>,
}

pub fn run(command: CanaryCommand) -> anyhow::Result<()> {
    match command {
        CanaryCommand::Run(args) if args.kind == Kind::Matmul => run_matmul(args),
        CanaryCommand::Run(args) => {
            let work = agent::canary::CanaryWork {
                seed: args.seed,
                units: args.units.context("--units is needed for the hash canary")?,
                gpus: args.gpus,
                memory_mib: args.memory_mib,
            };
            let output = agent::canary::run_canary(&work, &agent::canary::CanaryDevice::from_env())?;
            println!(
                "{}",
                serde_json::to_string(&output).context("writing the canary's output")?
            );
            Ok(())
        }
        CanaryCommand::Reveal(args) => {
            let openings = agent::matmul::reveal(&args.product_dir, args.n, &args.gpus, &args.rows)
                .context("answering the challenge")?;
            println!("{}", serde_json::to_string(&openings).context("writing the rows")?);
            Ok(())
        }
        CanaryCommand::Image(args) => {
            let tag = args.tag.unwrap_or_else(agent::canary::default_image_tag);
            let executable = std::env::current_exe().context("finding the fallow binary")?;
            agent::canary::build_image(&executable, &tag)
                .map_err(anyhow::Error::msg)
                .context("building the canary image")?;
            println!("{tag}");
            Ok(())
        }
    }
}

/// `fallow canary run --kind matmul`: the product, its line, and with `--self-check` the check
/// the coordinator would make, against a challenge drawn here.
fn run_matmul(args: RunArgs) -> anyhow::Result<()> {
    let scratch;
    let product_dir = match (&args.product_dir, args.self_check) {
        (Some(dir), _) => Some(dir.clone()),
        (None, true) => {
            scratch = std::env::temp_dir().join(format!("fallow-canary-check-{}", std::process::id()));
            Some(scratch.clone())
        }
        (None, false) => None,
    };
    let work = agent::matmul::MatmulWork {
        seed: args.seed,
        n: args.n,
        gpus: args.gpus,
        memory_mib: args.memory_mib,
        product_dir: product_dir.clone(),
    };
    let device = match args.device {
        Device::Cuda => agent::matmul::MatmulDevice::Cuda,
        Device::CpuReference => agent::matmul::MatmulDevice::CpuReference,
    };
    let output = agent::matmul::run_matmul(&work, device).context("running the matmul canary")?;
    let checked = match (&product_dir, args.self_check) {
        (Some(dir), true) => {
            let checked = self_check(&work, dir, &output.digest);
            if args.product_dir.is_none() {
                let _ = std::fs::remove_dir_all(dir);
            }
            Some(checked)
        }
        _ => None,
    };
    println!(
        "{}",
        serde_json::to_string(&output).context("writing the canary's output")?
    );
    if let Some(checked) = checked {
        checked.context("the product's check failed")?;
        eprintln!(
            "the product's check passed: {} rows of each GPU's product against a random vector",
            trust::matmul::CHALLENGE_ROWS
        );
    }
    Ok(())
}

/// The coordinator's check of every GPU's product, against a challenge drawn here.
fn self_check(work: &agent::matmul::MatmulWork, dir: &std::path::Path, digest: &str) -> anyhow::Result<()> {
    let challenge = trust::matmul::new_challenge_seed();
    let roots: Vec<&str> = digest.split(',').collect();
    anyhow::ensure!(roots.len() == work.gpus.len(), "one root per GPU, not {digest:?}");
    let n = usize::try_from(work.n).context("n")?;
    for (gpu, root) in work.gpus.iter().zip(roots) {
        let gpu_challenge = trust::matmul::gpu_challenge(&challenge, *gpu);
        let rows = trust::matmul::challenge_rows(&gpu_challenge, n);
        let openings = agent::matmul::reveal(dir, work.n, &[*gpu], &rows)?;
        let seed = trust::matmul::gpu_seed(&work.seed, *gpu);
        trust::matmul::verify(&seed, work.n, root, &gpu_challenge, &openings[0].rows)
            .with_context(|| format!("GPU {gpu}"))?;
    }
    Ok(())
}
