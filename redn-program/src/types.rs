//! Newtypes for the numbers an RNIC hands out, so a key is never mistaken for a queue number.

use std::fmt;

macro_rules! id_newtype {
    ($(#[$doc:meta])* $name:ident($inner:ty), $fmt:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
        pub struct $name(pub $inner);

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!(stringify!($name), "(", $fmt, ")"), self.0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, $fmt, self.0)
            }
        }
    };
}

id_newtype!(
    /// A queue-pair number: 24 bits on the wire (ctrl segment bytes 4–6, wait/enable `obj_num`).
    Qpn(u32),
    "{:#08x}"
);
id_newtype!(
    /// A completion-queue number, the `obj_num` of a CQE_WAIT.
    Cqn(u32),
    "{:#08x}"
);
id_newtype!(
    /// A local key: names a memory region to the queue pair that posts the WQE.
    Lkey(u32),
    "{:#010x}"
);
id_newtype!(
    /// A remote key: names a memory region to the peer of a connection. On mlx5 (and in the
    /// softnic) a region's lkey and rkey are the same number; RedN relies on that.
    Rkey(u32),
    "{:#010x}"
);
id_newtype!(
    /// A protection-domain number.
    Pdn(u32),
    "{}"
);
id_newtype!(
    /// An I/O virtual address as a WQE carries it (the registered buffer's address).
    VirtAddr(u64),
    "{:#x}"
);

impl VirtAddr {
    /// The address `off` bytes further on, or `None` on overflow.
    pub fn checked_add(self, off: u64) -> Option<VirtAddr> {
        self.0.checked_add(off).map(VirtAddr)
    }
}

impl From<Lkey> for Rkey {
    fn from(k: Lkey) -> Rkey {
        Rkey(k.0)
    }
}

impl From<Rkey> for Lkey {
    fn from(k: Rkey) -> Lkey {
        Lkey(k.0)
    }
}

/// The largest queue-pair or CQ number: they are 24-bit fields on the wire.
pub const MAX_QPN: u32 = 0x00ff_ffff;

/// Access rights of a memory region (the `ibv_access_flags` a region is registered with).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Access(u8);

impl Access {
    /// No rights beyond local read, which every region has.
    pub const NONE: Access = Access(0);
    /// The local queue pair may write (scatter, READ results, atomic results).
    pub const LOCAL_WRITE: Access = Access(1);
    /// A peer may RDMA WRITE into it.
    pub const REMOTE_WRITE: Access = Access(2);
    /// A peer may RDMA READ from it.
    pub const REMOTE_READ: Access = Access(4);
    /// A peer may run CAS / FETCH_ADD on it.
    pub const REMOTE_ATOMIC: Access = Access(8);
    /// Every right: what RedN registers all of its regions with.
    pub const ALL: Access = Access(15);

    /// True if every right in `other` is present in `self`.
    #[must_use]
    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }

    /// The raw bit set.
    pub const fn bits(self) -> u8 {
        self.0
    }

    /// Rights from raw bits; unknown bits are dropped.
    pub const fn from_bits_truncate(bits: u8) -> Access {
        Access(bits & 15)
    }
}

impl std::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

impl fmt::Debug for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Access({self})")
    }
}

impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = [
            (Access::LOCAL_WRITE, "local-write"),
            (Access::REMOTE_WRITE, "remote-write"),
            (Access::REMOTE_READ, "remote-read"),
            (Access::REMOTE_ATOMIC, "remote-atomic"),
        ];
        let mut first = true;
        for (bit, name) in names {
            if self.contains(bit) {
                if !first {
                    f.write_str("|")?;
                }
                f.write_str(name)?;
                first = false;
            }
        }
        if first {
            f.write_str("local-read")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_contains_and_display() {
        let a = Access::LOCAL_WRITE | Access::REMOTE_READ;
        assert!(a.contains(Access::REMOTE_READ));
        assert!(!a.contains(Access::REMOTE_WRITE));
        assert_eq!(a.to_string(), "local-write|remote-read");
        assert_eq!(Access::NONE.to_string(), "local-read");
        assert_eq!(Access::from_bits_truncate(0xff), Access::ALL);
    }

    #[test]
    fn newtypes_format_as_hex() {
        assert_eq!(Qpn(0x1234).to_string(), "0x001234");
        assert_eq!(format!("{:?}", Rkey(0x100)), "Rkey(0x00000100)");
    }
}
