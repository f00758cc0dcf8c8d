//! The S3 door (`locus serve --s3-port P`): `aws`, boto3, rclone, `s3fs-fuse`, pyarrow
//! and every other S3 client reach the export as a set of buckets.
//!
//! **Names.** Buckets are the export's top-level directories and keys are paths beneath
//! them: `s3://data/a/b.csv` is `/data/a/b.csv`. A key ending in `/` names a directory
//! (a `PUT` of one with no bytes makes it; an empty directory lists as that key). Keys
//! that are not paths (an empty segment, `.` or `..`, a NUL, a segment over 255 bytes or
//! one starting with Locus's reserved `.__locus`) are refused with `InvalidArgument`
//! ([`names`]).
//!
//! **Subjects.** The [`s3s`] crate checks AWS Signature Version 4 (headers, presigned
//! URLs with their expiry, `aws-chunked` streaming bodies): the access key is a subject's
//! name, and its secret is derived from the subject's token ([`keys::secret_of`], what
//! `locus token SUBJECT --s3` prints), so the token never travels. Unsigned requests are
//! refused unless the server names an anonymous subject. Every request then runs as a
//! session acting as that subject ([`locus_server::acting::Acting`]), so ACL checks,
//! callback breaks, I/O accounting and the cluster head's namespace are the native
//! protocol's own.
//!
//! **What S3 adds.** ETags, content types and `x-amz-meta-*` metadata of objects written
//! through this door are kept beside the export ([`meta`]); multipart parts wait in the
//! state directory until completed ([`multipart`]). A `GET` of a missing key whose name
//! invokes an active-file handler runs it and streams its output.
//!
//! Rooms: [`checksums`] (the `x-amz-checksum-*` a client sends beside a body), [`names`] (bucket and key to path, virtual hosts, and errors), [`keys`]
//! (secrets, signature checks, the anonymous subject), [`meta`] (the object records),
//! [`objects`] (get, head, put, delete, copy), [`listing`] (buckets and object listings
//! in S3's order), [`multipart`] (uploads in parts), `door` (the S3 operations, each to
//! its room).

pub mod checksums;
pub mod keys;
pub mod listing;
pub mod meta;
pub mod multipart;
pub mod names;
pub mod objects;

mod door;

use locus_server::Shared;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// How long a connection may wait for a request's headers, or a request's body for
/// its next bytes, before it is closed.
pub const IDLE: Duration = Duration::from_secs(60);

/// How the S3 door serves.
#[derive(Clone, Debug)]
pub struct S3Config {
    /// The subject unsigned requests act as; none refuses them.
    pub anonymous: Option<String>,
    /// Domains for virtual-host-style addressing (`BUCKET.DOMAIN`); path style always works.
    pub domains: Vec<String>,
    /// Multipart uploads not completed within this long are removed with their parts.
    pub upload_max_age: Duration,
    /// Where the object records and the parts of multipart uploads are kept.
    pub state_dir: PathBuf,
}

impl S3Config {
    /// The defaults: no anonymous subject, path style only, uploads kept a day.
    pub fn new(state_dir: PathBuf) -> S3Config {
        S3Config { anonymous: None, domains: Vec::new(), upload_max_age: Duration::from_secs(24 * 3600), state_dir }
    }
}

/// Why the door could not start.
#[derive(Debug, thiserror::Error)]
pub enum S3DoorError {
    /// The object records or the uploads' directory could not be opened.
    #[error("S3 door state in {path}: {why}")]
    State { path: String, why: String },
    /// A virtual-host domain is not a domain name.
    #[error("--s3-domain {0:?} is not a domain name")]
    Domain(String),
}

/// Serves S3 on `listener` until the task is dropped: plain HTTP, or HTTPS with `tls`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    shared: Arc<Shared>,
    config: S3Config,
    tls: Option<tokio_rustls::TlsAcceptor>,
) -> Result<(), S3DoorError> {
    let connections = Arc::new(tokio::sync::Semaphore::new(shared.config.max_connections.max(1)));
    let service = door::service(shared, config)?;
    loop {
        // At most as many connections as the native door takes; the rest wait to be accepted.
        let Ok(permit) = connections.clone().acquire_owned().await else { return Ok(()) };
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors, say: wait instead of spinning.
                tracing::warn!("S3 door: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let (service, tls) = (service.clone(), tls.clone());
        let service = hyper::service::service_fn(move |req| answer(service.clone(), req));
        tokio::spawn(async move {
            let _permit = permit;
            let mut http = hyper::server::conn::http1::Builder::new();
            // A client has this long to send a request's headers, also on an idle kept-alive
            // connection, which is then closed.
            http.timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(IDLE);
            match tls {
                None => {
                    let io = hyper_util::rt::TokioIo::new(stream);
                    let _ = http.serve_connection(io, service).await;
                }
                Some(tls) => {
                    let Ok(Ok(stream)) = tokio::time::timeout(Duration::from_secs(10), tls.accept(stream)).await else {
                        return;
                    };
                    let _ = http.serve_connection(hyper_util::rt::TokioIo::new(stream), service).await;
                }
            }
        });
    }
}

/// Answers one request. One that asked to be told to send its body (`Expect:
/// 100-continue`) and was answered without a `100 Continue` (its body empty, or not
/// read) closes its connection: the client then sends no body, which leaves the
/// connection's framing unknown, and botocore (the `aws` CLI) misreads the next
/// response on a connection used that way, hanging until its read timeout.
async fn answer(
    service: s3s::service::S3Service,
    req: hyper::Request<hyper::body::Incoming>,
) -> Result<s3s::HttpResponse, s3s::HttpError> {
    use std::sync::atomic::Ordering;
    if let Some(why) = refused(&req) {
        return Ok(error_response(hyper::StatusCode::FORBIDDEN, "AccessDenied", why));
    }
    if let Some(why) = malformed_dates(&req) {
        return Ok(error_response(hyper::StatusCode::BAD_REQUEST, "AuthorizationHeaderMalformed", why));
    }
    let expects =
        req.headers().get(hyper::header::EXPECT).is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    let empty = hyper::body::Body::is_end_stream(req.body());
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let body = Arc::new(std::sync::atomic::AtomicU8::new(READING));
    let req = req.map(|b| s3s::Body::http_body(Tracked { inner: b, state: body.clone() }));
    let mut resp = service.call(req).await?;
    if let Some(door::Redirect(to)) = resp.extensions_mut().remove::<door::Redirect>() {
        *resp.status_mut() = hyper::StatusCode::TEMPORARY_REDIRECT;
        resp.headers_mut().insert(hyper::header::LOCATION, to);
    }
    let body = body.load(Ordering::Relaxed);
    if body == CUT && resp.status().is_server_error() {
        // s3s answers a body cut short (a client that closed, a Content-Length larger
        // than what came) as an internal error; it is the client's.
        resp = error_response(hyper::StatusCode::BAD_REQUEST, "IncompleteBody", "the request's body ended early");
    } else if resp.status().is_server_error() {
        tracing::warn!(%method, path, status = %resp.status(), "S3 request failed");
    }
    if expects && (empty || body != ENDED) {
        resp.headers_mut().insert(hyper::header::CONNECTION, hyper::header::HeaderValue::from_static("close"));
    }
    Ok(resp)
}

/// Where a request's body is: still being read, read to its end, or cut short.
const READING: u8 = 0;
const ENDED: u8 = 1;
const CUT: u8 = 2;

/// A request body that notes whether it has been read to its end, or failed.
struct Tracked {
    inner: hyper::body::Incoming,
    state: Arc<std::sync::atomic::AtomicU8>,
}

impl hyper::body::Body for Tracked {
    type Data = bytes::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        use std::sync::atomic::Ordering::Relaxed;
        let polled = std::pin::Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            std::task::Poll::Ready(Some(Err(_))) => self.state.store(CUT, Relaxed),
            std::task::Poll::Ready(None) => self.state.store(ENDED, Relaxed),
            _ if self.inner.is_end_stream() => self.state.store(ENDED, Relaxed),
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// The longest a presigned URL may live, as AWS allows (seven days).
const MAX_PRESIGNED_S: u64 = 7 * 24 * 3600;

/// Why a request is refused before it is parsed: Signature Version 2 (which signs no
/// body and whose header form carries no expiry), browser form uploads (whose file s3s
/// reads into memory before any check), and presigned URLs meant to live past seven days.
fn refused<B>(req: &hyper::Request<B>) -> Option<&'static str> {
    let auth = req.headers().get(hyper::header::AUTHORIZATION).map(|v| v.as_bytes()).unwrap_or_default();
    let params = || query_params(req.uri().query().unwrap_or(""));
    if auth.starts_with(b"AWS ") || params().any(|(k, _)| k == "AWSAccessKeyId" || k == "Signature") {
        return Some("Signature Version 2 is not accepted here: sign with Version 4");
    }
    let form = req
        .headers()
        .get(hyper::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"multipart/form-data"));
    if req.method() == hyper::Method::POST && form {
        return Some("browser form uploads (POST Object) are not offered: use PUT");
    }
    let expires = params().find(|(k, _)| *k == "X-Amz-Expires").map(|(_, v)| v.parse::<u64>().unwrap_or(u64::MAX));
    if expires.is_some_and(|e| e > MAX_PRESIGNED_S) {
        return Some("a presigned URL lives at most 604800 seconds (seven days)");
    }
    None
}

/// Why a request's signature dates cannot be read, checked before `s3s` reads them: its
/// date parser computes `byte - b'0'` before it checks that the byte is a digit, which
/// overflows (and panics in a build with overflow checks, as the fuzz targets found)
/// on a byte below `'0'`. Dates of the right length must be digits where digits go;
/// other lengths `s3s` refuses itself.
fn malformed_dates<B>(req: &hyper::Request<B>) -> Option<&'static str> {
    let digits = |s: &[u8]| s.iter().all(u8::is_ascii_digit);
    // `YYYYMMDDTHHMMSSZ`
    let bad_time = |v: &[u8]| v.len() == 16 && !(digits(&v[..8]) && digits(&v[9..15]));
    // `KEY/YYYYMMDD/REGION/s3/aws4_request`: the field after the first `/`.
    let bad_scope = |v: &[u8]| {
        let mut fields = v.split(|&b| b == b'/');
        fields.next();
        fields.next().is_some_and(|date| date.len() == 8 && !digits(date))
    };
    let headers = req.headers();
    if headers.get_all("x-amz-date").iter().any(|v| bad_time(v.as_bytes())) {
        return Some("X-Amz-Date is not a date of the form YYYYMMDDTHHMMSSZ");
    }
    for auth in headers.get_all(hyper::header::AUTHORIZATION) {
        let auth = auth.as_bytes();
        let scopes = auth.windows(11).enumerate().filter(|(_, w)| *w == b"Credential=").map(|(i, _)| &auth[i + 11..]);
        if scopes.into_iter().any(|s| bad_scope(s)) {
            return Some("the credential's scope does not begin with a date YYYYMMDD");
        }
    }
    for (k, v) in query_params(req.uri().query().unwrap_or("")) {
        let v = percent_encoding::percent_decode_str(v).collect::<Vec<u8>>();
        match k {
            "X-Amz-Date" if bad_time(&v) => return Some("X-Amz-Date is not a date of the form YYYYMMDDTHHMMSSZ"),
            "X-Amz-Credential" if bad_scope(&v) => {
                return Some("the credential's scope does not begin with a date YYYYMMDD")
            }
            _ => {}
        }
    }
    None
}

/// The `key=value` pairs of a query string, still percent-encoded.
pub(crate) fn query_params(query: &str) -> impl Iterator<Item = (&str, &str)> {
    query.split('&').filter_map(|kv| kv.split_once('='))
}

/// An S3 error answered before the request reaches `s3s`.
fn error_response(status: hyper::StatusCode, code: &str, message: &str) -> s3s::HttpResponse {
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{code}</Code><Message>{message}</Message></Error>"
    );
    let mut resp = hyper::Response::new(s3s::Body::from(body));
    *resp.status_mut() = status;
    resp.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/xml"));
    resp
}
