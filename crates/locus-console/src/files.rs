//! The tree: listings, a text preview, ranged downloads and uploads, each done by a
//! session acting as the logged-in subject (the same calls, ACL checks and callback
//! breaks as the native protocol's), on one server or a cluster head alike
//! ([`locus_server::acting::Acting`]).

use crate::auth::User;
use crate::{error, json, next_frame, query, wire_error, Req, Resp};
use bytes::Bytes;
use hyper::header::{self, HeaderValue};
use hyper::StatusCode;
use locus_proto::ops::{Open, Pread, Readdir};
use locus_proto::types::{open_flags, Attr};
use locus_proto::{Code, Error as WireError};
use locus_server::acting::Acting;
use locus_server::Shared;
use std::sync::Arc;

/// Bytes of a file the preview shows.
pub const PREVIEW_BYTES: usize = 64 << 10;

/// Runs file-system work off the async threads, as `user`.
async fn as_user<T: Send + 'static>(
    shared: &Arc<Shared>,
    user: &User,
    work: impl FnOnce(&mut Acting) -> Result<T, WireError> + Send + 'static,
) -> Result<T, WireError> {
    let (shared, subject) = (shared.clone(), user.subject.clone());
    tokio::task::spawn_blocking(move || work(&mut Acting::new(&shared, &subject)))
        .await
        .unwrap_or_else(|e| Err(WireError::new(Code::IO, format!("the request failed: {e}"))))
}

/// The `path` parameter: absolute, within the export.
fn path_of(req: &Req) -> Option<String> {
    query(req, "path").filter(|p| p.starts_with('/') && !p.contains('\0'))
}

fn bad_path() -> Resp {
    error(StatusCode::BAD_REQUEST, "give path=/... (absolute, within the export)")
}

/// `GET /api/list?path=DIR`: the entries with kind, size, mode and modification time.
pub async fn list(shared: &Arc<Shared>, user: &User, req: &Req) -> Resp {
    let Some(path) = path_of(req) else { return bad_path() };
    let listed = as_user(shared, user, move |s| {
        let entries: Vec<_> = s.call(&Readdir { path: path.clone() }, Bytes::new())?.0.into_iter().flatten().collect();
        // What the subject may do here, for the page to offer only that (an upload
        // needs `w`).
        let rights = s.rights(&path).to_string();
        Ok((path, entries, rights))
    })
    .await;
    match listed {
        Ok((path, mut entries, rights)) => {
            entries.sort_by(|a, b| b.attr.is_dir().cmp(&a.attr.is_dir()).then_with(|| a.name.cmp(&b.name)));
            let entries: Vec<_> = entries
                .iter()
                .map(|e| {
                    let kind = match &e.attr {
                        a if a.is_dir() => "dir",
                        a if a.is_symlink() => "link",
                        a if a.is_file() => "file",
                        _ => "other",
                    };
                    serde_json::json!({
                        "name": e.name,
                        "kind": kind,
                        "size": e.attr.size,
                        "mode": format!("{:o}", e.attr.mode & 0o7777),
                        "mtime": e.attr.mtime.sec,
                    })
                })
                .collect();
            json(StatusCode::OK, &serde_json::json!({ "path": path, "entries": entries, "rights": rights }))
        }
        Err(e) => wire_error(&e),
    }
}

/// Opens `path` for reading: its attributes and handle (a plain file only).
fn open_file(s: &mut Acting, path: String) -> Result<(Attr, u64), WireError> {
    let (opened, _) = s.call(&Open { path, flags: open_flags::READ, mode: 0 }, Bytes::new())?;
    let opened = opened.into_iter().next().ok_or_else(|| WireError::new(Code::IO, "open answered nothing"))?;
    if !opened.attr.is_file() {
        return Err(WireError::new(Code::NOTSUP, "not a plain file"));
    }
    Ok((opened.attr, opened.handle))
}

/// `GET /api/preview?path=FILE`: the first 64 KiB as text, or word that it is binary.
pub async fn preview(shared: &Arc<Shared>, user: &User, req: &Req) -> Resp {
    let Some(path) = path_of(req) else { return bad_path() };
    let read = as_user(shared, user, move |s| {
        let (attr, handle) = open_file(s, path)?;
        let len = PREVIEW_BYTES.min(attr.size as usize) as u32;
        let (_, bytes) = s.call(&Pread { handle, offset: 0, len }, Bytes::new())?;
        Ok((attr.size, bytes))
    })
    .await;
    match read {
        Ok((size, bytes)) => {
            let text = match std::str::from_utf8(&bytes) {
                Ok(t) => Some(t),
                // Cut in the middle of a character at the end of the preview.
                Err(e) if e.error_len().is_none() => std::str::from_utf8(&bytes[..e.valid_up_to()]).ok(),
                Err(_) => None,
            }
            .filter(|t| !t.contains('\0'));
            json(
                StatusCode::OK,
                &serde_json::json!({
                    "size": size,
                    "text": text,
                    "truncated": (bytes.len() as u64) < size,
                }),
            )
        }
        Err(e) => wire_error(&e),
    }
}

/// `GET /api/download?path=FILE`: the bytes, with `Range` honoured (one range).
pub async fn download(shared: &Arc<Shared>, user: &User, req: &Req) -> Resp {
    let Some(path) = path_of(req) else { return bad_path() };
    let (shared_, subject) = (shared.clone(), user.subject.clone());
    let opened = tokio::task::spawn_blocking(move || {
        let mut s = Acting::new(&shared_, &subject);
        open_file(&mut s, path).map(|(attr, handle)| (attr, Arc::new(parking_lot::Mutex::new((s, handle)))))
    })
    .await
    .unwrap_or_else(|e| Err(WireError::new(Code::IO, format!("the request failed: {e}"))));
    let (attr, file) = match opened {
        Ok(o) => o,
        Err(e) => return wire_error(&e),
    };
    let etag = format!("\"{}.{}.{}\"", attr.ino, attr.mtime.sec, attr.mtime.nsec);
    let name = query(req, "path").unwrap_or_default().rsplit('/').next().unwrap_or("file").to_string();
    let mut r = locus_server::http::ranged(req, attr.size, &etag, move |offset, len| {
        let file = file.clone();
        async move {
            tokio::task::spawn_blocking(move || {
                let (session, handle) = &mut *file.lock();
                let read = session.call(&Pread { handle: *handle, offset, len: len as u32 }, Bytes::new());
                read.map(|(_, data)| Bytes::from(data)).map_err(|e| std::io::Error::other(e.to_string()))
            })
            .await
            .map_err(std::io::Error::other)?
        }
    });
    // The name goes in the RFC 5987 form, so any UTF-8 name survives.
    const ATTR_CHAR: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'!')
        .remove(b'#')
        .remove(b'$')
        .remove(b'&')
        .remove(b'+')
        .remove(b'-')
        .remove(b'.')
        .remove(b'^')
        .remove(b'_')
        .remove(b'`')
        .remove(b'|')
        .remove(b'~');
    let encoded = percent_encoding::utf8_percent_encode(&name, ATTR_CHAR);
    if let Ok(v) = HeaderValue::from_str(&format!("attachment; filename*=UTF-8''{encoded}")) {
        r.headers_mut().insert(header::CONTENT_DISPOSITION, v);
    }
    r
}

/// `PUT /api/upload?path=FILE` with the bytes as the body: stored as `put` stores, in a
/// hidden temporary file made visible by one atomic rename once complete. An upload
/// that fails or is cut off leaves the old file as it was.
pub async fn upload(shared: &Arc<Shared>, user: &User, req: Req) -> Resp {
    let Some(path) = path_of(&req) else { return bad_path() };
    let mut session = Acting::new(shared, &user.subject);
    let started = tokio::task::block_in_place(|| session.put_start(&path, 0o644));
    if let Err(e) = started {
        return wire_error(&e);
    }
    let mut body = req.into_body();
    let mut size = 0u64;
    loop {
        let data = match next_frame(&mut body).await {
            Some(Ok(frame)) => match frame.into_data() {
                Ok(d) => d,
                Err(_) => continue,
            },
            // The temporary file goes with the session.
            Some(Err(e)) => return error(StatusCode::BAD_REQUEST, format!("the upload was cut off: {e}")),
            None => Bytes::new(),
        };
        let last = data.is_empty();
        size += data.len() as u64;
        if let Err(e) = tokio::task::block_in_place(|| session.put_more(&data, last)) {
            return wire_error(&e);
        }
        if last {
            tracing::info!(subject = %user.subject, path, size, "console upload");
            return json(StatusCode::OK, &serde_json::json!({ "path": path, "size": size }));
        }
    }
}
