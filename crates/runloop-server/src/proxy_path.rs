//! Dialling a proxy's bare paths (protocol §10): `/agent/register` once per
//! container, `/agent/run` once per loop.
//!
//! On these paths messages carry no frame header: the first binary message
//! is the ask, the answer ends with a clean WebSocket close. Text messages
//! and pings mean nothing here, as on the framed connection.
//!
//! Every path the server is done with ends with a close handshake
//! ([`close`]): our close frame (or our answer to the proxy's), then the
//! proxy's, then the end of the socket, which the proxy, as the WebSocket
//! server, ends first. Dropping the socket instead would leave the proxy
//! to log a healthy exchange as a broken one. A proxy that does not finish
//! the handshake within [`CLOSE_GRACE`] has its socket dropped.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use runloop_proto::ErrorValue;
use runloop_proto::registration::{RegistrationAnswer, RegistrationAsk};
use runloop_proto::{Decode, Encode, ErrorKind};
use serde_json::value::RawValue;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::error::UrlError;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::{WebSocketStream, client_async_with_config};
use tracing::debug;

use super::read_ahead::ReadAhead;
use runloop_wire::limits::Limits;

/// An open path to a proxy.
pub(crate) type Path = WebSocketStream<ReadAhead<TcpStream>>;

/// How long the proxy has to finish a close handshake before its socket is
/// dropped.
pub(crate) const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// The WebSocket's own read buffer on a path. A server holds a path per
/// loop, tens of thousands of them, and each keeps this buffer (zero-filled,
/// so resident) for as long as it is open; the socket is still read in
/// larger pieces, below the WebSocket ([`ReadAhead`]).
pub(crate) const READ_BUFFER: usize = 4 << 10;

/// Opens `path` (`/agent/run`, …) on the proxy at `base` (`ws://host:port`),
/// Nagle off.
///
/// The dial and the handshake are a large future (several KiB), boxed so
/// that it is held only while it runs: the relay that awaits it lives as
/// long as its loop, and a server holds one per loop.
pub(crate) async fn open(base: &str, path: &str, limits: &Limits) -> Result<Path, WsError> {
    Box::pin(dial(format!("{base}{path}"), limits)).await
}

async fn dial(url: String, limits: &Limits) -> Result<Path, WsError> {
    let request = url.into_client_request()?;
    let uri = request.uri();
    if uri.scheme_str() != Some("ws") {
        return Err(WsError::Url(UrlError::UnsupportedUrlScheme));
    }
    let host = uri.host().ok_or(WsError::Url(UrlError::NoHostName))?;
    // An IPv6 address comes in brackets.
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let port = uri.port_u16().unwrap_or(80);
    let tcp = TcpStream::connect((host.as_str(), port)).await?;
    tcp.set_nodelay(true)?;
    let config = limits.websocket().read_buffer_size(READ_BUFFER);
    let (ws, _response) =
        client_async_with_config(request, ReadAhead::new(tcp), Some(config)).await?;
    Ok(ws)
}

/// Registers the agent: sends `{"agent": <the caller's JSON, verbatim>}` and
/// reads the proxy's one answer, `[0]` or `[1][error]`.
pub(crate) async fn register(
    base: &str,
    agent: &RawValue,
    limits: &Limits,
) -> Result<(), ErrorValue> {
    let fail = |what: String| ErrorValue::kind(ErrorKind::Proxy, what);
    let mut path = open(base, "/agent/register", limits)
        .await
        .map_err(|e| fail(format!("cannot open the proxy's /agent/register: {e}")))?;
    let Ok(ask) = RegistrationAsk::new(agent).to_vec();
    path.send(Message::Binary(ask.into()))
        .await
        .map_err(|e| fail(format!("cannot send to the proxy's /agent/register: {e}")))?;
    let answer = loop {
        match path.next().await {
            Some(Ok(Message::Binary(answer))) => break answer,
            Some(Ok(
                Message::Text(_) | Message::Ping(_) | Message::Pong(_) | Message::Frame(_),
            )) => {}
            Some(Ok(Message::Close(_))) | None => {
                return Err(fail(
                    "the proxy closed /agent/register without an answer".into(),
                ));
            }
            Some(Err(e)) => return Err(fail(format!("/agent/register broke: {e}"))),
        }
    };
    // The answer is all the proxy has to say.
    close(path).await;
    match RegistrationAnswer::decode(&answer) {
        Ok(RegistrationAnswer::Registered) => Ok(()),
        Ok(RegistrationAnswer::Refused(error)) => Err(error),
        Err(_) => Err(fail(
            "the proxy's /agent/register answer is not [0] or [1][error]".into(),
        )),
    }
}

/// Ends a path the server is done with: the close handshake, then the end
/// of the socket, within [`CLOSE_GRACE`]. Whatever the proxy sends before
/// its close frame is dropped unread.
pub(crate) async fn close(mut path: Path) {
    let closing = async {
        // Our close frame, or, when the proxy closed first, our answer to
        // it: tungstenite queued the answer, and the sink's close flushes it
        // (the stream's own `close` sends a close frame, which is refused
        // once the proxy's has come).
        SinkExt::close(&mut path).await?;
        while let Some(message) = path.next().await {
            message?;
        }
        Ok::<(), WsError>(())
    };
    // Boxed for the same reason as `open`'s handshake.
    match tokio::time::timeout(CLOSE_GRACE, Box::pin(closing)).await {
        Ok(Ok(())) => {}
        Ok(Err(why)) => debug!(%why, "a proxy path broke during the close"),
        Err(_) => {
            debug!(grace = ?CLOSE_GRACE, "the proxy did not finish the close in time; dropping the socket")
        }
    }
}
