//! The data-plane hello: how a remote client of an installed offload asks the manager for
//! its own queues, and the manager's answer. Both sides use these encoders and decoders, so
//! the framing cannot drift between `redn-manager` and `redn-client`.
//!
//! Over one TCP connection to the manager's `[dataplane] listen` address the client writes a
//! [`Hello`] and reads an [`Answer`]; the connection then stays open for as long as the
//! client is served, and closing it releases the client's queues. All integers big-endian.
//!
//! Hello (48 bytes, then the client's RoCEv2 exchange record, `docs/rocev2.md`):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | magic `RDNH` |
//! | 4 | 1 | version 1 |
//! | 5 | 1 | flags 0 |
//! | 6 | 2 | record length (32 ..= 2592) |
//! | 8 | 8 | offload handle |
//! | 16 | 32 | token |
//!
//! Answer (8 bytes, then `body length` bytes):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | magic `RDNA` |
//! | 4 | 1 | version 1 |
//! | 5 | 1 | status: 0 accepted, else a [`Refusal`] code |
//! | 6 | 2 | body length (at most 4096) |
//!
//! An accepted body is: invocations (4: triggers the client's instance serves, 0 for "until
//! the client leaves"), trigger length (4), offload name length (1) and name (UTF-8, at most
//! 64 bytes), then the manager's exchange record (whatever is left). A refused body is the
//! reason, UTF-8.

use std::fmt;

/// First bytes of a hello.
pub const HELLO_MAGIC: [u8; 4] = *b"RDNH";
/// First bytes of an answer.
pub const ANSWER_MAGIC: [u8; 4] = *b"RDNA";
/// The version both carry.
pub const VERSION: u8 = 1;
/// Bytes of a hello before the record.
pub const HELLO_HEADER_LEN: usize = 48;
/// Bytes of an answer before its body.
pub const ANSWER_HEADER_LEN: usize = 8;
/// Bytes of a token.
pub const TOKEN_LEN: usize = 32;
/// The smallest exchange record (its header, no regions).
pub const MIN_RECORD_LEN: usize = 32;
/// The largest exchange record (64 regions of 40 bytes).
pub const MAX_RECORD_LEN: usize = 32 + 64 * 40;
/// The largest answer body.
pub const MAX_BODY_LEN: usize = 4096;
/// The longest offload name in an answer.
pub const MAX_NAME_LEN: usize = 64;

/// What was wrong with a hello or an answer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {detail}")]
pub struct FrameError {
    /// The field.
    pub field: &'static str,
    /// What is wrong with it.
    pub detail: String,
}

fn frame_err(field: &'static str, detail: impl Into<String>) -> FrameError {
    FrameError {
        field,
        detail: detail.into(),
    }
}

/// A remote client's hello.
#[derive(Clone, PartialEq, Eq)]
pub struct Hello {
    /// The offload it wants served (`InstallOffload`'s handle).
    pub handle: u64,
    /// The token the app gave it.
    pub token: [u8; TOKEN_LEN],
    /// Its RoCEv2 exchange record, encoded (`redn_sys::softnic::roce::QpRecord`).
    pub record: Vec<u8>,
}

impl fmt::Debug for Hello {
    /// The token is a secret: never printed.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hello")
            .field("handle", &self.handle)
            .field("record_len", &self.record.len())
            .finish_non_exhaustive()
    }
}

fn check_header(b: &[u8], magic: [u8; 4]) -> Result<(), FrameError> {
    if b[..4] != magic {
        return Err(frame_err(
            "magic",
            format!(
                "{:02x?} is not {:?}",
                &b[..4],
                String::from_utf8_lossy(&magic)
            ),
        ));
    }
    if b[4] != VERSION {
        return Err(frame_err("version", format!("{} is not {VERSION}", b[4])));
    }
    Ok(())
}

impl Hello {
    /// The hello's bytes.
    ///
    /// # Errors
    /// A record whose length is outside 32 ..= 2592.
    pub fn encode(&self) -> Result<Vec<u8>, FrameError> {
        let len = record_len(self.record.len())?;
        let mut b = Vec::with_capacity(HELLO_HEADER_LEN + self.record.len());
        b.extend_from_slice(&HELLO_MAGIC);
        b.push(VERSION);
        b.push(0);
        b.extend_from_slice(&len.to_be_bytes());
        b.extend_from_slice(&self.handle.to_be_bytes());
        b.extend_from_slice(&self.token);
        b.extend_from_slice(&self.record);
        Ok(b)
    }

    /// How many bytes the hello starting `b` has in all, once its header is in (`None`
    /// before). A reader buffers that many and then calls [`Hello::decode`].
    ///
    /// # Errors
    /// A header that is not a hello's (magic, version, flags, record length).
    pub fn frame_len(b: &[u8]) -> Result<Option<usize>, FrameError> {
        if b.len() < HELLO_HEADER_LEN {
            return Ok(None);
        }
        check_header(b, HELLO_MAGIC)?;
        if b[5] != 0 {
            return Err(frame_err("flags", format!("{:#x} is not 0", b[5])));
        }
        let len = usize::from(u16::from_be_bytes([b[6], b[7]]));
        record_len(len)?;
        Ok(Some(HELLO_HEADER_LEN + len))
    }

    /// Parse a whole hello.
    ///
    /// # Errors
    /// A bad header, or a length that is not the header's.
    pub fn decode(b: &[u8]) -> Result<Hello, FrameError> {
        let want = Hello::frame_len(b)?
            .ok_or_else(|| frame_err("length", format!("{} bytes, under the header", b.len())))?;
        if b.len() != want {
            return Err(frame_err(
                "length",
                format!("{} bytes where the header says {want}", b.len()),
            ));
        }
        let mut handle = [0u8; 8];
        handle.copy_from_slice(&b[8..16]);
        let mut token = [0u8; TOKEN_LEN];
        token.copy_from_slice(&b[16..HELLO_HEADER_LEN]);
        Ok(Hello {
            handle: u64::from_be_bytes(handle),
            token,
            record: b[HELLO_HEADER_LEN..].to_vec(),
        })
    }
}

fn record_len(n: usize) -> Result<u16, FrameError> {
    if !(MIN_RECORD_LEN..=MAX_RECORD_LEN).contains(&n) {
        return Err(frame_err(
            "record length",
            format!("{n} is outside {MIN_RECORD_LEN}..={MAX_RECORD_LEN}"),
        ));
    }
    u16::try_from(n).map_err(|_| frame_err("record length", "over 16 bits"))
}

/// Why the manager refused a hello; each has a code on the wire and a varlink-style name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// The hello did not parse or check (its reason names the field).
    InvalidHello,
    /// No installed offload has that handle and token (the two are not told apart).
    AccessDenied,
    /// The policy does not let the client's source address in.
    SourceNotAllowed,
    /// The app's `max_remote_clients` are all connected.
    TooManyClients,
    /// The client's queues could not be made or connected.
    NoDevice,
    /// The offload cannot be served to remote clients (its program has no client queue).
    NotServable,
    /// The manager's auditor banned the client's address from the app's offloads for a
    /// while (the reason says how long).
    Banned,
}

impl Refusal {
    /// Every refusal.
    pub const ALL: [Refusal; 7] = [
        Refusal::InvalidHello,
        Refusal::AccessDenied,
        Refusal::SourceNotAllowed,
        Refusal::TooManyClients,
        Refusal::NoDevice,
        Refusal::NotServable,
        Refusal::Banned,
    ];

    /// Its status byte.
    pub fn code(self) -> u8 {
        match self {
            Refusal::InvalidHello => 1,
            Refusal::AccessDenied => 2,
            Refusal::SourceNotAllowed => 3,
            Refusal::TooManyClients => 4,
            Refusal::NoDevice => 5,
            Refusal::NotServable => 6,
            Refusal::Banned => 7,
        }
    }

    /// The refusal with status byte `code`.
    pub fn from_code(code: u8) -> Option<Refusal> {
        Refusal::ALL.into_iter().find(|r| r.code() == code)
    }

    /// Its name, as the manager's varlink errors are named.
    pub fn name(self) -> &'static str {
        match self {
            Refusal::InvalidHello => "io.redn.Dataplane.InvalidHello",
            Refusal::AccessDenied => "io.redn.Dataplane.AccessDenied",
            Refusal::SourceNotAllowed => "io.redn.Dataplane.SourceNotAllowed",
            Refusal::TooManyClients => "io.redn.Dataplane.TooManyClients",
            Refusal::NoDevice => "io.redn.Dataplane.NoDevice",
            Refusal::NotServable => "io.redn.Dataplane.NotServable",
            Refusal::Banned => "io.redn.Dataplane.Banned",
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What the manager tells an accepted client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Accepted {
    /// Triggers the client's instance serves; 0: until the client leaves.
    pub invocations: u32,
    /// Bytes of one trigger.
    pub trigger_len: u32,
    /// The offload's name (what its trigger and response mean).
    pub offload: String,
    /// The manager's exchange record, encoded: its QP, and the app's data regions by name,
    /// address and length (no keys: only the offload reads them).
    pub record: Vec<u8>,
}

/// The manager's answer to a hello.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Served: connect to the manager's side.
    Accepted(Accepted),
    /// Refused, and why.
    Refused(Refusal, String),
}

impl Answer {
    /// The answer's bytes. A refusal's reason is cut to fit the body (at a character
    /// boundary).
    ///
    /// # Errors
    /// An accepted answer whose name or record does not fit.
    pub fn encode(&self) -> Result<Vec<u8>, FrameError> {
        let (status, body) = match self {
            Answer::Accepted(a) => {
                if a.offload.len() > MAX_NAME_LEN {
                    return Err(frame_err("offload", format!("over {MAX_NAME_LEN} bytes")));
                }
                record_len(a.record.len())?;
                let mut body = Vec::new();
                body.extend_from_slice(&a.invocations.to_be_bytes());
                body.extend_from_slice(&a.trigger_len.to_be_bytes());
                body.extend_from_slice(&[u8::try_from(a.offload.len()).unwrap_or(u8::MAX)]);
                body.extend_from_slice(a.offload.as_bytes());
                body.extend_from_slice(&a.record);
                (0, body)
            }
            Answer::Refused(r, reason) => {
                let mut end = reason.len().min(MAX_BODY_LEN);
                while !reason.is_char_boundary(end) {
                    end -= 1;
                }
                (r.code(), reason.as_bytes()[..end].to_vec())
            }
        };
        let len = u16::try_from(body.len())
            .ok()
            .filter(|&l| usize::from(l) <= MAX_BODY_LEN)
            .ok_or_else(|| {
                frame_err(
                    "body length",
                    format!("{} is over {MAX_BODY_LEN}", body.len()),
                )
            })?;
        let mut b = Vec::with_capacity(ANSWER_HEADER_LEN + body.len());
        b.extend_from_slice(&ANSWER_MAGIC);
        b.push(VERSION);
        b.push(status);
        b.extend_from_slice(&len.to_be_bytes());
        b.extend_from_slice(&body);
        Ok(b)
    }

    /// The body length an answer header announces.
    ///
    /// # Errors
    /// A header that is not an answer's, or a body over 4096 bytes.
    pub fn body_len(header: &[u8; ANSWER_HEADER_LEN]) -> Result<usize, FrameError> {
        check_header(header, ANSWER_MAGIC)?;
        let len = usize::from(u16::from_be_bytes([header[6], header[7]]));
        if len > MAX_BODY_LEN {
            return Err(frame_err(
                "body length",
                format!("{len} is over {MAX_BODY_LEN}"),
            ));
        }
        Ok(len)
    }

    /// Parse an answer from its header and body.
    ///
    /// # Errors
    /// An unknown status, a short body, a name that is not UTF-8.
    pub fn decode(header: &[u8; ANSWER_HEADER_LEN], body: &[u8]) -> Result<Answer, FrameError> {
        if Answer::body_len(header)? != body.len() {
            return Err(frame_err("body length", "not what the header says"));
        }
        let status = header[5];
        if status != 0 {
            let r = Refusal::from_code(status)
                .ok_or_else(|| frame_err("status", format!("unknown code {status}")))?;
            return Ok(Answer::Refused(
                r,
                String::from_utf8_lossy(body).into_owned(),
            ));
        }
        if body.len() < 9 {
            return Err(frame_err("body", format!("{} bytes, under 9", body.len())));
        }
        let be32 =
            |at: usize| u32::from_be_bytes([body[at], body[at + 1], body[at + 2], body[at + 3]]);
        let name_len = usize::from(body[8]);
        let name = body
            .get(9..9 + name_len)
            .filter(|_| name_len <= MAX_NAME_LEN)
            .ok_or_else(|| frame_err("offload", "name longer than the body or 64 bytes"))?;
        let offload = std::str::from_utf8(name)
            .map_err(|_| frame_err("offload", "not UTF-8"))?
            .to_owned();
        let record = body[9 + name_len..].to_vec();
        record_len(record.len())?;
        Ok(Answer::Accepted(Accepted {
            invocations: be32(0),
            trigger_len: be32(4),
            offload,
            record,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello() -> Hello {
        Hello {
            handle: 0x0102_0304_0506_0708,
            token: [7; TOKEN_LEN],
            record: vec![9; 72],
        }
    }

    #[test]
    fn a_hello_round_trips_and_its_length_is_known_from_the_header() {
        let b = hello().encode().unwrap();
        assert_eq!(b.len(), HELLO_HEADER_LEN + 72);
        assert_eq!(Hello::frame_len(&b[..47]).unwrap(), None);
        assert_eq!(Hello::frame_len(&b[..48]).unwrap(), Some(b.len()));
        assert_eq!(Hello::decode(&b).unwrap(), hello());
        assert!(
            !format!("{:?}", hello()).contains("7, 7"),
            "the token is not printed"
        );
    }

    #[test]
    fn bad_hellos_are_refused_naming_the_field() {
        let good = hello().encode().unwrap();
        let field = |b: &[u8]| Hello::frame_len(b).unwrap_err().field;
        let mut b = good.clone();
        b[0] = b'X';
        assert_eq!(field(&b), "magic");
        let mut b = good.clone();
        b[4] = 2;
        assert_eq!(field(&b), "version");
        let mut b = good.clone();
        b[5] = 1;
        assert_eq!(field(&b), "flags");
        let mut b = good.clone();
        b[6..8].copy_from_slice(&0xffffu16.to_be_bytes());
        assert_eq!(field(&b), "record length");
        b[6..8].copy_from_slice(&8u16.to_be_bytes());
        assert_eq!(field(&b), "record length");
        assert_eq!(Hello::decode(&good[..60]).unwrap_err().field, "length");
        let mut h = hello();
        h.record = vec![0; MAX_RECORD_LEN + 1];
        assert_eq!(h.encode().unwrap_err().field, "record length");
    }

    fn split(b: &[u8]) -> ([u8; ANSWER_HEADER_LEN], &[u8]) {
        let mut h = [0u8; ANSWER_HEADER_LEN];
        h.copy_from_slice(&b[..ANSWER_HEADER_LEN]);
        (h, &b[ANSWER_HEADER_LEN..])
    }

    #[test]
    fn answers_round_trip() {
        let ok = Answer::Accepted(Accepted {
            invocations: 4,
            trigger_len: 14,
            offload: "hash-get".into(),
            record: vec![1; 112],
        });
        let b = ok.encode().unwrap();
        let (h, body) = split(&b);
        assert_eq!(Answer::body_len(&h).unwrap(), body.len());
        assert_eq!(Answer::decode(&h, body).unwrap(), ok);
        for r in Refusal::ALL {
            assert_eq!(Refusal::from_code(r.code()), Some(r));
            let no = Answer::Refused(r, "because".into());
            let b = no.encode().unwrap();
            let (h, body) = split(&b);
            assert_eq!(Answer::decode(&h, body).unwrap(), no);
        }
        let long = Answer::Refused(Refusal::NoDevice, "é".repeat(3000));
        let b = long.encode().unwrap();
        assert!(b.len() <= ANSWER_HEADER_LEN + MAX_BODY_LEN);
    }

    #[test]
    fn bad_answers_are_refused() {
        let b = Answer::Refused(Refusal::AccessDenied, String::new())
            .encode()
            .unwrap();
        let (mut h, body) = split(&b);
        h[5] = 200;
        assert_eq!(Answer::decode(&h, body).unwrap_err().field, "status");
        h[5] = 0;
        assert_eq!(Answer::decode(&h, body).unwrap_err().field, "body");
        h[6..8].copy_from_slice(&5000u16.to_be_bytes());
        assert_eq!(Answer::body_len(&h).unwrap_err().field, "body length");
        h[0] = 0;
        assert_eq!(Answer::body_len(&h).unwrap_err().field, "magic");
    }
}
