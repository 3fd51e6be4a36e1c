//! The load generator behind `runloop bench`: the relay measured against a
//! raw forwarder, in one run, over real loopback sockets.
//!
//! ```text
//! relay:     load clients ──framed──▶ runloop server (child) ──/agent/run──▶ synthetic proxy
//! baseline:  load clients ──bare────▶ raw forwarder (child)  ──/agent/run──▶ synthetic proxy
//! ```
//!
//! The synthetic proxy and the load clients live in this process and share
//! one clock, so every chunk's latency is measured end to end from a stamp
//! inside its JSON. The program in the middle runs as a child process, so
//! its peak memory is its own. Both measurements use the same proxy, the
//! same chunk mix and the same clients; the figures that matter are the
//! ratios between them, since absolute speed on a shared machine is noise.

mod forwarder;
mod load;
mod mix;
mod process;
mod report;
mod synthetic;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub use forwarder::forward;
pub use mix::{Mix, MixError, parse_bytes};
pub use process::Spawn;
pub use report::{Report, Side, SlowReport};

use load::{Pace, RelayRun, Tally, baseline_worker, relay_worker};
use process::{Child, free_addr};
use synthetic::{Plan, SyntheticProxy};

/// The credential the bench's server accepts.
const TOKEN: &str = "runloop-bench";

/// What to measure.
#[derive(Debug, Clone)]
pub struct Params {
    /// Concurrent loops (each on its own connection and run).
    pub loops: usize,
    /// Chunks in each loop.
    pub chunks: u64,
    /// Chunk sizes.
    pub mix: Mix,
    /// Each side repeats loops until this much time has passed (at least one
    /// round of loops either way).
    pub duration: Duration,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            loops: 1,
            chunks: 2000,
            mix: Mix::default(),
            duration: Duration::from_secs(5),
        }
    }
}

/// What went wrong with a bench run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A socket or process failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// A WebSocket failed.
    #[error("{0}")]
    WebSocket(#[from] tokio_tungstenite::tungstenite::Error),
    /// A program under test exited early.
    #[error("{0} exited before it was measured")]
    Exited(String),
    /// The program under test broke the protocol.
    #[error("the server under test broke the protocol: {0}")]
    Protocol(&'static str),
    /// A worker task failed.
    #[error("a load worker failed: {0}")]
    Worker(String),
}

/// Runs `loops` workers (given their index) until the deadline and sums
/// what they saw.
async fn drive<F, Fut>(
    loops: usize,
    duration: Duration,
    worker: F,
) -> Result<(Tally, Duration), BenchError>
where
    F: Fn(usize, Instant) -> Fut,
    Fut: Future<Output = Result<Tally, BenchError>> + Send + 'static,
{
    let start = Instant::now();
    let deadline = start + duration;
    let tasks: Vec<_> = (0..loops)
        .map(|index| tokio::spawn(worker(index, deadline)))
        .collect();
    let mut total = Tally::new();
    for task in tasks {
        let tally = task
            .await
            .map_err(|e| BenchError::Worker(e.to_string()))??;
        total.merge(&tally);
    }
    Ok((total, start.elapsed()))
}

/// Measures the relay and the baseline with `params`, through programs
/// started by `spawn`.
pub async fn compare(params: &Params, spawn: &dyn Spawn) -> Result<Report, BenchError> {
    let epoch = Instant::now();
    let proxy = SyntheticProxy::start(Plan {
        chunks: params.chunks,
        mix: params.mix.clone(),
        epoch,
    })
    .await?;
    let planned = params.chunks;

    let addr = free_addr()?;
    let forwarder = Child::start(spawn.forwarder(addr, &proxy.url()), addr).await?;
    let url = format!("ws://{addr}");
    let (tally, wall) = drive(params.loops, params.duration, |index, deadline| {
        baseline_worker(url.clone(), index, planned, epoch, deadline)
    })
    .await?;
    let baseline = Side::new(&tally, wall, forwarder.memory("VmHWM"));
    forwarder.stop().await;

    let addr = free_addr()?;
    let server = Child::start(spawn.server(addr, &proxy.url(), TOKEN), addr).await?;
    let url = format!("ws://{addr}");
    let (tally, wall) = drive(params.loops, params.duration, |index, deadline| {
        relay_worker(url.clone(), TOKEN, index, planned, epoch, deadline)
    })
    .await?;
    let relay = Side::new(&tally, wall, server.memory("VmHWM"));
    server.stop().await;

    Ok(Report::new(params, relay, baseline))
}

/// What to measure with a slow reader.
#[derive(Debug, Clone)]
pub struct SlowParams {
    /// Bytes in the loop.
    pub bytes: u64,
    /// Size of each chunk.
    pub chunk_size: usize,
    /// How fast the client reads, bytes per second.
    pub read_rate: u64,
}

/// Relays one large loop to a client that reads at `read_rate`, sampling the
/// server's memory while it runs: with backpressure, it stays flat.
pub async fn slow_reader(params: &SlowParams, spawn: &dyn Spawn) -> Result<SlowReport, BenchError> {
    let epoch = Instant::now();
    let chunks = params.bytes.div_ceil(params.chunk_size.max(1) as u64);
    let plan = Plan {
        chunks,
        mix: Mix::fixed(params.chunk_size),
        epoch,
    };
    let proxy = SyntheticProxy::start(plan).await?;
    let addr = free_addr()?;
    let server = Arc::new(Child::start(spawn.server(addr, &proxy.url(), TOKEN), addr).await?);
    let mut run = RelayRun::open(&format!("ws://{addr}"), TOKEN).await?;
    let before = server.memory("VmRSS").unwrap_or(0);
    let peak = Arc::new(AtomicU64::new(before));
    let sampler = tokio::spawn({
        let (server, peak) = (Arc::clone(&server), Arc::clone(&peak));
        async move {
            loop {
                if let Some(rss) = server.memory("VmRSS") {
                    peak.fetch_max(rss, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    });
    let start = Instant::now();
    let mut tally = Tally::new();
    let pace = &mut Pace::new(Some(params.read_rate));
    let result = run
        .run_loop(&synthetic::prompt(0, 0), chunks, epoch, &mut tally, pace)
        .await;
    let seconds = start.elapsed().as_secs_f64();
    sampler.abort();
    run.close().await;
    result?;
    let report = SlowReport {
        bytes: tally.bytes,
        chunks: tally.chunks,
        planned_chunks: chunks,
        seconds,
        read_rate_mib_s: params.read_rate as f64 / (1 << 20) as f64,
        rss_before_mib: mib(before),
        rss_peak_mib: mib(peak.load(Ordering::Relaxed)),
        rss_growth_mib: mib(peak.load(Ordering::Relaxed).saturating_sub(before)),
        disorder: tally.disorder,
        complete: tally.failed == 0 && tally.chunks == chunks,
    };
    if let Ok(server) = Arc::try_unwrap(server) {
        server.stop().await;
    }
    Ok(report)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}
