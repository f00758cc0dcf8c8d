//! `locus bench ops`: the Parrot paper's per-operation rows (stat, open+close, read and
//! write of 1 B and 8 KB, sequential bandwidth), measured in one run against Locus,
//! CCTools' chirp_server, XRootD and a bare TCP ping-pong, optionally through the
//! delay proxy. Each target runs `--repeat` times, interleaved; medians are reported.

use crate::chirp::ChirpClient;
use crate::peers::{self, Peer};
use crate::proxy::DelayProxy;
use crate::stats::{median, time_each, Summary};
use crate::{pingpong, BenchError};
use locus_client::types::open_flags as of;
use locus_client::{blocking, ConnectOptions, CountingSink, Credentials};
use serde::Serialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The latency rows, in table order.
pub const ROWS: [&str; 6] = [
    "stat",
    "open+close",
    "read 1B",
    "read 8KB",
    "write 1B",
    "write 8KB",
];

/// Options of `locus bench ops`.
#[derive(clap::Args, Debug, Clone)]
pub struct OpsArgs {
    /// Timed calls per latency row (after a short warm-up).
    #[arg(long, default_value_t = 2000)]
    pub iterations: usize,
    /// Repeats of every target; the report gives medians across them.
    #[arg(long, default_value_t = 5)]
    pub repeat: usize,
    /// Size of the file for the bandwidth rows, in MiB.
    #[arg(long, default_value_t = 256)]
    pub size_mb: u64,
    /// Emulated round-trip time in milliseconds (a delay proxy in front of every target).
    #[arg(long, default_value_t = 0.0)]
    pub rtt_ms: f64,
    /// Targets to measure, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "pingpong,locus,chirp,xrootd"
    )]
    pub targets: Vec<String>,
    /// Scratch directory for the exported trees (default: /dev/shm, so that the disk's
    /// write-back stalls do not drown the protocols' differences).
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
    /// Also save all results (every run) as JSON to this file.
    #[arg(long)]
    pub save: Option<PathBuf>,
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
/// Chunk of the peers' sequential writes (they do not pipeline).
const BIG_CHUNK: usize = 8 << 20;

fn make_root(work: &Path, name: &str, big: u64) -> Result<PathBuf, BenchError> {
    let root = work.join(name);
    std::fs::create_dir_all(&root).map_err(|e| BenchError::io("mkdir", e))?;
    std::fs::write(root.join("small"), vec![b's'; SMALL])
        .map_err(|e| BenchError::io("write small", e))?;
    let f = std::fs::File::create(root.join("big")).map_err(|e| BenchError::io("create big", e))?;
    let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
    let block = vec![b'b'; 1 << 20];
    for _ in 0..big / (1 << 20) {
        std::io::Write::write_all(&mut w, &block).map_err(|e| BenchError::io("write big", e))?;
    }
    std::io::Write::flush(&mut w).map_err(|e| BenchError::io("write big", e))?;
    // The write rows overwrite this file in place, so no peer pays for allocating blocks.
    std::fs::copy(root.join("big"), root.join("bigw"))
        .map_err(|e| BenchError::io("write bigw", e))?;
    // Peers that run as `nobody` must be able to write it.
    for f in ["small", "big", "bigw"] {
        std::fs::set_permissions(
            root.join(f),
            std::os::unix::fs::PermissionsExt::from_mode(0o666),
        )
        .map_err(|e| BenchError::io("chmod", e))?;
    }
    Ok(root)
}

fn mbps(bytes: u64, took: Duration) -> f64 {
    bytes as f64 / took.as_secs_f64() / 1e6
}

fn measure_locus(
    addr: SocketAddr,
    token: &str,
    iters: usize,
    size: u64,
) -> Result<RunResult, String> {
    let opts = ConnectOptions {
        addr: addr.to_string(),
        credentials: Credentials {
            subject: "admin".into(),
            token: token.into(),
        },
        tls_ca: None,
        tls_name: None,
    };
    let c = blocking::Client::connect(&opts).map_err(|e| e.to_string())?;
    let e = |e: locus_client::ClientError| e.to_string();
    let mut r = RunResult::default();
    r.rows.insert(
        "stat".into(),
        time_each(iters, || c.run(|c| c.stat("/small")).map(drop).map_err(e))?,
    );
    r.rows.insert(
        "open+close".into(),
        time_each(iters, || {
            let h = c.run(|c| c.open("/small", of::READ, 0)).map_err(e)?.handle;
            c.run(|c| c.close(h)).map_err(e)
        })?,
    );
    let h = c.run(|c| c.open("/small", of::READ, 0)).map_err(e)?.handle;
    r.rows.insert(
        "read 1B".into(),
        time_each(iters, || c.run(|c| c.pread(h, 0, 1)).map(drop).map_err(e))?,
    );
    r.rows.insert(
        "read 8KB".into(),
        time_each(iters, || {
            c.run(|c| c.pread(h, 0, 8192)).map(drop).map_err(e)
        })?,
    );
    let w = c
        .run(|c| c.open("/wfile", of::READ | of::WRITE | of::CREATE, 0o644))
        .map_err(e)?
        .handle;
    let eight = vec![b'y'; 8192];
    r.rows.insert(
        "write 1B".into(),
        time_each(iters, || {
            c.run(|c| c.pwrite(w, 0, b"x")).map(drop).map_err(e)
        })?,
    );
    r.rows.insert(
        "write 8KB".into(),
        time_each(iters, || {
            c.run(|c| c.pwrite(w, 0, &eight)).map(drop).map_err(e)
        })?,
    );

    let t = Instant::now();
    let mut sink = CountingSink::default();
    c.run(|c| c.get("/big", &mut sink, |_, _| {})).map_err(e)?;
    r.read_mbps = mbps(sink.0, t.elapsed());

    let bw = c.run(|c| c.open("/bigw", of::WRITE, 0)).map_err(e)?.handle;
    let t = Instant::now();
    c.run(|c| pipelined_write(c, bw, size)).map_err(e)?;
    r.write_mbps = mbps(size, t.elapsed());
    Ok(r)
}

/// Sequential writes of 8 MiB (as the peers write) with up to [`WRITE_DEPTH`] in flight on one connection.
async fn pipelined_write(c: &locus_client::Client, h: u64, size: u64) -> locus_client::Result<()> {
    let block = bytes::Bytes::from(vec![b'z'; WRITE_CHUNK]);
    let mut inflight = tokio::task::JoinSet::new();
    let mut off = 0u64;
    while off < size {
        if inflight.len() >= WRITE_DEPTH {
            inflight
                .join_next()
                .await
                .expect("non-empty")
                .expect("task")?;
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

fn measure_chirp(addr: SocketAddr, iters: usize, size: u64) -> Result<RunResult, String> {
    let mut c = ChirpClient::connect(addr)?;
    let mut r = RunResult::default();
    r.rows.insert(
        "stat".into(),
        time_each(iters, || c.stat("/small").map(drop))?,
    );
    r.rows.insert(
        "open+close".into(),
        time_each(iters, || {
            let fd = c.open("/small", "r", 0)?;
            c.close(fd)
        })?,
    );
    let fd = c.open("/small", "r", 0)?;
    let mut buf = vec![0u8; 8192];
    r.rows.insert(
        "read 1B".into(),
        time_each(iters, || c.pread(fd, &mut buf[..1], 0).map(drop))?,
    );
    let mut buf = vec![0u8; 8192];
    r.rows.insert(
        "read 8KB".into(),
        time_each(iters, || c.pread(fd, &mut buf, 0).map(drop))?,
    );
    let w = c.open("/wfile", "rwc", 0o644)?;
    let eight = vec![b'y'; 8192];
    r.rows.insert(
        "write 1B".into(),
        time_each(iters, || c.pwrite(w, b"x", 0).map(drop))?,
    );
    r.rows.insert(
        "write 8KB".into(),
        time_each(iters, || c.pwrite(w, &eight, 0).map(drop))?,
    );
    let t = Instant::now();
    let n = c.getfile("/big", &mut std::io::sink())?;
    r.read_mbps = mbps(n, t.elapsed());
    let w = c.open("/bigw", "w", 0)?;
    let block = vec![b'z'; BIG_CHUNK];
    let t = Instant::now();
    let mut off = 0u64;
    while off < size {
        off += c.pwrite(w, &block, off)? as u64;
    }
    r.write_mbps = mbps(size, t.elapsed());
    Ok(r)
}

fn xrootd_python() -> Option<PathBuf> {
    ["/usr/bin/python3", "python3"]
        .iter()
        .map(PathBuf::from)
        .find(|p| {
            std::process::Command::new(p)
                .args(["-c", "import XRootD.client"])
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
}

fn measure_xrootd(
    python: &Path,
    script: &Path,
    addr: SocketAddr,
    iters: usize,
    size: u64,
) -> Result<RunResult, String> {
    let out = std::process::Command::new(python)
        .arg(script)
        .arg(format!("root://{addr}"))
        .arg(iters.to_string())
        .arg(size.to_string())
        .output()
        .map_err(|e| format!("run {}: {e}", python.display()))?;
    if !out.status.success() {
        return Err(format!(
            "xrootd bench failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("xrootd bench output: {e}"))
}

/// A target ready to measure: where to connect (maybe a proxy) and what keeps it alive.
struct Target {
    name: String,
    addr: SocketAddr,
    token: String,
    _peer: Option<Peer>,
    _proxy: Option<DelayProxy>,
}

/// Runs the benchmark and prints the report; see [`OpsArgs`].
pub fn run(args: OpsArgs) -> Result<(), BenchError> {
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
    std::fs::set_permissions(
        work.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .map_err(|e| BenchError::io("chmod work dir", e))?;
    let size = args.size_mb.max(1) << 20;
    let exe = std::env::current_exe().map_err(|e| BenchError::io("current exe", e))?;
    let one_way = Duration::from_secs_f64(args.rtt_ms / 2000.0);
    let script = work.path().join("xrootd_ops.py");
    std::fs::write(&script, include_str!("xrootd_ops.py"))
        .map_err(|e| BenchError::io("write script", e))?;
    let python = xrootd_python();

    let mut targets = Vec::new();
    let mut skipped = Vec::new();
    for name in &args.targets {
        let started: Result<(SocketAddr, String, Option<Peer>), BenchError> = match name.as_str() {
            "pingpong" => pingpong::start_echo()
                .map(|a| (a, String::new(), None))
                .map_err(|e| BenchError::io("echo", e)),
            "locus" => make_root(work.path(), "locus-root", size)
                .and_then(|root| peers::start_locus(&exe, work.path(), &root))
                .map(|(p, token)| (p.addr, token, Some(p))),
            "chirp" => make_root(work.path(), "chirp-root", size)
                .and_then(|root| peers::start_chirp(work.path(), &root))
                .map(|p| (p.addr, String::new(), Some(p))),
            "xrootd" => match &python {
                None => Err(BenchError::Setup(
                    "no python3 with XRootD bindings (apt-get install python3-xrootd)".into(),
                )),
                Some(_) => make_root(work.path(), "xrootd-root", size)
                    .and_then(|root| peers::start_xrootd(work.path(), &root))
                    .map(|p| (p.addr, String::new(), Some(p))),
            },
            other => Err(BenchError::Setup(format!("unknown target {other:?}"))),
        };
        match started {
            Ok((addr, token, peer)) => {
                let proxy = if one_way > Duration::ZERO {
                    Some(
                        DelayProxy::start(addr, one_way)
                            .map_err(|e| BenchError::io("delay proxy", e))?,
                    )
                } else {
                    None
                };
                let addr = proxy.as_ref().map_or(addr, |p| p.addr);
                targets.push(Target {
                    name: name.clone(),
                    addr,
                    token,
                    _peer: peer,
                    _proxy: proxy,
                });
            }
            Err(e) => {
                eprintln!("skipping {name}: {e}");
                skipped.push(name.clone());
            }
        }
    }

    let mut runs: BTreeMap<String, Vec<RunResult>> = BTreeMap::new();
    for rep in 0..args.repeat.max(1) {
        // Rotate the order so no target always runs first (or last) on a warming machine.
        for i in 0..targets.len() {
            let t = &targets[(i + rep) % targets.len()];
            eprintln!("run {}/{}: {}", rep + 1, args.repeat.max(1), t.name);
            let r = match t.name.as_str() {
                "pingpong" => pingpong::measure(t.addr, args.iterations).map(|s| RunResult {
                    rows: [("round trip".to_string(), s)].into(),
                    ..Default::default()
                }),
                "locus" => measure_locus(t.addr, &t.token, args.iterations, size),
                "chirp" => measure_chirp(t.addr, args.iterations, size),
                "xrootd" => measure_xrootd(
                    python.as_deref().expect("checked"),
                    &script,
                    t.addr,
                    args.iterations,
                    size,
                ),
                _ => unreachable!(),
            }
            .map_err(|e| BenchError::Setup(format!("{}: {e}", t.name)))?;
            runs.entry(t.name.clone()).or_default().push(r);
        }
    }

    let reports: Vec<TargetReport> = targets
        .iter()
        .map(|t| {
            let rs = runs.remove(&t.name).unwrap_or_default();
            let mut rows = BTreeMap::new();
            let keys: Vec<String> = rs
                .first()
                .map(|r| r.rows.keys().cloned().collect())
                .unwrap_or_default();
            for k in keys {
                let all: Vec<Summary> = rs.iter().filter_map(|r| r.rows.get(&k).copied()).collect();
                rows.insert(k, Summary::median(&all));
            }
            TargetReport {
                target: t.name.clone(),
                rows,
                read_mbps: median(rs.iter().map(|r| r.read_mbps).collect()),
                write_mbps: median(rs.iter().map(|r| r.write_mbps).collect()),
                runs: rs,
            }
        })
        .collect();
    print!("{}", render(&args, &reports, &skipped));
    if let Some(path) = &args.save {
        let v = serde_json::json!({"args": format!("{args:?}"), "reports": reports, "skipped": skipped});
        std::fs::write(path, serde_json::to_string_pretty(&v).expect("json"))
            .map_err(|e| BenchError::io("write json", e))?;
    }
    Ok(())
}

/// The report as Markdown tables: latency p50 (p99) per row and target, ratios to Locus.
pub fn render(args: &OpsArgs, reports: &[TargetReport], skipped: &[String]) -> String {
    let get = |name: &str| reports.iter().find(|r| r.target == name);
    let floor = get("pingpong")
        .and_then(|r| r.rows.get("round trip"))
        .map(|s| s.p50);
    let locus = get("locus");
    let peers: Vec<&TargetReport> = reports
        .iter()
        .filter(|r| r.target != "pingpong" && r.target != "locus")
        .collect();
    let mut s = format!(
        "\n### bench ops: {} iterations x {} repeats, {} MiB file, emulated RTT {} ms (medians of repeats)\n\n",
        args.iterations, args.repeat, args.size_mb, args.rtt_ms
    );
    if let Some(f) = floor {
        s.push_str(&format!("Bare TCP ping-pong round trip: p50 {f:.1} µs\n\n"));
    }
    s.push_str("| row | locus p50 (p99) µs |");
    for p in &peers {
        s.push_str(&format!(
            " {} p50 (p99) µs | {} ÷ locus |",
            p.target, p.target
        ));
    }
    if floor.is_some() {
        s.push_str(" locus ÷ ping-pong |");
    }
    s.push('\n');
    s.push_str(&"|---".repeat(2 + peers.len() * 2 + usize::from(floor.is_some())));
    s.push_str("|\n");
    for row in ROWS {
        let l = locus.and_then(|r| r.rows.get(row));
        s.push_str(&format!(
            "| {row} | {} |",
            l.map_or("-".into(), |x| format!("{:.1} ({:.1})", x.p50, x.p99))
        ));
        for p in &peers {
            let v = p.rows.get(row);
            s.push_str(&format!(
                " {} |",
                v.map_or("-".into(), |x| format!("{:.1} ({:.1})", x.p50, x.p99))
            ));
            s.push_str(&match (v, l) {
                (Some(v), Some(l)) => format!(" {:.2}x |", v.p50 / l.p50),
                _ => " - |".into(),
            });
        }
        if let Some(f) = floor {
            s.push_str(&l.map_or(" - |".into(), |l| format!(" {:.2}x |", l.p50 / f)));
        }
        s.push('\n');
    }
    for (label, pick) in [("seq read MB/s", 0), ("seq write MB/s", 1)] {
        let bw = |r: &TargetReport| if pick == 0 { r.read_mbps } else { r.write_mbps };
        let l = locus.map(bw);
        s.push_str(&format!(
            "| {label} | {} |",
            l.map_or("-".into(), |v| format!("{v:.0}"))
        ));
        for p in &peers {
            s.push_str(&format!(" {:.0} |", bw(p)));
            s.push_str(&l.map_or(" - |".into(), |l| format!(" locus is {:.2}x |", l / bw(p))));
        }
        if floor.is_some() {
            s.push_str(" |");
        }
        s.push('\n');
    }
    if !skipped.is_empty() {
        s.push_str(&format!(
            "\nSkipped (not available here): {}\n",
            skipped.join(", ")
        ));
    }
    s
}
