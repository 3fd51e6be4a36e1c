//! The provider's server: accepts framed connections, serves
//! `containers::agents::run`, and relays run-loop channels from the proxy.
//!
//! The pieces, in the order a chunk meets them, from the proxy to the
//! caller:
//!
//! ```text
//! proxy_path.rs   dialling the proxy's bare /agent/* paths
//! relay.rs        one run-loop channel: /agent/run, one byte read per proxy
//!                 message, everything else copied
//! scope.rs        one run: policy, runtime, /agent/register, the id, the
//!                 channels, and the ending (stop, container end, disconnect)
//! outbox.rs       the connection's table and its writer's queue under one
//!                 lock; a scope and a relay each get a handle that writes
//!                 only their own frames
//! places.rs       a channel's places in that queue, in responses and bytes
//! connection.rs   one caller's socket: authorization, frames in, each applied
//!                 to the table (runloop_proto::connection), disregarded
//!                 frames counted; pings.rs its budget of control frames
//! mod.rs          the listener, the handle; config.rs and shared.rs what
//!                 every connection shares
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
//! pipe in tests and fuzzing) and serves it the same way.
//!
//! The server's own logs never carry a credential, at any level: a refusal
//! says what was wrong, an identity names the credential's position. One
//! caveat is outside its reach: the WebSocket library logs through `log`,
//! and at trace level writes out every message it reads, the authorization
//! included. A subscriber that bridges `log` records must cap them below
//! trace, as `runloop serve` does.

mod config;
mod connection;
mod outbox;
mod pings;
mod places;
mod proxy_path;
mod relay;
mod scope;
mod shared;

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, ToSocketAddrs};
use tokio::task::JoinHandle;
use tracing::info;

pub use config::{Credentials, DEFAULT_MAX_CONNECTIONS, Identity, ServerConfig};
pub use shared::{Stats, StatsSnapshot};

use self::shared::Shared;
use crate::limits::LimitError;
use crate::listener;

/// Why a server could not be bound.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BindError {
    /// A limit of the configuration is below its minimum.
    #[error("the server's configuration would serve nobody: {0}")]
    Limit(#[source] LimitError),
    /// The address could not be listened on.
    #[error("cannot listen: {0}")]
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
    pub async fn serve(self) {
        let Server {
            listener,
            addr,
            shared,
        } = self;
        info!(%addr, "serving");
        listener::accept_until(&listener, &shared.shutdown, |tcp, peer| {
            let for_task = Arc::clone(&shared);
            shared.tasks.spawn(connection::serve(tcp, peer, for_task));
        })
        .await;
        drop(listener);
        info!("shutting down: ending runs and closing connections");
        shared.tasks.close();
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

    /// The `ws://` URL of the server.
    pub fn url(&self) -> String {
        format!("ws://{}", self.addr)
    }

    /// Starts a graceful shutdown; [`Server::serve`] returns when it is done.
    pub fn shutdown(&self) {
        self.shared.shutdown.cancel();
    }

    /// The server's live counts.
    pub fn stats(&self) -> StatsSnapshot {
        self.shared.stats.snapshot()
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
    ) -> JoinHandle<()>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        self.shared
            .tasks
            .spawn(connection::serve(io, peer, Arc::clone(&self.shared)))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::limits::{Limit, Limits};
    use crate::runtime::Catalog;

    #[tokio::test]
    async fn bind_refuses_a_configuration_that_would_serve_nobody() {
        let cases = [
            Limit::MaxMessageSize,
            Limit::MaxScopes,
            Limit::MaxChannels,
            Limit::MaxQueuedResponses,
            Limit::MaxQueuedBytes,
            Limit::MaxConnectionQueuedBytes,
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
                Limit::MaxQueuedBytes => config.limits.max_queued_bytes = 4095,
                Limit::MaxConnectionQueuedBytes => {
                    config.limits.max_connection_queued_bytes = 4095;
                }
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
            max_queued_bytes: Limit::MIN_MESSAGE_SIZE,
            max_connection_queued_bytes: Limit::MIN_MESSAGE_SIZE,
        };
        least.max_connections = 1;
        least.authorization_grace = Limit::MIN_AUTHORIZATION_GRACE;
        assert!(Server::bind("127.0.0.1:0", least).await.is_ok());
    }
}
