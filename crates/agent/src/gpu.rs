//! GPU detection. NVML (the driver's library, loaded at run time) reports each GPU's model, UUID,
//! memory, driver, PCI id, VBIOS, temperature, power and utilisation; where NVML cannot be used,
//! `nvidia-smi --query-gpu` reports the same. The model is mapped to Fallow's catalog name.
//! Without GPUs the agent offers none unless told to simulate some (`MODEL:COUNT[,…]`), and a
//! simulated node says so everywhere. NVML also says how the GPUs are joined (NVLink, a
//! multi-node fabric), from which `topology` decides the node's NVLink domain.

use std::mem::MaybeUninit;
use std::sync::OnceLock;

use api::GpuTelemetry;
use nvml_wrapper::enum_wrappers::device::{P2pCapabilitiesIndex, P2pStatus, TemperatureSensor};
use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};
use nvml_wrapper::{Device, Nvml};
use trust::GpuIdentity;

use crate::topology::{FabricInfo, FabricState, GpuFabric, NvlinkReadings};

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

/// Which source found a node's GPUs; the heartbeat re-reads them through the same one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DetectedBy {
    Nvml,
    NvidiaSmi,
    Simulated,
}

impl DetectedBy {
    pub fn as_str(self) -> &'static str {
        match self {
            DetectedBy::Nvml => "nvml",
            DetectedBy::NvidiaSmi => "nvidia-smi",
            DetectedBy::Simulated => "simulated",
        }
    }
}

impl std::fmt::Display for DetectedBy {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(self.as_str())
    }
}

/// The GPUs one source found.
#[derive(Clone, Debug, PartialEq)]
pub struct Detected {
    pub gpus: Vec<Gpu>,
    pub detected_by: DetectedBy,
}

/// What the node offers: its GPUs, all of one catalog model, real or simulated.
#[derive(Clone, Debug, PartialEq)]
pub struct Inventory {
    pub gpus: Vec<Gpu>,
    /// The catalog name, e.g. "H100-SXM5".
    pub model: String,
    pub simulated: bool,
    pub detected_by: DetectedBy,
    /// The catalog model of the simulated physical device (what a canary runs on and paces
    /// itself like); `None` for real GPUs. An honest agent's is its `model`, the claim it
    /// registers.
    pub simulated_device: Option<String>,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum GpuError {
    #[error("no NVIDIA GPU found ({0}); to offer simulated GPUs start the agent with --simulate-gpus MODEL:COUNT")]
    NoneFound(String),
    #[error("NVML: {0}")]
    Nvml(String),
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
            pci_bus_id: normalise_pci_bus_id(fields[5]),
            vbios: fields[6].to_string(),
            temperature_c: number(fields[7]).unwrap_or(0.0),
            power_w: number(fields[8]).unwrap_or(0.0),
            utilisation_pct: number(fields[9]).unwrap_or(0.0),
            memory_used_mib: number(fields[10]).unwrap_or(0),
        });
    }
    Ok(gpus)
}

/// A PCI bus id as `DDDDDDDD:BB:DD.F` in upper-case hex, the form of NVML's `busId` and of
/// `nvidia-smi --query-gpu=pci.bus_id`; a 4-digit domain, none or lower case (older drivers and
/// tools) reads the same, so the fingerprint does not depend on the source. Text of another shape
/// is kept as it is.
pub fn normalise_pci_bus_id(text: &str) -> String {
    let text = text.trim();
    let canonical = || {
        let (domain, bus, slot) = match text.split(':').collect::<Vec<_>>().as_slice() {
            [domain, bus, slot] => (*domain, *bus, *slot),
            [bus, slot] => ("0", *bus, *slot),
            _ => return None,
        };
        let (device, function) = slot.split_once('.')?;
        // Each part is hex digits only (no sign) and fits its width.
        let hex = |part: &str, max: u32| {
            let digits_only = part.chars().all(|c| c.is_ascii_hexdigit());
            u32::from_str_radix(part, 16)
                .ok()
                .filter(|number| digits_only && *number <= max)
        };
        Some(format!(
            "{:08X}:{:02X}:{:02X}.{:X}",
            hex(domain, u32::MAX)?,
            hex(bus, 0xFF)?,
            hex(device, 0xFF)?,
            hex(function, 0xF)?,
        ))
    };
    canonical().unwrap_or_else(|| text.to_string())
}

/// One GPU's readings as NVML gives them, in NVML's units. `None` is a reading NVML does not
/// have (e.g. power on some boards: `NotSupported`).
#[derive(Clone, Debug, PartialEq)]
pub struct NvmlReadings {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub memory_total_bytes: u64,
    pub memory_used_bytes: u64,
    pub driver: Option<String>,
    pub pci_bus_id: String,
    pub vbios: Option<String>,
    pub temperature_c: Option<u32>,
    pub power_mw: Option<u32>,
    pub utilisation_pct: Option<u32>,
}

/// What `nvidia-smi` prints for a reading the driver does not have; a missing VBIOS or driver
/// version reads the same from both sources, and so does the fingerprint.
const NOT_AVAILABLE: &str = "[N/A]";

/// The GPU of NVML's readings, in the units of `nvidia-smi`'s (MiB, W). Missing telemetry is zero.
pub fn gpu_from_nvml(readings: &NvmlReadings) -> Result<Gpu, GpuError> {
    const MIB: u64 = 1024 * 1024;
    let index = u8::try_from(readings.index)
        .map_err(|_| GpuError::Nvml(format!("GPU index {} is beyond 255", readings.index)))?;
    let text_or_not_available = |text: &Option<String>| text.clone().unwrap_or_else(|| NOT_AVAILABLE.to_string());
    Ok(Gpu {
        index,
        uuid: readings.uuid.clone(),
        name: readings.name.clone(),
        memory_mib: readings.memory_total_bytes / MIB,
        driver: text_or_not_available(&readings.driver),
        pci_bus_id: normalise_pci_bus_id(&readings.pci_bus_id),
        vbios: text_or_not_available(&readings.vbios),
        temperature_c: readings.temperature_c.map_or(0.0, f64::from),
        power_w: readings
            .power_mw
            .map_or(0.0, |milliwatts| f64::from(milliwatts) / 1000.0),
        utilisation_pct: readings.utilisation_pct.map_or(0.0, f64::from),
        memory_used_mib: readings.memory_used_bytes / MIB,
    })
}

/// NVML, started once per process and kept, so the heartbeat's re-reads cost no start. A failed
/// start is kept too: the node then reads its GPUs through `nvidia-smi`.
fn nvml() -> Result<&'static Nvml, GpuError> {
    static NVML: OnceLock<Result<Nvml, String>> = OnceLock::new();
    NVML.get_or_init(|| Nvml::init().map_err(|error| error.to_string()))
        .as_ref()
        .map_err(|error| GpuError::Nvml(format!("cannot start: {error}")))
}

/// Asks NVML for the GPUs; an error when the library is missing, fails or lists none.
pub fn detect_nvml() -> Result<Vec<Gpu>, GpuError> {
    let nvml = nvml()?;
    let failed = |what: String| move |error: NvmlError| GpuError::Nvml(format!("{what}: {error}"));
    let count = nvml.device_count().map_err(failed("counting GPUs".into()))?;
    if count == 0 {
        return Err(GpuError::Nvml("lists no GPU".into()));
    }
    let driver = nvml.sys_driver_version().ok();
    (0..count)
        .map(|index| {
            let device = nvml.device_by_index(index).map_err(failed(format!("GPU {index}")))?;
            let memory = device.memory_info().map_err(failed(format!("GPU {index}'s memory")))?;
            gpu_from_nvml(&NvmlReadings {
                index,
                uuid: device.uuid().map_err(failed(format!("GPU {index}'s UUID")))?,
                name: device.name().map_err(failed(format!("GPU {index}'s name")))?,
                memory_total_bytes: memory.total,
                memory_used_bytes: memory.used,
                driver: driver.clone(),
                pci_bus_id: device
                    .pci_info()
                    .map_err(failed(format!("GPU {index}'s PCI id")))?
                    .bus_id,
                vbios: device.vbios_version().ok(),
                temperature_c: device.temperature(TemperatureSensor::Gpu).ok(),
                power_mw: device.power_usage().ok(),
                utilisation_pct: device.utilization_rates().ok().map(|rates| rates.gpu),
            })
        })
        .collect()
}

/// The most NVLinks one GPU has (18 on Hopper and Blackwell: NVML's `NVML_NVLINK_MAX_LINKS`);
/// NVML is asked link by link.
const NVLINKS_PER_GPU_MAX: u32 = 18;

/// NVML's `NVML_ERROR_ARGUMENT_VERSION_MISMATCH`: the driver does not know the struct version
/// asked for (nvml-wrapper reads it as an unexpected variant).
const NVML_ERROR_ARGUMENT_VERSION_MISMATCH: u32 = 25;

/// How the node's GPUs are joined: each GPU's fabric registration, its active NVLinks and the
/// GPUs it reaches over NVLink. `None` when NVML cannot be used, lists no GPU or cannot open one;
/// a reading NVML does not have (`NotSupported` on PCIe boards) reads as none.
pub fn read_nvlink() -> Option<NvlinkReadings> {
    let nvml = nvml().ok()?;
    let count = nvml.device_count().ok().filter(|count| *count > 0)?;
    let devices = (0..count)
        .map(|index| nvml.device_by_index(index))
        .collect::<Result<Vec<_>, _>>()
        .ok()?;
    let gpus = (0..count)
        .zip(&devices)
        .map(|(index, device)| GpuFabric {
            index,
            fabric: gpu_fabric_info(device).ok(),
            nvlinks_active: nvlinks_active(device),
            nvlink_peers: (0..count)
                .zip(&devices)
                .filter(|(peer, other)| {
                    *peer != index
                        && matches!(
                            device.p2p_status(other, P2pCapabilitiesIndex::NvLink),
                            Ok(P2pStatus::Ok)
                        )
                })
                .map(|(peer, _)| peer)
                .collect(),
        })
        .collect();
    Some(NvlinkReadings { gpus })
}

/// How many of the GPU's NVLinks are up; 0 on a GPU without NVLink.
fn nvlinks_active(device: &Device<'_>) -> u32 {
    let mut active = 0;
    for link in 0..NVLINKS_PER_GPU_MAX {
        match device.link_wrapper_for(link).is_active() {
            Ok(true) => active += 1,
            Ok(false) => {}
            // No NVLink at all, or none beyond the GPU's last link.
            Err(NvmlError::NotSupported | NvmlError::InvalidArg) => break,
            Err(_) => {}
        }
    }
    active
}

/// A zeroed value of the struct an NVML getter fills, named by the getter's signature: the
/// struct types are in nvml-wrapper-sys, which nvml-wrapper does not re-export.
fn zeroed_out<Handle, Out>(_getter: &unsafe extern "C" fn(Handle, *mut Out) -> u32) -> MaybeUninit<Out> {
    MaybeUninit::zeroed()
}

/// The GPU's registration with a multi-node NVLink fabric; `NotSupported` outside one.
fn gpu_fabric_info(device: &Device<'_>) -> Result<FabricInfo, NvmlError> {
    let (cluster_uuid, clique_id, state, status) = raw_fabric_info(device)?;
    let state = match u32::from(state) {
        0 => FabricState::NotSupported,
        1 => FabricState::NotStarted,
        2 => FabricState::InProgress,
        3 => FabricState::Completed,
        other => return Err(NvmlError::UnexpectedVariant(other)),
    };
    Ok(FabricInfo {
        cluster_uuid,
        clique_id,
        state,
        status_ok: nvml_try(status).is_ok(),
    })
}

/// NVML's fabric information as it gives it (cluster UUID, clique, state, status), which
/// nvml-wrapper 0.13 does not wrap: `nvmlDeviceGetGpuFabricInfoV` (struct version 3), or the
/// older, unversioned `nvmlDeviceGetGpuFabricInfo` where the driver lacks the first or its
/// version 3.
fn raw_fabric_info(device: &Device<'_>) -> Result<([u8; 16], u32, u8, u32), NvmlError> {
    let lib = device.nvml().lib();
    if let Ok(get_fabric_info_v) = lib.nvmlDeviceGetGpuFabricInfoV.as_ref() {
        let mut info = zeroed_out(get_fabric_info_v);
        // NVML_STRUCT_VERSION(GpuFabricInfo, 3): the struct's size, the version in the top byte.
        let version = u32::try_from(size_of_val(&info)).expect("a struct of some 40 bytes") | (3 << 24);
        // SAFETY: `device` borrows the NVML that loaded this symbol, so its handle is live;
        // `info` is a zeroed struct of the type the symbol's signature names (C integers and
        // arrays, for which zero bytes are a value), its version set first as NVML requires;
        // NVML writes only within it.
        let (code, info) = unsafe {
            (*info.as_mut_ptr()).version = version;
            let code = get_fabric_info_v(device.handle(), info.as_mut_ptr());
            (code, info.assume_init())
        };
        if code != NVML_ERROR_ARGUMENT_VERSION_MISMATCH {
            nvml_try(code)?;
            return Ok((info.clusterUuid, info.cliqueId, info.state, info.status));
        }
    }
    let get_fabric_info = nvml_sym(lib.nvmlDeviceGetGpuFabricInfo.as_ref())?;
    let mut info = zeroed_out(get_fabric_info);
    // SAFETY: as above; this struct has no version.
    let (code, info) = unsafe {
        let code = get_fabric_info(device.handle(), info.as_mut_ptr());
        (code, info.assume_init())
    };
    nvml_try(code)?;
    Ok((info.clusterUuid, info.cliqueId, info.state, info.status))
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
    let model = if has("GB300") {
        "GB300"
    } else if has("B300") {
        "B300"
    } else if has("GB200") {
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
    } else if has("MI325X") {
        "MI325X"
    } else if has("MI355X") {
        "MI355X"
    } else if has("PRO") && has("6000") && has("BLACKWELL") {
        "RTX-PRO-6000"
    } else if has("5090") {
        "RTX-5090"
    } else if has("4090") {
        "RTX-4090"
    } else if has("3090") {
        "RTX-3090"
    } else if has("L40S") {
        "L40S"
    } else if has("L40") {
        "L40"
    } else if has("L20") {
        "L20"
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

/// Asks NVML for the GPUs, then `nvidia-smi` where NVML cannot answer; `NoneFound` with both
/// reasons when neither finds any. Logs which source found them.
pub fn detect() -> Result<Detected, GpuError> {
    let nvml_error = match detect_nvml() {
        Ok(gpus) => {
            tracing::info!(detected_by = %DetectedBy::Nvml, gpus = gpus.len(), "detected the node's GPUs");
            return Ok(Detected {
                gpus,
                detected_by: DetectedBy::Nvml,
            });
        }
        Err(error) => error,
    };
    match detect_smi() {
        Ok(gpus) => {
            tracing::info!(
                detected_by = %DetectedBy::NvidiaSmi,
                gpus = gpus.len(),
                nvml = %nvml_error,
                "detected the node's GPUs"
            );
            Ok(Detected {
                gpus,
                detected_by: DetectedBy::NvidiaSmi,
            })
        }
        Err(GpuError::NoneFound(smi_reason)) => Err(GpuError::NoneFound(format!("{nvml_error}; {smi_reason}"))),
        Err(smi_error) => Err(GpuError::NoneFound(format!("{nvml_error}; {smi_error}"))),
    }
}

/// Asks `nvidia-smi` for the GPUs; an error when it is missing, fails or finds none.
pub fn detect_smi() -> Result<Vec<Gpu>, GpuError> {
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
pub fn inventory_of(detected: Detected) -> Result<Inventory, GpuError> {
    let Detected { gpus, detected_by } = detected;
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
            detected_by,
            simulated_device: None,
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
        return Err(bad(&format!(
            "MODEL is not a catalog name: {}",
            model::GpuCatalog::embedded().unknown(model)
        )));
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
        detected_by: DetectedBy::Simulated,
        simulated_device: Some(model.to_string()),
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

    /// The mean utilisation of GPUs `indices` in their latest readings, per mille (0–1000);
    /// 0 when none of them is known. Simulated GPUs read 0.
    pub fn utilisation_permille(&self, indices: &[u8]) -> i64 {
        let readings: Vec<f64> = self
            .gpus
            .iter()
            .filter(|gpu| indices.contains(&gpu.index))
            .map(|gpu| gpu.utilisation_pct.clamp(0.0, 100.0))
            .collect();
        if readings.is_empty() {
            return 0;
        }
        let mean_pct = readings.iter().sum::<f64>() / readings.len() as f64;
        (mean_pct * 10.0).round() as i64
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

    /// Fresh readings for real GPUs, from the source that found them (simulated ones stay as
    /// they are). A failed or different reading keeps the last one.
    pub fn refresh(&mut self) {
        if self.simulated {
            return;
        }
        let fresh = match self.detected_by {
            DetectedBy::Simulated => return,
            DetectedBy::Nvml => detect_nvml(),
            DetectedBy::NvidiaSmi => detect_smi(),
        };
        if let Ok(gpus) = fresh
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

    fn smi_inventory(text: &str) -> Inventory {
        inventory_of(Detected {
            gpus: parse_smi(text).unwrap(),
            detected_by: DetectedBy::NvidiaSmi,
        })
        .unwrap()
    }

    /// NVML's readings of the GPUs in `SMI`.
    fn nvml_readings() -> Vec<NvmlReadings> {
        let gpu = |index: u32, uuid: &str, pci_bus_id: &str| NvmlReadings {
            index,
            uuid: uuid.to_string(),
            name: "NVIDIA H100 80GB HBM3".to_string(),
            memory_total_bytes: 81_559 * 1024 * 1024,
            memory_used_bytes: 1024 * 1024,
            driver: Some("550.54.15".to_string()),
            pci_bus_id: pci_bus_id.to_string(),
            vbios: Some("96.00.99.00.01".to_string()),
            temperature_c: Some(34),
            power_mw: Some(71_520),
            utilisation_pct: Some(0),
        };
        vec![
            gpu(0, "GPU-4b6c1e7a-0000-1111-2222-333344445555", "00000000:18:00.0"),
            gpu(1, "GPU-8d2f9a10-0000-1111-2222-333344445555", "00000000:2A:00.0"),
        ]
    }

    #[test]
    fn pci_bus_ids_read_the_same_whatever_the_source() {
        let check = |text: &str, expect: &str| assert_eq!(normalise_pci_bus_id(text), expect, "{text:?}");
        check("00000000:3B:00.0", "00000000:3B:00.0");
        check("00000000:3b:00.0", "00000000:3B:00.0");
        check("0000:3B:00.0", "00000000:3B:00.0");
        check("3b:00.0", "00000000:3B:00.0");
        check(" 00000001:c1:1f.7 ", "00000001:C1:1F.7");
        check("simulated:0", "simulated:0");
        check("[N/A]", "[N/A]");
        check("0000:3B:100.0", "0000:3B:100.0");
        check("", "");
        assert_eq!(
            parse_smi(&SMI.replace("00000000:2A:00.0", "0000:2a:00.0")).unwrap()[1].pci_bus_id,
            "00000000:2A:00.0",
            "nvidia-smi's ids are normalised too"
        );
    }

    #[test]
    fn nvml_readings_become_gpus_in_nvidia_smis_units() {
        let mut readings = nvml_readings().remove(1);
        let gpu = gpu_from_nvml(&readings).unwrap();
        assert_eq!(
            (
                gpu.index,
                gpu.memory_mib,
                gpu.memory_used_mib,
                gpu.power_w,
                gpu.temperature_c
            ),
            (1, 81_559, 1, 71.52, 34.0)
        );
        (readings.temperature_c, readings.power_mw, readings.utilisation_pct) = (None, None, None);
        (readings.vbios, readings.driver) = (None, None);
        readings.pci_bus_id = "0000:2a:00.0".to_string();
        let gpu = gpu_from_nvml(&readings).unwrap();
        assert_eq!(
            (gpu.temperature_c, gpu.power_w, gpu.utilisation_pct),
            (0.0, 0.0, 0.0),
            "a reading NVML does not have is zero"
        );
        assert_eq!(
            (gpu.vbios.as_str(), gpu.driver.as_str()),
            ("[N/A]", "[N/A]"),
            "as nvidia-smi writes it"
        );
        assert_eq!(gpu.pci_bus_id, "00000000:2A:00.0");
        readings.index = 256;
        assert!(matches!(gpu_from_nvml(&readings), Err(GpuError::Nvml(_))));
    }

    #[test]
    fn the_same_gpus_have_the_same_fingerprint_from_nvml_and_nvidia_smi() {
        let gpus = nvml_readings()
            .iter()
            .map(gpu_from_nvml)
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let from_nvml = inventory_of(Detected {
            gpus,
            detected_by: DetectedBy::Nvml,
        })
        .unwrap();
        let from_smi = smi_inventory(SMI);
        assert_eq!(
            (from_nvml.model.as_str(), from_nvml.detected_by),
            ("H100-SXM5", DetectedBy::Nvml)
        );
        assert_eq!(from_nvml.fingerprint(), from_smi.fingerprint());
    }

    #[test]
    fn without_the_driver_nvml_detection_is_an_error_not_a_panic() {
        // Passes on a GPU machine too: there NVML finds the GPUs.
        match detect_nvml() {
            Ok(gpus) => assert!(
                !gpus.is_empty() && gpus.iter().all(|gpu| !gpu.uuid.is_empty()),
                "{gpus:?}"
            ),
            Err(error) => assert!(error.to_string().contains("NVML"), "{error}"),
        }
        match detect() {
            Ok(detected) => assert!(detected.detected_by != DetectedBy::Simulated && !detected.gpus.is_empty()),
            Err(GpuError::NoneFound(reasons)) => {
                assert!(reasons.contains("NVML") && reasons.contains("nvidia-smi"), "{reasons}")
            }
            Err(error) => panic!("detection fails with NoneFound, not {error:?}"),
        }
    }

    #[test]
    fn without_the_driver_the_nvlink_reading_is_none_not_a_panic() {
        // On a GPU machine NVML answers, one reading per GPU; `--nocapture` shows what it said.
        match (detect_nvml(), read_nvlink()) {
            (Err(_), None) => {}
            (Ok(gpus), Some(readings)) => {
                assert_eq!(readings.gpus.len(), gpus.len());
                for gpu in &readings.gpus {
                    assert!(gpu.nvlinks_active <= NVLINKS_PER_GPU_MAX, "{gpu:?}");
                    assert!(!gpu.nvlink_peers.contains(&gpu.index), "{gpu:?}");
                }
                let domain = crate::topology::nvlink_domain(None, Some(&readings), "this-machine");
                eprint!("{}", crate::topology::describe(&domain, Some(&readings)));
            }
            (gpus, readings) => panic!("NVML lists {gpus:?} but reads NVLink as {readings:?}"),
        }
    }

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
        let inventory = smi_inventory(SMI);
        assert_eq!((inventory.model.as_str(), inventory.simulated), ("H100-SXM5", false));
        assert_eq!(inventory.simulated_device, None, "real GPUs are no simulated device");
        assert_eq!(inventory.detected_by, DetectedBy::NvidiaSmi);
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
    fn a_leases_utilisation_is_the_mean_of_its_gpus() {
        let mut inventory = smi_inventory(SMI);
        inventory.gpus[0].utilisation_pct = 90.0;
        inventory.gpus[1].utilisation_pct = 45.5;
        assert_eq!(inventory.utilisation_permille(&[0]), 900);
        assert_eq!(inventory.utilisation_permille(&[0, 1]), 678, "(900 + 455) / 2, rounded");
        assert_eq!(
            inventory.utilisation_permille(&[1, 7]),
            455,
            "a GPU not read counts for nothing"
        );
        assert_eq!(inventory.utilisation_permille(&[]), 0);
        inventory.gpus[0].utilisation_pct = 250.0;
        assert_eq!(inventory.utilisation_permille(&[0]), 1000, "at most 1000");
        let simulated = simulated("H100-SXM5:2", |_| true).unwrap();
        assert_eq!(simulated.utilisation_permille(&[0, 1]), 0);
    }

    #[test]
    fn a_gpu_over_the_providers_thermal_or_power_limit_puts_the_node_over_its_limit() {
        let inventory = smi_inventory(SMI);
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
            ("NVIDIA L40S", 46_068, Some("L40S")),
            ("NVIDIA L40", 46_068, Some("L40")),
            ("NVIDIA L20", 46_068, Some("L20")),
            ("NVIDIA GeForce RTX 5090", 32_607, Some("RTX-5090")),
            (
                "NVIDIA RTX PRO 6000 Blackwell Server Edition",
                97_887,
                Some("RTX-PRO-6000"),
            ),
            (
                "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
                97_887,
                Some("RTX-PRO-6000"),
            ),
            ("NVIDIA B300 SXM6 AC", 275_040, Some("B300")),
            ("NVIDIA GB300", 284_208, Some("GB300")),
            ("NVIDIA H800", 81_559, Some("H800-SXM5")),
            ("NVIDIA A800-SXM4-80GB", 81_920, Some("A800-SXM4-80GB")),
            ("Tesla T4", 15_360, Some("T4")),
            ("Tesla V100-SXM2-32GB", 32_768, Some("V100-SXM2-32GB")),
            ("NVIDIA GeForce GTX 1080", 8_192, None),
        ] {
            assert_eq!(catalog_model(name, memory_mib), model, "{name}");
            if let Some(model) = model {
                assert!(
                    model::GpuCatalog::embedded().find(model).is_some(),
                    "{model} is a catalog name"
                );
            }
        }
    }

    #[test]
    fn simulated_gpus_are_labelled_and_checked() {
        let known = |name: &str| name == "H100-SXM5";
        let inventory = simulated("H100-SXM5:4", known).unwrap();
        assert!(inventory.simulated);
        assert_eq!(inventory.detected_by, DetectedBy::Simulated);
        assert_eq!(inventory.gpus.len(), 4);
        assert_eq!(inventory.simulated_device.as_deref(), Some("H100-SXM5"));
        let mut refreshed = inventory.clone();
        refreshed.refresh();
        assert_eq!(refreshed, inventory, "simulated GPUs are never re-read");
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
