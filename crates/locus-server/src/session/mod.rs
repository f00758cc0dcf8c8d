//! One client's session: its identity, open handles and uploads in progress, and the
//! [`crate::dispatch::Handler`] that carries each operation out on the store.
//!
//! Everything a session holds is released when it is dropped, which happens when its
//! connection ends for any reason: handles close, unfinished uploads are removed.

mod copy;
mod handler;

use crate::active::{self, Found, Run};
use crate::dispatch::Reply;
use crate::dispatch::{Answer, Encoded};
use crate::transport::Body;
use crate::{Outbox, Shared};
use bytes::Bytes;
use locus_proto::ops::*;
use locus_proto::types::*;
use locus_proto::{Code, Error as WireError, Operation};
use locus_store::{OpenFile, PutFile, StoreError};
use std::collections::HashMap;
use std::sync::Arc;

/// The largest request metadata a data node takes from its head: a run's share of a
/// million files or more (about 35 bytes each).
pub const HEAD_MAX_META: u32 = 64 << 20;

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

/// An upload in progress: where it goes and, for a version written under a write
/// capability, the exact size it must have.
struct Upload {
    put: PutFile,
    path: String,
    exact: Option<u64>,
    written: u64,
}

impl Upload {
    /// Appends `data`, refusing bytes past the exact size.
    fn write(&mut self, data: &[u8]) -> Result<(), WireError> {
        self.written += data.len() as u64;
        if let Some(exact) = self.exact.filter(|e| self.written > *e) {
            return Err(WireError::new(Code::FBIG, format!("{}: more than the {exact} bytes granted", self.path)));
        }
        store(self.put.write(data))
    }

    /// Ends the upload; short of the exact size, nothing is stored.
    fn finish(self) -> Result<Attr, WireError> {
        if let Some(exact) = self.exact.filter(|e| self.written != *e) {
            return Err(WireError::new(
                Code::IO,
                format!("{}: {} of the {exact} bytes granted", self.path, self.written),
            ));
        }
        store(self.put.finish())
    }
}

/// State of one connection.
pub struct Session {
    pub(crate) shared: Arc<Shared>,
    pub(crate) client_id: u64,
    subject: Option<String>,
    server_nonce: Option<Vec<u8>>,
    handles: HashMap<u64, Arc<OpenFile>>,
    next_handle: u64,
    /// Uploads in progress, by request id.
    puts: HashMap<u32, Upload>,
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

    /// The address the connection came from (none for a session of no connection).
    pub fn peer(&self) -> Option<std::net::SocketAddr> {
        self.link.as_ref().map(|l| l.peer)
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
    /// The subject, and whether it administers this server: it holds `a` at the root,
    /// or it is the head this data node joined, which answers for its clients' runs
    /// here (`storelet ps/cancel/stats` on a head).
    fn who_and_admin(&self) -> Result<(&str, bool), WireError> {
        let who = self.who()?;
        if who == locus_proto::capability::HEAD_SUBJECT && self.node_key().is_ok() {
            return Ok((who, true));
        }
        Ok((who, store(self.shared.store.rights(who, "/"))?.contains(Rights::ADMIN)))
    }

    /// The largest frames the peer may send now. The head this data node joined sends
    /// a run's share of files (a name and a version each) in one request's metadata, so
    /// its requests may carry up to [`HEAD_MAX_META`] of it; anyone else's, `limits`.
    pub fn request_limits(&self, limits: locus_proto::Limits) -> locus_proto::Limits {
        match self.who() {
            Ok(locus_proto::capability::HEAD_SUBJECT) if self.node_key().is_ok() => {
                locus_proto::Limits { max_meta: limits.max_meta.max(HEAD_MAX_META), ..limits }
            }
            _ => limits,
        }
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

    /// Runs `f` on upload `id`'s file (with a file of the server's own, not a client's
    /// bytes: refused for an upload of an exact size) and counts the bytes it answers;
    /// the upload ends if it fails.
    fn put_outside(
        &mut self,
        id: u32,
        f: impl FnOnce(&mut PutFile) -> Result<Option<u64>, StoreError>,
    ) -> Result<Option<u64>, WireError> {
        let Some(upload) = self.puts.get_mut(&id) else {
            return Err(WireError::new(Code::INVAL, "no upload is under way"));
        };
        let done = match upload.exact {
            Some(_) => {
                Err(WireError::new(Code::INVAL, format!("{}: an upload of an exact size takes no file", upload.path)))
            }
            None => store(f(&mut upload.put)).inspect(|n| upload.written += n.unwrap_or(0)),
        };
        if done.is_err() {
            self.puts.remove(&id);
        }
        done
    }

    /// Handles a continuation frame of an upload: appends, and finishes on the last.
    pub fn put_more(&mut self, id: u32, data: &[u8], more: bool) -> Reply<Attr> {
        let upload = self.puts.get_mut(&id).expect("caller checked is_uploading");
        if let Err(e) = upload.write(data) {
            self.puts.remove(&id);
            return Err(e);
        }
        if more {
            return Ok(Answer::deferred());
        }
        let upload = self.puts.remove(&id).expect("present");
        let path = upload.path.clone();
        let attr = upload.finish()?;
        self.changed(&[&path], true);
        Ok(attr.into())
    }

    /// For a `pwrite` whose data may go straight from the socket into the file: the open
    /// file and offset, when the request decodes and names a writable, non-append handle.
    /// Anything else takes the ordinary path, which reports the error.
    pub fn direct_write_target(&self, meta: &[u8]) -> Option<(Arc<OpenFile>, u64)> {
        let req: Pwrite = locus_proto::codec::decode(meta).ok()?;
        let file = self.handles.get(&req.handle)?;
        (file.check_writable().is_ok() && !file.append).then(|| (file.clone(), req.offset))
    }

    /// Starts (or, for a one-frame upload, does) a `put` as `who`; with `exact`, the
    /// upload must be exactly that many bytes.
    pub(crate) fn start_put(
        &mut self,
        who: &str,
        req: Put,
        data: Bytes,
        durable: bool,
        exact: Option<u64>,
    ) -> Reply<Attr> {
        let (id, more) = self.current;
        if more && self.puts.len() >= self.shared.config.max_handles {
            return Err(WireError::new(Code(24), "too many uploads in progress on this connection"));
            // EMFILE
        }
        let new_only = req.mode & locus_proto::ops::PUT_NEW != 0;
        if new_only && self.shared.store.lstat(who, &req.path).is_ok() {
            // Refused before any byte is stored; the rename checks again at the end.
            return Err(WireError::new(Code::EXIST, format!("{}: exists", req.path)));
        }
        let mut put = store(self.shared.store.begin_put(who, &req.path, req.mode & 0o7777))?;
        put.durable = durable;
        // A version written under a capability never replaces one already there, nor
        // does a create-only put.
        put.no_replace = exact.is_some() || new_only;
        let mut upload = Upload { put, path: req.path, exact, written: 0 };
        upload.write(&data)?;
        if more {
            self.puts.insert(id, upload);
            return Ok(Answer::deferred());
        }
        let path = upload.path.clone();
        let attr = upload.finish()?;
        self.changed(&[&path], true);
        Ok(attr.into())
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
        use crate::callbacks::Asked;
        let (canonical, dir) = match crate::callbacks::asked(path, listing) {
            Asked::Nothing => return,
            Asked::Refused(canonical) => return self.unpromised.push(canonical),
            Asked::Check { path, dir } => (path, dir),
        };
        let mut dir = dir.as_str();
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

    /// Runs script call `req` for `who` (who may execute), with the `fs.*` calls going
    /// to the host `host` makes: a short lookup on this thread, anything else on the
    /// interpreter pool, whose thread sends the reply.
    pub(crate) fn run_script(
        &mut self,
        who: &str,
        req: ScriptCall,
        data: Bytes,
        host: impl Fn(&Session) -> Box<dyn locus_script::Host>,
    ) -> Reply<Vec<Value>> {
        let Some(outbox) = self.outbox.clone() else {
            return Err(WireError::new(Code::NOTSUP, "scripts cannot call scripts"));
        };
        let limits =
            self.shared.config.script_limits_by_subject.get(who).copied().unwrap_or(self.shared.config.script_limits);
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

    /// True when this connection can be told things outside any reply (a client's own
    /// connection; not a script's or a Chirp client's session).
    pub(crate) fn can_push(&self) -> bool {
        self.outbox.is_some()
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

    fn request_limits(&self, server: locus_proto::Limits) -> locus_proto::Limits {
        Session::request_limits(self, server)
    }

    fn set_current(&mut self, id: u32, more: bool) {
        Session::set_current(self, id, more)
    }

    fn is_uploading(&self, id: u32) -> bool {
        Session::is_uploading(self, id)
    }

    fn put_file(&mut self, id: u32, from: &std::fs::File, at: u64, len: u64) -> Result<u64, WireError> {
        self.put_outside(id, |put| put.append_file(from, at, len).map(Some)).map(|n| n.unwrap_or(0))
    }

    fn put_adopt(&mut self, id: u32, from: &std::path::Path) -> Result<Option<u64>, WireError> {
        self.put_outside(id, |put| match put.adopt(from) {
            Err(locus_store::StoreError::Os { errno: rustix::io::Errno::XDEV, .. }) => Ok(None),
            other => other.map(Some),
        })
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
