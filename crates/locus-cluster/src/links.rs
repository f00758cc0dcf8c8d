//! One file under several names (hard links) and the attributes every name shows: each
//! name is a row of `entries` naming the file's object, with a count of the names.

use crate::sql::{Tx, Val};
use crate::{get, insert, parent_dir, Entry, Kind, Meta, MetaError, Result};

/// A name of `object` went: its other names count one less.
pub(crate) fn unlinked(tx: &mut dyn Tx, object: u64) -> Result<()> {
    tx.exec("UPDATE entries SET links = links - 1 WHERE object = $1 AND links > 1", &[Val::Int(object as i64)])
        .map(drop)
}

impl Meta {
    /// Gives the file at `from` a second name `to` (a hard link): both name one object,
    /// and every new version, mode or time shows under each.
    pub fn link(&self, from: &str, to: &str) -> Result<Entry> {
        self.tx(|tx| {
            let src = get(tx, from)?.ok_or_else(|| MetaError::NotFound(from.into()))?;
            if src.kind == Kind::Dir {
                return Err(MetaError::Invalid(format!("{from}: a directory cannot have another name")));
            }
            parent_dir(tx, to)?;
            if get(tx, to)?.is_some() {
                return Err(MetaError::Exists(to.into()));
            }
            let mut e = src.clone();
            e.path = to.to_string();
            insert(tx, &e)?;
            tx.exec("UPDATE entries SET links = links + 1 WHERE object = $1", &[Val::Int(src.object as i64)])?;
            e.links += 1;
            Ok(e)
        })
    }

    /// Whether some name still has `(object, version)` as its current version.
    pub fn names_version(&self, object: u64, version: u64) -> Result<bool> {
        self.tx(|tx| {
            let rows = tx.query(
                "SELECT path FROM entries WHERE object = $1 AND version = $2 LIMIT 1",
                &[Val::Int(object as i64), Val::Int(version as i64)],
            )?;
            Ok(!rows.is_empty())
        })
    }

    /// Sets permission bits.
    pub fn set_mode(&self, path: &str, mode: u32) -> Result<()> {
        let sql = "UPDATE entries SET mode = $2 WHERE object = (SELECT object FROM entries WHERE path = $1)";
        self.update(path, sql, Val::Int((mode & 0o7777) as i64))
    }

    /// Sets the modification time.
    pub fn set_mtime(&self, path: &str, mtime_ns: i64) -> Result<()> {
        let sql = "UPDATE entries SET mtime = $2 WHERE object = (SELECT object FROM entries WHERE path = $1)";
        self.update(path, sql, Val::Int(mtime_ns))
    }

    fn update(&self, path: &str, sql: &str, value: Val) -> Result<()> {
        self.tx(|tx| match tx.exec(sql, &[Val::Text(path.into()), value.clone()])? {
            0 => Err(MetaError::NotFound(path.into())),
            _ => Ok(()),
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::{Content, Entry, Kind, Meta};

    /// A namespace made by an earlier version (no `links`, `seen`, `draining` or
    /// `added` columns) opens and works.
    #[test]
    fn an_older_sqlite_namespace_gains_the_new_columns() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("meta.db");
        let old = rusqlite::Connection::open(&db).unwrap();
        old.execute_batch(
            "CREATE TABLE entries (path TEXT PRIMARY KEY, parent TEXT NOT NULL, name TEXT NOT NULL, \
             kind INTEGER NOT NULL, mode INTEGER NOT NULL, size INTEGER NOT NULL, mtime INTEGER NOT NULL, \
             object INTEGER NOT NULL, version INTEGER NOT NULL, nodes TEXT NOT NULL, inline BLOB); \
             CREATE TABLE nodes (id INTEGER PRIMARY KEY, addr TEXT UNIQUE NOT NULL, http TEXT NOT NULL, \
             free INTEGER NOT NULL); \
             CREATE TABLE scripts (id TEXT PRIMARY KEY, source TEXT NOT NULL);",
        )
        .unwrap();
        drop(old);
        let meta = Meta::open(db.to_str().unwrap(), "admin").unwrap();
        meta.add_script("id", "return 1", 10).unwrap();
        assert_eq!(meta.script("id").unwrap().as_deref(), Some("return 1"));
        let mut f = Entry::empty("/f".into(), Kind::File, 0o644, 40);
        f.content = Content::Inline(b"x".to_vec());
        meta.commit(&f).unwrap();
        meta.link("/f", "/g").unwrap();
        assert_eq!(meta.get("/f").unwrap().unwrap().links, 2);
    }
}
