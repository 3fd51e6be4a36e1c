//! The server's write lane: the bytes on their way to a connection's
//! socket, in order: small frames copied together, large payloads written
//! from their own bytes.
//!
//! Through the WebSocket, a relayed response would be copied twice before
//! the socket: into one message (the 9-byte frame header, then the proxy's
//! payload), and that message into the WebSocket's write buffer. A server
//! writes its frames unmasked (RFC 6455, section 5.1), so a data frame is
//! just a 2-10 byte WebSocket header, the frame header and the payload:
//! the writer puts those on the lane ([`Lane::push`]), and a flush hands
//! the socket everything on the lane in one write: vectored when large
//! payloads are on it, else straight from the copied frames. A large
//! payload is written from its own bytes; small frames are copied
//! together, once, since each piece of a vectored write costs the kernel
//! more than copying a few hundred bytes.
//!
//! The WebSocket still writes its own frames: the answer to a ping, the
//! close. It sits on [`Laned`], which puts whatever it writes on the same
//! lane, after what is there, so frames never mix; its writes are whole
//! frames, and a close frame among them ends the lane (nothing may follow
//! a close: a data frame pushed after it is refused, as the WebSocket
//! itself would refuse it); so does the peer's close, once the reader has
//! read it ([`Lane::peer_closed`]). Until the handshake is over ([`Lane::frames`])
//! what it writes is the HTTP answer, passed straight to the socket.
//!
//! ```text
//! writer ──push(head, frame header, payload)──▶ lane ──writev──▶ socket
//! WebSocket (pong, close) ──write, copied────────▲
//! ```

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_tungstenite::tungstenite::Error as WsError;
use tokio_tungstenite::tungstenite::error::ProtocolError;

use crate::ws::{Head, MAX_HEAD, opcode};

/// The writer's end of a connection's lane (see the module's docs).
#[derive(Clone)]
pub struct Lane {
    queue: Arc<Mutex<Queue>>,
}

/// A connection's socket under its WebSocket, writing through its lane.
pub struct Laned<S> {
    io: S,
    queue: Arc<Mutex<Queue>>,
}

/// What is on a lane.
#[derive(Default)]
struct Queue {
    /// The handshake is over: the WebSocket writes frames.
    framed: bool,
    /// The WebSocket wrote a close frame: nothing may follow it.
    closed: bool,
    /// Bytes to write, in order: runs of small frames copied together,
    /// and large payloads as they came.
    segments: VecDeque<Bytes>,
    /// Small frames copied together after `segments`, not yet sealed.
    tail: BytesMut,
    /// The bytes on the lane, not yet written.
    bytes: usize,
}

/// The largest part of a frame copied onto the lane rather than written
/// from its own bytes. A vectored write's pieces cost the kernel each (a
/// batch of 100-byte chunks as 200 pieces was slower than the one copy
/// through the WebSocket's buffer), so small frames are copied together
/// (one copy, as the forwarder makes) and only large payloads, where a
/// copy costs more than a piece, go as they are.
pub const COPIED: usize = 512;

/// The most pieces one vectored write takes: Linux's limit (UIO_MAXIOV).
const SLICES: usize = 1024;

impl Lane {
    /// A lane for the connection on `io`: the socket to build its
    /// WebSocket on, and the writer's end.
    pub fn new<S>(io: S) -> (Laned<S>, Lane) {
        let queue = Arc::new(Mutex::new(Queue::default()));
        (
            Laned {
                io,
                queue: Arc::clone(&queue),
            },
            Lane { queue },
        )
    }

    /// The WebSocket handshake is over: what the WebSocket writes from now
    /// on are frames, which go on the lane.
    pub fn frames(&self) {
        lock(&self.queue).framed = true;
    }

    /// Puts one data frame on the lane, unmasked: a Binary frame when it
    /// `opens` a message, else a Continuation frame; `fin` when it ends the
    /// message; its payload is `head` then `body`. Says how many bytes the
    /// lane then holds, not yet written. Refused once the lane has ended.
    pub fn push(&self, opens: bool, fin: bool, head: Bytes, body: Bytes) -> Result<usize, WsError> {
        let length = head.len() + body.len();
        let mut queue = self.begin(opens, fin, length, length.min(2 * COPIED))?;
        for part in [head, body] {
            if part.len() <= COPIED {
                queue.tail.extend_from_slice(&part);
            } else {
                queue.seal();
                queue.segments.push_back(part);
            }
        }
        Ok(queue.bytes)
    }

    /// [`push`](Self::push) for a frame small enough to be copied whole
    /// ([`COPIED`] bytes or fewer): its payload's parts are copied onto the
    /// lane from where they lie, and nothing of them is held.
    pub fn push_copy(&self, opens: bool, fin: bool, parts: [&[u8]; 2]) -> Result<usize, WsError> {
        let length = parts[0].len() + parts[1].len();
        let mut queue = self.begin(opens, fin, length, length)?;
        for part in parts {
            queue.tail.extend_from_slice(part);
        }
        Ok(queue.bytes)
    }

    /// The queue, locked, with the head of a data frame of `length` bytes
    /// put on its tail and room after it for `copied` bytes of the payload;
    /// refused once the lane has ended.
    fn begin(
        &self,
        opens: bool,
        fin: bool,
        length: usize,
        copied: usize,
    ) -> Result<MutexGuard<'_, Queue>, WsError> {
        let mut header = [0; MAX_HEAD];
        let len = Head::data(opens, fin, length as u64).write(&mut header);
        let mut queue = lock(&self.queue);
        if queue.closed {
            return Err(WsError::Protocol(ProtocolError::SendAfterClosing));
        }
        queue.bytes += len + length;
        queue.room(len + copied);
        queue.tail.extend_from_slice(&header[..len]);
        Ok(queue)
    }

    /// The peer's close was read: from now on only the WebSocket's own
    /// frames (its answer to the close) may go on the lane, as the
    /// WebSocket itself would refuse a data frame once it has read a close.
    pub fn peer_closed(&self) {
        lock(&self.queue).closed = true;
    }
}

/// The queue's lock. Nothing panics while it is held (no code that can is
/// run under it), so a poisoned lock is taken as it is.
fn lock(queue: &Mutex<Queue>) -> MutexGuard<'_, Queue> {
    queue
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The least room the tail takes when it must grow.
const TAIL: usize = 16 << 10;

impl Queue {
    /// Room for `more` bytes on the tail. Grown at least [`TAIL`] at once:
    /// from empty, growing by doubling would reallocate many times per
    /// batch; and once the segments sealed from it are written, the same
    /// allocation is taken again.
    fn room(&mut self, more: usize) {
        if self.tail.capacity() - self.tail.len() < more {
            self.tail.reserve(more.max(TAIL));
        }
    }

    /// Makes what is copied so far a segment of its own, so that what
    /// comes next goes after it.
    fn seal(&mut self) {
        if !self.tail.is_empty() {
            let sealed = self.tail.split().freeze();
            self.segments.push_back(sealed);
        }
    }

    /// Writes what is on the lane to `io`, until all of it is written or
    /// the socket is full.
    fn drain<S: AsyncWrite + Unpin>(
        &mut self,
        io: &mut S,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        // Only copied frames on the lane: written from the tail itself,
        // which keeps its allocation, with no segment made of it.
        while self.segments.is_empty() && !self.tail.is_empty() {
            let wrote = ready!(Pin::new(&mut *io).poll_write(cx, &self.tail))?;
            if wrote == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.bytes -= wrote;
            if wrote == self.tail.len() {
                self.tail.clear();
            } else {
                self.tail.advance(wrote);
            }
        }
        self.seal();
        while !self.segments.is_empty() {
            let slices: Vec<IoSlice<'_>> = self
                .segments
                .iter()
                .take(SLICES)
                .map(|segment| IoSlice::new(segment))
                .collect();
            let wrote = ready!(Pin::new(&mut *io).poll_write_vectored(cx, &slices))?;
            if wrote == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.advance(wrote);
        }
        Poll::Ready(Ok(()))
    }

    /// `wrote` more bytes are written.
    fn advance(&mut self, mut wrote: usize) {
        self.bytes -= wrote;
        while let Some(first) = self.segments.front_mut() {
            if wrote < first.len() {
                first.advance(wrote);
                return;
            }
            wrote -= first.len();
            self.segments.pop_front();
        }
    }
}

/// Whether the frames in `bytes`, whole frames one after the other, hold a
/// close frame.
fn holds_close(mut bytes: &[u8]) -> bool {
    while let Some((head, taken)) = Head::parse(bytes) {
        if head.opcode == opcode::CLOSE {
            return true;
        }
        let skip = usize::try_from(head.length)
            .unwrap_or(usize::MAX)
            .saturating_add(taken);
        bytes = bytes.get(skip..).unwrap_or_default();
    }
    false
}

impl<S: AsyncRead + Unpin> AsyncRead for Laned<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Laned<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let mut queue = lock(&this.queue);
        if !queue.framed {
            drop(queue);
            return Pin::new(&mut this.io).poll_write(cx, buf);
        }
        // Whole frames (the WebSocket writes its buffer, which is whole
        // frames, and all of it is taken each time): after what is there.
        queue.closed |= holds_close(buf);
        queue.bytes += buf.len();
        queue.room(buf.len());
        queue.tail.extend_from_slice(buf);
        // Written as far as the socket takes it now: the WebSocket does not
        // always flush after its last write (a server's answer to a close).
        if let Poll::Ready(Err(error)) = queue.drain(&mut this.io, cx) {
            return Poll::Ready(Err(error));
        }
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(lock(&this.queue).drain(&mut this.io, cx))?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(lock(&this.queue).drain(&mut this.io, cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use futures_util::{SinkExt, StreamExt};
    use tokio::io::AsyncReadExt;
    use tokio::net::{TcpListener, TcpStream};
    use tokio_tungstenite::WebSocketStream;
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::protocol::Role;

    use super::*;

    /// A server's WebSocket on a lane over loopback, and the peer's socket.
    async fn laned() -> (WebSocketStream<Laned<TcpStream>>, Lane, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("binds");
        let addr = listener.local_addr().expect("an address");
        let peer = TcpStream::connect(addr).await.expect("connects");
        let (socket, _) = listener.accept().await.expect("accepts");
        let (socket, lane) = Lane::new(socket);
        lane.frames();
        let ws = WebSocketStream::from_raw_socket(socket, Role::Server, None).await;
        (ws, lane, peer)
    }

    async fn next(peer: &mut WebSocketStream<TcpStream>) -> Message {
        peer.next().await.expect("a message").expect("whole")
    }

    #[tokio::test]
    async fn frames_go_out_in_order_from_their_own_bytes() {
        let (mut ws, lane, peer) = laned().await;
        let big = Bytes::from(vec![7; 70_000]);
        let queued = lane.push(
            true,
            true,
            Bytes::from_static(b"head"),
            Bytes::from_static(b"body"),
        );
        assert_eq!(queued.expect("open"), 2 + 8);
        // The WebSocket's own frame goes after what is on the lane.
        ws.send(Message::Pong(Bytes::from_static(b"p")))
            .await
            .expect("pong");
        // The pong's send wrote what came before it; two headers of 4.
        let queued = lane.push(true, false, Bytes::from_static(b"\0"), big.slice(..65_000));
        assert_eq!(queued.expect("open"), 4 + 65_001);
        let queued = lane.push(false, true, big.slice(65_000..), Bytes::new());
        assert_eq!(queued.expect("open"), 4 + 65_001 + 4 + 5_000);
        ws.flush().await.expect("flushed");
        let queued = lane.push(true, true, Bytes::new(), Bytes::from_static(b"!"));
        assert_eq!(queued.expect("open"), 3, "only the last frame");
        ws.flush().await.expect("flushed");

        let mut peer = WebSocketStream::from_raw_socket(peer, Role::Client, None).await;
        assert_eq!(next(&mut peer).await, Message::binary(&b"headbody"[..]));
        assert_eq!(
            next(&mut peer).await,
            Message::Pong(Bytes::from_static(b"p"))
        );
        let mut whole = vec![0];
        whole.extend_from_slice(&big);
        assert_eq!(next(&mut peer).await, Message::binary(whole));
        assert_eq!(next(&mut peer).await, Message::binary(&b"!"[..]));
    }

    /// A socket that takes at most `at_most` bytes a write and is full
    /// every other time it is written to; it keeps what it takes.
    struct Trickle {
        at_most: usize,
        full: bool,
        took: Vec<u8>,
    }

    impl AsyncWrite for Trickle {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.full = !self.full;
            if !self.full {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            let took = buf.len().min(self.at_most);
            self.took.extend_from_slice(&buf[..took]);
            Poll::Ready(Ok(took))
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// Small frames are written from the lane's tail itself, large
    /// payloads from their own bytes: written a few bytes at a time, with
    /// frames pushed between the writes and a large payload among them,
    /// everything still goes out once, in order.
    #[test]
    fn a_socket_that_takes_little_at_a_time_gets_every_frame_in_order() {
        let (mut laned, lane) = Lane::new(Trickle {
            at_most: 7,
            full: false,
            took: Vec::new(),
        });
        lane.frames();
        let mut context = Context::from_waker(std::task::Waker::noop());
        let mut expected = Vec::new();
        let mut flush = |laned: &mut Laned<Trickle>| {
            Pin::new(laned)
                .poll_flush(&mut context)
                .map(|r| r.expect("writes"))
        };
        for round in 0..40u8 {
            let body: Vec<u8> = if round == 17 {
                vec![round; 3 * COPIED]
            } else {
                vec![round; usize::from(round) * 3]
            };
            let mut header = [0; MAX_HEAD];
            let len = Head::data(true, true, 1 + body.len() as u64).write(&mut header);
            expected.extend_from_slice(&header[..len]);
            expected.push(b'#');
            expected.extend_from_slice(&body);
            lane.push(true, true, Bytes::from_static(b"#"), Bytes::from(body))
                .expect("open");
            // A little written each round, the rest left on the lane.
            let _ = flush(&mut laned);
        }
        while flush(&mut laned).is_pending() {}
        assert_eq!(laned.io.took, expected);
        let queue = lock(&lane.queue);
        assert_eq!(queue.bytes, 0, "all written");
        assert!(queue.segments.is_empty() && queue.tail.is_empty());
    }

    #[tokio::test]
    async fn nothing_follows_the_websockets_close() {
        let (mut ws, lane, mut peer) = laned().await;
        lane.push(true, true, Bytes::from_static(b"a"), Bytes::new())
            .expect("open");
        ws.close(None).await.expect("closed");
        assert!(matches!(
            lane.push(true, true, Bytes::from_static(b"b"), Bytes::new()),
            Err(WsError::Protocol(ProtocolError::SendAfterClosing))
        ));
        drop(ws);
        let mut bytes = Vec::new();
        peer.read_to_end(&mut bytes).await.expect("read");
        // The data frame, then the close (0x88), and nothing after it.
        assert_eq!(bytes, [0x82, 1, b'a', 0x88, 0]);
    }

    #[tokio::test]
    async fn the_answer_to_the_peers_close_goes_out_unflushed() {
        let (mut ws, lane, peer) = laned().await;
        let mut peer = WebSocketStream::from_raw_socket(peer, Role::Client, None).await;
        peer.send(Message::Close(None)).await.expect("close sent");
        // The server's WebSocket reads the close and answers it; as a
        // server it then ends without a flush of its own.
        assert!(matches!(ws.next().await, Some(Ok(Message::Close(_)))));
        assert!(ws.next().await.is_none());
        let late = lane.push(true, true, Bytes::from_static(b"late"), Bytes::new());
        assert!(late.is_err());
        let answer = tokio::time::timeout(std::time::Duration::from_secs(10), next(&mut peer));
        assert!(matches!(answer.await, Ok(Message::Close(_))), "answered");
    }

    #[test]
    fn a_close_is_found_among_whole_frames() {
        assert!(!holds_close(&[]));
        assert!(holds_close(&[0x88, 0]));
        assert!(!holds_close(&[0x8A, 1, b'p']));
        assert!(holds_close(&[0x8A, 1, b'p', 0x88, 2, 3, 232]));
        let mut long = vec![0x82, 126, 1, 0];
        long.extend_from_slice(&[0x88; 256]);
        assert!(!holds_close(&long), "a payload is skipped, not read");
        long.extend_from_slice(&[0x88, 0]);
        assert!(holds_close(&long));
        assert!(!holds_close(&[0x82, 127, 0]), "cut short");
    }
}
