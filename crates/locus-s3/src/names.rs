//! Buckets and keys as paths of the export (and as virtual hosts), and the native
//! protocol's errors as S3's.

use locus_proto::{Code, Error as WireError};
use s3s::{S3Error, S3ErrorCode, S3Result};

/// The longest key S3 allows, in bytes.
pub const MAX_KEY: usize = 1024;
/// The longest segment of a path the export's file system takes.
const MAX_SEGMENT: usize = 255;
/// Names Locus keeps for itself (hidden uploads, ACL files).
const RESERVED: &str = ".__locus";

/// An object's place in the export.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectPath {
    /// The bucket's directory, `/BUCKET`.
    pub bucket_dir: String,
    /// The whole path, `/BUCKET/KEY` without a final `/`.
    pub path: String,
    /// The key ends with `/`: it names a directory.
    pub is_dir: bool,
}

fn segment_ok(s: &str) -> bool {
    !s.is_empty() && s != "." && s != ".." && s.len() <= MAX_SEGMENT && !s.starts_with(RESERVED) && !s.contains('\0')
}

/// The directory of a bucket, or `InvalidBucketName`.
pub fn bucket_dir(bucket: &str) -> Result<String, S3Error> {
    if !segment_ok(bucket) || bucket.contains('/') {
        return Err(S3Error::with_message(
            S3ErrorCode::InvalidBucketName,
            "a bucket is a directory name of the export",
        ));
    }
    Ok(format!("/{bucket}"))
}

/// The path of `key` in `bucket`; keys that are not paths are refused with
/// `InvalidArgument` (`KeyTooLongError` beyond [`MAX_KEY`]).
pub fn object_path(bucket: &str, key: &str) -> Result<ObjectPath, S3Error> {
    let bucket_dir = bucket_dir(bucket)?;
    if key.len() > MAX_KEY {
        return Err(S3Error::with_message(S3ErrorCode::KeyTooLongError, "keys are at most 1024 bytes"));
    }
    let (body, is_dir) = match key.strip_suffix('/') {
        Some(b) => (b, true),
        None => (key, false),
    };
    if body.is_empty() || !body.split('/').all(segment_ok) {
        return Err(S3Error::with_message(
            S3ErrorCode::InvalidArgument,
            format!(
                "key {key:?} is not a path of the export: keys here have no empty, '.' or '..' segments, \
                 no NUL, segments of at most 255 bytes, and none starting with {RESERVED}"
            ),
        ));
    }
    Ok(ObjectPath { path: format!("{bucket_dir}/{body}"), bucket_dir, is_dir })
}

/// The key of `path` (beneath `bucket_dir`).
pub fn key_of(bucket_dir: &str, path: &str) -> String {
    path.strip_prefix(bucket_dir).and_then(|p| p.strip_prefix('/')).unwrap_or(path).to_string()
}

pub use locus_proto::path::parent;

/// A native error met on an object as S3 answers it.
pub fn object_error(e: WireError) -> S3Error {
    wire_error(e, S3ErrorCode::NoSuchKey)
}

/// A native error met on a bucket as S3 answers it.
pub fn bucket_error(e: WireError) -> S3Error {
    wire_error(e, S3ErrorCode::NoSuchBucket)
}

fn wire_error(e: WireError, missing: S3ErrorCode) -> S3Error {
    let code = match e.code {
        Code::NOENT | Code::NOTDIR => missing,
        Code::ACCES | Code::PERM | Code::NOT_AUTHENTICATED => S3ErrorCode::AccessDenied,
        Code::NOTEMPTY => S3ErrorCode::BucketNotEmpty,
        Code::ISDIR | Code::EXIST | Code::INVAL | Code::NAMETOOLONG | Code::LOOP => S3ErrorCode::InvalidRequest,
        Code::NOSPC | Code::FBIG | Code::TOO_LARGE => S3ErrorCode::EntityTooLarge,
        Code::LIMIT | Code::AGAIN | Code::BUSY => S3ErrorCode::SlowDown,
        Code::NOTSUP | Code::NOSYS => S3ErrorCode::NotImplemented,
        Code::ROFS => S3ErrorCode::AccessDenied,
        _ => S3ErrorCode::InternalError,
    };
    S3Error::with_message(code, e.message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_map_to_paths_beneath_their_bucket() {
        let p = object_path("data", "a/b.csv").unwrap();
        assert_eq!((p.path.as_str(), p.bucket_dir.as_str(), p.is_dir), ("/data/a/b.csv", "/data", false));
        let d = object_path("data", "a/b/").unwrap();
        assert_eq!((d.path.as_str(), d.is_dir), ("/data/a/b", true));
        assert_eq!(key_of("/data", "/data/a/b.csv"), "a/b.csv");
    }

    #[test]
    fn keys_that_are_not_paths_are_refused() {
        for bad in ["", "/", "a//b", "../x", "a/./b", "a/..", "x\0y", ".__locus_put_1", "a/.__locusacl"] {
            let e = object_path("data", bad).unwrap_err();
            assert_eq!(e.code(), &S3ErrorCode::InvalidArgument, "{bad:?}");
        }
        assert_eq!(object_path("data", &"k".repeat(1025)).unwrap_err().code(), &S3ErrorCode::KeyTooLongError);
        assert_eq!(object_path("data", &"k".repeat(256)).unwrap_err().code(), &S3ErrorCode::InvalidArgument);
        for bad in ["", ".", "..", "a/b", ".__locus"] {
            assert_eq!(bucket_dir(bad).unwrap_err().code(), &S3ErrorCode::InvalidBucketName, "{bad:?}");
        }
    }
}

/// Virtual-host-style addressing: `BUCKET.DOMAIN[:PORT]` names the bucket; any other
/// host (an address, `DOMAIN` itself) is path style.
pub(crate) struct Domains(pub(crate) Vec<String>);

impl s3s::host::S3Host for Domains {
    fn parse_host_header<'a>(&'a self, host: &'a str) -> S3Result<s3s::host::VirtualHost<'a>> {
        let name = match host.rsplit_once(':') {
            Some((name, port)) if !name.contains(']') && port.bytes().all(|b| b.is_ascii_digit()) => name,
            _ => host,
        };
        for domain in &self.0 {
            let bucket = name.len().checked_sub(domain.len() + 1).and_then(|cut| {
                let (bucket, rest) = name.split_at(cut);
                (rest.len() == domain.len() + 1 && rest[1..].eq_ignore_ascii_case(domain) && rest.starts_with('.'))
                    .then_some(bucket)
            });
            if let Some(bucket) = bucket.filter(|b| !b.is_empty()) {
                return Ok(s3s::host::VirtualHost::new(domain.as_str()).with_bucket(bucket));
            }
        }
        Ok(s3s::host::VirtualHost::new(host))
    }
}
