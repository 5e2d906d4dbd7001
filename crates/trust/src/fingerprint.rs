//! Hardware fingerprint: one digest of a node's GPUs, so that a swapped card, a moved slot or a
//! reflashed VBIOS shows up as a changed value and the node is re-verified.

use serde::{Deserialize, Serialize};

/// One GPU as the agent reports it (from NVML / nvidia-smi), taken verbatim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuIdentity {
    pub uuid: String,
    pub pci_bus_id: String,
    pub vbios: String,
    pub driver: String,
    pub model: String,
    pub memory_mib: u64,
}

/// blake3 key-derivation context, so a fingerprint cannot collide with any other digest here.
const FINGERPRINT_CONTEXT: &str = "fallow 2025-01 gpu fingerprint v1";

/// 64 lowercase hex chars over each GPU's uuid, PCI bus id, VBIOS and driver version.
///
/// Independent of the order the GPUs are listed in (enumeration order can change across boots),
/// but a GPU listed twice counts twice. `model` and `memory_mib` are left out: they follow from
/// the hardware already covered, and their reported spelling can vary between tools.
pub fn fingerprint(gpus: &[GpuIdentity]) -> String {
    let mut identities: Vec<[&str; 4]> = gpus
        .iter()
        .map(|gpu| [&*gpu.uuid, &*gpu.pci_bus_id, &*gpu.vbios, &*gpu.driver])
        .collect();
    identities.sort_unstable();
    let mut hasher = blake3::Hasher::new_derive_key(FINGERPRINT_CONTEXT);
    hasher.update(&(identities.len() as u64).to_le_bytes());
    for fields in identities {
        for field in fields {
            // Length-prefixed, so that no two different field lists encode to the same bytes
            // ("ab","c" vs "a","bc").
            hasher.update(&(field.len() as u64).to_le_bytes());
            hasher.update(field.as_bytes());
        }
    }
    hasher.finalize().to_hex().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(n: u32) -> GpuIdentity {
        GpuIdentity {
            uuid: format!("GPU-{n:08x}-0000-0000-0000-000000000000"),
            pci_bus_id: format!("00000000:{n:02X}:00.0"),
            vbios: "96.00.99.00.01".to_owned(),
            driver: "570.124.06".to_owned(),
            model: "NVIDIA H100 80GB HBM3".to_owned(),
            memory_mib: 81_559,
        }
    }

    fn node() -> Vec<GpuIdentity> {
        (0..4).map(gpu).collect()
    }

    /// Applies `change` to a four-GPU node and checks whether its fingerprint changed.
    fn check(change: impl FnOnce(&mut Vec<GpuIdentity>), expect_changed: bool) {
        let mut gpus = node();
        change(&mut gpus);
        assert_eq!(fingerprint(&gpus) != fingerprint(&node()), expect_changed);
    }

    #[test]
    fn listing_order_does_not_matter() {
        check(|gpus| gpus.reverse(), false);
        check(|gpus| gpus.swap(0, 2), false);
    }

    #[test]
    fn hardware_changes_are_detected() {
        check(|gpus| gpus[1].uuid = gpu(9).uuid, true);
        check(|gpus| gpus[1].pci_bus_id = gpu(9).pci_bus_id, true);
        check(|gpus| gpus[1].vbios.push('1'), true);
        check(|gpus| gpus[1].driver = "575.51.03".to_owned(), true);
        check(|gpus| drop(gpus.pop()), true);
        check(|gpus| gpus.push(gpu(0)), true);
        // Two GPUs trading slots is a change, though the same UUIDs and slots remain.
        check(
            |gpus| {
                let slot = std::mem::take(&mut gpus[0].pci_bus_id);
                gpus[0].pci_bus_id = std::mem::replace(&mut gpus[1].pci_bus_id, slot);
            },
            true,
        );
    }

    #[test]
    fn reported_model_and_memory_are_not_part_of_it() {
        check(|gpus| gpus[0].model = "H100 SXM5".to_owned(), false);
        check(|gpus| gpus[0].memory_mib = 81_920, false);
    }

    #[test]
    fn field_boundaries_are_unambiguous() {
        let mut a = gpu(0);
        let mut b = gpu(0);
        a.vbios = "1.2".to_owned();
        a.driver = "3".to_owned();
        b.vbios = "1.".to_owned();
        b.driver = "23".to_owned();
        assert_ne!(fingerprint(&[a]), fingerprint(&[b]));
        assert_eq!(fingerprint(&[]).len(), 64);
    }
}
