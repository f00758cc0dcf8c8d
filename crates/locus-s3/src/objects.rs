//! Objects: reading (whole, ranged, conditional, or an active file's output as it is
//! made), writing (streamed into a hidden file made visible by one rename, its MD5
//! computed on the way), removing and copying, each as the requesting subject.

use crate::checksums::Checksum;
use crate::meta::{Record, Records, EMPTY_ETAG};
use crate::names::{self, object_error, ObjectPath};
use bytes::Bytes;
use futures::StreamExt;
use locus_proto::ops::{AclGet, Close, CopyFile, Mkdir, Open, Pread, Rmdir, Unlink, PUT_NEW};
use locus_proto::types::{open_flags, Attr};
use locus_proto::{Code, Error as WireError};
use locus_server::acting::Acting;
use locus_server::active::Found;
use locus_server::Shared;
use md5::{Digest, Md5};
use s3s::dto::{Checksum as Sums, ETagCondition, StreamingBlob, Timestamp};
use s3s::{S3Error, S3ErrorCode, S3Result};
use std::sync::Arc;

/// The bytes a read asks for at once.
const CHUNK: u64 = 1 << 20;
/// The largest object a single `PUT` stores (S3's own bound).
pub const MAX_PUT: u64 = 5 << 30;

/// Runs `work` with a session acting as `subject`, on a thread that may block.
pub async fn acting<T: Send + 'static>(
    shared: &Arc<Shared>,
    subject: &str,
    work: impl FnOnce(&mut Acting) -> T + Send + 'static,
) -> S3Result<T> {
    let (shared, subject) = (shared.clone(), subject.to_string());
    tokio::task::spawn_blocking(move || work(&mut Acting::new(&shared, &subject)))
        .await
        .map_err(|e| S3Error::with_message(S3ErrorCode::InternalError, e.to_string()))
}

/// The last-modified time of `attr`, as S3 gives it.
pub fn modified(attr: &Attr) -> Timestamp {
    let t = time::OffsetDateTime::from_unix_timestamp(attr.mtime.sec).unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    Timestamp::from(t)
}

/// The conditional headers of a read.
#[derive(Clone, Default)]
pub struct Conditions {
    pub if_match: Option<ETagCondition>,
    pub if_none_match: Option<ETagCondition>,
    pub if_modified_since: Option<Timestamp>,
    pub if_unmodified_since: Option<Timestamp>,
}

fn matches(cond: &ETagCondition, etag: &str) -> bool {
    match cond {
        ETagCondition::Any => true,
        ETagCondition::ETag(e) => e.value() == etag,
    }
}

impl Conditions {
    /// Checks the conditions in RFC 9110's order: a failed `If-Match` or
    /// `If-Unmodified-Since` is `412`, a met `If-None-Match` or an unmet
    /// `If-Modified-Since` is `304`.
    pub fn check(&self, etag: &str, attr: &Attr) -> S3Result<()> {
        let mtime = attr.mtime.sec;
        let secs = |t: &Timestamp| time::OffsetDateTime::from(t.clone()).unix_timestamp();
        match (&self.if_match, &self.if_unmodified_since) {
            (Some(c), _) if !matches(c, etag) => return Err(S3Error::new(S3ErrorCode::PreconditionFailed)),
            (None, Some(t)) if mtime > secs(t) => return Err(S3Error::new(S3ErrorCode::PreconditionFailed)),
            _ => {}
        }
        match (&self.if_none_match, &self.if_modified_since) {
            (Some(c), _) if matches(c, etag) => Err(S3Error::new(S3ErrorCode::NotModified)),
            (None, Some(t)) if mtime <= secs(t) => Err(S3Error::new(S3ErrorCode::NotModified)),
            _ => Ok(()),
        }
    }
}

/// Where an object's bytes come from.
enum Source {
    /// A file opened through the subject's session.
    Session(Acting, u64),
    /// An active file's kept result.
    Result(locus_store::OpenFile),
    /// An active file whose handler is still writing it.
    Growing(locus_store::OpenFile, Arc<locus_server::active::Run>),
    /// A directory, read as an empty object.
    Nothing,
}

/// An object found for reading.
pub struct Readable {
    /// Its attributes (for an active file still being made, the size is not final).
    pub attr: Attr,
    /// Its S3 facts.
    pub record: Record,
    /// Its size is not known yet: an active file still being made.
    pub growing: bool,
    source: Source,
}

/// Opens the object at `op` for reading as `subject`; a missing key whose name invokes an
/// active-file handler runs it (on a single server).
pub async fn open(shared: &Arc<Shared>, records: &Records, subject: &str, op: &ObjectPath) -> S3Result<Readable> {
    let (path, is_dir) = (op.path.clone(), op.is_dir);
    let (shared_, subject_) = (shared.clone(), subject.to_string());
    let (session, opened) = tokio::task::spawn_blocking(move || {
        let mut s = Acting::new(&shared_, &subject_);
        let flags = if is_dir { open_flags::READ | open_flags::DIRECTORY } else { open_flags::READ };
        let opened = s.call(&Open { path, flags, mode: 0 }, Bytes::new());
        (s, opened)
    })
    .await
    .map_err(|e| S3Error::with_message(S3ErrorCode::InternalError, e.to_string()))?;
    let opened = match opened {
        Ok((pages, _)) => pages.into_iter().next().ok_or_else(|| WireError::new(Code::IO, "open answered nothing")),
        Err(e) if e.code == Code::NOENT && !is_dir && !shared.is_head() => {
            return open_active(shared, subject, &op.path).await
        }
        Err(e) => Err(e),
    }
    .map_err(object_error)?;
    if opened.attr.is_dir() != is_dir {
        return Err(S3Error::with_message(S3ErrorCode::NoSuchKey, "that key names a directory"));
    }
    if is_dir {
        // The type s3fs and other file-system gateways give (and look for on) directories.
        let content_type = Some("application/x-directory".to_string());
        let record = Record { etag: EMPTY_ETAG.into(), content_type, ..Default::default() };
        let attr = Attr { size: 0, ..opened.attr };
        return Ok(Readable { attr, record, growing: false, source: Source::Nothing });
    }
    let record = records.get_or_derive(&op.path, &opened.attr);
    Ok(Readable { attr: opened.attr, record, growing: false, source: Source::Session(session, opened.handle) })
}

async fn open_active(shared: &Arc<Shared>, subject: &str, path: &str) -> S3Result<Readable> {
    let missing = || S3Error::with_message(S3ErrorCode::NoSuchKey, "no such key");
    let (shared_, subject, path) = (shared.clone(), subject.to_string(), path.to_string());
    let found = tokio::task::spawn_blocking(move || shared_.active.find(&shared_, &subject, &path))
        .await
        .map_err(|e| S3Error::with_message(S3ErrorCode::InternalError, e.to_string()))?
        .map_err(object_error)?
        .ok_or_else(missing)?;
    let (file, run) = match found {
        Found::Ready(file) => (file, None),
        Found::Running(file, run) => {
            // Its first bytes, or its failure, before anything is answered.
            if let Some(Err(e)) = run.wait(1).await.end {
                return Err(object_error(e));
            }
            (file, Some(run))
        }
    };
    let attr = locus_server::active::attr(&file).map_err(object_error)?;
    let record = Record { etag: crate::meta::derived_etag(&attr), ..Default::default() };
    Ok(match run {
        None => Readable { attr, record, growing: false, source: Source::Result(file) },
        Some(run) => Readable { attr, record, growing: true, source: Source::Growing(file, run) },
    })
}

impl Readable {
    /// Whether the bytes are a file of the export (not an active file's output).
    pub fn is_stored(&self) -> bool {
        matches!(self.source, Source::Session(..) | Source::Nothing)
    }

    /// The bytes `start..end` as a stream (to the end of the output, for a growing one).
    pub fn body(self, start: u64, end: u64) -> StreamingBlob {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(4);
        match self.source {
            Source::Nothing => {}
            Source::Growing(file, run) => {
                tokio::spawn(follow(file, run, tx));
            }
            Source::Session(mut session, handle) => {
                tokio::task::spawn_blocking(move || {
                    let read = |offset, len| {
                        session
                            .call(&Pread { handle, offset, len: len as u32 }, Bytes::new())
                            .map(|(_, d)| Bytes::from(d))
                            .map_err(|e| std::io::Error::other(e.message))
                    };
                    send_range(read, start, end, &tx);
                    let _ = session.call(&Close { handle }, Bytes::new());
                });
            }
            Source::Result(file) => {
                tokio::task::spawn_blocking(move || {
                    let read = |offset, len| file.pread(offset, len).map(Bytes::from).map_err(std::io::Error::other);
                    send_range(read, start, end, &tx);
                });
            }
        }
        let mut rx = rx;
        StreamingBlob::wrap(futures::stream::poll_fn(move |cx| rx.poll_recv(cx)))
    }
}

fn send_range(
    mut read: impl FnMut(u64, usize) -> std::io::Result<Bytes>,
    start: u64,
    end: u64,
    tx: &tokio::sync::mpsc::Sender<std::io::Result<Bytes>>,
) {
    let mut offset = start;
    while offset < end {
        let len = (end - offset).min(CHUNK) as usize;
        let got = read(offset, len);
        let stop = match &got {
            Ok(b) if b.is_empty() => true,
            Ok(b) => {
                offset += b.len() as u64;
                false
            }
            Err(_) => true,
        };
        // A short file (truncated meanwhile) ends the body early: the client sees fewer
        // bytes than the length it was told, and fails the read. A client that stops
        // reading for [`crate::IDLE`] lets this thread go.
        let sent = tokio::runtime::Handle::current().block_on(tokio::time::timeout(crate::IDLE, tx.send(got)));
        if !matches!(sent, Ok(Ok(()))) || stop {
            return;
        }
    }
}

async fn follow(
    file: locus_store::OpenFile,
    run: Arc<locus_server::active::Run>,
    tx: tokio::sync::mpsc::Sender<std::io::Result<Bytes>>,
) {
    let file = Arc::new(file);
    let mut offset = 0u64;
    loop {
        let progress = run.wait(offset + 1).await;
        if let Some(Err(e)) = progress.end {
            let _ = tx.send(Err(std::io::Error::other(e.message))).await;
            return;
        }
        while progress.written > offset {
            let len = (progress.written - offset).min(CHUNK) as usize;
            let f = file.clone();
            let got = tokio::task::spawn_blocking(move || f.pread(offset, len)).await;
            let bytes = match got {
                Ok(Ok(b)) if !b.is_empty() => b,
                _ => {
                    let _ = tx.send(Err(std::io::Error::other("the handler's output could not be read"))).await;
                    return;
                }
            };
            offset += bytes.len() as u64;
            if tx.send(Ok(Bytes::from(bytes))).await.is_err() {
                return;
            }
        }
        if progress.end.is_some() {
            return;
        }
    }
}

/// The object a copy reads (CopyObject, UploadPartCopy) as `subject`, its conditions
/// checked: a source that is not modified answers 412 here, as S3 does for copies.
pub async fn copy_source(
    shared: &Arc<Shared>,
    records: &Records,
    subject: &str,
    source: &s3s::dto::CopySource,
    conditions: Conditions,
) -> S3Result<(ObjectPath, Readable)> {
    let s3s::dto::CopySource::Bucket { bucket, key, version_id } = source else {
        return Err(S3Error::with_message(S3ErrorCode::NotImplemented, "copies from access points are not offered"));
    };
    if version_id.is_some() {
        return Err(S3Error::with_message(S3ErrorCode::NotImplemented, "Locus keeps no object versions"));
    }
    let from = names::object_path(bucket, key)?;
    let source = open(shared, records, subject, &from).await?;
    conditions.check(&source.record.etag, &source.attr).map_err(|e| match e.code() {
        S3ErrorCode::NotModified => S3Error::new(S3ErrorCode::PreconditionFailed),
        _ => e,
    })?;
    Ok((from, source))
}

/// Whether a write's conditions make it create-only (`If-None-Match: *`); any other
/// condition on a write is `NotImplemented`.
pub fn create_only(if_match: &Option<ETagCondition>, if_none_match: &Option<ETagCondition>) -> S3Result<bool> {
    if if_match.is_some() || if_none_match.as_ref().is_some_and(|c| !c.is_any()) {
        return Err(S3Error::with_message(
            S3ErrorCode::NotImplemented,
            "conditional writes other than If-None-Match: * are not offered",
        ));
    }
    Ok(if_none_match.is_some())
}

/// The error of a create-only upload's end (`PUT_NEW`): a name taken meanwhile is S3's
/// `PreconditionFailed`.
pub fn upload_error(e: WireError, create_only: bool) -> S3Error {
    match e.code == Code::EXIST && create_only {
        true => S3Error::new(S3ErrorCode::PreconditionFailed),
        false => object_error(e),
    }
}

/// What a `PUT` stores besides the bytes.
#[derive(Default)]
pub struct PutMeta {
    pub content_type: Option<String>,
    pub metadata: std::collections::BTreeMap<String, String>,
    /// The `Content-MD5` the client sent, decoded.
    pub content_md5: Option<[u8; 16]>,
    /// The `x-amz-checksum-*` the client asked the door to check.
    pub checksum: Option<Checksum>,
    /// The `Content-Length` the client declared (of the decoded bytes).
    pub length: Option<u64>,
    /// Create only (`If-None-Match: *`): `PreconditionFailed` if the key holds an object
    /// when the upload ends, however it came there meanwhile.
    pub create_only: bool,
}

/// Decodes a `Content-MD5` header, or answers `InvalidDigest`.
pub fn content_md5(header: Option<&str>) -> S3Result<Option<[u8; 16]>> {
    use base64::Engine;
    let Some(text) = header else { return Ok(None) };
    let bytes = base64::engine::general_purpose::STANDARD.decode(text.trim()).ok();
    match bytes.and_then(|b| <[u8; 16]>::try_from(b).ok()) {
        Some(d) => Ok(Some(d)),
        None => Err(S3Error::with_message(S3ErrorCode::InvalidDigest, "Content-MD5 is not the base64 of 16 bytes")),
    }
}

/// Makes the directory `dir` and those above it, up to `op`'s bucket (which must exist).
pub fn make_dirs(s: &mut Acting, op: &ObjectPath, dir: &str) -> S3Result<()> {
    let mut at = op.bucket_dir.clone();
    let below = dir.strip_prefix(&op.bucket_dir).unwrap_or("");
    for seg in below.split('/').filter(|x| !x.is_empty()) {
        at.push('/');
        at.push_str(seg);
        match s.call(&Mkdir { path: at.clone(), mode: 0o755 }, Bytes::new()) {
            Ok(_) => {}
            Err(e) if e.code == Code::EXIST => {}
            Err(e) if e.code == Code::NOENT && at.matches('/').count() == 2 => {
                return Err(S3Error::with_message(S3ErrorCode::NoSuchBucket, "no such bucket"))
            }
            Err(e) => return Err(object_error(e)),
        }
    }
    Ok(())
}

/// Starts a whole-file upload to `op` with `mode` (maybe with `PUT_NEW`), making the
/// directories above it first (a cluster head finds a missing one only when the upload
/// ends).
pub fn start_upload(session: &mut Acting, op: &ObjectPath, mode: u32) -> S3Result<()> {
    let dir = names::parent(&op.path);
    if dir != op.bucket_dir {
        match session.call(&locus_proto::ops::Stat { path: dir.to_string() }, Bytes::new()) {
            Err(e) if e.code == Code::NOENT => make_dirs(session, op, dir)?,
            _ => {}
        }
    }
    match session.put_start(&op.path, mode) {
        Err(e) if e.code == Code::NOENT && dir == op.bucket_dir => {
            Err(S3Error::with_message(S3ErrorCode::NoSuchBucket, "no such bucket"))
        }
        other => other.map_err(|e| upload_error(e, mode & PUT_NEW != 0)),
    }
}

/// How many bytes of a body are gathered before they are written: hyper hands a body
/// over in pieces of tens of kilobytes, and a write (and a move off the async
/// runtime's thread) per piece would cost more than the bytes.
pub const BATCH: usize = 1 << 20;

/// The next piece of a request's body, or an error once it has sent nothing for
/// [`crate::IDLE`] (a hung client must not hold an upload open).
pub async fn next_piece(body: &mut StreamingBlob) -> S3Result<Option<Bytes>> {
    match tokio::time::timeout(crate::IDLE, body.next()).await {
        Err(_) => Err(S3Error::with_message(S3ErrorCode::RequestTimeout, "the body stopped coming")),
        Ok(None) => Ok(None),
        Ok(Some(Err(e))) => Err(S3Error::with_message(S3ErrorCode::IncompleteBody, e.to_string())),
        Ok(Some(Ok(b))) => Ok(Some(b)),
    }
}

/// Reads `body` to its end, handing its bytes to `write` in batches of at most
/// [`BATCH`] (a piece that large on its own goes as it is), each under `block_in_place`
/// (the runtime moves its other tasks off this thread meanwhile); answers their count
/// and MD5, and feeds them to the `checksum` the client asked for. A body past
/// [`MAX_PUT`] is refused with `too_large` as the reason, and one past its `declared`
/// length before the bytes beyond it are handed on (the parser does not hold an
/// `aws-chunked` body to its decoded length, and a part written in place must never
/// reach the next part's place).
pub async fn drain(
    body: Option<StreamingBlob>,
    declared: Option<u64>,
    too_large: &str,
    mut checksum: Option<&mut Checksum>,
    mut write: impl FnMut(&[u8]) -> S3Result<()>,
) -> S3Result<(u64, [u8; 16])> {
    let mut md5 = Md5::new();
    let mut size = 0u64;
    let Some(mut body) = body else { return Ok((0, md5.finalize().into())) };
    let mut batch = Vec::new();
    while let Some(piece) = next_piece(&mut body).await? {
        size += piece.len() as u64;
        if size > MAX_PUT {
            return Err(S3Error::with_message(S3ErrorCode::EntityTooLarge, too_large.to_string()));
        }
        if declared.is_some_and(|d| size > d) {
            return Err(S3Error::with_message(S3ErrorCode::InvalidRequest, "more bytes came than the declared length"));
        }
        md5.update(&piece);
        if let Some(c) = checksum.as_deref_mut() {
            c.update(&piece);
        }
        if !batch.is_empty() && batch.len() + piece.len() > BATCH {
            tokio::task::block_in_place(|| write(&batch))?;
            batch.clear();
        }
        if batch.is_empty() && piece.len() >= BATCH {
            tokio::task::block_in_place(|| write(&piece))?;
        } else {
            batch.extend_from_slice(&piece);
        }
    }
    if !batch.is_empty() {
        tokio::task::block_in_place(|| write(&batch))?;
    }
    Ok((size, md5.finalize().into()))
}

/// Stores the bytes of `body` at `op` as `subject`: nothing shows until every byte has
/// come and matched the declared length, MD5 and checksum. Answers the ETag, the
/// attributes and the checksum checked.
pub async fn put(
    shared: &Arc<Shared>,
    records: &Records,
    subject: &str,
    op: &ObjectPath,
    body: Option<StreamingBlob>,
    mut meta: PutMeta,
) -> S3Result<(String, Attr, Option<Sums>)> {
    if meta.length.is_some_and(|l| l > MAX_PUT) {
        return Err(S3Error::with_message(S3ErrorCode::EntityTooLarge, "a single PUT stores at most 5 GiB"));
    }
    if op.is_dir {
        return make_dir(shared, subject, op, body).await.map(|(etag, attr)| (etag, attr, None));
    }
    let mut session = Acting::new(shared, subject);
    let mode = if meta.create_only { 0o644 | PUT_NEW } else { 0o644 };
    tokio::task::block_in_place(|| start_upload(&mut session, op, mode))?;
    let (size, digest) =
        drain(body, meta.length, "a single PUT stores at most 5 GiB", meta.checksum.as_mut(), |bytes| {
            session.put_more(bytes, false).map(drop).map_err(object_error)
        })
        .await?;
    if meta.length.is_some_and(|l| l != size) {
        return Err(S3Error::with_message(S3ErrorCode::IncompleteBody, "fewer bytes came than Content-Length said"));
    }
    if meta.content_md5.is_some_and(|want| want != digest) {
        return Err(S3Error::with_message(S3ErrorCode::BadDigest, "the bytes do not match Content-MD5"));
    }
    let sums = meta.checksum.map(Checksum::check).transpose()?;
    let attr = tokio::task::block_in_place(|| session.put_more(&[], true))
        .map_err(|e| upload_error(e, meta.create_only))?
        .ok_or_else(|| S3Error::with_message(S3ErrorCode::InternalError, "the upload ended without attributes"))?;
    let etag = hex::encode(digest);
    let record = Record { etag: etag.clone(), content_type: meta.content_type, metadata: meta.metadata };
    records.put(&op.path, &attr, &record);
    Ok((etag, attr, sums))
}

async fn make_dir(
    shared: &Arc<Shared>,
    subject: &str,
    op: &ObjectPath,
    body: Option<StreamingBlob>,
) -> S3Result<(String, Attr)> {
    if let Some(mut body) = body {
        while let Some(chunk) = body.next().await {
            if !chunk.map_err(|e| S3Error::with_message(S3ErrorCode::IncompleteBody, e.to_string()))?.is_empty() {
                return Err(S3Error::with_message(
                    S3ErrorCode::InvalidArgument,
                    "a key ending in '/' names a directory: its object has no bytes",
                ));
            }
        }
    }
    let op = op.clone();
    acting(shared, subject, move |s| {
        make_dirs(s, &op, &op.path)?;
        let (pages, _) =
            s.call(&locus_proto::ops::Stat { path: op.path.clone() }, Bytes::new()).map_err(object_error)?;
        let attr = pages.into_iter().next().unwrap_or_default();
        if !attr.is_dir() {
            return Err(S3Error::with_message(
                S3ErrorCode::InvalidRequest,
                "a file holds that name: it cannot be a directory",
            ));
        }
        Ok((EMPTY_ETAG.to_string(), Attr { size: 0, ..attr }))
    })
    .await?
}

/// Removes the object at `op` (a missing one is no error, as in S3), then the
/// directories above it that it leaves empty, up to its bucket.
pub async fn delete(shared: &Arc<Shared>, records: &Records, subject: &str, op: &ObjectPath) -> S3Result<()> {
    let op_ = op.clone();
    acting(shared, subject, move |s| {
        let gone = if op_.is_dir {
            s.call(&Rmdir { path: op_.path.clone() }, Bytes::new()).map(drop)
        } else {
            s.call(&Unlink { path: op_.path.clone() }, Bytes::new()).map(drop)
        };
        match gone {
            Ok(()) => {}
            Err(e) if e.code == Code::NOENT || e.code == Code::NOTDIR => return Ok(()),
            Err(e) if e.code == Code::NOTEMPTY && op_.is_dir => return Ok(()),
            Err(e) if e.code == Code::ISDIR => return Ok(()),
            Err(e) => return Err(object_error(e)),
        }
        let mut dir = names::parent(&op_.path).to_string();
        while dir.len() > op_.bucket_dir.len() && dir.starts_with(&op_.bucket_dir) {
            // A directory with an ACL of its own stays: removing it would drop the ACL,
            // and a later key beneath would get its parent's rights.
            let acl =
                |s: &mut Acting, path: &str| s.call(&AclGet { path: path.to_string() }, Bytes::new()).ok().map(|r| r.0);
            let own = acl(s, &dir);
            if own.is_none() || own != acl(s, names::parent(&dir)) {
                break;
            }
            if s.call(&Rmdir { path: dir.clone() }, Bytes::new()).is_err() {
                break;
            }
            dir = names::parent(&dir).to_string();
        }
        Ok(())
    })
    .await??;
    records.forget(&op.path);
    Ok(())
}

/// Copies the stored file at `from` to `to` at the server (the native `copy`: no byte
/// leaves the server, and `to` shows whole or not at all); answers the copy's attributes.
pub async fn copy(shared: &Arc<Shared>, subject: &str, from: &ObjectPath, to: &ObjectPath) -> S3Result<Attr> {
    let (from, to) = (from.clone(), to.clone());
    acting(shared, subject, move |s| {
        let call = |s: &mut Acting| s.call(&CopyFile { from: from.path.clone(), to: to.path.clone() }, Bytes::new());
        let (pages, _) = match call(s) {
            Err(e) if e.code == Code::NOENT => {
                make_dirs(s, &to, names::parent(&to.path))?;
                call(s)
            }
            other => other,
        }
        .map_err(object_error)?;
        pages
            .into_iter()
            .next()
            .ok_or_else(|| S3Error::with_message(S3ErrorCode::InternalError, "copy answered nothing"))
    })
    .await?
}
