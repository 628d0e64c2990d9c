//! verify_bench: how long the offload verifier takes, per shipped offload and for a
//! 4,096-WQE program (install latency is part of the manager's control plane).
//!
//! Beside each row, in the same run: rendering the same program (layout, code windows,
//! resolving and encoding every WQE: the pure work an install does anyway), so that the
//! verifier's cost reads against work of the same kind.

use redn_bench::opts::{parse_in, read_command_line};
use redn_bench::report::verdict;
use redn_bench::stats::{ns, stats};
use redn_policy::{shipped_offloads, verify, Grants};
use redn_program::program::catalog::{self, HashVariant};
use redn_program::program::{Program, Resolver};
use redn_program::Access;
use std::hint::black_box;
use std::time::Instant;

const USAGE: &str = "\
verify_bench: the offload verifier's time per program, next to rendering the same program

USAGE:
    cargo run --release -p redn-bench --bin verify_bench -- [--quick] [--runs N] [--only NAME]

OPTIONS:
    --quick     20 runs a row instead of 200
    --runs N    runs a row (1..=100000)
    --only NAME the rows whose program name starts with NAME (for a profiler)
    -h, --help  this text

Targets (issue 17): every shipped offload verified in at most 1 ms, a 4,096-WQE program in at
most 50 ms (p50, one thread).
";

/// What a client of the catalog is granted, generous enough that every row is accepted.
fn grants() -> Grants {
    let mut g = Grants::new()
        .with_region("table", Access::REMOTE_READ, 1 << 30)
        .with_region("list", Access::REMOTE_READ, 1 << 30)
        .with_region("values", Access::NONE, 1 << 30)
        .with_region("response", Access::REMOTE_WRITE, 1 << 20);
    g.loop_budget = Some(1_000_000);
    g.max_wqes_per_invocation = 256;
    g.max_code_bytes = 1 << 30;
    g
}

/// Render `p` with stand-in numbers: layout, windows, resolution and encoding.
fn render(p: &Program) -> usize {
    let layout = p.layout().expect("layout");
    let r = Resolver::stand_in(p, layout).expect("windows");
    p.render(&r).expect("render").code.len()
}

/// Median and p99 of `runs` timings of `f`, in µs.
fn time(runs: usize, mut f: impl FnMut()) -> (f64, f64) {
    let mut v = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t = Instant::now();
        f();
        v.push(ns(t.elapsed()) / 1000.0);
    }
    let s = stats(&v);
    (s.median, s.p99)
}

fn main() {
    let mut runs = 200usize;
    let mut only = String::new();
    read_command_line("verify_bench", USAGE, &mut |name, value| {
        match name {
            "--quick" => runs = 20,
            "--only" => only = value().ok_or("--only needs a program name")?,
            "--runs" => {
                runs = usize::try_from(parse_in("--runs", value(), 1..=100_000)?)
                    .map_err(|e| e.to_string())?;
            }
            _ => return Ok(false),
        }
        Ok(true)
    });
    let g = grants();
    let mut rows: Vec<(String, Program, f64)> = shipped_offloads()
        .expect("the catalog builds")
        .into_iter()
        .map(|s| (s.program.name.clone(), s.program, 1000.0))
        .collect();
    // Eight WQEs an invocation: 512 invocations of hash-get make 4,096.
    let big = catalog::hash_get(HashVariant::Single, 512).expect("hash-get 512");
    rows.push((
        format!("hash-get x512 ({} WQEs)", big.wqe_count()),
        big,
        50_000.0,
    ));
    println!("verify_bench: {runs} runs a row, one thread; times in µs");
    println!(
        "{:<28} {:>6} {:>10} {:>10} {:>12} {:>8} {:>16}",
        "program", "WQEs", "verify p50", "verify p99", "render p50", "ratio", "target"
    );
    let mut all_met = true;
    for (name, p, target_us) in rows.iter().filter(|(n, ..)| n.starts_with(&only)) {
        let report = verify(p, &g);
        assert!(report.accepted(), "{name} refused:\n{}", report.log());
        let (v50, v99) = time(runs, || {
            let _ = black_box(verify(black_box(p), &g));
        });
        let (r50, _) = time(runs, || {
            black_box(render(black_box(p)));
        });
        let met = v50 <= *target_us;
        all_met &= met;
        println!(
            "{name:<28} {:>6} {v50:>10.1} {v99:>10.1} {r50:>12.1} {:>7.1}x {:>16}",
            p.wqe_count(),
            v50 / r50,
            format!("{} <= {target_us:.0}", verdict(met)),
        );
    }
    println!(
        "\nratio: verify p50 / render p50 (layout, code windows, resolution, encoding of the \
         same program).\n{}",
        if all_met {
            "every target met"
        } else {
            "some target NOT met"
        }
    );
}
