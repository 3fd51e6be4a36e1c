//! Metrics: what the server and the proxy count, exposed in the Prometheus
//! text format by the admin listener ([`admin`]).
//!
//! Counting sits on the relay's hot path, so what a count costs is decided
//! here, once:
//!
//! - A counter is one relaxed atomic add.
//! - A counter with a label has a closed set of values, known when the
//!   program is built ([`Label`]); [`Counts`] keeps one atomic per value in
//!   an array, so counting never hashes a label set or takes a lock (as
//!   `prometheus-client`'s `Family` would), and every series is exposed
//!   from the first scrape, at zero, so a rate over it is never missing.
//! - A [`Histogram`] is one atomic add to its bucket and one to its sum,
//!   which several observations can share (`prometheus-client`'s own
//!   histogram takes a lock per observation).
//!
//! `prometheus-client` writes the exposition: names, `# HELP` and `# TYPE`,
//! the `_total` suffix of counters, label escaping and cumulative buckets.
//! Names follow Prometheus's conventions: a `runloop_` prefix, counters end
//! in `_total`, durations are in seconds and sizes in bytes.

pub mod admin;
mod proxy;
mod server;

use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

pub use runloop_wire::histogram::{Histogram, MS, S, US};

/// Lines of agent programs' output the runtimes of this process dropped
/// instead of logging, over a run's output budget or its tenant's log rate
/// (`runloop_agent_log_dropped_lines_total`). Process-wide, since the
/// runtimes that read the output know nothing of the server's metrics;
/// the server's exposition reads it.
pub static AGENT_LOG_DROPPED_LINES: AtomicU64 = AtomicU64::new(0);

pub use proxy::{AgentFault, ProxyLoop, ProxyMetrics, Registration};
pub use server::{
    AuthorizationRefusal, ClosedAtAccept, ConnectionClosed, LoopOutcome, ProxyFault, Reload,
    RunEnd, RunRefusal, ServerMetrics, StatsSnapshot, TenantFigures, TlsFailure,
};

/// The `Content-Type` of the exposition (the Prometheus text format 0.0.4).
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// A label whose values are a closed set, one counter each ([`Counts`]).
pub trait Label: Copy + 'static {
    /// The label's name.
    const KEY: &'static str;
    /// Every value, in the order they are exposed.
    const ALL: &'static [Self];
    /// This value as exposed.
    fn name(self) -> &'static str;
    /// This value's place in [`ALL`](Self::ALL).
    fn index(self) -> usize;
}

/// Declares an enum whose variants are the values of a [`Label`].
macro_rules! label {
    (
        $(#[$doc:meta])*
        pub enum $name:ident ($key:literal) {
            $( $(#[$vdoc:meta])* $variant:ident = $value:literal, )+
        }
    ) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum $name {
            $( $(#[$vdoc])* $variant, )+
        }

        impl $crate::Label for $name {
            const KEY: &'static str = $key;
            const ALL: &'static [Self] = &[$($name::$variant,)+];
            fn name(self) -> &'static str {
                match self {
                    $( $name::$variant => $value, )+
                }
            }
            fn index(self) -> usize {
                self as usize
            }
        }
    };
}
pub(crate) use label;

/// A counter per value of a [`Label`]. Cheap to clone: clones count together.
pub struct Counts<L> {
    counts: Arc<[AtomicU64]>,
    label: PhantomData<fn() -> L>,
}

impl<L: Label> Counts<L> {
    fn new() -> Self {
        Counts {
            counts: L::ALL.iter().map(|_| AtomicU64::new(0)).collect(),
            label: PhantomData,
        }
    }

    /// Counts one for `label`.
    pub fn inc(&self, label: L) {
        self.counts[label.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// The count for `label`.
    pub fn get(&self, label: L) -> u64 {
        self.counts[label.index()].load(Ordering::Relaxed)
    }
}

impl<L> Clone for Counts<L> {
    fn clone(&self) -> Self {
        Counts {
            counts: Arc::clone(&self.counts),
            label: PhantomData,
        }
    }
}

impl<L: Label> std::fmt::Debug for Counts<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut map = f.debug_map();
        for &label in L::ALL {
            map.entry(&label.name(), &self.get(label));
        }
        map.finish()
    }
}

impl<L: Label> EncodeMetric for Counts<L> {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        for &label in L::ALL {
            let labels = [(L::KEY, label.name())];
            encoder
                .encode_family(&labels)?
                .encode_counter::<NoLabelSet, _, u64>(&self.get(label), None)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Counter
    }
}

/// A [`Histogram`] as the exposition writes it: cumulative buckets with
/// `+Inf`, a count and a sum, in seconds. The histogram itself lives in
/// `runloop_wire` (the writer of every framed connection records into
/// it, and the wire knows nothing of Prometheus); this wrapper is what is
/// registered.
#[derive(Debug, Clone)]
pub struct Exposed(pub Histogram);

impl EncodeMetric for Exposed {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let read = self.0.read();
        let seconds = |nanos: u64| nanos as f64 / S as f64;
        let buckets: Vec<(f64, u64)> = read
            .bounds
            .iter()
            .map(|&bound| seconds(bound))
            .chain([f64::INFINITY])
            .zip(read.counts)
            .collect();
        let count = buckets.iter().map(|(_, n)| n).sum();
        let sum = seconds(read.sum);
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// The exposition of `registries`, one after the other.
fn encode<'a>(registries: impl IntoIterator<Item = &'a Registry>) -> String {
    let mut text = String::new();
    for registry in registries {
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut text, registry);
    }
    text
}

/// Whether a chunk's JSON is a fatal notification (protocol §8): the one
/// thing about a loop's last chunk the counts of outcomes need. Asked once
/// per loop, of its last chunk only.
pub fn is_fatal(chunk: &[u8]) -> bool {
    use runloop_proto::run_loop::AgenticLoopChunk;
    serde_json::from_slice::<AgenticLoopChunk>(chunk).is_ok_and(|chunk| chunk.is_fatal())
}

/// Whether a chunk's JSON can be a fatal notification at all: it holds
/// the literal `true`, which JSON cannot escape. A byte scan, for a relay
/// that keeps a loop's last chunk only to ask [`is_fatal`] at the end: a
/// large chunk that cannot be fatal is let go at once instead of being held
/// beside the copy on its way out.
pub fn may_be_fatal(chunk: &[u8]) -> bool {
    // Built once: `memmem::find` builds its searcher on every call, which
    // cost more than the scan of a small chunk.
    static TRUE: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"true"));
    TRUE.find(chunk).is_some()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    label! {
        /// A label for the tests.
        pub enum Colour("colour") {
            /// Red.
            Red = "red",
            /// Green.
            Green = "green",
        }
    }

    fn exposed(register: impl FnOnce(&mut Registry)) -> String {
        let mut registry = Registry::with_prefix("test");
        register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut text, &registry)
            .expect("encodes");
        text
    }

    #[test]
    fn counts_expose_every_value_from_the_start() {
        let counts = Counts::<Colour>::new();
        let text = exposed(|r| r.register("paints", "Paints by colour", counts.clone()));
        assert!(
            text.contains("test_paints_total{colour=\"red\"} 0\n"),
            "{text}"
        );
        assert!(
            text.contains("test_paints_total{colour=\"green\"} 0\n"),
            "{text}"
        );
        counts.inc(Colour::Green);
        counts.inc(Colour::Green);
        let text = exposed(|r| r.register("paints", "Paints by colour", counts.clone()));
        assert!(
            text.contains("# TYPE test_paints_total counter\n"),
            "{text}"
        );
        assert!(
            text.contains("test_paints_total{colour=\"green\"} 2\n"),
            "{text}"
        );
        assert_eq!(counts.get(Colour::Red), 0);
    }

    #[test]
    fn a_histogram_puts_each_duration_in_the_first_bucket_that_holds_it() {
        static BOUNDS: [u64; 2] = [MS, S];
        let histogram = Histogram::new(&BOUNDS);
        for duration in [Duration::from_micros(10), Duration::from_millis(2)] {
            histogram.observe(duration);
        }
        // A batch: several durations at once, one of them twice.
        histogram.observe_all([(Duration::from_micros(500), 2), (Duration::from_secs(5), 1)]);
        let text = exposed(|r| {
            r.register_with_unit(
                "wait",
                "Waits",
                prometheus_client::registry::Unit::Seconds,
                Exposed(histogram.clone()),
            );
        });
        // Cumulative, with +Inf, and a sum in seconds.
        assert!(
            text.contains("test_wait_seconds_bucket{le=\"0.001\"} 3\n"),
            "{text}"
        );
        assert!(
            text.contains("test_wait_seconds_bucket{le=\"1\"} 4\n"),
            "{text}"
        );
        assert!(
            text.contains("test_wait_seconds_bucket{le=\"+Inf\"} 5\n"),
            "{text}"
        );
        assert!(text.contains("test_wait_seconds_count 5\n"), "{text}");
        assert!(text.contains("test_wait_seconds_sum 5.00301\n"), "{text}");
        assert_eq!(histogram.count(), 5);
    }

    #[test]
    fn only_a_fatal_notification_is_fatal() {
        assert!(is_fatal(
            br#"{"type":"notification","is_fatal":true,"message":null}"#
        ));
        assert!(!is_fatal(
            br#"{"type":"notification","is_fatal":false,"message":1}"#
        ));
        assert!(!is_fatal(
            br#"{"type":"assistant_text_content","text":"is_fatal"}"#
        ));
        assert!(!is_fatal(b"not json"));
        for fatal in [
            &br#"{"type":"notification","is_fatal":true,"message":null}"#[..],
            br#"{"type":"notification","is_\u0066atal":true,"message":null}"#,
        ] {
            assert!(may_be_fatal(fatal) && is_fatal(fatal));
        }
        assert!(!may_be_fatal(
            br#"{"type":"notification","is_fatal":false,"message":null}"#
        ));
        assert!(!is_fatal(b""));
    }
}
