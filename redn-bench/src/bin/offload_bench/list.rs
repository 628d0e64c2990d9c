//! Section 3: linked-list find latency by position (RedN §5.3), with and without `break`, and
//! the WQEs each lookup executes, next to READ pointer chasing and the CPU.

use super::baselines::{native_find, native_samples, read_find};
use super::contents::{fill_list, list_msg, lkey, lvalue, LIST_STEPS, LIST_VALUE};
use super::env::{check_responses, install, remove, trigger, Env, HostWait, Slot};
use super::Opts;
use redn_bench::report::us;
use redn_bench::stats::{stats, Stats};
use redn_bench::Ctx;
use redn_program::program::catalog;
use redn_program::program::QueueRole;
use redn_sys::mem::SharedBuffer;
use std::time::Duration;

/// The list-find latency series.
#[derive(Clone, Copy, PartialEq, Eq)]
enum LSeries {
    /// No break, one installation serving many lookups.
    Warm,
    /// No break, client-facing queue moved to PU 1, many lookups per installation.
    Moved,
    /// No break, a fresh installation per lookup.
    Fresh,
    /// Break (a fresh installation per lookup, as it must).
    Break,
}

pub(crate) fn list_section(env: &Env, o: &Opts, anomalies: &mut Vec<String>) -> Result<(), String> {
    println!();
    println!("== 3. List find latency by position (RedN §5.3) ==");
    let n: u32 = 16;
    let blocks = o.reps.max(2);
    let per_block = (o.samples / 2).div_ceil(blocks);
    let fresh_per_block = (o.samples / 4).div_ceil(blocks).max(1);
    let warm = 10;
    let head = fill_list(env);
    let base = env.data.mr.addr.0;
    let dst = SharedBuffer::new(4096);
    println!(
        "   a list of {LIST_STEPS} nodes ({LIST_VALUE} B values), programs unrolled for {LIST_STEPS} steps; \
         µs from the client's doorbell (PUs woken before each sample)."
    );
    println!(
        "   Samples per position: {} for programs serving {n} lookups per installation and for READs, \
         {} for a fresh",
        per_block * blocks,
        fresh_per_block * blocks
    );
    println!("   installation per lookup (install not timed), in {blocks} interleaved blocks.");
    let nb = catalog::list_find(LIST_STEPS, false, n).map_err(|e| e.to_string())?;
    let mut moved = nb.clone();
    for q in &mut moved.queues {
        if q.role == QueueRole::Client {
            q.pu = Some(1);
        }
    }
    let nb1 = catalog::list_find(LIST_STEPS, false, 1).map_err(|e| e.to_string())?;
    let brk = catalog::list_find(LIST_STEPS, true, 1).map_err(|e| e.to_string())?;
    let ring = (2 * n).next_power_of_two();
    let mut slots = [Slot::new(nb, ring), Slot::new(moved, ring)];
    let mut rd = env.reader.borrow_mut();
    let positions = LIST_STEPS as usize + 1; // 1..8, then absent
    let key_at = |pos: usize| {
        if pos < LIST_STEPS as usize {
            lkey(pos as u64)
        } else {
            0xdead
        }
    };
    // Per position: [warm value, warm end, moved value, moved end, fresh end, break, READs, native]
    let mut lat: Vec<Vec<Vec<f64>>> = vec![vec![Vec::new(); 8]; positions];
    let series = [
        LSeries::Warm,
        LSeries::Moved,
        LSeries::Fresh,
        LSeries::Break,
    ];
    let mut failed: Vec<Option<String>> = vec![None; 6];
    for block in 0..blocks {
        // Positions in a rotated order, so no position is always first in a block.
        for i in 0..positions {
            let pos = (block * 2 + i) % positions;
            let lp = &mut lat[pos];
            let key = key_at(pos);
            let found = pos < LIST_STEPS as usize;
            for (si, &ser) in series.iter().enumerate() {
                if failed[si].is_some() {
                    continue;
                }
                let with_break = ser == LSeries::Break;
                let msg = list_msg(head, key, with_break);
                let fresh = matches!(ser, LSeries::Fresh | LSeries::Break);
                let count = if fresh {
                    fresh_per_block + 2
                } else {
                    per_block + warm
                };
                let skip = if fresh { 2 } else { warm };
                let r = (|| -> Result<(), String> {
                    for s in 0..count {
                        let mut fresh_inst = None;
                        let inst = match ser {
                            LSeries::Warm => slots[0].get(env, 1)?,
                            LSeries::Moved => slots[1].get(env, 1)?,
                            LSeries::Fresh | LSeries::Break => {
                                let p = if with_break { &brk } else { &nb1 };
                                let i = fresh_inst.insert(install(env, p, 0, 16, 16, 0)?);
                                std::thread::sleep(Duration::from_micros(20));
                                i
                            }
                        };
                        let k = u32::try_from(inst.served).ctx("invocation number")?;
                        let resp = if found && !with_break { 2 } else { 1 };
                        let res =
                            trigger(env, inst, &msg, resp, HostWait::Poll).and_then(|(t, cqes)| {
                                let lens: Vec<u32> = match (found, with_break) {
                                    (true, false) => vec![LIST_VALUE, 0],
                                    (true, true) => vec![LIST_VALUE],
                                    (false, _) => vec![0],
                                };
                                check_responses(&cqes, k, &lens).map_err(|e| {
                                    format!("position {}: {e}{}", pos + 1, inst.diag(env))
                                })?;
                                if found && cqes[0].byte_len == 0 {
                                    return Err(format!(
                                        "position {}: end marker before the value",
                                        pos + 1
                                    ));
                                }
                                if found
                                    && s == skip
                                    && env.cbuf.read(0, LIST_VALUE as usize) != lvalue(pos as u64)
                                {
                                    return Err(format!("position {}: wrong value bytes", pos + 1));
                                }
                                Ok(t)
                            });
                        if let Some(i) = fresh_inst {
                            remove(env, i)?;
                        }
                        let t = res?;
                        if s < skip {
                            continue;
                        }
                        let last = *t.last().unwrap_or(&f64::NAN);
                        match ser {
                            LSeries::Warm | LSeries::Moved => {
                                let at = if ser == LSeries::Warm { 0 } else { 2 };
                                if found {
                                    lp[at].push(t[0]);
                                }
                                lp[at + 1].push(last);
                            }
                            LSeries::Fresh => lp[4].push(last),
                            LSeries::Break => lp[5].push(last),
                        }
                    }
                    Ok(())
                })();
                if let Err(e) = r {
                    failed[si] = Some(e);
                }
            }
            // One-sided READs.
            if failed[4].is_none() {
                let r = (|| -> Result<(), String> {
                    for s in 0..per_block + warm {
                        let (t, len) = read_find(env, &mut rd, head, key)?;
                        let want = if found { LIST_VALUE as usize } else { 0 };
                        if len != want {
                            return Err(format!(
                                "READ find, position {}: {len} bytes, expected {want}",
                                pos + 1
                            ));
                        }
                        if s >= warm {
                            lp[6].push(t);
                        }
                    }
                    Ok(())
                })();
                if let Err(e) = r {
                    failed[4] = Some(e);
                }
            }
            lp[7].extend(native_samples(per_block, 64 * (pos + 1), || {
                native_find(&env.data.buf, base, &dst, head, key)
            }));
        }
    }
    let installs: Vec<usize> = slots.iter().map(|s| s.installs).collect();
    for s in &mut slots {
        s.clear(env)?;
    }

    // WQEs per lookup, in a pass of its own: counters before, one lookup, counters once the
    // chain has gone quiet.
    let mut wqes: Vec<[f64; 2]> = vec![[f64::NAN; 2]; positions];
    let wres = (|| -> Result<(), String> {
        for (pos, w) in wqes.iter_mut().enumerate() {
            let found = pos < LIST_STEPS as usize;
            for (j, with_break) in [false, true].into_iter().enumerate() {
                let p = if with_break { &brk } else { &nb1 };
                let mut inst = install(env, p, 0, 16, 16, 0)?;
                std::thread::sleep(Duration::from_micros(200));
                let before = inst.wqes(env)?;
                let resp = if found && !with_break { 2 } else { 1 };
                let r = trigger(
                    env,
                    &mut inst,
                    &list_msg(head, key_at(pos), with_break),
                    resp,
                    HostWait::Poll,
                );
                std::thread::sleep(Duration::from_millis(3));
                let after = inst.wqes(env);
                remove(env, inst)?;
                r?;
                w[j] = (after? - before) as f64;
            }
        }
        Ok(())
    })();
    if let Err(e) = wres {
        failed[5] = Some(e);
    }

    println!();
    println!(
        "   {:<9}|{:^29}|{:^19}|{:^9}|{:^19}|{:^9}|{:^9}",
        "", "no break", "break", "no break", "READ chase", "native", "WQEs"
    );
    println!(
        "   {:<9}|{:^29}|{:^19}|{:^9}|{:^19}|{:^9}|{:^9}",
        "", "(warm installation)", "(fresh inst.)", "(fresh)", "", "", "nb / b"
    );
    println!(
        "   {:<9}|{:>9} {:>9} {:>9}|{:>9} {:>9}|{:>9}|{:>9} {:>9}|{:>9}|{:>9}",
        "position",
        "value p50",
        "end p50",
        "end p99",
        "p50",
        "p99",
        "end p50",
        "p50",
        "p99",
        "p50",
        ""
    );
    // A series' figures, or none ("-") where it failed.
    let st = |v: &[f64], failed: bool| {
        if failed {
            Stats::default()
        } else {
            stats(v)
        }
    };
    let wq = |v: f64| {
        if v.is_finite() {
            format!("{v:.0}")
        } else {
            "-".into()
        }
    };
    for (pos, lp) in lat.iter().enumerate() {
        let name = if pos < LIST_STEPS as usize {
            format!("{}", pos + 1)
        } else {
            "absent".into()
        };
        println!(
            "   {:<9}|{:>9} {:>9} {:>9}|{:>9} {:>9}|{:>9}|{:>9} {:>9}|{:>9}|{:>9}",
            name,
            us(st(&lp[0], failed[0].is_some()).median),
            us(st(&lp[1], failed[0].is_some()).median),
            us(st(&lp[1], failed[0].is_some()).p99),
            us(st(&lp[5], failed[3].is_some()).median),
            us(st(&lp[5], failed[3].is_some()).p99),
            us(st(&lp[4], failed[2].is_some()).median),
            us(st(&lp[6], failed[4].is_some()).median),
            us(st(&lp[6], failed[4].is_some()).p99),
            us(stats(&lp[7]).median),
            format!("{}/{}", wq(wqes[pos][0]), wq(wqes[pos][1])),
        );
    }
    println!();
    println!("   no break with the client-facing queue moved to PU 1 (warm installation), p50 µs:");
    let mut line_v = String::new();
    let mut line_e = String::new();
    for lp in &lat {
        line_v += &format!(" {:>7}", us(st(&lp[2], failed[1].is_some()).median));
        line_e += &format!(" {:>7}", us(st(&lp[3], failed[1].is_some()).median));
    }
    println!(
        "   {:<9} {}",
        "position",
        (1..=positions)
            .map(|p| if p <= LIST_STEPS as usize {
                format!("{p:>7}")
            } else {
                format!("{:>7}", "absent")
            })
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!("   {:<9}{line_v}", "value");
    println!("   {:<9}{line_e}", "end");
    let names = [
        "list-find (no break)",
        "list-find, client queue on PU 1",
        "list-find, fresh installations",
        "list-find-break",
        "READ chase",
        "WQE counts",
    ];
    for (i, f) in failed.iter().enumerate() {
        if let Some(e) = f {
            anomalies.push(format!("list find, {}: {e}", names[i]));
        }
    }
    println!();
    println!("   value = doorbell → the matching node's value; end = doorbell → the end marker after all");
    println!("   {LIST_STEPS} steps; break: doorbell → its only response. READ chase: one READ per node visited,");
    println!("   then one for the value. WQEs nb/b: executed on the program's queues per lookup (responses");
    println!("   included), no break / break. native: the CPU walking the same list and copying the value.");
    println!(
        "   installs (not timed): {} × list-find ({n} lookups each), {} × the same with the client queue \
         on PU 1, one per fresh lookup.",
        installs[0], installs[1]
    );
    let w = &wqes;
    if failed[5].is_none() {
        let brk_fewer = (0..LIST_STEPS as usize).all(|p| w[p][1] < w[LIST_STEPS as usize][1])
            && (0..LIST_STEPS as usize - 1).all(|p| w[p][1] < w[p + 1][1]);
        let nb_flat = w.windows(2).all(|x| x[0][0] == x[1][0]);
        println!(
            "   check: break's WQEs grow with the match position and stay below a full traversal: {}; \
             no-break count independent of position: {}",
            if brk_fewer { "yes" } else { "NO" },
            if nb_flat { "yes" } else { "NO" }
        );
        if !brk_fewer || !nb_flat {
            anomalies.push(format!(
                "list find WQE counts unexpected (no break, break): {w:?}"
            ));
        }
    }
    Ok(())
}
