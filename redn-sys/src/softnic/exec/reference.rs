//! Reference semantics: the general executor. `Core::step` fetches one WQE, `Core::execute`
//! decodes, checks and runs it (every opcode's effect, its counters and completion), and
//! `fault`/`flush` report errors. This is the definition of what a WQE does: every fast path
//! is an optimisation of it, and `tests/differential.rs` requires programs to end
//! byte-for-byte the same with the fast paths off (`SoftNicConfig::fast_paths`) and on.
//!
//! Invariants: one WQE at a time, from `Core::wqe` (a copy of its snapshot); every error
//! completion is produced here (the fast paths hand a WQE they refuse to `execute`); late
//! READ and atomic responses (`Core::late`) land at points of the queue's own WQE sequence.

use super::*;

pub(super) fn remote_of(w: &[u8]) -> RemoteAddr {
    RemoteAddr {
        addr: VirtAddr(Be64::read(w, off::RADDR).get()),
        rkey: Rkey(Be32::read(w, off::RKEY).get()),
    }
}

/// The atomic a WQE asks for (operands big-endian at mlx5's offsets) and the data segment
/// that receives the old value, if `ds` reaches it.
#[inline]
pub(super) fn atomic_of(w: &[u8], opcode: Opcode) -> (AtomicOp, usize) {
    match opcode {
        Opcode::AtomicCs => (
            AtomicOp::CompareSwap {
                swap: Be64::read(w, off::SWAP_ADD).get(),
                compare: Be64::read(w, off::COMPARE).get(),
            },
            3,
        ),
        Opcode::AtomicFa => (
            AtomicOp::FetchAdd {
                add: Be64::read(w, off::SWAP_ADD).get(),
            },
            3,
        ),
        Opcode::AtomicMaskedCs => (
            AtomicOp::MaskedCompareSwap {
                swap: Be64::read(w, 32).get(),
                compare: Be64::read(w, 40).get(),
                swap_mask: Be64::read(w, 48).get(),
                compare_mask: Be64::read(w, 56).get(),
            },
            4,
        ),
        _ => (
            AtomicOp::MaskedFetchAdd {
                add: Be64::read(w, 32).get(),
                field_boundary: Be64::read(w, 40).get(),
            },
            3,
        ),
    }
}

/// The bytes an atomic's old value lands as on queue `qp`: host order (little-endian), as
/// upstream Linux configures ConnectX, or big-endian on a QP created with
/// `QpConfig::atomic_be_reply` (MLNX_OFED's per-QP option).
#[inline(always)]
pub(super) fn atomic_reply(qp: &QpShared, old: u64) -> [u8; 8] {
    if qp.atomic_be_reply {
        old.to_be_bytes()
    } else {
        old.to_le_bytes()
    }
}

/// Sum of the byte counts of data segments `from..ds` (or the inline length).
pub(super) fn payload_len(w: &[u8], from: usize, ds: usize) -> u64 {
    if from < ds && Be32::read(w, from * SEG_SIZE).get() & INLINE_FLAG != 0 {
        return u64::from(Be32::read(w, from * SEG_SIZE).get() & !INLINE_FLAG);
    }
    (from..ds)
        .map(|s| u64::from(Be32::read(w, s * SEG_SIZE).get()))
        .sum()
}

impl Core {
    /// The rest of a visit that has run `done` WQEs: WQE by WQE through [`Self::step`] (multi-BB
    /// WQEs, and every WQE of a rate-limited queue, which `step` admits one by one), and
    /// through the fast path again between them.
    #[inline(never)]
    pub(super) fn run_general(
        &mut self,
        f: &mut Fetcher,
        budget: usize,
        mut done: usize,
        mut siblings: Option<&mut Siblings>,
    ) -> RunOutcome {
        let mut limit = self.limit();
        let mut outcome = RunOutcome::Idle;
        let fast = self.fast_paths && !self.limiter.is_active() && !self.windowed;
        while done < budget {
            if self.ci >= limit {
                limit = self.limit();
                if self.ci >= limit {
                    break;
                }
            }
            match self.step(f, limit) {
                Step::Done(bbs) => {
                    self.ci += bbs;
                    done += 1;
                }
                Step::Blocked => break,
                Step::Retry(t) => {
                    outcome = RunOutcome::RetryAt(t);
                    break;
                }
                Step::Fault(syndrome, bbs) => {
                    self.fault(f, syndrome, bbs);
                    done += 1;
                    break;
                }
            }
            if fast && done < budget && self.ci < limit {
                let (n, blocked) =
                    self.run_fast::<false>(f, limit, budget - done, siblings.as_deref_mut());
                done += n;
                if blocked {
                    break;
                }
            }
        }
        self.ran(done, outcome)
    }

    /// True if the control segment names this queue and this index (the check ConnectX makes
    /// unless told otherwise; RedN's chains need it off, see `SoftNicConfig::wqe_checks`).
    #[inline]
    pub(super) fn wqe_is_ours(&self, w: &[u8], ci: u64) -> bool {
        Be32::read(w, off::QPN).get() >> 8 == self.qp.qpn.0
            && Be16::read(w, off::WQE_INDEX).get() == wqe_index(ci)
    }

    /// Fetch (as far as allowed) and run the WQE at `ci`.
    // Out of line: inlined into `run` it costs every call the set-up of its copy loop.
    #[inline(never)]
    pub(super) fn step(&mut self, f: &mut Fetcher, limit: u64) -> Step {
        let ci = self.ci;
        f.fetch_current(ci);
        let bbs = bbs_for_ds(f.block(ci)[off::DS]) as u64;
        if ci + bbs > limit {
            return Step::Blocked;
        }
        f.fetch_ahead(ci, ci + bbs, limit);
        for i in 0..bbs {
            let at = idx(i) * BB_SIZE;
            self.wqe[at..at + BB_SIZE].copy_from_slice(f.block(ci + i));
        }
        self.execute(ci, bbs)
    }

    pub(super) fn execute(&mut self, ci: u64, bbs: u64) -> Step {
        let w = &self.wqe;
        let opcode_byte = w[off::OPCODE];
        let ds = usize::from(w[off::DS] & 0x3f);
        let flags = w[off::FM_CE_SE];
        let Some(opcode) = Opcode::from_u8(opcode_byte) else {
            return Step::Fault(Syndrome::LocalQpOperation, bbs);
        };
        if self.wqe_checks && !self.wqe_is_ours(w, ci) {
            return Step::Fault(Syndrome::LocalQpOperation, bbs);
        }
        if !self.late.is_empty() && (fenced(w) || opcode == Opcode::Wait) {
            self.land();
        }
        let w = &self.wqe;
        let need = match opcode {
            Opcode::Nop | Opcode::Send | Opcode::SendImm => 1,
            Opcode::AtomicCs | Opcode::AtomicFa | Opcode::AtomicMaskedFa => 3,
            Opcode::AtomicMaskedCs => 4,
            _ => 2,
        };
        if ds < need {
            return Step::Fault(Syndrome::LocalQpOperation, bbs);
        }

        if self.limiter.is_active() {
            let bytes = match opcode {
                Opcode::RdmaWrite | Opcode::RdmaWriteImm | Opcode::RdmaRead => {
                    payload_len(w, 2, ds)
                }
                Opcode::Send | Opcode::SendImm => payload_len(w, 1, ds),
                o if o.is_atomic() => 8,
                _ => 0,
            };
            if let Err(t) = self.limiter.admit(bytes, SystemClock) {
                if self.delayed_at != ci {
                    self.delayed_at = ci;
                    bump(&self.qp.counters.rate_limit_delays, 1);
                }
                return Step::Retry(t);
            }
        }

        // A windowed peer's posted messages: a WRITE or SEND posts behind them, and an
        // unsignaled WAIT, SEND_EN, RECV_EN or NOP runs behind them (taking the outcomes
        // that came), as a ConnectX runs a WQE before the ACKs of earlier ones are back; a
        // READ or an atomic (which the transport runs alone), a fenced WQE, and a signaled
        // one (completions come in order) wait for all of them.
        let posts = self.windowed
            && matches!(
                opcode,
                Opcode::RdmaWrite | Opcode::RdmaWriteImm | Opcode::Send | Opcode::SendImm
            );
        let control = matches!(
            opcode,
            Opcode::Wait | Opcode::SendEn | Opcode::RecvEn | Opcode::Nop
        );
        let wait = WqeFlags(flags).waits_for_responses()
            || !(posts || control && !WqeFlags(flags).signaled());
        if !self.posted.is_empty() {
            if !self.settle() {
                // One failed: the queue is in error, and its next visit flushes this WQE.
                return Step::Blocked;
            }
            if wait && !self.posted.is_empty() {
                // Their outcomes are not all here: it runs on a later visit, which an
                // ACK's arrival or the transport's timer brings. The PU never waits for a
                // peer meanwhile: its other queues go on.
                return Step::Blocked;
            }
        }
        let result = match opcode {
            Opcode::Nop => Ok(0),
            Opcode::RdmaWrite | Opcode::RdmaWriteImm => self.op_write(opcode, ds),
            Opcode::Send | Opcode::SendImm => self.op_send(opcode, ds),
            Opcode::RdmaRead if self.fast_paths => self.fast_read(ds),
            Opcode::RdmaRead => self.op_read(ds),
            Opcode::AtomicCs
            | Opcode::AtomicFa
            | Opcode::AtomicMaskedCs
            | Opcode::AtomicMaskedFa => self.op_atomic(opcode, ds),
            Opcode::Wait => match self.op_wait(ci) {
                Ok(true) => Ok(0),
                Ok(false) => return Step::Blocked,
                Err(s) => Err(s),
            },
            Opcode::SendEn | Opcode::RecvEn => self.op_enable(opcode),
        };
        match result {
            Ok(bytes) => {
                self.qp.count_wqes(opcode_byte, 1);
                if bytes != 0 {
                    bump(&self.qp.counters.bytes, bytes);
                }
                if posts {
                    // Completed (or failed) when the peer settles it.
                    self.posted.push_back(Posted {
                        ci,
                        bbs,
                        opcode: opcode_byte,
                        signaled: WqeFlags(flags).signaled(),
                    });
                } else if WqeFlags(flags).signaled() {
                    let byte_cnt = match opcode {
                        // At most MAX_MESSAGE (16 MiB).
                        Opcode::RdmaRead => small32(idx(bytes)),
                        o if o.is_atomic() => 8,
                        _ => 0,
                    };
                    self.complete(ci, bbs, opcode_byte, byte_cnt);
                }
                Step::Done(bbs)
            }
            Err(Fail::NotReady) => {
                bump(&self.qp.counters.rnr_waits, 1);
                if !self.late.is_empty() {
                    // Stopped until a receive is posted (see `late`).
                    self.land();
                }
                Step::Blocked
            }
            // The peer's window is full: the next visit runs it again (as for `wait` above).
            Err(Fail::WindowFull) => Step::Blocked,
            Err(Fail::Syndrome(s)) => Step::Fault(s, bbs),
        }
    }

    /// Completion for the WQE of `bbs` BBs at `ci`.
    // Out of line: the fast path completes in four places, and one call keeps its loop small.
    #[inline(never)]
    pub(super) fn complete(&mut self, ci: u64, bbs: u64, opcode: u8, byte_cnt: u32) {
        if !self.late.is_empty() {
            self.land();
        }
        self.complete_landed(ci, bbs, opcode, byte_cnt);
    }

    /// [`Self::complete`] where nothing can be late (`late` is empty).
    #[inline(always)]
    pub(super) fn complete_landed(&self, ci: u64, bbs: u64, opcode: u8, byte_cnt: u32) {
        debug_assert!(self.late.is_empty());
        // WQEs are counted as they run, so whoever sees the completion sees the WQE counted;
        // `retire` frees its ring space first (a host reuses completed WQEs' slots at once).
        self.qp
            .retire(ci, ci + bbs, CqeOpcode::Req, opcode, byte_cnt, 0);
    }

    /// Land every late response (see [`Core::late`]), oldest first.
    #[cold]
    #[inline(never)]
    pub(super) fn land(&mut self) {
        let mut late = std::mem::take(&mut self.late);
        for (lkey, addr, data) in late.drain(..) {
            self.write_local_at(lkey, addr, &data);
        }
        self.late = late;
    }

    /// At the end of a visit: land what is late if the queue stopped with nothing more
    /// enabled or posted (a visit that ended on its budget goes on in the next one).
    #[inline(always)]
    pub(super) fn land_at_visit_end(&mut self) {
        if !self.late.is_empty() && self.ci >= self.limit() {
            self.land();
        }
    }

    /// Land late responses before a WQE whose control segment is `w` runs, if it is fenced
    /// or a WAIT (see [`Core::late`]).
    #[inline(always)]
    pub(super) fn land_before(&mut self, w: &[u8]) {
        if !self.late.is_empty() && (fenced(w) || w[off::OPCODE] == OP_WAIT) {
            self.land();
        }
    }

    /// Gather the payload described by data (or inline) segments `from..ds` into `scratch`.
    pub(super) fn gather(&mut self, from: usize, ds: usize) -> Result<usize, Fail> {
        let w = &self.wqe;
        if from < ds && Be32::read(w, from * SEG_SIZE).get() & INLINE_FLAG != 0 {
            let len = (Be32::read(w, from * SEG_SIZE).get() & !INLINE_FLAG) as usize;
            let at = from * SEG_SIZE + 4;
            if at + len > ds * SEG_SIZE {
                return Err(Fail::Syndrome(Syndrome::LocalLength));
            }
            if self.scratch.len() < len {
                self.scratch.resize(len, 0);
            }
            self.scratch[..len].copy_from_slice(&w[at..at + len]);
            return Ok(len);
        }
        let total = payload_len(w, from, ds);
        if total > MAX_MESSAGE {
            return Err(Fail::Syndrome(Syndrome::LocalLength));
        }
        if self.scratch.len() < idx(total) {
            self.scratch.resize(idx(total), 0);
        }
        let mut at = 0usize;
        for s in from..ds {
            let seg = s * SEG_SIZE;
            let len = Be32::read(w, seg + off::SEG_BYTE_COUNT).get() as usize;
            if len == 0 {
                continue;
            }
            let lkey = Be32::read(w, seg + off::SEG_LKEY).get();
            let addr = VirtAddr(Be64::read(w, seg + off::SEG_ADDR).get());
            let span = self
                .local_keys
                .get(&self.nic.keys, lkey)
                .and_then(|r| r.check(self.qp.pd, addr, len as u64, Access::NONE))
                .map_err(|_| Fail::Syndrome(Syndrome::LocalProtection))?;
            span.read(&mut self.scratch[at..at + len]);
            at += len;
        }
        Ok(at)
    }

    pub(super) fn op_write(&mut self, opcode: Opcode, ds: usize) -> Result<u64, Fail> {
        let remote = remote_of(&self.wqe);
        let imm = (opcode == Opcode::RdmaWriteImm).then(|| Be32::read(&self.wqe, off::IMM).get());
        if ds == 3 && Be32::read(&self.wqe, 2 * SEG_SIZE).get() & INLINE_FLAG == 0 {
            // One data segment: copy region to region, no staging.
            let seg = 2 * SEG_SIZE;
            let len = u64::from(Be32::read(&self.wqe, seg + off::SEG_BYTE_COUNT).get());
            let lkey = Be32::read(&self.wqe, seg + off::SEG_LKEY).get();
            let addr = VirtAddr(Be64::read(&self.wqe, seg + off::SEG_ADDR).get());
            if len > MAX_MESSAGE {
                return Err(Fail::Syndrome(Syndrome::LocalLength));
            }
            let ack = self.signaled();
            let src = self
                .local_keys
                .get(&self.nic.keys, lkey)
                .and_then(|r| r.check(self.qp.pd, addr, len, Access::NONE))
                .map_err(|_| Fail::Syndrome(Syndrome::LocalProtection))?;
            let peer = self
                .peer
                .as_ref()
                .ok_or(Fail::Syndrome(Syndrome::TransportRetryExceeded))?;
            peer.write_from(&mut self.remote_keys, remote, &src, imm, ack)
                .map_err(Fail::from)?;
            return Ok(len);
        }
        let len = self.gather(2, ds)?;
        let peer = self
            .peer
            .as_ref()
            .ok_or(Fail::Syndrome(Syndrome::TransportRetryExceeded))?;
        let ack = self.signaled();
        peer.write(
            &mut self.remote_keys,
            remote,
            &self.scratch[..len],
            imm,
            ack,
        )
        .map_err(Fail::from)?;
        Ok(len as u64)
    }

    /// The WQE being run is signaled.
    fn signaled(&self) -> bool {
        WqeFlags(self.wqe[off::FM_CE_SE]).signaled()
    }

    pub(super) fn op_send(&mut self, opcode: Opcode, ds: usize) -> Result<u64, Fail> {
        let imm = (opcode == Opcode::SendImm).then(|| Be32::read(&self.wqe, off::IMM).get());
        let len = self.gather(1, ds)?;
        let peer = self
            .peer
            .as_ref()
            .ok_or(Fail::Syndrome(Syndrome::TransportRetryExceeded))?;
        let ack = self.signaled();
        peer.send(&mut self.remote_keys, &self.scratch[..len], imm, ack)
            .map_err(Fail::from)?;
        Ok(len as u64)
    }

    /// Check that the local segment `seg` may receive `len` bytes.
    pub(super) fn check_local_write(&mut self, seg: usize, len: u64) -> Result<(), Fail> {
        let w = &self.wqe;
        let lkey = Be32::read(w, seg + off::SEG_LKEY).get();
        let addr = VirtAddr(Be64::read(w, seg + off::SEG_ADDR).get());
        self.check_local_at(lkey, addr, len)
    }

    /// Check that `len` bytes at `addr` may be written through `lkey`.
    fn check_local_at(&mut self, lkey: u32, addr: VirtAddr, len: u64) -> Result<(), Fail> {
        self.local_keys
            .get(&self.nic.keys, lkey)
            .and_then(|r| r.check(self.qp.pd, addr, len, Access::LOCAL_WRITE))
            .map(|_| ())
            .map_err(|_| Fail::Syndrome(Syndrome::LocalProtection))
    }

    pub(super) fn write_local(&mut self, seg: usize, data: &[u8]) {
        let w = &self.wqe;
        let lkey = Be32::read(w, seg + off::SEG_LKEY).get();
        let addr = VirtAddr(Be64::read(w, seg + off::SEG_ADDR).get());
        self.write_local_at(lkey, addr, data);
    }

    /// Write `data` at `addr` through `lkey` (already checked for local write).
    pub(super) fn write_local_at(&mut self, lkey: u32, addr: VirtAddr, data: &[u8]) {
        if let Ok(span) = self
            .local_keys
            .get(&self.nic.keys, lkey)
            .and_then(|r| r.check(self.qp.pd, addr, data.len() as u64, Access::LOCAL_WRITE))
        {
            span.write(data);
        }
    }

    pub(super) fn op_read(&mut self, ds: usize) -> Result<u64, Fail> {
        let remote = remote_of(&self.wqe);
        let total = payload_len(&self.wqe, 2, ds);
        if total > MAX_MESSAGE {
            return Err(Fail::Syndrome(Syndrome::LocalLength));
        }
        if ds == 3 && !self.late_landing {
            // One scatter entry: copy region to region, no staging.
            let seg = 2 * SEG_SIZE;
            let lkey = Be32::read(&self.wqe, seg + off::SEG_LKEY).get();
            let addr = VirtAddr(Be64::read(&self.wqe, seg + off::SEG_ADDR).get());
            let dst = self
                .local_keys
                .get(&self.nic.keys, lkey)
                .and_then(|r| r.check(self.qp.pd, addr, total, Access::LOCAL_WRITE))
                .map_err(|_| Fail::Syndrome(Syndrome::LocalProtection))?;
            let peer = self
                .peer
                .as_ref()
                .ok_or(Fail::Syndrome(Syndrome::TransportRetryExceeded))?;
            peer.read_into(&mut self.remote_keys, remote, &dst)
                .map_err(Fail::from)?;
            return Ok(total);
        }
        // The scatter list as runs of entries: one-byte entries at descending consecutive
        // addresses under one key (RedN's byte-reversing READ, `Builder::advance_count`) make
        // one run, checked as the one window their bytes cover (the same bytes as checking
        // each); every other entry is a run of its own. Bit `s` of `starts` marks the entry
        // each run starts at, so the writes below take the same runs without finding them
        // again (entries are fewer than 64: `ds` is six bits).
        let mut starts = 0u64;
        let mut s = 2;
        while s < ds {
            starts |= 1 << s;
            let seg = s * SEG_SIZE;
            let len = u64::from(Be32::read(&self.wqe, seg).get());
            let run = self.reversed_run(s, ds);
            if run > 1 {
                let (lkey, lowest) = self.run_window(seg, run);
                self.check_local_at(lkey, lowest, run as u64)?;
            } else if len != 0 {
                self.check_local_write(seg, len)?;
            }
            s += run;
        }
        let total = idx(total);
        if self.scratch.len() < total {
            self.scratch.resize(total, 0);
        }
        let peer = self
            .peer
            .as_ref()
            .ok_or(Fail::Syndrome(Syndrome::TransportRetryExceeded))?;
        peer.read(&mut self.remote_keys, remote, &mut self.scratch[..total])
            .map_err(Fail::from)?;
        let mut at = 0;
        if self.late_landing {
            // Lands later (see `Core::late`), entry by entry as checked above.
            for s in 2..ds {
                let seg = s * SEG_SIZE;
                let len = Be32::read(&self.wqe, seg).get() as usize;
                if len != 0 {
                    let lkey = Be32::read(&self.wqe, seg + off::SEG_LKEY).get();
                    let addr = VirtAddr(Be64::read(&self.wqe, seg + off::SEG_ADDR).get());
                    self.late
                        .push((lkey, addr, self.scratch[at..at + len].to_vec()));
                    at += len;
                }
            }
            return Ok(total as u64);
        }
        let data = std::mem::take(&mut self.scratch);
        let mut s = 2;
        while s < ds {
            let seg = s * SEG_SIZE;
            let len = Be32::read(&self.wqe, seg).get() as usize;
            // Up to the next run's start, or the last entry. (`s` is at most 62.)
            let later = starts & !((2u64 << s) - 1);
            let run = if later == 0 {
                ds - s
            } else {
                later.trailing_zeros() as usize - s
            };
            if run > 1 {
                // A byte-reversing run, checked above as one window: one write of the
                // reversed bytes instead of a read-modify-write per byte. (A power of two
                // long, so zeroing it is two stores, not a call.)
                let mut rev = [0u8; 64];
                for (k, b) in data[at..at + run].iter().enumerate() {
                    rev[run - 1 - k] = *b;
                }
                let (lkey, lowest) = self.run_window(seg, run);
                self.write_local_at(lkey, lowest, &rev[..run]);
            } else if len != 0 {
                self.write_local(seg, &data[at..at + len]);
            }
            at += if run > 1 { run } else { len };
            s += run;
        }
        self.scratch = data;
        Ok(total as u64)
    }

    /// How many data segments from `s` on (of `ds`) are one-byte entries under the same key
    /// at descending consecutive addresses: at least 1, and exactly 1 unless the entry at
    /// `s` is itself one byte.
    pub(super) fn reversed_run(&self, s: usize, ds: usize) -> usize {
        let w = &self.wqe;
        let seg = |i: usize| {
            let at = i * SEG_SIZE;
            (
                Be32::read(w, at).get(),
                Be32::read(w, at + off::SEG_LKEY).get(),
                Be64::read(w, at + off::SEG_ADDR).get(),
            )
        };
        let (len, lkey, addr) = seg(s);
        if len != 1 {
            return 1;
        }
        let mut n = 1;
        while s + n < ds && seg(s + n) == (1, lkey, addr.wrapping_sub(n as u64)) && addr >= n as u64
        {
            n += 1;
        }
        n
    }

    /// The key and lowest address of the window a byte-reversing run of `run` entries
    /// covers, its first entry at byte `seg` (the highest address; `reversed_run` found the
    /// others below it, so the subtraction stays above 0).
    pub(super) fn run_window(&self, seg: usize, run: usize) -> (u32, VirtAddr) {
        let lkey = Be32::read(&self.wqe, seg + off::SEG_LKEY).get();
        let highest = Be64::read(&self.wqe, seg + off::SEG_ADDR).get();
        (lkey, VirtAddr(highest - (run as u64 - 1)))
    }

    pub(super) fn op_atomic(&mut self, opcode: Opcode, ds: usize) -> Result<u64, Fail> {
        let remote = remote_of(&self.wqe);
        let (op, result_seg) = atomic_of(&self.wqe, opcode);
        let result = (ds > result_seg).then_some(result_seg * SEG_SIZE);
        if let Some(seg) = result {
            self.check_local_write(seg, 8)?;
        }
        let peer = self
            .peer
            .as_ref()
            .ok_or(Fail::Syndrome(Syndrome::TransportRetryExceeded))?;
        let old = peer
            .atomic(&mut self.remote_keys, remote, op)
            .map_err(Fail::from)?;
        if let Some(seg) = result {
            let reply = atomic_reply(&self.qp, old);
            if self.late_landing {
                // Lands later (see `Core::late`).
                let lkey = Be32::read(&self.wqe, seg + off::SEG_LKEY).get();
                let addr = VirtAddr(Be64::read(&self.wqe, seg + off::SEG_ADDR).get());
                self.late.push((lkey, addr, reply.to_vec()));
            } else {
                self.write_local(seg, &reply);
            }
        }
        Ok(8)
    }

    /// True if the WAIT is satisfied.
    pub(super) fn op_wait(&mut self, ci: u64) -> Result<bool, Fail> {
        let cqn = Cqn(Be32::read(&self.wqe, off::WAIT_OBJ).get());
        let pi = Be32::read(&self.wqe, off::WAIT_PI).get();
        self.wait(ci, cqn, pi)
    }

    /// WAIT(cqn, pi) at `ci`: true if the CQ has produced more than `pi` completions; if not,
    /// registers this PU to be told of the next one and counts the stall (once per WQE).
    #[inline(always)]
    pub(super) fn wait(&mut self, ci: u64, cqn: Cqn, pi: u32) -> Result<bool, Fail> {
        let pu = self.qp.pu;
        let (cq_index, cq) = self
            .objs
            .cq(&self.nic, cqn)
            .ok_or(Fail::Syndrome(Syndrome::LocalQpOperation))?;
        if wait_passed(cq.produced(), pi) {
            stamp(HandoffEvent::WaitPassed);
            return Ok(true);
        }
        cq.add_waiter(pu);
        if wait_passed(cq.produced(), pi) {
            stamp(HandoffEvent::WaitPassed);
            return Ok(true);
        }
        stamp(HandoffEvent::WaitBlocked);
        if self.stalled_at != ci {
            self.stalled_at = ci;
            bump(&self.qp.counters.wait_stalls, 1);
        } else {
            // Found blocked here a second time: likely to stay so (an idle client, not a
            // chain step that the next round finds done), so park on it.
            self.parked = Some(Parked {
                ci,
                cq_index,
                cqn,
                count: pi,
            });
        }
        Ok(false)
    }

    pub(super) fn op_enable(&mut self, opcode: Opcode) -> Result<u64, Fail> {
        let target = Qpn(Be32::read(&self.wqe, off::WAIT_OBJ).get() & MAX_QPN);
        let pi = Be32::read(&self.wqe, off::WAIT_PI).get();
        let r = self.enable(opcode == Opcode::SendEn, target, pi);
        // The general path does not hand over: the queue runs in the PU's next round.
        self.enabled_here = None;
        r
    }

    /// SEND_EN (`send`) or RECV_EN: move the managed queue's enabled index to `pi` (it only
    /// moves forward) and wake whoever runs it.
    #[inline(always)]
    pub(super) fn enable(&mut self, send: bool, target: Qpn, pi: u32) -> Result<u64, Fail> {
        let t = self
            .objs
            .qp(&self.nic, target)
            .ok_or(Fail::Syndrome(Syndrome::LocalQpOperation))?;
        if send {
            if !t.managed_send {
                return Err(Fail::Syndrome(Syndrome::LocalQpOperation));
            }
            use crate::softnic::qp::Enabler;
            // Another PU of this softnic moves a word of its own: no locked instruction.
            let by = Enabler::of(Arc::ptr_eq(&t.pus, &self.qp.pus), t.pu, self.qp.pu);
            let here = by == Enabler::Own;
            if !here {
                // Before the publication: the other PU may see it before this one returns.
                stamp(HandoffEvent::Enabled);
            }
            if t.enabled.advance_by(by, pi) {
                if here {
                    // This PU: no notice needed, and the fast path may hand over to it.
                    self.enabled_here = Some((t.qpn, t.send_cq.cqn));
                } else if t.pus.notify_from(t.pu, &self.qp.pus, self.qp.pu) {
                    // Awake: its completion is a round trip away (see `enabled_away`).
                    self.enabled_away |= 1 << (t.send_cq.cqn.0 % 64);
                }
            }
        } else {
            if !t.managed_recv {
                return Err(Fail::Syndrome(Syndrome::LocalQpOperation));
            }
            if QpShared::advance(&t.rq.enabled, pi) {
                t.wake_requester();
            }
        }
        Ok(0)
    }

    /// The WQE at `ci` failed: error completion (always, signaled or not), QP to error, and
    /// flush everything behind it.
    pub(super) fn fault(&mut self, f: &mut Fetcher, syndrome: Syndrome, bbs: u64) {
        if !self.posted.is_empty() {
            if !self.settle() {
                // A message before it failed: that is the queue's error; this WQE is flushed.
                self.flush(f);
                return;
            }
            if !self.posted.is_empty() {
                // Its error completes after theirs: the WQE runs again on a later visit,
                // once their outcomes are in (never waited for here: see `step`).
                return;
            }
        }
        self.fail(self.ci, bbs, self.wqe[off::OPCODE], syndrome);
        self.ci += bbs;
        self.flush(f);
    }

    /// The WQE of `bbs` BBs at `ci` failed with `syndrome`: its error completion (after
    /// any late responses land), and the QP to error. What the caller flushes is its own:
    /// the ring behind it (`fault`), or the posted WQEs behind it (`settle_oldest`).
    fn fail(&mut self, ci: u64, bbs: u64, opcode: u8, syndrome: Syndrome) {
        if !self.late.is_empty() {
            self.land();
        }
        // Counted first: whoever sees the error completion or state sees the error counted.
        bump(&self.qp.counters.errors, 1);
        let syndrome = syndrome as u8;
        self.qp
            .retire(ci, ci + bbs, CqeOpcode::ReqErr, opcode, 0, syndrome);
        self.qp.enter_error();
    }

    /// In the error state: complete every outstanding WQE with a flush error. True if any.
    pub(super) fn flush(&mut self, f: &mut Fetcher) -> bool {
        if !self.late.is_empty() {
            self.land();
        }
        let mut any = !self.posted.is_empty();
        self.flush_posted();
        let end = self
            .limit()
            .max(self.qp.posted.load(Ordering::Acquire))
            .min(self.ci + self.qp.sq.entries);
        let mut ctrl = [0u8; SEG_SIZE];
        while self.ci < end {
            let ci = self.ci;
            self.qp.sq.buffer.read(self.qp.sq.entry_off(ci), &mut ctrl);
            self.ci += bbs_for_ds(ctrl[off::DS]) as u64;
            self.qp.retire(
                ci,
                self.ci,
                CqeOpcode::ReqErr,
                ctrl[off::OPCODE],
                0,
                Syndrome::WrFlush as u8,
            );
            any = true;
        }
        f.fetched = self.ci;
        any
    }
}

/// A windowed peer's posted messages (see `Core::posted`).
impl Core {
    /// Write the completions of posted WQEs whose outcomes have come (no clock read: between
    /// WQEs; the visit's end runs the timers). False if one failed: its error completion and
    /// the flushes of those after it are written and the queue is in error (next visit:
    /// flush).
    pub(super) fn settle(&mut self) -> bool {
        while !self.posted.is_empty() {
            match self.settle_oldest(Ask::Arrived) {
                Some(true) => {}
                Some(false) => return false,
                None => break,
            }
        }
        true
    }

    /// Settle the oldest posted WQE: Some(true) if it completed, Some(false) if it failed
    /// (see [`Self::settle`]), None if its outcome is not known yet.
    fn settle_oldest(&mut self, ask: Ask) -> Option<bool> {
        let p = *self.posted.front()?;
        let outcome = self.peer.as_ref().and_then(|peer| peer.settle(ask))?;
        self.posted.pop_front();
        match outcome {
            Ok(()) => {
                if p.signaled {
                    self.complete(p.ci, p.bbs, p.opcode, 0);
                }
                Some(true)
            }
            Err(nak) => {
                self.fail(p.ci, p.bbs, p.opcode, nak.syndrome());
                self.flush_posted();
                Some(false)
            }
        }
    }

    /// Flush every posted WQE (the queue is in error) and have the peer forget them.
    fn flush_posted(&mut self) {
        if self.posted.is_empty() {
            return;
        }
        for p in std::mem::take(&mut self.posted) {
            let flush = Syndrome::WrFlush as u8;
            self.qp
                .retire(p.ci, p.ci + p.bbs, CqeOpcode::ReqErr, p.opcode, 0, flush);
        }
        if let Some(peer) = &self.peer {
            peer.abandon();
        }
    }

    /// The end of a windowed queue's visit (`outcome`), and a visit of one with nothing to
    /// run but posted messages: take the outcomes that have come and let the transport's
    /// timers run, never waiting for more (see [`Transport::settle`]). What is left
    /// outstanding is settled by later visits: the PU comes back when a response arrives
    /// for the queue (the endpoint wakes it) or by the transport's next timer (a
    /// retransmission, or an ACK to ask for), whichever is first.
    pub(super) fn settle_at_rest(&mut self, outcome: RunOutcome) -> RunOutcome {
        let mut settled = false;
        while !self.posted.is_empty() {
            match self.settle_oldest(Ask::Now) {
                Some(true) => settled = true,
                Some(false) => return RunOutcome::Progress,
                None => break,
            }
        }
        if settled {
            return RunOutcome::Progress;
        }
        let timer = if self.posted.is_empty() {
            None
        } else {
            self.peer.as_ref().and_then(|p| p.next_timer())
        };
        match (outcome, timer) {
            (RunOutcome::Idle, Some(t)) => RunOutcome::RetryAt(t),
            (RunOutcome::RetryAt(a), Some(t)) => RunOutcome::RetryAt(a.min(t)),
            (o, _) => o,
        }
    }
}
