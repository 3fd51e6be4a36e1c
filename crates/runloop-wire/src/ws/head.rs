//! The head of a WebSocket frame (RFC 6455, section 5.2), read and
//! written: what every frame this project writes or reads by hand begins
//! with.
//!
//! ```text
//!  byte 0            byte 1           then
//! |FIN|RSV1-3|opcode|MASK|length 7|   16-bit length (7 = 126) or 64-bit (127), big-endian;
//!                                     4 mask bytes if MASK
//! ```
//!
//! Reading takes a head as it is — reserved bits, a mask, an unknown opcode,
//! a length not written in the fewest bytes — and says what it holds, so a
//! reader decides what to refuse (as the WebSocket library would). Writing
//! writes the length in the fewest bytes, as RFC 6455 asks of a sender.

/// The longest head: 2 bytes, an 8-byte length and a 4-byte mask.
pub const MAX_HEAD: usize = 14;

/// The opcodes RFC 6455 defines (section 5.2); the others are reserved.
pub mod opcode {
    /// A fragment of the message under way.
    pub const CONTINUATION: u8 = 0x0;
    /// A text message (or its first fragment).
    pub const TEXT: u8 = 0x1;
    /// A binary message (or its first fragment).
    pub const BINARY: u8 = 0x2;
    /// The close.
    pub const CLOSE: u8 = 0x8;
    /// A ping.
    pub const PING: u8 = 0x9;
    /// A pong.
    pub const PONG: u8 = 0xA;
}

/// A frame's head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    /// The frame ends its message.
    pub fin: bool,
    /// RSV1, RSV2 and RSV3 as the three low bits (RSV1 highest): no
    /// extension is used here, so anything but 0 is refused.
    pub reserved: u8,
    /// The opcode, 0 to 15 ([`opcode`]).
    pub opcode: u8,
    /// The masking key, on a frame from a client.
    pub mask: Option<[u8; 4]>,
    /// The payload's length.
    pub length: u64,
}

impl Head {
    /// The head of an unmasked data frame of `length` bytes: a Binary frame
    /// when it `opens` a message, else a Continuation frame; `fin` when it
    /// ends the message.
    pub fn data(opens: bool, fin: bool, length: u64) -> Head {
        Head {
            fin,
            reserved: 0,
            opcode: if opens {
                opcode::BINARY
            } else {
                opcode::CONTINUATION
            },
            mask: None,
            length,
        }
    }

    /// How long the head at the start of `bytes` is, as far as they tell:
    /// 2 until its second byte is there.
    pub fn needed(bytes: &[u8]) -> usize {
        let Some(&second) = bytes.get(1) else {
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

    /// The head at the start of `bytes`, if all of it is there, and how
    /// many bytes it took (a length may be written in more bytes than it
    /// needs).
    pub fn parse(bytes: &[u8]) -> Option<(Head, usize)> {
        let taken = Head::needed(bytes);
        let head = bytes.get(..taken)?;
        let (first, second) = (head[0], head[1]);
        let (length, rest) = match second & 0x7F {
            126 => (
                u64::from(u16::from_be_bytes([head[2], head[3]])),
                &head[4..],
            ),
            127 => {
                let mut long = [0; 8];
                long.copy_from_slice(&head[2..10]);
                (u64::from_be_bytes(long), &head[10..])
            }
            short => (u64::from(short), &head[2..]),
        };
        let mask = (second & 0x80 != 0).then(|| [rest[0], rest[1], rest[2], rest[3]]);
        let head = Head {
            fin: first & 0x80 != 0,
            reserved: (first >> 4) & 0x7,
            opcode: first & 0x0F,
            mask,
            length,
        };
        Some((head, taken))
    }

    /// The head's own length, written.
    pub fn head_len(&self) -> usize {
        let length = match self.length {
            0..=125 => 0,
            126..=0xFFFF => 2,
            _ => 8,
        };
        2 + length + if self.mask.is_some() { 4 } else { 0 }
    }

    /// Writes the head into `out`, its length in the fewest bytes; says how
    /// many bytes it took.
    pub fn write(&self, out: &mut [u8; MAX_HEAD]) -> usize {
        out[0] = u8::from(self.fin) << 7 | (self.reserved & 0x7) << 4 | (self.opcode & 0x0F);
        let masked = if self.mask.is_some() { 0x80 } else { 0 };
        let mut at = match self.length {
            short @ 0..=125 => {
                out[1] = masked | short as u8;
                2
            }
            126..=0xFFFF => {
                out[1] = masked | 126;
                out[2..4].copy_from_slice(&(self.length as u16).to_be_bytes());
                4
            }
            _ => {
                out[1] = masked | 127;
                out[2..10].copy_from_slice(&self.length.to_be_bytes());
                10
            }
        };
        if let Some(mask) = self.mask {
            out[at..at + 4].copy_from_slice(&mask);
            at += 4;
        }
        at
    }

    /// A control frame: a close, a ping, a pong (or a reserved control
    /// opcode).
    pub fn is_control(&self) -> bool {
        self.opcode & 0x8 != 0
    }

    /// No reserved bit and no mask: a frame a client takes from a server
    /// as it is.
    pub fn is_plain(&self) -> bool {
        self.reserved == 0 && self.mask.is_none()
    }

    /// An opcode RFC 6455 defines.
    pub fn is_known(&self) -> bool {
        matches!(self.opcode, 0x0..=0x2 | 0x8..=0xA)
    }
}

#[cfg(test)]
mod tests {
    use tokio_tungstenite::tungstenite::protocol::frame::FrameHeader;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};

    use super::*;

    #[test]
    fn data_heads_are_the_websockets_own() {
        for length in [0, 1, 125, 126, 127, 65_535, 65_536, 1 << 24, u64::MAX >> 1] {
            for (opens, fin) in [(true, true), (true, false), (false, false), (false, true)] {
                let head = Head::data(opens, fin, length);
                let mut ours = [0; MAX_HEAD];
                let len = head.write(&mut ours);
                assert_eq!(len, head.head_len());
                let opcode = if opens { Data::Binary } else { Data::Continue };
                let theirs = FrameHeader {
                    is_final: fin,
                    opcode: OpCode::Data(opcode),
                    ..FrameHeader::default()
                };
                let mut written = Vec::new();
                theirs.format(length, &mut written).expect("formats");
                assert_eq!(&ours[..len], &written[..], "{length} {opens} {fin}");
                assert_eq!(Head::parse(&ours[..len]), Some((head, len)));
                assert_eq!(Head::needed(&ours[..len]), len);
            }
        }
    }

    #[test]
    fn a_head_is_read_as_it_is_and_only_when_whole() {
        // FIN, RSV1, RSV3, a reserved opcode; masked; a 16-bit length that
        // would have fit in 7.
        let bytes = [0xD3, 0xFE, 0x00, 0x05, 1, 2, 3, 4];
        let (head, taken) = Head::parse(&bytes).expect("whole");
        assert_eq!(taken, bytes.len());
        assert_eq!(
            head,
            Head {
                fin: true,
                reserved: 0b101,
                opcode: 0x3,
                mask: Some([1, 2, 3, 4]),
                length: 5,
            }
        );
        assert!(!head.is_plain() && !head.is_known() && !head.is_control());
        for cut in 0..bytes.len() {
            assert_eq!(Head::parse(&bytes[..cut]), None, "cut at {cut}");
            assert!(Head::needed(&bytes[..cut]) > cut || cut < 2);
        }
        assert_eq!(Head::needed(&[]), 2);
        assert_eq!(Head::needed(&[0x82]), 2);
        assert_eq!(Head::needed(&[0x82, 127]), 10);
        assert_eq!(Head::needed(&[0x82, 0xFF]), 14);
        // The written head of what was read is in the fewest bytes.
        let mut out = [0; MAX_HEAD];
        assert_eq!(head.write(&mut out), 6);
        assert_eq!(&out[..6], [0xD3, 0x85, 1, 2, 3, 4]);
        let huge = Head::parse(&[0x82, 127, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF]);
        assert_eq!(
            huge.map(|(h, taken)| (h.length, taken)),
            Some((u64::MAX, 10))
        );
    }
}
