//! The figures: each measures through the manager, prints a table, writes an SVG, and puts
//! the same run's UDP ping-pong floor beside it. This module holds the run and what the
//! figures share; the figures are in `latency` (Figs. 10, 11, 13) and `load` (Figs. 15, 16,
//! the control plane).

mod latency;
mod load;

pub use latency::{collisions, get_latency, list};
pub use load::{contention, control, crash};

use crate::app::baseline_options;
use crate::app::value_bytes;
use crate::procs::{ManagerProc, Peer};
use crate::Options;
use anyhow::{anyhow, bail, Context, Result};
use redn_bench::plot::{write_svg, Figure, Series, XAxis};
use redn_bench::report::verdict;
use redn_bench::stats::{ns, stats, Stats};
use redn_client::baseline::{OneSidedClient, RpcClient};
use redn_client::remote::{RemoteClient, RemoteOptions};
use std::net::{SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Buckets of the app's table (value slots of 64 B) for every figure but Fig. 10's.
const BUCKETS: u64 = 256;

/// One run: its options, the manager, what was printed, what went wrong.
pub struct Run {
    o: Options,
    binary: PathBuf,
    dir: PathBuf,
    manager: ManagerProc,
    text: String,
    anomalies: Vec<String>,
    /// GETs whose value was checked, and how many were wrong.
    checked: u64,
    wrong: u64,
    /// GETs that failed outside the crash figure (a timeout, a failed completion).
    failed: u64,
    apps: u32,
}

/// An offload the app installed: what a remote client needs.
struct Offload {
    handle: u64,
    token: String,
}

impl Run {
    /// A run on `manager`.
    pub fn new(o: Options, binary: PathBuf, dir: PathBuf, manager: ManagerProc) -> Run {
        Run {
            o,
            binary,
            dir,
            manager,
            text: String::new(),
            anomalies: Vec::new(),
            checked: 0,
            wrong: 0,
            failed: 0,
            apps: 0,
        }
    }

    /// Print a line and keep it for tables.txt.
    pub fn line(&mut self, s: String) {
        println!("{s}");
        self.text.push_str(&s);
        self.text.push('\n');
    }

    /// Note something that went wrong.
    pub fn anomaly(&mut self, s: String) {
        self.anomalies.push(s);
    }

    /// The report's head.
    pub fn head(&mut self, started: Instant) {
        let _ = started;
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        self.line("paper_bench: the RedN paper's §5 figures through redn-manager".into());
        self.line(format!(
            "   {cores} cores; manager {} on the softnic with {} PUs; RoCEv2 over loopback; {}{}",
            self.binary.display(),
            self.o.pus,
            if self.o.quick {
                "quick run"
            } else {
                "full run"
            },
            if cfg!(debug_assertions) {
                "  !! debug build: numbers are meaningless, use --release"
            } else {
                ""
            }
        ));
        self.line("   times in µs; floor: raw UDP ping-pong between this process and the app's, both busy-polling".into());
    }

    /// The tail: answers, anomalies, run time; writes tables.txt. The GETs answered wrong
    /// or not at all.
    pub fn finish(&mut self, started: Instant) -> Result<u64> {
        self.line(format!(
            "\nanswers: {} GETs checked, {} wrong, {} failed",
            self.checked, self.wrong, self.failed
        ));
        if !self.anomalies.is_empty() {
            // The manager's log (its audit records and errors) beside the tables, to see why.
            let _ = std::fs::copy(
                self.manager.dir.join("manager.log"),
                self.o.out.join("manager.log"),
            );
        }
        if self.anomalies.is_empty() {
            self.line("anomalies: none".into());
        } else {
            self.line(format!("anomalies ({}):", self.anomalies.len()));
            for a in self.anomalies.clone() {
                self.line(format!(" - {a}"));
            }
        }
        self.line(format!(
            "total run time {:.1} s",
            started.elapsed().as_secs_f64()
        ));
        std::fs::write(self.o.out.join("tables.txt"), &self.text)?;
        Ok(self.wrong + self.failed)
    }

    fn n(&self, quick: usize, full: usize) -> usize {
        if self.o.quick {
            quick
        } else {
            full
        }
    }

    /// A fresh app process on the manager.
    fn app(&mut self, buckets: u64, slot: u64, writers: bool) -> Result<(Peer, PathBuf)> {
        self.apps += 1;
        let sock = self.dir.join(format!("writers-{}.sock", self.apps));
        let mut args = vec![
            "--socket".to_owned(),
            self.manager.api.display().to_string(),
            "--buckets".to_owned(),
            buckets.to_string(),
            "--slot".to_owned(),
            slot.to_string(),
        ];
        if writers {
            args.extend(["--writers".to_owned(), sock.display().to_string()]);
        }
        Ok((Peer::start("app", &args)?, sock))
    }

    fn plot(&mut self, name: &str, fig: &Figure) -> Result<()> {
        let path = self.o.out.join(name);
        write_svg(fig, &path).map_err(|e| anyhow!(e))?;
        self.line(format!("   plot: {}", path.display()));
        Ok(())
    }

    /// A remote client of `off` on the manager's data plane.
    fn remote(&self, off: &Offload, timeout: Duration) -> Result<RemoteClient> {
        Ok(RemoteClient::connect(
            self.manager.dataplane,
            off.handle,
            &off.token,
            RemoteOptions {
                timeout,
                ..Default::default()
            },
        )?)
    }

    /// `n` GETs of `keys` in turn (each `(key, value length)`), after n/10 not counted;
    /// each value checked.
    fn time_gets(
        &mut self,
        g: &mut dyn Getter,
        keys: &[(u64, usize)],
        n: usize,
    ) -> Result<Vec<f64>> {
        let mut v = Vec::with_capacity(n);
        for i in 0..n + n / 10 {
            let (key, len) = keys[i % keys.len()];
            g.prepare()?;
            let t = Instant::now();
            let got = g.get(key);
            let took = ns(t.elapsed());
            match got {
                Ok(got) => self.check(key, len, got.as_deref()),
                Err(e) => {
                    // Counted, said, and not timed; the client opens a new session for the
                    // next GET. Too many, and the figure stops.
                    self.failed += 1;
                    if self.failed <= 5 {
                        self.anomaly(format!("GET {key:#x} failed after {}: {e:#}", us(took)));
                    }
                    if self.failed > 20 {
                        bail!("more than 20 GETs failed");
                    }
                    continue;
                }
            }
            if i >= n / 10 {
                v.push(took);
            }
        }
        Ok(v)
    }

    fn check(&mut self, key: u64, len: usize, got: Option<&[u8]>) {
        self.checked += 1;
        if got != Some(&value_bytes(key, len)[..]) {
            self.wrong += 1;
            if self.wrong <= 5 {
                let what = got.map_or("a miss".to_owned(), |g| format!("{} bytes", g.len()));
                self.anomaly(format!(
                    "GET {key:#x}: wrong answer ({what}, wanted {len} bytes)"
                ));
            }
        }
    }

    /// The floor: `n` raw UDP round trips with the app (a request of 64 B, an answer of
    /// `answer` bytes), both ends busy-polling.
    fn floor(&mut self, app: &mut Peer, answer: usize, n: usize) -> Result<Stats> {
        let udp = UdpSocket::bind("127.0.0.1:0")?;
        let port: u16 = app
            .ask(&format!("udp-echo {}", udp.local_addr()?.port()))?
            .strip_prefix("port ")
            .and_then(|p| p.parse().ok())
            .context("the app's echo port")?;
        udp.connect(("127.0.0.1", port))?;
        udp.set_nonblocking(true)?;
        let mut req = [0u8; 64];
        req[..4].copy_from_slice(&u32::try_from(answer)?.to_le_bytes());
        let mut buf = vec![0u8; 64 << 10];
        let mut v = Vec::with_capacity(n);
        let mut result = Ok(());
        'pings: for i in 0..n + n / 10 {
            let t = Instant::now();
            let deadline = t + Duration::from_secs(2);
            udp.send(&req)
                .context("the UDP floor's ping-pong with the app's echo")?;
            let mut got = 0;
            while got < answer.max(1) {
                match udp.recv(&mut buf) {
                    Ok(k) => got += k,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        let now = Instant::now();
                        if now > deadline {
                            result = Err(anyhow!("a UDP ping-pong got no answer within 2 s"));
                            break 'pings;
                        }
                        spin_or_yield(now - t);
                    }
                    Err(e) => {
                        return Err(e).context("the UDP floor's ping-pong with the app's echo")
                    }
                }
            }
            if i >= n / 10 {
                v.push(ns(t.elapsed()));
            }
        }
        // Three end markers: one may be lost. The echo's socket closes at the first it
        // reads, so a later marker may meet no socket: the ICMP port unreachable that comes
        // back makes the next send on this connected socket fail with ECONNREFUSED, which
        // says the echo has ended, as the markers asked.
        for _ in 0..3 {
            match udp.send(&[0]) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => break,
                Err(e) => return Err(e).context("ending the app's UDP echo"),
            }
        }
        if app.hear()? != "ok" {
            bail!("the app's echo did not end");
        }
        result?;
        Ok(stats(&v))
    }

    fn install(app: &mut Peer, name: &str) -> Result<Offload> {
        let line = app.ask(&format!("install {name}"))?;
        let w: Vec<&str> = line.split_whitespace().collect();
        match w.as_slice() {
            ["installed", handle, token, _endpoint] => Ok(Offload {
                handle: handle.parse()?,
                token: (*token).to_owned(),
            }),
            _ => bail!("the app said {line:?} to install {name}"),
        }
    }

    /// The floor's row, and each of `against` (a name, a p50) as a multiple of it.
    fn floor_line(&mut self, f: Stats, against: &[(&str, f64)]) {
        self.line(format!(
            "   {:<40} {:>9} {:>9}",
            "floor: raw UDP ping-pong, 64 B",
            us(f.median),
            us(f.p99)
        ));
        if !against.is_empty() {
            let ratios: Vec<String> = against
                .iter()
                .map(|(name, p50)| format!("{name} {:.2}x", p50 / f.median))
                .collect();
            self.line(format!("   p50 / floor p50: {}", ratios.join(", ")));
        }
    }
}

/// A client whose GETs a figure times.
trait Getter {
    /// Untimed work before a GET.
    fn prepare(&mut self) -> Result<()> {
        Ok(())
    }
    /// One GET.
    fn get(&mut self, key: u64) -> Result<Option<Vec<u8>>>;
}

/// A remote client of an offload whose GETs take `triggers` triggers: a bounded instance
/// used up is replaced before a GET, untimed (its hello is timed in the control plane).
struct Offloaded<'a> {
    c: &'a mut RemoteClient,
    triggers: u32,
}

impl Getter for Offloaded<'_> {
    fn prepare(&mut self) -> Result<()> {
        fresh_session(self.c, self.triggers)
    }
    fn get(&mut self, key: u64) -> Result<Option<Vec<u8>>> {
        Ok(self.c.get(key)?)
    }
}

impl Getter for OneSidedClient {
    fn get(&mut self, key: u64) -> Result<Option<Vec<u8>>> {
        Ok(OneSidedClient::get(self, key)?)
    }
}

impl Getter for RpcClient {
    fn get(&mut self, key: u64) -> Result<Option<Vec<u8>>> {
        Ok(RpcClient::get(self, key)?)
    }
}

/// The app's baseline servers, started: (one-sided, two-sided RPC).
fn baselines(app: &mut Peer) -> Result<(SocketAddr, SocketAddr)> {
    let line = app.ask("baselines")?;
    let w: Vec<&str> = line.split_whitespace().collect();
    match w.as_slice() {
        ["baselines", one, rpc] => Ok((one.parse()?, rpc.parse()?)),
        _ => bail!("the app said {line:?} to baselines"),
    }
}

/// Whether the client's instance is bounded and cannot serve `triggers` more.
fn session_short(c: &RemoteClient, triggers: u32) -> bool {
    c.session()
        .is_some_and(|s| s.invocations != 0 && s.served + triggers > s.invocations)
}

/// Replace a bounded instance that cannot serve `triggers` more.
fn fresh_session(c: &mut RemoteClient, triggers: u32) -> Result<()> {
    if session_short(c, triggers) {
        c.reconnect()?;
    }
    Ok(())
}

/// What a busy-polling end does after a poll that found nothing, `waited` into its wait:
/// spin, but yield the CPU past 20 µs (two cores carry both ends, the softnics' threads and,
/// on a shared machine, whatever else runs: a peer spinning on a descheduled peer's core
/// would turn a round trip into a time slice).
pub fn spin_or_yield(waited: Duration) {
    if waited > Duration::from_micros(20) {
        std::thread::yield_now();
    } else {
        std::hint::spin_loop();
    }
}

fn us(v: f64) -> String {
    if v.is_finite() {
        format!("{:.1}", v / 1e3)
    } else {
        "-".into()
    }
}

/// A row of Fig. 10: the value size, then the floor, RedN hash-get, RedN server-loop,
/// one-sided and two-sided.
struct SizeRow {
    size: usize,
    of: [Stats; 5],
}

/// Names of Fig. 10's columns, in [`SizeRow::of`]'s order, and their colours.
const SIZE_COLUMNS: [(&str, usize); 5] = [
    ("UDP floor", 7),
    ("RedN hash-get", 0),
    ("RedN server-loop", 2),
    ("one-sided (2 READs)", 1),
    ("two-sided RPC", 3),
];

/// `s` as "p50/p99" in µs.
fn pair(s: Stats) -> String {
    format!("{}/{}", us(s.median), us(s.p99))
}

/// A target's line: `what` is `ratio` against `limit`; by how much it is missed.
fn target(r: &mut Run, what: &str, ratio: f64, limit: f64) {
    let miss = if ratio > limit {
        format!(" (missed by {:.2}x)", ratio / limit)
    } else {
        String::new()
    };
    r.line(format!(
        "   target: {what} <= {limit}x: {ratio:.2}x, {}{miss}",
        verdict(ratio <= limit)
    ));
}
