//! The RDMA devices of this host, as rdma-core's libibverbs lists them: the first step of the
//! mlx5 backend, and how the manager says "no RDMA device" clearly.
//!
//! libibverbs is loaded at run time (`dlopen("libibverbs.so.1")`) rather than linked, so the
//! manager and its tests run on hosts without rdma-core, and a missing library is reported as
//! what it is. The four calls used are libibverbs' stable device-list API
//! (`ibv_get_device_list(3)`): `ibv_get_device_list`, `ibv_get_device_name`,
//! `ibv_get_device_guid` (big-endian, as `ibv_devinfo` prints it) and `ibv_free_device_list`.
//! The PCI address comes from sysfs (`/sys/class/infiniband/NAME/device`, a link whose last
//! component is the address, as rdma-core's `rdma_rename` reads it).
//!
//! Queue pairs, memory registration and posting on a ConnectX are not built yet: only
//! discovery is.

use crate::{Error, Result};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::Path;

/// One RDMA device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RdmaDevice {
    /// Its name (`mlx5_0`, or as rdma-core renamed it: `rocep59s0f0`).
    pub name: String,
    /// Its node GUID, host order.
    pub node_guid: u64,
    /// Its PCI address (`0000:3b:00.0`), if sysfs shows one (virtual devices have none).
    pub pci_address: Option<String>,
}

type GetDeviceList = unsafe extern "C" fn(*mut c_int) -> *mut *mut c_void;
type FreeDeviceList = unsafe extern "C" fn(*mut *mut c_void);
type GetDeviceName = unsafe extern "C" fn(*mut c_void) -> *const c_char;
type GetDeviceGuid = unsafe extern "C" fn(*mut c_void) -> u64;

/// The library, as the dynamic loader names it (the runtime package `libibverbs1`).
const LIBIBVERBS: &CStr = c"libibverbs.so.1";

/// Look up `name` in `lib`.
fn symbol(lib: *mut c_void, name: &CStr) -> Result<*mut c_void> {
    // SAFETY: `lib` is a handle dlopen returned (checked non-null by the caller) and `name`
    // is a NUL-terminated string.
    let p = unsafe { libc::dlsym(lib, name.as_ptr()) };
    if p.is_null() {
        return Err(Error::NoDevice(format!(
            "libibverbs has no {}",
            name.to_string_lossy()
        )));
    }
    Ok(p)
}

/// Every RDMA device libibverbs lists (none: an empty list). `Err(NoDevice)` if libibverbs
/// is not installed.
///
/// # Errors
/// [`Error::NoDevice`] naming what is missing.
pub fn list() -> Result<Vec<RdmaDevice>> {
    // SAFETY: a NUL-terminated library name; RTLD_NOW resolves every symbol at once. The
    // handle is never closed (libibverbs keeps global state and its providers loaded).
    let lib = unsafe { libc::dlopen(LIBIBVERBS.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if lib.is_null() {
        return Err(Error::NoDevice(
            "libibverbs.so.1 is not installed (Debian package libibverbs1, from rdma-core)".into(),
        ));
    }
    // The symbols are libibverbs' exported functions of these C signatures
    // (infiniband/verbs.h, ibv_get_device_list(3)); a function pointer and a data pointer
    // have the same size on every platform Linux runs on.
    // SAFETY: as said above, for ibv_get_device_list.
    let get_list: GetDeviceList = unsafe {
        std::mem::transmute::<*mut c_void, GetDeviceList>(symbol(lib, c"ibv_get_device_list")?)
    };
    // SAFETY: as above.
    let free_list: FreeDeviceList = unsafe {
        std::mem::transmute::<*mut c_void, FreeDeviceList>(symbol(lib, c"ibv_free_device_list")?)
    };
    // SAFETY: as above.
    let get_name: GetDeviceName = unsafe {
        std::mem::transmute::<*mut c_void, GetDeviceName>(symbol(lib, c"ibv_get_device_name")?)
    };
    // SAFETY: as above.
    let get_guid: GetDeviceGuid = unsafe {
        std::mem::transmute::<*mut c_void, GetDeviceGuid>(symbol(lib, c"ibv_get_device_guid")?)
    };
    let mut n: c_int = 0;
    // SAFETY: `n` is a valid out-pointer; the call returns NULL (no devices or no kernel
    // support, errno set) or an array of `n` device pointers followed by NULL.
    let devices = unsafe { get_list(&mut n) };
    if devices.is_null() {
        return Ok(Vec::new());
    }
    let count = usize::try_from(n).unwrap_or(0);
    let mut out = Vec::with_capacity(count);
    for i in 0..count {
        // SAFETY: `i < n`, within the array ibv_get_device_list returned, which stays valid
        // until ibv_free_device_list below.
        let slot = unsafe { devices.add(i) };
        // SAFETY: `slot` points into that array.
        let dev = unsafe { *slot };
        if dev.is_null() {
            break;
        }
        // SAFETY: `dev` is a device of the list.
        let p = unsafe { get_name(dev) };
        if p.is_null() {
            continue;
        }
        // SAFETY: the name is a NUL-terminated string owned by libibverbs, copied here before
        // the list is freed.
        let name = unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
        // SAFETY: `dev` is a device of the list.
        let node_guid = u64::from_be(unsafe { get_guid(dev) });
        let pci_address = pci_address_of(Path::new("/sys/class/infiniband"), &name);
        out.push(RdmaDevice {
            name,
            node_guid,
            pci_address,
        });
    }
    // SAFETY: the list ibv_get_device_list returned, freed once, after its last use.
    unsafe { free_list(devices) };
    Ok(out)
}

/// The PCI address of device `name` under `class_dir` (`/sys/class/infiniband`): the last
/// component of its `device` link, if it looks like `DOMAIN:BUS:DEVICE.FUNCTION`.
pub fn pci_address_of(class_dir: &Path, name: &str) -> Option<String> {
    let target = std::fs::read_link(class_dir.join(name).join("device")).ok()?;
    let last = target.file_name()?.to_str()?.to_ascii_lowercase();
    let looks_pci = last.len() == 12
        && last.as_bytes()[4] == b':'
        && last.as_bytes()[7] == b':'
        && last.as_bytes()[10] == b'.';
    looks_pci.then_some(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pci_address_is_read_from_the_device_link() {
        let dir = std::env::temp_dir().join(format!("redn-rdma-devices-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("rocep59s0f0")).unwrap();
        std::os::unix::fs::symlink(
            "../../../0000:3B:00.0",
            dir.join("rocep59s0f0").join("device"),
        )
        .unwrap();
        std::fs::create_dir_all(dir.join("rxe0")).unwrap();
        std::os::unix::fs::symlink("../../../virtual", dir.join("rxe0").join("device")).unwrap();
        assert_eq!(
            pci_address_of(&dir, "rocep59s0f0").as_deref(),
            Some("0000:3b:00.0")
        );
        assert_eq!(pci_address_of(&dir, "rxe0"), None, "not a PCI address");
        assert_eq!(pci_address_of(&dir, "mlx5_9"), None, "no such device");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// On a host with libibverbs, the list is what the kernel has; on one without, the error
    /// names the package. Either way no panic and a clear answer.
    #[test]
    fn listing_says_what_the_host_has() {
        match list() {
            Ok(devices) => {
                for d in &devices {
                    assert!(!d.name.is_empty());
                }
                let sysfs = Path::new("/sys/class/infiniband");
                let in_sysfs = std::fs::read_dir(sysfs).map_or(0, |d| d.count());
                assert!(
                    devices.len() <= in_sysfs,
                    "libibverbs lists devices sysfs lacks"
                );
            }
            Err(Error::NoDevice(why)) => assert!(why.contains("libibverbs"), "{why}"),
            Err(e) => panic!("unexpected error: {e}"),
        }
    }
}
