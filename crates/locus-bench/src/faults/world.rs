//! The processes a scenario starts (servers, heads, nodes, mounts) in a world of its own,
//! killed when the world is dropped.

use crate::faults::{NODE, TOKEN};
use crate::BenchError;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------
// Processes

/// A `locus` process (server, node, head or mount); killed when dropped.
pub(super) struct Proc {
    pub(super) child: Child,
    pub(super) log: PathBuf,
}

impl Proc {
    pub(super) fn signal(&self, sig: rustix::process::Signal) {
        if let Some(pid) = rustix::process::Pid::from_raw(self.child.id() as i32) {
            let _ = rustix::process::kill_process(pid, sig);
        }
    }

    /// `kill -9`, and reaps it.
    pub(super) fn kill9(&mut self) {
        self.signal(rustix::process::Signal::KILL);
        let _ = self.child.wait();
    }

    /// Waits up to `limit` for the process to end by itself.
    pub(super) fn wait_exit(&mut self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    pub(super) fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(5)..].join(" | ")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One run's working directory, programs and network helpers.
pub(super) struct World {
    pub(super) exe: PathBuf,
    pub(super) dir: tempfile::TempDir,
    /// Network namespace to remove when done.
    pub(super) netns: Option<String>,
    /// Mount points to detach when done (tmpfs, FUSE).
    pub(super) mounts: Vec<PathBuf>,
}

impl Drop for World {
    fn drop(&mut self) {
        for m in self.mounts.iter().rev() {
            let _ = Command::new("umount").arg("-l").arg(m).stderr(Stdio::null()).status();
        }
        if let Some(ns) = &self.netns {
            let _ = Command::new("ip").args(["netns", "del", ns]).stderr(Stdio::null()).status();
        }
    }
}

pub(super) fn setup(e: impl std::fmt::Display) -> BenchError {
    BenchError::Setup(e.to_string())
}

impl World {
    pub(super) fn new(exe: &Path) -> Result<World, BenchError> {
        let base = if Path::new("/dev/shm").is_dir() { PathBuf::from("/dev/shm") } else { std::env::temp_dir() };
        let dir =
            tempfile::Builder::new().prefix("locus-faults-").tempdir_in(base).map_err(|e| BenchError::io("temp", e))?;
        Ok(World { exe: exe.to_path_buf(), dir, netns: None, mounts: Vec::new() })
    }

    pub(super) fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// A `locus` command with this run's home and the admin's credentials, logging
    /// (appending) to `NAME.log`.
    pub(super) fn locus(&self, name: &str, netns: Option<&str>) -> Result<(Command, PathBuf), BenchError> {
        let mut c = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&self.exe);
                c
            }
            None => Command::new(&self.exe),
        };
        let log = self.path(&format!("{name}.log"));
        let f =
            std::fs::OpenOptions::new().create(true).append(true).open(&log).map_err(|e| BenchError::io("log", e))?;
        c.env("LOCUS_HOME", self.path("home"))
            .env("LOCUS_TOKEN", format!("admin:{TOKEN}"))
            .env("LOCUS_LOG", "warn,locus_server::cluster::node=info")
            .env_remove("RUST_BACKTRACE")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(f));
        // Nothing outlives the bench: if it dies, so do the processes it started.
        // SAFETY: one system call between fork and exec.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut c, || {
                rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
                    .map_err(std::io::Error::from)
            });
        }
        Ok((c, log))
    }

    /// `locus serve FLAGS` named `name` at `addr`, over `NAME/export` and `NAME/state`
    /// (kept across restarts), once it accepts connections.
    pub(super) fn serve(
        &self,
        name: &str,
        addr: &str,
        flags: &[&str],
        netns: Option<&str>,
    ) -> Result<Proc, BenchError> {
        let (root, state) = (self.path(&format!("{name}/export")), self.path(&format!("{name}/state")));
        for d in [&root, &state] {
            std::fs::create_dir_all(d).map_err(|e| BenchError::io("server dirs", e))?;
        }
        let tokens = state.join("tokens");
        if !tokens.exists() {
            std::fs::write(&tokens, format!("admin {TOKEN}\n{NODE} {TOKEN}\n"))
                .map_err(|e| BenchError::io("tokens", e))?;
        }
        let (mut c, log) = self.locus(name, netns)?;
        if flags.contains(&"--data-node") {
            // Data nodes join as the node subject, which may do nothing else at a head.
            c.env("LOCUS_TOKEN", format!("{NODE}:{TOKEN}"));
        }
        c.args(["serve", "--listen", addr, "--threads", "2"]).arg("--root").arg(&root).arg("--state").arg(&state);
        c.args(flags);
        let child = c.spawn().map_err(|e| BenchError::io("locus serve", e))?;
        let mut p = Proc { child, log };
        let deadline = Instant::now() + Duration::from_secs(20);
        let sock: std::net::SocketAddr = addr.parse().map_err(setup)?;
        while std::net::TcpStream::connect_timeout(&sock, Duration::from_millis(200)).is_err() {
            if let Ok(Some(s)) = p.child.try_wait() {
                return Err(setup(format!("{name} exited at start ({s}): {}", p.log_tail())));
            }
            if Instant::now() > deadline {
                return Err(setup(format!("{name} is not listening on {addr}")));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(p)
    }
}

pub(super) fn local_addr() -> Result<String, BenchError> {
    Ok(format!("127.0.0.1:{}", locus_testkit::peers::free_port()?))
}

pub(super) fn sh(args: &[&str]) -> Result<(), BenchError> {
    let out = Command::new(args[0]).args(&args[1..]).output().map_err(|e| BenchError::io(args[0], e))?;
    if !out.status.success() {
        return Err(setup(format!("{}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim())));
    }
    Ok(())
}
