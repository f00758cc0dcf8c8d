//! A Scriptable RPC case study: client-side caching with a choice of consistency
//! scheme, built on scripts and pushes rather than hard-wired into the server (as the
//! paper builds AFS's and Sprite's protocols on a simple one). Files are cached whole.
//! (`locus mount --consistency nfs|afs|sprite` is another thing: the mount's caching,
//! built on the server's own callbacks; these schemes are named for what they do so that
//! the two are not confused.)
//!
//! - [`Scheme::TimedAttributes`]: attributes are trusted for a timeout; after it a `stat` revalidates
//!   the cached data. Another client's write can stay invisible for up to the timeout.
//! - [`Scheme::CallbackOnOpen`]: the first read registers a callback and fetches the file in one round
//!   trip (`afs.lua`); reads are then local until the server breaks the callback. Writes
//!   stay local until `close`, which stores the file and breaks everyone else's callback.
//! - [`Scheme::UncacheWhenShared`]: opens are recorded at the server (`sprite.lua`); while a file is
//!   write-shared nobody caches it and every read and write goes to the server, so
//!   readers always see the last write.

use crate::{Client, ClientError, Result};
use locus_proto::types::Value;
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

const AFS: &str = include_str!("scripts/afs.lua");
const SPRITE: &str = include_str!("scripts/sprite.lua");

/// A consistency scheme, each built from scripts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    /// Attribute cache with this timeout.
    TimedAttributes { attr_timeout: Duration },
    /// Callback on open, write back on close, invalidation on callback break.
    CallbackOnOpen,
    /// No caching while a file is write-shared.
    UncacheWhenShared,
}

#[derive(Default)]
struct Entry {
    data: Option<Vec<u8>>,
    mtime: Option<(i64, u32, u64)>,
    checked: Option<Instant>,
    dirty: bool,
    /// Sprite: this client recorded an open, and with which mode.
    opened: Option<&'static str>,
    /// Sprite: the server said the file is write-shared.
    uncacheable: bool,
}

/// A client that caches whole files under one consistency [`Scheme`].
pub struct ScriptCache {
    client: Client,
    mode: Scheme,
    cache: Arc<Mutex<HashMap<String, Entry>>>,
    /// Callbacks broken (AFS) or files made uncacheable (Sprite), by path, as they arrive.
    events: Arc<Mutex<HashSet<String>>>,
}

fn failed(values: &[Value]) -> Option<ClientError> {
    match values {
        [Value::Nil, Value::Str(msg), ..] => {
            Some(ClientError::Remote(locus_proto::Error::new(locus_proto::Code::IO, msg.clone())))
        }
        [Value::Nil, ..] => Some(ClientError::Protocol("script failed without a message".into())),
        _ => None,
    }
}

impl ScriptCache {
    /// Wraps a connection; it listens for the server's callback messages from now on.
    pub fn new(client: Client, mode: Scheme) -> ScriptCache {
        let cache: Arc<Mutex<HashMap<String, Entry>>> = Arc::default();
        let events: Arc<Mutex<HashSet<String>>> = Arc::default();
        let mut pushes = client.subscribe();
        let (c, e) = (cache.clone(), events.clone());
        tokio::spawn(async move {
            while let Some(m) = pushes.recv().await {
                let text = String::from_utf8_lossy(&m.data).to_string();
                if let Some(path) = text.strip_prefix("break ") {
                    c.lock().remove(path);
                    e.lock().insert(path.to_string());
                } else if let Some(path) = text.strip_prefix("uncache ") {
                    let mut cache = c.lock();
                    let entry = cache.entry(path.to_string()).or_default();
                    entry.uncacheable = true;
                    if !entry.dirty {
                        entry.data = None;
                    }
                    e.lock().insert(path.to_string());
                }
            }
        });
        ScriptCache { client, mode, cache, events }
    }

    /// The connection underneath.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// True once a callback break (AFS) or an uncache order (Sprite) for `path` arrived.
    pub fn notified(&self, path: &str) -> bool {
        self.events.lock().contains(path)
    }

    /// Reads a whole file under the mode's rules.
    pub async fn read(&self, path: &str) -> Result<Vec<u8>> {
        match self.mode {
            Scheme::TimedAttributes { attr_timeout } => {
                if let Some(e) = self.cache.lock().get(path) {
                    if let (Some(data), Some(t)) = (&e.data, e.checked) {
                        if t.elapsed() < attr_timeout {
                            return Ok(data.clone());
                        }
                    }
                }
                let a = self.client.stat(path).await?;
                let stamp = (a.mtime.sec, a.mtime.nsec, a.size);
                {
                    let mut cache = self.cache.lock();
                    let e = cache.entry(path.to_string()).or_default();
                    if e.mtime == Some(stamp) {
                        if let Some(data) = &e.data {
                            e.checked = Some(Instant::now());
                            return Ok(data.clone());
                        }
                    }
                }
                let data = self.client.read_file(path).await?;
                let mut cache = self.cache.lock();
                let e = cache.entry(path.to_string()).or_default();
                (e.data, e.mtime, e.checked) = (Some(data.clone()), Some(stamp), Some(Instant::now()));
                Ok(data)
            }
            Scheme::CallbackOnOpen => {
                if let Some(Entry { data: Some(d), .. }) = self.cache.lock().get(path) {
                    return Ok(d.clone());
                }
                let (values, out) =
                    self.client.script_call(AFS, vec![Value::Str("open".into()), Value::Str(path.into())], &[]).await?;
                if let Some(e) = failed(&values) {
                    return Err(e);
                }
                self.cache.lock().entry(path.to_string()).or_default().data = Some(out.to_vec());
                Ok(out.to_vec())
            }
            Scheme::UncacheWhenShared => {
                let cacheable = self.sprite_open(path, "r").await?;
                if cacheable {
                    if let Some(Entry { data: Some(d), .. }) = self.cache.lock().get(path) {
                        return Ok(d.clone());
                    }
                }
                let data = self.client.read_file(path).await?;
                let mut cache = self.cache.lock();
                let e = cache.entry(path.to_string()).or_default();
                if !e.uncacheable {
                    e.data = Some(data.clone());
                }
                Ok(data)
            }
        }
    }

    /// Writes a whole file under the mode's rules (NFS: through to the server; AFS: kept
    /// until `close`; Sprite: kept until `close` unless the file is write-shared).
    pub async fn write(&self, path: &str, data: &[u8]) -> Result<()> {
        match self.mode {
            Scheme::TimedAttributes { .. } => {
                let a = self.client.write_file(path, 0o644, data).await?;
                let mut cache = self.cache.lock();
                let e = cache.entry(path.to_string()).or_default();
                (e.data, e.mtime, e.checked) =
                    (Some(data.to_vec()), Some((a.mtime.sec, a.mtime.nsec, a.size)), Some(Instant::now()));
                Ok(())
            }
            Scheme::CallbackOnOpen => {
                let mut cache = self.cache.lock();
                let e = cache.entry(path.to_string()).or_default();
                (e.data, e.dirty) = (Some(data.to_vec()), true);
                Ok(())
            }
            Scheme::UncacheWhenShared => {
                let cacheable = self.sprite_open(path, "w").await?;
                if cacheable {
                    let mut cache = self.cache.lock();
                    let e = cache.entry(path.to_string()).or_default();
                    (e.data, e.dirty) = (Some(data.to_vec()), true);
                    return Ok(());
                }
                self.client.write_file(path, 0o644, data).await.map(drop)
            }
        }
    }

    /// Ends this client's use of a file: stores what it wrote (AFS breaks the other
    /// clients' callbacks; Sprite forgets the open).
    pub async fn close(&self, path: &str) -> Result<()> {
        let (dirty, opened) = {
            let mut cache = self.cache.lock();
            match cache.get_mut(path) {
                Some(e) => {
                    let d = if e.dirty { e.data.clone() } else { None };
                    e.dirty = false;
                    (d, e.opened.take())
                }
                None => (None, None),
            }
        };
        match self.mode {
            Scheme::TimedAttributes { .. } => Ok(()),
            Scheme::CallbackOnOpen => {
                if let Some(data) = dirty {
                    let (values, _) = self
                        .client
                        .script_call(AFS, vec![Value::Str("close".into()), Value::Str(path.into())], &data)
                        .await?;
                    if let Some(e) = failed(&values) {
                        return Err(e);
                    }
                }
                Ok(())
            }
            Scheme::UncacheWhenShared => {
                if let Some(data) = dirty {
                    self.client.write_file(path, 0o644, &data).await?;
                }
                if opened.is_some() {
                    self.client
                        .script_call(SPRITE, vec![Value::Str("close".into()), Value::Str(path.into())], &[])
                        .await?;
                    if let Some(e) = self.cache.lock().get_mut(path) {
                        (e.data, e.uncacheable) = (None, false);
                    }
                }
                Ok(())
            }
        }
    }

    /// Records a Sprite open once per mode upgrade; returns whether caching is allowed.
    async fn sprite_open(&self, path: &str, mode: &'static str) -> Result<bool> {
        let need = {
            let cache = self.cache.lock();
            match cache.get(path).and_then(|e| e.opened) {
                Some("w") => false,
                Some(_) => mode == "w",
                None => true,
            }
        };
        if need {
            let args = vec![Value::Str("open".into()), Value::Str(path.into()), Value::Str(mode.into())];
            let (values, _) = self.client.script_call(SPRITE, args, &[]).await?;
            if let Some(e) = failed(&values) {
                return Err(e);
            }
            let mut cache = self.cache.lock();
            let e = cache.entry(path.to_string()).or_default();
            e.opened = Some(mode);
            if values.first() == Some(&Value::Bool(false)) {
                e.uncacheable = true;
            }
        }
        Ok(!self.cache.lock().get(path).is_some_and(|e| e.uncacheable))
    }
}
