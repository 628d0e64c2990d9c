//! Command-line options and start-up.

use crate::server::{Server, SocketKind};
use crate::state::{grants_at_quota, Limits, Manager};
use crate::system;
use anyhow::{anyhow, bail, Context};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use redn_policy::config::DEFAULT_MANAGER_CONFIG_PATH;
use redn_policy::{verify, Backend, ManagerConfig, Policy};
use redn_program::program::Program;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const USAGE: &str = "\
Usage: redn-manager [--config PATH] [--check] [--limit NAME=VALUE]...
       redn-manager --help | -h | --version | -V

The RedN offload manager: serves io.redn.Manager (varlink) to local apps on the api
socket and io.redn.Admin on the admin socket, as manager.toml says.

  --config PATH        manager.toml (default /etc/redn/manager.toml); policy.toml and
                       offloads.d/ are read from the same directory (without offloads.d/
                       the built-in catalog is used)
  --check              load the config, the policy and every offload definition, verify
                       each offload for every app rule that may install it, print the
                       problems and exit (0: none)
  --limit NAME=VALUE   change a limit: message-bytes (1048576), fds-per-message (4),
                       nesting (16), requests-per-second (1000), connections (4096),
                       connections-per-uid (1024), regions-per-uid (64),
                       bytes-per-uid (68719476736), pending-output-bytes (4194304),
                       buffered-bytes-per-uid (33554432)
  --help (-h)          this text
  --version (-V)       the version

Sockets come from systemd socket activation (LISTEN_FDS; names manager or varlink,
and admin) or are bound here, each under PATH.lock: a second manager on the same
paths refuses to start. With NOTIFY_SOCKET set, READY=1 is sent once serving.
SIGHUP reloads manager.toml ([audit] at once, other changes need a restart),
policy.toml and offloads.d/, all or nothing: the old stay if one does not load;
SIGTERM and SIGINT uninstall everything and exit 0.
";

/// Parsed options.
#[derive(Debug, Clone)]
pub struct Options {
    /// `--config`.
    pub config: PathBuf,
    /// `--check`.
    pub check: bool,
    /// `--limit`s applied.
    pub limits: Limits,
}

/// What the command line asks for.
#[derive(Debug)]
pub enum Command {
    /// Run (or check) with these options.
    Run(Options),
    /// Print this text and exit 0.
    Print(String),
}

/// Parse the arguments (without the program name).
///
/// # Errors
/// A message naming the bad argument.
pub fn parse_args(args: &[String]) -> Result<Command, String> {
    let mut opts = Options {
        config: PathBuf::from(DEFAULT_MANAGER_CONFIG_PATH),
        check: false,
        limits: Limits::default(),
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_owned())),
            _ => (a.as_str(), None),
        };
        let mut value = |name: &str| {
            inline
                .clone()
                .or_else(|| it.next().cloned())
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match flag {
            "--help" | "-h" => return Ok(Command::Print(USAGE.into())),
            "--version" | "-V" => {
                return Ok(Command::Print(format!(
                    "redn-manager {}\n",
                    env!("CARGO_PKG_VERSION")
                )))
            }
            "--config" => opts.config = PathBuf::from(value("--config")?),
            "--check" => opts.check = true,
            "--limit" => {
                let v = value("--limit")?;
                let (name, n) = v
                    .split_once('=')
                    .ok_or_else(|| format!("--limit {v}: expected NAME=VALUE"))?;
                opts.limits.set(name, n)?;
            }
            _ => return Err(format!("unknown argument {a:?} (see --help)")),
        }
    }
    Ok(Command::Run(opts))
}

/// The binary's main: exit code 0 on success, 1 on a refusal to start, 2 on bad usage.
pub fn main() -> i32 {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match parse_args(&args) {
        Ok(Command::Print(text)) => {
            print!("{text}");
            0
        }
        Ok(Command::Run(opts)) => match run(&opts) {
            Ok(()) => 0,
            Err(e) => {
                eprint!("redn-manager: error: {e}");
                for cause in e.chain().skip(1) {
                    eprint!(": {cause}");
                }
                eprintln!();
                1
            }
        },
        Err(e) => {
            eprintln!("redn-manager: {e}");
            2
        }
    }
}

/// Config, policy and offloads, loaded.
#[derive(Debug)]
pub struct Loaded {
    /// `manager.toml`.
    pub config: ManagerConfig,
    /// `policy.toml`'s path.
    pub policy_path: PathBuf,
    /// `policy.toml`.
    pub policy: Policy,
    /// The offload definitions.
    pub offloads: Vec<Program>,
}

/// Load `manager.toml`, then `policy.toml` and `offloads.d/` beside it.
///
/// # Errors
/// The first file that does not load, naming file, line and key.
pub fn load(config_path: &Path) -> anyhow::Result<Loaded> {
    let config = redn_policy::load_manager_config(config_path)
        .map_err(anyhow::Error::new)
        .context("the manager config did not load")?;
    let dir = config_path.parent().unwrap_or(Path::new("."));
    let policy_path = dir.join("policy.toml");
    let policy = redn_policy::load_policy(&policy_path)
        .map_err(anyhow::Error::new)
        .context("the policy did not load")?;
    let offloads_dir = dir.join("offloads.d");
    let offloads = if offloads_dir.is_dir() {
        redn_policy::load_offloads_dir(&offloads_dir)
            .map_err(anyhow::Error::new)
            .context("an offload definition did not load")?
    } else {
        eprintln!(
            "redn-manager: {} does not exist: using the built-in catalog",
            offloads_dir.display()
        );
        redn_policy::shipped_offloads()
            .map_err(anyhow::Error::new)?
            .into_iter()
            .map(|s| s.program)
            .collect()
    };
    Ok(Loaded {
        config,
        policy_path,
        policy,
        offloads,
    })
}

/// Every problem `--check` finds: offloads a rule names that do not exist, and verifier
/// refusals for each (app rule, offload) it may install, with regions as large as the
/// rule's pinned quota.
pub fn check(loaded: &Loaded) -> Vec<String> {
    let mut problems = Vec::new();
    for app in loaded.policy.apps() {
        for name in &app.offloads {
            let Some(p) = loaded.offloads.iter().find(|p| &p.name == name) else {
                problems.push(format!(
                    "{}: app {:?} may install {name:?}, which no definition provides",
                    loaded.policy_path.display(),
                    app.name
                ));
                continue;
            };
            let report = verify(p, &grants_at_quota(app, p));
            if !report.accepted() {
                problems.push(format!(
                    "app {:?}, offload {name:?}: the verifier refuses it:\n{}",
                    app.name,
                    report.log()
                ));
            }
        }
    }
    problems
}

fn run(opts: &Options) -> anyhow::Result<()> {
    let loaded = load(&opts.config)?;
    if opts.check {
        let problems = check(&loaded);
        for p in &problems {
            println!("{p}");
        }
        if !problems.is_empty() {
            bail!("{} problem(s) found", problems.len());
        }
        println!(
            "ok: {} app rule(s), {} offload definition(s), every allowed offload verified",
            loaded.policy.apps().len(),
            loaded.offloads.len()
        );
        return Ok(());
    }
    // Before any thread exists (the softnic starts its processing units below): block the
    // signals the loop reads through a signalfd; threads inherit the mask.
    let mut mask = SigSet::empty();
    for s in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        mask.add(s);
    }
    mask.thread_block().context("cannot block signals")?;
    let signals = SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)
        .context("cannot create a signalfd")?;

    let mut api = None;
    let mut admin = None;
    for (role, l) in system::activated_sockets()? {
        let slot = if role == "api" { &mut api } else { &mut admin };
        if slot.is_some() {
            bail!("socket activation passed two {role} sockets");
        }
        *slot = Some(system::adopt(l));
    }
    let api = match api {
        Some(s) => s,
        None => system::bind_locked(&loaded.config.api)?,
    };
    let admin = match admin {
        Some(s) => s,
        None => system::bind_locked(&loaded.config.admin)?,
    };

    match system::drop_capabilities() {
        Ok(kept) if kept.is_empty() => {
            eprintln!("redn-manager: capabilities: none held (unprivileged)");
        }
        Ok(kept) => eprintln!("redn-manager: capabilities: kept {}", kept.join(", ")),
        Err(e) => bail!("cannot drop capabilities: {e}"),
    }
    // The data plane's RoCEv2 endpoints are the softnic's own.
    let softnic: Option<Arc<redn_sys::softnic::SoftNic>>;
    let (nic, backend): (Arc<crate::state::DynNic>, String) = match &loaded.config.backend {
        Backend::SoftNic {
            pus,
            prefetch,
            pu_cpus,
        } => {
            if let Some(p) = system::memlock_problem() {
                eprintln!("redn-manager: note (softnic pins nothing): {p}");
            }
            let mut cfg = redn_sys::softnic::SoftNicConfig::new("redn-manager");
            cfg.pus = *pus;
            cfg.prefetch = crate::backend::softnic_prefetch(*prefetch);
            cfg.pu_cpus.clone_from(pu_cpus);
            let nic = redn_sys::softnic::SoftNic::new(cfg).context("cannot start the softnic")?;
            if !pu_cpus.is_empty() {
                let cpus: Vec<String> = pu_cpus.iter().map(ToString::to_string).collect();
                eprintln!(
                    "redn-manager: softnic: {pus} processing unit(s) pinned to CPU(s) {}",
                    cpus.join(",")
                );
            }
            let nic = Arc::new(nic);
            softnic = Some(Arc::clone(&nic));
            (nic, "softnic".into())
        }
        Backend::Mlx5 { device } => {
            let devices = redn_sys::rdma_devices::list().context("cannot list RDMA devices")?;
            let chosen = crate::backend::select_device(device, &devices).map_err(|e| anyhow!(e))?;
            if let Some(p) = system::memlock_problem() {
                bail!("{p}");
            }
            bail!(
                "RDMA device {} found, but this redn-manager's mlx5 backend can only list \
                 devices (its queues are not built yet); use kind = \"softnic\"",
                chosen.name
            )
        }
    };
    let mut limits = opts.limits;
    let dataplane = loaded.config.dataplane.listen.is_some() && softnic.is_some();
    if let Some(note) = limits.fit_fds(system::raise_nofile(), dataplane) {
        eprintln!("redn-manager: note: {note}");
    }
    let manager = Manager::new(
        loaded.policy_path.clone(),
        loaded.policy,
        loaded.offloads,
        nic,
        backend,
        limits,
    );
    let listeners = vec![
        (
            api.listener.try_clone().context("api socket")?,
            SocketKind::Api,
        ),
        (
            admin.listener.try_clone().context("admin socket")?,
            SocketKind::Admin,
        ),
    ];
    let audit = crate::audit::Audit::new(loaded.config.audit.clone());
    let mut server =
        Server::new(manager, listeners, Some(signals), audit).context("cannot set up epoll")?;
    if let (Some(listen), Some(nic)) = (loaded.config.dataplane.listen, softnic) {
        let mut dp = crate::dataplane::Dataplane::bind(listen, nic)
            .with_context(|| format!("cannot listen for remote clients at {listen}"))?;
        dp.set_max_connections(limits.max_dataplane_connections);
        eprintln!(
            "redn-manager: serving remote clients on {}",
            dp.local_addr()
        );
        server.set_dataplane(dp).context("cannot set up epoll")?;
    }
    server.reload_config_from(opts.config.clone(), loaded.config.clone());
    eprintln!(
        "redn-manager: serving io.redn.Manager on {} and io.redn.Admin on {}",
        api.path.display(),
        admin.path.display()
    );
    system::notify(&format!(
        "READY=1\nSTATUS=serving on {} ({} app rules)",
        api.path.display(),
        loaded.policy_path.display()
    ));
    server.run().context("the event loop failed")?;
    system::notify("STOPPING=1");
    drop((api, admin));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Result<Command, String> {
        parse_args(&a.iter().map(ToString::to_string).collect::<Vec<_>>())
    }

    #[test]
    fn options_parse_in_both_forms_and_bad_ones_are_named() {
        let Ok(Command::Run(o)) = args(&["--config=/x/m.toml", "--check", "--limit", "nesting=8"])
        else {
            panic!("a run")
        };
        assert_eq!(o.config, PathBuf::from("/x/m.toml"));
        assert!(o.check);
        assert_eq!(o.limits.codec.max_depth, 8);
        let Ok(Command::Run(o)) = args(&[]) else {
            panic!("a run")
        };
        assert_eq!(o.config, PathBuf::from(DEFAULT_MANAGER_CONFIG_PATH));
        assert!(matches!(args(&["--help"]), Ok(Command::Print(t)) if t.starts_with("Usage:")));
        assert!(
            matches!(args(&["--version"]), Ok(Command::Print(t)) if t.starts_with("redn-manager "))
        );
        assert_eq!(args(&["--config"]).unwrap_err(), "--config needs a value");
        assert!(args(&["--frobnicate"])
            .unwrap_err()
            .contains("\"--frobnicate\""));
        assert!(args(&["--limit", "nesting"])
            .unwrap_err()
            .contains("NAME=VALUE"));
    }
}
