//! Registered memory: shared buffers, protection domains, memory regions and their keys.
//!
//! Every byte the softnic reads or writes on behalf of a WQE goes through this module: a key is
//! resolved to a [`MemoryRegion`], the region checks PD, bounds and rights, and only then is the
//! [`SharedBuffer`] touched. A buffer is shared with threads we do not control (the application,
//! other processing units, a peer that patches our rings), so it is only ever accessed with
//! atomic operations on 64-bit words: never a plain load or store, hence no data race and no
//! torn WQE as far as the language is concerned. Mixed-size atomics are avoided (Miri rejects
//! them): sub-word writes are compare-exchange loops on the containing word.

use crate::conv::idx;
use crate::types::{Access, Lkey, Pdn, Rkey, VirtAddr};
use read_mostly::{ReadGuard, ReadMostly};
use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

const WORD: usize = 8;
/// Buffers of this many bytes or more are mappings of their own (see [`SharedBuffer::new`]):
/// glibc's own threshold for that, before it raises it.
pub const MAP_AT: usize = 128 << 10;
/// `mmap`'s flags for a buffer's own memory.
const ANONYMOUS: libc::c_int = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
const WORDS_PER_LINE: usize = 8;

/// One cache line of words: what heap buffers are allocated in, so they start on a line.
#[repr(C, align(64))]
struct Line([AtomicU64; WORDS_PER_LINE]);

/// Who frees a buffer's memory.
enum Backing {
    /// Allocated by us with `Box::into_raw`; freed in Drop. (Keeping the Box itself beside a
    /// pointer into it would be undefined behaviour: moving a Box asserts unique access.)
    Heap,
    /// Mapped by someone else (an app's memfd); `release` unmaps it.
    Foreign(Option<Box<dyn FnOnce() + Send + Sync>>),
}

/// Memory that WQEs may read and write while other threads do too: 8-byte aligned, a whole
/// number of 64-bit words, accessed only atomically.
pub struct SharedBuffer {
    words: NonNull<AtomicU64>,
    len_words: usize,
    backing: Backing,
}

// SAFETY: the buffer is only accessed through `&AtomicU64`, which is Sync; `words` points into
// memory owned by `backing` (or kept mapped until `release` runs in Drop), so it stays valid for
// as long as the SharedBuffer lives, whichever thread holds it.
unsafe impl Send for SharedBuffer {}
// SAFETY: through `&SharedBuffer` the memory is reached only as `&[AtomicU64]` (`words`,
// which every accessor uses), so shared access from any thread is atomic; it is released only
// in Drop (under `&mut`), by `release`, which is itself `Send + Sync`.
unsafe impl Sync for SharedBuffer {}

impl fmt::Debug for SharedBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedBuffer")
            .field("addr", &self.addr())
            .field("len", &self.len())
            .field(
                "backing",
                &match self.backing {
                    Backing::Heap => "heap",
                    Backing::Foreign(_) => "foreign",
                },
            )
            .finish()
    }
}

impl SharedBuffer {
    /// A zeroed buffer of `len` bytes rounded up to whole words (at least one word), starting
    /// on a cache line: a 64-byte WQE or payload then touches one line, not two.
    ///
    /// From [`MAP_AT`] bytes on, the buffer is an anonymous mapping of its own, unmapped when
    /// it drops: a queue's rings and code region come and go with every install, and from
    /// the heap they left the allocator's pages pinned by whatever small allocation landed
    /// among them (glibc raises its mmap threshold past a freed block's size, so later
    /// rings came from the heap too): 3,000 installs and uninstalls left a manager whose
    /// audit queue held records hundreds of MB bigger with nothing installed.
    #[must_use]
    pub fn new(len: usize) -> Arc<SharedBuffer> {
        let n = len.div_ceil(WORD).max(1);
        if n * WORD >= MAP_AT {
            // SAFETY: `mapping`'s one condition is a file that stays `len` bytes long; an
            // anonymous mapping (fd -1) has no file, so nothing can shrink under it.
            let mapped = unsafe { Self::mapping(n * WORD, ANONYMOUS, -1) };
            // Out of mappings (`vm.max_map_count`): the heap still serves.
            if let Ok(b) = mapped {
                return b;
            }
        }
        let lines: Box<[Line]> = (0..n.div_ceil(WORDS_PER_LINE))
            .map(|_| Line(Default::default()))
            .collect();
        let raw = NonNull::from(Box::leak(lines));
        Arc::new(SharedBuffer {
            words: raw.cast(),
            len_words: n,
            backing: Backing::Heap,
        })
    }

    /// Wrap memory mapped elsewhere (an application's memfd).
    ///
    /// # Safety
    /// `ptr` must be 8-byte aligned and valid for reads and writes of `len` bytes (a multiple of
    /// 8, nonzero) until `release` is called, which happens exactly once when the buffer drops.
    /// Other processes may write the memory concurrently; nobody in this process may access it
    /// other than through this buffer.
    pub unsafe fn from_raw(
        ptr: NonNull<u8>,
        len: usize,
        release: Box<dyn FnOnce() + Send + Sync>,
    ) -> Arc<SharedBuffer> {
        debug_assert!(len % WORD == 0 && len > 0 && ptr.as_ptr() as usize % WORD == 0);
        Arc::new(SharedBuffer {
            words: ptr.cast(),
            len_words: len / WORD,
            backing: Backing::Foreign(Some(release)),
        })
    }

    /// Map the first `len` bytes of file `fd` shared and read-write (an app's memfd), as a
    /// buffer that unmaps them when it drops.
    ///
    /// # Errors
    /// `mmap`'s, and `InvalidInput` for a `len` that is zero or not a multiple of 8.
    ///
    /// # Safety
    /// The file must stay at least `len` bytes long while the buffer lives (a memfd sealed
    /// with `F_SEAL_SHRINK`), or an access faults; nobody in this process may access the
    /// mapping other than through this buffer (other processes, and writes through the
    /// file, may go on concurrently).
    pub unsafe fn map_shared(
        fd: std::os::fd::BorrowedFd<'_>,
        len: usize,
    ) -> std::io::Result<Arc<SharedBuffer>> {
        use std::os::fd::AsRawFd;
        // SAFETY: this function's own contract, which is `mapping`'s for a file.
        unsafe { Self::mapping(len, libc::MAP_SHARED, fd.as_raw_fd()) }
    }

    /// A buffer over a fresh read-write mapping of `len` bytes (`flags` for `mmap`, file
    /// `fd` or -1 for none), which it unmaps when it drops (zeroed if anonymous).
    ///
    /// # Safety
    /// With a file, as [`Self::map_shared`]: the file stays at least `len` bytes long while
    /// the buffer lives.
    unsafe fn mapping(
        len: usize,
        flags: libc::c_int,
        fd: libc::c_int,
    ) -> std::io::Result<Arc<SharedBuffer>> {
        if len == 0 || len % WORD != 0 {
            return Err(std::io::ErrorKind::InvalidInput.into());
        }
        // SAFETY: a fresh mapping at an address the kernel picks aliases no Rust object; the
        // arguments are plain values, and `fd` is open or -1 (the caller's).
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or(std::io::ErrorKind::InvalidData)?;
        let addr = p as usize;
        let release = Box::new(move || {
            // SAFETY: exactly the mapping made above, unmapped once, when the buffer that
            // alone accesses it drops (from_raw's contract).
            let _ = unsafe { libc::munmap(addr as *mut libc::c_void, len) };
        });
        // SAFETY: the mapping is page aligned (so 8-byte aligned) and `len` a nonzero
        // multiple of 8 (checked above), valid for reads and writes until `release` unmaps
        // it, backed for its whole length (the caller's contract for a file) and touched
        // here only through this buffer.
        Ok(unsafe { SharedBuffer::from_raw(ptr, len, release) })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len_words * WORD
    }

    /// Always false: a buffer holds at least one word.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The buffer's address, which is also the I/O virtual address WQEs use for it.
    pub fn addr(&self) -> VirtAddr {
        VirtAddr(self.words.as_ptr() as u64)
    }

    /// Raw pointer, for registering the buffer with real hardware.
    pub fn as_ptr(&self) -> *mut u8 {
        self.words.as_ptr().cast()
    }

    #[inline]
    pub(crate) fn words(&self) -> &[AtomicU64] {
        // SAFETY: `words` is aligned and valid for `len_words` atomics for as long as the
        // buffer lives (the constructors' invariants); all access through the slice is atomic.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr(), self.len_words) }
    }

    #[inline]
    fn word(&self, i: usize) -> &AtomicU64 {
        &self.words()[i]
    }

    /// True if `off..off+len` lies inside the buffer.
    #[must_use]
    pub fn contains(&self, off: usize, len: usize) -> bool {
        off.checked_add(len).is_some_and(|end| end <= self.len())
    }

    /// Copy `dst.len()` bytes starting at byte `off` out of the buffer.
    /// Panics if the range is outside the buffer (callers check with a region first).
    #[inline]
    pub fn read(&self, off: usize, dst: &mut [u8]) {
        assert!(self.contains(off, dst.len()), "read outside buffer");
        let words = self.words();
        // The bytes before the first word boundary, the whole words, then the rest: the
        // whole words in a loop of one load and one store each (a 4 KiB packet's payload
        // is 512 of them, on the RoCE paths' every packet).
        let (head, body) = dst.split_at_mut(head_len(off, dst.len()));
        if !head.is_empty() {
            let b = off % WORD;
            head.copy_from_slice(
                &words[off / WORD].load(Ordering::Relaxed).to_ne_bytes()[b..][..head.len()],
            );
        }
        let first = (off + head.len()) / WORD;
        let last = first + body.len() / WORD;
        let mut whole = body.chunks_exact_mut(WORD);
        for (d, w) in (&mut whole).zip(&words[first..]) {
            d.copy_from_slice(&w.load(Ordering::Relaxed).to_ne_bytes());
        }
        let tail = whole.into_remainder();
        if !tail.is_empty() {
            tail.copy_from_slice(&words[last].load(Ordering::Relaxed).to_ne_bytes()[..tail.len()]);
        }
    }

    /// Copy `len` bytes from `src` at `src_off` to `self` at `dst_off`, word by word when
    /// both sides are 8-byte aligned, through a small stack buffer otherwise. Both ranges
    /// must have been checked (panics otherwise).
    #[inline(always)]
    pub fn copy_from(&self, dst_off: usize, src: &SharedBuffer, src_off: usize, len: usize) {
        if len == 64 && dst_off % WORD == 0 && src_off % WORD == 0 {
            // One aligned cache line (a 64-byte WRITE or READ, the common case).
            self.copy_line(dst_off / WORD, src, src_off / WORD);
            return;
        }
        self.copy_any(dst_off, src, src_off, len);
    }

    /// Copy the eight words at word `src_word` of `src` to word `dst_word`: eight loads and
    /// eight stores, no loop. Slicing checks both ranges (panics outside them).
    #[inline(always)]
    pub(crate) fn copy_line(&self, dst_word: usize, src: &SharedBuffer, src_word: usize) {
        let d: &[AtomicU64; 8] = self.words()[dst_word..][..8]
            .try_into()
            .expect("eight words");
        let s: &[AtomicU64; 8] = src.words()[src_word..][..8]
            .try_into()
            .expect("eight words");
        for (d, s) in d.iter().zip(s) {
            d.store(s.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }

    /// [`SharedBuffer::copy_from`] for all but one aligned line; out of line, so the hot paths
    /// that inline `copy_from` carry only the common case.
    #[inline(never)]
    fn copy_any(&self, dst_off: usize, src: &SharedBuffer, src_off: usize, len: usize) {
        if dst_off % WORD == 0 && src_off % WORD == 0 {
            // Slicing checks both ranges (and panics outside them, like the asserts below).
            let n = len / WORD;
            let d = &self.words()[dst_off / WORD..][..n];
            let s = &src.words()[src_off / WORD..][..n];
            for (d, s) in d.iter().zip(s) {
                d.store(s.load(Ordering::Relaxed), Ordering::Relaxed);
            }
            let tail = n * WORD;
            if tail < len {
                let mut t = [0u8; WORD];
                src.read(src_off + tail, &mut t[..len - tail]);
                self.write(dst_off + tail, &t[..len - tail]);
            }
            return;
        }
        assert!(self.contains(dst_off, len) && src.contains(src_off, len));
        let mut chunk = [0u8; 256];
        let mut done = 0;
        while done < len {
            let n = (len - done).min(chunk.len());
            src.read(src_off + done, &mut chunk[..n]);
            self.write(dst_off + done, &chunk[..n]);
            done += n;
        }
    }

    /// Copy `src` into the buffer at byte `off`. Whole words are stored; partial words are
    /// merged with a compare-exchange so concurrent writers of neighbouring bytes lose nothing.
    #[inline]
    pub fn write(&self, off: usize, src: &[u8]) {
        assert!(self.contains(off, src.len()), "write outside buffer");
        let words = self.words();
        let (head, body) = src.split_at(head_len(off, src.len()));
        if !head.is_empty() {
            merge(&words[off / WORD], off % WORD, head);
        }
        let first = (off + head.len()) / WORD;
        let mut whole = body.chunks_exact(WORD);
        for (s, w) in (&mut whole).zip(&words[first..]) {
            let mut v = [0u8; WORD];
            v.copy_from_slice(s);
            w.store(u64::from_ne_bytes(v), Ordering::Relaxed);
        }
        let tail = whole.remainder();
        if !tail.is_empty() {
            merge(&words[first + body.len() / WORD], 0, tail);
        }
    }

    /// Read one aligned 64-bit word as a little-endian (host-order on x86) value, as an RDMA
    /// atomic sees its target.
    pub fn load_u64(&self, off: usize) -> u64 {
        assert!(off % WORD == 0 && self.contains(off, WORD));
        u64::from_le(self.word(off / WORD).load(Ordering::Acquire))
    }

    /// Store one aligned little-endian word.
    pub fn store_u64(&self, off: usize, v: u64) {
        assert!(off % WORD == 0 && self.contains(off, WORD));
        self.word(off / WORD).store(v.to_le(), Ordering::Release);
    }

    /// Atomically apply `f` to the aligned little-endian word at `off` (the target of an RDMA
    /// atomic); returns the old value. `f` returns `None` to leave the word unchanged.
    pub fn atomic_update(&self, off: usize, mut f: impl FnMut(u64) -> Option<u64>) -> u64 {
        assert!(off % WORD == 0 && self.contains(off, WORD));
        let word = self.word(off / WORD);
        let r = word.fetch_update(Ordering::AcqRel, Ordering::Acquire, |raw| {
            f(u64::from_le(raw)).map(u64::to_le)
        });
        u64::from_le(r.unwrap_or_else(|v| v))
    }

    /// Copy a whole 64-byte basic block (8 aligned words) starting at `off` into `dst`.
    #[inline(always)]
    pub fn read_block(&self, off: usize, dst: &mut [u8; 64]) {
        assert!(off % WORD == 0, "unaligned block");
        let words: &[AtomicU64; 8] = self.words()[off / WORD..][..8]
            .try_into()
            .expect("eight words");
        for (chunk, w) in dst.chunks_exact_mut(WORD).zip(words) {
            chunk.copy_from_slice(&w.load(Ordering::Relaxed).to_ne_bytes());
        }
    }

    /// Store a whole 64-byte basic block at `off` (8 aligned words), as the host posts a WQE.
    #[inline(always)]
    pub fn write_block(&self, off: usize, src: &[u8; 64]) {
        assert!(off % WORD == 0, "unaligned block");
        let words: &[AtomicU64; 8] = self.words()[off / WORD..][..8]
            .try_into()
            .expect("eight words");
        for (chunk, w) in src.chunks_exact(WORD).zip(words) {
            let mut v = [0u8; WORD];
            v.copy_from_slice(chunk);
            w.store(u64::from_ne_bytes(v), Ordering::Relaxed);
        }
    }
}

impl Drop for SharedBuffer {
    fn drop(&mut self) {
        match &mut self.backing {
            Backing::Heap => {
                let lines = self.len_words.div_ceil(WORDS_PER_LINE);
                let slice =
                    std::ptr::slice_from_raw_parts_mut(self.words.as_ptr().cast::<Line>(), lines);
                // SAFETY: `words` came from `Box::leak` of a boxed slice of exactly `lines`
                // lines in `new` (which sized it from `len_words` the same way), and this is the
                // only place it is turned back into a Box.
                drop(unsafe { Box::from_raw(slice) });
            }
            Backing::Foreign(release) => {
                if let Some(r) = release.take() {
                    r();
                }
            }
        }
    }
}

/// Why an access to registered memory was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AccessFault {
    /// No region has this key.
    #[error("no memory region has key {0:#x}")]
    UnknownKey(u32),
    /// The region belongs to another protection domain.
    #[error("key {key:#x} belongs to protection domain {region_pd}, not {queue_pd}")]
    ForeignPd {
        /// The key.
        key: u32,
        /// The region's PD.
        region_pd: Pdn,
        /// The accessing queue pair's PD.
        queue_pd: Pdn,
    },
    /// The range is not inside the region.
    #[error("range {addr}+{len} outside region {region_addr}+{region_len} (key {key:#x})")]
    OutOfBounds {
        /// The key.
        key: u32,
        /// Start of the access.
        addr: VirtAddr,
        /// Length of the access.
        len: u64,
        /// Start of the region.
        region_addr: VirtAddr,
        /// Length of the region.
        region_len: u64,
    },
    /// The region lacks a right the operation needs.
    #[error("key {key:#x} lacks {missing} (has {has})")]
    MissingRight {
        /// The key.
        key: u32,
        /// The right needed.
        missing: Access,
        /// The rights the region has.
        has: Access,
    },
    /// An atomic target not aligned to 8 bytes.
    #[error("atomic target {0} is not 8-byte aligned")]
    Misaligned(VirtAddr),
}

/// A registered memory region: a window of a [`SharedBuffer`] with a key, a protection domain
/// and access rights. A descriptor, held by value: the key table keeps one in its slot and a
/// key cache copies it (a clone shares the buffer and keeps it alive, so a cached copy stays
/// safe to use after a deregistration, as an mkey a NIC has cached does).
#[derive(Debug)]
pub struct MemoryRegion {
    /// Local key (equal to the remote key, as on mlx5).
    pub lkey: Lkey,
    /// The protection domain it was registered in.
    pub pd: Pdn,
    /// First address WQEs may name.
    pub addr: VirtAddr,
    /// Length in bytes.
    pub len: u64,
    /// Rights granted.
    pub access: Access,
    buffer: Arc<SharedBuffer>,
    buffer_off: usize,
}

/// A checked window into registered memory, ready to read or write.
#[derive(Clone, Copy, Debug)]
pub struct Span<'a> {
    /// The buffer.
    pub buffer: &'a SharedBuffer,
    /// Byte offset of the window in the buffer.
    pub off: usize,
    /// Length of the window.
    pub len: usize,
}

impl<'a> Span<'a> {
    /// Copy the whole window out.
    pub fn read(&self, dst: &mut [u8]) {
        self.buffer.read(self.off, &mut dst[..self.len]);
    }

    /// Copy `src` (at most the window's length) in.
    pub fn write(&self, src: &[u8]) {
        self.buffer.write(self.off, &src[..self.len.min(src.len())]);
    }

    /// Copy the window `src` (same length or shorter) into this one.
    #[inline(always)]
    pub fn copy_from(&self, src: &Span<'_>) {
        self.buffer
            .copy_from(self.off, src.buffer, src.off, self.len.min(src.len));
    }
}

impl Clone for MemoryRegion {
    fn clone(&self) -> MemoryRegion {
        MemoryRegion {
            lkey: self.lkey,
            pd: self.pd,
            addr: self.addr,
            len: self.len,
            access: self.access,
            buffer: Arc::clone(&self.buffer),
            buffer_off: self.buffer_off,
        }
    }

    /// Become a copy of `source`, keeping this descriptor's hold on the buffer when both
    /// are of the same one. Why: a key cache replaces its entries this way, and a chain that
    /// walks its code windows replaces a window's entry with the next window's of the same
    /// buffer on every miss; the reference count's increment and decrement were locked
    /// instructions that waited for the PU's pending stores each time (`perf`: 70 % of an
    /// insertion's samples).
    fn clone_from(&mut self, source: &MemoryRegion) {
        if Arc::ptr_eq(&self.buffer, &source.buffer) {
            self.lkey = source.lkey;
            self.pd = source.pd;
            self.addr = source.addr;
            self.len = source.len;
            self.access = source.access;
            self.buffer_off = source.buffer_off;
        } else {
            *self = source.clone();
        }
    }
}

impl MemoryRegion {
    /// The remote key (same number as the local key).
    pub fn rkey(&self) -> Rkey {
        self.lkey.into()
    }

    /// The buffer this region is a window of.
    pub fn buffer(&self) -> &Arc<SharedBuffer> {
        &self.buffer
    }

    /// Check that a queue pair in `pd` may access `addr..addr+len` with rights `need`, and
    /// return the window; the error says which rule refused.
    #[inline(always)]
    pub fn check(
        &self,
        pd: Pdn,
        addr: VirtAddr,
        len: u64,
        need: Access,
    ) -> Result<Span<'_>, AccessFault> {
        match self.window(pd, addr, len, need) {
            Some(span) => Ok(span),
            None => Err(self.refusal(pd, addr, len, need)),
        }
    }

    /// The window `addr..addr+len` if a queue pair in `pd` may access it with rights `need`.
    /// The single place where PD, bounds and rights are decided (`check` explains a `None`).
    #[inline(always)]
    #[must_use]
    pub fn window(&self, pd: Pdn, addr: VirtAddr, len: u64, need: Access) -> Option<Span<'_>> {
        // An address below the region wraps `rel` past any region length (a region's
        // addresses are those of its memory, so `addr + len` never wraps), so one comparison
        // covers both ends.
        let rel = addr.0.wrapping_sub(self.addr.0);
        let inside = rel <= self.len && len <= self.len - rel;
        (pd == self.pd && inside && self.access.contains(need)).then(|| Span {
            buffer: &self.buffer,
            off: self.buffer_off + idx(rel),
            len: idx(len),
        })
    }

    /// Why `window` refused (PD first, then bounds, then rights).
    #[cold]
    #[inline(never)]
    fn refusal(&self, pd: Pdn, addr: VirtAddr, len: u64, need: Access) -> AccessFault {
        if pd != self.pd {
            return AccessFault::ForeignPd {
                key: self.lkey.0,
                region_pd: self.pd,
                queue_pd: pd,
            };
        }
        if !self.access.contains(need) && self.window(pd, addr, len, Access::NONE).is_some() {
            return AccessFault::MissingRight {
                key: self.lkey.0,
                missing: need,
                has: self.access,
            };
        }
        AccessFault::OutOfBounds {
            key: self.lkey.0,
            addr,
            len,
            region_addr: self.addr,
            region_len: self.len,
        }
    }
}

/// The key table of one NIC: registers and resolves memory regions.
///
/// Keys are `index << 8 | tag` like mlx5 mkeys; the tag changes each time an index is reused
/// so a stale key does not silently name a new region. `generation` increases on every
/// deregistration so per-queue key caches know when to drop what they hold.
#[derive(Debug)]
pub struct KeyTable {
    /// Read by every PU on a key-cache miss, changed by registrations: see [`ReadMostly`].
    slots: ReadMostly<Vec<KeySlot>>,
    /// Indices of empty slots, so a registration takes one without scanning the table (an
    /// install registers a key per code window: thousands for a large program). Changed only
    /// under the `slots` write lock.
    free: Mutex<Vec<usize>>,
    generation: AtomicU64,
    /// How many slots the table grows to: [`MAX_KEY_SLOTS`], smaller only in tests (where
    /// filling 2^24 slots would take gigabytes).
    max_slots: usize,
}

impl Default for KeyTable {
    fn default() -> KeyTable {
        KeyTable {
            slots: ReadMostly::default(),
            free: Mutex::default(),
            generation: AtomicU64::default(),
            max_slots: MAX_KEY_SLOTS,
        }
    }
}

/// One key's entry: the region's descriptor itself, in the table's array, as a NIC keeps an
/// mkey's context in its table. Why not behind a pointer: an unrolled chain names a new key
/// with every WQE that patches code (the installer gives every code window its own key), so
/// a queue's key cache misses on each. With each region in an allocation of its own,
/// written by the host's core at install, every miss was a cache-line transfer from that
/// core plus a locked increment of the region's reference count, serialised with the next;
/// here a miss reads the slots it resolves in order, from one array, and touches only the
/// shared buffer's count, which stays in the PU's cache (and not even that when it replaces
/// an entry of the same buffer: `MemoryRegion::clone_from`; measured in
/// docs/softnic-performance.md, "Session 37").
#[derive(Debug, Default)]
struct KeySlot {
    tag: u8,
    region: Option<MemoryRegion>,
}

/// Why a registration was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RegisterError {
    /// The window is not inside the buffer.
    #[error("window {off}+{len} is outside the {buffer_len}-byte buffer")]
    OutsideBuffer {
        /// Offset asked for.
        off: usize,
        /// Length asked for.
        len: usize,
        /// Buffer length.
        buffer_len: usize,
    },
    /// Zero-length regions are refused.
    #[error("zero-length region")]
    Empty,
    /// The 24-bit key index space is exhausted.
    #[error("key table full")]
    Full,
    /// Remote write or remote atomic rights asked for without local write, which
    /// `ibv_reg_mr(3)` requires with either (the NIC writes the memory for them).
    #[error("rights {access} include remote write or atomic but not local write")]
    RemoteWithoutLocalWrite {
        /// The rights asked for.
        access: Access,
    },
}

impl KeyTable {
    /// An empty table.
    pub fn new() -> KeyTable {
        KeyTable::default()
    }

    /// Register `len` bytes of `buffer` at `off`; the new region's descriptor (the table
    /// keeps its own copy).
    pub fn register(
        &self,
        pd: Pdn,
        buffer: &Arc<SharedBuffer>,
        off: usize,
        len: usize,
        access: Access,
    ) -> Result<MemoryRegion, RegisterError> {
        if len == 0 {
            return Err(RegisterError::Empty);
        }
        if (access.contains(Access::REMOTE_WRITE) || access.contains(Access::REMOTE_ATOMIC))
            && !access.contains(Access::LOCAL_WRITE)
        {
            return Err(RegisterError::RemoteWithoutLocalWrite { access });
        }
        if !buffer.contains(off, len) {
            return Err(RegisterError::OutsideBuffer {
                off,
                len,
                buffer_len: buffer.len(),
            });
        }
        let mut slots = self.slots.write();
        let free = self.free.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let index = match free {
            Some(i) => i,
            None if slots.len() < self.max_slots => {
                slots.push(KeySlot::default());
                slots.len() - 1
            }
            None => return Err(RegisterError::Full),
        };
        // Never fails: the table stops growing (Full) below 2^24 entries.
        let key_index = u32::try_from(index).map_err(|_| RegisterError::Full)?;
        let slot = &mut slots[index];
        slot.tag = slot.tag.wrapping_add(1);
        let key = Self::key(key_index, slot.tag);
        let region = MemoryRegion {
            lkey: Lkey(key),
            pd,
            addr: VirtAddr(buffer.addr().0 + off as u64),
            len: len as u64,
            access,
            buffer: Arc::clone(buffer),
            buffer_off: off,
        };
        slot.region = Some(region.clone());
        Ok(region)
    }

    /// Remove a region; later lookups of its key fail. Returns the region if it existed.
    pub fn deregister(&self, key: Lkey) -> Option<MemoryRegion> {
        let mut slots = self.slots.write();
        let slot = slots.get_mut(Self::index(key.0)?)?;
        if slot.tag != Self::tag(key.0) {
            return None;
        }
        let r = slot.region.take();
        if r.is_some() {
            let index = Self::index(key.0)?;
            self.free
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(index);
        }
        self.generation.fetch_add(1, Ordering::Release);
        r
    }

    /// The key of slot `index` under `tag` (the inverse of [`Self::index`] and [`Self::tag`]).
    /// Slot 0 is `2 << 8`: the keys below, 0 and INVALID_LKEY (0x100) among them, name no
    /// region.
    fn key(index: u32, tag: u8) -> u32 {
        ((index + 2) << 8) | u32::from(tag)
    }

    /// The tag a key carries: its low byte.
    fn tag(key: u32) -> u8 {
        (key & 0xff) as u8
    }

    fn index(key: u32) -> Option<usize> {
        ((key >> 8) as usize).checked_sub(2)
    }

    /// Resolve a key: a copy of its region's descriptor.
    pub fn lookup(&self, key: u32) -> Result<MemoryRegion, AccessFault> {
        self.view().region(key).cloned()
    }

    /// The table as it stands, held under its read lock until the view is dropped: for a
    /// caller that resolves several keys and uses their regions together (a receive's
    /// scatter list, checked whole and then written), with one lock and no copies.
    /// Registrations and deregistrations wait for it, so hold it briefly.
    pub fn view(&self) -> KeyView<'_> {
        KeyView(self.slots.read())
    }

    /// `key`'s slot index and region in `slots` (the table's, read under its lock).
    fn resolve(slots: &[KeySlot], key: u32) -> Result<(usize, &MemoryRegion), AccessFault> {
        Self::index(key)
            .and_then(|i| Some(i).zip(slots.get(i)))
            .filter(|(_, s)| s.tag == Self::tag(key))
            .and_then(|(i, s)| Some(i).zip(s.region.as_ref()))
            .ok_or(AccessFault::UnknownKey(key))
    }

    /// Resolve `key` and, under the same read lock, the regions registered in the `ahead`
    /// slots after its own: `found` sees each of the others with its key, then `key`'s own
    /// region last. Fails as [`KeyTable::lookup`] does if `key` names no region (and then
    /// `found` gets nothing).
    pub fn lookup_run(
        &self,
        key: u32,
        ahead: usize,
        mut found: impl FnMut(u32, &MemoryRegion),
    ) -> Result<(), AccessFault> {
        let KeyView(slots) = self.view();
        let (index, region) = Self::resolve(&slots, key)?;
        for (i, slot) in slots.iter().enumerate().skip(index + 1).take(ahead) {
            // Slots hold indices below `max_slots`, so every index here has a key.
            if let (Some(region), Ok(i)) = (&slot.region, u32::try_from(i)) {
                found(Self::key(i, slot.tag), region);
            }
        }
        found(key, region);
        Ok(())
    }

    /// Current generation: changes whenever a region goes away.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Every registered region (for listings).
    pub fn regions(&self) -> Vec<MemoryRegion> {
        let KeyView(slots) = self.view();
        slots.iter().filter_map(|s| s.region.clone()).collect()
    }

    /// How many regions are registered: `regions().len()` without copying them (the
    /// manager counts its objects every event-loop turn, and an install holds thousands
    /// of narrow keys).
    pub fn live(&self) -> usize {
        let KeyView(slots) = self.view();
        // Every empty slot is on the free list, which changes only under the write lock
        // held off by `slots`.
        let free = self.free.lock().unwrap_or_else(|e| e.into_inner()).len();
        slots.len() - free
    }
}

/// A [`KeyTable`] held still for a moment ([`KeyTable::view`]).
#[derive(Debug)]
pub struct KeyView<'t>(ReadGuard<'t, Vec<KeySlot>>);

impl KeyView<'_> {
    /// The region `key` names, as [`KeyTable::lookup`] resolves it.
    pub fn region(&self, key: u32) -> Result<&MemoryRegion, AccessFault> {
        KeyTable::resolve(&self.0, key).map(|(_, region)| region)
    }
}

/// A tiny per-queue cache of resolved keys, so the hot path does not take the table's lock.
/// Entries are dropped when the table's generation moves (a region was deregistered).
#[derive(Debug)]
pub struct KeyCache {
    generation: u64,
    /// The keys of `regions`, inline so a hit compares plain integers without following
    /// pointers.
    keys: [u32; KEY_CACHE_SIZE],
    regions: Vec<MemoryRegion>,
    next: usize,
    /// Changes whenever an entry stops meaning what it meant (the cache was cleared or an
    /// entry replaced), so an entry's index can be remembered beside this number and trusted
    /// while both the number and the table's generation are unchanged (see
    /// [`KeyCache::region_at`]). Starts at 1 and only grows: neither 0 (what a remembered
    /// epoch is before anything was resolved) nor [`KeyCache::STALE`] is ever current.
    epoch: u64,
    /// The table slot of the last key a miss resolved, the last one it read ahead included
    /// (see [`KeyCache::miss`]).
    last_miss: Option<usize>,
}

const KEY_CACHE_SIZE: usize = 8;

/// Slots after its own that a miss reads ahead when it follows a miss on the slot before.
const READ_AHEAD: usize = 3;

impl Default for KeyCache {
    fn default() -> KeyCache {
        KeyCache::new()
    }
}

impl KeyCache {
    /// What [`KeyCache::current_epoch`] returns while the cache is behind its table: never an
    /// epoch, so nothing remembered under one matches it (and nothing should be remembered
    /// under it).
    pub const STALE: u64 = u64::MAX;

    /// An empty cache.
    pub fn new() -> KeyCache {
        KeyCache {
            generation: 0,
            keys: [0; KEY_CACHE_SIZE],
            regions: Vec::new(),
            next: 0,
            epoch: 1,
            last_miss: None,
        }
    }

    /// Resolve `key` through the cache.
    #[inline(always)]
    pub fn get(&mut self, table: &KeyTable, key: u32) -> Result<&MemoryRegion, AccessFault> {
        let i = self.find(table, key)?;
        Ok(&self.regions[i])
    }

    /// Resolve `key` through the cache; the entry's index, for [`KeyCache::region_at`].
    #[inline(always)]
    pub fn find(&mut self, table: &KeyTable, key: u32) -> Result<usize, AccessFault> {
        if table.generation() == self.generation {
            // Most queues name one or two keys: try the first entry before the scan.
            if !self.regions.is_empty() && self.keys[0] == key {
                return Ok(0);
            }
            let n = self.regions.len();
            if let Some(i) = self.keys[..n].iter().position(|&k| k == key) {
                return Ok(i);
            }
        }
        self.miss(table, key)
    }

    /// The number that entry indices handed out now are valid under: the cache's epoch while
    /// the table has not dropped a region since the cache last looked, else
    /// [`KeyCache::STALE`] (which no epoch worth remembering equals).
    #[inline(always)]
    pub fn current_epoch(&self, table: &KeyTable) -> u64 {
        if self.is_current(table) {
            self.epoch
        } else {
            Self::STALE
        }
    }

    /// True while the table has dropped no region since the cache last looked (the first
    /// half of [`KeyCache::current_epoch`]'s test).
    #[inline(always)]
    #[must_use]
    pub fn is_current(&self, table: &KeyTable) -> bool {
        table.generation() == self.generation
    }

    /// The region at entry `i`, which [`KeyCache::find`] returned while
    /// [`KeyCache::current_epoch`] was `epoch`, if that is still so: no region has been
    /// deregistered and the entry was not replaced. The caller compares the epoch; this only
    /// bounds-checks.
    #[inline(always)]
    pub fn region_at(&self, i: usize) -> Option<&MemoryRegion> {
        self.regions.get(i)
    }

    #[cold]
    #[inline(never)]
    fn miss(&mut self, table: &KeyTable, key: u32) -> Result<usize, AccessFault> {
        let g = table.generation();
        if g != self.generation {
            self.regions.clear();
            self.generation = g;
            self.epoch += 1;
        }
        let n = self.regions.len();
        if let Some(i) = self.keys[..n].iter().position(|&k| k == key) {
            return Ok(i);
        }
        // A miss on the slot after the last miss's: the queue is walking keys registered one
        // after another, as an unrolled chain walks its code windows (one key each, taken in
        // order at install), each used once. Take the next slots' keys too, under the one
        // lock. Anything else takes the one key, so scattered keys cost no more than before.
        let slot = KeyTable::index(key);
        let ahead = if slot.is_some() && slot == self.last_miss.map(|s| s + 1) {
            READ_AHEAD
        } else {
            0
        };
        // `key`'s own entry is inserted last, so that none of the others can take its place
        // (a cache that was cleared refills free entries, then replaces from wherever its
        // oldest was).
        let mut last = None;
        table.lookup_run(key, ahead, |k, region| last = Some(self.insert(k, region)))?;
        self.last_miss = slot.map(|s| s + ahead);
        last.ok_or(AccessFault::UnknownKey(key))
    }

    /// Put `key`'s region in a free entry, or in place of the oldest; its index.
    fn insert(&mut self, key: u32, region: &MemoryRegion) -> usize {
        let n = self.regions.len();
        let i = if n < KEY_CACHE_SIZE {
            self.regions.push(region.clone());
            n
        } else {
            let i = self.next;
            self.next = (self.next + 1) % KEY_CACHE_SIZE;
            self.regions[i].clone_from(region);
            self.epoch += 1;
            i
        };
        self.keys[i] = key;
        i
    }
}

/// How many slots a [`KeyTable`] grows to. A key is `(index + 2) << 8 | tag` in 32 bits, so
/// `index + 2` must fit in 24: at `(1 << 24) - 1` slots the last index's key would shift its
/// top bit out and come out as a bare tag, a key that resolves to nothing.
const MAX_KEY_SLOTS: usize = (1 << 24) - 2;
const _: () = assert!(MAX_KEY_SLOTS - 1 + 2 < 1 << 24);

/// Bytes from `off` to the next word boundary, at most `len`: the part of an access of `len`
/// bytes at `off` before its whole words.
#[inline(always)]
fn head_len(off: usize, len: usize) -> usize {
    ((WORD - off % WORD) % WORD).min(len)
}

/// Put `part` into `word` at byte `at` (`at + part.len()` at most a word), with a
/// compare-exchange so that concurrent writers of the word's other bytes lose nothing.
#[inline]
fn merge(word: &AtomicU64, at: usize, part: &[u8]) {
    let _ = word.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
        let mut v = old.to_ne_bytes();
        v[at..at + part.len()].copy_from_slice(part);
        Some(u64::from_ne_bytes(v))
    });
}

pub(crate) mod read_mostly;
#[cfg(test)]
mod tests;
