//! The demo agent behind a real proxy: agent program (axum, SSE) → proxy →
//! WebSocket client → the server's relay → the caller's reader, for every
//! way a loop can end; and the builtin runtime that packages the two.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use futures_util::StreamExt;
use runloop::agent::demo::{Demo, SEQ};
use runloop::agent::{self, Agent, AgentHandle, AgentServer};
use runloop::proto::ErrorValue;
use runloop::proto::run_loop::{AgenticLoopChunk, ChunkKind, Outcome, RunLoopRequest};
use runloop::proxy::{Proxy, ProxyHandle};
use runloop::runtime::{Builtin, ContainerLimits, Runtime};
use runloop_testkit::path::{self, End, Exchange, error_json, exchange, outcome, register};
use serde_json::json;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The demo agent program and a proxy in front of it, serving: the agent
/// program's handle and task, and the proxy's handle.
pub(crate) async fn demo_and_proxy() -> (AgentHandle, JoinHandle<io::Result<()>>, ProxyHandle) {
    let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
    let agent = AgentServer::bind(loopback, Arc::new(Demo::new()))
        .await
        .expect("binds");
    let proxy = Proxy::bind(loopback, agent.local_addr())
        .await
        .expect("binds");
    let (agent, task) = agent.spawn();
    (agent, task, proxy.spawn().0)
}

/// `chunks` show every kind of chunk the demo's loop shows: reasoning, a
/// tool call and its response, a notification, text and usage.
pub(crate) fn shows_the_demo_s_kinds(chunks: &[AgenticLoopChunk]) {
    for kind in [
        ChunkKind::AssistantReasoning,
        ChunkKind::AssistantToolCall,
        ChunkKind::ToolResponse,
        ChunkKind::Notification,
        ChunkKind::AssistantTextContent,
        ChunkKind::Usage,
    ] {
        assert!(
            chunks.iter().any(|c| c.kind() == kind),
            "{kind} is shown: {chunks:?}"
        );
    }
}

/// The demo agent program and a proxy in front of it; the proxy's URL.
async fn demo_behind_proxy(stop: &CancellationToken) -> String {
    let (agent, _, proxy) = demo_and_proxy().await;
    let url = proxy.url();
    // Both end when the test's token fires.
    let stop = stop.clone();
    tokio::spawn(async move {
        stop.cancelled().await;
        agent.shutdown();
        proxy.shutdown();
    });
    url
}

/// What the demo agent itself yields for `prompt`, without any wire.
async fn direct(prompt: &str) -> Vec<Result<AgenticLoopChunk, agent::Break>> {
    let stream = Demo::new()
        .run_loop(RunLoopRequest::new(prompt))
        .await
        .expect("not refused");
    stream.collect().await
}

async fn run(url: &str, prompt: &str) -> (Exchange, Vec<AgenticLoopChunk>, Outcome) {
    let done = exchange(url, "/agent/run", RunLoopRequest::new(prompt).json()).await;
    let (chunks, outcome) = outcome(&done);
    (done, chunks, outcome)
}

fn seq(chunk: &AgenticLoopChunk) -> Option<u64> {
    let json = serde_json::to_value(chunk).expect("serializes");
    json["_meta"][SEQ].as_u64()
}

#[tokio::test]
async fn every_ending_of_the_demo_loop_through_the_proxy() {
    let stop = CancellationToken::new();
    let url = demo_behind_proxy(&stop).await;
    register(&url).await;

    // Finished: every chunk the demo wrote arrives, in order, unchanged.
    let (done, chunks, result) = run(&url, "count these four words").await;
    assert_eq!(result, Outcome::Finished { fatal: false });
    assert_eq!(done.end, End::Clean);
    let expected: Vec<AgenticLoopChunk> = direct("count these four words")
        .await
        .into_iter()
        .map(|item| item.expect("no break"))
        .collect();
    assert_eq!(chunks, expected);
    for (n, chunk) in chunks.iter().enumerate() {
        assert_eq!(seq(chunk), Some(n as u64));
    }
    shows_the_demo_s_kinds(&chunks);

    // A fatal notification is output: the loop finished, and failed.
    let (_, chunks, result) = run(&url, "demo:fatal").await;
    assert_eq!(result, Outcome::Finished { fatal: true });
    assert!(chunks.last().is_some_and(AgenticLoopChunk::is_fatal));

    // The stream breaks mid-loop: a partial result, then the error.
    let (_, chunks, result) = run(&url, "demo:break").await;
    let before_break = direct("demo:break")
        .await
        .into_iter()
        .filter(Result::is_ok)
        .count();
    assert_eq!(chunks.len(), before_break);
    let Outcome::Unfinished(error) = result else {
        panic!("not unfinished: {result:?}");
    };
    let words = path::agent_words(&error);
    assert!(words.starts_with("the event stream broke"), "{error}");

    // Refused before any chunk: no loop, the JSON body under the agent's
    // kind with its status (protocol §12, "an agent speaks for itself").
    let (done, _, result) = run(&url, "demo:refuse").await;
    assert_eq!(
        result,
        Outcome::NoLoop(ErrorValue::new(json!({
            "kind": "agent",
            "status": 503,
            "error": {"kind": "demo", "error": "the demo agent refuses this loop (demo:refuse)"}
        })))
    );
    assert_eq!(
        done.messages,
        [
            b"\x01{\"kind\":\"agent\",\"status\":503,\"error\":{\"kind\":\"demo\",\"error\":\"the demo agent refuses this loop (demo:refuse)\"}}"
                .to_vec()
        ]
    );

    // Refused with a text body: the proxy wraps it.
    let (_, _, result) = run(&url, "demo:refuse-text").await;
    assert_eq!(
        result,
        Outcome::NoLoop(ErrorValue::new(json!({
            "kind": "agent",
            "status": 500,
            "error": "the demo agent refuses this loop in plain text (demo:refuse-text)"
        })))
    );

    // Load: N chunks of SIZE bytes, numbered, none lost.
    let (_, chunks, result) = run(&url, "demo:load=300x1000").await;
    assert_eq!(result, Outcome::Finished { fatal: false });
    assert_eq!(chunks.len(), 300);
    for (n, chunk) in chunks.iter().enumerate() {
        assert_eq!(seq(chunk), Some(n as u64));
        match chunk {
            AgenticLoopChunk::AssistantTextContent(text) => assert_eq!(text.text.len(), 1000),
            other => panic!("not text: {other:?}"),
        }
    }
    stop.cancel();
}

#[tokio::test]
async fn large_load_chunks_reach_the_socket_whole() {
    let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
    let (agent, task) = AgentServer::bind(loopback, Arc::new(Demo::new()))
        .await
        .expect("binds")
        .spawn();
    let prompt = "demo:load=3x200000";
    // In a workspace build reqwest has runloop-oci's TLS with no provider.
    runloop::tls::install_default_provider();
    let response = reqwest::Client::new()
        .post(format!("{}/run", agent.url()))
        .body(RunLoopRequest::new(prompt).json().to_vec())
        .send()
        .await
        .expect("answers");
    assert_eq!(response.status(), 200);
    let body = response.bytes().await.expect("a whole body");
    let body = std::str::from_utf8(&body).expect("UTF-8");
    let events: Vec<&str> = body
        .strip_suffix("\n\n")
        .expect("the last event ends")
        .split("\n\n")
        .collect();
    assert_eq!(events.len(), 3);
    let expected = direct(prompt).await;
    assert_eq!(expected.len(), 3);
    for (n, (event, expected)) in events.iter().zip(expected).enumerate() {
        let json = event.strip_prefix("data: ").expect("one data line");
        assert!(!json.contains('\n'));
        let chunk: AgenticLoopChunk = serde_json::from_str(json).expect("a chunk");
        assert_eq!(seq(&chunk), Some(n as u64));
        let AgenticLoopChunk::AssistantTextContent(text) = &chunk else {
            panic!("not text: {chunk:?}");
        };
        assert_eq!(text.text.len(), 200_000);
        let letters = b"abcdefghijklmnopqrstuvwxyz";
        assert!(
            text.text
                .bytes()
                .enumerate()
                .all(|(at, letter)| letter == letters[(n + at) % 26]),
            "chunk {n}'s letters"
        );
        assert_eq!(chunk, expected.expect("no break"));
    }
    agent.shutdown();
    task.await.expect("joins").expect("the agent program ran");
}

#[tokio::test]
async fn a_prompt_of_megabytes_runs() {
    let stop = CancellationToken::new();
    let url = demo_behind_proxy(&stop).await;
    register(&url).await;
    // Past axum's default body limit of 2 MB.
    let prompt = "x".repeat(2_200_000);
    let (_, chunks, result) = run(&url, &prompt).await;
    assert_eq!(result, Outcome::Finished { fatal: false });
    assert_eq!(chunks.len(), direct(&prompt).await.len());
    stop.cancel();
}

#[tokio::test]
async fn a_refused_registration_reaches_the_server_as_the_agent_s() {
    let stop = CancellationToken::new();
    let url = demo_behind_proxy(&stop).await;
    let done = exchange(&url, "/agent/register", br#"{"agent":"demo:refuse"}"#).await;
    assert_eq!(done.end, End::Clean);
    assert_eq!(
        done.messages
            .iter()
            .map(|m| error_json(m))
            .collect::<Vec<_>>(),
        [json!({
            "kind": "agent",
            "status": 403,
            "error": {"kind": "demo", "error": "the demo agent refuses this registration (demo:refuse)"}
        })]
    );
    // It did not count as the one registration.
    register(&url).await;
    stop.cancel();
}

#[tokio::test]
async fn a_loop_running_when_the_agent_program_shuts_down_is_unfinished() {
    let (agent_stop, agent_task, stop) = demo_and_proxy().await;
    let url = stop.url();
    register(&url).await;

    // A paced loop is still running when the agent program shuts down.
    let mut ws = path::open(&url, "/agent/run").await;
    path::ask(&mut ws, RunLoopRequest::new("demo:pace=50 slow").json()).await;
    let first = path::next_binary(&mut ws).await.expect("a chunk");
    agent_stop.shutdown();
    let mut done = path::rest(ws).await;
    done.messages.insert(0, first);
    let (_, result) = outcome(&done);
    assert_eq!(result.name(), "unfinished", "{result}");
    agent_task
        .await
        .expect("joins")
        .expect("the agent program ran");
    stop.shutdown();
}

#[tokio::test]
async fn the_builtin_runtime_runs_the_demo_and_stops() {
    let runtime = Builtin::demo();
    let container = runtime
        .start(ContainerLimits::new(1 << 30, 0))
        .await
        .expect("starts");
    let url = container.proxy_url().to_owned();
    register(&url).await;
    let (_, chunks, result) = run(&url, "hello builtin").await;
    assert_eq!(result, Outcome::Finished { fatal: false });
    assert!(!chunks.is_empty());
    container.stop().await;
    let address = url.trim_start_matches("ws://");
    assert!(
        tokio::net::TcpStream::connect(address).await.is_err(),
        "the proxy's port is closed after stop"
    );
}
