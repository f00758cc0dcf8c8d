//! `locus serve` and `locus token`.

use clap::Args;
use locus_client::credentials::{credentials_file, locus_home};
use locus_server::{config, Server, ServerConfig, Tokens};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

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
    /// Another address that reaches this server (repeatable): a DNS name, a NAT address,
    /// a proxy. A login proof covers the address the client dialled; on plain TCP this
    /// server accepts only its own addresses (listen address, interfaces when listening
    /// on a wildcard, localhost, its host name) and these. HOST alone means HOST at the
    /// listen port; HOST:* any port on HOST (proxies on that host).
    #[arg(long = "name", value_name = "HOST[:PORT]")]
    names: Vec<locus_server::login::ServerName>,
    /// Serve TLS with the certificate in the state directory (self-signed on first use).
    /// A cluster head's is issued at each start by its cluster's authority, and every
    /// link of the cluster is TLS: STATE/cert.pem then holds the authority, the file
    /// clients and data nodes trust (LOCUS_TLS_CA); a data node is issued its own when it
    /// joins and serves TLS from then on.
    #[arg(long)]
    tls: bool,
    /// Write the port actually bound to this file (useful with port 0); lines `metrics
    /// PORT`, `chirp PORT` and `http PORT` follow with --metrics, --chirp-port and
    /// --http-port.
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
    /// Callback promises one subject may hold over all its connections (`locus mount
    /// --consistency afs|sprite`); past it, answers are not promised and the client
    /// caches them only for its timeout (counted in `locus stats`).
    #[arg(long, default_value_t = locus_server::callbacks::PromiseLimits::default().per_subject)]
    max_promises: usize,
    /// MiB of callback promises one subject may hold (a path and 128 bytes each).
    #[arg(long, default_value_t = locus_server::callbacks::PromiseLimits::default().bytes_per_subject >> 20)]
    max_promise_mb: usize,
    /// inotify watches the server keeps for promises (default: half of
    /// fs.inotify.max_user_watches); past it, promises that need another are refused.
    #[arg(long)]
    max_watches: Option<usize>,
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
    /// service times, bytes, connections, code runs per subject, limits tripped). A bare
    /// PORT listens on loopback (127.0.0.1:PORT); another address must be written out
    /// (0.0.0.0:9100).
    #[arg(long, value_name = "PORT|ADDR")]
    metrics: Option<String>,
    /// Scrapes of --metrics must send `Authorization: Bearer TOKEN`, TOKEN being this
    /// file's contents (Prometheus: `authorization: {credentials_file: FILE}`). Use a
    /// token of its own, not a subject's: plain HTTP carries it readable.
    #[arg(long, value_name = "FILE", requires = "metrics")]
    metrics_token_file: Option<PathBuf>,
    /// The longest lifetime, in seconds, `locus share --ttl` may give a URL on this head;
    /// longer asks are refused (EINVAL), and URLs expiring further ahead are not honoured.
    #[arg(long, value_name = "SECS", default_value_t = locus_server::cluster::SHARE_MAX_TTL.as_secs(), requires = "head")]
    share_max_ttl: u64,
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
    #[arg(long, default_value_t = locus_server::cluster::HeadConfig::new("").tp_threshold, requires = "head")]
    tp_threshold: u64,
    /// Files of at most this many bytes live in the namespace instead of on data nodes.
    #[arg(long, default_value_t = locus_server::cluster::HeadConfig::new("").inline_max, requires = "head")]
    inline_max: u64,
    /// Data nodes that hold each file version (2 keeps every byte readable when one dies).
    #[arg(long, default_value_t = 1, requires = "head")]
    replication: usize,
    /// Seconds a third-party read capability stays valid (and a write capability may
    /// start uploads); replaced versions are kept this long plus 5 s for reads under way.
    #[arg(long, default_value_t = 60, requires = "head")]
    capability_ttl_s: u64,
    /// Seconds without a heartbeat after which a data node is down: its versions are
    /// copied from their replicas to other nodes until each has --replication again (so
    /// a node restarted more slowly than this has its contents copied elsewhere).
    #[arg(long, value_name = "SECS", default_value_t = locus_server::cluster::HeadConfig::new("").node_timeout.as_secs(), requires = "head")]
    node_timeout_s: u64,
    /// MiB a second healing copies between nodes at most (0: as fast as the links go).
    #[arg(long, value_name = "MIB", default_value_t = locus_server::cluster::HeadConfig::new("").repair_rate >> 20, requires = "head")]
    repair_rate_mib: u64,
    /// Serve as a data node of the head at this URL (locus://HOST:PORT/; several heads
    /// of one namespace as locus://H1:PORT,H2:PORT/, joined whichever answers). The node
    /// joins as the subject locus-node, whose token the head makes on first start (in
    /// its tokens file): give it as LOCUS_TOKEN=locus-node:TOKEN. Default root and state:
    /// ~/.locus/nodes/PORT/.
    #[arg(long, value_name = "HEAD_URL")]
    data_node: Option<String>,
    /// The address others reach this server at (default: the listen address). A data
    /// node's: where clients and its head reach it. A head's: where data nodes reach it,
    /// kept in the namespace so that every node learns every head (a head listening on a
    /// wildcard address and given none is not told to nodes).
    #[arg(long, value_name = "HOST:PORT")]
    advertise: Option<String>,
    /// Hours between the starts of a data node's scrubs, which read every version it
    /// keeps and check its checksums (a damaged one is moved aside and copied again from
    /// a replica).
    #[arg(long, value_name = "HOURS", default_value_t = 24, requires = "data_node")]
    scrub_every_h: u64,
    /// MiB a second a scrub reads at most (0: unlimited).
    #[arg(long, value_name = "MIB", default_value_t = locus_server::cluster::node::Scrub::default().rate >> 20, requires = "data_node")]
    scrub_rate_mib: u64,
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
    /// or a cluster head serves the web console there (log in with a token: browse and
    /// transfer files, see the load of the last hour, per data node on a head, see and
    /// cancel running code). A head also serves its files there by path (GET with Range
    /// and HEAD, large reads redirected to a data node; the console's own paths, `/`,
    /// `/api/...` and its scripts and styles, are not files'). A data node serves the
    /// versions it keeps to holders of a capability.
    #[arg(long)]
    http_port: Option<u16>,
    #[command(flatten)]
    s3: crate::s3_door::S3Args,
    /// Milliseconds between the console's load samples (it keeps the last hour).
    #[arg(long, default_value_t = 5000, value_name = "MS")]
    load_sample_ms: u64,
}

/// The metrics token kept in `file` (surrounding whitespace dropped); an empty or
/// unreadable file is an error, not an open endpoint.
fn read_metrics_token(file: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(file).map_err(|e| format!("--metrics-token-file {}: {e}", file.display()))?;
    let token = text.trim();
    if token.is_empty() || token.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("--metrics-token-file {}: the file must hold one token", file.display()));
    }
    Ok(token.to_string())
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
    config.names = args.names.clone();
    config.tls = args.tls;
    config.sendfile = args.sendfile;
    config.poll_window = std::time::Duration::from_micros(args.poll_us);
    config.promises = locus_server::callbacks::PromiseLimits {
        per_subject: args.max_promises.max(1),
        bytes_per_subject: args.max_promise_mb.max(1) << 20,
        watches: args.max_watches,
    };
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
        let mut head = locus_server::cluster::HeadConfig::new(meta);
        head.tp_threshold = args.tp_threshold;
        head.inline_max = args.inline_max;
        head.replication = args.replication.max(1);
        head.node_timeout = Duration::from_secs(args.node_timeout_s.max(1));
        head.repair_rate = args.repair_rate_mib << 20;
        head.capability_ttl = std::time::Duration::from_secs(args.capability_ttl_s.max(1));
        head.share_max_ttl = std::time::Duration::from_secs(args.share_max_ttl);
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
    let admin_token = tokens.get(config::ADMIN_SUBJECT).map(|t| String::from_utf8_lossy(t).into_owned());
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
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(|e| e.to_string())?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(&args.listen)
            .await
            .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let advertise = args.advertise.clone().unwrap_or_else(|| addr.to_string());
        if args.data_node.is_some() || (config.head.is_some() && args.advertise.is_some()) {
            // The head and the clients log in to a data node at the address it advertises;
            // data nodes log in to a head at the address it advertises.
            config.names.push(advertise.parse().map_err(|e| format!("--advertise: {e}"))?);
        }
        if let Some(head) = config.head.as_mut() {
            head.advertise = args.advertise.clone();
            // A TLS head's certificate names the address it listens at, which it tells
            // nodes and clients when it has no --advertise.
            if config.tls && !addr.ip().is_unspecified() && args.advertise.is_none() {
                config.names.push(addr.to_string().parse().map_err(|e| format!("{addr}: {e}"))?);
            }
        }
        config.data_node = args.data_node.is_some();
        // The admin token of a new server (or of the user's own, in ~/.locus/server)
        // becomes the user's credentials for the addresses a local client dials; a data
        // node's stays its own: its clients are its head.
        let saved = match &admin_token {
            Some(token) if args.data_node.is_none() => {
                let fresh = created.is_some() || config.state_dir == home.join("server");
                remember_admin_token(token, &local_addresses(addr, &args.listen), fresh)?
            }
            _ => Vec::new(),
        };
        let server = Server::new(config.clone(), tokens).map_err(|e| e.to_string())?;
        let scheme = if config.tls { "locus+tls" } else { "locus" };
        match &config.head {
            Some(head) => eprintln!("Locus cluster head at {scheme}://{addr}/ (namespace in {})", head.meta),
            None => eprintln!("Locus is serving {} at {scheme}://{addr}/", config.root.display()),
        }
        eprintln!("  state (tokens, TLS): {}", config.state_dir.display());
        match (&created, saved.is_empty()) {
            (_, false) => eprintln!("  admin token saved to {} for {}", credentials_file().display(), saved.join(", ")),
            (Some(token), true) => {
                eprintln!("  new admin token: {token} (use LOCUS_TOKEN=admin:{token})")
            }
            (None, true) if args.data_node.is_none() => eprintln!(
                "  admin token in {} (use LOCUS_TOKEN=admin:TOKEN, or a line `HOST:PORT admin TOKEN` in {})",
                config.state_dir.join(config::TOKENS_FILE).display(),
                credentials_file().display()
            ),
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
                config.state_dir.join(locus_server::cluster::keys::WRAP_FILE).display()
            );
        }
        // A wildcard address is no place to dial: a client here reaches it on loopback.
        let dial = if addr.ip().is_unspecified() { format!("127.0.0.1:{}", addr.port()) } else { addr.to_string() };
        eprintln!("  try: locus ls {scheme}://{dial}/");
        eprintln!(
            "  active-file handlers: {} (read again on change or SIGHUP)",
            config.state_dir.join(locus_server::active::HANDLERS_FILE).display()
        );
        let mut ports = format!("{}\n", addr.port());
        if let Some(spec) = &args.metrics {
            let addr = locus_server::metrics::listen_address(spec).map_err(|e| format!("--metrics {e}"))?;
            let token = match &args.metrics_token_file {
                Some(file) => Some(read_metrics_token(file)?),
                None => None,
            };
            let metrics = tokio::net::TcpListener::bind(&addr).await.map_err(|e| format!("metrics on {addr}: {e}"))?;
            let at = metrics.local_addr().map_err(|e| e.to_string())?;
            let guarded = if token.is_some() { " (bearer token required)" } else { "" };
            eprintln!("  metrics: http://{at}/metrics{guarded}");
            if token.is_none() && !at.ip().to_canonical().is_loopback() {
                eprintln!("  warning: metrics are open to anyone reaching {at}; see --metrics-token-file");
            }
            ports.push_str(&format!("metrics {}\n", at.port()));
            tokio::spawn(locus_server::metrics::serve(metrics, server.shared().clone(), token));
        }
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
        if let Some(port) = args.s3.s3_port {
            let taken = crate::s3_door::start(&args.s3, port, addr.ip(), &config, server.shared()).await?;
            ports.push_str(&format!("s3 {taken}\n"));
        }
        let http = match args.http_port {
            Some(port) => {
                let at = std::net::SocketAddr::new(addr.ip(), port);
                let listener = tokio::net::TcpListener::bind(at).await.map_err(|e| format!("HTTP on {at}: {e}"))?;
                let host = advertise.rsplit_once(':').map_or(advertise.as_str(), |(h, _)| h);
                let public = format!("{host}:{}", listener.local_addr().map_err(|e| e.to_string())?.port());
                let exposed = !locus_server::http::is_loopback(&listener);
                let shared = server.shared().clone();
                // A data node's HTTP door serves object versions under capabilities; a
                // server's and a head's serve the web console (a head's, on the same
                // port, also its files by path, redirected to their data nodes).
                if head_options.is_none() {
                    eprintln!("  web console: {}://{public}/", if config.tls { "https" } else { "http" });
                    if exposed && !config.tls {
                        eprintln!("  (plain HTTP off loopback: the console takes no logins; add --tls)");
                    }
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
                    if exposed {
                        eprintln!("  (plain HTTP off loopback: Bearer tokens are refused, shared URLs work)");
                    }
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
            let scrub = locus_server::cluster::node::Scrub {
                every: Duration::from_secs(args.scrub_every_h.max(1) * 3600),
                rate: args.scrub_rate_mib << 20,
            };
            // Kept keys are taken up before the first connection is accepted.
            locus_server::cluster::node::resume_with_kept_keys(server.shared(), head.credentials.token.as_bytes());
            tokio::spawn(locus_server::cluster::node::serve_head(
                server.shared().clone(),
                head,
                advertise,
                http,
                scrub,
            ));
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

/// The addresses a client on this host dials to reach a server bound to `addr` (asked for
/// as `listen`): for loopback and wildcard addresses `127.0.0.1:PORT`, `localhost:PORT`
/// and (for IPv6) `[::1]:PORT`; else the address itself, and the name it was asked by.
fn local_addresses(addr: std::net::SocketAddr, listen: &str) -> Vec<String> {
    let (ip, port) = (addr.ip().to_canonical(), addr.port());
    let mut out = Vec::new();
    if ip.is_unspecified() || ip == std::net::Ipv4Addr::LOCALHOST {
        out.extend([format!("127.0.0.1:{port}"), format!("localhost:{port}")]);
    }
    if ip.is_unspecified() && addr.is_ipv6() || ip == std::net::Ipv6Addr::LOCALHOST {
        out.extend([format!("[::1]:{port}"), format!("localhost:{port}")]);
    }
    if !ip.is_unspecified() {
        out.push(std::net::SocketAddr::new(ip, port).to_string());
        if let Some((host, p)) = listen.rsplit_once(':') {
            if p == port.to_string() && host.parse::<std::net::IpAddr>().is_err() && !host.starts_with('[') {
                out.push(format!("{}:{port}", host.to_ascii_lowercase()));
            }
        }
    }
    let mut seen = std::collections::HashSet::new();
    out.retain(|a| seen.insert(a.clone()));
    out
}

/// Saves the admin token `token` as the user's credentials for `addresses` (see
/// [`updated_credentials`]); answers the addresses saved.
fn remember_admin_token(token: &str, addresses: &[String], fresh: bool) -> Result<Vec<String>, String> {
    let path = credentials_file();
    let old = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let Some((text, saved)) = updated_credentials(&old, token, addresses, fresh) else { return Ok(Vec::new()) };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    // Written beside and renamed over, so a reader never sees half a file.
    let tmp = path.with_extension("new");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| format!("{}: {e}", tmp.display()))?;
    f.write_all(text.as_bytes()).map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, &path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(saved)
}

/// The credentials file `old` with the admin token `token` saved for `addresses`, and the
/// addresses saved; `None` when nothing changes. A `fresh` server (new, or the user's own
/// embedded one) gets a line for each address that has none, and replaces an admin line
/// for one of its addresses that holds another token (a server made anew there). The `*`
/// line an older `locus serve` wrote for this token is replaced by lines for the
/// addresses in any case, since `*` sends the login to every server.
fn updated_credentials(old: &str, token: &str, addresses: &[String], fresh: bool) -> Option<(String, Vec<String>)> {
    let fields = |l: &str| l.split_whitespace().map(str::to_string).collect::<Vec<_>>();
    let our_wildcard = |l: &str| fields(l) == ["*", config::ADMIN_SUBJECT, token];
    let stale = |l: &str| {
        let f = fields(l);
        fresh && f.len() == 3 && addresses.contains(&f[0]) && f[1] == config::ADMIN_SUBJECT && f[2] != token
    };
    let migrated = old.lines().any(our_wildcard);
    if !fresh && !migrated {
        return None;
    }
    let kept: Vec<&str> = old.lines().filter(|l| !our_wildcard(l) && !stale(l)).collect();
    let known: Vec<String> = kept.iter().filter_map(|l| fields(l).into_iter().next()).collect();
    let new: Vec<String> = addresses.iter().filter(|a| !known.contains(a)).cloned().collect();
    if new.is_empty() && kept.len() == old.lines().count() {
        return None;
    }
    let mut text = if old.is_empty() {
        "# HOST:PORT SUBJECT TOKEN, one server a line (see `locus serve --help` and the README)\n".to_string()
    } else {
        kept.iter().map(|l| format!("{l}\n")).collect()
    };
    for a in &new {
        text.push_str(&format!("{a} {} {token}\n", config::ADMIN_SUBJECT));
    }
    Some((text, new))
}

/// `locus token SUBJECT`: appends a new token to the server's token file.
pub fn add_token(subject: &str, state: &Path, s3: bool) -> Result<(), String> {
    if subject.is_empty() || subject.chars().any(|c| c.is_whitespace() || c == ':') {
        return Err(format!("bad subject name {subject:?}"));
    }
    if s3 && !locus_s3::keys::usable_as_access_key(subject) {
        return Err(format!("{subject:?} cannot be an S3 access key: use letters, digits and - _ . @ + (at most 128)"));
    }
    std::fs::create_dir_all(state).map_err(|e| format!("{}: {e}", state.display()))?;
    Tokens::load_or_create(state).map_err(|e| e.to_string())?;
    let path = state.join(config::TOKENS_FILE);
    let existing = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let known = Tokens::parse(&existing).map_err(|e| e.to_string())?.get(subject).map(|t| t.to_vec());
    match (known, s3) {
        (Some(token), true) => crate::s3_door::print_keys(subject, &token),
        (Some(_), false) => return Err(format!("{subject} already has a token in {}", path.display())),
        (None, true) => {
            let token = append_token(state, subject)?;
            crate::s3_door::print_keys(subject, token.as_bytes());
            eprintln!("(a running server picks new subjects up when restarted)");
        }
        (None, false) => {
            let token = append_token(state, subject)?;
            println!("{subject}:{token}");
            eprintln!("(a running server picks new tokens up when restarted)");
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_addresses_are_those_a_client_here_dials() {
        let a = |s: &str, listen: &str| local_addresses(s.parse().unwrap(), listen);
        assert_eq!(a("127.0.0.1:9610", "127.0.0.1:9610"), ["127.0.0.1:9610", "localhost:9610"]);
        assert_eq!(a("0.0.0.0:7", "0.0.0.0:0"), ["127.0.0.1:7", "localhost:7"]);
        assert_eq!(a("[::]:7", "[::]:7"), ["127.0.0.1:7", "localhost:7", "[::1]:7"]);
        assert_eq!(a("10.0.0.5:7", "Box:7"), ["10.0.0.5:7", "box:7"]);
    }

    #[test]
    fn credentials_are_saved_per_server_and_never_as_a_wildcard() {
        let here = ["127.0.0.1:9".to_string(), "localhost:9".to_string()];
        let (text, saved) = updated_credentials("", "T", &here, true).unwrap();
        assert_eq!(saved, here);
        assert!(text.ends_with("127.0.0.1:9 admin T\nlocalhost:9 admin T\n") && !text.contains("\n*"), "{text}");
        assert_eq!(updated_credentials(&text, "T", &here, true), None, "nothing new");
        // An older serve's `*` line for this token gives way to lines per server.
        let old = "other:1 bob B\n* admin T\n";
        let (text, _) = updated_credentials(old, "T", &here, false).unwrap();
        assert_eq!(text, "other:1 bob B\n127.0.0.1:9 admin T\nlocalhost:9 admin T\n");
        // A `*` line the user wrote for another token stays; nothing is added unasked.
        assert_eq!(updated_credentials("* admin U\n", "T", &here, false), None);
        // A new server at an address replaces the admin line of the one before it.
        let (text, _) = updated_credentials("127.0.0.1:9 admin OLD\nlocalhost:9 alice A\n", "T", &here, true).unwrap();
        assert_eq!(text, "localhost:9 alice A\n127.0.0.1:9 admin T\n");
    }
}
