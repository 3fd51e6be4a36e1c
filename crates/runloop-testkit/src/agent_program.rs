//! An agent program whose every byte the test writes (protocol §10's
//! `/run` and `/register`, or anything else), on a raw TCP socket, and a
//! real proxy in front of it: for the tests of what a proxy makes of an
//! agent program that answers late, wrongly or not at all.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use runloop_proxy::ProxyHandle;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// A proxy on a loopback port, in front of an agent program.
pub struct RunningProxy {
    /// Its `ws://` URL.
    pub url: String,
    /// Its handle (shutdown, metrics).
    pub handle: ProxyHandle,
    /// Its serving task.
    pub task: JoinHandle<std::io::Result<()>>,
}

/// A real proxy on a loopback port for the agent program at `agent`.
pub async fn proxy(agent: SocketAddr) -> RunningProxy {
    let proxy = runloop_proxy::Proxy::bind(SocketAddr::from(([127, 0, 0, 1], 0)), agent)
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
    /// `GET`, `POST`…
    pub method: String,
    /// The request's target.
    pub path: String,
    /// Every header, in order, as sent (names not folded).
    pub headers: Vec<(String, String)>,
    /// The `Content-Length` body.
    pub body: Vec<u8>,
}

impl Request {
    /// The first header named `name` (any case).
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
