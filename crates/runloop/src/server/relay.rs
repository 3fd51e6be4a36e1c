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
//! Each forwarded frame holds one of the channel's `max_queued_responses`
//! permits until the writer takes it, so a caller that reads slowly makes
//! this task stop reading the proxy, and TCP carries the pressure back to
//! the agent program.

use std::pin::pin;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use runloop_proto::frame::{self, ServerFrame};
use runloop_proto::run_loop::{Finish, Relay, Relayed};
use runloop_proto::{Error, Writer};
use tokio::sync::{Semaphore, watch};
use tokio_tungstenite::tungstenite::Message;
use tracing::debug;

use super::connection::Conn;
use super::proxy_path::{self, Path};
use super::scope::Order;
use super::{Held, Stats};
use crate::metrics::{LoopOutcome, ProxyFault, ServerMetrics};

/// A proxy path the relay has opened, counted as held until it is closed.
struct Open {
    path: Path,
    _held: Held,
}

/// What the relay noted of the chunks it forwarded: how many, and the
/// last payload (kept, not copied: to tell a fatal ending once the loop is
/// over).
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
}

/// Chunks a relay forwards before it adds them to the server's counts.
const FLUSH_EVERY: u64 = 64;

impl Forwarded {
    fn note(&mut self, payload: Bytes, metrics: &ServerMetrics) {
        self.chunks += 1;
        self.pending.0 += 1;
        self.pending.1 += payload.len() as u64;
        self.last = Some(payload);
        if self.pending.0 == FLUSH_EVERY {
            self.flush(metrics);
        }
    }

    fn flush(&mut self, metrics: &ServerMetrics) {
        let (chunks, bytes) = std::mem::take(&mut self.pending);
        metrics.chunks.inc_by(chunks);
        metrics.bytes.inc_by(bytes);
    }
}

/// Relays one run-loop channel until its finish, then closes its path.
/// The channel counts as relayed ([`Stats`]'s `relays`) from the order to
/// its finish; the close after it counts only as an open proxy path.
///
/// Not instrumented with a span: entering one on every poll is a measurable
/// share of the relay's cost, so the few events it logs name their
/// connection, run, scope and channel instead.
pub(crate) async fn serve(
    conn: Arc<Conn>,
    scope: u32,
    order: Order,
    proxy_url: String,
    ending: watch::Receiver<Option<Error>>,
    run: Arc<str>,
) {
    let relaying = Held::new(conn.shared(), |s: &Stats| &s.relays);
    let channel = order.channel;
    let mut last = Vec::new();
    let mut open = None;
    let mut forwarded = Forwarded::default();
    let finish = relay(
        &conn,
        scope,
        order,
        &proxy_url,
        ending,
        &mut open,
        &mut Writer::new(&mut last),
        &mut forwarded,
    )
    .await;
    // Counted before the finish is queued: a caller that has seen the
    // finish finds the loop counted.
    forwarded.flush(&conn.shared().metrics);
    let last_chunk = forwarded
        .last
        .as_deref()
        .and_then(|payload| payload.get(1..));
    let outcome = LoopOutcome::of(forwarded.chunks, !last.is_empty(), last_chunk);
    conn.shared().metrics.loops.inc(outcome);
    if !last.is_empty() {
        let frame = ServerFrame::ChannelResponse {
            scope,
            channel,
            payload: &last,
        };
        conn.queue_in_scope(scope, frame::to_message(&frame));
    }
    debug!(
        connection = conn.number,
        run = %run,
        scope,
        channel,
        chunks = forwarded.chunks,
        outcome = outcome_name(outcome),
        "run-loop channel finished"
    );
    conn.finish_channel(scope, channel, finish);
    drop(relaying);
    if let Some(Open { path, _held }) = open {
        proxy_path::close(path).await;
    }
}

fn outcome_name(outcome: LoopOutcome) -> &'static str {
    crate::metrics::Label::name(outcome)
}

/// The relay proper. Forwards chunks as they come, noting them in
/// `forwarded`; writes the channel's last payload, if it has one, to
/// `last`. A path that still needs its close handshake is left in `open`.
#[allow(clippy::too_many_arguments)]
async fn relay(
    conn: &Conn,
    scope: u32,
    order: Order,
    proxy_url: &str,
    ending: watch::Receiver<Option<Error>>,
    open: &mut Option<Open>,
    last: &mut Writer<'_>,
    forwarded: &mut Forwarded,
) -> Finish {
    let metrics = &conn.shared().metrics;
    // One future for the run's end, polled by every wait below; making a
    // new one per message would register and drop a waiter each time.
    let mut ending = pin!(ended(ending));
    let relay = Relay::new();
    let limits = conn.shared().config.limits;
    let dialled = tokio::select! {
        biased;
        why = &mut ending => return relay.cut(why, last),
        dialled = proxy_path::open(proxy_url, "/agent/run", &limits) => dialled,
    };
    let path = match dialled {
        Ok(path) => path,
        Err(why) => {
            metrics.proxy_faults.inc(ProxyFault::Unreachable);
            let error = Error::kind(
                "proxy",
                format!("cannot open the proxy's /agent/run: {why}"),
            );
            return relay.cut(error, last);
        }
    };
    let Open { path, .. } = open.insert(Open {
        path,
        _held: Held::new(conn.shared(), |s: &Stats| &s.proxy_paths),
    });
    // A proxy that does not read can hold a large ask forever: the run's end
    // must still reach the loop.
    let sent = tokio::select! {
        biased;
        why = &mut ending => return relay.cut(why, last),
        sent = path.send(Message::Binary(order.request)) => sent,
    };
    if let Err(why) = sent {
        metrics.proxy_faults.inc(ProxyFault::Send);
        *open = None;
        return relay.broke(&why.to_string(), last);
    }
    let permits = Arc::new(Semaphore::new(limits.max_queued_responses));
    let mut relay = relay;
    loop {
        let next = tokio::select! {
            biased;
            why = &mut ending => return relay.cut(why, last),
            next = path.next() => next,
        };
        let message = match next {
            Some(Ok(Message::Binary(message))) => message,
            // The proxy's close: answered by the handshake in `serve`.
            Some(Ok(Message::Close(_))) => return relay.closed(),
            Some(Ok(
                Message::Text(_) | Message::Ping(_) | Message::Pong(_) | Message::Frame(_),
            )) => continue,
            Some(Err(why)) => {
                metrics.proxy_faults.inc(ProxyFault::AbruptEnd);
                *open = None;
                return relay.broke(&why.to_string(), last);
            }
            None => {
                metrics.proxy_faults.inc(ProxyFault::AbruptEnd);
                *open = None;
                return relay.broke("the connection closed without a close frame", last);
            }
        };
        let relayed_at = Instant::now();
        match relay.message(message, last) {
            Relayed::Forward(next, message) => {
                relay = next;
                let permit = tokio::select! {
                    biased;
                    why = &mut ending => return relay.cut(why, last),
                    permit = Arc::clone(&permits).acquire_owned() => permit,
                };
                let Ok(permit) = permit else {
                    unreachable!("the semaphore is never closed")
                };
                let frame = ServerFrame::ChannelResponse {
                    scope,
                    channel: order.channel,
                    payload: &message,
                };
                conn.queue_relayed(frame::to_message(&frame), permit, relayed_at);
                forwarded.note(message, metrics);
            }
            Relayed::Last(error, finish) => {
                // The proxy's error is the end (protocol §12): nothing after it
                // is read, whether or not the proxy goes on to close.
                last.extend_from_slice(&error);
                return finish;
            }
            Relayed::Fault(finish) => {
                metrics.proxy_faults.inc(ProxyFault::Sequence);
                debug!(
                    scope,
                    channel = order.channel,
                    "the proxy broke the sequence"
                );
                return finish;
            }
        }
    }
}

/// Resolves with the run's ending reason once it is set.
async fn ended(mut ending: watch::Receiver<Option<Error>>) -> Error {
    loop {
        if let Some(why) = ending.borrow_and_update().clone() {
            return why;
        }
        if ending.changed().await.is_err() {
            return Error::kind("server", "the run ended");
        }
    }
}
