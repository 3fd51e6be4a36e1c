//! The checks behind the fuzz targets, one per decoder, shared with the
//! corpus replay test of `runloop-proto`.
//!
//! A fuzz target is only as good as what it asserts: "does not panic" alone
//! would pass a decoder that accepts everything. So each check also asserts
//! what the protocol promises about the input it was given: that a decoded
//! value re-encodes to something that decodes to the same value, that the
//! direction of a frame decides which types exist, that a reader never calls
//! a broken sequence finished, that a relay never breaks a sequence itself,
//! that the proxy never says a word inside a fragmented message.
//!
//! This file is the fuzz crate's library and is also compiled into
//! `crates/runloop-proto/tests/corpus.rs` as a module, so that stable `cargo
//! test` replays the committed corpora through exactly the same checks. It
//! therefore uses nothing but `runloop-proto`, `serde_json` and `std`.
//!
//! Each check returns whether the input got past decoding, so the replay
//! test can tell a corpus that exercises the decoders from one that only
//! exercises their error paths.

use runloop_proto::agents_run::RunRequest;
use runloop_proto::authorization::Authorization;
use runloop_proto::channel::ChannelRequest;
use runloop_proto::endpoint::EndpointRequest;
use runloop_proto::frame::{self, ClientFrame, HEADER_LEN, HeaderError, ServerFrame};
use runloop_proto::run_loop::{
    Broken, CHUNK, ERROR, Outcome, PathEnd, PathSend, PieceKind, Reader, Relay, Relayed, Response,
    ResponseError, Step,
};
use runloop_proto::{Decode, Encode, ErrorKind, ErrorValue, Writer};

/// Splits fuzz input into messages at `\n`. Compact JSON never holds a raw
/// newline, so a seed file can list one frame per line.
fn lines(data: &[u8]) -> Vec<&[u8]> {
    if data.is_empty() {
        Vec::new()
    } else {
        data.split(|&b| b == b'\n').collect()
    }
}

/// `frame_header`: one message, decoded as a client frame and as a server
/// frame.
pub fn frame_header(data: &[u8]) -> bool {
    let client = ClientFrame::decode(data);
    let server = ServerFrame::decode(data);
    if data.len() < HEADER_LEN {
        let truncated = HeaderError::Truncated { len: data.len() };
        assert_eq!(client, Err(truncated.clone()));
        assert_eq!(server, Err(truncated));
        return false;
    }
    let decoded = client.is_ok() || server.is_ok();
    // The direction decides which type bytes exist.
    assert_eq!(client.is_ok(), matches!(data[0], 0 | 1 | 4 | 5 | 6));
    assert_eq!(server.is_ok(), matches!(data[0], 0 | 2..=6));
    if let Ok(frame) = client {
        let message = frame::to_message(&frame);
        assert_eq!(message[0], data[0]);
        assert_eq!(ClientFrame::decode(&message), Ok(frame));
    }
    if let Ok(frame) = server {
        let message = frame::to_message(&frame);
        assert_eq!(message[0], data[0]);
        assert_eq!(ServerFrame::decode(&message), Ok(frame));
    }
    if let Err(error) = client.and(server) {
        assert!(!error.to_string().is_empty());
    }
    decoded
}

/// `authorization`: a type-0 payload. A credential's encoding is canonical,
/// so what decodes re-encodes to the very same bytes.
pub fn authorization(data: &[u8]) -> bool {
    match Authorization::decode(data) {
        Ok(authorization) => {
            let bytes = authorization
                .to_vec()
                .unwrap_or_else(|never| match never {});
            assert_eq!(bytes, data);
            true
        }
        Err(error) => {
            let valid = data.first() == Some(&0) && std::str::from_utf8(&data[1..]).is_ok();
            assert!(!valid, "refused a valid credential: {error}");
            false
        }
    }
}

/// `agents_run_request`: a type-1 payload, then `validate` on what decoded.
/// A decoded request re-encodes to one that decodes to the same request,
/// with `agent` kept byte for byte.
pub fn agents_run_request(data: &[u8]) -> bool {
    match EndpointRequest::decode(data) {
        Ok(EndpointRequest::AgentsRun(request)) => {
            let verdict = request.validate();
            if let Err(rule) = &verdict {
                assert!(!rule.to_string().is_empty());
            }
            let bytes = EndpointRequest::AgentsRun(request.clone())
                .to_vec()
                .expect("a decoded request serializes");
            let Ok(EndpointRequest::AgentsRun(again)) = EndpointRequest::decode(&bytes) else {
                panic!("a re-encoded request did not decode");
            };
            assert_eq!(again, request);
            assert_eq!(again.validate(), verdict);
            assert_eq!(
                RunRequest::decode(&bytes[1..]).expect("decodes without its tag"),
                *request
            );
            true
        }
        Ok(EndpointRequest::Unserved(tag)) => {
            assert_ne!(tag, 0);
            assert_eq!(Some(&tag), data.first());
            true
        }
        Err(error) => {
            assert!(!error.to_string().is_empty());
            false
        }
    }
}

/// `channel_request`: a type-4 payload on a run scope. A run-loop request
/// re-encodes to the caller's bytes exactly (the server relays them).
pub fn channel_request(data: &[u8]) -> bool {
    match ChannelRequest::decode(data) {
        Ok(request) => {
            let bytes = request.to_vec().unwrap_or_else(|never| match never {});
            if let ChannelRequest::RunLoop(_) = &request {
                assert_eq!(bytes, data);
            }
            assert_eq!(
                ChannelRequest::decode(&bytes).expect("decodes again"),
                request
            );
            true
        }
        Err(error) => {
            assert!(!error.to_string().is_empty());
            false
        }
    }
}

/// `run_loop_frame`: the whole input as one run-loop response payload, and
/// its lines as a channel's sequence through a [`Reader`].
pub fn run_loop_frame(data: &[u8]) -> bool {
    let decoded = Response::decode(data);
    // A chunk is read exactly as serde_json's own byte decoder reads it.
    if data.first() == Some(&CHUNK) {
        let theirs =
            serde_json::from_slice::<runloop_proto::run_loop::AgenticLoopChunk>(&data[1..]);
        match (&decoded, theirs) {
            (Ok(Response::Chunk(ours)), Ok(theirs)) => assert_eq!(ours, &theirs),
            (Err(ResponseError::Chunk(ours)), Err(theirs)) => {
                assert_eq!(ours.to_string(), theirs.to_string());
            }
            (ours, theirs) => panic!("ours {ours:?}, serde_json {theirs:?}"),
        }
    }
    if let Ok(frame) = &decoded {
        let bytes = frame.to_vec().expect("a decoded frame serializes");
        assert_eq!(bytes[0], data[0]);
        assert_eq!(
            &Response::decode(&bytes).expect("re-encoded frame decodes"),
            frame
        );
    }

    // One payload: the reader's step is the decoder's verdict.
    let mut reader = Reader::new();
    match (&decoded, reader.response(data)) {
        (Ok(Response::Chunk(chunk)), Some(Step::Chunk(step))) => assert_eq!(chunk, &step),
        (Ok(Response::Error(error)), Some(Step::Error(step))) => assert_eq!(error, &step),
        (Err(_), Some(Step::End(Outcome::Broken(Broken::Undecodable(why))))) => {
            assert!(why.to_string().contains("agentic loop"), "{why}");
        }
        (decoded, step) => panic!("decoded {decoded:?} but the reader said {step:?}"),
    }

    // Lines: finished only when every line was a chunk.
    let payloads = lines(data);
    let mut reader = Reader::new();
    let mut outcome = None;
    for payload in &payloads {
        if let Some(Step::End(ended)) = reader.response(payload) {
            outcome = Some(ended);
        }
    }
    let outcome = outcome.or_else(|| reader.finish());
    if let Some(Outcome::Finished { .. }) = outcome {
        assert!(!payloads.is_empty(), "a bare finish read as finished");
        for payload in &payloads {
            assert!(
                matches!(Response::decode(payload), Ok(Response::Chunk(_))),
                "finished with a payload that is not a chunk"
            );
        }
    }
    decoded.is_ok()
}

/// `relay`: the first byte picks how the proxy's path ends (clean close,
/// abrupt end, or the server cutting it), the rest is the proxy's messages,
/// one per line. The relay's responses go through a caller's [`Reader`].
///
/// The relay reads tags only (protocol §7, §12), so a proxy message with a good
/// tag and bad JSON is passed on as it came and the reader rightly reports
/// the sequence broken at that message. What must never happen: a broken
/// sequence when everything the proxy sent was well-formed, a sequence of
/// the wrong shape, "finished" when the proxy did not finish, or a message
/// read after the proxy's error or a fault.
pub fn relay(data: &[u8]) -> bool {
    let Some((&ending, rest)) = data.split_first() else {
        return false;
    };
    let messages = lines(rest);
    let mut relay = Some(Relay::new());
    let mut sent: Vec<Vec<u8>> = Vec::new();
    let mut read = 0;
    for message in &messages {
        let Some(current) = relay.take() else {
            break;
        };
        read += 1;
        let mut out = Vec::new();
        match current.message(*message, &mut Writer::new(&mut out)) {
            Relayed::Forward(next, forwarded) => {
                assert!(out.is_empty());
                sent.push(forwarded.to_vec());
                relay = Some(next);
            }
            Relayed::Last(error, _finish) => {
                assert!(out.is_empty());
                assert_eq!(error.first(), Some(&ERROR));
                sent.push(error.to_vec());
            }
            Relayed::Fault(_finish) => sent.push(out),
        }
    }
    if let Some(relay) = relay {
        let mut out = Vec::new();
        match ending % 3 {
            0 => {
                let _finish = relay.closed();
            }
            1 => {
                let _finish = relay.broke("fuzz", &mut Writer::new(&mut out));
                sent.push(out);
            }
            _ => {
                let _finish = relay.cut(
                    ErrorValue::kind(ErrorKind::Run, "fuzz"),
                    &mut Writer::new(&mut out),
                );
                sent.push(out);
            }
        }
    }
    // The proxy's error or a fault is the end: nothing after it is read.
    let first_end = messages.iter().position(|m| m.first() != Some(&CHUNK));
    assert_eq!(read, first_end.map_or(messages.len(), |i| i + 1));

    // The shape: chunks, then at most one error, last.
    for (i, payload) in sent.iter().enumerate() {
        match payload.first() {
            Some(&CHUNK) => {}
            Some(&ERROR) => assert_eq!(i + 1, sent.len(), "an error that is not last"),
            other => panic!("a response with tag {other:?}"),
        }
    }
    // Leading chunk messages are forwarded byte for byte.
    let leading = messages
        .iter()
        .take_while(|m| m.first() == Some(&CHUNK))
        .count();
    assert!(sent.len() >= leading);
    for (sent, message) in sent.iter().zip(&messages).take(leading) {
        assert_eq!(sent, message);
    }
    // What the server wrote itself is a valid error.
    let from_proxy = |payload: &Vec<u8>| messages.iter().any(|m| m == payload);
    for payload in sent.iter().filter(|p| !from_proxy(p)) {
        assert!(matches!(Response::decode(payload), Ok(Response::Error(_))));
    }

    let mut reader = Reader::new();
    let mut outcome = None;
    for payload in &sent {
        if let Some(Step::End(ended)) = reader.response(payload) {
            outcome = Some(ended);
            break;
        }
    }
    let outcome = outcome.or_else(|| reader.finish()).expect("one outcome");
    let proxy_well_formed = sent.iter().all(|p| Response::decode(p).is_ok());
    if proxy_well_formed {
        assert!(
            !matches!(outcome, Outcome::Broken(_)),
            "the relay broke a well-formed sequence: {outcome:?}"
        );
    }
    if let Outcome::Finished { .. } | Outcome::NotServed = outcome {
        assert_eq!(ending % 3, 0, "an abrupt or cut path read as complete");
        assert_eq!(
            leading,
            messages.len(),
            "a path with a non-chunk read as complete"
        );
    }
    !matches!(outcome, Outcome::Broken(_))
}

/// `path_send`: the first byte picks how the proxy's path ends (its own
/// error, the agent program's error JSON, or a close), each next byte is
/// one step: its low two bits a piece's kind when bit 2 is clear (the
/// other bits its length), otherwise "the frame is written". The frames
/// the machine hands out go through a receiver's rules for fragmented
/// messages (RFC 6455, section 5.4).
///
/// What must never happen: a frame that breaks fragmentation, a piece
/// refused where the receiver would take it, an `[1]` or a close after a
/// non-final fragment or half a frame, an abandoned path between messages,
/// or a message's byte count that is not the sum of its frames.
pub fn path_send(data: &[u8]) -> bool {
    let Some((&ending, steps)) = data.split_first() else {
        return false;
    };
    let mut send = PathSend::new();
    // The receiver: inside a message, the last frame not yet written, the
    // bytes of the message so far.
    let (mut inside, mut unwritten, mut bytes) = (false, false, 0u64);
    let mut accepted = false;
    for &step in steps {
        if step & 4 != 0 {
            let done = send.written();
            if unwritten {
                unwritten = false;
                if inside {
                    assert_eq!(done, None);
                } else {
                    assert_eq!(done, Some(bytes));
                    bytes = 0;
                }
            } else {
                assert_eq!(done, None, "no frame was under way");
            }
            continue;
        }
        let kind = [
            PieceKind::Whole,
            PieceKind::Begin,
            PieceKind::More,
            PieceKind::End,
        ][usize::from(step & 3)];
        let len = usize::from(step >> 3);
        let opens = matches!(kind, PieceKind::Whole | PieceKind::Begin);
        match send.piece(kind, len) {
            Ok(head) => {
                assert!(!unwritten, "a frame before the last was written");
                assert_eq!(head.opens, !inside, "a frame that breaks fragmentation");
                assert_eq!(head.opens, opens);
                assert_eq!(head.tag, if opens { &[CHUNK][..] } else { &[][..] });
                inside = !head.fin;
                unwritten = true;
                bytes += len as u64;
                accepted = true;
            }
            Err(refused) => {
                assert!(
                    unwritten || opens == inside,
                    "refused a piece the receiver takes: {refused}"
                );
            }
        }
    }
    let clean = !inside && !unwritten;
    assert_eq!(send.inside(), !clean);
    let end = match ending % 3 {
        0 => send.fault(&ErrorValue::kind(ErrorKind::Proxy, "fuzz")),
        1 => send.fault_json(b"{\"kind\":\"agent\",\"error\":\"fuzz\"}"),
        _ => send.close(),
    };
    match end {
        PathEnd::Abandon => assert!(!clean, "abandoned between messages"),
        PathEnd::Close { last } => {
            assert!(clean, "a close or an [1] inside a message");
            assert_eq!(last.is_some(), ending % 3 != 2);
            if let Some(last) = last {
                assert_eq!(last.first(), Some(&ERROR));
                assert!(matches!(Response::decode(&last), Ok(Response::Error(_))));
            }
        }
    }
    accepted
}
