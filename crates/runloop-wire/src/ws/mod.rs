//! The WebSocket frame layer, once: the frame head codec ([`Head`]) and the
//! message reader ([`MessageReader`]), sans-IO, for every place that reads
//! or writes RFC 6455 frames by hand — the server's write lane
//! ([`crate::lane`]), the server's reader of a proxy path (taking binary
//! messages where they lie), the proxy's writer of a path — and the rules
//! under which those places share a socket with tungstenite.
//!
//! Why by hand at all: on the relay's hot path, a frame through the library
//! is a copy into its buffer (and out of it, reading), a zeroed read buffer
//! per read, and one system call per message unless fed; by hand, a frame
//! is its head and its payload's own bytes. The library still owns
//! everything else: the handshake, pings and pongs, the close handshake,
//! and the words for every fault.
//!
//! # Sharing a socket with tungstenite
//!
//! Two assumptions are made about tungstenite (0.30) and nowhere else; each
//! has its own test below, which fails if a new version breaks it.
//!
//! 1. **It writes whole frames.** On a socket that takes every write whole,
//!    each write the WebSocket makes begins at a frame's first byte and
//!    ends at a frame's last (its write buffer is whole frames, written
//!    from its start), and after a flush it holds nothing unwritten. So
//!    frames of our own may go on the socket between its writes: the
//!    server's lane takes every write whole and puts it after the frames
//!    already there, and the proxy writes on the same lane.
//! 2. **It reads each frame on its own.** Reading, it carries nothing from
//!    one frame to the next but a message it is putting together from
//!    fragments (and the close once read), and its client handshake is
//!    done at the blank line that ends the HTTP answer. So binary messages
//!    may be taken out of the bytes it reads, at frame boundaries and
//!    outside any message it is putting together, and it reads what is
//!    left as it would have read it among them; and everything after the
//!    answer may be read by someone else first.

mod head;
mod messages;

pub use head::{Head, MAX_HEAD, opcode};
pub use messages::{MessageReader, Step};

#[cfg(test)]
pub(crate) mod tests {
    use std::io::{self, Cursor, Read, Write};

    use proptest::prelude::*;
    use tokio_tungstenite::tungstenite::protocol::frame::Frame;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::{Control, Data, OpCode};
    use tokio_tungstenite::tungstenite::protocol::{Role, WebSocket, WebSocketConfig};
    use tokio_tungstenite::tungstenite::{Error, Message};

    use super::*;

    /// A frame's bytes, as tungstenite's own header writes them.
    pub(crate) use runloop_testkit::websocket::{binary, frame as frame_bytes, more, ping};

    /// How `bytes` fall into whole frames: `None` if they end inside one.
    fn whole_frames(mut bytes: &[u8]) -> Option<usize> {
        let mut frames = 0;
        while !bytes.is_empty() {
            let (head, taken) = Head::parse(bytes)?;
            let end = taken.checked_add(usize::try_from(head.length).ok()?)?;
            bytes = bytes.get(end..)?;
            frames += 1;
        }
        Some(frames)
    }

    /// A socket that keeps each write apart, taking at most `at_most` bytes
    /// of it, and has nothing to read.
    struct Writes {
        at_most: usize,
        writes: Vec<Vec<u8>>,
    }

    impl Write for Writes {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let took = buf.len().min(self.at_most);
            self.writes.push(buf[..took].to_vec());
            Ok(took)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Read for Writes {
        fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
            Err(io::ErrorKind::WouldBlock.into())
        }
    }

    /// Everything a server's WebSocket sends in a connection's life, in
    /// sizes around its write buffer's.
    fn a_server_speaks(ws: &mut WebSocket<Writes>) {
        let config = WebSocketConfig::default();
        let large = vec![7; config.write_buffer_size + 3];
        for (at, message) in [
            Message::binary(&b"small"[..]),
            Message::Ping(b"p"[..].into()),
            Message::binary(large.clone()),
            Message::Text("text".into()),
            Message::Pong(b"q"[..].into()),
            Message::Frame(Frame::message(
                &b"frag"[..],
                OpCode::Data(Data::Binary),
                false,
            )),
            Message::Frame(Frame::message(
                &b"ment"[..],
                OpCode::Data(Data::Continue),
                true,
            )),
            Message::binary(large),
        ]
        .into_iter()
        .enumerate()
        {
            ws.write(message).expect("written");
            if at % 3 == 0 {
                ws.flush().expect("flushed");
            }
        }
        ws.flush().expect("flushed");
        ws.close(None).expect("closing");
        ws.flush().expect("flushed");
    }

    /// Assumption 1: on a socket that takes every write whole, every write
    /// is whole frames; on any socket, a flush leaves nothing unwritten.
    #[test]
    fn assumption_1_the_websocket_writes_whole_frames() {
        let whole = Writes {
            at_most: usize::MAX,
            writes: Vec::new(),
        };
        let mut ws = WebSocket::from_raw_socket(whole, Role::Server, None);
        a_server_speaks(&mut ws);
        let writes = &ws.get_ref().writes;
        assert!(writes.len() > 3, "{} writes", writes.len());
        for (at, write) in writes.iter().enumerate() {
            assert!(
                whole_frames(write).is_some(),
                "write {at} ends inside a frame"
            );
        }
        let all: Vec<u8> = writes.concat();
        assert_eq!(whole_frames(&all), Some(9), "eight frames, then the close");

        // A socket that takes a few bytes at a time: the flushes still
        // write everything, the same bytes.
        let trickle = Writes {
            at_most: 7,
            writes: Vec::new(),
        };
        let mut ws = WebSocket::from_raw_socket(trickle, Role::Server, None);
        a_server_speaks(&mut ws);
        assert_eq!(ws.get_ref().writes.concat(), all);
    }

    /// What a client's WebSocket reads from `bytes`: each message, and how
    /// the reading ended.
    fn read_all(bytes: Vec<u8>) -> (Vec<Message>, String) {
        let config = WebSocketConfig::default().max_message_size(Some(1 << 20));
        let mut ws =
            WebSocket::from_raw_socket(Rest(Cursor::new(bytes)), Role::Client, Some(config));
        let mut read = Vec::new();
        loop {
            match ws.read() {
                Ok(message) => read.push(message),
                Err(end) => return (read, end.to_string()),
            }
        }
    }

    /// Reads from its bytes, then would block; takes every write.
    struct Rest(Cursor<Vec<u8>>);

    impl Read for Rest {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            match self.0.read(buf)? {
                0 => Err(io::ErrorKind::WouldBlock.into()),
                n => Ok(n),
            }
        }
    }

    impl Write for Rest {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// One frame of a generated connection: text (whole or in two
    /// fragments), a binary message (whole or in fragments), a ping.
    fn frames() -> impl Strategy<Value = Vec<(u8, usize)>> {
        prop::collection::vec((0..5u8, 0..300usize), 0..12)
    }

    proptest! {
        /// Assumption 2: with every binary message taken out of the bytes
        /// (at frame boundaries, fragments and all), the WebSocket reads
        /// the rest as it reads them among the binary messages.
        #[test]
        fn assumption_2_binary_messages_may_be_taken_out_of_what_it_reads(frames in frames()) {
            let (mut all, mut rest) = (Vec::new(), Vec::new());
            for (at, (kind, size)) in frames.into_iter().enumerate() {
                let payload: Vec<u8> = (0..size).map(|i| ((i + at) % 90 + 32) as u8).collect();
                let (half, other) = payload.split_at(size / 2);
                let (theirs, ours): (Vec<u8>, Vec<u8>) = match kind {
                    0 => (frame_bytes(OpCode::Data(Data::Text), true, &payload, false), Vec::new()),
                    1 => {
                        let mut text = frame_bytes(OpCode::Data(Data::Text), false, half, false);
                        text.extend(frame_bytes(OpCode::Data(Data::Continue), true, other, false));
                        (text, Vec::new())
                    }
                    2 => (Vec::new(), binary(true, &payload)),
                    3 => {
                        let mut fragments = binary(false, half);
                        fragments.extend(more(false, &[]));
                        fragments.extend(more(true, other));
                        (Vec::new(), fragments)
                    }
                    _ => (frame_bytes(OpCode::Control(Control::Ping), true, &payload[..size.min(125)], false), Vec::new()),
                };
                all.extend_from_slice(&ours);
                all.extend_from_slice(&theirs);
                rest.extend_from_slice(&theirs);
            }
            let close = frame_bytes(OpCode::Control(Control::Close), true, &[], false);
            all.extend_from_slice(&close);
            rest.extend_from_slice(&close);
            let (read_all_of_it, end_all) = read_all(all);
            let (read_rest, end_rest) = read_all(rest);
            let without_binary: Vec<Message> = read_all_of_it
                .into_iter()
                .filter(|message| !message.is_binary())
                .collect();
            prop_assert_eq!(without_binary, read_rest);
            prop_assert_eq!(end_all, end_rest);
        }
    }

    /// Assumption 2, the handshake: a client's handshake is done once the
    /// answer's blank line is read, with nothing after it.
    #[test]
    fn assumption_2_the_client_handshake_ends_at_the_answers_blank_line() {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        use tokio_tungstenite::tungstenite::handshake::client::ClientHandshake;
        use tokio_tungstenite::tungstenite::handshake::derive_accept_key;

        let request = "ws://localhost/agent/run"
            .into_client_request()
            .expect("a request");
        let key = request.headers()["Sec-WebSocket-Key"]
            .to_str()
            .expect("a key")
            .to_owned();
        let answer = format!(
            "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
             Sec-WebSocket-Accept: {}\r\n\r\n",
            derive_accept_key(key.as_bytes())
        );
        let socket = Rest(Cursor::new(answer.into_bytes()));
        let handshake = ClientHandshake::start(socket, request, None)
            .expect("started")
            .handshake();
        let (ws, _) = match handshake {
            Ok(done) => done,
            Err(error) => panic!("the handshake wanted more than the answer: {error}"),
        };
        let mut ws = ws;
        assert!(
            matches!(ws.read(), Err(Error::Io(e)) if e.kind() == io::ErrorKind::WouldBlock),
            "nothing was read past the answer"
        );
    }
}
