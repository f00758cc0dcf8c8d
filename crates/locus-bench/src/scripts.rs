//! `locus bench scripts`: what Scriptable RPC buys, measured in one run.
//!
//! - Overhead: a cached script call that wraps one `stat` against the plain `stat`, with
//!   Redis' `EVALSHA` against `GET` on a local redis-server as the reference ratio.
//! - read+getattr: `readdir` then `stat` (two round trips) against one scripted lookup.
//! - read-if-modified-since: `stat` then `get` when changed, against one script, with 0,
//!   50 and 100% of the files changed.
//! - partial write of 100 bytes into a 100 KB file: read-modify-write of the whole file
//!   against a script that writes in place; latency and bytes on the wire.
//!
//! Every row runs through the delay proxy at each emulated round-trip time; the two
//! sides of a comparison take turns in short blocks, as in `bench ops`.

use crate::placement::{self, Placement};
use crate::stats::{time_each, Summary};
use crate::BenchError;
use locus_client::types::Value;
use locus_client::{blocking, ConnectOptions, Credentials};
use locus_testkit::peers::{self, free_port, which};
use locus_testkit::proxy::DelayProxy;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

/// Options of `locus bench scripts`.
#[derive(clap::Args, Debug, Clone)]
pub struct ScriptsArgs {
    /// Timed calls per row at 0 ms (fewer at longer round trips, at least 50).
    #[arg(long, default_value_t = 2000)]
    pub iterations: usize,
    /// Emulated round-trip times in milliseconds, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "0,1,5,10")]
    pub rtt_ms: Vec<f64>,
    /// Where clients and servers run: `spread` (clients on the first CPU, servers on
    /// the others), `shared` (all on the first CPU) or `free` (not pinned).
    #[arg(long, value_enum, default_value = "spread")]
    pub placement: Placement,
}

const LOOKUP: &str = include_str!("../../../examples/scripts/lookup.lua");
const RIMS: &str = include_str!("../../../examples/scripts/read_if_modified.lua");
const PARTIAL: &str = include_str!("../../../examples/scripts/partial_write.lua");
const STAT: &str = "return fs.stat(...)";
const FILES: usize = 20;
const BIG: usize = 100_000;

fn iterations_at(args: &ScriptsArgs, rtt: f64) -> usize {
    if rtt <= 0.0 {
        args.iterations
    } else {
        ((200.0 / rtt) as usize).clamp(50, args.iterations)
    }
}

/// Measures two ways of doing one thing, taking turns in blocks of 50.
fn paired(
    iters: usize,
    mut a: impl FnMut() -> Result<(), String>,
    mut b: impl FnMut() -> Result<(), String>,
) -> Result<(Summary, Summary), String> {
    let (mut sa, mut sb) = (Vec::new(), Vec::new());
    let block = 50.min(iters);
    for _ in 0..iters.div_ceil(block) {
        sa.extend(time_each(block, &mut a)?);
        sb.extend(time_each(block, &mut b)?);
    }
    Ok((Summary::of(&mut sa), Summary::of(&mut sb)))
}

/// Runs the benchmark and prints the report.
pub fn run(args: ScriptsArgs) -> Result<(), BenchError> {
    let placed = args.placement.apply().map_err(|e| BenchError::io("pin to CPUs", e))?;
    eprintln!("{placed}");
    let work =
        tempfile::Builder::new().prefix("locus-bench-scripts-").tempdir().map_err(|e| BenchError::io("temp dir", e))?;
    let root = work.path().join("root");
    std::fs::create_dir_all(root.join("dir")).map_err(|e| BenchError::io("mkdir", e))?;
    for i in 0..FILES {
        std::fs::write(root.join(format!("dir/f{i}")), vec![b'x'; 1000]).map_err(|e| BenchError::io("write", e))?;
    }
    std::fs::write(root.join("big"), vec![b'.'; BIG]).map_err(|e| BenchError::io("write", e))?;
    let exe = std::env::current_exe().map_err(|e| BenchError::io("current exe", e))?;
    let (peer, token) = peers::start_locus(&exe, work.path(), &root)?;
    let setup = |e: String| BenchError::Setup(e);

    let mut out = format!("\n### bench scripts (p50 µs; medians over blocks taken in turns); {placed}\n");
    // Script overhead against the plain operation (direct, no proxy), and Redis as the reference.
    {
        let c = connect(peer.addr, &token).map_err(setup)?;
        c.run(|c| c.script_call(STAT, vec![Value::Str("/big".into())], &[])).map_err(|e| setup(e.to_string()))?;
        let id = locus_client::script_id(STAT);
        let (plain, scripted) = paired(
            args.iterations,
            || c.run(|c| c.stat("/big")).map(drop).map_err(|e| e.to_string()),
            || {
                c.run(|c| c.script_call_id(&id, vec![Value::Str("/big".into())], &[]))
                    .map(drop)
                    .map_err(|e| e.to_string())
            },
        )
        .map_err(setup)?;
        out.push_str("\n| call | plain p50 µs | scripted p50 µs | scripted ÷ plain |\n|---|---|---|---|\n");
        out.push_str(&format!(
            "| Locus stat vs script `return fs.stat(...)` | {:.1} | {:.1} | {:.2}x |\n",
            plain.p50,
            scripted.p50,
            scripted.p50 / plain.p50
        ));
        // Where a script call's time goes: the call itself, a binding round trip into the
        // file service with no file work, then the stat's own work.
        let breakdown =
            [("return 1", "invocation: `return 1`"), ("return fs.whoami()", "binding: `return fs.whoami()`")];
        for (src, label) in breakdown {
            c.run(|c| c.script_register(src)).map_err(|e| setup(e.to_string()))?;
            let sid = locus_client::script_id(src);
            let (plain, scripted) = paired(
                args.iterations,
                || c.run(|c| c.stat("/big")).map(drop).map_err(|e| e.to_string()),
                || c.run(|c| c.script_call_id(&sid, vec![], &[])).map(drop).map_err(|e| e.to_string()),
            )
            .map_err(setup)?;
            out.push_str(&format!(
                "| Locus stat vs {label} | {:.1} | {:.1} | {:.2}x |\n",
                plain.p50,
                scripted.p50,
                scripted.p50 / plain.p50
            ));
        }
        match redis_overhead(args.iterations, work.path()) {
            Ok((get, evalsha)) => out.push_str(&format!(
                "| Redis GET vs EVALSHA `return redis.call('GET', KEYS[1])` | {:.1} | {:.1} | {:.2}x |\n",
                get.p50,
                evalsha.p50,
                evalsha.p50 / get.p50
            )),
            Err(e) => out.push_str(&format!("| Redis | skipped: {e} | | |\n")),
        }
    }

    out.push_str("\n| RTT ms | read+getattr separate | scripted | ratio | RIMS 0% sep / script | RIMS 50% sep / script | RIMS 100% sep / script | partial write RMW / script | bytes RMW / script |\n|---|---|---|---|---|---|---|---|---|\n");
    for &rtt in &args.rtt_ms {
        let proxy = DelayProxy::start(peer.addr, Duration::from_secs_f64(rtt / 2000.0))
            .map_err(|e| BenchError::io("proxy", e))?;
        let c = connect(proxy.addr, &token).map_err(setup)?;
        let iters = iterations_at(&args, rtt);
        let e = |e: locus_client::ClientError| e.to_string();
        for src in [LOOKUP, RIMS, PARTIAL] {
            c.run(|c| c.script_register(src)).map_err(|x| setup(x.to_string()))?;
        }
        let (mut n1, mut n2) = (0usize, 0usize);
        let (sep, scr) = paired(
            iters,
            || {
                n1 += 1;
                let name = format!("f{}", n1 % FILES);
                let entries = c.run(|c| c.readdir("/dir")).map_err(e)?;
                if entries.iter().any(|x| x.name == name) {
                    let path = format!("/dir/{name}");
                    c.run(|c| c.stat(&path)).map_err(e)?;
                }
                Ok(())
            },
            || {
                n2 += 1;
                let args = vec![Value::Str("/dir".into()), Value::Str(format!("f{}", n2 % FILES))];
                c.run(|c| c.script_call(LOOKUP, args, &[])).map(drop).map_err(e)
            },
        )
        .map_err(setup)?;
        let mut row = format!("| {rtt} | {:.0} | {:.0} | {:.2}x |", sep.p50, scr.p50, scr.p50 / sep.p50);

        let mtimes: Vec<(i64, u32)> = (0..FILES)
            .map(|i| {
                let path = format!("/dir/f{i}");
                c.run(|c| c.stat(&path)).map(|a| (a.mtime.sec, a.mtime.nsec))
            })
            .collect::<Result<_, _>>()
            .map_err(|x| setup(x.to_string()))?;
        for share in [0usize, 50, 100] {
            let (mut k1, mut k2) = (0usize, 0usize);
            let changed = |k: usize| (k * 37 % 100) < share;
            let (sep, scr) = paired(
                iters,
                || {
                    k1 += 1;
                    let k = k1;
                    let (path, cached) = (format!("/dir/f{}", k % FILES), mtimes[k % FILES]);
                    let cached = if changed(k) { (1, 0) } else { cached };
                    let st = c.run(|c| c.stat(&path)).map_err(e)?;
                    if (st.mtime.sec, st.mtime.nsec) != cached {
                        c.run(|c| c.read_file(&path)).map_err(e)?;
                    }
                    Ok(())
                },
                || {
                    k2 += 1;
                    let k = k2;
                    let (path, cached) = (format!("/dir/f{}", k % FILES), mtimes[k % FILES]);
                    let cached = if changed(k) { (1, 0) } else { cached };
                    let args = vec![Value::Str(path), Value::Int(cached.0), Value::Int(cached.1 as i64)];
                    c.run(|c| c.script_call(RIMS, args, &[])).map(drop).map_err(e)
                },
            )
            .map_err(setup)?;
            row.push_str(&format!(" {:.0} / {:.0} |", sep.p50, scr.p50));
        }

        let patch = vec![b'#'; 100];
        let (rmw, scr) = paired(
            iters.min(200),
            || {
                let mut data = c.run(|c| c.read_file("/big")).map_err(e)?;
                data[500..600].copy_from_slice(&patch);
                c.run(|c| c.write_file("/big", 0o644, &data)).map(drop).map_err(e)
            },
            || {
                let args = vec![Value::Str("/big".into()), Value::Int(500)];
                c.run(|c| c.script_call(PARTIAL, args, &patch)).map(drop).map_err(e)
            },
        )
        .map_err(setup)?;
        let before = proxy.total_bytes();
        let mut data = c.run(|c| c.read_file("/big")).map_err(|x| setup(x.to_string()))?;
        data[500..600].copy_from_slice(&patch);
        c.run(|c| c.write_file("/big", 0o644, &data)).map_err(|x| setup(x.to_string()))?;
        let rmw_bytes = proxy.total_bytes() - before;
        let before = proxy.total_bytes();
        let args = vec![Value::Str("/big".into()), Value::Int(500)];
        c.run(|c| c.script_call(PARTIAL, args, &patch)).map_err(|x| setup(x.to_string()))?;
        std::thread::sleep(Duration::from_millis(20) + Duration::from_secs_f64(rtt / 1000.0));
        let script_bytes = proxy.total_bytes() - before;
        row.push_str(&format!(
            " {:.0} / {:.0} | {rmw_bytes} / {script_bytes} ({:.1}%) |\n",
            rmw.p50,
            scr.p50,
            100.0 * script_bytes as f64 / rmw_bytes as f64
        ));
        out.push_str(&row);
        eprintln!("rtt {rtt} ms done");
    }
    print!("{out}");
    drop(peer);
    Ok(())
}

/// A blocking admin connection to a Locus server at `addr`.
pub fn connect(addr: std::net::SocketAddr, token: &str) -> Result<blocking::Client, String> {
    let opts = ConnectOptions {
        addr: addr.to_string(),
        credentials: Credentials { subject: "admin".into(), token: token.into() },
        tls_ca: None,
        tls_name: None,
        deadlines: Default::default(),
    };
    blocking::Client::connect(&opts).map_err(|e| e.to_string())
}

/// Redis on a fresh port: latency of `GET` and of an `EVALSHA` that wraps it.
fn redis_overhead(iters: usize, work: &Path) -> Result<(Summary, Summary), String> {
    let bin = which("redis-server").ok_or("redis-server not installed (apt-get install redis-server)")?;
    let port = free_port().map_err(|e| e.to_string())?;
    let mut child = placement::server_command(&mut std::process::Command::new(bin))
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .current_dir(work)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| e.to_string())?;
    let result = (|| {
        let mut s = None;
        for _ in 0..100 {
            if let Ok(c) = TcpStream::connect(("127.0.0.1", port)) {
                s = Some(c);
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let s = s.ok_or("redis-server did not start")?;
        s.set_nodelay(true).map_err(|e| e.to_string())?;
        let mut r = BufReader::new(s.try_clone().map_err(|e| e.to_string())?);
        let mut w = s;
        let mut cmd = |parts: &[&str]| -> Result<String, String> {
            let mut req = format!("*{}\r\n", parts.len());
            for p in parts {
                req.push_str(&format!("${}\r\n{p}\r\n", p.len()));
            }
            w.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
            let mut line = String::new();
            r.read_line(&mut line).map_err(|e| e.to_string())?;
            if let Some(len) = line.strip_prefix('$') {
                let len: i64 = len.trim().parse().map_err(|_| format!("redis: {line}"))?;
                if len >= 0 {
                    let mut body = String::new();
                    r.read_line(&mut body).map_err(|e| e.to_string())?;
                    return Ok(body.trim_end().to_string());
                }
            }
            if line.starts_with('-') {
                return Err(format!("redis: {}", line.trim_end()));
            }
            Ok(line.trim_end().to_string())
        };
        cmd(&["SET", "k", "value"])?;
        let sha = cmd(&["SCRIPT", "LOAD", "return redis.call('GET', KEYS[1])"])?;
        let sha = sha.clone();
        let mut get_samples = Vec::new();
        let mut eval_samples = Vec::new();
        for _ in 0..iters.div_ceil(50) {
            get_samples.extend(time_each(50, || cmd(&["GET", "k"]).map(drop))?);
            eval_samples.extend(time_each(50, || cmd(&["EVALSHA", &sha, "1", "k"]).map(drop))?);
        }
        Ok((Summary::of(&mut get_samples), Summary::of(&mut eval_samples)))
    })();
    let _ = child.kill();
    let _ = child.wait();
    result
}
