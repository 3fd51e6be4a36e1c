//! The provider's server: accepts framed connections, serves
//! `containers::agents::run`, and relays run-loop channels from the proxy.
//!
//! The pieces, in the order a chunk meets them:
//!
//! ```text
//! connection.rs   one caller's socket: authorization, the scope and channel
//!                 tables, frames in, disregarded frames counted
//! scope.rs        one run: policy, runtime, /agent/register, the id, the
//!                 channels, and the ending (stop, container end, disconnect)
//! relay.rs        one run-loop channel: /agent/run, one byte read per proxy
//!                 message, everything else copied
//! proxy_path.rs   dialling the proxy's bare /agent/* paths
//! ```
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
//! [`Server::run`] returns. A [`shutdown`](ServerHandle::shutdown) at any
//! time, the usual end of a drain's deadline, ends whatever is left.
//!
//! What the server does is counted in its [`ServerMetrics`], exposed with
//! its live counts by [`ServerHandle::metrics`].
//!
//! The server's own logs never carry a credential, at any level: a refusal
//! says what was wrong, an identity names the credential's position. One
//! caveat is outside its reach: the WebSocket library logs through `log`,
//! and at trace level writes out every message it reads, the authorization
//! included. A subscriber that bridges `log` records must cap them below
//! trace, as `runloop serve` does.

mod connection;
mod proxy_path;
mod relay;
mod scope;

use std::collections::HashSet;
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use std::time::Instant;

use subtle::ConstantTimeEq;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream, ToSocketAddrs};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

use crate::connection::{Limit, LimitError, Limits};
use crate::metrics::{Reload, ServerMetrics, TlsFailure};
use crate::runtime::{Catalog, Registry};
use crate::tls::{ServerTls, TlsError};
use crate::transport::{self, AcceptError};

/// Which credentials the server accepts (protocol §3).
#[derive(Clone, PartialEq, Eq)]
pub enum Credentials {
    /// Any credential, empty included. Only sensible on a loopback address;
    /// the `runloop serve` command refuses it anywhere else.
    Any,
    /// One of these tokens, compared in constant time.
    Tokens(Vec<String>),
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Credentials::Any => f.write_str("Any"),
            Credentials::Tokens(tokens) => write!(f, "Tokens(<{} redacted>)", tokens.len()),
        }
    }
}

/// Who a connection is served as. It names the credential's position, never
/// the credential, so it can be logged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity(String);

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Credentials {
    /// The identity `credential` is served as, if it is accepted. Every
    /// configured token is compared, in constant time, whatever matches.
    pub fn accept(&self, credential: &str) -> Option<Identity> {
        match self {
            Credentials::Any => Some(Identity("anonymous".to_owned())),
            Credentials::Tokens(tokens) => {
                let mut found = None;
                for (index, token) in tokens.iter().enumerate() {
                    let equal: bool = token.as_bytes().ct_eq(credential.as_bytes()).into();
                    if equal && found.is_none() {
                        found = Some(Identity(format!("token #{}", index + 1)));
                    }
                }
                found
            }
        }
    }
}

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
    /// says so, before anything of it is read. At least one.
    pub max_connections: usize,
    /// The images this server runs.
    pub catalog: Catalog,
    /// Where `registry` images are pulled from; without one they are refused.
    pub registry: Option<Arc<dyn Registry>>,
    /// TLS for the listener's connections (`wss://`); none: plain `ws://`.
    pub tls: Option<ServerTls>,
}

impl ServerConfig {
    /// A configuration with default limits, a 10 s authorization grace and
    /// [`DEFAULT_MAX_CONNECTIONS`].
    pub fn new(credentials: Credentials, catalog: Catalog) -> Self {
        ServerConfig {
            credentials,
            limits: Limits::default(),
            authorization_grace: Duration::from_secs(10),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            catalog,
            registry: None,
            tls: None,
        }
    }

    /// Whether every limit is at least its minimum ([`Limit`]), so that
    /// the server can serve an ordinary caller; the first that is not is
    /// the error. [`Server::bind`] refuses a configuration that fails this.
    pub fn validate(&self) -> Result<(), LimitError> {
        self.limits.validate()?;
        Limit::MaxConnections.check(self.max_connections)?;
        Limit::check_grace(self.authorization_grace)
    }
}

/// Why a server could not be bound.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// A limit of the configuration is below its minimum.
    #[error("the server's configuration would serve nobody: {0}")]
    Limit(#[source] LimitError),
    /// The address could not be listened on.
    #[error("cannot listen: {0}")]
    Listen(#[source] io::Error),
}

/// Live counts of what the server holds; every one returns to zero when
/// the connections that caused it are gone.
#[derive(Debug, Default)]
pub struct Stats {
    connections: AtomicUsize,
    scopes: AtomicUsize,
    containers: AtomicUsize,
    relays: AtomicUsize,
    proxy_paths: AtomicUsize,
    disregarded: AtomicU64,
    turned_away: AtomicU64,
}

/// A snapshot of [`Stats`].
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
    /// Frames disregarded since the server started (protocol §2).
    pub disregarded: u64,
    /// Connections turned away at the connection limit since the server
    /// started.
    pub turned_away: u64,
}

impl Stats {
    fn snapshot(&self) -> StatsSnapshot {
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
struct Held {
    shared: Arc<Shared>,
    counter: fn(&Stats) -> &AtomicUsize,
}

impl Held {
    fn new(shared: &Arc<Shared>, counter: fn(&Stats) -> &AtomicUsize) -> Self {
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
struct Shared {
    config: ServerConfig,
    shutdown: CancellationToken,
    /// Fires when a drain begins: the listener closes.
    draining: CancellationToken,
    tasks: TaskTracker,
    stats: Stats,
    metrics: ServerMetrics,
    /// The number the next connection is known by in logs.
    next_connection: AtomicU64,
    /// One permit per connection being served, `max_connections` in all.
    slots: Arc<Semaphore>,
    /// Ids of running containers, so a new id is unique among them.
    ids: Mutex<HashSet<String>>,
}

/// A bound provider server, not yet serving.
#[derive(Debug)]
pub struct Server {
    listener: TcpListener,
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
        let listener = TcpListener::bind(addr).await.map_err(BindError::Listen)?;
        let slots = Arc::new(Semaphore::new(
            config.max_connections.min(Semaphore::MAX_PERMITS),
        ));
        let shared = Arc::new(Shared {
            config,
            shutdown: CancellationToken::new(),
            draining: CancellationToken::new(),
            tasks: TaskTracker::new(),
            stats: Stats::default(),
            metrics: ServerMetrics::new(),
            next_connection: AtomicU64::new(1),
            slots,
            ids: Mutex::new(HashSet::new()),
        });
        Ok(Server { listener, shared })
    }

    /// The bound address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// A handle for shutting the server down and reading its counts.
    pub fn handle(&self) -> io::Result<ServerHandle> {
        Ok(ServerHandle {
            addr: self.local_addr()?,
            shared: Arc::clone(&self.shared),
        })
    }

    /// Serves until [`ServerHandle::shutdown`]; then stops accepting, ends
    /// every run (channels end with an error, containers stop, scopes
    /// finish), closes every connection, and returns when all of that is done.
    /// After [`ServerHandle::drain`], it stops accepting and returns once
    /// the connections it has are over (or a shutdown ends them).
    pub async fn run(self) {
        let Server { listener, shared } = self;
        info!(addr = ?listener.local_addr().ok(), tls = shared.config.tls.is_some(), "serving");
        // One place per connection a TLS handshake is under way for, so
        // that handshakes too are bounded by the connection limit.
        let handshakes = Arc::new(Semaphore::new(
            shared.config.max_connections.min(Semaphore::MAX_PERMITS),
        ));
        loop {
            let accepted = tokio::select! {
                () = shared.shutdown.cancelled() => break,
                () = shared.draining.cancelled() => break,
                accepted = listener.accept() => accepted,
            };
            match accepted {
                Ok((tcp, peer)) => {
                    // Frames are small and written in batches: Nagle would
                    // only hold each batch back for an ACK.
                    let _ = tcp.set_nodelay(true);
                    let shared_for_task = Arc::clone(&shared);
                    match &shared.config.tls {
                        None => {
                            shared
                                .tasks
                                .spawn(connection::serve(tcp, peer, shared_for_task));
                        }
                        Some(tls) => match Arc::clone(&handshakes).try_acquire_owned() {
                            Ok(place) => {
                                let acceptor = tls.acceptor();
                                shared.tasks.spawn(async move {
                                    serve_tls(tcp, peer, acceptor, shared_for_task, place).await;
                                });
                            }
                            Err(_) => {
                                // No TLS to say why in: the socket just closes.
                                shared.metrics.tls_failures.inc(TlsFailure::Busy);
                                warn!(%peer, "turned away: as many TLS handshakes under way as connections allowed");
                            }
                        },
                    }
                }
                Err(error) => {
                    // Out of file descriptors and the like: back off briefly
                    // instead of spinning.
                    warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
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

    /// Spawns [`run`](Self::run) on the current runtime.
    pub fn spawn(self) -> io::Result<(ServerHandle, tokio::task::JoinHandle<()>)> {
        let handle = self.handle()?;
        Ok((handle, tokio::spawn(self.run())))
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

    /// Starts a graceful shutdown; [`Server::run`] returns when it is done.
    pub fn shutdown(&self) {
        self.shared.shutdown.cancel();
    }

    /// Starts a drain: no new connection is accepted, the server reports
    /// itself not ready, and [`Server::run`] returns once the connections
    /// it has are over. Put a deadline on it with [`shutdown`](Self::shutdown).
    pub fn drain(&self) {
        self.shared.draining.cancel();
    }

    /// Whether the server accepts new connections: neither draining nor
    /// shutting down.
    pub fn is_ready(&self) -> bool {
        !self.shared.draining.is_cancelled() && !self.shared.shutdown.is_cancelled()
    }

    /// The server's live counts.
    pub fn stats(&self) -> StatsSnapshot {
        self.shared.stats.snapshot()
    }

    /// The server's metrics and live counts, in the Prometheus text format.
    pub fn metrics(&self) -> String {
        self.shared
            .metrics
            .encode(&self.stats(), self.shared.draining.is_cancelled())
    }

    /// Reads the TLS certificate and key again and serves them from the
    /// next handshake on ([`ServerTls::reload`]); counted either way.
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

    /// Serves one caller's connection that reached the server some other way
    /// than its listener: any byte stream, from the WebSocket handshake on
    /// (an in-memory pipe in tests and fuzzing, a socket accepted elsewhere).
    /// `peer` names the other end in logs.
    ///
    /// The connection is served exactly as an accepted TCP connection is:
    /// same limits, same authorization, counted in [`stats`](Self::stats),
    /// and ended by [`shutdown`](Self::shutdown), which waits for it. The
    /// returned handle resolves when the connection is over.
    pub fn serve_connection<S>(
        &self,
        io: S,
        peer: impl fmt::Display + Send + 'static,
    ) -> tokio::task::JoinHandle<()>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        self.shared
            .tasks
            .spawn(connection::serve(io, peer, Arc::clone(&self.shared)))
    }
}

impl crate::admin::Watched for ServerHandle {
    fn metrics(&self) -> String {
        ServerHandle::metrics(self)
    }

    fn ready(&self) -> bool {
        self.is_ready()
    }
}

/// The TLS handshake of a listener's connection, within the authorization
/// grace, holding a handshake `place`; then the connection is served.
async fn serve_tls(
    tcp: TcpStream,
    peer: SocketAddr,
    acceptor: tokio_rustls::TlsAcceptor,
    shared: Arc<Shared>,
    place: tokio::sync::OwnedSemaphorePermit,
) {
    let grace = shared.config.authorization_grace;
    let accepted = tokio::select! {
        accepted = tokio::time::timeout(grace, transport::accept(tcp, &acceptor)) => accepted,
        () = shared.shutdown.cancelled() => return,
    };
    drop(place);
    match accepted {
        Ok(Ok(tls)) => connection::serve(tls, peer, shared).await,
        Ok(Err(error)) => {
            shared.metrics.tls_failures.inc(match error {
                AcceptError::Plaintext => TlsFailure::Plaintext,
                AcceptError::NotTls => TlsFailure::NotTls,
                AcceptError::Handshake(_) => TlsFailure::Handshake,
            });
            info!(%peer, %error, "TLS refused");
        }
        Err(_) => {
            shared.metrics.tls_failures.inc(TlsFailure::Timeout);
            info!(%peer, ?grace, "no TLS handshake within the authorization grace");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_matched_and_named_by_position() {
        let credentials = Credentials::Tokens(vec!["alpha".into(), "beta".into()]);
        assert_eq!(
            credentials.accept("beta"),
            Some(Identity("token #2".into()))
        );
        assert_eq!(credentials.accept("gamma"), None);
        assert_eq!(credentials.accept(""), None);
        assert_eq!(credentials.accept("alph"), None);
        assert_eq!(
            Credentials::Any.accept(""),
            Some(Identity("anonymous".into()))
        );
    }

    #[tokio::test]
    async fn bind_refuses_a_configuration_that_would_serve_nobody() {
        let cases = [
            Limit::MaxMessageSize,
            Limit::MaxScopes,
            Limit::MaxChannels,
            Limit::MaxQueuedResponses,
            Limit::MaxConnections,
            Limit::AuthorizationGrace,
        ];
        for limit in cases {
            let mut config = ServerConfig::new(Credentials::Any, Catalog::new());
            match limit {
                Limit::MaxMessageSize => config.limits.max_message_size = 8,
                Limit::MaxScopes => config.limits.max_scopes = 0,
                Limit::MaxChannels => config.limits.max_channels = 0,
                Limit::MaxQueuedResponses => config.limits.max_queued_responses = 0,
                Limit::MaxConnections => config.max_connections = 0,
                Limit::AuthorizationGrace => {
                    config.authorization_grace = Duration::from_millis(999);
                }
            }
            match Server::bind("127.0.0.1:0", config).await {
                Err(BindError::Limit(error)) => {
                    assert_eq!(error.limit, limit);
                    let message = BindError::Limit(error.clone()).to_string();
                    assert!(message.contains(limit.name()), "{message}");
                    assert!(message.contains(&limit.minimum()), "{message}");
                    assert!(std::error::Error::source(&BindError::Limit(error)).is_some());
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
        };
        least.max_connections = 1;
        least.authorization_grace = Limit::MIN_AUTHORIZATION_GRACE;
        assert!(Server::bind("127.0.0.1:0", least).await.is_ok());
    }

    #[test]
    fn debug_never_shows_tokens() {
        let shown = format!("{:?}", Credentials::Tokens(vec!["s3cret".into()]));
        assert!(!shown.contains("s3cret"), "{shown}");
    }
}
