//! Connections: accepting them (the peer identified through `SO_PEERCRED` and a pidfd,
//! per-uid caps), reading and framing their bytes (messages split at NUL, fds kept with
//! the message they came with, buffer budgets), telling a hang-up from an exit, and
//! writing replies back as the socket takes them.

use super::{
    error_reply, exited, Conn, Hangup, Server, SocketKind, BUFFER_ALLOWANCE, HANGUP_GRACE,
    MESSAGES_PER_TURN, OUTPUT_HIGH_WATER, PIDFD_BASE, READS_PER_TURN, UID_MESSAGES_PER_TURN,
};
use crate::audit::{Event, Record, Severity};
use crate::outbox::Outbox;
use crate::peer::Peer;
use mio::net::UnixStream;
use mio::unix::SourceFd;
use mio::{Interest, Token};
use redn_proto::codec::MessageBuffer;
use redn_proto::errors::{ManagerError, Named};
use redn_proto::fds::recv_with_fds;
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::time::Instant;

impl Server {
    pub(super) fn accept_all(&mut self, index: usize) {
        loop {
            let Some((listener, kind)) = self.listeners.get(index) else {
                return;
            };
            let kind = *kind;
            let stream = match listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.accept_stalled.remove(&index);
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // EMFILE and the like: leave the rest in the backlog, to be tried
                    // again in a moment (see `ACCEPT_RETRY`), and say so once a stall.
                    if self.accept_stalled.insert(index) {
                        self.audit.event(
                            &Record::new(Event::Refuse, Severity::Warning)
                                .field("socket", format!("{kind:?}"))
                                .field("reason", format!("accept: {e}"))
                                .res(false),
                        );
                    }
                    return;
                }
            };
            self.admit(stream, kind);
        }
    }

    fn admit(&mut self, mut stream: UnixStream, kind: SocketKind) {
        let peer = match Peer::identify(stream.as_fd(), &self.procfs) {
            Ok(p) => p,
            Err(e) => {
                self.counters.refused += 1;
                // Best effort: the peer may be gone, or still reading.
                let err = ManagerError::PeerChanged {
                    reason: e.to_string(),
                };
                let _ = stream.write(&error_reply(&err.to_wire()));
                self.audit.event(
                    &Record::new(Event::Refuse, Severity::Warning)
                        .field("socket", format!("{kind:?}"))
                        .field("reason", e)
                        .res(false),
                );
                return;
            }
        };
        let uid = peer.identity.uid;
        let limits = self.manager.limits;
        // A hang-up not yet settled still holds its process's pidfd: it counts as a
        // connection, or closing connections in a loop would pile pidfds up past the fd
        // budget.
        let same_uid = self
            .conns
            .values()
            .map(|c| &c.peer)
            .chain(self.hangups.values().map(|h| &h.peer))
            .filter(|p| p.identity.uid == uid)
            .count();
        let held = self.conns.len() + self.hangups.len();
        let quota = |resource: &str, limit: usize, held: usize| {
            let err = ManagerError::QuotaExceeded {
                resource: resource.into(),
                limit: limit as u64,
                requested: held as u64 + 1,
            };
            (err, resource.to_owned())
        };
        // An app the auditor banned may not come back until the ban ends (its connections
        // already open stay, so it can read Stats and learn why).
        let banned = match kind {
            SocketKind::Api => self.manager.connect_refusal(&peer.identity),
            SocketKind::Admin => None,
        };
        let refusal = if let Some(reason) = banned {
            let err = ManagerError::PolicyDenied {
                reason: reason.clone(),
            };
            Some((err, reason))
        } else if held >= limits.max_connections {
            Some(quota("connections", limits.max_connections, held))
        } else if same_uid >= limits.max_connections_per_uid {
            Some(quota(
                "connections-per-uid",
                limits.max_connections_per_uid,
                same_uid,
            ))
        } else {
            None
        };
        if let Some((err, reason)) = refusal {
            self.counters.refused += 1;
            // Best effort: a fresh socket's buffer takes one short reply.
            let _ = stream.write(&error_reply(&err.to_wire()));
            self.audit.event(
                &Record::new(Event::Refuse, Severity::Warning)
                    .field("socket", format!("{kind:?}"))
                    .peer(&peer.identity)
                    .field("reason", reason)
                    .res(false),
            );
            return;
        }
        let token = self.next_token;
        self.next_token += 1;
        if let Err(e) = self
            .poll
            .registry()
            .register(&mut stream, Token(token), Interest::READABLE)
        {
            self.audit.event(
                &Record::new(Event::Refuse, Severity::Warning)
                    .peer(&peer.identity)
                    .field("reason", format!("epoll: {e}"))
                    .res(false),
            );
            return;
        }
        // The app's exit is noticed through its pidfd, even while another process still
        // holds its socket.
        if let (SocketKind::Api, Some(fd)) = (kind, &peer.pidfd) {
            let _ = self.poll.registry().register(
                &mut SourceFd(&fd.as_raw_fd()),
                Token(PIDFD_BASE + token),
                Interest::READABLE,
            );
        }
        let client = (kind == SocketKind::Api).then(|| self.manager.connect(peer.identity.clone()));
        if let Some(id) = client {
            let adopted = self.manager.adopt(id);
            if adopted > 0 {
                self.audit.event(
                    &Record::new(Event::Adopt, Severity::Notice)
                        .field("client", id)
                        .peer(&peer.identity)
                        .field("offloads", adopted)
                        .res(true),
                );
            }
        }
        self.audit.event(
            &Record::new(Event::Connect, Severity::Info)
                .field("socket", format!("{kind:?}"))
                .field("client", client.unwrap_or(0))
                .peer(&peer.identity)
                .res(true),
        );
        self.counters.accepted += 1;
        self.conns.insert(
            token,
            Conn {
                stream,
                kind,
                peer,
                client,
                input: MessageBuffer::new(limits.codec),
                fds: Vec::new(),
                refuse_next: None,
                output: Outbox::default(),
                close_after_flush: false,
                window_start: Instant::now(),
                window_requests: 0,
                wants_write: false,
                paused: false,
            },
        );
        // Data sent before the accept is reported by the first poll (edge triggers on
        // registration when data is already there).
    }

    pub(super) fn close(&mut self, token: usize) {
        if let Some(mut c) = self.conns.remove(&token) {
            let _ = self.poll.registry().deregister(&mut c.stream);
            match c.client {
                Some(client) if c.peer.still_same().is_err() || exited(&c.peer) => {
                    // The hang-up is the app's exit (its pidfd may not have been read yet).
                    self.forget_pidfd(&c.peer);
                    self.manager.app_exited(client);
                }
                Some(client) if c.peer.pidfd.is_some() && !self.closed => {
                    // Its process may be dying: wait briefly for the pidfd (still
                    // registered) to tell.
                    self.hangups.insert(
                        token,
                        Hangup {
                            client,
                            peer: c.peer,
                            since: Instant::now(),
                        },
                    );
                }
                Some(client) => {
                    self.forget_pidfd(&c.peer);
                    self.disconnected(client, &c.peer);
                }
                None => self.forget_pidfd(&c.peer),
            }
            self.drain_manager_records();
        }
        self.unfinished.remove(&token);
    }

    fn forget_pidfd(&self, peer: &Peer) {
        if let Some(fd) = &peer.pidfd {
            let _ = self
                .poll
                .registry()
                .deregister(&mut SourceFd(&fd.as_raw_fd()));
        }
    }

    /// A client's connection closed while its process lives on.
    fn disconnected(&mut self, client: u64, peer: &Peer) {
        let removed = self.manager.disconnect(client);
        self.audit.event(
            &Record::new(Event::Disconnect, Severity::Info)
                .field("client", client)
                .peer(&peer.identity)
                .field("uninstalled", removed)
                .res(true),
        );
    }

    /// Settle hang-ups: an exited process is an app exit; one alive after the grace period
    /// (or, with `all`, now) only closed its connection.
    pub(super) fn resolve_hangups(&mut self, all: bool) {
        if self.hangups.is_empty() {
            return;
        }
        let settled: Vec<usize> = self
            .hangups
            .iter()
            .filter(|(_, h)| all || exited(&h.peer) || h.since.elapsed() >= HANGUP_GRACE)
            .map(|(t, _)| *t)
            .collect();
        for t in settled {
            let Some(h) = self.hangups.remove(&t) else {
                continue;
            };
            self.forget_pidfd(&h.peer);
            if exited(&h.peer) || h.peer.still_same().is_err() {
                self.manager.app_exited(h.client);
            } else {
                self.disconnected(h.client, &h.peer);
            }
        }
        self.drain_manager_records();
    }

    pub(super) fn read(&mut self, token: usize) {
        let mut buf = std::mem::take(&mut self.scratch);
        self.read_with(token, &mut buf);
        self.scratch = buf;
    }

    /// Read and handle what connection `token` sent, within its slice of this turn and
    /// what is left of its uid's.
    fn read_with(&mut self, token: usize, buf: &mut [u8]) {
        let Some(c) = self.conns.get(&token) else {
            return;
        };
        let uid = (c.kind == SocketKind::Api).then_some(c.peer.identity.uid);
        let granted = uid.map_or(MESSAGES_PER_TURN, |uid| {
            let left = *self
                .uid_turn_left
                .entry(uid)
                .or_insert(UID_MESSAGES_PER_TURN);
            left.min(MESSAGES_PER_TURN)
        });
        let mut budget = granted;
        self.read_within(token, buf, &mut budget);
        if let Some(left) = uid.and_then(|uid| self.uid_turn_left.get_mut(&uid)) {
            *left -= granted - budget;
        }
    }

    /// [`Server::read_with`] with `budget` messages (counted down).
    fn read_within(&mut self, token: usize, buf: &mut [u8], budget: &mut usize) {
        let max_fds = self.manager.limits.codec.max_fds;
        // Requests held back (paused, or left for the next turn) come first; with no
        // budget left, nothing is read (the connection waits for the next turn).
        if !self.drain_messages(token, budget) {
            self.unfinished.insert(token);
            return;
        }
        for _ in 0..READS_PER_TURN {
            let Some(c) = self.conns.get_mut(&token) else {
                return;
            };
            if c.close_after_flush || c.paused {
                return;
            }
            let got = match recv_with_fds(c.stream.as_fd(), buf) {
                Ok(g) => g,
                Err(redn_proto::Error::Io { source, .. })
                    if source.kind() == io::ErrorKind::WouldBlock =>
                {
                    return
                }
                Err(redn_proto::Error::Io { source, .. })
                    if source.kind() == io::ErrorKind::Interrupted =>
                {
                    continue
                }
                Err(e) => {
                    let reason = e.to_string();
                    self.violation(token, "fds", reason, true);
                    return;
                }
            };
            if got.len == 0 {
                self.close(token);
                return;
            }
            // Only the process identified at accept speaks on its connection: not a process
            // it forked or handed the socket to, and not the process that connected and
            // then ran another program before the accept read its exe (which would have
            // been identified as that program: the process running it is not the writer).
            let connected = c.peer.identity.pid;
            if let Some(pid) = got
                .sender_pid
                .filter(|&p| u32::try_from(p) != Ok(connected))
            {
                let reason = format!(
                    "bytes on this connection came from process {pid}, not from process \
                     {connected}, which opened it"
                );
                self.audit.event(
                    &Record::new(Event::Refuse, Severity::Warning)
                        .peer(&c.peer.identity)
                        .field("reason", &reason)
                        .res(false),
                );
                let err = ManagerError::PeerChanged { reason };
                self.send(token, error_reply(&err.to_wire()));
                if let Some(c) = self.conns.get_mut(&token) {
                    c.close_after_flush = true;
                    c.fds.clear();
                    c.input.clear();
                }
                self.flush(token);
                return;
            }
            if !got.fds.is_empty() {
                // Admins pass no fds.
                let max = if c.kind == SocketKind::Api {
                    max_fds
                } else {
                    0
                };
                if !c.input.is_empty() || !c.fds.is_empty() {
                    self.violation(
                        token,
                        "fds",
                        "file descriptors must arrive with the first byte of the message \
                         that names them, with no earlier call awaiting its reply"
                            .into(),
                        true,
                    );
                    return;
                }
                if got.fds.len() > max {
                    c.refuse_next = Some(ManagerError::ProtocolViolation {
                        limit: "fds".into(),
                        reason: format!(
                            "{} file descriptors in one message, at most {max}",
                            got.fds.len()
                        ),
                    });
                } else {
                    c.fds = got.fds;
                }
            }
            c.input.extend(&buf[..got.len]);
            if let Some(reason) = self.over_buffer_budget(token) {
                self.violation(token, "buffered-bytes", reason, true);
                return;
            }
            if !self.drain_messages(token, budget) {
                // Its turn is used up: the rest next turn, after everyone else's.
                break;
            }
        }
        self.unfinished.insert(token);
    }

    /// Handle the connection's complete messages, at most `budget` of them (counted down);
    /// `false` if the budget ran out first (some may be left).
    fn drain_messages(&mut self, token: usize, budget: &mut usize) -> bool {
        loop {
            let Some(c) = self.conns.get_mut(&token) else {
                return true;
            };
            if c.close_after_flush || c.paused {
                return true;
            }
            if c.output.pending() > OUTPUT_HIGH_WATER {
                // Its peer is not reading: leave the rest of its requests (and its socket)
                // until it does (`flush` resumes it).
                c.paused = true;
                return true;
            }
            if *budget == 0 {
                return false;
            }
            match c.input.next_message() {
                None => return true,
                Some(Err(e)) => {
                    let reason = e.to_string();
                    self.violation(token, "message-size", reason, true);
                    return true;
                }
                Some(Ok(msg)) => {
                    *budget -= 1;
                    self.handle_message(token, &msg);
                }
            }
        }
    }

    /// Answer a protocol violation; close after the reply if `fatal`.
    pub(super) fn violation(&mut self, token: usize, limit: &str, reason: String, fatal: bool) {
        self.audit.event(
            &Record::new(Event::ProtocolViolation, Severity::Warning)
                .field("limit", limit)
                .field("reason", &reason)
                .res(false),
        );
        let err = ManagerError::ProtocolViolation {
            limit: limit.into(),
            reason,
        };
        self.send(token, error_reply(&err.to_wire()));
        if fatal {
            if let Some(c) = self.conns.get_mut(&token) {
                c.close_after_flush = true;
                c.fds.clear();
                c.input.clear();
            }
            self.flush(token);
        }
    }

    /// Why the connection at `token` takes its uid past `buffered-bytes-per-uid`, if it
    /// does. Only a connection holding more than [`BUFFER_ALLOWANCE`] is counted against
    /// the others, so the common case costs no scan.
    fn over_buffer_budget(&self, token: usize) -> Option<String> {
        let held = |c: &Conn| c.input.held() + c.output.held();
        let c = self.conns.get(&token)?;
        if held(c) <= BUFFER_ALLOWANCE {
            return None;
        }
        let uid = c.peer.identity.uid;
        let total: usize = self
            .conns
            .values()
            .filter(|o| o.peer.identity.uid == uid)
            .map(held)
            .sum();
        let max = self.manager.limits.max_buffered_per_uid;
        (total > max).then(|| {
            format!(
                "uid {uid}'s connections hold {total} bytes of requests and replies, over the \
                 {max} a uid may"
            )
        })
    }

    pub(super) fn send(&mut self, token: usize, bytes: Vec<u8>) {
        let max = self.manager.limits.max_pending_output;
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        c.output.push(&bytes);
        let over = if c.output.pending() > max {
            Some("unread-replies")
        } else if self.over_buffer_budget(token).is_some() {
            Some("buffered-bytes")
        } else {
            None
        };
        if let Some(reason) = over {
            if let Some(c) = self.conns.get(&token) {
                let r = Record::new(Event::Disconnect, Severity::Warning)
                    .peer(&c.peer.identity)
                    .field("reason", reason)
                    .res(false);
                self.audit.event(&r);
            }
            self.close(token);
            return;
        }
        self.flush(token);
    }

    pub(super) fn flush(&mut self, token: usize) {
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        let Ok(done) = c.output.flush(&mut c.stream) else {
            self.close(token);
            return;
        };
        if done && c.close_after_flush {
            self.close(token);
            return;
        }
        if c.paused && c.output.pending() <= OUTPUT_HIGH_WATER {
            // Its replies are being read again: take its requests again.
            c.paused = false;
            self.unfinished.insert(token);
        }
        if done == c.wants_write {
            c.wants_write = !done;
            let interest = if done {
                Interest::READABLE
            } else {
                Interest::READABLE | Interest::WRITABLE
            };
            let _ = self
                .poll
                .registry()
                .reregister(&mut c.stream, Token(token), interest);
        }
    }
}
