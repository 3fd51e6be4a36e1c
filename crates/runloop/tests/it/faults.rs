//! Faults, over real sockets and processes: a proxy path that ends badly, an
//! agent program that is killed or never answers, a caller that goes away
//! at every stage, stops racing the end of a run. For each, what the caller
//! is told (never "finished" for a loop that did not finish), and what the
//! server holds afterwards: nothing — no connection, scope, container,
//! relay or proxy path, no task beyond the ones it started with, no socket,
//! and no child process.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures_util::{FutureExt, StreamExt};
use runloop::client::{Client, Event, RunLoop};
use runloop::runtime::{AgentSpec, Attach, Catalog};
use runloop::server::{Credentials, Server, ServerConfig, ServerHandle};
use runloop_proto::frame::ClientFrame;
use runloop_proto::run_loop::{Broken, Outcome};
use runloop_proto::{ErrorKind, ErrorValue};
use runloop_testkit::agent_program::{self, scripted};
use runloop_testkit::caller::{Owned, RawClient};
use runloop_testkit::fake_proxy::{FakeProxy, Step};
use runloop_testkit::message::chunk;
use runloop_testkit::process::reaped;
use runloop_testkit::server::{
    hanging_loop, released, run_request, run_request_payload, server_for, start_run, texts,
};
use runloop_testkit::wait::{PATIENCE, eventually};
use serde_json::json;

use crate::gated::Gated;
use crate::held::{alive_tasks, sockets_closed, tasks_back_to};

fn fixture(name: &str) -> String {
    format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))
}

async fn serve(catalog: Catalog) -> ServerHandle {
    let server = Server::bind("127.0.0.1:0", ServerConfig::new(Credentials::Any, catalog))
        .await
        .expect("bind");
    server.spawn().0
}

fn port(url: &str) -> u16 {
    url.rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("a port")
}

/// After a test's client is gone: the server holds nothing, the runtime is
/// back to the tasks it had before the client came, and no socket to the
/// server or the proxy is open.
/// A real proxy in front of the agent program at `agent`, and a server
/// whose `demo` image attaches to it.
async fn behind_a_real_proxy(
    agent: std::net::SocketAddr,
) -> (agent_program::RunningProxy, ServerHandle) {
    let proxy = agent_program::proxy(agent).await;
    let mut catalog = Catalog::new();
    catalog.insert("demo", None, Arc::new(Attach::new(proxy.url.clone())));
    (proxy, serve(catalog).await)
}

async fn nothing_left(server: &ServerHandle, baseline_tasks: usize, proxy_url: &str) {
    released(server).await;
    tasks_back_to(baseline_tasks).await;
    sockets_closed(server.local_addr().port()).await;
    sockets_closed(port(proxy_url)).await;
}

fn the_error(outcome: &Outcome) -> &serde_json::Value {
    outcome
        .error()
        .unwrap_or_else(|| panic!("{outcome:?} carries no error"))
        .value()
}

fn run_stopped() -> ErrorValue {
    ErrorValue::kind(ErrorKind::Run, "the run was stopped")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_path_that_ends_badly_is_never_a_finish() {
    let proxy = FakeProxy::start().await;
    let server = server_for(&proxy, Credentials::Any).await;
    let baseline = alive_tasks();
    let numbered = |k: usize| (0..k).map(|n| Step::Send(chunk(&n.to_string())));
    let expect = |k: usize| (0..k).map(|n| n.to_string()).collect::<Vec<_>>();

    // (prompt, script, chunks the caller gets, what the server's error says)
    let mut cases: Vec<(String, Vec<Step>, usize, &str)> = Vec::new();
    for k in [0, 1, 7, 100] {
        let abort = numbered(k).chain([Step::Abort]).collect();
        cases.push((
            format!("abort after {k}"),
            abort,
            k,
            "the proxy path ended abruptly",
        ));
        // Bytes on the TCP stream that are no WebSocket frame at all.
        let garbage = numbered(k)
            .chain([Step::Garbage(b"\xff\xfe not a websocket frame".to_vec())])
            .collect();
        cases.push((
            format!("garbage after {k}"),
            garbage,
            k,
            "the proxy path ended abruptly",
        ));
        // A message that is no run-loop payload after valid chunks.
        let unknown = numbered(k)
            .chain([Step::Send(b"\xee{\"junk\":1}".to_vec()), Step::AwaitClose])
            .collect();
        cases.push((
            format!("unknown tag after {k}"),
            unknown,
            k,
            "the proxy sent a message with unknown tag 238",
        ));
    }
    for (prompt, steps, _, _) in &cases {
        proxy.script(prompt, steps.clone());
    }

    let (client, run) = start_run(&server).await;
    for (prompt, steps, k, says) in &cases {
        let (chunks, outcome) = texts(run.run_loop(prompt.as_str())).await;
        assert_eq!(chunks, expect(*k), "{prompt}: every chunk, in order");
        let error = the_error(&outcome);
        match (k, &outcome) {
            (0, Outcome::NoLoop(_)) => {}
            (k, Outcome::Unfinished(_)) if *k > 0 => {}
            _ => panic!("{prompt}: {outcome:?}"),
        }
        assert_eq!(error["kind"], "proxy", "{prompt}: the server's own error");
        let what = error["error"].as_str().expect("words");
        assert!(what.starts_with(says), "{prompt}: {what}");
        if matches!(steps.last(), Some(Step::AwaitClose)) {
            proxy.wait_for(&format!("closed {prompt}")).await;
        }
    }
    run.stop().await;
    client.close().await;
    nothing_left(&server, baseline, &proxy.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_that_never_answers_keeps_the_loop_open_until_the_caller_stops_it() {
    let proxy = FakeProxy::start().await;
    proxy.script("silent", vec![Step::AwaitClose]);
    let server = server_for(&proxy, Credentials::Any).await;
    let baseline = alive_tasks();
    let (client, run) = start_run(&server).await;
    let mut run_loop = run.run_loop("silent");
    proxy.wait_for("run silent").await;
    // No timeout: the loop is open, the path too, and nothing has come.
    assert_eq!(server.stats().relays, 1);
    assert_eq!(server.stats().proxy_paths, 1);
    assert_eq!(run_loop.next().now_or_never(), None, "nothing came");

    run.stop().await;
    assert_eq!(run_loop.outcome().await, Outcome::NoLoop(run_stopped()));
    proxy.wait_for("closed silent").await;
    client.close().await;
    nothing_left(&server, baseline, &proxy.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_program_that_never_answers_behind_a_real_proxy() {
    // The agent program registers, and then takes /run and says nothing.
    let (seen_tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let (agent, _task) = scripted(move |mut conn| {
        let seen = seen_tx.clone();
        async move {
            while let Some(request) = conn.request().await {
                if request.path == "/register" {
                    conn.respond(204, "text/plain", b"").await;
                    continue;
                }
                let _ = seen.send("run");
                if conn.closed_by_peer().await {
                    let _ = seen.send("the proxy left");
                }
                return;
            }
        }
    })
    .await;
    let (proxy, server) = behind_a_real_proxy(agent).await;
    let baseline = alive_tasks();

    let (client, run) = start_run(&server).await;
    let mut run_loop = run.run_loop("hello?");
    assert_eq!(seen.recv().await, Some("run"));
    assert_eq!(run_loop.next().now_or_never(), None, "nothing came");

    run.stop().await;
    assert_eq!(run_loop.outcome().await, Outcome::NoLoop(run_stopped()));
    assert_eq!(
        seen.recv().await,
        Some("the proxy left"),
        "the proxy drops its request to the agent program"
    );
    client.close().await;
    released(&server).await;
    tasks_back_to(baseline).await;
    sockets_closed(server.local_addr().port()).await;
    proxy.handle.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_gone_mid_registration_stops_the_container_and_closes_the_path() {
    let proxy = FakeProxy::start().await;
    proxy.register_hangs.store(true, Ordering::SeqCst);
    let gated = Gated::new(&proxy);
    gated.open(1);
    let server = gated.server().await;
    let baseline = alive_tasks();

    let mut raw = RawClient::authorized(&server.url(), "").await;
    raw.send_frame(&ClientFrame::Request {
        scope: 0,
        payload: &run_request_payload(),
    })
    .await;
    proxy.wait_for("register").await;
    assert_eq!(server.stats().containers, 1);
    drop(raw);

    proxy.wait_for("closed register").await;
    nothing_left(&server, baseline, &proxy.url()).await;
    assert_eq!(
        gated.stopped.load(Ordering::SeqCst),
        1,
        "stopped, not dropped"
    );
    assert_eq!(gated.live.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_gone_between_loops_stops_the_container() {
    let proxy = FakeProxy::start().await;
    proxy.script("one", vec![Step::Send(chunk("1")), Step::Close]);
    let gated = Gated::new(&proxy);
    gated.open(1);
    let server = gated.server().await;
    let baseline = alive_tasks();

    let (client, run) = start_run(&server).await;
    let (chunks, outcome) = texts(run.run_loop("one")).await;
    assert_eq!(
        (chunks, outcome),
        (vec!["1".to_owned()], Outcome::Finished { fatal: false })
    );
    assert_eq!(
        server.stats().containers,
        1,
        "the run goes on between loops"
    );
    client.close().await;
    run.ended().await;

    nothing_left(&server, baseline, &proxy.url()).await;
    assert_eq!(gated.stopped.load(Ordering::SeqCst), 1);
    assert_eq!(gated.live.load(Ordering::SeqCst), 0);
}

/// The pid an `endless_agent.py` loop names in its first chunk, after
/// checking the chunks' numbering.
async fn endless_pid(run_loop: &mut RunLoop, chunks: usize) -> u32 {
    let mut pid = None;
    for n in 0..chunks {
        let Some(Event::Chunk { chunk, json }) = run_loop.next().await else {
            panic!("chunk {n} of an endless loop");
        };
        let value: serde_json::Value = serde_json::from_slice(&json).expect("JSON");
        assert_eq!(value["_meta"]["runloop/seq"], n, "in order, nothing lost");
        if n == 0 {
            let runloop_proto::run_loop::AgenticLoopChunk::AssistantTextContent(text) = chunk
            else {
                panic!("a text chunk first");
            };
            pid = Some(text.text.parse().expect("a pid"));
        }
    }
    pid.expect("at least one chunk")
}

fn exec_catalog(fixture_name: &str) -> Catalog {
    let mut catalog = Catalog::new().with_exec(runloop::runtime::ExecConfig {
        disk: runloop::runtime::DiskPolicy::Unenforced,
        ..Default::default()
    });
    catalog
        .add(
            format!("demo=exec:python3 {}", fixture(fixture_name))
                .parse::<AgentSpec>()
                .expect("spec"),
        )
        .expect("an exec spec is added");
    catalog
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_gone_mid_loop_stops_and_reaps_the_agent_program() {
    let server = serve(exec_catalog("endless_agent.py")).await;
    let baseline = alive_tasks();
    let (client, run) = start_run(&server).await;
    let mut run_loop = run.run_loop("go");
    let pid = endless_pid(&mut run_loop, 3).await;
    assert!(!reaped(pid), "the agent program runs");

    client.close().await;
    assert_eq!(
        run_loop.outcome().await,
        Outcome::Broken(Broken::ConnectionEnded)
    );
    released(&server).await;
    assert!(
        reaped(pid),
        "stopped and reaped before the container is let go"
    );
    tasks_back_to(baseline).await;
    sockets_closed(server.local_addr().port()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_program_killed_mid_stream_is_an_unfinished_loop() {
    let server = serve(exec_catalog("endless_agent.py")).await;
    let baseline = alive_tasks();
    let (client, run) = start_run(&server).await;
    let mut run_loop = run.run_loop("go");
    let pid = endless_pid(&mut run_loop, 3).await;

    // SAFETY: a system call on integers; the pid is our own child's.
    let killed = unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
    assert_eq!(killed, 0, "the test kills the agent program");

    let mut seq = 3;
    let outcome = loop {
        match run_loop.next().await.expect("an event") {
            Event::Chunk { json, .. } => {
                let value: serde_json::Value = serde_json::from_slice(&json).expect("JSON");
                assert_eq!(value["_meta"]["runloop/seq"], seq, "in order, nothing lost");
                seq += 1;
            }
            Event::Error(_) => {}
            Event::End(outcome) => break outcome,
        }
    };
    // The proxy sees the event stream break, and the server sees the child
    // exit; whichever tells first, the loop did not finish.
    let Outcome::Unfinished(error) = &outcome else {
        panic!("{outcome:?}");
    };
    let kind = error.value()["kind"].as_str().unwrap_or_default();
    assert!(kind == "agent" || kind == "container", "{error}");
    // The container's end ends the run by itself.
    run.ended().await;
    client.close().await;
    released(&server).await;
    assert!(reaped(pid), "the killed child is reaped");
    tasks_back_to(baseline).await;
    sockets_closed(server.local_addr().port()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_racing_the_end_of_the_container_ends_the_run_once() {
    let proxy = FakeProxy::start().await;
    proxy.script_hang();
    let gated = Gated::new(&proxy);
    let server = gated.server().await;
    let baseline = alive_tasks();
    let client = Client::connect(&server.url(), "").await.expect("connect");
    const ROUNDS: u64 = 20;
    for round in 0..ROUNDS {
        gated.open(1);
        let run = client.start(run_request()).await.expect("run starts");
        let run_loop = hanging_loop(&run).await;
        // The container ends and the caller stops at the same moment.
        let stop = run.stop();
        gated.end_latest();
        stop.await;
        let outcome = run_loop.outcome().await;
        let Outcome::Unfinished(error) = &outcome else {
            panic!("round {round}: {outcome:?}");
        };
        assert!(
            *error == run_stopped()
                || error.value()["error"] == "the container ended: the test ended it",
            "round {round}: {error}"
        );
        eventually("the container is stopped once", || {
            gated.stopped.load(Ordering::SeqCst) == round + 1
        })
        .await;
    }
    client.close().await;
    nothing_left(&server, baseline, &proxy.url()).await;
    assert_eq!(gated.stopped.load(Ordering::SeqCst), ROUNDS);
    assert_eq!(gated.live.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_racing_an_agent_program_that_exits_at_once() {
    let server = serve(exec_catalog("exits_after_register.py")).await;
    let baseline = alive_tasks();
    let client = Client::connect(&server.url(), "").await.expect("connect");
    for round in 0..2 {
        let run = client
            .start(run_request())
            .await
            .expect("the registration was answered");
        let run_loop = run.run_loop("anyone?");
        run.stop().await;
        let outcome = run_loop.outcome().await;
        // The program is gone or going, and the run with it. If the loop's
        // request reached the server first, there was no loop, and the
        // caller is told so with an error; if the run had ended before it
        // arrived, the scope's finish is all that answers it: the run ended
        // before the loop's finish. Never finished, never "not served".
        assert!(
            matches!(
                outcome,
                Outcome::NoLoop(_) | Outcome::Broken(Broken::RunEnded)
            ),
            "round {round}: {outcome:?}"
        );
    }
    client.close().await;
    released(&server).await;
    tasks_back_to(baseline).await;
    sockets_closed(server.local_addr().port()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_before_the_id_refuses_the_run_and_leaves_nothing() {
    let proxy = FakeProxy::start().await;
    let gated = Gated::new(&proxy);
    let server = gated.server().await;
    let baseline = alive_tasks();
    let stopped_before =
        json!({"kind": "run", "error": "the run was stopped before its container ran"});

    // While the container is starting.
    let mut raw = RawClient::authorized(&server.url(), "").await;
    raw.send_frame(&ClientFrame::Request {
        scope: 0,
        payload: &run_request_payload(),
    })
    .await;
    eventually("the start is asked for", || {
        gated.asked.load(Ordering::SeqCst) == 1
    })
    .await;
    raw.send_frame(&ClientFrame::ChannelRequest {
        scope: 0,
        channel: 0,
        payload: &[0],
    })
    .await;
    let Some(Owned::Response { scope: 0, payload }) = raw.next_frame().await else {
        panic!("the run is refused");
    };
    assert_eq!(payload[0], 1, "an error response");
    let refusal: serde_json::Value = serde_json::from_slice(&payload[1..]).expect("JSON");
    assert_eq!(refusal, stopped_before);
    assert_eq!(
        raw.next_frame().await,
        Some(Owned::ResponseFinish { scope: 0 })
    );
    assert_eq!(
        gated.abandoned.load(Ordering::SeqCst),
        1,
        "the start is dropped"
    );

    // While its agent registers.
    proxy.register_hangs.store(true, Ordering::SeqCst);
    gated.open(1);
    raw.send_frame(&ClientFrame::Request {
        scope: 1,
        payload: &run_request_payload(),
    })
    .await;
    proxy.wait_for("register").await;
    raw.send_frame(&ClientFrame::ChannelRequest {
        scope: 1,
        channel: 0,
        payload: &[0],
    })
    .await;
    let Some(Owned::Response { scope: 1, payload }) = raw.next_frame().await else {
        panic!("the run is refused");
    };
    let refusal: serde_json::Value = serde_json::from_slice(&payload[1..]).expect("JSON");
    assert_eq!(refusal, stopped_before);
    assert_eq!(
        raw.next_frame().await,
        Some(Owned::ResponseFinish { scope: 1 })
    );
    proxy.wait_for("closed register").await;
    eventually("the container is stopped", || {
        gated.stopped.load(Ordering::SeqCst) == 1
    })
    .await;
    drop(raw);
    nothing_left(&server, baseline, &proxy.url()).await;
    assert_eq!(gated.live.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_gives_up_waiting_for_the_id_stops_the_run() {
    let proxy = FakeProxy::start().await;
    let gated = Gated::new(&proxy);
    let server = gated.server().await;
    let client = Client::connect(&server.url(), "").await.expect("connect");

    // The caller stops waiting for the id (a timeout, a select, a
    // cancelled task): the future of `run` is dropped.
    let waiting = tokio::spawn({
        let client = client.clone();
        async move { client.start(run_request()).await }
    });
    eventually("the start is asked for", || {
        gated.asked.load(Ordering::SeqCst) == 1
    })
    .await;
    waiting.abort();
    assert!(waiting.await.expect_err("aborted").is_cancelled());

    eventually("the abandoned start is dropped", || {
        gated.abandoned.load(Ordering::SeqCst) == 1
    })
    .await;
    eventually("the run is gone from the server", || {
        server.stats().scopes == 0
    })
    .await;
    // The connection is still good for the next run.
    gated.open(1);
    let run = client.start(run_request()).await.expect("run starts");
    run.stop().await;
    client.close().await;
    released(&server).await;
    assert_eq!(gated.live.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_reaches_a_loop_whose_proxy_does_not_read_its_ask() {
    let proxy = FakeProxy::start().await;
    proxy.stall_runs.store(true, Ordering::SeqCst);
    let server = server_for(&proxy, Credentials::Any).await;
    let (client, run) = start_run(&server).await;
    // An ask larger than the socket buffers between server and proxy hold:
    // the server's send cannot complete while the proxy reads nothing.
    let run_loop = run.run_loop("x".repeat(12 << 20));
    proxy.wait_for("stalled").await;
    tokio::time::timeout(PATIENCE, run.stop())
        .await
        .expect("the stop is answered although the proxy reads nothing");
    assert_eq!(run_loop.outcome().await, Outcome::NoLoop(run_stopped()));
    client.close().await;
    released(&server).await;
    proxy.release.cancel();
}

/// A real proxy whose agent program's body breaks in the middle of a large
/// chunk, after part of it was sent as fragments: the proxy can say no
/// error inside a fragmented message and must not close cleanly, so it
/// drops the path, and the server reports a loop cut short with its own
/// error — the chunks before, then `{"kind":"proxy",…}`, never a finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_broken_mid_way_through_a_large_chunk_is_an_unfinished_loop() {
    let small = br#"{"type":"assistant_text_content","text":"a"}"#;
    let (agent, _task) = scripted(move |mut conn| async move {
        while let Some(request) = conn.request().await {
            if request.path == "/register" {
                conn.respond(204, "text/plain", b"").await;
                continue;
            }
            conn.event_stream().await;
            conn.chunk(&[b"data: ", &small[..], b"\n\n"].concat()).await;
            let text = "x".repeat(512 << 10);
            let half = format!(r#"data: {{"type":"assistant_text_content","text":"{text}"#);
            conn.chunk(half.as_bytes()).await;
            // Dropped here: the chunked body has no end.
            return;
        }
    })
    .await;
    let (proxy, server) = behind_a_real_proxy(agent).await;

    let (client, run) = start_run(&server).await;
    let mut run_loop = run.run_loop("go");
    let mut chunks = Vec::new();
    let outcome = loop {
        match run_loop.next().await.expect("an event") {
            Event::Chunk { json, .. } => chunks.push(json.to_vec()),
            Event::Error(_) => {}
            Event::End(outcome) => break outcome,
        }
    };
    assert_eq!(
        chunks,
        [small.to_vec()],
        "the chunk before, and no part of the next"
    );
    let Outcome::Unfinished(error) = &outcome else {
        panic!("{outcome:?}");
    };
    assert_eq!(error.value()["kind"], "proxy", "{error}");
    run.stop().await;
    client.close().await;
    released(&server).await;
    proxy.handle.shutdown();
}

/// A proxy that sends a message in fragments (RFC 6455, section 5.4): whole,
/// it is one chunk like any other; closed cleanly between its fragments,
/// the message is lost, and the loop reads as cut short — the chunks
/// before, then the server's own error — never as finished.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_between_the_fragments_of_a_message_is_never_a_finish() {
    let proxy = FakeProxy::start().await;
    let server = server_for(&proxy, Credentials::Any).await;
    let message = chunk("in fragments");
    let (head, tail) = message.split_at(7);
    let fragment = |first, last, bytes: &[u8]| Step::Fragment {
        first,
        last,
        bytes: bytes.to_vec(),
    };
    proxy.script(
        "whole",
        vec![
            Step::Send(chunk("0")),
            fragment(true, false, head),
            fragment(false, true, tail),
            Step::Close,
        ],
    );
    proxy.script(
        "cut",
        vec![
            Step::Send(chunk("0")),
            fragment(true, false, head),
            Step::Close,
        ],
    );
    let (client, run) = start_run(&server).await;

    let (chunks, outcome) = texts(run.run_loop("whole")).await;
    assert_eq!(chunks, ["0", "in fragments"]);
    assert!(
        matches!(outcome, Outcome::Finished { fatal: false }),
        "{outcome:?}"
    );

    let (chunks, outcome) = texts(run.run_loop("cut")).await;
    assert_eq!(chunks, ["0"], "nothing of the message cut by the close");
    let Outcome::Unfinished(error) = &outcome else {
        panic!("{outcome:?}");
    };
    assert_eq!(error.value()["kind"], "proxy", "{error}");
    let what = error.value()["error"].as_str().expect("words");
    assert!(what.contains("inside a message"), "{what}");
    run.stop().await;
    client.close().await;
}
