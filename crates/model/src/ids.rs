//! Typed identifiers. Dense `u32` ids index arenas; `u64` ids name long-lived records.

use std::fmt;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident, $inner:ty, $prefix:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
        pub struct $name(pub $inner);

        impl $name {
            pub fn index(self) -> usize {
                self.0 as usize
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "-{}"), self.0)
            }
        }
    };
}

id_type!(/// A region (e.g. eu-west): the unit of data residency.
    RegionId, u16, "region");
id_type!(/// A site (a data centre or a building) with coordinates for latency estimates.
    SiteId, u16, "site");
id_type!(/// An InfiniBand or RoCE fabric inside a site.
    FabricId, u32, "fabric");
id_type!(/// An NVLink domain: an 8-GPU HGX board or a 72-GPU NVL72 rack.
    NvlinkDomainId, u32, "nvlink");
id_type!(/// A node (one host) in the matcher's arena.
    NodeId, u32, "node");
id_type!(/// A provider account.
    ProviderId, u32, "provider");
id_type!(/// A tenant account.
    TenantId, u32, "tenant");
id_type!(/// A job.
    JobId, u64, "job");
id_type!(/// A lease: one replica of a job bound to GPUs of one node.
    LeaseId, u64, "lease");
