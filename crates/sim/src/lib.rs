//! Simulations that drive Fallow's placement logic on recorded traces, deterministically from a seed.

pub mod packing;
