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
