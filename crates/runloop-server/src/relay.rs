//! One run-loop channel on the server: the relay from the proxy's
//! `/agent/run` to the caller (protocol §7, §12).
//!
//! ```text
//! proxy message ──tag byte only──▶ Relay ──▶ [header][message] ──▶ outbox ──▶ caller
//! ```
//!
//! The proxy's messages are already run-loop payloads (`[0][chunk]`,
//! `[1][error]`), so relaying is reading one byte and copying the rest behind
//! a 9-byte header — one allocation per chunk, no parsing. The sequence
//! rules (the proxy's error is the end, a fault or an abrupt end gets the
//! server's own error, never a finish alone) are `runloop_proto`'s
//! [`Relay`]; this task only moves bytes and waits.
//!
//! The channel's finish goes out first, the path's close handshake after
//! it ([`proxy_path::close`]), so a proxy that is slow to close never
//! delays the caller's end of the loop.
//!
//! While no other task is writing to the connection's socket and nothing
//! is queued for it, the relay writes its frames to the socket itself
//! ([`Direct`]), as a plain forwarder would: every message the proxy has
//! ready, then one flush. Otherwise each forwarded frame is queued and
//! holds its places in the connection's queue ([`places`](super::places):
//! so many responses and bytes of the channel, so many bytes of the
//! connection) until the writer takes it. Either way a caller that reads
//! slowly makes this task stop reading the proxy (a full socket holds it,
//! or its places run out), and TCP carries the pressure back to the agent
//! program.

use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::Poll;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use futures_util::{FutureExt, SinkExt, StreamExt};
use runloop_proto::frame;
use runloop_proto::run_loop::{Finish, Relay, Relayed};
use runloop_proto::{ErrorKind, ErrorValue, Writer};
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::Message;
use tracing::debug;

use super::budget::LoopClaim;
use super::identity::Identity;
use super::outbox::ChannelOutbox;
use super::proxy_path::{self, Path};
use super::shared::{Held, Shared, Stats};
use runloop_metrics::{LoopOutcome, ProxyFault, ServerMetrics, TenantFigures, may_be_fatal};
use runloop_wire::limits::Limits;
use runloop_wire::writer::{Direct, FrameBytes};

/// A proxy path the relay has opened, counted as held until it is closed.
struct Open {
    path: Path,
    _held: Held,
}

/// What the relay noted of the chunks it forwarded: how many, and the
/// last payload (kept, not copied: to tell a fatal ending once the loop is
/// over; a large one only if it may be fatal).
///
/// The server's counts of chunks and bytes are shared by every relay, and
/// an atomic add on a line other cores write to costs more than the rest
/// of a small chunk's bookkeeping; so a relay adds its own in batches of
/// [`FLUSH_EVERY`] chunks, and the rest when the loop ends.
#[derive(Default)]
struct Forwarded {
    chunks: u64,
    last: Option<Bytes>,
    /// Chunks and bytes not yet added to the server's counts.
    pending: (u64, u64),
    /// The counts of the tenant the loop is served as, added with the
    /// server's.
    tenant: Option<Arc<TenantFigures>>,
}

/// Chunks a relay forwards before it adds them to the server's counts.
const FLUSH_EVERY: u64 = 64;

/// The largest last chunk kept without looking whether it may be fatal.
const KEEP_ANY: usize = 64 << 10;

impl Forwarded {
    fn note(&mut self, payload: Bytes, metrics: &ServerMetrics) {
        self.chunks += 1;
        self.pending.0 += 1;
        self.pending.1 += payload.len() as u64;
        // A large chunk that cannot be the fatal ending is let go: kept, it
        // would be held beside its copy in the queue.
        self.last = (payload.len() <= KEEP_ANY || may_be_fatal(&payload)).then_some(payload);
        if self.pending.0 == FLUSH_EVERY {
            self.flush(metrics);
        }
    }

    fn flush(&mut self, metrics: &ServerMetrics) {
        let (chunks, bytes) = std::mem::take(&mut self.pending);
        metrics.chunks.inc_by(chunks);
        metrics.bytes.inc_by(bytes);
        if let Some(tenant) = &self.tenant {
            TenantFigures::add(&tenant.chunks, chunks);
            TenantFigures::add(&tenant.bytes, bytes);
        }
    }
}

/// Relays one run-loop channel until its finish, then closes its path.
/// The channel counts as relayed ([`Stats`]'s `relays`) from the order to
/// its finish, and holds its identity's place (`claim`) as long; the
/// close after it counts only as an open proxy path.
///
/// Not instrumented with a span: entering one on every poll is a measurable
/// share of the relay's cost, so the few events it logs name their
/// connection, run, scope and channel instead (`(connection, run)` are
/// the connection's number and the run's id).
pub(crate) async fn serve(
    shared: Arc<Shared>,
    outbox: ChannelOutbox,
    request: Bytes,
    proxy_url: String,
    ending: watch::Receiver<Option<ErrorValue>>,
    (connection, run): (u64, Arc<str>),
    claim: LoopClaim,
) {
    let relaying = Held::new(&shared, |s: &Stats| &s.relays);
    let mut last = Vec::new();
    let mut open = None;
    let tenant = Arc::clone(&claim.identity.figures);
    let mut forwarded = Forwarded {
        tenant: Some(Arc::clone(&tenant)),
        ..Forwarded::default()
    };
    let finish = relay(
        &shared,
        &outbox,
        request,
        &proxy_url,
        ending,
        &mut open,
        &mut Writer::new(&mut last),
        &mut forwarded,
    )
    .await;
    // Counted before the finish is queued: a caller that has seen the
    // finish finds the loop counted.
    forwarded.flush(&shared.metrics);
    let last_chunk = forwarded
        .last
        .as_deref()
        .and_then(|payload| payload.get(1..));
    let outcome = LoopOutcome::of(forwarded.chunks, !last.is_empty(), last_chunk);
    shared.metrics.loops.inc(outcome);
    TenantFigures::add(&tenant.loops, 1);
    if !last.is_empty() {
        outbox.respond_last(&last);
    }
    debug!(
        connection,
        run = %run,
        scope = outbox.scope(),
        channel = outbox.channel(),
        chunks = forwarded.chunks,
        outcome = outcome_name(outcome),
        "run-loop channel finished"
    );
    // Given back before the finish is queued: a caller that has seen the
    // finish may ask for its next loop at once.
    drop(claim);
    outbox.finish(finish);
    drop(relaying);
    if let Some(Open { path, _held }) = open {
        proxy_path::close(path).await;
    }
}

fn outcome_name(outcome: LoopOutcome) -> &'static str {
    runloop_metrics::Label::name(outcome)
}

/// The relay proper. Forwards chunks as they come, noting them in
/// `forwarded`; writes the channel's last payload, if it has one, to
/// `last`. A path that still needs its close handshake is left in `open`.
///
/// Every wait is also a wait for the run's end ([`RunEnd::or`]): whatever
/// the relay is waiting for, the run's end cuts the loop with its reason.
#[allow(clippy::too_many_arguments)]
async fn relay(
    shared: &Arc<Shared>,
    outbox: &ChannelOutbox,
    request: Bytes,
    proxy_url: &str,
    ending: watch::Receiver<Option<ErrorValue>>,
    open: &mut Option<Open>,
    last: &mut Writer<'_>,
    forwarded: &mut Forwarded,
) -> Finish {
    let metrics = &shared.metrics;
    let watch = ending.clone();
    let quiet = watch.borrow().is_none();
    let ended = pin!(ended(ending));
    let mut run_end = RunEnd {
        watch,
        quiet,
        ended,
    };
    let mut relay = Relay::new();
    let limits = shared.config.limits;
    let dialled = match run_end
        .or(proxy_path::open(proxy_url, "/agent/run", &limits))
        .await
    {
        Ok(dialled) => dialled,
        Err(why) => return relay.cut(why, last),
    };
    let path = match dialled {
        Ok(path) => path,
        Err(why) => {
            metrics.proxy_faults.inc(ProxyFault::Unreachable);
            let error = ErrorValue::kind(
                ErrorKind::Proxy,
                format!("cannot open the proxy's /agent/run: {why}"),
            );
            return relay.cut(error, last);
        }
    };
    let Open { path, .. } = open.insert(Open {
        path,
        _held: Held::new(shared, |s: &Stats| &s.proxy_paths),
    });
    // A proxy that does not read can hold a large ask forever: the run's end
    // must still reach the loop.
    match run_end.or(path.send(Message::Binary(request))).await {
        Ok(Ok(())) => {}
        Ok(Err(why)) => {
            metrics.proxy_faults.inc(ProxyFault::Send);
            *open = None;
            return relay.broke(&why.to_string(), last);
        }
        Err(why) => return relay.cut(why, last),
    }
    let places = outbox.places(&limits);
    // Every response of the channel begins with these bytes.
    let header = outbox.message(&[]);
    // The relay writes to the connection's socket itself while no one else
    // is, and otherwise queues; either way it takes every message its proxy
    // has ready before it flushes, or queues them together: one flush, or
    // one push and at most one wake-up of the writer, for all of them.
    let mut socket: Option<Socket<'_>> = None;
    let mut ready = Vec::new();
    // When the messages being relayed came: read once per wait, since the
    // messages that were ready after it came with it (one clock read a
    // batch, not one a message).
    let mut relayed_at = Instant::now();
    loop {
        let next = if socket.is_none() && ready.is_empty() {
            let next = run_end.or(next_message(path)).await;
            relayed_at = Instant::now();
            next
        } else {
            match run_end.ready(next_message(path)) {
                Some(next) => next,
                None => {
                    // Nothing more is ready: send what is.
                    outbox.respond_all(std::mem::take(&mut ready));
                    if let Some(mut held) = socket.take()
                        && let Err(why) = run_end.or(held.direct.flush()).await
                    {
                        return relay.cut(why, last);
                    }
                    continue;
                }
            }
        };
        // Whatever ends the loop here is followed by its finish, which the
        // writer queues and flushes after whatever was fed or queued here.
        let message = match next {
            Ok(Next::Message(message)) => message,
            // The proxy's close: answered by the handshake in `serve`.
            Ok(Next::Closed) => {
                outbox.respond_all(ready);
                return relay.closed();
            }
            Ok(Next::Broke(why)) => {
                outbox.respond_all(ready);
                metrics.proxy_faults.inc(ProxyFault::AbruptEnd);
                *open = None;
                return relay.broke(&why, last);
            }
            Err(why) => {
                outbox.respond_all(ready);
                return relay.cut(why, last);
            }
        };
        match relay.message(message, last) {
            Relayed::Forward(next, message) => {
                relay = next;
                let size = message.len() + frame::HEADER_LEN;
                if socket.is_none() && ready.is_empty() {
                    socket = outbox.direct().map(Socket::new);
                }
                if let Some(held) = &mut socket {
                    let frame = held.frame(&header, &message);
                    if let Err(why) = run_end.or(held.direct.feed(frame, relayed_at)).await {
                        return relay.cut(why, last);
                    }
                    forwarded.note(message, metrics);
                    if held.fed(size, &limits) {
                        // Its share written: the others' turn.
                        if let Some(mut held) = socket.take()
                            && let Err(why) = run_end.or(held.direct.flush()).await
                        {
                            return relay.cut(why, last);
                        }
                    }
                    continue;
                }
                let place = match places.try_take(size) {
                    Some(place) => place,
                    None => {
                        // The places come back as the writer takes what is
                        // queued: queue what is ready before waiting.
                        outbox.respond_all(std::mem::take(&mut ready));
                        match run_end.or(places.take(size)).await {
                            Ok(place) => place,
                            Err(why) => return relay.cut(why, last),
                        }
                    }
                };
                ready.push(outbox.response(&message, place, relayed_at));
                forwarded.note(message, metrics);
            }
            Relayed::Last(error, finish) => {
                outbox.respond_all(ready);
                // The proxy's error is the end (protocol §12): nothing after it
                // is read, whether or not the proxy goes on to close.
                last.extend_from_slice(&error);
                return finish;
            }
            Relayed::Fault(finish) => {
                outbox.respond_all(ready);
                metrics.proxy_faults.inc(ProxyFault::Sequence);
                debug!(
                    scope = outbox.scope(),
                    channel = outbox.channel(),
                    "the proxy broke the sequence"
                );
                return finish;
            }
        }
    }
}

/// The connection's socket while the relay writes to it itself, what it
/// has fed since it took it, and a buffer for the frames it feeds.
struct Socket<'a> {
    direct: Direct<'a>,
    frames: usize,
    bytes: usize,
    /// Where this batch's frames are built. The WebSocket copies a frame
    /// as it takes it and lets it go, so the next frame reuses the same
    /// memory: one allocation a batch, not one a frame, and none held once
    /// the batch is flushed.
    scratch: BytesMut,
}

/// What a batch's buffer holds, so that a batch of small frames fits in
/// one allocation; a larger frame is built on its own.
const SCRATCH: usize = 16 << 10;

impl<'a> Socket<'a> {
    fn new(direct: Direct<'a>) -> Self {
        Socket {
            direct,
            frames: 0,
            bytes: 0,
            scratch: BytesMut::new(),
        }
    }

    /// The frame that carries `message`: `header`, then the message.
    fn frame(&mut self, header: &[u8], message: &Bytes) -> FrameBytes {
        let size = header.len() + message.len();
        if size > SCRATCH {
            // Not in the batch's buffer, where it would be held until the
            // batch is flushed, which a caller who does not read can put
            // off forever: its own small allocation, or, large, the
            // message's own bytes, written in fragments.
            return FrameBytes::of(header, message);
        }
        if self.scratch.capacity() < size {
            self.scratch.reserve(SCRATCH);
        }
        self.scratch.extend_from_slice(header);
        self.scratch.extend_from_slice(message);
        FrameBytes::whole(self.scratch.split().freeze())
    }

    /// Notes a frame of `size` bytes fed; whether the relay has fed as much
    /// as its channel may queue, so that it should let the others write.
    fn fed(&mut self, size: usize, limits: &Limits) -> bool {
        self.frames += 1;
        self.bytes += size;
        self.frames >= limits.max_queued_responses || self.bytes >= limits.max_queued_bytes
    }
}

/// What came next on the proxy's path.
enum Next {
    /// A binary message: a run-loop payload, unread.
    Message(Bytes),
    /// The proxy's clean close.
    Closed,
    /// The path ended without a close: how.
    Broke(String),
}

/// Reads the path up to its next binary message, or its end. Text messages
/// and pings carry nothing (protocol §1).
async fn next_message(path: &mut Path) -> Next {
    while let Some(message) = path.next().await {
        match message {
            Ok(Message::Binary(message)) => return Next::Message(message),
            // A close between the fragments of a message: the message is
            // lost, so the loop did not finish.
            Ok(Message::Close(_)) if path.get_ref().inside_message() => {
                return Next::Broke(
                    "the proxy closed the path inside a message (after a fragment that was not \
                     its last)"
                        .to_owned(),
                );
            }
            Ok(Message::Close(_)) => return Next::Closed,
            Ok(Message::Text(_) | Message::Ping(_) | Message::Pong(_) | Message::Frame(_)) => {}
            Err(why) => return Next::Broke(why.to_string()),
        }
    }
    Next::Broke("the connection closed without a close frame".to_owned())
}

/// The run's end, waited for beside whatever the relay waits for. One
/// future for the whole relay: making a new one per message would register
/// and drop a waiter each time.
struct RunEnd<'a, F> {
    /// The run's ending, only to see whether it has changed: an atomic
    /// load, where polling `ended` takes its waiters' lock.
    watch: watch::Receiver<Option<ErrorValue>>,
    /// Whether the run had not ended when the relay began.
    quiet: bool,
    ended: Pin<&'a mut F>,
}

impl<F: Future<Output = ErrorValue>> RunEnd<'_, F> {
    /// `work`'s output, or the run's end (why it ended) if that comes
    /// first. The run's end wins a tie.
    ///
    /// While the run's ending has not changed, the work is polled first and
    /// the end only when the work must wait (to be woken by either): most
    /// of a busy loop's messages are already read when the relay asks for
    /// them, and polling the end takes its waiters' lock. Each poll of the
    /// relay polls the work once, so a wait costs one read of the socket.
    async fn or<T>(&mut self, work: impl Future<Output = T>) -> Result<T, ErrorValue> {
        let mut work = pin!(work);
        std::future::poll_fn(|cx| {
            let quiet = self.quiet && matches!(self.watch.has_changed(), Ok(false));
            if !quiet && let Poll::Ready(why) = self.ended.as_mut().poll(cx) {
                return Poll::Ready(Err(why));
            }
            if let Poll::Ready(output) = work.as_mut().poll(cx) {
                return Poll::Ready(Ok(output));
            }
            if quiet && let Poll::Ready(why) = self.ended.as_mut().poll(cx) {
                return Poll::Ready(Err(why));
            }
            Poll::Pending
        })
        .await
    }

    /// `work`'s output if it is ready now, or the run's end if that has
    /// come; `None` if neither is.
    fn ready<T>(&mut self, work: impl Future<Output = T>) -> Option<Result<T, ErrorValue>> {
        if self.quiet && matches!(self.watch.has_changed(), Ok(false)) {
            return work.now_or_never().map(Ok);
        }
        self.or(work).now_or_never()
    }
}

/// Resolves with the run's ending reason once it is set.
async fn ended(mut ending: watch::Receiver<Option<ErrorValue>>) -> ErrorValue {
    loop {
        if let Some(why) = ending.borrow_and_update().clone() {
            return why;
        }
        if ending.changed().await.is_err() {
            return ErrorValue::kind(ErrorKind::Server, "the run ended");
        }
    }
}

/// Ends a run-loop channel that is not relayed (its identity holds as many
/// loops as it may) with `error`: the error and the finish, "no loop ran"
/// (protocol §7), counted as such.
pub(crate) fn refuse(
    shared: &Shared,
    identity: &Identity,
    outbox: ChannelOutbox,
    error: ErrorValue,
) {
    let mut last = Vec::new();
    let finish = Relay::new().cut(error, &mut Writer::new(&mut last));
    shared.metrics.loops.inc(LoopOutcome::NoLoop);
    shared.metrics.loops_refused.inc();
    TenantFigures::add(&identity.figures.loops, 1);
    TenantFigures::add(&identity.figures.loops_refused, 1);
    outbox.respond_last(&last);
    outbox.finish(finish);
}
