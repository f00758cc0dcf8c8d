//! Feeds arbitrary bucket names, keys, listing continuation tokens and `Content-MD5`
//! values to the S3 door's parsers, in process. A key that is accepted must name a path
//! beneath its bucket with no `.`, `..` or empty segment and no reserved name; the key
//! of that path must be the key again (less a final `/`); a continuation token made from
//! a name must give the name back; nothing may panic.
//! Run: `cargo +nightly fuzz run s3_names -- -max_total_time=1800`
#![no_main]

use libfuzzer_sys::fuzz_target;
use locus_s3::listing::{continuation, resume, Item};
use locus_s3::names::{bucket_dir, key_of, object_path};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (bucket, key) = text.split_once('\n').unwrap_or(("b", &text));
    if let Ok(dir) = bucket_dir(bucket) {
        assert_eq!(dir, format!("/{bucket}"));
        assert!(!bucket.contains('/') && bucket != "." && bucket != "..");
    }
    if let Ok(op) = object_path(bucket, key) {
        assert!(op.path.starts_with(&format!("{}/", op.bucket_dir)), "{op:?}");
        for segment in op.path.split('/').skip(1) {
            assert!(!segment.is_empty() && segment != "." && segment != "..", "{op:?}");
            assert!(!segment.starts_with(".__locus") && !segment.contains('\0'), "{op:?}");
        }
        assert_eq!(key_of(&op.bucket_dir, &op.path), key.trim_end_matches('/'), "{op:?}");
        assert_eq!(op.is_dir, key.ends_with('/'));
    }
    let token = continuation(&Item::Prefix(key.to_string()));
    assert_eq!(resume(&token), Some((key.to_string(), true)));
    let _ = resume(key);
    let _ = locus_s3::objects::content_md5(Some(key));
});
