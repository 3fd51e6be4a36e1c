//! What every connection of a server shares: its configuration, its
//! tenants and their shares (which a reload replaces), its shutdown and
//! drain, its tasks, its connection slots, the ids of its runs, the live
//! counts of what it holds and its metrics.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::admission::{self, Admission, Gate, TurnedAway};
use super::budget::{Claimed, Ledger, RunBudget};
use super::config::ServerConfig;
use super::handshake_rate::HandshakeRate;
use super::identity::{
    ANONYMOUS, Credentials, Identity, Quota, Shares, TenantError, Tenants, TokenHash,
};
use super::refusal_log::RefusalLog;
use runloop_metrics::{ClosedAtAccept, ServerMetrics, StatsSnapshot};
use runloop_wire::limits::LimitError;

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
    /// New connections per address.
    pub(crate) handshakes: HandshakeRate,
    /// What connections hold, by address and identity.
    admission: Mutex<admission::Held>,
    /// What the runs held claim of the run budget.
    claimed: Mutex<Claimed>,
    /// Whether identities are tenants of tokens, each with its own
    /// limits; with any credential accepted, every caller is the same
    /// identity.
    pub(crate) per_identity: bool,
    /// The tenants, their tokens and shares; replaced whole by a reload.
    table: RwLock<Arc<Table>>,
}

// Shares' resolution against the server's limits lives beside the table
// it fills; the plain numbers are identity.rs's (below the admission and
// the budget, which read them).
impl Shares {
    /// What `quota` comes to on a server configured as `config`: a value
    /// it gives, up to the server-wide limit; else the fair share, half of
    /// the server-wide budget (rounded down, never below one), or the
    /// server's per-identity limit when that is lower.
    pub fn of(quota: &Quota, config: &ServerConfig) -> Shares {
        let budget = &config.budget;
        let half = |n: usize| (n / 2).max(1);
        Shares {
            max_connections: quota.max_connections.map_or(
                config
                    .admission
                    .max_connections_per_identity
                    .min(half(config.max_connections)),
                |v| v.min(config.max_connections),
            ),
            max_runs: quota.max_runs.map_or(
                budget.max_runs_per_identity.min(half(budget.max_runs)),
                |v| v.min(budget.max_runs),
            ),
            max_loops: quota.max_loops.unwrap_or(budget.max_loops_per_identity),
            memory_budget: quota
                .memory_budget
                .map_or(budget.memory_budget / 2, |v| v.min(budget.memory_budget)),
            disk_budget: quota
                .disk_budget
                .map_or(budget.disk_budget / 2, |v| v.min(budget.disk_budget)),
            max_run_memory: quota
                .max_run_memory
                .map_or(budget.max_run_memory, |v| v.min(budget.max_run_memory)),
            max_pulls: {
                let pulls = config
                    .registry
                    .as_ref()
                    .map_or(1, |registry| registry.max_pulls());
                quota.max_pulls.map_or(half(pulls), |v| v.min(pulls))
            },
            cpu_weight: quota
                .cpu_weight
                .unwrap_or(config.tenant_cpu_weight)
                .min(super::config::MAX_CPU_WEIGHT),
        }
    }
}

/// The tenants of a server resolved for serving: every token's hash with
/// its tenant's name, and each tenant's shares.
#[derive(Debug)]
struct Table {
    /// `None`: any credential is accepted.
    tenants: Option<Tenants>,
    tokens: Vec<(TokenHash, Arc<str>)>,
    shares: BTreeMap<Arc<str>, Shares>,
    /// The shares of a tenant no longer configured, whose connections
    /// still run.
    defaults: Shares,
}

impl Table {
    fn new(tenants: Option<Tenants>, config: &ServerConfig) -> Table {
        let defaults = Shares::of(
            &tenants.as_ref().map(|t| t.defaults).unwrap_or_default(),
            config,
        );
        let mut tokens = Vec::new();
        let mut shares = BTreeMap::new();
        for tenant in tenants.iter().flat_map(|t| &t.tenants) {
            let name: Arc<str> = Arc::from(tenant.name.as_str());
            let quota = tenant
                .quota
                .or(tenants.as_ref().map(|t| t.defaults).unwrap_or_default());
            shares.insert(Arc::clone(&name), Shares::of(&quota, config));
            for token in &tenant.tokens {
                tokens.push((*token, Arc::clone(&name)));
            }
        }
        Table {
            tenants,
            tokens,
            shares,
            defaults,
        }
    }

    /// What changed from `old` to this table, a line each, naming
    /// tenants, counts of tokens and shares — never a token or a hash.
    fn changes(&self, old: &Table) -> Vec<String> {
        let mut lines = Vec::new();
        let count =
            |table: &Table, name: &str| table.tokens.iter().filter(|(_, n)| &**n == name).count();
        for (name, shares) in &self.shares {
            match old.shares.get(name) {
                None => lines.push(format!(
                    "tenant {name} added with {} token(s)",
                    count(self, name)
                )),
                Some(before) => {
                    let hashes = |table: &Table| -> Vec<TokenHash> {
                        table
                            .tokens
                            .iter()
                            .filter(|(_, n)| n == name)
                            .map(|(h, _)| *h)
                            .collect()
                    };
                    let (now, then) = (hashes(self), hashes(old));
                    let added = now.iter().filter(|h| !then.contains(h)).count();
                    let removed = then.iter().filter(|h| !now.contains(h)).count();
                    if added + removed > 0 {
                        lines.push(format!(
                            "tenant {name}: {added} token(s) added, {removed} removed"
                        ));
                    }
                    for ((key, value), (_, was)) in shares.keyed().iter().zip(before.keyed()) {
                        if *value != was {
                            lines.push(format!("tenant {name}: {key} {was} -> {value}"));
                        }
                    }
                }
            }
        }
        for name in old.shares.keys() {
            if !self.shares.contains_key(name) {
                lines.push(format!(
                    "tenant {name} removed: its open connections keep running, new ones are refused"
                ));
            }
        }
        for ((key, value), (_, was)) in self.defaults.keyed().iter().zip(old.defaults.keyed()) {
            if *value != was {
                lines.push(format!("tenant-defaults: {key} {was} -> {value}"));
            }
        }
        lines
    }
}

/// The per-identity limits a reload of the tenants may change: what a
/// tenant holds when neither its quota nor the defaults say (each still
/// at most its fair share).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PerIdentity {
    /// `max_connections_per_identity`.
    pub max_connections: usize,
    /// `max_runs_per_identity`.
    pub max_runs: usize,
    /// `max_loops_per_identity`.
    pub max_loops: usize,
}

/// Why a reload of the tenants was not applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TenantChange {
    /// The tenants do not validate.
    #[error(transparent)]
    Invalid(#[from] TenantError),
    /// A per-identity limit below its minimum.
    #[error(transparent)]
    Limit(#[from] LimitError),
    /// The server accepts any credential; tokens need a restart.
    #[error(
        "this server was started without tokens (any credential accepted); tokens and tenants need a restart"
    )]
    Any,
}

impl Shared {
    pub(crate) fn new(config: ServerConfig) -> Self {
        let slots = Arc::new(Semaphore::new(
            config.max_connections.min(Semaphore::MAX_PERMITS),
        ));
        let per_identity = !matches!(config.credentials, Credentials::Any);
        let shutdown = CancellationToken::new();
        let table = Table::new(config.credentials.tenants(), &config);
        let handshakes = HandshakeRate::new(config.admission.handshake_rate);
        let metrics = ServerMetrics::new();
        for name in table.shares.keys() {
            metrics.tenant(name);
        }
        if !per_identity {
            metrics.tenant(ANONYMOUS);
        }
        Shared {
            table: RwLock::new(Arc::new(table)),
            config,
            claimed: Mutex::new(Claimed::default()),
            admission: Mutex::new(admission::Held::default()),
            refusals: RefusalLog::new(),
            handshakes,
            per_identity,
            draining: shutdown.child_token(),
            shutdown,
            tasks: TaskTracker::new(),
            stats: Stats::default(),
            metrics,
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
        self.metrics.closed_at_accept.inc(match why {
            TurnedAway::Address => ClosedAtAccept::Address,
            TurnedAway::Unauthorized => ClosedAtAccept::Unauthorized,
            TurnedAway::Rate => ClosedAtAccept::Rate,
        });
        if self.refusals.allows(address) {
            tracing::warn!(%peer, %why, "closed at once");
        }
    }

    /// The tenants, as last installed.
    fn table(&self) -> Arc<Table> {
        Arc::clone(
            &self
                .table
                .read()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        )
    }

    /// The tenant `credential` is served as, if it is accepted. The
    /// credential is hashed once and its hash compared with every
    /// configured one, in constant time, whatever matches.
    pub(crate) fn accept(&self, credential: &str) -> Option<Identity> {
        let table = self.table();
        let name = if table.tenants.is_none() {
            Arc::from(ANONYMOUS)
        } else {
            let hash = TokenHash::of(credential);
            let mut found = None;
            for (token, name) in &table.tokens {
                if token.ct_eq(&hash) && found.is_none() {
                    found = Some(Arc::clone(name));
                }
            }
            found?
        };
        let figures = self.metrics.tenant(&name);
        Some(Identity::new(name, figures))
    }

    /// What `identity` may hold now: its tenant's shares, or the defaults'
    /// for a tenant no longer configured.
    pub(crate) fn shares(&self, identity: &Identity) -> Shares {
        let table = self.table();
        table
            .shares
            .get(identity.name())
            .copied()
            .unwrap_or(table.defaults)
    }

    /// Every tenant's shares, by name.
    pub(crate) fn all_shares(&self) -> Vec<(String, Shares)> {
        self.table()
            .shares
            .iter()
            .map(|(name, shares)| (name.to_string(), *shares))
            .collect()
    }

    /// Replaces the tenants with `tenants`, from the next authorization
    /// and the next claim on: what changed, a line each; or why nothing
    /// did.
    pub(crate) fn set_tenants(
        &self,
        tenants: Tenants,
        per_identity: PerIdentity,
    ) -> Result<Vec<String>, TenantChange> {
        if !self.per_identity {
            return Err(TenantChange::Any);
        }
        tenants.validate()?;
        let mut config = self.config.clone();
        config.admission.max_connections_per_identity = per_identity.max_connections;
        config.budget.max_runs_per_identity = per_identity.max_runs;
        config.budget.max_loops_per_identity = per_identity.max_loops;
        if let Some(fault) = config.faults().into_iter().next() {
            return Err(TenantChange::Limit(fault));
        }
        let table = Table::new(Some(tenants), &config);
        for name in table.shares.keys() {
            self.metrics.tenant(name);
        }
        let mut installed = self
            .table
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let changes = table.changes(&installed);
        *installed = Arc::new(table);
        Ok(changes)
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

impl Gate for Shared {
    fn admission(&self) -> &Admission {
        &self.config.admission
    }

    fn held(&self) -> MutexGuard<'_, admission::Held> {
        Shared::admission(self)
    }

    fn handshake_rate(&self) -> &HandshakeRate {
        &self.handshakes
    }

    fn connection_share(&self, identity: &Identity) -> Option<usize> {
        self.per_identity
            .then(|| self.shares(identity).max_connections)
    }
}

impl Ledger for Shared {
    fn budget(&self) -> &RunBudget {
        &self.config.budget
    }

    fn claimed(&self) -> MutexGuard<'_, Claimed> {
        Shared::claimed(self)
    }

    fn shares(&self, identity: &Identity) -> Option<Shares> {
        self.per_identity.then(|| Shared::shares(self, identity))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::LoopClaim;
    use runloop_runtime::Catalog;

    /// A server's shared state with `credentials` and at most two loops
    /// per identity.
    fn two_loops_each(credentials: Credentials) -> Arc<Shared> {
        let mut config = ServerConfig::new(credentials, Catalog::new());
        config.budget.max_loops_per_identity = 2;
        Arc::new(Shared::new(config))
    }

    #[test]
    fn a_token_holds_its_loops_up_to_the_limit_and_gets_them_back() {
        let shared = two_loops_each(Credentials::Tokens(vec!["a".into(), "b".into()]));
        let accept = |token| shared.accept(token).expect("a token");
        let (alice, bob) = (accept("a"), accept("b"));
        let held = [
            LoopClaim::admit(shared.clone(), &alice).expect("alice's first"),
            LoopClaim::admit(shared.clone(), &alice).expect("alice's second"),
        ];
        let refused = LoopClaim::admit(shared.clone(), &alice)
            .err()
            .expect("alice's third");
        assert_eq!(refused.0["kind"], "policy");
        assert_eq!(
            refused.0["error"],
            "tenant token #1 holds as many loops as it may (max-loops 2); try again later"
        );
        let bobs = LoopClaim::admit(shared.clone(), &bob).expect("bob's");
        let [first, second] = held;
        drop(first);
        let again = LoopClaim::admit(shared.clone(), &alice).expect("alice's place is back");
        drop((second, again, bobs));
        assert!(shared.claimed().loops_held() == 0);
    }

    /// A registry that pulls nothing, `max_pulls` at once.
    #[derive(Debug)]
    struct Pulls(usize);

    impl runloop_runtime::Registry for Pulls {
        fn resolve(
            &self,
            reference: &str,
            _: runloop_runtime::Puller,
        ) -> runloop_runtime::BoxFuture<
            '_,
            Result<Arc<dyn runloop_runtime::Runtime>, runloop_runtime::RegistryError>,
        > {
            let message = format!("{reference} is not pulled here");
            Box::pin(async move {
                Err(runloop_runtime::RegistryError {
                    kind: runloop_proto::ErrorKind::Registry,
                    message,
                })
            })
        }

        fn max_pulls(&self) -> usize {
            self.0
        }
    }

    #[test]
    fn a_tenants_pulls_are_half_the_servers_unless_its_quota_says() {
        let mut config = ServerConfig::new(Credentials::Any, Catalog::new());
        config.registry = Some(Arc::new(Pulls(5)));
        assert_eq!(Shares::of(&Quota::default(), &config).max_pulls, 2);
        let quota = |max_pulls| Quota {
            max_pulls: Some(max_pulls),
            ..Quota::default()
        };
        assert_eq!(Shares::of(&quota(5), &config).max_pulls, 5);
        assert_eq!(Shares::of(&quota(9), &config).max_pulls, 5);
        config.registry = Some(Arc::new(Pulls(1)));
        assert_eq!(Shares::of(&Quota::default(), &config).max_pulls, 1);
    }

    #[test]
    fn without_tokens_loops_are_not_counted_per_identity() {
        let shared = two_loops_each(Credentials::Any);
        let anyone = shared.accept("").expect("any");
        let held: Vec<LoopClaim> = (0..3)
            .map(|_| LoopClaim::admit(shared.clone(), &anyone).expect("not limited"))
            .collect();
        assert!(shared.claimed().loops_held() == 0);
        drop(held);
    }
}
