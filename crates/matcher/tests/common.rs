//! A small fleet builder shared by the matcher's tests, so scenarios read as data.

#![allow(dead_code)]

use matcher::{Matcher, MatcherConfig};
use model::{
    GpuCatalog, GpuDemand, JobId, JobSpec, Micros, Node, NodeId, ProviderId, ProviderPolicy, RegionId, Tier, Topology,
    TopologyLevel,
};

pub const NOW: i64 = 1_800_000_000;

/// One node to build: (region name, fabric index within its site, model, GPUs, ask in dollars, reliability).
pub struct NodeSpec {
    pub region: &'static str,
    pub fabric: u32,
    pub nvlink: u32,
    pub model: &'static str,
    pub gpus: u8,
    pub ask: &'static str,
    pub reliability: f64,
}

pub fn node(region: &'static str, model: &'static str, gpus: u8, ask: &'static str, reliability: f64) -> NodeSpec {
    NodeSpec {
        region,
        fabric: 0,
        nvlink: u32::MAX,
        model,
        gpus,
        ask,
        reliability,
    }
}

impl NodeSpec {
    pub fn fabric(mut self, fabric: u32) -> NodeSpec {
        self.fabric = fabric;
        self
    }
    pub fn nvlink(mut self, nvlink: u32) -> NodeSpec {
        self.nvlink = nvlink;
        self
    }
}

/// Builds a fleet: one site per region, fabrics and NVLink domains as the specs say (each node
/// its own NVLink domain unless several name the same one).
pub fn fleet(specs: Vec<NodeSpec>) -> (Topology, Vec<Node>) {
    let catalog = GpuCatalog::embedded();
    let mut topology = Topology::default();
    let mut nodes = Vec::new();
    let mut fabrics: Vec<(String, u32, model::FabricId)> = Vec::new();
    let mut domains: Vec<((String, u32, u32), model::NvlinkDomainId)> = Vec::new();
    for (index, spec) in specs.into_iter().enumerate() {
        let region = topology.find_region(spec.region).unwrap_or_else(|| {
            let region = topology.add_region(spec.region);
            topology.add_site(
                format!("{}-1", spec.region),
                region,
                50.0 + region.0 as f64,
                5.0 * region.0 as f64,
            );
            region
        });
        let site = model::SiteId(region.0);
        let fabric = match fabrics
            .iter()
            .find(|(name, number, _)| name == spec.region && *number == spec.fabric)
        {
            Some((_, _, fabric)) => *fabric,
            None => {
                let fabric = topology.add_fabric(format!("{}-fabric{}", spec.region, spec.fabric), site);
                fabrics.push((spec.region.to_string(), spec.fabric, fabric));
                fabric
            }
        };
        let domain_key = (
            spec.region.to_string(),
            spec.fabric,
            if spec.nvlink == u32::MAX {
                1_000_000 + index as u32
            } else {
                spec.nvlink
            },
        );
        let nvlink = match domains.iter().find(|(key, _)| *key == domain_key) {
            Some((_, domain)) => *domain,
            None => {
                let domain = topology.add_nvlink_domain(fabric, u32::from(spec.gpus));
                domains.push((domain_key, domain));
                domain
            }
        };
        nodes.push(Node {
            id: NodeId(index as u32),
            name: format!("node-{index}"),
            provider: ProviderId(index as u32),
            path: topology.path(nvlink),
            gpu_model: catalog.find(spec.model).expect("model in catalog"),
            gpu_count: spec.gpus,
            cpu_milli: 128_000,
            memory_mib: 1 << 20,
            network_mbit_s: 10_000,
            datasets: Vec::new(),
            reliability_ppm: (spec.reliability * 1e6) as u32,
            policy: ProviderPolicy::flat(Micros::parse_dollars(spec.ask).expect("ask")),
            simulated: false,
            runtimes: model::RuntimeSet::ALL,
        });
    }
    (topology, nodes)
}

pub fn matcher(specs: Vec<NodeSpec>) -> Matcher {
    let (topology, nodes) = fleet(specs);
    Matcher::new(topology, nodes, MatcherConfig::default())
}

pub fn job(id: u64, tier: Tier, gpu: GpuDemand, max_price: &str) -> JobSpec {
    JobSpec::new(JobId(id), tier, gpu, Micros::parse_dollars(max_price).expect("price"))
}

pub fn whole(count: u8) -> GpuDemand {
    GpuDemand::Whole { count }
}

pub fn gang(id: u64, tier: Tier, replicas: u32, gpus: u8, level: TopologyLevel) -> JobSpec {
    let mut spec = job(id, tier, whole(gpus), "100");
    spec.replicas = replicas;
    spec.topology = level;
    spec
}

pub fn region(matcher: &Matcher, name: &str) -> RegionId {
    matcher.topology().find_region(name).expect("region")
}
