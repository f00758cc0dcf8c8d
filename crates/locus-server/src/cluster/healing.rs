//! Keeping every version at its replication factor: nodes that stop sending heartbeats
//! are down, nodes being drained are leaving, and copies a node found damaged are gone;
//! the versions they held are copied node to node from a live replica (`object_fetch`,
//! at [`crate::cluster::HeadConfig::repair_rate`]) until each has its factor again, and only then are
//! they taken out of the version's list (and dropped from the node once it answers).
//!
//! Versions a head kept in its own directory before any data node joined move to the
//! nodes the same way (the head sends them).
//!
//! Among the heads of one namespace, one heals at a time: the holder of a lease kept in
//! the namespace's settings, so two heads do not copy the same versions.

use crate::cluster::head::{GARBAGE_SLACK, LOCAL_NODE, NODES_FRESH};
use crate::cluster::meta_err;
use crate::cluster::objects::object_name;
use crate::cluster::Head;
use crate::dispatch::Reply;
use locus_cluster::{Content, Damaged, Entry, Node};
use locus_proto::capability::{self, NODE_SUBJECT};
use locus_proto::ops::{NodeJoin, ObjectFetch};
use locus_proto::types::{NodeInfo, NodeWelcome};
use locus_proto::{Code, Error as WireError};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long the healing lease lasts unless renewed (each round renews it).
const LEASE: Duration = Duration::from_secs(30);

/// Versions looked at per node and per round.
const BATCH: u64 = 32;

/// Copies made at once (each at most at [`crate::cluster::HeadConfig::repair_rate`]).
const PARALLEL: usize = 4;

/// A copy to make: from which nodes, of which file, to the node leaving or damaged.
enum Leaving {
    /// Down or draining: its copy may still be read while it answers.
    Node(u64),
    /// Its copy failed a checksum and was moved aside: never a source.
    Damaged(u64),
}

impl Leaving {
    fn node(&self) -> u64 {
        match self {
            Leaving::Node(n) | Leaving::Damaged(n) => *n,
        }
    }
}

impl Head {
    /// How often data nodes should send heartbeats: three times within the timeout,
    /// and at least every [`crate::cluster::config::REJOIN_EVERY`] (so they learn a
    /// rotated key within its grace).
    pub fn heartbeat_every(&self) -> Duration {
        (self.config.node_timeout / 3).clamp(Duration::from_millis(100), crate::cluster::config::REJOIN_EVERY)
    }

    /// A data node's join (its heartbeat, made as `locus-node` with `token`): records
    /// it, its free space and the versions it found damaged, and answers the cluster's
    /// keys sealed for it and how soon to join again.
    pub(crate) fn heartbeat(
        &self,
        req: &NodeJoin,
        token: &[u8],
        peer: Option<std::net::SocketAddr>,
    ) -> Reply<NodeWelcome> {
        // Checked first: a join this head would not issue a certificate for records nothing.
        let tls = self.node_tls(&req.addr, peer)?;
        let node = self.meta.join_node(&req.addr, req.http.as_deref(), req.free).map_err(meta_err)?;
        let busiest = &req.busiest[..req.busiest.len().min(crate::cluster::node::BUSIEST_REPORTED)];
        if let Err(e) = self.meta.record_node_accounts(node, &req.io, busiest) {
            tracing::warn!(node, "cannot record the node's accounts: {e}");
        }
        if !req.damaged.is_empty() {
            tracing::warn!(node, versions = ?req.damaged, "data node found damaged versions: repairing from replicas");
            self.meta.add_damaged(node, &req.damaged).map_err(meta_err)?;
        }
        self.forget_nodes();
        self.placed.lock().remove(&node);
        tracing::debug!(node, addr = %req.addr, free = req.free, "data node heartbeat");
        let (nonce, sealed, tls) =
            crate::cluster::keys::seal_for_node(&self.keys(), tls.as_ref(), token, &req.nonce, &req.addr);
        let every_ms = self.heartbeat_every().as_millis() as u64;
        Ok(NodeWelcome { node, nonce, sealed, every_ms, heads: self.heads_alive(), tls }.into())
    }

    /// On a head serving TLS: the identity of the data node advertising `addr`, issued
    /// by the cluster's authority at its first join to this head process. Only for the
    /// IP address the join came from (`peer`), so that a holder of the nodes' token
    /// gets no certificate for a name that is not its own (a head's, another node's);
    /// a node behind a NAT or proxy cannot join a TLS head.
    fn node_tls(
        &self,
        addr: &str,
        peer: Option<std::net::SocketAddr>,
    ) -> Result<Option<crate::cluster::keys::NodeTls>, WireError> {
        let Some(ca) = self.ca.get() else { return Ok(None) };
        let host = locus_client::host_of(addr);
        let named = host.parse::<std::net::IpAddr>().ok().map(|ip| ip.to_canonical());
        let peer = peer.map(|p| p.ip().to_canonical());
        if named.is_none() || named != peer {
            return Err(WireError::new(
                Code::ACCES,
                format!(
                    "a data node of a TLS head advertises the IP address it joins from, which its certificate \
                     names (this join came from {}, advertising {addr:?})",
                    peer.map_or_else(|| "nowhere".to_string(), |p| p.to_string())
                ),
            ));
        }
        if let Some(known) = self.issued.lock().get(addr) {
            return Ok(Some(known.clone()));
        }
        let (chain, key) = ca.issue(&[host]).map_err(|e| WireError::new(Code::IO, e))?;
        let tls = (chain, key, ca.cert_pem.clone());
        self.issued.lock().insert(addr.to_string(), tls.clone());
        Ok(Some(tls))
    }

    /// Serves TLS with a certificate of the cluster's authority (made now if the
    /// namespace has none): written as the state directory's identity (`cert.pem`, the
    /// chain up to the authority, which is what clients and data nodes trust, and
    /// `key.pem`) for the names a local server's has, the names clients reach it
    /// by (`names`, `--name`) and the host it advertises. Its links to data nodes go
    /// over TLS too.
    pub(crate) fn serve_tls(&self, state_dir: &std::path::Path, names: &[String]) -> Result<(), crate::ServerError> {
        let tls_err = crate::ServerError::Tls;
        let ca = crate::cluster::cluster_ca::ClusterCa::open(&self.meta, &self.sealing.wrap).map_err(tls_err)?;
        let mut hosts = crate::config::local_tls_names();
        hosts.extend(names.iter().cloned());
        hosts.extend(self.config.advertise.as_deref().map(locus_client::host_of));
        let mut seen = std::collections::HashSet::new();
        hosts.retain(|h| seen.insert(h.clone()));
        let (chain, key) = ca.issue(&hosts).map_err(tls_err)?;
        let cert = state_dir.join(crate::config::CERT_FILE);
        crate::config::write_identity(&cert, &chain, &state_dir.join(crate::config::KEY_FILE), &key)?;
        self.reads.use_tls(cert);
        let _ = self.ca.set(ca);
        Ok(())
    }

    /// Where data nodes reach this head: `--advertise`, else the address it listens
    /// on unless that is a wildcard (which names no one head).
    fn advertised(&self) -> Option<String> {
        if let Some(a) = &self.config.advertise {
            return Some(a.clone());
        }
        let shared = self.shared.get()?.upgrade()?;
        let at = *shared.listen.get()?;
        (!at.ip().is_unspecified()).then(|| at.to_string())
    }

    /// The heads of this namespace heard from within the node timeout, this one
    /// included (its own row refreshed at most every [`NODES_FRESH`]): what a data node
    /// is told, so that it joins another head when its own dies.
    pub(crate) fn heads_alive(&self) -> Vec<String> {
        let mut cached = self.heads.lock();
        if cached.0.is_some_and(|at| at.elapsed() < NODES_FRESH) {
            return cached.1.clone();
        }
        let Some(me) = self.advertised() else { return Vec::new() };
        // Heads that stopped lately may come back: a node tries them after the others.
        let within = self.config.node_timeout.as_secs().max(1) * 20;
        match self.meta.head_alive(&me, within) {
            Ok(heads) => *cached = (Some(Instant::now()), heads),
            Err(e) => tracing::warn!("cannot record this head in the namespace: {e}"),
        }
        cached.1.clone()
    }

    /// Drains a node (its versions move to others), or with `remove` forgets one that
    /// holds no current version; `who` asked.
    pub(crate) fn retire_node(&self, node: u64, remove: bool, who: &str) -> Result<(), WireError> {
        match remove {
            false => self.meta.set_draining(node, true),
            true => self.meta.remove_node(node),
        }
        .map_err(meta_err)?;
        self.forget_nodes();
        tracing::info!(by = %who, node, remove, "data node {}", if remove { "removed" } else { "draining" });
        Ok(())
    }

    /// Whether a heartbeat came from `node` within the timeout.
    pub(crate) fn is_live(&self, node: &Node) -> bool {
        node.id == LOCAL_NODE || node.seen + self.config.node_timeout.as_secs().max(1) >= capability::now()
    }

    /// The data nodes, their state and how many current versions each holds.
    pub fn node_list(&self) -> Result<Vec<NodeInfo>, WireError> {
        let nodes = self.meta.nodes().map_err(meta_err)?;
        let now = capability::now();
        nodes
            .into_iter()
            .map(|n| {
                let versions = self.meta.versions_on(n.id).map_err(meta_err)?;
                let state = match (self.is_live(&n), n.draining, versions) {
                    (_, true, 0) => "drained",
                    (_, true, _) => "draining",
                    (false, _, _) => "down",
                    (true, _, _) => "up",
                };
                Ok(NodeInfo {
                    id: n.id,
                    addr: n.addr,
                    http: n.http,
                    free: n.free,
                    state: state.into(),
                    seen_s: now.saturating_sub(n.seen),
                    versions,
                })
            })
            .collect()
    }

    /// Takes (or renews) the healing lease; answers whether this head holds it.
    fn take_lease(&self) -> bool {
        let now = capability::now();
        let mine = self.id.to_string();
        let held = self.meta.update_setting("healing_lease", |old| {
            let other = old
                .and_then(|v| v.split_once(' '))
                .filter(|(id, until)| *id != mine && until.parse::<u64>().is_ok_and(|u| u > now));
            Ok(match (other, old) {
                (Some(_), Some(old)) => old.to_string(),
                _ => format!("{mine} {}", now + LEASE.as_secs()),
            })
        });
        held.is_ok_and(|v| v.split(' ').next() == Some(mine.as_str()))
    }

    /// One round of healing: damaged copies first, then the versions on nodes that are
    /// down or draining, up to [`PARALLEL`] copies at once. Answers how many copies
    /// were replaced.
    pub async fn heal(self: &Arc<Self>) -> usize {
        // Fresh for healing, without emptying the cache every request reads.
        let Ok(nodes) = self.meta.nodes() else { return 0 };
        let damaged = self.meta.damaged(BATCH).unwrap_or_default();
        let leaving: Vec<&Node> = nodes.iter().filter(|n| n.draining || !self.is_live(n)).collect();
        // Versions the head kept itself before any data node joined move to the nodes
        // (looked for until none is left).
        let local = match nodes.is_empty() || self.local_moved.load(std::sync::atomic::Ordering::Relaxed) {
            true => Vec::new(),
            false => self.meta.files_on(LOCAL_NODE, BATCH).unwrap_or_default(),
        };
        if local.is_empty() && !nodes.is_empty() {
            self.local_moved.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        if (damaged.is_empty() && leaving.is_empty() && local.is_empty()) || !self.take_lease() {
            return 0;
        }
        let mut work: Vec<(Entry, Leaving, Option<Damaged>)> = Vec::new();
        for d in damaged {
            match self.meta.file_of(d.object, d.version) {
                Ok(Some(e)) => work.push((e, Leaving::Damaged(d.node), Some(d))),
                // The version is no file's any more: nothing to repair.
                Ok(None) => drop(self.meta.forget_damaged(&d)),
                Err(_) => {}
            }
        }
        for n in leaving {
            for e in self.meta.files_on(n.id, BATCH).unwrap_or_default() {
                work.push((e, Leaving::Node(n.id), None));
            }
        }
        work.extend(local.into_iter().map(|e| (e, Leaving::Node(LOCAL_NODE), None)));
        // One copy at a time per file.
        let mut seen = std::collections::HashSet::new();
        work.retain(|(e, _, _)| seen.insert(e.path.clone()));
        let work = by_turns(work, |(e, leaving, _)| {
            let Content::Nodes(ids) = &e.content else { return LOCAL_NODE };
            ids.iter().copied().find(|id| *id != leaving.node()).unwrap_or(LOCAL_NODE)
        });
        let nodes = Arc::new(nodes);
        let (mut running, mut healed) = (tokio::task::JoinSet::new(), 0);
        for (e, leaving, damaged) in work {
            // A round may outlast the lease: it is renewed before each copy, and the round
            // ends if another head holds it now.
            if !self.take_lease() {
                break;
            }
            while running.len() >= PARALLEL {
                healed += running.join_next().await.is_some_and(|r| r.unwrap_or(false)) as usize;
            }
            let (head, nodes) = (self.clone(), nodes.clone());
            running.spawn(async move {
                let done = head.replace(&e, leaving, &nodes).await;
                if let (true, Some(d)) = (done, damaged) {
                    return head.meta.forget_damaged(&d).is_ok();
                }
                done
            });
        }
        while let Some(r) = running.join_next().await {
            healed += r.unwrap_or(false) as usize;
        }
        healed
    }

    /// Copies `e`'s version to other nodes until it has its factor without the node
    /// `leaving`, then takes that node out of its list; answers whether it did.
    async fn replace(&self, e: &Entry, leaving: Leaving, nodes: &[Node]) -> bool {
        let Content::Nodes(ids) = &e.content else { return true };
        let gone = leaving.node();
        let holder = |id: &u64| nodes.iter().find(|n| n.id == *id);
        let mut keep: Vec<u64> = ids
            .iter()
            .copied()
            .filter(|id| *id != gone && holder(id).is_some_and(|n| self.is_live(n) && !n.draining))
            .collect();
        let sources: Vec<String> = ids
            .iter()
            .filter(|id| !(matches!(leaving, Leaving::Damaged(n) if n == **id)))
            .filter_map(holder)
            .filter(|n| self.is_live(n))
            .map(|n| n.addr.clone())
            .collect();
        let want = self.config.replication.max(1);
        let sources_known = !sources.is_empty() || gone == LOCAL_NODE;
        let mut targets = self.candidates(e.size).unwrap_or_default().into_iter().filter(|n| !ids.contains(&n.id));
        while keep.len() < want {
            let (Some(target), true) = (targets.next(), sources_known) else {
                tracing::debug!(path = %e.path, "cannot restore its replicas yet: no live source or no node to copy to");
                return false;
            };
            // Counted before the copy, so that copies made at once spread over nodes.
            *self.placed.lock().entry(target.id).or_default() += e.size;
            let copied = match gone == LOCAL_NODE {
                // From the head's own directory: the head sends it (and the node seals it).
                true => {
                    let local = self.objects.join(object_name(e.object, e.version));
                    self.store_on(&target, &local, e.object, e.version, e.size).await.map_err(|err| err.message)
                }
                false => self.fetch_to(&target, e, &sources).await,
            };
            if let Err(why) = copied {
                tracing::warn!(path = %e.path, node = target.id, "copying a replica failed: {why}");
                continue;
            }
            match self.meta.move_replica(&e.path, e.object, e.version, None, Some(target.id)) {
                Ok(true) => keep.push(target.id),
                // The file changed meanwhile: the copy is not needed.
                Ok(false) => {
                    let _ = self.meta.add_garbage_on(e.object, e.version, &[target.id], self.garbage_after());
                    return true;
                }
                Err(err) => {
                    tracing::warn!(path = %e.path, "recording a copied replica failed: {err}");
                    return false;
                }
            }
        }
        tracing::info!(path = %e.path, from = gone, to = ?keep, "replicas restored");
        let moved = self.meta.move_replica(&e.path, e.object, e.version, Some(gone), None);
        let queued = self.meta.add_garbage_on(e.object, e.version, &[gone], self.garbage_after());
        moved.is_ok() && queued.is_ok()
    }

    /// Has `target` copy `e`'s version from one of the nodes `sources` (`object_fetch`).
    pub(crate) async fn fetch_to(&self, target: &Node, e: &Entry, sources: &[String]) -> Result<(), String> {
        let expires = capability::now() + self.config.capability_ttl.as_secs();
        let cap = capability::sign(&self.key(), NODE_SUBJECT, e.object, e.version, e.size, expires);
        let fetch = ObjectFetch { capability: cap, from: sources.to_vec(), rate: self.config.repair_rate };
        // The copy may take long: a generous second per MiB beyond the usual deadline
        // (a node that hangs is still given up).
        let limit = locus_client::Deadlines::default().request + Duration::from_secs(e.size >> 20);
        match self.writer(target).await {
            Ok(c) => c.call_within(fetch, limit).await.map_err(|err| err.to_string()),
            Err(err) => Err(err.message),
        }
    }

    /// When a copy taken out of a version's list may be dropped: after every
    /// capability that could name its node has expired.
    pub(crate) fn garbage_after(&self) -> u64 {
        capability::now() + (self.config.capability_ttl + GARBAGE_SLACK).as_secs()
    }
}

/// `work` reordered so that its items take turns by `source` (the node a copy reads
/// from): the copies made at once then draw on every source's link, not on one while
/// the others idle. The order within each source's items is kept.
fn by_turns<T>(work: Vec<T>, source: impl Fn(&T) -> u64) -> Vec<T> {
    let mut queues: Vec<(u64, std::collections::VecDeque<T>)> = Vec::new();
    for item in work {
        let s = source(&item);
        match queues.iter_mut().find(|(q, _)| *q == s) {
            Some((_, q)) => q.push_back(item),
            None => queues.push((s, std::collections::VecDeque::from([item]))),
        }
    }
    let mut out = Vec::new();
    while queues.iter().any(|(_, q)| !q.is_empty()) {
        for (_, q) in &mut queues {
            out.extend(q.pop_front());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn copies_take_turns_by_source() {
        let work = vec![(1, 'a'), (1, 'b'), (1, 'c'), (2, 'd'), (3, 'e'), (2, 'f')];
        let order: String = super::by_turns(work, |w| w.0).into_iter().map(|w| w.1).collect();
        assert_eq!(order, "adebfc");
    }
}
