//! A spin lock for the softnic's few-instruction critical sections (a CQ's ring).
//!
//! Why not `std::sync::Mutex`: its unlock is a locked exchange (it must learn whether a
//! waiter sleeps), so every lock and unlock pair costs two locked instructions, each of which
//! drains the store buffer. A CQE push takes the lock once per signaled WQE on the PU's hot
//! path; here the release is a plain store. Every section this lock guards is a few dozen
//! instructions that neither block nor allocate, so a contender spins briefly; if the holder
//! was preempted, the contender yields its core instead of burning it.

use std::cell::UnsafeCell;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering};

/// Spins before a contender starts yielding between looks.
const SPINS_BEFORE_YIELD: u32 = 64;

pub(crate) struct SpinLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: `value` is reached only through a `SpinGuard`, and at most one guard exists at a
// time: `lock` returns one only after swapping `locked` from false to true (Acquire), and the
// guard's drop stores false (Release), so accesses from different threads are ordered. That is
// `Mutex`'s contract, so it is `Sync` for the same `T: Send`.
unsafe impl<T: Send> Sync for SpinLock<T> {}

impl<T> SpinLock<T> {
    pub(crate) fn new(value: T) -> SpinLock<T> {
        SpinLock {
            locked: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    #[inline]
    pub(crate) fn lock(&self) -> SpinGuard<'_, T> {
        if self.locked.swap(true, Ordering::Acquire) {
            self.lock_contended();
        }
        SpinGuard {
            lock: self,
            _value: PhantomData,
        }
    }

    /// Wait for the holder: spin on a plain load (no cache-line ping-pong), then take it.
    #[cold]
    #[inline(never)]
    fn lock_contended(&self) {
        let mut spins = 0u32;
        loop {
            while self.locked.load(Ordering::Relaxed) {
                if spins < SPINS_BEFORE_YIELD {
                    spins += 1;
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
            if !self.locked.swap(true, Ordering::Acquire) {
                return;
            }
        }
    }
}

/// Holds a [`SpinLock`] until dropped (also when a panic unwinds through it: the guarded
/// sections leave their data consistent at every point a panic could occur, so no poisoning).
pub(crate) struct SpinGuard<'a, T> {
    lock: &'a SpinLock<T>,
    /// The guard hands out `&T` and `&mut T`, so it is `Sync` only for a `T: Sync` and `Send`
    /// only for a `T: Send`, as `&mut T` is. Without it the guard would be `Sync` whenever
    /// the lock is (`T: Send`), and threads sharing one guard of a `Cell` would race on it.
    _value: PhantomData<&'a mut T>,
}

impl<T> Deref for SpinGuard<'_, T> {
    type Target = T;

    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: this guard holds the lock (see `SpinLock::lock`), so nothing else reaches
        // the value until it is dropped; the shared borrow lives no longer than the guard.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for SpinGuard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`; the exclusive borrow of the guard makes this one exclusive.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for SpinGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        self.lock.locked.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::SpinLock;
    use std::sync::Arc;

    /// Threads incrementing a plain (non-atomic) counter under the lock lose no update: the
    /// lock excludes, and its release/acquire pair orders each section after the last.
    #[test]
    fn excludes_and_orders() {
        let threads: u64 = 4;
        let per: u64 = if cfg!(miri) { 50 } else { 20_000 };
        let lock = Arc::new(SpinLock::new((0u64, 0u64)));
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let lock = Arc::clone(&lock);
                std::thread::spawn(move || {
                    for _ in 0..per {
                        let mut g = lock.lock();
                        // Two fields updated apart: another holder would see them differ.
                        g.0 += 1;
                        assert_eq!(g.0, g.1 + 1);
                        g.1 += 1;
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().expect("thread");
        }
        let g = lock.lock();
        assert_eq!(*g, (threads * per, threads * per));
    }

    /// A guard is shared between threads only when `T` may be (`&SpinGuard` derefs to `&T`):
    /// a guard of a `Cell` is not `Sync`, though the lock is. (Before the guard said so, two
    /// threads sharing one guard of a `Cell<u32>` raced on it in safe code: Miri reported
    /// the data race.)
    #[test]
    fn a_guard_is_sync_only_for_a_sync_value() {
        use super::SpinGuard;
        use std::cell::Cell;
        /// Implemented twice for a `Sync` type, so naming the method is ambiguous (and does
        /// not compile) exactly when the type is `Sync`.
        trait AmbiguousIfSync<A> {
            fn some_item() {}
        }
        impl<T: ?Sized> AmbiguousIfSync<()> for T {}
        impl<T: ?Sized + Sync> AmbiguousIfSync<u8> for T {}
        <SpinGuard<'static, Cell<u32>> as AmbiguousIfSync<_>>::some_item();
        fn send_sync<T: Send + Sync>() {}
        send_sync::<SpinLock<Cell<u32>>>();
        send_sync::<SpinGuard<'static, u32>>();
    }

    /// A guard dropped by a panic releases the lock.
    #[test]
    fn unwinding_releases() {
        let lock = Arc::new(SpinLock::new(0u32));
        let l2 = Arc::clone(&lock);
        let r = std::thread::spawn(move || {
            let _g = l2.lock();
            panic!("holder fails");
        })
        .join();
        assert!(r.is_err());
        *lock.lock() += 1;
        assert_eq!(*lock.lock(), 1);
    }
}
