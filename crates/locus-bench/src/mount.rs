//! `locus bench mount`: unmodified programs on `locus mount`, side by side with the same
//! on a local directory and on `locus mount` over the Chirp driver against CCTools'
//! `chirp_server`, at each emulated round-trip time.
//!
//! - The Parrot paper's Figure 4 rows, as system calls from this process: stat,
//!   open+close, read and write of 1 B and 8 KB at offset 0 of an open file, and the
//!   sequential read bandwidth of a large file whose cached pages are dropped first.
//! - An Andrew-like run over a real C source tree (Lua 5.4's, from the cargo registry,
//!   by default): copy it in, `ls -lR`, `grep -r`, build it with `make`, remove it;
//!   timed per stage, in one shell per target; also through `locus run` (its FUSE path
//!   and traced) against the same servers.
//! - PostMark (Debian's `postmark`) on each target.
//! - Each row also on `locus mount --consistency afs` (files written back at close).
//! - `find` over a large tree (Go's standard library sources), on a fresh mount and
//!   again on the same mount, with the mount's callbacks (`--consistency sprite`, the
//!   default) and without (`nfs`).
//!
//! When `sshfs` and `sshd` are installed, sshfs against a loopback sshd (its own
//! configuration and keys in the work directory) is measured beside the others.

use crate::fuse_transports::{transports, UringSetting};
use crate::stats::{median, time_each, Summary};
use crate::BenchError;
use locus_testkit::peers;
use locus_testkit::proxy::DelayProxy;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Options of `locus bench mount`.
#[derive(clap::Args, Debug, Clone)]
pub struct MountArgs {
    /// Timed calls per row.
    #[arg(long, default_value_t = 2000)]
    pub iterations: usize,
    /// Size of the file read sequentially, in MiB.
    #[arg(long, default_value_t = 64)]
    pub size_mb: u64,
    /// Emulated round-trip times in milliseconds, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "0,1")]
    pub rtt_ms: Vec<f64>,
    /// A C source tree for the Andrew-like run (default: Lua 5.4's from the cargo registry).
    #[arg(long)]
    pub tree: Option<PathBuf>,
    /// Repeats of the Andrew-like run (the median per stage is reported).
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    /// The Locus server's `--poll-us` (default: the server's own default).
    #[arg(long)]
    pub poll_us: Option<u64>,
    /// A large tree for the `find` rows, cold (a fresh mount) and warm (default: Go's
    /// standard library sources, `$(go env GOROOT)/src`, if Go is installed).
    #[arg(long)]
    pub find_tree: Option<PathBuf>,
    /// Which parts to run, comma-separated: rows (Figure 4), andrew, postmark, find.
    #[arg(long, value_delimiter = ',', default_value = "rows,andrew,postmark,find")]
    pub workloads: Vec<String>,
    /// How the Locus mounts and `locus run` take the kernel's FUSE requests: auto,
    /// classic, uring, or both (each `--consistency afs` target, mount and run, twice:
    /// over /dev/fuse and over io_uring, side by side). uring and both turn the kernel's
    /// FUSE over io_uring on (root), and back off at the end if it was off.
    #[arg(long, default_value = "auto", value_parser = ["auto", "classic", "uring", "both"])]
    pub fuse_transport: String,
}

/// A FUSE mount (and the `locus mount` process serving it), unmounted when dropped.
pub(crate) struct Mounted {
    child: Option<Child>,
    pub(crate) dir: PathBuf,
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("fusermount3").arg("-u").arg(&self.dir).status();
        if let Some(c) = &mut self.child {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn wait_mounted(dir: &Path, what: &str) -> Result<(), BenchError> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !locus_mount::is_mounted(dir) {
        if Instant::now() > deadline {
            return Err(BenchError::Setup(format!("{what} did not mount on {}", dir.display())));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// A loopback sshd with its own configuration and keys, for sshfs.
struct Sshd {
    child: Child,
    port: u16,
    key: PathBuf,
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_sshd(work: &Path) -> Result<Sshd, String> {
    let sshd = ["/usr/sbin/sshd", "/usr/bin/sshd"].into_iter().find(|p| Path::new(p).exists()).ok_or("no sshd")?;
    peers::which("sshfs").ok_or("no sshfs")?;
    let dir = work.join("sshd");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    for key in ["host_key", "user_key"] {
        let ok = Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-f"])
            .arg(dir.join(key))
            .status()
            .map_err(|e| e.to_string())?;
        if !ok.success() {
            return Err("ssh-keygen failed".into());
        }
    }
    std::fs::copy(dir.join("user_key.pub"), dir.join("authorized_keys")).map_err(|e| e.to_string())?;
    let _ = std::fs::create_dir_all("/run/sshd");
    let port = peers::free_port().map_err(|e| e.to_string())?;
    let config = format!(
        "Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/host_key\nAuthorizedKeysFile {d}/authorized_keys\n\
         PermitRootLogin yes\nPasswordAuthentication no\nUsePAM no\nStrictModes no\nPidFile {d}/sshd.pid\n\
         Subsystem sftp internal-sftp\n",
        d = dir.display()
    );
    std::fs::write(dir.join("sshd_config"), config).map_err(|e| e.to_string())?;
    let child = Command::new(sshd)
        .args(["-D", "-f"])
        .arg(dir.join("sshd_config"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            return Err("sshd did not start".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(Sshd { child, port, key: dir.join("user_key") })
}

fn mount_sshfs(sshd: &Sshd, port: u16, remote: &Path, dir: &Path) -> Result<Mounted, BenchError> {
    std::fs::create_dir_all(dir).map_err(|e| BenchError::io("mkdir", e))?;
    let dir = dir.canonicalize().map_err(|e| BenchError::io("mount point", e))?;
    let user = std::env::var("USER").unwrap_or_else(|_| "root".into());
    let status = Command::new("sshfs")
        .arg(format!("{user}@127.0.0.1:{}", remote.display()))
        .arg(&dir)
        .args(["-p", &port.to_string(), "-o"])
        .arg(format!(
            "IdentityFile={},StrictHostKeyChecking=no,UserKnownHostsFile=/dev/null,LogLevel=ERROR",
            sshd.key.display()
        ))
        .status()
        .map_err(|e| BenchError::io("sshfs", e))?;
    if !status.success() {
        return Err(BenchError::Setup("sshfs failed to mount".into()));
    }
    wait_mounted(&dir, "sshfs")?;
    Ok(Mounted { child: None, dir })
}

/// Go's standard library sources, if Go is installed.
pub(crate) fn go_sources() -> Option<PathBuf> {
    let out = Command::new("go").args(["env", "GOROOT"]).output().ok()?;
    let src = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join("src");
    src.is_dir().then_some(src)
}

/// Seconds `find DIR` takes (its output counted, not printed).
pub(crate) fn find(dir: &Path) -> Result<f64, String> {
    find_under(&[], dir, "")
}

/// `wrapped(wrapper, program)`: the program's command, through `wrapper` (empty, or
/// `locus run ... --`), as admin with `token`.
fn wrapped(wrapper: &[String], program: &str, token: &str) -> Command {
    let mut cmd = match wrapper.split_first() {
        Some((first, args)) => {
            let mut c = Command::new(first);
            c.args(args).arg(program);
            c
        }
        None => Command::new(program),
    };
    cmd.env("LOCUS_TOKEN", format!("admin:{token}")).env_remove("RUST_BACKTRACE");
    cmd
}

/// [`find`] through `wrapper` (see [`wrapped`]).
fn find_under(wrapper: &[String], dir: &Path, token: &str) -> Result<f64, String> {
    let t = Instant::now();
    let out = wrapped(wrapper, "find", token).arg(dir).output().map_err(|e| e.to_string())?;
    if !out.status.success() || out.stdout.is_empty() {
        return Err(format!("find {} failed", dir.display()));
    }
    Ok(t.elapsed().as_secs_f64())
}

/// PostMark in `dir` (through `wrapper`, see [`wrapped`]): its own transactions per
/// second and our wall time of the run.
fn postmark(dir: &Path, work: &Path, transactions: u32, wrapper: &[String], token: &str) -> Result<(f64, f64), String> {
    let cfg = work.join("postmark.cfg");
    std::fs::write(
        &cfg,
        format!("set location {}\nset number 2000\nset transactions {transactions}\nrun\nquit\n", dir.display()),
    )
    .map_err(|e| e.to_string())?;
    // The directory is made by the program, through the target (a mount knows a
    // directory it made is empty: names made there need not be asked for).
    let t = Instant::now();
    let out = wrapped(wrapper, "sh", token)
        .args(["-c", "mkdir -p \"$1\" && exec postmark \"$2\"", "sh"])
        .arg(dir)
        .arg(&cfg)
        .output()
        .map_err(|e| e.to_string())?;
    let secs = t.elapsed().as_secs_f64();
    let text = String::from_utf8_lossy(&out.stdout);
    let tps = text
        .lines()
        .find(|l| l.contains("seconds of transactions"))
        .and_then(|l| l.split('(').nth(1))
        .and_then(|s| s.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("postmark said: {text}"))?;
    Ok((tps, secs))
}

/// `locus mount URL DIR` as admin, once mounted.
pub(crate) fn mount(exe: &Path, url: &str, dir: &Path, token: &str) -> Result<Mounted, BenchError> {
    mount_with(exe, url, dir, token, &[])
}

/// `locus mount FLAGS URL DIR` as admin, once mounted.
pub(crate) fn mount_with(
    exe: &Path,
    url: &str,
    dir: &Path,
    token: &str,
    flags: &[&str],
) -> Result<Mounted, BenchError> {
    std::fs::create_dir_all(dir).map_err(|e| BenchError::io("mkdir", e))?;
    let dir = dir.canonicalize().map_err(|e| BenchError::io("mount point", e))?;
    let child = Command::new(exe)
        .args(["mount", url])
        .args(flags)
        .arg(&dir)
        .env("LOCUS_TOKEN", format!("admin:{token}"))
        .env("LOCUS_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| BenchError::io("locus mount", e))?;
    wait_mounted(&dir, url)?;
    Ok(Mounted { child: Some(child), dir })
}

/// Latency rows by name.
pub(crate) type Rows = Vec<(&'static str, Summary)>;

/// The Figure 4 rows in `dir`; returns (row, summary) and the bandwidth in MB/s.
pub(crate) fn rows(dir: &Path, iterations: usize, size_mb: u64) -> Result<(Rows, f64), String> {
    let e = |e: std::io::Error| e.to_string();
    let small = dir.join("small");
    std::fs::write(&small, vec![b'x'; 8192]).map_err(e)?;
    let f = std::fs::OpenOptions::new().read(true).write(true).open(&small).map_err(e)?;
    let (mut b1, mut b8) = ([0u8; 1], [0u8; 8192]);
    let mut out = Vec::new();
    let mut row = |name, samples: Result<Vec<Duration>, String>| -> Result<(), String> {
        out.push((name, Summary::of(&mut samples?)));
        Ok(())
    };
    row(
        "getpid",
        time_each(iterations, || {
            std::hint::black_box(rustix::process::getpid());
            Ok(())
        }),
    )?;
    row("stat", time_each(iterations, || std::fs::metadata(&small).map(drop).map_err(e)))?;
    row("open+close", time_each(iterations, || File::open(&small).map(drop).map_err(e)))?;
    row("read 1B", time_each(iterations, || f.read_at(&mut b1, 0).map(drop).map_err(e)))?;
    row("read 8KB", time_each(iterations, || f.read_at(&mut b8, 0).map(drop).map_err(e)))?;
    row("write 1B", time_each(iterations, || f.write_at(b"y", 0).map(drop).map_err(e)))?;
    row("write 8KB", time_each(iterations, || f.write_at(&b8, 0).map(drop).map_err(e)))?;
    drop(f);
    let big = dir.join("big");
    {
        let f = File::create(&big).map_err(e)?;
        let chunk = vec![b'z'; 1 << 20];
        for i in 0..size_mb {
            f.write_at(&chunk, i << 20).map_err(e)?;
        }
        f.sync_all().map_err(e)?;
    }
    let f = File::open(&big).map_err(e)?;
    // Cold: drop the file's cached pages so the data crosses the file system again.
    rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed).map_err(|x| x.to_string())?;
    let mut buf = vec![0u8; 1 << 20];
    let t = Instant::now();
    let mut off = 0u64;
    loop {
        let n = f.read_at(&mut buf, off).map_err(e)?;
        if n == 0 {
            break;
        }
        off += n as u64;
    }
    let mbps = off as f64 / 1e6 / t.elapsed().as_secs_f64();
    std::fs::remove_file(&big).map_err(e)?;
    std::fs::remove_file(&small).map_err(e)?;
    Ok((out, mbps))
}

/// The Lua 5.4 sources vendored by mlua, if the cargo registry has them.
fn default_tree() -> Option<PathBuf> {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))?;
    let registry = std::fs::read_dir(home.join("registry/src")).ok()?;
    for index in registry.flatten() {
        for krate in std::fs::read_dir(index.path()).ok()?.flatten() {
            if krate.file_name().to_string_lossy().starts_with("lua-src-") {
                for sub in std::fs::read_dir(krate.path()).ok()?.flatten() {
                    if sub.file_name().to_string_lossy().starts_with("lua-5.4") {
                        return Some(sub.path());
                    }
                }
            }
        }
    }
    None
}

const MAKEFILE: &str = "SRC := $(filter-out lua.c luac.c,$(wildcard *.c))\n\
liblua.a: $(SRC:.c=.o)\n\tar rcs $@ $^\n\
%.o: %.c\n\tcc -O0 -c -o $@ $<\n";

/// The Andrew-like stages in `dir`: (stage, seconds). `tree` holds the sources and the
/// Makefile; the stages run in one shell, through `wrapper` (empty, or `locus run ...
/// --`: one run of the agent for the whole job, as a user would start it), in which
/// `dir` is the path the wrapped program sees. The shell notes the time between stages;
/// the first stage also counts the start (the agent's setup) and the last the end (its
/// write-back).
fn andrew(dir: &Path, tree: &Path, wrapper: &[String], token: &str) -> Result<Vec<(&'static str, f64)>, String> {
    let stages = [
        ("copy", format!("cp -r {} src", tree.display())),
        ("ls -lR", "ls -lR src > /dev/null".to_string()),
        ("grep -r", "grep -r lua_State src > /dev/null".to_string()),
        ("make", "make -s -C src > /dev/null".to_string()),
        ("rm -r", "rm -r src".to_string()),
    ];
    let mut script = format!("cd {} && date +%s.%N", dir.display());
    for (_, stage) in &stages {
        script.push_str(&format!(" && {stage} && date +%s.%N"));
    }
    let now = || SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs_f64();
    let started = now();
    let out = wrapped(wrapper, "sh", token)
        .arg("-c")
        .arg(&script)
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| e.to_string())?;
    let ended = now();
    if !out.status.success() {
        return Err(format!("the Andrew-like job failed in {}", dir.display()));
    }
    let mut marks: Vec<f64> =
        String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| l.trim().parse().ok()).collect();
    if marks.len() != stages.len() + 1 {
        return Err(format!("the Andrew-like job in {} printed {} times", dir.display(), marks.len()));
    }
    marks[0] = started;
    *marks.last_mut().unwrap_or(&mut 0.0) = ended;
    Ok(stages.iter().enumerate().map(|(i, (name, _))| (*name, marks[i + 1] - marks[i])).collect())
}

/// Between two `find` passes, as a user would type them: long enough for what a mount
/// does once a walk pauses (the freshener's 50 ms, then a sweep).
const PAUSE: Duration = Duration::from_millis(500);

/// A row of the `find` table: the medians of the three passes and their ratios to local.
fn find_row(rtt: f64, name: &str, passes: [Vec<f64>; 3], local: (f64, f64)) -> String {
    let [c, w, t] = passes.map(median);
    format!(
        "| {rtt} | {name} | {c:.3} | {w:.3} | {t:.3} | {:.1}x | {:.1}x | {:.1}x |\n",
        c / local.0,
        w / local.1,
        t / local.1
    )
}

/// Runs the benchmark and prints the report.
pub fn run(args: MountArgs) -> Result<(), BenchError> {
    let setup = BenchError::Setup;
    let tree = args.tree.clone().or_else(default_tree).ok_or_else(|| setup("no C source tree: give --tree".into()))?;
    let base = if Path::new("/dev/shm").is_dir() { PathBuf::from("/dev/shm") } else { std::env::temp_dir() };
    let work = tempfile::Builder::new()
        .prefix("locus-bench-mount-")
        .tempdir_in(base)
        .map_err(|e| BenchError::io("temp", e))?;
    let (export, chirp_root, local) =
        (work.path().join("export"), work.path().join("chirp-root"), work.path().join("local"));
    for d in [&export, &chirp_root, &local] {
        std::fs::create_dir_all(d).map_err(|e| BenchError::io("mkdir", e))?;
    }
    let exe = std::env::current_exe().map_err(|e| BenchError::io("current exe", e))?;
    let flags: Vec<String> = args.poll_us.map(|us| format!("--poll-us={us}")).into_iter().collect();
    let (locus, token) = peers::start_locus_with(&exe, work.path(), &export, &flags)?;
    let chirp = peers::start_chirp(work.path(), &chirp_root).ok();
    // The sources with the Makefile that builds them, copied in by the first stage.
    let andrew_tree = work.path().join("andrew-tree");
    let copied = Command::new("cp").arg("-r").arg(&tree).arg(&andrew_tree).status();
    if !copied.is_ok_and(|s| s.success()) {
        return Err(setup(format!("cannot copy {}", tree.display())));
    }
    std::fs::write(andrew_tree.join("Makefile"), MAKEFILE).map_err(|e| BenchError::io("Makefile", e))?;
    let agent = |extra: &[String]| -> Vec<String> {
        let mut w = vec![exe.display().to_string(), "run".to_string()];
        w.extend_from_slice(extra);
        w.push("--".to_string());
        w
    };
    let ssh_root = work.path().join("ssh-root");
    std::fs::create_dir_all(&ssh_root).map_err(|e| BenchError::io("mkdir", e))?;
    let sshd = start_sshd(work.path()).map_err(|e| eprintln!("sshfs not measured: {e}")).ok();
    // The find tree, in each server's export and in the local directory.
    let find_tree = args.find_tree.clone().or_else(go_sources);
    if let Some(t) = &find_tree {
        for root in [&local, &export, &ssh_root] {
            let copied = Command::new("cp").arg("-r").arg(t).arg(root.join("findtree")).status();
            if !copied.is_ok_and(|s| s.success()) {
                return Err(setup(format!("cannot copy {}", t.display())));
            }
        }
    }
    let mut find_out = format!(
        "\n### bench mount: find over {} (median of {} runs, seconds; cold: a fresh mount, warm: the same mount again, third: once more; half a second between passes)\n\n| RTT ms | target | cold | warm | third | cold ÷ local | warm ÷ local | third ÷ local |\n|---|---|---|---|---|---|---|---|\n",
        find_tree.as_ref().map_or("(no tree)".into(), |t| t.display().to_string()),
        args.repeat
    );
    let mut local_find = (0.0, 0.0);
    if find_tree.is_some() {
        let (cold, warm) =
            (find(&local.join("findtree")).map_err(setup)?, find(&local.join("findtree")).map_err(setup)?);
        let runs: Vec<f64> =
            (0..args.repeat).map(|_| find(&local.join("findtree"))).collect::<Result<_, _>>().map_err(setup)?;
        local_find = (cold.min(median(runs.clone())), warm.min(median(runs)));
        find_out.push_str(&format!(
            "| 0 | local | {:.3} | {:.3} | {:.3} | 1.00x | 1.00x | 1.00x |\n",
            local_find.0, local_find.1, local_find.1
        ));
    }
    // PostMark counts whole seconds: at 0 ms enough transactions that local takes some.
    let transactions = |rtt: f64| if rtt == 0.0 { 20_000 } else { 5000 };
    let mut postmark_out = format!(
        "\n### bench mount: PostMark (2000 files; 20000 transactions at 0 ms, 5000 else; median of {} runs)\n\n",
        args.repeat
    );
    postmark_out.push_str("| RTT ms | target | transactions/s (PostMark) | wall s |\n|---|---|---|---|\n");

    let mut out = format!(
        "\n### bench mount: Figure 4 rows (p50 µs; {} calls each) and sequential read of {} MiB\n",
        args.iterations, args.size_mb
    );
    let mut andrew_out = format!(
        "\n### bench mount: Andrew-like run over {} (median of {} runs, seconds)\n",
        tree.display(),
        args.repeat
    );
    andrew_out.push_str("\n| RTT ms | target | copy | ls -lR | grep -r | make | rm -r | total | ÷ local |\n|---|---|---|---|---|---|---|---|---|\n");
    let want = |w: &str| args.workloads.iter().any(|x| x == w);
    let transports = transports(&args.fuse_transport);
    let _uring = UringSetting::on(transports.iter().any(|&(t, _)| t == "uring"))?;
    let (local_rows, local_mbps) =
        if want("rows") { rows(&local, args.iterations, args.size_mb).map_err(setup)? } else { (Vec::new(), 0.0) };
    let mut local_total = 0.0;
    for &rtt in &args.rtt_ms {
        let one_way = Duration::from_secs_f64(rtt / 2000.0);
        let lp = DelayProxy::start(locus.addr, one_way).map_err(|e| BenchError::io("proxy", e))?;
        let mut targets: Vec<(String, PathBuf, Option<Mounted>)> = vec![("local".into(), local.clone(), None)];
        let m = mount(&exe, &format!("locus://{}/", lp.addr), &work.path().join(format!("m-locus-{rtt}")), &token)?;
        targets.push(("locus mount".into(), m.dir.clone(), Some(m)));
        let afs_flags = |cache: &Path, transport: &str| -> Vec<String> {
            ["--consistency", "afs", "--cache-dir", &cache.display().to_string(), "--fuse-transport", transport]
                .map(String::from)
                .to_vec()
        };
        for &(transport, suffix) in &transports {
            let flags = afs_flags(&work.path().join(format!("afs-cache-{rtt}-{transport}")), transport);
            let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
            let dir = work.path().join(format!("m-afs-{rtt}-{transport}"));
            let m = mount_with(&exe, &format!("locus://{}/", lp.addr), &dir, &token, &flags)?;
            targets.push((format!("locus mount --consistency afs{suffix}"), m.dir.clone(), Some(m)));
        }
        let cp = match &chirp {
            Some(c) => Some(DelayProxy::start(c.addr, one_way).map_err(|e| BenchError::io("proxy", e))?),
            None => None,
        };
        if let Some(cp) = &cp {
            let m = mount(&exe, &format!("chirp://{}/", cp.addr), &work.path().join(format!("m-chirp-{rtt}")), &token)?;
            targets.push(("locus mount, Chirp driver → chirp_server".into(), m.dir.clone(), Some(m)));
        }
        let sp = match &sshd {
            Some(s) => Some(
                DelayProxy::start(([127, 0, 0, 1], s.port).into(), one_way).map_err(|e| BenchError::io("proxy", e))?,
            ),
            None => None,
        };
        if let (Some(s), Some(sp)) = (&sshd, &sp) {
            let m = mount_sshfs(s, sp.addr.port(), &ssh_root, &work.path().join(format!("m-sshfs-{rtt}")))?;
            targets.push(("sshfs".into(), m.dir.clone(), Some(m)));
        }
        out.push_str(&format!("\n**RTT {rtt} ms**\n\n| row | "));
        out.push_str(&targets.iter().map(|t| t.0.clone()).collect::<Vec<_>>().join(" | "));
        out.push_str(" |\n|---|");
        out.push_str(&"---|".repeat(targets.len()));
        out.push('\n');
        let mut results = vec![(local_rows.clone(), local_mbps)];
        for (_, dir, _) in targets.iter().skip(1).filter(|_| want("rows")) {
            let sub = dir.join(format!("rows-{rtt}"));
            std::fs::create_dir_all(&sub).map_err(|e| BenchError::io(format!("mkdir {}", sub.display()), e))?;
            results.push(rows(&sub, if rtt > 0.0 { 200 } else { args.iterations }, args.size_mb).map_err(setup)?);
        }
        for (i, (name, _)) in local_rows.iter().enumerate() {
            out.push_str(&format!("| {name} |"));
            for r in &results {
                out.push_str(&format!(" {:.1} |", r.0[i].1.p50));
            }
            out.push('\n');
        }
        if want("rows") {
            out.push_str("| seq read MB/s |");
            for r in &results {
                out.push_str(&format!(" {:.0} |", r.1));
            }
            out.push('\n');
        }
        // `locus run` against the same servers: the Locus driver by /locus/HOST:PORT, the
        // Chirp driver by a logical name.
        let mut andrew_targets: Vec<(String, PathBuf, Vec<String>)> =
            targets.iter().map(|(n, d, _)| (n.clone(), d.clone(), Vec::new())).collect();
        let run_dir = PathBuf::from(format!("/locus/{}/andrew-run", lp.addr));
        std::fs::create_dir_all(export.join("andrew-run")).map_err(|e| BenchError::io("mkdir", e))?;
        let fuse = ["--interpose".to_string(), "fuse".into()];
        andrew_targets.insert(2, ("locus run (FUSE path)".into(), run_dir.clone(), agent(&fuse)));
        let traced = ["--interpose".to_string(), "trace".into()];
        andrew_targets.insert(3, ("locus run (traced)".into(), run_dir.clone(), agent(&traced)));
        // Under afs consistency, as the afs mount (each `locus run` joins the agent that
        // the first one started, which keeps the namespace warm between them).
        let run_cache = |transport: &str| work.path().join(format!("run-afs-cache-{rtt}-{transport}"));
        let run_afs = |cache: &Path, transport: &str| agent(&afs_flags(cache, transport));
        for (k, &(transport, suffix)) in transports.iter().enumerate() {
            let wrapper = run_afs(&run_cache(transport), transport);
            andrew_targets
                .insert(5 + 2 * k, (format!("locus run --consistency afs{suffix}"), run_dir.clone(), wrapper));
        }
        if let Some(cp) = &cp {
            std::fs::create_dir_all(chirp_root.join("andrew-run")).map_err(|e| BenchError::io("mkdir", e))?;
            let _ = Command::new("chmod").args(["-R", "a+rwX"]).arg(&chirp_root).status();
            let flags = ["--mount".to_string(), format!("/chirp=chirp://{}/", cp.addr)];
            andrew_targets.insert(
                6,
                ("locus run, Chirp driver → chirp_server".into(), "/chirp/andrew-run".into(), agent(&flags)),
            );
        }
        for (name, dir, wrapper) in andrew_targets.iter().filter(|_| want("andrew")) {
            if rtt > 0.0 && name == "local" {
                continue;
            }
            let runs: Vec<Vec<(&str, f64)>> = (0..args.repeat)
                .map(|_| andrew(dir, &andrew_tree, wrapper, &token))
                .collect::<Result<_, _>>()
                .map_err(setup)?;
            let stage = |k: usize| median(runs.iter().map(|r| r[k].1).collect());
            let total: f64 = (0..5).map(stage).sum();
            if name == "local" {
                local_total = total;
            }
            andrew_out.push_str(&format!(
                "| {rtt} | {name} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {total:.2} | {:.2}x |\n",
                stage(0),
                stage(1),
                stage(2),
                stage(3),
                stage(4),
                total / local_total
            ));
        }
        if find_tree.is_some() && want("find") {
            // Each run on fresh mounts: the first find is cold, the second warm, the third
            // warm again, each half a second after the one before ([`PAUSE`]: reading a
            // directory from the server marks its access time stale in the kernel, and a
            // second find right after the first would still ask for each directory's
            // attributes). `locus mount` with these flags, or sshfs.
            let afs_kinds: Vec<(String, Vec<String>)> = transports
                .iter()
                .map(|&(t, suffix)| {
                    (
                        format!("locus mount --consistency afs{suffix}"),
                        afs_flags(&work.path().join(format!("afs-find-{t}")), t),
                    )
                })
                .collect();
            let mut kinds: Vec<(String, Option<Vec<String>>)> = vec![("locus mount (callbacks)".into(), Some(vec![]))];
            kinds.extend(afs_kinds.into_iter().map(|(n, f)| (n, Some(f))));
            kinds.push(("locus mount --consistency nfs".into(), Some(vec!["--consistency".into(), "nfs".into()])));
            if sshd.is_some() && sp.is_some() {
                kinds.push(("sshfs".into(), None));
            }
            for (i, (name, flags)) in kinds.iter().enumerate() {
                let mut cold = Vec::new();
                let mut warm = Vec::new();
                let mut third = Vec::new();
                for run in 0..args.repeat {
                    let dir = work.path().join(format!("m-find-{rtt}-{i}-{run}"));
                    let m = match (flags, &sshd, &sp) {
                        (Some(flags), _, _) => {
                            let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
                            mount_with(&exe, &format!("locus://{}/", lp.addr), &dir, &token, &flags)?
                        }
                        (None, Some(s), Some(sp)) => mount_sshfs(s, sp.addr.port(), &ssh_root, &dir)?,
                        (None, _, _) => continue,
                    };
                    for pass in [&mut cold, &mut warm, &mut third] {
                        pass.push(find(&m.dir.join("findtree")).map_err(setup)?);
                        std::thread::sleep(PAUSE);
                    }
                }
                find_out.push_str(&find_row(rtt, name, [cold, warm, third], local_find));
            }
            // `locus run`, each pass a program of its own: the first starts the agent (a
            // cache directory of each repeat's own makes it a new one), the others join it.
            let tree = PathBuf::from(format!("/locus/{}/findtree", lp.addr));
            for &(transport, suffix) in &transports {
                let mut passes = [Vec::new(), Vec::new(), Vec::new()];
                for run in 0..args.repeat {
                    let cache = work.path().join(format!("run-find-cache-{rtt}-{run}-{transport}"));
                    let wrapper = run_afs(&cache, transport);
                    for pass in &mut passes {
                        pass.push(find_under(&wrapper, &tree, &token).map_err(setup)?);
                        std::thread::sleep(PAUSE);
                    }
                }
                let name = format!("locus run --consistency afs{suffix} (a new run each)");
                find_out.push_str(&find_row(rtt, &name, passes, local_find));
            }
        }
        // PostMark on each target, and under `locus run --consistency afs`.
        let mut postmark_targets: Vec<(String, PathBuf, Vec<String>)> =
            targets.iter().map(|(n, d, _)| (n.clone(), d.clone(), Vec::new())).collect();
        let run_root = PathBuf::from(format!("/locus/{}", lp.addr));
        for (k, &(transport, suffix)) in transports.iter().enumerate() {
            let wrapper = run_afs(&run_cache(transport), transport);
            postmark_targets
                .insert(3 + 2 * k, (format!("locus run --consistency afs{suffix}"), run_root.clone(), wrapper));
        }
        for (i, (name, dir, wrapper)) in postmark_targets.iter().enumerate().filter(|_| want("postmark")) {
            if rtt > 0.0 && name == "local" {
                continue;
            }
            let mut runs = Vec::new();
            for repeat in 0..args.repeat {
                // A directory of each target's own, made through it: the Locus mounts
                // share one export, and one mount's run must not start in the directory
                // another made (and holds callbacks on).
                let sub = dir.join(format!("postmark-{rtt}-{i}-{repeat}"));
                runs.push(postmark(&sub, work.path(), transactions(rtt), wrapper, &token));
            }
            match runs.into_iter().collect::<Result<Vec<_>, _>>() {
                Ok(runs) => {
                    let tps = median(runs.iter().map(|r| r.0).collect());
                    let secs = median(runs.iter().map(|r| r.1).collect());
                    postmark_out.push_str(&format!("| {rtt} | {name} | {tps:.0} | {secs:.2} |\n"));
                }
                Err(e) => postmark_out
                    .push_str(&format!("| {rtt} | {name} | failed: {} | |\n", e.lines().next().unwrap_or(""))),
            }
        }
        eprintln!("rtt {rtt} ms done");
    }
    out.push_str("\nThe kernel's page cache serves repeated reads of the same bytes on the mounts (files are reopened only when unchanged); writes go to the server every time.\n");
    print!("{out}{andrew_out}{postmark_out}{find_out}");
    Ok(())
}
