//! The `/agent/run` path: the run-loop request in, the loop out as `[0]`
//! messages, the close at the end (protocol §10).
//!
//! ```text
//! ask ──check──▶ claim the loop ──POST /run──▶ 2xx event stream
//!   │ bad            │ none registered,          │ data  ──▶ [0][data]   (repeat)
//!   ▼                │ one running               │ end   ──▶ close        finished
//! [1] proxy error    ▼                           │ break ──▶ [1], close   unfinished
//!                  [1] proxy error               ▼
//!                                  cannot dial / non-2xx ──▶ [1], close   no loop
//! ```
//!
//! An event of more than 64 KiB of data is one message too, sent in
//! fragments as its pieces come (sse.rs): `[0]` and the first piece in a
//! Binary frame without FIN, the next pieces in Continue frames, the last
//! with FIN. Between the first fragment and the last, nothing else may be
//! said on the path: not an `[1]` error (it would land inside the chunk),
//! and not a close, which the server reads as a finished loop. So every
//! fault there — the body breaks or ends, bad bytes, an event over the
//! bound, the proxy shutting down, the server leaving — is logged with its
//! reason and counted as ever, and the path is dropped with no close frame
//! ([`End::Abandon`]): the server tells the caller the loop was cut short
//! (protocol §12, "abrupt proxy end"). That rule is `runloop-proto`'s
//! [`PathSend`]: each piece asks it for its frame, and each end asks it
//! whether the path may still say its error and close.
//!
//! "End" means the end the body marks: a chunked body's last chunk, or the
//! last byte of its `Content-Length`. A body that only ends because the
//! agent program's connection closed (an HTTP/1.0 answer) cannot prove
//! that the loop finished rather than crashed, so that end is a break too,
//! with an error that says how to fix the agent program (protocol §10).
//!
//! A body that breaks because the agent program died is reported in the
//! runtime's words when it watches the program ([`AgentEnd`](super::AgentEnd)):
//! `the agent program exited (exit status 3) before its /run body ended`,
//! not the HTTP client's account of a connection.
//!
//! The loop is claimed before the call and released as soon as the agent
//! program's stream is over, before the close, so a server that asks for
//! the next loop the moment it sees the close finds the proxy free.

use bytes::Bytes;
use runloop_proto::error_chain::Chain;
use runloop_proto::run_loop::{PathEnd, PathSend, RunLoopRequest};
use runloop_proto::{Decode, ErrorKind, ErrorValue};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::Shared;
use super::path::{End, SHUTTING_DOWN, Ws, ask, end, error_message, left, proxy_error, send_frame};
use super::sse;
use super::upstream::{Failure, Framing};
use runloop_metrics::{AgentFault, LoopOutcome, ProxyLoop, may_be_fatal};

/// Serves one `/agent/run` path.
pub(super) async fn serve(mut ws: Ws, shared: &Shared, shutdown: &CancellationToken) {
    let ask = match ask(&mut ws, shutdown).await {
        Ok(ask) => ask,
        Err(left) => return end(ws, left, &shared.config).await,
    };
    let metrics = &shared.metrics;
    if let Err(error) = RunLoopRequest::decode(&ask) {
        metrics.refused.inc(ProxyLoop::Malformed);
        metrics.loops.inc(LoopOutcome::NoLoop);
        let refusal = proxy_error(format!("the run-loop request did not parse: {error}"));
        return end(ws, End::Answer(Some(refusal)), &shared.config).await;
    }
    let claim = match shared.state.claim_loop() {
        Ok(claim) => claim,
        Err(why) => {
            metrics.refused.inc(ProxyLoop::Busy);
            metrics.loops.inc(LoopOutcome::NoLoop);
            warn!(why, "loop refused");
            return end(ws, End::Answer(Some(proxy_error(why))), &shared.config).await;
        }
    };
    info!("loop started");
    let mut sent = Sent::default();
    let outcome = relay(&mut ws, shared, ask, shutdown, &mut sent).await;
    drop(claim);
    // What the server is told is how the loop ended; a path left or
    // abandoned tells it nothing.
    if let End::Answer(last) = &outcome {
        let chunk = sent.last.as_deref();
        metrics
            .loops
            .inc(LoopOutcome::of(sent.chunks, last.is_some(), chunk));
    }
    end(ws, outcome, &shared.config).await;
}

/// What a loop has sent to the server: how many chunks, and the last one
/// if it may be a fatal notification ([`may_be_fatal`]).
#[derive(Default)]
struct Sent {
    chunks: u64,
    last: Option<Bytes>,
}

/// Calls the agent program and passes its events on until one side ends.
async fn relay(
    ws: &mut Ws,
    shared: &Shared,
    ask: Bytes,
    shutdown: &CancellationToken,
    sent: &mut Sent,
) -> End {
    let metrics = &shared.metrics;
    let asked = std::time::Instant::now();
    let response = tokio::select! {
        () = shutdown.cancelled() => return End::Answer(Some(proxy_error(SHUTTING_DOWN))),
        left = left(ws) => {
            info!("the server left before the agent program answered");
            return left;
        }
        response = shared.upstream.run_loop(ask) => response,
    };
    let (response, framing) = match response {
        Ok(answer) => answer,
        Err(Failure(json)) => {
            metrics.agent_faults.inc(AgentFault::NoStream);
            warn!(error = %String::from_utf8_lossy(&json), "no loop");
            return End::Answer(Some(error_message(&json)));
        }
    };
    let mut events = sse::Events::new(response.bytes_stream(), shared.config.max_event);
    // What may still be said on the path: inside a chunk sent in
    // fragments, no error and no close.
    let mut send = PathSend::new();
    loop {
        let chunks = sent.chunks;
        // Returning drops `events`, and with it the HTTP response, which
        // closes the agent program's connection: the loop is cancelled.
        let next = tokio::select! {
            () = shutdown.cancelled() => return shut_down(send, chunks),
            left = left(ws) => {
                if send.close() == PathEnd::Abandon {
                    warn!(chunks, "the server left mid-chunk; cancelling the agent program's loop");
                    return End::Abandon;
                }
                info!(chunks, "the server left mid-loop; cancelling the agent program's loop");
                return left;
            }
            next = events.next() => next,
        };
        let piece = match next {
            None if framing == Framing::Close => {
                metrics.agent_faults.inc(AgentFault::Undelimited);
                warn!(
                    chunks,
                    mid_chunk = send.inside(),
                    "the loop's body ended with its connection: finished or crashed?"
                );
                return send.fault_json(&Failure::agent(NOT_DELIMITED).0).into();
            }
            None => {
                let end = send.close();
                if end == PathEnd::Abandon {
                    metrics.agent_faults.inc(AgentFault::StreamBroke);
                    warn!(
                        chunks,
                        "the loop's body ended in the middle of an event; abandoning the path"
                    );
                } else {
                    info!(chunks, "loop finished");
                }
                return end.into();
            }
            Some(Err(broke)) => {
                metrics.agent_faults.inc(AgentFault::StreamBroke);
                let error = match (&broke, framing, shared.upstream.exited().await) {
                    // A body cut short of its length says so first (what
                    // the framing proves), then how the program ended.
                    (sse::Broke::Transport(_), Framing::Length(_), Some(status)) => {
                        format!(
                            "{} (the agent program exited: {status})",
                            cut_short(&broke, framing)
                        )
                    }
                    (sse::Broke::Transport(_), _, Some(status)) => {
                        format!("the agent program exited ({status}) before its /run body ended")
                    }
                    _ => cut_short(&broke, framing),
                };
                let end = send.fault_json(&Failure::agent(&error).0);
                if end == PathEnd::Abandon {
                    warn!(chunks, %error, "loop cut short mid-chunk; abandoning the path");
                } else {
                    warn!(chunks, %error, "loop cut short");
                }
                return end.into();
            }
            Some(Ok(piece)) => piece,
        };
        let (kind, data) = piece.into_parts();
        let bytes = data.len();
        let head = match send.piece(kind, bytes) {
            Ok(head) => head,
            Err(out_of_order) => {
                warn!(chunks, %out_of_order, "the event stream's pieces came out of order");
                let error = ErrorValue::kind(ErrorKind::Proxy, out_of_order);
                return send.fault(&error).into();
            }
        };
        // Kept only if it may be the fatal ending: a large chunk that
        // cannot be is let go once it is written, not held until the next.
        // A chunk sent in fragments is never kept whole.
        let last = (head.opens && head.fin && may_be_fatal(&data)).then(|| data.clone());
        tokio::select! {
            // Half a frame is out: the send rule abandons the path.
            () = shutdown.cancelled() => return shut_down(send, chunks),
            written = send_frame(ws, head, data) => if let Err(error) = written {
                info!(chunks, %error, "the path broke mid-loop; cancelling the agent program's loop");
                return End::Abandon;
            },
        }
        metrics.bytes.inc_by(bytes as u64);
        let Some(bytes) = send.written() else {
            continue;
        };
        debug!(bytes, "chunk");
        if chunks == 0 {
            metrics.first_chunk.observe(asked.elapsed());
        }
        metrics.chunks.inc();
        sent.chunks += 1;
        sent.last = last;
    }
}

/// The proxy shuts down mid-loop: its error and the close, or, inside a
/// chunk, the path abandoned.
fn shut_down(send: PathSend, chunks: u64) -> End {
    let end = send.fault(&ErrorValue::kind(ErrorKind::Proxy, SHUTTING_DOWN));
    if end == PathEnd::Abandon {
        warn!(
            chunks,
            "the proxy is shutting down mid-chunk; abandoning the path"
        );
    }
    end.into()
}

/// The error of a loop whose body ended with its connection (protocol §10).
const NOT_DELIMITED: &str = "the agent program's /run response ended when its connection closed \
     (an HTTP/1.0-style body, neither chunked nor with a Content-Length), so the proxy cannot tell \
     a finished loop from a crashed one; answer /run with HTTP/1.1 chunked transfer encoding or a \
     Content-Length";

/// What a broken event stream says, with what its `Content-Length` promised
/// when the body stopped short of it.
fn cut_short(broke: &sse::Broke, framing: Framing) -> String {
    match (broke, framing) {
        (sse::Broke::Transport(_), Framing::Length(length)) => format!(
            "the agent program's /run body ended before the {length} bytes of its \
             Content-Length: {}",
            Chain(broke)
        ),
        _ => Chain(broke).to_string(),
    }
}
