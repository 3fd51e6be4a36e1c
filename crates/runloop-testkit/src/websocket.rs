//! WebSocket frames as bytes, written by tungstenite's own frame header:
//! what a test feeds a reader of this project's frame layer (runloop-wire's
//! `ws`, the server's read-ahead) so that the reader is held to another
//! implementation's frames, not to its own writer's.

use tokio_tungstenite::tungstenite::protocol::frame::FrameHeader;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Control, Data, OpCode};

/// A frame's bytes: its head (masked with a zero key when `masked`), then
/// `payload` as it is.
pub fn frame(opcode: OpCode, fin: bool, payload: &[u8], masked: bool) -> Vec<u8> {
    let header = FrameHeader {
        is_final: fin,
        opcode,
        mask: masked.then_some([0; 4]),
        ..FrameHeader::default()
    };
    let mut bytes = Vec::new();
    header
        .format(payload.len() as u64, &mut bytes)
        .expect("formats");
    bytes.extend_from_slice(payload);
    bytes
}

/// A binary message's first frame (its last when `fin`).
pub fn binary(fin: bool, payload: &[u8]) -> Vec<u8> {
    frame(OpCode::Data(Data::Binary), fin, payload, false)
}

/// A continuation frame (the message's last when `fin`).
pub fn more(fin: bool, payload: &[u8]) -> Vec<u8> {
    frame(OpCode::Data(Data::Continue), fin, payload, false)
}

/// A ping of one byte.
pub fn ping() -> Vec<u8> {
    frame(OpCode::Control(Control::Ping), true, b"p", false)
}
