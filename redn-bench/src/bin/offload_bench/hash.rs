//! Section 2: hash GET latency by value size (RedN §5.2): hash-get, hash-get-seq and
//! hash-get-par, with the host polling or asleep, next to one-sided READs and the CPU.

use super::baselines::{native_get, native_samples, read_get};
use super::contents::{fill_table, hkey, hvalue, single_msg, two_msg, READ_AT};
use super::env::{check_responses, trigger, Env, HostWait, Slot};
use super::Opts;
use redn_bench::native::cross_thread_rtt;
use redn_bench::report::{fmt_ns, print_failed, size_name, us, verdict};
use redn_bench::stats::{stats, Stats};
use redn_bench::Ctx;
use redn_program::program::catalog::{self, HashVariant};
use redn_program::program::QueueRole;
use redn_sys::mem::SharedBuffer;

const PAR_TARGET_RATIO: f64 = 1.2;
const SIZES: [usize; 5] = [64, 1024, 4096, 16384, 65536];

pub(crate) fn hash_section(env: &Env, o: &Opts, anomalies: &mut Vec<String>) -> Result<(), String> {
    println!();
    println!("== 2. Hash GET latency by value size (RedN §5.2) ==");
    let n: u32 = 128;
    let blocks = o.reps.max(2);
    let per_block = o.samples.div_ceil(blocks);
    let warm = 20;
    println!(
        "   {} samples per row in {blocks} interleaved blocks (+{warm} warm-up each); µs from the \
         client's doorbell to the last",
        per_block * blocks
    );
    println!(
        "   response (PUs woken before each sample). Programs installed with {n} invocations, \
         reinstalled when used up"
    );
    println!("   (not timed). Buckets rotate over 4 pairs.");
    println!(
        "   Threads that must run for one GET: the host, the client's PU and server PU 0 (hash-get-par: and PU 1),"
    );
    println!(
        "   on {} cores; for the READ baselines only the host and the client's PU.",
        o.common.cores
    );
    // The offload rows: (variant, the client-facing queue moved to PU 1, how the host waits).
    // The first four poll; the last three repeat hash-get, hash-get-par and hash-get-seq with
    // a host that sleeps on a completion channel, so that on 2 cores the two server PUs can
    // have both (the comparison: the host asleep on both sides).
    let offloads = [
        (
            HashVariant::Single,
            false,
            HostWait::Poll,
            "offload hash-get, 1 bucket (hit)",
        ),
        (
            HashVariant::Sequential,
            false,
            HostWait::Poll,
            "offload hash-get-seq, key in 2nd bucket",
        ),
        (
            HashVariant::Parallel,
            false,
            HostWait::Poll,
            "offload hash-get-par, key in 2nd bucket",
        ),
        (
            HashVariant::Parallel,
            true,
            HostWait::Poll,
            "  same, client queue on the join's PU 1",
        ),
        (
            HashVariant::Single,
            false,
            HostWait::Channel,
            "hash-get, host sleeps on a compl. channel",
        ),
        (
            HashVariant::Parallel,
            false,
            HostWait::Channel,
            "hash-get-par, host sleeps on a compl. chan.",
        ),
        (
            HashVariant::Sequential,
            false,
            HostWait::Channel,
            "hash-get-seq, host sleeps on a compl. chan.",
        ),
    ];
    let mut slots = Vec::new();
    for (v, moved, _, _) in offloads {
        let mut p = catalog::hash_get(v, n).map_err(|e| format!("hash_get {v:?}: {e}"))?;
        if moved {
            for q in &mut p.queues {
                if q.role == QueueRole::Client {
                    q.pu = Some(1);
                }
            }
        }
        slots.push(Slot::new(p, (2 * n).next_power_of_two()));
    }
    let no = offloads.len();
    let mut names: Vec<&str> = offloads.iter().map(|x| x.3).collect();
    names.extend([
        "2 one-sided READs (bucket, value)",
        "3 one-sided READs (2 buckets, value)",
        "native CPU, 1 bucket",
        "native CPU, 2 buckets (key in 2nd)",
    ]);
    let dst = SharedBuffer::new(64 << 10);
    let base = env.data.mr.addr.0;
    let mut rd = env.reader.borrow_mut();
    println!();
    println!(
        "   {:<7} {:<44} {:>9} {:>9} {:>11}",
        "value", "lookup", "p50 µs", "p99 µs", "p50 ÷ 1-bkt"
    );
    let mut ratios = Vec::new();
    // The floor under every hand-off between PUs, right before and after the table.
    let floor_samples = if o.common.quick { 2000 } else { 20000 };
    let floor_before = cross_thread_rtt(floor_samples).median;
    for &size in &SIZES {
        let size32 = u32::try_from(size).ctx("value size")?;
        fill_table(env, size);
        let mut lat: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
        let mut failed: Vec<Option<String>> = vec![None; names.len()];
        for _block in 0..blocks {
            for (vi, (v, _, how, _)) in offloads.iter().enumerate() {
                if failed[vi].is_some() {
                    continue;
                }
                let r = (|| -> Result<(), String> {
                    let mut s = 0;
                    while s < per_block + warm {
                        let inst = slots[vi].get(env, 1)?;
                        let pair = (s % 4) as u64;
                        let k = u32::try_from(inst.served).ctx("invocation number")?;
                        let (msg, resp, lens, key_b) = match v {
                            HashVariant::Single => (
                                single_msg(env, hkey(2 * pair), 2 * pair),
                                1,
                                vec![size32],
                                2 * pair,
                            ),
                            _ => (
                                two_msg(env, hkey(2 * pair + 1), 2 * pair, 2 * pair + 1),
                                2,
                                vec![0, size32],
                                2 * pair + 1,
                            ),
                        };
                        let (t, cqes) = trigger(env, inst, &msg, resp, *how)?;
                        check_responses(&cqes, k, &lens)
                            .map_err(|e| format!("{e} (invocation {k}){}", inst.diag(env)))?;
                        if s == warm || s % 64 == 0 {
                            let got = env.cbuf.read(0, size);
                            if got != hvalue(key_b, size) {
                                return Err(format!(
                                    "wrong value bytes for bucket {key_b} ({size} B)"
                                ));
                            }
                        }
                        if s >= warm {
                            lat[vi].push(*t.last().unwrap_or(&f64::NAN));
                        }
                        s += 1;
                    }
                    Ok(())
                })();
                if let Err(e) = r {
                    failed[vi] = Some(e);
                }
            }
            // READ baselines.
            for (ri, two) in [(no, false), (no + 1, true)] {
                if failed[ri].is_some() {
                    continue;
                }
                let r = (|| -> Result<(), String> {
                    for s in 0..per_block + warm {
                        let pair = (s % 4) as u64;
                        let (key, bk): (u64, Vec<u64>) = if two {
                            (hkey(2 * pair + 1), vec![2 * pair, 2 * pair + 1])
                        } else {
                            (hkey(2 * pair), vec![2 * pair])
                        };
                        let (t, len) = read_get(env, &mut rd, key, &bk)?;
                        if len != size {
                            return Err(format!("READ GET returned {len} bytes, expected {size}"));
                        }
                        if s == warm {
                            let got = env.cbuf.read(READ_AT + 256, size);
                            if got != hvalue(*bk.last().unwrap_or(&0), size) {
                                return Err("READ GET: wrong value bytes".into());
                            }
                        }
                        if s >= warm {
                            lat[ri].push(t);
                        }
                    }
                    Ok(())
                })();
                if let Err(e) = r {
                    failed[ri] = Some(e);
                }
            }
            // Native.
            let mut s = 0u64;
            lat[no + 2].extend(native_samples(per_block, size, || {
                s += 1;
                let pair = s % 4;
                native_get(&env.data.buf, base, &dst, hkey(2 * pair), &[2 * pair])
            }));
            lat[no + 3].extend(native_samples(per_block, size, || {
                s += 1;
                let pair = s % 4;
                native_get(
                    &env.data.buf,
                    base,
                    &dst,
                    hkey(2 * pair + 1),
                    &[2 * pair, 2 * pair + 1],
                )
            }));
        }
        let st: Vec<Stats> = lat.iter().map(|v| stats(v)).collect();
        let single = st[0].median;
        for (i, name) in names.iter().enumerate() {
            let label = if i == 0 {
                size_name(size)
            } else {
                String::new()
            };
            match &failed[i] {
                Some(e) => {
                    print_failed(&format!("{label:<7} {name:<44}"));
                    anomalies.push(format!("hash GET {}, {size} B: {e}", name.trim()));
                }
                None => println!(
                    "   {:<7} {:<44} {:>9} {:>9} {:>10.2}×",
                    label,
                    name,
                    us(st[i].median),
                    us(st[i].p99),
                    st[i].median / single
                ),
            }
        }
        if failed[0].is_none() && failed[2].is_none() {
            // (par ÷ one-bucket, par ÷ seq), all three with the host asleep.
            let sleeping = (failed[4].is_none() && failed[5].is_none() && failed[6].is_none())
                .then(|| (st[5].median / st[4].median, st[5].median / st[6].median));
            ratios.push((
                size,
                st[2].median / single,
                st[1].median / single,
                st[3].median / single,
                sleeping,
            ));
        }
    }
    let floor_after = cross_thread_rtt(floor_samples).median;
    for s in &mut slots {
        s.clear(env)?;
    }
    println!();
    println!(
        "   floor: cross-thread round trip through a shared word, right before / after the \
         table: {} / {} ns (a GET crosses PUs at least twice)",
        fmt_ns(floor_before),
        fmt_ns(floor_after)
    );
    println!(
        "   installs (not timed): {}",
        slots
            .iter()
            .zip(&offloads)
            .map(|(s, o)| format!(
                "{} × {}{}",
                s.installs,
                s.program.name,
                if o.1 { " (moved)" } else { "" }
            ))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "   target: parallel two-bucket GET (collision) within {PAR_TARGET_RATIO}× of a one-bucket GET \
         (p50, catalog layout):"
    );
    for (size, par, seq, moved, sleeping) in &ratios {
        println!(
            "     {:>6}: par {:.2}×: {}   (seq {:.2}×; par with the client queue on PU 1 {:.2}×)",
            size_name(*size),
            par,
            verdict(*par <= PAR_TARGET_RATIO),
            seq,
            moved
        );
        if let Some((r, vs_seq)) = sleeping {
            println!(
                "             host sleeping on a completion channel: par {r:.2}× the 1-bucket GET \
                 with the same host: {}; par {vs_seq:.2}× seq (target ≤ 1): {}",
                verdict(*r <= PAR_TARGET_RATIO),
                verdict(*vs_seq <= 1.0)
            );
        }
    }
    if ratios.is_empty() {
        println!("     not measured: NOT MET");
    }
    Ok(())
}
