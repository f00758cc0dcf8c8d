//! Feeds arbitrary bytes to the FUSE request parser as if the kernel had sent them
//! (`locus_fuse::serve_one_request`: a header, then an opcode's arguments), on a file
//! system that answers every request it gets: nothing may panic, and every answer is an
//! errno the kernel takes (or success).
//! Run: `cargo +nightly fuzz run fuse_requests -- -max_total_time=600`
#![no_main]

use libfuzzer_sys::fuzz_target;
use locus_fuse::*;
use std::ffi::OsStr;
use std::time::{Duration, UNIX_EPOCH};

struct Answers;

fn attr(ino: u64) -> FileAttr {
    FileAttr {
        ino,
        size: 3,
        blocks: 1,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0o644,
        nlink: 1,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

impl Filesystem for Answers {
    fn lookup(&mut self, _req: &Request<'_>, parent: u64, _name: &OsStr, reply: ReplyEntry<'_>) {
        reply.entry(&Duration::from_secs(1), &attr(parent + 1), 0);
    }
    fn getattr(&mut self, _req: &Request<'_>, ino: u64, _fh: Option<u64>, reply: ReplyAttr<'_>) {
        reply.attr(&Duration::from_secs(1), &attr(ino));
    }
    fn setattr(&mut self, _req: &Request<'_>, ino: u64, _set: SetAttr, reply: ReplyAttr<'_>) {
        reply.attr(&Duration::ZERO, &attr(ino));
    }
    fn read(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        _fh: u64,
        _off: i64,
        size: u32,
        _f: i32,
        _l: Option<u64>,
        reply: ReplyData<'_>,
    ) {
        reply.data(&vec![7u8; (size as usize).min(1 << 16)]);
    }
    fn write(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        _fh: u64,
        _off: i64,
        data: &[u8],
        _w: u32,
        _f: i32,
        _l: Option<u64>,
        reply: ReplyWrite<'_>,
    ) {
        reply.written(data.len() as u32);
    }
    fn readdir(&mut self, _req: &Request<'_>, ino: u64, _fh: u64, offset: i64, mut reply: ReplyDirectory<'_>) {
        for i in offset.max(0)..offset.max(0) + 100 {
            if reply.add(ino + i as u64, i + 1, FileType::RegularFile, format!("n{i}")) {
                break;
            }
        }
        reply.ok();
    }
    fn unlink(&mut self, _req: &Request<'_>, _parent: u64, _name: &OsStr, reply: ReplyEmpty<'_>) {
        reply.error(-7); // an errno the kernel would drop: answered as EIO
    }
}

fuzz_target!(|data: &[u8]| {
    if let Some((error, _body)) = serve_one_request(&mut Answers, data) {
        assert!(error == 0 || (-511..=-1).contains(&error), "{error}");
    }
});
