//! The provider agent: what a GPU owner runs. It keeps the node's ed25519 key, detects the GPUs
//! honestly (or offers simulated ones, labelled as such), registers the node, heartbeats with
//! telemetry, receives leases by long-poll, runs each replica with an executor, signs usage
//! records and a completion attestation, and acts only on a lease's newest epoch.

pub mod agent;
pub mod canary;
pub mod client;
pub mod datasets;
pub mod exec;
pub mod gpu;
pub mod gpu_clear;
pub mod guard;
pub mod image;
pub mod matmul;
pub mod output;
pub mod scratch;
pub mod state;
pub mod topology;
pub mod tunnel;

pub use agent::{Agent, AgentConfig, AgentError, CANARY_PRODUCTS_DIR, NodeTopology, rotate_key};
pub use scratch::ScratchEncryption;
