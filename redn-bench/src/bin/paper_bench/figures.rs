//! The figures: each measures through the manager, prints a table, writes an SVG, and puts
//! the same run's UDP ping-pong floor beside it.

use crate::app::baseline_options;
use crate::app::{pick_keys, value_bytes, LIST_VALUE_LEN};
use crate::procs::{ManagerProc, Peer, DEADLINE};
use crate::Options;
use anyhow::{anyhow, bail, Context, Result};
use redn_bench::plot::{write_svg, Figure, Series, XAxis};
use redn_bench::report::{size_name, verdict};
use redn_bench::stats::{ns, stats, Stats};
use redn_client::baseline::{OneSidedClient, Probe, RpcClient};
use redn_client::kv::{bucket_indices, BUCKET_STRIDE};
use redn_client::remote::{RemoteClient, RemoteOptions};
use redn_program::program::catalog::trigger_key;
use redn_proto::api;
use redn_proto::client::Connection;
use redn_sys::softnic::completion_clock_ns;
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
            RemoteOptions { timeout },
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
            udp.send(&req)?;
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
        // Three end markers: one may be lost.
        for _ in 0..3 {
            udp.send(&[0])?;
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

/// Fig. 10: GET latency by value size.
pub fn get_latency(r: &mut Run) -> Result<()> {
    r.line("\nFig. 10: GET latency by value size, key in its first bucket (p50/p99, µs)".into());
    let sizes: Vec<usize> = if r.o.quick {
        vec![64, 1024, 16 << 10, 64 << 10]
    } else {
        (6..=16).map(|p| 1usize << p).collect()
    };
    let n = r.n(200, 2000);
    let (mut app, _) = r.app(64, 64 << 10, false)?;
    let keys = pick_keys(sizes.len(), 64, 0x1_0000);
    for (&k, &s) in keys.iter().zip(&sizes) {
        app.ask(&format!("set {k} {s} 0"))?;
    }
    let hash_get = Run::install(&mut app, "hash-get")?;
    let looped = Run::install(&mut app, "server-loop")?;
    let mut hg = r.remote(&hash_get, Duration::from_secs(5))?;
    let mut sl = r.remote(&looped, Duration::from_secs(5))?;
    let (one_addr, rpc_addr) = baselines(&mut app)?;
    let opts = baseline_options(Duration::from_secs(5));
    let mut one = OneSidedClient::connect(one_addr, Probe::Sequential, opts)?;
    let mut rpc = RpcClient::connect(rpc_addr, opts)?;
    let mut head = format!("   {:>6}", "size");
    for (name, _) in SIZE_COLUMNS {
        head.push_str(&format!(" {name:>19}"));
    }
    head.push_str(&format!(" {:>15}", "hash-get/floor"));
    r.line(head);
    let mut rows = Vec::new();
    for (&k, &s) in keys.iter().zip(&sizes) {
        let key = [(k, s)];
        let of = [
            r.floor(&mut app, s, n)?,
            stats(&r.time_gets(
                &mut Offloaded {
                    c: &mut hg,
                    triggers: 1,
                },
                &key,
                n,
            )?),
            stats(&r.time_gets(
                &mut Offloaded {
                    c: &mut sl,
                    triggers: 1,
                },
                &key,
                n,
            )?),
            stats(&r.time_gets(&mut one, &key, n)?),
            stats(&r.time_gets(&mut rpc, &key, n)?),
        ];
        let mut line = format!("   {:>6}", size_name(s));
        for x in of {
            line.push_str(&format!(" {:>19}", pair(x)));
        }
        line.push_str(&format!(" {:>14.2}x", of[1].median / of[0].median));
        r.line(line);
        rows.push(SizeRow { size: s, of });
    }
    app.ask("stop-baselines")?;
    if let Some(first) = rows.first() {
        let [floor, redn, _, one_sided, two_sided] = first.of.map(|x| x.median);
        r.line(format!("   at {} (p50):", size_name(first.size)));
        target(r, "RedN GET / one-sided", redn / one_sided, 0.6);
        target(r, "RedN GET / two-sided", redn / two_sided, 1.0);
        target(r, "RedN GET / raw UDP ping-pong", redn / floor, 1.3);
    }
    let mut series = Vec::new();
    for (i, (name, colour)) in SIZE_COLUMNS.into_iter().enumerate() {
        let p50 = rows.iter().map(|x| (x.size as f64, x.of[i].median / 1e3));
        let p99 = rows.iter().map(|x| (x.size as f64, x.of[i].p99 / 1e3));
        series.push(Series::solid(name, colour, p50.collect()));
        series.push(Series::dashed("", colour, p99.collect()));
    }
    let fig = Figure {
        title: "GET latency by value size (Fig. 10)".into(),
        x_label: "value size".into(),
        y_label: "latency (µs; solid: p50, dashed: p99)".into(),
        x_axis: XAxis::Log2Bytes,
        y_log: true,
        legend_lower_right: false,
        series,
    };
    r.plot("get_latency.svg", &fig)
}

/// Fig. 11: the key in its first or second bucket, probed in sequence or in parallel.
pub fn collisions(r: &mut Run) -> Result<()> {
    r.line("\nFig. 11: hash collisions: key in the first or second bucket (p50 / p99, µs)".into());
    let n = r.n(200, 2000);
    let (mut app, _) = r.app(BUCKETS, 64, false)?;
    let keys = pick_keys(2, BUCKETS, 0x2_0000);
    app.ask(&format!("set {} 64 0", keys[0]))?;
    app.ask(&format!("set {} 64 1", keys[1]))?;
    let floor = r.floor(&mut app, 64, n)?;
    r.line(format!(
        "   {:<40} {:>19} {:>19}   {:>19} {:>19}",
        "", "round trip: first", "second", "server span: first", "second"
    ));
    let mut admin = Connection::connect(&r.manager.dir.join("admin.sock"), DEADLINE)?;
    let (mut series, mut spans) = (Vec::new(), Vec::new());
    let mut span_p50 = [[f64::NAN; 2]; 3];
    let mut rtt_first = [f64::NAN; 3];
    for (i, (name, label)) in [
        ("hash-get", "hash-get: client probes in turn"),
        ("hash-get-seq", "hash-get-seq: NIC probes in sequence"),
        ("hash-get-par", "hash-get-par: NIC probes in parallel"),
    ]
    .into_iter()
    .enumerate()
    {
        let off = Run::install(&mut app, name)?;
        let mut c = r.remote(&off, Duration::from_secs(5))?;
        let mut rows = Vec::new();
        for (which, &key) in keys.iter().enumerate() {
            let (rtt, span) = probe_gets(r, &mut c, &mut admin, off.handle, name, key, which, n)?;
            rows.push((stats(&rtt), stats(&span)));
            span_p50[i][which] = stats(&span).median;
        }
        r.line(format!(
            "   {label:<40} {:>19} {:>19}   {:>19} {:>19}",
            pair(rows[0].0),
            pair(rows[1].0),
            pair(rows[0].1),
            pair(rows[1].1)
        ));
        rtt_first[i] = rows[0].0.median;
        lines(&mut series, name, i, rows[0].0, rows[1].0);
        lines(&mut spans, name, i, rows[0].1, rows[1].1);
    }
    let (one_addr, _) = baselines(&mut app)?;
    let opts = baseline_options(Duration::from_secs(5));
    for (i, (probe, label, name)) in [
        (
            Probe::Sequential,
            "one-sided: READ buckets in turn, value",
            "one-sided seq",
        ),
        (
            Probe::Parallel,
            "one-sided: READ both buckets, value",
            "one-sided par",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let mut c = OneSidedClient::connect(one_addr, probe, opts)?;
        let first = stats(&r.time_gets(&mut c, &[(keys[0], 64)], n)?);
        let second = stats(&r.time_gets(&mut c, &[(keys[1], 64)], n)?);
        r.line(format!(
            "   {label:<40} {:>19} {:>19}",
            pair(first),
            pair(second)
        ));
        lines(&mut series, name, i + 3, first, second);
    }
    app.ask("stop-baselines")?;
    r.floor_line(
        floor,
        &[
            ("hash-get", rtt_first[0]),
            ("hash-get-seq", rtt_first[1]),
            ("hash-get-par", rtt_first[2]),
        ],
    );
    let flat = |v: f64| vec![(1.0, v / 1e3), (2.0, v / 1e3)];
    series.push(Series::dashed("UDP floor p50", 7, flat(floor.median)));
    spans.push(Series::dashed(
        "half the UDP floor p50",
        7,
        flat(floor.median / 2.0),
    ));
    r.line("   server span: the trigger's receive CQE on the manager's softnic (io.redn.Admin.TriggerTimes) to the last response's receive CQE on the client's, one host clock: the server's work and the response's one-way trip, not the client's wake-ups".into());
    let [one_bucket, _] = span_p50[0];
    let [_, par_second] = span_p50[2];
    target(
        r,
        "parallel two-bucket server span / one-bucket (p50)",
        par_second / one_bucket,
        1.2,
    );
    let fig = Figure {
        title: "Hash collisions: key in bucket 1 or 2, client round trip (Fig. 11)".into(),
        x_label: "bucket holding the key".into(),
        y_label: "GET latency (µs; solid: p50, dashed: p99)".into(),
        x_axis: XAxis::Linear,
        y_log: true,
        legend_lower_right: false,
        series,
    };
    r.plot("collisions.svg", &fig)?;
    let fig = Figure {
        title: "Hash collisions: server-side span from CQE timestamps (Fig. 11)".into(),
        x_label: "bucket holding the key".into(),
        y_label: "span (µs; solid: p50, dashed: p99)".into(),
        x_axis: XAxis::Linear,
        y_log: true,
        legend_lower_right: false,
        series: spans,
    };
    r.plot("collisions_span.svg", &fig)
}

/// A system's p50 (named) and p99 lines over buckets 1 and 2.
fn lines(series: &mut Vec<Series>, name: &str, colour: usize, first: Stats, second: Stats) {
    let at = |f: fn(&Stats) -> f64| vec![(1.0, f(&first) / 1e3), (2.0, f(&second) / 1e3)];
    series.push(Series::solid(name, colour, at(|s| s.median)));
    series.push(Series::dashed("", colour, at(|s| s.p99)));
}

/// `n` GETs of `key` (64 B, in its bucket `which`) through `offload`'s raw triggers (after
/// n/10 not counted): each one's round trip, and its server-side span from the CQE
/// timestamps (summed over its triggers when the client probes in turn).
#[allow(clippy::too_many_arguments)]
fn probe_gets(
    r: &mut Run,
    c: &mut RemoteClient,
    admin: &mut Connection,
    handle: u64,
    offload: &str,
    key: u64,
    which: usize,
    n: usize,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let single = offload == "hash-get";
    let triggers: u32 = if single { 1 + u32::from(which == 1) } else { 1 };
    let _ = trigger_times(admin, handle)?; // earlier triggers: not ours to pair
    let mut arrivals = Vec::new();
    let mut windows: Vec<Vec<(u64, u64)>> = Vec::with_capacity(n + n / 10);
    let mut rtt = Vec::with_capacity(n);
    for i in 0..n + n / 10 {
        if session_short(c, triggers) {
            // Its arrivals are harvested when asked for: before it is released.
            arrivals.extend(trigger_times(admin, handle)?);
            c.reconnect()?;
        }
        let table = c
            .session()
            .and_then(|s| s.manager.region("table").cloned())
            .ok_or_else(|| anyhow!("no table in the manager's answer"))?;
        let [a, b] = bucket_indices(key, table.len / BUCKET_STRIDE)
            .map(|j| (table.addr + j * BUCKET_STRIDE).to_be_bytes());
        let k = trigger_key(key);
        let msgs: Vec<(Vec<u8>, usize)> = if single {
            let probes = if which == 0 { vec![a] } else { vec![a, b] };
            probes.iter().map(|p| ([&k[..], p].concat(), 1)).collect()
        } else {
            vec![([&k[..], &k, &a, &b].concat(), 2)]
        };
        let mut got = None;
        let mut w = Vec::new();
        let t = Instant::now();
        for (msg, responses) in msgs {
            let sent = completion_clock_ns();
            let rs = c.trigger(&msg, responses)?;
            w.push((sent, rs.iter().map(|x| x.received_ns).max().unwrap_or(0)));
            if let Some(hit) = rs.into_iter().find(|x| !x.data.is_empty()) {
                got = Some(hit.data);
            }
        }
        let took = ns(t.elapsed());
        r.check(key, 64, got.as_deref());
        if i >= n / 10 {
            rtt.push(took);
        }
        windows.push(w);
        // The manager keeps 4,096 arrivals between two calls.
        if i % 500 == 499 {
            arrivals.extend(trigger_times(admin, handle)?);
        }
    }
    arrivals.extend(trigger_times(admin, handle)?);
    // Each trigger's arrival is the one stamp between its send and its answer (triggers go
    // one at a time). An instance released before the manager harvested its completions
    // (a bounded one, replaced every few triggers) leaves its last triggers without one:
    // those GETs have no span.
    let mut next = arrivals.iter().copied().peekable();
    let mut span = Vec::with_capacity(n);
    let mut unstamped = 0usize;
    for (i, w) in windows.iter().enumerate() {
        let mut total = Some(0.0);
        for &(sent, answered) in w {
            while next.peek().is_some_and(|&x| x <= sent) {
                next.next();
            }
            match next.next_if(|&x| x <= answered) {
                #[allow(clippy::cast_precision_loss)]
                Some(arrived) => total = total.map(|t| t + (answered - arrived) as f64),
                None => total = None,
            }
        }
        match total {
            Some(t) if i >= n / 10 => span.push(t),
            Some(_) => {}
            None => unstamped += 1,
        }
    }
    if span.len() < n / 2 {
        bail!(
            "{offload}: {unstamped} of {} GETs had no arrival stamp",
            windows.len()
        );
    }
    Ok((rtt, span))
}

/// The arrival stamps of `handle`'s triggers since the last call.
fn trigger_times(admin: &mut Connection, handle: u64) -> Result<Vec<u64>> {
    let reply: api::TriggerTimesReply = admin.call(
        "io.redn.Admin.TriggerTimes",
        &api::TriggerTimes { handle },
        &[],
    )?;
    if reply.dropped > 0 {
        bail!("the manager dropped {} trigger times", reply.dropped);
    }
    Ok(reply.received_ns)
}

/// Fig. 13: list-find by the key's position, with and without break.
pub fn list(r: &mut Run) -> Result<()> {
    r.line("\nFig. 13: list traversal (8 nodes) by the key's position (p50 / p99, µs)".into());
    let n = r.n(60, 600);
    let (mut app, _) = r.app(BUCKETS, 64, false)?;
    let keys: Vec<u64> = (1..=8u64).map(|i| 0x3_0000 + i).collect();
    let words: Vec<String> = keys.iter().map(u64::to_string).collect();
    app.ask(&format!("list {}", words.join(" ")))?;
    let floor = r.floor(&mut app, 64, n)?;
    let plain = Run::install(&mut app, "list-find")?;
    let brk = Run::install(&mut app, "list-find-break")?;
    let mut a = r.remote(&plain, Duration::from_secs(5))?;
    let mut b = r.remote(&brk, Duration::from_secs(5))?;
    r.line(format!(
        "   {:>8} {:>19} {:>19}",
        "position", "list-find", "list-find-break"
    ));
    let mut rows = Vec::new();
    for (pos, &key) in keys.iter().enumerate() {
        let key = [(key, LIST_VALUE_LEN)];
        let sa = stats(&r.time_gets(&mut Finder(&mut a), &key, n)?);
        let sb = stats(&r.time_gets(&mut Finder(&mut b), &key, n)?);
        r.line(format!(
            "   {:>8} {:>9} {:>9} {:>9} {:>9}",
            pos + 1,
            us(sa.median),
            us(sa.p99),
            us(sb.median),
            us(sb.p99)
        ));
        rows.push((pos as f64 + 1.0, sa, sb));
    }
    if let Some(first) = rows.first() {
        let against = [
            ("list-find, key 1st", first.1.median),
            ("list-find-break, key 1st", first.2.median),
        ];
        r.floor_line(floor, &against);
    }
    r.line("   list-find walks all 8 nodes whatever the position; with break the walk stops at the match (one instance a trigger: its hello is untimed)".into());
    let pts = |f: &dyn Fn(&(f64, Stats, Stats)) -> f64| -> Vec<(f64, f64)> {
        rows.iter().map(|row| (row.0, f(row) / 1e3)).collect()
    };
    let fig = Figure {
        title: "List traversal by key position (Fig. 13)".into(),
        x_label: "position of the key in the list".into(),
        y_label: "latency (µs; solid: p50, dashed: p99)".into(),
        x_axis: XAxis::Linear,
        y_log: true,
        legend_lower_right: false,
        series: vec![
            Series::solid("list-find", 0, pts(&|x| x.1.median)),
            Series::dashed("", 0, pts(&|x| x.1.p99)),
            Series::solid("list-find-break", 1, pts(&|x| x.2.median)),
            Series::dashed("", 1, pts(&|x| x.2.p99)),
            Series::dashed("UDP floor p50", 7, pts(&|_| floor.median)),
        ],
    };
    r.plot("list.svg", &fig)
}

/// A remote client of list-find: its "GET" is a find; one trigger each.
struct Finder<'a>(&'a mut RemoteClient);

impl Getter for Finder<'_> {
    fn prepare(&mut self) -> Result<()> {
        fresh_session(self.0, 1)
    }
    fn get(&mut self, key: u64) -> Result<Option<Vec<u8>>> {
        Ok(self.0.find(key)?)
    }
}

/// Fig. 15: a reader's GETs while writer processes SET through the app.
pub fn contention(r: &mut Run) -> Result<()> {
    r.line("\nFig. 15: contention: one reader's GETs while W writer processes SET through the app (p50/p99, µs)".into());
    let n = r.n(300, 3000);
    let counts: Vec<usize> = if r.o.quick {
        vec![0, 4, 16]
    } else {
        vec![0, 1, 2, 4, 8, 16]
    };
    let (mut app, sock) = r.app(BUCKETS, 64, true)?;
    let keys = pick_keys(20, BUCKETS, 0x4_0000);
    let (readers, writers) = keys.split_at(4);
    for &k in &keys {
        app.ask(&format!("set {k} 64 0"))?;
    }
    let floor = r.floor(&mut app, 64, n)?;
    let off = Run::install(&mut app, "server-loop")?;
    let mut c = r.remote(&off, Duration::from_secs(5))?;
    let (_, rpc_addr) = baselines(&mut app)?;
    let mut rpc = RpcClient::connect(rpc_addr, baseline_options(Duration::from_secs(5)))?;
    let reader_keys: Vec<(u64, usize)> = readers.iter().map(|&k| (k, 64)).collect();
    r.line(format!(
        "   {:>8} {:>19} {:>19} {:>12}",
        "writers", "RedN server-loop", "two-sided RPC", "SETs/s"
    ));
    let mut rows = Vec::new();
    for &w in &counts {
        let mut procs = Vec::with_capacity(w);
        for i in 0..w {
            let k = writers[i % writers.len()];
            let mut p = Peer::start(
                "writer",
                &[
                    "--app".into(),
                    sock.display().to_string(),
                    "--keys".into(),
                    k.to_string(),
                    "--len".into(),
                    "64".into(),
                ],
            )?;
            if p.hear()? != "ready" {
                bail!("writer {i} did not start");
            }
            procs.push(p);
        }
        let sets0 = sets(&mut app)?;
        let t = Instant::now();
        let redn = stats(&r.time_gets(
            &mut Offloaded {
                c: &mut c,
                triggers: 1,
            },
            &reader_keys,
            n,
        )?);
        let two = stats(&r.time_gets(&mut rpc, &reader_keys, n)?);
        let rate = (sets(&mut app)? - sets0) as f64 / t.elapsed().as_secs_f64();
        for mut p in procs {
            p.kill();
        }
        r.line(format!(
            "   {:>8} {:>19} {:>19} {:>12.0}",
            w,
            pair(redn),
            pair(two),
            rate
        ));
        rows.push((w as f64, [redn, two]));
    }
    app.ask("stop-baselines")?;
    if let Some(first) = rows.first() {
        let against = [
            ("RedN, no writers", first.1[0].median),
            ("two-sided, no writers", first.1[1].median),
        ];
        r.floor_line(floor, &against);
    }
    if let (Some(first), Some(last)) = (rows.first(), rows.last()) {
        for (i, name) in ["RedN", "two-sided"].into_iter().enumerate() {
            let what = format!("{name} reader p99 with {} writers / uncontended", last.0);
            target(r, &what, last.1[i].p99 / first.1[i].p99, 2.0);
        }
    }
    let mut series = Vec::new();
    for (i, (name, colour)) in [("RedN server-loop", 0), ("two-sided RPC", 3)]
        .into_iter()
        .enumerate()
    {
        let p50 = rows.iter().map(|x| (x.0, x.1[i].median / 1e3)).collect();
        let p99 = rows.iter().map(|x| (x.0, x.1[i].p99 / 1e3)).collect();
        series.push(Series::solid(name, colour, p50));
        series.push(Series::dashed("", colour, p99));
    }
    let flat = rows.iter().map(|x| (x.0, floor.median / 1e3)).collect();
    series.push(Series::dashed("UDP floor p50", 7, flat));
    let fig = Figure {
        title: "Reader latency under writer contention (Fig. 15)".into(),
        x_label: "writer processes".into(),
        y_label: "GET latency (µs; solid: p50, dashed: p99)".into(),
        x_axis: XAxis::Linear,
        y_log: true,
        legend_lower_right: false,
        series,
    };
    r.plot("contention.svg", &fig)
}

fn sets(app: &mut Peer) -> Result<u64> {
    let line = app.ask("sets")?;
    line.strip_prefix("sets ")
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| anyhow!("the app said {line:?} to sets"))
}

/// What one GET of a timeline came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    /// The right value.
    Right,
    /// A value, but not the right one (or a miss).
    Wrong,
    /// An error (a timeout, a failed completion, a refused connection).
    Failed,
}

/// GETs of `key` (64 B) as fast as they go until `until`: when each ended, and how.
fn hammer(g: &mut (dyn Getter + Send), key: u64, until: Instant) -> Vec<(Instant, Outcome)> {
    let want = value_bytes(key, 64);
    let mut out = Vec::new();
    while Instant::now() < until {
        let o = match g.get(key) {
            Ok(Some(v)) if v == want => Outcome::Right,
            Ok(_) => Outcome::Wrong,
            Err(_) => Outcome::Failed,
        };
        out.push((Instant::now(), o));
    }
    out
}

/// A timeline as (ms from `kill`, succeeded); its right and wrong answers counted.
fn relative(r: &mut Run, t: &[(Instant, Outcome)], kill: Instant) -> Vec<(f64, bool)> {
    for &(_, o) in t {
        if o != Outcome::Failed {
            r.checked += 1;
        }
        if o == Outcome::Wrong {
            r.wrong += 1;
        }
    }
    t.iter()
        .map(|&(at, o)| {
            let ms = if at >= kill {
                (at - kill).as_secs_f64() * 1e3
            } else {
                -((kill - at).as_secs_f64() * 1e3)
            };
            (ms, o == Outcome::Right)
        })
        .collect()
}

/// One crash: a fresh app serving key 64 B by `how`, a reader GETting it as fast as it
/// goes for `span`, the app SIGKILLed halfway; the reader's GETs as (ms from the kill,
/// succeeded).
fn one_crash(r: &mut Run, redn: bool, span: Duration) -> Result<Vec<(f64, bool)>> {
    let (mut app, _) = r.app(BUCKETS, 64, false)?;
    let key = pick_keys(1, BUCKETS, 0x5_0000)[0];
    app.ask(&format!("set {key} 64 0"))?;
    // A slow GET is not a failed one: the timeout is long next to a GET.
    let timeout = Duration::from_millis(500);
    let mut g: Box<dyn Getter + Send> = if redn {
        let off = Run::install(&mut app, "server-loop")?;
        Box::new(OwnedOffloaded(r.remote(&off, timeout)?))
    } else {
        let (_, rpc_addr) = baselines(&mut app)?;
        Box::new(RpcClient::connect(rpc_addr, baseline_options(timeout))?)
    };
    let start = Instant::now();
    let (until, kill_at) = (start + span, start + span / 2);
    let (t, kill) = std::thread::scope(|s| {
        let reader = s.spawn(|| hammer(g.as_mut(), key, until));
        // The schedule of the experiment, not a synchronisation: the reader runs to `until`.
        std::thread::sleep(kill_at.saturating_duration_since(Instant::now()));
        app.kill();
        let kill = Instant::now();
        (reader.join(), kill)
    });
    let t = t.map_err(|_| anyhow!("the reader panicked"))?;
    Ok(relative(r, &t, kill))
}

/// A remote client of a recycled offload (one trigger a GET), owned.
struct OwnedOffloaded(RemoteClient);

impl Getter for OwnedOffloaded {
    fn get(&mut self, key: u64) -> Result<Option<Vec<u8>>> {
        Ok(self.0.get(key)?)
    }
}

/// Fig. 16: GETs per ms around a SIGKILL of the app.
pub fn crash(r: &mut Run) -> Result<()> {
    r.line("\nFig. 16: GETs per ms around a SIGKILL of the app at 0 ms (one app and one reader each; 500 ms GET timeout)".into());
    let span = Duration::from_millis(r.n(400, 2000) as u64);
    let (mut app, _) = r.app(BUCKETS, 64, false)?;
    let floor = r.floor(&mut app, 64, r.n(500, 2000))?;
    drop(app);
    r.line(format!(
        "   {:<12} {:>15} {:>12} {:>8} {:>17}",
        "", "GETs/ms before", "after", "failed", "longest gap (ms)"
    ));
    let mut series = Vec::new();
    let mut failed_redn = 0;
    for (name, colour, redn) in [("RedN server-loop", 0, true), ("two-sided RPC", 3, false)] {
        let t = one_crash(r, redn, span)?;
        let failed = t.iter().filter(|x| !x.1).count();
        // GETs that ended past the span (a two-sided GET waiting out its timeout) are
        // counted as failed, not drawn.
        let half = span.as_secs_f64() * 1e3 / 2.0;
        let per_ms: Vec<(f64, f64)> = bins(&t).into_iter().filter(|p| p.0 < half).collect();
        let (before, after): (Vec<_>, Vec<_>) = per_ms.iter().partition(|p| p.0 < 0.0);
        let mean = |v: &[&(f64, f64)]| v.iter().map(|p| p.1).sum::<f64>() / v.len().max(1) as f64;
        r.line(format!(
            "   {:<12} {:>15.1} {:>12.1} {:>8} {:>17.2}",
            name.split(' ').next().unwrap_or(name),
            mean(&before),
            mean(&after),
            failed,
            longest_gap(&t, half)
        ));
        if redn {
            failed_redn = failed;
        }
        series.push(Series::solid(name, colour, per_ms));
    }
    r.floor_line(floor, &[]);
    r.line(format!(
        "   target: zero failed RedN GETs across the app's crash: {failed_redn} failed, {}",
        verdict(failed_redn == 0)
    ));
    let fig = Figure {
        title: "GETs per ms around a SIGKILL of the app at 0 ms (Fig. 16)".into(),
        x_label: "time since the kill (ms)".into(),
        y_label: "GETs completed per ms".into(),
        x_axis: XAxis::Linear,
        y_log: false,
        legend_lower_right: false,
        series,
    };
    r.plot("crash.svg", &fig)
}

/// Width of a timeline's bins: one scheduler hiccup on a loaded two-core machine stalls a
/// reader for a few ms, which 1-ms bins draw as a comb.
const BIN_MS: f64 = 5.0;

/// Successful GETs per ms, averaged over bins of [`BIN_MS`] (each at its start).
fn bins(t: &[(f64, bool)]) -> Vec<(f64, f64)> {
    // Times are within seconds of the kill: whole bins fit an i64.
    #[allow(clippy::cast_possible_truncation)]
    let bin = |ms: f64| (ms / BIN_MS).floor() as i64;
    let (lo, hi) = t
        .iter()
        .fold((0i64, 0i64), |(a, b), p| (a.min(bin(p.0)), b.max(bin(p.0))));
    let mut m: std::collections::BTreeMap<i64, u32> = (lo..=hi).map(|b| (b, 0)).collect();
    for &(at, ok) in t {
        if ok {
            *m.entry(bin(at)).or_default() += 1;
        }
    }
    #[allow(clippy::cast_precision_loss)]
    m.into_iter()
        .map(|(b, n)| (b as f64 * BIN_MS, f64::from(n) / BIN_MS))
        .collect()
}

/// The longest time between two successful GETs, or from the last one to `end`, in ms.
fn longest_gap(t: &[(f64, bool)], end: f64) -> f64 {
    let mut ok: Vec<f64> = t.iter().filter(|x| x.1).map(|x| x.0).collect();
    ok.push(end);
    ok.windows(2).map(|w| w[1] - w[0]).fold(0.0, f64::max)
}

/// The control plane: install, attach and runaway termination latency.
pub fn control(r: &mut Run) -> Result<()> {
    r.line("\nControl plane (µs)".into());
    let (mut app, _) = r.app(BUCKETS, 64, false)?;
    let key = pick_keys(1, BUCKETS, 0x6_0000)[0];
    app.ask(&format!("set {key} 64 0"))?;
    let floor = r.floor(&mut app, 64, r.n(500, 2000))?;
    r.line(format!("   {:<52} {:>9} {:>9}", "", "p50", "p99"));
    let mut series = Vec::new();
    for (colour, name) in ["hash-get", "list-find"].into_iter().enumerate() {
        let line = app.ask(&format!("bench-install {name} {}", r.n(20, 200)))?;
        let v: Vec<f64> = line
            .strip_prefix("samples ")
            .ok_or_else(|| anyhow!("the app said {line:?}"))?
            .split_whitespace()
            .map(|s| s.parse::<f64>().map(|x| x * 1e3))
            .collect::<Result<_, _>>()?;
        let s = stats(&v);
        r.line(format!(
            "   {:<52} {:>9} {:>9}",
            format!("InstallOffload {name} (app -> manager -> NIC)"),
            us(s.median),
            us(s.p99)
        ));
        series.push(Series::solid(&format!("install {name}"), colour, cdf(&v)));
    }
    let off = Run::install(&mut app, "hash-get")?;
    let mut v = Vec::new();
    let mut clients = Vec::new();
    for _ in 0..r.n(5, 30) {
        let t = Instant::now();
        let c = r.remote(&off, Duration::from_secs(5))?;
        v.push(ns(t.elapsed()));
        clients.push(c);
    }
    let s = stats(&v);
    r.line(format!(
        "   {:<52} {:>9} {:>9}",
        "remote attach: new client (softnic, hello, instance)",
        us(s.median),
        us(s.p99)
    ));
    series.push(Series::solid("remote attach: new client", 2, cdf(&v)));
    drop(clients);
    let mut c = r.remote(&off, Duration::from_secs(5))?;
    let mut v = Vec::new();
    // Hellos back to back, no trigger between them (each closed session's flushed receives
    // must not pile up on the client's CQ); then a GET on the last instance.
    for _ in 0..r.n(20, 200) {
        let t = Instant::now();
        c.reconnect()?;
        v.push(ns(t.elapsed()));
    }
    let got = c.get(key)?;
    r.check(key, 64, got.as_deref());
    let s = stats(&v);
    r.line(format!(
        "   {:<52} {:>9} {:>9}",
        "remote attach: hello for a fresh instance",
        us(s.median),
        us(s.p99)
    ));
    series.push(Series::solid("remote attach: hello", 3, cdf(&v)));
    drop(app);
    let (v, gets) = runaways(r)?;
    let s = stats(&v);
    r.line(format!(
        "   {:<52} {:>9} {:>9}",
        "runaway: first trigger -> terminate record",
        us(s.median),
        us(s.p99)
    ));
    r.line(format!(
        "   {:<52} {:>9.0}",
        "   (GETs it was served first: server-loop 56 WQEs a round, budget 50)",
        stats(&gets).median
    ));
    series.push(Series::solid("runaway termination", 4, cdf(&v)));
    r.floor_line(floor, &[]);
    let fig = Figure {
        title: "Control plane latency (CDF)".into(),
        x_label: "latency (µs, log scale)".into(),
        y_label: "fraction of samples".into(),
        x_axis: XAxis::Log10,
        y_log: false,
        legend_lower_right: true,
        series,
    };
    r.plot("control.svg", &fig)
}

/// `v` (ns) as a CDF in µs.
fn cdf(v: &[f64]) -> Vec<(f64, f64)> {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len().max(1) as f64;
    s.iter()
        .enumerate()
        .map(|(i, x)| (x / 1e3, (i + 1) as f64 / n))
        .collect()
}

/// Runaway remote clients on a manager whose budget server-loop breaks (50 WQEs a trigger
/// against its 56 a round): from each one's first GET to the manager's
/// `event=terminate` audit record, in ns.
fn runaways(r: &mut Run) -> Result<(Vec<f64>, Vec<f64>)> {
    let dir = r.dir.join("runaway");
    let m = ManagerProc::start(&r.binary, &dir, r.o.pus, &crate::procs::policy(50))?;
    let mut app = Peer::start(
        "app",
        &[
            "--socket".into(),
            m.api.display().to_string(),
            "--buckets".into(),
            BUCKETS.to_string(),
            "--slot".into(),
            "64".into(),
        ],
    )?;
    let key = pick_keys(1, BUCKETS, 0x7_0000)[0];
    app.ask(&format!("set {key} 64 0"))?;
    let off = Run::install(&mut app, "server-loop")?;
    let (mut v, mut gets) = (Vec::new(), Vec::new());
    for _ in 0..r.n(3, 10) {
        m.drain_audit();
        let mut c = RemoteClient::connect(
            m.dataplane,
            off.handle,
            &off.token,
            RemoteOptions {
                timeout: Duration::from_millis(200),
            },
        )?;
        let first = Instant::now();
        let mut served = 0u32;
        // Until the instance is terminated: its next GET times out or fails.
        while let Ok(got) = c.get(key) {
            r.check(key, 64, got.as_deref());
            served += 1;
            if served > 100_000 {
                bail!("the runaway was never stopped");
            }
        }
        let (at, _) = m.await_record(
            &["event=terminate ", "rule=loop-budget"],
            Duration::from_secs(5),
        )?;
        v.push(ns(at.saturating_duration_since(first)));
        gets.push(f64::from(served));
    }
    Ok((v, gets))
}
