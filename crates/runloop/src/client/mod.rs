//! The caller's client: one framed connection to a provider server, many
//! runs and loops on it at once.
//!
//! ```text
//! Client::connect ──▶ client.run(request) ──▶ Run (id) ──▶ run.run_loop(prompt) ──▶ RunLoop
//!                                                                                    │ Stream of Event:
//!                                                                                    │ Chunk… Error? End(Outcome)
//! ```
//!
//! One task reads the socket and routes each server frame to the scope or
//! channel it names; one task writes. Every loop's responses go through
//! `runloop_proto`'s [`Reader`](runloop_proto::run_loop::Reader), so a
//! loop's [`Outcome`](runloop_proto::run_loop::Outcome) means exactly what
//! the protocol says: a dropped connection or an ended run is `Broken`,
//! never `Finished`.
//!
//! Each loop has a bounded queue (`max_queued_responses`). When a consumer
//! stops reading its loop, the reading task waits for it, which in turn
//! pauses every other scope on the same connection: the protocol has no
//! per-channel flow control, so bounded memory costs head-of-line blocking.
//! Read loops you open, or open them on separate connections.

mod run;
mod run_loop;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use runloop_proto::agents_run::{RunRequest, RunResponse};
use runloop_proto::authorization::Authorization;
use runloop_proto::channel::ChannelRequest;
use runloop_proto::endpoint::EndpointRequest;
use runloop_proto::frame::{self, ClientFrame, Role, ServerFrame};
use runloop_proto::{Decode, Encode, Error};
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

pub use run::Run;
pub use run_loop::{Event, RunLoop};

use crate::connection::{CLOSE_GRACE, LimitError, Limits, Outbox, Outgoing, Tap, write_frames};
use crate::tls::ClientTls;
use crate::transport::{self, DialError};

/// How a client behaves.
#[derive(Clone, Default)]
pub struct ClientConfig {
    /// Per-connection limits (message size, queued responses per loop).
    pub limits: Limits,
    /// Sees every frame in both directions (for captures).
    pub tap: Option<Tap>,
    /// Whom a `wss://` server's certificate must come from; none: the
    /// platform's roots ([`ClientTls::platform`]).
    pub tls: Option<ClientTls>,
}

impl std::fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientConfig")
            .field("limits", &self.limits)
            .field("tap", &self.tap.is_some())
            .field("tls", &self.tls)
            .finish()
    }
}

/// Why a connection could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The connection could not be opened: the URL, TCP, TLS (a
    /// certificate that does not verify names the host and the reason) or
    /// the WebSocket handshake.
    #[error("{0}")]
    Dial(#[source] DialError),
    /// The authorization frame could not be sent.
    #[error("cannot authorize: {0}")]
    Authorization(#[source] WsError),
    /// A limit of the configuration is below its minimum.
    #[error("the client's configuration cannot work: {0}")]
    Limit(#[source] LimitError),
}

/// Why a run did not start.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RunError {
    /// The server refused the run with this error (protocol §5).
    #[error("the run was refused: {0}")]
    Refused(Error),
    /// The server answered with a bare finish: received, not served.
    #[error("the server did not serve the run")]
    NotServed,
    /// The server's answer broke the rules.
    #[error("the server's answer did not decode: {0}")]
    Broken(String),
    /// The connection ended before an answer. When nothing at all came from
    /// the server first, the likeliest cause is a refused credential, since
    /// a refusal is a close with no frame (protocol §3).
    #[error("{}", if *.answered_before { "the connection ended before the run started" } else {
        "the server closed the connection without answering (is the credential right?)"
    })]
    ConnectionEnded {
        /// Whether the server had sent any frame on this connection.
        answered_before: bool,
    },
    /// The server closed the connection and said why, in the WebSocket
    /// close frame: for instance that it is serving as many connections as
    /// it may. (A refused credential closes with no reason: that is
    /// `ConnectionEnded`.)
    #[error("the server closed the connection: {reason} (close code {code})")]
    Closed {
        /// The WebSocket close code (1013: try again later).
        code: u16,
        /// The server's words.
        reason: String,
    },
    /// The request could not be encoded.
    #[error("the request could not be encoded: {0}")]
    Encode(String),
}

/// What the reading task does with a scope's frames.
#[derive(Debug)]
enum ScopeState {
    /// Waiting for the first main-stream response.
    Starting(oneshot::Sender<Started>),
    /// The first response came; only the finish may follow.
    Answered,
}

/// The first thing a run's main stream said.
#[derive(Debug)]
enum Started {
    Id(String),
    Refused(Error),
    NotServed,
    Broken(String),
}

/// What a loop's queue carries.
#[derive(Debug)]
enum ChannelEvent {
    Response(Bytes),
    Finish,
    RunEnded,
}

#[derive(Debug)]
struct ScopeSlot {
    state: ScopeState,
    /// Open run-loop channels.
    channels: HashMap<u32, mpsc::Sender<ChannelEvent>>,
    /// Stop channels: never finished, taken until the scope's finish.
    stops: Vec<u32>,
    next_channel: u32,
    ended: CancellationToken,
}

impl ScopeSlot {
    /// A channel number not in use in this scope.
    fn take_channel(&mut self) -> u32 {
        let channel = free_number(self.next_channel, |n| {
            self.channels.contains_key(&n) || self.stops.contains(&n)
        });
        self.next_channel = channel.wrapping_add(1);
        channel
    }
}

#[derive(Debug, Default)]
struct Table {
    scopes: HashMap<u32, ScopeSlot>,
    next_scope: u32,
    /// Whether any frame has come from the server.
    answered: bool,
    /// Whether the reading task has stopped.
    closed: bool,
    /// The code and reason of the server's close frame, if it gave one.
    closed_with: Option<(u16, String)>,
}

impl Table {
    /// Why a run cannot start (or did not) on a connection that is over.
    fn ended(&self) -> RunError {
        match &self.closed_with {
            Some((code, reason)) => RunError::Closed {
                code: *code,
                reason: reason.clone(),
            },
            None => RunError::ConnectionEnded {
                answered_before: self.answered,
            },
        }
    }
}

/// What the client's handles and its tasks share.
#[derive(Debug)]
struct Shared {
    table: Mutex<Table>,
    outbox: Outbox,
    limits: Limits,
    /// Fires when the connection is over.
    closed: CancellationToken,
}

impl Shared {
    fn table(&self) -> MutexGuard<'_, Table> {
        self.table
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn send(&self, frame: &ClientFrame<'_>) {
        // After the connection ends, frames have nowhere to go.
        let _ = self
            .outbox
            .send(Outgoing::control(frame::to_message(frame)));
    }

    /// Opens a stop channel on `scope` if it is still open; the scope's
    /// finish answers it.
    fn stop(&self, scope: u32) {
        let mut table = self.table();
        let Some(slot) = table.scopes.get_mut(&scope) else {
            return;
        };
        let channel = slot.take_channel();
        slot.stops.push(channel);
        let Ok(payload) = ChannelRequest::Stop.to_vec();
        self.send(&ClientFrame::ChannelRequest {
            scope,
            channel,
            payload: &payload,
        });
    }
}

/// Stops a run whose caller stopped waiting for its id (the future of
/// [`Client::run`] dropped by a timeout, a `select!`, an aborted task), so
/// that a run nobody holds does not keep a container for the life of the
/// connection.
struct Waiting<'a> {
    shared: &'a Shared,
    scope: u32,
    armed: bool,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.shared.stop(self.scope);
        }
    }
}

/// Closes the connection when the last handle goes.
#[derive(Debug)]
struct Owner {
    shared: Arc<Shared>,
    close: CancellationToken,
}

impl Drop for Owner {
    fn drop(&mut self) {
        self.close.cancel();
    }
}

/// A connection to a provider server. Cheap to clone; the connection closes
/// when the last clone, [`Run`] and [`RunLoop`] are gone, or on [`close`](Self::close).
#[derive(Debug, Clone)]
pub struct Client {
    owner: Arc<Owner>,
}

impl Client {
    /// Connects to `url` (`ws://host:port`, or `wss://` for TLS) and
    /// authorizes with `credential`.
    pub async fn connect(url: &str, credential: &str) -> Result<Client, ConnectError> {
        Client::connect_with(url, credential, ClientConfig::default()).await
    }

    /// Connects with a configuration.
    pub async fn connect_with(
        url: &str,
        credential: &str,
        config: ClientConfig,
    ) -> Result<Client, ConnectError> {
        config.limits.validate().map_err(ConnectError::Limit)?;
        let (ws, _response) = transport::dial(url, config.tls.as_ref(), config.limits.websocket())
            .await
            .map_err(ConnectError::Dial)?;
        let (mut sink, stream) = ws.split();
        // Authorization first: nothing precedes it (protocol §3).
        let authorization = Authorization::Unbrokered(credential);
        let mut payload = Vec::new();
        let Ok(()) = authorization.encode_to(&mut payload);
        let message = frame::to_message(&ClientFrame::Authorization { payload: &payload });
        if let Some(tap) = &config.tap {
            tap(Role::Client, &message);
        }
        sink.send(Message::Binary(message.into()))
            .await
            .map_err(ConnectError::Authorization)?;

        let (outbox, outgoing) = mpsc::unbounded_channel();
        let close = CancellationToken::new();
        let shared = Arc::new(Shared {
            table: Mutex::new(Table::default()),
            outbox,
            limits: config.limits,
            closed: CancellationToken::new(),
        });
        let writer_done = CancellationToken::new();
        let writer = tokio::spawn({
            let tap = config.tap.clone().map(|tap| (tap, Role::Client));
            let close = close.clone();
            let done = writer_done.clone();
            async move {
                if let Err(error) = write_frames(sink, outgoing, close, tap, None).await {
                    debug!(%error, "writing to the server failed");
                }
                done.cancel();
            }
        });
        tokio::spawn(run_connection(
            Arc::clone(&shared),
            stream,
            config.tap,
            close.clone(),
            (writer, writer_done),
        ));
        Ok(Client {
            owner: Arc::new(Owner { shared, close }),
        })
    }

    fn shared(&self) -> &Arc<Shared> {
        &self.owner.shared
    }

    /// Opens a run (`containers::agents::run`) and waits for its id.
    pub async fn run(&self, request: RunRequest) -> Result<Run, RunError> {
        let shared = self.shared();
        let mut payload = Vec::new();
        EndpointRequest::AgentsRun(Box::new(request))
            .encode_to(&mut payload)
            .map_err(|e| RunError::Encode(e.to_string()))?;
        let (started_tx, started) = oneshot::channel();
        let ended = CancellationToken::new();
        let scope = {
            let mut table = shared.table();
            if table.closed {
                return Err(table.ended());
            }
            let scope = free_number(table.next_scope, |n| table.scopes.contains_key(&n));
            table.next_scope = scope.wrapping_add(1);
            table.scopes.insert(
                scope,
                ScopeSlot {
                    state: ScopeState::Starting(started_tx),
                    channels: HashMap::new(),
                    stops: Vec::new(),
                    next_channel: 0,
                    ended: ended.clone(),
                },
            );
            shared.send(&ClientFrame::Request {
                scope,
                payload: &payload,
            });
            scope
        };
        let mut waiting = Waiting {
            shared,
            scope,
            armed: true,
        };
        let started = started.await;
        // Answered: a run comes back (whose handles stop it when dropped),
        // or the scope has ended already.
        waiting.armed = false;
        match started {
            Ok(Started::Id(id)) => Ok(Run::new(self.clone(), scope, id, ended)),
            Ok(Started::Refused(error)) => Err(RunError::Refused(error)),
            Ok(Started::NotServed) => Err(RunError::NotServed),
            Ok(Started::Broken(why)) => Err(RunError::Broken(why)),
            Err(_) => Err(shared.table().ended()),
        }
    }

    /// Whether the connection is over.
    pub fn is_closed(&self) -> bool {
        self.shared().closed.is_cancelled()
    }

    /// Resolves when the connection is over.
    pub async fn closed(&self) {
        self.shared().closed.cancelled().await;
    }

    /// Closes the connection: every open run and loop ends as `Broken`
    /// (on the server, every run ends). Resolves when it is closed: the
    /// close handshake is done (the server answered), or the server did not
    /// answer within [`CLOSE_GRACE`] and the socket was let go.
    ///
    /// Dropping the last handle closes the same way, but cannot wait: the
    /// handshake goes on in the client's tasks, and completes only if the
    /// runtime keeps running for it (a program that returns from `main`
    /// right after the drop may cut it short, and the server then sees a
    /// connection that broke). A caller that is done should call `close`.
    pub async fn close(&self) {
        self.owner.close.cancel();
        self.closed().await;
    }
}

/// The first number from `start` on that `taken` does not claim.
fn free_number(start: u32, taken: impl Fn(u32) -> bool) -> u32 {
    let mut n = start;
    while taken(n) {
        n = n.wrapping_add(1);
    }
    n
}

/// The client's side of the connection from its authorization to its end:
/// routes server frames until the server ends the connection, the writer
/// fails or `close` fires; then ends every run and loop, has the writer
/// close (or answer the server's close), and waits for the handshake to
/// complete — the server's answer, or the end of a connection it closed —
/// for [`CLOSE_GRACE`] at most.
async fn run_connection<S>(
    shared: Arc<Shared>,
    mut stream: S,
    tap: Option<Tap>,
    close: CancellationToken,
    (mut writer, writer_done): (tokio::task::JoinHandle<()>, CancellationToken),
) where
    S: futures_util::Stream<Item = Result<Message, WsError>> + Unpin,
{
    tokio::select! {
        () = read_frames(&shared, &mut stream, tap) => {}
        () = close.cancelled() => {}
        () = writer_done.cancelled() => {}
    }
    end_connection(&shared);
    close.cancel();
    let handshake = async {
        while let Some(Ok(message)) = stream.next().await {
            if let Message::Close(_) = message {
                break;
            }
        }
        writer_done.cancelled().await;
    };
    if tokio::time::timeout(CLOSE_GRACE, handshake).await.is_err() {
        debug!(
            ?CLOSE_GRACE,
            "the server did not complete the close handshake; letting the socket go"
        );
        writer.abort();
    }
    // Both halves go now: the socket closes.
    drop(stream);
    let _ = (&mut writer).await;
    shared.closed.cancel();
}

/// Reads server frames until the connection ends.
async fn read_frames<S>(shared: &Shared, stream: &mut S, tap: Option<Tap>)
where
    S: futures_util::Stream<Item = Result<Message, WsError>> + Unpin,
{
    while let Some(message) = stream.next().await {
        let bytes = match message {
            Ok(Message::Binary(bytes)) => bytes,
            Ok(Message::Text(_) | Message::Ping(_) | Message::Pong(_) | Message::Frame(_)) => {
                continue;
            }
            Ok(Message::Close(frame)) => {
                if let Some(frame) = frame.filter(|f| !f.reason.is_empty()) {
                    debug!(code = u16::from(frame.code), reason = %frame.reason, "the server closed the connection");
                    shared.table().closed_with =
                        Some((frame.code.into(), frame.reason.to_string()));
                }
                return;
            }
            Err(error) => {
                debug!(%error, "reading from the server failed");
                return;
            }
        };
        if let Some(tap) = &tap {
            tap(Role::Server, &bytes);
        }
        if !route(shared, &bytes).await {
            return;
        }
    }
}

/// Routes one server frame. `false` ends the connection (a violation).
async fn route(shared: &Shared, bytes: &Bytes) -> bool {
    let frame = match ServerFrame::decode(bytes) {
        Ok(frame) => frame,
        Err(error) => {
            debug!(%error, "disregarded a malformed frame");
            return true;
        }
    };
    shared.table().answered = true;
    match frame {
        ServerFrame::Authorization { .. } => {
            warn!("the server sent an authorization frame; ending the connection");
            return false;
        }
        ServerFrame::Response { scope, payload } => main_response(shared, scope, payload),
        ServerFrame::ResponseFinish { scope } => {
            let slot = shared.table().scopes.remove(&scope);
            let Some(slot) = slot else {
                debug!(scope, "disregarded a finish of a scope that is not open");
                return true;
            };
            if let ScopeState::Starting(started) = slot.state {
                let _ = started.send(Started::NotServed);
            }
            slot.ended.cancel();
            for (_, channel) in slot.channels {
                let _ = channel.send(ChannelEvent::RunEnded).await;
            }
        }
        ServerFrame::ChannelResponse {
            scope,
            channel,
            payload,
        } => {
            let sender = channel_sender(shared, scope, channel);
            match sender {
                // Waits while the loop's queue is full: backpressure.
                Some(sender) => {
                    let payload = bytes.slice_ref(payload);
                    let _ = sender.send(ChannelEvent::Response(payload)).await;
                }
                None => debug!(
                    scope,
                    channel, "disregarded a response on a channel that is not open"
                ),
            }
        }
        ServerFrame::ChannelResponseFinish { scope, channel } => {
            let sender = {
                let mut table = shared.table();
                table
                    .scopes
                    .get_mut(&scope)
                    .and_then(|slot| slot.channels.remove(&channel))
            };
            match sender {
                Some(sender) => {
                    let _ = sender.send(ChannelEvent::Finish).await;
                }
                None => debug!(
                    scope,
                    channel, "disregarded a finish of a channel that is not open"
                ),
            }
        }
        ServerFrame::ChannelRequest { scope, channel, .. } => {
            // The client serves no channels: received, not served.
            if shared.table().scopes.contains_key(&scope) {
                shared.send(&ClientFrame::ChannelResponseFinish { scope, channel });
            }
        }
    }
    true
}

fn channel_sender(shared: &Shared, scope: u32, channel: u32) -> Option<mpsc::Sender<ChannelEvent>> {
    let table = shared.table();
    table
        .scopes
        .get(&scope)
        .and_then(|slot| slot.channels.get(&channel))
        .cloned()
}

fn main_response(shared: &Shared, scope: u32, payload: &[u8]) {
    let mut table = shared.table();
    let Some(slot) = table.scopes.get_mut(&scope) else {
        return debug!(scope, "disregarded a response on a scope that is not open");
    };
    match std::mem::replace(&mut slot.state, ScopeState::Answered) {
        ScopeState::Starting(started) => {
            let answer = match RunResponse::decode(payload) {
                Ok(RunResponse::Id(id)) => Started::Id(id),
                Ok(RunResponse::Error(error)) => Started::Refused(error),
                Err(error) => Started::Broken(error.to_string()),
            };
            let _ = started.send(answer);
        }
        ScopeState::Answered => {
            warn!(
                scope,
                "the server sent a second main-stream response; disregarded"
            );
        }
    }
}

/// The connection is ending: every run and loop learns it, and no new one
/// can start.
fn end_connection(shared: &Shared) {
    let scopes = {
        let mut table = shared.table();
        table.closed = true;
        std::mem::take(&mut table.scopes)
    };
    // Dropping the senders ends every loop's queue: `Broken(ConnectionEnded)`.
    for (_, slot) in scopes {
        slot.ended.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_configuration_that_cannot_work_is_refused_before_connecting() {
        let config = ClientConfig {
            limits: Limits {
                max_queued_responses: 0,
                ..Limits::default()
            },
            ..ClientConfig::default()
        };
        // Nothing listens on port 1: only a refusal up front avoids the dial.
        match Client::connect_with("ws://127.0.0.1:1", "", config).await {
            Err(ConnectError::Limit(error)) => {
                assert_eq!(error.limit, crate::connection::Limit::MaxQueuedResponses);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn free_numbers_skip_taken_ones_and_wrap() {
        assert_eq!(free_number(0, |_| false), 0);
        assert_eq!(free_number(5, |n| n == 5 || n == 6), 7);
        assert_eq!(free_number(u32::MAX, |n| n == u32::MAX), 0);
    }
}
