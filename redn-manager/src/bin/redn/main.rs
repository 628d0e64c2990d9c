//! `redn`: inspect and manage the RedN offload manager, shaped like `rdma` and `bpftool`:
//! `redn [-j] [-p] [-d] OBJECT {COMMAND | help}`. It talks to the manager's admin socket
//! (varlink, `io.redn.Admin`); `redn offload verify` works without a manager. `redn help`
//! lists everything; `table.rs` is the one list of commands that parsing, help and the
//! shell completions are made from.

mod table;

use anyhow::{anyhow, bail, Context, Result};
use redn_manager::state::grants_at_quota;
use redn_policy::config::{DEFAULT_ADMIN_SOCKET, DEFAULT_MANAGER_CONFIG_PATH};
use redn_policy::{load_definition, load_manager_config, load_policy, verify};
use redn_proto::api::ADMIN;
use redn_proto::client::Connection;
use serde_json::{json, Map, Value};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Where policy.toml is when `offload verify` is not told.
const DEFAULT_POLICY_PATH: &str = "/etc/redn/policy.toml";
/// How long a call to the manager may take before `redn` gives up.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The global options.
#[derive(Debug, Default)]
struct Options {
    json: bool,
    pretty: bool,
    details: bool,
    socket: Option<PathBuf>,
    config: Option<PathBuf>,
}

/// What a command produced.
enum Output {
    /// Rows of flat objects; text mode shows `columns` (every key with `-d`).
    Rows {
        rows: Vec<Map<String, Value>>,
        columns: &'static [&'static str],
    },
    /// Text for people, and the same as JSON.
    Text { text: String, json: Value },
    /// Printed as it came (`monitor follow`): nothing is left to print.
    Streamed,
}

/// A command's failure that is not an error of `redn` itself: printed as it is, exit 1.
#[derive(Debug)]
struct Refused(Output);

impl std::fmt::Debug for Output {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Output")
    }
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("refused")
    }
}

impl std::error::Error for Refused {}

/// A usage error: exit 2.
#[derive(Debug)]
struct Usage(String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

fn usage_error(message: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(Usage(message.into()))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut opts = Options::default();
    let result = parse_options(&args, &mut opts).and_then(|rest| run(&opts, &rest));
    match result {
        Ok(out) => {
            print_output(&opts, &out);
            ExitCode::SUCCESS
        }
        Err(e) => {
            if let Some(Refused(out)) = e.downcast_ref::<Refused>() {
                print_output(&opts, out);
                return ExitCode::from(1);
            }
            let message = format!("{e:#}");
            if opts.json {
                emit(&format!("{}\n", json!({ "error": message })));
            } else {
                eprintln!("Error: {message}");
            }
            if e.downcast_ref::<Usage>().is_some() {
                if !opts.json {
                    eprintln!("Try `redn help`.");
                }
                ExitCode::from(2)
            } else {
                ExitCode::from(1)
            }
        }
    }
}

/// Take the global options (before the object, as `rdma` and `bpftool` do, or anywhere
/// after it); return the rest.
fn parse_options(args: &[String], opts: &mut Options) -> Result<Vec<String>> {
    let mut rest = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| usage_error(format!("{name} needs a value")))
        };
        match a.as_str() {
            "-j" | "--json" => opts.json = true,
            "-p" | "--pretty" => opts.pretty = true,
            "-d" | "--details" => opts.details = true,
            "-s" | "--socket" => opts.socket = Some(value(a)?.into()),
            "-c" | "--config" => opts.config = Some(value(a)?.into()),
            "-h" | "--help" => rest = vec!["help".to_owned()],
            "-V" | "--version" => rest = vec!["version".to_owned()],
            // Options of one command (`--policy`, `--app`) stay with it.
            "--policy" | "--app" | "--offset" | "--limit" => {
                rest.push(a.clone());
                rest.push(value(a)?);
            }
            s if s.starts_with('-') && s.len() > 1 => {
                return Err(usage_error(format!("unknown option {s}")))
            }
            _ => rest.push(a.clone()),
        }
        if rest.first().is_some_and(|r| r == "help" || r == "version") && a.starts_with('-') {
            break;
        }
    }
    Ok(rest)
}

fn run(opts: &Options, args: &[String]) -> Result<Output> {
    let text = |s: String| Output::Text {
        json: json!({ "help": s }),
        text: s,
    };
    let Some(object) = args.first() else {
        return Ok(text(table::usage()));
    };
    match object.as_str() {
        "help" => return Ok(text(table::usage())),
        "version" => {
            let v = env!("CARGO_PKG_VERSION");
            return Ok(Output::Text {
                text: format!("redn {v}"),
                json: json!({ "version": v }),
            });
        }
        _ => {}
    }
    let object = table::resolve(object, &table::objects(), "object").map_err(usage_error)?;
    let names: Vec<&str> = table::commands(object).map(|c| c.name).collect();
    let command = match args.get(1).map(String::as_str) {
        None => names[0],
        Some("help") => return Ok(text(table::object_usage(object))),
        Some(c) => table::resolve(c, &names, "command").map_err(usage_error)?,
    };
    let rest = args.get(2..).unwrap_or(&[]);
    let no_args = || {
        if rest.is_empty() {
            Ok(())
        } else {
            Err(usage_error(format!(
                "redn {object} {command} takes no arguments (got {})",
                rest.join(" ")
            )))
        }
    };
    // The admin lists, each command showing its own columns of them.
    let rows_of = |method: &str, key: &str, renames: &[(&str, &str)], columns| {
        let paging = paging(rest, object, command)?;
        Ok(Output::Rows {
            rows: list(opts, method, key, renames, paging)?,
            columns,
        })
    };
    let clients = |columns| {
        rows_of(
            "ListClients",
            "clients",
            &[("pinned", "pinned_bytes")],
            columns,
        )
    };
    let offloads = |columns| rows_of("ListOffloads", "offloads", &[], columns);
    match (object, command) {
        ("completion", shell) => {
            no_args()?;
            let script = table::completion(shell).ok_or_else(|| anyhow!("no {shell} script"))?;
            Ok(Output::Text {
                json: json!({ "shell": shell, "script": script }),
                text: script,
            })
        }
        ("offload", "verify") => offload_verify(rest),
        ("dev", "show") => {
            no_args()?;
            let mut rows = list(opts, "ListDevices", "devices", &[], Paging::default())?;
            // Flat rows, as every -j object is: the drops by reason as one
            // "reason=count,..." string ("-" for none).
            for row in &mut rows {
                if let Some(Value::Object(drops)) = row.remove("packet_drops") {
                    let text: Vec<String> = drops.iter().map(|(k, v)| format!("{k}={v}")).collect();
                    let value = if text.is_empty() {
                        Value::Null
                    } else {
                        Value::String(text.join(","))
                    };
                    row.insert("packet_drops".to_owned(), value);
                }
            }
            Ok(Output::Rows {
                rows,
                columns: &[
                    "ifindex",
                    "ifname",
                    "backend",
                    "node_guid",
                    "pci_address",
                    "dataplane",
                    "packets_dropped",
                ],
            })
        }
        ("client", "show") => clients(&["id", "app", "uid", "pid", "connected", "offloads"]),
        ("client", "kill") => {
            let id = one_number(rest, "ID", object, command)?;
            let reply = admin_call(opts, "KillClient", json!({ "client": id }))?;
            let n = reply
                .get("uninstalled")
                .and_then(Value::as_u64)
                .unwrap_or(0);
            Ok(Output::Text {
                text: format!("client {id} killed, {n} offload(s) uninstalled"),
                json: json!([{ "client": id, "uninstalled": n }]),
            })
        }
        ("offload", "show") => {
            offloads(&["handle", "client", "app", "offload", "queues", "code_bytes"])
        }
        ("stat", "show") => offloads(&[
            "handle",
            "offload",
            "triggers",
            "wqes",
            "errors",
            "remote_clients",
            "remote_terminated",
            "remote_banned",
        ]),
        ("region", "show") => clients(&["id", "app", "regions", "pinned_bytes"]),
        ("remote", "show") => {
            let mut out = rows_of("ListRemoteClients", "remotes", &[], REMOTE_COLUMNS)?;
            if let (false, Output::Rows { rows, .. }) = (opts.json, &mut out) {
                for row in rows {
                    humane_ns(row, "held_ns", "held");
                    humane_ns(row, "idle_ns", "idle");
                }
            }
            Ok(out)
        }
        ("remote", "kill") => {
            let (handle, instance) = match rest {
                [h, i] => (number::<u64>(h, "HANDLE")?, number::<u64>(i, "INSTANCE")?),
                _ => {
                    return Err(usage_error(format!(
                        "redn {object} {command} takes HANDLE INSTANCE (got {})",
                        rest.join(" ")
                    )))
                }
            };
            admin_call(
                opts,
                "DisconnectRemote",
                json!({ "handle": handle, "instance": instance }),
            )?;
            Ok(Output::Text {
                text: format!("remote client {instance} of offload {handle} disconnected"),
                json: json!([{ "handle": handle, "instance": instance }]),
            })
        }
        ("ban", "show") => {
            let mut out = rows_of("ListBans", "bans", &[], &["app", "uid", "address", "left"])?;
            if let (false, Output::Rows { rows, .. }) = (opts.json, &mut out) {
                for row in rows {
                    humane_ns(row, "left_ns", "left");
                }
            }
            Ok(out)
        }
        ("ban", "add") => {
            let [app, address, duration] = rest else {
                return Err(usage_error(format!(
                    "redn {object} {command} takes APP ADDRESS DURATION (got {})",
                    rest.join(" ")
                )));
            };
            let a = ip_address(address)?;
            let seconds = ban_seconds(duration)?;
            let params = json!({ "app": app, "address": a.to_string(), "seconds": seconds });
            let (ended, row) = counted_call(opts, "BanRemote", params, "ended")?;
            Ok(Output::Text {
                text: format!("{a} banned from app {app}'s offloads, {ended} session(s) ended"),
                json: json!([row]),
            })
        }
        ("ban", "lift") => {
            let (app, target) = match rest {
                [app, uid, n] if uid == "uid" => (app, json!({ "uid": number::<u32>(n, "UID")? })),
                [app, address] => (app, json!({ "address": ip_address(address)?.to_string() })),
                _ => {
                    return Err(usage_error(format!(
                        "redn {object} {command} takes APP ADDRESS or APP uid UID (got {})",
                        rest.join(" ")
                    )))
                }
            };
            let mut params = json!({ "app": app });
            if let (Value::Object(p), Value::Object(t)) = (&mut params, target) {
                p.extend(t);
            }
            let (n, row) = counted_call(opts, "LiftBan", params, "lifted")?;
            Ok(Output::Text {
                text: format!("{n} ban(s) lifted"),
                json: json!([row]),
            })
        }
        ("offload", "dump") => {
            let handle = one_number(rest, "HANDLE", object, command)?;
            let reply = admin_call(opts, "Dump", json!({ "handle": handle }))?;
            let listing = reply.get("listing").and_then(Value::as_str).unwrap_or("");
            let addr = reply.get("code_addr").and_then(Value::as_u64).unwrap_or(0);
            let wqes: Vec<&str> = reply
                .get("wqes")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let mut text = format!("offload {handle}: code region at {addr:#x}\n{listing}");
            if !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str("\nWQE blocks as laid out:\n");
            for w in &wqes {
                text.push_str(w);
                text.push('\n');
            }
            Ok(Output::Text {
                text: text.trim_end().to_owned(),
                json: json!([{ "handle": handle, "code_addr": addr, "listing": listing, "wqes": wqes }]),
            })
        }
        ("policy", "reload") => {
            no_args()?;
            let reply = admin_call(opts, "ReloadPolicy", json!({}))?;
            let apps = reply.get("apps").and_then(Value::as_u64).unwrap_or(0);
            Ok(Output::Text {
                text: format!("policy reloaded: {apps} app rule(s)"),
                json: json!([{ "apps": apps }]),
            })
        }
        ("monitor", "follow") => {
            no_args()?;
            monitor(opts)
        }
        (o, c) => Err(anyhow!("redn {o} {c}: not implemented")),
    }
}

/// `redn monitor`: subscribe to `io.redn.Admin.Monitor` (a `more` call) and print each
/// audit record and the counters as they come, until interrupted or the manager hangs up.
/// On a terminal the counters are one line refreshed in place; with `-j`, every reply is
/// one flat JSON object on its own line.
fn monitor(opts: &Options) -> Result<Output> {
    use std::io::{IsTerminal, Write};
    let path = admin_socket(opts)?;
    let mut conn = Connection::connect(&path, CALL_TIMEOUT)
        .with_context(|| format!("cannot reach the manager at {}", path.display()))?;
    let call = format!("{{\"method\":\"{ADMIN}.Monitor\",\"more\":true}}\0");
    conn.send_bytes(call.as_bytes(), &[])
        .context("cannot subscribe")?;
    let tty = !opts.json && std::io::stdout().is_terminal();
    let mut out = std::io::stdout().lock();
    loop {
        let reply = conn
            .read_reply()
            .with_context(|| format!("{ADMIN}.Monitor: the stream ended"))?;
        if let Some(e) = reply.error {
            bail!("{ADMIN}.Monitor: {e}");
        }
        let p = reply.parameters;
        let line = if opts.json {
            let flat = match (p.get("record"), p.get("counters")) {
                (Some(r), _) => json!({ "record": r }),
                (None, Some(c)) => c.clone(),
                (None, None) => Value::Object(p.clone()),
            };
            format!("{flat}\n")
        } else if let Some(r) = p.get("record").and_then(Value::as_str) {
            if tty {
                // Over the refreshing counters line.
                format!("\r\x1b[K{r}\n")
            } else {
                format!("{r}\n")
            }
        } else if let Some(Value::Object(c)) = p.get("counters") {
            let text: Vec<String> = c.iter().map(|(k, v)| format!("{k}={v}")).collect();
            if tty {
                format!("\r\x1b[K{}", text.join(" "))
            } else {
                format!("counters {}\n", text.join(" "))
            }
        } else {
            continue;
        };
        // A closed stdout (`redn monitor | head`) ends the stream.
        if out
            .write_all(line.as_bytes())
            .and_then(|()| out.flush())
            .is_err()
            || !reply.continues
        {
            return Ok(Output::Streamed);
        }
    }
}

/// The single number argument of `object command`.
fn one_number(rest: &[String], name: &str, object: &str, command: &str) -> Result<u64> {
    match rest {
        [one] => number(one, name),
        [] => Err(usage_error(format!("redn {object} {command} needs {name}"))),
        _ => Err(usage_error(format!(
            "redn {object} {command} takes one {name} (got {})",
            rest.join(" ")
        ))),
    }
}

/// Argument `name` as a number.
fn number<T: std::str::FromStr>(given: &str, name: &str) -> Result<T> {
    given
        .parse()
        .map_err(|_| usage_error(format!("{name} must be a number, not {given:?}")))
}

/// The columns `redn remote show` prints (its times as [`humane_ns`] writes them).
const REMOTE_COLUMNS: &[&str] = &[
    "handle", "instance", "app", "offload", "peer", "held", "idle", "triggers",
];

/// Argument `ADDRESS` as an IP address (an IPv4 address written as IPv6, `::ffff:a.b.c.d`,
/// as that IPv4 address, as the manager takes it).
fn ip_address(given: &str) -> Result<std::net::IpAddr> {
    given
        .parse::<std::net::IpAddr>()
        .map(|a| a.to_canonical())
        .map_err(|_| usage_error(format!("ADDRESS: {given:?} is not an IP address")))
}

/// Argument `DURATION` of `ban add` as `BanRemote`'s `seconds` (`None`: for ever): at
/// least a second, and a fraction of one rounds up (the ban is at least as long as asked).
fn ban_seconds(duration: &str) -> Result<Option<u64>> {
    match duration
        .parse::<redn_policy::TimeSpan>()
        .map_err(|e| usage_error(format!("DURATION: {e}")))?
    {
        redn_policy::TimeSpan::Infinite => Ok(None),
        redn_policy::TimeSpan::Finite(d) if d.as_secs() >= 1 => Ok(Some(
            d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0)),
        )),
        redn_policy::TimeSpan::Finite(_) => {
            Err(usage_error("DURATION: at least 1s, or \"infinity\""))
        }
    }
}

/// Call `method` with `params`; the count the reply gives as `key`, and the parameters
/// with that count added, as the command's JSON row.
fn counted_call(opts: &Options, method: &str, params: Value, key: &str) -> Result<(u64, Value)> {
    let reply = admin_call(opts, method, params.clone())?;
    let n = reply.get(key).and_then(Value::as_u64).unwrap_or(0);
    let mut row = params;
    if let Value::Object(r) = &mut row {
        r.insert(key.to_owned(), n.into());
    }
    Ok((n, row))
}

/// The nanoseconds in `row[key]` as people read them in a table (`12.3s`, `4m05s`; null:
/// `infinity`), as `row[name]` in its place.
fn humane_ns(row: &mut Map<String, Value>, key: &str, name: &str) {
    let Some(value) = row.remove(key) else {
        return;
    };
    let Some(ns) = value.as_u64() else {
        row.insert(name.to_owned(), Value::String("infinity".into()));
        return;
    };
    let secs = ns / 1_000_000_000;
    let text = if secs >= 3600 {
        format!("{}h{:02}m", secs / 3600, secs % 3600 / 60)
    } else if secs >= 60 {
        format!("{}m{:02}s", secs / 60, secs % 60)
    } else {
        format!("{}.{}s", secs, ns % 1_000_000_000 / 100_000_000)
    };
    row.insert(name.to_owned(), Value::String(text));
}

/// The admin socket: `-s`, else the config's `[admin] socket` (when `-c` names a config or
/// the default one exists), else the default path.
fn admin_socket(opts: &Options) -> Result<PathBuf> {
    if let Some(s) = &opts.socket {
        return Ok(s.clone());
    }
    let config = opts
        .config
        .clone()
        .or_else(|| Some(PathBuf::from(DEFAULT_MANAGER_CONFIG_PATH)).filter(|p| p.exists()));
    match config {
        Some(path) => Ok(load_manager_config(&path)?.admin.path),
        None => Ok(PathBuf::from(DEFAULT_ADMIN_SOCKET)),
    }
}

/// Call `io.redn.Admin.METHOD`; a named error from the manager becomes the error text.
fn admin_call(opts: &Options, method: &str, parameters: Value) -> Result<Map<String, Value>> {
    let path = admin_socket(opts)?;
    let mut conn = Connection::connect(&path, CALL_TIMEOUT)
        .with_context(|| format!("cannot reach the manager at {}", path.display()))?;
    let Value::Object(parameters) = parameters else {
        bail!("parameters must be an object");
    };
    conn.call_raw(&format!("{ADMIN}.{method}"), parameters, &[])
        .with_context(|| format!("{ADMIN}.{method}"))
}

/// Which part of an admin list to show: all of it (every page the manager has, each from
/// the `next` of the one before), or the one page `--offset` and `--limit` name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Paging {
    offset: Option<u64>,
    limit: Option<u64>,
}

/// The `--offset N` and `--limit N` of a list command, its only arguments.
fn paging(rest: &[String], object: &str, command: &str) -> Result<Paging> {
    let mut p = Paging::default();
    let mut it = rest.iter();
    while let Some(a) = it.next() {
        let (slot, name) = match a.as_str() {
            "--offset" => (&mut p.offset, "--offset"),
            "--limit" => (&mut p.limit, "--limit"),
            _ => {
                return Err(usage_error(format!(
                    "redn {object} {command} takes [--offset N] [--limit N] (got {})",
                    rest.join(" ")
                )))
            }
        };
        let value = it
            .next()
            .ok_or_else(|| usage_error(format!("{name} needs a value")))?;
        if slot.is_some() {
            return Err(usage_error(format!("{name} given twice")));
        }
        *slot = Some(number(value, name)?);
    }
    if p.limit == Some(0) {
        return Err(usage_error("--limit must be at least 1"));
    }
    Ok(p)
}

/// Say `text` on stderr: the rows still print, and a closed stderr is no reason to fail.
fn note(text: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "redn: {text}");
}

/// The array `key` of a list method's replies as rows, with keys renamed so that units are
/// in their names: every page of the list (each asked for at the `next` of the one before),
/// or the one `paging` names, saying on stderr where the next starts. The list may change
/// between two pages (an entry added or gone before the next page's offset moves the rest
/// by one), as between two `redn` runs.
fn list(
    opts: &Options,
    method: &str,
    key: &str,
    renames: &[(&str, &str)],
    paging: Paging,
) -> Result<Vec<Map<String, Value>>> {
    let one_page = paging != Paging::default();
    let mut params = Map::new();
    if let Some(o) = paging.offset {
        params.insert("offset".into(), o.into());
    }
    if let Some(l) = paging.limit {
        params.insert("limit".into(), l.into());
    }
    let mut rows = Vec::new();
    loop {
        let reply = admin_call(opts, method, Value::Object(params.clone()))?;
        let items = reply
            .get(key)
            .and_then(Value::as_array)
            .ok_or_else(|| anyhow!("{method}: the reply has no {key} array"))?;
        for item in items {
            let Value::Object(fields) = item else {
                bail!("{method}: an entry of {key} is not an object");
            };
            rows.push(
                fields
                    .iter()
                    .map(|(k, v)| {
                        let name = renames
                            .iter()
                            .find(|(from, _)| from == k)
                            .map_or(k.as_str(), |(_, to)| to);
                        (name.to_owned(), v.clone())
                    })
                    .collect(),
            );
        }
        let omitted = reply.get("omitted").and_then(Value::as_u64).unwrap_or(0);
        let at = params.get("offset").and_then(Value::as_u64).unwrap_or(0);
        match reply.get("next").and_then(Value::as_u64) {
            Some(next) if one_page => {
                note(&format!("{omitted} more: the next page is --offset {next}"));
                return Ok(rows);
            }
            // An entry larger than one reply may carry (a low pending-output-bytes).
            Some(next) if items.is_empty() || next <= at => {
                note(&format!(
                    "{omitted} more not listed: the entry at --offset {at} is larger than one \
                     reply may carry"
                ));
                return Ok(rows);
            }
            Some(next) => {
                params.insert("offset".into(), next.into());
            }
            None => {
                if omitted > 0 {
                    // A manager that does not page its lists.
                    note(&format!(
                        "{omitted} more not listed: the list is longer than one reply may be"
                    ));
                }
                return Ok(rows);
            }
        }
    }
}

/// `redn offload verify FILE [--policy PATH] [--app NAME]`: the verifier, offline, for
/// every app rule that may install the offload (or the one named), with data regions as
/// large as the rule's pinned quota, as `redn-manager --check` judges them.
fn offload_verify(args: &[String]) -> Result<Output> {
    let mut file = None;
    let mut policy_path = PathBuf::from(DEFAULT_POLICY_PATH);
    let mut app_name = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--policy" => policy_path = it.next().map(PathBuf::from).unwrap_or_default(),
            "--app" => app_name = it.next().cloned(),
            _ if file.is_none() => file = Some(PathBuf::from(a)),
            _ => return Err(usage_error(format!("unexpected argument {a:?}"))),
        }
    }
    let file = file.ok_or_else(|| usage_error("redn offload verify needs FILE"))?;
    let program = load_definition(&file)?;
    let policy = load_policy(&policy_path)?;
    let apps: Vec<_> = match &app_name {
        Some(name) => vec![policy
            .app(name)
            .ok_or_else(|| anyhow!("{}: no app rule {name:?}", policy_path.display()))?],
        None => policy
            .apps()
            .iter()
            .filter(|a| a.allows_offload(&program.name))
            .collect(),
    };
    if apps.is_empty() {
        bail!(
            "{}: no app rule may install offload {:?}",
            policy_path.display(),
            program.name
        );
    }
    let mut rows = Vec::new();
    let mut text = String::new();
    let mut refused = false;
    for app in apps {
        let report = verify(&program, &grants_at_quota(app, &program));
        let accepted = report.accepted() && app.allows_offload(&program.name);
        refused |= !accepted;
        // The log below is the verifier's alone; say what it found when the rule refuses
        // anyway, so that its closing "accepted" is not read as the verdict.
        let verdict = if !app.allows_offload(&program.name) {
            if report.accepted() {
                "refused: the app rule does not list this offload (the verifier alone accepts it)"
            } else {
                "refused: the app rule does not list this offload (and the verifier refuses it)"
            }
        } else if accepted {
            "accepted"
        } else {
            "refused"
        };
        text.push_str(&format!(
            "offload {:?} for app {:?}: {verdict}\n{}\n",
            program.name,
            app.name,
            report.log().trim_end()
        ));
        let mut row = Map::new();
        row.insert("offload".into(), json!(program.name));
        row.insert("app".into(), json!(app.name));
        row.insert("accepted".into(), json!(accepted));
        row.insert("findings".into(), json!(report.findings.len()));
        row.insert(
            "rules".into(),
            json!(report
                .findings
                .iter()
                .map(|f| f.rule.id())
                .collect::<Vec<_>>()
                .join(",")),
        );
        row.insert("log".into(), json!(report.log()));
        rows.push(row);
    }
    let out = Output::Text {
        text: text.trim_end().to_owned(),
        json: Value::Array(rows.into_iter().map(Value::Object).collect()),
    };
    if refused {
        Err(anyhow::Error::new(Refused(out)))
    } else {
        Ok(out)
    }
}

/// Write `text` to stdout; a closed stdout (`redn ... | head`) is not an error worth a
/// panic, which `println!` would make of it.
fn emit(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
}

fn print_output(opts: &Options, out: &Output) {
    let print_json = |v: &Value| {
        if opts.pretty {
            emit(&format!(
                "{}\n",
                serde_json::to_string_pretty(v).unwrap_or_default()
            ));
        } else {
            emit(&format!("{v}\n"));
        }
    };
    match out {
        Output::Rows { rows, .. } if opts.json => {
            print_json(&Value::Array(
                rows.iter().cloned().map(Value::Object).collect(),
            ));
        }
        Output::Text { json, .. } if opts.json => print_json(json),
        Output::Text { text, .. } => emit(&format!("{text}\n")),
        Output::Rows { rows, columns } => emit(&table_text(rows, columns, opts.details)),
        Output::Streamed => {}
    }
}

/// `s` as [`redn_proto::printable`] writes it: a table cell comes from the manager, and some
/// come from its clients (an app's `exe` and `cgroup`, which any local user names), so
/// printed raw one could forge rows or send the admin's terminal escape sequences.
fn printable(s: &str) -> String {
    redn_proto::printable(s).into_owned()
}

/// Rows as aligned columns with a header; every field with `details`.
fn table_text(rows: &[Map<String, Value>], columns: &[&str], details: bool) -> String {
    if rows.is_empty() {
        return String::new();
    }
    let keys: Vec<String> = if details {
        rows[0].keys().cloned().collect()
    } else {
        columns.iter().map(|c| (*c).to_owned()).collect()
    };
    let cell = |row: &Map<String, Value>, k: &str| match row.get(k) {
        Some(Value::String(s)) => printable(s),
        None | Some(Value::Null) => "-".to_owned(),
        Some(v) => v.to_string(),
    };
    let widths: Vec<usize> = keys
        .iter()
        .map(|k| {
            rows.iter()
                .map(|r| cell(r, k).len())
                .chain([k.len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: Vec<String>| {
        let mut s = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect::<Vec<_>>()
            .join("  ");
        s.truncate(s.trim_end().len());
        s.push('\n');
        s
    };
    let mut out = line(keys.iter().map(|k| k.to_uppercase()).collect());
    for r in rows {
        out.push_str(&line(keys.iter().map(|k| cell(r, k)).collect()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ban_durations_round_up_to_whole_seconds_and_refuse_what_is_not_one() {
        let ok = |d: &str| ban_seconds(d).unwrap_or_else(|e| panic!("{d}: {e}"));
        assert_eq!(ok("30m"), Some(1800));
        assert_eq!(ok("1s"), Some(1));
        assert_eq!(ok("1500ms"), Some(2), "not cut to 1s");
        assert_eq!(ok("1h 1ns"), Some(3601));
        assert_eq!(ok("infinity"), None);
        assert_eq!(ok("1000000000000w"), Some(604_800_000_000_000_000));
        for bad in [
            "",
            " ",
            "0",
            "0s",
            "999ms",
            "-1s",
            "1e999s",
            "1.5s",
            "1 s x",
            "s",
            "1x",
            "99999999999999999999999999999999999999999s",
            "１s",
        ] {
            let e = ban_seconds(bad).expect_err(bad);
            assert!(
                e.downcast_ref::<Usage>().is_some(),
                "{bad}: a usage error, {e}"
            );
        }
    }

    #[test]
    fn list_commands_take_an_offset_and_a_limit_and_nothing_else() {
        let args = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let ok = |a: &[&str]| paging(&args(a), "ban", "show").unwrap();
        assert_eq!(ok(&[]), Paging::default(), "every page");
        assert_eq!(
            ok(&["--limit", "5", "--offset", "10"]),
            Paging {
                offset: Some(10),
                limit: Some(5)
            }
        );
        assert_eq!(
            ok(&["--offset", "18446744073709551615"]).offset,
            Some(u64::MAX)
        );
        for bad in [
            &["x"][..],
            &["--offset"],
            &["--offset", "-1"],
            &["--offset", "1.5"],
            &["--limit", "0"],
            &["--limit", "1", "--limit", "2"],
            &["--offset", "18446744073709551616"],
            &["--all"],
        ] {
            let e = paging(&args(bad), "ban", "show").expect_err("refused");
            assert!(e.downcast_ref::<Usage>().is_some(), "{bad:?}: {e}");
        }
    }

    #[test]
    fn table_cells_cannot_forge_rows_or_reach_the_terminal() {
        // An app's exe (any local user names it) with a title-setting OSC sequence, a
        // cursor move and a forged row after a newline.
        let exe = "/tmp/x\x1b]0;owned\x07\x1b[2J\r\n9  0  1  true  /usr/bin/ok\u{9b}31m";
        let mut row = Map::new();
        row.insert("id".into(), json!(7));
        row.insert("exe".into(), json!(exe));
        let text = table_text(&[row], &["id", "exe"], false);
        assert_eq!(text.lines().count(), 2, "a header and one row: {text:?}");
        assert!(
            !text.chars().any(|c| c.is_control() && c != '\n'),
            "{text:?}"
        );
        assert!(
            text.contains("/tmp/x\\x1b]0;owned\\x07\\x1b[2J\\x0d\\x0a9  0"),
            "{text:?}"
        );
        assert!(text.contains("\\x9b31m"), "{text:?}");
        let mut row = Map::new();
        row.insert("cgroup".into(), json!("/user.slice/\u{202e}gpj.exe"));
        let text = table_text(&[row], &["cgroup"], false);
        assert!(text.contains("/user.slice/\\u{202e}gpj.exe"), "{text:?}");
        assert_eq!(printable("plain é"), "plain é", "printable text as it is");
    }
}
