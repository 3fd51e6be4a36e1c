//! One caller's connection on the server: authorization, then frames in,
//! dispatched against the table of open scopes and channels (protocol §2, §3).
//!
//! The table is the single source of truth for which numbers are taken. A
//! number is freed under the table's lock *before* its finish is queued, and
//! frames are queued in order, so when the caller sees a finish and reuses
//! the number, the reader here already sees it free. The same lock keeps a
//! scope's finish behind every frame of its channels: a task that answers on
//! a channel checks, under the lock, that the scope is still open.
//!
//! Malformed frames (truncated, a type the client may not send, a scope or
//! channel that is not open, a number still in use) are disregarded: counted,
//! logged at debug, and never answered. Only a protocol violation that makes
//! the connection's identity doubtful (a second authorization) ends it.
//!
//! A frame can cost an answer the reader queues at once (a bare finish for
//! an unserved endpoint or channel, or for a request past a limit), and a
//! caller can send such frames faster than it reads their answers, or never
//! read at all. Each of those answers holds a place among
//! [`MAX_QUEUED_ANSWERS`] until the writer has taken it, and the reader takes
//! a place before it reads the next frame: when the caller stops reading,
//! the server soon stops reading too, and TCP carries the pressure back.
//! Everything else a connection queues is bounded by its scopes and
//! channels, themselves bounded by [`Limits`](crate::connection::Limits).
//!
//! A connection ends with a close handshake whichever side closes (protocol §12
//! "Clean ends"). A caller's close is answered at once, before its runs
//! have ended (nothing may be sent after a close anyway); the server's own
//! close (a refusal, a turn-away, a shutdown, a violation) waits for the
//! caller's answer, briefly, before the socket goes. The "connection
//! ending" line says which it was, and says "broke" only for a connection
//! that ended without either.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::stream::{SplitSink, SplitStream};
use runloop_proto::authorization::Authorization;
use runloop_proto::channel::ChannelRequest;
use runloop_proto::endpoint::EndpointRequest;
use runloop_proto::frame::{self, ClientFrame, FrameType, HEADER_LEN, ServerFrame};
use runloop_proto::run_loop::{Finish, Sender};
use runloop_proto::{Decode, Writer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_tungstenite::tungstenite::error::ProtocolError;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::{WebSocketStream, accept_async_with_config};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, debug, info, info_span, warn};

use super::scope::{self, Order};
use super::{Held, Identity, Shared, Stats};
use crate::connection::{CLOSE_GRACE, Outbox, Outgoing, write_frames};
use crate::metrics::AuthorizationRefusal;

/// What a connection can run over: a TCP stream, or anything else that
/// reads and writes bytes (an in-memory pipe in tests and fuzzing).
pub(crate) trait Io: AsyncRead + AsyncWrite + Unpin + Send + 'static {}

impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Io for T {}

/// How long a closing connection may take to write its last frames.
const FLUSH_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// Answers the reader itself queued (bare finishes) that may wait for the
/// socket before it reads the caller's next frame.
const MAX_QUEUED_ANSWERS: usize = 1024;

/// What a client channel number is used for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChannelUse {
    /// A stop channel: never finished, freed with its scope.
    Stop,
    /// A run-loop channel, freed by its finish.
    RunLoop,
}

/// An open scope.
#[derive(Debug)]
struct ScopeEntry {
    channels: HashMap<u32, ChannelUse>,
    stop: CancellationToken,
    orders: mpsc::UnboundedSender<Order>,
}

/// The numbers a connection has open.
#[derive(Debug, Default)]
struct Table {
    scopes: HashMap<u32, ScopeEntry>,
}

/// What one connection's tasks share.
#[derive(Debug)]
pub(crate) struct Conn {
    shared: Arc<Shared>,
    table: Mutex<Table>,
    outbox: Outbox,
    /// Fires when the connection is ending, for whatever reason.
    pub(crate) ended: CancellationToken,
    /// Who the connection is served as.
    pub(crate) identity: Identity,
    /// The number the connection is known by in logs.
    pub(crate) number: u64,
    /// Frames of this connection disregarded so far.
    disregarded: std::sync::atomic::AtomicU64,
}

impl Conn {
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        // A panic while holding the lock cannot leave the table half-written
        // in a way that matters more than losing the connection would.
        self.table
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn queue(&self, message: Vec<u8>) {
        // The writer is gone only when the connection is: nothing to do.
        let _ = self.outbox.send(Outgoing::control(message));
    }

    /// Queues a data frame that holds a queue place of its channel.
    pub(crate) fn queue_data(&self, message: Vec<u8>, permit: tokio::sync::OwnedSemaphorePermit) {
        let _ = self.outbox.send(Outgoing::data(message, permit, None));
    }

    /// Queues a relayed chunk whose proxy message came at `relayed_at`.
    pub(crate) fn queue_relayed(
        &self,
        message: Vec<u8>,
        permit: tokio::sync::OwnedSemaphorePermit,
        relayed_at: std::time::Instant,
    ) {
        let _ = self
            .outbox
            .send(Outgoing::data(message, permit, Some(relayed_at)));
    }

    /// Queues a control frame of `scope` (a main-stream response, or a
    /// channel's last response) if the scope is still open.
    pub(crate) fn queue_in_scope(&self, scope: u32, message: Vec<u8>) {
        let table = self.table();
        if table.scopes.contains_key(&scope) {
            self.queue(message);
        }
    }

    /// Frees a run-loop channel, then queues its finish. The [`Finish`]
    /// proves the channel's sequence is complete.
    pub(crate) fn finish_channel(&self, scope: u32, channel: u32, _complete: Finish) {
        let mut table = self.table();
        if let Some(entry) = table.scopes.get_mut(&scope)
            && entry.channels.remove(&channel).is_some()
        {
            self.queue(frame::to_message(&ServerFrame::ChannelResponseFinish {
                scope,
                channel,
            }));
        }
    }

    /// Ends a scope: every run-loop channel still open in it (asked for too
    /// late to be served) ends with `error`, then the scope's finish frees
    /// the scope and all its numbers. Under the table's lock, so no channel
    /// can open in between.
    pub(crate) fn finish_scope(&self, scope: u32, error: &runloop_proto::Error) {
        let mut table = self.table();
        let Some(entry) = table.scopes.remove(&scope) else {
            return;
        };
        for (&channel, &used) in &entry.channels {
            if used == ChannelUse::RunLoop {
                let mut message = Vec::new();
                let mut out = Writer::new(&mut message);
                frame::write_header(&mut out, FrameType::ChannelResponse, scope, channel);
                let Finish { .. } = Sender::new().error(error, &mut out).finish();
                self.queue(message);
                self.queue(frame::to_message(&ServerFrame::ChannelResponseFinish {
                    scope,
                    channel,
                }));
            }
        }
        self.queue(frame::to_message(&ServerFrame::ResponseFinish { scope }));
    }

    fn disregard(&self, what: std::fmt::Arguments<'_>) {
        self.disregarded.fetch_add(1, Ordering::Relaxed);
        self.shared
            .stats
            .disregarded
            .fetch_add(1, Ordering::Relaxed);
        debug!("disregarded: {what}");
    }
}

/// Serves one connection to its end: the WebSocket handshake, the
/// authorization, then frames until either side ends it. `peer` names the
/// other end in logs.
pub(crate) async fn serve(io: impl Io, peer: impl fmt::Display, shared: Arc<Shared>) {
    let _held = Held::new(&shared, |s: &Stats| &s.connections);
    shared.metrics.connections.inc();
    let number = shared.next_connection.fetch_add(1, Ordering::Relaxed);
    let span = info_span!("connection", connection = number, %peer);
    async move {
        // The grace covers the WebSocket handshake and the authorization
        // together: a connection that never completes either holds a slot
        // no longer than one that never authorizes.
        let grace = shared.config.authorization_grace;
        let deadline = tokio::time::Instant::now() + grace;
        let Ok(_slot) = Arc::clone(&shared.slots).try_acquire_owned() else {
            return turn_away(io, &shared, deadline).await;
        };
        let Some(ws) = handshake(io, &shared, deadline).await else {
            return;
        };
        let (sink, mut stream) = ws.split();
        let identity = tokio::select! {
            result = tokio::time::timeout_at(deadline, authorize(&mut stream, &shared)) => match result {
                Ok(Ok(identity)) => identity,
                Ok(Err(why)) => {
                    if let Some(refusal) = why.refusal() {
                        shared.metrics.refused.inc(refusal);
                    }
                    info!(%why, "authorization refused; closing without a frame");
                    return close_without_frame(sink, stream).await;
                }
                Err(_) => {
                    shared.metrics.refused.inc(AuthorizationRefusal::Timeout);
                    info!(?grace, "no authorization within the grace period; closing without a frame");
                    return close_without_frame(sink, stream).await;
                }
            },
            () = shared.shutdown.cancelled() => return close_without_frame(sink, stream).await,
        };
        info!(%identity, "authorized");
        serve_authorized(sink, stream, shared, identity, number).await;
    }
    .instrument(span)
    .await;
}

/// Why a connection was refused at authorization. Never holds the credential.
#[derive(Debug, thiserror::Error)]
enum Refused {
    #[error("the first frame is not an authorization: {0}")]
    NotAuthorization(String),
    #[error("{0}")]
    Payload(#[from] runloop_proto::authorization::AuthorizationError),
    #[error("the credential is not accepted")]
    Credential,
    #[error("the connection ended before it authorized")]
    Closed,
}

impl Refused {
    /// How the refusal is counted; a caller that left is not counted.
    fn refusal(&self) -> Option<AuthorizationRefusal> {
        match self {
            Refused::NotAuthorization(_) | Refused::Payload(_) => {
                Some(AuthorizationRefusal::Malformed)
            }
            Refused::Credential => Some(AuthorizationRefusal::Credential),
            Refused::Closed => None,
        }
    }
}

/// Waits for the first frame, which must be an acceptable authorization.
async fn authorize(
    stream: &mut SplitStream<WebSocketStream<impl Io>>,
    shared: &Shared,
) -> Result<Identity, Refused> {
    loop {
        let bytes = match stream.next().await {
            Some(Ok(Message::Binary(bytes))) => bytes,
            Some(Ok(
                Message::Text(_) | Message::Ping(_) | Message::Pong(_) | Message::Frame(_),
            )) => {
                continue;
            }
            Some(Ok(Message::Close(_)) | Err(_)) | None => return Err(Refused::Closed),
        };
        return match ClientFrame::decode(&bytes) {
            Ok(ClientFrame::Authorization { payload }) => {
                let authorization = Authorization::decode(payload)?;
                shared
                    .config
                    .credentials
                    .accept(authorization.credential())
                    .ok_or(Refused::Credential)
            }
            Ok(other) => Err(Refused::NotAuthorization(format!(
                "a {}",
                other.frame_type().name()
            ))),
            Err(error) => Err(Refused::NotAuthorization(error.to_string())),
        };
    }
}

/// The WebSocket handshake, by `deadline` and unless the server shuts down
/// first; `None` (and a log line) when it does not complete.
async fn handshake<S: Io>(
    io: S,
    shared: &Shared,
    deadline: tokio::time::Instant,
) -> Option<WebSocketStream<S>> {
    let handshake = accept_async_with_config(io, Some(shared.config.limits.websocket()));
    tokio::select! {
        result = tokio::time::timeout_at(deadline, handshake) => match result {
            Ok(Ok(ws)) => Some(ws),
            Ok(Err(error)) => {
                debug!(%error, "WebSocket handshake failed");
                None
            }
            Err(_) => {
                let grace = shared.config.authorization_grace;
                info!(?grace, "no WebSocket handshake within the grace period; closing");
                None
            }
        },
        () = shared.shutdown.cancelled() => None,
    }
}

/// Closes a connection past the connection limit: the WebSocket handshake
/// (by the same deadline as any connection's), then close code 1013 (try
/// again later) with a reason the caller can show. Nothing it sends is
/// looked at.
async fn turn_away(io: impl Io, shared: &Shared, deadline: tokio::time::Instant) {
    shared.stats.turned_away.fetch_add(1, Ordering::Relaxed);
    let limit = shared.config.max_connections;
    warn!(
        limit,
        "turned away: the server is serving as many connections as it may"
    );
    let Some(ws) = handshake(io, shared, deadline).await else {
        return;
    };
    let reason =
        format!("the server is serving as many connections as it may ({limit}); try again later");
    close_with(ws, CloseCode::Again, reason).await;
}

/// Ends a connection that was refused at authorization: a close with
/// code 1008 and no reason, and no frame (protocol §3).
async fn close_without_frame<S: Io>(
    sink: SplitSink<WebSocketStream<S>, Message>,
    stream: SplitStream<WebSocketStream<S>>,
) {
    if let Ok(ws) = sink.reunite(stream) {
        close_with(ws, CloseCode::Policy, String::new()).await;
    }
}

/// Sends a close frame, then reads and drops whatever the caller still
/// sends until it answers the close, for [`CLOSE_GRACE`] at most. Closing
/// the socket on bytes not yet read would reset it, and the caller could
/// lose the close frame and its reason.
async fn close_with<S: Io>(mut ws: WebSocketStream<S>, code: CloseCode, reason: String) {
    let closing = async {
        let frame = CloseFrame {
            code,
            reason: reason.into(),
        };
        if ws.close(Some(frame)).await.is_ok() {
            while let Some(Ok(_)) = ws.next().await {}
        }
    };
    let _ = tokio::time::timeout(CLOSE_GRACE, closing).await;
}

async fn serve_authorized<S: Io>(
    sink: SplitSink<WebSocketStream<S>, Message>,
    mut stream: SplitStream<WebSocketStream<S>>,
    shared: Arc<Shared>,
    identity: Identity,
    number: u64,
) {
    let (outbox, outgoing) = mpsc::unbounded_channel();
    let ended = shared.shutdown.child_token();
    let conn = Arc::new(Conn {
        shared: Arc::clone(&shared),
        table: Mutex::new(Table::default()),
        outbox,
        ended: ended.clone(),
        identity,
        number,
        disregarded: std::sync::atomic::AtomicU64::new(0),
    });
    // Fires when the caller has closed: the writer answers at once, while
    // the connection's runs are still ending, since nothing may be sent
    // after a close anyway.
    let answer_close = CancellationToken::new();
    let mut writer = tokio::spawn({
        let ended = ended.clone();
        let answer_close = answer_close.clone();
        let latency = Some(shared.metrics.relay_latency.clone());
        async move {
            // Otherwise closed by dropping every outbox, after the last
            // finish is queued.
            if let Err(error) = write_frames(sink, outgoing, answer_close, None, latency).await {
                debug!(%error, "writing to the caller failed");
            }
            // Whatever ended the writer ends the connection.
            ended.cancel();
        }
    });
    let scopes = TaskTracker::new();
    let answers = Arc::new(Semaphore::new(MAX_QUEUED_ANSWERS));
    let why = loop {
        // A place for the answer the next frame may need, before reading it.
        // (The semaphore is never closed: `None` is only the end.)
        let place = tokio::select! {
            place = Arc::clone(&answers).acquire_owned() => place.ok(),
            () = ended.cancelled() => None,
        };
        let Some(place) = place else {
            break ended_why(&shared);
        };
        tokio::select! {
            message = stream.next() => match message {
                Some(Ok(Message::Binary(bytes))) => {
                    if let Err(violation) = dispatch(&conn, &scopes, bytes, place) {
                        warn!(%violation, "ending the connection");
                        break violation;
                    }
                }
                Some(Ok(Message::Text(_) | Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => {}
                Some(Ok(Message::Close(_))) | None => {
                    answer_close.cancel();
                    break "the caller closed the connection";
                }
                Some(Err(error)) => {
                    debug!(%error, "reading from the caller failed");
                    break read_failed_why(&error);
                }
            },
            () = ended.cancelled() => break ended_why(&shared),
        }
    };
    info!(
        why,
        disregarded = conn.disregarded.load(Ordering::Relaxed),
        "connection ending"
    );
    // Every scope sees this and ends: channels, containers, finishes.
    ended.cancel();
    scopes.close();
    scopes.wait().await;
    // All frames are queued; let the writer send them and close the socket,
    // but do not let a caller that stopped reading hold the server forever.
    drop(conn);
    if tokio::time::timeout(FLUSH_GRACE, &mut writer)
        .await
        .is_err()
    {
        debug!(
            ?FLUSH_GRACE,
            "the caller is not reading; dropping what is left unsent"
        );
        writer.abort();
    } else {
        // The writer's close went out (or answered the caller's): read on
        // until the caller answers it, so that the socket is not closed on
        // bytes not yet read.
        let answered = async { while let Some(Ok(_)) = stream.next().await {} };
        let _ = tokio::time::timeout(CLOSE_GRACE, answered).await;
    }
    info!("connection closed");
}

/// Why the connection ended when reading from the caller failed.
fn read_failed_why(error: &WsError) -> &'static str {
    match error {
        WsError::Capacity(_) => "the caller sent a message over the size limit",
        // A caller that went away without a close handshake is the
        // connection breaking, not the caller breaking the protocol.
        WsError::Protocol(ProtocolError::ResetWithoutClosingHandshake) => "the connection broke",
        WsError::Protocol(_) | WsError::Utf8(_) => "the caller broke the WebSocket protocol",
        _ => "the connection broke",
    }
}

/// Why the connection ended when something other than the caller ended it.
fn ended_why(shared: &Shared) -> &'static str {
    if shared.shutdown.is_cancelled() {
        "the server is shutting down"
    } else {
        "the connection broke"
    }
}

/// Handles one binary message; an answer it queues at once holds `place`.
/// `Err` is a violation that ends the connection.
fn dispatch(
    conn: &Arc<Conn>,
    scopes: &TaskTracker,
    bytes: Bytes,
    place: OwnedSemaphorePermit,
) -> Result<(), &'static str> {
    let frame = match ClientFrame::decode(&bytes) {
        Ok(frame) => frame,
        Err(error) => {
            conn.disregard(format_args!("{error}"));
            return Ok(());
        }
    };
    match frame {
        ClientFrame::Authorization { .. } => return Err("a second authorization frame"),
        ClientFrame::Request { scope, payload } => request(conn, scopes, scope, payload, place),
        ClientFrame::ChannelRequest {
            scope,
            channel,
            payload,
        } => {
            // The run-loop request's JSON, as the caller's bytes, without a copy.
            let json = bytes.slice((HEADER_LEN + 1).min(bytes.len())..);
            channel_request(conn, scope, channel, payload, json, place);
        }
        ClientFrame::ChannelResponse { scope, channel, .. }
        | ClientFrame::ChannelResponseFinish { scope, channel } => conn.disregard(format_args!(
            "a response on server channel {channel} of scope {scope}, which is not open"
        )),
    }
    Ok(())
}

/// A type-1 request: opens a scope, or is answered with a bare finish.
fn request(
    conn: &Arc<Conn>,
    scopes: &TaskTracker,
    scope: u32,
    payload: &[u8],
    place: OwnedSemaphorePermit,
) {
    let mut table = conn.table();
    if table.scopes.contains_key(&scope) {
        return conn.disregard(format_args!(
            "a request on scope {scope}, which is still open"
        ));
    }
    let bare_finish = || {
        let finish = frame::to_message(&ServerFrame::ResponseFinish { scope });
        conn.queue_data(finish, place);
    };
    if table.scopes.len() >= conn.shared.config.limits.max_scopes {
        warn!(
            scope,
            limit = conn.shared.config.limits.max_scopes,
            "too many open scopes; bare finish"
        );
        return bare_finish();
    }
    let request = match EndpointRequest::decode(payload) {
        Ok(EndpointRequest::AgentsRun(request)) => request,
        Ok(EndpointRequest::Unserved(tag)) => {
            debug!(scope, tag, "endpoint not served; bare finish");
            return bare_finish();
        }
        Err(error) => {
            debug!(scope, %error, "request did not decode; bare finish");
            return bare_finish();
        }
    };
    let (orders, orders_in) = mpsc::unbounded_channel();
    let stop = CancellationToken::new();
    table.scopes.insert(
        scope,
        ScopeEntry {
            channels: HashMap::new(),
            stop: stop.clone(),
            orders,
        },
    );
    drop(table);
    scopes.spawn(scope::serve(
        Arc::clone(conn),
        scope,
        request,
        stop,
        orders_in,
    ));
}

/// A type-4 request: stop, run-loop, or a bare channel finish.
fn channel_request(
    conn: &Conn,
    scope: u32,
    channel: u32,
    payload: &[u8],
    json: Bytes,
    place: OwnedSemaphorePermit,
) {
    let mut table = conn.table();
    let Some(entry) = table.scopes.get_mut(&scope) else {
        return conn.disregard(format_args!(
            "a channel request on scope {scope}, which is not open"
        ));
    };
    if entry.channels.contains_key(&channel) {
        return conn.disregard(format_args!(
            "a request on channel {channel} of scope {scope}, which is still open"
        ));
    }
    let bare_finish = || {
        let finish = frame::to_message(&ServerFrame::ChannelResponseFinish { scope, channel });
        conn.queue_data(finish, place);
    };
    let limit = conn.shared.config.limits.max_channels;
    match ChannelRequest::decode(payload) {
        Ok(ChannelRequest::Stop) => {
            // Answered by the scope's finish; the number is freed with it.
            // A stop past the channel limit is obeyed but not recorded: the
            // run is ending anyway, and a flood of stops while it ends must
            // not grow the table.
            if entry.channels.len() < limit {
                entry.channels.insert(channel, ChannelUse::Stop);
            }
            entry.stop.cancel();
        }
        Ok(ChannelRequest::RunLoop(_)) => {
            if entry.channels.len() >= limit {
                warn!(
                    scope,
                    channel, limit, "too many open channels; bare channel finish"
                );
                return bare_finish();
            }
            entry.channels.insert(channel, ChannelUse::RunLoop);
            // The scope task is alive while its entry is in the table.
            let _ = entry.orders.send(Order {
                channel,
                request: json,
            });
        }
        Ok(ChannelRequest::Unserved(tag)) => {
            debug!(
                scope,
                channel, tag, "channel not served; bare channel finish"
            );
            bare_finish();
        }
        Err(error) => {
            debug!(scope, channel, %error, "channel request did not decode; bare channel finish");
            bare_finish();
        }
    }
}
