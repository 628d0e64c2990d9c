//! Big-endian integers as they lie in WQE, CQE and data bytes.
//!
//! Every multi-byte field an mlx5 NIC reads or writes (a WQE's index, queue number, keys,
//! addresses and atomic operands, a CQE's counters, the buckets and list nodes the offloads
//! walk) is big-endian, while the hosts this runs on are little-endian. [`Be16`], [`Be32`]
//! and [`Be64`] hold such a field exactly as its bytes lie in memory, so the byte order is
//! written down once, here, instead of in `from_be_bytes` / `to_be_bytes` helpers repeated
//! by the encoder, the decoder and the executor. The conversion happens only where a host
//! value is wanted ([`Be32::get`]) or made ([`Be32::new`]); comparing two fields, or a field
//! with a constant built by a `const fn new`, and masking one, need no byte swap at all,
//! which is what the softnic's hot paths rely on.
//!
//! The readers and writers take a byte slice and an offset, as WQE and CQE fields are
//! addressed (`mlx5dv.h`'s segment offsets), and panic, as slice indexing does, if the field
//! runs past the slice's end. All of them are `#[inline]`: this crate's callers (the
//! softnic's executor in another crate above all) must not pay a call for a load and a
//! byte swap.

use core::fmt;
use core::ops::BitAnd;

/// One big-endian integer type: `$name` holds a `$int` as its `$n` bytes lie in memory.
macro_rules! big_endian {
    ($(#[$doc:meta])* $name:ident, $int:ty, $n:literal) => {
        $(#[$doc])*
        ///
        /// The inner value is the field's bytes read in the host's own order, so derived
        /// equality and hashing compare the bytes as they lie (no swap); there is no
        /// ordering, since the bytes' order is not the host values' order.
        #[repr(transparent)]
        #[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
        pub struct $name($int);

        impl $name {
            #[doc = concat!("The big-endian form of the host value `host` (a constant stays \
                a constant: `", stringify!($name), "::new(K)` costs nothing at run time).")]
            #[inline]
            #[must_use]
            pub const fn new(host: $int) -> Self {
                Self(host.to_be())
            }

            /// The host value (one byte swap on a little-endian host).
            #[inline]
            #[must_use]
            pub const fn get(self) -> $int {
                <$int>::from_be(self.0)
            }

            /// The field whose bytes, in memory order, are `bytes` (most significant first).
            #[inline]
            #[must_use]
            pub const fn from_bytes(bytes: [u8; $n]) -> Self {
                Self(<$int>::from_ne_bytes(bytes))
            }

            /// The field's bytes in memory order (most significant first), ready to store.
            #[inline]
            #[must_use]
            pub const fn to_bytes(self) -> [u8; $n] {
                self.0.to_ne_bytes()
            }

            #[doc = concat!("The field at byte offset `at` of `b`: `b[at..at + ", $n, "]`, \
                as the bytes lie (unaligned is fine).")]
            ///
            /// # Panics
            ///
            #[doc = concat!("If `b` is shorter than `at + ", $n, "`.")]
            #[inline]
            #[must_use]
            pub fn read(b: &[u8], at: usize) -> Self {
                let mut a = [0u8; $n];
                a.copy_from_slice(&b[at..at + $n]);
                Self::from_bytes(a)
            }

            #[doc = concat!("Store the field at byte offset `at` of `b`: `b[at..at + ", $n, "]`.")]
            ///
            /// # Panics
            ///
            #[doc = concat!("If `b` is shorter than `at + ", $n, "`.")]
            #[inline]
            pub fn write(self, b: &mut [u8], at: usize) {
                b[at..at + $n].copy_from_slice(&self.to_bytes());
            }
        }

        /// Masks as the bytes lie: `field & Self::new(mask)` is `Self::new(host & mask)`
        /// without swapping the field (bitwise operations do not care about byte order).
        impl BitAnd for $name {
            type Output = Self;

            #[inline]
            fn bitand(self, rhs: Self) -> Self {
                Self(self.0 & rhs.0)
            }
        }

        /// Shows the host value (`Be32(305419896)`; in hex under `{:x?}`).
        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_tuple(stringify!($name)).field(&self.get()).finish()
            }
        }

        /// Shows the host value.
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.get(), f)
            }
        }

        /// Shows the host value in hex (keys and queue numbers read best that way).
        impl fmt::LowerHex for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::LowerHex::fmt(&self.get(), f)
            }
        }
    };
}

big_endian!(
    /// A big-endian 16-bit field: a WQE's index (`wqe_index`) or a CQE's `wqe_counter`.
    Be16,
    u16,
    2
);
big_endian!(
    /// A big-endian 32-bit field: queue and CQ numbers, keys, byte counts, immediate data,
    /// WAIT / ENABLE indexes.
    Be32,
    u32,
    4
);
big_endian!(
    /// A big-endian 64-bit field: remote and local addresses, atomic operands and results.
    Be64,
    u64,
    8
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        for v in [0u16, 1, 0x1234, u16::MAX] {
            assert_eq!(Be16::new(v).get(), v);
            assert_eq!(Be16::from_bytes(Be16::new(v).to_bytes()), Be16::new(v));
        }
        for v in [0u32, 1, 0x1234_5678, 0x80ff_0001, u32::MAX] {
            assert_eq!(Be32::new(v).get(), v);
            assert_eq!(Be32::from_bytes(Be32::new(v).to_bytes()), Be32::new(v));
        }
        for v in [0u64, 1, 0x1122_3344_5566_7788, u64::MAX - 1] {
            assert_eq!(Be64::new(v).get(), v);
            assert_eq!(Be64::from_bytes(Be64::new(v).to_bytes()), Be64::new(v));
        }
    }

    #[test]
    fn most_significant_byte_first_in_memory() {
        assert_eq!(Be16::new(0x1234).to_bytes(), [0x12, 0x34]);
        assert_eq!(Be32::new(0x1234_5678).to_bytes(), [0x12, 0x34, 0x56, 0x78]);
        assert_eq!(
            Be64::new(0x1122_3344_5566_7788).to_bytes(),
            [0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88]
        );
        // The same bytes as the standard library's big-endian conversions.
        assert_eq!(
            Be32::new(0xdead_beef).to_bytes(),
            0xdead_beefu32.to_be_bytes()
        );
        assert_eq!(Be64::from_bytes(7u64.to_be_bytes()).get(), 7);
    }

    #[test]
    fn read_and_write_at_an_offset() {
        let mut b = [0xaau8; 16];
        Be16::new(0x0102).write(&mut b, 1);
        Be32::new(0x0304_0506).write(&mut b, 3);
        Be64::new(0x0708_090a_0b0c_0d0e).write(&mut b, 7);
        assert_eq!(
            b,
            [0xaa, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 0xaa]
        );
        assert_eq!(Be16::read(&b, 1).get(), 0x0102);
        assert_eq!(Be32::read(&b, 3).get(), 0x0304_0506);
        assert_eq!(Be64::read(&b, 7).get(), 0x0708_090a_0b0c_0d0e);
        // Unaligned, overlapping reads see the bytes as they lie.
        assert_eq!(Be32::read(&b, 2).get(), 0x0203_0405);
    }

    #[test]
    #[should_panic]
    fn read_past_the_end_panics() {
        let _ = Be32::read(&[0u8; 8], 5);
    }

    #[test]
    #[should_panic]
    fn write_past_the_end_panics() {
        Be64::new(1).write(&mut [0u8; 8], 1);
    }

    #[test]
    fn compares_and_masks_as_the_bytes_lie() {
        // The inner value is the memory bytes in host order: what an unswapped load gives,
        // and what the executor compares against a host value's `to_be()`.
        let field = Be32::read(&[0xff, 0x00, 0x12, 0x34], 0);
        assert_eq!(field.0, u32::from_ne_bytes([0xff, 0x00, 0x12, 0x34]));
        assert_eq!(Be32::new(0xff00_1234).0, 0xff00_1234u32.to_be());
        assert_eq!(field, Be32::new(0xff00_1234));
        assert_ne!(field, Be32::new(0x3412_00ff));
        assert_eq!(field & Be32::new(0x00ff_ffff), Be32::new(0x1234));
        assert_eq!(
            (field & Be32::new(0x00ff_ffff)).get(),
            0xff00_1234 & 0x00ff_ffff
        );
        assert_eq!(Be16::new(5) & Be16::new(4), Be16::new(4));
        assert_eq!(Be64::new(u64::MAX) & Be64::new(9), Be64::new(9));
    }

    #[test]
    fn formats_the_host_value() {
        let v = Be32::new(0x1234_5678);
        assert_eq!(format!("{v}"), "305419896");
        assert_eq!(format!("{v:?}"), "Be32(305419896)");
        assert_eq!(format!("{v:#x?}"), "Be32(\n    0x12345678,\n)");
        assert_eq!(format!("{v:#x}"), "0x12345678");
        assert_eq!(format!("{:?}", Be16::new(258)), "Be16(258)");
        assert_eq!(format!("{}", Be64::new(1 << 40)), "1099511627776");
    }

    #[test]
    fn new_is_const() {
        const K: Be32 = Be32::new(0x00ff_ffff);
        const B: [u8; 2] = Be16::new(0x0102).to_bytes();
        assert_eq!(K.get(), 0x00ff_ffff);
        assert_eq!(B, [1, 2]);
    }
}
