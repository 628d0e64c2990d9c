//! Client tokens compare equal only when every one of their 32 bytes is equal.

use redn_policy::Token;

/// A few tokens with different byte patterns.
fn tokens() -> Vec<[u8; Token::BYTES]> {
    let mut counting = [0u8; Token::BYTES];
    for (i, b) in counting.iter_mut().enumerate() {
        *b = u8::try_from(i).unwrap().wrapping_mul(37).wrapping_add(11);
    }
    let mut one = [0u8; Token::BYTES];
    one[Token::BYTES - 1] = 1;
    vec![counting, [0xff; Token::BYTES], [0x80; Token::BYTES], one]
}

#[test]
fn tokens_differing_at_any_one_byte_do_not_match() {
    for bytes in tokens() {
        let t = Token::from_bytes(bytes);
        assert_eq!(t, Token::from_bytes(bytes));
        assert_eq!(t, t.clone());
        for i in 0..Token::BYTES {
            // Every single-bit difference at byte i, and the byte's complement.
            for flip in (0..8).map(|bit| 1u8 << bit).chain([0xff]) {
                let mut other = bytes;
                other[i] ^= flip;
                let o = Token::from_bytes(other);
                assert!(t != o, "byte {i} ^ {flip:#04x} matched");
                assert!(o != t, "byte {i} ^ {flip:#04x} matched (reversed)");
                assert!(!t.eq(&o) && !o.eq(&t), "byte {i} ^ {flip:#04x}");
            }
        }
    }
}

#[test]
fn tokens_differing_at_the_first_and_last_bytes_do_not_match() {
    for bytes in tokens() {
        let mut other = bytes;
        other[0] ^= 0x5a;
        other[Token::BYTES - 1] ^= 0xa5;
        assert_ne!(Token::from_bytes(bytes), Token::from_bytes(other));
        // Differing everywhere but byte 0, and everywhere but the last byte.
        for keep in [0, Token::BYTES - 1] {
            let mut other = bytes.map(|b| !b);
            other[keep] = bytes[keep];
            assert_ne!(Token::from_bytes(bytes), Token::from_bytes(other), "{keep}");
        }
    }
}
