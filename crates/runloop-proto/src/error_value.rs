//! The error value: exactly one JSON value, any JSON value (protocol §9).
//!
//! An error on the wire is news for the caller, not a Rust failure, so it is
//! a plain value type: it has no `std::error::Error` impl and it is never
//! confused with the decode errors of this crate. The protocol prescribes
//! nothing about its content; the JSON is kept whole.
//!
//! Errors this project writes itself (the server's faults, the proxy's
//! failures) use one shape, `{"kind": "<who>", "error": "<what happened>"}`,
//! built with [`ErrorValue::kind`], so a reader can tell at a glance which
//! party gave up. The kinds are one closed list, [`ErrorKind`], the table of
//! docs/protocol.md §12.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::codec::{Decode, Encode, Writer};

/// The tag byte before an error's JSON wherever one is answered: a run's
/// main stream, a run-loop channel, a registration (protocol §5, §7, §10).
pub const TAG: u8 = 1;

/// An error value: one JSON value, `null` by default.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(transparent)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
// Its schema is `#/$defs/Error`, the name `runloop schema` has always used.
#[cfg_attr(feature = "schema", schemars(rename = "Error"))]
pub struct ErrorValue(pub Value);

/// Who gave up, in the error values this project writes: the `kind` member
/// of `{"kind": …, "error": …}` (protocol §12).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// `request`: a run request that decodes but is not valid.
    Request,
    /// `policy`: an image or mount this server will not run.
    Policy,
    /// `registry`: a registry image that could not be pulled or checked.
    Registry,
    /// `runtime`: the container did not start.
    Runtime,
    /// `run`: the run was stopped.
    Run,
    /// `container`: the container ended by itself.
    Container,
    /// `server`: the server is shutting down, or the caller's connection ended.
    Server,
    /// `proxy`: a proxy path failed or broke the sequence, or the proxy
    /// refused a request.
    Proxy,
    /// `agent`: the agent program could not be reached, refused, or broke
    /// its event stream.
    Agent,
}

impl ErrorKind {
    /// Every kind, in the order of the protocol's table.
    pub const ALL: [ErrorKind; 9] = [
        ErrorKind::Request,
        ErrorKind::Policy,
        ErrorKind::Registry,
        ErrorKind::Runtime,
        ErrorKind::Run,
        ErrorKind::Container,
        ErrorKind::Server,
        ErrorKind::Proxy,
        ErrorKind::Agent,
    ];

    /// The `kind` string.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Request => "request",
            ErrorKind::Policy => "policy",
            ErrorKind::Registry => "registry",
            ErrorKind::Runtime => "runtime",
            ErrorKind::Run => "run",
            ErrorKind::Container => "container",
            ErrorKind::Server => "server",
            ErrorKind::Proxy => "proxy",
            ErrorKind::Agent => "agent",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl ErrorValue {
    /// An error holding `value`.
    pub fn new(value: impl Into<Value>) -> Self {
        ErrorValue(value.into())
    }

    /// This project's own error shape: `{"kind": kind, "error": message}`.
    pub fn kind(kind: ErrorKind, message: impl fmt::Display) -> Self {
        let mut object = serde_json::Map::with_capacity(2);
        object.insert("kind".to_owned(), Value::String(kind.as_str().to_owned()));
        object.insert("error".to_owned(), Value::String(message.to_string()));
        ErrorValue(Value::Object(object))
    }

    /// The JSON value in `bytes` when they hold exactly one; otherwise the
    /// bytes as a string (invalid UTF-8 replaced), so nothing a peer said is
    /// lost when it says it badly.
    pub fn decode_or_text(bytes: &[u8]) -> Self {
        ErrorValue::decode(bytes).unwrap_or_else(|_| {
            ErrorValue(Value::String(String::from_utf8_lossy(bytes).into_owned()))
        })
    }

    /// The JSON value.
    pub fn value(&self) -> &Value {
        &self.0
    }

    /// Appends the JSON text. A [`Value`] always serializes (its map keys are
    /// strings and its numbers finite), so this cannot fail.
    pub fn write_json(&self, out: &mut Writer<'_>) {
        if serde_json::to_writer(&mut *out, &self.0).is_err() {
            // Unreachable for a `Value`, which has nothing that can fail.
            debug_assert!(false, "a JSON value failed to serialize");
        }
    }
}

impl ErrorValue {
    /// Appends [`TAG`] and the JSON: an error answer's payload.
    pub fn write_tagged(&self, out: &mut Writer<'_>) {
        out.push(TAG);
        self.write_json(out);
    }

    /// Appends [`TAG`] and error JSON that is passed on unread (an agent
    /// program's error body, verbatim).
    pub fn write_tagged_json(json: &[u8], out: &mut Writer<'_>) {
        out.reserve(1 + json.len());
        out.push(TAG);
        out.extend_from_slice(json);
    }
}

impl From<Value> for ErrorValue {
    fn from(value: Value) -> Self {
        ErrorValue(value)
    }
}

/// The JSON text, compact.
impl fmt::Display for ErrorValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl Encode for ErrorValue {
    type Error = serde_json::Error;

    fn encode(&self, out: &mut Writer<'_>) -> Result<(), serde_json::Error> {
        serde_json::to_writer(out, &self.0)
    }
}

impl Decode<'_> for ErrorValue {
    type Error = serde_json::Error;

    /// Exactly one JSON value: nothing, two values, or trailing garbage fail.
    fn decode(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(bytes).map(ErrorValue)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn every_json_type_round_trips() {
        for value in [
            json!(null),
            json!(true),
            json!(-12.5),
            json!(18446744073709551615u64),
            json!("gone"),
            json!([1, "two", null]),
            json!({"kind": "proxy", "error": "closed"}),
        ] {
            let error = ErrorValue::new(value.clone());
            let bytes = error.to_vec().expect("serializes");
            assert_eq!(
                ErrorValue::decode(&bytes).expect("decodes"),
                error,
                "{value}"
            );
        }
    }

    #[test]
    fn exactly_one_value() {
        for bad in [&b""[..], b" ", b"1 2", b"{} x", b"{", b"nul", b"\"a\"\"b\""] {
            assert!(
                ErrorValue::decode(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        assert_eq!(
            ErrorValue::decode(b" 7 ").expect("whitespace is fine"),
            ErrorValue::new(7)
        );
    }

    #[test]
    fn decode_or_text_keeps_everything() {
        assert_eq!(
            ErrorValue::decode_or_text(b"{\"a\":1}"),
            ErrorValue::new(json!({"a": 1}))
        );
        assert_eq!(
            ErrorValue::decode_or_text(b"oops \xff"),
            ErrorValue::new("oops \u{fffd}")
        );
        assert_eq!(ErrorValue::decode_or_text(b""), ErrorValue::new(""));
    }

    #[test]
    fn default_is_null() {
        assert_eq!(ErrorValue::default().to_vec().expect("serializes"), b"null");
    }

    #[test]
    fn kind_shape() {
        let error = ErrorValue::kind(ErrorKind::Proxy, "the path ended abruptly");
        assert_eq!(
            error.to_string(),
            r#"{"kind":"proxy","error":"the path ended abruptly"}"#
        );
    }

    #[test]
    fn every_kind_has_its_word() {
        let words: Vec<&str> = ErrorKind::ALL.iter().map(|kind| kind.as_str()).collect();
        assert_eq!(
            words,
            [
                "request",
                "policy",
                "registry",
                "runtime",
                "run",
                "container",
                "server",
                "proxy",
                "agent"
            ]
        );
    }

    #[test]
    fn write_json_matches_encode() {
        let error = ErrorValue::new(json!({"a": [1, 2.5, "x"]}));
        let mut buf = Vec::new();
        error.write_json(&mut Writer::new(&mut buf));
        assert_eq!(buf, error.to_vec().expect("serializes"));
    }
}
