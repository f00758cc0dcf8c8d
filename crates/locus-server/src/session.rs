//! One client's session: its identity, open handles and uploads in progress, and the
//! [`Handler`] that carries each operation out on the store.
//!
//! Everything a session holds is released when it is dropped, which happens when its
//! connection ends for any reason: handles close, unfinished uploads are removed.

use crate::active::{self, Found, Run};
use crate::dispatch::Reply;
use crate::dispatch::{Answer, Encoded, Handler};
use crate::transport::Body;
use crate::{Outbox, Shared};
use bytes::Bytes;
use locus_proto::auth;
use locus_proto::ops::*;
use locus_proto::types::*;
use locus_proto::{Code, Error as WireError, Operation};
use locus_store::{OpenFile, PutFile, StoreError};
use std::collections::HashMap;
use std::sync::Arc;

/// A `readdir` answer: the entries in pages of [`READDIR_PAGE`] (one empty page for an
/// empty directory).
pub(crate) fn listing(entries: &[DirEntry]) -> Answer<Vec<DirEntry>> {
    let mut pages: Vec<Vec<DirEntry>> = entries.chunks(READDIR_PAGE).map(<[DirEntry]>::to_vec).collect();
    if pages.is_empty() {
        pages.push(Vec::new());
    }
    Answer::paged(pages)
}

/// Directory entries per reply frame of `readdir`.
const READDIR_PAGE: usize = 2048;

/// State of one connection.
pub struct Session {
    pub(crate) shared: Arc<Shared>,
    pub(crate) client_id: u64,
    subject: Option<String>,
    server_nonce: Option<Vec<u8>>,
    handles: HashMap<u64, Arc<OpenFile>>,
    next_handle: u64,
    /// Uploads in progress, by request id, with their paths.
    puts: HashMap<u32, (PutFile, String)>,
    /// Id and MORE flag of the request frame being handled (for streamed uploads).
    current: (u32, bool),
    /// Storelet runs this connection started: cancelled if it goes away first.
    pub(crate) storelet_runs: Vec<Arc<locus_storelet::RunControl>>,
    /// Where script replies go; none in a script's own session (scripts cannot call scripts).
    outbox: Option<Outbox>,
    /// Handles on active files whose run is still going, and the run.
    growing: HashMap<u64, Arc<Run>>,
    /// This connection turned callbacks on: what it asks about is promised.
    callbacks_on: bool,
    /// The connection's ends, which a login proof must be bound to (none: no login).
    link: Option<crate::login::Link>,
    /// Paths the request being answered asked about and holds no promise on (a bound
    /// reached): told to the client just before the reply (`PUSH_NO_PROMISE`).
    unpromised: Vec<String>,
    /// This connection sends heartbeats (pings): once it is where breaks go, it is
    /// expected to keep sending them (see [`crate::Connection::heartbeat_deadline`]).
    pinged: bool,
}

impl Drop for Session {
    fn drop(&mut self) {
        for run in &self.storelet_runs {
            run.cancel();
        }
        // Its own promises, and those whose breaks came to it (a listener connection).
        if self.outbox.is_some() {
            self.shared.callbacks.drop_client(self.client_id);
        }
    }
}

pub(crate) fn store<T>(r: Result<T, StoreError>) -> Result<T, WireError> {
    r.map_err(WireError::from)
}

impl Session {
    /// A session that has not authenticated yet, replying to script calls through `outbox`.
    pub fn new(shared: Arc<Shared>, client_id: u64, outbox: Option<Outbox>) -> Self {
        Session {
            shared,
            client_id,
            subject: None,
            server_nonce: None,
            handles: HashMap::new(),
            next_handle: 1,
            puts: HashMap::new(),
            current: (0, false),
            storelet_runs: Vec::new(),
            outbox,
            growing: HashMap::new(),
            callbacks_on: false,
            link: None,
            unpromised: Vec::new(),
            pinged: false,
        }
    }

    /// Records the connection's ends, which the login proof must be bound to.
    pub fn set_link(&mut self, link: crate::login::Link) {
        self.link = Some(link);
    }

    /// A session already acting as `subject`, with no push channel of its own: a script
    /// call's, or a Chirp client's. Such sessions do not run active-file handlers (they
    /// cannot wait for a run) and do not hold callbacks.
    pub fn acting_as(shared: Arc<Shared>, subject: &str) -> Self {
        let mut s = Session::new(shared, 0, None);
        s.subject = Some(subject.to_string());
        s
    }

    /// Checks that the subject may run code (`x` at the export root).
    fn may_execute(&self) -> Result<&str, WireError> {
        let who = self.who()?;
        if !store(self.shared.store.rights(who, "/"))?.contains(Rights::EXECUTE) {
            return Err(WireError::new(Code::ACCES, "running code needs the 'x' right at the export root"));
        }
        Ok(who)
    }

    /// The subject, and whether it holds the admin right at the export root.
    fn who_and_admin(&self) -> Result<(&str, bool), WireError> {
        let who = self.who()?;
        Ok((who, store(self.shared.store.rights(who, "/"))?.contains(Rights::ADMIN)))
    }

    /// True once the handshake has succeeded.
    pub fn authenticated(&self) -> bool {
        self.subject.is_some()
    }

    /// The largest data a reply may carry.
    pub fn max_data(&self) -> u32 {
        self.shared.config.limits.max_data.min(locus_proto::Limits::CLIENT.max_data)
    }

    /// The token `subject` has in this server's token file (a head seals the cluster's
    /// keys for its nodes with theirs).
    #[cfg(feature = "cluster")]
    pub(crate) fn token_of(&self, subject: &str) -> Option<Vec<u8>> {
        self.shared.tokens.get(subject).map(<[u8]>::to_vec)
    }

    /// The authenticated subject.
    pub fn subject(&self) -> Option<&str> {
        self.subject.as_deref()
    }

    /// Records the id and MORE flag of the frame about to be dispatched.
    pub fn set_current(&mut self, id: u32, more: bool) {
        self.current = (id, more);
    }

    /// True when `id` is an upload in progress (its next frames are continuations).
    pub fn is_uploading(&self, id: u32) -> bool {
        self.puts.contains_key(&id)
    }

    /// Handles a continuation frame of an upload: appends, and finishes on the last.
    pub fn put_more(&mut self, id: u32, data: &[u8], more: bool) -> Reply<Attr> {
        let (put, _) = self.puts.get_mut(&id).expect("caller checked is_uploading");
        if let Err(e) = put.write(data) {
            self.puts.remove(&id);
            return Err(e.into());
        }
        if more {
            return Ok(Answer::deferred());
        }
        let (put, path) = self.puts.remove(&id).expect("present");
        Ok(self.naming(&[&path], put.finish())?.into())
    }

    /// For a `pwrite` whose data may go straight from the socket into the file: the open
    /// file and offset, when the request decodes and names a writable, non-append handle.
    /// Anything else takes the ordinary path, which reports the error.
    pub fn direct_write_target(&self, meta: &[u8]) -> Option<(Arc<OpenFile>, u64)> {
        let req: Pwrite = locus_proto::codec::decode(meta).ok()?;
        let file = self.handles.get(&req.handle)?;
        (file.check_writable().is_ok() && !file.append).then(|| (file.clone(), req.offset))
    }

    /// Starts (or, for a one-frame upload, does) a `put` as `who`.
    pub(crate) fn start_put(&mut self, who: &str, req: Put, data: Bytes, durable: bool) -> Reply<Attr> {
        let (id, more) = self.current;
        if more && self.puts.len() >= self.shared.config.max_handles {
            return Err(WireError::new(Code(24), "too many uploads in progress on this connection"));
            // EMFILE
        }
        let mut put = store(self.shared.store.begin_put(who, &req.path, req.mode))?;
        put.durable = durable;
        store(put.write(&data))?;
        if more {
            self.puts.insert(id, (put, req.path));
            return Ok(Answer::deferred());
        }
        Ok(self.naming(&[&req.path], put.finish())?.into())
    }

    /// Promises this client a break when `path` (with `listing`, a directory being
    /// listed) changes, if it turned callbacks on and its subject holds `need` where the
    /// operation needs it (in the directory listed, or the one holding `path`): nothing
    /// is promised on what the subject may not see. Where nothing is promised, the
    /// client is told so with the reply.
    fn promise(&mut self, path: &str, listing: bool, need: Rights) {
        if !self.callbacks_on {
            return;
        }
        let Some(canonical) = crate::callbacks::canonical(path) else { return };
        let mut dir = if listing { canonical.as_str() } else { crate::callbacks::parent(&canonical) };
        // A directory not made yet: its nearest ancestor's rights (where its making shows).
        let allowed = loop {
            let Ok(who) = self.who() else { break false };
            match self.shared.store.rights(who, dir) {
                Ok(rights) => break rights.contains(need),
                Err(e) if dir != "/" && e.code() == Code::NOENT => dir = crate::callbacks::parent(dir),
                Err(_) => break false,
            }
        };
        if !allowed || !self.shared.callbacks.promise(&self.shared.registry, self.client_id, &canonical, listing) {
            self.unpromised.push(canonical);
        }
    }

    /// This session changed `paths` (with `names`: made or removed them): other
    /// clients' promises on them break.
    pub(crate) fn changed(&self, paths: &[&str], names: bool) {
        self.shared.callbacks.changed(&self.shared.registry, self.client_id, paths, names);
    }

    /// `r`, after telling other clients that `paths` changed if it succeeded.
    fn changing<T>(&self, paths: &[&str], r: Result<T, StoreError>) -> Result<T, WireError> {
        let r = store(r)?;
        self.changed(paths, false);
        Ok(r)
    }

    /// `r`, after telling other clients that names were made or removed if it succeeded.
    fn naming<T>(&self, paths: &[&str], r: Result<T, StoreError>) -> Result<T, WireError> {
        let r = store(r)?;
        self.changed(paths, true);
        Ok(r)
    }

    pub(crate) fn who(&self) -> Result<&str, WireError> {
        self.subject.as_deref().ok_or_else(|| WireError::new(Code::NOT_AUTHENTICATED, "authenticate first"))
    }

    fn handle(&self, h: u64) -> Result<&Arc<OpenFile>, WireError> {
        self.handles.get(&h).ok_or_else(|| StoreError::BadHandle(h).into())
    }

    /// After a lookup of `path` failed with `err`: the active file its name invokes, if
    /// it is missing and names a registered handler; else `err` itself. Scripts' own
    /// sessions (no outbox) do not run handlers: they cannot wait for them.
    fn active(&self, path: &str, err: StoreError) -> Result<Found, WireError> {
        let err = WireError::from(err);
        if err.code != Code::NOENT || self.outbox.is_none() {
            return Err(err);
        }
        self.shared.active.find(&self.shared, self.who()?, path)?.ok_or(err)
    }

    /// Attributes of an active file: at once for a result; for one still being made, once
    /// its first bytes are written (so a handler that fails at once fails the lookup),
    /// with the size written so far.
    fn active_attr(&self, path: &str, err: StoreError) -> Reply<Attr> {
        match self.active(path, err)? {
            Found::Ready(file) => Ok(active::attr(&file)?.into()),
            Found::Running(file, run) => Ok(Answer::later(Box::pin(async move {
                if let Some(Err(e)) = run.wait(1).await.end {
                    return Err(e);
                }
                Ok(Answer::from(growing_attr(&file, &run)?).encode())
            }))),
        }
    }

    /// `get` of an active file whose run is still going: the output streams as it grows.
    fn follow(&self, file: OpenFile, run: Arc<Run>) -> Reply<Attr> {
        let attr = growing_attr(&file, &run)?;
        let (tx, frames) = tokio::sync::mpsc::unbounded_channel();
        let queued = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let stream = crate::transport::EventStream { frames, queued: queued.clone() };
        tokio::spawn(follow_run(file, run, attr, tx, queued));
        Ok(Answer::events(stream))
    }
}

/// The attributes of an active file being made: its output's, with the size written so far
/// (what is written is final; reads of more wait for it).
fn growing_attr(file: &OpenFile, run: &Run) -> Result<Attr, WireError> {
    let mut attr = active::attr(file)?;
    attr.size = run.progress().written;
    Ok(attr)
}

/// Sends a growing active file as `get` reply frames: its attributes, then its bytes as
/// they are written, then an empty last frame, or an error frame if the run fails.
async fn follow_run(
    file: OpenFile,
    run: Arc<Run>,
    attr: Attr,
    tx: tokio::sync::mpsc::UnboundedSender<crate::transport::EventFrame>,
    queued: Arc<std::sync::atomic::AtomicUsize>,
) {
    use crate::transport::EventFrame;
    use locus_proto::frame::Kind;
    use std::sync::atomic::Ordering;
    let frame = |kind, more, meta: Vec<u8>, data: Bytes| EventFrame { kind, more, meta, data, mergeable: false };
    if tx.send(frame(Kind::Reply, true, locus_proto::codec::encode(&attr), Bytes::new())).is_err() {
        return;
    }
    let mut offset = 0u64;
    loop {
        let progress = run.wait(offset + 1).await;
        if let Some(Err(e)) = progress.end {
            let _ = tx.send(frame(Kind::Error, false, locus_proto::codec::encode(&e), Bytes::new()));
            return;
        }
        if progress.written > offset {
            let len = (progress.written - offset).min(crate::transport::STREAM_CHUNK as u64) as usize;
            let data = match file.pread(offset, len) {
                Ok(d) => d,
                Err(e) => {
                    let _ = tx.send(frame(
                        Kind::Error,
                        false,
                        locus_proto::codec::encode(&WireError::from(e)),
                        Bytes::new(),
                    ));
                    return;
                }
            };
            offset += data.len() as u64;
            queued.fetch_add(data.len(), Ordering::Relaxed);
            if tx.send(frame(Kind::Reply, true, Vec::new(), data.into())).is_err() {
                return;
            }
            // A slow reader holds this one back (the run goes on into its file).
            while queued.load(Ordering::Relaxed) > 4 << 20 && !tx.is_closed() {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
            continue;
        }
        if progress.end.is_some() {
            let _ = tx.send(frame(Kind::Reply, false, Vec::new(), Bytes::new()));
            return;
        }
    }
}

impl crate::Connection for Session {
    fn authenticated(&self) -> bool {
        Session::authenticated(self)
    }

    fn set_current(&mut self, id: u32, more: bool) {
        Session::set_current(self, id, more)
    }

    fn is_uploading(&self, id: u32) -> bool {
        Session::is_uploading(self, id)
    }

    fn put_more(&mut self, id: u32, data: &[u8], more: bool) -> Result<Encoded, WireError> {
        Session::put_more(self, id, data, more).map(Answer::encode)
    }

    fn direct_write_target(&self, meta: &[u8]) -> Option<(Arc<OpenFile>, u64)> {
        Session::direct_write_target(self, meta)
    }

    fn wrote_directly(&self, file: &OpenFile) {
        self.changed(&[&file.rel], false);
    }

    fn take_unpromised(&mut self) -> Vec<String> {
        std::mem::take(&mut self.unpromised)
    }

    fn heartbeat_deadline(&self) -> Option<std::time::Duration> {
        (self.pinged && self.shared.callbacks.is_target(self.client_id)).then_some(crate::HEARTBEAT_DEAD)
    }
}

impl Handler for Session {
    fn hello(&mut self, req: Hello, _: Bytes) -> Reply<Challenge> {
        if req.version < locus_proto::frame::MIN_VERSION {
            return Err(WireError::new(
                Code::PROTO,
                format!(
                    "this server speaks Locus protocol {} (logins bound to the server's address); \
                     a client of protocol {} must be upgraded",
                    locus_proto::frame::VERSION,
                    req.version
                ),
            ));
        }
        let mut nonce = vec![0u8; auth::NONCE_LEN];
        getrandom::fill(&mut nonce).expect("the OS provides randomness");
        self.server_nonce = Some(nonce.clone());
        Ok(Challenge { version: locus_proto::frame::VERSION, server: self.shared.config.name.clone(), nonce }.into())
    }

    fn auth(&mut self, req: Auth, _: Bytes) -> Reply<Welcome> {
        let denied = || WireError::new(Code::AUTH_FAILED, "authentication failed: unknown subject or wrong token");
        // A nonce is good for one attempt, so a failed guess cannot be retried against it.
        let server_nonce =
            self.server_nonce.take().ok_or_else(|| WireError::new(Code::AUTH_FAILED, "send hello before auth"))?;
        if req.nonce.len() != auth::NONCE_LEN {
            return Err(denied());
        }
        let Some(link) = &self.link else { return Err(denied()) };
        // A proof for an address that is not this server's was made for another server,
        // which passed our challenge on (under TLS the exporter secret stops that).
        if link.exporter.is_empty() && !self.shared.names_this_server(link.local, &req.server) {
            tracing::warn!(subject = %req.subject, server = %req.server, "login for another server's address refused");
            return Err(WireError::new(
                Code::AUTH_FAILED,
                format!(
                    "authentication failed: {} does not name this server (its operator can add the name with \
                     `locus serve --name`)",
                    req.server
                ),
            ));
        }
        let bind = auth::Binding { server: &req.server, tls: &link.exporter };
        // A data node knows its own subjects, and every subject of its cluster by the
        // token the cluster key derives for it.
        let own = self.shared.tokens.get(&req.subject).map(<[u8]>::to_vec);
        let now = locus_proto::capability::now();
        let derived = self.shared.node_key().map_or_else(Vec::new, |keys| keys.node_tokens(&req.subject, now));
        let token = own.into_iter().chain(derived.into_iter().map(String::into_bytes)).find(|t| {
            auth::proofs_equal(&auth::client_proof(t, &server_nonce, &req.nonce, &req.subject, &bind), &req.proof)
        });
        let Some(token) = token else {
            tracing::warn!(subject = %req.subject, "authentication failed");
            return Err(denied());
        };
        let token = &token[..];
        let proof = auth::server_proof(token, &server_nonce, &req.nonce, &req.subject, &bind);
        self.subject = Some(req.subject.clone());
        if self.outbox.is_some() {
            self.shared.registry.authenticated(self.client_id, &req.subject);
        }
        Ok(Welcome { client_id: self.client_id, subject: req.subject, proof, head: false }.into())
    }

    fn ping(&mut self, _: Ping, _: Bytes) -> Reply<()> {
        self.pinged = true;
        Ok(().into())
    }

    fn whoami(&mut self, _: Whoami, _: Bytes) -> Reply<String> {
        Ok(self.who()?.to_string().into())
    }

    fn stat(&mut self, req: Stat, _: Bytes) -> Reply<Attr> {
        self.promise(&req.path, false, Rights::LIST);
        match self.shared.store.stat(self.who()?, &req.path) {
            Ok(attr) => Ok(attr.into()),
            Err(e) => self.active_attr(&req.path, e),
        }
    }

    fn lstat(&mut self, req: Lstat, _: Bytes) -> Reply<Attr> {
        self.promise(&req.path, false, Rights::LIST);
        match self.shared.store.lstat(self.who()?, &req.path) {
            Ok(attr) => Ok(attr.into()),
            Err(e) => self.active_attr(&req.path, e),
        }
    }

    fn fstat(&mut self, req: Fstat, _: Bytes) -> Reply<Attr> {
        let file = self.handle(req.handle)?.clone();
        // The handle shows the subject could open it.
        self.promise(&file.rel, false, Rights(0));
        match self.growing.get(&req.handle) {
            Some(run) => Ok(growing_attr(&file, run)?.into()),
            None => Ok(store(file.stat())?.into()),
        }
    }

    fn open(&mut self, req: Open, _: Bytes) -> Reply<Opened> {
        if self.handles.len() >= self.shared.config.max_handles {
            return Err(WireError::new(Code(24), "too many open handles on this connection"));
            // EMFILE
        }
        let mut need = Rights(0);
        if req.flags & open_flags::READ != 0 {
            need = need.union(Rights::READ);
        }
        if req.flags & open_flags::WRITE != 0 {
            need = need.union(Rights::WRITE);
        }
        self.promise(&req.path, false, if need.0 == 0 { Rights::LIST } else { need });
        let (file, attr, run) = match self.shared.store.open(self.who()?, &req.path, req.flags, req.mode) {
            Ok(file) => {
                if req.flags & (open_flags::CREATE | open_flags::TRUNCATE) != 0 {
                    self.changed(&[&req.path], req.flags & open_flags::CREATE != 0);
                }
                let attr = store(file.stat())?;
                (file, attr, None)
            }
            // Only a read-only open of a missing name may run a handler.
            Err(e) if req.flags & !(open_flags::READ | open_flags::NOFOLLOW) == 0 => match self.active(&req.path, e)? {
                Found::Ready(file) => {
                    let attr = active::attr(&file)?;
                    (file, attr, None)
                }
                Found::Running(file, run) => {
                    let attr = growing_attr(&file, &run)?;
                    (file, attr, Some(run))
                }
            },
            Err(e) => return Err(e.into()),
        };
        let handle = self.next_handle;
        self.next_handle += 1;
        self.handles.insert(handle, Arc::new(file));
        if let Some(run) = run {
            self.growing.insert(handle, run);
        }
        Ok(Opened { handle, attr, location: None }.into())
    }

    fn close(&mut self, req: Close, _: Bytes) -> Reply<()> {
        self.handles.remove(&req.handle).ok_or(StoreError::BadHandle(req.handle))?;
        self.growing.remove(&req.handle);
        Ok(().into())
    }

    fn pread(&mut self, req: Pread, _: Bytes) -> Reply<()> {
        let file = self.handle(req.handle)?.clone();
        store(file.check_readable())?;
        let len = req.len.min(self.shared.config.limits.max_data.min(locus_proto::Limits::CLIENT.max_data));
        if let Some(run) = self.growing.get(&req.handle).cloned() {
            // An active file still being made: wait for bytes at the offset, or the end, and
            // answer what is there (fewer than asked, as a pipe would, so readers stream).
            if run.progress().end != Some(Ok(())) {
                return Ok(Answer::later(Box::pin(async move {
                    let p = run.wait(req.offset.saturating_add(1)).await;
                    if let Some(Err(e)) = p.end {
                        return Err(e);
                    }
                    let len = p.written.saturating_sub(req.offset).min(len as u64) as usize;
                    Ok(Answer::with_body((), Body::Bytes(store(file.pread(req.offset, len))?.into())).encode())
                })));
            }
        }
        if (len as u64) < crate::transport::SENDFILE_MIN {
            // Small reads go through memory, whose length is known after the read.
            return Ok(Answer::with_body((), Body::Bytes(store(file.pread(req.offset, len as usize))?.into())));
        }
        // sendfile needs the length before the bytes: clamp it to the file's size.
        let size = store(file.stat())?.size;
        let len = (len as u64).min(size.saturating_sub(req.offset));
        Ok(Answer::with_body((), Body::File { file, offset: req.offset, len }))
    }

    fn pwrite(&mut self, req: Pwrite, data: Bytes) -> Reply<u64> {
        let file = self.handle(req.handle)?;
        Ok(self.changing(&[&file.rel], file.pwrite(req.offset, &data))?.into())
    }

    fn get(&mut self, req: Get, _: Bytes) -> Reply<Attr> {
        self.promise(&req.path, false, Rights::READ);
        let (file, attr) = match self.shared.store.open(self.who()?, &req.path, open_flags::READ, 0) {
            Ok(file) => {
                let attr = store(file.stat())?;
                (file, attr)
            }
            Err(e) => match self.active(&req.path, e)? {
                Found::Ready(file) => {
                    let attr = active::attr(&file)?;
                    (file, attr)
                }
                Found::Running(file, run) => return self.follow(file, run),
            },
        };
        if attr.is_dir() {
            return Err(WireError::new(Code::ISDIR, format!("{}: is a directory", req.path)));
        }
        Ok(Answer::with_body(attr, Body::Stream(Arc::new(file))))
    }

    fn put(&mut self, req: Put, data: Bytes) -> Reply<Attr> {
        let who = self.who()?.to_string();
        self.start_put(&who, req, data, true)
    }

    fn put_cached(&mut self, req: PutCached, data: Bytes) -> Reply<Attr> {
        let who = self.who()?.to_string();
        self.start_put(&who, Put { path: req.path, mode: req.mode }, data, false)
    }

    fn readdir(&mut self, req: Readdir, _: Bytes) -> Reply<Vec<DirEntry>> {
        self.promise(&req.path, true, Rights::LIST);
        Ok(listing(&store(self.shared.store.readdir(self.who()?, &req.path))?))
    }

    fn mkdir(&mut self, req: Mkdir, _: Bytes) -> Reply<()> {
        Ok(self.naming(&[&req.path], self.shared.store.mkdir(self.who()?, &req.path, req.mode))?.into())
    }

    fn rmdir(&mut self, req: Rmdir, _: Bytes) -> Reply<()> {
        Ok(self.naming(&[&req.path], self.shared.store.rmdir(self.who()?, &req.path))?.into())
    }

    fn unlink(&mut self, req: Unlink, _: Bytes) -> Reply<()> {
        Ok(self.naming(&[&req.path], self.shared.store.unlink(self.who()?, &req.path))?.into())
    }

    fn rename(&mut self, req: Rename, _: Bytes) -> Reply<()> {
        Ok(self.naming(&[&req.from, &req.to], self.shared.store.rename(self.who()?, &req.from, &req.to))?.into())
    }

    fn symlink(&mut self, req: Symlink, _: Bytes) -> Reply<()> {
        Ok(self.naming(&[&req.path], self.shared.store.symlink(self.who()?, &req.target, &req.path))?.into())
    }

    fn readlink(&mut self, req: Readlink, _: Bytes) -> Reply<String> {
        self.promise(&req.path, false, Rights::LIST);
        Ok(store(self.shared.store.readlink(self.who()?, &req.path))?.into())
    }

    fn link(&mut self, req: Link, _: Bytes) -> Reply<()> {
        Ok(self.naming(&[&req.from, &req.to], self.shared.store.link(self.who()?, &req.from, &req.to))?.into())
    }

    fn truncate(&mut self, req: Truncate, _: Bytes) -> Reply<()> {
        Ok(self.changing(&[&req.path], self.shared.store.truncate(self.who()?, &req.path, req.size))?.into())
    }

    fn chmod(&mut self, req: Chmod, _: Bytes) -> Reply<()> {
        Ok(self.changing(&[&req.path], self.shared.store.chmod(self.who()?, &req.path, req.mode))?.into())
    }

    fn utimes(&mut self, req: Utimes, _: Bytes) -> Reply<()> {
        Ok(self.changing(&[&req.path], self.shared.store.utimes(self.who()?, &req.path, req.atime, req.mtime))?.into())
    }

    fn fsync(&mut self, req: Fsync, _: Bytes) -> Reply<()> {
        Ok(store(self.handle(req.handle)?.fsync())?.into())
    }

    fn statfs(&mut self, req: Statfs, _: Bytes) -> Reply<StatFs> {
        Ok(store(self.shared.store.statfs(self.who()?, &req.path))?.into())
    }

    fn access(&mut self, req: Access, _: Bytes) -> Reply<()> {
        match self.shared.store.access(self.who()?, &req.path, req.mode) {
            Ok(()) => Ok(().into()),
            // An active file exists for reading only (asking does not wait for its run).
            Err(e) => {
                self.active(&req.path, e)?;
                if req.mode & 2 != 0 {
                    return Err(WireError::new(Code::ACCES, format!("{}: active files are read-only", req.path)));
                }
                Ok(().into())
            }
        }
    }

    fn ftruncate(&mut self, req: Ftruncate, _: Bytes) -> Reply<()> {
        let file = self.handle(req.handle)?;
        Ok(self.changing(&[&file.rel], file.ftruncate(req.size))?.into())
    }

    fn callbacks(&mut self, req: Callbacks, _: Bytes) -> Reply<u32> {
        self.who()?;
        if self.outbox.is_none() {
            return Err(WireError::new(Code::NOTSUP, "scripts do not hold callbacks"));
        }
        let to = match req.to {
            0 => self.client_id,
            to if self.shared.registry.subject(to).as_deref() == Some(self.who()?) => to,
            to => return Err(WireError::new(Code::ACCES, format!("connection {to} is not one of this subject's"))),
        };
        self.shared.callbacks.watch_export(&self.shared);
        self.callbacks_on = true;
        let who = self.who()?.to_string();
        Ok(self.shared.callbacks.enable(self.client_id, &who, req.max, to).into())
    }

    fn acl_get(&mut self, req: AclGet, _: Bytes) -> Reply<Vec<AclEntry>> {
        Ok(store(self.shared.store.acl_get(self.who()?, &req.path))?.entries.into())
    }

    fn acl_set(&mut self, req: AclSet, _: Bytes) -> Reply<()> {
        // Rights change beneath too (ACLs are inherited): every promise there breaks, so
        // its holder asks again under the new rights.
        Ok(self
            .naming(&[&req.path], self.shared.store.acl_set(self.who()?, &req.path, &req.subject, req.rights))?
            .into())
    }

    fn script_register(&mut self, req: ScriptRegister, _: Bytes) -> Reply<String> {
        self.may_execute()?;
        Ok(self.shared.scripts.register(&req.source)?.into())
    }

    fn script_call(&mut self, req: ScriptCall, data: Bytes) -> Reply<Vec<Value>> {
        let who = self.may_execute()?.to_string();
        let Some(outbox) = self.outbox.clone() else {
            return Err(WireError::new(Code::NOTSUP, "scripts cannot call scripts"));
        };
        let limits =
            self.shared.config.script_limits_by_subject.get(&who).copied().unwrap_or(self.shared.config.script_limits);
        let host = |s: &Session| Box::new(crate::script_host::ScriptHost::new(s.shared.clone(), &who, s.client_id));
        // First on this thread: a short lookup is answered here (see `Engine::try_inline`).
        let inline = locus_script::CallRequest {
            id: req.id.clone(),
            source: req.source.clone(),
            args: req.args.clone(),
            input: data.to_vec(),
            limits,
            host: host(self),
        };
        if let Some(outcome) = self.shared.scripts.try_inline(inline) {
            let out = outcome?;
            return Ok(Answer::with_body(out.values, Body::Bytes(out.output.into())));
        }
        let (op, id) = (ScriptCall::INFO.code, self.current.0);
        // The interpreter thread that runs the call sends its reply.
        let reply = Box::new(move |result: Result<locus_script::CallOutcome, locus_script::ScriptError>| {
            let outcome = result
                .map(|out| Answer::with_body(out.values, Body::Bytes(out.output.into())).encode())
                .map_err(WireError::from);
            outbox.reply(op, id, outcome);
        });
        let call = locus_script::CallRequest {
            id: req.id,
            source: req.source,
            args: req.args,
            input: data.to_vec(),
            limits,
            host: host(self),
        };
        self.shared.scripts.call(call, reply)?;
        Ok(Answer::deferred())
    }

    fn storelet_run(&mut self, req: StoreletRun, data: Bytes) -> Reply<StoreletEvent> {
        let who = self.may_execute()?.to_string();
        let view = store(self.shared.store.code_view(&who, &req.dir, req.write))?;
        let submission = crate::storelet_host::Submission {
            subject: who,
            wasm: data,
            args: req.args,
            env: req.env,
            view,
            write: req.write,
            record_inputs: false,
            native: None,
            active_file: None,
        };
        let (control, events) = self.shared.storelets.submit(submission)?;
        // Forget finished runs: only this list still holds their controls.
        self.storelet_runs.retain(|c| Arc::strong_count(c) > 1);
        self.storelet_runs.push(control);
        Ok(Answer::events(events))
    }

    fn handlers(&mut self, _: Handlers, _: Bytes) -> Reply<Vec<HandlerInfo>> {
        self.who()?;
        Ok(self.shared.active.list().into())
    }

    fn storelet_ps(&mut self, _: StoreletPs, _: Bytes) -> Reply<Vec<StoreletRunInfo>> {
        let (who, admin) = self.who_and_admin()?;
        Ok(self.shared.storelets.ps(who, admin).into())
    }

    fn storelet_cancel(&mut self, req: StoreletCancel, _: Bytes) -> Reply<()> {
        let (who, admin) = self.who_and_admin()?;
        Ok(self.shared.storelets.cancel(who, admin, req.run)?.into())
    }

    fn storelet_stats(&mut self, _: StoreletStats, _: Bytes) -> Reply<StoreletReport> {
        let (who, admin) = self.who_and_admin()?;
        Ok(self.shared.storelets.stats(who, admin).into())
    }

    fn rebalance_plan(&mut self, req: RebalancePlan, _: Bytes) -> Reply<Rebalance> {
        Ok(store(self.shared.store.rebalance_plan(self.who()?, req.max_moves))?.into())
    }

    fn rebalance_apply(&mut self, req: RebalanceApply, _: Bytes) -> Reply<Rebalance> {
        // Checked here, so an unauthorized caller is refused at once.
        self.shared.store.rebalance_plan(self.who()?, 0)?;
        // Moves copy whole files: on a thread of their own, not the connection's.
        let (shared, who) = (self.shared.clone(), self.who()?.to_string());
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("locus-rebalance".into())
            .spawn(move || {
                let done = shared.store.rebalance(&who, req.max_moves);
                shared.save_accounts();
                let _ = tx.send(done);
            })
            .map_err(|e| WireError::new(Code::IO, format!("cannot start the rebalancing: {e}")))?;
        Ok(Answer::later(Box::pin(async move {
            let done = rx.await.map_err(|_| WireError::new(Code::IO, "the rebalancing stopped"))?;
            Ok(Answer::from(store(done)?).encode())
        })))
    }

    fn locate(&mut self, req: Locate, _: Bytes) -> Reply<Located> {
        let attr = self.stat(Stat { path: req.path }, Bytes::new())?.pages.remove(0);
        Ok(Located { attr, location: None }.into())
    }

    fn object_read(&mut self, req: ObjectRead, data: Bytes) -> Reply<()> {
        self.serve_object_read(req, data)
    }

    fn object_put(&mut self, req: ObjectPut, data: Bytes) -> Reply<Attr> {
        self.store_object(req, data)
    }

    fn object_drop(&mut self, req: ObjectDrop, data: Bytes) -> Reply<()> {
        self.drop_object(req, data)
    }

    fn node_run(&mut self, req: NodeRun, data: Bytes) -> Reply<StoreletEvent> {
        self.run_share(req, data)
    }

    fn share(&mut self, _: Share, _: Bytes) -> Reply<String> {
        Err(WireError::new(Code::NOTSUP, "shared URLs are made by cluster heads (locus serve --head --http-port)"))
    }

    fn node_join(&mut self, _: NodeJoin, _: Bytes) -> Reply<NodeWelcome> {
        Err(WireError::new(Code::NOTSUP, "this server is not a cluster head (start one with locus serve --head)"))
    }

    fn key_rotate(&mut self, _: KeyRotate, _: Bytes) -> Reply<()> {
        Err(WireError::new(Code::NOTSUP, "this server is not a cluster head: it has no cluster key to rotate"))
    }

    fn stats(&mut self, req: Stats, _: Bytes) -> Reply<StatsReport> {
        let mut report = store(self.shared.store.stats(self.who()?, req.top))?;
        report.clients = self.shared.registry.count() as u64;
        let callbacks = &self.shared.callbacks;
        (report.promises_held, report.promises_refused) = (callbacks.held() as u64, callbacks.refused());
        report.watches = callbacks.watches() as u64;
        Ok(report.into())
    }
}
