//! The `fallow` binary: one executable with subcommands, the way Nomad and Vault ship.

// A command line prints its answers (the workspace denies printing to stdout in libraries).
#![allow(clippy::print_stdout)]

mod cli;
mod cmd_agent;
mod cmd_bench;
mod cmd_bench_api;
mod cmd_bench_repair;
mod cmd_bench_serve;
mod cmd_canary;
mod cmd_dev;
mod cmd_gateway;
mod cmd_server;
mod cmd_sim;
mod settings_file;
mod signals;

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

/// The coordinator allocates a little for every request; the system allocator spent an eighth
/// of `bench api`'s CPU time doing it, mimalloc much less.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "fallow", version, about = "A market and scheduler for idle GPU time")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Tenants: submit, list, show, follow, cancel and quote jobs.
    Job(Box<cli::job::JobArgs>),
    /// Tenants: stage a dataset ahead on the nodes a job would most likely get.
    Dataset(cli::dataset::DatasetArgs),
    /// Tenants: search the market's offers.
    Offers(cli::offers::OffersArgs),
    /// Tenants: book GPUs ahead at a price fixed now; list, show and cancel bookings.
    Reserve(cli::reserve::ReserveArgs),
    /// Tenants: a service served through the gateway (requests, latency, tokens).
    Service(Box<cli::service::ServiceArgs>),
    /// Tenants: balance and usage.
    Tenant(cli::tenant::TenantArgs),
    /// Providers: nodes, their policy, their calendar and their canaries.
    Node(cli::node::NodeArgs),
    /// Providers: earnings, standing under the trust policy, bonds and fraud decided.
    Provider(cli::provider::ProviderArgs),
    /// Admins: accounts, API keys, credits, bonds and fraud decided.
    Admin(cli::admin::AdminArgs),
    /// The GPU models the market knows: memory, compute units (H100 = 1) and aliases.
    Catalog(cli::catalog::CatalogArgs),
    /// Shell completions (bash, zsh, fish, elvish, powershell).
    Completions(cli::completions::CompletionsArgs),
    /// Everything on this machine in one process: a coordinator (SQLite), a local agent, demo
    /// accounts and the dashboard. Start here.
    Dev(cmd_dev::DevArgs),
    /// The provider agent: registers the node, runs leased jobs, reports signed usage.
    Agent(Box<cmd_agent::AgentArgs>),
    /// Benchmarks of the matching engine (JSON on stdout).
    #[command(subcommand)]
    Bench(cmd_bench::BenchCommand),
    /// Providers: the canary, a known-answer benchmark the coordinator orders on nodes.
    #[command(subcommand)]
    Canary(cmd_canary::CanaryCommand),
    /// The coordinator: HTTP API, store and reconcile loop.
    Server(cmd_server::ServerArgs),
    /// The gateway as its own process, beside the coordinator's: serves /s/{service}/… for
    /// scale, several side by side.
    Gateway(cmd_gateway::GatewayArgs),
    /// Simulations that drive the real matcher in virtual time.
    #[command(subcommand)]
    Sim(cmd_sim::SimCommand),
}

fn main() -> ExitCode {
    // `fallow agent` and `fallow server` take settings from a config file too (flags beat the
    // environment, which beats the file).
    let argv = match settings_file::with_settings_file(std::env::args_os().collect(), &Cli::command()) {
        Ok(argv) => argv,
        Err(error) => {
            eprintln!("error: {error:#}");
            return ExitCode::FAILURE;
        }
    };
    let cli = Cli::parse_from(argv);
    let result = match cli.command {
        Command::Job(args) => cli::job::run(*args),
        Command::Offers(args) => cli::offers::run(args),
        Command::Dataset(args) => cli::dataset::run(args),
        Command::Reserve(args) => cli::reserve::run(args),
        Command::Service(args) => cli::service::run(*args),
        Command::Tenant(args) => cli::tenant::run(args),
        Command::Node(args) => cli::node::run(args),
        Command::Provider(args) => cli::provider::run(args),
        Command::Admin(args) => cli::admin::run(args),
        Command::Catalog(args) => cli::catalog::run(args),
        Command::Completions(args) => cli::completions::run(args),
        Command::Dev(args) => cmd_dev::run(args),
        Command::Agent(args) => cmd_agent::run(*args),
        Command::Bench(command) => cmd_bench::run(command),
        Command::Canary(command) => cmd_canary::run(command),
        Command::Server(args) => cmd_server::run(args),
        Command::Gateway(args) => cmd_gateway::run(args),
        Command::Sim(command) => cmd_sim::run(command),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => match error.downcast::<cli::job::JobExit>() {
            // A job that did not finish: its code (`job submit --wait`, `job logs --follow`).
            Ok(exit) => {
                eprintln!("{exit}");
                ExitCode::from(exit.code)
            }
            // The chain of causes, in words; no backtrace for a user's mistake.
            Err(error) => {
                eprintln!("error: {error:#}");
                ExitCode::FAILURE
            }
        },
    }
}
