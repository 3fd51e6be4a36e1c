//! `runloop check` against real servers on loopback: the project's own
//! server (conformant), a small hand-written framed server that is
//! conformant too, and variants of it with one flaw each. The binary runs
//! as a process while the servers run on a tokio runtime in this one.

use runloop_testkit::message::chunk;
use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::{exits_2_saying, runloop, runloop_output};
use futures_util::{SinkExt, StreamExt};
use runloop::runtime::{Attach, Catalog};
use runloop::server::{Credentials, Server, ServerConfig};
use runloop_proto::Decode;
use runloop_proto::authorization::Authorization;
use runloop_proto::channel::ChannelRequest;
use runloop_proto::endpoint::EndpointRequest;
use runloop_proto::frame::{self, ClientFrame, ServerFrame};
use serde_json::Value;
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Runtime;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::server::{Request, Response};

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

/// A proxy (protocol §10) that registers every agent and answers every loop
/// with two chunks and a clean close.
async fn scripted_proxy() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            tokio::spawn(proxy_path(tcp));
        }
    });
    addr
}

// The handshake callback's signature is tungstenite's, large error and all.
#[allow(clippy::result_large_err)]
async fn proxy_path(tcp: TcpStream) {
    let mut path = String::new();
    let callback = |request: &Request, response: Response| {
        path = request.uri().path().to_owned();
        Ok(response)
    };
    let Ok(mut ws) = tokio_tungstenite::accept_hdr_async(tcp, callback).await else {
        return;
    };
    let Some(Ok(Message::Binary(_ask))) = ws.next().await else {
        return;
    };
    let answers = match path.as_str() {
        "/agent/register" => vec![vec![0]],
        "/agent/run" => vec![chunk("Hel"), chunk("lo")],
        _ => vec![],
    };
    for answer in answers {
        // The server may close a loop's path first (a stop): nothing to do.
        if ws.send(Message::Binary(answer.into())).await.is_err() {
            return;
        }
    }
    let _ = ws.close(None).await;
    while let Some(Ok(_)) = ws.next().await {}
}

/// The project's server, `demo` attached to the scripted proxy, accepting
/// only `secret`, closing a connection that has not authorized after 1 s.
fn conformant_server(runtime: &Runtime) -> String {
    runtime.block_on(async {
        let proxy = scripted_proxy().await;
        let mut catalog = Catalog::new();
        catalog.insert("demo", None, Arc::new(Attach::new(format!("ws://{proxy}"))));
        let mut config = ServerConfig::new(Credentials::Tokens(vec!["secret".into()]), catalog);
        config.authorization_grace = Duration::from_secs(1);
        let server = Server::bind("127.0.0.1:0", config).await.expect("bind");
        let (handle, _task) = server.spawn();
        handle.url()
    })
}

/// The JSON objects `check --json` printed.
fn json_lines(stdout: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(stdout)
        .lines()
        .map(|line| serde_json::from_str(line).expect("each line is JSON"))
        .collect()
}

#[test]
fn the_projects_server_passes_every_case() {
    let runtime = runtime();
    let url = conformant_server(&runtime);
    let output = runloop()
        .args(["check", "--json", "--slow", "--url", &url])
        .env("RUNLOOP_TOKEN", "secret")
        .output()
        .expect("runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stdout}");
    let lines = json_lines(&output.stdout);
    let (summary, cases) = lines.split_last().expect("a summary");
    let mut names = HashSet::new();
    for case in cases {
        let expected = if case["level"] == "info" {
            "info"
        } else {
            "pass"
        };
        assert_eq!(case["result"], expected, "{case}");
        assert!(names.insert(case["case"].to_string()), "{case}");
    }
    assert!(cases.len() >= 25, "{stdout}");
    assert_eq!(summary["summary"]["passed"], cases.len() - 1, "{summary}");
    assert_eq!(summary["summary"]["info"], 1, "{summary}");
    assert_eq!(summary["summary"]["failed"], 0);
    assert_eq!(summary["exit"], 0);
    let case = |name: &str| {
        cases
            .iter()
            .find(|case| case["case"] == name)
            .unwrap_or_else(|| panic!("no case {name:?}: {stdout}"))
    };
    // The loop ran through the scripted proxy and finished.
    assert_eq!(
        case("a run-loop's response sequence is valid")["detail"],
        "finished (2 chunks): the loop finished"
    );
    // With --slow, the connection that never authorizes is closed after the
    // server's grace period; informational either way.
    let slow = case("a connection that never authorizes is closed after a grace period");
    assert_eq!(slow["level"], "info");
    assert!(
        slow["detail"].as_str().is_some_and(|detail| detail
            .starts_with("the server closed the connection")
            && detail.ends_with("with no frame")),
        "{slow}"
    );
    // A random credential is refused, not merely noted.
    assert!(
        case("a wrong credential: the connection is closed with no frame")["detail"]
            .as_str()
            .is_some_and(|detail| detail.starts_with("a random credential: ")),
        "{stdout}"
    );
    // The mount is refused with the rule it broke.
    assert!(
        case("a request with an invalid mount gets one error response, then the finish")["detail"]
            .as_str()
            .is_some_and(|detail| detail.starts_with("refused: ") && detail.contains("`..`")),
        "{stdout}"
    );
}

#[test]
fn a_wrong_token_is_one_line_then_the_summary_and_exits_2() {
    let runtime = runtime();
    let url = conformant_server(&runtime);
    let output = runloop_output(&["check", "--url", &url, "--token", "not-the-secret"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(2), "{stdout}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines.len(),
        2,
        "one case's line, then the summary: {stdout}"
    );
    assert!(
        lines[0].starts_with(
            "SKIP  protocol §3   an authorized connection is served: a run request gets an answer: \
             the server closed the connection with no frame"
        ),
        "{stdout}"
    );
    assert!(lines[0].ends_with("is --token right?"), "{stdout}");
    assert!(
        lines[1].starts_with(&format!("{url}: 0 passed, 0 failed, 0 info, 1 skipped, "))
            && lines[1].ends_with(
                " not run: the check could not be made: no connection is served (see above)"
            ),
        "{stdout}"
    );

    let output = runloop_output(&[
        "check",
        "--json",
        "--url",
        &url,
        "--token",
        "not-the-secret",
    ]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(2), "{stdout}");
    let lines = json_lines(&output.stdout);
    assert_eq!(lines.len(), 2, "{stdout}");
    assert_eq!(lines[0]["result"], "skip");
    let not_run = lines[1]["summary"]["not_run"].as_u64().expect("a count");
    assert!(not_run > 20, "{stdout}");
    assert_eq!(lines[1]["exit"], 2);
}

#[test]
fn an_unreachable_server_is_a_failure_of_the_command() {
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port");
    runloop()
        .args(["check", "--url", &format!("ws://{addr}")])
        .assert()
        .code(2)
        .stdout("")
        .stderr(predicates::str::starts_with(format!(
            "runloop: cannot connect to ws://{addr}: "
        )));
}

#[test]
fn bad_arguments_exit_2() {
    for args in [
        &["check", "--image", "Demo"][..],
        &["check", "--image", "demo@md5"],
        &["check", "--timeout", "0"],
        &["check", "--agent", "{"],
    ] {
        exits_2_saying(args, "invalid value");
    }
}

/// What a hand-written server gets wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flaw {
    /// Nothing: a minimal conformant server that accepts any credential.
    None,
    /// On a run-loop channel: an error, then a chunk, then the finish.
    ChunkAfterError,
    /// An unknown endpoint gets an error response before its finish.
    ErrorForUnknownEndpoint,
    /// A stop is never answered with the scope's finish.
    NoFinishOnStop,
}

/// A framed server written by hand from docs/protocol.md, with `flaw`.
fn hand_written_server(runtime: &Runtime, flaw: Flaw) -> String {
    runtime.block_on(async move {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let ids = Arc::new(AtomicU64::new(1));
            while let Ok((tcp, _)) = listener.accept().await {
                let _ = tcp.set_nodelay(true);
                let ids = Arc::clone(&ids);
                tokio::spawn(async move {
                    if let Ok(ws) = tokio_tungstenite::accept_async(tcp).await {
                        serve(ws, flaw, &ids).await;
                    }
                });
            }
        });
        format!("ws://{addr}")
    })
}

async fn send(ws: &mut WebSocketStream<TcpStream>, frame: &ServerFrame<'_>) {
    let _ = ws
        .send(Message::Binary(frame::to_message(frame).into()))
        .await;
}

async fn serve(mut ws: WebSocketStream<TcpStream>, flaw: Flaw, ids: &AtomicU64) {
    let authorized = loop {
        match ws.next().await {
            Some(Ok(Message::Binary(message))) => {
                break matches!(
                    ClientFrame::decode(&message),
                    Ok(ClientFrame::Authorization { payload }) if Authorization::decode(payload).is_ok()
                );
            }
            Some(Ok(Message::Close(_)) | Err(_)) | None => return,
            Some(Ok(_)) => {}
        }
    };
    if !authorized {
        let _ = ws.close(None).await;
        return;
    }
    let mut open = HashSet::new();
    while let Some(Ok(message)) = ws.next().await {
        let Message::Binary(message) = message else {
            continue;
        };
        match ClientFrame::decode(&message) {
            Ok(ClientFrame::Authorization { .. }) => {
                let _ = ws.close(None).await;
                return;
            }
            Ok(ClientFrame::Request { scope, payload }) if !open.contains(&scope) => {
                match EndpointRequest::decode(payload) {
                    Ok(EndpointRequest::AgentsRun(request))
                        if request.validate().is_ok() && !request.container.has_mounts() =>
                    {
                        open.insert(scope);
                        let id =
                            format!("{{\"id\":\"run-{}\"}}", ids.fetch_add(1, Ordering::SeqCst));
                        let payload = [&[0][..], id.as_bytes()].concat();
                        send(
                            &mut ws,
                            &ServerFrame::Response {
                                scope,
                                payload: &payload,
                            },
                        )
                        .await;
                    }
                    Ok(EndpointRequest::AgentsRun(_)) => {
                        let payload = b"\x01{\"kind\":\"policy\",\"error\":\"no mounts\"}";
                        send(&mut ws, &ServerFrame::Response { scope, payload }).await;
                        send(&mut ws, &ServerFrame::ResponseFinish { scope }).await;
                    }
                    Ok(EndpointRequest::Unserved(_)) if flaw == Flaw::ErrorForUnknownEndpoint => {
                        let payload = b"\x01\"unknown endpoint\"";
                        send(&mut ws, &ServerFrame::Response { scope, payload }).await;
                        send(&mut ws, &ServerFrame::ResponseFinish { scope }).await;
                    }
                    Ok(EndpointRequest::Unserved(_)) | Err(_) => {
                        send(&mut ws, &ServerFrame::ResponseFinish { scope }).await;
                    }
                }
            }
            Ok(ClientFrame::ChannelRequest {
                scope,
                channel,
                payload,
            }) if open.contains(&scope) => match ChannelRequest::decode(payload) {
                Ok(ChannelRequest::Stop) if flaw == Flaw::NoFinishOnStop => {}
                Ok(ChannelRequest::Stop) => {
                    open.remove(&scope);
                    send(&mut ws, &ServerFrame::ResponseFinish { scope }).await;
                }
                Ok(ChannelRequest::RunLoop(_)) => {
                    let mut responses = vec![chunk("Hello")];
                    if flaw == Flaw::ChunkAfterError {
                        responses.insert(0, b"\x01{\"kind\":\"agent\",\"error\":\"x\"}".to_vec());
                    }
                    for payload in &responses {
                        send(
                            &mut ws,
                            &ServerFrame::ChannelResponse {
                                scope,
                                channel,
                                payload,
                            },
                        )
                        .await;
                    }
                    send(
                        &mut ws,
                        &ServerFrame::ChannelResponseFinish { scope, channel },
                    )
                    .await;
                }
                Ok(ChannelRequest::Unserved(_)) | Err(_) => {
                    send(
                        &mut ws,
                        &ServerFrame::ChannelResponseFinish { scope, channel },
                    )
                    .await;
                }
            },
            // Malformed, or naming a scope or channel that is not open (or a
            // scope that is): disregarded.
            _ => {}
        }
    }
}

/// Runs `check` against a hand-written server with `flaw`; its exit code
/// and text output.
fn check_against(flaw: Flaw) -> (Option<i32>, String) {
    let runtime = runtime();
    let url = hand_written_server(&runtime, flaw);
    let output = runloop_output(&["check", "--url", &url, "--timeout", "3"]);
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    (output.status.code(), stdout)
}

/// `runloop check` against a server with `flaw`, which fails it (exit
/// code 1): what it printed.
fn failed_against(flaw: Flaw) -> String {
    let (code, stdout) = check_against(flaw);
    assert_eq!(code, Some(1), "{stdout}");
    stdout
}

/// The line of the case named `name`.
fn line<'a>(stdout: &'a str, name: &str) -> &'a str {
    stdout
        .lines()
        .find(|line| {
            line.split_once('§')
                .and_then(|(_, section)| section.split_once(' '))
                .is_some_and(|(_, rest)| rest.trim_start().starts_with(name))
        })
        .unwrap_or_else(|| panic!("no line for {name:?} in:\n{stdout}"))
}

#[test]
fn a_minimal_hand_written_server_passes_and_its_open_door_is_noted() {
    let (code, stdout) = check_against(Flaw::None);
    assert_eq!(code, Some(0), "{stdout}");
    assert!(
        !stdout.contains("FAIL") && !stdout.contains("SKIP"),
        "{stdout}"
    );
    assert_eq!(
        line(&stdout, "a wrong credential"),
        "INFO  protocol §3   a wrong credential: the connection is closed with no frame: the server \
         accepts any credential: fine for a loopback development server, not for production"
    );
    assert_eq!(
        line(&stdout, "a run-loop's response sequence is valid"),
        "PASS  protocol §7   a run-loop's response sequence is valid: finished (1 chunk): the loop finished"
    );
    assert!(
        stdout.contains(" 0 failed, 1 info, 0 skipped: every MUST case holds"),
        "{stdout}"
    );
}

#[test]
fn a_chunk_after_the_error_fails_the_run_loop_case() {
    let stdout = failed_against(Flaw::ChunkAfterError);
    assert_eq!(
        line(&stdout, "a run-loop's response sequence is valid"),
        "FAIL  protocol §7   a run-loop's response sequence is valid: broken after 0 chunks: a response \
         came after the error"
    );
    assert_eq!(
        line(&stdout, "stop during a run-loop"),
        "FAIL  protocol §6   stop during a run-loop: the loop's channel ends before the scope's finish: \
         the loop's sequence: broken: a response came after the error"
    );
    // Only the loop is wrong: everything else still passes.
    let failed: Vec<&str> = stdout.lines().filter(|l| l.starts_with("FAIL")).collect();
    assert_eq!(failed.len(), 2, "{stdout}");
    assert!(stdout.contains(" passed, 2 failed, "), "{stdout}");
}

#[test]
fn an_error_for_an_unknown_endpoint_fails_the_bare_finish_case() {
    let stdout = failed_against(Flaw::ErrorForUnknownEndpoint);
    assert_eq!(
        line(&stdout, "unknown endpoint tag 200 gets a bare finish"),
        "FAIL  protocol §4   unknown endpoint tag 200 gets a bare finish: expected the finish of scope 1, \
         got a response on scope 1: [1]\"unknown endpoint\""
    );
    // The cases that show something with the probe, which is this very
    // request, cannot be judged: skipped, saying why.
    assert!(
        line(&stdout, "an empty request gets a bare finish").starts_with(
            "SKIP  protocol §4   an empty request gets a bare finish: the probe this case relies on, a \
             request with unknown endpoint tag 200, does not get a bare finish"
        ),
        "{stdout}"
    );
    assert!(
        line(&stdout, "truncated frames").starts_with("SKIP"),
        "{stdout}"
    );
    // What needs no probe is still judged.
    let failed: Vec<&str> = stdout.lines().filter(|l| l.starts_with("FAIL")).collect();
    assert_eq!(failed.len(), 1, "{stdout}");
    assert!(
        line(&stdout, "a run request is answered with the id first").starts_with("PASS"),
        "{stdout}"
    );
}

#[test]
fn a_stop_that_is_never_answered_fails_on_the_timeout() {
    let stdout = failed_against(Flaw::NoFinishOnStop);
    let stop = line(&stdout, "stop is answered by the scope's finish alone");
    assert!(
        stop.starts_with("FAIL  protocol §6   ")
            && stop.ends_with(": after a stop on channel 1: expected the finish of scope 1, got nothing within 3 s"),
        "{stop}"
    );
    assert!(
        line(&stdout, "after the id, nothing comes on the main stream").starts_with("FAIL"),
        "{stdout}"
    );
    assert!(
        line(&stdout, "unknown endpoint tag 200 gets a bare finish").starts_with("PASS"),
        "{stdout}"
    );
}
