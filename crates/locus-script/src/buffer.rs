//! `buffer`: bytes that stay out of Lua strings, charged to the call's memory limit,
//! and the bytes of a Lua value (a string or a buffer).

use crate::call::fail;
use crate::call::{host_call, CallCtx};
use locus_proto::ops;
use mlua::{Lua, MetaMethod, MultiValue, UserData, UserDataMethods, Value as LuaValue};

/// A byte buffer that stays out of Lua strings (no interning, mutable in place).
/// Byte offsets of the integer accessors are 0-based; `sub` and `find` use Lua's 1-based
/// positions like `string.sub` and `string.find`.
pub struct Buffer(pub Vec<u8>);

pub(crate) fn charge(lua: &Lua, bytes: usize) -> mlua::Result<()> {
    if let Some(mut ctx) = lua.app_data_mut::<CallCtx>() {
        ctx.buffer_bytes += bytes;
        if ctx.buffer_bytes > ctx.limits.memory {
            let detail = format!("{} bytes of buffers", ctx.buffer_bytes);
            return Err(ctx.trip("memory", detail));
        }
    }
    Ok(())
}

pub(crate) fn span(len: usize, i: i64, j: Option<i64>) -> (usize, usize) {
    let norm = |p: i64| if p < 0 { (len as i64 + p + 1).max(0) } else { p.min(len as i64) };
    let start = norm(i).max(1) as usize;
    let end = norm(j.unwrap_or(-1)) as usize;
    (start - 1, end.max(start - 1))
}

pub(crate) fn int_at<const N: usize>(b: &[u8], off: usize) -> mlua::Result<[u8; N]> {
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
        m.add_method("write", |lua, b, (handle, offset): (u64, u64)| {
            match host_call(lua, &ops::Pwrite { handle, offset }, &b.0)? {
                Ok((written, _)) => Ok(MultiValue::from_iter([LuaValue::Integer(written as i64)])),
                Err(e) => fail(lua, e),
            }
        });
        m.add_method("tostring", |lua, b, ()| lua.create_string(&b.0));
        m.add_meta_method(MetaMethod::ToString, |lua, b, ()| lua.create_string(&b.0));
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_follow_string_sub() {
        assert_eq!(span(5, 2, Some(3)), (1, 3));
        assert_eq!(span(5, -2, None), (3, 5));
        assert_eq!(span(5, 4, Some(2)), (3, 3));
        assert_eq!(span(0, 1, None), (0, 0));
    }
}
