//! Fuzz target `authorization`: a type-0 authorization payload.
//! The assertions live in `runloop_proto_fuzz::authorization`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    runloop_proto_fuzz::authorization(data);
});
