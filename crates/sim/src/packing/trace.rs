//! Readers for the openb node list and pod list (plain CSV or `.csv.xz`), with errors that name file, line and column.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::cluster::{GPUS_PER_NODE_MAX, MILLI_PER_GPU};

/// One node of the node list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeRecord {
    pub name: String,
    pub cpu_milli: u32,
    pub memory_mib: u64,
    pub gpu_count: u8,
    /// GPU model name; empty for CPU-only nodes.
    pub model: String,
}

/// One pod of the pod list: what it requests, nothing about time.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PodRecord {
    pub cpu_milli: u32,
    pub memory_mib: u64,
    pub gpu_count: u8,
    /// Milli-GPU per GPU: below 1000 only for a GPU-share pod (`gpu_count` == 1), 0 when `gpu_count` == 0.
    pub gpu_milli: u16,
    /// Allowed GPU models; empty = any.
    pub gpu_spec: Vec<String>,
}

impl PodRecord {
    pub fn gpu_milli_total(&self) -> u64 {
        u64::from(self.gpu_count) * u64::from(self.gpu_milli)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("{path}: cannot read: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: not a valid xz file: {reason}")]
    Xz { path: PathBuf, reason: String },
    #[error("{path}: line {line}: {reason}")]
    Csv { path: PathBuf, line: u64, reason: String },
    #[error("{path}: the header lacks the column `{column}` (header: {header})")]
    MissingColumn {
        path: PathBuf,
        column: &'static str,
        header: String,
    },
    #[error("{path}: line {line}: column `{column}` is missing (the row has {fields} fields)")]
    ShortRow {
        path: PathBuf,
        line: u64,
        column: &'static str,
        fields: usize,
    },
    #[error("{path}: line {line}: column `{column}`: {reason} (value {value:?})")]
    BadValue {
        path: PathBuf,
        line: u64,
        column: &'static str,
        value: String,
        reason: String,
    },
    #[error("{path}: no rows after the header; the file is empty")]
    Empty { path: PathBuf },
}

/// Reads a whole file, decompressing it when its name ends in `.xz`.
pub(crate) fn read_text(path: &Path) -> Result<Vec<u8>, TraceError> {
    let raw = std::fs::read(path).map_err(|source| TraceError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    if path.extension().is_some_and(|extension| extension == "xz") {
        let mut decompressed = Vec::new();
        lzma_rs::xz_decompress(&mut raw.as_slice(), &mut decompressed).map_err(|error| TraceError::Xz {
            path: path.to_path_buf(),
            reason: format!("{error:?}"),
        })?;
        Ok(decompressed)
    } else {
        Ok(raw)
    }
}

/// Maps the column names a reader needs to their positions in the header.
struct Columns {
    path: PathBuf,
    index: HashMap<&'static str, usize>,
}

impl Columns {
    fn new(
        path: &Path,
        header: &csv::StringRecord,
        required: &[&'static str],
        optional: &[&'static str],
    ) -> Result<Columns, TraceError> {
        let mut index = HashMap::new();
        let header_text = header.iter().collect::<Vec<_>>().join(",");
        for &column in required.iter().chain(optional) {
            match header.iter().position(|name| name.trim() == column) {
                Some(position) => {
                    index.insert(column, position);
                }
                None if required.contains(&column) => {
                    return Err(TraceError::MissingColumn {
                        path: path.to_path_buf(),
                        column,
                        header: header_text,
                    });
                }
                None => {}
            }
        }
        Ok(Columns {
            path: path.to_path_buf(),
            index,
        })
    }

    fn has(&self, column: &'static str) -> bool {
        self.index.contains_key(column)
    }

    fn text<'r>(&self, record: &'r csv::StringRecord, line: u64, column: &'static str) -> Result<&'r str, TraceError> {
        let position = self.index[column];
        record.get(position).map(str::trim).ok_or_else(|| TraceError::ShortRow {
            path: self.path.clone(),
            line,
            column,
            fields: record.len(),
        })
    }

    fn number<T: std::str::FromStr>(
        &self,
        record: &csv::StringRecord,
        line: u64,
        column: &'static str,
    ) -> Result<T, TraceError> {
        let text = self.text(record, line, column)?;
        text.parse::<T>()
            .map_err(|_| self.bad(line, column, text, "not a non-negative integer"))
    }

    fn bad(&self, line: u64, column: &'static str, value: &str, reason: &str) -> TraceError {
        TraceError::BadValue {
            path: self.path.clone(),
            line,
            column,
            value: value.to_string(),
            reason: reason.to_string(),
        }
    }
}

/// Iterates the data rows of a CSV text, with their line numbers (1-based, header = line 1).
fn for_each_row(
    path: &Path,
    text: &[u8],
    required: &[&'static str],
    optional: &[&'static str],
    mut visit: impl FnMut(&Columns, &csv::StringRecord, u64) -> Result<(), TraceError>,
) -> Result<usize, TraceError> {
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(true)
        .flexible(true)
        .from_reader(text);
    let csv_error = |error: csv::Error| TraceError::Csv {
        path: path.to_path_buf(),
        line: error.position().map_or(0, csv::Position::line),
        reason: error.to_string(),
    };
    let header = reader.headers().map_err(csv_error)?.clone();
    if header.is_empty() || header.iter().all(|field| field.trim().is_empty()) {
        return Err(TraceError::Empty {
            path: path.to_path_buf(),
        });
    }
    let columns = Columns::new(path, &header, required, optional)?;
    let mut rows = 0;
    for record in reader.records() {
        let record = record.map_err(csv_error)?;
        let line = record.position().map_or(0, csv::Position::line);
        if record.iter().all(|field| field.trim().is_empty()) {
            continue;
        }
        visit(&columns, &record, line)?;
        rows += 1;
    }
    if rows == 0 {
        return Err(TraceError::Empty {
            path: path.to_path_buf(),
        });
    }
    Ok(rows)
}

/// Reads a node list (`sn,cpu_milli,memory_mib,gpu,model`).
pub fn read_nodes(path: &Path) -> Result<Vec<NodeRecord>, TraceError> {
    let text = read_text(path)?;
    parse_nodes(path, &text)
}

pub fn parse_nodes(path: &Path, text: &[u8]) -> Result<Vec<NodeRecord>, TraceError> {
    let mut nodes = Vec::new();
    for_each_row(
        path,
        text,
        &["sn", "cpu_milli", "memory_mib", "gpu"],
        &["model"],
        |columns, record, line| {
            let gpu_count: u8 = columns.number(record, line, "gpu")?;
            if usize::from(gpu_count) > GPUS_PER_NODE_MAX {
                return Err(columns.bad(
                    line,
                    "gpu",
                    &gpu_count.to_string(),
                    &format!("more than {GPUS_PER_NODE_MAX} GPUs on one node"),
                ));
            }
            let model = if columns.has("model") {
                columns.text(record, line, "model")?.to_string()
            } else {
                String::new()
            };
            nodes.push(NodeRecord {
                name: columns.text(record, line, "sn")?.to_string(),
                cpu_milli: columns.number(record, line, "cpu_milli")?,
                memory_mib: columns.number(record, line, "memory_mib")?,
                gpu_count,
                model,
            });
            Ok(())
        },
    )?;
    Ok(nodes)
}

/// Reads a pod list, in its 11-column form or its 5-column form (`name,cpu_milli,memory_mib,num_gpu,gpu_milli`).
pub fn read_pods(path: &Path) -> Result<Vec<PodRecord>, TraceError> {
    let text = read_text(path)?;
    parse_pods(path, &text)
}

pub fn parse_pods(path: &Path, text: &[u8]) -> Result<Vec<PodRecord>, TraceError> {
    let mut pods = Vec::new();
    for_each_row(
        path,
        text,
        &["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"],
        &["gpu_spec"],
        |columns, record, line| {
            let cpu_milli: u32 = columns.number(record, line, "cpu_milli")?;
            let memory_mib: u64 = columns.number(record, line, "memory_mib")?;
            let gpu_count: u8 = columns.number(record, line, "num_gpu")?;
            let gpu_milli_text = columns.text(record, line, "gpu_milli")?;
            let gpu_milli: u16 = columns.number(record, line, "gpu_milli")?;
            if u32::from(gpu_milli) > MILLI_PER_GPU {
                return Err(columns.bad(line, "gpu_milli", gpu_milli_text, "above 1000 milli-GPU per GPU"));
            }
            if usize::from(gpu_count) > GPUS_PER_NODE_MAX {
                return Err(columns.bad(
                    line,
                    "num_gpu",
                    &gpu_count.to_string(),
                    &format!("more than {GPUS_PER_NODE_MAX} GPUs, no node has that many"),
                ));
            }
            if gpu_count > 1 && u32::from(gpu_milli) != MILLI_PER_GPU {
                return Err(columns.bad(
                    line,
                    "gpu_milli",
                    gpu_milli_text,
                    "a pod with more than one GPU must take whole GPUs (1000)",
                ));
            }
            if gpu_count == 0 && gpu_milli != 0 {
                return Err(columns.bad(
                    line,
                    "gpu_milli",
                    gpu_milli_text,
                    "num_gpu is 0, so gpu_milli must be 0",
                ));
            }
            if gpu_count > 0 && gpu_milli == 0 {
                return Err(columns.bad(
                    line,
                    "gpu_milli",
                    gpu_milli_text,
                    "num_gpu is above 0, so gpu_milli must be above 0",
                ));
            }
            let gpu_spec = if columns.has("gpu_spec") {
                columns
                    .text(record, line, "gpu_spec")?
                    .split('|')
                    .map(str::trim)
                    .filter(|model| !model.is_empty())
                    .map(str::to_string)
                    .collect()
            } else {
                Vec::new()
            };
            pods.push(PodRecord {
                cpu_milli,
                memory_mib,
                gpu_count,
                gpu_milli,
                gpu_spec,
            });
            Ok(())
        },
    )?;
    Ok(pods)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pods(text: &str) -> Result<Vec<PodRecord>, String> {
        parse_pods(Path::new("pods.csv"), text.as_bytes()).map_err(|error| error.to_string())
    }

    #[test]
    fn reads_the_eleven_column_form() {
        let text = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n\
                    p0,12000,16384,1,1000,,LS,Running,0,10,0\n\
                    p1,6000,12288,1,460,V100M16|V100M32,LS,Running,1,20,\n\
                    p2,8000,30517,0,0,,BE,Running,2,30,2\n";
        let read = pods(text).expect("valid");
        assert_eq!(read.len(), 3);
        assert_eq!(read[1].gpu_milli, 460);
        assert_eq!(read[1].gpu_spec, vec!["V100M16", "V100M32"]);
        assert_eq!(read[2].gpu_milli_total(), 0);
    }

    #[test]
    fn reads_the_five_column_form() {
        let read = pods("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,4000,1024,8,1000\n").expect("valid");
        assert_eq!(
            read,
            vec![PodRecord {
                cpu_milli: 4000,
                memory_mib: 1024,
                gpu_count: 8,
                gpu_milli: 1000,
                gpu_spec: vec![]
            }]
        );
    }

    #[test]
    fn bad_input_names_file_line_and_column() {
        let missing = pods("name,cpu_milli,memory_mib,num_gpu\np0,1,1,0\n").unwrap_err();
        assert!(
            missing.contains("pods.csv") && missing.contains("gpu_milli"),
            "{missing}"
        );

        let short = pods("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1,1,0,0\np1,1,1\n").unwrap_err();
        assert!(short.contains("line 3") && short.contains("num_gpu"), "{short}");

        let not_number = pods("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,lots,1,0,0\n").unwrap_err();
        assert!(
            not_number.contains("line 2") && not_number.contains("cpu_milli"),
            "{not_number}"
        );

        let multi_share = pods("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1,1,2,500\n").unwrap_err();
        assert!(
            multi_share.contains("line 2") && multi_share.contains("gpu_milli"),
            "{multi_share}"
        );

        let above = pods("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1,1,2,2000\n").unwrap_err();
        assert!(above.contains("above 1000"), "{above}");

        assert!(pods("").unwrap_err().contains("empty"));
        assert!(
            pods("name,cpu_milli,memory_mib,num_gpu,gpu_milli\n")
                .unwrap_err()
                .contains("empty")
        );
    }

    #[test]
    fn reads_nodes_and_rejects_bad_ones() {
        let path = Path::new("nodes.csv");
        let nodes = parse_nodes(
            path,
            b"sn,cpu_milli,memory_mib,gpu,model\nn0,96000,393216,8,G2\nn1,32000,1024,0,\n",
        )
        .expect("valid");
        assert_eq!(nodes[0].gpu_count, 8);
        assert_eq!(nodes[1].model, "");
        let error = parse_nodes(path, b"sn,cpu_milli,memory_mib,gpu,model\nn0,96000,393216,9,G2\n")
            .unwrap_err()
            .to_string();
        assert!(error.contains("line 2") && error.contains("`gpu`"), "{error}");
    }

    #[test]
    fn missing_file_is_an_error_not_a_panic() {
        let error = read_pods(Path::new("no/such/file.csv.xz")).unwrap_err().to_string();
        assert!(error.contains("no/such/file.csv.xz"), "{error}");
    }
}
