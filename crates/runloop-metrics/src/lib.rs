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
mod labels;
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

pub use labels::{
    AgentFault, AuthorizationRefusal, ClosedAtAccept, ConnectionClosed, LoopOutcome, ProxyFault,
    ProxyLoop, Registration, Reload, RunEnd, RunRefusal, TlsFailure,
};
pub use proxy::ProxyMetrics;
pub use server::{ServerMetrics, StatsSnapshot, TenantFigures};

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

/// One metric of an exposition, as its table names it: its name (after
/// the exposition's prefix), its help, its unit, and how a scrape reads
/// it from `M` (the counts) and `L` (what else the scrape is given).
///
/// Each exposition is one table of these ([`ServerMetrics`]'s, the
/// tenants', [`ProxyMetrics`]'s): registering is reading the table, so a
/// metric is named once, and the docs' list is checked against what the
/// tables expose.
pub(crate) struct Row<M, L> {
    name: &'static str,
    help: &'static str,
    unit: Option<Unit>,
    read: fn(&M, &L) -> Reading,
}

/// The unit a metric's name ends in (Prometheus's conventions).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Unit {
    Bytes,
    Seconds,
}

impl<M, L> Row<M, L> {
    /// A metric with no unit.
    pub(crate) const fn new(
        name: &'static str,
        help: &'static str,
        read: fn(&M, &L) -> Reading,
    ) -> Self {
        Row {
            name,
            help,
            unit: None,
            read,
        }
    }

    /// A metric in bytes.
    pub(crate) const fn bytes(
        name: &'static str,
        help: &'static str,
        read: fn(&M, &L) -> Reading,
    ) -> Self {
        Row {
            unit: Some(Unit::Bytes),
            ..Row::new(name, help, read)
        }
    }

    /// A metric in seconds.
    pub(crate) const fn seconds(
        name: &'static str,
        help: &'static str,
        read: fn(&M, &L) -> Reading,
    ) -> Self {
        Row {
            unit: Some(Unit::Seconds),
            ..Row::new(name, help, read)
        }
    }
}

/// A metric's value at a scrape: anything the exposition writes.
pub(crate) struct Reading(Box<dyn EncodeMetric + Send + Sync>);

impl Reading {
    /// `metric`, as read at a scrape.
    pub(crate) fn of(metric: impl EncodeMetric + Send + Sync + 'static) -> Reading {
        Reading(Box::new(metric))
    }
}

impl std::fmt::Debug for Reading {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Reading")
    }
}

impl EncodeMetric for Reading {
    fn encode(&self, encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        self.0.encode(encoder)
    }

    fn metric_type(&self) -> MetricType {
        self.0.metric_type()
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The exposition of `rows` under `prefix`, each read from `metrics` and
/// `live`, appended to `text`.
fn expose<M, L>(text: &mut String, prefix: &str, rows: &[Row<M, L>], metrics: &M, live: &L) {
    let mut registry = Registry::with_prefix(prefix);
    for row in rows {
        let reading = (row.read)(metrics, live);
        match row.unit {
            None => registry.register(row.name, row.help, reading),
            Some(unit) => {
                let unit = match unit {
                    Unit::Bytes => prometheus_client::registry::Unit::Bytes,
                    Unit::Seconds => prometheus_client::registry::Unit::Seconds,
                };
                registry.register_with_unit(row.name, row.help, unit, reading);
            }
        }
    }
    // Writing to a String cannot fail.
    let _ = prometheus_client::encoding::prometheus_text::encode(text, &registry);
}

/// `values` × `unit`: a histogram's bounds, written in the unit that reads
/// best (`bounds(MS, [1, 5, 10])` is 1 ms, 5 ms, 10 ms).
const fn bounds<const N: usize>(unit: u64, values: [u64; N]) -> [u64; N] {
    let mut bounds = values;
    let mut at = 0;
    while at < N {
        bounds[at] *= unit;
        at += 1;
    }
    bounds
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

    /// The names a monitor queries (a counter's with its `_total`).
    fn queried(text: &str) -> std::collections::BTreeSet<String> {
        text.lines()
            .filter_map(|line| line.strip_prefix("# TYPE "))
            .filter_map(|line| line.split_once(' '))
            .map(|(name, _)| name.to_owned())
            .collect()
    }

    #[test]
    fn the_docs_list_every_metric_the_tables_expose_and_no_other() {
        let server = ServerMetrics::new();
        server.tenant("a");
        let text = server.encode(&StatsSnapshot::default(), false) + &ProxyMetrics::new().encode();
        let tables = queried(&text);
        // Every row, once: the server's `proxy_paths_open` and the proxy's
        // `paths_open` are one name, `runloop_proxy_paths_open`, exposed by
        // two processes.
        let rows = server::SERVER.len() + server::TENANTS.len() + proxy::PROXY.len();
        assert_eq!(tables.len(), rows - 1, "{tables:#?}");
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/metrics.md");
        let docs = std::fs::read_to_string(path).expect("docs/metrics.md");
        let named: std::collections::BTreeSet<String> = docs
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|word| word.starts_with("runloop_"))
            .map(str::to_owned)
            .collect();
        let undocumented: Vec<_> = tables.difference(&named).collect();
        let unexposed: Vec<_> = named.difference(&tables).collect();
        assert!(
            undocumented.is_empty(),
            "not in docs/metrics.md: {undocumented:?}"
        );
        assert!(
            unexposed.is_empty(),
            "in docs/metrics.md, not exposed: {unexposed:?}"
        );
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
