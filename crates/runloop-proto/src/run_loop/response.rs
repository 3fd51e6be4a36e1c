//! The run-loop response frame: one channel response payload (protocol §7).
//!
//! ```text
//! [0x00][chunk JSON …]     Response::Chunk — one piece of the loop (tag CHUNK)
//! [0x01][error JSON …]     Response::Error — there was no loop, or it did not finish (tag ERROR)
//! ```
//!
//! The tag byte, and nothing in the JSON, tells a chunk from an error. An
//! error may be any JSON value, including an object with a `type` member
//! shaped exactly like a chunk; reading the JSON to decide would let a
//! provider's failure pass for output.
//!
//! A relay must not read chunks at all. [`tag`] reads a payload's first byte
//! and nothing else, and [`encode_raw_chunk`] frames chunk JSON that was
//! never parsed, so a server can pass a loop on at the cost of a copy.

use std::error::Error as StdError;
use std::fmt;

use super::{AgenticLoopChunk, scan};
use crate::codec::{Decode, Encode, Writer};
use crate::error_value::{self, ErrorValue};

/// Tag of [`Response::Chunk`]; public so a relay can frame JSON it never parsed.
pub const CHUNK: u8 = 0;
/// Tag of [`Response::Error`], the same as every error answer's
/// ([`error_value::TAG`]).
pub const ERROR: u8 = error_value::TAG;

/// One run-loop channel response.
#[derive(Debug, Clone, PartialEq)]
pub enum Response {
    /// A piece of the loop. Tag `0`.
    Chunk(AgenticLoopChunk),
    /// No loop ran, or it ended without finishing. Tag `1`; always last.
    Error(ErrorValue),
}

/// Which of the two a payload is, read from its first byte alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tag {
    /// Tag `0`.
    Chunk,
    /// Tag `1`.
    Error,
}

/// A run-loop response payload that could not be read. The four cases and
/// their messages are fixed by the protocol (§7).
///
/// Two of those messages end with the JSON error's own words, so this type
/// is the one exception to the rule that an error leaves its cause to
/// `source()`: its `source()` is `None`, so that a chain printer says the
/// JSON error once, and the JSON error itself stays reachable through
/// [`ResponseError::json_error`].
#[derive(Debug)]
pub enum ResponseError {
    /// No bytes at all.
    Empty,
    /// A first byte that is neither `0` nor `1`.
    UnknownTag(u8),
    /// The chunk JSON did not parse.
    Chunk(serde_json::Error),
    /// The bytes after tag `1` are not exactly one JSON value.
    Error(serde_json::Error),
}

impl fmt::Display for ResponseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ResponseError::Empty => f.write_str("agentic loop frame is empty"),
            ResponseError::UnknownTag(tag) => write!(f, "unknown agentic loop frame tag {tag}"),
            ResponseError::Chunk(inner) => write!(f, "agentic loop chunk did not parse: {inner}"),
            ResponseError::Error(inner) => write!(f, "agentic loop error did not parse: {inner}"),
        }
    }
}

/// No `source()`: the JSON error is already in the words the protocol
/// fixes (see the type's docs).
impl StdError for ResponseError {}

impl ResponseError {
    /// The JSON error beneath a chunk or an error that did not parse, whose
    /// words end this error's message.
    pub fn json_error(&self) -> Option<&serde_json::Error> {
        match self {
            ResponseError::Chunk(inner) | ResponseError::Error(inner) => Some(inner),
            ResponseError::Empty | ResponseError::UnknownTag(_) => None,
        }
    }
}

/// The tag of a payload, from its first byte; the rest is not looked at.
pub fn tag(payload: &[u8]) -> Result<Tag, ResponseError> {
    match payload.first() {
        None => Err(ResponseError::Empty),
        Some(&CHUNK) => Ok(Tag::Chunk),
        Some(&ERROR) => Ok(Tag::Error),
        Some(&other) => Err(ResponseError::UnknownTag(other)),
    }
}

/// Appends a chunk payload around chunk JSON that is not parsed or checked.
pub fn encode_raw_chunk(json: &[u8], out: &mut Writer<'_>) {
    out.reserve(1 + json.len());
    out.push(CHUNK);
    out.extend_from_slice(json);
}

impl Encode for Response {
    type Error = serde_json::Error;

    fn encode(&self, out: &mut Writer<'_>) -> Result<(), serde_json::Error> {
        match self {
            Response::Chunk(chunk) => {
                out.push(CHUNK);
                serde_json::to_writer(out, chunk)
            }
            Response::Error(error) => {
                error.write_tagged(out);
                Ok(())
            }
        }
    }

    fn size_hint(&self) -> usize {
        // Most chunks are short text deltas.
        128
    }
}

impl Decode<'_> for Response {
    type Error = ResponseError;

    fn decode(payload: &[u8]) -> Result<Self, ResponseError> {
        let (&first, rest) = payload.split_first().ok_or(ResponseError::Empty)?;
        match first {
            CHUNK => parse_chunk(rest)
                .map(Response::Chunk)
                .map_err(ResponseError::Chunk),
            ERROR => ErrorValue::decode(rest)
                .map(Response::Error)
                .map_err(ResponseError::Error),
            other => Err(ResponseError::UnknownTag(other)),
        }
    }
}

/// Parses chunk JSON.
///
/// JSON text is UTF-8, so the payload is checked once, up front, by a SIMD
/// validator. Text then goes to the fast path ([`scan`]), which reads the
/// shapes encoders write and gives up on anything else; what it gives up
/// on is parsed by serde_json as a `str` (so strings are not validated
/// again). Bytes that are not UTF-8 are parsed by serde_json as bytes. What
/// is accepted and every error message stay serde_json's own.
fn parse_chunk(json: &[u8]) -> Result<AgenticLoopChunk, serde_json::Error> {
    match simdutf8::basic::from_utf8(json) {
        Ok(text) => match scan::chunk(text) {
            Some(chunk) => Ok(chunk),
            None => serde_json::from_str(text),
        },
        Err(_) => serde_json::from_slice(json),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::run_loop::chunk::tests::{every_kind_full, every_kind_minimal};
    use crate::run_loop::{TextChunk, UsageChunk};

    #[test]
    fn golden_chunk() {
        #[rustfmt::skip]
        let payload = b"\x00\
            {\"type\":\"assistant_text_content\",\"text\":\"Hel\"}";
        let frame = Response::decode(payload).expect("decodes");
        assert_eq!(
            frame,
            Response::Chunk(AgenticLoopChunk::AssistantTextContent(TextChunk {
                text: "Hel".into(),
                ..TextChunk::default()
            }))
        );
        assert_eq!(frame.to_vec().expect("encodes"), payload);
    }

    #[test]
    fn golden_error() {
        #[rustfmt::skip]
        let payload = b"\x01\
            {\"kind\":\"agent\",\"status\":503,\"error\":\"busy\"}";
        let frame = Response::decode(payload).expect("decodes");
        assert_eq!(
            frame,
            Response::Error(ErrorValue::new(
                json!({"kind": "agent", "status": 503, "error": "busy"})
            ))
        );
        assert_eq!(frame.to_vec().expect("encodes"), payload);
    }

    #[test]
    fn every_kind_round_trips_as_a_frame() {
        for chunk in every_kind_full().into_iter().chain(every_kind_minimal()) {
            let frame = Response::Chunk(chunk);
            let bytes = frame.to_vec().expect("encodes");
            assert_eq!(bytes[0], CHUNK);
            assert_eq!(Response::decode(&bytes).expect("decodes"), frame);
        }
    }

    #[test]
    fn the_tag_decides_not_the_json() {
        let chunk_shaped = json!({"type": "usage", "completion_tokens": 1,
            "prompt_tokens": 2, "total_tokens": 3});
        let mut payload = vec![ERROR];
        payload.extend_from_slice(chunk_shaped.to_string().as_bytes());
        assert_eq!(
            Response::decode(&payload).expect("decodes"),
            Response::Error(ErrorValue::new(chunk_shaped))
        );
        payload[0] = CHUNK;
        assert_eq!(
            Response::decode(&payload).expect("decodes"),
            Response::Chunk(AgenticLoopChunk::Usage(UsageChunk {
                completion_tokens: 1,
                prompt_tokens: 2,
                total_tokens: 3,
                meta: None
            }))
        );
    }

    #[test]
    fn an_error_of_every_json_type() {
        for value in [
            json!(null),
            json!(false),
            json!(0),
            json!(-1.5),
            json!("x"),
            json!([]),
            json!({}),
        ] {
            let frame = Response::Error(ErrorValue::new(value));
            let bytes = frame.to_vec().expect("encodes");
            assert_eq!(Response::decode(&bytes).expect("decodes"), frame);
        }
    }

    #[test]
    fn the_four_errors_and_their_messages() {
        let empty = Response::decode(b"").expect_err("empty");
        assert!(matches!(empty, ResponseError::Empty));
        assert_eq!(empty.to_string(), "agentic loop frame is empty");
        assert!(empty.source().is_none());

        let unknown = Response::decode(b"\x02{}").expect_err("unknown tag");
        assert!(matches!(unknown, ResponseError::UnknownTag(2)));
        assert_eq!(unknown.to_string(), "unknown agentic loop frame tag 2");
        assert!(unknown.source().is_none());

        let chunk = Response::decode(b"\x00{\"type\":\"nope\"}").expect_err("bad chunk");
        assert!(matches!(chunk, ResponseError::Chunk(_)));
        let inner = chunk
            .json_error()
            .expect("inner error reachable")
            .to_string();
        assert_eq!(
            chunk.to_string(),
            format!("agentic loop chunk did not parse: {inner}")
        );
        assert!(inner.starts_with("unknown variant `nope`"), "{inner}");
        // The protocol's words hold the JSON error: it is not said again.
        assert!(chunk.source().is_none());

        let error = Response::decode(b"\x01{} {}").expect_err("two values");
        assert!(matches!(error, ResponseError::Error(_)));
        let inner = error
            .json_error()
            .expect("inner error reachable")
            .to_string();
        assert_eq!(
            error.to_string(),
            format!("agentic loop error did not parse: {inner}")
        );
        assert!(inner.starts_with("trailing characters"), "{inner}");
        assert!(error.source().is_none());
        assert!(empty.json_error().is_none() && unknown.json_error().is_none());

        let nothing = Response::decode(b"\x01").expect_err("no value");
        assert!(matches!(nothing, ResponseError::Error(_)));
        let chunk_nothing = Response::decode(b"\x00").expect_err("no chunk");
        assert!(matches!(chunk_nothing, ResponseError::Chunk(_)));
    }

    #[test]
    fn utf8_is_checked_as_serde_json_checks_it() {
        // A member the chunk does not read may hold bytes that are not UTF-8:
        // serde_json skips it unread, on the byte path as before.
        let ignored = b"\x00{\"type\":\"user\",\"prompt\":\"p\",\"x\":\"\xff\"}";
        assert!(matches!(
            Response::decode(ignored),
            Ok(Response::Chunk(AgenticLoopChunk::User(_)))
        ));
        // A member it reads may not, and the error is serde_json's own.
        let read = b"\x00{\"type\":\"user\",\"prompt\":\"\xff\"}";
        let error = Response::decode(read).expect_err("not UTF-8");
        let expected = serde_json::from_slice::<AgenticLoopChunk>(&read[1..])
            .expect_err("not UTF-8")
            .to_string();
        assert_eq!(
            error.to_string(),
            format!("agentic loop chunk did not parse: {expected}")
        );
    }

    #[test]
    fn tag_reads_only_the_first_byte() {
        assert_eq!(tag(b"\x00 not json at all").expect("tag"), Tag::Chunk);
        assert_eq!(tag(b"\x01\xff\xfe").expect("tag"), Tag::Error);
        assert!(matches!(tag(b""), Err(ResponseError::Empty)));
        assert!(matches!(tag(b"\x07"), Err(ResponseError::UnknownTag(7))));
    }

    #[test]
    fn raw_chunks_are_framed_unread() {
        let mut buf = b"header".to_vec();
        encode_raw_chunk(b"{\"type\":\"not even a kind\"", &mut Writer::new(&mut buf));
        assert_eq!(buf, b"header\x00{\"type\":\"not even a kind\"");
    }
}
