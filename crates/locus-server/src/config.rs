//! Server configuration, the token file and the TLS identity.
//!
//! A fresh server needs no configuration: [`ServerConfig::embedded`] exports a directory
//! it creates, and the first start writes a token for the `admin` subject (and, with TLS,
//! a self-signed certificate) into the state directory, which is never exported.

use crate::error::ServerError;
use locus_proto::Limits;
use std::collections::HashMap;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// File in the state directory holding `SUBJECT TOKEN` lines.
pub const TOKENS_FILE: &str = "tokens";
/// Subject created on first start, with every right on the export root.
pub const ADMIN_SUBJECT: &str = "admin";

/// Everything a server needs to start.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// The directory exported to clients: the namespace, and the first device.
    pub root: PathBuf,
    /// More storage directories whose files appear in the namespace (`--device`).
    pub devices: Vec<PathBuf>,
    /// Tokens, TLS identity and other server-private files; must not be inside `root`.
    pub state_dir: PathBuf,
    /// Serve TLS (rustls) instead of plain TCP.
    pub tls: bool,
    /// This server is a cluster's data node: it serves the TLS identity a head issued
    /// it (kept in the state directory) once it has one.
    pub data_node: bool,
    /// Connections served at once; further clients wait in the accept queue.
    pub max_connections: usize,
    /// Connection threads (each a single-threaded runtime owning its connections).
    pub threads: usize,
    /// Open handles one connection may hold.
    pub max_handles: usize,
    /// Frame size limits enforced on every client frame once it has authenticated (before,
    /// [`Limits::BEFORE_AUTH`]).
    pub limits: Limits,
    /// How long a new connection has, from when it is accepted, to finish TLS, send its
    /// preamble and authenticate before it is closed.
    pub auth_timeout: std::time::Duration,
    /// A name for this server in the handshake.
    pub name: String,
    /// Addresses that reach this server besides those it knows itself (`--name`): a
    /// login proof made for one of them is accepted here (see [`crate::login`]).
    pub names: Vec<crate::login::ServerName>,
    /// Script interpreter threads (separate from the connection threads).
    pub script_workers: usize,
    /// Registered scripts kept; the oldest is evicted beyond this.
    pub script_cache: usize,
    /// Limits of a script call.
    pub script_limits: locus_script::Limits,
    /// Limits for particular subjects, instead of `script_limits`.
    pub script_limits_by_subject: HashMap<String, locus_script::Limits>,
    /// Storelet workers, per-run limits and per-subject limits.
    pub storelets: crate::storelet_host::StoreletConfig,
    /// Bytes the active files' result cache may hold; the least recently used results
    /// go first when it holds more.
    pub active_cache_bytes: u64,
    /// How large reads leave on plain TCP.
    pub sendfile: Sendfile,
    /// Serve as a cluster head with this namespace and policy (`locus serve --head`).
    pub head: Option<crate::cluster::HeadConfig>,
    /// How long a connection that has just answered keeps polling its socket for the
    /// next request before it sleeps (zero: never polls). See [`crate::transport::IdlePoll`].
    pub poll_window: std::time::Duration,
    /// Bounds on callback promises and the inotify watches they need.
    pub promises: crate::callbacks::PromiseLimits,
}

/// How long a connection polls for its next request by default (`locus serve --poll-us`):
/// of the order of a round trip between nearby machines, so a client in conversation is
/// caught, for at most that much CPU per reply.
pub const DEFAULT_POLL_WINDOW: std::time::Duration = std::time::Duration::from_micros(50);

/// When large reads go out with `sendfile(2)` (page references handed to the socket)
/// rather than read into a buffer and written.
///
/// `sendfile` spares the server two copies. Over loopback its page-sized pieces used to
/// wake the receiver once per 64 KiB, which made it 20–25% slower than a copy into large
/// pieces; since the client library raises its socket's low-water mark while a large
/// body arrives, `sendfile` reads 1.4–1.5x faster than the copy there too (`locus bench
/// ops --sendfile`, BENCHMARKS.md). `Auto` keeps the copy for clients on this host, for
/// readers that do not raise theirs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Sendfile {
    /// `sendfile` for remote clients, a copy for clients on this host.
    Auto,
    /// `sendfile` for every client.
    #[default]
    Always,
    /// A copy for every client.
    Never,
}

impl Sendfile {
    /// Whether a connection between `local` and `peer` sends large reads with `sendfile`.
    pub fn use_for(self, local: std::net::IpAddr, peer: std::net::IpAddr) -> bool {
        match self {
            Sendfile::Always => true,
            Sendfile::Never => false,
            Sendfile::Auto => {
                let peer = peer.to_canonical();
                !(peer.is_loopback() || peer == local.to_canonical())
            }
        }
    }
}

impl std::str::FromStr for Sendfile {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Sendfile::Auto),
            "always" => Ok(Sendfile::Always),
            "never" => Ok(Sendfile::Never),
            other => Err(format!("{other:?}: expected auto, always or never")),
        }
    }
}

impl ServerConfig {
    /// A configuration exporting `root` and keeping state in `state_dir`.
    pub fn new(root: impl Into<PathBuf>, state_dir: impl Into<PathBuf>) -> Self {
        ServerConfig {
            root: root.into(),
            devices: Vec::new(),
            state_dir: state_dir.into(),
            tls: false,
            data_node: false,
            max_connections: 1024,
            threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
            max_handles: 4096,
            limits: Limits::SERVER,
            auth_timeout: std::time::Duration::from_secs(10),
            name: format!("locus {}", env!("CARGO_PKG_VERSION")),
            names: Vec::new(),
            script_workers: std::thread::available_parallelism().map_or(2, |n| n.get()),
            script_cache: 1024,
            script_limits: locus_script::Limits::default(),
            script_limits_by_subject: HashMap::new(),
            storelets: Default::default(),
            active_cache_bytes: 1 << 30,
            sendfile: Sendfile::Always,
            head: None,
            poll_window: DEFAULT_POLL_WINDOW,
            promises: Default::default(),
        }
    }

    /// The embedded default: `export/` and `server/` under `base` (`~/.locus` by default).
    pub fn embedded(base: &Path) -> Self {
        ServerConfig::new(base.join("export"), base.join("server"))
    }

    /// Creates the directories and checks that the state is not exported.
    pub fn prepare(&self) -> Result<(), ServerError> {
        for dir in [&self.root, &self.state_dir].into_iter().chain(&self.devices) {
            std::fs::create_dir_all(dir).map_err(|e| ServerError::io(format!("create {}", dir.display()), e))?;
        }
        // The state holds tokens, keys and results of code runs over protected files: the
        // server's alone.
        {
            use std::os::unix::fs::PermissionsExt;
            let private = std::fs::Permissions::from_mode(0o700);
            std::fs::set_permissions(&self.state_dir, private).map_err(|e| ServerError::io("state dir", e))?;
        }
        let state = self.state_dir.canonicalize().map_err(|e| ServerError::io("state dir", e))?;
        let mut seen: Vec<PathBuf> = Vec::new();
        for dir in std::iter::once(&self.root).chain(&self.devices) {
            let d = dir.canonicalize().map_err(|e| ServerError::io("export device", e))?;
            if state.starts_with(&d) || d.starts_with(&state) {
                return Err(ServerError::Config(format!(
                    "the state directory {} and the export directory {} must not contain one another",
                    state.display(),
                    d.display()
                )));
            }
            if let Some(other) = seen.iter().find(|o| o.starts_with(&d) || d.starts_with(o)) {
                return Err(ServerError::Config(format!(
                    "devices {} and {} overlap: each must be a directory of its own",
                    other.display(),
                    d.display()
                )));
            }
            seen.push(d);
        }
        Ok(())
    }
}

/// File in the state directory with per-subject script limits: one subject a line, then
/// `key=value` pairs among `instructions`, `memory` (bytes), `time_ms`, `result` (bytes);
/// keys left out keep the server's default.
pub const SCRIPT_LIMITS_FILE: &str = "script-limits";

/// Parses the per-subject script limits file on top of `defaults`.
pub fn parse_script_limits(
    text: &str,
    defaults: locus_script::Limits,
) -> Result<HashMap<String, locus_script::Limits>, ServerError> {
    let mut out = HashMap::new();
    for (n, line) in text.lines().enumerate().map(|(n, l)| (n + 1, l.trim())) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut parts = line.split_whitespace();
        let subject = parts.next().expect("non-empty line");
        let mut limits = defaults;
        for pair in parts {
            let bad = || ServerError::Config(format!("{SCRIPT_LIMITS_FILE} line {n}: bad setting {pair:?}"));
            let (key, value) = pair.split_once('=').ok_or_else(bad)?;
            let value: u64 = value.parse().map_err(|_| bad())?;
            match key {
                "instructions" => limits.instructions = value,
                "memory" => limits.memory = value as usize,
                "time_ms" => limits.wall = std::time::Duration::from_millis(value),
                "result" => limits.result_bytes = value as usize,
                _ => return Err(bad()),
            }
        }
        out.insert(subject.to_string(), limits);
    }
    Ok(out)
}

/// Reads the per-subject script limits file of a state directory, if there is one.
pub fn load_script_limits(
    state_dir: &Path,
    defaults: locus_script::Limits,
) -> Result<HashMap<String, locus_script::Limits>, ServerError> {
    match std::fs::read_to_string(state_dir.join(SCRIPT_LIMITS_FILE)) {
        Ok(text) => parse_script_limits(&text, defaults),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(HashMap::new()),
        Err(e) => Err(ServerError::io(format!("read {SCRIPT_LIMITS_FILE}"), e)),
    }
}

/// Secret tokens by subject name.
#[derive(Clone, Default)]
pub struct Tokens {
    by_subject: Arc<HashMap<String, Vec<u8>>>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tokens({} subjects)", self.by_subject.len())
    }
}

impl Tokens {
    /// Loads the token file, creating it with a fresh `admin` token if it does not exist.
    /// Returns the tokens and, when one was just created, the admin token.
    pub fn load_or_create(state_dir: &Path) -> Result<(Tokens, Option<String>), ServerError> {
        let path = state_dir.join(TOKENS_FILE);
        let mut created = None;
        if !path.exists() {
            let token = new_token();
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
                .map_err(|e| ServerError::io(format!("create {}", path.display()), e))?;
            writeln!(f, "{ADMIN_SUBJECT} {token}").map_err(|e| ServerError::io("write tokens", e))?;
            created = Some(token);
        }
        let text =
            std::fs::read_to_string(&path).map_err(|e| ServerError::io(format!("read {}", path.display()), e))?;
        Ok((Tokens::parse(&text)?, created))
    }

    /// Parses `SUBJECT TOKEN` lines.
    pub fn parse(text: &str) -> Result<Tokens, ServerError> {
        let mut map = HashMap::new();
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
            let mut parts = line.split_whitespace();
            match (parts.next(), parts.next()) {
                (Some(subject), Some(token)) => {
                    map.insert(subject.to_string(), token.as_bytes().to_vec());
                }
                _ => {
                    return Err(ServerError::Config(format!(
                        "malformed token line for {:?}",
                        line.split_whitespace().next()
                    )))
                }
            }
        }
        Ok(Tokens { by_subject: Arc::new(map) })
    }

    /// A token set from pairs (tests and embedding).
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Tokens {
        let map = pairs.into_iter().map(|(s, t)| (s.to_string(), t.as_bytes().to_vec())).collect();
        Tokens { by_subject: Arc::new(map) }
    }

    /// The token of a subject.
    pub fn get(&self, subject: &str) -> Option<&[u8]> {
        self.by_subject.get(subject).map(Vec::as_slice)
    }

    /// The subject a login presents: `SUBJECT:TOKEN`, or a bare token (compared with
    /// every subject's, in constant time each).
    pub fn subject_of(&self, presented: &str) -> Option<&str> {
        let presented = presented.trim();
        if let Some((who, token)) = presented.split_once(':') {
            let (name, known) = self.by_subject.get_key_value(who)?;
            return locus_proto::auth::proofs_equal(known, token.as_bytes()).then_some(name.as_str());
        }
        let mut found = None;
        for (who, token) in self.by_subject.iter() {
            if locus_proto::auth::proofs_equal(token, presented.as_bytes()) {
                found = Some(who.as_str());
            }
        }
        found
    }
}

/// A fresh random token (256 bits, hex).
pub fn new_token() -> String {
    let mut b = [0u8; 32];
    getrandom::fill(&mut b).expect("the OS provides randomness");
    hex::encode(b)
}

/// Names of the certificate and key files in the state directory.
pub const CERT_FILE: &str = "cert.pem";
/// The key of [`CERT_FILE`]'s certificate (mode 0600).
pub const KEY_FILE: &str = "key.pem";

/// Writes a TLS identity: the certificate chain (PEM) to `cert_path` and its key to
/// `key_path`, made mode 0600 before a byte of it is written.
pub fn write_identity(cert_path: &Path, cert_pem: &str, key_path: &Path, key_pem: &str) -> Result<(), ServerError> {
    // Each file whole or not at all (a new one renamed over the old): the key first, so
    // a certificate is never there without the key it was issued with.
    let replace = |path: &Path, bytes: &[u8], mode: u32, what: &str| {
        let tmp = path.with_extension("new");
        let _ = std::fs::remove_file(&tmp);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)
            .map_err(|e| ServerError::io(what, e))?;
        f.write_all(bytes).and_then(|()| f.sync_all()).map_err(|e| ServerError::io(what, e))?;
        std::fs::rename(&tmp, path).map_err(|e| ServerError::io(what, e))
    };
    replace(key_path, key_pem.as_bytes(), 0o600, "write TLS key")?;
    replace(cert_path, cert_pem.as_bytes(), 0o644, "write TLS certificate")
}

/// Loads the TLS identity from the state directory, creating a self-signed one (for
/// `localhost`, `127.0.0.1`, `::1` and this host's name) on first use.
pub fn tls_acceptor(state_dir: &Path) -> Result<tokio_rustls::TlsAcceptor, ServerError> {
    let cert_path = state_dir.join(CERT_FILE);
    let key_path = state_dir.join(KEY_FILE);
    if !cert_path.exists() || !key_path.exists() {
        let ck = rcgen::generate_simple_self_signed(local_tls_names()).map_err(|e| ServerError::Tls(e.to_string()))?;
        write_identity(&cert_path, &ck.cert.pem(), &key_path, &ck.signing_key.serialize_pem())?;
    }
    acceptor_from(&cert_path, &key_path)
}

/// The names a server's own TLS certificate covers: `localhost`, the loopback
/// addresses and this host's name.
pub fn local_tls_names() -> Vec<String> {
    let mut names = vec!["localhost".to_string(), "127.0.0.1".to_string(), "::1".to_string()];
    if let Ok(host) = std::fs::read_to_string("/etc/hostname") {
        names.push(host.trim().to_string());
    }
    names
}

/// A TLS acceptor serving the certificate chain in `cert_path` with the key in
/// `key_path` (PEM).
pub fn acceptor_from(cert_path: &Path, key_path: &Path) -> Result<tokio_rustls::TlsAcceptor, ServerError> {
    let certs = rustls_pemfile::certs(&mut std::io::BufReader::new(
        std::fs::File::open(cert_path).map_err(|e| ServerError::io("open TLS certificate", e))?,
    ))
    .collect::<Result<Vec<_>, _>>()
    .map_err(|e| ServerError::Tls(e.to_string()))?;
    let key = rustls_pemfile::private_key(&mut std::io::BufReader::new(
        std::fs::File::open(key_path).map_err(|e| ServerError::io("open TLS key", e))?,
    ))
    .map_err(|e| ServerError::Tls(e.to_string()))?
    .ok_or_else(|| ServerError::Tls(format!("no private key in {}", key_path.display())))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ServerError::Tls(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| ServerError::Tls(e.to_string()))?;
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_limits_file_overrides_per_subject() {
        let d = locus_script::Limits::default();
        let m = parse_script_limits("# comment\nalice instructions=1000 time_ms=50\nbob\n", d).unwrap();
        assert_eq!(m["alice"].instructions, 1000);
        assert_eq!(m["alice"].wall, std::time::Duration::from_millis(50));
        assert_eq!(m["alice"].memory, d.memory);
        assert_eq!(m["bob"], d);
        assert!(parse_script_limits("carol speed=9", d).is_err());
        assert!(parse_script_limits("carol memory=lots", d).is_err());
    }

    #[test]
    fn sendfile_auto_copies_for_clients_on_this_host_only() {
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        let local = ip("10.0.0.5");
        for same_host in ["127.0.0.1", "127.1.2.3", "::1", "::ffff:127.0.0.1", "10.0.0.5", "::ffff:10.0.0.5"] {
            assert!(!Sendfile::Auto.use_for(local, ip(same_host)), "{same_host}");
            assert!(Sendfile::Always.use_for(local, ip(same_host)), "{same_host}");
        }
        for remote in ["10.0.0.6", "192.168.1.1", "2001:db8::1"] {
            assert!(Sendfile::Auto.use_for(local, ip(remote)), "{remote}");
            assert!(!Sendfile::Never.use_for(local, ip(remote)), "{remote}");
        }
        assert_eq!("always".parse::<Sendfile>(), Ok(Sendfile::Always));
        assert!("sometimes".parse::<Sendfile>().is_err());
    }
}
