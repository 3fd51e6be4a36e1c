//! Fuzz target: one connection per input, played in memory against the
//! connection table (see the harness's `table` module).
#![no_main]

libfuzzer_sys::fuzz_target!(|input: &[u8]| {
    runloop_fuzz_server::table::play(input);
});
