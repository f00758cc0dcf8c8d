//! A data node's objects: the versions of files a head stored here (one file per
//! version under [`OBJECTS_DIR`] in the export), served to holders of a capability the
//! head signed, stored and dropped only for the head; and the views (hard links under
//! [`VIEWS_DIR`]) that a node's share of a cluster-wide storelet run sees. The plain
//! server's [`Session`] answers these operations through the methods here.

use crate::cluster::checksums;
use crate::cluster::plans::PLAN_NOT_HERE;
use crate::dispatch::Answer;
use crate::dispatch::Reply;
use crate::session::{store, Session};
use crate::transport::{Body, EventFrame};
use bytes::Bytes;
use locus_proto::capability::{Grant, NODE_SUBJECT};
use locus_proto::ops::*;
use locus_proto::types::*;
use locus_proto::{Code, Error as WireError};
use std::sync::Arc;

/// Where a data node keeps objects, under its export.
pub const OBJECTS_DIR: &str = "objects";

/// Reads a node copying a version from another keeps in flight.
const FETCH_WINDOW: usize = 4;

/// The path of one version of an object on a data node.
pub fn object_path(object: u64, version: u64) -> String {
    format!("/{OBJECTS_DIR}/{object}.{version}")
}

/// The directory of a node's objects.
pub(crate) fn objects_dir(shared: &crate::Shared) -> std::path::PathBuf {
    shared.config.root.join(OBJECTS_DIR)
}

/// The file name of a version in [`OBJECTS_DIR`].
pub fn object_name(object: u64, version: u64) -> String {
    format!("{object}.{version}")
}

/// Reads `len` bytes at `offset` of a version this node holds, checked against its
/// checksums (for `object_read` and the node's HTTP door). A damaged version is moved
/// aside and reported to the head, and the read fails with `EIO`.
pub(crate) fn read_version(
    shared: &crate::Shared,
    object: u64,
    version: u64,
    offset: u64,
    len: u64,
) -> Result<Vec<u8>, WireError> {
    let objects = objects_dir(shared);
    let name = object_name(object, version);
    let path = objects.join(&name);
    let file = std::fs::File::open(&path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => WireError::new(Code::NOENT, "that version is gone from this node"),
        _ => WireError::io("object_read", e),
    })?;
    let started = std::time::Instant::now();
    let read = checksums::read_checked(&path, &file, offset, len);
    if let Ok(bytes) = &read {
        // The node's accounts (its heartbeats carry the totals to the head).
        let counters = shared.store.counters();
        counters.file(&format!("{OBJECTS_DIR}/{name}")).read(bytes.len() as u64, started.elapsed());
    }
    read.map_err(|e| {
        if let checksums::CheckError::Mismatch { block } = e {
            tracing::error!(object, version, block, "checksum mismatch: the version is moved aside for repair");
            checksums::quarantine(&objects, &name);
            shared.report_damaged(object, version);
        }
        WireError::new(Code::IO, format!("version {name} on this node: {e}"))
    })
}

/// Copies a version from the first of `location`'s nodes that answers into `objects`,
/// then gives it checksums (each block it read was checked at the source).
async fn fetch(
    objects: &std::path::Path,
    reads: &locus_client::nodes::NodeReads,
    location: &Location,
    rate: u64,
    chunk: u32,
) -> Result<(), WireError> {
    use tokio::io::AsyncWriteExt;
    let cap = &location.capability;
    let name = object_name(cap.object, cap.version);
    let mut salt = [0u8; 8];
    getrandom::fill(&mut salt).expect("the OS provides randomness");
    let tmp = objects.join(format!(".fetch-{name}-{}", hex::encode(salt)));
    let io = |e: std::io::Error| WireError::io("object_fetch", e);
    let mut out = tokio::fs::OpenOptions::new().write(true).create_new(true).open(&tmp).await.map_err(io)?;
    // A holder that failed a read is asked no more in this copy while another remains.
    let mut location = location.clone();
    let started = std::time::Instant::now();
    let (mut next, mut at) = (0u64, 0u64);
    // Reads asked ahead of the one being written, so the source's link never waits for
    // a round trip between pieces: (offset, length, the reply while in flight).
    let mut asked = std::collections::VecDeque::new();
    let copied = async {
        while at < cap.size {
            while asked.len() < FETCH_WINDOW && next < cap.size {
                let want = (cap.size - next).min(chunk as u64) as u32;
                asked.push_back((next, want, reads.read_ahead_from(&location, next, want).await.ok()));
                next += want as u64;
            }
            let (offset, want, pending) = asked.pop_front().expect("a read is asked while bytes remain");
            let answered = match pending {
                Some((addr, p)) => match p.wait_with_data().await {
                    Ok((_, d)) => Some(d),
                    Err(e) => {
                        reads.note(&addr, &e);
                        if location.nodes.len() > 1 {
                            location.nodes.retain(|n| *n != addr);
                        }
                        None
                    }
                },
                None => None,
            };
            // Asked again of every holder in turn when the first did not answer.
            let data = match answered {
                Some(d) => d,
                None => reads
                    .read(&location, offset, want)
                    .await
                    .map_err(|e| WireError::new(Code::IO, format!("no node holding version {name} answered: {e}")))?,
            };
            if data.len() != want as usize {
                return Err(WireError::new(
                    Code::IO,
                    format!("version {name}: a short read at {offset} of {} bytes", cap.size),
                ));
            }
            out.write_all(&data).await.map_err(io)?;
            at += data.len() as u64;
            if rate > 0 {
                let due = std::time::Duration::from_secs_f64(at as f64 / rate as f64);
                tokio::time::sleep(due.saturating_sub(started.elapsed())).await;
            }
        }
        out.sync_all().await.map_err(io)?;
        let file = objects.join(&name);
        // A copy already here (a retried or concurrent fetch) is kept, not replaced.
        let placed = rustix::fs::renameat_with(
            rustix::fs::CWD,
            &tmp,
            rustix::fs::CWD,
            &file,
            rustix::fs::RenameFlags::NOREPLACE,
        );
        match placed {
            Ok(()) => {}
            Err(rustix::io::Errno::EXIST) => {
                let _ = tokio::fs::remove_file(&tmp).await;
            }
            Err(e) => return Err(io(e.into())),
        }
        tokio::task::spawn_blocking(move || checksums::seal(&file, None))
            .await
            .map_err(|_| WireError::new(Code::IO, "checksum task failed"))?
            .map_err(|e| WireError::new(Code::IO, format!("version {name}: {e}")))
    }
    .await;
    if copied.is_err() {
        let _ = tokio::fs::remove_file(&tmp).await;
    }
    copied
}

/// Where a data node keeps, under [`OBJECTS_DIR`], the files writable runs wrote until
/// the head adopts them as versions (`object_adopt`); what is not adopted within
/// [`PENDING_KEPT`] is removed.
pub const PENDING_DIR: &str = "pending";

/// How long a file a writable run wrote waits for its head to adopt it.
const PENDING_KEPT: std::time::Duration = std::time::Duration::from_secs(3600);

/// A regular file's size, modification time and change time (which a run cannot set
/// back): how a writable run's copies are told from what the run wrote.
type Seen = (u64, std::time::SystemTime, (i64, i64));

/// Every regular file under `dir` (never following links), by its path relative to it.
fn regular_files(dir: &std::path::Path) -> std::io::Result<std::collections::BTreeMap<String, Seen>> {
    let mut out = std::collections::BTreeMap::new();
    let mut todo = vec![(dir.to_path_buf(), String::new())];
    while let Some((abs, rel)) = todo.pop() {
        for entry in std::fs::read_dir(&abs)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = if rel.is_empty() { name } else { format!("{rel}/{name}") };
            let meta = entry.path().symlink_metadata()?;
            if meta.is_dir() {
                todo.push((entry.path(), path));
            } else if meta.is_file() {
                use std::os::unix::fs::MetadataExt;
                out.insert(path, (meta.len(), meta.modified()?, (meta.ctime(), meta.ctime_nsec())));
            }
        }
    }
    Ok(out)
}

/// What a writable run changed in its view, as the events that tell the head: each
/// file written (new, or different in size or time from its copy) moved to `pending`
/// under a fresh token, and each file removed.
fn changes(
    view: &std::path::Path,
    before: &std::collections::BTreeMap<String, Seen>,
    pending: &std::path::Path,
) -> std::io::Result<Vec<StoreletEvent>> {
    let after = regular_files(view)?;
    let mut events = Vec::new();
    for (path, seen) in &after {
        if before.get(path) == Some(seen) {
            continue;
        }
        let mut token = [0u8; 16];
        getrandom::fill(&mut token).expect("the OS provides randomness");
        let token = hex::encode(token);
        let (from, to) = (view.join(path), pending.join(&token));
        // The pending file is dated now, whatever the run set (the sweep goes by it).
        match std::fs::rename(&from, &to) {
            Err(e) if e.raw_os_error() == Some(libc_exdev()) => {
                std::fs::copy(&from, &to)?;
                std::fs::remove_file(&from)?;
            }
            other => other?,
        }
        std::fs::File::options().write(true).open(&to)?.set_modified(std::time::SystemTime::now())?;
        events.push(StoreletEvent::Wrote { path: path.clone(), size: seen.0, token });
    }
    for path in before.keys().filter(|p| !after.contains_key(*p)) {
        events.push(StoreletEvent::Removed { path: path.clone() });
    }
    Ok(events)
}

/// `EXDEV`: a rename across file systems (a head's versions may live on another than
/// its export, where its runs' views are).
fn libc_exdev() -> i32 {
    rustix::io::Errno::XDEV.raw_os_error()
}

/// Removes files writable runs wrote that no head adopted within [`PENDING_KEPT`].
fn sweep_pending(pending: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(pending) else { return };
    for entry in entries.flatten() {
        let old = entry.metadata().and_then(|m| m.modified()).ok().and_then(|t| t.elapsed().ok());
        if old.is_some_and(|age| age > PENDING_KEPT) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Makes the file a writable run wrote (kept as `token` in `objects`'s [`PENDING_DIR`])
/// the version `object`.`version` there, never replacing one, and records its block
/// checksums; answers its CRC-32.
pub(crate) fn adopt(objects: &std::path::Path, token: &str, object: u64, version: u64) -> Result<u32, WireError> {
    if token.len() != 32 || !token.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(WireError::new(Code::INVAL, "not a token of a written file"));
    }
    let (from, to) = (objects.join(PENDING_DIR).join(token), objects.join(object_name(object, version)));
    let name = object_name(object, version);
    rustix::fs::renameat_with(rustix::fs::CWD, &from, rustix::fs::CWD, &to, rustix::fs::RenameFlags::NOREPLACE)
        .map_err(|e| WireError::io(&name, std::io::Error::from(e)))?;
    checksums::seal(&to, None).map_err(|e| WireError::new(Code::IO, format!("version {name}: {e}")))?;
    checksums::sealed_crc(&to)
        .map_err(|e| WireError::io(&name, e))?
        .ok_or_else(|| WireError::new(Code::IO, format!("version {name}: not sealed")))
}

/// What a data node answers (`ENOENT`) to a run that left out a module it has not
/// compiled: the head sends it again with the module.
pub const MODULE_NOT_HERE: &str = "the module is not compiled here";

/// Where a data node lays out the files of a writable cluster-wide run, under its export.
pub const VIEWS_DIR: &str = "views";

/// A directory of copies of object versions (and of inline files) under their names in
/// a writable cluster-wide run: what the node's share of the run sees and changes (a
/// write must never reach a version's bytes). Removed when dropped.
struct View {
    /// The directory, relative to the export.
    rel: String,
    abs: std::path::PathBuf,
}

impl View {
    /// The view under the export `root` of `files`, whose versions are in `objects`.
    fn make(root: &std::path::Path, objects: &std::path::Path, files: &[ViewFile]) -> Result<View, WireError> {
        let mut id = [0u8; 8];
        getrandom::fill(&mut id).expect("the OS provides randomness");
        let name = hex::encode(id);
        let abs = root.join(VIEWS_DIR).join(&name);
        let io = WireError::io;
        std::fs::create_dir_all(&abs).map_err(|e| io("view", e))?;
        let view = View { rel: format!("/{VIEWS_DIR}/{name}"), abs };
        for f in files {
            let parts: Vec<&str> = f.path.split('/').filter(|p| !p.is_empty()).collect();
            if parts.is_empty() || parts.iter().any(|p| *p == "." || *p == ".." || p.contains('\0')) {
                return Err(WireError::new(Code::INVAL, format!("{:?}: not a relative path", f.path)));
            }
            let to = parts.iter().fold(view.abs.clone(), |p, part| p.join(part));
            if let Some(parent) = to.parent() {
                std::fs::create_dir_all(parent).map_err(|e| io(&f.path, e))?;
            }
            match &f.inline {
                Some(bytes) => std::fs::write(&to, bytes).map_err(|e| io(&f.path, e))?,
                None => std::fs::copy(objects.join(object_name(f.object, f.version)), &to)
                    .map(drop)
                    .map_err(|e| io(&f.path, e))?,
            }
            // Dated long ago: any write, however soon (timestamps are coarse), shows.
            let long_ago = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1);
            let copied = std::fs::OpenOptions::new().write(true).open(&to).map_err(|e| io(&f.path, e))?;
            copied.set_modified(long_ago).map_err(|e| io(&f.path, e))?;
        }
        Ok(view)
    }
}

impl Drop for View {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.abs);
    }
}

/// Runs `req` over its files, whose versions are in `objects` (a data node's, or a
/// head's own while it has no data node): the run's control and its events. A
/// read-only run sees them as a tree held in memory (`locus_storelet::Tree`), nothing
/// laid out on disk, kept under the run's plan when it names one (and taken from there
/// when the files are left out). A writable run works on copies in a view made for it; when it ends
/// well, what it wrote is moved aside (to `objects`'s [`PENDING_DIR`]) and told before
/// the last event.
pub(crate) fn run_over_view(
    shared: &Arc<crate::Shared>,
    objects: &std::path::Path,
    req: NodeRun,
    data: Bytes,
) -> Result<(Arc<locus_storelet::RunControl>, crate::transport::EventStream), WireError> {
    // A module left out is one compiled here (the caller checked).
    let hash = data.is_empty().then(|| req.module.clone());
    let NodeRun { subject, files, args, env, write, plan, .. } = req;
    let submit = |view: crate::storelet_host::Seen| {
        shared.storelets.submit(crate::storelet_host::Submission {
            subject,
            wasm: data,
            hash,
            args,
            env,
            view,
            write,
            record_inputs: false,
            native: None,
            active_file: None,
        })
    };
    if !write && plan != 0 && files.is_empty() {
        let tree = shared.kept_trees.get(plan);
        let tree = tree.ok_or_else(|| WireError::new(Code::NOENT, format!("{PLAN_NOT_HERE}: {plan}")))?;
        return submit(crate::storelet_host::Seen::Tree(tree));
    }
    if !write {
        let keeps = plan != 0 && shared.kept_trees.may_keep(files.iter().map(|f| (f.object, f.version)));
        let keep = keeps.then(|| {
            let (shared, since) = (shared.clone(), shared.kept_trees.now());
            Box::new(move |tree| shared.kept_trees.keep(plan, tree, since)) as crate::storelet_host::KeepTree
        });
        let files = files
            .into_iter()
            .map(|f| {
                let file = match f.inline {
                    Some(bytes) => locus_storelet::TreeFile::Bytes(bytes.into()),
                    None => locus_storelet::TreeFile::Host(objects.join(object_name(f.object, f.version))),
                };
                (f.path, file)
            })
            .collect();
        return submit(crate::storelet_host::Seen::Files(files, keep));
    }
    let view = View::make(&shared.config.root, objects, &files)?;
    let pending = objects.join(PENDING_DIR);
    std::fs::create_dir_all(&pending).map_err(|e| WireError::io("pending", e))?;
    sweep_pending(&pending);
    let before = regular_files(&view.abs).map_err(|e| WireError::io("view", e))?;
    let dir = store(shared.store.code_view(crate::config::ADMIN_SUBJECT, &view.rel, true))?;
    let (control, mut events) = submit(crate::storelet_host::Seen::Dir(dir))?;
    // The view goes once the run's last event has been handed on.
    let (tx, frames) = tokio::sync::mpsc::unbounded_channel();
    let queued = events.queued.clone();
    tokio::spawn(async move {
        let mut view = Some(view);
        while let Some(frame) = events.frames.recv().await {
            if !frame.more {
                if let (locus_proto::frame::Kind::Reply, Some(v)) = (frame.kind, view.as_ref()) {
                    let (abs, before, pending) = (v.abs.clone(), before.clone(), pending.clone());
                    let found = tokio::task::spawn_blocking(move || changes(&abs, &before, &pending)).await;
                    let told = match found {
                        Ok(Ok(changed)) => changed.iter().all(|event| {
                            let meta = locus_proto::codec::encode(event);
                            tx.send(EventFrame {
                                kind: frame.kind,
                                more: true,
                                meta,
                                data: Bytes::new(),
                                mergeable: false,
                            })
                            .is_ok()
                        }),
                        _ => {
                            let e = WireError::new(Code::IO, "the run's writes could not be gathered");
                            let meta = locus_proto::codec::encode(&e);
                            let kind = locus_proto::frame::Kind::Error;
                            let _ =
                                tx.send(EventFrame { kind, more: false, meta, data: Bytes::new(), mergeable: false });
                            return;
                        }
                    };
                    if !told {
                        return;
                    }
                }
                view.take();
            }
            if tx.send(frame).is_err() {
                break;
            }
        }
    });
    Ok((control, crate::transport::EventStream { frames, queued }))
}

impl Session {
    /// The cluster's keys, on a data node that has joined its head.
    pub(crate) fn node_key(&self) -> Result<Arc<locus_proto::capability::KeyRing>, WireError> {
        self.shared
            .node_key()
            .ok_or_else(|| WireError::new(Code::NOTSUP, "this server is not a data node that has joined a head"))
    }

    /// Checks that the caller is the cluster's head.
    pub(crate) fn check_from_head(&self) -> Result<(), WireError> {
        match self.who()? {
            locus_proto::capability::HEAD_SUBJECT => Ok(()),
            _ => Err(WireError::new(Code::ACCES, "only the cluster's head stores and drops objects")),
        }
    }

    /// `object_read`: a version of an object, to a holder of the head's capability for it.
    /// Every block the read touches is checked against the version's checksums; a
    /// damaged version is moved aside and reported, and the read fails (`EIO`), so the
    /// client goes on at a replica.
    pub(crate) fn serve_object_read(&mut self, req: ObjectRead, _: Bytes) -> Reply<()> {
        let key = self.node_key()?;
        let cap = &req.capability;
        if let Err(why) = key.verify(cap, self.who()?, locus_proto::capability::now()) {
            tracing::warn!(
                subject = self.who()?,
                object = cap.object,
                version = cap.version,
                ?why,
                "capability refused"
            );
            return Err(WireError::new(Code::ACCES, format!("capability refused: {why:?}")));
        }
        let len = (req.len.min(self.shared.config.limits.max_data) as u64).min(cap.size.saturating_sub(req.offset));
        let bytes = read_version(&self.shared, cap.object, cap.version, req.offset, len)?;
        Ok(Answer::with_body((), Body::Bytes(bytes.into())))
    }

    /// `object_put`: the head stores a version of an object here (durably).
    pub(crate) fn store_object(&mut self, req: ObjectPut, data: Bytes) -> Reply<Attr> {
        self.node_key()?;
        self.check_from_head()?;
        let put = Put { path: object_path(req.object, req.version), mode: 0o600 };
        self.start_put(crate::config::ADMIN_SUBJECT, put, data, true, None)
    }

    /// `object_write`: a client stores a new version here under the head's write
    /// capability (a third-party write): exactly the size it grants, durably, and never
    /// over a version already here. The head checks and commits it (`object_seal`,
    /// then the namespace) when the client asks it to.
    pub(crate) fn write_object(&mut self, req: ObjectWrite, data: Bytes) -> Reply<Attr> {
        let key = self.node_key()?;
        let cap = &req.capability;
        if let Err(why) = key.verify_for(Grant::Write(&req.nodes), cap, self.who()?, locus_proto::capability::now()) {
            return Err(WireError::new(Code::ACCES, format!("write capability refused: {why:?}")));
        }
        // Only the nodes the head chose take the version (so only they hold it pending).
        if !self.shared.node_id().is_some_and(|id| req.nodes.contains(&id)) {
            return Err(WireError::new(Code::ACCES, "write capability refused: it is for other data nodes"));
        }
        let file = objects_dir(&self.shared).join(object_name(cap.object, cap.version));
        if file.exists() || checksums::sidecar(&file).exists() {
            return Err(WireError::new(Code::EXIST, format!("version {}.{} is already here", cap.object, cap.version)));
        }
        let put = Put { path: object_path(cap.object, cap.version), mode: 0o600 };
        let size = cap.size;
        self.start_put(crate::config::ADMIN_SUBJECT, put, data, true, Some(size))
    }

    /// `object_drop`: the head drops a version of an object it no longer needs.
    pub(crate) fn drop_object(&mut self, req: ObjectDrop, _: Bytes) -> Reply<()> {
        self.node_key()?;
        self.check_from_head()?;
        let name = object_name(req.object, req.version);
        self.shared.store.counters().removed(&format!("{OBJECTS_DIR}/{name}"));
        // A kept tree could name it.
        self.shared.kept_trees.dropped();
        let file = objects_dir(&self.shared).join(name);
        for path in [checksums::sidecar(&file), file] {
            match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(WireError::io("object_drop", e)),
                _ => {}
            }
        }
        Ok(().into())
    }

    /// `object_seal`: checks a version the head just stored here against the CRC-32 the
    /// head computed of what it sent, and records its block checksums. An unsealed
    /// version that differs is removed (it was never committed); a sealed one is only
    /// compared, never removed. The reading runs off the connection's thread.
    pub(crate) fn seal_object(&mut self, req: ObjectSeal, _: Bytes) -> Reply<()> {
        self.node_key()?;
        self.check_from_head()?;
        let file = objects_dir(&self.shared).join(object_name(req.object, req.version));
        Ok(Answer::later(Box::pin(async move {
            let name = format!("{}.{}", req.object, req.version);
            tokio::task::spawn_blocking(move || {
                let sealed = checksums::sealed_crc(&file).map_err(|e| WireError::io(&name, e))?.is_some();
                checksums::seal(&file, Some(req.crc)).map_err(|e| {
                    if !sealed {
                        let _ = std::fs::remove_file(&file);
                    }
                    WireError::new(Code::IO, format!("version {name}: {e}"))
                })
            })
            .await
            .map_err(|_| WireError::new(Code::IO, "checksum task failed"))??;
            Ok(Answer::from(()).encode())
        })))
    }

    /// `object_fetch`: copies a version from another node (healing a lost or damaged
    /// replica, or moving one off a node being drained), at most `rate` bytes a second.
    pub(crate) fn fetch_object(&mut self, req: ObjectFetch, _: Bytes) -> Reply<()> {
        let key = self.node_key()?;
        self.check_from_head()?;
        let token = key.node_tokens(NODE_SUBJECT, locus_proto::capability::now()).remove(0);
        let location = Location { nodes: req.from, capability: req.capability, node_token: token };
        let objects = objects_dir(&self.shared);
        let max = self.shared.config.limits.max_data.min(1 << 20);
        let reads = locus_client::nodes::NodeReads::default();
        if let Some(ca) = self.shared.cluster_ca() {
            reads.use_tls(ca);
        }
        Ok(Answer::later(Box::pin(async move {
            fetch(&objects, &reads, &location, req.rate, max).await?;
            Ok(Answer::from(()).encode())
        })))
    }

    /// `node_run`: this node's share of a cluster-wide storelet run, over the files the
    /// head named (see [`run_over_view`]); a module left out must be compiled here
    /// ([`MODULE_NOT_HERE`] otherwise), and files left out kept under the run's plan
    /// ([`PLAN_NOT_HERE`] otherwise, see `cluster::plans`). A writable run works on copies; when it ends well, what it
    /// wrote is moved aside for the head to adopt and told before the last event.
    pub(crate) fn run_share(&mut self, req: NodeRun, data: Bytes) -> Reply<StoreletEvent> {
        self.node_key()?;
        self.check_from_head()?;
        // The tree first: a head that must send the files again sends the module with them.
        if !req.write && req.plan != 0 && req.files.is_empty() && self.shared.kept_trees.get(req.plan).is_none() {
            return Err(WireError::new(Code::NOENT, format!("{PLAN_NOT_HERE}: {}", req.plan)));
        }
        if data.is_empty() && !self.shared.storelets.has_module(&req.module) {
            return Err(WireError::new(Code::NOENT, format!("{MODULE_NOT_HERE}: {}", req.module)));
        }
        let (control, stream) = run_over_view(&self.shared, &objects_dir(&self.shared), req, data)?;
        self.storelet_runs.retain(|c| Arc::strong_count(c) > 1);
        self.storelet_runs.push(control);
        Ok(Answer::events(stream))
    }

    /// `object_adopt`: makes a file a writable run wrote here the version the head
    /// named, and records its block checksums. The reading runs off the connection's
    /// thread.
    pub(crate) fn adopt_object(&mut self, req: ObjectAdopt, _: Bytes) -> Reply<u32> {
        self.node_key()?;
        self.check_from_head()?;
        let objects = objects_dir(&self.shared);
        Ok(Answer::later(Box::pin(async move {
            let crc = tokio::task::spawn_blocking(move || adopt(&objects, &req.token, req.object, req.version))
                .await
                .map_err(|_| WireError::new(Code::IO, "adopting task failed"))??;
            Ok(Answer::from(crc).encode())
        })))
    }
}
