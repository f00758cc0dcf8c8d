//! The namespace of a Locus cluster, kept in a database engine we did not write.
//!
//! A cluster head keeps every name, directory, attribute, ACL, file version and file
//! location here, and nothing of it in memory that another head could contradict. One
//! head uses an embedded SQLite file (nothing to install); several heads share one
//! PostgreSQL database and fail over to each other, since a write is acknowledged only
//! after its transaction commits. Both engines run the same SQL (see [`sql`]).
//!
//! - [`Meta`]: the namespace operations, each one transaction.
//! - [`Entry`]: one name's row: a directory, or a file and where its current version is.
//! - [`sql`]: the two engines behind one small trait.

mod acls;
mod links;
use links::unlinked;
mod records;
mod script_state;
use records::nodes_from;
pub mod sql;

pub use records::ActiveResult;
pub use script_state::{object_scope, Letter, ValueLimits};

use locus_proto::types::Rights;
use locus_proto::Code;
use sql::{Engine, Tx, Val};

/// Why a namespace operation failed.
#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    #[error("{0}: no such file or directory")]
    NotFound(String),
    #[error("{0}: file exists")]
    Exists(String),
    #[error("{0}: not a directory")]
    NotDir(String),
    #[error("{0}: is a directory")]
    IsDir(String),
    #[error("{0}: directory not empty")]
    NotEmpty(String),
    #[error("{0}")]
    Invalid(String),
    /// The thing is still in use (a node that holds versions cannot be removed).
    #[error("{0}")]
    Busy(String),
    /// The engine failed or cannot be reached; the operation may be retried.
    #[error("metadata engine: {0}")]
    Engine(String),
    /// A concurrent transaction conflicted; the engine retries these itself.
    #[error("metadata engine: serialization conflict")]
    Conflict,
}

impl MetaError {
    /// The wire (errno) code of this error.
    pub fn code(&self) -> Code {
        match self {
            MetaError::NotFound(_) => Code::NOENT,
            MetaError::Exists(_) => Code::EXIST,
            MetaError::NotDir(_) => Code::NOTDIR,
            MetaError::IsDir(_) => Code::ISDIR,
            MetaError::NotEmpty(_) => Code::NOTEMPTY,
            MetaError::Invalid(_) => Code::INVAL,
            MetaError::Busy(_) => Code::BUSY,
            MetaError::Engine(_) | MetaError::Conflict => Code::AGAIN,
        }
    }
}

impl From<MetaError> for locus_proto::Error {
    fn from(e: MetaError) -> Self {
        locus_proto::Error::new(e.code(), e.to_string())
    }
}

/// Results of this crate.
pub type Result<T> = std::result::Result<T, MetaError>;

/// What a name is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    File = 1,
    Dir = 2,
    /// A symbolic link: its target is its inline content.
    Symlink = 3,
}

/// Where a file version's bytes are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Content {
    /// Small files: in the namespace itself.
    Inline(Vec<u8>),
    /// On these data nodes (ids from [`Meta::join_node`]); node 0 is the head's own
    /// object directory, used when no data node has joined.
    Nodes(Vec<u64>),
}

/// One name in the namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Absolute, normalised: `/` or `/a/b`.
    pub path: String,
    pub kind: Kind,
    /// Permission bits only.
    pub mode: u32,
    pub size: u64,
    /// Modification time, nanoseconds since the epoch.
    pub mtime_ns: i64,
    /// The file's object id (its inode number too); stays across versions and renames.
    pub object: u64,
    /// The current version (globally unique, so that concurrent writers never collide).
    pub version: u64,
    pub content: Content,
    /// How many names the file has (hard links): every name's row says the same.
    pub links: u64,
}

impl Entry {
    /// A new, empty file or directory named `path`, modified now: a file's first version
    /// is its object id, with no bytes.
    pub fn empty(path: String, kind: Kind, mode: u32, object: u64) -> Entry {
        let (version, content) = match kind {
            Kind::File | Kind::Symlink => (object, Content::Inline(Vec::new())),
            Kind::Dir => (0, Content::Nodes(Vec::new())),
        };
        Entry { path, kind, mode: mode & 0o7777, size: 0, mtime_ns: now_ns(), object, version, content, links: 1 }
    }
}

/// A data node known to the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    pub id: u64,
    /// `host:port` of its Locus protocol.
    pub addr: String,
    /// `host:port` of its HTTP endpoint, if it has one.
    pub http: Option<String>,
    /// Free bytes it last reported.
    pub free: u64,
    /// When it last joined (its heartbeat), in seconds since the epoch.
    pub seen: u64,
    /// Being drained: no new versions go to it, and those it holds move elsewhere.
    pub draining: bool,
}

/// A version a data node reported damaged (its checksum failed): the node's copy is to
/// be replaced from another replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Damaged {
    pub object: u64,
    pub version: u64,
    pub node: u64,
}

/// A superseded or removed version to drop from its nodes once no read can need it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Garbage {
    pub object: u64,
    pub version: u64,
    pub nodes: Vec<u64>,
}

pub use locus_proto::path::split;

/// Normalises a client's path ([`locus_proto::path::canonical`]), refusing `..` and NUL.
pub fn normalise(path: &str) -> Result<String> {
    locus_proto::path::canonical(path)
        .ok_or_else(|| MetaError::Invalid(format!("{path}: '..' and NUL are not allowed in paths")))
}

/// Where a symbolic link at `link` whose target is `target` points, as a normalised
/// path of the namespace: a relative target is taken from the link's directory, and
/// `..` above the root is refused (a link cannot lead out of the namespace).
pub fn link_target(link: &str, target: &str) -> Result<String> {
    let base = match target.starts_with('/') {
        true => String::new(),
        false => split(link).map_or(String::new(), |(parent, _)| parent.to_string()),
    };
    let mut parts: Vec<&str> = Vec::new();
    for part in base.split('/').chain(target.split('/')) {
        match part {
            "" | "." => {}
            ".." => {
                if parts.pop().is_none() {
                    return Err(MetaError::Invalid(format!(
                        "{link}: its target {target:?} leads out of the namespace"
                    )));
                }
            }
            p => parts.push(p),
        }
    }
    normalise(&format!("/{}", parts.join("/")))
}

/// The first path after every path under `dir` in byte order (`dir` + `0`, the byte
/// after `/`), so `path > dir/ AND path < end` selects exactly its descendants.
fn descendants(dir: &str) -> (String, String) {
    let base = if dir == "/" { "" } else { dir };
    (format!("{base}/"), format!("{base}0"))
}

const COLUMNS: &str = "path, kind, mode, size, mtime, object, version, nodes, inline, links";

fn nodes_text(nodes: &[u64]) -> String {
    nodes.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
}

fn entry_params(e: &Entry) -> Vec<Val> {
    let (parent, name) = split(&e.path).unwrap_or(("", ""));
    let (nodes, inline) = match &e.content {
        Content::Inline(bytes) => (String::new(), Some(bytes.clone())),
        Content::Nodes(n) => (nodes_text(n), None),
    };
    vec![
        Val::Text(e.path.clone()),
        Val::Text(parent.to_string()),
        Val::Text(name.to_string()),
        Val::Int(e.kind as i64),
        Val::Int(e.mode as i64),
        Val::Int(e.size as i64),
        Val::Int(e.mtime_ns),
        Val::Int(e.object as i64),
        Val::Int(e.version as i64),
        Val::Text(nodes),
        Val::Blob(inline),
        Val::Int(e.links as i64),
    ]
}

fn entry_of(row: &[Val]) -> Result<Entry> {
    let bad = || MetaError::Engine("malformed entry row".into());
    let int = |i: usize| row.get(i).and_then(Val::int).ok_or_else(bad);
    let kind = match int(1)? {
        k if k == Kind::Dir as i64 => Kind::Dir,
        k if k == Kind::Symlink as i64 => Kind::Symlink,
        _ => Kind::File,
    };
    let nodes = row.get(7).and_then(Val::text).ok_or_else(bad)?;
    let content = match row.get(8) {
        Some(Val::Blob(Some(bytes))) => Content::Inline(bytes.clone()),
        _ => Content::Nodes(nodes_from(nodes)),
    };
    Ok(Entry {
        path: row.first().and_then(Val::text).ok_or_else(bad)?.to_string(),
        kind,
        mode: int(2)? as u32,
        size: int(3)? as u64,
        mtime_ns: int(4)?,
        object: int(5)? as u64,
        version: int(6)? as u64,
        content,
        links: row.get(9).and_then(Val::int).unwrap_or(1).max(1) as u64,
    })
}

/// The namespace, on one engine.
pub struct Meta {
    engine: Box<dyn Engine>,
}

impl Meta {
    /// Opens (creating if needed) the namespace at `url`: `postgres://...` or
    /// `postgresql://...` for PostgreSQL, anything else is a SQLite file's path.
    /// A new namespace gets a root directory whose ACL gives `admin` every right.
    pub fn open(url: &str, admin: &str) -> Result<Meta> {
        let engine: Box<dyn Engine> = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Box::new(sql::Postgres::connect(url)?)
        } else {
            Box::new(sql::Sqlite::open(std::path::Path::new(url))?)
        };
        let meta = Meta { engine };
        meta.tx(|tx| {
            let root = Entry::empty("/".into(), Kind::Dir, 0o755, 1);
            let mut params = entry_params(&root);
            params[1] = Val::Text(String::new());
            let added = tx.exec(
                "INSERT INTO entries (path, parent, name, kind, mode, size, mtime, object, version, nodes, inline, links) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) ON CONFLICT (path) DO NOTHING",
                &params,
            )?;
            if added == 1 {
                tx.exec(
                    "INSERT INTO acls (path, subject, rights) VALUES ('/', $1, $2)",
                    &[Val::Text(admin.into()), Val::Int(Rights::ALL.0 as i64)],
                )?;
                tx.exec(
                    "INSERT INTO settings (name, value) VALUES ('next_id', '2') ON CONFLICT (name) DO NOTHING",
                    &[],
                )?;
            }
            Ok(())
        })?;
        Ok(meta)
    }

    /// Runs `f` as one transaction (retried from the start on a serialization conflict).
    pub fn tx<R: Send>(&self, mut f: impl FnMut(&mut dyn Tx) -> Result<R> + Send) -> Result<R> {
        let mut out = None;
        self.engine.run(&mut |tx| {
            out = Some(f(tx)?);
            Ok(())
        })?;
        Ok(out.expect("a transaction that succeeded ran its body"))
    }

    /// Tells the other heads on this namespace `payloads` (see [`Engine::notify`]).
    pub fn notify(&self, channel: &str, payloads: &[String]) -> Result<()> {
        self.engine.notify(channel, payloads)
    }

    /// Hands what heads notify on `channel` to `on` (see [`Engine::listen`]); false
    /// where the engine serves one head only.
    pub fn listen(&self, channel: &str, on: Box<dyn FnMut(sql::Notice) -> bool + Send>) -> bool {
        self.engine.listen(channel, on)
    }

    /// The entry at `path`, if any.
    pub fn get(&self, path: &str) -> Result<Option<Entry>> {
        self.tx(|tx| get(tx, path))
    }

    /// The entries of directory `dir`, in name order.
    pub fn list(&self, dir: &str) -> Result<Vec<Entry>> {
        self.tx(|tx| {
            match get(tx, dir)? {
                None => return Err(MetaError::NotFound(dir.into())),
                Some(e) if e.kind != Kind::Dir => return Err(MetaError::NotDir(dir.into())),
                Some(_) => {}
            }
            let rows = tx.query(
                &format!("SELECT {COLUMNS} FROM entries WHERE parent = $1 ORDER BY name"),
                &[Val::Text(dir.into())],
            )?;
            rows.iter().map(|r| entry_of(r)).collect()
        })
    }

    /// Every file under directory `dir`, at any depth, in path order.
    pub fn files_under(&self, dir: &str) -> Result<Vec<Entry>> {
        self.tx(|tx| {
            let (lo, hi) = descendants(dir);
            let rows = tx.query(
                &format!("SELECT {COLUMNS} FROM entries WHERE path > $1 AND path < $2 AND kind = $3 ORDER BY path"),
                &[Val::Text(lo), Val::Text(hi), Val::Int(Kind::File as i64)],
            )?;
            rows.iter().map(|r| entry_of(r)).collect()
        })
    }

    /// A new unique id, for objects and versions.
    pub fn next_id(&self) -> Result<u64> {
        self.tx(next_id)
    }

    /// Adds a new name (its parent must be an existing directory).
    pub fn create(&self, entry: &Entry) -> Result<()> {
        self.tx(|tx| {
            if get(tx, &entry.path)?.is_some() {
                return Err(MetaError::Exists(entry.path.clone()));
            }
            parent_dir(tx, &entry.path)?;
            insert(tx, entry)
        })
    }

    /// Makes `entry` (a file) the current version at its path, creating the name if
    /// needed. Answers the version it replaced, whose bytes become garbage.
    pub fn commit(&self, entry: &Entry) -> Result<Option<Entry>> {
        self.tx(|tx| commit(tx, entry))
    }

    /// As [`Meta::commit`] for a new name only: `Exists` if the path is taken.
    pub fn commit_new(&self, entry: &Entry) -> Result<()> {
        self.tx(|tx| match get(tx, &entry.path)? {
            Some(_) => Err(MetaError::Exists(entry.path.clone())),
            None => commit(tx, entry).map(drop),
        })
    }

    /// Whether `(object, version)` on `nodes` is pending (its `garbage` row is there)
    /// and due no sooner than `not_before`.
    pub fn is_pending(&self, object: u64, version: u64, nodes: &[u64], not_before: u64) -> Result<bool> {
        self.tx(|tx| {
            let rows = tx.query(
                "SELECT after FROM garbage WHERE object = $1 AND version = $2 AND nodes = $3 AND after > $4",
                &[
                    Val::Int(object as i64),
                    Val::Int(version as i64),
                    Val::Text(nodes_text(nodes)),
                    Val::Int(not_before as i64),
                ],
            )?;
            Ok(!rows.is_empty())
        })
    }

    /// As [`Meta::commit`], for a version written to nodes by a client (a third-party
    /// write): in the same transaction its pending row in `garbage` goes, so its bytes
    /// stay; refused when that row is gone (the write's time ran out, or it was
    /// committed already).
    ///
    /// The row must be due no sooner than `not_before` (seconds since the epoch): a
    /// collector that took the row as due may be dropping its bytes already.
    pub fn commit_pending(&self, entry: &Entry, not_before: u64) -> Result<Option<Entry>> {
        let Content::Nodes(nodes) = &entry.content else {
            return Err(MetaError::Invalid("a pending version lives on data nodes".into()));
        };
        self.tx(|tx| {
            let pending = tx.exec(
                "DELETE FROM garbage WHERE object = $1 AND version = $2 AND nodes = $3 AND after > $4",
                &[
                    Val::Int(entry.object as i64),
                    Val::Int(entry.version as i64),
                    Val::Text(nodes_text(nodes)),
                    Val::Int(not_before as i64),
                ],
            )?;
            if pending == 0 {
                return Err(MetaError::NotFound(format!(
                    "{}: version {} is not pending (its time ran out, or it was committed already)",
                    entry.path, entry.version
                )));
            }
            commit(tx, entry)
        })
    }

    /// Removes a name: a file (`dir` false) or an empty directory (`dir` true).
    pub fn remove(&self, path: &str, dir: bool) -> Result<Entry> {
        self.tx(|tx| {
            let e = get(tx, path)?.ok_or_else(|| MetaError::NotFound(path.into()))?;
            match (e.kind, dir) {
                (Kind::Dir, false) => return Err(MetaError::IsDir(path.into())),
                (Kind::File | Kind::Symlink, true) => return Err(MetaError::NotDir(path.into())),
                (Kind::Dir, true) => {
                    if path == "/" {
                        return Err(MetaError::Invalid("the root cannot be removed".into()));
                    }
                    let children =
                        tx.query("SELECT path FROM entries WHERE parent = $1 LIMIT 1", &[Val::Text(path.into())])?;
                    if !children.is_empty() {
                        return Err(MetaError::NotEmpty(path.into()));
                    }
                    tx.exec("DELETE FROM acls WHERE path = $1", &[Val::Text(path.into())])?;
                }
                (Kind::File | Kind::Symlink, false) => {}
            }
            tx.exec("DELETE FROM entries WHERE path = $1", &[Val::Text(path.into())])?;
            unlinked(tx, e.object)?;
            Ok(e)
        })
    }

    /// Renames `from` to `to` as `rename(2)` does: a file replaces a file, a directory an
    /// empty directory, and a directory's descendants and ACLs move with it. Answers the
    /// file it replaced, whose bytes become garbage.
    pub fn rename(&self, from: &str, to: &str) -> Result<Option<Entry>> {
        self.tx(|tx| {
            let src = get(tx, from)?.ok_or_else(|| MetaError::NotFound(from.into()))?;
            if from == to {
                return Ok(None);
            }
            if src.kind == Kind::Dir && to.starts_with(&format!("{from}/")) {
                return Err(MetaError::Invalid(format!("cannot move {from} into itself")));
            }
            parent_dir(tx, to)?;
            let replaced = get(tx, to)?;
            // Two names of one file: rename(2) does nothing.
            if replaced.as_ref().is_some_and(|r| r.object == src.object && r.kind != Kind::Dir) {
                return Ok(None);
            }
            match (&replaced, src.kind) {
                (Some(r), Kind::File) if r.kind == Kind::Dir => return Err(MetaError::IsDir(to.into())),
                (Some(r), Kind::Dir) if r.kind == Kind::File => return Err(MetaError::NotDir(to.into())),
                (Some(r), Kind::Dir) => {
                    let children =
                        tx.query("SELECT path FROM entries WHERE parent = $1 LIMIT 1", &[Val::Text(r.path.clone())])?;
                    if !children.is_empty() {
                        return Err(MetaError::NotEmpty(to.into()));
                    }
                    tx.exec("DELETE FROM acls WHERE path = $1", &[Val::Text(to.into())])?;
                }
                _ => {}
            }
            if let Some(r) = &replaced {
                tx.exec("DELETE FROM entries WHERE path = $1", &[Val::Text(to.into())])?;
                unlinked(tx, r.object)?;
            }
            let mut moved = vec![src];
            if moved[0].kind == Kind::Dir {
                let (lo, hi) = descendants(from);
                let rows = tx.query(
                    &format!("SELECT {COLUMNS} FROM entries WHERE path > $1 AND path < $2"),
                    &[Val::Text(lo.clone()), Val::Text(hi.clone())],
                )?;
                for r in rows {
                    moved.push(entry_of(&r)?);
                }
                let acl_rows = tx.query(
                    "SELECT path, subject, rights FROM acls WHERE path = $1 OR (path > $2 AND path < $3)",
                    &[Val::Text(from.into()), Val::Text(lo), Val::Text(hi)],
                )?;
                for r in acl_rows {
                    let (Some(p), Some(s)) = (r[0].text(), r[1].text()) else { continue };
                    let new = format!("{to}{}", &p[from.len()..]);
                    tx.exec(
                        "DELETE FROM acls WHERE path = $1 AND subject = $2",
                        &[Val::Text(p.into()), Val::Text(s.into())],
                    )?;
                    tx.exec(
                        "INSERT INTO acls (path, subject, rights) VALUES ($1, $2, $3)",
                        &[Val::Text(new), Val::Text(s.into()), r[2].clone()],
                    )?;
                }
            }
            for mut e in moved {
                tx.exec("DELETE FROM entries WHERE path = $1", &[Val::Text(e.path.clone())])?;
                e.path = format!("{to}{}", &e.path[from.len()..]);
                insert(tx, &e)?;
            }
            Ok(replaced)
        })
    }
}

fn get(tx: &mut dyn Tx, path: &str) -> Result<Option<Entry>> {
    let rows = tx.query(&format!("SELECT {COLUMNS} FROM entries WHERE path = $1"), &[Val::Text(path.into())])?;
    rows.first().map(|r| entry_of(r)).transpose()
}

fn commit(tx: &mut dyn Tx, entry: &Entry) -> Result<Option<Entry>> {
    let old = get(tx, &entry.path)?;
    match &old {
        Some(o) if o.kind == Kind::Dir => return Err(MetaError::IsDir(entry.path.clone())),
        Some(_) => {
            tx.exec("DELETE FROM entries WHERE path = $1", &[Val::Text(entry.path.clone())])?;
        }
        None => parent_dir(tx, &entry.path)?,
    }
    let mut entry = entry.clone();
    entry.links = 1;
    let replaced_other = old.as_ref().is_some_and(|o| o.object != entry.object);
    if let Some(o) = old.as_ref().filter(|_| replaced_other) {
        unlinked(tx, o.object)?;
    }
    insert(tx, &entry)?;
    // The file's other names (hard links) show the new version too.
    let p = entry_params(&entry);
    tx.exec(
        "UPDATE entries SET mode = $3, size = $4, mtime = $5, version = $6, nodes = $7, inline = $8 \
         WHERE object = $2 AND path <> $1",
        &[
            p[0].clone(),
            p[7].clone(),
            p[4].clone(),
            p[5].clone(),
            p[6].clone(),
            p[8].clone(),
            p[9].clone(),
            p[10].clone(),
        ],
    )?;
    tx.exec(
        "UPDATE entries SET links = (SELECT count(*) FROM entries WHERE object = $1) WHERE object = $1",
        &[Val::Int(entry.object as i64)],
    )?;
    Ok(old)
}

fn insert(tx: &mut dyn Tx, e: &Entry) -> Result<()> {
    tx.exec(
        "INSERT INTO entries (path, parent, name, kind, mode, size, mtime, object, version, nodes, inline, links) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
        &entry_params(e),
    )
    .map(drop)
}

fn parent_dir(tx: &mut dyn Tx, path: &str) -> Result<()> {
    let (parent, _) = split(path).ok_or_else(|| MetaError::Exists(path.into()))?;
    match get(tx, parent)? {
        None => Err(MetaError::NotFound(parent.into())),
        Some(p) if p.kind != Kind::Dir => Err(MetaError::NotDir(parent.into())),
        Some(_) => Ok(()),
    }
}

fn next_id(tx: &mut dyn Tx) -> Result<u64> {
    let rows = tx.query("SELECT value FROM settings WHERE name = 'next_id'", &[])?;
    let id: u64 = rows.first().and_then(|r| r[0].text()).and_then(|t| t.parse().ok()).unwrap_or(2);
    tx.exec("UPDATE settings SET value = $1 WHERE name = 'next_id'", &[Val::Text((id + 1).to_string())])?;
    Ok(id)
}

/// Now, in nanoseconds since the epoch.
pub fn now_ns() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as i64).unwrap_or(0)
}

#[cfg(test)]
mod tests;
