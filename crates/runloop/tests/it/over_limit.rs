//! An agent program's SSE event over a message limit, on the proxy's
//! WebSocket path and on the in-process path alike: the loop is cut short
//! (the chunks before it, then the server's own error, never a finish), and
//! the error says what happened — the event is over the message limit —
//! not how a socket ended (issue 40, item 7).

use std::net::SocketAddr;
use std::sync::Arc;

use runloop::proxy::{Proxy, ProxyConfig, ProxyHandle};
use runloop::runtime::{
    Attach, BoxFuture, Catalog, Container, ContainerLimits, LocalProxy, Runtime, StartError,
};
use runloop::server::{Credentials, Server, ServerConfig, ServerHandle};
use runloop_proto::run_loop::Outcome;
use runloop_testkit::agent_program::scripted;
use runloop_testkit::server::{start_run, texts};

/// The proxy's bound on one event, in these tests.
const PROXY_LIMIT: usize = 100 << 10;

/// An agent program whose loop is one small chunk, then an event of 200
/// KiB of data that never ends.
async fn agent() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    scripted(|mut conn| async move {
        while let Some(request) = conn.request().await {
            if request.path == "/register" {
                conn.respond(204, "text/plain", b"").await;
                continue;
            }
            conn.event_stream().await;
            conn.chunk(b"data: {\"type\":\"assistant_text_content\",\"text\":\"a\"}\n\n")
                .await;
            let text = "x".repeat(200 << 10);
            let event = format!(r#"data: {{"type":"assistant_text_content","text":"{text}"#);
            for piece in event.as_bytes().chunks(16 << 10) {
                conn.chunk(piece).await;
            }
            // Held open: the proxy's bound ends the loop, not the body.
            std::future::pending::<()>().await;
        }
    })
    .await
}

/// A proxy bound to `PROXY_LIMIT` in front of `agent`.
async fn proxy(agent: SocketAddr, max_event: usize) -> Proxy {
    let config = ProxyConfig {
        max_event,
        ..ProxyConfig::default()
    };
    Proxy::bind(SocketAddr::from(([127, 0, 0, 1], 0)), agent)
        .await
        .expect("binds")
        .with_config(config)
}

/// Containers whose proxy is a task of the server's process, as an exec
/// or oci agent's is: the server takes its paths in process.
#[derive(Debug)]
struct InProcess {
    agent: SocketAddr,
    max_event: usize,
}

#[derive(Debug)]
struct Local {
    url: String,
    local: LocalProxy,
    handle: ProxyHandle,
}

impl Runtime for InProcess {
    fn start(&self, _: ContainerLimits) -> BoxFuture<'_, Result<Box<dyn Container>, StartError>> {
        Box::pin(async move {
            let proxy = proxy(self.agent, self.max_event).await;
            let local = proxy.local();
            let (handle, _task) = proxy.spawn();
            let container: Box<dyn Container> = Box::new(Local {
                url: handle.url(),
                local,
                handle,
            });
            Ok(container)
        })
    }
}

impl Container for Local {
    fn proxy_url(&self) -> &str {
        &self.url
    }

    fn local_proxy(&self) -> Option<LocalProxy> {
        Some(self.local.clone())
    }

    fn ended(&mut self) -> BoxFuture<'_, String> {
        Box::pin(std::future::pending())
    }

    fn stop(self: Box<Self>) -> BoxFuture<'static, ()> {
        self.handle.shutdown();
        Box::pin(async {})
    }
}

/// A server whose `demo` image is served by `runtime`, with messages of at
/// most `max_message` bytes.
async fn server(runtime: Arc<dyn Runtime>, max_message: usize) -> ServerHandle {
    let mut catalog = Catalog::new();
    catalog.insert("demo", None, runtime);
    let mut config = ServerConfig::new(Credentials::Any, catalog);
    config.limits.max_message_size = max_message;
    Server::bind("127.0.0.1:0", config)
        .await
        .expect("bind")
        .spawn()
        .0
}

/// One loop through `server`: the chunks before the large event, then the
/// server's error, which is returned.
async fn one_loop(server: &ServerHandle) -> String {
    let (client, run) = start_run(server).await;
    let (chunks, outcome) = texts(run.run_loop("go")).await;
    assert_eq!(chunks, ["a"], "the chunk before, nothing of the large one");
    let Outcome::Unfinished(error) = outcome else {
        panic!("{outcome:?}");
    };
    assert_eq!(error.value()["kind"], "proxy", "{error}");
    run.stop().await;
    client.close().await;
    error.value()["error"].as_str().expect("words").to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_over_the_proxys_limit_says_so_on_a_websocket_path() {
    let (agent, _agent) = agent().await;
    let proxy = proxy(agent, PROXY_LIMIT).await;
    let (handle, _task) = proxy.spawn();
    let server = server(Arc::new(Attach::new(handle.url())), 16 << 20).await;
    let error = one_loop(&server).await;
    assert_eq!(
        error,
        format!(
            "the proxy path ended abruptly: the proxy closed the path inside a message: the \
             agent program's SSE event is over the message limit ({PROXY_LIMIT} bytes)"
        )
    );
    handle.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_over_the_proxys_limit_says_so_on_an_in_process_path() {
    let (agent, _agent) = agent().await;
    let runtime = Arc::new(InProcess {
        agent,
        max_event: PROXY_LIMIT,
    });
    let server = server(runtime, 16 << 20).await;
    let error = one_loop(&server).await;
    assert_eq!(
        error,
        format!(
            "the proxy path ended abruptly: the agent program's SSE event is over the message \
             limit ({PROXY_LIMIT} bytes)"
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_over_the_servers_limit_says_so_on_either_path() {
    let (agent, _agent) = agent().await;
    let server_limit = 100 << 10;
    let proxy = proxy(agent, 16 << 20).await;
    let (handle, _task) = proxy.spawn();
    let socket = server(Arc::new(Attach::new(handle.url())), server_limit).await;
    let error = one_loop(&socket).await;
    assert_eq!(
        error,
        "the proxy path ended abruptly: a message in fragments is over the message limit"
    );
    let runtime = Arc::new(InProcess {
        agent,
        max_event: 16 << 20,
    });
    let in_process = server(runtime, server_limit).await;
    let error = one_loop(&in_process).await;
    assert_eq!(
        error,
        format!(
            "the proxy path ended abruptly: the agent program's chunk is over the message limit \
             ({server_limit} bytes)"
        )
    );
    handle.shutdown();
}
