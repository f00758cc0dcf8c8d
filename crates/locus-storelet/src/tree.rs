//! A read-only directory made of a list of files, served to a program without being
//! made on disk: what a data node's share of a cluster run sees.
//!
//! A data node keeps each file's versions as objects named by number, not by path, so
//! a run there used to lay out a directory of hard links to them (a view) before it
//! started and remove it after: two or three file-system operations per file, paid by
//! every run however little of the tree it read. A [`Tree`] is the same names in
//! memory: a directory is a list of entries, a file the path of its object on the host
//! (or its bytes, for a small file the head keeps). Building one costs a hash-table
//! insert per file; a file is opened on the host only when the program opens it, and
//! its attributes are those of its object, read when asked.
//!
//! The program sees the tree as its preopened directory `/` (WASI fd 3). WASI's calls
//! on it are shadowed in the run's linker (`tree_linker`) by this module's: `path_open`,
//! `fd_read`, `fd_pread`, `fd_seek`, `fd_tell`, `fd_close`, `fd_readdir`,
//! `fd_filestat_get`, `path_filestat_get`, `fd_fdstat_get`, `fd_prestat_get` and
//! `fd_prestat_dir_name`, `fd_renumber`. Calls that would change it by path answer
//! `EROFS`; those on a descriptor (never open for writing) `EBADF`, as do the calls
//! left to WASI on the tree's descriptors. Standard input, output and error (fds 0 to
//! 2) are WASI's, but for seeking and positioned reads (`ESPIPE`). Paths are resolved
//! here, and `..` never leads above `/` (`EPERM`, as WASI answers for a path escaping
//! its directory). A read fills one I/O vector, as WASI's does, metered against the
//! run's limits as everywhere else (`meter`); a run holds at most 1024 files open at
//! once (`EMFILE`). A file whose object is missing stops the run with an error: its
//! output would otherwise look complete without it.

use crate::dirs::{push_entry, serve_listing, Listing};
use crate::guest::{errno_of, with_memory};
use crate::meter::{metered, trip, Bytes as Metered};
use crate::{RunState, StoreletError};
use std::collections::HashMap;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;
use wasmtime::{Caller, Extern, Linker};
use wasmtime_wasi::p1::types::{Errno, Filetype};
use wasmtime_wasi::p1::wasi_snapshot_preview1::WasiSnapshotPreview1;
use wasmtime_wasi::runtime::in_tokio;
use wiggle::{GuestMemory, GuestPtr};

const WASI: &str = "wasi_snapshot_preview1";

/// The fd of the tree's root, as WASI numbers the first preopened directory.
const ROOT_FD: u32 = 3;

/// Where a file of a [`Tree`] has its bytes.
#[derive(Clone, Debug)]
pub enum TreeFile {
    /// A file on the host (a data node's object), opened when the program opens it.
    Host(PathBuf),
    /// The bytes themselves.
    Bytes(Arc<[u8]>),
}

#[derive(Debug)]
enum Kind {
    Dir(Vec<u32>),
    File(TreeFile),
}

#[derive(Debug)]
struct Entry {
    parent: u32,
    name: Box<str>,
    kind: Kind,
}

/// A read-only directory tree held in memory (see the module's comment).
#[derive(Debug)]
pub struct Tree {
    /// Entry 0 is the root; an entry's index + 1 is its inode number.
    entries: Vec<Entry>,
    /// Each name in its directory.
    names: HashMap<(u32, Box<str>), u32>,
    /// What directories and files of bytes are dated.
    made: SystemTime,
    /// About how many bytes of memory the tree holds (see [`Tree::held_bytes`]).
    held: usize,
}

impl Default for Tree {
    fn default() -> Self {
        let root = Entry { parent: 0, name: "".into(), kind: Kind::Dir(Vec::new()) };
        Tree { entries: vec![root], names: HashMap::new(), made: SystemTime::now(), held: 0 }
    }
}

impl Tree {
    /// An empty tree.
    pub fn new() -> Tree {
        Tree::default()
    }

    /// Adds the file `path` (relative, `/`-separated, no `.` or `..`), making the
    /// directories above it. A path named twice, or through a file, is refused.
    pub fn add(&mut self, path: &str, file: TreeFile) -> Result<(), String> {
        let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
        let Some((last, dirs)) = parts.split_last() else {
            return Err(format!("{path:?}: not a file's relative path"));
        };
        if parts.iter().any(|p| *p == "." || *p == ".." || p.contains('\0')) {
            return Err(format!("{path:?}: not a file's relative path"));
        }
        let mut at = 0u32;
        for part in dirs {
            at = match self.names.get(&(at, (*part).into())) {
                Some(&i) if matches!(self.entries[i as usize].kind, Kind::Dir(_)) => i,
                Some(_) => return Err(format!("{path:?}: {part} is a file")),
                None => self.push(at, part, Kind::Dir(Vec::new())),
            };
        }
        if self.names.contains_key(&(at, (*last).into())) {
            return Err(format!("{path:?}: named twice"));
        }
        self.push(at, last, Kind::File(file));
        Ok(())
    }

    /// The number of files and directories, the root included.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// About how many bytes of memory the tree holds: its entries, names and index (as
    /// allocated, spare room included), and its files' host paths and bytes (what one
    /// that is kept costs).
    pub fn held_bytes(&self) -> usize {
        let slot = std::mem::size_of::<((u32, Box<str>), u32)>() + 1;
        self.held + self.entries.capacity() * std::mem::size_of::<Entry>() + self.names.capacity() * slot
    }

    /// Whether the tree holds nothing but its root.
    pub fn is_empty(&self) -> bool {
        self.entries.len() == 1
    }

    fn push(&mut self, parent: u32, name: &str, kind: Kind) -> u32 {
        let i = self.entries.len() as u32;
        // Beyond the entry and its index slot (counted by capacity): its name twice (here
        // and in the index), its place in its directory (with room to grow), and its
        // file's path or bytes.
        let file = match &kind {
            Kind::File(TreeFile::Host(path)) => path.as_os_str().len(),
            Kind::File(TreeFile::Bytes(bytes)) => bytes.len(),
            Kind::Dir(_) => 0,
        };
        self.held += 2 * name.len() + 8 + file;
        self.entries.push(Entry { parent, name: name.into(), kind });
        self.names.insert((parent, name.into()), i);
        if let Kind::Dir(children) = &mut self.entries[parent as usize].kind {
            children.push(i);
        }
        i
    }

    /// The entry `path` names from the directory `from`.
    fn resolve(&self, from: u32, path: &[u8]) -> Result<u32, Errno> {
        let path = std::str::from_utf8(path).map_err(|_| Errno::Ilseq)?;
        if path.starts_with('/') {
            return Err(Errno::Perm);
        }
        let mut at = from;
        let mut parts = path.split('/').peekable();
        while let Some(part) = parts.next() {
            if !matches!(self.entries[at as usize].kind, Kind::Dir(_)) {
                return Err(Errno::Notdir);
            }
            at = match part {
                "" | "." => at,
                ".." if at == 0 => return Err(Errno::Perm),
                ".." => self.entries[at as usize].parent,
                name => *self.names.get(&(at, name.into())).ok_or(Errno::Noent)?,
            };
            // `file/` names a directory that is not there.
            if parts.peek() == Some(&"") && !matches!(self.entries[at as usize].kind, Kind::Dir(_)) {
                return Err(Errno::Notdir);
            }
        }
        Ok(at)
    }

    /// The WASI `filestat` of entry `i` (64 bytes), from its object for a host file.
    fn filestat(&self, i: u32, open: Option<&std::fs::File>) -> Result<[u8; 64], Errno> {
        let at = |t: SystemTime| t.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        let made = at(self.made);
        let (kind, size, atim, mtim, ctim) = match &self.entries[i as usize].kind {
            Kind::Dir(_) => (Filetype::Directory, 4096, made, made, made),
            Kind::File(TreeFile::Bytes(b)) => (Filetype::RegularFile, b.len() as u64, made, made, made),
            Kind::File(TreeFile::Host(path)) => {
                let meta = match open {
                    Some(f) => f.metadata(),
                    None => std::fs::metadata(path),
                };
                let m = meta.map_err(|e| match e.kind() {
                    std::io::ErrorKind::NotFound => Errno::Noent,
                    _ => Errno::Io,
                })?;
                let ns = |s: i64, n: i64| (s as u64).wrapping_mul(1_000_000_000).wrapping_add(n as u64);
                let (a, mt, c) =
                    (ns(m.atime(), m.atime_nsec()), ns(m.mtime(), m.mtime_nsec()), ns(m.ctime(), m.ctime_nsec()));
                (Filetype::RegularFile, m.len(), a, mt, c)
            }
        };
        let mut out = [0u8; 64];
        out[8..16].copy_from_slice(&(i as u64 + 1).to_le_bytes());
        out[16] = kind as u8;
        out[24..32].copy_from_slice(&1u64.to_le_bytes());
        out[32..40].copy_from_slice(&size.to_le_bytes());
        out[40..48].copy_from_slice(&atim.to_le_bytes());
        out[48..56].copy_from_slice(&mtim.to_le_bytes());
        out[56..64].copy_from_slice(&ctim.to_le_bytes());
        Ok(out)
    }

    /// Entry `i`'s listing: `.` and `..`, then its entries as they were added.
    fn listing(&self, i: u32) -> Listing {
        let mut l = Listing::default();
        push_entry(&mut l, i as u64 + 1, Filetype::Directory, b".");
        push_entry(&mut l, self.entries[i as usize].parent as u64 + 1, Filetype::Directory, b"..");
        if let Kind::Dir(children) = &self.entries[i as usize].kind {
            for &c in children {
                let e = &self.entries[c as usize];
                let t = if matches!(e.kind, Kind::Dir(_)) { Filetype::Directory } else { Filetype::RegularFile };
                push_entry(&mut l, c as u64 + 1, t, e.name.as_bytes());
            }
        }
        l
    }
}

/// An entry of the tree the program has open.
struct Open {
    entry: u32,
    /// A host file's, once opened.
    file: Option<std::fs::File>,
    pos: u64,
    listing: Option<Arc<Listing>>,
}

/// A run's tree and what the program has open in it, by fd.
pub(crate) struct TreeFds {
    tree: Arc<Tree>,
    open: HashMap<u32, Open>,
    /// Directories listed so far, by entry: made once however often they are read.
    listings: HashMap<u32, Arc<Listing>>,
}

impl TreeFds {
    /// The tree opened as the run's preopened directory.
    pub(crate) fn new(tree: Arc<Tree>) -> TreeFds {
        let root = Open { entry: 0, file: None, pos: 0, listing: None };
        TreeFds { tree, open: HashMap::from([(ROOT_FD, root)]), listings: HashMap::new() }
    }

    /// The lowest fd above the root's that is free.
    fn next_fd(&self) -> u32 {
        (ROOT_FD + 1..).find(|fd| !self.open.contains_key(fd)).expect("fewer than 4 billion open files")
    }
}

/// The guest's memory and the run's tree, for a host function.
fn parts<'a>(c: &'a mut Caller<'_, RunState>) -> anyhow::Result<(&'a mut [u8], &'a mut RunState)> {
    let mem = c.get_export("memory").and_then(Extern::into_memory);
    let mem = mem.ok_or_else(|| anyhow::anyhow!("missing required memory export"))?;
    Ok(mem.data_and_store_mut(c))
}

fn tree_of(state: &mut RunState) -> &mut TreeFds {
    state.tree.as_mut().expect("a tree run's state has its tree")
}

fn slice(data: &[u8], ptr: i32, len: i32) -> Option<&[u8]> {
    let (at, len) = (ptr as u32 as usize, len as u32 as usize);
    data.get(at..at.checked_add(len)?)
}

fn put(data: &mut [u8], ptr: i32, bytes: &[u8]) -> Result<(), Errno> {
    let at = ptr as u32 as usize;
    data.get_mut(at..at + bytes.len()).ok_or(Errno::Fault)?.copy_from_slice(bytes);
    Ok(())
}

/// Runs `f` with the guest's memory, the run's tree and what `fd` has open in it
/// (`EBADF` when nothing).
fn with_open(
    c: &mut Caller<'_, RunState>,
    fd: i32,
    f: impl FnOnce(&mut [u8], &Tree, &Open) -> anyhow::Result<i32>,
) -> anyhow::Result<i32> {
    let (data, state) = parts(c)?;
    let fds = tree_of(state);
    match fds.open.get(&(fd as u32)) {
        Some(open) => f(data, &fds.tree, open),
        None => Ok(Errno::Badf as i32),
    }
}

/// A stat call on standard input, output or error, answered by WASI: its result
/// written at `out`.
fn stdio_stat<T: wiggle::GuestType>(
    c: &mut Caller<'_, RunState>,
    out: i32,
    call: impl FnOnce(&mut GuestMemory<'_>, &mut wasmtime_wasi::p1::WasiP1Ctx) -> Result<T, wasmtime_wasi::p1::types::Error>,
) -> anyhow::Result<i32> {
    with_memory(c, |m, wasi| {
        let r = call(m, wasi);
        errno_of(r, m, |m, st| m.write(GuestPtr::new(out as u32), st))
    })
}

/// The errno a call's result comes to.
fn errno(r: Result<(), Errno>) -> anyhow::Result<i32> {
    Ok(r.err().map_or(0, |e| e as i32))
}

/// Rights a file of the tree is opened with, and a directory's.
const FILE_RIGHTS: u64 = (1 << 1) | (1 << 2) | (1 << 5) | (1 << 7) | (1 << 21) | (1 << 27);
const DIR_RIGHTS: u64 = (1 << 13) | (1 << 14) | (1 << 15) | (1 << 18) | (1 << 21);
const RIGHT_FD_WRITE: u64 = 1 << 6;
/// `oflags` creat, excl and trunc; `fdflags` append, dsync, rsync and sync.
const OFLAGS_CHANGING: i32 = 1 | 4 | 8;
const FDFLAGS_CHANGING: i32 = 1 | 2 | 8 | 16;
const OFLAG_DIRECTORY: i32 = 2;

/// Files of the host a run may hold open at once.
const MAX_OPEN_FILES: usize = 1024;

/// What stops a run whose file's bytes are not where the tree says: the run would
/// otherwise go on without that file, and its output look complete.
fn missing(tree: &Tree, entry: u32) -> anyhow::Error {
    let mut path = Vec::new();
    let mut at = entry;
    while at != 0 {
        path.push(&*tree.entries[at as usize].name);
        at = tree.entries[at as usize].parent;
    }
    path.reverse();
    anyhow::anyhow!("/{}: its version is missing here", path.join("/"))
}

/// The errno of a stat of entry `at`, or what stops the run when its bytes are missing.
fn stat_errno(tree: &Tree, at: u32, e: Errno) -> anyhow::Result<i32> {
    match (e, &tree.entries[at as usize].kind) {
        (Errno::Noent, Kind::File(TreeFile::Host(_))) => Err(missing(tree, at)),
        _ => Ok(e as i32),
    }
}

/// `path_open` in the tree.
#[allow(clippy::too_many_arguments)]
fn path_open(
    mut c: Caller<'_, RunState>,
    dir: i32,
    _lookup: i32,
    path: i32,
    path_len: i32,
    oflags: i32,
    base: i64,
    _inheriting: i64,
    fdflags: i32,
    out: i32,
) -> anyhow::Result<i32> {
    let s = c.data_mut();
    if s.io.files_opened >= s.limits.files {
        let detail = format!("opened {} files", s.io.files_opened);
        return Err(trip(s, "files opened", detail));
    }
    let (data, state) = parts(&mut c)?;
    let fds = tree_of(state);
    let Some(from) = fds.open.get(&(dir as u32)).map(|o| o.entry) else { return Ok(Errno::Badf as i32) };
    let Some(name) = slice(data, path, path_len) else { return Ok(Errno::Fault as i32) };
    let at = match fds.tree.resolve(from, name) {
        Ok(at) => at,
        Err(Errno::Noent) if oflags & 1 != 0 => return Ok(Errno::Rofs as i32),
        Err(e) => return Ok(e as i32),
    };
    if oflags & OFLAGS_CHANGING != 0 || fdflags & FDFLAGS_CHANGING != 0 {
        return Ok(Errno::Rofs as i32);
    }
    let file = match &fds.tree.entries[at as usize].kind {
        Kind::Dir(_) => None,
        Kind::File(_) if oflags & OFLAG_DIRECTORY != 0 => return Ok(Errno::Notdir as i32),
        Kind::File(_) if base as u64 & RIGHT_FD_WRITE != 0 => return Ok(Errno::Rofs as i32),
        Kind::File(TreeFile::Bytes(_)) => None,
        Kind::File(TreeFile::Host(_)) if fds.open.values().filter(|o| o.file.is_some()).count() >= MAX_OPEN_FILES => {
            return Ok(Errno::Mfile as i32)
        }
        Kind::File(TreeFile::Host(p)) => match std::fs::File::open(p) {
            Ok(f) => Some(f),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(missing(&fds.tree, at)),
            Err(_) => return Ok(Errno::Io as i32),
        },
    };
    let fd = fds.next_fd();
    if let Err(e) = put(data, out, &fd.to_le_bytes()) {
        return Ok(e as i32);
    }
    fds.open.insert(fd, Open { entry: at, file, pos: 0, listing: None });
    state.io.files_opened += 1;
    Ok(0)
}

/// Reads at most `most` bytes from an open file of the tree at `offset` into the first
/// non-empty of the guest's `n` I/O vectors at `iovs`, as WASI does (one read per
/// call, so the run's limits are checked between reads): the count read.
#[allow(clippy::too_many_arguments)]
fn read_iovs(
    data: &mut [u8],
    tree: &Tree,
    open: &Open,
    iovs: i32,
    n: i32,
    offset: u64,
    most: u64,
) -> Result<u64, Errno> {
    let (buf, len) = (0..n.max(0) as usize)
        .map(|k| -> Result<(usize, usize), Errno> {
            let at = (iovs as u32 as usize).checked_add(k * 8).ok_or(Errno::Fault)?;
            let iov = data.get(at..at + 8).ok_or(Errno::Fault)?;
            let buf = u32::from_le_bytes(iov[0..4].try_into().expect("4 bytes")) as usize;
            Ok((buf, u32::from_le_bytes(iov[4..8].try_into().expect("4 bytes")) as usize))
        })
        .find(|iov| !matches!(iov, Ok((_, 0))))
        .unwrap_or(Ok((0, 0)))?;
    let len = len.min(most.min(u32::MAX as u64) as usize);
    let into = data.get_mut(buf..buf.checked_add(len).ok_or(Errno::Fault)?).ok_or(Errno::Fault)?;
    let got = match (&tree.entries[open.entry as usize].kind, &open.file) {
        (Kind::Dir(_), _) => return Err(Errno::Isdir),
        (Kind::File(TreeFile::Bytes(b)), _) => {
            let start = offset.min(b.len() as u64) as usize;
            let m = (b.len() - start).min(len);
            into[..m].copy_from_slice(&b[start..start + m]);
            m
        }
        (_, Some(f)) => f.read_at(into, offset).map_err(|_| Errno::Io)?,
        (_, None) => return Err(Errno::Badf),
    };
    Ok(got as u64)
}

/// `fd_read` (`at` None) and `fd_pread` on a file of the tree; fds 0 to 2 go to WASI.
fn read(c: &mut Caller<'_, RunState>, fd: i32, iovs: i32, n: i32, at: Option<u64>, out: i32) -> anyhow::Result<i32> {
    let s = c.data_mut();
    if s.io.read_bytes >= s.limits.read_bytes {
        let detail = format!("read {} bytes", s.io.read_bytes);
        return Err(trip(s, "bytes read", detail));
    }
    let (data, state) = parts(c)?;
    let most = state.limits.read_bytes - state.io.read_bytes;
    let fds = tree_of(state);
    let Some(open) = fds.open.get(&(fd as u32)) else { return Ok(Errno::Badf as i32) };
    let got = match read_iovs(data, &fds.tree, open, iovs, n, at.unwrap_or(open.pos), most) {
        Ok(got) => got,
        Err(e) => return Ok(e as i32),
    };
    if at.is_none() {
        fds.open.get_mut(&(fd as u32)).expect("open above").pos += got;
    }
    state.io.read_bytes += got;
    errno(put(data, out, &(got as u32).to_le_bytes()))
}

/// `path_filestat_get` in the tree.
fn path_filestat_get(
    mut c: Caller<'_, RunState>,
    dir: i32,
    _flags: i32,
    path: i32,
    path_len: i32,
    out: i32,
) -> anyhow::Result<i32> {
    let (data, state) = parts(&mut c)?;
    let fds = tree_of(state);
    let Some(from) = fds.open.get(&(dir as u32)).map(|o| o.entry) else { return Ok(Errno::Badf as i32) };
    let Some(name) = slice(data, path, path_len) else { return Ok(Errno::Fault as i32) };
    let at = match fds.tree.resolve(from, name) {
        Ok(at) => at,
        Err(e) => return Ok(e as i32),
    };
    match fds.tree.filestat(at, None) {
        Ok(st) => errno(put(data, out, &st)),
        Err(e) => stat_errno(&fds.tree, at, e),
    }
}

/// `fd_readdir` on a directory of the tree, its listing made once per pass.
fn readdir(mut c: Caller<'_, RunState>, fd: i32, buf: i32, buf_len: i32, cookie: i64, out: i32) -> anyhow::Result<i32> {
    let (data, state) = parts(&mut c)?;
    let fds = tree_of(state);
    let tree = fds.tree.clone();
    let Some(open) = fds.open.get_mut(&(fd as u32)) else { return Ok(Errno::Badf as i32) };
    if !matches!(tree.entries[open.entry as usize].kind, Kind::Dir(_)) {
        return Ok(Errno::Notdir as i32);
    }
    if open.listing.is_none() {
        let listing = fds.listings.entry(open.entry).or_insert_with(|| Arc::new(tree.listing(open.entry)));
        open.listing = Some(listing.clone());
    }
    Ok(serve_listing(data, open.listing.as_ref().expect("made above"), buf, buf_len, cookie, out))
}

/// Links the tree's calls into `linker` (see the module's comment): a linker for runs
/// that see a [`Tree`].
pub(crate) fn add_to_linker(linker: &mut Linker<RunState>) -> Result<(), StoreletError> {
    let setup = |e: anyhow::Error| StoreletError::Setup(e.to_string());
    linker.allow_shadowing(true);
    linker.func_wrap(WASI, "path_open", path_open).map_err(setup)?;
    linker
        .func_wrap(WASI, "fd_read", |mut c: Caller<'_, RunState>, fd: i32, iovs: i32, n: i32, out: i32| {
            if fd <= 2 {
                return metered(&mut c, Metered::Read, fd, out, |m, wasi| {
                    in_tokio(wasi.fd_read(m, (fd as u32).into(), GuestPtr::new((iovs as u32, n as u32))))
                });
            }
            read(&mut c, fd, iovs, n, None, out)
        })
        .map_err(setup)?;
    linker
        .func_wrap(WASI, "fd_pread", |mut c: Caller<'_, RunState>, fd: i32, iovs: i32, n: i32, at: i64, out: i32| {
            match fd {
                0..=2 => Ok(Errno::Spipe as i32),
                _ if at < 0 => Ok(Errno::Inval as i32),
                _ => read(&mut c, fd, iovs, n, Some(at as u64), out),
            }
        })
        .map_err(setup)?;
    linker
        .func_wrap(WASI, "fd_seek", |mut c: Caller<'_, RunState>, fd: i32, delta: i64, whence: i32, out: i32| {
            if fd <= 2 {
                return Ok(Errno::Spipe as i32);
            }
            let (data, state) = parts(&mut c)?;
            let fds = tree_of(state);
            let tree = fds.tree.clone();
            let Some(open) = fds.open.get_mut(&(fd as u32)) else { return Ok(Errno::Badf as i32) };
            let size = match &tree.entries[open.entry as usize].kind {
                Kind::Dir(_) => return Ok(Errno::Isdir as i32),
                Kind::File(TreeFile::Bytes(b)) => b.len() as u64,
                Kind::File(TreeFile::Host(_)) => {
                    open.file.as_ref().and_then(|f| f.metadata().ok()).map_or(0, |m| m.len())
                }
            };
            let base = match whence {
                0 => 0,
                1 => open.pos,
                2 => size,
                _ => return Ok(Errno::Inval as i32),
            };
            let Some(pos) = base.checked_add_signed(delta).filter(|p| *p <= i64::MAX as u64) else {
                return Ok(Errno::Inval as i32);
            };
            open.pos = pos;
            errno(put(data, out, &pos.to_le_bytes()))
        })
        .map_err(setup)?;
    linker
        .func_wrap(WASI, "fd_tell", |mut c: Caller<'_, RunState>, fd: i32, out: i32| {
            if fd <= 2 {
                return Ok(Errno::Spipe as i32);
            }
            with_open(&mut c, fd, |data, _, open| errno(put(data, out, &open.pos.to_le_bytes())))
        })
        .map_err(setup)?;
    linker
        .func_wrap(WASI, "fd_close", |mut c: Caller<'_, RunState>, fd: i32| -> anyhow::Result<i32> {
            if fd <= 2 {
                let r = in_tokio(c.data_mut().wasi.fd_close(&mut GuestMemory::Unshared(&mut []), (fd as u32).into()));
                return errno_of(r, &mut GuestMemory::Unshared(&mut []), |_, ()| Ok(()));
            }
            Ok(match tree_of(c.data_mut()).open.remove(&(fd as u32)) {
                Some(_) => 0,
                None => Errno::Badf as i32,
            })
        })
        .map_err(setup)?;
    linker
        .func_wrap(WASI, "fd_renumber", |mut c: Caller<'_, RunState>, from: i32, to: i32| -> anyhow::Result<i32> {
            if from > 2 || to > 2 {
                // The tree's fds keep their numbers.
                return Ok(Errno::Notsup as i32);
            }
            let (from, to) = ((from as u32).into(), (to as u32).into());
            let r = c.data_mut().wasi.fd_renumber(&mut GuestMemory::Unshared(&mut []), from, to);
            errno_of(r, &mut GuestMemory::Unshared(&mut []), |_, ()| Ok(()))
        })
        .map_err(setup)?;
    linker.func_wrap(WASI, "fd_readdir", readdir).map_err(setup)?;
    linker
        .func_wrap(WASI, "fd_filestat_get", |mut c: Caller<'_, RunState>, fd: i32, out: i32| {
            if fd <= 2 {
                return stdio_stat(&mut c, out, |m, wasi| in_tokio(wasi.fd_filestat_get(m, (fd as u32).into())));
            }
            with_open(&mut c, fd, |data, tree, open| match tree.filestat(open.entry, open.file.as_ref()) {
                Ok(st) => errno(put(data, out, &st)),
                Err(e) => stat_errno(tree, open.entry, e),
            })
        })
        .map_err(setup)?;
    linker.func_wrap(WASI, "path_filestat_get", path_filestat_get).map_err(setup)?;
    linker
        .func_wrap(WASI, "fd_fdstat_get", |mut c: Caller<'_, RunState>, fd: i32, out: i32| {
            if fd <= 2 {
                return stdio_stat(&mut c, out, |m, wasi| in_tokio(wasi.fd_fdstat_get(m, (fd as u32).into())));
            }
            with_open(&mut c, fd, |data, tree, open| {
                let (kind, base, inheriting) = match tree.entries[open.entry as usize].kind {
                    Kind::Dir(_) => (Filetype::Directory, DIR_RIGHTS, DIR_RIGHTS | FILE_RIGHTS),
                    Kind::File(_) => (Filetype::RegularFile, FILE_RIGHTS, 0),
                };
                let mut st = [0u8; 24];
                st[0] = kind as u8;
                st[8..16].copy_from_slice(&base.to_le_bytes());
                st[16..24].copy_from_slice(&inheriting.to_le_bytes());
                errno(put(data, out, &st))
            })
        })
        .map_err(setup)?;
    linker
        .func_wrap(WASI, "fd_prestat_get", |mut c: Caller<'_, RunState>, fd: i32, out: i32| {
            if fd as u32 != ROOT_FD {
                return Ok(Errno::Badf as i32);
            }
            let (data, _) = parts(&mut c)?;
            let mut st = [0u8; 8];
            st[4..8].copy_from_slice(&1u32.to_le_bytes());
            errno(put(data, out, &st))
        })
        .map_err(setup)?;
    linker
        .func_wrap(WASI, "fd_prestat_dir_name", |mut c: Caller<'_, RunState>, fd: i32, buf: i32, len: i32| {
            if fd as u32 != ROOT_FD {
                return Ok(Errno::Badf as i32);
            }
            if len < 1 {
                return Ok(Errno::Nametoolong as i32);
            }
            let (data, _) = parts(&mut c)?;
            errno(put(data, buf, b"/"))
        })
        .map_err(setup)?;
    // What would change the tree.
    let rofs = |_: Caller<'_, RunState>, _: i32, _: i32, _: i32| Ok(Errno::Rofs as i32);
    for name in ["path_create_directory", "path_unlink_file", "path_remove_directory"] {
        linker.func_wrap(WASI, name, rofs).map_err(setup)?;
    }
    linker
        .func_wrap(WASI, "path_rename", |_: Caller<'_, RunState>, _: i32, _: i32, _: i32, _: i32, _: i32, _: i32| {
            Ok(Errno::Rofs as i32)
        })
        .map_err(setup)?;
    linker
        .func_wrap(
            WASI,
            "path_link",
            |_: Caller<'_, RunState>, _: i32, _: i32, _: i32, _: i32, _: i32, _: i32, _: i32| Ok(Errno::Rofs as i32),
        )
        .map_err(setup)?;
    linker
        .func_wrap(WASI, "path_symlink", |_: Caller<'_, RunState>, _: i32, _: i32, _: i32, _: i32, _: i32| {
            Ok(Errno::Rofs as i32)
        })
        .map_err(setup)?;
    linker
        .func_wrap(WASI, "path_readlink", |_: Caller<'_, RunState>, _: i32, _: i32, _: i32, _: i32, _: i32, _: i32| {
            Ok(Errno::Inval as i32)
        })
        .map_err(setup)?;
    linker.allow_shadowing(false);
    Ok(())
}
