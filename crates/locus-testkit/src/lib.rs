//! A real Locus server for tests: [`TestServer::start`] exports a fresh temporary
//! directory on `127.0.0.1:0` from its own runtime thread and stops when dropped.
//!
//! It knows three subjects: `admin` (every right at the root), and `alice` and `bob`,
//! who have no rights until a test grants them. Tokens are `SUBJECT-token`.
//!
//! This is the fixture floor every crate's tests stand on: also [`peers`] (servers
//! started as processes: `locus serve`, chirp_server, XRootD), [`proxy`] (a delay proxy
//! for round-trip times), [`TestPostgres`], [`require`] (a missing tool fails a test
//! with how to install it), and the higher crates a lower crate's tests need
//! ([`server`], [`script`], [`storelet`], and `console` with the `console` feature,
//! which also gives `TestServer::console`).

pub mod peers;
pub mod proxy;

// The crates a lower crate's tests need beside a running server (its configuration
// types, limits, file names). Those tests reach the higher floors only through here.
#[cfg(feature = "console")]
pub use locus_console as console;
pub use locus_script as script;
pub use locus_server as server;
pub use locus_storelet as storelet;

use locus_client::{Client, ConnectOptions, Credentials};
use locus_server::{Server, ServerConfig, Tokens};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Whether a test that needs `what` (a tool or device) may run: true when it is here.
/// When it is missing the test fails with a message naming it and how to install it,
/// never passing vacuously, unless `LOCUS_TEST_SKIP_MISSING` is `1` (or names `what`
/// among comma-separated words); then it says so on stderr and returns false, and the
/// caller returns. `.ci/run` never sets that variable.
pub fn require(what: &str, present: bool, install: &str) -> bool {
    if present {
        return true;
    }
    let skip = std::env::var("LOCUS_TEST_SKIP_MISSING").unwrap_or_default();
    if skip == "1" || skip.split(',').any(|w| w.trim() == what) {
        eprintln!("skipped: {what} is missing here and LOCUS_TEST_SKIP_MISSING={skip} (install: {install})");
        return false;
    }
    panic!("this test needs {what}, which is missing here ({install}); set LOCUS_TEST_SKIP_MISSING={what} to skip it");
}

/// [`require`] for PostgreSQL (`initdb` and `pg_ctl` under `/usr/lib/postgresql`).
pub fn require_postgres() -> bool {
    require("postgresql", TestPostgres::installed(), "apt-get install postgresql; .ci/run installs it")
}

/// [`require`] for FUSE: `/dev/fuse` and `fusermount3`.
pub fn require_fuse() -> bool {
    let fusermount = std::process::Command::new("sh")
        .args(["-c", "command -v fusermount3"])
        .stdout(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    require("fuse", std::path::Path::new("/dev/fuse").exists() && fusermount, "/dev/fuse and apt-get install fuse3")
}

/// A running server on an ephemeral port.
pub struct TestServer {
    pub addr: SocketAddr,
    dir: tempfile::TempDir,
    shared: Arc<locus_server::Shared>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// The server's runtime, for endpoints started beside it.
    runtime: tokio::runtime::Handle,
}

impl TestServer {
    /// Starts a plain-TCP server.
    pub fn start() -> TestServer {
        Self::start_with(|_| {})
    }

    /// Starts a server after letting `adjust` change its configuration.
    pub fn start_with(adjust: impl FnOnce(&mut ServerConfig)) -> TestServer {
        Self::start_in(tempfile::tempdir().expect("temp dir"), "127.0.0.1:0", adjust)
    }

    /// Starts a server over `dir`'s export and state, listening on `bind`.
    fn start_in(dir: tempfile::TempDir, bind: &str, adjust: impl FnOnce(&mut ServerConfig)) -> TestServer {
        let mut config = ServerConfig::new(dir.path().join("export"), dir.path().join("state"));
        adjust(&mut config);
        let tokens = Tokens::from_pairs([
            ("admin", "admin-token"),
            ("alice", "alice-token"),
            ("bob", "bob-token"),
            (locus_proto::capability::NODE_SUBJECT, "locus-node-token"),
        ]);
        let server = Server::new(config, tokens).expect("server starts");
        let shared = server.shared().clone();
        let listener = std::net::TcpListener::bind(bind).expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("addr");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (handle_tx, handle_rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let rt =
                tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
            handle_tx.send(rt.handle().clone()).expect("the test waits for the runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                server.run(listener, async { drop(stopped.await) }).await;
            });
        });
        let runtime = handle_rx.recv().expect("runtime started");
        TestServer { addr, dir, shared, stop: Some(stop), thread: Some(thread), runtime }
    }

    /// Serves the Chirp protocol beside the native one (`locus serve --chirp-port`), on
    /// an ephemeral port; returns its address.
    pub fn chirp(&self, config: locus_server::chirp::ChirpConfig) -> SocketAddr {
        self.beside(move |listener, shared| locus_server::chirp::serve(listener, shared, config))
    }

    #[cfg(feature = "console")]
    /// Serves the web console beside the native protocol (`locus serve --http-port`), on
    /// an ephemeral port; returns its address.
    pub fn console(&self, config: locus_console::ConsoleConfig) -> SocketAddr {
        self.console_on("127.0.0.1", config)
    }

    #[cfg(feature = "console")]
    /// [`TestServer::console`] listening on `ip` (`0.0.0.0`: every interface, as an
    /// operator who exposes it would); returns the port's address on loopback, which
    /// reaches it too, so tests send nothing off this host.
    pub fn console_on(&self, ip: &str, config: locus_console::ConsoleConfig) -> SocketAddr {
        let at = self.beside_on(ip, move |listener, shared| locus_console::serve(listener, shared, config));
        SocketAddr::from(([127, 0, 0, 1], at.port()))
    }

    #[cfg(feature = "s3")]
    /// Serves the S3 door beside the native protocol (`locus serve --s3-port`), on an
    /// ephemeral port, its state in the server's state directory; returns its address.
    pub fn s3(&self, adjust: impl FnOnce(&mut locus_s3::S3Config)) -> SocketAddr {
        let mut config = locus_s3::S3Config::new(self.state_dir());
        adjust(&mut config);
        self.beside(move |listener, shared| async move {
            locus_s3::serve(listener, shared, config, None).await.expect("the S3 door starts");
        })
    }

    /// Serves plain HTTP reads beside the native protocol (a head's or data node's
    /// `--http-port`), on an ephemeral port; returns its address.
    pub fn http(&self) -> SocketAddr {
        self.beside(locus_server::http::serve)
    }

    /// Runs `serve` on the server's runtime with a listener on an ephemeral loopback port.
    fn beside<F: std::future::Future<Output = ()> + Send + 'static>(
        &self,
        serve: impl FnOnce(tokio::net::TcpListener, Arc<locus_server::Shared>) -> F + Send + 'static,
    ) -> SocketAddr {
        self.beside_on("127.0.0.1", serve)
    }

    /// [`TestServer::beside`] with a listener on an ephemeral port of `ip`.
    fn beside_on<F: std::future::Future<Output = ()> + Send + 'static>(
        &self,
        ip: &str,
        serve: impl FnOnce(tokio::net::TcpListener, Arc<locus_server::Shared>) -> F + Send + 'static,
    ) -> SocketAddr {
        let listener = std::net::TcpListener::bind((ip, 0)).expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("addr");
        let shared = self.shared.clone();
        self.runtime.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
            serve(listener, shared).await
        });
        addr
    }

    /// The exported directory, to arrange or inspect files behind the server's back.
    pub fn root(&self) -> PathBuf {
        self.dir.path().join("export")
    }

    /// The server's state directory (TLS certificate, tokens).
    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// What the server's connections share (store counters, client registry).
    pub fn shared(&self) -> &Arc<locus_server::Shared> {
        &self.shared
    }

    /// `locus://127.0.0.1:PORT` + `path`.
    pub fn url(&self, path: &str) -> String {
        format!("locus://{}{}", self.addr, path)
    }

    /// Connection options for one of the known subjects (over TLS to a TLS server,
    /// trusting its certificate file).
    pub fn options(&self, subject: &str) -> ConnectOptions {
        // A TLS server's clients trust its own certificate file (a head's holds its
        // cluster's authority).
        let tls = self.shared().config.tls;
        ConnectOptions {
            addr: self.addr.to_string(),
            credentials: Credentials { subject: subject.into(), token: format!("{subject}-token") },
            tls_ca: tls.then(|| self.state_dir().join(locus_server::config::CERT_FILE)),
            tls_name: tls.then(|| "127.0.0.1".to_string()),
            deadlines: Default::default(),
        }
    }

    /// An async client authenticated as `subject`.
    pub async fn client(&self, subject: &str) -> Client {
        Client::connect(&self.options(subject)).await.expect("client connects")
    }

    /// Writes a file directly into the export.
    pub fn put_local(&self, rel: &str, contents: &[u8]) {
        let p = self.root().join(rel);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).expect("mkdir");
        }
        std::fs::write(p, contents).expect("write");
    }

    /// A path inside the export.
    pub fn local(&self, rel: &str) -> PathBuf {
        self.root().join(rel)
    }

    /// Registers an active-file handler `name` running `module` (WebAssembly, binary or
    /// text) with `args` before the invocation's own: saves the module in the state
    /// directory and adds a line to its `handlers.conf`, which the server reads on change.
    pub fn add_handler(&self, name: &str, module: &[u8], args: &[&str]) {
        use std::io::Write;
        let dir = self.state_dir().join("modules");
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join(format!("{name}.wasm")), module).expect("write module");
        let conf = self.state_dir().join(locus_server::active::HANDLERS_FILE);
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(conf).expect("handlers.conf");
        writeln!(f, "{name} storelet modules/{name}.wasm {}", args.join(" ")).expect("append");
    }

    /// Starts a cluster head whose namespace is at `meta` (a PostgreSQL URL), or in a
    /// SQLite file in its state directory; `adjust` may change its policy. Heads on one
    /// PostgreSQL database share a wrap key (as an operator copies it between heads),
    /// made here from the database's URL.
    pub fn head(meta: Option<&str>, adjust: impl FnOnce(&mut locus_server::cluster::HeadConfig)) -> TestServer {
        Self::start_with(|config| {
            if let Some(url) = meta {
                let db = url.split('?').next().unwrap_or(url);
                std::fs::create_dir_all(&config.state_dir).expect("state dir");
                let wrap = locus_proto::capability::node_token(db.as_bytes(), "test wrap key");
                std::fs::write(config.state_dir.join(locus_server::cluster::keys::WRAP_FILE), wrap).expect("wrap key");
            }
            let url = meta.map_or_else(|| config.state_dir.join("meta.db").display().to_string(), str::to_string);
            let mut head = locus_server::cluster::HeadConfig::new(url);
            adjust(&mut head);
            config.head = Some(head);
        })
    }

    /// Starts a data node and has it join `head` (as `locus-node`) before returning;
    /// it then sends heartbeats as `locus serve --data-node` does (as often as the head
    /// asks) until it is dropped.
    pub fn data_node(head: &TestServer) -> TestServer {
        Self::node_in(tempfile::tempdir().expect("temp dir"), "127.0.0.1:0", head)
    }

    /// Stops this data node, lets `meanwhile` change its directories (export and state,
    /// beneath the path it is given), and starts it again on the same address over them,
    /// as `locus serve --data-node` restarted; it joins `head` again before returning.
    pub fn restart_node(mut self, head: &TestServer, meanwhile: impl FnOnce(&Path)) -> TestServer {
        let dir = std::mem::replace(&mut self.dir, tempfile::tempdir().expect("temp dir"));
        let addr = self.addr.to_string();
        drop(self);
        meanwhile(dir.path());
        Self::node_in(dir, &addr, head)
    }

    fn node_in(dir: tempfile::TempDir, bind: &str, head: &TestServer) -> TestServer {
        let node = TestServer::start_in(dir, bind, |c| c.data_node = true);
        std::fs::create_dir_all(node.root().join(locus_server::cluster::objects::OBJECTS_DIR)).expect("objects dir");
        node.join(head);
        let options = head.options(locus_proto::capability::NODE_SUBJECT);
        let scrub = locus_server::cluster::node::Scrub { every: std::time::Duration::from_secs(3600), rate: 0 };
        let (shared, addr) = (node.shared().clone(), node.addr.to_string());
        node.runtime.spawn(locus_server::cluster::node::serve_head(shared, options, addr, None, scrub));
        node
    }

    /// Has this data node join `head` once more (as it does every ten seconds): it
    /// reports its free space and learns the cluster's keys.
    pub fn join(&self, head: &TestServer) {
        let options = head.options(locus_proto::capability::NODE_SUBJECT);
        let (shared, addr) = (self.shared().clone(), self.addr.to_string());
        // On a thread of its own: the caller may be inside a runtime already.
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            rt.block_on(locus_server::cluster::node::join(&shared, &options, &addr, None))
        })
        .join()
        .expect("join thread")
        .expect("the node joins the head");
    }

    /// The temporary directory holding export and state; the place for scratch files.
    pub fn scratch(&self) -> &Path {
        self.dir.path()
    }
}

/// A handler (WebAssembly text) that writes "first\n", then waits until a file named `gate`
/// exists in its directory, then writes "second\n": a run whose end a test controls.
pub const GATED_HANDLER: &str = r#"(module
    (import "wasi_snapshot_preview1" "fd_write" (func $w (param i32 i32 i32 i32) (result i32)))
    (import "wasi_snapshot_preview1" "path_open"
        (func $open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
    (memory (export "memory") 1)
    (data (i32.const 100) "first\n")
    (data (i32.const 200) "second\n")
    (data (i32.const 300) "gate")
    (func (export "_start")
      (i32.store (i32.const 0) (i32.const 100)) (i32.store (i32.const 4) (i32.const 6))
      (drop (call $w (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))
      (block $open_gate
        (loop $wait
          (br_if $open_gate (i32.eqz (call $open (i32.const 3) (i32.const 0) (i32.const 300) (i32.const 4)
              (i32.const 0) (i64.const 2) (i64.const 0) (i32.const 0) (i32.const 16))))
          (br $wait)))
      (i32.store (i32.const 0) (i32.const 200)) (i32.store (i32.const 4) (i32.const 7))
      (drop (call $w (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))))"#;

/// A throwaway PostgreSQL cluster, run as the `postgres` user, on a free port, stopped
/// when dropped.
pub struct TestPostgres {
    dir: tempfile::TempDir,
    port: u16,
    /// `pg_ctl` of the PostgreSQL that runs it.
    pg_ctl: PathBuf,
    /// The server options `pg_ctl start` passes (port, socket directory, listen address).
    opts: String,
}

/// The `bin` directory of the newest installed PostgreSQL, if any.
fn postgres_bin() -> Option<PathBuf> {
    std::fs::read_dir("/usr/lib/postgresql")
        .ok()
        .and_then(|d| d.flatten().map(|d| d.path().join("bin")).filter(|b| b.join("initdb").exists()).max())
}

impl TestPostgres {
    /// True when PostgreSQL is installed here (benchmarks check before they start one).
    pub fn installed() -> bool {
        postgres_bin().is_some()
    }

    /// Starts one; a test calls [`require_postgres`] first. Any step that fails fails the
    /// caller with a message saying which (never a silent skip).
    pub fn start() -> TestPostgres {
        let bin = postgres_bin().expect("PostgreSQL is installed (call require_postgres first)");
        let dir = tempfile::tempdir().expect("a temporary directory for PostgreSQL");
        let data = dir.path().join("data");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port for PostgreSQL")
            .port();
        let as_postgres = |args: &[&std::ffi::OsStr]| {
            let ok = std::process::Command::new("runuser")
                .args(["-u", "postgres", "--"])
                .args(args)
                .stdout(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "postgres: {args:?} failed");
        };
        let chowned = std::process::Command::new("chown").arg("postgres").arg(dir.path()).status();
        assert!(chowned.is_ok_and(|s| s.success()), "chown postgres {}", dir.path().display());
        let (initdb, pg_ctl) = (bin.join("initdb"), bin.join("pg_ctl"));
        as_postgres(&[
            initdb.as_os_str(),
            "-D".as_ref(),
            data.as_os_str(),
            "-A".as_ref(),
            "trust".as_ref(),
            "-U".as_ref(),
            "postgres".as_ref(),
        ]);
        let opts = format!("-p {port} -k {} -c listen_addresses=127.0.0.1 -c fsync=on", dir.path().display());
        let log = data.join("log");
        as_postgres(&[
            pg_ctl.as_os_str(),
            "-D".as_ref(),
            data.as_os_str(),
            "-o".as_ref(),
            opts.as_ref(),
            "-w".as_ref(),
            "-l".as_ref(),
            log.as_os_str(),
            "start".as_ref(),
        ]);
        TestPostgres { dir, port, pg_ctl, opts }
    }

    /// Stops the database abruptly (`-m immediate`: no shutdown checkpoint, as a crash
    /// leaves it) and starts it again on the same port, waiting until it accepts
    /// connections; for fault tests of the heads that use it. Answers whether both worked.
    pub fn restart(&self) -> bool {
        let data = self.dir.path().join("data");
        let pg_ctl = |args: &[&std::ffi::OsStr]| {
            std::process::Command::new("runuser")
                .args(["-u", "postgres", "--"])
                .arg(&self.pg_ctl)
                .arg("-D")
                .arg(&data)
                .args(args)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        let log = data.join("log");
        pg_ctl(&["-m".as_ref(), "immediate".as_ref(), "stop".as_ref()])
            && pg_ctl(&[
                "-o".as_ref(),
                self.opts.as_ref(),
                "-w".as_ref(),
                "-l".as_ref(),
                log.as_os_str(),
                "start".as_ref(),
            ])
    }

    /// The database's URL, for `--meta`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Creates a new, empty database `name` in the cluster and answers its URL: a fresh
    /// namespace without the cost of a new cluster (repeated fault runs use one each).
    pub fn database(&self, name: &str) -> Option<String> {
        let createdb = self.pg_ctl.with_file_name("createdb");
        let ok = std::process::Command::new(createdb)
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", "postgres", name])
            .stdout(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| format!("postgres://postgres@127.0.0.1:{}/{name}", self.port))
    }
}

impl Drop for TestPostgres {
    fn drop(&mut self) {
        let data = self.dir.path().join("data");
        let _ = std::process::Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(&self.pg_ctl)
            .arg("-D")
            .arg(&data)
            .args(["-m", "immediate", "stop"])
            .stdout(std::process::Stdio::null())
            .status();
    }
}

/// Builds the storelet in `storelets/NAME` with Go's wasip1 port and returns the module.
pub fn build_storelet(name: &str) -> Vec<u8> {
    locus_storelet::build_shipped(name).unwrap_or_else(|e| panic!("{e}"))
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Waits (up to 5 s) until a callback break pushed to `pushes` names `path`; panics if
/// none does.
pub async fn wait_for_break(pushes: &mut tokio::sync::mpsc::UnboundedReceiver<locus_client::PushMessage>, path: &str) {
    let found = tokio::time::timeout(std::time::Duration::from_secs(5), async {
        while let Some(push) = pushes.recv().await {
            if push.topic == locus_proto::frame::PUSH_BREAK
                && locus_proto::codec::decode::<Vec<String>>(&push.meta)
                    .is_ok_and(|told| told.iter().any(|p| p == path))
            {
                return;
            }
        }
    });
    found.await.unwrap_or_else(|_| panic!("no break named {path} within 5 s"));
}
