//! Directory listings kept by the mount, so that the kernel's lookups of names in a
//! recently listed directory, present or absent, cost no round trip.
//!
//! A listing comes from the server (a `readdir`, or one made to answer a lookup in a
//! directory listed before), or is empty for a directory the mount just made. The
//! mount's own changes keep it up to date; changes by others show once it is older than
//! the attribute timeout, the same bound as the kernel's own cache of names.

use locus_drivers::{Attr, DirEntry};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Directories with more entries than this are not listed again to answer a lookup
/// (one lookup would then cost a long transfer).
const RELIST_MAX: usize = 4096;

/// What a listing says of a name.
#[derive(Debug, PartialEq)]
pub enum Known {
    /// The directory has no such entry.
    Absent,
    /// The entry exists with these attributes.
    Present(Attr),
    /// Nothing fresh is known: ask the server.
    Unknown,
}

struct Listing {
    /// Each name, with its attributes unless they changed since (a write, a chmod).
    names: HashMap<String, Option<Attr>>,
    /// The entries in the server's order, while no name was made or removed since: what
    /// the kernel's reads of the directory are answered from.
    order: Option<Arc<Vec<DirEntry>>>,
    at: Instant,
}

/// Listings by directory inode. A listing is fresh for the `ttl` its reader passes: the
/// mount's, long while callbacks hold.
#[derive(Default)]
pub struct Listings {
    by_dir: HashMap<u64, Listing>,
    /// Counts the changes told to the listings (names made, removed or changed, listings
    /// forgotten): a listing the server sent before the count moved may be out of date.
    changes: u64,
}

impl Listings {
    /// Forgets every listing (the callbacks that covered them are gone).
    pub fn clear(&mut self) {
        self.changes += 1;
        self.by_dir.clear();
    }

    /// How many changes the listings were told of so far (see [`Listings::changes`]'s
    /// field): equal counts mean nothing changed in between.
    pub fn changes(&self) -> u64 {
        self.changes
    }

    /// Keeps the server's listing of `dir`.
    pub fn store(&mut self, dir: u64, entries: &Arc<Vec<DirEntry>>) {
        let names = entries.iter().map(|e| (e.name.clone(), Some(e.attr.clone()))).collect();
        self.by_dir.insert(dir, Listing { names, order: Some(entries.clone()), at: Instant::now() });
    }

    /// `dir` was just made: it is empty.
    pub fn made(&mut self, dir: u64) {
        self.changes += 1;
        self.store(dir, &Arc::default());
    }

    /// The fresh listing of `dir` in the server's order, unless names changed since.
    pub fn entries(&self, dir: u64, ttl: Duration) -> Option<Arc<Vec<DirEntry>>> {
        self.by_dir.get(&dir).filter(|l| l.at.elapsed() < ttl).and_then(|l| l.order.clone())
    }

    /// What the fresh listing of `dir`, if any, says of `name`.
    pub fn find(&self, dir: u64, name: &str, ttl: Duration) -> Known {
        match self.by_dir.get(&dir) {
            Some(l) if l.at.elapsed() < ttl => match l.names.get(name) {
                None => Known::Absent,
                Some(Some(attr)) => Known::Present(attr.clone()),
                Some(None) => Known::Unknown,
            },
            _ => Known::Unknown,
        }
    }

    /// True when `dir` was listed before, the listing has expired, and it is small enough
    /// to list again instead of asking for one name.
    pub fn worth_relisting(&self, dir: u64, ttl: Duration) -> bool {
        self.by_dir.get(&dir).is_some_and(|l| l.at.elapsed() >= ttl && l.names.len() <= RELIST_MAX)
    }

    /// The server just answered `attr` for `name` in `dir`: a listing that holds the
    /// name describes it so again.
    pub fn refresh(&mut self, dir: u64, name: &str, attr: Attr) {
        if let Some(entry) = self.by_dir.get_mut(&dir).and_then(|l| l.names.get_mut(name)) {
            *entry = Some(attr);
        }
    }

    /// `name` now exists in `dir` (with `attr` if known).
    pub fn added(&mut self, dir: u64, name: &str, attr: Option<Attr>) {
        self.changes += 1;
        if let Some(l) = self.by_dir.get_mut(&dir) {
            l.names.insert(name.to_string(), attr);
            l.order = None;
        }
    }

    /// `name` no longer exists in `dir`; answers its attributes if they were known.
    pub fn removed(&mut self, dir: u64, name: &str) -> Option<Attr> {
        self.changes += 1;
        let l = self.by_dir.get_mut(&dir)?;
        l.order = None;
        l.names.remove(name).flatten()
    }

    /// The attributes of `name` in `dir` changed.
    pub fn changed(&mut self, dir: u64, name: &str) {
        self.changes += 1;
        if let Some(attr) = self.by_dir.get_mut(&dir).and_then(|l| l.names.get_mut(name)) {
            *attr = None;
        }
    }

    /// `dir` is gone, or the kernel forgot it.
    pub fn forget(&mut self, dir: u64) {
        self.changes += 1;
        self.by_dir.remove(&dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listings_answer_while_fresh_and_follow_changes() {
        let (mut l, ttl) = (Listings::default(), Duration::from_millis(200));
        let file = Attr { size: 3, ..Default::default() };
        assert_eq!(l.find(1, "a", ttl), Known::Unknown, "never listed");
        l.store(1, &Arc::new(vec![DirEntry { name: "a".into(), attr: file.clone() }]));
        assert_eq!(l.find(1, "a", ttl), Known::Present(file.clone()));
        assert_eq!(l.find(1, "b", ttl), Known::Absent);
        assert_eq!(l.entries(1, ttl).map(|e| e.len()), Some(1), "in order, for the kernel's reads");
        assert_eq!(l.changes(), 0, "the server's listing is no change");
        l.added(1, "b", None);
        assert_eq!(l.changes(), 1);
        assert!(l.entries(1, ttl).is_none(), "names changed: listed again for the kernel");
        assert_eq!(l.find(1, "b", ttl), Known::Unknown, "exists, attributes unknown");
        l.changed(1, "a");
        assert_eq!(l.find(1, "a", ttl), Known::Unknown);
        assert_eq!(l.removed(1, "b"), None);
        assert_eq!(l.find(1, "b", ttl), Known::Absent);
        assert!(!l.worth_relisting(1, ttl));
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(l.find(1, "b", ttl), Known::Unknown, "expired");
        assert!(l.worth_relisting(1, ttl));
        l.forget(1);
        assert!(!l.worth_relisting(1, ttl));
        l.added(7, "x", None);
        assert_eq!(l.changes(), 5, "a change in a directory not listed counts too");
    }
}
