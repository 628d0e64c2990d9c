//! paper_bench: the RedN paper's end-to-end results (§5: Figs. 10, 11, 13, 15, 16 and the
//! control plane), reproduced through the product: the real `redn-manager` binary on the
//! softnic, this program again as the app (a two-choice hash table in a sealed region,
//! offloads installed through the manager) and as writer processes, and remote clients
//! (`redn_client::remote::RemoteClient`) doing GETs over RoCEv2 on loopback. Every GET's
//! value is checked; a wrong one makes the run exit with status 1. Beside every figure,
//! the same run's raw UDP ping-pong between this process and the app's (both
//! busy-polling): the floor any request/response between two processes on this host pays.
//! Tables go to stdout and `OUT/tables.txt`, plots to `OUT/*.svg`.

mod app;
mod figures;
mod procs;

use anyhow::{bail, Result};
use procs::ManagerProc;
use redn_bench::opts::{parse_in, read_command_line};
use std::path::PathBuf;
use std::time::Instant;

const USAGE: &str = "\
paper_bench: the RedN paper's end-to-end figures through the manager, as tables and SVG plots

USAGE:
    cargo build --release -p redn-manager -p redn-bench
    target/release/paper_bench [--quick] [--out DIR] [--only LIST] [--manager PATH] [--pus N]

OPTIONS:
    --quick         a short run (seconds): fewer GETs, sizes and writer counts
    --out DIR       where the SVG plots and tables.txt go (default: paper-results)
    --only LIST     some figures only, comma-separated: get, collisions, list, contention,
                    crash, control (default: all)
    --manager PATH  the redn-manager binary (default: the one beside this program)
    --pus N         the manager's softnic PUs (default 2, 1..=16)
    -h, --help      this text

Figures (each a table, an SVG, and the same run's UDP ping-pong floor):
    get_latency.svg  GET latency by value size, 64 B..64 KiB, p50 and p99 (Fig. 10)
    collisions.svg   key in the first or second bucket, sequential vs parallel (Fig. 11):
                     client round trip; collisions_span.svg: the server-side span from CQE
                     timestamps (io.redn.Admin.TriggerTimes and the response's receive CQE)
    list.svg         list-find by the key's position, with and without break (Fig. 13)
    contention.svg   a reader's p50/p99 while 0..16 writer processes SET (Fig. 15)
    crash.svg        GETs per ms around a SIGKILL of the app (Fig. 16)
    control.svg      install, remote attach and runaway termination latency (CDFs)

Targets (issue 22; p50, 64 B values, same run), printed as verdicts: RedN GET <= 0.6x
one-sided, <= 1.0x two-sided and <= 1.3x the raw UDP ping-pong; parallel two-bucket
server-side span <= 1.2x one-bucket; reader p99 with 16 writers <= 2x uncontended; zero
failed RedN GETs across the app's crash.

ROLES (internal: the program starts itself in them):
    --role app ARGS     the app: --socket PATH --buckets N --slot BYTES [--writers PATH];
                        commands on stdin (see app.rs)
    --role writer ARGS  a writer: --app PATH --keys K,K,... --len BYTES
";

/// The options of a run.
#[derive(Clone, Debug)]
pub struct Options {
    /// `--quick`.
    pub quick: bool,
    /// `--out`.
    pub out: PathBuf,
    /// `--only` (empty: all).
    pub only: Vec<String>,
    /// `--manager`.
    pub manager: Option<PathBuf>,
    /// `--pus`.
    pub pus: usize,
}

/// A figure: measures, prints its table, writes its plot.
type FigureFn = fn(&mut figures::Run) -> Result<()>;

const FIGURES: [&str; 6] = [
    "get",
    "collisions",
    "list",
    "contention",
    "crash",
    "control",
];

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--role") {
        let role = args.get(1).cloned().unwrap_or_default();
        let rest = args.get(2..).unwrap_or(&[]);
        let r = match role.as_str() {
            "app" => app::app_role(rest),
            "writer" => app::writer_role(rest),
            _ => Err(anyhow::anyhow!("unknown role {role:?}")),
        };
        if let Err(e) = r {
            // The coordinator reads the app's answers line by line: say it as one.
            println!("error {e:#}");
            eprintln!("paper_bench --role {role}: {e:#}");
            std::process::exit(1);
        }
        return;
    }
    let mut o = Options {
        quick: false,
        out: PathBuf::from("paper-results"),
        only: Vec::new(),
        manager: None,
        pus: 2,
    };
    read_command_line("paper_bench", USAGE, &mut |name, value| {
        match name {
            "--quick" => o.quick = true,
            "--out" => o.out = PathBuf::from(value().ok_or("--out needs a folder")?),
            "--manager" => {
                o.manager = Some(PathBuf::from(value().ok_or("--manager needs a path")?))
            }
            "--pus" => {
                o.pus = usize::try_from(parse_in("--pus", value(), 1..=16)?)
                    .map_err(|e| e.to_string())?;
            }
            "--only" => {
                let list = value().ok_or("--only needs a list")?;
                for f in list.split(',') {
                    if !FIGURES.contains(&f) {
                        return Err(format!("--only: no figure {f:?} (one of {FIGURES:?})"));
                    }
                    o.only.push(f.to_owned());
                }
            }
            _ => return Ok(false),
        }
        Ok(true)
    });
    match run(&o) {
        Ok(0) => {}
        Ok(_) => std::process::exit(1),
        Err(e) => {
            eprintln!("paper_bench: {e:#}");
            std::process::exit(1);
        }
    }
}

/// Run the figures; the number of wrong answers and failed figures.
fn run(o: &Options) -> Result<u64> {
    let started = Instant::now();
    std::fs::create_dir_all(&o.out)?;
    let binary = procs::manager_binary(o.manager.clone())?;
    let dir = std::env::temp_dir().join(format!("redn-paper-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let manager = ManagerProc::start(&binary, &dir.join("manager"), o.pus, &procs::policy(128))?;
    let mut r = figures::Run::new(o.clone(), binary, dir.clone(), manager);
    r.head(started);
    let want = |f: &str| o.only.is_empty() || o.only.iter().any(|x| x == f);
    let figs: [(&str, FigureFn); 6] = [
        ("get", figures::get_latency),
        ("collisions", figures::collisions),
        ("list", figures::list),
        ("contention", figures::contention),
        ("crash", figures::crash),
        ("control", figures::control),
    ];
    let mut failed = 0u64;
    for (name, f) in figs {
        if want(name) {
            if let Err(e) = f(&mut r) {
                r.line(format!("   {name}: FAILED: {e:#}"));
                r.anomaly(format!("figure {name} failed: {e:#}"));
                failed += 1;
            }
        }
    }
    let wrong = r.finish(started)?;
    drop(r);
    let _ = std::fs::remove_dir_all(&dir);
    if wrong > 0 {
        eprintln!("paper_bench: {wrong} GETs answered wrong or not at all");
    }
    if failed > 0 && wrong == 0 {
        eprintln!("paper_bench: {failed} figures failed");
    }
    if wrong + failed > 0 {
        return Ok(wrong + failed);
    }
    if !o.out.is_dir() {
        bail!("{} vanished", o.out.display());
    }
    Ok(0)
}
