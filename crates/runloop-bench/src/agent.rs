//! The bench's agent program: an HTTP/1.1 server with the agent program's
//! two calls (protocol §10) that streams generated chunks as SSE as fast as
//! its socket takes them, or at a fixed rate.
//!
//! ```text
//! POST /register  ──▶ 204
//! POST /run {"prompt":"bench:INDEX:ROUND:CHUNKS:RATE"}
//!                 ──▶ 200 text/event-stream, chunked: one HTTP chunk per event
//!                     data: {"type":…,"_meta":{"runloop/bench":"<sent>:<seq>"},…}\n\n
//! ```
//!
//! The whole chain is measured from here: the same program stands behind
//! `runloop serve` (an `exec:` agent, one process per run, as the server
//! starts it), behind nginx, and alone (the direct read), and every side
//! reads the same chunks, since a loop's sizes come from its prompt. Each
//! chunk carries the time it was written on the machine's monotonic clock
//! (the bench's `clock`), which the load client, another process, reads too.
//!
//! It must never be what limits a side, so it does little per chunk: the
//! chunk's JSON is written byte by byte into one buffer (`chunk_json`),
//! each event is its own HTTP chunk (as a web framework's streaming
//! response writes it), and unpaced the buffer goes to the socket only when
//! it holds 64 KiB; paced, each event is written when it is due.
//! One thread serves every connection. Each answer closes its connection
//! (`Connection: close`), as the proxy dials a new one per call.

use std::io;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::clock::now_ns;
use crate::mix::Mix;
use crate::synthetic::{chunk_json, loop_plan, seed_of};

/// How much an unpaced stream gathers before each write.
const BATCH: usize = 64 << 10;

/// The most of a request the program reads: its head and its body.
const MAX_REQUEST: usize = 64 << 10;

/// Serves the agent program's calls on `listener` until it fails.
pub async fn serve(listener: TcpListener, mix: Mix) -> io::Result<()> {
    let mix = std::sync::Arc::new(mix);
    loop {
        let (tcp, _) = listener.accept().await?;
        let _ = tcp.set_nodelay(true);
        tokio::spawn(answer(tcp, std::sync::Arc::clone(&mix)));
    }
}

/// A request's path and body.
struct Request {
    path: String,
    body: Vec<u8>,
}

/// Reads one request: its head up to the blank line, then a body of its
/// `Content-Length`. `None` for anything else.
async fn request(tcp: &mut TcpStream) -> Option<Request> {
    let mut read = Vec::with_capacity(4096);
    let head_end = loop {
        if let Some(at) = find(&read, b"\r\n\r\n") {
            break at + 4;
        }
        if read.len() >= MAX_REQUEST {
            return None;
        }
        let mut buf = [0u8; 4096];
        let n = tcp.read(&mut buf).await.ok()?;
        if n == 0 {
            return None;
        }
        read.extend_from_slice(&buf[..n]);
    };
    let head = std::str::from_utf8(&read[..head_end]).ok()?;
    let mut lines = head.split("\r\n");
    let path = lines.next()?.split(' ').nth(1)?.to_owned();
    let length = lines
        .filter_map(|line| line.split_once(':'))
        .find(|(name, _)| name.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, value)| value.trim().parse::<usize>().ok())
        .unwrap_or(0);
    if length > MAX_REQUEST {
        return None;
    }
    let mut body = read.split_off(head_end);
    while body.len() < length {
        let mut buf = [0u8; 4096];
        let n = tcp.read(&mut buf).await.ok()?;
        if n == 0 {
            return None;
        }
        body.extend_from_slice(&buf[..n]);
    }
    body.truncate(length);
    Some(Request { path, body })
}

/// Where `needle` first is in `haystack`.
fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

async fn answer(mut tcp: TcpStream, mix: std::sync::Arc<Mix>) {
    let Some(request) = request(&mut tcp).await else {
        return;
    };
    let plan = match request.path.as_str() {
        "/register" => {
            let _ = tcp
                .write_all(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")
                .await;
            return;
        }
        "/run" => loop_plan(&request.body),
        _ => None,
    };
    let Some(plan) = plan else {
        let _ = tcp
            .write_all(
                b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nContent-Length: 22\r\n\
                  Connection: close\r\n\r\nnot a bench loop ask\r\n",
            )
            .await;
        return;
    };
    let _ = stream(&mut tcp, &mix, &request.body, plan).await;
    let _ = tcp.shutdown().await;
}

/// Streams the loop `plan` asks for, seeded by its `ask`.
async fn stream(
    tcp: &mut TcpStream,
    mix: &Mix,
    ask: &[u8],
    plan: crate::synthetic::LoopPlan,
) -> io::Result<()> {
    let mut out = Vec::with_capacity(BATCH + (64 << 10));
    out.extend_from_slice(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n\
          Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
    );
    let mut rng = fastrand::Rng::with_seed(seed_of(ask));
    let mut json = Vec::with_capacity(mix.max() + 256);
    let start = tokio::time::Instant::now();
    for seq in 0..plan.chunks {
        if let Some(rate) = plan.rate {
            let due = Duration::from_secs_f64(seq as f64 / rate.max(1) as f64);
            tokio::time::sleep_until(start + due).await;
        }
        event(&mut out, &mut json, mix.draw(&mut rng), seq);
        if plan.rate.is_some() || out.len() >= BATCH {
            tcp.write_all(&out).await?;
            out.clear();
        }
    }
    out.extend_from_slice(b"0\r\n\r\n");
    tcp.write_all(&out).await
}

/// Appends one event, `data: ` and a chunk's JSON of about `size` bytes,
/// as one HTTP chunk, stamped now; `json` is scratch room.
fn event(out: &mut Vec<u8>, json: &mut Vec<u8>, size: usize, seq: u64) {
    json.clear();
    chunk_json(json, size, now_ns(), seq);
    let length = DATA.len() + json.len() + 2;
    let digits = (usize::BITS - length.leading_zeros()).div_ceil(4).max(1);
    for place in (0..digits).rev() {
        out.push(b"0123456789abcdef"[(length >> (4 * place)) & 0xF]);
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(DATA);
    out.extend_from_slice(json);
    out.extend_from_slice(b"\n\n\r\n");
}

/// What every event's line begins with.
const DATA: &[u8] = b"data: ";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synthetic::stamp;

    #[test]
    fn an_event_is_one_http_chunk_of_data_and_a_blank_line() {
        for size in [20, 150, 3000, 20 << 10] {
            let mut out = b"before".to_vec();
            event(&mut out, &mut Vec::new(), size, 7);
            let rest = &out[6..];
            let line_end = find(rest, b"\r\n").expect("a size line");
            let length =
                usize::from_str_radix(std::str::from_utf8(&rest[..line_end]).expect("hex"), 16)
                    .expect("a length");
            let data = &rest[line_end + 2..];
            assert_eq!(data.len(), length + 2, "the chunk, then CRLF");
            assert!(data.ends_with(b"\n\n\r\n"));
            let json = data
                .strip_prefix(b"data: ")
                .and_then(|d| d.strip_suffix(b"\n\n\r\n"))
                .expect("one data line");
            let value: serde_json::Value = serde_json::from_slice(json).expect("JSON");
            assert!(value["type"].is_string());
            assert_eq!(stamp(json).map(|(_, seq)| seq), Some(7));
        }
    }
}
