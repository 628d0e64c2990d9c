//! Memory checks, keys and key caches (`redn_sys::mem`), tried at each limit: where a checked
//! window lies in its buffer, which refusal a bad access gets, which rights a registration
//! needs, what a deregistration removes, and how a key cache's entries and epochs move. Each
//! test was written against a mutation that the unit tests let through (docs/testing.md,
//! "Mutation testing").

use redn_sys::mem::{AccessFault, KeyCache, KeyTable, RegisterError, SharedBuffer};
use redn_sys::{Access, Lkey, Pdn, Rkey, VirtAddr};
use std::sync::Arc;

const PD: Pdn = Pdn(3);

/// A buffer whose every byte differs from its neighbours' (so a window read at a wrong
/// offset shows), its bytes, and a table with no region yet.
fn patterned(len: usize) -> (Arc<SharedBuffer>, Vec<u8>, KeyTable) {
    let buf = SharedBuffer::new(len);
    let bytes: Vec<u8> = (0..len)
        .map(|i| u8::try_from((i * 7 + i / 256) % 251).unwrap())
        .collect();
    buf.write(0, &bytes);
    (buf, bytes, KeyTable::new())
}

fn at(base: VirtAddr, rel: u64) -> VirtAddr {
    VirtAddr(base.0 + rel)
}

#[test]
fn a_checked_window_lies_where_its_address_does_in_the_buffer() {
    let (buf, bytes, t) = patterned(4096);
    let r = t.register(PD, &buf, 1024, 1024, Access::ALL).unwrap();
    for (rel, len) in [(0, 16), (100, 16), (1, 1023), (1016, 8), (1023, 1)] {
        let span = r.check(PD, at(r.addr, rel), len, Access::ALL).unwrap();
        let off = 1024 + usize::try_from(rel).unwrap();
        let n = usize::try_from(len).unwrap();
        assert_eq!((span.off, span.len), (off, n), "rel {rel} len {len}");
        let mut out = vec![0u8; n];
        span.read(&mut out);
        assert_eq!(out, bytes[off..off + n], "rel {rel} len {len}");
        // `window`, which the hot paths call, agrees with `check`.
        let w = r.window(PD, at(r.addr, rel), len, Access::ALL).unwrap();
        assert_eq!((w.off, w.len), (off, n));
    }
}

#[test]
fn a_window_ends_at_the_regions_last_byte() {
    let (buf, _, t) = patterned(4096);
    let r = t
        .register(PD, &buf, 1024, 1024, Access::REMOTE_READ)
        .unwrap();
    let (base, need) = (r.addr, Access::REMOTE_READ);
    for (rel, len) in [(0, 1024), (1023, 1), (1024, 0), (512, 512)] {
        assert!(r.check(PD, at(base, rel), len, need).is_ok(), "{rel}+{len}");
    }
    for (rel, len) in [(0, 1025), (1, 1024), (1024, 1), (1025, 0), (1023, 2)] {
        assert_eq!(
            r.check(PD, at(base, rel), len, need).unwrap_err(),
            AccessFault::OutOfBounds {
                key: r.lkey.0,
                addr: at(base, rel),
                len,
                region_addr: base,
                region_len: 1024,
            },
            "{rel}+{len}"
        );
        assert!(r.window(PD, at(base, rel), len, need).is_none());
    }
}

#[test]
fn a_refusal_names_the_pd_then_the_bounds_then_the_rights() {
    let (buf, _, t) = patterned(4096);
    let r = t
        .register(PD, &buf, 1024, 1024, Access::REMOTE_READ)
        .unwrap();
    let base = r.addr;
    let key = r.lkey.0;
    let out_of_bounds = |addr: VirtAddr, len: u64| AccessFault::OutOfBounds {
        key,
        addr,
        len,
        region_addr: base,
        region_len: 1024,
    };
    // Out of bounds and lacking the right: the bounds are what is wrong first.
    for (addr, len) in [
        (at(base, 1020), 8),
        (VirtAddr(base.0 - 1), 1),
        (at(base, 0), 2048),
    ] {
        assert_eq!(
            r.check(PD, addr, len, Access::REMOTE_WRITE).unwrap_err(),
            out_of_bounds(addr, len)
        );
    }
    // Inside, lacking the right.
    assert_eq!(
        r.check(
            PD,
            at(base, 8),
            8,
            Access::REMOTE_WRITE | Access::REMOTE_READ
        )
        .unwrap_err(),
        AccessFault::MissingRight {
            key,
            missing: Access::REMOTE_WRITE | Access::REMOTE_READ,
            has: Access::REMOTE_READ,
        }
    );
    // Another PD is refused as such whatever else is wrong.
    for (addr, len, need) in [
        (at(base, 8), 8, Access::REMOTE_READ),
        (at(base, 1020), 8, Access::REMOTE_WRITE),
    ] {
        assert_eq!(
            r.check(Pdn(4), addr, len, need).unwrap_err(),
            AccessFault::ForeignPd {
                key,
                region_pd: PD,
                queue_pd: Pdn(4),
            }
        );
        assert!(r.window(Pdn(4), addr, len, need).is_none());
    }
}

#[test]
fn remote_write_or_atomic_rights_need_local_write() {
    let (buf, _, t) = patterned(4096);
    for access in [
        Access::REMOTE_WRITE,
        Access::REMOTE_ATOMIC,
        Access::REMOTE_WRITE | Access::REMOTE_ATOMIC,
        Access::REMOTE_WRITE | Access::REMOTE_READ,
        Access::REMOTE_ATOMIC | Access::REMOTE_READ,
    ] {
        assert_eq!(
            t.register(PD, &buf, 0, 64, access).unwrap_err(),
            RegisterError::RemoteWithoutLocalWrite { access },
            "{access}"
        );
        let with_local = access | Access::LOCAL_WRITE;
        let r = t.register(PD, &buf, 0, 64, with_local).unwrap();
        assert_eq!(r.access, with_local);
    }
    for access in [Access::NONE, Access::REMOTE_READ, Access::LOCAL_WRITE] {
        assert!(t.register(PD, &buf, 0, 64, access).is_ok(), "{access}");
    }
}

#[test]
fn a_registration_stays_inside_its_buffer() {
    let (buf, _, t) = patterned(4096);
    assert_eq!(
        t.register(PD, &buf, 0, 0, Access::ALL).unwrap_err(),
        RegisterError::Empty
    );
    let last = t.register(PD, &buf, 4095, 1, Access::ALL).unwrap();
    assert_eq!(last.addr, VirtAddr(buf.addr().0 + 4095));
    assert_eq!(last.len, 1);
    for (off, len) in [
        (4095, 2),
        (4096, 1),
        (0, 4097),
        (usize::MAX, 2),
        (1, usize::MAX),
    ] {
        assert_eq!(
            t.register(PD, &buf, off, len, Access::ALL).unwrap_err(),
            RegisterError::OutsideBuffer {
                off,
                len,
                buffer_len: 4096
            },
            "{off}+{len}"
        );
    }
    assert_eq!(t.regions().len(), 1, "refusals register nothing");
}

#[test]
fn deregistration_removes_exactly_the_named_region() {
    let (buf, _, t) = patterned(4096);
    let regions: Vec<_> = (0..4)
        .map(|i| t.register(PD, &buf, i * 64, 64, Access::ALL).unwrap())
        .collect();
    let keys: Vec<Lkey> = regions.iter().map(|r| r.lkey).collect();
    let listed = |t: &KeyTable| t.regions().iter().map(|r| r.lkey).collect::<Vec<_>>();
    assert_eq!(listed(&t), keys);
    let g = t.generation();
    // The right index with another tag names nothing.
    let wrong_tag = Lkey(keys[1].0 ^ 0x80);
    assert!(t.deregister(wrong_tag).is_none());
    assert!(t.lookup(keys[1].0).is_ok());
    let gone = t.deregister(keys[1]).unwrap();
    assert_eq!(gone.lkey, keys[1]);
    assert!(t.generation() > g);
    assert_eq!(listed(&t), [keys[0], keys[2], keys[3]]);
    assert_eq!(
        t.lookup(keys[1].0).unwrap_err(),
        AccessFault::UnknownKey(keys[1].0)
    );
    assert!(t.deregister(keys[1]).is_none(), "already gone");
    // The freed index is reused under a new tag; the old key still names nothing and cannot
    // remove the new region.
    let again = t.register(PD, &buf, 1024, 64, Access::ALL).unwrap();
    assert_eq!(again.lkey.0 >> 8, keys[1].0 >> 8);
    assert_ne!(again.lkey, keys[1]);
    assert!(t.deregister(keys[1]).is_none());
    assert_eq!(t.lookup(again.lkey.0).unwrap().addr, again.addr);
    for (k, r) in keys.iter().zip(&regions).filter(|(k, _)| **k != keys[1]) {
        assert_eq!(t.lookup(k.0).unwrap().addr, r.addr, "{k:?}");
    }
}

#[test]
fn a_key_cache_resolves_no_key_nobody_registered() {
    let (buf, _, t) = patterned(4096);
    // Key 0 is what an empty cache's unused entries hold: it must not hit them.
    for key in [0, 0xff, 0x100, 0x1ff, 0x201, u32::MAX] {
        let mut cache = KeyCache::new();
        assert_eq!(
            cache.get(&t, key).unwrap_err(),
            AccessFault::UnknownKey(key),
            "{key:#x}"
        );
    }
    let r = t.register(PD, &buf, 0, 64, Access::ALL).unwrap();
    let mut cache = KeyCache::new();
    assert_eq!(cache.get(&t, 0).unwrap_err(), AccessFault::UnknownKey(0));
    assert_eq!(cache.get(&t, r.lkey.0).unwrap().addr, r.addr);
    assert_eq!(cache.get(&t, 0).unwrap_err(), AccessFault::UnknownKey(0));
}

/// Every epoch a cache showed so far; `push` checks a new one is not 0, not `STALE` and larger
/// than all of them (an epoch that came back would make a remembered entry index trusted
/// again after its entry was replaced).
struct Epochs(Vec<u64>);

impl Epochs {
    fn push_new(&mut self, e: u64) {
        assert!(e != 0 && e != KeyCache::STALE, "epoch {e}");
        assert!(self.0.iter().all(|&old| e > old), "{e} after {:?}", self.0);
        self.0.push(e);
    }

    fn last(&self) -> u64 {
        *self.0.last().unwrap()
    }
}

#[test]
fn a_full_key_cache_replaces_its_entries_in_turn_and_moves_its_epoch() {
    // The cache's size (`KEY_CACHE_SIZE` in mem.rs).
    const ENTRIES: usize = 8;
    let (buf, _, t) = patterned(4096);
    let mut keys: Vec<u32> = (0..3 * ENTRIES)
        .map(|i| {
            t.register(PD, &buf, i * 64, 64, Access::ALL)
                .unwrap()
                .lkey
                .0
        })
        .collect();
    // Looked up from the last registered down: a miss right after a miss on the slot before
    // would read the next slots ahead, and this test is about one key a miss.
    keys.reverse();
    let mut cache = KeyCache::new();
    let mut epochs = Epochs(Vec::new());
    epochs.push_new(cache.current_epoch(&t));
    // Filling the free entries: indices in order, the epoch unchanged.
    for (i, &k) in keys[..ENTRIES].iter().enumerate() {
        assert_eq!(cache.find(&t, k).unwrap(), i);
        assert_eq!(cache.current_epoch(&t), epochs.last());
    }
    // Every later key replaces the entry after the last replaced one, round the cache twice.
    for (n, &k) in keys[ENTRIES..].iter().enumerate() {
        let i = n % ENTRIES;
        assert_eq!(cache.find(&t, k).unwrap(), i, "key {n} past a full cache");
        assert_eq!(cache.region_at(i).unwrap().lkey.0, k);
        epochs.push_new(cache.current_epoch(&t));
        // A hit on the entry just replaced, or on one replaced earlier, changes nothing.
        assert_eq!(cache.find(&t, k).unwrap(), i);
        if n > 0 {
            assert_eq!(
                cache.find(&t, keys[ENTRIES + n - 1]).unwrap(),
                (n - 1) % ENTRIES
            );
        }
        assert_eq!(cache.current_epoch(&t), epochs.last());
    }
    // A deregistration: stale until the cache looks again, then a new epoch (larger than
    // every earlier one) and the cache refilled from its first entry.
    t.deregister(Lkey(keys[0])).unwrap();
    assert_eq!(cache.current_epoch(&t), KeyCache::STALE);
    assert_eq!(cache.find(&t, keys[5]).unwrap(), 0);
    epochs.push_new(cache.current_epoch(&t));
    assert_eq!(
        cache.get(&t, keys[0]).unwrap_err(),
        AccessFault::UnknownKey(keys[0])
    );
    assert_eq!(cache.get(&t, keys[5]).unwrap().lkey.0, keys[5]);
    assert_eq!(cache.current_epoch(&t), epochs.last());
}

#[test]
fn a_key_cache_drops_every_entry_when_any_region_goes() {
    let (buf, _, t) = patterned(4096);
    let a = t.register(PD, &buf, 0, 64, Access::ALL).unwrap();
    let b = t.register(PD, &buf, 64, 64, Access::ALL).unwrap();
    let mut cache = KeyCache::new();
    assert_eq!(cache.find(&t, a.lkey.0).unwrap(), 0);
    assert_eq!(cache.find(&t, b.lkey.0).unwrap(), 1);
    assert!(cache.is_current(&t));
    // b goes; its index is reused by a region over other bytes. Neither b's key nor a's old
    // entry index may reach it through the cache.
    t.deregister(b.lkey).unwrap();
    assert!(!cache.is_current(&t));
    let c = t.register(PD, &buf, 128, 64, Access::ALL).unwrap();
    assert_eq!(
        cache.get(&t, b.lkey.0).unwrap_err(),
        AccessFault::UnknownKey(b.lkey.0)
    );
    assert!(cache.is_current(&t));
    assert_eq!(cache.find(&t, c.lkey.0).unwrap(), 0);
    assert_eq!(cache.region_at(0).unwrap().addr, c.addr);
    assert!(cache.region_at(1).is_none());
    assert_eq!(cache.get(&t, a.lkey.0).unwrap().addr, a.addr);
}

#[test]
fn copies_land_exactly_where_asked_whichever_side_is_aligned() {
    let (src, bytes, _) = patterned(1024);
    let dst = SharedBuffer::new(1024);
    // (dst, src, len): one line with only the destination aligned; whole words from an
    // aligned source other than word 0; a destination aligned and a source not; more than
    // the 256-byte bounce buffer, unaligned.
    for (d, s, n) in [
        (0, 3, 64),
        (8, 1, 64),
        (64, 8, 64),
        (8, 16, 40),
        (16, 24, 19),
        (8, 3, 30),
        (16, 1, 20),
        (3, 5, 600),
        (8, 1, 700),
        (0, 0, 1024),
    ] {
        dst.write(0, &[0u8; 1024]);
        dst.copy_from(d, &src, s, n);
        let mut out = vec![0u8; 1024];
        dst.read(0, &mut out);
        assert_eq!(out[d..d + n], bytes[s..s + n], "{d} {s} {n}");
        assert!(
            out[..d].iter().chain(&out[d + n..]).all(|&x| x == 0),
            "{d} {s} {n}: bytes outside the copy changed"
        );
    }
}

#[test]
fn a_buffers_address_is_its_memory() {
    let a = SharedBuffer::new(100);
    let b = SharedBuffer::new(100);
    assert_eq!(a.len(), 104, "rounded up to whole words");
    assert!(!a.is_empty());
    for buf in [&a, &b] {
        assert_eq!(buf.addr().0, buf.as_ptr() as u64);
        assert_eq!(buf.addr().0 % 64, 0, "buffers start on a cache line");
    }
    // Two live buffers never share an address: each is its own memory.
    let (a0, b0) = (a.addr().0, b.addr().0);
    assert!(a0 + 104 <= b0 || b0 + 104 <= a0, "{a0:#x} {b0:#x}");
    let shown = format!("{a:?}");
    assert!(
        shown.contains("len: 104") && shown.contains("heap"),
        "{shown}"
    );
}

#[test]
fn an_atomic_store_writes_its_own_little_endian_word() {
    let buf = SharedBuffer::new(32);
    buf.store_u64(16, 0x0807_0605_0403_0201);
    let mut out = [0u8; 32];
    buf.read(0, &mut out);
    assert_eq!(out[16..24], [1, 2, 3, 4, 5, 6, 7, 8]);
    assert!(out[..16].iter().chain(&out[24..]).all(|&x| x == 0));
    assert_eq!(buf.load_u64(16), 0x0807_0605_0403_0201);
    assert_eq!(buf.load_u64(8), 0);
}

#[test]
fn spans_write_and_copy_only_their_windows() {
    let (buf, bytes, t) = patterned(512);
    let r = t.register(PD, &buf, 64, 256, Access::ALL).unwrap();
    // A write longer than its window stops at the window's end.
    let into = r.check(PD, at(r.addr, 8), 4, Access::LOCAL_WRITE).unwrap();
    into.write(&[0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6]);
    let mut expect = bytes.clone();
    expect[72..76].copy_from_slice(&[0xa1, 0xa2, 0xa3, 0xa4]);
    let mut out = vec![0u8; 512];
    buf.read(0, &mut out);
    assert_eq!(out, expect);
    // A copy from a longer window takes as many bytes as the destination holds.
    let from = r
        .check(PD, at(r.addr, 100), 40, Access::REMOTE_READ)
        .unwrap();
    let to = r
        .check(PD, at(r.addr, 201), 19, Access::REMOTE_WRITE)
        .unwrap();
    to.copy_from(&from);
    expect.copy_within(164..183, 265);
    buf.read(0, &mut out);
    assert_eq!(out, expect);
    let mut window = [0u8; 19];
    to.read(&mut window);
    assert_eq!(window[..], expect[265..284]);
}

#[test]
fn a_mapped_buffer_is_released_once_when_its_last_holder_drops() {
    use std::ptr::NonNull;
    use std::sync::atomic::{AtomicUsize, Ordering};
    const WORDS: usize = 8;
    let memory: &'static mut [u64] = Box::leak(vec![0u64; WORDS].into_boxed_slice());
    let raw = memory.as_mut_ptr();
    let releases = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&releases);
    let addr = raw as usize;
    let release = Box::new(move || {
        counted.fetch_add(1, Ordering::SeqCst);
        let slice = std::ptr::slice_from_raw_parts_mut(addr as *mut u64, WORDS);
        // SAFETY: the slice leaked above, freed here once (the buffer calls `release` once)
        // and accessed only through the buffer, which is gone when it calls this.
        drop(unsafe { Box::from_raw(slice) });
    });
    let ptr = NonNull::new(raw.cast::<u8>()).unwrap();
    // SAFETY: `ptr` is 8-byte aligned (a u64 slice), valid for 64 bytes until `release`
    // frees it, and not touched other than through the buffer from here on.
    let buf = unsafe { SharedBuffer::from_raw(ptr, WORDS * 8, release) };
    assert_eq!(buf.addr().0, addr as u64);
    buf.store_u64(8, 7);
    let other = Arc::clone(&buf);
    drop(buf);
    assert_eq!(releases.load(Ordering::SeqCst), 0, "still held");
    assert_eq!(other.load_u64(8), 7);
    drop(other);
    assert_eq!(releases.load(Ordering::SeqCst), 1);
}

#[test]
fn a_regions_remote_key_is_its_local_key() {
    let (buf, _, t) = patterned(128);
    let r = t.register(PD, &buf, 0, 128, Access::ALL).unwrap();
    assert_eq!(r.rkey(), Rkey(r.lkey.0));
    assert!(Arc::ptr_eq(r.buffer(), &buf));
}
