//! The web console of a Locus server (`locus serve --http-port P`): what operators need
//! to see without a terminal.
//!
//! - [`auth`]: a token login that starts a session held in an `HttpOnly`, `SameSite=Strict`
//!   cookie; every request after it acts as that subject, through the same ACLs as the
//!   native protocol, so a subject sees only what it may read.
//! - [`files`]: the tree (listings, text preview, ranged download, upload).
//! - [`load`]: a ring buffer of I/O samples (export, devices, busiest files) kept by the
//!   server for the last hour, for time plots and a heat map.
//! - [`code`]: running and recent script calls, storelets and active-file runs with what
//!   they used, and cancelling them.
//!
//! The front end is a page, a script and a style sheet (`web/`), with Chart.js for the
//! plots, all served from the binary. The JSON API under `/api/` is what the page uses.

pub mod auth;
pub mod code;
pub mod files;
pub mod load;

use bytes::Bytes;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use locus_server::http::HttpBody;
use locus_server::Shared;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

/// How the console is set up.
#[derive(Clone)]
pub struct ConsoleConfig {
    /// Time between load samples.
    pub sample_every: Duration,
    /// How far back the load plots reach.
    pub history: Duration,
    /// How long a login lasts.
    pub session_ttl: Duration,
    /// Serve HTTPS with this identity (`locus serve --tls`: the server's own); the
    /// session cookie is then `Secure`.
    pub tls: Option<tokio_rustls::TlsAcceptor>,
}

impl Default for ConsoleConfig {
    fn default() -> Self {
        ConsoleConfig {
            sample_every: Duration::from_secs(5),
            history: Duration::from_secs(3600),
            session_ttl: Duration::from_secs(12 * 3600),
            tls: None,
        }
    }
}

/// What the console's requests share.
pub struct Console {
    shared: Arc<Shared>,
    sessions: auth::Sessions,
    load: load::LoadHistory,
    /// Logins may send a token: the console speaks TLS, or listens on loopback only.
    tokens_safe: bool,
}

/// How long a client may take over the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

type Req = Request<hyper::body::Incoming>;
type Resp = Response<HttpBody>;

/// The page, script and style sheet, and the charting libraries fetched at build time.
const ASSETS: [(&str, &str, &[u8]); 5] = [
    ("/", "text/html; charset=utf-8", include_bytes!("../web/index.html")),
    ("/console.js", "text/javascript; charset=utf-8", include_bytes!("../web/console.js")),
    ("/console.css", "text/css; charset=utf-8", include_bytes!("../web/console.css")),
    ("/chart.js", "text/javascript; charset=utf-8", include_bytes!(concat!(env!("OUT_DIR"), "/chart.js"))),
    (
        "/chart-matrix.js",
        "text/javascript; charset=utf-8",
        include_bytes!(concat!(env!("OUT_DIR"), "/chart-matrix.js")),
    ),
];

/// Serves the console on `listener` until the task is dropped; samples the load meanwhile.
/// Needs a multi-threaded runtime (uploads write to the store with `block_in_place`).
/// A token is taken at login only over TLS or on a loopback address (plain HTTP
/// elsewhere would carry it across the network readable).
pub async fn serve(listener: tokio::net::TcpListener, shared: Arc<Shared>, config: ConsoleConfig) {
    let console = Arc::new(Console {
        sessions: auth::Sessions::new(config.session_ttl, config.tls.is_some()),
        load: load::LoadHistory::new(&config),
        tokens_safe: config.tls.is_some() || locus_server::http::is_loopback(&listener),
        shared,
    });
    let sampler = console.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(config.sample_every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            // A head's sample reads the namespace.
            tokio::task::block_in_place(|| sampler.load.sample(&sampler.shared));
        }
    });
    loop {
        let Ok((stream, _)) = listener.accept().await else { continue };
        let _ = stream.set_nodelay(true);
        let (console, tls) = (console.clone(), config.tls.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let console = console.clone();
                async move { Ok::<_, Infallible>(secure(console.answer(req).await)) }
            });
            let http = hyper::server::conn::http1::Builder::new();
            match tls {
                None => drop(http.serve_connection(hyper_util::rt::TokioIo::new(stream), service).await),
                Some(acceptor) => {
                    let Ok(Ok(stream)) = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await else {
                        return;
                    };
                    drop(http.serve_connection(hyper_util::rt::TokioIo::new(stream), service).await)
                }
            }
        });
    }
}

/// Headers every answer carries: nothing but our own scripts and styles runs, nothing
/// is sniffed, framed or cached.
fn secure(mut r: Resp) -> Resp {
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("default-src 'self'; img-src 'self' data:; frame-ancestors 'none'"),
    );
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.entry(header::CACHE_CONTROL).or_insert(HeaderValue::from_static("no-store"));
    r
}

/// A JSON answer.
pub(crate) fn json(status: StatusCode, value: &serde_json::Value) -> Resp {
    let mut r = Response::new(HttpBody::Full(Some(Bytes::from(value.to_string()))));
    *r.status_mut() = status;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// A JSON error `{"error": message}`.
pub(crate) fn error(status: StatusCode, message: impl Into<String>) -> Resp {
    json(status, &serde_json::json!({ "error": message.into() }))
}

/// The HTTP status for a Locus error code.
pub(crate) fn status_of(e: &locus_proto::Error) -> StatusCode {
    use locus_proto::Code;
    match e.code {
        Code::NOENT => StatusCode::NOT_FOUND,
        Code::ACCES | Code::PERM => StatusCode::FORBIDDEN,
        Code::EXIST | Code::NOTEMPTY => StatusCode::CONFLICT,
        Code::INVAL | Code::NAMETOOLONG | Code::ISDIR | Code::NOTDIR => StatusCode::BAD_REQUEST,
        Code::NOSPC => StatusCode::INSUFFICIENT_STORAGE,
        Code::LIMIT | Code::AGAIN => StatusCode::TOO_MANY_REQUESTS,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// A Locus error as a JSON answer.
pub(crate) fn wire_error(e: &locus_proto::Error) -> Resp {
    error(status_of(e), e.message.clone())
}

/// The value of `name` in the request's query, percent-decoded.
pub(crate) fn query(req: &Req, name: &str) -> Option<String> {
    req.uri().query()?.split('&').find_map(|kv| {
        let v = kv.strip_prefix(name)?.strip_prefix('=')?;
        let v = v.replace('+', " ");
        percent_encoding::percent_decode_str(&v).decode_utf8().ok().map(|s| s.into_owned())
    })
}

/// Reads a request body of at most `max` bytes.
pub(crate) async fn small_body(req: Req, max: usize) -> Result<Vec<u8>, Resp> {
    let mut body = req.into_body();
    let mut out = Vec::new();
    while let Some(frame) = next_frame(&mut body).await {
        let frame = frame.map_err(|e| error(StatusCode::BAD_REQUEST, e.to_string()))?;
        if let Ok(data) = frame.into_data() {
            if out.len() + data.len() > max {
                return Err(error(StatusCode::PAYLOAD_TOO_LARGE, format!("at most {max} bytes")));
            }
            out.extend_from_slice(&data);
        }
    }
    Ok(out)
}

/// The next frame of a request body.
pub(crate) async fn next_frame(
    body: &mut hyper::body::Incoming,
) -> Option<Result<hyper::body::Frame<Bytes>, hyper::Error>> {
    use hyper::body::Body;
    std::future::poll_fn(|cx| std::pin::Pin::new(&mut *body).poll_frame(cx)).await
}

impl Console {
    async fn answer(self: Arc<Self>, req: Req) -> Resp {
        let path = req.uri().path().to_string();
        let method = req.method().clone();
        if method == Method::GET {
            if let Some((_, kind, bytes)) = ASSETS.iter().find(|(p, _, _)| *p == path) {
                let mut r = Response::new(HttpBody::Full(Some(Bytes::from_static(bytes))));
                r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
                r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
                return r;
            }
        }
        let Some(api) = path.strip_prefix("/api/") else {
            // A head's HTTP door shares the port: every other path is a file's.
            if self.shared.is_head() {
                return locus_server::http::answer(&self.shared, req, self.tokens_safe).await;
            }
            return error(StatusCode::NOT_FOUND, "no such page");
        };
        // State changes must come from the console's own script: a custom header needs a
        // CORS preflight no other site passes (the cookie's SameSite=Strict is the first line).
        let changing = method != Method::GET && method != Method::HEAD;
        if changing && req.headers().get("x-locus-console").is_none() {
            return error(StatusCode::FORBIDDEN, "requests that change things must come from the console page");
        }
        if (api, &method) == ("login", &Method::POST) {
            return auth::login(&self, req).await;
        }
        let Some(user) = self.sessions.user(&req) else {
            return error(StatusCode::UNAUTHORIZED, "log in with a token");
        };
        let (shared, subject) = (self.shared.clone(), user.clone());
        let rights =
            tokio::task::spawn_blocking(move || locus_server::acting::Acting::new(&shared, &subject).rights("/"));
        let admin = rights.await.is_ok_and(|r| r.contains(locus_proto::types::Rights::ADMIN));
        let user = auth::User { subject: user, admin };
        match (api, method) {
            ("logout", Method::POST) => self.sessions.logout(&req),
            ("whoami", Method::GET) => {
                json(StatusCode::OK, &serde_json::json!({ "subject": user.subject, "admin": user.admin }))
            }
            ("list", Method::GET) => files::list(&self.shared, &user, &req).await,
            ("preview", Method::GET) => files::preview(&self.shared, &user, &req).await,
            ("download", Method::GET | Method::HEAD) => files::download(&self.shared, &user, &req).await,
            ("upload", Method::PUT) => files::upload(&self.shared, &user, req).await,
            ("load", Method::GET) => self.load.report(&self.shared, &user, query(&req, "file").as_deref()),
            ("runs", Method::GET) => code::runs(&self.shared, &user).await,
            ("cancel", Method::POST) => code::cancel(&self.shared, &user, &req).await,
            _ => error(StatusCode::NOT_FOUND, format!("no API {api}")),
        }
    }
}
