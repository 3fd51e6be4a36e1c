//! Reading a proxy path's socket ahead of its WebSocket.
//!
//! A server holds a proxy path per loop, tens of thousands of them, so each
//! path's WebSocket keeps a small read buffer ([`READ_BUFFER`](super::proxy_path)).
//! Read straight from the socket, a busy loop would then pay a system call
//! — and on loopback the acknowledgement it sends, and the proxy's sending
//! that acknowledgement lets on — for every few kilobytes. Below the
//! WebSocket, [`ReadAhead`] reads straight into the WebSocket's buffer
//! until a read fills it (a quiet loop's message costs no buffer and no
//! copy); from then on it takes up to [`AHEAD`] bytes per system call into
//! a buffer of its own and hands them on as the WebSocket asks. That buffer
//! exists only while a path is busy: it is let go when the socket has
//! nothing more to give, so an idle path holds nothing extra.
//!
//! Busy paths together may hold at most [`BUDGET`] bytes in buffers of
//! [`AHEAD`]; past it, a path's buffer is [`AHEAD_SPARING`], so tens of
//! thousands of busy loops still hold a bounded amount. (Reads of 64 KiB
//! rather than 16 KiB cut the relay's CPU per chunk by about a tenth at 16
//! busy loops: fewer reads, and fewer acknowledgements to send and wake
//! the proxy with.)
//!
//! Every byte handed on passes [`MessageEdges`] too, which tells the relay
//! whether a close came inside a fragmented message.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::message_edges::MessageEdges;

/// The most one system call reads, while the [`BUDGET`] lasts.
pub(crate) const AHEAD: usize = 64 << 10;

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
    /// Read from the socket and not yet handed on; empty, with no
    /// allocation, whenever the socket has nothing more to give.
    ahead: BytesMut,
    /// The size of `ahead`'s buffer while it has one, else 0.
    size: usize,
    budget: &'static Budget,
    /// Where the bytes handed on stand between messages.
    edges: MessageEdges,
}

impl<S> ReadAhead<S> {
    /// Reads `inner` ahead, in buffers of the size `budget` allows.
    pub(crate) fn new(inner: S, budget: &'static Budget) -> Self {
        ReadAhead {
            budget,
            inner,
            ahead: BytesMut::new(),
            size: 0,
            edges: MessageEdges::default(),
        }
    }

    /// Whether the bytes handed on so far leave a fragmented message open.
    pub(crate) fn inside_message(&self) -> bool {
        self.edges.inside_message()
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

impl<S: AsyncRead + Unpin> AsyncRead for ReadAhead<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.ahead.is_empty() {
            if this.size == 0 || buf.remaining() >= this.size {
                // Not known to be busy, or room enough: straight into the
                // reader's buffer, with no buffer of its own to take and
                // no copy. A read that fills it may have left more: read
                // ahead from then on.
                let (before, room) = (buf.filled().len(), buf.remaining());
                let read = Pin::new(&mut this.inner).poll_read(cx, buf);
                let got = &buf.filled()[before..];
                this.edges.read(got);
                match &read {
                    Poll::Ready(Ok(())) if this.size == 0 && got.len() == room => {
                        this.size = this.budget.take();
                    }
                    Poll::Pending => this.release(),
                    _ => {}
                }
                return read;
            }
            this.ahead.reserve(this.size);
            match tokio_util::io::poll_read_buf(Pin::new(&mut this.inner), cx, &mut this.ahead) {
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(error)) => return Poll::Ready(Err(error)),
                Poll::Pending => {
                    // Idle: let the buffer go.
                    this.release();
                    return Poll::Pending;
                }
            }
        }
        let taken = this.ahead.len().min(buf.remaining());
        buf.put_slice(&this.ahead[..taken]);
        this.edges.read(&this.ahead[..taken]);
        this.ahead.advance(taken);
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
        let mut path = ReadAhead::new(socket, &BUDGET);
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
