//! Clean ends between a caller and a server (protocol §12 "Clean ends"): the
//! client closes with a handshake and waits for the answer, the server
//! answers a caller's close at once, and the server's account of how a
//! connection ended says what happened.
//!
//! The server's logs of this binary, at debug, go into one buffer; each
//! test reads the lines of its own connection (named by the caller's port).

use std::sync::{Arc, Mutex, OnceLock};

use futures_util::{SinkExt, StreamExt};
use runloop::client::Client;
use runloop::runtime::{BoxFuture, Catalog, Container, ContainerLimits, Runtime, StartError};
use runloop::server::{Credentials, Server, ServerConfig};
use runloop_proto::frame::ClientFrame;
use runloop_testkit::caller::RawClient;
use runloop_testkit::fake_proxy::FakeProxy;
use runloop_testkit::logs::Logs;
use runloop_testkit::server::{released, server_for, server_with};
use runloop_testkit::wait::PATIENCE;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_tungstenite::MaybeTlsStream;
use tokio_tungstenite::tungstenite::Message;

/// What a raw WebSocket server saw of one client connection, in order.
type Seen = Arc<Mutex<Vec<String>>>;

/// A WebSocket server that accepts one connection, takes its first message
/// (the authorization) and then writes down how the connection goes on:
/// `close` for a close frame, `end` for the end of the stream, `error …`.
/// It sends nothing of its own; the close answer is tungstenite's. It
/// reads nothing for a moment after the authorization, so a client that
/// does not wait for the answer is done before anything is read.
async fn watching_server() -> (String, Seen, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("ws://{}", listener.local_addr().expect("addr"));
    let seen = Seen::default();
    let log = Arc::clone(&seen);
    let task = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.expect("a connection");
        let mut ws = tokio_tungstenite::accept_async(tcp)
            .await
            .expect("handshake");
        let first = ws.next().await;
        assert!(
            matches!(first, Some(Ok(Message::Binary(ref m))) if m.first() == Some(&0)),
            "{first:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        loop {
            let event = match ws.next().await {
                Some(Ok(Message::Close(_))) => "close".to_owned(),
                Some(Ok(other)) => format!("message {other:?}"),
                Some(Err(error)) => format!("error {error}"),
                None => "end".to_owned(),
            };
            let end = event != "close";
            log.lock().expect("lock").push(event);
            if end {
                return;
            }
        }
    });
    (url, seen, task)
}

fn seen(seen: &Seen) -> Vec<String> {
    seen.lock().expect("lock").clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_sends_a_close_frame_and_waits_for_the_answer() {
    let (url, events, server) = watching_server().await;
    let client = Client::connect(&url, "").await.expect("connects");
    client.close().await;
    // The server answers a close only after it has read it: when `close`
    // returns, the close has been read.
    assert_eq!(seen(&events).first().map(String::as_str), Some("close"));
    assert!(client.is_closed());
    tokio::time::timeout(PATIENCE, server)
        .await
        .expect("the connection ends")
        .expect("the server task");
    assert_eq!(seen(&events), ["close", "end"], "a close frame, then EOF");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_last_handle_closes_with_a_handshake_in_the_background() {
    let (url, events, server) = watching_server().await;
    let client = Client::connect(&url, "").await.expect("connects");
    drop(client);
    // Drop cannot wait; the client's tasks close while the runtime runs.
    tokio::time::timeout(PATIENCE, server)
        .await
        .expect("the connection ends")
        .expect("the server task");
    assert_eq!(seen(&events), ["close", "end"], "a close frame, then EOF");
}

/// Containers at a fake proxy whose stop waits until the test lets it
/// finish: a run that takes its time to end.
#[derive(Debug, Clone)]
struct SlowStop {
    url: String,
    stops: Arc<Semaphore>,
}

#[derive(Debug)]
struct SlowContainer(SlowStop);

impl Runtime for SlowStop {
    fn start(&self, _: ContainerLimits) -> BoxFuture<'_, Result<Box<dyn Container>, StartError>> {
        let container: Box<dyn Container> = Box::new(SlowContainer(self.clone()));
        Box::pin(std::future::ready(Ok(container)))
    }
}

impl Container for SlowContainer {
    fn proxy_url(&self) -> &str {
        &self.0.url
    }

    fn ended(&mut self) -> BoxFuture<'_, String> {
        Box::pin(std::future::pending())
    }

    fn stop(self: Box<Self>) -> BoxFuture<'static, ()> {
        Box::pin(async move {
            self.0.stops.acquire().await.expect("open").forget();
        })
    }
}

fn caller_port(raw: &RawClient) -> u16 {
    match raw.ws.get_ref() {
        MaybeTlsStream::Plain(tcp) => tcp.local_addr().expect("addr").port(),
        _ => unreachable!("plain ws"),
    }
}

/// The server's "connection ending" line of the connection from `port`.
fn ending_of(port: u16) -> String {
    let peer = format!("peer=127.0.0.1:{port}");
    logs()
        .text()
        .lines()
        .find(|line| line.contains(&peer) && line.contains("connection ending"))
        .expect("the connection's ending is logged")
        .to_owned()
}

/// The one log buffer of this binary, at debug.
fn logs() -> &'static Logs {
    static LOGS: OnceLock<Logs> = OnceLock::new();
    LOGS.get_or_init(|| Logs::global(tracing::Level::DEBUG))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_answers_a_callers_close_before_its_runs_have_ended() {
    logs();
    let proxy = FakeProxy::start().await;
    proxy.script_hang();
    let runtime = SlowStop {
        url: proxy.url(),
        stops: Arc::new(Semaphore::new(0)),
    };
    let mut catalog = Catalog::new();
    catalog.insert("demo", None, Arc::new(runtime.clone()));
    let server = Server::bind("127.0.0.1:0", ServerConfig::new(Credentials::Any, catalog))
        .await
        .expect("bind");
    let (server, _serving) = server.spawn();

    let mut raw = RawClient::authorized(&server.url(), "").await;
    let port = caller_port(&raw);
    raw.open_run(0).await;
    raw.open_loop(0, 0, "hang").await;
    proxy.wait_for("run hang").await;
    raw.ws.send(Message::Close(None)).await.expect("close sent");
    // The answer comes while the run is still ending (its container's stop
    // is held): frames the server had queued may come first, then the close.
    let answer = async {
        loop {
            match raw.ws.next().await {
                Some(Ok(Message::Close(_))) => return true,
                Some(Ok(_)) => {}
                Some(Err(_)) | None => return false,
            }
        }
    };
    let answered = tokio::time::timeout(PATIENCE, answer).await;
    assert_eq!(answered, Ok(true), "the server answered the close");
    assert_eq!(server.stats().scopes, 1, "the run is still ending");
    runtime.stops.add_permits(1);
    released(&server).await;
    let ending = ending_of(port);
    assert!(
        ending.contains(r#"why="the caller closed the connection""#),
        "{ending}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connection_ending_line_counts_the_frames_it_disregarded() {
    logs();
    let proxy = FakeProxy::start().await;
    let server = server_for(&proxy, Credentials::Any).await;
    let mut raw = RawClient::authorized(&server.url(), "").await;
    let port = caller_port(&raw);
    // Truncated; a channel request on a scope that is not open; a response
    // on a server channel that is not open.
    raw.send(vec![1, 0, 0]).await;
    raw.send_frame(&ClientFrame::ChannelRequest {
        scope: 9,
        channel: 0,
        payload: &[0],
    })
    .await;
    raw.send_frame(&ClientFrame::ChannelResponseFinish {
        scope: 9,
        channel: 0,
    })
    .await;
    raw.ws.close(None).await.expect("closed");
    released(&server).await;
    let ending = ending_of(port);
    assert!(ending.contains("disregarded=3"), "{ending}");
    assert_eq!(server.stats().disregarded, 3, "the server-wide count too");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_over_the_limit_is_logged_as_what_it_is_not_as_a_break() {
    logs();
    let proxy = FakeProxy::start().await;
    let server = server_with(&proxy, Credentials::Any, |config| {
        config.limits.max_message_size = 4096;
    })
    .await;
    let mut raw = RawClient::authorized(&server.url(), "").await;
    let port = caller_port(&raw);
    raw.send(vec![1; 8192]).await;
    assert_eq!(raw.next_frame().await, None, "the connection ends");
    released(&server).await;
    let ending = ending_of(port);
    assert!(
        ending.contains(r#"why="the caller sent a message over the size limit""#),
        "{ending}"
    );
}
