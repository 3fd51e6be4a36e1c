//! The handshake: a connection's WebSocket upgrade, which picks its path,
//! or a `503` that says why the proxy will not take it.
//!
//! ```text
//! accepted ──first byte within handshake_timeout──▶ upgrade (handshake_timeout) ──▶ path
//!    │ nothing came, or the proxy shuts down                │ bad request: 404 / 400
//!    ▼                                                      ▼ too slow: closed
//! 503 and the reason, the request read and dropped, closed
//! ```
//!
//! Why the clock waits for the first byte: the proxy's dialler is usually
//! the server in the same process, and it writes its request in one piece
//! right after its connect. When the process is too busy to run it at
//! once, the proxy's task can still be running: a timeout from the accept
//! would close the connection of a start the server could serve, and the
//! server would read only "Handshake not finished". So a connection with
//! nothing sent yet gets a `503` with the reason (the server reads it, and
//! dials again), never a silent close; one that began its request and
//! stalled is a client gone wrong, and is closed.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::StatusCode;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::ProxyConfig;
use super::path::{SHUTTING_DOWN, Ws};
use runloop_wire::lane::Lane;

/// The WebSocket's own read buffer on a path.
const READ_BUFFER: usize = 4 << 10;

/// The two paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Path {
    Register,
    Run,
}

/// The connection's WebSocket, its lane and its path; `None` when it was
/// refused or failed (and is closed).
pub(super) async fn accept(
    stream: TcpStream,
    config: &ProxyConfig,
    shutdown: &CancellationToken,
) -> Option<(Ws, Lane, Path)> {
    let timeout = config.handshake_timeout;
    let mut first = [0u8; 1];
    let began = tokio::select! {
        () = shutdown.cancelled() => Err(SHUTTING_DOWN.to_owned()),
        peeked = tokio::time::timeout(timeout, stream.peek(&mut first)) => match peeked {
            Ok(Ok(0)) => return None,
            Ok(Ok(_)) => Ok(()),
            Ok(Err(error)) => {
                debug!(%error, "the connection broke before its request");
                return None;
            }
            Err(_) => Err(format!(
                "no WebSocket request came within {} s of the connection; dial again",
                timeout.as_secs_f64()
            )),
        },
    };
    if let Err(why) = began {
        debug!(%why, "handshake refused");
        refuse(stream, &why, config).await;
        return None;
    }
    let mut path = None;
    // The error type is tungstenite's handshake response, not ours to shrink.
    #[allow(clippy::result_large_err)]
    let pick = |request: &Request, response: Response| match request.uri().path() {
        "/agent/register" => {
            path = Some(Path::Register);
            Ok(response)
        }
        "/agent/run" => {
            path = Some(Path::Run);
            Ok(response)
        }
        other => {
            let mut refusal = ErrorResponse::new(Some(format!("no such path: {other}\n")));
            *refusal.status_mut() = StatusCode::NOT_FOUND;
            Err(refusal)
        }
    };
    // A small read buffer: the WebSocket reads only the ask and the
    // server's close, and zero-fills its room before each read (the
    // default's 128 KiB, at every look for the server's close, cost more
    // than a small chunk's whole relay).
    let websocket = WebSocketConfig::default()
        .read_buffer_size(READ_BUFFER)
        .max_message_size(Some(config.max_ask))
        .max_frame_size(Some(config.max_ask));
    let (stream, lane) = Lane::new(stream);
    let handshake = tokio_tungstenite::accept_hdr_async_with_config(stream, pick, Some(websocket));
    let ws = tokio::select! {
        () = shutdown.cancelled() => return None,
        done = tokio::time::timeout(timeout, handshake) => match done {
            Ok(Ok(ws)) => ws,
            Ok(Err(error)) => {
                debug!(%error, "handshake refused or failed");
                return None;
            }
            Err(_) => {
                debug!("handshake timed out");
                return None;
            }
        },
    };
    lane.frames();
    match path {
        Some(path) => Some((ws, lane, path)),
        None => {
            debug!("handshake accepted without a path");
            None
        }
    }
}

/// How much of a refused connection's request is read before it is
/// closed anyway.
const REFUSED_READ: usize = 64 << 10;

/// Answers `503 Service Unavailable` with `why`, ends the proxy's side, and
/// reads what the client still sends (boundedly, within the close
/// timeout): a request that met a closed socket would reset the
/// connection, and the answer with it, before the client read it.
async fn refuse(mut stream: TcpStream, why: &str, config: &ProxyConfig) {
    let answer = refusal(why);
    let answered = async {
        stream.write_all(&answer).await?;
        stream.shutdown().await
    };
    if let Err(error) = bounded(config.close_timeout, answered).await {
        debug!(%error, "the refusal was not sent");
        return;
    }
    let drained = async {
        let mut sink = [0u8; 4096];
        let mut read = 0;
        while read < REFUSED_READ {
            match stream.read(&mut sink).await? {
                0 => break,
                n => read += n,
            }
        }
        Ok(())
    };
    let _ = bounded(config.close_timeout, drained).await;
}

/// `work` within `limit`; running out is an error like any other.
async fn bounded(
    limit: Duration,
    work: impl Future<Output = std::io::Result<()>>,
) -> std::io::Result<()> {
    tokio::time::timeout(limit, work)
        .await
        .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()))
}

/// The HTTP answer of a refused connection: `503`, the reason as text.
fn refusal(why: &str) -> Vec<u8> {
    let body = format!("{why}\n");
    format!(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_is_a_503_with_the_reason_as_its_body() {
        let answer = String::from_utf8(refusal("the proxy is shutting down")).expect("text");
        let (head, body) = answer.split_once("\r\n\r\n").expect("a head and a body");
        assert!(
            head.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
            "{head}"
        );
        assert!(
            head.contains(&format!("Content-Length: {}", body.len())),
            "{head}"
        );
        assert_eq!(body, "the proxy is shutting down\n");
    }
}
