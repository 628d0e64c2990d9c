//! Figs. 10, 11 and 13: a GET's latency by value size, with collisions, and a list walk.

use super::*;
use crate::app::{pick_keys, LIST_VALUE_LEN};
use crate::procs::DEADLINE;
use redn_bench::report::size_name;
use redn_client::baseline::Probe;
use redn_client::kv::{bucket_indices, BUCKET_STRIDE};
use redn_program::program::catalog::trigger_key;
use redn_proto::api;
use redn_proto::client::Connection;
use redn_sys::softnic::completion_clock_ns;
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
