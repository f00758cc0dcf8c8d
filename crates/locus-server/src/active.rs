//! Active files (Lerna): looking up a missing name that invokes a registered handler
//! (see `locus_proto::active` for the name forms) runs the handler at the server, and
//! its output becomes the file.
//!
//! - **Handlers** are registered by the administrator in `STATE/handlers.conf`, one per
//!   line: `NAME storelet MODULE [ARG...]` (the module's path relative to the state
//!   directory, or absolute; the arguments go before the invocation's own), or
//!   `NAME command /PROGRAM [ARG...]` for a native program, run confined under the same
//!   limits (`locus_storelet::native`). The file is
//!   read again whenever it changes (and on SIGHUP). Nothing unregistered ever runs: a
//!   name invoking an unknown handler is plain `ENOENT`.
//! - **A run** is a storelet run on the server's storelet workers, under the storelet
//!   limits and the requesting subject's budgets, with the directory where the name was
//!   asked preopened read-only as `/`. It needs what a storelet run needs: `x` at the
//!   export root and `r` and `l` on that directory.
//! - **Results** live in the result cache, `STATE/active/KEY.out`, where KEY hashes the
//!   subject, the directory, the handler's definition and the arguments; they never
//!   appear in listings. While a run goes, its output grows in `KEY.part`; readers follow
//!   it as it grows. A run that succeeds leaves `KEY.out` and `KEY.inputs` (every file
//!   it opened or looked for, with its identity then); the result is reused while each
//!   input is unchanged. A run that fails leaves no result and `KEY.err`, readable as the
//!   invocation's name with `.err` appended. Concurrent openers share one run.

use crate::storelet_host::{run_error, Submission, Watcher};
use crate::Shared;
use bytes::Bytes;
use locus_proto::active::{self, Invocation};
use locus_proto::types::{Attr, HandlerInfo, StoreletResult, S_IFREG};
use locus_proto::{Code, Error as WireError};
use locus_store::OpenFile;
use locus_storelet::{Inputs, RunOutcome, Stamp, StoreletError, Stream};
use parking_lot::Mutex;
use rustix::fs::{Mode, OFlags, ResolveFlags};
use sha2::Digest;
use std::collections::HashMap;
use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::sync::watch;

/// A handler invocation resolved for a cluster head (see [`ActiveFiles::resolve`]).
#[cfg_attr(not(feature = "cluster"), allow(dead_code))]
pub(crate) struct Resolved {
    pub(crate) inv: Invocation,
    /// The module (empty for a command handler, which a head does not run).
    pub(crate) wasm: Bytes,
    pub(crate) command: bool,
    /// The handler's arguments, then the invocation's.
    pub(crate) args: Vec<String>,
    /// The result's cache key (who, where, what and with what).
    pub(crate) key: String,
}

/// The handler registry in the state directory.
pub const HANDLERS_FILE: &str = "handlers.conf";
/// The result cache in the state directory.
pub const RESULTS_DIR: &str = "active";
/// Bytes of a handler's stderr kept for its error record.
const STDERR_KEPT: usize = 64 << 10;

/// One registered handler.
struct Handler {
    /// The WebAssembly module (empty for a command).
    wasm: Bytes,
    /// The native program of a command handler.
    program: Option<PathBuf>,
    /// The SHA-256 of the module or program.
    module: String,
    args: Vec<String>,
}

/// The registry as last read, and what the file looked like then.
#[derive(Default)]
struct Registry {
    seen: Option<Stamp>,
    handlers: Arc<HashMap<String, Arc<Handler>>>,
}

/// How far a run has got.
#[derive(Clone, Debug, Default)]
pub struct Progress {
    /// Output bytes written so far.
    pub written: u64,
    /// Set when the run ends: whether it left a result.
    pub end: Option<Result<(), WireError>>,
}

/// A run in progress, shared by everyone who opened its name meanwhile.
pub struct Run {
    progress: watch::Sender<Progress>,
    /// The output as it grows, for readers (the name it has changes when it is done).
    output: File,
}

impl Run {
    /// Waits until `want` bytes are written or the run ended; says how far it got.
    pub async fn wait(&self, want: u64) -> Progress {
        let mut rx = self.progress.subscribe();
        let p = rx.wait_for(|p| p.written >= want || p.end.is_some()).await.map(|p| p.clone());
        p.unwrap_or_else(|_| Progress { written: 0, end: Some(Err(gone())) })
    }

    /// The progress now.
    pub fn progress(&self) -> Progress {
        self.progress.borrow().clone()
    }

    /// A read-only handle on the output, which stays valid when the result is kept.
    pub fn reader(&self, rel: String, io: locus_store::FileIo) -> Result<OpenFile, WireError> {
        let file = self.output.try_clone().map_err(|e| WireError::io("open result", e))?;
        Ok(OpenFile::new(file, true, false, false, io, rel))
    }
}

fn gone() -> WireError {
    WireError::new(Code::IO, "the handler's run went away")
}

/// What a lookup of a missing name found.
pub enum Found {
    /// A finished result, or an error record.
    Ready(OpenFile),
    /// A run in progress: the handle reads its output as it grows.
    Running(OpenFile, Arc<Run>),
}

/// The active files of one server: its handlers, result cache and runs in progress.
pub struct ActiveFiles {
    state_dir: PathBuf,
    results: PathBuf,
    /// Bytes the result cache may hold.
    cache_bytes: u64,
    registry: Mutex<Registry>,
    runs: Arc<Mutex<HashMap<String, Arc<Run>>>>,
}

impl ActiveFiles {
    /// The active files kept in `state_dir` (the result cache is created there, and holds
    /// at most `cache_bytes`).
    pub fn new(state_dir: &Path, cache_bytes: u64) -> std::io::Result<ActiveFiles> {
        let results = state_dir.join(RESULTS_DIR);
        std::fs::create_dir_all(&results)?;
        // Outputs of runs cut short by a crash are not results.
        for entry in std::fs::read_dir(&results)?.flatten() {
            if entry.path().extension().is_some_and(|e| e == "part") {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        let active = ActiveFiles {
            state_dir: state_dir.to_path_buf(),
            results,
            cache_bytes,
            registry: Mutex::new(Registry::default()),
            runs: Arc::default(),
        };
        active.handlers();
        Ok(active)
    }

    /// Reads the registry again whatever it looked like (SIGHUP).
    pub fn reload(&self) {
        self.registry.lock().seen = None;
        self.handlers();
    }

    /// The handlers, read again first if the file changed.
    fn handlers(&self) -> Arc<HashMap<String, Arc<Handler>>> {
        let path = self.state_dir.join(HANDLERS_FILE);
        let now = rustix::fs::stat(&path).ok().map(|st| Stamp::of(&st));
        let mut registry = self.registry.lock();
        if registry.seen.is_some() && registry.seen == now {
            return registry.handlers.clone();
        }
        registry.seen = now;
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        registry.handlers = Arc::new(self.parse_registry(&text, &path));
        registry.handlers.clone()
    }

    /// Parses `handlers.conf`; a bad line is logged and skipped.
    fn parse_registry(&self, text: &str, path: &Path) -> HashMap<String, Arc<Handler>> {
        let mut handlers = HashMap::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            match self.parse_line(line) {
                Ok((name, h)) => {
                    handlers.insert(name, Arc::new(h));
                }
                Err(why) => tracing::warn!("{}:{}: {why}; line ignored", path.display(), n + 1),
            }
        }
        handlers
    }

    fn parse_line(&self, line: &str) -> Result<(String, Handler), String> {
        let words: Vec<&str> = line.split_whitespace().collect();
        let [name, kind, module, args @ ..] = words.as_slice() else {
            return Err("expected NAME storelet MODULE [ARG...] or NAME command PROGRAM [ARG...]".into());
        };
        if !active::valid_handler_name(name) {
            return Err(format!("{name:?} is not a handler name (letters, digits, '_', '-', '.')"));
        }
        let program = match *kind {
            "storelet" => None,
            // A native program: the administrator's explicit choice, confined when it runs.
            "command" if Path::new(module).is_absolute() => Some(PathBuf::from(module)),
            "command" => return Err(format!("a command handler names its program by absolute path, not {module:?}")),
            other => return Err(format!("unknown handler kind {other:?} (storelet or command)")),
        };
        let path = self.state_dir.join(module);
        let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let module = hex::encode(sha2::Sha256::digest(&bytes));
        let wasm = if program.is_some() { Bytes::new() } else { bytes.into() };
        let args = args.iter().map(|a| a.to_string()).collect();
        Ok((name.to_string(), Handler { wasm, program, module, args }))
    }

    /// The registered handlers, by name.
    pub fn list(&self) -> Vec<HandlerInfo> {
        let mut list: Vec<HandlerInfo> = self
            .handlers()
            .iter()
            .map(|(name, h)| HandlerInfo {
                name: name.clone(),
                kind: if h.program.is_some() { "command" } else { "storelet" }.to_string(),
                module: h.module.clone(),
                args: h.args.clone(),
            })
            .collect();
        list.sort_by(|a, b| a.name.cmp(&b.name));
        list
    }

    /// The invocation file name `name` in directory `dir` makes, if it names a
    /// registered handler: what a cluster head needs to run it on a data node.
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    pub(crate) fn resolve(&self, who: &str, dir: &str, name: &str) -> Option<Resolved> {
        let inv = active::parse(name)?;
        let handler = self.handlers().get(&inv.handler).cloned()?;
        let key = key_of(who, dir.trim_matches('/'), &handler, &inv);
        let mut args = handler.args.clone();
        args.extend(inv.args.iter().cloned());
        Some(Resolved { command: handler.program.is_some(), wasm: handler.wasm.clone(), args, key, inv })
    }

    /// For a lookup of `path` that found nothing: the active file its name invokes, or
    /// `None` when it invokes no registered handler (the caller then answers `ENOENT`).
    pub fn find(&self, shared: &Shared, who: &str, path: &str) -> Result<Option<Found>, WireError> {
        let (dir, name) = match path.trim_end_matches('/').rsplit_once('/') {
            Some((dir, name)) => (dir, name),
            None => ("", path),
        };
        let Some(inv) = active::parse(name) else { return Ok(None) };
        let handlers = self.handlers();
        let Some(handler) = handlers.get(&inv.handler).cloned() else { return Ok(None) };
        let dir_rel = normalize(dir).ok_or_else(|| WireError::new(Code::NOENT, format!("{path}: no such file")))?;
        // Running code needs `x` at the root, and the handler reads the directory.
        if !shared.store.rights(who, "/")?.contains(locus_proto::Rights::EXECUTE) {
            return Err(WireError::new(
                Code::ACCES,
                format!("{path}: running a handler needs the 'x' right at the export root"),
            ));
        }
        if handler.program.is_some() {
            if let Some(bad) = inv.args.iter().find(|a| escapes(a)) {
                return Err(WireError::new(
                    Code::INVAL,
                    format!(
                        "{path}: argument {bad:?} names a path outside the directory; a command handler sees only it"
                    ),
                ));
            }
        }
        let workdir = shared.store.open_workdir(who, &dir_rel, false)?;
        let key = key_of(who, &dir_rel, &handler, &inv);
        let io = shared.store.counters().file(path.trim_start_matches('/'));
        let rel = path.trim_start_matches('/').to_string();
        let ready = |file: File| OpenFile::new(file, true, false, false, io.clone(), rel.clone());
        if inv.error_record {
            return Ok(File::open(self.results.join(format!("{key}.err"))).ok().map(|f| Found::Ready(ready(f))));
        }
        let mut runs = self.runs.lock();
        if let Some(run) = runs.get(&key) {
            return Ok(Some(Found::Running(run.reader(rel.clone(), io.clone())?, run.clone())));
        }
        if self.still_good(&key, &workdir) {
            if let Ok(f) = File::open(self.results.join(format!("{key}.out"))) {
                // Its modification time says when it was last used, for eviction.
                let _ = f.set_modified(std::time::SystemTime::now());
                return Ok(Some(Found::Ready(ready(f))));
            }
        }
        // What the run sees: the directory less what `who` may not read.
        let view = shared.store.code_view(who, &dir_rel, false)?;
        let part = self.results.join(format!("{key}.part"));
        let output = File::create(&part).map_err(|e| WireError::io("create result", e))?;
        let reader = File::open(&part).map_err(|e| WireError::io("open result", e))?;
        let run = Arc::new(Run { progress: watch::Sender::new(Progress::default()), output: reader });
        runs.insert(key.clone(), run.clone());
        drop(runs);
        let mut args = handler.args.clone();
        args.extend(inv.args.iter().cloned());
        let submission = Submission {
            subject: who.to_string(),
            wasm: handler.wasm.clone(),
            hash: None,
            args,
            env: Vec::new(),
            view: crate::storelet_host::Seen::Dir(view),
            write: false,
            record_inputs: true,
            native: handler.program.clone(),
            active_file: Some(path.to_string()),
        };
        self.evict(&runs_in_progress(&self.runs));
        let watcher = ActiveWatcher {
            name: format!("{}@{}", inv.handler, inv.args.join(",")),
            key: key.clone(),
            results: self.results.clone(),
            output: Mutex::new(Some(output)),
            failed_write: Mutex::new(None),
            stderr: Mutex::new(Vec::new()),
            run: run.clone(),
            runs: self.runs.clone(),
        };
        if let Err(e) = shared.storelets.submit_watched(submission, |_| Box::new(watcher)) {
            self.runs.lock().remove(&key);
            let _ = std::fs::remove_file(&part);
            // Anyone who joined meanwhile learns it too.
            run.progress.send_modify(|p| p.end = Some(Err(e.clone())));
            return Err(e);
        }
        tracing::debug!(subject = who, handler = %inv.handler, dir = %dir_rel, "active file run started");
        Ok(Some(Found::Running(run.reader(rel, io)?, run)))
    }

    /// Removes the least recently used results while the cache holds more than its
    /// bound (never those of runs in progress). Readers that have one open keep it.
    fn evict(&self, running: &std::collections::HashSet<String>) {
        let Ok(dir) = std::fs::read_dir(&self.results) else { return };
        let mut outs: Vec<(std::time::SystemTime, u64, String)> = Vec::new();
        let mut total = 0u64;
        for entry in dir.flatten() {
            let Ok(meta) = entry.metadata() else { continue };
            total += meta.len();
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(key) = name.strip_suffix(".out").filter(|k| !running.contains(*k)) {
                outs.push((meta.modified().unwrap_or(std::time::UNIX_EPOCH), meta.len(), key.to_string()));
            }
        }
        outs.sort();
        for (_, size, key) in outs {
            if total <= self.cache_bytes {
                break;
            }
            for ext in ["out", "inputs"] {
                let _ = std::fs::remove_file(self.results.join(format!("{key}.{ext}")));
            }
            total = total.saturating_sub(size);
        }
    }

    /// True when the result `key` was kept and every input it read is as it was then.
    fn still_good(&self, key: &str, workdir: &OwnedFd) -> bool {
        let Ok(text) = std::fs::read_to_string(self.results.join(format!("{key}.inputs"))) else { return false };
        let Ok(files) = serde_json::from_str::<Vec<(String, Option<Stamp>)>>(&text) else { return false };
        files.iter().all(|(path, stamp)| {
            let flags = OFlags::PATH | OFlags::CLOEXEC;
            let now = rustix::fs::openat2(workdir.as_fd(), path.as_str(), flags, Mode::empty(), ResolveFlags::BENEATH)
                .and_then(|fd| rustix::fs::fstat(&fd))
                .ok()
                .map(|st| Stamp::of(&st));
            now == *stamp
        })
    }
}

/// The keys of the runs in progress.
fn runs_in_progress(runs: &Mutex<HashMap<String, Arc<Run>>>) -> std::collections::HashSet<String> {
    runs.lock().keys().cloned().collect()
}

/// Attributes of an active file: its output's, shown as a read-only regular file.
pub fn attr(file: &OpenFile) -> Result<Attr, WireError> {
    let mut a = file.stat()?;
    a.mode = S_IFREG | 0o444;
    a.nlink = 1;
    Ok(a)
}

/// True when a command handler's argument names a path outside the run's directory: an
/// absolute path, or one that climbs (`..`), alone or as an option's value (`-o/x`,
/// `--in=../x`). The program sees only its view anyway; this refuses the attempt plainly.
fn escapes(arg: &str) -> bool {
    let climbs = |p: &str| p.starts_with('/') || p.split('/').any(|c| c == "..");
    let value = arg.split_once('=').map(|(_, v)| v);
    climbs(arg)
        || value.is_some_and(climbs)
        || arg.starts_with('-') && climbs(arg.trim_start_matches('-').get(1..).unwrap_or(""))
}

/// A directory path relative to the root, or `None` if it climbs (`..`).
fn normalize(dir: &str) -> Option<String> {
    let parts: Vec<&str> = dir.split('/').filter(|c| !c.is_empty() && *c != ".").collect();
    (!parts.contains(&"..")).then(|| parts.join("/"))
}

/// The cache key of an invocation: who asked, where, what runs and with what.
fn key_of(who: &str, dir: &str, handler: &Handler, inv: &Invocation) -> String {
    let mut h = sha2::Sha256::new();
    for part in [who, dir, &handler.module].into_iter().chain(handler.args.iter().map(String::as_str)) {
        h.update(part.as_bytes());
        h.update([0]);
    }
    h.update([1]);
    for a in &inv.args {
        h.update(a.as_bytes());
        h.update([0]);
    }
    hex::encode(h.finalize())
}

/// Writes a run's output into its result, and keeps or discards it when the run ends.
struct ActiveWatcher {
    name: String,
    key: String,
    results: PathBuf,
    output: Mutex<Option<File>>,
    failed_write: Mutex<Option<std::io::Error>>,
    stderr: Mutex<Vec<u8>>,
    run: Arc<Run>,
    runs: Arc<Mutex<HashMap<String, Arc<Run>>>>,
}

impl ActiveWatcher {
    fn path(&self, ext: &str) -> PathBuf {
        self.results.join(format!("{}.{ext}", self.key))
    }

    /// Makes the output the kept result; false when something failed on the way.
    fn keep(&self, inputs: &Option<Inputs>) -> Result<(), WireError> {
        if let Some(e) = self.failed_write.lock().take() {
            return Err(WireError::io("write result", e));
        }
        let file = self.output.lock().take().ok_or_else(gone)?;
        file.sync_data().map_err(|e| WireError::io("sync result", e))?;
        let _ = std::fs::remove_file(self.path("inputs"));
        std::fs::rename(self.path("part"), self.path("out")).map_err(|e| WireError::io("keep result", e))?;
        let _ = std::fs::remove_file(self.path("err"));
        // Reused only when every input is known.
        if let Some(inputs) = inputs.as_ref().filter(|i| i.complete) {
            let json = serde_json::to_string(&inputs.files).expect("inputs serialize");
            let tmp = self.path("inputs.tmp");
            if std::fs::write(&tmp, json).and_then(|_| std::fs::rename(&tmp, self.path("inputs"))).is_err() {
                let _ = std::fs::remove_file(&tmp);
            }
        }
        Ok(())
    }

    /// Records why the run left no result, for `NAME.err`.
    fn record_failure(&self, why: &WireError, result: &StoreletResult) {
        let _ = std::fs::remove_file(self.path("part"));
        let mut text = format!(
            "{}: {} ({})\nused: {} fuel, {} us CPU, {} bytes of memory, {} us wall, {} bytes read, {} files opened, {} bytes of output\n",
            self.name,
            why.message,
            why.code.name(),
            result.fuel,
            result.cpu_us,
            result.peak_memory,
            result.wall_us,
            result.read_bytes,
            result.files_opened,
            result.output_bytes
        );
        let stderr = self.stderr.lock();
        if !stderr.is_empty() {
            text.push_str("--- stderr ---\n");
            text.push_str(&String::from_utf8_lossy(&stderr));
        }
        let tmp = self.path("err.tmp");
        if std::fs::write(&tmp, text).and_then(|_| std::fs::rename(&tmp, self.path("err"))).is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }
}

/// The error an opener gets for a handler that exited with `code`, by the convention of
/// `sysexits.h`: 64 (usage) and 65 (data) are `EINVAL`, 66 (no input) `ENOENT`, 75
/// (try again) `EAGAIN`, 77 (no permission) `EACCES`; any other status is `EIO`.
fn exit_error(name: &str, code: i32) -> WireError {
    let errno = match code {
        64 | 65 => Code::INVAL,
        66 => Code::NOENT,
        75 => Code::AGAIN,
        77 => Code::ACCES,
        _ => Code::IO,
    };
    WireError::new(errno, format!("handler {name} exited with status {code}; its .err file says why"))
}

impl Watcher for ActiveWatcher {
    fn started(&self, _run: u64, _module: &str) {}

    fn output(&self, stream: Stream, bytes: &[u8]) -> bool {
        if stream == Stream::Stderr {
            let mut e = self.stderr.lock();
            let room = STDERR_KEPT.saturating_sub(e.len());
            e.extend_from_slice(&bytes[..bytes.len().min(room)]);
            return true;
        }
        let out = self.output.lock();
        let Some(file) = out.as_ref() else { return false };
        let at = self.run.progress.borrow().written;
        if let Err(e) = file.write_all_at(bytes, at) {
            *self.failed_write.lock() = Some(e);
            return false;
        }
        self.run.progress.send_modify(|p| p.written += bytes.len() as u64);
        true
    }

    fn finished(self: Box<Self>, result: &StoreletResult, outcome: &Result<RunOutcome, StoreletError>) {
        let end = match outcome {
            Ok(out) if out.exit_code == 0 => self.keep(&out.inputs),
            Ok(out) => Err(exit_error(&self.name, out.exit_code)),
            Err(e) => Err(run_error(e)),
        };
        if let Err(why) = &end {
            self.record_failure(why, result);
        }
        {
            let mut runs = self.runs.lock();
            if runs.get(&self.key).is_some_and(|r| Arc::ptr_eq(r, &self.run)) {
                runs.remove(&self.key);
            }
        }
        self.run.progress.send_modify(|p| p.end = Some(end));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_recently_used_results_go_first_when_the_cache_is_full() {
        let state = tempfile::tempdir().unwrap();
        let active = ActiveFiles::new(state.path(), 250).unwrap();
        let results = state.path().join(RESULTS_DIR);
        let epoch = std::time::UNIX_EPOCH;
        for (key, age) in [("old", 10), ("mid", 20), ("new", 30), ("busy", 0)] {
            let f = File::create(results.join(format!("{key}.out"))).unwrap();
            f.set_len(100).unwrap();
            f.set_modified(epoch + std::time::Duration::from_secs(age)).unwrap();
            std::fs::write(results.join(format!("{key}.inputs")), "[]").unwrap();
        }
        let running: std::collections::HashSet<String> = ["busy".to_string()].into();
        active.evict(&running);
        let left: std::collections::BTreeSet<String> = std::fs::read_dir(&results)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        let expect: std::collections::BTreeSet<String> =
            ["busy.out", "busy.inputs", "new.out", "new.inputs"].iter().map(|s| s.to_string()).collect();
        assert_eq!(left, expect, "oldest first, a run's own result kept");
    }
}
