//! `fs.<op>` for every file operation, generated from the operation table: adding an
//! operation to the table adds its script binding with no code here.
//!
//! Arguments are the request's fields in table order; one more argument, if given, is the
//! request's data (a string or buffer). A call answers its reply as a Lua value (`true`
//! for an empty reply), followed by the reply's data as a string when there is some
//! (`fs.pread` answers the data alone). On failure it answers `nil, message, code`, so a
//! script can test for errors without `pcall`.

use crate::buffer::bytes_of;
use crate::call::fail;
use crate::call::CallCtx;
use locus_proto::codec;
use locus_proto::ops;
use locus_proto::types::*;
use mlua::{Lua, MultiValue, Table, Value as LuaValue};

/// Operations a script may call: the file service and admin operations, not the
/// handshake and not scripts themselves.
fn bindable(code: u16) -> bool {
    (0x10..0x40).contains(&code) || code == 0x04
}

/// Operations that only look, answer at once and change nothing: the ones a call on the
/// connection's thread may make (see `Engine::try_inline`).
pub(crate) fn looks_only(code: u16) -> bool {
    use locus_proto::Operation;
    [
        ops::Whoami::INFO.code,
        ops::Stat::INFO.code,
        ops::Lstat::INFO.code,
        ops::Readlink::INFO.code,
        ops::Access::INFO.code,
    ]
    .contains(&code)
}

/// Converts a reply's pages to one Lua value (pages of lists are concatenated).
fn pages_to_lua<T: serde::Serialize>(lua: &Lua, pages: Vec<T>) -> mlua::Result<LuaValue> {
    let mut values = Vec::with_capacity(pages.len());
    for p in &pages {
        values.push(crate::lua_ser::to_value(lua, p)?);
    }
    if values.len() == 1 {
        return Ok(values.pop().expect("one"));
    }
    let all = lua.create_table()?;
    for v in values {
        if let LuaValue::Table(t) = v {
            for item in t.sequence_values::<LuaValue>() {
                all.raw_push(item?)?;
            }
        }
    }
    Ok(LuaValue::Table(all))
}

/// The leading arguments of an `fs.*` call read as the request's fields, in table order:
/// serde's derived structs accept their fields as a sequence, so no table of named
/// fields is built and read back. Missing arguments read as nil.
struct Fields<'a, I> {
    args: &'a mut I,
    left: usize,
}

impl<'de, I: Iterator<Item = LuaValue>> serde::Deserializer<'de> for Fields<'_, I> {
    type Error = mlua::Error;

    fn deserialize_any<V: serde::de::Visitor<'de>>(self, visitor: V) -> mlua::Result<V::Value> {
        visitor.visit_seq(self)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map struct enum identifier
        ignored_any
    }
}

impl<'de, I: Iterator<Item = LuaValue>> serde::de::SeqAccess<'de> for Fields<'_, I> {
    type Error = mlua::Error;

    fn next_element_seed<T: serde::de::DeserializeSeed<'de>>(&mut self, seed: T) -> mlua::Result<Option<T::Value>> {
        if self.left == 0 {
            return Ok(None);
        }
        self.left -= 1;
        let value = self.args.next().unwrap_or(LuaValue::Nil);
        seed.deserialize(mlua::serde::Deserializer::new(value)).map(Some)
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.left)
    }
}

macro_rules! define_bindings {
    ($( $(#[doc = $doc:literal])* $code:literal $name:ident $method:ident $shape:ident
        { $($field:ident : $fty:ty),* $(,)? } -> $reply:ty; )*) => {
        /// Installs the `fs` table into `g`.
        pub fn install(lua: &Lua, g: &Table) -> mlua::Result<()> {
            let fs = lua.create_table()?;
            $(
                if bindable($code) {
                    let f = lua.create_function(|lua, args: MultiValue| {
                        let mut args = args.into_iter();
                        let fields = <[&str]>::len(&[$(stringify!($field)),*]);
                        let mut field_args = args.by_ref().take(fields);
                        let req = <ops::$name as serde::Deserialize>::deserialize(Fields { args: &mut field_args, left: fields });
                        // A refused field leaves the later ones unread; they are not data.
                        field_args.for_each(drop);
                        let data = match args.next() { Some(v) => bytes_of(&v)?, None => Vec::new() };
                        let req = match req {
                            Ok(r) => r,
                            Err(e) => return fail(lua, locus_proto::Error::new(
                                locus_proto::Code::INVAL,
                                format!("fs.{}: bad arguments ({}): {e}", stringify!($method), stringify!($($field),*)),
                            )),
                        };
                        let outcome = {
                            let mut ctx = lua.app_data_mut::<CallCtx>()
                                .ok_or_else(|| mlua::Error::runtime("no call in progress"))?;
                            ctx.host.call($code, &codec::encode(&req), &data)
                        };
                        let (metas, out) = match outcome {
                            Ok(r) => r,
                            Err(e) => return fail(lua, e),
                        };
                        let mut pages: Vec<$reply> = Vec::with_capacity(metas.len());
                        for m in &metas {
                            pages.push(codec::decode(m).map_err(|e| mlua::Error::runtime(e.message))?);
                        }
                        let value = match pages_to_lua(lua, pages)? {
                            LuaValue::Nil => LuaValue::Boolean(true),
                            v => v,
                        };
                        let unit = stringify!($reply) == "()";
                        let mut ret = MultiValue::new();
                        match (unit, out.is_empty() && !matches!(stringify!($method), "pread" | "get")) {
                            (true, false) => ret.push_back(LuaValue::String(lua.create_string(&out)?)),
                            (_, true) => ret.push_back(value),
                            (false, false) => {
                                ret.push_back(value);
                                ret.push_back(LuaValue::String(lua.create_string(&out)?));
                            }
                        }
                        Ok(ret)
                    })?;
                    fs.set(stringify!($method), f)?;
                }
            )*
            g.set("fs", fs)
        }
    };
}

locus_proto::operation_table!(define_bindings);
