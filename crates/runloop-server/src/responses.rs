//! A run-loop channel's responses on their way to the caller: the relay's
//! one writer.
//!
//! While no other task is writing to the connection's socket and nothing
//! is queued for it, the responses go to the socket directly, as a plain
//! forwarder would write them: every message the proxy has ready, then one
//! flush. Otherwise each response is queued, holding its places in the
//! connection's queue ([`places`](super::places)) until the connection's
//! writer takes it, and the responses ready together are queued together
//! (one push, at most one wake-up of the writer). Either way a caller that
//! reads slowly stops the relay: a full socket holds it, or its places run
//! out, and TCP carries the pressure back to the agent program.
//!
//! [`Responses::push`] and [`Responses::flush`] are all a relay sees of
//! this choice.

use std::future::Future;
use std::time::Instant;

use bytes::Bytes;
use runloop_proto::ErrorValue;
use runloop_proto::frame;
use runloop_wire::lane::COPIED;
use runloop_wire::limits::Limits;
use runloop_wire::writer::{Direct, FrameBytes, Outgoing, Put};

use super::outbox::ChannelOutbox;
use super::places::{Places, Share};
use super::run_end::RunEnd;

/// One channel's writer (see the module's docs). Whatever is ready when
/// it is dropped is queued then, before the channel's last response.
pub(crate) struct Responses<'a> {
    outbox: &'a ChannelOutbox,
    places: Places,
    limits: Limits,
    /// Every response of the channel begins with these bytes.
    header: Bytes,
    /// The socket, while the channel writes to it itself.
    socket: Option<Socket<'a>>,
    /// Responses ready to be queued together.
    ready: Vec<Outgoing>,
}

impl<'a> Responses<'a> {
    pub(crate) fn new(outbox: &'a ChannelOutbox, limits: &Limits) -> Self {
        Responses {
            outbox,
            places: outbox.places(limits),
            limits: *limits,
            header: outbox.message(&[]).into(),
            socket: None,
            ready: Vec::new(),
        }
    }

    /// Whether nothing is waiting for a [`flush`](Self::flush): the relay
    /// may then wait for its next message.
    pub(crate) fn is_idle(&self) -> bool {
        self.socket.is_none() && self.ready.is_empty()
    }

    /// Sends `message` (a run-loop payload that came at `relayed_at`) as
    /// the channel's next response, or readies it to go with the next
    /// flush. Waits while the socket or the channel's places are full;
    /// the run's end cuts the wait.
    pub(crate) async fn push<F: Future<Output = ErrorValue>>(
        &mut self,
        message: &Bytes,
        relayed_at: Instant,
        run_end: &mut RunEnd<'_, F>,
    ) -> Result<(), ErrorValue> {
        let size = message.len() + frame::HEADER_LEN;
        if self.is_idle() {
            self.socket = self
                .outbox
                .direct()
                .map(|direct| Socket::new(direct, &self.limits));
        }
        if let Some(socket) = &mut self.socket {
            // A small frame is copied onto the lane from where it lies (no
            // hold on its bytes); a large one goes as its own bytes.
            let copied = if size <= COPIED {
                socket.direct.put_copy(&self.header, message, relayed_at)
            } else {
                None
            };
            // On the lane without a wait (or a future) while it has room.
            let put = match copied {
                Some(put) => put,
                None => {
                    let frame = FrameBytes::apart(self.header.clone(), message.clone());
                    socket.direct.put(frame, relayed_at)
                }
            };
            match put {
                Put::Done => {}
                Put::Full => run_end.or(socket.direct.flush()).await?,
                Put::Feed(frame) => run_end.or(socket.direct.feed(frame, relayed_at)).await?,
            }
            if socket.share.spend(size) {
                // Its share written: the others' turn.
                self.flush_socket(run_end).await?;
            }
            return Ok(());
        }
        let place = match self.places.try_take(size) {
            Some(place) => place,
            None => {
                // The places come back as the writer takes what is queued:
                // queue what is ready before waiting.
                self.queue_ready();
                run_end.or(self.places.take(size)).await?
            }
        };
        let response = self.outbox.response(message, place, relayed_at);
        self.ready.push(response);
        Ok(())
    }

    /// Sends what is pushed: queues what is ready, flushes the socket and
    /// gives it back.
    pub(crate) async fn flush<F: Future<Output = ErrorValue>>(
        &mut self,
        run_end: &mut RunEnd<'_, F>,
    ) -> Result<(), ErrorValue> {
        self.queue_ready();
        self.flush_socket(run_end).await
    }

    async fn flush_socket<F: Future<Output = ErrorValue>>(
        &mut self,
        run_end: &mut RunEnd<'_, F>,
    ) -> Result<(), ErrorValue> {
        match self.socket.take() {
            Some(mut socket) => run_end.or(socket.direct.flush()).await,
            None => Ok(()),
        }
    }

    fn queue_ready(&mut self) {
        if !self.ready.is_empty() {
            self.outbox.respond_all(std::mem::take(&mut self.ready));
        }
    }
}

impl Drop for Responses<'_> {
    fn drop(&mut self) {
        // A socket still held was fed: the connection's writer flushes
        // after whatever comes next (the channel's last response, its
        // finish), which it queues after these.
        self.queue_ready();
    }
}

/// The connection's socket while the channel writes to it itself, and the
/// share of it the channel has used.
struct Socket<'a> {
    direct: Direct<'a>,
    share: Share,
}

impl<'a> Socket<'a> {
    fn new(direct: Direct<'a>, limits: &Limits) -> Self {
        Socket {
            direct,
            share: Share::new(limits),
        }
    }
}
