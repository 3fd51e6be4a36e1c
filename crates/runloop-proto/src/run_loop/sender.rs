//! The server's sequence machines: the [`Sender`] that cannot write a broken
//! sequence, and the [`Relay`] that turns a proxy's `/agent/run` messages
//! into a valid sequence whatever the proxy does (protocol §7, §12).
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
//! else. A chunk is passed on as it came. The proxy's error is passed on as
//! it came too, at once, as the channel's last response: the channel
//! finishes and the path is closed without waiting for the proxy to close
//! it, so a proxy that says its error and then hangs cannot hold the caller.
//! Nothing after the error is read. An empty message or an unknown tag is a
//! proxy fault: the server's own error goes last. An abrupt end is never
//! passed on as a finish alone, which would read as "finished" or "not
//! served".
//!
//! ```text
//!   Relaying ──[0]…──▶ Relaying             (forward the message)
//!     │ [1]…                ──▶ that message, last; finish; close the path
//!     │ empty / unknown tag ──▶ own error, finish; close the path
//!     │ closed (clean)      ──▶ finish
//!     │ broke (abrupt)      ──▶ own error, finish
//!     └ cut (the server ends the channel: run stopped, shutdown)
//!                           ──▶ the given error, finish
//! ```

use super::AgenticLoopChunk;
use super::response::{self, CHUNK, ResponseError, Tag};
use crate::codec::Writer;
use crate::error_value::{ErrorKind, ErrorValue};

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
        response::encode_raw_chunk(json, out);
        self.chunks += 1;
    }

    /// Writes the error response payload; only the finish may follow.
    pub fn error(self, error: &ErrorValue, out: &mut Writer<'_>) -> Erred {
        error.write_tagged(out);
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
    Forward(Relay, M),
    /// The proxy's error. Send this message, as it came, as the last
    /// channel response, then the finish, and close the path: nothing after
    /// it is read.
    Last(M, Finish),
    /// The proxy broke the sequence. Send the payload written to `out` as
    /// the last channel response, then the finish, and close the path.
    Fault(Finish),
}

/// Relays one `/agent/run` path onto one run-loop channel.
#[derive(Debug, Default)]
#[must_use = "a relay must end with closed(), broke() or cut()"]
pub struct Relay {
    sender: Sender,
}

impl Relay {
    /// A relay for a path that was just opened.
    pub fn new() -> Self {
        Relay {
            sender: Sender::new(),
        }
    }

    /// How many chunks were forwarded.
    pub fn chunks(&self) -> u64 {
        self.sender.chunks
    }

    /// One message from the proxy. `M` is the transport's message type,
    /// handed back whole so a forwarded message is never copied.
    pub fn message<M: AsRef<[u8]>>(self, message: M, out: &mut Writer<'_>) -> Relayed<M> {
        let Relay { mut sender } = self;
        match response::tag(message.as_ref()) {
            Ok(Tag::Chunk) => {
                sender.chunks += 1;
                Relayed::Forward(Relay { sender }, message)
            }
            // Already a whole error payload: tag 1 and the proxy's JSON.
            Ok(Tag::Error) => Relayed::Last(message, Erred(()).finish()),
            Err(why) => {
                let what = match why {
                    ResponseError::Empty => "the proxy sent an empty message".to_owned(),
                    other => format!("the proxy sent a message with {}", tag_words(&other)),
                };
                Relayed::Fault(
                    sender
                        .error(&ErrorValue::kind(ErrorKind::Proxy, what), out)
                        .finish(),
                )
            }
        }
    }

    /// The proxy closed its path cleanly: the loop finished.
    pub fn closed(self) -> Finish {
        self.sender.finish()
    }

    /// The proxy path broke (`why` says how): the loop did not finish. The
    /// server's error goes to `out`.
    pub fn broke(self, why: &str, out: &mut Writer<'_>) -> Finish {
        let error = ErrorValue::kind(
            ErrorKind::Proxy,
            format!("the proxy path ended abruptly: {why}"),
        );
        self.sender.error(&error, out).finish()
    }

    /// The server ends the channel itself (the run stopped, the server shuts
    /// down): `error` goes to `out`.
    pub fn cut(self, error: ErrorValue, out: &mut Writer<'_>) -> Finish {
        self.sender.error(&error, out).finish()
    }
}

fn tag_words(why: &ResponseError) -> String {
    match why {
        ResponseError::UnknownTag(tag) => format!("unknown tag {tag}"),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::run_loop::{ERROR, Outcome, Reader, Step};

    const TEXT: &[u8] = b"\x00{\"type\":\"assistant_text_content\",\"text\":\"hi\"}";
    const ERROR_MSG: &[u8] = b"\x01{\"kind\":\"agent\",\"error\":\"down\"}";

    /// Runs a relay over `messages` and `end`, and returns the channel
    /// responses it produced (finish implied at the end) and how many
    /// messages it read.
    fn relay_counted(messages: &[&[u8]], end: End) -> (Vec<Vec<u8>>, usize) {
        let mut relay = Relay::new();
        let mut sent = Vec::new();
        for (read, message) in messages.iter().enumerate() {
            let mut out = Vec::new();
            relay = match relay.message(*message, &mut Writer::new(&mut out)) {
                Relayed::Forward(relay, forwarded) => {
                    sent.push(forwarded.to_vec());
                    relay
                }
                Relayed::Last(error, _finish) => {
                    assert!(out.is_empty());
                    sent.push(error.to_vec());
                    return (sent, read + 1);
                }
                Relayed::Fault(_finish) => {
                    sent.push(out);
                    return (sent, read + 1);
                }
            };
        }
        let mut out = Vec::new();
        match end {
            End::Clean => {
                let Finish(()) = relay.closed();
            }
            End::Abrupt => {
                let Finish(()) = relay.broke("reset by peer", &mut Writer::new(&mut out));
                sent.push(out);
            }
            End::Cut => {
                let Finish(()) = relay.cut(
                    ErrorValue::kind(ErrorKind::Run, "the run was stopped"),
                    &mut Writer::new(&mut out),
                );
                sent.push(out);
            }
        }
        (sent, messages.len())
    }

    fn relay(messages: &[&[u8]], end: End) -> Vec<Vec<u8>> {
        relay_counted(messages, end).0
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
        let erred = sender.error(&ErrorValue::new("gone"), &mut Writer::new(&mut buf));
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
        assert_eq!(outcome(&relay(&[], End::Clean)), Outcome::NotServed);
    }

    #[test]
    fn the_proxys_error_is_the_end_however_the_path_goes_on() {
        for end in [End::Clean, End::Abrupt, End::Cut] {
            let (sent, read) = relay_counted(&[TEXT, ERROR_MSG, TEXT, b""], end);
            assert_eq!(sent, [TEXT, ERROR_MSG], "the error as it came, last");
            assert_eq!(read, 2, "nothing after the error is read");
            assert_eq!(
                outcome(&sent),
                Outcome::Unfinished(ErrorValue::new(json!({"kind": "agent", "error": "down"})))
            );
            let (sent, read) = relay_counted(&[ERROR_MSG, ERROR_MSG], end);
            assert_eq!((sent.as_slice(), read), (&[ERROR_MSG.to_vec()][..], 1));
            assert!(matches!(outcome(&sent), Outcome::NoLoop(_)));
        }
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
    }

    #[test]
    fn a_cut_ends_with_the_servers_error() {
        let sent = relay(&[TEXT], End::Cut);
        assert_eq!(
            error_of(&sent[1]),
            json!({"kind": "run", "error": "the run was stopped"})
        );
        assert!(matches!(outcome(&sent), Outcome::Unfinished(_)));
        let sent = relay(&[], End::Cut);
        assert!(matches!(outcome(&sent), Outcome::NoLoop(_)));
    }
}
