//! Fuzz target `channel_request`: a type-4 channel request on a run scope.
//! The assertions live in `runloop_proto_fuzz::channel_request`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    runloop_proto_fuzz::channel_request(data);
});
