//! The proxy's HTTP/1.1 client: one call on a connection of its own, the
//! answer's head parsed, its body read from the socket into the proxy's
//! own buffer and taken out of its framing there.
//!
//! ```text
//! dial ──▶ POST, head and body in one write ──▶ the answer's head (1xx skipped)
//!                                                   │
//!   body: read into one buffer ──▶ framing taken off in place ──▶ pieces of it, unread
//!         (chunked: size lines and CRLFs; a Content-Length; or to the connection's end)
//! ```
//!
//! Why its own: a general client runs each connection in a task of its own
//! and hands the body over a channel, one piece at a time, so every chunk
//! of a loop would wake the proxy's task (or the server's, in process) and
//! then the connection's. Here the task that wants the body reads the
//! socket itself, once per batch of events, and each piece of data is a
//! slice of the bytes read, not a copy. The agent program is on the run's
//! own loopback, so there is no TLS, no proxy, no redirect and no pool to
//! have: a connection lives as long as its one call, and is never offered
//! to another run. The connection is the proxy's [`Dial`]'s: made in the
//! run's network namespace by its runtime, or to an address.
//!
//! What is refused, as a careful HTTP/1.1 client refuses it: a head that is
//! not HTTP/1.x or is larger than [`MAX_HEAD`], a `Transfer-Encoding` on an
//! HTTP/1.0 answer, a `Content-Length` that is not one number, a chunk
//! size that is not hex (or does not fit 64 bits), a chunk not followed by
//! CRLF, a size line or trailer longer than [`MAX_LINE`].

use std::fmt;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes, BytesMut};
use futures_util::Stream;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::dial::Dial;

/// The most an answer's head may take.
pub(super) const MAX_HEAD: usize = 64 << 10;

/// The most a chunk-size line or a trailer line may take.
pub(super) const MAX_LINE: usize = 4 << 10;

/// The most headers an answer may have.
const MAX_HEADERS: usize = 100;

/// How much one read of the socket takes at most.
const READ: usize = 16 << 10;

/// Why a call got no answer.
#[derive(Debug)]
pub(super) enum Unanswered {
    /// The agent program could not be reached.
    Connect(io::Error),
    /// The connection ended, or failed, before a whole head came.
    Closed(Option<io::Error>),
    /// What came is not an HTTP/1.x answer.
    Malformed(String),
}

impl fmt::Display for Unanswered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unanswered::Connect(error) => write!(f, "cannot connect: {error}"),
            Unanswered::Closed(None) => f.write_str("the connection closed before an answer"),
            Unanswered::Closed(Some(error)) => {
                write!(f, "the connection failed before an answer: {error}")
            }
            Unanswered::Malformed(why) => write!(f, "the answer is not HTTP/1.1: {why}"),
        }
    }
}

/// How an answer's body ends, as its head says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Framing {
    /// Chunked transfer encoding: the end is marked.
    Marked,
    /// A `Content-Length` of this many bytes.
    Length(u64),
    /// Neither: the body ends when the connection closes, which a crash
    /// does too.
    Close,
}

/// An answer: its status, the headers the proxy reads, and its body.
#[derive(Debug)]
pub(super) struct Answer {
    pub(super) status: u16,
    /// `Content-Type`, as it came.
    pub(super) content_type: Option<Vec<u8>>,
    pub(super) framing: Framing,
    pub(super) body: Body,
}

/// Calls `POST path` on the agent program `agent` dials with `body`
/// (JSON), asking for `accept`, and reads the answer's head.
pub(super) async fn post<D: Dial + ?Sized>(
    agent: &D,
    path: &str,
    body: &[u8],
    accept: &str,
) -> Result<Answer, Unanswered> {
    tracing::trace!(%agent, path, "calling the agent program");
    let mut tcp = agent.connect().await.map_err(Unanswered::Connect)?;
    let _ = tcp.set_nodelay(true);
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
         Accept: {accept}\r\nContent-Length: {}\r\n\r\n",
        agent.address(),
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body);
    if let Err(error) = tcp.write_all(&request).await {
        return Err(Unanswered::Closed(Some(error)));
    }
    let mut buffer = BytesMut::with_capacity(4096);
    // Whether the last read left the socket empty.
    let mut emptied = false;
    loop {
        if let Some(head) = head(&mut buffer)? {
            let Head {
                status,
                content_type,
                framing,
                decoder,
            } = head;
            tracing::trace!(%agent, path, status, ?framing, "the agent program answered");
            return Ok(Answer {
                status,
                content_type,
                framing,
                body: Body {
                    tcp,
                    buffer,
                    decoder,
                    emptied,
                },
            });
        }
        if buffer.len() >= MAX_HEAD {
            return Err(Unanswered::Malformed(format!(
                "its head is larger than {MAX_HEAD} bytes"
            )));
        }
        buffer.reserve(4096);
        let room = buffer.capacity() - buffer.len();
        match tokio::io::AsyncReadExt::read_buf(&mut tcp, &mut buffer).await {
            Ok(0) => return Err(Unanswered::Closed(None)),
            Ok(read) => emptied = read < room,
            Err(error) => return Err(Unanswered::Closed(Some(error))),
        }
    }
}

/// A parsed head.
struct Head {
    status: u16,
    content_type: Option<Vec<u8>>,
    framing: Framing,
    decoder: Decoder,
}

/// The answer's head at the start of `buffer`, taken from it, once all of
/// it is there; an informational (1xx) head is taken and skipped.
fn head(buffer: &mut BytesMut) -> Result<Option<Head>, Unanswered> {
    loop {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut response = httparse::Response::new(&mut headers);
        let taken = match response.parse(buffer) {
            Ok(httparse::Status::Complete(taken)) => taken,
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(error) => return Err(Unanswered::Malformed(error.to_string())),
        };
        let status = response.code.unwrap_or_default();
        let version = response.version.unwrap_or_default();
        if (100..200).contains(&status) && status != 101 {
            buffer.advance(taken);
            continue;
        }
        let mut content_type = None;
        let mut length: Option<u64> = None;
        let mut codings: Option<Vec<u8>> = None;
        for header in response.headers.iter() {
            if header.name.eq_ignore_ascii_case("content-type") {
                content_type = Some(header.value.to_vec());
            } else if header.name.eq_ignore_ascii_case("transfer-encoding") {
                let all = codings.get_or_insert_with(Vec::new);
                if !all.is_empty() {
                    all.push(b',');
                }
                all.extend_from_slice(header.value);
            } else if header.name.eq_ignore_ascii_case("content-length") {
                for value in header.value.split(|&b| b == b',') {
                    let parsed = std::str::from_utf8(value)
                        .ok()
                        .map(str::trim)
                        .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
                        .and_then(|v| v.parse::<u64>().ok());
                    match (parsed, length) {
                        (Some(n), None) => length = Some(n),
                        (Some(n), Some(seen)) if n == seen => {}
                        _ => {
                            return Err(Unanswered::Malformed(
                                "its Content-Length is not one number".to_owned(),
                            ));
                        }
                    }
                }
            }
        }
        let framing = if matches!(status, 204 | 304) {
            Framing::Length(0)
        } else if let Some(codings) = codings {
            if version == 0 {
                return Err(Unanswered::Malformed(
                    "an HTTP/1.0 answer with a Transfer-Encoding".to_owned(),
                ));
            }
            let last = codings
                .rsplit(|&b| b == b',')
                .next()
                .map(|coding| coding.trim_ascii());
            if last.is_some_and(|coding| coding.eq_ignore_ascii_case(b"chunked")) {
                Framing::Marked
            } else {
                Framing::Close
            }
        } else {
            length.map_or(Framing::Close, Framing::Length)
        };
        buffer.advance(taken);
        let decoder = match framing {
            Framing::Marked => Decoder::Chunked(Chunked::Size),
            Framing::Length(left) => Decoder::Length(left),
            Framing::Close => Decoder::Close,
        };
        return Ok(Some(Head {
            status,
            content_type,
            framing,
            decoder,
        }));
    }
}

/// Why a body did not end as its framing says.
#[derive(Debug, thiserror::Error)]
pub(super) enum BodyError {
    /// The socket failed.
    #[error("reading the body failed")]
    Io(#[from] io::Error),
    /// The connection closed before the body's end.
    #[error("the connection closed before the body's end")]
    Cut,
    /// The chunked framing is broken.
    #[error("the chunked body is malformed: {0}")]
    Chunked(&'static str),
}

/// An answer's body: the connection, what was read of it and not taken
/// yet, and where its framing stands.
#[derive(Debug)]
pub(super) struct Body {
    tcp: TcpStream,
    buffer: BytesMut,
    decoder: Decoder,
    /// The last read left the socket empty (it gave less than it had room
    /// for).
    emptied: bool,
}

#[derive(Debug)]
enum Decoder {
    /// This many bytes to go.
    Length(u64),
    /// To the connection's end.
    Close,
    Chunked(Chunked),
    /// The body has ended.
    Done,
}

/// Where a chunked body stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunked {
    /// In a chunk-size line.
    Size,
    /// In a chunk's data: this many bytes to go.
    Data(u64),
    /// The CRLF after a chunk's data.
    DataEnd,
    /// In the trailer, after the last chunk: a line.
    Trailer,
}

/// What taking the framing off the buffered bytes gave.
enum Taken {
    /// A piece of the body's data.
    Data(Bytes),
    /// Nothing more until more is read.
    More,
    /// The body has ended.
    End,
}

impl Body {
    /// Whether the last read left the socket empty and nothing read is
    /// left to take: a read now would most likely wait. A hint.
    pub(super) fn drained(&self) -> bool {
        self.emptied && self.buffer.is_empty()
    }

    /// Takes the framing off what is buffered: a piece of data, the end,
    /// or the need for more.
    fn take(&mut self) -> Result<Taken, BodyError> {
        loop {
            match &mut self.decoder {
                Decoder::Done => return Ok(Taken::End),
                Decoder::Length(0) => {
                    self.decoder = Decoder::Done;
                    return Ok(Taken::End);
                }
                Decoder::Length(left) => {
                    if self.buffer.is_empty() {
                        return Ok(Taken::More);
                    }
                    let n = usize::try_from(*left)
                        .unwrap_or(usize::MAX)
                        .min(self.buffer.len());
                    *left -= n as u64;
                    return Ok(Taken::Data(self.buffer.split_to(n).freeze()));
                }
                Decoder::Close => {
                    if self.buffer.is_empty() {
                        return Ok(Taken::More);
                    }
                    return Ok(Taken::Data(self.buffer.split().freeze()));
                }
                Decoder::Chunked(state) => match *state {
                    Chunked::Size => {
                        let Some(line) = line(&mut self.buffer)? else {
                            return Ok(Taken::More);
                        };
                        let size = chunk_size(&line)?;
                        *state = if size == 0 {
                            Chunked::Trailer
                        } else {
                            Chunked::Data(size)
                        };
                    }
                    Chunked::Data(left) => {
                        if self.buffer.is_empty() {
                            return Ok(Taken::More);
                        }
                        let n = usize::try_from(left)
                            .unwrap_or(usize::MAX)
                            .min(self.buffer.len());
                        let data = self.buffer.split_to(n).freeze();
                        *state = if n as u64 != left {
                            Chunked::Data(left - n as u64)
                        } else if self.buffer.starts_with(b"\r\n") {
                            // Taken now, so that a body whose read ended
                            // with this chunk is seen to have nothing left.
                            self.buffer.advance(2);
                            Chunked::Size
                        } else {
                            Chunked::DataEnd
                        };
                        return Ok(Taken::Data(data));
                    }
                    Chunked::DataEnd => {
                        if self.buffer.len() < 2 {
                            return Ok(Taken::More);
                        }
                        if &self.buffer[..2] != b"\r\n" {
                            return Err(BodyError::Chunked("a chunk is not followed by CRLF"));
                        }
                        self.buffer.advance(2);
                        *state = Chunked::Size;
                    }
                    Chunked::Trailer => {
                        let Some(line) = line(&mut self.buffer)? else {
                            return Ok(Taken::More);
                        };
                        if line.is_empty() {
                            self.decoder = Decoder::Done;
                            return Ok(Taken::End);
                        }
                    }
                },
            }
        }
    }

    /// Reads the socket into the buffer: how many bytes came (0: its end).
    fn fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        self.buffer.reserve(READ);
        let room = self.buffer.capacity() - self.buffer.len();
        let read = ready!(tokio_util::io::poll_read_buf(
            Pin::new(&mut self.tcp),
            cx,
            &mut self.buffer
        ))?;
        self.emptied = read < room;
        Poll::Ready(Ok(read))
    }
}

impl Stream for Body {
    type Item = Result<Bytes, BodyError>;

    /// The body's next piece of data, as it lies in the buffer read; `None`
    /// at its end. A read that would wait lets the buffer go when it is
    /// empty, so an idle loop holds none.
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            match this.take() {
                Ok(Taken::Data(data)) => return Poll::Ready(Some(Ok(data))),
                Ok(Taken::End) => return Poll::Ready(None),
                Ok(Taken::More) => {}
                Err(error) => {
                    this.decoder = Decoder::Done;
                    return Poll::Ready(Some(Err(error)));
                }
            }
            let read = match this.fill(cx) {
                Poll::Ready(read) => read,
                Poll::Pending => {
                    if this.buffer.is_empty() {
                        this.buffer = BytesMut::new();
                    }
                    return Poll::Pending;
                }
            };
            match read {
                Ok(0) => {
                    let ended = matches!(this.decoder, Decoder::Close);
                    this.decoder = Decoder::Done;
                    return Poll::Ready(if ended {
                        None
                    } else {
                        Some(Err(BodyError::Cut))
                    });
                }
                Ok(_) => {}
                Err(error) => {
                    this.decoder = Decoder::Done;
                    return Poll::Ready(Some(Err(BodyError::Io(error))));
                }
            }
        }
    }
}

/// The line at the start of `buffer`, without its CRLF, taken from it once
/// it is all there.
fn line(buffer: &mut BytesMut) -> Result<Option<BytesMut>, BodyError> {
    match memchr::memchr(b'\n', buffer) {
        Some(end) => {
            let mut line = buffer.split_to(end + 1);
            line.truncate(end);
            if line.last() != Some(&b'\r') {
                return Err(BodyError::Chunked("a line does not end with CRLF"));
            }
            line.truncate(end - 1);
            Ok(Some(line))
        }
        None if buffer.len() > MAX_LINE => Err(BodyError::Chunked("a line is too long")),
        None => Ok(None),
    }
}

/// A chunk-size line's size: hex digits, then optional whitespace and
/// extensions (`;name=value`), which are ignored.
fn chunk_size(line: &[u8]) -> Result<u64, BodyError> {
    let digits = line
        .iter()
        .position(|b| !b.is_ascii_hexdigit())
        .unwrap_or(line.len());
    let rest = &line[digits..];
    if digits == 0 || !(rest.is_empty() || matches!(rest[0], b';' | b' ' | b'\t')) {
        return Err(BodyError::Chunked("a chunk size is not hex"));
    }
    if !rest.trim_ascii_start().is_empty() && rest.trim_ascii_start()[0] != b';' {
        return Err(BodyError::Chunked("a chunk size is not hex"));
    }
    let hex = &line[..digits];
    let hex = &hex[hex.iter().position(|&b| b != b'0').unwrap_or(hex.len())..];
    if hex.len() > 16 {
        return Err(BodyError::Chunked("a chunk size does not fit 64 bits"));
    }
    Ok(hex.iter().fold(0u64, |size, &b| {
        size << 4 | u64::from((b as char).to_digit(16).unwrap_or(0))
    }))
}

#[cfg(test)]
mod tests {
    use futures_util::StreamExt;
    use proptest::prelude::*;
    use std::net::SocketAddr;
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;

    use super::*;

    /// An agent program that reads one request and answers `answer`, cut
    /// into writes at `cuts`, then closes; and what it read.
    async fn agent(
        answer: Vec<u8>,
        cuts: Vec<usize>,
    ) -> (SocketAddr, tokio::task::JoinHandle<Vec<u8>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("binds");
        let addr = listener.local_addr().expect("an address");
        let task = tokio::spawn(async move {
            let (mut tcp, _) = listener.accept().await.expect("a call");
            let mut request = Vec::new();
            while !request.ends_with(b"{}") {
                let mut buf = [0; 1024];
                let n = tcp.read(&mut buf).await.expect("reads");
                assert!(n > 0, "the request ended early");
                request.extend_from_slice(&buf[..n]);
            }
            let mut at = 0;
            for cut in cuts.into_iter().chain([answer.len()]) {
                let cut = cut.clamp(at, answer.len());
                tcp.write_all(&answer[at..cut]).await.expect("writes");
                tcp.flush().await.expect("flushes");
                tokio::task::yield_now().await;
                at = cut;
            }
            request
        });
        (addr, task)
    }

    /// The answer's status, framing and body (its pieces joined), or how
    /// the body broke, however `answer` is cut.
    async fn call(
        answer: &[u8],
        cuts: &[usize],
    ) -> Result<(u16, Framing, Result<Vec<u8>, String>), String> {
        let (addr, task) = agent(answer.to_vec(), cuts.to_vec()).await;
        let answered = post(&addr, "/run", b"{}", "text/event-stream").await;
        let request = task.await.expect("the agent's task");
        let head = String::from_utf8_lossy(&request);
        assert!(head.starts_with("POST /run HTTP/1.1\r\n"), "{head}");
        assert!(head.contains("\r\nContent-Length: 2\r\n"), "{head}");
        let mut answer = answered.map_err(|e| e.to_string())?;
        let mut body = Vec::new();
        while let Some(piece) = answer.body.next().await {
            match piece {
                Ok(piece) => body.extend_from_slice(&piece),
                Err(error) => return Ok((answer.status, answer.framing, Err(error.to_string()))),
            }
        }
        Ok((answer.status, answer.framing, Ok(body)))
    }

    const CHUNKED: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\
        Transfer-Encoding: gzip, chunked\r\n\r\n5;ext=1\r\nhello\r\n00A \r\n, world!!!\r\n0\r\nTrailer: x\r\n\r\n";

    #[tokio::test]
    async fn a_chunked_body_is_unframed_however_it_is_cut() {
        for cut in 0..CHUNKED.len() {
            let got = call(CHUNKED, &[cut, cut + 3]).await;
            assert_eq!(
                got,
                Ok((200, Framing::Marked, Ok(b"hello, world!!!".to_vec()))),
                "cut at {cut}"
            );
        }
    }

    #[tokio::test]
    async fn lengths_and_the_connections_end() {
        let length = b"HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\nhelloEXTRA";
        assert_eq!(
            call(length, &[20]).await,
            Ok((200, Framing::Length(5), Ok(b"hello".to_vec())))
        );
        let short = b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nhello";
        assert_eq!(
            call(short, &[]).await,
            Ok((
                200,
                Framing::Length(9),
                Err("the connection closed before the body's end".to_owned())
            ))
        );
        let close = b"HTTP/1.0 200 OK\r\n\r\nto the end";
        assert_eq!(
            call(close, &[]).await,
            Ok((200, Framing::Close, Ok(b"to the end".to_vec())))
        );
        let not_chunked_last = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\nraw";
        assert_eq!(
            call(not_chunked_last, &[]).await,
            Ok((200, Framing::Close, Ok(b"raw".to_vec())))
        );
        let no_content = b"HTTP/1.1 204 No Content\r\nContent-Length: 7\r\n\r\n";
        assert_eq!(
            call(no_content, &[]).await,
            Ok((204, Framing::Length(0), Ok(Vec::new())))
        );
        let cut = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel";
        assert_eq!(
            call(cut, &[]).await,
            Ok((
                200,
                Framing::Marked,
                Err("the connection closed before the body's end".to_owned())
            ))
        );
    }

    #[tokio::test]
    async fn what_a_careful_client_refuses() {
        for (answer, words) in [
            (
                &b"HTTP/1.1 200 OK\r\nContent-Length: 5, 6\r\n\r\n"[..],
                "not one number",
            ),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
                "not one number",
            ),
            (
                b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
                "HTTP/1.0 answer with a Transfer-Encoding",
            ),
            (b"SSH-2.0-OpenSSH\r\n\r\n", "not HTTP/1.1"),
            (b"", "closed before an answer"),
        ] {
            let got = call(answer, &[]).await;
            assert!(
                got.as_ref().is_err_and(|e| e.contains(words)),
                "{}: {got:?}",
                String::from_utf8_lossy(answer)
            );
        }
        for (body, words) in [
            (&b"zz\r\n"[..], "not hex"),
            (b"5\r\nhelloXX", "not followed by CRLF"),
            (b"5\nhello", "CRLF"),
            (b"100000000000000000\r\n", "64 bits"),
            (b"5 x\r\n", "not hex"),
        ] {
            let answer = [
                &b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"[..],
                body,
            ]
            .concat();
            let got = call(&answer, &[]).await;
            assert!(
                matches!(&got, Ok((200, Framing::Marked, Err(e))) if e.contains(words)),
                "{}: {got:?}",
                String::from_utf8_lossy(body)
            );
        }
        let refused = post(
            &"127.0.0.1:9".parse::<SocketAddr>().expect("an address"),
            "/run",
            b"{}",
            "*/*",
        )
        .await;
        assert!(
            matches!(refused, Err(Unanswered::Connect(_))),
            "{refused:?}"
        );
    }

    /// A read that ends with a chunk's CRLF leaves nothing: the body says
    /// it is drained as soon as the chunk's data is taken, so its reader
    /// sends what it has without looking for more.
    #[tokio::test]
    async fn a_body_whose_read_ended_with_a_chunk_is_drained_at_its_data() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("binds");
        let addr = listener.local_addr().expect("an address");
        let (more_tx, more) = tokio::sync::oneshot::channel::<()>();
        let agent = tokio::spawn(async move {
            let (mut tcp, _) = listener.accept().await.expect("a call");
            let mut request = vec![0; 1024];
            let _ = tcp.read(&mut request).await.expect("reads");
            tcp.write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
                .await
                .expect("writes");
            // Held open until the test has looked.
            let _ = more.await;
        });
        let mut answer = post(&addr, "/run", b"{}", "*/*").await.expect("answered");
        let piece = answer.body.next().await.expect("a piece").expect("data");
        assert_eq!(&piece[..], b"hello");
        assert!(answer.body.drained(), "nothing left of what was read");
        drop(more_tx);
        agent.await.expect("the agent's task");
    }

    #[test]
    fn chunk_sizes() {
        assert_eq!(chunk_size(b"0").ok(), Some(0));
        assert_eq!(chunk_size(b"1aF").ok(), Some(0x1AF));
        assert_eq!(chunk_size(b"00000000000000000000ff").ok(), Some(255));
        assert_eq!(chunk_size(b"ffffffffffffffff").ok(), Some(u64::MAX));
        assert_eq!(chunk_size(b"a ; name=value").ok(), Some(10));
        assert!(chunk_size(b"").is_err());
        assert!(chunk_size(b";x").is_err());
        assert!(chunk_size(b"10000000000000000").is_err());
    }

    /// Answers an HTTP/1.1 client could get from an agent program: chunked
    /// (with chunk extensions, size lines padded with zeros, trailers), a
    /// `Content-Length`, or to the connection's end; each maybe cut short
    /// (`cut`: where the agent stops writing, 0 = never).
    fn answers() -> impl Strategy<Value = (Vec<u8>, usize)> {
        let chunks = proptest::collection::vec(
            (
                proptest::collection::vec(any::<u8>(), 1..300),
                0usize..3,
                any::<bool>(),
            ),
            0..12,
        );
        let framing = 0usize..3;
        (chunks, framing, any::<bool>(), 0usize..2000).prop_map(
            |(chunks, framing, trailer, cut)| {
                let data: Vec<u8> = chunks.iter().flat_map(|(d, _, _)| d.clone()).collect();
                let mut answer = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n".to_vec();
                match framing {
                    0 => {
                        answer.extend_from_slice(b"Transfer-Encoding: chunked\r\n\r\n");
                        for (piece, zeros, extension) in &chunks {
                            let size = format!("{}{:x}", "0".repeat(*zeros), piece.len());
                            answer.extend_from_slice(size.as_bytes());
                            if *extension {
                                answer.extend_from_slice(b";name=value");
                            }
                            answer.extend_from_slice(b"\r\n");
                            answer.extend_from_slice(piece);
                            answer.extend_from_slice(b"\r\n");
                        }
                        answer.extend_from_slice(b"0\r\n");
                        if trailer {
                            answer.extend_from_slice(b"X-Trailer: yes\r\n");
                        }
                        answer.extend_from_slice(b"\r\n");
                    }
                    1 => {
                        answer.extend_from_slice(
                            format!("Content-Length: {}\r\n\r\n", data.len()).as_bytes(),
                        );
                        answer.extend_from_slice(&data);
                    }
                    _ => {
                        answer.extend_from_slice(b"Connection: close\r\n\r\n");
                        answer.extend_from_slice(&data);
                    }
                }
                let cut = if cut == 0 || cut >= answer.len() {
                    0
                } else {
                    cut
                };
                (answer, cut)
            },
        )
    }

    /// What hyper's HTTP/1.1 client reads of `answer`, written by an agent
    /// program that stops at `cut` (0: never): the body, or that it broke.
    async fn hyper_reads(answer: &[u8], cut: usize) -> Result<Vec<u8>, String> {
        use http_body_util::BodyExt;
        let written = if cut == 0 {
            answer.to_vec()
        } else {
            answer[..cut].to_vec()
        };
        let (addr, task) = agent(written, Vec::new()).await;
        let tcp = TcpStream::connect(addr).await.expect("connects");
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
                .await
                .expect("handshakes");
        let driver = tokio::spawn(connection);
        let request = hyper::Request::post("/run")
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(Bytes::from_static(b"{}")))
            .expect("a request");
        let read = async {
            let answer = sender
                .send_request(request)
                .await
                .map_err(|e| e.to_string())?;
            let body = answer
                .into_body()
                .collect()
                .await
                .map_err(|e| e.to_string())?;
            Ok(body.to_bytes().to_vec())
        }
        .await;
        drop(sender);
        let _ = driver.await;
        let _ = task.await;
        read
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// The proxy's own client reads what hyper's reads, byte for byte,
        /// and breaks where hyper's breaks: a body cut short is never read
        /// as whole by one and not the other. (A body to the connection's
        /// end cannot be cut short: both read what came.)
        #[test]
        fn the_proxys_client_reads_every_answer_as_hyper_does(
            (answer, cut) in answers(),
            cuts in proptest::collection::vec(0usize..2000, 0..4),
        ) {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            let (ours, theirs) = runtime.block_on(async {
                let written = if cut == 0 { answer.clone() } else { answer[..cut].to_vec() };
                let mut cuts = cuts.clone();
                cuts.sort_unstable();
                let ours = match call(&written, &cuts).await {
                    Ok((_, _, body)) => body,
                    Err(unanswered) => Err(unanswered),
                };
                (ours, hyper_reads(&answer, cut).await)
            });
            match (&ours, &theirs) {
                (Ok(a), Ok(b)) => prop_assert_eq!(a, b),
                (Err(_), Err(_)) => {}
                _ => prop_assert!(false, "ours {:?}, hyper's {:?}", ours, theirs),
            }
        }
    }

    #[test]
    fn no_body_error_says_its_cause_twice() {
        let reset = || io::Error::from(io::ErrorKind::ConnectionReset);
        let errors = [
            BodyError::Io(reset()),
            BodyError::Cut,
            BodyError::Chunked("a chunk size is not hex"),
        ];
        for error in &errors {
            runloop_testkit::errors::assert_cause_said_once(error);
        }
        // As the proxy says it: the event stream, then the body, then why.
        let broke = crate::sse::Broke::Transport(Box::new(BodyError::Io(reset())));
        runloop_testkit::errors::assert_cause_said_once(&broke);
        assert_eq!(
            runloop_proto::error_chain::Chain(&broke).to_string(),
            format!(
                "the event stream broke: reading the body failed: {}",
                reset()
            )
        );
    }
}
