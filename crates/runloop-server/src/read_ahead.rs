//! Reading a proxy path's socket ahead of its WebSocket.
//!
//! A server holds a proxy path per loop, tens of thousands of them, so each
//! path's WebSocket keeps a small read buffer ([`READ_BUFFER`](super::proxy_path)).
//! Read straight from the socket, a busy loop would then pay a system call
//! — and on loopback the acknowledgement it sends, and the proxy's sending
//! that acknowledgement lets on — for every few kilobytes. [`ReadAhead`]
//! reads the socket into a buffer of its own: a small one at first (a
//! quiet loop's message is small), and once a read fills it up to [`AHEAD`]
//! bytes per system call. That buffer exists only while a path is busy:
//! it is let go when the socket has nothing more to give, so an idle path
//! holds nothing extra.
//!
//! Busy paths together may hold at most [`BUDGET`] bytes in buffers of
//! [`AHEAD`]; past it, a path's buffer is [`AHEAD_SPARING`], so tens of
//! thousands of busy loops still hold a bounded amount. (Reads of 64 KiB
//! rather than 16 KiB cut the relay's CPU per chunk by about a tenth at 16
//! busy loops: fewer reads, and fewer acknowledgements to send and wake
//! the proxy with.)
//!
//! On a relayed path (`/agent/run`) the binary messages are taken from that
//! buffer where they lie ([`MessageReader`]), by the relay itself
//! ([`ReadAhead::poll_messages`], [`ReadAhead::message`]), without the
//! WebSocket; only the frames the WebSocket must read itself are handed on
//! to it, when the relay reads it next. While a message waits, nothing is
//! handed on, and a read of the WebSocket is pending without a wake-up:
//! its reader takes the messages first, then reads the WebSocket again. On
//! other paths every byte is handed on.

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, ReadBuf};

use runloop_wire::ws::{MessageReader, Step};

/// The most one system call reads, while the [`BUDGET`] lasts.
pub(crate) const AHEAD: usize = 64 << 10;

/// The most the first read of a busy spell reads: a quiet loop's message
/// needs no more.
const QUIET: usize = 4 << 10;

/// The most one system call reads once the [`BUDGET`] is spent.
pub(crate) const AHEAD_SPARING: usize = 16 << 10;

/// The bytes the process's read-ahead buffers of [`AHEAD`] may take
/// together.
pub(crate) const BUDGET: usize = 16 << 20;

/// The process's budget of [`BUDGET`] bytes, shared by every path.
pub(crate) static PROCESS: Budget = Budget::new(BUDGET);

/// Bytes that buffers of [`AHEAD`] may take together, and how many they
/// take now.
#[derive(Debug)]
pub(crate) struct Budget {
    bytes: usize,
    taken: AtomicUsize,
}

impl Budget {
    pub(crate) const fn new(bytes: usize) -> Self {
        Budget {
            bytes,
            taken: AtomicUsize::new(0),
        }
    }

    /// A buffer's size: [`AHEAD`] if the budget has room for it (then
    /// taken from it), else [`AHEAD_SPARING`].
    fn take(&self) -> usize {
        let taken = self.taken.fetch_add(AHEAD, Ordering::Relaxed);
        if taken + AHEAD <= self.bytes {
            AHEAD
        } else {
            self.taken.fetch_sub(AHEAD, Ordering::Relaxed);
            AHEAD_SPARING
        }
    }

    /// Gives back a buffer of `size` bytes that [`take`](Self::take) gave.
    fn give_back(&self, size: usize) {
        if size == AHEAD {
            self.taken.fetch_sub(AHEAD, Ordering::Relaxed);
        }
    }
}

/// A socket whose reads go ahead of what its reader asks for.
#[derive(Debug)]
pub(crate) struct ReadAhead<S> {
    inner: S,
    /// Read from the socket and not yet handed on or taken; empty, with no
    /// allocation, whenever the socket has nothing more to give.
    ahead: BytesMut,
    /// The size of `ahead`'s buffer while it has one, else 0.
    size: usize,
    budget: &'static Budget,
    /// The frames of a relayed path; `None`: every byte is handed on.
    frames: Option<MessageReader>,
    /// Messages taken and not yet given to the relay.
    messages: VecDeque<Bytes>,
    /// Bytes of a frame being handed on, not yet handed.
    handing: u64,
    /// A read's error, or a fault of the frames, met while taking
    /// messages: for the WebSocket's next read.
    failed: Option<io::Error>,
    /// The last read left the socket empty (it gave less than it had room
    /// for).
    emptied: bool,
    /// The messages waiting are all the socket had: the last read emptied
    /// it and what is left of it is part of a frame.
    all_read: bool,
}

impl<S> ReadAhead<S> {
    /// Reads `inner` ahead, in buffers of the size `budget` allows; takes
    /// its binary messages itself if it has `frames`.
    pub(crate) fn new(inner: S, budget: &'static Budget, frames: Option<MessageReader>) -> Self {
        ReadAhead {
            inner,
            ahead: BytesMut::new(),
            size: 0,
            budget,
            frames,
            messages: VecDeque::new(),
            handing: 0,
            failed: None,
            emptied: false,
            all_read: false,
        }
    }

    /// The next binary message taken from a relayed path, if one waits.
    pub(crate) fn message(&mut self) -> Option<Bytes> {
        self.messages.pop_front()
    }

    /// The socket.
    #[cfg(test)]
    pub(crate) fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Whether a message waits for [`message`](Self::message).
    pub(crate) fn has_message(&self) -> bool {
        !self.messages.is_empty()
    }

    /// Whether the messages taken have all been given, and the socket had
    /// nothing more when it was last read: a read now would most likely
    /// wait. A hint (more may have come since), for a reader deciding
    /// whether to look for more before it sends what it has.
    pub(crate) fn drained(&self) -> bool {
        self.all_read && self.messages.is_empty()
    }

    /// Whether the frames read so far leave a fragmented message open.
    pub(crate) fn inside_message(&self) -> bool {
        self.frames
            .as_ref()
            .is_some_and(MessageReader::inside_message)
    }

    /// The path is closing: the messages waiting and any to come are
    /// dropped, so that the WebSocket reads on to the proxy's close.
    pub(crate) fn drop_messages(&mut self) {
        self.messages.clear();
        if let Some(frames) = &mut self.frames {
            frames.drop_messages();
        }
    }

    /// Lets the buffer go, and gives its bytes back to the budget.
    fn release(&mut self) {
        self.ahead = BytesMut::new();
        self.budget.give_back(std::mem::take(&mut self.size));
    }
}

impl<S> Drop for ReadAhead<S> {
    fn drop(&mut self) {
        self.release();
    }
}

impl<S: AsyncRead + Unpin> ReadAhead<S> {
    /// Reads the socket into the buffer, until it holds at least `need`
    /// bytes or as many as one read gives: how many it read (0: the
    /// socket's end).
    fn fill(&mut self, cx: &mut Context<'_>, need: usize) -> Poll<io::Result<usize>> {
        if self.size == 0 {
            self.size = QUIET;
        }
        self.ahead
            .reserve(need.saturating_sub(self.ahead.len()).max(self.size));
        let room = self.ahead.capacity() - self.ahead.len();
        match tokio_util::io::poll_read_buf(Pin::new(&mut self.inner), cx, &mut self.ahead) {
            Poll::Ready(Ok(read)) => {
                self.emptied = read < room;
                if read == room && self.size == QUIET {
                    // More may be there: read ahead from now on.
                    self.size = self.budget.take();
                }
                Poll::Ready(Ok(read))
            }
            Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
            Poll::Pending => {
                if self.ahead.is_empty() {
                    // Idle: let the buffer go.
                    self.release();
                }
                Poll::Pending
            }
        }
    }

    /// Reads the socket and takes the messages that come before the
    /// WebSocket's next frame, without the WebSocket: ready with whether a
    /// message waits ([`message`](Self::message)), `false` when the
    /// WebSocket must read next (a frame of its own, the end, an error
    /// kept for its read, or a path that is not relayed); pending, to be
    /// woken by the socket, when it has nothing more. The WebSocket's own
    /// reads ([`poll_read`](AsyncRead::poll_read)) go through it too, so
    /// the frames are read in one place.
    pub(crate) fn poll_messages(&mut self, cx: &mut Context<'_>) -> Poll<bool> {
        self.all_read = false;
        loop {
            let Some(frames) = &mut self.frames else {
                return Poll::Ready(false);
            };
            if self.handing > 0 || self.failed.is_some() {
                return Poll::Ready(!self.messages.is_empty());
            }
            match frames.step(&mut self.ahead) {
                Step::Message(message) => self.messages.push_back(message),
                Step::HandOn(bytes) => self.handing = bytes,
                Step::NeedMore(_) if !self.messages.is_empty() => {
                    self.all_read = self.emptied;
                    return Poll::Ready(true);
                }
                Step::Fault(_) if !self.messages.is_empty() => return Poll::Ready(true),
                Step::Fault(why) => {
                    self.failed = Some(io::Error::new(io::ErrorKind::InvalidData, why));
                    return Poll::Ready(false);
                }
                Step::NeedMore(need) => match ready!(self.fill(cx, need)) {
                    Ok(0) => return Poll::Ready(false),
                    Ok(_) => {}
                    Err(error) => {
                        self.failed = Some(error);
                        return Poll::Ready(false);
                    }
                },
            }
        }
    }

    /// Hands on what is read, taking no message: a path that is not
    /// relayed.
    fn hand_on_all(&mut self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if self.ahead.is_empty() {
            if self.size == 0 || buf.remaining() >= self.size {
                // Not known to be busy, or room enough: straight into the
                // reader's buffer, with no buffer of its own and no copy.
                // A read that fills it may have left more: read ahead from
                // then on.
                let room = buf.remaining();
                let before = buf.filled().len();
                let read = Pin::new(&mut self.inner).poll_read(cx, buf);
                match &read {
                    Poll::Ready(Ok(()))
                        if self.size == 0 && buf.filled().len() - before == room =>
                    {
                        self.size = self.budget.take();
                    }
                    Poll::Pending => self.release(),
                    _ => {}
                }
                return read;
            }
            if ready!(self.fill(cx, 1))? == 0 {
                return Poll::Ready(Ok(()));
            }
        }
        let taken = self.ahead.len().min(buf.remaining());
        buf.put_slice(&self.ahead[..taken]);
        self.ahead.advance(taken);
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for ReadAhead<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.frames.is_none() {
            return this.hand_on_all(cx, buf);
        }
        if ready!(this.poll_messages(cx)) {
            // Its reader takes the messages first.
            return Poll::Pending;
        }
        if let Some(error) = this.failed.take() {
            return Poll::Ready(Err(error));
        }
        if this.handing == 0 {
            // The end, to the WebSocket; a frame cut short by it is lost,
            // as it would be there.
            return Poll::Ready(Ok(()));
        }
        if this.ahead.is_empty() && ready!(this.fill(cx, 1))? == 0 {
            return Poll::Ready(Ok(()));
        }
        let taken = usize::try_from(this.handing)
            .unwrap_or(usize::MAX)
            .min(this.ahead.len())
            .min(buf.remaining());
        buf.put_slice(&this.ahead[..taken]);
        this.ahead.advance(taken);
        this.handing -= taken as u64;
        Poll::Ready(Ok(()))
    }
}

super::writes_through::writes_through!(ReadAhead, inner);

#[cfg(test)]
mod tests {
    use std::future::poll_fn;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    fn taken(budget: &Budget) -> usize {
        budget.taken.load(Ordering::Relaxed)
    }

    #[test]
    fn buffers_are_large_while_the_budget_lasts_then_sparing() {
        static BUDGET: Budget = Budget::new(2 * AHEAD + 1);
        assert_eq!([BUDGET.take(), BUDGET.take()], [AHEAD, AHEAD]);
        assert_eq!(BUDGET.take(), AHEAD_SPARING, "the budget is spent");
        assert_eq!(taken(&BUDGET), 2 * AHEAD, "a refusal takes nothing");
        BUDGET.give_back(AHEAD_SPARING);
        assert_eq!(taken(&BUDGET), 2 * AHEAD, "a sparing buffer was not taken");
        BUDGET.give_back(AHEAD);
        assert_eq!(BUDGET.take(), AHEAD, "given back, taken again");
    }

    #[tokio::test]
    async fn a_path_holds_its_buffer_only_while_it_has_bytes_to_hand_on() {
        static BUDGET: Budget = Budget::new(AHEAD);
        let (mut proxy, socket) = tokio::io::duplex(1 << 20);
        let mut path = ReadAhead::new(socket, &BUDGET, None);
        let sent: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        proxy.write_all(&sent).await.expect("write");
        let mut got = vec![0; 4096];
        path.read_exact(&mut got).await.expect("read");
        assert_eq!(got, sent[..4096]);
        assert_eq!(taken(&BUDGET), AHEAD, "reading ahead of the WebSocket");
        let mut rest = vec![0; sent.len() - 4096];
        path.read_exact(&mut rest).await.expect("read");
        assert_eq!(rest, sent[4096..]);
        // Nothing more to give: the next read lets the buffer go.
        let mut buf = [0; 16];
        let pending = poll_fn(|cx| {
            let mut read = ReadBuf::new(&mut buf);
            Poll::Ready(Pin::new(&mut path).poll_read(cx, &mut read).is_pending())
        })
        .await;
        assert!(pending, "the proxy sent nothing more");
        assert_eq!(taken(&BUDGET), 0, "an idle path holds nothing");
        // A quiet path's read goes straight to the reader.
        proxy.write_all(b"more").await.expect("write");
        let read = path.read(&mut buf).await.expect("read");
        assert_eq!(&buf[..read], b"more");
        assert_eq!(taken(&BUDGET), 0, "a read that did not fill its room");
        proxy.write_all(&sent).await.expect("write");
        path.read_exact(&mut got).await.expect("read");
        assert_eq!(taken(&BUDGET), AHEAD, "busy again");
        drop(path);
        assert_eq!(taken(&BUDGET), 0, "a dropped path gives its buffer back");
    }
}

/// The relay's reading of a path through [`ReadAhead`] and its
/// [`MessageReader`]: what it reads, and when.
#[cfg(test)]
mod path_tests {
    use std::collections::VecDeque;
    use std::io;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use proptest::prelude::*;
    use tokio::io::{AsyncRead, AsyncReadExt, ReadBuf};
    use tokio_tungstenite::WebSocketStream;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::{Control, Data, OpCode};
    use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};

    use super::*;
    use crate::proxy_path::{Next, next_message};
    use runloop_testkit::websocket::{binary, frame as frame_bytes, more, ping};
    use runloop_wire::ws::{Head, opcode};

    const ANSWER: &[u8] = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n";

    const LIMIT: usize = 200_000;

    /// A socket that gives its bytes in the pieces it was made of, and
    /// keeps what is written to it.
    struct Pieces(VecDeque<Vec<u8>>, Vec<u8>);

    impl AsyncRead for Pieces {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            if let Some(piece) = self.0.front_mut() {
                let taken = piece.len().min(buf.remaining());
                buf.put_slice(&piece[..taken]);
                piece.drain(..taken);
                if piece.is_empty() {
                    self.0.pop_front();
                }
            }
            Poll::Ready(Ok(()))
        }
    }

    impl tokio::io::AsyncWrite for Pieces {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            b: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.1.extend_from_slice(b);
            Poll::Ready(Ok(b.len()))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// What the relay reads from a path whose socket gives `pieces`
    /// ([`next_message`]), up to the path's end; and how many messages it
    /// read before it had answered every ping that came before them.
    async fn relayed(pieces: Vec<Vec<u8>>, pings_before: &[usize]) -> (Vec<Next>, usize) {
        static BUDGET: Budget = Budget::new(1 << 20);
        let socket = Pieces(pieces.into(), Vec::new());
        let mut socket = ReadAhead::new(socket, &BUDGET, Some(MessageReader::new(LIMIT)));
        let mut answer = vec![0; ANSWER.len()];
        socket.read_exact(&mut answer).await.expect("the answer");
        assert_eq!(answer, ANSWER);
        let config = WebSocketConfig::default()
            .max_message_size(Some(LIMIT))
            .max_frame_size(Some(LIMIT));
        let mut path = WebSocketStream::from_raw_socket(socket, Role::Client, Some(config)).await;
        let mut seen = Vec::new();
        let mut late = 0;
        loop {
            let next = next_message(&mut path).await;
            if !matches!(next, Next::Message(_)) {
                seen.push(next);
                return (seen, late);
            }
            let pings = pings_before.get(seen.len()).copied().unwrap_or(0);
            if pongs(&path.get_ref().get_ref().1) < pings {
                late += 1;
            }
            seen.push(next);
        }
    }

    /// Each message the proxy sends is read as soon as it has come, in
    /// the two writes this project's proxy makes of it (header and tag,
    /// then the body), with nothing behind it: not when the next one
    /// comes.
    #[tokio::test]
    async fn a_message_is_read_when_it_comes_not_when_the_next_does() {
        use std::time::Duration;

        use tokio::io::AsyncWriteExt;
        use tokio::net::{TcpListener, TcpStream};

        static BUDGET: Budget = Budget::new(1 << 20);
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let (server, accepted) = tokio::join!(TcpStream::connect(address), listener.accept());
        let (mut proxy, _) = accepted.expect("accept");
        let mut socket = ReadAhead::new(
            server.expect("connect"),
            &BUDGET,
            Some(MessageReader::new(LIMIT)),
        );
        proxy.write_all(ANSWER).await.expect("write");
        let mut answer = vec![0; ANSWER.len()];
        socket.read_exact(&mut answer).await.expect("the answer");
        let mut path = WebSocketStream::from_raw_socket(socket, Role::Client, None).await;
        for (at, size) in [1usize, 80, 3000, 70_000, 5, 0, 200]
            .into_iter()
            .enumerate()
        {
            if at == 4 {
                proxy.write_all(&ping()).await.expect("write");
            }
            let payload: Vec<u8> = (0..size).map(|i| (i + at) as u8).collect();
            let frame = binary(true, &payload);
            let split = frame.len().min(4);
            proxy.write_all(&frame[..split]).await.expect("write");
            tokio::time::sleep(Duration::from_millis(5)).await;
            proxy.write_all(&frame[split..]).await.expect("write");
            let next = tokio::time::timeout(Duration::from_secs(10), next_message(&mut path))
                .await
                .unwrap_or_else(|_| panic!("message {at} ({size} bytes) came and was not read"));
            assert_eq!(next, Next::Message(payload.into()), "message {at}");
        }
    }

    /// A path says it is drained (the relay then sends what it has
    /// without looking for more) only once every message taken is given
    /// and its last read left the socket empty; not after a read that
    /// filled its room, which may have left more behind.
    #[tokio::test]
    async fn a_path_is_drained_only_when_its_last_read_emptied_the_socket() {
        use std::future::poll_fn;

        use tokio::io::AsyncWriteExt;

        static BUDGET: Budget = Budget::new(1 << 20);
        let (mut proxy, socket) = tokio::io::duplex(1 << 20);
        let mut path = ReadAhead::new(socket, &BUDGET, Some(MessageReader::new(LIMIT)));
        proxy.write_all(ANSWER).await.expect("write");
        let mut answer = vec![0; ANSWER.len()];
        path.read_exact(&mut answer).await.expect("the answer");
        async fn taken<S: AsyncRead + Unpin>(path: &mut ReadAhead<S>) {
            let ready = poll_fn(|cx| Poll::Ready(path.poll_messages(cx))).await;
            assert_eq!(ready, Poll::Ready(true), "a message waits");
        }

        proxy
            .write_all(&[binary(true, b"one"), binary(true, b"two")].concat())
            .await
            .expect("write");
        taken(&mut path).await;
        assert!(!path.drained(), "two messages wait");
        assert_eq!(path.message().as_deref(), Some(&b"one"[..]));
        assert!(!path.drained(), "one message waits");
        assert_eq!(path.message().as_deref(), Some(&b"two"[..]));
        assert!(path.drained(), "all the socket had is given");

        // Three messages of 2,004 bytes: a quiet path's first read (4 KiB)
        // holds two and fills its room.
        let payloads: Vec<Vec<u8>> = (0..3).map(|i| vec![i; 2000]).collect();
        let frames: Vec<u8> = payloads.iter().flat_map(|p| binary(true, p)).collect();
        proxy.write_all(&frames).await.expect("write");
        taken(&mut path).await;
        assert_eq!(path.message().as_deref(), Some(&payloads[0][..]));
        assert_eq!(path.message().as_deref(), Some(&payloads[1][..]));
        assert!(
            !path.drained(),
            "the read filled its room: more may be there"
        );
        taken(&mut path).await;
        assert_eq!(path.message().as_deref(), Some(&payloads[2][..]));
        assert!(path.drained());
    }

    /// How many pong frames `written` holds, whole frames one after the
    /// other.
    fn pongs(mut written: &[u8]) -> usize {
        let mut pongs = 0;
        while let Some((head, taken)) = Head::parse(written) {
            pongs += usize::from(head.opcode == opcode::PONG);
            written = &written[taken + head.length as usize..];
        }
        pongs
    }

    /// A frame of a generated sequence: its kind, whether it ends its
    /// message, its payload's size.
    fn sequence() -> impl Strategy<Value = Vec<(u8, bool, usize)>> {
        prop::collection::vec(
            (
                0..5u8,
                any::<bool>(),
                prop_oneof![0..130usize, 65_530..65_540usize, 70_000..70_010usize],
            ),
            0..14,
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]

        /// However the socket's bytes are cut, the relay reads the binary
        /// messages the WebSocket alone would read, in order, and the end
        /// as it is: a clean close, or one inside a message; and it has
        /// answered every ping before the messages behind it.
        #[test]
        fn a_relayed_path_reads_what_the_websocket_alone_reads(
            frames in sequence(),
            cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..24),
        ) {
            let mut bytes = ANSWER.to_vec();
            // The binary messages, and how many pings came before each.
            let mut expected = Vec::new();
            let mut pings_before = Vec::new();
            let mut pings = 0;
            // The message being put together: binary (true) or text.
            let mut open: Option<(bool, Vec<u8>)> = None;
            for (at, (kind, fin, size)) in frames.into_iter().enumerate() {
                // ASCII, so that any of it may be text.
                let payload: Vec<u8> = (0..size).map(|i| ((i + at) % 90 + 32) as u8).collect();
                let mut ended = None;
                match (kind, &mut open) {
                    (0 | 1, None) => {
                        let opcode = if kind == 0 { Data::Binary } else { Data::Text };
                        bytes.extend(frame_bytes(OpCode::Data(opcode), fin, &payload, false));
                        if fin {
                            ended = Some((kind == 0, payload));
                        } else {
                            open = Some((kind == 0, payload));
                        }
                    }
                    // Within the size limit: past it the path fails, as
                    // the WebSocket alone would.
                    (2, Some((_, sofar))) if sofar.len() + size <= LIMIT => {
                        bytes.extend(more(fin, &payload));
                        sofar.extend_from_slice(&payload);
                        if fin {
                            ended = open.take();
                        }
                    }
                    (3, _) => {
                        let payload = &payload[..size.min(125)];
                        bytes.extend(frame_bytes(OpCode::Control(Control::Ping), true, payload, false));
                        pings += 1;
                    }
                    _ => {}
                }
                if let Some((true, message)) = ended {
                    expected.push(Next::Message(message.into()));
                    pings_before.push(pings);
                }
            }
            expected.push(if open.is_some() {
                Next::Broke(
                    "the proxy closed the path inside a message (after a fragment that was not \
                     its last)"
                        .to_owned(),
                )
            } else {
                Next::Closed
            });
            bytes.extend(frame_bytes(OpCode::Control(Control::Close), true, &[], false));
            let mut points: Vec<usize> = cuts.iter().map(|cut| cut.index(bytes.len() + 1)).collect();
            points.extend([0, bytes.len()]);
            points.sort_unstable();
            let pieces = points.windows(2).map(|w| bytes[w[0]..w[1]].to_vec()).filter(|p| !p.is_empty()).collect();
            let runtime = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
            let (seen, late) = runtime.block_on(relayed(pieces, &pings_before));
            prop_assert_eq!(seen, expected);
            prop_assert_eq!(late, 0, "a ping answered only after the messages behind it");
        }
    }
}
