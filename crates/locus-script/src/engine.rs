//! The script engine: a bounded cache of sources by id, and a pool of interpreter
//! threads, each with one sandboxed Lua state that runs one call at a time.
//!
//! Each interpreter thread is held to one CPU; calls reach them through a [`Pool`],
//! which prefers an idle interpreter of the caller's CPU and never leaves a call waiting
//! behind a long one while another interpreter is idle.

use crate::buffer::Buffer;
use crate::call::{CallCtx, Limits};
use crate::error::ScriptError;
use crate::pool::Pool;
use crate::runs::{Ending, LiveCall, ScriptRuns};
use crate::stdlib::{self, ObjectStates, Shared};
use crate::value::{results_from_lua, to_lua};
use crate::{bindings, script_id, Host};
use locus_proto::types::Value;
use mlua::{ChunkMode, Function, HookTriggers, Lua, LuaOptions, MultiValue, StdLib, Table, Value as LuaValue, VmState};
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// Instructions a call may run on its connection's thread before it moves to an
/// interpreter thread (see [`Engine::try_inline`]).
pub const INLINE_INSTRUCTIONS: u64 = 20_000;

thread_local! {
    /// This thread's interpreter for calls run inline, made at its first such call.
    static INLINE: std::cell::RefCell<Option<Interpreter>> = const { std::cell::RefCell::new(None) };
}

/// A sandboxed Lua state with the global table's metatable and its compiled scripts.
struct Interpreter {
    lua: Lua,
    env_meta: Table,
    compiled: HashMap<String, Compiled>,
}

/// How often (in VM instructions) the limit hook runs.
pub const HOOK_STEP: u32 = 1000;
/// Largest script source accepted.
pub const MAX_SOURCE: usize = 1 << 20;
/// Compiled functions kept per interpreter.
const COMPILED_PER_WORKER: usize = 256;

/// What a successful call gives back.
#[derive(Debug, Clone, PartialEq)]
pub struct CallOutcome {
    pub values: Vec<Value>,
    pub output: Vec<u8>,
}

struct Job {
    id: String,
    source: Arc<str>,
    args: Vec<Value>,
    input: Vec<u8>,
    limits: Limits,
    host: Box<dyn Host>,
    reply: Replier,
}

/// One script call as the engine takes it.
pub struct CallRequest {
    /// The script's id, the SHA-256 of its source (may be empty when `source` is given).
    pub id: String,
    /// The source, registered first when given.
    pub source: Option<String>,
    pub args: Vec<Value>,
    /// The call's input buffer.
    pub input: Vec<u8>,
    pub limits: Limits,
    /// How the script reaches the file service, as its caller.
    pub host: Box<dyn Host>,
}

/// What receives a call's result, on the interpreter thread that ran it: the server
/// writes the reply to the caller's connection from there, with no further hand-off.
pub type ReplyFn = Box<dyn FnOnce(Result<CallOutcome, ScriptError>) + Send>;

/// Calls a [`ReplyFn`] exactly once: with the result, or, if the call is dropped before
/// it ran or while it ran (its interpreter panicked, the engine shut down), with
/// [`ScriptError::Gone`], so a caller never waits for an answer that cannot come.
struct Replier(Option<ReplyFn>);

impl Replier {
    fn send(mut self, result: Result<CallOutcome, ScriptError>) {
        if let Some(reply) = self.0.take() {
            reply(result);
        }
    }

    /// For a call refused before it was queued: the refusal is the caller's answer.
    fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for Replier {
    fn drop(&mut self) {
        if let Some(reply) = self.0.take() {
            reply(Err(ScriptError::Gone));
        }
    }
}

/// A script compiled in one interpreter, with the global table its calls share (emptied
/// after each call) and its `input` and `output` buffers (refilled for each call).
struct Compiled {
    function: Function,
    env: Table,
    input: mlua::AnyUserData,
    output: mlua::AnyUserData,
}

struct Sources {
    by_id: HashMap<String, Arc<str>>,
    order: VecDeque<String>,
    capacity: usize,
}

/// Registered scripts and the interpreters that run them.
pub struct Engine {
    sources: Mutex<Sources>,
    pool: Arc<Pool<Job>>,
    shared: Arc<Shared>,
    runs: Arc<ScriptRuns>,
    checker: Mutex<Lua>,
}

/// The CPUs this process may run on.
fn usable_cpus() -> Vec<usize> {
    match rustix::thread::sched_getaffinity(None) {
        Ok(set) => (0..rustix::thread::CpuSet::MAX_CPU).filter(|&c| set.is_set(c)).collect(),
        Err(_) => Vec::new(),
    }
}

impl Engine {
    /// An engine with `workers` interpreter threads, a cache of `capacity` sources and a
    /// queue of `queue` waiting calls.
    pub fn new(workers: usize, capacity: usize, queue: usize) -> Engine {
        Engine::keeping_state_in(workers, capacity, queue, Arc::new(crate::MemoryState::default()))
    }

    /// An engine as [`Engine::new`] makes, whose scripts keep named values and locks in
    /// `store` (a cluster's heads: the namespace's database).
    pub fn keeping_state_in(
        workers: usize,
        capacity: usize,
        queue: usize,
        store: Arc<dyn crate::StateStore>,
    ) -> Engine {
        let workers = workers.max(1);
        let mut cpus = usable_cpus();
        cpus.truncate(workers);
        let pinned = !cpus.is_empty();
        if !pinned {
            cpus.push(0);
        }
        let shared = Arc::new(Shared::new(store));
        let runs = Arc::new(ScriptRuns::default());
        let pool = Arc::new(Pool::new(queue.max(1)));
        // Interpreters are dealt to the CPUs in turn.
        for &cpu in cpus.iter().cycle().take(workers) {
            let (w, rx) = pool.add_worker(cpu);
            let (its_pool, shared, runs) = (pool.clone(), shared.clone(), runs.clone());
            let spawned = std::thread::Builder::new().name(format!("locus-script-{w}")).spawn(move || {
                if pinned {
                    let mut set = rustix::thread::CpuSet::new();
                    set.set(cpu);
                    if let Err(e) = rustix::thread::sched_setaffinity(None, &set) {
                        tracing::debug!("script worker not held to CPU {cpu}: {e}");
                    }
                }
                worker(w, &its_pool, &rx, shared, runs)
            });
            if let Err(e) = spawned {
                tracing::error!("cannot start script worker: {e}");
                pool.retire(w);
            }
        }
        let checker = Lua::new_with(StdLib::NONE, LuaOptions::new()).expect("a bare Lua state");
        Engine {
            sources: Mutex::new(Sources { by_id: HashMap::new(), order: VecDeque::new(), capacity: capacity.max(1) }),
            pool,
            shared,
            runs,
            checker: Mutex::new(checker),
        }
    }

    /// Gives `job` to an idle interpreter (of this CPU if one is), else queues it.
    fn dispatch(&self, job: Job) -> Result<(), ScriptError> {
        self.pool.dispatch(job, rustix::thread::sched_getcpu()).map_err(|mut job| {
            job.reply.disarm();
            ScriptError::Busy
        })
    }

    /// Checks that `source` compiles and registers it; returns its id.
    pub fn register(&self, source: &str) -> Result<String, ScriptError> {
        if source.len() > MAX_SOURCE {
            return Err(ScriptError::Invalid(format!("scripts are limited to {MAX_SOURCE} bytes")));
        }
        let id = script_id(source);
        if self.sources.lock().by_id.contains_key(&id) {
            return Ok(id);
        }
        self.checker
            .lock()
            .load(source)
            .set_name("=script")
            .set_mode(ChunkMode::Text)
            .into_function()
            .map_err(|e| ScriptError::Compile(first_line(&e.to_string())))?;
        let mut s = self.sources.lock();
        if s.by_id.len() >= s.capacity {
            if let Some(old) = s.order.pop_front() {
                s.by_id.remove(&old);
            }
        }
        s.by_id.insert(id.clone(), Arc::from(source));
        s.order.push_back(id.clone());
        Ok(id)
    }

    /// True if a script of that id is registered (and not evicted).
    pub fn knows(&self, id: &str) -> bool {
        self.sources.lock().by_id.contains_key(id)
    }

    /// The state scripts attach to files (`state.of`), for the server to drop when a file
    /// leaves the export.
    pub fn object_states(&self) -> Arc<ObjectStates> {
        self.shared.objects.clone()
    }

    /// The calls running on the pool and the last that ended.
    pub fn runs(&self) -> &ScriptRuns {
        &self.runs
    }

    /// True if a lock of that name is held now (for tests and diagnostics).
    pub fn lock_held(&self, name: &str) -> bool {
        self.shared.store.is_held(name)
    }

    /// Queues a call (registering its source first if given); `reply` gets the answer on
    /// the interpreter thread when the call ends.
    pub fn call(&self, call: CallRequest, reply: ReplyFn) -> Result<(), ScriptError> {
        let CallRequest { id, source, args, input, limits, host } = call;
        let (id, source) = self.resolve(id, source)?;
        self.dispatch(Job { id, source, args, input, limits, host, reply: Replier(Some(reply)) })
    }

    /// The id and source of a call's script, registering the source first if given.
    fn resolve(&self, id: String, source: Option<String>) -> Result<(String, Arc<str>), ScriptError> {
        let id = match source {
            Some(src) => {
                let real = self.register(&src)?;
                if !id.is_empty() && id != real {
                    return Err(ScriptError::Invalid("the id is not the SHA-256 of the source".into()));
                }
                real
            }
            None => id,
        };
        let source = self.sources.lock().by_id.get(&id).cloned().ok_or_else(|| ScriptError::NoScript(id.clone()))?;
        Ok((id, source))
    }

    /// Runs a call on this thread, as far as it goes within [`INLINE_INSTRUCTIONS`] and
    /// without calling anything that may wait or change state (locks, state, messages,
    /// file operations other than `stat`, `lstat`, `readlink`, `access` and `whoami`).
    /// Answers its outcome; `None` when it went further, having changed nothing: the
    /// caller then hands the same call to [`Engine::call`], where its own limits apply.
    /// A short script that looks something up thus costs no hand-off to an interpreter
    /// thread and back.
    pub fn try_inline(&self, call: CallRequest) -> Option<Result<CallOutcome, ScriptError>> {
        let CallRequest { id, source, args, input, mut limits, host } = call;
        let (id, source) = match self.resolve(id, source) {
            Ok(r) => r,
            Err(e) => return Some(Err(e)),
        };
        limits.instructions = limits.instructions.min(INLINE_INSTRUCTIONS);
        let outcome = INLINE.with(|cell| {
            // Busy (a call within a call cannot happen, but then it is not inline).
            let mut slot = cell.try_borrow_mut().ok()?;
            if slot.is_none() {
                let (lua, env_meta) =
                    sandbox(self.shared.clone(), true).map_err(|e| tracing::warn!("inline sandbox: {e}")).ok()?;
                *slot = Some(Interpreter { lua, env_meta, compiled: HashMap::new() });
            }
            let i = slot.as_mut()?;
            let run =
                run(&i.lua, &self.shared, &i.env_meta, &mut i.compiled, &id, &source, args, input, limits, host, None);
            Some(run)
        })?;
        match outcome {
            // A limit: the inline budget, a call that must go to the pool, or one of the
            // call's own limits, which the pool applies again with its full budget.
            Err(ScriptError::Limit { .. }) => None,
            other => Some(other),
        }
    }
}

impl Drop for Engine {
    /// Ends the interpreter threads: idle ones at once, busy ones after their call;
    /// waiting calls are answered [`ScriptError::Gone`].
    fn drop(&mut self) {
        self.pool.close();
    }
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or(s).to_string()
}

static CALL_TOKENS: AtomicU64 = AtomicU64::new(1);

/// Nice value of interpreter threads: when scripts and connections compete for a CPU,
/// the connections win.
const WORKER_NICE: i32 = 10;

/// One interpreter thread (number `w` of the pool): takes calls until the engine is gone.
fn worker(w: usize, pool: &Pool<Job>, rx: &mpsc::Receiver<Job>, shared: Arc<Shared>, runs: Arc<ScriptRuns>) {
    /// Tells the pool this worker ended, however it ends (a panic included).
    struct Retire<'a>(&'a Pool<Job>, usize);
    impl Drop for Retire<'_> {
        fn drop(&mut self) {
            self.0.retire(self.1);
        }
    }
    let _retire = Retire(pool, w);
    // Computation yields to the file service: on Linux this sets this thread's nice value.
    if let Err(e) = rustix::process::setpriority_process(None, WORKER_NICE) {
        tracing::debug!("script worker priority unchanged: {e}");
    }
    let (lua, env_meta) = match sandbox(shared.clone(), false) {
        Ok(s) => s,
        Err(e) => return tracing::error!("script sandbox: {e}"),
    };
    let mut compiled: HashMap<String, Compiled> = HashMap::new();
    while let Some(job) = pool.next(w, rx) {
        let Job { id, source, args, input, limits, host, reply } = job;
        let (call, live) = runs.started(host.subject(), &id, input.len());
        let cpu = thread_cpu();
        let result = run(&lua, &shared, &env_meta, &mut compiled, &id, &source, args, input, limits, host, Some(live));
        runs.ended(
            call,
            Ending {
                cpu_us: thread_cpu().saturating_sub(cpu).as_micros() as u64,
                memory: lua.used_memory() as u64,
                output_bytes: result.as_ref().map_or(0, |o| o.output.len() as u64),
                outcome: match &result {
                    Ok(_) => "ok".into(),
                    Err(e) => e.to_string(),
                },
            },
        );
        reply.send(result);
    }
}

/// Builds a sandboxed interpreter: only the string, table, math and utf8 libraries; no
/// way to load code or bytecode, touch files or the process; library tables read-only.
/// Returns it with the metatable that each call's fresh global table gets. In an
/// `inline` one (see [`Engine::try_inline`]), `state`, `lock`, `msg` and every `fs` call
/// but a lookup end the call.
fn sandbox(shared: Arc<Shared>, inline: bool) -> mlua::Result<(Lua, Table)> {
    let lua = Lua::new_with(StdLib::STRING | StdLib::TABLE | StdLib::MATH | StdLib::UTF8, LuaOptions::new())?;
    let g = lua.globals();
    for name in ["dofile", "loadfile", "load", "require", "collectgarbage", "print", "rawset"] {
        g.raw_set(name, LuaValue::Nil)?;
    }
    g.get::<Table>("string")?.raw_set("dump", LuaValue::Nil)?;
    g.raw_set("pcall", lua.create_function(protected_call)?)?;
    g.raw_set("xpcall", lua.create_function(protected_call_with_handler)?)?;
    bindings::install(&lua, &g)?;
    stdlib::install(&lua, &g, shared)?;
    if inline {
        let moves = lua.create_function(|lua, _: MultiValue| -> mlua::Result<()> {
            let mut ctx = lua.app_data_mut::<CallCtx>().ok_or_else(|| mlua::Error::runtime("no call in progress"))?;
            Err(ctx.trip("inline", "a call that may wait or change state".into()))
        })?;
        for library in ["state", "lock", "msg", "fs"] {
            let t = g.get::<Table>(library)?;
            let names: Vec<String> =
                t.pairs::<String, LuaValue>().map(|kv| kv.map(|(k, _)| k)).collect::<mlua::Result<_>>()?;
            let lookup = |name: &str| {
                library == "fs" && locus_proto::ops::by_name(name).is_some_and(|op| bindings::looks_only(op.code))
            };
            for name in names.into_iter().filter(|n| !lookup(n)) {
                t.raw_set(name, moves.clone())?;
            }
        }
    }
    lua.load(
        r#"
        local setmetatable, error = setmetatable, error
        local function readonly(t)
            return setmetatable({}, {__index = t, __newindex = function() error("read-only table", 2) end, __metatable = false})
        end
        for _, name in ipairs({"string", "table", "math", "utf8", "fs", "buffer", "state", "lock", "msg", "time"}) do
            _G[name] = readonly(_G[name])
        end
        local strmeta = getmetatable("")
        strmeta.__index = _G.string
        strmeta.__metatable = false
        "#,
    )
    .set_name("=sandbox")
    .exec()?;
    g.raw_set("_G", LuaValue::Nil)?;
    let meta = lua.create_table()?;
    meta.raw_set("__index", g)?;
    meta.raw_set("__metatable", false)?;
    lua.set_hook(HookTriggers::new().every_nth_instruction(HOOK_STEP), |lua, _| {
        let Some(mut ctx) = lua.app_data_mut::<CallCtx>() else { return Ok(VmState::Continue) };
        ctx.instructions += HOOK_STEP as u64;
        if let Some((limit, detail)) = ctx.tripped.clone() {
            return Err(mlua::Error::runtime(format!("{limit} limit exceeded: {detail}")));
        }
        if let Some(live) = &ctx.live {
            live.instructions.store(ctx.instructions, Ordering::Relaxed);
            if live.is_cancelled() {
                return Err(ctx.trip("cancel", "cancelled".into()));
            }
        }
        if ctx.instructions > ctx.limits.instructions {
            let detail = format!("more than {} instructions", ctx.limits.instructions);
            return Err(ctx.trip("instruction", detail));
        }
        if Instant::now() > ctx.deadline {
            let detail = format!("ran longer than {:?}", ctx.limits.wall);
            return Err(ctx.trip("time", detail));
        }
        Ok(VmState::Continue)
    })?;
    Ok((lua, meta))
}

/// True when the error must not be caught by the script: a limit has tripped.
fn fatal(lua: &Lua, e: &mlua::Error) -> bool {
    let mut ctx = lua.app_data_mut::<CallCtx>();
    if let (mlua::Error::MemoryError(m), Some(ctx)) = (e, ctx.as_mut()) {
        ctx.trip("memory", m.clone());
    }
    ctx.is_some_and(|c| c.tripped.is_some())
}

fn error_value(lua: &Lua, e: &mlua::Error) -> mlua::Result<LuaValue> {
    let text = match e {
        mlua::Error::RuntimeError(m) => m.clone(),
        mlua::Error::CallbackError { cause, .. } => cause.to_string(),
        other => other.to_string(),
    };
    Ok(LuaValue::String(lua.create_string(first_line(&text))?))
}

/// `pcall` that lets limit errors through, so a script cannot catch its way past them.
fn protected_call(lua: &Lua, (f, args): (LuaValue, MultiValue)) -> mlua::Result<MultiValue> {
    let LuaValue::Function(f) = f else {
        return Ok(MultiValue::from_iter([
            LuaValue::Boolean(false),
            LuaValue::String(lua.create_string("attempt to call a non-function")?),
        ]));
    };
    match f.call::<MultiValue>(args) {
        Ok(values) => Ok(succeeded(values)),
        Err(e) if fatal(lua, &e) => Err(e),
        Err(e) => Ok(MultiValue::from_iter([LuaValue::Boolean(false), error_value(lua, &e)?])),
    }
}

/// `true` followed by a call's results, as `pcall` answers.
fn succeeded(values: MultiValue) -> MultiValue {
    let mut out = MultiValue::from_iter([LuaValue::Boolean(true)]);
    out.extend(values);
    out
}

/// `xpcall` with the same rule as [`protected_call`].
fn protected_call_with_handler(
    lua: &Lua,
    (f, handler, args): (Function, Function, MultiValue),
) -> mlua::Result<MultiValue> {
    match f.call::<MultiValue>(args) {
        Ok(values) => Ok(succeeded(values)),
        Err(e) if fatal(lua, &e) => Err(e),
        Err(e) => {
            let mut out = MultiValue::from_iter([LuaValue::Boolean(false)]);
            out.extend(handler.call::<MultiValue>(error_value(lua, &e)?)?);
            Ok(out)
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn run(
    lua: &Lua,
    shared: &Shared,
    env_meta: &Table,
    compiled: &mut HashMap<String, Compiled>,
    id: &str,
    source: &str,
    args: Vec<Value>,
    input: Vec<u8>,
    limits: Limits,
    host: Box<dyn Host>,
    live: Option<Arc<LiveCall>>,
) -> Result<CallOutcome, ScriptError> {
    if !compiled.contains_key(id) {
        let compile = || -> mlua::Result<Compiled> {
            let function = lua.load(source).set_name("=script").set_mode(ChunkMode::Text).into_function()?;
            // The environment is set once here: setting it per call makes mlua load a
            // helper chunk each time. Each call starts from it emptied (see below).
            let env = lua.create_table()?;
            env.set_metatable(Some(env_meta.clone()))?;
            function.set_environment(env.clone())?;
            let (input, output) = (lua.create_userdata(Buffer(Vec::new()))?, lua.create_userdata(Buffer(Vec::new()))?);
            Ok(Compiled { function, env, input, output })
        };
        let c = compile().map_err(|e| ScriptError::Compile(first_line(&e.to_string())))?;
        if compiled.len() >= COMPILED_PER_WORKER {
            compiled.clear();
        }
        compiled.insert(id.to_string(), c);
    }
    let Compiled { function: f, env, input: input_buffer, output: output_buffer } = &compiled[id];
    // The buffers are empty between calls (see the end of this function); the input goes
    // in last, so a call refused here leaves nothing behind.
    let setup = || -> mlua::Result<MultiValue> {
        let mut lua_args = MultiValue::new();
        for a in &args {
            lua_args.push_back(to_lua(lua, a)?);
        }
        env.raw_set("_G", env)?;
        env.raw_set("input", input_buffer)?;
        env.raw_set("output", output_buffer)?;
        input_buffer.borrow_mut::<Buffer>()?.0 = input;
        Ok(lua_args)
    };
    let lua_args = setup().map_err(|e| ScriptError::Invalid(format!("script arguments: {e}")))?;
    let token = CALL_TOKENS.fetch_add(1, Ordering::Relaxed);
    let started = Instant::now();
    lua.set_app_data(CallCtx {
        host,
        limits,
        deadline: started + limits.wall,
        instructions: 0,
        tripped: None,
        locks: Vec::new(),
        handles: Vec::new(),
        buffer_bytes: 0,
        token,
        live,
    });
    let _ = lua.set_memory_limit(lua.used_memory().saturating_add(limits.memory));
    let result = f.call::<MultiValue>(lua_args);
    let _ = lua.set_memory_limit(0);
    let output = env
        .raw_get::<mlua::AnyUserData>("output")
        .ok()
        .and_then(|u| u.borrow_mut::<Buffer>().ok().map(|mut b| std::mem::take(&mut b.0)))
        .unwrap_or_default();
    // The next call of this script starts with no globals of this one, and its buffers
    // hold nothing between calls.
    let _ = env.clear();
    for buffer in [input_buffer, output_buffer] {
        if let Ok(mut b) = buffer.borrow_mut::<Buffer>() {
            b.0 = Vec::new();
        }
    }
    let ctx = lua.remove_app_data::<CallCtx>().expect("set above");
    for name in &ctx.locks {
        shared.store.release(name, token);
    }
    for &(object, handle) in &ctx.handles {
        shared.objects.end_handle(object, handle);
    }
    let values = match result {
        Err(_) if ctx.tripped.as_ref().is_some_and(|(limit, _)| *limit == "cancel") => {
            return Err(ScriptError::Cancelled)
        }
        Err(_) if ctx.tripped.is_some() => {
            let (limit, detail) = ctx.tripped.clone().expect("checked");
            return Err(ScriptError::Limit { limit, detail });
        }
        Err(mlua::Error::MemoryError(m)) => return Err(ScriptError::Limit { limit: "memory", detail: m }),
        Err(e) => {
            let text = first_line(&match &e {
                mlua::Error::CallbackError { cause, .. } => cause.to_string(),
                other => other.to_string(),
            });
            if text.contains("stack overflow") {
                return Err(ScriptError::Limit { limit: "stack", detail: text });
            }
            return Err(ScriptError::Runtime(text));
        }
        Ok(v) => v,
    };
    let out = results_from_lua(lua, &values).map_err(|e| ScriptError::Runtime(format!("result: {e}")))?;
    let size = locus_proto::codec::encoded_len(&out) + output.len();
    if size > limits.result_bytes {
        return Err(ScriptError::Limit {
            limit: "result",
            detail: format!("{size} bytes of results, more than {}", limits.result_bytes),
        });
    }
    Ok(CallOutcome { values: out, output })
}

/// CPU time the calling thread has used.
fn thread_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;

    #[test]
    fn a_reply_is_sent_once_and_a_lost_call_still_answers() {
        let (tx, rx) = channel();
        let replier = |tx: mpsc::Sender<_>| Replier(Some(Box::new(move |r| tx.send(r).unwrap())));
        replier(tx.clone()).send(Ok(CallOutcome { values: vec![Value::Int(1)], output: Vec::new() }));
        assert_eq!(rx.try_recv().unwrap().unwrap().values, vec![Value::Int(1)]);
        assert!(rx.try_recv().is_err(), "sent once");
        drop(replier(tx.clone()));
        assert!(matches!(rx.try_recv().unwrap(), Err(ScriptError::Gone)));
        let mut refused = replier(tx);
        refused.disarm();
        drop(refused);
        assert!(rx.try_recv().is_err(), "a refused call is answered by its refusal alone");
    }

    /// A host with no files: enough for calls that touch none.
    struct NoFiles;

    impl Host for NoFiles {
        fn call(&mut self, _: u16, _: &[u8], _: &[u8]) -> Result<(Vec<Vec<u8>>, Vec<u8>), locus_proto::Error> {
            Err(locus_proto::Error::new(locus_proto::Code::NOTSUP, "no files here"))
        }
        fn push(&self, _: u64, _: &[u8]) -> bool {
            false
        }
        fn caller(&self) -> u64 {
            1
        }
        fn subject(&self) -> &str {
            "tester"
        }
    }

    #[test]
    fn a_dropped_engine_answers_the_calls_that_wait_and_ends_the_running_one() {
        let engine = Engine::new(1, 4, 4);
        let (tx, rx) = channel();
        let limits = Limits { instructions: u64::MAX / 2, ..Limits::default() };
        for source in ["local t = time.now() while time.now() - t < 0.5 do end return 1", "return 2"] {
            let tx = tx.clone();
            let call = CallRequest {
                id: String::new(),
                source: Some(source.into()),
                args: vec![],
                input: vec![],
                limits: limits.clone(),
                host: Box::new(NoFiles),
            };
            engine.call(call, Box::new(move |r| drop(tx.send(r.map(|o| o.values))))).unwrap();
        }
        std::thread::sleep(Duration::from_millis(100));
        drop(engine);
        let first = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert!(matches!(first, Err(ScriptError::Gone)), "the waiting call: {first:?}");
        let second = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(second.unwrap(), vec![Value::Int(1)], "the running call ends as it would");
    }
}
