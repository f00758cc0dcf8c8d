//! The head's side of the protocol: [`HeadSession`] answers each operation from
//! the namespace and the nodes, checking rights on the namespace's ACLs.
//!
//! Longer than 700 lines because it is one trait impl (a method per operation of the
//! table), which Rust keeps in one file; what is not the table's lives in the other
//! rooms (`links`, `active_files`, `changes`, `fanout`, `copies`).

use crate::cluster::attr_of;
use crate::cluster::fanout::{merge_runs, Planned, Writes};
use crate::cluster::governing;
use crate::cluster::meta_err;
use crate::cluster::placement::later;
use crate::cluster::placement::slice;
use crate::cluster::placement::stream_file;
use crate::cluster::writes::Staged;
use crate::cluster::Head;
use crate::dispatch::Reply;
use crate::dispatch::{Answer, Encoded, Handler};
use crate::session::Session;
use crate::transport::{Body, EventStream};
use crate::Connection;
use bytes::Bytes;
use locus_cluster::{normalise, split, Content, Entry, Kind as EntryKind, MetaError};
use locus_proto::capability::{HEAD_SUBJECT, NODE_SUBJECT};

use locus_proto::ops::*;
use locus_proto::types::*;
use locus_proto::{Code, Error as WireError};
use std::collections::HashMap;

use std::os::unix::fs::FileExt;
use std::sync::Arc;

/// An open handle on a head.
pub(crate) struct HeadHandle {
    pub(crate) entry: Entry,
    pub(crate) staged: Option<Staged>,
}

/// One connection to a head. Authentication, `ping`, `whoami` and `stats` are the
/// ordinary server's; the namespace and file operations are the cluster's.
pub struct HeadSession {
    pub(crate) inner: Session,
    pub(crate) head: Arc<Head>,
    pub(crate) handles: HashMap<u64, HeadHandle>,
    pub(crate) next_handle: u64,
    pub(crate) puts: HashMap<u32, Staged>,
    pub(crate) current: (u32, bool),
    /// This connection turned callbacks on: what it asks about is promised.
    callbacks_on: bool,
    /// Paths the request being answered asked about and holds no promise on.
    unpromised: Vec<String>,
}

/// Client `by` changed `paths` (with `names`: made or removed names there) through this
/// head: the promises this head's other clients hold on them break, and the other
/// heads are told, to break their clients' (`changes`).
pub(crate) fn changed(shared: &crate::Shared, head: &Head, by: u64, paths: &[&str], names: bool) {
    paths.iter().for_each(|p| head.plans.changed(p));
    shared.callbacks.changed(&shared.registry, by, paths, names);
    head.announce(paths, names);
}

/// Script sources kept in the namespace for calls by id through any head.
const SCRIPTS_KEPT: u64 = 10_000;

pub(crate) fn not_here<T>(what: &str) -> Reply<T> {
    Err(WireError::new(Code::NOTSUP, format!("{what} is not available on a cluster head yet")))
}

/// Refuses unless `rights` (in directory `dir`) include `need`.
pub(crate) fn check(rights: Rights, need: Rights, dir: &str) -> Result<(), WireError> {
    match rights.contains(need) {
        true => Ok(()),
        false => Err(WireError::new(Code::ACCES, format!("{dir}: permission denied (needs '{need}' right)"))),
    }
}

impl Drop for HeadSession {
    /// The versions this connection's read handles kept from collection are let go.
    fn drop(&mut self) {
        for h in self.handles.values().filter(|h| h.staged.is_none()) {
            self.head.release(&h.entry);
        }
    }
}

impl HeadSession {
    /// A session for a new connection.
    pub fn new(inner: Session, head: Arc<Head>) -> Self {
        HeadSession {
            inner,
            head,
            handles: HashMap::new(),
            next_handle: 1,
            puts: HashMap::new(),
            current: (0, false),
            callbacks_on: false,
            unpromised: Vec::new(),
        }
    }

    /// Promises this client a break when `path` (with `listing`, a directory being
    /// listed) changes, as a single server does (`Session::promise`): only if callbacks
    /// are on and the subject holds `need` in the directory the operation looks in.
    fn promise(&mut self, path: &str, listing: bool, need: Rights) {
        if !self.callbacks_on {
            return;
        }
        use crate::callbacks::Asked;
        let (canonical, dir) = match crate::callbacks::asked(path, listing) {
            Asked::Nothing => return,
            Asked::Refused(canonical) => return self.unpromised.push(canonical),
            Asked::Check { path, dir } => (path, dir),
        };
        // A head not hearing other heads' changes promises nothing.
        let allowed = match self.who() {
            Ok(who) => self.head.hears_others() && self.head.meta.rights(&who, &dir).is_ok_and(|r| r.contains(need)),
            Err(_) => false,
        };
        let shared = &self.inner.shared;
        if !allowed || !shared.callbacks.promise(&shared.registry, self.inner.client_id, &canonical, listing) {
            self.unpromised.push(canonical);
        }
    }

    /// `e` left the namespace: the state scripts attached to it (`state.of`) goes too.
    /// (A file's new version keeps its object, and its state, as a file written in place
    /// does on one server.)
    fn gone(&self, e: &Entry) {
        let states = self.inner.shared.scripts.object_states();
        if states.watching() && e.links <= 1 {
            states.forget((attr_of(e).dev, e.object));
        }
    }

    /// This client changed `paths` (see [`changed`]).
    fn changed(&self, paths: &[&str], names: bool) {
        changed(&self.inner.shared, &self.head, self.inner.client_id, paths, names);
    }

    /// What tells the others, later, that this client changed a file (a commit that
    /// completes after the request returned to the connection loop).
    fn change_teller(&self) -> impl Fn(&str) + Send + Sync + 'static {
        let (shared, head, by) = (self.inner.shared.clone(), self.head.clone(), self.inner.client_id);
        move |path: &str| changed(&shared, &head, by, &[path], false)
    }

    /// The subject of the connection: never the nodes' or the head's own subject, which
    /// act through `node_join` (and at the nodes) only.
    pub(crate) fn who(&self) -> Result<String, WireError> {
        match self.inner.subject() {
            None => Err(WireError::new(Code::NOT_AUTHENTICATED, "authenticate first")),
            Some(s @ (NODE_SUBJECT | HEAD_SUBJECT)) => {
                Err(WireError::new(Code::ACCES, format!("{s} may only join the cluster as a data node")))
            }
            Some(s) => Ok(s.to_string()),
        }
    }

    /// The subject, and whether it holds `a` at the root.
    fn who_and_admin(&self) -> Result<(String, bool), WireError> {
        let who = self.who()?;
        let admin = self.head.meta.rights(&who, "/").map_err(meta_err)?.contains(Rights::ADMIN);
        Ok((who, admin))
    }

    pub(crate) fn need(&self, dir: &str, need: Rights) -> Result<String, WireError> {
        let who = self.who()?;
        check(self.head.meta.rights(&who, dir).map_err(meta_err)?, need, dir)?;
        Ok(who)
    }

    /// Checks that the subject holds `need` in the directory of `path`, and answers the
    /// subject and the entry at `path` (one transaction).
    /// A link at the end of `path` is followed (the rights are checked where it leads).
    pub(crate) fn need_entry(&self, path: &str, need: Rights) -> Result<(String, Entry), WireError> {
        let (who, e) = self.need_entry_here(path, need)?;
        match e.kind {
            EntryKind::Symlink => self.need_entry_here(&self.follow(path.to_string())?, need),
            _ => Ok((who, e)),
        }
    }

    /// As [`HeadSession::need_entry`], for the entry at `path` itself (a link too).
    pub(crate) fn need_entry_here(&self, path: &str, need: Rights) -> Result<(String, Entry), WireError> {
        let who = self.who()?;
        let dir = governing(path, false);
        let (rights, entry) = self.head.meta.rights_and_get(&who, dir, path).map_err(meta_err)?;
        check(rights, need, dir)?;
        Ok((who, entry.ok_or_else(|| MetaError::NotFound(path.into()))?))
    }

    fn entry(&self, path: &str) -> Result<Entry, WireError> {
        self.head.meta.get(path).map_err(meta_err)?.ok_or_else(|| MetaError::NotFound(path.into()).into())
    }

    /// A private copy of `path` to write: empty, or holding `base`'s bytes.
    pub(crate) fn stage(&self, path: &str, mode: u32, base: Option<Entry>, copy: bool) -> Result<Staged, WireError> {
        let mut name = [0u8; 12];
        getrandom::fill(&mut name).expect("the OS provides randomness");
        let tmp = self.head.staging.join(hex::encode(name));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(|e| WireError::io("staging", e))?;
        let staged = Staged { path: path.into(), tmp, file, mode, base, dirty: !copy, fresh: false, new_only: false };
        if let (true, Some(base)) = (copy, staged.base.clone()) {
            let head = self.head.clone();
            let mut at = 0u64;
            while at < base.size {
                let len = (base.size - at).min(4 << 20) as u32;
                let data = self.head.block(head.clone().read(base.clone(), at, len))?;
                if data.is_empty() {
                    break;
                }
                staged.file.write_all_at(&data, at).map_err(|e| WireError::io(path, e))?;
                at += data.len() as u64;
            }
        }
        Ok(staged)
    }

    fn staged(&mut self, handle: u64) -> Result<&mut Staged, WireError> {
        let h =
            self.handles.get_mut(&handle).ok_or_else(|| WireError::new(Code::BADF, format!("bad handle {handle}")))?;
        h.staged.as_mut().ok_or_else(|| WireError::new(Code::BADF, "the handle is not open for writing"))
    }

    /// Appends a frame of upload `id` to its staged copy; after the last one, the copy
    /// becomes the file's new version.
    fn upload(&mut self, id: u32, data: &[u8], more: bool) -> Reply<Attr> {
        let staged = self.puts.get_mut(&id).expect("the upload was started");
        let at = staged.file.metadata().map_err(|e| WireError::io("staging", e))?.len();
        if let Err(e) = staged.file.write_all_at(data, at) {
            self.puts.remove(&id);
            return Err(WireError::io("staging", e));
        }
        if more {
            return Ok(Answer::deferred());
        }
        let staged = self.puts.remove(&id).expect("present");
        let head = self.head.clone();
        let tell = self.change_teller();
        later(&self.head, async move {
            let committed = head.commit(&staged).await?;
            tell(&committed.path);
            Ok(attr_of(&committed).into())
        })
    }

    /// Commits a handle's private copy now, waiting for it (fsync).
    fn commit_now(&mut self, handle: u64) -> Result<(), WireError> {
        let head = self.head.clone();
        let h =
            self.handles.get_mut(&handle).ok_or_else(|| WireError::new(Code::BADF, format!("bad handle {handle}")))?;
        let Some(staged) = h.staged.as_mut().filter(|s| s.dirty) else { return Ok(()) };
        let committed = head.block(head.clone().commit(staged))?;
        changed(&self.inner.shared, &self.head, self.inner.client_id, &[&committed.path], false);
        staged.dirty = false;
        staged.base = Some(committed.clone());
        h.entry = committed;
        Ok(())
    }
}

impl crate::script_host::ScriptSession for HeadSession {
    fn acting_as(&self) -> &str {
        self.inner.subject().expect("a script's session acts as its caller")
    }

    fn wait(&self, later: crate::dispatch::Later) -> Result<Encoded, WireError> {
        self.head.block(later)
    }

    fn gather(&self, events: EventStream) -> Result<(Vec<Vec<u8>>, Vec<u8>), WireError> {
        self.head.block(crate::script_host::gather_events(events))
    }
}

impl Connection for HeadSession {
    fn authenticated(&self) -> bool {
        self.inner.authenticated()
    }

    fn set_current(&mut self, id: u32, more: bool) {
        self.current = (id, more);
        // A script call's reply is sent by the inner session's outbox, under this id.
        self.inner.set_current(id, more);
    }

    fn is_uploading(&self, id: u32) -> bool {
        self.puts.contains_key(&id)
    }

    fn put_more(&mut self, id: u32, data: &[u8], more: bool) -> Result<Encoded, WireError> {
        self.upload(id, data, more).map(Answer::encode)
    }

    fn take_unpromised(&mut self) -> Vec<String> {
        std::mem::take(&mut self.unpromised)
    }

    fn heartbeat_deadline(&self) -> Option<std::time::Duration> {
        self.inner.heartbeat_deadline()
    }
}

impl Handler for HeadSession {
    fn hello(&mut self, req: Hello, data: Bytes) -> Reply<Challenge> {
        self.inner.hello(req, data)
    }

    fn auth(&mut self, req: Auth, data: Bytes) -> Reply<Welcome> {
        let mut answer = self.inner.auth(req, data)?;
        let heads = self.head.heads_alive();
        answer.pages.iter_mut().for_each(|w| {
            w.head = true;
            w.heads = heads.clone();
        });
        Ok(answer)
    }

    fn ping(&mut self, req: Ping, data: Bytes) -> Reply<()> {
        self.inner.ping(req, data)
    }

    fn whoami(&mut self, req: Whoami, data: Bytes) -> Reply<String> {
        self.inner.whoami(req, data)
    }

    fn stat(&mut self, req: Stat, _: Bytes) -> Reply<Attr> {
        let path = normalise(&req.path).map_err(meta_err)?;
        self.promise(&path, false, Rights::LIST);
        match self.need_entry(&path, Rights::LIST) {
            Ok((_, e)) => Ok(attr_of(&e).into()),
            Err(err) => {
                // The run is waited for off the connection's thread.
                let run = self.active_run(&path, err)?;
                later(&self.head, async move { Ok(attr_of(&run.await?).into()) })
            }
        }
    }

    fn lstat(&mut self, req: Lstat, _: Bytes) -> Reply<Attr> {
        let path = normalise(&req.path).map_err(meta_err)?;
        self.promise(&path, false, Rights::LIST);
        match self.need_entry_here(&path, Rights::LIST) {
            Ok((_, e)) => Ok(attr_of(&e).into()),
            Err(err) => {
                let run = self.active_run(&path, err)?;
                later(&self.head, async move { Ok(attr_of(&run.await?).into()) })
            }
        }
    }

    fn fstat(&mut self, req: Fstat, _: Bytes) -> Reply<Attr> {
        let h = self.handles.get(&req.handle).ok_or_else(|| WireError::new(Code::BADF, "bad handle"))?;
        let path = h.entry.path.clone();
        // The handle shows the subject could open it.
        self.promise(&path, false, Rights(0));
        let h = self.handles.get(&req.handle).expect("looked up above");
        let mut attr = attr_of(&h.entry);
        if let Some(s) = &h.staged {
            attr.size = s.file.metadata().map_err(|e| WireError::io(&s.path, e))?.len();
        }
        Ok(attr.into())
    }

    fn open(&mut self, req: Open, _: Bytes) -> Reply<Opened> {
        let path = self.follow(normalise(&req.path).map_err(meta_err)?)?;
        let writing = req.flags & (open_flags::WRITE | open_flags::TRUNCATE | open_flags::APPEND) != 0;
        let need = if writing || req.flags & open_flags::CREATE != 0 { Rights::WRITE } else { Rights::READ };
        self.promise(&path, false, need);
        let who = self.need(governing(&path, false), need)?;
        let existing = self.head.meta.get(&path).map_err(meta_err)?;
        let entry = match existing {
            Some(_) if req.flags & open_flags::CREATE != 0 && req.flags & open_flags::EXCLUSIVE != 0 => {
                return Err(MetaError::Exists(path).into())
            }
            Some(e) if e.kind == EntryKind::Dir && writing => return Err(MetaError::IsDir(path).into()),
            Some(e) if e.kind != EntryKind::Dir && req.flags & open_flags::DIRECTORY != 0 => {
                return Err(MetaError::NotDir(path).into())
            }
            Some(e) => e,
            None if req.flags & open_flags::CREATE != 0 => {
                let id = self.head.meta.next_id().map_err(meta_err)?;
                let e = Entry::empty(path.clone(), EntryKind::File, req.mode, id);
                match self.head.meta.create(&e) {
                    Ok(()) => {
                        self.changed(&[&path], true);
                        e
                    }
                    Err(MetaError::Exists(_)) => self.entry(&path)?,
                    Err(err) => return Err(err.into()),
                }
            }
            None if writing => return Err(MetaError::NotFound(path).into()),
            None => {
                let err = MetaError::NotFound(path.clone()).into();
                self.active(&path, err)?
            }
        };
        let staged = if writing {
            let truncate = req.flags & open_flags::TRUNCATE != 0;
            Some(self.stage(&path, entry.mode, Some(entry.clone()), !truncate)?)
        } else {
            None
        };
        let location = if staged.is_none() { self.head.location(&who, &entry)? } else { None };
        let attr = attr_of(&entry);
        let handle = self.next_handle;
        self.next_handle += 1;
        if staged.is_none() {
            self.head.hold(&entry);
        }
        self.handles.insert(handle, HeadHandle { entry, staged });
        Ok(Opened { handle, attr, location }.into())
    }

    fn close(&mut self, req: Close, _: Bytes) -> Reply<()> {
        let h = self.handles.remove(&req.handle).ok_or_else(|| WireError::new(Code::BADF, "bad handle"))?;
        if h.staged.is_none() {
            self.head.release(&h.entry);
        }
        match h.staged.filter(|s| s.dirty) {
            Some(staged) => {
                let head = self.head.clone();
                let tell = self.change_teller();
                later(&self.head, async move {
                    let committed = head.commit(&staged).await?;
                    tell(&committed.path);
                    Ok(().into())
                })
            }
            None => Ok(().into()),
        }
    }

    fn pread(&mut self, req: Pread, _: Bytes) -> Reply<()> {
        let h = self.handles.get(&req.handle).ok_or_else(|| WireError::new(Code::BADF, "bad handle"))?;
        if h.entry.kind == EntryKind::Dir {
            return Err(MetaError::IsDir(h.entry.path.clone()).into());
        }
        let len = req.len.min(self.inner.max_data());
        if let Some(s) = &h.staged {
            let mut buf = vec![0u8; len as usize];
            let n = s.file.read_at(&mut buf, req.offset).map_err(|e| WireError::io(&s.path, e))?;
            buf.truncate(n);
            return Ok(Answer::with_body((), Body::Bytes(buf.into())));
        }
        if let Content::Inline(bytes) = &h.entry.content {
            return Ok(Answer::with_body((), Body::Bytes(slice(bytes, req.offset, len))));
        }
        let (head, entry) = (self.head.clone(), h.entry.clone());
        later(
            &self.head,
            async move { Ok(Answer::with_body((), Body::Bytes(head.read(entry, req.offset, len).await?))) },
        )
    }

    fn pwrite(&mut self, req: Pwrite, data: Bytes) -> Reply<u64> {
        let s = self.staged(req.handle)?;
        s.file.write_all_at(&data, req.offset).map_err(|e| WireError::io(&s.path, e))?;
        s.dirty = true;
        Ok((data.len() as u64).into())
    }

    fn get(&mut self, req: Get, _: Bytes) -> Reply<Attr> {
        let path = normalise(&req.path).map_err(meta_err)?;
        self.promise(&path, false, Rights::READ);
        let e = match self.need_entry(&path, Rights::READ) {
            Ok((_, e)) => e,
            Err(err) => self.active(&path, err)?,
        };
        if e.kind == EntryKind::Dir {
            return Err(MetaError::IsDir(path).into());
        }
        stream_file(self.head.clone(), e)
    }

    fn put_cached(&mut self, req: PutCached, data: Bytes) -> Reply<Attr> {
        // Data nodes store objects durably either way.
        self.put(Put { path: req.path, mode: req.mode }, data)
    }

    fn put(&mut self, req: Put, data: Bytes) -> Reply<Attr> {
        let path = normalise(&req.path).map_err(meta_err)?;
        self.need(governing(&path, false), Rights::WRITE)?;
        let base = self.head.meta.get(&path).map_err(meta_err)?;
        if base.as_ref().is_some_and(|b| b.kind == EntryKind::Dir) {
            return Err(MetaError::IsDir(path).into());
        }
        if req.mode & locus_proto::ops::PUT_NEW != 0 && base.is_some() {
            return Err(MetaError::Exists(path).into());
        }
        let mut staged = self.stage(&path, req.mode & 0o7777, base, false)?;
        staged.fresh = true;
        staged.new_only = req.mode & locus_proto::ops::PUT_NEW != 0;
        let id = self.current.0;
        self.puts.insert(id, staged);
        self.upload(id, &data, self.current.1)
    }

    fn copy(&mut self, req: CopyFile, _: Bytes) -> Reply<Attr> {
        self.copy_file(req)
    }

    fn readdir(&mut self, req: Readdir, _: Bytes) -> Reply<Vec<DirEntry>> {
        let path = self.follow(normalise(&req.path).map_err(meta_err)?)?;
        self.promise(&path, true, Rights::LIST);
        self.need(&path, Rights::LIST)?;
        let entries: Vec<DirEntry> = self
            .head
            .meta
            .list(&path)
            .map_err(meta_err)?
            .iter()
            .map(|e| DirEntry { name: split(&e.path).map_or("", |(_, n)| n).to_string(), attr: attr_of(e) })
            .collect();
        Ok(crate::session::listing(&entries))
    }

    fn mkdir(&mut self, req: Mkdir, _: Bytes) -> Reply<()> {
        let path = normalise(&req.path).map_err(meta_err)?;
        self.need(governing(&path, false), Rights::WRITE)?;
        let id = self.head.meta.next_id().map_err(meta_err)?;
        let e = Entry::empty(path.clone(), EntryKind::Dir, req.mode, id);
        self.head.meta.create(&e).map_err(meta_err)?;
        self.changed(&[&path], true);
        Ok(().into())
    }

    fn rmdir(&mut self, req: Rmdir, _: Bytes) -> Reply<()> {
        let path = normalise(&req.path).map_err(meta_err)?;
        self.need(governing(&path, false), Rights::DELETE)?;
        let old = self.head.meta.remove(&path, true).map_err(meta_err)?;
        self.gone(&old);
        self.changed(&[&path], true);
        Ok(().into())
    }

    fn unlink(&mut self, req: Unlink, _: Bytes) -> Reply<()> {
        let path = normalise(&req.path).map_err(meta_err)?;
        self.need(governing(&path, false), Rights::DELETE)?;
        let old = self.head.meta.remove(&path, false).map_err(meta_err)?;
        self.gone(&old);
        self.changed(&[&path], true);
        self.head.retire(&old)?;
        Ok(().into())
    }

    fn rename(&mut self, req: Rename, _: Bytes) -> Reply<()> {
        let from = normalise(&req.from).map_err(meta_err)?;
        let to = normalise(&req.to).map_err(meta_err)?;
        self.need(governing(&from, false), Rights::DELETE)?;
        self.need(governing(&to, false), Rights::WRITE)?;
        let replaced = self.head.meta.rename(&from, &to).map_err(meta_err)?;
        self.changed(&[&from, &to], true);
        if let Some(replaced) = replaced {
            self.gone(&replaced);
            self.head.retire(&replaced)?;
        }
        Ok(().into())
    }

    fn symlink(&mut self, req: Symlink, _: Bytes) -> Reply<()> {
        self.make_link(&req.target, &req.path)?;
        self.changed(&[&req.path], true);
        Ok(().into())
    }

    fn readlink(&mut self, req: Readlink, _: Bytes) -> Reply<String> {
        self.promise(&req.path, false, Rights::LIST);
        Ok(self.read_link(&req.path)?.into())
    }

    /// A hard link: needs `r` where the file is and `w` where the new name goes, as on
    /// one server. Both names then show one object (see `Meta::link`).
    fn link(&mut self, req: Link, _: Bytes) -> Reply<()> {
        let from = normalise(&req.from).map_err(meta_err)?;
        let to = normalise(&req.to).map_err(meta_err)?;
        self.need(governing(&from, false), Rights::READ)?;
        self.need(governing(&to, false), Rights::WRITE)?;
        self.head.meta.link(&from, &to).map_err(meta_err)?;
        self.changed(&[&from, &to], true);
        Ok(().into())
    }

    fn truncate(&mut self, req: Truncate, _: Bytes) -> Reply<()> {
        let path = normalise(&req.path).map_err(meta_err)?;
        let (_, e) = self.need_entry(&path, Rights::WRITE)?;
        if e.kind == EntryKind::Dir {
            return Err(MetaError::IsDir(path).into());
        }
        let staged = self.stage(&path, e.mode, Some(e), req.size > 0)?;
        staged.file.set_len(req.size).map_err(|err| WireError::io(&path, err))?;
        self.head.block(self.head.clone().commit(&staged))?;
        self.changed(&[&path], false);
        Ok(().into())
    }

    fn chmod(&mut self, req: Chmod, _: Bytes) -> Reply<()> {
        let path = normalise(&req.path).map_err(meta_err)?;
        self.need(governing(&path, false), Rights::WRITE)?;
        self.head.meta.set_mode(&path, req.mode).map_err(meta_err)?;
        self.changed(&[&path], false);
        Ok(().into())
    }

    fn utimes(&mut self, req: Utimes, _: Bytes) -> Reply<()> {
        let path = normalise(&req.path).map_err(meta_err)?;
        self.need(governing(&path, false), Rights::WRITE)?;
        let ns = match req.mtime {
            SetTime::Omit => return Ok(().into()),
            SetTime::Now => locus_cluster::now_ns(),
            SetTime::At(t) => t.sec * 1_000_000_000 + t.nsec as i64,
        };
        self.head.meta.set_mtime(&path, ns).map_err(meta_err)?;
        self.changed(&[&path], false);
        Ok(().into())
    }

    fn fsync(&mut self, req: Fsync, _: Bytes) -> Reply<()> {
        Ok(self.commit_now(req.handle)?.into())
    }

    fn statfs(&mut self, _: Statfs, _: Bytes) -> Reply<StatFs> {
        self.who()?;
        let free: u64 = self.head.nodes()?.iter().map(|n| n.free).sum();
        let bsize = 4096;
        Ok(StatFs {
            bsize,
            frsize: bsize,
            blocks: free / bsize,
            bfree: free / bsize,
            bavail: free / bsize,
            files: 0,
            ffree: 0,
            namemax: 255,
        }
        .into())
    }

    fn access(&mut self, req: Access, _: Bytes) -> Reply<()> {
        // As access(2): a symbolic link's target is what is asked about.
        let path = self.follow(normalise(&req.path).map_err(meta_err)?)?;
        let e = match self.entry(&path) {
            Ok(e) => e,
            // An active file exists for reading only (a write is refused before it runs).
            Err(_) if req.mode & 2 != 0 && self.names_handler(&path) => {
                return Err(WireError::new(Code::ACCES, format!("{path}: active files are read-only")))
            }
            Err(err) => {
                let run = self.active_run(&path, err)?;
                return later(&self.head, async move { run.await.map(|_| ().into()) });
            }
        };
        let mut need = Rights(0);
        if req.mode & 4 != 0 {
            need = need.union(if e.kind == EntryKind::Dir { Rights::LIST } else { Rights::READ });
        }
        if req.mode & 2 != 0 {
            need = need.union(Rights::WRITE);
        }
        self.need(governing(&path, e.kind == EntryKind::Dir), need)?;
        Ok(().into())
    }

    fn ftruncate(&mut self, req: Ftruncate, _: Bytes) -> Reply<()> {
        let s = self.staged(req.handle)?;
        s.file.set_len(req.size).map_err(|e| WireError::io(&s.path, e))?;
        s.dirty = true;
        Ok(().into())
    }

    /// As on a single server; changes made through other heads reach this head's
    /// promise holders through the namespace's engine (`changes`).
    fn callbacks(&mut self, req: Callbacks, _: Bytes) -> Reply<u32> {
        let who = self.who()?;
        if !self.inner.can_push() {
            return Err(WireError::new(Code::NOTSUP, "scripts do not hold callbacks"));
        }
        let shared = &self.inner.shared;
        let to = match req.to {
            0 => self.inner.client_id,
            to if shared.registry.subject(to).as_deref() == Some(who.as_str()) => to,
            to => return Err(WireError::new(Code::ACCES, format!("connection {to} is not one of this subject's"))),
        };
        self.callbacks_on = true;
        Ok(shared.callbacks.enable(self.inner.client_id, &who, req.max, to).into())
    }

    fn acl_get(&mut self, req: AclGet, _: Bytes) -> Reply<Vec<AclEntry>> {
        let path = normalise(&req.path).map_err(meta_err)?;
        self.who()?;
        Ok(self.head.meta.acl(&path).map_err(meta_err)?.into())
    }

    fn acl_set(&mut self, req: AclSet, _: Bytes) -> Reply<()> {
        let path = normalise(&req.path).map_err(meta_err)?;
        self.need(&path, Rights::ADMIN)?;
        self.head.meta.acl_set(&path, &req.subject, req.rights).map_err(meta_err)?;
        // Rights change beneath too (ACLs are inherited): every promise there breaks.
        self.changed(&[&path], true);
        Ok(().into())
    }

    fn stats(&mut self, req: Stats, data: Bytes) -> Reply<StatsReport> {
        self.inner.stats(req, data)
    }

    fn rebalance_plan(&mut self, req: RebalancePlan, _: Bytes) -> Reply<Rebalance> {
        self.need("/", Rights::ADMIN)?;
        let head = self.head.clone();
        later(&self.head, async move { Ok(head.rebalance_plan(req.max_moves)?.into()) })
    }

    fn rebalance_apply(&mut self, req: RebalanceApply, _: Bytes) -> Reply<Rebalance> {
        let who = self.need("/", Rights::ADMIN)?;
        let head = self.head.clone();
        later(&self.head, async move {
            let done = head.rebalance_apply(req.max_moves).await?;
            tracing::info!(by = %who, moved = done.moves.len(), skipped = done.skipped.len(), "rebalanced data nodes");
            Ok(done.into())
        })
    }

    fn script_register(&mut self, req: ScriptRegister, _: Bytes) -> Reply<String> {
        self.need("/", Rights::EXECUTE)?;
        let id = self.inner.shared.scripts.register(&req.source)?;
        // Kept in the namespace: a call through another head finds it by its id.
        self.head.meta.add_script(&id, &req.source, SCRIPTS_KEPT).map_err(meta_err)?;
        Ok(id.into())
    }

    /// As on a single server: the script's `fs.*` calls go to a head's session acting
    /// as the caller (so over the namespace and the nodes, under the same ACLs).
    fn script_call(&mut self, mut req: ScriptCall, data: Bytes) -> Reply<Vec<Value>> {
        let who = self.need("/", Rights::EXECUTE)?;
        if req.source.is_none() && !self.inner.shared.scripts.knows(&req.id) {
            req.source = self.head.meta.script(&req.id).map_err(meta_err)?;
        }
        let head = self.head.clone();
        let host = |s: &Session| -> Box<dyn locus_script::Host> {
            let session = HeadSession::new(Session::acting_as(s.shared.clone(), &who), head.clone());
            Box::new(crate::script_host::ScriptHost::over(session, s.shared.clone(), s.client_id))
        };
        self.inner.run_script(&who, req, data, host)
    }

    /// Runs the module on every data node over the files of `dir` that the node holds
    /// (small files, which live at the head, go to the node with the fewest), and
    /// streams the nodes' output back as it comes; the result adds up their accounts.
    /// A writable run (`req.write`) needs `w` on the directory too, and is refused where
    /// the subject may not read everything beneath it (as on one server); what it wrote
    /// is committed only when every share ended well (see `fanout`).
    fn storelet_run(&mut self, req: StoreletRun, data: Bytes) -> Reply<StoreletEvent> {
        let dir = normalise(&req.dir).map_err(meta_err)?;
        let who = self.need("/", Rights::EXECUTE)?;
        let mut need = Rights::READ.union(Rights::LIST);
        if req.write {
            need = need.union(Rights::WRITE);
        }
        self.need(&dir, need)?;
        if self.entry(&dir)?.kind != EntryKind::Dir {
            return Err(MetaError::NotDir(dir).into());
        }
        let planned = match req.write {
            true => {
                let files = self.head.view_files(&who, &dir)?;
                if files.len() != self.head.meta.files_under(&dir).map_err(meta_err)?.len() {
                    return Err(WireError::new(
                        Code::ACCES,
                        format!("{dir}: a writable run needs every file beneath it readable by its subject"),
                    ));
                }
                Planned { shares: self.head.plan_run(files, &[])?, kept: None, fresh: false }
            }
            false => self.head.plan_read_only(&who, &dir)?,
        };
        let head = self.head.clone();
        let (tx, frames) = tokio::sync::mpsc::unbounded_channel();
        let queued = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let stream = EventStream { frames, queued };
        let writes = req.write.then(|| {
            let tell = self.change_teller();
            Writes { dir: dir.clone(), tell: Box::new(move |p: &str| tell(p)) as Box<dyn Fn(&str) + Send + Sync> }
        });
        self.head.io().spawn(merge_runs(head, who, planned, req.args, req.env, data, writes, tx));
        Ok(Answer::events(stream))
    }

    /// The runs at the nodes, and those the head runs itself (with no data node).
    fn storelet_ps(&mut self, _: StoreletPs, _: Bytes) -> Reply<Vec<StoreletRunInfo>> {
        let (who, admin) = self.who_and_admin()?;
        let here = self.inner.shared.storelets.ps(&who, admin);
        let head = self.head.clone();
        later(&self.head, async move {
            let mut all = head.runs_ps(&who, admin).await?;
            all.extend(here);
            all.sort_by_key(|r| r.run);
            Ok(all.into())
        })
    }

    fn storelet_cancel(&mut self, req: StoreletCancel, _: Bytes) -> Reply<()> {
        let (who, admin) = self.who_and_admin()?;
        if req.run >> 32 == 0 {
            // A run at the head itself (its ids name no node).
            return Ok(self.inner.shared.storelets.cancel(&who, admin, req.run)?.into());
        }
        let head = self.head.clone();
        later(&self.head, async move { Ok(head.runs_cancel(&who, admin, req.run).await?.into()) })
    }

    fn storelet_stats(&mut self, _: StoreletStats, _: Bytes) -> Reply<StoreletReport> {
        let (who, admin) = self.who_and_admin()?;
        let here = self.inner.shared.storelets.stats(&who, admin);
        let head = self.head.clone();
        later(&self.head, async move { Ok(head.runs_stats(&who, admin, here).await?.into()) })
    }

    fn handlers(&mut self, _: Handlers, _: Bytes) -> Reply<Vec<HandlerInfo>> {
        self.who()?;
        Ok(self.inner.shared.active.list().into())
    }

    fn locate(&mut self, req: Locate, _: Bytes) -> Reply<Located> {
        let path = normalise(&req.path).map_err(meta_err)?;
        let (who, e) = match self.need_entry(&path, Rights::READ) {
            Ok(found) => found,
            Err(err) => {
                let (run, who) = (self.active_run(&path, err)?, self.who()?);
                let head = self.head.clone();
                return later(&self.head, async move {
                    let e = run.await?;
                    Ok(Located { attr: attr_of(&e), location: head.location(&who, &e)? }.into())
                });
            }
        };
        Ok(Located { attr: attr_of(&e), location: self.head.location(&who, &e)? }.into())
    }

    fn object_read(&mut self, _: ObjectRead, _: Bytes) -> Reply<()> {
        not_here("object_read (a data node's operation)")
    }

    fn object_put(&mut self, _: ObjectPut, _: Bytes) -> Reply<Attr> {
        not_here("object_put (a data node's operation)")
    }

    fn object_drop(&mut self, _: ObjectDrop, _: Bytes) -> Reply<()> {
        not_here("object_drop (a data node's operation)")
    }

    fn share(&mut self, req: Share, _: Bytes) -> Reply<String> {
        let path = normalise(&req.path).map_err(meta_err)?;
        let (who, _) = self.need_entry(&path, Rights::READ)?;
        Ok(self.head.share_url(&who, &path, req.ttl_s)?.into())
    }

    fn node_run(&mut self, _: NodeRun, _: Bytes) -> Reply<StoreletEvent> {
        not_here("node_run (a data node's operation)")
    }

    fn object_seal(&mut self, _: ObjectSeal, _: Bytes) -> Reply<()> {
        not_here("object_seal (a data node's operation)")
    }

    fn object_fetch(&mut self, _: ObjectFetch, _: Bytes) -> Reply<()> {
        not_here("object_fetch (a data node's operation)")
    }

    fn object_write(&mut self, _: ObjectWrite, _: Bytes) -> Reply<Attr> {
        not_here("object_write (a data node's operation)")
    }

    fn object_adopt(&mut self, _: ObjectAdopt, _: Bytes) -> Reply<u32> {
        not_here("object_adopt (a data node's operation)")
    }

    fn write_begin(&mut self, req: WriteBegin, _: Bytes) -> Reply<Option<WriteTarget>> {
        let path = normalise(&req.path).map_err(meta_err)?;
        let who = self.need(governing(&path, false), Rights::WRITE)?;
        Ok(self.head.begin_write(&who, &path, req.size)?.into())
    }

    fn write_commit(&mut self, req: WriteCommit, _: Bytes) -> Reply<Attr> {
        if req.mode & locus_proto::ops::PUT_NEW != 0 {
            // Its bytes are on the nodes already; a create-only write goes as a `put`.
            return Err(WireError::new(Code::INVAL, "a third-party write replaces: send a create-only write as a put"));
        }
        let path = normalise(&req.path).map_err(meta_err)?;
        let who = self.need(governing(&path, false), Rights::WRITE)?;
        let head = self.head.clone();
        let commit = head.clone().commit_write(who, path.clone(), req.mode, req.target, req.crc);
        let tell = self.change_teller();
        later(&self.head, async move {
            let committed = commit.await?;
            tell(&path);
            Ok(attr_of(&committed).into())
        })
    }

    fn node_list(&mut self, _: NodeList, _: Bytes) -> Reply<Vec<NodeInfo>> {
        self.need("/", Rights::ADMIN)?;
        Ok(self.head.node_list()?.into())
    }

    fn node_drain(&mut self, req: NodeDrain, _: Bytes) -> Reply<()> {
        let who = self.need("/", Rights::ADMIN)?;
        self.head.retire_node(req.node, false, &who).map(Answer::from)
    }

    fn node_remove(&mut self, req: NodeRemove, _: Bytes) -> Reply<()> {
        let who = self.need("/", Rights::ADMIN)?;
        self.head.retire_node(req.node, true, &who).map(Answer::from)
    }

    fn node_join(&mut self, req: NodeJoin, _: Bytes) -> Reply<NodeWelcome> {
        // Only the nodes' own subject joins; its token seals the keys for the node.
        let subject =
            self.inner.subject().ok_or_else(|| WireError::new(Code::NOT_AUTHENTICATED, "authenticate first"))?;
        let token = match self.inner.token_of(NODE_SUBJECT) {
            Some(token) if subject == NODE_SUBJECT => token,
            _ => {
                return Err(WireError::new(
                    Code::ACCES,
                    format!(
                    "data nodes join as {NODE_SUBJECT} (make its token at the head with `locus token {NODE_SUBJECT}`)"
                ),
                ))
            }
        };
        if req.nonce.len() < 16 {
            return Err(WireError::new(Code::INVAL, "a join needs a fresh nonce of at least 16 bytes"));
        }
        self.head.heartbeat(&req, &token, self.inner.peer())
    }

    fn key_rotate(&mut self, _: KeyRotate, _: Bytes) -> Reply<()> {
        let who = self.need("/", Rights::ADMIN)?;
        self.head.rotate_key().map_err(|e| WireError::new(Code::IO, format!("cannot rotate the cluster key: {e}")))?;
        tracing::info!(by = %who, "cluster key rotated");
        Ok(().into())
    }
}
