//! One loop of a run, handed to Python in batches that the runtime has
//! made ready.
//!
//! ```text
//! connection's reading task ──queue──▶ pump (a task of the runtime) ──▶ ready: [Chunk | Error, …]
//!                                      reads, checks (the Reader),        │     + transcript, outcome
//!                                      keeps the transcript               ▼
//!                              Python: take() swaps the whole batch out, one crossing
//! ```
//!
//! Python's thread is the one a Python caller cannot add more of, so it
//! does as little per chunk as it can: [`NativeLoop::take`] takes every
//! event that is ready (up to [`BATCH`]) in one swap under a lock and
//! makes them Python objects. Everything else a chunk costs — the Rust
//! reader's parse and sequence check, the transcript — is done before, by
//! a task of the runtime (the pump), on another core when there is one,
//! while Python works on the batch before.
//!
//! When nothing is ready, `take` says so, and Python waits for the loop's
//! wake-up descriptor ([`NativeLoop::fileno`]) in its own event loop (or,
//! blocking, on [`NativeLoop::next_batch_blocking`]): the pump writes one
//! byte to that socket when it next has something. No thread of the
//! runtime takes the GIL to hand a chunk over.
//!
//! The pump holds at most [`BATCH`] events that Python has not taken, then
//! waits for a `take`: a caller that stops reading stops the pump, and
//! then the connection's reading task (the client's backpressure), as a
//! loop read directly does.
//!
//! A loop keeps its transcript (protocol §11) up to a bound in bytes of
//! chunk JSON; past it the transcript is let go, the loop goes on, and
//! asking for the transcript says so. A chunk is shared between the
//! transcript and the `Chunk` Python is handed, never copied for it: the
//! transcript takes it over once Python has let it go (see [`Kept`]).

use std::collections::VecDeque;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Poll;

use futures_util::StreamExt;
use pyo3::prelude::*;
use pyo3::types::PyList;
use runloop_client::{
    AgenticLoopChunk, Broken, Event, Outcome as WireOutcome, RunLoop, Transcript,
};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::errors::{self, Failure};
use crate::events::{Chunk, Error, Outcome};
use crate::runtime::{Owned, block, bounded, runtime, seconds};

/// The most events one batch carries, and the most the pump holds for
/// Python.
pub const BATCH: usize = 512;

/// A transcript kept up to a bound.
///
/// A chunk goes into the transcript without a copy: it is shared with the
/// `Chunk` Python is handed (the parse of a 20 KiB tool response is not
/// cloned), and merged in once Python has most likely let it go, when
/// [`HELD`] newer chunks came after it. A chunk that Python still holds
/// then is read, not taken ([`Transcript::push_ref`]); a fragment that
/// merges into the chunk before it is read either way.
struct Kept {
    /// The loop coalesced so far, but for `pending`; `None` once it passed
    /// the bound.
    transcript: Option<Transcript>,
    /// The latest chunks, not yet in `transcript`, oldest first.
    pending: VecDeque<Arc<AgenticLoopChunk>>,
    /// Bytes of chunk JSON taken into it.
    bytes: u64,
    /// The bound.
    limit: u64,
    /// Chunks taken in before the bound was passed.
    chunks: u64,
}

/// How many of the latest chunks a loop's transcript leaves pending: the
/// package holds at most two batches (the one ready, and the one Python
/// works on), so a chunk older than that is Python's only if the caller
/// kept it.
const HELD: usize = 2 * BATCH;

impl Kept {
    fn new(limit: u64) -> Self {
        Kept {
            transcript: Some(Transcript::new()),
            pending: VecDeque::new(),
            bytes: 0,
            limit,
            chunks: 0,
        }
    }

    fn push(&mut self, chunk: &Arc<AgenticLoopChunk>, json_len: usize) {
        let Some(transcript) = &mut self.transcript else {
            return;
        };
        self.bytes = self.bytes.saturating_add(json_len as u64);
        if self.bytes > self.limit {
            // Let go, all of it: a transcript cut short would read as the
            // whole loop.
            self.transcript = None;
            self.pending = VecDeque::new();
            return;
        }
        self.chunks += 1;
        self.pending.push_back(Arc::clone(chunk));
        while self.pending.len() > HELD {
            if let Some(oldest) = self.pending.pop_front() {
                merge(transcript, oldest);
            }
        }
    }

    /// The transcript of every chunk but the latest `not_taken` (those
    /// Python has not been handed yet), pending ones merged in; `None`
    /// once it passed the bound.
    fn transcript(&mut self, not_taken: usize) -> Option<&Transcript> {
        let transcript = self.transcript.as_mut()?;
        let taken = self.pending.len().saturating_sub(not_taken);
        for chunk in self.pending.drain(..taken) {
            merge(transcript, chunk);
        }
        Some(transcript)
    }
}

/// Merges `chunk` into `transcript`, taking it over when no one else holds it.
fn merge(transcript: &mut Transcript, chunk: Arc<AgenticLoopChunk>) {
    match Arc::try_unwrap(chunk) {
        Ok(owned) => transcript.push(owned),
        Err(shared) => transcript.push_ref(&shared),
    };
}

/// One item of a batch.
#[derive(IntoPyObject)]
enum Item {
    Chunk(Chunk),
    Error(Error),
}

/// Who waits for the next event, and how to tell them.
#[derive(Clone, Copy, PartialEq)]
enum Waiting {
    /// No one: Python is working on a batch.
    No,
    /// Python, in its event loop, on the wake-up socket.
    Descriptor,
    /// Python, blocking, on [`Shared::arrived`].
    Blocking,
}

/// What the pump has made ready for Python.
struct Ready {
    /// Events not yet taken by Python, in order; at most [`BATCH`].
    items: Vec<Item>,
    /// Set once the loop has ended (after its last event was made ready).
    outcome: Option<WireOutcome>,
    /// Who waits for the next event.
    waiting: Waiting,
}

/// What the pump and Python share.
struct Shared {
    ready: Mutex<Ready>,
    /// The transcript, when one is kept (the pump's to add to).
    transcript: Mutex<Option<Kept>>,
    /// Woken when Python has taken a full batch: the pump has room again.
    room: Notify,
    /// Woken when something is ready for a Python that waits, blocking.
    arrived: Notify,
    /// The write end of the wake-up socket: one byte when something is
    /// ready for a Python that waits in its event loop.
    signal: UnixStream,
}

impl Shared {
    fn ready(&self) -> MutexGuard<'_, Ready> {
        locked(&self.ready)
    }

    /// Makes `events` ready, and tells whoever waits for them.
    fn add(&self, events: Vec<Option<Event>>) {
        let mut items = Vec::with_capacity(events.len());
        let mut outcome = None;
        {
            let mut transcript = locked(&self.transcript);
            for event in events {
                match event {
                    Some(Event::Chunk { chunk, json }) => {
                        let chunk = Arc::new(chunk);
                        if let Some(kept) = &mut *transcript {
                            kept.push(&chunk, json.len());
                        }
                        items.push(Item::Chunk(Chunk::new(chunk, json)));
                    }
                    Some(Event::Error(error)) => items.push(Item::Error(Error::new(error))),
                    Some(Event::End(end)) => outcome = Some(end),
                    // `End` always comes first; a stream that ends without
                    // it would be the connection's end.
                    None => outcome = Some(WireOutcome::Broken(Broken::ConnectionEnded)),
                }
            }
        }
        let waiting = {
            let mut ready = self.ready();
            ready.items.append(&mut items);
            if outcome.is_some() {
                ready.outcome = outcome;
            }
            std::mem::replace(&mut ready.waiting, Waiting::No)
        };
        match waiting {
            Waiting::No => {}
            // Full: a byte is there already, which says the same.
            Waiting::Descriptor => drop((&self.signal).write(&[1])),
            Waiting::Blocking => self.arrived.notify_one(),
        }
    }

    /// Swaps out what is ready into `batch` (empty): `Some(true)` when
    /// there are events, `Some(false)` when there are none yet (then
    /// `waiting` is told when there are), `None` when the loop has ended
    /// and all was taken.
    fn swap(&self, batch: &mut Vec<Item>, waiting: Waiting) -> Option<bool> {
        let mut ready = self.ready();
        if ready.items.is_empty() {
            if ready.outcome.is_some() {
                return None;
            }
            ready.waiting = waiting;
            return Some(false);
        }
        let full = ready.items.len() >= BATCH;
        std::mem::swap(&mut ready.items, batch);
        drop(ready);
        if full {
            self.room.notify_one();
        }
        Some(true)
    }
}

fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Reads `stream` into `shared` until the loop's end, a batch at a time,
/// never more than [`BATCH`] events ahead of Python. Returns the stream,
/// which holds its run open, for the loop's handle to keep.
async fn pump(mut stream: RunLoop, shared: Arc<Shared>) -> RunLoop {
    loop {
        // Room for at least one event.
        let room = loop {
            let notified = shared.room.notified();
            let held = shared.ready().items.len();
            if held < BATCH {
                break BATCH - held;
            }
            notified.await;
        };
        // Every event ready now, up to the room; waits for the first.
        let mut events = Vec::new();
        let mut ended = false;
        std::future::poll_fn(|cx| {
            while events.len() < room && !ended {
                match stream.poll_next_unpin(cx) {
                    Poll::Ready(event) => {
                        ended = !matches!(event, Some(Event::Chunk { .. } | Event::Error(_)));
                        events.push(event);
                    }
                    Poll::Pending => break,
                }
            }
            if events.is_empty() {
                Poll::Pending
            } else {
                Poll::Ready(())
            }
        })
        .await;
        shared.add(events);
        if ended {
            return stream;
        }
    }
}

/// One loop of a run, read in batches.
#[pyclass(module = "runloop._native", name = "Loop", frozen)]
pub struct NativeLoop {
    shared: Owned<Arc<Shared>>,
    /// The pump; its output is the loop's stream, kept (with its run)
    /// until this handle goes.
    pump: Owned<JoinHandle<RunLoop>>,
    /// The batch Python took last, emptied: its room is the next batch's
    /// (swapped with the pump's).
    spare: Mutex<Vec<Item>>,
    /// The read end of the wake-up socket.
    wake: UnixStream,
}

impl NativeLoop {
    /// Starts reading `stream`; its transcript is kept up to
    /// `transcript_limit` bytes of chunk JSON (`None`: none is kept).
    pub fn open(stream: RunLoop, transcript_limit: Option<u64>) -> PyResult<Self> {
        let (wake, signal) = UnixStream::pair()
            .and_then(|(read, write)| {
                read.set_nonblocking(true)?;
                write.set_nonblocking(true)?;
                Ok((read, write))
            })
            .map_err(|error| {
                errors::plain(&format!("cannot make a loop's wake-up socket: {error}"))
            })?;
        let shared = Arc::new(Shared {
            ready: Mutex::new(Ready {
                items: Vec::with_capacity(BATCH),
                outcome: None,
                waiting: Waiting::No,
            }),
            transcript: Mutex::new(transcript_limit.map(Kept::new)),
            room: Notify::new(),
            arrived: Notify::new(),
            signal,
        });
        let pump = runtime()?.spawn(pump(stream, Arc::clone(&shared)));
        Ok(NativeLoop {
            shared: Owned::new(shared),
            pump: Owned::new(pump),
            spare: Mutex::new(Vec::with_capacity(BATCH)),
            wake,
        })
    }
}

impl Drop for NativeLoop {
    fn drop(&mut self) {
        // A loop let go before its end: the pump stops reading (its
        // stream, and with it the loop's queue, goes with the task).
        if let Ok(pump) = self.pump.get() {
            pump.abort();
        }
    }
}

impl NativeLoop {
    /// The spare batch, taken out: no lock is held while Python's objects
    /// are made or while a blocking call waits (another thread's `take`
    /// would hold the GIL and wait for it). Another thread that takes at
    /// the same time gets a new one.
    fn spare(&self) -> Vec<Item> {
        std::mem::take(&mut *locked(&self.spare))
    }

    /// The batch, emptied, kept for the next.
    fn give_back(&self, batch: Vec<Item>) {
        *locked(&self.spare) = batch;
    }
}

/// `batch` as a Python list, emptied (its room kept for the next).
fn list<'py>(py: Python<'py>, batch: &mut Vec<Item>) -> PyResult<Bound<'py, PyList>> {
    PyList::new(py, batch.drain(..))
}

#[pymethods]
impl NativeLoop {
    /// Every event ready now, in order (up to [`BATCH`]), without waiting:
    /// an empty list when none is (then the wake-up descriptor becomes
    /// readable when one comes), `None` once the loop has ended and all
    /// was taken.
    fn take<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyList>>> {
        let shared = self.shared.get()?;
        let mut batch = self.spare();
        let taken = match shared.swap(&mut batch, Waiting::Descriptor) {
            None => Ok(None),
            Some(false) => Ok(Some(PyList::empty(py))),
            Some(true) => list(py, &mut batch).map(Some),
        };
        self.give_back(batch);
        taken
    }

    /// The descriptor that becomes readable when events are ready after a
    /// [`take`](Self::take) that found none.
    fn fileno(&self) -> i32 {
        self.wake.as_raw_fd()
    }

    /// Empties the wake-up socket (before the next `take`).
    fn drain(&self) {
        let mut sink = [0u8; 64];
        while let Ok(n @ 1..) = std::io::Read::read(&mut &self.wake, &mut sink) {
            if n < sink.len() {
                break;
            }
        }
    }

    /// The next events, blocking (the GIL released) until at least one is
    /// ready, `timeout` at most; `None` once the loop has ended.
    fn next_batch_blocking<'py>(
        &self,
        py: Python<'py>,
        timeout: Option<f64>,
    ) -> PyResult<Option<Bound<'py, PyList>>> {
        let shared = Arc::clone(self.shared.get()?);
        let limit = seconds(timeout, "timeout")?;
        let mut batch = self.spare();
        let next = async {
            loop {
                let arrived = shared.arrived.notified();
                match shared.swap(&mut batch, Waiting::Blocking) {
                    Some(false) => arrived.await,
                    taken => return Ok::<_, Failure>(taken.is_some()),
                }
            }
        };
        let taken = match block(py, bounded(limit, "the loop's next event", next)) {
            Ok(Ok(true)) => list(py, &mut batch).map(Some),
            Ok(Ok(false)) => Ok(None),
            Ok(Err(failure)) => Err(failure.into_pyerr(py)),
            Err(error) => Err(error),
        };
        self.give_back(batch);
        taken
    }

    /// How the loop ended; `None` until it has and every event was taken.
    fn outcome(&self) -> PyResult<Option<Outcome>> {
        let ready = self.shared.get()?.ready();
        if !ready.items.is_empty() {
            return Ok(None);
        }
        Ok(ready.outcome.clone().map(Outcome::new))
    }

    /// The loop coalesced so far (protocol §11), as chunks.
    fn transcript(&self) -> PyResult<Vec<Chunk>> {
        let shared = self.shared.get()?;
        // The transcript's lock first, so that the pump adds nothing
        // between the count and the merge.
        let mut kept = locked(&shared.transcript);
        let not_taken = (shared.ready().items.iter())
            .filter(|item| matches!(item, Item::Chunk(_)))
            .count();
        let Some(kept) = &mut *kept else {
            return Err(errors::plain(
                "this loop keeps no transcript (it was opened with transcript=False)",
            ));
        };
        let (limit, chunks) = (kept.limit, kept.chunks);
        let Some(transcript) = kept.transcript(not_taken) else {
            return Err(errors::transcript_too_large(limit, chunks));
        };
        transcript
            .chunks()
            .iter()
            .cloned()
            .map(Chunk::encoded)
            .collect()
    }
}
