//! The load client of an SSE route: `POST /run` over HTTP/1.1, and the
//! answer's event stream read as it comes, from nginx in front of the
//! bench's agent program or from the program itself.
//!
//! It does per chunk what the framed client does (read the stamp, check
//! the sequence, record the latency) and no more: the chunked body is
//! taken apart by hand and each event's `data` found with `memchr`, so
//! that the client is never what limits a route.

use std::net::SocketAddr;
use std::time::Instant;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::BenchError;
use crate::load::Tally;
use crate::synthetic::{LoopPlan, prompt};

/// How much one read takes.
const READ: usize = 64 << 10;

/// Reads loop `index` from the SSE route at `addr`, again until `deadline`
/// (at least once).
pub(crate) async fn sse_worker(
    addr: SocketAddr,
    index: usize,
    plan: LoopPlan,
    deadline: Instant,
) -> Result<Tally, BenchError> {
    let mut tally = Tally::new();
    for round in 0.. {
        let (complete, got) = one_loop(addr, &prompt(index, round, plan), &mut tally).await?;
        tally.loop_end(complete, got, plan.chunks);
        if Instant::now() >= deadline {
            break;
        }
    }
    Ok(tally)
}

/// One loop: whether its body ended as it should, and how many chunks came.
async fn one_loop(
    addr: SocketAddr,
    ask: &[u8],
    tally: &mut Tally,
) -> Result<(bool, u64), BenchError> {
    let mut tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let mut request = format!(
        "POST /run HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n\
         Accept: text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        ask.len()
    )
    .into_bytes();
    request.extend_from_slice(ask);
    tcp.write_all(&request).await?;
    let mut reader = Body::default();
    let mut buf = vec![0; READ];
    let mut expected = 0;
    let mut got = 0;
    loop {
        let n = tcp.read(&mut buf).await?;
        if n == 0 {
            return Ok((false, got));
        }
        let done = reader.feed(&buf[..n], &mut |json| {
            got += 1;
            tally.chunk_json(json, &mut expected);
        });
        match done {
            Ok(true) => return Ok((true, got)),
            Ok(false) => {}
            Err(why) => return Err(BenchError::Protocol(why)),
        }
    }
}

/// Where the reader of a response is.
#[derive(Debug, Default)]
enum State {
    /// In the status line and headers: how much of them was seen.
    #[default]
    Head,
    /// In a chunk-size line.
    Size,
    /// In a chunk's data: this many bytes to go.
    Data(usize),
    /// In the CRLF after a chunk's data: this many bytes of it to go.
    DataEnd(usize),
    /// In the trailer after the last chunk.
    Trailer,
}

/// A chunked `text/event-stream` response, read piece by piece.
#[derive(Debug, Default)]
struct Body {
    state: State,
    /// Bytes of a line (the head's, a size line) not yet complete.
    line: Vec<u8>,
    /// Event bytes not yet a whole event.
    events: Vec<u8>,
}

impl Body {
    /// Reads `bytes`; `each` gets every event's data. `Ok(true)` once the
    /// body has ended.
    fn feed(
        &mut self,
        mut bytes: &[u8],
        each: &mut impl FnMut(&[u8]),
    ) -> Result<bool, &'static str> {
        while !bytes.is_empty() {
            match self.state {
                State::Head => {
                    let (ended, rest) = self.take_until(bytes, b"\r\n\r\n");
                    bytes = rest;
                    if ended {
                        let head = std::mem::take(&mut self.line);
                        let status_ok = head.starts_with(b"HTTP/1.1 200");
                        let chunked = memchr::memmem::find(
                            &head.to_ascii_lowercase(),
                            b"transfer-encoding: chunked",
                        )
                        .is_some();
                        if !status_ok || !chunked {
                            return Err("the SSE route did not answer 200 with a chunked body");
                        }
                        self.state = State::Size;
                    }
                }
                State::Size => {
                    let (ended, rest) = self.take_until(bytes, b"\r\n");
                    bytes = rest;
                    if ended {
                        let line = std::mem::take(&mut self.line);
                        let digits = line.split(|&b| b == b';').next().unwrap_or_default();
                        let size = std::str::from_utf8(digits)
                            .ok()
                            .and_then(|d| usize::from_str_radix(d.trim(), 16).ok())
                            .ok_or("a chunk size that is not hex")?;
                        self.state = if size == 0 {
                            State::Trailer
                        } else {
                            State::Data(size)
                        };
                    }
                }
                State::Data(left) => {
                    let taken = left.min(bytes.len());
                    self.events.extend_from_slice(&bytes[..taken]);
                    bytes = &bytes[taken..];
                    self.state = if taken == left {
                        State::DataEnd(2)
                    } else {
                        State::Data(left - taken)
                    };
                    self.events(each);
                }
                State::DataEnd(left) => {
                    let taken = left.min(bytes.len());
                    bytes = &bytes[taken..];
                    self.state = if taken == left {
                        State::Size
                    } else {
                        State::DataEnd(left - taken)
                    };
                }
                State::Trailer => {
                    let (ended, rest) = self.take_until(bytes, b"\r\n");
                    bytes = rest;
                    if ended && std::mem::take(&mut self.line).len() == 2 {
                        return Ok(true);
                    }
                }
            }
        }
        Ok(false)
    }

    /// Adds `bytes` to the line up to and with `end`: whether it ended,
    /// and what is after it.
    fn take_until<'b>(&mut self, bytes: &'b [u8], end: &[u8]) -> (bool, &'b [u8]) {
        // The end may have begun in the bytes before.
        let from = self.line.len().saturating_sub(end.len() - 1);
        self.line.extend_from_slice(bytes);
        match memchr::memmem::find(&self.line[from..], end) {
            Some(at) => {
                let through = from + at + end.len();
                let rest = &bytes[bytes.len() - (self.line.len() - through)..];
                self.line.truncate(through);
                (true, rest)
            }
            None => (false, &[]),
        }
    }

    /// Hands on every whole event's data (the bench's events are one
    /// `data:` line each).
    fn events(&mut self, each: &mut impl FnMut(&[u8])) {
        let mut at = 0;
        while let Some(end) = memchr::memmem::find(&self.events[at..], b"\n\n") {
            let event = &self.events[at..at + end];
            if let Some(data) = event
                .strip_prefix(b"data: ")
                .or_else(|| event.strip_prefix(b"data:"))
            {
                each(data);
            }
            at += end + 2;
        }
        self.events.drain(..at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunked_event_stream_is_read_however_it_is_cut() {
        let mut body = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        let events = [
            "data: {\"a\":1}\n\n",
            "data: {\"b\":2}\n\ndata: {\"c\":3}\n\n",
        ];
        for event in events {
            body.extend_from_slice(format!("{:x}\r\n{event}\r\n", event.len()).as_bytes());
        }
        body.extend_from_slice(b"0\r\n\r\n");
        for cut in 1..body.len() {
            let mut reader = Body::default();
            let mut seen = Vec::new();
            let mut ended = false;
            for piece in body.chunks(cut) {
                assert!(!ended, "bytes after the end");
                ended = reader
                    .feed(piece, &mut |data| seen.push(data.to_vec()))
                    .expect("reads");
            }
            assert!(ended, "cut {cut}");
            assert_eq!(
                seen,
                [&b"{\"a\":1}"[..], b"{\"b\":2}", b"{\"c\":3}"],
                "cut {cut}"
            );
        }
        let mut refused = Body::default();
        assert!(
            refused
                .feed(b"HTTP/1.1 502 Bad Gateway\r\n\r\n", &mut |_| {})
                .is_err()
        );
    }
}
