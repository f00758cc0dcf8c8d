//! What S3 keeps of an object besides its bytes: its ETag (the MD5 of its bytes, or the
//! multipart form), content type and `x-amz-meta-*` metadata, in a SQLite table in the
//! state directory (`s3.sqlite`), keyed by path.
//!
//! A record holds only while the file is the one it was made for: it names the file's
//! inode, size, modification and change times, and a file changed through another door (the
//! native protocol, a mount, Chirp) no longer matches it. Such a file, or one never
//! written through S3, gets an ETag derived from those three in the multipart form
//! (`"HEX-1"`), which S3 clients take as "not an MD5" and do not check against the
//! bytes; reading it whole to hash it would make every listing cost a read of the data.

use locus_proto::types::Attr;
use md5::{Digest, Md5};
use parking_lot::Mutex;
use rusqlite::{params, Connection, OptionalExtension};
use std::collections::BTreeMap;
use std::path::Path;

/// An object's S3 facts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Record {
    /// The ETag's value, without quotes.
    pub etag: String,
    /// The `Content-Type` it was stored with.
    pub content_type: Option<String>,
    /// Its `x-amz-meta-*` metadata (names without the prefix, lower case).
    pub metadata: BTreeMap<String, String>,
}

/// The table of records.
pub struct Records {
    db: Mutex<Connection>,
}

/// The ETag of an empty object (the MD5 of nothing), as S3 gives directory markers.
pub const EMPTY_ETAG: &str = "d41d8cd98f00b204e9800998ecf8427e";

/// What a record is checked against: inode, size, and the modification and change
/// times folded into one (a change time cannot be set back, so a rewrite in place that
/// restores the modification time still shows).
fn stamp(attr: &Attr) -> (i64, i64, i64) {
    let ns = |t: &locus_proto::types::Time| t.sec.saturating_mul(1_000_000_000).saturating_add(t.nsec as i64);
    let times = ns(&attr.mtime) ^ ns(&attr.ctime).rotate_left(32);
    (attr.ino as i64, attr.size as i64, times)
}

/// The ETag of a file with no record: from its inode, size and modification time.
pub fn derived_etag(attr: &Attr) -> String {
    let (ino, size, mtime) = stamp(attr);
    let mut h = Md5::new();
    h.update(ino.to_le_bytes());
    h.update(size.to_le_bytes());
    h.update(mtime.to_le_bytes());
    format!("{}-1", hex::encode(h.finalize()))
}

impl Records {
    /// Opens (or makes) the table in `state_dir`.
    pub fn open(state_dir: &Path) -> rusqlite::Result<Records> {
        let db = Connection::open(state_dir.join("s3.sqlite"))?;
        // Records are a cache of facts about files: losing the last ones in a crash only
        // gives those files derived ETags, so commits need not wait for the disk.
        db.pragma_update(None, "journal_mode", "WAL")?;
        db.pragma_update(None, "synchronous", "NORMAL")?;
        db.execute_batch(
            "CREATE TABLE IF NOT EXISTS objects (
                path TEXT PRIMARY KEY, ino INTEGER, size INTEGER, mtime_ns INTEGER,
                etag TEXT NOT NULL, content_type TEXT, metadata TEXT NOT NULL)",
        )?;
        Ok(Records { db: Mutex::new(db) })
    }

    /// Records `record` for the file at `path` as `attr` describes it.
    pub fn put(&self, path: &str, attr: &Attr, record: &Record) {
        let (ino, size, mtime) = stamp(attr);
        let metadata = serde_json::to_string(&record.metadata).unwrap_or_else(|_| "{}".into());
        let done = self.db.lock().execute(
            "INSERT OR REPLACE INTO objects VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![path, ino, size, mtime, record.etag, record.content_type, metadata],
        );
        if let Err(e) = done {
            tracing::warn!(path, "S3 object record not kept: {e}");
        }
    }

    /// The record of the file at `path`, if it is still the file it was made for.
    pub fn get(&self, path: &str, attr: &Attr) -> Option<Record> {
        let db = self.db.lock();
        let row = db
            .query_row(
                "SELECT ino, size, mtime_ns, etag, content_type, metadata FROM objects WHERE path = ?1",
                params![path],
                |r| {
                    Ok((
                        (r.get::<_, i64>(0)?, r.get::<_, i64>(1)?, r.get::<_, i64>(2)?),
                        Record { etag: r.get(3)?, content_type: r.get(4)?, metadata: Default::default() },
                        r.get::<_, String>(5)?,
                    ))
                },
            )
            .optional()
            .ok()??;
        let (seen, mut record, metadata) = row;
        if seen != stamp(attr) {
            return None;
        }
        record.metadata = serde_json::from_str(&metadata).unwrap_or_default();
        Some(record)
    }

    /// The record of `path`, or one with a derived ETag.
    pub fn get_or_derive(&self, path: &str, attr: &Attr) -> Record {
        self.get(path, attr).unwrap_or_else(|| Record { etag: derived_etag(attr), ..Default::default() })
    }

    /// Forgets the record of `path`.
    pub fn forget(&self, path: &str) {
        let _ = self.db.lock().execute("DELETE FROM objects WHERE path = ?1", params![path]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use locus_proto::types::Time;

    #[test]
    fn a_record_holds_only_for_the_file_it_was_made_for() {
        let dir = tempfile::tempdir().unwrap();
        let records = Records::open(dir.path()).unwrap();
        let attr = Attr { ino: 7, size: 3, mtime: Time { sec: 100, nsec: 5 }, ..Default::default() };
        let mut record = Record { etag: "abc".into(), content_type: Some("text/csv".into()), ..Default::default() };
        record.metadata.insert("owner".into(), "alice".into());
        records.put("/b/k", &attr, &record);
        assert_eq!(records.get("/b/k", &attr), Some(record));
        let changed = Attr { size: 4, ..attr.clone() };
        assert_eq!(records.get("/b/k", &changed), None);
        assert!(records.get_or_derive("/b/k", &changed).etag.ends_with("-1"));
        assert_ne!(derived_etag(&attr), derived_etag(&changed));
        records.forget("/b/k");
        assert_eq!(records.get("/b/k", &attr), None);
    }
}
