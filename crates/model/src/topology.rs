//! The interconnect and geography a placement respects:
//! region → site → fabric → NVLink domain → node → GPU.

use crate::ids::{FabricId, NvlinkDomainId, RegionId, SiteId};

/// Where a node sits. Every level's id is unique in the whole fleet, not only inside its parent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct TopologyPath {
    pub region: RegionId,
    pub site: SiteId,
    pub fabric: FabricId,
    pub nvlink: NvlinkDomainId,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Region {
    pub name: String,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Site {
    pub name: String,
    pub region: RegionId,
    /// Coordinates in degrees, for latency estimates.
    pub latitude: f64,
    pub longitude: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Fabric {
    pub name: String,
    pub site: SiteId,
}

#[derive(Clone, Debug, PartialEq)]
pub struct NvlinkDomain {
    pub fabric: FabricId,
    /// GPUs the domain joins: 8 for an HGX board, 72 for an NVL72 rack.
    pub gpus: u32,
}

/// The names and parents of every topology level, in dense arenas indexed by the ids.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Topology {
    pub regions: Vec<Region>,
    pub sites: Vec<Site>,
    pub fabrics: Vec<Fabric>,
    pub nvlink_domains: Vec<NvlinkDomain>,
}

impl Topology {
    pub fn add_region(&mut self, name: impl Into<String>) -> RegionId {
        self.regions.push(Region { name: name.into() });
        RegionId(u16::try_from(self.regions.len() - 1).expect("at most 65,535 regions"))
    }

    pub fn add_site(&mut self, name: impl Into<String>, region: RegionId, latitude: f64, longitude: f64) -> SiteId {
        assert!(region.index() < self.regions.len(), "site's region must exist");
        self.sites.push(Site {
            name: name.into(),
            region,
            latitude,
            longitude,
        });
        SiteId(u16::try_from(self.sites.len() - 1).expect("at most 65,535 sites"))
    }

    pub fn add_fabric(&mut self, name: impl Into<String>, site: SiteId) -> FabricId {
        assert!(site.index() < self.sites.len(), "fabric's site must exist");
        self.fabrics.push(Fabric {
            name: name.into(),
            site,
        });
        FabricId(u32::try_from(self.fabrics.len() - 1).expect("at most 2^32 fabrics"))
    }

    pub fn add_nvlink_domain(&mut self, fabric: FabricId, gpus: u32) -> NvlinkDomainId {
        assert!(fabric.index() < self.fabrics.len(), "domain's fabric must exist");
        self.nvlink_domains.push(NvlinkDomain { fabric, gpus });
        NvlinkDomainId(u32::try_from(self.nvlink_domains.len() - 1).expect("at most 2^32 domains"))
    }

    /// The full path of an NVLink domain.
    pub fn path(&self, nvlink: NvlinkDomainId) -> TopologyPath {
        let fabric = self.nvlink_domains[nvlink.index()].fabric;
        let site = self.fabrics[fabric.index()].site;
        let region = self.sites[site.index()].region;
        TopologyPath {
            region,
            site,
            fabric,
            nvlink,
        }
    }

    pub fn find_region(&self, name: &str) -> Option<RegionId> {
        self.regions
            .iter()
            .position(|region| region.name == name)
            .map(|index| RegionId(index as u16))
    }

    /// The region with this id, if there is one: a job may name a region no node is in, and
    /// carries an id the topology never gave out.
    pub fn region(&self, region: RegionId) -> Option<&Region> {
        self.regions.get(region.index())
    }

    pub fn site(&self, site: SiteId) -> Option<&Site> {
        self.sites.get(site.index())
    }

    /// The region's name, or [`UNKNOWN_REGION_NAME`] for an id no region has.
    pub fn region_name(&self, region: RegionId) -> &str {
        self.region(region)
            .map_or(UNKNOWN_REGION_NAME, |region| region.name.as_str())
    }

    /// Great-circle distance between a site and a point, in kilometres; infinite for an id no
    /// site has (as far as a placement could be).
    pub fn distance_km(&self, site: SiteId, latitude: f64, longitude: f64) -> f64 {
        self.site(site).map_or(f64::INFINITY, |site| {
            haversine_km(site.latitude, site.longitude, latitude, longitude)
        })
    }
}

/// What [`Topology::region_name`] says for an id no region has.
pub const UNKNOWN_REGION_NAME: &str = "(a region no node is in)";

/// Great-circle distance in kilometres on a spherical Earth.
pub fn haversine_km(lat1: f64, lon1: f64, lat2: f64, lon2: f64) -> f64 {
    const EARTH_RADIUS_KM: f64 = 6371.0;
    let (phi1, phi2) = (lat1.to_radians(), lat2.to_radians());
    let d_phi = (lat2 - lat1).to_radians();
    let d_lambda = (lon2 - lon1).to_radians();
    let a = (d_phi / 2.0).sin().powi(2) + phi1.cos() * phi2.cos() * (d_lambda / 2.0).sin().powi(2);
    2.0 * EARTH_RADIUS_KM * a.sqrt().asin()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_follow_parents() {
        let mut topology = Topology::default();
        let eu = topology.add_region("eu-west");
        let us = topology.add_region("us-east");
        let paris = topology.add_site("par1", eu, 48.85, 2.35);
        let _ashburn = topology.add_site("iad1", us, 39.04, -77.49);
        let fabric = topology.add_fabric("par1-ib0", paris);
        let domain = topology.add_nvlink_domain(fabric, 72);
        assert_eq!(
            topology.path(domain),
            TopologyPath {
                region: eu,
                site: paris,
                fabric,
                nvlink: domain
            }
        );
        // Paris to London is about 344 km.
        let km = topology.distance_km(paris, 51.507, -0.128);
        assert!((km - 344.0).abs() < 5.0, "{km}");
    }

    /// Jobs carry region ids for regions no node is in; looking them up must not panic.
    #[test]
    fn ids_without_a_level_are_answered_not_indexed() {
        let mut topology = Topology::default();
        let eu = topology.add_region("eu-west");
        let paris = topology.add_site("par1", eu, 48.85, 2.35);
        assert_eq!(topology.region_name(eu), "eu-west");
        assert_eq!(topology.region(RegionId(u16::MAX)), None);
        assert_eq!(topology.region_name(RegionId(u16::MAX)), UNKNOWN_REGION_NAME);
        assert_eq!(topology.site(paris).map(|site| site.name.as_str()), Some("par1"));
        assert_eq!(topology.site(SiteId(7)), None);
        assert_eq!(topology.distance_km(SiteId(7), 0.0, 0.0), f64::INFINITY);
    }
}
