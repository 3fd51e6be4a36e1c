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
use runloop_proto::run_loop::{FrameHead, PathEnd};
use runloop_proto::{ErrorKind, ErrorValue, Writer};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::ProxyConfig;
use runloop_wire::ws::{Head, MAX_HEAD};

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

/// Sends one frame of a binary message, `head.tag` then `body`, written
/// straight from their bytes: a frame that opens a message is Binary, the
/// next ones of a fragmented message are Continuation frames (RFC 6455,
/// section 5.4), and `head.fin` says whether the message ends with this
/// frame. Through the sink, the
/// message would be copied into tungstenite's write buffer, which keeps the
/// capacity of the largest message for as long as the path is open: for a
/// loop of 15 MiB chunks, a copy per chunk and 15 MiB held for good. What
/// tungstenite has queued itself (the answer to a ping) goes first, so
/// frames never mix; between two fragments of a message that is allowed
/// (control frames may come between fragments).
pub(super) async fn send_frame(ws: &mut Ws, head: FrameHead, body: Bytes) -> io::Result<()> {
    ws.flush().await.map_err(io::Error::other)?;
    let length = (head.tag.len() + body.len()) as u64;
    let mut frame = [0; MAX_HEAD + 1];
    let mut header = [0; MAX_HEAD];
    let len = Head::data(head.opens, head.fin, length).write(&mut header);
    frame[..len].copy_from_slice(&header[..len]);
    frame[len..len + head.tag.len()].copy_from_slice(head.tag);
    let mut message = (&frame[..len + head.tag.len()]).chain(body);
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
    /// The path broke, or cannot be written any more, or it is in the
    /// middle of a fragmented message: just drop it, with no close frame
    /// (the server reads any close as a clean end).
    Abandon,
}

impl From<PathEnd> for End {
    /// The end the proxy's send rule chose.
    fn from(end: PathEnd) -> End {
        match end {
            PathEnd::Abandon => End::Abandon,
            PathEnd::Close { last } => End::Answer(last.map(|last| Message::Binary(last.into()))),
        }
    }
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
    use runloop_proto::run_loop::{PathSend, PieceKind};
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;
    use tokio_tungstenite::tungstenite::protocol::Role;

    use super::*;

    /// A path over loopback: the proxy's end, and the server's raw socket.
    async fn path() -> (Ws, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("binds");
        let addr = listener.local_addr().expect("an address");
        let server = TcpStream::connect(addr).await.expect("connects");
        let (proxy, _) = listener.accept().await.expect("accepts");
        let ws = WebSocketStream::from_raw_socket(proxy, Role::Server, None).await;
        (ws, server)
    }

    /// A chunk in three fragments, their frames as the send rule gives
    /// them, then the path abandoned.
    async fn fragments_then_abandon(mut ws: Ws) {
        let mut send = PathSend::new();
        for (kind, data) in [
            (PieceKind::Begin, &b"ab"[..]),
            (PieceKind::More, b"cd"),
            (PieceKind::End, b""),
        ] {
            let head = send.piece(kind, data.len()).expect("in order");
            send_frame(&mut ws, head, Bytes::from_static(data))
                .await
                .expect("sent");
            send.written();
        }
        assert_eq!(send.close(), PathEnd::Close { last: None });
        end(ws, End::Abandon, &ProxyConfig::default()).await;
    }

    #[tokio::test]
    async fn fragments_are_written_as_such_and_abandon_sends_no_close() {
        let (ws, mut server) = path().await;
        fragments_then_abandon(ws).await;
        let mut bytes = Vec::new();
        server.read_to_end(&mut bytes).await.expect("read");
        // Binary without FIN, Continue without FIN, Continue with FIN (RFC
        // 6455 §5.2), unmasked; then the end of the stream, no close frame.
        assert_eq!(
            bytes,
            [0x02, 3, 0, b'a', b'b', 0x00, 2, b'c', b'd', 0x80, 0],
            "no close frame (0x88) after the fragments"
        );
    }

    #[tokio::test]
    async fn a_websocket_reads_the_fragments_as_one_message_then_no_close() {
        let (ws, server) = path().await;
        fragments_then_abandon(ws).await;
        let mut server = WebSocketStream::from_raw_socket(server, Role::Client, None).await;
        let message = server.next().await.expect("a message").expect("whole");
        assert_eq!(message, Message::binary(&b"\0abcd"[..]));
        let after = server.next().await;
        assert!(
            !matches!(after, Some(Ok(Message::Close(_)))),
            "abandoned, not closed: {after:?}"
        );
    }

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
