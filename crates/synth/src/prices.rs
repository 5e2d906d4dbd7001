//! Market prices per GPU-hour from the Prime Intellect price trace: for each GPU, the median
//! over time of the per-snapshot `median` column, keyed by catalog model name.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use model::{GpuCatalog, Micros};

/// Where the price statistics live inside the traces folder.
pub const PRICE_STATS_FILE: &str = "gpu-prices-primeintellect/price_stats.csv";

#[derive(Debug, thiserror::Error)]
pub enum PriceError {
    #[error("cannot read {}: {source} (is the traces folder right?)", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{} line {line}: {reason}", path.display())]
    Malformed { path: PathBuf, line: usize, reason: String },
    #[error("{}: no GPU in the file is in the catalog", path.display())]
    NoPrices { path: PathBuf },
}

/// Each catalog model's market price per GPU-hour, read from
/// `traces_dir/gpu-prices-primeintellect/price_stats.csv`.
///
/// Rows whose `gpu_key` the catalog does not know are skipped (the market cannot sell them);
/// a row with a missing or unreadable field is an error naming the line.
pub fn market_prices(traces_dir: &Path) -> Result<BTreeMap<String, Micros>, PriceError> {
    let path = traces_dir.join(PRICE_STATS_FILE);
    let text = std::fs::read_to_string(&path).map_err(|source| PriceError::Read {
        path: path.clone(),
        source,
    })?;
    parse_price_stats(&text, &path)
}

/// Parses the text of `price_stats.csv`; `path` only names the file in errors.
pub fn parse_price_stats(text: &str, path: &Path) -> Result<BTreeMap<String, Micros>, PriceError> {
    let malformed = |line: usize, reason: String| PriceError::Malformed {
        path: path.to_path_buf(),
        line,
        reason,
    };
    let mut lines = text.lines().enumerate();
    let (_, header) = lines.next().ok_or_else(|| malformed(1, "the file is empty".into()))?;
    let columns: Vec<&str> = header.split(',').map(str::trim).collect();
    let column = |name: &str| {
        columns
            .iter()
            .position(|column| *column == name)
            .ok_or_else(|| malformed(1, format!("the header has no {name:?} column")))
    };
    let key_column = column("gpu_key")?;
    let median_column = column("median")?;

    let catalog = GpuCatalog::embedded();
    let mut samples: BTreeMap<String, Vec<Micros>> = BTreeMap::new();
    for (line_index, line) in lines {
        let line_number = line_index + 1;
        if line.trim().is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        if fields.len() != columns.len() {
            return Err(malformed(
                line_number,
                format!("expected {} fields, found {}", columns.len(), fields.len()),
            ));
        }
        let key = fields[key_column];
        let median = Micros::parse_dollars(fields[median_column])
            .filter(|price| price.0 > 0)
            .ok_or_else(|| {
                malformed(
                    line_number,
                    format!("median {:?} is not a positive dollar amount", fields[median_column]),
                )
            })?;
        let Some(model) = catalog.find(key) else {
            continue;
        };
        samples
            .entry(catalog.spec(model).name.clone())
            .or_default()
            .push(median);
    }
    if samples.is_empty() {
        return Err(PriceError::NoPrices {
            path: path.to_path_buf(),
        });
    }
    Ok(samples
        .into_iter()
        .map(|(name, mut prices)| {
            prices.sort_unstable();
            (name, median_of_sorted(&prices))
        })
        .collect())
}

/// The median of a sorted, non-empty list; for an even count, the mean of the middle two,
/// rounded down to the micro-dollar.
fn median_of_sorted(prices: &[Micros]) -> Micros {
    let middle = prices.len() / 2;
    if !prices.len().is_multiple_of(2) {
        prices[middle]
    } else {
        Micros((prices[middle - 1].0 + prices[middle].0) / 2)
    }
}

/// Round prices close to the trace's medians, for tests that must not need the trace.
pub fn sample_prices() -> BTreeMap<String, Micros> {
    [
        ("A100-PCIe-80GB", 1_640_000),
        ("A100-SXM4-80GB", 1_750_000),
        ("B200", 5_690_000),
        ("GH200", 1_490_000),
        ("H100-PCIe", 2_100_000),
        ("H100-SXM5", 2_400_000),
        ("H200-SXM", 3_300_000),
    ]
    .into_iter()
    .map(|(name, micros)| (name.to_string(), Micros(micros)))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = "timestamp,gpu_key,gpu_type,socket_type,min,p10,p25,median,p75,p90,max,mean";

    fn parse(rows: &[&str]) -> Result<BTreeMap<String, Micros>, PriceError> {
        let text = std::iter::once(HEADER)
            .chain(rows.iter().copied())
            .collect::<Vec<_>>()
            .join("\n");
        parse_price_stats(&text, Path::new("price_stats.csv"))
    }

    #[test]
    fn median_over_time_per_catalog_model() {
        let prices = parse(&[
            "t1,H100_80GB_SXM5,H100,SXM5,1,1,1,2.00,1,1,1,1",
            "t2,H100_80GB_SXM5,H100,SXM5,1,1,1,3.00,1,1,1,1",
            "t3,H100_80GB_SXM5,H100,SXM5,1,1,1,2.50,1,1,1,1",
            "t1,A100_80GB_PCIe,A100,PCIe,1,1,1,1.20,1,1,1,1",
            "t2,A100_80GB_PCIe,A100,PCIe,1,1,1,1.30,1,1,1,1",
            "t1,UNKNOWN_GPU,X,,1,1,1,9.99,1,1,1,1",
        ])
        .unwrap();
        assert_eq!(
            prices,
            BTreeMap::from([
                ("A100-PCIe-80GB".to_string(), Micros(1_250_000)),
                ("H100-SXM5".to_string(), Micros(2_500_000)),
            ])
        );
    }

    #[test]
    fn malformed_rows_name_the_line() {
        let error = parse(&[
            "t1,H100_80GB_SXM5,H100,SXM5,1,1,1,2.00,1,1,1,1",
            "t2,H100_80GB_SXM5,H100,SXM5,1,1,1,,1,1,1,1",
        ])
        .unwrap_err();
        assert_eq!(
            error.to_string(),
            "price_stats.csv line 3: median \"\" is not a positive dollar amount"
        );
        let error = parse(&["t1,H100_80GB_SXM5,short"]).unwrap_err();
        assert_eq!(error.to_string(), "price_stats.csv line 2: expected 12 fields, found 3");
        let error = parse_price_stats("timestamp,gpu_key\n", Path::new("p.csv")).unwrap_err();
        assert_eq!(error.to_string(), "p.csv line 1: the header has no \"median\" column");
    }

    #[test]
    fn a_missing_file_says_which() {
        let error = market_prices(Path::new("no/such/traces")).unwrap_err();
        let message = error.to_string();
        assert!(
            message.starts_with("cannot read no/such/traces/gpu-prices-primeintellect/price_stats.csv"),
            "{message}"
        );
    }
}
