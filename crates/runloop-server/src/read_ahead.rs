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
//! buffer where they lie ([`PathFrames`]), by the relay itself
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
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::path_frames::{PathFrames, Step};

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
    frames: Option<PathFrames>,
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
    pub(crate) fn new(inner: S, budget: &'static Budget, frames: Option<PathFrames>) -> Self {
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
        self.frames.as_ref().is_some_and(PathFrames::inside_message)
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

impl<S: AsyncWrite + Unpin> AsyncWrite for ReadAhead<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

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
