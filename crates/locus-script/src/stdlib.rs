//! The scripts' standard library besides `fs`: `buffer`, `state` (named values, global or
//! attached to a file), `lock`, `msg`, `time`, and the per-call context they work in.

use crate::buffer::charge;
use crate::buffer::{bytes_of, Buffer};
use crate::call::fail;
use crate::call::{host_call, with_ctx};
use crate::value::{from_lua, to_lua};
use locus_proto::ops;
use locus_proto::types::Value;
use mlua::{Lua, MultiValue, Table, UserData, UserDataMethods, Value as LuaValue};
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Named state entries kept at most (scripts share them across calls).
const MAX_STATE_KEYS: usize = 100_000;
/// Objects with state attached kept at most, and entries each.
const MAX_OBJECTS: usize = 100_000;
const MAX_OBJECT_KEYS: usize = 1_000;
/// Largest encoded value one state entry may hold.
const MAX_STATE_VALUE: usize = 1 << 20;

/// State shared by every call on every interpreter.
#[derive(Default)]
pub struct Shared {
    pub locks: LockTable,
    /// Each subject's own named values (`state.*`): one subject's scripts cannot read
    /// another's. What subjects share goes in a file's state, which its ACL governs.
    pub state: Mutex<HashMap<String, Entries>>,
    pub objects: Arc<ObjectStates>,
}

impl Shared {
    /// Runs `f` on the calling subject's named values (dropping them once empty).
    fn own_state<R>(&self, lua: &Lua, f: impl FnOnce(&mut Entries) -> R) -> mlua::Result<R> {
        let subject = with_ctx(lua, |ctx| Ok(ctx.host.subject().to_string()))?;
        let mut all = self.state.lock();
        let entries = all.entry(subject.clone()).or_default();
        let r = f(entries);
        if entries.0.is_empty() {
            all.remove(&subject);
        }
        Ok(r)
    }
}

/// Named values that outlive a call: the global `state`, or one object's.
#[derive(Default)]
pub struct Entries(HashMap<String, Value>);

impl Entries {
    /// Room for `key` among at most `max` entries.
    fn room(&self, key: &str, max: usize) -> mlua::Result<()> {
        if self.0.len() >= max && !self.0.contains_key(key) {
            return Err(mlua::Error::runtime(format!("state is limited to {max} keys")));
        }
        Ok(())
    }

    fn set(&mut self, key: String, value: Value, max: usize) -> mlua::Result<()> {
        if value == Value::Nil {
            self.0.remove(&key);
            return Ok(());
        }
        self.room(&key, max)?;
        self.0.insert(key, value);
        Ok(())
    }

    fn incr(&mut self, key: String, by: i64, max: usize) -> mlua::Result<i64> {
        let now = match self.0.get(&key) {
            Some(Value::Int(i)) => i.wrapping_add(by),
            None => by,
            Some(_) => return Err(mlua::Error::runtime(format!("state {key:?} is not an integer"))),
        };
        self.room(&key, max)?;
        self.0.insert(key, Value::Int(now));
        Ok(now)
    }

    fn push(&mut self, key: String, value: Value, max: usize) -> mlua::Result<usize> {
        self.room(&key, max)?;
        match self.0.entry(key.clone()).or_insert_with(|| Value::List(Vec::new())) {
            Value::List(items) => {
                items.push(value);
                Ok(items.len())
            }
            _ => Err(mlua::Error::runtime(format!("state {key:?} is not a list"))),
        }
    }
}

/// State attached to objects (files, directories) by device and inode, so it follows a
/// file across renames, as an open handle does, and is dropped when the file leaves the
/// export ([`ObjectStates::forget`], which the server calls from the store).
#[derive(Default)]
pub struct ObjectStates(Mutex<Objects>);

#[derive(Default)]
struct Objects {
    entries: HashMap<(u64, u64), Entries>,
    /// Handles (`state.of`) of calls in progress, by object. A removal ends them, so a
    /// handle to a removed file cannot attach state to a later file that is given the
    /// same inode number.
    handles: HashMap<(u64, u64), Vec<u64>>,
    ended: std::collections::HashSet<u64>,
    next_handle: u64,
}

impl Objects {
    /// Takes `token` off `object`'s live handles; true if it was there.
    fn unlist(&mut self, object: (u64, u64), token: u64) -> bool {
        let Some(tokens) = self.handles.get_mut(&object) else { return false };
        let before = tokens.len();
        tokens.retain(|&t| t != token);
        let found = tokens.len() < before;
        if tokens.is_empty() {
            self.handles.remove(&object);
        }
        found
    }
}

impl ObjectStates {
    /// Drops what is attached to `object` and ends the handles to it.
    pub fn forget(&self, object: (u64, u64)) {
        let mut all = self.0.lock();
        all.entries.remove(&object);
        if let Some(tokens) = all.handles.remove(&object) {
            all.ended.extend(tokens);
        }
    }

    /// True while an object has state attached or a call holds a handle to one: only
    /// then do removals need to be reported.
    pub fn watching(&self) -> bool {
        let all = self.0.lock();
        !all.entries.is_empty() || !all.handles.is_empty()
    }

    /// How many objects have state attached.
    pub fn len(&self) -> usize {
        self.0.lock().entries.len()
    }

    /// True when no object has state attached.
    pub fn is_empty(&self) -> bool {
        self.0.lock().entries.is_empty()
    }

    /// A handle to `object` for the call in progress.
    fn open_handle(&self, object: (u64, u64)) -> u64 {
        let mut all = self.0.lock();
        all.next_handle += 1;
        let token = all.next_handle;
        all.handles.entry(object).or_default().push(token);
        token
    }

    /// Ends a handle when its call ends (it can no longer attach anything).
    pub(crate) fn end_handle(&self, object: (u64, u64), token: u64) {
        let mut all = self.0.lock();
        if all.unlist(object, token) {
            all.ended.insert(token);
        }
    }

    /// Forgets a handle whose Lua value is gone.
    fn drop_handle(&self, object: (u64, u64), token: u64) {
        let mut all = self.0.lock();
        all.unlist(object, token);
        all.ended.remove(&token);
    }

    /// Runs `f` on `object`'s entries if it has any (dropping them once empty).
    fn existing<R>(&self, object: (u64, u64), f: impl FnOnce(&mut Entries) -> R) -> Option<R> {
        let mut all = self.0.lock();
        let entries = all.entries.get_mut(&object)?;
        let r = f(entries);
        if entries.0.is_empty() {
            all.entries.remove(&object);
        }
        Some(r)
    }

    /// Runs `f` on `object`'s entries, creating them if needed, unless the handle
    /// `token` has ended because its object was removed.
    fn attach<R>(
        &self,
        object: (u64, u64),
        token: u64,
        f: impl FnOnce(&mut Entries) -> mlua::Result<R>,
    ) -> mlua::Result<R> {
        let mut all = self.0.lock();
        if all.ended.contains(&token) {
            return Err(mlua::Error::runtime("the file was removed or replaced since state.of gave this handle"));
        }
        if !all.entries.contains_key(&object) && all.entries.len() >= MAX_OBJECTS {
            return Err(mlua::Error::runtime(format!("state is attached to at most {MAX_OBJECTS} files")));
        }
        let entries = all.entries.entry(object).or_default();
        let r = f(entries);
        if entries.0.is_empty() {
            all.entries.remove(&object);
        }
        r
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
            let value = o.objects.existing(o.object, |e| e.0.get(&key).cloned()).flatten();
            value.map(|v| to_lua(lua, &v)).transpose()
        });
        m.add_method("set", |_, o, (key, v): (String, LuaValue)| {
            let value = checked_state_value(&v)?;
            if value == Value::Nil {
                o.objects.existing(o.object, |e| e.0.remove(&key));
                return Ok(());
            }
            o.objects.attach(o.object, o.token, |e| e.set(key, value, MAX_OBJECT_KEYS))
        });
        m.add_method("incr", |_, o, (key, by): (String, Option<i64>)| {
            o.objects.attach(o.object, o.token, |e| e.incr(key, by.unwrap_or(1), MAX_OBJECT_KEYS))
        });
        m.add_method("push", |_, o, (key, v): (String, LuaValue)| {
            let value = checked_state_value(&v)?;
            o.objects.attach(o.object, o.token, |e| e.push(key, value, MAX_OBJECT_KEYS))
        });
        m.add_method("take", |lua, o, key: String| {
            let value = o.objects.existing(o.object, |e| e.0.remove(&key)).flatten();
            value.map(|v| to_lua(lua, &v)).transpose()
        });
    }
}

/// Named locks owned by calls.
#[derive(Default)]
pub struct LockTable {
    held: Mutex<HashMap<String, u64>>,
    freed: Condvar,
}

impl LockTable {
    /// Takes `name` for `owner`, waiting until `until`; true if taken (or already held).
    pub fn acquire(&self, name: &str, owner: u64, until: Instant) -> bool {
        let mut held = self.held.lock();
        loop {
            match held.get(name) {
                None => {
                    held.insert(name.to_string(), owner);
                    return true;
                }
                Some(o) if *o == owner => return true,
                Some(_) => {
                    if self.freed.wait_until(&mut held, until).timed_out() && held.contains_key(name) {
                        return false;
                    }
                }
            }
        }
    }

    /// Releases `name` if `owner` holds it.
    pub fn release(&self, name: &str, owner: u64) -> bool {
        let mut held = self.held.lock();
        if held.get(name) == Some(&owner) {
            held.remove(name);
            self.freed.notify_all();
            return true;
        }
        false
    }

    /// True if anyone holds `name`.
    pub fn is_held(&self, name: &str) -> bool {
        self.held.lock().contains_key(name)
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
        lua.create_function(move |lua, key: String| {
            s.own_state(lua, |e| e.0.get(&key).cloned())?.map(|v| to_lua(lua, &v)).transpose()
        })?,
    )?;
    let s = shared.clone();
    state.set(
        "set",
        lua.create_function(move |lua, (key, v): (String, LuaValue)| {
            let value = checked_state_value(&v)?;
            s.own_state(lua, |e| e.set(key, value, MAX_STATE_KEYS))?
        })?,
    )?;
    let s = shared.clone();
    state.set(
        "incr",
        lua.create_function(move |lua, (key, by): (String, Option<i64>)| {
            s.own_state(lua, |e| e.incr(key, by.unwrap_or(1), MAX_STATE_KEYS))?
        })?,
    )?;
    let s = shared.clone();
    state.set(
        "push",
        lua.create_function(move |lua, (key, v): (String, LuaValue)| {
            let value = checked_state_value(&v)?;
            s.own_state(lua, |e| e.push(key, value, MAX_STATE_KEYS))?
        })?,
    )?;
    let s = shared.clone();
    state.set(
        "take",
        lua.create_function(move |lua, key: String| {
            s.own_state(lua, |e| e.0.remove(&key))?.map(|v| to_lua(lua, &v)).transpose()
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
            let (owner, until) = with_ctx(lua, |ctx| {
                let wait = Duration::from_millis(timeout_ms.unwrap_or(u64::MAX / 4));
                Ok((ctx.token, (Instant::now() + wait).min(ctx.deadline)))
            })?;
            let got = s.locks.acquire(&name, owner, until);
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
            let owner = with_ctx(lua, |ctx| {
                ctx.locks.retain(|l| *l != name);
                Ok(ctx.token)
            })?;
            Ok(s.locks.release(&name, owner))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locks_are_exclusive_and_time_out() {
        let t = LockTable::default();
        assert!(t.acquire("a", 1, Instant::now()));
        assert!(t.acquire("a", 1, Instant::now()), "re-entrant for its owner");
        assert!(!t.acquire("a", 2, Instant::now() + Duration::from_millis(20)));
        assert!(!t.release("a", 2));
        assert!(t.release("a", 1));
        assert!(t.acquire("a", 2, Instant::now()));
    }
}
