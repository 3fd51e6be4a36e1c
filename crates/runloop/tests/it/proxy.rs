//! The proxy against a scripted agent program: a raw TCP server in the test
//! that writes exactly the bytes, and drops exactly the connections, the
//! test says. A tokio-tungstenite client drives the proxy's paths the way
//! the server does.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures_util::SinkExt;
use runloop::proto::run_loop::Outcome;
use runloop::proto::{ErrorKind, ErrorValue};
use runloop_testkit::agent_program::{self, Conn, proxy, scripted};
use runloop_testkit::path::{
    End, Exchange, ask, error_json, exchange, next_binary, open, outcome, register, rest,
};
use serde_json::json;
use tokio::sync::{Notify, mpsc, oneshot};
use tokio_tungstenite::tungstenite::Message;

/// Answers `/register` with 204; hands `/run` connections to `run`.
async fn agent_program<F, Fut>(run: F) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>)
where
    F: Fn(Conn, agent_program::Request) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let run = Arc::new(run);
    scripted(move |mut conn| {
        let run = Arc::clone(&run);
        async move {
            let Some(request) = conn.request().await else {
                return;
            };
            if request.path == "/register" {
                conn.respond(204, "text/plain", b"").await;
            } else {
                run(conn, request).await;
            }
        }
    })
    .await
}

fn chunk(json: &[u8]) -> Vec<u8> {
    [&[0u8][..], json].concat()
}

#[tokio::test]
async fn sse_with_split_reads_multi_line_data_and_comments_arrives_byte_for_byte() {
    const FIRST: &[u8] =
        br#"{"type":"assistant_reasoning", "text" : "spaces  kept",  "_meta":{"runloop/seq":0}}"#;
    const THIRD: &[u8] =
        br#"{"type":"usage","completion_tokens":1,"prompt_tokens":2,"total_tokens":3}"#;
    let forwarded = Arc::new(Notify::new());
    let (requests_tx, mut requests) = mpsc::unbounded_channel();
    let (addr, _agent) = {
        let forwarded = Arc::clone(&forwarded);
        agent_program(move |mut conn, request| {
            let forwarded = Arc::clone(&forwarded);
            let requests_tx = requests_tx.clone();
            async move {
                requests_tx.send(request).expect("the test listens");
                conn.event_stream().await;
                conn.chunk(b": a comment\r\n").await;
                // The first event ends in this write; the second starts in it.
                conn.chunk(
                    &[
                        b"data: ",
                        FIRST,
                        b"\r\n\r\ndata: {\"type\":\"assistant_text_",
                    ]
                    .concat(),
                )
                .await;
                // Written only after the proxy passed the first event on, so
                // the second one's field was split across the proxy's reads.
                forwarded.notified().await;
                conn.chunk(b"content\",\ndata: \"text\":\"two \\u00e9\"}\n")
                    .await;
                conn.chunk(b"\n").await;
                conn.chunk(&[b"event: other\nid: 7\nretry: 10\ndata:", THIRD, b"\r\r"].concat())
                    .await;
                conn.chunk(b":bye\n").await;
                conn.end().await;
            }
        })
        .await
    };
    let proxy = proxy(addr).await;
    register(&proxy.url).await;

    let ask_bytes = br#"{"prompt": "hi",  "extra": [1, 2.50]}"#;
    let mut ws = open(&proxy.url, "/agent/run").await;
    // Text messages carry nothing (protocol §1): the binary one is the ask.
    ws.send(Message::text("not the ask")).await.expect("sent");
    ask(&mut ws, ask_bytes).await;
    let first = next_binary(&mut ws).await.expect("the first chunk");
    assert_eq!(first, chunk(FIRST));
    forwarded.notify_one();
    let mut done = rest(ws).await;
    done.messages.insert(0, first);
    assert_eq!(
        done,
        Exchange {
            messages: vec![
                chunk(FIRST),
                chunk(b"{\"type\":\"assistant_text_content\",\n\"text\":\"two \\u00e9\"}"),
                chunk(THIRD),
            ],
            end: End::Clean,
        }
    );
    let (chunks, outcome) = outcome(&done);
    assert_eq!(outcome, Outcome::Finished { fatal: false });
    assert_eq!(chunks.len(), 3);

    let request = requests.recv().await.expect("the agent program was called");
    assert_eq!(
        (request.method.as_str(), request.path.as_str()),
        ("POST", "/run")
    );
    assert_eq!(request.body, ask_bytes, "the ask is forwarded as received");
    assert_eq!(request.header("content-type"), Some("application/json"));
}

#[tokio::test]
async fn a_non_2xx_json_body_arrives_as_the_agent_s_never_as_the_error_itself() {
    // The attack of issue 40: an agent words its refusal as the server's
    // own policy refusal. It arrives under kind `agent`, with its status.
    const BODY: &[u8] = b" {\"kind\": \"policy\", \"error\": \"tenant bob holds as many runs as it may (max-runs 1); try again later\"}\n";
    let (addr, _agent) = agent_program(|mut conn, _| async move {
        conn.respond(400, "application/json", BODY).await;
    })
    .await;
    let proxy = proxy(addr).await;
    register(&proxy.url).await;
    let done = exchange(&proxy.url, "/agent/run", br#"{"prompt":"x"}"#).await;
    assert_eq!(done.end, End::Clean);
    let forged = json!({
        "kind": "policy",
        "error": "tenant bob holds as many runs as it may (max-runs 1); try again later"
    });
    assert_eq!(
        outcome(&done).1,
        Outcome::NoLoop(ErrorValue::new(
            json!({"kind": "agent", "status": 400, "error": forged})
        ))
    );
    assert_eq!(done.messages.len(), 1);
    assert!(
        done.messages[0].starts_with(b"\x01{\"kind\":\"agent\",\"status\":400,"),
        "{:?}",
        String::from_utf8_lossy(&done.messages[0])
    );
}

#[tokio::test]
async fn a_non_2xx_text_body_is_wrapped() {
    let (addr, _agent) = agent_program(|mut conn, _| async move {
        conn.respond(500, "text/plain", b"model exploded\n").await;
    })
    .await;
    let proxy = proxy(addr).await;
    register(&proxy.url).await;
    let done = exchange(&proxy.url, "/agent/run", br#"{"prompt":"x"}"#).await;
    assert_eq!(
        done.messages,
        [br#"{"kind":"agent","status":500,"error":"model exploded\n"}"#].map(|json| [
            &[1u8][..],
            json
        ]
        .concat())
    );
    assert_eq!(done.end, End::Clean);
    assert_eq!(
        outcome(&done).1,
        Outcome::NoLoop(ErrorValue::new(
            json!({"kind": "agent", "status": 500, "error": "model exploded\n"})
        ))
    );
}

#[tokio::test]
async fn a_2xx_that_is_not_an_event_stream_is_no_loop() {
    let (addr, _agent) = agent_program(|mut conn, _| async move {
        conn.respond(200, "application/json", b"{}").await;
    })
    .await;
    let proxy = proxy(addr).await;
    register(&proxy.url).await;
    let done = exchange(&proxy.url, "/agent/run", br#"{"prompt":"x"}"#).await;
    assert_eq!(done.messages.len(), 1);
    assert_eq!(
        error_json(&done.messages[0]),
        json!({"kind": "agent", "status": 200, "error": "the agent program answered with content type \"application/json\", not text/event-stream"})
    );
}

/// A loopback address nothing listens on.
async fn nobody() -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binds");
    listener.local_addr().expect("address")
}

#[tokio::test]
async fn an_agent_program_that_cannot_be_dialled() {
    let proxy = proxy(nobody().await).await;
    let done = exchange(&proxy.url, "/agent/register", br#"{"agent":1}"#).await;
    assert_eq!(done.end, End::Clean);
    assert_eq!(done.messages.len(), 1);
    let error = error_json(&done.messages[0]);
    assert_eq!(error["kind"], "agent");
    let reason = error["error"].as_str().expect("a reason");
    assert!(reason.contains("Connection refused"), "{reason}");
    assert_eq!(error.as_object().map(|o| o.len()), Some(2), "{error}");

    // The failed registration did not register anything.
    let done = exchange(&proxy.url, "/agent/run", br#"{"prompt":"x"}"#).await;
    assert_eq!(
        outcome(&done).1,
        Outcome::NoLoop(ErrorValue::kind(
            ErrorKind::Proxy,
            "no agent is registered with this proxy"
        ))
    );
}

#[tokio::test]
async fn a_loop_whose_agent_program_is_gone_is_no_loop() {
    let (addr, agent) = agent_program(|_, _| async {}).await;
    let proxy = proxy(addr).await;
    register(&proxy.url).await;
    agent.abort();
    assert!(agent.await.expect_err("aborted").is_cancelled());
    let done = exchange(&proxy.url, "/agent/run", br#"{"prompt":"x"}"#).await;
    let (chunks, result) = outcome(&done);
    assert!(chunks.is_empty());
    let Outcome::NoLoop(error) = result else {
        panic!("not no-loop: {result:?}");
    };
    let words = runloop_testkit::path::agent_words(&error);
    assert!(words.contains("Connection refused"), "{error}");
}

#[tokio::test]
async fn an_sse_stream_cut_mid_way_ends_with_an_error() {
    let (addr, _agent) = agent_program(|mut conn, _| async move {
        conn.event_stream().await;
        conn.chunk(b"data: {\"type\":\"assistant_text_content\",\"text\":\"a\"}\n\n")
            .await;
        conn.chunk(b"data: {\"type\":\"assistant_text_content\",\"text\":\"b\"}\n\ndata: {\"ty")
            .await;
        // Dropped here: the chunked body has no end.
    })
    .await;
    let proxy = proxy(addr).await;
    register(&proxy.url).await;
    let done = exchange(&proxy.url, "/agent/run", br#"{"prompt":"x"}"#).await;
    assert_eq!(done.end, End::Clean, "the error is said, then the close");
    assert_eq!(done.messages.len(), 3);
    let error = error_json(&done.messages[2]);
    assert_eq!(error["kind"], "agent");
    assert!(
        error["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("the event stream broke: ")),
        "{error}"
    );
    let (chunks, result) = outcome(&done);
    assert_eq!(chunks.len(), 2);
    assert_eq!(result, Outcome::Unfinished(ErrorValue::new(error)));
}

/// A good event and bad bytes in one write: the event is relayed, then the
/// error; the outcome does not depend on where the agent program's writes,
/// or the proxy's reads, fell.
#[tokio::test]
async fn a_good_event_written_with_bad_bytes_is_relayed_before_the_error() {
    const EVENT: &[u8] = b"data: {\"type\":\"assistant_text_content\",\"text\":\"a\"}\n\n";
    let (addr, _agent) = agent_program(|mut conn, _| async move {
        conn.event_stream().await;
        conn.chunk(&[EVENT, b"data: \xff\xfe\n\n"].concat()).await;
        conn.end().await;
    })
    .await;
    let proxy = proxy(addr).await;
    register(&proxy.url).await;
    let done = exchange(&proxy.url, "/agent/run", br#"{"prompt":"x"}"#).await;
    assert_eq!(done.end, End::Clean);
    assert_eq!(done.messages.len(), 2, "the chunk, then the error");
    assert_eq!(done.messages[0], chunk(&EVENT[6..EVENT.len() - 2]));
    let error = error_json(&done.messages[1]);
    let bad_at = EVENT.len() + "data: ".len();
    assert_eq!(
        error,
        json!({"kind": "agent", "error": format!("the event stream is not UTF-8 (bad bytes at offset {bad_at})")})
    );
    let (chunks, result) = outcome(&done);
    assert_eq!(chunks.len(), 1, "a chunk was sent: a loop ran");
    assert_eq!(result, Outcome::Unfinished(ErrorValue::new(error)));
}

#[tokio::test]
async fn one_loop_at_a_time() {
    let release = Arc::new(Notify::new());
    let (addr, _agent) = {
        let release = Arc::clone(&release);
        agent_program(move |mut conn, _| {
            let release = Arc::clone(&release);
            async move {
                conn.event_stream().await;
                conn.chunk(b"data: {\"type\":\"user\",\"prompt\":\"p\"}\n\n")
                    .await;
                release.notified().await;
                conn.end().await;
            }
        })
        .await
    };
    let proxy = proxy(addr).await;
    register(&proxy.url).await;

    let mut first = open(&proxy.url, "/agent/run").await;
    ask(&mut first, br#"{"prompt":"1"}"#).await;
    assert!(
        next_binary(&mut first).await.is_some(),
        "the first loop runs"
    );

    let second = exchange(&proxy.url, "/agent/run", br#"{"prompt":"2"}"#).await;
    assert_eq!(
        outcome(&second),
        (
            vec![],
            Outcome::NoLoop(ErrorValue::kind(
                ErrorKind::Proxy,
                "a loop is already running"
            ))
        )
    );

    release.notify_one();
    let first = rest(first).await;
    assert_eq!(first.end, End::Clean);
    assert!(first.messages.is_empty(), "the rest of the first loop");

    // The loop is released before the close: the next one is served.
    release.notify_one();
    let third = exchange(&proxy.url, "/agent/run", br#"{"prompt":"3"}"#).await;
    assert_eq!(outcome(&third).1, Outcome::Finished { fatal: false });
}

#[tokio::test]
async fn registration_happens_once() {
    let registrations = Arc::new(AtomicUsize::new(0));
    let (bodies_tx, mut bodies) = mpsc::unbounded_channel();
    let (addr, _agent) = {
        let registrations = Arc::clone(&registrations);
        scripted(move |mut conn| {
            let registrations = Arc::clone(&registrations);
            let bodies_tx = bodies_tx.clone();
            async move {
                if let Some(request) = conn.request().await {
                    registrations.fetch_add(1, Ordering::SeqCst);
                    bodies_tx.send(request.body).expect("the test listens");
                    conn.respond(200, "text/plain", b"ok").await;
                }
            }
        })
        .await
    };
    let proxy = proxy(addr).await;

    let done = exchange(&proxy.url, "/agent/run", br#"{"prompt":"early"}"#).await;
    assert_eq!(
        outcome(&done).1,
        Outcome::NoLoop(ErrorValue::kind(
            ErrorKind::Proxy,
            "no agent is registered with this proxy"
        ))
    );

    let ask_bytes = br#"{ "agent" : {"model": "m", "n": 1.50} }"#;
    let done = exchange(&proxy.url, "/agent/register", ask_bytes).await;
    assert_eq!(
        done,
        Exchange {
            messages: vec![vec![0]],
            end: End::Clean
        }
    );
    assert_eq!(bodies.recv().await.expect("a body"), ask_bytes);

    let again = exchange(&proxy.url, "/agent/register", br#"{"agent":2}"#).await;
    assert_eq!(again.end, End::Clean);
    assert_eq!(
        again
            .messages
            .iter()
            .map(|m| error_json(m))
            .collect::<Vec<_>>(),
        [json!({"kind": "proxy", "error": "an agent is already registered with this proxy"})]
    );
    assert_eq!(registrations.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_failed_registration_can_be_tried_again() {
    let calls = Arc::new(AtomicUsize::new(0));
    let (addr, _agent) = {
        let calls = Arc::clone(&calls);
        scripted(move |mut conn| {
            let calls = Arc::clone(&calls);
            async move {
                if conn.request().await.is_some() {
                    if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                        conn.respond(503, "application/json", br#"{"starting":true}"#)
                            .await;
                    } else {
                        conn.respond(204, "text/plain", b"").await;
                    }
                }
            }
        })
        .await
    };
    let proxy = proxy(addr).await;
    let failed = exchange(&proxy.url, "/agent/register", br#"{"agent":null}"#).await;
    assert_eq!(
        failed.messages,
        [b"\x01{\"kind\":\"agent\",\"status\":503,\"error\":{\"starting\":true}}".to_vec()]
    );
    register(&proxy.url).await;
}

#[tokio::test]
async fn bad_asks_get_clear_errors() {
    let (addr, _agent) = agent_program(|_, _| async {}).await;
    let proxy = proxy(addr).await;
    let done = exchange(&proxy.url, "/agent/register", br#"{"agnet":1}"#).await;
    assert_eq!(
        done.messages
            .iter()
            .map(|m| error_json(m))
            .collect::<Vec<_>>(),
        [
            json!({"kind": "proxy", "error": "the registration did not parse: it has no `agent` member"})
        ]
    );
    register(&proxy.url).await;
    let done = exchange(&proxy.url, "/agent/run", br#"{"prompt":5}"#).await;
    let error = error_json(&done.messages[0]);
    assert!(
        error["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("the run-loop request did not parse: ")),
        "{error}"
    );

    let refused = tokio_tungstenite::connect_async(format!("{}/agent/other", proxy.url)).await;
    match refused {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            assert_eq!(response.status(), 404);
        }
        other => panic!("an unknown path was accepted: {other:?}"),
    }
}

#[tokio::test]
async fn a_server_that_closes_the_path_mid_loop_cancels_the_agent_programs_request() {
    let (cancelled_tx, cancelled) = oneshot::channel();
    let cancelled_tx = Arc::new(std::sync::Mutex::new(Some(cancelled_tx)));
    let (addr, _agent) = {
        let cancelled_tx = Arc::clone(&cancelled_tx);
        agent_program(move |mut conn, request| {
            let cancelled_tx = Arc::clone(&cancelled_tx);
            async move {
                conn.event_stream().await;
                conn.chunk(b"data: {\"type\":\"user\",\"prompt\":\"p\"}\n\n")
                    .await;
                if request.body == br#"{"prompt":"hold"}"# {
                    let closed = conn.closed_by_peer().await;
                    let sender = cancelled_tx.lock().expect("not poisoned").take();
                    if let Some(sender) = sender {
                        let _ = sender.send(closed);
                    }
                } else {
                    conn.end().await;
                }
            }
        })
        .await
    };
    let proxy = proxy(addr).await;
    register(&proxy.url).await;
    let mut ws = open(&proxy.url, "/agent/run").await;
    ask(&mut ws, br#"{"prompt":"hold"}"#).await;
    assert!(next_binary(&mut ws).await.is_some());
    ws.close(None).await.expect("closes");
    drop(ws);
    assert_eq!(
        cancelled.await,
        Ok(true),
        "the agent program saw its connection closed"
    );
    // And the proxy is free for the next loop.
    let done = exchange(&proxy.url, "/agent/run", br#"{"prompt":"next"}"#).await;
    assert_eq!(outcome(&done).1, Outcome::Finished { fatal: false });
}

#[tokio::test]
async fn shutdown_mid_loop_says_so_and_closes_cleanly() {
    let (addr, _agent) = agent_program(|mut conn, _| async move {
        conn.event_stream().await;
        conn.chunk(b"data: {\"type\":\"user\",\"prompt\":\"p\"}\n\n")
            .await;
        conn.closed_by_peer().await;
    })
    .await;
    let proxy = proxy(addr).await;
    register(&proxy.url).await;
    let mut ws = open(&proxy.url, "/agent/run").await;
    ask(&mut ws, br#"{"prompt":"x"}"#).await;
    let first = next_binary(&mut ws).await.expect("a chunk");
    proxy.handle.shutdown();
    let mut done = rest(ws).await;
    done.messages.insert(0, first);
    assert_eq!(done.end, End::Clean);
    assert_eq!(
        outcome(&done).1,
        Outcome::Unfinished(ErrorValue::kind(
            ErrorKind::Proxy,
            "the proxy is shutting down"
        ))
    );
    proxy.task.await.expect("joins").expect("the proxy ran");
}

/// A chunk JSON of about `size` bytes.
fn large_chunk(size: usize) -> Vec<u8> {
    let text = "é".repeat(size / 2);
    format!(r#"{{"type":"assistant_text_content","text":"{text}"}}"#).into_bytes()
}

/// A 15 MiB event, written in 64 KiB HTTP chunks: it reaches the server's
/// side of the path as one message of exactly its bytes, sent in fragments
/// (a client that refuses any frame over 1 MiB takes it whole).
#[tokio::test]
async fn a_15_mib_event_arrives_as_one_message_in_fragments() {
    let json = Arc::new(large_chunk(15 << 20));
    let (addr, _agent) = {
        let json = Arc::clone(&json);
        agent_program(move |mut conn, _| {
            let json = Arc::clone(&json);
            async move {
                conn.event_stream().await;
                let event = [
                    b"data: ",
                    json.as_slice(),
                    b"\n\ndata: {\"type\":\"usage\"}\n\n",
                ]
                .concat();
                for piece in event.chunks(64 << 10) {
                    conn.chunk(piece).await;
                }
                conn.end().await;
            }
        })
        .await
    };
    let proxy = proxy(addr).await;
    register(&proxy.url).await;
    let config = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
        .max_frame_size(Some(1 << 20))
        .max_message_size(Some(32 << 20));
    let (mut ws, _) = tokio_tungstenite::connect_async_with_config(
        format!("{}/agent/run", proxy.url),
        Some(config),
        false,
    )
    .await
    .expect("the proxy accepts the path");
    ask(&mut ws, br#"{"prompt":"x"}"#).await;
    let done = rest(ws).await;
    assert_eq!(done.end, End::Clean);
    assert_eq!(
        done.messages.len(),
        2,
        "the large chunk, then the small one"
    );
    assert!(
        done.messages[0] == chunk(&json),
        "[0] and the event's bytes, exactly"
    );
    assert_eq!(done.messages[1], chunk(br#"{"type":"usage"}"#));
}

/// The agent program's body breaks in the middle of a large event, after
/// part of it went out: the path is dropped with no close frame (a close
/// would read as a finished loop, its last chunk lost) and no error message
/// (none may come inside a fragmented one).
#[tokio::test]
async fn a_body_that_breaks_mid_way_through_a_large_event_abandons_the_path() {
    let small = br#"{"type":"assistant_text_content","text":"a"}"#;
    let (addr, _agent) = agent_program(move |mut conn, _| async move {
        conn.event_stream().await;
        conn.chunk(&[b"data: ", &small[..], b"\n\n"].concat()).await;
        let json = large_chunk(1 << 20);
        conn.chunk(&[b"data: ", &json[..512 << 10]].concat()).await;
        // Dropped here: the chunked body has no end.
    })
    .await;
    let proxy = proxy(addr).await;
    register(&proxy.url).await;
    let done = exchange(&proxy.url, "/agent/run", br#"{"prompt":"x"}"#).await;
    assert!(
        matches!(done.end, End::Abrupt(_)),
        "no close frame: {:?}",
        done.end
    );
    assert_eq!(done.messages, [chunk(small)], "the first chunk only");
}

/// A dialler held up past the handshake timeout before it wrote its
/// request (the server's own task, in a process too busy to run it): the
/// proxy answers `503` with the reason, and reads the late request, so the
/// dialler reads why instead of "Handshake not finished".
#[tokio::test]
async fn a_dialler_silent_past_the_handshake_timeout_reads_a_503_with_the_reason() {
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let config = runloop::proxy::ProxyConfig {
        handshake_timeout: Duration::from_millis(200),
        ..Default::default()
    };
    let proxy = runloop::proxy::Proxy::bind(
        std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
        nobody().await,
    )
    .await
    .expect("binds")
    .with_config(config);
    let (handle, _task) = proxy.spawn();
    let mut dialler = tokio::net::TcpStream::connect(handle.local_addr())
        .await
        .expect("connects");
    tokio::time::sleep(Duration::from_millis(600)).await;
    let request = format!(
        "GET /agent/register HTTP/1.1\r\nHost: {}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
        handle.local_addr()
    );
    // The request may meet a socket the proxy has closed (the old code did).
    let _ = dialler.write_all(request.as_bytes()).await;
    let mut answer = Vec::new();
    let read = dialler.read_to_end(&mut answer).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
        "{read:?}: {answer:?}"
    );
    assert!(
        answer.ends_with(
            "\r\n\r\nno WebSocket request came within 0.2 s of the connection; dial again\n"
        ),
        "{answer:?}"
    );
    handle.shutdown();
}
