//! Callback promises, as AFS keeps them: a client that turned callbacks on (the
//! `callbacks` operation) is promised, for every path it asks about, a break message when
//! another client changes that path or a name in it. While the promise holds, the client
//! may trust what it cached indefinitely; `locus mount` uses this to let the kernel keep
//! attributes, names, listings and pages.
//!
//! Promises are made only for what the subject was allowed to see: the session checks
//! the right the operation needs (`l` on a directory to list it, `l` on a path's
//! directory to stat it, `r`/`w` to open or get it) before promising, so a subject
//! refused a listing holds no promise on it.
//!
//! A change to a path breaks the promises on the path and on its directory (whose
//! listing named it, with its attributes), except the changing client's own: it knows
//! what it did. The holder of a listing's promise is told the changed path; the holder
//! of any other promise on the directory (it could look the directory up, not list it)
//! is told only that the directory changed, so a break never names what its holder could
//! not list. A promise is broken once: the holder asks again to get a new one.
//!
//! Promises are bounded: per connection by what its client asked for and by
//! [`PromiseLimits`] (the oldest is broken to make room), per subject by
//! [`PromiseLimits`] in count and bytes, and by the watches they need
//! ([`crate::export_watch`]). Past a subject's bound, or where no watch can be added, the
//! promise is refused: the reply comes with a `PUSH_NO_PROMISE` naming the path, so the
//! client caches it only for its timeout; the first refusal is logged, and `locus stats`
//! counts them. A client's promises go with its connection, and so do the promises whose
//! breaks went to it. Changes made to the export beside the server break promises too,
//! once a client has turned callbacks on ([`crate::export_watch`]).

use crate::export_watch::{LocalChange, WatchRef, WatchRefused, Watcher};
use crate::{Push, Registry, Shared};
use bytes::Bytes;
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// What a path is, as far as telling one change from another goes: on each device,
/// its inode, size, and modification and change times (absent: none).
type Stamp = Vec<Option<(u64, u64, i64, i64, i64, i64)>>;

/// The most promises a client may hold, whatever it asks for.
pub const MAX_PROMISES: u32 = 1 << 20;

/// What one promise costs, in bytes, beyond its path (its entries in the maps).
pub const PROMISE_OVERHEAD: usize = 128;

/// The server's bounds on promises (`locus serve --max-promises`, `--max-promise-mb`,
/// `--max-watches`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PromiseLimits {
    /// Promises one subject may hold, over all its connections (each connection too).
    pub per_subject: usize,
    /// Bytes of promises one subject may hold (path plus [`PROMISE_OVERHEAD`] each),
    /// over all its connections (each connection too).
    pub bytes_per_subject: usize,
    /// Kernel watches the server keeps at most; none: half the kernel's limit
    /// ([`crate::export_watch::default_max_watches`]).
    pub watches: Option<usize>,
}

impl Default for PromiseLimits {
    fn default() -> Self {
        PromiseLimits { per_subject: MAX_PROMISES as usize, bytes_per_subject: 256 << 20, watches: None }
    }
}

/// How long the paths clients changed, and what each change left, are remembered: a
/// report of the watcher that finds a path as a client's change left it is that
/// change's echo (which already broke what it had to).
const ECHO: Duration = Duration::from_millis(500);
/// How long a report waits, at least, for the client's change it may echo to be
/// recorded (the watcher may see a change before the session that made it is done with
/// it); while clients' requests are under way it waits for them to end, up to [`ECHO`]
/// (see [`Callbacks::serving`]).
const GRACE: Duration = Duration::from_millis(5);
/// Stamps remembered per path.
const STAMPS_PER_PATH: usize = 8;

/// Every client's promises.
#[derive(Default)]
pub struct Callbacks {
    limits: PromiseLimits,
    /// Promises refused (a bound reached), for `locus stats`.
    refused: AtomicU64,
    /// The first refusal was logged.
    warned: AtomicBool,
    /// Clients with callbacks on: while none, changes cost nothing here.
    clients: AtomicUsize,
    /// Clients' requests under way (counted while some client has callbacks on).
    in_flight: AtomicUsize,
    state: Mutex<State>,
    /// The export's watcher, started when the first client turns callbacks on (none if
    /// inotify is unavailable).
    watcher: OnceLock<Option<Arc<Watcher>>>,
    /// Paths clients changed lately: when, and what the path was right after.
    recent: Mutex<HashMap<String, VecDeque<(Instant, Stamp)>>>,
    /// Reports of the watcher not yet told apart from echoes: when, what, and what the
    /// path was when the report was read.
    pending: Mutex<VecDeque<(Instant, LocalChange, Stamp)>>,
    /// The export's directory on each device, where the watcher looks at changed paths.
    roots: OnceLock<Vec<std::path::PathBuf>>,
}

#[derive(Default)]
struct State {
    /// The clients holding a promise on each path, in order, so that the promises
    /// beneath a directory are found together.
    holders: BTreeMap<Arc<str>, Vec<u64>>,
    by_client: HashMap<u64, Promises>,
    /// Promises and their bytes, per subject.
    by_subject: HashMap<Arc<str>, (usize, usize)>,
}

/// One client's promises, oldest first.
struct Promises {
    subject: Arc<str>,
    max: usize,
    /// The connection their breaks go to.
    to: u64,
    held: HashMap<Arc<str>, Promise>,
    /// Their bytes (see [`PROMISE_OVERHEAD`]).
    bytes: usize,
    /// Paths in the order promised; may still name promises broken since.
    order: VecDeque<Arc<str>>,
}

/// One promise: whether it covers the path's listing (its holder had `l` there), and
/// the watches it holds.
#[derive(Default)]
struct Promise {
    listing: bool,
    watches: Vec<WatchRef>,
}

fn cost(path: &str) -> usize {
    path.len() + PROMISE_OVERHEAD
}

impl State {
    /// Takes `client`'s promise on `path` out of its list and its subject's count (not
    /// out of `holders`).
    fn take(&mut self, client: u64, path: &str) -> Option<Promise> {
        let mine = self.by_client.get_mut(&client)?;
        let promise = mine.held.remove(path)?;
        mine.bytes = mine.bytes.saturating_sub(cost(path));
        if let Some((n, b)) = self.by_subject.get_mut(&mine.subject) {
            (*n, *b) = (n.saturating_sub(1), b.saturating_sub(cost(path)));
            if *n == 0 {
                self.by_subject.remove(&mine.subject);
            }
        }
        Some(promise)
    }

    /// Removes `client` from the holders of `path`.
    fn unhold(&mut self, client: u64, path: &str) {
        if let Some(h) = self.holders.get_mut(path) {
            h.retain(|&c| c != client);
            if h.is_empty() {
                self.holders.remove(path);
            }
        }
    }

    /// Forgets every promise of `client`; answers the watches they held.
    fn forget_client(&mut self, client: u64) -> Vec<WatchRef> {
        let paths: Vec<Arc<str>> =
            self.by_client.get(&client).map(|p| p.held.keys().cloned().collect()).unwrap_or_default();
        let mut watches = Vec::new();
        for path in paths {
            self.unhold(client, &path);
            if let Some(p) = self.take(client, &path) {
                watches.extend(p.watches);
            }
        }
        watches
    }
}

/// The canonical form of a path for promises (none for a path with `..`, which the
/// store refuses, so nothing is promised on it).
pub use locus_proto::path::{canonical, parent};

/// What a promise on a path comes to, before rights are checked.
pub(crate) enum Asked {
    /// Not a path anything is answered about (it climbs): nothing to promise.
    Nothing,
    /// Never promised (its holder is told so): a name that may invoke a handler reads
    /// as output that changes with files nothing ties it to.
    Refused(String),
    /// The canonical path, and the directory whose rights decide (the one listed, or
    /// the one holding the path).
    Check { path: String, dir: String },
}

/// What a promise on `path` (with `listing`, a directory being listed) comes to.
pub(crate) fn asked(path: &str, listing: bool) -> Asked {
    let Some(path) = canonical(path) else { return Asked::Nothing };
    let name = path.rsplit_once('/').map_or("", |(_, name)| name);
    if !listing && locus_proto::active::may_invoke(name) {
        return Asked::Refused(path);
    }
    let dir = if listing { path.clone() } else { parent(&path).to_string() };
    Asked::Check { path, dir }
}

impl Callbacks {
    /// Callbacks bounded by `limits`.
    pub fn new(limits: PromiseLimits) -> Callbacks {
        Callbacks { limits, ..Default::default() }
    }

    /// Turns callbacks on for `client`, acting as `subject`, with at most `max` promises
    /// (and the server's bounds) whose breaks go to connection `to`; answers the bound.
    pub fn enable(&self, client: u64, subject: &str, max: u32, to: u64) -> u32 {
        let max = max.clamp(1, MAX_PROMISES).min(self.limits.per_subject.clamp(1, MAX_PROMISES as usize) as u32);
        let mut state = self.state.lock();
        match state.by_client.get_mut(&client) {
            Some(p) => (p.max, p.to) = (max as usize, to),
            None => {
                let promises = Promises {
                    subject: subject.into(),
                    max: max as usize,
                    to,
                    held: HashMap::new(),
                    bytes: 0,
                    order: VecDeque::new(),
                };
                state.by_client.insert(client, promises);
                self.clients.fetch_add(1, Ordering::SeqCst);
            }
        }
        max
    }

    /// Starts watching the export for changes made beside the server, once.
    pub fn watch_export(&self, shared: &Arc<Shared>) {
        self.watcher.get_or_init(|| {
            let roots: Vec<_> = std::iter::once(&shared.config.root).chain(&shared.config.devices).cloned().collect();
            let _ = self.roots.set(roots.clone());
            let max = self.limits.watches.unwrap_or_else(crate::export_watch::default_max_watches);
            let watcher = match Watcher::new(roots, max) {
                Ok(w) => Arc::new(w),
                Err(e) => {
                    tracing::warn!("inotify: {e}: changes made beside the server will not break callbacks");
                    return None;
                }
            };
            let (w, shared) = (watcher.clone(), Arc::downgrade(shared));
            let thread = std::thread::Builder::new().name("locus-watch".into()).spawn(move || {
                w.run(|change| match shared.upgrade() {
                    Some(shared) => shared.callbacks.changed_beside(&shared.registry, change),
                    None => false,
                })
            });
            thread.map_err(|e| tracing::warn!("no watcher thread: {e}")).ok()?;
            Some(watcher)
        });
    }

    /// Counts a refused promise, and says so in the log the first time.
    fn refuse(&self, why: &str) {
        self.refused.fetch_add(1, Ordering::Relaxed);
        if !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "a callback promise was refused ({why}): its client caches that path only for its \
                 timeout; further refusals are counted in `locus stats`"
            );
        }
    }

    /// Promises refused since the server started (a bound reached).
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Kernel watches held now for promises.
    pub fn watches(&self) -> usize {
        match self.watcher.get() {
            Some(Some(w)) => w.count(),
            _ => 0,
        }
    }

    fn release(&self, watches: &[WatchRef]) {
        if let (Some(Some(w)), false) = (self.watcher.get(), watches.is_empty()) {
            for hold in watches {
                w.release(hold);
            }
        }
    }

    /// Promises `client` a break when `path` changes, if it has callbacks on (with
    /// `listing`, `path` is a directory being listed, and its holder may list it). The
    /// caller has checked that the client's subject may see what it asks; it calls this
    /// before the path is read, so that a change right after the read breaks it.
    /// Answers false where no promise is held (a bound reached, or callbacks gone with
    /// the connection breaks went to): the client must not trust its answer beyond its
    /// timeout.
    pub fn promise(&self, registry: &Registry, client: u64, path: &str, listing: bool) -> bool {
        if self.clients.load(Ordering::SeqCst) == 0 {
            return false;
        }
        // The store refuses paths with `..`: nothing is answered there to trust.
        let Some(path) = canonical(path) else { return true };
        let watcher = match self.watcher.get() {
            Some(Some(w)) => Some(w.clone()),
            _ => None,
        };
        let mut refused = None;
        let (to, evicted, released) = {
            let mut guard = self.state.lock();
            let state = &mut *guard;
            let Some(mine) = state.by_client.get_mut(&client) else { return false };
            let subject = mine.subject.clone();
            if let Some(held) = mine.held.get_mut(path.as_str()) {
                if !listing || held.listing {
                    return true;
                }
                // Listed now, after a lookup: the directory itself must be watched too.
                match watcher.as_ref().map(|w| w.acquire(&path)) {
                    Some(Err(why)) => {
                        self.refuse(watch_refusal(why));
                        return false;
                    }
                    Some(Ok(hold)) => held.watches.extend(hold),
                    None => {}
                }
                held.listing = true;
                return true;
            }
            let (count, bytes) = state.by_subject.get(&subject).copied().unwrap_or_default();
            if count >= self.limits.per_subject {
                refused = Some("the subject holds --max-promises promises");
            } else if bytes + cost(&path) > self.limits.bytes_per_subject {
                refused = Some("the subject's promises fill --max-promise-mb");
            }
            let mut watches = Vec::new();
            if refused.is_none() {
                if let Some(w) = &watcher {
                    let dirs = if listing { vec![parent(&path), path.as_str()] } else { vec![parent(&path)] };
                    for dir in dirs {
                        match w.acquire(dir) {
                            Ok(hold) => watches.extend(hold),
                            Err(why) => {
                                refused = Some(watch_refusal(why));
                                break;
                            }
                        }
                    }
                }
            }
            if refused.is_some() {
                drop(guard);
                self.release(&watches);
                self.refuse(refused.unwrap_or_default());
                return false;
            }
            let mine = state.by_client.get_mut(&client).expect("present");
            let path: Arc<str> = path.into();
            mine.held.insert(path.clone(), Promise { listing, watches });
            mine.bytes += cost(&path);
            mine.order.push_back(path.clone());
            let usage = state.by_subject.entry(subject).or_default();
            (usage.0, usage.1) = (usage.0 + 1, usage.1 + cost(&path));
            state.holders.entry(path).or_default().push(client);
            // Over the connection's own bounds: the oldest are broken to make room.
            let mut evicted = Vec::new();
            let mut released = Vec::new();
            loop {
                let mine = state.by_client.get_mut(&client).expect("present");
                if mine.held.len() <= mine.max && mine.bytes <= self.limits.bytes_per_subject {
                    break;
                }
                let Some(oldest) = mine.order.pop_front() else { break };
                if let Some(p) = state.take(client, &oldest) {
                    state.unhold(client, &oldest);
                    released.extend(p.watches);
                    evicted.push(oldest.to_string());
                }
            }
            let mine = state.by_client.get_mut(&client).expect("present");
            // Broken promises leave their paths in the order; drop them now and then.
            if mine.order.len() > 2 * mine.held.len() + 1024 {
                let held = &mine.held;
                mine.order.retain(|p| held.contains_key(p));
            }
            (mine.to, evicted, released)
        };
        self.release(&released);
        if !evicted.is_empty() {
            send(registry, to, evicted);
        }
        true
    }

    /// `by` changed `paths` (their content, attributes or existence): breaks every other
    /// client's promises on them and on their directories, telling each which paths
    /// changed (a directory's holder without its listing is told the directory only).
    /// With `names`, names were made or removed: the directories changed too (their
    /// times and link counts), which their own directories' holders learn, and so did
    /// every path beneath them (a directory made, removed or renamed, or its ACL set).
    pub fn changed(&self, registry: &Registry, by: u64, paths: &[&str], names: bool) {
        if self.clients.load(Ordering::SeqCst) == 0 {
            return;
        }
        let mut paths: Vec<String> = paths.iter().filter_map(|p| canonical(p)).collect();
        let named = if names { paths.clone() } else { Vec::new() };
        if names {
            let dirs: Vec<String> = paths.iter().map(|p| parent(p).to_string()).collect();
            for d in dirs {
                if !paths.contains(&d) {
                    paths.push(d);
                }
            }
        }
        // What a client's change left, for telling the watcher's report of it from a
        // change beside the server; only where the watcher looks (a stat per path).
        let watched: Vec<&String> = match self.watcher.get() {
            Some(Some(w)) if by != 0 => paths.iter().filter(|p| w.watching(parent(p)) || w.watching(p)).collect(),
            _ => Vec::new(),
        };
        if !watched.is_empty() {
            let mut recent = self.recent.lock();
            if recent.len() > 4096 {
                recent.retain(|_, stamps| stamps.back().is_some_and(|(at, _)| at.elapsed() < ECHO));
            }
            let now = Instant::now();
            for p in watched {
                let stamps = recent.entry(p.clone()).or_default();
                while stamps.len() >= STAMPS_PER_PATH || stamps.front().is_some_and(|(at, _)| at.elapsed() >= ECHO) {
                    stamps.pop_front();
                }
                stamps.push_back((now, self.stamp(p)));
            }
        }
        let mut tell: HashMap<u64, Vec<String>> = HashMap::new();
        let mut released = Vec::new();
        {
            let mut guard = self.state.lock();
            let state = &mut *guard;
            // Each promise to break, with the changed path its holder is told.
            let mut broken: Vec<(String, String)> = Vec::new();
            for path in &paths {
                broken.push((path.clone(), path.clone()));
                broken.push((parent(path).to_string(), path.clone()));
            }
            for path in &named {
                // Beneath `/` is every other path; beneath `/a`, `/a/...` (`0` follows `/`).
                let dir = path.trim_end_matches('/');
                let beneath = state.holders.range::<str, _>((
                    std::ops::Bound::Excluded(format!("{dir}/").as_str()),
                    std::ops::Bound::Excluded(format!("{dir}0").as_str()),
                ));
                broken.extend(beneath.map(|(key, _)| (key.to_string(), key.to_string())));
            }
            for (key, path) in broken {
                let Some((key, holders)) = state.holders.remove_entry(key.as_str()) else { continue };
                let (mine, others): (Vec<u64>, Vec<u64>) = holders.into_iter().partition(|&c| c == by);
                for client in others {
                    let Some(promise) = state.take(client, &key) else { continue };
                    let Some(p) = state.by_client.get(&client) else { continue };
                    released.extend(promise.watches);
                    // A name in the directory is told only to who could list it.
                    let told = if promise.listing || *key == *path { path.clone() } else { key.to_string() };
                    let list = tell.entry(p.to).or_default();
                    if !list.contains(&told) {
                        list.push(told);
                    }
                }
                if !mine.is_empty() {
                    state.holders.insert(key, mine);
                }
            }
        }
        self.release(&released);
        for (to, paths) in tell {
            send(registry, to, paths);
        }
    }

    /// Forgets a connection's promises (it ended, or stopped answering heartbeats), and
    /// those whose breaks went to it: they could no longer be kept. Their clients learn
    /// it from the end of that connection, and ask for callbacks again.
    pub fn drop_client(&self, client: u64) {
        if self.clients.load(Ordering::SeqCst) == 0 {
            return;
        }
        let released = {
            let mut guard = self.state.lock();
            let state = &mut *guard;
            let mut gone: Vec<u64> = state.by_client.iter().filter(|(_, p)| p.to == client).map(|(&c, _)| c).collect();
            if state.by_client.contains_key(&client) && !gone.contains(&client) {
                gone.push(client);
            }
            let mut released = Vec::new();
            for c in gone {
                released.extend(state.forget_client(c));
                state.by_client.remove(&c);
                self.clients.fetch_sub(1, Ordering::SeqCst);
            }
            released
        };
        self.release(&released);
    }

    /// True when some client's breaks go to connection `to`.
    pub fn is_target(&self, to: u64) -> bool {
        self.clients.load(Ordering::SeqCst) > 0 && self.state.lock().by_client.values().any(|p| p.to == to)
    }

    /// Promises held now, by all clients (for tests and stats).
    pub fn held(&self) -> usize {
        self.state.lock().by_client.values().map(|p| p.held.len()).sum()
    }

    /// Marks a client's request under way until the answer drops. A report of the
    /// watcher that comes meanwhile may be that request's own change, seen before the
    /// session recorded it (a store's rename, say, then its `fsync`s): the report waits
    /// for the requests under way to end (up to [`ECHO`]) before it is taken for a change
    /// beside the server. Without this, a busy machine made clients' own changes break
    /// their own promises, so a mount dropped names a program was using.
    pub fn serving(&self) -> Serving<'_> {
        let counted = self.clients.load(Ordering::SeqCst) > 0;
        if counted {
            self.in_flight.fetch_add(1, Ordering::SeqCst);
        }
        Serving { callbacks: self, counted }
    }

    /// The watcher saw a change (or, with `None`, time passed): a report that finds the
    /// path as a client's recent change left it is that change's echo; any other breaks
    /// every promise on the path once [`GRACE`] has passed and no client's request is
    /// under way (or [`ECHO`] has: the watcher may read a client's change before its
    /// session has recorded it). Answers whether reports wait.
    fn changed_beside(&self, registry: &Registry, change: Option<LocalChange>) -> bool {
        let mut real = Vec::new();
        let waiting = {
            let mut pending = self.pending.lock();
            if let Some(change) = change {
                pending.push_back((Instant::now(), change.clone(), self.stamp(&change.path)));
            }
            let recent = self.recent.lock();
            let settled = self.in_flight.load(Ordering::SeqCst) == 0;
            pending.retain(|(at, change, stamp)| {
                if recent.get(&change.path).is_some_and(|stamps| stamps.iter().any(|(_, s)| s == stamp)) {
                    return false;
                }
                if at.elapsed() >= GRACE && (settled || at.elapsed() >= ECHO) {
                    real.push(change.clone());
                    return false;
                }
                true
            });
            !pending.is_empty()
        };
        for change in real {
            self.changed(registry, 0, &[&change.path], change.names);
        }
        waiting
    }

    /// What `path` is now (see [`Stamp`]): a report shortly after a client's change is
    /// that change's echo only if the path is still as the change left it. (File times
    /// move at the kernel's tick: a change of the same size within a few milliseconds
    /// of a client's may pass for its echo.)
    fn stamp(&self, path: &str) -> Stamp {
        use std::os::unix::fs::MetadataExt;
        let roots = self.roots.get().map(Vec::as_slice).unwrap_or_default();
        let rel = path.trim_start_matches('/');
        let of = |m: std::fs::Metadata| {
            (m.dev(), m.ino(), m.size() as i64, m.mtime_nsec() + m.mtime() * 1_000_000_000, m.ctime(), m.ctime_nsec())
        };
        roots.iter().map(|r| std::fs::symlink_metadata(r.join(rel)).ok().map(of)).collect()
    }
}

/// A client's request under way (see [`Callbacks::serving`]).
pub struct Serving<'a> {
    callbacks: &'a Callbacks,
    counted: bool,
}

impl Drop for Serving<'_> {
    fn drop(&mut self) {
        if self.counted {
            self.callbacks.in_flight.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

fn watch_refusal(why: WatchRefused) -> &'static str {
    match why {
        WatchRefused::Limit => "the server holds --max-watches inotify watches",
        WatchRefused::Kernel => "fs.inotify.max_user_watches reached (ENOSPC)",
    }
}

fn send(registry: &Registry, client: u64, paths: Vec<String>) {
    let msg =
        Push { topic: locus_proto::frame::PUSH_BREAK, meta: locus_proto::codec::encode(&paths), data: Bytes::new() };
    registry.push(client, msg);
}

#[cfg(test)]
mod tests;
