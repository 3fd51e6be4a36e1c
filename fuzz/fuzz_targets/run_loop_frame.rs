//! Fuzz target `run_loop_frame`: a run-loop response payload, and lines of them through a Reader.
//! The assertions live in `runloop_proto_fuzz::run_loop_frame`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    runloop_proto_fuzz::run_loop_frame(data);
});
