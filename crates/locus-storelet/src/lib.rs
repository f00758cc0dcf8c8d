//! Storelets: WebAssembly programs (WASI preview 1, so Go, Rust and C can target them)
//! that clients upload to run beside the data, as ActiveStorage's StoreLets did; and
//! ([`native`]) the native programs an administrator registers as active-file handlers,
//! run confined under the same limits.
//!
//! - [`Runner`]: one wasmtime engine and its linkers, shared; modules validated,
//!   compiled once and cached by content hash in memory and on disk (an entry whose
//!   checksum does not match is rebuilt), linked once; a fresh store per run carrying
//!   that run's [`Limits`].
//! - Exact resource control: CPU by fuel and by thread CPU time, memory by a resource
//!   limiter, wall time, cancellation and a principal's [`CpuBudget`] checked on every
//!   epoch tick (a ticker thread advances the epoch), output by capped pipes, and bytes
//!   read, bytes written and files opened by metered WASI calls (`meter`). The limit
//!   that stopped a run is named in [`StoreletError`], with the run's [`Account`].
//! - The file system a storelet sees is one directory, preopened read-only unless the
//!   caller asked for and holds write rights, where WASI resolves every path beneath it;
//!   or a read-only [`Tree`] held in memory (`tree`).

mod dirs;
mod guest;
mod meter;
pub mod native;
pub mod output;
mod tree;

pub use dirs::{Inputs, Stamp};
pub use output::{OutputSink, Stream};
pub use tree::{Tree, TreeFile};

use parking_lot::Mutex;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use wasmtime::{Config, Engine, InstancePre, Linker, Module, ResourceLimiter, Store, Trap, UpdateDeadline};
use wasmtime_wasi::{DirPerms, FilePerms, I32Exit, WasiCtxBuilder};

/// How often the epoch advances: time, CPU, budgets and cancellation are checked this often.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Whether `s` is a [`Runner::hash`]: 64 lowercase hex digits (so it names a file of
/// the cache and nothing else).
fn is_hash(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// How many prepared modules a runner keeps before it starts again.
const PREPARED_KEPT: usize = 256;

/// Resource limits of one run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Units of fuel (about one per WebAssembly instruction).
    pub fuel: u64,
    /// Bytes of linear memory.
    pub memory: usize,
    /// Wall-clock time.
    pub wall: Duration,
    /// CPU time of the thread running the program.
    pub cpu: Duration,
    /// Bytes of stdout plus stderr.
    pub output: usize,
    /// Bytes read from files.
    pub read_bytes: u64,
    /// Bytes written to files (not counting stdout and stderr).
    pub write_bytes: u64,
    /// Files and directories opened.
    pub files: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            fuel: 50_000_000_000,
            memory: 256 << 20,
            wall: Duration::from_secs(60),
            cpu: Duration::from_secs(30),
            output: 64 << 20,
            read_bytes: 16 << 30,
            write_bytes: 1 << 30,
            files: 1_000_000,
        }
    }
}

/// What a run used.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Account {
    pub fuel: u64,
    pub cpu: Duration,
    pub peak_memory: usize,
    pub wall: Duration,
    pub output: usize,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub files_opened: u64,
}

/// A finished run. `stdout` and `stderr` hold the output only when no sink took it.
#[derive(Clone, Debug)]
pub struct RunOutcome {
    pub exit_code: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub account: Account,
    /// What the program read, when the spec asked to record it.
    pub inputs: Option<Inputs>,
}

/// Why a storelet could not run or was stopped.
#[derive(Debug, thiserror::Error)]
pub enum StoreletError {
    #[error("not a valid WebAssembly module: {0}")]
    Invalid(String),
    #[error("storelet exceeded its {limit} limit ({detail})")]
    Limit { limit: &'static str, detail: String, account: Account },
    #[error("storelet cancelled")]
    Cancelled { account: Account },
    #[error("storelet trapped: {0}")]
    Trap(String),
    #[error("storelet setup: {0}")]
    Setup(String),
}

impl StoreletError {
    /// The wire code.
    pub fn code(&self) -> locus_proto::Code {
        match self {
            StoreletError::Invalid(_) => locus_proto::Code::INVAL,
            StoreletError::Limit { .. } => locus_proto::Code::LIMIT,
            StoreletError::Cancelled { .. } => locus_proto::Code::CANCELED,
            StoreletError::Trap(_) => locus_proto::Code::SCRIPT_ERROR,
            StoreletError::Setup(_) => locus_proto::Code::IO,
        }
    }

    /// What the run used before it was stopped, if it ran at all.
    pub fn account(&self) -> Option<&Account> {
        match self {
            StoreletError::Limit { account, .. } | StoreletError::Cancelled { account } => Some(account),
            _ => None,
        }
    }
}

/// CPU time that one principal's runs may use together per window of time; every run
/// of the principal draws on it as it goes, so concurrent runs cannot overspend it.
pub struct CpuBudget {
    limit: Duration,
    window: Duration,
    /// Start of the current window and what was spent in it.
    spent: Mutex<(Instant, Duration)>,
}

impl CpuBudget {
    /// A budget of `limit` CPU time per `window`.
    pub fn new(limit: Duration, window: Duration) -> CpuBudget {
        CpuBudget { limit, window, spent: Mutex::new((Instant::now(), Duration::ZERO)) }
    }

    /// Spends `cpu`; false once the window's budget is gone.
    pub fn charge(&self, cpu: Duration) -> bool {
        let mut s = self.spent.lock();
        if s.0.elapsed() >= self.window {
            *s = (Instant::now(), Duration::ZERO);
        }
        s.1 += cpu;
        s.1 <= self.limit
    }

    /// What was spent in the current window.
    pub fn spent(&self) -> Duration {
        let s = self.spent.lock();
        if s.0.elapsed() >= self.window {
            Duration::ZERO
        } else {
            s.1
        }
    }
}

/// A handle on a run from outside it: cancels it and shows its progress.
#[derive(Default)]
pub struct RunControl {
    cancelled: AtomicBool,
    cpu_ns: AtomicU64,
    fuel: AtomicU64,
    budget: Option<Arc<CpuBudget>>,
}

impl RunControl {
    /// A control for a run that draws on `budget`, if any.
    pub fn new(budget: Option<Arc<CpuBudget>>) -> Arc<RunControl> {
        Arc::new(RunControl { budget, ..Default::default() })
    }

    /// Asks the run to stop; it does within one epoch tick of running code.
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::Relaxed);
    }

    /// Whether the run was asked to stop.
    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Relaxed)
    }

    /// CPU time used so far (updated every tick).
    pub fn cpu(&self) -> Duration {
        Duration::from_nanos(self.cpu_ns.load(Ordering::Relaxed))
    }

    /// Fuel used as of the program's last call into the host (compiled code keeps its
    /// running count to itself in between).
    pub fn fuel(&self) -> u64 {
        self.fuel.load(Ordering::Relaxed)
    }
}

/// Everything about one run but the module.
pub struct RunSpec<'a> {
    /// Arguments, `argv[0]` first.
    pub args: &'a [String],
    pub env: &'a [(String, String)],
    /// The directory preopened as `/`, and whether it is writable.
    pub dir: Option<(&'a Path, bool)>,
    /// Or a read-only [`Tree`] seen as `/` (in place of `dir`).
    pub tree: Option<Arc<Tree>>,
    pub limits: Limits,
    /// Takes stdout and stderr as they are written; without one they are collected.
    pub output: Option<OutputSink>,
    pub control: Arc<RunControl>,
    /// Keep the files the program opens or looks for ([`RunOutcome::inputs`]).
    pub record_inputs: bool,
}

impl<'a> RunSpec<'a> {
    /// A run with `args` and `limits`, no directory, collected output.
    pub fn new(args: &'a [String], limits: Limits) -> RunSpec<'a> {
        RunSpec {
            args,
            env: &[],
            dir: None,
            tree: None,
            limits,
            output: None,
            control: Arc::default(),
            record_inputs: false,
        }
    }

    /// The same run with `dir` preopened as `/`.
    pub fn dir(mut self, dir: &'a Path, writable: bool) -> RunSpec<'a> {
        self.dir = Some((dir, writable));
        self
    }
}

/// Memory limiter that also remembers the peak.
struct Limiter {
    max: usize,
    peak: usize,
    denied: bool,
}

impl ResourceLimiter for Limiter {
    fn memory_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> anyhow::Result<bool> {
        if desired > self.max {
            self.denied = true;
            return Ok(false);
        }
        self.peak = self.peak.max(desired);
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> anyhow::Result<bool> {
        Ok(desired <= 1_000_000)
    }
}

/// The I/O a run has done through metered calls.
#[derive(Default)]
struct IoUse {
    read_bytes: u64,
    write_bytes: u64,
    files_opened: u64,
}

/// The data of a run's store.
pub(crate) struct RunState {
    wasi: wasmtime_wasi::p1::WasiP1Ctx,
    limiter: Limiter,
    limits: Limits,
    io: IoUse,
    /// CPU time already charged to the principal's budget.
    charged: Duration,
    /// The host side of the directories the program opened (see `dirs`).
    dirs: dirs::Dirs,
    /// The run's tree and its open files, when it sees one (see `tree`).
    tree: Option<tree::TreeFds>,
    /// The limit (or "cancelled") that stopped the run, with a detail.
    tripped: Option<(&'static str, String)>,
}

/// The CPU time the calling thread has used: what a run's CPU limit and account count.
pub fn thread_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// Builds a storelet shipped in this repository's `storelets/NAME` (a Go program) with
/// Go's wasip1 port and returns the module. For tests and benchmarks run from a checkout.
pub fn build_shipped(name: &str) -> Result<Vec<u8>, String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../storelets").join(name);
    let out_dir = std::env::temp_dir().join(format!("locus-storelets-{}", std::process::id()));
    std::fs::create_dir_all(&out_dir).map_err(|e| format!("{}: {e}", out_dir.display()))?;
    let out = out_dir.join(format!("{name}.wasm"));
    let status = std::process::Command::new("go")
        .args(["build", "-o"])
        .arg(&out)
        .arg(".")
        .current_dir(&src)
        .env("GOOS", "wasip1")
        .env("GOARCH", "wasm")
        .status()
        .map_err(|e| format!("Go is needed to build the storelets (GOOS=wasip1): {e}"))?;
    if !status.success() {
        return Err(format!("go build of storelet {name} in {} failed", src.display()));
    }
    std::fs::read(&out).map_err(|e| format!("{}: {e}", out.display()))
}

/// Compiles, caches and runs storelets.
pub struct Runner {
    engine: Engine,
    /// WASI with its I/O functions metered: what modules link against.
    linker: Linker<RunState>,
    /// The same, with the calls on files served from a [`Tree`]: for runs that see one.
    tree_linker: Linker<RunState>,
    cache_dir: PathBuf,
    modules: Mutex<HashMap<String, Module>>,
    /// Modules linked and ready to instantiate (see [`Runner::prepared`]).
    prepared: Mutex<HashMap<(usize, bool), InstancePre<RunState>>>,
    compile_lock: Mutex<()>,
    /// Times a module was compiled (rather than found in a cache), for tests and stats.
    pub compiles: AtomicU64,
}

impl Runner {
    /// A runner keeping compiled modules in `cache_dir`.
    pub fn new(cache_dir: &Path) -> Result<Arc<Runner>, StoreletError> {
        let setup = |e: anyhow::Error| StoreletError::Setup(e.to_string());
        std::fs::create_dir_all(cache_dir)
            .map_err(|e| StoreletError::Setup(format!("{}: {e}", cache_dir.display())))?;
        let mut config = Config::new();
        // Compiling on the calling (storelet worker) thread keeps it at that thread's
        // low priority, where a parallel compile would use threads at normal priority.
        config.consume_fuel(true).epoch_interruption(true).parallel_compilation(false);
        let engine = Engine::new(&config).map_err(setup)?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p1::add_to_linker_sync(&mut linker, |s: &mut RunState| &mut s.wasi).map_err(setup)?;
        meter::add_to_linker(&mut linker)?;
        let mut tree_linker = linker.clone();
        tree::add_to_linker(&mut tree_linker)?;
        let ticker = engine.weak();
        std::thread::Builder::new()
            .name("locus-epoch".into())
            .spawn(move || {
                while let Some(engine) = ticker.upgrade() {
                    engine.increment_epoch();
                    drop(engine);
                    std::thread::sleep(EPOCH_TICK);
                }
            })
            .map_err(|e| StoreletError::Setup(e.to_string()))?;
        Ok(Arc::new(Runner {
            engine,
            linker,
            tree_linker,
            cache_dir: cache_dir.to_path_buf(),
            modules: Mutex::new(HashMap::new()),
            prepared: Mutex::new(HashMap::new()),
            compile_lock: Mutex::new(()),
            compiles: Default::default(),
        }))
    }

    /// The content hash (SHA-256, hex) that names a module in the caches.
    pub fn hash(wasm: &[u8]) -> String {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(wasm))
    }

    /// The compiled module for `wasm` (binary or text), from memory, from the disk
    /// cache (checked against its checksum), or compiled now; returns its hash too.
    pub fn module(&self, wasm: &[u8]) -> Result<(String, Module), StoreletError> {
        let hash = Runner::hash(wasm);
        self.module_hashed(hash, wasm)
    }

    /// [`Runner::module`] for a caller that already has the module's [`Runner::hash`].
    pub fn module_hashed(&self, hash: String, wasm: &[u8]) -> Result<(String, Module), StoreletError> {
        use sha2::Digest;
        if let Some(m) = self.modules.lock().get(&hash) {
            return Ok((hash, m.clone()));
        }
        // One compile at a time: a burst of runs of a new module compiles it once, and
        // compiling never takes more than one (low-priority) worker's CPU.
        let _compiling = self.compile_lock.lock();
        if let Some(m) = self.from_caches(&hash) {
            return Ok((hash, m));
        }
        if !is_hash(&hash) {
            return Err(StoreletError::Invalid(format!("{hash:?} is not a module's SHA-256")));
        }
        if wasm.is_empty() {
            return Err(StoreletError::Invalid(format!("module {hash} is not compiled here")));
        }
        let path = self.cache_dir.join(format!("{hash}.cwasm"));
        let sum_path = self.cache_dir.join(format!("{hash}.sum"));
        let m = Module::new(&self.engine, wasm).map_err(|e| StoreletError::Invalid(format!("{e:#}")))?;
        self.compiles.fetch_add(1, Ordering::Relaxed);
        if let Ok(bytes) = m.serialize() {
            let tmp = self.cache_dir.join(format!("{hash}.tmp"));
            if std::fs::write(&tmp, &bytes).is_ok() && std::fs::rename(&tmp, &path).is_ok() {
                let _ = std::fs::write(&sum_path, hex::encode(sha2::Sha256::digest(&bytes)));
            }
        }
        self.modules.lock().insert(hash.clone(), m.clone());
        Ok((hash, m))
    }

    /// Whether the module named by `hash` (a [`Runner::hash`]) is compiled here, in
    /// memory or in the disk cache: a run of it needs no bytes.
    /// (Its disk cache entry is loaded and checked by the run, off the caller's thread.)
    pub fn has(&self, hash: &str) -> bool {
        is_hash(hash)
            && (self.modules.lock().contains_key(hash)
                || self.cache_dir.join(format!("{hash}.cwasm")).is_file()
                    && self.cache_dir.join(format!("{hash}.sum")).is_file())
    }

    /// The module named by `hash` from memory or from the disk cache (checked against
    /// its checksum), kept in memory; the caller holds the compile lock.
    fn from_caches(&self, hash: &str) -> Option<Module> {
        use sha2::Digest;
        if !is_hash(hash) {
            return None;
        }
        if let Some(m) = self.modules.lock().get(hash) {
            return Some(m.clone());
        }
        let (path, sum_path) =
            (self.cache_dir.join(format!("{hash}.cwasm")), self.cache_dir.join(format!("{hash}.sum")));
        let bytes = std::fs::read(&path).ok()?;
        let sum = std::fs::read_to_string(&sum_path).ok()?;
        // SAFETY: the bytes are this engine's own serialization (checked by checksum).
        let loaded = (hex::encode(sha2::Sha256::digest(&bytes)) == sum.trim())
            .then(|| unsafe { Module::deserialize(&self.engine, &bytes) }.ok())
            .flatten();
        let Some(m) = loaded else {
            // A damaged entry goes, so that [`Runner::has`] no longer counts it (and the
            // module is compiled again from its bytes).
            let _ = std::fs::remove_file(&path);
            let _ = std::fs::remove_file(&sum_path);
            return None;
        };
        self.modules.lock().insert(hash.to_string(), m.clone());
        Some(m)
    }

    /// `module` linked against WASI (the tree's calls when `tree`), once per module: a
    /// run only instantiates it.
    fn prepared(&self, module: &Module, tree: bool) -> anyhow::Result<InstancePre<RunState>> {
        // A module's compiled image stays where it is while the module lives (and the
        // prepared instance holds it), so its address names it.
        let key = (module.image_range().start as usize, tree);
        if let Some(pre) = self.prepared.lock().get(&key) {
            return Ok(pre.clone());
        }
        let linker = if tree { &self.tree_linker } else { &self.linker };
        let pre = linker.instantiate_pre(module)?;
        let mut prepared = self.prepared.lock();
        if prepared.len() >= PREPARED_KEPT {
            prepared.clear();
        }
        prepared.insert(key, pre.clone());
        Ok(pre)
    }

    /// Runs `module` as `spec` says, on the calling thread.
    pub fn run(&self, module: &Module, spec: RunSpec<'_>) -> Result<RunOutcome, StoreletError> {
        let limits = spec.limits;
        let output = output::Output::new(limits.output, spec.output);
        let mut b = WasiCtxBuilder::new();
        b.args(spec.args).envs(spec.env).stdout(output.pipe(Stream::Stdout)).stderr(output.pipe(Stream::Stderr));
        // File operations run on this (low-priority, metered) thread, not on a shared pool.
        b.allow_blocking_current_thread(true);
        let mut preopen = None;
        if let (Some((path, writable)), None) = (spec.dir, &spec.tree) {
            let flags = rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC;
            preopen = rustix::fs::open(path, flags, rustix::fs::Mode::empty()).ok();
            let (d, f) = if writable { (DirPerms::all(), FilePerms::all()) } else { (DirPerms::READ, FilePerms::READ) };
            b.preopened_dir(path, "/", d, f).map_err(|e| StoreletError::Setup(format!("preopen: {e:#}")))?;
        }
        let state = RunState {
            wasi: b.build_p1(),
            limiter: Limiter { max: limits.memory, peak: 0, denied: false },
            limits,
            io: IoUse::default(),
            charged: Duration::ZERO,
            dirs: dirs::Dirs::new(preopen, spec.record_inputs),
            tree: spec.tree.clone().map(tree::TreeFds::new),
            tripped: None,
        };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.limiter);
        store.set_fuel(limits.fuel).map_err(|e| StoreletError::Setup(e.to_string()))?;

        let started = Instant::now();
        let cpu_start = thread_cpu();
        let control = spec.control.clone();
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(move |mut ctx| {
            let cpu = thread_cpu().saturating_sub(cpu_start);
            control.cpu_ns.store(cpu.as_nanos() as u64, Ordering::Relaxed);
            control.fuel.store(limits.fuel - ctx.get_fuel().unwrap_or(0), Ordering::Relaxed);
            let state = ctx.data_mut();
            if control.cancelled.load(Ordering::Relaxed) {
                return Err(meter::trip(state, "cancelled", String::new()));
            }
            if started.elapsed() >= limits.wall {
                return Err(meter::trip(state, "time", format!("ran longer than {:?}", limits.wall)));
            }
            if cpu > limits.cpu {
                return Err(meter::trip(state, "cpu time", format!("used more than {:?}", limits.cpu)));
            }
            if let Some(budget) = &control.budget {
                let fresh = cpu.saturating_sub(state.charged);
                state.charged = cpu;
                if !budget.charge(fresh) {
                    let detail =
                        format!("the principal's budget of {:?} per {:?} is spent", budget.limit, budget.window);
                    return Err(meter::trip(state, "cpu budget", detail));
                }
            }
            Ok(UpdateDeadline::Continue(1))
        });

        let result = self
            .prepared(module, spec.tree.is_some())
            .and_then(|pre| pre.instantiate(&mut store))
            .and_then(|i| i.get_typed_func::<(), ()>(&mut store, "_start"))
            .and_then(|start| start.call(&mut store, ()));
        let cpu = thread_cpu().saturating_sub(cpu_start);
        let state = store.data();
        let account = Account {
            fuel: limits.fuel - store.get_fuel().unwrap_or(0),
            cpu,
            peak_memory: state.limiter.peak,
            wall: started.elapsed(),
            output: output.used(),
            read_bytes: state.io.read_bytes,
            write_bytes: state.io.write_bytes,
            files_opened: state.io.files_opened,
        };
        if let Some(budget) = &spec.control.budget {
            // What the last partial tick used.
            budget.charge(cpu.saturating_sub(state.charged));
        }
        let (denied, tripped) = (state.limiter.denied, state.tripped.clone());
        let inputs = store.data_mut().dirs.inputs.take();
        drop(store);
        let limit =
            |limit: &'static str, detail: String, account: Account| StoreletError::Limit { limit, detail, account };
        if output.overflowed() {
            return Err(limit("output", format!("wrote more than {} bytes", limits.output), account));
        }
        match tripped {
            Some(("cancelled", _)) => return Err(StoreletError::Cancelled { account }),
            Some((name, detail)) => return Err(limit(name, detail, account)),
            None => {}
        }
        let exit_code = match result {
            Ok(()) => 0,
            Err(e) => match e.downcast_ref::<I32Exit>() {
                Some(exit) => exit.0,
                None => {
                    return Err(match e.downcast_ref::<Trap>() {
                        Some(Trap::OutOfFuel) => limit("fuel", format!("used {} units", account.fuel), account),
                        _ if denied => limit("memory", format!("wanted more than {} bytes", limits.memory), account),
                        _ => StoreletError::Trap(format!("{e:#}")),
                    })
                }
            },
        };
        if denied && exit_code != 0 {
            // Go and other runtimes exit non-zero when an allocation fails.
            return Err(limit("memory", format!("wanted more than {} bytes", limits.memory), account));
        }
        let (stdout, stderr) = output.take();
        Ok(RunOutcome { exit_code, stdout, stderr, account, inputs })
    }
}
