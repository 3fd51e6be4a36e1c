//! A proxy's bare paths (protocol §10): `/agent/register` once per
//! container, `/agent/run` once per loop; dialled, or called in process.
//!
//! Where the container's proxy is a task of this process (every runtime but
//! `attach`), the paths are its calls ([`Place::Local`], protocol §12
//! "In-process paths"): a run path is then read as a socket path is
//! ([`RunPath`]), message by message, to a clean end or a broken one, and
//! the relay does not know which it has.
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

use std::task::Poll;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use runloop_proto::ErrorValue;
use runloop_proto::registration::{RegistrationAnswer, RegistrationAsk};
use runloop_proto::{Decode, Encode, ErrorKind};
use serde_json::value::RawValue;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::error::{ProtocolError, UrlError};
use tokio_tungstenite::tungstenite::http::StatusCode;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::{WebSocketStream, client_async_with_config};
use tracing::debug;

use super::read_ahead::{self, ReadAhead};
use runloop_runtime::{Container, LocalProxy, LocalRun, PathEvent};
use runloop_wire::limits::Limits;
use runloop_wire::ws::MessageReader;

/// An open path to a proxy.
pub(crate) type Path = WebSocketStream<ReadAhead<TcpStream>>;

/// Where a container's proxy is reached.
#[derive(Debug, Clone)]
pub(crate) enum Place {
    /// At this `ws://` base URL.
    Url(String),
    /// In this process.
    Local(LocalProxy),
}

impl Place {
    /// Where `container`'s proxy is: in process when it can be.
    pub(crate) fn of(container: &dyn Container) -> Place {
        match container.local_proxy() {
            Some(local) => Place::Local(local),
            None => Place::Url(container.proxy_url().to_owned()),
        }
    }
}

/// An open `/agent/run` path: a socket, or a call in process. The socket
/// is boxed so that a relay in process, which a server holds one of per
/// loop, is no larger than it needs to be.
pub(crate) enum RunPath {
    Socket(Box<Path>),
    Local(LocalRun),
}

impl RunPath {
    /// Whether everything the path had was read, and its socket was empty
    /// at its last read: a look for more now would most likely wait.
    pub(crate) fn drained(&self) -> bool {
        match self {
            RunPath::Socket(path) => path.get_ref().drained(),
            RunPath::Local(run) => run.drained(),
        }
    }

    /// The path's next message, or its end.
    pub(crate) async fn next(&mut self) -> Next {
        match self {
            RunPath::Socket(path) => next_message(path).await,
            RunPath::Local(run) => match std::future::poll_fn(|cx| run.poll_next(cx)).await {
                PathEvent::Message(message) => Next::Message(message),
                PathEvent::Closed => Next::Closed,
                PathEvent::Broke(why) => Next::Broke(why),
            },
        }
    }

    /// Ends a path the server is done with: a socket's close handshake
    /// ([`close`]); a call in process is dropped, which cancels the loop
    /// if it still runs.
    pub(crate) async fn close(self) {
        match self {
            RunPath::Socket(path) => close(*path).await,
            RunPath::Local(run) => drop(run),
        }
    }
}

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
        Reading::Relayed => Some(MessageReader::new(limits.max_message_size)),
        Reading::Through => None,
    };
    let socket = ReadAhead::new(tcp, &read_ahead::PROCESS, frames);
    let (ws, _response) = client_async_with_config(request, socket, Some(config)).await?;
    Ok(ws)
}

/// Registers the agent: sends `{"agent": <the caller's JSON, verbatim>}` and
/// reads the proxy's one answer, `[0]` or `[1][error]`.
pub(crate) async fn register(
    place: &Place,
    agent: &RawValue,
    limits: &Limits,
) -> Result<(), ErrorValue> {
    let fail = |what: String| ErrorValue::kind(ErrorKind::Proxy, what);
    let base = match place {
        Place::Url(base) => base,
        Place::Local(local) => {
            let Ok(ask) = RegistrationAsk::new(agent).to_vec();
            let answer = local.register(ask.into()).await;
            return registered(&answer);
        }
    };
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
    registered(&answer)
}

/// What the proxy's answer to a registration says.
fn registered(answer: &[u8]) -> Result<(), ErrorValue> {
    let fail = |what: String| ErrorValue::kind(ErrorKind::Proxy, what);
    match RegistrationAnswer::decode(answer) {
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

/// What came next on the proxy's path.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// A binary message: a run-loop payload, unread.
    Message(Bytes),
    /// The proxy's clean close.
    Closed,
    /// The path ended without a close: how.
    Broke(String),
}

/// Reads the path up to its next binary message, or its end. The
/// messages are taken from the socket's buffer, without the WebSocket
/// ([`ReadAhead::poll_messages`]); the WebSocket reads the rest. Text
/// messages and pings carry nothing (protocol §1); a ping's answer is sent
/// at once, since the WebSocket, which sends it, may not be read again
/// for a while.
pub(crate) async fn next_message<S>(path: &mut WebSocketStream<ReadAhead<S>>) -> Next
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    std::future::poll_fn(|cx| {
        loop {
            if let Some(message) = path.get_mut().message() {
                return Poll::Ready(Next::Message(message));
            }
            match path.get_mut().poll_messages(cx) {
                Poll::Ready(true) => continue,
                Poll::Pending => return Poll::Pending,
                Poll::Ready(false) => {}
            }
            let next = match path.poll_next_unpin(cx) {
                // Pending while a message waits, with no wake-up: taken
                // on the next turn.
                Poll::Pending if path.get_ref().has_message() => continue,
                Poll::Pending => return Poll::Pending,
                Poll::Ready(next) => next,
            };
            return Poll::Ready(match next {
                Some(Ok(Message::Binary(message))) => Next::Message(message),
                // A close between the fragments of a message: the message
                // is lost, so the loop did not finish. A proxy that says
                // why (this project's says when the agent program's event
                // is over its message limit) is quoted.
                Some(Ok(Message::Close(frame))) if path.get_ref().inside_message() => {
                    Next::Broke(match frame.filter(|frame| !frame.reason.is_empty()) {
                        Some(frame) => format!(
                            "the proxy closed the path inside a message: {}",
                            frame.reason
                        ),
                        None => "the proxy closed the path inside a message (after a fragment \
                                 that was not its last)"
                            .to_owned(),
                    })
                }
                Some(Ok(Message::Close(_))) => Next::Closed,
                Some(Ok(Message::Ping(_))) => {
                    // Its answer: written now if the socket takes it, else
                    // with the WebSocket's next read.
                    let _ = path.poll_flush_unpin(cx);
                    continue;
                }
                Some(Ok(Message::Text(_) | Message::Pong(_) | Message::Frame(_))) => continue,
                Some(Err(WsError::Capacity(why))) => Next::Broke(format!(
                    "a message from the proxy is over the message limit: {why}"
                )),
                // A fault of the frames found by the path's own reader
                // (`ReadAhead`), in its words.
                Some(Err(WsError::Io(why))) if why.kind() == std::io::ErrorKind::InvalidData => {
                    Next::Broke(why.to_string())
                }
                Some(Err(why)) => Next::Broke(why.to_string()),
                None => Next::Broke("the connection closed without a close frame".to_owned()),
            });
        }
    })
    .await
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
        register(&Place::Url(base.clone()), &agent(), &Limits::default())
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
        let error = register(&Place::Url(base.clone()), &agent(), &Limits::default())
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
