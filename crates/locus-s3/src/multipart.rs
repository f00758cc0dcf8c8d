//! Multipart uploads: parts wait in the state directory (`s3-uploads/ID/`), never under
//! the key, until the upload is completed; then they become one `put` of the key, which
//! shows all of it at once. Uploads are the subject's who began them. Abandoned ones are
//! removed after [`crate::S3Config::upload_max_age`].
//!
//! Clients send every part but the last at one size, so the first part that fixes the
//! upload's *stride* (part 1, or any of at least 5 MiB in whole MiB) has each part `N`
//! sent with its length written where it ends up, at `(N - 1) × stride` in one sparse
//! assembly file (`data`), never past its declared length. Each place is written once
//! (`N.slot`): a part sent again after that, one larger than the stride, or one sent
//! before the stride was known goes to a file of its own. A completion where every
//! placed part is chosen and lies where it belongs copies the other chosen parts into
//! place and gives the assembly file to the `put` as a second name (no byte copied on
//! a plain server whose state directory shares the export's file system); otherwise it
//! copies every part in order, in the kernel where it can. Part writers hold a shared
//! lock on the assembly file and a completion an exclusive one, after claiming the
//! upload, so no byte of a part lands in an object once shown; a completion that fails
//! after its object showed gives nothing back.

use crate::meta::{Record, Records};
use crate::names::ObjectPath;
use crate::objects::{start_upload, MAX_PUT};
use locus_proto::ops::PUT_NEW;
use locus_server::acting::Acting;
use locus_server::Shared;
use md5::{Digest, Md5};
use s3s::dto::StreamingBlob;
use s3s::{S3Error, S3ErrorCode, S3Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// Part numbers S3 allows.
pub const PARTS: std::ops::RangeInclusive<i32> = 1..=10_000;
/// The smallest part but the last, as S3 requires.
pub const MIN_PART: u64 = 5 << 20;
/// Uploads under way at once, over all subjects.
const MAX_UPLOADS: usize = 10_000;
/// Space the state directory's file system keeps free: a part that would leave less is refused.
const KEEP_FREE: u64 = 1 << 30;
/// An upload's assembly file, where parts that fit its stride are written in place.
const DATA: &str = "data";
/// The file holding an upload's stride (see the module's doc).
const STRIDE: &str = "stride";
/// S3's largest object: nothing is placed past it in an assembly file.
const MAX_OBJECT: u64 = 5 << 40;

/// What an upload is for, kept in its directory as `upload.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Upload {
    pub subject: String,
    pub bucket: String,
    pub key: String,
    /// Seconds since the epoch when it began.
    pub started: u64,
    pub content_type: Option<String>,
    pub metadata: BTreeMap<String, String>,
}

/// A part received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part {
    pub number: i32,
    pub etag: String,
    pub size: u64,
    pub modified: SystemTime,
    /// In the assembly file at `(number - 1) × stride` (else in a file of its own).
    pub placed: bool,
}

impl Part {
    /// Its name in the upload's directory: `N.ETAG` (its bytes), or
    /// `N.ETAG.placed-SIZE` (a mark; its bytes are in the assembly file).
    fn file_name(&self) -> String {
        match self.placed {
            true => format!("{}.{}.placed-{}", self.number, self.etag, self.size),
            false => format!("{}.{}", self.number, self.etag),
        }
    }
}

/// The uploads' directory.
pub struct Uploads {
    dir: PathBuf,
    max_age: Duration,
}

fn err(code: S3ErrorCode, msg: impl Into<String>) -> S3Error {
    S3Error::with_message(code, msg.into())
}

fn io_err(e: std::io::Error) -> S3Error {
    match e.kind() {
        // Its directory went (completed, aborted or swept meanwhile).
        std::io::ErrorKind::NotFound => no_upload(),
        _ => err(S3ErrorCode::InternalError, format!("upload area: {e}")),
    }
}

/// The name an upload's directory takes while it is being completed: no other request
/// finds the upload under it (`get`, `abort` and `put_part` answer `NoSuchUpload`).
fn claimed(id: &str) -> String {
    format!("{id}.completing")
}

fn no_upload() -> S3Error {
    err(S3ErrorCode::NoSuchUpload, "no such upload (it was completed, aborted, expired or is another subject's)")
}

fn now_s() -> u64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

impl Uploads {
    /// The uploads kept in `state_dir/s3-uploads`.
    pub fn open(state_dir: &Path, max_age: Duration) -> std::io::Result<Uploads> {
        let dir = state_dir.join("s3-uploads");
        std::fs::create_dir_all(&dir)?;
        Ok(Uploads { dir, max_age })
    }

    /// The directory of upload `id`, if `id` is one this door could have made.
    fn dir_of(&self, id: &str) -> S3Result<PathBuf> {
        if id.len() != 32 || !id.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()) {
            return Err(no_upload());
        }
        Ok(self.dir.join(id))
    }

    /// Upload `id` as `subject` began it.
    pub fn get(&self, subject: &str, id: &str) -> S3Result<Upload> {
        let text = std::fs::read(self.dir_of(id)?.join("upload.json")).map_err(|_| no_upload())?;
        let upload: Upload = serde_json::from_slice(&text).map_err(|_| no_upload())?;
        if upload.subject != subject {
            return Err(no_upload());
        }
        Ok(upload)
    }

    /// Upload `id` of `subject`, which must be to `key` in `bucket` (else `NoSuchUpload`).
    pub fn get_to(&self, subject: &str, id: &str, bucket: &str, key: &str) -> S3Result<Upload> {
        let upload = self.get(subject, id)?;
        match upload.bucket == bucket && upload.key == key {
            true => Ok(upload),
            false => Err(no_upload()),
        }
    }

    /// Begins an upload; answers its id.
    pub fn create(&self, upload: &Upload) -> S3Result<String> {
        let count = std::fs::read_dir(&self.dir).map_err(io_err)?.count();
        if count >= MAX_UPLOADS {
            return Err(err(S3ErrorCode::SlowDown, "too many multipart uploads are under way"));
        }
        let mut raw = [0u8; 16];
        getrandom::fill(&mut raw).map_err(|e| err(S3ErrorCode::InternalError, e.to_string()))?;
        let id = hex::encode(raw);
        let dir = self.dir.join(&id);
        std::fs::create_dir(&dir).map_err(io_err)?;
        let text = serde_json::to_vec(upload).map_err(|e| err(S3ErrorCode::InternalError, e.to_string()))?;
        std::fs::write(dir.join("upload.json"), text).map_err(io_err)?;
        Ok(id)
    }

    /// Receives part `number` of upload `id`, replacing one sent before; answers its ETag
    /// (the MD5 of its bytes) and the `checksum` it was checked against.
    pub async fn put_part(
        &self,
        subject: &str,
        id: &str,
        number: i32,
        body: Option<StreamingBlob>,
        length: Option<u64>,
        content_md5: Option<[u8; 16]>,
        mut checksum: Option<crate::checksums::Checksum>,
    ) -> S3Result<(String, Option<s3s::dto::Checksum>)> {
        self.get(subject, id)?;
        if !PARTS.contains(&number) {
            return Err(err(S3ErrorCode::InvalidArgument, "part numbers go from 1 to 10000"));
        }
        if length.is_some_and(|l| l > MAX_PUT) {
            return Err(err(S3ErrorCode::EntityTooLarge, "a part is at most 5 GiB"));
        }
        let dir = self.dir_of(id)?;
        let free = rustix::fs::statvfs(&dir).map(|s| s.f_bavail.saturating_mul(s.f_frsize)).unwrap_or(u64::MAX);
        if free < length.unwrap_or(0).saturating_add(KEEP_FREE) {
            return Err(err(S3ErrorCode::EntityTooLarge, "the server's upload area has no room for this part"));
        }
        let placed = match length {
            Some(len) => tokio::task::block_in_place(|| place(&dir, number, len))?,
            None => None,
        };
        let mut hidden = Unkept(None);
        let written = match &placed {
            Some((data, at)) => {
                use std::os::unix::fs::FileExt;
                let mut at = *at;
                crate::objects::drain(body, length, "a part is at most 5 GiB", checksum.as_mut(), |bytes| {
                    data.write_all_at(bytes, at).map_err(io_err)?;
                    at += bytes.len() as u64;
                    Ok(())
                })
                .await
            }
            None => {
                let tmp = dir.join(format!("{number}.tmp{}", hex::encode(random8())));
                let mut file = std::fs::File::create(&tmp).map_err(io_err)?;
                hidden.0 = Some(tmp);
                crate::objects::drain(body, length, "a part is at most 5 GiB", checksum.as_mut(), |bytes| {
                    file.write_all(bytes).map_err(io_err)
                })
                .await
            }
        };
        let checked = written.and_then(|(size, digest)| {
            if length.is_some_and(|l| l != size) {
                return Err(err(S3ErrorCode::IncompleteBody, "fewer bytes came than Content-Length said"));
            }
            if content_md5.is_some_and(|want| want != digest) {
                return Err(err(S3ErrorCode::BadDigest, "the bytes do not match Content-MD5"));
            }
            Ok((size, digest, checksum.map(crate::checksums::Checksum::check).transpose()?))
        });
        let (size, digest, sums) = checked?;
        let part =
            Part { number, etag: hex::encode(digest), size, modified: SystemTime::now(), placed: placed.is_some() };
        // One name per part number; an earlier one goes once this one is there (so a
        // part sent again is never missing meanwhile), under the upload directory's
        // lock (so of sends of one part that end at once, one is kept). A placed part's
        // mark is made while its writer still holds the assembly file, so a completion
        // waiting for that file finds it.
        let name = part.file_name();
        let _listed = tokio::task::block_in_place(|| lock(&dir, rustix::fs::FlockOperation::LockExclusive))?;
        match hidden.0.take() {
            Some(tmp) => std::fs::rename(&tmp, dir.join(&name)).inspect_err(|_| hidden.0 = Some(tmp)),
            None => std::fs::File::create(dir.join(&name)).map(drop),
        }
        .map_err(io_err)?;
        for old in parts_in(&dir)?.into_iter().filter(|p| p.number == number && p.file_name() != name) {
            let _ = std::fs::remove_file(dir.join(old.file_name()));
        }
        drop(placed);
        Ok((part.etag, sums))
    }

    /// The parts of upload `id` received so far, in order.
    pub fn parts(&self, subject: &str, id: &str) -> S3Result<Vec<Part>> {
        self.get(subject, id)?;
        parts_in(&self.dir_of(id)?)
    }

    /// The uploads under way of `subject` in `bucket`: (id, upload), by key then start.
    pub fn list(&self, subject: &str, bucket: &str) -> Vec<(String, Upload)> {
        let mut found = Vec::new();
        for entry in std::fs::read_dir(&self.dir).into_iter().flatten().flatten() {
            let id = entry.file_name().to_string_lossy().into_owned();
            if let Ok(u) = self.get(subject, &id) {
                if u.bucket == bucket {
                    found.push((id, u));
                }
            }
        }
        found.sort_by(|a, b| (&a.1.key, a.1.started).cmp(&(&b.1.key, b.1.started)));
        found
    }

    /// Ends upload `id` without storing anything.
    pub fn abort(&self, subject: &str, id: &str) -> S3Result<()> {
        self.get(subject, id)?;
        // Claimed first, as a completion claims it: of an abort and a completion at once,
        // one finds no upload (removing it in place let a completion claim it half
        // emptied, and give back an empty directory when its parts were gone).
        let claim = self.dir.join(format!("{id}.aborting"));
        std::fs::rename(self.dir_of(id)?, &claim).map_err(io_err)?;
        std::fs::remove_dir_all(&claim).map_err(io_err)
    }

    /// Completes upload `id` with `chosen` parts (number, ETag), which must be in
    /// ascending order, received, and all but the last at least 5 MiB. The key then
    /// holds their bytes in that order; answers the multipart ETag (the MD5 of the
    /// parts' MD5s, a dash, their count).
    pub async fn complete(
        &self,
        shared: &Arc<Shared>,
        records: &Records,
        subject: &str,
        id: &str,
        op: &ObjectPath,
        chosen: &[(i32, String)],
        create_only: bool,
    ) -> S3Result<String> {
        let upload = self.get(subject, id)?;
        let dir = self.dir_of(id)?;
        let have = parts_in(&dir)?;
        if chosen.is_empty() {
            return Err(err(S3ErrorCode::MalformedXML, "a completion names at least one part"));
        }
        if chosen.windows(2).any(|w| w[0].0 >= w[1].0) {
            return Err(err(S3ErrorCode::InvalidPartOrder, "parts must be listed in ascending order"));
        }
        let mut md5s = Md5::new();
        for (i, part) in chosen_parts(&have, chosen)?.iter().enumerate() {
            if i + 1 < chosen.len() && part.size < MIN_PART {
                let number = part.number;
                return Err(err(S3ErrorCode::EntityTooSmall, format!("part {number} is under 5 MiB and not the last")));
            }
            md5s.update(hex::decode(&part.etag).unwrap_or_default());
        }
        let etag = format!("{}-{}", hex::encode(md5s.finalize()), chosen.len());
        // Claimed: a second completion, an abort, a part sent meanwhile or the sweeper
        // find no upload; on failure it is given back, for the client to try again.
        let claim = self.dir.join(claimed(id));
        std::fs::rename(&dir, &claim).map_err(io_err)?;
        let (shared_, subject_, op_, claim_, chosen) =
            (shared.clone(), subject.to_string(), op.clone(), claim.clone(), chosen.to_vec());
        let attr =
            tokio::task::spawn_blocking(move || assemble(&shared_, &subject_, &op_, &claim_, &chosen, create_only))
                .await
                .map_err(|e| err(S3ErrorCode::InternalError, e.to_string()))
                .and_then(|done| done);
        let attr = match attr {
            Ok(attr) => attr,
            Err(e) => {
                let _ = std::fs::rename(&claim, &dir);
                return Err(e);
            }
        };
        let record = Record { etag: etag.clone(), content_type: upload.content_type, metadata: upload.metadata };
        records.put(&op.path, &attr, &record);
        let _ = std::fs::remove_dir_all(&claim);
        Ok(etag)
    }

    /// Removes uploads that have received nothing for longer than the maximum age;
    /// answers how many.
    pub fn sweep(&self) -> usize {
        let oldest = now_s().saturating_sub(self.max_age.as_secs());
        let mut removed = 0;
        for entry in std::fs::read_dir(&self.dir).into_iter().flatten().flatten() {
            let path = entry.path();
            // An upload's age runs from its last part (which changes its directory), so
            // one still receiving parts is not removed from under its client; one being
            // completed, from its claim (a rename, which changes its ctime too).
            use std::os::unix::fs::MetadataExt;
            let active = entry.metadata().map_or(0, |m| m.ctime().max(0) as u64);
            let started = std::fs::read(path.join("upload.json"))
                .ok()
                .and_then(|t| serde_json::from_slice::<Upload>(&t).ok())
                .map_or(active, |u| u.started.max(active));
            if started < oldest && std::fs::remove_dir_all(&path).is_ok() {
                removed += 1;
            }
        }
        removed
    }
}

/// A new upload's record.
pub fn new_upload(
    subject: &str,
    bucket: &str,
    key: &str,
    content_type: Option<String>,
    metadata: BTreeMap<String, String>,
) -> Upload {
    Upload { subject: subject.into(), bucket: bucket.into(), key: key.into(), started: now_s(), content_type, metadata }
}

fn random8() -> [u8; 8] {
    let mut b = [0u8; 8];
    let _ = getrandom::fill(&mut b);
    b
}

/// `path` (a file or directory) opened and locked with `how` (`flock`).
fn lock(path: &Path, how: rustix::fs::FlockOperation) -> S3Result<std::fs::File> {
    let file = std::fs::File::open(path).map_err(io_err)?;
    rustix::fs::flock(&file, how).map_err(|e| io_err(e.into()))?;
    Ok(file)
}

/// The parts of the upload in `dir`, in order.
fn parts_in(dir: &Path) -> S3Result<Vec<Part>> {
    let mut parts = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|_| no_upload())?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let mut fields = name.splitn(3, '.');
        let (Some(n), Some(etag), rest) = (fields.next(), fields.next(), fields.next()) else { continue };
        let (Ok(number), true) = (n.parse::<i32>(), etag.len() == 32) else { continue };
        let Ok(meta) = entry.metadata() else { continue };
        let (placed, size) = match rest {
            None => (false, meta.len()),
            Some(mark) => match mark.strip_prefix("placed-").and_then(|s| s.parse::<u64>().ok()) {
                Some(size) => (true, size),
                None => continue,
            },
        };
        let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
        parts.push(Part { number, etag: etag.to_string(), size, modified, placed });
    }
    parts.sort_by_key(|p| p.number);
    Ok(parts)
}

/// The parts `chosen` (number, ETag) names among those received, in its order.
fn chosen_parts(have: &[Part], chosen: &[(i32, String)]) -> S3Result<Vec<Part>> {
    let find = |(number, etag): &(i32, String)| {
        let etag = etag.trim_matches('"');
        have.iter()
            .find(|p| p.number == *number && p.etag == etag)
            .cloned()
            .ok_or_else(|| err(S3ErrorCode::InvalidPart, format!("part {number} with that ETag was not received")))
    };
    chosen.iter().map(find).collect()
}

/// The upload's stride (see the module's doc), fixed now if part `number` of `len` bytes
/// may fix it and none did: the first to link its file under the name wins.
fn stride(dir: &Path, number: i32, len: u64) -> S3Result<Option<u64>> {
    let path = dir.join(STRIDE);
    let read = || std::fs::read_to_string(&path).ok().and_then(|t| t.trim().parse::<u64>().ok());
    if let Some(known) = read() {
        return Ok(Some(known));
    }
    if len < MIN_PART || (number != 1 && len % (1 << 20) != 0) {
        return Ok(None);
    }
    let tmp = dir.join(format!("stride.tmp{}", hex::encode(random8())));
    std::fs::write(&tmp, len.to_string()).map_err(io_err)?;
    let linked = std::fs::hard_link(&tmp, &path);
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(Some(len)),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(read()),
        Err(e) => Err(io_err(e)),
    }
}

/// Where part `number` of `len` bytes goes in the assembly file of the upload in `dir`,
/// if it goes there: the file (held under a shared lock, still the upload's) and the
/// offset. Each part number's place is taken once (`N.slot`); one sent again goes to a
/// file of its own.
fn place(dir: &Path, number: i32, len: u64) -> S3Result<Option<(std::fs::File, u64)>> {
    let Some(stride) = stride(dir, number, len)? else { return Ok(None) };
    let at = (number as u64 - 1).saturating_mul(stride);
    if len > stride || at.saturating_add(len) > MAX_OBJECT {
        return Ok(None);
    }
    match std::fs::OpenOptions::new().write(true).create_new(true).open(dir.join(format!("{number}.slot"))) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(None),
        Err(e) => return Err(io_err(e)),
    }
    let data = std::fs::OpenOptions::new().write(true).create(true).truncate(false).open(dir.join(DATA));
    let data = data.map_err(io_err)?;
    rustix::fs::flock(&data, rustix::fs::FlockOperation::LockShared).map_err(|e| io_err(e.into()))?;
    // A completion claims the directory before it locks the file: one claimed since
    // the file was opened is no longer this upload's to write.
    use std::os::unix::fs::MetadataExt;
    let (now, mine) = (std::fs::metadata(dir.join(DATA)).map_err(io_err)?, data.metadata().map_err(io_err)?);
    if (now.dev(), now.ino()) != (mine.dev(), mine.ino()) {
        return Err(no_upload());
    }
    Ok(Some((data, at)))
}

/// Makes the parts `chosen` of the upload claimed at `claim` one `put` of `op` as
/// `subject`, once no part is being written into its assembly file. In place (see the
/// module's doc) where every placed part lies where it belongs; else each part copied
/// in order, in the kernel on a plain server, through memory on a cluster head. With
/// `create_only`, a key that holds an object when the upload ends is
/// `PreconditionFailed` (and the upload is given back by the caller, whole).
fn assemble(
    shared: &Arc<Shared>,
    subject: &str,
    op: &ObjectPath,
    claim: &Path,
    chosen: &[(i32, String)],
    create_only: bool,
) -> S3Result<locus_proto::types::Attr> {
    let data_path = claim.join(DATA);
    let data = match std::fs::OpenOptions::new().read(true).write(true).open(&data_path) {
        Ok(f) => Some(f),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(io_err(e)),
    };
    if let Some(f) = &data {
        // Parts still being written end first, within the time a body may stay silent
        // (a part sent a byte at a time must not hold the completion for ever).
        let deadline = std::time::Instant::now() + crate::IDLE;
        while let Err(e) = rustix::fs::flock(f, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            if e != rustix::io::Errno::WOULDBLOCK || std::time::Instant::now() >= deadline {
                return Err(err(
                    S3ErrorCode::SlowDown,
                    "a part of this upload is still being sent: complete it again later",
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    // Listed again under the lock: the parts as they are now, none half written.
    let have = parts_in(claim)?;
    let parts = chosen_parts(&have, chosen)?;
    let stride = std::fs::read_to_string(claim.join(STRIDE)).ok().and_then(|t| t.trim().parse::<u64>().ok());
    let place_of = |p: &Part| match (stride, &data) {
        (Some(s), Some(f)) => Ok((f, (p.number as u64 - 1) * s)),
        _ => Err(err(S3ErrorCode::InternalError, "a placed part's assembly file or stride is missing")),
    };
    let mut offsets = Vec::with_capacity(parts.len());
    let mut total = 0u64;
    for p in &parts {
        offsets.push(total);
        total += p.size;
    }
    // In place only where every placed part is chosen and lies where it belongs: the
    // assembly file is then changed only where no part of a given-back upload lies.
    let in_place = |p: &Part, at: u64| place_of(p).is_ok_and(|(_, place)| place == at);
    let whole = data.is_some()
        && have.iter().filter(|p| p.placed).all(|p| parts.contains(p))
        && parts.iter().zip(&offsets).all(|(p, &at)| !p.placed || in_place(p, at));
    // Every source, opened before anything shows: (file, offset, length) in order.
    let mut sources = Vec::with_capacity(parts.len());
    for p in &parts {
        sources.push(match p.placed {
            true => place_of(p).and_then(|(f, at)| Ok((f.try_clone().map_err(io_err)?, at, p.size)))?,
            false => (std::fs::File::open(claim.join(p.file_name())).map_err(io_err)?, 0, p.size),
        });
    }
    let mut session = Acting::new(shared, subject);
    let object_err = crate::names::object_error;
    start_upload(&mut session, op, if create_only { 0o644 | PUT_NEW } else { 0o644 })?;
    let mut adopted = false;
    match (whole, &data) {
        (true, Some(assembly)) => {
            // The parts of their own go to their places; the file becomes the object.
            for ((p, (file, _, len)), &at) in parts.iter().zip(&sources).zip(&offsets) {
                if !p.placed {
                    copy_at(file, assembly, at, *len)?;
                }
            }
            assembly.set_len(total).map_err(io_err)?;
            let n = match session.put_adopt(&data_path).map_err(object_err)? {
                Some(n) => {
                    adopted = true;
                    n
                }
                None => session.put_file(assembly, 0, total).map_err(object_err)?,
            };
            if n != total {
                return Err(err(
                    S3ErrorCode::InternalError,
                    format!("the upload held {n} bytes, not the {total} received"),
                ));
            }
        }
        _ => {
            for (file, at, len) in &sources {
                let n = session.put_file(file, *at, *len).map_err(object_err)?;
                if n != *len {
                    return Err(err(
                        S3ErrorCode::InternalError,
                        format!("a part held {n} bytes, not the {len} received"),
                    ));
                }
            }
        }
    }
    let attr = session.put_more(&[], true).map_err(|e| crate::objects::upload_error(e, create_only));
    if let (true, Err(_), Some(object)) = (adopted, &attr, &data) {
        // Failed after the rename (the directory's sync, say): the assembly file is the
        // object now, with two names, and must not be given back to be written again.
        if rustix::fs::fstat(object).is_ok_and(|st| st.st_nlink > 1) {
            let _ = std::fs::remove_dir_all(claim);
        }
    }
    let mut attr = attr?.ok_or_else(|| err(S3ErrorCode::InternalError, "the upload ended without attributes"))?;
    if let (true, Some(object)) = (adopted, &data) {
        // The object's other name goes now (kept until it showed, so a failed upload is
        // given back whole); that changes its change time, which its record names.
        let _ = std::fs::remove_file(&data_path);
        let now = rustix::fs::fstat(object).map_err(|e| io_err(e.into()))?;
        attr.ctime = locus_proto::types::Time { sec: now.st_ctime, nsec: now.st_ctime_nsec as u32 };
        attr.nlink = now.st_nlink;
    }
    Ok(attr)
}

/// Copies the whole of `from` (`len` bytes) into `to` at offset `at`, in the kernel
/// where it can.
fn copy_at(from: &std::fs::File, to: &std::fs::File, at: u64, len: u64) -> S3Result<()> {
    use std::os::unix::fs::FileExt;
    let (mut done, mut buf) = (0u64, Vec::new());
    while done < len {
        let (mut src, mut dst) = (done, at + done);
        let want = (len - done).min(1 << 30) as usize;
        let n = match buf.is_empty() {
            true => match rustix::fs::copy_file_range(from, Some(&mut src), to, Some(&mut dst), want) {
                Ok(n) => n,
                Err(rustix::io::Errno::INTR) => continue,
                Err(_) => {
                    buf.resize(1 << 20, 0);
                    continue;
                }
            },
            false => {
                let n = from.read_at(&mut buf[..want.min(1 << 20)], done).map_err(io_err)?;
                to.write_all_at(&buf[..n], at + done).map_err(io_err)?;
                n
            }
        };
        if n == 0 {
            return Err(err(S3ErrorCode::InternalError, "a part ended before its size"));
        }
        done += n as u64;
    }
    Ok(())
}

/// Sweeps `uploads` now and then for as long as the task runs.
pub async fn sweeper(uploads: Arc<Uploads>) {
    let every = (uploads.max_age / 4).clamp(Duration::from_secs(1), Duration::from_secs(600));
    loop {
        tokio::time::sleep(every).await;
        let u = uploads.clone();
        let removed = tokio::task::spawn_blocking(move || u.sweep()).await.unwrap_or(0);
        if removed > 0 {
            tracing::info!(removed, "abandoned S3 multipart uploads removed");
        }
    }
}

/// The bytes `start..end` of `source` an UploadPartCopy takes: its
/// `x-amz-copy-source-range` (`bytes=FIRST-LAST`, both within the object), or all of it.
/// A source still being written (an active file's output) has no size to copy from.
pub fn copy_range(range: Option<&str>, source: &crate::objects::Readable) -> S3Result<(u64, u64)> {
    if source.growing {
        return Err(err(S3ErrorCode::InvalidRequest, "an active file's output cannot be copied into a part"));
    }
    let size = source.attr.size;
    let Some(range) = range else { return Ok((0, size)) };
    let bad =
        || err(S3ErrorCode::InvalidArgument, "x-amz-copy-source-range must be bytes=FIRST-LAST within the object");
    let (first, last) = range.trim().strip_prefix("bytes=").and_then(|r| r.split_once('-')).ok_or_else(bad)?;
    let (first, last): (u64, u64) = (first.parse().map_err(|_| bad())?, last.parse().map_err(|_| bad())?);
    if first > last || last >= size {
        return Err(bad());
    }
    Ok((first, last + 1))
}

/// A part's hidden file until it is kept under its name: removed when the part fails,
/// and when the request is dropped mid-body (its client gone), so nothing is left in
/// the upload.
struct Unkept(Option<PathBuf>);

impl Drop for Unkept {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}
