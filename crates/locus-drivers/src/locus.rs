//! The Locus driver: the blocking client, every operation.
//!
//! A lost connection is transient: the call reconnects and tries again with backoff
//! for the driver's retry window, so a program survives a server restart; past the
//! window the call fails with `EIO`. Handles carry the connection's generation in their
//! upper bits, so a handle from before a reconnection answers `EBADF` instead of naming
//! whatever the new session numbered the same.

use crate::{Attr, Break, DirEntry, Driver, DriverError, Opened, Result, SetTime, StatFs};
use locus_client::{blocking::Client, ClientError, ConnectOptions, LocusUrl, Pending, PendingListing};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

/// How long calls keep retrying a lost server by default.
pub const DEFAULT_RETRY: Duration = Duration::from_secs(30);

/// A connection to a Locus server that reconnects when it is lost.
pub struct LocusDriver {
    options: ConnectOptions,
    /// Ends the current connection: the callback listener does, when its heartbeat
    /// finds the link silent, so that a call waiting on it (a store at `close`) fails
    /// within seconds as the server being away, not at the request deadline.
    data_link: Arc<parking_lot::Mutex<Option<locus_client::ConnectionEnder>>>,
    client: Option<Client>,
    /// Counts connections; the upper 24 bits of every handle given out.
    generation: u64,
    retry: Duration,
    /// Requests sent on behalf of an open file and not yet answered, by handle.
    behind: HashMap<u64, Vec<Behind>>,
    /// Reads sent ahead of a sequential reader, by handle.
    ahead: HashMap<u64, ReadAhead>,
    /// Callback promises, once turned on.
    callbacks: Option<Callbacks>,
    /// Removals and renames sent without waiting for their answers, oldest first.
    names_behind: VecDeque<NameChange>,
    /// Names whose change behind was answered with an error, not yet reported.
    failed_names: Vec<(String, DriverError)>,
    /// Listings asked for ahead (see [`Driver::list_ahead`]) and not yet read, by path.
    lists_ahead: HashMap<String, ListingAhead>,
    /// Paths the server answered without a callback promise, not yet taken by
    /// [`Driver::take_unpromised`].
    unpromised: Vec<String>,
    /// The last call's answer held no promise: it is not to be trusted past the timeout.
    last_unpromised: bool,
    /// How many may be outstanding: from [`LISTS_AHEAD_START`], twice as many each time
    /// a quarter of that many were read, up to [`LISTS_AHEAD_MAX`]; a walk earns the
    /// depth it is read ahead to.
    lists_window: usize,
    /// Listings asked for ahead and read since the window last grew.
    lists_read: usize,
}

/// A listing asked for ahead.
struct ListingAhead {
    pending: PendingListing,
    /// Whether its subdirectories were asked for too.
    expanded: bool,
}

/// Listings asked for ahead and not yet read at first, and at most (see
/// [`LocusDriver::lists_window`]).
const LISTS_AHEAD_START: usize = 32;
const LISTS_AHEAD_MAX: usize = 1024;

/// A removal or rename sent without waiting for its answer.
struct NameChange {
    /// The names it changes (a rename's source first).
    paths: Vec<String>,
    /// A removal: finding the name gone already is no failure.
    removal: bool,
    pending: Pending<()>,
}

/// The driver's side of callbacks. Breaks arrive on a second connection of the same
/// subject, read by a thread of its own: the blocking client reads its connection only
/// while a call runs, and a break must reach the mount while it is idle.
struct Callbacks {
    max: u32,
    /// The listening connection's id at the server; 0 while it is down.
    listener: Arc<AtomicU64>,
    /// The connection generation and listener the server was last asked to use.
    enabled: (u64, u64),
    breaks: mpsc::Sender<Break>,
}

/// How long the listener waits for a connection to be made and authenticated before it
/// tries again (a frozen server or link accepts and then says nothing).
const LISTEN_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Keeps a connection open on which the server's breaks arrive, forwarding them; when it
/// is lost, says so ([`Break::All`]) and connects again. The connection sends heartbeats
/// ([`locus_client::Client::keep_alive`]): a server or link that stops answering (frozen,
/// cut without a word) ends it within seconds, as a lost one does, and then the driver's
/// own connection (`data_link`) too: the server or link it shares is taken for gone.
fn listen(
    mut options: ConnectOptions,
    listener: Arc<AtomicU64>,
    breaks: mpsc::Sender<Break>,
    data_link: Arc<parking_lot::Mutex<Option<locus_client::ConnectionEnder>>>,
) {
    let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return };
    rt.block_on(async move {
        loop {
            let connect = tokio::time::timeout(LISTEN_CONNECT_TIMEOUT, locus_client::Client::connect(&options));
            let client = match connect.await {
                Ok(Ok(c)) => c,
                _ => {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
            };
            client.keep_alive();
            options.learn_heads(client.heads());
            let mut pushes = client.subscribe();
            listener.store(client.client_id(), Ordering::SeqCst);
            while let Some(push) = pushes.recv().await {
                if push.topic != locus_proto::frame::PUSH_BREAK {
                    continue;
                }
                let Ok(paths) = locus_proto::codec::decode::<Vec<String>>(&push.meta) else { continue };
                if breaks.send(Break::Paths(paths)).is_err() {
                    return;
                }
            }
            listener.store(0, Ordering::SeqCst);
            if let Some(link) = data_link.lock().as_ref() {
                link.end();
            }
            if breaks.send(Break::All).is_err() {
                return;
            }
        }
    })
}

/// A sequential reader's reads sent before it asks, so that several are in flight and a
/// large file streams at the link's rate rather than one request per round trip.
///
/// A read that continues the previous one (same length, at its end) counts as
/// sequential; from the second such, the next `window` reads of that length are sent
/// ahead, and the window doubles (up to [`AHEAD_MAX`]) each time the reader has read a
/// whole window in order. Any other read, a write or a close drops what was sent.
#[derive(Default)]
struct ReadAhead {
    /// Where the last read ended, and its length.
    next: u64,
    len: u32,
    sequential: u32,
    window: usize,
    /// Reads in flight, oldest first: offset, and the reply.
    sent: std::collections::VecDeque<(u64, Pending<()>)>,
}

/// Reads in flight for one sequential reader at first, and at most.
const AHEAD_START: usize = 4;
const AHEAD_MAX: usize = 64;

/// A request sent without waiting for its answer.
enum Behind {
    /// A write, with the length sent.
    Write(Pending<u64>, usize),
    /// A change whose answer is only success or failure.
    Change(Pending<()>),
}

/// Requests behind on one handle before the driver waits for their answers.
const MAX_BEHIND: usize = 64;

fn err(e: ClientError) -> DriverError {
    if e.is_transient() {
        DriverError::transient(e.to_string())
    } else {
        DriverError::errno(e.errno(), e.to_string())
    }
}

const GENERATION_SHIFT: u32 = 40;

impl LocusDriver {
    /// Connects to the server of `url`; returns the driver and the URL's path.
    pub fn connect(url: &str) -> Result<(LocusDriver, String)> {
        let u = LocusUrl::parse(url).map_err(|e| DriverError::errno(libc::EINVAL, e.to_string()))?;
        let options = ConnectOptions::for_url(&u).map_err(err)?;
        Ok((LocusDriver::with_options(options)?, u.path))
    }

    /// Connects with explicit connection options (address and credentials).
    pub fn with_options(mut options: ConnectOptions) -> Result<LocusDriver> {
        let client = Client::connect(&options).map_err(err)?;
        options.learn_heads(client.inner().heads());
        let data_link = Arc::new(parking_lot::Mutex::new(Some(client.inner().ender())));
        Ok(LocusDriver {
            data_link,
            options,
            client: Some(client),
            generation: 1,
            retry: DEFAULT_RETRY,
            behind: HashMap::new(),
            ahead: HashMap::new(),
            callbacks: None,
            names_behind: VecDeque::new(),
            failed_names: Vec::new(),
            unpromised: Vec::new(),
            last_unpromised: false,
            lists_ahead: HashMap::new(),
            lists_window: LISTS_AHEAD_START,
            lists_read: 0,
        })
    }

    /// Runs `f`, reconnecting and retrying while the server is unreachable, up to the
    /// retry window.
    fn call<T>(&mut self, f: impl Fn(&Client) -> std::result::Result<T, ClientError>) -> Result<T> {
        let window = self.retry;
        crate::retry_transient(window, || {
            if self.client.is_none() {
                // A connect to a silent address may not outlast the window by much either
                // (at least 5 s, for a TLS handshake over a slow link).
                let mut options = self.options.clone();
                options.deadlines.connect = options.deadlines.connect.min(window.max(Duration::from_secs(5)));
                // This address had a Locus server: something else answering there now is
                // the server being away, retried for the window.
                let client = Client::connect(&options).map_err(|e| match e {
                    ClientError::NotLocus(m) => DriverError::transient(m),
                    e => err(e),
                })?;
                *self.data_link.lock() = Some(client.inner().ender());
                self.options.learn_heads(client.inner().heads());
                self.client = Some(client);
                self.generation += 1;
            }
            self.keep_promises()?;
            self.call_on(&f)
        })
        .map_err(|e| match e.is_transient() {
            true => DriverError::transient(format!("server unreachable for {window:?}: {}", e.message)),
            false => e,
        })
    }

    /// With callbacks on, makes sure the current connection has them, with its breaks
    /// going to the current listener (both may have been replaced since). Then nothing
    /// cached before can be trusted: a new connection holds none of the old one's
    /// promises, and breaks sent to a lost listener are gone.
    fn keep_promises(&mut self) -> Result<()> {
        let Some(cb) = &self.callbacks else { return Ok(()) };
        let now = (self.generation, cb.listener.load(Ordering::SeqCst));
        if cb.enabled == now || now.1 == 0 {
            return Ok(());
        }
        if cb.enabled != (0, 0) {
            let _ = cb.breaks.send(Break::All);
        }
        let max = cb.max;
        self.call_on(|c| c.run(|c| c.callbacks(max, now.1)))?;
        if let Some(cb) = &mut self.callbacks {
            cb.enabled = now;
        }
        Ok(())
    }

    /// Runs `f` on the current connection without reconnecting: for calls on handles,
    /// which a new connection would not know.
    fn call_on<T>(&mut self, f: impl FnOnce(&Client) -> std::result::Result<T, ClientError>) -> Result<T> {
        let client = self.client.as_ref().ok_or_else(|| DriverError::errno(libc::EBADF, "the connection was lost"))?;
        let outcome = f(client);
        if self.callbacks.is_some() {
            // Said before the reply it concerns, so read by now.
            let unpromised = client.inner().take_unpromised();
            self.last_unpromised = !unpromised.is_empty();
            self.unpromised.extend(unpromised);
        }
        if matches!(&outcome, Err(e) if e.is_transient()) {
            self.client = None;
        }
        outcome.map_err(err)
    }

    /// Takes the answer of a removal or rename sent behind (waiting for it with `wait`);
    /// an error (other than a removal's "already gone") is kept for
    /// [`Driver::failed_behind`] and, with callbacks on, reported as a break of the
    /// names. Hands the change back when its answer has not come and `wait` is false.
    fn settle_name(&mut self, mut change: NameChange, wait: bool) -> Option<NameChange> {
        // A change sent on a connection since lost has its answer (an error) already.
        let outcome = match (change.pending.try_wait(), &self.client) {
            (Some(outcome), _) => outcome.map_err(err),
            (None, _) if !wait => return Some(change),
            (None, Some(c)) => c.run(|_| change.pending.wait()).map_err(err),
            (None, None) => Err(DriverError::errno(libc::EIO, "the connection was lost before the server answered")),
        };
        match outcome {
            Err(e) if !(change.removal && e.errno == libc::ENOENT) => {
                // As a callback break: whoever caches the names (the mount, the kernel)
                // drops them, and finds them again at the server.
                if let Some(cb) = &self.callbacks {
                    let _ = cb.breaks.send(Break::Paths(change.paths.clone()));
                }
                self.failed_names.extend(change.paths.into_iter().map(|p| (p, e.clone())));
            }
            _ => {}
        }
        None
    }

    /// Sends `request`, which changes `paths` (a removal with `removal`), without
    /// waiting for its answer (after settling the oldest change when many are
    /// unanswered). Where it cannot go out (no connection, or the connection just went),
    /// `waiting` makes the change the ordinary way, which reconnects.
    fn change_behind<O: locus_proto::Operation<Reply = ()>>(
        &mut self,
        request: O,
        paths: Vec<String>,
        removal: bool,
        waiting: impl FnOnce(&mut Self) -> Result<()>,
    ) -> Result<()> {
        if self.client.is_none() {
            return waiting(self);
        }
        if self.names_behind.len() >= MAX_BEHIND {
            let oldest = self.names_behind.pop_front().expect("full");
            self.settle_name(oldest, true);
        }
        match self.call_on(|c| c.run(|c| c.start_with(request, &[]))) {
            Ok(pending) => self.names_behind.push_back(NameChange { paths, removal, pending }),
            Err(e) if e.is_transient() => return waiting(self),
            Err(e) => return Err(e),
        }
        Ok(())
    }

    /// Makes room for one more request behind on `handle` (waiting for the earlier ones
    /// when there are many); answers the server handle.
    fn room_behind(&mut self, handle: u64) -> Result<u64> {
        if self.behind.get(&handle).is_some_and(|w| w.len() >= MAX_BEHIND) {
            self.settle(handle)?;
        }
        self.inner(handle)
    }

    /// The handle given out for server handle `h` of this connection.
    fn outer(&self, h: u64) -> u64 {
        self.generation << GENERATION_SHIFT | h
    }

    /// The server handle behind `handle`, if it belongs to the current connection.
    fn inner(&self, handle: u64) -> Result<u64> {
        if handle >> GENERATION_SHIFT == self.generation && self.client.is_some() {
            Ok(handle & ((1 << GENERATION_SHIFT) - 1))
        } else {
            Err(DriverError::errno(libc::EBADF, "the file was opened before the connection to the server was lost"))
        }
    }
}

impl Driver for LocusDriver {
    fn name(&self) -> &'static str {
        "locus"
    }
    fn set_retry(&mut self, window: Duration) {
        self.retry = window;
    }
    fn callbacks(&mut self, max: u32) -> Option<mpsc::Receiver<Break>> {
        // Asked first with breaks to this connection: a server without callbacks (a
        // cluster head, an older server) refuses, and no listener is started.
        if let Err(e) = self.call(|c| c.run(|c| c.callbacks(max, 0))) {
            tracing::info!("the server does not promise callbacks: {e}");
            return None;
        }
        let (tx, rx) = mpsc::channel();
        let listener = Arc::new(AtomicU64::new(0));
        let (options, id, breaks, link) = (self.options.clone(), listener.clone(), tx.clone(), self.data_link.clone());
        let thread = std::thread::Builder::new().name("locus-callbacks".into());
        thread.spawn(move || listen(options, id, breaks, link)).ok()?;
        // Wait briefly for the listener, so that the first answers are already promised.
        let started = std::time::Instant::now();
        while listener.load(Ordering::SeqCst) == 0 && started.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(1));
        }
        self.callbacks = Some(Callbacks { max, listener, enabled: (0, 0), breaks: tx });
        self.keep_promises().ok()?;
        Some(rx)
    }
    fn callbacks_cover_all(&self) -> bool {
        true
    }
    fn callbacks_held(&self) -> bool {
        !self.last_unpromised
            && self.callbacks.as_ref().is_some_and(|cb| {
                self.client.is_some() && cb.enabled == (self.generation, cb.listener.load(Ordering::SeqCst))
            })
    }
    fn take_unpromised(&mut self) -> Vec<String> {
        std::mem::take(&mut self.unpromised)
    }
    fn lstat(&mut self, path: &str) -> Result<Attr> {
        self.call(|c| c.run(|c| c.lstat(path)))
    }
    fn readdir(&mut self, path: &str) -> Result<Vec<DirEntry>> {
        if let Some(ahead) = self.lists_ahead.remove(path) {
            // One that failed (a lost connection, a directory gone since) is asked again.
            if let Ok(entries) = self.call_on(|c| c.run(|_| ahead.pending.wait())) {
                self.lists_read += 1;
                if self.lists_read >= self.lists_window / 4 {
                    self.lists_window = (self.lists_window * 2).min(LISTS_AHEAD_MAX);
                    self.lists_read = 0;
                }
                return Ok(entries);
            }
        }
        self.call(|c| c.run(|c| c.readdir(path)))
    }
    fn list_ahead(&mut self, dirs: &[String]) {
        let mut wanted: Vec<String> = dirs.to_vec();
        loop {
            let room = self.lists_window.saturating_sub(self.lists_ahead.len());
            wanted.retain(|d| !self.lists_ahead.contains_key(d));
            wanted.truncate(room);
            let Some(client) = self.client.as_ref().filter(|_| !wanted.is_empty()) else { return };
            let sent = client.run(|c| async move {
                let mut sent = Vec::with_capacity(wanted.len());
                for dir in wanted {
                    let pending = c.start_readdir(&dir).await?;
                    sent.push((dir, pending));
                }
                Ok::<_, ClientError>(sent)
            });
            // A connection in trouble sends nothing ahead; the next call finds out.
            let Ok(sent) = sent else { return };
            for (dir, pending) in sent {
                self.lists_ahead.insert(dir, ListingAhead { pending, expanded: false });
            }
            if self.lists_ahead.len() >= self.lists_window {
                return;
            }
            // The listings that came meanwhile name the next directories of the walk:
            // asking for them now, not once the program reads their parents, keeps many
            // round trips in flight however deep the tree.
            wanted = Vec::new();
            for (dir, ahead) in &mut self.lists_ahead {
                if ahead.expanded {
                    continue;
                }
                if let Some(Ok(entries)) = ahead.pending.try_entries() {
                    ahead.expanded = true;
                    let subdirs = entries.iter().filter(|e| e.attr.is_dir());
                    wanted.extend(subdirs.map(|e| crate::join(dir, &e.name)));
                }
            }
        }
    }
    fn drop_ahead(&mut self) {
        self.lists_ahead.clear();
        (self.lists_window, self.lists_read) = (LISTS_AHEAD_START, 0);
    }
    fn open(&mut self, path: &str, flags: u32, mode: u32) -> Result<Opened> {
        let opened = self.call(|c| c.run(|c| c.open(path, flags, mode)))?;
        Ok(Opened { handle: self.outer(opened.handle), attr: opened.attr, location: None })
    }
    fn close(&mut self, handle: u64) -> Result<()> {
        // Once the writes behind are answered, nothing is buffered on either side, so a
        // close cannot fail in a way the program could act on: send it and do not wait
        // for the reply, which saves a round trip per open file.
        self.ahead.remove(&handle);
        let settled = self.settle(handle);
        let Ok(h) = self.inner(handle) else { return settled };
        let close = locus_proto::ops::Close { handle: h };
        let code = <locus_proto::ops::Close as locus_proto::Operation>::INFO.code;
        let meta = locus_proto::codec::encode(&close);
        if let Some(c) = &self.client {
            c.run(|c| async move {
                c.forget_location(h);
                c.send_request(code, &meta, &[], false).await
            })
            .map_err(err)?;
        }
        settled
    }
    fn fstat(&mut self, handle: u64) -> Result<Attr> {
        let h = self.inner(handle)?;
        self.call_on(|c| c.run(|c| c.fstat(h)))
    }
    fn pread(&mut self, handle: u64, offset: u64, len: u32) -> Result<Vec<u8>> {
        let h = self.inner(handle)?;
        let mut ahead = self.ahead.remove(&handle).unwrap_or_default();
        let sequential = offset == ahead.next && len == ahead.len;
        if !sequential {
            ahead = ReadAhead { window: AHEAD_START, ..Default::default() };
        }
        // The reply to this very read, if it was sent ahead.
        let early = match ahead.sent.front() {
            Some(&(at, _)) if at == offset => ahead.sent.pop_front().map(|(_, p)| p),
            _ => {
                ahead.sent.clear();
                None
            }
        };
        let data = match early {
            // A read sent ahead to a data node that failed is asked again, of the head if
            // need be.
            Some(pending) => match self.call_on(|c| c.run(|_| pending.wait_with_data())) {
                Ok((_, d)) => d.to_vec(),
                Err(_) => self.call_on(|c| c.run(|c| c.pread(h, offset, len))).map(|b| b.to_vec())?,
            },
            None => self.call_on(|c| c.run(|c| c.pread(h, offset, len))).map(|b| b.to_vec())?,
        };
        ahead.sequential = if sequential { ahead.sequential + 1 } else { 0 };
        // A reader that has read a whole window in order goes on: send twice as far.
        if ahead.sequential > 0 && (ahead.sequential as usize).is_multiple_of(ahead.window) {
            ahead.window = (ahead.window * 2).min(AHEAD_MAX);
        }
        (ahead.next, ahead.len) = (offset + data.len() as u64, len);
        let at_end = (data.len() as u32) < len;
        if ahead.sequential >= 1 && !at_end {
            let mut at = ahead.sent.back().map_or(ahead.next, |&(o, _)| o + len as u64);
            while ahead.sent.len() < ahead.window {
                let pending = self.call_on(|c| c.run(|c| c.pread_ahead(h, at, len)))?;
                ahead.sent.push_back((at, pending));
                at += len as u64;
            }
        }
        self.ahead.insert(handle, ahead);
        Ok(data)
    }
    fn pwrite(&mut self, handle: u64, offset: u64, data: &[u8]) -> Result<u64> {
        self.ahead.remove(&handle);
        let h = self.inner(handle)?;
        self.call_on(|c| c.run(|c| c.pwrite(h, offset, data)))
    }
    fn ftruncate(&mut self, handle: u64, size: u64) -> Result<()> {
        self.ahead.remove(&handle);
        let h = self.inner(handle)?;
        self.call_on(|c| c.run(|c| c.ftruncate(h, size)))
    }
    fn pwrite_behind(&mut self, handle: u64, offset: u64, data: &[u8]) -> Result<()> {
        self.ahead.remove(&handle);
        let h = self.room_behind(handle)?;
        let pending = self.call_on(|c| c.run(|c| c.pwrite_behind(h, offset, data)))?;
        self.behind.entry(handle).or_default().push(Behind::Write(pending, data.len()));
        Ok(())
    }
    fn utimes_behind(&mut self, path: &str, atime: SetTime, mtime: SetTime, handle: u64) -> Result<()> {
        self.room_behind(handle)?;
        let req = locus_proto::ops::Utimes { path: path.into(), atime, mtime };
        let pending = self.call_on(|c| c.run(|c| c.start_with(req, &[])))?;
        self.behind.entry(handle).or_default().push(Behind::Change(pending));
        Ok(())
    }
    fn settle(&mut self, handle: u64) -> Result<()> {
        let mut first = Ok(());
        for behind in self.behind.remove(&handle).unwrap_or_default() {
            let outcome = match behind {
                Behind::Write(pending, len) => match self.call_on(|c| c.run(|_| pending.wait())) {
                    Ok(n) if n as usize != len => Err(DriverError::errno(libc::EIO, "short write")),
                    other => other.map(drop),
                },
                Behind::Change(pending) => self.call_on(|c| c.run(|_| pending.wait())),
            };
            if first.is_ok() {
                first = outcome;
            }
        }
        first
    }
    fn settle_stat(&mut self, handle: u64) -> Result<Attr> {
        let h = self.inner(handle)?;
        // Asked now, answered after the writes before it: one round trip for both.
        let attr = self.call_on(|c| c.run(|c| c.start_with(locus_proto::ops::Fstat { handle: h }, &[])))?;
        let settled = self.settle(handle);
        let attr = self.call_on(|c| c.run(|_| attr.wait()));
        settled.and(attr)
    }
    fn fsync(&mut self, handle: u64) -> Result<()> {
        let h = self.inner(handle)?;
        self.call_on(|c| c.run(|c| c.fsync(h)))
    }
    fn mkdir(&mut self, path: &str, mode: u32) -> Result<()> {
        self.call(|c| c.run(|c| c.mkdir(path, mode)))
    }
    fn rmdir(&mut self, path: &str) -> Result<()> {
        self.call(|c| c.run(|c| c.rmdir(path)))
    }
    fn unlink(&mut self, path: &str) -> Result<()> {
        self.call(|c| c.run(|c| c.unlink(path)))
    }
    fn unlink_behind(&mut self, path: &str) -> Result<()> {
        let request = locus_proto::ops::Unlink { path: path.to_string() };
        self.change_behind(request, vec![path.to_string()], true, |d| d.unlink(path))
    }
    fn rename_behind(&mut self, from: &str, to: &str) -> Result<()> {
        let request = locus_proto::ops::Rename { from: from.to_string(), to: to.to_string() };
        self.change_behind(request, vec![from.to_string(), to.to_string()], false, |d| d.rename(from, to))
    }
    fn failed_behind(&mut self, wait: bool) -> Vec<(String, DriverError)> {
        // The server answers a connection's requests in order: the oldest change not
        // answered yet ends the look (the mount asks before every request it serves).
        while let Some(change) = self.names_behind.pop_front() {
            if let Some(unanswered) = self.settle_name(change, wait) {
                self.names_behind.push_front(unanswered);
                break;
            }
        }
        std::mem::take(&mut self.failed_names)
    }
    fn rename(&mut self, from: &str, to: &str) -> Result<()> {
        self.call(|c| c.run(|c| c.rename(from, to)))
    }
    fn symlink(&mut self, target: &str, path: &str) -> Result<()> {
        self.call(|c| c.run(|c| c.symlink(target, path)))
    }
    fn readlink(&mut self, path: &str) -> Result<String> {
        self.call(|c| c.run(|c| c.readlink(path)))
    }
    fn link(&mut self, from: &str, to: &str) -> Result<()> {
        self.call(|c| c.run(|c| c.link(from, to)))
    }
    fn truncate(&mut self, path: &str, size: u64) -> Result<()> {
        self.call(|c| c.run(|c| c.truncate(path, size)))
    }
    fn chmod(&mut self, path: &str, mode: u32) -> Result<()> {
        self.call(|c| c.run(|c| c.chmod(path, mode)))
    }
    fn utimes_stat(&mut self, path: &str, atime: SetTime, mtime: SetTime, handle: Option<u64>) -> Result<Attr> {
        match handle {
            // A handle names a file of this connection only: no reconnecting.
            Some(h) => {
                let h = self.inner(h)?;
                self.call_on(|c| c.run(|c| c.utimes_stat(path, atime, mtime, Some(h))))
            }
            None => self.call(|c| c.run(|c| c.utimes_stat(path, atime, mtime, None))),
        }
    }
    fn utimes(&mut self, path: &str, atime: SetTime, mtime: SetTime) -> Result<()> {
        self.call(|c| c.run(|c| c.utimes(path, atime, mtime)))
    }
    fn statfs(&mut self, path: &str) -> Result<StatFs> {
        self.call(|c| c.run(|c| c.statfs(path)))
    }
    fn access(&mut self, path: &str, mode: u32) -> Result<()> {
        self.call(|c| c.run(|c| c.access(path, mode)))
    }
    fn read_file(&mut self, path: &str) -> Result<(Vec<u8>, Attr)> {
        // One streamed `get` by name: a round trip, and retried whole if the server goes away.
        self.call(|c| {
            c.run(|c| async move {
                let mut data = Vec::new();
                let attr = c.get(path, &mut data, |_, _| {}).await?;
                Ok((data, attr))
            })
        })
    }
    fn write_file(&mut self, path: &str, mode: u32, data: &[u8]) -> Result<Attr> {
        self.call(|c| c.run(|c| c.write_file(path, mode, data)))
    }
    fn store_file(&mut self, path: &str, mode: u32, data: &[u8]) -> Result<Attr> {
        self.call(|c| c.run(|c| c.write_file_cached(path, mode, data)))
    }
}
