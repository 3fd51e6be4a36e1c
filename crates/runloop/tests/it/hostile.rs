//! Hostile input, over real sockets: refused authorizations, an accepting
//! side that authorizes, floods of malformed frames and of requests past
//! the limits, a caller that asks without ever reading, and a request of
//! the largest size allowed. The connection survives where docs/protocol.md says it
//! must, limits hold, and a loop running alongside finishes untouched.

use std::collections::BTreeMap;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use runloop::client::{Client, RunError};
use runloop::server::Credentials;
use runloop_proto::Decode;
use runloop_proto::frame::{self, ClientFrame, ServerFrame};
use runloop_proto::run_loop::Outcome;
use runloop_testkit::caller::{Owned, RawClient};
use runloop_testkit::fake_proxy::{FakeProxy, Step};
use runloop_testkit::message::chunk;
use runloop_testkit::server::{
    released, run_request, run_request_payload, server_for, server_with,
};
use runloop_testkit::wait::eventually;
use tokio_tungstenite::tungstenite::Message;

/// An authorization frame with this payload.
fn authorization(payload: &[u8]) -> Vec<u8> {
    frame::to_message(&ClientFrame::Authorization { payload })
}

/// A run-loop channel request payload for `prompt`.
fn loop_payload(prompt: &str) -> Vec<u8> {
    let mut payload = vec![5];
    payload.extend_from_slice(
        serde_json::json!({ "prompt": prompt })
            .to_string()
            .as_bytes(),
    );
    payload
}

/// The chunk number a `Step::Flood` chunk carries.
fn flood_number(payload: &[u8]) -> usize {
    let json: serde_json::Value = serde_json::from_slice(&payload[1..]).expect("chunk");
    let text = json["text"].as_str().expect("text");
    text[..10].trim().parse().expect("number")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_authorizations_are_closed_without_a_frame() {
    let proxy = FakeProxy::start().await;
    let server = server_for(&proxy, Credentials::Tokens(vec!["right".into()])).await;
    let request = frame::to_message(&ClientFrame::Request {
        scope: 0,
        payload: &run_request_payload(),
    });
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("a wrong credential", authorization(b"\x00wrong")),
        (
            "an empty credential where one is required",
            authorization(b"\x00"),
        ),
        (
            "the right credential with a prefix",
            authorization(b"\x00right "),
        ),
        ("the reserved mode 1", authorization(b"\x01right")),
        ("an unknown mode", authorization(b"\x07right")),
        ("no mode at all", authorization(b"")),
        (
            "a credential that is not UTF-8",
            authorization(b"\x00righ\xff"),
        ),
        ("a request before any authorization", request.clone()),
        ("a truncated first frame", vec![0, 0, 0]),
    ];
    for (case, first) in cases {
        let mut raw = RawClient::connect(&server.url()).await;
        raw.send(first).await;
        // Whatever follows is never served: the connection is closed.
        let _ = raw.ws.send(Message::Binary(request.clone().into())).await;
        assert_eq!(raw.next_frame().await, None, "{case}: closed, no frame");
    }
    eventually("every refused connection is gone", || {
        server.stats().connections == 0
    })
    .await;
    assert_eq!(server.stats().scopes, 0, "nothing was served");
    assert!(proxy.events().is_empty(), "nothing reached the proxy");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_authorization_mid_loop_ends_the_connection_and_its_runs() {
    let proxy = FakeProxy::start().await;
    proxy.script_hang();
    let server = server_for(&proxy, Credentials::Tokens(vec!["right".into()])).await;
    let mut raw = RawClient::authorized(&server.url(), "right").await;
    raw.open_run(3).await;
    raw.open_loop(3, 1, "hang").await;
    assert_eq!(
        raw.next_frame().await,
        Some(Owned::ChannelResponse {
            scope: 3,
            channel: 1,
            payload: chunk("a")
        })
    );
    // Not even a well-formed, acceptable one.
    raw.send(authorization(b"\x00right")).await;
    // The run ends as any run ends when its connection goes; then the close.
    let Some(Owned::ChannelResponse { payload, .. }) = raw.next_frame().await else {
        panic!("the loop ends with the server's error");
    };
    assert_eq!(payload[0], 1);
    assert_eq!(
        raw.next_frame().await,
        Some(Owned::ChannelResponseFinish {
            scope: 3,
            channel: 1
        })
    );
    assert_eq!(
        raw.next_frame().await,
        Some(Owned::ResponseFinish { scope: 3 })
    );
    assert_eq!(raw.next_frame().await, None);
    proxy.wait_for("closed hang").await;
    released(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_ends_a_connection_whose_server_sends_an_authorization() {
    // A server that reads the authorization and the run request, and then
    // sends an authorization of its own.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("ws://{}", listener.local_addr().expect("addr"));
    let server = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.expect("accept");
        let mut ws = tokio_tungstenite::accept_async(tcp)
            .await
            .expect("handshake");
        let mut read = Vec::new();
        while read.len() < 2 {
            match ws.next().await {
                Some(Ok(Message::Binary(bytes))) => read.push(bytes),
                other => panic!("the client sends its frames: {other:?}"),
            }
        }
        let authorization = frame::to_message(&ServerFrame::Authorization {
            payload: b"\x00server",
        });
        ws.send(Message::Binary(authorization.into()))
            .await
            .expect("sent");
        // What comes back: nothing but the end of the connection.
        let mut after = Vec::new();
        while let Some(Ok(message)) = ws.next().await {
            if message.is_close() {
                break;
            }
            after.push(message);
        }
        after
    });
    let client = Client::connect(&url, "token").await.expect("connect");
    let refused = client.start(run_request()).await;
    assert!(
        matches!(
            refused,
            Err(RunError::ConnectionEnded(
                runloop::client::Ending::Violation(_)
            ))
        ),
        "{refused:?}"
    );
    client.closed().await;
    assert!(client.is_closed());
    let after = server.await.expect("the fake server ends");
    assert!(
        after.is_empty(),
        "the client sent {after:?} after the violation"
    );
}

/// Every kind of frame a server must disregard, by number `n`, while scope
/// 1 is open with a loop running on channel 1.
fn disregarded(n: usize) -> Vec<u8> {
    let run = run_request_payload();
    match n % 12 {
        // Truncated: every length a header can be cut to.
        k @ 0..=8 => vec![4; k],
        // Types a client may not send, and types that do not exist.
        9 => vec![[2u8, 3, 7, 200, 255][n % 5], 0, 0, 0, 1, 0, 0, 0, 0],
        // A request on the open scope; a channel request on the open
        // channel; a channel request on a scope that is not open.
        10 => match (n / 12) % 3 {
            0 => frame::to_message(&ClientFrame::Request {
                scope: 1,
                payload: &run,
            }),
            1 => frame::to_message(&ClientFrame::ChannelRequest {
                scope: 1,
                channel: 1,
                payload: &loop_payload("flood"),
            }),
            _ => frame::to_message(&ClientFrame::ChannelRequest {
                scope: 9_000 + n as u32,
                channel: 0,
                payload: &[0],
            }),
        },
        // Responses to server channels that were never opened.
        _ => frame::to_message(&ClientFrame::ChannelResponse {
            scope: 1,
            channel: n as u32,
            payload: b"\x00{}",
        }),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_malformed_frames_leave_a_running_loop_untouched() {
    const CHUNKS: usize = 1500;
    const FLOOD: usize = 6000;
    let proxy = FakeProxy::start().await;
    proxy.script(
        "steady",
        vec![
            Step::Flood {
                count: CHUNKS,
                size: 64,
            },
            Step::Close,
        ],
    );
    proxy.script("hang", vec![Step::Send(chunk("h")), Step::AwaitClose]);
    // A short queue keeps the loop running for as long as the flood lasts.
    let server = server_with(&proxy, Credentials::Any, |config| {
        config.limits.max_queued_responses = 2;
    })
    .await;
    let mut raw = RawClient::authorized(&server.url(), "").await;
    raw.open_run(1).await;
    // Channel 1 stays open all along, the target of requests on an open
    // number; channel 0 is the loop that must finish untouched.
    raw.open_loop(1, 1, "hang").await;
    assert_eq!(
        raw.next_frame().await,
        Some(Owned::ChannelResponse {
            scope: 1,
            channel: 1,
            payload: chunk("h")
        })
    );
    raw.open_loop(1, 0, "steady").await;
    let before = server.stats().disregarded;

    let mut next_chunk = 0;
    let mut answers = BTreeMap::new();
    // Takes one frame: a chunk of the loop (true at its finish), or an answer.
    let read =
        |frame: Option<Owned>, next_chunk: &mut usize, answers: &mut BTreeMap<_, _>| match frame {
            Some(Owned::ChannelResponse {
                scope: 1,
                channel: 0,
                payload,
            }) => {
                assert_eq!(flood_number(&payload), *next_chunk, "in order, none lost");
                *next_chunk += 1;
                false
            }
            Some(Owned::ChannelResponseFinish {
                scope: 1,
                channel: 0,
            }) => true,
            Some(other) => {
                *answers.entry(format!("{other:?}")).or_insert(0) += 1;
                false
            }
            None => panic!("the connection survives the flood"),
        };
    let mut finished = false;
    for n in 0..FLOOD {
        raw.send(disregarded(n)).await;
        // Served requests among the flood: an unserved endpoint and an
        // unserved channel, each answered with a bare finish.
        if n % 500 == 0 {
            raw.send_frame(&ClientFrame::Request {
                scope: 5_000,
                payload: &[9],
            })
            .await;
            raw.send_frame(&ClientFrame::ChannelRequest {
                scope: 1,
                channel: 77,
                payload: &[3],
            })
            .await;
        }
        if n % 4 == 0 && !finished {
            finished = read(raw.next_frame().await, &mut next_chunk, &mut answers);
        }
    }
    while !finished {
        finished = read(raw.next_frame().await, &mut next_chunk, &mut answers);
    }
    assert_eq!(next_chunk, CHUNKS, "every chunk, then the finish");
    eventually("every malformed frame is counted", || {
        server.stats().disregarded == before + FLOOD as u64
    })
    .await;
    // Every served request answered, exactly once.
    while answers.values().sum::<usize>() < 2 * FLOOD.div_ceil(500) {
        read(raw.next_frame().await, &mut next_chunk, &mut answers);
    }
    assert_eq!(
        answers,
        BTreeMap::from([
            (
                format!("{:?}", Owned::ResponseFinish { scope: 5_000 }),
                FLOOD.div_ceil(500)
            ),
            (
                format!(
                    "{:?}",
                    Owned::ChannelResponseFinish {
                        scope: 1,
                        channel: 77
                    }
                ),
                FLOOD.div_ceil(500)
            ),
        ])
    );
    assert_eq!(server.stats().scopes, 1, "the run is still open");
    assert_eq!(server.stats().relays, 1, "and its other loop");
    drop(raw);
    proxy.wait_for("closed hang").await;
    released(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floods_past_the_scope_and_channel_limits_are_held_to_them() {
    const FLOOD: u32 = 1000;
    let proxy = FakeProxy::start().await;
    proxy.script_hang();
    proxy.script(
        "alongside",
        vec![
            Step::Flood {
                count: 300,
                size: 64,
            },
            Step::Close,
        ],
    );
    let server = server_with(&proxy, Credentials::Any, |config| {
        config.limits.max_scopes = 3;
        config.limits.max_channels = 2;
        config.limits.max_queued_responses = 2;
    })
    .await;
    let mut raw = RawClient::authorized(&server.url(), "").await;
    raw.open_run(0).await;
    raw.open_run(1).await;
    raw.open_run(2).await;
    // A loop runs alongside everything below, on scope 2.
    raw.open_loop(2, 0, "alongside").await;

    let mut frames = Vec::new();
    // Runs past the scope limit: each a bare finish, none opened.
    for scope in 3..3 + FLOOD {
        raw.send_frame(&ClientFrame::Request {
            scope,
            payload: &run_request_payload(),
        })
        .await;
    }
    // Loops past the channel limit: each a bare finish, none relayed.
    for channel in 0..FLOOD {
        raw.send_frame(&ClientFrame::ChannelRequest {
            scope: 0,
            channel,
            payload: &loop_payload("hang"),
        })
        .await;
    }
    // Stops on scope 1, far past the channel limit: one ending.
    for channel in 0..FLOOD {
        raw.send_frame(&ClientFrame::ChannelRequest {
            scope: 1,
            channel,
            payload: &[0, 0xff],
        })
        .await;
    }
    // Read until scope 1 has finished, the alongside loop has finished, and
    // every bare finish is in.
    let mut chunks = 0;
    let (mut scope_finishes, mut channel_finishes, mut hang_chunks) = (0, 0, 0);
    let (mut stopped, mut alongside_done) = (false, false);
    while !(stopped && alongside_done && scope_finishes == FLOOD && channel_finishes == FLOOD - 2) {
        let frame = raw.next_frame().await.expect("the connection survives");
        match &frame {
            Owned::ResponseFinish { scope: 1 } => stopped = true,
            Owned::ResponseFinish { scope } if *scope >= 3 => scope_finishes += 1,
            Owned::ChannelResponseFinish { scope: 0, channel } if *channel >= 2 => {
                channel_finishes += 1
            }
            Owned::ChannelResponse {
                scope: 0,
                channel: 0 | 1,
                payload,
            } if *payload == chunk("a") => hang_chunks += 1,
            Owned::ChannelResponse {
                scope: 2,
                channel: 0,
                payload,
            } => {
                assert_eq!(flood_number(payload), chunks, "in order, none lost");
                chunks += 1;
            }
            Owned::ChannelResponseFinish {
                scope: 2,
                channel: 0,
            } => alongside_done = true,
            _ => {}
        }
        frames.push(frame);
    }
    assert_eq!(chunks, 300);
    assert_eq!(hang_chunks, 2, "two loops within the channel limit run");
    assert_eq!(
        frames
            .iter()
            .filter(|f| matches!(f, Owned::ResponseFinish { scope: 1 }))
            .count(),
        1,
        "a thousand stops end the run once"
    );
    let stats = server.stats();
    assert_eq!(stats.scopes, 2, "scopes 0 and 2, never more than the limit");
    assert_eq!(stats.relays, 2, "the two hanging loops, never more");
    drop(raw);
    released(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_asks_without_reading_is_read_no_further() {
    // Each unserved request costs the server an answer. A caller that sends
    // them and never reads would have them pile up in the server; instead
    // the server stops reading it. A disregarded frame after each request
    // shows how far the server has read.
    const REQUESTS: u64 = 40_000;
    let proxy = FakeProxy::start().await;
    let server = server_for(&proxy, Credentials::Any).await;
    // Over an in-memory pipe of 64 KiB each way, so that what the transport
    // holds of the answers is small beside what the server could pile up.
    let (near, far) = tokio::io::duplex(64 << 10);
    let _connection = server.serve_connection(far, "the test's pipe");
    let (mut ws, _) = tokio_tungstenite::client_async("ws://pipe/", near)
        .await
        .expect("handshake");
    ws.send(Message::Binary(authorization(b"\x00").into()))
        .await
        .expect("authorized");
    let (mut sink, mut stream) = ws.split();
    let before = server.stats().disregarded;
    let sending = tokio::spawn(async move {
        for n in 0..REQUESTS {
            let request = frame::to_message(&ClientFrame::Request {
                scope: n as u32,
                payload: &[9],
            });
            sink.feed(Message::Binary(request.into()))
                .await
                .expect("send");
            sink.feed(Message::Binary(vec![0xee].into()))
                .await
                .expect("send");
        }
        sink.flush().await.expect("flush");
        sink
    });
    // Wait until the server stops reading: its count stands still.
    let mut last = u64::MAX;
    let mut still = 0;
    let read = loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = server.stats().disregarded - before;
        if now == REQUESTS {
            break now;
        }
        if now == last {
            still += 1;
            if still == 10 {
                break now;
            }
        } else {
            (still, last) = (0, now);
        }
    };
    println!("a caller that does not read: the server read {read} of {REQUESTS} requests");
    assert!(
        read < REQUESTS / 2,
        "the server read {read} of {REQUESTS} requests its caller never read answers to"
    );
    // Reading again lets it go on: every request is answered, in order.
    for n in 0..REQUESTS {
        let Some(Ok(Message::Binary(bytes))) = stream.next().await else {
            panic!("answer {n}");
        };
        let frame = Owned::from(ServerFrame::decode(&bytes).expect("a server frame"));
        assert_eq!(frame, Owned::ResponseFinish { scope: n as u32 });
    }
    let sink = sending.await.expect("every request was sent");
    assert_eq!(server.stats().disregarded - before, REQUESTS);
    drop((sink, stream));
    released(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_loop_request_of_the_largest_size_is_relayed_byte_for_byte() {
    const MAX: usize = 1 << 20;
    let proxy = FakeProxy::start().await;
    proxy.script("alongside", vec![Step::Send(chunk("b")), Step::Close]);
    let server = server_with(&proxy, Credentials::Any, |config| {
        config.limits.max_message_size = MAX;
    })
    .await;
    // JSON as no encoder would write it, with escapes and multi-byte text,
    // filled so that the whole frame is exactly the largest message allowed.
    let head = b"{ \"prompt\" :\"\\u00e9t\xc3\xa9 ".to_vec();
    let tail = b"\" , \"extra\": [1, 2.50] }".to_vec();
    let fill = MAX - 9 - 1 - head.len() - tail.len();
    let json = [head, vec![b'x'; fill], tail].concat();
    let prompt = serde_json::from_slice::<serde_json::Value>(&json).expect("JSON")["prompt"]
        .as_str()
        .expect("prompt")
        .to_owned();
    proxy.script(&prompt, vec![Step::Send(chunk("a")), Step::Close]);
    let payload = [vec![5], json.clone()].concat();
    let message = frame::to_message(&ClientFrame::ChannelRequest {
        scope: 0,
        channel: 0,
        payload: &payload,
    });
    assert_eq!(message.len(), MAX);

    let mut raw = RawClient::authorized(&server.url(), "").await;
    raw.open_run(0).await;
    raw.open_run(1).await;
    raw.open_loop(1, 0, "alongside").await;
    raw.send(message).await;
    let mut seen = Vec::new();
    while seen.len() < 4 {
        seen.push(raw.next_frame().await.expect("the connection survives"));
    }
    let for_channel = |scope| {
        seen.iter()
            .filter(|f| {
                matches!(f, Owned::ChannelResponse { scope: s, .. }
                    | Owned::ChannelResponseFinish { scope: s, .. } if *s == scope)
            })
            .cloned()
            .collect::<Vec<_>>()
    };
    for (scope, text) in [(0, "a"), (1, "b")] {
        assert_eq!(
            for_channel(scope),
            [
                Owned::ChannelResponse {
                    scope,
                    channel: 0,
                    payload: chunk(text)
                },
                Owned::ChannelResponseFinish { scope, channel: 0 }
            ]
        );
    }
    let asks = proxy.asks.lock().expect("lock").clone();
    assert!(asks.contains(&json), "the ask is the caller's bytes");
    let client = Client::connect(&server.url(), "").await.expect("connect");
    let run = client
        .start(run_request())
        .await
        .expect("the server still serves");
    let outcome = run.run_loop("alongside").outcome().await;
    assert_eq!(outcome, Outcome::Finished { fatal: false });
    drop(raw);
    client.close().await;
    released(&server).await;
}
