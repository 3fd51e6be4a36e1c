//! One run-loop channel on the server: the relay from the proxy's
//! `/agent/run` to the caller (protocol §7, §12).
//!
//! ```text
//! proxy message ──tag byte only──▶ Relay ──▶ [header][message] ──▶ outbox ──▶ caller
//! ```
//!
//! The proxy's messages come over a socket or, when the proxy is a task of
//! this process, from its loop in process ([`RunPath`]): the relay reads
//! both alike, and in process its task is the proxy's too — one read of
//! the agent program's body, one write to the caller.
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
//! How a response reaches the caller's socket — written to it directly, or
//! queued behind the other channels' — is the channel's [`Responses`]; the
//! run's end, which cuts any wait of the relay, is [`RunEnd`].

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use futures_util::SinkExt;
use runloop_proto::run_loop::{Finish, Relay, Relayed};
use runloop_proto::{ErrorKind, ErrorValue, Writer};
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::Message;
use tracing::debug;

use super::budget::LoopClaim;
use super::identity::Identity;
use super::outbox::ChannelOutbox;
use super::proxy_path::{self, Next, Place, Reading, RunPath};
use super::responses::Responses;
use super::run_end::{RunEnd, ended};
use super::shared::{Held, Shared, Stats};
use runloop_metrics::{LoopOutcome, ProxyFault, ServerMetrics, TenantFigures, may_be_fatal};

/// A proxy path the relay has opened, counted as held until it is closed.
struct Open {
    path: RunPath,
    _held: Held,
}

/// What the relay noted of the chunks it forwarded: how many, and the
/// last payload, to tell a fatal ending once the loop is over.
///
/// A small last payload is copied into a buffer the relay keeps, not held:
/// held, it would keep the path's read buffer (whose bytes it shares)
/// from being reused, and the path's reader would allocate a new one for
/// the next message, on every message. A large one has an allocation of its own
/// and is held, not copied (and only if it may be fatal past [`KEEP_ANY`]).
///
/// The server's counts of chunks and bytes are shared by every relay, and
/// an atomic add on a line other cores write to costs more than the rest
/// of a small chunk's bookkeeping; so a relay adds its own in batches of
/// [`FLUSH_EVERY`] chunks, and the rest when the loop ends.
#[derive(Default)]
struct Forwarded {
    chunks: u64,
    last: Last,
    /// Chunks and bytes not yet added to the server's counts.
    pending: (u64, u64),
    /// The counts of the tenant the loop is served as, added with the
    /// server's.
    tenant: Option<Arc<TenantFigures>>,
}

/// The loop's last forwarded payload, copied or held (see [`Forwarded`]).
#[derive(Default)]
enum Last {
    #[default]
    None,
    /// Copied into a buffer reused from chunk to chunk.
    Copied(Vec<u8>),
    Held(Bytes),
}

/// The largest last payload copied rather than held.
const COPY_LAST: usize = 512;

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
        if payload.len() <= COPY_LAST {
            if let Last::Copied(copy) = &mut self.last {
                copy.clear();
                copy.extend_from_slice(&payload);
            } else {
                self.last = Last::Copied(payload.to_vec());
            }
        } else if payload.len() <= KEEP_ANY || may_be_fatal(&payload) {
            self.last = Last::Held(payload);
        } else {
            self.last = Last::None;
        }
        if self.pending.0 == FLUSH_EVERY {
            self.flush(metrics);
        }
    }

    /// The last payload, if it is kept.
    fn last(&self) -> Option<&[u8]> {
        match &self.last {
            Last::None => None,
            Last::Copied(copy) => Some(copy),
            Last::Held(payload) => Some(payload),
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
    proxy: Place,
    ending: watch::Receiver<Option<ErrorValue>>,
    (connection, run): (u64, Arc<str>),
    claim: LoopClaim,
) {
    let relaying = Held::new(&shared, |s: &Stats| &s.relays);
    let tenant = Arc::clone(&claim.identity.figures);
    let mut kept = Kept {
        forwarded: Forwarded {
            tenant: Some(Arc::clone(&tenant)),
            ..Forwarded::default()
        },
        ..Kept::default()
    };
    let ask = Ask {
        request,
        proxy: &proxy,
        ending,
    };
    let finish = relay(&shared, &outbox, ask, &mut kept).await;
    let Kept {
        open,
        last,
        mut forwarded,
    } = kept;
    // Counted before the finish is queued: a caller that has seen the
    // finish finds the loop counted.
    forwarded.flush(&shared.metrics);
    let last_chunk = forwarded.last().and_then(|payload| payload.get(1..));
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
        path.close().await;
    }
}

fn outcome_name(outcome: LoopOutcome) -> &'static str {
    runloop_metrics::Label::name(outcome)
}

/// What the relay is asked to do: send `request` to the proxy and relay
/// its answer, until the run ends (`ending`).
struct Ask<'a> {
    request: Bytes,
    proxy: &'a Place,
    ending: watch::Receiver<Option<ErrorValue>>,
}

/// What the relay leaves for [`serve`] once it returns: the path if it still
/// needs its close handshake, the channel's last payload if it has one, and
/// what it forwarded.
#[derive(Default)]
struct Kept {
    open: Option<Open>,
    last: Vec<u8>,
    forwarded: Forwarded,
}

/// The relay proper: opens the path, sends the ask, then reads the proxy's
/// next message, lets [`Relay::message`] say what it is, and pushes what it
/// forwards to the channel's [`Responses`], flushing when nothing more is
/// ready.
///
/// Every wait is also a wait for the run's end ([`RunEnd::or`]): whatever
/// the relay is waiting for, the run's end cuts the loop with its reason.
async fn relay(
    shared: &Arc<Shared>,
    outbox: &ChannelOutbox,
    ask: Ask<'_>,
    kept: &mut Kept,
) -> Finish {
    let metrics = &shared.metrics;
    let limits = shared.config.limits;
    let last = &mut Writer::new(&mut kept.last);
    let ended = pin!(ended(ask.ending.clone()));
    let mut run_end = RunEnd::new(ask.ending, ended);
    let mut relay = Relay::new();
    let path = match open(shared, ask.request, ask.proxy, &mut kept.open, &mut run_end).await {
        Ok(path) => path,
        Err(Unsent::Cut(why)) => return relay.cut(why, last),
        Err(Unsent::Broke(why)) => return relay.broke(&why, last),
    };
    let mut responses = Responses::new(outbox, &limits);
    // When the messages being relayed came: read once per wait, since the
    // messages that were ready after it came with it.
    let mut relayed_at = Instant::now();
    loop {
        let next = if responses.is_idle() {
            let next = run_end.or(path.next()).await;
            relayed_at = Instant::now();
            next
        } else if !path.drained()
            // A path whose last read emptied its socket has nothing more
            // ready: what is pushed goes at once, without a look that the
            // wait for the next message, after the write, makes again.
            && let Some(next) = run_end.ready(path.next())
        {
            next
        } else {
            // Nothing more is ready: send what is.
            if let Err(why) = responses.flush(&mut run_end).await {
                return relay.cut(why, last);
            }
            continue;
        };
        // Whatever ends the loop here is followed by its finish, which the
        // writer queues and flushes after whatever was pushed here.
        let message = match next {
            Ok(Next::Message(message)) => message,
            // The proxy's close: answered by the handshake in `serve`.
            Ok(Next::Closed) => return relay.closed(),
            Ok(Next::Broke(why)) => {
                metrics.proxy_faults.inc(ProxyFault::AbruptEnd);
                kept.open = None;
                return relay.broke(&why, last);
            }
            Err(why) => return relay.cut(why, last),
        };
        match relay.message(message, last) {
            Relayed::Forward(next, message) => {
                relay = next;
                if let Err(why) = responses.push(&message, relayed_at, &mut run_end).await {
                    return relay.cut(why, last);
                }
                kept.forwarded.note(message, metrics);
            }
            // The proxy's error is the end (protocol §12): nothing after it
            // is read, whether or not the proxy goes on to close.
            Relayed::Last(error, finish) => {
                last.extend_from_slice(&error);
                return finish;
            }
            Relayed::Fault(finish) => {
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

/// Why a path was not opened, or its ask not sent.
enum Unsent {
    /// The run ended first, or the proxy could not be reached: the
    /// server's error.
    Cut(ErrorValue),
    /// The path broke while the ask was sent.
    Broke(String),
}

/// Opens the proxy's `/agent/run`, holding it in `open`, and sends it the
/// ask. A proxy that does not read can hold a large ask forever: the run's
/// end must still reach the loop. A proxy in process takes the ask with
/// the path.
async fn open<'o, F: Future<Output = ErrorValue>>(
    shared: &Arc<Shared>,
    request: Bytes,
    proxy: &Place,
    open: &'o mut Option<Open>,
    run_end: &mut RunEnd<'_, F>,
) -> Result<&'o mut RunPath, Unsent> {
    let metrics = &shared.metrics;
    let limits = shared.config.limits;
    let proxy_url = match proxy {
        Place::Url(url) => url,
        Place::Local(local) => {
            let path = RunPath::Local(local.run(request, limits.max_message_size));
            let held = Held::new(shared, |s: &Stats| &s.proxy_paths);
            let Open { path, .. } = open.insert(Open { path, _held: held });
            return Ok(path);
        }
    };
    let dialled = run_end
        .or(proxy_path::open(
            proxy_url,
            "/agent/run",
            &limits,
            Reading::Relayed,
        ))
        .await
        .map_err(Unsent::Cut)?;
    let mut path = dialled.map_err(|why| {
        metrics.proxy_faults.inc(ProxyFault::Unreachable);
        Unsent::Cut(ErrorValue::kind(
            ErrorKind::Proxy,
            format!("cannot open the proxy's /agent/run: {why}"),
        ))
    })?;
    let held = Held::new(shared, |s: &Stats| &s.proxy_paths);
    let sent = run_end.or(path.send(Message::Binary(request))).await;
    *open = Some(Open {
        path: RunPath::Socket(Box::new(path)),
        _held: held,
    });
    match sent {
        Ok(Ok(())) => {}
        Ok(Err(why)) => {
            metrics.proxy_faults.inc(ProxyFault::Send);
            *open = None;
            return Err(Unsent::Broke(why.to_string()));
        }
        Err(why) => return Err(Unsent::Cut(why)),
    }
    let Some(Open { path, .. }) = open else {
        unreachable!("held above")
    };
    Ok(path)
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
