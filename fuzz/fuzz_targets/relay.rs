//! Fuzz target `relay`: proxy messages through a Relay, checked by a caller's Reader.
//! The assertions live in `runloop_proto_fuzz::relay`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    runloop_proto_fuzz::relay(data);
});
