//! The two softnics and their regions ([`Env`]); an installed offload and the client queue
//! pair talking to it ([`Inst`]): installing and removing one, sending it a trigger and
//! checking the responses; and the [`Slot`] that reinstalls a program when it is used up.

use super::contents::{CBUF_LEN, DATA_LEN, RESP_LEN, SCRATCH_AT};
use super::{diag, send_wr, take_cqes, wait_cq, wait_steps, Opts, SIG};
use redn_bench::queues::{nop, SqWriter};
use redn_bench::setup::{loopback_qp, Region};
use redn_bench::stats::ns;
use redn_bench::wait::WaitMode;
use redn_bench::Ctx;
use redn_program::program::{Iterations, Program};
use redn_sys::conv::idx;
use redn_sys::install::RegionBinding;
use redn_sys::nic::{CompChannel, Completion, CqConfig, Nic, QpConfig};
use redn_sys::softnic::SoftNic;
use redn_sys::{Access, Cqn, Pdn, Qpn, VirtAddr};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// A one-sided client: a client QP connected to a passive server QP, for the READ baselines.
pub(crate) struct Reader {
    pub(crate) sq: SqWriter,
    pub(crate) cq: Cqn,
}

pub(crate) struct Env {
    pub(crate) server: std::sync::Arc<SoftNic>,
    pub(crate) client: SoftNic,
    cpd: Pdn,
    /// Server data: the hash table, the list, the values, scratch.
    pub(crate) data: Region,
    /// Client memory: responses at 0, the drained rows' per-PU answer areas at RESP_LEN
    /// (`ClientSide::apart`), READ landing area at READ_AT.
    pub(crate) cbuf: Region,
    /// The client CQ every client QP of an installation uses.
    pub(crate) ccq: Cqn,
    /// For hosts that sleep until `ccq` has a completion instead of polling it.
    channel: CompChannel,
    /// The READ baselines' connection.
    pub(crate) reader: std::cell::RefCell<Reader>,
    /// A loopback QP and its CQ on each server PU, then one on the client's PU: a signaled NOP
    /// on each wakes the PUs (an idle PU parks after 50 µs) right before a timed run.
    wakers: Vec<(bool, Qpn, Cqn)>,
    /// Installs by (program, WQEs): count and total seconds.
    pub(crate) install_costs:
        std::cell::RefCell<std::collections::BTreeMap<(String, usize), (u64, f64)>>,
    pub(crate) pus: usize,
}

impl Env {
    pub(crate) fn new(o: &Opts) -> Result<Env, String> {
        let server = std::sync::Arc::new(
            o.common
                .softnic("server", o.common.pus)
                .ctx("server softnic")?,
        );
        let client = o
            .common
            .softnic("client", o.common.pus)
            .ctx("client softnic")?;
        let spd = server.alloc_pd().ctx("alloc_pd")?;
        let cpd = client.alloc_pd().ctx("alloc_pd")?;
        let data = Region::new(&server, spd, DATA_LEN, Access::ALL)?;
        let cbuf = Region::new(&client, cpd, CBUF_LEN, Access::ALL)?;
        let ccq = client.create_cq(CqConfig::new(1 << 16)).ctx("create_cq")?;
        // The READ baseline's connection: a client QP and a passive server QP.
        let rcq = client.create_cq(CqConfig::new(4096)).ctx("create_cq")?;
        let mut rc = QpConfig::new(cpd, rcq);
        rc.pu = Some(0);
        let rqp = client.create_qp(rc).ctx("create_qp")?;
        let scq = server.create_cq(CqConfig::default()).ctx("create_cq")?;
        let sqp = server.create_qp(QpConfig::new(spd, scq)).ctx("create_qp")?;
        SoftNic::connect_pair(&client, rqp.qpn, &server, sqp.qpn).ctx("connect_pair")?;
        let mut wakers = Vec::new();
        for (on_server, nic, pd, pu) in (0..o.common.pus)
            .map(|p| (true, &*server, spd, p))
            .chain((0..o.common.pus).map(|p| (false, &client, cpd, p)))
        {
            let cq = nic.create_cq(CqConfig::default()).ctx("create_cq")?;
            // A plain QP's 256 BBs (QpConfig::new): a waker only ever holds one NOP.
            let q = loopback_qp(nic, pd, cq, pu, 256, false)?;
            wakers.push((on_server, q.qpn, cq));
        }
        Ok(Env {
            server,
            client,
            cpd,
            data,
            cbuf,
            ccq,
            channel: CompChannel::new(),
            reader: std::cell::RefCell::new(Reader {
                sq: SqWriter::new(&rqp, true),
                cq: rcq,
            }),
            wakers,
            install_costs: Default::default(),
            pus: o.common.pus,
        })
    }

    /// Wake the client's PU 0 and the server PUs in `server_pus` (see [`Self::wake_pus`]).
    pub(crate) fn wake(&self, server_pus: &[usize]) -> Result<(), String> {
        self.wake_pus(&[0], server_pus)
    }

    /// Wake the client PUs in `client_pus` and the server PUs in `server_pus`: a signaled
    /// NOP on each one's waker queue, waited for. Only the PUs an operation uses are woken:
    /// a woken PU busy-spins for 5 µs, and a spinning PU that has nothing to do only takes
    /// a core from the threads that do.
    pub(crate) fn wake_pus(
        &self,
        client_pus: &[usize],
        server_pus: &[usize],
    ) -> Result<(), String> {
        let mut targets = Vec::new();
        for (i, &(on_server, q, cq)) in self.wakers.iter().enumerate() {
            let used = if on_server {
                server_pus.contains(&i)
            } else {
                client_pus.contains(&(i - self.pus))
            };
            if !used {
                continue;
            }
            let nic = if on_server {
                &self.server
            } else {
                &self.client
            };
            let base = nic.cq_produced(cq).ctx("cq_produced")?;
            nic.post_send(q, &[nop(SIG, 0)]).ctx("post_send")?;
            targets.push((nic, cq, base + 1));
        }
        for (nic, cq, t) in targets {
            wait_cq(nic, cq, t, WaitMode::Spin)?;
            take_cqes(nic, cq, 1)?;
        }
        Ok(())
    }

    /// Region bindings for an installation; `scratch` is the `data` region of the Builder
    /// programs (4 KiB of its own per instance).
    fn regions(&self, scratch: u64, response: (u64, u64)) -> HashMap<String, RegionBinding> {
        let local = |offset, len| RegionBinding::Local {
            buffer: std::sync::Arc::clone(&self.data.buf),
            offset,
            len,
            access: Access::ALL,
        };
        let mut m = HashMap::new();
        for name in ["table", "list", "values"] {
            m.insert(name.to_string(), local(0, DATA_LEN));
        }
        m.insert(
            "data".to_string(),
            local(idx(SCRATCH_AT + scratch * 4096), 4096),
        );
        m.insert(
            "response".to_string(),
            RegionBinding::Remote {
                addr: VirtAddr(self.cbuf.mr.addr.0 + response.0),
                rkey: self.cbuf.mr.lkey.into(),
                len: response.1,
            },
        );
        m
    }
}

/// One installed offload and the client queue pair talking to it.
pub(crate) struct Inst {
    pub(crate) installed: redn_sys::install::Installed<SoftNic>,
    pub(crate) cqp: Qpn,
    pub(crate) csq: SqWriter,
    /// Invocations it serves (u64::MAX for recycled programs).
    capacity: u64,
    /// Triggers sent so far.
    pub(crate) served: u64,
    /// The server PUs its queues run on.
    pub(crate) pus: Vec<usize>,
    /// The client PU its client QP runs on.
    pub(crate) client_pu: usize,
    /// The client CQ its answers complete on.
    pub(crate) ccq: Cqn,
}

/// The client end of an installation: the client PU its QP runs on, the client CQ its
/// completions land in, and where in the client's buffer (offset, length) its answers are
/// written.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ClientSide {
    pub(crate) pu: usize,
    pub(crate) cq: Cqn,
    pub(crate) response: (u64, u64),
}

/// How many answer areas `ClientSide::apart` has, each `RESP_LEN / APART_AREAS` bytes.
const APART_AREAS: u64 = 16;

impl ClientSide {
    /// The client end every row shares: client PU `pu`, the client CQ, answers at 0.
    pub(crate) fn shared(env: &Env, pu: usize) -> ClientSide {
        ClientSide {
            pu,
            cq: env.ccq,
            response: (0, RESP_LEN),
        }
    }

    /// A client end of its own for group `group` (of `APART_AREAS`): client PU `pu`, the CQ
    /// `cq`, answers in the group's own area after the shared one, so that server PUs
    /// answering different groups write no cache line or CQ in common, as answers to clients
    /// on different hosts would not.
    pub(crate) fn apart(pu: usize, cq: Cqn, group: u64) -> Result<ClientSide, String> {
        let len = RESP_LEN / APART_AREAS;
        if group >= APART_AREAS {
            return Err(format!(
                "client group {group}: the client buffer has {APART_AREAS} answer areas"
            ));
        }
        Ok(ClientSide {
            pu,
            cq,
            response: (RESP_LEN + group * len, len),
        })
    }
}

impl Inst {
    pub(crate) fn left(&self) -> u64 {
        self.capacity - self.served
    }

    pub(crate) fn server_qps(&self) -> Vec<Qpn> {
        self.installed.qps.iter().map(|q| q.qpn).collect()
    }

    /// WQEs executed so far on the program's queues.
    pub(crate) fn wqes(&self, env: &Env) -> Result<u64, String> {
        let mut t = 0;
        for q in &self.installed.qps {
            t += env.server.counters(q.qpn).ctx("counters")?.total_wqes();
        }
        Ok(t)
    }

    pub(crate) fn diag(&self, env: &Env) -> String {
        let mut s = diag(&env.server, &self.server_qps(), &self.installed.cqs);
        s += &diag(&env.client, &[self.cqp], &[self.ccq]);
        s
    }
}

/// Install `program` on the server with a fresh client QP (send ring `sq_bbs`, `rq_slots`
/// receive slots) on client PU `client_pu`, connected to its client-facing queue; the
/// client end every row shares (`ClientSide::shared`).
pub(crate) fn install(
    env: &Env,
    program: &Program,
    scratch: u64,
    sq_bbs: u32,
    rq_slots: u32,
    client_pu: usize,
) -> Result<Inst, String> {
    let side = ClientSide::shared(env, client_pu);
    install_for(env, program, scratch, sq_bbs, rq_slots, side)
}

/// [`install`] with the client end `side`.
pub(crate) fn install_for(
    env: &Env,
    program: &Program,
    scratch: u64,
    sq_bbs: u32,
    rq_slots: u32,
    side: ClientSide,
) -> Result<Inst, String> {
    let mut c = QpConfig::new(env.cpd, side.cq);
    c.sq_bbs = sq_bbs;
    c.rq_slots = rq_slots;
    c.rq_sges = 1;
    c.pu = Some(side.pu);
    let cinfo = env.client.create_qp(c).ctx("create client QP")?;
    let regions = env.regions(scratch, side.response);
    let t_inst = Instant::now();
    let r = redn_sys::install::install(&env.server, program, &regions, &mut |q| {
        SoftNic::connect_pair(&env.client, cinfo.qpn, &env.server, q)
    });
    {
        let mut costs = env.install_costs.borrow_mut();
        let e = costs
            .entry((program.name.clone(), program.wqe_count()))
            .or_insert((0, 0.0));
        e.0 += 1;
        e.1 += t_inst.elapsed().as_secs_f64();
    }
    let installed = match r {
        Ok(i) => i,
        Err(e) => {
            let _ = env.client.destroy_qp(cinfo.qpn);
            return Err(format!("install {}: {e}", program.name));
        }
    };
    let capacity = match program.iterations {
        Iterations::Bounded { invocations, .. } => u64::from(invocations),
        Iterations::Recycled { .. } => u64::MAX,
    };
    let mut pus: Vec<usize> = installed.qps.iter().map(|q| q.pu).collect();
    pus.sort_unstable();
    pus.dedup();
    Ok(Inst {
        installed,
        cqp: cinfo.qpn,
        csq: SqWriter::new(&cinfo, true),
        capacity,
        served: 0,
        pus,
        client_pu: side.pu,
        ccq: side.cq,
    })
}

/// Tear an installation down: its queues, code region and CQs, and the client QP.
pub(crate) fn remove(env: &Env, inst: Inst) -> Result<(), String> {
    // `remove` destroys the offload's queues, their CQs and the code region.
    inst.installed.remove().ctx("remove offload")?;
    env.client.destroy_qp(inst.cqp).ctx("destroy client QP")?;
    Ok(())
}

/// `program` with every queue placed on PU `pu`.
pub(crate) fn on_pu(program: &Program, pu: usize) -> Program {
    let mut p = program.clone();
    for q in &mut p.queues {
        q.pu = Some(pu);
    }
    p
}

/// How the host waits for a response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HostWait {
    /// Busy-polls the client CQ's count (yielding only after 20 µs).
    Poll,
    /// Sleeps on a completion channel armed for the client CQ (as RedN's client thread does),
    /// so it holds no core while the GET runs; its wake-up is part of the latency.
    Channel,
}

/// Send one trigger and wait for `responses` completions on the client CQ: the ns from the
/// doorbell to each, and the completions. The client CQ must be drained before.
pub(crate) fn trigger(
    env: &Env,
    inst: &mut Inst,
    msg: &[u8],
    responses: u64,
    how: HostWait,
) -> Result<(Vec<f64>, Vec<Completion>), String> {
    for _ in 0..responses {
        env.client.post_recv(inst.cqp, 0, &[]).ctx("post_recv")?;
    }
    inst.csq.push(&env.client, &send_wr(msg.to_vec()))?;
    let base = env.client.cq_produced(env.ccq).ctx("cq_produced")?;
    env.wake(&inst.pus)?;
    let t0 = Instant::now();
    inst.csq.ring(&env.client)?;
    let seen = match how {
        HostWait::Poll => wait_steps(&env.client, env.ccq, base, responses, None),
        HostWait::Channel => wait_steps(&env.client, env.ccq, base, responses, Some(&env.channel)),
    }
    .map_err(|e| format!("{e}{}", inst.diag(env)))?;
    inst.served += 1;
    let times = seen.iter().map(|t| ns(*t - t0)).collect();
    let cqes = take_cqes(&env.client, env.ccq, idx(responses))?;
    Ok((times, cqes))
}

/// Check responses: all successful, immediate `imm`, the byte lengths `lens` (any order).
pub(crate) fn check_responses(cqes: &[Completion], imm: u32, lens: &[u32]) -> Result<(), String> {
    let mut got: Vec<u32> = Vec::new();
    for c in cqes {
        if !c.is_ok() {
            return Err(format!("response failed: {c:?}"));
        }
        if c.imm != Some(imm) {
            return Err(format!(
                "response immediate {:?}, expected {imm}: {c:?}",
                c.imm
            ));
        }
        got.push(c.byte_len);
    }
    got.sort_unstable();
    let mut want = lens.to_vec();
    want.sort_unstable();
    if got != want {
        return Err(format!("response lengths {got:?}, expected {want:?}"));
    }
    Ok(())
}

/// An installation that is replaced when it runs out of invocations.
pub(crate) struct Slot {
    pub(crate) program: Program,
    inst: Option<Inst>,
    ring: u32,
    pub(crate) installs: usize,
}

impl Slot {
    pub(crate) fn new(program: Program, ring: u32) -> Slot {
        Slot {
            program,
            inst: None,
            ring,
            installs: 0,
        }
    }

    /// The installation, with at least `need` invocations left.
    pub(crate) fn get(&mut self, env: &Env, need: u64) -> Result<&mut Inst, String> {
        if self.inst.as_ref().map_or(true, |i| i.left() < need) {
            if let Some(i) = self.inst.take() {
                remove(env, i)?;
            }
            self.inst = Some(install(env, &self.program, 0, self.ring, self.ring, 0)?);
            self.installs += 1;
            // Let the entry enables run, and the PUs be awake, before the first trigger.
            std::thread::sleep(Duration::from_micros(100));
        }
        self.inst
            .as_mut()
            .ok_or_else(|| "no installation".to_string())
    }

    pub(crate) fn clear(&mut self, env: &Env) -> Result<(), String> {
        if let Some(i) = self.inst.take() {
            remove(env, i)?;
        }
        Ok(())
    }
}
