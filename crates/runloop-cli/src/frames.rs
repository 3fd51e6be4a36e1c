//! Frames in words: what one message of a connection is, for `run -v`
//! (live, on stderr) and `decode` (after the fact, as JSON lines).
//!
//! Both show the same thing, a frame's kind and what it carries, so that
//! what a person watched scroll by under `-v` is what `decode` prints from
//! the `--capture` of the same run. A description is made from one message
//! alone: the client only opens `agents::run` scopes and run-loop and stop
//! channels, so a main-stream response is read as a run's answer and a
//! channel response from the server as a run-loop response. Whether a frame
//! breaks the rules of the connection (a scope that is not open, a second
//! authorization) is not decided here; `decode` asks the observer for that.
//!
//! ```text
//! > authorization: unbrokered (the credential is not shown)
//! > scope 1: agents::run {"image":{"server":{"name":"demo",…}},…}
//! < scope 1: id "r-7f3a"
//! > scope 1 channel 1: run-loop {"prompt":"hi"}
//! < scope 1 channel 1: chunk {"type":"assistant_text_content","text":"Hel"}
//! < scope 1 channel 1: finish
//! > scope 1 channel 2: stop
//! < scope 1: finish
//! ```
//!
//! The credential never appears: not in a description, and not in a
//! capture, which records an authorization as its header and mode byte.
//! Bytes from the wire are shown as text with their control characters
//! escaped, so a description is always one line and cannot drive a
//! terminal.

use std::fmt;

use runloop_proto::Decode;
use runloop_proto::agents_run::RunResponse;
use runloop_proto::capture::Direction;
use runloop_proto::channel::ChannelRequest;
use runloop_proto::endpoint::EndpointRequest;
use runloop_proto::frame::{ClientFrame, Role, ServerFrame};
use runloop_proto::run_loop::{Tag, response::tag};

/// What one message is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame<'m> {
    /// Type 0, with its mode byte (`0`: unbrokered), if it has one.
    Authorization {
        /// The mode.
        mode: Option<u8>,
    },
    /// Type 1 for `containers::agents::run`: its JSON.
    Run {
        /// The scope it opens.
        scope: u32,
        /// The request JSON, as it went.
        json: &'m [u8],
    },
    /// Type 1 for another endpoint, or one that does not decode.
    Request {
        /// The scope it opens.
        scope: u32,
        /// The payload.
        payload: &'m [u8],
    },
    /// Type 2: the run's id.
    Id {
        /// The run's scope.
        scope: u32,
        /// The id.
        id: String,
    },
    /// Type 2: the run was refused with this error.
    Refused {
        /// The run's scope.
        scope: u32,
        /// The error JSON, as it came.
        json: &'m [u8],
    },
    /// Type 2 that is neither.
    Response {
        /// The scope.
        scope: u32,
        /// The payload.
        payload: &'m [u8],
    },
    /// Type 3: the scope's finish (for a run: the run has ended).
    Finish {
        /// The scope.
        scope: u32,
    },
    /// Type 4 from the client, tag 0: stop the run.
    Stop {
        /// The run's scope.
        scope: u32,
        /// The stop channel.
        channel: u32,
    },
    /// Type 4 from the client, tag 5: a loop, and its request JSON.
    RunLoop {
        /// The run's scope.
        scope: u32,
        /// The run-loop channel.
        channel: u32,
        /// The request JSON (`{"prompt":…}`), as it went.
        json: &'m [u8],
    },
    /// Any other type 4.
    ChannelRequest {
        /// Who opened it.
        opener: Role,
        /// The scope.
        scope: u32,
        /// The channel, in its opener's numbering.
        channel: u32,
        /// The payload.
        payload: &'m [u8],
    },
    /// Type 5 from the server, tag 0: a chunk.
    Chunk {
        /// The scope.
        scope: u32,
        /// The channel.
        channel: u32,
        /// The chunk JSON, as it came.
        json: &'m [u8],
    },
    /// Type 5 from the server, tag 1: the loop's error.
    Error {
        /// The scope.
        scope: u32,
        /// The channel.
        channel: u32,
        /// The error JSON, as it came.
        json: &'m [u8],
    },
    /// Any other type 5.
    ChannelResponse {
        /// Who opened the channel.
        opener: Role,
        /// The scope.
        scope: u32,
        /// The channel, in its opener's numbering.
        channel: u32,
        /// The payload.
        payload: &'m [u8],
    },
    /// Type 6: a channel's finish.
    ChannelFinish {
        /// Who opened the channel.
        opener: Role,
        /// The scope.
        scope: u32,
        /// The channel, in its opener's numbering.
        channel: u32,
    },
    /// Not a frame of its direction: why.
    Malformed(String),
}

/// What `message`, going `direction`, is.
pub fn describe(direction: Direction, message: &[u8]) -> Frame<'_> {
    match direction {
        Direction::ClientToServer => match ClientFrame::decode(message) {
            Ok(frame) => client(frame),
            Err(error) => Frame::Malformed(error.to_string()),
        },
        Direction::ServerToClient => match ServerFrame::decode(message) {
            Ok(frame) => server(frame),
            Err(error) => Frame::Malformed(error.to_string()),
        },
    }
}

fn client(frame: ClientFrame<'_>) -> Frame<'_> {
    match frame {
        ClientFrame::Authorization { payload } => Frame::Authorization {
            mode: payload.first().copied(),
        },
        ClientFrame::Request { scope, payload } => match EndpointRequest::decode(payload) {
            Ok(EndpointRequest::AgentsRun(_)) => Frame::Run {
                scope,
                json: payload.get(1..).unwrap_or_default(),
            },
            _ => Frame::Request { scope, payload },
        },
        ClientFrame::ChannelRequest {
            scope,
            channel,
            payload,
        } => match ChannelRequest::decode(payload) {
            Ok(ChannelRequest::Stop) => Frame::Stop { scope, channel },
            Ok(ChannelRequest::RunLoop(_)) => Frame::RunLoop {
                scope,
                channel,
                json: payload.get(1..).unwrap_or_default(),
            },
            _ => Frame::ChannelRequest {
                opener: Role::Client,
                scope,
                channel,
                payload,
            },
        },
        ClientFrame::ChannelResponse {
            scope,
            channel,
            payload,
        } => Frame::ChannelResponse {
            opener: Role::Server,
            scope,
            channel,
            payload,
        },
        ClientFrame::ChannelResponseFinish { scope, channel } => Frame::ChannelFinish {
            opener: Role::Server,
            scope,
            channel,
        },
    }
}

fn server(frame: ServerFrame<'_>) -> Frame<'_> {
    match frame {
        ServerFrame::Authorization { payload } => Frame::Authorization {
            mode: payload.first().copied(),
        },
        ServerFrame::Response { scope, payload } => match RunResponse::decode(payload) {
            Ok(RunResponse::Id(id)) => Frame::Id { scope, id },
            Ok(RunResponse::Error(_)) => Frame::Refused {
                scope,
                json: payload.get(1..).unwrap_or_default(),
            },
            Err(_) => Frame::Response { scope, payload },
        },
        ServerFrame::ResponseFinish { scope } => Frame::Finish { scope },
        ServerFrame::ChannelRequest {
            scope,
            channel,
            payload,
        } => Frame::ChannelRequest {
            opener: Role::Server,
            scope,
            channel,
            payload,
        },
        ServerFrame::ChannelResponse {
            scope,
            channel,
            payload,
        } => {
            let json = payload.get(1..).unwrap_or_default();
            match tag(payload) {
                Ok(Tag::Chunk) => Frame::Chunk {
                    scope,
                    channel,
                    json,
                },
                Ok(Tag::Error) => Frame::Error {
                    scope,
                    channel,
                    json,
                },
                Err(_) => Frame::ChannelResponse {
                    opener: Role::Client,
                    scope,
                    channel,
                    payload,
                },
            }
        }
        ServerFrame::ChannelResponseFinish { scope, channel } => Frame::ChannelFinish {
            opener: Role::Client,
            scope,
            channel,
        },
    }
}

/// Wire bytes as one line of text: UTF-8 as it is (invalid sequences
/// replaced), control characters escaped.
pub struct Shown<'a>(pub &'a [u8]);

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in String::from_utf8_lossy(self.0).chars() {
            if c.is_control() {
                write!(f, "{}", c.escape_default())?;
            } else {
                write!(f, "{c}")?;
            }
        }
        Ok(())
    }
}

/// A payload the description does not read: its first byte and length.
fn payload(f: &mut fmt::Formatter<'_>, what: &str, payload: &[u8]) -> fmt::Result {
    match payload.first() {
        Some(first) => write!(f, "{what} [{first}] ({} bytes)", payload.len()),
        None => write!(f, "{what}, empty"),
    }
}

impl Frame<'_> {
    /// Where the frame is: its scope, its channel and who opened it.
    fn place(&self) -> Option<(u32, Option<(Role, u32)>)> {
        match *self {
            Frame::Authorization { .. } | Frame::Malformed(_) => None,
            Frame::Run { scope, .. }
            | Frame::Request { scope, .. }
            | Frame::Id { scope, .. }
            | Frame::Refused { scope, .. }
            | Frame::Response { scope, .. }
            | Frame::Finish { scope } => Some((scope, None)),
            Frame::Stop { scope, channel }
            | Frame::RunLoop { scope, channel, .. }
            | Frame::Chunk { scope, channel, .. }
            | Frame::Error { scope, channel, .. } => Some((scope, Some((Role::Client, channel)))),
            Frame::ChannelRequest {
                opener,
                scope,
                channel,
                ..
            }
            | Frame::ChannelResponse {
                opener,
                scope,
                channel,
                ..
            }
            | Frame::ChannelFinish {
                opener,
                scope,
                channel,
            } => Some((scope, Some((opener, channel)))),
        }
    }

    /// The frame's scope and channel, where it names them.
    pub fn at(&self) -> (Option<u32>, Option<u32>) {
        match self.place() {
            Some((scope, channel)) => (Some(scope), channel.map(|(_, number)| number)),
            None => (None, None),
        }
    }

    /// What the frame is, without its place (which a JSON line holds in
    /// members of its own).
    pub fn what(&self) -> What<'_, '_> {
        What(self)
    }
}

/// [`Frame::what`].
pub struct What<'a, 'm>(&'a Frame<'m>);

impl fmt::Display for What<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self.0 {
            Frame::Authorization { mode: Some(0) } => {
                f.write_str("authorization: unbrokered (the credential is not shown)")
            }
            Frame::Authorization { mode: Some(mode) } => write!(f, "authorization: mode {mode}"),
            Frame::Authorization { mode: None } => f.write_str("authorization, empty"),
            Frame::Run { json, .. } => write!(f, "agents::run {}", Shown(json)),
            Frame::Request { payload: p, .. } => payload(f, "request", p),
            // Debug quotes the id and escapes its control characters.
            Frame::Id { ref id, .. } => write!(f, "id {id:?}"),
            Frame::Refused { json, .. } => write!(f, "refused {}", Shown(json)),
            Frame::Response { payload: p, .. } => payload(f, "response", p),
            Frame::Finish { .. } | Frame::ChannelFinish { .. } => f.write_str("finish"),
            Frame::Stop { .. } => f.write_str("stop"),
            Frame::RunLoop { json, .. } => write!(f, "run-loop {}", Shown(json)),
            Frame::ChannelRequest { payload: p, .. } => payload(f, "channel request", p),
            Frame::Chunk { json, .. } => write!(f, "chunk {}", Shown(json)),
            Frame::Error { json, .. } => write!(f, "error {}", Shown(json)),
            Frame::ChannelResponse { payload: p, .. } => payload(f, "channel response", p),
            Frame::Malformed(ref why) => write!(f, "not a frame: {}", Shown(why.as_bytes())),
        }
    }
}

/// `scope 1 channel 2: chunk {…}`: the place, then what the frame is.
impl fmt::Display for Frame<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some((scope, channel)) = self.place() {
            write!(f, "scope {scope}")?;
            if let Some((opener, channel)) = channel {
                write!(f, " channel {channel}")?;
                if opener == Role::Server {
                    f.write_str(" (server's)")?;
                }
            }
            f.write_str(": ")?;
        }
        write!(f, "{}", self.what())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use runloop_proto::frame::raw as message;

    fn shown(direction: Direction, message: &[u8]) -> String {
        describe(direction, message).to_string()
    }

    #[test]
    fn every_frame_of_a_run_in_words() {
        use Direction::{ClientToServer as C, ServerToClient as S};
        let cases = [
            (
                C,
                message(0, 0, 0, b"\x00secret"),
                "authorization: unbrokered (the credential is not shown)",
            ),
            (
                C,
                message(1, 1, 0, &[&b"\x00"[..], br#"{"image":{"server":{"name":"demo","digest":"sha256:0000000000000000000000000000000000000000000000000000000000000000"}},"memory":1,"disk":0,"agent":{}}"#].concat()),
                r#"scope 1: agents::run {"image":{"server":{"name":"demo","digest":"sha256:0000000000000000000000000000000000000000000000000000000000000000"}},"memory":1,"disk":0,"agent":{}}"#,
            ),
            (C, message(1, 2, 0, b"\xc8{}"), "scope 2: request [200] (3 bytes)"),
            (S, message(2, 1, 0, &[&b"\x00"[..], br#"{"id":"r-1"}"#].concat()), r#"scope 1: id "r-1""#),
            (
                S,
                message(2, 1, 0, b"\x01{\"kind\":\"policy\"}"),
                r#"scope 1: refused {"kind":"policy"}"#,
            ),
            (
                C,
                message(4, 1, 1, b"\x05{\"prompt\":\"a\\nb\"}"),
                r#"scope 1 channel 1: run-loop {"prompt":"a\nb"}"#,
            ),
            (
                S,
                message(5, 1, 1, b"\x00{\"type\":\"user\",\n\"prompt\":\"x\"}"),
                "scope 1 channel 1: chunk {\"type\":\"user\",\\n\"prompt\":\"x\"}",
            ),
            (S, message(5, 1, 1, b"\x01\"down\""), r#"scope 1 channel 1: error "down""#),
            (S, message(5, 1, 1, b"\x07"), "scope 1 channel 1: channel response [7] (1 bytes)"),
            (S, message(6, 1, 1, b""), "scope 1 channel 1: finish"),
            (C, message(4, 1, 2, b"\x00"), "scope 1 channel 2: stop"),
            (C, message(4, 1, 3, b""), "scope 1 channel 3: channel request, empty"),
            (
                S,
                message(4, 1, 3, b"\x06{}"),
                "scope 1 channel 3 (server's): channel request [6] (3 bytes)",
            ),
            (S, message(3, 1, 0, b""), "scope 1: finish"),
            (S, vec![2, 0], "not a frame: frame is truncated: 2 bytes, the header alone is 9"),
        ];
        for (direction, message, expected) in cases {
            assert_eq!(shown(direction, &message), expected, "{message:?}");
        }
    }

    #[test]
    fn the_credential_never_shows() {
        let frame = message(0, 0, 0, b"\x00hunter2");
        let described = describe(Direction::ClientToServer, &frame);
        assert!(!described.to_string().contains("hunter2"));
        assert!(!format!("{described:?}").contains("hunter2"));
    }

    #[test]
    fn wire_text_cannot_reach_the_terminal() {
        let frame = message(5, 1, 1, b"\x00{\"text\":\"\x1b[31m\"}\r\n\xff");
        let text = shown(Direction::ServerToClient, &frame);
        assert!(!text.chars().any(char::is_control), "{text:?}");
        assert!(text.contains("\\u{1b}[31m"), "{text}");
    }
}
