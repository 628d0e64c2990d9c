//! A key-value store whose GETs the NIC answers: it keeps a two-choice hash table in a
//! sealed memfd, registers it with the RedN manager, installs `hash-get` over it, prints the
//! handle and token its remote clients need, and then takes SETs itself (from stdin, one
//! `SET KEY VALUE` per line, KEY in hex) while the NIC serves the GETs.
//!
//! Run (with a manager listening): `cargo run -p redn-client --example kvstore --
//! [--socket PATH] [--buckets N] [--offload NAME]`. Lines it prints:
//!
//! ```text
//! region 1 size 8192 addr 0x7f...
//! installed hash-get handle 2 token 5c1e... endpoint none
//! table buckets 64 stride 32 base 0x7f...
//! ready
//! set 0x2a ok buckets 0x7f...,0x7f...
//! ```

use redn_client::kv::TwoChoiceTable;
use redn_client::Client;
use std::io::BufRead;
use std::path::PathBuf;

fn main() {
    if let Err(e) = run() {
        eprint!("kvstore: {e}");
        let mut source = std::error::Error::source(&*e);
        while let Some(s) = source {
            eprint!(": {s}");
            source = s.source();
        }
        eprintln!();
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut socket = std::env::var_os("REDN_MANAGER_SOCKET")
        .map_or_else(|| PathBuf::from(redn_client::DEFAULT_SOCKET), PathBuf::from);
    let mut buckets = 64u64;
    let mut offload = "hash-get".to_owned();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--socket" => socket = PathBuf::from(value()?),
            "--buckets" => buckets = value()?.parse()?,
            "--offload" => offload = value()?,
            _ => return Err(format!("unknown argument {a}").into()),
        }
    }
    let mut manager = Client::connect(&socket)?;
    let mut table = TwoChoiceTable::create(buckets)?;
    let (region, installed) = manager.install_table(&offload, &mut table)?;
    println!(
        "region {} size {} addr {:#x}",
        region.region, region.size, region.addr
    );
    println!(
        "installed {offload} handle {} token {} endpoint {}",
        installed.handle,
        installed.token,
        installed.endpoint.as_deref().unwrap_or("none")
    );
    println!(
        "table buckets {} stride {} base {:#x}",
        table.buckets(),
        redn_client::kv::BUCKET_STRIDE,
        region.addr
    );
    println!("ready");
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let mut parts = line.splitn(3, ' ');
        match (parts.next(), parts.next(), parts.next()) {
            (Some("SET"), Some(key), Some(value)) => {
                let key = u64::from_str_radix(key.trim_start_matches("0x"), 16)?;
                match table.set(key, value.as_bytes()) {
                    Ok(()) => {
                        let [a, b] = table.candidates(key);
                        println!("set {key:#x} ok buckets {a:#x},{b:#x}");
                    }
                    Err(e) => println!("set {key:#x} failed: {e}"),
                }
            }
            (Some("STATS"), None, None) => {
                for s in manager.stats()? {
                    println!(
                        "stats handle {} {} triggers {} wqes {} errors {}",
                        s.handle, s.offload, s.triggers, s.wqes, s.errors
                    );
                }
            }
            (Some("QUIT"), None, None) => break,
            _ => println!("? expected SET KEY VALUE, STATS or QUIT"),
        }
    }
    Ok(())
}
