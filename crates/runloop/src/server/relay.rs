//! One run-loop channel on the server: the relay from the proxy's
//! `/agent/run` to the caller (SPEC §7, §12).
//!
//! ```text
//! proxy message ──tag byte only──▶ Relay ──▶ [header][message] ──▶ outbox ──▶ caller
//! ```
//!
//! The proxy's messages are already run-loop payloads (`[0][chunk]`,
//! `[1][error]`), so relaying is reading one byte and copying the rest behind
//! a 9-byte header — one allocation per chunk, no parsing. The sequence
//! rules (an error is last, a fault or an abrupt end gets the server's own
//! error, never a finish alone) are `runloop_proto`'s [`Relay`]; this task
//! only moves bytes and waits.
//!
//! Each forwarded frame holds one of the channel's `max_queued_responses`
//! permits until the writer takes it, so a caller that reads slowly makes
//! this task stop reading the proxy, and TCP carries the pressure back to
//! the agent program.

use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use runloop_proto::frame::{self, ServerFrame};
use runloop_proto::run_loop::{Closing, Finish, Relay, Relayed};
use runloop_proto::{Error, Writer};
use tokio::sync::{Semaphore, watch};
use tokio_tungstenite::tungstenite::Message;
use tracing::debug;

use super::connection::Conn;
use super::proxy_path::{self, Path};
use super::scope::Order;
use super::{Held, Stats};

/// Relays one run-loop channel until its finish.
///
/// Not instrumented with a span: entering one on every poll is a measurable
/// share of the relay's cost, so the few events it logs name their scope
/// and channel instead.
pub(crate) async fn serve(
    conn: Arc<Conn>,
    scope: u32,
    order: Order,
    proxy_url: String,
    ending: watch::Receiver<Option<Error>>,
) {
    let channel = order.channel;
    let mut last = Vec::new();
    let finish = relay(
        &conn,
        scope,
        order,
        &proxy_url,
        ending,
        &mut Writer::new(&mut last),
    )
    .await;
    if !last.is_empty() {
        let frame = ServerFrame::ChannelResponse {
            scope,
            channel,
            payload: &last,
        };
        conn.queue_in_scope(scope, frame::to_message(&frame));
    }
    debug!(
        scope,
        channel,
        ended_with_error = !last.is_empty(),
        "run-loop channel finished"
    );
    conn.finish_channel(scope, channel, finish);
}

/// The relay proper. Forwards chunks as they come; writes the channel's
/// last payload, if it has one, to `last`.
async fn relay(
    conn: &Conn,
    scope: u32,
    order: Order,
    proxy_url: &str,
    ending: watch::Receiver<Option<Error>>,
    last: &mut Writer<'_>,
) -> Finish {
    // One future for the run's end, polled by every wait below; making a
    // new one per message would register and drop a waiter each time.
    let mut ending = pin!(ended(ending));
    let relay = Relay::<bytes::Bytes>::new();
    let limits = conn.shared().config.limits;
    let dialled = tokio::select! {
        biased;
        why = &mut ending => return relay.cut(why, last),
        dialled = proxy_path::open(proxy_url, "/agent/run", &limits) => dialled,
    };
    let mut path = match dialled {
        Ok(path) => path,
        Err(why) => {
            let error = Error::kind(
                "proxy",
                format!("cannot open the proxy's /agent/run: {why}"),
            );
            return relay.cut(error, last);
        }
    };
    let _held = Held::new(conn.shared(), |s: &Stats| &s.proxy_paths);
    // A proxy that does not read can hold a large ask forever: the run's end
    // must still reach the loop.
    let sent = tokio::select! {
        biased;
        why = &mut ending => return relay.cut(why, last),
        sent = path.send(Message::Binary(order.request)) => sent,
    };
    if let Err(why) = sent {
        return relay.broke(&why.to_string(), last);
    }
    let permits = Arc::new(Semaphore::new(limits.max_queued_responses));
    let mut relay = relay;
    loop {
        let next = tokio::select! {
            biased;
            why = &mut ending => {
                close(path).await;
                return relay.cut(why, last);
            }
            next = path.next() => next,
        };
        match next {
            Some(Ok(Message::Binary(message))) => match relay.message(message, last) {
                Relayed::Forward(next, message) => {
                    relay = next;
                    let permit = tokio::select! {
                        biased;
                        why = &mut ending => {
                            close(path).await;
                            return relay.cut(why, last);
                        }
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
                    conn.queue_data(frame::to_message(&frame), permit);
                }
                Relayed::Held(next) => relay = next,
                Relayed::Fault(finish) => {
                    debug!(
                        scope,
                        channel = order.channel,
                        "the proxy broke the sequence"
                    );
                    close(path).await;
                    return finish;
                }
            },
            Some(Ok(Message::Close(_))) => {
                return match relay.closed(last) {
                    Closing::Finish(finish) | Closing::ErrorThenFinish(finish) => finish,
                };
            }
            Some(Ok(
                Message::Text(_) | Message::Ping(_) | Message::Pong(_) | Message::Frame(_),
            )) => {}
            Some(Err(why)) => return relay.broke(&why.to_string(), last),
            None => return relay.broke("the connection closed without a close frame", last),
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

/// Closes a proxy path we are done with; a proxy that does not take the
/// close promptly has its socket dropped instead.
async fn close(mut path: Path) {
    let _ = tokio::time::timeout(Duration::from_secs(1), path.close(None)).await;
}
