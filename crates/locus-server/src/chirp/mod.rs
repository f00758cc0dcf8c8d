//! The Chirp endpoint (`locus serve --chirp-port P`): CCTools' `chirp` tool, `parrot_run`
//! and other Chirp clients reach the export as they reach a `chirp_server`.
//!
//! **Subjects.** A client authenticates by one of the methods in [`ChirpConfig::methods`]
//! and becomes the subject `METHOD:NAME`, spelled as Chirp spells it: `unix:alice` (the
//! owner of a file the client made where the server asked, so both must share that
//! directory, as on one host), `hostname:node7.example.org` (the reverse lookup of the
//! client's address, accepted only when that name resolves back to the address),
//! `address:10.0.0.7`. These host subjects hold exactly what ACL entries naming them or
//! matching them as Chirp patterns grant (`locus acl set / unix:alice rwl`,
//! `address:10.0.* rl`), and nothing by default: `*` never matches them, it stays "any
//! subject holding a Locus token" ([`locus_proto::types::acl_subject_matches`]). Chirp's
//! `ticket` and `globus` methods are not offered.
//!
//! **Commands.** Each command runs as a request of a [`Session`] acting as the subject,
//! so ACL checks, callback breaks, I/O accounting and metrics (under the native
//! operation's name) are those of the native protocol. Chirp's `open` returns the
//! session's handle as its descriptor. Active files are not run for Chirp clients.
//!
//! **Untrusted input.** Lines are bounded by [`chirp::MAX_LINE`] as the Chirp driver
//! bounds a server's; a longer one ends the connection. Counts never size an allocation
//! beyond the server's data limit: reads are clamped to it, writes beyond it are
//! consumed and reported short (as `chirp_server` does), files stream through a fixed
//! buffer. Each connection has its own thread (as `chirp_server` has a process each);
//! at most `max_connections` at once, and one idle for [`ChirpConfig::idle`] is closed.

mod commands;

use commands::Client;

use crate::session::Session;
use crate::Shared;
use locus_proto::chirp::{self};
use locus_proto::Error as WireError;
use std::io::{self, BufRead, BufReader, BufWriter, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A way for a Chirp client to prove who it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthMethod {
    /// The client creates a file the server names; its owner's user name is the subject.
    Unix,
    /// The reverse DNS name of the client's address.
    Hostname,
    /// The client's IP address.
    Address,
}

impl AuthMethod {
    /// Every method, in the order a listing shows them.
    pub const ALL: [AuthMethod; 3] = [AuthMethod::Unix, AuthMethod::Hostname, AuthMethod::Address];

    /// The method's name on the wire, and the prefix of its subjects.
    pub fn name(self) -> &'static str {
        match self {
            AuthMethod::Unix => "unix",
            AuthMethod::Hostname => "hostname",
            AuthMethod::Address => "address",
        }
    }

    /// The method called `name`, if Locus offers it.
    pub fn parse(name: &str) -> Option<AuthMethod> {
        AuthMethod::ALL.into_iter().find(|m| m.name() == name)
    }
}

/// How the endpoint authenticates and how long it keeps idle clients.
#[derive(Clone, Debug)]
pub struct ChirpConfig {
    /// The methods clients may use.
    pub methods: Vec<AuthMethod>,
    /// Where `unix` clients are asked to create their challenge file.
    pub challenge_dir: PathBuf,
    /// A connection that sends nothing for this long is closed (Chirp clients reconnect).
    pub idle: Duration,
}

impl Default for ChirpConfig {
    fn default() -> Self {
        ChirpConfig { methods: AuthMethod::ALL.to_vec(), challenge_dir: "/tmp".into(), idle: Duration::from_secs(60) }
    }
}

/// Serves Chirp clients from `listener` until the task is dropped.
pub async fn serve(listener: tokio::net::TcpListener, shared: Arc<Shared>, config: ChirpConfig) {
    let config = Arc::new(config);
    let live = Arc::new(AtomicUsize::new(0));
    let runtime = tokio::runtime::Handle::current();
    loop {
        let Ok((sock, peer)) = listener.accept().await else { continue };
        if live.load(Ordering::SeqCst) >= shared.config.max_connections {
            tracing::warn!(%peer, "chirp: refused, {} connections already", shared.config.max_connections);
            continue;
        }
        let Ok(sock) = sock.into_std() else { continue };
        let (shared, config, live2, runtime) = (shared.clone(), config.clone(), live.clone(), runtime.clone());
        live.fetch_add(1, Ordering::SeqCst);
        let spawned = std::thread::Builder::new().name("locus-chirp".into()).spawn(move || {
            // Sessions may reach tokio (callback pushes); the thread runs inside the runtime.
            let _entered = runtime.enter();
            if let Err(e) = serve_connection(sock, peer, shared, &config) {
                tracing::debug!(%peer, "chirp connection ended: {e}");
            }
            live2.fetch_sub(1, Ordering::SeqCst);
        });
        if spawned.is_err() {
            live.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Authenticates one client and runs its commands until it leaves.
fn serve_connection(sock: TcpStream, peer: SocketAddr, shared: Arc<Shared>, config: &ChirpConfig) -> io::Result<()> {
    sock.set_nonblocking(false)?;
    sock.set_nodelay(true)?;
    sock.set_read_timeout(Some(config.idle))?;
    let mut conn = Conn {
        reader: BufReader::with_capacity(1 << 16, sock.try_clone()?),
        writer: BufWriter::with_capacity(1 << 16, sock),
    };
    let Some(subject) = conn.authenticate(peer, config)? else { return Ok(()) };
    tracing::debug!(%peer, %subject, "chirp client authenticated");
    let max_data = shared.config.limits.max_data.min(locus_proto::Limits::CLIENT.max_data) as usize;
    let mut client = Client { session: Session::acting_as(shared.clone(), &subject), subject, shared, conn, max_data };
    client.run()
}

/// A connection's byte streams.
struct Conn {
    reader: BufReader<TcpStream>,
    writer: BufWriter<TcpStream>,
}

/// How a command failed: with an error the client is told, or with the connection.
enum Failed {
    Call(WireError),
    Io(io::Error),
}

impl From<WireError> for Failed {
    fn from(e: WireError) -> Self {
        Failed::Call(e)
    }
}

impl From<io::Error> for Failed {
    fn from(e: io::Error) -> Self {
        Failed::Io(e)
    }
}

type Done = Result<(), Failed>;

impl Conn {
    /// One line without its newline; `None` at end of input. A line longer than
    /// [`chirp::MAX_LINE`] or not UTF-8 is an error (the stream cannot be trusted after).
    fn line(&mut self) -> io::Result<Option<String>> {
        let mut buf = Vec::new();
        let n = (&mut self.reader).take(chirp::MAX_LINE as u64 + 1).read_until(b'\n', &mut buf)?;
        if n == 0 {
            return Ok(None);
        }
        if buf.last() != Some(&b'\n') {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "a line longer than the Chirp limit, or cut short"));
        }
        buf.pop();
        if buf.last() == Some(&b'\r') {
            buf.pop();
        }
        String::from_utf8(buf).map(Some).map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "a line not in UTF-8"))
    }

    fn send(&mut self, text: &str) -> io::Result<()> {
        self.writer.write_all(text.as_bytes())
    }

    /// Chirp's handshake: the client names methods until one succeeds. Answers the
    /// subject, or `None` if the client gave up or left.
    fn authenticate(&mut self, peer: SocketAddr, config: &ChirpConfig) -> io::Result<Option<String>> {
        // A client names each method once; more lines than that are not a real client.
        for _ in 0..16 {
            let Some(name) = self.line()? else { return Ok(None) };
            let method = AuthMethod::parse(&name).filter(|m| config.methods.contains(m));
            let Some(method) = method else {
                self.send("no\n")?;
                self.writer.flush()?;
                continue;
            };
            self.send("yes\n")?;
            // An IPv4 client of a dual-stack listener is named by its IPv4 address.
            let ip = peer.ip().to_canonical();
            let name = match method {
                AuthMethod::Address => Some(ip.to_string()),
                AuthMethod::Hostname => confirmed_hostname(
                    ip,
                    |ip| dns_lookup::lookup_addr(ip).ok(),
                    |name| dns_lookup::lookup_host(name).unwrap_or_default(),
                ),
                AuthMethod::Unix => match self.unix_challenge(config)? {
                    // The client gave up on the challenge: Chirp answers nothing to that.
                    Challenge::Declined => continue,
                    Challenge::Owner(name) => name,
                },
            };
            let name = name.map(|n| sanitize(&n));
            match name.filter(|n| locus_store::Acl::valid_subject(&format!("{}:{n}", method.name()))) {
                Some(name) => {
                    // The method's own "yes", then the handshake's verdict: method and name.
                    self.send(&format!("yes\nyes\n{}\n{name}\n", method.name()))?;
                    self.writer.flush()?;
                    return Ok(Some(format!("{}:{name}", method.name())));
                }
                None => {
                    self.send("no\n")?;
                    self.writer.flush()?;
                }
            }
        }
        Ok(None)
    }

    /// The `unix` method: names a file the client must create, and answers the user name
    /// of its owner. The name is random and must not exist before; the file must be a
    /// regular file (not a link someone planted), and is removed either way.
    fn unix_challenge(&mut self, config: &ChirpConfig) -> io::Result<Challenge> {
        let mut id = [0u8; 12];
        getrandom::fill(&mut id).expect("the OS provides randomness");
        let path = config.challenge_dir.join(format!("locus-chirp-challenge.{}", hex::encode(id)));
        if path.symlink_metadata().is_ok() {
            return Ok(Challenge::Owner(None));
        }
        self.send(&format!("{}\n", path.display()))?;
        self.writer.flush()?;
        if self.line()?.as_deref() != Some("yes") {
            let _ = std::fs::remove_file(&path);
            return Ok(Challenge::Declined);
        }
        let owner = match path.symlink_metadata() {
            Ok(meta) if meta.file_type().is_file() => {
                use std::os::unix::fs::MetadataExt;
                nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(meta.uid())).ok().flatten().map(|u| u.name)
            }
            _ => None,
        };
        let _ = std::fs::remove_file(&path);
        Ok(Challenge::Owner(owner))
    }
}

/// How a `unix` challenge ended.
enum Challenge {
    /// The client did not create the file (it says so and tries another method).
    Declined,
    /// The owner's user name, or none if the file is not there, not a regular file, or
    /// owned by a uid with no name.
    Owner(Option<String>),
}

/// The `hostname` method's name for a peer at `ip`: the reverse lookup of `ip`
/// (`reverse`), accepted only when looking that name up (`forward`) gives `ip` back
/// (forward-confirmed reverse DNS), so whoever controls a PTR record cannot claim
/// another domain's names. The name must look like a host name (letters, digits, `-`,
/// `.`, `_`; not an address); it is lower-cased. `None` fails the method, and the client
/// may try another.
fn confirmed_hostname(
    ip: IpAddr,
    reverse: impl Fn(&IpAddr) -> Option<String>,
    forward: impl Fn(&str) -> Vec<IpAddr>,
) -> Option<String> {
    let name = reverse(&ip)?.trim_end_matches('.').to_ascii_lowercase();
    let shaped = !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b));
    if !shaped || name.parse::<IpAddr>().is_ok() {
        return None;
    }
    forward(&name).into_iter().any(|a| a.to_canonical() == ip).then_some(name)
}

/// Chirp's rule for subject names: spaces and unprintable characters become `_`.
fn sanitize(name: &str) -> String {
    name.chars().map(|c| if c.is_whitespace() || c.is_control() { '_' } else { c }).collect()
}

#[cfg(test)]
mod tests {
    use super::confirmed_hostname;
    use std::net::IpAddr;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn a_hostname_counts_only_when_it_resolves_back_to_the_peer() {
        let peer = ip("192.0.2.7");
        let reverse = |name: &'static str| move |_: &IpAddr| Some(name.to_string());
        let forward = |addrs: &'static [&'static str]| move |_: &str| addrs.iter().map(|a| ip(a)).collect::<Vec<_>>();
        // Confirmed: the name's addresses include the peer's (case and a final dot do not matter).
        let name = confirmed_hostname(peer, reverse("Node7.Example.org."), forward(&["192.0.2.9", "192.0.2.7"]));
        assert_eq!(name.as_deref(), Some("node7.example.org"));
        // A PTR record naming someone else's host, whose addresses are not the peer's.
        assert_eq!(confirmed_hostname(peer, reverse("trusted.example.org"), forward(&["198.51.100.1"])), None);
        assert_eq!(confirmed_hostname(peer, reverse("trusted.example.org"), forward(&[])), None);
        // No reverse name at all.
        assert_eq!(confirmed_hostname(peer, |_| None, forward(&["192.0.2.7"])), None);
        // Names that are addresses, patterns or not host names are refused outright.
        for bad in ["192.0.2.7", "*.example.org", "a b", ""] {
            assert_eq!(confirmed_hostname(peer, reverse(bad), forward(&["192.0.2.7"])), None, "{bad:?}");
        }
        // An IPv4 peer seen through a dual-stack socket is still confirmed by its IPv4 address.
        assert!(confirmed_hostname(peer, reverse("n.example.org"), forward(&["::ffff:192.0.2.7"])).is_some());
    }
}
