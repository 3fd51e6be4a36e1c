//! The client's connection: its table of open scopes and channels, the task
//! that reads the server's frames and routes each where the table says,
//! and the end of it all.
//!
//! ```text
//! server frame ──▶ table (protocol §2) ──▶ main-stream response ──▶ the run's start
//!                                      ──▶ channel response     ──▶ the loop's queue
//!                                      ──▶ finishes             ──▶ the run's end, the loop's end
//!                                      ──▶ a server's channel   ──▶ bare finish
//! ```
//!
//! Handles ([`Client`](super::Client), [`Run`](super::Run)) reach the
//! connection only through the methods here, each of which takes a number
//! and queues its frame under the table's lock: the frames go out in the
//! order the table saw them.
//!
//! A routed response waits while its loop's queue is full, outside the
//! lock: a loop that is not read holds up the reading, never the table.
//! It waits for half the queue to be free, so that a slow reader wakes the
//! reading task once per half a queue, not once per response.

use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use futures_util::StreamExt;
use runloop_proto::agents_run::{RunResponse, RunResponseError};
use runloop_proto::channel::ChannelRequest;
use runloop_proto::connection::{Finished, Route, Table, Violation, side};
use runloop_proto::error_chain::Chain;
use runloop_proto::frame::{self, ClientFrame, Role, ServerFrame};
use runloop_proto::run_loop::{Broken, RunLoopRequest};
use runloop_proto::{Decode, Encode, ErrorValue};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::{RunError, Tap};
use runloop_wire::limits::Limits;
use runloop_wire::writer::{CLOSE_GRACE, Outgoing, Queue};

/// What the client keeps for an open scope.
#[derive(Debug)]
struct Scope {
    /// Waiting for the first main-stream response; `None` once it came.
    starting: Option<oneshot::Sender<Started>>,
    /// Fires when the run ends.
    ended: CancellationToken,
}

/// The client's table: a [`Scope`] per scope, a loop's queue per channel.
type ClientTable = Table<side::Client, Scope, mpsc::Sender<ChannelEvent>>;

/// The first thing a run's main stream said.
#[derive(Debug)]
pub(super) enum Started {
    Id(String),
    Refused(ErrorValue),
    NotServed,
    Broken(RunResponseError),
}

/// What a loop's queue carries.
#[derive(Debug)]
pub(super) enum ChannelEvent {
    Response(Bytes),
    Finish,
    RunEnded,
}

/// How a connection ended, as this side saw it: what a run that got no
/// answer is told, so that each fault is named as what it is (a refused
/// credential only when the server closed the way a refusal does).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Ending {
    /// The server closed the connection with a close handshake, and said
    /// nothing more (a refusal's shape, close code 1008 before any frame,
    /// is [`RunError::CredentialRefused`]).
    #[error("the server closed it (close code {code})")]
    Closed {
        /// The WebSocket close code.
        code: u16,
    },
    /// The connection broke without a close handshake: the server's
    /// process stopped (a crash, a kill), or something on the way cut it.
    #[error("it broke with no close handshake (did the server stop?): {0}")]
    Broke(String),
    /// The server sent a message larger than this client's
    /// `max_message_size`, which the WebSocket layer cannot skip.
    #[error(
        "the server sent a message of {size} bytes, over this client's max_message_size of {limit} bytes"
    )]
    TooLarge {
        /// The message's size, as far as it was read.
        size: usize,
        /// This client's limit.
        limit: usize,
    },
    /// The server sent what is not a WebSocket message (a torn or
    /// malformed frame), so the connection could not go on.
    #[error("the server sent what is not a WebSocket message: {0}")]
    Unreadable(String),
    /// The server broke the protocol's connection rules (the violation,
    /// its source, says which), so this side ended the connection.
    #[error("the server broke the protocol, and this client ended the connection")]
    Violation(#[source] Violation),
    /// This side closed the connection ([`Client::close`](super::Client::close),
    /// or its last handle dropped), or could no longer write to it.
    #[error("this client closed it")]
    ClosedHere,
}

impl Ending {
    /// How a read that failed with `error` ended the connection.
    fn of(error: &WsError) -> Ending {
        use tokio_tungstenite::tungstenite::error::{CapacityError, ProtocolError};
        match error {
            WsError::Capacity(CapacityError::MessageTooLong { size, max_size }) => {
                Ending::TooLarge {
                    size: *size,
                    limit: *max_size,
                }
            }
            WsError::Protocol(ProtocolError::ResetWithoutClosingHandshake) | WsError::Io(_) => {
                Ending::Broke(error.to_string())
            }
            WsError::Capacity(_) | WsError::Protocol(_) | WsError::Utf8(_) => {
                Ending::Unreadable(error.to_string())
            }
            other => Ending::Broke(other.to_string()),
        }
    }
}

/// The table and what is known about the connection as a whole.
#[derive(Debug)]
struct State {
    table: ClientTable,
    /// Whether any message has come from the server (one that did not
    /// decode included: a server that sent it did not refuse in silence).
    answered: bool,
    /// Whether the authorization carried a credential (not an empty one).
    credential: bool,
    /// Whether the reading task has stopped.
    closed: bool,
    /// The server's close frame (code and reason), when it sent one.
    closed_with: Option<(u16, String)>,
    /// How the connection ended otherwise, when it has.
    ending: Option<Ending>,
}

/// The close code of a refusal at authorization: policy (protocol §3 says
/// no frame; the server closes with this code and no reason).
const REFUSAL_CODE: u16 = 1008;

impl State {
    /// Why a run cannot start (or did not) on a connection that is over.
    fn ended(&self) -> RunError {
        match &self.closed_with {
            Some((REFUSAL_CODE, reason)) if reason.is_empty() && !self.answered => {
                if self.credential {
                    RunError::CredentialRefused
                } else {
                    RunError::NoCredential
                }
            }
            Some((code, reason)) if !reason.is_empty() => RunError::Closed {
                code: *code,
                reason: reason.clone(),
            },
            Some((code, _)) => RunError::ConnectionEnded(Ending::Closed { code: *code }),
            None => RunError::ConnectionEnded(self.ending.clone().unwrap_or(Ending::ClosedHere)),
        }
    }

    /// Keeps the first thing known about the connection's end.
    fn ending(&mut self, ending: Ending) {
        if self.closed_with.is_none() && self.ending.is_none() {
            self.ending = Some(ending);
        }
    }
}

/// What the client's handles and its tasks share.
#[derive(Debug)]
pub(super) struct Shared {
    state: Mutex<State>,
    queue: Queue,
    limits: Limits,
    /// Fires when the connection is over.
    closed: CancellationToken,
}

impl Shared {
    /// The shared state of a connection whose authorization carried a
    /// credential, or (`credential` false) an empty one.
    pub(super) fn new(queue: Queue, limits: Limits, credential: bool) -> Self {
        Shared {
            state: Mutex::new(State {
                table: Table::client(),
                answered: false,
                credential,
                closed: false,
                closed_with: None,
                ending: None,
            }),
            queue,
            limits,
            closed: CancellationToken::new(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn send(&self, frame: &ClientFrame<'_>) {
        // After the connection ends, frames have nowhere to go.
        self.queue.put(Outgoing::control(frame::to_message(frame)));
    }

    /// Takes a scope for a run request whose endpoint tag and request are
    /// `payload`, and sends it; `started` hears the run's first answer.
    pub(super) fn request(
        &self,
        payload: &[u8],
        started: oneshot::Sender<Started>,
        ended: CancellationToken,
    ) -> Result<u32, RunError> {
        let mut state = self.state();
        if state.closed {
            return Err(state.ended());
        }
        let scope = state.table.open_scope(Scope {
            starting: Some(started),
            ended,
        });
        self.send(&ClientFrame::Request { scope, payload });
        Ok(scope)
    }

    /// Why the connection ended, for a run that got no answer.
    pub(super) fn ended(&self) -> RunError {
        self.state().ended()
    }

    /// Takes a channel of `scope` for a loop, and sends its request; the
    /// loop's responses come on the receiver. Why not, when the run or the
    /// connection has ended.
    pub(super) fn open_loop(
        &self,
        scope: u32,
        request: &RunLoopRequest<'_>,
    ) -> Result<(u32, mpsc::Receiver<ChannelEvent>), Broken> {
        let mut state = self.state();
        let (events, events_in) = mpsc::channel(self.limits.max_queued_responses);
        let Some(channel) = state.table.open_channel(scope, events) else {
            return Err(if state.closed {
                Broken::ConnectionEnded
            } else {
                Broken::RunEnded
            });
        };
        let Ok(payload) = ChannelRequest::RunLoop(request.clone()).to_vec();
        self.send(&ClientFrame::ChannelRequest {
            scope,
            channel,
            payload: &payload,
        });
        Ok((channel, events_in))
    }

    /// Opens a stop channel on `scope` if it is still open; the scope's
    /// finish answers it.
    pub(super) fn stop(&self, scope: u32) {
        let mut state = self.state();
        let Some(channel) = state.table.open_stop(scope) else {
            return;
        };
        let Ok(payload) = ChannelRequest::Stop.to_vec();
        self.send(&ClientFrame::ChannelRequest {
            scope,
            channel,
            payload: &payload,
        });
    }

    /// Whether the connection is over.
    pub(super) fn is_closed(&self) -> bool {
        self.closed.is_cancelled()
    }

    /// Resolves when the connection is over.
    pub(super) async fn closed(&self) {
        self.closed.cancelled().await;
    }
}

/// The connection, held by every handle: when the last one goes, it closes.
#[derive(Debug)]
pub(super) struct Connection {
    pub(super) shared: Arc<Shared>,
    pub(super) close: CancellationToken,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.close.cancel();
    }
}

/// The writer task, and the token it fires when it is done.
pub(super) type Writer = (JoinHandle<()>, CancellationToken);

/// The client's side of the connection from its authorization to its end:
/// routes server frames until the server ends the connection, the writer
/// fails or `close` fires; then ends every run and loop, has the writer
/// close (or answer the server's close), and waits for the handshake to
/// complete — the server's answer, or the end of a connection it closed —
/// for [`CLOSE_GRACE`] at most.
pub(super) async fn serve<S>(
    shared: Arc<Shared>,
    mut stream: S,
    tap: Option<Tap>,
    close: CancellationToken,
    (mut writer, writer_done): Writer,
) where
    S: futures_util::Stream<Item = Result<Message, WsError>> + Unpin,
{
    tokio::select! {
        () = read_frames(&shared, &mut stream, tap) => {}
        () = close.cancelled() => shared.state().ending(Ending::ClosedHere),
        () = writer_done.cancelled() => shared.state().ending(Ending::Broke(
            "writing to the server failed".to_owned(),
        )),
    }
    end(&shared);
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
                debug!(?frame, "the server closed the connection");
                // A close frame with no code is read as 1005 (no status).
                let (code, reason) = frame.map_or((1005, String::new()), |frame| {
                    (frame.code.into(), frame.reason.to_string())
                });
                shared.state().closed_with = Some((code, reason));
                return;
            }
            Err(error) => {
                debug!(%error, "reading from the server failed");
                shared.state().ending(Ending::of(&error));
                return;
            }
        };
        if let Some(tap) = &tap {
            tap(Role::Server, &bytes);
        }
        match route(shared, &bytes) {
            Ok(Some(delivery)) => delivery.deliver().await,
            Ok(None) => {}
            Err(why) => {
                shared.state().ending(Ending::Violation(why));
                return;
            }
        }
    }
    shared.state().ending(Ending::Broke(
        "the stream ended without a close frame".to_owned(),
    ));
}

/// Where a routed frame still has to go once the table is unlocked: a
/// loop's queue may be full, and waiting for it is backpressure.
enum Delivery {
    /// One event for one loop.
    Loop(mpsc::Sender<ChannelEvent>, ChannelEvent),
    /// The run ended: every loop still open in it hears so.
    RunEnded(Vec<mpsc::Sender<ChannelEvent>>),
}

impl Delivery {
    async fn deliver(self) {
        match self {
            Delivery::Loop(events, event) => deliver_to_loop(&events, event).await,
            Delivery::RunEnded(loops) => {
                for events in loops {
                    let _ = events.send(ChannelEvent::RunEnded).await;
                }
            }
        }
    }
}

/// Queues `event` for its loop. When the queue is full, the reading task
/// waits until half of it is free, not one place: a loop read more slowly
/// than the server sends (a caller in Python) would otherwise wake the
/// reading task, and the thread it sleeps on, once per event it takes.
async fn deliver_to_loop(events: &mpsc::Sender<ChannelEvent>, event: ChannelEvent) {
    let event = match events.try_send(event) {
        Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => return,
        Err(mpsc::error::TrySendError::Full(event)) => event,
    };
    let room = (events.max_capacity() / 2).max(1);
    // The places not used go back to the queue when `permits` is dropped.
    if let Ok(mut permits) = events.reserve_many(room).await
        && let Some(permit) = permits.next()
    {
        permit.send(event);
    }
}

/// Applies one server frame to the table, and says what is left to deliver.
/// `Err` ends the connection (a violation).
fn route(shared: &Shared, bytes: &Bytes) -> Result<Option<Delivery>, Violation> {
    let mut state = shared.state();
    state.answered = true;
    let frame = match ServerFrame::decode(bytes) {
        Ok(frame) => frame,
        Err(error) => {
            debug!(%error, "disregarded a malformed frame");
            return Ok(None);
        }
    };
    Ok(match state.table.received(frame) {
        Route::Response {
            scope,
            slot,
            payload,
        } => {
            main_response(scope, slot, payload);
            None
        }
        Route::Finished(Finished { slot, channels, .. }) => {
            if let Some(started) = slot.starting {
                let _ = started.send(Started::NotServed);
            }
            slot.ended.cancel();
            Some(Delivery::RunEnded(
                channels.into_iter().map(|ended| ended.slot).collect(),
            ))
        }
        Route::ChannelResponse { slot, payload, .. } => Some(Delivery::Loop(
            slot.clone(),
            ChannelEvent::Response(bytes.slice_ref(payload)),
        )),
        Route::ChannelFinished(ended) => Some(Delivery::Loop(ended.slot, ChannelEvent::Finish)),
        Route::BareFinish { frame, why } => {
            debug!(why = %Chain(&why), "bare finish");
            shared.send(&frame);
            None
        }
        Route::Disregarded(why) => {
            debug!(why = %Chain(&why), "disregarded");
            None
        }
        Route::Violation(why) => {
            warn!(why = %Chain(&why), "ending the connection");
            return Err(why);
        }
    })
}

/// A response on a run's main stream: the first says how the run started;
/// after it, nothing but the finish may come (protocol §5).
fn main_response(scope: u32, slot: &mut Scope, payload: &[u8]) {
    let Some(started) = slot.starting.take() else {
        return warn!(
            scope,
            "the server sent a second main-stream response; disregarded"
        );
    };
    let answer = match RunResponse::decode(payload) {
        Ok(RunResponse::Id(id)) => Started::Id(id),
        Ok(RunResponse::Error(error)) => Started::Refused(error),
        Err(error) => Started::Broken(error),
    };
    let _ = started.send(answer);
}

/// The connection is ending: every run and loop learns it, and no new one
/// can start.
fn end(shared: &Shared) {
    let ending = {
        let mut state = shared.state();
        state.closed = true;
        state.table.end()
    };
    for (_, scope) in ending.scopes {
        scope.ended.cancel();
    }
    // Dropping the queues ends every loop: `Broken(ConnectionEnded)`.
    drop(ending.channels);
}
