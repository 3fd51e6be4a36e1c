//! The server's [`Relay`]: whatever the proxy sends and however its path
//! ends, the caller is handed a sequence it can read, and "finished" only
//! when the proxy finished.
//!
//! Each case is run end to end: proxy messages through a relay, the relay's
//! channel responses through the caller's [`Reader`].

use proptest::prelude::*;
use runloop_proto::run_loop::{
    AgenticLoopChunk, CHUNK, ERROR, Outcome, Reader, Relay, Relayed, Response, Step,
};
use runloop_proto::{Decode, Encode, ErrorKind, ErrorValue, Writer};
use serde_json::{Value, json};

use crate::strategy;

/// One message on the proxy's `/agent/run` path.
#[derive(Debug, Clone)]
enum Message {
    /// `[0]` and a chunk's JSON.
    Chunk(AgenticLoopChunk),
    /// `[1]` and an error's JSON.
    Error(Value),
    /// No bytes at all.
    Empty,
    /// A tag that is neither 0 nor 1, then JSON that would be a fine chunk.
    UnknownTag(u8, AgenticLoopChunk),
    /// Random bytes whose first byte is not a tag.
    Garbage(Vec<u8>),
}

impl Message {
    fn bytes(&self) -> Vec<u8> {
        match self {
            Message::Chunk(chunk) => Response::Chunk(chunk.clone()).to_vec().expect("serializes"),
            Message::Error(value) => Response::Error(ErrorValue::new(value.clone()))
                .to_vec()
                .expect("serializes"),
            Message::Empty => Vec::new(),
            Message::UnknownTag(tag, chunk) => {
                let mut bytes = Response::Chunk(chunk.clone()).to_vec().expect("serializes");
                bytes[0] = *tag;
                bytes
            }
            Message::Garbage(bytes) => bytes.clone(),
        }
    }
}

/// How the proxy's path ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// A clean WebSocket close.
    Closed,
    /// An abrupt end.
    Broke,
    /// The server ends the channel itself.
    Cut,
}

fn message() -> impl Strategy<Value = Message> {
    prop_oneof![
        8 => strategy::chunk().prop_map(Message::Chunk),
        2 => strategy::json_value().prop_map(Message::Error),
        1 => Just(Message::Empty),
        1 => (2u8.., strategy::chunk()).prop_map(|(tag, chunk)| Message::UnknownTag(tag, chunk)),
        1 => (2u8.., prop::collection::vec(any::<u8>(), 0..16)).prop_map(|(first, rest)| {
            let mut bytes = vec![first];
            bytes.extend(rest);
            Message::Garbage(bytes)
        }),
    ]
}

fn ending() -> impl Strategy<Value = Ending> {
    prop_oneof![Just(Ending::Closed), Just(Ending::Broke), Just(Ending::Cut)]
}

/// Runs the relay; returns the channel responses it produced, in order,
/// and how many of the proxy's messages it read. Every path through the
/// relay ends in a finish (its types demand it).
fn relay(messages: &[Vec<u8>], ending: Ending) -> (Vec<Vec<u8>>, usize) {
    let mut relay = Relay::new();
    let mut sent = Vec::new();
    for (read, message) in messages.iter().enumerate() {
        let mut out = Vec::new();
        relay = match relay.message(message.clone(), &mut Writer::new(&mut out)) {
            Relayed::Forward(relay, forwarded) => {
                assert!(out.is_empty(), "a forward writes nothing of its own");
                sent.push(forwarded);
                relay
            }
            Relayed::Last(error, _finish) => {
                assert!(
                    out.is_empty(),
                    "the proxy's error is passed on, not rewritten"
                );
                sent.push(error);
                return (sent, read + 1);
            }
            Relayed::Fault(_finish) => {
                sent.push(out);
                return (sent, read + 1);
            }
        };
    }
    let mut out = Vec::new();
    match ending {
        Ending::Closed => {
            let _finish = relay.closed();
        }
        Ending::Broke => {
            let _finish = relay.broke("reset", &mut Writer::new(&mut out));
            sent.push(out);
        }
        Ending::Cut => {
            let _finish = relay.cut(
                ErrorValue::kind(ErrorKind::Run, "stopped"),
                &mut Writer::new(&mut out),
            );
            sent.push(out);
        }
    }
    (sent, messages.len())
}

/// The caller's view of the responses, finish included.
fn read_outcome(sent: &[Vec<u8>]) -> Outcome {
    let mut reader = Reader::new();
    for payload in sent {
        if let Some(Step::End(outcome)) = reader.response(payload) {
            return outcome;
        }
    }
    reader.finish().expect("the reader had not ended")
}

proptest! {
    /// Well-formed or not, the proxy's messages become a sequence the
    /// reader accepts; "finished" exactly when the proxy sent only chunks
    /// (at least one) and closed cleanly; chunks are forwarded byte for
    /// byte; the proxy's error is passed on as it came, at once, whatever
    /// follows it and however the path ends, and nothing after it is read;
    /// otherwise the last error is the server's own: the path's ending
    /// decides which.
    #[test]
    fn the_caller_always_gets_a_valid_sequence(
        messages in prop::collection::vec(message(), 0..8),
        ending in ending(),
    ) {
        let bytes: Vec<Vec<u8>> = messages.iter().map(Message::bytes).collect();
        let (sent, read) = relay(&bytes, ending);
        let outcome = read_outcome(&sent);
        prop_assert!(!matches!(outcome, Outcome::Broken(_)), "broken: {:?}", outcome);

        let leading = messages.iter().take_while(|m| matches!(m, Message::Chunk(_))).count();
        prop_assert_eq!(&sent[..leading.min(sent.len())], &bytes[..leading.min(sent.len())]);

        let proxy_finished = leading == messages.len() && ending == Ending::Closed;
        if proxy_finished {
            prop_assert_eq!(sent.len(), leading, "nothing of the server's own");
            let expected = match messages.last() {
                None => Outcome::NotServed,
                Some(Message::Chunk(last)) => Outcome::Finished { fatal: last.is_fatal() },
                Some(other) => unreachable!("only chunks: {other:?}"),
            };
            prop_assert_eq!(outcome, expected);
            return Ok(());
        }

        // Otherwise: the leading chunks, then exactly one error, last.
        prop_assert_eq!(sent.len(), leading + 1);
        let error = match Response::decode(&sent[leading]).expect("the last response decodes") {
            Response::Error(error) => error,
            Response::Chunk(chunk) => panic!("a chunk where the error belongs: {chunk:?}"),
        };
        match &outcome {
            Outcome::Unfinished(e) if leading > 0 => prop_assert_eq!(e, &error),
            Outcome::NoLoop(e) if leading == 0 => prop_assert_eq!(e, &error),
            other => prop_assert!(false, "{} chunks then an error read as {:?}", leading, other),
        }
        match messages.get(leading) {
            // The proxy's error, as it came; the relay stopped reading there.
            Some(Message::Error(_)) => {
                prop_assert_eq!(&sent[leading], &bytes[leading], "the proxy's error, as it came");
                prop_assert_eq!(read, leading + 1, "nothing after the error is read");
            }
            // A fault: the server's own error; the relay stopped reading there.
            Some(_) => {
                prop_assert_eq!(&error.0["kind"], &json!("proxy"), "{}", error);
                prop_assert!(error.0["error"].is_string(), "{}", error);
                prop_assert_eq!(read, leading + 1, "nothing after a fault is read");
            }
            // Only chunks: the path's ending decided whose error it is.
            None => {
                let expected_kind = if ending == Ending::Cut { "run" } else { "proxy" };
                prop_assert_eq!(&error.0["kind"], &json!(expected_kind), "{}", error);
                prop_assert!(error.0["error"].is_string(), "{}", error);
                prop_assert_eq!(read, messages.len());
            }
        }
    }

    /// With arbitrary bytes after the tags too: the relay never reads past
    /// the tag, nor past the first message that is not a chunk, so the
    /// shape of the sequence still holds (chunks, then at most one error,
    /// last), every response of the server's own is a valid error, and the
    /// reader can only fail on a message the proxy sent, passed on as it
    /// came.
    #[test]
    fn the_relay_only_reads_tags(
        messages in prop::collection::vec(
            prop_oneof![
                message().prop_map(|m| m.bytes()),
                prop::collection::vec(any::<u8>(), 0..16),
                (0u8..2, prop::collection::vec(any::<u8>(), 0..16)).prop_map(|(tag, rest)| {
                    let mut bytes = vec![tag];
                    bytes.extend(rest);
                    bytes
                }),
            ],
            0..8,
        ),
        ending in ending(),
    ) {
        let (sent, read) = relay(&messages, ending);
        // The relay stops reading at the first message that is not a chunk.
        let last_read = messages.iter().position(|m| m.first() != Some(&CHUNK));
        prop_assert_eq!(read, last_read.map_or(messages.len(), |i| i + 1));
        for (i, payload) in sent.iter().enumerate() {
            let last = i + 1 == sent.len();
            match payload.first() {
                Some(&CHUNK) => {}
                Some(&ERROR) => prop_assert!(last, "an error that is not last"),
                other => prop_assert!(false, "a response with tag {:?}", other),
            }
            if !messages.contains(payload) {
                // The server wrote this one itself.
                prop_assert!(last);
                prop_assert!(matches!(Response::decode(payload), Ok(Response::Error(_))));
            }
        }
        if let Outcome::Broken(why) = read_outcome(&sent) {
            let offending = sent.iter().find(|p| Response::decode(p).is_err());
            prop_assert!(offending.is_some(), "broken with every response decodable: {}", why);
            prop_assert!(messages.contains(offending.expect("checked")), "the server broke it: {}", why);
        }
    }
}
