//! Replies queued for a connection whose peer has not read them yet.
//!
//! What the kernel did not take stays here until the socket is writable again. A peer that
//! reads slowly but never quite catches up must not make this grow: bytes already written
//! are dropped from the front once there are enough of them to be worth moving, and a
//! buffer that grew for a burst is given back when it drains.

use std::io::{self, Write};

/// Written bytes dropped from the front once at least this many accumulate.
const COMPACT_AT: usize = 64 << 10;
/// A drained buffer larger than this is shrunk back to it.
const KEEP_CAPACITY: usize = 16 << 10;

/// A connection's unwritten replies.
#[derive(Debug, Default)]
pub struct Outbox {
    bytes: Vec<u8>,
    /// Bytes of `bytes` already written.
    written: usize,
}

impl Outbox {
    /// Queue `reply` after what is waiting.
    pub fn push(&mut self, reply: &[u8]) {
        self.bytes.extend_from_slice(reply);
    }

    /// Bytes waiting to be written.
    pub fn pending(&self) -> usize {
        self.bytes.len() - self.written
    }

    /// True if nothing is waiting.
    pub fn is_empty(&self) -> bool {
        self.pending() == 0
    }

    /// Memory held, in bytes (what the daemon spends on this peer).
    pub fn held(&self) -> usize {
        self.bytes.capacity()
    }

    /// Write what `stream` (non-blocking) takes now; `true` if everything went.
    ///
    /// # Errors
    /// The connection failed.
    pub fn flush(&mut self, stream: &mut impl Write) -> io::Result<bool> {
        let result = write_pending(stream, &self.bytes, &mut self.written);
        if self.written == self.bytes.len() {
            self.bytes.clear();
            self.written = 0;
            self.bytes.shrink_to(KEEP_CAPACITY);
        } else if self.written >= COMPACT_AT {
            self.bytes.drain(..self.written);
            self.written = 0;
        }
        result.map(|()| self.is_empty())
    }
}

/// Write what of `output[*written..]` the non-blocking `stream` takes now, advancing
/// `written`; an error means the connection failed.
pub(crate) fn write_pending(
    stream: &mut impl Write,
    output: &[u8],
    written: &mut usize,
) -> io::Result<()> {
    while *written < output.len() {
        match stream.write(&output[*written..]) {
            Ok(0) => break,
            Ok(n) => *written += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer that reads at most `per_turn` bytes each time the socket is writable.
    struct SlowReader {
        per_turn: usize,
        room: usize,
        got: usize,
    }

    impl Write for SlowReader {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if self.room == 0 {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            let n = buf.len().min(self.room);
            self.room -= n;
            self.got += n;
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_reader_that_never_catches_up_does_not_grow_the_outbox() {
        // Each turn one 1 KiB reply is queued and the peer reads a little less than that
        // after a head start: the outbox is never empty, so it never clears; it must
        // still not keep what was written.
        let mut out = Outbox::default();
        let mut peer = SlowReader {
            per_turn: 1000,
            room: 0,
            got: 0,
        };
        out.push(&[7u8; 256 << 10]);
        for _ in 0..20_000 {
            out.push(&[1u8; 1024]);
            peer.room = peer.per_turn;
            assert!(!out.flush(&mut peer).unwrap());
        }
        assert_eq!(peer.got, 20_000 * 1000);
        assert_eq!(out.pending(), (256 << 10) + 20_000 * 24);
        assert!(
            out.held() < 2 * (out.pending() + COMPACT_AT),
            "{} bytes held for {} pending",
            out.held(),
            out.pending()
        );
    }

    #[test]
    fn a_drained_burst_gives_its_memory_back() {
        let mut out = Outbox::default();
        out.push(&[0u8; 4 << 20]);
        let mut peer = SlowReader {
            per_turn: 0,
            room: usize::MAX,
            got: 0,
        };
        assert!(out.flush(&mut peer).unwrap());
        assert!(out.is_empty());
        assert!(out.held() <= KEEP_CAPACITY, "{}", out.held());
    }

    #[test]
    fn a_failed_connection_is_an_error() {
        struct Broken;
        impl Write for Broken {
            fn write(&mut self, _: &[u8]) -> io::Result<usize> {
                Err(io::ErrorKind::BrokenPipe.into())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let mut out = Outbox::default();
        out.push(b"reply");
        assert!(out.flush(&mut Broken).is_err());
        assert_eq!(out.pending(), 5);
    }
}
