//! redn-manager: the privileged RedN offload manager (skeleton until the manager issue lands).

// Used by the manager as it is built; the skeleton only tests it.
#[allow(dead_code)]
mod backend;

fn main() {
    eprintln!("redn-manager: not built yet; see README.md for what runs today");
    std::process::exit(2);
}
