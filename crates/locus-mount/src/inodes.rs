//! Local inode numbers for remote paths.
//!
//! The kernel names files by inode number; the protocol by path. Every path the kernel
//! looks up gets a number (the root, the mounted directory, is 1) that lives until the
//! kernel forgets it as often as it looked it up. A rename moves the path of the entry
//! and of everything beneath it, so open directories and files keep working.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

pub use locus_drivers::join;

struct Node {
    path: String,
    lookups: u64,
}

/// What ends the path kept for a removed file (no real path contains a NUL).
const REMOVED: &str = "\0removed";

/// The inode of each path the kernel knows, shared with the thread that tells the kernel
/// of callback breaks (which come by path).
pub type PathIndex = Arc<Mutex<HashMap<String, u64>>>;

/// The inode table of one mount.
pub struct Inodes {
    by_ino: HashMap<u64, Node>,
    by_path: PathIndex,
    next: u64,
}

impl Inodes {
    /// A table whose root (inode 1) is `base`.
    pub fn new(base: &str) -> Inodes {
        // The server's form of a path (`/a/b`), which callback breaks name.
        let base = match base.trim_end_matches('/') {
            "" => "/".to_string(),
            b => b.to_string(),
        };
        let mut t = Inodes { by_ino: HashMap::new(), by_path: PathIndex::default(), next: 2 };
        t.by_path.lock().insert(base.clone(), 1);
        t.by_ino.insert(1, Node { path: base, lookups: 1 });
        t
    }

    /// The path of an inode.
    pub fn path(&self, ino: u64) -> Option<&str> {
        self.by_ino.get(&ino).map(|n| n.path.as_str())
    }

    /// The inode of a path, if it has one, without counting a lookup.
    pub fn peek(&self, path: &str) -> Option<u64> {
        self.by_path.lock().get(path).copied()
    }

    /// The path-to-inode map, for the thread that tells the kernel of breaks.
    pub fn index(&self) -> PathIndex {
        self.by_path.clone()
    }

    /// The inode of a path, numbered now if new; counts one kernel lookup.
    pub fn lookup(&mut self, path: String) -> u64 {
        let mut by_path = self.by_path.lock();
        if let Some(&ino) = by_path.get(&path) {
            self.by_ino.get_mut(&ino).expect("both maps agree").lookups += 1;
            return ino;
        }
        let ino = self.next;
        self.next += 1;
        by_path.insert(path.clone(), ino);
        self.by_ino.insert(ino, Node { path, lookups: 1 });
        ino
    }

    /// The kernel dropped `n` lookups of `ino`.
    pub fn forget(&mut self, ino: u64, n: u64) {
        if ino == 1 {
            return;
        }
        if let Some(node) = self.by_ino.get_mut(&ino) {
            node.lookups = node.lookups.saturating_sub(n);
            if node.lookups == 0 {
                let node = self.by_ino.remove(&ino).expect("present");
                let mut by_path = self.by_path.lock();
                if by_path.get(&node.path) == Some(&ino) {
                    by_path.remove(&node.path);
                }
            }
        }
    }

    /// The inode of the parent directory (the root is its own parent).
    pub fn parent_of(&self, ino: u64) -> u64 {
        let Some(path) = self.path(ino) else { return 1 };
        match path.rsplit_once('/') {
            Some((dir, _)) => self.peek(if dir.is_empty() { "/" } else { dir }).unwrap_or(1),
            None => 1,
        }
    }

    /// True when the inode's file was removed (it lives on while open, without a name).
    pub fn removed(&self, ino: u64) -> bool {
        self.path(ino).is_some_and(|p| p.ends_with(REMOVED))
    }

    /// `path` was removed: its inode lives on (open files) but no longer has a name,
    /// and a new file made under that name gets a new inode.
    pub fn unlinked(&mut self, path: &str) {
        let removed = self.by_path.lock().remove(path);
        if let Some(ino) = removed {
            if let Some(n) = self.by_ino.get_mut(&ino) {
                n.path = format!("{path}{REMOVED}");
            }
        }
    }

    /// `from` was renamed to `to`: it and everything beneath it move.
    pub fn rename(&mut self, from: &str, to: &str) {
        self.unlinked(to);
        let prefix = format!("{from}/");
        let mut by_path = self.by_path.lock();
        let moved: Vec<(String, u64)> = by_path
            .iter()
            .filter(|(p, _)| p.as_str() == from || p.starts_with(&prefix))
            .map(|(p, &i)| (p.clone(), i))
            .collect();
        for (old, ino) in moved {
            let new = format!("{to}{}", &old[from.len()..]);
            by_path.remove(&old);
            by_path.insert(new.clone(), ino);
            if let Some(n) = self.by_ino.get_mut(&ino) {
                n.path = new;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renames_move_everything_beneath() {
        let mut t = Inodes::new("/base");
        let d = t.lookup("/base/d".into());
        let f = t.lookup("/base/d/f".into());
        let other = t.lookup("/base/dx".into());
        t.rename("/base/d", "/base/e");
        assert_eq!(t.path(d), Some("/base/e"));
        assert_eq!(t.path(f), Some("/base/e/f"));
        assert_eq!(t.path(other), Some("/base/dx"), "a sibling sharing a prefix stays");
        assert_eq!(t.parent_of(f), d);
        assert_eq!(t.lookup("/base/e/f".into()), f);
        t.forget(f, 2);
        assert_eq!(t.path(f), None);
        assert_eq!(t.parent_of(d), 1);
    }
}
