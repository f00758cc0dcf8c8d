//! `copy`, the server-side copy: on one server and on a cluster head, each against a real
//! server on an ephemeral port. A copy replaces its target as a `put` does (readers see
//! the old file or the new one), needs the read right where the source is and the write
//! right where the target is, and refuses a missing source and a directory.

use locus_client::{Client, ClientError};
use locus_proto::types::{Rights, Value};
use locus_proto::Code;
use locus_testkit::TestServer;
use std::os::unix::fs::MetadataExt;

const MIB: usize = 1 << 20;

fn code(e: ClientError) -> Code {
    e.code()
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u32).wrapping_mul(2_654_435_761).rotate_left(seed as u32) as u8 ^ seed).collect()
}

/// Names in `dir` of the export left by uploads (hidden files of puts in progress).
fn leftovers(s: &TestServer, dir: &str) -> Vec<String> {
    std::fs::read_dir(s.local(dir))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(".__locus_put"))
        .collect()
}

#[tokio::test]
async fn a_copy_has_the_sources_bytes_and_mode_and_replaces_its_target() {
    let s = TestServer::start();
    let c = s.client("admin").await;
    c.mkdir("/d", 0o755).await.unwrap();
    // One small (copied on the connection's thread), one larger than a frame (on a
    // thread of its own), and an empty one.
    for (name, data) in [("small", pattern(1000, 1)), ("large", pattern(5 * MIB + 17, 2)), ("empty", Vec::new())] {
        let from = format!("/d/{name}");
        c.write_file(&from, 0o640, &data).await.unwrap();
        let attr = c.copy(&from, &format!("/d/{name}.copy")).await.unwrap();
        assert_eq!((attr.size, attr.mode & 0o7777), (data.len() as u64, 0o640), "{name}");
        assert_eq!(std::fs::read(s.local(&format!("d/{name}.copy"))).unwrap(), data, "{name}");
    }
    // Over an existing file: the name gets a new file (a handle on the old one still
    // reads the old bytes, as after a put), and the source is untouched.
    let old = c.open("/d/small.copy", locus_proto::types::open_flags::READ, 0).await.unwrap().handle;
    let ino = std::fs::metadata(s.local("d/small.copy")).unwrap().ino();
    c.copy("/d/large", "/d/small.copy").await.unwrap();
    assert_eq!(c.read_file("/d/small.copy").await.unwrap(), pattern(5 * MIB + 17, 2));
    assert_ne!(std::fs::metadata(s.local("d/small.copy")).unwrap().ino(), ino);
    assert_eq!(&c.pread(old, 0, 2000).await.unwrap()[..], &pattern(1000, 1)[..]);
    assert_eq!(c.read_file("/d/large").await.unwrap(), pattern(5 * MIB + 17, 2));
    // A file copied onto itself stays whole.
    c.copy("/d/small", "/d/small").await.unwrap();
    assert_eq!(c.read_file("/d/small").await.unwrap(), pattern(1000, 1));
    assert!(leftovers(&s, "d").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_see_the_old_file_or_the_new_one_never_a_mixture() {
    let s = TestServer::start();
    let c = s.client("admin").await;
    let (a, b) = (vec![b'a'; 3 * MIB], vec![b'b'; 3 * MIB]);
    c.write_file("/a", 0o644, &a).await.unwrap();
    c.write_file("/b", 0o644, &b).await.unwrap();
    c.write_file("/t", 0o644, &a).await.unwrap();
    let reader = s.client("admin").await;
    let reads = tokio::spawn(async move {
        let mut seen = std::collections::HashSet::new();
        for _ in 0..60 {
            let got = reader.read_file("/t").await.unwrap();
            assert!(got == vec![b'a'; 3 * MIB] || got == vec![b'b'; 3 * MIB], "a torn read of {} bytes", got.len());
            seen.insert(got[0]);
        }
        seen
    });
    for i in 0..40 {
        c.copy(if i % 2 == 0 { "/b" } else { "/a" }, "/t").await.unwrap();
    }
    let seen = reads.await.unwrap();
    assert!(!seen.is_empty());
    assert!(leftovers(&s, ".").is_empty());
}

#[tokio::test]
async fn a_copy_needs_read_where_the_source_is_and_write_where_the_target_is() {
    let s = TestServer::start();
    let admin = s.client("admin").await;
    let alice = s.client("alice").await;
    for dir in ["/ro", "/rw", "/wo", "/none"] {
        admin.mkdir(dir, 0o755).await.unwrap();
        admin.write_file(&format!("{dir}/f"), 0o644, b"bytes").await.unwrap();
    }
    admin.acl_set("/ro", "alice", Rights::parse("rl").unwrap()).await.unwrap();
    admin.acl_set("/rw", "alice", Rights::parse("rwl").unwrap()).await.unwrap();
    admin.acl_set("/wo", "alice", Rights::parse("wl").unwrap()).await.unwrap();

    alice.copy("/ro/f", "/rw/g").await.unwrap();
    assert_eq!(std::fs::read(s.local("rw/g")).unwrap(), b"bytes");
    // No read right on the source (write alone, or nothing), no write right on the target.
    assert_eq!(code(alice.copy("/wo/f", "/rw/h").await.unwrap_err()), Code::ACCES);
    assert_eq!(code(alice.copy("/none/f", "/rw/h").await.unwrap_err()), Code::ACCES);
    assert_eq!(code(alice.copy("/ro/f", "/ro/g").await.unwrap_err()), Code::ACCES);
    assert_eq!(code(alice.copy("/ro/f", "/none/g").await.unwrap_err()), Code::ACCES);
    assert!(!s.local("rw/h").exists() && !s.local("ro/g").exists() && !s.local("none/g").exists());
    // Nothing leaves the export, nor reaches Locus' own files.
    assert_eq!(code(alice.copy("/../etc/passwd", "/rw/p").await.unwrap_err()), Code::ACCES);
    assert_eq!(code(admin.copy("/ro/.__locus_acl", "/rw/acl").await.unwrap_err()), Code::ACCES);
    for dir in ["ro", "rw", "wo", "none"] {
        assert!(leftovers(&s, dir).is_empty());
    }
}

#[tokio::test]
async fn a_missing_source_or_a_directory_is_refused() {
    let s = TestServer::start();
    let c = s.client("admin").await;
    c.mkdir("/d", 0o755).await.unwrap();
    c.write_file("/d/f", 0o644, b"x").await.unwrap();
    assert_eq!(code(c.copy("/d/missing", "/d/g").await.unwrap_err()), Code::NOENT);
    assert_eq!(code(c.copy("/d", "/e").await.unwrap_err()), Code::ISDIR);
    assert_eq!(code(c.copy("/d/f", "/d").await.unwrap_err()), Code::ISDIR);
    assert_eq!(code(c.copy("/d/f", "/nowhere/g").await.unwrap_err()), Code::NOENT);
    assert!(!s.local("d/g").exists() && !s.local("e").exists());
    assert!(leftovers(&s, "d").is_empty() && leftovers(&s, ".").is_empty());
}

#[tokio::test]
async fn scripts_copy_through_fs_copy() {
    let s = TestServer::start();
    let c = s.client("admin").await;
    let data = pattern(2 * MIB + 3, 5); // over the size copied on a connection's thread
    c.write_file("/big", 0o644, &data).await.unwrap();
    let (values, _) = c
        .script_call("return fs.copy(...).size", vec![Value::Str("/big".into()), Value::Str("/big.copy".into())], &[])
        .await
        .unwrap();
    assert_eq!(values, vec![Value::Int(data.len() as i64)]);
    assert_eq!(std::fs::read(s.local("big.copy")).unwrap(), data);
}

#[tokio::test]
async fn a_copy_breaks_the_promises_on_its_target() {
    let s = TestServer::start();
    let writer = s.client("admin").await;
    let watcher = s.client("admin").await;
    writer.write_file("/src", 0o644, b"new").await.unwrap();
    writer.write_file("/dst", 0o644, b"old").await.unwrap();
    let mut pushes = watcher.subscribe();
    watcher.callbacks(100, 0).await.unwrap();
    watcher.stat("/dst").await.unwrap();
    writer.copy("/src", "/dst").await.unwrap();
    locus_testkit::wait_for_break(&mut pushes, "/dst").await;
}

/// On a cluster head: a file inline in the namespace and one on a data node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_head_copies_inline_files_and_files_on_its_nodes() {
    let head = TestServer::head(None, |_| {});
    let _node = TestServer::data_node(&head);
    let admin: Client = head.client("admin").await;
    let alice = head.client("alice").await;
    admin.mkdir("/d", 0o755).await.unwrap();
    let (small, large) = (pattern(1000, 3), pattern(3 * MIB + 5, 4));
    admin.write_file("/d/small", 0o600, &small).await.unwrap();
    admin.write_file("/d/large", 0o644, &large).await.unwrap();
    let attr = admin.copy("/d/small", "/d/small.copy").await.unwrap();
    assert_eq!((attr.size, attr.mode & 0o7777), (1000, 0o600));
    assert_eq!(admin.read_file("/d/small.copy").await.unwrap(), small);
    admin.copy("/d/large", "/d/small.copy").await.unwrap();
    assert_eq!(admin.read_file("/d/small.copy").await.unwrap(), large);
    assert_eq!(admin.read_file("/d/large").await.unwrap(), large);
    // A copy is a new file: writing one leaves the other as it was.
    admin.write_file("/d/large", 0o644, b"changed").await.unwrap();
    assert_eq!(admin.read_file("/d/small.copy").await.unwrap(), large);

    assert_eq!(code(admin.copy("/d/missing", "/d/x").await.unwrap_err()), Code::NOENT);
    assert_eq!(code(admin.copy("/d", "/e").await.unwrap_err()), Code::ISDIR);
    assert_eq!(code(admin.copy("/d/small", "/d").await.unwrap_err()), Code::ISDIR);
    admin.mkdir("/pub", 0o755).await.unwrap();
    admin.acl_set("/d", "alice", Rights::parse("rl").unwrap()).await.unwrap();
    admin.acl_set("/pub", "alice", Rights::parse("rwl").unwrap()).await.unwrap();
    alice.copy("/d/small", "/pub/small").await.unwrap();
    assert_eq!(alice.read_file("/pub/small").await.unwrap(), small);
    assert_eq!(code(alice.copy("/pub/small", "/d/back").await.unwrap_err()), Code::ACCES);
    admin.acl_set("/pub", "alice", Rights::parse("wl").unwrap()).await.unwrap();
    assert_eq!(code(alice.copy("/pub/small", "/pub/again").await.unwrap_err()), Code::ACCES);
    // Through a script on the head (its session waits for the copy).
    let args = vec![Value::Str("/d/small".into()), Value::Str("/d/scripted".into())];
    let (values, _) = admin.script_call("return fs.copy(...).size", args, &[]).await.unwrap();
    assert_eq!(values, vec![Value::Int(1000)]);
    assert_eq!(admin.read_file("/d/scripted").await.unwrap(), small);
}
