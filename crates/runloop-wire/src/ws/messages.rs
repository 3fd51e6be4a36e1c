//! The message reader: a client's WebSocket read frame by frame where its
//! bytes lie, the binary messages taken, everything else handed on to the
//! WebSocket library that shares the socket.
//!
//! Through the library, every byte would be copied from the socket's read
//! buffer into the library's, parsed there, and its buffer zeroed again
//! before each read. [`MessageReader`] reads the frames in the buffer the
//! socket was read into: a binary message whole in one frame is split off
//! that buffer as it is (no copy), a fragmented one is put together;
//! anything else — pings, pongs, the close, text, and whatever the library
//! must refuse (a masked frame, reserved bits, an unknown opcode, a frame
//! over the size limit) — goes to the library as its bytes, which answers
//! pings, finishes the close handshake and names the faults as before
//! (the sharing rules are [`super`]'s).
//!
//! Messages and handed-on frames keep their order as long as the reader's
//! owner hands nothing on while a message it took is still waiting.
//!
//! A peer may close between the fragments of a message; the message is
//! then lost, and such a close is not a clean end:
//! [`MessageReader::inside_message`] says whether one is open.
//!
//! Before its frames, a client's socket carries the HTTP answer to its
//! handshake; it goes to the library, and not a byte past its end, so that
//! the frames after it are read here from the first.

use bytes::{Buf, Bytes, BytesMut};

use super::head::{Head, opcode};

/// What comes next in the buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// A whole binary message, taken from the buffer.
    Message(Bytes),
    /// The next this many bytes are the library's: hand them on (they may
    /// not all be in the buffer yet).
    HandOn(u64),
    /// The buffer must hold at least this many bytes before the next step.
    NeedMore(usize),
    /// The frames break the protocol in a way the library would not see,
    /// since it does not see the binary messages: why.
    Fault(&'static str),
}

/// Where a client's reader stands (see the module's docs).
#[derive(Debug)]
pub struct MessageReader {
    /// How much of the `\r\n\r\n` ending the HTTP answer is seen; `None`
    /// once it has ended.
    http: Option<usize>,
    /// A binary message whose last fragment has not come, as far as it
    /// has come.
    fragments: Option<BytesMut>,
    /// Whether a text message (the library's) has a fragment to come.
    text_open: bool,
    /// The largest message and frame, in bytes.
    max_message: usize,
    /// Whether binary messages are dropped rather than kept (the socket
    /// is closing: nothing is read any more).
    dropping: bool,
}

/// The end of the HTTP answer.
const HTTP_END: &[u8] = b"\r\n\r\n";

impl MessageReader {
    /// A reader from the HTTP answer on; no message or frame may exceed
    /// `max_message` bytes.
    pub fn new(max_message: usize) -> Self {
        MessageReader {
            http: Some(0),
            fragments: None,
            text_open: false,
            max_message,
            dropping: false,
        }
    }

    /// A reader of frames only: the handshake is over.
    pub fn after_handshake(max_message: usize) -> Self {
        MessageReader {
            http: None,
            ..MessageReader::new(max_message)
        }
    }

    /// Whether a fragmented message has begun and not ended: a close read
    /// now came inside it.
    pub fn inside_message(&self) -> bool {
        self.fragments.is_some() || self.text_open
    }

    /// From now on binary messages are dropped, as is any message being
    /// put together: the socket is closing.
    pub fn drop_messages(&mut self) {
        self.dropping = true;
        self.fragments = None;
    }

    /// The next step for the bytes at the start of `buffer`. A message is
    /// taken from it; bytes to hand on are left in it. Never returns a
    /// message while dropping them.
    pub fn step(&mut self, buffer: &mut BytesMut) -> Step {
        loop {
            if let Some(seen) = &mut self.http {
                return match http_end(seen, buffer) {
                    Some(through) => {
                        self.http = None;
                        Step::HandOn(through as u64)
                    }
                    None if buffer.is_empty() => Step::NeedMore(1),
                    None => Step::HandOn(buffer.len() as u64),
                };
            }
            let Some((head, taken)) = Head::parse(buffer) else {
                return Step::NeedMore(Head::needed(buffer));
            };
            let whole = (taken as u64).saturating_add(head.length);
            let ours = match head.opcode {
                opcode::BINARY | opcode::CONTINUATION if !head.is_plain() => false,
                opcode::BINARY if self.fragments.is_some() => {
                    return Step::Fault("a new binary message began inside a fragmented one");
                }
                opcode::BINARY if self.text_open => {
                    return Step::Fault("a binary message began inside a fragmented text one");
                }
                opcode::BINARY => true,
                opcode::CONTINUATION => self.fragments.is_some(),
                opcode::TEXT if self.fragments.is_some() => {
                    return Step::Fault("a text message began inside a fragmented binary one");
                }
                opcode::TEXT => {
                    if head.is_plain() {
                        self.text_open = !head.fin;
                    }
                    false
                }
                _ => false,
            };
            if !ours {
                if head.opcode == opcode::CONTINUATION && self.text_open && head.is_plain() {
                    self.text_open = !head.fin;
                }
                return Step::HandOn(whole);
            }
            let sofar = self.fragments.as_ref().map_or(0, BytesMut::len) as u64;
            if head.length > self.max_message as u64 - sofar.min(self.max_message as u64) {
                if sofar == 0 {
                    // The library refuses it, with its own words.
                    return Step::HandOn(whole);
                }
                return Step::Fault("a message in fragments is over the message limit");
            }
            let whole = whole as usize;
            if buffer.len() < whole {
                return Step::NeedMore(whole);
            }
            buffer.advance(taken);
            let payload = buffer.split_to(whole - taken);
            let message = match (head.fin, self.fragments.take()) {
                (true, None) => payload,
                (false, None) => {
                    self.fragments = Some(payload);
                    continue;
                }
                (fin, Some(mut sofar)) => {
                    sofar.extend_from_slice(&payload);
                    if !fin {
                        self.fragments = Some(sofar);
                        continue;
                    }
                    sofar
                }
            };
            if self.dropping {
                continue;
            }
            return Step::Message(message.freeze());
        }
    }
}

/// Scans `buffer` for the end of the HTTP answer, `seen` bytes of which
/// came before it: how far into it the answer ends, if it does.
fn http_end(seen: &mut usize, buffer: &[u8]) -> Option<usize> {
    for (at, &byte) in buffer.iter().enumerate() {
        *seen = if byte == HTTP_END[*seen] {
            *seen + 1
        } else {
            usize::from(byte == HTTP_END[0])
        };
        if *seen == HTTP_END.len() {
            return Some(at + 1);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::tests::{binary, frame_bytes, more, ping};
    use super::*;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};

    const LIMIT: usize = 200_000;

    const ANSWER: &[u8] = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n";

    /// Every step for `bytes` read whole, the answer already skipped.
    fn steps(bytes: &[u8]) -> (Vec<Step>, MessageReader) {
        let mut frames = MessageReader::after_handshake(LIMIT);
        let mut buffer = BytesMut::from(bytes);
        let mut steps = Vec::new();
        loop {
            let step = frames.step(&mut buffer);
            match &step {
                Step::HandOn(n) => buffer.advance((*n as usize).min(buffer.len())),
                Step::NeedMore(_) | Step::Fault(_) => {
                    steps.push(step);
                    return (steps, frames);
                }
                Step::Message(_) => {}
            }
            steps.push(step);
        }
    }

    #[test]
    fn a_whole_message_is_taken_where_it_lies_and_others_are_handed_on() {
        let mut bytes = binary(true, b"[0]chunk");
        bytes.extend(ping());
        bytes.extend(binary(true, b""));
        let (steps, _) = steps(&bytes);
        assert_eq!(
            steps,
            [
                Step::Message(Bytes::from_static(b"[0]chunk")),
                Step::HandOn(3),
                Step::Message(Bytes::new()),
                Step::NeedMore(2),
            ]
        );
        // Not copied: the message is a slice of the buffer read.
        let mut buffer = BytesMut::from(&binary(true, b"abc")[..]);
        let start = buffer.as_ptr() as usize;
        let mut frames = MessageReader::after_handshake(LIMIT);
        let Step::Message(message) = frames.step(&mut buffer) else {
            panic!("a message")
        };
        assert_eq!(message.as_ptr() as usize, start + 2);
    }

    #[test]
    fn a_fragmented_message_is_put_together_and_open_until_its_last_fragment() {
        let mut bytes = binary(false, b"ab");
        bytes.extend(ping());
        bytes.extend(more(false, b"cd"));
        let (got, frames) = steps(&bytes);
        assert_eq!(got, [Step::HandOn(3), Step::NeedMore(2)]);
        assert!(frames.inside_message());
        bytes.extend(more(true, b"e"));
        let (got, frames) = steps(&bytes);
        assert_eq!(
            got,
            [
                Step::HandOn(3),
                Step::Message(Bytes::from_static(b"abcde")),
                Step::NeedMore(2)
            ]
        );
        assert!(!frames.inside_message());
        // A fragmented text message is the WebSocket's, and open too.
        let text = frame_bytes(OpCode::Data(Data::Text), false, b"t", false);
        let (got, frames) = steps(&text);
        assert_eq!(got, [Step::HandOn(3), Step::NeedMore(2)]);
        assert!(frames.inside_message());
    }

    #[test]
    fn what_the_websocket_must_refuse_is_handed_on_and_what_it_cannot_see_is_a_fault() {
        let masked = frame_bytes(OpCode::Data(Data::Binary), true, b"m", true);
        assert_eq!(steps(&masked).0[0], Step::HandOn(7));
        let mut reserved = binary(true, b"r");
        reserved[0] |= 0x40;
        assert_eq!(steps(&reserved).0[0], Step::HandOn(3));
        let stray = more(true, b"s");
        assert_eq!(steps(&stray).0[0], Step::HandOn(3), "nothing to continue");
        let large = binary(true, &vec![0; LIMIT + 1]);
        assert_eq!(steps(&large[..20]).0[0], Step::HandOn(large.len() as u64));
        let mut inside = binary(false, b"a");
        inside.extend(binary(true, b"b"));
        assert!(matches!(steps(&inside).0[..], [Step::Fault(_)]));
        let mut over = binary(false, &vec![0; LIMIT]);
        over.extend(more(true, b"x"));
        assert!(matches!(steps(&over).0[..], [Step::Fault(_)]));
        // A length no buffer can hold does not overflow.
        let huge = [0x82, 127, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF];
        assert_eq!(steps(&huge).0[0], Step::HandOn(u64::MAX));
    }

    #[test]
    fn the_http_answer_is_handed_on_up_to_its_end_however_it_is_cut() {
        let mut bytes = ANSWER.to_vec();
        bytes.extend(binary(true, b"x"));
        for cut in 0..=ANSWER.len() {
            let mut frames = MessageReader::new(LIMIT);
            let mut handed = 0;
            let mut buffer = BytesMut::from(&bytes[..cut]);
            while let Step::HandOn(n) = frames.step(&mut buffer) {
                handed += n as usize;
                buffer.advance(n as usize);
            }
            buffer.extend_from_slice(&bytes[cut..]);
            while let Step::HandOn(n) = frames.step(&mut buffer) {
                handed += n as usize;
                buffer.advance(n as usize);
            }
            assert_eq!(handed, ANSWER.len(), "cut at {cut}");
        }
    }

    proptest! {
        /// Whatever bytes come, from the HTTP answer on or from the
        /// frames, every step goes forward or waits for more than the
        /// buffer holds, no message is over the limit, and nothing
        /// panics.
        #[test]
        fn any_bytes_are_read_forward_and_within_the_limit(
            bytes in prop::collection::vec(any::<u8>(), 0..600),
            answered in any::<bool>(),
            max in 0..300usize,
        ) {
            let mut frames = if answered {
                MessageReader::after_handshake(max)
            } else {
                MessageReader::new(max)
            };
            let mut buffer = BytesMut::from(&bytes[..]);
            loop {
                let before = buffer.len();
                match frames.step(&mut buffer) {
                    Step::Message(message) => {
                        prop_assert!(message.len() <= max);
                        prop_assert!(buffer.len() < before, "a message takes its bytes");
                    }
                    Step::HandOn(n) => {
                        prop_assert!(n > 0, "handing on nothing");
                        buffer.advance((n as usize).min(buffer.len()));
                    }
                    Step::NeedMore(n) => {
                        prop_assert!(n > buffer.len(), "more than is there");
                        break;
                    }
                    Step::Fault(_) => break,
                }
            }
        }
    }
}
