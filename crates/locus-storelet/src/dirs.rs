//! Fast directory listings for storelets.
//!
//! WASI's own `fd_readdir` lists and stats the whole directory on every call (the stat
//! only to make up an inode number), however far the reader has got, so a program that
//! reads a directory in buffer-sized pieces pays for it many times over; a `find` over
//! ten thousand files spent most of its time there. Instead:
//!
//! - each directory the program opens is also opened here, on the host, with `openat2`
//!   and `RESOLVE_BENEATH` from the preopened directory (or from a directory opened the
//!   same way), so it can never name anything outside; a directory that cannot be
//!   opened so is left to WASI;
//! - a listing is read once per pass (when the reader starts at cookie 0) with
//!   `getdents`, inode numbers and types included, into a host buffer in WASI's dirent
//!   format, and the reader's pieces are served from it.
//!
//! A directory renamed between WASI's open and this one could be listed in place of
//! another directory of the same tree: never one outside it.

use crate::guest::{errno_of, with_memory};
use crate::RunState;
use rustix::fs::{FileType, Mode, OFlags, ResolveFlags};
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use wasmtime::{Caller, Extern};
use wasmtime_wasi::p1::types::{self, Errno};
use wasmtime_wasi::p1::wasi_snapshot_preview1::WasiSnapshotPreview1;
use wasmtime_wasi::runtime::in_tokio;
use wiggle::GuestPtr;

/// WASI's lookup flag that follows a final symbolic link.
const SYMLINK_FOLLOW: i32 = 1;

/// A directory listing in WASI's dirent format, and where each entry starts.
#[derive(Default)]
pub(crate) struct Listing {
    bytes: Vec<u8>,
    starts: Vec<usize>,
}

/// The host side of a run's open directories, by WASI fd.
#[derive(Default)]
pub(crate) struct Dirs {
    host: HashMap<u32, OwnedFd>,
    /// Each host directory's path from the preopened one (which is "").
    paths: HashMap<u32, String>,
    listings: HashMap<u32, Listing>,
    /// The files the program opened or looked for, when the run records its inputs.
    pub(crate) inputs: Option<Inputs>,
}

/// The files a run read, or looked for and did not find, as they were when it opened
/// them: a result computed from them is still good while each is still so.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Inputs {
    /// Path (from the preopened directory) and identity at open; `None`: it was absent.
    pub files: Vec<(String, Option<Stamp>)>,
    /// False when the program opened something whose path could not be told (through a
    /// directory this side does not know): the list is then not the whole story.
    pub complete: bool,
    seen: std::collections::HashSet<String>,
}

/// What identifies a file's content without reading it: any write changes its
/// modification or change time (nanoseconds), a replacement its inode. (Not its device
/// number: an overlay, through which code sees an export of several devices, reports a
/// new one for each mount.)
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Stamp {
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i128,
    pub ctime_ns: i128,
}

impl Stamp {
    /// The stamp of a file's attributes.
    // `struct stat` field types differ between architectures; the casts are for the others.
    #[allow(clippy::unnecessary_cast)]
    pub fn of(st: &rustix::fs::Stat) -> Stamp {
        let ns = |s: i64, n: i64| s as i128 * 1_000_000_000 + n as i128;
        Stamp {
            ino: st.st_ino as u64,
            size: st.st_size as u64,
            mtime_ns: ns(st.st_mtime as i64, st.st_mtime_nsec as i64),
            ctime_ns: ns(st.st_ctime as i64, st.st_ctime_nsec as i64),
        }
    }
}

impl Dirs {
    /// Dirs of a run whose preopened directory (WASI fd 3) is `preopen`; `record` keeps
    /// the run's [`Inputs`].
    pub(crate) fn new(preopen: Option<OwnedFd>, record: bool) -> Dirs {
        let mut d = Dirs::default();
        if let Some(fd) = preopen {
            d.host.insert(3, fd);
            d.paths.insert(3, String::new());
        }
        d.inputs = record.then(|| Inputs { complete: true, ..Inputs::default() });
        d
    }

    /// The program closed or renumbered `fd`.
    pub(crate) fn forget(&mut self, fd: u32) {
        self.host.remove(&fd);
        self.paths.remove(&fd);
        self.listings.remove(&fd);
    }

    /// Records that the program opened (or did not find) `name` in its directory `dir`.
    fn record(&mut self, dir: u32, name: &[u8], follow: bool, found: bool) {
        let Some(inputs) = self.inputs.as_mut() else { return };
        let (Some(base), Some(prefix), Ok(name)) =
            (self.host.get(&dir), self.paths.get(&dir), std::str::from_utf8(name))
        else {
            inputs.complete = false;
            return;
        };
        let path = if prefix.is_empty() { name.to_string() } else { format!("{prefix}/{name}") };
        // The first look at a path is what the run depended on: later ones add nothing
        // (a program that polls for a file must not grow this without bound).
        if !inputs.seen.insert(path.clone()) {
            return;
        }
        if !found {
            inputs.files.push((path, None));
            return;
        }
        let flags = if follow { rustix::fs::AtFlags::empty() } else { rustix::fs::AtFlags::SYMLINK_NOFOLLOW };
        // A directory's stamp changes when a name in it is added, removed or renamed, so
        // a program that lists one depends on its listing through it.
        match rustix::fs::statat(base, name, flags) {
            Ok(st) => inputs.files.push((path, Some(Stamp::of(&st)))),
            Err(_) => inputs.complete = false,
        }
    }
}

/// After WASI's `path_open` failed for want of the file: records the absence.
pub(crate) fn missing(c: &mut Caller<'_, RunState>, dir: i32, path: i32, path_len: i32, dirflags: i32) {
    let Some(mem) = c.get_export("memory").and_then(Extern::into_memory) else { return };
    let (data, state) = mem.data_and_store_mut(&mut *c);
    let path = path as u32 as usize;
    if let Some(name) = data.get(path..path + path_len as u32 as usize) {
        state.dirs.record(dir as u32, name, dirflags & SYMLINK_FOLLOW != 0, false);
    }
}

/// After WASI's `path_open` succeeded: opens the same directory on the host, if it is
/// one, and records the file among the run's inputs when it keeps them.
pub(crate) fn opened(c: &mut Caller<'_, RunState>, dir: i32, path: i32, path_len: i32, dirflags: i32, out: i32) {
    let Some(mem) = c.get_export("memory").and_then(Extern::into_memory) else { return };
    let (data, state) = mem.data_and_store_mut(&mut *c);
    let (path, out) = (path as u32 as usize, out as u32 as usize);
    let (Some(name), Some(new_fd)) = (data.get(path..path + path_len as u32 as usize), data.get(out..out + 4)) else {
        return;
    };
    let new_fd = u32::from_le_bytes(new_fd.try_into().expect("4 bytes"));
    let dir = dir as u32;
    state.dirs.record(dir, name, dirflags & SYMLINK_FOLLOW != 0, true);
    let Some(base) = state.dirs.host.get(&dir) else { return };
    let mut flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    if dirflags & SYMLINK_FOLLOW == 0 {
        flags |= OFlags::NOFOLLOW;
    }
    let name = if name.is_empty() { &b"."[..] } else { name };
    if let Ok(fd) = rustix::fs::openat2(base, name, flags, Mode::empty(), ResolveFlags::BENEATH) {
        let joined = match (state.dirs.paths.get(&dir), std::str::from_utf8(name)) {
            (Some(p), Ok(n)) if p.is_empty() => Some(n.to_string()),
            (Some(p), Ok(n)) => Some(format!("{p}/{n}")),
            _ => None,
        };
        state.dirs.listings.remove(&new_fd);
        state.dirs.host.insert(new_fd, fd);
        match joined {
            Some(p) => state.dirs.paths.insert(new_fd, p),
            None => state.dirs.paths.remove(&new_fd),
        };
    }
}

fn wasi_filetype(t: FileType) -> types::Filetype {
    match t {
        FileType::RegularFile => types::Filetype::RegularFile,
        FileType::Directory => types::Filetype::Directory,
        FileType::Symlink => types::Filetype::SymbolicLink,
        FileType::BlockDevice => types::Filetype::BlockDevice,
        FileType::CharacterDevice => types::Filetype::CharacterDevice,
        FileType::Socket => types::Filetype::SocketStream,
        _ => types::Filetype::Unknown,
    }
}

pub(crate) fn push_entry(l: &mut Listing, ino: u64, t: types::Filetype, name: &[u8]) {
    l.starts.push(l.bytes.len());
    let next = l.starts.len() as u64;
    l.bytes.extend_from_slice(&next.to_le_bytes());
    l.bytes.extend_from_slice(&ino.to_le_bytes());
    l.bytes.extend_from_slice(&(name.len() as u32).to_le_bytes());
    l.bytes.extend_from_slice(&[t as u8, 0, 0, 0]);
    l.bytes.extend_from_slice(name);
}

/// Lists a directory opened on the host: `.` and `..` first, as WASI does.
fn list_host(fd: &OwnedFd) -> Result<Listing, Errno> {
    let io = |e: rustix::io::Errno| if e == rustix::io::Errno::NOENT { Errno::Noent } else { Errno::Io };
    let dir = rustix::fs::Dir::read_from(fd).map_err(io)?;
    let ino = rustix::fs::fstat(fd).map_err(io)?.st_ino;
    let mut l = Listing { bytes: Vec::new(), starts: Vec::new() };
    push_entry(&mut l, ino, types::Filetype::Directory, b".");
    push_entry(&mut l, ino, types::Filetype::Directory, b"..");
    for entry in dir {
        let e = entry.map_err(io)?;
        let name = e.file_name().to_bytes();
        if name != b"." && name != b".." {
            push_entry(&mut l, e.ino(), wasi_filetype(e.file_type()), name);
        }
    }
    Ok(l)
}

/// `fd_readdir`, served from a listing read once per pass over the directory.
pub(crate) fn readdir(
    mut c: Caller<'_, RunState>,
    fd: i32,
    buf: i32,
    buf_len: i32,
    cookie: i64,
    out: i32,
) -> anyhow::Result<i32> {
    let fd = fd as u32;
    let dirs = &mut c.data_mut().dirs;
    if cookie == 0 || !dirs.listings.contains_key(&fd) {
        match dirs.host.get(&fd).map(list_host) {
            Some(Ok(listing)) => {
                dirs.listings.insert(fd, listing);
            }
            Some(Err(errno)) => return Ok(errno as i32),
            None => {
                // Not a directory opened here: WASI's own way.
                return with_memory(&mut c, |m, wasi| {
                    let r = in_tokio(wasi.fd_readdir(
                        m,
                        types::Fd::from(fd),
                        GuestPtr::new(buf as u32),
                        buf_len as u32,
                        cookie as u64,
                    ));
                    errno_of(r, m, |m, n| m.write(GuestPtr::new(out as u32), n))
                });
            }
        }
    }
    let mem = c.get_export("memory").and_then(Extern::into_memory);
    let mem = mem.ok_or_else(|| anyhow::anyhow!("missing required memory export"))?;
    let (data, state) = mem.data_and_store_mut(&mut c);
    Ok(serve_listing(data, &state.dirs.listings[&fd], buf, buf_len, cookie, out))
}

/// Copies what fits of `listing` from entry `cookie` on into the guest's buffer, and
/// the count of bytes copied to `out`, as `fd_readdir` does: the errno.
pub(crate) fn serve_listing(data: &mut [u8], listing: &Listing, buf: i32, buf_len: i32, cookie: i64, out: i32) -> i32 {
    let start = match usize::try_from(cookie) {
        Ok(k) if k < listing.starts.len() => listing.starts[k],
        _ => listing.bytes.len(),
    };
    let n = (listing.bytes.len() - start).min(buf_len as u32 as usize);
    let (buf, out) = (buf as u32 as usize, out as u32 as usize);
    if buf + n > data.len() || out + 4 > data.len() {
        return Errno::Fault as i32;
    }
    data[buf..buf + n].copy_from_slice(&listing.bytes[start..start + n]);
    data[out..out + 4].copy_from_slice(&(n as u32).to_le_bytes());
    0
}
