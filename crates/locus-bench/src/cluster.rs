//! `locus bench cluster`: SPIRAL's experiment. A head, 1 to 4 data nodes and as many
//! clients, each in its own network namespace, joined through a bridge by veth links
//! whose sending rate `tc tbf` limits. Each client reads its own large file (the files
//! are spread one per node), all at once, with third-party transfer on (bytes from the
//! nodes) and off (bytes through the head); then each client writes a file of the same
//! size (`locus put`), all at once, third-party (straight to the nodes) and not.
//!
//! Measured per configuration: aggregate throughput (median of repeats), the head's CPU
//! seconds and transmitted bytes per GB served, and the latency of `stat` at the head,
//! idle and while the bulk reads run.

use crate::stats::median;
use crate::BenchError;
use locus_client::{Client, ConnectOptions, Credentials};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Options of `locus bench cluster`.
#[derive(clap::Args, Debug, Clone)]
pub struct ClusterArgs {
    /// Data node counts to measure, comma-separated (each with as many clients).
    #[arg(long, value_delimiter = ',', default_value = "1,2,3,4")]
    pub nodes: Vec<usize>,
    /// Size of each client's file, in MiB.
    #[arg(long, default_value_t = 64)]
    pub size_mb: u64,
    /// Sending rate of every host's link, in Mbit/s (`tc tbf`).
    #[arg(long, default_value_t = 250)]
    pub rate_mbit: u64,
    /// Timed repeats of each configuration (the median is reported).
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    /// GiB of data (64 MiB files, replication 2, 3 data nodes) whose replicas are
    /// restored after one node is killed under a read load; 0 skips it.
    #[arg(long, default_value_t = 1)]
    pub heal_gib: u64,
    /// Files of the distributed `find` (a few bytes each, kept on the data nodes), over
    /// 4 data nodes and over 1; 0 skips it.
    #[arg(long, default_value_t = 2000)]
    pub find_files: usize,
    /// Every link TLS: the head serves `--tls`, and its data nodes and the clients trust
    /// its cluster's authority (third-party transfer over TLS).
    #[arg(long)]
    pub tls: bool,
}

const TOKEN: &str = "cluster-bench-token";
pub(crate) const PORT: u16 = 9610;

fn sh(args: &[&str]) -> Result<(), BenchError> {
    let out = Command::new(args[0]).args(&args[1..]).output().map_err(|e| BenchError::io(args[0], e))?;
    if !out.status.success() {
        return Err(BenchError::Setup(format!("{}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim())));
    }
    Ok(())
}

/// The namespaces, links and processes of one run; all removed when dropped.
pub(crate) struct Net {
    hosts: Vec<String>,
    children: Vec<Child>,
    dir: tempfile::TempDir,
    /// The head's certificate file, which every `locus` here trusts, under `--tls`.
    tls_ca: Option<PathBuf>,
}

impl Net {
    /// The switch namespace with its bridge, and the root namespace's own link to it
    /// (10.77.0.254, not rate-limited: the bench sets up files and probes latency).
    fn new() -> Result<Net, BenchError> {
        let _ = Command::new("ip").args(["netns", "del", "lc-sw"]).stderr(Stdio::null()).status();
        let _ = Command::new("ip").args(["link", "del", "lc-root"]).stderr(Stdio::null()).status();
        sh(&["ip", "netns", "add", "lc-sw"])?;
        let net = Net {
            hosts: Vec::new(),
            children: Vec::new(),
            dir: tempfile::tempdir().map_err(|e| BenchError::io("temp", e))?,
            tls_ca: None,
        };
        sh(&["ip", "-n", "lc-sw", "link", "add", "br0", "type", "bridge"])?;
        sh(&["ip", "-n", "lc-sw", "link", "set", "br0", "up"])?;
        sh(&["ip", "link", "add", "lc-root", "type", "veth", "peer", "name", "lc-root-b"])?;
        sh(&["ip", "link", "set", "lc-root-b", "netns", "lc-sw"])?;
        sh(&["ip", "-n", "lc-sw", "link", "set", "lc-root-b", "master", "br0", "up"])?;
        sh(&["ip", "addr", "add", "10.77.0.254/24", "dev", "lc-root"])?;
        sh(&["ip", "link", "set", "lc-root", "up"])?;
        Ok(net)
    }

    /// A host namespace `lc-NAME` at 10.77.0.`ip`, whose link sends at `rate_mbit`.
    fn host(&mut self, name: &str, ip: u8, rate_mbit: u64) -> Result<(), BenchError> {
        let ns = format!("lc-{name}");
        let (a, b) = (format!("lc-{name}-a"), format!("lc-{name}-b"));
        let _ = Command::new("ip").args(["netns", "del", &ns]).stderr(Stdio::null()).status();
        sh(&["ip", "netns", "add", &ns])?;
        self.hosts.push(ns.clone());
        sh(&["ip", "link", "add", &a, "type", "veth", "peer", "name", &b])?;
        sh(&["ip", "link", "set", &a, "netns", &ns])?;
        sh(&["ip", "link", "set", &b, "netns", "lc-sw"])?;
        sh(&["ip", "-n", "lc-sw", "link", "set", &b, "master", "br0", "up"])?;
        sh(&["ip", "-n", &ns, "link", "set", &a, "name", "eth0"])?;
        sh(&["ip", "-n", &ns, "addr", "add", &format!("10.77.0.{ip}/24"), "dev", "eth0"])?;
        sh(&["ip", "-n", &ns, "link", "set", "eth0", "up"])?;
        sh(&["ip", "-n", &ns, "link", "set", "lo", "up"])?;
        sh(&[
            "ip",
            "netns",
            "exec",
            &ns,
            "tc",
            "qdisc",
            "add",
            "dev",
            "eth0",
            "root",
            "tbf",
            "rate",
            &format!("{rate_mbit}mbit"),
            "burst",
            "256kb",
            "latency",
            "100ms",
        ])?;
        Ok(())
    }

    /// `locus ARGS` in namespace `lc-NAME`, as the admin of the cluster.
    pub(crate) fn locus(&self, name: &str, env: &[(&str, &str)], args: &[&str]) -> Command {
        let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("locus"));
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &format!("lc-{name}")]);
        // Each host would have CPUs of its own; on this machine the head, which the
        // latency probe measures, gets first call on the shared ones.
        if name == "head" {
            c.args(["nice", "-n", "-10"]);
        }
        c.arg(exe).args(args);
        c.env("LOCUS_TOKEN", format!("admin:{TOKEN}")).env("LOCUS_HOME", self.dir.path().join("home"));
        if let Some(ca) = &self.tls_ca {
            c.env("LOCUS_TLS_CA", ca);
        }
        for (k, v) in env {
            c.env(k, v);
        }
        let log =
            std::fs::OpenOptions::new().create(true).append(true).open(self.dir.path().join(format!("{name}.log")));
        c.stdout(Stdio::null()).stderr(log.map_or(Stdio::null(), Stdio::from));
        c
    }

    fn spawn(&mut self, mut c: Command) -> Result<u32, BenchError> {
        let child = c.spawn().map_err(|e| BenchError::io("start locus", e))?;
        let pid = child.id();
        self.children.push(child);
        Ok(pid)
    }

    /// Directories for one server: export and state, with the bench's admin token.
    fn server_dirs(&self, name: &str) -> Result<(PathBuf, PathBuf), BenchError> {
        let base = self.dir.path().join(name);
        let (root, state) = (base.join("export"), base.join("state"));
        for d in [&root, &state] {
            std::fs::create_dir_all(d).map_err(|e| BenchError::io("server dirs", e))?;
        }
        std::fs::write(state.join("tokens"), format!("admin {TOKEN}\nlocus-node {TOKEN}\n"))
            .map_err(|e| BenchError::io("tokens", e))?;
        Ok((root, state))
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        for ns in self.hosts.iter().map(String::as_str).chain(["lc-sw"]) {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
        let _ = Command::new("ip").args(["link", "del", "lc-root"]).stderr(Stdio::null()).status();
    }
}

/// CPU seconds a process has used.
fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return 0.0 };
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap_or("").split_whitespace().collect();
    let ticks: f64 = fields.get(11..13).map_or(0.0, |f| f.iter().filter_map(|t| t.parse::<f64>().ok()).sum());
    ticks / 100.0
}

/// Bytes the head's link has sent.
fn head_tx_bytes() -> u64 {
    Command::new("ip")
        .args(["netns", "exec", "lc-head", "cat", "/sys/class/net/eth0/statistics/tx_bytes"])
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok()?.trim().parse().ok())
        .unwrap_or(0)
}

/// A bare TCP echo at the head's address (in its namespace, as a thread of this
/// process): the floor that a `stat` round trip cannot beat, idle and under load.
fn echo_at_head() -> Result<std::net::TcpStream, BenchError> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let bound = (|| {
            let ns = std::fs::File::open("/run/netns/lc-head")?;
            rustix::thread::move_into_link_name_space(
                std::os::fd::AsFd::as_fd(&ns),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )?;
            std::net::TcpListener::bind("10.77.0.1:7")
        })();
        let listener = match bound {
            Ok(l) => l,
            Err(e) => return drop(tx.send(Err(e))),
        };
        let _ = tx.send(Ok(()));
        if let Ok((mut s, _)) = listener.accept() {
            use std::io::{Read, Write};
            let _ = s.set_nodelay(true);
            let mut b = [0u8; 16];
            while s.read_exact(&mut b).is_ok() && s.write_all(&b).is_ok() {}
        }
    });
    rx.recv()
        .map_err(|_| BenchError::Setup("echo thread".into()))?
        .map_err(|e| BenchError::io("echo at the head", e))?;
    crate::pingpong::connect("10.77.0.1:7".parse().expect("address")).map_err(BenchError::Setup)
}

/// Median round trip (µs) of the bare echo over `count` exchanges.
fn echo_us(s: &mut std::net::TcpStream, count: usize) -> f64 {
    let times = crate::pingpong::measure_on(s, count).unwrap_or_default();
    median(times.iter().map(|d| d.as_secs_f64() * 1e6).collect())
}

/// One configuration's result.
struct Outcome {
    mb_s: f64,
    head_cpu_s_per_gb: f64,
    head_bytes_share: f64,
    stat_idle_us: f64,
    stat_loaded_us: f64,
    locus_ping_idle_us: f64,
    locus_ping_loaded_us: f64,
    echo_idle_us: f64,
    echo_loaded_us: f64,
    /// Aggregate throughput of the clients' concurrent `locus put`s.
    write_mb_s: f64,
}

/// Median latencies (µs) at the head of `stat` (a namespace lookup) and of `ping` (no
/// lookup: the server's request path alone), over `samples` calls each, or until
/// `until` is true. Idle or loaded, a pair goes every 5 ms, so both see the same
/// wake-ups (back to back, idle calls would find the head's CPU awake, as loaded ones
/// spaced out cannot).
async fn probe_latency(client: &Client, samples: usize, until: &dyn Fn() -> bool) -> (f64, f64) {
    let (mut stats, mut pings) = (Vec::new(), Vec::new());
    while stats.len() < samples || (samples == 0 && !until()) {
        let t = Instant::now();
        let _ = client.stat("/f0").await;
        stats.push(t.elapsed().as_secs_f64() * 1e6);
        let t = Instant::now();
        let _ = client.ping().await;
        pings.push(t.elapsed().as_secs_f64() * 1e6);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    (median(stats), median(pings))
}

/// A head (with `head_flags` beside the usual), `nodes` data nodes and `clients` client
/// namespaces, the nodes joined; answers the network, the head's process id and the
/// nodes'.
pub(crate) fn start_cluster(
    args: &ClusterArgs,
    nodes: usize,
    clients: usize,
    head_flags: &[&str],
) -> Result<(Net, u32, Vec<u32>), BenchError> {
    let mut net = Net::new()?;
    net.host("head", 1, args.rate_mbit)?;
    for i in 1..=nodes {
        net.host(&format!("n{i}"), 10 + i as u8, args.rate_mbit)?;
    }
    for i in 1..=clients {
        net.host(&format!("c{i}"), 20 + i as u8, args.rate_mbit)?;
    }
    let head_url = head_url(args);
    let (root, state) = net.server_dirs("head")?;
    let listen = format!("10.77.0.1:{PORT}");
    let mut head_args =
        vec!["serve", "--head", "--listen", &listen, "--root", path(&root), "--state", path(&state), "--threads", "2"];
    head_args.extend_from_slice(head_flags);
    if args.tls {
        head_args.push("--tls");
    }
    let serve_head = net.locus("head", &[], &head_args);
    let head_pid = net.spawn(serve_head)?;
    std::thread::sleep(Duration::from_millis(500));
    if args.tls {
        net.tls_ca = Some(state.join("cert.pem"));
    }
    let mut node_pids = Vec::new();
    for i in 1..=nodes {
        let (root, state) = net.server_dirs(&format!("n{i}"))?;
        // Data nodes join as locus-node (which may do nothing else at the head).
        let node_token = format!("locus-node:{TOKEN}");
        let c = net.locus(
            &format!("n{i}"),
            &[("LOCUS_TOKEN", node_token.as_str())],
            &[
                "serve",
                "--data-node",
                &head_url,
                "--listen",
                &format!("10.77.0.{}:{PORT}", 10 + i),
                "--root",
                path(&root),
                "--state",
                path(&state),
            ],
        );
        node_pids.push(net.spawn(c)?);
    }
    std::thread::sleep(Duration::from_millis(1500));
    Ok((net, head_pid, node_pids))
}

/// The head's URL (`locus+tls://` under `--tls`).
pub(crate) fn head_url(args: &ClusterArgs) -> String {
    format!("{}://10.77.0.1:{PORT}/", if args.tls { "locus+tls" } else { "locus" })
}

pub(crate) fn connect_head(net: &Net, rt: &tokio::runtime::Runtime) -> Result<Client, BenchError> {
    let opts = ConnectOptions {
        addr: format!("10.77.0.1:{PORT}"),
        credentials: Credentials { subject: "admin".into(), token: TOKEN.into() },
        tls_ca: net.tls_ca.clone(),
        tls_name: net.tls_ca.as_ref().map(|_| "10.77.0.1".to_string()),
        deadlines: Default::default(),
    };
    rt.block_on(Client::connect(&opts)).map_err(|e| BenchError::Setup(format!("head: {e}")))
}

/// What a distributed `find` came to: medians over the timed runs.
struct FindOutcome {
    /// Runs planned from the namespace (the plan forgotten just before), and runs over
    /// the plan kept from the run before.
    cold: FindRuns,
    warm: FindRuns,
    lines: usize,
    /// Seconds taken to make the tree (once).
    made_in: f64,
}

/// Medians of one kind of `find` run.
#[derive(Default)]
struct FindRuns {
    /// The whole run as the client sees it.
    total: f64,
    /// Each node's share (its tree made, or taken from the kept ones, and the program
    /// run): CPU time, the time it would take alone on a machine of its own (a `find
    /// -name` does no I/O), and wall time here, where the nodes share two cores.
    node_cpu: Vec<f64>,
    node_wall: Vec<f64>,
}

/// The last storelet run's CPU and wall seconds in a node's accounts file.
fn last_account(state: &std::path::Path) -> Result<(f64, f64), BenchError> {
    let log =
        std::fs::read_to_string(state.join("storelet-accounts.log")).map_err(|e| BenchError::io("accounts", e))?;
    let line = log.lines().last().ok_or_else(|| BenchError::Setup("a node ran no storelet".into()))?;
    let field = |key: &str| -> Result<f64, BenchError> {
        let v = line.split(' ').find_map(|kv| kv.strip_prefix(key)).and_then(|v| v.parse::<f64>().ok());
        v.map(|us| us / 1e6).ok_or_else(|| BenchError::Setup(format!("no {key} in {line:?}")))
    };
    Ok((field("cpu_us=")?, field("wall_us=")?))
}

/// A distributed `find` over `args.find_files` small files (kept on the data nodes:
/// the head runs with `--inline-max 0`) spread on `nodes` nodes.
fn measure_find(
    args: &ClusterArgs,
    nodes: usize,
    module: &[u8],
    rt: &tokio::runtime::Runtime,
) -> Result<FindOutcome, BenchError> {
    let (net, _, _) = start_cluster(args, nodes, 0, &["--inline-max", "0"])?;
    let client = connect_head(&net, rt)?;
    let dirs = (args.find_files / 1000).max(20);
    let made = Instant::now();
    rt.block_on(async {
        client.mkdir("/tree", 0o755).await?;
        for d in 0..dirs {
            client.mkdir(&format!("/tree/d{d}"), 0o755).await?;
        }
        // Many puts in flight: each is a round trip, a version stored on a node and a
        // commit at the head.
        let mut puts = tokio::task::JoinSet::new();
        for i in 0..args.find_files {
            if puts.len() >= 64 {
                puts.join_next().await.expect("puts in flight").expect("a put task")?;
            }
            let c = client.clone();
            let path = format!("/tree/d{}/file{i}.dat", i % dirs);
            puts.spawn(async move { c.write_file(&path, 0o644, format!("file {i}\n").as_bytes()).await });
            if i > 0 && i % 100_000 == 0 {
                eprintln!("  {i} files made in {:.0} s", made.elapsed().as_secs_f64());
            }
        }
        while let Some(done) = puts.join_next().await {
            done.expect("a put task")?;
        }
        Ok::<_, locus_client::ClientError>(())
    })
    .map_err(|e| BenchError::Setup(format!("making the tree: {e}")))?;
    let made_in = made.elapsed().as_secs_f64();
    let mut lines = None;
    // Totals, and each node's CPU and wall times, of cold runs [0] and warm ones [1].
    let mut runs: [(Vec<f64>, Vec<Vec<f64>>, Vec<Vec<f64>>); 2] =
        std::array::from_fn(|_| (Vec::new(), vec![Vec::new(); nodes], vec![Vec::new(); nodes]));
    // The first run compiles the module on each node (kept in each node's cache). Then
    // each round runs cold (the head's kept plan forgotten by a change to the tree's
    // directory that changes nothing it holds) and warm (over the plan just kept).
    for round in 0..=args.repeat {
        for (kind, warm) in [(0, false), (1, true)] {
            if !warm {
                rt.block_on(client.chmod("/tree", 0o755)).map_err(|e| BenchError::Setup(format!("chmod: {e}")))?;
            }
            let started = Instant::now();
            let argv = ["/", "-name", "*77*"].map(String::from).to_vec();
            let out = rt
                .block_on(client.storelet_run(module, "/tree", argv, false))
                .map_err(|e| BenchError::Setup(format!("find: {e}")))?;
            let took = started.elapsed().as_secs_f64();
            let n = out.stdout.split(|&b| b == b'\n').filter(|l| !l.is_empty()).count();
            if *lines.get_or_insert(n) != n {
                return Err(BenchError::Setup(format!("find printed {n} lines, before {lines:?}")));
            }
            if round == 0 {
                continue;
            }
            let (totals, cpu, wall) = &mut runs[kind];
            totals.push(took);
            for i in 0..nodes {
                let (c, w) = last_account(&net.server_dirs(&format!("n{}", i + 1))?.1)?;
                cpu[i].push(c);
                wall[i].push(w);
            }
        }
    }
    let [cold, warm] = runs.map(|(totals, cpu, wall)| FindRuns {
        total: median(totals),
        node_cpu: cpu.into_iter().map(median).collect(),
        node_wall: wall.into_iter().map(median).collect(),
    });
    Ok(FindOutcome { cold, warm, lines: lines.unwrap_or(0), made_in })
}

/// A head and `n` nodes and clients; each client reads its file `repeat` times.
fn measure(
    args: &ClusterArgs,
    n: usize,
    third_party: bool,
    rt: &tokio::runtime::Runtime,
) -> Result<Outcome, BenchError> {
    let (net, head_pid, _) = start_cluster(args, n, n, &[])?;
    let head_url = head_url(args);
    let size = args.size_mb << 20;
    let client = connect_head(&net, rt)?;
    let data: Vec<u8> = (0..size).map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8).collect();
    for i in 0..n {
        rt.block_on(client.write_file(&format!("/f{i}"), 0o644, &data))
            .map_err(|e| BenchError::Setup(format!("put: {e}")))?;
    }
    let (idle, ping_idle) = rt.block_on(probe_latency(&client, 200, &|| true));
    let mut echo = echo_at_head()?;
    // Bursts of 20 every 5 ms, as under load below.
    let echo_idle = median(
        (0..10)
            .map(|_| {
                let t = echo_us(&mut echo, 20);
                std::thread::sleep(Duration::from_millis(5));
                t
            })
            .collect(),
    );
    let (mut echoes, mut pings) = (Vec::new(), Vec::new());

    let mut rates = Vec::new();
    let mut loaded = Vec::new();
    let (cpu0, tx0) = (cpu_seconds(head_pid), head_tx_bytes());
    for _ in 0..args.repeat {
        let started = Instant::now();
        let tp = if third_party { "1" } else { "0" };
        let mut readers: Vec<Child> = (0..n)
            .map(|i| {
                net.locus(
                    &format!("c{}", i + 1),
                    &[("LOCUS_THIRD_PARTY", tp)],
                    &["get", &format!("{head_url}f{i}"), "/dev/null"],
                )
                .spawn()
                .map_err(|e| BenchError::io("locus get", e))
            })
            .collect::<Result<_, _>>()?;
        let done = std::sync::atomic::AtomicBool::new(false);
        let latency = std::thread::scope(|s| {
            let probe =
                s.spawn(|| rt.block_on(probe_latency(&client, 0, &|| done.load(std::sync::atomic::Ordering::Relaxed))));
            let echo = s.spawn(|| {
                let mut times = Vec::new();
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    times.push(echo_us(&mut echo, 20));
                    std::thread::sleep(Duration::from_millis(5));
                }
                median(times)
            });
            let ok = readers.iter_mut().all(|r| r.wait().is_ok_and(|s| s.success()));
            done.store(true, std::sync::atomic::Ordering::Relaxed);
            echoes.push(echo.join().unwrap_or(0.0));
            (ok, probe.join().unwrap_or((0.0, 0.0)))
        });
        if !latency.0 {
            let logs: String = (1..=n)
                .map(|i| std::fs::read_to_string(net.dir.path().join(format!("c{i}.log"))).unwrap_or_default())
                .collect();
            return Err(BenchError::Setup(format!("a client's locus get failed: {}", logs.trim())));
        }
        rates.push((n as u64 * size) as f64 / started.elapsed().as_secs_f64() / 1e6);
        loaded.push(latency.1 .0);
        pings.push(latency.1 .1);
    }
    let served_gb = (args.repeat as u64 * n as u64 * size) as f64 / 1e9;
    let (cpu_s, head_tx) = (cpu_seconds(head_pid) - cpu0, head_tx_bytes() - tx0);
    let write_mb_s = measure_writes(args, &net, n, third_party, &data)?;
    Ok(Outcome {
        mb_s: median(rates),
        head_cpu_s_per_gb: cpu_s / served_gb,
        head_bytes_share: head_tx as f64 / (served_gb * 1e9),
        stat_idle_us: idle,
        stat_loaded_us: median(loaded),
        locus_ping_idle_us: ping_idle,
        locus_ping_loaded_us: median(pings),
        echo_idle_us: echo_idle,
        echo_loaded_us: median(echoes),
        write_mb_s,
    })
}

/// Each of `n` clients puts a file of `data`'s size, all at once, `repeat` times:
/// the median aggregate MB/s.
fn measure_writes(args: &ClusterArgs, net: &Net, n: usize, third_party: bool, data: &[u8]) -> Result<f64, BenchError> {
    let local = net.dir.path().join("upload.dat");
    std::fs::write(&local, data).map_err(|e| BenchError::io("upload file", e))?;
    let head_url = head_url(args);
    let tp = if third_party { "1" } else { "0" };
    let mut rates = Vec::new();
    for run in 0..args.repeat {
        let started = Instant::now();
        let writers: Vec<Child> = (0..n)
            .map(|i| {
                let url = format!("{head_url}w{run}.{i}");
                net.locus(&format!("c{}", i + 1), &[("LOCUS_THIRD_PARTY", tp)], &["put", path(&local), &url])
                    .spawn()
                    .map_err(|e| BenchError::io("locus put", e))
            })
            .collect::<Result<_, _>>()?;
        let mut ok = true;
        for mut w in writers {
            ok &= w.wait().is_ok_and(|s| s.success());
        }
        if !ok {
            return Err(BenchError::Setup("a client's locus put failed (see the c*.log files)".into()));
        }
        rates.push((n * data.len()) as f64 / started.elapsed().as_secs_f64() / 1e6);
    }
    Ok(median(rates))
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap_or("")
}

/// Runs the experiment and prints a Markdown table.
pub fn run(args: ClusterArgs) -> Result<(), BenchError> {
    if !rustix::process::geteuid().is_root() {
        return Err(BenchError::Setup("locus bench cluster makes network namespaces: run it as root".into()));
    }
    // The latency probe runs here: it too stands for a machine of its own.
    let _ = rustix::process::setpriority_process(None, -10);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| BenchError::io("runtime", e))?;
    println!(
        "Each host's link sends at {} Mbit/s ({:.1} MB/s); {} MiB per client; median of {} runs.\n",
        args.rate_mbit,
        args.rate_mbit as f64 / 8.0,
        args.size_mb,
        args.repeat
    );
    println!("| data nodes = clients | third-party | aggregate MB/s | x one node (tp) | head CPU s/GB | head bytes / bytes served | stat µs idle | stat µs under load | ratio | Locus ping µs idle → under load | bare TCP echo µs idle → under load (floor) | write MB/s | x one node (tp write) |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let (mut one, mut one_write) = (None, None);
    for &n in &args.nodes {
        for tp in [true, false] {
            let o = measure(&args, n, tp, &rt)?;
            if tp && n == 1 {
                (one, one_write) = (Some(o.mb_s), Some(o.write_mb_s));
            }
            let scale = one.map_or("-".to_string(), |b| format!("{:.2}", o.mb_s / b));
            let write_scale = one_write.map_or("-".to_string(), |b| format!("{:.2}", o.write_mb_s / b));
            println!(
                "| {n} | {} | {:.1} | {scale} | {:.2} | {:.1}% | {:.0} | {:.0} | {:.2}x | {:.0} → {:.0} ({:.2}x) | {:.0} → {:.0} ({:.2}x) | {:.1} | {write_scale} |",
                if tp { "on" } else { "off" },
                o.mb_s,
                o.head_cpu_s_per_gb,
                o.head_bytes_share * 100.0,
                o.stat_idle_us,
                o.stat_loaded_us,
                o.stat_loaded_us / o.stat_idle_us,
                o.locus_ping_idle_us,
                o.locus_ping_loaded_us,
                o.locus_ping_loaded_us / o.locus_ping_idle_us,
                o.echo_idle_us,
                o.echo_loaded_us,
                o.echo_loaded_us / o.echo_idle_us,
                o.write_mb_s
            );
        }
    }
    if args.find_files > 0 {
        let find = locus_storelet::build_shipped("find").map_err(BenchError::Setup)?;
        let one = measure_find(&args, 1, &find, &rt)?;
        let four = measure_find(&args, 4, &find, &rt)?;
        println!(
            "\nDistributed `find / -name '*77*'` (the shipped Go storelet, compiled on each node before timing) over {} files of a few bytes kept on the data nodes (`--inline-max 0`), {} per directory; made in {:.0} s and {:.0} s:\n",
            args.find_files,
            args.find_files / (args.find_files / 1000).max(20),
            one.made_in,
            four.made_in
        );
        let fmt = |v: &[f64]| v.iter().map(|s| format!("{s:.3}")).collect::<Vec<_>>().join(" / ");
        println!("| data nodes | plan | whole run here (s) | each node's share, CPU = alone (s) | each node's share, wall here (s) | lines |");
        println!("|---|---|---|---|---|---|");
        for (n, o) in [(1, &one), (4, &four)] {
            for (plan, r) in [("made now", &o.cold), ("kept", &o.warm)] {
                let (cpu, wall) = (fmt(&r.node_cpu), fmt(&r.node_wall));
                println!("| {n} | {plan} | {:.3} | {cpu} | {wall} | {} |", r.total, o.lines);
            }
        }
        // On machines of their own: the head's part (planning, sending, merging: the
        // whole run less its slowest share here) and the slowest share alone.
        let own = |r: &FindRuns| {
            let slowest_here = r.node_wall.iter().cloned().fold(0.0, f64::max);
            let slowest_alone = r.node_cpu.iter().cloned().fold(0.0, f64::max);
            (r.total - slowest_here).max(0.0) + slowest_alone
        };
        for (plan, a, b) in [("made now", &one.cold, &four.cold), ("kept", &one.warm, &four.warm)] {
            let (own_one, own_four) = (own(a), own(b));
            let alone = |r: &FindRuns| r.node_cpu.iter().cloned().fold(0.0, f64::max);
            println!(
                "\nPlan {plan}: slowest share alone 1 node {:.3} s, 4 nodes {:.3} s: {:.2}x. Makespan on machines of their own (head's part + slowest share alone): 1 node {own_one:.3} s, 4 nodes {own_four:.3} s: **{:.2}x** one node's. The whole run on this machine: 4 nodes {:.2}x one node's.",
                alone(a),
                alone(b),
                alone(b) / alone(a),
                own_four / own_one,
                b.total / a.total
            );
        }
    }
    Ok(())
}
