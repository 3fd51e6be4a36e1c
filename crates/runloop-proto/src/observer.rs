//! The observer: a passive reconstruction of one connection from both
//! directions' messages, following every run-loop channel on it.
//!
//! An inspector reading a capture, or a probe watching a live connection,
//! must reach the same verdict about each loop as the client that was there.
//! So the observer applies the receiving side's rules of protocol §2 and §3 to
//! every message, in the order they were recorded, and hands each run-loop
//! channel's responses to the same [`Reader`] the client uses: a loop can only
//! come out finished here if the client would have said so too.
//!
//! ```text
//! message ──▶ frame (direction decides the type space) ──▶ authorization first, once
//!                                                      ──▶ scopes: request opens, finish ends
//!                                                      ──▶ channels per (scope, opener, number):
//!                                                          request opens, finish ends
//!            client channel with tag 5 (run-loop) ──▶ Reader ──▶ chunk / error / outcome
//! ```
//!
//! The rules are the connection [`Table`]'s, the same the server and the
//! client keep, applied to each message as its receiver applies it. What
//! the receiver would disregard, or end the connection for, the observer
//! reports as [`Malformed`] and goes on: a message that is no frame, a type
//! the sender may not send, a frame before the authorization, a second
//! authorization, a request naming a scope or channel number that is still
//! open, a frame naming a scope or channel that is not open. A channel
//! request that does not decode is reported as well, but its channel opens:
//! the server answers it with a bare finish, and a run-loop channel among
//! them is still followed, since that finish is what its client saw.
//!
//! A scope's finish ends every channel still open in it
//! ([`Broken::RunEnded`] for a run-loop channel), and the end of the input
//! ends every channel still open anywhere ([`Broken::InputEnded`]); either
//! way the channels end in the order they were opened.

use std::fmt;

use crate::authorization::AuthorizationError;
use crate::capture::Direction;
use crate::channel::{ChannelRequest, ChannelRequestError};
use crate::codec::Decode;
use crate::connection::side::Observer as Watching;
use crate::connection::{
    Disregarded, Ended, Fault, FromClient, FromServer, NewChannel, Table, Violation,
};
use crate::error_value::ErrorValue;
use crate::frame::{ClientFrame, ServerFrame};
use crate::run_loop::{AgenticLoopChunk, Broken, Outcome, Reader, Step};

/// Where a run-loop channel lives: its scope and the client's number for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChannelId {
    /// The scope the channel lives in.
    pub scope: u32,
    /// The channel number, in the client's numbering.
    pub channel: u32,
}

impl fmt::Display for ChannelId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "channel {} of scope {}", self.channel, self.scope)
    }
}

/// What one message meant, as far as the run-loop channels are concerned.
///
/// Every run-loop channel yields one [`Event::Request`], then its chunks and
/// at most one error, then exactly one [`Event::Outcome`]. `json` members
/// borrow the message: they are the bytes after the tag, as they came.
#[derive(Debug)]
pub enum Event<'m> {
    /// The client opened a run-loop channel.
    Request(ChannelId),
    /// A chunk of a loop.
    Chunk {
        /// The channel.
        at: ChannelId,
        /// The chunk.
        chunk: AgenticLoopChunk,
        /// The chunk's JSON as it came.
        json: &'m [u8],
    },
    /// A loop's error; the outcome follows with the finish.
    Error {
        /// The channel.
        at: ChannelId,
        /// The error value.
        error: ErrorValue,
        /// The error's JSON as it came.
        json: &'m [u8],
    },
    /// How a run-loop channel ended.
    Outcome {
        /// The channel.
        at: ChannelId,
        /// Its ending.
        outcome: Outcome,
    },
    /// A message the receiver would disregard, or a request it would refuse.
    Malformed(Malformed),
}

/// A message the observer cannot use, and why.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Malformed {
    /// A frame its receiver would disregard (protocol §2), or a message that
    /// is not a frame at all.
    #[error(transparent)]
    Disregarded(#[from] Disregarded),
    /// A frame its receiver would end the connection for (protocol §3).
    #[error(transparent)]
    Violation(Violation),
    /// The first authorization, whose payload the receiver would reject.
    #[error("the authorization would be rejected")]
    Authorization(#[source] AuthorizationError),
    /// A client channel request that does not decode; the channel opens and
    /// the server answers it with a bare finish.
    #[error("the client's channel request on {at} did not decode")]
    ChannelRequest {
        /// The channel.
        at: ChannelId,
        /// Why it does not decode.
        #[source]
        error: ChannelRequestError,
    },
}

impl From<Fault> for Malformed {
    fn from(fault: Fault) -> Self {
        match fault {
            Fault::Disregarded(why) => Malformed::Disregarded(why),
            Fault::Violation(Violation::Rejected(error)) => Malformed::Authorization(error),
            Fault::Violation(why) => Malformed::Violation(why),
        }
    }
}

/// An open channel, as the observer follows it.
#[derive(Debug)]
enum Followed {
    /// A channel the observer does not follow.
    Other,
    /// A client run-loop channel.
    RunLoop(Reader),
}

/// Reconstructs one connection from its messages, both directions, in order.
///
/// ```
/// use runloop_proto::capture::Direction;
/// use runloop_proto::observer::{Event, Observer};
///
/// let mut observer = Observer::new();
/// let mut seen = Vec::new();
/// // The client authorizes, opens scope 1, and asks for a loop on channel 2;
/// // the server answers with a bare channel finish.
/// for (direction, message) in [
///     (Direction::ClientToServer, &b"\x00\0\0\0\0\0\0\0\0\x00"[..]),
///     (Direction::ClientToServer, b"\x01\0\0\0\x01\0\0\0\0\x00{}"),
///     (Direction::ClientToServer, b"\x04\0\0\0\x01\0\0\0\x02\x05{\"prompt\":\"hi\"}"),
///     (Direction::ServerToClient, b"\x06\0\0\0\x01\0\0\0\x02"),
/// ] {
///     observer.message(direction, message, |event| seen.push(format!("{event:?}")));
/// }
/// observer.end(|event| seen.push(format!("{event:?}")));
/// assert_eq!(seen.len(), 2);
/// assert!(seen[1].contains("NotServed"), "{seen:?}");
/// ```
#[derive(Debug)]
pub struct Observer {
    table: Table<Watching, (), Followed>,
}

impl Default for Observer {
    fn default() -> Self {
        Observer::new()
    }
}

impl Observer {
    /// An observer of a connection whose first message is still to come.
    pub fn new() -> Self {
        Observer {
            table: Table::observer(),
        }
    }

    /// One message, going `direction`; what it meant goes to `emit`, in order.
    pub fn message<'m>(
        &mut self,
        direction: Direction,
        message: &'m [u8],
        mut emit: impl FnMut(Event<'m>),
    ) {
        let result = match direction {
            Direction::ClientToServer => ClientFrame::decode(message)
                .map_err(|error| Malformed::Disregarded(error.into()))
                .and_then(|frame| self.client(frame, &mut emit)),
            Direction::ServerToClient => ServerFrame::decode(message)
                .map_err(|error| Malformed::Disregarded(error.into()))
                .and_then(|frame| self.server(frame, &mut emit)),
        };
        if let Err(malformed) = result {
            emit(Event::Malformed(malformed));
        }
    }

    /// The end of the input: every run-loop channel still open ends broken,
    /// [`Broken::InputEnded`], in the order they were opened.
    pub fn end(mut self, mut emit: impl FnMut(Event<'static>)) {
        end_all(self.table.end().channels, Broken::InputEnded, &mut emit);
    }

    fn client<'m>(
        &mut self,
        frame: ClientFrame<'m>,
        emit: &mut impl FnMut(Event<'m>),
    ) -> Result<(), Malformed> {
        match self.table.from_client(frame)? {
            FromClient::Request { scope, .. } => {
                // Whatever the server answers, the number is taken until its
                // finish: a bare one, or the run's.
                scope.open(());
            }
            FromClient::ChannelRequest { channel, payload } => {
                return channel_request(channel, payload, emit);
            }
            // Nothing the observer follows: the server's own channels.
            FromClient::Authorization(_)
            | FromClient::ChannelResponse { .. }
            | FromClient::ChannelFinished(_) => {}
        }
        Ok(())
    }

    fn server<'m>(
        &mut self,
        frame: ServerFrame<'m>,
        emit: &mut impl FnMut(Event<'m>),
    ) -> Result<(), Malformed> {
        match self.table.from_server(frame)? {
            FromServer::Finished(finished) => end_all(finished.channels, Broken::RunEnded, emit),
            FromServer::ChannelRequest { channel, .. } => {
                channel.open(Followed::Other);
            }
            FromServer::ChannelResponse {
                scope,
                channel,
                slot,
                payload,
            } => {
                if let Followed::RunLoop(reader) = slot {
                    let at = ChannelId { scope, channel };
                    // The tag was read by the reader; the JSON is what follows it.
                    let json = payload.get(1..).unwrap_or_default();
                    match reader.response(payload) {
                        Some(Step::Chunk(chunk)) => emit(Event::Chunk { at, chunk, json }),
                        Some(Step::Error(error)) => emit(Event::Error { at, error, json }),
                        Some(Step::End(outcome)) => emit(Event::Outcome { at, outcome }),
                        None => {}
                    }
                }
            }
            FromServer::ChannelFinished(Ended {
                scope,
                channel,
                slot,
                ..
            }) => {
                if let Followed::RunLoop(mut reader) = slot
                    && let Some(outcome) = reader.finish()
                {
                    let at = ChannelId { scope, channel };
                    emit(Event::Outcome { at, outcome });
                }
            }
            FromServer::Authorization(_) | FromServer::Response { .. } => {}
        }
        Ok(())
    }
}

/// A client's channel request: a run-loop channel is followed (and one
/// that does not decode too, since a bare finish answers it), every other
/// opens unfollowed, a stop is taken until its scope's finish.
fn channel_request<'m>(
    channel: NewChannel<'_, (), Followed>,
    payload: &[u8],
    emit: &mut impl FnMut(Event<'m>),
) -> Result<(), Malformed> {
    let at = ChannelId {
        scope: channel.scope(),
        channel: channel.channel(),
    };
    let request = ChannelRequest::decode(payload);
    match request {
        Ok(ChannelRequest::Stop) => {
            channel.stop();
        }
        Ok(ChannelRequest::RunLoop(_)) | Err(ChannelRequestError::RunLoop(_)) => {
            channel.open(Followed::RunLoop(Reader::new()));
            emit(Event::Request(at));
        }
        Ok(ChannelRequest::Unserved(_)) | Err(_) => {
            channel.open(Followed::Other);
        }
    }
    request
        .map(drop)
        .map_err(|error| Malformed::ChannelRequest { at, error })
}

/// Ends every run-loop channel among `channels` (in the order they were
/// opened) with `why`; a channel whose reader already ended yields nothing.
fn end_all<'m>(channels: Vec<Ended<Followed>>, why: Broken, emit: &mut impl FnMut(Event<'m>)) {
    for ended in channels {
        if let Followed::RunLoop(mut reader) = ended.slot
            && let Some(outcome) = reader.cut(why.clone())
        {
            let at = ChannelId {
                scope: ended.scope,
                channel: ended.channel,
            };
            emit(Event::Outcome { at, outcome });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error_chain::Chain;
    use Direction::{ClientToServer as C, ServerToClient as S};

    /// A message built byte by byte, independently of the crate's encoders.
    fn frame(frame_type: u8, scope: u32, channel: u32, payload: &[u8]) -> Vec<u8> {
        let mut message = vec![frame_type];
        message.extend_from_slice(&scope.to_be_bytes());
        message.extend_from_slice(&channel.to_be_bytes());
        message.extend_from_slice(payload);
        message
    }

    /// `> 00 00000000 00000000 00 74`: unbrokered credential "t".
    const AUTH: &[u8] = &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, b't'];
    const RUN_LOOP: &[u8] = b"\x05{\"prompt\":\"hi\"}";
    const TEXT: &[u8] = b"\x00{\"type\":\"assistant_text_content\",\"text\":\"Hel\"}";
    const FATAL: &[u8] = b"\x00{\"type\":\"notification\",\"is_fatal\":true,\"message\":\"x\"}";
    const ERROR: &[u8] = b"\x01{\"kind\":\"agent\",\"error\":\"down\"}";

    fn request(scope: u32) -> (Direction, Vec<u8>) {
        (C, frame(1, scope, 0, b"\x00{}"))
    }
    fn loop_request(scope: u32, channel: u32) -> (Direction, Vec<u8>) {
        (C, frame(4, scope, channel, RUN_LOOP))
    }
    fn response(scope: u32, channel: u32, payload: &[u8]) -> (Direction, Vec<u8>) {
        (S, frame(5, scope, channel, payload))
    }
    fn finish(scope: u32, channel: u32) -> (Direction, Vec<u8>) {
        (S, frame(6, scope, channel, b""))
    }
    fn scope_finish(scope: u32) -> (Direction, Vec<u8>) {
        (S, frame(3, scope, 0, b""))
    }

    /// Every event, in a short written form, including those of the end.
    fn observe(messages: &[(Direction, Vec<u8>)]) -> Vec<String> {
        let mut seen = Vec::new();
        let mut observer = Observer::new();
        for (direction, message) in messages {
            observer.message(*direction, message, |event| seen.push(show(&event)));
        }
        observer.end(|event| seen.push(show(&event)));
        seen
    }

    fn show(event: &Event<'_>) -> String {
        let at = |at: &ChannelId| format!("{}/{}", at.scope, at.channel);
        match event {
            Event::Request(id) => format!("request {}", at(id)),
            Event::Chunk {
                at: id,
                chunk,
                json,
            } => {
                assert_eq!(
                    serde_json::from_slice::<AgenticLoopChunk>(json).expect("chunk JSON"),
                    *chunk
                );
                format!("chunk {} {}", at(id), String::from_utf8_lossy(json))
            }
            Event::Error {
                at: id,
                error,
                json,
            } => {
                assert_eq!(ErrorValue::decode(json).expect("error JSON"), *error);
                format!("error {} {}", at(id), String::from_utf8_lossy(json))
            }
            Event::Outcome { at: id, outcome } => format!("outcome {} {outcome}", at(id)),
            Event::Malformed(malformed) => format!("malformed: {}", Chain(malformed)),
        }
    }

    fn opened(scope: u32, channel: u32) -> Vec<(Direction, Vec<u8>)> {
        vec![
            (C, AUTH.to_vec()),
            request(scope),
            loop_request(scope, channel),
        ]
    }

    #[test]
    fn each_ending_of_one_channel() {
        let cases: [(&[&[u8]], &str); 4] = [
            (&[TEXT, TEXT], "the loop finished"),
            (
                &[TEXT, FATAL],
                "the loop finished, but its last word was a fatal notification",
            ),
            (
                &[TEXT, ERROR],
                r#"the loop ended without finishing (partial result): {"kind":"agent","error":"down"}"#,
            ),
            (&[ERROR], r#"no loop ran: {"kind":"agent","error":"down"}"#),
        ];
        for (responses, ending) in cases {
            let mut messages = opened(1, 2);
            messages.extend(responses.iter().map(|payload| response(1, 2, payload)));
            messages.push(finish(1, 2));
            let seen = observe(&messages);
            assert_eq!(seen.first().map(String::as_str), Some("request 1/2"));
            assert_eq!(seen.len(), responses.len() + 2, "{seen:?}");
            assert_eq!(seen.last(), Some(&format!("outcome 1/2 {ending}")));
        }
        let mut bare = opened(1, 2);
        bare.push(finish(1, 2));
        assert_eq!(
            observe(&bare),
            [
                "request 1/2",
                "outcome 1/2 the proxy did not serve the loop"
            ]
        );
    }

    #[test]
    fn golden_sequence_with_raw_json() {
        let mut messages = opened(7, 0);
        messages.push(response(7, 0, TEXT));
        messages.push(response(7, 0, ERROR));
        messages.push(finish(7, 0));
        messages.push(scope_finish(7));
        assert_eq!(
            observe(&messages),
            [
                "request 7/0",
                r#"chunk 7/0 {"type":"assistant_text_content","text":"Hel"}"#,
                r#"error 7/0 {"kind":"agent","error":"down"}"#,
                r#"outcome 7/0 the loop ended without finishing (partial result): {"kind":"agent","error":"down"}"#,
            ]
        );
    }

    #[test]
    fn the_end_of_input_breaks_open_channels_in_opening_order() {
        let mut messages = opened(2, 9);
        messages.push(request(1));
        messages.push(loop_request(1, 3));
        messages.push(loop_request(2, 4));
        messages.push(response(2, 9, TEXT));
        assert_eq!(
            observe(&messages),
            [
                "request 2/9",
                "request 1/3",
                "request 2/4",
                r#"chunk 2/9 {"type":"assistant_text_content","text":"Hel"}"#,
                "outcome 2/9 broken: capture ended",
                "outcome 1/3 broken: capture ended",
                "outcome 2/4 broken: capture ended",
            ]
        );
    }

    #[test]
    fn a_scope_finish_ends_its_channels_and_only_those() {
        let mut messages = opened(1, 5);
        messages.push(loop_request(1, 1));
        messages.push(request(2));
        messages.push(loop_request(2, 5));
        messages.push(scope_finish(1));
        messages.push(response(1, 5, TEXT));
        messages.push(finish(2, 5));
        assert_eq!(
            observe(&messages),
            [
                "request 1/5",
                "request 1/1",
                "request 2/5",
                "outcome 1/5 broken: the run ended before the channel's finish",
                "outcome 1/1 broken: the run ended before the channel's finish",
                "malformed: channel response for scope 1, which is not open",
                "outcome 2/5 the proxy did not serve the loop",
            ]
        );
    }

    #[test]
    fn the_stop_channel_gets_no_finish_and_ends_with_its_scope() {
        let mut messages = opened(1, 2);
        messages.push((C, frame(4, 1, 3, b"\x00")));
        messages.push(response(1, 2, TEXT));
        messages.push(scope_finish(1));
        // The stop channel's number is free again once the scope has ended.
        messages.push(request(1));
        messages.push((C, frame(4, 1, 3, b"\x00")));
        messages.push(scope_finish(1));
        assert_eq!(
            observe(&messages),
            [
                "request 1/2",
                r#"chunk 1/2 {"type":"assistant_text_content","text":"Hel"}"#,
                "outcome 1/2 broken: the run ended before the channel's finish",
            ]
        );
    }

    #[test]
    fn channel_numbers_belong_to_their_opener() {
        let mut messages = opened(1, 2);
        // The server opens its own channel 2 and the client answers on it.
        messages.push((S, frame(4, 1, 2, b"\x09")));
        messages.push((C, frame(5, 1, 2, b"answer")));
        messages.push((C, frame(6, 1, 2, b"")));
        // The client's channel 2 is untouched by all of that.
        messages.push(response(1, 2, TEXT));
        messages.push(finish(1, 2));
        // Now the server's channel 2 is closed: answering it again is malformed.
        messages.push((C, frame(5, 1, 2, b"late")));
        assert_eq!(
            observe(&messages),
            [
                "request 1/2",
                r#"chunk 1/2 {"type":"assistant_text_content","text":"Hel"}"#,
                "outcome 1/2 the loop finished",
                "malformed: channel response for the server's channel 2 of scope 1, which is not open",
            ]
        );
    }

    #[test]
    fn a_request_naming_an_open_number_is_disregarded() {
        let mut messages = opened(1, 2);
        messages.push(request(1));
        messages.push(loop_request(1, 2));
        messages.push(response(1, 2, TEXT));
        messages.push(finish(1, 2));
        // Free again after its finish: a new loop on the same number.
        messages.push(loop_request(1, 2));
        messages.push(finish(1, 2));
        assert_eq!(
            observe(&messages),
            [
                "request 1/2",
                "malformed: request for scope 1, which is already open: disregarded",
                "malformed: channel request for the client's channel 2 of scope 1, which is already open: disregarded",
                r#"chunk 1/2 {"type":"assistant_text_content","text":"Hel"}"#,
                "outcome 1/2 the loop finished",
                "request 1/2",
                "outcome 1/2 the proxy did not serve the loop",
            ]
        );
    }

    #[test]
    fn frames_naming_what_is_not_open() {
        let messages = vec![
            (C, AUTH.to_vec()),
            (C, frame(4, 3, 1, RUN_LOOP)),
            (S, frame(2, 3, 0, b"\x00{\"id\":\"x\"}")),
            (S, frame(3, 3, 0, b"")),
            request(3),
            (S, frame(5, 3, 1, TEXT)),
            (S, frame(6, 3, 1, b"")),
            (C, frame(6, 3, 1, b"")),
        ];
        assert_eq!(
            observe(&messages),
            [
                "malformed: channel request for scope 3, which is not open",
                "malformed: response for scope 3, which is not open",
                "malformed: response finish for scope 3, which is not open",
                "malformed: channel response for the client's channel 1 of scope 3, which is not open",
                "malformed: channel response finish for the client's channel 1 of scope 3, which is not open",
                "malformed: channel response finish for the server's channel 1 of scope 3, which is not open",
            ]
        );
    }

    #[test]
    fn frames_that_are_not_frames() {
        let messages = vec![
            (C, AUTH.to_vec()),
            (C, vec![]),
            (S, vec![5, 0, 0, 0, 1, 0, 0, 0]),
            (C, frame(2, 1, 0, b"")),
            (C, frame(3, 1, 0, b"")),
            (S, frame(1, 1, 0, b"\x00{}")),
            (S, frame(7, 1, 0, b"")),
        ];
        assert_eq!(
            observe(&messages),
            [
                "malformed: frame is truncated: 0 bytes, the header alone is 9",
                "malformed: frame is truncated: 8 bytes, the header alone is 9",
                "malformed: frame type 2 is not defined for frames sent by a client",
                "malformed: frame type 3 is not defined for frames sent by a client",
                "malformed: frame type 1 is not defined for frames sent by a server",
                "malformed: frame type 7 is not defined for frames sent by a server",
            ]
        );
    }

    #[test]
    fn authorization_comes_first_and_once() {
        let messages = vec![
            request(1),
            (S, frame(3, 1, 0, b"")),
            (C, AUTH.to_vec()),
            (C, AUTH.to_vec()),
            (S, AUTH.to_vec()),
            request(1),
            loop_request(1, 1),
            finish(1, 1),
        ];
        assert_eq!(
            observe(&messages),
            [
                "malformed: the client's request came before the authorization",
                "malformed: the server's response finish came before the authorization",
                "malformed: a second authorization, from the client",
                "malformed: an authorization from the server, which did not dial",
                "request 1/1",
                "outcome 1/1 the proxy did not serve the loop",
            ]
        );
    }

    #[test]
    fn the_server_may_be_the_one_that_dialled() {
        let messages = vec![
            (S, AUTH.to_vec()),
            request(1),
            loop_request(1, 1),
            (C, AUTH.to_vec()),
            finish(1, 1),
        ];
        assert_eq!(
            observe(&messages),
            [
                "request 1/1",
                "malformed: an authorization from the client, which did not dial",
                "outcome 1/1 the proxy did not serve the loop",
            ]
        );
    }

    #[test]
    fn a_rejected_credential_is_reported_and_still_the_authorization() {
        let messages = vec![(C, frame(0, 0, 0, b"\x07")), request(1), loop_request(1, 1)];
        assert_eq!(
            observe(&messages),
            [
                "malformed: the authorization would be rejected: unknown authorization mode 7",
                "request 1/1",
                "outcome 1/1 broken: capture ended",
            ]
        );
    }

    #[test]
    fn channel_requests_that_do_not_decode() {
        let mut messages = opened(1, 1);
        // A run-loop request without a prompt: followed, and answered bare.
        messages.push((C, frame(4, 1, 2, b"\x05{}")));
        messages.push(finish(1, 2));
        // An empty channel request: reported, opened, not followed.
        messages.push((C, frame(4, 1, 3, b"")));
        messages.push(finish(1, 3));
        // An unserved channel: not followed, nothing to report.
        messages.push((C, frame(4, 1, 4, b"\x02{}")));
        messages.push(finish(1, 4));
        assert_eq!(
            observe(&messages),
            [
                "request 1/1",
                "request 1/2",
                "malformed: the client's channel request on channel 2 of scope 1 did not decode: run-loop request did not parse: missing field `prompt` at line 1 column 2",
                "outcome 1/2 the proxy did not serve the loop",
                "malformed: the client's channel request on channel 3 of scope 1 did not decode: channel request is empty",
                "outcome 1/1 broken: capture ended",
            ]
        );
    }

    #[test]
    fn a_broken_sequence_ends_once_and_its_finish_says_nothing_more() {
        let mut messages = opened(1, 1);
        messages.push(response(1, 1, ERROR));
        messages.push(response(1, 1, TEXT));
        messages.push(response(1, 1, TEXT));
        messages.push(finish(1, 1));
        let mut undecodable = opened(1, 1);
        undecodable.push(response(1, 1, b"\x02"));
        undecodable.push(finish(1, 1));
        undecodable.push(scope_finish(1));
        assert_eq!(
            observe(&messages),
            [
                "request 1/1",
                r#"error 1/1 {"kind":"agent","error":"down"}"#,
                "outcome 1/1 broken: a response came after the error",
            ]
        );
        assert_eq!(
            observe(&undecodable),
            [
                "request 1/1",
                r#"outcome 1/1 broken: a response did not decode: unknown agentic loop frame tag 2; the payload was "\x02" (1 byte)"#,
            ]
        );
    }

    #[test]
    fn an_empty_response_payload_is_broken_not_a_panic() {
        let mut messages = opened(1, 1);
        messages.push(response(1, 1, b""));
        assert_eq!(
            observe(&messages),
            [
                "request 1/1",
                "outcome 1/1 broken: a response did not decode: agentic loop frame is empty",
            ]
        );
    }

    #[test]
    fn the_scope_frames_of_the_run_itself_are_quiet() {
        let messages = vec![
            (C, AUTH.to_vec()),
            request(4),
            (S, frame(2, 4, 0, b"\x00{\"id\":\"r-1\"}")),
            (C, frame(4, 4, 0, b"\x00")),
            (S, frame(3, 4, 0, b"")),
        ];
        assert!(observe(&messages).is_empty());
    }

    /// A message that is usually a frame on a few scopes and channels, so
    /// that sequences reach deep states, and sometimes any bytes at all.
    fn any_message() -> impl proptest::strategy::Strategy<Value = (Direction, Vec<u8>)> {
        use proptest::prelude::*;
        let payload = prop_oneof![
            Just(RUN_LOOP.to_vec()),
            Just(TEXT.to_vec()),
            Just(FATAL.to_vec()),
            Just(ERROR.to_vec()),
            Just(b"\x00".to_vec()),
            Just(b"\x05{}".to_vec()),
            proptest::collection::vec(any::<u8>(), 0..12),
        ];
        let direction = prop_oneof![Just(C), Just(S)];
        prop_oneof![
            8 => (direction.clone(), 0u8..8, 0u32..3, 0u32..3, payload)
                .prop_map(|(d, t, s, c, p)| (d, frame(t, s, c, &p))),
            1 => (direction, proptest::collection::vec(any::<u8>(), 0..16)),
        ]
    }

    proptest::proptest! {
        #[test]
        fn every_run_loop_channel_ends_exactly_once_and_nothing_panics(
            messages in proptest::collection::vec(any_message(), 0..60)
        ) {
            let mut observer = Observer::new();
            observer.message(C, AUTH, |_| {});
            let mut requests = 0usize;
            let mut outcomes = 0usize;
            let mut count = |event: &Event<'_>| match event {
                Event::Request(_) => requests += 1,
                Event::Outcome { .. } => outcomes += 1,
                _ => {}
            };
            for (direction, message) in &messages {
                observer.message(*direction, message, |event| count(&event));
            }
            observer.end(|event| count(&event));
            // Every run-loop channel ends exactly once.
            proptest::prop_assert_eq!(requests, outcomes);
        }
    }
}
