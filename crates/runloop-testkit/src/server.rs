//! A server in front of a [`FakeProxy`], runs on it, and what it holds:
//! for the tests of the server's side of the chain.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use runloop_client::{Client, ErrorValue, Event, Run, RunError, RunLoop};
use runloop_proto::Decode;
use runloop_proto::agents_run::RunRequest;
use runloop_proto::run_loop::{AgenticLoopChunk, Outcome};
use runloop_runtime::{Attach, Catalog};
use runloop_server::{Credentials, Server, ServerConfig, ServerHandle, StatsSnapshot};

use crate::fake_proxy::FakeProxy;
use crate::wait::PATIENCE;

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
pub async fn start_run(server: &ServerHandle) -> (Client, Run) {
    let client = Client::connect(&server.url(), "").await.expect("connect");
    let run = client.start(run_request()).await.expect("run starts");
    (client, run)
}

/// One loop of `prompt` in a run of `request` on a new connection to
/// `url` with `credential`: `Ok` when it finished, else the words of why
/// not.
pub async fn served_with(
    url: &str,
    credential: &str,
    request: RunRequest,
    prompt: &str,
) -> Result<(), String> {
    let client = Client::connect(url, credential)
        .await
        .map_err(|e| e.to_string())?;
    let run = client.start(request).await.map_err(|e| e.to_string())?;
    let outcome = run.run_loop(prompt).outcome().await;
    run.stop().await;
    client.close().await;
    match outcome {
        Outcome::Finished { fatal: false } => Ok(()),
        other => Err(format!("{other:?}")),
    }
}

/// The texts of a loop's chunks (all text chunks), and its outcome.
pub async fn texts(run_loop: RunLoop) -> (Vec<String>, Outcome) {
    let (chunks, outcome) = run_loop.collect_chunks().await;
    let texts = chunks
        .into_iter()
        .map(|c| match c {
            AgenticLoopChunk::AssistantTextContent(t) => t.text,
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
pub fn run_request() -> RunRequest {
    let json = format!(
        r#"{{"image":{{"server":{{"name":"demo","digest":"sha256:{}"}}}},"memory":1073741824,"disk":0,"agent":{{"model":"test"}}}}"#,
        "0".repeat(64)
    );
    RunRequest::decode(json.as_bytes()).expect("request")
}

/// The raw payload of a `containers::agents::run` request for `demo`.
pub fn run_request_payload() -> Vec<u8> {
    let mut payload = vec![0];
    serde_json::to_writer(&mut payload, &run_request()).expect("serializes");
    payload
}

/// Whether the server holds nothing: no connection, scope, container,
/// relay or proxy path (the disregarded and turned-away counts are totals,
/// not holdings).
pub fn holds_nothing(server: &ServerHandle) -> bool {
    let stats = server.stats();
    stats
        == StatsSnapshot {
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

/// The `error` member of a refusal, or a panic saying what came instead.
pub fn refusal(started: Result<Run, RunError>) -> String {
    match started {
        Err(RunError::Refused(error)) => policy_words(&error),
        Err(other) => panic!("refused otherwise: {other}"),
        Ok(_) => panic!("the run started"),
    }
}

/// The `error` member of an error value the server's policy gave.
fn policy_words(error: &ErrorValue) -> String {
    assert_eq!(error.0["kind"], "policy", "{error:?}");
    error.0["error"]
        .as_str()
        .expect("an error string")
        .to_owned()
}

/// A loop on each of `runs`, asked with `prompt` (one whose agent paces
/// its chunks, so that the loop is held open), each relayed as far as its
/// first chunk.
pub async fn held_loops(runs: &[Run], prompt: &str) -> Vec<RunLoop> {
    let mut held = Vec::new();
    for run in runs {
        let mut held_loop = run.run_loop(prompt);
        match held_loop.next().await {
            Some(Event::Chunk { .. }) => {}
            other => panic!("a loop to hold is not relayed: {other:?}"),
        }
        held.push(held_loop);
    }
    held
}

/// The `error` member of a loop on `run`, asked with `prompt`, that the
/// server refused ([`refusal`]'s, for a loop): an error, then the end of a
/// loop that did not run.
pub async fn loop_refusal(run: &Run, prompt: &str) -> String {
    let events: Vec<Event> = run.run_loop(prompt).collect().await;
    match &events[..] {
        [Event::Error(error), Event::End(Outcome::NoLoop(_))] => policy_words(error),
        other => panic!("not refused: {other:?}"),
    }
}
