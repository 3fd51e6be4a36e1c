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
//! marked end (chunked) or a length can prove the loop finished. A
//! body that ends when the connection closes reads the same whether the
//! agent program finished or crashed (protocol §10), so the proxy relays its
//! events and then says it cannot tell.
//!
//! A call that gets no answer is said in the agent program's terms, not the
//! HTTP client's: how the program ended, when the runtime that watches it
//! says so ([`AgentEnd`]), else that it closed the connection (a crash
//! inside its handler) or could not be reached, and where its output is.
//! The HTTP client's own account goes to the proxy's log. The client is
//! the proxy's own ([`http1`](super::http1)).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use runloop_proto::error_chain::Chain;
use runloop_proto::{ErrorKind, ErrorValue};
use serde_json::{Map, Value};
use tracing::warn;

use super::AgentEnd;
use super::dial::Dial;
use super::http1::{self, Answer, Body, Unanswered};

pub(super) use super::http1::Framing;

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

/// The calls to one agent program.
#[derive(Debug, Clone)]
pub(super) struct Upstream {
    agent: Arc<dyn Dial>,
    max_error_body: usize,
    /// How the program ended, where a runtime watches it.
    ended: Option<AgentEnd>,
}

/// How long a call that failed waits to learn that the agent program
/// exited: the connection's end reaches the proxy before the runtime has
/// reaped the program.
const EXIT_WAIT: Duration = Duration::from_millis(250);

/// How long a call that failed waits for the words of an end its runtime
/// has begun ([`Dial::lost`]): a container killed for its memory is
/// reaped in well under this.
const ENDING_WAIT: Duration = Duration::from_secs(10);

impl Upstream {
    /// A client for the agent program `agent` dials, whose end `ended`
    /// tells when a runtime watches it.
    pub(super) fn new(
        agent: Arc<dyn Dial>,
        max_error_body: usize,
        ended: Option<AgentEnd>,
    ) -> Upstream {
        Upstream {
            agent,
            max_error_body,
            ended,
        }
    }

    /// The agent program's address, as it sees it.
    pub(super) fn agent(&self) -> SocketAddr {
        self.agent.address()
    }

    /// Where the proxy dials it, in words.
    pub(super) fn dial(&self) -> &dyn Dial {
        self.agent.as_ref()
    }

    /// Watches the agent program's end through `ended`.
    pub(super) fn watch_end(&mut self, ended: AgentEnd) {
        self.ended = Some(ended);
    }

    /// Keeps at most `max` bytes of an error body.
    pub(super) fn bound_error_body(&mut self, max: usize) {
        self.max_error_body = max;
    }

    /// How the agent program ended, once a call's connection was lost,
    /// when the runtime says so within [`EXIT_WAIT`] (or [`ENDING_WAIT`],
    /// when it is ending the program for the loss: [`Dial::lost`]);
    /// `None` when nobody watches it or it still runs.
    pub(super) async fn exited(&self) -> Option<String> {
        // Asked first: the runtime ends the program for the loss even
        // where nobody is told.
        let patience = if self.agent.lost() {
            ENDING_WAIT
        } else {
            EXIT_WAIT
        };
        let mut ended = self.ended.clone()?;
        let said = tokio::time::timeout(patience, ended.wait_for(Option::is_some)).await;
        said.ok()?.ok()?.clone()
    }

    /// `POST /register` with the server's ask, as it came.
    pub(super) async fn register(&self, ask: Bytes) -> Result<(), Failure> {
        let answer = self.post("/register", &ask, "application/json").await?;
        if (200..300).contains(&answer.status) {
            Ok(())
        } else {
            Err(self.refused(answer).await)
        }
    }

    /// `POST /run` with the run-loop request, as it came; the answer is
    /// a 2xx event stream, framed as it says: its body and its framing.
    pub(super) async fn run_loop(&self, ask: Bytes) -> Result<(Body, Framing), Failure> {
        let answer = self.post("/run", &ask, "text/event-stream").await?;
        let status = answer.status;
        if !(200..300).contains(&status) {
            return Err(self.refused(answer).await);
        }
        if !is_event_stream(answer.content_type.as_deref()) {
            let what = answer
                .content_type
                .as_deref()
                .map(|value| String::from_utf8_lossy(value).into_owned())
                .unwrap_or_else(|| "none".to_owned());
            return Err(Failure::status(
                status,
                format!(
                    "the agent program answered with content type {what:?}, not text/event-stream"
                ),
            ));
        }
        Ok((answer.body, answer.framing))
    }

    async fn post(&self, path: &str, body: &[u8], accept: &str) -> Result<Answer, Failure> {
        match http1::post(self.agent.as_ref(), path, body, accept).await {
            Ok(answer) => Ok(answer),
            Err(unanswered) => Err(self.unanswered(path, unanswered).await),
        }
    }

    /// A call to `path` that got no answer, in words that point at the
    /// agent program: how it ended, when it did; else whether it could not
    /// be reached, closed the connection, or answered in something that is
    /// not HTTP, and where its output is.
    async fn unanswered(&self, path: &str, unanswered: Unanswered) -> Failure {
        warn!(path, error = %unanswered, "no answer from the agent program");
        if let Some(how) = self.exited().await {
            return Failure::agent(format!(
                "the agent program exited ({how}) before it answered POST {path}"
            ));
        }
        let output = if self.ended.is_some() {
            "its output is in the server's log"
        } else {
            "its output says why"
        };
        match unanswered {
            Unanswered::Connect(error) => Failure::agent(format!(
                "cannot reach the agent program on {}: {error}",
                self.agent
            )),
            Unanswered::Malformed(why) => Failure::agent(format!(
                "the agent program's answer to POST {path} is not HTTP/1.1 ({why}) ({output})"
            )),
            Unanswered::Closed(_) => Failure::agent(format!(
                "the agent program closed the connection without answering POST {path}: it \
                 failed while handling the request, or exited ({output})"
            )),
        }
    }

    /// A non-2xx answer, wrapped: its body as a JSON value when it is
    /// JSON, else as text.
    async fn refused(&self, answer: Answer) -> Failure {
        let status = answer.status;
        let mut response = answer.body;
        let mut body = BytesMut::new();
        let mut cut = false;
        loop {
            match response.next().await {
                Some(Ok(piece)) => {
                    let room = self.max_error_body - body.len();
                    if piece.len() > room {
                        body.extend_from_slice(&piece[..room]);
                        cut = true;
                        break;
                    }
                    body.extend_from_slice(&piece);
                }
                None => break,
                Some(Err(error)) => {
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
fn is_event_stream(content_type: Option<&[u8]>) -> bool {
    content_type
        .and_then(|value| std::str::from_utf8(value).ok())
        .and_then(|value| value.split(';').next())
        .is_some_and(|essence| essence.trim().eq_ignore_ascii_case("text/event-stream"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_stream_content_types() {
        let is = |value: &'static str| is_event_stream(Some(value.as_bytes()));
        assert!(is("text/event-stream"));
        assert!(is("Text/Event-Stream; charset=utf-8"));
        assert!(!is("application/json"));
        assert!(!is("text/event-streams"));
        assert!(!is_event_stream(None));
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

    /// A dial of a test's own: where nothing listens, said in its own
    /// words, and whether the proxy told it a connection was lost.
    #[derive(Debug, Default)]
    struct Nowhere {
        lost: std::sync::atomic::AtomicUsize,
    }

    impl std::fmt::Display for Nowhere {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("port 9 of the test's own place")
        }
    }

    impl Dial for Nowhere {
        fn address(&self) -> SocketAddr {
            SocketAddr::from(([127, 0, 0, 1], 9))
        }

        fn connect(&self) -> crate::Dialing<'_> {
            Box::pin(async { Err(std::io::Error::from(std::io::ErrorKind::ConnectionRefused)) })
        }

        fn lost(&self) -> bool {
            self.lost.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            false
        }
    }

    #[tokio::test]
    async fn a_call_is_made_through_the_dial_which_hears_of_a_loss_and_names_the_place() {
        let dial = Arc::new(Nowhere::default());
        let upstream = Upstream::new(Arc::clone(&dial) as Arc<dyn Dial>, 1024, None);
        let failed = upstream
            .register(Bytes::from_static(b"{}"))
            .await
            .expect_err("nothing answers there");
        let json: Value = serde_json::from_slice(&failed.0).expect("error JSON");
        assert_eq!(json["kind"], "agent");
        let said = json["error"].as_str().expect("words");
        assert!(
            said.starts_with("cannot reach the agent program on port 9 of the test's own place: "),
            "{said}"
        );
        assert_eq!(dial.lost.load(std::sync::atomic::Ordering::SeqCst), 1);
    }
}
