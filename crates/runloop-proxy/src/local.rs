//! The in-process path: the proxy's `/agent/*` paths as calls, for a server
//! in the same process (protocol §12, "In-process paths").
//!
//! ```text
//! server's relay ──LocalRun::poll_next──▶ the loop: one read of the agent program's body,
//!      ▲                                  the events of it, each a message made where it was read
//!      └──────── [0][chunk]… ([1][error])?, then the end: closed, or broken (and why)
//! ```
//!
//! Why: the proxy beside an exec or oci agent is a task of the server's own
//! process, and over a loopback WebSocket every chunk cost a frame made,
//! a system call to send it, a wake-up of the relay's task and a read of
//! it there. Here the relay's task drives the loop itself: it reads the
//! agent program's socket, and the messages of that read go to the
//! caller's socket in one write, with no other task and no socket between.
//!
//! The rules are §10's exactly, because the loop is the WebSocket path's
//! own ([`Loop`]): the first message decides, an `[1]` error is the last
//! message, an answer ends with [`PathEvent::Closed`] (the clean close) and
//! an abrupt end is [`PathEvent::Broke`] with the words that a socket could
//! not carry (a chunk over the message limit says so); one loop at a time,
//! with the proxy's listener's loops too. A chunk that comes in pieces (an
//! event past 64 KiB) is put together here, up to the server's message
//! bound, as the server's reader of a socket path puts its fragments
//! together. Backpressure is the relay's: while it waits for the caller's
//! socket it does not poll, so the agent program's socket is not read.
//! Dropping a [`LocalRun`] is the server leaving the path: the agent
//! program's request is dropped, and its loop cancelled.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use super::path::End;
use super::run::{Loop, Next};
use super::{PathOpen, Shared, register};

/// A proxy's paths, called in process (see the module's docs).
#[derive(Debug, Clone)]
pub struct LocalProxy {
    shared: Arc<Shared>,
    shutdown: CancellationToken,
}

/// What comes next on an in-process `/agent/run` path, as a server reads a
/// socket path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathEvent {
    /// A whole binary message: `[0]` and a chunk, or `[1]` and an error
    /// (then the last).
    Message(Bytes),
    /// The answer's clean end.
    Closed,
    /// The path ended abruptly: why, in words for the caller.
    Broke(String),
}

type Starting = Pin<Box<dyn Future<Output = Result<Loop, End>> + Send>>;
type Breaking = Pin<Box<dyn Future<Output = End> + Send>>;

/// One `/agent/run` path in process: polled by the server's relay, it runs
/// the loop (see the module's docs).
pub struct LocalRun {
    shutdown: CancellationToken,
    /// Registered while the loop waits, so a shutdown wakes it.
    shutting: Pin<Box<WaitForCancellationFutureOwned>>,
    state: State,
    /// The largest message the server takes.
    max_message: usize,
    /// A chunk being put together from its pieces.
    message: Option<BytesMut>,
    /// Frames since the proxy's shutdown was last looked at: a busy loop
    /// looks every [`SHUTDOWN_EVERY`] frames (the look takes a lock), a
    /// waiting one is woken by it.
    unchecked: u32,
    _open: PathOpen,
}

/// How many frames a busy loop passes on between two looks at the proxy's
/// shutdown.
const SHUTDOWN_EVERY: u32 = 64;

impl std::fmt::Debug for LocalRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalRun").finish_non_exhaustive()
    }
}

enum State {
    /// The ask is checked and the agent program called.
    Starting(Starting),
    /// Boxed: a state is swapped a few times a loop, the loop polled often.
    Running(Box<Loop>),
    /// The event stream broke: its words are being found.
    Breaking(Breaking),
    /// The end to say, then [`State::Done`].
    Ending(End),
    /// Said: this, again, to whoever polls.
    Done(PathEvent),
}

impl LocalProxy {
    pub(super) fn new(shared: Arc<Shared>, shutdown: CancellationToken) -> LocalProxy {
        LocalProxy { shared, shutdown }
    }

    /// `/agent/register` with `ask`: the proxy's one answer, `[0]` or
    /// `[1][error]`.
    pub async fn register(&self, ask: Bytes) -> Bytes {
        let _open = PathOpen::new(&self.shared.metrics);
        match register::answer(&self.shared, ask, &self.shutdown).await {
            End::Answer(Some(answer)) => answer,
            // A registration always answers.
            End::Answer(None) | End::Closed | End::Abandon { .. } => {
                super::path::proxy_error("the registration ended without an answer")
            }
        }
    }

    /// `/agent/run` with `ask`: the path, whose loop starts when it is
    /// first polled. A message is at most `max_message` bytes, as on a
    /// socket path of the server's.
    pub fn run(&self, ask: Bytes, max_message: usize) -> LocalRun {
        let shared = Arc::clone(&self.shared);
        let shutdown = self.shutdown.clone();
        let starting: Starting =
            Box::pin(async move { Loop::start(&shared, ask, &shutdown).await });
        LocalRun {
            shutting: Box::pin(self.shutdown.clone().cancelled_owned()),
            shutdown: self.shutdown.clone(),
            state: State::Starting(starting),
            max_message,
            message: None,
            unchecked: 0,
            _open: PathOpen::new(&self.shared.metrics),
        }
    }
}

impl LocalRun {
    /// Whether the agent program's socket had nothing more when it was
    /// last read, and all of it is said: a look for more now would most
    /// likely wait. A hint, for a reader deciding whether to look for more
    /// before it sends what it has.
    pub fn drained(&self) -> bool {
        match &self.state {
            State::Running(run) => run.drained(),
            _ => false,
        }
    }

    /// The path's next message, or its end. Pending while the agent
    /// program's body is; a shutdown of the proxy wakes it.
    pub fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<PathEvent> {
        loop {
            match &mut self.state {
                State::Starting(starting) => match starting.as_mut().poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Ok(run)) => self.state = State::Running(Box::new(run)),
                    Poll::Ready(Err(end)) => self.state = State::Ending(end),
                },
                State::Running(run) => {
                    self.unchecked += 1;
                    if self.unchecked >= SHUTDOWN_EVERY {
                        self.unchecked = 0;
                        if self.shutdown.is_cancelled() {
                            let end = self.take_run().map(Loop::shut_down);
                            self.state = State::Ending(end.unwrap_or(End::Closed));
                            continue;
                        }
                    }
                    let next = match run.poll_next(cx) {
                        Poll::Ready(next) => next,
                        Poll::Pending => {
                            if self.shutting.as_mut().poll(cx).is_ready() {
                                // Looked at on the next turn.
                                self.unchecked = SHUTDOWN_EVERY;
                                continue;
                            }
                            return Poll::Pending;
                        }
                    };
                    match next {
                        Next::Frame(frame) => {
                            run.written();
                            if let Some(message) = self.piece(frame.opens, frame.fin, frame.bytes) {
                                return Poll::Ready(message);
                            }
                        }
                        Next::Broke(broke) => {
                            if let Some(run) = self.take_run() {
                                self.state = State::Breaking(Box::pin(run.broke(broke)));
                            }
                        }
                        Next::End(end) => self.state = State::Ending(end),
                    }
                }
                State::Breaking(breaking) => match breaking.as_mut().poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(end) => self.state = State::Ending(end),
                },
                State::Ending(_) => {
                    let State::Ending(end) =
                        std::mem::replace(&mut self.state, State::Done(PathEvent::Closed))
                    else {
                        unreachable!("matched above")
                    };
                    self.message = None;
                    let event = match end {
                        End::Answer(Some(last)) => PathEvent::Message(last),
                        End::Answer(None) | End::Closed => PathEvent::Closed,
                        End::Abandon { why, .. } => {
                            self.state = State::Done(PathEvent::Broke(why.clone()));
                            PathEvent::Broke(why)
                        }
                    };
                    return Poll::Ready(event);
                }
                State::Done(event) => return Poll::Ready(event.clone()),
            }
        }
    }

    /// The loop, taken out of the state (which it leaves done).
    fn take_run(&mut self) -> Option<Loop> {
        match std::mem::replace(&mut self.state, State::Done(PathEvent::Closed)) {
            State::Running(run) => Some(*run),
            other => {
                self.state = other;
                None
            }
        }
    }

    /// One frame of the loop's answer: the message it completes, if it does.
    fn piece(&mut self, opens: bool, fin: bool, bytes: Bytes) -> Option<PathEvent> {
        if opens && fin {
            return Some(PathEvent::Message(bytes));
        }
        let message = self.message.get_or_insert_with(BytesMut::new);
        if message.len() + bytes.len() > self.max_message {
            // The server's bound: the loop ends here, abruptly, as on a
            // socket path whose message grew past it.
            self.message = None;
            drop(self.take_run().map(|run| run.abandon(None)));
            let why = format!(
                "the agent program's chunk is over the message limit ({} bytes)",
                self.max_message
            );
            self.state = State::Done(PathEvent::Broke(why.clone()));
            return Some(PathEvent::Broke(why));
        }
        message.extend_from_slice(&bytes);
        if fin {
            return self
                .message
                .take()
                .map(|message| PathEvent::Message(message.freeze()));
        }
        None
    }
}

impl Drop for LocalRun {
    /// The server left the path: the loop, if it runs, is cancelled.
    fn drop(&mut self) {
        if let Some(run) = self.take_run() {
            drop(run.left(End::Closed));
        }
    }
}
