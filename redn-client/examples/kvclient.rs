//! A remote client of the `kvstore` example: GETs answered by the NIC through the RedN
//! manager's data plane, with no CPU of the app's per GET.
//!
//! Run (with a manager whose `[dataplane] listen` is set, and kvstore running):
//! `cargo run -p redn-client --example kvclient -- --dataplane IP:PORT --handle N --token
//! HEX [--timeout-ms MS] KEY...` (KEYs in hex; without any, one per line from stdin).
//! It prints one line per GET:
//!
//! ```text
//! connected handle 2 offload hash-get invocations 4 trigger 14 bytes
//! get 0x2a hit "hello"
//! get 0x99 miss
//! sessions 1 triggers 3
//! ```

use redn_client::remote::{RemoteClient, RemoteOptions};
use std::io::BufRead;
use std::net::SocketAddr;
use std::time::Duration;

fn main() {
    if let Err(e) = run() {
        eprintln!("kvclient: {}", redn_client::error_chain(&*e));
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut dataplane: Option<SocketAddr> = None;
    let mut handle: Option<u64> = None;
    let mut token: Option<String> = None;
    let mut options = RemoteOptions::default();
    let mut keys = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--dataplane" => dataplane = Some(value()?.parse()?),
            "--handle" => handle = Some(value()?.parse()?),
            "--token" => token = Some(value()?),
            "--timeout-ms" => options.timeout = Duration::from_millis(value()?.parse()?),
            key if !key.starts_with("--") => keys.push(key.to_owned()),
            _ => return Err(format!("unknown argument {a}").into()),
        }
    }
    let dataplane = dataplane.ok_or("--dataplane IP:PORT is required")?;
    let handle = handle.ok_or("--handle N is required")?;
    let token = token.ok_or("--token HEX is required")?;
    let mut client = RemoteClient::connect(dataplane, handle, &token, options)?;
    if let Some(s) = client.session() {
        println!(
            "connected handle {handle} offload {} invocations {} trigger {} bytes",
            s.accepted.offload, s.accepted.invocations, s.accepted.trigger_len
        );
    }
    let from_stdin = keys.is_empty();
    keys.reverse(); // popped from the end, so GETs go in the order given
    let mut stdin = std::io::stdin().lock().lines();
    loop {
        let key = if from_stdin {
            match stdin.next() {
                Some(line) => line?.trim().to_owned(),
                None => break,
            }
        } else {
            match keys.pop() {
                Some(k) => k,
                None => break,
            }
        };
        if key.is_empty() {
            continue;
        }
        let k = u64::from_str_radix(key.trim_start_matches("0x"), 16)?;
        match client.get(k)? {
            Some(v) => println!("get {k:#x} hit {:?}", String::from_utf8_lossy(&v)),
            None => println!("get {k:#x} miss"),
        }
    }
    println!(
        "sessions {} triggers {}",
        client.sessions_opened(),
        client.triggers_sent()
    );
    Ok(())
}
