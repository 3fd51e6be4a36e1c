//! The figures a bench run prints, for people and for scripts.

use std::fmt;
use std::time::Duration;

use serde::Serialize;

use crate::Params;
use crate::load::Tally;

/// One side of the comparison.
#[derive(Debug, Clone, Serialize)]
pub struct Side {
    /// Loops run.
    pub loops: u64,
    /// Chunks delivered.
    pub chunks: u64,
    /// Chunk JSON bytes delivered.
    pub bytes: u64,
    /// Wall time.
    pub seconds: f64,
    /// Chunks per second.
    pub chunks_per_s: f64,
    /// Payload megabytes (10^6) per second.
    pub payload_mb_per_s: f64,
    /// Median latency from the proxy's send to the client's read.
    pub latency_p50_us: f64,
    /// 99th percentile of the same.
    pub latency_p99_us: f64,
    /// Peak resident memory of the program in the middle.
    pub peak_rss_mib: f64,
    /// Loops that ended with an error or without their finish.
    pub failed_loops: u64,
    /// Chunks lost, repeated or reordered.
    pub disorder: u64,
}

impl Side {
    pub(crate) fn new(tally: &Tally, wall: Duration, peak_rss: Option<u64>) -> Side {
        let seconds = wall.as_secs_f64().max(f64::MIN_POSITIVE);
        Side {
            loops: tally.loops,
            chunks: tally.chunks,
            bytes: tally.bytes,
            seconds,
            chunks_per_s: tally.chunks as f64 / seconds,
            payload_mb_per_s: tally.bytes as f64 / seconds / 1e6,
            latency_p50_us: tally.latency.value_at_quantile(0.5) as f64 / 1e3,
            latency_p99_us: tally.latency.value_at_quantile(0.99) as f64 / 1e3,
            peak_rss_mib: peak_rss.map_or(0.0, |b| b as f64 / (1 << 20) as f64),
            failed_loops: tally.failed,
            disorder: tally.disorder,
        }
    }
}

/// The relay against the baseline.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Relay throughput over baseline throughput (chunks per second).
    pub relay_ratio: f64,
    /// Relay median latency over baseline median latency.
    pub latency_p50_ratio: f64,
    /// The relay's chunks per second.
    pub relay_chunks_per_s: f64,
    /// The baseline's chunks per second.
    pub baseline_chunks_per_s: f64,
    /// The runloop server's peak resident memory.
    pub server_peak_rss_mib: f64,
    /// Concurrent loops.
    pub loops: usize,
    /// Chunks per loop.
    pub chunks_per_loop: u64,
    /// The size mix.
    pub mix: String,
    /// The minimum duration of each side.
    pub duration_s: f64,
    /// The relay's figures.
    pub relay: Side,
    /// The baseline's figures.
    pub baseline: Side,
}

impl Report {
    pub(crate) fn new(params: &Params, relay: Side, baseline: Side) -> Report {
        Report {
            relay_ratio: relay.chunks_per_s / baseline.chunks_per_s.max(f64::MIN_POSITIVE),
            latency_p50_ratio: relay.latency_p50_us
                / baseline.latency_p50_us.max(f64::MIN_POSITIVE),
            relay_chunks_per_s: relay.chunks_per_s,
            baseline_chunks_per_s: baseline.chunks_per_s,
            server_peak_rss_mib: relay.peak_rss_mib,
            loops: params.loops,
            chunks_per_loop: params.chunks,
            mix: params.mix.to_string(),
            duration_s: params.duration.as_secs_f64(),
            relay,
            baseline,
        }
    }

    /// Whether every loop on both sides finished with every chunk in order.
    pub fn is_clean(&self) -> bool {
        [&self.relay, &self.baseline]
            .iter()
            .all(|s| s.failed_loops == 0 && s.disorder == 0)
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} loop(s) × {} chunks, mix {}, at least {:.1} s per side",
            self.loops, self.chunks_per_loop, self.mix, self.duration_s
        )?;
        writeln!(
            f,
            "{:<10} {:>12} {:>10} {:>11} {:>11} {:>10} {:>8} {:>8}",
            "", "chunks/s", "MB/s", "p50 µs", "p99 µs", "peak MiB", "failed", "disorder"
        )?;
        for (name, side) in [("baseline", &self.baseline), ("relay", &self.relay)] {
            writeln!(
                f,
                "{:<10} {:>12.0} {:>10.1} {:>11.1} {:>11.1} {:>10.1} {:>8} {:>8}",
                name,
                side.chunks_per_s,
                side.payload_mb_per_s,
                side.latency_p50_us,
                side.latency_p99_us,
                side.peak_rss_mib,
                side.failed_loops,
                side.disorder
            )?;
        }
        write!(
            f,
            "relay/baseline: throughput {:.3}×, p50 latency {:.3}×",
            self.relay_ratio, self.latency_p50_ratio
        )
    }
}

/// One large loop relayed to a slow reader.
#[derive(Debug, Clone, Serialize)]
pub struct SlowReport {
    /// Chunk JSON bytes delivered.
    pub bytes: u64,
    /// Chunks delivered.
    pub chunks: u64,
    /// Chunks the proxy was to send.
    pub planned_chunks: u64,
    /// Wall time.
    pub seconds: f64,
    /// The reader's pace.
    pub read_rate_mib_s: f64,
    /// Server memory when the loop started.
    pub rss_before_mib: f64,
    /// Highest server memory seen while it ran.
    pub rss_peak_mib: f64,
    /// The difference.
    pub rss_growth_mib: f64,
    /// Chunks lost, repeated or reordered.
    pub disorder: u64,
    /// Whether the loop finished with every chunk.
    pub complete: bool,
}

impl fmt::Display for SlowReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "slow reader: {:.1} MiB in {} chunks over {:.1} s (reading at {:.1} MiB/s); \
             server RSS {:.1} → peak {:.1} MiB (growth {:.1} MiB); disorder {}; {}",
            self.bytes as f64 / (1 << 20) as f64,
            self.chunks,
            self.seconds,
            self.read_rate_mib_s,
            self.rss_before_mib,
            self.rss_peak_mib,
            self.rss_growth_mib,
            self.disorder,
            if self.complete {
                "complete"
            } else {
                "INCOMPLETE"
            }
        )
    }
}
