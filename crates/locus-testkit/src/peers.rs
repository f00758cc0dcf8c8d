//! Starting servers as separate processes (`locus serve`, CCTools' chirp_server,
//! XRootD), each on a fresh port, and stopping them when their guard is dropped: the
//! peers the tests and the benchmarks talk to. The benchmarks pin them to CPUs through
//! [`on_server_start`].

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Why a peer could not start.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// The peer is missing or did not come up.
    #[error("{0}")]
    Setup(String),
    /// An I/O error, with what was being done.
    #[error("{0}: {1}")]
    Io(String, #[source] std::io::Error),
}

fn io(what: &str, e: std::io::Error) -> PeerError {
    PeerError::Io(what.to_string(), e)
}

static SERVER_SETUP: OnceLock<fn(&mut Command)> = OnceLock::new();

/// Sets what is done to every server command before it starts (the benchmarks pin
/// servers to their CPUs); the first setting holds.
pub fn on_server_start(setup: fn(&mut Command)) {
    let _ = SERVER_SETUP.set(setup);
}

fn server_command(cmd: &mut Command) -> &mut Command {
    if let Some(setup) = SERVER_SETUP.get() {
        setup(cmd);
    }
    cmd
}

/// A server process that is killed when dropped.
pub struct Peer {
    pub name: &'static str,
    pub addr: SocketAddr,
    child: Child,
}

impl Peer {
    /// The server's process id (tests use it to find and kill its helpers).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_for_port_file(path: &Path, child: &mut Child, what: &str) -> Result<u16, PeerError> {
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        if let Ok(s) = std::fs::read_to_string(path) {
            if let Some(Ok(p)) = s.lines().next().map(|l| l.trim().parse()) {
                return Ok(p);
            }
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(PeerError::Setup(format!("{what} exited at start ({status})")));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(PeerError::Setup(format!("{what} did not report its port")))
}

fn wait_for_listen(addr: SocketAddr, child: &mut Child, what: &str) -> Result<(), PeerError> {
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        if std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(PeerError::Setup(format!("{what} exited at start ({status})")));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(PeerError::Setup(format!("{what} is not listening on {addr}")))
}

/// A port that was free a moment ago, for servers that cannot pick their own.
pub fn free_port() -> Result<u16, PeerError> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| io("bind", e))?;
    Ok(l.local_addr().map_err(|e| io("bind", e))?.port())
}

/// Peers refuse to run as root; when we are root they are told to drop to `nobody`.
fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(1) == Some("0")))
        .unwrap_or(false)
}

/// Makes a directory world-writable so a server that drops to `nobody` can use it.
fn open_up(dir: &Path) -> Result<(), PeerError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).map_err(|e| io("chmod", e))
}

/// `locus serve` from this very binary, exporting `root`; returns the peer and its token.
pub fn start_locus(exe: &Path, work: &Path, root: &Path) -> Result<(Peer, String), PeerError> {
    start_locus_with(exe, work, root, &[])
}

/// `locus serve` with extra flags.
pub fn start_locus_with(exe: &Path, work: &Path, root: &Path, flags: &[String]) -> Result<(Peer, String), PeerError> {
    let state = work.join("locus-state");
    let port_file = work.join("locus.port");
    let _ = std::fs::remove_file(&port_file);
    let mut child = server_command(&mut Command::new(exe))
        .args(["serve", "--listen", "127.0.0.1:0"])
        .arg("--root")
        .arg(root)
        .arg("--state")
        .arg(&state)
        .arg("--port-file")
        .arg(&port_file)
        // Its clients may reach it through delay proxies on this host, at ports of their
        // own: it takes a login made for any port of 127.0.0.1 (see [`crate::proxy`]).
        .args(["--name", "127.0.0.1:*"])
        .args(flags)
        // Its new admin token goes to a credentials file of its own, not the user's.
        .env("LOCUS_HOME", work.join("locus-home"))
        .env("LOCUS_LOG", "warn")
        // A developer's RUST_BACKTRACE would make every error path capture a backtrace.
        .env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| io("start locus serve", e))?;
    let port = wait_for_port_file(&port_file, &mut child, "locus serve")?;
    let tokens = std::fs::read_to_string(state.join("tokens")).map_err(|e| io("read tokens", e))?;
    let token = tokens
        .lines()
        .find_map(|l| l.strip_prefix("admin "))
        .ok_or_else(|| PeerError::Setup("no admin token".into()))?
        .to_string();
    Ok((Peer { name: "locus", addr: ([127, 0, 0, 1], port).into(), child }, token))
}

/// `locus serve` with a Chirp endpoint too (`--chirp-port 0` and `flags`); returns the
/// server, its admin token and the Chirp endpoint's address.
pub fn start_locus_chirp(
    exe: &Path,
    work: &Path,
    root: &Path,
    flags: &[String],
) -> Result<(Peer, String, SocketAddr), PeerError> {
    let mut all = vec!["--chirp-port".to_string(), "0".to_string()];
    all.extend_from_slice(flags);
    let (peer, token) = start_locus_with(exe, work, root, &all)?;
    let ports = std::fs::read_to_string(work.join("locus.port")).map_err(|e| io("read port file", e))?;
    let port = ports
        .lines()
        .find_map(|l| l.strip_prefix("chirp ")?.trim().parse::<u16>().ok())
        .ok_or_else(|| PeerError::Setup("locus serve did not report its Chirp port".into()))?;
    Ok((peer, token, ([127, 0, 0, 1], port).into()))
}

/// CCTools' chirp_server exporting `root`, accepting address authentication from loopback.
pub fn start_chirp(work: &Path, root: &Path) -> Result<Peer, PeerError> {
    start_chirp_with(work, root, &[])
}

/// chirp_server with extra flags (for example `-t 1` to drop clients idle for a second).
pub fn start_chirp_with(work: &Path, root: &Path, flags: &[&str]) -> Result<Peer, PeerError> {
    let bin = which("chirp_server")
        .ok_or_else(|| PeerError::Setup("chirp_server not installed (apt-get install coop-computing-tools)".into()))?;
    let acl = work.join("chirp.acl");
    std::fs::write(&acl, "address:127.0.0.1 rwldpa\n").map_err(|e| io("write chirp acl", e))?;
    let port_file = work.join("chirp.port");
    open_up(root)?;
    let mut cmd = Command::new(bin);
    server_command(&mut cmd);
    cmd.arg("-r").arg(root).args(["-p", "0", "-u", "-", "-a", "address", "-I", "127.0.0.1"]);
    cmd.arg("-A").arg(&acl).arg("-Z").arg(&port_file).arg("-y").arg(root).args(flags);
    if running_as_root() {
        cmd.args(["-i", "nobody"]);
    }
    cmd.stdout(Stdio::null()).stderr(Stdio::null());
    // chirp_server now and then dies of SIGTERM at start while another starts beside it
    // (seen in the tests, two at once on 2 CPUs), so it gets three tries.
    let mut attempts = 0;
    let (mut child, port) = loop {
        attempts += 1;
        let _ = std::fs::remove_file(&port_file);
        let mut child = cmd.spawn().map_err(|e| io("start chirp_server", e))?;
        match wait_for_port_file(&port_file, &mut child, "chirp_server") {
            Ok(port) => break (child, port),
            Err(e) if attempts >= 3 => return Err(e),
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    };
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    wait_for_listen(addr, &mut child, "chirp_server")?;
    Ok(Peer { name: "chirp", addr, child })
}

/// An XRootD server exporting `root`.
pub fn start_xrootd(work: &Path, root: &Path) -> Result<Peer, PeerError> {
    let bin = which("xrootd")
        .ok_or_else(|| PeerError::Setup("xrootd not installed (apt-get install xrootd-server)".into()))?;
    let cfg = work.join("xrootd.cfg");
    std::fs::write(&cfg, format!("all.export /\noss.localroot {}\nxrd.trace off\n", root.display()))
        .map_err(|e| io("write xrootd config", e))?;
    open_up(root)?;
    let port = free_port()?;
    let mut cmd = Command::new(bin);
    server_command(&mut cmd);
    let logs = work.join("xrootd-logs");
    std::fs::create_dir_all(&logs).map_err(|e| io("mkdir", e))?;
    open_up(&logs)?;
    cmd.args(["-p", &port.to_string(), "-n", "locusbench", "-c"]).arg(&cfg).arg("-l").arg(logs.join("xrootd.log"));
    cmd.current_dir(&logs);
    if running_as_root() {
        cmd.args(["-R", "nobody"]);
    }
    let mut child = cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn().map_err(|e| io("start xrootd", e))?;
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    wait_for_listen(addr, &mut child, "xrootd")?;
    Ok(Peer { name: "xrootd", addr, child })
}

/// The full path of a program on PATH.
pub fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| Path::new(d).join(program)).find(|p| p.is_file())
}
