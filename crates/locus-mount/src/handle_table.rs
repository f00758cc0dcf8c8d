//! Every handle the mount gave the kernel, in one table: what it stands for (a server
//! handle, an open deferred until a read needs it, or a local copy), its inode, and the
//! content known for it; and, by inode, the server handles open on it.

use std::collections::HashMap;

/// Handles the mount numbers itself (deferred opens, local copies) start here; the
/// drivers' own handles are far below.
pub(crate) const FIRST_OWN: u64 = 1 << 63;

/// What a handle given to the kernel stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Behind {
    /// The server's handle itself (the kernel's number is the server's).
    Server,
    /// An open not yet made at the server, and the server handle once a read needed one.
    Deferred(Option<u64>),
    /// The file's local copy (write-back), with the Locus open flags.
    Copy(u32),
}

/// One handle given to the kernel.
#[derive(Debug)]
pub(crate) struct Handle {
    pub(crate) ino: u64,
    pub(crate) behind: Behind,
    /// The whole content of the file as this handle sees it, where the mount knows it:
    /// a file opened for writing while empty and written only through this handle
    /// since (up to [`crate::KNOWN_MAX`]), or a small file fetched whole at its open or
    /// first read. Reads on the handle answer from it.
    pub(crate) known: Option<Vec<u8>>,
}

/// The table of the kernel's handles.
pub(crate) struct HandleTable {
    by_fh: HashMap<u64, Handle>,
    /// Server handles open on each inode: how a file removed while open is still
    /// described (the kernel asks for its attributes without a handle).
    at_server: HashMap<u64, Vec<u64>>,
    next: u64,
}

impl Default for HandleTable {
    fn default() -> Self {
        HandleTable { by_fh: HashMap::new(), at_server: HashMap::new(), next: FIRST_OWN }
    }
}

impl HandleTable {
    /// Gives the kernel a server handle on `ino` (with the content known for it).
    pub(crate) fn server(&mut self, ino: u64, handle: u64, known: Option<Vec<u8>>) {
        self.opened_at_server(ino, handle);
        self.by_fh.insert(handle, Handle { ino, behind: Behind::Server, known });
    }

    /// A new handle of the mount's own numbering on `ino`.
    pub(crate) fn own(&mut self, ino: u64, behind: Behind, known: Option<Vec<u8>>) -> u64 {
        let fh = self.next;
        self.next += 1;
        self.by_fh.insert(fh, Handle { ino, behind, known });
        fh
    }

    /// Records a server handle opened on `ino` behind one of the kernel's.
    pub(crate) fn opened_at_server(&mut self, ino: u64, handle: u64) {
        self.at_server.entry(ino).or_default().push(handle);
    }

    /// Points handle `fh` at something else (a deferred open made, a copy spilled).
    pub(crate) fn rebind(&mut self, fh: u64, behind: Behind) {
        if let Some(h) = self.by_fh.get_mut(&fh) {
            h.behind = behind;
        }
    }

    /// The handle `fh`, if the kernel holds it.
    pub(crate) fn get(&self, fh: u64) -> Option<&Handle> {
        self.by_fh.get(&fh)
    }

    /// What `fh` stands for; a handle the table does not know is the server's.
    pub(crate) fn behind(&self, fh: u64) -> Behind {
        self.by_fh.get(&fh).map_or(Behind::Server, |h| h.behind)
    }

    /// The content known for `fh`.
    pub(crate) fn known(&self, fh: u64) -> Option<&Vec<u8>> {
        self.by_fh.get(&fh)?.known.as_ref()
    }

    /// The content known for `fh`, to change.
    pub(crate) fn known_mut(&mut self, fh: u64) -> Option<&mut Vec<u8>> {
        self.by_fh.get_mut(&fh)?.known.as_mut()
    }

    /// Sets the content known for `fh` (`None`: no longer known).
    pub(crate) fn set_known(&mut self, fh: u64, known: Option<Vec<u8>>) {
        if let Some(h) = self.by_fh.get_mut(&fh) {
            h.known = known;
        }
    }

    /// Forgets the content known for the server handles given to the kernel on `ino`,
    /// but `except`.
    pub(crate) fn forget_known(&mut self, ino: u64, except: Option<u64>) {
        for h in self.at_server.get(&ino).into_iter().flatten() {
            if Some(*h) != except {
                if let Some(handle) = self.by_fh.get_mut(h) {
                    handle.known = None;
                }
            }
        }
    }

    /// Forgets the content fetched for deferred opens not made at the server, of the
    /// inodes `of` picks.
    pub(crate) fn drop_fetched(&mut self, of: impl Fn(u64) -> bool) {
        for h in self.by_fh.values_mut() {
            if h.behind == Behind::Deferred(None) && of(h.ino) {
                h.known = None;
            }
        }
    }

    /// The handles on `ino` that stand for what `pick` picks.
    pub(crate) fn on(&self, ino: u64, pick: impl Fn(Behind) -> bool) -> Vec<(u64, Behind)> {
        self.by_fh.iter().filter(|(_, h)| h.ino == ino && pick(h.behind)).map(|(&fh, h)| (fh, h.behind)).collect()
    }

    /// The server handles open on `ino`.
    pub(crate) fn at_server(&self, ino: u64) -> &[u64] {
        self.at_server.get(&ino).map_or(&[], Vec::as_slice)
    }

    /// Takes `fh` out of the table as the kernel releases it; answers what it stood for
    /// (`None` for a server handle the table did not know).
    pub(crate) fn release(&mut self, fh: u64) -> Option<Handle> {
        self.by_fh.remove(&fh)
    }

    /// Records that server handle `handle` on `ino` is closed.
    pub(crate) fn closed_at_server(&mut self, ino: u64, handle: u64) {
        if let Some(handles) = self.at_server.get_mut(&ino) {
            handles.retain(|&h| h != handle);
            if handles.is_empty() {
                self.at_server.remove(&ino);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_table_keeps_what_each_handle_stands_for() {
        let mut t = HandleTable::default();
        t.server(7, 42, Some(b"ab".to_vec()));
        let deferred = t.own(7, Behind::Deferred(None), Some(b"small".to_vec()));
        let copy = t.own(8, Behind::Copy(2), None);
        assert!(deferred >= FIRST_OWN && copy == deferred + 1);
        assert_eq!(t.behind(42), Behind::Server);
        assert_eq!(t.behind(999), Behind::Server, "unknown handles are the server's");
        assert_eq!(t.at_server(7), &[42]);
        t.forget_known(7, None);
        assert_eq!(t.known(42), None, "a change by path forgets the server handles' content");
        assert_eq!(t.known(deferred).map(Vec::as_slice), Some(&b"small"[..]), "but not what a deferred open fetched");
        t.drop_fetched(|ino| ino == 7);
        assert_eq!(t.known(deferred), None);
        t.rebind(deferred, Behind::Deferred(Some(43)));
        t.opened_at_server(7, 43);
        assert_eq!(t.on(7, |b| matches!(b, Behind::Deferred(_))), vec![(deferred, Behind::Deferred(Some(43)))]);
        assert_eq!(t.release(deferred).map(|h| h.behind), Some(Behind::Deferred(Some(43))));
        t.closed_at_server(7, 43);
        t.closed_at_server(7, 42);
        assert!(t.at_server(7).is_empty());
    }
}
