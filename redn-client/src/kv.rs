//! A two-choice hash table in a sealed region, laid out for the `hash-get` offloads.
//!
//! Layout (offsets in the region):
//! - `0..TABLE`: `buckets` buckets every [`BUCKET_STRIDE`] bytes, each 18 bytes as the
//!   catalog's hash-get reads them: key (big-endian 48 bits) @0, value length (BE32) @6,
//!   value address (BE64) @10; key 0 marks an empty bucket;
//! - from the next page: one [`VALUE_SLOT`]-byte value slot per bucket.
//!
//! A key may live in either of two buckets ([`TwoChoiceTable::candidates`]); a remote
//! client computes the same two and asks the offload to probe them. Value addresses are
//! the manager's (`RegisterRegion`'s `addr` plus an offset), because the NIC follows them.
//! A SET writes the value first and the bucket after it, so a probe never follows a bucket
//! to a value not yet written.

use crate::{Error, SealedRegion};

/// Distance between buckets (the catalog's `BUCKET_STRIDE`).
pub const BUCKET_STRIDE: u64 = 32;
/// Bytes of a bucket.
pub const BUCKET_LEN: u64 = 18;
/// Largest value.
pub const VALUE_SLOT: u64 = 64;
/// Largest key: 48 bits.
pub const MAX_KEY: u64 = (1 << 48) - 1;

/// Why a SET failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SetError {
    /// Key 0 marks empty buckets; keys have 48 bits.
    #[error("key {0:#x} is outside 1..=2^48-1")]
    BadKey(u64),
    /// The value does not fit a slot.
    #[error("a value of {0} bytes does not fit a {VALUE_SLOT}-byte slot")]
    TooLong(usize),
    /// Both candidate buckets hold other keys.
    #[error("both buckets of key {0:#x} are taken")]
    Full(u64),
    /// Writing the region failed.
    #[error("writing the region failed")]
    Region(#[source] Error),
}

/// The table.
#[derive(Debug)]
pub struct TwoChoiceTable {
    region: SealedRegion,
    buckets: u64,
    /// The manager's address of the region's first byte.
    base: u64,
}

/// Where the table and the values lie in a region holding `buckets` buckets.
pub fn layout(buckets: u64) -> (u64, u64, u64) {
    let table_len = buckets * BUCKET_STRIDE;
    let values_at = table_len.div_ceil(4096) * 4096;
    (table_len, values_at, buckets * VALUE_SLOT)
}

fn mix(mut x: u64) -> u64 {
    // splitmix64's finaliser: cheap, and every input bit moves every output bit.
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The two bucket indices of `key` in a table of `buckets`.
pub fn bucket_indices(key: u64, buckets: u64) -> [u64; 2] {
    let n = buckets.max(1);
    let a = mix(key) % n;
    let mut b = mix(key ^ 0x9e37_79b9_7f4a_7c15) % n;
    if b == a && n > 1 {
        b = (a + 1) % n;
    }
    [a, b]
}

/// The bytes of a bucket.
pub fn bucket_bytes(key: u64, value_len: u32, value_addr: u64) -> [u8; 18] {
    let mut b = [0u8; 18];
    b[..6].copy_from_slice(&key.to_be_bytes()[2..]);
    b[6..10].copy_from_slice(&value_len.to_be_bytes());
    b[10..18].copy_from_slice(&value_addr.to_be_bytes());
    b
}

impl TwoChoiceTable {
    /// A region for `buckets` buckets and their values.
    ///
    /// # Errors
    /// [`Error::Memfd`].
    pub fn create(buckets: u64) -> Result<TwoChoiceTable, Error> {
        let (_, values_at, values_len) = layout(buckets);
        Ok(TwoChoiceTable {
            region: SealedRegion::create("redn-kv", values_at + values_len)?,
            buckets,
            base: 0,
        })
    }

    /// The region, to register.
    pub fn region(&self) -> &SealedRegion {
        &self.region
    }

    /// Record the manager's address of the region (from `RegisterRegion`); SETs need it.
    pub fn set_base(&mut self, addr: u64) {
        self.base = addr;
    }

    /// Buckets.
    pub fn buckets(&self) -> u64 {
        self.buckets
    }

    /// The manager's address of the region's first byte, as [`TwoChoiceTable::set_base`] set it.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// The `table` and `values` bindings for hash-get as `(name, region, offset, len)`,
    /// with the table's region registered as `region`.
    pub fn bindings(&self, region: u64) -> [(&'static str, u64, u64, u64); 2] {
        let (table_len, values_at, values_len) = layout(self.buckets);
        [
            ("table", region, 0, table_len),
            ("values", region, values_at, values_len),
        ]
    }

    /// The manager's addresses of `key`'s two buckets: what a remote client sends.
    pub fn candidates(&self, key: u64) -> [u64; 2] {
        bucket_indices(key, self.buckets).map(|i| self.base + i * BUCKET_STRIDE)
    }

    fn bucket_key(&self, index: u64) -> Result<u64, SetError> {
        let mut k = [0u8; 8];
        self.region
            .read_at(index * BUCKET_STRIDE, &mut k[2..])
            .map_err(SetError::Region)?;
        Ok(u64::from_be_bytes(k))
    }

    /// Store `value` under `key`, replacing an older value.
    ///
    /// # Errors
    /// [`SetError`].
    pub fn set(&mut self, key: u64, value: &[u8]) -> Result<(), SetError> {
        if key == 0 || key > MAX_KEY {
            return Err(SetError::BadKey(key));
        }
        let len = u32::try_from(value.len())
            .ok()
            .filter(|&l| u64::from(l) <= VALUE_SLOT)
            .ok_or(SetError::TooLong(value.len()))?;
        let [a, b] = bucket_indices(key, self.buckets);
        let mut chosen = None;
        for i in [a, b] {
            if self.bucket_key(i)? == key {
                chosen = Some(i);
                break;
            }
        }
        if chosen.is_none() {
            for i in [a, b] {
                if self.bucket_key(i)? == 0 {
                    chosen = Some(i);
                    break;
                }
            }
        }
        let i = chosen.ok_or(SetError::Full(key))?;
        let (_, values_at, _) = layout(self.buckets);
        let slot = values_at + i * VALUE_SLOT;
        self.region
            .write_at(slot, value)
            .map_err(SetError::Region)?;
        let bucket = bucket_bytes(key, len, self.base + slot);
        self.region
            .write_at(i * BUCKET_STRIDE, &bucket)
            .map_err(SetError::Region)
    }

    /// The value under `key`, read the way the offload reads it (for checks).
    ///
    /// # Errors
    /// [`Error::Memfd`].
    pub fn get(&self, key: u64) -> Result<Option<Vec<u8>>, Error> {
        let (_, values_at, _) = layout(self.buckets);
        for i in bucket_indices(key, self.buckets) {
            let mut b = [0u8; 18];
            self.region.read_at(i * BUCKET_STRIDE, &mut b)?;
            let mut k = [0u8; 8];
            k[2..].copy_from_slice(&b[..6]);
            if key != 0 && u64::from_be_bytes(k) == key {
                let len = u32::from_be_bytes([b[6], b[7], b[8], b[9]]);
                let mut v = vec![0u8; usize::try_from(len).unwrap_or(0)];
                self.region.read_at(values_at + i * VALUE_SLOT, &mut v)?;
                return Ok(Some(v));
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_laid_out_as_the_catalog_reads_them() {
        use redn_program::program::catalog;
        assert_eq!(BUCKET_STRIDE, catalog::BUCKET_STRIDE);
        assert_eq!(BUCKET_LEN, catalog::BUCKET_LEN);
        let (k, l, a) = (0xabcd_1234_5678, 41, 0x7f00_dead_beef);
        assert_eq!(bucket_bytes(k, l, a), catalog::bucket_bytes(k, l, a));
    }

    #[test]
    fn sets_land_in_one_of_two_buckets_and_read_back() {
        let mut t = TwoChoiceTable::create(8).unwrap();
        t.set_base(0x1000_0000);
        for key in 1..=8u64 {
            match t.set(key, format!("v{key}").as_bytes()) {
                Ok(()) => assert_eq!(t.get(key).unwrap().unwrap(), format!("v{key}").as_bytes()),
                Err(SetError::Full(k)) => assert_eq!(k, key),
                Err(e) => panic!("{e}"),
            }
        }
        assert!(t.get(99).unwrap().is_none());
        assert!(matches!(t.set(0, b"x"), Err(SetError::BadKey(0))));
        assert!(matches!(t.set(1, &[0; 65]), Err(SetError::TooLong(65))));
        let [a, b] = t.candidates(5);
        assert_ne!(a, b);
        assert_eq!((a - 0x1000_0000) % BUCKET_STRIDE, 0);
    }
}
