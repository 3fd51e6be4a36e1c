//! One caller's connection on the server: the WebSocket handshake, the
//! authorization, then frames in, each applied to the connection's table
//! (protocol §2, §3), until either side ends it.
//!
//! What a frame does is the table's to say ([`Serve`]): open a run, stop
//! one, open a run-loop channel, answer with a bare finish, disregard it,
//! or end the connection. This module only carries it out: it spawns the
//! scope's task, hands a loop's request to its scope, queues the bare
//! finish, counts and logs what is disregarded. Only a violation of the
//! authorization rules (a second authorization) ends the connection;
//! everything else malformed is disregarded and never answered.
//!
//! A frame can cost an answer the reader queues at once (a bare finish for
//! an unserved endpoint or channel, or for a request past a limit), and a
//! caller can send such frames faster than it reads their answers, or never
//! read at all. Each of those answers holds a place among
//! [`MAX_QUEUED_ANSWERS`] until the writer has taken it, and the reader takes
//! a place before it reads the next frame: when the caller stops reading,
//! the server soon stops reading too, and TCP carries the pressure back.
//! Everything else a connection queues is bounded by its scopes and
//! channels, themselves bounded by [`Limits`](runloop_wire::limits::Limits).
//!
//! Control frames mean nothing here, but each ping costs an answer: a
//! caller past its [`pings`](super::pings) budget is closed, before or
//! after its authorization.
//!
//! A connection ends with a close handshake whichever side closes (protocol §12
//! "Clean ends"). A caller's close is answered at once, before its runs
//! have ended (nothing may be sent after a close anyway); the server's own
//! close (a refusal, a turn-away, a shutdown, a violation) waits for the
//! caller's answer, briefly, before the socket goes. The "connection
//! ending" line says which it was, and says "broke" only for a connection
//! that ended without either.

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::stream::{SplitSink, SplitStream};
use runloop_proto::Decode;
use runloop_proto::connection::{Disregarded, Serve, Table, Violation};
use runloop_proto::error_chain::Chain;
use runloop_proto::frame::{self, ClientFrame, HeaderError, Role};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::error::ProtocolError;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::{WebSocketStream, accept_hdr_async_with_config};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, debug, info, info_span, warn};

use super::admission::{Admitted, NotTaken, OverAllowance};
use super::half_sent::{self, Metered};
use super::identity::Identity;
use super::origin::{self, Caller};
use super::outbox::{Order, Outbox, ScopeOutbox, ServerTable, Serving};
use super::pings::{Flood, Pings};
use super::scope::{self, Run};
use super::shared::{Held, Shared, Stats};
use runloop_metrics::{AuthorizationRefusal, ConnectionClosed, TenantFigures};
use runloop_wire::lane::Lane;
use runloop_wire::writer::{self, CLOSE_GRACE, Place, write_frames};

/// What a connection can run over: a TCP stream, or anything else that
/// reads and writes bytes (an in-memory pipe in tests and fuzzing).
pub(crate) trait Io: AsyncRead + AsyncWrite + Unpin + Send + 'static {}

impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Io for T {}

/// How long a closing connection may take to write its last frames.
const FLUSH_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// Answers the reader itself queued (bare finishes) that may wait for the
/// socket before it reads the caller's next frame.
const MAX_QUEUED_ANSWERS: usize = 1024;

/// What the reader of one authorized connection holds.
struct Conn {
    shared: Arc<Shared>,
    outbox: Arc<Outbox>,
    /// Fires when the connection is ending, for whatever reason.
    ended: CancellationToken,
    identity: Identity,
    /// The number the connection is known by in logs.
    number: u64,
    /// The tasks of its scopes.
    scopes: TaskTracker,
    /// Frames of this connection disregarded so far.
    disregarded: AtomicU64,
}

impl Conn {
    fn disregard(&self, why: &Disregarded) {
        self.disregarded.fetch_add(1, Ordering::Relaxed);
        self.shared
            .stats
            .disregarded
            .fetch_add(1, Ordering::Relaxed);
        debug!(why = %Chain(why), "disregarded");
    }
}

/// Serves one connection to its end: the WebSocket handshake, the
/// authorization, then frames until either side ends it. `peer` names the
/// other end in logs; `admitted` holds its places (see [`Admitted`]).
pub(crate) async fn serve(
    io: impl Io,
    peer: impl fmt::Display,
    shared: Arc<Shared>,
    mut admitted: Admitted,
) {
    let _held = Held::new(&shared, |s: &Stats| &s.connections);
    shared.metrics.connections.inc();
    let number = shared.connection_number();
    let span = info_span!("connection", connection = number, %peer);
    async move {
        // The grace covers the WebSocket handshake and the authorization
        // together: a connection that never completes either holds a slot
        // no longer than one that never authorizes. The handshake alone
        // has a shorter deadline.
        let grace = shared.config.authorization_grace;
        let now = tokio::time::Instant::now();
        let deadline = now + grace;
        let handshake_by = deadline.min(now + shared.config.admission.handshake_timeout);
        let io = admitted.bounded(io);
        // Its half-sent messages are counted from the first byte, claimed
        // once it has authorized.
        let (io, meter) = Metered::new(io);
        // Refusal lines are rate limited per address.
        let address = admitted.address();
        let logged = || shared.refusals.allows(address);
        let Some(_slot) = shared.slot() else {
            return turn_away(io, &shared, handshake_by, logged()).await;
        };
        // Data frames go to the socket on the lane, from their own bytes;
        // the WebSocket's own frames go there too, once it has shaken hands.
        let (io, lane) = Lane::new(io);
        let Some((ws, caller)) = handshake(io, &shared, handshake_by, &logged).await else {
            return;
        };
        lane.frames();
        let (sink, mut stream) = ws.split();
        let limits = shared.config.limits;
        let mut table = Table::server(limits.max_scopes, limits.max_channels);
        let identity = tokio::select! {
            result = tokio::time::timeout_at(deadline, authorize(&mut stream, &shared, &mut table, (caller, address))) => match result {
                Ok(Ok(identity)) => identity,
                Ok(Err(why)) => {
                    if let Some(refusal) = why.refusal() {
                        shared.metrics.refused.inc(refusal);
                    }
                    if logged() {
                        info!(why = %Chain(&why), "authorization refused; closing without a frame");
                    }
                    return close_without_frame(sink, stream).await;
                }
                Err(_) => {
                    shared.metrics.refused.inc(AuthorizationRefusal::Timeout);
                    if logged() {
                        info!(?grace, "no authorization within the grace period; closing without a frame");
                    }
                    return close_without_frame(sink, stream).await;
                }
            },
            () = shared.shutdown.cancelled() => return close_without_frame(sink, stream).await,
        };
        match admitted.authorized(&identity) {
            Ok(()) => {}
            Err(NotTaken::Limit(limit)) => {
                shared.stats.turned_away.fetch_add(1, Ordering::Relaxed);
                TenantFigures::add(&identity.figures.connections_refused, 1);
                if logged() {
                    warn!(tenant = %identity, max_connections = limit, "turned away: the tenant holds as many connections as it may");
                }
                let reason = format!(
                    "tenant {identity} holds as many connections as it may (max-connections {limit}); try again later"
                );
                if let Ok(ws) = sink.reunite(stream) {
                    close_with(ws, CloseCode::Again, reason).await;
                }
                return;
            }
            Err(NotTaken::Revoked(revoked)) => {
                shared.metrics.refused.inc(AuthorizationRefusal::Revoked);
                if logged() {
                    info!(%revoked, "authorization refused; closing without a frame");
                }
                return close_without_frame(sink, stream).await;
            }
        }
        meter.authorized(&shared.ledger, &identity, shared.config.message_idle_timeout);
        info!(tenant = %identity, "authorized");
        serve_authorized((sink, lane), stream, shared, table, identity, number).await;
    }
    .instrument(span)
    .await;
}

/// Why a connection was refused at authorization. Never holds the credential.
#[derive(Debug, thiserror::Error)]
enum Refused {
    #[error("the first message is not a frame")]
    NotAFrame(#[source] HeaderError),
    #[error(transparent)]
    Violation(Violation),
    #[error("the credential is not accepted")]
    Credential,
    #[error("an empty credential is not accepted from a browser (the upgrade carried an Origin)")]
    EmptyFromBrowser,
    #[error(transparent)]
    Flood(Flood),
    #[error("the connection ended before it authorized")]
    Closed,
    #[error("more than max_authorization_size ({0} bytes) was sent before authorization")]
    TooLarge(usize),
}

impl Refused {
    /// How the refusal is counted; a caller that left is not counted.
    fn refusal(&self) -> Option<AuthorizationRefusal> {
        match self {
            Refused::NotAFrame(_) | Refused::Violation(_) => Some(AuthorizationRefusal::Malformed),
            Refused::Credential | Refused::EmptyFromBrowser => {
                Some(AuthorizationRefusal::Credential)
            }
            Refused::TooLarge(_) => Some(AuthorizationRefusal::TooLarge),
            Refused::Flood(_) => Some(AuthorizationRefusal::Flood),
            Refused::Closed => None,
        }
    }
}

/// Waits for the first frame, which must be an acceptable authorization;
/// from a browser (`caller`), never an empty credential (protocol §12);
/// its credential is checked in its `address`'s turn.
async fn authorize(
    stream: &mut SplitStream<WebSocketStream<impl Io>>,
    shared: &Shared,
    table: &mut ServerTable,
    (caller, address): (Caller, Option<IpAddr>),
) -> Result<Identity, Refused> {
    let bound = shared.config.admission.max_authorization_size;
    let mut pings = Pings::new(Instant::now());
    let bytes = loop {
        match stream.next().await {
            Some(Ok(Message::Binary(bytes))) if bytes.len() > bound => {
                return Err(Refused::TooLarge(bound));
            }
            Some(Ok(Message::Binary(bytes))) => break bytes,
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => {
                pings.received(Instant::now()).map_err(Refused::Flood)?;
            }
            Some(Ok(Message::Text(_) | Message::Frame(_))) => {}
            Some(Err(WsError::Io(error))) if OverAllowance::is(&error) => {
                return Err(Refused::TooLarge(bound));
            }
            Some(Ok(Message::Close(_)) | Err(_)) | None => return Err(Refused::Closed),
        }
    };
    let frame = ClientFrame::decode(&bytes).map_err(Refused::NotAFrame)?;
    let frame_type = frame.frame_type();
    match table.received(frame) {
        Serve::Authorization(authorization)
            if caller == Caller::Browser && authorization.credential().is_empty() =>
        {
            Err(Refused::EmptyFromBrowser)
        }
        Serve::Authorization(authorization) => {
            // Failed checks of one address are slowed: this one waits for
            // its address's turn, given back if the credential is accepted.
            if shared.gate.credential_turn(address).await {
                shared.metrics.credential_checks_slowed.inc();
            }
            let accepted = shared.tenants.accept(authorization.credential());
            if accepted.is_some() {
                shared.gate.credential_accepted(address);
            }
            accepted.ok_or(Refused::Credential)
        }
        Serve::Violation(why) => Err(Refused::Violation(why)),
        // The table answers any other first frame with a violation.
        _ => Err(Refused::Violation(Violation::BeforeAuthorization {
            sender: Role::Client,
            frame_type,
        })),
    }
}

/// The WebSocket handshake, by `deadline` and unless the server shuts down
/// first, and what its `Origin` says of the caller (an origin not allowed
/// is answered with 403, before the upgrade); `None` (and a log line) when
/// it does not complete.
async fn handshake<S: Io>(
    io: S,
    shared: &Shared,
    deadline: tokio::time::Instant,
    logged: impl Fn() -> bool,
) -> Option<(WebSocketStream<S>, Caller)> {
    let mut caller = Caller::NoOrigin;
    // The handshake callback's error type is tungstenite's, large by design.
    #[allow(clippy::result_large_err)]
    let callback = |request: &_, response| {
        caller = origin::check(request, &shared.config.allowed_origins)?;
        Ok(response)
    };
    let handshake =
        accept_hdr_async_with_config(io, callback, Some(shared.config.limits.websocket()));
    tokio::select! {
        result = tokio::time::timeout_at(deadline, handshake) => match result {
            Ok(Ok(ws)) => Some((ws, caller)),
            Ok(Err(error)) => {
                debug!(%error, "WebSocket handshake failed");
                None
            }
            Err(_) => {
                if logged() {
                    let timeout = shared.config.admission.handshake_timeout;
                    info!(?timeout, "no WebSocket handshake within its timeout; closing");
                }
                None
            }
        },
        () = shared.shutdown.cancelled() => None,
    }
}

/// Closes a connection past the connection limit: the WebSocket handshake
/// (by the same deadline as any connection's), then close code 1013 (try
/// again later) with a reason the caller can show. Nothing it sends is
/// looked at, and no more of it is read than of any connection not yet
/// authorized. `logged`: whether its line may be logged.
async fn turn_away(io: impl Io, shared: &Shared, deadline: tokio::time::Instant, logged: bool) {
    shared.stats.turned_away.fetch_add(1, Ordering::Relaxed);
    let limit = shared.config.max_connections;
    if logged {
        warn!(
            limit,
            "turned away: the server is serving as many connections as it may"
        );
    }
    let Some((ws, _)) = handshake(io, shared, deadline, || false).await else {
        return;
    };
    let reason =
        format!("the server is serving as many connections as it may ({limit}); try again later");
    close_with(ws, CloseCode::Again, reason).await;
}

/// Tells a caller turned away at accept (its address's limit, or as many
/// connections authorizing as may be) why: the WebSocket handshake by
/// `deadline`, then close code 1013 (try again later) with `reason`. It
/// holds no place of the admission; the listener bounds how many such
/// refusals are under way at once.
pub(crate) async fn refuse(
    io: impl Io,
    shared: &Shared,
    deadline: tokio::time::Instant,
    reason: &str,
) {
    let Some((ws, _)) = handshake(io, shared, deadline, || false).await else {
        return;
    };
    close_with(ws, CloseCode::Again, reason.to_owned()).await;
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

/// Serves an authorized connection: reads frames until it ends, then ends
/// everything it started. Its writer writes data frames on `lane`.
async fn serve_authorized<S: Io>(
    (sink, lane): (SplitSink<WebSocketStream<S>, Message>, Lane),
    mut stream: SplitStream<WebSocketStream<S>>,
    shared: Arc<Shared>,
    table: ServerTable,
    identity: Identity,
    number: u64,
) {
    let ended = shared.shutdown.child_token();
    let latency = Some(shared.metrics.relay_latency.clone());
    let (queue, queued) = writer::outlet(
        Box::pin(sink),
        Some(lane.clone()),
        None,
        latency,
        ended.clone(),
    );
    let conn = Conn {
        shared: Arc::clone(&shared),
        outbox: Arc::new(Outbox::new(table, queue, &shared.config.limits)),
        ended: ended.clone(),
        identity,
        number,
        scopes: TaskTracker::new(),
        disregarded: AtomicU64::new(0),
    };
    // Fires when the caller has closed: the writer answers at once, while
    // the connection's runs are still ending, since nothing may be sent
    // after a close anyway.
    let answer_close = CancellationToken::new();
    let writer = tokio::spawn({
        let ended = ended.clone();
        let answer_close = answer_close.clone();
        async move {
            // Otherwise closed by dropping every queue, after the last
            // finish is queued.
            if let Err(error) = write_frames(queued, answer_close).await {
                debug!(%error, "writing to the caller failed");
            }
            // Whatever ended the writer ends the connection.
            ended.cancel();
        }
    });
    let why = read_frames(&conn, &mut stream, (&answer_close, &lane)).await;
    info!(
        why,
        disregarded = conn.disregarded.load(Ordering::Relaxed),
        "connection ending"
    );
    end(conn, writer, stream).await;
    info!("connection closed");
}

/// Reads and dispatches the caller's frames until the connection ends;
/// says why it ended. When the caller closes, nothing more goes on `lane`
/// and the writer answers (`answer_close`).
async fn read_frames<S: Io>(
    conn: &Conn,
    stream: &mut SplitStream<WebSocketStream<S>>,
    (answer_close, lane): (&CancellationToken, &Lane),
) -> &'static str {
    let answers = Arc::new(Semaphore::new(MAX_QUEUED_ANSWERS));
    let mut pings = Pings::new(Instant::now());
    let revoked = revocation(conn);
    tokio::pin!(revoked);
    loop {
        // A place for the answer the next frame may need, before reading it.
        // (The semaphore is never closed: `None` is only the end.)
        let place = tokio::select! {
            place = Arc::clone(&answers).acquire_owned() => place.ok(),
            () = conn.ended.cancelled() => None,
            () = &mut revoked => return revoked_why(conn),
        };
        let Some(place) = place else {
            return ended_why(&conn.shared);
        };
        tokio::select! {
            message = stream.next() => match message {
                Some(Ok(Message::Binary(bytes))) => {
                    if let Err(violation) = dispatch(conn, &bytes, place) {
                        warn!(%violation, "ending the connection");
                        return violation_why(&violation);
                    }
                }
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => {
                    if let Err(flood) = pings.received(Instant::now()) {
                        warn!(%flood, "ending the connection");
                        return "the caller flooded the connection with control frames";
                    }
                }
                Some(Ok(Message::Text(_) | Message::Frame(_))) => {}
                Some(Ok(Message::Close(_))) | None => {
                    lane.peer_closed();
                    answer_close.cancel();
                    return "the caller closed the connection";
                }
                Some(Err(error)) => {
                    if let Some(why) = refused_why(conn, &error) {
                        return why;
                    }
                    debug!(%error, "reading from the caller failed");
                    return read_failed_why(&error);
                }
            },
            () = conn.ended.cancelled() => return ended_why(&conn.shared),
            () = &mut revoked => return revoked_why(conn),
        }
    }
}

/// Resolves once the connection's token has been revoked by a reload and
/// the revocation grace is over; its running loops go on until then, and
/// it opens no new ones (the ledger refuses them).
async fn revocation(conn: &Conn) {
    conn.identity.revocation().cancelled().await;
    let grace = conn.shared.config.revoked_grace;
    warn!(tenant = %conn.identity, ?grace, "the tenant's credential was revoked by a reload: no new run or loop; the connection is closed after the revocation grace");
    tokio::time::sleep(grace).await;
}

/// Counts a connection closed at the end of its revocation grace, and says so.
fn revoked_why(conn: &Conn) -> &'static str {
    conn.shared.metrics.closed.inc(ConnectionClosed::Revoked);
    "the tenant's credential was revoked and the revocation grace is over"
}

/// When reading failed at a wall of the server's (a half-sent message over
/// a memory budget, or idle): logged naming the limit, counted, and why.
fn refused_why(conn: &Conn, error: &WsError) -> Option<&'static str> {
    let WsError::Io(error) = error else {
        return None;
    };
    let refused = half_sent::Refused::of(error)?;
    warn!(tenant = %conn.identity, %refused, "closing the connection");
    Some(match refused {
        half_sent::Refused::Memory(_) => {
            conn.shared
                .metrics
                .closed
                .inc(ConnectionClosed::HalfSentMemory);
            "a half-sent message did not fit the memory budget"
        }
        half_sent::Refused::Idle { .. } => {
            conn.shared
                .metrics
                .closed
                .inc(ConnectionClosed::MessageIdle);
            "a half-sent message made no progress for the message-idle timeout"
        }
    })
}

/// Ends an authorized connection: every scope ends (channels, containers,
/// finishes), the writer sends what is queued and closes, and the caller
/// gets a moment to answer the close.
async fn end<S: Io>(
    conn: Conn,
    mut writer: JoinHandle<()>,
    mut stream: SplitStream<WebSocketStream<S>>,
) {
    // Every scope sees this and ends: channels, containers, finishes.
    conn.ended.cancel();
    conn.scopes.close();
    conn.scopes.wait().await;
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
}

/// Why the connection ended when the caller broke the authorization rules.
fn violation_why(violation: &Violation) -> &'static str {
    match violation {
        Violation::SecondAuthorization { .. } => "a second authorization frame",
        _ => "the caller broke the authorization rules",
    }
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
fn dispatch(conn: &Conn, bytes: &Bytes, place: OwnedSemaphorePermit) -> Result<(), Violation> {
    let frame = match ClientFrame::decode(bytes) {
        Ok(frame) => frame,
        Err(error) => {
            conn.disregard(&error.into());
            return Ok(());
        }
    };
    let mut table = conn.outbox.table();
    match table.received(frame) {
        Serve::Run { scope, request } => {
            let number = scope.scope();
            let (orders, orders_in) = mpsc::unbounded_channel();
            let stop = CancellationToken::new();
            scope.open(Serving {
                stop: stop.clone(),
                orders,
            });
            drop(table);
            let run = Run {
                shared: Arc::clone(&conn.shared),
                ended: conn.ended.clone(),
                identity: conn.identity.clone(),
                connection: conn.number,
                outbox: ScopeOutbox::new(Arc::clone(&conn.outbox), number),
                stop,
            };
            conn.scopes.spawn(scope::serve(run, request, orders_in));
        }
        // Answered by the scope's finish.
        Serve::Stop { slot, .. } => slot.stop.cancel(),
        Serve::RunLoop { channel, request } => {
            // The request's JSON, as the caller's bytes, without a copy.
            let order = Order {
                channel: channel.channel(),
                request: bytes.slice_ref(request.json()),
            };
            // The scope's task is alive while its scope is open.
            let _ = channel.open(()).orders.send(order);
        }
        Serve::BareFinish { frame, why } => {
            if why.is_limit() {
                warn!(why = %Chain(&why), "bare finish");
            } else {
                debug!(why = %Chain(&why), "bare finish");
            }
            conn.outbox
                .queue_held(frame::to_message(&frame), Place::one(place), None);
        }
        Serve::Disregarded(why) => conn.disregard(&why),
        Serve::Violation(why) => return Err(why),
        // The authorization was the first frame; the server opens no
        // channels of its own, so none is answered.
        Serve::Authorization(_) | Serve::ChannelResponse { .. } | Serve::ChannelFinished(_) => {}
    }
    Ok(())
}
