//! What every connection of a server shares: its configuration, its
//! tenants and their shares (which a reload replaces), its shutdown and
//! drain, its tasks, its connection slots, the ids of its runs, the live
//! counts of what it holds and its metrics.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::admission::{Gate, TurnedAway};
use super::budget::Ledger;
use super::config::ServerConfig;
use super::identity::{Shares, Tenants};
use super::refusal_log::RefusalLog;
use super::tenants::{PerIdentity, Roster, TenantChange};
use runloop_metrics::{ClosedAtAccept, ServerMetrics, StatsSnapshot};

/// Live counts of what the server holds; every one returns to zero when
/// the connections that caused it are gone.
#[derive(Debug, Default)]
pub struct Stats {
    pub(crate) connections: AtomicUsize,
    pub(crate) scopes: AtomicUsize,
    pub(crate) containers: AtomicUsize,
    pub(crate) relays: AtomicUsize,
    pub(crate) proxy_paths: AtomicUsize,
    pub(crate) disregarded: AtomicU64,
    pub(crate) turned_away: AtomicU64,
}

impl Stats {
    pub(crate) fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            connections: self.connections.load(Ordering::Relaxed),
            scopes: self.scopes.load(Ordering::Relaxed),
            containers: self.containers.load(Ordering::Relaxed),
            relays: self.relays.load(Ordering::Relaxed),
            proxy_paths: self.proxy_paths.load(Ordering::Relaxed),
            disregarded: self.disregarded.load(Ordering::Relaxed),
            turned_away: self.turned_away.load(Ordering::Relaxed),
        }
    }
}

/// Counts one held thing (a connection, a scope…) for as long as it lives.
pub(crate) struct Held {
    shared: Arc<Shared>,
    counter: fn(&Stats) -> &AtomicUsize,
}

impl Held {
    pub(crate) fn new(shared: &Arc<Shared>, counter: fn(&Stats) -> &AtomicUsize) -> Self {
        counter(&shared.stats).fetch_add(1, Ordering::Relaxed);
        Held {
            shared: Arc::clone(shared),
            counter,
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        (self.counter)(&self.shared.stats).fetch_sub(1, Ordering::Relaxed);
    }
}

/// What every connection of a server shares.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) config: ServerConfig,
    pub(crate) shutdown: CancellationToken,
    /// Fires when a drain begins, or a shutdown: the listener closes.
    pub(crate) draining: CancellationToken,
    pub(crate) tasks: TaskTracker,
    pub(crate) stats: Stats,
    pub(crate) metrics: ServerMetrics,
    /// The number the next connection is known by in logs.
    pub(crate) next_connection: AtomicU64,
    /// One permit per connection being served, `max_connections` in all.
    pub(crate) slots: Arc<Semaphore>,
    /// Ids of running containers, so a new id is unique among them.
    pub(crate) ids: Mutex<HashSet<String>>,
    /// Refusal lines, rate limited per address.
    pub(crate) refusals: RefusalLog,
    /// The admission: which connections are taken on, what they hold.
    pub(crate) gate: Arc<Gate>,
    /// The run ledger: what runs and loops claim of the run budget.
    pub(crate) ledger: Arc<Ledger>,
    /// The tenants, their tokens and shares.
    pub(crate) tenants: Arc<Roster>,
}

impl Shared {
    pub(crate) fn new(config: ServerConfig) -> Self {
        let slots = Arc::new(Semaphore::new(
            config.max_connections.min(Semaphore::MAX_PERMITS),
        ));
        let shutdown = CancellationToken::new();
        let metrics = ServerMetrics::new();
        let tenants = Arc::new(Roster::new(
            config.credentials.tenants(),
            |quota| Shares::of(quota, &config),
            &metrics,
        ));
        let gate = Arc::new(Gate::new(config.admission, Arc::clone(&tenants)));
        let ledger = Arc::new(Ledger::new(config.budget, Arc::clone(&tenants)));
        Shared {
            config,
            ledger,
            gate,
            refusals: RefusalLog::new(),
            draining: shutdown.child_token(),
            shutdown,
            tasks: TaskTracker::new(),
            stats: Stats::default(),
            metrics,
            next_connection: AtomicU64::new(1),
            slots,
            ids: Mutex::new(HashSet::new()),
            tenants,
        }
    }

    /// Counts and logs (rate limited) a connection closed when it was
    /// accepted.
    pub(crate) fn closed_at_accept(
        &self,
        peer: impl std::fmt::Display,
        address: Option<std::net::IpAddr>,
        why: TurnedAway,
    ) {
        self.stats.turned_away.fetch_add(1, Ordering::Relaxed);
        self.metrics.closed_at_accept.inc(match why {
            TurnedAway::Address => ClosedAtAccept::Address,
            TurnedAway::Unauthorized => ClosedAtAccept::Unauthorized,
            TurnedAway::Rate => ClosedAtAccept::Rate,
        });
        if self.refusals.allows(address) {
            tracing::warn!(%peer, %why, "closed at once");
        }
    }

    /// Replaces the tenants with `tenants`, from the next authorization
    /// and the next claim on: what changed, a line each; or why nothing
    /// did.
    pub(crate) fn set_tenants(
        &self,
        tenants: Tenants,
        per_identity: PerIdentity,
    ) -> Result<Vec<String>, TenantChange> {
        let tenants = self.tenants.check(tenants)?;
        let mut config = self.config.clone();
        config.admission.max_connections_per_identity = per_identity.max_connections;
        config.budget.max_runs_per_identity = per_identity.max_runs;
        config.budget.max_loops_per_identity = per_identity.max_loops;
        if let Some(fault) = config.faults().into_iter().next() {
            return Err(TenantChange::Limit(fault));
        }
        Ok(self
            .tenants
            .replace(tenants, |quota| Shares::of(quota, &config), &self.metrics))
    }
}
