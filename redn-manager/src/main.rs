//! redn-manager: the privileged RedN offload manager (skeleton until the manager issue lands).

fn main() {
    eprintln!("redn-manager: not built yet; see README.md for what runs today");
    std::process::exit(2);
}
