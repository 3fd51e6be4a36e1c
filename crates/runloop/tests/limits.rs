//! The server's limits and deadlines, over real sockets: backpressure from a
//! slow caller, scope and channel limits, oversize messages, the
//! authorization grace period, and the connection limit.

use std::sync::atomic::Ordering;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::future::join_all;
use runloop::client::{Client, RunError};
use runloop::server::Credentials;
use runloop_proto::frame::ClientFrame;
use runloop_proto::run_loop::Outcome;
use runloop_testkit::caller::{Owned, RawClient};
use runloop_testkit::fake_proxy::{FakeProxy, Step};
use runloop_testkit::message::chunk;
use runloop_testkit::server::{
    hanging_loop, released, run_request, run_request_payload, server_with, texts,
};
use runloop_testkit::wait::{PATIENCE, eventually};
use tokio::io::AsyncReadExt;
use tokio_tungstenite::tungstenite::Message;

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("procfs");
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .expect("VmRSS");
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .expect("value")
        .parse()
        .expect("number");
    kib * 1024
}

/// Waits until the flood stops advancing: the proxy is blocked.
async fn settled(proxy: &FakeProxy) -> u64 {
    let mut last = u64::MAX;
    let mut still = 0;
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = proxy.sent.load(Ordering::SeqCst);
        if now == last {
            still += 1;
            if still == 10 {
                return now;
            }
        } else {
            still = 0;
            last = now;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_caller_slows_the_proxy_instead_of_growing_the_server() {
    const COUNT: usize = 2000;
    const SIZE: usize = 64 * 1024;
    let proxy = FakeProxy::start().await;
    proxy.script(
        "flood",
        vec![
            Step::Flood {
                count: COUNT,
                size: SIZE,
            },
            Step::Close,
        ],
    );
    let server = server_with(&proxy, Credentials::Any, |config| {
        config.limits.max_queued_responses = 8;
    })
    .await;
    let mut raw = RawClient::authorized(&server.url(), "").await;
    raw.open_run(0).await;
    let rss_before = rss_bytes();
    raw.open_loop(0, 0, "flood").await;

    // The caller reads nothing. The proxy can only get as far as the
    // queues and the sockets' buffers let it.
    let sent = settled(&proxy).await;
    let rss_growth = rss_bytes().saturating_sub(rss_before);
    let offered = (COUNT * SIZE) as u64;
    let in_flight = sent * SIZE as u64;
    println!(
        "slow caller: proxy got {sent} of {COUNT} chunks out ({} MiB of {} MiB); process RSS grew {} MiB",
        in_flight >> 20,
        offered >> 20,
        rss_growth >> 20
    );
    assert!(
        in_flight < 48 << 20,
        "{} MiB in flight: backpressure does not hold",
        in_flight >> 20
    );
    assert!(rss_growth < 96 << 20, "RSS grew {} MiB", rss_growth >> 20);

    // Now read: every chunk arrives, in order, then the finish.
    for n in 0..COUNT {
        match raw.next_frame().await {
            Some(Owned::ChannelResponse { payload, .. }) => {
                let json: serde_json::Value = serde_json::from_slice(&payload[1..]).expect("chunk");
                let text = json["text"].as_str().expect("text");
                assert_eq!(
                    text[..10].trim().parse::<usize>().expect("number"),
                    n,
                    "chunk {n} in order"
                );
            }
            other => panic!("chunk {n}: {other:?}"),
        }
    }
    assert_eq!(
        raw.next_frame().await,
        Some(Owned::ChannelResponseFinish {
            scope: 0,
            channel: 0
        })
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_stops_reading_does_not_hold_up_the_others() {
    let proxy = FakeProxy::start().await;
    proxy.script(
        "flood",
        vec![
            Step::Flood {
                count: 2000,
                size: 16 * 1024,
            },
            Step::Close,
        ],
    );
    let quick: Vec<Step> = (0..50)
        .map(|n| Step::Send(chunk(&n.to_string())))
        .chain([Step::Close])
        .collect();
    proxy.script("quick", quick);
    let server = server_with(&proxy, Credentials::Any, |config| {
        config.limits.max_queued_responses = 4;
    })
    .await;
    let mut slow = RawClient::authorized(&server.url(), "").await;
    slow.open_run(0).await;
    slow.open_loop(0, 0, "flood").await;
    let stuck_at = settled(&proxy).await;
    assert!(stuck_at < 2000, "the slow caller's loop is stuck");

    // Three other callers, two runs each, two loops per run, at once.
    let expected: Vec<String> = (0..50).map(|n| n.to_string()).collect();
    let callers = (0..3).map(|_| async {
        let client = Client::connect(&server.url(), "").await.expect("connect");
        let runs = join_all((0..2).map(|_| client.start(run_request()))).await;
        let mut results = Vec::new();
        for run in runs {
            let run = run.expect("run starts");
            let loops = join_all((0..2).map(|_| texts(run.run_loop("quick")))).await;
            results.extend(loops);
            run.stop().await;
        }
        client.close().await;
        results
    });
    for results in join_all(callers).await {
        for (chunks, outcome) in results {
            assert_eq!(outcome, Outcome::Finished { fatal: false });
            assert_eq!(chunks, expected, "every chunk, in order");
        }
    }
    assert_eq!(
        proxy.sent.load(Ordering::SeqCst),
        stuck_at,
        "the slow caller is still stuck where it was"
    );
    eventually("only the slow caller is left, its loop still open", || {
        let stats = server.stats();
        (stats.connections, stats.scopes, stats.relays) == (1, 1, 1)
    })
    .await;
    drop(slow);
    released(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scopes_and_channels_past_their_limits_get_bare_finishes() {
    let proxy = FakeProxy::start().await;
    proxy.script_hang();
    let server = server_with(&proxy, Credentials::Any, |config| {
        config.limits.max_scopes = 2;
        config.limits.max_channels = 1;
    })
    .await;
    let mut raw = RawClient::authorized(&server.url(), "").await;
    raw.open_run(0).await;
    raw.open_run(1).await;
    raw.send_frame(&ClientFrame::Request {
        scope: 2,
        payload: &run_request_payload(),
    })
    .await;
    assert_eq!(
        raw.next_frame().await,
        Some(Owned::ResponseFinish { scope: 2 })
    );

    raw.open_loop(0, 0, "hang").await;
    assert_eq!(
        raw.next_frame().await,
        Some(Owned::ChannelResponse {
            scope: 0,
            channel: 0,
            payload: chunk("a")
        })
    );
    raw.open_loop(0, 1, "hang").await;
    assert_eq!(
        raw.next_frame().await,
        Some(Owned::ChannelResponseFinish {
            scope: 0,
            channel: 1
        })
    );
    // The scope limit frees up when a scope finishes.
    raw.send_frame(&ClientFrame::ChannelRequest {
        scope: 1,
        channel: 0,
        payload: &[0],
    })
    .await;
    assert_eq!(
        raw.next_frame().await,
        Some(Owned::ResponseFinish { scope: 1 })
    );
    raw.open_run(2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_over_the_size_limit_ends_the_connection() {
    let proxy = FakeProxy::start().await;
    let server = server_with(&proxy, Credentials::Any, |config| {
        config.limits.max_message_size = 4096;
    })
    .await;
    let mut raw = RawClient::authorized(&server.url(), "").await;
    raw.open_run(0).await;
    let mut big = vec![5];
    big.extend_from_slice(
        serde_json::json!({"prompt": "x".repeat(8192)})
            .to_string()
            .as_bytes(),
    );
    raw.send_frame(&ClientFrame::ChannelRequest {
        scope: 0,
        channel: 0,
        payload: &big,
    })
    .await;
    while let Some(frame) = raw.next_frame().await {
        assert_eq!(
            frame,
            Owned::ResponseFinish { scope: 0 },
            "only the run's end may follow"
        );
    }
    eventually("the run ends with the connection", || {
        server.stats().scopes == 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_never_authorizes_is_closed_after_the_grace_period() {
    let proxy = FakeProxy::start().await;
    let server = server_with(&proxy, Credentials::Any, |config| {
        config.authorization_grace = Duration::from_secs(1);
    })
    .await;
    let mut raw = RawClient::connect(&server.url()).await;
    assert_eq!(raw.next_frame().await, None, "closed, with no frame");
    eventually("the connection is gone", || server.stats().connections == 0).await;

    // A connection that never even completes the WebSocket handshake holds
    // its slot no longer.
    let mut silent = tokio::net::TcpStream::connect(server.local_addr())
        .await
        .expect("connects");
    eventually("the connection is served", || {
        server.stats().connections == 1
    })
    .await;
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(PATIENCE, silent.read(&mut byte))
        .await
        .expect("closed within the grace period");
    assert!(
        matches!(read, Ok(0) | Err(_)),
        "closed, not answered: {read:?}"
    );
    eventually("the connection is gone", || server.stats().connections == 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_past_the_limit_is_turned_away_with_a_reason() {
    let proxy = FakeProxy::start().await;
    proxy.script_hang();
    let server = server_with(&proxy, Credentials::Any, |config| {
        config.max_connections = 2;
    })
    .await;
    let first = Client::connect(&server.url(), "").await.expect("connects");
    let run = first.start(run_request()).await.expect("a run");
    let _second = RawClient::authorized(&server.url(), "").await;
    eventually("two connections", || server.stats().connections == 2).await;

    // The third completes its handshake and is closed with code 1013 and
    // the server's reason, before anything it sends is read.
    let mut third = RawClient::connect(&server.url()).await;
    let close = match third.ws.next().await {
        Some(Ok(Message::Close(frame))) => frame.expect("a close frame with a code"),
        other => panic!("only a close frame may come, got {other:?}"),
    };
    assert_eq!(u16::from(close.code), 1013);
    assert!(close.reason.contains("try again later"), "{}", close.reason);
    assert_eq!(server.stats().turned_away, 1);

    // Through the client library it is an error that says why.
    let fourth = Client::connect(&server.url(), "").await.expect("connects");
    match fourth.start(run_request()).await {
        Err(RunError::Closed { code: 1013, reason }) => {
            assert!(
                reason.contains("as many connections as it may (2)"),
                "{reason}"
            );
        }
        Err(other) => panic!("expected a close with a reason, got {other}"),
        Ok(_) => panic!("a run past the connection limit"),
    }
    assert_eq!(server.stats().turned_away, 2);

    // The connections being served are untouched, and a slot that frees up
    // is served again.
    drop(hanging_loop(&run).await);
    drop(run);
    first.close().await;
    eventually("one connection", || server.stats().connections == 1).await;
    let again = Client::connect(&server.url(), "").await.expect("connects");
    again.start(run_request()).await.expect("served again");
}
