//! Big-endian fields, as the NIC stores atomics' results and the catalog stores its buckets
//! and list nodes. Each reads from the start of the slice it is given.

/// The first 4 bytes of `b` as a big-endian u32.
pub fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

/// The first 6 bytes of `b` as a big-endian 48-bit number (a catalog key).
pub fn be48(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a[2..].copy_from_slice(&b[..6]);
    u64::from_be_bytes(a)
}

/// The first 8 bytes of `b` as a big-endian u64.
pub fn be64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_be_bytes(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_big_endian_from_the_start() {
        let b = [1, 2, 3, 4, 5, 6, 7, 8, 9];
        assert_eq!(be32(&b), 0x0102_0304);
        assert_eq!(be48(&b), 0x0102_0304_0506);
        assert_eq!(be64(&b), 0x0102_0304_0506_0708);
        assert_eq!(be64(&b[1..]), 0x0203_0405_0607_0809);
    }
}
