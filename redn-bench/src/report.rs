//! The report's head and tail, and how its tables write numbers.

use crate::opts::CommonOpts;
use std::time::Instant;

/// The report's head: `title`, then the cores, the PUs (`pus` says how many, where), where
/// their threads may run, the prefetch and the kind of run, with a warning in a debug build.
pub fn print_head(title: &str, o: &CommonOpts, pus: &str) {
    println!("{title}");
    let placed = if o.pu_cpus.is_empty() {
        "placed by the kernel".to_owned()
    } else {
        let cpus: Vec<String> = o.pu_cpus.iter().map(ToString::to_string).collect();
        format!("pinned to CPUs {}", cpus.join(","))
    };
    println!(
        "   {} cores, {pus}, PU threads {placed}, prefetch {:?}, {}{}",
        o.cores,
        o.prefetch,
        if o.quick { "quick run" } else { "full run" },
        if cfg!(debug_assertions) {
            "  !! debug build: numbers are meaningless, use --release"
        } else {
            ""
        }
    );
}

/// One section of the report, run when `on`: `f` prints it and adds what it finds wrong to
/// the anomalies; when it stops early (`Err`), that is said under it and is an anomaly too.
pub fn section(
    name: &str,
    on: bool,
    anomalies: &mut Vec<String>,
    f: impl FnOnce(&mut Vec<String>) -> Result<(), String>,
) {
    if !on {
        return;
    }
    if let Err(e) = f(anomalies) {
        println!("   {name} section aborted: {e}");
        anomalies.push(format!("{name} section aborted: {e}"));
    }
}

/// The report's tail: the anomalies and the total run time.
pub fn print_anomalies(anomalies: &[String], started: Instant) {
    if anomalies.is_empty() {
        println!("anomalies: none");
    } else {
        println!("anomalies ({}):", anomalies.len());
        for a in anomalies {
            println!(" - {a}");
        }
    }
    println!("total run time {:.1} s", started.elapsed().as_secs_f64());
}

/// A target's verdict: "MET" or "NOT MET".
pub fn verdict(met: bool) -> &'static str {
    if met {
        "MET"
    } else {
        "NOT MET"
    }
}

/// Nanoseconds with 2, 1 or no decimals by size; "-" for a figure not measured (NaN).
pub fn fmt_ns(v: f64) -> String {
    if !v.is_finite() {
        "-".into()
    } else if v.abs() < 10.0 {
        format!("{v:.2}")
    } else if v.abs() < 100_000.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.0}")
    }
}

/// Nanoseconds as microseconds, with enough digits for sub-µs values; "-" for NaN.
pub fn us(v: f64) -> String {
    if !v.is_finite() {
        "-".into()
    } else if v < 1000.0 {
        format!("{:.3}", v / 1e3)
    } else {
        format!("{:.2}", v / 1e3)
    }
}

/// A rate per second as millions per second; "-" for NaN.
pub fn mops(v: f64) -> String {
    if !v.is_finite() {
        "-".into()
    } else {
        format!("{:.2}", v / 1e6)
    }
}

/// A byte count as "64 B" or "4 KB".
pub fn size_name(s: usize) -> String {
    if s >= 1024 {
        format!("{} KB", s / 1024)
    } else {
        format!("{s} B")
    }
}

/// A table row that could not be measured: `head` (its first cells, as the table formats
/// them), then FAILED; what went wrong goes to the anomalies.
pub fn print_failed(head: &str) {
    println!("   {head}   FAILED (see anomalies)");
}
