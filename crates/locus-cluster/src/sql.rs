//! Two SQL engines behind one small trait, so the namespace's SQL is written once.
//!
//! Queries take PostgreSQL's `$1`-style parameters; the SQLite engine turns them into
//! its `?1` (it would read `$1` as a name, numbered by first appearance). Paths compare byte-wise in both: SQLite
//! does by default, and the PostgreSQL schema sets `COLLATE "C"`.

use crate::{MetaError, Result};
use parking_lot::Mutex;

/// A value in a row or a parameter.
#[derive(Clone, Debug, PartialEq)]
pub enum Val {
    Int(i64),
    Text(String),
    Blob(Option<Vec<u8>>),
}

impl Val {
    /// The integer, if this is one.
    pub fn int(&self) -> Option<i64> {
        match self {
            Val::Int(i) => Some(*i),
            _ => None,
        }
    }

    /// A count or id kept as an integer column (which holds at most `i64::MAX`).
    pub fn count(v: u64) -> Val {
        Val::Int(v.min(i64::MAX as u64) as i64)
    }

    /// The integer as a count (a negative one as 0), if this is one.
    pub fn uint(&self) -> Option<u64> {
        self.int().map(|i| i.max(0) as u64)
    }

    /// The text, if this is some.
    pub fn text(&self) -> Option<&str> {
        match self {
            Val::Text(t) => Some(t),
            _ => None,
        }
    }
}

/// Statements inside one transaction.
pub trait Tx {
    /// Rows of a `SELECT` (or of `RETURNING`).
    fn query(&mut self, sql: &str, params: &[Val]) -> Result<Vec<Vec<Val>>>;
    /// Runs a statement; answers how many rows it changed.
    fn exec(&mut self, sql: &str, params: &[Val]) -> Result<u64>;
}

/// A database that runs transactions.
pub trait Engine: Send + Sync {
    /// Runs `body` in one transaction, committing if it succeeds and rolling back if not;
    /// a serialization conflict reruns it.
    fn run(&self, body: &mut (dyn FnMut(&mut dyn Tx) -> Result<()> + Send)) -> Result<()>;

    /// Tells every other head on this database `payloads` (each under
    /// [`MAX_NOTICE`] bytes) on `channel`. An engine that serves one head only (SQLite)
    /// has no one to tell.
    fn notify(&self, channel: &str, payloads: &[String]) -> Result<()> {
        let _ = (channel, payloads);
        Ok(())
    }

    /// Starts a thread that hands what other heads notify on `channel` to `on`, until
    /// `on` answers false: [`Notice::Listening`] each time it starts listening (notices
    /// before may have been missed), [`Notice::Down`] when its link broke or cannot be
    /// made. False where the engine serves one head only (nothing will ever come).
    fn listen(&self, channel: &str, on: Box<dyn FnMut(Notice) -> bool + Send>) -> bool {
        let _ = (channel, on);
        false
    }
}

/// The largest payload of one notice (PostgreSQL refuses 8000 bytes and more).
pub const MAX_NOTICE: usize = 7900;

/// What a listener hears.
#[derive(Debug)]
pub enum Notice {
    /// A payload another head (or this one) notified.
    Payload(String),
    /// Listening now (the first time, or again after the link broke): what was
    /// notified before may not have been heard.
    Listening,
    /// Not listening (the link broke, or cannot be made): notices are being missed.
    Down,
    /// Nothing came for a while (a chance to stop listening).
    Idle,
}

/// How often a quiet listening connection is checked (a half-open link hears nothing).
const LISTEN_CHECK: std::time::Duration = std::time::Duration::from_secs(5);

const SQLITE_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS entries (
    path TEXT PRIMARY KEY, parent TEXT NOT NULL, name TEXT NOT NULL, kind INTEGER NOT NULL,
    mode INTEGER NOT NULL, size INTEGER NOT NULL, mtime INTEGER NOT NULL, object INTEGER NOT NULL,
    version INTEGER NOT NULL, nodes TEXT NOT NULL, inline BLOB, links INTEGER NOT NULL DEFAULT 1);
CREATE INDEX IF NOT EXISTS entries_parent ON entries (parent, name);
CREATE TABLE IF NOT EXISTS acls (path TEXT NOT NULL, subject TEXT NOT NULL, rights INTEGER NOT NULL,
    PRIMARY KEY (path, subject));
CREATE TABLE IF NOT EXISTS nodes (id INTEGER PRIMARY KEY, addr TEXT UNIQUE NOT NULL, http TEXT NOT NULL,
    free INTEGER NOT NULL, seen INTEGER NOT NULL DEFAULT 0, draining INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS entries_object ON entries (object, version);
CREATE TABLE IF NOT EXISTS damaged (object INTEGER NOT NULL, version INTEGER NOT NULL, node INTEGER NOT NULL,
    PRIMARY KEY (object, version, node));
CREATE TABLE IF NOT EXISTS garbage (object INTEGER NOT NULL, version INTEGER NOT NULL, nodes TEXT NOT NULL,
    after INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS settings (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS scripts (id TEXT PRIMARY KEY, source TEXT NOT NULL, added BIGINT NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS active_results (key TEXT PRIMARY KEY, stamp TEXT NOT NULL, error TEXT NOT NULL,
    size INTEGER NOT NULL, mtime INTEGER NOT NULL, object INTEGER NOT NULL, version INTEGER NOT NULL,
    nodes TEXT NOT NULL, inline BLOB);
CREATE TABLE IF NOT EXISTS script_values (scope TEXT NOT NULL, key TEXT NOT NULL, value BLOB NOT NULL,
    PRIMARY KEY (scope, key));
CREATE TABLE IF NOT EXISTS script_locks (name TEXT PRIMARY KEY, owner TEXT NOT NULL, expires INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS script_messages (id INTEGER PRIMARY KEY, recipient INTEGER NOT NULL,
    sender INTEGER NOT NULL, data BLOB NOT NULL, expires INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS head_numbers (number INTEGER PRIMARY KEY, seen INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS heads (addr TEXT PRIMARY KEY, seen INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS node_io (node INTEGER PRIMARY KEY, reads INTEGER NOT NULL, read_bytes INTEGER NOT NULL,
    read_ns INTEGER NOT NULL, writes INTEGER NOT NULL, write_bytes INTEGER NOT NULL, write_ns INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS version_load (node INTEGER NOT NULL, object INTEGER NOT NULL, version INTEGER NOT NULL,
    load INTEGER NOT NULL, PRIMARY KEY (node, object, version));
";

/// Heads starting together would race in `CREATE TABLE IF NOT EXISTS` (PostgreSQL may
/// then fail one with a duplicate catalog row): the schema is made in one transaction
/// holding an advisory lock, so the second head waits and finds the tables there.
const POSTGRES_SCHEMA: &str = r#"
BEGIN;
SELECT pg_advisory_xact_lock(7432001);
CREATE TABLE IF NOT EXISTS entries (
    path TEXT COLLATE "C" PRIMARY KEY, parent TEXT COLLATE "C" NOT NULL, name TEXT COLLATE "C" NOT NULL,
    kind BIGINT NOT NULL, mode BIGINT NOT NULL, size BIGINT NOT NULL, mtime BIGINT NOT NULL,
    object BIGINT NOT NULL, version BIGINT NOT NULL, nodes TEXT NOT NULL, inline BYTEA);
ALTER TABLE entries ADD COLUMN IF NOT EXISTS links BIGINT NOT NULL DEFAULT 1;
CREATE INDEX IF NOT EXISTS entries_parent ON entries (parent, name);
CREATE TABLE IF NOT EXISTS acls (path TEXT COLLATE "C" NOT NULL, subject TEXT NOT NULL, rights BIGINT NOT NULL,
    PRIMARY KEY (path, subject));
CREATE TABLE IF NOT EXISTS nodes (id BIGINT PRIMARY KEY, addr TEXT UNIQUE NOT NULL, http TEXT NOT NULL,
    free BIGINT NOT NULL);
ALTER TABLE nodes ADD COLUMN IF NOT EXISTS seen BIGINT NOT NULL DEFAULT 0;
ALTER TABLE nodes ADD COLUMN IF NOT EXISTS draining BIGINT NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS entries_object ON entries (object, version);
CREATE TABLE IF NOT EXISTS damaged (object BIGINT NOT NULL, version BIGINT NOT NULL, node BIGINT NOT NULL,
    PRIMARY KEY (object, version, node));
CREATE TABLE IF NOT EXISTS garbage (object BIGINT NOT NULL, version BIGINT NOT NULL, nodes TEXT NOT NULL,
    after BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS settings (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS scripts (id TEXT PRIMARY KEY, source TEXT NOT NULL, added BIGINT NOT NULL DEFAULT 0);
ALTER TABLE scripts ADD COLUMN IF NOT EXISTS added BIGINT NOT NULL DEFAULT 0;
CREATE TABLE IF NOT EXISTS active_results (key TEXT PRIMARY KEY, stamp TEXT NOT NULL, error TEXT NOT NULL,
    size BIGINT NOT NULL, mtime BIGINT NOT NULL, object BIGINT NOT NULL, version BIGINT NOT NULL,
    nodes TEXT NOT NULL, inline BYTEA);
CREATE TABLE IF NOT EXISTS script_values (scope TEXT NOT NULL, key TEXT NOT NULL, value BYTEA NOT NULL,
    PRIMARY KEY (scope, key));
CREATE TABLE IF NOT EXISTS script_locks (name TEXT PRIMARY KEY, owner TEXT NOT NULL, expires BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS script_messages (id BIGINT PRIMARY KEY, recipient BIGINT NOT NULL,
    sender BIGINT NOT NULL, data BYTEA NOT NULL, expires BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS head_numbers (number BIGINT PRIMARY KEY, seen BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS heads (addr TEXT PRIMARY KEY, seen BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS node_io (node BIGINT PRIMARY KEY, reads BIGINT NOT NULL, read_bytes BIGINT NOT NULL,
    read_ns BIGINT NOT NULL, writes BIGINT NOT NULL, write_bytes BIGINT NOT NULL, write_ns BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS version_load (node BIGINT NOT NULL, object BIGINT NOT NULL, version BIGINT NOT NULL,
    load BIGINT NOT NULL, PRIMARY KEY (node, object, version));
COMMIT;
"#;

fn engine_error(e: impl std::fmt::Display) -> MetaError {
    MetaError::Engine(e.to_string())
}

/// The embedded engine: one SQLite file, WAL, every commit synced.
pub struct Sqlite {
    conn: Mutex<rusqlite::Connection>,
}

impl Sqlite {
    /// Opens or creates the database file and its tables.
    pub fn open(path: &std::path::Path) -> Result<Sqlite> {
        let conn =
            rusqlite::Connection::open(path).map_err(|e| MetaError::Engine(format!("{}: {e}", path.display())))?;
        // Pages read through a mapping and a 64 MiB cache: listing a directory of a million
        // rows (a storelet run over it) then reads them without a copy per page.
        conn.execute_batch(
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; PRAGMA busy_timeout = 5000;
             PRAGMA mmap_size = 1073741824; PRAGMA cache_size = -65536;",
        )
        .map_err(engine_error)?;
        // Columns added since a table was first made (SQLite has no `ADD COLUMN IF NOT
        // EXISTS`); tables not there yet are made whole by the schema below.
        let columns =
            [("nodes", "seen", 0), ("nodes", "draining", 0), ("entries", "links", 1), ("scripts", "added", 0)];
        for (table, column, default) in columns {
            let count = |sql: &str, arg: &str| -> Result<i64> {
                conn.query_row(sql, [arg], |r| r.get(0)).map_err(engine_error)
            };
            let table_there =
                count("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?1", table)? > 0;
            let present = count(&format!("SELECT count(*) FROM pragma_table_info('{table}') WHERE name = ?1"), column)?;
            if table_there && present == 0 {
                conn.execute_batch(&format!(
                    "ALTER TABLE {table} ADD COLUMN {column} INTEGER NOT NULL DEFAULT {default}"
                ))
                .map_err(engine_error)?;
            }
        }
        conn.execute_batch(SQLITE_SCHEMA).map_err(engine_error)?;
        Ok(Sqlite { conn: Mutex::new(conn) })
    }
}

struct SqliteTx<'a>(&'a rusqlite::Transaction<'a>);

/// `$1` → `?1`; the queries have no `$` inside string literals.
fn sqlite_sql(sql: &str) -> String {
    sql.replace('$', "?")
}

fn sqlite_params(params: &[Val]) -> Vec<rusqlite::types::Value> {
    use rusqlite::types::Value;
    params
        .iter()
        .map(|p| match p {
            Val::Int(i) => Value::Integer(*i),
            Val::Text(t) => Value::Text(t.clone()),
            Val::Blob(Some(b)) => Value::Blob(b.clone()),
            Val::Blob(None) => Value::Null,
        })
        .collect()
}

impl Tx for SqliteTx<'_> {
    fn query(&mut self, sql: &str, params: &[Val]) -> Result<Vec<Vec<Val>>> {
        use rusqlite::types::ValueRef;
        let mut stmt = self.0.prepare_cached(&sqlite_sql(sql)).map_err(engine_error)?;
        let n = stmt.column_count();
        let mut rows = stmt.query(rusqlite::params_from_iter(sqlite_params(params))).map_err(engine_error)?;
        let mut out = Vec::new();
        while let Some(row) = rows.next().map_err(engine_error)? {
            let mut vals = Vec::with_capacity(n);
            for i in 0..n {
                vals.push(match row.get_ref(i).map_err(engine_error)? {
                    ValueRef::Integer(i) => Val::Int(i),
                    ValueRef::Text(t) => Val::Text(String::from_utf8_lossy(t).into_owned()),
                    ValueRef::Blob(b) => Val::Blob(Some(b.to_vec())),
                    ValueRef::Null => Val::Blob(None),
                    ValueRef::Real(r) => Val::Int(r as i64),
                });
            }
            out.push(vals);
        }
        Ok(out)
    }

    fn exec(&mut self, sql: &str, params: &[Val]) -> Result<u64> {
        let mut stmt = self.0.prepare_cached(&sqlite_sql(sql)).map_err(engine_error)?;
        stmt.execute(rusqlite::params_from_iter(sqlite_params(params))).map(|n| n as u64).map_err(engine_error)
    }
}

impl Engine for Sqlite {
    fn run(&self, body: &mut (dyn FnMut(&mut dyn Tx) -> Result<()> + Send)) -> Result<()> {
        let mut conn = self.conn.lock();
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Deferred).map_err(engine_error)?;
        body(&mut SqliteTx(&tx))?;
        tx.commit().map_err(engine_error)
    }
}

/// PostgreSQL, shared by several heads. Each transaction is `SERIALIZABLE` and is
/// retried when PostgreSQL reports a conflict.
///
/// The `postgres` crate's client blocks on a runtime of its own, which may not run
/// inside the server's; so each transaction runs on a short-lived thread of its own.
pub struct Postgres {
    url: String,
    client: Mutex<Option<postgres::Client>>,
}

impl Postgres {
    /// Connects and creates the tables.
    pub fn connect(url: &str) -> Result<Postgres> {
        let pg = Postgres { url: url.to_string(), client: Mutex::new(None) };
        pg.off_runtime(|client| client.batch_execute(POSTGRES_SCHEMA).map_err(engine_error))?;
        Ok(pg)
    }

    /// Runs `f` on a thread outside any async runtime, with a connection (made again
    /// if the last one broke, so a restarted PostgreSQL is picked up).
    fn off_runtime<R: Send>(&self, f: impl FnOnce(&mut postgres::Client) -> Result<R> + Send) -> Result<R> {
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut slot = self.client.lock();
                if slot.as_ref().is_none_or(|c| c.is_closed()) {
                    *slot = Some(postgres::Client::connect(&self.url, postgres::NoTls).map_err(engine_error)?);
                }
                let client = slot.as_mut().expect("connected above");
                let out = f(client);
                if client.is_closed() {
                    *slot = None;
                }
                out
            })
            .join()
            .unwrap_or_else(|_| Err(MetaError::Engine("metadata thread panicked".into())))
        })
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        // Its client blocks on a runtime of its own when it closes: not on the caller's.
        if let Some(client) = self.client.get_mut().take() {
            std::thread::spawn(move || drop(client));
        }
    }
}

struct PgTx<'a, 'b>(&'a mut postgres::Transaction<'b>);

fn pg_error(e: postgres::Error) -> MetaError {
    use postgres::error::SqlState;
    match e.code() {
        Some(c) if *c == SqlState::T_R_SERIALIZATION_FAILURE || *c == SqlState::T_R_DEADLOCK_DETECTED => {
            MetaError::Conflict
        }
        Some(c) if *c == SqlState::UNIQUE_VIOLATION => MetaError::Conflict,
        _ => engine_error(e),
    }
}

fn pg_params(params: &[Val]) -> Vec<Box<dyn postgres::types::ToSql + Sync>> {
    params
        .iter()
        .map(|p| -> Box<dyn postgres::types::ToSql + Sync> {
            match p {
                Val::Int(i) => Box::new(*i),
                Val::Text(t) => Box::new(t.clone()),
                Val::Blob(b) => Box::new(b.clone()),
            }
        })
        .collect()
}

impl Tx for PgTx<'_, '_> {
    fn query(&mut self, sql: &str, params: &[Val]) -> Result<Vec<Vec<Val>>> {
        use postgres::types::Type;
        let owned = pg_params(params);
        let refs: Vec<&(dyn postgres::types::ToSql + Sync)> = owned.iter().map(|b| b.as_ref()).collect();
        let rows = self.0.query(sql, &refs).map_err(pg_error)?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let mut vals = Vec::with_capacity(row.len());
            for (i, col) in row.columns().iter().enumerate() {
                let t = col.type_();
                vals.push(if *t == Type::INT8 {
                    Val::Int(row.try_get::<_, i64>(i).map_err(pg_error)?)
                } else if *t == Type::INT4 {
                    Val::Int(row.try_get::<_, i32>(i).map_err(pg_error)? as i64)
                } else if *t == Type::BYTEA {
                    Val::Blob(row.try_get::<_, Option<Vec<u8>>>(i).map_err(pg_error)?)
                } else {
                    Val::Text(row.try_get::<_, String>(i).map_err(pg_error)?)
                });
            }
            out.push(vals);
        }
        Ok(out)
    }

    fn exec(&mut self, sql: &str, params: &[Val]) -> Result<u64> {
        let owned = pg_params(params);
        let refs: Vec<&(dyn postgres::types::ToSql + Sync)> = owned.iter().map(|b| b.as_ref()).collect();
        self.0.execute(sql, &refs).map_err(pg_error)
    }
}

/// How often a conflicting transaction is retried before the caller hears of it.
const CONFLICT_RETRIES: usize = 20;

impl Engine for Postgres {
    fn run(&self, body: &mut (dyn FnMut(&mut dyn Tx) -> Result<()> + Send)) -> Result<()> {
        self.off_runtime(move |client| {
            for attempt in 0.. {
                let mut tx = client
                    .build_transaction()
                    .isolation_level(postgres::IsolationLevel::Serializable)
                    .start()
                    .map_err(pg_error)?;
                let outcome = body(&mut PgTx(&mut tx));
                let outcome = outcome.and_then(|()| tx.commit().map_err(pg_error));
                match outcome {
                    Err(MetaError::Conflict) if attempt < CONFLICT_RETRIES => {
                        std::thread::sleep(std::time::Duration::from_millis(1 + attempt as u64 * 2));
                    }
                    other => return other,
                }
            }
            unreachable!("the loop returns")
        })
    }

    fn notify(&self, channel: &str, payloads: &[String]) -> Result<()> {
        self.run(&mut |tx| {
            for p in payloads {
                tx.exec("SELECT pg_notify($1, $2)", &[Val::Text(channel.into()), Val::Text(p.clone())])?;
            }
            Ok(())
        })
    }

    fn listen(&self, channel: &str, mut on: Box<dyn FnMut(Notice) -> bool + Send>) -> bool {
        let (url, channel) = (self.url.clone(), channel.to_string());
        let listening = move || {
            let mut down = false;
            loop {
                let client = postgres::Client::connect(&url, postgres::NoTls)
                    .and_then(|mut c| c.batch_execute(&format!("LISTEN \"{channel}\"")).map(|()| c));
                let mut client = match client {
                    Ok(c) => c,
                    Err(e) => {
                        if !std::mem::replace(&mut down, true) {
                            tracing::warn!("listening for other heads' changes: {e}");
                            if !on(Notice::Down) {
                                return;
                            }
                        }
                        if !on(Notice::Idle) {
                            return;
                        }
                        std::thread::sleep(std::time::Duration::from_secs(1));
                        continue;
                    }
                };
                if !on(Notice::Listening) {
                    return;
                }
                let mut checked = std::time::Instant::now();
                loop {
                    let mut broken = false;
                    let mut notices = client.notifications();
                    let mut heard = notices.timeout_iter(std::time::Duration::from_secs(1));
                    loop {
                        match postgres::fallible_iterator::FallibleIterator::next(&mut heard) {
                            Ok(Some(n)) => {
                                if !on(Notice::Payload(n.payload().to_string())) {
                                    return;
                                }
                            }
                            Ok(None) => break,
                            Err(e) => {
                                tracing::warn!("listening for other heads' changes: {e}; connecting again");
                                broken = true;
                                break;
                            }
                        }
                    }
                    drop(heard);
                    drop(notices);
                    if !broken && checked.elapsed() >= LISTEN_CHECK {
                        checked = std::time::Instant::now();
                        broken = client.is_valid(LISTEN_CHECK).is_err();
                    }
                    if broken || client.is_closed() {
                        down = true;
                        if !on(Notice::Down) {
                            return;
                        }
                        break;
                    }
                    if !on(Notice::Idle) {
                        return;
                    }
                }
            }
        };
        std::thread::Builder::new().name("locus-listen".into()).spawn(listening).is_ok()
    }
}
