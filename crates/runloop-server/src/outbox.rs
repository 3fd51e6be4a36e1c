//! A connection's outbox: its table of open scopes and channels, and the
//! queue to its writer, behind one lock — the only way a frame of the
//! connection goes out.
//!
//! The connection's reader opens numbers in the table; its scopes and relays
//! answer through handles that can only write their own scope's or their
//! own channel's frames ([`ScopeOutbox`], [`ChannelOutbox`]), handed down to
//! them, so no task below the connection reaches back into it.
//!
//! The table is the single source of truth for which numbers are taken. A
//! number is freed under the lock *before* its finish is queued, and frames
//! are queued in order, so when the caller sees a finish and reuses the
//! number, the reader already sees it free. The same lock keeps a scope's
//! finish behind every frame of its channels: a channel's last response and
//! its finish go out only while the table holds the channel open, and the
//! scope's finish ends every channel still open in it first.

use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use bytes::Bytes;
use runloop_proto::agents_run::RunResponse;
use runloop_proto::connection::{Table, side};
use runloop_proto::frame::{self, FrameType, ServerFrame};
use runloop_proto::run_loop::{Finish, Sender};
use runloop_proto::{Encode, ErrorValue};
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use super::places::{self, Places};
use runloop_wire::limits::Limits;
use runloop_wire::writer::{Direct, FrameBytes, Outgoing, Place, Queue};

/// A run-loop channel request, handed from the connection to its scope.
#[derive(Debug)]
pub(crate) struct Order {
    /// The client's channel number.
    pub(crate) channel: u32,
    /// The request's JSON, as the caller sent it.
    pub(crate) request: Bytes,
}

/// What the table keeps for an open scope: how to reach its run.
#[derive(Debug)]
pub(crate) struct Serving {
    /// Fired by a stop.
    pub(crate) stop: CancellationToken,
    /// Run-loop requests for the run to serve.
    pub(crate) orders: mpsc::UnboundedSender<Order>,
}

/// The server's table: a [`Serving`] per scope; a channel needs nothing
/// but its number.
pub(crate) type ServerTable = Table<side::Server, Serving, ()>;

/// The table and the writer's queue of one connection, and the byte
/// places of its channels' responses ([`places`]).
#[derive(Debug)]
pub(crate) struct Outbox {
    table: Mutex<ServerTable>,
    queue: Queue,
    places: Arc<Semaphore>,
}

impl Outbox {
    pub(crate) fn new(table: ServerTable, queue: Queue, limits: &Limits) -> Self {
        Outbox {
            table: Mutex::new(table),
            queue,
            places: places::connection(limits),
        }
    }

    /// The table, locked: frames queued while it is held go out in order
    /// with what it says.
    pub(crate) fn table(&self) -> MutexGuard<'_, ServerTable> {
        // A panic while holding the lock cannot leave the table half-written
        // in a way that matters more than losing the connection would.
        self.table
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Queues a frame that holds a place (of a channel's responses, or of
    /// the reader's answers) until the writer has taken it; `relayed_at`
    /// when it carries a proxy's message that came then.
    pub(crate) fn queue_held(&self, message: Vec<u8>, place: Place, relayed_at: Option<Instant>) {
        self.queue.put(Outgoing::data(
            FrameBytes::whole(message),
            place,
            relayed_at,
        ));
    }

    fn queue(&self, message: Vec<u8>) {
        self.queue.put(Outgoing::control(message));
    }

    fn queue_frame(&self, frame: &ServerFrame<'_>) {
        self.queue(frame::to_message(frame));
    }
}

/// What one scope's run may send: its main-stream response and its finish,
/// and, through [`channel`](Self::channel), its channels' frames.
#[derive(Debug, Clone)]
pub(crate) struct ScopeOutbox {
    outbox: Arc<Outbox>,
    scope: u32,
}

impl ScopeOutbox {
    pub(crate) fn new(outbox: Arc<Outbox>, scope: u32) -> Self {
        ScopeOutbox { outbox, scope }
    }

    /// The scope number.
    pub(crate) fn scope(&self) -> u32 {
        self.scope
    }

    /// Queues a main-stream response, if the scope is still open.
    pub(crate) fn respond(&self, response: &RunResponse) {
        let message = frame::build(
            FrameType::Response,
            self.scope,
            0,
            response.size_hint(),
            |out| response.encode(out),
        );
        let table = self.outbox.table();
        if let Ok(message) = message
            && table.is_open(self.scope)
        {
            self.outbox.queue(message);
        }
    }

    /// Ends the scope: every channel still open in it (asked for too late to
    /// be served) ends with `error`, then the scope's finish frees the scope
    /// and all its numbers. Under the table's lock, so no channel can open
    /// in between.
    pub(crate) fn finish(&self, error: &ErrorValue) {
        let mut table = self.outbox.table();
        let Some(finished) = table.finish_scope(self.scope) else {
            return;
        };
        for ended in finished.channels {
            let error = frame::build(
                FrameType::ChannelResponse,
                self.scope,
                ended.channel,
                64,
                |out| {
                    let Finish { .. } = Sender::new().error(error, out).finish();
                    Ok::<(), Infallible>(())
                },
            );
            let Ok(error) = error;
            self.outbox.queue(error);
            self.outbox
                .queue_frame(&ServerFrame::ChannelResponseFinish {
                    scope: self.scope,
                    channel: ended.channel,
                });
        }
        self.outbox
            .queue_frame(&ServerFrame::ResponseFinish { scope: self.scope });
    }

    /// What the client's `channel` of this scope may send.
    pub(crate) fn channel(&self, channel: u32) -> ChannelOutbox {
        ChannelOutbox {
            outbox: Arc::clone(&self.outbox),
            scope: self.scope,
            channel,
        }
    }
}

/// What one run-loop channel's relay may send: its responses and its finish.
#[derive(Debug)]
pub(crate) struct ChannelOutbox {
    outbox: Arc<Outbox>,
    scope: u32,
    channel: u32,
}

impl ChannelOutbox {
    /// The scope number.
    pub(crate) fn scope(&self) -> u32 {
        self.scope
    }

    /// The channel number.
    pub(crate) fn channel(&self) -> u32 {
        self.channel
    }

    /// The channel's places under `limits`, among its connection's.
    pub(crate) fn places(&self, limits: &Limits) -> Places {
        Places::new(limits, Arc::clone(&self.outbox.places))
    }

    /// A response that holds its queue places until the writer has taken
    /// it, for [`respond_all`](Self::respond_all).
    /// `relayed_at`: when the proxy's message came, for the relay's latency.
    /// The payload is not copied: the frame holds it beside its header.
    pub(crate) fn response(&self, payload: &Bytes, place: Place, relayed_at: Instant) -> Outgoing {
        let frame = FrameBytes::apart(self.message(&[]).into(), payload.clone());
        Outgoing::data(frame, place, Some(relayed_at))
    }

    /// The connection's socket, to write responses to it itself, if no one
    /// else is writing and nothing is queued ([`Queue::direct`]).
    pub(crate) fn direct(&self) -> Option<Direct<'_>> {
        self.outbox.queue.direct()
    }

    /// Queues responses, in order, at once. Not checked against the table:
    /// the scope finishes only after its relays have ended.
    pub(crate) fn respond_all(&self, responses: Vec<Outgoing>) {
        self.outbox.queue.put_all(responses);
    }

    /// Queues the channel's last response, if the channel is still open.
    pub(crate) fn respond_last(&self, payload: &[u8]) {
        let table = self.outbox.table();
        if table.is_serving(self.scope, self.channel) {
            self.outbox.queue(self.message(payload));
        }
    }

    /// Frees the channel, then queues its finish; the [`Finish`] proves its
    /// sequence is complete. Nothing, if its scope's finish has ended it.
    pub(crate) fn finish(self, _complete: Finish) {
        let mut table = self.outbox.table();
        if table.finish_channel(self.scope, self.channel).is_some() {
            self.outbox
                .queue_frame(&ServerFrame::ChannelResponseFinish {
                    scope: self.scope,
                    channel: self.channel,
                });
        }
    }

    /// A response's frame.
    pub(crate) fn message(&self, payload: &[u8]) -> Vec<u8> {
        frame::to_message(&ServerFrame::ChannelResponse {
            scope: self.scope,
            channel: self.channel,
            payload,
        })
    }
}
