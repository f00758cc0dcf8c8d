//! `locus bench active`: Lerna's experiment. A compute-over-data job (column statistics of
//! a CSV file of a few hundred MB, by the shipped `colstats` program) run three ways, side
//! by side at each emulated round-trip time:
//!
//! - **at the server, locally**: the native program on the export directory (no network);
//! - **triggered by a file**: a client opens `colstats@data.csv` through the delay proxy,
//!   so the handler (the same program as a storelet) runs at the server and only its
//!   answer crosses the network; the input is touched before each run, so every run
//!   computes (a run that reuses the kept result is shown apart);
//! - **on the client**: the native program reads the file over a fresh `locus mount`
//!   (nothing cached), through the same proxy.
//!
//! Turnaround is the whole job as the client sees it; bytes moved are what crossed the
//! proxy in both directions.

use crate::mount::mount;
use crate::scripts::connect;
use crate::stats::median;
use crate::BenchError;
use locus_testkit::peers;
use locus_testkit::proxy::DelayProxy;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Options of `locus bench active`.
#[derive(clap::Args, Debug, Clone)]
pub struct ActiveArgs {
    /// Size of the generated CSV file, in MB.
    #[arg(long, default_value_t = 200)]
    pub size_mb: u64,
    /// Emulated round-trip times in milliseconds, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "0,10,100")]
    pub rtt_ms: Vec<f64>,
    /// Timed repeats of each way (the median is reported).
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    /// The client-side run is repeated only once at round-trip times of this many ms or more.
    #[arg(long, default_value_t = 50.0)]
    pub slow_once_ms: f64,
    /// Which parts run: `job` (the triggered job), `rebalance` (Zipf load on 4 devices), or both.
    #[arg(long, value_delimiter = ',', default_value = "job,rebalance")]
    pub parts: Vec<String>,
    /// Files of the rebalancing part, spread evenly over its devices.
    #[arg(long, default_value_t = 64)]
    pub files: usize,
    /// Reads of the Zipf workload in each phase.
    #[arg(long, default_value_t = 20000)]
    pub reads: usize,
    /// The Zipf exponent of the file popularity.
    #[arg(long, default_value_t = 1.1)]
    pub zipf: f64,
}

/// The directory of a storelet shipped in this repository (a Go program).
fn shipped(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../storelets").join(name)
}

/// Writes `size_mb` of CSV rows (trip records of made-up numbers) to `path`.
fn generate_csv(path: &Path, size_mb: u64) -> std::io::Result<()> {
    let mut out = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
    writeln!(out, "id,fare,tip,distance,passengers,zone")?;
    let (mut draws, mut written, mut id) = (Draws(0x2545_f491_4f6c_dd1d), 0u64, 0u64);
    while written < size_mb << 20 {
        let r = draws.next();
        let line = format!(
            "{id},{}.{:02},{}.{:02},{}.{},{},Z{:03}\n",
            5 + r % 60,
            (r >> 8) % 100,
            (r >> 16) % 12,
            (r >> 24) % 100,
            (r >> 32) % 30,
            (r >> 40) % 10,
            1 + (r >> 44) % 6,
            (r >> 48) % 263
        );
        out.write_all(line.as_bytes())?;
        written += line.len() as u64;
        id += 1;
    }
    out.flush()
}

/// Changes the input's modification time, so the next open of the invocation computes.
fn touch(path: &Path) -> Result<(), BenchError> {
    let f = std::fs::File::options().write(true).open(path).map_err(|e| BenchError::io("touch", e))?;
    f.set_modified(std::time::SystemTime::now()).map_err(|e| BenchError::io("touch", e))
}

fn secs(d: &[Duration]) -> f64 {
    median(d.iter().map(|d| d.as_secs_f64()).collect())
}

/// Runs `program args` and returns its time and stdout.
fn run_native(program: &Path, args: &[&Path], dir: &Path) -> Result<(Duration, Vec<u8>), BenchError> {
    let t = Instant::now();
    let out = Command::new(program).args(args).current_dir(dir).output().map_err(|e| BenchError::io("colstats", e))?;
    if !out.status.success() {
        return Err(BenchError::Setup(format!("colstats failed: {}", String::from_utf8_lossy(&out.stderr))));
    }
    Ok((t.elapsed(), out.stdout))
}

/// Runs the benchmark and prints the report.
pub fn run(args: ActiveArgs) -> Result<(), BenchError> {
    let mut out = String::new();
    if args.parts.iter().any(|p| p == "job") {
        out.push_str(&job(&args)?);
    }
    if args.parts.iter().any(|p| p == "rebalance") {
        out.push_str(&rebalance(&args)?);
    }
    print!("{out}");
    Ok(())
}

/// A temporary directory in memory (`/dev/shm` where there is one): disk write-back
/// would make this machine's timings swing.
fn scratch(prefix: &str) -> Result<tempfile::TempDir, BenchError> {
    let base = if Path::new("/dev/shm").is_dir() { PathBuf::from("/dev/shm") } else { std::env::temp_dir() };
    tempfile::Builder::new().prefix(prefix).tempdir_in(base).map_err(|e| BenchError::io("temp dir", e))
}

/// The devices of the rebalancing part.
const DEVICES: usize = 4;
/// Size of each file of the rebalancing part.
const FILE_SIZE: usize = 256 << 10;
/// Bytes one read of the Zipf workload asks for.
const READ_SIZE: u32 = 64 << 10;

/// A small, seeded generator (xorshift), so both phases draw the same sequence.
struct Draws(u64);

impl Draws {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A uniform number in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Lerna's section 5.6: a Zipf-skewed read load over files spread evenly over four
/// devices, before and after `rebalance apply`: each device's share of the load (from
/// the server's accounting) and the workload's latency.
fn rebalance(args: &ActiveArgs) -> Result<String, BenchError> {
    let setup = BenchError::Setup;
    let work = scratch("locus-bench-rebalance-")?;
    let devices: Vec<PathBuf> = (0..DEVICES).map(|d| work.path().join(format!("dev{d}"))).collect();
    // Files placed evenly by count, as placement by free space does on equal disks.
    let mut draws = Draws(0x9e37_79b9_7f4a_7c15);
    for (i, d) in (0..args.files).map(|i| (i, &devices[i % DEVICES])) {
        std::fs::create_dir_all(d).map_err(|e| BenchError::io("mkdir", e))?;
        let data: Vec<u8> = (0..FILE_SIZE).map(|_| draws.next() as u8).collect();
        std::fs::write(d.join(format!("f{i:03}")), data).map_err(|e| BenchError::io("write", e))?;
    }
    let flags: Vec<String> = devices[1..].iter().map(|d| format!("--device={}", d.display())).collect();
    let exe = std::env::current_exe().map_err(|e| BenchError::io("current exe", e))?;
    let (peer, token) = peers::start_locus_with(&exe, work.path(), &devices[0], &flags)?;
    let c = connect(peer.addr, &token).map_err(setup)?;

    // Popularity: rank r has weight 1/(r+1)^s; ranks go to files in a seeded shuffle.
    let mut order: Vec<usize> = (0..args.files).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, (draws.next() % (i as u64 + 1)) as usize);
    }
    let weights: Vec<f64> = (0..args.files).map(|r| 1.0 / ((r + 1) as f64).powf(args.zipf)).collect();
    let total: f64 = weights.iter().sum();
    let cumulative: Vec<f64> = weights
        .iter()
        .scan(0.0, |acc, w| {
            *acc += w / total;
            Some(*acc)
        })
        .collect();
    let phase = |seed: u64| -> Result<(Vec<f64>, crate::stats::Summary), BenchError> {
        let before: Vec<u64> =
            c.run(|c| c.stats(0)).map_err(|e| setup(e.to_string()))?.devices.iter().map(|d| d.io.load()).collect();
        let mut draws = Draws(seed);
        let mut times = Vec::with_capacity(args.reads);
        for _ in 0..args.reads {
            let u = draws.unit();
            let rank = cumulative.partition_point(|&c| c < u).min(args.files - 1);
            let path = format!("/f{:03}", order[rank]);
            let offset = (draws.next() % (FILE_SIZE as u64 / READ_SIZE as u64)) * READ_SIZE as u64;
            let t = Instant::now();
            c.run(|c| async {
                let h = c.open(&path, locus_client::types::open_flags::READ, 0).await?;
                c.pread(h.handle, offset, READ_SIZE).await?;
                c.close(h.handle).await
            })
            .map_err(|e| setup(format!("{path}: {e}")))?;
            times.push(t.elapsed());
        }
        let after = c.run(|c| c.stats(0)).map_err(|e| setup(e.to_string()))?.devices;
        let loads: Vec<u64> = after.iter().zip(&before).map(|(d, b)| d.io.load() - b).collect();
        let sum: u64 = loads.iter().sum::<u64>().max(1);
        Ok((loads.iter().map(|&l| l as f64 / sum as f64).collect(), crate::stats::Summary::of(&mut times)))
    };
    let (shares_before, lat_before) = phase(7)?;
    let t = Instant::now();
    let applied = c
        .run(|c| c.call(locus_client::ops::RebalanceApply { max_moves: args.files as u32 }))
        .map_err(|e| setup(e.to_string()))?;
    let apply_time = t.elapsed();
    let (shares_after, lat_after) = phase(7)?;
    drop(peer);

    let peak = |s: &[f64]| s.iter().cloned().fold(0.0, f64::max) * s.len() as f64;
    let pct = |s: &[f64]| s.iter().map(|x| format!("{:.0}%", x * 100.0)).collect::<Vec<_>>().join(" / ");
    let moved: u64 = applied.moves.iter().map(|m| m.size).sum();
    Ok(format!(
        "\n### bench active: rebalancing a Zipf({}) read load over {} files on {DEVICES} devices ({} reads of {} KiB per phase)\n\n\
         | | load share per device | busiest ÷ mean | read p50 µs | read p99 µs |\n|---|---|---|---|---|\n\
         | before | {} | {:.2}x | {:.0} | {:.0} |\n\
         | after `rebalance apply` | {} | {:.2}x | {:.0} | {:.0} |\n\n\
         The plan came from the accounting of the first phase; applying it moved {} files ({:.1} MB) in {:.1} ms while the server served. Load is the accounting's (bytes moved plus 4 KiB per operation). The devices are directories on one memory-backed file system here, so the latency columns show the workload is not slowed by the moves' bookkeeping, not a disk's relief.\n",
        args.zipf,
        args.files,
        args.reads,
        READ_SIZE >> 10,
        pct(&shares_before),
        peak(&shares_before),
        lat_before.p50,
        lat_before.p99,
        pct(&shares_after),
        peak(&shares_after),
        lat_after.p50,
        lat_after.p99,
        applied.moves.len(),
        moved as f64 / 1e6,
        apply_time.as_secs_f64() * 1e3,
    ))
}

/// Part (a): the triggered job against the same program at the server and on the client.
fn job(args: &ActiveArgs) -> Result<String, BenchError> {
    let setup = BenchError::Setup;
    let work = scratch("locus-bench-active-")?;
    let (root, state) = (work.path().join("root"), work.path().join("locus-state"));
    std::fs::create_dir_all(state.join("modules")).map_err(|e| BenchError::io("mkdir", e))?;
    std::fs::create_dir_all(&root).map_err(|e| BenchError::io("mkdir", e))?;
    let data = root.join("data.csv");
    eprintln!("generating {} MB of CSV", args.size_mb);
    generate_csv(&data, args.size_mb).map_err(|e| BenchError::io("generate CSV", e))?;
    let size = std::fs::metadata(&data).map_err(|e| BenchError::io("stat", e))?.len();

    // The same program twice: WebAssembly for the handler, native for the other ways.
    let wasm = locus_storelet::build_shipped("colstats").map_err(setup)?;
    std::fs::write(state.join("modules/colstats.wasm"), wasm).map_err(|e| BenchError::io("module", e))?;
    let native = work.path().join("colstats");
    let built =
        Command::new("go").args(["build", "-o"]).arg(&native).arg(".").current_dir(shipped("colstats")).status();
    if !built.is_ok_and(|s| s.success()) {
        return Err(setup("cannot build storelets/colstats natively with go".into()));
    }
    // Both builds as handlers: the module, and the native program as a command handler.
    let handlers = format!("colstats storelet modules/colstats.wasm\ncolstats-native command {}\n", native.display());
    std::fs::write(state.join("handlers.conf"), handlers).map_err(|e| BenchError::io("handlers.conf", e))?;

    let exe = std::env::current_exe().map_err(|e| BenchError::io("current exe", e))?;
    let (peer, token) = peers::start_locus(&exe, work.path(), &root)?;
    let (local_time, expected) = run_native(&native, &[Path::new("data.csv")], &root)?;
    let mut local = vec![local_time];
    for _ in 1..args.repeat {
        local.push(run_native(&native, &[Path::new("data.csv")], &root)?.0);
    }
    let local = secs(&local);

    let mut out = format!(
        "\n### bench active: column statistics of a {:.0} MB CSV file ({} rows of 6 columns; median of {} runs, seconds)\n\n",
        size as f64 / 1e6,
        std::fs::read_to_string(&data).map(|s| s.lines().count() - 1).unwrap_or(0),
        args.repeat
    );
    out.push_str(&format!("Native `colstats` at the server, on the export directory (no network): {local:.2} s.\n\n"));
    out.push_str("| RTT ms | triggered: storelet handler (`colstats@data.csv`) | ÷ itself at the first RTT | triggered: command handler (`colstats-native@data.csv`) | ÷ native at the server | reused result | native on the client over `locus mount` | client ÷ command handler | bytes moved: triggered | bytes moved: client |\n|---|---|---|---|---|---|---|---|---|---|\n");
    // The first run of the handler compiles its module (cached afterwards): not timed.
    let warm = connect(peer.addr, &token).map_err(setup)?;
    warm.run(|c| c.read_file("/colstats@data.csv")).map_err(|e| setup(e.to_string()))?;
    let mut triggered_first = None;
    let mut mounts = 0;
    for &rtt in &args.rtt_ms {
        let proxy = DelayProxy::start(peer.addr, Duration::from_secs_f64(rtt / 2000.0))
            .map_err(|e| BenchError::io("proxy", e))?;
        let c = connect(proxy.addr, &token).map_err(setup)?;
        let name = "/colstats@data.csv";
        let (mut active, mut reused, mut client, mut command) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut active_bytes, mut client_bytes) = (0u64, 0u64);
        for r in 0..args.repeat {
            touch(&data)?;
            let before = proxy.total_bytes();
            let t = Instant::now();
            let got = c.run(|c| c.read_file(name)).map_err(|e| setup(format!("{name}: {e}")))?;
            active.push(t.elapsed());
            active_bytes = proxy.total_bytes() - before;
            if got != expected {
                return Err(setup(format!("the handler's answer differs:\n{}", String::from_utf8_lossy(&got))));
            }
            let t = Instant::now();
            c.run(|c| c.read_file(name)).map_err(|e| setup(e.to_string()))?;
            reused.push(t.elapsed());
            let t = Instant::now();
            let got = c.run(|c| c.read_file("/colstats-native@data.csv")).map_err(|e| setup(e.to_string()))?;
            command.push(t.elapsed());
            if got != expected {
                return Err(setup(format!("the command handler's answer differs:\n{}", String::from_utf8_lossy(&got))));
            }
            if rtt < args.slow_once_ms || r == 0 {
                // A fresh mount each time: nothing cached on the client.
                mounts += 1;
                let mnt = work.path().join(format!("mnt{mounts}"));
                let m = mount(&exe, &format!("locus://{}/", proxy.addr), &mnt, &token)?;
                let before = proxy.total_bytes();
                let (t, got) = run_native(&native, &[&m.dir.join("data.csv")], work.path())?;
                client.push(t);
                client_bytes = proxy.total_bytes() - before;
                if got != expected {
                    return Err(setup("colstats over the mount gave another answer".into()));
                }
            }
        }
        let (a, u, cl, n) = (secs(&active), secs(&reused), secs(&client), secs(&command));
        let first = *triggered_first.get_or_insert(a);
        out.push_str(&format!(
            "| {rtt} | {a:.2} | {:.2}x | {n:.2} | {:.2}x | {u:.3} | {cl:.2}{} | {:.1}x | {} | {} |\n",
            a / first,
            n / local,
            if client.len() == 1 && args.repeat > 1 { " (1 run)" } else { "" },
            cl / n,
            human(active_bytes),
            human(client_bytes),
        ));
        eprintln!("rtt {rtt} ms done");
    }
    out.push_str(&format!(
        "\nThe storelet handler is the program's WebAssembly build, run under the storelet limits; the command handler is its native build, run confined under the same limits (no fuel) as an administrator may register it; the native build run directly at the server on the export directory is the floor ({local:.2} s). A reused result is the storelet handler's same open after the first, answered from the kept result because the input did not change (command handlers' results are not reused).\n"
    ));
    drop(peer);
    Ok(out)
}

fn human(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 20 => format!("{:.1} MB", b as f64 / 1e6),
        b if b >= 1 << 10 => format!("{:.1} kB", b as f64 / 1e3),
        b => format!("{b} B"),
    }
}
