//! GPU detection. `nvidia-smi --query-gpu` reports each GPU's model, UUID, memory, driver, PCI
//! id, VBIOS, temperature, power and utilisation; the model is mapped to Fallow's catalog name.
//! Without GPUs the agent offers none unless told to simulate some (`MODEL:COUNT[,…]`), and a
//! simulated node says so everywhere.

use api::GpuTelemetry;
use trust::GpuIdentity;

/// The fields asked of `nvidia-smi`, in this order.
pub const SMI_FIELDS: &str = "index,uuid,name,memory.total,driver_version,pci.bus_id,vbios_version,temperature.gpu,power.draw,utilization.gpu,memory.used";

/// One GPU as detected (or simulated).
#[derive(Clone, Debug, PartialEq)]
pub struct Gpu {
    pub index: u8,
    pub uuid: String,
    /// The name the driver reports, e.g. "NVIDIA H100 80GB HBM3".
    pub name: String,
    pub memory_mib: u64,
    pub driver: String,
    pub pci_bus_id: String,
    pub vbios: String,
    pub temperature_c: f64,
    pub power_w: f64,
    pub utilisation_pct: f64,
    pub memory_used_mib: u64,
}

/// What the node offers: its GPUs, all of one catalog model, real or simulated.
#[derive(Clone, Debug, PartialEq)]
pub struct Inventory {
    pub gpus: Vec<Gpu>,
    /// The catalog name, e.g. "H100-SXM5".
    pub model: String,
    pub simulated: bool,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum GpuError {
    #[error("no NVIDIA GPU found ({0}); to offer simulated GPUs start the agent with --simulate-gpus MODEL:COUNT")]
    NoneFound(String),
    #[error("nvidia-smi output line {line}: {message}")]
    BadSmiOutput { line: usize, message: String },
    #[error("GPU {0:?} is not in Fallow's GPU catalog")]
    UnknownModel(String),
    #[error("this node's GPUs are of several models ({0}); run one agent per model")]
    MixedModels(String),
    #[error("--simulate-gpus {0:?}: {1}")]
    BadSimulation(String, String),
}

fn number<T: std::str::FromStr>(text: &str) -> Option<T> {
    text.trim().parse().ok()
}

/// Parses `nvidia-smi --query-gpu=SMI_FIELDS --format=csv,noheader,nounits`. Readings the
/// driver does not have ("[N/A]") are zero.
pub fn parse_smi(text: &str) -> Result<Vec<Gpu>, GpuError> {
    let mut gpus = Vec::new();
    for (number_of_line, line) in text.lines().enumerate().filter(|(_, line)| !line.trim().is_empty()) {
        let line_no = number_of_line + 1;
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        if fields.len() != 11 {
            return Err(GpuError::BadSmiOutput {
                line: line_no,
                message: format!("{} fields, expected 11", fields.len()),
            });
        }
        let bad = |what: &str| GpuError::BadSmiOutput {
            line: line_no,
            message: format!("{what} is not a number"),
        };
        gpus.push(Gpu {
            index: number(fields[0]).ok_or_else(|| bad("index"))?,
            uuid: fields[1].to_string(),
            name: fields[2].to_string(),
            memory_mib: number(fields[3]).ok_or_else(|| bad("memory.total"))?,
            driver: fields[4].to_string(),
            pci_bus_id: fields[5].to_string(),
            vbios: fields[6].to_string(),
            temperature_c: number(fields[7]).unwrap_or(0.0),
            power_w: number(fields[8]).unwrap_or(0.0),
            utilisation_pct: number(fields[9]).unwrap_or(0.0),
            memory_used_mib: number(fields[10]).unwrap_or(0),
        });
    }
    Ok(gpus)
}

/// Fallow's catalog name for a driver-reported GPU name, e.g. "NVIDIA H100 80GB HBM3" →
/// "H100-SXM5"; `None` for a GPU the catalog does not know.
pub fn catalog_model(name: &str, memory_mib: u64) -> Option<&'static str> {
    let upper = name.to_uppercase();
    let words: Vec<&str> = upper
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|word| !word.is_empty())
        .collect();
    let has = |word: &str| words.contains(&word);
    let pcie = has("PCIE");
    let big = memory_mib > 60 * 1024;
    let model = if has("GB200") {
        "GB200"
    } else if has("GH200") {
        "GH200"
    } else if has("B200") {
        "B200"
    } else if has("H200") {
        "H200-SXM"
    } else if has("H100") && has("NVL") {
        "H100-NVL"
    } else if has("H100") {
        if pcie { "H100-PCIe" } else { "H100-SXM5" }
    } else if has("H800") {
        "H800-SXM5"
    } else if has("H20") {
        "H20"
    } else if has("A800") {
        "A800-SXM4-80GB"
    } else if has("A100") || words.iter().any(|word| word.starts_with("A100")) {
        match (pcie, big) {
            (true, true) => "A100-PCIe-80GB",
            (true, false) => "A100-PCIe-40GB",
            (false, true) => "A100-SXM4-80GB",
            (false, false) => "A100-SXM4-40GB",
        }
    } else if has("MI300X") {
        "MI300X"
    } else if has("4090") {
        "RTX-4090"
    } else if has("3090") {
        "RTX-3090"
    } else if has("L40") || has("L40S") {
        "L40"
    } else if has("L4") {
        "L4"
    } else if has("A40") {
        "A40"
    } else if has("A10") {
        "A10"
    } else if has("V100") {
        if memory_mib > 20 * 1024 {
            "V100-SXM2-32GB"
        } else {
            "V100-SXM2-16GB"
        }
    } else if has("P100") {
        "P100-PCIe-16GB"
    } else if has("P40") {
        "P40"
    } else if has("T4") {
        "T4"
    } else {
        return None;
    };
    Some(model)
}

/// Asks `nvidia-smi` for the GPUs; an error when it is missing, fails or finds none.
pub fn detect() -> Result<Vec<Gpu>, GpuError> {
    let output = std::process::Command::new("nvidia-smi")
        .arg(format!("--query-gpu={SMI_FIELDS}"))
        .arg("--format=csv,noheader,nounits")
        .output()
        .map_err(|error| GpuError::NoneFound(format!("nvidia-smi: {error}")))?;
    if !output.status.success() {
        return Err(GpuError::NoneFound(format!(
            "nvidia-smi failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    let gpus = parse_smi(&String::from_utf8_lossy(&output.stdout))?;
    if gpus.is_empty() {
        return Err(GpuError::NoneFound("nvidia-smi lists none".into()));
    }
    Ok(gpus)
}

/// The inventory of detected GPUs: one catalog model for all.
pub fn inventory_of(gpus: Vec<Gpu>) -> Result<Inventory, GpuError> {
    let mut models: Vec<&'static str> = Vec::new();
    for gpu in &gpus {
        let model = catalog_model(&gpu.name, gpu.memory_mib).ok_or_else(|| GpuError::UnknownModel(gpu.name.clone()))?;
        if !models.contains(&model) {
            models.push(model);
        }
    }
    match models.as_slice() {
        [] => Err(GpuError::NoneFound("no GPU listed".into())),
        [model] => Ok(Inventory {
            model: (*model).to_string(),
            gpus,
            simulated: false,
        }),
        _ => Err(GpuError::MixedModels(models.join(", "))),
    }
}

/// Simulated GPUs from `MODEL:COUNT` (one model; a node is of one model). `known` says whether
/// a catalog name exists.
pub fn simulated(text: &str, known: impl Fn(&str) -> bool) -> Result<Inventory, GpuError> {
    let bad = |message: &str| GpuError::BadSimulation(text.to_string(), message.to_string());
    let (model, count) = text
        .split_once(':')
        .ok_or_else(|| bad("write MODEL:COUNT, e.g. H100-SXM5:8"))?;
    let count: u8 = count
        .trim()
        .parse()
        .ok()
        .filter(|count| (1..=16).contains(count))
        .ok_or_else(|| bad("COUNT is 1–16"))?;
    let model = model.trim();
    if !known(model) {
        return Err(bad("MODEL is not a catalog name (e.g. H100-SXM5, H200-SXM, RTX-4090)"));
    }
    let gpus = (0..count)
        .map(|index| Gpu {
            index,
            uuid: format!("SIMULATED-{model}-{index}"),
            name: format!("simulated {model}"),
            memory_mib: 0,
            driver: "simulated".to_string(),
            pci_bus_id: format!("simulated:{index}"),
            vbios: "simulated".to_string(),
            temperature_c: 0.0,
            power_w: 0.0,
            utilisation_pct: 0.0,
            memory_used_mib: 0,
        })
        .collect();
    Ok(Inventory {
        gpus,
        model: model.to_string(),
        simulated: true,
    })
}

impl Inventory {
    /// The hardware fingerprint: a digest of the GPUs' UUIDs, PCI ids, VBIOS and driver.
    pub fn fingerprint(&self) -> String {
        let identities: Vec<GpuIdentity> = self
            .gpus
            .iter()
            .map(|gpu| GpuIdentity {
                uuid: gpu.uuid.clone(),
                pci_bus_id: gpu.pci_bus_id.clone(),
                vbios: gpu.vbios.clone(),
                driver: gpu.driver.clone(),
                model: gpu.name.clone(),
                memory_mib: gpu.memory_mib,
            })
            .collect();
        trust::fingerprint(&identities)
    }

    pub fn telemetry(&self) -> Vec<GpuTelemetry> {
        self.gpus
            .iter()
            .map(|gpu| GpuTelemetry {
                index: gpu.index,
                temperature_c: gpu.temperature_c,
                power_w: gpu.power_w,
                utilisation_pct: gpu.utilisation_pct,
                memory_used_mib: gpu.memory_used_mib,
            })
            .collect()
    }

    /// Whether a GPU runs hotter than `thermal_limit_c` or draws more than `power_limit_w`
    /// (the provider's limits): the node then says so in its heartbeats.
    pub fn over_limit(&self, thermal_limit_c: Option<u16>, power_limit_w: Option<u32>) -> bool {
        self.gpus.iter().any(|gpu| {
            thermal_limit_c.is_some_and(|limit| gpu.temperature_c > f64::from(limit))
                || power_limit_w.is_some_and(|limit| gpu.power_w > f64::from(limit))
        })
    }

    /// Fresh readings for real GPUs (simulated ones stay as they are).
    pub fn refresh(&mut self) {
        if self.simulated {
            return;
        }
        if let Ok(gpus) = detect()
            && gpus.len() == self.gpus.len()
        {
            self.gpus = gpus;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMI: &str = "\
0, GPU-4b6c1e7a-0000-1111-2222-333344445555, NVIDIA H100 80GB HBM3, 81559, 550.54.15, 00000000:18:00.0, 96.00.99.00.01, 34, 71.52, 0, 1
1, GPU-8d2f9a10-0000-1111-2222-333344445555, NVIDIA H100 80GB HBM3, 81559, 550.54.15, 00000000:2A:00.0, 96.00.99.00.01, [N/A], [N/A], 12, 40960
";

    #[test]
    fn nvidia_smi_output_is_read_field_by_field() {
        let gpus = parse_smi(SMI).unwrap();
        assert_eq!(gpus.len(), 2);
        assert_eq!(gpus[0].uuid, "GPU-4b6c1e7a-0000-1111-2222-333344445555");
        assert_eq!(
            (gpus[0].memory_mib, gpus[0].temperature_c, gpus[0].power_w),
            (81_559, 34.0, 71.52)
        );
        assert_eq!((gpus[1].index, gpus[1].pci_bus_id.as_str()), (1, "00000000:2A:00.0"));
        assert_eq!(
            (gpus[1].temperature_c, gpus[1].memory_used_mib),
            (0.0, 40_960),
            "[N/A] reads as zero"
        );
        let inventory = inventory_of(gpus).unwrap();
        assert_eq!((inventory.model.as_str(), inventory.simulated), ("H100-SXM5", false));
        assert_eq!(
            parse_smi("0, GPU-x, NVIDIA H100, 81559\n"),
            Err(GpuError::BadSmiOutput {
                line: 1,
                message: "4 fields, expected 11".into()
            })
        );
        assert!(matches!(
            parse_smi(&SMI.replace("81559", "lots")),
            Err(GpuError::BadSmiOutput { line: 1, .. })
        ));
    }

    #[test]
    fn a_gpu_over_the_providers_thermal_or_power_limit_puts_the_node_over_its_limit() {
        let inventory = inventory_of(parse_smi(SMI).unwrap()).unwrap();
        assert!(!inventory.over_limit(None, None), "no limits, never over");
        assert!(!inventory.over_limit(Some(34), Some(72)), "at the limit is not over it");
        assert!(inventory.over_limit(Some(33), None), "34 °C against 33");
        assert!(inventory.over_limit(None, Some(71)), "71.52 W against 71");
    }

    #[test]
    fn driver_names_map_to_catalog_models() {
        for (name, memory_mib, model) in [
            ("NVIDIA H100 80GB HBM3", 81_559, Some("H100-SXM5")),
            ("NVIDIA H100 PCIe", 81_559, Some("H100-PCIe")),
            ("NVIDIA H100 NVL", 95_830, Some("H100-NVL")),
            ("NVIDIA H200", 143_771, Some("H200-SXM")),
            ("NVIDIA GH200 480GB", 97_871, Some("GH200")),
            ("NVIDIA H20", 97_871, Some("H20")),
            ("NVIDIA A100-SXM4-80GB", 81_920, Some("A100-SXM4-80GB")),
            ("NVIDIA A100-PCIE-40GB", 40_960, Some("A100-PCIe-40GB")),
            ("NVIDIA GeForce RTX 4090", 24_564, Some("RTX-4090")),
            ("NVIDIA L4", 23_034, Some("L4")),
            ("NVIDIA L40S", 46_068, Some("L40")),
            ("Tesla T4", 15_360, Some("T4")),
            ("Tesla V100-SXM2-32GB", 32_768, Some("V100-SXM2-32GB")),
            ("NVIDIA GeForce GTX 1080", 8_192, None),
        ] {
            assert_eq!(catalog_model(name, memory_mib), model, "{name}");
        }
    }

    #[test]
    fn simulated_gpus_are_labelled_and_checked() {
        let known = |name: &str| name == "H100-SXM5";
        let inventory = simulated("H100-SXM5:4", known).unwrap();
        assert!(inventory.simulated);
        assert_eq!(inventory.gpus.len(), 4);
        assert!(inventory.gpus.iter().all(|gpu| gpu.uuid.starts_with("SIMULATED-")));
        assert_ne!(
            inventory.fingerprint(),
            simulated("H100-SXM5:3", known).unwrap().fingerprint(),
            "a GPU more or less changes the fingerprint"
        );
        for bad in ["H100-SXM5", "H100-SXM5:0", "H100-SXM5:17", "H100-SXM5:x", "B300:8"] {
            assert!(simulated(bad, known).is_err(), "{bad}");
        }
    }
}
