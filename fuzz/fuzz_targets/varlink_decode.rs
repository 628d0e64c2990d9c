//! The manager's varlink decoding on arbitrary bytes: splitting a stream into messages,
//! parsing calls and replies, and parsing interface definitions. Never a panic; a call that
//! parses encodes back to one that parses the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use redn_proto::codec::{Call, Limits, MessageBuffer, Reply};

fuzz_target!(|data: &[u8]| {
    let limits = Limits {
        max_message: 4096,
        ..Limits::default()
    };
    let mut buf = MessageBuffer::new(limits);
    // Feed in two pieces, as two reads would bring them.
    let (a, b) = data.split_at(data.len() / 2);
    for piece in [a, b] {
        buf.extend(piece);
        while let Some(msg) = buf.next_message() {
            let Ok(msg) = msg else { return };
            if let Ok(call) = Call::parse(&msg, &limits) {
                let bytes = call.encode();
                let again = Call::parse(&bytes[..bytes.len() - 1], &Limits::default())
                    .expect("an encoded call parses");
                assert_eq!(again, call);
            }
            let _ = Reply::parse(&msg, &limits);
        }
    }
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = redn_proto::idl::parse(text);
    }
});
