//! Integer conversions for code that indexes memory with the NIC's 64-bit numbers: one
//! function per kind, each saying once why it loses nothing. The softnic's hot paths use them
//! (everything else converts with `From` / `try_from`, and clippy's cast lints hold the crate
//! to that), and so may callers that turn the u64 offsets and lengths of the [`Nic`] API
//! into `usize` offsets of a [`SharedBuffer`].
//!
//! All are `#[inline(always)]` and compile to what a bare cast does: no branch per WQE.
//!
//! [`Nic`]: crate::nic::Nic
//! [`SharedBuffer`]: crate::mem::SharedBuffer

// redn-sys targets 64-bit hosts: ring indices, addresses and lengths are u64 (as on the wire)
// and index memory as usize. This is what makes `idx` lossless; a 32-bit build stops here.
const _: () = assert!(usize::BITS >= 64, "redn-sys targets 64-bit hosts");

/// `x` as an index, offset or length in memory. Lossless: this crate builds only where
/// `usize` has at least 64 bits (a compile-time assertion says so).
#[inline(always)]
#[must_use]
#[allow(clippy::cast_possible_truncation)]
pub const fn idx(x: u64) -> usize {
    x as usize
}

/// The low 32 bits of `x`, for what wraps by design: ring slots (masked by a ring of at most
/// 2^32 entries) and the 32-bit counts of WAIT, SEND_EN and RECV_EN, which compare with
/// wrap-around as the hardware's do.
#[inline(always)]
#[must_use]
pub const fn low32(x: u64) -> u32 {
    (x & 0xffff_ffff) as u32
}

/// `x`, which a check elsewhere keeps below 2^32, as a `u32`: an entry of a key cache (fewer
/// than 8), a message length (at most `MAX_MESSAGE`, 16 MiB). Each caller says which; debug
/// builds check.
#[inline(always)]
#[allow(clippy::cast_possible_truncation)]
pub(crate) fn small32(x: usize) -> u32 {
    debug_assert!(u32::try_from(x).is_ok(), "{x} does not fit 32 bits");
    x as u32
}
