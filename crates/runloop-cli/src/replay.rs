//! `runloop __replay DIR`: the server's side of the captures in `DIR`,
//! played back over a real WebSocket to whichever client connects, so the
//! clients of every language (the Rust client under `runloop run`, the
//! Python package, the TypeScript package) are tested against one corpus
//! of captured cases (`corpus/` at the repository's root) through their
//! own socket code, and cannot drift apart.
//!
//! A client picks its case by the URL's path: `ws://127.0.0.1:PORT/NAME`
//! plays `DIR/NAME.txt`; another path gets HTTP 404 before the upgrade.
//! The capture's lines are played in order: a `<` line is sent as it is, a
//! `>` line waits for the client's next binary message and checks that it
//! is a frame of the same type (and, for a channel request, the same channel
//! tag). A client picks its own scope and channel numbers, so the numbers of
//! the capture's requests are mapped to the client's as they come, and the
//! scope and channel of every `<` line after them are written with the
//! client's; a number the capture never requested is sent as it is. At the
//! capture's end the replay closes the connection (with a close handshake):
//! a loop still open then ends as a connection that ended.
//!
//! A client that sends something else, or ends the connection before the
//! capture expects it, has the connection dropped, and the replay says why
//! on stderr: the client's test then fails on an outcome it did not expect,
//! with the reason beside it in the test's output.

use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use runloop_proto::capture::{self, Direction};
use runloop_proto::frame::HEADER_LEN;
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::StatusCode;

use crate::exit::{Exit, Failure};
use crate::process::block_on;

/// Arguments of `runloop __replay`.
#[derive(Debug, clap::Args)]
pub struct ReplayArgs {
    /// The directory of captures (`NAME.txt`).
    pub dir: PathBuf,
    /// Where to listen.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: String,
}

/// One capture: its messages, in order.
type Case = Vec<capture::Message>;

/// How long the replay waits for the client's side of the close handshake.
const CLOSE_WAIT: Duration = Duration::from_secs(5);

impl ReplayArgs {
    /// Prints the URL (one line), then serves the captures until killed.
    pub fn execute(&self, out: &mut impl Write) -> Result<Exit, Failure> {
        let cases = Arc::new(self.load()?);
        block_on(async {
            let listener =
                TcpListener::bind(&self.listen)
                    .await
                    .map_err(|source| Failure::Listen {
                        addr: self.listen.clone(),
                        source,
                    })?;
            let addr = listener.local_addr().map_err(Failure::Runtime)?;
            writeln!(out, "ws://{addr}")
                .and_then(|()| out.flush())
                .map_err(Failure::Runtime)?;
            loop {
                let (tcp, _) = listener.accept().await.map_err(Failure::Runtime)?;
                tokio::spawn(serve(tcp, Arc::clone(&cases)));
            }
        })?
    }

    /// Every `NAME.txt` of the directory, read and parsed.
    fn load(&self) -> Result<HashMap<String, Case>, Failure> {
        let unreadable = |why: String| Failure::Argument(format!("{}: {why}", self.dir.display()));
        let mut cases = HashMap::new();
        let entries = fs::read_dir(&self.dir).map_err(|e| unreadable(e.to_string()))?;
        for entry in entries {
            let path = entry.map_err(|e| unreadable(e.to_string()))?.path();
            let (Some(name), Some("txt")) = (
                path.file_stem().and_then(|s| s.to_str()),
                path.extension().and_then(|s| s.to_str()),
            ) else {
                continue;
            };
            let text = fs::read(&path).map_err(|e| unreadable(e.to_string()))?;
            let mut messages = Vec::new();
            for (number, line) in text.split(|&b| b == b'\n').enumerate() {
                match capture::parse_message(line) {
                    Ok(Some(message)) => messages.push(message),
                    Ok(None) => {}
                    Err(why) => {
                        return Err(unreadable(format!("{name}.txt line {}: {why}", number + 1)));
                    }
                }
            }
            cases.insert(name.to_owned(), messages);
        }
        Ok(cases)
    }
}

/// One connection: the case its path names, played.
async fn serve(tcp: TcpStream, cases: Arc<HashMap<String, Case>>) {
    let _ = tcp.set_nodelay(true);
    let mut name = String::new();
    // The handshake callback's error type is tungstenite's, large by design.
    #[allow(clippy::result_large_err)]
    let callback = |request: &Request, response: Response| {
        name = request.uri().path().trim_start_matches('/').to_owned();
        if cases.contains_key(&name) {
            Ok(response)
        } else {
            let mut refusal = ErrorResponse::new(Some(format!("no case named {name:?}\n")));
            *refusal.status_mut() = StatusCode::NOT_FOUND;
            Err(refusal)
        }
    };
    let Ok(mut ws) = tokio_tungstenite::accept_hdr_async(tcp, callback).await else {
        return;
    };
    let Some(case) = cases.get(&name) else {
        return;
    };
    if let Err(why) = play(&mut ws, case).await {
        eprintln!("replay {name}: {why}");
        return;
    }
    // The capture's end: a close handshake, the client's answer awaited.
    let _ = ws.close(None).await;
    let _ = tokio::time::timeout(CLOSE_WAIT, async {
        while let Some(Ok(_)) = ws.next().await {}
    })
    .await;
}

/// Plays the capture's lines; why the client did not follow it.
async fn play(
    ws: &mut tokio_tungstenite::WebSocketStream<TcpStream>,
    case: &Case,
) -> Result<(), String> {
    let mut scopes: HashMap<u32, u32> = HashMap::new();
    let mut channels: HashMap<(u32, u32), u32> = HashMap::new();
    for (at, message) in case.iter().enumerate() {
        let line = at + 1;
        let expected = &message.bytes;
        match message.direction {
            Direction::ClientToServer => {
                let got = loop {
                    match ws.next().await {
                        Some(Ok(Message::Binary(bytes))) => break bytes,
                        Some(Ok(Message::Close(_))) | None | Some(Err(_)) => {
                            return Err(format!(
                                "message {line}: the client ended the connection; the capture expects {}",
                                hex_start(expected)
                            ));
                        }
                        Some(Ok(_)) => {}
                    }
                };
                if got.first() != expected.first()
                    || (expected.len() > HEADER_LEN
                        && got.get(HEADER_LEN) != expected.get(HEADER_LEN))
                {
                    return Err(format!(
                        "message {line}: the client sent {}; the capture expects {}",
                        hex_start(&got),
                        hex_start(expected)
                    ));
                }
                if let (Some((kind, scope, channel)), Some((_, got_scope, got_channel))) =
                    (header(expected), header(&got))
                {
                    match kind {
                        1 => {
                            scopes.insert(scope, got_scope);
                        }
                        4 => {
                            channels.insert((scope, channel), got_channel);
                        }
                        _ => {}
                    }
                }
            }
            Direction::ServerToClient => {
                let mut bytes = expected.clone();
                if let Some((kind, scope, channel)) = header(&bytes) {
                    if let Some(&mapped) = scopes.get(&scope) {
                        bytes[1..5].copy_from_slice(&mapped.to_be_bytes());
                    }
                    if let (5 | 6, Some(&mapped)) = (kind, channels.get(&(scope, channel))) {
                        bytes[5..9].copy_from_slice(&mapped.to_be_bytes());
                    }
                }
                ws.send(Message::Binary(bytes.into()))
                    .await
                    .map_err(|e| format!("message {line}: cannot send: {e}"))?;
            }
        }
    }
    Ok(())
}

/// A frame's type, scope and channel, when it has a whole header.
fn header(bytes: &[u8]) -> Option<(u8, u32, u32)> {
    let header: &[u8; HEADER_LEN] = bytes.first_chunk()?;
    let [kind, s0, s1, s2, s3, c0, c1, c2, c3] = *header;
    Some((
        kind,
        u32::from_be_bytes([s0, s1, s2, s3]),
        u32::from_be_bytes([c0, c1, c2, c3]),
    ))
}

/// The first bytes of a message in hex, for a message.
fn hex_start(bytes: &[u8]) -> String {
    let shown: String = bytes.iter().take(12).map(|b| format!("{b:02x}")).collect();
    let more = if bytes.len() > 12 { "…" } else { "" };
    format!("{shown}{more} ({} bytes)", bytes.len())
}
