//! Conversions between Lua values and the wire's [`Value`].

use crate::buffer::Buffer;
use locus_proto::types::Value;
use mlua::{ffi, Lua, Value as LuaValue};
use std::ffi::{c_int, CStr};

/// Nesting deeper than this is refused (a cycle would otherwise never end).
const MAX_DEPTH: usize = 64;

/// A Lua value as a wire value; functions, threads and other userdata are refused.
pub fn from_lua(v: &LuaValue, depth: usize) -> mlua::Result<Value> {
    if depth > MAX_DEPTH {
        return Err(mlua::Error::runtime("value nested too deeply"));
    }
    Ok(match v {
        LuaValue::Nil => Value::Nil,
        LuaValue::Boolean(b) => Value::Bool(*b),
        LuaValue::Integer(i) => Value::Int(*i),
        LuaValue::Number(n) => Value::Num(*n),
        LuaValue::String(s) => match s.to_str() {
            Ok(text) => Value::Str(text.to_string()),
            Err(_) => Value::Bytes(s.as_bytes().to_vec()),
        },
        LuaValue::Table(t) => {
            // One pass over the pairs: a table whose keys are exactly 1..n is a list.
            let mut pairs: Vec<(LuaValue, LuaValue)> = Vec::new();
            t.for_each(|k, v| {
                pairs.push((k, v));
                Ok(())
            })?;
            let n = pairs.len() as i64;
            let list = pairs.iter().all(|(k, _)| matches!(k, LuaValue::Integer(i) if (1..=n).contains(i)));
            if list {
                let mut items = vec![Value::Nil; pairs.len()];
                for (k, v) in &pairs {
                    let LuaValue::Integer(i) = k else { unreachable!("checked above") };
                    items[(*i - 1) as usize] = from_lua(v, depth + 1)?;
                }
                Value::List(items)
            } else {
                let mut map = Vec::with_capacity(pairs.len());
                for (k, v) in &pairs {
                    let key = match k {
                        LuaValue::String(s) => s.to_str()?.to_string(),
                        LuaValue::Integer(i) => i.to_string(),
                        other => {
                            return Err(mlua::Error::runtime(format!(
                                "table key of type {} cannot leave a script",
                                other.type_name()
                            )))
                        }
                    };
                    map.push((key, from_lua(v, depth + 1)?));
                }
                Value::Map(map)
            }
        }
        LuaValue::UserData(u) if u.is::<Buffer>() => Value::Bytes(u.borrow::<Buffer>()?.0.clone()),
        other => return Err(mlua::Error::runtime(format!("a {} cannot leave a script", other.type_name()))),
    })
}

/// A script's results as wire values. Tables are read straight off the Lua stack in one
/// protected call (see [`read_stack`]); going through mlua, every key and value of a
/// table became a registry reference, and an 11-field table cost about 4 µs. A table
/// holding a buffer takes the general path, [`from_lua`].
pub fn results_from_lua(lua: &Lua, values: &mlua::MultiValue) -> mlua::Result<Vec<Value>> {
    let mut out = Vec::with_capacity(values.len());
    for v in values.iter() {
        let LuaValue::Table(t) = v else {
            out.push(from_lua(v, 0)?);
            continue;
        };
        let mut read: Option<Result<Value, Unread>> = None;
        let read_ref = &mut read;
        // SAFETY: `read_stack` makes only C API calls that cannot raise a Lua error when
        // given the keys `lua_next` handed out, so no `longjmp` crosses its Rust frames;
        // it leaves the stack as it found it, and the closure clears it.
        unsafe {
            lua.exec_raw::<()>(t.clone(), |state| {
                *read_ref = Some(read_stack(state, 1, 0));
                ffi::lua_settop(state, 0);
            })?;
        }
        out.push(match read {
            Some(Ok(value)) => value,
            Some(Err(Unread::Refused(why))) => return Err(mlua::Error::runtime(why)),
            Some(Err(Unread::Userdata)) | None => from_lua(v, 0)?,
        });
    }
    Ok(out)
}

/// Why [`read_stack`] stopped.
enum Unread {
    /// A userdata (a buffer, maybe): the caller converts the value through mlua instead.
    Userdata,
    /// A value that cannot leave a script at all.
    Refused(String),
}

/// The value at stack index `idx` as a wire value, by the rules of [`from_lua`].
///
/// # Safety
/// `state` is a valid Lua state with a value at `idx` and room for three more.
unsafe fn read_stack(state: *mut ffi::lua_State, idx: c_int, depth: usize) -> Result<Value, Unread> {
    if depth > MAX_DEPTH {
        return Err(Unread::Refused("value nested too deeply".into()));
    }
    let type_name = |t: c_int| CStr::from_ptr(ffi::lua_typename(state, t)).to_string_lossy().into_owned();
    Ok(match ffi::lua_type(state, idx) {
        ffi::LUA_TNIL => Value::Nil,
        ffi::LUA_TBOOLEAN => Value::Bool(ffi::lua_toboolean(state, idx) != 0),
        ffi::LUA_TNUMBER if ffi::lua_isinteger(state, idx) != 0 => Value::Int(ffi::lua_tointeger(state, idx)),
        ffi::LUA_TNUMBER => Value::Num(ffi::lua_tonumber(state, idx)),
        ffi::LUA_TSTRING => match std::str::from_utf8(string_at(state, idx)) {
            Ok(text) => Value::Str(text.to_string()),
            Err(_) => Value::Bytes(string_at(state, idx).to_vec()),
        },
        ffi::LUA_TTABLE => {
            if ffi::lua_checkstack(state, 3) == 0 {
                return Err(Unread::Refused("value nested too deeply".into()));
            }
            let table = ffi::lua_absindex(state, idx);
            let mut ints: Vec<(i64, Value)> = Vec::new();
            let mut named: Vec<(String, Value)> = Vec::new();
            ffi::lua_pushnil(state);
            while ffi::lua_next(state, table) != 0 {
                // The key is at -2, its value at -1.
                let value = read_stack(state, -1, depth + 1);
                let key_type = ffi::lua_type(state, -2);
                let value = match value {
                    Ok(v) => v,
                    Err(e) => {
                        ffi::lua_settop(state, table);
                        return Err(e);
                    }
                };
                if key_type == ffi::LUA_TNUMBER && ffi::lua_isinteger(state, -2) != 0 {
                    ints.push((ffi::lua_tointeger(state, -2), value));
                } else if key_type == ffi::LUA_TSTRING {
                    let Ok(key) = std::str::from_utf8(string_at(state, -2)) else {
                        ffi::lua_settop(state, table);
                        return Err(Unread::Refused("a table key that is not UTF-8 cannot leave a script".into()));
                    };
                    named.push((key.to_string(), value));
                } else {
                    ffi::lua_settop(state, table);
                    return Err(Unread::Refused(format!(
                        "table key of type {} cannot leave a script",
                        type_name(key_type)
                    )));
                }
                ffi::lua_pop(state, 1);
            }
            let n = ints.len() as i64;
            if named.is_empty() && ints.iter().all(|(i, _)| (1..=n).contains(i)) {
                let mut items = vec![Value::Nil; ints.len()];
                for (i, v) in ints {
                    items[(i - 1) as usize] = v;
                }
                Value::List(items)
            } else if ints.is_empty() {
                Value::Map(named)
            } else {
                // Integer keys become their decimal text, as in `from_lua`.
                let mut map: Vec<(String, Value)> = ints.into_iter().map(|(i, v)| (i.to_string(), v)).collect();
                map.extend(named);
                Value::Map(map)
            }
        }
        ffi::LUA_TUSERDATA => return Err(Unread::Userdata),
        other => return Err(Unread::Refused(format!("a {} cannot leave a script", type_name(other)))),
    })
}

/// The bytes of the string at `idx` (which must be a string, so no conversion happens).
unsafe fn string_at<'a>(state: *mut ffi::lua_State, idx: c_int) -> &'a [u8] {
    let mut len = 0usize;
    let p = ffi::lua_tolstring(state, idx, &mut len);
    std::slice::from_raw_parts(p.cast(), len)
}

/// A wire value as a Lua value.
pub fn to_lua(lua: &Lua, v: &Value) -> mlua::Result<LuaValue> {
    Ok(match v {
        Value::Nil => LuaValue::Nil,
        Value::Bool(b) => LuaValue::Boolean(*b),
        Value::Int(i) => LuaValue::Integer(*i),
        Value::Num(n) => LuaValue::Number(*n),
        Value::Str(s) => LuaValue::String(lua.create_string(s)?),
        Value::Bytes(b) => LuaValue::String(lua.create_string(b)?),
        Value::List(items) => {
            let t = lua.create_table_with_capacity(items.len(), 0)?;
            for (i, item) in items.iter().enumerate() {
                t.raw_set(i + 1, to_lua(lua, item)?)?;
            }
            LuaValue::Table(t)
        }
        Value::Map(pairs) => {
            let t = lua.create_table_with_capacity(0, pairs.len())?;
            for (k, item) in pairs {
                t.raw_set(k.as_str(), to_lua(lua, item)?)?;
            }
            LuaValue::Table(t)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn both_ways(lua: &Lua, src: &str) -> (mlua::Result<Vec<Value>>, mlua::Result<Vec<Value>>) {
        let values: mlua::MultiValue = lua.load(src).eval().unwrap();
        let slow: mlua::Result<Vec<Value>> = values.iter().map(|v| from_lua(v, 0)).collect();
        (results_from_lua(lua, &values), slow)
    }

    fn sorted(v: Value) -> Value {
        match v {
            Value::Map(mut m) => {
                m.sort_by(|a, b| a.0.cmp(&b.0));
                Value::Map(m.into_iter().map(|(k, v)| (k, sorted(v))).collect())
            }
            Value::List(l) => Value::List(l.into_iter().map(sorted).collect()),
            other => other,
        }
    }

    #[test]
    fn reading_the_stack_agrees_with_the_general_path() {
        let lua = Lua::new();
        lua.globals().set("buf", Buffer(b"raw".to_vec())).unwrap();
        for src in [
            "return 1, 2.5, true, nil, 'text', '\\255\\254'",
            "return {}, {1, 2, 3}, {a = 1, b = {c = 'd'}}",
            "return {size = 1, mode = 2, kind = 'file', list = {{x = 1}, {x = 2}}}",
            "return {[1] = 'a', [3] = 'c'}, {[2] = 'b', name = 'n'}, {[-1] = 0}",
            "return {'\\255', ok = '\\255'}",
            "return {inner = buf}, buf",
        ] {
            let (fast, slow) = both_ways(&lua, src);
            let (fast, slow) = (fast.unwrap(), slow.unwrap());
            let fast: Vec<Value> = fast.into_iter().map(sorted).collect();
            let slow: Vec<Value> = slow.into_iter().map(sorted).collect();
            assert_eq!(fast, slow, "{src}");
        }
        assert_eq!(
            both_ways(&lua, "return {inner = buf}").0.unwrap(),
            vec![Value::Map(vec![("inner".into(), Value::Bytes(b"raw".to_vec()))])]
        );
    }

    #[test]
    fn reading_the_stack_refuses_what_cannot_leave() {
        let lua = Lua::new();
        for (src, why) in [
            ("return {f = print}", "a function cannot leave a script"),
            ("return {[1.5] = 1}", "table key of type number"),
            ("return {[true] = 1}", "table key of type boolean"),
            ("local t = {} t.self = t return t", "nested too deeply"),
        ] {
            let err = both_ways(&lua, src).0.unwrap_err().to_string();
            assert!(err.contains(why), "{src}: {err}");
        }
        // The stack is left as it was: a later conversion still works.
        assert_eq!(both_ways(&lua, "return {1}").0.unwrap(), vec![Value::List(vec![Value::Int(1)])]);
    }
}
