//! `ws_frames`: the WebSocket frame layer of `runloop-wire` against
//! tungstenite, differentially, where both read.
//!
//! The input is read twice. As one frame head: `Head::parse` must agree
//! with tungstenite's `FrameHeader::parse` on whether the head is whole,
//! on every field, on how many bytes it took and on which opcodes are
//! refused, and a head written back must be what tungstenite writes. As
//! the bytes a client reads after its handshake: the message reader takes
//! the binary messages and hands everything else to a tungstenite client
//! (as the server's relay does), and what that pair reads — every message,
//! in order, up to the close, the first fault or the end of the input —
//! must be what tungstenite alone reads from the same bytes.
//!
//! This file is a fuzz target's check and is also compiled into
//! `crates/runloop-wire/tests/corpus.rs`, which replays `corpus/ws_frames`
//! on stable; so it uses only `runloop-wire`, `tokio-tungstenite`, `bytes`
//! and `std`.

use std::io::{self, Cursor, Read, Write};

use bytes::BytesMut;
use runloop_wire::ws::{Head, MAX_HEAD, MessageReader, Step};
use tokio_tungstenite::tungstenite::error::ProtocolError;
use tokio_tungstenite::tungstenite::protocol::frame::FrameHeader;
use tokio_tungstenite::tungstenite::protocol::frame::coding::OpCode;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocket, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Error, Message};

/// The largest message and frame on both sides: small, so that inputs
/// reach the limit.
const LIMIT: usize = 1024;

/// The check. Returns whether the input was read as at least one head or
/// one message.
pub fn ws_frames(data: &[u8]) -> bool {
    let head = one_head(data);
    let messages = messages(data);
    head || messages
}

/// The opcode tungstenite gives a byte's low four bits.
fn opcode_byte(opcode: OpCode) -> u8 {
    u8::from(opcode)
}

fn one_head(data: &[u8]) -> bool {
    let ours = Head::parse(data);
    let mut cursor = Cursor::new(data);
    let theirs = FrameHeader::parse(&mut cursor);
    match (ours, theirs) {
        (None, Ok(None)) => false,
        (Some((head, _)), Err(Error::Protocol(ProtocolError::InvalidOpcode(byte)))) => {
            assert!(
                !head.is_known(),
                "tungstenite refused opcode {byte}, we know it"
            );
            assert_eq!(head.opcode, byte);
            true
        }
        (Some((head, taken)), Ok(Some((header, length)))) => {
            assert!(head.is_known(), "tungstenite knows opcode {}", head.opcode);
            assert_eq!(taken as u64, cursor.position(), "the head's length");
            assert_eq!(head.fin, header.is_final);
            assert_eq!(
                head.reserved,
                u8::from(header.rsv1) << 2 | u8::from(header.rsv2) << 1 | u8::from(header.rsv3)
            );
            assert_eq!(head.opcode, opcode_byte(header.opcode));
            assert_eq!(head.mask, header.mask);
            assert_eq!(head.length, length);
            assert_eq!(
                head.is_control(),
                matches!(header.opcode, OpCode::Control(_))
            );
            // Written back: what tungstenite writes, and read back the same.
            let mut out = [0; MAX_HEAD];
            let len = head.write(&mut out);
            let mut written = Vec::new();
            header.format(length, &mut written).expect("formats");
            assert_eq!(&out[..len], &written[..]);
            assert_eq!(Head::parse(&out[..len]), Some((head, len)));
            true
        }
        (ours, theirs) => panic!("we read {ours:?}, tungstenite {theirs:?}"),
    }
}

/// Bytes to read, then "would block"; every write taken.
#[derive(Default)]
struct Pipe {
    bytes: Vec<u8>,
    at: usize,
}

impl Read for Pipe {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let rest = &self.bytes[self.at..];
        if rest.is_empty() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let n = rest.len().min(buf.len());
        buf[..n].copy_from_slice(&rest[..n]);
        self.at += n;
        Ok(n)
    }
}

impl Write for Pipe {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// How a reading ended.
#[derive(Debug, PartialEq, Eq)]
enum End {
    /// The input ran out (at a frame's end or inside one).
    Input,
    /// A close was read.
    Close,
    /// The bytes broke the protocol.
    Fault,
}

fn client(pipe: Pipe) -> WebSocket<Pipe> {
    let config = WebSocketConfig::default()
        .max_message_size(Some(LIMIT))
        .max_frame_size(Some(LIMIT));
    WebSocket::from_raw_socket(pipe, Role::Client, Some(config))
}

/// Reads what `ws` has until it would block: `Some(end)` if the reading
/// ended.
fn drain(ws: &mut WebSocket<Pipe>, read: &mut Vec<Message>) -> Option<End> {
    loop {
        match ws.read() {
            Ok(Message::Close(_)) => return Some(End::Close),
            Ok(message) => read.push(message),
            Err(Error::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => return None,
            Err(_) => return Some(End::Fault),
        }
    }
}

fn messages(data: &[u8]) -> bool {
    // Tungstenite alone.
    let mut alone = client(Pipe {
        bytes: data.to_vec(),
        at: 0,
    });
    let mut expected = Vec::new();
    let expected_end = drain(&mut alone, &mut expected).unwrap_or(End::Input);

    // The message reader, and tungstenite for what it hands on.
    let mut reader = MessageReader::after_handshake(LIMIT);
    let mut buffer = BytesMut::from(data);
    let mut handed = client(Pipe::default());
    let mut read = Vec::new();
    let end = loop {
        match reader.step(&mut buffer) {
            Step::Message(message) => {
                assert!(message.len() <= LIMIT, "a message over the limit");
                read.push(Message::Binary(message));
            }
            Step::HandOn(n) => {
                let n = usize::try_from(n).unwrap_or(usize::MAX).min(buffer.len());
                handed
                    .get_mut()
                    .bytes
                    .extend_from_slice(&buffer.split_to(n));
                if let Some(end) = drain(&mut handed, &mut read) {
                    break end;
                }
            }
            Step::NeedMore(n) => {
                assert!(n > buffer.len(), "more than is there");
                break End::Input;
            }
            Step::Fault(_) => break End::Fault,
        }
    };
    let expected_end = match (&end, expected_end) {
        (End::Fault, End::Input) => rest_of_frame(&buffer, &mut alone, &mut expected),
        (_, expected_end) => expected_end,
    };
    assert_eq!(read, expected, "what was read");
    assert_eq!(end, expected_end, "how the reading ended");
    !read.is_empty()
}

/// The reader refused a frame at its head, before its payload came (a
/// fragment that takes its message over the limit); tungstenite waits for
/// the whole frame before it counts. Gives tungstenite the rest of the
/// frame at the start of `buffer` and says how its reading then ends.
fn rest_of_frame(buffer: &[u8], alone: &mut WebSocket<Pipe>, read: &mut Vec<Message>) -> End {
    let Some((head, taken)) = Head::parse(buffer) else {
        return End::Input;
    };
    let whole = (taken as u64).saturating_add(head.length);
    if head.length > LIMIT as u64 || whole <= buffer.len() as u64 {
        // Tungstenite refuses such a frame at its head, or had it whole.
        return End::Input;
    }
    let missing = whole as usize - buffer.len();
    alone
        .get_mut()
        .bytes
        .extend(std::iter::repeat_n(0, missing));
    drain(alone, read).unwrap_or(End::Input)
}
