//! Feeds arbitrary bytes to the S3 door (`locus serve --s3-port`) as one whole
//! connection: request lines, headers, `Authorization` and presigned-URL parameters,
//! bodies, as an unsigned client or a forger would send them. Unsigned requests act as
//! the anonymous subject, which may do everything in bucket `b`, so they reach the
//! operations too. Nothing may panic; the door
//! must keep answering; nothing may appear beside the export, and the canary outside it
//! must never be read back.
//! Run: `cargo +nightly fuzz run s3_door -- -max_total_time=1800`
#![no_main]

#[path = "s3_common.rs"]
mod s3_common;

use libfuzzer_sys::fuzz_target;
use s3_common::endpoint;

fuzz_target!(|data: &[u8]| {
    let door = s3_common::door();
    let answer = endpoint::exchange(door.addr, data, true, endpoint::QUICK);
    s3_common::check(door, &answer);
});
