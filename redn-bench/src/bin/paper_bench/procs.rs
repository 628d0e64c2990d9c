//! The processes of a run: the real `redn-manager` on a temp config, and this program again
//! in its roles (the app, writers), steered over their stdin and stdout.

use anyhow::{anyhow, bail, Context, Result};
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long any start-up or command may take before the run gives up.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// The real manager binary: `--manager PATH`, or `redn-manager` beside this program (cargo
/// builds both into the same `target/<profile>/`).
pub fn manager_binary(given: Option<PathBuf>) -> Result<PathBuf> {
    if let Some(p) = given {
        return Ok(p);
    }
    let me = std::env::current_exe().context("this program's path")?;
    let dir = me
        .parent()
        .ok_or_else(|| anyhow!("{} has no folder", me.display()))?;
    // Test binaries live in target/<profile>/deps; the manager one level up.
    for d in [dir, dir.parent().unwrap_or(dir)] {
        let p = d.join("redn-manager");
        if p.is_file() {
            return Ok(p);
        }
    }
    bail!(
        "no redn-manager beside {}: build it (cargo build --release -p redn-manager) or pass \
         --manager PATH",
        me.display()
    )
}

/// A policy for this uid: the offloads the figures install, generous quotas, and the
/// given budget of WQEs per trigger.
pub fn policy(wqes_per_invocation: u32) -> String {
    let uid = nix::unistd::getuid().as_raw();
    format!(
        "[[app]]\nname = \"paper-bench\"\nuid = {uid}\n\
         offloads = [\"hash-get\", \"hash-get-seq\", \"hash-get-par\", \"server-loop\", \
         \"list-find\", \"list-find-break\", \"echo\"]\n\
         max_regions = 16\nmax_pinned = \"1G\"\nmax_queues = 1024\nmax_remote_clients = 64\n\
         [app.client]\nrate_limit_kbps = \"infinity\"\nwqes_per_second = \"infinity\"\n\
         wqes_per_invocation = {wqes_per_invocation}\non_violation = \"terminate\"\n"
    )
}

/// A running `redn-manager`: its temp dir (config, sockets, log), its data plane, and the
/// audit socket its records come to.
pub struct ManagerProc {
    /// The temp dir.
    pub dir: PathBuf,
    child: Child,
    /// `manager.sock`.
    pub api: PathBuf,
    /// The data plane's address.
    pub dataplane: SocketAddr,
    /// Its audit records, each with the time it arrived (a thread reads the socket).
    audit: mpsc::Receiver<(Instant, String)>,
}

impl ManagerProc {
    /// Start `binary` on a fresh config in `dir` (softnic with `pus` PUs, a data plane on a
    /// free loopback port, `policy_text`) and wait for its READY=1.
    pub fn start(binary: &Path, dir: &Path, pus: usize, policy_text: &str) -> Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let api = dir.join("manager.sock");
        // The config takes a fixed port: take a free one from the kernel and let it go.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .context("finding a free port")?
            .port();
        let config = format!(
            "[api]\nsocket = \"{}\"\n[admin]\nsocket = \"{}\"\n[backend]\nkind = \"softnic\"\n\
             pus = {pus}\n[audit]\nsocket = \"{}\"\n[dataplane]\nlisten = \"127.0.0.1:{port}\"\n",
            api.display(),
            dir.join("admin.sock").display(),
            dir.join("audit.sock").display()
        );
        std::fs::write(dir.join("manager.toml"), config).context("writing manager.toml")?;
        std::fs::write(dir.join("policy.toml"), policy_text).context("writing policy.toml")?;
        let sock = UnixDatagram::bind(dir.join("audit.sock")).context("binding audit.sock")?;
        let (tx, audit) = mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 8192];
            loop {
                match sock.recv(&mut buf) {
                    Ok(n) => {
                        let record = String::from_utf8_lossy(&buf[..n]).into_owned();
                        if tx.send((Instant::now(), record)).is_err() {
                            break;
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
        });
        let notify = UnixDatagram::bind(dir.join("notify")).context("binding notify")?;
        notify.set_read_timeout(Some(DEADLINE))?;
        let log = std::fs::File::create(dir.join("manager.log"))?;
        let child = Command::new(binary)
            .arg("--config")
            .arg(dir.join("manager.toml"))
            // Fig. 11 asks for trigger times before each bounded instance is replaced:
            // thousands of admin calls a second.
            .args(["--limit", "requests-per-second=1000000"])
            .env("NOTIFY_SOCKET", dir.join("notify"))
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let mut m = ManagerProc {
            dir: dir.to_owned(),
            child,
            api,
            dataplane: SocketAddr::from(([127, 0, 0, 1], port)),
            audit,
        };
        let mut buf = [0u8; 512];
        loop {
            match notify.recv(&mut buf) {
                Ok(n) if String::from_utf8_lossy(&buf[..n]).contains("READY=1") => break,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    let _ = m.child.kill();
                    bail!("no READY=1 from the manager ({e}); its log:\n{}", m.log());
                }
            }
        }
        Ok(m)
    }

    /// Its stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("manager.log")).unwrap_or_default()
    }

    /// Wait until an audit record containing every one of `parts` arrives (records that do
    /// not match are dropped); when it came, and the record.
    pub fn await_record(&self, parts: &[&str], within: Duration) -> Result<(Instant, String)> {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.audit.recv_timeout(left) {
                Ok((at, text)) if parts.iter().all(|p| text.contains(p)) => return Ok((at, text)),
                Ok(_) => {}
                Err(_) => bail!("no audit record with {parts:?} within {within:?}"),
            }
        }
    }

    /// Drop the audit records that came so far.
    pub fn drain_audit(&self) {
        while self.audit.try_recv().is_ok() {}
    }
}

impl Drop for ManagerProc {
    fn drop(&mut self) {
        if let Ok(pid) = i32::try_from(self.child.id()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        let _ = self.child.wait();
    }
}

/// This program again, in a role, steered line by line over its stdin and stdout.
pub struct Peer {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    what: String,
}

impl Peer {
    /// Start `--role ROLE ARGS…`.
    pub fn start(role: &str, args: &[String]) -> Result<Peer> {
        let me = std::env::current_exe().context("this program's path")?;
        let mut child = Command::new(me)
            .arg("--role")
            .arg(role)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting the {role}"))?;
        let stdout: ChildStdout = child.stdout.take().context("its stdout")?;
        let stdin = child.stdin.take();
        // A thread reads its lines, so that every wait for one can have a deadline.
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Peer {
            child,
            stdin,
            lines,
            what: role.to_owned(),
        })
    }

    /// Send one command line.
    pub fn say(&mut self, line: &str) -> Result<()> {
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| anyhow!("the {} is gone", self.what))?;
        writeln!(stdin, "{line}").with_context(|| format!("telling the {}", self.what))?;
        stdin.flush()?;
        Ok(())
    }

    /// Its next line; an `error …` line is an error.
    pub fn hear(&mut self) -> Result<String> {
        let line = self
            .lines
            .recv_timeout(DEADLINE)
            .map_err(|_| anyhow!("the {} said nothing within {DEADLINE:?}", self.what))?;
        match line.strip_prefix("error ") {
            Some(e) => bail!("the {} failed: {e}", self.what),
            None => Ok(line),
        }
    }

    /// Send a command and read its one-line answer.
    pub fn ask(&mut self, line: &str) -> Result<String> {
        self.say(line)?;
        self.hear()
    }

    /// SIGKILL it and reap it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.stdin = None;
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        // Closing its stdin ends a role's command loop; a writer is killed.
        self.stdin = None;
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        self.kill();
    }
}
