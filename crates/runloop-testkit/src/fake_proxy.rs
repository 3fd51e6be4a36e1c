//! A proxy whose `/agent/run` paths follow a script chosen by the prompt
//! (protocol §10), on a loopback port: for the tests of what the server
//! makes of a proxy that floods, hangs, breaks the sequence or drops the
//! socket. It records what happened to every path, in order.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::server::{Request, Response};
use tokio_tungstenite::tungstenite::protocol::frame::Frame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};

use crate::message::{chunk, error};
use crate::wait::PATIENCE;

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
    Flood {
        /// How many.
        count: usize,
        /// Each one's size, bytes.
        size: usize,
    },
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
        /// Whether it begins the message.
        first: bool,
        /// Whether it ends it.
        last: bool,
        /// Its payload.
        bytes: Vec<u8>,
    },
}

/// A proxy whose `/agent/run` answers follow a script chosen by the prompt.
#[derive(Clone, Default)]
pub struct FakeProxy {
    scripts: Arc<Mutex<HashMap<String, Vec<Step>>>>,
    /// Every event, in order: `register`, `run <prompt>`, `closed <prompt>`.
    pub log: Arc<Mutex<Vec<String>>>,
    /// Notified at every event.
    pub logged: Arc<Notify>,
    /// Messages sent by floods.
    pub sent: Arc<AtomicU64>,
    running: Arc<AtomicU64>,
    /// Where it listens, once started.
    pub addr: Option<SocketAddr>,
    /// Every `/agent/run` ask, as the bytes that came.
    pub asks: Arc<Mutex<Vec<Vec<u8>>>>,
    /// When set, `/agent/register` reads its ask and then never answers.
    pub register_hangs: Arc<AtomicBool>,
    /// When set, `/agent/run` completes the handshake and then reads
    /// nothing at all until `release` fires.
    pub stall_runs: Arc<AtomicBool>,
    /// Ends every stalled path.
    pub release: tokio_util::sync::CancellationToken,
}

impl FakeProxy {
    /// Starts one on a loopback port. The path of a prompt with no script
    /// is dropped once its ask is read.
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

    /// Its `ws://` URL.
    pub fn url(&self) -> String {
        format!("ws://{}", self.addr.expect("started"))
    }

    /// What the paths of `prompt` do from now on.
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

    /// Every event so far, in order.
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
        // tungstenite's handshake callback returns its error response by value.
        #[allow(clippy::result_large_err)]
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
