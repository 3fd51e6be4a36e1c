//! The provider's server: accepts framed connections, serves
//! `containers::agents::run`, and relays run-loop channels from the proxy.
//!
//! The server's nouns:
//!
//! ```text
//! identity  the tenant a connection is served as (a name, never a credential)
//! share     what a tenant may hold at once: its quota, else its fair share
//! run       one containers::agents::run scope: a container and its loops
//! loop      one run-loop channel of a run, relayed from the proxy's /agent/run
//! order     a loop's request, handed by the connection to its run's scope
//! held      counted while it lives: a connection, run, container, loop, path
//! places    a bound's units, held until given back: a connection's in the
//!           admission, a response's in its connection's outgoing queue
//! claim     what a run (a place, memory, disk) or a loop takes of the ledger
//! warm      a container a runtime keeps started for runs to come: its
//!           memory and disk claimed of the server's budgets, no tenant's
//! lane      the bytes on their way to a connection's socket, in order
//! gate      the admission: which connections are taken on, and what they hold
//! ledger    the run budget: what runs and loops claim, per tenant and in all
//! roster    the tenants as served: which tenant a token is, and its shares
//! ```
//!
//! The module map, from the listener down: a module uses only modules
//! below it (`tests/module_map.rs` checks that every module is here and
//! every `super::` arrow points down this list).
//!
//! ```text
//! lib.rs          the listener, the handle (drain, shutdown, reloads), TLS
//! connection.rs   one caller's socket: handshake, authorization, frames in,
//!                 each applied to its table; its scopes started
//! scope.rs        one run: policy, its claim, runtime, /agent/register, the
//!                 id, its loops' orders, the ending (stop, container, caller)
//! relay.rs        one loop: /agent/run, one byte read per proxy message,
//!                 everything else copied to the caller
//! responses.rs    a loop's responses: written to the socket while it is
//!                 free, queued otherwise
//! outbox.rs       the connection's table and its writer's queue, one lock;
//!                 a scope and a relay each write only their own frames
//! places.rs       a loop's places in that queue, in responses and bytes
//! run_end.rs      the run's end, one future a relay waits on beside the rest
//! proxy_path.rs   the proxy's bare /agent/* paths: dialled, or called in
//!                 process; a run path read message by message
//! read_ahead.rs   a path's socket read in large pieces, small buffers kept;
//!                 its binary messages taken where they lie (the message
//!                 reader of runloop-wire's ws), the rest handed on
//! pings.rs        a connection's budget of control frames
//! origin.rs       a browser's Origin at the upgrade: 403, or no empty credential
//! half_sent.rs    a caller's message begun and not ended: its bytes
//!                 counted as they come, claimed, held to a deadline
//! warm.rs         warm pools' claims on the ledger, counted
//! shared.rs       what every connection shares: config, shutdown, drain,
//!                 tasks, counts, metrics, slots, ids, refusal log; the parts
//! config.rs       the configuration, and what a quota comes to under it
//! budget.rs       the ledger: what runs and loops claim, per tenant and in all
//! admission.rs    the gate: which connections are taken on, what one costs
//!                 before it authorizes, per address and per identity
//! tenants.rs      the roster: tokens to identities, shares, reloads
//! address_rate.rs  rates per address, a bucket each: new connections,
//!                 failed credentials
//! refusal_log.rs  refusal lines, rate limited per address
//! identity.rs     credentials, tenants, quotas, identities, shares; the
//!                 one token match
//! writes_through.rs  the write half of the socket's read-side wrappers
//!                 (the allowance, the half-sent meter, the read-ahead)
//! ```
//!
//! Calls go one way, from the listener down to the relay: a connection
//! starts its scopes, a scope its relays, and each answers through the
//! outbox handle it was given, never through the task that started it.
//!
//! Every task a connection starts is tied to its cancellation token, and
//! every run ends the same way whatever ended it: its channels end with an
//! error (never a bare or silent finish), its container stops, and then its
//! scope finishes. When the caller's connection goes, nothing is left
//! behind: paths are closed, containers stopped, counters back to zero.
//!
//! A connection usually comes from the server's own listener, but
//! [`ServerHandle::serve_connection`] takes any byte stream (an in-memory
//! pipe in tests and fuzzing) and serves it the same way. With
//! [`ServerConfig::tls`], the listener's connections speak TLS first
//! (`wss://`); the handshake counts against the authorization grace.
//!
//! A server can **drain** ([`ServerHandle::drain`]): it stops accepting
//! (the listener is closed, so a load balancer's next connection goes to
//! another server), reports itself not ready, and keeps serving the
//! connections it has, runs and loops included, until they end; then
//! [`Server::serve`] returns. A [`shutdown`](ServerHandle::shutdown) at any
//! time, the usual end of a drain's deadline, ends whatever is left.
//!
//! What the server does is counted in its [`ServerMetrics`](runloop_metrics::ServerMetrics), exposed with
//! its live counts by [`ServerHandle::metrics`].
//!
//! The server's own logs never carry a credential, at any level: a refusal
//! says what was wrong, an identity names the credential's position. One
//! caveat is outside its reach: the WebSocket library logs through `log`,
//! and at trace level writes out every message it reads, the authorization
//! included. A subscriber that bridges `log` records must cap them below
//! trace, as `runloop serve` does.

mod address_rate;
mod admission;
mod budget;
mod config;
mod connection;
mod half_sent;
mod identity;
mod origin;
mod outbox;
mod pings;
mod places;
mod proxy_path;
mod read_ahead;
mod refusal_log;
mod relay;
mod responses;
mod run_end;
mod scope;
mod shared;
mod tenants;
mod warm;
mod writes_through;

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream, ToSocketAddrs};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tracing::{info, warn};

pub use admission::Admission;
pub use budget::{
    DEFAULT_MAX_LOOPS_PER_IDENTITY, DEFAULT_MAX_RUN_DISK, DEFAULT_MAX_RUN_MEMORY, DEFAULT_MAX_RUNS,
    RunBudget, default_disk_budget, default_memory_budget, default_store_max_size,
};
pub use config::{
    DEFAULT_CREDENTIAL_FAILURE_RATE, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_UNAUTHORIZED_PER_ADDRESS,
    DEFAULT_MESSAGE_IDLE_TIMEOUT, DEFAULT_REVOKED_GRACE, DEFAULT_TENANT_CPU_WEIGHT,
    DEFAULT_TENANT_LOG_RATE, MAX_CPU_WEIGHT, ServerConfig,
};
pub use identity::Shares;
pub use identity::{
    ANONYMOUS, Credentials, Identity, Quota, Tenant, TenantError, Tenants, TokenHash,
    TokenHashError,
};
pub use origin::invalid_origin;
pub use runloop_metrics::StatsSnapshot;
pub use shared::Stats;
pub use tenants::{PerIdentity, TenantChange};

use self::admission::TurnedAway;
use self::shared::Shared;
use runloop_metrics::{Reload, TlsFailure};
use runloop_proto::error_chain::Chain;
use runloop_wire::limits::LimitError;
use runloop_wire::listener;
use runloop_wire::tls::TlsError;
use runloop_wire::transport::{self, AcceptError};

/// Why a server could not be bound.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BindError {
    /// A limit of the configuration is below its minimum.
    #[error("the server's configuration would serve nobody")]
    Limit(#[source] LimitError),
    /// The tenants do not validate.
    #[error("the server's tenants cannot be served")]
    Tenants(#[source] TenantError),
    /// The address could not be listened on.
    #[error("cannot listen")]
    Listen(#[source] io::Error),
}

/// A bound provider server, not yet serving.
#[derive(Debug)]
pub struct Server {
    listener: TcpListener,
    addr: SocketAddr,
    shared: Arc<Shared>,
}

/// Controls a server from elsewhere: its address, its counts, its shutdown.
#[derive(Debug, Clone)]
pub struct ServerHandle {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

impl Server {
    /// Checks the configuration ([`ServerConfig::validate`]) and binds `addr`.
    pub async fn bind(addr: impl ToSocketAddrs, config: ServerConfig) -> Result<Server, BindError> {
        config.validate().map_err(BindError::Limit)?;
        if let Some(tenants) = config.credentials.tenants() {
            tenants.validate().map_err(BindError::Tenants)?;
        }
        let listener = TcpListener::bind(addr).await.map_err(BindError::Listen)?;
        let addr = listener.local_addr().map_err(BindError::Listen)?;
        let shared = Arc::new(Shared::new(config));
        Ok(Server {
            listener,
            addr,
            shared,
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// A handle for shutting the server down and reading its counts.
    pub fn handle(&self) -> ServerHandle {
        ServerHandle {
            addr: self.addr,
            shared: Arc::clone(&self.shared),
        }
    }

    /// Serves until [`ServerHandle::shutdown`]; then stops accepting, ends
    /// every run (channels end with an error, containers stop, scopes
    /// finish), closes every connection, and returns when all of that is done.
    /// After [`ServerHandle::drain`], it stops accepting and returns once
    /// the connections it has are over (or a shutdown ends them).
    pub async fn serve(self) {
        let Server {
            listener,
            addr,
            shared,
        } = self;
        info!(%addr, tls = shared.config.tls.is_some(), "serving");
        for (image, why) in shared.config.catalog.caveats() {
            warn!("image {image:?} cannot be served as configured: {why}");
        }
        // One place per connection a TLS handshake is under way for, so
        // that handshakes too are bounded by the connection limit.
        let handshakes = Arc::new(Semaphore::new(
            shared.config.max_connections.min(Semaphore::MAX_PERMITS),
        ));
        // Callers turned away at accept that are being told why, at most
        // REFUSALS at once; past that they are closed at once.
        let refusals = Arc::new(Semaphore::new(REFUSALS));
        // A shutdown cancels the drain too: either stops the accepting.
        let accepting = listener::accept_until(&listener, &shared.draining, |tcp, peer| {
            let admitted = match shared.gate.admit(Some(peer.ip())) {
                Ok(admitted) => admitted,
                Err(why) => {
                    shared.closed_at_accept(peer, Some(peer.ip()), why);
                    // Dropped (closed at once, nothing of it read), unless
                    // a refusal place is free, the server-wide one and one
                    // of its address's: then the caller is told why. One
                    // over its own address's limit of connections is not
                    // given a handshake more.
                    if let Some(reason) = turned_away_why(&shared.config, why)
                        && let Some(mine) = shared.gate.refusing(peer.ip())
                        && let Ok(place) = Arc::clone(&refusals).try_acquire_owned()
                    {
                        let acceptor = shared.config.tls.as_ref().map(|tls| tls.acceptor());
                        shared.tasks.spawn(refuse(
                            (tcp, peer),
                            acceptor,
                            Arc::clone(&shared),
                            (place, mine),
                            reason,
                        ));
                    }
                    return;
                }
            };
            let for_task = Arc::clone(&shared);
            match &shared.config.tls {
                None => {
                    shared
                        .tasks
                        .spawn(connection::serve(tcp, peer, for_task, admitted));
                }
                Some(tls) => match Arc::clone(&handshakes).try_acquire_owned() {
                    Ok(place) => {
                        let acceptor = tls.acceptor();
                        shared.tasks.spawn(serve_tls(
                            (tcp, peer),
                            acceptor,
                            for_task,
                            place,
                            admitted,
                        ));
                    }
                    Err(_) => {
                        // No TLS to say why in: the socket just closes.
                        shared.metrics.tls_failures.inc(TlsFailure::Busy);
                        warn!(%peer, "turned away: as many TLS handshakes under way as connections allowed");
                    }
                },
            }
        });
        // The refusal log is swept in the listener's task, beside it.
        tokio::select! {
            () = accepting => {}
            () = sweep_refusals(&shared) => {}
        }
        drop(listener);
        shared.tasks.close();
        if !shared.shutdown.is_cancelled() {
            let started = Instant::now();
            info!(
                connections = shared.stats.connections.load(Ordering::Relaxed),
                runs = shared.stats.scopes.load(Ordering::Relaxed),
                loops = shared.stats.relays.load(Ordering::Relaxed),
                "draining: no new connection; the open ones are served until they end"
            );
            tokio::select! {
                () = shared.tasks.wait() => {
                    info!(took = ?started.elapsed(), "drained: every connection ended");
                    return;
                }
                () = shared.shutdown.cancelled() => {}
            }
        }
        info!(
            connections = shared.stats.connections.load(Ordering::Relaxed),
            runs = shared.stats.scopes.load(Ordering::Relaxed),
            loops = shared.stats.relays.load(Ordering::Relaxed),
            "shutting down: ending runs and closing connections"
        );
        shared.tasks.wait().await;
        info!("shut down");
    }

    /// Spawns [`serve`](Self::serve) on the current runtime.
    pub fn spawn(self) -> (ServerHandle, JoinHandle<()>) {
        (self.handle(), tokio::spawn(self.serve()))
    }
}

impl ServerHandle {
    /// The server's address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The URL of the server: `wss://` with TLS, else `ws://`.
    pub fn url(&self) -> String {
        let scheme = if self.shared.config.tls.is_some() {
            "wss"
        } else {
            "ws"
        };
        format!("{scheme}://{}", self.addr)
    }

    /// Starts a graceful shutdown; [`Server::serve`] returns when it is done.
    pub fn shutdown(&self) {
        self.shared.shutdown.cancel();
    }

    /// Starts a drain: no new connection is accepted, the server reports
    /// itself not ready, and [`Server::serve`] returns once the connections
    /// it has are over. Put a deadline on it with [`shutdown`](Self::shutdown).
    pub fn drain(&self) {
        self.shared.draining.cancel();
    }

    /// Whether the server accepts new connections: neither draining nor
    /// shutting down.
    pub fn is_ready(&self) -> bool {
        !self.shared.draining.is_cancelled() && !self.shared.shutdown.is_cancelled()
    }

    /// What the runtimes' warm pools claim against: the server's budgets
    /// (no tenant's), counted in its figures.
    pub fn reserve(&self) -> Arc<dyn runloop_runtime::Reserve> {
        Arc::new(warm::Pools::new(Arc::clone(&self.shared)))
    }

    /// The server's live counts.
    pub fn stats(&self) -> StatsSnapshot {
        StatsSnapshot {
            half_sent: self.shared.ledger.half_sent(),
            ..self.shared.stats.snapshot()
        }
    }

    /// The server's metrics and live counts, in the Prometheus text format.
    pub fn metrics(&self) -> String {
        self.shared
            .metrics
            .encode(&self.stats(), self.shared.draining.is_cancelled())
    }

    /// Reads the TLS certificate and key again and serves them from the
    /// next handshake on ([`ServerTls::reload`](runloop_wire::tls::ServerTls::reload)); counted either way.
    /// `Ok(false)`: the server has no TLS.
    pub fn reload_tls(&self) -> Result<bool, TlsError> {
        let Some(tls) = &self.shared.config.tls else {
            return Ok(false);
        };
        let reloaded = tls.reload();
        let result = if reloaded.is_ok() {
            Reload::Loaded
        } else {
            Reload::Failed
        };
        self.shared.metrics.tls_reloads.inc(result);
        reloaded.map(|()| true)
    }

    /// Replaces the server's tenants, their tokens and quotas, from the
    /// next authorization and the next run or loop on: a removed token's
    /// open connections keep running, new ones are refused. Returns what
    /// changed, a line each (tenant names, counts of tokens and shares,
    /// never a token); an error changes nothing. `per_identity` replaces
    /// the configuration's per-identity limits for what a tenant leaves
    /// out.
    pub fn set_tenants(
        &self,
        tenants: Tenants,
        per_identity: PerIdentity,
    ) -> Result<Vec<String>, TenantChange> {
        self.shared.set_tenants(tenants, per_identity)
    }

    /// Each tenant's shares, by name (none when any credential is accepted).
    pub fn tenant_shares(&self) -> Vec<(String, Shares)> {
        self.shared.tenants.all_shares()
    }

    /// Serves one caller's connection that reached the server some other way
    /// than its listener: any byte stream, from the WebSocket handshake on
    /// (an in-memory pipe in tests and fuzzing, a socket accepted elsewhere).
    /// `peer` names the other end in logs.
    ///
    /// The connection is served exactly as an accepted TCP connection is
    /// (without a per-address limit, having no address): same limits, same
    /// authorization, counted in [`stats`](Self::stats),
    /// and ended by [`shutdown`](Self::shutdown), which waits for it. The
    /// returned handle resolves when the connection is over.
    pub fn serve_connection<S>(
        &self,
        io: S,
        peer: impl fmt::Display + Send + 'static,
    ) -> JoinHandle<()>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let shared = Arc::clone(&self.shared);
        self.shared.tasks.spawn(async move {
            match shared.gate.admit(None) {
                Ok(admitted) => connection::serve(io, peer, shared, admitted).await,
                Err(why) => shared.closed_at_accept(peer, None, why),
            }
        })
    }
}

/// Sweeps the refusal log once per window, for ever.
async fn sweep_refusals(shared: &Shared) {
    let mut ticks = tokio::time::interval(refusal_log::RefusalLog::WINDOW);
    loop {
        ticks.tick().await;
        shared.refusals.sweep();
        shared.gate.sweep();
    }
}

impl runloop_metrics::admin::Watched for ServerHandle {
    fn metrics(&self) -> String {
        ServerHandle::metrics(self)
    }

    fn ready(&self) -> bool {
        self.is_ready()
    }
}

/// Refusal handshakes under way at once (see [`refuse`]).
const REFUSALS: usize = 32;

/// What a caller turned away at accept is told, naming the limit; `None`
/// for one over its own address's limit of connections, which is closed
/// at once.
fn turned_away_why(config: &ServerConfig, why: TurnedAway) -> Option<String> {
    match why {
        TurnedAway::Address => None,
        TurnedAway::UnauthorizedAddress => Some(format!(
            "too many connections from this address are authorizing at once \
             (max-unauthorized-per-address {}); try again later",
            config.max_unauthorized_per_address
        )),
        TurnedAway::Unauthorized => Some(format!(
            "too many connections are authorizing at once (max-unauthorized {}); try again later",
            config.admission.max_unauthorized
        )),
        TurnedAway::Rate => Some(
            "this address opens new connections faster than the server's handshake-rate; \
             try again later"
                .to_owned(),
        ),
    }
}

/// Tells a caller turned away at accept why, in a close frame (1013 and
/// `reason`) after its TLS and WebSocket handshakes, both by one handshake
/// timeout, holding a refusal place, the server's and its address's.
async fn refuse(
    (tcp, peer): (TcpStream, SocketAddr),
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    shared: Arc<Shared>,
    places: (tokio::sync::OwnedSemaphorePermit, admission::Refusing),
    reason: String,
) {
    let _places = places;
    let started = tokio::time::Instant::now();
    let deadline = started + shared.config.admission.handshake_timeout;
    match acceptor {
        // What it sends meanwhile is read no further than the allowance
        // of a connection not yet authorized.
        None => connection::refuse(shared.gate.turned_away(tcp), &shared, deadline, &reason).await,
        Some(acceptor) => {
            let Some(tls) = tls_handshake(tcp, peer, &acceptor, &shared).await else {
                return;
            };
            connection::refuse(shared.gate.turned_away(tls), &shared, deadline, &reason).await;
        }
    }
}

/// A listener connection's TLS handshake, within the handshake timeout
/// (and the authorization grace), counted and logged when it fails; `None`
/// then, or when the server shuts down first.
async fn tls_handshake(
    tcp: TcpStream,
    peer: SocketAddr,
    acceptor: &tokio_rustls::TlsAcceptor,
    shared: &Shared,
) -> Option<tokio_rustls::server::TlsStream<TcpStream>> {
    // The TLS handshake is part of the handshake a connection must finish
    // before it may authorize: an unauthorized caller holds its admission
    // place no longer over TLS than over plain TCP.
    let deadline = shared
        .config
        .admission
        .handshake_timeout
        .min(shared.config.authorization_grace);
    let accepted = tokio::select! {
        accepted = tokio::time::timeout(deadline, transport::accept(tcp, acceptor)) => accepted,
        () = shared.shutdown.cancelled() => return None,
    };
    match accepted {
        Ok(Ok(tls)) => return Some(tls),
        Ok(Err(error)) => {
            shared.metrics.tls_failures.inc(match error {
                AcceptError::Plaintext => TlsFailure::Plaintext,
                AcceptError::NotTls => TlsFailure::NotTls,
                AcceptError::Handshake(_) => TlsFailure::Handshake,
            });
            info!(%peer, error = %Chain(&error), "TLS refused");
        }
        Err(_) => {
            shared.metrics.tls_failures.inc(TlsFailure::Timeout);
            info!(%peer, ?deadline, "no TLS handshake within the handshake timeout");
        }
    }
    None
}

/// The TLS handshake of a listener's connection, holding a handshake
/// `place`; then the connection is served.
async fn serve_tls(
    (tcp, peer): (TcpStream, SocketAddr),
    acceptor: tokio_rustls::TlsAcceptor,
    shared: Arc<Shared>,
    place: tokio::sync::OwnedSemaphorePermit,
    admitted: admission::Admitted,
) {
    let tls = tls_handshake(tcp, peer, &acceptor, &shared).await;
    drop(place);
    if let Some(tls) = tls {
        connection::serve(tls, peer, shared, admitted).await;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use runloop_runtime::Catalog;
    use runloop_wire::limits::{Limit, Limits};

    #[tokio::test]
    async fn bind_refuses_a_configuration_that_would_serve_nobody() {
        // Every limit: the match below names each, so a new one is tested too.
        for &limit in Limit::ALL {
            let mut config = ServerConfig::new(Credentials::Any, Catalog::new());
            match limit {
                Limit::MaxMessageSize => config.limits.max_message_size = 8,
                Limit::MaxScopes => config.limits.max_scopes = 0,
                Limit::MaxChannels => config.limits.max_channels = 0,
                Limit::MaxQueuedResponses => config.limits.max_queued_responses = 0,
                Limit::MaxQueuedBytes => config.limits.max_queued_bytes = 4095,
                Limit::MaxConnectionQueuedBytes => {
                    config.limits.max_connection_queued_bytes = 4095;
                }
                Limit::MaxConnections => config.max_connections = 0,
                Limit::AuthorizationGrace => {
                    config.authorization_grace = Duration::from_millis(999);
                }
                Limit::MaxRuns => config.budget.max_runs = 0,
                Limit::MaxRunsPerIdentity => config.budget.max_runs_per_identity = 0,
                Limit::MaxLoopsPerIdentity => config.budget.max_loops_per_identity = 0,
                Limit::MaxRunMemory => config.budget.max_run_memory = Limit::MIN_RUN_MEMORY - 1,
                Limit::MemoryBudget => config.budget.memory_budget = 0,
                Limit::DiskBudget => config.budget.disk_budget = Limit::MIN_RUN_MEMORY - 1,
                Limit::MaxUnauthorized => config.admission.max_unauthorized = 0,
                Limit::MaxConnectionsPerAddress => {
                    config.admission.max_connections_per_address = 0;
                }
                Limit::MaxConnectionsPerIdentity => {
                    config.admission.max_connections_per_identity = 0;
                }
                Limit::HandshakeTimeout => {
                    config.admission.handshake_timeout = Duration::from_millis(999);
                }
                Limit::MaxAuthorizationSize => config.admission.max_authorization_size = 4095,
                Limit::MessageIdleTimeout => {
                    config.message_idle_timeout = Duration::from_millis(999);
                }
                Limit::MaxUnauthorizedPerAddress => config.max_unauthorized_per_address = 0,
                Limit::CredentialFailureRate => config.credential_failure_rate = 0,
                Limit::TenantCpuWeight => config.tenant_cpu_weight = 0,
            }
            match Server::bind("127.0.0.1:0", config).await {
                Err(BindError::Limit(error)) => {
                    assert_eq!(error.limit, limit);
                    let bind = BindError::Limit(error.clone());
                    assert_eq!(
                        bind.to_string(),
                        "the server's configuration would serve nobody"
                    );
                    let message = Chain(&bind).to_string();
                    assert!(message.contains(limit.name()), "{message}");
                    assert!(message.contains(&limit.minimum()), "{message}");
                    assert!(std::error::Error::source(&bind).is_some());
                    runloop_testkit::errors::assert_cause_said_once(&bind);
                }
                other => panic!("{limit}: {other:?}"),
            }
        }
        let mut least = ServerConfig::new(Credentials::Any, Catalog::new());
        least.limits = Limits {
            max_message_size: Limit::MIN_MESSAGE_SIZE,
            max_scopes: 1,
            max_channels: 1,
            max_queued_responses: 1,
            max_queued_bytes: Limit::MIN_MESSAGE_SIZE,
            max_connection_queued_bytes: Limit::MIN_MESSAGE_SIZE,
        };
        least.max_connections = 1;
        least.authorization_grace = Limit::MIN_AUTHORIZATION_GRACE;
        least.admission = Admission {
            max_unauthorized: 1,
            max_connections_per_address: 1,
            max_connections_per_identity: 1,
            handshake_timeout: Limit::MIN_AUTHORIZATION_GRACE,
            max_authorization_size: Limit::MIN_MESSAGE_SIZE,
            handshake_rate: 1,
        };
        least.budget = RunBudget {
            max_runs: 1,
            max_runs_per_identity: 1,
            max_loops_per_identity: 1,
            max_run_memory: Limit::MIN_RUN_MEMORY,
            max_run_disk: 0,
            memory_budget: Limit::MIN_RUN_MEMORY,
            disk_budget: Limit::MIN_RUN_MEMORY,
        };
        least.message_idle_timeout = Limit::MIN_AUTHORIZATION_GRACE;
        least.max_unauthorized_per_address = 1;
        least.credential_failure_rate = 1;
        least.tenant_cpu_weight = 1;
        assert!(Server::bind("127.0.0.1:0", least).await.is_ok());
    }

    #[tokio::test]
    async fn a_warm_container_is_counted_while_held_and_its_run_when_used() {
        let mut config = ServerConfig::new(Credentials::Any, Catalog::new());
        config.budget.memory_budget = 1 << 30;
        let server = Server::bind("127.0.0.1:0", config).await.expect("binds");
        let handle = server.handle();
        let reserve = handle.reserve();
        let first = reserve.claim(512 << 20, 0).expect("fits");
        let second = reserve.claim(512 << 20, 0).expect("fits");
        assert!(
            reserve.claim(1, 0).is_none(),
            "the server's memory budget is held by the two"
        );
        assert_eq!(handle.stats().warm, 2);
        let metrics = handle.metrics();
        assert!(metrics.contains("runloop_warm_containers 2\n"), "{metrics}");
        first.used();
        drop(second);
        assert_eq!(handle.stats().warm, 0);
        let metrics = handle.metrics();
        assert!(metrics.contains("runloop_warm_containers 0\n"), "{metrics}");
        assert!(
            metrics.contains("runloop_runs_started_warm_total 1\n"),
            "{metrics}"
        );
        assert!(reserve.claim(1 << 30, 0).is_some(), "both given back");
    }

    #[test]
    fn no_bind_error_says_its_cause_twice() {
        let errors = [
            BindError::Tenants(TenantError::Duplicate("a".into())),
            BindError::Listen(io::Error::from(io::ErrorKind::AddrInUse)),
        ];
        for error in &errors {
            runloop_testkit::errors::assert_cause_said_once(error);
        }
        assert_eq!(
            Chain(&errors[0]).to_string(),
            "the server's tenants cannot be served: two tenants are named \"a\""
        );
    }
}
