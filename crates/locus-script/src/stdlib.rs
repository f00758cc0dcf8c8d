//! The scripts' standard library besides `fs`: `buffer`, `state` (named values, global or
//! attached to a file), `lock`, `msg`, `time`, and the per-call context they work in.

use crate::buffer::charge;
use crate::buffer::{bytes_of, Buffer};
use crate::call::fail;
use crate::call::{host_call, with_ctx};
use crate::state_store::{self, Change, Scope, StateStore};
use crate::value::{from_lua, to_lua};
use locus_proto::ops;
use locus_proto::types::Value;
use mlua::{Lua, MultiValue, Table, UserData, UserDataMethods, Value as LuaValue};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::state_store::MAX_STATE_VALUE;

/// State shared by every call on every interpreter.
pub struct Shared {
    /// Where named values and locks are kept (this server's memory, or a cluster's
    /// database).
    pub store: Arc<dyn StateStore>,
    pub objects: Arc<ObjectStates>,
}

impl Shared {
    /// Shared state kept in `store`.
    pub fn new(store: Arc<dyn StateStore>) -> Shared {
        Shared { objects: Arc::new(ObjectStates { store: store.clone(), handles: Mutex::default() }), store }
    }

    /// The calling subject's own scope (`state.*`): one subject's scripts cannot read
    /// another's. What subjects share goes in a file's state, which its ACL governs.
    fn own_scope(lua: &Lua) -> mlua::Result<Scope> {
        with_ctx(lua, |ctx| Ok(Scope::Subject(ctx.host.subject().to_string())))
    }
}

/// Longest key of a named value, and longest lock name, in bytes.
const MAX_KEY: usize = 1024;

/// Refuses a key or lock name longer than [`MAX_KEY`].
fn checked_key(key: &str) -> mlua::Result<()> {
    if key.len() > MAX_KEY {
        return Err(mlua::Error::runtime(format!("state keys and lock names are limited to {MAX_KEY} bytes")));
    }
    Ok(())
}

/// A store's refusal, as the script sees it.
fn refused(e: String) -> mlua::Error {
    mlua::Error::runtime(e)
}

/// `key` of `scope`, as the script sees it (nil if unset).
fn get_value(store: &dyn StateStore, lua: &Lua, scope: &Scope, key: &str) -> mlua::Result<LuaValue> {
    checked_key(key)?;
    store.get(scope, key).map_err(refused)?.map_or(Ok(LuaValue::Nil), |v| to_lua(lua, &v))
}

/// Applies `change` to `key` of `scope`; what it answers, as the script sees it.
fn update_value(store: &dyn StateStore, lua: &Lua, scope: &Scope, key: &str, change: Change) -> mlua::Result<LuaValue> {
    checked_key(key)?;
    to_lua(lua, &store.update(scope, key, change).map_err(refused)?)
}

/// The values of files (`state.of`), and the handles calls hold to them. Values follow a
/// file across renames, as an open handle does, and are dropped when the file leaves the
/// export ([`ObjectStates::forget`], which the server calls when it removes one).
pub struct ObjectStates {
    store: Arc<dyn StateStore>,
    handles: Mutex<Handles>,
}

#[derive(Default)]
struct Handles {
    /// Handles (`state.of`) of calls in progress, by object. A removal ends them, so a
    /// handle to a removed file cannot attach state to a later file that is given the
    /// same inode number.
    live: HashMap<(u64, u64), Vec<u64>>,
    ended: std::collections::HashSet<u64>,
    next: u64,
}

impl Handles {
    /// Takes `token` off `object`'s live handles; true if it was there.
    fn unlist(&mut self, object: (u64, u64), token: u64) -> bool {
        let Some(tokens) = self.live.get_mut(&object) else { return false };
        let before = tokens.len();
        tokens.retain(|&t| t != token);
        let found = tokens.len() < before;
        if tokens.is_empty() {
            self.live.remove(&object);
        }
        found
    }
}

impl ObjectStates {
    /// Drops what is attached to `object` and ends the handles to it.
    pub fn forget(&self, object: (u64, u64)) {
        let mut handles = self.handles.lock();
        self.store.forget(&Scope::Object(object.0, object.1));
        if let Some(tokens) = handles.live.remove(&object) {
            handles.ended.extend(tokens);
        }
    }

    /// True while an object may have state attached or a call holds a handle to one:
    /// only then do removals need to be reported.
    pub fn watching(&self) -> bool {
        !self.handles.lock().live.is_empty() || self.store.watching()
    }

    /// How many objects have state attached (0 where the store cannot count them).
    pub fn len(&self) -> usize {
        self.store.objects_with_state().unwrap_or(0)
    }

    /// True when no object has state attached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A handle to `object` for the call in progress.
    fn open_handle(&self, object: (u64, u64)) -> u64 {
        let mut handles = self.handles.lock();
        handles.next += 1;
        let token = handles.next;
        handles.live.entry(object).or_default().push(token);
        token
    }

    /// Ends a handle when its call ends (it can no longer attach anything).
    pub(crate) fn end_handle(&self, object: (u64, u64), token: u64) {
        let mut handles = self.handles.lock();
        if handles.unlist(object, token) {
            handles.ended.insert(token);
        }
    }

    /// Forgets a handle whose Lua value is gone.
    fn drop_handle(&self, object: (u64, u64), token: u64) {
        let mut handles = self.handles.lock();
        handles.unlist(object, token);
        handles.ended.remove(&token);
    }

    /// Applies `change` to `key` of `object`, unless the handle `token` has ended
    /// because its object was removed. (The handles' lock is held through the change, so
    /// a removal cannot come between the check and it; not while the answer becomes a
    /// Lua value, whose allocation may collect a dropped handle, which takes the lock.)
    fn update(&self, lua: &Lua, object: (u64, u64), token: u64, key: &str, change: Change) -> mlua::Result<LuaValue> {
        checked_key(key)?;
        let changed = {
            let handles = self.handles.lock();
            if handles.ended.contains(&token) {
                return Err(mlua::Error::runtime("the file was removed or replaced since state.of gave this handle"));
            }
            self.store.update(&Scope::Object(object.0, object.1), key, change).map_err(refused)?
        };
        to_lua(lua, &changed)
    }
}

/// What `state.of(path)` answers: the state of the object at `path` when it was asked,
/// usable until the call ends or the object leaves the export.
struct ObjectState {
    object: (u64, u64),
    token: u64,
    objects: Arc<ObjectStates>,
}

impl Drop for ObjectState {
    fn drop(&mut self) {
        self.objects.drop_handle(self.object, self.token);
    }
}

impl UserData for ObjectState {
    fn add_methods<M: UserDataMethods<Self>>(m: &mut M) {
        m.add_method("get", |lua, o, key: String| {
            get_value(&*o.objects.store, lua, &Scope::Object(o.object.0, o.object.1), &key)
        });
        m.add_method("set", |lua, o, (key, v): (String, LuaValue)| {
            let value = checked_state_value(&v)?;
            o.objects.update(lua, o.object, o.token, &key, &mut state_store::set(value)).map(drop)
        });
        m.add_method("incr", |lua, o, (key, by): (String, Option<i64>)| {
            o.objects.update(lua, o.object, o.token, &key, &mut state_store::incr(&key, by.unwrap_or(1)))
        });
        m.add_method("push", |lua, o, (key, v): (String, LuaValue)| {
            let value = checked_state_value(&v)?;
            o.objects.update(lua, o.object, o.token, &key, &mut state_store::push(&key, value))
        });
        m.add_method("take", |lua, o, key: String| {
            o.objects.update(lua, o.object, o.token, &key, &mut state_store::take)
        });
    }
}

fn checked_state_value(v: &LuaValue) -> mlua::Result<Value> {
    let value = from_lua(v, 0)?;
    if locus_proto::codec::encode(&value).len() > MAX_STATE_VALUE {
        return Err(mlua::Error::runtime(format!("state values are limited to {MAX_STATE_VALUE} bytes")));
    }
    Ok(value)
}

/// Installs `buffer`, `state`, `lock`, `msg` and `time` into `g`.
pub fn install(lua: &Lua, g: &Table, shared: Arc<Shared>) -> mlua::Result<()> {
    let buffer = lua.create_table()?;
    buffer.set(
        "new",
        lua.create_function(|lua, init: Option<LuaValue>| {
            let bytes = init.as_ref().map(bytes_of).transpose()?.unwrap_or_default();
            charge(lua, bytes.len())?;
            Ok(Buffer(bytes))
        })?,
    )?;

    buffer.set(
        "read",
        lua.create_function(|lua, (handle, offset, len): (u64, u64, u32)| {
            charge(lua, len as usize)?;
            match host_call(lua, &ops::Pread { handle, offset, len }, &[])? {
                Ok(((), data)) => Ok(MultiValue::from_iter([LuaValue::UserData(lua.create_userdata(Buffer(data))?)])),
                Err(e) => fail(lua, e),
            }
        })?,
    )?;
    g.set("buffer", buffer)?;

    let state = lua.create_table()?;
    let s = shared.clone();
    state.set(
        "get",
        lua.create_function(move |lua, key: String| get_value(&*s.store, lua, &Shared::own_scope(lua)?, &key))?,
    )?;
    let s = shared.clone();
    state.set(
        "set",
        lua.create_function(move |lua, (key, v): (String, LuaValue)| {
            let value = checked_state_value(&v)?;
            update_value(&*s.store, lua, &Shared::own_scope(lua)?, &key, &mut state_store::set(value)).map(drop)
        })?,
    )?;
    let s = shared.clone();
    state.set(
        "incr",
        lua.create_function(move |lua, (key, by): (String, Option<i64>)| {
            update_value(&*s.store, lua, &Shared::own_scope(lua)?, &key, &mut state_store::incr(&key, by.unwrap_or(1)))
        })?,
    )?;
    let s = shared.clone();
    state.set(
        "push",
        lua.create_function(move |lua, (key, v): (String, LuaValue)| {
            let value = checked_state_value(&v)?;
            update_value(&*s.store, lua, &Shared::own_scope(lua)?, &key, &mut state_store::push(&key, value))
        })?,
    )?;
    let s = shared.clone();
    state.set(
        "take",
        lua.create_function(move |lua, key: String| {
            update_value(&*s.store, lua, &Shared::own_scope(lua)?, &key, &mut state_store::take)
        })?,
    )?;
    let objects = shared.objects.clone();
    state.set(
        "of",
        lua.create_function(move |lua, path: String| {
            // The caller's own rights decide: whoever may read the file may use its state,
            // as whoever may open a file may lock it.
            if let Err(e) = host_call(lua, &ops::Access { path: path.clone(), mode: 4 }, &[])? {
                return fail(lua, e);
            }
            let attr = match host_call(lua, &ops::Stat { path }, &[])? {
                Ok((attr, _)) => attr,
                Err(e) => return fail(lua, e),
            };
            let object = (attr.dev, attr.ino);
            let token = objects.open_handle(object);
            with_ctx(lua, |ctx| {
                ctx.handles.push((object, token));
                Ok(())
            })?;
            let handle = ObjectState { object, token, objects: objects.clone() };
            Ok(MultiValue::from_iter([LuaValue::UserData(lua.create_userdata(handle)?)]))
        })?,
    )?;
    g.set("state", state)?;

    let lock = lua.create_table()?;
    let s = shared.clone();
    lock.set(
        "acquire",
        lua.create_function(move |lua, (name, timeout_ms): (String, Option<u64>)| {
            checked_key(&name)?;
            let (owner, until, lease) = with_ctx(lua, |ctx| {
                let wait = Duration::from_millis(timeout_ms.unwrap_or(u64::MAX / 4));
                Ok((ctx.token, (Instant::now() + wait).min(ctx.deadline), ctx.deadline))
            })?;
            let got = s.store.acquire(&name, owner, until, lease);
            if got {
                with_ctx(lua, |ctx| {
                    if !ctx.locks.contains(&name) {
                        ctx.locks.push(name);
                    }
                    Ok(())
                })?;
            }
            Ok(got)
        })?,
    )?;
    let s = shared.clone();
    lock.set(
        "release",
        lua.create_function(move |lua, name: String| {
            checked_key(&name)?;
            let owner = with_ctx(lua, |ctx| {
                ctx.locks.retain(|l| *l != name);
                Ok(ctx.token)
            })?;
            Ok(s.store.release(&name, owner))
        })?,
    )?;
    g.set("lock", lock)?;

    let msg = lua.create_table()?;
    msg.set(
        "send",
        lua.create_function(|lua, (client, data): (u64, LuaValue)| {
            let bytes = bytes_of(&data)?;
            with_ctx(lua, |ctx| Ok(ctx.host.push(client, &bytes)))
        })?,
    )?;
    msg.set("caller", lua.create_function(|lua, ()| with_ctx(lua, |ctx| Ok(ctx.host.caller())))?)?;
    g.set("msg", msg)?;

    let time = lua.create_table()?;
    time.set(
        "now",
        lua.create_function(|_, ()| {
            Ok(std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0))
        })?,
    )?;
    g.set("time", time)?;
    Ok(())
}
