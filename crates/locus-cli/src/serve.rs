//! `locus serve` and `locus token`.

use clap::Args;
use locus_client::credentials::{credentials_file, locus_home};
use locus_server::{config, Server, ServerConfig, Tokens};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Options of `locus serve`.
#[derive(Args)]
pub struct ServeArgs {
    /// Directory to export (default: ~/.locus/export, created if missing).
    #[arg(long)]
    root: Option<PathBuf>,
    /// Another storage directory whose files join the namespace (repeatable): new files
    /// go to the device with the most free space, `locus rebalance` moves files between
    /// them by measured load. The export root is the first device.
    #[arg(long = "device", value_name = "DIR")]
    devices: Vec<PathBuf>,
    /// Server-private state: tokens, TLS identity (default: ~/.locus/server).
    #[arg(long)]
    state: Option<PathBuf>,
    /// Address to listen on; port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:9610")]
    listen: String,
    /// Serve TLS with the certificate in the state directory (self-signed on first use).
    #[arg(long)]
    tls: bool,
    /// Write the port actually bound to this file (useful with port 0); lines `chirp
    /// PORT` and `http PORT` follow with --chirp-port and --http-port.
    #[arg(long)]
    port_file: Option<PathBuf>,
    /// Connections served at once.
    #[arg(long, default_value_t = 1024)]
    max_connections: usize,
    /// Connection threads (default: one per CPU).
    #[arg(long)]
    threads: Option<usize>,
    /// Script interpreter threads (default: one per CPU).
    #[arg(long)]
    script_workers: Option<usize>,
    /// Large reads with sendfile: always, auto (a copy for clients on this host, for
    /// readers that wake on every segment), or never.
    #[arg(long, default_value = "always")]
    sendfile: locus_server::Sendfile,
    /// Microseconds a connection that has just answered keeps polling for the next
    /// request before it sleeps, so that a client in conversation does not wait for the
    /// server's CPU to wake (0: never poll). Polls that find nothing back off, so clients
    /// that pause between requests soon cost almost nothing.
    #[arg(long, default_value_t = config::DEFAULT_POLL_WINDOW.as_micros() as u64)]
    poll_us: u64,
    /// Lua instructions one script call may run.
    #[arg(long, default_value_t = locus_script::Limits::default().instructions)]
    script_instructions: u64,
    /// Memory (MiB) one script call may use, buffers included.
    #[arg(long, default_value_t = (locus_script::Limits::default().memory >> 20) as u64)]
    script_memory_mb: u64,
    /// Wall-clock time (ms) one script call may take.
    #[arg(long, default_value_t = locus_script::Limits::default().wall.as_millis() as u64)]
    script_time_ms: u64,
    /// Bytes (MiB) of results one script call may return.
    #[arg(long, default_value_t = (locus_script::Limits::default().result_bytes >> 20) as u64)]
    script_result_mb: u64,
    /// Storelets running at once (worker threads at the lowest priority); more queue.
    #[arg(long, default_value_t = locus_server::storelet_host::StoreletConfig::default().workers)]
    storelet_workers: usize,
    /// Storelet runs one subject may have queued or running at once.
    #[arg(long, default_value_t = locus_server::storelet_host::StoreletConfig::default().runs_per_subject)]
    storelet_runs_per_subject: usize,
    /// CPU seconds one subject's storelets may use per budget window.
    #[arg(long, default_value_t = locus_server::storelet_host::StoreletConfig::default().cpu_budget.as_secs())]
    storelet_cpu_budget_s: u64,
    /// Length of the storelet CPU budget window, in seconds.
    #[arg(long, default_value_t = locus_server::storelet_host::StoreletConfig::default().budget_window.as_secs())]
    storelet_budget_window_s: u64,
    /// Fuel (about one unit per WebAssembly instruction) one storelet run may use.
    #[arg(long, default_value_t = locus_storelet::Limits::default().fuel)]
    storelet_fuel: u64,
    /// Memory (MiB) one storelet run may use.
    #[arg(long, default_value_t = (locus_storelet::Limits::default().memory >> 20) as u64)]
    storelet_memory_mb: u64,
    /// Wall-clock seconds one storelet run may take.
    #[arg(long, default_value_t = locus_storelet::Limits::default().wall.as_secs())]
    storelet_time_s: u64,
    /// Serve Prometheus metrics at http://ADDR/metrics (operations by name and result,
    /// service times, bytes, connections, code runs per subject, limits tripped).
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
    /// MiB the active files' result cache may hold (least recently used results go first).
    #[arg(long, default_value_t = locus_server::ServerConfig::new("", "").active_cache_bytes >> 20)]
    active_cache_mb: u64,
    /// Serve as a cluster head: the namespace in a database, file contents on the data
    /// nodes that join it, large reads sent straight from the nodes (third-party).
    #[arg(long, conflicts_with = "data_node")]
    head: bool,
    /// The head's namespace: a SQLite file (default: STATE/meta.db) or a PostgreSQL URL
    /// (postgres://USER@HOST/DB), which several heads may share.
    #[arg(long, value_name = "URL", requires = "head")]
    meta: Option<String>,
    /// Files of at least this many bytes are read from data nodes, not through the head.
    #[arg(long, default_value_t = locus_server::head::HeadConfig::new("").tp_threshold, requires = "head")]
    tp_threshold: u64,
    /// Files of at most this many bytes live in the namespace instead of on data nodes.
    #[arg(long, default_value_t = locus_server::head::HeadConfig::new("").inline_max, requires = "head")]
    inline_max: u64,
    /// Data nodes that hold each file version (2 keeps every byte readable when one dies).
    #[arg(long, default_value_t = 1, requires = "head")]
    replication: usize,
    /// Seconds a third-party read capability stays valid.
    #[arg(long, default_value_t = 60, requires = "head")]
    capability_ttl_s: u64,
    /// Serve as a data node of the head at this URL (locus://HOST:PORT/). The node
    /// joins as the subject locus-node, whose token the head makes on first start (in
    /// its tokens file): give it as LOCUS_TOKEN=locus-node:TOKEN. Default root and state:
    /// ~/.locus/nodes/PORT/.
    #[arg(long, value_name = "HEAD_URL")]
    data_node: Option<String>,
    /// The address clients and the head reach this data node at (default: the listen
    /// address).
    #[arg(long, value_name = "HOST:PORT", requires = "data_node")]
    advertise: Option<String>,
    /// Also speak the Chirp protocol (CCTools' `chirp`, `parrot_run`) on this port, at the
    /// listen address. Chirp clients are the subjects METHOD:NAME (`unix:alice`,
    /// `hostname:HOST`, `address:IP`) and hold what ACLs grant those names: nothing by
    /// default.
    #[arg(long, value_name = "PORT", conflicts_with = "head")]
    chirp_port: Option<u16>,
    /// The Chirp authentication methods offered, comma-separated.
    #[arg(long, value_name = "METHODS", default_value = "unix,hostname,address", requires = "chirp_port",
          value_delimiter = ',', value_parser = parse_chirp_method)]
    chirp_auth: Vec<locus_server::chirp::AuthMethod>,
    /// Where Chirp's `unix` method asks clients to create their challenge file (a
    /// directory both sides see, as on one host).
    #[arg(long, value_name = "DIR", default_value = "/tmp", requires = "chirp_port")]
    chirp_challenge_dir: PathBuf,
    /// Seconds a Chirp client may stay silent before its connection is closed (Chirp
    /// clients connect again when they need to).
    #[arg(long, value_name = "SECONDS", default_value_t = 60, requires = "chirp_port")]
    chirp_idle_s: u64,
    /// Also serve HTTP on this port (same address as --listen; 0 picks one). A server
    /// of its own export serves the web console there (log in with a token: browse and
    /// transfer files, see the load of the last hour, see and cancel running code). A
    /// head or a data node serves its files: GET with Range and HEAD; a head redirects
    /// large reads to a data node.
    #[arg(long)]
    http_port: Option<u16>,
    /// Milliseconds between the console's load samples (it keeps the last hour).
    #[arg(long, default_value_t = 5000, value_name = "MS")]
    load_sample_ms: u64,
}

/// Parses a Chirp authentication method's name.
fn parse_chirp_method(name: &str) -> Result<locus_server::chirp::AuthMethod, String> {
    locus_server::chirp::AuthMethod::parse(name.trim())
        .ok_or_else(|| format!("{name}: not a Chirp method Locus offers (unix, hostname, address)"))
}

/// Starts a server and runs it until SIGINT or SIGTERM.
pub fn run(args: ServeArgs) -> Result<(), String> {
    let home = locus_home();
    let mut config = ServerConfig::embedded(&home);
    if args.data_node.is_some() {
        let port = args.listen.rsplit(':').next().unwrap_or("0");
        let base = home.join("nodes").join(port);
        (config.root, config.state_dir) = (base.join("export"), base.join("state"));
    }
    if let Some(root) = args.root {
        config.root = root;
    }
    if let Some(state) = args.state {
        config.state_dir = state;
    }
    config.devices = args.devices;
    config.tls = args.tls;
    config.sendfile = args.sendfile;
    config.poll_window = std::time::Duration::from_micros(args.poll_us);
    config.max_connections = args.max_connections.max(1);
    if let Some(threads) = args.threads {
        config.threads = threads.max(1);
    }
    if let Some(workers) = args.script_workers {
        config.script_workers = workers.max(1);
    }
    config.script_limits = locus_script::Limits {
        instructions: args.script_instructions,
        memory: (args.script_memory_mb as usize) << 20,
        wall: std::time::Duration::from_millis(args.script_time_ms),
        result_bytes: (args.script_result_mb as usize) << 20,
    };
    let limits_file = config.state_dir.join(config::SCRIPT_LIMITS_FILE);
    if let Ok(text) = std::fs::read_to_string(&limits_file) {
        config.script_limits_by_subject =
            config::parse_script_limits(&text, config.script_limits).map_err(|e| e.to_string())?;
    }
    let storelets = &mut config.storelets;
    storelets.workers = args.storelet_workers.max(1);
    storelets.runs_per_subject = args.storelet_runs_per_subject.max(1);
    storelets.cpu_budget = std::time::Duration::from_secs(args.storelet_cpu_budget_s);
    storelets.budget_window = std::time::Duration::from_secs(args.storelet_budget_window_s.max(1));
    storelets.limits.fuel = args.storelet_fuel;
    storelets.limits.memory = (args.storelet_memory_mb as usize) << 20;
    storelets.limits.wall = std::time::Duration::from_secs(args.storelet_time_s);
    config.active_cache_bytes = args.active_cache_mb << 20;
    if args.head {
        let meta = args.meta.clone().unwrap_or_else(|| config.state_dir.join("meta.db").display().to_string());
        let mut head = locus_server::head::HeadConfig::new(meta);
        head.tp_threshold = args.tp_threshold;
        head.inline_max = args.inline_max;
        head.replication = args.replication.max(1);
        head.capability_ttl = std::time::Duration::from_secs(args.capability_ttl_s.max(1));
        let host = args.listen.rsplit_once(':').map_or(args.listen.as_str(), |(h, _)| h);
        head.http = args.http_port.map(|port| format!("{host}:{port}"));
        config.head = Some(head);
    }
    let head_options = match &args.data_node {
        Some(url) => {
            let url = locus_client::url::LocusUrl::parse(url).map_err(|e| e.to_string())?;
            Some(locus_client::ConnectOptions::for_url(&url).map_err(|e| format!("credentials for the head: {e}"))?)
        }
        None => None,
    };
    config.prepare().map_err(|e| e.to_string())?;
    let (mut tokens, created) = Tokens::load_or_create(&config.state_dir).map_err(|e| e.to_string())?;
    // A head makes the token its data nodes join with (they hold no admin token).
    let node = locus_proto::capability::NODE_SUBJECT;
    let node_token = match (&config.head, tokens.get(node)) {
        (Some(_), None) => {
            let token = append_token(&config.state_dir, node)?;
            tokens = Tokens::load_or_create(&config.state_dir).map_err(|e| e.to_string())?.0;
            Some(token)
        }
        _ => None,
    };
    // A new server's admin token becomes the user's default credentials (a data node's
    // stays its own: its clients are its head).
    let saved = match &created {
        Some(token) if args.data_node.is_none() => remember_admin_token(token)?,
        _ => false,
    };
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(|e| e.to_string())?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(&args.listen)
            .await
            .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let server = Server::new(config.clone(), tokens).map_err(|e| e.to_string())?;
        let scheme = if config.tls { "locus+tls" } else { "locus" };
        match &config.head {
            Some(head) => eprintln!("Locus cluster head at {scheme}://{addr}/ (namespace in {})", head.meta),
            None => eprintln!("Locus is serving {} at {scheme}://{addr}/", config.root.display()),
        }
        eprintln!("  state (tokens, TLS): {}", config.state_dir.display());
        match (&created, saved) {
            (Some(_), true) => eprintln!("  admin token saved to {}", credentials_file().display()),
            (Some(token), false) => {
                eprintln!("  new admin token: {token} (use LOCUS_TOKEN=admin:{token})")
            }
            _ => {}
        }
        if config.head.is_some() {
            let path = config.state_dir.join(config::TOKENS_FILE);
            match &node_token {
                Some(token) => {
                    eprintln!("  data nodes join with LOCUS_TOKEN={node}:{token} (kept in {})", path.display())
                }
                None => eprintln!("  data nodes join with the {node} token in {}", path.display()),
            }
            eprintln!(
                "  cluster wrap key: {} (every head of this namespace needs a copy, mode 0600)",
                config.state_dir.join(locus_server::keys::WRAP_FILE).display()
            );
        }
        eprintln!("  try: locus ls {scheme}://{addr}/");
        eprintln!(
            "  active-file handlers: {} (read again on change or SIGHUP)",
            config.state_dir.join(locus_server::active::HANDLERS_FILE).display()
        );
        if let Some(addr) = &args.metrics {
            let metrics = tokio::net::TcpListener::bind(addr).await.map_err(|e| format!("metrics on {addr}: {e}"))?;
            let at = metrics.local_addr().map_err(|e| e.to_string())?;
            eprintln!("  metrics: http://{at}/metrics");
            tokio::spawn(locus_server::metrics::serve(metrics, server.shared().clone()));
        }
        let mut ports = format!("{}\n", addr.port());
        if let Some(port) = args.chirp_port {
            let at = std::net::SocketAddr::new(addr.ip(), port);
            let listener = tokio::net::TcpListener::bind(at).await.map_err(|e| format!("Chirp on {at}: {e}"))?;
            let at = listener.local_addr().map_err(|e| e.to_string())?;
            ports.push_str(&format!("chirp {}\n", at.port()));
            let methods: Vec<&str> = args.chirp_auth.iter().map(|m| m.name()).collect();
            eprintln!("  Chirp: {at} (auth: {})", methods.join(", "));
            let config = locus_server::chirp::ChirpConfig {
                methods: args.chirp_auth.clone(),
                challenge_dir: args.chirp_challenge_dir.clone(),
                idle: std::time::Duration::from_secs(args.chirp_idle_s),
            };
            tokio::spawn(locus_server::chirp::serve(listener, server.shared().clone(), config));
        }
        let advertise = args.advertise.clone().unwrap_or_else(|| addr.to_string());
        let http = match args.http_port {
            Some(port) => {
                let at = std::net::SocketAddr::new(addr.ip(), port);
                let listener = tokio::net::TcpListener::bind(at).await.map_err(|e| format!("HTTP on {at}: {e}"))?;
                let host = advertise.rsplit_once(':').map_or(advertise.as_str(), |(h, _)| h);
                let public = format!("{host}:{}", listener.local_addr().map_err(|e| e.to_string())?.port());
                let shared = server.shared().clone();
                if config.head.is_none() && head_options.is_none() {
                    eprintln!("  web console: {}://{public}/", if config.tls { "https" } else { "http" });
                    let tls = match config.tls {
                        true => Some(config::tls_acceptor(&config.state_dir).map_err(|e| e.to_string())?),
                        false => None,
                    };
                    let console = locus_console::ConsoleConfig {
                        sample_every: std::time::Duration::from_millis(args.load_sample_ms.max(10)),
                        tls,
                        ..Default::default()
                    };
                    tokio::spawn(locus_console::serve(listener, shared, console));
                } else {
                    eprintln!("  HTTP: http://{public}/");
                    tokio::spawn(locus_server::http::serve(listener, shared));
                }
                Some(public)
            }
            None => None,
        };
        if let Some(public) = &http {
            ports.push_str(&format!("http {}\n", public.rsplit(':').next().unwrap_or("0")));
        }
        if let Some(p) = &args.port_file {
            std::fs::write(p, ports).map_err(|e| format!("{}: {e}", p.display()))?;
        }
        if let Some(head) = head_options {
            eprintln!("  data node of {}, reached at {advertise}", head.addr);
            tokio::spawn(locus_server::node::serve_head(server.shared().clone(), head, advertise, http));
        }
        let shared = server.shared().clone();
        tokio::spawn(async move {
            use tokio::signal::unix::{signal, SignalKind};
            let Ok(mut hup) = signal(SignalKind::hangup()) else { return };
            while hup.recv().await.is_some() {
                shared.active.reload();
                tracing::info!("SIGHUP: active-file handlers read again");
            }
        });
        server.run(listener, shutdown_signal()).await;
        eprintln!("Locus stopped.");
        Ok(())
    })
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// Saves a new server's admin token as the client's default credentials, unless the user
/// already keeps credentials there; answers whether it did.
fn remember_admin_token(token: &str) -> Result<bool, String> {
    let path = credentials_file();
    if path.exists() {
        return Ok(false);
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    writeln!(f, "# HOST:PORT SUBJECT TOKEN; * matches any server\n* {} {token}", config::ADMIN_SUBJECT)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(true)
}

/// `locus token SUBJECT`: appends a new token to the server's token file.
pub fn add_token(subject: &str, state: &Path) -> Result<(), String> {
    if subject.is_empty() || subject.chars().any(|c| c.is_whitespace() || c == ':') {
        return Err(format!("bad subject name {subject:?}"));
    }
    std::fs::create_dir_all(state).map_err(|e| format!("{}: {e}", state.display()))?;
    Tokens::load_or_create(state).map_err(|e| e.to_string())?;
    let path = state.join(config::TOKENS_FILE);
    let existing = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    if Tokens::parse(&existing).map_err(|e| e.to_string())?.get(subject).is_some() {
        return Err(format!("{subject} already has a token in {}", path.display()));
    }
    let token = append_token(state, subject)?;
    println!("{subject}:{token}");
    eprintln!("(a running server picks new tokens up when restarted)");
    Ok(())
}

/// Appends a new token for `subject` to the token file in `state`; answers it.
fn append_token(state: &Path, subject: &str) -> Result<String, String> {
    let path = state.join(config::TOKENS_FILE);
    let token = config::new_token();
    let mut f = std::fs::OpenOptions::new().append(true).open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    writeln!(f, "{subject} {token}").map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(token)
}
