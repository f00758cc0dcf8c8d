//! Scripts' named values and locks on a head, kept in the namespace (`script_values`,
//! `script_locks`) so that every head of a cluster shares them: a counter a call through
//! one head raises, a call through another reads; a lock one holds, the others wait for.

use crate::cluster::Head;
use locus_proto::codec;
use locus_proto::types::Value;
use locus_script::{Scope, StateStore, MAX_OBJECTS, MAX_STATE_VALUE};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The longest a waiting `lock.acquire` sleeps between tries (it starts at 1 ms).
const LOCK_POLL_MAX: Duration = Duration::from_millis(25);

/// How long past its call's deadline a lock lasts, unless released: room for a host
/// call that outlasts the deadline (the deadline is checked between Lua instructions)
/// and for the heads' clocks to differ.
const LOCK_MARGIN: Duration = Duration::from_secs(30);

/// How long a head trusts its last look at whether any file has values attached.
const WATCHING_FRESH: Duration = Duration::from_secs(2);

/// The [`StateStore`] of a head.
pub struct HeadScriptState {
    head: Arc<Head>,
    /// Whether some file had values attached at the last look, and when that was: a
    /// removal deletes a file's values only then, so that removals cost no extra
    /// transaction while scripts attach nothing. (A value another head attached within
    /// the last look's age may outlive its file: object ids are never reused, so it is
    /// never read again.)
    watching: parking_lot::Mutex<(Option<Instant>, bool)>,
}

impl HeadScriptState {
    pub fn new(head: Arc<Head>) -> HeadScriptState {
        HeadScriptState { head, watching: parking_lot::Mutex::new((None, false)) }
    }

    /// A lock's owner: this head and the call's token (tokens are per process).
    fn owner(&self, token: u64) -> String {
        format!("{:016x}.{token}", self.head.id)
    }
}

/// A scope's name in `script_values`.
fn scope_name(scope: &Scope) -> String {
    match scope {
        Scope::Subject(s) => format!("s:{s}"),
        // A head's files are all on device 0: the object names one.
        Scope::Object(_, object) => locus_cluster::object_scope(*object),
    }
}

fn decoded(bytes: Vec<u8>) -> Result<Value, String> {
    codec::decode(&bytes).map_err(|e| format!("a stored state value does not decode: {e}"))
}

fn engine(e: locus_cluster::MetaError) -> String {
    format!("the namespace could not keep script state: {e}")
}

impl StateStore for HeadScriptState {
    fn get(&self, scope: &Scope, key: &str) -> Result<Option<Value>, String> {
        self.head.meta.script_value(&scope_name(scope), key).map_err(engine)?.map(decoded).transpose()
    }

    fn update(&self, scope: &Scope, key: &str, change: locus_script::Change) -> Result<Value, String> {
        let limits = locus_cluster::ValueLimits { keys: scope.max_keys() as u64, files: Some(MAX_OBJECTS as u64) };
        if let Scope::Object(..) = scope {
            *self.watching.lock() = (Some(Instant::now()), true);
        }
        let answer = self.head.meta.update_script_value(&scope_name(scope), key, &limits, |slot| {
            let mut value = slot.take().map(decoded).transpose()?;
            let answer = change(&mut value)?;
            *slot = value.map(|v| codec::encode(&v));
            if slot.as_ref().is_some_and(|v| v.len() > MAX_STATE_VALUE) {
                return Err(format!("state values are limited to {MAX_STATE_VALUE} bytes: {key:?} would pass that"));
            }
            Ok(answer)
        });
        answer.map_err(engine)?
    }

    fn forget(&self, scope: &Scope) {
        if let Err(e) = self.head.meta.forget_script_values(&scope_name(scope)) {
            tracing::warn!("script state of a removed file stays in the namespace: {e}");
        }
    }

    fn watching(&self) -> bool {
        let mut watching = self.watching.lock();
        if watching.0.is_none_or(|at| at.elapsed() >= WATCHING_FRESH) {
            let any = self.head.meta.any_file_values().unwrap_or(true);
            *watching = (Some(Instant::now()), any);
        }
        watching.1
    }

    fn acquire(&self, name: &str, owner: u64, until: Instant, lease: Instant) -> bool {
        let owner = self.owner(owner);
        let mut pause = Duration::from_millis(1);
        let mut warned = false;
        loop {
            let left = lease.saturating_duration_since(Instant::now()) + LOCK_MARGIN;
            let lapses = locus_cluster::now_ns().saturating_add(left.as_nanos().min(i64::MAX as u128) as i64);
            match self.head.meta.try_script_lock(name, &owner, lapses) {
                Ok(true) => return true,
                Ok(false) => {}
                Err(e) if !warned => {
                    warned = true;
                    tracing::warn!("script lock {name:?}: {e} (trying again until the call's timeout)");
                }
                Err(_) => {}
            }
            let now = Instant::now();
            if now >= until {
                return false;
            }
            std::thread::sleep(pause.min(until - now));
            pause = (pause * 2).min(LOCK_POLL_MAX);
        }
    }

    fn release(&self, name: &str, owner: u64) -> bool {
        self.head.meta.release_script_lock(name, &self.owner(owner)).unwrap_or_else(|e| {
            tracing::warn!("script lock {name:?} stays until it lapses: {e}");
            false
        })
    }

    fn is_held(&self, name: &str) -> bool {
        self.head.meta.script_lock_held(name).unwrap_or(false)
    }
}
