//! HTTP response bodies for the server's doors (and the console's): plain text, and a
//! file's bytes by `Range`, produced in chunks as the client takes them.

use bytes::Bytes;
use hyper::body::{Body, Frame};
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::sync::mpsc;

/// Bytes per body chunk.
const CHUNK: u64 = 1 << 20;

/// A response body: a few bytes, or chunks produced by a task as the client takes them.
pub enum HttpBody {
    Full(Option<Bytes>),
    Stream(mpsc::Receiver<std::io::Result<Bytes>>),
}

impl Body for HttpBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        match self.get_mut() {
            HttpBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            HttpBody::Stream(rx) => rx.poll_recv(cx).map(|o| o.map(|r| r.map(Frame::data))),
        }
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        match self {
            // Known bytes go out with a Content-Length, not chunked.
            HttpBody::Full(b) => hyper::body::SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            HttpBody::Stream(_) => hyper::body::SizeHint::default(),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, HttpBody::Full(None))
    }
}

/// A plain-text response.
pub fn text(status: StatusCode, body: impl Into<String>) -> Response<HttpBody> {
    let mut r = Response::new(HttpBody::Full(Some(Bytes::from(body.into() + "\n"))));
    *r.status_mut() = status;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    r
}

/// The value of `name` in a URL's query.
pub(crate) fn query<'a>(req: &'a Request<hyper::body::Incoming>, name: &str) -> Option<&'a str> {
    req.uri().query()?.split('&').find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
}

/// Parses a single `Range: bytes=...` against `size`: `Ok(None)` for the whole file,
/// `Err` when unsatisfiable. Several ranges are answered with the whole file.
fn range(req: &Request<hyper::body::Incoming>, size: u64) -> Result<Option<(u64, u64)>, ()> {
    let Some(spec) = req.headers().get(header::RANGE).and_then(|v| v.to_str().ok()) else { return Ok(None) };
    let Some(spec) = spec.strip_prefix("bytes=") else { return Ok(None) };
    if spec.contains(',') {
        return Ok(None);
    }
    let Some((a, b)) = spec.trim().split_once('-') else { return Ok(None) };
    let (start, end) = match (a.parse::<u64>().ok(), b.parse::<u64>().ok()) {
        (Some(s), Some(e)) if s <= e => (s, e.min(size.saturating_sub(1))),
        (Some(s), None) if b.is_empty() => (s, size.saturating_sub(1)),
        (None, Some(n)) if a.is_empty() && n > 0 => (size.saturating_sub(n), size.saturating_sub(1)),
        _ => return Ok(None),
    };
    if start >= size {
        return Err(());
    }
    Ok(Some((start, end)))
}

/// A `200` or `206` response (or `416`) whose bytes `read(offset, len)` produces, in
/// chunks, as the client takes them.
pub fn ranged<F, Fut>(req: &Request<hyper::body::Incoming>, size: u64, etag: &str, read: F) -> Response<HttpBody>
where
    F: Fn(u64, u64) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = std::io::Result<Bytes>> + Send,
{
    let (status, start, len) = match range(req, size) {
        Ok(None) => (StatusCode::OK, 0, size),
        Ok(Some((s, e))) => (StatusCode::PARTIAL_CONTENT, s, e - s + 1),
        Err(()) => {
            let mut r = text(StatusCode::RANGE_NOT_SATISFIABLE, "range not satisfiable");
            if let Ok(v) = HeaderValue::from_str(&format!("bytes */{size}")) {
                r.headers_mut().insert(header::CONTENT_RANGE, v);
            }
            return r;
        }
    };
    let body = if req.method() == Method::HEAD || len == 0 {
        HttpBody::Full(None)
    } else {
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(async move {
            let mut at = start;
            while at < start + len {
                let want = (start + len - at).min(CHUNK);
                let chunk = read(at, want).await;
                let n = chunk.as_ref().map_or(0, |b| b.len() as u64);
                let failed = chunk.is_err() || n == 0;
                if tx
                    .send(
                        chunk.and_then(|b| if n == 0 { Err(std::io::ErrorKind::UnexpectedEof.into()) } else { Ok(b) }),
                    )
                    .await
                    .is_err()
                    || failed
                {
                    return;
                }
                at += n;
            }
        });
        HttpBody::Stream(rx)
    };
    let mut r = Response::new(body);
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    if let Ok(v) = HeaderValue::from_str(etag) {
        h.insert(header::ETAG, v);
    }
    if status == StatusCode::PARTIAL_CONTENT {
        if let Ok(v) = HeaderValue::from_str(&format!("bytes {start}-{}/{size}", start + len - 1)) {
            h.insert(header::CONTENT_RANGE, v);
        }
    }
    r
}
