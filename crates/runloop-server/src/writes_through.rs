//! The write half of a read-side wrapper of a connection's socket.
//!
//! The admission's allowance ([`Bounded`](super::admission::Bounded)), the
//! half-sent meter and a proxy path's read-ahead each stand between a
//! socket and the WebSocket that reads it, and each has something to do
//! with what is read and nothing with what is written: their writes go
//! straight to the socket they wrap, vectored writes included. That
//! forwarding is written once, here, and named by each of them.

/// `impl AsyncWrite for $wrapper<S>`, every call passed to its `$field`.
macro_rules! writes_through {
    ($wrapper:ident, $field:ident) => {
        impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for $wrapper<S> {
            fn poll_write(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                buf: &[u8],
            ) -> std::task::Poll<std::io::Result<usize>> {
                std::pin::Pin::new(&mut self.get_mut().$field).poll_write(cx, buf)
            }

            fn poll_write_vectored(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                bufs: &[std::io::IoSlice<'_>],
            ) -> std::task::Poll<std::io::Result<usize>> {
                std::pin::Pin::new(&mut self.get_mut().$field).poll_write_vectored(cx, bufs)
            }

            fn is_write_vectored(&self) -> bool {
                self.$field.is_write_vectored()
            }

            fn poll_flush(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                std::pin::Pin::new(&mut self.get_mut().$field).poll_flush(cx)
            }

            fn poll_shutdown(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                std::pin::Pin::new(&mut self.get_mut().$field).poll_shutdown(cx)
            }
        }
    };
}

pub(crate) use writes_through;
