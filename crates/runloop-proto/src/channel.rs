//! Client channel requests on a run scope (protocol §6).
//!
//! ```text
//! [channel tag: u8][request …]
//!   0 stop       [0x00], bytes after it ignored         served
//!   5 run-loop   [0x05]{"prompt": "…"}                  served
//!   1-4, 6-8     filetree, read, write, postgres,
//!                agent-schema, enqueue, dequeue         not served: bare channel finish
//! ```
//!
//! Unserved and unknown tags decode successfully as
//! [`ChannelRequest::Unserved`], keeping the byte: not serving a channel is
//! an answer (a bare channel finish), not a decode failure.

use crate::codec::{Decode, Encode, Writer};
use crate::run_loop::RunLoopRequest;

/// The nine channel tags a client may open on a run scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ChannelTag {
    /// `0`: ends the run.
    Stop = 0,
    /// `1`: the container's file tree.
    Filetree = 1,
    /// `2`: reads a file.
    Read = 2,
    /// `3`: writes a file.
    Write = 3,
    /// `4`: a Postgres connection.
    Postgres = 4,
    /// `5`: one agent loop.
    RunLoop = 5,
    /// `6`: the agent's schema.
    AgentSchema = 6,
    /// `7`: queues a message.
    Enqueue = 7,
    /// `8`: takes a queued message.
    Dequeue = 8,
}

impl ChannelTag {
    /// The tag for a byte, if the protocol defines it.
    pub fn from_byte(byte: u8) -> Option<ChannelTag> {
        Some(match byte {
            0 => ChannelTag::Stop,
            1 => ChannelTag::Filetree,
            2 => ChannelTag::Read,
            3 => ChannelTag::Write,
            4 => ChannelTag::Postgres,
            5 => ChannelTag::RunLoop,
            6 => ChannelTag::AgentSchema,
            7 => ChannelTag::Enqueue,
            8 => ChannelTag::Dequeue,
            _ => return None,
        })
    }

    /// The channel's name in the protocol.
    pub fn name(self) -> &'static str {
        match self {
            ChannelTag::Stop => "stop",
            ChannelTag::Filetree => "filetree",
            ChannelTag::Read => "read",
            ChannelTag::Write => "write",
            ChannelTag::Postgres => "postgres",
            ChannelTag::RunLoop => "run-loop",
            ChannelTag::AgentSchema => "agent-schema",
            ChannelTag::Enqueue => "enqueue",
            ChannelTag::Dequeue => "dequeue",
        }
    }
}

/// A client channel request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChannelRequest<'a> {
    /// Tag 0: end the run.
    Stop,
    /// Tag 5: run one loop.
    RunLoop(RunLoopRequest<'a>),
    /// Any other tag, kept: answered with a bare channel finish.
    Unserved(u8),
}

/// A channel request that does not decode.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChannelRequestError {
    /// No tag byte.
    #[error("channel request is empty")]
    Empty,
    /// A run-loop request whose JSON is not `{"prompt": "<string>"}`.
    #[error("run-loop request did not parse")]
    RunLoop(#[source] serde_json::Error),
}

impl<'a> Decode<'a> for ChannelRequest<'a> {
    type Error = ChannelRequestError;

    fn decode(payload: &'a [u8]) -> Result<Self, ChannelRequestError> {
        let (&tag, request) = payload.split_first().ok_or(ChannelRequestError::Empty)?;
        match ChannelTag::from_byte(tag) {
            Some(ChannelTag::Stop) => Ok(ChannelRequest::Stop),
            Some(ChannelTag::RunLoop) => RunLoopRequest::decode(request)
                .map(ChannelRequest::RunLoop)
                .map_err(ChannelRequestError::RunLoop),
            _ => Ok(ChannelRequest::Unserved(tag)),
        }
    }
}

impl Encode for ChannelRequest<'_> {
    type Error = std::convert::Infallible;

    fn encode(&self, out: &mut Writer<'_>) -> Result<(), Self::Error> {
        match self {
            ChannelRequest::Stop => out.push(ChannelTag::Stop as u8),
            ChannelRequest::RunLoop(request) => {
                out.push(ChannelTag::RunLoop as u8);
                request.encode(out)?;
            }
            ChannelRequest::Unserved(tag) => out.push(*tag),
        }
        Ok(())
    }

    fn size_hint(&self) -> usize {
        match self {
            ChannelRequest::RunLoop(request) => 1 + request.size_hint(),
            _ => 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn golden_stop() {
        assert_eq!(
            ChannelRequest::decode(&[0]).expect("decodes"),
            ChannelRequest::Stop
        );
        assert_eq!(
            ChannelRequest::decode(&[0, 9, 9]).expect("trailing ignored"),
            ChannelRequest::Stop
        );
        assert_eq!(ChannelRequest::Stop.to_vec().expect("infallible"), [0]);
    }

    #[test]
    fn golden_run_loop() {
        let payload = b"\x05{\"prompt\":\"hi\"}";
        let request = ChannelRequest::decode(payload).expect("decodes");
        let ChannelRequest::RunLoop(run_loop) = &request else {
            panic!("{request:?}")
        };
        assert_eq!(run_loop.prompt(), "hi");
        assert_eq!(run_loop.json(), b"{\"prompt\":\"hi\"}");
        assert_eq!(request.to_vec().expect("infallible"), payload);
    }

    #[test]
    fn every_other_tag_is_unserved() {
        for tag in (1..=4).chain(6..=255) {
            assert_eq!(
                ChannelRequest::decode(&[tag, b'{', b'}']).expect("decodes"),
                ChannelRequest::Unserved(tag)
            );
        }
        assert_eq!(
            ChannelTag::from_byte(6).map(ChannelTag::name),
            Some("agent-schema")
        );
        assert_eq!(ChannelTag::from_byte(9), None);
    }

    #[test]
    fn errors() {
        let empty = ChannelRequest::decode(&[]).expect_err("empty");
        assert_eq!(empty.to_string(), "channel request is empty");
        let bad = ChannelRequest::decode(b"\x05{\"prompt\":1}").expect_err("bad prompt");
        assert_eq!(bad.to_string(), "run-loop request did not parse");
        let why = bad.source().expect("the JSON error").to_string();
        assert!(why.starts_with("invalid type"), "{why}");
        assert!(ChannelRequest::decode(b"\x05").is_err());
    }
}
