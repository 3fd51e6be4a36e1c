//! The writer: the one task per framed connection that owns the sending
//! half of its WebSocket, and how long a close may take.
//!
//! Both ends of a connection (the provider's server and the caller's
//! client) send from many tasks at once — one per scope, one per channel —
//! over one socket. Instead of sharing the socket behind a lock, every task
//! hands complete frames to the connection's [`Queue`], and one writer task
//! per connection feeds them to the socket in order. The writer writes every
//! frame that is ready before it flushes once, so a busy connection pays one
//! system call for many frames, and an idle one still sends each frame at
//! once.
//!
//! Memory stays bounded without making the queue itself bounded (which
//! could deadlock tasks that must send a finish): a frame that carries loop
//! data travels with its [`Place`] (permits of its channel's and its
//! connection's semaphores), released only when the writer has taken the
//! frame. A channel whose places are taken (`max_queued_responses`,
//! `max_queued_bytes`, `max_connection_queued_bytes`) cannot produce
//! another, so a caller that reads slowly slows the relay's read from the
//! proxy instead of growing a buffer. Control
//! frames (finishes, main-stream responses) need no permit; there are at most
//! a few per scope or channel, and those are bounded by the connection's
//! [`Limits`](crate::limits::Limits).
//!
//! Both ends close on purpose with a close handshake (protocol §12 "Clean
//! ends"): the writer's last act is a close frame, or the answer to the
//! peer's, and the side that closed first waits for the answer, for
//! [`CLOSE_GRACE`] at most, before it lets the socket go. A socket dropped
//! without one reads to the other side as a connection that broke.

use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{Sink, SinkExt};
use runloop_proto::frame::Role;
use tokio::sync::{OwnedSemaphorePermit, mpsc};
use tokio_tungstenite::tungstenite::error::ProtocolError;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_util::sync::CancellationToken;

use crate::client::Tap;
use crate::metrics::Histogram;

/// How long a side that closes waits for the other side's close answer
/// before it lets the socket go anyway. An answer takes one round trip.
pub(crate) const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// The queue places a frame holds until the writer has taken it: one
/// semaphore's permits, or two's.
#[derive(Debug)]
pub(crate) struct Place {
    _first: OwnedSemaphorePermit,
    _second: Option<OwnedSemaphorePermit>,
}

impl Place {
    /// Places of one semaphore.
    pub(crate) fn one(permit: OwnedSemaphorePermit) -> Place {
        Place {
            _first: permit,
            _second: None,
        }
    }

    /// Places of two semaphores.
    pub(crate) fn two(first: OwnedSemaphorePermit, second: OwnedSemaphorePermit) -> Place {
        Place {
            _first: first,
            _second: Some(second),
        }
    }
}

/// A frame on its way to the socket.
#[derive(Debug)]
pub(crate) struct Outgoing {
    message: Bytes,
    /// Held until the writer has taken the frame; see the module docs.
    _place: Option<Place>,
    /// When the relayed message it carries came from the proxy, for the
    /// relay's latency ([`write_frames`]'s histogram).
    relayed_at: Option<Instant>,
}

impl Outgoing {
    /// A control frame: a finish or a main-stream response.
    pub(crate) fn control(message: Vec<u8>) -> Self {
        Outgoing {
            message: Bytes::from(message),
            _place: None,
            relayed_at: None,
        }
    }

    /// A data frame that holds its queue places; `relayed_at` when it
    /// carries a proxy's message that came then.
    pub(crate) fn data(message: Vec<u8>, place: Place, relayed_at: Option<Instant>) -> Self {
        Outgoing {
            message: Bytes::from(message),
            _place: Some(place),
            relayed_at,
        }
    }
}

/// Where tasks put frames for the writer.
pub(crate) type Queue = mpsc::UnboundedSender<Outgoing>;

/// How many ready frames the writer takes before it flushes: enough that
/// a busy connection pays one flush for many small frames (the WebSocket
/// layer writes to the socket on its own whenever its buffer fills).
const BATCH: usize = 1024;

/// Feeds frames to the socket until every [`Queue`] is dropped or `close`
/// fires, then closes the WebSocket: a close frame, or the answer to the
/// peer's close if it closed first (frames still queued then are dropped:
/// nothing may follow a close). Returns the error that ended it early.
/// A tap sees each frame as sent by `local`. `latency`, when given, gets
/// for each relayed frame the time from its proxy message to the flush
/// that wrote it to the socket: one clock read and one add to the sum per
/// batch, one add to a bucket per frame.
pub(crate) async fn write_frames<S>(
    mut sink: S,
    mut queue: mpsc::UnboundedReceiver<Outgoing>,
    close: CancellationToken,
    tap: Option<(Tap, Role)>,
    latency: Option<Histogram>,
) -> Result<(), WsError>
where
    S: Sink<Message, Error = WsError> + Unpin,
{
    let mut writer = Batch {
        tap: tap.as_ref(),
        latency: latency.as_ref(),
        relayed: [None; BATCH],
        count: 0,
    };
    match write_until_closing(&mut sink, &mut queue, &close, &mut writer).await {
        Ok(()) | Err(WsError::Protocol(ProtocolError::SendAfterClosing)) => sink.close().await,
        Err(error) => Err(error),
    }
}

/// One batch of frames between two flushes, and what is noted of it.
struct Batch<'a> {
    tap: Option<&'a (Tap, Role)>,
    latency: Option<&'a Histogram>,
    /// When the relayed frames of the batch came from their proxies.
    relayed: [Option<Instant>; BATCH],
    count: usize,
}

impl Batch<'_> {
    async fn feed<S>(&mut self, sink: &mut S, outgoing: Outgoing) -> Result<(), WsError>
    where
        S: Sink<Message, Error = WsError> + Unpin,
    {
        if let Some((tap, local)) = self.tap {
            tap(*local, &outgoing.message);
        }
        if self.latency.is_some() && outgoing.relayed_at.is_some() {
            self.relayed[self.count] = outgoing.relayed_at;
            self.count += 1;
        }
        sink.feed(Message::Binary(outgoing.message)).await
    }

    /// After the flush: each relayed frame's latency.
    fn flushed(&mut self) {
        if let Some(latency) = self.latency
            && self.count > 0
        {
            let now = Instant::now();
            latency.observe_all(
                self.relayed[..self.count]
                    .iter()
                    .flatten()
                    .map(|relayed_at| now.saturating_duration_since(*relayed_at)),
            );
        }
        self.count = 0;
    }
}

async fn write_until_closing<S>(
    sink: &mut S,
    queue: &mut mpsc::UnboundedReceiver<Outgoing>,
    close: &CancellationToken,
    batch: &mut Batch<'_>,
) -> Result<(), WsError>
where
    S: Sink<Message, Error = WsError> + Unpin,
{
    loop {
        let first = tokio::select! {
            biased;
            next = queue.recv() => next,
            () = close.cancelled() => None,
        };
        let Some(first) = first else {
            return Ok(());
        };
        batch.feed(sink, first).await?;
        for _ in 1..BATCH {
            match queue.try_recv() {
                Ok(next) => batch.feed(sink, next).await?,
                Err(_) => break,
            }
        }
        sink.flush().await?;
        batch.flushed();
    }
}
