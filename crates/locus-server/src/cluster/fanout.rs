//! A storelet run across the cluster: each node runs its share over a view of the
//! files it holds, and the head merges their outputs.
//!
//! Every file is in exactly one share: a file on nodes goes to the live node holding it
//! that has the fewest files so far, a small file kept in the namespace to the node with
//! the fewest. A share's output is handed on when the share finishes (each is bounded by
//! the node's storelet output limit), so a node that fails before then (it cannot be
//! reached, or goes away) leaves no partial output: its files are planned again over
//! the other live nodes holding them, and run there. A read-only run's plan, and each
//! node's tree of its share, are kept for the next run over the directory (`plans`).
//!
//! `storelet ps`, `cancel` and `stats` on a head ask every live node, as the head (which
//! a node answers for every subject): a run is listed once per node share, under an id
//! naming the node (`NODE << 32 | RUN`), and a subject sees and cancels only its own
//! unless it holds `a` at the root.
//!
//! A writable run works on copies at each node; each node tells the head what its share
//! wrote and removed, keeping the written files aside. Only when every share has ended
//! well does the head adopt them: each becomes a new version of its file (replicated as
//! the head's policy asks, small ones moved into the namespace), removals are made, and
//! the subject's `w` (and `d`) rights are checked for every one of them first, so a run
//! with a change it may not make changes nothing. A run that fails, or whose program
//! exits with a status other than 0 on any node, changes nothing.

use crate::cluster::head::LOCAL_NODE;
use crate::cluster::objects::MODULE_NOT_HERE;
use crate::cluster::plans::{KeptPlan, PLAN_NOT_HERE};
use crate::cluster::Head;
use crate::cluster::{governing, meta_err};
use crate::transport::EventFrame;
use bytes::Bytes;
use locus_cluster::{Content, Entry, Kind as EntryKind, Node};
use locus_proto::frame::Kind;
use locus_proto::ops::*;
use locus_proto::types::*;
use locus_proto::{codec, Code, Error as WireError};
use std::collections::HashMap;
use std::sync::Arc;

/// A file of a run and the nodes holding its version (none: it is inline).
pub(crate) type RunFile = (ViewFile, Vec<u64>);

/// One node's share of a run.
pub(crate) type Share = (Node, Vec<RunFile>);

/// What a writable run's changes are committed under: its directory, its subject, and
/// what tells clients holding promises on a changed path.
pub(crate) struct Writes {
    pub(crate) dir: String,
    pub(crate) tell: Box<dyn Fn(&str) + Send + Sync>,
}

/// A file a writable run wrote at a node, kept there as `token`.
struct Wrote {
    node: Node,
    path: String,
    size: u64,
    token: String,
}

/// A run's shares, and the plan they are kept under (see `cluster::plans`).
pub(crate) struct Planned {
    /// Each node's files; none when `kept` is a plan kept from an earlier run (each node
    /// runs over the tree it keeps).
    pub(crate) shares: Vec<Share>,
    /// The plan each node's tree is kept under, if any.
    pub(crate) kept: Option<Arc<KeptPlan>>,
    /// Whether `kept` was made for this run (and is kept at the head once it ends well).
    pub(crate) fresh: bool,
}

impl Head {
    /// True when `who` holds `r` and `l` in `dir` and in every directory above it up to
    /// one `known` already says (answers are kept there).
    fn readable_dir(&self, who: &str, dir: &str, known: &mut HashMap<String, bool>) -> Result<bool, WireError> {
        if let Some(&yes) = known.get(dir) {
            return Ok(yes);
        }
        let parent = governing(dir, false);
        let yes = parent != dir
            && self.readable_dir(who, parent, known)?
            && self.meta.rights(who, dir).map_err(meta_err)?.contains(Rights::READ.union(Rights::LIST));
        known.insert(dir.to_string(), yes);
        Ok(yes)
    }

    /// The files under `dir` that `who` may read (every directory between `dir` and the
    /// file grants `r` and `l`), as a run on the nodes sees them, with the nodes holding
    /// each (none for a small file, whose bytes go with it).
    pub(crate) fn view_files(&self, who: &str, dir: &str) -> Result<Vec<RunFile>, WireError> {
        Ok(self.listed(who, dir)?.0)
    }

    /// As [`Head::view_files`], and whether one of the files has other names.
    fn listed(&self, who: &str, dir: &str) -> Result<(Vec<RunFile>, bool), WireError> {
        let mut linked = false;
        let prefix = if dir == "/" { 0 } else { dir.len() };
        let mut readable: HashMap<String, bool> = HashMap::from([(dir.to_string(), true)]);
        let mut files = Vec::new();
        // The rows come in path order, so a directory's files come together.
        let mut last: Option<(String, bool)> = None;
        for e in self.meta.files_under(dir).map_err(meta_err)? {
            let parent = governing(&e.path, false);
            let yes = match &last {
                Some((d, yes)) if d == parent => *yes,
                _ => {
                    let yes = self.readable_dir(who, parent, &mut readable)?;
                    last = Some((parent.to_string(), yes));
                    yes
                }
            };
            if !yes {
                continue;
            }
            linked |= e.links > 1;
            let path = e.path[prefix..].trim_start_matches('/').to_string();
            let (holders, inline) = match e.content {
                Content::Nodes(ids) => (ids, None),
                Content::Inline(bytes) => (Vec::new(), Some(bytes)),
            };
            files.push((ViewFile { path, object: e.object, version: e.version, inline }, holders));
        }
        Ok((files, linked))
    }

    /// The shares of a read-only run of `who` over `dir`: those of the plan kept for
    /// it, when all its nodes are live; else planned from the namespace now, with a plan
    /// to keep if the run ends well (none if a share is the head's own, or a file has
    /// other names).
    pub(crate) fn plan_read_only(&self, who: &str, dir: &str) -> Result<Planned, WireError> {
        let hears = self.hears_others();
        if let Some(kept) = self.plans.get(who, dir).filter(|_| hears) {
            let nodes = self.nodes()?;
            let live: Option<Vec<Share>> = kept
                .shares
                .iter()
                .map(|s| nodes.iter().find(|n| n.id == s.node && self.is_live(n)).map(|n| (n.clone(), Vec::new())))
                .collect();
            match live {
                Some(shares) => {
                    self.plans.count(true);
                    return Ok(Planned { shares, kept: Some(kept), fresh: false });
                }
                None => self.plans.forget(&kept),
            }
        }
        let since = self.plans.now();
        let (files, linked) = self.listed(who, dir)?;
        let shares = self.plan_run(files, &[])?;
        self.plans.count(false);
        let kept = (hears && !linked && shares.iter().all(|(n, _)| n.id != LOCAL_NODE)).then(|| {
            let paths = shares
                .iter()
                .map(|(n, files)| (n.id, files.iter().map(|(f, _)| (f.path.as_str(), f.object, f.version))));
            Arc::new(KeptPlan::of(&self.plans, who, dir, since, paths))
        });
        Ok(Planned { shares, kept, fresh: true })
    }

    /// Read-only runs so far planned from the namespace, and run over a kept plan.
    pub fn run_plans(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.plans.planned.load(Relaxed), self.plans.reused.load(Relaxed))
    }

    /// The files of `node`'s share of `kept`, found again in the directory's files
    /// (`listed`, listed here the first time in a run) when its node failed or lost its
    /// tree; the plan is forgotten. Fails (`EAGAIN`) unless the directory holds exactly
    /// the plan's files and versions: the other shares ran over what it held then.
    async fn replay(
        self: &Arc<Self>,
        kept: &Arc<KeptPlan>,
        node: u64,
        listed: &mut Option<Vec<RunFile>>,
    ) -> Result<Vec<RunFile>, WireError> {
        self.plans.forget(kept);
        if listed.is_none() {
            let (head, kept) = (self.clone(), kept.clone());
            let listing = tokio::task::spawn_blocking(move || head.view_files(&kept.who, &kept.dir));
            *listed = Some(listing.await.map_err(|_| WireError::new(Code::IO, "listing the run's files failed"))??);
        }
        let all = listed.as_deref().unwrap_or_default();
        if !kept.is_exactly(all.iter().map(|(f, _)| (f.path.as_str(), f.object, f.version))) {
            return Err(WireError::new(
                Code::AGAIN,
                format!("{}: changed during the run while a share was moved; run it again", kept.dir),
            ));
        }
        Ok(all.iter().filter(|(f, _)| kept.holder(&f.path, f.object, f.version) == Some(node)).cloned().collect())
    }

    /// Splits a run's files over the live nodes, none of `failed`: each file to the
    /// holder with the fewest files so far (an inline file to any node).
    pub(crate) fn plan_run(&self, files: Vec<RunFile>, failed: &[u64]) -> Result<Vec<Share>, WireError> {
        let mut nodes: Vec<Node> =
            self.nodes()?.into_iter().filter(|n| self.is_live(n) && !failed.contains(&n.id)).collect();
        if nodes.is_empty() && !self.has_live_node()? && !failed.contains(&LOCAL_NODE) {
            // No data node: the head runs it itself, over what it keeps.
            nodes.push(Head::here());
        }
        if nodes.is_empty() {
            return Err(WireError::new(Code::IO, "no live data node is left to run the storelet"));
        }
        let mut shares: Vec<Share> = nodes.into_iter().map(|n| (n, Vec::new())).collect();
        for (file, holders) in files {
            let eligible = |i: &usize| holders.is_empty() || holders.contains(&shares[*i].0.id);
            let Some(at) = (0..shares.len()).filter(eligible).min_by_key(|&i| shares[i].1.len()) else {
                let why = match holders.contains(&LOCAL_NODE) {
                    true => "it is still at the head, moving to the data nodes (run again shortly)",
                    false => "no live data node holds it",
                };
                return Err(WireError::new(Code::IO, format!("{}: {why}", file.path)));
            };
            shares[at].1.push((file, holders));
        }
        shares.retain(|(_, files)| !files.is_empty());
        Ok(shares)
    }
}

/// What one share's run came to: its events (output and the final account), or the
/// node's error, with whether another node may take the share over.
type Outcome = (Share, Result<Vec<(StoreletEvent, Bytes)>, (WireError, bool)>);

/// Runs a share at its node and gathers its events until it finishes. The module's
/// bytes go to a node once: later runs name it by hash (`req.module`), and a node that
/// no longer has it compiled answers [`MODULE_NOT_HERE`], so it goes again.
pub(crate) async fn run_share(head: Arc<Head>, mut req: NodeRun, module: Bytes, share: Share) -> Outcome {
    let id = share.0.id;
    if id == LOCAL_NODE {
        let events = run_here(&head, req, module).await;
        return (share, events.map_err(|e| (e, false)));
    }
    if module.is_empty() {
        return (share, Err((WireError::new(Code::INVAL, "the module is empty"), false)));
    }
    if req.module.is_empty() {
        req.module = locus_storelet::Runner::hash(&module);
    }
    let size = codec::encoded_len(&req);
    if size > crate::session::HEAD_MAX_META as usize {
        let why = format!(
            "data node {id}: its share of the run lists {} files in {size} bytes, more than the {} a node takes (small files' bytes count)",
            req.files.len(),
            crate::session::HEAD_MAX_META
        );
        return (share, Err((WireError::new(Code::TOO_LARGE, why), false)));
    }
    let known = (id, req.module.clone());
    let sent_before = head.modules_sent.lock().contains(&known);
    let outcome =
        share_events(&head, &share.0, req.clone(), if sent_before { Bytes::new() } else { module.clone() }).await;
    let outcome = match outcome {
        Err((e, _)) if sent_before && e.code == Code::NOENT && e.message.contains(MODULE_NOT_HERE) => {
            head.modules_sent.lock().remove(&known);
            share_events(&head, &share.0, req, module).await
        }
        outcome => outcome,
    };
    if outcome.is_ok() {
        let mut sent = head.modules_sent.lock();
        if sent.len() >= 4096 {
            sent.clear();
        }
        sent.insert(known);
    }
    (share, outcome)
}

/// Runs `req` at `node` with `module` (empty: named by hash) and gathers its events.
async fn share_events(
    head: &Head,
    node: &Node,
    req: NodeRun,
    module: Bytes,
) -> Result<Vec<(StoreletEvent, Bytes)>, (WireError, bool)> {
    let id = node.id;
    let c = head.writer(node).await.map_err(|e| (e, true))?;
    let mut frames =
        c.call_stream_with(req, &module).await.map_err(|e| (WireError::new(e.code(), e.to_string()), true))?;
    let mut events = Vec::new();
    while let Some(f) = frames.recv().await {
        let f = match f {
            // A broken connection is the node's failure; an error it answered is the run's.
            Ok(f) => f,
            Err(e) => {
                let lost = e.is_transient();
                return Err((WireError::new(e.code(), format!("data node {id}: {e}")), lost));
            }
        };
        events.push((codec::decode::<StoreletEvent>(&f.meta).map_err(|e| (e, false))?, f.data.clone()));
        if !f.header.more() {
            return Ok(events);
        }
    }
    Err((WireError::new(Code::IO, format!("data node {id} went away")), true))
}

/// Runs a share at the head itself (which has no data node) over what it keeps, and
/// gathers its events until it finishes.
async fn run_here(head: &Head, req: NodeRun, module: Bytes) -> Result<Vec<(StoreletEvent, Bytes)>, WireError> {
    let shared = head.shared.get().and_then(std::sync::Weak::upgrade);
    let shared = shared.ok_or_else(|| WireError::new(Code::IO, "the server is stopping"))?;
    let (_control, mut stream) = crate::cluster::objects::run_over_view(&shared, &head.objects, req, module)?;
    let mut events = Vec::new();
    while let Some(f) = stream.frames.recv().await {
        stream.queued.fetch_sub(f.data.len(), std::sync::atomic::Ordering::Relaxed);
        if f.kind == Kind::Error {
            return Err(codec::decode::<WireError>(&f.meta).unwrap_or_else(|e| e));
        }
        events.push((codec::decode::<StoreletEvent>(&f.meta)?, f.data));
        if !f.more {
            return Ok(events);
        }
    }
    Err(WireError::new(Code::IO, "the run at the head ended without its last event"))
}

/// Runs the shares at once and hands on one `Started`, every share's output as each
/// finishes, then one `Finished` adding up the accounts (the highest exit code). A
/// share whose node fails is planned again over the other nodes; the run fails when a
/// file is left with no live node, or a node answers an error of the run's own.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn merge_runs(
    head: Arc<Head>,
    subject: String,
    planned: Planned,
    args: Vec<String>,
    env: Vec<(String, String)>,
    module: Bytes,
    writes: Option<Writes>,
    tx: tokio::sync::mpsc::UnboundedSender<EventFrame>,
) {
    let frame = |kind: Kind, more: bool, meta: Vec<u8>, data: Bytes| EventFrame {
        kind,
        more,
        meta,
        data,
        mergeable: kind == Kind::Reply && more,
    };
    let fail = |e: &WireError| drop(tx.send(frame(Kind::Error, false, codec::encode(e), Bytes::new())));
    let mut running = tokio::task::JoinSet::new();
    let hash = locus_storelet::Runner::hash(&module);
    let (kept, fresh) = (planned.kept, planned.fresh);
    // The directory's files, once a share of a kept plan had to be found again.
    let mut listed = None;
    let start = |running: &mut tokio::task::JoinSet<Outcome>, share: Share, plan: u64| {
        let files = share.1.iter().map(|(f, _)| f.clone()).collect();
        let write = writes.is_some();
        let req = NodeRun {
            subject: subject.clone(),
            files,
            args: args.clone(),
            env: env.clone(),
            write,
            module: hash.clone(),
            plan,
        };
        running.spawn(run_share(head.clone(), req, module.clone(), share));
    };
    for share in planned.shares {
        let plan = kept.as_ref().map_or(0, |k| k.plan_of(share.0.id));
        start(&mut running, share, plan);
    }
    let (mut total, mut started, mut failed) = (StoreletResult::default(), false, Vec::new());
    let mut replanned = false;
    let (mut wrote, mut removed) = (Vec::new(), Vec::new());
    while let Some(done) = running.join_next().await {
        let Ok((share, outcome)) = done else { return fail(&WireError::new(Code::IO, "a share's task failed")) };
        let events = match outcome {
            Ok(events) => events,
            Err((e, lost)) => {
                // A node that failed, or no longer keeps its tree of a kept plan: its
                // files are planned again (found again when they were left out).
                let over_kept = kept.as_ref().filter(|_| share.1.is_empty() && !fresh);
                if lost {
                    tracing::warn!(node = share.0.id, "a storelet run's share failed there, moving it: {e}");
                    failed.push(share.0.id);
                } else if over_kept.is_none() || !(e.code == Code::NOENT && e.message.contains(PLAN_NOT_HERE)) {
                    return fail(&e);
                }
                replanned = true;
                let files = match over_kept {
                    Some(kept) => match head.replay(kept, share.0.id, &mut listed).await {
                        Ok(files) => files,
                        Err(why) => return fail(&WireError::new(why.code, format!("{e}; {}", why.message))),
                    },
                    None => share.1,
                };
                if files.is_empty() {
                    continue;
                }
                match head.plan_run(files, &failed) {
                    Ok(again) => again.into_iter().for_each(|s| start(&mut running, s, 0)),
                    Err(why) => return fail(&WireError::new(why.code, format!("{e}; {}", why.message))),
                }
                continue;
            }
        };
        // A share's report is trusted no further than its own files: it must end with
        // `Finished`, and may remove only what it was given.
        if !matches!(events.last(), Some((StoreletEvent::Finished(_), _))) {
            return fail(&WireError::new(
                Code::IO,
                format!("data node {}: a share ended without its account", share.0.id),
            ));
        }
        let given: std::collections::HashSet<&str> = share.1.iter().map(|(f, _)| f.path.as_str()).collect();
        if let Some(bad) = events.iter().find_map(|(e, _)| match e {
            StoreletEvent::Removed { path } if !given.contains(path.as_str()) => Some(path.clone()),
            _ => None,
        }) {
            return fail(&WireError::new(
                Code::IO,
                format!("data node {} removed {bad:?}, not one of its files", share.0.id),
            ));
        }
        for (event, data) in events {
            match event {
                StoreletEvent::Started { run, module } if !started => {
                    started = true;
                    // Named as `storelet ps` on the head lists it (its first share).
                    let first = StoreletEvent::Started { run: run_id(share.0.id, run), module };
                    let _ = tx.send(frame(Kind::Reply, true, codec::encode(&first), Bytes::new()));
                }
                StoreletEvent::Started { .. } => {}
                e @ (StoreletEvent::Stdout | StoreletEvent::Stderr) => {
                    let _ = tx.send(frame(Kind::Reply, true, codec::encode(&e), data));
                }
                StoreletEvent::Wrote { path, size, token } => {
                    wrote.push(Wrote { node: share.0.clone(), path, size, token })
                }
                StoreletEvent::Removed { path } => removed.push(path),
                StoreletEvent::Finished(r) => {
                    total.module = r.module;
                    total.exit_code = total.exit_code.max(r.exit_code);
                    total.fuel += r.fuel;
                    total.cpu_us += r.cpu_us;
                    total.peak_memory = total.peak_memory.max(r.peak_memory);
                    total.wall_us = total.wall_us.max(r.wall_us);
                    total.output_bytes += r.output_bytes;
                    total.read_bytes += r.read_bytes;
                    total.write_bytes += r.write_bytes;
                    total.files_opened += r.files_opened;
                }
            }
        }
    }
    if let (Some(writes), 0) = (writes, total.exit_code) {
        if let Err(e) = head.commit_run_writes(&subject, &writes, wrote, removed).await {
            return fail(&e);
        }
    }
    // Every node keeps its share's tree now: the plan is kept for the next run.
    if let (Some(kept), true, false) = (kept, fresh, replanned) {
        head.plans.keep(kept);
    }
    let _ = tx.send(frame(Kind::Reply, false, codec::encode(&StoreletEvent::Finished(total)), Bytes::new()));
}

impl Head {
    /// Adopts what a writable run wrote and makes its removals (see the module's
    /// comment), telling promise holders of each changed path. Everything is checked
    /// first, then every file adopted, then all committed in one transaction: a failure
    /// on the way changes nothing (what was adopted goes to the collector).
    async fn commit_run_writes(
        self: &Arc<Self>,
        who: &str,
        writes: &Writes,
        wrote: Vec<Wrote>,
        removed: Vec<String>,
    ) -> Result<(), WireError> {
        let dir = writes.dir.trim_end_matches('/');
        // A name a node reports must be one beneath the run's directory, as it is.
        let abs = |p: &str| -> Result<String, WireError> {
            let joined = format!("{dir}/{p}");
            match locus_cluster::normalise(&joined) {
                Ok(n) if n == joined && !p.is_empty() && !p.starts_with('/') => Ok(n),
                _ => Err(WireError::new(Code::IO, format!("a data node reported {p:?}, not a name in {dir}"))),
            }
        };
        let mut planned: Vec<(Wrote, String, Option<Entry>)> = Vec::new();
        let mut names = std::collections::HashSet::new();
        for w in wrote {
            let path = abs(&w.path)?;
            if !names.insert(path.clone()) {
                return Err(WireError::new(Code::IO, format!("{path}: written by two shares of the run")));
            }
            self.may_change(who, &path, Rights::WRITE)?;
            let existing = self.meta.get(&path).map_err(meta_err)?;
            if existing.as_ref().is_some_and(|e| e.kind != EntryKind::File) {
                return Err(WireError::new(Code::ISDIR, format!("{path}: the run wrote a file where there is none")));
            }
            planned.push((w, path, existing));
        }
        let mut removals = Vec::new();
        for p in &removed {
            let path = abs(p)?;
            self.may_change(who, &path, Rights::DELETE)?;
            removals.push(path);
        }
        let mut entries: Vec<Entry> = Vec::new();
        for (w, path, existing) in planned {
            match self.adopt_written(&w, path, existing).await {
                Ok(e) => entries.push(e),
                Err(e) => {
                    for adopted in &entries {
                        let _ = self.retire(adopted);
                    }
                    return Err(e);
                }
            }
        }
        let gone = match self.meta.commit_run(&entries, &removals) {
            Ok(gone) => gone,
            Err(e) => {
                for adopted in &entries {
                    let _ = self.retire(adopted);
                }
                return Err(meta_err(e));
            }
        };
        for old in &gone {
            self.retire(old)?;
        }
        for path in entries.iter().map(|e| e.path.as_str()).chain(removals.iter().map(String::as_str)) {
            (writes.tell)(path);
        }
        Ok(())
    }

    /// Refuses unless `who` holds `need` in the directory of `path`.
    fn may_change(&self, who: &str, path: &str, need: Rights) -> Result<(), WireError> {
        let parent = locus_cluster::split(path).map_or("/", |(d, _)| d);
        if !self.meta.rights(who, parent).map_err(meta_err)?.contains(need) {
            return Err(WireError::new(
                Code::ACCES,
                format!("{path}: the run changed it without the '{need}' right there; nothing was changed"),
            ));
        }
        Ok(())
    }

    /// Makes a file a share wrote a new version of `path` (on the node that wrote it,
    /// copied to more as the replication asks; a small one moves into the namespace):
    /// the entry to commit.
    async fn adopt_written(
        self: &Arc<Self>,
        w: &Wrote,
        path: String,
        existing: Option<Entry>,
    ) -> Result<Entry, WireError> {
        let object = match &existing {
            Some(e) => e.object,
            None => self.meta.next_id().map_err(meta_err)?,
        };
        let version = self.meta.next_id().map_err(meta_err)?;
        let at = |e: String| WireError::new(Code::IO, format!("{path}: data node {}: {e}", w.node.id));
        if w.node.id == LOCAL_NODE {
            let (objects, token) = (self.objects.clone(), w.token.clone());
            let adopted =
                tokio::task::spawn_blocking(move || crate::cluster::objects::adopt(&objects, &token, object, version));
            adopted.await.map_err(|_| at("adopting task failed".into()))??;
        } else {
            let adopt = ObjectAdopt { token: w.token.clone(), object, version };
            self.writer(&w.node).await?.call(adopt).await.map_err(|e| at(e.to_string()))?;
        }
        let mut entry = Entry {
            path,
            kind: EntryKind::File,
            mode: existing.as_ref().map_or(0o644, |e| e.mode),
            size: w.size,
            mtime_ns: locus_cluster::now_ns(),
            object,
            version,
            content: Content::Nodes(vec![w.node.id]),
            links: 1,
        };
        if w.size <= self.config.inline_max {
            // Small files live in the namespace: the node's copy goes.
            let bytes = self.clone().read(entry.clone(), 0, w.size as u32).await?;
            self.retire(&entry)?;
            entry.content = Content::Inline(bytes.to_vec());
            return Ok(entry);
        }
        let mut holders = vec![w.node.id];
        let others = self.candidates(w.size)?.into_iter().filter(|n| n.id != w.node.id && n.id != LOCAL_NODE);
        for target in others {
            if holders.len() >= self.config.replication.max(1) {
                break;
            }
            match self.fetch_to(&target, &entry, std::slice::from_ref(&w.node.addr)).await {
                Ok(()) => holders.push(target.id),
                Err(why) => {
                    tracing::warn!(path = %entry.path, node = target.id, "a replica of a run's output failed: {why}")
                }
            }
        }
        entry.content = Content::Nodes(holders);
        Ok(entry)
    }
}

/// A run of a node's share, as a head names it: the node in the high half.
fn run_id(node: u64, run: u64) -> u64 {
    node << 32 | (run & 0xffff_ffff)
}

impl Head {
    /// Whether some data node is live.
    pub(crate) fn has_live_node(&self) -> Result<bool, WireError> {
        Ok(self.nodes()?.iter().any(|n| self.is_live(n)))
    }

    /// The live nodes, each with a connection as the head.
    async fn live_writers(&self) -> Result<Vec<(Node, locus_client::Client)>, WireError> {
        let mut out = Vec::new();
        for n in self.nodes()?.into_iter().filter(|n| self.is_live(n)) {
            match self.writer(&n).await {
                Ok(c) => out.push((n, c)),
                Err(e) => tracing::warn!(node = n.id, "not asked for its storelet runs: {e}"),
            }
        }
        Ok(out)
    }

    /// `storelet ps` across the nodes: `who`'s runs (everyone's for an admin).
    pub(crate) async fn runs_ps(&self, who: &str, admin: bool) -> Result<Vec<StoreletRunInfo>, WireError> {
        let mut all = Vec::new();
        for (node, c) in self.live_writers().await? {
            let runs = c.call(StoreletPs {}).await.map_err(|e| WireError::new(e.code(), e.to_string()))?;
            all.extend(
                runs.into_iter()
                    .filter(|r| admin || r.subject == who)
                    .map(|r| StoreletRunInfo { run: run_id(node.id, r.run), ..r }),
            );
        }
        all.sort_by_key(|r| r.run);
        Ok(all)
    }

    /// `storelet cancel` of a run a head listed (see [`run_id`]).
    pub(crate) async fn runs_cancel(&self, who: &str, admin: bool, run: u64) -> Result<(), WireError> {
        let (node, local) = (run >> 32, run & 0xffff_ffff);
        let missing = || WireError::new(Code::NOENT, format!("no storelet run {run} is queued or running"));
        let node = self.nodes()?.into_iter().find(|n| n.id == node).ok_or_else(missing)?;
        let c = self.writer(&node).await?;
        let as_err = |e: locus_client::ClientError| WireError::new(e.code(), e.to_string());
        let listed = c.call(StoreletPs {}).await.map_err(as_err)?;
        match listed.iter().find(|r| r.run == local) {
            Some(r) if admin || r.subject == who => c.call(StoreletCancel { run: local }).await.map_err(as_err),
            Some(_) => Err(WireError::new(Code::PERM, format!("run {run} belongs to another subject"))),
            None => Err(missing()),
        }
    }

    /// `storelet stats` across the nodes: each subject's totals added up, the recent
    /// runs of each node in turn (most recent first within a node).
    pub(crate) async fn runs_stats(
        &self,
        who: &str,
        admin: bool,
        here: StoreletReport,
    ) -> Result<StoreletReport, WireError> {
        let mut report = StoreletReport::default();
        let mut subjects: std::collections::BTreeMap<String, SubjectStoreletStats> = Default::default();
        let mut reports = vec![here];
        for (_, c) in self.live_writers().await? {
            reports.push(c.call(StoreletStats {}).await.map_err(|e| WireError::new(e.code(), e.to_string()))?);
        }
        for r in reports {
            report.compiles += r.compiles;
            report.recent.extend(r.recent.into_iter().filter(|e| admin || e.subject == who));
            for s in r.subjects.into_iter().filter(|s| admin || s.subject == who) {
                let t = subjects.entry(s.subject.clone()).or_insert_with(|| SubjectStoreletStats {
                    subject: s.subject.clone(),
                    budget_us: s.budget_us,
                    ..Default::default()
                });
                t.runs += s.runs;
                t.stopped += s.stopped;
                t.active += s.active;
                t.cpu_us += s.cpu_us;
                t.fuel += s.fuel;
                t.read_bytes += s.read_bytes;
                t.write_bytes += s.write_bytes;
                t.budget_spent_us += s.budget_spent_us;
            }
        }
        report.subjects = subjects.into_values().collect();
        Ok(report)
    }
}
