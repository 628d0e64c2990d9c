//! Registered memory's checks: windows, keys, rights, protection domains and the caches.

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
fn live_counts_the_registered_regions_as_regions_lists_them() {
    let t = KeyTable::new();
    let buf = SharedBuffer::new(64);
    assert_eq!(t.live(), 0);
    let keys: Vec<Lkey> = (0..4)
        .map(|_| t.register(Pdn(1), &buf, 0, 64, Access::ALL).unwrap().lkey)
        .collect();
    assert_eq!((t.live(), t.regions().len()), (4, 4));
    t.deregister(keys[1]).unwrap();
    t.deregister(keys[3]).unwrap();
    assert!(
        t.deregister(keys[3]).is_none(),
        "a key gone twice counts once"
    );
    assert_eq!((t.live(), t.regions().len()), (2, 2));
    t.register(Pdn(1), &buf, 0, 64, Access::ALL).unwrap();
    assert_eq!(
        (t.live(), t.regions().len()),
        (3, 3),
        "a free slot taken again"
    );
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

/// A mapping of this process starts at `addr` (from `/proc/self/maps`).
#[cfg(not(miri))]
fn a_mapping_starts_at(addr: u64) -> bool {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter_map(|l| l.split('-').next())
        .any(|start| u64::from_str_radix(start, 16) == Ok(addr))
}

/// From `MAP_AT` bytes on a buffer is a zeroed mapping of its own, gone when the buffer
/// drops, so that rings freed by an uninstall go back to the kernel whatever the heap holds
/// around them; a smaller one comes from the heap.
#[test]
#[cfg(not(miri))]
fn large_buffers_are_mappings_of_their_own_that_go_when_dropped() {
    let big = SharedBuffer::new(MAP_AT);
    let at = big.addr().0;
    assert!(
        a_mapping_starts_at(at),
        "{big:?} is not a mapping of its own"
    );
    assert_eq!(big.len(), MAP_AT);
    assert!((0..MAP_AT).step_by(4096).all(|o| big.load_u64(o) == 0));
    big.store_u64(MAP_AT - 8, 7);
    assert_eq!(big.load_u64(MAP_AT - 8), 7);
    drop(big);
    assert!(
        !a_mapping_starts_at(at),
        "the mapping stayed after the drop"
    );
    let small = SharedBuffer::new(MAP_AT - 8);
    assert!(!a_mapping_starts_at(small.addr().0), "{small:?}");
    assert_eq!(
        small.addr().0 % 64,
        0,
        "a heap buffer starts on a cache line"
    );
}

/// A mapping's length must be a nonzero number of words: a memfd an app shares is mapped
/// with its own length, which the manager takes from the file.
#[test]
#[cfg(not(miri))]
fn a_mapping_of_no_bytes_or_of_part_of_a_word_is_refused() {
    for len in [0, 12] {
        // SAFETY: anonymous, so no file to shrink; refused before any mapping is made.
        let got = unsafe { SharedBuffer::mapping(len, ANONYMOUS, -1) };
        assert_eq!(
            got.map(|_| ()).map_err(|e| e.kind()),
            Err(std::io::ErrorKind::InvalidInput),
            "{len} bytes"
        );
    }
    // SAFETY: as above.
    let one = unsafe { SharedBuffer::mapping(8, ANONYMOUS, -1) }.unwrap();
    assert_eq!(one.len(), 8);
}
