//! Storelets: WebAssembly programs (WASI preview 1, so Go, Rust and C can target them)
//! that clients upload to run beside the data, as ActiveStorage's StoreLets did.
//!
//! - [`Runner`]: one wasmtime engine and linker, shared; modules validated, compiled
//!   once and cached by content hash in memory and on disk (an entry whose checksum does
//!   not match is rebuilt); a fresh store per run carrying that run's [`Limits`].
//! - Exact resource control: CPU by fuel, memory by a resource limiter, wall time by
//!   epoch interruption (a ticker thread advances the epoch), output by capped pipes.
//!   The reason a run stopped is read from the trap and named in [`StoreletError`].
//! - The file system a storelet sees is one directory, preopened read-only unless the
//!   caller asked for and holds write rights; WASI resolves every path beneath it.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use wasmtime::{Config, Engine, Linker, Module, ResourceLimiter, Store, Trap};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{DirPerms, FilePerms, I32Exit, WasiCtxBuilder};

/// How often the epoch advances; wall-time limits are counted in these ticks.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Resource limits of one run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Units of fuel (about one per WebAssembly instruction).
    pub fuel: u64,
    /// Bytes of linear memory.
    pub memory: usize,
    /// Wall-clock time.
    pub wall: Duration,
    /// Bytes of stdout plus stderr.
    pub output: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { fuel: 10_000_000_000, memory: 256 << 20, wall: Duration::from_secs(60), output: 64 << 20 }
    }
}

/// What a run used.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Account {
    pub fuel: u64,
    pub peak_memory: usize,
    pub wall: Duration,
    pub output: usize,
}

/// A finished run.
#[derive(Clone, Debug)]
pub struct RunOutcome {
    pub exit_code: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub account: Account,
}

/// Why a storelet could not run or was stopped.
#[derive(Debug, thiserror::Error)]
pub enum StoreletError {
    #[error("not a valid WebAssembly module: {0}")]
    Invalid(String),
    #[error("storelet exceeded its {limit} limit ({detail})")]
    Limit { limit: &'static str, detail: String, account: Account },
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
            StoreletError::Trap(_) => locus_proto::Code::SCRIPT_ERROR,
            StoreletError::Setup(_) => locus_proto::Code::IO,
        }
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

struct RunState {
    wasi: wasmtime_wasi::p1::WasiP1Ctx,
    limiter: Limiter,
}

/// Compiles, caches and runs storelets.
pub struct Runner {
    engine: Engine,
    linker: Linker<RunState>,
    cache_dir: PathBuf,
    modules: Mutex<HashMap<String, Module>>,
    /// Times a module was compiled (rather than found in a cache), for tests and stats.
    pub compiles: std::sync::atomic::AtomicU64,
}

impl Runner {
    /// A runner keeping compiled modules in `cache_dir`.
    pub fn new(cache_dir: &Path) -> Result<Arc<Runner>, StoreletError> {
        std::fs::create_dir_all(cache_dir)
            .map_err(|e| StoreletError::Setup(format!("{}: {e}", cache_dir.display())))?;
        let mut config = Config::new();
        config.consume_fuel(true).epoch_interruption(true);
        let engine = Engine::new(&config).map_err(|e| StoreletError::Setup(e.to_string()))?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p1::add_to_linker_sync(&mut linker, |s: &mut RunState| &mut s.wasi)
            .map_err(|e| StoreletError::Setup(e.to_string()))?;
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
            cache_dir: cache_dir.to_path_buf(),
            modules: Mutex::new(HashMap::new()),
            compiles: Default::default(),
        }))
    }

    /// The compiled module for `wasm` (binary or text), from memory, from the disk
    /// cache (checked against its checksum), or compiled now; returns its hash too.
    pub fn module(&self, wasm: &[u8]) -> Result<(String, Module), StoreletError> {
        use sha2::Digest;
        let hash = hex::encode(sha2::Sha256::digest(wasm));
        if let Some(m) = self.modules.lock().get(&hash) {
            return Ok((hash, m.clone()));
        }
        let path = self.cache_dir.join(format!("{hash}.cwasm"));
        let sum_path = self.cache_dir.join(format!("{hash}.sum"));
        if let (Ok(bytes), Ok(sum)) = (std::fs::read(&path), std::fs::read_to_string(&sum_path)) {
            if hex::encode(sha2::Sha256::digest(&bytes)) == sum.trim() {
                // SAFETY: the bytes are this engine's own serialization (checked by checksum).
                if let Ok(m) = unsafe { Module::deserialize(&self.engine, &bytes) } {
                    self.modules.lock().insert(hash.clone(), m.clone());
                    return Ok((hash, m));
                }
            }
        }
        let m = Module::new(&self.engine, wasm).map_err(|e| StoreletError::Invalid(format!("{e:#}")))?;
        self.compiles.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Ok(bytes) = m.serialize() {
            let tmp = self.cache_dir.join(format!("{hash}.tmp"));
            if std::fs::write(&tmp, &bytes).is_ok() && std::fs::rename(&tmp, &path).is_ok() {
                let _ = std::fs::write(&sum_path, hex::encode(sha2::Sha256::digest(&bytes)));
            }
        }
        self.modules.lock().insert(hash.clone(), m.clone());
        Ok((hash, m))
    }

    /// Runs `module` with `args` (argv[0] first), the directory `dir` preopened as `/`
    /// (read-only unless `writable`), under `limits`.
    pub fn run(
        &self,
        module: &Module,
        args: &[String],
        dir: Option<(&Path, bool)>,
        limits: Limits,
    ) -> Result<RunOutcome, StoreletError> {
        let stdout = MemoryOutputPipe::new(limits.output);
        let stderr = MemoryOutputPipe::new(limits.output.min(1 << 20));
        let mut b = WasiCtxBuilder::new();
        b.args(args).stdout(stdout.clone()).stderr(stderr.clone());
        if let Some((path, writable)) = dir {
            let (d, f) = if writable { (DirPerms::all(), FilePerms::all()) } else { (DirPerms::READ, FilePerms::READ) };
            b.preopened_dir(path, "/", d, f).map_err(|e| StoreletError::Setup(format!("preopen: {e:#}")))?;
        }
        let state = RunState { wasi: b.build_p1(), limiter: Limiter { max: limits.memory, peak: 0, denied: false } };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.limiter);
        store.set_fuel(limits.fuel).map_err(|e| StoreletError::Setup(e.to_string()))?;
        let ticks = (limits.wall.as_millis() / EPOCH_TICK.as_millis()).max(1) as u64;
        store.set_epoch_deadline(ticks);
        store.epoch_deadline_trap();
        let started = Instant::now();
        let result = self
            .linker
            .instantiate(&mut store, module)
            .and_then(|i| i.get_typed_func::<(), ()>(&mut store, "_start"))
            .and_then(|start| start.call(&mut store, ()));
        let account = Account {
            fuel: limits.fuel - store.get_fuel().unwrap_or(0),
            peak_memory: store.data().limiter.peak,
            wall: started.elapsed(),
            output: stdout.contents().len() + stderr.contents().len(),
        };
        let denied = store.data().limiter.denied;
        drop(store);
        let exit_code = match result {
            Ok(()) => 0,
            Err(e) => {
                if let Some(exit) = e.downcast_ref::<I32Exit>() {
                    exit.0
                } else {
                    let limit = |limit: &'static str, detail: String| StoreletError::Limit {
                        limit,
                        detail,
                        account: account.clone(),
                    };
                    // A flood fills the pipe and then spins until fuel or time runs out:
                    // the output limit is the real cause, so it is checked first.
                    return Err(match e.downcast_ref::<Trap>() {
                        _ if account.output >= limits.output => limit("output", format!("{} bytes", account.output)),
                        Some(Trap::OutOfFuel) => limit("fuel", format!("used {} units", account.fuel)),
                        Some(Trap::Interrupt) => limit("time", format!("ran longer than {:?}", limits.wall)),
                        _ if denied => limit("memory", format!("wanted more than {} bytes", limits.memory)),
                        _ => StoreletError::Trap(format!("{e:#}")),
                    });
                }
            }
        };
        if account.output >= limits.output {
            return Err(StoreletError::Limit { limit: "output", detail: format!("{} bytes", account.output), account });
        }
        if denied && exit_code != 0 {
            return Err(StoreletError::Limit {
                limit: "memory",
                detail: format!("wanted more than {} bytes", limits.memory),
                account,
            });
        }
        Ok(RunOutcome { exit_code, stdout: stdout.contents().to_vec(), stderr: stderr.contents().to_vec(), account })
    }
}
