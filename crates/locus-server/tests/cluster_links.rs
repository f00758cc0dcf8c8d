//! Symbolic links on a cluster head behave as on one server: made, read, followed at
//! the end of a path (by `stat`, `open`, `get`, `readdir`), not by `lstat`, `unlink` or
//! `rename`; a target never leads out of the namespace, and loops end in `ELOOP`.

use locus_proto::types::{open_flags, Rights, S_IFDIR, S_IFLNK, S_IFMT, S_IFREG};
use locus_proto::Code;
use locus_testkit::TestServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn symbolic_links_on_a_head_are_followed_within_the_namespace_only() {
    let head = TestServer::head(None, |_| {});
    let _node = TestServer::data_node(&head);
    let admin = head.client("admin").await;
    admin.mkdir("/d", 0o755).await.unwrap();
    let big: Vec<u8> = (0..(2u32 << 20)).map(|i| (i * 7 % 251) as u8).collect();
    admin.write_file("/d/big", 0o644, &big).await.unwrap();
    admin.write_file("/d/small", 0o644, b"small").await.unwrap();

    admin.symlink("big", "/d/rel").await.unwrap();
    admin.symlink("/d", "/abs").await.unwrap();
    admin.symlink("../d/small", "/d/up").await.unwrap();
    assert_eq!(admin.readlink("/d/rel").await.unwrap(), "big");
    assert_eq!(admin.lstat("/d/rel").await.unwrap().mode & S_IFMT, S_IFLNK);
    assert_eq!(admin.stat("/d/rel").await.unwrap().mode & S_IFMT, S_IFREG);
    assert_eq!(admin.stat("/d/rel").await.unwrap().size, big.len() as u64);
    assert_eq!(admin.stat("/abs").await.unwrap().mode & S_IFMT, S_IFDIR);
    // Followed by reads: whole files (from the node, for the large one) and handles.
    assert_eq!(admin.read_file("/d/rel").await.unwrap(), big);
    assert_eq!(admin.read_file("/d/up").await.unwrap(), b"small");
    let h = admin.open("/d/rel", open_flags::READ, 0).await.unwrap();
    assert!(h.location.is_some(), "a large file reached through a link is read from its node");
    assert_eq!(admin.pread(h.handle, 10, 10).await.unwrap(), big[10..20]);
    admin.close(h.handle).await.unwrap();
    let names: Vec<String> = admin.readdir("/abs").await.unwrap().into_iter().map(|e| e.name).collect();
    assert_eq!(names, ["big", "rel", "small", "up"]);
    // Writing through a link writes its target.
    let h = admin.open("/d/up", open_flags::WRITE | open_flags::TRUNCATE, 0).await.unwrap();
    admin.pwrite(h.handle, 0, b"changed").await.unwrap();
    admin.close(h.handle).await.unwrap();
    assert_eq!(admin.read_file("/d/small").await.unwrap(), b"changed");

    // unlink and rename act on the link, not its target.
    admin.rename("/d/up", "/d/up2").await.unwrap();
    assert_eq!(admin.readlink("/d/up2").await.unwrap(), "../d/small");
    admin.unlink("/d/up2").await.unwrap();
    assert_eq!(admin.read_file("/d/small").await.unwrap(), b"changed");

    // Out of the namespace, in a loop, dangling, or not a link: refused.
    admin.symlink("../../etc/passwd", "/d/out").await.unwrap();
    assert_eq!(admin.stat("/d/out").await.unwrap_err().code(), Code::ACCES);
    assert_eq!(admin.read_file("/d/out").await.unwrap_err().code(), Code::ACCES);
    admin.symlink("/loop2", "/loop1").await.unwrap();
    admin.symlink("/loop1", "/loop2").await.unwrap();
    assert_eq!(admin.stat("/loop1").await.unwrap_err().code(), Code::LOOP);
    admin.symlink("nowhere", "/d/dangling").await.unwrap();
    assert_eq!(admin.stat("/d/dangling").await.unwrap_err().code(), Code::NOENT);
    assert_eq!(admin.readlink("/d/small").await.unwrap_err().code(), Code::INVAL);
    assert_eq!(admin.symlink("x", "/d/rel").await.unwrap_err().code(), Code::EXIST);
    assert_eq!(admin.symlink("", "/d/empty").await.unwrap_err().code(), Code::INVAL);
    // Hard links are names of one file (see the parity suite for their semantics).
    admin.link("/d/big", "/d/hard").await.unwrap();
    assert_eq!(admin.stat("/d/hard").await.unwrap().nlink, 2);
    assert_eq!(admin.link("/d/big", "/d/hard").await.unwrap_err().code(), Code::EXIST);

    // Rights: making a link needs w in its directory; following one is checked where
    // it leads.
    admin.mkdir("/open", 0o755).await.unwrap();
    admin.acl_set("/open", "alice", Rights::parse("rwl").unwrap()).await.unwrap();
    let alice = head.client("alice").await;
    assert_eq!(alice.symlink("x", "/d/mine").await.unwrap_err().code(), Code::ACCES);
    alice.symlink("/d/small", "/open/peek").await.unwrap();
    assert_eq!(alice.read_file("/open/peek").await.unwrap_err().code(), Code::ACCES);
}
