//! Apps' shared memory: a memfd sealed against shrinking and growing, mapped shared.
//!
//! The order follows what the kernel allows an app to do to a memfd it shares:
//! 1. `F_GET_SEALS` must show `F_SEAL_SHRINK` and `F_SEAL_GROW`. Without SHRINK the app
//!    could truncate the file and the manager's (or the NIC's) next access would SIGBUS;
//!    only a memfd created with `MFD_ALLOW_SEALING` can carry SHRINK, so this also proves
//!    the fd is a memfd (a pipe or regular file gives `EINVAL`, a tmpfs file `F_SEAL_SEAL`
//!    only).
//! 2. `fstat`: the size must be a nonzero multiple of the page size and within quota.
//! 3. `mmap(MAP_SHARED)` exactly that size, read-write (refused if the app sealed writes:
//!    the NIC writes app memory for offloads that need it).

use nix::fcntl::{fcntl, FcntlArg, SealFlag};
use nix::sys::stat::{fstat, SFlag};
use redn_proto::errors::ManagerError;
use redn_sys::mem::SharedBuffer;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Arc;

/// The seals a region must carry.
pub const REQUIRED_SEALS: u32 = 2 | 4; // F_SEAL_SHRINK | F_SEAL_GROW (fcntl(2))

const PAGE: u64 = 4096;

/// What kind of file `fd` is, for the `NotSealed` error.
fn kind_of(fd: &OwnedFd) -> String {
    let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    if link.starts_with("/memfd:") {
        return "memfd".into();
    }
    match fstat(fd.as_fd()) {
        Ok(st) => {
            let fmt = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
            match fmt {
                SFlag::S_IFIFO => "pipe",
                SFlag::S_IFREG => "regular file",
                SFlag::S_IFSOCK => "socket",
                SFlag::S_IFCHR => "character device",
                SFlag::S_IFDIR => "directory",
                _ => "other file",
            }
            .into()
        }
        Err(_) => "unknown".into(),
    }
}

/// Check `fd` is a sealed memfd of at most `max_size` bytes and map it.
///
/// # Errors
/// `NotSealed`, `InvalidParameter` (size), `QuotaExceeded` (`bytes`), `NoDevice` (mmap).
pub fn map_sealed(fd: OwnedFd, max_size: u64) -> Result<Arc<SharedBuffer>, ManagerError> {
    let seals = match fcntl(fd.as_fd(), FcntlArg::F_GET_SEALS) {
        Ok(bits) => u32::try_from(bits).unwrap_or(0),
        Err(_) => {
            return Err(ManagerError::NotSealed {
                kind: kind_of(&fd),
                seals: 0,
                required: REQUIRED_SEALS,
            })
        }
    };
    if seals & REQUIRED_SEALS != REQUIRED_SEALS {
        return Err(ManagerError::NotSealed {
            kind: kind_of(&fd),
            seals,
            required: REQUIRED_SEALS,
        });
    }
    let write_sealed = SealFlag::F_SEAL_WRITE.bits() | SealFlag::F_SEAL_FUTURE_WRITE.bits();
    if seals & u32::try_from(write_sealed).unwrap_or(0) != 0 {
        return Err(ManagerError::InvalidParameter {
            parameter: "fd".into(),
            reason: "the memfd is sealed against writes; the NIC must be able to write it".into(),
        });
    }
    let st = fstat(fd.as_fd()).map_err(|e| ManagerError::NoDevice {
        reason: format!("fstat of the region failed: {e}"),
    })?;
    let size = u64::try_from(st.st_size).unwrap_or(0);
    if size == 0 || size % PAGE != 0 {
        return Err(ManagerError::InvalidParameter {
            parameter: "fd".into(),
            reason: format!("the region is {size} bytes: it must be a nonzero multiple of {PAGE}"),
        });
    }
    if size > max_size {
        return Err(ManagerError::QuotaExceeded {
            resource: "bytes".into(),
            limit: max_size,
            requested: size,
        });
    }
    let too_big = || ManagerError::InvalidParameter {
        parameter: "fd".into(),
        reason: format!("a region of {size} bytes cannot be mapped"),
    };
    let len = usize::try_from(size).map_err(|_| too_big())?;
    // SAFETY: the file cannot shrink under the mapping (F_SEAL_SHRINK checked above), so
    // every page stays backed; nothing else in this process touches the mapping. The app
    // writes it concurrently, which SharedBuffer's atomic-only access allows.
    #[allow(unsafe_code)]
    let mapped = unsafe { SharedBuffer::map_shared(fd.as_fd(), len) };
    // The mapping holds the file; the fd is no longer needed (dropped on return).
    mapped.map_err(|e| ManagerError::NoDevice {
        reason: format!("mmap of the region failed: {e}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::memfd::{memfd_create, MFdFlags};
    use std::io::Write;

    fn memfd(len: i64, seals: SealFlag) -> OwnedFd {
        let fd = memfd_create("test", MFdFlags::MFD_ALLOW_SEALING | MFdFlags::MFD_CLOEXEC).unwrap();
        nix::unistd::ftruncate(&fd, len).unwrap();
        fcntl(fd.as_fd(), FcntlArg::F_ADD_SEALS(seals)).unwrap();
        fd
    }

    #[test]
    fn a_sealed_memfd_is_mapped_and_shared() {
        let fd = memfd(8192, SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW);
        let mut writer = std::fs::File::from(fd.try_clone().unwrap());
        let buf = map_sealed(fd, 1 << 20).unwrap();
        assert_eq!(buf.len(), 8192);
        writer.write_all(&7u64.to_le_bytes()).unwrap();
        assert_eq!(
            buf.load_u64(0),
            7,
            "the app's write is seen through the mapping"
        );
    }

    #[test]
    fn unsealed_memfds_pipes_and_files_are_refused_by_kind() {
        let only_shrink = memfd(4096, SealFlag::F_SEAL_SHRINK);
        let err = map_sealed(only_shrink, 1 << 20).unwrap_err();
        assert_eq!(
            err,
            ManagerError::NotSealed {
                kind: "memfd".into(),
                seals: 2,
                required: 6
            }
        );
        let (r, _w) = nix::unistd::pipe().unwrap();
        let err = map_sealed(r, 1 << 20).unwrap_err();
        assert!(
            matches!(err, ManagerError::NotSealed { ref kind, .. } if kind == "pipe"),
            "{err:?}"
        );
        let file = tempfile_in_target();
        let err = map_sealed(file, 1 << 20).unwrap_err();
        assert!(
            matches!(err, ManagerError::NotSealed { ref kind, .. } if kind == "regular file"),
            "{err:?}"
        );
    }

    #[test]
    fn sizes_outside_the_rules_are_refused() {
        let big = memfd(1 << 16, SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW);
        assert!(matches!(
            map_sealed(big, 1 << 12),
            Err(ManagerError::QuotaExceeded {
                limit: 4096,
                requested: 65536,
                ..
            })
        ));
        let odd = memfd(100, SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW);
        assert!(matches!(
            map_sealed(odd, 1 << 20),
            Err(ManagerError::InvalidParameter { .. })
        ));
    }

    fn tempfile_in_target() -> OwnedFd {
        let path = std::env::temp_dir().join(format!("redn-region-{}", std::process::id()));
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(4096).unwrap();
        let _ = std::fs::remove_file(&path);
        f.into()
    }
}
