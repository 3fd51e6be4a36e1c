//! The framed connection's shared parts: limits, and the writer that owns
//! the sending half of a WebSocket.
//!
//! Both ends of a connection (the provider's server and the caller's
//! client) send from many tasks at once — one per scope, one per channel —
//! over one socket. Instead of sharing the socket behind a lock, every task
//! hands complete frames to an outbox, and one writer task per
//! connection feeds them to the socket in order. The writer writes every
//! frame that is ready before it flushes once, so a busy connection pays one
//! system call for many frames, and an idle one still sends each frame at
//! once.
//!
//! Memory stays bounded without making the outbox itself bounded (which
//! could deadlock tasks that must send a finish): a frame that carries loop
//! data travels with a permit from its channel's semaphore, released only
//! when the writer has taken the frame. A channel with `max_queued_responses`
//! frames waiting cannot produce another, so a caller that reads slowly slows
//! the relay's read from the proxy instead of growing a buffer. Control
//! frames (finishes, main-stream responses) need no permit; there are at most
//! a few per scope or channel, and those are bounded by the limits below.

use std::sync::Arc;

use bytes::Bytes;
use futures_util::{Sink, SinkExt};
use runloop_proto::frame::Role;
use tokio::sync::{OwnedSemaphorePermit, mpsc};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_util::sync::CancellationToken;

/// How much one connection may hold. All of them are configurable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest WebSocket message (one frame), bytes. A larger message ends
    /// the connection with close code 1009: it is a resource bound, and the
    /// WebSocket layer cannot skip a message it has refused to buffer.
    pub max_message_size: usize,
    /// Open scopes per connection. A request past the limit gets a bare
    /// finish ("received, not served").
    pub max_scopes: usize,
    /// Open client channels per scope. A channel request past the limit
    /// gets a bare channel finish.
    pub max_channels: usize,
    /// Channel responses one channel may have queued for the socket before
    /// its producer waits.
    pub max_queued_responses: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_message_size: 16 << 20,
            max_scopes: 256,
            max_channels: 64,
            max_queued_responses: 32,
        }
    }
}

/// How much tungstenite reads from the socket at once. Its default
/// (128 KiB) is zero-filled before every read, which for a stream of small
/// chunks costs more than the read itself; a larger message simply takes
/// several reads.
const READ_BUFFER: usize = 16 << 10;

impl Limits {
    /// The WebSocket configuration these limits imply.
    pub fn websocket(&self) -> WebSocketConfig {
        WebSocketConfig::default()
            .read_buffer_size(READ_BUFFER)
            .max_message_size(Some(self.max_message_size))
            .max_frame_size(Some(self.max_message_size))
    }
}

/// Sees every frame of a connection, in both directions, as its bytes.
///
/// The client calls it for each message it writes ([`Role::Client`]) and
/// each binary message it reads ([`Role::Server`]); `runloop run --capture`
/// records a connection this way.
pub type Tap = Arc<dyn Fn(Role, &[u8]) + Send + Sync>;

/// A frame on its way to the socket.
#[derive(Debug)]
pub(crate) struct Outgoing {
    message: Bytes,
    /// Held until the writer has taken the frame; see the module docs.
    _permit: Option<OwnedSemaphorePermit>,
}

impl Outgoing {
    /// A control frame: a finish or a main-stream response.
    pub(crate) fn control(message: Vec<u8>) -> Self {
        Outgoing {
            message: Bytes::from(message),
            _permit: None,
        }
    }

    /// A data frame that holds one of its channel's queue places.
    pub(crate) fn data(message: Vec<u8>, permit: OwnedSemaphorePermit) -> Self {
        Outgoing {
            message: Bytes::from(message),
            _permit: Some(permit),
        }
    }
}

/// Where tasks put frames for the writer.
pub(crate) type Outbox = mpsc::UnboundedSender<Outgoing>;

/// How many ready frames the writer takes before it flushes.
const BATCH: usize = 64;

/// Feeds frames to the socket until every [`Outbox`] is dropped or `close`
/// fires, then closes the WebSocket. Returns the error that ended it early.
/// A tap sees each frame as sent by `local`.
pub(crate) async fn write_frames<S>(
    mut sink: S,
    mut outbox: mpsc::UnboundedReceiver<Outgoing>,
    close: CancellationToken,
    tap: Option<(Tap, Role)>,
) -> Result<(), WsError>
where
    S: Sink<Message, Error = WsError> + Unpin,
{
    loop {
        let first = tokio::select! {
            biased;
            next = outbox.recv() => next,
            () = close.cancelled() => None,
        };
        let Some(first) = first else { break };
        feed(&mut sink, first, tap.as_ref()).await?;
        for _ in 1..BATCH {
            match outbox.try_recv() {
                Ok(next) => feed(&mut sink, next, tap.as_ref()).await?,
                Err(_) => break,
            }
        }
        sink.flush().await?;
    }
    sink.close().await
}

async fn feed<S>(sink: &mut S, outgoing: Outgoing, tap: Option<&(Tap, Role)>) -> Result<(), WsError>
where
    S: Sink<Message, Error = WsError> + Unpin,
{
    if let Some((tap, local)) = tap {
        tap(*local, &outgoing.message);
    }
    sink.feed(Message::Binary(outgoing.message)).await
}
