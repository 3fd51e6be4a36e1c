//! The proxy's send rule ([`PathSend`]): whatever pieces come, in whatever
//! order, and whatever ends the path, a receiving WebSocket never sees an
//! `[1]` or a close after a message's non-final fragment (or after half a
//! frame), and the path ends exactly once.
//!
//! The reference is the wire itself, kept as a list of the frames handed
//! to the socket: a piece is refused exactly when its frame would break
//! WebSocket fragmentation there, and the path may close exactly when the
//! last frame is written and ends its message.

use proptest::prelude::*;
use runloop_proto::run_loop::{
    ERROR, FrameHead, OutOfOrder, PathEnd, PathSend, PieceKind, Response,
};
use runloop_proto::{Decode, ErrorKind, ErrorValue};

/// What the proxy does next.
#[derive(Debug, Clone, Copy)]
enum Step {
    /// A piece of this many bytes is next.
    Piece(PieceKind, u16),
    /// The socket finished writing the frame handed to it.
    Written,
}

/// What ends the path.
#[derive(Debug, Clone, Copy)]
enum Ending {
    /// The proxy's own error (shutdown, a broken body).
    Fault,
    /// The agent program's error JSON.
    FaultJson,
    /// The loop finished, or the server closed the path.
    Close,
}

/// A frame on the wire, and whether the socket finished writing it.
#[derive(Debug, Clone, Copy)]
struct Frame {
    head: FrameHead,
    len: u64,
    written: bool,
}

fn kind() -> impl Strategy<Value = PieceKind> {
    prop_oneof![
        Just(PieceKind::Whole),
        Just(PieceKind::Begin),
        Just(PieceKind::More),
        Just(PieceKind::End),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (kind(), any::<u16>()).prop_map(|(kind, len)| Step::Piece(kind, len)),
        2 => Just(Step::Written),
    ]
}

fn ending() -> impl Strategy<Value = Ending> {
    prop_oneof![
        Just(Ending::Fault),
        Just(Ending::FaultJson),
        Just(Ending::Close)
    ]
}

/// Whether the receiver is inside a message after `frames`.
fn open_message(frames: &[Frame]) -> bool {
    frames.last().is_some_and(|frame| !frame.head.fin)
}

proptest! {
    #[test]
    fn never_a_word_inside_a_message_and_one_end(
        steps in prop::collection::vec(step(), 0..24),
        ending in ending(),
    ) {
        let mut send = PathSend::new();
        let mut wire: Vec<Frame> = Vec::new();
        for step in steps {
            match step {
                Step::Piece(kind, len) => {
                    let unwritten = wire.last().is_some_and(|frame| !frame.written);
                    let opens = matches!(kind, PieceKind::Whole | PieceKind::Begin);
                    let expected = if unwritten {
                        Err(OutOfOrder::Unwritten)
                    } else if opens && open_message(&wire) {
                        Err(OutOfOrder::Opens)
                    } else if !opens && !open_message(&wire) {
                        Err(OutOfOrder::Continues)
                    } else {
                        Ok(())
                    };
                    match (send.piece(kind, usize::from(len)), expected) {
                        (Ok(head), Ok(())) => {
                            prop_assert_eq!(head.opens, opens);
                            prop_assert_eq!(head.fin, matches!(kind, PieceKind::Whole | PieceKind::End));
                            prop_assert_eq!(head.tag, if opens { &[0u8][..] } else { &[][..] });
                            wire.push(Frame { head, len: u64::from(len), written: false });
                        }
                        (Err(refused), Err(expected)) => prop_assert_eq!(refused, expected),
                        (got, expected) => prop_assert!(false, "{:?}: got {:?}, expected {:?}", kind, got, expected),
                    }
                }
                Step::Written => {
                    let pending = wire.last_mut().filter(|frame| !frame.written);
                    let ended = pending.map(|frame| {
                        frame.written = true;
                        frame.head.fin
                    });
                    // The message's bytes: its frames since the last FIN before it.
                    let expected = ended.filter(|&fin| fin).map(|_| {
                        let start = wire[..wire.len() - 1]
                            .iter()
                            .rposition(|frame| frame.head.fin)
                            .map_or(0, |i| i + 1);
                        wire[start..].iter().map(|frame| frame.len).sum::<u64>()
                    });
                    prop_assert_eq!(send.written(), expected);
                }
            }
        }
        let clean = wire.last().is_none_or(|frame| frame.written && frame.head.fin);
        prop_assert_eq!(send.inside(), !clean);
        let end = match ending {
            Ending::Fault => send.fault(&ErrorValue::kind(ErrorKind::Proxy, "stop")),
            Ending::FaultJson => send.fault_json(br#"{"kind":"agent","error":"down"}"#),
            Ending::Close => send.close(),
        };
        // `send` is gone: nothing can follow the end.
        match end {
            PathEnd::Abandon => prop_assert!(!clean, "abandoned between messages"),
            PathEnd::Close { last } => {
                prop_assert!(clean, "a close or an error after a non-final fragment");
                match (ending, last) {
                    (Ending::Close, None) => {}
                    (Ending::Fault | Ending::FaultJson, Some(last)) => {
                        prop_assert_eq!(last.first(), Some(&ERROR));
                        prop_assert!(matches!(Response::decode(&last), Ok(Response::Error(_))));
                    }
                    (ending, last) => prop_assert!(false, "{:?} ended with {:?}", ending, last),
                }
            }
        }
    }
}
