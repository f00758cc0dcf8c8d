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

use crate::meter::{errno_of, with_memory};
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
struct Listing {
    bytes: Vec<u8>,
    starts: Vec<usize>,
}

/// The host side of a run's open directories, by WASI fd.
#[derive(Default)]
pub(crate) struct Dirs {
    host: HashMap<u32, OwnedFd>,
    listings: HashMap<u32, Listing>,
}

impl Dirs {
    /// Dirs of a run whose preopened directory (WASI fd 3) is `preopen`.
    pub(crate) fn new(preopen: Option<OwnedFd>) -> Dirs {
        let mut d = Dirs::default();
        if let Some(fd) = preopen {
            d.host.insert(3, fd);
        }
        d
    }

    /// The program closed or renumbered `fd`.
    pub(crate) fn forget(&mut self, fd: u32) {
        self.host.remove(&fd);
        self.listings.remove(&fd);
    }
}

/// After WASI's `path_open` succeeded: opens the same directory on the host, if it is one.
pub(crate) fn opened(c: &mut Caller<'_, RunState>, dir: i32, path: i32, path_len: i32, dirflags: i32, out: i32) {
    let Some(mem) = c.get_export("memory").and_then(Extern::into_memory) else { return };
    let (data, state) = mem.data_and_store_mut(&mut *c);
    let (path, out) = (path as u32 as usize, out as u32 as usize);
    let (Some(name), Some(new_fd)) = (data.get(path..path + path_len as u32 as usize), data.get(out..out + 4)) else {
        return;
    };
    let new_fd = u32::from_le_bytes(new_fd.try_into().expect("4 bytes"));
    let Some(base) = state.dirs.host.get(&(dir as u32)) else { return };
    let mut flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    if dirflags & SYMLINK_FOLLOW == 0 {
        flags |= OFlags::NOFOLLOW;
    }
    let name = if name.is_empty() { &b"."[..] } else { name };
    if let Ok(fd) = rustix::fs::openat2(base, name, flags, Mode::empty(), ResolveFlags::BENEATH) {
        state.dirs.listings.remove(&new_fd);
        state.dirs.host.insert(new_fd, fd);
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

fn push_entry(l: &mut Listing, ino: u64, t: types::Filetype, name: &[u8]) {
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
    let listing = &state.dirs.listings[&fd];
    let start = match usize::try_from(cookie) {
        Ok(k) if k < listing.starts.len() => listing.starts[k],
        _ => listing.bytes.len(),
    };
    let n = (listing.bytes.len() - start).min(buf_len as u32 as usize);
    let (buf, out) = (buf as u32 as usize, out as u32 as usize);
    if buf + n > data.len() || out + 4 > data.len() {
        return Ok(Errno::Fault as i32);
    }
    data[buf..buf + n].copy_from_slice(&listing.bytes[start..start + n]);
    data[out..out + 4].copy_from_slice(&(n as u32).to_le_bytes());
    Ok(0)
}
