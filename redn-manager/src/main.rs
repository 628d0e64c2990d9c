//! redn-manager: the privileged RedN offload manager. See `redn-manager --help`.

fn main() {
    std::process::exit(redn_manager::cli::main());
}
