//! Prometheus metrics (`locus serve --metrics ADDR`): what the server did, for scrapers.
//!
//! Operations are counted as they are answered: a counter by operation and result, and
//! a histogram of service times by operation. Everything else the server already keeps
//! is read when scraped: bytes read and written (the store's accounting), connected
//! clients, code runs and their use per subject (the storelet accounts, active-file
//! handlers included), runs stopped by each limit, and on a cluster head the read-only
//! runs planned from the namespace and those over a kept plan. A request answered later (a script,
//! a storelet, an active file being made) counts when it is dispatched. The text is the OpenMetrics format of
//! the `prometheus-client` crate, served at `GET /metrics` by a minimal HTTP responder.
//!
//! **Exposure.** The series name subjects and show the server's load, so the endpoint
//! listens on loopback unless the operator writes another address (`--metrics PORT` is
//! `127.0.0.1:PORT`, see [`listen_address`]), and can require a bearer token
//! (`--metrics-token-file FILE`: scrapes send `Authorization: Bearer TOKEN`, as
//! Prometheus' `authorization: { credentials_file: FILE }` does); the token is its own,
//! never a subject's, since plain HTTP carries it readable.

use crate::Shared;
use locus_proto::Code;
use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

// Labels of the per-request metrics are static strings: counting a request allocates
// nothing.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpResult {
    op: &'static str,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Op {
    op: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Subject {
    subject: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Limit {
    limit: String,
}

/// The metrics updated as the server works.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    operations: Family<OpResult, Counter>,
    durations: Family<Op, Histogram>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("locus");
        let operations = Family::<OpResult, Counter>::default();
        registry.register("operations", "Requests answered, by operation and result", operations.clone());
        let durations = Family::<Op, Histogram>::new_with_constructor(|| {
            // 5 µs to about 5 s.
            Histogram::new(exponential_buckets(5e-6, 2.0, 21))
        });
        registry.register("operation_duration_seconds", "Service time of requests, by operation", durations.clone());
        Metrics { registry, operations, durations }
    }
}

impl Metrics {
    /// Counts a request answered with `outcome` after `took`.
    pub fn answered(&self, op: u16, outcome: Result<(), Code>, took: Duration) {
        let op = locus_proto::ops::by_code(op).map_or("unknown", |o| o.name);
        let result = outcome.map_or_else(Code::name, |()| "ok");
        self.operations.get_or_create(&OpResult { op, result }).inc();
        self.durations.get_or_create(&Op { op }).observe(took.as_secs_f64());
    }

    /// The metrics as OpenMetrics text: those kept here, then those read from `shared`.
    pub fn render(&self, shared: &Shared) -> String {
        let mut text = String::new();
        let now = read_now(shared);
        // Writing to a String cannot fail.
        let _ = encode_registry(&mut text, &self.registry);
        let _ = encode_registry(&mut text, &now);
        let _ = encode_eof(&mut text);
        text
    }
}

/// A registry of what the server keeps elsewhere, read at this moment.
fn read_now(shared: &Shared) -> Registry {
    let mut r = Registry::with_prefix("locus");
    let counter = |v: u64| {
        let c = Counter::<u64>::default();
        c.inc_by(v);
        c
    };
    let export = shared.store.counters().export();
    r.register("read_bytes", "Bytes read from files of the export", counter(export.read_bytes));
    r.register("written_bytes", "Bytes written to files of the export", counter(export.write_bytes));
    let clients = Gauge::<i64>::default();
    clients.set(shared.registry.count() as i64);
    r.register("connections", "Clients connected now", clients);

    let report = shared.storelets.stats("", true);
    let (runs, cpu, read, written) = (
        Family::<Subject, Counter>::default(),
        Family::<Subject, Counter<f64>>::default(),
        Family::<Subject, Counter>::default(),
        Family::<Subject, Counter>::default(),
    );
    for s in &report.subjects {
        let who = Subject { subject: s.subject.clone() };
        runs.get_or_create(&who).inc_by(s.runs);
        cpu.get_or_create(&who).inc_by(s.cpu_us as f64 / 1e6);
        read.get_or_create(&who).inc_by(s.read_bytes);
        written.get_or_create(&who).inc_by(s.write_bytes);
    }
    r.register("code_runs", "Storelet and active-file handler runs finished, by subject", runs);
    r.register("code_cpu_seconds", "CPU time of code runs, by subject", cpu);
    r.register("code_read_bytes", "Bytes code runs read, by subject", read);
    r.register("code_written_bytes", "Bytes code runs wrote, by subject", written);
    let limits = Family::<Limit, Counter>::default();
    for (limit, n) in shared.storelets.limits_tripped() {
        limits.get_or_create(&Limit { limit: limit.to_string() }).inc_by(n);
    }
    r.register("limits_tripped", "Code runs stopped by a limit since the server started, by limit", limits);
    #[cfg(feature = "cluster")]
    if let Some(head) = &shared.head {
        let (planned, reused) = head.run_plans();
        r.register("cluster_runs_planned", "Read-only cluster runs planned from the namespace", counter(planned));
        r.register(
            "cluster_runs_over_kept_plans",
            "Read-only cluster runs over a plan kept from an earlier run",
            counter(reused),
        );
    }
    r
}

/// Longest request head the responder reads.
const MAX_REQUEST: usize = 8 << 10;

/// Where `--metrics SPEC` listens: a bare port is on loopback (`9100` is
/// `127.0.0.1:9100`); anything else is the address as written (`0.0.0.0:9100`,
/// `[::1]:9100`), so exposing the endpoint beyond this host is always explicit.
pub fn listen_address(spec: &str) -> Result<String, String> {
    let spec = spec.trim();
    if let Ok(port) = spec.parse::<u16>() {
        return Ok(format!("127.0.0.1:{port}"));
    }
    match spec.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => Ok(spec.to_string()),
        _ => Err(format!("{spec}: give a PORT (on loopback) or HOST:PORT")),
    }
}

/// Whether the request head carries `Authorization: Bearer TOKEN` with this token.
fn authorized(head: &[u8], token: &str) -> bool {
    let Ok(text) = std::str::from_utf8(head) else { return false };
    text.split("\r\n").skip(1).any(|line| {
        let Some((name, value)) = line.split_once(':') else { return false };
        let presented = value.trim().strip_prefix("Bearer ").map(str::trim);
        name.trim().eq_ignore_ascii_case("authorization")
            && presented.is_some_and(|p| locus_proto::auth::proofs_equal(p.as_bytes(), token.as_bytes()))
    })
}

/// Serves `GET /metrics` on `listener` until the task is dropped. A minimal responder:
/// one request per connection, anything else is 404, a head larger than 8 KiB or slower
/// than 5 s is dropped. With a `token`, a scrape without `Authorization: Bearer TOKEN`
/// is answered 401.
pub async fn serve(listener: tokio::net::TcpListener, shared: Arc<Shared>, token: Option<String>) {
    let token: Option<Arc<str>> = token.map(Into::into);
    loop {
        let Ok((mut sock, _)) = listener.accept().await else { continue };
        let (shared, token) = (shared.clone(), token.clone());
        tokio::spawn(async move {
            let mut head = Vec::new();
            let read = tokio::time::timeout(Duration::from_secs(5), async {
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_REQUEST {
                    let n = sock.read(&mut buf).await?;
                    if n == 0 {
                        break;
                    }
                    head.extend_from_slice(&buf[..n]);
                }
                Ok::<_, std::io::Error>(())
            })
            .await;
            if !matches!(read, Ok(Ok(()))) {
                return;
            }
            let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
            let allowed = token.as_deref().is_none_or(|t| authorized(&head, t));
            let (status, body) = if !allowed {
                (
                    "401 Unauthorized",
                    "this endpoint needs 'Authorization: Bearer TOKEN' (--metrics-token-file)\n".to_string(),
                )
            } else if line.starts_with(b"GET /metrics ") {
                ("200 OK", shared.metrics.render(&shared))
            } else {
                ("404 Not Found", "try GET /metrics\n".to_string())
            };
            let challenge = if allowed { "" } else { "WWW-Authenticate: Bearer realm=\"locus-metrics\"\r\n" };
            let reply = format!(
                "HTTP/1.1 {status}\r\nContent-Type: application/openmetrics-text; version=1.0.0; charset=utf-8\r\n{challenge}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = sock.write_all(reply.as_bytes()).await;
            let _ = sock.shutdown().await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::{authorized, listen_address};

    #[test]
    fn a_bare_port_listens_on_loopback_and_other_addresses_are_as_written() {
        assert_eq!(listen_address("9100").unwrap(), "127.0.0.1:9100");
        assert_eq!(listen_address("0").unwrap(), "127.0.0.1:0");
        assert_eq!(listen_address("0.0.0.0:9100").unwrap(), "0.0.0.0:9100");
        assert_eq!(listen_address("[::1]:9100").unwrap(), "[::1]:9100");
        assert_eq!(listen_address("localhost:9100").unwrap(), "localhost:9100");
        for bad in [":9100", "host", "host:port", "99999", ""] {
            assert!(listen_address(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn only_the_right_bearer_token_authorizes() {
        let head = |auth: &str| format!("GET /metrics HTTP/1.1\r\nHost: x\r\n{auth}\r\n\r\n").into_bytes();
        assert!(authorized(&head("Authorization: Bearer s3cret"), "s3cret"));
        assert!(authorized(&head("authorization:   Bearer s3cret  "), "s3cret"));
        assert!(!authorized(&head("Authorization: Bearer s3cre"), "s3cret"));
        assert!(!authorized(&head("Authorization: Basic s3cret"), "s3cret"));
        assert!(!authorized(&head("X-Authorization: Bearer s3cret"), "s3cret"));
        assert!(!authorized(&head(""), "s3cret"));
        // Not in the request line.
        assert!(!authorized(b"GET /metrics?Authorization:%20Bearer%20s3cret HTTP/1.1\r\n\r\n", "s3cret"));
    }
}
