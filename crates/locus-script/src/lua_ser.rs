//! Replies of the file service as Lua values, built straight on the Lua stack.
//!
//! mlua's serde support sets every field through its own protected call and creates
//! every key string anew, which made an `Attr` cost about 10 µs and a 20-entry `readdir`
//! 240 µs. Here a whole reply is built inside one protected call with the plain C API.
//!
//! The shapes are those of mlua's serde serializer, which scripts were written against:
//! structs and maps become tables keyed by field name, sequences and tuples become
//! lists, `None` and `()` become nil, a unit enum variant becomes its name and a
//! variant with data becomes `{Variant = data}`.
//!
//! Safety: a Lua error (only "out of memory" here) raised by a C API call unwinds to the
//! protected call with `longjmp`, skipping the Rust frames in between. No value that
//! owns memory or has a destructor is alive in those frames: the serializer holds the
//! raw state only, and serde hands it borrowed data.

use mlua::{ffi, Lua, Value as LuaValue};
use serde::ser::{self, Serialize};
use std::ffi::c_int;

/// Converts `value` to a Lua value in one protected call.
pub fn to_value<T: Serialize>(lua: &Lua, value: &T) -> mlua::Result<LuaValue> {
    let mut failed: Option<&'static str> = None;
    let failed_ref = &mut failed;
    // SAFETY: see the module comment; the closure leaves exactly one value on the stack.
    let out = unsafe {
        lua.exec_raw::<LuaValue>((), |state| {
            let top = ffi::lua_gettop(state);
            if let Err(Unsupported(why)) = value.serialize(StackSerializer { state, depth: 0 }) {
                *failed_ref = Some(why);
                ffi::lua_settop(state, top);
                ffi::lua_pushnil(state);
            }
        })?
    };
    match failed {
        None => Ok(out),
        Some(why) => Err(mlua::Error::runtime(why)),
    }
}

/// Deepest nesting converted (the wire's types nest three or four levels).
const MAX_DEPTH: u32 = 32;

/// Why a value could not be converted; carries no owned data (see the module comment).
#[derive(Debug)]
pub struct Unsupported(&'static str);

impl std::fmt::Display for Unsupported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for Unsupported {}

impl ser::Error for Unsupported {
    fn custom<M: std::fmt::Display>(_: M) -> Self {
        Unsupported("a reply field could not be converted to Lua")
    }
}

/// Pushes exactly one value per `serialize_*` call.
#[derive(Clone, Copy)]
struct StackSerializer {
    state: *mut ffi::lua_State,
    depth: u32,
}

type Done = Result<(), Unsupported>;

impl StackSerializer {
    /// Room for a value and its key, checked before every push.
    fn room(self) -> Done {
        // SAFETY: a valid state; lua_checkstack does not raise errors.
        if self.depth > MAX_DEPTH || unsafe { ffi::lua_checkstack(self.state, 3) } == 0 {
            return Err(Unsupported("reply nested too deeply"));
        }
        Ok(())
    }

    fn push_int(self, v: i64) -> Done {
        self.room()?;
        unsafe { ffi::lua_pushinteger(self.state, v) };
        Ok(())
    }

    fn push_str(self, s: &[u8]) -> Done {
        self.room()?;
        unsafe { ffi::lua_pushlstring(self.state, s.as_ptr().cast(), s.len()) };
        Ok(())
    }

    /// Pushes a new table and returns the serializer for its contents.
    fn table(self, list: usize, fields: usize) -> Result<Table, Unsupported> {
        self.room()?;
        let size = |n: usize| n.min(1 << 16) as c_int;
        unsafe { ffi::lua_createtable(self.state, size(list), size(fields)) };
        Ok(Table { inner: StackSerializer { state: self.state, depth: self.depth + 1 }, next: 1 })
    }
}

/// A table being filled, on top of the stack.
struct Table {
    inner: StackSerializer,
    /// Next list index.
    next: ffi::lua_Integer,
}

impl Table {
    fn append<T: Serialize + ?Sized>(&mut self, v: &T) -> Done {
        v.serialize(self.inner)?;
        unsafe { ffi::lua_rawseti(self.inner.state, -2, self.next) };
        self.next += 1;
        Ok(())
    }

    fn field<T: Serialize + ?Sized>(&mut self, key: &str, v: &T) -> Done {
        self.inner.push_str(key.as_bytes())?;
        v.serialize(self.inner)?;
        unsafe { ffi::lua_rawset(self.inner.state, -3) };
        Ok(())
    }

    /// A value whose key was pushed by `serialize_key`.
    fn value<T: Serialize + ?Sized>(&mut self, v: &T) -> Done {
        v.serialize(self.inner)?;
        unsafe { ffi::lua_rawset(self.inner.state, -3) };
        Ok(())
    }
}

impl ser::SerializeSeq for Table {
    type Ok = ();
    type Error = Unsupported;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, v: &T) -> Done {
        self.append(v)
    }
    fn end(self) -> Done {
        Ok(())
    }
}

impl ser::SerializeTuple for Table {
    type Ok = ();
    type Error = Unsupported;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, v: &T) -> Done {
        self.append(v)
    }
    fn end(self) -> Done {
        Ok(())
    }
}

impl ser::SerializeTupleStruct for Table {
    type Ok = ();
    type Error = Unsupported;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, v: &T) -> Done {
        self.append(v)
    }
    fn end(self) -> Done {
        Ok(())
    }
}

impl ser::SerializeStruct for Table {
    type Ok = ();
    type Error = Unsupported;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, key: &'static str, v: &T) -> Done {
        self.field(key, v)
    }
    fn end(self) -> Done {
        Ok(())
    }
}

impl ser::SerializeMap for Table {
    type Ok = ();
    type Error = Unsupported;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Done {
        key.serialize(self.inner)
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, v: &T) -> Done {
        self.value(v)
    }
    fn end(self) -> Done {
        Ok(())
    }
}

/// A variant with data: `{Variant = data}`, the inner table filled, then set.
struct Variant {
    table: Table,
}

impl Variant {
    fn finish(self) -> Done {
        // Stack: outer table, variant name, inner table.
        unsafe { ffi::lua_rawset(self.table.inner.state, -3) };
        Ok(())
    }
}

impl ser::SerializeTupleVariant for Variant {
    type Ok = ();
    type Error = Unsupported;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, v: &T) -> Done {
        self.table.append(v)
    }
    fn end(self) -> Done {
        self.finish()
    }
}

impl ser::SerializeStructVariant for Variant {
    type Ok = ();
    type Error = Unsupported;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, key: &'static str, v: &T) -> Done {
        self.table.field(key, v)
    }
    fn end(self) -> Done {
        self.finish()
    }
}

impl StackSerializer {
    /// Pushes `{variant = <table>}` up to the inner table, which the caller fills.
    fn variant(self, variant: &'static str, len: usize) -> Result<Variant, Unsupported> {
        let outer = self.table(0, 1)?;
        outer.inner.push_str(variant.as_bytes())?;
        Ok(Variant { table: outer.inner.table(len, 0)? })
    }
}

impl ser::Serializer for StackSerializer {
    type Ok = ();
    type Error = Unsupported;
    type SerializeSeq = Table;
    type SerializeTuple = Table;
    type SerializeTupleStruct = Table;
    type SerializeTupleVariant = Variant;
    type SerializeMap = Table;
    type SerializeStruct = Table;
    type SerializeStructVariant = Variant;

    fn serialize_bool(self, v: bool) -> Done {
        self.room()?;
        unsafe { ffi::lua_pushboolean(self.state, v as c_int) };
        Ok(())
    }
    fn serialize_i8(self, v: i8) -> Done {
        self.push_int(v.into())
    }
    fn serialize_i16(self, v: i16) -> Done {
        self.push_int(v.into())
    }
    fn serialize_i32(self, v: i32) -> Done {
        self.push_int(v.into())
    }
    fn serialize_i64(self, v: i64) -> Done {
        self.push_int(v)
    }
    fn serialize_u8(self, v: u8) -> Done {
        self.push_int(v.into())
    }
    fn serialize_u16(self, v: u16) -> Done {
        self.push_int(v.into())
    }
    fn serialize_u32(self, v: u32) -> Done {
        self.push_int(v.into())
    }
    fn serialize_u64(self, v: u64) -> Done {
        match i64::try_from(v) {
            Ok(i) => self.push_int(i),
            Err(_) => self.serialize_f64(v as f64),
        }
    }
    fn serialize_f32(self, v: f32) -> Done {
        self.serialize_f64(v.into())
    }
    fn serialize_f64(self, v: f64) -> Done {
        self.room()?;
        unsafe { ffi::lua_pushnumber(self.state, v) };
        Ok(())
    }
    fn serialize_char(self, v: char) -> Done {
        self.push_str(v.encode_utf8(&mut [0u8; 4]).as_bytes())
    }
    fn serialize_str(self, v: &str) -> Done {
        self.push_str(v.as_bytes())
    }
    fn serialize_bytes(self, v: &[u8]) -> Done {
        self.push_str(v)
    }
    fn serialize_none(self) -> Done {
        self.serialize_unit()
    }
    fn serialize_some<T: Serialize + ?Sized>(self, v: &T) -> Done {
        v.serialize(self)
    }
    fn serialize_unit(self) -> Done {
        self.room()?;
        unsafe { ffi::lua_pushnil(self.state) };
        Ok(())
    }
    fn serialize_unit_struct(self, _: &'static str) -> Done {
        self.serialize_unit()
    }
    fn serialize_unit_variant(self, _: &'static str, _: u32, variant: &'static str) -> Done {
        self.push_str(variant.as_bytes())
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _: &'static str, v: &T) -> Done {
        v.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        v: &T,
    ) -> Done {
        let mut outer = self.table(0, 1)?;
        outer.field(variant, v)
    }
    fn serialize_seq(self, len: Option<usize>) -> Result<Table, Unsupported> {
        self.table(len.unwrap_or(0), 0)
    }
    fn serialize_tuple(self, len: usize) -> Result<Table, Unsupported> {
        self.table(len, 0)
    }
    fn serialize_tuple_struct(self, _: &'static str, len: usize) -> Result<Table, Unsupported> {
        self.table(len, 0)
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Variant, Unsupported> {
        self.variant(variant, len)
    }
    fn serialize_map(self, len: Option<usize>) -> Result<Table, Unsupported> {
        self.table(0, len.unwrap_or(0))
    }
    fn serialize_struct(self, _: &'static str, len: usize) -> Result<Table, Unsupported> {
        self.table(0, len)
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Variant, Unsupported> {
        self.variant(variant, len)
    }
    fn collect_str<T: std::fmt::Display + ?Sized>(self, _: &T) -> Done {
        // The default would format into a String, which must not live across Lua calls.
        Err(Unsupported("a reply field could not be converted to Lua"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::from_lua;
    use mlua::LuaSerdeExt;
    use serde::Serialize;

    #[derive(Serialize)]
    enum Kind {
        Plain,
        Wrapped(u32),
        Pair(i8, bool),
        Named { a: String },
    }

    #[derive(Serialize)]
    struct Sample {
        n: u64,
        big: u64,
        neg: i64,
        x: f64,
        s: String,
        none: Option<u32>,
        some: Option<u32>,
        list: Vec<Vec<u8>>,
        kinds: Vec<Kind>,
        nested: std::collections::BTreeMap<String, (u8, char)>,
        unit: (),
    }

    /// The same shapes as mlua's serde serializer with nil for None and ().
    #[test]
    fn shapes_match_mlua_serde() {
        let lua = Lua::new();
        let sample = Sample {
            n: 7,
            big: u64::MAX,
            neg: -3,
            x: 1.5,
            s: "hé".into(),
            none: None,
            some: Some(4),
            list: vec![vec![1, 2], vec![]],
            kinds: vec![Kind::Plain, Kind::Wrapped(9), Kind::Pair(-1, true), Kind::Named { a: "z".into() }],
            nested: [("k".to_string(), (1u8, 'c'))].into_iter().collect(),
            unit: (),
        };
        let options = mlua::SerializeOptions::new().serialize_none_to_null(false).serialize_unit_to_null(false);
        let theirs = from_lua(&lua.to_value_with(&sample, options).unwrap(), 0).unwrap();
        let ours = from_lua(&to_value(&lua, &sample).unwrap(), 0).unwrap();
        let sorted = |v: locus_proto::types::Value| match v {
            locus_proto::types::Value::Map(mut m) => {
                m.sort_by(|a, b| a.0.cmp(&b.0));
                format!("{m:?}")
            }
            other => format!("{other:?}"),
        };
        assert_eq!(sorted(ours), sorted(theirs));
    }

    #[test]
    fn memory_errors_come_back_as_errors() {
        let lua = Lua::new();
        lua.set_memory_limit(lua.used_memory() + 4096).unwrap();
        let big: Vec<u64> = (0..100_000).collect();
        assert!(matches!(to_value(&lua, &big), Err(mlua::Error::MemoryError(_))));
        lua.set_memory_limit(0).unwrap();
        assert!(to_value(&lua, &big).is_ok());
    }
}
