//! The provider server's metrics: connections, runs, loops, the relay.
//!
//! Counters live here and are counted where the thing happens; the server's
//! live counts of what it holds (its [`StatsSnapshot`]) are read at each
//! scrape instead of being kept twice.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;

use super::{
    AuthorizationRefusal, ClosedAtAccept, ConnectionClosed, Counts, Exposed, Histogram,
    LoopOutcome, MS, ProxyFault, Reading, Reload, Row, RunEnd, RunRefusal, TlsFailure, US,
};

/// The server's live counts at one moment (the server's `Stats`, read).
///
/// A plain struct owned by the metrics, which expose it as gauges, so the
/// metrics need nothing of the server; the server fills it in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StatsSnapshot {
    /// Open caller connections (authorized or not yet).
    pub connections: usize,
    /// Open scopes (runs being served).
    pub scopes: usize,
    /// Running containers.
    pub containers: usize,
    /// Warm containers kept started for runs to come.
    pub warm: usize,
    /// Run-loop channels being relayed (one task each), from the order to
    /// the channel's finish.
    pub relays: usize,
    /// Open WebSocket paths to proxies.
    pub proxy_paths: usize,
    /// Frames disregarded since the server started (protocol §2).
    pub disregarded: u64,
    /// Connections turned away at a connection limit since the server
    /// started: closed at once when accepted (per address, not yet
    /// authorized), with close code 1013 (`max_connections`, per identity).
    pub turned_away: u64,
    /// Bytes of callers' messages begun and not yet ended, held by the
    /// server (protocol §12: they count against the memory budgets).
    pub half_sent: u64,
}

/// Bounds of the relay's latency histogram: 10 µs to 2.5 s.
static RELAY_BOUNDS: [u64; 16] = super::bounds(
    US,
    [
        10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000,
        1_000_000, 2_500_000,
    ],
);

/// Bounds of the runtime's start-time histogram: 1 ms to 60 s.
static START_BOUNDS: [u64; 14] = super::bounds(
    MS,
    [
        1, 5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 30_000, 60_000,
    ],
);

/// One tenant's counts. A connection takes its tenant's once, when it
/// authorizes, so counting is an atomic add like any other counter's.
#[derive(Debug, Default)]
pub struct TenantFigures {
    /// Runs started.
    pub runs_started: AtomicU64,
    /// Runs refused, any reason.
    pub runs_refused: AtomicU64,
    /// Loops ended, refused ones included.
    pub loops: AtomicU64,
    /// Loops refused at the tenant's max-loops.
    pub loops_refused: AtomicU64,
    /// Connections closed at the tenant's max-connections.
    pub connections_refused: AtomicU64,
    /// Chunks relayed to the tenant's callers.
    pub chunks: AtomicU64,
    /// Bytes of those chunks.
    pub bytes: AtomicU64,
}

impl TenantFigures {
    /// Counts `n` more on `counter`.
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// The server's counters and histograms.
#[derive(Debug)]
pub struct ServerMetrics {
    /// Each tenant's counts, by name. Names come from the configuration
    /// only (never from a caller), so the series are as many as the
    /// tenants ever configured.
    tenants: Mutex<BTreeMap<Arc<str>, Arc<TenantFigures>>>,
    /// Caller connections accepted.
    pub connections: Counter,
    /// Connections closed at authorization, by reason.
    pub refused: Counts<AuthorizationRefusal>,
    /// Connections turned away as they were accepted, by reason.
    pub closed_at_accept: Counts<ClosedAtAccept>,
    /// Authorized connections the server closed for a wall of its own,
    /// by reason.
    pub closed: Counts<ConnectionClosed>,
    /// Credential checks that waited for their address's turn
    /// (`--credential-failure-rate`).
    pub credential_checks_slowed: Counter,
    /// TLS handshakes that failed, by reason.
    pub tls_failures: Counts<TlsFailure>,
    /// Certificate reloads, by result.
    pub tls_reloads: Counts<Reload>,
    /// Runs whose container started.
    pub runs_started: Counter,
    /// Runs served by a warm container (started before the run asked).
    pub runs_started_warm: Counter,
    /// Run requests refused, by reason.
    pub runs_refused: Counts<RunRefusal>,
    /// Runs ended, by how.
    pub runs_ended: Counts<RunEnd>,
    /// Loops relayed, by outcome.
    pub loops: Counts<LoopOutcome>,
    /// Loops refused at a loop limit, or for a revoked token.
    pub loops_refused: Counter,
    /// Chunks relayed to callers.
    pub chunks: Counter,
    /// Bytes of chunk JSON relayed.
    pub bytes: Counter,
    /// Faults of proxies' /agent/run paths, by kind.
    pub proxy_faults: Counts<ProxyFault>,
    /// Time the runtime took to start a container that started.
    pub runtime_start: Histogram,
    /// Containers the runtime failed to start.
    pub runtime_failures: Counter,
    /// Time from a proxy's message to its frame on the caller's socket.
    pub relay_latency: Histogram,
}

impl Default for ServerMetrics {
    fn default() -> Self {
        ServerMetrics::new()
    }
}

impl ServerMetrics {
    /// Every metric at zero.
    pub fn new() -> ServerMetrics {
        ServerMetrics {
            tenants: Mutex::default(),
            connections: Counter::default(),
            refused: Counts::new(),
            closed_at_accept: Counts::new(),
            closed: Counts::new(),
            credential_checks_slowed: Counter::default(),
            tls_failures: Counts::new(),
            tls_reloads: Counts::new(),
            runs_started: Counter::default(),
            runs_started_warm: Counter::default(),
            runs_refused: Counts::new(),
            runs_ended: Counts::new(),
            loops: Counts::new(),
            loops_refused: Counter::default(),
            chunks: Counter::default(),
            bytes: Counter::default(),
            proxy_faults: Counts::new(),
            runtime_start: Histogram::new(&START_BOUNDS),
            runtime_failures: Counter::default(),
            relay_latency: Histogram::new(&RELAY_BOUNDS),
        }
    }

    /// The counts of the tenant `name`, made at zero the first time.
    pub fn tenant(&self, name: &str) -> Arc<TenantFigures> {
        let mut tenants = self
            .tenants
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(figures) = tenants.get(name) {
            return Arc::clone(figures);
        }
        let figures = Arc::new(TenantFigures::default());
        tenants.insert(Arc::from(name), Arc::clone(&figures));
        figures
    }

    /// The exposition: these metrics, then the server's live counts
    /// (`live`) and whether it is draining, then the tenants' counts.
    pub fn encode(&self, live: &StatsSnapshot, draining: bool) -> String {
        let mut text = String::new();
        let scrape = Live {
            stats: *live,
            draining,
        };
        super::expose(&mut text, "runloop", SERVER, self, &scrape);
        let tenants = self
            .tenants
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        super::expose(&mut text, "runloop_tenant", TENANTS, &*tenants, &());
        text
    }
}

/// What a scrape reads besides the counters.
pub(crate) struct Live {
    /// The server's live counts.
    stats: StatsSnapshot,
    /// Whether it drains.
    draining: bool,
}

/// A live count as a gauge.
fn gauge(n: usize) -> Reading {
    Reading::of(ConstGauge::new(i64::try_from(n).unwrap_or(i64::MAX)))
}

/// Every metric of the server's exposition, in its order (after the
/// prefix `runloop_`).
pub(crate) const SERVER: &[Row<ServerMetrics, Live>] = &[
    Row::new(
        "connections",
        "Caller connections accepted, before the connection limit and authorization",
        |m, _| Reading::of(m.connections.clone()),
    ),
    Row::new(
        "connections_refused",
        "Connections closed at authorization, by reason",
        |m, _| Reading::of(m.refused.clone()),
    ),
    Row::new(
        "connections_closed_at_accept",
        "Connections turned away as they were accepted, before any handshake, by reason",
        |m, _| Reading::of(m.closed_at_accept.clone()),
    ),
    Row::new(
        "connections_closed",
        "Authorized connections the server closed for a limit of its own (a half-sent \
         message over the memory budget or idle, a revoked token), by reason",
        |m, _| Reading::of(m.closed.clone()),
    ),
    Row::new(
        "credential_checks_slowed",
        "Credential checks that waited their turn: their address had spent its \
         credential-failure-rate",
        |m, _| Reading::of(m.credential_checks_slowed.clone()),
    ),
    Row::new(
        "tls_handshake_failures",
        "TLS connections that failed before their WebSocket handshake, by reason",
        |m, _| Reading::of(m.tls_failures.clone()),
    ),
    Row::new(
        "tls_reloads",
        "Reloads of the TLS certificate and key (SIGHUP), by result",
        |m, _| Reading::of(m.tls_reloads.clone()),
    ),
    Row::new(
        "runs_started_warm",
        "Runs served by a warm container, started before the run asked for it",
        |m, _| Reading::of(m.runs_started_warm.clone()),
    ),
    Row::new(
        "runs_started",
        "Runs whose container ran and whose id was sent",
        |m, _| Reading::of(m.runs_started.clone()),
    ),
    Row::new(
        "runs_refused",
        "Runs answered with an error instead of an id, by reason",
        |m, _| Reading::of(m.runs_refused.clone()),
    ),
    Row::new(
        "runs_ended",
        "Runs that had started and ended, by reason",
        |m, _| Reading::of(m.runs_ended.clone()),
    ),
    Row::new(
        "loops",
        "Run-loop channels ended, by the outcome the server sent",
        |m, _| Reading::of(m.loops.clone()),
    ),
    Row::new(
        "loops_refused",
        "Run-loop channels refused at max_loops_per_identity or for a revoked token \
         (counted as no_loop too)",
        |m, _| Reading::of(m.loops_refused.clone()),
    ),
    Row::new(
        "chunks_relayed",
        "Chunks relayed from proxies to callers",
        |m, _| Reading::of(m.chunks.clone()),
    ),
    Row::bytes(
        "relayed",
        "Bytes of run-loop responses relayed from proxies to callers",
        |m, _| Reading::of(m.bytes.clone()),
    ),
    Row::new(
        "proxy_faults",
        "Faults of proxies' /agent/run paths, by kind",
        |m, _| Reading::of(m.proxy_faults.clone()),
    ),
    Row::seconds(
        "runtime_start",
        "Time the runtime took to start a container that started",
        |m, _| Reading::of(Exposed(m.runtime_start.clone())),
    ),
    Row::new(
        "runtime_start_failures",
        "Containers the runtime failed to start",
        |m, _| Reading::of(m.runtime_failures.clone()),
    ),
    Row::seconds(
        "relay_latency",
        "Time from a proxy's message to its frame written to the caller's socket",
        |m, _| Reading::of(Exposed(m.relay_latency.clone())),
    ),
    Row::new(
        "connections_open",
        "Caller connections open, authorized or not yet",
        |_, live| gauge(live.stats.connections),
    ),
    Row::new("runs_open", "Runs (scopes) being served", |_, live| {
        gauge(live.stats.scopes)
    }),
    Row::new("containers_running", "Containers running", |_, live| {
        gauge(live.stats.containers)
    }),
    Row::new(
        "warm_containers",
        "Warm containers kept started for runs to come, their memory and disk claimed of the server's budgets",
        |_, live| gauge(live.stats.warm),
    ),
    Row::new(
        "loops_open",
        "Run-loop channels being relayed",
        |_, live| gauge(live.stats.relays),
    ),
    Row::new(
        "proxy_paths_open",
        "WebSocket paths to proxies open",
        |_, live| gauge(live.stats.proxy_paths),
    ),
    Row::new(
        "connections_turned_away",
        "Connections closed at the connection limit (close code 1013)",
        |_, live| Reading::of(ConstCounter::new(live.stats.turned_away)),
    ),
    Row::bytes(
        "half_sent",
        "Bytes of callers' messages begun and not yet ended, held by the server",
        |_, live| {
            Reading::of(ConstGauge::new(
                i64::try_from(live.stats.half_sent).unwrap_or(i64::MAX),
            ))
        },
    ),
    Row::new(
        "frames_disregarded",
        "Frames disregarded (protocol §2): malformed, or naming a scope or channel not open",
        |_, live| Reading::of(ConstCounter::new(live.stats.disregarded)),
    ),
    Row::new(
        "agent_log_dropped_lines",
        "Lines of agent output dropped instead of logged: over a run's output budget or its tenant's log rate",
        |_, _| {
            Reading::of(ConstCounter::new(
                super::AGENT_LOG_DROPPED_LINES.load(Ordering::Relaxed),
            ))
        },
    ),
    Row::new(
        "draining",
        "1 while the server drains: it accepts no connection and /readyz answers 503",
        |_, live| Reading::of(ConstGauge::new(i64::from(live.draining))),
    ),
];

/// The tenants, by name.
type Tenants = BTreeMap<Arc<str>, Arc<TenantFigures>>;

/// A counter family by tenant, of the count `pick` chooses.
fn by_tenant(tenants: &Tenants, pick: fn(&TenantFigures) -> &AtomicU64) -> Reading {
    let family = Family::<Vec<(String, String)>, Counter>::default();
    for (tenant, figures) in tenants {
        family
            .get_or_create(&vec![("tenant".to_owned(), tenant.to_string())])
            .inc_by(pick(figures).load(Ordering::Relaxed));
    }
    Reading::of(family)
}

/// The tenants' counts, each a counter family labelled by tenant (after
/// the prefix `runloop_tenant_`). Names come from the configuration only
/// (never from a caller), so the series are as many as the tenants ever
/// configured.
pub(crate) const TENANTS: &[Row<Tenants, ()>] = &[
    Row::new("runs_started", "Runs started, by tenant", |t, _| {
        by_tenant(t, |f| &f.runs_started)
    }),
    Row::new(
        "runs_refused",
        "Runs refused (any reason), by tenant",
        |t, _| by_tenant(t, |f| &f.runs_refused),
    ),
    Row::new("loops", "Run-loop channels ended, by tenant", |t, _| {
        by_tenant(t, |f| &f.loops)
    }),
    Row::new(
        "loops_refused",
        "Run-loop channels refused at the tenant's max-loops, by tenant",
        |t, _| by_tenant(t, |f| &f.loops_refused),
    ),
    Row::new(
        "connections_refused",
        "Connections closed at the tenant's max-connections, by tenant",
        |t, _| by_tenant(t, |f| &f.connections_refused),
    ),
    Row::new(
        "chunks_relayed",
        "Chunks relayed to callers, by tenant",
        |t, _| by_tenant(t, |f| &f.chunks),
    ),
    Row::bytes(
        "relayed",
        "Bytes of run-loop responses relayed to callers, by tenant",
        |t, _| by_tenant(t, |f| &f.bytes),
    ),
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Label;

    #[test]
    fn an_outcome_is_read_from_what_was_sent() {
        let fatal = br#"{"type":"notification","is_fatal":true,"message":null}"#;
        let text = br#"{"type":"assistant_text_content","text":"hi"}"#;
        assert_eq!(LoopOutcome::of(0, false, None), LoopOutcome::NotServed);
        assert_eq!(LoopOutcome::of(0, true, None), LoopOutcome::NoLoop);
        assert_eq!(
            LoopOutcome::of(3, true, Some(fatal)),
            LoopOutcome::Unfinished
        );
        assert_eq!(LoopOutcome::of(3, false, Some(fatal)), LoopOutcome::Fatal);
        assert_eq!(LoopOutcome::of(3, false, Some(text)), LoopOutcome::Finished);
    }

    #[test]
    fn the_exposition_names_every_metric_with_its_unit_and_suffix() {
        let metrics = ServerMetrics::new();
        metrics.loops.inc(LoopOutcome::Fatal);
        metrics.chunks.inc_by(7);
        metrics
            .relay_latency
            .observe(std::time::Duration::from_micros(30));
        let live = StatsSnapshot {
            connections: 2,
            turned_away: 5,
            ..StatsSnapshot::default()
        };
        let text = metrics.encode(&live, true);
        for line in [
            "runloop_loops_total{outcome=\"fatal\"} 1",
            "runloop_loops_total{outcome=\"not_served\"} 0",
            "runloop_loops_refused_total 0",
            "runloop_chunks_relayed_total 7",
            "runloop_relayed_bytes_total 0",
            "runloop_relay_latency_seconds_bucket{le=\"5e-05\"} 1",
            "runloop_relay_latency_seconds_count 1",
            "runloop_runtime_start_seconds_count 0",
            "runloop_connections_open 2",
            "runloop_connections_turned_away_total 5",
            "runloop_draining 1",
            "runloop_agent_log_dropped_lines_total 0",
            "runloop_runs_refused_total{reason=\"registration\"} 0",
            "runloop_runs_refused_total{reason=\"disk\"} 0",
            "runloop_connections_closed_total{reason=\"half_sent_memory\"} 0",
            "runloop_credential_checks_slowed_total 0",
            "runloop_half_sent_bytes 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} is not in\n{text}");
        }
        // Every sample's name carries the prefix.
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            assert!(line.starts_with("runloop_"), "{line}");
        }
        assert!(RunRefusal::ALL.len() == 9);
    }
}
