//! Latency histograms: durations counted into fixed buckets with atomics.
//!
//! It sits on the relay's hot path (the writer records each relayed
//! frame's time from the proxy's message to the caller's socket), so an
//! observation is one atomic add to its bucket and one to the sum, which a
//! batch of observations shares; no lock, no allocation. It lives in the
//! wire, beside the writer that records into it; the metrics expose it in
//! the Prometheus text format without the wire knowing Prometheus.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Durations in buckets whose upper bounds are fixed when it is made.
/// Cheap to clone: clones observe together.
#[derive(Clone)]
pub struct Histogram {
    inner: Arc<HistogramInner>,
}

struct HistogramInner {
    /// Upper bounds, nanoseconds, ascending; a last bucket holds the rest.
    bounds: &'static [u64],
    /// Observations per bucket (not cumulative): `bounds.len() + 1`.
    buckets: Box<[AtomicU64]>,
    /// The sum of all observations, nanoseconds.
    sum: AtomicU64,
}

/// Nanoseconds in a microsecond.
pub const US: u64 = 1_000;
/// Nanoseconds in a millisecond.
pub const MS: u64 = 1_000_000;
/// Nanoseconds in a second.
pub const S: u64 = 1_000_000_000;

/// Buckets a histogram has at most, the last (+Inf) included.
const MAX_BUCKETS: usize = 32;

impl Histogram {
    /// A histogram whose buckets end at `bounds` (nanoseconds, ascending,
    /// fewer than 32), and a last bucket for the rest.
    pub fn new(bounds: &'static [u64]) -> Self {
        assert!(bounds.len() < MAX_BUCKETS, "at most {MAX_BUCKETS} buckets");
        debug_assert!(bounds.windows(2).all(|pair| pair[0] < pair[1]));
        Histogram {
            inner: Arc::new(HistogramInner {
                bounds,
                buckets: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
                sum: AtomicU64::new(0),
            }),
        }
    }

    /// Records one duration.
    pub fn observe(&self, duration: Duration) {
        self.observe_all([(duration, 1)]);
    }

    /// Records several durations, each `count` times, counted first where
    /// no other core writes: then one atomic add to each bucket they fell
    /// in, and one to the sum. (The buckets are shared by every
    /// connection; a batch of a busy connection's frames mostly falls in
    /// one or two.)
    pub fn observe_all(&self, durations: impl IntoIterator<Item = (Duration, u64)>) {
        let inner = &*self.inner;
        let mut counts = [0u64; MAX_BUCKETS];
        let mut sum = 0u64;
        for (duration, count) in durations {
            let nanos = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
            counts[inner.bounds.partition_point(|&bound| bound < nanos)] += count;
            sum = sum.saturating_add(nanos.saturating_mul(count));
        }
        for (bucket, &count) in inner.buckets.iter().zip(&counts) {
            if count > 0 {
                bucket.fetch_add(count, Ordering::Relaxed);
            }
        }
        if sum > 0 {
            inner.sum.fetch_add(sum, Ordering::Relaxed);
        }
    }

    /// The buckets' upper bounds, counts (not cumulative, the last for
    /// what is above every bound) and sum, as they are now.
    pub fn read(&self) -> Read {
        let inner = &*self.inner;
        Read {
            bounds: inner.bounds,
            counts: inner
                .buckets
                .iter()
                .map(|bucket| bucket.load(Ordering::Relaxed))
                .collect(),
            sum: inner.sum.load(Ordering::Relaxed),
        }
    }

    /// How many durations were recorded.
    pub fn count(&self) -> u64 {
        self.inner
            .buckets
            .iter()
            .map(|bucket| bucket.load(Ordering::Relaxed))
            .sum()
    }
}

impl std::fmt::Debug for Histogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Histogram")
            .field("count", &self.count())
            .finish_non_exhaustive()
    }
}

/// What a [`Histogram`] holds at one moment ([`Histogram::read`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Read {
    /// Upper bounds, nanoseconds, ascending.
    pub bounds: &'static [u64],
    /// Observations per bucket, not cumulative: `bounds.len() + 1`, the
    /// last for durations above every bound.
    pub counts: Vec<u64>,
    /// The sum of all observations, nanoseconds.
    pub sum: u64,
}
