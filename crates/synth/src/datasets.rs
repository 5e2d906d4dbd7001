//! The catalogue of datasets that nodes cache and jobs read: fixed, the same for every seed.

use model::Dataset;

/// Datasets in the catalogue.
pub const DATASET_CATALOGUE_SIZE: usize = 50;

/// The catalogue, sorted by content hash. Hashes and sizes (1–1024 GiB) come from SplitMix64
/// over the index, so fleets and job streams agree without sharing state.
pub fn dataset_catalogue() -> Vec<Dataset> {
    let mut datasets: Vec<Dataset> = (0..DATASET_CATALOGUE_SIZE as u64)
        .map(|index| {
            let content_hash = splitmix64(index);
            let size_gib = 1 + splitmix64(content_hash) % 1024;
            Dataset {
                content_hash,
                size_bytes: size_gib << 30,
            }
        })
        .collect();
    datasets.sort_by_key(|dataset| dataset.content_hash);
    datasets
}

/// SplitMix64 (Steele, Lea and Flood, 2014): a bijective mix of a 64-bit counter.
fn splitmix64(value: u64) -> u64 {
    let mut z = value.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalogue_is_fixed_sorted_and_distinct() {
        let datasets = dataset_catalogue();
        assert_eq!(datasets.len(), DATASET_CATALOGUE_SIZE);
        assert!(
            datasets
                .windows(2)
                .all(|pair| pair[0].content_hash < pair[1].content_hash)
        );
        assert_eq!(datasets, dataset_catalogue());
        assert!(
            datasets
                .iter()
                .all(|dataset| (1u64 << 30..=1024u64 << 30).contains(&dataset.size_bytes))
        );
    }
}
