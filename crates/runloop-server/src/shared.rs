//! What every connection of a server shares: its configuration, its
//! shutdown and drain, its tasks, its connection slots, the ids of its
//! runs, the live counts of what it holds and its metrics.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::admission::{self, TurnedAway};
use super::budget::Claimed;
use super::config::ServerConfig;
use super::identity::Credentials;
use super::refusal_log::RefusalLog;
use runloop_metrics::{ServerMetrics, StatsSnapshot};

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
    /// What connections hold, by address and identity.
    admission: Mutex<admission::Held>,
    /// What the runs held claim of the run budget.
    claimed: Mutex<Claimed>,
    /// Whether identities are tokens, each with its own limits; with any
    /// credential accepted, every caller is the same identity.
    pub(crate) per_identity: bool,
}

impl Shared {
    pub(crate) fn new(config: ServerConfig) -> Self {
        let slots = Arc::new(Semaphore::new(
            config.max_connections.min(Semaphore::MAX_PERMITS),
        ));
        let per_identity = matches!(config.credentials, Credentials::Tokens(_));
        let shutdown = CancellationToken::new();
        Shared {
            config,
            claimed: Mutex::new(Claimed::default()),
            admission: Mutex::new(admission::Held::default()),
            refusals: RefusalLog::new(),
            per_identity,
            draining: shutdown.child_token(),
            shutdown,
            tasks: TaskTracker::new(),
            stats: Stats::default(),
            metrics: ServerMetrics::new(),
            next_connection: AtomicU64::new(1),
            slots,
            ids: Mutex::new(HashSet::new()),
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
        if self.refusals.allows(address) {
            tracing::warn!(%peer, %why, "closed at once");
        }
    }

    /// The admission's counts, locked.
    pub(crate) fn admission(&self) -> MutexGuard<'_, admission::Held> {
        self.admission
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The run budget's counts, locked.
    pub(crate) fn claimed(&self) -> MutexGuard<'_, Claimed> {
        self.claimed
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
