//! Clean ends on proxy paths (protocol §12): every WebSocket the server and the
//! proxy close on purpose closes with a handshake, so a healthy loop through
//! the builtin demo logs nothing that says "broke", even at debug level.
//!
//! Every event of this test binary goes into a buffer; the server, its
//! builtin proxy and the demo agent program all run in this process.

use futures_util::StreamExt;
use runloop::client::Event;
use runloop::runtime::Catalog;
use runloop::server::{Credentials, Server, ServerConfig};
use runloop_proto::run_loop::Outcome;
use runloop_testkit::logs::Logs;
use runloop_testkit::server::{released, start_run};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthy_loops_through_the_builtin_demo_log_no_broken_path() {
    let logs = Logs::global(tracing::Level::DEBUG);

    let config = ServerConfig::new(Credentials::Any, Catalog::demo());
    let server = Server::bind("127.0.0.1:0", config).await.expect("bind");
    let (server, _task) = server.spawn();
    let (client, run) = start_run(&server).await;
    for prompt in ["one loop", "and another", "a third, to be sure"] {
        let outcome = run.run_loop(prompt).outcome().await;
        assert_eq!(outcome, Outcome::Finished { fatal: false });
    }
    // Loops that do not finish still end their paths on purpose: the proxy
    // says its error and closes, and the server closes when it is done.
    let outcome = run.run_loop("demo:break").outcome().await;
    assert!(matches!(outcome, Outcome::Unfinished(_)), "{outcome:?}");
    let outcome = run.run_loop("demo:refuse").outcome().await;
    assert!(matches!(outcome, Outcome::NoLoop(_)), "{outcome:?}");
    // And a loop the server ends itself: its path closes with a handshake too.
    let mut stopped = run.run_loop("demo:pace=100 stop me");
    assert!(matches!(stopped.next().await, Some(Event::Chunk { .. })));
    run.stop().await;
    let outcome = stopped.outcome().await;
    assert!(matches!(outcome, Outcome::Unfinished(_)), "{outcome:?}");
    client.close().await;
    released(&server).await;

    let text = logs.text();
    // The proxy paths were there and ended, at debug...
    for expected in [
        "agent registered",
        "loop finished",
        "run-loop channel finished",
    ] {
        assert!(text.contains(expected), "{expected:?} is logged:\n{text}");
    }
    // ...and none of them broke: not on the proxy's side, not on the server's.
    // (An agent program's stream that breaks, `demo:break`, is logged as
    // such: that one did break, and is no path's close.)
    let paths = [
        "runloop_proxy",
        "runloop_server::relay",
        "runloop_server::proxy_path",
    ];
    let broke: Vec<&str> = text
        .lines()
        .filter(|line| paths.iter().any(|target| line.contains(target)))
        .filter(|line| {
            [
                "path broke",
                "broke during the close",
                "did not finish the close",
            ]
            .iter()
            .any(|words| line.contains(words))
        })
        .collect();
    assert!(
        broke.is_empty(),
        "a healthy loop logged a broken path: {broke:#?}"
    );
}
