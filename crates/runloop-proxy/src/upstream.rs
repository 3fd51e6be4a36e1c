//! The agent program, as the proxy calls it: `POST /register` and
//! `POST /run` over HTTP, and the error value each failure becomes (protocol §10).
//!
//! Every failure is turned into error JSON here, once, so the two paths only
//! decide when to send it:
//!
//! ```text
//! cannot dial / no answer     {"kind":"agent","error":"<reason>"}
//!   the program exited        … "the agent program exited (<how>) before it answered POST /run"
//!   it closed the connection  … "the agent program closed the connection without answering …"
//! non-2xx, JSON body          {"kind":"agent","status":N,"error":<the body's JSON value>}
//! non-2xx, other body         {"kind":"agent","status":N,"error":"<body as text>"}
//! 2xx, not text/event-stream  {"kind":"agent","status":N,"error":"<what came instead>"}
//! ```
//!
//! An agent program's answer is always wrapped, never passed on as the
//! error itself (protocol §12, "an agent speaks for itself"): a body that
//! says `{"kind":"policy",…}` must not read as the server's own refusal,
//! so whatever the program says arrives under `kind` `agent`, with its
//! status beside it.
//!
//! A 2xx event stream also says how its body ends ([`Framing`]): only a
//! marked end (chunked, HTTP/2) or a length can prove the loop finished. A
//! body that ends when the connection closes reads the same whether the
//! agent program finished or crashed (protocol §10), so the proxy relays its
//! events and then says it cannot tell.
//!
//! A call that gets no answer is said in the agent program's terms, not the
//! HTTP client's: how the program ended, when the runtime that watches it
//! says so ([`AgentEnd`]), else that it closed the connection (a crash
//! inside its handler) or could not be reached, and where its output is.
//! The HTTP client's own account goes to the proxy's log.

use std::io;
use std::net::SocketAddr;
use std::sync::OnceLock;

use bytes::{Bytes, BytesMut};
use reqwest::header::{
    ACCEPT, CONTENT_LENGTH, CONTENT_TYPE, HeaderMap, HeaderValue, TRANSFER_ENCODING,
};
use reqwest::{StatusCode, Version};
use runloop_proto::error_chain::Chain;
use runloop_proto::{ErrorKind, ErrorValue};
use serde_json::{Map, Value};
use tracing::warn;

use super::AgentEnd;

/// The error JSON of a failed call, ready to follow the `1` tag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Failure(pub(super) Bytes);

impl Failure {
    /// This project's own shape, `{"kind":"agent","error":…}`.
    pub(super) fn agent(error: impl std::fmt::Display) -> Failure {
        Failure::from_error(&ErrorValue::kind(ErrorKind::Agent, error))
    }

    /// `{"kind":"agent","status":N,"error":"…"}`.
    fn status(status: u16, error: String) -> Failure {
        Failure::answered(status, Value::from(error))
    }

    /// `{"kind":"agent","status":N,"error":<error>}`: what the agent
    /// program answered, under its own kind, whatever the body says.
    fn answered(status: u16, error: Value) -> Failure {
        let mut object = Map::with_capacity(3);
        object.insert("kind".to_owned(), Value::from(ErrorKind::Agent.as_str()));
        object.insert("status".to_owned(), Value::from(status));
        object.insert("error".to_owned(), error);
        Failure::from_error(&ErrorValue::new(object))
    }

    fn from_error(error: &ErrorValue) -> Failure {
        let mut json = Vec::new();
        error.write_json(&mut runloop_proto::Writer::new(&mut json));
        Failure(Bytes::from(json))
    }
}

/// How a `/run` body shows where it ends, as hyper reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Framing {
    /// Chunked transfer encoding or HTTP/2: the end is marked.
    Marked,
    /// A `Content-Length` of this many bytes.
    Length(u64),
    /// Neither: the body ends when the connection closes, which a crash
    /// does too.
    Close,
}

impl Framing {
    /// The framing hyper gives a response with this version, status and
    /// headers: a transfer encoding decides over a length (it is chunked
    /// when its last coding is, and hyper accepts it only on HTTP/1.1),
    /// a 204 has no body, and without either the connection's close is the
    /// end.
    fn of(version: Version, status: StatusCode, headers: &HeaderMap) -> Framing {
        if version >= Version::HTTP_2 {
            return Framing::Marked;
        }
        if status == StatusCode::NO_CONTENT {
            return Framing::Length(0);
        }
        let mut codings = headers.get_all(TRANSFER_ENCODING).iter().peekable();
        if codings.peek().is_some() {
            let last = codings
                .last()
                .and_then(|value| value.to_str().ok())
                .and_then(|value| value.rsplit(',').next())
                .map(str::trim);
            return if last.is_some_and(|coding| coding.eq_ignore_ascii_case("chunked")) {
                Framing::Marked
            } else {
                Framing::Close
            };
        }
        headers
            .get(CONTENT_LENGTH)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.trim().parse().ok())
            .map_or(Framing::Close, Framing::Length)
    }
}

/// The HTTP client every proxy of this process calls its agent program
/// with, built on first use.
///
/// Why one: building a client is not free where the process links a TLS
/// backend (a server with containers does, for registries): it loads the
/// system's CA bundle, about 50 ms of CPU, on the async runtime's thread.
/// Built per proxy, 400 container starts at once held the runtime's
/// threads for 20 s, long enough for the server's own dial of a proxy to
/// wait out the proxy's handshake timeout. The proxy speaks plain HTTP to
/// loopback and never needs those roots.
///
/// It keeps no idle connection (`pool_max_idle_per_host(0)`): a connection
/// lives as long as its one request, so no connection made for one run is
/// ever offered to another.
fn client() -> io::Result<reqwest::Client> {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    if let Some(client) = CLIENT.get() {
        return Ok(client.clone());
    }
    // reqwest may be built with TLS and no provider (the registry
    // client's feature, shared by the build): it then wants a default.
    runloop_wire::tls::install_default_provider();
    let client = reqwest::Client::builder()
        // The agent program is on the container's loopback: a proxy from
        // the environment would be wrong.
        .no_proxy()
        .pool_max_idle_per_host(0)
        .build()
        .map_err(io::Error::other)?;
    Ok(CLIENT.get_or_init(|| client).clone())
}

/// An HTTP client bound to one agent program.
#[derive(Debug, Clone)]
pub(super) struct Upstream {
    client: reqwest::Client,
    agent: SocketAddr,
    register_url: String,
    run_url: String,
    max_error_body: usize,
    /// How the program ended, where a runtime watches it.
    ended: Option<AgentEnd>,
}

/// How long a call that failed waits to learn that the agent program
/// exited: the connection's end reaches the proxy before the runtime has
/// reaped the program.
const EXIT_WAIT: std::time::Duration = std::time::Duration::from_millis(250);

impl Upstream {
    /// A client for the agent program at `agent`, whose end `ended` tells
    /// when a runtime watches it.
    pub(super) fn new(
        agent: SocketAddr,
        max_error_body: usize,
        ended: Option<AgentEnd>,
    ) -> io::Result<Upstream> {
        Ok(Upstream {
            client: client()?,
            agent,
            register_url: format!("http://{agent}/register"),
            run_url: format!("http://{agent}/run"),
            max_error_body,
            ended,
        })
    }

    /// How the agent program ended, when the runtime says so within
    /// [`EXIT_WAIT`]; `None` when nobody watches it or it still runs.
    pub(super) async fn exited(&self) -> Option<String> {
        let mut ended = self.ended.clone()?;
        let said = tokio::time::timeout(EXIT_WAIT, ended.wait_for(Option::is_some)).await;
        said.ok()?.ok()?.clone()
    }

    /// `POST /register` with the server's ask, as it came.
    pub(super) async fn register(&self, ask: Bytes) -> Result<(), Failure> {
        let response = self
            .post(&self.register_url, "/register", ask, "application/json")
            .await?;
        if response.status().is_success() {
            Ok(())
        } else {
            Err(self.refused(response).await)
        }
    }

    /// `POST /run` with the run-loop request, as it came; the response is
    /// a 2xx event stream, framed as it says.
    pub(super) async fn run_loop(
        &self,
        ask: Bytes,
    ) -> Result<(reqwest::Response, Framing), Failure> {
        let response = self
            .post(&self.run_url, "/run", ask, "text/event-stream")
            .await?;
        let status = response.status();
        if !status.is_success() {
            return Err(self.refused(response).await);
        }
        let content_type = response.headers().get(CONTENT_TYPE);
        if !is_event_stream(content_type) {
            let what = content_type
                .map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned())
                .unwrap_or_else(|| "none".to_owned());
            return Err(Failure::status(
                status.as_u16(),
                format!(
                    "the agent program answered with content type {what:?}, not text/event-stream"
                ),
            ));
        }
        let framing = Framing::of(response.version(), status, response.headers());
        Ok((response, framing))
    }

    async fn post(
        &self,
        url: &str,
        path: &str,
        body: Bytes,
        accept: &'static str,
    ) -> Result<reqwest::Response, Failure> {
        let sent = self
            .client
            .post(url)
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
            .header(ACCEPT, HeaderValue::from_static(accept))
            .body(body)
            .send()
            .await;
        match sent {
            Ok(response) => Ok(response),
            Err(error) => Err(self.unanswered(path, &error).await),
        }
    }

    /// A call to `path` that got no answer, in words that point at the
    /// agent program: how it ended, when it did; else whether it could not
    /// be reached or closed the connection, and where its output is.
    async fn unanswered(&self, path: &str, error: &reqwest::Error) -> Failure {
        warn!(path, error = %Chain(error), "no answer from the agent program");
        if let Some(how) = self.exited().await {
            return Failure::agent(format!(
                "the agent program exited ({how}) before it answered POST {path}"
            ));
        }
        if error.is_connect() {
            return Failure::agent(format!(
                "cannot connect to the agent program at {}: {}",
                self.agent,
                cause(error)
            ));
        }
        let output = if self.ended.is_some() {
            "its output is in the server's log"
        } else {
            "its output says why"
        };
        Failure::agent(format!(
            "the agent program closed the connection without answering POST {path}: it failed \
             while handling the request, or exited ({output})"
        ))
    }

    /// A non-2xx answer, wrapped: its body as a JSON value when it is
    /// JSON, else as text.
    async fn refused(&self, mut response: reqwest::Response) -> Failure {
        let status = response.status().as_u16();
        let mut body = BytesMut::new();
        let mut cut = false;
        loop {
            match response.chunk().await {
                Ok(Some(piece)) => {
                    let room = self.max_error_body - body.len();
                    if piece.len() > room {
                        body.extend_from_slice(&piece[..room]);
                        cut = true;
                        break;
                    }
                    body.extend_from_slice(&piece);
                }
                Ok(None) => break,
                Err(error) => {
                    return Failure::status(
                        status,
                        format!("the agent program's error body broke: {}", Chain(&error)),
                    );
                }
            }
        }
        if !cut && let Ok(value) = serde_json::from_slice::<Value>(&body) {
            return Failure::answered(status, value);
        }
        let mut text = String::from_utf8_lossy(&body).into_owned();
        if cut {
            text.push_str(&format!(" … (cut at {} bytes)", self.max_error_body));
        }
        Failure::status(status, text)
    }
}

/// Whether a `Content-Type` is `text/event-stream`, parameters aside.
fn is_event_stream(content_type: Option<&HeaderValue>) -> bool {
    content_type
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .is_some_and(|essence| essence.trim().eq_ignore_ascii_case("text/event-stream"))
}

/// The innermost source of an error: what the system said.
fn cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut inner = error;
    while let Some(source) = inner.source() {
        inner = source;
    }
    inner.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_stream_content_types() {
        let is = |value: &'static str| is_event_stream(Some(&HeaderValue::from_static(value)));
        assert!(is("text/event-stream"));
        assert!(is("Text/Event-Stream; charset=utf-8"));
        assert!(!is("application/json"));
        assert!(!is("text/event-streams"));
        assert!(!is_event_stream(None));
    }

    #[test]
    fn framings() {
        let of = |version, status: u16, headers: &[(&'static str, &'static str)]| {
            let mut map = HeaderMap::new();
            for (name, value) in headers {
                map.append(*name, HeaderValue::from_static(value));
            }
            Framing::of(version, StatusCode::from_u16(status).expect("status"), &map)
        };
        let chunked = [("transfer-encoding", "chunked")];
        assert_eq!(of(Version::HTTP_11, 200, &chunked), Framing::Marked);
        assert_eq!(
            of(
                Version::HTTP_11,
                200,
                &[("transfer-encoding", "gzip, Chunked")]
            ),
            Framing::Marked
        );
        assert_eq!(
            of(
                Version::HTTP_11,
                200,
                &[
                    ("transfer-encoding", "chunked"),
                    ("transfer-encoding", "gzip")
                ]
            ),
            Framing::Close,
            "not chunked last: the close is the end"
        );
        assert_eq!(
            of(
                Version::HTTP_11,
                200,
                &[("transfer-encoding", "chunked"), ("content-length", "5")]
            ),
            Framing::Marked,
            "the transfer encoding decides"
        );
        assert_eq!(
            of(Version::HTTP_10, 200, &[("content-length", "42")]),
            Framing::Length(42)
        );
        assert_eq!(of(Version::HTTP_10, 200, &[]), Framing::Close);
        assert_eq!(of(Version::HTTP_11, 200, &[]), Framing::Close);
        assert_eq!(of(Version::HTTP_11, 204, &[]), Framing::Length(0));
        assert_eq!(of(Version::HTTP_2, 200, &[]), Framing::Marked);
    }

    #[test]
    fn failure_shapes() {
        assert_eq!(
            Failure::agent("connection refused").0,
            &br#"{"kind":"agent","error":"connection refused"}"#[..]
        );
        assert_eq!(
            Failure::status(502, "bad gateway".to_owned()).0,
            &br#"{"kind":"agent","status":502,"error":"bad gateway"}"#[..]
        );
        assert_eq!(
            Failure::answered(400, serde_json::json!({"kind": "policy", "error": "no"})).0,
            &br#"{"kind":"agent","status":400,"error":{"kind":"policy","error":"no"}}"#[..]
        );
    }
}
