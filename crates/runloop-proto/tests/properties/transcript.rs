//! The [`Transcript`]: merging never loses, reorders or invents anything.
//!
//! Loops are drawn from a small set of threads and call ids so that merges
//! happen constantly: adjacent fragments, interleaved parallel calls, the
//! same id on two threads.

use std::collections::HashMap;

use proptest::prelude::*;
use runloop_proto::run_loop::{
    AgenticLoopChunk, ChunkKind, TextChunk, TokenLogprob, ToolCallChunk, Transcript, UsageChunk,
};

use crate::strategy;

fn thread() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        2 => Just(None),
        1 => Just(Some("call_a".to_owned())),
        1 => Just(Some("call_b".to_owned())),
    ]
}

fn fragment() -> impl Strategy<Value = TextChunk> {
    (
        strategy::text_up_to(4),
        thread(),
        strategy::logprobs(),
        strategy::meta(),
    )
        .prop_map(|(text, parent_tool_call_id, logprobs, meta)| TextChunk {
            text,
            parent_tool_call_id,
            logprobs,
            meta,
            annotations: None,
        })
}

/// A loop's chunk, mostly of the kinds that merge.
fn chunk() -> impl Strategy<Value = AgenticLoopChunk> {
    use AgenticLoopChunk as C;
    let call = (
        prop_oneof![Just("c1"), Just("c2"), Just("c3")],
        prop::option::of(strategy::text_up_to(4)),
        thread(),
    )
        .prop_map(|(id, arguments, parent_tool_call_id)| {
            C::AssistantToolCall(ToolCallChunk {
                id: id.to_owned(),
                name: "tool".to_owned(),
                arguments,
                meta: None,
                parent_tool_call_id,
            })
        });
    prop_oneof![
        3 => fragment().prop_map(C::AssistantTextContent),
        2 => fragment().prop_map(C::AssistantReasoning),
        1 => fragment().prop_map(C::AssistantRefusal),
        3 => call,
        1 => any::<u64>().prop_map(|n| C::Usage(UsageChunk {
            completion_tokens: n,
            ..UsageChunk::default()
        })),
        1 => strategy::chunk(),
    ]
}

fn text_of(chunk: &AgenticLoopChunk) -> Option<&TextChunk> {
    match chunk {
        AgenticLoopChunk::AssistantReasoning(c)
        | AgenticLoopChunk::AssistantTextContent(c)
        | AgenticLoopChunk::AssistantRefusal(c) => Some(c),
        _ => None,
    }
}

type TextKey = (ChunkKind, Option<String>);

/// Text and logprobs concatenated per (kind, thread), in order.
fn texts(chunks: &[AgenticLoopChunk]) -> HashMap<TextKey, (String, Vec<TokenLogprob>)> {
    let mut texts: HashMap<TextKey, (String, Vec<TokenLogprob>)> = HashMap::new();
    for chunk in chunks {
        if let Some(c) = text_of(chunk) {
            let entry = texts
                .entry((chunk.kind(), c.parent_tool_call_id.clone()))
                .or_default();
            entry.0.push_str(&c.text);
            entry.1.extend(c.logprobs.iter().flatten().cloned());
        }
    }
    texts
}

type CallKey = (Option<String>, String);

/// Arguments concatenated per (thread, id), in order; `None` when no
/// fragment carried any.
fn calls(chunks: &[AgenticLoopChunk]) -> HashMap<CallKey, Vec<Option<String>>> {
    let mut calls: HashMap<CallKey, Vec<Option<String>>> = HashMap::new();
    for chunk in chunks {
        if let AgenticLoopChunk::AssistantToolCall(c) = chunk {
            calls
                .entry((c.parent_tool_call_id.clone(), c.id.clone()))
                .or_default()
                .push(c.arguments.clone());
        }
    }
    calls
}

fn joined(fragments: &[Option<String>]) -> Option<String> {
    let present: Vec<&str> = fragments.iter().flatten().map(String::as_str).collect();
    (!present.is_empty()).then(|| present.concat())
}

fn is_merged_kind(chunk: &AgenticLoopChunk) -> bool {
    text_of(chunk).is_some() || matches!(chunk, AgenticLoopChunk::AssistantToolCall(_))
}

proptest! {
    /// Per (kind, thread), the transcript's text and logprobs are the
    /// input's, concatenated in order; per (thread, id) there is one call
    /// whose arguments are the fragments' in order; every other chunk is
    /// kept, in order; and no two adjacent text chunks could still merge.
    #[test]
    fn merging_loses_nothing(input in prop::collection::vec(chunk(), 0..24)) {
        let transcript: Transcript = input.iter().cloned().collect();
        let merged = transcript.chunks();

        prop_assert_eq!(texts(merged), texts(&input));

        let merged_calls = calls(merged);
        let input_calls = calls(&input);
        prop_assert_eq!(merged_calls.len(), input_calls.len());
        for (key, fragments) in &input_calls {
            let merged_fragments = &merged_calls.get(key).expect("every call is kept");
            prop_assert_eq!(merged_fragments.len(), 1, "one call per (thread, id): {:?}", key);
            prop_assert_eq!(&merged_fragments[0], &joined(fragments), "{:?}", key);
        }

        let others = |chunks: &[AgenticLoopChunk]| -> Vec<AgenticLoopChunk> {
            chunks.iter().filter(|c| !is_merged_kind(c)).cloned().collect()
        };
        prop_assert_eq!(others(merged), others(&input));

        for pair in merged.windows(2) {
            let same_place = pair[0].kind() == pair[1].kind()
                && pair[0].parent_tool_call_id() == pair[1].parent_tool_call_id();
            prop_assert!(
                !(same_place && text_of(&pair[0]).is_some()),
                "adjacent {} fragments on one thread were left unmerged",
                pair[0].kind()
            );
        }
        prop_assert!(merged.len() <= input.len());
    }
}
