//! The app and writer roles: what `kvstore` does (a two-choice hash table in a sealed
//! region, offloads installed over it through the manager), with value slots up to 64 KiB,
//! a linked list beside the table for list-find, and SETs taken from writer processes.

use anyhow::{anyhow, bail, Context, Result};
use redn_client::baseline::{map_region, BaselineOptions, OneSidedServer, RpcServer, TableLayout};
use redn_client::kv::{bucket_bytes, bucket_indices, BUCKET_STRIDE};
use redn_client::{Client, SealedRegion};
use redn_program::program::catalog::node_bytes;
use std::io::{BufRead, BufReader, Write};
use std::net::UdpSocket;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Nodes the list holds at most (list-find is unrolled for 8 steps; room for 14).
pub const LIST_NODES: u64 = 16;
/// Distance between list nodes.
const NODE_STRIDE: u64 = 64;
/// Bytes of a list node's value.
pub const LIST_VALUE_LEN: usize = 32;
/// Largest UDP datagram the floor's echo sends.
const DATAGRAM: usize = 32 << 10;
/// Largest answer the floor's echo sends to one request (the largest value size).
const MAX_ECHO: usize = 64 << 10;

/// The bytes stored under `key` when its value is `len` long: every GET is checked against
/// them.
pub fn value_bytes(key: u64, len: usize) -> Vec<u8> {
    let seed = key.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (0..len)
        .map(|i| {
            let x = seed ^ (i as u64).wrapping_mul(0xff51_afd7_ed55_8ccd);
            x.to_le_bytes()[7]
        })
        .collect()
}

/// `n` keys whose candidate buckets in a table of `buckets` are all different from each
/// other's (so that placing one never moves another), from `first` on.
pub fn pick_keys(n: usize, buckets: u64, first: u64) -> Vec<u64> {
    let mut used = std::collections::HashSet::new();
    let mut keys = Vec::with_capacity(n);
    let mut k = first;
    while keys.len() < n && k < first + 1_000_000 {
        let [a, b] = bucket_indices(k, buckets);
        if !used.contains(&a) && !used.contains(&b) {
            used.insert(a);
            used.insert(b);
            keys.push(k);
        }
        k += 1;
    }
    keys
}

/// Where things lie in the app's region.
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    /// Buckets of the table.
    pub buckets: u64,
    /// Bytes of one value slot (one per bucket).
    pub slot: u64,
}

fn page_up(x: u64) -> u64 {
    x.div_ceil(4096) * 4096
}

impl Layout {
    fn table_len(self) -> u64 {
        self.buckets * BUCKET_STRIDE
    }
    fn values_at(self) -> u64 {
        page_up(self.table_len())
    }
    fn values_len(self) -> u64 {
        self.buckets * self.slot
    }
    fn list_at(self) -> u64 {
        page_up(self.values_at() + self.values_len())
    }
    fn list_values_at(self) -> u64 {
        self.list_at() + page_up(LIST_NODES * NODE_STRIDE)
    }
    fn len(self) -> u64 {
        self.list_values_at() + page_up(LIST_NODES * LIST_VALUE_LEN as u64)
    }

    /// The bindings of `offload` as `(name, offset, len)`.
    fn bindings(self, offload: &str) -> [(&'static str, u64, u64); 2] {
        if offload.starts_with("list-find") {
            [
                ("list", self.list_at(), LIST_NODES * NODE_STRIDE),
                (
                    "values",
                    self.list_values_at(),
                    LIST_NODES * LIST_VALUE_LEN as u64,
                ),
            ]
        } else {
            [
                ("table", 0, self.table_len()),
                ("values", self.values_at(), self.values_len()),
            ]
        }
    }
}

/// The table and the list in one sealed region; SETs write the value first and the bucket
/// after it (as `redn_client::kv` does), so a probe never follows a bucket to a value not
/// yet written.
pub struct Store {
    region: SealedRegion,
    layout: Layout,
    /// The manager's address of the region.
    base: u64,
    sets: AtomicU64,
}

impl Store {
    fn create(layout: Layout) -> Result<Store> {
        Ok(Store {
            region: SealedRegion::create("paper-bench", layout.len())?,
            layout,
            base: 0,
            sets: AtomicU64::new(0),
        })
    }

    /// Store the value of `key` (`len` bytes of [`value_bytes`]) in its candidate bucket
    /// `which` (0 or 1).
    fn set(&self, key: u64, len: usize, which: usize) -> Result<()> {
        let l = self.layout;
        if len as u64 > l.slot {
            bail!("a value of {len} bytes does not fit a {}-byte slot", l.slot);
        }
        let i = bucket_indices(key, l.buckets)[which.min(1)];
        let slot = l.values_at() + i * l.slot;
        self.region.write_at(slot, &value_bytes(key, len))?;
        let len32 = u32::try_from(len)?;
        self.region.write_at(
            i * BUCKET_STRIDE,
            &bucket_bytes(key, len32, self.base + slot),
        )?;
        self.sets.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Lay the list out: node j holds `keys[j]`, its value [`value_bytes`] of
    /// [`LIST_VALUE_LEN`]; the last node points at itself.
    fn list(&self, keys: &[u64]) -> Result<()> {
        let l = self.layout;
        if keys.is_empty() || keys.len() as u64 > LIST_NODES {
            bail!("a list of 1..={LIST_NODES} nodes, not {}", keys.len());
        }
        for (j, &key) in keys.iter().enumerate() {
            let j = j as u64;
            let value_at = l.list_values_at() + j * LIST_VALUE_LEN as u64;
            self.region
                .write_at(value_at, &value_bytes(key, LIST_VALUE_LEN))?;
            let next = (j + 1).min(keys.len() as u64 - 1);
            let node = node_bytes(
                key,
                u32::try_from(LIST_VALUE_LEN)?,
                self.base + value_at,
                self.base + l.list_at() + next * NODE_STRIDE,
            );
            self.region.write_at(l.list_at() + j * NODE_STRIDE, &node)?;
        }
        Ok(())
    }
}

/// The app role. Arguments: `--socket PATH` (manager.sock), `--buckets N`, `--slot BYTES`,
/// `--writers PATH` (where writer processes connect). Commands on stdin, one answer line
/// each on stdout (`error …` on failure):
/// - `install NAME` → `installed HANDLE TOKEN ENDPOINT`;
/// - `set KEY LEN WHICH` → `ok` (KEY decimal, WHICH the candidate bucket, 0 or 1);
/// - `list KEY…` → `ok`;
/// - `bench-install NAME N` → `samples US…` (N installs, each uninstalled again);
/// - `sets` → `sets N` (SETs so far, writers' included);
/// - `udp-echo PEER_PORT` → `port P`, then a busy-polling echo of the peer at 127.0.0.1:
///   PEER_PORT (the socket is connected to it, so the kernel drops datagrams from anyone
///   else: other programs on the host reuse ports) until a 1-byte datagram, then `ok`;
/// - `baselines` → `baselines ONE_SIDED_ADDR RPC_ADDR`: the one-sided and two-sided
///   servers of `redn_client::baseline` started in this process on the table's memory
///   (the RPC server's thread polls until `stop-baselines` → `ok`).
pub fn app_role(args: &[String]) -> Result<()> {
    let mut socket = None;
    let mut writers = None;
    let mut layout = Layout {
        buckets: 256,
        slot: 64,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().ok_or_else(|| anyhow!("{a} needs a value"));
        match a.as_str() {
            "--socket" => socket = Some(PathBuf::from(value()?)),
            "--writers" => writers = Some(PathBuf::from(value()?)),
            "--buckets" => layout.buckets = value()?.parse()?,
            "--slot" => layout.slot = value()?.parse()?,
            _ => bail!("app: unknown argument {a}"),
        }
    }
    let socket = socket.context("app: --socket is missing")?;
    let mut manager = Client::connect(&socket).context("connecting to the manager")?;
    let mut store = Store::create(layout)?;
    let reg = manager.register_region(&store.region, "paper-bench")?;
    store.base = reg.addr;
    let store = Arc::new(store);
    if let Some(path) = writers {
        let listener = UnixListener::bind(&path).context("binding the writers' socket")?;
        let s = Arc::clone(&store);
        std::thread::spawn(move || serve_writers(&listener, &s));
    }
    let mut installed = Vec::new();
    let mut baselines = None;
    let mut out = std::io::stdout().lock();
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let words: Vec<&str> = line.split_whitespace().collect();
        let answer = match words.as_slice() {
            ["install", name] => {
                let b = layout.bindings(name).map(|(n, o, l)| (n, reg.region, o, l));
                manager.install(name, &b).map(|i| {
                    installed.push(i.handle);
                    format!(
                        "installed {} {} {}",
                        i.handle,
                        i.token,
                        i.endpoint.as_deref().unwrap_or("none")
                    )
                })?
            }
            ["set", key, len, which] => {
                store.set(key.parse()?, len.parse()?, which.parse()?)?;
                "ok".to_owned()
            }
            ["list", keys @ ..] => {
                let keys: Vec<u64> = keys.iter().map(|k| k.parse()).collect::<Result<_, _>>()?;
                store.list(&keys)?;
                "ok".to_owned()
            }
            ["bench-install", name, n] => {
                let b = layout.bindings(name).map(|(n, o, l)| (n, reg.region, o, l));
                let mut v = Vec::new();
                for _ in 0..n.parse::<usize>()? {
                    let t = Instant::now();
                    let i = manager.install(name, &b)?;
                    v.push(format!("{:.1}", t.elapsed().as_secs_f64() * 1e6));
                    manager.uninstall(i.handle)?;
                }
                format!("samples {}", v.join(" "))
            }
            ["sets"] => format!("sets {}", store.sets.load(Ordering::Relaxed)),
            ["baselines"] => {
                let memory = map_region(&store.region)?;
                let table = TableLayout {
                    buckets: layout.buckets,
                    base: store.base,
                };
                let listen = "127.0.0.1:0".parse()?;
                let opts = baseline_options(std::time::Duration::from_secs(5));
                let one = OneSidedServer::start(memory.clone(), table, listen, opts)?;
                let rpc = RpcServer::start(memory, table, listen, opts)?;
                let answer = format!("baselines {} {}", one.addr(), rpc.addr());
                baselines = Some((one, rpc));
                answer
            }
            ["stop-baselines"] => {
                baselines = None;
                "ok".to_owned()
            }
            ["udp-echo", peer] => {
                let peer: u16 = peer.parse().context("udp-echo's peer port")?;
                let udp = UdpSocket::bind("127.0.0.1:0")?;
                udp.connect(("127.0.0.1", peer))?;
                udp.set_nonblocking(true)?;
                writeln!(out, "port {}", udp.local_addr()?.port())?;
                out.flush()?;
                udp_echo(&udp)?;
                "ok".to_owned()
            }
            _ => format!("error unknown command {line:?}"),
        };
        writeln!(out, "{answer}")?;
        out.flush()?;
    }
    drop(baselines);
    for h in installed {
        let _ = manager.uninstall(h);
    }
    Ok(())
}

/// The baselines' settings: values up to the largest slot, `timeout` for every wait.
pub fn baseline_options(timeout: std::time::Duration) -> BaselineOptions {
    BaselineOptions {
        timeout,
        max_value: 64 << 10,
    }
}

/// Answer each request (its first 4 bytes: the answer's length, little-endian, at most
/// [`MAX_ECHO`]) with that many bytes, in datagrams of at most 32 KiB, busy-polling; until
/// a 1-byte datagram. `udp` is connected to its one peer.
fn udp_echo(udp: &UdpSocket) -> Result<()> {
    let mut buf = vec![0u8; 2048];
    let reply = vec![0x5a_u8; DATAGRAM];
    let mut idle_since = Instant::now();
    loop {
        match udp.recv(&mut buf) {
            Ok(1) => return Ok(()),
            Ok(n) if n >= 4 => {
                idle_since = Instant::now();
                let asked = usize::try_from(u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]))?;
                let mut left = asked.min(MAX_ECHO);
                while left > 0 {
                    let chunk = left.min(DATAGRAM);
                    udp.send(&reply[..chunk])?;
                    left -= chunk;
                }
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                crate::figures::spin_or_yield(idle_since.elapsed());
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Each writer's connection on a thread of its own: lines `KEY LEN`, each SET answered
/// `ok`.
fn serve_writers(listener: &UnixListener, store: &Arc<Store>) {
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        let store = Arc::clone(store);
        std::thread::spawn(move || {
            let Ok(mut reply) = conn.try_clone() else {
                return;
            };
            for line in BufReader::new(conn).lines() {
                let Ok(line) = line else { break };
                let mut w = line.split_whitespace().map(str::parse::<u64>);
                let ok = match (w.next(), w.next()) {
                    (Some(Ok(key)), Some(Ok(len))) => usize::try_from(len)
                        .map_err(anyhow::Error::from)
                        .and_then(|len| store.set(key, len, 0))
                        .is_ok(),
                    _ => false,
                };
                if reply.write_all(if ok { b"ok\n" } else { b"no\n" }).is_err() {
                    break;
                }
            }
        });
    }
}

/// The writer role: `--app PATH --keys K,K,… --len L`. SETs its keys in turn through the
/// app as fast as the app answers, until it is killed (it says `ready` first).
pub fn writer_role(args: &[String]) -> Result<()> {
    let (mut app, mut keys, mut len) = (None, Vec::new(), 64u64);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().ok_or_else(|| anyhow!("{a} needs a value"));
        match a.as_str() {
            "--app" => app = Some(PathBuf::from(value()?)),
            "--keys" => {
                keys = value()?
                    .split(',')
                    .map(str::parse)
                    .collect::<Result<Vec<u64>, _>>()?;
            }
            "--len" => len = value()?.parse()?,
            _ => bail!("writer: unknown argument {a}"),
        }
    }
    let app = app.context("writer: --app is missing")?;
    if keys.is_empty() {
        bail!("writer: --keys is missing");
    }
    let conn = UnixStream::connect(&app).context("connecting to the app")?;
    let mut answers = BufReader::new(conn.try_clone()?);
    let mut conn = conn;
    println!("ready");
    std::io::stdout().flush()?;
    let mut line = String::new();
    for &key in keys.iter().cycle() {
        writeln!(conn, "{key} {len}")?;
        line.clear();
        if answers.read_line(&mut line)? == 0 {
            break; // the app is gone
        }
        if line.trim() != "ok" {
            bail!("the app refused SET {key}: {line}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_differ_by_key_and_keys_never_share_buckets() {
        assert_ne!(value_bytes(1, 64), value_bytes(2, 64));
        assert_eq!(value_bytes(7, 100)[..64], value_bytes(7, 64)[..]);
        let keys = pick_keys(20, 64, 0x1000);
        assert_eq!(keys.len(), 20);
        let mut seen = std::collections::HashSet::new();
        for k in keys {
            for b in bucket_indices(k, 64) {
                assert!(seen.insert(b), "bucket {b} twice");
            }
        }
    }
}
