//! Where a proxy path's bytes stand between WebSocket messages: whether a
//! fragmented message has begun and not ended.
//!
//! A proxy may send a large message in fragments (RFC 6455, section 5.4;
//! this project's proxy does for a chunk over 64 KiB), and a close frame
//! may come between fragments. The WebSocket library then drops the
//! unfinished message and reports the close like any other, so a relay
//! that took every close for a clean end would report a loop whose last
//! chunk was lost as finished. The close that ends an answer is clean only
//! between messages (protocol §10, §12), and the library does not say
//! where it came: [`MessageEdges`] reads the frame headers of the bytes
//! handed to the library, after the HTTP answer to the handshake, and
//! keeps one bit.
//!
//! It reads only headers: a frame's payload is skipped by its length, so a
//! read of many small frames costs a few comparisons per frame.

/// Reads the bytes of one side of a WebSocket, as they are handed to its
/// reader, from the HTTP answer to the handshake on.
#[derive(Debug, Default)]
pub(crate) struct MessageEdges {
    state: State,
    /// Whether a data frame without FIN has come and its last fragment
    /// has not.
    open: bool,
}

#[derive(Debug)]
enum State {
    /// In the HTTP answer: how much of the `\r\n\r\n` that ends it is seen.
    Http(usize),
    /// In a frame's header cut by the end of a read: its bytes so far.
    Header { bytes: [u8; MAX_HEADER], got: usize },
    /// In a frame's payload: the bytes left (none: at the next header).
    Payload(u64),
}

impl Default for State {
    fn default() -> Self {
        State::Http(0)
    }
}

/// The longest frame header: 2 bytes, an 8-byte length, a 4-byte mask.
const MAX_HEADER: usize = 14;

/// The end of the HTTP answer.
const HTTP_END: &[u8] = b"\r\n\r\n";

impl MessageEdges {
    /// Whether the bytes read so far leave a fragmented message open: a
    /// close read now came inside it.
    pub(crate) fn inside_message(&self) -> bool {
        self.open
    }

    /// Reads `bytes`, the next ones handed to the WebSocket.
    pub(crate) fn read(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            match &mut self.state {
                State::Payload(left) => {
                    // The common case, frames whole in the read: each
                    // payload skipped, each header read where it lies.
                    let mut cut = false;
                    loop {
                        let skipped = bytes
                            .len()
                            .min(usize::try_from(*left).unwrap_or(usize::MAX));
                        *left -= skipped as u64;
                        bytes = &bytes[skipped..];
                        if *left > 0 || bytes.is_empty() {
                            break;
                        }
                        let need = header_len(bytes);
                        if bytes.len() < need {
                            cut = true;
                            break;
                        }
                        let (length, open) = frame(&bytes[..need], self.open);
                        self.open = open;
                        *left = length;
                        bytes = &bytes[need..];
                    }
                    if cut {
                        // A header cut by the end of the read.
                        self.state = State::Header {
                            bytes: [0; MAX_HEADER],
                            got: 0,
                        };
                    }
                }
                State::Header { bytes: header, got } => {
                    let need = header_len(&header[..*got]);
                    let taken = (need - *got).min(bytes.len());
                    header[*got..*got + taken].copy_from_slice(&bytes[..taken]);
                    *got += taken;
                    bytes = &bytes[taken..];
                    // The length bytes may have made the header longer.
                    if *got == header_len(&header[..*got]) {
                        let (length, open) = frame(&header[..*got], self.open);
                        self.open = open;
                        self.state = State::Payload(length);
                    }
                }
                State::Http(seen) => {
                    let byte = bytes[0];
                    bytes = &bytes[1..];
                    *seen = if byte == HTTP_END[*seen] {
                        *seen + 1
                    } else {
                        usize::from(byte == HTTP_END[0])
                    };
                    if *seen == HTTP_END.len() {
                        // At a frame's start: no payload left.
                        self.state = State::Payload(0);
                    }
                }
            }
        }
    }
}

/// How long a header is, as far as its first `got.len()` bytes tell: 2
/// until the second byte is known.
fn header_len(got: &[u8]) -> usize {
    let Some(&second) = got.get(1) else {
        return 2;
    };
    let length = match second & 0x7F {
        126 => 2,
        127 => 8,
        _ => 0,
    };
    let mask = if second & 0x80 != 0 { 4 } else { 0 };
    2 + length + mask
}

/// A whole header's payload length, and whether a fragmented message is
/// open after it, given whether one was before.
fn frame(header: &[u8], open: bool) -> (u64, bool) {
    let fin = header[0] & 0x80 != 0;
    let opcode = header[0] & 0x0F;
    let length = match header[1] & 0x7F {
        126 => u64::from(u16::from_be_bytes([header[2], header[3]])),
        127 => u64::from_be_bytes(header[2..10].try_into().expect("8 length bytes")),
        short => u64::from(short),
    };
    let open = match opcode {
        // A continuation: the last one closes the message.
        0 => open && !fin,
        // Text or binary: a message that is not whole in this frame.
        1 | 2 => !fin,
        // Control frames come between fragments and change nothing.
        _ => open,
    };
    (length, open)
}

#[cfg(test)]
mod tests {
    use super::*;

    use proptest::prelude::*;
    use tokio_tungstenite::tungstenite::protocol::frame::FrameHeader;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::{Control, Data, OpCode};

    const ANSWER: &[u8] = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n";

    fn frame_bytes(opcode: OpCode, fin: bool, payload: &[u8], masked: bool) -> Vec<u8> {
        let header = FrameHeader {
            is_final: fin,
            opcode,
            mask: masked.then_some([1, 2, 3, 4]),
            ..FrameHeader::default()
        };
        let mut bytes = Vec::new();
        header
            .format(payload.len() as u64, &mut bytes)
            .expect("formats");
        bytes.extend_from_slice(payload);
        bytes
    }

    fn binary(fin: bool, size: usize) -> Vec<u8> {
        frame_bytes(OpCode::Data(Data::Binary), fin, &vec![b'x'; size], false)
    }

    fn more(fin: bool, size: usize) -> Vec<u8> {
        frame_bytes(OpCode::Data(Data::Continue), fin, &vec![b'y'; size], false)
    }

    fn ping() -> Vec<u8> {
        frame_bytes(OpCode::Control(Control::Ping), true, b"p", false)
    }

    /// Whether a message is open after `frames`, read whole.
    fn open_after(frames: &[Vec<u8>]) -> bool {
        let mut edges = MessageEdges::default();
        edges.read(ANSWER);
        for frame in frames {
            edges.read(frame);
        }
        edges.inside_message()
    }

    #[test]
    fn a_fragmented_message_is_open_until_its_last_fragment() {
        assert!(!open_after(&[]));
        assert!(!open_after(&[binary(true, 10)]));
        assert!(open_after(&[binary(false, 10)]));
        assert!(open_after(&[binary(false, 10), more(false, 200)]));
        assert!(open_after(&[
            binary(false, 10),
            ping(),
            more(false, 70_000)
        ]));
        assert!(!open_after(&[
            binary(false, 10),
            more(false, 5),
            more(true, 0)
        ]));
        assert!(!open_after(&[
            binary(false, 1),
            more(true, 1),
            binary(true, 3)
        ]));
        assert!(open_after(&[binary(true, 1), binary(false, 100_000)]));
    }

    #[test]
    fn the_http_answer_is_skipped_however_it_is_cut() {
        for (fin, open) in [(false, true), (true, false)] {
            let mut bytes = ANSWER.to_vec();
            bytes.extend(binary(fin, 3));
            for cut in 0..=bytes.len() {
                let mut edges = MessageEdges::default();
                edges.read(&bytes[..cut]);
                edges.read(&bytes[cut..]);
                assert_eq!(edges.inside_message(), open, "cut at {cut}");
            }
        }
        // A `\r\n\r` that is not followed by `\n` does not end it.
        let mut edges = MessageEdges::default();
        edges.read(b"HTTP/1.1 101 OK\r\nX: a\r\n\rb\r\n\r\n");
        edges.read(&binary(false, 3));
        assert!(edges.inside_message());
    }

    proptest! {
        /// However the bytes are cut into reads, and whether the frames
        /// are masked, the answer is the one a whole read gives.
        #[test]
        fn the_reads_do_not_matter(
            frames in prop::collection::vec(
                (0..4u8, any::<bool>(), prop_oneof![0..130usize, 65_530..65_540usize], any::<bool>()),
                0..12,
            ),
            cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..20),
        ) {
            let mut open = false;
            let mut bytes = ANSWER.to_vec();
            for (kind, fin, size, masked) in frames {
                let (opcode, size) = match kind {
                    0 => (OpCode::Data(Data::Binary), size),
                    1 => (OpCode::Data(Data::Continue), size),
                    2 => (OpCode::Data(Data::Text), size),
                    _ => (OpCode::Control(Control::Pong), size.min(125)),
                };
                // Only sequences a reader would take: a continuation only
                // inside a message, a new message only outside one,
                // control frames whole.
                let fin = fin || matches!(opcode, OpCode::Control(_));
                match opcode {
                    OpCode::Data(Data::Continue) if !open => continue,
                    OpCode::Data(Data::Binary | Data::Text) if open => continue,
                    OpCode::Data(_) => open = !fin,
                    OpCode::Control(_) => {}
                }
                bytes.extend(frame_bytes(opcode, fin, &vec![b'z'; size], masked));
            }
            let mut points: Vec<usize> = cuts.iter().map(|cut| cut.index(bytes.len() + 1)).collect();
            points.push(0);
            points.push(bytes.len());
            points.sort_unstable();
            let mut edges = MessageEdges::default();
            for pair in points.windows(2) {
                edges.read(&bytes[pair[0]..pair[1]]);
            }
            prop_assert_eq!(edges.inside_message(), open);
        }
    }
}
