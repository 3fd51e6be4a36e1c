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
//! "End" means the end the body marks: a chunked body's last chunk, or the
//! last byte of its `Content-Length`. A body that only ends because the
//! agent program's connection closed (an HTTP/1.0 answer) cannot prove
//! that the loop finished rather than crashed, so that end is a break too,
//! with an error that says how to fix the agent program (protocol §10).
//!
//! The loop is claimed before the call and released as soon as the agent
//! program's stream is over, before the close, so a server that asks for
//! the next loop the moment it sees the close finds the proxy free.

use std::pin::pin;

use bytes::Bytes;
use futures_util::StreamExt;
use runloop_proto::Decode;
use runloop_proto::run_loop::{RunLoopRequest, response};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::path::{
    End, SHUTTING_DOWN, Ws, ask, end, error_message, left, proxy_error, send_binary,
};
use super::upstream::{Failure, Framing};
use super::{Shared, sse};
use crate::metrics::{AgentFault, LoopOutcome, ProxyLoop, may_be_fatal};

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
    let mut data = pin!(sse::data(response.bytes_stream(), shared.config.max_event));
    loop {
        let chunks = sent.chunks;
        // Dropping `data` (by returning) drops the HTTP response, which
        // closes the agent program's connection: the loop is cancelled.
        let next = tokio::select! {
            () = shutdown.cancelled() => return End::Answer(Some(proxy_error(SHUTTING_DOWN))),
            left = left(ws) => {
                info!(chunks, "the server left mid-loop; cancelling the agent program's loop");
                return left;
            }
            next = data.next() => next,
        };
        let data = match next {
            None if framing == Framing::Close => {
                metrics.agent_faults.inc(AgentFault::Undelimited);
                warn!(
                    chunks,
                    "the loop's body ended with its connection: finished or crashed?"
                );
                let Failure(json) = Failure::agent(NOT_DELIMITED);
                return End::Answer(Some(error_message(&json)));
            }
            None => {
                info!(chunks, "loop finished");
                return End::Answer(None);
            }
            Some(Err(broke)) => {
                metrics.agent_faults.inc(AgentFault::StreamBroke);
                warn!(chunks, error = %broke, "loop cut short");
                let Failure(json) = Failure::agent(cut_short(&broke, framing));
                return End::Answer(Some(error_message(&json)));
            }
            Some(Ok(data)) => data,
        };
        let bytes = data.len();
        debug!(bytes, "chunk");
        // Kept only if it may be the fatal ending: a large chunk that
        // cannot be is let go once it is written, not held until the next.
        let last = may_be_fatal(&data).then(|| data.clone());
        tokio::select! {
            // A frame half written cannot be followed by an error: drop the path.
            () = shutdown.cancelled() => return End::Abandon,
            written = send_binary(ws, &CHUNK_TAG, data) => if let Err(error) = written {
                info!(chunks, %error, "the path broke mid-loop; cancelling the agent program's loop");
                return End::Abandon;
            },
        }
        if chunks == 0 {
            metrics.first_chunk.observe(asked.elapsed());
        }
        metrics.chunks.inc();
        metrics.bytes.inc_by(bytes as u64);
        sent.chunks += 1;
        sent.last = last;
    }
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
             Content-Length: {broke}"
        ),
        _ => broke.to_string(),
    }
}

/// What goes before an event's data, unread, to make it a chunk: `[0]`.
const CHUNK_TAG: [u8; 1] = [response::CHUNK];
