//! The load generator behind `runloop bench`: the relay measured against a
//! batching forwarder and against no middle hop at all, in one run, over
//! real loopback sockets; and ([`chain`]) the whole chain measured against
//! nginx as a plain SSE reverse proxy, and against the agent program read
//! directly.
//!
//! ```text
//! relay:     load clients ──framed──▶ runloop server (child) ──/agent/run──▶ synthetic proxy
//! baseline:  load clients ──bare────▶ forwarder (child)      ──/agent/run──▶ synthetic proxy
//! direct:    load clients ──bare─────────────────────────────────────────▶ synthetic proxy
//!
//! chain:     load clients ──framed──▶ runloop server (child) + its proxy ──HTTP/SSE──▶ agent program (its child)
//! nginx:     load clients ──HTTP/SSE▶ nginx (child)                      ──HTTP/SSE──▶ agent program (child)
//! agent:     load clients ──HTTP/SSE────────────────────────────────────────────────▶ agent program (child)
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

pub mod agent;
mod clock;
mod forwarder;
mod load;
mod mix;
mod nginx;
mod process;
mod report;
mod socket;
mod sse;
mod starts;
mod synthetic;

use std::future::Future;
use std::net::SocketAddr;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Barrier;
use tokio::task::JoinSet;

pub use forwarder::forward;
pub use mix::{Mix, MixError, parse_bytes};
pub use process::{AgentSource, Load, Spawn};
pub use report::{ChainReport, ChainSides, Report, RoundFigures, Side, Sides, SlowReport};
pub use starts::{Spread, StartParams, StartReport, by_hand, starts};

use load::{Deadline, Server, Tally, bare_worker, relay_connection};
use process::{Child, Cpu, Mark, free_addr};
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
    let proxy = SyntheticProxy::start(Plan { mix }).await?;
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
    /// These parameters with at least one loop, one chunk and one round.
    fn at_least_one(&self) -> Params {
        Params {
            loops: self.loops.max(1),
            chunks: self.chunks.max(1),
            rounds: self.rounds.max(1),
            ..self.clone()
        }
    }

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
    /// The server refused a run or a loop the bench asked for: its error.
    #[error("the server refused: {0}")]
    Refused(String),
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

/// The ways a loop reaches the load clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// Framed, through the runloop server, from the synthetic proxy.
    Relay,
    /// Bare, through the forwarder.
    Baseline,
    /// Bare, from the synthetic proxy itself.
    Direct,
    /// Framed, through the runloop server, its proxy and the agent program
    /// it starts (the whole chain).
    Chain,
    /// SSE, through nginx, from the agent program.
    Nginx,
    /// SSE, from the agent program itself.
    Agent,
}

/// A route that is measured: where its clients connect and the process in
/// the middle, if any.
struct Target {
    route: Route,
    url: String,
    middle: Option<Child>,
}

impl Target {
    /// One round: every loop, again until the round's deadline. On the
    /// whole chain the round is measured from when every run is open: a
    /// run's start (an agent program started, registered) is not a chunk's
    /// cost, and nginx has none.
    async fn round(
        &self,
        params: &Params,
        plan: LoopPlan,
        repeat: bool,
    ) -> Result<Round, BenchError> {
        let cpu = self.middle.as_ref().map(Child::cpu);
        let cpu_before = cpu.as_ref().and_then(Cpu::read);
        let start = Instant::now();
        let length = if repeat {
            params.duration
        } else {
            Duration::ZERO
        };
        let mut started = None;
        let tally = match self.route {
            Route::Relay | Route::Chain => {
                let server = Server {
                    url: self.url.clone(),
                    token: TOKEN,
                };
                let connections = params.connections();
                let all_open = Arc::new(Barrier::new(connections));
                let (deadline, mark) = if self.route == Route::Chain {
                    let mark = Arc::new(Mark::new(cpu));
                    started = Some(Arc::clone(&mark));
                    (Deadline::After(length), Some(mark))
                } else {
                    (Deadline::At(start + length), None)
                };
                gather(shares(params.loops, connections).map(|loops| {
                    let all_open = Arc::clone(&all_open);
                    relay_connection(
                        server.clone(),
                        loops,
                        plan,
                        deadline,
                        None,
                        all_open,
                        mark.clone(),
                    )
                }))
                .await?
            }
            Route::Baseline | Route::Direct => {
                gather(
                    (0..params.loops)
                        .map(|index| bare_worker(self.url.clone(), index, plan, start + length)),
                )
                .await?
            }
            Route::Nginx | Route::Agent => {
                let addr = http_addr(&self.url)?;
                gather(
                    (0..params.loops)
                        .map(|index| sse::sse_worker(addr, index, plan, start + length)),
                )
                .await?
            }
        };
        let cpu_after = cpu.as_ref().and_then(Cpu::read);
        let (start, cpu_before) = match started.as_ref().and_then(|mark| mark.get()) {
            Some(mark) => mark,
            None => (start, cpu_before),
        };
        let wall = start.elapsed();
        let cpu = cpu.and_then(|cpu| cpu.between(cpu_before, cpu_after));
        Ok(Round { tally, wall, cpu })
    }
}

/// The address of an `http://host:port` URL.
fn http_addr(url: &str) -> Result<SocketAddr, BenchError> {
    url.trim_start_matches("http://")
        .parse()
        .map_err(|_| BenchError::Protocol("an SSE route's address is not host:port"))
}

/// Runs `rounds` rounds of every target, the order turned around each
/// round; returns each target's rounds, in `targets`' order.
async fn phase(
    targets: &[Target],
    params: &Params,
    plan: LoopPlan,
    repeat: bool,
) -> Result<Vec<Vec<Round>>, BenchError> {
    let mut rounds: Vec<Vec<Round>> = targets.iter().map(|_| Vec::new()).collect();
    for round in 0..params.rounds {
        let mut order: Vec<usize> = (0..targets.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for i in order {
            let measured = targets[i].round(params, plan, repeat).await?;
            rounds[i].push(measured);
        }
    }
    Ok(rounds)
}

/// Each route's side of one phase; `saturated` keeps the peak memory of
/// the programs in the middle, and `cpu` their CPU time (which a paced
/// phase cannot measure in clock ticks: a few milliseconds in ticks of
/// ten; the whole chain reads it to the nanosecond).
fn sides(
    targets: &[Target],
    rounds: Vec<Vec<Round>>,
    saturated: bool,
    cpu: bool,
) -> Vec<(Route, Side)> {
    let mut sides = Vec::new();
    for (target, mut rounds) in targets.iter().zip(rounds) {
        let peak = if saturated {
            target.middle.as_ref().and_then(|m| m.memory("VmHWM"))
        } else {
            None
        };
        if !cpu {
            rounds.iter_mut().for_each(|round| round.cpu = None);
        }
        sides.push((target.route, Side::new(&rounds, peak)));
    }
    sides
}

/// Each route's side in the report of its mode: the relay mode's and the
/// whole chain's.
fn sorted(sides: Vec<(Route, Side)>) -> (Sides, ChainSides) {
    let (mut relay, mut chain) = (Sides::default(), ChainSides::default());
    for (route, side) in sides {
        let side = Some(side);
        match route {
            Route::Relay => relay.relay = side,
            Route::Baseline => relay.baseline = side,
            Route::Direct => relay.direct = side,
            Route::Chain => chain.chain = side,
            Route::Nginx => chain.nginx = side,
            Route::Agent => chain.agent = side,
        }
    }
    (relay, chain)
}

/// The saturated phase over `targets` and, with a pace, the paced one
/// (with its chunks per loop), each as the sides of its mode's report
/// (`mode` picks them), the paced phase's CPU time kept only with
/// `paced_cpu`; then the programs in the middle are stopped.
async fn measure<S>(
    targets: Vec<Target>,
    params: &Params,
    paced_cpu: bool,
    mode: fn((Sides, ChainSides)) -> S,
) -> Result<(S, Option<(u64, S)>), BenchError> {
    let to = |sides| mode(sorted(sides));
    let saturated_plan = LoopPlan {
        chunks: params.chunks,
        rate: None,
    };
    let saturated = phase(&targets, params, saturated_plan, true).await?;
    let paced = match params.pace {
        Some(rate) => {
            let plan = LoopPlan {
                chunks: params.paced_chunks(rate),
                rate: Some(rate),
            };
            let rounds = phase(&targets, params, plan, false).await?;
            Some((plan.chunks, to(sides(&targets, rounds, false, paced_cpu))))
        }
        None => None,
    };
    // The peak memory read after both phases, as the whole run's.
    let saturated = to(sides(&targets, saturated, true, true));
    for target in targets {
        if let Some(middle) = target.middle {
            middle.stop().await;
        }
    }
    Ok((saturated, paced))
}

/// Measures the relay, the baseline forwarder and the direct read with
/// `params`, through programs started by `spawn`.
///
/// A side whose sockets would not fit in this process's descriptor limit
/// (raised to its hard limit first) is left out, and the report says why.
pub async fn compare(params: &Params, spawn: &dyn Spawn) -> Result<Report, BenchError> {
    let params = &params.at_least_one();
    let limit = process::raise_descriptor_limit();
    let proxy = SyntheticProxy::start(Plan {
        mix: params.mix.clone(),
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
            Route::Direct | Route::Chain | Route::Nginx | Route::Agent => (proxy.url(), None),
            Route::Relay | Route::Baseline => {
                let addr = free_addr()?;
                let command = if route == Route::Relay {
                    let load = Load {
                        connections,
                        runs_per_connection: params.loops.div_ceil(connections),
                    };
                    spawn.server(addr, &AgentSource::Proxy(proxy.url()), TOKEN, load)
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

    let (saturated, paced) = measure(targets, params, false, |(relay, _)| relay).await?;
    Ok(Report::new(params, connections, saturated, paced, skipped))
}

/// Measures the whole chain — a `runloop serve` child with the bench's
/// agent program as its `exec:` agent, its proxy in the server's process —
/// against nginx as a plain SSE reverse proxy in front of the same agent
/// program, and against that program read directly, with `params`.
///
/// nginx is left out, and the report says so, when it is not installed
/// (`RUNLOOP_BENCH_NGINX` names it when it is somewhere else); so is a side
/// whose sockets would not fit in this process's descriptor limit.
pub async fn chain(params: &Params, spawn: &dyn Spawn) -> Result<ChainReport, BenchError> {
    let params = &params.at_least_one();
    let limit = process::raise_descriptor_limit();
    let connections = params.connections();
    let loops = params.loops as u64;
    let mut targets = Vec::new();
    let mut skipped = Vec::new();
    // The agent program nginx stands in front of, and the direct read reads.
    let agent_addr = free_addr()?;
    let agent = Child::start(spawn.agent(agent_addr, &params.mix), agent_addr).await?;
    let sse_needs = loops + SPARE_DESCRIPTORS;
    let mut nginx_prefix = None;
    match nginx::program() {
        _ if sse_needs > limit => skipped.push(format!(
            "nginx, agent: need about {sse_needs} descriptors in this process, and the limit is {limit}"
        )),
        None => skipped.push(
            "nginx: not installed (apt-get install nginx; RUNLOOP_BENCH_NGINX=PATH names one \
             elsewhere)"
                .to_owned(),
        ),
        Some(program) => {
            let addr = free_addr()?;
            let (command, prefix) = nginx::command(&program, addr, agent_addr, params.loops)?;
            nginx_prefix = Some(prefix);
            let middle = Child::start_with(command, addr, true).await?;
            targets.push(Target {
                route: Route::Nginx,
                url: format!("http://{addr}"),
                middle: Some(middle),
            });
        }
    }
    let chain_needs = connections as u64 + SPARE_DESCRIPTORS;
    if chain_needs > limit {
        return Err(BenchError::Descriptors {
            needs: chain_needs,
            limit,
        });
    }
    let addr = free_addr()?;
    let load = Load {
        connections,
        runs_per_connection: params.loops.div_ceil(connections),
    };
    let command = spawn.server(addr, &AgentSource::Exec(params.mix.clone()), TOKEN, load);
    targets.push(Target {
        route: Route::Chain,
        url: format!("ws://{addr}"),
        middle: Some(Child::start_with(command, addr, true).await?),
    });
    if sse_needs <= limit {
        targets.push(Target {
            route: Route::Agent,
            url: format!("http://{agent_addr}"),
            middle: None,
        });
    }

    let (saturated, paced) = measure(targets, params, true, |(_, chain)| chain).await?;
    agent.stop().await;
    drop(nginx_prefix);
    Ok(ChainReport::new(
        params,
        connections,
        saturated,
        paced,
        skipped,
    ))
}

impl Route {
    fn name(self) -> &'static str {
        match self {
            Route::Relay => "relay",
            Route::Baseline => "baseline",
            Route::Direct => "direct",
            Route::Chain => "chain",
            Route::Nginx => "nginx",
            Route::Agent => "agent",
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
    /// The whole chain: the server's own proxy, in process, in front of
    /// the bench's agent program (an `exec:` agent), instead of the
    /// synthetic proxy.
    pub chain: bool,
}

/// Relays one large loop to a client that reads at `read_rate`, sampling the
/// server's memory while it runs: with backpressure, it stays flat.
pub async fn slow_reader(params: &SlowParams, spawn: &dyn Spawn) -> Result<SlowReport, BenchError> {
    let chunks = params.bytes.div_ceil(params.chunk_size.max(1) as u64);
    let mix = Mix::fixed(params.chunk_size);
    let (source, _proxy) = if params.chain {
        (AgentSource::Exec(mix), None)
    } else {
        let proxy = SyntheticProxy::start(Plan { mix }).await?;
        (AgentSource::Proxy(proxy.url()), Some(proxy))
    };
    let addr = free_addr()?;
    let load = Load {
        connections: 1,
        runs_per_connection: 1,
    };
    let server = Arc::new(Child::start(spawn.server(addr, &source, TOKEN, load), addr).await?);
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
        Deadline::At(start),
        Some(params.read_rate),
        alone,
        None,
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
