//! Reading a proxy path's socket ahead of its WebSocket.
//!
//! A server holds a proxy path per loop, tens of thousands of them, so each
//! path's WebSocket keeps a small read buffer ([`READ_BUFFER`](super::proxy_path)).
//! Read straight from the socket, a busy loop would then pay a system call
//! — and on loopback the acknowledgement it sends, and the proxy's sending
//! that acknowledgement lets on — for every few kilobytes. Below the
//! WebSocket, [`ReadAhead`] takes up to [`AHEAD`] bytes per system call
//! into a buffer of its own and hands them on as the WebSocket asks; that
//! buffer exists only while a path is being read: it is let go when the
//! socket has nothing more to give, so an idle path holds nothing extra.
//!
//! Every byte handed on passes [`MessageEdges`] too, which tells the relay
//! whether a close came inside a fragmented message.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::message_edges::MessageEdges;

/// The most one system call reads: what a busy forwarder on the same stack
/// reads at once.
pub(crate) const AHEAD: usize = 16 << 10;

/// A socket whose reads go ahead of what its reader asks for.
#[derive(Debug)]
pub(crate) struct ReadAhead<S> {
    inner: S,
    /// Read from the socket and not yet handed on; empty, with no
    /// allocation, whenever the socket has nothing more to give.
    ahead: BytesMut,
    /// Where the bytes handed on stand between messages.
    edges: MessageEdges,
}

impl<S> ReadAhead<S> {
    pub(crate) fn new(inner: S) -> Self {
        ReadAhead {
            inner,
            ahead: BytesMut::new(),
            edges: MessageEdges::default(),
        }
    }

    /// Whether the bytes handed on so far leave a fragmented message open.
    pub(crate) fn inside_message(&self) -> bool {
        self.edges.inside_message()
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
            if buf.remaining() >= AHEAD {
                // Room enough: no reason to read twice.
                let before = buf.filled().len();
                let read = Pin::new(&mut this.inner).poll_read(cx, buf);
                this.edges.read(&buf.filled()[before..]);
                return read;
            }
            this.ahead.reserve(AHEAD);
            match tokio_util::io::poll_read_buf(Pin::new(&mut this.inner), cx, &mut this.ahead) {
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(error)) => return Poll::Ready(Err(error)),
                Poll::Pending => {
                    // Idle: let the buffer go.
                    this.ahead = BytesMut::new();
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
