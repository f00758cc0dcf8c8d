//! Client-API integration tests against a real server on an ephemeral port.

use locus_client::types::{open_flags as of, Rights, SetTime, Time};
use locus_client::{Client, ClientError, ConnectOptions, Credentials};
use locus_proto::Code;
use locus_testkit::TestServer;
use std::time::Duration;

fn code(e: ClientError) -> Code {
    e.code()
}

#[tokio::test]
async fn every_file_operation_round_trips() {
    let s = TestServer::start();
    let c = s.client("admin").await;
    assert_eq!(c.whoami().await.unwrap(), "admin");
    c.ping().await.unwrap();

    c.mkdir("/d", 0o755).await.unwrap();
    assert!(c.stat("/d").await.unwrap().is_dir());

    // open/pwrite/pread/fstat/fsync/ftruncate/close
    let h = c.open("/d/f", of::READ | of::WRITE | of::CREATE, 0o644).await.unwrap().handle;
    assert_eq!(c.pwrite(h, 0, b"hello world").await.unwrap(), 11);
    assert_eq!(&c.pread(h, 6, 100).await.unwrap()[..], b"world");
    assert_eq!(c.pread(h, 100, 10).await.unwrap().len(), 0);
    assert_eq!(c.fstat(h).await.unwrap().size, 11);
    c.fsync(h).await.unwrap();
    c.ftruncate(h, 5).await.unwrap();
    assert_eq!(c.fstat(h).await.unwrap().size, 5);
    c.close(h).await.unwrap();
    assert_eq!(code(c.close(h).await.unwrap_err()), Code::BADF);
    assert_eq!(std::fs::read(s.local("d/f")).unwrap(), b"hello");

    // whole-file put/get, including an empty file and one of several chunks
    let big: Vec<u8> = (0..3_500_000u32).map(|i| (i % 251) as u8).collect();
    c.write_file("/d/big", 0o600, &big).await.unwrap();
    assert_eq!(c.read_file("/d/big").await.unwrap(), big);
    assert_eq!(c.stat("/d/big").await.unwrap().mode & 0o777, 0o600);
    let edge = &big[..2 * locus_client::PUT_CHUNK]; // ends exactly at a frame's end
    c.write_file_cached("/d/edge", 0o644, edge).await.unwrap();
    assert_eq!(c.read_file("/d/edge").await.unwrap(), edge);
    c.write_file("/d/empty", 0o644, b"").await.unwrap();
    assert_eq!(c.read_file("/d/empty").await.unwrap(), b"");

    // readdir with attributes, hidden ACL files
    let mut names: Vec<String> = c.readdir("/d").await.unwrap().into_iter().map(|e| e.name).collect();
    names.sort();
    assert_eq!(names, ["big", "edge", "empty", "f"]);
    assert!(!c.readdir("/").await.unwrap().iter().any(|e| e.name.starts_with(".__locus")));

    // symlink/readlink/lstat, link, rename, truncate, chmod, utimes, statfs, access
    c.symlink("f", "/d/ln").await.unwrap();
    assert_eq!(c.readlink("/d/ln").await.unwrap(), "f");
    assert!(c.lstat("/d/ln").await.unwrap().is_symlink());
    assert_eq!(c.stat("/d/ln").await.unwrap().size, 5);
    c.link("/d/f", "/d/hard").await.unwrap();
    assert_eq!(c.stat("/d/f").await.unwrap().nlink, 2);
    c.rename("/d/hard", "/d/renamed").await.unwrap();
    assert!(s.local("d/renamed").exists() && !s.local("d/hard").exists());
    c.truncate("/d/renamed", 2).await.unwrap();
    assert_eq!(c.stat("/d/f").await.unwrap().size, 2);
    c.chmod("/d/f", 0o640).await.unwrap();
    assert_eq!(c.stat("/d/f").await.unwrap().mode & 0o777, 0o640);
    let t = Time { sec: 1_000_000_000, nsec: 5 };
    c.utimes("/d/f", SetTime::Omit, SetTime::At(t)).await.unwrap();
    assert_eq!(c.stat("/d/f").await.unwrap().mtime, t);
    assert!(c.statfs("/").await.unwrap().blocks > 0);
    c.access("/d/f", 4 | 2).await.unwrap();
    assert_eq!(code(c.access("/d/nope", 0).await.unwrap_err()), Code::NOENT);

    // unlink, rmdir
    for f in ["f", "ln", "renamed", "big", "edge", "empty"] {
        c.unlink(&format!("/d/{f}")).await.unwrap();
    }
    c.rmdir("/d").await.unwrap();
    assert!(!s.local("d").exists());
}

#[tokio::test]
async fn errors_keep_their_errno() {
    let s = TestServer::start();
    let c = s.client("admin").await;
    s.put_local("file", b"x");
    std::fs::create_dir(s.local("dir")).unwrap();
    s.put_local("full/x", b"x");
    assert_eq!(code(c.stat("/missing").await.unwrap_err()), Code::NOENT);
    assert_eq!(code(c.mkdir("/dir", 0o755).await.unwrap_err()), Code::EXIST);
    assert_eq!(code(c.rmdir("/full").await.unwrap_err()), Code::NOTEMPTY);
    assert_eq!(code(c.rmdir("/file").await.unwrap_err()), Code::NOTDIR);
    assert_eq!(code(c.unlink("/dir").await.unwrap_err()), Code::ISDIR);
    assert_eq!(code(c.readdir("/file").await.unwrap_err()), Code::NOTDIR);
    assert_eq!(
        code(c.open("/file", of::READ | of::WRITE | of::CREATE | of::EXCLUSIVE, 0o644).await.unwrap_err()),
        Code::EXIST
    );
    assert_eq!(code(c.readlink("/file").await.unwrap_err()), Code::INVAL);
    assert_eq!(code(c.open("/file", 1 << 20, 0).await.unwrap_err()), Code::INVAL);
    assert_eq!(code(c.read_file("/dir").await.unwrap_err()), Code::ISDIR);
    let h = c.open("/file", of::READ, 0).await.unwrap().handle;
    assert_eq!(code(c.pwrite(h, 0, b"y").await.unwrap_err()), Code::BADF);
    assert_eq!(code(c.pread(999, 0, 1).await.unwrap_err()), Code::BADF);
    let e = c.stat("/missing").await.unwrap_err();
    assert_eq!(e.errno(), 2);
    assert!(e.to_string().contains("missing"), "{e}");
    // the connection is still good after all those errors
    c.ping().await.unwrap();
}

#[tokio::test]
async fn authentication_failures_are_refused() {
    let s = TestServer::start();
    let mut o = s.options("admin");
    o.credentials.token = "wrong".into();
    assert!(matches!(Client::connect(&o).await, Err(ClientError::Auth(_))));
    let o = ConnectOptions {
        credentials: Credentials { subject: "mallory".into(), token: "x".into() },
        ..s.options("admin")
    };
    assert!(matches!(Client::connect(&o).await, Err(ClientError::Auth(_))));
    // a good login still works afterwards
    s.client("admin").await.ping().await.unwrap();
}

#[tokio::test]
async fn acls_decide_every_operation() {
    let s = TestServer::start();
    let admin = s.client("admin").await;
    let alice = s.client("alice").await;
    s.put_local("pub/readme", b"hi");
    s.put_local("secret/key", b"k");

    // no rights at all yet
    assert_eq!(code(alice.stat("/pub/readme").await.unwrap_err()), Code::ACCES);
    assert_eq!(code(alice.readdir("/").await.unwrap_err()), Code::ACCES);

    admin.acl_set("/pub", "alice", Rights::parse("rl").unwrap()).await.unwrap();
    assert_eq!(alice.read_file("/pub/readme").await.unwrap(), b"hi");
    assert_eq!(alice.readdir("/pub").await.unwrap().len(), 1);
    assert_eq!(code(alice.write_file("/pub/new", 0o644, b"x").await.unwrap_err()), Code::ACCES);
    assert_eq!(code(alice.unlink("/pub/readme").await.unwrap_err()), Code::ACCES);
    assert_eq!(code(alice.acl_set("/pub", "alice", Rights::ALL).await.unwrap_err()), Code::ACCES);
    assert_eq!(code(alice.read_file("/secret/key").await.unwrap_err()), Code::ACCES);
    assert_eq!(code(alice.stats(5).await.unwrap_err()), Code::ACCES);

    // subdirectories inherit until they get an ACL of their own
    std::fs::create_dir(s.local("pub/sub")).unwrap();
    s.put_local("pub/sub/x", b"x");
    assert_eq!(alice.read_file("/pub/sub/x").await.unwrap(), b"x");
    admin.acl_set("/pub/sub", "alice", Rights(0)).await.unwrap();
    assert_eq!(code(alice.read_file("/pub/sub/x").await.unwrap_err()), Code::ACCES);
    assert_eq!(alice.read_file("/pub/readme").await.unwrap(), b"hi");

    // write, delete, and the `*` subject
    admin.acl_set("/pub", "*", Rights::parse("wd").unwrap()).await.unwrap();
    alice.write_file("/pub/new", 0o644, b"x").await.unwrap();
    alice.unlink("/pub/new").await.unwrap();
    let acl = admin.acl_get("/pub").await.unwrap();
    assert!(acl.iter().any(|e| e.subject == "alice" && e.rights.to_string() == "rl"));
    assert!(acl.iter().any(|e| e.subject == "*" && e.rights.to_string() == "wd"));

    // a symlink in a readable directory does not lend its directory's rights to the target
    std::os::unix::fs::symlink("../secret/key", s.local("pub/key")).unwrap();
    assert_eq!(code(alice.read_file("/pub/key").await.unwrap_err()), Code::ACCES);
    // the ACL file itself is out of reach
    assert_eq!(code(admin.read_file("/pub/.__locus_acl").await.unwrap_err()), Code::ACCES);
    assert_eq!(code(admin.unlink("/.__locus_acl").await.unwrap_err()), Code::ACCES);
    // and an emptied directory with an ACL of its own can still be removed
    std::fs::remove_file(s.local("pub/sub/x")).unwrap();
    admin.rmdir("/pub/sub").await.unwrap();
}

#[tokio::test]
async fn paths_cannot_escape_the_export() {
    let s = TestServer::start();
    let c = s.client("admin").await;
    std::fs::write(s.scratch().join("outside"), b"secret").unwrap();
    std::fs::create_dir(s.local("d")).unwrap();
    std::os::unix::fs::symlink("../../outside", s.local("d/rel")).unwrap();
    std::os::unix::fs::symlink(s.scratch().join("outside"), s.local("d/abs")).unwrap();
    std::os::unix::fs::symlink(s.scratch(), s.local("d/dirlink")).unwrap();
    for p in ["/../outside", "/d/../../outside", "/d/rel", "/d/abs", "/d/dirlink/outside"] {
        let e = c.read_file(p).await.unwrap_err();
        assert_eq!(code(e), Code::ACCES, "{p}");
        assert!(c.stat(p).await.is_err(), "{p}");
    }
    assert!(c.write_file("/d/dirlink/new", 0o644, b"x").await.is_err());
    assert!(c.mkdir("/d/dirlink/newdir", 0o755).await.is_err());
    assert!(c.rename("/d/rel", "/../moved").await.is_err());
    assert!(c.symlink("x", "/../evil").await.is_err());
    assert!(!s.scratch().join("new").exists() && !s.scratch().join("newdir").exists());
    // `..` that stays inside is fine
    s.put_local("d/in", b"ok");
    assert_eq!(c.read_file("/d/../d/in").await.unwrap(), b"ok");
}

#[tokio::test]
async fn a_symlink_swapped_in_during_operations_never_escapes() {
    let s = TestServer::start();
    std::fs::write(s.scratch().join("outside"), b"secret").unwrap();
    std::fs::create_dir_all(s.local("race/real")).unwrap();
    s.put_local("race/real/f", b"inside");
    let root = s.root();
    let outside = s.scratch().to_path_buf();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    // Swap `race/sw` between a real directory and a symlink pointing out, as fast as possible.
    let swapper = std::thread::spawn(move || {
        let sw = root.join("race/sw");
        let tmp = root.join("race/tmp");
        let mut i = 0u64;
        while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
            let _ = std::fs::remove_file(&tmp);
            let _ = std::fs::remove_dir_all(&tmp);
            if i.is_multiple_of(2) {
                let _ = std::os::unix::fs::symlink(&outside, &tmp);
            } else {
                let _ = std::fs::create_dir(&tmp);
                let _ = std::fs::write(tmp.join("outside"), b"inside");
            }
            let _ = std::fs::rename(&tmp, &sw);
            i += 1;
        }
    });
    let c = s.client("admin").await;
    let mut ok = 0;
    for _ in 0..2000 {
        if let Ok(data) = c.read_file("/race/sw/outside").await {
            assert_eq!(data, b"inside", "read escaped through a swapped symlink");
            ok += 1;
        }
        let _ = c.write_file("/race/sw/written", 0o644, b"w").await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    swapper.join().unwrap();
    assert!(!s.scratch().join("written").exists(), "a write escaped through a swapped symlink");
    assert_eq!(std::fs::read(s.scratch().join("outside")).unwrap(), b"secret");
    eprintln!("{ok} reads landed inside while racing");
}

#[tokio::test]
async fn a_handle_follows_its_object_across_rename_and_unlink() {
    let s = TestServer::start();
    let c = s.client("admin").await;
    c.write_file("/a", 0o644, b"contents").await.unwrap();
    let h = c.open("/a", of::READ, 0).await.unwrap().handle;
    c.rename("/a", "/b").await.unwrap();
    assert_eq!(&c.pread(h, 0, 8).await.unwrap()[..], b"contents");
    c.unlink("/b").await.unwrap();
    assert_eq!(&c.pread(h, 0, 8).await.unwrap()[..], b"contents");
    assert_eq!(c.fstat(h).await.unwrap().nlink, 0);
}

#[tokio::test]
async fn a_failed_upload_leaves_the_old_file_and_no_debris() {
    let s = TestServer::start();
    s.put_local("keep", b"old");
    let debris = || -> Vec<String> {
        std::fs::read_dir(s.root())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .filter(|n| n.starts_with(".__locus_put"))
            .collect()
    };
    {
        let c = s.client("admin").await;
        // Start an upload by hand and drop the connection before its last frame.
        let meta = locus_proto::codec::encode(&locus_proto::ops::Put { path: "/keep".into(), mode: 0o644 });
        let op = <locus_proto::ops::Put as locus_proto::Operation>::INFO.code;
        c.send_request(op, &meta, b"new partial", true).await.unwrap();
        // the server has begun the upload when its temporary file exists
        for _ in 0..200 {
            if !debris().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(debris().len(), 1, "the upload never started");
    }
    // the server notices the disconnect and removes the temporary file
    for _ in 0..200 {
        if debris().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(debris().is_empty(), "{:?}", debris());
    assert_eq!(std::fs::read(s.local("keep")).unwrap(), b"old");
}

#[tokio::test]
async fn disconnect_releases_handles() {
    let s = TestServer::start();
    s.put_local("f", b"x");
    let target = s.local("f").canonicalize().unwrap();
    {
        let c = s.client("admin").await;
        for _ in 0..50 {
            c.open("/f", of::READ, 0).await.unwrap();
        }
        assert_eq!(fds_on(&target), 50);
    }
    for _ in 0..100 {
        if fds_on(&target) == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(fds_on(&target), 0, "handles leaked after disconnect");
    assert_eq!(s.shared().registry.count(), 0);
}

/// Descriptors of this process (the server runs in it) open on `path`.
fn fds_on(path: &std::path::Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|p| p == path)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_clients_and_pipelined_requests() {
    let s = TestServer::start();
    let admin = s.client("admin").await;
    admin.mkdir("/shared", 0o755).await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..8 {
        let c = s.client("admin").await;
        tasks.push(tokio::spawn(async move {
            for j in 0..50 {
                let path = format!("/shared/c{i}-{j}");
                c.write_file(&path, 0o644, path.as_bytes()).await.unwrap();
            }
            // many requests in flight on one connection at once
            let futs: Vec<_> = (0..50)
                .map(|j| {
                    let c = c.clone();
                    async move { c.read_file(&format!("/shared/c{i}-{j}")).await.unwrap() }
                })
                .collect();
            for (j, data) in futures_join(futs).await.into_iter().enumerate() {
                assert_eq!(data, format!("/shared/c{i}-{j}").as_bytes());
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(admin.readdir("/shared").await.unwrap().len(), 400);
}

async fn futures_join<T: Send + 'static>(futs: Vec<impl std::future::Future<Output = T> + Send + 'static>) -> Vec<T> {
    let handles: Vec<_> = futs.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}

#[tokio::test]
async fn large_directories_arrive_in_pages() {
    let s = TestServer::start();
    for i in 0..5000 {
        std::fs::write(s.local(&format!("f{i}")), b"").unwrap();
    }
    let c = s.client("admin").await;
    assert_eq!(c.readdir("/").await.unwrap().len(), 5000);
}

#[tokio::test]
async fn stats_report_the_busiest_files() {
    let s = TestServer::start();
    let c = s.client("admin").await;
    c.write_file("/hot", 0o644, &vec![1u8; 100_000]).await.unwrap();
    c.write_file("/cold", 0o644, b"x").await.unwrap();
    for _ in 0..3 {
        c.read_file("/hot").await.unwrap();
    }
    let r = c.stats(10).await.unwrap();
    assert_eq!(r.busiest[0].path, "hot");
    assert_eq!(r.busiest[0].io.read_bytes, 300_000);
    assert!(r.export.write_bytes >= 100_001);
    assert!(r.ops.iter().any(|o| o.op == "get" && o.count == 3));
    assert_eq!(r.clients, 1);
}

#[tokio::test]
async fn tls_connections_work_and_verify_the_server() {
    let s = TestServer::start_with(|c| c.tls = true);
    let mut o = s.options("admin");
    o.tls_ca = Some(s.state_dir().join("cert.pem"));
    o.tls_name = Some("localhost".into());
    let c = Client::connect(&o).await.unwrap();
    c.write_file("/t", 0o644, b"over tls").await.unwrap();
    assert_eq!(c.read_file("/t").await.unwrap(), b"over tls");
    let h = c.open("/t", of::READ, 0).await.unwrap().handle;
    assert_eq!(&c.pread(h, 5, 3).await.unwrap()[..], b"tls");
    // script replies, written by the interpreter's thread or the connection's
    for n in [3i64, 200_000] {
        let src = "output:append(string.rep('s', ...)) return ...";
        let (v, out) = c.script_call(src, vec![locus_client::types::Value::Int(n)], &[]).await.unwrap();
        assert_eq!(v, vec![locus_client::types::Value::Int(n)]);
        assert_eq!(out.len(), n as usize);
    }
    // a plain client cannot talk to a TLS server
    let mut plain = s.options("admin");
    (plain.tls_ca, plain.tls_name) = (None, None);
    assert!(Client::connect(&plain).await.is_err());
    // nor can a client that trusts another certificate
    let other = TestServer::start_with(|c| c.tls = true);
    o.tls_ca = Some(other.state_dir().join("cert.pem"));
    assert!(Client::connect(&o).await.is_err());
}

#[tokio::test]
async fn large_writes_land_intact_and_bad_ones_keep_the_connection_in_step() {
    let s = TestServer::start();
    let c = s.client("admin").await;
    let h = c.open("/big", of::READ | of::WRITE | of::CREATE, 0o644).await.unwrap().handle;
    let pattern =
        |n: usize, seed: u8| (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect::<Vec<u8>>();
    // sizes around the zero-copy threshold, at unaligned offsets, several in flight
    let a = pattern(256 * 1024, 1);
    let b = pattern(5 * 1024 * 1024 + 17, 2);
    let (ra, rb) = tokio::join!(c.pwrite(h, 3, &a), c.pwrite(h, 3 + a.len() as u64, &b));
    assert_eq!((ra.unwrap(), rb.unwrap()), (a.len() as u64, b.len() as u64));
    let mut want = vec![0u8; 3];
    want.extend(&a);
    want.extend(&b);
    assert_eq!(std::fs::read(s.local("big")).unwrap(), want);
    assert_eq!(c.read_file("/big").await.unwrap(), want);
    // a large write to a read-only handle fails, and the next request is understood
    let ro = c.open("/big", of::READ, 0).await.unwrap().handle;
    assert_eq!(code(c.pwrite(ro, 0, &b).await.unwrap_err()), Code::BADF);
    c.ping().await.unwrap();
    // appending handles take the ordinary path and append
    let ap = c.open("/big", of::WRITE | of::APPEND, 0).await.unwrap().handle;
    c.pwrite(ap, 0, &a).await.unwrap();
    assert_eq!(c.stat("/big").await.unwrap().size, (want.len() + a.len()) as u64);
    let r = c.stats(5).await.unwrap();
    assert!(r.export.write_bytes >= (a.len() * 2 + b.len()) as u64);
}

#[tokio::test]
async fn large_reads_arrive_intact_by_sendfile_and_through_memory() {
    for mode in [locus_testkit::server::Sendfile::Always, locus_testkit::server::Sendfile::Never] {
        let s = TestServer::start_with(|c| c.sendfile = mode);
        let c = s.client("admin").await;
        // more than one 4 MiB stream frame and copy piece, not a multiple of either
        let want: Vec<u8> = (0..9_437_201u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        s.put_local("big", &want);
        assert_eq!(c.read_file("/big").await.unwrap(), want, "{mode:?}: get");
        let h = c.open("/big", of::READ, 0).await.unwrap().handle;
        let off = want.len() as u64 - 300_000;
        let got = c.pread(h, off, 1 << 20).await.unwrap();
        assert_eq!(&got[..], &want[off as usize..], "{mode:?}: a large pread that ends at end of file");
        let got = c.pread(h, 1_000_003, 200_000).await.unwrap();
        assert_eq!(&got[..], &want[1_000_003..1_200_003], "{mode:?}: a large pread inside the file");
    }
}

/// The next callback break pushed to `pushes`, within a second.
async fn next_break(
    pushes: &mut tokio::sync::mpsc::UnboundedReceiver<locus_client::PushMessage>,
) -> Option<Vec<String>> {
    loop {
        let push = tokio::time::timeout(Duration::from_secs(1), pushes.recv()).await.ok()??;
        if push.topic == locus_proto::frame::PUSH_BREAK {
            return locus_proto::codec::decode(&push.meta).ok();
        }
    }
}

#[tokio::test]
async fn callbacks_break_once_per_promise_and_go_only_to_the_same_subjects_connections() {
    let srv = TestServer::start();
    srv.put_local("d/f", b"one");
    let (holder, listener, writer) = (srv.client("admin").await, srv.client("admin").await, srv.client("bob").await);
    srv.shared().store.acl_set("admin", "/d", "bob", Rights::parse("rwld").unwrap()).unwrap();
    let mut pushes = listener.subscribe();
    // Breaks may go to another connection of the same subject, not to another subject's.
    let bobs = srv.client("bob").await;
    assert_eq!(code(holder.callbacks(100, bobs.client_id()).await.unwrap_err()), Code::ACCES);
    assert_eq!(holder.callbacks(100, listener.client_id()).await.unwrap(), 100);
    holder.stat("/d/f").await.unwrap();
    holder.readdir("/d").await.unwrap();
    // Another client's write breaks the promises on the file and on its directory: one
    // push naming what changed.
    writer.write_file("/d/f", 0o644, b"two").await.unwrap();
    assert_eq!(next_break(&mut pushes).await, Some(vec!["/d/f".to_string()]));
    assert_eq!(srv.shared().callbacks.held(), 0);
    // Broken once: a second change tells nothing until the holder asks again.
    writer.write_file("/d/f", 0o644, b"three").await.unwrap();
    assert_eq!(next_break(&mut pushes).await, None);
    holder.stat("/d/f").await.unwrap();
    // The holder's own change breaks no promise of its own.
    holder.write_file("/d/f", 0o644, b"mine").await.unwrap();
    assert_eq!(next_break(&mut pushes).await, None);
    writer.unlink("/d/f").await.unwrap();
    assert_eq!(next_break(&mut pushes).await, Some(vec!["/d/f".to_string()]));
    // Gone with the holder's connection.
    holder.stat("/d").await.unwrap();
    assert_eq!(srv.shared().callbacks.held(), 1);
    drop(holder);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(srv.shared().callbacks.held(), 0);
}

#[tokio::test]
async fn a_change_beside_the_server_breaks_a_promise_made_before_its_directory_existed() {
    let srv = TestServer::start();
    srv.put_local("d/f", b"one");
    let (holder, listener) = (srv.client("admin").await, srv.client("admin").await);
    let mut pushes = listener.subscribe();
    holder.callbacks(100, listener.client_id()).await.unwrap();
    // Asked about while its directory does not exist yet.
    assert!(holder.stat("/d/new/f").await.is_err());
    std::fs::create_dir(srv.local("d/new")).unwrap();
    // Its making breaks the promise beneath it (its nearest ancestor was watched)...
    assert_eq!(next_break(&mut pushes).await, Some(vec!["/d/new/f".to_string()]));
    holder.stat("/d/new/f").await.unwrap_err();
    // ...and, asked about again, a file made in it beside the server breaks that one.
    std::fs::write(srv.local("d/new/f"), b"made here").unwrap();
    assert_eq!(next_break(&mut pushes).await, Some(vec!["/d/new/f".to_string()]));
}

#[tokio::test]
async fn reads_into_a_callers_buffer_land_in_place() {
    use bytes::BytesMut;
    let s = TestServer::start();
    let c = s.client("admin").await;
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 253) as u8).collect();
    c.write_file("/f", 0o644, &data).await.unwrap();
    let h = c.open("/f", of::READ, 0).await.unwrap().handle;
    // Two destinations cut from one allocation: each reply is received into its own.
    let mut first = BytesMut::with_capacity(2_000_000);
    let second = first.split_off(1_000_000);
    let (p1, p2) = (first.as_ptr(), second.as_ptr());
    let a = c.pread_into(h, 0, 1_000_000, first).await.unwrap();
    let b = c.pread_into(h, 2_500_000, 1_000_000, second).await.unwrap();
    let ((), a) = a.wait_with_data().await.unwrap();
    let ((), b) = b.wait_with_data().await.unwrap();
    assert_eq!((a.as_ptr(), b.as_ptr()), (p1, p2), "the replies landed where asked");
    assert_eq!((&a[..], &b[..]), (&data[..1_000_000], &data[2_500_000..]), "short at the end of the file");
    // A destination too small for what is asked is not used; the bytes still come.
    let small = BytesMut::with_capacity(10);
    let ((), d) = c.pread_into(h, 5, 100, small).await.unwrap().wait_with_data().await.unwrap();
    assert_eq!(&d[..], &data[5..105]);
    // An error reply leaves the connection usable.
    let err = c.pread_into(h + 1000, 0, 10, BytesMut::with_capacity(10)).await.unwrap().wait().await.unwrap_err();
    assert_eq!(code(err), Code::BADF);
    assert_eq!(&c.pread(h, 0, 3).await.unwrap()[..], &data[..3]);
}
