//! The node's NVLink domain: the GPUs, on this node and beyond it, that one NVLink fabric joins.
//! NVML tells (`gpu::read_nvlink`): on a GB200/GB300 NVL72 rack each GPU registers with the
//! fabric and reports its cluster UUID and clique (its NVLink partition), which all nodes of the
//! rack share; on an HGX board the GPUs reach one another over NVSwitch, a domain of the node
//! alone. Deciding the domain from those readings is pure; a provider's flag beats it.

/// A GPU's registration with a multi-node NVLink fabric (NVML's `NVML_GPU_FABRIC_STATE_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FabricState {
    NotSupported,
    NotStarted,
    InProgress,
    Completed,
}

impl FabricState {
    pub fn as_str(self) -> &'static str {
        match self {
            FabricState::NotSupported => "not supported",
            FabricState::NotStarted => "not started",
            FabricState::InProgress => "in progress",
            FabricState::Completed => "completed",
        }
    }
}

/// What NVML's `nvmlDeviceGetGpuFabricInfoV` says of one GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FabricInfo {
    pub cluster_uuid: [u8; 16],
    /// The NVLink partition within the cluster.
    pub clique_id: u32,
    pub state: FabricState,
    /// Whether the registration succeeded; meaningful only once it is `Completed`.
    pub status_ok: bool,
}

/// How one GPU is joined to the others, as NVML says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuFabric {
    /// NVML's index of the GPU.
    pub index: u32,
    /// `None` where NVML has no fabric information (PCIe boards, drivers without the call).
    pub fabric: Option<FabricInfo>,
    pub nvlinks_active: u32,
    /// The indices of the other GPUs this one reaches peer-to-peer over NVLink, ascending.
    pub nvlink_peers: Vec<u32>,
}

/// What NVML said of the node's GPUs, in its order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NvlinkReadings {
    pub gpus: Vec<GpuFabric>,
}

/// Where the node's NVLink domain name came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DomainSource {
    /// The provider named it.
    Flag,
    /// The GPUs' multi-node fabric registration (NVL72-class racks).
    NvmlFabric,
    /// The node's GPUs reach one another over NVLink: a domain of the node alone.
    NvSwitch,
    /// Nothing joins the node to others: a domain of the node alone.
    Node,
}

impl DomainSource {
    pub fn as_str(self) -> &'static str {
        match self {
            DomainSource::Flag => "flag",
            DomainSource::NvmlFabric => "nvml-fabric",
            DomainSource::NvSwitch => "nvswitch",
            DomainSource::Node => "node",
        }
    }
}

impl std::fmt::Display for DomainSource {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(self.as_str())
    }
}

/// The node's NVLink domain as it registers it, and what NVML detected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NvlinkDomain {
    /// The name the node registers; "" is the node alone (the coordinator's reading of empty).
    pub name: String,
    pub source: DomainSource,
    /// NVML's identity of the domain (`nvl-<cluster uuid>-<clique>`, or `node-local` for GPUs
    /// joined inside the node), whether or not a flag overrode it; `None` when NVML is absent or
    /// detected neither.
    pub detected: Option<String>,
    /// Why the fabric gave no identity although some GPU reported one, or why NVML said nothing.
    pub note: Option<String>,
}

/// The detected identity of GPUs joined by NVLink inside the node only.
pub const NODE_LOCAL: &str = "node-local";

/// The node's NVLink domain. The provider's flag (trimmed; empty means the node alone) beats
/// detection. Else the fabric identity, when every GPU completed its registration, successfully,
/// into one cluster (not the all-zero UUID that single-node NVSwitch boards report) and one
/// clique. Else the node alone: `NvSwitch` when there are two or more GPUs, each with an active
/// NVLink, that all reach one another over NVLink (NVLink bridges join only pairs), else `Node`.
pub fn nvlink_domain(flag: Option<&str>, readings: Option<&NvlinkReadings>, node_name: &str) -> NvlinkDomain {
    let (fabric, nvswitch, note) = match readings {
        None => (
            None,
            false,
            Some(format!("node {node_name}: NVML is not available or lists no GPU")),
        ),
        Some(readings) => {
            let (fabric, note) = match fabric_identity(&readings.gpus, node_name) {
                Ok(identity) => (Some(identity), None),
                Err(note) => (None, note),
            };
            (fabric, joined_inside_the_node(&readings.gpus), note)
        }
    };
    let detected = fabric.clone().or_else(|| nvswitch.then(|| NODE_LOCAL.to_string()));
    let (name, source) = match (flag, fabric) {
        (Some(flag), _) => (flag.trim().to_string(), DomainSource::Flag),
        (None, Some(identity)) => (identity, DomainSource::NvmlFabric),
        (None, None) if nvswitch => (String::new(), DomainSource::NvSwitch),
        (None, None) => (String::new(), DomainSource::Node),
    };
    NvlinkDomain {
        name,
        source,
        detected,
        note,
    }
}

/// The fabric identity all GPUs share; else why there is none (`None`: no GPU reports a fabric,
/// nothing to explain).
fn fabric_identity(gpus: &[GpuFabric], node_name: &str) -> Result<String, Option<String>> {
    if gpus.is_empty() {
        return Err(Some(format!("node {node_name}: NVML lists no GPU")));
    }
    let reports_a_fabric = |gpu: &GpuFabric| {
        gpu.fabric
            .as_ref()
            .is_some_and(|fabric| fabric.state != FabricState::NotSupported)
    };
    if !gpus.iter().any(reports_a_fabric) {
        return Err(None);
    }
    let mut identities: Vec<([u8; 16], u32)> = Vec::with_capacity(gpus.len());
    for gpu in gpus {
        let why = |what: &str| Err(Some(format!("GPU {} of node {node_name} {what}", gpu.index)));
        let Some(fabric) = &gpu.fabric else {
            return why("reports no fabric while others do");
        };
        match fabric.state {
            FabricState::NotSupported => return why("reports no fabric while others do"),
            FabricState::NotStarted => return why("has not started its fabric registration"),
            FabricState::InProgress => return why("is still registering with the fabric"),
            FabricState::Completed if !fabric.status_ok => return why("failed its fabric registration"),
            // Single-node NVSwitch boards (HGX H100) report a completed registration into the
            // zero cluster: every such node would otherwise share one domain.
            FabricState::Completed if fabric.cluster_uuid == [0; 16] => {
                return why("reports the zero cluster UUID, which names no multi-node fabric");
            }
            FabricState::Completed => identities.push((fabric.cluster_uuid, fabric.clique_id)),
        }
    }
    let (cluster_uuid, clique_id) = identities[0];
    if identities.iter().any(|identity| *identity != (cluster_uuid, clique_id)) {
        let cliques: Vec<String> = gpus
            .iter()
            .zip(&identities)
            .map(|(gpu, (uuid, clique))| format!("GPU {} in {}/{clique}", gpu.index, hex::encode(uuid)))
            .collect();
        return Err(Some(format!(
            "the GPUs of node {node_name} are in different NVLink partitions ({}); a node registers one domain",
            cliques.join(", ")
        )));
    }
    Ok(format!("nvl-{}-{clique_id}", hex::encode(cluster_uuid)))
}

/// Whether two or more GPUs, each with an active NVLink, all reach one another over NVLink.
fn joined_inside_the_node(gpus: &[GpuFabric]) -> bool {
    gpus.len() >= 2
        && gpus.iter().all(|gpu| {
            gpu.nvlinks_active > 0
                && gpus
                    .iter()
                    .filter(|other| other.index != gpu.index)
                    .all(|other| gpu.nvlink_peers.contains(&other.index))
        })
}

/// A cluster UUID as nvidia-smi writes it: 8-4-4-4-12 hex digits.
fn uuid_text(uuid: &[u8; 16]) -> String {
    let hex = hex::encode(uuid);
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// The domain and NVML's readings in words, one line each, for people (`fallow agent
/// detect-topology`, the GPU smoke test).
pub fn describe(domain: &NvlinkDomain, readings: Option<&NvlinkReadings>) -> String {
    let name = if domain.name.is_empty() {
        "the node alone".to_string()
    } else {
        domain.name.clone()
    };
    let mut lines = vec![
        format!("NVLink domain: {name} (from {})", domain.source),
        format!("detected: {}", domain.detected.as_deref().unwrap_or("nothing")),
    ];
    if let Some(note) = &domain.note {
        lines.push(format!("note: {note}"));
    }
    match readings {
        None => lines.push("NVML: not read (no driver, or no GPU)".to_string()),
        Some(readings) => {
            for gpu in &readings.gpus {
                let fabric = match &gpu.fabric {
                    None => "no fabric information".to_string(),
                    Some(fabric) => format!(
                        "fabric {}{}, cluster {}, clique {}",
                        fabric.state.as_str(),
                        if fabric.status_ok { "" } else { " (failed)" },
                        uuid_text(&fabric.cluster_uuid),
                        fabric.clique_id
                    ),
                };
                let peers = if gpu.nvlink_peers.is_empty() {
                    "no NVLink peer".to_string()
                } else {
                    let peers: Vec<String> = gpu.nvlink_peers.iter().map(u32::to_string).collect();
                    format!("NVLink peers {}", peers.join(", "))
                };
                lines.push(format!(
                    "GPU {}: {fabric}; {} NVLinks active; {peers}",
                    gpu.index, gpu.nvlinks_active
                ));
            }
        }
    }
    let mut text = lines.join("\n");
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLUSTER: [u8; 16] = [
        0x4f, 0x1c, 0x9a, 0x02, 0x7d, 0x3e, 0x41, 0x8b, 0x9c, 0x55, 0x10, 0xaa, 0xbb, 0xcc, 0xdd, 0xee,
    ];
    const CLUSTER_HEX: &str = "4f1c9a027d3e418b9c5510aabbccddee";

    fn completed(cluster_uuid: [u8; 16], clique_id: u32) -> Option<FabricInfo> {
        Some(FabricInfo {
            cluster_uuid,
            clique_id,
            state: FabricState::Completed,
            status_ok: true,
        })
    }

    /// `count` GPUs with `fabric`, `nvlinks_active` links each; `peers(gpu)` lists the GPUs it
    /// reaches over NVLink.
    fn node(
        count: u32,
        fabric: impl Fn(u32) -> Option<FabricInfo>,
        nvlinks_active: u32,
        peers: impl Fn(u32) -> Vec<u32>,
    ) -> NvlinkReadings {
        NvlinkReadings {
            gpus: (0..count)
                .map(|index| GpuFabric {
                    index,
                    fabric: fabric(index),
                    nvlinks_active,
                    nvlink_peers: peers(index),
                })
                .collect(),
        }
    }

    /// Every GPU reaches every other.
    fn all_to_all(count: u32) -> impl Fn(u32) -> Vec<u32> {
        move |gpu| (0..count).filter(|other| *other != gpu).collect()
    }

    fn nvl72_node(clique_id: u32) -> NvlinkReadings {
        node(4, |_| completed(CLUSTER, clique_id), 18, all_to_all(4))
    }

    fn hgx_node(fabric: Option<FabricInfo>) -> NvlinkReadings {
        node(8, |_| fabric.clone(), 18, all_to_all(8))
    }

    fn pcie_node() -> NvlinkReadings {
        let not_supported = FabricInfo {
            cluster_uuid: [0; 16],
            clique_id: 0,
            state: FabricState::NotSupported,
            status_ok: true,
        };
        node(4, |_| Some(not_supported.clone()), 0, |_| Vec::new())
    }

    /// Checks the domain's name, source and detected identity, and that its note contains
    /// `note` (`None`: that it has none).
    fn check(
        flag: Option<&str>,
        readings: Option<&NvlinkReadings>,
        expect: (&str, DomainSource, Option<&str>, Option<&str>),
    ) {
        let domain = nvlink_domain(flag, readings, "gpu-17");
        let (name, source, detected, note) = expect;
        assert_eq!(
            (domain.name.as_str(), domain.source, domain.detected.as_deref()),
            (name, source, detected),
            "{domain:?}"
        );
        match (note, &domain.note) {
            (None, None) => {}
            (Some(part), Some(note)) => assert!(note.contains(part), "{note:?} lacks {part:?}"),
            _ => panic!("note {:?}, expected one containing {note:?}", domain.note),
        }
    }

    #[test]
    fn an_nvl72_node_whose_gpus_share_a_clique_is_in_the_fabrics_domain() {
        let identity = format!("nvl-{CLUSTER_HEX}-7");
        check(
            None,
            Some(&nvl72_node(7)),
            (&identity, DomainSource::NvmlFabric, Some(&identity), None),
        );
    }

    #[test]
    fn gpus_of_one_node_in_two_cliques_give_no_fabric_identity() {
        // Two partitions: GPUs 0-1 in clique 3, 2-3 in clique 4, NVLink only within each.
        let readings = node(
            4,
            |gpu| completed(CLUSTER, if gpu < 2 { 3 } else { 4 }),
            18,
            |gpu| vec![gpu ^ 1],
        );
        check(
            None,
            Some(&readings),
            (
                "",
                DomainSource::Node,
                None,
                Some("are in different NVLink partitions (GPU 0 in 4f1c9a027d3e418b9c5510aabbccddee/3"),
            ),
        );
        let domain = nvlink_domain(None, Some(&readings), "gpu-17");
        assert!(
            domain
                .note
                .unwrap()
                .contains("GPU 2 in 4f1c9a027d3e418b9c5510aabbccddee/4")
        );
    }

    #[test]
    fn a_fabric_not_yet_registered_or_failed_gives_no_fabric_identity() {
        let mut readings = nvl72_node(7);
        readings.gpus[2].fabric.as_mut().unwrap().state = FabricState::InProgress;
        for gpu in &mut readings.gpus {
            (gpu.nvlinks_active, gpu.nvlink_peers) = (0, Vec::new());
        }
        check(
            None,
            Some(&readings),
            (
                "",
                DomainSource::Node,
                None,
                Some("GPU 2 of node gpu-17 is still registering"),
            ),
        );
        readings.gpus[2].fabric.as_mut().unwrap().state = FabricState::NotStarted;
        check(
            None,
            Some(&readings),
            ("", DomainSource::Node, None, Some("has not started")),
        );

        let mut failed = nvl72_node(7);
        failed.gpus[1].fabric.as_mut().unwrap().status_ok = false;
        check(
            None,
            Some(&failed),
            (
                "",
                DomainSource::NvSwitch,
                Some(NODE_LOCAL),
                Some("GPU 1 of node gpu-17 failed its fabric registration"),
            ),
        );

        let mut partial = nvl72_node(7);
        partial.gpus[3].fabric = None;
        check(
            None,
            Some(&partial),
            (
                "",
                DomainSource::NvSwitch,
                Some(NODE_LOCAL),
                Some("reports no fabric while others do"),
            ),
        );
    }

    #[test]
    fn an_hgx_board_joined_by_nvswitch_is_a_domain_of_the_node_alone() {
        check(
            None,
            Some(&hgx_node(None)),
            ("", DomainSource::NvSwitch, Some(NODE_LOCAL), None),
        );
        // HGX H100 registers "completed" into the zero cluster; every such node would match.
        check(
            None,
            Some(&hgx_node(completed([0; 16], 0))),
            ("", DomainSource::NvSwitch, Some(NODE_LOCAL), Some("zero cluster UUID")),
        );
    }

    #[test]
    fn gpus_without_nvlink_among_all_of_them_are_the_node_alone() {
        check(None, Some(&pcie_node()), ("", DomainSource::Node, None, None));
        // H100 NVL: bridges join GPUs in pairs, each link active, but not all four.
        let bridged_pairs = node(4, |_| None, 12, |gpu| vec![gpu ^ 1]);
        check(None, Some(&bridged_pairs), ("", DomainSource::Node, None, None));
        let one_gpu = node(1, |_| None, 18, |_| Vec::new());
        check(None, Some(&one_gpu), ("", DomainSource::Node, None, None));
        let one_link_down = {
            let mut readings = hgx_node(None);
            readings.gpus[5].nvlinks_active = 0;
            readings
        };
        check(None, Some(&one_link_down), ("", DomainSource::Node, None, None));
    }

    #[test]
    fn without_nvml_the_node_is_alone() {
        check(
            None,
            None,
            ("", DomainSource::Node, None, Some("NVML is not available")),
        );
        check(
            None,
            Some(&NvlinkReadings { gpus: Vec::new() }),
            ("", DomainSource::Node, None, Some("lists no GPU")),
        );
    }

    #[test]
    fn the_flag_beats_detection_which_is_still_reported() {
        let identity = format!("nvl-{CLUSTER_HEX}-7");
        check(
            Some(" rack-12 "),
            Some(&nvl72_node(7)),
            ("rack-12", DomainSource::Flag, Some(&identity), None),
        );
        check(
            Some("board-3"),
            Some(&hgx_node(None)),
            ("board-3", DomainSource::Flag, Some(NODE_LOCAL), None),
        );
        check(
            Some("rack-12"),
            None,
            ("rack-12", DomainSource::Flag, None, Some("NVML is not available")),
        );
        check(
            Some(""),
            Some(&nvl72_node(7)),
            ("", DomainSource::Flag, Some(&identity), None),
        );
    }

    #[test]
    fn sources_have_stable_names() {
        let names = [
            DomainSource::Flag,
            DomainSource::NvmlFabric,
            DomainSource::NvSwitch,
            DomainSource::Node,
        ]
        .map(DomainSource::as_str);
        assert_eq!(names, ["flag", "nvml-fabric", "nvswitch", "node"]);
    }

    #[test]
    fn the_description_says_what_was_decided_and_what_nvml_said() {
        let mut readings = nvl72_node(7);
        readings.gpus.truncate(2);
        readings.gpus[1].fabric.as_mut().unwrap().status_ok = false;
        readings.gpus[0].nvlink_peers.clear();
        readings.gpus[1].nvlink_peers.clear();
        readings.gpus[1].nvlinks_active = 0;
        let domain = nvlink_domain(None, Some(&readings), "gpu-17");
        assert_eq!(
            describe(&domain, Some(&readings)),
            "\
NVLink domain: the node alone (from node)
detected: nothing
note: GPU 1 of node gpu-17 failed its fabric registration
GPU 0: fabric completed, cluster 4f1c9a02-7d3e-418b-9c55-10aabbccddee, clique 7; 18 NVLinks active; no NVLink peer
GPU 1: fabric completed (failed), cluster 4f1c9a02-7d3e-418b-9c55-10aabbccddee, clique 7; 0 NVLinks active; no NVLink peer
"
        );
        let domain = nvlink_domain(Some("rack-12"), None, "gpu-17");
        assert_eq!(
            describe(&domain, None),
            "\
NVLink domain: rack-12 (from flag)
detected: nothing
note: node gpu-17: NVML is not available or lists no GPU
NVML: not read (no driver, or no GPU)
"
        );
    }
}
