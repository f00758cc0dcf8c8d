//! The glue every host function needs: the guest's memory beside the run's WASI
//! context, and a WASI result turned into the errno the guest gets.

use crate::RunState;
use wasmtime::{Caller, Extern};
use wasmtime_wasi::p1::types::{self, Errno};
use wasmtime_wasi::p1::WasiP1Ctx;
use wiggle::GuestMemory;

/// Runs `f` with the guest's memory and the run's WASI context, as WASI's own glue does.
pub(crate) fn with_memory<R>(
    c: &mut Caller<'_, RunState>,
    f: impl FnOnce(&mut GuestMemory<'_>, &mut WasiP1Ctx) -> anyhow::Result<R>,
) -> anyhow::Result<R> {
    let mem = c.get_export("memory").and_then(Extern::into_memory);
    let mem = mem.ok_or_else(|| anyhow::anyhow!("missing required memory export"))?;
    let (data, state) = mem.data_and_store_mut(c);
    f(&mut GuestMemory::Unshared(data), &mut state.wasi)
}

/// The errno a WASI call answers (`Ok` of 0 on success, after `store` saved its result).
pub(crate) fn errno_of<T>(
    r: Result<T, types::Error>,
    mem: &mut GuestMemory<'_>,
    store: impl FnOnce(&mut GuestMemory<'_>, T) -> Result<(), wiggle::GuestError>,
) -> anyhow::Result<i32> {
    match r {
        Ok(v) => Ok(match store(mem, v) {
            Ok(()) => 0,
            Err(_) => Errno::Fault as i32,
        }),
        Err(e) => Ok(e.downcast()? as i32),
    }
}
