//! One exchange on a path, as the proxy serves it: the ask, the server
//! leaving, and the end — a last message and a clean close (protocol §10,
//! §12 "Clean ends").
//!
//! Every close is a handshake. The proxy ends an answer with its close
//! frame and waits for the server's; it answers a close the server starts.
//! Either way the log stays silent, so "broke" in it means something broke.

use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use runloop_proto::{ErrorKind, ErrorValue, Writer};
use runloop_wire::lane::Laned;
use tokio::net::TcpStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::ProxyConfig;

/// A path's WebSocket, on its socket's lane: the loop's frames go on the
/// lane ([`runloop_wire::lane`]), the WebSocket's own (pongs, the close,
/// an answer's last message) after them on the same lane.
pub(super) type Ws = WebSocketStream<Laned<TcpStream>>;

/// Reads until the first binary message, the ask. Text messages carry
/// nothing (protocol §1). When the path ends, or the proxy shuts down, before an
/// ask, how to end it instead.
pub(super) async fn ask(ws: &mut Ws, shutdown: &CancellationToken) -> Result<Bytes, End> {
    loop {
        let message = tokio::select! {
            () = shutdown.cancelled() => return Err(End::dropped("the proxy shut down before the ask")),
            message = ws.next() => message,
        };
        match message {
            Some(Ok(Message::Binary(ask))) => return Ok(ask),
            Some(Ok(Message::Close(_))) => return Err(End::Closed),
            None => return Err(End::dropped("the path ended before the ask")),
            Some(Ok(other)) => debug!(kind = message_kind(&other), "ignored before the ask"),
            Some(Err(error)) => {
                debug!(%error, "path broke before the ask");
                return Err(End::dropped("the path broke before the ask"));
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
            None => return End::dropped("the path ended"),
            Some(Err(error)) => {
                debug!(%error, "path broke");
                return End::dropped("the path broke");
            }
            Some(Ok(other)) => debug!(kind = message_kind(&other), "ignored after the ask"),
        }
    }
}

/// How an exchange ends, whichever path carries it.
#[derive(Debug)]
pub(super) enum End {
    /// Sends this last message (an `[1]` error payload), if any, and closes
    /// cleanly.
    Answer(Option<Bytes>),
    /// The server closed the path: answer its close, then end the socket.
    Closed,
    /// The path broke, or cannot be written any more, or it is in the
    /// middle of a fragmented message: drop it, with no close frame (the
    /// server reads any close between messages as a clean end) — except
    /// when the fault is `said` to the server: then a close frame that says
    /// it goes first, inside the message, which the server reads as a
    /// broken path and no finish. `why` is what an in-process path tells
    /// the server.
    Abandon { said: Option<String>, why: String },
}

impl End {
    /// The path is dropped, saying nothing: `why` is for the log.
    pub(super) fn dropped(why: &str) -> End {
        End::Abandon {
            said: None,
            why: why.to_owned(),
        }
    }
}

/// The words of the error a loop or a registration cut by shutdown gets.
pub(super) const SHUTTING_DOWN: &str = "the proxy is shutting down";

/// An error answer: `[1]` then the error JSON.
pub(super) fn error_message(json: &[u8]) -> Bytes {
    let mut payload = Vec::new();
    ErrorValue::write_tagged_json(json, &mut Writer::new(&mut payload));
    Bytes::from(payload)
}

/// The proxy's own error answer, `{"kind":"proxy","error":…}`.
pub(super) fn proxy_error(what: impl std::fmt::Display) -> Bytes {
    let mut payload = Vec::new();
    ErrorValue::kind(ErrorKind::Proxy, what).write_tagged(&mut Writer::new(&mut payload));
    Bytes::from(payload)
}

/// The most a close frame's reason may take (RFC 6455, section 5.5: a
/// control frame's payload is at most 125 bytes, two of them the code).
const MAX_REASON: usize = 123;

/// Ends the path as `end` says.
pub(super) async fn end(mut ws: Ws, end: End, config: &ProxyConfig) {
    match end {
        End::Answer(last) => finish(ws, last, config.close_timeout).await,
        End::Closed => answer_close(ws, config.close_timeout).await,
        End::Abandon { said: None, .. } => {
            // What is on the lane is whole messages and the fragments of
            // the one cut short: they go first, then the socket.
            let flushed = tokio::time::timeout(config.close_timeout, SinkExt::flush(&mut ws)).await;
            debug!(?flushed, "path abandoned");
        }
        End::Abandon {
            said: Some(said), ..
        } => say_and_drop(ws, &said, config.close_timeout).await,
    }
}

/// Abandons a path inside a message, with a close frame (code 1009,
/// "message too big") that says why: the server reads the close inside
/// the message as a broken path, and has the words. The handshake is not
/// waited for.
async fn say_and_drop(mut ws: Ws, said: &str, timeout: Duration) {
    let mut end = said.len().min(MAX_REASON);
    while !said.is_char_boundary(end) {
        end -= 1;
    }
    let frame = CloseFrame {
        code: CloseCode::Size,
        reason: said[..end].into(),
    };
    let sent = tokio::time::timeout(timeout, ws.close(Some(frame))).await;
    debug!(?sent, why = said, "path abandoned, saying why");
}

/// Sends the answer's last message, if any, then ends the path with a clean
/// close: the close frame, then the server's, then the socket. Shutdown does
/// not cut this short (the last message is what tells the server how the
/// exchange ended); `timeout` bounds it against a server that stops reading.
async fn finish(mut ws: Ws, last: Option<Bytes>, timeout: Duration) {
    let closing = async {
        if let Some(last) = last {
            ws.send(Message::Binary(last)).await?;
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
    use runloop_proto::run_loop::{PathEnd, PathSend, PieceKind};
    use runloop_wire::lane::Lane;
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;
    use tokio_tungstenite::tungstenite::protocol::Role;

    use super::*;

    /// A path over loopback: the proxy's end and its lane, and the
    /// server's raw socket.
    async fn path() -> (Ws, Lane, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("binds");
        let addr = listener.local_addr().expect("an address");
        let server = TcpStream::connect(addr).await.expect("connects");
        let (proxy, _) = listener.accept().await.expect("accepts");
        let (proxy, lane) = Lane::new(proxy);
        lane.frames();
        let ws = WebSocketStream::from_raw_socket(proxy, Role::Server, None).await;
        (ws, lane, server)
    }

    /// A chunk in three fragments, their frames as the send rule gives
    /// them, then the path abandoned.
    async fn fragments_then_abandon(mut ws: Ws, lane: Lane) {
        let mut send = PathSend::new();
        for (kind, data) in [
            (PieceKind::Begin, &b"\0ab"[..]),
            (PieceKind::More, b"cd"),
            (PieceKind::End, b""),
        ] {
            let head = send.piece(kind, data.len()).expect("in order");
            lane.push(head.opens, head.fin, Bytes::new(), Bytes::from_static(data))
                .expect("open");
            send.written();
            ws.flush().await.expect("sent");
        }
        assert_eq!(send.close(), PathEnd::Close { last: None });
        let abandoned = End::Abandon {
            said: None,
            why: String::new(),
        };
        end(ws, abandoned, &ProxyConfig::default()).await;
    }

    #[tokio::test]
    async fn fragments_are_written_as_such_and_abandon_sends_no_close() {
        let (ws, lane, mut server) = path().await;
        fragments_then_abandon(ws, lane).await;
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
        let (ws, lane, server) = path().await;
        fragments_then_abandon(ws, lane).await;
        let mut server = WebSocketStream::from_raw_socket(server, Role::Client, None).await;
        let message = server.next().await.expect("a message").expect("whole");
        assert_eq!(message, Message::binary(&b"\0abcd"[..]));
        let after = server.next().await;
        assert!(
            !matches!(after, Some(Ok(Message::Close(_)))),
            "abandoned, not closed: {after:?}"
        );
    }

    /// Frames on the lane, not yet written, when the path is abandoned: they
    /// go out first (a chunk before the one cut short is the loop's), then
    /// the socket ends, with no close frame.
    #[tokio::test]
    async fn an_abandoned_path_writes_what_is_on_its_lane_first() {
        let (ws, lane, mut server) = path().await;
        lane.push(true, true, Bytes::new(), Bytes::from_static(b"\0a"))
            .expect("open");
        lane.push(true, false, Bytes::new(), Bytes::from_static(b"\0b"))
            .expect("open");
        end(ws, End::dropped("cut"), &ProxyConfig::default()).await;
        let mut bytes = Vec::new();
        server.read_to_end(&mut bytes).await.expect("read");
        assert_eq!(bytes, [0x82, 2, 0, b'a', 0x02, 2, 0, b'b']);
    }

    /// A fault said to the server inside a message: a close frame with the
    /// words, after the fragment, and no more.
    #[tokio::test]
    async fn a_fault_said_inside_a_message_is_a_close_frame_after_the_fragment() {
        let (mut ws, lane, mut server) = path().await;
        lane.push(true, false, Bytes::new(), Bytes::from_static(b"\0ab"))
            .expect("open");
        ws.flush().await.expect("sent");
        let words = "é".repeat(100);
        let said = End::Abandon {
            said: Some(words.clone()),
            why: String::new(),
        };
        end(ws, said, &ProxyConfig::default()).await;
        let mut bytes = Vec::new();
        server.read_to_end(&mut bytes).await.expect("read");
        assert_eq!(&bytes[..5], [0x02, 3, 0, b'a', b'b']);
        // The close: FIN and opcode 8, 2 + 122 bytes (the words cut at a
        // character's edge within 123), code 1009.
        assert_eq!(&bytes[5..9], [0x88, 124, 0x03, 0xF1]);
        assert_eq!(&bytes[9..], &words.as_bytes()[..122]);
    }

    #[test]
    fn error_messages_are_tagged() {
        assert_eq!(
            proxy_error("no"),
            Bytes::from_static(b"\x01{\"kind\":\"proxy\",\"error\":\"no\"}")
        );
    }
}
