//! Conversions between Lua values and the wire's [`Value`].

use crate::stdlib::Buffer;
use locus_proto::types::Value;
use mlua::{Lua, Value as LuaValue};

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

/// Bytes of a string or buffer argument.
pub fn bytes_of(v: &LuaValue) -> mlua::Result<Vec<u8>> {
    match v {
        LuaValue::String(s) => Ok(s.as_bytes().to_vec()),
        LuaValue::UserData(u) if u.is::<Buffer>() => Ok(u.borrow::<Buffer>()?.0.clone()),
        LuaValue::Nil => Ok(Vec::new()),
        other => Err(mlua::Error::runtime(format!("expected a string or buffer, got a {}", other.type_name()))),
    }
}

/// The encoded size of a value, to enforce the result limit before sending it.
pub fn encoded_len(values: &[Value]) -> usize {
    locus_proto::codec::encode(&values).len()
}
