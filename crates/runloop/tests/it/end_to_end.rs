//! The whole path, over real sockets and processes: client → server →
//! proxy → agent program, for the builtin, exec and attach runtimes, with
//! the caller's `Outcome` for every ending the demo agent can show.

use std::sync::Arc;

use futures_util::StreamExt;
use runloop::agent::demo::SEQ;
use runloop::client::{Client, Event, RunError};
use runloop::runtime::{AgentSpec, Attach, Catalog};
use runloop::server::{Credentials, Server, ServerConfig, ServerHandle};
use runloop_proto::run_loop::{AgenticLoopChunk, Outcome};
use runloop_testkit::server::{run_request, start_run};
use runloop_testkit::wait::eventually;

async fn serve(catalog: Catalog) -> ServerHandle {
    let server = Server::bind("127.0.0.1:0", ServerConfig::new(Credentials::Any, catalog))
        .await
        .expect("bind");
    server.spawn().0
}

/// The `_meta` sequence number of a demo chunk.
fn seq(json: &[u8]) -> u64 {
    let value: serde_json::Value = serde_json::from_slice(json).expect("chunk JSON");
    value["_meta"][SEQ].as_u64().expect("numbered")
}

/// Runs one loop and checks the demo's numbering: 0, 1, 2… with no gap.
async fn run_numbered(client: &Client, prompt: &str) -> (Vec<AgenticLoopChunk>, Outcome) {
    let run = client.start(run_request()).await.expect("run starts");
    let mut run_loop = run.run_loop(prompt);
    let mut chunks = Vec::new();
    let outcome = loop {
        match run_loop.next().await.expect("an event") {
            Event::Chunk { chunk, json } => {
                assert_eq!(seq(&json), chunks.len() as u64, "in order, nothing lost");
                chunks.push(chunk);
            }
            Event::Error(_) => {}
            Event::End(outcome) => break outcome,
        }
    };
    run.stop().await;
    (chunks, outcome)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_builtin_demo_shows_every_ending() {
    let server = serve(Catalog::demo()).await;
    let client = Client::connect(&server.url(), "").await.expect("connect");

    let (chunks, outcome) = run_numbered(&client, "count these five words please").await;
    assert_eq!(outcome, Outcome::Finished { fatal: false });
    crate::agent::shows_the_demo_s_kinds(&chunks);

    let (_, outcome) = run_numbered(&client, "please demo:fatal").await;
    assert_eq!(outcome, Outcome::Finished { fatal: true });

    let (chunks, outcome) = run_numbered(&client, "please demo:break").await;
    assert!(!chunks.is_empty());
    assert!(matches!(outcome, Outcome::Unfinished(_)), "{outcome:?}");

    let (chunks, outcome) = run_numbered(&client, "please demo:refuse").await;
    assert!(chunks.is_empty());
    assert!(matches!(outcome, Outcome::NoLoop(_)), "{outcome:?}");

    let (chunks, outcome) = run_numbered(&client, "demo:load=500x200").await;
    assert_eq!(chunks.len(), 500);
    assert_eq!(outcome, Outcome::Finished { fatal: false });

    eventually("every builtin container stopped", || {
        server.stats().containers == 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_registration_refuses_the_run() {
    let server = serve(Catalog::demo()).await;
    let client = Client::connect(&server.url(), "").await.expect("connect");
    let mut request = run_request();
    request.agent =
        serde_json::value::RawValue::from_string("\"demo:refuse\"".into()).expect("JSON");
    let Err(RunError::Refused(error)) = client.start(request).await else {
        panic!("the registration is refused");
    };
    // The agent's own error reaches the caller, under the agent's kind.
    assert_eq!(error.value()["kind"], "agent", "{error}");
    assert_eq!(error.value()["status"], 403, "{error}");
    assert_eq!(error.value()["error"]["kind"], "demo", "{error}");
    eventually("the container is stopped", || {
        server.stats().containers == 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_agent_program_runs_behind_the_server_and_is_reaped() {
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/sse_agent.py");
    let mut catalog = Catalog::new().with_exec(runloop::runtime::ExecConfig {
        disk: runloop::runtime::DiskPolicy::Unenforced,
        ..Default::default()
    });
    catalog
        .add(
            format!("demo=exec:python3 {fixture}")
                .parse::<AgentSpec>()
                .expect("spec"),
        )
        .expect("an exec spec is added");
    let server = serve(catalog).await;
    let (_client, run) = start_run(&server).await;
    let (chunks, outcome) = run.run_loop("hello").collect_chunks().await;
    assert_eq!(outcome, Outcome::Finished { fatal: false });
    assert!(!chunks.is_empty());
    run.stop().await;
    eventually("the child is stopped", || server.stats().containers == 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attached_proxy_serves_one_run() {
    // A container started "elsewhere": the demo agent program and a proxy.
    let (agent, _, proxy) = crate::agent::demo_and_proxy().await;
    let proxy_url = proxy.url();

    let mut catalog = Catalog::new();
    catalog.insert("demo", None, Arc::new(Attach::new(proxy_url)));
    let server = serve(catalog).await;
    let client = Client::connect(&server.url(), "").await.expect("connect");
    let (_, outcome) = run_numbered(&client, "attached").await;
    assert_eq!(outcome, Outcome::Finished { fatal: false });
    // A proxy takes one registration in its life: the next run is refused.
    assert!(matches!(
        client.start(run_request()).await,
        Err(RunError::Refused(_))
    ));
    proxy.shutdown();
    agent.shutdown();
}
