//! The baseline: a batching WebSocket forwarder with no protocol logic.
//!
//! It accepts a WebSocket, dials the same path on the upstream proxy, and
//! copies every data message across, in both directions: what a competent
//! engineer would write to pass a loop on with the server's transport stack
//! (tokio + tokio-tungstenite) and its socket settings ([`crate::socket`]).
//! It writes the way a fast relay should: it `feed`s every message that has
//! already arrived and `flush`es once when no more is ready, so a busy
//! stream pays one send for many messages and a quiet one still sends each
//! message at once. A forwarder that flushed every message would be slower
//! than need be and flatter the relay measured against it.

use futures_util::{FutureExt, Sink, SinkExt, Stream, StreamExt};
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
    let Some((client, path)) = socket::accept(tcp).await else {
        return;
    };
    let Ok(upstream) = socket::connect(&format!("{upstream}{path}")).await else {
        return;
    };
    let (to_client, from_client) = client.split();
    let (to_upstream, from_upstream) = upstream.split();
    tokio::join!(
        copy(from_client, to_upstream),
        copy(from_upstream, to_client)
    );
}

/// Copies data messages from `from` to `to` until `from` closes or fails,
/// one flush per batch of ready messages, then closes `to`.
async fn copy<R, W>(mut from: R, mut to: W)
where
    R: Stream<Item = Result<Message, WsError>> + Unpin,
    W: Sink<Message, Error = WsError> + Unpin,
{
    'read: while let Some(Ok(mut message)) = from.next().await {
        loop {
            if message.is_close() {
                break 'read;
            }
            if is_data(&message) && to.feed(message).await.is_err() {
                return;
            }
            match from.next().now_or_never() {
                // Nothing more has arrived: send the batch.
                None => break,
                Some(Some(Ok(next))) => message = next,
                Some(_) => break 'read,
            }
        }
        if to.flush().await.is_err() {
            return;
        }
    }
    // Flushes whatever is fed, then the close handshake.
    let _ = to.close().await;
}

fn is_data(message: &Message) -> bool {
    matches!(message, Message::Binary(_) | Message::Text(_))
}
