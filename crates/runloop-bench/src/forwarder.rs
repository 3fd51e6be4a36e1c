//! The baseline: a batching WebSocket forwarder with no protocol logic.
//!
//! It accepts a WebSocket, dials the same path on the upstream proxy, and
//! copies every data message across, in both directions: what a competent
//! engineer would write to pass a loop on with the server's transport stack
//! (tokio + tokio-tungstenite) and its socket settings ([`crate::socket`]).
//!
//! It is written to be as fast as that stack allows, so that the relay is
//! measured against the best plain hop and not a slow one:
//!
//! - each pair of sockets lives in one task, polled by one `poll_fn` that
//!   drives both directions. Neither socket is `split()`, which would take
//!   a lock on every message in both halves;
//! - a direction feeds every message that is ready, and flushes once when
//!   no more is: a busy stream pays one send for many messages, a quiet one
//!   still sends each message at once;
//! - the receiving socket's readiness is the backpressure: a message it
//!   cannot take yet is held (one per direction) and nothing more is read
//!   from that side until it goes.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use futures_util::{Sink, Stream};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

use crate::socket;

/// Forwards every connection on `listener` to `upstream` (`ws://host:port`)
/// until the listener fails.
pub async fn forward(listener: TcpListener, upstream: String) -> std::io::Result<()> {
    loop {
        let (tcp, _) = listener.accept().await?;
        tokio::spawn(pipe(tcp, upstream.clone()));
    }
}

async fn pipe(tcp: TcpStream, upstream: String) {
    let Some((mut client, path)) = socket::accept(tcp).await else {
        return;
    };
    let Ok(mut upstream) = socket::connect(&format!("{upstream}{path}")).await else {
        return;
    };
    let mut up = Direction::default();
    let mut down = Direction::default();
    std::future::poll_fn(|cx| {
        // Both directions each time: a message one way often makes room or
        // brings an answer the other way.
        let sent_up = up.poll(cx, &mut client, &mut upstream);
        let sent_down = down.poll(cx, &mut upstream, &mut client);
        if sent_up.is_ready() && sent_down.is_ready() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
}

/// One direction of a pair: the message the receiver could not take yet,
/// whether anything fed is unflushed, and whether the direction is over.
#[derive(Default)]
struct Direction {
    held: Option<Message>,
    unflushed: bool,
    state: State,
}

#[derive(Default, PartialEq)]
enum State {
    /// Copying.
    #[default]
    Open,
    /// The sender closed or failed: the receiver's close handshake is under
    /// way (after whatever was fed).
    Closing,
    /// Done.
    Over,
}

impl Direction {
    /// Copies what is ready from `from` to `to`; ready once the direction is
    /// over. Registers for a wake-up whenever it returns pending.
    fn poll<R, W>(&mut self, cx: &mut Context<'_>, from: &mut R, to: &mut W) -> Poll<()>
    where
        R: Stream<Item = Result<Message, WsError>> + Unpin,
        W: Sink<Message, Error = WsError> + Unpin,
    {
        if self.state == State::Open {
            match self.copy(cx, from, to) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(())) => self.state = State::Closing,
                Poll::Ready(Err(_)) => self.state = State::Over,
            }
        }
        if self.state == State::Closing {
            // Flushes whatever is fed, then the close handshake.
            ready!(Pin::new(&mut *to).poll_close(cx)).ok();
            self.state = State::Over;
        }
        Poll::Ready(())
    }

    /// Feeds every ready message, then flushes; `Ok` when `from` has ended.
    fn copy<R, W>(
        &mut self,
        cx: &mut Context<'_>,
        from: &mut R,
        to: &mut W,
    ) -> Poll<Result<(), WsError>>
    where
        R: Stream<Item = Result<Message, WsError>> + Unpin,
        W: Sink<Message, Error = WsError> + Unpin,
    {
        loop {
            if let Some(message) = self.held.take() {
                match Pin::new(&mut *to).poll_ready(cx) {
                    Poll::Ready(Ok(())) => {
                        Pin::new(&mut *to).start_send(message)?;
                        self.unflushed = true;
                    }
                    Poll::Ready(Err(why)) => return Poll::Ready(Err(why)),
                    Poll::Pending => {
                        self.held = Some(message);
                        break;
                    }
                }
            }
            match Pin::new(&mut *from).poll_next(cx) {
                Poll::Ready(Some(Ok(message))) if is_data(&message) => self.held = Some(message),
                Poll::Ready(Some(Ok(message))) if message.is_close() => return Poll::Ready(Ok(())),
                // Pings and pongs are the socket's own business.
                Poll::Ready(Some(Ok(_))) => {}
                Poll::Ready(Some(Err(_)) | None) => return Poll::Ready(Ok(())),
                Poll::Pending => break,
            }
        }
        // Nothing more is ready (or the receiver is full): send the batch.
        if self.unflushed {
            match Pin::new(&mut *to).poll_flush(cx) {
                Poll::Ready(Ok(())) => self.unflushed = false,
                Poll::Ready(Err(why)) => return Poll::Ready(Err(why)),
                Poll::Pending => {}
            }
        }
        Poll::Pending
    }
}

fn is_data(message: &Message) -> bool {
    matches!(message, Message::Binary(_) | Message::Text(_))
}
