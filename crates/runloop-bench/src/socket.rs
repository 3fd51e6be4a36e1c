//! The WebSocket settings every socket of the bench shares: the server's.
//!
//! The server reads with a 16 KiB buffer (tungstenite's default of 128 KiB
//! is zero-filled before every read, which costs more than the read for a
//! stream of small chunks), takes messages up to 16 MiB, and turns Nagle's
//! algorithm off. The forwarder, the load clients and the synthetic proxy
//! use the same settings, so the comparison measures what sits in the
//! middle and not a difference in configuration, and the bench's own
//! sockets cost as little as the server's.

use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::handshake::server::{Request, Response};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// How much is read from the socket at once (the server's figure).
const READ_BUFFER: usize = 16 << 10;

/// The largest message and frame (the server's default).
const MAX_MESSAGE: usize = 16 << 20;

/// A dialled WebSocket.
pub(crate) type Dialled = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// The WebSocket configuration of every bench socket.
pub(crate) fn config() -> WebSocketConfig {
    WebSocketConfig::default()
        .read_buffer_size(READ_BUFFER)
        .max_message_size(Some(MAX_MESSAGE))
        .max_frame_size(Some(MAX_MESSAGE))
}

/// Dials `url` (`ws://…`) with Nagle off.
pub(crate) async fn connect(url: &str) -> Result<Dialled, tokio_tungstenite::tungstenite::Error> {
    let (ws, _) = tokio_tungstenite::connect_async_with_config(url, Some(config()), true).await?;
    Ok(ws)
}

/// Accepts a WebSocket on `tcp` (Nagle off) and says which path it asked for.
pub(crate) async fn accept(tcp: TcpStream) -> Option<(WebSocketStream<TcpStream>, String)> {
    let _ = tcp.set_nodelay(true);
    let mut path = String::new();
    // The handshake callback's error type is tungstenite's, large by design.
    #[allow(clippy::result_large_err)]
    let callback = |request: &Request, response: Response| {
        path = request.uri().path().to_owned();
        Ok(response)
    };
    let ws = tokio_tungstenite::accept_hdr_async_with_config(tcp, callback, Some(config()))
        .await
        .ok()?;
    Some((ws, path))
}
