//! End-to-end: the real `redn-manager` binary on the softnic with a temp-dir config, driven
//! by real client processes (this test process, children it re-executes as apps, Python's
//! varlink client) over its unix sockets.

#[path = "../common/mod.rs"]
mod common;
mod enforcement;
mod local;
mod remote_clients;

use common::*;
use redn_client::kv::TwoChoiceTable;
use redn_client::remote::{RemoteClient, RemoteOptions};
use redn_client::{Client, Error as ClientError, ManagerError};
use redn_proto::api;
use redn_proto::client::Connection;
use redn_proto::codec::Reply;
use redn_proto::dataplane::{self, Refusal};
use remote_clients::{remote_get_process, KV_DATA};
use std::io::{BufRead, BufReader, Read};
use std::os::fd::AsFd;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Run this test binary again as an app process doing `role`; its stdout lines.
fn app_process(role: &str, socket: &Path) -> Vec<String> {
    let text = stdout_of(&mut app_command(role, socket));
    app_lines(&text)
}

/// The lines an app process printed for the test ("APP ..."), without the prefix.
fn app_lines(text: &str) -> Vec<String> {
    text.lines()
        // libtest prints "test NAME ... " before the body runs, on the same line.
        .filter_map(|l| l.split_once("APP ").map(|(_, rest)| rest.to_owned()))
        .collect()
}

/// This test binary as an app process doing `role`.
fn app_command(role: &str, socket: &Path) -> Command {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args([
            "--exact",
            "app_process_entry",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("REDN_E2E_APP", role)
        .env("REDN_MANAGER_SOCKET", socket)
        .stdin(Stdio::null());
    command
}

/// Not a test: the body of the app processes the other tests start (see `app_process`).
#[test]
#[ignore = "run by the other tests as an app process"]
fn app_process_entry() {
    let Ok(role) = std::env::var("REDN_E2E_APP") else {
        return;
    };
    if role == "remote-get" {
        return remote_get_process();
    }
    let mut c = Client::connect_default().unwrap();
    match role.as_str() {
        "kv" => {
            let (mut table, i) = kv_install(&mut c);
            table.set(0x2a, b"hello").unwrap();
            println!(
                "APP handle={} token={} endpoint={:?}",
                i.handle, i.token, i.endpoint
            );
        }
        "kv-serve" => {
            // Installs, SETs, prints, then waits for its stdin to close (the test stops
            // it with SIGSTOP meanwhile).
            let (mut table, i) = kv_install(&mut c);
            for (k, v) in KV_DATA {
                table.set(k, v.as_bytes()).unwrap();
            }
            println!(
                "APP handle={} token={} endpoint={}",
                i.handle,
                i.token,
                i.endpoint.unwrap_or_default()
            );
            let mut rest = Vec::new();
            let _ = std::io::stdin().read_to_end(&mut rest);
            for s in c.stats().unwrap() {
                println!("APP stats triggers={} errors={}", s.triggers, s.errors);
            }
        }
        other => panic!("unknown role {other}"),
    }
}

fn kv_install(c: &mut Client) -> (TwoChoiceTable, api::Installed) {
    let mut table = TwoChoiceTable::create(64).unwrap();
    let (_, installed) = c.install_table("hash-get", &mut table).unwrap();
    (table, installed)
}
