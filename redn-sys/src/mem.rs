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
use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};

const WORD: usize = 8;
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
// SAFETY: as above: all shared access is atomic.
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
    #[must_use]
    pub fn new(len: usize) -> Arc<SharedBuffer> {
        let n = len.div_ceil(WORD).max(1);
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
        if len == 0 || len % WORD != 0 {
            return Err(std::io::ErrorKind::InvalidInput.into());
        }
        // SAFETY: a fresh shared mapping at an address the kernel picks aliases no Rust
        // object; the arguments are plain values and `fd` is open (borrowed).
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
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
        // it, backed for its whole length and touched here only through this buffer (this
        // function's contract).
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
    slots: RwLock<Vec<KeySlot>>,
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
            slots: RwLock::default(),
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
        let mut slots = self.slots.write().unwrap_or_else(|e| e.into_inner());
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
        let mut slots = self.slots.write().unwrap_or_else(|e| e.into_inner());
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
        KeyView(self.slots.read().unwrap_or_else(|e| e.into_inner()))
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
}

/// A [`KeyTable`] held still for a moment ([`KeyTable::view`]).
#[derive(Debug)]
pub struct KeyView<'t>(RwLockReadGuard<'t, Vec<KeySlot>>);

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_access_at_any_alignment() {
        let b = SharedBuffer::new(64);
        b.write(3, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]);
        let mut out = [0u8; 16];
        b.read(0, &mut out);
        assert_eq!(out, [0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 0, 0]);
        b.write(8, &[0xff; 8]);
        b.read(0, &mut out);
        assert_eq!(
            &out[6..],
            &[4, 5, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]
        );
    }

    /// Every read and write of up to 40 bytes at every offset of three words, against a
    /// byte array: the head before a word boundary, the whole words and the tail each land
    /// where they belong, and no byte around them moves.
    #[test]
    fn reads_and_writes_of_every_length_at_every_offset_match_a_byte_model() {
        let b = SharedBuffer::new(64);
        let mut model: Vec<u8> = (100..164).collect();
        b.write(0, &model);
        let mut fill = 0u8;
        for off in 0..24 {
            for len in 0..=40 {
                let data: Vec<u8> = (0..len)
                    .map(|_| {
                        fill = fill.wrapping_add(37);
                        fill
                    })
                    .collect();
                b.write(off, &data);
                model[off..off + len].copy_from_slice(&data);
                let mut all = vec![0u8; 64];
                b.read(0, &mut all);
                assert_eq!(all, model, "after a write of {len} at {off}");
                let mut got = vec![0u8; len];
                b.read(off, &mut got);
                assert_eq!(got, &model[off..off + len], "a read of {len} at {off}");
            }
        }
    }

    #[test]
    #[should_panic(expected = "read outside buffer")]
    fn a_read_past_the_end_panics() {
        SharedBuffer::new(64).read(60, &mut [0u8; 5]);
    }

    #[test]
    #[should_panic(expected = "write outside buffer")]
    fn a_write_past_the_end_panics() {
        SharedBuffer::new(64).write(57, &[0u8; 8]);
    }

    #[test]
    fn blocks_round_trip() {
        let b = SharedBuffer::new(192);
        let block: [u8; 64] = std::array::from_fn(|i| u8::try_from(i + 1).unwrap());
        b.write_block(64, &block);
        let mut out = [0u8; 64];
        b.read_block(64, &mut out);
        assert_eq!(out, block);
        let mut all = vec![0u8; 192];
        b.read(0, &mut all);
        assert!(all[..64].iter().chain(&all[128..]).all(|&x| x == 0));
    }

    #[test]
    fn copy_between_buffers_at_any_alignment() {
        let a = SharedBuffer::new(192);
        let b = SharedBuffer::new(192);
        let data: Vec<u8> = (1..=192).collect();
        a.write(0, &data);
        // Whole aligned lines (the one-line fast path, also at other offsets), whole words,
        // and every kind of misalignment.
        for (d, s, n) in [
            (0, 0, 64),
            (64, 128, 64),
            (8, 16, 64),
            (0, 0, 40),
            (8, 0, 19),
            (3, 5, 30),
            (16, 1, 7),
            (1, 0, 64),
        ] {
            b.write(0, &[0u8; 192]);
            b.copy_from(d, &a, s, n);
            let mut out = vec![0u8; 192];
            b.read(0, &mut out);
            assert_eq!(&out[d..d + n], &data[s..s + n], "{d} {s} {n}");
            assert!(out[..d].iter().all(|&x| x == 0) && out[d + n..].iter().all(|&x| x == 0));
        }
    }

    #[test]
    fn atomics_see_little_endian_words() {
        let b = SharedBuffer::new(16);
        b.write(8, &[1, 0, 0, 0, 0, 0, 0, 0x80]);
        assert_eq!(b.load_u64(8), 0x8000_0000_0000_0001);
        let old = b.atomic_update(8, |v| Some(v + 1));
        assert_eq!(old, 0x8000_0000_0000_0001);
        let mut out = [0u8; 8];
        b.read(8, &mut out);
        assert_eq!(out, [2, 0, 0, 0, 0, 0, 0, 0x80]);
    }

    #[test]
    fn concurrent_byte_writers_lose_nothing() {
        let b = SharedBuffer::new(8);
        std::thread::scope(|s| {
            for i in 0..8usize {
                let b = &b;
                s.spawn(move || {
                    for _ in 0..100 {
                        b.write(i, &[u8::try_from(i + 1).unwrap()]);
                    }
                });
            }
        });
        let mut out = [0u8; 8];
        b.read(0, &mut out);
        assert_eq!(out, [1, 2, 3, 4, 5, 6, 7, 8]);
    }

    #[test]
    fn region_checks_pd_bounds_and_rights() {
        let t = KeyTable::new();
        let buf = SharedBuffer::new(4096);
        let r = t
            .register(Pdn(1), &buf, 1024, 1024, Access::REMOTE_READ)
            .unwrap();
        let base = r.addr;
        assert_eq!(base.0, buf.addr().0 + 1024);
        let s = r.check(Pdn(1), base, 1024, Access::REMOTE_READ).unwrap();
        assert_eq!((s.off, s.len), (1024, 1024));
        assert!(matches!(
            r.check(Pdn(2), base, 8, Access::NONE),
            Err(AccessFault::ForeignPd { .. })
        ));
        assert!(matches!(
            r.check(Pdn(1), VirtAddr(base.0 + 1020), 8, Access::NONE),
            Err(AccessFault::OutOfBounds { .. })
        ));
        assert!(matches!(
            r.check(Pdn(1), VirtAddr(base.0 - 1), 1, Access::NONE),
            Err(AccessFault::OutOfBounds { .. })
        ));
        assert!(matches!(
            r.check(Pdn(1), VirtAddr(u64::MAX), 2, Access::NONE),
            Err(AccessFault::OutOfBounds { .. })
        ));
        assert!(matches!(
            r.check(Pdn(1), base, 8, Access::REMOTE_WRITE),
            Err(AccessFault::MissingRight { .. })
        ));
    }

    #[test]
    fn a_full_table_refuses_until_a_region_goes_and_then_reuses_its_slot() {
        let t = KeyTable {
            max_slots: 3,
            ..KeyTable::default()
        };
        let buf = SharedBuffer::new(4096);
        let reg = |off: usize| t.register(Pdn(1), &buf, off, 64, Access::ALL);
        let keys: Vec<Lkey> = (0..3).map(|i| reg(i * 64).unwrap().lkey).collect();
        assert!(matches!(reg(192), Err(RegisterError::Full)));
        assert!(t.deregister(keys[1]).is_some());
        let again = reg(256).unwrap();
        // The freed index again, with a new tag: the old key names nothing.
        assert_eq!(again.lkey.0 >> 8, keys[1].0 >> 8);
        assert!(t.lookup(keys[1].0).is_err());
        assert_eq!(t.lookup(again.lkey.0).unwrap().addr, again.addr);
        assert!(matches!(reg(320), Err(RegisterError::Full)));
    }

    #[test]
    fn the_slot_limit_is_the_most_slots_whose_keys_fit_in_32_bits() {
        // A key is `(index + 2) << 8 | tag`: the last slot's key must keep every bit of its
        // index, and one slot more would not.
        let last = u64::try_from(MAX_KEY_SLOTS - 1).unwrap();
        let key = u32::try_from((last + 2) << 8 | 0xff).expect("the last slot's key fits");
        assert_eq!(KeyTable::index(key), Some(MAX_KEY_SLOTS - 1));
        assert!((last + 3) << 8 > u64::from(u32::MAX));
    }

    #[test]
    fn key_cache_epochs_move_when_an_entry_stops_meaning_what_it_meant() {
        let t = KeyTable::new();
        let buf = SharedBuffer::new(4096);
        let keys: Vec<u32> = (0..KEY_CACHE_SIZE + 1)
            .map(|i| {
                t.register(Pdn(1), &buf, i * 64, 64, Access::ALL)
                    .unwrap()
                    .lkey
                    .0
            })
            .collect();
        let mut cache = KeyCache::new();
        let e0 = cache.current_epoch(&t);
        assert!(e0 != 0 && e0 != KeyCache::STALE);
        // Filling free entries changes no entry's meaning. (Filled from the last slot down,
        // so that no miss follows a miss on the slot before: that would read ahead.)
        let mut first = KEY_CACHE_SIZE;
        for &k in keys[..KEY_CACHE_SIZE].iter().rev() {
            first = cache.find(&t, k).unwrap();
        }
        assert_eq!(cache.current_epoch(&t), e0);
        assert_eq!(cache.region_at(first).unwrap().lkey.0, keys[0]);
        // A full cache replaces an entry: the epoch moves.
        cache.find(&t, keys[KEY_CACHE_SIZE]).unwrap();
        let e1 = cache.current_epoch(&t);
        assert!(e1 != e0 && e1 != KeyCache::STALE);
        // A deregistration anywhere makes the cache stale until it looks again, then the
        // epoch has moved.
        t.deregister(Lkey(keys[1])).unwrap();
        assert_eq!(cache.current_epoch(&t), KeyCache::STALE);
        assert!(!cache.is_current(&t));
        cache.find(&t, keys[2]).unwrap();
        let e2 = cache.current_epoch(&t);
        assert!(e2 != e1 && e2 != KeyCache::STALE);
    }

    /// `n` regions registered one after another in a new table (so in consecutive slots),
    /// with their keys.
    fn consecutive_regions(n: usize) -> (KeyTable, Vec<u32>) {
        let t = KeyTable::new();
        let buf = SharedBuffer::new(64 * n);
        let keys = (0..n)
            .map(|i| {
                t.register(Pdn(1), &buf, i * 64, 64, Access::ALL)
                    .unwrap()
                    .lkey
                    .0
            })
            .collect();
        (t, keys)
    }

    /// The keys a cache holds, in entry order.
    fn held(cache: &KeyCache) -> Vec<u32> {
        cache.keys[..cache.regions.len()].to_vec()
    }

    #[test]
    fn a_miss_after_a_miss_on_the_slot_before_reads_the_next_slots_ahead() {
        let (t, keys) = consecutive_regions(12);
        let mut cache = KeyCache::new();
        cache.find(&t, keys[0]).unwrap();
        assert_eq!(held(&cache), [keys[0]], "a first miss takes its key alone");
        cache.find(&t, keys[1]).unwrap();
        let mut want = vec![keys[0]];
        want.extend(&keys[2..=1 + READ_AHEAD]);
        want.push(keys[1]);
        assert_eq!(held(&cache), want, "the key's own entry last");
        // The next miss is the slot after the last one read ahead: it reads ahead again.
        for &k in &keys[2..=1 + READ_AHEAD] {
            cache.find(&t, k).unwrap();
        }
        assert_eq!(held(&cache).len(), 2 + READ_AHEAD, "those were hits");
        let next = 2 + READ_AHEAD;
        cache.find(&t, keys[next]).unwrap();
        let now = held(&cache);
        for k in &keys[next..=next + READ_AHEAD] {
            assert!(now.contains(k), "{k:#x} read ahead: {now:x?}");
        }
        assert!(!now.contains(&keys[next + READ_AHEAD + 1]), "{now:x?}");
        // Misses out of order take their own key only.
        let mut cache = KeyCache::new();
        for i in [9, 3, 4 + 2, 5] {
            cache.find(&t, keys[i]).unwrap();
        }
        assert_eq!(held(&cache), [keys[9], keys[3], keys[6], keys[5]]);
    }

    #[test]
    fn keys_read_ahead_resolve_as_the_table_does_across_holes_and_reused_slots() {
        // A walk over consecutive slots, some empty, one reused under a new tag: every key
        // resolves to its own region or is refused exactly as the table refuses it.
        let (t, keys) = consecutive_regions(10);
        t.deregister(Lkey(keys[6])).unwrap();
        t.deregister(Lkey(keys[4])).unwrap();
        let buf = SharedBuffer::new(64);
        let reused = t.register(Pdn(1), &buf, 0, 64, Access::ALL).unwrap().lkey.0;
        assert_eq!(KeyTable::index(reused), KeyTable::index(keys[4]));
        let mut walk: Vec<u32> = keys.clone();
        walk.insert(5, reused);
        for start in 0..3 {
            let mut cache = KeyCache::new();
            for &k in &walk[start..] {
                match (cache.get(&t, k), t.lookup(k)) {
                    (Ok(r), Ok(want)) => assert_eq!(r.lkey, want.lkey, "key {k:#x}"),
                    (Err(e), Err(want)) => assert_eq!(e, want, "key {k:#x}"),
                    (got, want) => panic!("key {k:#x}: cache {got:?}, table {want:?}"),
                }
            }
        }
    }

    #[test]
    fn a_key_read_with_others_ahead_resolves_to_its_own_region_whatever_the_cache_held() {
        // A cache cleared by a deregistration refills its free entries, then replaces from
        // wherever its oldest entry was. Whatever that is, a miss that reads ahead returns
        // the entry of the key asked for, not one the read-ahead put in its place.
        let (t, keys) = consecutive_regions(3 * KEY_CACHE_SIZE);
        let (scattered, walk) = keys.split_at(2 * KEY_CACHE_SIZE);
        for before in 0..2 * KEY_CACHE_SIZE {
            let mut cache = KeyCache::new();
            // Misses from the last slot down read nothing ahead; past 8 they replace
            // entries, moving where the next replacement goes.
            for &k in scattered[..before].iter().rev() {
                cache.find(&t, k).unwrap();
            }
            for fill in 0..KEY_CACHE_SIZE {
                let mut cache = KeyCache {
                    generation: cache.generation,
                    keys: cache.keys,
                    regions: cache.regions.clone(),
                    next: cache.next,
                    epoch: cache.epoch,
                    last_miss: None,
                };
                cache.regions.truncate(fill);
                for &k in walk {
                    let i = cache.find(&t, k).unwrap();
                    let got = cache.region_at(i).unwrap().lkey.0;
                    assert_eq!(got, k, "after {before} misses, {fill} entries kept");
                }
            }
        }
    }

    #[test]
    fn a_replaced_cache_entry_is_all_of_the_new_region_whichever_buffer_it_is_in() {
        // Regions alternate between two buffers, at different offsets and with different
        // rights, so every replacement either keeps its entry's buffer (`clone_from`'s
        // shortcut) or changes it; each key must then resolve to exactly its own region.
        let t = KeyTable::new();
        let bufs = [SharedBuffer::new(4096), SharedBuffer::new(4096)];
        let regions: Vec<MemoryRegion> = (0..3 * KEY_CACHE_SIZE)
            .map(|i| {
                let access = if i % 3 == 0 {
                    Access::LOCAL_WRITE
                } else {
                    Access::ALL
                };
                t.register(
                    Pdn(if i % 2 == 0 { 1 } else { 2 }),
                    &bufs[i % 4 / 2],
                    64 * i,
                    32 + i,
                    access,
                )
                .unwrap()
            })
            .collect();
        let mut cache = KeyCache::new();
        for pass in 0..2 {
            for r in regions.iter().rev().chain(&regions) {
                let got = cache.get(&t, r.lkey.0).unwrap();
                let what = format!("pass {pass}, key {:#x}", r.lkey.0);
                assert_eq!(
                    (
                        got.lkey,
                        got.pd,
                        got.addr,
                        got.len,
                        got.access,
                        got.buffer_off
                    ),
                    (r.lkey, r.pd, r.addr, r.len, r.access, r.buffer_off),
                    "{what}"
                );
                assert!(Arc::ptr_eq(got.buffer(), r.buffer()), "{what}: its buffer");
            }
        }
    }

    #[test]
    fn stale_keys_do_not_resolve_to_new_regions() {
        let t = KeyTable::new();
        let buf = SharedBuffer::new(64);
        let a = t.register(Pdn(1), &buf, 0, 64, Access::ALL).unwrap();
        let key = a.lkey;
        assert!(key.0 > 0x1ff, "keys never collide with 0 or INVALID_LKEY");
        let mut cache = KeyCache::new();
        assert!(cache.get(&t, key.0).is_ok());
        t.deregister(key).unwrap();
        assert_eq!(
            cache.get(&t, key.0).unwrap_err(),
            AccessFault::UnknownKey(key.0)
        );
        let b = t.register(Pdn(1), &buf, 0, 64, Access::ALL).unwrap();
        assert_ne!(b.lkey, key);
        assert!(t.lookup(key.0).is_err());
        assert!(t.lookup(b.lkey.0).is_ok());
        assert!(matches!(
            t.register(Pdn(1), &buf, 8, 64, Access::ALL),
            Err(RegisterError::OutsideBuffer { .. })
        ));
    }
}
