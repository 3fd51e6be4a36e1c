//! Fuzz target: one server connection per input (see the harness's docs).
#![no_main]

libfuzzer_sys::fuzz_target!(|input: &[u8]| {
    runloop_fuzz_server::play(input);
});
