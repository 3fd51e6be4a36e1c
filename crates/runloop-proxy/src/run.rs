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
//!
//! The loop itself is a [`Loop`]: the call, the event stream and the send
//! rule, driven by whoever carries the path — this module's WebSocket path,
//! or the server's relay in the same process ([`local`](super::local)) —
//! so the rules above are written once. On the WebSocket, every frame the
//! loop has ready goes on the path's lane ([`Lane`]) and out in one write:
//! one read of the agent program's body, one write to the server, however
//! many events the read held.

use std::future::poll_fn;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use futures_util::SinkExt;
use runloop_proto::error_chain::Chain;
use runloop_proto::run_loop::{PathEnd, PathSend, RunLoopRequest};
use runloop_proto::{Decode, ErrorKind, ErrorValue};
use runloop_wire::lane::Lane;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::Shared;
use super::http1::Body;
use super::path::{End, SHUTTING_DOWN, Ws, ask, end, error_message, left, proxy_error};
use super::sse;
use super::state::LoopClaim;
use super::upstream::{Failure, Framing};
use runloop_metrics::{AgentFault, LoopOutcome, ProxyLoop, may_be_fatal};

/// How many bytes of frames the WebSocket path gathers on its lane before
/// it writes them, if more are ready.
const BATCH: usize = 128 << 10;

/// Serves one `/agent/run` path over a WebSocket whose data frames go on
/// `lane`.
pub(super) async fn serve(
    mut ws: Ws,
    lane: Lane,
    shared: &Arc<Shared>,
    shutdown: &CancellationToken,
) {
    let ask = match ask(&mut ws, shutdown).await {
        Ok(ask) => ask,
        Err(left) => return end(ws, left, &shared.config).await,
    };
    let started = tokio::select! {
        started = Loop::start(shared, ask, shutdown) => started,
        left = left(&mut ws) => {
            info!("the server left before the agent program answered");
            Err(left)
        }
    };
    let outcome = match started {
        Ok(run) => relay(&mut ws, &lane, run, shutdown).await,
        Err(end) => end,
    };
    end(ws, outcome, &shared.config).await;
}

/// Passes the loop's frames on until one side ends: every frame that is
/// ready goes on the lane, then one write sends them all.
async fn relay(ws: &mut Ws, lane: &Lane, mut run: Loop, shutdown: &CancellationToken) -> End {
    loop {
        let mut next = tokio::select! {
            biased;
            () = shutdown.cancelled() => return run.shut_down(),
            next = poll_fn(|cx| run.poll_next(cx)) => next,
            left = left(ws) => return run.left(left),
        };
        loop {
            match next {
                Next::Frame(frame) => {
                    match lane.push(frame.opens, frame.fin, Bytes::new(), frame.bytes) {
                        Ok(queued) => {
                            run.written();
                            if queued >= BATCH {
                                break;
                            }
                        }
                        // The path is closing: the server's close came.
                        Err(_) => return run.left(End::Closed),
                    }
                }
                Next::Broke(broke) => return run.broke(broke).await,
                Next::End(end) => return end,
            }
            // Whatever else is ready now goes in the same write.
            match poll_fn(|cx| Poll::Ready(run.poll_next(cx))).await {
                Poll::Ready(ready) => next = ready,
                Poll::Pending => break,
            }
        }
        let flushed = tokio::select! {
            biased;
            () = shutdown.cancelled() => return run.shut_down(),
            flushed = ws.flush() => flushed,
        };
        if let Err(error) = flushed {
            info!(chunks = run.sent.chunks, %error, "the path broke mid-loop; cancelling the agent program's loop");
            return run.abandon(None);
        }
    }
}

/// What a loop has sent to the server: how many chunks, and the last one
/// (its JSON) if it may be a fatal notification.
#[derive(Default)]
pub(super) struct Sent {
    pub(super) chunks: u64,
    last: Last,
}

/// A chunk kept to tell a fatal ending: a small one copied into a buffer
/// reused from chunk to chunk (no hold on the event's buffer), a larger
/// one (a whole chunk is at most 64 KiB) held as it is, not scanned: in
/// process, the server's relay holds the same bytes for the same reason,
/// so they are not held twice.
#[derive(Default)]
enum Last {
    #[default]
    None,
    Copied(Vec<u8>),
    Held(Bytes),
}

/// The largest chunk copied rather than held.
const COPY_LAST: usize = 512;

impl Last {
    /// Keeps the chunk `tagged` (its tag, then its JSON), in `self`'s
    /// buffer when it is copied.
    fn keep(&mut self, tagged: &Bytes) {
        let json = &tagged[1..];
        if json.len() <= COPY_LAST {
            if let Last::Copied(copy) = self {
                copy.clear();
                copy.extend_from_slice(json);
            } else {
                *self = Last::Copied(json.to_vec());
            }
        } else {
            *self = Last::Held(tagged.clone());
        }
    }

    /// The chunk's JSON, if one is kept and it may be fatal.
    fn json(&self) -> Option<&[u8]> {
        match self {
            Last::None => None,
            Last::Copied(copy) => Some(copy),
            Last::Held(tagged) => Some(&tagged[1..]).filter(|json| may_be_fatal(json)),
        }
    }
}

/// One frame of a loop's answer: a Binary frame when it `opens` a message
/// (its bytes then begin with the chunk tag), else a Continuation frame;
/// `fin` when it ends the message.
#[derive(Debug)]
pub(super) struct Frame {
    pub(super) opens: bool,
    pub(super) fin: bool,
    pub(super) bytes: Bytes,
}

/// What a loop has next.
pub(super) enum Next {
    /// A frame to send; then [`Loop::written`].
    Frame(Frame),
    /// The event stream broke: [`Loop::broke`] says how the path ends.
    Broke(sse::Broke),
    /// The loop is over: end the path so.
    End(End),
}

/// A loop under way, whichever path carries it: the claim on the proxy's
/// one loop, the agent program's event stream, the send rule, what was
/// sent.
pub(super) struct Loop {
    shared: Arc<Shared>,
    /// Released as soon as the agent program's stream is over.
    claim: Option<LoopClaim>,
    events: sse::Events<Body>,
    framing: Framing,
    send: Option<PathSend>,
    pub(super) sent: Sent,
    asked: Instant,
    /// The last frame handed out, kept as it may be the fatal ending
    /// (swapped into `sent` once written; a message in fragments is never
    /// kept).
    pending_last: Last,
}

impl Loop {
    /// Takes the ask: checks it, claims the proxy's one loop, calls the
    /// agent program. `Err`: no loop runs, and the path ends so (the
    /// refusal, counted).
    pub(super) async fn start(
        shared: &Arc<Shared>,
        ask: Bytes,
        shutdown: &CancellationToken,
    ) -> Result<Loop, End> {
        let metrics = &shared.metrics;
        if let Err(error) = RunLoopRequest::decode(&ask) {
            metrics.refused.inc(ProxyLoop::Malformed);
            metrics.loops.inc(LoopOutcome::NoLoop);
            let refusal = proxy_error(format!("the run-loop request did not parse: {error}"));
            return Err(End::Answer(Some(refusal)));
        }
        let claim = match shared.state.claim_loop() {
            Ok(claim) => claim,
            Err(why) => {
                metrics.refused.inc(ProxyLoop::Busy);
                metrics.loops.inc(LoopOutcome::NoLoop);
                warn!(why, "loop refused");
                return Err(End::Answer(Some(proxy_error(why))));
            }
        };
        info!("loop started");
        let asked = Instant::now();
        let called = tokio::select! {
            () = shutdown.cancelled() => {
                metrics.loops.inc(LoopOutcome::NoLoop);
                return Err(End::Answer(Some(proxy_error(SHUTTING_DOWN))));
            }
            called = shared.upstream.run_loop(ask) => called,
        };
        let (body, framing) = match called {
            Ok(answer) => answer,
            Err(Failure(json)) => {
                metrics.agent_faults.inc(AgentFault::NoStream);
                metrics.loops.inc(LoopOutcome::NoLoop);
                warn!(error = %String::from_utf8_lossy(&json), "no loop");
                return Err(End::Answer(Some(error_message(&json))));
            }
        };
        Ok(Loop {
            shared: Arc::clone(shared),
            claim: Some(claim),
            events: sse::Events::new(body, shared.config.max_event),
            framing,
            send: Some(PathSend::new()),
            sent: Sent::default(),
            asked,
            pending_last: Last::None,
        })
    }

    fn send(&mut self) -> &mut PathSend {
        self.send.get_or_insert_with(PathSend::new)
    }

    /// Whether the agent program's socket had nothing more at its last
    /// read and nothing read is left to parse: a look for more now would
    /// most likely wait. A hint.
    pub(super) fn drained(&self) -> bool {
        self.events.parsed() && self.events.body().drained()
    }

    /// The loop's next frame, or how it ends. Pending while the agent
    /// program's body is; a frame handed out must be [`written`](Self::written)
    /// before the next is asked for.
    pub(super) fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Next> {
        let next = match self.events.poll_tagged(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(next) => next,
        };
        let chunks = self.sent.chunks;
        let metrics = &self.shared.metrics;
        let piece = match next {
            None if self.framing == Framing::Close => {
                metrics.agent_faults.inc(AgentFault::Undelimited);
                warn!(
                    chunks,
                    mid_chunk = self.send.as_ref().is_some_and(PathSend::inside),
                    "the loop's body ended with its connection: finished or crashed?"
                );
                let end = self.end_with(
                    "the agent program's body ended with its connection inside a chunk",
                    |send| send.fault_json(&Failure::agent(NOT_DELIMITED).0),
                );
                return Poll::Ready(Next::End(end));
            }
            None => {
                if self.send.as_ref().is_some_and(PathSend::inside) {
                    metrics.agent_faults.inc(AgentFault::StreamBroke);
                    warn!(
                        chunks,
                        "the loop's body ended in the middle of an event; abandoning the path"
                    );
                } else {
                    info!(chunks, "loop finished");
                }
                let end = self.end_with(
                    "the agent program's body ended inside a chunk",
                    PathSend::close,
                );
                return Poll::Ready(Next::End(end));
            }
            Some(Err(broke)) => return Poll::Ready(Next::Broke(broke)),
            Some(Ok(piece)) => piece,
        };
        let (kind, bytes) = piece.into_parts();
        let opens = matches!(
            kind,
            runloop_proto::run_loop::PieceKind::Whole | runloop_proto::run_loop::PieceKind::Begin
        );
        let data = bytes.len() - usize::from(opens);
        let head = match self
            .send
            .get_or_insert_with(PathSend::new)
            .piece(kind, data)
        {
            Ok(head) => head,
            Err(out_of_order) => {
                warn!(chunks, %out_of_order, "the event stream's pieces came out of order");
                let error = ErrorValue::kind(ErrorKind::Proxy, out_of_order);
                let end = self.end_with("the event stream's pieces came out of order", |send| {
                    send.fault(&error)
                });
                return Poll::Ready(Next::End(end));
            }
        };
        debug_assert_eq!(head.opens, opens, "a piece that opens a message is tagged");
        metrics.bytes.inc_by(data as u64);
        // Kept only if it may be the fatal ending: a large chunk that
        // cannot be is let go once it is written, not held until the next.
        // A chunk sent in fragments is never kept whole.
        if head.opens && head.fin {
            self.pending_last.keep(&bytes);
        } else {
            self.pending_last = Last::None;
        }
        Poll::Ready(Next::Frame(Frame {
            opens: head.opens,
            fin: head.fin,
            bytes,
        }))
    }

    /// The frame handed out last is on its way, in order.
    pub(super) fn written(&mut self) {
        let Some(bytes) = self.send().written() else {
            return;
        };
        debug!(bytes, "chunk");
        let metrics = &self.shared.metrics;
        if self.sent.chunks == 0 {
            metrics.first_chunk.observe(self.asked.elapsed());
        }
        metrics.chunks.inc();
        self.sent.chunks += 1;
        std::mem::swap(&mut self.sent.last, &mut self.pending_last);
    }

    /// How the path ends when the event stream broke (`broke`): the error
    /// in the agent program's terms (how it ended, when the runtime says
    /// so), or, inside a chunk, the path abandoned, saying why.
    pub(super) async fn broke(mut self, broke: sse::Broke) -> End {
        let metrics = &self.shared.metrics;
        metrics.agent_faults.inc(AgentFault::StreamBroke);
        let framing = self.framing;
        let error = match (&broke, framing, self.shared.upstream.exited().await) {
            // A body cut short of its length says so first (what the
            // framing proves), then how the program ended.
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
        let chunks = self.sent.chunks;
        let inside = self.send().inside();
        if inside {
            warn!(chunks, %error, "loop cut short mid-chunk; abandoning the path");
            let said = match broke {
                sse::Broke::TooLarge(bound) => Some(format!(
                    "the agent program's SSE event is over the message limit ({bound} bytes)"
                )),
                _ => None,
            };
            let why = said.clone().unwrap_or_else(|| {
                format!("the agent program's event stream broke inside a chunk: {error}")
            });
            self.claim = None;
            self.send = None;
            return End::Abandon { said, why };
        }
        warn!(chunks, %error, "loop cut short");
        self.end_with(&error, |send| send.fault_json(&Failure::agent(&error).0))
    }

    /// The proxy shuts down mid-loop: its error and the close, or, inside
    /// a chunk, the path abandoned.
    pub(super) fn shut_down(mut self) -> End {
        let chunks = self.sent.chunks;
        if self.send().inside() {
            warn!(
                chunks,
                "the proxy is shutting down mid-chunk; abandoning the path"
            );
        }
        let error = ErrorValue::kind(ErrorKind::Proxy, SHUTTING_DOWN);
        self.end_with("the proxy shut down inside a chunk", |send| {
            send.fault(&error)
        })
    }

    /// The server left the path (`left` is how to end it): the agent
    /// program's loop is cancelled with the body dropped.
    pub(super) fn left(mut self, left: End) -> End {
        let chunks = self.sent.chunks;
        self.claim = None;
        if self.send().inside() {
            warn!(
                chunks,
                "the server left mid-chunk; cancelling the agent program's loop"
            );
            return self.abandon(None);
        }
        info!(
            chunks,
            "the server left mid-loop; cancelling the agent program's loop"
        );
        left
    }

    /// The path is dropped: no close, no error.
    pub(super) fn abandon(mut self, said: Option<String>) -> End {
        self.claim = None;
        self.send = None;
        End::Abandon {
            why: said
                .clone()
                .unwrap_or_else(|| "the path was dropped".to_owned()),
            said,
        }
    }

    /// Ends the loop as the send rule says, `ending` it: frees the proxy
    /// for the next loop before the path's end is sent, and counts how the
    /// loop ended; a path abandoned says `why`.
    fn end_with(&mut self, why: &str, ending: impl FnOnce(PathSend) -> PathEnd) -> End {
        let send = self.send.take().unwrap_or_default();
        let end = ending(send);
        self.claim = None;
        match end {
            PathEnd::Abandon => End::Abandon {
                said: None,
                why: why.to_owned(),
            },
            PathEnd::Close { last } => {
                let last_chunk = self.sent.last.json();
                self.shared.metrics.loops.inc(LoopOutcome::of(
                    self.sent.chunks,
                    last.is_some(),
                    last_chunk,
                ));
                End::Answer(last.map(Bytes::from))
            }
        }
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
             Content-Length: {}",
            Chain(broke)
        ),
        _ => Chain(broke).to_string(),
    }
}
