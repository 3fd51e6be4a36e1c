//! The proxy's metrics: its side of registrations and loops, and what the
//! agent program did wrong.

use std::sync::atomic::{AtomicI64, Ordering};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::{Registry, Unit};

use super::{Counts, Exposed, Histogram, LoopOutcome, MS, S, label};

label! {
    /// How an `/agent/register` ask ended (protocol §10).
    pub enum Registration("result") {
        /// The agent program registered.
        Registered = "registered",
        /// The proxy refused it: a malformed ask, or a second registration.
        Refused = "refused",
        /// The agent program refused it or could not be reached.
        Failed = "failed",
    }
}

label! {
    /// Why the proxy refused an `/agent/run` ask without calling the agent
    /// program (protocol §10).
    pub enum ProxyLoop("reason") {
        /// The ask is not a run-loop request.
        Malformed = "malformed",
        /// No agent is registered, or a loop is already running.
        Busy = "busy",
    }
}

label! {
    /// What went wrong with the agent program during a loop (protocol §10).
    pub enum AgentFault("kind") {
        /// It did not answer `/run` with a `2xx` event stream: it could not
        /// be reached, or answered an error status or another content type.
        NoStream = "no_stream",
        /// Its event stream broke (or an event was over the size limit).
        StreamBroke = "stream_broke",
        /// Its body ended only with its connection (not delimited).
        Undelimited = "undelimited",
    }
}

/// Bounds of the time to a loop's first chunk: 1 ms to 60 s.
static FIRST_CHUNK_BOUNDS: [u64; 12] = [
    MS,
    5 * MS,
    10 * MS,
    50 * MS,
    100 * MS,
    250 * MS,
    500 * MS,
    S,
    5 * S / 2,
    5 * S,
    10 * S,
    60 * S,
];

/// The proxy's counters and histograms.
#[derive(Debug)]
pub struct ProxyMetrics {
    registry: Registry,
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
        let mut registry = Registry::with_prefix("runloop_proxy");
        let registrations = Counts::new();
        registry.register(
            "registrations",
            "Registration asks, by result",
            registrations.clone(),
        );
        let loops = Counts::new();
        registry.register(
            "loops",
            "Loops the proxy answered, by the outcome it sent",
            loops.clone(),
        );
        let refused = Counts::new();
        registry.register(
            "loops_refused",
            "Loop asks refused without calling the agent program, by reason",
            refused.clone(),
        );
        let agent_faults = Counts::new();
        registry.register(
            "agent_faults",
            "Failures of the agent program during a loop, by kind",
            agent_faults.clone(),
        );
        let chunks = Counter::default();
        registry.register(
            "chunks",
            "Chunks passed from the agent program to the server",
            chunks.clone(),
        );
        let bytes = Counter::default();
        registry.register_with_unit(
            "chunk",
            "Bytes of chunk JSON passed from the agent program to the server",
            Unit::Bytes,
            bytes.clone(),
        );
        let first_chunk = Histogram::new(&FIRST_CHUNK_BOUNDS);
        registry.register_with_unit(
            "first_chunk",
            "Time from a loop's ask to its first chunk from the agent program",
            Unit::Seconds,
            Exposed(first_chunk.clone()),
        );
        ProxyMetrics {
            registry,
            registrations,
            loops,
            refused,
            agent_faults,
            chunks,
            bytes,
            first_chunk,
            paths: AtomicI64::new(0),
        }
    }

    /// The exposition, with the paths open now.
    pub fn encode(&self) -> String {
        let mut gauges = Registry::with_prefix("runloop_proxy");
        gauges.register(
            "paths_open",
            "WebSocket paths from the server open",
            ConstGauge::new(self.paths.load(Ordering::Relaxed)),
        );
        super::encode([&self.registry, &gauges])
    }
}

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
