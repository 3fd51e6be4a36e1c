//! The proxy: the WebSocket server a provider places beside an agent's
//! entrypoint, which turns the server's `/agent/*` paths into HTTP calls on
//! the agent program (protocol §10).
//!
//! ```text
//! server ──ws /agent/register, {"agent":…}──▶ proxy ──POST /register──▶ agent program
//!        ◀──────── [0] or [1][error], close ─────
//! server ──ws /agent/run, {"prompt":…}──────▶ proxy ──POST /run───────▶ agent program
//!        ◀── [0][data]… ([1][error])?, close ──── ◀── SSE data: …
//! ```
//!
//! Messages on these paths are bare: no 9-byte header. The first binary
//! message is the ask; the answer ends with a clean close, so an abrupt end
//! always reads as a failed exchange.
//!
//! Why it is built this way:
//!
//! - **Bytes pass through unread.** The ask goes to the agent program as it
//!   came, and each SSE `data` goes to the server as `[0]` and those bytes:
//!   the proxy checks the ask's shape (a bad ask gets a clear error instead
//!   of an agent program's puzzled 400) and never parses a chunk. A chunk's
//!   message is made where its event's data is read into (the tag goes in
//!   that buffer first), and goes on the path's lane behind the frame's
//!   head: every frame one read of the body gave goes out in one write.
//! - **One read, one write, one task.** The agent program's body is read
//!   by the task that sends its events (the proxy's own HTTP/1.1 client,
//!   no connection task between), and in the server's process the server's
//!   relay is that task: the path is in process, with no socket
//!   ([`LocalProxy`], protocol §12 "In-process paths"); the rules below
//!   hold on both, written once.
//! - **A loop holds 64 KiB of a chunk, whatever its size** (and one read
//!   of the body beside it). An event whose data is
//!   done within 64 KiB goes out as one message, one frame. A larger one
//!   goes out as it arrives, as the fragments of one message (RFC 6455,
//!   section 5.4): `[0]` and its first 64 KiB, then 64 KiB at a time, the last
//!   fragment when the event ends. The server still gets one message of
//!   exactly `[0]` and the data; the proxy never holds the event whole.
//! - **A fault inside a fragmented chunk drops the path.** Once a first
//!   fragment is out, no `[1]` error can follow (no other message may come
//!   before the fragmented one ends), and a close would read as a finished
//!   loop with its last chunk lost. So whatever goes wrong before the last
//!   fragment is logged with its reason and the connection is dropped with
//!   no close frame: the server reports a loop cut short with its own error
//!   (protocol §12, "abrupt proxy end"). Before the first fragment, a fault
//!   is an `[1]` error and a clean close, as ever.
//! - **One loop at a time, one registration per life**, as two small claims
//!   on shared state that release themselves when dropped (state.rs).
//! - **Cancellation follows the server.** While a loop runs the proxy keeps
//!   reading the path; when the server closes it, the HTTP request to the
//!   agent program is dropped, which closes its connection: the agent
//!   program sees its client leave.
//! - **Every close is a handshake.** The proxy ends an answer with its close
//!   frame and waits for the server's; it answers a close the server starts.
//!   Either way the log stays silent, so "broke" in it means something
//!   broke.
//! - **Backpressure, not buffers.** The event stream is read only after
//!   the previous chunk, or fragment, was written to the path, so a slow
//!   server slows the agent program instead of filling the proxy's memory;
//!   the ask, each event and each error body have a bound
//!   ([`ProxyConfig`]).
//! - **Shutdown is honest.** A loop cut by the proxy's shutdown ends with
//!   an error and a clean close, never with a close alone that would read as
//!   "finished" (inside a fragmented chunk, the path is dropped instead).
//!
//! The pieces, in the order a chunk meets them:
//!
//! ```text
//! dial.rs       how a call's connection is made: to an address, or by the
//!               runtime inside the run's network namespace
//! http1.rs      the proxy's HTTP/1.1 client: a call on its own connection,
//!               the body read and unframed in the proxy's own buffer
//! upstream.rs   the agent program over HTTP: POST /register, POST /run,
//!               and the error value each failure becomes
//! sse.rs        the /run body read as an event stream, bounded, UTF-8 checked,
//!               each event's data whole or, past 64 KiB, in pieces
//! run.rs        the loop, one [0] message per event, fragmented when the
//!               event came in pieces; the /agent/run path on a WebSocket
//! local.rs      the in-process path: the loop driven by the server's relay
//! handshake.rs  the upgrade that picks the path, or a 503 with the reason
//! path.rs       one exchange on a path: the ask, the server leaving, the
//!               end
//! register.rs   the /agent/register path: one [0] or [1][error]
//! state.rs      the claims: one registration per life, one loop at a time
//! lib.rs        the listener: each connection to its path
//! ```

mod dial;
mod handshake;
mod http1;
mod local;
mod path;
mod register;
mod run;
mod sse;
mod state;
mod upstream;

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info};

pub use self::dial::{Dial, Dialing};
pub use self::local::{LocalProxy, LocalRun, PathEvent};

use self::handshake::Path;
use self::state::State;
use self::upstream::Upstream;
use runloop_metrics::ProxyMetrics;
use runloop_wire::listener;

/// The proxy's port (protocol §10).
pub const DEFAULT_PORT: u16 = 14979;

/// Where a standalone proxy listens: every interface, port 14979.
pub const DEFAULT_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::UNSPECIFIED), DEFAULT_PORT);

/// The proxy's bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProxyConfig {
    /// The largest ask (and any message) the server may send on a path.
    pub max_ask: usize,
    /// The largest SSE event the agent program may send, counted in stream
    /// bytes from the end of the blank line before it (comments and other
    /// fields count too). Only 64 KiB of it is held at a time.
    pub max_event: usize,
    /// The most of a non-2xx body that is kept for the error.
    pub max_error_body: usize,
    /// How long a connection may wait for its request's first byte (then
    /// it is answered `503`), and then take to finish its WebSocket
    /// handshake.
    pub handshake_timeout: Duration,
    /// How long the end of an answer (its last message and the close
    /// handshake) may take, even while the proxy shuts down.
    pub close_timeout: Duration,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            max_ask: 16 << 20,
            max_event: 16 << 20,
            max_error_body: 64 << 10,
            handshake_timeout: Duration::from_secs(10),
            close_timeout: Duration::from_secs(10),
        }
    }
}

/// A proxy bound to its listening socket, ready to [`serve`](Proxy::serve).
#[derive(Debug)]
pub struct Proxy {
    listener: TcpListener,
    addr: SocketAddr,
    shutdown: CancellationToken,
    /// What its paths share, the in-process ones ([`Proxy::local`])
    /// included.
    shared: Arc<Shared>,
}

/// How the agent program ended, in words (`exit status 3`), once it has:
/// told by the runtime that started it, which alone can know. A loop whose
/// body breaks, or a call the program never answered, says this instead of
/// the HTTP client's words about a connection.
pub type AgentEnd = watch::Receiver<Option<String>>;

/// Controls a proxy from elsewhere: its address and its shutdown; an admin
/// listener watches it too ([`Watched`](runloop_metrics::admin::Watched)).
#[derive(Debug, Clone)]
pub struct ProxyHandle {
    addr: SocketAddr,
    shutdown: CancellationToken,
    metrics: Arc<ProxyMetrics>,
}

impl Proxy {
    /// Binds `listen`; the agent program is where `agent` dials (an
    /// address, or a runtime's [`Dial`] into the run's network
    /// namespace).
    pub async fn bind(listen: SocketAddr, agent: impl Dial) -> io::Result<Proxy> {
        Proxy::new(TcpListener::bind(listen).await?, agent)
    }

    /// A proxy on a listener that is already bound.
    pub fn new(listener: TcpListener, agent: impl Dial) -> io::Result<Proxy> {
        let config = ProxyConfig::default();
        Ok(Proxy {
            addr: listener.local_addr()?,
            listener,
            shutdown: CancellationToken::new(),
            shared: Arc::new(Shared {
                upstream: Upstream::new(Arc::new(agent), config.max_error_body, None),
                config,
                state: State::default(),
                metrics: Arc::new(ProxyMetrics::new()),
            }),
        })
    }

    /// Its shared state anew, as `change` makes it: before it serves.
    fn reshared(mut self, change: impl FnOnce(&mut Upstream, &mut ProxyConfig)) -> Proxy {
        let mut upstream = self.shared.upstream.clone();
        let mut config = self.shared.config;
        change(&mut upstream, &mut config);
        self.shared = Arc::new(Shared {
            upstream,
            config,
            state: State::default(),
            metrics: Arc::clone(&self.shared.metrics),
        });
        self
    }

    /// Watches the agent program's end: a loop cut short by its exit is
    /// reported as `the agent program exited (exit status 3) before its
    /// /run body ended`, a call it never answered as `… before it answered
    /// POST /run`.
    pub fn with_agent_end(self, ended: AgentEnd) -> Proxy {
        self.reshared(|upstream, _| upstream.watch_end(ended))
    }

    /// Replaces the default bounds.
    pub fn with_config(self, config: ProxyConfig) -> Proxy {
        self.reshared(|upstream, bounds| {
            *bounds = config;
            upstream.bound_error_body(config.max_error_body);
        })
    }

    /// The proxy's paths without a socket, for a server in the same
    /// process ([`LocalProxy`]); the same proxy as its listener's, one loop
    /// at a time among them all. Take it once the proxy is configured.
    pub fn local(&self) -> LocalProxy {
        LocalProxy::new(Arc::clone(&self.shared), self.shutdown.clone())
    }

    /// The address the proxy listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The agent program's address, as the program sees it.
    pub fn agent(&self) -> SocketAddr {
        self.shared.upstream.agent()
    }

    /// A handle for shutting the proxy down.
    pub fn handle(&self) -> ProxyHandle {
        ProxyHandle {
            addr: self.addr,
            shutdown: self.shutdown.clone(),
            metrics: Arc::clone(&self.shared.metrics),
        }
    }

    /// Serves paths until [`ProxyHandle::shutdown`], then ends every path
    /// (a running loop gets an error and a clean close) and returns once all
    /// of them are done. (It has no failure of its own left: the result
    /// stays for the callers that await it.)
    pub async fn serve(self) -> io::Result<()> {
        let Proxy {
            listener,
            addr,
            shutdown,
            shared,
        } = self;
        let agent = shared.upstream.dial().to_string();
        let tracker = TaskTracker::new();
        info!(listen = %addr, %agent, "proxy up");
        listener::accept_until(&listener, &shutdown, |tcp, peer| {
            debug!(%peer, "connection");
            tracker.spawn(connection(tcp, Arc::clone(&shared), shutdown.clone()));
        })
        .await;
        drop(listener);
        tracker.close();
        tracker.wait().await;
        info!("proxy down");
        Ok(())
    }

    /// Spawns [`serve`](Self::serve) on the current runtime.
    pub fn spawn(self) -> (ProxyHandle, JoinHandle<io::Result<()>>) {
        (self.handle(), tokio::spawn(self.serve()))
    }
}

impl ProxyHandle {
    /// The proxy's address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The proxy's `ws://` base URL; the paths go after it.
    pub fn url(&self) -> String {
        format!("ws://{}", self.addr)
    }

    /// Starts a graceful shutdown; [`Proxy::serve`] returns when it is done.
    pub fn shutdown(&self) {
        self.shutdown.cancel();
    }
}

/// What every path of one proxy shares.
#[derive(Debug)]
struct Shared {
    upstream: Upstream,
    config: ProxyConfig,
    state: State,
    metrics: Arc<ProxyMetrics>,
}

impl runloop_metrics::admin::Watched for ProxyHandle {
    fn metrics(&self) -> String {
        self.metrics.encode()
    }

    fn ready(&self) -> bool {
        !self.shutdown.is_cancelled()
    }
}

/// Counts a path as open while it lives, on a socket or in process.
struct PathOpen(Arc<ProxyMetrics>);

impl PathOpen {
    fn new(metrics: &Arc<ProxyMetrics>) -> Self {
        metrics.paths.fetch_add(1, Ordering::Relaxed);
        PathOpen(Arc::clone(metrics))
    }
}

impl Drop for PathOpen {
    fn drop(&mut self) {
        self.0.paths.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One connection: the handshake picks the path, the path's task serves it.
async fn connection(stream: TcpStream, shared: Arc<Shared>, shutdown: CancellationToken) {
    let Some((ws, lane, path)) = handshake::accept(stream, &shared.config, &shutdown).await else {
        return;
    };
    let _open = PathOpen::new(&shared.metrics);
    match path {
        Path::Register => register::serve(ws, &shared, &shutdown).await,
        Path::Run => run::serve(ws, lane, &shared, &shutdown).await,
    }
}
