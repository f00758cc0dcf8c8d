//! One script call's limits and context: what the interpreter's app data holds while a
//! call runs (its host, limits, deadline, locks, buffer bytes), and how library
//! functions reach it.

use crate::Host;
use locus_proto::ops::Operation;
use locus_proto::{codec, Error as WireError};
use mlua::{Lua, MultiValue, Value as LuaValue};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Resource limits of one script call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Lua VM instructions (counted in steps of [`HOOK_STEP`]).
    pub instructions: u64,
    /// Bytes of Lua memory plus buffers the call may add.
    pub memory: usize,
    /// Wall-clock time, including time spent waiting for locks.
    pub wall: Duration,
    /// Bytes of results plus output buffer.
    pub result_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { instructions: 50_000_000, memory: 32 << 20, wall: Duration::from_secs(5), result_bytes: 16 << 20 }
    }
}

/// What one call runs with; it lives in the interpreter's app data during the call.
pub struct CallCtx {
    pub host: Box<dyn Host>,
    pub limits: Limits,
    pub deadline: Instant,
    /// Instructions run so far (counted by the hook in steps).
    pub instructions: u64,
    /// Set when a limit trips; from then on nothing in the script may continue.
    pub tripped: Option<(&'static str, String)>,
    /// Locks this call holds, released when it ends however it ends.
    pub locks: Vec<String>,
    /// Handles to objects' state this call made (`state.of`), ended when it ends.
    pub handles: Vec<((u64, u64), u64)>,
    /// Bytes held in buffers, which live outside Lua's own memory accounting.
    pub buffer_bytes: usize,
    /// Distinguishes this call as a lock owner.
    pub token: u64,
    /// The call's entry among the running ones (pool calls only).
    pub live: Option<Arc<crate::runs::LiveCall>>,
}

impl CallCtx {
    /// Trips a limit and returns the error that ends the call.
    pub fn trip(&mut self, limit: &'static str, detail: String) -> mlua::Error {
        let e = mlua::Error::runtime(format!("{limit} limit exceeded: {detail}"));
        self.tripped.get_or_insert((limit, detail));
        e
    }
}

/// Runs `f` with the running call's context.
pub(crate) fn with_ctx<R>(lua: &Lua, f: impl FnOnce(&mut CallCtx) -> mlua::Result<R>) -> mlua::Result<R> {
    let mut ctx = lua.app_data_mut::<CallCtx>().ok_or_else(|| mlua::Error::runtime("no call in progress"))?;
    f(&mut ctx)
}

/// An operation's reply and data, or the error the file service answered.
pub(crate) type HostReply<T> = Result<(T, Vec<u8>), WireError>;

/// Runs one operation through the call's host, as the caller.
pub(crate) fn host_call<O: Operation>(lua: &Lua, req: &O, data: &[u8]) -> mlua::Result<HostReply<O::Reply>> {
    with_ctx(lua, |ctx| {
        Ok(ctx.host.call(O::INFO.code, &codec::encode(req), data).and_then(|(metas, out)| {
            let meta = metas.first().map(Vec::as_slice).unwrap_or(&[]);
            Ok((codec::decode(meta)?, out))
        }))
    })
}

/// `nil, message, code`: how a failed `fs.*` call (or any library call that reaches the
/// file service) answers, so a script can test for errors without `pcall`.
pub(crate) fn fail(lua: &Lua, e: locus_proto::Error) -> mlua::Result<MultiValue> {
    Ok(MultiValue::from_iter([
        LuaValue::Nil,
        LuaValue::String(lua.create_string(&e.message)?),
        LuaValue::String(lua.create_string(e.code.name())?),
    ]))
}
