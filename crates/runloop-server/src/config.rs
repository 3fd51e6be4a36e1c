//! The server's configuration: the credentials it accepts
//! ([`super::identity`]), its limits (protocol §3, §12), and its TLS.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::admission::Admission;
use super::budget::RunBudget;
use super::identity::{Credentials, Quota, Shares};
use runloop_runtime::{Catalog, Registry};
use runloop_wire::limits::{Limit, LimitError, Limits};
use runloop_wire::tls::ServerTls;

/// Connections a server serves at once unless configured otherwise.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;

/// How the server behaves.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Accepted credentials.
    pub credentials: Credentials,
    /// Per-connection limits.
    pub limits: Limits,
    /// How long a new connection may take to authorize before it is closed
    /// without a frame (protocol §12). Once authorized, nothing times out. At
    /// least [`Limit::MIN_AUTHORIZATION_GRACE`].
    pub authorization_grace: Duration,
    /// Caller connections served at once, authorized or not yet. One more
    /// is turned away: its WebSocket handshake completes and it is closed
    /// at once with close code 1013 (try again later) and a reason that
    /// says so, before anything of it is read. At least one. (Before that,
    /// [`Admission`] may close it at once.)
    pub max_connections: usize,
    /// Which connections are taken on, and what one may cost before it
    /// authorizes (see [`Admission`]).
    pub admission: Admission,
    /// What runs may claim, each and together (see [`RunBudget`]).
    pub budget: RunBudget,
    /// The images this server runs.
    pub catalog: Catalog,
    /// Where `registry` images are pulled from; without one they are refused.
    pub registry: Option<Arc<dyn Registry>>,
    /// TLS for the listener's connections (`wss://`); none: plain `ws://`.
    pub tls: Option<ServerTls>,
    /// How long a message that has begun may go without progress before
    /// its connection is closed (protocol §12, "memory a tenant pays for
    /// includes what it has half sent"). At least
    /// [`Limit::MIN_AUTHORIZATION_GRACE`].
    pub message_idle_timeout: Duration,
    /// How long the running loops of a connection whose tenant or token a
    /// reload removed go on before the connection is closed (protocol
    /// §12, "revocation"). Zero: at once.
    pub revoked_grace: Duration,
    /// Connections from one IP address that have not authorized yet (TCP,
    /// TLS handshake and upgrade included), at once (protocol §12,
    /// "authorization deadline"). At least one.
    pub max_unauthorized_per_address: usize,
    /// Failed credential checks one IP address may have per second (a
    /// token bucket of as many, refilled evenly); past it, its next checks
    /// wait their turn (protocol §12, "fair shares"). At least one.
    pub credential_failure_rate: usize,
    /// The CPU weight of a tenant whose quota names none: each tenant's
    /// runs share one weight (a cgroup of the tenant's over the runs'),
    /// in the scale of cgroup v2's `cpu.weight` (1 to 10000, 100 the
    /// kernel's default; `cpu.shares` = weight × 1024 / 100 on v1).
    pub tenant_cpu_weight: u32,
    /// Where runs' disks are made, when on a filesystem of this server's
    /// (a container store's runs): a run asking for disk is admitted only
    /// when its disk fits that filesystem's free space less what the runs
    /// admitted may still write (protocol §12, "disk is real space").
    /// `None`: runs hold no disk here (exec, attach), and the disk budget
    /// alone holds them.
    pub run_disks: Option<PathBuf>,
    /// Bytes of its agents' output one tenant's runs together may put in
    /// the server's log per second (protocol §12, "fair shares"); past
    /// it, lines are dropped and counted. Zero: none is logged.
    pub tenant_log_rate: u64,
    /// The origins whose pages may connect (protocol §12, "Browser
    /// callers"): an upgrade with an `Origin` not among them gets HTTP 403,
    /// and one with an allowed `Origin` never authorizes with an empty
    /// credential. Callers that send no `Origin` are unaffected. Empty by
    /// default: no browser page may connect.
    pub allowed_origins: Vec<String>,
}

/// [`ServerConfig::message_idle_timeout`] unless configured otherwise.
pub const DEFAULT_MESSAGE_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// [`ServerConfig::revoked_grace`] unless configured otherwise.
pub const DEFAULT_REVOKED_GRACE: Duration = Duration::from_secs(60);
/// [`ServerConfig::max_unauthorized_per_address`] unless configured otherwise.
pub const DEFAULT_MAX_UNAUTHORIZED_PER_ADDRESS: usize = 16;
/// [`ServerConfig::credential_failure_rate`] unless configured otherwise:
/// with the checks that succeed, one address gets far under 50 checks a
/// second.
pub const DEFAULT_CREDENTIAL_FAILURE_RATE: usize = 10;
/// [`ServerConfig::tenant_cpu_weight`] unless configured otherwise: the
/// kernel's own default, so every tenant weighs the same.
pub const DEFAULT_TENANT_CPU_WEIGHT: u32 = 100;
/// [`ServerConfig::tenant_log_rate`] unless configured otherwise, bytes a
/// second: 320 KiB in 5 s, a few hundred lines a second of ordinary output.
pub const DEFAULT_TENANT_LOG_RATE: u64 = 64 << 10;
/// The largest [`ServerConfig::tenant_cpu_weight`] (cgroup v2's).
pub const MAX_CPU_WEIGHT: u32 = 10_000;

impl ServerConfig {
    /// A configuration with default limits, a 10 s authorization grace,
    /// [`DEFAULT_MAX_CONNECTIONS`], the default [`RunBudget`] and the
    /// `DEFAULT_*` constants of this module.
    pub fn new(credentials: Credentials, catalog: Catalog) -> Self {
        ServerConfig {
            credentials,
            limits: Limits::default(),
            authorization_grace: Duration::from_secs(10),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            admission: Admission::default(),
            budget: RunBudget::default(),
            catalog,
            registry: None,
            tls: None,
            message_idle_timeout: DEFAULT_MESSAGE_IDLE_TIMEOUT,
            revoked_grace: DEFAULT_REVOKED_GRACE,
            max_unauthorized_per_address: DEFAULT_MAX_UNAUTHORIZED_PER_ADDRESS,
            credential_failure_rate: DEFAULT_CREDENTIAL_FAILURE_RATE,
            tenant_cpu_weight: DEFAULT_TENANT_CPU_WEIGHT,
            tenant_log_rate: DEFAULT_TENANT_LOG_RATE,
            allowed_origins: Vec::new(),
            run_disks: None,
        }
    }

    /// Whether every limit is at least its minimum ([`Limit`]), so that
    /// the server can serve an ordinary caller; the first that is not is
    /// the error. [`Server::bind`](super::Server::bind) refuses a configuration that fails this.
    pub fn validate(&self) -> Result<(), LimitError> {
        match self.faults().into_iter().next() {
            Some(fault) => Err(fault),
            None => Ok(()),
        }
    }

    /// Every limit below its minimum, in the order [`validate`](Self::validate)
    /// looks at them: what a check of the configuration reports at once.
    pub fn faults(&self) -> Vec<LimitError> {
        let (limits, admission, budget) = (&self.limits, &self.admission, &self.budget);
        [
            Limit::MaxMessageSize.check(limits.max_message_size as u64),
            Limit::MaxScopes.check(limits.max_scopes as u64),
            Limit::MaxChannels.check(limits.max_channels as u64),
            Limit::MaxQueuedResponses.check(limits.max_queued_responses as u64),
            Limit::MaxQueuedBytes.check(limits.max_queued_bytes as u64),
            Limit::MaxConnectionQueuedBytes.check(limits.max_connection_queued_bytes as u64),
            Limit::MaxConnections.check(self.max_connections as u64),
            Limit::check_grace(self.authorization_grace),
            Limit::MaxUnauthorized.check(admission.max_unauthorized as u64),
            Limit::MaxConnectionsPerAddress.check(admission.max_connections_per_address as u64),
            Limit::MaxConnectionsPerIdentity.check(admission.max_connections_per_identity as u64),
            Limit::HandshakeTimeout.check_duration(admission.handshake_timeout),
            Limit::MaxAuthorizationSize.check(admission.max_authorization_size as u64),
            Limit::MaxRuns.check(budget.max_runs as u64),
            Limit::MaxRunsPerIdentity.check(budget.max_runs_per_identity as u64),
            Limit::MaxLoopsPerIdentity.check(budget.max_loops_per_identity as u64),
            Limit::MaxRunMemory.check(budget.max_run_memory),
            Limit::MemoryBudget.check(budget.memory_budget),
            Limit::DiskBudget.check(budget.disk_budget),
            Limit::MessageIdleTimeout.check_duration(self.message_idle_timeout),
            Limit::MaxUnauthorizedPerAddress.check(self.max_unauthorized_per_address as u64),
            Limit::CredentialFailureRate.check(self.credential_failure_rate as u64),
            Limit::TenantCpuWeight.check(u64::from(self.tenant_cpu_weight)),
        ]
        .into_iter()
        .filter_map(Result::err)
        .collect()
    }
}

// What a quota comes to is the configuration's to say: the plain numbers
// are identity.rs's, and the roster (tenants.rs), below the admission and
// the budget that ask it, is handed this resolution.
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
                .min(MAX_CPU_WEIGHT),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
