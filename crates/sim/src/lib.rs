//! Simulations that drive Fallow's placement logic on recorded traces and synthetic markets,
//! deterministically from a seed.

pub mod market;
pub mod packing;
