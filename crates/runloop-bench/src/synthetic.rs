//! The synthetic proxy: a WebSocket server with the proxy's two paths that
//! streams generated chunks as fast as its peer takes them.
//!
//! Every chunk carries, at the start of its JSON, the time it was sent (in
//! nanoseconds on the monotonic clock, [`crate::clock`]) and its sequence
//! number, so the
//! load client can measure latency end to end and check that nothing was
//! lost or reordered without parsing the JSON:
//!
//! ```text
//! [0]{"type":"assistant_text_content","_meta":{"runloop/bench":"<20 digits>:<10 digits>"},"text":"xx…"}
//! [0]{"type":"tool_response","_meta":{"runloop/bench":"…"},"id":"call_1","content":[{"type":"text","text":"xx…"}]}
//! ```
//!
//! Chunks of 1 KiB and more are tool responses, the rest text deltas.
//! Unpaced, the proxy is faster than any reader: it feeds every message to
//! its socket and lets the WebSocket write buffer (128 KiB) decide when to
//! send, so it never is the bottleneck and the program in the middle is
//! measured (a proxy that flushed each message would cap every route at its
//! own system-call rate). Paced, each message is sent on its own, on time.
//!
//! What a loop looks like travels in its prompt (`bench:INDEX:ROUND:CHUNKS:RATE`),
//! which every program in the middle passes on verbatim: so one proxy serves
//! loops of any length, as fast as its peer reads them (`RATE` 0) or at a
//! fixed rate in chunks per second. Paced chunks leave on time whatever the
//! previous one cost, so latency at a fixed rate measures the hop, not a
//! queue.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::Message;

use crate::clock::now_ns;
use crate::mix::Mix;
use crate::socket::accept;

const MARKER: &[u8] = b"\"runloop/bench\":\"";

/// What every loop shares: the size mix.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) mix: Mix,
}

/// What one loop asks for, carried in its prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LoopPlan {
    /// Chunks in the loop.
    pub(crate) chunks: u64,
    /// Chunks per second; `None`: as fast as the peer reads them.
    pub(crate) rate: Option<u64>,
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
    let Some(asked) = loop_plan(&ask) else {
        let _ = ws.close(None).await;
        return;
    };
    // The same loop gets the same chunks on every side of the comparison.
    let mut rng = fastrand::Rng::with_seed(seed_of(&ask));
    let start = tokio::time::Instant::now();
    for seq in 0..asked.chunks {
        if let Some(rate) = asked.rate {
            let due = Duration::from_secs_f64(seq as f64 / rate.max(1) as f64);
            tokio::time::sleep_until(start + due).await;
        }
        let size = plan.mix.draw(&mut rng);
        let message = chunk(size, now_ns(), seq);
        let message = Message::Binary(message.into());
        let sent = if asked.rate.is_some() {
            ws.send(message).await
        } else {
            ws.feed(message).await
        };
        if sent.is_err() {
            return;
        }
    }
    let _ = ws.close(None).await;
    while let Some(Ok(_)) = ws.next().await {}
}

/// The prompt a load client sends for loop `index`, round `round`.
pub(crate) fn prompt(index: usize, round: u64, plan: LoopPlan) -> Vec<u8> {
    let (chunks, rate) = (plan.chunks, plan.rate.unwrap_or(0));
    format!("{{\"prompt\":\"bench:{index}:{round}:{chunks}:{rate}\"}}").into_bytes()
}

/// The plan a prompt carries.
pub(crate) fn loop_plan(ask: &[u8]) -> Option<LoopPlan> {
    let ask = std::str::from_utf8(ask).ok()?;
    let (_, rest) = ask.split_once("\"bench:")?;
    let (fields, _) = rest.split_once('"')?;
    let mut numbers = fields.split(':').skip(2).map(str::parse::<u64>);
    let (chunks, rate) = (numbers.next()?.ok()?, numbers.next()?.ok()?);
    Some(LoopPlan {
        chunks,
        rate: (rate > 0).then_some(rate),
    })
}

/// The size sequence's seed, from the ask: the same prompt, the same sizes.
pub(crate) fn seed_of(ask: &[u8]) -> u64 {
    // FNV-1a: stable across runs and processes, unlike std's hasher.
    ask.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A chunk message of about `size` JSON bytes, stamped with `sent` and `seq`.
pub(crate) fn chunk(size: usize, sent: u64, seq: u64) -> Vec<u8> {
    let mut message = Vec::with_capacity(1 + size.max(128));
    message.push(0);
    chunk_json(&mut message, size, sent, seq);
    message
}

/// Appends to `out` a chunk's JSON of about `size` bytes (exactly, from
/// 200 on), stamped with `sent` and `seq`: a tool response from 1 KiB on,
/// else a text delta. Written byte by byte, with no formatting machinery:
/// the agent program makes one per chunk, and must never be the slowest
/// part of a chain it measures.
pub(crate) fn chunk_json(out: &mut Vec<u8>, size: usize, sent: u64, seq: u64) {
    let (head, tail, close): (&[u8], &[u8], &[u8]) = if size >= 1024 {
        (
            b"{\"type\":\"tool_response\",\"_meta\":{",
            b"\"},\"id\":\"call_1\",\"content\":[{\"type\":\"text\",\"text\":\"",
            b"\"}]}",
        )
    } else {
        (
            b"{\"type\":\"assistant_text_content\",\"_meta\":{",
            b"\"},\"text\":\"",
            b"\"}",
        )
    };
    let fixed = head.len() + MARKER.len() + STAMP + tail.len() + close.len();
    let padding = size.saturating_sub(fixed);
    out.reserve(fixed + padding);
    out.extend_from_slice(head);
    out.extend_from_slice(MARKER);
    digits(out, sent, 20);
    out.push(b':');
    digits(out, seq, 10);
    out.extend_from_slice(tail);
    out.resize(out.len() + padding, b'x');
    out.extend_from_slice(close);
}

/// The stamp's length: 20 digits, a colon, 10 digits.
const STAMP: usize = 31;

/// `value` in `width` decimal digits, zero-padded (its last `width` digits
/// if it has more).
fn digits(out: &mut Vec<u8>, mut value: u64, width: usize) {
    let start = out.len();
    out.resize(start + width, b'0');
    for place in out[start..].iter_mut().rev() {
        *place = b'0' + (value % 10) as u8;
        value /= 10;
    }
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

    const PLAN: LoopPlan = LoopPlan {
        chunks: 20,
        rate: None,
    };

    #[test]
    fn the_same_prompt_gives_the_same_seed() {
        assert_eq!(seed_of(&prompt(3, 1, PLAN)), seed_of(&prompt(3, 1, PLAN)));
        assert_ne!(seed_of(&prompt(3, 1, PLAN)), seed_of(&prompt(3, 2, PLAN)));
        assert_ne!(seed_of(&prompt(1, 3, PLAN)), seed_of(&prompt(3, 1, PLAN)));
    }

    #[test]
    fn the_prompt_carries_the_loop_plan() {
        let paced = LoopPlan {
            chunks: 7,
            rate: Some(1000),
        };
        for plan in [PLAN, paced] {
            let ask = prompt(12, 3, plan);
            assert_eq!(loop_plan(&ask), Some(plan));
            let request: serde_json::Value = serde_json::from_slice(&ask).expect("JSON");
            assert!(request["prompt"].is_string());
        }
        for bad in [
            &b""[..],
            b"{\"prompt\":\"hello\"}",
            b"{\"prompt\":\"bench:1:2:x:0\"}",
        ] {
            assert_eq!(loop_plan(bad), None);
        }
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
