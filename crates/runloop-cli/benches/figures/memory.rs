//! What `runloop serve` holds in memory (issue 13, rows 10 and 17), at
//! full size.

use std::time::Duration;

use runloop_testkit::command::Serve;
use runloop_testkit::loads::{MIB, large_prompt_peak, one_loop, prompt};

/// A 15.9 MiB prompt of 4-letter words (3.3 million, as many chunks) into
/// the demo: the server's peak stays under 256 MiB.
pub fn a_large_prompt_of_short_words_keeps_the_server_small() {
    let peak = large_prompt_peak(4);
    assert!(peak < 256 * MIB, "peak {} MiB", peak / MIB);
}

/// 32 connections that each send 15 MiB before authorizing, then eight
/// 15.9 MiB loops at once: the server's resident memory 30 s after is
/// within 64 MiB of its baseline before them (takes 40 s).
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
