//! The run's end, waited for beside whatever a relay waits for.
//!
//! A relay waits on many things (its proxy's path, the caller's socket,
//! places in the queue); whichever it waits on, the run's end (a stop, the
//! caller gone, the server draining) must cut the loop with its reason.
//! One future serves the whole relay, so a wait costs no waiter
//! registration of its own.

use std::future::Future;
use std::pin::{Pin, pin};
use std::task::Poll;

use futures_util::FutureExt;
use runloop_proto::{ErrorKind, ErrorValue};
use tokio::sync::watch;

/// The run's end, waited for beside whatever the relay waits for. One
/// future for the whole relay: making a new one per message would register
/// and drop a waiter each time.
pub(crate) struct RunEnd<'a, F> {
    /// The run's ending, only to see whether it has changed: an atomic
    /// load, where polling `ended` takes its waiters' lock.
    watch: watch::Receiver<Option<ErrorValue>>,
    /// Whether the run had not ended when the relay began.
    quiet: bool,
    ended: Pin<&'a mut F>,
}

impl<'a, F: Future<Output = ErrorValue>> RunEnd<'a, F> {
    /// The end of the run whose ending `watch` holds; `ended` is
    /// [`ended`] of the same watch, pinned where the relay runs.
    pub(crate) fn new(watch: watch::Receiver<Option<ErrorValue>>, ended: Pin<&'a mut F>) -> Self {
        let quiet = watch.borrow().is_none();
        RunEnd {
            watch,
            quiet,
            ended,
        }
    }

    /// `work`'s output, or the run's end (why it ended) if that comes
    /// first. The run's end wins a tie.
    ///
    /// While the run's ending has not changed, the work is polled first and
    /// the end only when the work must wait (to be woken by either): most
    /// of a busy loop's messages are already read when the relay asks for
    /// them, and polling the end takes its waiters' lock. Each poll of the
    /// relay polls the work once, so a wait costs one read of the socket.
    pub(crate) async fn or<T>(&mut self, work: impl Future<Output = T>) -> Result<T, ErrorValue> {
        let mut work = pin!(work);
        std::future::poll_fn(|cx| {
            let quiet = self.quiet && matches!(self.watch.has_changed(), Ok(false));
            if !quiet && let Poll::Ready(why) = self.ended.as_mut().poll(cx) {
                return Poll::Ready(Err(why));
            }
            if let Poll::Ready(output) = work.as_mut().poll(cx) {
                return Poll::Ready(Ok(output));
            }
            if quiet && let Poll::Ready(why) = self.ended.as_mut().poll(cx) {
                return Poll::Ready(Err(why));
            }
            Poll::Pending
        })
        .await
    }

    /// `work`'s output if it is ready now, or the run's end if that has
    /// come; `None` if neither is.
    pub(crate) fn ready<T>(
        &mut self,
        work: impl Future<Output = T>,
    ) -> Option<Result<T, ErrorValue>> {
        if self.quiet && matches!(self.watch.has_changed(), Ok(false)) {
            return work.now_or_never().map(Ok);
        }
        self.or(work).now_or_never()
    }
}

/// Resolves with the run's ending reason once it is set.
pub(crate) async fn ended(mut ending: watch::Receiver<Option<ErrorValue>>) -> ErrorValue {
    loop {
        if let Some(why) = ending.borrow_and_update().clone() {
            return why;
        }
        if ending.changed().await.is_err() {
            return ErrorValue::kind(ErrorKind::Server, "the run ended");
        }
    }
}
