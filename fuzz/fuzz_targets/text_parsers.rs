//! Feeds arbitrary text to the parsers of what users and files hand Locus: export URLs,
//! credentials, rights strings, ACL files (which must also survive a round trip through
//! `render`) and file names that may invoke active-file handlers (whose decoding must
//! only ever name a valid handler), and Chirp command lines, whose decoded paths hold no
//! NUL. Nothing may panic.
//! Run: `cargo +nightly fuzz run text_parsers -- -max_total_time=600`
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let _ = locus_client::LocusUrl::parse(text);
    let _ = locus_client::Credentials::parse(text);
    let _ = locus_proto::types::Rights::parse(text);
    if let Some(inv) = locus_proto::active::parse(text) {
        assert!(locus_proto::active::valid_handler_name(&inv.handler), "{:?}", inv.handler);
        assert!(inv.args.len() <= locus_proto::active::MAX_ARGS && inv.args.iter().all(|a| !a.contains('\0')));
    }
    if let Ok(cmd) = locus_proto::chirp::parse_command(text) {
        assert!(!format!("{cmd:?}").contains("\\0"), "{cmd:?}");
    }
    if let Ok(acl) = locus_store::Acl::parse(text) {
        let again = locus_store::Acl::parse(&acl.render()).expect("a rendered ACL parses");
        assert_eq!(again, acl, "an ACL survives a round trip");
    }
});
