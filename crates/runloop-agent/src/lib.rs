//! The agent-program contract: what lets a Rust program *be* the HTTP server
//! a proxy calls (protocol §10), so that writing an agent is writing a function
//! from a prompt to a stream of chunks.
//!
//! ```text
//! proxy ──POST /register {"agent":…}──▶ AgentServer ──▶ Agent::register ──▶ 204 | refusal
//! proxy ──POST /run {"prompt":…}──────▶ AgentServer ──▶ Agent::run_loop ──▶ stream of chunks
//!       ◀── 200 text/event-stream: one `data:` line per chunk, then the end
//! ```
//!
//! Why it looks this way:
//!
//! - **Three endings, three types.** A loop that finishes is a stream that
//!   ends. A loop that never runs is a [`Refusal`] (a non-2xx status and a
//!   body; the caller gets it as `{"kind":"agent","status":N,"error":<body>}`). A loop that dies after
//!   it has said something yields a [`Break`], which breaks the HTTP body
//!   (no terminating chunk), so the proxy reports a cut stream instead of a
//!   finished loop. A loop that fails *as a loop* says so with a fatal
//!   notification chunk and ends.
//! - **Chunks are typed.** The agent yields [`AgenticLoopChunk`]s and this
//!   module writes their JSON, so an agent cannot put a malformed chunk
//!   on the wire.
//! - **Large chunks may come as pieces of JSON.** An agent whose chunks are
//!   large (an image, a file) or already JSON can override
//!   [`Agent::run_loop_json`] and yield each chunk as a [`ChunkJson`]: a
//!   list of [`Bytes`] that together are the chunk's compact JSON. Each
//!   large piece goes to hyper as a body frame of its own, never copied, so
//!   a chunk made of slices of one shared buffer costs the loop a few
//!   handles while it waits for a slow reader, not the chunk's size. The
//!   pieces must hold no line break: the chunk is one `data:` line
//!   (protocol §10).
//! - **Shutdown breaks streams.** When the server shuts down, a loop in
//!   progress is broken, not ended: ending it would read as "finished".
//!
//! [`demo::Demo`] is an agent built on this contract.

pub mod demo;

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::HeaderValue;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::serve::ListenerExt;
use bytes::BytesMut;
use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use futures_util::stream::{self, BoxStream};
use runloop_proto::error_chain::Chain;
use runloop_proto::registration::RegistrationAsk;
use runloop_proto::run_loop::{AgenticLoopChunk, RunLoopRequest};
use runloop_proto::{Decode, ErrorKind};
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// The HTTP status of a [`Refusal`], re-exported so that an agent needs no
/// HTTP crate of its own.
pub use axum::http::StatusCode;

/// The agent program's port when `$PORT` is unset or not a port (protocol §10).
pub const DEFAULT_PORT: u16 = 8080;

/// The largest request body the agent program reads: the proxy's default
/// bound on an ask, so any ask the proxy takes reaches the agent.
pub const MAX_REQUEST: usize = 16 << 20;

/// A loop in progress: chunks, or a [`Break`] that cuts the stream.
pub type ChunkStream = BoxStream<'static, Result<AgenticLoopChunk, Break>>;

/// A loop in progress as the wire sees it: each chunk's JSON, or a
/// [`Break`] that cuts the stream.
pub type ChunkJsonStream = BoxStream<'static, Result<ChunkJson, Break>>;

/// One chunk's compact JSON, in pieces: the event's `data:` line is the
/// pieces one after the other.
///
/// A piece is any [`Bytes`], so it can be a slice of a buffer the agent
/// keeps anyway (a `static` table, a file it has read, an image it
/// encoded) and costs the loop no copy. No piece holds `\r` or `\n`: a
/// line break would end the `data:` line, and the chunk with it
/// (protocol §10). The JSON itself is not checked, here or on the way:
/// the proxy and the server pass chunks on unread, so a chunk that does
/// not parse (protocol §8) reaches the caller as it is, and the caller's
/// decoder refuses it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChunkJson {
    pieces: Vec<Bytes>,
}

/// A piece of chunk JSON that holds a line break, refused by
/// [`ChunkJson::from_pieces`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("piece {piece} of a chunk's JSON holds a line break at byte {at}")]
pub struct LineBreak {
    /// The index of the piece, from 0.
    pub piece: usize,
    /// Where in that piece the first `\r` or `\n` is.
    pub at: usize,
}

impl ChunkJson {
    /// A chunk's JSON as `pieces`, in order; refused if a piece holds a
    /// line break. Empty pieces are dropped.
    pub fn from_pieces(pieces: impl IntoIterator<Item = Bytes>) -> Result<ChunkJson, LineBreak> {
        let mut kept = Vec::new();
        for (piece, bytes) in pieces.into_iter().enumerate() {
            if let Some(at) = memchr::memchr2(b'\r', b'\n', &bytes) {
                return Err(LineBreak { piece, at });
            }
            if !bytes.is_empty() {
                kept.push(bytes);
            }
        }
        Ok(ChunkJson { pieces: kept })
    }

    /// A typed chunk's JSON, in one piece: the bytes an agent's
    /// [`run_loop`](Agent::run_loop) chunk is sent as.
    pub fn from_chunk(chunk: &AgenticLoopChunk) -> serde_json::Result<ChunkJson> {
        // Compact JSON escapes every control character inside strings and
        // puts no whitespace between tokens: there is no line break to find.
        let json = serde_json::to_vec(chunk)?;
        Ok(ChunkJson {
            pieces: vec![Bytes::from(json)],
        })
    }

    /// Pieces the caller knows hold no line break (checked in debug builds).
    pub(crate) fn from_pieces_unchecked(pieces: Vec<Bytes>) -> ChunkJson {
        debug_assert!(
            pieces
                .iter()
                .all(|piece| memchr::memchr2(b'\r', b'\n', piece).is_none())
        );
        ChunkJson { pieces }
    }

    /// The pieces, in order.
    pub fn pieces(&self) -> &[Bytes] {
        &self.pieces
    }

    /// The pieces, given up.
    pub fn into_pieces(self) -> Vec<Bytes> {
        self.pieces
    }

    /// The JSON's length in bytes: the pieces' lengths summed.
    pub fn len(&self) -> usize {
        self.pieces.iter().map(Bytes::len).sum()
    }

    /// Whether there are no bytes at all (not JSON, so not a chunk).
    pub fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }
}

/// The JSON of every chunk of `chunks`, as [`Agent::run_loop_json`]
/// sends a typed loop; a chunk that does not serialize breaks the loop.
pub fn serialized(chunks: ChunkStream) -> ChunkJsonStream {
    chunks
        .map(|item| {
            item.and_then(|chunk| {
                ChunkJson::from_chunk(&chunk)
                    .map_err(|error| Break::with_source("a chunk did not serialize", error))
            })
        })
        .boxed()
}

/// Why a loop stops mid-way without finishing. Yielding it breaks the SSE
/// stream; the proxy turns that into the loop's final error. The error
/// underneath, if there is one, is its source and not in its message.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct Break {
    message: String,
    #[source]
    source: Option<Arc<dyn std::error::Error + Send + Sync>>,
}

impl Break {
    /// A break for the reason `message` says.
    pub fn new(message: impl Into<String>) -> Self {
        Break {
            message: message.into(),
            source: None,
        }
    }

    /// A break while doing `what`, because of `source`: the message is
    /// `what`, and `source` says why.
    pub fn with_source(
        what: impl fmt::Display,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Break {
            message: what.to_string(),
            source: Some(Arc::new(source)),
        }
    }
}

/// Two breaks are the same when they say the same, and so do their
/// sources.
impl PartialEq for Break {
    fn eq(&self, other: &Self) -> bool {
        let said = |source: &Option<Arc<dyn std::error::Error + Send + Sync>>| {
            source.as_ref().map(ToString::to_string)
        };
        self.message == other.message && said(&self.source) == said(&other.source)
    }
}

impl Eq for Break {}

/// A loop or a registration refused before it started: a non-2xx status
/// and a body. The proxy wraps it as `{"kind":"agent","status":N,"error":…}`,
/// a JSON body as its value and any other body as text, so an agent never
/// speaks as the server (protocol §12).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    status: StatusCode,
    body: Bytes,
    json: bool,
}

impl Refusal {
    /// A refusal whose body is `body` as JSON.
    pub fn json(status: StatusCode, body: &Value) -> Refusal {
        Refusal {
            status,
            body: Bytes::from(body.to_string()),
            json: true,
        }
    }

    /// A refusal whose body is plain text.
    pub fn text(status: StatusCode, body: impl Into<String>) -> Refusal {
        Refusal {
            status,
            body: Bytes::from(body.into()),
            json: false,
        }
    }

    /// The status; one that is not an error is sent as 500.
    pub fn status(&self) -> StatusCode {
        if self.status.is_client_error() || self.status.is_server_error() {
            self.status
        } else {
            StatusCode::INTERNAL_SERVER_ERROR
        }
    }

    /// The body.
    pub fn body(&self) -> &[u8] {
        &self.body
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let content_type = if self.json {
            "application/json"
        } else {
            "text/plain; charset=utf-8"
        };
        (
            self.status(),
            [(CONTENT_TYPE, HeaderValue::from_static(content_type))],
            self.body,
        )
            .into_response()
    }
}

/// An agent: what the agent program does with a registration and a loop.
pub trait Agent: Send + Sync + 'static {
    /// The server's registration: the `agent` value of the run request,
    /// as the caller sent it.
    fn register(&self, agent: Value) -> BoxFuture<'_, Result<(), Refusal>>;

    /// One loop. Resolves when the loop has started (its stream) or was
    /// refused; the stream's end is the loop's end.
    fn run_loop(
        &self,
        request: RunLoopRequest<'static>,
    ) -> BoxFuture<'_, Result<ChunkStream, Refusal>>;

    /// One loop as the JSON of its chunks: what [`AgentServer`] sends.
    /// By default, [`run_loop`](Agent::run_loop)'s chunks
    /// [`serialized`]. An agent whose chunks are large or already JSON
    /// overrides it to give them as [`ChunkJson`] pieces that are not
    /// copied on their way out; `run_loop` should then still yield the
    /// same chunks, typed, for whoever calls it directly.
    fn run_loop_json(
        &self,
        request: RunLoopRequest<'static>,
    ) -> BoxFuture<'_, Result<ChunkJsonStream, Refusal>> {
        let chunks = self.run_loop(request);
        Box::pin(async move { chunks.await.map(serialized) })
    }
}

/// The port in `$PORT`, or [`DEFAULT_PORT`].
pub fn port_from_env() -> u16 {
    port_from(std::env::var("PORT").ok().as_deref())
}

/// The port a `$PORT` value names: a number in 1..=65535, else
/// [`DEFAULT_PORT`].
pub fn port_from(value: Option<&str>) -> u16 {
    value
        .and_then(|value| value.parse::<u16>().ok())
        .filter(|&port| port != 0)
        .unwrap_or(DEFAULT_PORT)
}

#[derive(Clone)]
struct Shared {
    agent: Arc<dyn Agent>,
    shutdown: CancellationToken,
}

/// An agent program bound to its listening socket, ready to
/// [`serve`](AgentServer::serve) an [`Agent`].
pub struct AgentServer {
    listener: TcpListener,
    addr: SocketAddr,
    agent: Arc<dyn Agent>,
    shutdown: CancellationToken,
}

impl fmt::Debug for AgentServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AgentServer")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

/// Controls an agent program from elsewhere: its address and its shutdown.
#[derive(Debug, Clone)]
pub struct AgentHandle {
    addr: SocketAddr,
    shutdown: CancellationToken,
}

impl AgentServer {
    /// Binds `addr` for `agent`.
    pub async fn bind(addr: SocketAddr, agent: Arc<dyn Agent>) -> io::Result<AgentServer> {
        AgentServer::new(TcpListener::bind(addr).await?, agent)
    }

    /// An agent program on a listener that is already bound.
    pub fn new(listener: TcpListener, agent: Arc<dyn Agent>) -> io::Result<AgentServer> {
        Ok(AgentServer {
            addr: listener.local_addr()?,
            listener,
            agent,
            shutdown: CancellationToken::new(),
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// A handle for shutting it down.
    pub fn handle(&self) -> AgentHandle {
        AgentHandle {
            addr: self.addr,
            shutdown: self.shutdown.clone(),
        }
    }

    /// Serves the agent until [`AgentHandle::shutdown`]; a loop still
    /// running then is broken, and the call returns once every connection
    /// is done.
    pub async fn serve(self) -> io::Result<()> {
        let AgentServer {
            listener,
            addr,
            agent,
            shutdown,
        } = self;
        info!(listen = %addr, "agent program up");
        let router = Router::new()
            .route("/register", post(register))
            .route("/run", post(run_loop))
            .layer(DefaultBodyLimit::max(MAX_REQUEST))
            .with_state(Shared {
                agent,
                shutdown: shutdown.clone(),
            });
        // Each SSE event is a small write of its own: Nagle would hold it for
        // the proxy's delayed ACK.
        let listener = listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        axum::serve(listener, router)
            .with_graceful_shutdown(shutdown.cancelled_owned())
            .await?;
        info!("agent program down");
        Ok(())
    }

    /// Spawns [`serve`](Self::serve) on the current runtime.
    pub fn spawn(self) -> (AgentHandle, JoinHandle<io::Result<()>>) {
        (self.handle(), tokio::spawn(self.serve()))
    }
}

impl AgentHandle {
    /// The agent program's address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The agent program's `http://` base URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Starts a graceful shutdown; [`AgentServer::serve`] returns when it
    /// is done.
    pub fn shutdown(&self) {
        self.shutdown.cancel();
    }
}

/// The agent program's own error body, `{"kind":"agent","error":…}`.
fn bad_request(what: String) -> Refusal {
    Refusal::json(
        StatusCode::BAD_REQUEST,
        runloop_proto::ErrorValue::kind(ErrorKind::Agent, what).value(),
    )
}

async fn register(State(shared): State<Shared>, body: Bytes) -> Response {
    let agent = RegistrationAsk::decode(&body)
        .map_err(|error| error.to_string())
        .and_then(|ask| {
            serde_json::from_str::<Value>(ask.agent().get()).map_err(|error| error.to_string())
        });
    let agent = match agent {
        Ok(agent) => agent,
        Err(why) => {
            return bad_request(format!("the registration did not parse: {why}")).into_response();
        }
    };
    match shared.agent.register(agent).await {
        Ok(()) => {
            info!("registered");
            StatusCode::NO_CONTENT.into_response()
        }
        Err(refusal) => {
            warn!(status = %refusal.status(), "registration refused");
            refusal.into_response()
        }
    }
}

async fn run_loop(State(shared): State<Shared>, body: Bytes) -> Response {
    let request = match RunLoopRequest::decode(&body) {
        Ok(request) => request.into_owned(),
        Err(error) => {
            return bad_request(format!("the run-loop request did not parse: {error}"))
                .into_response();
        }
    };
    let chunks = match shared.agent.run_loop_json(request).await {
        Ok(chunks) => chunks,
        Err(refusal) => {
            warn!(status = %refusal.status(), "loop refused");
            return refusal.into_response();
        }
    };
    info!("loop started");
    let headers = [
        (CONTENT_TYPE, HeaderValue::from_static("text/event-stream")),
        (CACHE_CONTROL, HeaderValue::from_static("no-cache")),
    ];
    (headers, Body::from_stream(events(chunks, shared.shutdown))).into_response()
}

/// A piece of chunk JSON up to this size is copied into its event's
/// frame; a larger one is a body frame of its own. A small chunk is then
/// one frame, as one write costs less than several; a large one is never
/// copied.
const COPIED_PIECE: usize = 4 << 10;

/// The chunks as SSE events, written into the body frames that hyper sends
/// with each large piece of a chunk's JSON a frame of its own (a chunk of
/// many MiB is not copied on its way out); broken if the server shuts down
/// first.
fn events(
    chunks: ChunkJsonStream,
    shutdown: CancellationToken,
) -> impl futures_util::Stream<Item = Result<Bytes, Break>> + Send {
    let frames = Vec::new().into_iter();
    stream::unfold(Some((chunks, shutdown, frames)), |state| async move {
        let (mut chunks, shutdown, mut frames) = state?;
        // The rest of a chunk's event, unless the server shuts down first.
        if !frames.as_slice().is_empty() && !shutdown.is_cancelled() {
            let frame = frames.next().map(Ok)?;
            return Some((frame, Some((chunks, shutdown, frames))));
        }
        let item = tokio::select! {
            biased;
            () = shutdown.cancelled() => {
                Err(Break::new("the agent program is shutting down"))
            }
            item = chunks.next() => match item {
                Some(item) => item,
                None => {
                    info!("loop finished");
                    return None;
                }
            },
        };
        match item {
            Ok(json) => {
                let mut frames = event(json).into_iter();
                let frame = frames.next().map(Ok)?;
                Some((frame, Some((chunks, shutdown, frames))))
            }
            Err(why) => {
                // hyper drops the body bytes it has buffered but not yet
                // written when the body fails. Yielding once first lets it
                // flush them, so the chunks before a break reach the proxy
                // (best effort: bytes the socket cannot take yet are still
                // lost with the break).
                tokio::task::yield_now().await;
                warn!(why = %Chain(&why), "loop broken");
                // After a break, nothing more is read: the body ends broken.
                Some((Err(why), None))
            }
        }
    })
}

/// One SSE event as body frames: `data: `, the chunk's JSON, and the blank
/// line that ends it. Small pieces are copied together into a frame; a
/// piece larger than [`COPIED_PIECE`] is a frame as it is.
fn event(json: ChunkJson) -> Vec<Bytes> {
    let pieces = json.into_pieces();
    let copied: usize = pieces
        .iter()
        .map(Bytes::len)
        .filter(|&len| len <= COPIED_PIECE)
        .sum();
    let mut frames = Vec::new();
    let mut small = BytesMut::with_capacity(copied.min(2 * COPIED_PIECE) + 8);
    small.extend_from_slice(b"data: ");
    for piece in pieces {
        if piece.len() <= COPIED_PIECE {
            small.extend_from_slice(&piece);
            if small.len() >= COPIED_PIECE {
                frames.push(small.split().freeze());
            }
        } else {
            if !small.is_empty() {
                frames.push(small.split().freeze());
            }
            frames.push(piece);
        }
    }
    small.extend_from_slice(b"\n\n");
    frames.push(small.freeze());
    frames
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports() {
        assert_eq!(port_from(None), 8080);
        assert_eq!(port_from(Some("9001")), 9001);
        assert_eq!(port_from(Some("65535")), 65535);
        for bad in ["", "0", "65536", "-1", "80a", " 80", "http"] {
            assert_eq!(port_from(Some(bad)), 8080, "{bad:?}");
        }
    }

    #[test]
    fn chunk_json_refuses_a_line_break() {
        let piece = |text: &'static str| Bytes::from_static(text.as_bytes());
        assert_eq!(
            ChunkJson::from_pieces([piece(r#"{"type":"#), piece("\"user\",\n")]),
            Err(LineBreak { piece: 1, at: 7 })
        );
        let refused = ChunkJson::from_pieces([piece("\r")]).expect_err("refused");
        assert_eq!(refused, LineBreak { piece: 0, at: 0 });
        assert_eq!(
            refused.to_string(),
            "piece 0 of a chunk's JSON holds a line break at byte 0"
        );
        // An escaped line break is JSON's, not the event's.
        let json = ChunkJson::from_pieces([
            piece(r#"{"type":"user","#),
            piece(""),
            piece(r#""prompt":"a\nb"}"#),
        ])
        .expect("no line break");
        assert_eq!(json.pieces().len(), 2);
        assert_eq!(json.len(), 31);
        assert!(!json.is_empty());
        assert!(
            ChunkJson::from_pieces([piece("")])
                .expect("empty")
                .is_empty()
        );
    }

    #[test]
    fn a_typed_chunk_is_one_frame_as_before() {
        let chunk = AgenticLoopChunk::User(runloop_proto::run_loop::UserChunk {
            prompt: "line one\nline two".to_owned(),
            meta: None,
        });
        let frames = event(ChunkJson::from_chunk(&chunk).expect("serializes"));
        let mut expected = b"data: ".to_vec();
        serde_json::to_writer(&mut expected, &chunk).expect("serializes");
        expected.extend_from_slice(b"\n\n");
        assert_eq!(frames, [Bytes::from(expected)]);
    }

    #[test]
    fn a_large_piece_is_a_frame_of_its_own_and_small_ones_are_copied_together() {
        let large = Bytes::from(vec![b'a'; COPIED_PIECE + 1]);
        let json = ChunkJson::from_pieces([
            Bytes::from_static(br#"{"type":"user","prompt":""#),
            large.clone(),
            Bytes::from_static(b"b"),
            Bytes::from_static(br#""}"#),
        ])
        .expect("no line break");
        let frames = event(json);
        assert_eq!(frames.len(), 3);
        assert_eq!(&frames[0][..], br#"data: {"type":"user","prompt":""#);
        assert_eq!(frames[1].as_ptr(), large.as_ptr(), "not copied");
        assert_eq!(&frames[2][..], b"b\"}\n\n");
        // Many small pieces make frames of a bounded size.
        let small = Bytes::from(vec![b'a'; COPIED_PIECE]);
        let frames = event(ChunkJson::from_pieces(vec![small; 10]).expect("no line break"));
        assert_eq!(frames.concat().len(), 10 * COPIED_PIECE + 8);
        assert!(
            frames
                .iter()
                .all(|frame| frame.len() <= 2 * COPIED_PIECE + 8)
        );
    }

    #[test]
    fn refusals_are_errors() {
        let refusal = Refusal::text(StatusCode::OK, "no");
        assert_eq!(refusal.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let refusal = Refusal::json(StatusCode::CONFLICT, &serde_json::json!({"a": 1}));
        assert_eq!(refusal.status(), StatusCode::CONFLICT);
        assert_eq!(refusal.body(), br#"{"a":1}"#);
    }

    #[test]
    fn a_break_leaves_what_broke_it_to_its_source() {
        let cause = || std::io::Error::other("disk gone");
        let broke = Break::with_source("a chunk did not serialize", cause());
        runloop_testkit::errors::assert_own_words_and_cause(
            &broke,
            "a chunk did not serialize",
            "disk gone",
        );
        assert_eq!(
            runloop_proto::error_chain::Chain(&broke).to_string(),
            "a chunk did not serialize: disk gone"
        );
        assert!(std::error::Error::source(&Break::new("plain")).is_none());
        assert_eq!(Break::new("same"), Break::new("same"));
        assert_eq!(
            broke,
            Break::with_source("a chunk did not serialize", cause())
        );
        let other = Break::with_source("a chunk did not serialize", std::io::Error::other("gone"));
        assert_ne!(broke, other, "the sources differ");
        assert_ne!(broke, Break::new("a chunk did not serialize"));
    }
}
