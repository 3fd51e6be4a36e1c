//! A proxy's `/agent/run` path, frame by frame: the binary messages the
//! relay takes itself, and the frames the WebSocket library still reads.
//!
//! Through the library, every byte of a path would be copied from the
//! socket's read buffer into the library's, parsed there, and its buffer
//! zeroed again before each read. [`PathFrames`] reads the frames where
//! they lie, in the buffer the socket was read into: a binary message
//! whole in one frame is split off that buffer as it is (no copy), a
//! fragmented one is put together; anything else — pings, pongs, the
//! close, text, and whatever the library must refuse (a masked frame,
//! reserved bits, an unknown opcode, a frame over the size limit) — goes
//! to the library as its bytes, which answers pings, finishes the close
//! handshake and names the faults as before.
//!
//! Messages and handed-on frames keep their order: the reader hands on
//! nothing while a message it took is still waiting for the relay.
//!
//! A proxy may close the path between the fragments of a message (this
//! project's proxy sends a chunk over 64 KiB in fragments); the message is
//! then lost, and such a close is not a clean end (protocol §10, §12):
//! [`PathFrames::inside_message`] says whether one is open.
//!
//! Before its frames, a path carries the HTTP answer to its handshake; it
//! goes to the library, and not a byte past its end, so that the frames
//! after it are read here from the first.

use bytes::{Buf, Bytes, BytesMut};

/// What comes next in a path's buffer.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step {
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

/// Where a path's reader stands (see the module's docs).
#[derive(Debug)]
pub(crate) struct PathFrames {
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
    /// Whether binary messages are dropped rather than kept (the path is
    /// closing: nothing is relayed any more).
    dropping: bool,
}

/// The end of the HTTP answer.
const HTTP_END: &[u8] = b"\r\n\r\n";

const CONTINUATION: u8 = 0x0;
const TEXT: u8 = 0x1;
const BINARY: u8 = 0x2;

impl PathFrames {
    /// A path's reader, from the HTTP answer on; no message or frame may
    /// exceed `max_message` bytes.
    pub(crate) fn new(max_message: usize) -> Self {
        PathFrames {
            http: Some(0),
            fragments: None,
            text_open: false,
            max_message,
            dropping: false,
        }
    }

    /// Whether a fragmented message has begun and not ended: a close read
    /// now came inside it.
    pub(crate) fn inside_message(&self) -> bool {
        self.fragments.is_some() || self.text_open
    }

    /// From now on binary messages are dropped, as is any message being
    /// put together: the path is closing.
    pub(crate) fn drop_messages(&mut self) {
        self.dropping = true;
        self.fragments = None;
    }

    /// The next step for the bytes at the start of `buffer`. A message is
    /// taken from it; bytes to hand on are left in it. Never returns a
    /// message while dropping them.
    pub(crate) fn step(&mut self, buffer: &mut BytesMut) -> Step {
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
            let Some(header) = Header::parse(buffer) else {
                return Step::NeedMore(header_len(buffer));
            };
            let whole = (header.len as u64).saturating_add(header.length);
            let ours = match header.opcode {
                BINARY | CONTINUATION if !header.plain() => false,
                BINARY if self.fragments.is_some() => {
                    return Step::Fault("a new binary message began inside a fragmented one");
                }
                BINARY if self.text_open => {
                    return Step::Fault("a binary message began inside a fragmented text one");
                }
                BINARY => true,
                CONTINUATION => self.fragments.is_some(),
                TEXT if self.fragments.is_some() => {
                    return Step::Fault("a text message began inside a fragmented binary one");
                }
                TEXT => {
                    if header.plain() {
                        self.text_open = !header.fin;
                    }
                    false
                }
                _ => false,
            };
            if !ours {
                if header.opcode == CONTINUATION && self.text_open && header.plain() {
                    self.text_open = !header.fin;
                }
                return Step::HandOn(whole);
            }
            let sofar = self.fragments.as_ref().map_or(0, BytesMut::len) as u64;
            if header.length > self.max_message as u64 - sofar.min(self.max_message as u64) {
                if sofar == 0 {
                    // The library refuses it, with its own words.
                    return Step::HandOn(whole);
                }
                return Step::Fault("a fragmented binary message is over the size limit");
            }
            let whole = whole as usize;
            if buffer.len() < whole {
                return Step::NeedMore(whole);
            }
            buffer.advance(header.len);
            let payload = buffer.split_to(whole - header.len);
            let message = match (header.fin, self.fragments.take()) {
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

/// A frame's header.
#[derive(Debug)]
struct Header {
    fin: bool,
    /// The reserved bits and the mask bit: a frame from a server has none.
    odd: bool,
    opcode: u8,
    /// The header's own length.
    len: usize,
    /// The payload's.
    length: u64,
}

impl Header {
    /// The header at the start of `bytes`, if all of it is there.
    fn parse(bytes: &[u8]) -> Option<Header> {
        let len = header_len(bytes);
        if bytes.len() < len {
            return None;
        }
        let (first, second) = (bytes[0], bytes[1]);
        let length = match second & 0x7F {
            126 => u64::from(u16::from_be_bytes([bytes[2], bytes[3]])),
            127 => u64::from_be_bytes(bytes[2..10].try_into().ok()?),
            short => u64::from(short),
        };
        Some(Header {
            fin: first & 0x80 != 0,
            odd: first & 0x70 != 0 || second & 0x80 != 0,
            opcode: first & 0x0F,
            len,
            length,
        })
    }

    /// A frame the library would take as it is: no reserved bit, no mask.
    fn plain(&self) -> bool {
        !self.odd
    }
}

/// How long a header is, as far as its first bytes tell: 2 until the
/// second byte is known.
fn header_len(bytes: &[u8]) -> usize {
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

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::io;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use proptest::prelude::*;
    use tokio::io::{AsyncRead, AsyncReadExt, ReadBuf};
    use tokio_tungstenite::WebSocketStream;
    use tokio_tungstenite::tungstenite::protocol::frame::FrameHeader;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::{Control, Data, OpCode};
    use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};

    use super::*;
    use crate::read_ahead::{Budget, ReadAhead};
    use crate::relay::{Next, next_message};

    const ANSWER: &[u8] = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n";

    const LIMIT: usize = 200_000;

    fn frame_bytes(opcode: OpCode, fin: bool, payload: &[u8], masked: bool) -> Vec<u8> {
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

    fn binary(fin: bool, payload: &[u8]) -> Vec<u8> {
        frame_bytes(OpCode::Data(Data::Binary), fin, payload, false)
    }

    fn more(fin: bool, payload: &[u8]) -> Vec<u8> {
        frame_bytes(OpCode::Data(Data::Continue), fin, payload, false)
    }

    fn ping() -> Vec<u8> {
        frame_bytes(OpCode::Control(Control::Ping), true, b"p", false)
    }

    /// Every step for `bytes` read whole, the answer already skipped.
    fn steps(bytes: &[u8]) -> (Vec<Step>, PathFrames) {
        let mut frames = PathFrames::new(LIMIT);
        frames.http = None;
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
        let mut frames = PathFrames::new(LIMIT);
        frames.http = None;
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
            let mut frames = PathFrames::new(LIMIT);
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

    /// A socket that gives its bytes in the pieces it was made of, and
    /// keeps what is written to it.
    struct Pieces(VecDeque<Vec<u8>>, Vec<u8>);

    impl AsyncRead for Pieces {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            if let Some(piece) = self.0.front_mut() {
                let taken = piece.len().min(buf.remaining());
                buf.put_slice(&piece[..taken]);
                piece.drain(..taken);
                if piece.is_empty() {
                    self.0.pop_front();
                }
            }
            Poll::Ready(Ok(()))
        }
    }

    impl tokio::io::AsyncWrite for Pieces {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            b: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.1.extend_from_slice(b);
            Poll::Ready(Ok(b.len()))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// What the relay reads from a path whose socket gives `pieces`
    /// ([`next_message`]), up to the path's end; and how many messages it
    /// read before it had answered every ping that came before them.
    async fn relayed(pieces: Vec<Vec<u8>>, pings_before: &[usize]) -> (Vec<Next>, usize) {
        static BUDGET: Budget = Budget::new(1 << 20);
        let socket = Pieces(pieces.into(), Vec::new());
        let mut socket = ReadAhead::new(socket, &BUDGET, Some(PathFrames::new(LIMIT)));
        let mut answer = vec![0; ANSWER.len()];
        socket.read_exact(&mut answer).await.expect("the answer");
        assert_eq!(answer, ANSWER);
        let config = WebSocketConfig::default()
            .max_message_size(Some(LIMIT))
            .max_frame_size(Some(LIMIT));
        let mut path = WebSocketStream::from_raw_socket(socket, Role::Client, Some(config)).await;
        let mut seen = Vec::new();
        let mut late = 0;
        loop {
            let next = next_message(&mut path).await;
            if !matches!(next, Next::Message(_)) {
                seen.push(next);
                return (seen, late);
            }
            let pings = pings_before.get(seen.len()).copied().unwrap_or(0);
            if pongs(&path.get_ref().get_ref().1) < pings {
                late += 1;
            }
            seen.push(next);
        }
    }

    /// Each message the proxy sends is read as soon as it has come, in
    /// the two writes this project's proxy makes of it (header and tag,
    /// then the body), with nothing behind it: not when the next one
    /// comes.
    #[tokio::test]
    async fn a_message_is_read_when_it_comes_not_when_the_next_does() {
        use std::time::Duration;

        use tokio::io::AsyncWriteExt;
        use tokio::net::{TcpListener, TcpStream};

        static BUDGET: Budget = Budget::new(1 << 20);
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let (server, accepted) = tokio::join!(TcpStream::connect(address), listener.accept());
        let (mut proxy, _) = accepted.expect("accept");
        let mut socket = ReadAhead::new(
            server.expect("connect"),
            &BUDGET,
            Some(PathFrames::new(LIMIT)),
        );
        proxy.write_all(ANSWER).await.expect("write");
        let mut answer = vec![0; ANSWER.len()];
        socket.read_exact(&mut answer).await.expect("the answer");
        let mut path = WebSocketStream::from_raw_socket(socket, Role::Client, None).await;
        for (at, size) in [1usize, 80, 3000, 70_000, 5, 0, 200]
            .into_iter()
            .enumerate()
        {
            if at == 4 {
                proxy.write_all(&ping()).await.expect("write");
            }
            let payload: Vec<u8> = (0..size).map(|i| (i + at) as u8).collect();
            let frame = binary(true, &payload);
            let split = frame.len().min(4);
            proxy.write_all(&frame[..split]).await.expect("write");
            tokio::time::sleep(Duration::from_millis(5)).await;
            proxy.write_all(&frame[split..]).await.expect("write");
            let next = tokio::time::timeout(Duration::from_secs(10), next_message(&mut path))
                .await
                .unwrap_or_else(|_| panic!("message {at} ({size} bytes) came and was not read"));
            assert_eq!(next, Next::Message(payload.into()), "message {at}");
        }
    }

    /// A path says it is drained (the relay then sends what it has
    /// without looking for more) only once every message taken is given
    /// and its last read left the socket empty; not after a read that
    /// filled its room, which may have left more behind.
    #[tokio::test]
    async fn a_path_is_drained_only_when_its_last_read_emptied_the_socket() {
        use std::future::poll_fn;

        use tokio::io::AsyncWriteExt;

        static BUDGET: Budget = Budget::new(1 << 20);
        let (mut proxy, socket) = tokio::io::duplex(1 << 20);
        let mut path = ReadAhead::new(socket, &BUDGET, Some(PathFrames::new(LIMIT)));
        proxy.write_all(ANSWER).await.expect("write");
        let mut answer = vec![0; ANSWER.len()];
        path.read_exact(&mut answer).await.expect("the answer");
        async fn taken<S: AsyncRead + Unpin>(path: &mut ReadAhead<S>) {
            let ready = poll_fn(|cx| Poll::Ready(path.poll_messages(cx))).await;
            assert_eq!(ready, Poll::Ready(true), "a message waits");
        }

        proxy
            .write_all(&[binary(true, b"one"), binary(true, b"two")].concat())
            .await
            .expect("write");
        taken(&mut path).await;
        assert!(!path.drained(), "two messages wait");
        assert_eq!(path.message().as_deref(), Some(&b"one"[..]));
        assert!(!path.drained(), "one message waits");
        assert_eq!(path.message().as_deref(), Some(&b"two"[..]));
        assert!(path.drained(), "all the socket had is given");

        // Three messages of 2,004 bytes: a quiet path's first read (4 KiB)
        // holds two and fills its room.
        let payloads: Vec<Vec<u8>> = (0..3).map(|i| vec![i; 2000]).collect();
        let frames: Vec<u8> = payloads.iter().flat_map(|p| binary(true, p)).collect();
        proxy.write_all(&frames).await.expect("write");
        taken(&mut path).await;
        assert_eq!(path.message().as_deref(), Some(&payloads[0][..]));
        assert_eq!(path.message().as_deref(), Some(&payloads[1][..]));
        assert!(
            !path.drained(),
            "the read filled its room: more may be there"
        );
        taken(&mut path).await;
        assert_eq!(path.message().as_deref(), Some(&payloads[2][..]));
        assert!(path.drained());
    }

    /// How many pong frames `written` holds, whole frames one after the
    /// other.
    fn pongs(mut written: &[u8]) -> usize {
        let mut pongs = 0;
        while let Some(header) = Header::parse(written) {
            pongs += usize::from(header.opcode == 0xA);
            written = &written[header.len + header.length as usize..];
        }
        pongs
    }

    /// A frame of a generated sequence: its kind, whether it ends its
    /// message, its payload's size.
    fn sequence() -> impl Strategy<Value = Vec<(u8, bool, usize)>> {
        prop::collection::vec(
            (
                0..5u8,
                any::<bool>(),
                prop_oneof![0..130usize, 65_530..65_540usize, 70_000..70_010usize],
            ),
            0..14,
        )
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
            let mut frames = PathFrames::new(max);
            if answered {
                frames.http = None;
            }
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

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]

        /// However the socket's bytes are cut, the relay reads the binary
        /// messages the WebSocket alone would read, in order, and the end
        /// as it is: a clean close, or one inside a message; and it has
        /// answered every ping before the messages behind it.
        #[test]
        fn a_relayed_path_reads_what_the_websocket_alone_reads(
            frames in sequence(),
            cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..24),
        ) {
            let mut bytes = ANSWER.to_vec();
            // The binary messages, and how many pings came before each.
            let mut expected = Vec::new();
            let mut pings_before = Vec::new();
            let mut pings = 0;
            // The message being put together: binary (true) or text.
            let mut open: Option<(bool, Vec<u8>)> = None;
            for (at, (kind, fin, size)) in frames.into_iter().enumerate() {
                // ASCII, so that any of it may be text.
                let payload: Vec<u8> = (0..size).map(|i| ((i + at) % 90 + 32) as u8).collect();
                let mut ended = None;
                match (kind, &mut open) {
                    (0 | 1, None) => {
                        let opcode = if kind == 0 { Data::Binary } else { Data::Text };
                        bytes.extend(frame_bytes(OpCode::Data(opcode), fin, &payload, false));
                        if fin {
                            ended = Some((kind == 0, payload));
                        } else {
                            open = Some((kind == 0, payload));
                        }
                    }
                    // Within the size limit: past it the path fails, as
                    // the WebSocket alone would.
                    (2, Some((_, sofar))) if sofar.len() + size <= LIMIT => {
                        bytes.extend(more(fin, &payload));
                        sofar.extend_from_slice(&payload);
                        if fin {
                            ended = open.take();
                        }
                    }
                    (3, _) => {
                        let payload = &payload[..size.min(125)];
                        bytes.extend(frame_bytes(OpCode::Control(Control::Ping), true, payload, false));
                        pings += 1;
                    }
                    _ => {}
                }
                if let Some((true, message)) = ended {
                    expected.push(Next::Message(message.into()));
                    pings_before.push(pings);
                }
            }
            expected.push(if open.is_some() {
                Next::Broke(
                    "the proxy closed the path inside a message (after a fragment that was not \
                     its last)"
                        .to_owned(),
                )
            } else {
                Next::Closed
            });
            bytes.extend(frame_bytes(OpCode::Control(Control::Close), true, &[], false));
            let mut points: Vec<usize> = cuts.iter().map(|cut| cut.index(bytes.len() + 1)).collect();
            points.extend([0, bytes.len()]);
            points.sort_unstable();
            let pieces = points.windows(2).map(|w| bytes[w[0]..w[1]].to_vec()).filter(|p| !p.is_empty()).collect();
            let runtime = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
            let (seen, late) = runtime.block_on(relayed(pieces, &pings_before));
            prop_assert_eq!(seen, expected);
            prop_assert_eq!(late, 0, "a ping answered only after the messages behind it");
        }
    }
}
