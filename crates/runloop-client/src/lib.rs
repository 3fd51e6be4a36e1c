//! The caller's client: one framed connection to a provider server, many
//! runs and loops on it at once.
//!
//! ```text
//! Client::connect ──▶ client.start(request) ──▶ Run (id) ──▶ run.run_loop(prompt) ──▶ RunLoop
//!                                                                                    │ Stream of Event:
//!                                                                                    │ Chunk… Error? End(Outcome)
//! ```
//!
//! One task reads the socket and routes each server frame to the scope or
//! channel it names, as the connection table says; one task writes. The
//! pieces, in the order a chunk meets them:
//!
//! ```text
//! connection.rs   the table, the reading task, routing, the end
//! run_loop.rs     one loop: its queue read through the Reader, a Stream of Event
//! run.rs          one run: its id, its loops, its stop
//! lib.rs          Client: connect, authorize, open runs, close
//! ```
//! Every loop's responses go through
//! `runloop_proto`'s [`Reader`](runloop_proto::run_loop::Reader), so a
//! loop's [`Outcome`] means exactly what
//! the protocol says: a dropped connection or an ended run is `Broken`,
//! never `Finished`.
//!
//! Each loop has a bounded queue (`max_queued_responses`). When a consumer
//! stops reading its loop, the reading task waits for it, which in turn
//! pauses every other scope on the same connection: the protocol has no
//! per-channel flow control, so bounded memory costs head-of-line blocking.
//! Read loops you open, or open them on separate connections.
//!
//! A caller needs this crate alone: what it uses of the protocol's types
//! (the run request, chunks, outcomes, the transcript, error values) is
//! re-exported here, and the whole of `runloop-proto` as [`proto`].

mod connection;
mod run;
mod run_loop;

use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use runloop_proto::agents_run::RunResponseError;
use runloop_proto::authorization::Authorization;
use runloop_proto::endpoint::EndpointRequest;
use runloop_proto::frame::{self, ClientFrame, Role};
use runloop_proto::{Encode, Undecodable};
use tokio::sync::oneshot;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_util::sync::CancellationToken;
use tracing::debug;

pub use connection::Ending;
pub use run::Run;
pub use run_loop::{Event, RunLoop};

/// The whole protocol crate, for what the names below leave out (the
/// chunk kinds' own structs, the capture format, …).
#[doc(no_inline)]
pub use runloop_proto as proto;
#[doc(no_inline)]
pub use runloop_proto::agents_run::{
    Container, DEFAULT_DISK, DEFAULT_MEMORY, Image, ImageRef, InvalidRequest, RegistryImage,
    RunRequest,
};
/// An error and its causes on one line, each said once: how to print any
/// error of this crate for a person (`Chain(&error)`).
#[doc(no_inline)]
pub use runloop_proto::error_chain::Chain;
#[doc(no_inline)]
pub use runloop_proto::run_loop::{
    AgenticLoopChunk, Broken, ChunkKind, Outcome, RunLoopRequest, Transcript,
};
#[doc(no_inline)]
pub use runloop_proto::{ErrorKind, ErrorValue};
#[doc(no_inline)]
pub use runloop_wire::limits::Limits;
#[doc(no_inline)]
pub use runloop_wire::tls::{ClientTls, TlsError};
#[doc(no_inline)]
pub use runloop_wire::transport::DialError;

use self::connection::{Connection, Shared, Started};
use runloop_wire::limits::LimitError;
use runloop_wire::transport;
pub use runloop_wire::writer::Tap;
use runloop_wire::writer::{self, write_frames};

/// How long connecting may take by default: TCP, TLS, the WebSocket
/// upgrade and sending the authorization (the Python package's default too).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How a client behaves.
///
/// Made from [`ClientConfig::default`] and changed with the setters (or
/// by assigning a field): the struct is `#[non_exhaustive]`, so a field
/// added later never breaks a caller.
///
/// ```
/// use std::time::Duration;
/// use runloop_client::ClientConfig;
///
/// let config = ClientConfig::default().connect_timeout(Some(Duration::from_secs(3)));
/// assert_eq!(config.connect_timeout, Some(Duration::from_secs(3)));
/// ```
#[derive(Clone)]
#[non_exhaustive]
pub struct ClientConfig {
    /// Per-connection limits (message size, queued responses per loop).
    pub limits: Limits,
    /// Sees every frame in both directions (for captures).
    pub tap: Option<Tap>,
    /// Whom a `wss://` server's certificate must come from; none: the
    /// platform's roots ([`ClientTls::platform`]).
    pub tls: Option<ClientTls>,
    /// How long [`Client::connect_with`] may take, from the dial to the
    /// authorization sent; `None`: no bound. [`DEFAULT_CONNECT_TIMEOUT`]
    /// by default.
    pub connect_timeout: Option<Duration>,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            limits: Limits::default(),
            tap: None,
            tls: None,
            connect_timeout: Some(DEFAULT_CONNECT_TIMEOUT),
        }
    }
}

impl ClientConfig {
    /// With these per-connection limits.
    #[must_use]
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// With a tap that sees every frame in both directions.
    #[must_use]
    pub fn tap(mut self, tap: Tap) -> Self {
        self.tap = Some(tap);
        self
    }

    /// Trusting `tls`'s authorities (and the platform's roots) for `wss://`.
    #[must_use]
    pub fn tls(mut self, tls: ClientTls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// With this bound on connecting; `None`: no bound.
    #[must_use]
    pub fn connect_timeout(mut self, limit: Option<Duration>) -> Self {
        self.connect_timeout = limit;
        self
    }
}

impl std::fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientConfig")
            .field("limits", &self.limits)
            .field("tap", &self.tap.is_some())
            .field("tls", &self.tls)
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

/// Why a connection could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The connection could not be opened: the URL, TCP, TLS (a
    /// certificate that does not verify names the host and the reason) or
    /// the WebSocket handshake. The dial's error names the step.
    #[error(transparent)]
    Dial(DialError),
    /// The authorization frame could not be sent.
    #[error("cannot authorize")]
    Authorization(#[source] WsError),
    /// A limit of the configuration is below its minimum.
    #[error("the client's configuration cannot work")]
    Limit(#[source] LimitError),
    /// Connecting took longer than [`ClientConfig::connect_timeout`].
    #[error("connecting took longer than {} s", .0.as_secs_f64())]
    Timeout(Duration),
}

/// Why a run did not start.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// The server refused the run with this error (protocol §5).
    #[error("the run was refused: {0}")]
    Refused(ErrorValue),
    /// The server answered with a bare finish: received, not served.
    #[error("the server did not serve the run")]
    NotServed,
    /// The server's answer broke the rules.
    #[error("the server's answer did not decode")]
    Broken(#[source] Undecodable<RunResponseError>),
    /// The server refused the credential: before any frame it closed the
    /// connection as a refusal does (close code 1008 and no reason, no
    /// frame: protocol §3).
    #[error("the server closed the connection without answering (is the credential right?)")]
    CredentialRefused,
    /// As [`RunError::CredentialRefused`], and the authorization carried
    /// no credential (an empty one): the server wants one.
    #[error(
        "the server closed the connection without answering: it wants a credential, and none was sent"
    )]
    NoCredential,
    /// The connection ended before the run's answer, otherwise than by a
    /// refusal or a close with a reason: [`Ending`] says how (it broke, the
    /// server sent what cannot be read, this side closed it, …).
    #[error("the connection ended before the run started")]
    ConnectionEnded(#[source] Ending),
    /// The server closed the connection and said why, in the WebSocket
    /// close frame: for instance that it is serving as many connections as
    /// it may. (A refused credential closes with no reason: that is
    /// [`RunError::CredentialRefused`].)
    #[error("the server closed the connection: {reason} (close code {code})")]
    Closed {
        /// The WebSocket close code (1013: try again later).
        code: u16,
        /// The server's words.
        reason: String,
    },
    /// The request could not be encoded.
    #[error("the request could not be encoded: {0}")]
    Encode(String),
}

/// Stops a run whose caller stopped waiting for its id (the future of
/// [`Client::start`] dropped by a timeout, a `select!`, an aborted task), so
/// that a run nobody holds does not keep a container for the life of the
/// connection.
struct Waiting<'a> {
    shared: &'a Shared,
    scope: u32,
    armed: bool,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.shared.stop(self.scope);
        }
    }
}

/// A connection to a provider server. Cheap to clone; the connection closes
/// when the last clone, [`Run`] and [`RunLoop`] are gone, or on [`close`](Self::close).
#[derive(Debug, Clone)]
pub struct Client {
    connection: Arc<Connection>,
}

impl Client {
    /// Connects to `url` (`ws://host:port`, or `wss://` for TLS) and
    /// authorizes with `credential`.
    pub async fn connect(url: &str, credential: &str) -> Result<Client, ConnectError> {
        Client::connect_with(url, credential, ClientConfig::default()).await
    }

    /// Connects with a configuration.
    pub async fn connect_with(
        url: &str,
        credential: &str,
        config: ClientConfig,
    ) -> Result<Client, ConnectError> {
        config.limits.validate().map_err(ConnectError::Limit)?;
        let opening = async {
            let (ws, _response) =
                transport::dial(url, config.tls.as_ref(), config.limits.websocket())
                    .await
                    .map_err(ConnectError::Dial)?;
            let (mut sink, stream) = ws.split();
            // Authorization first: nothing precedes it (protocol §3).
            let authorization = Authorization::Unbrokered(credential);
            let mut payload = Vec::new();
            let Ok(()) = authorization.encode_to(&mut payload);
            let message = frame::to_message(&ClientFrame::Authorization { payload: &payload });
            if let Some(tap) = &config.tap {
                tap(Role::Client, &message);
            }
            sink.send(Message::Binary(message.into()))
                .await
                .map_err(ConnectError::Authorization)?;
            Ok((sink, stream))
        };
        let (sink, stream) = match config.connect_timeout {
            Some(limit) => tokio::time::timeout(limit, opening)
                .await
                .map_err(|_| ConnectError::Timeout(limit))??,
            None => opening.await?,
        };

        let writer_done = CancellationToken::new();
        let tap = config.tap.clone().map(|tap| (tap, Role::Client));
        let (queue, queued) = writer::outlet(Box::pin(sink), None, tap, None, writer_done.clone());
        let close = CancellationToken::new();
        let shared = Arc::new(Shared::new(queue, config.limits, !credential.is_empty()));
        let writer = tokio::spawn({
            let close = close.clone();
            let done = writer_done.clone();
            async move {
                if let Err(error) = write_frames(queued, close).await {
                    debug!(%error, "writing to the server failed");
                }
                done.cancel();
            }
        });
        tokio::spawn(connection::serve(
            Arc::clone(&shared),
            stream,
            config.tap,
            close.clone(),
            (writer, writer_done),
        ));
        Ok(Client {
            connection: Arc::new(Connection { shared, close }),
        })
    }

    fn shared(&self) -> &Shared {
        &self.connection.shared
    }

    /// Opens a run (`containers::agents::run`) and waits for its id.
    pub async fn start(&self, request: RunRequest) -> Result<Run, RunError> {
        let shared = self.shared();
        let mut payload = Vec::new();
        EndpointRequest::AgentsRun(Box::new(request))
            .encode_to(&mut payload)
            .map_err(|e| RunError::Encode(e.to_string()))?;
        let (started_tx, started) = oneshot::channel();
        let ended = CancellationToken::new();
        let scope = shared.request(&payload, started_tx, ended.clone())?;
        let mut waiting = Waiting {
            shared,
            scope,
            armed: true,
        };
        let started = started.await;
        // Answered: a run comes back (whose handles stop it when dropped),
        // or the scope has ended already.
        waiting.armed = false;
        match started {
            Ok(Started::Id(id)) => Ok(Run::new(Arc::clone(&self.connection), scope, id, ended)),
            Ok(Started::Refused(error)) => Err(RunError::Refused(error)),
            Ok(Started::NotServed) => Err(RunError::NotServed),
            Ok(Started::Broken(why)) => Err(RunError::Broken(why.into())),
            Err(_) => Err(shared.ended()),
        }
    }

    /// Whether the connection is over.
    pub fn is_closed(&self) -> bool {
        self.shared().is_closed()
    }

    /// Resolves when the connection is over.
    pub async fn closed(&self) {
        self.shared().closed().await;
    }

    /// Closes the connection: every open run and loop ends as `Broken`
    /// (on the server, every run ends). Resolves when it is closed: the
    /// close handshake is done (the server answered), or the server did not
    /// answer within a grace of 2 s and the socket was let go.
    ///
    /// Dropping the last handle closes the same way, but cannot wait: the
    /// handshake goes on in the client's tasks, and completes only if the
    /// runtime keeps running for it (a program that returns from `main`
    /// right after the drop may cut it short, and the server then sees a
    /// connection that broke). A caller that is done should call `close`.
    pub async fn close(&self) {
        self.connection.close.cancel();
        self.closed().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_configuration_that_cannot_work_is_refused_before_connecting() {
        let config = ClientConfig {
            limits: Limits {
                max_queued_responses: 0,
                ..Limits::default()
            },
            ..ClientConfig::default()
        };
        // Nothing listens on port 1: only a refusal up front avoids the dial.
        match Client::connect_with("ws://127.0.0.1:1", "", config).await {
            Err(ConnectError::Limit(error)) => {
                assert_eq!(error.limit, runloop_wire::limits::Limit::MaxQueuedResponses);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_broken_answer_leaves_its_decode_error_to_the_source() {
        let error = RunError::Broken(RunResponseError::UnknownTag(7).into());
        runloop_testkit::errors::assert_own_words_and_cause(
            &error,
            "the server's answer did not decode",
            "unknown run response tag 7",
        );
        assert_eq!(
            runloop_proto::error_chain::Chain(&error).to_string(),
            "the server's answer did not decode: unknown run response tag 7"
        );
    }

    #[test]
    fn no_connect_or_run_error_says_its_cause_twice() {
        use std::error::Error;

        let limit = runloop_wire::limits::Limit::MaxQueuedResponses
            .check(0)
            .expect_err("below the minimum");
        let violation = runloop_proto::connection::Violation::Rejected(
            runloop_proto::authorization::AuthorizationError::UnknownMode(7),
        );
        let ended = RunError::ConnectionEnded(Ending::Violation(violation.clone()));
        let errors: [&(dyn Error + 'static); 7] = [
            &ConnectError::Dial(DialError::Tcp {
                host: "127.0.0.1".into(),
                port: 1,
                source: std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
            }),
            &ConnectError::Authorization(WsError::ConnectionClosed),
            &ConnectError::Limit(limit),
            &RunError::Broken(RunResponseError::UnknownTag(7).into()),
            &ended,
            &Ending::Violation(violation),
            &RunError::ConnectionEnded(Ending::Broke("reset".into())),
        ];
        for error in errors {
            runloop_testkit::errors::assert_cause_said_once(error);
        }
        assert_eq!(
            runloop_proto::error_chain::Chain(&ended).to_string(),
            "the connection ended before the run started: the server broke the protocol, and \
             this client ended the connection: the authorization is rejected: unknown \
             authorization mode 7"
        );
    }
}
