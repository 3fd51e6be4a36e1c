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

use std::fmt;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use runloop_proto::ErrorValue;
use runloop_proto::registration::{RegistrationAnswer, RegistrationAsk};
use runloop_proto::{Decode, Encode, ErrorKind};
use serde_json::value::RawValue;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::error::{ProtocolError, UrlError};
use tokio_tungstenite::tungstenite::http::StatusCode;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::{WebSocketStream, client_async_with_config};
use tracing::debug;

use super::path_frames::PathFrames;
use super::read_ahead::{self, ReadAhead};
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

/// How a path's binary messages are read.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Reading {
    /// Taken from the socket's buffer by the relay itself
    /// ([`ReadAhead::message`]), not through the WebSocket.
    Relayed,
    /// Through the WebSocket, as its other messages.
    Through,
}

/// How many times a path is dialled while the proxy says, before the path
/// opened, that it cannot take it now.
const OPEN_ATTEMPTS: u32 = 3;

/// The pause before the second dial; the third waits twice as long.
const OPEN_PAUSE: Duration = Duration::from_millis(50);

/// Opens `path` (`/agent/run`, …) on the proxy at `base` (`ws://host:port`),
/// Nagle off.
///
/// A proxy that refused the path before it opened (`503`, or its side
/// closed or reset before it answered) is dialled again, up to
/// [`OPEN_ATTEMPTS`] times: nothing of the path reached the agent program
/// yet, so a second dial is safe, and a busy moment (the proxy's handshake
/// timeout ran out while this process was too busy to send its request)
/// does not fail a start that can be served.
///
/// The dial and the handshake are a large future (several KiB), boxed so
/// that it is held only while it runs: the relay that awaits it lives as
/// long as its loop, and a server holds one per loop.
pub(crate) async fn open(
    base: &str,
    path: &str,
    limits: &Limits,
    reading: Reading,
) -> Result<Path, Unopened> {
    let url = format!("{base}{path}");
    let mut attempt = 1;
    loop {
        match Box::pin(dial(url.clone(), limits, reading)).await {
            Err(error) if attempt < OPEN_ATTEMPTS && refused_before_open(&error) => {
                debug!(%error, attempt, %url, "the proxy did not open the path; dialling again");
                tokio::time::sleep(OPEN_PAUSE * attempt).await;
                attempt += 1;
            }
            dialled => return dialled.map_err(Unopened),
        }
    }
}

/// Whether the proxy turned the dial away before the path opened: a `503`,
/// or its side of the connection ended before it answered.
fn refused_before_open(error: &WsError) -> bool {
    match error {
        WsError::Http(response) => response.status() == StatusCode::SERVICE_UNAVAILABLE,
        WsError::Protocol(ProtocolError::HandshakeIncomplete) => true,
        WsError::Io(error) => error.kind() == std::io::ErrorKind::ConnectionReset,
        _ => false,
    }
}

/// Why a proxy path did not open: the WebSocket's error, with the body of
/// the proxy's answer when it refused the upgrade (which says why).
#[derive(Debug)]
pub(crate) struct Unopened(WsError);

impl fmt::Display for Unopened {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let WsError::Http(response) = &self.0 else {
            return self.0.fmt(f);
        };
        write!(f, "the proxy answered HTTP {}", response.status())?;
        match runloop_wire::transport::answer_body(response) {
            Some(body) => write!(f, ": {body}"),
            None => Ok(()),
        }
    }
}

/// The words are the WebSocket error's own, or the proxy's answer: so the
/// source is the WebSocket error's source (as a transparent error's is),
/// and an answer, whose status and body the words already say, has none.
impl std::error::Error for Unopened {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.0 {
            WsError::Http(_) => None,
            other => other.source(),
        }
    }
}

async fn dial(url: String, limits: &Limits, reading: Reading) -> Result<Path, WsError> {
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
    let frames = match reading {
        Reading::Relayed => Some(PathFrames::new(limits.max_message_size)),
        Reading::Through => None,
    };
    let socket = ReadAhead::new(tcp, &read_ahead::PROCESS, frames);
    let (ws, _response) = client_async_with_config(request, socket, Some(config)).await?;
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
    let mut path = open(base, "/agent/register", limits, Reading::Through)
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
    path.get_mut().drop_messages();
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

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// Reads a dial's request and answers it `503` with a reason.
    async fn turn_away(listener: &TcpListener) {
        let (mut dial, _) = listener.accept().await.expect("a dial");
        let mut request = [0u8; 4096];
        let _ = dial.read(&mut request).await;
        dial.write_all(
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 5\r\nConnection: close\r\n\r\nbusy\n",
        )
        .await
        .expect("answers");
    }

    fn agent() -> Box<RawValue> {
        RawValue::from_string("{}".to_owned()).expect("JSON")
    }

    #[tokio::test]
    async fn a_proxy_that_turned_a_dial_away_with_503_is_dialled_again() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("binds");
        let base = format!("ws://{}", listener.local_addr().expect("address"));
        let proxy = tokio::spawn(async move {
            turn_away(&listener).await;
            let (dial, _) = listener.accept().await.expect("a second dial");
            let mut ws = tokio_tungstenite::accept_async(dial)
                .await
                .expect("upgrades");
            let ask = ws.next().await.expect("an ask").expect("read");
            assert!(matches!(ask, Message::Binary(_)), "{ask:?}");
            ws.send(Message::Binary(vec![0].into()))
                .await
                .expect("answers");
            while let Some(Ok(_)) = ws.next().await {}
        });
        register(&base, &agent(), &Limits::default())
            .await
            .expect("registered on the second dial");
        proxy.await.expect("the proxy's task");
    }

    #[tokio::test]
    async fn a_proxy_that_keeps_turning_dials_away_is_reported_with_its_reason() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("binds");
        let base = format!("ws://{}", listener.local_addr().expect("address"));
        let proxy = tokio::spawn(async move {
            for _ in 0..OPEN_ATTEMPTS {
                turn_away(&listener).await;
            }
            listener
        });
        let error = register(&base, &agent(), &Limits::default())
            .await
            .expect_err("refused every time");
        assert_eq!(
            error,
            ErrorValue::kind(
                ErrorKind::Proxy,
                "cannot open the proxy's /agent/register: the proxy answered HTTP 503 Service \
                 Unavailable: busy"
            )
        );
        let listener = proxy.await.expect("the proxy's task");
        // No dial after the last.
        let more = tokio::time::timeout(Duration::from_millis(200), listener.accept()).await;
        assert!(more.is_err(), "dialled more than {OPEN_ATTEMPTS} times");
    }

    #[test]
    fn an_unopened_path_says_its_cause_once() {
        use std::error::Error;

        let mut answer = tokio_tungstenite::tungstenite::http::Response::new(None);
        *answer.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        let answered = Unopened(WsError::Http(Box::new(answer)));
        assert_eq!(
            answered.to_string(),
            "the proxy answered HTTP 503 Service Unavailable"
        );
        assert!(answered.source().is_none(), "the words say the answer");
        runloop_testkit::errors::assert_cause_said_once(&answered);
        let closed = Unopened(WsError::ConnectionClosed);
        assert_eq!(closed.to_string(), WsError::ConnectionClosed.to_string());
        assert!(
            closed.source().is_none(),
            "the WebSocket error's own source"
        );
    }
}
