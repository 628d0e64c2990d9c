//! The integer conversions the crate makes on its hot paths, one function per kind, each
//! saying once why it loses nothing. Everything else converts with `From` / `try_from`, and
//! clippy's cast lints hold the rest of the crate to that.
//!
//! All are `#[inline(always)]` and compile to what the bare cast did: no branch per WQE.

// redn-sys targets 64-bit hosts: ring indices, addresses and lengths are u64 (as on the wire)
// and index memory as usize. This is what makes `idx` lossless; a 32-bit build stops here.
const _: () = assert!(usize::BITS >= 64, "redn-sys targets 64-bit hosts");

/// `x` as an index, offset or length in memory. Lossless: `usize` has at least 64 bits
/// (asserted at compile time above).
#[inline(always)]
#[allow(clippy::cast_possible_truncation)]
pub(crate) const fn idx(x: u64) -> usize {
    x as usize
}

/// The low 32 bits of `x`, for what wraps by design: ring slots (masked by a ring of at most
/// 2^32 entries) and the 32-bit counts of WAIT, SEND_EN and RECV_EN, which compare with
/// wrap-around as the hardware's do.
#[inline(always)]
pub(crate) const fn low32(x: u64) -> u32 {
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
