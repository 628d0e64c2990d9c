//! The RedN manager's wire protocol: [varlink](https://varlink.org) over unix stream sockets,
//! shared by the manager (`redn-manager`) and its clients (`redn-client`) so the two cannot
//! drift.
//!
//! What is here:
//!
//! - [`codec`]: messages as NUL-terminated JSON objects, split out of a byte stream with a
//!   cap on size and JSON nesting depth; [`codec::Call`] and [`codec::Reply`] with the
//!   header rules of the varlink spec (at most one of `oneway`/`more`/`upgrade`, no unknown
//!   unprefixed header keys);
//! - [`fds`]: file descriptors passed with `SCM_RIGHTS` on the first byte of the message
//!   that names them, as systemd's sd-varlink does, with a cap per message;
//! - [`errors`]: the named errors of `org.varlink.service`, `io.redn.Manager` and
//!   `io.redn.Admin`, each with its parameters ([`errors::WireError`]);
//! - [`api`]: the parameter and reply types of every method;
//! - [`idl`]: the interface definition files, embedded ([`idl::MANAGER_IDL`],
//!   [`idl::ADMIN_IDL`], [`idl::SERVICE_IDL`]) and a small parser for the varlink IDL that
//!   checks them and lists their methods and errors;
//! - [`client`]: a blocking client connection (one call at a time, fds on the call that
//!   names them).
//!
//! # Why our own codec
//!
//! Two varlink crates exist. `varlink` 13 serves from a blocking thread pool, gives its
//! handlers only a byte stream (no file descriptors, no peer credentials) and replies to
//! `oneway` calls, which the spec forbids. `zlink` 0.8 passes fds and reads peer
//! credentials, but needs an async runtime (a `current_thread` tokio), has changed its API in
//! five breaking releases this year, closes the connection without a reply on bad
//! parameters unless the service is written by hand, and has no connection limits. The
//! manager serves every connection from one mio (epoll) loop with limits per connection and
//! per uid, so it needs a codec it can drive from that loop: the protocol is small (split on
//! NUL, parse a JSON object, check four header keys), and this crate is that codec,
//! following the spec (UAPI.20 "Varlink IPC" and varlink.org), with `serde_json` for the
//! JSON. Interop is tested against Python's `varlink` package, a client written elsewhere.
//!
//! # Example
//!
//! ```
//! use redn_proto::codec::{Call, Limits, MessageBuffer};
//!
//! let mut buf = MessageBuffer::new(Limits::default());
//! buf.extend(b"{\"method\":\"org.varlink.service.GetInfo\"}\0{\"meth");
//! let first = buf.next_message().expect("one whole message").expect("within limits");
//! let call = Call::parse(&first, &Limits::default()).expect("a valid call");
//! assert_eq!(call.method, "org.varlink.service.GetInfo");
//! assert!(buf.next_message().is_none(), "the second message is not complete yet");
//! ```
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod api;
pub mod client;
pub mod codec;
pub mod dataplane;
pub mod errors;
pub mod fds;
pub mod idl;

use std::io;

/// What went wrong in the protocol layer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A message broke one of the [`codec::Limits`] or the varlink message rules.
    #[error("{limit}: {reason}")]
    Protocol {
        /// Which rule or limit: `message-size`, `fds`, `nesting`, `json`, `header`, `reply`
        /// (a reply no call asked for).
        limit: &'static str,
        /// What was wrong.
        reason: String,
    },
    /// A socket call failed (`connect`, `sendmsg`, `recvmsg`).
    #[error("{call} failed")]
    Io {
        /// The call.
        call: &'static str,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The peer closed the connection before a whole reply arrived.
    #[error("the manager closed the connection")]
    Closed,
    /// The reply was an error: its name and parameters.
    #[error("{0}")]
    Remote(errors::WireError),
    /// A reply's parameters did not have the expected shape.
    #[error("unexpected reply to {method}: {reason}")]
    Reply {
        /// The method called.
        method: String,
        /// What did not fit.
        reason: String,
    },
}

impl Error {
    pub(crate) fn protocol(limit: &'static str, reason: impl Into<String>) -> Error {
        Error::Protocol {
            limit,
            reason: reason.into(),
        }
    }
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, Error>;

/// `text` from a peer, made safe to print in a message: control characters (C0, DEL, C1:
/// escape sequences, carriage returns, newlines) become `\xNN`, as the audit records write
/// them, and the marks that reorder a line (bidi overrides, isolates and marks) `\u{NNNN}`,
/// so what a peer sends cannot move a terminal's cursor, retitle it, forge lines or reorder
/// them.
pub fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    let hidden = |c: char| {
        c.is_control()
            || matches!(
                c,
                '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
            )
    };
    if !text.chars().any(hidden) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() {
            // Every control character is below U+00A0: two hex digits.
            out.push_str(&format!("\\x{:02x}", u32::from(c)));
        } else if hidden(c) {
            out.push_str(&format!("\\u{{{:04x}}}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}
