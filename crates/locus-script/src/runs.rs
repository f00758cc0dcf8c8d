//! Script calls on the interpreter pool: those running now (with a way to cancel them)
//! and the last ones that ended, with what they used, for operators (the web console).
//!
//! Calls answered inline on a connection's thread (see `Engine::try_inline`) are too
//! short to list and are not recorded: only calls that reached the pool are.

use locus_proto::{Code, Error as WireError};
use parking_lot::Mutex;
use serde::Serialize;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Ended calls kept.
const RECENT_KEPT: usize = 256;

/// One script call, running or ended.
#[derive(Clone, Debug, Serialize)]
pub struct ScriptRunInfo {
    /// Numbers calls since the server started.
    pub call: u64,
    pub subject: String,
    /// The script's id (SHA-256 of its source).
    pub script: String,
    pub running: bool,
    /// Milliseconds since the Unix epoch when it started.
    pub started_ms: u64,
    pub wall_us: u64,
    /// Lua instructions run (in steps of the limit hook's).
    pub instructions: u64,
    /// Thread CPU time (known once the call ended).
    pub cpu_us: u64,
    /// Lua memory in use when the call ended.
    pub memory: u64,
    /// Bytes of input and of output buffer.
    pub input_bytes: u64,
    pub output_bytes: u64,
    /// `ok`, or the error that ended it (a limit names itself).
    pub outcome: String,
}

/// What a running call shares with the registry: its progress and its cancel flag.
#[derive(Debug, Default)]
pub struct LiveCall {
    pub(crate) instructions: AtomicU64,
    pub(crate) cancelled: AtomicBool,
}

impl LiveCall {
    /// True once someone asked the call to stop.
    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Relaxed)
    }
}

struct Running {
    info: ScriptRunInfo,
    started: Instant,
    live: Arc<LiveCall>,
}

#[derive(Default)]
struct State {
    running: HashMap<u64, Running>,
    recent: VecDeque<ScriptRunInfo>,
}

/// The registry of pool calls.
#[derive(Default)]
pub struct ScriptRuns {
    next: AtomicU64,
    state: Mutex<State>,
}

/// How a call ended, for [`ScriptRuns::ended`].
pub(crate) struct Ending {
    pub cpu_us: u64,
    pub memory: u64,
    pub output_bytes: u64,
    pub outcome: String,
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl ScriptRuns {
    /// Records a call starting; returns its number and what it shares with the registry.
    pub(crate) fn started(&self, subject: &str, script: &str, input_bytes: usize) -> (u64, Arc<LiveCall>) {
        let call = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let live = Arc::new(LiveCall::default());
        let info = ScriptRunInfo {
            call,
            subject: subject.to_string(),
            script: script.to_string(),
            running: true,
            started_ms: now_ms(),
            wall_us: 0,
            instructions: 0,
            cpu_us: 0,
            memory: 0,
            input_bytes: input_bytes as u64,
            output_bytes: 0,
            outcome: String::new(),
        };
        self.state.lock().running.insert(call, Running { info, started: Instant::now(), live: live.clone() });
        (call, live)
    }

    /// Moves a call from the running to the recent ones.
    pub(crate) fn ended(&self, call: u64, end: Ending) {
        let mut state = self.state.lock();
        let Some(r) = state.running.remove(&call) else { return };
        let info = ScriptRunInfo {
            running: false,
            wall_us: r.started.elapsed().as_micros() as u64,
            instructions: r.live.instructions.load(Ordering::Relaxed),
            cpu_us: end.cpu_us,
            memory: end.memory,
            output_bytes: end.output_bytes,
            outcome: end.outcome,
            ..r.info
        };
        if state.recent.len() == RECENT_KEPT {
            state.recent.pop_front();
        }
        state.recent.push_back(info);
    }

    /// Calls running now and those that ended, newest first: `who`'s own, or everyone's
    /// for an admin.
    pub fn list(&self, who: &str, admin: bool) -> (Vec<ScriptRunInfo>, Vec<ScriptRunInfo>) {
        let state = self.state.lock();
        let mine = |i: &ScriptRunInfo| admin || i.subject == who;
        let mut running: Vec<ScriptRunInfo> = state
            .running
            .values()
            .filter(|r| mine(&r.info))
            .map(|r| ScriptRunInfo {
                wall_us: r.started.elapsed().as_micros() as u64,
                instructions: r.live.instructions.load(Ordering::Relaxed),
                ..r.info.clone()
            })
            .collect();
        running.sort_by_key(|r| std::cmp::Reverse(r.call));
        let recent = state.recent.iter().rev().filter(|i| mine(i)).cloned().collect();
        (running, recent)
    }

    /// Asks a running call of `who`'s (any, for an admin) to stop: it ends with
    /// [`crate::ScriptError::Cancelled`] at its next limit check.
    pub fn cancel(&self, who: &str, admin: bool, call: u64) -> Result<(), WireError> {
        let state = self.state.lock();
        match state.running.get(&call) {
            Some(r) if admin || r.info.subject == who => {
                r.live.cancelled.store(true, Ordering::Relaxed);
                Ok(())
            }
            Some(_) => Err(WireError::new(Code::PERM, format!("script call {call} belongs to another subject"))),
            None => Err(WireError::new(Code::NOENT, format!("no script call {call} is running"))),
        }
    }
}
