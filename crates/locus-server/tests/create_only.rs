//! A `put` with `PUT_NEW` in its mode makes a new file or nothing (what S3's
//! `If-None-Match: *` and fsspec's `mode="create"` rest on): on one server and on a
//! cluster head with a data node, an upload that finds its name taken when it ends
//! (taken by another client while it was under way) fails with `EXIST` and leaves the
//! other client's bytes. Real servers on ephemeral ports.

use locus_proto::ops::PUT_NEW;
use locus_proto::Code;
use locus_testkit::TestServer;

async fn create_only_holds(s: &TestServer) {
    let (a, b) = (s.client("admin").await, s.client("admin").await);
    let mine: Vec<u8> = (0..3u32 << 20).map(|i| (i % 253) as u8).collect();

    // A free name: made, with the mode's permissions only.
    let mut up = a.put_stream("/new", 0o640 | PUT_NEW).unwrap();
    up.write(&mine).await.unwrap();
    up.finish().await.unwrap();
    assert_eq!(b.read_file("/new").await.unwrap(), mine);
    assert_eq!(b.stat("/new").await.unwrap().mode & 0o7777, 0o640);

    // A taken name: refused, and the file is as it was.
    let mut up = a.put_stream("/new", 0o644 | PUT_NEW).unwrap();
    up.write(b"second").await.unwrap();
    assert_eq!(up.finish().await.unwrap_err().code(), Code::EXIST);
    assert_eq!(b.read_file("/new").await.unwrap(), mine);

    // Taken while the upload is under way: the server has begun it (frames flagged
    // MORE went, and a later request on the same connection was answered) when another
    // client makes the name; the upload's end finds it taken.
    let mut up = a.put_stream("/raced", 0o644 | PUT_NEW).unwrap();
    up.write(&mine).await.unwrap();
    a.ping().await.unwrap();
    b.write_file("/raced", 0o600, b"theirs").await.unwrap();
    assert_eq!(up.finish().await.unwrap_err().code(), Code::EXIST);
    assert_eq!(b.read_file("/raced").await.unwrap(), b"theirs");

    // Without the bit, a put replaces as always.
    let mut up = a.put_stream("/raced", 0o644).unwrap();
    up.write(b"replaced").await.unwrap();
    up.finish().await.unwrap();
    assert_eq!(b.read_file("/raced").await.unwrap(), b"replaced");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_only_put_makes_a_new_file_or_nothing_on_one_server() {
    let s = TestServer::start();
    create_only_holds(&s).await;
    // Nothing of the refused uploads is left beside the files.
    let mut names: Vec<String> = std::fs::read_dir(s.root())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != ".__locus_acl")
        .collect();
    names.sort();
    assert_eq!(names, ["new", "raced"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_only_put_makes_a_new_file_or_nothing_on_a_cluster_head() {
    let head = TestServer::head(None, |_| {});
    let _node = TestServer::data_node(&head);
    create_only_holds(&head).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_only_put_finds_the_name_made_on_another_device() {
    // Two devices under one namespace: the upload's hidden file is on one; a writer
    // beside it makes the name on the other while the upload is under way.
    let s = TestServer::start_with(|c| c.devices = vec![c.root.parent().unwrap().join("dev1")]);
    let devices = [s.root(), s.scratch().join("dev1")];
    let a = s.client("admin").await;
    let mut up = a.put_stream("/raced", 0o644 | PUT_NEW).unwrap();
    up.write(&vec![7u8; 3 << 20]).await.unwrap();
    a.ping().await.unwrap();
    let hidden = |d: &std::path::Path| {
        std::fs::read_dir(d).unwrap().any(|e| e.unwrap().file_name().to_string_lossy().starts_with(".__locus_put"))
    };
    let other = devices.iter().find(|d| !hidden(d)).expect("the upload is on one device");
    std::fs::write(other.join("raced"), b"theirs").unwrap();
    assert_eq!(up.finish().await.unwrap_err().code(), Code::EXIST);
    assert_eq!(a.read_file("/raced").await.unwrap(), b"theirs");
    assert!(devices.iter().all(|d| !hidden(d)), "the upload's hidden file is gone");
}
