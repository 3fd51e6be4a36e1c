//! What `runloop serve` holds in memory, read from `/proc/PID/status`
//! (`VmRSS`, `VmHWM`) while a real client drives it over loopback.
//!
//! - A 15.9 MiB prompt into the demo agent (issue 13, row 10): the server's
//!   peak stays under 256 MiB. Always run with a prompt of few, long words
//!   (a few hundred chunks); the load version, with a prompt of 3.3 million
//!   words (as many chunks), is a figure of `benches/figures/`:
//!   `cargo bench -p runloop-cli --bench figures -- memory`.
//! - Memory goes back (row 17, a figure, takes 40 s): 32 connections that
//!   each send 15 MiB before authorizing, then eight 15.9 MiB loops at
//!   once; the server's resident memory 30 s after, against its baseline
//!   before them.
//!
//! `RUNLOOP_BIN` names another `runloop` binary to measure (an older build,
//! for a before/after figure); the default is this build's.

use runloop_testkit::loads::{MIB, large_prompt_peak};

#[test]
fn a_large_prompt_of_long_words_into_the_demo_keeps_the_server_small() {
    let peak = large_prompt_peak(64 << 10);
    assert!(peak < 256 * MIB, "peak {} MiB", peak / MIB);
}
