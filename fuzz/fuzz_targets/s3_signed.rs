//! Feeds fuzzed S3 requests to the door, signed with AWS Signature Version 4 by a subject
//! the server knows, so they pass the signature check and reach what lies behind it:
//! query parameters, `x-amz-*` headers (copy sources, ranges, conditions, metadata), the
//! XML bodies of DeleteObjects and CompleteMultipartUpload, the bucket and key names.
//! The first byte picks the subject (admin, alice, or none) and the signing (header with
//! the body's hash, `UNSIGNED-PAYLOAD`, presigned URL); the rest is a request in the
//! text form of `s3_common` (where `UPLOADID` stands for a
//! new upload in parts of its path). Same checks as `s3_door`.
//! Run: `cargo +nightly fuzz run s3_signed -- -max_total_time=1800`
#![no_main]

#[path = "s3_common.rs"]
mod s3_common;

use libfuzzer_sys::fuzz_target;
use s3_common::{endpoint, Signer, Signing};

fuzz_target!(|data: &[u8]| {
    let Some((&how, rest)) = data.split_first() else { return };
    let Some(req) = s3_common::decode(rest) else { return };
    let door = s3_common::door();
    let req = s3_common::with_upload(door, req);
    let signer = Signer::new(if how & 1 == 0 { "admin" } else { "alice" });
    let signing = match (how >> 1) % 4 {
        0 => Signing::Header { unsigned_payload: false },
        1 => Signing::Header { unsigned_payload: true },
        2 => Signing::Presigned,
        _ => Signing::None,
    };
    let bytes = s3_common::wire(&req, &signer, &signing, &door.addr.to_string());
    let answer = endpoint::exchange(door.addr, &bytes, false, endpoint::QUICK);
    s3_common::check(door, &answer);
});
