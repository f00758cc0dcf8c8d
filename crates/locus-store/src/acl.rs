//! Per-directory access-control lists with Chirp-like rights.
//!
//! A directory's ACL lives in a file named [`ACL_FILE`] inside it, so it travels with the
//! directory when it is renamed. A directory without one inherits its nearest ancestor's.
//! Lookups go through the directory's open descriptor, so the ACL consulted is that of
//! the directory the kernel actually resolved, never of a name that a symlink imitates.

use crate::error::{OsContext, Result, StoreError};
use crate::ObjectId;
use locus_proto::types::{AclEntry, Rights};
use parking_lot::Mutex;
use rustix::fs::{fstat, openat, Mode, OFlags};
use std::collections::HashMap;
use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

/// Name of the ACL file inside a directory; hidden from and refused to clients.
pub const ACL_FILE: &str = ".__locus_acl";

/// Names starting with this are Locus' own (ACLs, uploads in progress).
pub const RESERVED_PREFIX: &str = ".__locus";

/// Ancestors searched for an inherited ACL before giving up with no rights.
const MAX_DEPTH: usize = 4096;

/// One directory's list of subjects and their rights.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Acl {
    pub entries: Vec<AclEntry>,
}

impl Acl {
    /// The rights a subject holds: the union of every entry that admits it (its own,
    /// `*` for a subject with a Locus token, Chirp patterns for a host subject; see
    /// [`locus_proto::types::acl_subject_matches`]).
    pub fn rights_of(&self, subject: &str) -> Rights {
        self.entries.iter().filter(|e| e.admits(subject)).fold(Rights(0), |r, e| r.union(e.rights))
    }

    /// Sets one subject's rights; no rights removes its entry.
    pub fn set(&mut self, subject: &str, rights: Rights) {
        self.entries.retain(|e| e.subject != subject);
        if rights.0 != 0 {
            self.entries.push(AclEntry { subject: subject.to_string(), rights });
        }
    }

    /// Parses the file format: one `SUBJECT RIGHTS` pair a line; `#` starts a comment.
    pub fn parse(text: &str) -> Result<Acl> {
        let mut acl = Acl::default();
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
            let mut parts = line.split_whitespace();
            let (Some(subject), Some(rights), None) = (parts.next(), parts.next(), parts.next()) else {
                return Err(StoreError::Invalid(format!("malformed ACL line: {line}")));
            };
            let rights = Rights::parse(rights).map_err(StoreError::Invalid)?;
            acl.set(subject, rights);
        }
        Ok(acl)
    }

    /// The file format.
    pub fn render(&self) -> String {
        self.entries.iter().map(|e| format!("{} {}\n", e.subject, e.rights)).collect()
    }

    /// Checks that a subject name can be written to and read back from the file.
    pub fn valid_subject(subject: &str) -> bool {
        !subject.is_empty() && subject.len() <= 256 && !subject.chars().any(|c| c.is_whitespace() || c.is_control())
    }
}

/// ACLs by directory identity (device, inode); emptied whenever a rename, removal or
/// ACL change could alter what a directory inherits.
#[derive(Default)]
pub struct AclCache {
    map: Mutex<HashMap<ObjectId, Arc<Acl>>>,
}

impl AclCache {
    /// Forgets everything (cheap; the next lookups re-read the files).
    pub fn invalidate(&self) {
        self.map.lock().clear();
    }

    /// The ACL in force for the directory `dir`, whose root is identified by `root_key`.
    /// `known` is `dir`'s identity when the caller already has it (the root's), which
    /// spares a `fstat`.
    pub fn effective(&self, dir: BorrowedFd<'_>, known: Option<ObjectId>, root_key: ObjectId) -> Result<Arc<Acl>> {
        let key = match known {
            Some(key) => key,
            None => {
                let st = fstat(dir).ctx("stat", "directory")?;
                crate::object_id(&st)
            }
        };
        if let Some(acl) = self.map.lock().get(&key) {
            return Ok(acl.clone());
        }
        let acl = Arc::new(self.lookup(dir, key, root_key)?);
        self.map.lock().insert(key, acl.clone());
        Ok(acl)
    }

    fn lookup(&self, dir: BorrowedFd<'_>, key: ObjectId, root_key: ObjectId) -> Result<Acl> {
        let mut current: Option<OwnedFd> = None;
        let mut key = key;
        for _ in 0..MAX_DEPTH {
            let fd = current.as_ref().map(|f| f.as_fd()).unwrap_or(dir);
            if let Some(acl) = read_acl(fd)? {
                return Ok(acl);
            }
            if key == root_key {
                return Ok(Acl::default());
            }
            let parent = openat(fd, "..", OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
                .ctx("open", "..")?;
            let st = fstat(&parent).ctx("stat", "..")?;
            key = crate::object_id(&st);
            current = Some(parent);
        }
        Ok(Acl::default())
    }
}

/// Reads the ACL file of a directory, if it has one.
pub(crate) fn read_acl(dir: BorrowedFd<'_>) -> Result<Option<Acl>> {
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    match openat(dir, ACL_FILE, flags, Mode::empty()) {
        Ok(fd) => {
            let mut text = String::new();
            std::fs::File::from(fd)
                .take(1 << 20)
                .read_to_string(&mut text)
                .map_err(|e| StoreError::Invalid(format!("unreadable ACL: {e}")))?;
            Acl::parse(&text).map(Some)
        }
        Err(rustix::io::Errno::NOENT) => Ok(None),
        Err(e) => Err(e).ctx("open", ACL_FILE),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The property the `text_parsers` fuzz target checks, on pseudo-random text built
    /// from the characters that matter (separators, comment marks, right letters).
    #[test]
    fn whatever_parses_survives_a_round_trip() {
        let alphabet: Vec<char> = "ab*#-rwldaxz \t\n\r\u{85}\u{a0}\u{1}é".chars().collect();
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut parsed = 0;
        for _ in 0..20_000 {
            let mut text = String::new();
            for _ in 0..(state % 40) {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                text.push(alphabet[(state % alphabet.len() as u64) as usize]);
            }
            if let Ok(acl) = Acl::parse(&text) {
                parsed += 1;
                assert_eq!(Acl::parse(&acl.render()).as_ref().ok(), Some(&acl), "{text:?}");
            }
        }
        assert!(parsed > 100, "the generator should make some valid ACLs ({parsed})");
    }

    #[test]
    fn parse_render_and_rights() {
        let acl = Acl::parse("# comment\nalice rwl\n* l\nbob rwldax\n").unwrap();
        assert_eq!(acl.rights_of("alice").to_string(), "rwl");
        assert_eq!(acl.rights_of("carol").to_string(), "l");
        assert_eq!(acl.rights_of("bob"), Rights::ALL);
        assert_eq!(Acl::parse(&acl.render()).unwrap(), acl);
        assert!(Acl::parse("alice").is_err());
        assert!(Acl::parse("alice rwz").is_err());
        let mut acl = acl;
        acl.set("alice", Rights(0));
        assert_eq!(acl.rights_of("alice").to_string(), "l");
    }

    #[test]
    fn chirp_host_subjects_hold_only_what_names_or_patterns_grant() {
        let acl = Acl::parse("* rl\naddress:127.0.0.1 w\naddress:10.0.* d\nhostname:*.example.org x\n").unwrap();
        assert_eq!(acl.rights_of("alice").to_string(), "rl");
        assert_eq!(acl.rights_of("address:127.0.0.1").to_string(), "w", "`*` adds nothing to a host subject");
        assert_eq!(acl.rights_of("address:10.0.9.9").to_string(), "d");
        assert_eq!(acl.rights_of("address:192.0.2.2"), Rights(0));
        assert_eq!(acl.rights_of("hostname:n1.example.org").to_string(), "x");
        assert_eq!(acl.rights_of("hostname:n1.example.net"), Rights(0));
        assert_eq!(acl.rights_of("unix:alice"), Rights(0));
    }
}
