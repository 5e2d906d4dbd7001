//! Synthetic fleets and job streams for benchmarks and simulations: pure and seeded (ChaCha8),
//! no wall clock, no IO except [`market_prices`], which reads the price trace.

mod datasets;
mod fleet;
mod jobs;
mod picker;
mod prices;

pub use datasets::{DATASET_CATALOGUE_SIZE, dataset_catalogue};
pub use fleet::{
    Fleet, FleetError, FleetModel, FleetSpec, GPUS_PER_NODE, L40_PRICED_FROM, MODEL_MIX, NODES_PER_NVL72_DOMAIN,
    NODES_PER_PROVIDER, REGIONS, SITES, fleet,
};
pub use jobs::{JobStream, UNCAPPED_PRICE};
pub use picker::{IndexPicker, pick_weighted};
pub use prices::{PRICE_STATS_FILE, PriceError, market_prices, parse_price_stats, sample_prices};

/// Constants of the job mix, for callers that check or report it.
pub mod job_mix {
    pub use crate::jobs::{
        CLASS_PERMILLE, CPU_CORES_PER_GPU, MAX_RUNTIME_S, MEMORY_GIB_PER_GPU, MODEL_CONSTRAINED_PERMILLE,
        ONE_GPU_PERMILLE, PRICE_CAP_FACTOR_PERMILLE, PRICE_CAPPED_PERMILLE, REGION_CONSTRAINED_PERMILLE, SHARE_MILLI,
        SHARE_PERMILLE, TIER_PERMILLE,
    };
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    /// The real price trace, when the shared traces sit beside the repository.
    #[test]
    fn real_prices_build_a_fleet() {
        let traces = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/traces"));
        if !traces.exists() {
            eprintln!("SKIPPED real_prices_build_a_fleet: {} is absent", traces.display());
            return;
        }
        let prices = market_prices(traces).expect("the shared price trace parses");
        for name in [
            "A100-PCIe-80GB",
            "A100-SXM4-80GB",
            "H100-PCIe",
            "H100-SXM5",
            "H200-SXM",
            "GH200",
            "B200",
        ] {
            let price = prices[name];
            assert!(
                price > model::Micros(500_000) && price < model::Micros(15_000_000),
                "{name}: {price}"
            );
        }
        let fleet = fleet(&FleetSpec {
            gpus: 16_000,
            seed: 1,
            prices,
        })
        .expect("the real prices cover the mix");
        assert_eq!(fleet.nodes.len(), 2_000);
        assert_eq!(fleet.models.len(), MODEL_MIX.len());
    }
}
