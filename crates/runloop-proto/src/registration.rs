//! The registration: the exchange on a proxy's `/agent/register` path,
//! once per container (protocol §10).
//!
//! ```text
//! ask     {"agent": <any JSON>}      the run request's `agent`, verbatim
//! answer  [0x00]                     registered
//!         [0x01][error JSON]         not registered, and why
//! ```
//!
//! The ask's `agent` is never read: it goes from the caller's run request to
//! the agent program's `POST /register` as the caller's bytes. The answer's
//! error is the proxy's or the agent program's words, kept whole even when
//! they are not JSON ([`ErrorValue::decode_or_text`]), so a failed
//! registration always says why.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde_json::value::RawValue;

use crate::codec::{Decode, Encode, Writer};
use crate::error_value::{self, ErrorValue};

/// The answer's tag for a registration that succeeded.
pub const REGISTERED: u8 = 0;

/// The ask: `{"agent": …}`.
#[derive(Debug, Clone, Copy)]
pub struct RegistrationAsk<'a> {
    agent: &'a RawValue,
}

impl<'a> RegistrationAsk<'a> {
    /// An ask carrying `agent`, as it came.
    pub fn new(agent: &'a RawValue) -> Self {
        RegistrationAsk { agent }
    }

    /// The `agent` value, as it came.
    pub fn agent(&self) -> &'a RawValue {
        self.agent
    }
}

/// An ask that is not an object with an `agent` member.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegistrationAskError {
    /// Not a JSON object.
    #[error(transparent)]
    Json(serde_json::Error),
    /// An object without `agent`.
    #[error("it has no `agent` member")]
    NoAgent,
}

impl<'a> Decode<'a> for RegistrationAsk<'a> {
    type Error = RegistrationAskError;

    /// A JSON object with an `agent` member of any value; other members are
    /// tolerated.
    fn decode(ask: &'a [u8]) -> Result<Self, RegistrationAskError> {
        let mut members: BTreeMap<Cow<'a, str>, &'a RawValue> =
            serde_json::from_slice(ask).map_err(RegistrationAskError::Json)?;
        let agent = members
            .remove("agent")
            .ok_or(RegistrationAskError::NoAgent)?;
        Ok(RegistrationAsk { agent })
    }
}

impl Encode for RegistrationAsk<'_> {
    type Error = std::convert::Infallible;

    fn encode(&self, out: &mut Writer<'_>) -> Result<(), Self::Error> {
        out.extend_from_slice(b"{\"agent\":");
        out.extend_from_slice(self.agent.get().as_bytes());
        out.push(b'}');
        Ok(())
    }

    fn size_hint(&self) -> usize {
        self.agent.get().len() + 10
    }
}

/// The proxy's one answer to a registration.
#[derive(Debug, Clone, PartialEq)]
pub enum RegistrationAnswer {
    /// `[0]`: registered.
    Registered,
    /// `[1][error]`: not registered.
    Refused(ErrorValue),
}

/// An answer that is neither `[0]` nor `[1][error]`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RegistrationAnswerError {
    /// No bytes at all.
    #[error("the registration answer is empty")]
    Empty,
    /// A first byte that is neither `0` nor `1`.
    #[error("unknown registration answer tag {0}")]
    UnknownTag(u8),
}

impl Decode<'_> for RegistrationAnswer {
    type Error = RegistrationAnswerError;

    fn decode(answer: &[u8]) -> Result<Self, RegistrationAnswerError> {
        match answer.split_first() {
            None => Err(RegistrationAnswerError::Empty),
            Some((&REGISTERED, _)) => Ok(RegistrationAnswer::Registered),
            Some((&error_value::TAG, error)) => Ok(RegistrationAnswer::Refused(
                ErrorValue::decode_or_text(error),
            )),
            Some((&tag, _)) => Err(RegistrationAnswerError::UnknownTag(tag)),
        }
    }
}

impl Encode for RegistrationAnswer {
    type Error = std::convert::Infallible;

    fn encode(&self, out: &mut Writer<'_>) -> Result<(), Self::Error> {
        match self {
            RegistrationAnswer::Registered => out.push(REGISTERED),
            RegistrationAnswer::Refused(error) => error.write_tagged(out),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn golden_ask() {
        let agent = RawValue::from_string(r#"{"model": "x"}"#.to_owned()).expect("JSON");
        let ask = RegistrationAsk::new(&agent);
        let bytes = ask.to_vec().expect("infallible");
        assert_eq!(
            bytes, br#"{"agent":{"model": "x"}}"#,
            "the agent as it came"
        );
        let read = RegistrationAsk::decode(&bytes).expect("decodes");
        assert_eq!(read.agent().get(), r#"{"model": "x"}"#);
    }

    #[test]
    fn the_ask_is_an_object_with_an_agent() {
        assert!(RegistrationAsk::decode(br#"{"agent":null}"#).is_ok());
        assert!(RegistrationAsk::decode(br#" {"x":1, "agent": {"a": [1]}} "#).is_ok());
        assert_eq!(
            RegistrationAsk::decode(br#"{"x":1}"#)
                .expect_err("no agent")
                .to_string(),
            "it has no `agent` member"
        );
        for bad in [&br#"["agent"]"#[..], br#"{"agent":1} x"#, b""] {
            assert!(matches!(
                RegistrationAsk::decode(bad),
                Err(RegistrationAskError::Json(_))
            ));
        }
    }

    #[test]
    fn golden_answers() {
        assert_eq!(
            RegistrationAnswer::Registered.to_vec().expect("infallible"),
            [0]
        );
        let refused = RegistrationAnswer::Refused(ErrorValue::new(json!({"kind": "proxy"})));
        let bytes = refused.to_vec().expect("infallible");
        assert_eq!(bytes, b"\x01{\"kind\":\"proxy\"}");
        assert_eq!(RegistrationAnswer::decode(&bytes), Ok(refused));
        assert_eq!(
            RegistrationAnswer::decode(b"\x00"),
            Ok(RegistrationAnswer::Registered)
        );
    }

    #[test]
    fn an_error_that_is_not_json_is_kept_as_text() {
        assert_eq!(
            RegistrationAnswer::decode(b"\x01no"),
            Ok(RegistrationAnswer::Refused(ErrorValue::new("no")))
        );
    }

    #[test]
    fn other_answers_are_errors() {
        assert_eq!(
            RegistrationAnswer::decode(b""),
            Err(RegistrationAnswerError::Empty)
        );
        assert_eq!(
            RegistrationAnswer::decode(b"\x07"),
            Err(RegistrationAnswerError::UnknownTag(7))
        );
        assert_eq!(
            RegistrationAnswerError::UnknownTag(7).to_string(),
            "unknown registration answer tag 7"
        );
    }
}
