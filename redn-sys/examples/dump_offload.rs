//! Print the listing of a catalog offload (what `redn offload dump` will show).
//!
//! `cargo run -p redn-sys --example dump_offload -- NAME [INVOCATIONS]` with NAME one of
//! echo, hash-get, hash-get-seq, hash-get-par, list-find, list-find-break, server-loop.

use redn_program::program::catalog::{self, HashVariant};

fn main() {
    let mut args = std::env::args().skip(1);
    let name = args.next().unwrap_or_else(|| "hash-get".into());
    let n: u32 = args.next().and_then(|v| v.parse().ok()).unwrap_or(1);
    let p = match name.as_str() {
        "echo" => catalog::echo(16, n),
        "hash-get" => catalog::hash_get(HashVariant::Single, n),
        "hash-get-seq" => catalog::hash_get(HashVariant::Sequential, n),
        "hash-get-par" => catalog::hash_get(HashVariant::Parallel, n),
        "list-find" => catalog::list_find(2, false, n),
        "list-find-break" => catalog::list_find(2, true, n),
        "server-loop" => catalog::server_loop(),
        other => {
            eprintln!("dump_offload: unknown offload {other:?}");
            std::process::exit(2);
        }
    };
    match p {
        Ok(p) => print!("{}", p.listing()),
        Err(e) => {
            eprintln!("dump_offload: {e}");
            std::process::exit(1);
        }
    }
}
