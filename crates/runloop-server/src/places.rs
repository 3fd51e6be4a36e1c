//! A run-loop channel's places in its connection's outgoing queue, counted
//! in bytes as well as in responses.
//!
//! A response the relay queues holds places until the writer has taken it
//! from the queue: places of its channel (at most
//! [`max_queued_responses`](Limits::max_queued_responses) responses and
//! [`max_queued_bytes`](Limits::max_queued_bytes) bytes) and places of the
//! whole connection
//! ([`max_connection_queued_bytes`](Limits::max_connection_queued_bytes)
//! bytes). A channel out of places stops reading its proxy, so a caller
//! that does not read holds the server to those bounds whatever the size of
//! its chunks, and small chunks can queue deep enough for the writer to
//! send many of them at once.
//!
//! Both bounds of a channel are one semaphore: a response costs its size,
//! but never less than one response's share of the bytes (the byte bound
//! divided by the count bound, rounded up), so no more than the counted
//! responses fit, and never more than all of it, so a response larger than
//! the bound still goes, alone. The connection's semaphore counts bytes
//! only, with the same ceiling. Both are fair (first come, first served),
//! so one busy channel cannot keep the others of its connection waiting
//! for ever.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use runloop_wire::limits::Limits;
use runloop_wire::writer::Place;

/// One side of the places: a semaphore and what a response of it costs.
#[derive(Debug)]
struct Pool {
    semaphore: Arc<Semaphore>,
    /// The least a response costs.
    share: u32,
    /// Every place; the most a response costs.
    all: u32,
}

impl Pool {
    /// A pool of `bytes` places where a response costs at least `share`.
    fn new(semaphore: Arc<Semaphore>, share: usize, all: usize) -> Pool {
        let all = clamp(all);
        Pool {
            semaphore,
            share: clamp(share).min(all),
            all,
        }
    }

    /// A pool of `all` places, each response costing at least `share`.
    fn with_places(share: usize, all: usize) -> Pool {
        let all = clamp(all);
        Pool::new(Arc::new(Semaphore::new(all as usize)), share, all as usize)
    }

    fn cost(&self, size: usize) -> u32 {
        clamp(size).clamp(self.share, self.all)
    }

    fn try_take(&self, size: usize) -> Option<OwnedSemaphorePermit> {
        Arc::clone(&self.semaphore)
            .try_acquire_many_owned(self.cost(size))
            .ok()
    }

    async fn take(&self, size: usize) -> OwnedSemaphorePermit {
        let Ok(permit) = Arc::clone(&self.semaphore)
            .acquire_many_owned(self.cost(size))
            .await
        else {
            unreachable!("the places are never closed")
        };
        permit
    }
}

/// A count of bytes or places as a semaphore takes them.
fn clamp(count: usize) -> u32 {
    u32::try_from(count.min(Semaphore::MAX_PERMITS)).unwrap_or(u32::MAX)
}

/// The connection's byte places, shared by its channels.
pub(crate) fn connection(limits: &Limits) -> Arc<Semaphore> {
    Arc::new(Semaphore::new(
        clamp(limits.max_connection_queued_bytes) as usize
    ))
}

/// One channel's places, and its connection's.
#[derive(Debug)]
pub(crate) struct Places {
    channel: Pool,
    connection: Pool,
}

impl Places {
    /// A channel's places under `limits`, in a connection whose byte places
    /// are `connection` (made by [`connection`] with the same limits).
    pub(crate) fn new(limits: &Limits, connection: Arc<Semaphore>) -> Places {
        let responses = limits.max_queued_responses.max(1);
        let share = limits.max_queued_bytes.div_ceil(responses);
        Places {
            channel: Pool::with_places(share, share.saturating_mul(responses)),
            connection: Pool::new(connection, 1, limits.max_connection_queued_bytes),
        }
    }

    /// Places for a response of `size` bytes, if they are free now.
    pub(crate) fn try_take(&self, size: usize) -> Option<Place> {
        let channel = self.channel.try_take(size)?;
        let connection = self.connection.try_take(size)?;
        Some(Place::two(channel, connection))
    }

    /// Places for a response of `size` bytes, once they are free: the
    /// channel's first, then the connection's.
    pub(crate) async fn take(&self, size: usize) -> Place {
        let channel = self.channel.take(size).await;
        let connection = self.connection.take(size).await;
        Place::two(channel, connection)
    }
}

/// What a channel writing to the socket itself has written since it took
/// it, against the bounds of its queue places.
#[derive(Debug)]
pub(crate) struct Share {
    responses: usize,
    bytes: usize,
    max_responses: usize,
    max_bytes: usize,
}

impl Share {
    /// A channel's share of the socket under `limits`: as much as its
    /// places would hold.
    pub(crate) fn new(limits: &Limits) -> Share {
        Share {
            responses: 0,
            bytes: 0,
            max_responses: limits.max_queued_responses,
            max_bytes: limits.max_queued_bytes,
        }
    }

    /// Notes a response of `size` bytes written; whether the share is
    /// spent.
    pub(crate) fn spend(&mut self, size: usize) -> bool {
        self.responses += 1;
        self.bytes += size;
        self.responses >= self.max_responses || self.bytes >= self.max_bytes
    }
}

#[cfg(test)]
mod tests {
    use futures_util::FutureExt;

    use super::*;

    fn places(responses: usize, bytes: usize, connection_bytes: usize) -> (Places, Arc<Semaphore>) {
        let limits = Limits {
            max_queued_responses: responses,
            max_queued_bytes: bytes,
            max_connection_queued_bytes: connection_bytes,
            ..Limits::default()
        };
        let connection = connection(&limits);
        (Places::new(&limits, Arc::clone(&connection)), connection)
    }

    #[test]
    fn small_responses_are_bounded_by_their_count() {
        let (places, _) = places(4, 1 << 20, 16 << 20);
        let held: Vec<_> = (0..4)
            .map(|_| places.try_take(10).expect("a place"))
            .collect();
        assert!(places.try_take(10).is_none(), "a fifth response");
        drop(held);
        assert!(places.try_take(10).is_some());
    }

    #[test]
    fn large_responses_are_bounded_by_their_bytes() {
        let (places, _) = places(1024, 64 << 10, 16 << 20);
        let held: Vec<_> = (0..4)
            .map(|_| places.try_take(16 << 10).expect("a place"))
            .collect();
        assert!(places.try_take(16 << 10).is_none(), "past 64 KiB");
        drop(held);
        assert!(places.try_take(16 << 10).is_some());
    }

    #[test]
    fn a_response_larger_than_the_bound_goes_alone() {
        let (places, _) = places(32, 64 << 10, 16 << 20);
        let huge = places.try_take(15 << 20).expect("alone, it goes");
        assert!(places.try_take(1).is_none(), "nothing beside it");
        drop(huge);
        assert!(places.try_take(1).is_some());
    }

    #[test]
    fn the_connection_bounds_its_channels_together() {
        let limits = Limits {
            max_queued_bytes: 1 << 20,
            max_connection_queued_bytes: 1 << 20,
            ..Limits::default()
        };
        let connection = connection(&limits);
        let one = Places::new(&limits, Arc::clone(&connection));
        let other = Places::new(&limits, Arc::clone(&connection));
        let held = one.try_take(768 << 10).expect("a place");
        assert!(
            other.try_take(512 << 10).is_none(),
            "the connection is full"
        );
        assert_eq!(connection.available_permits(), 256 << 10);
        drop(held);
        assert!(other.try_take(512 << 10).is_some());
    }

    #[test]
    fn a_share_is_spent_at_either_bound() {
        let limits = Limits {
            max_queued_responses: 3,
            max_queued_bytes: 1000,
            ..Limits::default()
        };
        let mut by_count = Share::new(&limits);
        assert!(!by_count.spend(10));
        assert!(!by_count.spend(10));
        assert!(by_count.spend(10), "the third response spends it");
        let mut by_bytes = Share::new(&limits);
        assert!(!by_bytes.spend(999));
        assert!(by_bytes.spend(1), "the thousandth byte spends it");
    }

    #[tokio::test]
    async fn a_waiting_response_gets_its_places_when_they_are_given_back() {
        let (places, _) = places(1, 4096, 4096);
        let held = places.try_take(100).expect("a place");
        let waiting = places.take(100);
        tokio::pin!(waiting);
        assert!((&mut waiting).now_or_never().is_none(), "no place yet");
        drop(held);
        let _place = waiting.await;
    }
}
