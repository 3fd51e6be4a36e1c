//! What `runloop serve` holds in memory, read from `/proc/PID/status`
//! (`VmRSS`, `VmHWM`) while a real client drives it over loopback.
//!
//! - A 15.9 MiB prompt into the demo agent (issue 13, row 10): the server's
//!   peak stays under 256 MiB. Always run with a prompt of few, long words
//!   (a few hundred chunks); the load version, with a prompt of 3.3 million
//!   words (as many chunks), is a figure of `benches/figures.rs`:
//!   `cargo bench -p runloop-cli --bench figures -- memory`.
//! - Memory goes back (row 17, a figure, takes 40 s): 32 connections that
//!   each send 15 MiB before authorizing, then eight 15.9 MiB loops at
//!   once; the server's resident memory 30 s after, against its baseline
//!   before them.
//!
//! `RUNLOOP_BIN` names another `runloop` binary to measure (an older build,
//! for a before/after figure); the default is this build's.

use crate::common;

use std::time::Duration;

use common::{Serve, demo_request};
use runloop::client::Client;
use runloop::proto::run_loop::Outcome;

const MIB: u64 = 1 << 20;

/// A prompt of `size` bytes: words of `word` letters and a space.
fn prompt(size: usize, word: usize) -> String {
    let unit = format!("{} ", "w".repeat(word));
    let mut prompt = unit.repeat(size / unit.len());
    prompt.truncate(size);
    prompt
}

/// One demo loop with `prompt`, to its end.
async fn one_loop(url: &str, prompt: String) {
    let client = Client::connect(url, "").await.expect("connects");
    let run = client.start(demo_request()).await.expect("the run starts");
    let outcome = run.run_loop(prompt).outcome().await;
    assert_eq!(outcome, Outcome::Finished { fatal: false });
    run.stop().await;
    client.close().await;
}

/// The server's peak with one loop of a 15.9 MiB prompt of `word`-letter words.
fn large_prompt_peak(word: usize) -> u64 {
    let server = Serve::start("error", &[]);
    let baseline = server.status("VmRSS");
    let prompt = prompt(15_900 * 1024, word);
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    runtime.block_on(one_loop(&server.url, prompt));
    let peak = server.status("VmHWM");
    println!(
        "15.9 MiB prompt, {word}-letter words: server baseline {} MiB, peak {} MiB, after {} MiB",
        baseline / MIB,
        peak / MIB,
        server.status("VmRSS") / MIB
    );
    peak
}

#[test]
fn a_large_prompt_of_long_words_into_the_demo_keeps_the_server_small() {
    let peak = large_prompt_peak(64 << 10);
    assert!(peak < 256 * MIB, "peak {} MiB", peak / MIB);
}

/// A figure of `benches/figures.rs` (not a test: a load).
#[allow(dead_code)]
pub fn a_large_prompt_of_short_words_keeps_the_server_small() {
    let peak = large_prompt_peak(4);
    assert!(peak < 256 * MIB, "peak {} MiB", peak / MIB);
}

/// A figure of `benches/figures.rs` (not a test: a load).
#[allow(dead_code)]
pub fn memory_goes_back_after_waves_of_large_messages() {
    let server = Serve::start("error", &["--authorization-grace", "2"]);
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    // Warm up: one small loop, so the baseline has the runtime's threads.
    runtime.block_on(one_loop(&server.url, "warm up".into()));
    let baseline = server.status("VmRSS");
    runtime.block_on(async {
        let waves: Vec<_> = (0..32)
            .map(|_| tokio::spawn(unauthorized(server.url.clone())))
            .collect();
        for each in waves {
            each.await.expect("a connection");
        }
        let loops: Vec<_> = (0..8)
            .map(|_| {
                let url = server.url.clone();
                tokio::spawn(async move { one_loop(&url, prompt(15_900 * 1024, 64 << 10)).await })
            })
            .collect();
        for each in loops {
            each.await.expect("a loop");
        }
    });
    let peak = server.status("VmHWM");
    let right_after = server.status("VmRSS");
    std::thread::sleep(Duration::from_secs(30));
    let after = server.status("VmRSS");
    println!(
        "32 × 15 MiB before authorization, then 8 loops of 15.9 MiB prompts: server baseline {} \
         MiB, peak {} MiB, right after {} MiB, 30 s after {} MiB",
        baseline / MIB,
        peak / MIB,
        right_after / MIB,
        after / MIB
    );
    assert!(
        after < baseline + 64 * MIB,
        "30 s after: {} MiB over a baseline of {} MiB",
        after / MIB,
        baseline / MIB
    );
}

/// A connection that sends 15 MiB before it authorizes, and waits for the
/// server to close it.
async fn unauthorized(url: String) {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let Ok((mut socket, _)) = tokio_tungstenite::connect_async(url.as_str()).await else {
        return;
    };
    let _ = socket
        .send(Message::Binary(vec![7u8; 15 << 20].into()))
        .await;
    while let Some(Ok(_)) = socket.next().await {}
}
