//! The server's sequence machines: the [`Sender`] that cannot write a broken
//! sequence, and the [`Relay`] that turns a proxy's `/agent/run` messages
//! into a valid sequence whatever the proxy does (SPEC §7, §12).
//!
//! A run-loop channel is chunks, at most one error, then the finish. The
//! [`Sender`] makes that a matter of types: [`Sender::error`] and
//! [`Sender::finish`] consume it, so nothing can follow the error but the
//! finish, and nothing can follow the finish at all.
//!
//! ```text
//!   Sender ──chunk / raw chunk──▶ Sender
//!     │ error(self)                │ finish(self)
//!     ▼                            ▼
//!   Erred ──finish(self)──▶     Finish   (the channel response finish is due)
//! ```
//!
//! The [`Relay`] reads the first byte of each proxy message and nothing
//! else. A chunk is passed on as it came. An error is held until the path
//! ends: a clean close sends it as the last response; anything else (another
//! message, an abrupt end) is a proxy fault, and the server's own error goes
//! last instead, carrying the held one inside it so nothing is lost. An empty
//! message or an unknown tag is a fault too. An abrupt end is never passed on
//! as a finish alone, which would read as "finished" or "not served".
//!
//! ```text
//!   Relaying ──[0]…──▶ Relaying              (forward the message)
//!     │ [1]…                 │ closed (clean)      ──▶ finish
//!     ▼                      │ broke (abrupt)      ──▶ own error, finish
//!   Holding(error)           │ empty / unknown tag ──▶ own error, finish
//!     │ closed (clean)   ──▶ the held error, finish
//!     │ broke (abrupt)   ──▶ own error (with the held one), finish
//!     └ any message      ──▶ own error (with the held one), finish
//!
//!   either state: cut (the server ends the channel: run stopped, shutdown)
//!                 ──▶ the given error (with any held one), finish
//! ```

use super::AgenticLoopChunk;
use super::frame::{self, CHUNK, ERROR, FrameError, Tag};
use crate::codec::Writer;
use crate::error::Error;

/// Proof that the channel's finish is due: nothing else may be sent on it.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "the channel response finish must be sent"]
pub struct Finish(());

/// Writes the responses of one run-loop channel.
#[derive(Debug, Default)]
#[must_use = "a channel must end with finish()"]
pub struct Sender {
    chunks: u64,
}

/// A channel whose error has been written: only the finish may follow.
#[derive(Debug)]
#[must_use = "a channel must end with finish()"]
pub struct Erred(());

impl Sender {
    /// A sender for a channel whose request was just accepted.
    pub fn new() -> Self {
        Sender { chunks: 0 }
    }

    /// How many chunks were written.
    pub fn chunks(&self) -> u64 {
        self.chunks
    }

    /// Writes a chunk response payload.
    pub fn chunk(
        &mut self,
        chunk: &AgenticLoopChunk,
        out: &mut Writer<'_>,
    ) -> Result<(), serde_json::Error> {
        out.push(CHUNK);
        serde_json::to_writer(&mut *out, chunk)?;
        self.chunks += 1;
        Ok(())
    }

    /// Writes a chunk response payload around chunk JSON it does not read.
    pub fn raw_chunk(&mut self, json: &[u8], out: &mut Writer<'_>) {
        frame::encode_raw_chunk(json, out);
        self.chunks += 1;
    }

    /// Writes the error response payload; only the finish may follow.
    pub fn error(self, error: &Error, out: &mut Writer<'_>) -> Erred {
        out.push(ERROR);
        error.write_json(out);
        Erred(())
    }

    /// Ends the channel.
    pub fn finish(self) -> Finish {
        Finish(())
    }
}

impl Erred {
    /// Ends the channel.
    pub fn finish(self) -> Finish {
        Finish(())
    }
}

/// What to do with one proxy message.
#[derive(Debug)]
pub enum Relayed<M> {
    /// Send this message, as it came, as the next channel response; the
    /// relay goes on.
    Forward(Relay<M>, M),
    /// Nothing to send yet: the proxy's error is held until its path ends.
    Held(Relay<M>),
    /// The proxy broke the sequence. Send the payload written to `out` as
    /// the last channel response, then the finish, and close the path.
    Fault(Finish),
}

/// What to send when the proxy path closed cleanly.
#[derive(Debug, PartialEq, Eq)]
pub enum Closing {
    /// The finish alone.
    Finish(Finish),
    /// The payload written to `out` (the proxy's held error) as the last
    /// response, then the finish.
    ErrorThenFinish(Finish),
}

/// Relays one `/agent/run` path onto one run-loop channel.
///
/// `M` is the message type of the transport, kept whole while the proxy's
/// error is held (no copy).
#[derive(Debug)]
#[must_use = "a relay must end with closed()"]
pub struct Relay<M> {
    sender: Sender,
    held: Option<M>,
}

impl<M> Default for Relay<M> {
    fn default() -> Self {
        Relay::new()
    }
}

impl<M> Relay<M> {
    /// A relay for a path that was just opened.
    pub fn new() -> Self {
        Relay {
            sender: Sender::new(),
            held: None,
        }
    }

    /// How many chunks were forwarded.
    pub fn chunks(&self) -> u64 {
        self.sender.chunks
    }

    /// Whether a proxy error is held.
    pub fn is_holding(&self) -> bool {
        self.held.is_some()
    }
}

impl<M: AsRef<[u8]>> Relay<M> {
    /// One message from the proxy.
    pub fn message(self, message: M, out: &mut Writer<'_>) -> Relayed<M> {
        let Relay { mut sender, held } = self;
        if let Some(held) = held {
            let error = fault(
                "the proxy sent a message after its error",
                Some(held.as_ref()),
            );
            return Relayed::Fault(sender.error(&error, out).finish());
        }
        match frame::tag(message.as_ref()) {
            Ok(Tag::Chunk) => {
                sender.chunks += 1;
                Relayed::Forward(Relay { sender, held: None }, message)
            }
            Ok(Tag::Error) => Relayed::Held(Relay {
                sender,
                held: Some(message),
            }),
            Err(why) => {
                let what = match why {
                    FrameError::Empty => "the proxy sent an empty message".to_owned(),
                    other => format!("the proxy sent a message with {}", tag_words(&other)),
                };
                Relayed::Fault(sender.error(&fault(&what, None), out).finish())
            }
        }
    }

    /// The proxy closed its path cleanly: it said all it had to say. A held
    /// error is written to `out` as the last response.
    pub fn closed(self, out: &mut Writer<'_>) -> Closing {
        let Relay { sender, held } = self;
        match held {
            None => Closing::Finish(sender.finish()),
            Some(held) => {
                // Already a whole error payload: tag 1 and the proxy's JSON.
                out.extend_from_slice(held.as_ref());
                Closing::ErrorThenFinish(Erred(()).finish())
            }
        }
    }

    /// The proxy path broke (`why` says how): the loop did not finish. The
    /// server's error, with any held proxy error inside, goes to `out`.
    pub fn broke(self, why: &str, out: &mut Writer<'_>) -> Finish {
        let what = format!("the proxy path ended abruptly: {why}");
        let error = fault(&what, self.held.as_ref().map(AsRef::as_ref));
        self.sender.error(&error, out).finish()
    }

    /// The server ends the channel itself (the run stopped, the server shuts
    /// down): `error` goes to `out`, with any held proxy error inside it.
    pub fn cut(self, mut error: Error, out: &mut Writer<'_>) -> Finish {
        if let Some(held) = &self.held {
            attach_held(&mut error, held.as_ref());
        }
        self.sender.error(&error, out).finish()
    }
}

fn tag_words(why: &FrameError) -> String {
    match why {
        FrameError::UnknownTag(tag) => format!("unknown tag {tag}"),
        other => other.to_string(),
    }
}

/// The server's own error for a proxy fault, with a held proxy error inside.
fn fault(what: &str, held: Option<&[u8]>) -> Error {
    let mut error = Error::kind("proxy", what);
    if let Some(held) = held {
        attach_held(&mut error, held);
    }
    error
}

/// Puts a held proxy error (a whole `[1][JSON]` payload) inside `error` as
/// `proxy_error`: as JSON when it is JSON, as text otherwise. An error that
/// is not an object is wrapped as `{"error": …}` first, so nothing is lost.
fn attach_held(error: &mut Error, held: &[u8]) {
    let value = Error::decode_or_text(held.get(1..).unwrap_or_default()).0;
    if !error.0.is_object() {
        let previous = std::mem::take(&mut error.0);
        error.0 = serde_json::json!({ "error": previous });
    }
    if let serde_json::Value::Object(object) = &mut error.0 {
        object.insert("proxy_error".to_owned(), value);
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::run_loop::{Outcome, Reader, Step};

    const TEXT: &[u8] = b"\x00{\"type\":\"assistant_text_content\",\"text\":\"hi\"}";
    const ERROR_MSG: &[u8] = b"\x01{\"kind\":\"agent\",\"error\":\"down\"}";

    /// Runs a relay over `messages` and `end`, and returns the channel
    /// responses it produced (finish implied at the end).
    fn relay(messages: &[&[u8]], end: End) -> Vec<Vec<u8>> {
        let mut relay = Relay::new();
        let mut sent = Vec::new();
        for message in messages {
            let mut out = Vec::new();
            relay = match relay.message(*message, &mut Writer::new(&mut out)) {
                Relayed::Forward(relay, forwarded) => {
                    sent.push(forwarded.to_vec());
                    relay
                }
                Relayed::Held(relay) => {
                    assert!(out.is_empty());
                    relay
                }
                Relayed::Fault(_finish) => {
                    sent.push(out);
                    return sent;
                }
            };
        }
        let mut out = Vec::new();
        match end {
            End::Clean => match relay.closed(&mut Writer::new(&mut out)) {
                Closing::Finish(_) => assert!(out.is_empty()),
                Closing::ErrorThenFinish(_) => sent.push(out),
            },
            End::Abrupt => {
                let Finish(()) = relay.broke("reset by peer", &mut Writer::new(&mut out));
                sent.push(out);
            }
            End::Cut => {
                let Finish(()) = relay.cut(
                    Error::kind("run", "the run was stopped"),
                    &mut Writer::new(&mut out),
                );
                sent.push(out);
            }
        }
        sent
    }

    #[derive(Clone, Copy)]
    enum End {
        Clean,
        Abrupt,
        Cut,
    }

    /// Feeds a relayed sequence to the caller's reader.
    fn outcome(sent: &[Vec<u8>]) -> Outcome {
        let mut reader = Reader::new();
        for payload in sent {
            if let Some(Step::End(outcome)) = reader.response(payload) {
                return outcome;
            }
        }
        reader.finish().expect("not ended before the finish")
    }

    fn error_of(payload: &[u8]) -> serde_json::Value {
        assert_eq!(payload[0], ERROR);
        serde_json::from_slice(&payload[1..]).expect("error JSON")
    }

    #[test]
    fn sender_writes_chunk_error_finish() {
        let mut sender = Sender::new();
        let mut buf = Vec::new();
        sender.raw_chunk(b"{\"anything\":1}", &mut Writer::new(&mut buf));
        assert_eq!(buf, b"\x00{\"anything\":1}");
        buf.clear();
        let erred = sender.error(&Error::new("gone"), &mut Writer::new(&mut buf));
        assert_eq!(buf, b"\x01\"gone\"");
        let Finish(()) = erred.finish();
    }

    #[test]
    fn clean_relays() {
        assert_eq!(relay(&[TEXT, TEXT], End::Clean), [TEXT, TEXT]);
        assert_eq!(
            outcome(&relay(&[TEXT], End::Clean)),
            Outcome::Finished { fatal: false }
        );
        assert_eq!(relay(&[TEXT, ERROR_MSG], End::Clean), [TEXT, ERROR_MSG]);
        assert!(matches!(
            outcome(&relay(&[TEXT, ERROR_MSG], End::Clean)),
            Outcome::Unfinished(_)
        ));
        assert!(matches!(
            outcome(&relay(&[ERROR_MSG], End::Clean)),
            Outcome::NoLoop(_)
        ));
        assert_eq!(outcome(&relay(&[], End::Clean)), Outcome::NotServed);
    }

    #[test]
    fn chunks_are_forwarded_unread() {
        let not_json = b"\x00this is not JSON and the relay does not care";
        assert_eq!(relay(&[not_json], End::Clean), [not_json]);
    }

    #[test]
    fn abrupt_ends_get_the_servers_error() {
        for messages in [&[][..], &[TEXT][..], &[TEXT, TEXT, TEXT][..]] {
            let sent = relay(messages, End::Abrupt);
            assert_eq!(sent.len(), messages.len() + 1);
            assert_eq!(
                error_of(sent.last().expect("an error")),
                json!({"kind": "proxy", "error": "the proxy path ended abruptly: reset by peer"})
            );
            assert!(!matches!(
                outcome(&sent),
                Outcome::Finished { .. } | Outcome::NotServed
            ));
        }
    }

    #[test]
    fn abrupt_end_after_an_error_keeps_the_proxys_error_inside() {
        let sent = relay(&[TEXT, ERROR_MSG], End::Abrupt);
        assert_eq!(sent.len(), 2);
        assert_eq!(
            error_of(&sent[1]),
            json!({"kind": "proxy", "error": "the proxy path ended abruptly: reset by peer",
                "proxy_error": {"kind": "agent", "error": "down"}})
        );
        assert!(matches!(outcome(&sent), Outcome::Unfinished(_)));
    }

    #[test]
    fn faults() {
        let sent = relay(&[TEXT, b"", TEXT], End::Clean);
        assert_eq!(sent.len(), 2);
        assert_eq!(
            error_of(&sent[1])["error"],
            "the proxy sent an empty message"
        );

        let sent = relay(&[b"\x09{}"], End::Clean);
        assert_eq!(
            error_of(&sent[0])["error"],
            "the proxy sent a message with unknown tag 9"
        );
        assert!(matches!(outcome(&sent), Outcome::NoLoop(_)));

        let sent = relay(&[TEXT, ERROR_MSG, TEXT], End::Clean);
        assert_eq!(sent.len(), 2, "the held error is replaced, not sent twice");
        assert_eq!(
            error_of(&sent[1])["error"],
            "the proxy sent a message after its error"
        );
        assert_eq!(
            error_of(&sent[1])["proxy_error"],
            json!({"kind": "agent", "error": "down"})
        );
        assert!(matches!(outcome(&sent), Outcome::Unfinished(_)));
    }

    #[test]
    fn a_cut_ends_with_the_servers_error() {
        let sent = relay(&[TEXT], End::Cut);
        assert_eq!(
            error_of(&sent[1]),
            json!({"kind": "run", "error": "the run was stopped"})
        );
        assert!(matches!(outcome(&sent), Outcome::Unfinished(_)));
        let sent = relay(&[ERROR_MSG], End::Cut);
        assert_eq!(
            error_of(&sent[0]),
            json!({"kind": "run", "error": "the run was stopped",
                "proxy_error": {"kind": "agent", "error": "down"}})
        );
        assert!(matches!(outcome(&sent), Outcome::NoLoop(_)));
    }

    #[test]
    fn a_held_error_goes_inside_errors_of_any_shape() {
        let mut error = Error::new("plain");
        attach_held(&mut error, b"\x01[1]");
        assert_eq!(error.0, json!({"error": "plain", "proxy_error": [1]}));
    }

    #[test]
    fn a_held_error_that_is_not_json_is_kept_as_text() {
        let sent = relay(&[b"\x01not json"], End::Abrupt);
        assert_eq!(error_of(&sent[0])["proxy_error"], "not json");
    }
}
