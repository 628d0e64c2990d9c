//! Figs. 15 and 16 and the control plane: readers beside writers, the app's crash, and the
//! manager's install, attach and termination latencies.

use super::*;
use crate::app::{pick_keys, value_bytes};
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
                ..Default::default()
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
