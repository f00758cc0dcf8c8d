//! Notifications: the file system tells the kernel what to forget or what to cache,
//! from any thread, by writes to /dev/fuse (with io_uring too).

use crate::abi::{notify, Put};
use crate::classic::send;
use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

/// Sends notifications to the kernel for one session.
#[derive(Clone, Debug)]
pub struct Notifier {
    pub(crate) fuse: Arc<OwnedFd>,
}

impl Notifier {
    /// The kernel forgets the name `name` in directory `parent` (and the listing's
    /// cached pages of it). `ENOENT` when the kernel had nothing cached.
    pub fn inval_entry(&self, parent: u64, name: &OsStr) -> io::Result<()> {
        let name = name.as_bytes();
        let mut b = Vec::with_capacity(16 + name.len() + 1);
        b.u64(parent);
        b.u32(name.len() as u32);
        b.u32(0);
        b.extend_from_slice(name);
        b.push(0);
        self.send(notify::INVAL_ENTRY, &b)
    }

    /// The kernel forgets `ino`'s attributes and, from `offset` for `len` bytes (0: to
    /// the end; a negative offset: attributes only), its cached pages.
    pub fn inval_inode(&self, ino: u64, offset: i64, len: i64) -> io::Result<()> {
        let mut b = Vec::with_capacity(24);
        b.u64(ino);
        b.u64(offset as u64);
        b.u64(len as u64);
        self.send(notify::INVAL_INODE, &b)
    }

    /// Puts `data` into `ino`'s page cache at `offset`, as if read.
    pub fn store(&self, ino: u64, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut b = Vec::with_capacity(24 + data.len());
        b.u64(ino);
        b.u64(offset);
        b.u32(data.len() as u32);
        b.u32(0);
        b.extend_from_slice(data);
        self.send(notify::STORE, &b)
    }

    fn send(&self, code: i32, body: &[u8]) -> io::Result<()> {
        send(self.fuse.as_raw_fd(), 0, code, body)
    }
}
