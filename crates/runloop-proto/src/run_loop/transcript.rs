//! The transcript: a loop's chunks with their fragments merged (protocol §11).
//!
//! Text, reasoning and refusals stream in fragments that belong together only
//! when they are adjacent: a fragment merges into the chunk right before it
//! when that chunk is the same kind on the same thread. Tool calls stream in
//! fragments that may interleave with other calls running in parallel, so a
//! fragment merges into the latest call with the same id on the same thread,
//! wherever it is. Nothing ever merges across threads (`parent_tool_call_id`
//! must be equal). Everything else is appended as it came; usage is not
//! summed here, since each usage chunk is a delta the caller sums.

use std::collections::HashMap;

use super::AgenticLoopChunk;

/// A coalesced loop.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Transcript {
    chunks: Vec<AgenticLoopChunk>,
    /// Where each tool call lives, by (thread, id).
    calls: HashMap<(Option<String>, String), usize>,
}

/// A transcript is written as the JSON array of its merged chunks, so a
/// caller prints it with `serde_json` as it is.
impl serde::Serialize for Transcript {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.chunks.serialize(serializer)
    }
}

impl Transcript {
    /// An empty transcript.
    pub fn new() -> Self {
        Transcript::default()
    }

    /// The merged chunks, in order.
    pub fn chunks(&self) -> &[AgenticLoopChunk] {
        &self.chunks
    }

    /// The merged chunks, in order.
    pub fn into_chunks(self) -> Vec<AgenticLoopChunk> {
        self.chunks
    }

    /// Adds the next chunk of the loop, and says where it went: the index in
    /// [`chunks`](Transcript::chunks) of the chunk that now holds it. An
    /// index equal to the length before the push means a new chunk; a
    /// smaller one, a fragment merged into an earlier chunk. A live view
    /// can follow the loop from that alone, without repeating the rules.
    pub fn push(&mut self, chunk: AgenticLoopChunk) -> usize {
        match self.merge(&chunk) {
            Some(at) => at,
            None => self.append(chunk),
        }
    }

    /// [`push`](Transcript::push) for a chunk the caller keeps: it is
    /// copied only when it starts a chunk of its own. A fragment that
    /// merges (most of a streamed loop) is read, not copied.
    pub fn push_ref(&mut self, chunk: &AgenticLoopChunk) -> usize {
        match self.merge(chunk) {
            Some(at) => at,
            None => self.append(chunk.clone()),
        }
    }

    /// Merges `next` into the chunk it continues, if there is one: a
    /// text-like fragment into the chunk right before it when that chunk
    /// is the same kind on the same thread, a tool call's fragment into
    /// the latest call with its id on its thread. `None`: it starts a
    /// chunk of its own.
    fn merge(&mut self, next: &AgenticLoopChunk) -> Option<usize> {
        use AgenticLoopChunk as C;
        match next {
            C::AssistantReasoning(fragment)
            | C::AssistantTextContent(fragment)
            | C::AssistantRefusal(fragment) => {
                let last = self.chunks.len().checked_sub(1)?;
                let previous = self.chunks.get_mut(last)?;
                if previous.kind() != next.kind()
                    || previous.parent_tool_call_id() != next.parent_tool_call_id()
                {
                    return None;
                }
                let into = previous.text_mut()?;
                into.text.push_str(&fragment.text);
                if let Some(logprobs) = &fragment.logprobs {
                    into.logprobs
                        .get_or_insert_with(Vec::new)
                        .extend_from_slice(logprobs);
                }
                Some(last)
            }
            C::AssistantToolCall(fragment) => {
                let key = (fragment.parent_tool_call_id.clone(), fragment.id.clone());
                let at = *self.calls.get(&key)?;
                let Some(C::AssistantToolCall(call)) = self.chunks.get_mut(at) else {
                    return None;
                };
                if let Some(arguments) = &fragment.arguments {
                    call.arguments
                        .get_or_insert_with(String::new)
                        .push_str(arguments);
                }
                Some(at)
            }
            _ => None,
        }
    }

    /// Appends a new chunk (a tool call is then where its fragments go);
    /// its index.
    fn append(&mut self, chunk: AgenticLoopChunk) -> usize {
        let at = self.chunks.len();
        if let AgenticLoopChunk::AssistantToolCall(call) = &chunk {
            self.calls
                .insert((call.parent_tool_call_id.clone(), call.id.clone()), at);
        }
        self.chunks.push(chunk);
        at
    }
}

impl Extend<AgenticLoopChunk> for Transcript {
    fn extend<I: IntoIterator<Item = AgenticLoopChunk>>(&mut self, chunks: I) {
        for chunk in chunks {
            self.push(chunk);
        }
    }
}

impl FromIterator<AgenticLoopChunk> for Transcript {
    fn from_iter<I: IntoIterator<Item = AgenticLoopChunk>>(chunks: I) -> Self {
        let mut transcript = Transcript::new();
        transcript.extend(chunks);
        transcript
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run_loop::{TextChunk, TokenLogprob, ToolCallChunk, UsageChunk};

    #[test]
    fn a_transcript_serializes_as_its_merged_chunks() {
        let transcript: Transcript = [
            AgenticLoopChunk::AssistantTextContent(text("Hel", None)),
            AgenticLoopChunk::AssistantTextContent(text("lo", None)),
        ]
        .into_iter()
        .collect();
        assert_eq!(
            serde_json::to_string(&transcript).expect("serializes"),
            r#"[{"type":"assistant_text_content","text":"Hello"}]"#
        );
    }

    fn text(s: &str, parent: Option<&str>) -> TextChunk {
        TextChunk {
            text: s.into(),
            parent_tool_call_id: parent.map(Into::into),
            ..TextChunk::default()
        }
    }

    fn call(id: &str, args: Option<&str>, parent: Option<&str>) -> AgenticLoopChunk {
        AgenticLoopChunk::AssistantToolCall(ToolCallChunk {
            id: id.into(),
            name: "tool".into(),
            arguments: args.map(Into::into),
            meta: None,
            parent_tool_call_id: parent.map(Into::into),
        })
    }

    #[test]
    fn adjacent_text_of_one_kind_merges() {
        let t: Transcript = [
            AgenticLoopChunk::AssistantTextContent(text("Hel", None)),
            AgenticLoopChunk::AssistantTextContent(text("lo", None)),
            AgenticLoopChunk::AssistantReasoning(text("hmm", None)),
            AgenticLoopChunk::AssistantTextContent(text("!", None)),
        ]
        .into_iter()
        .collect();
        assert_eq!(
            t.chunks(),
            [
                AgenticLoopChunk::AssistantTextContent(text("Hello", None)),
                AgenticLoopChunk::AssistantReasoning(text("hmm", None)),
                AgenticLoopChunk::AssistantTextContent(text("!", None)),
            ]
        );
    }

    #[test]
    fn text_never_merges_across_threads() {
        let t: Transcript = [
            AgenticLoopChunk::AssistantTextContent(text("a", None)),
            AgenticLoopChunk::AssistantTextContent(text("b", Some("call_1"))),
            AgenticLoopChunk::AssistantTextContent(text("c", Some("call_1"))),
        ]
        .into_iter()
        .collect();
        assert_eq!(
            t.chunks(),
            [
                AgenticLoopChunk::AssistantTextContent(text("a", None)),
                AgenticLoopChunk::AssistantTextContent(text("bc", Some("call_1"))),
            ]
        );
    }

    #[test]
    fn the_first_fragments_members_win_and_logprobs_append() {
        let logprob = |token: &str| TokenLogprob {
            token: token.into(),
            ..TokenLogprob::default()
        };
        let mut first = text("a", None);
        first.logprobs = Some(vec![logprob("a")]);
        let mut second = text("b", None);
        second.logprobs = Some(vec![logprob("b")]);
        second.meta = Some(crate::mcp::Meta::new());
        let t: Transcript = [
            AgenticLoopChunk::AssistantRefusal(first),
            AgenticLoopChunk::AssistantRefusal(second),
        ]
        .into_iter()
        .collect();
        let mut expected = text("ab", None);
        expected.logprobs = Some(vec![logprob("a"), logprob("b")]);
        assert_eq!(t.chunks(), [AgenticLoopChunk::AssistantRefusal(expected)]);
    }

    #[test]
    fn interleaved_tool_calls_merge_by_id() {
        let t: Transcript = [
            call("a", Some("{\"x\":"), None),
            call("b", Some("{\"y\":"), None),
            AgenticLoopChunk::Usage(UsageChunk::default()),
            call("a", Some("1}"), None),
            call("b", None, None),
            call("b", Some("2}"), None),
            call("a", Some("?"), Some("call_z")),
        ]
        .into_iter()
        .collect();
        assert_eq!(
            t.chunks(),
            [
                call("a", Some("{\"x\":1}"), None),
                call("b", Some("{\"y\":2}"), None),
                AgenticLoopChunk::Usage(UsageChunk::default()),
                call("a", Some("?"), Some("call_z")),
            ]
        );
    }

    #[test]
    fn a_call_without_arguments_gains_them() {
        let t: Transcript = [call("a", None, None), call("a", Some("{}"), None)]
            .into_iter()
            .collect();
        assert_eq!(t.chunks(), [call("a", Some("{}"), None)]);
    }

    #[test]
    fn push_says_where_each_chunk_went() {
        let mut t = Transcript::new();
        let places: Vec<usize> = [
            AgenticLoopChunk::AssistantTextContent(text("Hel", None)),
            AgenticLoopChunk::AssistantTextContent(text("lo", None)),
            call("a", Some("{"), None),
            call("b", None, None),
            call("a", Some("}"), None),
            AgenticLoopChunk::AssistantTextContent(text("!", None)),
            AgenticLoopChunk::AssistantTextContent(text("?", None)),
        ]
        .into_iter()
        .map(|chunk| t.push(chunk))
        .collect();
        assert_eq!(places, [0, 0, 1, 2, 1, 3, 3]);
        assert_eq!(t.chunks().len(), 4);
    }

    #[test]
    fn push_ref_coalesces_as_push_does() {
        let mut reasoned = text("hm", None);
        reasoned.logprobs = Some(vec![TokenLogprob {
            token: "hm".into(),
            ..TokenLogprob::default()
        }]);
        let sequence = [
            AgenticLoopChunk::AssistantTextContent(text("Hel", None)),
            AgenticLoopChunk::AssistantTextContent(text("lo", None)),
            call("a", Some("{"), None),
            AgenticLoopChunk::AssistantReasoning(reasoned.clone()),
            AgenticLoopChunk::AssistantReasoning(reasoned),
            call("b", None, Some("call_z")),
            call("a", Some("}"), None),
            call("b", Some("[]"), Some("call_z")),
            AgenticLoopChunk::Usage(UsageChunk::default()),
            AgenticLoopChunk::AssistantTextContent(text("!", Some("call_z"))),
            AgenticLoopChunk::AssistantTextContent(text("?", Some("call_z"))),
        ];
        let (mut owned, mut borrowed) = (Transcript::new(), Transcript::new());
        for chunk in sequence {
            assert_eq!(borrowed.push_ref(&chunk), owned.push(chunk));
        }
        assert_eq!(borrowed, owned);
        assert_eq!(owned.chunks().len(), 6);
    }

    #[test]
    fn other_kinds_are_appended_not_summed() {
        let usage = AgenticLoopChunk::Usage(UsageChunk {
            completion_tokens: 1,
            prompt_tokens: 2,
            total_tokens: 3,
            meta: None,
        });
        let t: Transcript = [usage.clone(), usage.clone()].into_iter().collect();
        assert_eq!(t.chunks(), [usage.clone(), usage]);
    }
}
