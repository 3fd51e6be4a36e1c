//! The advice shown when `run` received a chunk payload that did not parse.
//!
//! The outcome line already quotes the payload (the reader keeps the first
//! one that did not decode, escaped and cut short, with its length), so a
//! person sees what came; this note says what should have come. An agent
//! that ends its stream with `data: [DONE]`, or writes plain text, is the
//! usual cause, so the note says how a loop ends instead.

use runloop_proto::run_loop::{Broken, Outcome, ResponseError};

/// The note for an `outcome` that broke on a chunk that did not parse, with
/// its line break; none for any other outcome.
pub fn note(outcome: &Outcome) -> Option<String> {
    let Outcome::Broken(Broken::Undecodable(why)) = outcome else {
        return None;
    };
    if !matches!(why.error(), ResponseError::Chunk(_)) {
        return None;
    }
    Some(
        "each data event must be one chunk, a JSON object with a \"type\"; the end \
         of the stream ends the loop, so no end marker such as [DONE] is sent \
         (docs/agents.md)\n"
            .to_owned(),
    )
}

#[cfg(test)]
mod tests {
    use runloop_proto::run_loop::Reader;

    use super::*;

    #[test]
    fn only_a_chunk_that_did_not_parse_has_the_note() {
        let mut reader = Reader::new();
        let broken = reader.response(b"\x00[DONE]");
        let Some(runloop_proto::run_loop::Step::End(outcome)) = broken else {
            panic!("[DONE] breaks the loop: {broken:?}")
        };
        let advice = note(&outcome).expect("a note");
        assert!(
            advice.starts_with("each data event must be one chunk"),
            "{advice}"
        );
        let mut reader = Reader::new();
        let Some(runloop_proto::run_loop::Step::End(tag)) = reader.response(b"\x07") else {
            panic!("tag 7 breaks the loop")
        };
        assert_eq!(note(&tag), None);
        assert_eq!(note(&Outcome::NotServed), None);
    }
}
