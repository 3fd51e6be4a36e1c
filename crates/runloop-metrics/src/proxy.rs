//! The proxy's metrics: its side of registrations and loops, and what the
//! agent program did wrong.

use std::sync::atomic::{AtomicI64, Ordering};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::ConstGauge;

use super::{
    AgentFault, Counts, Exposed, Histogram, LoopOutcome, MS, ProxyLoop, Reading, Registration, Row,
};

/// Bounds of the time to a loop's first chunk: 1 ms to 60 s.
static FIRST_CHUNK_BOUNDS: [u64; 12] = super::bounds(
    MS,
    [
        1, 5, 10, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 60_000,
    ],
);

/// The proxy's counters and histograms.
#[derive(Debug)]
pub struct ProxyMetrics {
    /// Registration asks, by result.
    pub registrations: Counts<Registration>,
    /// Loops answered, by the outcome sent.
    pub loops: Counts<LoopOutcome>,
    /// Loop asks refused without calling the agent program, by reason.
    pub refused: Counts<ProxyLoop>,
    /// Failures of the agent program during a loop, by kind.
    pub agent_faults: Counts<AgentFault>,
    /// Chunks passed from the agent program to the server.
    pub chunks: Counter,
    /// Bytes of chunk JSON passed on.
    pub bytes: Counter,
    /// Time from a loop's ask to its first chunk.
    pub first_chunk: Histogram,
    /// WebSocket paths from the server open now.
    pub paths: AtomicI64,
}

impl Default for ProxyMetrics {
    fn default() -> Self {
        ProxyMetrics::new()
    }
}

impl ProxyMetrics {
    /// Every metric at zero.
    pub fn new() -> ProxyMetrics {
        ProxyMetrics {
            registrations: Counts::new(),
            loops: Counts::new(),
            refused: Counts::new(),
            agent_faults: Counts::new(),
            chunks: Counter::default(),
            bytes: Counter::default(),
            first_chunk: Histogram::new(&FIRST_CHUNK_BOUNDS),
            paths: AtomicI64::new(0),
        }
    }

    /// The exposition, with the paths open now.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        super::expose(&mut text, "runloop_proxy", PROXY, self, &());
        text
    }
}

/// Every metric of the proxy's exposition, in its order (after the
/// prefix `runloop_proxy_`).
pub(crate) const PROXY: &[Row<ProxyMetrics, ()>] = &[
    Row::new("registrations", "Registration asks, by result", |m, _| {
        Reading::of(m.registrations.clone())
    }),
    Row::new(
        "loops",
        "Loops the proxy answered, by the outcome it sent",
        |m, _| Reading::of(m.loops.clone()),
    ),
    Row::new(
        "loops_refused",
        "Loop asks refused without calling the agent program, by reason",
        |m, _| Reading::of(m.refused.clone()),
    ),
    Row::new(
        "agent_faults",
        "Failures of the agent program during a loop, by kind",
        |m, _| Reading::of(m.agent_faults.clone()),
    ),
    Row::new(
        "chunks",
        "Chunks passed from the agent program to the server",
        |m, _| Reading::of(m.chunks.clone()),
    ),
    Row::bytes(
        "chunk",
        "Bytes of chunk JSON passed from the agent program to the server",
        |m, _| Reading::of(m.bytes.clone()),
    ),
    Row::seconds(
        "first_chunk",
        "Time from a loop's ask to its first chunk from the agent program",
        |m, _| Reading::of(Exposed(m.first_chunk.clone())),
    ),
    Row::new(
        "paths_open",
        "WebSocket paths from the server open",
        |m, _| Reading::of(ConstGauge::new(m.paths.load(Ordering::Relaxed))),
    ),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_names_every_metric_with_its_prefix() {
        let metrics = ProxyMetrics::new();
        metrics.registrations.inc(Registration::Registered);
        metrics.bytes.inc_by(12);
        metrics.paths.fetch_add(1, Ordering::Relaxed);
        let text = metrics.encode();
        for line in [
            "runloop_proxy_registrations_total{result=\"registered\"} 1",
            "runloop_proxy_loops_total{outcome=\"no_loop\"} 0",
            "runloop_proxy_agent_faults_total{kind=\"undelimited\"} 0",
            "runloop_proxy_chunk_bytes_total 12",
            "runloop_proxy_first_chunk_seconds_count 0",
            "runloop_proxy_paths_open 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} is not in\n{text}");
        }
    }
}
