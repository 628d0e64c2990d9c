//! The options every benchmark reads: `--help`, `--quick`, `--pus N`, `--prefetch P`, and a
//! hook for each benchmark's own.

use redn_sys::softnic::{Prefetch, SoftNic, SoftNicConfig};

/// The options softnic_bench and offload_bench both take.
#[derive(Clone, Debug)]
pub struct CommonOpts {
    pub quick: bool,
    /// Softnic processing units (default: the available cores; at most 64).
    pub pus: usize,
    /// Available cores.
    pub cores: usize,
    pub prefetch: Prefetch,
}

impl CommonOpts {
    /// A softnic called `name` with `pus` PUs and the `--prefetch` asked for; WQE checks off
    /// (their cost is not what the benchmarks measure).
    pub fn softnic(&self, name: &str, pus: usize) -> redn_sys::Result<SoftNic> {
        SoftNic::new(SoftNicConfig {
            name: name.into(),
            pus,
            prefetch: self.prefetch,
            wqe_checks: false,
        })
    }
}

/// The value `v` of option `name`: a whole number from 1.
pub fn parse_num(name: &str, v: Option<String>) -> Result<usize, String> {
    let v = v.ok_or_else(|| format!("{name} needs a value"))?;
    let n: usize = v
        .parse()
        .map_err(|_| format!("{name}: '{v}' is not a number"))?;
    if n == 0 {
        return Err(format!("{name} must be at least 1"));
    }
    Ok(n)
}

fn parse_prefetch(v: Option<String>) -> Result<Prefetch, String> {
    let v = v.ok_or("--prefetch needs a value")?;
    match v.as_str() {
        "at-execute" | "atexecute" | "0" => Ok(Prefetch::AtExecute),
        "adversarial" => Ok(Prefetch::Adversarial),
        s => {
            let d = s.strip_prefix("depth:").unwrap_or(s);
            d.parse::<u32>()
                .map(Prefetch::Depth)
                .map_err(|_| format!("--prefetch: '{v}' is not at-execute, adversarial or depth:N"))
        }
    }
}

/// Read the command line. `-h` / `--help` prints `help` and exits; `--quick`, `--pus N` and
/// `--prefetch P` are read here. Any other option goes to `other` with its name and a way to
/// take its value (`--name=value`, or the next argument); `other` returns false for an
/// option it does not know. On an error, says so on stderr (as `bench`) and exits with
/// status 2.
pub fn parse_args(
    bench: &str,
    help: &str,
    other: impl FnMut(&str, &mut dyn FnMut() -> Option<String>) -> Result<bool, String>,
) -> CommonOpts {
    match read_args(help, other) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{bench}: {e}\n(see --help)");
            std::process::exit(2);
        }
    }
}

fn read_args(
    help: &str,
    mut other: impl FnMut(&str, &mut dyn FnMut() -> Option<String>) -> Result<bool, String>,
) -> Result<CommonOpts, String> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (mut quick, mut pus) = (false, None);
    let mut prefetch = Prefetch::Depth(8);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let (name, inline) = match a.split_once('=') {
            Some((n, v)) if a.starts_with("--") => (n.to_string(), Some(v.to_string())),
            _ => (a.clone(), None),
        };
        let mut value = || inline.clone().or_else(|| args.next());
        match name.as_str() {
            "-h" | "--help" => {
                print!("{help}");
                std::process::exit(0);
            }
            "--quick" => quick = true,
            "--pus" => pus = Some(parse_num("--pus", value())?),
            "--prefetch" => prefetch = parse_prefetch(value())?,
            name => {
                if !other(name, &mut value)? {
                    return Err(format!("unknown option '{name}'"));
                }
            }
        }
    }
    let pus = pus.unwrap_or(cores);
    if pus > 64 {
        return Err("--pus: the softnic has at most 64 PUs".into());
    }
    Ok(CommonOpts {
        quick,
        pus,
        cores,
        prefetch,
    })
}
