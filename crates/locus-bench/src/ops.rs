//! `locus bench ops`: the Parrot paper's per-operation rows (stat, open+close, read and
//! write of 1 B and 8 KB, sequential bandwidth), measured in one run against Locus,
//! CCTools' chirp_server, XRootD and a bare TCP ping-pong, optionally through the
//! delay proxy. Each target runs `--repeat` times, interleaved; medians are reported.

use crate::placement::Placement;
use crate::stats::{median, time_each, Summary};
use crate::{pingpong, BenchError};
use locus_client::types::open_flags as of;
use locus_client::{blocking, ConnectOptions, CountingSink, Credentials};
use locus_drivers::chirp::ChirpClient;
use locus_testkit::peers::{self, Peer};
use locus_testkit::proxy::DelayProxy;
use serde::Serialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The latency rows, in table order.
pub const ROWS: [&str; 6] = ["stat", "open+close", "read 1B", "read 8KB", "write 1B", "write 8KB"];

/// Options of `locus bench ops`.
#[derive(clap::Args, Debug, Clone)]
pub struct OpsArgs {
    /// Timed calls per latency row and target in each repeat.
    #[arg(long, default_value_t = 2000)]
    pub iterations: usize,
    /// Calls per block: targets take turns in blocks this long, so that every target sees
    /// the machine in the same states (its speed flips between modes within seconds).
    #[arg(long, default_value_t = 100)]
    pub block: usize,
    /// Repeats of every target; the report gives medians across them.
    #[arg(long, default_value_t = 5)]
    pub repeat: usize,
    /// Size of the file for the bandwidth rows, in MiB.
    #[arg(long, default_value_t = 256)]
    pub size_mb: u64,
    /// Emulated round-trip time in milliseconds (a delay proxy in front of every target).
    #[arg(long, default_value_t = 0.0)]
    pub rtt_ms: f64,
    /// Targets to measure, comma-separated: `pingpong` (a blocking echo thread, the floor),
    /// `pingpong-poll` (an echo thread that polls after each reply, as `locus serve` does),
    /// `locus`, `chirp`, `xrootd`.
    #[arg(long, value_delimiter = ',', default_value = "pingpong,pingpong-poll,locus,chirp,xrootd")]
    pub targets: Vec<String>,
    /// Scratch directory for the exported trees (default: /dev/shm, so that the disk's
    /// write-back stalls do not drown the protocols' differences).
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
    /// Worker threads of the Locus server under test (default: one per CPU).
    #[arg(long)]
    pub server_threads: Option<usize>,
    /// The Locus server's `--sendfile` (always, auto, never), to compare its bulk paths.
    #[arg(long, default_value = "always")]
    pub sendfile: String,
    /// The Locus server's `--poll-us` (default: the server's own default).
    #[arg(long)]
    pub poll_us: Option<u64>,
    /// Also save all results (every run) as JSON to this file.
    #[arg(long)]
    pub save: Option<PathBuf>,
    /// Where clients and servers run: `spread` (clients on the first CPU, servers and the
    /// ping-pong's echo thread on the others), `shared` (all on the first CPU) or `free`
    /// (not pinned, so each pair lands wherever the scheduler puts it).
    #[arg(long, value_enum, default_value = "spread")]
    pub placement: Placement,
}

/// One run of one target.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize)]
pub struct RunResult {
    pub rows: BTreeMap<String, Summary>,
    pub read_mbps: f64,
    pub write_mbps: f64,
}

/// Medians of a target's runs.
#[derive(Clone, Debug, Serialize)]
pub struct TargetReport {
    pub target: String,
    pub rows: BTreeMap<String, Summary>,
    pub read_mbps: f64,
    pub write_mbps: f64,
    pub runs: Vec<RunResult>,
}

const SMALL: usize = 16 * 1024;
const WRITE_CHUNK: usize = 8 << 20;
const WRITE_DEPTH: usize = 4;
/// Bulk transfers per target in each repeat (interleaved with the other targets').
const BW_ROUNDS: usize = 3;
/// Chunk of the peers' sequential writes (they do not pipeline).
const BIG_CHUNK: usize = 8 << 20;

fn make_root(work: &Path, name: &str, big: u64) -> Result<PathBuf, BenchError> {
    let root = work.join(name);
    std::fs::create_dir_all(&root).map_err(|e| BenchError::io("mkdir", e))?;
    std::fs::write(root.join("small"), vec![b's'; SMALL]).map_err(|e| BenchError::io("write small", e))?;
    let f = std::fs::File::create(root.join("big")).map_err(|e| BenchError::io("create big", e))?;
    let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
    let block = vec![b'b'; 1 << 20];
    for _ in 0..big / (1 << 20) {
        std::io::Write::write_all(&mut w, &block).map_err(|e| BenchError::io("write big", e))?;
    }
    std::io::Write::flush(&mut w).map_err(|e| BenchError::io("write big", e))?;
    // The write rows overwrite this file in place, so no peer pays for allocating blocks.
    std::fs::copy(root.join("big"), root.join("bigw")).map_err(|e| BenchError::io("write bigw", e))?;
    // Peers that run as `nobody` must be able to write it.
    for f in ["small", "big", "bigw"] {
        std::fs::set_permissions(root.join(f), std::os::unix::fs::PermissionsExt::from_mode(0o666))
            .map_err(|e| BenchError::io("chmod", e))?;
    }
    Ok(root)
}

fn mbps(bytes: u64, took: Duration) -> f64 {
    bytes as f64 / took.as_secs_f64() / 1e6
}

/// A long-lived client of one target that can time any row on demand, so that rows of
/// different targets are measured side by side in the same minute.
trait Driver {
    /// Times `iters` calls of one latency row; returns each call's duration.
    fn row(&mut self, row: &str, iters: usize) -> Result<Vec<Duration>, String>;
    /// Sequential read and write bandwidth in MB/s over `size` bytes.
    fn bandwidth(&mut self, size: u64) -> Result<(f64, f64), String>;
}

/// The bare TCP floor: every row is one small round trip.
struct PingPongDriver(std::net::TcpStream);

impl Driver for PingPongDriver {
    fn row(&mut self, _: &str, iters: usize) -> Result<Vec<Duration>, String> {
        pingpong::measure_on(&mut self.0, iters)
    }
    fn bandwidth(&mut self, _: u64) -> Result<(f64, f64), String> {
        Ok((0.0, 0.0))
    }
}

struct LocusDriver {
    client: blocking::Client,
    read: u64,
    write: u64,
}

impl LocusDriver {
    fn connect(addr: SocketAddr, token: &str) -> Result<LocusDriver, String> {
        let opts = ConnectOptions {
            addr: addr.to_string(),
            credentials: Credentials { subject: "admin".into(), token: token.into() },
            tls_ca: None,
            tls_name: None,
            deadlines: Default::default(),
        };
        let client = blocking::Client::connect(&opts).map_err(|e| e.to_string())?;
        let read = client.run(|c| c.open("/small", of::READ, 0)).map_err(|e| e.to_string())?.handle;
        let write = client
            .run(|c| c.open("/wfile", of::READ | of::WRITE | of::CREATE, 0o644))
            .map_err(|e| e.to_string())?
            .handle;
        Ok(LocusDriver { client, read, write })
    }
}

impl Driver for LocusDriver {
    fn row(&mut self, row: &str, iters: usize) -> Result<Vec<Duration>, String> {
        let (c, r, w) = (&self.client, self.read, self.write);
        let e = |e: locus_client::ClientError| e.to_string();
        let eight = vec![b'y'; 8192];
        match row {
            "stat" => time_each(iters, || c.run(|c| c.stat("/small")).map(drop).map_err(e)),
            "open+close" => time_each(iters, || {
                let h = c.run(|c| c.open("/small", of::READ, 0)).map_err(e)?.handle;
                c.run(|c| c.close(h)).map_err(e)
            }),
            "read 1B" => time_each(iters, || c.run(|c| c.pread(r, 0, 1)).map(drop).map_err(e)),
            "read 8KB" => time_each(iters, || c.run(|c| c.pread(r, 0, 8192)).map(drop).map_err(e)),
            "write 1B" => time_each(iters, || c.run(|c| c.pwrite(w, 0, b"x")).map(drop).map_err(e)),
            "write 8KB" => time_each(iters, || c.run(|c| c.pwrite(w, 0, &eight)).map(drop).map_err(e)),
            other => Err(format!("unknown row {other}")),
        }
    }

    fn bandwidth(&mut self, size: u64) -> Result<(f64, f64), String> {
        let c = &self.client;
        let e = |e: locus_client::ClientError| e.to_string();
        let t = Instant::now();
        let mut sink = CountingSink::default();
        c.run(|c| c.get("/big", &mut sink, |_, _| {})).map_err(e)?;
        let read = mbps(sink.0, t.elapsed());
        let h = c.run(|c| c.open("/bigw", of::WRITE, 0)).map_err(e)?.handle;
        let t = Instant::now();
        c.run(|c| pipelined_write(c, h, size)).map_err(e)?;
        let write = mbps(size, t.elapsed());
        c.run(|c| c.close(h)).map_err(e)?;
        Ok((read, write))
    }
}

/// Sequential writes of 8 MiB (as the peers write) with up to [`WRITE_DEPTH`] in flight.
async fn pipelined_write(c: &locus_client::Client, h: u64, size: u64) -> locus_client::Result<()> {
    let block = bytes::Bytes::from(vec![b'z'; WRITE_CHUNK]);
    let mut inflight = tokio::task::JoinSet::new();
    let mut off = 0u64;
    while off < size {
        if inflight.len() >= WRITE_DEPTH {
            inflight.join_next().await.expect("non-empty").expect("task")?;
        }
        let (c, block) = (c.clone(), block.clone());
        inflight.spawn(async move { c.pwrite(h, off, &block).await });
        off += WRITE_CHUNK as u64;
    }
    while let Some(r) = inflight.join_next().await {
        r.expect("task")?;
    }
    Ok(())
}

struct ChirpDriver {
    client: ChirpClient,
    read: i64,
    write: i64,
}

impl ChirpDriver {
    fn connect(addr: SocketAddr) -> Result<ChirpDriver, String> {
        let mut client = ChirpClient::connect(addr)?;
        let read = client.open("/small", "r", 0)?;
        let write = client.open("/wfile", "rwc", 0o644)?;
        Ok(ChirpDriver { client, read, write })
    }
}

impl Driver for ChirpDriver {
    fn row(&mut self, row: &str, iters: usize) -> Result<Vec<Duration>, String> {
        let (c, r, w) = (&mut self.client, self.read, self.write);
        let mut buf = vec![0u8; 8192];
        let eight = vec![b'y'; 8192];
        match row {
            "stat" => time_each(iters, || c.stat("/small").map(drop)),
            "open+close" => time_each(iters, || {
                let fd = c.open("/small", "r", 0)?;
                c.close(fd)
            }),
            "read 1B" => time_each(iters, || c.pread(r, &mut buf[..1], 0).map(drop)),
            "read 8KB" => time_each(iters, || c.pread(r, &mut buf, 0).map(drop)),
            "write 1B" => time_each(iters, || c.pwrite(w, b"x", 0).map(drop)),
            "write 8KB" => time_each(iters, || c.pwrite(w, &eight, 0).map(drop)),
            other => Err(format!("unknown row {other}")),
        }
    }

    fn bandwidth(&mut self, size: u64) -> Result<(f64, f64), String> {
        let c = &mut self.client;
        let t = Instant::now();
        let n = c.getfile("/big", &mut std::io::sink())?;
        let read = mbps(n, t.elapsed());
        let w = c.open("/bigw", "w", 0)?;
        let block = vec![b'z'; BIG_CHUNK];
        let t = Instant::now();
        let mut off = 0u64;
        while off < size {
            off += c.pwrite(w, &block, off)? as u64;
        }
        let write = mbps(size, t.elapsed());
        c.close(w)?;
        Ok((read, write))
    }
}

/// XRootD through its Python bindings (the C++ client underneath), in one long-lived
/// process driven line by line.
struct XrootdDriver {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    stdout: std::io::BufReader<std::process::ChildStdout>,
}

impl XrootdDriver {
    fn start(python: &Path, script: &Path, addr: SocketAddr) -> Result<XrootdDriver, String> {
        let mut child = std::process::Command::new(python)
            .arg(script)
            .arg(format!("root://{addr}"))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| format!("run {}: {e}", python.display()))?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = std::io::BufReader::new(child.stdout.take().expect("piped"));
        let mut d = XrootdDriver { child, stdin, stdout };
        d.answer::<serde_json::Value>()?;
        Ok(d)
    }

    fn ask<T: serde::de::DeserializeOwned>(&mut self, line: String) -> Result<T, String> {
        std::io::Write::write_all(&mut self.stdin, line.as_bytes()).map_err(|e| format!("xrootd driver: {e}"))?;
        self.answer()
    }

    fn answer<T: serde::de::DeserializeOwned>(&mut self) -> Result<T, String> {
        let mut out = String::new();
        std::io::BufRead::read_line(&mut self.stdout, &mut out).map_err(|e| format!("xrootd driver: {e}"))?;
        serde_json::from_str(&out).map_err(|e| format!("xrootd driver said {out:?}: {e}"))
    }
}

impl Drop for XrootdDriver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Driver for XrootdDriver {
    fn row(&mut self, row: &str, iters: usize) -> Result<Vec<Duration>, String> {
        let us: Vec<f64> = self.ask(format!("row {row} {iters}\n"))?;
        Ok(us.into_iter().map(|u| Duration::from_secs_f64(u / 1e6)).collect())
    }

    fn bandwidth(&mut self, size: u64) -> Result<(f64, f64), String> {
        let v: serde_json::Value = self.ask(format!("bw {size}\n"))?;
        Ok((v["read_mbps"].as_f64().unwrap_or(0.0), v["write_mbps"].as_f64().unwrap_or(0.0)))
    }
}

fn xrootd_python() -> Option<PathBuf> {
    ["/usr/bin/python3", "python3"].iter().map(PathBuf::from).find(|p| {
        std::process::Command::new(p)
            .args(["-c", "import XRootD.client"])
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// A target ready to measure: its driver and what keeps its server (and proxy) alive.
struct Target {
    name: String,
    driver: Box<dyn Driver>,
    _peer: Option<Peer>,
    _proxy: Option<DelayProxy>,
}

/// Starts a target's server (and a delay proxy in front when asked) and connects a driver.
fn start_target(
    name: &str,
    args: &OpsArgs,
    work: &Path,
    size: u64,
    one_way: Duration,
    python: Option<&Path>,
    script: &Path,
) -> Result<Target, BenchError> {
    let setup = |e: String| BenchError::Setup(e);
    let behind_proxy = |addr: SocketAddr| -> Result<(SocketAddr, Option<DelayProxy>), BenchError> {
        if one_way > Duration::ZERO {
            let p = DelayProxy::start(addr, one_way).map_err(|e| BenchError::io("delay proxy", e))?;
            Ok((p.addr, Some(p)))
        } else {
            Ok((addr, None))
        }
    };
    let exe = std::env::current_exe().map_err(|e| BenchError::io("current exe", e))?;
    let (driver, peer, proxy): (Box<dyn Driver>, Option<Peer>, Option<DelayProxy>) = match name {
        "pingpong" | "pingpong-poll" => {
            // The polling echo polls as long as a Locus server does by default.
            let poll = (name == "pingpong-poll")
                .then(|| args.poll_us.map_or(locus_server::config::DEFAULT_POLL_WINDOW, Duration::from_micros));
            let echo = pingpong::start_echo(poll).map_err(|e| BenchError::io("echo", e))?;
            let (addr, proxy) = behind_proxy(echo)?;
            (Box::new(PingPongDriver(pingpong::connect(addr).map_err(setup)?)), None, proxy)
        }
        "locus" => {
            let root = make_root(work, "locus-root", size)?;
            let mut flags = vec![format!("--sendfile={}", args.sendfile)];
            flags.extend(args.server_threads.map(|n| format!("--threads={n}")));
            flags.extend(args.poll_us.map(|us| format!("--poll-us={us}")));
            let (peer, token) = peers::start_locus_with(&exe, work, &root, &flags)?;
            let (addr, proxy) = behind_proxy(peer.addr)?;
            (Box::new(LocusDriver::connect(addr, &token).map_err(setup)?), Some(peer), proxy)
        }
        "chirp" => {
            let root = make_root(work, "chirp-root", size)?;
            let peer = peers::start_chirp(work, &root)?;
            let (addr, proxy) = behind_proxy(peer.addr)?;
            (Box::new(ChirpDriver::connect(addr).map_err(setup)?), Some(peer), proxy)
        }
        "xrootd" => {
            let python = python
                .ok_or_else(|| setup("no python3 with XRootD bindings (apt-get install python3-xrootd)".into()))?;
            let root = make_root(work, "xrootd-root", size)?;
            let peer = peers::start_xrootd(work, &root)?;
            let (addr, proxy) = behind_proxy(peer.addr)?;
            (Box::new(XrootdDriver::start(python, script, addr).map_err(setup)?), Some(peer), proxy)
        }
        other => return Err(setup(format!("unknown target {other:?}"))),
    };
    Ok(Target { name: name.to_string(), driver, _peer: peer, _proxy: proxy })
}

/// Runs the benchmark and prints the report; see [`OpsArgs`].
///
/// Every repeat measures each row for all targets back to back, in a rotating order, so
/// that drifts in the machine's speed hit all targets alike; the ping-pong floor is
/// measured in the same window as every row.
pub fn run(args: OpsArgs) -> Result<(), BenchError> {
    let placed = args.placement.apply().map_err(|e| BenchError::io("pin to CPUs", e))?;
    eprintln!("{placed}");
    let base = args.work_dir.clone().unwrap_or_else(|| {
        let shm = PathBuf::from("/dev/shm");
        if shm.is_dir() {
            shm
        } else {
            std::env::temp_dir()
        }
    });
    let work = tempfile::Builder::new()
        .prefix("locus-bench-")
        .tempdir_in(&base)
        .map_err(|e| BenchError::io(format!("temp dir in {}", base.display()), e))?;
    // Peers that drop root privileges to `nobody` must reach their config and logs here.
    std::fs::set_permissions(work.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .map_err(|e| BenchError::io("chmod work dir", e))?;
    let size = args.size_mb.max(1) << 20;
    let one_way = Duration::from_secs_f64(args.rtt_ms / 2000.0);
    let script = work.path().join("xrootd_ops.py");
    std::fs::write(&script, include_str!("xrootd_ops.py")).map_err(|e| BenchError::io("write script", e))?;
    let python = xrootd_python();

    let mut targets = Vec::new();
    let mut skipped = Vec::new();
    for name in &args.targets {
        match start_target(name, &args, work.path(), size, one_way, python.as_deref(), &script) {
            Ok(t) => targets.push(t),
            Err(e) => {
                eprintln!("skipping {name}: {e}");
                skipped.push(name.clone());
            }
        }
    }

    let repeats = args.repeat.max(1);
    let mut runs: BTreeMap<String, Vec<RunResult>> =
        targets.iter().map(|t| (t.name.clone(), vec![RunResult::default(); repeats])).collect();
    let n = targets.len().max(1);
    for rep in 0..repeats {
        eprintln!("repeat {}/{repeats}", rep + 1);
        for row in ROWS {
            let block = args.block.clamp(1, args.iterations.max(1));
            let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); targets.len()];
            for b in 0..args.iterations.max(1).div_ceil(block) {
                for k in 0..targets.len() {
                    let idx = (k + b) % n;
                    let t = &mut targets[idx];
                    let got = t.driver.row(row, block).map_err(|e| BenchError::Setup(format!("{}: {e}", t.name)))?;
                    samples[idx].extend(got);
                }
            }
            for (t, mut got) in targets.iter().zip(samples) {
                runs.get_mut(&t.name).expect("present")[rep].rows.insert(row.to_string(), Summary::of(&mut got));
            }
        }
        // Bandwidth: BW_ROUNDS transfers per target, taking turns; the repeat keeps their median.
        let mut bw: Vec<(Vec<f64>, Vec<f64>)> = vec![(Vec::new(), Vec::new()); targets.len()];
        for round in 0..BW_ROUNDS {
            for k in 0..targets.len() {
                let idx = (k + rep + round) % n;
                let t = &mut targets[idx];
                if is_floor(&t.name) {
                    continue;
                }
                let (r, w) = t.driver.bandwidth(size).map_err(|e| BenchError::Setup(format!("{}: {e}", t.name)))?;
                bw[idx].0.push(r);
                bw[idx].1.push(w);
            }
        }
        for (t, (r, w)) in targets.iter().zip(bw) {
            let run = &mut runs.get_mut(&t.name).expect("present")[rep];
            (run.read_mbps, run.write_mbps) = (median(r), median(w));
        }
    }

    let reports: Vec<TargetReport> = targets
        .iter()
        .map(|t| {
            let rs = runs.remove(&t.name).unwrap_or_default();
            let rows = ROWS
                .iter()
                .map(|k| {
                    let all: Vec<Summary> = rs.iter().filter_map(|r| r.rows.get(*k).copied()).collect();
                    (k.to_string(), Summary::median(&all))
                })
                .collect();
            TargetReport {
                target: t.name.clone(),
                rows,
                read_mbps: median(rs.iter().map(|r| r.read_mbps).collect()),
                write_mbps: median(rs.iter().map(|r| r.write_mbps).collect()),
                runs: rs,
            }
        })
        .collect();
    print!("{}", render(&args, &placed, &reports, &skipped));
    if let Some(path) = &args.save {
        let v = serde_json::json!({"args": format!("{args:?}"), "placement": placed, "reports": reports, "skipped": skipped});
        std::fs::write(path, serde_json::to_string_pretty(&v).expect("json"))
            .map_err(|e| BenchError::io("write json", e))?;
    }
    Ok(())
}

/// Whether a target is a floor (a ping-pong), with no bandwidth rows.
fn is_floor(target: &str) -> bool {
    target.starts_with("pingpong")
}

/// The report as a Markdown table: per row, the ping-pong floor measured beside it,
/// Locus' p50 (p99), each peer's and the peer ÷ Locus ratio; then bandwidth.
pub fn render(args: &OpsArgs, placed: &str, reports: &[TargetReport], skipped: &[String]) -> String {
    let get = |name: &str| reports.iter().find(|r| r.target == name);
    let pingpong = get("pingpong");
    let locus = get("locus");
    let peers: Vec<&TargetReport> = reports.iter().filter(|r| r.target != "pingpong" && r.target != "locus").collect();
    let cell = |x: Option<&Summary>| x.map_or("-".to_string(), |x| format!("{:.1} ({:.1})", x.p50, x.p99));
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}x", a / b),
        _ => "-".to_string(),
    };
    let mut s = format!(
        "\n### bench ops: {} iterations x {} repeats, {} MiB file, emulated RTT {} ms (medians of repeats); {placed}\n\n",
        args.iterations, args.repeat, args.size_mb, args.rtt_ms
    );
    let mut header = vec!["row".to_string()];
    if pingpong.is_some() {
        header.push("ping-pong p50 µs".into());
    }
    header.push("locus p50 (p99) µs".into());
    if pingpong.is_some() {
        header.push("locus ÷ ping-pong".into());
    }
    // A floor is divided into Locus' time, a peer's time by Locus'.
    let floor = |p: &TargetReport| is_floor(&p.target);
    for p in &peers {
        header.push(format!("{} p50 (p99) µs", p.target));
        header.push(if floor(p) { format!("locus ÷ {}", p.target) } else { format!("{} ÷ locus", p.target) });
    }
    s.push_str(&format!("| {} |\n|{}\n", header.join(" | "), "---|".repeat(header.len())));
    for row in ROWS {
        let l = locus.and_then(|r| r.rows.get(row));
        let mut cells = vec![row.to_string()];
        if let Some(pp) = pingpong {
            let f = pp.rows.get(row);
            cells.push(f.map_or("-".into(), |f| format!("{:.1}", f.p50)));
            cells.push(cell(l));
            cells.push(ratio(l.map(|l| l.p50), f.map(|f| f.p50)));
        } else {
            cells.push(cell(l));
        }
        for p in &peers {
            let v = p.rows.get(row).map(|v| v.p50);
            cells.push(cell(p.rows.get(row)));
            cells.push(if floor(p) { ratio(l.map(|l| l.p50), v) } else { ratio(v, l.map(|l| l.p50)) });
        }
        s.push_str(&format!("| {} |\n", cells.join(" | ")));
    }
    for (label, read) in [("seq read MB/s", true), ("seq write MB/s", false)] {
        let bw = |r: &TargetReport| if read { r.read_mbps } else { r.write_mbps };
        let mut cells = vec![label.to_string()];
        if pingpong.is_some() {
            cells.push(String::new());
        }
        cells.push(locus.map_or("-".into(), |l| format!("{:.0}", bw(l))));
        if pingpong.is_some() {
            cells.push(String::new());
        }
        for p in &peers {
            if floor(p) {
                cells.extend([String::new(), String::new()]);
                continue;
            }
            cells.push(format!("{:.0}", bw(p)));
            cells.push(locus.map_or("-".into(), |l| format!("locus is {}", ratio(Some(bw(l)), Some(bw(p))))));
        }
        s.push_str(&format!("| {} |\n", cells.join(" | ")));
    }
    if !skipped.is_empty() {
        s.push_str(&format!("\nSkipped (not available here): {}\n", skipped.join(", ")));
    }
    s
}
