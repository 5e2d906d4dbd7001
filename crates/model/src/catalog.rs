//! The GPU catalog: models, their memory and throughput, and compute units (CU), the
//! throughput relative to one H100 SXM5 that lets a tenant ask for "64 H100-equivalents".

use std::collections::BTreeMap;
use std::fmt;
use std::sync::OnceLock;

/// Index of a model in a [`GpuCatalog`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GpuModel(pub u16);

impl GpuModel {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// Dense 16-bit tensor TFLOPS of the reference GPU, the H100 SXM5 (CU = 1.000).
pub const REFERENCE_DENSE_TFLOPS: f64 = 989.4;

#[derive(Clone, Debug, PartialEq)]
pub struct GpuSpec {
    pub name: String,
    pub aliases: Vec<String>,
    pub vendor: String,
    pub architecture: String,
    pub memory_mib: u32,
    pub dense_tflops: f64,
    pub memory_bandwidth_gb_s: u32,
    pub interconnect: String,
    pub tdp_w: u32,
    /// False for trace codes whose hardware was never disclosed (openb's G2 and G3).
    pub disclosed: bool,
    /// Compute units in thousandths: 1000 = one H100 SXM5.
    pub cu_milli: u32,
}

#[derive(Clone, Debug)]
pub struct GpuCatalog {
    specs: Vec<GpuSpec>,
    by_name: BTreeMap<String, GpuModel>,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum CatalogError {
    #[error("GPU catalog line {line}: {reason}")]
    BadLine { line: usize, reason: String },
    #[error("GPU catalog: the name or alias {0:?} is used twice")]
    DuplicateName(String),
}

const EMBEDDED_CATALOG: &str = include_str!("../data/gpu_catalog.csv");

impl GpuCatalog {
    /// The catalog shipped in the binary (`crates/model/data/gpu_catalog.csv`).
    pub fn embedded() -> &'static GpuCatalog {
        static CATALOG: OnceLock<GpuCatalog> = OnceLock::new();
        CATALOG.get_or_init(|| GpuCatalog::parse(EMBEDDED_CATALOG).expect("the embedded catalog is checked by tests"))
    }

    /// Parses the catalog format: `#` comments, then rows of
    /// `name,aliases,vendor,architecture,memory_gib,dense_tflops,memory_bw_gb_s,interconnect,tdp_w,disclosed,note`.
    pub fn parse(text: &str) -> Result<GpuCatalog, CatalogError> {
        let mut specs = Vec::new();
        let mut by_name = BTreeMap::new();
        for (line_index, line) in text.lines().enumerate() {
            let line_number = line_index + 1;
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |reason: String| CatalogError::BadLine {
                line: line_number,
                reason,
            };
            let fields: Vec<&str> = line.splitn(11, ',').collect();
            if fields.len() < 10 {
                return Err(bad(format!("expected 11 fields, found {}", fields.len())));
            }
            let number = |index: usize, what: &str| -> Result<f64, CatalogError> {
                fields[index]
                    .trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|value| value.is_finite() && *value > 0.0)
                    .ok_or_else(|| bad(format!("{what} {:?} is not a positive number", fields[index])))
            };
            let memory_gib = number(4, "memory_gib")?;
            let dense_tflops = number(5, "dense_tflops")?;
            let bandwidth = number(6, "memory_bw_gb_s")?;
            let tdp = number(8, "tdp_w")?;
            let disclosed = match fields[9].trim() {
                "yes" => true,
                "no" => false,
                other => return Err(bad(format!("disclosed must be yes or no, not {other:?}"))),
            };
            let name = fields[0].trim().to_string();
            if name.is_empty() {
                return Err(bad("empty name".into()));
            }
            let aliases: Vec<String> = fields[1]
                .split('|')
                .map(str::trim)
                .filter(|alias| !alias.is_empty())
                .map(String::from)
                .collect();
            let model = GpuModel(u16::try_from(specs.len()).map_err(|_| bad("too many models".into()))?);
            for key in std::iter::once(&name).chain(aliases.iter()) {
                if by_name.insert(key.to_ascii_lowercase(), model).is_some() {
                    return Err(CatalogError::DuplicateName(key.clone()));
                }
            }
            specs.push(GpuSpec {
                name,
                aliases,
                vendor: fields[2].trim().to_string(),
                architecture: fields[3].trim().to_string(),
                memory_mib: (memory_gib * 1024.0).round() as u32,
                dense_tflops,
                memory_bandwidth_gb_s: bandwidth.round() as u32,
                interconnect: fields[7].trim().to_string(),
                tdp_w: tdp.round() as u32,
                disclosed,
                cu_milli: ((dense_tflops / REFERENCE_DENSE_TFLOPS) * 1000.0).round().max(1.0) as u32,
            });
        }
        Ok(GpuCatalog { specs, by_name })
    }

    /// Looks a model up by name or alias, ignoring case.
    pub fn find(&self, name: &str) -> Option<GpuModel> {
        self.by_name.get(&name.trim().to_ascii_lowercase()).copied()
    }

    pub fn spec(&self, model: GpuModel) -> &GpuSpec {
        &self.specs[model.index()]
    }

    pub fn len(&self) -> usize {
        self.specs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.specs.is_empty()
    }

    pub fn models(&self) -> impl Iterator<Item = (GpuModel, &GpuSpec)> {
        self.specs
            .iter()
            .enumerate()
            .map(|(index, spec)| (GpuModel(index as u16), spec))
    }
}

impl fmt::Display for GpuModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", GpuCatalog::embedded().spec(*self).name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_catalog_knows_the_trace_models() {
        let catalog = GpuCatalog::embedded();
        for name in [
            "T4", "P100", "V100M16", "V100M32", "A10", "G2", "G3", "H100", "H200", "B200", "GB200", "RTX-4090",
        ] {
            assert!(catalog.find(name).is_some(), "{name} missing from the catalog");
        }
        let h100 = catalog.spec(catalog.find("h100-sxm5").unwrap());
        assert_eq!(h100.cu_milli, 1000);
        assert_eq!(h100.memory_mib, 80 * 1024);
        let t4 = catalog.spec(catalog.find("T4").unwrap());
        assert_eq!(t4.cu_milli, 66);
        assert!(!catalog.spec(catalog.find("G2").unwrap()).disclosed);
    }

    #[test]
    fn bad_rows_are_refused_with_the_line() {
        assert_eq!(
            GpuCatalog::parse("# c\nX,,v,a,abc,1,1,PCIe,1,yes,").unwrap_err(),
            CatalogError::BadLine {
                line: 2,
                reason: "memory_gib \"abc\" is not a positive number".into()
            }
        );
        assert!(matches!(
            GpuCatalog::parse("X,,v,a,1,1,1,PCIe,1,yes,\nX,,v,a,1,1,1,PCIe,1,yes,"),
            Err(CatalogError::DuplicateName(_))
        ));
    }

    /// The embedded rows must agree with the Epoch AI table in shared/traces when it is beside the repo.
    #[test]
    fn catalog_matches_the_epoch_specs() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../../shared/traces/gpu-specs-epoch/key_gpus.csv"
        );
        let Ok(text) = std::fs::read_to_string(path) else {
            eprintln!("SKIPPED catalog_matches_the_epoch_specs: {path} is absent");
            return;
        };
        let catalog = GpuCatalog::embedded();
        let mut checked = 0;
        for line in text.lines().skip(1) {
            let fields = split_quoted(line);
            let Some(model) = catalog.find(&fields[0]) else {
                continue;
            };
            let spec = catalog.spec(model);
            let tensor: Option<f64> = fields[6].parse().ok();
            let fp16: Option<f64> = fields[7].parse().ok();
            let fp32: Option<f64> = fields[8].parse().ok();
            let larger = match (fp16, fp32) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            };
            let expected = tensor.or(larger).expect("a throughput figure");
            assert!(
                (spec.dense_tflops - expected).abs() < 0.01,
                "{}: {} vs {expected}",
                spec.name,
                spec.dense_tflops
            );
            if let Ok(memory_gb) = fields[4].parse::<f64>() {
                assert_eq!(spec.memory_mib, (memory_gb * 1024.0).round() as u32, "{}", spec.name);
            }
            checked += 1;
        }
        assert!(
            checked >= 20,
            "only {checked} catalog rows were checked against the source"
        );
    }

    /// Splits one CSV line, honouring double quotes (the source's notes contain commas).
    fn split_quoted(line: &str) -> Vec<String> {
        let mut fields = vec![String::new()];
        let mut quoted = false;
        for c in line.chars() {
            match c {
                '"' => quoted = !quoted,
                ',' if !quoted => fields.push(String::new()),
                _ => fields.last_mut().expect("never empty").push(c),
            }
        }
        fields
    }
}
