//! A reader-writer lock for data that many threads read all the time and one changes
//! rarely: the key table, which every PU reads on a key-cache miss (several times a hash GET)
//! and an install or a deregistration changes.
//!
//! Why not `std::sync::RwLock`: taking its read lock writes its state word, so every read,
//! by any thread, moves that word's cache line to the reader's core. Two PUs missing their
//! key caches on different CPUs then pass the line back and forth a few times a GET, where
//! neither writes anything the other reads. Here each reader thread takes the read lock of
//! a shard of its own, on its own lines; a writer takes every shard's write lock, in order
//! (the "big-reader lock" of the Linux kernel, `brlock`). Readers of different shards share
//! no written line; a writer pays one lock per shard.

use std::cell::UnsafeCell;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Shards per lock: more than a softnic has PUs in any configuration we measure, so that
/// the PUs of one softnic (threads started one after another, see `reader_shard`) each get
/// their own.
const SHARDS: usize = 16;

/// One shard's lock, alone on its lines (128 bytes: adjacent-line prefetch pairs lines).
#[derive(Debug, Default)]
#[repr(align(128))]
struct Shard(RwLock<()>);

/// `T` behind a sharded reader-writer lock (see the module comment).
pub(crate) struct ReadMostly<T> {
    shards: [Shard; SHARDS],
    value: UnsafeCell<T>,
}

// SAFETY: `value` is reached only through `read` (a shared reference while a shard's read
// lock is held) and `write` (an exclusive reference while every shard's write lock is held,
// which excludes all readers and other writers): the same rules as `RwLock<T>`, whose
// `Sync` needs `T: Send + Sync` for the same reasons (a writer on another thread moves or
// drops the value; readers on several threads share it).
unsafe impl<T: Send + Sync> Sync for ReadMostly<T> {}

impl<T: Default> Default for ReadMostly<T> {
    fn default() -> Self {
        ReadMostly {
            shards: Default::default(),
            value: UnsafeCell::new(T::default()),
        }
    }
}

/// As `RwLock`'s: the value if it can be read now, else `<locked>` (never waits, so that
/// formatting it on a thread that holds the write guard does not deadlock).
impl<T: std::fmt::Debug> std::fmt::Debug for ReadMostly<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("ReadMostly");
        match self.shards[reader_shard()].0.try_read() {
            Ok(_lock) => {
                // SAFETY: a shard's read lock is held (`_lock`, to the end of this arm), so
                // no writer holds an exclusive reference (see `read`).
                d.field("value", unsafe { &*self.value.get() });
            }
            Err(_) => {
                d.field("value", &format_args!("<locked>"));
            }
        }
        d.finish()
    }
}

/// The shard this thread reads through: threads are numbered as they first read, so
/// threads started together (a softnic's PUs) read different shards.
fn reader_shard() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SHARD: usize = NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS;
    }
    SHARD.with(|s| *s)
}

impl<T> ReadMostly<T> {
    /// Read access, held until the guard is dropped. A panic of a writer (a poisoned shard)
    /// is ignored, as the key table ignored it on its `RwLock`: a writer changes the value
    /// only in steps that leave it whole.
    pub(crate) fn read(&self) -> ReadGuard<'_, T> {
        let lock = self.shards[reader_shard()]
            .0
            .read()
            .unwrap_or_else(|e| e.into_inner());
        ReadGuard {
            _lock: lock,
            value: self,
        }
    }

    /// Exclusive access, held until the guard is dropped: waits for every reader.
    pub(crate) fn write(&self) -> WriteGuard<'_, T> {
        // In index order, so that two writers cannot each hold a shard the other waits for.
        let locks =
            std::array::from_fn(|i| self.shards[i].0.write().unwrap_or_else(|e| e.into_inner()));
        WriteGuard {
            _locks: locks,
            value: self,
            _exclusive: PhantomData,
        }
    }
}

/// Read access to a [`ReadMostly`] value.
///
/// The guards hold the lock, not a reference to the value, and make one in each `deref`
/// (as std's guards hold pointers): a `&T` or `&mut T` field would be asserted valid for as
/// long as the guard is passed around, dropping it included, and `drop(guard)` releases the
/// locks inside that call, while a writer (or reader) may then already reach the value.
/// Miri reported exactly that: a late reader's `&T` beside the `&mut T` of a `WriteGuard`
/// still protected inside `drop`.
pub(crate) struct ReadGuard<'a, T> {
    _lock: RwLockReadGuard<'a, ()>,
    value: &'a ReadMostly<T>,
}

impl<T> std::ops::Deref for ReadGuard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        // SAFETY: this guard holds a shard's read lock (`_lock`) while it lives, and `write`
        // hands out `&mut T` only while it holds every shard's write lock, so no exclusive
        // reference exists while this one does; it lives no longer than `&self`.
        unsafe { &*self.value.value.get() }
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for ReadGuard<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (**self).fmt(f)
    }
}

/// Exclusive access to a [`ReadMostly`] value (see [`ReadGuard`] for why it holds no
/// reference to the value).
pub(crate) struct WriteGuard<'a, T> {
    _locks: [RwLockWriteGuard<'a, ()>; SHARDS],
    value: &'a ReadMostly<T>,
    /// Hands out `&mut T`: `Sync` only for a `T: Sync`, as `&mut T` is.
    _exclusive: PhantomData<&'a mut T>,
}

impl<T> std::ops::Deref for WriteGuard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        // SAFETY: this guard holds every shard's write lock (`_locks`) while it lives: no
        // reader holds a shard's read lock and no other writer any lock, so the only
        // references to the value are this guard's, and `&self` excludes `deref_mut`'s.
        unsafe { &*self.value.value.get() }
    }
}

impl<T> std::ops::DerefMut for WriteGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`; `&mut self` makes this the one reference the guard hands
        // out, for no longer than that borrow.
        unsafe { &mut *self.value.value.get() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::{mpsc, Arc, Barrier};
    use std::time::Duration;

    #[test]
    fn threads_started_one_after_another_read_different_shards() {
        // Other tests' threads draw from the same numbering: a pair is tried a few times.
        let differ = (0..3).any(|_| {
            let a = std::thread::spawn(reader_shard).join().unwrap();
            let b = std::thread::spawn(reader_shard).join().unwrap();
            assert!(a < SHARDS && b < SHARDS);
            a != b
        });
        assert!(
            differ,
            "two threads started in turn read one shard, three times"
        );
        // A thread keeps its shard.
        assert_eq!(reader_shard(), reader_shard());
    }

    #[test]
    fn debug_shows_the_value_and_never_waits() {
        let lock = ReadMostly::<Vec<u32>>::default();
        lock.write().push(7);
        assert_eq!(format!("{lock:?}"), "ReadMostly { value: [7] }");
        assert_eq!(format!("{:?}", lock.read()), "[7]");
        // Formatted by the thread that holds the write guard: no deadlock.
        let w = lock.write();
        assert_eq!(format!("{lock:?}"), "ReadMostly { value: <locked> }");
        drop(w);
    }

    #[test]
    fn readers_on_several_threads_read_at_once() {
        let lock = Arc::new(ReadMostly::<u32>::default());
        let all_in = Arc::new(Barrier::new(3));
        let (done, finished) = mpsc::channel();
        for _ in 0..3 {
            let (lock, all_in, done) = (lock.clone(), all_in.clone(), done.clone());
            std::thread::spawn(move || {
                let guard = lock.read();
                // Every reader holds its guard here: readers do not exclude each other.
                all_in.wait();
                done.send(*guard).unwrap();
            });
        }
        for _ in 0..3 {
            let v = finished.recv_timeout(Duration::from_secs(20));
            assert_eq!(v, Ok(0), "a reader waited for another");
        }
    }

    #[test]
    fn a_writer_waits_for_a_reader_of_any_shard_and_readers_wait_for_it() {
        let lock = Arc::new(ReadMostly::<Vec<u32>>::default());
        for _ in 0..SHARDS + 1 {
            // Each reader on a thread of its own, so over the loop every shard is read.
            let reader_in = Arc::new(Barrier::new(2));
            let released = Arc::new(AtomicBool::new(false));
            let reader = {
                let (lock, reader_in, released) =
                    (lock.clone(), reader_in.clone(), released.clone());
                std::thread::spawn(move || {
                    let guard = lock.read();
                    reader_in.wait();
                    std::thread::sleep(Duration::from_millis(5));
                    released.store(true, Ordering::SeqCst);
                    drop(guard);
                })
            };
            reader_in.wait();
            let mut w = lock.write();
            assert!(released.load(Ordering::SeqCst), "wrote beside a reader");
            w.push(1);
            reader.join().unwrap();
            // A reader that comes while the writer holds the lock sees its write whole.
            let len = w.len();
            let late = {
                let lock = lock.clone();
                std::thread::spawn(move || lock.read().len())
            };
            std::thread::sleep(Duration::from_millis(2));
            w.push(2);
            drop(w);
            assert_eq!(late.join().unwrap(), len + 1);
        }
    }

    #[test]
    fn readers_never_see_a_write_half_done() {
        // The writer keeps both halves equal; readers on other threads check them.
        let lock = Arc::new(ReadMostly::<(u64, u64)>::default());
        let stop = Arc::new(AtomicBool::new(false));
        let readers: Vec<_> = (0..3)
            .map(|_| {
                let (lock, stop) = (lock.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut seen = 0;
                    while !stop.load(Ordering::Relaxed) {
                        let g = lock.read();
                        assert_eq!(g.0, g.1);
                        seen = seen.max(g.0);
                    }
                    seen
                })
            })
            .collect();
        for i in 1..=2_000 {
            let mut w = lock.write();
            w.0 = i;
            std::hint::spin_loop();
            w.1 = i;
        }
        stop.store(true, Ordering::Relaxed);
        for r in readers {
            assert!(r.join().unwrap() <= 2_000);
        }
        assert_eq!(*lock.read(), (2_000, 2_000));
    }
}
