//! One exchange on a path, as the proxy serves it: the ask, the server
//! leaving, and the end — a last message and a clean close (protocol §10,
//! §12 "Clean ends").
//!
//! Every close is a handshake. The proxy ends an answer with its close
//! frame and waits for the server's; it answers a close the server starts.
//! Either way the log stays silent, so "broke" in it means something broke.

use std::io;
use std::time::Duration;

use bytes::{Buf, Bytes};
use futures_util::{SinkExt, StreamExt};
use runloop_proto::{ErrorKind, ErrorValue, Writer};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::frame::FrameHeader;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::ProxyConfig;

/// A path's WebSocket.
pub(super) type Ws = WebSocketStream<TcpStream>;

/// Reads until the first binary message, the ask. Text messages carry
/// nothing (protocol §1). When the path ends, or the proxy shuts down, before an
/// ask, how to end it instead.
pub(super) async fn ask(ws: &mut Ws, shutdown: &CancellationToken) -> Result<Bytes, End> {
    loop {
        let message = tokio::select! {
            () = shutdown.cancelled() => return Err(End::Abandon),
            message = ws.next() => message,
        };
        match message {
            Some(Ok(Message::Binary(ask))) => return Ok(ask),
            Some(Ok(Message::Close(_))) => return Err(End::Closed),
            None => return Err(End::Abandon),
            Some(Ok(other)) => debug!(kind = message_kind(&other), "ignored before the ask"),
            Some(Err(error)) => {
                debug!(%error, "path broke before the ask");
                return Err(End::Abandon);
            }
        }
    }
}

/// Resolves when the server leaves the path, with how to end it: its close
/// is answered, a path that broke is dropped. Whatever else it sends after
/// the ask carries nothing and is dropped.
pub(super) async fn left(ws: &mut Ws) -> End {
    loop {
        match ws.next().await {
            Some(Ok(Message::Close(_))) => return End::Closed,
            None => return End::Abandon,
            Some(Err(error)) => {
                debug!(%error, "path broke");
                return End::Abandon;
            }
            Some(Ok(other)) => debug!(kind = message_kind(&other), "ignored after the ask"),
        }
    }
}

/// Sends one binary message, `head` then `body`, as a single frame written
/// straight from their bytes. Through the sink, the message would be
/// copied into tungstenite's write buffer, which keeps the capacity of the
/// largest message for as long as the path is open: for a loop of 15 MiB
/// chunks, a copy per chunk and 15 MiB held for good. What tungstenite has
/// queued itself (the answer to a ping) goes first, so frames never mix.
pub(super) async fn send_binary(ws: &mut Ws, head: &[u8], body: Bytes) -> io::Result<()> {
    ws.flush().await.map_err(io::Error::other)?;
    let length = (head.len() + body.len()) as u64;
    let mut frame = Vec::with_capacity(14 + head.len());
    let header = FrameHeader {
        opcode: OpCode::Data(Data::Binary),
        ..FrameHeader::default()
    };
    header
        .format(length, &mut frame)
        .map_err(io::Error::other)?;
    frame.extend_from_slice(head);
    let mut message = Bytes::from(frame).chain(body);
    let socket = ws.get_mut();
    socket.write_all_buf(&mut message).await?;
    socket.flush().await
}

/// What a path's task does once its exchange is over.
pub(super) enum End {
    /// Sends this last message, if any, and closes cleanly.
    Answer(Option<Message>),
    /// The server closed the path: answer its close, then end the socket.
    Closed,
    /// The path broke, or cannot be written any more: just drop it.
    Abandon,
}

/// The words of the error a loop or a registration cut by shutdown gets.
pub(super) const SHUTTING_DOWN: &str = "the proxy is shutting down";

/// An error answer: `[1]` then the error JSON.
pub(super) fn error_message(json: &[u8]) -> Message {
    let mut payload = Vec::new();
    ErrorValue::write_tagged_json(json, &mut Writer::new(&mut payload));
    Message::Binary(Bytes::from(payload))
}

/// The proxy's own error answer, `{"kind":"proxy","error":…}`.
pub(super) fn proxy_error(what: impl std::fmt::Display) -> Message {
    let mut payload = Vec::new();
    ErrorValue::kind(ErrorKind::Proxy, what).write_tagged(&mut Writer::new(&mut payload));
    Message::Binary(Bytes::from(payload))
}

/// Ends the path as `end` says.
pub(super) async fn end(ws: Ws, end: End, config: &ProxyConfig) {
    match end {
        End::Answer(last) => finish(ws, last, config.close_timeout).await,
        End::Closed => answer_close(ws, config.close_timeout).await,
        End::Abandon => debug!("path abandoned"),
    }
}

/// Sends the answer's last message, if any, then ends the path with a clean
/// close: the close frame, then the server's, then the socket. Shutdown does
/// not cut this short (the last message is what tells the server how the
/// exchange ended); `timeout` bounds it against a server that stops reading.
async fn finish(mut ws: Ws, last: Option<Message>, timeout: Duration) {
    let closing = async {
        if let Some(last) = last {
            ws.send(last).await?;
        }
        ws.close(None).await?;
        // Wait for the server's close frame so the socket ends after it (an
        // early drop could reset the connection under the server's last
        // reads).
        while let Some(message) = ws.next().await {
            message?;
        }
        Ok::<(), tungstenite::Error>(())
    };
    closed_within(timeout, closing).await;
}

/// The server closed the path: sends the answer tungstenite queued for its
/// close frame, then ends the socket (as the WebSocket server, the proxy
/// ends it first).
async fn answer_close(mut ws: Ws, timeout: Duration) {
    // The sink's close flushes the queued answer; the stream's own `close`
    // would send a second close frame, which is refused.
    closed_within(timeout, SinkExt::close(&mut ws)).await;
}

/// Runs the end of a close handshake for at most `timeout`, and says in
/// the log only what went wrong: a clean end is silent.
async fn closed_within(
    timeout: Duration,
    closing: impl Future<Output = Result<(), tungstenite::Error>>,
) {
    match tokio::time::timeout(timeout, closing).await {
        Ok(Ok(()) | Err(tungstenite::Error::ConnectionClosed)) => {}
        Ok(Err(error)) => debug!(%error, "path broke during the close"),
        Err(_) => debug!(?timeout, "the server did not finish the close in time"),
    }
}

fn message_kind(message: &Message) -> &'static str {
    match message {
        Message::Text(_) => "text",
        Message::Binary(_) => "binary",
        Message::Ping(_) => "ping",
        Message::Pong(_) => "pong",
        Message::Close(_) => "close",
        Message::Frame(_) => "frame",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_messages_are_tagged() {
        assert_eq!(
            proxy_error("no"),
            Message::Binary(Bytes::from_static(
                b"\x01{\"kind\":\"proxy\",\"error\":\"no\"}"
            ))
        );
    }
}
