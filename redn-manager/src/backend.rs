//! Mapping the backend settings of `manager.toml` (plain config types in `redn-policy`, which
//! cannot reach a device) onto the backends' own types.

use redn_policy::config::{DeviceSelector, Prefetch};
use redn_sys::rdma_devices::RdmaDevice;
use redn_sys::softnic;

/// The softnic prefetch mode that `prefetch = "…"` in `[backend]` names.
pub fn softnic_prefetch(p: Prefetch) -> softnic::Prefetch {
    match p {
        Prefetch::AtExecute => softnic::Prefetch::AtExecute,
        Prefetch::Depth(n) => softnic::Prefetch::Depth(n.get()),
        Prefetch::Adversarial => softnic::Prefetch::Adversarial,
    }
}

/// The device of `devices` that `[backend]` names, or why none is: no RDMA device at all,
/// none matching, or (for `device = "auto"`) more than one. Messages list what there is.
pub fn select_device<'d>(
    selector: &DeviceSelector,
    devices: &'d [RdmaDevice],
) -> Result<&'d RdmaDevice, String> {
    let listing = || {
        devices
            .iter()
            .map(|d| {
                format!(
                    "{} (node_guid {:016x}, pci {})",
                    d.name,
                    d.node_guid,
                    d.pci_address.as_deref().unwrap_or("none")
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    if devices.is_empty() {
        return Err("no RDMA device: libibverbs lists none on this host".into());
    }
    let matching: Vec<&RdmaDevice> = devices
        .iter()
        .filter(|d| match selector {
            DeviceSelector::Auto => true,
            DeviceSelector::Name(name) => &d.name == name,
            DeviceSelector::NodeGuid(guid) => d.node_guid == guid.get(),
            DeviceSelector::PciAddress(pci) => {
                d.pci_address.as_deref() == Some(pci.to_string().as_str())
            }
        })
        .collect();
    match (selector, matching.as_slice()) {
        (_, [one]) => Ok(one),
        (DeviceSelector::Auto, _) => Err(format!(
            "device = \"auto\" needs exactly one RDMA device; there are {}: {}",
            devices.len(),
            listing()
        )),
        (_, _) => Err(format!(
            "no RDMA device matches the [backend] selection; there are: {}",
            listing()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(name: &str, guid: u64, pci: Option<&str>) -> RdmaDevice {
        RdmaDevice {
            name: name.into(),
            node_guid: guid,
            pci_address: pci.map(str::to_owned),
        }
    }

    #[test]
    fn a_device_is_selected_by_name_guid_or_pci_address_and_never_guessed() {
        let one = [dev(
            "rocep59s0f0",
            0x0002_c903_00a1_b2c3,
            Some("0000:3b:00.0"),
        )];
        let two = [one[0].clone(), dev("rxe0", 0x1122, None)];
        let parse = |toml: &str| {
            let c = redn_policy::parse_manager_config(
                &format!("[backend]\nkind = \"mlx5\"\n{toml}\n"),
                "m.toml",
            )
            .unwrap();
            match c.backend {
                redn_policy::Backend::Mlx5 { device } => device,
                other => panic!("{other:?}"),
            }
        };
        let auto = parse("device = \"auto\"");
        assert_eq!(select_device(&auto, &one).unwrap().name, "rocep59s0f0");
        let e = select_device(&auto, &two).unwrap_err();
        assert!(e.contains("exactly one") && e.contains("rxe0"), "{e}");
        let e = select_device(&auto, &[]).unwrap_err();
        assert!(e.starts_with("no RDMA device"), "{e}");
        let by_name = parse("device = \"rxe0\"");
        assert_eq!(select_device(&by_name, &two).unwrap().name, "rxe0");
        let by_guid = parse("node_guid = \"0002:c903:00a1:b2c3\"");
        assert_eq!(select_device(&by_guid, &two).unwrap().name, "rocep59s0f0");
        let by_pci = parse("pci_address = \"0000:3B:00.0\"");
        assert_eq!(select_device(&by_pci, &two).unwrap().name, "rocep59s0f0");
        let missing = parse("device = \"mlx5_0\"");
        let e = select_device(&missing, &two).unwrap_err();
        assert!(
            e.contains("no RDMA device matches") && e.contains("rocep59s0f0"),
            "{e}"
        );
    }
    use std::num::NonZeroU32;

    #[test]
    fn every_prefetch_setting_maps_to_its_softnic_mode() {
        assert_eq!(
            softnic_prefetch(Prefetch::default()),
            softnic::Prefetch::Depth(8)
        );
        assert_eq!(
            softnic_prefetch(Prefetch::Depth(NonZeroU32::MIN)),
            softnic::Prefetch::Depth(1)
        );
        assert_eq!(
            softnic_prefetch(Prefetch::AtExecute),
            softnic::Prefetch::AtExecute
        );
        assert_eq!(
            softnic_prefetch(Prefetch::Adversarial),
            softnic::Prefetch::Adversarial
        );
    }
}
