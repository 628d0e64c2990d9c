//! A blocking varlink client connection: one call at a time, each answered before the next
//! is sent, so fds always ride a call no earlier call is still waiting behind (see
//! [`crate::fds`]).

use crate::codec::{check_depth, Call, Limits, MessageBuffer, Reply};
use crate::errors::WireError;
use crate::fds::{recv_with_fds, send_with_fds};
use crate::{Error, Result};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// A connection to a varlink service on a unix socket.
#[derive(Debug)]
pub struct Connection {
    stream: UnixStream,
    incoming: MessageBuffer,
    limits: Limits,
}

fn io(call: &'static str) -> impl Fn(std::io::Error) -> Error {
    move |source| Error::Io { call, source }
}

impl Connection {
    /// Connect to the socket at `path`; a call's sending, and its reply, each take at most
    /// `timeout`.
    ///
    /// # Errors
    /// [`Error::Io`] (`connect`).
    pub fn connect(path: &Path, timeout: Duration) -> Result<Connection> {
        let stream = connect_within(path, timeout)?;
        stream
            .set_read_timeout(Some(timeout))
            .and_then(|()| stream.set_write_timeout(Some(timeout)))
            .map_err(io("setsockopt"))?;
        Ok(Connection::from_stream(stream))
    }

    /// Use an already connected stream.
    pub fn from_stream(stream: UnixStream) -> Connection {
        let limits = Limits {
            // Replies (listings, dumps) may be larger than what we send.
            max_message: 16 << 20,
            max_fds: 0,
            max_depth: 32,
        };
        Connection {
            stream,
            incoming: MessageBuffer::new(limits),
            limits,
        }
    }

    /// The socket, for tests that want to misbehave on it.
    pub fn stream(&self) -> &UnixStream {
        &self.stream
    }

    /// Call `method` with `parameters` (a JSON object) and `fds`; the reply's parameters,
    /// or the named error it carried as [`Error::Remote`].
    ///
    /// # Errors
    /// [`Error::Io`], [`Error::Closed`], [`Error::Protocol`], [`Error::Remote`].
    pub fn call_raw(
        &mut self,
        method: &str,
        parameters: Map<String, Value>,
        fds: &[BorrowedFd<'_>],
    ) -> Result<Map<String, Value>> {
        let msg = self.exchange(method, parameters, fds)?;
        let reply = Reply::parse(&msg, &self.limits)?;
        if reply.continues {
            self.incoming.clear();
            return Err(more_refused(method));
        }
        match reply.error {
            Some(name) => Err(Error::Remote(WireError {
                name,
                parameters: reply.parameters,
            })),
            None => Ok(reply.parameters),
        }
    }

    /// Take what the peer sent since the last reply (without waiting) and refuse it: no
    /// call was waiting for it. What was there is dropped, so that the next call gets its
    /// own reply.
    fn refuse_unsolicited(&mut self) -> Result<()> {
        let mut buf = [0u8; 16 << 10];
        loop {
            match recv_with_fds(self.stream.as_fd(), &mut buf) {
                Ok(got) if got.len > 0 => {
                    drop(got.fds);
                    self.incoming.extend(&buf[..got.len]);
                }
                // Closed: the call's send or read says so.
                Ok(_) => break,
                Err(Error::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::Interrupted => {}
                Err(Error::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::WouldBlock =>
                {
                    break
                }
                Err(e) => return Err(e),
            }
        }
        if self.incoming.is_empty() {
            return Ok(());
        }
        self.incoming.clear();
        Err(Error::protocol(
            "reply",
            "the peer sent a reply that no call was waiting for",
        ))
    }

    /// Call with typed parameters and reply. A reply's parameters are parsed straight into
    /// `R` (what `R` does not have is skipped, not built), so a peer's large reply costs
    /// about its bytes; an error reply's parameters, small in every interface, are parsed
    /// into a [`WireError`] if there are at most [`MAX_ERROR_VALUES`] values.
    ///
    /// # Errors
    /// As [`Connection::call_raw`], and [`Error::Reply`] if the reply has another shape.
    pub fn call<P: Serialize, R: DeserializeOwned>(
        &mut self,
        method: &str,
        parameters: &P,
        fds: &[BorrowedFd<'_>],
    ) -> Result<R> {
        let shape = |reason: String| Error::Reply {
            method: method.to_owned(),
            reason,
        };
        let params = match serde_json::to_value(parameters).map_err(|e| shape(e.to_string()))? {
            Value::Object(m) => m,
            Value::Null => Map::new(),
            _ => return Err(shape("parameters must serialise as an object".into())),
        };
        let msg = self.exchange(method, params, fds)?;
        check_depth(&msg, self.limits.max_depth)?;
        let head: Head = serde_json::from_slice(&msg)
            .map_err(|e| Error::protocol("json", format!("not a reply: {e}")))?;
        let header = |reason: &str| Error::protocol("header", reason);
        if matches!(head.continues, Some(Skim::True)) {
            self.incoming.clear();
            return Err(more_refused(method));
        }
        match head.error {
            None | Some(Skim::Null) => {}
            Some(Skim::Str) => {
                // Rare and small: parsed whole, once its size in values is known.
                if count_values(&msg) > MAX_ERROR_VALUES {
                    return Err(Error::protocol(
                        "message-size",
                        format!("an error reply of more than {MAX_ERROR_VALUES} values"),
                    ));
                }
                let reply = Reply::parse(&msg, &self.limits)?;
                return Err(Error::Remote(WireError {
                    name: reply.error.unwrap_or_default(),
                    parameters: reply.parameters,
                }));
            }
            Some(_) => return Err(header("\"error\" must be a string")),
        }
        match head.parameters {
            None | Some(Skim::Null) => {
                serde_json::from_value(Value::Object(Map::new())).map_err(|e| shape(e.to_string()))
            }
            Some(Skim::Object) => serde_json::from_slice::<Body<R>>(&msg)
                .map_err(|e| shape(e.to_string()))?
                .parameters
                .map_or_else(|| serde_json::from_value(Value::Object(Map::new())), Ok)
                .map_err(|e| shape(e.to_string())),
            Some(_) => Err(header("\"parameters\" must be an object")),
        }
    }

    /// Refuse what came unasked, send `method`'s call, and read the reply's bytes.
    fn exchange(
        &mut self,
        method: &str,
        parameters: Map<String, Value>,
        fds: &[BorrowedFd<'_>],
    ) -> Result<Vec<u8>> {
        // Varlink replies carry no call id: bytes that came since the last reply answer no
        // call of ours, and would be taken for this call's reply.
        self.refuse_unsolicited()?;
        let bytes = Call::new(method, parameters).encode();
        self.send_bytes(&bytes, fds)?;
        self.read_message()
    }

    /// Send raw bytes (with fds on the first byte) as they are: for tests of malformed input.
    /// All of them within the write timeout, if the socket has one: a peer that never reads
    /// cannot hold the caller.
    ///
    /// # Errors
    /// [`Error::Io`] (`TimedOut` past the write timeout).
    pub fn send_bytes(&mut self, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> Result<()> {
        let timeout = self.stream.write_timeout().ok().flatten();
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        let timed_out = |call| Error::Io {
            call,
            source: std::io::Error::new(std::io::ErrorKind::TimedOut, "the peer does not read"),
        };
        // A blocking sendmsg waits at most the write timeout (SO_SNDTIMEO).
        let mut at = loop {
            match send_with_fds(self.stream.as_fd(), bytes, fds) {
                Err(Error::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::Interrupted => {}
                Err(Error::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::WouldBlock =>
                {
                    return Err(timed_out("sendmsg"))
                }
                other => break other?,
            }
        };
        let mut result = Ok(());
        let mut shortened = false;
        while at < bytes.len() {
            if let Some(d) = deadline {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    result = Err(timed_out("write"));
                    break;
                }
                shortened = true;
                if let Err(e) = self.stream.set_write_timeout(Some(left)) {
                    result = Err(io("setsockopt")(e));
                    break;
                }
            }
            match self.stream.write(&bytes[at..]) {
                Ok(0) => {
                    result = Err(io("write")(std::io::ErrorKind::WriteZero.into()));
                    break;
                }
                Ok(n) => at += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    result = Err(timed_out("write"));
                    break;
                }
                Err(e) => {
                    result = Err(io("write")(e));
                    break;
                }
            }
        }
        if shortened {
            // The next call's own timeout again.
            let _ = self.stream.set_write_timeout(timeout);
        }
        result
    }

    /// Read the next reply: the whole of it within the read timeout, however its bytes
    /// are spread out.
    ///
    /// # Errors
    /// [`Error::Io`] (including a timeout), [`Error::Closed`], [`Error::Protocol`].
    pub fn read_reply(&mut self) -> Result<Reply> {
        let msg = self.read_message()?;
        Reply::parse(&msg, &self.limits)
    }

    /// The next message's bytes (without its NUL), within the read timeout as a whole.
    fn read_message(&mut self) -> Result<Vec<u8>> {
        let mut buf = [0u8; 16 << 10];
        // One deadline for the reply, not a timeout per read: a peer that sends a byte
        // now and then would otherwise hold the caller for ever.
        let deadline = self
            .stream
            .read_timeout()
            .ok()
            .flatten()
            .and_then(|t| Instant::now().checked_add(t));
        loop {
            if let Some(msg) = self.incoming.next_message() {
                return msg;
            }
            // Blocking read (the socket is blocking; the deadline bounds it). recvmsg with
            // MSG_DONTWAIT would spin, so wait for readability first.
            wait_readable(
                self.stream.as_fd(),
                deadline.map(|d| d.saturating_duration_since(Instant::now())),
            )?;
            let got = match recv_with_fds(self.stream.as_fd(), &mut buf) {
                // A signal, or a wakeup with nothing to read yet (MSG_DONTWAIT).
                Err(Error::Io { source, .. })
                    if matches!(
                        source.kind(),
                        std::io::ErrorKind::Interrupted | std::io::ErrorKind::WouldBlock
                    ) =>
                {
                    continue
                }
                other => other?,
            };
            if got.len == 0 {
                return Err(Error::Closed);
            }
            // A reply never carries fds in this API; any that came are closed here.
            drop(got.fds);
            self.incoming.extend(&buf[..got.len]);
        }
    }
}

/// Most JSON values an error reply may hold (every interface's errors have a few).
pub const MAX_ERROR_VALUES: usize = 4096;

/// Only a call with `more` is answered with several replies; the rest would be taken for
/// the next calls' replies.
fn more_refused(method: &str) -> Error {
    Error::protocol(
        "reply",
        format!("{method}'s reply says more follow, and the call did not ask for more"),
    )
}

/// A reply's header, its parameters skipped rather than built.
#[derive(Deserialize)]
struct Head {
    #[serde(default)]
    error: Option<Skim>,
    #[serde(default)]
    parameters: Option<Skim>,
    #[serde(default)]
    continues: Option<Skim>,
}

/// A reply's parameters as the caller's type.
#[derive(Deserialize)]
#[serde(bound = "R: DeserializeOwned")]
struct Body<R> {
    #[serde(default = "none")]
    parameters: Option<R>,
}

fn none<R>() -> Option<R> {
    None
}

/// What kind a JSON value is, its content skipped.
enum Skim {
    Null,
    True,
    Str,
    Object,
    Other,
}

impl<'de> Deserialize<'de> for Skim {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Skim, D::Error> {
        d.deserialize_any(SkimVisitor)
    }
}

struct SkimVisitor;

impl<'de> serde::de::Visitor<'de> for SkimVisitor {
    type Value = Skim;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_unit<E>(self) -> std::result::Result<Skim, E> {
        Ok(Skim::Null)
    }

    fn visit_none<E>(self) -> std::result::Result<Skim, E> {
        Ok(Skim::Null)
    }

    fn visit_bool<E>(self, v: bool) -> std::result::Result<Skim, E> {
        Ok(if v { Skim::True } else { Skim::Other })
    }

    fn visit_i64<E>(self, _: i64) -> std::result::Result<Skim, E> {
        Ok(Skim::Other)
    }

    fn visit_u64<E>(self, _: u64) -> std::result::Result<Skim, E> {
        Ok(Skim::Other)
    }

    fn visit_f64<E>(self, _: f64) -> std::result::Result<Skim, E> {
        Ok(Skim::Other)
    }

    fn visit_str<E>(self, _: &str) -> std::result::Result<Skim, E> {
        Ok(Skim::Str)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(
        self,
        mut a: A,
    ) -> std::result::Result<Skim, A::Error> {
        while a.next_element::<serde::de::IgnoredAny>()?.is_some() {}
        Ok(Skim::Other)
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(
        self,
        mut a: A,
    ) -> std::result::Result<Skim, A::Error> {
        while a
            .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
            .is_some()
        {}
        Ok(Skim::Object)
    }
}

/// About how many values `json` holds (its commas and openings, outside strings), without
/// parsing it.
fn count_values(json: &[u8]) -> usize {
    1 + crate::codec::outside_strings(json)
        .filter(|b| matches!(b, b',' | b'[' | b'{'))
        .count()
}

/// A stream connected to `path`. A listener that never accepts and whose backlog is full
/// keeps a blocking `connect` waiting for as long as it likes (unix(7)); the socket's send
/// timeout, set first, bounds the wait to `timeout`.
fn connect_within(path: &Path, timeout: Duration) -> Result<UnixStream> {
    use nix::sys::socket::{
        connect, setsockopt, socket, sockopt, AddressFamily, SockFlag, SockType, UnixAddr,
    };
    let fd = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|e| io("socket")(e.into()))?;
    let tv = nix::sys::time::TimeVal::new(
        i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX),
        i64::from(timeout.subsec_micros()),
    );
    setsockopt(&fd, sockopt::SendTimeout, &tv).map_err(|e| io("setsockopt")(e.into()))?;
    let addr = UnixAddr::new(path).map_err(|e| io("connect")(e.into()))?;
    match connect(std::os::fd::AsRawFd::as_raw_fd(&fd), &addr) {
        Ok(()) => Ok(UnixStream::from(fd)),
        Err(nix::errno::Errno::EAGAIN) => Err(io("connect")(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "the listener did not take the connection in time",
        ))),
        Err(e) => Err(io("connect")(e.into())),
    }
}

fn wait_readable(fd: BorrowedFd<'_>, timeout: Option<Duration>) -> Result<()> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let ms = timeout.map_or(PollTimeout::NONE, |t| {
        PollTimeout::try_from(t).unwrap_or(PollTimeout::MAX)
    });
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
    loop {
        match poll(&mut fds, ms) {
            Ok(0) => {
                return Err(Error::Io {
                    call: "poll",
                    source: std::io::Error::new(std::io::ErrorKind::TimedOut, "no reply in time"),
                })
            }
            Ok(_) => return Ok(()),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => {
                return Err(Error::Io {
                    call: "poll",
                    source: e.into(),
                })
            }
        }
    }
}
