//! Logging in: a subject presents its token (`SUBJECT:TOKEN`, as `locus token` prints it,
//! or the bare token) once; the console answers with a random session id in a cookie the
//! page's scripts cannot read (`HttpOnly`) and other sites cannot send (`SameSite=Strict`).

use crate::{error, json, small_body, Console, Req, Resp};
use hyper::header::{self, HeaderValue};
use hyper::StatusCode;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// The cookie's name.
pub const COOKIE: &str = "locus_console";
/// Sessions kept at most; the oldest go first when more log in.
const MAX_SESSIONS: usize = 10_000;

/// Who a request acts as.
pub struct User {
    pub subject: String,
    /// Holds the admin right at the export root: sees everyone's runs.
    pub admin: bool,
}

/// Logged-in sessions by id.
pub struct Sessions {
    ttl: Duration,
    /// The console is served over TLS: cookies say `Secure`.
    secure: bool,
    by_id: Mutex<HashMap<String, (String, Instant)>>,
}

impl Sessions {
    pub fn new(ttl: Duration, secure: bool) -> Sessions {
        Sessions { ttl, secure, by_id: Mutex::new(HashMap::new()) }
    }

    fn cookie(&self, id: &str, max_age: u64) -> HeaderValue {
        let secure = if self.secure { "; Secure" } else { "" };
        HeaderValue::from_str(&format!("{COOKIE}={id}; HttpOnly; SameSite=Strict; Path=/; Max-Age={max_age}{secure}"))
            .expect("hex and ASCII")
    }

    /// Starts a session for `subject`; returns its id.
    fn start(&self, subject: &str) -> String {
        let mut id = [0u8; 32];
        getrandom::fill(&mut id).expect("the OS provides randomness");
        let id = hex::encode(id);
        let mut map = self.by_id.lock();
        map.retain(|_, (_, since)| since.elapsed() < self.ttl);
        if map.len() >= MAX_SESSIONS {
            if let Some(oldest) = map.iter().min_by_key(|(_, (_, since))| *since).map(|(k, _)| k.clone()) {
                map.remove(&oldest);
            }
        }
        map.insert(id.clone(), (subject.to_string(), Instant::now()));
        id
    }

    /// The subject of the request's session, if it has a live one.
    pub fn user(&self, req: &Req) -> Option<String> {
        let id = session_id(req)?;
        let map = self.by_id.lock();
        let (subject, since) = map.get(id)?;
        (since.elapsed() < self.ttl).then(|| subject.clone())
    }

    /// Ends the request's session and clears its cookie.
    pub fn logout(&self, req: &Req) -> Resp {
        if let Some(id) = session_id(req) {
            self.by_id.lock().remove(id);
        }
        let mut r = json(StatusCode::OK, &serde_json::json!({}));
        r.headers_mut().insert(header::SET_COOKIE, self.cookie("", 0));
        r
    }
}

/// The session id the request's cookie carries.
fn session_id(req: &Req) -> Option<&str> {
    req.headers()
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|kv| kv.trim().strip_prefix(COOKIE)?.strip_prefix('='))
}

/// Why a login is refused on a plain-HTTP console off loopback.
pub const TOKEN_REFUSED: &str = "this console speaks plain HTTP on a non-loopback address, where a token would \
     cross the network readable, so it takes no logins: serve it over TLS (locus serve --tls) or on a loopback \
     address (--listen 127.0.0.1:PORT)";

/// `POST /api/login` with `{"token": "..."}`: starts a session, or refuses (401; 403
/// when the console takes no tokens, see [`TOKEN_REFUSED`]).
pub async fn login(console: &Console, req: Req) -> Resp {
    if !console.tokens_safe {
        tracing::warn!("console login refused: plain HTTP on a non-loopback address");
        return error(StatusCode::FORBIDDEN, TOKEN_REFUSED);
    }
    let body = match small_body(req, 4096).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let presented: Option<String> = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v.get("token").and_then(|t| t.as_str()).map(str::to_string));
    let Some(presented) = presented else { return error(StatusCode::BAD_REQUEST, "send {\"token\": \"...\"}") };
    let Some(subject) = console.shared.tokens.subject_of(&presented).map(str::to_string) else {
        // Tokens are 256 bits: the pause only keeps a guesser from flooding the log.
        tokio::time::sleep(Duration::from_millis(200)).await;
        tracing::info!("console login refused");
        return error(StatusCode::UNAUTHORIZED, "that token is not known here");
    };
    tracing::info!(subject, "console login");
    let id = console.sessions.start(&subject);
    let mut r = json(StatusCode::OK, &serde_json::json!({ "subject": subject }));
    r.headers_mut().insert(header::SET_COOKIE, console.sessions.cookie(&id, console.sessions.ttl.as_secs()));
    r
}
