//! Fuzz target `frame_header`: one message as a client frame and as a server frame (the 9-byte header).
//! The assertions live in `runloop_proto_fuzz::frame_header`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    runloop_proto_fuzz::frame_header(data);
});
