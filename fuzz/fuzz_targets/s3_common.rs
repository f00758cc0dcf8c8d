//! What the S3 fuzz targets share: one Locus server with its S3 door (unsigned requests
//! act as `anonymous:guest`), started once per fuzzing process; a decoder that turns fuzz
//! bytes into a request; and an AWS Signature Version 4 signer, so that fuzzed requests
//! get past the signature check (as headers, as a presigned URL, or as an `aws-chunked`
//! body whose every chunk is signed) and reach the XML parsers, the chunk decoder and the
//! operations behind them.
//!
//! A request is written as text: the first line is `METHOD PATH`, the second the query
//! after a `?` (`?k=v&k2`, or `?` alone), then headers (`name: value`) up to an empty
//! line, then the body. PATH and
//! the query are percent-encoded here, as a client does. With `LOCUS_FUZZ_SHOW` set,
//! each answer's status line is printed (to see that seeds get past the signature check).
#![allow(dead_code)]

#[path = "endpoint.rs"]
pub mod endpoint;

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::OnceLock;

/// The server, its door and what lies beside its export.
pub struct Door {
    pub server: locus_testkit::TestServer,
    pub addr: SocketAddr,
    pub beside: Vec<PathBuf>,
    /// What the file beside the export holds: random, so no error message that echoes a
    /// request (a key, a path) can carry it unless the file was read.
    pub canary: String,
}

/// The door, started on first use: a bucket `b` with objects in which alice and the
/// anonymous subject may do everything, `d` from [`endpoint::furnish`]; uploads in
/// parts left unfinished go after a minute.
pub fn door() -> &'static Door {
    static DOOR: OnceLock<Door> = OnceLock::new();
    DOOR.get_or_init(|| {
        endpoint::ignore_sigpipe();
        let server = locus_testkit::TestServer::start();
        endpoint::furnish(&server.root());
        let mut raw = [0u8; 16];
        getrandom::fill(&mut raw).unwrap();
        let canary = hex::encode(raw);
        std::fs::write(server.root().parent().unwrap().join("canary"), &canary).unwrap();
        std::fs::create_dir_all(server.root().join("b/dir")).unwrap();
        std::fs::write(server.root().join("b/x.txt"), b"x marks the spot\n").unwrap();
        std::fs::write(server.root().join("b/dir/y.csv"), b"a,b\n1,2\n").unwrap();
        for subject in ["alice", "anonymous:guest"] {
            server.shared().store.acl_set("admin", "/b", subject, locus_proto::types::Rights::ALL).unwrap();
        }
        let addr = server.s3(|c| {
            c.anonymous = Some("anonymous:guest".into());
            c.upload_max_age = std::time::Duration::from_secs(60);
        });
        Door { beside: endpoint::beside_root(&server.root()), server, addr, canary }
    })
}

/// Checks what every input must leave true: the canary outside the export was not read,
/// nothing appeared beside the export, and the door still answers.
pub fn check(door: &Door, answer: &[u8]) {
    if std::env::var_os("LOCUS_FUZZ_SHOW").is_some() {
        let line = answer.split(|&b| b == b'\r').next().unwrap_or_default();
        let code = answer.windows(6).position(|w| w == b"<Code>").map(|p| &answer[p..(p + 40).min(answer.len())]);
        eprintln!("{} {}", String::from_utf8_lossy(line), String::from_utf8_lossy(code.unwrap_or_default()));
    }
    assert!(!answer.windows(32).any(|w| w == door.canary.as_bytes()), "the canary was read");
    assert_eq!(endpoint::beside_root(&door.server.root()), door.beside, "something appeared beside the export");
    // Three tries: at thousands of connections a second, a new connection from a loopback
    // port just out of TIME_WAIT is now and then reset by the kernel before the door
    // sees it; a door that stopped answering fails all three.
    let probe = b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    let again = (0..3)
        .map(|_| endpoint::exchange(door.addr, probe, false, endpoint::PATIENT))
        .find(|a| a.starts_with(b"HTTP/1.1 "));
    assert!(again.is_some(), "the door stopped answering");
}

/// Gives `req` a real upload in parts to work on: where it says `UPLOADID`, the id of a
/// new upload of its path (begun by admin, with part 1 holding `hello`, whose ETag is
/// `5d41402abc4b2a76b9719d911017c592`) stands instead.
pub fn with_upload(door: &Door, mut req: Request) -> Request {
    const MARK: &str = "UPLOADID";
    let marked = req.path.contains(MARK)
        || req.query.iter().any(|(k, v)| k.contains(MARK) || v.contains(MARK))
        || req.body.windows(MARK.len()).any(|w| w == MARK.as_bytes());
    if !marked {
        return req;
    }
    let admin = Signer::new("admin");
    let host = door.addr.to_string();
    let begin = Request {
        method: "POST".into(),
        path: req.path.replace(MARK, ""),
        query: vec![("uploads".into(), String::new())],
        headers: Vec::new(),
        body: Vec::new(),
    };
    let answer = endpoint::exchange(
        door.addr,
        &wire(&begin, &admin, &Signing::Header { unsigned_payload: false }, &host),
        false,
        endpoint::QUICK,
    );
    let text = String::from_utf8_lossy(&answer);
    let id = text.split("<UploadId>").nth(1).and_then(|t| t.split('<').next()).unwrap_or("none").to_string();
    let part = Request {
        method: "PUT".into(),
        path: begin.path.clone(),
        query: vec![("partNumber".into(), "1".into()), ("uploadId".into(), id.clone())],
        headers: Vec::new(),
        body: b"hello".to_vec(),
    };
    endpoint::exchange(
        door.addr,
        &wire(&part, &admin, &Signing::Header { unsigned_payload: false }, &host),
        false,
        endpoint::QUICK,
    );
    req.path = req.path.replace(MARK, &id);
    for (k, v) in &mut req.query {
        *k = k.replace(MARK, &id);
        *v = v.replace(MARK, &id);
    }
    let body = String::from_utf8_lossy(&req.body).replace(MARK, &id);
    if body.as_bytes() != req.body.as_slice() {
        req.body = body.into_bytes();
    }
    req
}

/// A request decoded from fuzz bytes, before it is signed.
pub struct Request {
    pub method: String,
    /// The path, percent-encoded as sent.
    pub path: String,
    /// Decoded query pairs.
    pub query: Vec<(String, String)>,
    /// Lower-case names, values without surrounding spaces.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// Decodes the text form described above; `None` for an input without its first line.
pub fn decode(data: &[u8]) -> Option<Request> {
    let text_end = data.windows(2).position(|w| w == b"\n\n").map(|p| p + 1);
    let (head, body) = match text_end {
        Some(p) => (&data[..p], data[p + 1..].to_vec()),
        None => (data, Vec::new()),
    };
    let head = String::from_utf8_lossy(head);
    let mut lines = head.split('\n');
    let (method, path) = lines.next()?.split_once(' ')?;
    let method = method.chars().filter(|c| c.is_ascii_uppercase()).take(10).collect::<String>();
    if method.is_empty() {
        return None;
    }
    let path = format!("/{}", encode(path.trim_start_matches('/'), false));
    let query = lines
        .next()
        .unwrap_or("")
        .trim_start_matches('?')
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (k.to_string(), v.to_string())
        })
        .collect();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .filter_map(|(n, v)| {
            let name = n.trim().to_ascii_lowercase();
            let value = v.split_whitespace().collect::<Vec<_>>().join(" ");
            let token = !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
            let printable = value.bytes().all(|b| (0x20..0x7f).contains(&b));
            // What the signer sets, and what frames the connection.
            let ours = matches!(
                name.as_str(),
                "host" | "content-length" | "authorization" | "x-amz-date" | "connection" | "transfer-encoding"
            );
            (token && printable && !ours).then_some((name, value))
        })
        .collect();
    Some(Request { method, path, query, headers, body })
}

/// Percent-encodes as SigV4 does: unreserved bytes stay, and `/` too unless `all`.
pub fn encode(s: &str, all: bool) -> String {
    use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
    const UNRESERVED: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.').remove(b'~');
    const AND_SLASH: &AsciiSet = &UNRESERVED.remove(b'/');
    utf8_percent_encode(s, if all { UNRESERVED } else { AND_SLASH }).to_string()
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).unwrap();
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

fn sha_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// Who signs, and when.
pub struct Signer {
    pub access_key: String,
    pub secret: String,
    pub date: String,
    pub time: String,
}

/// The region every request is signed for.
const REGION: &str = "us-east-1";

impl Signer {
    /// Signs as `subject` (whose token the test server knows as `SUBJECT-token`), now.
    pub fn new(subject: &str) -> Signer {
        let now = time_now();
        Signer {
            access_key: subject.to_string(),
            secret: locus_s3::keys::secret_of(format!("{subject}-token").as_bytes()),
            date: now[..8].to_string(),
            time: now,
        }
    }

    fn scope(&self) -> String {
        format!("{}/{REGION}/s3/aws4_request", self.date)
    }

    fn key(&self) -> Vec<u8> {
        let k = hmac(format!("AWS4{}", self.secret).as_bytes(), self.date.as_bytes());
        let k = hmac(&k, REGION.as_bytes());
        let k = hmac(&k, b"s3");
        hmac(&k, b"aws4_request")
    }

    fn signature(&self, canonical: &str) -> String {
        let to_sign = format!("AWS4-HMAC-SHA256\n{}\n{}\n{}", self.time, self.scope(), sha_hex(canonical.as_bytes()));
        hex::encode(hmac(&self.key(), to_sign.as_bytes()))
    }

    /// The signature of one `aws-chunked` chunk, following `previous`.
    pub fn chunk_signature(&self, previous: &str, chunk: &[u8]) -> String {
        let to_sign = format!(
            "AWS4-HMAC-SHA256-PAYLOAD\n{}\n{}\n{previous}\n{}\n{}",
            self.time,
            self.scope(),
            sha_hex(b""),
            sha_hex(chunk)
        );
        hex::encode(hmac(&self.key(), to_sign.as_bytes()))
    }
}

/// `YYYYMMDDTHHMMSSZ` now.
fn time_now() -> String {
    let t = time::OffsetDateTime::now_utc();
    let (y, m, d) = (t.year(), u8::from(t.month()), t.day());
    format!("{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z", t.hour(), t.minute(), t.second())
}

fn canonical_query(query: &[(String, String)]) -> String {
    let mut pairs: Vec<(String, String)> = query.iter().map(|(k, v)| (encode(k, true), encode(v, true))).collect();
    pairs.sort();
    pairs.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join("&")
}

/// How a request is signed.
pub enum Signing {
    /// No signature (the anonymous subject, if any).
    None,
    /// In the `Authorization` header, with the body's SHA-256 or `UNSIGNED-PAYLOAD`.
    Header { unsigned_payload: bool },
    /// In the query string, as a presigned URL.
    Presigned,
    /// In the header, the body sent as `aws-chunked` chunks of these sizes, each signed.
    Chunked { sizes: Vec<usize> },
}

/// The request's bytes on the wire, signed by `signer` as `signing` says.
pub fn wire(req: &Request, signer: &Signer, signing: &Signing, host: &str) -> Vec<u8> {
    let mut query = req.query.clone();
    let mut headers: Vec<(String, String)> = req.headers.clone();
    headers.push(("host".into(), host.into()));
    let mut body = req.body.clone();
    let payload = match signing {
        Signing::None | Signing::Presigned => None,
        Signing::Header { unsigned_payload: true } => Some("UNSIGNED-PAYLOAD".to_string()),
        Signing::Header { unsigned_payload: false } => Some(sha_hex(&body)),
        Signing::Chunked { .. } => Some("STREAMING-AWS4-HMAC-SHA256-PAYLOAD".to_string()),
    };
    if let Some(p) = &payload {
        headers.retain(|(n, _)| n != "x-amz-content-sha256");
        headers.push(("x-amz-content-sha256".into(), p.clone()));
        headers.push(("x-amz-date".into(), signer.time.clone()));
    }
    if let Signing::Chunked { .. } = signing {
        headers.retain(|(n, _)| n != "x-amz-decoded-content-length" && n != "content-encoding");
        headers.push(("content-encoding".into(), "aws-chunked".into()));
        headers.push(("x-amz-decoded-content-length".into(), body.len().to_string()));
    }
    headers.sort();
    let names: Vec<&str> = {
        let mut n: Vec<&str> = headers.iter().map(|(n, _)| n.as_str()).collect();
        n.dedup();
        n
    };
    let signed_names = names.join(";");
    let canonical_headers = |headers: &[(String, String)]| {
        names
            .iter()
            .map(|n| {
                let values: Vec<&str> = headers.iter().filter(|(h, _)| h == n).map(|(_, v)| v.as_str()).collect();
                format!("{n}:{}\n", values.join(","))
            })
            .collect::<String>()
    };
    if let Signing::Presigned = signing {
        query.retain(|(k, _)| !k.starts_with("X-Amz-"));
        query.push(("X-Amz-Algorithm".into(), "AWS4-HMAC-SHA256".into()));
        query.push(("X-Amz-Credential".into(), format!("{}/{}", signer.access_key, signer.scope())));
        query.push(("X-Amz-Date".into(), signer.time.clone()));
        query.push(("X-Amz-Expires".into(), "300".into()));
        query.push(("X-Amz-SignedHeaders".into(), signed_names.clone()));
        let canonical = format!(
            "{}\n{}\n{}\n{}\n{}\nUNSIGNED-PAYLOAD",
            req.method,
            req.path,
            canonical_query(&query),
            canonical_headers(&headers),
            signed_names
        );
        query.push(("X-Amz-Signature".into(), signer.signature(&canonical)));
    }
    if let Some(p) = &payload {
        let canonical = format!(
            "{}\n{}\n{}\n{}\n{}\n{p}",
            req.method,
            req.path,
            canonical_query(&query),
            canonical_headers(&headers),
            signed_names
        );
        let signature = signer.signature(&canonical);
        headers.push((
            "authorization".into(),
            format!(
                "AWS4-HMAC-SHA256 Credential={}/{}, SignedHeaders={signed_names}, Signature={signature}",
                signer.access_key,
                signer.scope()
            ),
        ));
        if let Signing::Chunked { sizes } = signing {
            body = chunked(signer, &signature, &req.body, sizes);
        }
    }
    let q = canonical_query(&query);
    let mut out = format!("{} {}{}{} HTTP/1.1\r\n", req.method, req.path, if q.is_empty() { "" } else { "?" }, q);
    for (n, v) in &headers {
        out.push_str(&format!("{n}: {v}\r\n"));
    }
    out.push_str(&format!("content-length: {}\r\nconnection: close\r\n\r\n", body.len()));
    let mut bytes = out.into_bytes();
    bytes.extend_from_slice(&body);
    bytes
}

/// `data` as `aws-chunked` chunks of `sizes` (the rest in one more chunk), each signed
/// after the one before, ending with the signed empty chunk.
fn chunked(signer: &Signer, seed: &str, data: &[u8], sizes: &[usize]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut previous = seed.to_string();
    let mut rest = data;
    let mut sizes = sizes.iter();
    loop {
        let n = sizes.next().copied().unwrap_or(rest.len()).min(rest.len());
        let (chunk, after) = rest.split_at(n);
        let signature = signer.chunk_signature(&previous, chunk);
        out.extend_from_slice(format!("{n:x};chunk-signature={signature}\r\n").as_bytes());
        out.extend_from_slice(chunk);
        out.extend_from_slice(b"\r\n");
        previous = signature;
        rest = after;
        if n == 0 {
            return out;
        }
    }
}
