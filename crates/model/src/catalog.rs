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
    /// The same keys `folded`: "NVIDIA H800" and "h800" find the same row.
    by_folded: BTreeMap<String, GpuModel>,
}

/// Vendor and product-line words that drivers and traces put before a model's name
/// ("NVIDIA GeForce RTX 4090", "Tesla T4", "AMD Instinct MI300X", "Huawei Ascend910B"); `find`
/// looks again without them. Folded, longest first.
const NAME_PREFIXES: [&str; 8] = [
    "instinct", "geforce", "habana", "nvidia", "huawei", "intel", "tesla", "amd",
];

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
        let mut by_folded = BTreeMap::new();
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
                if by_name.insert(key.to_ascii_lowercase(), model).is_some()
                    || by_folded.insert(folded(key), model).is_some_and(|other| other != model)
                {
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
        Ok(GpuCatalog {
            specs,
            by_name,
            by_folded,
        })
    }

    /// Looks a model up by name or alias, ignoring case; then ignoring punctuation and the
    /// vendor words drivers and traces add ("NVIDIA H800", "AMD Instinct MI300X", "Tesla T4").
    pub fn find(&self, name: &str) -> Option<GpuModel> {
        if let Some(model) = self.by_name.get(&name.trim().to_ascii_lowercase()) {
            return Some(*model);
        }
        let mut key = folded(name);
        loop {
            if let Some(model) = self.by_folded.get(&key) {
                return Some(*model);
            }
            let prefix = NAME_PREFIXES.iter().find(|prefix| key.starts_with(**prefix))?;
            key.drain(..prefix.len());
        }
    }

    /// Looks a model up, or says it is unknown and names the closest ones: the error every
    /// place that reads a model name gives (a job, a node's registration, a node list).
    pub fn find_or_explain(&self, name: &str) -> Result<GpuModel, String> {
        self.find(name).ok_or_else(|| self.unknown(name))
    }

    /// `unknown model "X"; closest: A, B, C (`fallow catalog` lists every model)`.
    pub fn unknown(&self, name: &str) -> String {
        format!(
            "unknown model {name:?}; closest: {} (`fallow catalog` lists every model)",
            self.closest(name, CLOSEST_NAMED).join(", ")
        )
    }

    /// The `count` models whose name or an alias is nearest to `name`: one that contains the
    /// other first, then by edit distance, ignoring case and punctuation.
    pub fn closest(&self, name: &str, count: usize) -> Vec<&str> {
        let wanted = folded(name);
        let mut ranked: Vec<((bool, usize), &str)> = self
            .specs
            .iter()
            .map(|spec| {
                let rank = std::iter::once(&spec.name)
                    .chain(spec.aliases.iter())
                    .map(|key| {
                        let key = folded(key);
                        let contained = !wanted.is_empty() && (key.contains(&wanted) || wanted.contains(&key));
                        (!contained, edit_distance(&wanted, &key))
                    })
                    .min()
                    .expect("a name at least");
                (rank, spec.name.as_str())
            })
            .collect();
        ranked.sort();
        ranked.into_iter().take(count).map(|(_, name)| name).collect()
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

/// How many near names an unknown model's error offers.
pub const CLOSEST_NAMED: usize = 3;

/// Lower case, letters and digits only: "H100 SXM5" and "h100-sxm5" are the same name.
fn folded(name: &str) -> String {
    name.chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect()
}

/// Levenshtein distance over bytes (the names are ASCII).
fn edit_distance(a: &str, b: &str) -> usize {
    let b = b.as_bytes();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.bytes().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1).min(row[j] + 1).min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
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
    fn the_models_providers_hold_in_numbers_are_known_by_their_common_names() {
        let catalog = GpuCatalog::embedded();
        for (name, model) in [
            ("L40S", "L40S"),
            ("l20", "L20"),
            ("RTX 5090", "RTX-5090"),
            ("RTX-PRO-6000-Blackwell", "RTX-PRO-6000"),
            ("B300", "B300"),
            ("GB300", "GB300"),
            ("MI325X", "MI325X"),
            ("Instinct-MI355X", "MI355X"),
            ("Gaudi-3", "Gaudi3"),
            ("910B", "Ascend-910B"),
            ("Ascend910C", "Ascend-910C"),
            ("Ascend-950", "Ascend-950DT"),
            ("H800", "H800-SXM5"),
            ("A800", "A800-SXM4-80GB"),
            ("NVIDIA H800", "H800-SXM5"),
            ("NVIDIA A800-SXM4-80GB", "A800-SXM4-80GB"),
            ("NVIDIA GeForce RTX 4090", "RTX-4090"),
            ("Tesla T4", "T4"),
            ("AMD Instinct MI300X", "MI300X"),
            ("Huawei Ascend910C", "Ascend-910C"),
            ("Intel Gaudi 3", "Gaudi3"),
        ] {
            let found = catalog.find(name);
            assert_eq!(
                found.map(|model| catalog.spec(model).name.as_str()),
                Some(model),
                "{name}"
            );
        }
        assert!(!catalog.spec(catalog.find("Ascend-950DT").unwrap()).disclosed);
        assert_eq!(catalog.find("NVIDIA"), None, "a vendor alone names no model");
        assert_eq!(
            catalog.find("NVIDIA H100 80GB HBM3"),
            None,
            "driver names with more words: agent::gpu"
        );
        // A lab's "16,000 Ascend 910C are about 4,000 Blackwells": in compute units the 910C is
        // about a third of a GB300, so the claim is of the right order, not exact.
        let cu = |name: &str| f64::from(catalog.spec(catalog.find(name).unwrap()).cu_milli) / 1000.0;
        let ratio = 16_000.0 * cu("Ascend-910C") / (4_000.0 * cu("GB300"));
        assert!((1.0..1.5).contains(&ratio), "{ratio}");
    }

    #[test]
    fn an_unknown_model_is_explained_with_the_closest_names() {
        let catalog = GpuCatalog::embedded();
        assert_eq!(catalog.closest("H100 SXM", 1), ["H100-SXM5"]);
        assert_eq!(catalog.closest("L40-S", 1), ["L40S"]);
        assert_eq!(catalog.closest("Ascend 910", 2), ["Ascend-910B", "Ascend-910C"]);
        let message = catalog.find_or_explain("RTX 5080").unwrap_err();
        assert!(
            message.starts_with("unknown model \"RTX 5080\"; closest: RTX-5090"),
            "{message}"
        );
        assert!(message.contains("fallow catalog"), "{message}");
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "abc"), 3);
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
            let expected = dense_figure(fields[6].parse().ok(), fields[7].parse().ok(), fields[8].parse().ok())
                .expect("a throughput figure");
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

    /// Rows whose note names a `source row "X"` of the Epoch table agree with that row on every
    /// figure it has (dense 16-bit as in the header comment, memory, bandwidth, power).
    #[test]
    fn source_rows_match_the_epoch_table() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../../shared/traces/gpu-specs-epoch/ml_hardware.csv"
        );
        let Ok(text) = std::fs::read_to_string(path) else {
            eprintln!("SKIPPED source_rows_match_the_epoch_table: {path} is absent");
            return;
        };
        let records = csv_records(&text);
        let header = &records[0];
        let column = |name: &str| {
            header
                .iter()
                .position(|field| field.starts_with(name))
                .unwrap_or_else(|| panic!("no column {name}"))
        };
        let (fp32, fp16, tensor) = (column("FP32 (single"), column("FP16 (half"), column("Tensor-FP16/BF16"));
        let (memory, bandwidth, tdp) = (
            column("Memory size per board"),
            column("Memory bandwidth"),
            column("TDP"),
        );
        let catalog = GpuCatalog::embedded();
        let mut checked = 0;
        for line in EMBEDDED_CATALOG.lines().filter(|line| !line.starts_with('#')) {
            let Some((_, source)) = line.split_once("source row \"") else {
                continue;
            };
            let source = source.split('"').next().unwrap();
            let name = line.split(',').next().unwrap();
            let spec = catalog.spec(catalog.find(name).unwrap());
            let row = records
                .iter()
                .find(|row| row[0] == source)
                .unwrap_or_else(|| panic!("{name}: no source row {source:?}"));
            let figure = |index: usize| row[index].parse::<f64>().ok();
            if let Some(flops) = dense_figure(figure(tensor), figure(fp16), figure(fp32)) {
                assert!(
                    (spec.dense_tflops - flops / 1e12).abs() < 0.01,
                    "{name}: {} vs {flops}",
                    spec.dense_tflops
                );
            }
            if let Some(bytes) = figure(memory) {
                assert_eq!(spec.memory_mib, (bytes / 1e9 * 1024.0).round() as u32, "{name}");
            }
            if let Some(rate) = figure(bandwidth) {
                assert_eq!(spec.memory_bandwidth_gb_s, (rate / 1e9).round() as u32, "{name}");
            }
            if let Some(watts) = figure(tdp) {
                assert_eq!(spec.tdp_w, watts.round() as u32, "{name}");
            }
            checked += 1;
        }
        assert!(checked >= 9, "only {checked} rows name a source row");
    }

    /// The catalog's dense 16-bit figure from a source's columns (the header comment's rule):
    /// the tensor figure, else the larger of FP16 and FP32.
    fn dense_figure(tensor: Option<f64>, fp16: Option<f64>, fp32: Option<f64>) -> Option<f64> {
        let larger = match (fp16, fp32) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        tensor.or(larger)
    }

    /// The records of a CSV text whose quoted fields may hold commas, `""` and newlines.
    fn csv_records(text: &str) -> Vec<Vec<String>> {
        let mut records = vec![vec![String::new()]];
        let mut quoted = false;
        let mut chars = text.chars().peekable();
        while let Some(c) = chars.next() {
            let record = records.last_mut().expect("never empty");
            match c {
                '"' if quoted && chars.peek() == Some(&'"') => {
                    chars.next();
                    record.last_mut().expect("never empty").push('"');
                }
                '"' => quoted = !quoted,
                ',' if !quoted => record.push(String::new()),
                '\n' if !quoted => records.push(vec![String::new()]),
                '\r' if !quoted => {}
                _ => record.last_mut().expect("never empty").push(c),
            }
        }
        records
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
