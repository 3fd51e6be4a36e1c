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
use prometheus_client::registry::{Registry, Unit};

use super::{Counts, Exposed, Histogram, MS, S, US, label};

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
    /// Run-loop channels being relayed (one task each), from the order to
    /// the channel's finish.
    pub relays: usize,
    /// Open WebSocket paths to proxies.
    pub proxy_paths: usize,
    /// Warm containers kept started for runs to come (their memory and
    /// disk claimed of the server's budgets).
    pub warm: usize,
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

label! {
    /// Why a connection was closed at authorization (protocol §3).
    pub enum AuthorizationRefusal("reason") {
        /// A credential the server does not accept.
        Credential = "credential",
        /// A first frame that is not an acceptable authorization frame.
        Malformed = "malformed",
        /// No authorization within the grace period.
        Timeout = "timeout",
        /// More sent before the authorization than the bound allows.
        TooLarge = "too_large",
        /// More control frames (pings, pongs) than the budget allows.
        Flood = "flood",
        /// The credential's token was revoked by a reload while it was
        /// being checked.
        Revoked = "revoked",
    }
}

label! {
    /// Why the server closed an authorized connection for a wall of its
    /// own (protocol §12), not for the caller's words.
    pub enum ConnectionClosed("reason") {
        /// A half-sent message did not fit its tenant's memory budget or
        /// the server's.
        HalfSentMemory = "half_sent_memory",
        /// A half-sent message made no progress for `--message-idle-timeout`.
        MessageIdle = "message_idle",
        /// Its token or tenant was revoked by a reload, and
        /// `--revoked-grace` is over.
        Revoked = "revoked",
    }
}

label! {
    /// Why a connection was turned away as it was accepted, before its
    /// handshake.
    pub enum ClosedAtAccept("reason") {
        /// Its address held `--max-connections-per-address`.
        Address = "address",
        /// Its address held `--max-unauthorized-per-address` connections
        /// not yet authorized.
        UnauthorizedAddress = "unauthorized_address",
        /// `--max-unauthorized` connections were authorizing.
        Unauthorized = "unauthorized",
        /// Its address had spent its `--handshake-rate`.
        Rate = "rate",
    }
}

label! {
    /// Why a TLS connection did not get as far as its WebSocket handshake.
    pub enum TlsFailure("reason") {
        /// The caller spoke plain HTTP to the TLS port.
        Plaintext = "plaintext",
        /// The caller spoke neither TLS nor HTTP.
        NotTls = "not_tls",
        /// The handshake itself failed (no common version, a bad record…).
        Handshake = "handshake",
        /// No handshake within the handshake timeout.
        Timeout = "timeout",
        /// As many handshakes under way as connections allowed.
        Busy = "busy",
    }
}

label! {
    /// Why a run was refused: answered with an error instead of an id
    /// (protocol §5).
    pub enum RunRefusal("reason") {
        /// The request decoded but is not valid.
        Request = "request",
        /// An image or a mount this server will not run.
        Policy = "policy",
        /// Over a limit of runs: the runs at once (server-wide or per
        /// identity), a run's largest memory or disk, the memory budget.
        Budget = "budget",
        /// Its disk does not fit the free space of the filesystem that
        /// holds runs' disks, less what the runs admitted may still write.
        Disk = "disk",
        /// The connection's token or tenant was revoked by a reload.
        Revoked = "revoked",
        /// The container did not start.
        Runtime = "runtime",
        /// The agent's registration failed (the proxy or the agent program refused it, or the proxy could not be reached).
        Registration = "registration",
        /// The run was stopped, or its connection or the server ended, before its id.
        Abandoned = "abandoned",
        /// The server could not make an id.
        Server = "server",
    }
}

label! {
    /// Why a run that started (sent its id) ended.
    pub enum RunEnd("reason") {
        /// The caller stopped it.
        Stop = "stop",
        /// The container ended by itself.
        Container = "container",
        /// The caller's connection ended.
        Disconnect = "disconnect",
        /// The server shut down (or its drain deadline passed).
        Shutdown = "shutdown",
        /// Its connection's token or tenant was revoked by a reload, and
        /// the revocation grace is over.
        Revoked = "revoked",
    }
}

label! {
    /// How a run-loop channel ended, as the server sent it (protocol §7).
    pub enum LoopOutcome("outcome") {
        /// Chunks, then the finish.
        Finished = "finished",
        /// Chunks, the last a fatal notification, then the finish.
        Fatal = "fatal",
        /// Chunks, then an error: a partial result.
        Unfinished = "unfinished",
        /// An error and no chunk: no loop ran.
        NoLoop = "no_loop",
        /// The finish alone: not served.
        NotServed = "not_served",
    }
}

label! {
    /// What went wrong on a proxy's `/agent/run` path (protocol §12).
    pub enum ProxyFault("kind") {
        /// The path could not be opened.
        Unreachable = "unreachable",
        /// The run-loop request could not be sent on it.
        Send = "send",
        /// It ended without a clean close.
        AbruptEnd = "abrupt_end",
        /// The proxy sent an empty message or an unknown tag.
        Sequence = "sequence",
    }
}

label! {
    /// How a reload of the TLS certificate went.
    pub enum Reload("result") {
        /// The new files are served.
        Loaded = "loaded",
        /// They did not load; the old certificate is still served.
        Failed = "failed",
    }
}

impl LoopOutcome {
    /// How a loop ended, from what was sent on its channel: how many
    /// chunks, whether an error came last, and its last chunk's JSON (read
    /// only when the loop finished, to tell a fatal ending).
    pub fn of(chunks: u64, erred: bool, last: Option<&[u8]>) -> LoopOutcome {
        match (chunks, erred) {
            (0, true) => LoopOutcome::NoLoop,
            (0, false) => LoopOutcome::NotServed,
            (_, true) => LoopOutcome::Unfinished,
            (_, false) if last.is_some_and(super::is_fatal) => LoopOutcome::Fatal,
            (_, false) => LoopOutcome::Finished,
        }
    }
}

/// Bounds of the relay's latency histogram: 10 µs to 2.5 s.
static RELAY_BOUNDS: [u64; 16] = [
    10 * US,
    25 * US,
    50 * US,
    100 * US,
    250 * US,
    500 * US,
    MS,
    5 * MS / 2,
    5 * MS,
    10 * MS,
    25 * MS,
    50 * MS,
    100 * MS,
    250 * MS,
    S,
    5 * S / 2,
];

/// Bounds of the runtime's start-time histogram: 1 ms to 60 s.
static START_BOUNDS: [u64; 14] = [
    MS,
    5 * MS,
    10 * MS,
    25 * MS,
    50 * MS,
    100 * MS,
    250 * MS,
    500 * MS,
    S,
    5 * S / 2,
    5 * S,
    10 * S,
    30 * S,
    60 * S,
];

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
    registry: Registry,
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
        let mut registry = Registry::with_prefix("runloop");
        let connections = Counter::default();
        registry.register(
            "connections",
            "Caller connections accepted, before the connection limit and authorization",
            connections.clone(),
        );
        let refused = Counts::new();
        registry.register(
            "connections_refused",
            "Connections closed at authorization, by reason",
            refused.clone(),
        );
        let closed_at_accept = Counts::new();
        registry.register(
            "connections_closed_at_accept",
            "Connections turned away as they were accepted, before any handshake, by reason",
            closed_at_accept.clone(),
        );
        let closed = Counts::new();
        registry.register(
            "connections_closed",
            "Authorized connections the server closed for a limit of its own (a half-sent \
             message over the memory budget or idle, a revoked token), by reason",
            closed.clone(),
        );
        let credential_checks_slowed = Counter::default();
        registry.register(
            "credential_checks_slowed",
            "Credential checks that waited their turn: their address had spent its \
             credential-failure-rate",
            credential_checks_slowed.clone(),
        );
        let tls_failures = Counts::new();
        registry.register(
            "tls_handshake_failures",
            "TLS connections that failed before their WebSocket handshake, by reason",
            tls_failures.clone(),
        );
        let tls_reloads = Counts::new();
        registry.register(
            "tls_reloads",
            "Reloads of the TLS certificate and key (SIGHUP), by result",
            tls_reloads.clone(),
        );
        let runs_started_warm = Counter::default();
        registry.register(
            "runs_started_warm",
            "Runs served by a warm container, started before the run asked for it",
            runs_started_warm.clone(),
        );
        let runs_started = Counter::default();
        registry.register(
            "runs_started",
            "Runs whose container ran and whose id was sent",
            runs_started.clone(),
        );
        let runs_refused = Counts::new();
        registry.register(
            "runs_refused",
            "Runs answered with an error instead of an id, by reason",
            runs_refused.clone(),
        );
        let runs_ended = Counts::new();
        registry.register(
            "runs_ended",
            "Runs that had started and ended, by reason",
            runs_ended.clone(),
        );
        let loops = Counts::new();
        registry.register(
            "loops",
            "Run-loop channels ended, by the outcome the server sent",
            loops.clone(),
        );
        let loops_refused = Counter::default();
        registry.register(
            "loops_refused",
            "Run-loop channels refused at max_loops_per_identity or for a revoked token \
             (counted as no_loop too)",
            loops_refused.clone(),
        );
        let chunks = Counter::default();
        registry.register(
            "chunks_relayed",
            "Chunks relayed from proxies to callers",
            chunks.clone(),
        );
        let bytes = Counter::default();
        registry.register_with_unit(
            "relayed",
            "Bytes of run-loop responses relayed from proxies to callers",
            Unit::Bytes,
            bytes.clone(),
        );
        let proxy_faults = Counts::new();
        registry.register(
            "proxy_faults",
            "Faults of proxies' /agent/run paths, by kind",
            proxy_faults.clone(),
        );
        let runtime_start = Histogram::new(&START_BOUNDS);
        registry.register_with_unit(
            "runtime_start",
            "Time the runtime took to start a container that started",
            Unit::Seconds,
            Exposed(runtime_start.clone()),
        );
        let runtime_failures = Counter::default();
        registry.register(
            "runtime_start_failures",
            "Containers the runtime failed to start",
            runtime_failures.clone(),
        );
        let relay_latency = Histogram::new(&RELAY_BOUNDS);
        registry.register_with_unit(
            "relay_latency",
            "Time from a proxy's message to its frame written to the caller's socket",
            Unit::Seconds,
            Exposed(relay_latency.clone()),
        );
        ServerMetrics {
            tenants: Mutex::default(),
            registry,
            connections,
            refused,
            closed_at_accept,
            closed,
            credential_checks_slowed,
            tls_failures,
            tls_reloads,
            runs_started,
            runs_started_warm,
            runs_refused,
            runs_ended,
            loops,
            loops_refused,
            chunks,
            bytes,
            proxy_faults,
            runtime_start,
            runtime_failures,
            relay_latency,
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

    /// The tenants' counts as labelled counter families.
    fn tenant_registry(&self) -> Registry {
        let mut registry = Registry::with_prefix("runloop_tenant");
        let tenants = self
            .tenants
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        type Pick = fn(&TenantFigures) -> &AtomicU64;
        let families: [(&str, &str, Option<Unit>, Pick); 7] = [
            ("runs_started", "Runs started, by tenant", None, |f| {
                &f.runs_started
            }),
            (
                "runs_refused",
                "Runs refused (any reason), by tenant",
                None,
                |f| &f.runs_refused,
            ),
            ("loops", "Run-loop channels ended, by tenant", None, |f| {
                &f.loops
            }),
            (
                "loops_refused",
                "Run-loop channels refused at the tenant's max-loops, by tenant",
                None,
                |f| &f.loops_refused,
            ),
            (
                "connections_refused",
                "Connections closed at the tenant's max-connections, by tenant",
                None,
                |f| &f.connections_refused,
            ),
            (
                "chunks_relayed",
                "Chunks relayed to callers, by tenant",
                None,
                |f| &f.chunks,
            ),
            (
                "relayed",
                "Bytes of run-loop responses relayed to callers, by tenant",
                Some(Unit::Bytes),
                |f| &f.bytes,
            ),
        ];
        for (name, help, unit, pick) in families {
            let family = Family::<Vec<(String, String)>, Counter>::default();
            for (tenant, figures) in tenants.iter() {
                family
                    .get_or_create(&vec![("tenant".to_owned(), tenant.to_string())])
                    .inc_by(pick(figures).load(Ordering::Relaxed));
            }
            match unit {
                Some(unit) => registry.register_with_unit(name, help, unit, family),
                None => registry.register(name, help, family),
            }
        }
        registry
    }

    /// The exposition: these metrics, then the server's live counts
    /// (`live`) and whether it is draining.
    pub fn encode(&self, live: &StatsSnapshot, draining: bool) -> String {
        let mut gauges = Registry::with_prefix("runloop");
        let gauge = |n: usize| ConstGauge::new(i64::try_from(n).unwrap_or(i64::MAX));
        gauges.register(
            "connections_open",
            "Caller connections open, authorized or not yet",
            gauge(live.connections),
        );
        gauges.register(
            "runs_open",
            "Runs (scopes) being served",
            gauge(live.scopes),
        );
        gauges.register(
            "containers_running",
            "Containers running",
            gauge(live.containers),
        );
        gauges.register(
            "warm_containers",
            "Warm containers kept started for runs to come, their memory and disk claimed of the server's budgets",
            gauge(live.warm),
        );
        gauges.register(
            "loops_open",
            "Run-loop channels being relayed",
            gauge(live.relays),
        );
        gauges.register(
            "proxy_paths_open",
            "WebSocket paths to proxies open",
            gauge(live.proxy_paths),
        );
        gauges.register(
            "connections_turned_away",
            "Connections closed at the connection limit (close code 1013)",
            ConstCounter::new(live.turned_away),
        );
        gauges.register_with_unit(
            "half_sent",
            "Bytes of callers' messages begun and not yet ended, held by the server",
            Unit::Bytes,
            ConstGauge::new(i64::try_from(live.half_sent).unwrap_or(i64::MAX)),
        );
        gauges.register(
            "frames_disregarded",
            "Frames disregarded (protocol §2): malformed, or naming a scope or channel not open",
            ConstCounter::new(live.disregarded),
        );
        gauges.register(
            "agent_log_dropped_lines",
            "Lines of agent output dropped instead of logged: over a run's output budget or its tenant's log rate",
            ConstCounter::new(super::AGENT_LOG_DROPPED_LINES.load(Ordering::Relaxed)),
        );
        gauges.register(
            "draining",
            "1 while the server drains: it accepts no connection and /readyz answers 503",
            ConstGauge::new(i64::from(draining)),
        );
        let tenants = self.tenant_registry();
        super::encode([&self.registry, &gauges, &tenants])
    }
}

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
