//! Regenerate the shipped offload definitions in `etc/redn/offloads.d/` from the catalog
//! builders (`redn_policy::shipped_offloads`), so that the files stay reproducible:
//!
//! ```text
//! cargo run -p redn-policy --example gen_offloads            # writes etc/redn/offloads.d
//! cargo run -p redn-policy --example gen_offloads -- DIR     # writes DIR instead
//! ```
//!
//! A test (`tests/definitions/`) fails when a file differs from what this writes.

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let dir = std::env::args_os().nth(1).map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../etc/redn/offloads.d"),
        PathBuf::from,
    );
    let shipped = match redn_policy::shipped_offloads() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("gen_offloads: a catalog builder failed: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("gen_offloads: {}: {e}", dir.display());
        return ExitCode::FAILURE;
    }
    for s in &shipped {
        let path = dir.join(s.file_name());
        let text = s.file_text();
        // Never write a file that would not load back to the builder's program.
        match redn_policy::parse_definition(&text, &path.display().to_string()) {
            Ok(p) if p == s.program => {}
            Ok(_) => {
                eprintln!("gen_offloads: {} does not round-trip", path.display());
                return ExitCode::FAILURE;
            }
            Err(e) => {
                eprintln!("gen_offloads: {e}");
                return ExitCode::FAILURE;
            }
        }
        if let Err(e) = std::fs::write(&path, &text) {
            eprintln!("gen_offloads: {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
        println!("{} ({} bytes)", path.display(), text.len());
    }
    ExitCode::SUCCESS
}
