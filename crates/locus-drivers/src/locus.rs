//! The Locus driver: the blocking client, every operation.

use crate::{Attr, DirEntry, Driver, DriverError, Opened, Result, SetTime, StatFs};
use locus_client::{blocking::Client, ClientError, LocusUrl};

/// A connection to a Locus server.
pub struct LocusDriver {
    client: Client,
}

fn err(e: ClientError) -> DriverError {
    DriverError { errno: e.errno(), message: e.to_string(), transient: e.is_transient() }
}

impl LocusDriver {
    /// Connects to the server of `url`; returns the driver and the URL's path.
    pub fn connect(url: &str) -> Result<(LocusDriver, String)> {
        let u = LocusUrl::parse(url).map_err(|e| DriverError::errno(libc::EINVAL, e.to_string()))?;
        let client = Client::connect_url(&u).map_err(err)?;
        Ok((LocusDriver { client }, u.path))
    }

    /// A driver over an existing connection.
    pub fn new(client: Client) -> LocusDriver {
        LocusDriver { client }
    }
}

impl Driver for LocusDriver {
    fn name(&self) -> &'static str {
        "locus"
    }
    fn lstat(&mut self, path: &str) -> Result<Attr> {
        self.client.run(|c| c.lstat(path)).map_err(err)
    }
    fn readdir(&mut self, path: &str) -> Result<Vec<DirEntry>> {
        self.client.run(|c| c.readdir(path)).map_err(err)
    }
    fn open(&mut self, path: &str, flags: u32, mode: u32) -> Result<Opened> {
        self.client.run(|c| c.open(path, flags, mode)).map_err(err)
    }
    fn close(&mut self, handle: u64) -> Result<()> {
        // Nothing is buffered on either side (writes are synchronous), so a close cannot
        // fail in a way the program could act on: send it and do not wait for the reply,
        // which saves a round trip per open file.
        let close = locus_proto::ops::Close { handle };
        let code = <locus_proto::ops::Close as locus_proto::Operation>::INFO.code;
        let meta = locus_proto::codec::encode(&close);
        self.client.run(|c| c.send_request(code, &meta, &[], false)).map(drop).map_err(err)
    }
    fn fstat(&mut self, handle: u64) -> Result<Attr> {
        self.client.run(|c| c.fstat(handle)).map_err(err)
    }
    fn pread(&mut self, handle: u64, offset: u64, len: u32) -> Result<Vec<u8>> {
        self.client.run(|c| c.pread(handle, offset, len)).map(|b| b.to_vec()).map_err(err)
    }
    fn pwrite(&mut self, handle: u64, offset: u64, data: &[u8]) -> Result<u64> {
        self.client.run(|c| c.pwrite(handle, offset, data)).map_err(err)
    }
    fn ftruncate(&mut self, handle: u64, size: u64) -> Result<()> {
        self.client.run(|c| c.ftruncate(handle, size)).map_err(err)
    }
    fn fsync(&mut self, handle: u64) -> Result<()> {
        self.client.run(|c| c.fsync(handle)).map_err(err)
    }
    fn mkdir(&mut self, path: &str, mode: u32) -> Result<()> {
        self.client.run(|c| c.mkdir(path, mode)).map_err(err)
    }
    fn rmdir(&mut self, path: &str) -> Result<()> {
        self.client.run(|c| c.rmdir(path)).map_err(err)
    }
    fn unlink(&mut self, path: &str) -> Result<()> {
        self.client.run(|c| c.unlink(path)).map_err(err)
    }
    fn rename(&mut self, from: &str, to: &str) -> Result<()> {
        self.client.run(|c| c.rename(from, to)).map_err(err)
    }
    fn symlink(&mut self, target: &str, path: &str) -> Result<()> {
        self.client.run(|c| c.symlink(target, path)).map_err(err)
    }
    fn readlink(&mut self, path: &str) -> Result<String> {
        self.client.run(|c| c.readlink(path)).map_err(err)
    }
    fn link(&mut self, from: &str, to: &str) -> Result<()> {
        self.client.run(|c| c.link(from, to)).map_err(err)
    }
    fn truncate(&mut self, path: &str, size: u64) -> Result<()> {
        self.client.run(|c| c.truncate(path, size)).map_err(err)
    }
    fn chmod(&mut self, path: &str, mode: u32) -> Result<()> {
        self.client.run(|c| c.chmod(path, mode)).map_err(err)
    }
    fn utimes(&mut self, path: &str, atime: SetTime, mtime: SetTime) -> Result<()> {
        self.client.run(|c| c.utimes(path, atime, mtime)).map_err(err)
    }
    fn statfs(&mut self, path: &str) -> Result<StatFs> {
        self.client.run(|c| c.statfs(path)).map_err(err)
    }
    fn access(&mut self, path: &str, mode: u32) -> Result<()> {
        self.client.run(|c| c.access(path, mode)).map_err(err)
    }
}
