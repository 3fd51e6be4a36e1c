//! The load generator behind `runloop bench`: the relay measured against a
//! batching forwarder and against no middle hop at all, in one run, over
//! real loopback sockets.
//!
//! ```text
//! relay:     load clients ──framed──▶ runloop server (child) ──/agent/run──▶ synthetic proxy
//! baseline:  load clients ──bare────▶ forwarder (child)      ──/agent/run──▶ synthetic proxy
//! direct:    load clients ──bare─────────────────────────────────────────▶ synthetic proxy
//! ```
//!
//! The synthetic proxy and the load clients live in this process and share
//! one clock, so every chunk's latency is measured end to end from a stamp
//! inside its JSON. The programs in the middle run as child processes, so
//! their memory and CPU time are their own. Every side uses the same proxy,
//! the same chunk mix and the same clients; the figures that matter are the
//! ratios between them, since absolute speed on a shared machine is noise.
//!
//! Sides are measured in rounds, in an order that turns around every round
//! (baseline, relay, direct, then direct, relay, baseline, …), so that a
//! machine that speeds up or slows down during the run weighs on every side
//! alike; a ratio is the median of its per-round ratios. A first phase runs
//! loops as fast as the sockets allow (throughput and CPU time per chunk);
//! a second, paced phase has the proxy send at a fixed rate, where latency
//! is the cost of the hop and not the depth of a queue.

mod forwarder;
mod load;
mod mix;
mod process;
mod report;
mod socket;
mod synthetic;

use std::future::Future;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Barrier;
use tokio::task::JoinSet;

pub use forwarder::forward;
pub use mix::{Mix, MixError, parse_bytes};
pub use process::{Load, Spawn};
pub use report::{Report, RoundFigures, Side, Sides, SlowReport};

use load::{Server, Tally, bare_worker, relay_connection};
use process::{Child, free_addr};
use report::Round;
use synthetic::{LoopPlan, Plan, SyntheticProxy};

/// The credential the bench's server accepts.
const TOKEN: &str = "runloop-bench";

/// Descriptors a process needs besides its loops' sockets (listeners,
/// the runtime's, standard streams, a few sockets closing).
const SPARE_DESCRIPTORS: u64 = 256;

/// Serves the synthetic proxy on a loopback port until the process ends,
/// for a load client of another program (the Python package's bench):
/// `ready` hears its URL once it listens. Any image served by a provider
/// server in front of it (`--agent NAME=proxy:URL`) streams the loop that
/// its prompt asks for, `bench:INDEX:ROUND:CHUNKS:RATE`.
pub async fn synthetic_proxy(mix: Mix, ready: impl FnOnce(&str)) -> Result<(), BenchError> {
    let proxy = SyntheticProxy::start(Plan {
        mix,
        epoch: Instant::now(),
    })
    .await?;
    ready(&proxy.url());
    std::future::pending::<()>().await;
    Ok(())
}

/// What to measure.
#[derive(Debug, Clone)]
pub struct Params {
    /// Concurrent loops.
    pub loops: usize,
    /// Framed connections the relay's loops share (one run per loop on
    /// them); clamped to 1..=`loops`. The forwarder and direct sides need
    /// one path per loop whatever this is.
    pub connections: usize,
    /// Chunks in each loop of the saturated phase.
    pub chunks: u64,
    /// Chunk sizes.
    pub mix: Mix,
    /// How long each side runs in each round: it repeats its loops until
    /// this much time has passed (at least one round of loops either way).
    pub duration: Duration,
    /// Rounds per phase.
    pub rounds: usize,
    /// The paced phase's rate, chunks per second per loop; `None`: no paced
    /// phase.
    pub pace: Option<u64>,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            loops: 1,
            connections: 1,
            chunks: 2000,
            mix: Mix::default(),
            duration: Duration::from_secs(1),
            rounds: 4,
            pace: Some(1000),
        }
    }
}

impl Params {
    fn connections(&self) -> usize {
        self.connections.clamp(1, self.loops)
    }

    /// Chunks per loop in the paced phase: one loop lasts one round (or
    /// `chunks`, when rounds are one round of loops).
    fn paced_chunks(&self, rate: u64) -> u64 {
        if self.duration.is_zero() {
            self.chunks
        } else {
            ((rate as f64 * self.duration.as_secs_f64()).ceil() as u64).max(1)
        }
    }
}

/// What went wrong with a bench run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A socket or process failed: the system's error.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// A WebSocket failed: the WebSocket library's error.
    #[error(transparent)]
    WebSocket(#[from] tokio_tungstenite::tungstenite::Error),
    /// A program under test exited early.
    #[error("{0} exited before it was measured")]
    Exited(String),
    /// The program under test broke the protocol.
    #[error("the server under test broke the protocol: {0}")]
    Protocol(&'static str),
    /// The relay side cannot hold its sockets.
    #[error(
        "the relay side needs about {needs} open descriptors and the limit is {limit}: \
         fewer loops, or a higher hard limit (ulimit -Hn)"
    )]
    Descriptors {
        /// Descriptors the relay side needs.
        needs: u64,
        /// The limit in force.
        limit: u64,
    },
    /// A worker task failed: it panicked, or was cancelled.
    #[error("a load worker failed")]
    Worker(#[source] tokio::task::JoinError),
}

/// Runs every worker and sums what they saw; the first failure ends them
/// all (a worker may be waiting for one that failed).
async fn gather<I, Fut>(workers: I) -> Result<Tally, BenchError>
where
    I: IntoIterator<Item = Fut>,
    Fut: Future<Output = Result<Tally, BenchError>> + Send + 'static,
{
    let mut tasks: JoinSet<_> = workers.into_iter().collect();
    let mut total = Tally::new();
    while let Some(done) = tasks.join_next().await {
        let tally = done.map_err(BenchError::Worker)??;
        total.merge(&tally);
    }
    Ok(total)
}

/// The loops each of `connections` carries: as even a share as can be.
fn shares(loops: usize, connections: usize) -> impl Iterator<Item = Range<usize>> {
    (0..connections).map(move |c| c * loops / connections..(c + 1) * loops / connections)
}

/// The three ways a loop reaches the load clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// Framed, through the runloop server.
    Relay,
    /// Bare, through the forwarder.
    Baseline,
    /// Bare, from the synthetic proxy itself.
    Direct,
}

/// A route that is measured: where its clients connect and the process in
/// the middle, if any.
struct Target {
    route: Route,
    url: String,
    middle: Option<Child>,
}

impl Target {
    /// One round: every loop, again until the round's deadline.
    async fn round(
        &self,
        params: &Params,
        plan: LoopPlan,
        epoch: Instant,
        repeat: bool,
    ) -> Result<Round, BenchError> {
        let cpu_before = self.middle.as_ref().and_then(Child::cpu_time);
        let start = Instant::now();
        let deadline = if repeat {
            start + params.duration
        } else {
            start
        };
        let tally = match self.route {
            Route::Relay => {
                let server = Server {
                    url: self.url.clone(),
                    token: TOKEN,
                };
                let connections = params.connections();
                let all_open = Arc::new(Barrier::new(connections));
                gather(shares(params.loops, connections).map(|loops| {
                    let all_open = Arc::clone(&all_open);
                    relay_connection(server.clone(), loops, plan, epoch, deadline, None, all_open)
                }))
                .await?
            }
            Route::Baseline | Route::Direct => {
                gather(
                    (0..params.loops)
                        .map(|index| bare_worker(self.url.clone(), index, plan, epoch, deadline)),
                )
                .await?
            }
        };
        let wall = start.elapsed();
        let cpu_after = self.middle.as_ref().and_then(Child::cpu_time);
        let cpu = Child::cpu_between(cpu_before, cpu_after);
        Ok(Round { tally, wall, cpu })
    }
}

/// Runs `rounds` rounds of every target, the order turned around each
/// round; returns each target's rounds, in `targets`' order.
async fn phase(
    targets: &[Target],
    params: &Params,
    plan: LoopPlan,
    epoch: Instant,
    repeat: bool,
) -> Result<Vec<Vec<Round>>, BenchError> {
    let mut rounds: Vec<Vec<Round>> = targets.iter().map(|_| Vec::new()).collect();
    for round in 0..params.rounds {
        let mut order: Vec<usize> = (0..targets.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for i in order {
            let measured = targets[i].round(params, plan, epoch, repeat).await?;
            rounds[i].push(measured);
        }
    }
    Ok(rounds)
}

/// Each route's side of one phase; `saturated` keeps the CPU time and
/// the peak memory of the programs in the middle, which a paced phase
/// cannot measure (a few milliseconds of CPU in clock ticks of ten).
fn sides(targets: &[Target], rounds: Vec<Vec<Round>>, saturated: bool) -> Sides {
    let mut sides = Sides::default();
    for (target, mut rounds) in targets.iter().zip(rounds) {
        let peak = if saturated {
            target.middle.as_ref().and_then(|m| m.memory("VmHWM"))
        } else {
            rounds.iter_mut().for_each(|round| round.cpu = None);
            None
        };
        let side = Side::new(&rounds, peak);
        match target.route {
            Route::Relay => sides.relay = Some(side),
            Route::Baseline => sides.baseline = Some(side),
            Route::Direct => sides.direct = Some(side),
        }
    }
    sides
}

/// Measures the relay, the baseline forwarder and the direct read with
/// `params`, through programs started by `spawn`.
///
/// A side whose sockets would not fit in this process's descriptor limit
/// (raised to its hard limit first) is left out, and the report says why.
pub async fn compare(params: &Params, spawn: &dyn Spawn) -> Result<Report, BenchError> {
    let params = &Params {
        loops: params.loops.max(1),
        chunks: params.chunks.max(1),
        rounds: params.rounds.max(1),
        ..params.clone()
    };
    let limit = process::raise_descriptor_limit();
    let epoch = Instant::now();
    let proxy = SyntheticProxy::start(Plan {
        mix: params.mix.clone(),
        epoch,
    })
    .await?;
    let loops = params.loops as u64;
    let connections = params.connections();
    let mut targets = Vec::new();
    let mut skipped = Vec::new();

    // A connection's socket, and one registration at a time while its runs start.
    let relay_needs = 2 * connections as u64 + loops + SPARE_DESCRIPTORS;
    let bare_needs = 2 * loops + SPARE_DESCRIPTORS;
    for (route, needs) in [
        (Route::Baseline, bare_needs),
        (Route::Relay, relay_needs),
        (Route::Direct, bare_needs),
    ] {
        if needs > limit {
            skipped.push(format!(
                "{}: needs about {needs} descriptors in this process, and the limit is {limit}",
                route.name()
            ));
            continue;
        }
        let (url, middle) = match route {
            Route::Direct => (proxy.url(), None),
            Route::Relay | Route::Baseline => {
                let addr = free_addr()?;
                let command = if route == Route::Relay {
                    let load = Load {
                        connections,
                        runs_per_connection: params.loops.div_ceil(connections),
                    };
                    spawn.server(addr, &proxy.url(), TOKEN, load)
                } else {
                    spawn.forwarder(addr, &proxy.url())
                };
                (
                    format!("ws://{addr}"),
                    Some(Child::start(command, addr).await?),
                )
            }
        };
        targets.push(Target { route, url, middle });
    }
    if !targets.iter().any(|t| t.route == Route::Relay) {
        return Err(BenchError::Descriptors {
            needs: relay_needs,
            limit,
        });
    }

    let saturated_plan = LoopPlan {
        chunks: params.chunks,
        rate: None,
    };
    let saturated = phase(&targets, params, saturated_plan, epoch, true).await?;
    let paced = match params.pace {
        Some(rate) => {
            let plan = LoopPlan {
                chunks: params.paced_chunks(rate),
                rate: Some(rate),
            };
            Some((plan, phase(&targets, params, plan, epoch, false).await?))
        }
        None => None,
    };
    let saturated = sides(&targets, saturated, true);
    let paced = paced.map(|(plan, rounds)| (plan.chunks, sides(&targets, rounds, false)));
    for target in targets {
        if let Some(middle) = target.middle {
            middle.stop().await;
        }
    }
    Ok(Report::new(params, connections, saturated, paced, skipped))
}

impl Route {
    fn name(self) -> &'static str {
        match self {
            Route::Relay => "relay",
            Route::Baseline => "baseline",
            Route::Direct => "direct",
        }
    }
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
    let proxy = SyntheticProxy::start(Plan {
        mix: Mix::fixed(params.chunk_size),
        epoch,
    })
    .await?;
    let addr = free_addr()?;
    let load = Load {
        connections: 1,
        runs_per_connection: 1,
    };
    let server = Arc::new(Child::start(spawn.server(addr, &proxy.url(), TOKEN, load), addr).await?);
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
    let server_url = Server {
        url: format!("ws://{addr}"),
        token: TOKEN,
    };
    let plan = LoopPlan { chunks, rate: None };
    let alone = Arc::new(Barrier::new(1));
    let result = relay_connection(
        server_url,
        0..1,
        plan,
        epoch,
        start,
        Some(params.read_rate),
        alone,
    )
    .await;
    let seconds = start.elapsed().as_secs_f64();
    sampler.abort();
    let tally = result?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loops_are_shared_evenly_among_connections() {
        for (loops, connections) in [(1, 1), (10, 3), (10_000, 100), (7, 7)] {
            let shares: Vec<Range<usize>> = shares(loops, connections).collect();
            assert_eq!(shares.len(), connections);
            assert_eq!(shares.first().map(|r| r.start), Some(0));
            assert_eq!(shares.last().map(|r| r.end), Some(loops));
            assert!(shares.windows(2).all(|w| w[0].end == w[1].start));
            let sizes: Vec<usize> = shares.iter().map(ExactSizeIterator::len).collect();
            let (min, max) = (sizes.iter().min(), sizes.iter().max());
            assert!(
                max.zip(min).is_some_and(|(max, min)| max - min <= 1),
                "{sizes:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_worker_that_failed_says_so_and_why_once() {
        let cancelled = tokio::task::spawn(std::future::pending::<()>());
        cancelled.abort();
        let failed = BenchError::Worker(cancelled.await.expect_err("aborted"));
        assert_eq!(failed.to_string(), "a load worker failed");
        let why = std::error::Error::source(&failed).expect("the task's error");
        assert!(why.is::<tokio::task::JoinError>(), "{why}");
        runloop_testkit::errors::assert_cause_said_once(&failed);
    }
}
