//! The proxy: the WebSocket server a provider places beside an agent's
//! entrypoint, which turns the server's `/agent/*` paths into HTTP calls on
//! the agent program (protocol §10).
//!
//! ```text
//! server ──ws /agent/register, {"agent":…}──▶ proxy ──POST /register──▶ agent program
//!        ◀──────── [0] or [1][error], close ─────
//! server ──ws /agent/run, {"prompt":…}──────▶ proxy ──POST /run───────▶ agent program
//!        ◀── [0][data]… ([1][error])?, close ──── ◀── SSE data: …
//! ```
//!
//! Messages on these paths are bare: no 9-byte header. The first binary
//! message is the ask; the answer ends with a clean close, so an abrupt end
//! always reads as a failed exchange.
//!
//! Why it is built this way:
//!
//! - **Bytes pass through unread.** The ask goes to the agent program as it
//!   came, and each SSE `data` goes to the server as `[0]` and those bytes:
//!   the proxy checks the ask's shape (a bad ask gets a clear error instead
//!   of an agent program's puzzled 400) and never parses a chunk.
//! - **One loop at a time, one registration per life**, as two small claims
//!   on shared state that release themselves when dropped, so no exit path
//!   of a task can leave the proxy wedged. A registration that failed
//!   releases its claim, so it may be tried again; one that succeeded is
//!   final.
//! - **Cancellation follows the server.** While a loop runs the proxy keeps
//!   reading the path; when the server closes it, the HTTP request to the
//!   agent program is dropped, which closes its connection: the agent
//!   program sees its client leave.
//! - **Every close is a handshake.** The proxy ends an answer with its close
//!   frame and waits for the server's; it answers a close the server starts.
//!   Either way the log stays silent, so "broke" in it means something
//!   broke.
//! - **Backpressure, not buffers.** An SSE event is read only after the
//!   previous chunk was written to the path, so a slow server slows the
//!   agent program instead of filling the proxy's memory; the ask, each
//!   event and each error body have a bound ([`Config`]).
//! - **Shutdown is honest.** A loop cut by the proxy's shutdown ends with
//!   an error and a clean close, never with a close alone that would read as
//!   "finished".

mod register;
mod run;
mod sse;
mod upstream;

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use runloop_proto::Error;
use runloop_proto::run_loop::ERROR;
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::StatusCode;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

use self::upstream::Upstream;
use crate::metrics::ProxyMetrics;

/// The proxy's port (protocol §10).
pub const DEFAULT_PORT: u16 = 14979;

/// Where a standalone proxy listens: every interface, port 14979.
pub const DEFAULT_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::UNSPECIFIED), DEFAULT_PORT);

/// The proxy's bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// The largest ask (and any message) the server may send on a path.
    pub max_ask: usize,
    /// The largest SSE event the agent program may send, counted in stream
    /// bytes from the end of the previous event.
    pub max_event: usize,
    /// The most of a non-2xx body that is kept for the error.
    pub max_error_body: usize,
    /// How long a connection may take to finish its WebSocket handshake.
    pub handshake_timeout: Duration,
    /// How long the end of an answer (its last message and the close
    /// handshake) may take, even while the proxy shuts down.
    pub close_timeout: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_ask: 16 << 20,
            max_event: 16 << 20,
            max_error_body: 64 << 10,
            handshake_timeout: Duration::from_secs(10),
            close_timeout: Duration::from_secs(10),
        }
    }
}

/// A proxy bound to its listening socket, ready to [`run`](Proxy::run).
#[derive(Debug)]
pub struct Proxy {
    listener: TcpListener,
    agent: SocketAddr,
    config: Config,
    metrics: Arc<ProxyMetrics>,
}

impl Proxy {
    /// Binds `listen`; the agent program is at `agent`.
    pub async fn bind(listen: SocketAddr, agent: SocketAddr) -> io::Result<Proxy> {
        Ok(Proxy::new(TcpListener::bind(listen).await?, agent))
    }

    /// A proxy on a listener that is already bound.
    pub fn new(listener: TcpListener, agent: SocketAddr) -> Proxy {
        Proxy {
            listener,
            agent,
            config: Config::default(),
            metrics: Arc::new(ProxyMetrics::new()),
        }
    }

    /// What the proxy counts, for an admin listener ([`ProxyAdmin`]).
    pub fn metrics(&self) -> Arc<ProxyMetrics> {
        Arc::clone(&self.metrics)
    }

    /// Replaces the default bounds.
    pub fn with_config(mut self, config: Config) -> Proxy {
        self.config = config;
        self
    }

    /// The address the proxy listens on.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The agent program's address.
    pub fn agent(&self) -> SocketAddr {
        self.agent
    }

    /// Serves paths until `shutdown` is cancelled, then ends every path
    /// (a running loop gets an error and a clean close) and returns once all
    /// of them are done. Fails only if the HTTP client cannot be built.
    pub async fn run(self, shutdown: CancellationToken) -> io::Result<()> {
        let Proxy {
            listener,
            agent,
            config,
            metrics,
        } = self;
        let shared = Arc::new(Shared {
            upstream: Upstream::new(agent, config.max_error_body)?,
            config,
            state: State::default(),
            metrics,
        });
        let tracker = TaskTracker::new();
        info!(listen = ?listener.local_addr().ok(), %agent, "proxy up");
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                accepted = listener.accept() => match accepted {
                    Ok((stream, peer)) => {
                        debug!(%peer, "connection");
                        // Each chunk is a small message written on its own:
                        // Nagle would hold it for the server's delayed ACK.
                        let _ = stream.set_nodelay(true);
                        let shared = Arc::clone(&shared);
                        tracker.spawn(connection(stream, shared, shutdown.clone()));
                    }
                    Err(error) => {
                        // Out of descriptors or the like: wait a moment
                        // rather than spin on the same error.
                        warn!(%error, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
            }
        }
        drop(listener);
        tracker.close();
        tracker.wait().await;
        info!("proxy down");
        Ok(())
    }
}

/// What every path of one proxy shares.
#[derive(Debug)]
struct Shared {
    upstream: Upstream,
    config: Config,
    state: State,
    metrics: Arc<ProxyMetrics>,
}

/// A proxy as its admin listener sees it: its metrics, and ready until
/// `shutdown` fires.
#[derive(Debug)]
pub struct ProxyAdmin {
    /// The proxy's metrics ([`Proxy::metrics`]).
    pub metrics: Arc<ProxyMetrics>,
    /// The token that shuts the proxy down.
    pub shutdown: CancellationToken,
}

impl crate::admin::Watched for ProxyAdmin {
    fn metrics(&self) -> String {
        self.metrics.encode()
    }

    fn ready(&self) -> bool {
        !self.shutdown.is_cancelled()
    }
}

/// Counts a path as open while it lives.
struct PathOpen<'a>(&'a ProxyMetrics);

impl<'a> PathOpen<'a> {
    fn new(metrics: &'a ProxyMetrics) -> Self {
        metrics.paths.fetch_add(1, Ordering::Relaxed);
        PathOpen(metrics)
    }
}

impl Drop for PathOpen<'_> {
    fn drop(&mut self) {
        self.0.paths.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Registration and the one running loop.
#[derive(Debug, Default)]
struct State {
    registration: Mutex<Registration>,
    running: AtomicBool,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Registration {
    #[default]
    None,
    Pending,
    Done,
}

/// A claim on the registration; dropped unconfirmed, it is released.
struct RegistrationClaim<'a> {
    state: &'a State,
    confirmed: bool,
}

impl RegistrationClaim<'_> {
    fn confirm(mut self) {
        self.confirmed = true;
        *self.state.registration() = Registration::Done;
    }
}

impl Drop for RegistrationClaim<'_> {
    fn drop(&mut self) {
        if !self.confirmed {
            *self.state.registration() = Registration::None;
        }
    }
}

/// The claim on the one loop; dropping it frees the proxy for the next.
struct LoopClaim<'a>(&'a State);

impl Drop for LoopClaim<'_> {
    fn drop(&mut self) {
        self.0.running.store(false, Ordering::Release);
    }
}

impl State {
    fn registration(&self) -> std::sync::MutexGuard<'_, Registration> {
        // The guarded value is a plain enum, valid whatever a panicking
        // holder was doing.
        self.registration
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn claim_registration(&self) -> Result<RegistrationClaim<'_>, &'static str> {
        let mut registration = self.registration();
        match *registration {
            Registration::None => {
                *registration = Registration::Pending;
                Ok(RegistrationClaim {
                    state: self,
                    confirmed: false,
                })
            }
            Registration::Pending => Err("a registration is already under way"),
            Registration::Done => Err("an agent is already registered with this proxy"),
        }
    }

    fn claim_loop(&self) -> Result<LoopClaim<'_>, &'static str> {
        if *self.registration() != Registration::Done {
            return Err("no agent is registered with this proxy");
        }
        self.running
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .map(|_| LoopClaim(self))
            .map_err(|_| "a loop is already running")
    }
}

/// The two paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    Register,
    Run,
}

type Ws = WebSocketStream<TcpStream>;

/// One connection: the handshake picks the path, the path's task serves it.
async fn connection(stream: TcpStream, shared: Arc<Shared>, shutdown: CancellationToken) {
    let mut path = None;
    // The error type is tungstenite's handshake response, not ours to shrink.
    #[allow(clippy::result_large_err)]
    let pick = |request: &Request, response: Response| match request.uri().path() {
        "/agent/register" => {
            path = Some(Path::Register);
            Ok(response)
        }
        "/agent/run" => {
            path = Some(Path::Run);
            Ok(response)
        }
        other => {
            let mut refusal = ErrorResponse::new(Some(format!("no such path: {other}\n")));
            *refusal.status_mut() = StatusCode::NOT_FOUND;
            Err(refusal)
        }
    };
    let config = WebSocketConfig::default()
        .max_message_size(Some(shared.config.max_ask))
        .max_frame_size(Some(shared.config.max_ask));
    let handshake = tokio_tungstenite::accept_hdr_async_with_config(stream, pick, Some(config));
    let ws = tokio::select! {
        () = shutdown.cancelled() => return,
        done = tokio::time::timeout(shared.config.handshake_timeout, handshake) => match done {
            Ok(Ok(ws)) => ws,
            Ok(Err(error)) => {
                debug!(%error, "handshake refused or failed");
                return;
            }
            Err(_) => {
                debug!("handshake timed out");
                return;
            }
        },
    };
    let _open = PathOpen::new(&shared.metrics);
    match path {
        Some(Path::Register) => register::serve(ws, &shared, &shutdown).await,
        Some(Path::Run) => run::serve(ws, &shared, &shutdown).await,
        None => debug!("handshake accepted without a path"),
    }
}

/// Reads until the first binary message, the ask. Text messages carry
/// nothing (protocol §1). When the path ends, or the proxy shuts down, before an
/// ask, how to end it instead.
async fn ask(ws: &mut Ws, shutdown: &CancellationToken) -> Result<Bytes, End> {
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
async fn left(ws: &mut Ws) -> End {
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

/// What a path's task does once its exchange is over.
enum End {
    /// Sends this last message, if any, and closes cleanly.
    Answer(Option<Message>),
    /// The server closed the path: answer its close, then end the socket.
    Closed,
    /// The path broke, or cannot be written any more: just drop it.
    Abandon,
}

/// The words of the error a loop or a registration cut by shutdown gets.
const SHUTTING_DOWN: &str = "the proxy is shutting down";

/// An error answer: `[1]` then the error JSON.
fn error_message(json: &[u8]) -> Message {
    let mut payload = Vec::with_capacity(1 + json.len());
    payload.push(ERROR);
    payload.extend_from_slice(json);
    Message::Binary(Bytes::from(payload))
}

/// The proxy's own error answer, `{"kind":"proxy","error":…}`.
fn proxy_error(what: impl std::fmt::Display) -> Message {
    let mut json = Vec::new();
    Error::kind("proxy", what).write_json(&mut runloop_proto::Writer::new(&mut json));
    error_message(&json)
}

/// Ends the path as `end` says.
async fn end(ws: Ws, end: End, config: &Config) {
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

/// An error and its sources, joined with `: `, for an error value that has
/// to say what happened in one string.
fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(inner) = source {
        let words = inner.to_string();
        if !text.contains(&words) {
            text.push_str(": ");
            text.push_str(&words);
        }
        source = inner.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registration_is_once_and_a_failed_one_is_released() {
        let state = State::default();
        assert_eq!(
            state.claim_loop().err(),
            Some("no agent is registered with this proxy")
        );
        let claim = state.claim_registration().expect("first");
        assert_eq!(
            state.claim_registration().err(),
            Some("a registration is already under way")
        );
        drop(claim);
        let claim = state.claim_registration().expect("released by the failure");
        claim.confirm();
        assert_eq!(
            state.claim_registration().err(),
            Some("an agent is already registered with this proxy")
        );
    }

    #[test]
    fn one_loop_at_a_time() {
        let state = State::default();
        state.claim_registration().expect("first").confirm();
        let running = state.claim_loop().expect("first loop");
        assert_eq!(state.claim_loop().err(), Some("a loop is already running"));
        drop(running);
        assert!(state.claim_loop().is_ok());
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
