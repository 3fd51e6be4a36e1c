//! One loop on the caller's side: a `Stream` of chunks that ends with
//! exactly one [`Outcome`].
//!
//! The responses are read by `runloop_proto`'s [`Reader`], the single place
//! where a sequence becomes an outcome. The stream yields each chunk with
//! its JSON exactly as it came, the error if one comes, and then
//! [`Event::End`] — always, whatever happens to the connection — and then
//! nothing more.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use runloop_proto::ErrorValue;
use runloop_proto::run_loop::{AgenticLoopChunk, Broken, Outcome, Reader, Step, Transcript};
use tokio::sync::mpsc;

use super::connection::ChannelEvent;
use super::run::RunInner;

/// What a loop says, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// One chunk of the loop, and its JSON exactly as it came.
    Chunk {
        /// The chunk.
        chunk: AgenticLoopChunk,
        /// Its JSON text, as the server sent it.
        json: Bytes,
    },
    /// The loop's error: it did not run, or did not finish.
    Error(ErrorValue),
    /// The loop's outcome. Always the last event.
    End(Outcome),
}

impl Event {
    /// A chunk's JSON text as it came, as `&str` (`println!("{json}")`);
    /// `None` for the error and the end. The client has checked it is
    /// UTF-8 (a chunk that is not does not decode).
    pub fn json_str(&self) -> Option<&str> {
        match self {
            Event::Chunk { json, .. } => std::str::from_utf8(json).ok(),
            Event::Error(_) | Event::End(_) => None,
        }
    }
}

/// One loop of a run. Holds its run open while it lives.
#[derive(Debug)]
pub struct RunLoop {
    events: Option<mpsc::Receiver<ChannelEvent>>,
    reader: Reader,
    /// Why the loop ended before it started, when it did.
    ended_before: Option<Broken>,
    done: bool,
    channel: Option<u32>,
    _run: Arc<RunInner>,
}

impl RunLoop {
    pub(super) fn new(
        run: Arc<RunInner>,
        channel: u32,
        events: mpsc::Receiver<ChannelEvent>,
    ) -> Self {
        RunLoop {
            events: Some(events),
            reader: Reader::new(),
            ended_before: None,
            done: false,
            channel: Some(channel),
            _run: run,
        }
    }

    /// A loop asked for on a run that has ended.
    pub(super) fn ended(run: Arc<RunInner>, why: Broken) -> Self {
        RunLoop {
            events: None,
            reader: Reader::new(),
            ended_before: Some(why),
            done: false,
            channel: None,
            _run: run,
        }
    }

    /// The channel number the loop runs on (`None` if it never opened).
    pub fn channel(&self) -> Option<u32> {
        self.channel
    }

    /// Reads the rest of the loop, keeping nothing, and returns its outcome.
    pub async fn outcome(mut self) -> Outcome {
        while let Some(event) = self.next().await {
            if let Event::End(outcome) = event {
                return outcome;
            }
        }
        // `End` always comes before the stream's end.
        Outcome::Broken(Broken::ConnectionEnded)
    }

    /// Reads the rest of the loop: its chunks, in order, and its outcome.
    pub async fn collect_chunks(mut self) -> (Vec<AgenticLoopChunk>, Outcome) {
        let mut chunks = Vec::new();
        loop {
            match self.next().await {
                Some(Event::Chunk { chunk, .. }) => chunks.push(chunk),
                Some(Event::Error(_)) => {}
                Some(Event::End(outcome)) => return (chunks, outcome),
                // `End` always comes before the stream's end; a stream polled
                // again after it has nothing left to say.
                None => return (chunks, Outcome::Broken(Broken::ConnectionEnded)),
            }
        }
    }

    /// Reads the rest of the loop into a coalesced transcript (protocol §11).
    pub async fn transcript(self) -> (Transcript, Outcome) {
        let (chunks, outcome) = self.collect_chunks().await;
        (chunks.into_iter().collect(), outcome)
    }

    fn end(&mut self, outcome: Option<Outcome>) -> Poll<Option<Event>> {
        self.done = true;
        self.events = None;
        // The reader gives an outcome exactly once, and `done` guards it.
        let outcome = outcome.unwrap_or(Outcome::Broken(Broken::ConnectionEnded));
        Poll::Ready(Some(Event::End(outcome)))
    }
}

impl Stream for RunLoop {
    type Item = Event;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        if let Some(why) = this.ended_before.take() {
            let outcome = this.reader.cut(why);
            return this.end(outcome);
        }
        let Some(events) = this.events.as_mut() else {
            return Poll::Ready(None);
        };
        match events.poll_recv(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(ChannelEvent::Response(payload))) => {
                match this.reader.response(&payload) {
                    Some(Step::Chunk(chunk)) => Poll::Ready(Some(Event::Chunk {
                        chunk,
                        json: payload.slice(1..),
                    })),
                    Some(Step::Error(error)) => Poll::Ready(Some(Event::Error(error))),
                    Some(Step::End(outcome)) => this.end(Some(outcome)),
                    None => this.end(None),
                }
            }
            Poll::Ready(Some(ChannelEvent::Finish)) => {
                let outcome = this.reader.finish();
                this.end(outcome)
            }
            Poll::Ready(Some(ChannelEvent::RunEnded)) => {
                let outcome = this.reader.cut(Broken::RunEnded);
                this.end(outcome)
            }
            Poll::Ready(None) => {
                let outcome = this.reader.cut(Broken::ConnectionEnded);
                this.end(outcome)
            }
        }
    }
}
