//! Test support: a scripted fake proxy, a server against it, and a raw
//! frame-level client for what the real client would never send.
#![allow(clippy::result_large_err)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use runloop::client::{Event, Run, RunLoop};
use runloop::runtime::{Attach, Catalog};
use runloop::server::{Credentials, Server, ServerConfig, ServerHandle};
use runloop_proto::Decode;
use runloop_proto::frame::{self, ClientFrame, ServerFrame};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::server::{Request, Response};
use tokio_tungstenite::tungstenite::protocol::frame::Frame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// A safety net against a hung test, never an assertion about speed.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// What the fake proxy does on an `/agent/run` path, step by step.
#[derive(Debug, Clone)]
pub enum Step {
    /// Send this message.
    Send(Vec<u8>),
    /// Close the path cleanly and stop.
    Close,
    /// Drop the TCP connection without a close frame and stop.
    Abort,
    /// Wait until the server closes the path; record it.
    AwaitClose,
    /// Send `count` chunk messages of `size` bytes as fast as the path takes
    /// them, counting them in `sent`.
    Flood { count: usize, size: usize },
    /// Refuse with an error first if another scripted loop is running.
    BusyCheck,
    /// Write these bytes on the TCP stream under the WebSocket (not a
    /// WebSocket frame), then drop the connection.
    Garbage(Vec<u8>),
    /// Hang: send nothing more, never close and never answer the server's
    /// close; record `dropped <prompt>` once the server drops the socket.
    Hang,
    /// Send these bytes as one fragment of a binary message: its first
    /// (a binary frame) or a later one (a continuation), its last or not.
    Fragment {
        first: bool,
        last: bool,
        bytes: Vec<u8>,
    },
}

pub use runloop_testkit::message::{chunk, error};

/// A proxy whose `/agent/run` answers follow a script chosen by the prompt.
#[derive(Clone, Default)]
pub struct FakeProxy {
    scripts: Arc<Mutex<HashMap<String, Vec<Step>>>>,
    /// Every event, in order: `register`, `run <prompt>`, `closed <prompt>`.
    pub log: Arc<Mutex<Vec<String>>>,
    pub logged: Arc<Notify>,
    /// Messages sent by floods.
    pub sent: Arc<AtomicU64>,
    running: Arc<AtomicU64>,
    pub addr: Option<SocketAddr>,
    /// Every `/agent/run` ask, as the bytes that came.
    pub asks: Arc<Mutex<Vec<Vec<u8>>>>,
    /// When set, `/agent/register` reads its ask and then never answers.
    pub register_hangs: Arc<std::sync::atomic::AtomicBool>,
    /// When set, `/agent/run` completes the handshake and then reads
    /// nothing at all until `release` fires.
    pub stall_runs: Arc<std::sync::atomic::AtomicBool>,
    /// Ends every stalled path.
    pub release: tokio_util::sync::CancellationToken,
}

impl FakeProxy {
    pub async fn start() -> FakeProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let proxy = FakeProxy {
            addr: Some(listener.local_addr().expect("addr")),
            ..FakeProxy::default()
        };
        let serving = proxy.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let proxy = serving.clone();
                tokio::spawn(async move { proxy.serve(tcp).await });
            }
        });
        proxy
    }

    pub fn url(&self) -> String {
        format!("ws://{}", self.addr.expect("started"))
    }

    pub fn script(&self, prompt: &str, steps: Vec<Step>) {
        self.scripts
            .lock()
            .expect("lock")
            .insert(prompt.to_owned(), steps);
    }

    /// Scripts the prompt `hang`: one chunk, then the path held open until
    /// the server closes it.
    pub fn script_hang(&self) {
        self.script("hang", vec![Step::Send(chunk("a")), Step::AwaitClose]);
    }

    fn record(&self, event: String) {
        self.log.lock().expect("lock").push(event);
        self.logged.notify_waiters();
    }

    pub fn events(&self) -> Vec<String> {
        self.log.lock().expect("lock").clone()
    }

    /// Waits until `event` is in the log.
    pub async fn wait_for(&self, event: &str) {
        let wait = async {
            loop {
                let notified = self.logged.notified();
                if self.events().iter().any(|e| e == event) {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout(PATIENCE, wait)
            .await
            .unwrap_or_else(|_| panic!("{event:?} never happened; log: {:?}", self.events()));
    }

    async fn serve(&self, tcp: TcpStream) {
        let path = Arc::new(Mutex::new(String::new()));
        let seen = Arc::clone(&path);
        let callback = move |request: &Request, response: Response| {
            *seen.lock().expect("lock") = request.uri().path().to_owned();
            Ok(response)
        };
        let Ok(mut ws) = tokio_tungstenite::accept_hdr_async(tcp, callback).await else {
            return;
        };
        let path = path.lock().expect("lock").clone();
        if path == "/agent/run" && self.stall_runs.load(Ordering::SeqCst) {
            self.record("stalled".into());
            self.release.cancelled().await;
            return;
        }
        let Some(Ok(Message::Binary(ask))) = ws.next().await else {
            return;
        };
        match path.as_str() {
            "/agent/register" => {
                self.record("register".into());
                if self.register_hangs.load(Ordering::SeqCst) {
                    while let Some(Ok(message)) = ws.next().await {
                        if message.is_close() {
                            break;
                        }
                    }
                    self.record("closed register".into());
                    return;
                }
                let _ = ws.send(Message::Binary(Bytes::from_static(&[0]))).await;
                let _ = ws.close(None).await;
            }
            "/agent/run" => {
                self.asks.lock().expect("lock").push(ask.to_vec());
                let request: serde_json::Value =
                    serde_json::from_slice(&ask).expect("request JSON");
                let prompt = request["prompt"].as_str().expect("prompt").to_owned();
                self.record(format!("run {prompt}"));
                let steps = self
                    .scripts
                    .lock()
                    .expect("lock")
                    .get(&prompt)
                    .cloned()
                    .unwrap_or_default();
                self.play(&prompt, ws, steps).await;
            }
            other => panic!("unexpected path {other}"),
        }
    }

    async fn play(&self, prompt: &str, mut ws: WebSocketStream<TcpStream>, steps: Vec<Step>) {
        let mut counted = false;
        for step in steps {
            match step {
                Step::Send(message) => {
                    if ws.send(Message::Binary(message.into())).await.is_err() {
                        self.record(format!("closed {prompt}"));
                        break;
                    }
                }
                Step::Fragment { first, last, bytes } => {
                    let opcode = if first {
                        OpCode::Data(Data::Binary)
                    } else {
                        OpCode::Data(Data::Continue)
                    };
                    let fragment = Frame::message(bytes, opcode, last);
                    if ws.send(Message::Frame(fragment)).await.is_err() {
                        self.record(format!("closed {prompt}"));
                        break;
                    }
                }
                Step::Close => {
                    let _ = ws.close(None).await;
                    // Let the close handshake complete.
                    while let Some(Ok(_)) = ws.next().await {}
                    break;
                }
                Step::Abort => {
                    let tcp = ws.into_inner();
                    drop(tcp);
                    break;
                }
                Step::Garbage(bytes) => {
                    use tokio::io::AsyncWriteExt;
                    let mut tcp = ws.into_inner();
                    let _ = tcp.write_all(&bytes).await;
                    let _ = tcp.flush().await;
                    break;
                }
                Step::Hang => {
                    use tokio::io::AsyncReadExt;
                    // Read under the WebSocket, so nothing answers a close.
                    let mut tcp = ws.into_inner();
                    let mut sink = [0u8; 1024];
                    while matches!(tcp.read(&mut sink).await, Ok(n) if n > 0) {}
                    self.record(format!("dropped {prompt}"));
                    break;
                }
                Step::AwaitClose => {
                    while let Some(Ok(message)) = ws.next().await {
                        if message.is_close() {
                            break;
                        }
                    }
                    self.record(format!("closed {prompt}"));
                    break;
                }
                Step::Flood { count, size } => {
                    let padding = "x".repeat(size.saturating_sub(10));
                    for n in 0..count {
                        let message = chunk(&format!("{n:>10}{padding}"));
                        if ws.send(Message::Binary(message.into())).await.is_err() {
                            break;
                        }
                        self.sent.fetch_add(1, Ordering::SeqCst);
                    }
                }
                Step::BusyCheck => {
                    if self.running.fetch_add(1, Ordering::SeqCst) > 0 {
                        let busy = error(
                            serde_json::json!({"kind": "agent", "error": "a loop is already running"}),
                        );
                        let _ = ws.send(Message::Binary(busy.into())).await;
                        let _ = ws.close(None).await;
                        while let Some(Ok(_)) = ws.next().await {}
                        self.running.fetch_sub(1, Ordering::SeqCst);
                        return;
                    }
                    counted = true;
                }
            }
        }
        if counted {
            self.running.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// A server whose catalog attaches `demo` to `proxy`.
pub async fn server_for(proxy: &FakeProxy, credentials: Credentials) -> ServerHandle {
    server_with(proxy, credentials, |_| {}).await
}

/// The same, with the configuration adjusted.
pub async fn server_with(
    proxy: &FakeProxy,
    credentials: Credentials,
    adjust: impl FnOnce(&mut ServerConfig),
) -> ServerHandle {
    let mut catalog = Catalog::new();
    catalog.insert("demo", None, Arc::new(Attach::new(proxy.url())));
    let mut config = unbudgeted(ServerConfig::new(credentials, catalog));
    adjust(&mut config);
    let server = Server::bind("127.0.0.1:0", config).await.expect("bind");
    let (handle, _task) = server.spawn();
    handle
}

/// `config` with a run budget that no test here reaches: the default
/// memory budget is a part of the machine's memory, which the tests'
/// requests (1 GiB each, a number the demo never uses) must not depend on.
/// The budget itself is tested by `runloop-cli`'s `budget` tests.
pub fn unbudgeted(mut config: ServerConfig) -> ServerConfig {
    config.budget.max_runs = 4096;
    config.budget.memory_budget = 1 << 50;
    config
}

/// A client of `server` with no credential, and a run started on it with
/// [`run_request`].
pub async fn start_run(server: &ServerHandle) -> (runloop::client::Client, Run) {
    let client = runloop::client::Client::connect(&server.url(), "")
        .await
        .expect("connect");
    let run = client.start(run_request()).await.expect("run starts");
    (client, run)
}

/// The texts of a loop's chunks (all text chunks), and its outcome.
pub async fn texts(
    run_loop: runloop::client::RunLoop,
) -> (Vec<String>, runloop_proto::run_loop::Outcome) {
    let (chunks, outcome) = run_loop.collect_chunks().await;
    let texts = chunks
        .into_iter()
        .map(|c| match c {
            runloop_proto::run_loop::AgenticLoopChunk::AssistantTextContent(t) => t.text,
            other => panic!("unexpected chunk {other:?}"),
        })
        .collect();
    (texts, outcome)
}

/// A loop on `run` under the `hang` script ([`FakeProxy::script_hang`]),
/// past its one chunk: open, with a proxy path, until something ends it.
pub async fn hanging_loop(run: &Run) -> RunLoop {
    let mut run_loop = run.run_loop("hang");
    assert!(
        matches!(run_loop.next().await, Some(Event::Chunk { .. })),
        "the hang script's one chunk"
    );
    run_loop
}

/// A valid run request for image `demo`.
pub fn run_request() -> runloop_proto::agents_run::RunRequest {
    let json = format!(
        r#"{{"image":{{"server":{{"name":"demo","digest":"sha256:{}"}}}},"memory":1073741824,"disk":0,"agent":{{"model":"test"}}}}"#,
        "0".repeat(64)
    );
    runloop_proto::agents_run::RunRequest::decode(json.as_bytes()).expect("request")
}

/// The raw payload of a `containers::agents::run` request for `demo`.
pub fn run_request_payload() -> Vec<u8> {
    let mut payload = vec![0];
    serde_json::to_writer(&mut payload, &run_request()).expect("serializes");
    payload
}

/// Waits until `check` holds, polling; a safety net, not a timing assertion.
pub async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let wait = async {
        while !check() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(PATIENCE, wait)
        .await
        .unwrap_or_else(|_| panic!("never: {what}"));
}

/// A frame-level client: sends whatever bytes it is told to.
pub struct RawClient {
    pub ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
}

impl RawClient {
    /// Connects without authorizing.
    pub async fn connect(url: &str) -> RawClient {
        // Small frames one after another: Nagle would hold each for an ACK.
        let (ws, _) = tokio_tungstenite::connect_async_with_config(url, None, true)
            .await
            .expect("connect");
        RawClient { ws }
    }

    /// Connects and authorizes with `credential`.
    pub async fn authorized(url: &str, credential: &str) -> RawClient {
        let mut client = RawClient::connect(url).await;
        let mut payload = vec![0];
        payload.extend_from_slice(credential.as_bytes());
        client
            .send_frame(&ClientFrame::Authorization { payload: &payload })
            .await;
        client
    }

    pub async fn send(&mut self, bytes: Vec<u8>) {
        self.ws
            .send(Message::Binary(bytes.into()))
            .await
            .expect("send");
    }

    pub async fn send_frame(&mut self, frame: &ClientFrame<'_>) {
        self.send(frame::to_message(frame)).await;
    }

    /// Opens scope `scope` with a run request and returns the id.
    pub async fn open_run(&mut self, scope: u32) -> String {
        self.send_frame(&ClientFrame::Request {
            scope,
            payload: &run_request_payload(),
        })
        .await;
        match self.next_frame().await {
            Some(Owned::Response { scope: s, payload }) if s == scope && payload[0] == 0 => {
                let id: serde_json::Value = serde_json::from_slice(&payload[1..]).expect("id JSON");
                id["id"].as_str().expect("id").to_owned()
            }
            other => panic!("expected the run's id, got {other:?}"),
        }
    }

    /// Opens a run-loop channel.
    pub async fn open_loop(&mut self, scope: u32, channel: u32, prompt: &str) {
        let mut payload = vec![5];
        payload.extend_from_slice(serde_json::json!({"prompt": prompt}).to_string().as_bytes());
        self.send_frame(&ClientFrame::ChannelRequest {
            scope,
            channel,
            payload: &payload,
        })
        .await;
    }

    /// The next server frame, `None` when the connection ends.
    pub async fn next_frame(&mut self) -> Option<Owned> {
        let next = async {
            loop {
                match self.ws.next().await {
                    Some(Ok(Message::Binary(bytes))) => {
                        return Some(Owned::from(
                            ServerFrame::decode(&bytes).expect("a server frame"),
                        ));
                    }
                    Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return None,
                    Some(Ok(_)) => {}
                }
            }
        };
        tokio::time::timeout(PATIENCE, next)
            .await
            .expect("a frame or the end in time")
    }
}

/// A server frame that owns its payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owned {
    Authorization,
    Response {
        scope: u32,
        payload: Vec<u8>,
    },
    ResponseFinish {
        scope: u32,
    },
    ChannelRequest {
        scope: u32,
        channel: u32,
    },
    ChannelResponse {
        scope: u32,
        channel: u32,
        payload: Vec<u8>,
    },
    ChannelResponseFinish {
        scope: u32,
        channel: u32,
    },
}

impl From<ServerFrame<'_>> for Owned {
    fn from(frame: ServerFrame<'_>) -> Owned {
        match frame {
            ServerFrame::Authorization { .. } => Owned::Authorization,
            ServerFrame::Response { scope, payload } => Owned::Response {
                scope,
                payload: payload.to_vec(),
            },
            ServerFrame::ResponseFinish { scope } => Owned::ResponseFinish { scope },
            ServerFrame::ChannelRequest { scope, channel, .. } => {
                Owned::ChannelRequest { scope, channel }
            }
            ServerFrame::ChannelResponse {
                scope,
                channel,
                payload,
            } => Owned::ChannelResponse {
                scope,
                channel,
                payload: payload.to_vec(),
            },
            ServerFrame::ChannelResponseFinish { scope, channel } => {
                Owned::ChannelResponseFinish { scope, channel }
            }
        }
    }
}

/// Whether the server holds nothing: no connection, scope, container,
/// relay or proxy path (the disregarded and turned-away counts are totals,
/// not holdings).
pub fn holds_nothing(server: &ServerHandle) -> bool {
    let stats = server.stats();
    stats
        == runloop::server::StatsSnapshot {
            disregarded: stats.disregarded,
            turned_away: stats.turned_away,
            ..Default::default()
        }
}

/// Waits until the server holds nothing; says what it still held if not.
pub async fn released(server: &ServerHandle) {
    let wait = async {
        while !holds_nothing(server) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    if tokio::time::timeout(PATIENCE, wait).await.is_err() {
        panic!("the server still holds {:?}", server.stats());
    }
}

/// Tasks alive on the current runtime (each `#[tokio::test]` has its own).
pub fn alive_tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

/// Waits until the runtime is back to `baseline` tasks.
pub async fn tasks_back_to(baseline: usize) {
    let wait = async {
        while alive_tasks() > baseline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    if tokio::time::timeout(PATIENCE, wait).await.is_err() {
        panic!("{} tasks alive, {baseline} before", alive_tasks());
    }
}

/// Connected TCP sockets this process holds (listeners excluded) with
/// `port` at either end, from `/proc/self/fd` and `/proc/net/tcp{,6}`.
pub fn held_sockets(port: u16) -> usize {
    let ours: std::collections::HashSet<u64> = std::fs::read_dir("/proc/self/fd")
        .expect("procfs")
        .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .filter_map(|target| {
            let target = target.to_str()?.to_owned();
            target
                .strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()
        })
        .collect();
    let port_of = |address: &str| {
        address
            .rsplit_once(':')
            .and_then(|(_, port)| u16::from_str_radix(port, 16).ok())
    };
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|table| std::fs::read_to_string(table).ok())
        .flat_map(|table| table.lines().skip(1).map(str::to_owned).collect::<Vec<_>>())
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(remote), Some(state), Some(inode)) =
                (fields.get(1), fields.get(2), fields.get(3), fields.get(9))
            else {
                return false;
            };
            let listening = *state == "0A";
            let inode: u64 = inode.parse().unwrap_or(0);
            !listening
                && ours.contains(&inode)
                && (port_of(local) == Some(port) || port_of(remote) == Some(port))
        })
        .count()
}

/// Waits until this process holds no connected socket to or from `port`.
pub async fn sockets_closed(port: u16) {
    let wait = async {
        while held_sockets(port) > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    if tokio::time::timeout(PATIENCE, wait).await.is_err() {
        panic!("{} sockets to port {port} still open", held_sockets(port));
    }
}

/// A runtime whose containers are a fake proxy's, and whose test decides
/// when each start completes and when each container ends by itself.
#[derive(Debug, Clone)]
pub struct Gated {
    url: String,
    /// One permit per start allowed to complete.
    pub gate: Arc<tokio::sync::Semaphore>,
    /// Starts asked for.
    pub asked: Arc<AtomicU64>,
    /// Starts dropped before they completed (the server gave up waiting).
    pub abandoned: Arc<AtomicU64>,
    /// Containers that exist (started and not yet dropped).
    pub live: Arc<AtomicU64>,
    /// Containers stopped through `Container::stop`.
    pub stopped: Arc<AtomicU64>,
    ends: Arc<Mutex<Vec<tokio::sync::watch::Sender<bool>>>>,
}

impl Gated {
    /// Containers at `proxy`, every start held until the test opens the gate.
    pub fn new(proxy: &FakeProxy) -> Gated {
        Gated {
            url: proxy.url(),
            gate: Arc::new(tokio::sync::Semaphore::new(0)),
            asked: Arc::default(),
            abandoned: Arc::default(),
            live: Arc::default(),
            stopped: Arc::default(),
            ends: Arc::default(),
        }
    }

    /// Lets `n` more starts complete.
    pub fn open(&self, n: usize) {
        self.gate.add_permits(n);
    }

    /// Ends the most recently started container, as if it had exited.
    pub fn end_latest(&self) {
        let ends = self.ends.lock().expect("lock");
        ends.last().expect("a container started").send_replace(true);
    }

    /// A server serving `demo` with this runtime.
    pub async fn server(&self) -> ServerHandle {
        let mut catalog = Catalog::new();
        catalog.insert("demo", None, Arc::new(self.clone()));
        let config = unbudgeted(ServerConfig::new(Credentials::Any, catalog));
        let server = Server::bind("127.0.0.1:0", config).await.expect("bind");
        server.spawn().0
    }
}

/// Counts a start as abandoned unless it completed.
struct StartGuard(Option<Arc<AtomicU64>>);

impl Drop for StartGuard {
    fn drop(&mut self) {
        if let Some(abandoned) = self.0.take() {
            abandoned.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl runloop::runtime::Runtime for Gated {
    fn start(
        &self,
        _limits: runloop::runtime::ContainerLimits,
    ) -> runloop::runtime::BoxFuture<
        '_,
        Result<Box<dyn runloop::runtime::Container>, runloop::runtime::StartError>,
    > {
        Box::pin(async move {
            let mut guard = StartGuard(Some(Arc::clone(&self.abandoned)));
            self.asked.fetch_add(1, Ordering::SeqCst);
            self.gate.acquire().await.expect("never closed").forget();
            guard.0 = None;
            let (end, ended) = tokio::sync::watch::channel(false);
            self.ends.lock().expect("lock").push(end);
            self.live.fetch_add(1, Ordering::SeqCst);
            let container: Box<dyn runloop::runtime::Container> = Box::new(GatedContainer {
                url: self.url.clone(),
                ended,
                live: Arc::clone(&self.live),
                stopped: Arc::clone(&self.stopped),
            });
            Ok(container)
        })
    }
}

#[derive(Debug)]
struct GatedContainer {
    url: String,
    ended: tokio::sync::watch::Receiver<bool>,
    live: Arc<AtomicU64>,
    stopped: Arc<AtomicU64>,
}

impl runloop::runtime::Container for GatedContainer {
    fn proxy_url(&self) -> &str {
        &self.url
    }

    fn ended(&mut self) -> runloop::runtime::BoxFuture<'_, String> {
        Box::pin(async move {
            let ended = self.ended.wait_for(|ended| *ended).await.is_ok();
            if !ended {
                // The test dropped its end of it: never ends by itself.
                std::future::pending::<()>().await;
            }
            "the test ended it".to_owned()
        })
    }

    fn stop(self: Box<Self>) -> runloop::runtime::BoxFuture<'static, ()> {
        self.stopped.fetch_add(1, Ordering::SeqCst);
        Box::pin(std::future::ready(()))
    }
}

impl Drop for GatedContainer {
    fn drop(&mut self) {
        self.live.fetch_sub(1, Ordering::SeqCst);
    }
}
