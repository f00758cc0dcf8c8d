//! Callback promises, as AFS keeps them: a client that turned callbacks on (the
//! `callbacks` operation) is promised, for every path it asks about, a break message when
//! another client changes that path or a name in it. While the promise holds, the client
//! may trust what it cached indefinitely; `locus mount` uses this to let the kernel keep
//! attributes, names, listings and pages.
//!
//! A change to a path breaks the promises on the path and on its directory (whose
//! listing named it, with its attributes), except the changing client's own: it knows
//! what it did. A promise is broken once: the holder asks again to get a new one.
//! Promises are bounded per client; the oldest is broken to make room. A client's
//! promises go with its connection. Changes made to the export beside the server break
//! promises too, once a client has turned callbacks on ([`crate::export_watch`]).

use crate::export_watch::{LocalChange, Watcher};
use crate::{Push, Registry, Shared};
use bytes::Bytes;
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// What a path is, as far as telling one change from another goes: on each device,
/// its inode, size, and modification and change times (absent: none).
type Stamp = Vec<Option<(u64, u64, i64, i64, i64, i64)>>;

/// The most promises a client may hold, whatever it asks for.
pub const MAX_PROMISES: u32 = 1 << 20;

/// How long the paths clients changed, and what each change left, are remembered: a
/// report of the watcher that finds a path as a client's change left it is that
/// change's echo (which already broke what it had to).
const ECHO: Duration = Duration::from_millis(500);
/// How long a report waits for the client's change it may echo to be recorded (the
/// watcher may see a change before the session that made it is done with it).
const GRACE: Duration = Duration::from_millis(5);
/// Stamps remembered per path.
const STAMPS_PER_PATH: usize = 8;

/// Every client's promises.
#[derive(Default)]
pub struct Callbacks {
    /// Clients with callbacks on: while none, changes cost nothing here.
    clients: AtomicUsize,
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
}

/// One client's promises, oldest first.
struct Promises {
    max: usize,
    /// The connection their breaks go to.
    to: u64,
    held: HashSet<Arc<str>>,
    /// Paths in the order promised; may still name promises broken since.
    order: VecDeque<Arc<str>>,
}

/// The canonical form of a path for promises: `/a/b`, whatever slashes it came with;
/// none for a path with `..` (the store refuses those, so nothing is promised on them).
pub fn canonical(path: &str) -> Option<String> {
    let mut out = String::with_capacity(path.len() + 1);
    for part in path.split('/').filter(|p| !p.is_empty() && *p != ".") {
        if part == ".." {
            return None;
        }
        out.push('/');
        out.push_str(part);
    }
    if out.is_empty() {
        out.push('/');
    }
    Some(out)
}

/// The directory of a canonical path (`/` is its own).
fn parent(path: &str) -> &str {
    match path.rfind('/') {
        Some(0) | None => "/",
        Some(i) => &path[..i],
    }
}

impl Callbacks {
    /// Turns callbacks on for `client`, with at most `max` promises whose breaks go to
    /// connection `to`; answers the bound.
    pub fn enable(&self, client: u64, max: u32, to: u64) -> u32 {
        let max = max.clamp(1, MAX_PROMISES);
        let mut state = self.state.lock();
        match state.by_client.get_mut(&client) {
            Some(p) => (p.max, p.to) = (max as usize, to),
            None => {
                let promises = Promises { max: max as usize, to, held: HashSet::new(), order: VecDeque::new() };
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
            let watcher = match Watcher::new(roots) {
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

    /// The watcher saw a change (or, with `None`, time passed): a report that finds the
    /// path as a client's recent change left it is that change's echo; any other breaks
    /// every promise on the path once [`GRACE`] has passed (the watcher may read a
    /// client's change before its session has recorded it). Answers whether reports wait.
    fn changed_beside(&self, registry: &Registry, change: Option<LocalChange>) -> bool {
        let mut real = Vec::new();
        let waiting = {
            let mut pending = self.pending.lock();
            if let Some(change) = change {
                pending.push_back((Instant::now(), change.clone(), self.stamp(&change.path)));
            }
            let recent = self.recent.lock();
            pending.retain(|(at, change, stamp)| {
                if recent.get(&change.path).is_some_and(|stamps| stamps.iter().any(|(_, s)| s == stamp)) {
                    return false;
                }
                if at.elapsed() >= GRACE {
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

    /// Promises `client` a break when `path` changes, if it has callbacks on (with
    /// `listing`, `path` is a directory being listed). Called before the path is read,
    /// so that a change right after the read breaks it.
    pub fn promise(&self, registry: &Registry, client: u64, path: &str, listing: bool) {
        if self.clients.load(Ordering::SeqCst) == 0 {
            return;
        }
        let Some(path) = canonical(path) else { return };
        if let Some(Some(watcher)) = self.watcher.get() {
            watcher.watch(parent(&path));
            if listing {
                watcher.watch(&path);
            }
        }
        let (to, evicted) = {
            let mut guard = self.state.lock();
            let state = &mut *guard;
            let Some(mine) = state.by_client.get_mut(&client) else { return };
            if mine.held.contains(path.as_str()) {
                return;
            }
            let path: Arc<str> = path.into();
            mine.held.insert(path.clone());
            mine.order.push_back(path.clone());
            state.holders.entry(path).or_default().push(client);
            let mut evicted = Vec::new();
            while mine.held.len() > mine.max {
                let Some(oldest) = mine.order.pop_front() else { break };
                if mine.held.remove(&oldest) {
                    if let Some(h) = state.holders.get_mut(&oldest) {
                        h.retain(|&c| c != client);
                        if h.is_empty() {
                            state.holders.remove(&oldest);
                        }
                    }
                    evicted.push(oldest.to_string());
                }
            }
            // Broken promises leave their paths in the order; drop them now and then.
            if mine.order.len() > 2 * mine.held.len() + 1024 {
                let held = &mine.held;
                mine.order.retain(|p| held.contains(p));
            }
            (mine.to, evicted)
        };
        if !evicted.is_empty() {
            send(registry, to, evicted);
        }
    }

    /// `by` changed `paths` (their content, attributes or existence): breaks every other
    /// client's promises on them and on their directories, telling each which paths
    /// changed. With `names`, names were made or removed: the directories changed too
    /// (their times and link counts), which their own directories' holders learn, and
    /// so did every path beneath them (a directory made, removed or renamed).
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
                let beneath = state.holders.range::<str, _>((
                    std::ops::Bound::Excluded(format!("{path}/").as_str()),
                    std::ops::Bound::Excluded(format!("{path}0").as_str()),
                ));
                broken.extend(beneath.map(|(key, _)| (key.to_string(), key.to_string())));
            }
            for (key, path) in broken {
                let Some((key, holders)) = state.holders.remove_entry(key.as_str()) else { continue };
                let (mine, others): (Vec<u64>, Vec<u64>) = holders.into_iter().partition(|&c| c == by);
                for client in others {
                    let Some(p) = state.by_client.get_mut(&client) else { continue };
                    p.held.remove(&key);
                    let told = tell.entry(p.to).or_default();
                    if !told.contains(&path) {
                        told.push(path.clone());
                    }
                }
                if !mine.is_empty() {
                    state.holders.insert(key, mine);
                }
            }
        }
        for (to, paths) in tell {
            send(registry, to, paths);
        }
    }

    /// Forgets a client's promises (its connection ended).
    pub fn drop_client(&self, client: u64) {
        let mut guard = self.state.lock();
        let state = &mut *guard;
        let Some(mine) = state.by_client.remove(&client) else { return };
        self.clients.fetch_sub(1, Ordering::SeqCst);
        for path in mine.held {
            if let Some(h) = state.holders.get_mut(&path) {
                h.retain(|&c| c != client);
                if h.is_empty() {
                    state.holders.remove(&path);
                }
            }
        }
    }

    /// Promises held now, by all clients (for tests and stats).
    pub fn held(&self) -> usize {
        self.state.lock().by_client.values().map(|p| p.held.len()).sum()
    }
}

fn send(registry: &Registry, client: u64, paths: Vec<String>) {
    let msg =
        Push { topic: locus_proto::frame::PUSH_BREAK, meta: locus_proto::codec::encode(&paths), data: Bytes::new() };
    registry.push(client, msg);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_paths() {
        assert_eq!(canonical("a//b/").as_deref(), Some("/a/b"));
        assert_eq!(canonical("/").as_deref(), Some("/"));
        assert_eq!(canonical("").as_deref(), Some("/"));
        assert_eq!(canonical("/./x").as_deref(), Some("/x"));
        assert_eq!(canonical("/a/../../etc"), None);
        assert_eq!(parent("/a/b"), "/a");
        assert_eq!(parent("/a"), "/");
    }

    #[test]
    fn a_change_breaks_other_holders_once_and_keeps_the_changers() {
        let (registry, cb) = (Registry::default(), Callbacks::default());
        cb.enable(1, 10, 1);
        cb.enable(2, 10, 2);
        cb.promise(&registry, 1, "/d/f", false);
        cb.promise(&registry, 2, "/d/f", false);
        cb.promise(&registry, 2, "/d", true);
        assert_eq!(cb.held(), 3);
        cb.changed(&registry, 1, &["/d/f"], false);
        // Client 2 lost both (the file and its directory); client 1 keeps its own.
        assert_eq!(cb.held(), 1);
        cb.changed(&registry, 2, &["/d/f"], false);
        assert_eq!(cb.held(), 0);
    }

    #[test]
    fn promises_are_bounded_and_go_with_the_client() {
        let (registry, cb) = (Registry::default(), Callbacks::default());
        assert_eq!(cb.enable(7, 3, 7), 3);
        for i in 0..10 {
            cb.promise(&registry, 7, &format!("/f{i}"), false);
        }
        assert_eq!(cb.held(), 3);
        // Without callbacks on, nothing is promised.
        cb.promise(&registry, 8, "/x", false);
        assert_eq!(cb.held(), 3);
        cb.drop_client(7);
        assert_eq!(cb.held(), 0);
        assert!(cb.state.lock().holders.is_empty());
    }
}
