//! The proxy's send rule: what the proxy may still say on an `/agent/run`
//! path, frame by frame, and how a path must end when something goes wrong
//! (protocol §10, §12 "abrupt proxy end").
//!
//! The proxy sends each event's data as one `[0]` message. A large event
//! goes out in WebSocket fragments as its pieces come: `[0]` and the first
//! piece in a Binary frame without FIN, the next pieces in Continuation
//! frames, the last with FIN. Once a message's first fragment is out,
//! nothing else may be said on the path until its last: an `[1]` error
//! would land inside the chunk, and a close reads as a finished loop. So a
//! fault there (the agent program's body breaks or ends, the proxy shuts
//! down, the server leaves, the socket fails) abandons the path, dropping
//! it with no close frame; the server then tells the caller the loop was
//! cut short. A frame handed to the socket and not yet written is the same:
//! half a frame cannot be followed by anything.
//!
//! ```text
//!            ──piece(Whole | Begin)──▶ Writing ──written──▶ Between (FIN)
//!   Between                               ▲   └──written──▶ Inside  (no FIN)
//!                        piece(More | End)│                    │
//!                                         └────────────────────┘
//!
//!   fault(error) / close():   Between ──▶ Close (the [1] error, if any, then the close)
//!                             Writing, Inside ──▶ Abandon (no [1], no close)
//! ```
//!
//! [`PathSend::fault`] and [`PathSend::close`] consume the machine, so a
//! path ends exactly once and nothing is sent after its end.

use super::response::CHUNK;
use crate::codec::Writer;
use crate::error_value::ErrorValue;

/// Which part of an event's data a piece is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PieceKind {
    /// All of a small event's data: a message in one frame.
    Whole,
    /// The first part of a large event's data: a message's first fragment.
    Begin,
    /// A middle part: a fragment that neither opens nor ends the message.
    More,
    /// The last part: the fragment that ends the message.
    End,
}

/// The WebSocket frame a piece goes out in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHead {
    /// The frame opens a message (a Binary frame); otherwise it continues
    /// one (a Continuation frame).
    pub opens: bool,
    /// The frame ends its message (FIN).
    pub fin: bool,
    /// What goes before the piece's data in the frame: the chunk tag `[0]`
    /// when the frame opens a message, nothing otherwise.
    pub tag: &'static [u8],
}

/// A piece that cannot come where it came; nothing was sent for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum OutOfOrder {
    /// A piece that opens a message came inside another.
    #[error("a piece that opens a message came inside another")]
    Opens,
    /// A piece that continues a message came between messages.
    #[error("a piece that continues a message came between messages")]
    Continues,
    /// A piece came before the frame of the one before it was written.
    #[error("a piece came before the frame before it was written")]
    Unwritten,
}

/// How the path ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathEnd {
    /// Drop the path with no close frame (nor anything else): the server
    /// reads an abrupt end.
    Abandon,
    /// Send `last`, an `[1]` error payload, if there is one, then close the
    /// path cleanly.
    Close {
        /// The error payload to send before the close.
        last: Option<Vec<u8>>,
    },
}

/// Where the path is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// No message is under way.
    Between,
    /// A frame was handed to the socket: `fin` says whether it ends its
    /// message, `bytes` counts the message's data with this frame's.
    Writing { fin: bool, bytes: u64 },
    /// A message's fragments are under way; `bytes` of its data are out.
    Inside { bytes: u64 },
}

/// Follows what the proxy has sent on one `/agent/run` path.
#[derive(Debug)]
#[must_use = "a path must end with fault() or close()"]
pub struct PathSend {
    state: State,
}

impl Default for PathSend {
    fn default() -> Self {
        Self::new()
    }
}

impl PathSend {
    /// A path on which the loop's first message is due.
    pub fn new() -> Self {
        PathSend {
            state: State::Between,
        }
    }

    /// A piece of `len` bytes of data is next: the frame it goes in, or why
    /// it cannot go (the machine is then as it was). Until
    /// [`written`](Self::written), the frame counts as half written.
    pub fn piece(&mut self, kind: PieceKind, len: usize) -> Result<FrameHead, OutOfOrder> {
        let len = len as u64;
        let (before, opens) = match (self.state, kind) {
            (State::Writing { .. }, _) => return Err(OutOfOrder::Unwritten),
            (State::Between, PieceKind::Whole | PieceKind::Begin) => (0, true),
            (State::Inside { bytes }, PieceKind::More | PieceKind::End) => (bytes, false),
            (State::Inside { .. }, _) => return Err(OutOfOrder::Opens),
            (State::Between, _) => return Err(OutOfOrder::Continues),
        };
        let fin = matches!(kind, PieceKind::Whole | PieceKind::End);
        self.state = State::Writing {
            fin,
            bytes: before.saturating_add(len),
        };
        let tag: &'static [u8] = if opens { &[CHUNK] } else { &[] };
        Ok(FrameHead { opens, fin, tag })
    }

    /// The frame of the last piece is written. When it ended its message,
    /// the message's data bytes, all fragments together; `None` when a
    /// fragment is under way (or no frame was).
    pub fn written(&mut self) -> Option<u64> {
        match self.state {
            State::Writing { fin: true, bytes } => {
                self.state = State::Between;
                Some(bytes)
            }
            State::Writing { fin: false, bytes } => {
                self.state = State::Inside { bytes };
                None
            }
            State::Between | State::Inside { .. } => None,
        }
    }

    /// Whether a message, or a frame, is under way: a fault now abandons
    /// the path.
    pub fn inside(&self) -> bool {
        self.state != State::Between
    }

    /// The loop cannot go on because of `error`: send it and close, or,
    /// inside a message, abandon the path.
    pub fn fault(self, error: &ErrorValue) -> PathEnd {
        self.ending(|out| error.write_tagged(out))
    }

    /// [`fault`](Self::fault) with the error's JSON passed on unread (the
    /// agent program's own error body).
    pub fn fault_json(self, json: &[u8]) -> PathEnd {
        self.ending(|out| ErrorValue::write_tagged_json(json, out))
    }

    /// The path ends with no error (the loop finished, or the server
    /// closed the path): close it, or, inside a message, abandon it.
    pub fn close(self) -> PathEnd {
        if self.inside() {
            return PathEnd::Abandon;
        }
        PathEnd::Close { last: None }
    }

    fn ending(self, write: impl FnOnce(&mut Writer<'_>)) -> PathEnd {
        if self.inside() {
            return PathEnd::Abandon;
        }
        let mut last = Vec::new();
        write(&mut Writer::new(&mut last));
        PathEnd::Close { last: Some(last) }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::error_value::ErrorKind;

    fn shutting_down() -> ErrorValue {
        ErrorValue::kind(ErrorKind::Proxy, "the proxy is shutting down")
    }

    fn sent(send: &mut PathSend, kind: PieceKind, len: usize) -> (FrameHead, Option<u64>) {
        let head = send.piece(kind, len).expect("in order");
        (head, send.written())
    }

    #[test]
    fn a_whole_event_is_one_tagged_final_frame() {
        let mut send = PathSend::new();
        let whole = FrameHead {
            opens: true,
            fin: true,
            tag: b"\0",
        };
        assert_eq!(sent(&mut send, PieceKind::Whole, 5), (whole, Some(5)));
        assert_eq!(sent(&mut send, PieceKind::Whole, 0), (whole, Some(0)));
        assert!(!send.inside());
    }

    #[test]
    fn a_large_event_is_fragments_counted_together() {
        let mut send = PathSend::new();
        let (begin, done) = sent(&mut send, PieceKind::Begin, 3);
        assert_eq!(
            (begin.opens, begin.fin, begin.tag, done),
            (true, false, &b"\0"[..], None)
        );
        let (more, done) = sent(&mut send, PieceKind::More, 4);
        assert_eq!(
            (more.opens, more.fin, more.tag, done),
            (false, false, &[][..], None)
        );
        let (end, done) = sent(&mut send, PieceKind::End, 5);
        assert_eq!(
            (end.opens, end.fin, end.tag, done),
            (false, true, &[][..], Some(12))
        );
        assert!(!send.inside());
    }

    #[test]
    fn between_messages_a_fault_is_the_error_then_the_close() {
        let mut send = PathSend::new();
        sent(&mut send, PieceKind::Whole, 2);
        assert_eq!(
            send.fault(&shutting_down()),
            PathEnd::Close {
                last: Some(
                    b"\x01{\"kind\":\"proxy\",\"error\":\"the proxy is shutting down\"}".to_vec()
                )
            }
        );
        let json = br#"{"kind":"agent","error":"down"}"#;
        let mut last = vec![1];
        last.extend_from_slice(json);
        assert_eq!(
            PathSend::new().fault_json(json),
            PathEnd::Close { last: Some(last) }
        );
        assert_eq!(PathSend::new().close(), PathEnd::Close { last: None });
    }

    #[test]
    fn inside_a_message_every_end_abandons() {
        type Ending = fn(PathSend) -> PathEnd;
        let endings: [Ending; 3] = [
            |send| send.fault(&shutting_down()),
            |send| send.fault_json(b"{}"),
            PathSend::close,
        ];
        for end in endings {
            // After a first fragment, after a middle one.
            for kinds in [
                &[PieceKind::Begin][..],
                &[PieceKind::Begin, PieceKind::More],
            ] {
                let mut send = PathSend::new();
                for &kind in kinds {
                    sent(&mut send, kind, 1);
                }
                assert!(send.inside());
                assert_eq!(end(send), PathEnd::Abandon);
            }
            // A frame handed to the socket and not written, even a whole one.
            let mut send = PathSend::new();
            send.piece(PieceKind::Whole, 1).expect("in order");
            assert!(send.inside());
            assert_eq!(end(send), PathEnd::Abandon);
        }
    }

    #[test]
    fn pieces_out_of_order_are_refused_and_change_nothing() {
        let mut send = PathSend::new();
        assert_eq!(send.piece(PieceKind::More, 1), Err(OutOfOrder::Continues));
        assert_eq!(send.piece(PieceKind::End, 1), Err(OutOfOrder::Continues));
        assert!(!send.inside());
        send.piece(PieceKind::Begin, 1).expect("in order");
        assert_eq!(send.piece(PieceKind::More, 1), Err(OutOfOrder::Unwritten));
        assert_eq!(send.written(), None);
        assert_eq!(send.piece(PieceKind::Whole, 1), Err(OutOfOrder::Opens));
        assert_eq!(send.piece(PieceKind::Begin, 1), Err(OutOfOrder::Opens));
        assert_eq!(sent(&mut send, PieceKind::End, 2).1, Some(3));
        assert_eq!(send.written(), None, "no frame under way");
        assert_eq!(
            OutOfOrder::Continues.to_string(),
            "a piece that continues a message came between messages"
        );
        let end = send.fault(&ErrorValue::new(json!("late")));
        assert_eq!(
            end,
            PathEnd::Close {
                last: Some(b"\x01\"late\"".to_vec())
            }
        );
    }
}
