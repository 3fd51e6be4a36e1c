//! The figures a bench run prints, for people and for scripts.
//!
//! Throughput and CPU time per chunk are the median over rounds, with the
//! lowest and highest round beside them; a ratio is the median of the
//! per-round ratios (each round measures every side back to back).
//! Latency percentiles are over every chunk of every round.

use std::fmt;
use std::time::Duration;

use serde::Serialize;

use crate::Params;
use crate::load::Tally;

/// One side measured for one round.
#[derive(Debug)]
pub(crate) struct Round {
    pub(crate) tally: Tally,
    pub(crate) wall: Duration,
    /// CPU time the program in the middle used during the round.
    pub(crate) cpu: Option<Duration>,
}

/// One round's figures of one side.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct RoundFigures {
    /// Chunks per second.
    pub chunks_per_s: f64,
    /// CPU time of the program in the middle per chunk, microseconds.
    pub cpu_us_per_chunk: Option<f64>,
}

/// One side of the comparison over every round of a phase.
#[derive(Debug, Clone, Serialize)]
pub struct Side {
    /// Loops run.
    pub loops: u64,
    /// Chunks delivered.
    pub chunks: u64,
    /// Chunk JSON bytes delivered.
    pub bytes: u64,
    /// Wall time, all rounds.
    pub seconds: f64,
    /// Chunks per second (median of the rounds).
    pub chunks_per_s: f64,
    /// Payload megabytes (10^6) per second (median of the rounds).
    pub payload_mb_per_s: f64,
    /// Median latency from the proxy's send to the client's read.
    pub latency_p50_us: f64,
    /// 99th percentile of the same.
    pub latency_p99_us: f64,
    /// CPU time (user + system) of the program in the middle per chunk,
    /// microseconds (median of the rounds); absent for the direct side.
    pub cpu_us_per_chunk: Option<f64>,
    /// Peak resident memory of the program in the middle.
    pub peak_rss_mib: Option<f64>,
    /// Loops that ended with an error or without their finish.
    pub failed_loops: u64,
    /// Chunks lost, repeated or reordered.
    pub disorder: u64,
    /// Each round, in the order they ran.
    pub rounds: Vec<RoundFigures>,
}

impl Side {
    pub(crate) fn new(rounds: &[Round], peak_rss: Option<u64>) -> Side {
        let mut total = Tally::new();
        let mut seconds = 0.0;
        let mut figures = Vec::with_capacity(rounds.len());
        let mut mb_per_s = Vec::with_capacity(rounds.len());
        for round in rounds {
            total.merge(&round.tally);
            let wall = round.wall.as_secs_f64().max(f64::MIN_POSITIVE);
            seconds += wall;
            let chunks = round.tally.chunks.max(1) as f64;
            figures.push(RoundFigures {
                chunks_per_s: round.tally.chunks as f64 / wall,
                cpu_us_per_chunk: round.cpu.map(|cpu| cpu.as_secs_f64() * 1e6 / chunks),
            });
            mb_per_s.push(round.tally.bytes as f64 / wall / 1e6);
        }
        let cpu = figures.iter().filter_map(|f| f.cpu_us_per_chunk);
        let cpu = Spread::of(cpu).map(|s| s.median);
        Side {
            loops: total.loops,
            chunks: total.chunks,
            bytes: total.bytes,
            seconds,
            chunks_per_s: Spread::of(figures.iter().map(|f| f.chunks_per_s))
                .map_or(0.0, |s| s.median),
            payload_mb_per_s: Spread::of(mb_per_s).map_or(0.0, |s| s.median),
            latency_p50_us: total.latency.value_at_quantile(0.5) as f64 / 1e3,
            latency_p99_us: total.latency.value_at_quantile(0.99) as f64 / 1e3,
            cpu_us_per_chunk: cpu,
            peak_rss_mib: peak_rss.map(|b| b as f64 / (1 << 20) as f64),
            failed_loops: total.failed,
            disorder: total.disorder,
            rounds: figures,
        }
    }

    fn is_clean(&self) -> bool {
        self.failed_loops == 0 && self.disorder == 0
    }

    fn throughput(&self) -> Option<Spread> {
        Spread::of(self.rounds.iter().map(|r| r.chunks_per_s))
    }

    fn cpu(&self) -> Option<Spread> {
        Spread::of(self.rounds.iter().filter_map(|r| r.cpu_us_per_chunk))
    }
}

/// The median of some figures, and their lowest and highest.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Spread {
    median: f64,
    min: f64,
    max: f64,
}

impl Spread {
    fn of(values: impl IntoIterator<Item = f64>) -> Option<Spread> {
        let mut values: Vec<f64> = values.into_iter().filter(|v| v.is_finite()).collect();
        values.sort_by(f64::total_cmp);
        let (min, max) = (*values.first()?, *values.last()?);
        let middle = values.len() / 2;
        let median = if values.len().is_multiple_of(2) {
            (values[middle - 1] + values[middle]) / 2.0
        } else {
            values[middle]
        };
        Some(Spread { median, min, max })
    }

    /// Round by round, `metric` of `a` over `metric` of `b`, over the
    /// rounds that measured both.
    fn of_ratios(a: &Side, b: &Side, metric: fn(&RoundFigures) -> Option<f64>) -> Option<Spread> {
        let ratios = a.rounds.iter().zip(&b.rounds).filter_map(|(a, b)| {
            let (a, b) = (metric(a)?, metric(b)?);
            (b > 0.0).then(|| a / b)
        });
        Spread::of(ratios)
    }

    fn range(self) -> [f64; 2] {
        [self.min, self.max]
    }
}

fn throughput(round: &RoundFigures) -> Option<f64> {
    Some(round.chunks_per_s)
}

fn cpu(round: &RoundFigures) -> Option<f64> {
    round.cpu_us_per_chunk
}

/// Round by round, `metric` of `ours` over `metric` of `other`, when both
/// were measured.
fn over(
    ours: &Option<Side>,
    other: &Option<Side>,
    metric: fn(&RoundFigures) -> Option<f64>,
) -> Option<Spread> {
    Spread::of_ratios(ours.as_ref()?, other.as_ref()?, metric)
}

/// The median latency of `ours` over `other`'s, end to end.
fn latency_over(ours: &Option<Side>, other: &Option<Side>) -> Option<f64> {
    let (ours, other) = (ours.as_ref()?, other.as_ref()?);
    Some(ours.latency_p50_us / other.latency_p50_us.max(f64::MIN_POSITIVE))
}

/// Paced: what `ours` adds to the median latency over what `other` adds,
/// each less the median of `ceiling` (the direct read).
fn added_latency_ratio(
    ours: &Option<Side>,
    other: &Option<Side>,
    ceiling: &Option<Side>,
) -> Option<f64> {
    let ceiling = ceiling.as_ref()?.latency_p50_us;
    let ours = ours.as_ref()?.latency_p50_us - ceiling;
    let other = other.as_ref()?.latency_p50_us - ceiling;
    (other > 0.0).then(|| ours / other)
}

/// The three sides of one phase; a side left out is absent.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Sides {
    /// Framed, through the runloop server.
    pub relay: Option<Side>,
    /// Bare, through the batching forwarder.
    pub baseline: Option<Side>,
    /// Bare, read straight from the synthetic proxy: the ceiling.
    pub direct: Option<Side>,
}

impl Sides {
    fn all(&self) -> impl Iterator<Item = (&'static str, &Side)> {
        [
            ("baseline", &self.baseline),
            ("relay", &self.relay),
            ("direct", &self.direct),
        ]
        .into_iter()
        .filter_map(|(name, side)| Some((name, side.as_ref()?)))
    }
}

/// How a bench ran, whichever sides it compared: its loops and their
/// chunks, its rounds and its phases, and the sides it left out.
#[derive(Debug, Clone, Serialize)]
pub struct Shape {
    /// Concurrent loops.
    pub loops: usize,
    /// Framed connections the loops through the server share.
    pub connections: usize,
    /// Chunks per loop (saturated phase).
    pub chunks_per_loop: u64,
    /// The size mix.
    pub mix: String,
    /// The minimum duration of each side in each round.
    pub duration_s: f64,
    /// Rounds per phase.
    pub rounds: usize,
    /// The paced phase's chunks per second per loop.
    pub pace_per_s: Option<u64>,
    /// Chunks per loop in the paced phase.
    pub paced_chunks_per_loop: Option<u64>,
    /// Whether the bench was built without optimisations (its figures are
    /// then not worth comparing).
    pub debug_build: bool,
    /// Sides left out, and why.
    pub skipped: Vec<String>,
}

impl Shape {
    fn new(
        params: &Params,
        connections: usize,
        paced_chunks_per_loop: Option<u64>,
        skipped: Vec<String>,
    ) -> Shape {
        Shape {
            loops: params.loops,
            connections,
            chunks_per_loop: params.chunks,
            mix: params.mix.to_string(),
            duration_s: params.duration.as_secs_f64(),
            rounds: params.rounds,
            pace_per_s: params.pace,
            paced_chunks_per_loop,
            debug_build: cfg!(debug_assertions),
            skipped,
        }
    }

    /// The saturated phase's table, the paced phase's (its sides and the
    /// ceiling's median latency; `cpu` adds the middle's CPU time), then
    /// the sides left out.
    fn tables<'s, I>(
        &self,
        f: &mut fmt::Formatter<'_>,
        saturated: I,
        paced: Option<(I, Option<f64>)>,
        cpu: bool,
    ) -> fmt::Result
    where
        I: Iterator<Item = (&'static str, &'s Side)>,
    {
        saturated_table(f, saturated)?;
        if let (Some((sides, ceiling)), Some(rate), Some(chunks)) =
            (paced, self.pace_per_s, self.paced_chunks_per_loop)
        {
            paced_table(f, rate, chunks, sides, ceiling, cpu)?;
        }
        for reason in &self.skipped {
            writeln!(f, "left out: {reason}")?;
        }
        Ok(())
    }
}

/// The relay against the baseline and the direct read.
///
/// Every ratio is the relay's figure over the other side's: above 1 the
/// relay has more of it (throughput: better; CPU, latency: worse).
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Relay throughput over baseline throughput (chunks per second).
    pub relay_ratio: Option<f64>,
    /// Lowest and highest round of `relay_ratio`.
    pub relay_ratio_range: Option<[f64; 2]>,
    /// Relay median latency over baseline median latency, at saturation
    /// (mostly queue depth).
    pub latency_p50_ratio: Option<f64>,
    /// The relay's chunks per second.
    pub relay_chunks_per_s: f64,
    /// The baseline's chunks per second.
    pub baseline_chunks_per_s: Option<f64>,
    /// The runloop server's peak resident memory.
    pub server_peak_rss_mib: Option<f64>,
    /// The server's CPU time per chunk over the forwarder's.
    pub relay_cpu_per_chunk_ratio: Option<f64>,
    /// Lowest and highest round of `relay_cpu_per_chunk_ratio`.
    pub relay_cpu_per_chunk_ratio_range: Option<[f64; 2]>,
    /// Relay throughput over the direct read's (the ceiling).
    pub relay_vs_direct: Option<f64>,
    /// Lowest and highest round of `relay_vs_direct`.
    pub relay_vs_direct_range: Option<[f64; 2]>,
    /// Baseline throughput over the direct read's.
    pub baseline_vs_direct: Option<f64>,
    /// Paced: relay median latency over baseline median latency, end to end.
    pub relay_paced_latency_p50_ratio: Option<f64>,
    /// Paced: the median latency the relay's hop adds over the forwarder's
    /// (each less the direct read's median).
    pub relay_paced_added_latency_p50_ratio: Option<f64>,
    /// How it ran.
    #[serde(flatten)]
    pub shape: Shape,
    /// The saturated phase.
    #[serde(flatten)]
    pub saturated: Sides,
    /// The paced phase.
    pub paced: Option<Sides>,
}

impl Report {
    pub(crate) fn new(
        params: &Params,
        connections: usize,
        saturated: Sides,
        paced: Option<(u64, Sides)>,
        skipped: Vec<String>,
    ) -> Report {
        let Sides {
            relay,
            baseline,
            direct,
        } = &saturated;
        let ratio = over(relay, baseline, throughput);
        let cpu_ratio = over(relay, baseline, cpu);
        let vs_direct = over(relay, direct, throughput);
        let baseline_vs_direct = over(baseline, direct, throughput);
        let latency_ratio = latency_over(relay, baseline);
        let (paced_chunks, paced) = paced.unzip();
        Report {
            relay_ratio: ratio.map(|s| s.median),
            relay_ratio_range: ratio.map(Spread::range),
            latency_p50_ratio: latency_ratio,
            relay_chunks_per_s: saturated.relay.as_ref().map_or(0.0, |s| s.chunks_per_s),
            baseline_chunks_per_s: saturated.baseline.as_ref().map(|s| s.chunks_per_s),
            server_peak_rss_mib: saturated.relay.as_ref().and_then(|s| s.peak_rss_mib),
            relay_cpu_per_chunk_ratio: cpu_ratio.map(|s| s.median),
            relay_cpu_per_chunk_ratio_range: cpu_ratio.map(Spread::range),
            relay_vs_direct: vs_direct.map(|s| s.median),
            relay_vs_direct_range: vs_direct.map(Spread::range),
            baseline_vs_direct: baseline_vs_direct.map(|s| s.median),
            relay_paced_latency_p50_ratio: paced
                .as_ref()
                .and_then(|p| latency_over(&p.relay, &p.baseline)),
            relay_paced_added_latency_p50_ratio: paced
                .as_ref()
                .and_then(|p| added_latency_ratio(&p.relay, &p.baseline, &p.direct)),
            shape: Shape::new(params, connections, paced_chunks, skipped),
            saturated,
            paced,
        }
    }

    /// Whether every loop on every side finished with every chunk in order.
    pub fn is_clean(&self) -> bool {
        self.saturated
            .all()
            .chain(self.paced.iter().flat_map(Sides::all))
            .all(|(_, side)| side.is_clean())
    }
}

/// `value` with the range of its rounds, e.g. `812k [790k–830k]`.
fn spread(spread: Option<Spread>, unit: fn(f64) -> String) -> String {
    match spread {
        Some(s) if s.min == s.max => unit(s.median),
        Some(s) => format!("{} [{}–{}]", unit(s.median), unit(s.min), unit(s.max)),
        None => "-".to_owned(),
    }
}

fn thousands(value: f64) -> String {
    format!("{:.0}k", value / 1e3)
}

fn micros(value: f64) -> String {
    format!("{value:.2}")
}

fn times(value: f64) -> String {
    format!("{value:.3}×")
}

fn optional(value: Option<f64>, digits: usize) -> String {
    value.map_or_else(|| "-".to_owned(), |v| format!("{v:.digits$}"))
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shape = &self.shape;
        let rounds = if shape.duration_s > 0.0 {
            format!(
                "{} round(s) of at least {} s per side",
                shape.rounds, shape.duration_s
            )
        } else {
            format!(
                "{} round(s), each side running its loops once per round",
                shape.rounds
            )
        };
        writeln!(
            f,
            "{} loop(s) over {} connection(s) × {} chunks, mix {}; {rounds}, sides in turn \
             (baseline relay direct, then the other way round)",
            shape.loops, shape.connections, shape.chunks_per_loop, shape.mix
        )?;
        let paced = self.paced.as_ref().map(|paced| {
            let direct = paced.direct.as_ref().map(|d| d.latency_p50_us);
            (paced.all(), direct)
        });
        shape.tables(f, self.saturated.all(), paced, false)?;
        let lines = [
            (
                "relay/baseline throughput",
                ranged(self.relay_ratio, self.relay_ratio_range),
                "chunks/s through the server over chunks/s through the batching forwarder (1 = as fast)",
            ),
            (
                "relay/baseline CPU per chunk",
                ranged(
                    self.relay_cpu_per_chunk_ratio,
                    self.relay_cpu_per_chunk_ratio_range,
                ),
                "the server's CPU time per chunk over the forwarder's (1 = as cheap)",
            ),
            (
                "relay/direct throughput",
                ranged(self.relay_vs_direct, self.relay_vs_direct_range),
                "chunks/s through the server over chunks/s read straight from the proxy (the ceiling)",
            ),
            (
                "relay/baseline p50 latency",
                optional_times(self.latency_p50_ratio),
                "at saturation: mostly how deep the queues are, not what the hop costs",
            ),
            (
                "relay/baseline paced p50",
                optional_times(self.relay_paced_latency_p50_ratio),
                "median latency end to end at a fixed rate, through the server over through the forwarder",
            ),
            (
                "relay/baseline paced added",
                optional_times(self.relay_paced_added_latency_p50_ratio),
                "the same, each less the direct read's median: what the hop itself adds",
            ),
        ];
        ratio_lines(f, &lines)
    }
}

/// The saturated phase's table, one row a side.
fn saturated_table<'s>(
    f: &mut fmt::Formatter<'_>,
    sides: impl Iterator<Item = (&'static str, &'s Side)>,
) -> fmt::Result {
    writeln!(
        f,
        "{:<9} {:>26} {:>8} {:>9} {:>9} {:>24} {:>9} {:>6} {:>8}",
        "saturated",
        "chunks/s",
        "MB/s",
        "p50 µs",
        "p99 µs",
        "CPU µs/chunk",
        "peak MiB",
        "failed",
        "disorder"
    )?;
    for (name, side) in sides {
        writeln!(
            f,
            "{:<9} {:>26} {:>8.1} {:>9.1} {:>9.1} {:>24} {:>9} {:>6} {:>8}",
            name,
            spread(side.throughput(), thousands),
            side.payload_mb_per_s,
            side.latency_p50_us,
            side.latency_p99_us,
            spread(side.cpu(), micros),
            optional(side.peak_rss_mib, 1),
            side.failed_loops,
            side.disorder
        )?;
    }
    Ok(())
}

/// The paced phase's table, one row a side; `direct` is the direct read's
/// median latency, which the added latency is counted from; `cpu` adds the
/// middle's CPU time per chunk.
fn paced_table<'s>(
    f: &mut fmt::Formatter<'_>,
    rate: u64,
    chunks: u64,
    sides: impl Iterator<Item = (&'static str, &'s Side)>,
    direct: Option<f64>,
    cpu: bool,
) -> fmt::Result {
    writeln!(
        f,
        "paced at {rate} chunks/s per loop, {chunks} chunks per loop:"
    )?;
    write!(
        f,
        "{:<9} {:>9} {:>9} {:>14} {:>6} {:>8}",
        "paced", "p50 µs", "p99 µs", "added p50 µs", "failed", "disorder"
    )?;
    if cpu {
        write!(f, " {:>24}", "CPU µs/chunk")?;
    }
    writeln!(f)?;
    for (name, side) in sides {
        write!(
            f,
            "{:<9} {:>9.1} {:>9.1} {:>14} {:>6} {:>8}",
            name,
            side.latency_p50_us,
            side.latency_p99_us,
            optional(direct.map(|d| side.latency_p50_us - d), 1),
            side.failed_loops,
            side.disorder
        )?;
        if cpu {
            write!(f, " {:>24}", spread(side.cpu(), micros))?;
        }
        writeln!(f)?;
    }
    Ok(())
}

/// The ratio lines: name, value, what it means; the last without a newline.
fn ratio_lines(f: &mut fmt::Formatter<'_>, lines: &[(&str, String, &str)]) -> fmt::Result {
    for (i, (name, value, meaning)) in lines.iter().enumerate() {
        write!(f, "{name:<28} {value:<24} {meaning}")?;
        if i + 1 < lines.len() {
            writeln!(f)?;
        }
    }
    Ok(())
}

/// A ratio with the range of its rounds, as [`spread`] shows it.
fn ranged(median: Option<f64>, range: Option<[f64; 2]>) -> String {
    let spread = median
        .zip(range)
        .map(|(median, [min, max])| Spread { median, min, max });
    self::spread(spread, times)
}

fn optional_times(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), times)
}

/// The whole chain's three sides of one phase; a side left out is absent.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ChainSides {
    /// Framed, through `runloop serve`, its proxy and the agent program.
    pub chain: Option<Side>,
    /// SSE, through nginx in front of the agent program.
    pub nginx: Option<Side>,
    /// SSE, read straight from the agent program: the ceiling.
    pub agent: Option<Side>,
}

impl ChainSides {
    fn all(&self) -> impl Iterator<Item = (&'static str, &Side)> {
        [
            ("nginx", &self.nginx),
            ("chain", &self.chain),
            ("agent", &self.agent),
        ]
        .into_iter()
        .filter_map(|(name, side)| Some((name, side.as_ref()?)))
    }
}

/// The whole chain against nginx and the direct read.
///
/// Every ratio is the chain's figure over nginx's: above 1 the chain has
/// more of it (throughput: better; CPU, latency: worse).
#[derive(Debug, Clone, Serialize)]
pub struct ChainReport {
    /// Chain throughput over nginx throughput (chunks per second).
    pub chain_ratio: Option<f64>,
    /// Lowest and highest round of `chain_ratio`.
    pub chain_ratio_range: Option<[f64; 2]>,
    /// The server's CPU time per chunk over nginx's, saturated.
    pub chain_cpu_per_chunk_ratio: Option<f64>,
    /// Lowest and highest round of `chain_cpu_per_chunk_ratio`.
    pub chain_cpu_per_chunk_ratio_range: Option<[f64; 2]>,
    /// Chain throughput over the direct read's (the ceiling).
    pub chain_vs_agent: Option<f64>,
    /// nginx throughput over the direct read's.
    pub nginx_vs_agent: Option<f64>,
    /// Paced: the server's CPU time per chunk over nginx's.
    pub chain_paced_cpu_per_chunk_ratio: Option<f64>,
    /// Lowest and highest round of `chain_paced_cpu_per_chunk_ratio`.
    pub chain_paced_cpu_per_chunk_ratio_range: Option<[f64; 2]>,
    /// Paced: the chain's median latency over nginx's, end to end.
    pub chain_paced_latency_p50_ratio: Option<f64>,
    /// Paced: the median latency the chain adds over what nginx adds (each
    /// less the direct read's median).
    pub chain_paced_added_latency_p50_ratio: Option<f64>,
    /// How it ran.
    #[serde(flatten)]
    pub shape: Shape,
    /// The saturated phase.
    #[serde(flatten)]
    pub saturated: ChainSides,
    /// The paced phase.
    pub paced: Option<ChainSides>,
}

impl ChainReport {
    pub(crate) fn new(
        params: &Params,
        connections: usize,
        saturated: ChainSides,
        paced: Option<(u64, ChainSides)>,
        skipped: Vec<String>,
    ) -> ChainReport {
        let ChainSides {
            chain,
            nginx,
            agent,
        } = &saturated;
        let ratio = over(chain, nginx, throughput);
        let cpu_ratio = over(chain, nginx, cpu);
        let vs_agent = over(chain, agent, throughput);
        let nginx_vs_agent = over(nginx, agent, throughput);
        let (paced_chunks, paced) = paced.unzip();
        let paced_cpu = paced.as_ref().and_then(|p| over(&p.chain, &p.nginx, cpu));
        let paced_latency = paced
            .as_ref()
            .and_then(|p| latency_over(&p.chain, &p.nginx));
        ChainReport {
            chain_ratio: ratio.map(|s| s.median),
            chain_ratio_range: ratio.map(Spread::range),
            chain_cpu_per_chunk_ratio: cpu_ratio.map(|s| s.median),
            chain_cpu_per_chunk_ratio_range: cpu_ratio.map(Spread::range),
            chain_vs_agent: vs_agent.map(|s| s.median),
            nginx_vs_agent: nginx_vs_agent.map(|s| s.median),
            chain_paced_cpu_per_chunk_ratio: paced_cpu.map(|s| s.median),
            chain_paced_cpu_per_chunk_ratio_range: paced_cpu.map(Spread::range),
            chain_paced_latency_p50_ratio: paced_latency,
            chain_paced_added_latency_p50_ratio: paced
                .as_ref()
                .and_then(|p| added_latency_ratio(&p.chain, &p.nginx, &p.agent)),
            shape: Shape::new(params, connections, paced_chunks, skipped),
            saturated,
            paced,
        }
    }

    /// Whether every loop on every side finished with every chunk in order.
    pub fn is_clean(&self) -> bool {
        self.saturated
            .all()
            .chain(self.paced.iter().flat_map(ChainSides::all))
            .all(|(_, side)| side.is_clean())
    }
}

impl fmt::Display for ChainReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shape = &self.shape;
        writeln!(
            f,
            "the whole chain: {} loop(s) over {} connection(s) × {} chunks, mix {}; {} round(s) of \
             at least {} s per side, sides in turn (nginx chain agent, then the other way round)",
            shape.loops,
            shape.connections,
            shape.chunks_per_loop,
            shape.mix,
            shape.rounds,
            shape.duration_s
        )?;
        let paced = self.paced.as_ref().map(|paced| {
            let agent = paced.agent.as_ref().map(|a| a.latency_p50_us);
            (paced.all(), agent)
        });
        shape.tables(f, self.saturated.all(), paced, true)?;
        let lines = [
            (
                "chain/nginx CPU per chunk",
                ranged(
                    self.chain_cpu_per_chunk_ratio,
                    self.chain_cpu_per_chunk_ratio_range,
                ),
                "the server's CPU time per chunk over nginx's, saturated (1 = as cheap)",
            ),
            (
                "chain/nginx throughput",
                ranged(self.chain_ratio, self.chain_ratio_range),
                "chunks/s through the server over chunks/s through nginx (1 = as fast)",
            ),
            (
                "chain/agent throughput",
                optional_times(self.chain_vs_agent),
                "chunks/s through the server over chunks/s read straight from the agent",
            ),
            (
                "chain/nginx paced CPU",
                ranged(
                    self.chain_paced_cpu_per_chunk_ratio,
                    self.chain_paced_cpu_per_chunk_ratio_range,
                ),
                "the same CPU ratio at a fixed rate",
            ),
            (
                "chain/nginx paced p50",
                optional_times(self.chain_paced_latency_p50_ratio),
                "median latency agent to caller at a fixed rate, end to end",
            ),
            (
                "chain/nginx paced added",
                optional_times(self.chain_paced_added_latency_p50_ratio),
                "the same, each less the direct read's median: what the middle adds",
            ),
        ];
        ratio_lines(f, &lines)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_is_the_median_and_the_extremes() {
        let odd = Spread::of([3.0, 1.0, 2.0]).expect("values");
        assert_eq!(
            odd,
            Spread {
                median: 2.0,
                min: 1.0,
                max: 3.0
            }
        );
        let even = Spread::of([4.0, 1.0, 2.0, 10.0]).expect("values");
        assert_eq!(
            even,
            Spread {
                median: 3.0,
                min: 1.0,
                max: 10.0
            }
        );
        assert_eq!(Spread::of([]), None);
        assert_eq!(Spread::of([f64::NAN]), None);
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
