//! The report's head and tail, and how its tables write numbers.

use crate::opts::CommonOpts;
use std::time::Instant;

/// The report's head: `title`, then the cores, the PUs (`pus` says how many, where), the
/// prefetch and the kind of run, with a warning in a debug build.
pub fn print_head(title: &str, o: &CommonOpts, pus: &str) {
    println!("{title}");
    println!(
        "   {} cores, {pus}, prefetch {:?}, {}{}",
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
