//! `paper_bench --quick` as a smoke test: the real manager, the app and writer processes and
//! remote clients run every figure; every GET's value was right (the program checks each and
//! exits non-zero on a wrong one), and every plot was written as a whole SVG document. No
//! timing is asserted: the numbers are the benchmark's business.

use std::process::Command;

const FIGURES: [&str; 7] = [
    "get_latency",
    "collisions",
    "collisions_span",
    "list",
    "contention",
    "crash",
    "control",
];

#[test]
fn the_quick_run_answers_every_get_right_and_writes_every_plot() {
    let out = std::env::temp_dir().join(format!("redn-paper-quick-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let run = Command::new(env!("CARGO_BIN_EXE_paper_bench"))
        .arg("--quick")
        .arg("--out")
        .arg(&out)
        .output()
        .expect("run paper_bench");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        run.status.success(),
        "paper_bench --quick failed ({}):\n{stdout}\n{stderr}",
        run.status
    );
    let answers = stdout
        .lines()
        .find_map(|l| l.strip_prefix("answers: "))
        .unwrap_or_else(|| panic!("no answers line:\n{stdout}"));
    let checked: u64 = answers
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(checked > 100, "too few GETs checked: {answers}");
    assert!(answers.ends_with(", 0 wrong, 0 failed"), "{answers}");
    assert!(stdout.contains("anomalies: none"), "{stdout}");
    for fig in FIGURES {
        let path = out.join(format!("{fig}.svg"));
        let svg = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}\n{stdout}", path.display()));
        assert!(svg.trim_start().starts_with("<svg"), "{fig}: {svg:.200}");
        assert!(svg.trim_end().ends_with("</svg>"), "{fig}: not closed");
        assert_eq!(
            svg.matches("<text").count(),
            svg.matches("</text>").count(),
            "{fig}: unbalanced text elements"
        );
        assert!(
            svg.contains("<polyline"),
            "{fig}: no line was drawn: {svg:.400}"
        );
    }
    let tables = std::fs::read_to_string(out.join("tables.txt")).expect("tables.txt");
    for heading in [
        "Fig. 10",
        "Fig. 11",
        "Fig. 13",
        "Fig. 15",
        "Fig. 16",
        "Control plane",
    ] {
        assert!(
            tables.contains(heading),
            "{heading} missing from tables.txt"
        );
    }
    assert_eq!(
        tables.matches("floor: raw UDP ping-pong, 64 B").count(),
        5,
        "a floor row beside every figure but Fig. 10's column"
    );
    assert!(tables.contains("UDP floor"), "Fig. 10 has no floor column");
    let _ = std::fs::remove_dir_all(&out);
}
