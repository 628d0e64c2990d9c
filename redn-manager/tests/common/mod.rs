//! What the end-to-end test files share: the `Manager` harness that runs the real
//! `redn-manager` binary on a temp-dir config, and small helpers.
// Each test file uses its own subset of these helpers.
#![allow(dead_code)]

use redn_client::{Client, Error as ClientError, ManagerError};
use redn_proto::client::Connection;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

pub const MANAGER: &str = env!("CARGO_BIN_EXE_redn-manager");
/// Every wait in these tests ends by this deadline (a hung manager fails the test).
pub const DEADLINE: Duration = Duration::from_secs(30);

pub fn uid() -> u32 {
    nix::unistd::getuid().as_raw()
}

/// A policy letting this uid install hash-get and echo, with the given extra app keys.
pub fn policy(extra: &str, client_extra: &str) -> String {
    format!(
        "[[app]]\nname = \"tester\"\nuid = {}\noffloads = [\"hash-get\", \"echo\"]\n\
         max_regions = 4\nmax_pinned = \"16M\"\nmax_queues = 16\nmax_remote_clients = 4\n{extra}\n\
         [app.client]\nrate_limit_kbps = \"infinity\"\nwqes_per_second = \"infinity\"\n\
         wqes_per_invocation = 64\non_violation = \"terminate\"\n{client_extra}\n",
        uid()
    )
}

pub struct Manager {
    pub dir: PathBuf,
    pub child: Option<Child>,
    /// The syslog socket the manager's audit records go to.
    pub syslog: Option<UnixDatagram>,
}

impl Manager {
    pub fn api(&self) -> PathBuf {
        self.dir.join("manager.sock")
    }
    pub fn admin(&self) -> PathBuf {
        self.dir.join("admin.sock")
    }
    pub fn config(&self) -> PathBuf {
        self.dir.join("manager.toml")
    }
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("log")).unwrap_or_default()
    }

    /// A temp dir with manager.toml and policy.toml.
    pub fn configure(policy_text: &str) -> Manager {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "redn-e2e-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let m = Manager {
            dir,
            child: None,
            syslog: None,
        };
        std::fs::write(
            m.config(),
            format!(
                "[api]\nsocket = \"{}\"\nmode = \"0660\"\n[admin]\nsocket = \"{}\"\n\
                 [backend]\nkind = \"softnic\"\npus = 1\n[audit]\nsocket = \"{}\"\n",
                m.api().display(),
                m.admin().display(),
                m.dir.join("log.sock").display()
            ),
        )
        .unwrap();
        std::fs::write(m.dir.join("policy.toml"), policy_text).unwrap();
        m
    }

    /// Let any uid open the API socket (mode 0666; the admin socket stays root's). Only the
    /// `mode` key changes: the config's paths hold the test's pid, which may contain "0660".
    pub fn open_api_socket(&self) {
        let config = std::fs::read_to_string(self.config()).unwrap();
        let open = config.replace("mode = \"0660\"", "mode = \"0666\"");
        assert_ne!(open, config, "the config has no mode = \"0660\"");
        std::fs::write(self.config(), open).unwrap();
    }

    /// Start it and wait for READY=1 on a notify socket.
    pub fn start(policy_text: &str, args: &[&str]) -> Manager {
        Manager::start_under(policy_text, args, &[])
    }

    /// Start it as `wrapper` (such as `setpriv --reuid ...`) runs it, in a temp dir any
    /// user may write (the wrapper may drop to another user).
    pub fn start_under_open(policy_text: &str, wrapper: &[&str]) -> Manager {
        Manager::start_under(policy_text, &[], wrapper)
    }

    /// Start it as `wrapper` runs it.
    pub fn start_under(policy_text: &str, args: &[&str], wrapper: &[&str]) -> Manager {
        Manager::configure(policy_text).launch(args, wrapper)
    }

    /// Start it with its audit records going to the syslog socket at `audit_socket` (a real
    /// syslog daemon's), and `offloads` written into its `offloads.d/` (none: the built-in
    /// catalog).
    pub fn start_logging_to(
        policy_text: &str,
        audit_socket: &Path,
        offloads: &[(&str, &str)],
    ) -> Manager {
        let m = Manager::configure(policy_text);
        let config = std::fs::read_to_string(m.config()).unwrap();
        let ours = m.dir.join("log.sock").display().to_string();
        std::fs::write(
            m.config(),
            config.replace(&ours, &audit_socket.display().to_string()),
        )
        .unwrap();
        if !offloads.is_empty() {
            let dir = m.dir.join("offloads.d");
            std::fs::create_dir_all(&dir).unwrap();
            for (name, text) in offloads {
                std::fs::write(dir.join(format!("{name}.toml")), text).unwrap();
            }
        }
        m.launch(&[], &[])
    }

    /// Start it with a data plane on a free loopback port.
    pub fn start_with_dataplane(policy_text: &str) -> Manager {
        Manager::start_with_dataplane_and(policy_text, &[])
    }

    /// Start it with a data plane on a free loopback port and `args`.
    pub fn start_with_dataplane_and(policy_text: &str, args: &[&str]) -> Manager {
        let m = Manager::configure(policy_text);
        // The config refuses port 0: take a free port from the kernel and let it go.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut config = std::fs::read_to_string(m.config()).unwrap();
        config.push_str(&format!("[dataplane]\nlisten = \"127.0.0.1:{port}\"\n"));
        std::fs::write(m.config(), config).unwrap();
        m.launch(args, &[])
    }

    /// Run the configured manager with `args` as `wrapper` runs it; wait for READY=1.
    pub fn launch(self, args: &[&str], wrapper: &[&str]) -> Manager {
        let mut m = self;
        if !wrapper.is_empty() {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&m.dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        }
        let syslog = UnixDatagram::bind(m.dir.join("log.sock")).unwrap();
        syslog.set_read_timeout(Some(DEADLINE)).unwrap();
        m.syslog = Some(syslog);
        let notify = UnixDatagram::bind(m.dir.join("notify")).unwrap();
        notify.set_read_timeout(Some(DEADLINE)).unwrap();
        if !wrapper.is_empty() {
            use std::os::unix::fs::PermissionsExt;
            for f in ["notify", "log.sock"] {
                let open = std::fs::Permissions::from_mode(0o777);
                std::fs::set_permissions(m.dir.join(f), open).unwrap();
            }
        }
        let log = std::fs::File::create(m.dir.join("log")).unwrap();
        let mut command = match wrapper.split_first() {
            Some((program, rest)) => {
                let mut c = Command::new(program);
                c.args(rest).arg(MANAGER);
                c
            }
            None => Command::new(MANAGER),
        };
        {
            use std::os::unix::process::CommandExt;
            // SAFETY: the closure runs in the forked child before exec and makes one prctl
            // system call, which is async-signal-safe (no allocation, no lock taken).
            unsafe {
                command.pre_exec(|| {
                    // A test that nextest kills past its timeout runs no `Drop`: its manager
                    // would live on, orphaned, and load the rest of the run. The kernel kills
                    // it with the test instead (not across a wrapper that changes uid).
                    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                        .map_err(std::io::Error::from)
                });
            }
        }
        let child = command
            .arg("--config")
            .arg(m.config())
            .args(args)
            .env("NOTIFY_SOCKET", m.dir.join("notify"))
            .stderr(log)
            .spawn()
            .unwrap();
        m.child = Some(child);
        let mut buf = [0u8; 512];
        let n = recv(&notify, &mut buf)
            .unwrap_or_else(|e| panic!("no READY=1 from the manager: {e}\n{}", m.log()));
        let msg = String::from_utf8_lossy(&buf[..n]);
        assert!(msg.contains("READY=1"), "{msg}");
        assert!(msg.contains("STATUS="), "{msg}");
        m
    }

    /// Run the binary once on this config with `args`, to its exit.
    pub fn run_once(&self, args: &[&str]) -> std::process::Output {
        Command::new(MANAGER)
            .arg("--config")
            .arg(self.config())
            .args(args)
            .output()
            .unwrap()
    }

    pub fn client(&self) -> Client {
        Client::connect(&self.api()).unwrap()
    }

    pub fn raw(&self, path: &Path) -> Connection {
        Connection::connect(path, DEADLINE).unwrap()
    }

    pub fn admin_call<R: serde::de::DeserializeOwned>(
        &self,
        method: &str,
        params: serde_json::Value,
    ) -> R {
        let mut c = self.raw(&self.admin());
        c.call(method, &params, &[]).unwrap()
    }
}

impl Drop for Manager {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(i32::try_from(c.id()).unwrap()),
                nix::sys::signal::Signal::SIGTERM,
            );
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Call `probe` until it says done (`true`), failing with `what` at the deadline.
pub fn wait_for(what: &str, mut probe: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while !probe() {
        assert!(start.elapsed() < DEADLINE, "{what}");
        std::thread::yield_now();
    }
}

/// One datagram; a signal landing on this test process (libtest runs many tests in it)
/// does not end the wait.
pub fn recv(sock: &UnixDatagram, buf: &mut [u8]) -> std::io::Result<usize> {
    loop {
        match sock.recv(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

/// The app's `io.redn.Manager.Stats` on `c`.
pub fn stats(c: &mut Client) -> redn_proto::api::StatsReply {
    c.connection()
        .call("io.redn.Manager.Stats", &serde_json::json!({}), &[])
        .unwrap()
}

pub fn refused(e: ClientError) -> ManagerError {
    match e {
        ClientError::Refused(m) => m,
        other => panic!("expected a named refusal, got {other:?}"),
    }
}

/// Run `command` to its exit; its stdout. It must succeed and print nothing on stderr.
pub fn stdout_of(command: &mut Command) -> String {
    let out = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{command:?} failed: {stdout}\n{stderr}"
    );
    assert!(out.stderr.is_empty(), "{command:?}: {stderr}");
    stdout
}

/// Skip a test whose tool is missing, saying why; under CI (`CI` set), where `.ci/run`
/// installs every tool, a missing one is a failure.
pub fn skip(reason: &str) {
    assert!(
        std::env::var_os("CI").is_none(),
        "CI must provide this: {reason}"
    );
    println!("skipped: {reason}");
}

pub fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

/// The exchange record a remote client at `ip` sends in its hello, encoded: QP 0x42, PSN 1,
/// and a writable 4 KiB `response` region.
pub fn client_record(ip: &str) -> Vec<u8> {
    qp_record(0x42, 1, format!("{ip}:4791").parse().unwrap())
        .encode()
        .unwrap()
}

/// The exchange record of a remote client's QP `qpn` at `at`, its PSNs from `psn`, with a
/// writable 4 KiB `response` region (at an address and key the client makes up: only the
/// offload's answers use them).
pub fn qp_record(
    qpn: u32,
    psn: u32,
    at: std::net::SocketAddrV4,
) -> redn_sys::softnic::roce::QpRecord {
    let mut record = redn_sys::softnic::roce::QpRecord::new(qpn, psn, at);
    record.regions = vec![redn_sys::softnic::roce::RegionRecord {
        name: "response".into(),
        addr: 0x10_0000,
        rkey: 7,
        len: 4096,
        rights: 2,
    }];
    record
}

/// The data plane's answer to a hello, read off `tcp`.
pub fn read_answer(tcp: &mut std::net::TcpStream) -> redn_proto::dataplane::Answer {
    use redn_proto::dataplane::{Answer, ANSWER_HEADER_LEN};
    use std::io::Read;
    let mut header = [0u8; ANSWER_HEADER_LEN];
    tcp.read_exact(&mut header).unwrap();
    let mut body = vec![0u8; Answer::body_len(&header).unwrap()];
    tcp.read_exact(&mut body).unwrap();
    Answer::decode(&header, &body).unwrap()
}

/// A TCP connection to `endpoint` from `source` (a loopback address of its own: the data
/// plane knows remote clients by address, and the kernel would pick 127.0.0.1).
pub fn connect_from(source: &str, endpoint: &str) -> std::net::TcpStream {
    use nix::sys::socket::{bind, connect, socket, AddressFamily, SockFlag, SockType, SockaddrIn};
    use std::os::fd::AsRawFd;
    let fd = socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .unwrap();
    let from: std::net::SocketAddrV4 = format!("{source}:0").parse().unwrap();
    bind(fd.as_raw_fd(), &SockaddrIn::from(from)).unwrap();
    let to: std::net::SocketAddrV4 = endpoint.parse().unwrap();
    connect(fd.as_raw_fd(), &SockaddrIn::from(to)).unwrap();
    std::net::TcpStream::from(fd)
}

/// Say hello for offload `handle` with `token` at `endpoint` from `source`, as a client
/// there would ([`client_record`]: a UDP port nobody serves, so the session never triggers);
/// the open connection and the answer.
pub fn hello_at(
    source: &str,
    endpoint: &str,
    handle: u64,
    token: &str,
) -> (std::net::TcpStream, redn_proto::dataplane::Answer) {
    use std::io::Write;
    let hello = redn_proto::dataplane::Hello {
        handle,
        token: redn_client::remote::parse_token(token).unwrap(),
        record: client_record(source),
    };
    let mut tcp = connect_from(source, endpoint);
    tcp.set_read_timeout(Some(DEADLINE)).unwrap();
    tcp.write_all(&hello.encode().unwrap()).unwrap();
    let answer = read_answer(&mut tcp);
    (tcp, answer)
}

/// Install server-loop over `r`: its table in the region's first 4 KiB, its values in the
/// next; its handle and a trigger for key 0x2a in the table's first bucket (the key, 6 bytes
/// little-endian, then the bucket's address, 8 bytes big-endian).
pub fn try_install_server_loop(
    c: &mut Client,
    r: &redn_proto::api::RegionRegistered,
) -> redn_client::Result<(u64, Vec<u8>)> {
    let i = c.install(
        "server-loop",
        &[
            ("table", r.region, 0, 4096),
            ("values", r.region, 4096, 4096),
        ],
    )?;
    let mut trigger = vec![0x2a, 0, 0, 0, 0, 0];
    trigger.extend_from_slice(&r.addr.to_be_bytes());
    Ok((i.handle, trigger))
}
