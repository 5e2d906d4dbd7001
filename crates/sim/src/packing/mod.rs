//! `fallow sim packing`: the FGD paper's packing benchmark (ATC'23) on the openb trace, with Fallow's own policy.

pub mod cluster;
pub mod fallow_policy;
pub mod gpuspec;
pub mod policies;
pub mod run;
pub mod trace;
pub mod typical;

pub use policies::PolicyName;
pub use run::{PackingConfig, PolicyReport, SeedReport, run_packing};
pub use trace::{NodeRecord, PodRecord, TraceError, read_nodes, read_pods};
