//! What every connection of a server shares: what is server-wide — its
//! configuration, its shutdown and drain, its tasks, the live counts of
//! what it holds and its metrics, its connection slots, the numbers of its
//! connections, the ids of its runs and its refusal log — and its parts,
//! each owning its state behind its own lock: the admission
//! ([`Gate`]), the run ledger ([`Ledger`]) and the tenants ([`Roster`]).
//!
//! The parts know nothing of this state: the gate and the ledger hold the
//! roster, and what a connection, a run or a loop holds of a part (its
//! [`Admitted`](super::admission::Admitted), [`Claim`](super::budget::Claim),
//! [`LoopClaim`](super::budget::LoopClaim)) holds that part alone.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::admission::{Gate, PerAddress, TurnedAway};
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
    /// Warm containers kept for runs to come, their claims held.
    pub(crate) warm: AtomicUsize,
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
            warm: self.warm.load(Ordering::Relaxed),
            disregarded: self.disregarded.load(Ordering::Relaxed),
            turned_away: self.turned_away.load(Ordering::Relaxed),
            // The ledger's, filled in by the handle.
            half_sent: 0,
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
    /// Fires when the server shuts down: every connection ends.
    pub(crate) shutdown: CancellationToken,
    /// Fires when a drain begins, or a shutdown: the listener closes.
    pub(crate) draining: CancellationToken,
    /// Every connection's task, which a drain and a shutdown wait for.
    pub(crate) tasks: TaskTracker,
    pub(crate) stats: Stats,
    pub(crate) metrics: ServerMetrics,
    /// The number the next connection is known by in logs.
    next_connection: AtomicU64,
    /// One permit per connection being served, `max_connections` in all.
    slots: Arc<Semaphore>,
    /// Ids of running containers, so a new id is unique among them.
    ids: Mutex<HashSet<String>>,
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
        let per_address = PerAddress {
            max_unauthorized: config.max_unauthorized_per_address,
            credential_failure_rate: config.credential_failure_rate,
        };
        let gate = Arc::new(Gate::new(
            config.admission,
            per_address,
            Arc::clone(&tenants),
        ));
        let ledger = Arc::new(Ledger::new(
            config.budget,
            config.run_disks.clone(),
            Arc::clone(&tenants),
        ));
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

    /// The number a new connection is known by in logs.
    pub(crate) fn connection_number(&self) -> u64 {
        self.next_connection.fetch_add(1, Ordering::Relaxed)
    }

    /// A connection's slot among the `max_connections` served at once, if
    /// one is free; held until the connection ends.
    pub(crate) fn slot(&self) -> Option<OwnedSemaphorePermit> {
        Arc::clone(&self.slots).try_acquire_owned().ok()
    }

    /// Takes `id` for a running container, unless one holds it already.
    pub(crate) fn take_id(&self, id: &str) -> bool {
        self.ids().insert(id.to_owned())
    }

    /// Gives `id` back once its container has stopped.
    pub(crate) fn give_back_id(&self, id: &str) {
        self.ids().remove(id);
    }

    fn ids(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.ids
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
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
            TurnedAway::UnauthorizedAddress => ClosedAtAccept::UnauthorizedAddress,
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
