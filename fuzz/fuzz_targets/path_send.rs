//! Fuzz target `path_send`: pieces, writes and an end through the proxy's send rule.
//! The assertions live in `runloop_proto_fuzz::path_send`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    runloop_proto_fuzz::path_send(data);
});
