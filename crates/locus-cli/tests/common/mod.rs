//! Helpers shared by the tests that start `locus` processes (`mount.rs`, `run.rs`,
//! `devices.rs`, `python.rs`, `console.rs`); each uses some of them.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Waits until something listens on the loopback `port`.
pub fn wait_for_port(port: u16, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "{what} did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `locus serve` on a fixed port, so it can be stopped and started again.
pub fn serve(root: &Path, state: &Path, port: u16) -> Child {
    serve_with(root, state, port, &[])
}

/// `locus serve` on a fixed port with more flags.
pub fn serve_with(root: &Path, state: &Path, port: u16, flags: &[&std::ffi::OsStr]) -> Child {
    let child = Command::new(env!("CARGO_BIN_EXE_locus"))
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .arg("--root")
        .arg(root)
        .arg("--state")
        .arg(state)
        .args(flags)
        .stderr(Stdio::null())
        .spawn()
        .expect("locus serve");
    wait_for_port(port, "locus serve");
    child
}

/// A child process killed (and waited for) when the test lets go of it, pass or fail.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The admin token a `locus serve` wrote to its state directory.
pub fn admin_token(state: &Path) -> String {
    let tokens = std::fs::read_to_string(state.join("tokens")).unwrap();
    tokens.lines().find_map(|l| l.strip_prefix("admin ")).unwrap().to_string()
}

/// CCTools' chirp_server exporting `WORK/chirp`, which holds `docs/readme.txt` ("chirp says
/// hi"); it drops clients idle for a second, so drivers must reconnect unnoticed.
/// Locus' own Chirp endpoint (dropping clients idle for a second, like [`start_chirp`]'s
/// server), with the same file and the rights chirp_server's test ACL gives loopback.
pub fn start_locus_chirp() -> (locus_testkit::TestServer, std::net::SocketAddr) {
    let server = locus_testkit::TestServer::start();
    server.put_local("docs/readme.txt", b"chirp says hi\n");
    let rights = locus_proto::Rights::parse("rwld").unwrap();
    server.shared().store.acl_set("admin", "/", "address:127.0.0.1", rights).unwrap();
    let idle = std::time::Duration::from_secs(1);
    let addr = server.chirp(locus_server::chirp::ChirpConfig { idle, ..Default::default() });
    (server, addr)
}

pub fn start_chirp(work: &Path) -> (PathBuf, locus_testkit::peers::Peer) {
    let root = work.join("chirp");
    std::fs::create_dir_all(root.join("docs")).unwrap();
    std::fs::write(root.join("docs/readme.txt"), "chirp says hi\n").unwrap();
    let chirp = locus_testkit::peers::start_chirp_with(work, &root, &["-t", "1"])
        .expect("chirp_server (coop-computing-tools) runs");
    // chirp_server runs as nobody: what it creates must be writable by it.
    Command::new("chmod").args(["-R", "a+rwX"]).arg(&root).status().unwrap();
    (root, chirp)
}

/// Runs `cmd`, failing the test with the command line if it fails.
pub fn run_ok(cmd: &mut Command) {
    let shown = format!("{cmd:?}");
    let status = cmd.status().unwrap_or_else(|e| panic!("{shown}: {e}"));
    assert!(status.success(), "{shown} failed: {status}");
}

/// A Python virtual environment under `target/NAME` with `packages` installed (made once,
/// reused by later runs); answers its directory.
pub fn python_venv(name: &str, packages: &[&str]) -> PathBuf {
    let venv = repo().join("target").join(name);
    if !venv.join("bin/pip").exists() {
        run_ok(Command::new("python3").arg("-m").arg("venv").arg(&venv));
    }
    run_ok(Command::new(venv.join("bin/pip")).args(["install", "-q", "--disable-pip-version-check"]).args(packages));
    venv
}

/// The repository's top directory.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("the repository")
}

/// A `locus mount` process and its mount point, unmounted (lazily if need be) and
/// stopped when dropped.
pub struct Mount {
    pub child: Child,
    pub mnt: PathBuf,
}

impl Drop for Mount {
    fn drop(&mut self) {
        if locus_mount::is_mounted(&self.mnt) {
            let _ = Command::new(env!("CARGO_BIN_EXE_locus")).arg("umount").arg(&self.mnt).status();
        }
        if locus_mount::is_mounted(&self.mnt) {
            let _ = Command::new("fusermount3").arg("-u").arg("-z").arg(&self.mnt).status();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `locus mount URL MNT FLAGS...` as admin with `token` and `home` as `LOCUS_HOME`, once
/// the mount is there (within 20 s).
pub fn spawn_mount(url: &str, mnt: &Path, home: &Path, token: &str, flags: &[&str]) -> Mount {
    std::fs::create_dir_all(mnt).unwrap();
    let mnt = mnt.canonicalize().unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_locus"))
        .args(["mount", url])
        .args(flags)
        .arg(&mnt)
        .env("LOCUS_HOME", home)
        .env("LOCUS_TOKEN", format!("admin:{token}"))
        .spawn()
        .expect("locus mount");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !locus_mount::is_mounted(&mnt) {
        assert!(Instant::now() < deadline, "not mounted after 20 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    Mount { child, mnt }
}

/// `locus run --interpose fuse FLAGS -- sh` as admin with `token` and `home` as
/// `LOCUS_HOME`, the program holding the run's namespace while the test looks into it
/// through `/proc/PID/root`: the answer's `mnt` is where the program sees `url` (a
/// `locus://HOST:PORT/path`, as `/locus/HOST:PORT/path`). Dropped, the run is killed
/// (its program with it), and its agent ends a second later (`--keep-warm 1`).
pub fn spawn_run(url: &str, home: &Path, token: &str, flags: &[&str]) -> Mount {
    std::fs::create_dir_all(home).unwrap();
    let pidfile = home.join("program.pid");
    let _ = std::fs::remove_file(&pidfile);
    let child = Command::new(env!("CARGO_BIN_EXE_locus"))
        .args(["run", "--interpose", "fuse", "--keep-warm", "1"])
        .args(flags)
        .args([
            "--",
            "sh",
            "-c",
            &format!("echo $$ > {}.new && mv {0}.new {0} && exec sleep 100000", pidfile.display()),
        ])
        .env("LOCUS_HOME", home)
        .env("LOCUS_TOKEN", format!("admin:{token}"))
        .spawn()
        .expect("locus run");
    let deadline = Instant::now() + Duration::from_secs(20);
    let pid = loop {
        if let Ok(pid) = std::fs::read_to_string(&pidfile) {
            break pid.trim().to_string();
        }
        assert!(Instant::now() < deadline, "the program under locus run did not start in 20 s");
        std::thread::sleep(Duration::from_millis(20));
    };
    let rest = url.strip_prefix("locus://").expect("a locus:// URL");
    let mnt = PathBuf::from(format!("/proc/{pid}/root/locus/{rest}"));
    assert!(within(Duration::from_secs(20), || mnt.is_dir()), "{} is not there", mnt.display());
    Mount { child, mnt }
}

/// Retries `check` for up to `limit`, every 5 ms: a break travels one way on its own
/// connection, and a mount's background store takes its time.
pub fn within(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if check() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
