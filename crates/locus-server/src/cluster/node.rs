//! A data node: an ordinary server that has joined a head (`locus serve --data-node`).
//!
//! It keeps object versions under [`crate::cluster::objects::OBJECTS_DIR`] in its export, serves
//! them to any subject that presents a capability the head signed, and stores and drops
//! them only for the head. It learns the cluster's keys when it joins (sealed for it:
//! see [`crate::cluster::keys`]), and joins again every [`REJOIN_EVERY`] to report its free space,
//! to rejoin a restarted head and to learn a rotated key.
//!
//! A node authenticates at its head as [`NODE_SUBJECT`], which may join and nothing
//! else: a node holds no admin token of its head.

use crate::Shared;
use locus_client::{Client, ConnectOptions};
use locus_proto::capability::NODE_SUBJECT;
use locus_proto::ops::NodeJoin;
use std::sync::Arc;
use std::time::Duration;

pub use crate::cluster::config::REJOIN_EVERY;

/// Free bytes in the file system under the node's export.
fn free_bytes(shared: &Shared) -> u64 {
    rustix::fs::statvfs(&shared.config.root).map_or(0, |s| s.f_bavail * s.f_frsize)
}

/// Versions a node tells its head it served most at each heartbeat (what rebalancing
/// between nodes weighs).
pub const BUSIEST_REPORTED: usize = 64;

/// The versions this node served most since it started: `(object, version, load)`.
fn busiest_versions(shared: &Shared) -> Vec<(u64, u64, u64)> {
    let dir = format!("{}/", crate::cluster::objects::OBJECTS_DIR);
    let mut versions: Vec<(u64, u64, u64)> = shared
        .store
        .counters()
        .all()
        .into_iter()
        .filter_map(|f| {
            let name = f.path.trim_start_matches('/').strip_prefix(&dir)?;
            let (object, version) = name.split_once('.')?;
            Some((object.parse().ok()?, version.parse().ok()?, f.io.load()))
        })
        .filter(|v| v.2 > 0)
        .collect();
    versions.sort_by_key(|v| std::cmp::Reverse(v.2));
    versions.truncate(BUSIEST_REPORTED);
    versions
}

/// What a head answered a join.
#[derive(Debug)]
pub struct Joined {
    /// The node's id in the cluster.
    pub node: u64,
    /// How soon to join again.
    pub every: Duration,
    /// The namespace's heads heard from lately (addresses), this one included.
    pub heads: Vec<String>,
}

/// Where a data node keeps the heads it learned of, one address a line.
pub const HEADS_FILE: &str = "cluster-heads";

/// Where a data node keeps the TLS certificate chain its head issued it.
pub const NODE_CERT_FILE: &str = "node-cert.pem";
/// Where a data node keeps the key of [`NODE_CERT_FILE`] (mode 0600).
pub const NODE_KEY_FILE: &str = "node-key.pem";
/// Where a data node keeps the cluster's certificate authority, which it checks other
/// nodes against.
pub const CLUSTER_CA_FILE: &str = "cluster-ca.pem";

/// The TLS identity a head issued this node, kept in `state_dir`: the certificate and
/// key files, if both are there.
pub fn issued_identity(state_dir: &std::path::Path) -> Option<(std::path::PathBuf, std::path::PathBuf)> {
    let (cert, key) = (state_dir.join(NODE_CERT_FILE), state_dir.join(NODE_KEY_FILE));
    (cert.exists() && key.exists()).then_some((cert, key))
}

/// Stops serving an identity a head issued this node (its head now serves plain TCP),
/// and forgets it.
fn drop_identity(shared: &Shared) {
    let Some((cert, key)) = issued_identity(&shared.config.state_dir) else { return };
    for f in [cert, key, shared.config.state_dir.join(CLUSTER_CA_FILE)] {
        let _ = std::fs::remove_file(f);
    }
    let own = shared.config.tls.then(|| crate::config::tls_acceptor(&shared.config.state_dir).ok()).flatten();
    *shared.tls.write() = own;
    tracing::info!("the head serves plain TCP: so does this node now");
}

/// Serves TLS with the identity a head issued this node (chain, key, authority), kept
/// in the state directory for restarts; connections accepted from now on use it. One
/// the node already serves is left as it is.
fn adopt_identity(shared: &Shared, tls: &crate::cluster::keys::NodeTls) -> Result<(), String> {
    let (chain, key, ca) = tls;
    let dir = &shared.config.state_dir;
    let (cert_path, key_path) = (dir.join(NODE_CERT_FILE), dir.join(NODE_KEY_FILE));
    if shared.tls.read().is_some() && std::fs::read_to_string(&cert_path).is_ok_and(|c| c == *chain) {
        return Ok(());
    }
    let kept = |e: crate::ServerError| format!("keeping the TLS identity the head issued: {e}");
    std::fs::write(dir.join(CLUSTER_CA_FILE), ca).map_err(|e| format!("keeping the cluster's authority: {e}"))?;
    crate::config::write_identity(&cert_path, chain, &key_path, key).map_err(kept)?;
    let acceptor = crate::config::acceptor_from(&cert_path, &key_path).map_err(kept)?;
    *shared.tls.write() = Some(acceptor);
    tracing::info!("serving TLS with the identity the head issued");
    Ok(())
}

/// Joins the head once (a heartbeat): the head records the node (`advertise` is the
/// address clients reach it at) and the versions it found damaged since it last joined,
/// and answers the cluster's keys, sealed for this node, which it then trusts, how soon
/// to join again and the other heads. `head` must hold the credentials of
/// [`NODE_SUBJECT`] at the head.
pub async fn join(
    shared: &Shared,
    head: &ConnectOptions,
    advertise: &str,
    http: Option<&str>,
) -> Result<Joined, String> {
    if head.credentials.subject != NODE_SUBJECT {
        return Err(format!(
            "a data node joins its head as {NODE_SUBJECT}, not {} (make its token at the head with `locus token \
             {NODE_SUBJECT}`, then give it to the node as LOCUS_TOKEN={NODE_SUBJECT}:TOKEN)",
            head.credentials.subject
        ));
    }
    let client = Client::connect(head).await.map_err(|e| format!("head at {}: {e}", head.addr))?;
    let mut nonce = vec![0u8; 32];
    getrandom::fill(&mut nonce).expect("the OS provides randomness");
    let join = NodeJoin {
        addr: advertise.to_string(),
        http: http.map(str::to_string),
        free: free_bytes(shared),
        nonce: nonce.clone(),
        damaged: shared.take_damaged(),
        io: shared.store.counters().export(),
        busiest: busiest_versions(shared),
    };
    let damaged = join.damaged.clone();
    let welcome = client.call(join).await.map_err(|e| {
        shared.requeue_damaged(&damaged);
        format!("head at {} refused the node: {e}", head.addr)
    })?;
    let token = head.credentials.token.as_bytes();
    let keys = crate::cluster::keys::open_from_head(token, &nonce, &welcome.nonce, advertise, &welcome.sealed)
        .ok_or_else(|| format!("the keys the head at {} sent do not open with this node's token", head.addr))?;
    match welcome.tls.is_empty() {
        false => {
            let tls = crate::cluster::keys::open_tls_from_head(token, &nonce, &welcome.nonce, advertise, &welcome.tls)
                .ok_or_else(|| format!("the TLS identity the head at {} sent does not open", head.addr))?;
            adopt_identity(shared, &tls)?;
        }
        // A head that does not serve TLS reaches its nodes over plain TCP.
        true => drop_identity(shared),
    }
    keep_keys(shared, token, &keys);
    shared.set_node_key(keys);
    shared.set_node_id(welcome.node);
    let every = Duration::from_millis(welcome.every_ms).clamp(Duration::from_millis(100), REJOIN_EVERY);
    Ok(Joined { node: welcome.node, every, heads: welcome.heads })
}

/// The heads a node tries, in order: those its URL names (`given`, comma-separated),
/// then those it learned of that the URL does not name.
fn heads_to_try(given: &str, learned: &[String]) -> Vec<String> {
    let mut all: Vec<String> = given.split(',').map(str::to_string).collect();
    for h in learned {
        if !all.contains(h) {
            all.push(h.clone());
        }
    }
    all
}

/// Heads a node keeps learned at most.
const MAX_HEADS: usize = 64;

/// Joins the first of `heads` that takes the join, each tried on its own: one that
/// refuses, is something else now, or fails TLS does not stop the search. Answers the
/// welcome and the head that gave it.
async fn join_any(
    shared: &Shared,
    head: &ConnectOptions,
    heads: &[String],
    advertise: &str,
    http: Option<&str>,
) -> Result<(Joined, String), String> {
    let mut why = Vec::new();
    for addr in heads {
        match join(shared, &head.for_one(addr), advertise, http).await {
            Ok(welcome) => return Ok((welcome, addr.clone())),
            Err(e) => why.push(e),
        }
    }
    Err(why.join("; "))
}

/// The heads a head named that a node may dial: `host:port` each, nothing else.
fn plausible_heads(heads: Vec<String>) -> Vec<String> {
    heads
        .into_iter()
        .filter(|h| {
            h.len() <= 255
                && h.rsplit_once(':').is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok())
                && !h.contains(|c: char| c == ',' || c.is_whitespace() || c.is_control() || c == '/')
        })
        .take(MAX_HEADS)
        .collect()
}

/// The heads this node learned of before it last stopped.
fn kept_heads(shared: &Shared) -> Vec<String> {
    let text = std::fs::read_to_string(shared.config.state_dir.join(HEADS_FILE)).unwrap_or_default();
    plausible_heads(text.lines().map(str::to_string).collect())
}

/// Keeps the heads learned, replacing the file atomically.
fn keep_heads(shared: &Shared, heads: &[String]) {
    let path = shared.config.state_dir.join(HEADS_FILE);
    if let Err(e) = replace_file(&path, heads.join("\n").as_bytes()) {
        tracing::warn!("cannot keep the cluster's heads in {}: {e}", path.display());
    }
}

/// Writes the keys a head sent into the state directory, sealed under the node's token
/// (mode 0600, replaced atomically), unless they are what is kept already.
fn keep_keys(shared: &Shared, token: &[u8], keys: &locus_proto::capability::KeyRing) {
    if shared.node_key().is_some_and(|k| *k == *keys) {
        return;
    }
    let path = shared.config.state_dir.join(crate::cluster::keys::NODE_KEYS_FILE);
    let sealed = crate::cluster::keys::seal_at_node(token, keys);
    if let Err(e) = replace_file(&path, sealed.as_bytes()) {
        tracing::warn!("cannot keep the cluster's keys in {}: {e}", path.display());
    }
}

/// Replaces the file at `path` with `bytes` (mode 0600, synced), atomically: a crash
/// leaves the old file or the new, never a part of either.
fn replace_file(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
    std::io::Write::write_all(&mut f, bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// Takes up the keys this node kept from its last join, if it has none yet and they
/// open with `token`: a node restarted while no head answers serves reads with them
/// until it joins again. Answers whether it did.
pub fn resume_with_kept_keys(shared: &Shared, token: &[u8]) -> bool {
    let path = shared.config.state_dir.join(crate::cluster::keys::NODE_KEYS_FILE);
    let kept = std::fs::read_to_string(path).ok().and_then(|text| crate::cluster::keys::open_at_node(token, &text));
    match kept.filter(|_| shared.node_key().is_none()) {
        Some(keys) => {
            tracing::info!("serving with the cluster keys kept from the last join until a head answers");
            shared.set_node_key(keys);
            true
        }
        None => false,
    }
}

/// How a data node checks the versions it keeps in the background.
#[derive(Clone, Copy, Debug)]
pub struct Scrub {
    /// A pass over every version starts this long after the last one began.
    pub every: Duration,
    /// Bytes read a second at most (0: unlimited), so clients' reads keep their speed.
    pub rate: u64,
}

impl Default for Scrub {
    fn default() -> Self {
        Scrub { every: Duration::from_secs(24 * 3600), rate: 32 << 20 }
    }
}

/// One pass of the scrub over the node's versions: each is checked against its
/// checksums (one stored before checksums is given them); a damaged one is moved aside
/// and reported to the head at the next heartbeat. Answers how many were damaged.
pub fn scrub(shared: &Shared, rate: u64) -> usize {
    use crate::cluster::checksums;
    let objects = crate::cluster::objects::objects_dir(shared);
    let Ok(dir) = std::fs::read_dir(&objects) else { return 0 };
    let started = std::time::Instant::now();
    let (mut read, mut damaged) = (0u64, 0);
    for entry in dir.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some((object, version)) =
            name.split_once('.').and_then(|(o, v)| Some((o.parse::<u64>().ok()?, v.parse::<u64>().ok()?)))
        else {
            continue; // checksums, copies in progress, the damaged directory
        };
        match checksums::scrub_one(&entry.path()) {
            Ok(()) => {}
            Err(checksums::CheckError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::error!(object, version, "scrub: {e}; moved aside for repair");
                checksums::quarantine(&objects, &name);
                shared.report_damaged(object, version);
                damaged += 1;
            }
        }
        read += entry.metadata().map_or(0, |m| m.len());
        if rate > 0 {
            std::thread::sleep(Duration::from_secs_f64(read as f64 / rate as f64).saturating_sub(started.elapsed()));
        }
    }
    damaged
}

/// Prepares the object directory and joins the head, then keeps sending it heartbeats
/// (a head that cannot be reached is retried) while the scrub checks the node's
/// versions on a thread of its own. Each join tries the heads `head` names, then the
/// other heads of the namespace the last head named (kept in [`HEADS_FILE`] across
/// restarts), so a node rejoins the cluster whichever head is left.
pub async fn serve_head(
    shared: Arc<Shared>,
    head: ConnectOptions,
    advertise: String,
    http: Option<String>,
    scrub_with: Scrub,
) {
    let objects = crate::cluster::objects::objects_dir(&shared);
    if let Err(e) = std::fs::create_dir_all(&objects) {
        tracing::error!("cannot create {}: {e}", objects.display());
    }
    resume_with_kept_keys(&shared, head.credentials.token.as_bytes());
    let scrubbed = Arc::downgrade(&shared);
    std::thread::Builder::new()
        .name("locus-scrub".into())
        .spawn(move || loop {
            std::thread::sleep(scrub_with.every);
            let Some(shared) = scrubbed.upgrade() else { return };
            let damaged = scrub(&shared, scrub_with.rate);
            tracing::info!(damaged, "scrub pass done");
        })
        .expect("a thread for the scrub");
    let mut joined = false;
    let given = head.addr.clone();
    let mut learned = kept_heads(&shared);
    loop {
        let every = match join_any(&shared, &head, &heads_to_try(&given, &learned), &advertise, http.as_deref()).await {
            Ok((welcome, at)) => {
                if !joined {
                    tracing::info!(node = welcome.node, head = %at, "joined the cluster");
                    joined = true;
                }
                let heads = plausible_heads(welcome.heads);
                if !heads.is_empty() && heads != learned {
                    keep_heads(&shared, &heads);
                    learned = heads;
                }
                welcome.every
            }
            Err(e) => {
                tracing::warn!("{e}; retrying");
                Duration::from_secs(1)
            }
        };
        tokio::time::sleep(every).await;
    }
}
