//! Feeds arbitrary bytes to the frame decoder and to every operation's metadata decoder:
//! nothing may panic, and nothing may allocate beyond the limits.
//! Run: `cargo +nightly fuzz run frame_decoder -- -max_total_time=600`
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    locus_proto::fuzz::decode_everything(data);
});
