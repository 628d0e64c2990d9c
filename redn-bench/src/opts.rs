//! Reading the command line: `--help`, `--name value` / `--name=value`, whole numbers in a
//! range, and the options softnic_bench and offload_bench both take (`--quick`, `--pus N`,
//! `--prefetch P`, `--pu-cpus LIST`).

use redn_sys::softnic::{Prefetch, SoftNic, SoftNicConfig, MAX_CPUS};
use std::ops::RangeInclusive;

/// The options softnic_bench and offload_bench both take.
#[derive(Clone, Debug)]
pub struct CommonOpts {
    /// `--quick`: fewer repetitions and sizes, for a fast look.
    pub quick: bool,
    /// Softnic processing units (default: the available cores; at most 64).
    pub pus: usize,
    /// Available cores.
    pub cores: usize,
    /// `--prefetch`: the softnic's WQE prefetch model.
    pub prefetch: Prefetch,
    /// `--pu-cpus`: the CPUs PU threads are pinned to (`SoftNicConfig::pu_cpus`); empty:
    /// not pinned.
    pub pu_cpus: Vec<usize>,
}

impl CommonOpts {
    /// A softnic called `name` with `pus` PUs and the `--prefetch` and `--pu-cpus` asked for;
    /// WQE checks off (their cost is not what the benchmarks measure).
    pub fn softnic(&self, name: &str, pus: usize) -> redn_sys::Result<SoftNic> {
        let mut cfg = SoftNicConfig::new(name);
        cfg.pus = pus;
        cfg.prefetch = self.prefetch;
        cfg.pu_cpus.clone_from(&self.pu_cpus);
        SoftNic::new(cfg)
    }
}

/// The value `v` of option (or argument) `name`: a whole number in `range`.
pub fn parse_in(name: &str, v: Option<String>, range: RangeInclusive<u64>) -> Result<u64, String> {
    let v = v.ok_or_else(|| format!("{name} needs a value"))?;
    let n: u64 = v
        .parse()
        .map_err(|_| format!("{name}: '{v}' is not a number"))?;
    if !range.contains(&n) {
        return Err(if *range.end() == u64::MAX {
            format!("{name} must be at least {}", range.start())
        } else {
            format!(
                "{name} must be in {}..={}, not {n}",
                range.start(),
                range.end()
            )
        });
    }
    Ok(n)
}

/// The value `v` of option `name`: a whole number from 1.
pub fn parse_num(name: &str, v: Option<String>) -> Result<usize, String> {
    let n = parse_in(name, v, 1..=u64::MAX)?;
    usize::try_from(n).map_err(|_| format!("{name}: {n} is too large"))
}

/// The value of `--pu-cpus`: CPU numbers separated by commas (`0,1`), at most 64.
pub fn parse_cpus(v: Option<String>) -> Result<Vec<usize>, String> {
    let v = v.ok_or("--pu-cpus needs a value")?;
    let cpus = v
        .split(',')
        .map(|c| {
            c.trim()
                .parse::<usize>()
                .ok()
                .filter(|&n| n < MAX_CPUS)
                .ok_or_else(|| {
                    format!(
                        "--pu-cpus: '{c}' is not a CPU number (0..={})",
                        MAX_CPUS - 1
                    )
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if cpus.len() > 64 {
        return Err("--pu-cpus: at most 64 CPUs (one a PU)".into());
    }
    Ok(cpus)
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

/// How a benchmark reads one argument: its name (an option's, or the argument itself when
/// it is not an option) and a way to take its value (`--name=value`, or the next argument);
/// false for an argument it does not know.
pub type ArgReader<'a> =
    dyn FnMut(&str, &mut dyn FnMut() -> Option<String>) -> Result<bool, String> + 'a;

/// Read the command line: `-h` / `--help` prints `help` and exits; every other argument goes
/// to `arg`. On an error, says so on stderr (as `bench`) and exits with status 2.
pub fn read_command_line(bench: &str, help: &str, arg: &mut ArgReader<'_>) {
    if let Err(e) = read_each(help, arg) {
        fail(bench, &e);
    }
}

/// Say on stderr (as `bench`) what is wrong with the command line, and exit with status 2.
pub fn fail(bench: &str, e: &str) -> ! {
    eprintln!("{bench}: {e}\n(see --help)");
    std::process::exit(2);
}

fn read_each(help: &str, arg: &mut ArgReader<'_>) -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let (name, inline) = match a.split_once('=') {
            Some((n, v)) if a.starts_with("--") => (n.to_string(), Some(v.to_string())),
            _ => (a.clone(), None),
        };
        if name == "-h" || name == "--help" {
            print!("{help}");
            std::process::exit(0);
        }
        let mut value = || inline.clone().or_else(|| args.next());
        if !arg(&name, &mut value)? {
            return Err(format!("unknown option '{name}'"));
        }
    }
    Ok(())
}

/// Read the command line as [`read_command_line`] does; `--quick`, `--pus N`, `--prefetch P`
/// and `--pu-cpus LIST` are read here, any other argument goes to `other`.
pub fn parse_args(
    bench: &str,
    help: &str,
    mut other: impl FnMut(&str, &mut dyn FnMut() -> Option<String>) -> Result<bool, String>,
) -> CommonOpts {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (mut quick, mut pus) = (false, None);
    let mut prefetch = Prefetch::Depth(8);
    let mut pu_cpus = Vec::new();
    read_command_line(bench, help, &mut |name, value| {
        match name {
            "--quick" => quick = true,
            "--pus" => pus = Some(parse_num("--pus", value())?),
            "--prefetch" => prefetch = parse_prefetch(value())?,
            "--pu-cpus" => pu_cpus = parse_cpus(value())?,
            name => return other(name, value),
        }
        Ok(true)
    });
    let pus = pus.unwrap_or(cores);
    if pus > 64 {
        fail(bench, "--pus: the softnic has at most 64 PUs");
    }
    CommonOpts {
        quick,
        pus,
        cores,
        prefetch,
        pu_cpus,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_are_read_and_bounded() {
        assert_eq!(parse_cpus(Some("0,1".into())), Ok(vec![0, 1]));
        assert_eq!(parse_cpus(Some(" 3 , 1023".into())), Ok(vec![3, 1023]));
        for (bad, why) in [
            ("1024", "'1024' is not a CPU number"),
            ("0,,1", "'' is not a CPU number"),
            ("-1", "'-1' is not a CPU number"),
            ("a", "'a' is not a CPU number"),
        ] {
            let e = parse_cpus(Some(bad.into())).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
        let many = (0..65).map(|c| c.to_string()).collect::<Vec<_>>().join(",");
        assert!(parse_cpus(Some(many)).unwrap_err().contains("at most 64"));
        assert!(parse_cpus(None).unwrap_err().contains("needs a value"));
    }
}
