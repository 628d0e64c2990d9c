//! Mapping the backend settings of `manager.toml` (plain config types in `redn-policy`, which
//! cannot reach a device) onto the backends' own types.

use redn_policy::config::Prefetch;
use redn_sys::softnic;

/// The softnic prefetch mode that `prefetch = "…"` in `[backend]` names.
pub fn softnic_prefetch(p: Prefetch) -> softnic::Prefetch {
    match p {
        Prefetch::AtExecute => softnic::Prefetch::AtExecute,
        Prefetch::Depth(n) => softnic::Prefetch::Depth(n.get()),
        Prefetch::Adversarial => softnic::Prefetch::Adversarial,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
