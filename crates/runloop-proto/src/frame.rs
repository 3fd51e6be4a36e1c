//! Frames: the 9-byte header every protocol message starts with (protocol §2).
//!
//! ```text
//! [type: u8][scope: u32 BE][channel: u32 BE][payload …to the end of the message]
//! ```
//!
//! A frame's kind is its type *and* its direction, so there are two frame
//! types here rather than one: [`ClientFrame`] (what a client may send) and
//! [`ServerFrame`] (what a server may send). Each is decoded from one whole
//! WebSocket message, borrows its payload, and carries only the header fields
//! its kind reads; the fields a kind leaves unused are ignored on receipt and
//! written as zero. A type that is not defined for the direction it arrived
//! from is an error that keeps the byte, so a log line can say what came.
//!
//! Finish frames carry no payload. Bytes after a finish header are ignored
//! rather than making the finish malformed: disregarding a finish would leave
//! a stream open forever, which is worse than tolerating padding.

use std::fmt;

use crate::codec::{Decode, Encode, Writer};

/// Length of the fixed frame header.
pub const HEADER_LEN: usize = 9;

/// The seven frame types (the first header byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FrameType {
    /// `0`: authorization, from the party that dialled (§3).
    Authorization = 0,
    /// `1`: a request that opens a scope (client only).
    Request = 1,
    /// `2`: one piece of a scope's answer (server only).
    Response = 2,
    /// `3`: the end of a scope (server only).
    ResponseFinish = 3,
    /// `4`: a request that opens a channel inside a scope.
    ChannelRequest = 4,
    /// `5`: one piece of a channel's answer.
    ChannelResponse = 5,
    /// `6`: the end of a channel.
    ChannelResponseFinish = 6,
}

impl FrameType {
    /// The protocol's name for the type, for messages and logs.
    pub fn name(self) -> &'static str {
        match self {
            FrameType::Authorization => "authorization",
            FrameType::Request => "request",
            FrameType::Response => "response",
            FrameType::ResponseFinish => "response finish",
            FrameType::ChannelRequest => "channel request",
            FrameType::ChannelResponse => "channel response",
            FrameType::ChannelResponseFinish => "channel response finish",
        }
    }

    /// The type for a header byte, if the byte names one at all.
    pub fn from_byte(byte: u8) -> Option<FrameType> {
        Some(match byte {
            0 => FrameType::Authorization,
            1 => FrameType::Request,
            2 => FrameType::Response,
            3 => FrameType::ResponseFinish,
            4 => FrameType::ChannelRequest,
            5 => FrameType::ChannelResponse,
            6 => FrameType::ChannelResponseFinish,
            _ => return None,
        })
    }
}

/// The two fixed roles of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Opens scopes; the caller.
    Client,
    /// Answers scopes; the provider.
    Server,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Client => "client",
            Role::Server => "server",
        })
    }
}

/// A message that is not a frame of the direction it came from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// Shorter than the 9-byte header.
    #[error("frame is truncated: {len} bytes, the header alone is 9")]
    Truncated {
        /// How many bytes the message had.
        len: usize,
    },
    /// A type byte the sender's role may not send.
    #[error("frame type {byte} is not defined for frames sent by a {sender}")]
    UndefinedType {
        /// The type byte as it came.
        byte: u8,
        /// The role of the party that sent it.
        sender: Role,
    },
}

/// The header fields every frame has, before its kind is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RawHeader {
    byte: u8,
    scope: u32,
    channel: u32,
}

fn split_header(message: &[u8]) -> Result<(RawHeader, &[u8]), HeaderError> {
    let Some((header, payload)) = message.split_first_chunk::<HEADER_LEN>() else {
        return Err(HeaderError::Truncated { len: message.len() });
    };
    let [byte, s0, s1, s2, s3, c0, c1, c2, c3] = *header;
    let header = RawHeader {
        byte,
        scope: u32::from_be_bytes([s0, s1, s2, s3]),
        channel: u32::from_be_bytes([c0, c1, c2, c3]),
    };
    Ok((header, payload))
}

/// The 9 header bytes for any type byte: the one place the layout is written.
fn header(byte: u8, scope: u32, channel: u32) -> [u8; HEADER_LEN] {
    let mut header = [0u8; HEADER_LEN];
    header[0] = byte;
    header[1..5].copy_from_slice(&scope.to_be_bytes());
    header[5..9].copy_from_slice(&channel.to_be_bytes());
    header
}

/// Writes a header; used by both directions' encoders.
pub fn write_header(out: &mut Writer<'_>, frame_type: FrameType, scope: u32, channel: u32) {
    out.extend_from_slice(&header(frame_type as u8, scope, channel));
}

/// A message with any type byte, defined or not, for either direction: the
/// frames a conformance probe or a fuzzer sends to see them disregarded.
/// A frame of a defined kind is built with [`to_message`] or [`build`].
pub fn raw(byte: u8, scope: u32, channel: u32, payload: &[u8]) -> Vec<u8> {
    let mut message = Vec::with_capacity(HEADER_LEN + payload.len());
    message.extend_from_slice(&header(byte, scope, channel));
    message.extend_from_slice(payload);
    message
}

/// A frame a client may send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientFrame<'a> {
    /// Type 0. The payload is an [`Authorization`](crate::authorization::Authorization).
    Authorization {
        /// The authorization payload.
        payload: &'a [u8],
    },
    /// Type 1: opens `scope`. The payload is an endpoint tag and a request.
    Request {
        /// The scope number the client chose.
        scope: u32,
        /// Endpoint tag and request.
        payload: &'a [u8],
    },
    /// Type 4: opens the client's channel `channel` inside `scope`.
    ChannelRequest {
        /// The scope the channel lives in.
        scope: u32,
        /// The channel number, in the client's numbering.
        channel: u32,
        /// Channel tag and request.
        payload: &'a [u8],
    },
    /// Type 5: answers the server's channel `channel`.
    ChannelResponse {
        /// The scope the channel lives in.
        scope: u32,
        /// The channel number, in the server's (the opener's) numbering.
        channel: u32,
        /// One piece of the answer.
        payload: &'a [u8],
    },
    /// Type 6: ends the server's channel `channel`.
    ChannelResponseFinish {
        /// The scope the channel lives in.
        scope: u32,
        /// The channel number, in the server's (the opener's) numbering.
        channel: u32,
    },
}

/// A frame a server may send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerFrame<'a> {
    /// Type 0, from a server that dialled the connection.
    Authorization {
        /// The authorization payload.
        payload: &'a [u8],
    },
    /// Type 2: one piece of `scope`'s answer.
    Response {
        /// The scope being answered.
        scope: u32,
        /// One piece of the answer.
        payload: &'a [u8],
    },
    /// Type 3: ends `scope`.
    ResponseFinish {
        /// The scope that ends.
        scope: u32,
    },
    /// Type 4: opens the server's channel `channel` inside `scope`.
    ChannelRequest {
        /// The scope the channel lives in.
        scope: u32,
        /// The channel number, in the server's numbering.
        channel: u32,
        /// Channel tag and request.
        payload: &'a [u8],
    },
    /// Type 5: answers the client's channel `channel`.
    ChannelResponse {
        /// The scope the channel lives in.
        scope: u32,
        /// The channel number, in the client's (the opener's) numbering.
        channel: u32,
        /// One piece of the answer.
        payload: &'a [u8],
    },
    /// Type 6: ends the client's channel `channel`.
    ChannelResponseFinish {
        /// The scope the channel lives in.
        scope: u32,
        /// The channel number, in the client's (the opener's) numbering.
        channel: u32,
    },
}

impl<'a> Decode<'a> for ClientFrame<'a> {
    type Error = HeaderError;

    fn decode(message: &'a [u8]) -> Result<Self, HeaderError> {
        let (h, payload) = split_header(message)?;
        Ok(match FrameType::from_byte(h.byte) {
            Some(FrameType::Authorization) => ClientFrame::Authorization { payload },
            Some(FrameType::Request) => ClientFrame::Request {
                scope: h.scope,
                payload,
            },
            Some(FrameType::ChannelRequest) => ClientFrame::ChannelRequest {
                scope: h.scope,
                channel: h.channel,
                payload,
            },
            Some(FrameType::ChannelResponse) => ClientFrame::ChannelResponse {
                scope: h.scope,
                channel: h.channel,
                payload,
            },
            Some(FrameType::ChannelResponseFinish) => ClientFrame::ChannelResponseFinish {
                scope: h.scope,
                channel: h.channel,
            },
            Some(FrameType::Response | FrameType::ResponseFinish) | None => {
                return Err(HeaderError::UndefinedType {
                    byte: h.byte,
                    sender: Role::Client,
                });
            }
        })
    }
}

impl<'a> Decode<'a> for ServerFrame<'a> {
    type Error = HeaderError;

    fn decode(message: &'a [u8]) -> Result<Self, HeaderError> {
        let (h, payload) = split_header(message)?;
        Ok(match FrameType::from_byte(h.byte) {
            Some(FrameType::Authorization) => ServerFrame::Authorization { payload },
            Some(FrameType::Response) => ServerFrame::Response {
                scope: h.scope,
                payload,
            },
            Some(FrameType::ResponseFinish) => ServerFrame::ResponseFinish { scope: h.scope },
            Some(FrameType::ChannelRequest) => ServerFrame::ChannelRequest {
                scope: h.scope,
                channel: h.channel,
                payload,
            },
            Some(FrameType::ChannelResponse) => ServerFrame::ChannelResponse {
                scope: h.scope,
                channel: h.channel,
                payload,
            },
            Some(FrameType::ChannelResponseFinish) => ServerFrame::ChannelResponseFinish {
                scope: h.scope,
                channel: h.channel,
            },
            Some(FrameType::Request) | None => {
                return Err(HeaderError::UndefinedType {
                    byte: h.byte,
                    sender: Role::Server,
                });
            }
        })
    }
}

impl ClientFrame<'_> {
    /// The header fields and payload, as written on the wire.
    fn parts(&self) -> (FrameType, u32, u32, &[u8]) {
        match *self {
            ClientFrame::Authorization { payload } => (FrameType::Authorization, 0, 0, payload),
            ClientFrame::Request { scope, payload } => (FrameType::Request, scope, 0, payload),
            ClientFrame::ChannelRequest {
                scope,
                channel,
                payload,
            } => (FrameType::ChannelRequest, scope, channel, payload),
            ClientFrame::ChannelResponse {
                scope,
                channel,
                payload,
            } => (FrameType::ChannelResponse, scope, channel, payload),
            ClientFrame::ChannelResponseFinish { scope, channel } => {
                (FrameType::ChannelResponseFinish, scope, channel, &[])
            }
        }
    }

    /// This frame's type.
    pub fn frame_type(&self) -> FrameType {
        self.parts().0
    }
}

impl ServerFrame<'_> {
    /// The header fields and payload, as written on the wire.
    fn parts(&self) -> (FrameType, u32, u32, &[u8]) {
        match *self {
            ServerFrame::Authorization { payload } => (FrameType::Authorization, 0, 0, payload),
            ServerFrame::Response { scope, payload } => (FrameType::Response, scope, 0, payload),
            ServerFrame::ResponseFinish { scope } => (FrameType::ResponseFinish, scope, 0, &[]),
            ServerFrame::ChannelRequest {
                scope,
                channel,
                payload,
            } => (FrameType::ChannelRequest, scope, channel, payload),
            ServerFrame::ChannelResponse {
                scope,
                channel,
                payload,
            } => (FrameType::ChannelResponse, scope, channel, payload),
            ServerFrame::ChannelResponseFinish { scope, channel } => {
                (FrameType::ChannelResponseFinish, scope, channel, &[])
            }
        }
    }

    /// This frame's type.
    pub fn frame_type(&self) -> FrameType {
        self.parts().0
    }
}

impl Encode for ClientFrame<'_> {
    type Error = std::convert::Infallible;

    fn encode(&self, out: &mut Writer<'_>) -> Result<(), Self::Error> {
        let (frame_type, scope, channel, payload) = self.parts();
        write_header(out, frame_type, scope, channel);
        out.extend_from_slice(payload);
        Ok(())
    }

    fn size_hint(&self) -> usize {
        HEADER_LEN + self.parts().3.len()
    }
}

impl Encode for ServerFrame<'_> {
    type Error = std::convert::Infallible;

    fn encode(&self, out: &mut Writer<'_>) -> Result<(), Self::Error> {
        let (frame_type, scope, channel, payload) = self.parts();
        write_header(out, frame_type, scope, channel);
        out.extend_from_slice(payload);
        Ok(())
    }

    fn size_hint(&self) -> usize {
        HEADER_LEN + self.parts().3.len()
    }
}

/// A frame's bytes in one buffer of exactly its size: one allocation.
pub fn to_message<F: Encode<Error = std::convert::Infallible>>(frame: &F) -> Vec<u8> {
    let mut buf = Vec::with_capacity(frame.size_hint());
    match frame.encode(&mut Writer::new(&mut buf)) {
        Ok(()) => buf,
        Err(never) => match never {},
    }
}

/// Builds a frame whose payload is produced by `payload`: the header is
/// written first, then the payload appends after it, into one buffer.
///
/// `size_hint` is the expected payload length, reserved together with the
/// header so that a payload of that size costs no further allocation.
pub fn build<E>(
    frame_type: FrameType,
    scope: u32,
    channel: u32,
    size_hint: usize,
    payload: impl FnOnce(&mut Writer<'_>) -> Result<(), E>,
) -> Result<Vec<u8>, E> {
    let mut buf = Vec::with_capacity(HEADER_LEN + size_hint);
    let mut out = Writer::new(&mut buf);
    write_header(&mut out, frame_type, scope, channel);
    payload(&mut out)?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[rustfmt::skip]
    const CLIENT_CHANNEL_REQUEST: &[u8] = &[
        4, 0, 0, 0, 7, 0, 0, 1, 2,
        5, b'{', b'}',
    ];

    #[rustfmt::skip]
    const SERVER_CHANNEL_RESPONSE: &[u8] = &[
        5, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 3,
        0, b'{', b'}',
    ];

    #[test]
    fn golden_client_channel_request() {
        let frame = ClientFrame::decode(CLIENT_CHANNEL_REQUEST).expect("decodes");
        assert_eq!(
            frame,
            ClientFrame::ChannelRequest {
                scope: 7,
                channel: 258,
                payload: &[5, b'{', b'}']
            }
        );
        assert_eq!(to_message(&frame), CLIENT_CHANNEL_REQUEST);
    }

    #[test]
    fn golden_server_channel_response() {
        let frame = ServerFrame::decode(SERVER_CHANNEL_RESPONSE).expect("decodes");
        assert_eq!(
            frame,
            ServerFrame::ChannelResponse {
                scope: u32::MAX,
                channel: 3,
                payload: b"\0{}"
            }
        );
        assert_eq!(to_message(&frame), SERVER_CHANNEL_RESPONSE);
    }

    #[test]
    fn golden_finishes_have_no_payload_and_zero_unused_fields() {
        #[rustfmt::skip]
        let scope_finish: &[u8] = &[
            3, 0, 0, 0, 9, 0, 0, 0, 0,
        ];
        assert_eq!(
            to_message(&ServerFrame::ResponseFinish { scope: 9 }),
            scope_finish
        );
        #[rustfmt::skip]
        let request: &[u8] = &[
            1, 0, 0, 0, 2, 0, 0, 0, 0,
            0, b'{', b'}',
        ];
        assert_eq!(
            to_message(&ClientFrame::Request {
                scope: 2,
                payload: b"\0{}"
            }),
            request
        );
        #[rustfmt::skip]
        let authorization: &[u8] = &[
            0, 0, 0, 0, 0, 0, 0, 0, 0,
            0, b't',
        ];
        assert_eq!(
            to_message(&ClientFrame::Authorization { payload: b"\0t" }),
            authorization
        );
    }

    #[test]
    fn unused_fields_are_ignored_on_receipt() {
        #[rustfmt::skip]
        let finish: &[u8] = &[
            3, 0, 0, 0, 9, 0xde, 0xad, 0xbe, 0xef,
        ];
        assert_eq!(
            ServerFrame::decode(finish),
            Ok(ServerFrame::ResponseFinish { scope: 9 })
        );
        #[rustfmt::skip]
        let authorization: &[u8] = &[
            0, 1, 2, 3, 4, 5, 6, 7, 8,
        ];
        assert_eq!(
            ClientFrame::decode(authorization),
            Ok(ClientFrame::Authorization { payload: &[] })
        );
    }

    #[test]
    fn every_truncation_length_is_reported() {
        let full = SERVER_CHANNEL_RESPONSE;
        for len in 0..HEADER_LEN {
            let expected = HeaderError::Truncated { len };
            assert_eq!(ServerFrame::decode(&full[..len]), Err(expected.clone()));
            assert_eq!(ClientFrame::decode(&full[..len]), Err(expected));
        }
        assert!(ServerFrame::decode(&full[..HEADER_LEN]).is_ok());
    }

    #[test]
    fn direction_decides_which_types_exist() {
        let header = |byte: u8| [byte, 0, 0, 0, 1, 0, 0, 0, 1];
        for byte in [2u8, 3, 7, 8, 200, 255] {
            assert_eq!(
                ClientFrame::decode(&header(byte)),
                Err(HeaderError::UndefinedType {
                    byte,
                    sender: Role::Client
                })
            );
        }
        for byte in [1u8, 7, 255] {
            assert_eq!(
                ServerFrame::decode(&header(byte)),
                Err(HeaderError::UndefinedType {
                    byte,
                    sender: Role::Server
                })
            );
        }
        for byte in [0u8, 1, 4, 5, 6] {
            assert!(
                ClientFrame::decode(&header(byte)).is_ok(),
                "client type {byte}"
            );
        }
        for byte in [0u8, 2, 3, 4, 5, 6] {
            assert!(
                ServerFrame::decode(&header(byte)).is_ok(),
                "server type {byte}"
            );
        }
    }

    #[test]
    fn error_messages() {
        assert_eq!(
            HeaderError::Truncated { len: 4 }.to_string(),
            "frame is truncated: 4 bytes, the header alone is 9"
        );
        assert_eq!(
            HeaderError::UndefinedType {
                byte: 2,
                sender: Role::Client
            }
            .to_string(),
            "frame type 2 is not defined for frames sent by a client"
        );
    }

    #[test]
    fn raw_lays_out_any_type_byte() {
        assert_eq!(
            raw(7, 1, 2, b"x"),
            [7, 0, 0, 0, 1, 0, 0, 0, 2, b'x'],
            "a type no direction defines"
        );
        let request = ClientFrame::Request {
            scope: 3,
            payload: b"\0{}",
        };
        assert_eq!(
            raw(FrameType::Request as u8, 3, 0, b"\0{}"),
            to_message(&request)
        );
    }

    #[test]
    fn build_writes_header_then_payload_in_one_buffer() {
        let message = build(FrameType::ChannelResponse, 1, 2, 3, |out| {
            out.extend_from_slice(b"abc");
            Ok::<(), ()>(())
        })
        .expect("builds");
        assert_eq!(message, [5, 0, 0, 0, 1, 0, 0, 0, 2, b'a', b'b', b'c']);
        assert_eq!(message.capacity(), message.len());
    }
}
