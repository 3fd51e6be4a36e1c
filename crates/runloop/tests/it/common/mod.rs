//! Test helpers shared by the integration tests: a WebSocket client that
//! drives a proxy path the way the server does, and a scripted agent
//! program on a raw TCP socket.
//!
//! Each test binary uses a part of this module; the rest is dead code there.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use runloop::proto::Writer;
use runloop::proto::run_loop::{AgenticLoopChunk, Outcome, Reader, Relay, Relayed, Step};
use runloop::proxy::ProxyHandle;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::Message;

pub type Ws = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<TcpStream>>;

/// How a path ended, as the client saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// A close frame came.
    Clean,
    /// The path ended without one.
    Abrupt(String),
}

/// Every binary message of a path, and how it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exchange {
    pub messages: Vec<Vec<u8>>,
    pub end: End,
}

/// Opens `url` + `path`.
pub async fn open(url: &str, path: &str) -> Ws {
    let (ws, _) = tokio_tungstenite::connect_async(format!("{url}{path}"))
        .await
        .expect("the proxy accepts the path");
    ws
}

/// Sends the ask as one binary message.
pub async fn ask(ws: &mut Ws, ask: &[u8]) {
    ws.send(Message::Binary(ask.to_vec().into()))
        .await
        .expect("the ask is sent");
}

/// Reads the next binary message; `None` at the end of the path.
pub async fn next_binary(ws: &mut Ws) -> Option<Vec<u8>> {
    loop {
        match ws.next().await? {
            Ok(Message::Binary(bytes)) => return Some(bytes.to_vec()),
            Ok(Message::Close(_)) | Err(_) => return None,
            Ok(_) => continue,
        }
    }
}

/// Reads the rest of a path.
pub async fn rest(mut ws: Ws) -> Exchange {
    let mut messages = Vec::new();
    let mut closed = false;
    loop {
        match ws.next().await {
            Some(Ok(Message::Binary(bytes))) => messages.push(bytes.to_vec()),
            Some(Ok(Message::Close(_))) => closed = true,
            Some(Ok(_)) => {}
            None => {
                let end = if closed {
                    End::Clean
                } else {
                    End::Abrupt("the stream ended".into())
                };
                return Exchange { messages, end };
            }
            Some(Err(error)) => {
                let end = if closed {
                    End::Clean
                } else {
                    End::Abrupt(error.to_string())
                };
                return Exchange { messages, end };
            }
        }
    }
}

/// One whole exchange: open the path, send the ask, read to the end.
pub async fn exchange(url: &str, path: &str, ask_bytes: &[u8]) -> Exchange {
    let mut ws = open(url, path).await;
    ask(&mut ws, ask_bytes).await;
    rest(ws).await
}

/// Registers with `{"agent": {}}` and checks the proxy said `[0]`.
pub async fn register(url: &str) {
    let done = exchange(url, "/agent/register", br#"{"agent":{}}"#).await;
    assert_eq!(
        done,
        Exchange {
            messages: vec![vec![0]],
            end: End::Clean
        }
    );
}

/// Feeds a run path's messages through the server's relay and the
/// caller's reader, as the real chain does: the chunks and the outcome the
/// caller would see.
pub fn outcome(exchange: &Exchange) -> (Vec<AgenticLoopChunk>, Outcome) {
    let mut relay = Relay::new();
    let mut reader = Reader::new();
    let mut chunks = Vec::new();
    let mut feed = |reader: &mut Reader, payload: &[u8]| -> Option<Outcome> {
        match reader.response(payload) {
            Some(Step::Chunk(chunk)) => {
                chunks.push(chunk);
                None
            }
            Some(Step::End(outcome)) => Some(outcome),
            Some(Step::Error(_)) | None => None,
        }
    };
    for message in &exchange.messages {
        let mut out = Vec::new();
        let last = match relay.message(message.clone(), &mut Writer::new(&mut out)) {
            Relayed::Forward(next, message) => {
                relay = next;
                if let Some(outcome) = feed(&mut reader, &message) {
                    return (chunks, outcome);
                }
                continue;
            }
            Relayed::Last(error, _finish) => error,
            Relayed::Fault(_finish) => out,
        };
        let ended = feed(&mut reader, &last);
        let outcome = ended.or_else(|| reader.finish()).expect("an outcome");
        return (chunks, outcome);
    }
    let mut out = Vec::new();
    match &exchange.end {
        End::Clean => {
            let _finish = relay.closed();
        }
        End::Abrupt(why) => {
            let _finish = relay.broke(why, &mut Writer::new(&mut out));
            if let Some(outcome) = feed(&mut reader, &out) {
                return (chunks, outcome);
            }
        }
    }
    let outcome = reader.finish().expect("an outcome");
    (chunks, outcome)
}

/// The error JSON of a message that is `[1][JSON]`.
pub fn error_json(message: &[u8]) -> serde_json::Value {
    assert_eq!(message.first(), Some(&1), "an error message");
    serde_json::from_slice(&message[1..]).expect("error JSON")
}

/// A proxy on a loopback port for the agent program at `agent`.
pub struct RunningProxy {
    pub url: String,
    pub handle: ProxyHandle,
    pub task: JoinHandle<std::io::Result<()>>,
}

pub async fn proxy(agent: SocketAddr) -> RunningProxy {
    let proxy = runloop::proxy::Proxy::bind(SocketAddr::from(([127, 0, 0, 1], 0)), agent)
        .await
        .expect("binds");
    let (handle, task) = proxy.spawn();
    RunningProxy {
        url: handle.url(),
        handle,
        task,
    }
}

/// One HTTP request as the scripted agent program read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }
}

/// One connection to the scripted agent program: every byte it writes is
/// written as the test says, when the test says.
pub struct Conn {
    stream: BufReader<TcpStream>,
}

impl Conn {
    /// Reads one request: the head, then a `Content-Length` body.
    pub async fn request(&mut self) -> Option<Request> {
        let mut line = String::new();
        if self.stream.read_line(&mut line).await.ok()? == 0 {
            return None;
        }
        let mut words = line.split_whitespace();
        let method = words.next()?.to_owned();
        let path = words.next()?.to_owned();
        let mut headers = Vec::new();
        loop {
            line.clear();
            self.stream.read_line(&mut line).await.ok()?;
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            let (name, value) = header.split_once(':')?;
            headers.push((name.trim().to_owned(), value.trim().to_owned()));
        }
        let length = headers
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case("content-length"))
            .and_then(|(_, value)| value.parse::<usize>().ok())
            .unwrap_or(0);
        let mut body = vec![0; length];
        self.stream.read_exact(&mut body).await.ok()?;
        Some(Request {
            method,
            path,
            headers,
            body,
        })
    }

    /// Writes raw bytes and flushes them onto the wire.
    pub async fn write(&mut self, bytes: &[u8]) {
        let stream = self.stream.get_mut();
        stream.write_all(bytes).await.expect("the proxy reads");
        stream.flush().await.expect("flushes");
    }

    /// A whole response with a `Content-Length` body.
    pub async fn respond(&mut self, status: u16, content_type: &str, body: &[u8]) {
        let head = format!(
            "HTTP/1.1 {status} Scripted\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        self.write(&[head.as_bytes(), body].concat()).await;
    }

    /// The head of a chunked event stream.
    pub async fn event_stream(&mut self) {
        self.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
        )
        .await;
    }

    /// One HTTP chunk of the body.
    pub async fn chunk(&mut self, bytes: &[u8]) {
        let framed = [format!("{:x}\r\n", bytes.len()).as_bytes(), bytes, b"\r\n"].concat();
        self.write(&framed).await;
    }

    /// The end of a chunked body.
    pub async fn end(&mut self) {
        self.write(b"0\r\n\r\n").await;
    }

    /// Waits until the proxy closes this connection; true when it did.
    pub async fn closed_by_peer(&mut self) -> bool {
        let mut sink = [0u8; 1024];
        loop {
            match self.stream.read(&mut sink).await {
                Ok(0) | Err(_) => return true,
                Ok(_) => continue,
            }
        }
    }
}

/// Starts a scripted agent program: `handler` gets every connection.
pub async fn scripted<F, Fut>(handler: F) -> (SocketAddr, JoinHandle<()>)
where
    F: Fn(Conn) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("binds");
    let addr = listener.local_addr().expect("address");
    let handler = Arc::new(handler);
    let task = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let handler = Arc::clone(&handler);
            tokio::spawn(async move {
                handler(Conn {
                    stream: BufReader::new(stream),
                })
                .await;
            });
        }
    });
    (addr, task)
}

/// Waits, within a generous bound, until `pid` is no longer a running
/// process (gone, or a zombie that is not ours to reap).
pub async fn wait_dead(pid: u32) -> bool {
    for _ in 0..2000 {
        if dead(pid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

/// Whether `pid` is gone or a zombie.
pub fn dead(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .is_some_and(|state| matches!(state, 'Z' | 'X')),
    }
}

/// Whether `/proc/<pid>` is gone: the process ended and was reaped.
pub fn reaped(pid: u32) -> bool {
    !std::path::Path::new(&format!("/proc/{pid}")).exists()
}
