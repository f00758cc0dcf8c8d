//! The checksums S3 clients send beside a body: `x-amz-checksum-crc32`, `-crc32c`,
//! `-crc64nvme`, `-sha1` or `-sha256`, in a header, or with an `aws-chunked` body in a
//! trailer that `x-amz-trailer` names. Recent SDKs send one by default instead of
//! `Content-MD5`, and over HTTPS they leave the payload itself unsigned: the checksum is
//! then the only proof that the bytes stored are the bytes sent. The door computes the
//! one asked for while the body streams, and a mismatch is `BadDigest` before anything
//! shows (as a wrong `Content-MD5` is).

use s3s::checksum::ChecksumHasher;
use s3s::dto::Checksum as Sums;
use s3s::{S3Error, S3ErrorCode, S3Request, S3Result, TrailingHeaders};

/// The checksum headers the door checks.
const NAMES: [&str; 5] = [
    "x-amz-checksum-crc32",
    "x-amz-checksum-crc32c",
    "x-amz-checksum-crc64nvme",
    "x-amz-checksum-sha1",
    "x-amz-checksum-sha256",
];

/// True when `value` is base64 of the length `like` (another value of the same
/// algorithm, base64) has.
fn well_formed(value: &str, like: usize) -> bool {
    use base64::Engine;
    value.len() == like && base64::engine::general_purpose::STANDARD.decode(value).is_ok()
}

/// Where the value to compare with comes from.
enum Expected {
    /// A header, known before the body.
    Header(String),
    /// A trailer, known once the body has been read to its end.
    Trailer(TrailingHeaders),
}

/// One checksum a request asked the door to check, computed as its body streams.
pub struct Checksum {
    name: &'static str,
    expected: Expected,
    hasher: ChecksumHasher,
}

fn invalid(why: &str) -> S3Error {
    S3Error::with_message(S3ErrorCode::InvalidRequest, why.to_string())
}

impl Checksum {
    /// The checksum `req` asks for, if any. More than one, a trailer the door does not
    /// know, or a trailer without a streaming body is `InvalidRequest`.
    pub fn of<T>(req: &S3Request<T>) -> S3Result<Option<Checksum>> {
        let mut found: Option<(&'static str, Expected)> = None;
        for name in NAMES {
            let Some(value) = req.headers.get(name) else { continue };
            let value = value.to_str().map_err(|_| invalid("a checksum header is not text"))?;
            if found.replace((name, Expected::Header(value.trim().to_string()))).is_some() {
                return Err(invalid("expecting a single x-amz-checksum- header"));
            }
        }
        if let Some(trailer) = req.headers.get("x-amz-trailer") {
            let named = trailer.to_str().unwrap_or_default().trim().to_ascii_lowercase();
            let Some(name) = NAMES.into_iter().find(|n| *n == named) else {
                return Err(invalid("x-amz-trailer names no checksum this server checks"));
            };
            let Some(handle) = req.trailing_headers.clone() else {
                return Err(invalid("x-amz-trailer needs an aws-chunked body"));
            };
            if found.replace((name, Expected::Trailer(handle))).is_some() {
                return Err(invalid("expecting a single x-amz-checksum- header"));
            }
        }
        let Some((name, expected)) = found else { return Ok(None) };
        let mut hasher = ChecksumHasher::default();
        match name {
            "x-amz-checksum-crc32" => hasher.crc32 = Some(Default::default()),
            "x-amz-checksum-crc32c" => hasher.crc32c = Some(Default::default()),
            "x-amz-checksum-crc64nvme" => hasher.crc64nvme = Some(Default::default()),
            "x-amz-checksum-sha1" => hasher.sha1 = Some(Default::default()),
            _ => hasher.sha256 = Some(Default::default()),
        }
        Ok(Some(Checksum { name, expected, hasher }))
    }

    /// The next bytes of the body.
    pub fn update(&mut self, bytes: &[u8]) {
        self.hasher.update(bytes);
    }

    /// Compares what the body gave with what the client sent (the body has been read to
    /// its end, so a trailer is there if the client sent one); answers the checksum, to
    /// be given back in the response.
    pub fn check(self) -> S3Result<Sums> {
        let sums = self.hasher.finalize();
        let computed = [
            &sums.checksum_crc32,
            &sums.checksum_crc32c,
            &sums.checksum_crc64nvme,
            &sums.checksum_sha1,
            &sums.checksum_sha256,
        ]
        .into_iter()
        .find_map(|s| s.clone())
        .unwrap_or_default();
        let sent = match self.expected {
            Expected::Header(value) => value,
            Expected::Trailer(handle) => handle
                .read(|trailers| trailers.get(self.name).and_then(|v| v.to_str().ok()).map(|v| v.trim().to_string()))
                .flatten()
                .ok_or_else(|| {
                    S3Error::with_message(
                        S3ErrorCode::IncompleteBody,
                        format!("the body ended without its {}", self.name),
                    )
                })?,
        };
        if !well_formed(&sent, computed.len()) {
            return Err(invalid(&format!("the value of {} is not the base64 of a checksum", self.name)));
        }
        if sent != computed {
            let what = self.name.trim_start_matches("x-amz-checksum-").to_ascii_uppercase();
            return Err(S3Error::with_message(
                S3ErrorCode::BadDigest,
                format!("the {what} you specified did not match the calculated checksum"),
            ));
        }
        Ok(sums)
    }
}

/// An operation's output with `fields` and the checksums (`Option<Checksum>`) checked.
macro_rules! with_sums {
    ($sums:expr, $output:ident { $($field:ident: $value:expr),* $(,)? }) => {{
        let sums = $sums.unwrap_or_default();
        $output {
            $($field: $value,)*
            checksum_crc32: sums.checksum_crc32,
            checksum_crc32c: sums.checksum_crc32c,
            checksum_crc64nvme: sums.checksum_crc64nvme,
            checksum_sha1: sums.checksum_sha1,
            checksum_sha256: sums.checksum_sha256,
            ..Default::default()
        }
    }};
}
pub(crate) use with_sums;

#[cfg(test)]
mod tests {
    use super::*;
    use s3s::dto::PutObjectInput;

    fn request(headers: &[(&str, &str)]) -> S3Request<PutObjectInput> {
        let mut map = hyper::HeaderMap::new();
        for (k, v) in headers {
            map.insert(hyper::header::HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
        }
        S3Request {
            input: PutObjectInput::builder().bucket("b".into()).key("k".into()).build().unwrap(),
            method: hyper::Method::PUT,
            uri: "/b/k".parse().unwrap(),
            headers: map,
            extensions: Default::default(),
            credentials: None,
            region: None,
            service: None,
            trailing_headers: None,
        }
    }

    fn checked(headers: &[(&str, &str)], body: &[u8]) -> S3Result<Sums> {
        let mut c = Checksum::of(&request(headers))?.expect("a checksum is asked for");
        c.update(&body[..body.len() / 2]);
        c.update(&body[body.len() / 2..]);
        c.check()
    }

    #[test]
    fn each_algorithm_accepts_its_value_and_refuses_another() {
        // The values of b"hello world", as the AWS SDKs compute them.
        let cases = [
            ("x-amz-checksum-crc32", "DUoRhQ=="),
            ("x-amz-checksum-crc32c", "yZRlqg=="),
            ("x-amz-checksum-sha1", "Kq5sNclPz7QV2+lfQIuc6R7oRu0="),
            ("x-amz-checksum-sha256", "uU0nuZNNPgilLlLX2n2r+sSE7+N6U4DukIj3rOLvzek="),
            ("x-amz-checksum-crc64nvme", "jSnVw/bqjr4="),
        ];
        for (name, value) in cases {
            let sums = checked(&[(name, value)], b"hello world").unwrap_or_else(|e| panic!("{name}: {e:?}"));
            assert!(format!("{sums:?}").contains(value), "{name}: given back");
            let e = checked(&[(name, value)], b"hello worle").unwrap_err();
            assert_eq!(*e.code(), S3ErrorCode::BadDigest, "{name}");
        }
        // A value that is not a checksum at all is a bad request, not a mismatch.
        let e = checked(&[("x-amz-checksum-crc32", "not-base64!!")], b"hello world").unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::InvalidRequest);
        let e = checked(&[("x-amz-checksum-crc32", "DUoRhQDUoRhQ")], b"hello world").unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::InvalidRequest);
    }

    #[test]
    fn none_two_or_an_unknown_trailer() {
        assert!(Checksum::of(&request(&[])).unwrap().is_none());
        let two = [("x-amz-checksum-crc32", "DUoRhQ=="), ("x-amz-checksum-sha1", "x")];
        assert_eq!(*Checksum::of(&request(&two)).err().unwrap().code(), S3ErrorCode::InvalidRequest);
        let odd = [("x-amz-trailer", "x-amz-checksum-md4")];
        assert_eq!(*Checksum::of(&request(&odd)).err().unwrap().code(), S3ErrorCode::InvalidRequest);
        // A trailer needs a streaming body, whose handle s3s gives.
        let bare = [("x-amz-trailer", "x-amz-checksum-crc32")];
        assert_eq!(*Checksum::of(&request(&bare)).err().unwrap().code(), S3ErrorCode::InvalidRequest);
    }
}
