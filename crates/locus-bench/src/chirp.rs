//! `locus bench chirp`: CCTools' own `chirp` tool against Locus' Chirp endpoint
//! (`locus serve --chirp-port`) and against `chirp_server`, side by side in one run.
//!
//! Each row is one `chirp` session whose commands come on its standard input (one
//! connection, one authentication, then the same command `--iterations` times), so the
//! row measures the servers, not process start-up; the time of a session holding a single
//! `whoami` is subtracted. Both servers export identical trees on the same disk. Servers
//! take turns row by row, `--repeat` times; the report gives medians.

use crate::stats::median;
use crate::BenchError;
use locus_testkit::peers::{self, Peer};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

/// Options of `locus bench chirp`.
#[derive(clap::Args, Debug, Clone)]
pub struct ChirpArgs {
    /// Commands per latency row and server in each repeat.
    #[arg(long, default_value_t = 500)]
    pub iterations: usize,
    /// Repeats of every row and server; the report gives medians across them.
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    /// Size of the file of the bandwidth rows, in MiB (each moves it 8 times per repeat).
    #[arg(long, default_value_t = 64)]
    pub size_mb: u64,
    /// Scratch directory for the exported trees (default: the system's temporary directory).
    #[arg(long)]
    pub work_dir: Option<std::path::PathBuf>,
}

/// One row: the commands of one iteration, and how many operations they are.
struct Row {
    name: &'static str,
    commands: &'static str,
    ops: usize,
    /// Bandwidth rows move the big file; they report MB/s.
    bytes: bool,
}

const ROWS: [Row; 9] = [
    Row { name: "stat", commands: "stat /small\n", ops: 1, bytes: false },
    Row { name: "ls -la (100 entries)", commands: "ls -la /dir\n", ops: 1, bytes: false },
    Row { name: "getacl", commands: "getacl /\n", ops: 1, bytes: false },
    Row { name: "get 4 KiB", commands: "get /small got.small\n", ops: 1, bytes: false },
    Row { name: "put 4 KiB", commands: "put small /put.small\n", ops: 1, bytes: false },
    Row { name: "mkdir + rmdir", commands: "mkdir /d\nrmdir /d\n", ops: 2, bytes: false },
    Row { name: "mv", commands: "mv /small /moved\nmv /moved /small\n", ops: 2, bytes: false },
    Row { name: "get (MB/s)", commands: "get /big got.big\n", ops: 1, bytes: true },
    Row { name: "put (MB/s)", commands: "put big /put.big\n", ops: 1, bytes: true },
];

/// Times of each sample of a bandwidth row (the big file is moved this many times).
const BULK_ITERATIONS: usize = 8;

/// Fills an export with the rows' files, and the client's directory with what it puts.
fn populate(root: &Path, size: usize) -> Result<(), BenchError> {
    let io = |e| BenchError::io("populate", e);
    std::fs::create_dir_all(root.join("dir")).map_err(io)?;
    std::fs::write(root.join("small"), vec![7u8; 4096]).map_err(io)?;
    std::fs::write(root.join("big"), vec![9u8; size]).map_err(io)?;
    for i in 0..100 {
        std::fs::write(root.join(format!("dir/f{i:03}")), b"x").map_err(io)?;
    }
    Ok(())
}

/// Runs one `chirp` session with `script` on its standard input; answers its wall time.
fn session(client_dir: &Path, addr: SocketAddr, script: &Path) -> Result<f64, BenchError> {
    let input = std::fs::File::open(script).map_err(|e| BenchError::io("open script", e))?;
    let start = Instant::now();
    let out = Command::new("chirp")
        .args(["-t", "60", "-a", "address", &addr.to_string()])
        .current_dir(client_dir)
        .stdin(input)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| BenchError::Setup(format!("chirp (apt-get install coop-computing-tools): {e}")))?;
    let took = start.elapsed().as_secs_f64();
    let err = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() || err.contains("couldn't") {
        return Err(BenchError::Setup(format!("chirp session against {addr} failed: {err}")));
    }
    Ok(took)
}

/// Runs the benchmark and prints the table.
pub fn run(args: ChirpArgs) -> Result<(), BenchError> {
    let base = args.work_dir.clone().unwrap_or_else(std::env::temp_dir);
    let work = tempfile::Builder::new()
        .prefix("locus-bench-chirp-")
        .tempdir_in(&base)
        .map_err(|e| BenchError::io(format!("temp dir in {}", base.display()), e))?;
    // chirp_server drops root privileges to `nobody`, which must reach its files.
    std::fs::set_permissions(work.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .map_err(|e| BenchError::io("chmod work dir", e))?;
    let size = (args.size_mb.max(1) << 20) as usize;
    let client = work.path().join("client");
    std::fs::create_dir_all(&client).map_err(|e| BenchError::io("mkdir", e))?;
    std::fs::write(client.join("small"), vec![5u8; 4096]).map_err(|e| BenchError::io("write", e))?;
    std::fs::write(client.join("big"), vec![3u8; size]).map_err(|e| BenchError::io("write", e))?;

    let exe = std::env::current_exe().map_err(|e| BenchError::io("current exe", e))?;
    let locus_work = work.path().join("locus");
    let locus_root = locus_work.join("root");
    populate(&locus_root, size)?;
    let (locus, token, locus_chirp) = peers::start_locus_chirp(&exe, &locus_work, &locus_root, &[])?;
    grant_loopback(locus.addr, &token)?;
    let chirp_work = work.path().join("chirp");
    let chirp_root = chirp_work.join("root");
    populate(&chirp_root, size)?;
    Command::new("chmod").args(["-R", "a+rwX"]).arg(&chirp_root).status().map_err(|e| BenchError::io("chmod", e))?;
    let chirp: Peer = peers::start_chirp(&chirp_work, &chirp_root)?;
    let servers = [("locus", locus_chirp), ("chirp_server", chirp.addr)];

    let empty = work.path().join("empty.txt");
    std::fs::write(&empty, "whoami\n").map_err(|e| BenchError::io("write script", e))?;
    println!(
        "CCTools' chirp tool, one session per row: µs per operation (MB/s for bandwidth), medians of {}",
        args.repeat
    );
    println!("{:<22} {:>12} {:>14} {:>18}", "operation", "locus", "chirp_server", "chirp_server/locus");
    for row in &ROWS {
        let iterations = if row.bytes { BULK_ITERATIONS } else { args.iterations };
        let script = work.path().join("script.txt");
        std::fs::write(&script, row.commands.repeat(iterations)).map_err(|e| BenchError::io("write script", e))?;
        let mut samples = [Vec::new(), Vec::new()];
        for _ in 0..args.repeat.max(1) {
            for (i, (_, addr)) in servers.iter().enumerate() {
                let base = session(&client, *addr, &empty)?;
                let took = (session(&client, *addr, &script)? - base).max(1e-9);
                samples[i].push(match row.bytes {
                    true => (iterations * size) as f64 / took / 1e6,
                    false => took * 1e6 / (iterations * row.ops) as f64,
                });
            }
        }
        let [l, c] = samples.map(median);
        // A ratio above 1 means Locus is faster, for times and for rates alike.
        let ratio = if row.bytes { l / c } else { c / l };
        println!("{:<22} {:>12.1} {:>14.1} {:>17.2}x", row.name, l, c, ratio);
    }
    drop(chirp);
    drop(locus);
    Ok(())
}

/// Gives the loopback address the rights chirp_server's benchmark ACL gives it.
fn grant_loopback(addr: SocketAddr, token: &str) -> Result<(), BenchError> {
    let client = crate::scripts::connect(addr, token).map_err(BenchError::Setup)?;
    let rights = locus_client::types::Rights::parse("rwld").map_err(BenchError::Setup)?;
    client
        .run(|c| c.acl_set("/", "address:127.0.0.1", rights))
        .map_err(|e| BenchError::Setup(format!("grant the loopback address: {e}")))
}
