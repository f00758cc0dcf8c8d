//! The scripts' standard library besides `fs`: `buffer`, `state`, `lock`, `msg`, `time`,
//! and the per-call context they work in.

use crate::engine::Limits;
use crate::value::{bytes_of, from_lua, to_lua};
use crate::Host;
use locus_proto::types::Value;
use mlua::{Lua, MetaMethod, Table, UserData, UserDataMethods, Value as LuaValue};
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Named state entries kept at most (scripts share them across calls).
const MAX_STATE_KEYS: usize = 100_000;
/// Largest encoded value one state entry may hold.
const MAX_STATE_VALUE: usize = 1 << 20;

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
    /// Bytes held in buffers, which live outside Lua's own memory accounting.
    pub buffer_bytes: usize,
    /// Distinguishes this call as a lock owner.
    pub token: u64,
}

impl CallCtx {
    /// Trips a limit and returns the error that ends the call.
    pub fn trip(&mut self, limit: &'static str, detail: String) -> mlua::Error {
        let e = mlua::Error::runtime(format!("{limit} limit exceeded: {detail}"));
        self.tripped.get_or_insert((limit, detail));
        e
    }
}

/// State shared by every call on every interpreter.
#[derive(Default)]
pub struct Shared {
    pub locks: LockTable,
    pub state: Mutex<HashMap<String, Value>>,
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

/// A byte buffer that stays out of Lua strings (no interning, mutable in place).
/// Byte offsets of the integer accessors are 0-based; `sub` and `find` use Lua's 1-based
/// positions like `string.sub` and `string.find`.
pub struct Buffer(pub Vec<u8>);

fn charge(lua: &Lua, bytes: usize) -> mlua::Result<()> {
    if let Some(mut ctx) = lua.app_data_mut::<CallCtx>() {
        ctx.buffer_bytes += bytes;
        if ctx.buffer_bytes > ctx.limits.memory {
            let detail = format!("{} bytes of buffers", ctx.buffer_bytes);
            return Err(ctx.trip("memory", detail));
        }
    }
    Ok(())
}

fn span(len: usize, i: i64, j: Option<i64>) -> (usize, usize) {
    let norm = |p: i64| if p < 0 { (len as i64 + p + 1).max(0) } else { p.min(len as i64) };
    let start = norm(i).max(1) as usize;
    let end = norm(j.unwrap_or(-1)) as usize;
    (start - 1, end.max(start - 1))
}

fn int_at<const N: usize>(b: &[u8], off: usize) -> mlua::Result<[u8; N]> {
    b.get(off..off + N)
        .and_then(|s| s.try_into().ok())
        .ok_or_else(|| mlua::Error::runtime(format!("offset {off} is outside a buffer of {} bytes", b.len())))
}

impl UserData for Buffer {
    fn add_methods<M: UserDataMethods<Self>>(m: &mut M) {
        m.add_method("len", |_, b, ()| Ok(b.0.len()));
        m.add_meta_method(MetaMethod::Len, |_, b, ()| Ok(b.0.len()));
        m.add_method("sub", |lua, b, (i, j): (i64, Option<i64>)| {
            let (s, e) = span(b.0.len(), i, j);
            lua.create_string(&b.0[s..e])
        });
        m.add_method("find", |_, b, (needle, init): (mlua::String, Option<i64>)| {
            let needle = needle.as_bytes();
            let (start, _) = span(b.0.len(), init.unwrap_or(1), None);
            if needle.is_empty() {
                return Ok(Some(start + 1));
            }
            Ok(b.0[start..].windows(needle.len()).position(|w| w == &needle[..]).map(|p| start + p + 1))
        });
        m.add_method("u32", |_, b, off: usize| Ok(u32::from_le_bytes(int_at::<4>(&b.0, off)?)));
        m.add_method("u64", |_, b, off: usize| Ok(u64::from_le_bytes(int_at::<8>(&b.0, off)?) as i64));
        m.add_method_mut("set_u32", |_, b, (off, v): (usize, u32)| {
            int_at::<4>(&b.0, off)?;
            b.0[off..off + 4].copy_from_slice(&v.to_le_bytes());
            Ok(())
        });
        m.add_method_mut("set_u64", |_, b, (off, v): (usize, i64)| {
            int_at::<8>(&b.0, off)?;
            b.0[off..off + 8].copy_from_slice(&v.to_le_bytes());
            Ok(())
        });
        m.add_method_mut("append", |lua, b, v: LuaValue| {
            let bytes = bytes_of(&v)?;
            charge(lua, bytes.len())?;
            b.0.extend_from_slice(&bytes);
            Ok(b.0.len())
        });
        m.add_method_mut("clear", |_, b, ()| {
            b.0.clear();
            Ok(())
        });
        m.add_method("tostring", |lua, b, ()| lua.create_string(&b.0));
        m.add_meta_method(MetaMethod::ToString, |lua, b, ()| lua.create_string(&b.0));
    }
}

fn with_ctx<R>(lua: &Lua, f: impl FnOnce(&mut CallCtx) -> mlua::Result<R>) -> mlua::Result<R> {
    let mut ctx = lua.app_data_mut::<CallCtx>().ok_or_else(|| mlua::Error::runtime("no call in progress"))?;
    f(&mut ctx)
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
    g.set("buffer", buffer)?;

    let state = lua.create_table()?;
    let s = shared.clone();
    state.set(
        "get",
        lua.create_function(move |lua, key: String| s.state.lock().get(&key).map(|v| to_lua(lua, v)).transpose())?,
    )?;
    let s = shared.clone();
    state.set(
        "set",
        lua.create_function(move |_, (key, v): (String, LuaValue)| {
            let value = checked_state_value(&v)?;
            let mut st = s.state.lock();
            if value == Value::Nil {
                st.remove(&key);
            } else {
                if st.len() >= MAX_STATE_KEYS && !st.contains_key(&key) {
                    return Err(mlua::Error::runtime(format!("state is limited to {MAX_STATE_KEYS} keys")));
                }
                st.insert(key, value);
            }
            Ok(())
        })?,
    )?;
    let s = shared.clone();
    state.set(
        "incr",
        lua.create_function(move |_, (key, by): (String, Option<i64>)| {
            let mut st = s.state.lock();
            let now = match st.get(&key) {
                Some(Value::Int(i)) => i.wrapping_add(by.unwrap_or(1)),
                None => by.unwrap_or(1),
                Some(_) => return Err(mlua::Error::runtime(format!("state {key:?} is not an integer"))),
            };
            st.insert(key, Value::Int(now));
            Ok(now)
        })?,
    )?;
    let s = shared.clone();
    state.set(
        "push",
        lua.create_function(move |_, (key, v): (String, LuaValue)| {
            let value = checked_state_value(&v)?;
            let mut st = s.state.lock();
            let entry = st.entry(key.clone()).or_insert_with(|| Value::List(Vec::new()));
            match entry {
                Value::List(items) => {
                    items.push(value);
                    Ok(items.len())
                }
                _ => Err(mlua::Error::runtime(format!("state {key:?} is not a list"))),
            }
        })?,
    )?;
    let s = shared.clone();
    state.set(
        "take",
        lua.create_function(move |lua, key: String| s.state.lock().remove(&key).map(|v| to_lua(lua, &v)).transpose())?,
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

    #[test]
    fn spans_follow_string_sub() {
        assert_eq!(span(5, 2, Some(3)), (1, 3));
        assert_eq!(span(5, -2, None), (3, 5));
        assert_eq!(span(5, 4, Some(2)), (3, 3));
        assert_eq!(span(0, 1, None), (0, 0));
    }
}
