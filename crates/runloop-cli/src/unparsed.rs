//! The start of the last chunk payload `run` received, kept so that a
//! chunk which does not parse is shown, not only the parser's complaint.
//!
//! The client library reports such a chunk as the loop's break, with the
//! JSON error the protocol fixes (`agentic loop chunk did not parse: invalid
//! type: sequence…`), which does not say what came. An agent that ends its
//! stream with `data: [DONE]`, or writes plain text, is the usual cause;
//! this note shows the bytes, escaped and cut short, and says how a loop
//! ends instead. The payload is seen through the client's tap, where every
//! frame passes; `run` has one loop per connection, so the last channel
//! response is the one that broke it.

use std::sync::{Arc, Mutex};

use runloop_proto::frame::{FrameType, HEADER_LEN, Role};
use runloop_proto::run_loop::{Broken, Outcome, ResponseError};

/// Bytes of a payload kept and shown at most.
pub const SHOWN: usize = 64;

/// The last channel response's payload after its tag: its first [`SHOWN`]
/// bytes and its length.
#[derive(Debug, Default)]
pub struct LastChunk(Mutex<(Vec<u8>, usize)>);

impl LastChunk {
    /// A tap that keeps the server's channel responses' starts.
    pub fn tap(self: &Arc<Self>) -> runloop::client::Tap {
        let last = Arc::clone(self);
        Arc::new(move |sender, message: &[u8]| {
            let channel_response = message.first() == Some(&(FrameType::ChannelResponse as u8));
            if sender != Role::Server || !channel_response {
                return;
            }
            let json = message.get(HEADER_LEN + 1..).unwrap_or_default();
            let mut kept = last
                .0
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            kept.0.clear();
            kept.0.extend_from_slice(&json[..json.len().min(SHOWN)]);
            kept.1 = json.len();
        })
    }

    /// The note for an `outcome` that broke on a chunk that did not parse,
    /// with its line break; none for any other outcome.
    pub fn note(&self, outcome: &Outcome) -> Option<String> {
        let Outcome::Broken(Broken::Undecodable(why)) = outcome else {
            return None;
        };
        if !matches!(why.error(), ResponseError::Chunk(_)) {
            return None;
        }
        let kept = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        Some(describe(&kept.0, kept.1))
    }
}

/// What the note says about a payload whose first bytes are `start`, of
/// `length` bytes in all.
fn describe(start: &[u8], length: usize) -> String {
    let cut = if length > start.len() { "…" } else { "" };
    format!(
        "the chunk that did not parse was \"{}{cut}\" ({length} bytes): each data \
         event must be one chunk, a JSON object with a \"type\"; the end of the \
         stream ends the loop, so no end marker such as [DONE] is sent \
         (docs/agents.md)\n",
        start.escape_ascii()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bytes_are_escaped_and_cut_short() {
        let note = describe(b"[DONE]", 6);
        assert!(
            note.starts_with("the chunk that did not parse was \"[DONE]\" (6 bytes): "),
            "{note}"
        );
        let long = "é\n\"".repeat(40);
        let start = &long.as_bytes()[..SHOWN];
        let note = describe(start, long.len());
        assert!(
            note.starts_with(
                "the chunk that did not parse was \"\\xc3\\xa9\\n\\\"\\xc3\\xa9\\n\\\""
            ),
            "{note}"
        );
        assert!(note.contains("…\" (160 bytes)"), "{note}");
    }
}
