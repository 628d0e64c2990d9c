//! The catalog's 48-bit keys, as buckets and list nodes store them (big-endian, 6 bytes), and
//! the bytes of fill patterns. Fields the NIC itself stores go through `redn_program::endian`.

/// The low byte of `x`: a fill pattern's byte (patterns repeat every 256 on purpose).
#[must_use]
pub fn low_byte(x: usize) -> u8 {
    x.to_le_bytes()[0]
}

/// The first 6 bytes of `b` as a big-endian 48-bit number (a catalog key).
pub fn be48(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a[2..].copy_from_slice(&b[..6]);
    u64::from_be_bytes(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_big_endian_from_the_start() {
        let b = [1, 2, 3, 4, 5, 6, 7, 8, 9];
        assert_eq!(be48(&b), 0x0102_0304_0506);
        assert_eq!(be48(&b[1..]), 0x0203_0405_0607);
    }
}
