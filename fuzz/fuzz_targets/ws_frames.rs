//! Fuzz target `ws_frames`: the WebSocket frame layer of `runloop-wire`
//! against tungstenite, where both read. The assertions live in
//! `src/ws_frames.rs`, which `runloop-wire`'s `corpus` test replays too.
#![no_main]

#[path = "../src/ws_frames.rs"]
mod ws_frames;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ws_frames::ws_frames(data);
});
