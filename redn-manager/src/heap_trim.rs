//! Handing freed heap memory back to the kernel after installs are torn down.
//!
//! An install allocates its queues' executor state, rings and tables, and its teardown frees
//! them; between the two, long-lived small allocations (audit records queued for a stalled
//! receiver, connection buffers, map entries) land among them. glibc gives freed memory back
//! to the kernel only from the top of a heap on its own, so each long-lived block pins the
//! freed pages around it: 3,000 install-uninstall rounds with the audit receiver stalled left
//! the manager hundreds of MB bigger with nothing installed
//! (`attacks::app_lifecycle::install_churn_while_the_audit_receiver_is_stalled_leaves_the_manager_its_size`).
//! `malloc_trim` releases the free pages inside the heaps as well. The event loop calls
//! [`HeapTrim::after_turn`] once a turn; it trims at most every [`TRIM_EVERY`], and only
//! after NIC objects were freed, so an idle or steady manager never pays for it.
//!
//! [`heap_in_use`] says what the heap holds, for `Monitor`'s counters: read in the process
//! under the allocator's own locks. (Tests once read it by having gdb call `malloc_stats` in
//! the stopped manager; a trim or any allocation in progress on the stopped thread then held
//! the arena lock that call waited for, and the manager hung.)

use std::time::{Duration, Instant};

/// How often at most the heap is trimmed: a trim walks every arena's free chunks (tens of
/// microseconds to a few milliseconds on a fragmented heap), so churn pays for it once a
/// second, not once an uninstall.
pub const TRIM_EVERY: Duration = Duration::from_secs(1);

/// When the manager last trimmed its heap, and whether objects were freed since.
#[derive(Debug)]
pub struct HeapTrim {
    /// NIC objects held at the end of the last turn.
    objects: usize,
    /// Objects were freed since the last trim.
    pending: bool,
    last: Instant,
    /// Trims done, for tests and logs.
    pub trims: u64,
}

impl HeapTrim {
    /// No trim owed yet; `objects` held now.
    #[must_use]
    pub fn new(objects: usize, now: Instant) -> HeapTrim {
        HeapTrim {
            objects,
            pending: false,
            last: now,
            trims: 0,
        }
    }

    /// The end of an event-loop turn with `objects` NIC objects held: trim if objects were
    /// freed since the last trim and that was at least [`TRIM_EVERY`] ago.
    pub fn after_turn(&mut self, objects: usize, now: Instant) {
        if objects < self.objects {
            self.pending = true;
        }
        self.objects = objects;
        if self.pending && now.duration_since(self.last) >= TRIM_EVERY {
            trim();
            self.pending = false;
            self.last = now;
            self.trims += 1;
        }
    }

    /// How long the loop may sleep before a trim it owes (None: it owes none), so the
    /// memory of the last teardowns goes back even when nothing else wakes the loop.
    #[must_use]
    pub fn wake_in(&self, now: Instant) -> Option<Duration> {
        self.pending
            .then(|| TRIM_EVERY.saturating_sub(now.duration_since(self.last)))
    }
}

/// Give the free pages of every malloc arena back to the kernel.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim() {
    // SAFETY: malloc_trim(3) takes no pointers and has no precondition: it walks the
    // allocator's own free lists under the allocator's own locks (glibc takes each arena's
    // lock in turn), so it is sound from any thread at any time.
    #[allow(unsafe_code)]
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Other allocators return memory on their own terms; nothing to ask.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim() {}

/// The bytes the heap holds in use, every arena's and the blocks malloc mapped on their own
/// included (what `malloc_stats(3)` prints as its total "in use bytes").
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[must_use]
pub fn heap_in_use() -> Option<u64> {
    // SAFETY: mallinfo2(3) takes no arguments and returns a struct by value; glibc (2.33 and
    // later, which the link needs) fills it walking each arena under that arena's lock, so it
    // is sound from any thread at any time.
    #[allow(unsafe_code)]
    let m = unsafe { libc::mallinfo2() };
    Some(u64::try_from(m.uordblks.saturating_add(m.hblkhd)).unwrap_or(u64::MAX))
}

/// Other allocators keep their own figures: unknown.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
#[must_use]
pub fn heap_in_use() -> Option<u64> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_heap_in_use_counts_a_block_while_it_is_held() {
        // 256 MiB (mapped on its own, untouched so it costs no memory), against which what
        // other tests' threads allocate or free meanwhile is small.
        const BLOCK: u64 = 256 << 20;
        let before = heap_in_use().expect("glibc says");
        let block = vec![0u8; 256 << 20];
        let held = heap_in_use().expect("glibc says");
        assert!(held > before + BLOCK * 3 / 4, "{before} -> {held}");
        drop(std::hint::black_box(block));
        let after = heap_in_use().expect("glibc says");
        assert!(after + BLOCK * 3 / 4 < held, "{held} -> {after}");
    }

    #[test]
    fn trims_once_a_second_at_most_and_only_after_objects_were_freed() {
        let t0 = Instant::now();
        let mut t = HeapTrim::new(10, t0);
        let at = |ms| t0 + Duration::from_millis(ms);
        t.after_turn(12, at(2_000));
        assert_eq!((t.trims, t.wake_in(at(2_000))), (0, None), "nothing freed");
        t.after_turn(8, at(2_100));
        assert_eq!(t.trims, 1, "freed, and the last trim over a second ago");
        t.after_turn(4, at(2_500));
        assert_eq!(t.trims, 1, "within a second of the last");
        assert_eq!(t.wake_in(at(2_500)), Some(Duration::from_millis(600)));
        t.after_turn(4, at(3_100));
        assert_eq!(t.trims, 2, "the owed trim, a second after the last");
        t.after_turn(4, at(5_000));
        assert_eq!((t.trims, t.wake_in(at(5_000))), (2, None), "nothing owed");
    }
}
