//! Many runs and loops on one connection, and the server's graceful
//! shutdown, over real sockets against a scripted proxy.

use futures_util::future::join_all;
use runloop::client::Client;
use runloop::server::{Credentials, Server, ServerConfig};
use runloop_proto::run_loop::{AgenticLoopChunk, Outcome};
use runloop_proto::{ErrorKind, ErrorValue};
use runloop_testkit::fake_proxy::{FakeProxy, Step};
use runloop_testkit::message::chunk;
use runloop_testkit::server::{hanging_loop, run_request, server_for, start_run};
use runloop_testkit::wait::eventually;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_runs_and_loops_at_once_on_one_connection() {
    let proxy = FakeProxy::start().await;
    let server = server_for(&proxy, Credentials::Any).await;
    let client = Client::connect(&server.url(), "").await.expect("connect");
    for n in 0..4 {
        let steps = (0..50)
            .map(|i| Step::Send(chunk(&format!("{n}:{i}"))))
            .chain([Step::Close]);
        proxy.script(&format!("loop {n}"), steps.collect());
    }
    let runs = join_all((0..3).map(|_| client.start(run_request()))).await;
    let runs: Vec<_> = runs.into_iter().map(|r| r.expect("run starts")).collect();
    let mut ids: Vec<_> = runs.iter().map(|r| r.id().to_owned()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 3, "ids are unique");

    let loops = runs
        .iter()
        .flat_map(|run| (0..4).map(move |n| (n, run.run_loop(format!("loop {n}")))));
    let results =
        join_all(loops.map(|(n, run_loop)| async move { (n, run_loop.transcript().await) })).await;
    assert_eq!(results.len(), 12);
    for (n, (transcript, outcome)) in results {
        assert_eq!(outcome, Outcome::Finished { fatal: false });
        // Fifty adjacent text deltas coalesce into one chunk, in order.
        let [AgenticLoopChunk::AssistantTextContent(text)] = transcript.chunks() else {
            panic!("one coalesced text chunk: {:?}", transcript.chunks());
        };
        let expected: String = (0..50).map(|i| format!("{n}:{i}")).collect();
        assert_eq!(text.text, expected);
    }
    for run in &runs {
        run.stop().await;
    }
    eventually("everything is released", || server.stats().scopes == 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_every_handle_stops_the_run() {
    let proxy = FakeProxy::start().await;
    let server = server_for(&proxy, Credentials::Any).await;
    let (client, run) = start_run(&server).await;
    assert_eq!(server.stats().scopes, 1);
    drop(run);
    eventually("the forgotten run is stopped", || {
        server.stats().scopes == 0
    })
    .await;
    assert!(!client.is_closed(), "the connection stays");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_ends_loops_with_an_error_and_finishes_runs() {
    let proxy = FakeProxy::start().await;
    proxy.script_hang();
    let mut catalog = runloop::runtime::Catalog::new();
    catalog.insert(
        "demo",
        None,
        std::sync::Arc::new(runloop::runtime::Attach::new(proxy.url())),
    );
    let server = Server::bind("127.0.0.1:0", ServerConfig::new(Credentials::Any, catalog))
        .await
        .expect("bind");
    let (handle, serving) = server.spawn();
    let client = Client::connect(&handle.url(), "").await.expect("connect");
    let run = client.start(run_request()).await.expect("run starts");
    let run_loop = hanging_loop(&run).await;

    handle.shutdown();
    assert_eq!(
        run_loop.outcome().await,
        Outcome::Unfinished(ErrorValue::kind(
            ErrorKind::Server,
            "the server is shutting down"
        ))
    );
    run.ended().await;
    proxy.wait_for("closed hang").await;
    serving.await.expect("the server task ends");
    assert_eq!(
        handle.stats(),
        runloop::server::StatsSnapshot {
            disregarded: 0,
            ..Default::default()
        }
    );
    client.closed().await;
    assert!(
        tokio::net::TcpStream::connect(handle.local_addr())
            .await
            .is_err(),
        "no longer accepting"
    );
}
