//! The metrics endpoint, scraped over HTTP after known operations.

use locus_testkit::{build_storelet, TestServer};
use std::io::{Read, Write};
use std::time::Duration;

fn scrape(addr: std::net::SocketAddr, path: &str) -> String {
    scrape_with(addr, path, "")
}

/// A scrape with extra header lines (each ending in CRLF).
fn scrape_with(addr: std::net::SocketAddr, path: &str, headers: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: locus\r\n{headers}\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text
}

#[tokio::test]
async fn the_metrics_endpoint_holds_the_series_of_known_operations() {
    let srv = TestServer::start_with(|c| c.storelets.limits.wall = Duration::from_secs(1));
    srv.put_local("f", &[7u8; 1000]);
    let c = srv.client("admin").await;
    c.stat("/f").await.unwrap();
    c.stat("/missing").await.unwrap_err();
    assert_eq!(c.read_file("/f").await.unwrap().len(), 1000);
    let hostile = build_storelet("hostile");
    c.storelet_run(&hostile, "/", vec!["spin".into()], false).await.unwrap_err();

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(locus_server::metrics::serve(listener, srv.shared().clone(), None));
    let text = tokio::task::spawn_blocking(move || scrape(addr, "/metrics")).await.unwrap();
    assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
    for series in [
        "locus_operations_total{op=\"stat\",result=\"ok\"} 1",
        "locus_operations_total{op=\"stat\",result=\"ENOENT\"} 1",
        "locus_operation_duration_seconds_count{op=\"stat\"} 2",
        "locus_read_bytes_total 1000",
        "locus_connections 1",
        "locus_code_runs_total{subject=\"admin\"} 1",
        "locus_limits_tripped_total{limit=\"time\"} 1",
    ] {
        assert!(text.contains(series), "no `{series}` in:\n{text}");
    }
    assert!(text.trim_end().ends_with("# EOF"));
    let other = tokio::task::spawn_blocking(move || scrape(addr, "/other")).await.unwrap();
    assert!(other.starts_with("HTTP/1.1 404"), "{other}");
}

#[tokio::test]
async fn a_metrics_token_is_required_when_one_is_set() {
    let srv = TestServer::start();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(locus_server::metrics::serve(listener, srv.shared().clone(), Some("scrape-me".into())));
    let get = move |headers: &'static str| tokio::task::spawn_blocking(move || scrape_with(addr, "/metrics", headers));
    let bare = get("").await.unwrap();
    assert!(bare.starts_with("HTTP/1.1 401"), "{bare}");
    assert!(bare.contains("WWW-Authenticate: Bearer") && !bare.contains("locus_connections"), "{bare}");
    let wrong = get("Authorization: Bearer scrape-you\r\n").await.unwrap();
    assert!(wrong.starts_with("HTTP/1.1 401"), "{wrong}");
    let admin = get("Authorization: Bearer admin:admin-token\r\n").await.unwrap();
    assert!(admin.starts_with("HTTP/1.1 401"), "a subject's token is not the metrics token: {admin}");
    let good = get("Authorization: Bearer scrape-me\r\n").await.unwrap();
    assert!(good.starts_with("HTTP/1.1 200 OK") && good.contains("locus_connections"), "{good}");
}
