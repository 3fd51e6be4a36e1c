//! The synthetic proxy: a WebSocket server with the proxy's two paths that
//! streams generated chunks as fast as its peer takes them.
//!
//! Every chunk carries, at the start of its JSON, the time it was sent (in
//! nanoseconds since the bench's epoch) and its sequence number, so the
//! load client can measure latency end to end and check that nothing was
//! lost or reordered without parsing the JSON:
//!
//! ```text
//! [0]{"type":"assistant_text_content","_meta":{"runloop/bench":"<20 digits>:<10 digits>"},"text":"xx…"}
//! [0]{"type":"tool_response","_meta":{"runloop/bench":"…"},"id":"call_1","content":[{"type":"text","text":"xx…"}]}
//! ```
//!
//! Chunks of 1 KiB and more are tool responses, the rest text deltas. Each
//! message is sent (and flushed) on its own, as an agent streams tokens.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::server::{Request, Response};

use crate::mix::Mix;

const MARKER: &[u8] = b"\"runloop/bench\":\"";

/// What one loop looks like.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) chunks: u64,
    pub(crate) mix: Mix,
    pub(crate) epoch: Instant,
}

/// A running synthetic proxy.
#[derive(Debug)]
pub(crate) struct SyntheticProxy {
    pub(crate) addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for SyntheticProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl SyntheticProxy {
    pub(crate) async fn start(plan: Plan) -> std::io::Result<SyntheticProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let plan = Arc::new(plan);
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                tokio::spawn(serve(tcp, Arc::clone(&plan)));
            }
        });
        Ok(SyntheticProxy { addr, task })
    }

    pub(crate) fn url(&self) -> String {
        format!("ws://{}", self.addr)
    }
}

/// Accepts a WebSocket on `tcp` (Nagle off) and says which path it asked for.
pub(crate) async fn accept(tcp: TcpStream) -> Option<(WebSocketStream<TcpStream>, String)> {
    let _ = tcp.set_nodelay(true);
    let mut path = String::new();
    // The handshake callback's error type is tungstenite's, large by design.
    #[allow(clippy::result_large_err)]
    let callback = |request: &Request, response: Response| {
        path = request.uri().path().to_owned();
        Ok(response)
    };
    let ws = tokio_tungstenite::accept_hdr_async(tcp, callback)
        .await
        .ok()?;
    Some((ws, path))
}

async fn serve(tcp: TcpStream, plan: Arc<Plan>) {
    let Some((mut ws, path)) = accept(tcp).await else {
        return;
    };
    let Some(Ok(Message::Binary(ask))) = ws.next().await else {
        return;
    };
    if path == "/agent/register" {
        let _ = ws.send(Message::Binary(Bytes::from_static(&[0]))).await;
        let _ = ws.close(None).await;
        return;
    }
    // The same loop gets the same chunks on both sides of the comparison.
    let mut rng = fastrand::Rng::with_seed(seed_of(&ask));
    for seq in 0..plan.chunks {
        let size = plan.mix.draw(&mut rng);
        let message = chunk(size, plan.epoch.elapsed().as_nanos() as u64, seq);
        if ws.send(Message::Binary(message.into())).await.is_err() {
            return;
        }
    }
    let _ = ws.close(None).await;
    while let Some(Ok(_)) = ws.next().await {}
}

/// The prompt a load client sends for loop `index`, round `round`.
pub(crate) fn prompt(index: usize, round: u64) -> Vec<u8> {
    format!("{{\"prompt\":\"bench:{index}:{round}\"}}").into_bytes()
}

/// The size sequence's seed, from the ask: the same prompt, the same sizes.
fn seed_of(ask: &[u8]) -> u64 {
    // FNV-1a: stable across runs and processes, unlike std's hasher.
    ask.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A chunk message of about `size` JSON bytes, stamped with `sent` and `seq`.
pub(crate) fn chunk(size: usize, sent: u64, seq: u64) -> Vec<u8> {
    let (head, tail): (&[u8], &[u8]) = if size >= 1024 {
        (
            b"{\"type\":\"tool_response\",\"_meta\":{",
            b"\"},\"id\":\"call_1\",\"content\":[{\"type\":\"text\",\"text\":\"",
        )
    } else {
        (
            b"{\"type\":\"assistant_text_content\",\"_meta\":{",
            b"\"},\"text\":\"",
        )
    };
    let close: &[u8] = if size >= 1024 { b"\"}]}" } else { b"\"}" };
    let stamp = format!("{sent:020}:{seq:010}");
    let fixed = head.len() + MARKER.len() + stamp.len() + tail.len() + close.len();
    let padding = size.saturating_sub(fixed);
    let mut message = Vec::with_capacity(1 + fixed + padding);
    message.push(0);
    message.extend_from_slice(head);
    message.extend_from_slice(MARKER);
    message.extend_from_slice(stamp.as_bytes());
    message.extend_from_slice(tail);
    message.resize(message.len() + padding, b'x');
    message.extend_from_slice(close);
    message
}

/// The send time and sequence number stamped in a chunk payload.
pub(crate) fn stamp(payload: &[u8]) -> Option<(u64, u64)> {
    let window = &payload[..payload.len().min(128)];
    let at = window.windows(MARKER.len()).position(|w| w == MARKER)? + MARKER.len();
    let digits = payload.get(at..at + 31)?;
    let number = |bytes: &[u8]| std::str::from_utf8(bytes).ok()?.parse::<u64>().ok();
    Some((number(&digits[..20])?, number(&digits[21..])?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_prompt_gives_the_same_seed() {
        assert_eq!(seed_of(&prompt(3, 1)), seed_of(&prompt(3, 1)));
        assert_ne!(seed_of(&prompt(3, 1)), seed_of(&prompt(3, 2)));
        assert_ne!(seed_of(&prompt(1, 3)), seed_of(&prompt(3, 1)));
    }

    #[test]
    fn chunks_are_valid_json_of_their_size_with_a_readable_stamp() {
        for size in [20, 150, 1024, 20 << 10] {
            let message = chunk(size, 123_456_789, 42);
            assert_eq!(message[0], 0);
            let json: serde_json::Value =
                serde_json::from_slice(&message[1..]).expect("valid JSON");
            let expected = if size >= 1024 {
                "tool_response"
            } else {
                "assistant_text_content"
            };
            assert_eq!(json["type"], expected);
            if size >= 200 {
                assert_eq!(message.len() - 1, size);
            }
            assert_eq!(stamp(&message), Some((123_456_789, 42)));
            let chunk: runloop_proto::run_loop::AgenticLoopChunk =
                serde_json::from_slice(&message[1..]).expect("a real chunk");
            assert_eq!(chunk.kind().as_str(), expected);
        }
    }
}
