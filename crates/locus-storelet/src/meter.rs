//! Metering of what a storelet asks the file system to do on its behalf: bytes read,
//! bytes written and files opened.
//!
//! WASI's `fd_read`, `fd_pread`, `fd_write`, `fd_pwrite` and `path_open` are shadowed in
//! the linker by wrappers that check the run's limits before the call, run WASI's own
//! implementation (the `WasiSnapshotPreview1` trait of the run's context, on the
//! caller's memory) and count what it did. A limit reached stops the run before the
//! call that would pass it.
//!
//! `fd_readdir`, `fd_close` and `fd_renumber` are shadowed too, for the speed of
//! directory listings (see `dirs`).

use crate::guest::{errno_of, with_memory};
use crate::{RunState, StoreletError};
use wasmtime::{Caller, Linker};
use wasmtime_wasi::p1::types::{self, Errno};
use wasmtime_wasi::p1::wasi_snapshot_preview1::WasiSnapshotPreview1;
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::runtime::in_tokio;
use wiggle::{GuestMemory, GuestPtr};

const WASI: &str = "wasi_snapshot_preview1";

/// Stops the run: remembers which limit tripped and returns the trap that unwinds it.
pub(crate) fn trip(state: &mut RunState, limit: &'static str, detail: String) -> anyhow::Error {
    if state.tripped.is_none() {
        state.tripped = Some((limit, detail));
    }
    anyhow::anyhow!("storelet stopped by its {limit} limit")
}

/// The guest's array of `n` I/O vectors at `ptr`.
fn iovs_of<T>(ptr: i32, n: i32) -> GuestPtr<[T]> {
    GuestPtr::new((ptr as u32, n as u32))
}

/// Which byte limit a metered call counts against.
#[derive(Clone, Copy)]
pub(crate) enum Bytes {
    Read,
    Written,
}

/// Runs one of WASI's read or write calls under the run's byte limit: refuses it once
/// the limit is reached, stores the count at `out` as WASI's own glue does, and adds the
/// count to the run's total. Writes to stdout and stderr are counted as output instead.
pub(crate) fn metered(
    c: &mut Caller<'_, RunState>,
    kind: Bytes,
    fd: i32,
    out: i32,
    call: impl FnOnce(&mut GuestMemory<'_>, &mut WasiP1Ctx) -> Result<types::Size, types::Error>,
) -> anyhow::Result<i32> {
    let counted = matches!(kind, Bytes::Read) || fd > 2;
    let s = c.data_mut();
    let (used, limit, name, verb) = match kind {
        Bytes::Read => (s.io.read_bytes, s.limits.read_bytes, "bytes read", "read"),
        Bytes::Written => (s.io.write_bytes, s.limits.write_bytes, "bytes written", "wrote"),
    };
    if counted && used >= limit {
        return Err(trip(s, name, format!("{verb} {used} bytes")));
    }
    let (errno, n) = with_memory(c, |m, wasi| match call(m, wasi) {
        Ok(n) => Ok(match m.write(GuestPtr::new(out as u32), n) {
            Ok(()) => (0, n as u64),
            Err(_) => (Errno::Fault as i32, 0),
        }),
        Err(e) => Ok((e.downcast()? as i32, 0)),
    })?;
    if counted {
        let io = &mut c.data_mut().io;
        match kind {
            Bytes::Read => io.read_bytes += n,
            Bytes::Written => io.write_bytes += n,
        }
    }
    Ok(errno)
}

/// Shadows WASI's I/O functions in `linker` with metered wrappers.
pub(crate) fn add_to_linker(linker: &mut Linker<RunState>) -> Result<(), StoreletError> {
    let setup = |e: anyhow::Error| StoreletError::Setup(e.to_string());
    let fd_of = |fd: i32| types::Fd::from(fd as u32);
    linker.allow_shadowing(true);
    linker
        .func_wrap(WASI, "fd_read", move |mut c: Caller<'_, RunState>, fd: i32, iovs: i32, n: i32, out: i32| {
            metered(&mut c, Bytes::Read, fd, out, |m, wasi| in_tokio(wasi.fd_read(m, fd_of(fd), iovs_of(iovs, n))))
        })
        .map_err(setup)?;
    linker
        .func_wrap(
            WASI,
            "fd_pread",
            move |mut c: Caller<'_, RunState>, fd: i32, iovs: i32, n: i32, off: i64, out: i32| {
                metered(&mut c, Bytes::Read, fd, out, |m, wasi| {
                    in_tokio(wasi.fd_pread(m, fd_of(fd), iovs_of(iovs, n), off as u64))
                })
            },
        )
        .map_err(setup)?;
    linker
        .func_wrap(WASI, "fd_write", move |mut c: Caller<'_, RunState>, fd: i32, iovs: i32, n: i32, out: i32| {
            metered(&mut c, Bytes::Written, fd, out, |m, wasi| in_tokio(wasi.fd_write(m, fd_of(fd), iovs_of(iovs, n))))
        })
        .map_err(setup)?;
    linker
        .func_wrap(
            WASI,
            "fd_pwrite",
            move |mut c: Caller<'_, RunState>, fd: i32, iovs: i32, n: i32, off: i64, out: i32| {
                metered(&mut c, Bytes::Written, fd, out, |m, wasi| {
                    in_tokio(wasi.fd_pwrite(m, fd_of(fd), iovs_of(iovs, n), off as u64))
                })
            },
        )
        .map_err(setup)?;
    linker
        .func_wrap(
            WASI,
            "path_open",
            |mut c: Caller<'_, RunState>,
             dir: i32,
             dirflags: i32,
             path: i32,
             path_len: i32,
             oflags: i32,
             base: i64,
             inheriting: i64,
             fdflags: i32,
             out: i32| {
                let s = c.data_mut();
                if s.io.files_opened >= s.limits.files {
                    let detail = format!("opened {} files", s.io.files_opened);
                    return Err(trip(s, "files opened", detail));
                }
                let (Ok(lookup), Ok(oflags), Ok(base), Ok(inheriting), Ok(fdflags)) = (
                    types::Lookupflags::try_from(dirflags as u32),
                    types::Oflags::try_from(oflags as u16),
                    types::Rights::try_from(base as u64),
                    types::Rights::try_from(inheriting as u64),
                    types::Fdflags::try_from(fdflags as u16),
                ) else {
                    return Ok(Errno::Inval as i32);
                };
                let r = with_memory(&mut c, |m, wasi| {
                    let path = GuestPtr::new((path as u32, path_len as u32));
                    let dir = types::Fd::from(dir as u32);
                    let r = in_tokio(wasi.path_open(m, dir, lookup, path, oflags, base, inheriting, fdflags));
                    errno_of(r, m, |m, fd| m.write(GuestPtr::new(out as u32), fd))
                })?;
                if r == 0 {
                    c.data_mut().io.files_opened += 1;
                    crate::dirs::opened(&mut c, dir, path, path_len, dirflags, out);
                } else if r == Errno::Noent as i32 {
                    crate::dirs::missing(&mut c, dir, path, path_len, dirflags);
                }
                Ok(r)
            },
        )
        .map_err(setup)?;
    linker.func_wrap(WASI, "fd_readdir", crate::dirs::readdir).map_err(setup)?;
    linker
        .func_wrap(WASI, "fd_close", |mut c: Caller<'_, RunState>, fd: i32| -> anyhow::Result<i32> {
            c.data_mut().dirs.forget(fd as u32);
            let r =
                in_tokio(c.data_mut().wasi.fd_close(&mut GuestMemory::Unshared(&mut []), types::Fd::from(fd as u32)));
            errno_of(r, &mut GuestMemory::Unshared(&mut []), |_, ()| Ok(()))
        })
        .map_err(setup)?;
    linker
        .func_wrap(WASI, "fd_renumber", |mut c: Caller<'_, RunState>, from: i32, to: i32| -> anyhow::Result<i32> {
            c.data_mut().dirs.forget(from as u32);
            c.data_mut().dirs.forget(to as u32);
            let (from, to) = (types::Fd::from(from as u32), types::Fd::from(to as u32));
            let r = c.data_mut().wasi.fd_renumber(&mut GuestMemory::Unshared(&mut []), from, to);
            errno_of(r, &mut GuestMemory::Unshared(&mut []), |_, ()| Ok(()))
        })
        .map_err(setup)?;
    linker.allow_shadowing(false);
    Ok(())
}
