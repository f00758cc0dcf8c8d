//! Active files on a cluster head (Lerna at cluster scale): looking up a missing name
//! that invokes a registered storelet handler runs it on the data node that holds its
//! input, and its output is kept as a version like a file's, reused while the inputs'
//! versions are unchanged.
//!
//! - **The handlers** are the head's (`STATE/handlers.conf`, as on one server). A command
//!   handler (a native program) is refused: its program would need the directory as a
//!   real one, which no machine of a cluster has; a storelet handler runs instead.
//! - **Rights**: `x` at the root and `r` and `l` on the directory, as on one server. The
//!   run sees the directory's files that the subject may read (as a storelet run does).
//! - **Where**: the live node holding the most of the files the invocation names (its
//!   arguments), then the most of the directory; the run's view is what that node holds
//!   and the directory's small files (kept in the namespace). A named file that only
//!   other nodes hold is absent from the view. A node that cannot be reached is left for
//!   the next.
//! - **Results** are kept in the namespace (`active_results`), under the single server's
//!   key (who, where, which handler, which arguments), with a digest of the directory's
//!   file names and versions when the run started: a lookup while the digest is the same
//!   reuses the result, wherever it was made; any change to the directory's files runs
//!   the handler again. Its bytes are a version on nodes (or inline when small), and the
//!   version it replaces goes to the collector as a file's does. A failed run keeps its
//!   error, readable as the invocation's name with `.err` appended, and fails the lookup.
//! - **One run at a time per result on each head**; heads do not wait for each other's.

use crate::active::Resolved;
use crate::cluster::fanout::{run_share, RunFile};
use crate::cluster::head::LOCAL_NODE;
use crate::cluster::session::HeadSession;
use crate::cluster::{meta_err, Head};
use locus_cluster::{split, ActiveResult, Content, Entry, Kind as EntryKind};
use locus_proto::ops::NodeRun;
use locus_proto::types::{Rights, StoreletEvent};
use locus_proto::{Code, Error as WireError};
use sha2::Digest;
use std::sync::Arc;

/// Results (outputs and error records) kept in the namespace, over all subjects: past
/// it, the least recently made go.
const RESULTS_KEPT: u64 = 10_000;

/// Bytes of a failed run's standard error kept in its error record.
const STDERR_KEPT: usize = 64 << 10;

impl HeadSession {
    /// For a lookup of `path` that failed with `err`: the active file its name invokes
    /// (running the handler if no good result is kept), or `err` when the name invokes no
    /// registered handler. Scripts' sessions run no handlers, as on one server.
    pub(crate) fn active(&self, path: &str, err: WireError) -> Result<Entry, WireError> {
        let run = self.active_run(path, err)?;
        self.head.block(run)
    }

    /// As [`HeadSession::active`], answering at once what can be checked here (rights,
    /// the handler, the directory), and the run as a future to wait for elsewhere.
    pub(crate) fn active_run(
        &self,
        path: &str,
        err: WireError,
    ) -> Result<impl std::future::Future<Output = Result<Entry, WireError>> + Send + 'static, WireError> {
        if err.code != Code::NOENT || !self.inner.can_push() {
            return Err(err);
        }
        let Some((dir, name)) = split(path) else { return Err(err) };
        let who = self.who()?;
        let Some(found) = self.inner.shared.active.resolve(&who, dir, name) else { return Err(err) };
        // As on one server: a name in a directory that is not there is not there.
        match self.head.meta.get(dir).map_err(meta_err)? {
            Some(d) if d.kind == EntryKind::Dir => {}
            Some(_) => return Err(WireError::new(Code::NOTDIR, format!("{dir}: not a directory"))),
            None => return Err(err),
        }
        if !self.head.meta.rights(&who, "/").map_err(meta_err)?.contains(Rights::EXECUTE) {
            return Err(WireError::new(
                Code::ACCES,
                format!("{path}: running a handler needs the 'x' right at the export root"),
            ));
        }
        self.need(dir, Rights::READ.union(Rights::LIST))?;
        if found.command {
            return Err(WireError::new(
                Code::NOTSUP,
                format!(
                    "{path}: handler {} is a command, which runs on a single server only; a cluster head runs \
                     storelet handlers (register it as `NAME storelet MODULE`)",
                    found.inv.handler
                ),
            ));
        }
        let files = self.head.view_files(&who, dir)?;
        Ok(self.head.clone().active_file(who, path.to_string(), found, files))
    }

    /// True when `path` would invoke a registered handler (an active file), which is
    /// read-only whatever it would hold: a write is refused before anything runs.
    pub(crate) fn names_handler(&self, path: &str) -> bool {
        let Ok(who) = self.who() else { return false };
        split(path).is_some_and(|(dir, name)| self.inner.shared.active.resolve(&who, dir, name).is_some())
    }
}

/// A digest of the files a run may see: their names and versions.
fn stamp_of(files: &[RunFile]) -> String {
    let mut sorted: Vec<(&str, u64, u64)> = files.iter().map(|(f, _)| (f.path.as_str(), f.object, f.version)).collect();
    sorted.sort();
    let mut h = sha2::Sha256::new();
    for (path, object, version) in sorted {
        h.update(path.as_bytes());
        h.update([0]);
        h.update(object.to_le_bytes());
        h.update(version.to_le_bytes());
    }
    hex::encode(h.finalize())
}

/// The entry an active file shows: a read-only file whose bytes are the result's.
fn entry_of(path: &str, r: &ActiveResult) -> Entry {
    Entry {
        path: path.to_string(),
        kind: EntryKind::File,
        mode: 0o444,
        size: r.size,
        mtime_ns: r.mtime_ns,
        object: r.object,
        version: r.version,
        content: r.content.clone(),
        links: 1,
    }
}

/// The error record of a failed run, shown as a small read-only file.
fn error_entry(path: &str, r: &ActiveResult) -> Entry {
    let bytes = r.error.as_bytes().to_vec();
    Entry { size: bytes.len() as u64, content: Content::Inline(bytes), ..entry_of(path, r) }
}

impl Head {
    /// The active file `path` (see the module's comment), whose run may see `files`.
    async fn active_file(
        self: Arc<Self>,
        who: String,
        path: String,
        found: Resolved,
        files: Vec<RunFile>,
    ) -> Result<Entry, WireError> {
        let stamp = stamp_of(&files);
        let key = found.key.clone();
        let turn = self.active_runs.lock().entry(key.clone()).or_default().clone();
        let outcome = {
            let _mine = turn.lock().await;
            let kept = self.meta.active_result(&key).map_err(meta_err)?;
            match kept {
                Some(r) if found.inv.error_record => match r.error.is_empty() {
                    true => Err(WireError::new(Code::NOENT, format!("{path}: the last run did not fail"))),
                    false => Ok(error_entry(&path, &r)),
                },
                None if found.inv.error_record => {
                    Err(WireError::new(Code::NOENT, format!("{path}: no run of it has failed")))
                }
                Some(r) if r.stamp == stamp && r.error.is_empty() && self.still_held(&r)? => Ok(entry_of(&path, &r)),
                _ => self.clone().run_handler(&who, &path, &found, files, stamp).await,
            }
        };
        let mut runs = self.active_runs.lock();
        if Arc::strong_count(&turn) == 2 {
            runs.remove(&key);
        }
        outcome
    }

    /// Runs the handler on the best node for it, keeps its output (or its error) and
    /// answers the active file.
    async fn run_handler(
        self: Arc<Self>,
        who: &str,
        path: &str,
        found: &Resolved,
        files: Vec<RunFile>,
        stamp: String,
    ) -> Result<Entry, WireError> {
        let named: Vec<&str> = found.inv.args.iter().map(|a| a.trim_start_matches("./")).collect();
        let mut nodes: Vec<_> = self.nodes()?.into_iter().filter(|n| self.is_live(n)).collect();
        if nodes.is_empty() {
            // No data node: the head runs it itself, over what it keeps.
            nodes.push(Head::here());
        }
        let held = |id: u64, only_named: bool| {
            files.iter().filter(|(f, h)| h.contains(&id) && (!only_named || named.contains(&f.path.as_str()))).count()
        };
        nodes.sort_by_key(|n| std::cmp::Reverse((held(n.id, true), held(n.id, false))));
        let mut last = WireError::new(
            Code::NOTSUP,
            format!("{path}: an active file on a cluster runs on a data node; none is live"),
        );
        for node in nodes {
            let view: Vec<RunFile> =
                files.iter().filter(|(f, h)| f.inline.is_some() || h.contains(&node.id)).cloned().collect();
            let req = NodeRun {
                subject: who.to_string(),
                files: view.iter().map(|(f, _)| f.clone()).collect(),
                args: found.args.clone(),
                env: Vec::new(),
                write: false,
                module: String::new(),
                plan: 0,
            };
            let (_, outcome) = run_share(self.clone(), req, found.wasm.clone(), (node.clone(), view)).await;
            let events = match outcome {
                Ok(events) => events,
                Err((e, true)) => {
                    tracing::warn!(node = node.id, "an active file's run could not run there, trying another: {e}");
                    last = e;
                    continue;
                }
                Err((e, false)) => return self.keep_failure(path, found, stamp, e.to_string()).await,
            };
            let (mut out, mut err, mut exit) = (Vec::new(), Vec::new(), 0);
            for (event, data) in events {
                match event {
                    StoreletEvent::Stdout => out.extend_from_slice(&data),
                    StoreletEvent::Stderr if err.len() < STDERR_KEPT => err.extend_from_slice(&data),
                    StoreletEvent::Finished(r) => exit = r.exit_code,
                    _ => {}
                }
            }
            if exit != 0 {
                let why =
                    format!("handler {} exited with {exit}: {}", found.inv.handler, String::from_utf8_lossy(&err));
                return self.keep_failure(path, found, stamp, why).await;
            }
            return self.keep_output(path, found, stamp, out).await;
        }
        Err(last)
    }

    /// Keeps a run's output as the invocation's result.
    async fn keep_output(&self, path: &str, found: &Resolved, stamp: String, out: Vec<u8>) -> Result<Entry, WireError> {
        // Each run's output is a new file (a new inode), as on one server.
        let object = self.meta.next_id().map_err(meta_err)?;
        let version = self.meta.next_id().map_err(meta_err)?;
        let size = out.len() as u64;
        let content = if size <= self.config.inline_max {
            Content::Inline(out)
        } else {
            let mut name = [0u8; 12];
            getrandom::fill(&mut name).expect("the OS provides randomness");
            let tmp = self.staging.join(hex::encode(name));
            std::fs::write(&tmp, &out).map_err(|e| WireError::io("staging an active file's output", e))?;
            let stored = self.store(&tmp, object, version, size).await;
            let _ = std::fs::remove_file(&tmp);
            Content::Nodes(stored?)
        };
        let result = ActiveResult {
            key: found.key.clone(),
            stamp,
            error: String::new(),
            size,
            mtime_ns: locus_cluster::now_ns(),
            object,
            version,
            content,
        };
        self.replace_result(&result)?;
        Ok(entry_of(path, &result))
    }

    /// Keeps a failed run's error as the invocation's error record, and fails.
    async fn keep_failure(&self, path: &str, found: &Resolved, stamp: String, why: String) -> Result<Entry, WireError> {
        let result = ActiveResult {
            key: found.key.clone(),
            stamp,
            error: why.clone(),
            size: 0,
            mtime_ns: locus_cluster::now_ns(),
            object: 0,
            version: 0,
            content: Content::Inline(Vec::new()),
        };
        self.replace_result(&result)?;
        Err(WireError::new(Code::IO, format!("{path}: {why} (see {path}.err)")))
    }

    /// Keeps `result`, sending the versions it replaces (and the oldest results past
    /// [`RESULTS_KEPT`]) to the collector.
    fn replace_result(&self, result: &ActiveResult) -> Result<(), WireError> {
        for old in self.meta.put_active_result(result, RESULTS_KEPT).map_err(meta_err)? {
            if old.version != 0 {
                self.retire(&entry_of("/", &old))?;
            }
        }
        Ok(())
    }

    /// Whether a live node holds a kept result (a small one is in the namespace): one
    /// whose nodes are all gone is made again, not trusted.
    fn still_held(&self, r: &ActiveResult) -> Result<bool, WireError> {
        let Content::Nodes(ids) = &r.content else { return Ok(true) };
        if ids.contains(&LOCAL_NODE) {
            return Ok(true);
        }
        Ok(self.nodes()?.iter().any(|n| ids.contains(&n.id) && self.is_live(n)))
    }
}
