//! Fuzz target `agents_run_request`: a type-1 scope request: containers::agents::run and validate.
//! The assertions live in `runloop_proto_fuzz::agents_run_request`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    runloop_proto_fuzz::agents_run_request(data);
});
