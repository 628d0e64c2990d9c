//! Padding a value to whole cache lines, so that what one thread writes does not share a line
//! with what another reads.

/// A value alone on its cache line(s).
#[repr(align(64))]
pub(crate) struct CacheLine<T>(pub(crate) T);

/// Read through to the value, so that padding a field does not change how it is used.
impl<T> std::ops::Deref for CacheLine<T> {
    type Target = T;

    #[inline(always)]
    fn deref(&self) -> &T {
        &self.0
    }
}

/// Ask the CPU to bring the cache line at `at` into this core's caches (PREFETCHT0): a
/// hint, which reads nothing the program sees and cannot fault whatever the address, so
/// what runs is unchanged. A no-op where there is no such instruction (and under Miri).
#[inline(always)]
pub(crate) fn prefetch_line<T>(at: *const T) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: PREFETCHT0 is only a cache hint: it cannot fault, whatever the address, and
    // reads nothing the program sees.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(at.cast())
    };
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    let _ = at;
}
