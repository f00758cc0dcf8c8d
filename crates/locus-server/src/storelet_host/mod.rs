//! The server's storelet service: a queue, a fixed set of low-priority worker threads,
//! per-subject limits (runs at once, a CPU budget per window), the runs in progress
//! (for `storelet_ps` and `storelet_cancel`) and the accounts of finished runs (logged,
//! appended to `storelet-accounts.log` in the state directory, and kept for
//! `storelet_stats`).
//!
//! Storelets never run on connection threads: a burst of runs waits in the queue, and
//! the workers run at the lowest scheduling priority so the file service always wins
//! the CPU. Each run streams its events (started, output, finished) to the connection
//! that asked, which sends them as frames as they come.

mod worker;

use worker::{describe, lowest_priority};

use crate::transport::{EventFrame, EventStream};
use bytes::Bytes;
use locus_proto::types::{
    StoreletEvent, StoreletLogEntry, StoreletReport, StoreletResult, StoreletRunInfo, SubjectStoreletStats,
};
use locus_proto::{codec, frame::Kind, Code, Error as WireError};
use locus_storelet::{CpuBudget, Limits, RunControl, RunOutcome, Runner, StoreletError, Stream};
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Finished runs kept for `storelet_stats`.
const LOG_KEPT: usize = 256;
/// File in the state directory that gets one line per finished run.
pub const ACCOUNTS_FILE: &str = "storelet-accounts.log";
/// Nice value of the storelet workers where SCHED_IDLE is refused.
const WORKER_NICE: i32 = 19;
/// Output bytes a run may have waiting to be sent before it is made to wait.
const MAX_QUEUED_OUTPUT: usize = 4 << 20;

/// How the storelet service is sized and limited.
#[derive(Clone, Copy, Debug)]
pub struct StoreletConfig {
    /// Worker threads, so storelets running at once; more wait in the queue.
    pub workers: usize,
    /// Limits of each run.
    pub limits: Limits,
    /// Runs one subject may have queued or running at once.
    pub runs_per_subject: usize,
    /// CPU time one subject's runs may use together per `budget_window`.
    pub cpu_budget: Duration,
    pub budget_window: Duration,
}

impl Default for StoreletConfig {
    fn default() -> Self {
        StoreletConfig {
            workers: 2,
            limits: Limits::default(),
            runs_per_subject: 4,
            cpu_budget: Duration::from_secs(120),
            budget_window: Duration::from_secs(60),
        }
    }
}

/// What a connection asks to run.
pub struct Submission {
    pub subject: String,
    /// The module; empty when `hash` names one this server has compiled.
    pub wasm: Bytes,
    /// The module's hash when `wasm` is left out (see [`StoreletHost::has_module`]).
    pub hash: Option<String>,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// What the run sees as its `/`.
    pub view: Seen,
    pub write: bool,
    /// Keep the files the run opens (for active files' reuse).
    pub record_inputs: bool,
    /// Run this native program (an administrator's active-file handler) instead of
    /// `wasm`, confined as `locus_storelet::native` says.
    pub native: Option<PathBuf>,
    /// The active file the run makes (`None` for a storelet a client runs).
    pub active_file: Option<String>,
}

/// What a run sees as its `/`.
pub enum Seen {
    /// The directory as the subject may read it, already resolved beneath the export
    /// root and checked (see `locus_store::CodeView`).
    Dir(locus_store::CodeView),
    /// A data node's share of a cluster run, read-only: each file's path (relative to
    /// the run's directory) and where its bytes are, made into a `locus_storelet::Tree`
    /// on the worker that runs it (so its cost is the run's), never laid out on disk,
    /// and handed to `keep` (if any) for later runs.
    Files(Vec<(String, locus_storelet::TreeFile)>, Option<KeepTree>),
    /// A tree made for an earlier run and kept.
    Tree(Arc<locus_storelet::Tree>),
}

/// What takes a tree made for a run, to keep it for later runs.
pub type KeepTree = Box<dyn FnOnce(Arc<locus_storelet::Tree>) + Send>;

struct Job {
    run: u64,
    submission: Submission,
    control: Arc<RunControl>,
    watcher: Box<dyn Watcher>,
}

/// Where a run's progress goes: to the connection that asked (as events), or into an
/// active file.
pub trait Watcher: Send + 'static {
    /// A worker took the run.
    fn started(&self, run: u64, module: &str);
    /// Output as the program writes it (on the worker's thread, which it may hold back
    /// for backpressure); false when nobody wants it any more, which stops the run.
    fn output(&self, stream: Stream, bytes: &[u8]) -> bool;
    /// The run ended: its account, and what the runner said.
    fn finished(self: Box<Self>, result: &StoreletResult, outcome: &Result<RunOutcome, StoreletError>);
}

/// Sends a run's progress to its connection as `storelet_run` reply frames.
struct EventWatcher {
    events: mpsc::UnboundedSender<EventFrame>,
    queued: Arc<AtomicUsize>,
    control: Arc<RunControl>,
    started: std::sync::OnceLock<Instant>,
    wall: Duration,
}

impl Watcher for EventWatcher {
    fn started(&self, run: u64, module: &str) {
        let _ = self.started.set(Instant::now());
        let started = StoreletEvent::Started { run, module: module.to_string() };
        let _ = self.events.send(event(Kind::Reply, true, &started, Bytes::new()));
    }

    fn output(&self, stream: Stream, bytes: &[u8]) -> bool {
        let kind = match stream {
            Stream::Stdout => StoreletEvent::Stdout,
            Stream::Stderr => StoreletEvent::Stderr,
        };
        // Backpressure: a client that reads slowly makes the program wait (its wall
        // clock keeps running; cancelling still ends the wait).
        let started = *self.started.get_or_init(Instant::now);
        while self.queued.load(Ordering::Relaxed) > MAX_QUEUED_OUTPUT
            && !self.events.is_closed()
            && !self.control.is_cancelled()
            && started.elapsed() < self.wall
        {
            std::thread::sleep(Duration::from_millis(1));
        }
        let mut frame = event(Kind::Reply, true, &kind, Bytes::copy_from_slice(bytes));
        frame.mergeable = true;
        self.queued.fetch_add(bytes.len(), Ordering::Relaxed);
        // Nobody is listening any more when the client went away.
        self.events.send(frame).is_ok()
    }

    fn finished(self: Box<Self>, result: &StoreletResult, outcome: &Result<RunOutcome, StoreletError>) {
        let last = match outcome {
            Ok(_) => event(Kind::Reply, false, &StoreletEvent::Finished(result.clone()), Bytes::new()),
            Err(e) => event(Kind::Error, false, &run_error(e), Bytes::new()),
        };
        let _ = self.events.send(last);
    }
}

/// The wire error for a run that did not finish, naming what it used.
pub fn run_error(e: &StoreletError) -> WireError {
    let account = e.account().cloned().unwrap_or_default();
    WireError::new(e.code(), format!("{e}; it used {}", describe(&account)))
}

/// A queued or running run.
struct LiveRun {
    subject: String,
    module: String,
    args: Vec<String>,
    active_file: Option<String>,
    submitted: Instant,
    submitted_ms: u64,
    running: bool,
    control: Arc<RunControl>,
}

/// A finished run in the recent log.
struct Ended {
    entry: StoreletLogEntry,
    active_file: Option<String>,
    submitted_ms: u64,
}

/// A run as operators see it (the web console): queued, running or finished.
#[derive(Clone, Debug, serde::Serialize)]
pub struct RunView {
    pub run: u64,
    pub subject: String,
    /// The module's SHA-256, or `native:PROGRAM` for a native handler.
    pub module: String,
    pub args: Vec<String>,
    /// The active file the run makes, when it is a handler's run.
    pub active_file: Option<String>,
    /// `queued`, `running`, or how it ended (`exit N`, `LIMIT: ...`, `ECANCELED: ...`).
    pub state: String,
    pub running: bool,
    /// Milliseconds since the Unix epoch when it was submitted.
    pub submitted_ms: u64,
    pub wall_us: u64,
    pub cpu_us: u64,
    pub fuel: u64,
    pub peak_memory: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub output_bytes: u64,
}

/// Milliseconds since the Unix epoch.
fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

struct Subject {
    budget: Arc<CpuBudget>,
    totals: SubjectStoreletStats,
}

#[derive(Default)]
struct State {
    runs: HashMap<u64, LiveRun>,
    /// Runs stopped by each limit since the server started.
    limits: HashMap<&'static str, u64>,
    subjects: HashMap<String, Subject>,
    log: VecDeque<Ended>,
}

/// What the workers share with the service.
struct Core {
    runner: Arc<Runner>,
    config: StoreletConfig,
    state: Mutex<State>,
    accounts_file: PathBuf,
    /// Where native runs mount their roots.
    native_roots: PathBuf,
}

/// The storelet service of one server.
pub struct StoreletHost {
    core: Arc<Core>,
    /// Dropping it stops the workers once the queue is empty.
    queue: std::sync::mpsc::Sender<Job>,
    next_run: AtomicU64,
}

impl StoreletHost {
    /// Starts the workers; compiled modules are cached in `state_dir/storelets`.
    pub fn start(config: StoreletConfig, state_dir: &Path) -> Result<StoreletHost, locus_storelet::StoreletError> {
        let runner = Runner::new(&state_dir.join("storelets"))?;
        let core = Arc::new(Core {
            runner,
            config,
            state: Mutex::new(State::default()),
            accounts_file: state_dir.join(ACCOUNTS_FILE),
            native_roots: state_dir.join("native"),
        });
        // Totals per subject carry over restarts: they are rebuilt from the accounts file.
        let (totals, last_run) = read_accounts(&core.accounts_file);
        {
            let mut state = core.state.lock();
            for (name, t) in totals {
                let subject = state.subject(&name, &config);
                subject.totals = SubjectStoreletStats { budget_us: subject.totals.budget_us, ..t };
            }
        }
        let (queue, jobs) = std::sync::mpsc::channel::<Job>();
        let jobs = Arc::new(Mutex::new(jobs));
        for i in 0..config.workers.max(1) {
            let (core, jobs) = (core.clone(), jobs.clone());
            std::thread::Builder::new()
                .name(format!("locus-storelet-{i}"))
                .spawn(move || {
                    lowest_priority();
                    loop {
                        let job = jobs.lock().recv();
                        match job {
                            Ok(job) => core.execute(job),
                            Err(_) => return,
                        }
                    }
                })
                .map_err(|e| locus_storelet::StoreletError::Setup(e.to_string()))?;
        }
        Ok(StoreletHost { core, queue, next_run: AtomicU64::new(last_run + 1) })
    }

    /// Queues a run; returns its control and the channel its events arrive on (the last
    /// one without MORE).
    /// Whether the module named by `hash` is compiled here, so that a run of it may
    /// leave its bytes out.
    pub fn has_module(&self, hash: &str) -> bool {
        self.core.runner.has(hash)
    }

    pub fn submit(&self, s: Submission) -> Result<(Arc<RunControl>, EventStream), WireError> {
        let (events, frames) = mpsc::unbounded_channel();
        let queued = Arc::new(AtomicUsize::new(0));
        let wall = self.core.config.limits.wall;
        let control = self.submit_watched(s, |control| {
            Box::new(EventWatcher {
                events,
                queued: queued.clone(),
                control,
                started: std::sync::OnceLock::new(),
                wall,
            })
        })?;
        Ok((control, EventStream { frames, queued }))
    }

    /// Queues a run whose progress goes to the watcher that `watcher` makes from the
    /// run's control; returns the control.
    pub fn submit_watched(
        &self,
        s: Submission,
        watcher: impl FnOnce(Arc<RunControl>) -> Box<dyn Watcher>,
    ) -> Result<Arc<RunControl>, WireError> {
        let config = &self.core.config;
        let run = self.next_run.fetch_add(1, Ordering::Relaxed);
        let control = {
            let mut state = self.core.state.lock();
            let active = state.runs.values().filter(|r| r.subject == s.subject).count();
            if active >= config.runs_per_subject {
                return Err(WireError::new(
                    Code::LIMIT,
                    format!(
                        "storelet exceeded its concurrent runs limit ({active} of {} per subject)",
                        config.runs_per_subject
                    ),
                ));
            }
            let subject = state.subject(&s.subject, config);
            if subject.budget.spent() >= config.cpu_budget {
                return Err(WireError::new(
                    Code::LIMIT,
                    format!(
                        "storelet exceeded its cpu budget limit ({:?} per {:?} is spent; wait for the window to pass)",
                        config.cpu_budget, config.budget_window
                    ),
                ));
            }
            let control = RunControl::new(Some(subject.budget.clone()));
            state.runs.insert(
                run,
                LiveRun {
                    subject: s.subject.clone(),
                    module: match &s.native {
                        Some(program) => format!("native:{}", program.display()),
                        None => s.hash.clone().filter(|_| s.wasm.is_empty()).unwrap_or_else(|| Runner::hash(&s.wasm)),
                    },
                    args: s.args.clone(),
                    active_file: s.active_file.clone(),
                    submitted: Instant::now(),
                    submitted_ms: now_ms(),
                    running: false,
                    control: control.clone(),
                },
            );
            control
        };
        let job = Job { run, submission: s, control: control.clone(), watcher: watcher(control.clone()) };
        if self.queue.send(job).is_err() {
            self.core.state.lock().runs.remove(&run);
            return Err(WireError::new(Code::SHUTDOWN, "the storelet workers have stopped"));
        }
        Ok(control)
    }

    /// Runs queued or running: `who`'s own, or all of them for an admin.
    pub fn ps(&self, who: &str, admin: bool) -> Vec<StoreletRunInfo> {
        let mut list: Vec<StoreletRunInfo> = live(&self.core.state.lock(), who, admin)
            .into_iter()
            .map(|r| StoreletRunInfo {
                run: r.run,
                subject: r.subject,
                module: r.module,
                args: r.args,
                running: r.running,
                age_us: r.wall_us,
                cpu_us: r.cpu_us,
                fuel: r.fuel,
            })
            .collect();
        list.sort_by_key(|r| r.run);
        list
    }

    /// Cancels a run of `who`'s (any run, for an admin).
    pub fn cancel(&self, who: &str, admin: bool, run: u64) -> Result<(), WireError> {
        let state = self.core.state.lock();
        match state.runs.get(&run) {
            Some(r) if admin || r.subject == who => {
                r.control.cancel();
                Ok(())
            }
            Some(_) => Err(WireError::new(Code::PERM, format!("run {run} belongs to another subject"))),
            None => Err(WireError::new(Code::NOENT, format!("no storelet run {run} is queued or running"))),
        }
    }

    /// Totals per subject and recent runs: `who`'s own, or everyone's for an admin.
    pub fn stats(&self, who: &str, admin: bool) -> StoreletReport {
        let state = self.core.state.lock();
        let mut subjects: Vec<SubjectStoreletStats> = state
            .subjects
            .iter()
            .filter(|(name, _)| admin || name.as_str() == who)
            .map(|(name, s)| SubjectStoreletStats {
                active: state.runs.values().filter(|r| &r.subject == name).count() as u64,
                budget_spent_us: s.budget.spent().as_micros() as u64,
                ..s.totals.clone()
            })
            .collect();
        subjects.sort_by(|a, b| a.subject.cmp(&b.subject));
        StoreletReport {
            subjects,
            recent: state
                .log
                .iter()
                .rev()
                .filter(|e| admin || e.entry.subject == who)
                .map(|e| e.entry.clone())
                .collect(),
            compiles: self.core.runner.compiles.load(Ordering::Relaxed),
        }
    }

    /// Runs queued or running, then the recent finished ones, newest first: `who`'s own,
    /// or everyone's for an admin.
    pub fn runs(&self, who: &str, admin: bool) -> (Vec<RunView>, Vec<RunView>) {
        // One look at the state: a run that ends meanwhile is in one list, not both.
        let state = self.core.state.lock();
        let mut live = live(&state, who, admin);
        live.sort_by_key(|r| std::cmp::Reverse(r.run));
        (live, ended(&state, who, admin))
    }

    /// Runs stopped by each limit since the server started.
    pub fn limits_tripped(&self) -> Vec<(&'static str, u64)> {
        let mut v: Vec<_> = self.core.state.lock().limits.iter().map(|(&k, &n)| (k, n)).collect();
        v.sort();
        v
    }

    /// The runner (for its compile counter in tests).
    pub fn runner(&self) -> &Runner {
        &self.core.runner
    }
}

/// Runs queued or running, in no order: `who`'s own, or everyone's for an admin.
fn live(state: &State, who: &str, admin: bool) -> Vec<RunView> {
    state
        .runs
        .iter()
        .filter(|(_, r)| admin || r.subject == who)
        .map(|(&run, r)| RunView {
            run,
            subject: r.subject.clone(),
            module: r.module.clone(),
            args: r.args.clone(),
            active_file: r.active_file.clone(),
            state: if r.running { "running" } else { "queued" }.into(),
            running: r.running,
            submitted_ms: r.submitted_ms,
            wall_us: r.submitted.elapsed().as_micros() as u64,
            cpu_us: r.control.cpu().as_micros() as u64,
            fuel: r.control.fuel(),
            peak_memory: 0,
            read_bytes: 0,
            write_bytes: 0,
            output_bytes: 0,
        })
        .collect()
}

/// The recent finished runs, newest first.
fn ended(state: &State, who: &str, admin: bool) -> Vec<RunView> {
    state
        .log
        .iter()
        .rev()
        .filter(|e| admin || e.entry.subject == who)
        .map(|e| {
            let a = &e.entry.account;
            RunView {
                run: a.run,
                subject: e.entry.subject.clone(),
                module: a.module.clone(),
                args: e.entry.args.clone(),
                active_file: e.active_file.clone(),
                state: e.entry.outcome.clone(),
                running: false,
                submitted_ms: e.submitted_ms,
                wall_us: a.wall_us,
                cpu_us: a.cpu_us,
                fuel: a.fuel,
                peak_memory: a.peak_memory,
                read_bytes: a.read_bytes,
                write_bytes: a.write_bytes,
                output_bytes: a.output_bytes,
            }
        })
        .collect()
}

/// The value of `key=` in an accounts line (values hold no spaces, but `outcome`).
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let start = line.find(&format!(" {key}="))? + key.len() + 2;
    Some(line[start..].split(' ').next().unwrap_or(""))
}

/// Totals per subject and the highest run number in an accounts file (one line per run,
/// as `record` writes them); a missing file is no runs, a damaged line is skipped.
fn read_accounts(path: &Path) -> (HashMap<String, SubjectStoreletStats>, u64) {
    use std::io::BufRead;
    let mut totals: HashMap<String, SubjectStoreletStats> = HashMap::new();
    let mut last_run = 0;
    let Ok(file) = std::fs::File::open(path) else { return (totals, 0) };
    for line in std::io::BufReader::new(file).lines().map_while(Result::ok) {
        let num = |k: &str| field(&line, k).and_then(|v| v.parse::<u64>().ok());
        let (Some(subject), Some(run)) = (field(&line, "subject"), num("run")) else { continue };
        last_run = last_run.max(run);
        let t = totals
            .entry(subject.to_string())
            .or_insert_with(|| SubjectStoreletStats { subject: subject.to_string(), ..Default::default() });
        t.runs += 1;
        t.stopped += u64::from(!line.contains(" outcome=\"exit "));
        t.cpu_us += num("cpu_us").unwrap_or(0);
        t.fuel += num("fuel").unwrap_or(0);
        t.read_bytes += num("read_bytes").unwrap_or(0);
        t.write_bytes += num("write_bytes").unwrap_or(0);
    }
    (totals, last_run)
}

impl State {
    fn subject(&mut self, name: &str, config: &StoreletConfig) -> &mut Subject {
        self.subjects.entry(name.to_string()).or_insert_with(|| Subject {
            budget: Arc::new(CpuBudget::new(config.cpu_budget, config.budget_window)),
            totals: SubjectStoreletStats {
                subject: name.to_string(),
                budget_us: config.cpu_budget.as_micros() as u64,
                ..Default::default()
            },
        })
    }
}

/// One event frame of a run's stream.
fn event(kind: Kind, more: bool, meta: &impl serde::Serialize, data: Bytes) -> EventFrame {
    EventFrame { kind, more, meta: codec::encode(meta), data, mergeable: false }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_are_rebuilt_from_the_accounts_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(ACCOUNTS_FILE);
        std::fs::write(
            &path,
            "1 run=3 subject=ann module=m outcome=\"exit 0\" fuel=10 cpu_us=5 peak_memory=1 wall_us=9 read_bytes=100 write_bytes=1 files=1 output=2\n\
             2 run=9 subject=ann module=m outcome=\"LIMIT: storelet exceeded its time limit\" fuel=7 cpu_us=4 read_bytes=0 write_bytes=0\n\
             garbage\n\
             3 run=4 subject=bob module=m outcome=\"exit 2\" fuel=1 cpu_us=1 read_bytes=3 write_bytes=0\n",
        )
        .unwrap();
        let (totals, last) = read_accounts(&path);
        assert_eq!(last, 9);
        let ann = &totals["ann"];
        assert_eq!((ann.runs, ann.stopped, ann.cpu_us, ann.fuel, ann.read_bytes), (2, 1, 9, 17, 100));
        assert_eq!(totals["bob"].runs, 1);
        assert_eq!(read_accounts(&dir.path().join("none")).1, 0);
    }
}
