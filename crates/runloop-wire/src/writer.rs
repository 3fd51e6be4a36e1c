//! The writer: how the tasks of one framed connection share the sending
//! half of its WebSocket, and how long a close may take.
//!
//! Both ends of a connection (the provider's server and the caller's
//! client) send from many tasks at once — one per scope, one per channel —
//! over one socket. The socket's sending half sits in the connection's
//! [`Outlet`], behind one lock, with the connection's [`Queue`] in front of
//! it:
//!
//! - A task that cannot wait puts complete frames on the queue, and the
//!   connection's writer task ([`write_frames`]) takes the socket, feeds it
//!   every frame that is ready and flushes once: a busy connection pays one
//!   system call for many frames, an idle one still sends each frame at once.
//! - A relay whose proxy has messages ready may instead take the socket
//!   itself ([`Queue::direct`]) — only while nothing is queued, so frames
//!   still go out in the order they were made — and feed it what its proxy
//!   has ready before it flushes, as a plain forwarder would: no hand-over
//!   to another task, no wake-up, no queue places. A full socket then holds
//!   the relay itself, which stops reading its proxy.
//!
//! Memory stays bounded without making the queue itself bounded (which
//! could deadlock tasks that must send a finish): a frame that carries loop
//! data travels with its [`Place`] (permits of its channel's and its
//! connection's semaphores), released only when the writer has taken the
//! frame. A channel whose places are taken (`max_queued_responses`,
//! `max_queued_bytes`, `max_connection_queued_bytes`) cannot produce
//! another, so a caller that reads slowly slows the relay's read from the
//! proxy instead of growing a buffer. A relay that writes itself holds the
//! socket for at most as much as its places would let it queue. Control
//! frames (finishes, main-stream responses) need no permit; there are at most
//! a few per scope or channel, and those are bounded by the connection's
//! [`Limits`](crate::limits::Limits).
//!
//! A frame larger than [`FRAGMENT`] goes to the socket as WebSocket
//! fragments cut from its own bytes ([`FrameBytes`]): the relay hands on a
//! proxy's message as it was read, and the WebSocket's write buffer holds
//! one fragment of it at a time, not a copy of the whole (which it would
//! keep, at that capacity, for the connection's life). Another frame can
//! come only after the last fragment, as one that was written whole.
//!
//! On the server, data frames do not go through the WebSocket at all but
//! on the connection's [`Lane`]: the frame header and the payload are
//! written from their own bytes, in one vectored write per flush, with no
//! copy; the WebSocket writes only its own frames (pongs, the close) there.
//!
//! Both ends close on purpose with a close handshake (protocol §12 "Clean
//! ends"): the writer's last act is a close frame, or the answer to the
//! peer's, and the side that closed first waits for the answer, for
//! [`CLOSE_GRACE`] at most, before it lets the socket go. A socket dropped
//! without one reads to the other side as a connection that broke.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{Sink, SinkExt};
use runloop_proto::frame::Role;
use tokio::sync::{Mutex, MutexGuard, OwnedSemaphorePermit, mpsc};
use tokio_tungstenite::tungstenite::error::ProtocolError;
use tokio_tungstenite::tungstenite::protocol::frame::Frame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_util::sync::CancellationToken;

use crate::histogram::Histogram;
use crate::lane::Lane;

/// Sees every frame of a connection, in both directions, as its bytes.
///
/// A client's writer calls it for each message it writes
/// ([`Role::Client`]) and the client's reader for each binary message it
/// reads ([`Role::Server`]); `runloop run --capture` records a connection
/// this way. It lives with the writer, which calls it, so the writer
/// knows nothing of the client.
pub type Tap = Arc<dyn Fn(Role, &[u8]) + Send + Sync>;

/// How long a side that closes waits for the other side's close answer
/// before it lets the socket go anyway. An answer takes one round trip.
pub const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// The queue places a frame holds until the writer has taken it: one
/// semaphore's permits, or two's.
#[derive(Debug)]
pub struct Place {
    _first: OwnedSemaphorePermit,
    _second: Option<OwnedSemaphorePermit>,
}

impl Place {
    /// Places of one semaphore.
    pub fn one(permit: OwnedSemaphorePermit) -> Place {
        Place {
            _first: permit,
            _second: None,
        }
    }

    /// Places of two semaphores.
    pub fn two(first: OwnedSemaphorePermit, second: OwnedSemaphorePermit) -> Place {
        Place {
            _first: first,
            _second: Some(second),
        }
    }
}

/// A frame larger than this goes to the WebSocket in fragments (RFC 6455,
/// section 5.4) of at most this size, each copied into the WebSocket's write
/// buffer only as the socket takes the ones before it. Written whole, a
/// frame of many MiB would be copied whole into that buffer, which keeps
/// the capacity for as long as the connection lives; a peer that does not
/// read would hold both copies.
pub const FRAGMENT: usize = 64 << 10;

/// A frame's bytes: in one piece, or its head and its body held apart so
/// that the body (a proxy's message, as it was read) is written from its
/// own bytes: on a server's lane always, through a WebSocket when it is
/// large (a small one is copied into one message there).
#[derive(Debug, Clone)]
pub enum FrameBytes {
    /// The whole frame, header included.
    Whole(Bytes),
    /// The frame's header and its body, written one after the other.
    Apart {
        /// The 9-byte header and any bytes before the body (a tag).
        head: Bytes,
        /// The rest of the frame, as it was read.
        body: Bytes,
    },
}

impl FrameBytes {
    /// A frame in one piece.
    pub fn whole(frame: impl Into<Bytes>) -> Self {
        FrameBytes::Whole(frame.into())
    }

    /// `head` then `body`, held apart: never copied on the server's lane.
    pub fn apart(head: Bytes, body: Bytes) -> Self {
        FrameBytes::Apart { head, body }
    }

    /// The frame in one piece (copied if it is held apart).
    fn contiguous(&self) -> Bytes {
        match self {
            FrameBytes::Whole(frame) => frame.clone(),
            FrameBytes::Apart { head, body } => Bytes::from([&head[..], &body[..]].concat()),
        }
    }

    /// The frame's head and body (the whole frame and nothing, when it is
    /// in one piece).
    fn into_parts(self) -> (Bytes, Bytes) {
        match self {
            FrameBytes::Whole(frame) => (frame, Bytes::new()),
            FrameBytes::Apart { head, body } => (head, body),
        }
    }
}

/// A frame on its way to the socket.
#[derive(Debug)]
pub struct Outgoing {
    message: FrameBytes,
    /// Held until the writer has taken the frame; see the module docs.
    _place: Option<Place>,
    /// When the relayed message it carries came from the proxy, for the
    /// relay's latency ([`Outlet`]'s histogram).
    relayed_at: Option<Instant>,
}

impl Outgoing {
    /// A control frame: a finish or a main-stream response.
    pub fn control(message: Vec<u8>) -> Self {
        Outgoing {
            message: FrameBytes::whole(message),
            _place: None,
            relayed_at: None,
        }
    }

    /// A data frame that holds its queue places; `relayed_at` when it
    /// carries a proxy's message that came then.
    pub fn data(message: FrameBytes, place: Place, relayed_at: Option<Instant>) -> Self {
        Outgoing {
            message,
            _place: Some(place),
            relayed_at,
        }
    }
}

/// The sending half of a connection's WebSocket, whatever its transport.
pub type WsSink = Pin<Box<dyn Sink<Message, Error = WsError> + Send>>;

/// What a connection's writers share: the socket, and how many frames are
/// on its queue and not yet fed to it.
pub struct Outlet {
    sending: Mutex<Sending>,
    /// Frames put on the queue and not yet fed to the socket: a relay may
    /// write itself only when there are none.
    queued: AtomicUsize,
    /// Fired when a write fails: the connection is over.
    failed: CancellationToken,
}

/// The socket, and what is noted of the frames fed to it since its last
/// flush.
struct Sending {
    /// Let go when the writer is done, whatever still holds the outlet.
    sink: Option<WsSink>,
    /// Where data frames go instead of the sink, on a server.
    lane: Option<Lane>,
    /// Sees each frame as sent by the given side.
    tap: Option<(Tap, Role)>,
    /// Gets, for each relayed frame, the time from its proxy message to
    /// the flush that wrote it to the socket: one clock read and one add to
    /// the sum per flush, one add to a bucket per time the frames came.
    latency: Option<Histogram>,
    /// When the relayed frames fed since the last flush came from their
    /// proxies, and how many came at each time: the frames of one relay's
    /// batch share one.
    relayed: Vec<(Instant, u64)>,
    /// Frames fed since the last flush.
    fed: usize,
}

impl Sending {
    async fn feed(
        &mut self,
        message: FrameBytes,
        relayed_at: Option<Instant>,
    ) -> Result<(), WsError> {
        if self.lane.is_some() {
            if self.put(message, relayed_at)? >= LANE_AHEAD {
                // The WebSocket's flush writes the lane.
                self.sink()?.flush().await?;
            }
            return Ok(());
        }
        self.note(&message, relayed_at);
        let sink = self.sink()?;
        match message {
            FrameBytes::Whole(frame) if frame.len() <= FRAGMENT => {
                sink.feed(Message::Binary(frame)).await
            }
            FrameBytes::Apart { head, body } if head.len() + body.len() <= FRAGMENT => {
                let frame = Bytes::from([&head[..], &body[..]].concat());
                sink.feed(Message::Binary(frame)).await
            }
            // Boxed: the small frames' path, taken for nearly every frame,
            // keeps a small future.
            message => {
                let (head, body) = message.into_parts();
                Box::pin(feed_fragments(sink, head, body)).await
            }
        }
    }

    /// Notes a frame as fed: the tap sees it, and the relay's latency
    /// counts it.
    fn note(&mut self, message: &FrameBytes, relayed_at: Option<Instant>) {
        if let Some((tap, local)) = &self.tap {
            tap(*local, &message.contiguous());
        }
        match relayed_at {
            Some(relayed_at) => self.note_relayed(relayed_at),
            None => self.fed += 1,
        }
    }

    /// Notes a frame that carries a proxy's message that came at
    /// `relayed_at` as fed.
    fn note_relayed(&mut self, relayed_at: Instant) {
        if self.latency.is_some() {
            match self.relayed.last_mut() {
                Some((at, count)) if *at == relayed_at => *count += 1,
                _ => self.relayed.push((relayed_at, 1)),
            }
        }
        self.fed += 1;
    }

    /// Puts a frame of `head` then `body`, small enough to be copied
    /// ([`COPIED`](crate::lane::COPIED)), on the lane, from where they lie:
    /// how many bytes the lane then holds. Only for an outlet with a lane.
    fn put_copy(
        &mut self,
        head: &[u8],
        body: &[u8],
        relayed_at: Instant,
    ) -> Result<usize, WsError> {
        if self.sink.is_none() {
            return Err(WsError::AlreadyClosed);
        }
        if let Some((tap, local)) = &self.tap {
            tap(*local, &[head, body].concat());
        }
        self.note_relayed(relayed_at);
        let lane = self.lane.as_ref().ok_or(WsError::AlreadyClosed)?;
        lane.push_copy(true, true, [head, body])
    }

    /// Puts a frame on the lane, without waiting: how many bytes the lane
    /// then holds. Only for an outlet with a lane (`AlreadyClosed` without).
    fn put(&mut self, message: FrameBytes, relayed_at: Option<Instant>) -> Result<usize, WsError> {
        if self.sink.is_none() {
            return Err(WsError::AlreadyClosed);
        }
        self.note(&message, relayed_at);
        let lane = self.lane.as_ref().ok_or(WsError::AlreadyClosed)?;
        let (head, body) = message.into_parts();
        if head.len() + body.len() <= FRAGMENT {
            return lane.push(true, true, head, body);
        }
        let mut queued = 0;
        for (opens, fin, piece) in fragments(head, body) {
            queued = lane.push(opens, fin, piece, Bytes::new())?;
        }
        Ok(queued)
    }

    async fn flush(&mut self) -> Result<(), WsError> {
        self.sink()?.flush().await?;
        if let Some(latency) = &self.latency
            && !self.relayed.is_empty()
        {
            let now = Instant::now();
            latency.observe_all(
                self.relayed.iter().map(|(relayed_at, count)| {
                    (now.saturating_duration_since(*relayed_at), *count)
                }),
            );
        }
        self.relayed.clear();
        self.fed = 0;
        Ok(())
    }

    fn sink(&mut self) -> Result<&mut WsSink, WsError> {
        self.sink.as_mut().ok_or(WsError::AlreadyClosed)
    }
}

/// How much a lane holds before a feed waits for the socket to take it:
/// the size of the WebSocket's own write buffer (tungstenite's default).
const LANE_AHEAD: usize = 128 << 10;

/// Feeds `head` then `body` as the fragments of one message: the frame is
/// never copied whole.
async fn feed_fragments(sink: &mut WsSink, head: Bytes, body: Bytes) -> Result<(), WsError> {
    for (opens, fin, piece) in fragments(head, body) {
        let opcode = if opens { Data::Binary } else { Data::Continue };
        let fragment = Frame::message(piece, OpCode::Data(opcode), fin);
        sink.feed(Message::Frame(fragment)).await?;
    }
    Ok(())
}

/// The fragments of a message of `head` then `body`, each a slice of their
/// own bytes of at most [`FRAGMENT`]: whether it opens the message, whether
/// it ends it, its bytes.
fn fragments(head: Bytes, body: Bytes) -> impl Iterator<Item = (bool, bool, Bytes)> {
    let total = head.len() + body.len();
    let mut sent = 0;
    [head, body]
        .into_iter()
        .flat_map(|piece| {
            (0..piece.len())
                .step_by(FRAGMENT)
                .map(move |at| piece.slice(at..piece.len().min(at + FRAGMENT)))
        })
        .map(move |fragment| {
            let opens = sent == 0;
            sent += fragment.len();
            (opens, sent == total, fragment)
        })
}

/// What the writer takes from its queue at once: one frame, or a relay's
/// batch (every message its proxy had ready), which costs the queue one
/// push and the writer at most one wake-up.
#[derive(Debug)]
enum Queued {
    One(Outgoing),
    Many(Vec<Outgoing>),
}

/// Where tasks put frames for the writer. Putting never waits: what a
/// frame may hold is bounded by its [`Place`] (see the module docs).
#[derive(Clone)]
pub struct Queue {
    frames: mpsc::UnboundedSender<Queued>,
    outlet: Arc<Outlet>,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("queued", &self.outlet.queued.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// The writer's end of its [`Queue`].
pub struct Frames {
    frames: mpsc::UnboundedReceiver<Queued>,
    outlet: Arc<Outlet>,
}

/// A connection's outlet on `sink`: the queue its tasks put frames on, and
/// the end its writer task ([`write_frames`]) reads. Data frames go on
/// `lane` when there is one (a server's socket; see [`Lane`]), else through
/// the sink. A tap sees each frame as sent by the given side; `latency`
/// gets each relayed frame's time from its proxy to the socket; `failed`
/// fires when a write fails.
pub fn outlet(
    sink: WsSink,
    lane: Option<Lane>,
    tap: Option<(Tap, Role)>,
    latency: Option<Histogram>,
    failed: CancellationToken,
) -> (Queue, Frames) {
    let outlet = Arc::new(Outlet {
        sending: Mutex::new(Sending {
            sink: Some(sink),
            lane,
            tap,
            latency,
            relayed: Vec::new(),
            fed: 0,
        }),
        queued: AtomicUsize::new(0),
        failed,
    });
    let (frames, queued) = mpsc::unbounded_channel();
    (
        Queue {
            frames,
            outlet: Arc::clone(&outlet),
        },
        Frames {
            frames: queued,
            outlet,
        },
    )
}

impl Queue {
    /// Puts one frame. The writer is gone only when its connection is:
    /// then there is nothing to do.
    pub fn put(&self, frame: Outgoing) {
        self.outlet.queued.fetch_add(1, Ordering::AcqRel);
        let _ = self.frames.send(Queued::One(frame));
    }

    /// Puts frames, in order, at once.
    pub fn put_all(&self, frames: Vec<Outgoing>) {
        if !frames.is_empty() {
            self.outlet.queued.fetch_add(frames.len(), Ordering::AcqRel);
            let _ = self.frames.send(Queued::Many(frames));
        }
    }

    /// The socket itself, if no one else is writing to it and nothing is
    /// on the queue: frames fed to it go out next, as they would from the
    /// queue. Whoever holds it keeps every other writer waiting, so it is
    /// held only while there is something ready to feed.
    pub fn direct(&self) -> Option<Direct<'_>> {
        if self.outlet.queued.load(Ordering::Acquire) > 0 {
            return None;
        }
        let sending = self.outlet.sending.try_lock().ok()?;
        // Checked again under the lock: the writer feeds only while it
        // holds the lock, so no queued frame can be on its way now.
        if self.outlet.queued.load(Ordering::Acquire) > 0 {
            return None;
        }
        Some(Direct {
            sending,
            failed: &self.outlet.failed,
        })
    }
}

/// The socket, held by a task that writes to it itself
/// ([`Queue::direct`]); let go when dropped. Frames fed and not flushed go
/// out with the next flush, whoever makes it.
pub struct Direct<'a> {
    sending: MutexGuard<'a, Sending>,
    failed: &'a CancellationToken,
}

/// What [`Direct::put`] did with a frame.
#[derive(Debug)]
pub enum Put {
    /// It is on the connection's lane, which can take more.
    Done,
    /// It is on the lane, which holds as much as it may: flush before the
    /// next.
    Full,
    /// The connection has no lane: [`feed`](Direct::feed) it.
    Feed(FrameBytes),
}

impl Direct<'_> {
    /// Puts a frame that carries a proxy's message that came at
    /// `relayed_at` on the connection's lane, without waiting, when it has
    /// one. A failed write ends the connection.
    pub fn put(&mut self, message: FrameBytes, relayed_at: Instant) -> Put {
        if self.sending.lane.is_none() {
            return Put::Feed(message);
        }
        match self.sending.put(message, Some(relayed_at)) {
            Ok(queued) if queued >= LANE_AHEAD => Put::Full,
            Ok(_) => Put::Done,
            Err(error) => {
                self.fail(&error);
                Put::Done
            }
        }
    }

    /// [`put`](Self::put) for a frame of `head` then `body` small enough
    /// to be copied ([`COPIED`](crate::lane::COPIED) bytes or fewer): the
    /// parts are copied onto the lane from where they lie, nothing of them
    /// held. `None`: the connection has no lane; feed the frame instead.
    pub fn put_copy(&mut self, head: &[u8], body: &[u8], relayed_at: Instant) -> Option<Put> {
        self.sending.lane.as_ref()?;
        Some(match self.sending.put_copy(head, body, relayed_at) {
            Ok(queued) if queued >= LANE_AHEAD => Put::Full,
            Ok(_) => Put::Done,
            Err(error) => {
                self.fail(&error);
                Put::Done
            }
        })
    }

    /// Feeds a frame that carries a proxy's message that came at
    /// `relayed_at`. A failed write ends the connection.
    pub async fn feed(&mut self, message: FrameBytes, relayed_at: Instant) {
        if let Err(error) = self.sending.feed(message, Some(relayed_at)).await {
            self.fail(&error);
        }
    }

    /// Writes what is fed to the socket. A failed write ends the connection.
    pub async fn flush(&mut self) {
        if let Err(error) = self.sending.flush().await {
            self.fail(&error);
        }
    }

    fn fail(&self, error: &WsError) {
        tracing::debug!(%error, "writing to the peer failed");
        self.failed.cancel();
    }
}

/// How many ready frames the writer takes before it flushes: enough that
/// a busy connection pays one flush for many small frames (the WebSocket
/// layer writes to the socket on its own whenever its buffer fills).
const BATCH: usize = 1024;

/// Feeds queued frames to the socket until every [`Queue`] is dropped or
/// `close` fires, then closes the WebSocket: a close frame, or the answer
/// to the peer's close if it closed first (frames still queued then are
/// dropped: nothing may follow a close). A failed write fires the outlet's
/// `failed` and ends it with the error.
pub async fn write_frames(mut frames: Frames, close: CancellationToken) -> Result<(), WsError> {
    let outlet = Arc::clone(&frames.outlet);
    let written = write_until_closing(&mut frames, &close).await;
    let mut sending = outlet.sending.lock().await;
    let result = match written {
        Ok(()) | Err(WsError::Protocol(ProtocolError::SendAfterClosing)) => match sending.sink() {
            Ok(sink) => sink.close().await,
            Err(error) => Err(error),
        },
        Err(error) => Err(error),
    };
    // The socket's sending half goes with the writer, though tasks may
    // still hold the queue.
    sending.sink = None;
    if result.is_err() {
        outlet.failed.cancel();
    }
    result
}

async fn write_until_closing(
    frames: &mut Frames,
    close: &CancellationToken,
) -> Result<(), WsError> {
    loop {
        let first = tokio::select! {
            biased;
            next = frames.frames.recv() => next,
            () = close.cancelled() => None,
        };
        let Some(first) = first else {
            return Ok(());
        };
        let mut sending = frames.outlet.sending.lock().await;
        feed(&mut sending, &frames.outlet.queued, first).await?;
        while sending.fed < BATCH {
            match frames.frames.try_recv() {
                Ok(next) => feed(&mut sending, &frames.outlet.queued, next).await?,
                Err(_) => break,
            }
        }
        sending.flush().await?;
    }
}

/// Feeds what was taken from the queue, counting it off the queue.
async fn feed(sending: &mut Sending, queued: &AtomicUsize, frames: Queued) -> Result<(), WsError> {
    match frames {
        Queued::One(frame) => feed_one(sending, queued, frame).await,
        Queued::Many(frames) => {
            for frame in frames {
                feed_one(sending, queued, frame).await?;
            }
            Ok(())
        }
    }
}

async fn feed_one(
    sending: &mut Sending,
    queued: &AtomicUsize,
    frame: Outgoing,
) -> Result<(), WsError> {
    let result = sending.feed(frame.message, frame.relayed_at).await;
    // Its places go back here, once it is fed.
    queued.fetch_sub(1, Ordering::AcqRel);
    result
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex as StdMutex;

    use super::*;

    /// An outlet on a sink that records what is sent, and the record.
    fn recorded() -> (Queue, Frames, Arc<StdMutex<Vec<Bytes>>>) {
        let seen = Arc::new(StdMutex::new(Vec::new()));
        let sink = futures_util::sink::unfold(Arc::clone(&seen), |seen, message: Message| {
            seen.lock().expect("lock").push(message.into_data());
            async move { Ok::<_, WsError>(seen) }
        });
        let (queue, frames) = outlet(Box::pin(sink), None, None, None, CancellationToken::new());
        (queue, frames, seen)
    }

    async fn until_sent(seen: &StdMutex<Vec<Bytes>>, count: usize) {
        while seen.lock().expect("lock").len() < count {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn a_task_writes_itself_only_when_nothing_is_queued_and_the_order_holds() {
        let (queue, frames, seen) = recorded();
        queue.put(Outgoing::control(b"a".to_vec()));
        assert!(queue.direct().is_none(), "a frame is queued");
        let writer = tokio::spawn(write_frames(frames, CancellationToken::new()));
        until_sent(&seen, 1).await;
        {
            let mut direct = queue.direct().expect("nothing queued, no one writing");
            direct
                .feed(FrameBytes::whole(&b"b"[..]), Instant::now())
                .await;
            // Queued while the socket is held: it goes after what is fed.
            queue.put(Outgoing::control(b"c".to_vec()));
            assert!(queue.direct().is_none(), "the socket is held");
            direct.flush().await;
        }
        until_sent(&seen, 3).await;
        assert!(queue.direct().is_some(), "the queue is empty again");
        drop(queue);
        writer.await.expect("the writer").expect("no error");
        let seen: Vec<_> = seen.lock().expect("lock").clone();
        assert_eq!(seen, [&b"a"[..], b"b", b"c"]);
    }

    /// What a sink was fed, frame by frame: (opcode, final, payload).
    type Fed = Arc<StdMutex<Vec<(OpCode, bool, Bytes)>>>;

    fn frames_fed() -> (WsSink, Fed) {
        let fed: Fed = Arc::default();
        let sink = futures_util::sink::unfold(Arc::clone(&fed), |fed, message: Message| {
            let frame = match message {
                Message::Binary(data) => (OpCode::Data(Data::Binary), true, data),
                Message::Frame(frame) => {
                    let (header, payload) = (frame.header().clone(), frame.into_payload());
                    (header.opcode, header.is_final, payload)
                }
                other => panic!("not a data frame: {other:?}"),
            };
            fed.lock().expect("lock").push(frame);
            async move { Ok::<_, WsError>(fed) }
        });
        (Box::pin(sink), fed)
    }

    #[tokio::test]
    async fn a_large_frame_goes_in_fragments_of_its_own_bytes_and_a_small_one_whole() {
        let (sink, fed) = frames_fed();
        let (queue, frames) = outlet(sink, None, None, None, CancellationToken::new());
        let body = Bytes::from((0..3 * FRAGMENT + 5).map(|i| i as u8).collect::<Vec<_>>());
        {
            let mut direct = queue.direct().expect("no one writing");
            direct
                .feed(
                    FrameBytes::apart(Bytes::from_static(b"head"), body.clone()),
                    Instant::now(),
                )
                .await;
            direct
                .feed(
                    FrameBytes::apart(Bytes::from_static(b"head"), body.slice(..10)),
                    Instant::now(),
                )
                .await;
            direct.flush().await;
        }
        drop((queue, frames));
        let fed = fed.lock().expect("lock").clone();
        let binary = OpCode::Data(Data::Binary);
        let more = OpCode::Data(Data::Continue);
        let shape: Vec<_> = fed
            .iter()
            .map(|(op, fin, data)| (*op, *fin, data.len()))
            .collect();
        assert_eq!(
            shape,
            [
                (binary, false, 4),
                (more, false, FRAGMENT),
                (more, false, FRAGMENT),
                (more, false, FRAGMENT),
                (more, true, 5),
                (binary, true, 14),
            ]
        );
        let message: Vec<u8> = fed[..5].iter().flat_map(|(_, _, d)| d.to_vec()).collect();
        assert_eq!(&message[..4], b"head");
        assert_eq!(&message[4..], &body[..]);
        // Slices of the body, not copies.
        let range = body.as_ptr_range();
        assert!(
            fed[1..5]
                .iter()
                .all(|(_, _, d)| range.contains(&d.as_ptr()))
        );
        assert_eq!(&fed[5].2[..], [&b"head"[..], &body[..10]].concat());
    }

    #[tokio::test]
    async fn the_socket_goes_with_the_writer_whatever_holds_the_queue() {
        let (queue, frames, seen) = recorded();
        let close = CancellationToken::new();
        let writer = tokio::spawn(write_frames(frames, close.clone()));
        close.cancel();
        writer.await.expect("the writer").expect("no error");
        // The sink held the record's other reference.
        assert_eq!(Arc::strong_count(&seen), 1, "the sink is let go");
        let mut direct = queue.direct().expect("no one writing");
        direct
            .feed(FrameBytes::whole(&b"late"[..]), Instant::now())
            .await;
        assert!(
            seen.lock().expect("lock").is_empty(),
            "nothing after the end"
        );
    }
}
