//! The server's relay and the client's outcomes, over real sockets, against
//! a scripted proxy (protocol §5–§7, §12).

use runloop::client::{Client, Event, RunError};
use runloop::server::Credentials;
use runloop_proto::run_loop::{AgenticLoopChunk, Broken, Outcome};
use runloop_proto::{ErrorKind, ErrorValue};
use runloop_testkit::caller::{Owned, RawClient};
use runloop_testkit::fake_proxy::{FakeProxy, Step};
use runloop_testkit::message::{chunk, error};
use runloop_testkit::server::{hanging_loop, run_request, run_request_payload, server_for, texts};
use runloop_testkit::wait::eventually;
use serde_json::json;

async fn setup() -> (FakeProxy, runloop::server::ServerHandle, Client) {
    let proxy = FakeProxy::start().await;
    let server = server_for(&proxy, Credentials::Any).await;
    let client = Client::connect(&server.url(), "").await.expect("connect");
    (proxy, server, client)
}

fn proxy_error(value: &ErrorValue) -> &str {
    value.value()["error"].as_str().unwrap_or_default()
}

/// Opens `channel` of `scope` with `payload`, a request the server does
/// not serve: it answers with the channel's finish alone.
async fn bare_finish_for(raw: &mut RawClient, scope: u32, channel: u32, payload: &[u8]) {
    raw.send_frame(&runloop_proto::frame::ClientFrame::ChannelRequest {
        scope,
        channel,
        payload,
    })
    .await;
    assert_eq!(
        raw.next_frame().await,
        Some(Owned::ChannelResponseFinish { scope, channel }),
        "{scope}/{channel}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_ending_reaches_the_caller_as_its_outcome() {
    let (proxy, server, client) = setup().await;
    let down = json!({"kind": "agent", "error": "down"});
    proxy.script(
        "finished",
        vec![Step::Send(chunk("a")), Step::Send(chunk("b")), Step::Close],
    );
    proxy.script(
        "unfinished",
        vec![
            Step::Send(chunk("a")),
            Step::Send(error(down.clone())),
            Step::Close,
        ],
    );
    proxy.script(
        "no loop",
        vec![Step::Send(error(down.clone())), Step::Close],
    );
    proxy.script("not served", vec![Step::Close]);

    let run = client.start(run_request()).await.expect("run starts");
    assert_eq!(run.id().len(), 22, "128 bits, base64url");

    let (chunks, outcome) = texts(run.run_loop("finished")).await;
    assert_eq!(chunks, ["a", "b"]);
    assert_eq!(outcome, Outcome::Finished { fatal: false });

    let (chunks, outcome) = texts(run.run_loop("unfinished")).await;
    assert_eq!(chunks, ["a"]);
    assert_eq!(outcome, Outcome::Unfinished(ErrorValue::new(down.clone())));

    let (chunks, outcome) = texts(run.run_loop("no loop")).await;
    assert!(chunks.is_empty());
    assert_eq!(outcome, Outcome::NoLoop(ErrorValue::new(down)));

    assert_eq!(
        run.run_loop("not served").outcome().await,
        Outcome::NotServed
    );

    run.stop().await;
    assert!(run.is_ended());
    eventually("the server lets go of everything", || {
        let stats = server.stats();
        stats.scopes == 0 && stats.containers == 0 && stats.proxy_paths == 0
    })
    .await;
    assert_eq!(
        proxy.events().iter().filter(|e| *e == "register").count(),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunk_bytes_are_relayed_byte_for_byte_even_when_they_do_not_parse() {
    let proxy = FakeProxy::start().await;
    let server = server_for(&proxy, Credentials::Any).await;
    let odd = [
        chunk("plain"),
        b"\x00{ \"type\" : \"assistant_text_content\" , \"text\":\"spaced\\u0041\" }".to_vec(),
        b"\x00this is not JSON at all \xff\xfe".to_vec(),
        b"\x00".to_vec(),
    ];
    let mut steps: Vec<Step> = odd.iter().cloned().map(Step::Send).collect();
    steps.push(Step::Close);
    proxy.script("odd", steps);

    let mut raw = RawClient::authorized(&server.url(), "").await;
    raw.open_run(7).await;
    raw.open_loop(7, 3, "odd").await;
    for expected in &odd {
        assert_eq!(
            raw.next_frame().await,
            Some(Owned::ChannelResponse {
                scope: 7,
                channel: 3,
                payload: expected.clone()
            })
        );
    }
    assert_eq!(
        raw.next_frame().await,
        Some(Owned::ChannelResponseFinish {
            scope: 7,
            channel: 3
        })
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_faults_end_with_the_servers_error_never_a_bare_finish() {
    let (proxy, _server, client) = setup().await;
    proxy.script(
        "empty",
        vec![Step::Send(chunk("a")), Step::Send(vec![]), Step::AwaitClose],
    );
    proxy.script(
        "unknown tag",
        vec![Step::Send(vec![7, b'{', b'}']), Step::AwaitClose],
    );
    proxy.script("abort at start", vec![Step::Abort]);
    proxy.script(
        "abort mid",
        vec![Step::Send(chunk("a")), Step::Send(chunk("b")), Step::Abort],
    );
    let run = client.start(run_request()).await.expect("run starts");

    let (chunks, outcome) = texts(run.run_loop("empty")).await;
    assert_eq!(chunks, ["a"]);
    let Outcome::Unfinished(error) = outcome else {
        panic!("{outcome:?}")
    };
    assert_eq!(
        error,
        ErrorValue::kind(ErrorKind::Proxy, "the proxy sent an empty message")
    );
    proxy.wait_for("closed empty").await;

    let outcome = run.run_loop("unknown tag").outcome().await;
    assert_eq!(
        outcome,
        Outcome::NoLoop(ErrorValue::kind(
            ErrorKind::Proxy,
            "the proxy sent a message with unknown tag 7"
        ))
    );
    proxy.wait_for("closed unknown tag").await;

    let outcome = run.run_loop("abort at start").outcome().await;
    let Outcome::NoLoop(error) = outcome else {
        panic!("{outcome:?}")
    };
    assert!(
        proxy_error(&error).starts_with("the proxy path ended abruptly"),
        "{error}"
    );

    let (chunks, outcome) = texts(run.run_loop("abort mid")).await;
    assert_eq!(chunks, ["a", "b"]);
    let Outcome::Unfinished(error) = outcome else {
        panic!("{outcome:?}")
    };
    assert!(
        proxy_error(&error).starts_with("the proxy path ended abruptly"),
        "{error}"
    );
}

/// protocol §12, the proxy's error is the end: passed on at once as the last
/// response, the channel finished and the path closed, whatever the proxy
/// does next — go on sending, break the path, or hang without closing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxys_error_is_the_end_of_the_loop_whatever_follows_it() {
    let (proxy, server, client) = setup().await;
    let down = json!({"kind": "agent", "error": "down"});
    let numbered = |k: usize| (0..k).map(|n| Step::Send(chunk(&n.to_string())));
    let mut cases: Vec<(String, Vec<Step>, usize)> = Vec::new();
    for k in [0, 2] {
        let after = [
            ("hang", vec![Step::Hang]),
            ("a chunk", vec![Step::Send(chunk("late")), Step::Hang]),
            (
                "an error",
                vec![Step::Send(error(json!("again"))), Step::AwaitClose],
            ),
            (
                "an empty message",
                vec![Step::Send(vec![]), Step::AwaitClose],
            ),
            ("abort", vec![Step::Abort]),
            ("close", vec![Step::Close]),
        ];
        for (what, then) in after {
            let steps = numbered(k)
                .chain([Step::Send(error(down.clone()))])
                .chain(then)
                .collect();
            cases.push((format!("{k} chunks, the error, then {what}"), steps, k));
        }
    }
    for (prompt, steps, _) in &cases {
        proxy.script(prompt, steps.clone());
    }
    let run = client.start(run_request()).await.expect("run starts");
    for (prompt, steps, k) in &cases {
        // A safety net against the old hang, not a timing assertion.
        let (chunks, outcome) = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            texts(run.run_loop(prompt.as_str())),
        )
        .await
        .unwrap_or_else(|_| panic!("{prompt}: the loop never ended"));
        let expected: Vec<String> = (0..*k).map(|n| n.to_string()).collect();
        assert_eq!(chunks, expected, "{prompt}: nothing after the error");
        let error = ErrorValue::new(down.clone());
        let expected = if *k == 0 {
            Outcome::NoLoop(error)
        } else {
            Outcome::Unfinished(error)
        };
        assert_eq!(outcome, expected, "{prompt}: the proxy's error, as it came");
        match steps.last() {
            // The server gave up on the close handshake and dropped the socket.
            Some(Step::Hang) => proxy.wait_for(&format!("dropped {prompt}")).await,
            Some(Step::AwaitClose) => proxy.wait_for(&format!("closed {prompt}")).await,
            _ => {}
        }
    }
    eventually("the server lets go of every proxy path", || {
        server.stats().proxy_paths == 0 && server.stats().relays == 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_loop_while_one_runs_gets_the_proxys_error_first() {
    let (proxy, _server, client) = setup().await;
    proxy.script(
        "long",
        vec![
            Step::BusyCheck,
            Step::Send(chunk("working")),
            Step::AwaitClose,
        ],
    );
    proxy.script(
        "second",
        vec![Step::BusyCheck, Step::Send(chunk("never")), Step::Close],
    );
    let run = client.start(run_request()).await.expect("run starts");
    let mut first = run.run_loop("long");
    let Some(Event::Chunk { chunk, .. }) = futures_util::StreamExt::next(&mut first).await else {
        panic!("the first loop runs");
    };
    assert!(matches!(chunk, AgenticLoopChunk::AssistantTextContent(t) if t.text == "working"));
    let outcome = run.run_loop("second").outcome().await;
    assert_eq!(
        outcome,
        Outcome::NoLoop(ErrorValue::new(
            json!({"kind": "agent", "error": "a loop is already running"})
        ))
    );
    run.stop().await;
    let outcome = first.outcome().await;
    assert_eq!(
        outcome,
        Outcome::Unfinished(ErrorValue::kind(ErrorKind::Run, "the run was stopped"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_in_the_middle_of_a_loop_ends_it_unfinished_and_closes_the_path() {
    let (proxy, server, client) = setup().await;
    proxy.script_hang();
    let run = client.start(run_request()).await.expect("run starts");
    let run_loop = hanging_loop(&run).await;
    run.stop().await;
    proxy.wait_for("closed hang").await;
    assert_eq!(
        run_loop.outcome().await,
        Outcome::Unfinished(ErrorValue::kind(ErrorKind::Run, "the run was stopped"))
    );
    // A second stop on an ended run does nothing and does not hang.
    run.stop().await;
    eventually("the run's resources are released", || {
        let stats = server.stats();
        stats.scopes == 0 && stats.containers == 0 && stats.proxy_paths == 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_disconnects_mid_loop_leaves_nothing_behind() {
    let (proxy, server, client) = setup().await;
    proxy.script_hang();
    let run = client.start(run_request()).await.expect("run starts");
    let run_loop = hanging_loop(&run).await;
    assert_eq!(server.stats().proxy_paths, 1);
    client.close().await;
    assert_eq!(
        run_loop.outcome().await,
        Outcome::Broken(Broken::ConnectionEnded)
    );
    proxy.wait_for("closed hang").await;
    eventually("the server lets go of everything", || {
        server.stats() == runloop::server::StatsSnapshot::default()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_frames_and_duplicate_numbers_do_not_disturb_a_running_loop() {
    let proxy = FakeProxy::start().await;
    let server = server_for(&proxy, Credentials::Any).await;
    proxy.script("steady", vec![Step::Send(chunk("1")), Step::AwaitClose]);
    let mut raw = RawClient::authorized(&server.url(), "").await;
    raw.open_run(1).await;
    raw.open_loop(1, 0, "steady").await;
    assert_eq!(
        raw.next_frame().await,
        Some(Owned::ChannelResponse {
            scope: 1,
            channel: 0,
            payload: chunk("1")
        })
    );
    let before = server.stats().disregarded;
    // Truncated frames of every length, types a client may not send, a
    // request on the open scope, a channel request on the open channel, a
    // channel on a scope that is not open, responses to channels never opened.
    for len in 0..9 {
        raw.send(vec![4; len]).await;
    }
    raw.send(vec![2, 0, 0, 0, 1, 0, 0, 0, 0]).await;
    raw.send(vec![3, 0, 0, 0, 1, 0, 0, 0, 0]).await;
    raw.send(vec![9, 0, 0, 0, 1, 0, 0, 0, 0]).await;
    raw.send_frame(&runloop_proto::frame::ClientFrame::Request {
        scope: 1,
        payload: &run_request_payload(),
    })
    .await;
    raw.open_loop(1, 0, "steady").await;
    raw.open_loop(99, 0, "steady").await;
    raw.send_frame(&runloop_proto::frame::ClientFrame::ChannelResponse {
        scope: 1,
        channel: 5,
        payload: b"x",
    })
    .await;
    raw.send_frame(&runloop_proto::frame::ClientFrame::ChannelResponseFinish {
        scope: 1,
        channel: 5,
    })
    .await;
    let sent = 9 + 3 + 5;
    eventually("every malformed frame is counted", || {
        server.stats().disregarded == before + sent
    })
    .await;
    // Unserved things get bare finishes: an unknown endpoint, a channel this
    // server does not serve, a channel request that does not decode.
    raw.send_frame(&runloop_proto::frame::ClientFrame::Request {
        scope: 2,
        payload: &[9],
    })
    .await;
    assert_eq!(
        raw.next_frame().await,
        Some(Owned::ResponseFinish { scope: 2 })
    );
    bare_finish_for(&mut raw, 1, 1, &[1]).await;
    bare_finish_for(&mut raw, 1, 2, b"\x05{}").await;
    // The loop is untouched: it is still open, and ends when the run stops.
    raw.send_frame(&runloop_proto::frame::ClientFrame::ChannelRequest {
        scope: 1,
        channel: 7,
        payload: &[0],
    })
    .await;
    let Some(Owned::ChannelResponse {
        scope: 1,
        channel: 0,
        payload,
    }) = raw.next_frame().await
    else {
        panic!("the loop ends with the run's error");
    };
    assert_eq!(payload[0], 1);
    assert_eq!(
        raw.next_frame().await,
        Some(Owned::ChannelResponseFinish {
            scope: 1,
            channel: 0
        })
    );
    assert_eq!(
        raw.next_frame().await,
        Some(Owned::ResponseFinish { scope: 1 })
    );
    proxy.wait_for("closed steady").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authorization_accepted_rejected_and_repeated() {
    let proxy = FakeProxy::start().await;
    let server = server_for(&proxy, Credentials::Tokens(vec!["right".into()])).await;

    // Accepted: the connection simply works.
    let client = Client::connect(&server.url(), "right")
        .await
        .expect("connect");
    let run = client
        .start(run_request())
        .await
        .expect("an accepted credential works");
    run.stop().await;

    // Rejected: closed, and no frame answers.
    let mut raw = RawClient::authorized(&server.url(), "wrong").await;
    raw.send_frame(&runloop_proto::frame::ClientFrame::Request {
        scope: 0,
        payload: &run_request_payload(),
    })
    .await;
    assert_eq!(
        raw.next_frame().await,
        None,
        "a rejected credential gets no frame"
    );
    let client = Client::connect(&server.url(), "wrong")
        .await
        .expect("the socket opens");
    assert_eq!(
        client.start(run_request()).await.err(),
        Some(RunError::CredentialRefused)
    );

    // Repeated: a second authorization ends the connection.
    let mut raw = RawClient::authorized(&server.url(), "right").await;
    raw.open_run(4).await;
    raw.send_frame(&runloop_proto::frame::ClientFrame::Authorization {
        payload: b"\x00right",
    })
    .await;
    // The connection ends; its run ends first, so its finish may still come.
    let mut rest = Vec::new();
    while let Some(frame) = raw.next_frame().await {
        rest.push(frame);
    }
    assert!(
        rest.iter()
            .all(|f| *f == Owned::ResponseFinish { scope: 4 }),
        "{rest:?}"
    );
    eventually("the repeated connection's run is ended", || {
        server.stats().scopes == 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_runs_get_one_error_then_the_finish() {
    let proxy = FakeProxy::start().await;
    let server = server_for(&proxy, Credentials::Any).await;
    let client = Client::connect(&server.url(), "").await.expect("connect");
    let refused = |mut request: runloop_proto::agents_run::RunRequest,
                   edit: &dyn Fn(&mut runloop_proto::agents_run::RunRequest)| {
        edit(&mut request);
        request
    };
    let cases: Vec<(runloop_proto::agents_run::RunRequest, &str)> = vec![
        (
            refused(run_request(), &|r| {
                r.container.image = runloop_proto::agents_run::Image::Registry(
                    runloop_proto::agents_run::RegistryImage {
                        reference: "r.io/a:1".into(),
                    },
                )
            }),
            "registry images are not run here",
        ),
        (
            refused(run_request(), &|r| {
                r.container.image =
                    runloop_proto::agents_run::Image::Server(runloop_proto::agents_run::ImageRef {
                        name: "unknown".into(),
                        digest: format!("sha256:{}", "0".repeat(64)),
                    })
            }),
            "image \"unknown\" is not in this server's catalog",
        ),
        (
            refused(run_request(), &|r| {
                r.container
                    .fuse_file_mounts
                    .push(runloop_proto::agents_run::FuseMount {
                        container_path: vec!["f".into()],
                        id: 1,
                        readonly: None,
                    })
            }),
            "fuse_file_mounts is refused",
        ),
        (
            refused(run_request(), &|r| r.container.memory = 0),
            "memory must be at least 1 byte",
        ),
    ];
    for (request, expected) in cases {
        let Err(RunError::Refused(error)) = client.start(request).await else {
            panic!("{expected} should be refused");
        };
        assert!(
            proxy_error(&error).contains(expected),
            "{error} should say {expected}"
        );
    }
    assert!(
        proxy.events().is_empty(),
        "nothing refused reaches the proxy: {:?}",
        proxy.events()
    );
    eventually("no scope is left open", || server.stats().scopes == 0).await;
}
