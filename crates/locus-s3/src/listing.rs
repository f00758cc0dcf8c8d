//! Listings in S3's order: the keys of a bucket sorted by their bytes, as the
//! directories beneath it hold them, with a prefix, a delimiter, a page size and a place
//! to start after.
//!
//! A directory's entries are walked in the order of their keys: a directory `d` holds
//! keys starting `d/`, so it sorts as `d/` among its siblings (after `d.txt`, before
//! `d0`). Directories that cannot hold a key in range are not read. An empty directory
//! is listed as its own key `d/`, so a directory made with a `PUT` of `d/` lists again.

use bytes::Bytes;
use locus_proto::ops::Readdir;
use locus_proto::types::{Attr, DirEntry};
use locus_proto::{Code, Error as WireError};
use locus_server::acting::Acting;

/// One listed item: an object, or a common prefix rolled up by the delimiter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Item {
    /// A key, its file's path and attributes.
    Key { key: String, path: String, attr: Attr },
    /// A common prefix.
    Prefix(String),
}

impl Item {
    /// The key or prefix, where the next page starts after.
    pub fn name(&self) -> &str {
        match self {
            Item::Key { key, .. } => key,
            Item::Prefix(p) => p,
        }
    }
}

/// A listing request.
pub struct Query<'a> {
    pub bucket_dir: &'a str,
    pub prefix: &'a str,
    pub delimiter: Option<&'a str>,
    /// Only keys after this one.
    pub after: &'a str,
    /// `after` is a common prefix: every key starting with it was listed already.
    pub after_prefix: bool,
    pub max: usize,
}

/// A page of a listing.
#[derive(Debug, Default)]
pub struct Page {
    pub items: Vec<Item>,
    /// More items follow the last one.
    pub truncated: bool,
}

struct Walk<'q, 's> {
    q: &'q Query<'q>,
    session: &'s mut Acting,
    page: Page,
}

impl Walk<'_, '_> {
    /// Whether `key` is past where the listing starts.
    fn after_start(&self, key: &str) -> bool {
        key > self.q.after && !(self.q.after_prefix && !self.q.after.is_empty() && key.starts_with(self.q.after))
    }

    /// Adds an item; false once the page is full and one more was seen.
    fn emit(&mut self, item: Item) -> bool {
        if let (Item::Prefix(p), Some(Item::Prefix(last))) = (&item, self.page.items.last()) {
            if p == last {
                return true;
            }
        }
        if self.page.items.len() == self.q.max {
            self.page.truncated = true;
            return false;
        }
        self.page.items.push(item);
        true
    }

    /// The common prefix `key` rolls up to, if the delimiter occurs after the prefix.
    fn rolled_up(&self, key: &str) -> Option<String> {
        let d = self.q.delimiter.filter(|d| !d.is_empty())?;
        let rest = &key[self.q.prefix.len()..];
        rest.find(d).map(|i| key[..self.q.prefix.len() + i + d.len()].to_string())
    }

    /// Walks the directory at `path` whose keys start with `key_prefix` (empty, or
    /// ending with `/`): whether to go on (false once the page is full), and whether the
    /// directory holds anything.
    fn dir(&mut self, path: &str, key_prefix: &str) -> Result<(bool, bool), WireError> {
        let pages = match self.session.call(&Readdir { path: path.to_string() }, Bytes::new()) {
            Ok((pages, _)) => pages,
            // Beneath the bucket, a directory that went away meanwhile or that the
            // subject may not list holds nothing it can see; the listing goes on.
            Err(e)
                if path != self.q.bucket_dir
                    && matches!(e.code, Code::NOENT | Code::NOTDIR | Code::ACCES | Code::PERM) =>
            {
                return Ok((true, true))
            }
            Err(e) => return Err(e),
        };
        let mut entries: Vec<(String, DirEntry)> = pages
            .into_iter()
            .flatten()
            .map(|e| {
                let key = if e.attr.is_dir() {
                    format!("{key_prefix}{}/", e.name)
                } else {
                    format!("{key_prefix}{}", e.name)
                };
                (key, e)
            })
            .collect();
        let held = !entries.is_empty();
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        let prefix = self.q.prefix;
        for (key, e) in entries {
            let into_prefix = key.starts_with(prefix);
            let toward_prefix = prefix.starts_with(key.as_str());
            if !into_prefix && !toward_prefix {
                continue;
            }
            let child = locus_proto::path::join(path, &e.name);
            if e.attr.is_dir() {
                // Every key beneath starts with `key`: skip what lies wholly before the start.
                let before_start = key.as_str() <= self.q.after && !self.q.after.starts_with(key.as_str());
                if before_start || (self.q.after_prefix && key.starts_with(self.q.after) && !self.q.after.is_empty()) {
                    continue;
                }
                if into_prefix && key.len() > prefix.len() {
                    if let Some(rolled) = self.rolled_up(&key) {
                        if self.after_start(&rolled) && !self.emit(Item::Prefix(rolled)) {
                            return Ok((false, held));
                        }
                        continue;
                    }
                }
                let (go_on, holds) = self.dir(&child, &key)?;
                if !go_on {
                    return Ok((false, held));
                }
                // Nothing beneath: the directory is its own (empty) object.
                if !holds
                    && into_prefix
                    && self.after_start(&key)
                    && !self.emit(Item::Key { key, path: child, attr: Attr { size: 0, ..e.attr } })
                {
                    return Ok((false, held));
                }
            } else if into_prefix && self.after_start(&key) {
                let item = match self.rolled_up(&key) {
                    Some(rolled) => Item::Prefix(rolled),
                    None => Item::Key { key, path: child, attr: e.attr },
                };
                if !self.emit(item) {
                    return Ok((false, held));
                }
            }
        }
        Ok((true, held))
    }
}

/// One page of the keys of a bucket, as `session`'s subject may list them.
pub fn list(session: &mut Acting, q: &Query<'_>) -> Result<Page, WireError> {
    let mut walk = Walk { q, session, page: Page::default() };
    walk.dir(q.bucket_dir, "")?;
    debug_assert!(walk.page.items.iter().all(|i| i.name().starts_with(q.prefix)));
    Ok(walk.page)
}

/// Encodes where the next page starts (opaque to clients).
pub fn continuation(item: &Item) -> String {
    let kind = if matches!(item, Item::Prefix(_)) { 'p' } else { 'k' };
    hex::encode(format!("{kind}{}", item.name()))
}

/// Decodes a continuation token: the name to start after, and whether it was a prefix.
pub fn resume(token: &str) -> Option<(String, bool)> {
    let text = String::from_utf8(hex::decode(token).ok()?).ok()?;
    let mut chars = text.chars();
    let kind = chars.next()?;
    let rest = chars.as_str().to_string();
    match kind {
        'p' => Some((rest, true)),
        'k' => Some((rest, false)),
        _ => None,
    }
}
