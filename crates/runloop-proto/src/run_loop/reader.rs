//! The caller's sequence machine: channel responses in, chunks and exactly
//! one [`Outcome`] out (protocol §7).
//!
//! The whole point of the channel is that a caller can tell a finished loop
//! from a partial one, from one that never ran, from one nobody served. The
//! [`Reader`] is where that is decided, once, for every caller: the async
//! client, the capture inspector and the conformance probe all feed it.
//!
//! ```text
//!                 chunk (tag 0)
//!                  ┌─────┐
//!                  ▼     │
//!   ──▶ Open{chunks: n, last chunk fatal?} ──finish──▶ n = 0: NotServed
//!          │       │                                    n > 0: Finished{fatal}
//!          │       └── undecodable payload ──▶ Broken(Undecodable)
//!          │ error (tag 1)
//!          ▼
//!        Erred{error, chunks: n} ──finish──▶ n = 0: NoLoop(error)
//!          │                                 n > 0: Unfinished(error)
//!          └── any response ──▶ Broken(ResponseAfterError)
//!
//!   in any open state: the connection ends, the run ends, the input ends
//!                      ──▶ Broken(ConnectionEnded | RunEnded | InputEnded)
//! ```
//!
//! Every path ends in exactly one outcome, after which the reader ignores
//! its input. Nothing that lacks the finish, and nothing that carried an
//! error, can come out as [`Outcome::Finished`].

use std::fmt;

use super::{AgenticLoopChunk, Response, ResponseError};
use crate::codec::{Decode, Undecodable};
use crate::error_chain::Chain;
use crate::error_value::ErrorValue;

/// How a run-loop channel ended, as the caller must understand it.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Chunks, then the finish: the loop ran and finished. `fatal` when its
    /// last chunk was a fatal notification: it ended of its own accord, but
    /// it failed.
    Finished {
        /// Whether the last chunk was a fatal notification.
        fatal: bool,
    },
    /// Chunks, an error, the finish: the loop ended without finishing; what
    /// came is a partial result.
    Unfinished(ErrorValue),
    /// An error first, then the finish: no loop ran.
    NoLoop(ErrorValue),
    /// A finish alone: the proxy did not serve the loop.
    NotServed,
    /// The sequence broke the rules or never ended; nothing about the loop
    /// can be concluded.
    Broken(Broken),
}

/// Why a channel's sequence is broken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Broken {
    /// A response came after the error, which must be last.
    #[error("a response came after the error")]
    ResponseAfterError,
    /// A response payload did not decode; the error says how.
    #[error("a response did not decode")]
    Undecodable(#[source] Undecodable<ResponseError>),
    /// The connection ended before the channel's finish.
    #[error("the connection ended before the channel's finish")]
    ConnectionEnded,
    /// The run's scope ended before the channel's finish.
    #[error("the run ended before the channel's finish")]
    RunEnded,
    /// The recorded input (a capture) ended before the channel's finish.
    #[error("capture ended")]
    InputEnded,
}

impl Outcome {
    /// The outcome's name: `finished`, `unfinished`, `no_loop`,
    /// `not_served` or `broken`.
    pub fn name(&self) -> &'static str {
        match self {
            Outcome::Finished { .. } => "finished",
            Outcome::Unfinished(_) => "unfinished",
            Outcome::NoLoop(_) => "no_loop",
            Outcome::NotServed => "not_served",
            Outcome::Broken(_) => "broken",
        }
    }

    /// The error the channel carried, if it carried one.
    pub fn error(&self) -> Option<&ErrorValue> {
        match self {
            Outcome::Unfinished(error) | Outcome::NoLoop(error) => Some(error),
            _ => None,
        }
    }

    /// Whether the loop ran to its end without failing.
    pub fn is_success(&self) -> bool {
        matches!(self, Outcome::Finished { fatal: false })
    }
}

/// The outcome in words, for a person.
impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Finished { fatal: false } => f.write_str("the loop finished"),
            Outcome::Finished { fatal: true } => {
                f.write_str("the loop finished, but its last word was a fatal notification")
            }
            Outcome::Unfinished(error) => {
                write!(
                    f,
                    "the loop ended without finishing (partial result): {error}"
                )
            }
            Outcome::NoLoop(error) => write!(f, "no loop ran: {error}"),
            Outcome::NotServed => f.write_str("the proxy did not serve the loop"),
            Outcome::Broken(why) => write!(f, "broken: {}", Chain(why)),
        }
    }
}

/// What one channel response meant.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// A chunk of the loop.
    Chunk(AgenticLoopChunk),
    /// The channel's error; the outcome comes with the finish.
    Error(ErrorValue),
    /// The sequence broke: this is the channel's outcome.
    End(Outcome),
}

#[derive(Debug, Clone, PartialEq)]
enum State {
    Open { chunks: u64, last_fatal: bool },
    Erred { error: ErrorValue, chunks: u64 },
    Ended,
}

/// Reads one run-loop channel's responses, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Reader {
    state: State,
}

impl Default for Reader {
    fn default() -> Self {
        Reader::new()
    }
}

impl Reader {
    /// A reader for a channel whose request was just sent.
    pub fn new() -> Self {
        Reader {
            state: State::Open {
                chunks: 0,
                last_fatal: false,
            },
        }
    }

    /// Whether the reader has produced its outcome.
    pub fn is_ended(&self) -> bool {
        self.state == State::Ended
    }

    /// How many chunks have come so far.
    pub fn chunks(&self) -> u64 {
        match self.state {
            State::Open { chunks, .. } | State::Erred { chunks, .. } => chunks,
            State::Ended => 0,
        }
    }

    /// One channel response payload. `None` once the reader has ended.
    pub fn response(&mut self, payload: &[u8]) -> Option<Step> {
        match &mut self.state {
            State::Ended => None,
            State::Erred { .. } => Some(self.end(Outcome::Broken(Broken::ResponseAfterError))),
            State::Open { chunks, last_fatal } => match Response::decode(payload) {
                Ok(Response::Chunk(chunk)) => {
                    *chunks += 1;
                    *last_fatal = chunk.is_fatal();
                    Some(Step::Chunk(chunk))
                }
                Ok(Response::Error(error)) => {
                    self.state = State::Erred {
                        error: error.clone(),
                        chunks: *chunks,
                    };
                    Some(Step::Error(error))
                }
                Err(why) => {
                    let why = quoted(why, payload);
                    Some(self.end(Outcome::Broken(Broken::Undecodable(why))))
                }
            },
        }
    }

    /// The channel response finish. `None` once the reader has ended.
    pub fn finish(&mut self) -> Option<Outcome> {
        let outcome = match std::mem::replace(&mut self.state, State::Ended) {
            State::Ended => return None,
            State::Open { chunks: 0, .. } => Outcome::NotServed,
            State::Open { last_fatal, .. } => Outcome::Finished { fatal: last_fatal },
            State::Erred { error, chunks: 0 } => Outcome::NoLoop(error),
            State::Erred { error, .. } => Outcome::Unfinished(error),
        };
        Some(outcome)
    }

    /// The channel cannot end normally any more (the connection, the run or
    /// the input ended). `None` once the reader has ended.
    pub fn cut(&mut self, why: Broken) -> Option<Outcome> {
        if self.is_ended() {
            return None;
        }
        self.state = State::Ended;
        Some(Outcome::Broken(why))
    }

    fn end(&mut self, outcome: Outcome) -> Step {
        self.state = State::Ended;
        Step::End(outcome)
    }
}

/// A decode error with the payload that caused it: the JSON after the tag
/// for a chunk or an error that did not parse (what the agent wrote), the
/// whole payload for an unknown tag, nothing for an empty one.
fn quoted(why: ResponseError, payload: &[u8]) -> Undecodable<ResponseError> {
    match why {
        ResponseError::Empty => why.into(),
        ResponseError::UnknownTag(_) => Undecodable::with_payload(why, payload),
        ResponseError::Chunk(_) | ResponseError::Error(_) => {
            Undecodable::with_payload(why, payload.get(1..).unwrap_or_default())
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const TEXT: &[u8] = b"\x00{\"type\":\"assistant_text_content\",\"text\":\"hi\"}";
    const FATAL: &[u8] = b"\x00{\"type\":\"notification\",\"is_fatal\":true,\"message\":null}";
    const NOTE: &[u8] = b"\x00{\"type\":\"notification\",\"is_fatal\":false,\"message\":null}";
    const ERROR: &[u8] = b"\x01{\"kind\":\"agent\",\"error\":\"down\"}";

    fn run(responses: &[&[u8]]) -> (Vec<Step>, Option<Outcome>) {
        let mut reader = Reader::new();
        let mut steps = Vec::new();
        for payload in responses {
            if let Some(step) = reader.response(payload) {
                steps.push(step);
            }
        }
        let outcome = reader.finish();
        (steps, outcome)
    }

    fn down() -> ErrorValue {
        ErrorValue::new(json!({"kind": "agent", "error": "down"}))
    }

    #[test]
    fn chunks_then_finish_is_finished() {
        let (steps, outcome) = run(&[TEXT, TEXT]);
        assert_eq!(steps.len(), 2);
        assert_eq!(outcome, Some(Outcome::Finished { fatal: false }));
    }

    #[test]
    fn a_fatal_last_chunk_is_noted() {
        assert_eq!(
            run(&[TEXT, FATAL]).1,
            Some(Outcome::Finished { fatal: true })
        );
        assert_eq!(
            run(&[FATAL, TEXT]).1,
            Some(Outcome::Finished { fatal: false })
        );
        assert_eq!(
            run(&[TEXT, NOTE]).1,
            Some(Outcome::Finished { fatal: false })
        );
    }

    #[test]
    fn chunks_then_error_is_unfinished() {
        let (steps, outcome) = run(&[TEXT, ERROR]);
        assert_eq!(steps[1], Step::Error(down()));
        assert_eq!(outcome, Some(Outcome::Unfinished(down())));
    }

    #[test]
    fn error_first_is_no_loop() {
        assert_eq!(run(&[ERROR]).1, Some(Outcome::NoLoop(down())));
    }

    #[test]
    fn bare_finish_is_not_served() {
        assert_eq!(run(&[]).1, Some(Outcome::NotServed));
    }

    #[test]
    fn anything_after_the_error_is_broken() {
        let (steps, outcome) = run(&[TEXT, ERROR, TEXT]);
        assert_eq!(
            steps.last(),
            Some(&Step::End(Outcome::Broken(Broken::ResponseAfterError)))
        );
        assert_eq!(outcome, None, "the outcome was already given");
        let (steps, _) = run(&[ERROR, ERROR]);
        assert_eq!(
            steps.last(),
            Some(&Step::End(Outcome::Broken(Broken::ResponseAfterError)))
        );
    }

    #[test]
    fn an_undecodable_payload_is_broken() {
        for bad in [&b""[..], b"\x02", b"\x00{\"type\":\"x\"}", b"\x01"] {
            let (steps, outcome) = run(&[TEXT, bad, TEXT]);
            assert_eq!(steps.len(), 2, "the reader stops at the bad payload");
            assert!(matches!(
                steps[1],
                Step::End(Outcome::Broken(Broken::Undecodable(_)))
            ));
            assert_eq!(outcome, None);
        }
    }

    #[test]
    fn a_cut_is_broken_and_final() {
        let mut reader = Reader::new();
        reader.response(TEXT);
        assert_eq!(
            reader.cut(Broken::ConnectionEnded),
            Some(Outcome::Broken(Broken::ConnectionEnded))
        );
        assert!(reader.is_ended());
        assert_eq!(reader.finish(), None);
        assert_eq!(reader.response(TEXT), None);
        assert_eq!(reader.cut(Broken::RunEnded), None);
    }

    #[test]
    fn outcome_names_and_words() {
        assert_eq!(Outcome::Finished { fatal: false }.name(), "finished");
        assert_eq!(
            Outcome::Unfinished(ErrorValue::default()).name(),
            "unfinished"
        );
        assert_eq!(Outcome::NoLoop(ErrorValue::default()).name(), "no_loop");
        assert_eq!(Outcome::NotServed.name(), "not_served");
        assert_eq!(Outcome::Broken(Broken::RunEnded).name(), "broken");
        assert_eq!(
            Outcome::NoLoop(down()).to_string(),
            r#"no loop ran: {"kind":"agent","error":"down"}"#
        );
        assert_eq!(Broken::InputEnded.to_string(), "capture ended");
        assert!(Outcome::Finished { fatal: false }.is_success());
        assert!(!Outcome::Finished { fatal: true }.is_success());
    }

    #[test]
    fn an_undecodable_response_keeps_its_decode_error_as_the_source() {
        let mut reader = Reader::new();
        let Some(Step::End(Outcome::Broken(broken))) = reader.response(b"\x00{\"type\":7}") else {
            panic!("an undecodable chunk breaks the channel")
        };
        assert_eq!(broken.to_string(), "a response did not decode");
        let chain = Chain(&broken).to_string();
        assert!(
            chain.starts_with("a response did not decode: agentic loop chunk did not parse: "),
            "{chain}"
        );
        assert!(
            chain.ends_with(r#"; the payload was "{\"type\":7}" (10 bytes)"#),
            "the JSON after the tag is quoted: {chain}"
        );
        assert_eq!(
            Outcome::Broken(broken.clone()).to_string(),
            format!("broken: {chain}"),
            "the outcome in words says the whole chain"
        );
        let undecodable = std::error::Error::source(&broken).expect("the decode error");
        let undecodable = undecodable
            .downcast_ref::<Undecodable<ResponseError>>()
            .expect("the undecodable response");
        let json = undecodable.error().json_error();
        assert!(json.is_some(), "serde_json's error beneath it");
        runloop_testkit::errors::assert_cause_said_once(&broken);
    }
}
