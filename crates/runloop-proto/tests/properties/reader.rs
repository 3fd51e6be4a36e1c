//! The caller's [`Reader`]: one outcome per channel, and never "finished"
//! for a sequence that carried an error or lacked its finish.
//!
//! The model property generates sequences from three kinds of payload —
//! valid chunks, valid errors, payloads that are invalid *by construction* —
//! and an ending (finish, or a cut for one of three reasons), and compares
//! the reader against a reference written as plain list arithmetic over the
//! sequence rather than as a state machine.

use proptest::prelude::*;
use runloop_proto::run_loop::{
    AgenticLoopChunk, Broken, CHUNK, Outcome, Reader, Response, ResponseError, Step,
};
use runloop_proto::{Encode, ErrorValue};

use crate::strategy;

/// One channel response, as the model sees it.
#[derive(Debug, Clone)]
enum Payload {
    Chunk(AgenticLoopChunk),
    Error(ErrorValue),
    /// Bytes that are not a run-loop frame, whatever the decoder thinks.
    Invalid(Vec<u8>),
}

impl Payload {
    fn bytes(&self) -> Vec<u8> {
        match self {
            Payload::Chunk(chunk) => Response::Chunk(chunk.clone()).to_vec().expect("serializes"),
            Payload::Error(error) => Response::Error(error.clone()).to_vec().expect("serializes"),
            Payload::Invalid(bytes) => bytes.clone(),
        }
    }
}

/// How the channel ends.
#[derive(Debug, Clone)]
enum Ending {
    Finish,
    Cut(Broken),
}

/// A payload that cannot be a frame: empty, an unknown tag, a chunk object
/// without its closing brace, a chunk of an unknown kind, or an error value
/// followed by more bytes.
fn invalid() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(Vec::new()),
        (2u8.., prop::collection::vec(any::<u8>(), 0..8)).prop_map(|(tag, rest)| {
            let mut bytes = vec![tag];
            bytes.extend(rest);
            bytes
        }),
        strategy::chunk().prop_map(|chunk| {
            let mut bytes = Response::Chunk(chunk).to_vec().expect("serializes");
            bytes.pop();
            bytes
        }),
        strategy::text().prop_map(|kind| {
            let kind = format!("not a kind: {kind}");
            let mut bytes = vec![CHUNK];
            serde_json::to_writer(&mut bytes, &serde_json::json!({ "type": kind }))
                .expect("serializes");
            bytes
        }),
        strategy::json_value().prop_map(|value| {
            let mut bytes = Response::Error(ErrorValue::new(value))
                .to_vec()
                .expect("serializes");
            bytes.extend_from_slice(b" 0");
            bytes
        }),
    ]
}

fn payload() -> impl Strategy<Value = Payload> {
    prop_oneof![
        6 => strategy::chunk().prop_map(Payload::Chunk),
        2 => strategy::json_value().prop_map(|v| Payload::Error(ErrorValue::new(v))),
        1 => invalid().prop_map(Payload::Invalid),
    ]
}

fn ending() -> impl Strategy<Value = Ending> {
    prop_oneof![
        3 => Just(Ending::Finish),
        1 => Just(Ending::Cut(Broken::ConnectionEnded)),
        1 => Just(Ending::Cut(Broken::RunEnded)),
        1 => Just(Ending::Cut(Broken::InputEnded)),
    ]
}

/// The reference: what the sequence states, and how many chunks the caller
/// is handed before that.
fn model(payloads: &[Payload], ending: &Ending) -> (usize, Outcome) {
    let first_error = payloads.iter().position(|p| matches!(p, Payload::Error(_)));
    let first_invalid = payloads
        .iter()
        .position(|p| matches!(p, Payload::Invalid(_)));
    let chunks_before = |end: usize| {
        payloads[..end]
            .iter()
            .filter(|p| matches!(p, Payload::Chunk(_)))
            .count()
    };
    match (first_invalid, first_error) {
        // An invalid payload before any error breaks the sequence there.
        (Some(bad), None) => return (chunks_before(bad), undecodable()),
        (Some(bad), Some(error)) if bad < error => return (chunks_before(bad), undecodable()),
        _ => {}
    }
    if let Some(error) = first_error {
        let chunks = chunks_before(error);
        if error + 1 < payloads.len() {
            return (chunks, Outcome::Broken(Broken::ResponseAfterError));
        }
        let Payload::Error(value) = &payloads[error] else {
            unreachable!("found as an error")
        };
        return match (ending, chunks) {
            (Ending::Cut(why), _) => (chunks, Outcome::Broken(why.clone())),
            (Ending::Finish, 0) => (0, Outcome::NoLoop(value.clone())),
            (Ending::Finish, _) => (chunks, Outcome::Unfinished(value.clone())),
        };
    }
    let chunks = payloads.len();
    let outcome = match (ending, payloads.last()) {
        (Ending::Cut(why), _) => Outcome::Broken(why.clone()),
        (Ending::Finish, None) => Outcome::NotServed,
        (Ending::Finish, Some(Payload::Chunk(last))) => Outcome::Finished {
            fatal: last.is_fatal(),
        },
        (Ending::Finish, Some(_)) => unreachable!("only chunks are left"),
    };
    (chunks, outcome)
}

fn undecodable() -> Outcome {
    Outcome::Broken(Broken::Undecodable(ResponseError::Empty.into()))
}

/// What the reader did: the chunks it handed over, and its one outcome.
fn run(payloads: &[Payload], ending: &Ending) -> (Vec<AgenticLoopChunk>, Vec<Outcome>) {
    let mut reader = Reader::new();
    let mut chunks = Vec::new();
    let mut outcomes = Vec::new();
    for payload in payloads {
        match reader.response(&payload.bytes()) {
            Some(Step::Chunk(chunk)) => chunks.push(chunk),
            Some(Step::Error(_)) | None => {}
            Some(Step::End(outcome)) => outcomes.push(outcome),
        }
    }
    let last = match ending {
        Ending::Finish => reader.finish(),
        Ending::Cut(why) => reader.cut(why.clone()),
    };
    outcomes.extend(last);
    // Once ended, the reader answers nothing more.
    assert!(reader.is_ended());
    assert_eq!(reader.response(&[CHUNK]), None);
    assert_eq!(reader.finish(), None);
    assert_eq!(reader.cut(Broken::ConnectionEnded), None);
    (chunks, outcomes)
}

/// The undecodable message is not part of the comparison; the variant is.
fn normalized(outcome: Outcome) -> Outcome {
    match outcome {
        Outcome::Broken(Broken::Undecodable(why)) => {
            assert!(
                why.to_string().contains("agentic loop "),
                "names the frame: {why}"
            );
            undecodable()
        }
        other => other,
    }
}

proptest! {
    /// For any sequence of valid and invalid payloads and any ending, the
    /// reader gives exactly one outcome, equal to the model's, and hands
    /// over exactly the chunks before it, unchanged.
    #[test]
    fn matches_the_model(
        payloads in prop::collection::vec(payload(), 0..8),
        ending in ending(),
    ) {
        let (expected_chunks, expected) = model(&payloads, &ending);
        let (chunks, outcomes) = run(&payloads, &ending);
        prop_assert_eq!(outcomes.len(), 1, "exactly one outcome: {:?}", outcomes);
        let outcome = normalized(outcomes[0].clone());
        prop_assert_eq!(&outcome, &expected);
        let sent: Vec<&AgenticLoopChunk> = payloads
            .iter()
            .filter_map(|p| match p {
                Payload::Chunk(chunk) => Some(chunk),
                _ => None,
            })
            .take(expected_chunks)
            .collect();
        prop_assert_eq!(chunks.iter().collect::<Vec<_>>(), sent);
    }

    /// Over arbitrary bytes too: "finished" only with the finish, and only
    /// when every payload was a chunk; without an ending there is no outcome
    /// unless the sequence broke.
    #[test]
    fn finished_only_for_chunks_then_finish(
        payloads in prop::collection::vec(
            prop_oneof![
                payload().prop_map(|p| p.bytes()),
                prop::collection::vec(any::<u8>(), 0..12),
                prop::collection::vec(0u8..2, 1..3),
            ],
            0..8,
        ),
        end in 0u8..3,
    ) {
        let mut reader = Reader::new();
        let mut outcome = None;
        for payload in &payloads {
            if let Some(Step::End(o)) = reader.response(payload) {
                outcome = Some(o);
            }
        }
        match end {
            0 => outcome = outcome.or(reader.finish()),
            1 => outcome = outcome.or(reader.cut(Broken::ConnectionEnded)),
            _ => {
                // The input stops with no ending: nothing is concluded
                // unless the sequence already broke.
                prop_assert!(matches!(outcome, None | Some(Outcome::Broken(_))));
            }
        }
        if let Some(Outcome::Finished { .. }) = outcome {
            prop_assert_eq!(end, 0, "finished without the finish");
            let all_chunks = payloads.iter().all(|p| {
                p.first() == Some(&CHUNK)
                    && serde_json::from_slice::<AgenticLoopChunk>(&p[1..]).is_ok()
            });
            prop_assert!(all_chunks, "finished with a non-chunk payload");
            prop_assert!(!payloads.is_empty(), "a bare finish is not finished");
        }
    }
}
