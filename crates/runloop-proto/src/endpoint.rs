//! Endpoint requests: the type-1 payload that opens a scope (protocol §4).
//!
//! ```text
//! [endpoint tag: u8][request …]
//!   0  containers::agents::run     served
//!   *  anything else               not served: bare finish
//! ```
//!
//! An unserved tag is a successful decode that keeps the byte, so the server
//! can log which endpoint was asked for before answering with a bare finish.

use crate::agents_run::{RunRequest, RunRequestError};
use crate::codec::{Decode, Encode, Writer};

/// Endpoint tag of `containers::agents::run`.
pub const AGENTS_RUN: u8 = 0;

/// A request that opens a scope.
#[derive(Debug, Clone, PartialEq)]
pub enum EndpointRequest {
    /// Tag 0: `containers::agents::run`.
    AgentsRun(Box<RunRequest>),
    /// Any other tag, kept.
    Unserved(u8),
}

/// A scope request that does not decode.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EndpointRequestError {
    /// No tag byte.
    #[error("scope request is empty")]
    Empty,
    /// Tag 0 with a request that does not parse.
    #[error(transparent)]
    AgentsRun(#[from] RunRequestError),
}

impl Decode<'_> for EndpointRequest {
    type Error = EndpointRequestError;

    fn decode(payload: &[u8]) -> Result<Self, EndpointRequestError> {
        let (&tag, request) = payload.split_first().ok_or(EndpointRequestError::Empty)?;
        match tag {
            AGENTS_RUN => Ok(EndpointRequest::AgentsRun(Box::new(RunRequest::decode(
                request,
            )?))),
            other => Ok(EndpointRequest::Unserved(other)),
        }
    }
}

impl Encode for EndpointRequest {
    type Error = serde_json::Error;

    fn encode(&self, out: &mut Writer<'_>) -> Result<(), serde_json::Error> {
        match self {
            EndpointRequest::AgentsRun(request) => {
                out.push(AGENTS_RUN);
                request.encode(out)
            }
            EndpointRequest::Unserved(tag) => {
                out.push(*tag);
                Ok(())
            }
        }
    }

    fn size_hint(&self) -> usize {
        256
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RUN: &[u8] = b"\x00{\"image\":{\"server\":{\"name\":\"demo\",\"digest\":\"sha256:0000000000000000000000000000000000000000000000000000000000000000\"}},\"memory\":1,\"disk\":2,\"agent\":{}}";

    #[test]
    fn golden_agents_run() {
        let request = EndpointRequest::decode(RUN).expect("decodes");
        assert!(matches!(request, EndpointRequest::AgentsRun(_)));
        assert_eq!(request.to_vec().expect("encodes"), RUN);
    }

    #[test]
    fn other_tags_are_unserved_with_their_byte() {
        for tag in 1..=255u8 {
            assert_eq!(
                EndpointRequest::decode(&[tag, 1, 2]).expect("decodes"),
                EndpointRequest::Unserved(tag)
            );
        }
    }

    #[test]
    fn errors() {
        assert_eq!(
            EndpointRequest::decode(b"").expect_err("empty").to_string(),
            "scope request is empty"
        );
        let bad = EndpointRequest::decode(b"\x00{}").expect_err("no members");
        assert!(
            bad.to_string()
                .starts_with("containers::agents::run request did not parse"),
            "{bad}"
        );
    }
}
