//! The chunk vocabulary: the ten kinds of [`AgenticLoopChunk`] (protocol §8).
//!
//! A chunk is one JSON object whose `type` member names its kind; the `type`
//! string is the only thing that tells kinds apart, since three of them share
//! a shape. The MCP members (`annotations`, `_meta`, content blocks) are the
//! types of [`crate::mcp`], written from MCP's schema.
//!
//! # Why decoding is written by hand
//!
//! A derived `#[serde(tag = "type")]` or `#[serde(untagged)]` decoder first
//! buffers the whole object into serde's private content tree and then
//! deserializes the variant out of that tree: every string is copied twice
//! and every map is allocated once more than needed. This decoder instead
//! reads the first member; when it is `type` (as every encoder here and the
//! reference implementation write it) the kind is known at once and the rest
//! of the object is deserialized straight into the kind's struct, in one pass
//! over the bytes. Objects whose `type` comes later take a slower path
//! through a [`serde_json::Value`] map. Both paths reject an unknown or
//! missing `type`, and a second `type` member, and tolerate unknown members.
//!
//! This `Deserialize` is the serde path: it decides every chunk. A payload
//! that reaches [`Response::decode`](super::Response) is first offered to a
//! hand-written fast path (`scan`) that reads the usual shapes without serde
//! and gives up on anything else, so what it returns is never different.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::mcp::{Annotations, ContentBlock, Meta};

/// One piece of an agentic loop.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum AgenticLoopChunk {
    /// `assistant_reasoning`: a fragment of the model's reasoning.
    AssistantReasoning(TextChunk),
    /// `assistant_text_content`: a fragment of the model's answer.
    AssistantTextContent(TextChunk),
    /// `assistant_refusal`: a fragment of a refusal.
    AssistantRefusal(TextChunk),
    /// `assistant_tool_call`: a fragment of a tool call.
    AssistantToolCall(ToolCallChunk),
    /// `assistant_image_content`: a whole image from the model.
    AssistantImageContent(MediaChunk),
    /// `assistant_audio_content`: a whole audio clip from the model.
    AssistantAudioContent(MediaChunk),
    /// `tool_response`: the result of a tool call.
    ToolResponse(ToolResponseChunk),
    /// `user`: a queued user message that entered the conversation.
    User(UserChunk),
    /// `usage`: token counts since the previous usage chunk.
    Usage(UsageChunk),
    /// `notification`: news from the loop; fatal ones are its last word.
    Notification(NotificationChunk),
}

/// The ten kinds, by their `type` string, in the order protocol §8 lists them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChunkKind {
    /// `assistant_reasoning`
    AssistantReasoning,
    /// `assistant_text_content`
    AssistantTextContent,
    /// `assistant_refusal`
    AssistantRefusal,
    /// `assistant_tool_call`
    AssistantToolCall,
    /// `assistant_image_content`
    AssistantImageContent,
    /// `assistant_audio_content`
    AssistantAudioContent,
    /// `tool_response`
    ToolResponse,
    /// `user`
    User,
    /// `usage`
    Usage,
    /// `notification`
    Notification,
}

impl ChunkKind {
    /// Every kind, in the order protocol §8 lists them.
    pub const ALL: [ChunkKind; 10] = [
        ChunkKind::AssistantReasoning,
        ChunkKind::AssistantTextContent,
        ChunkKind::AssistantRefusal,
        ChunkKind::AssistantToolCall,
        ChunkKind::AssistantImageContent,
        ChunkKind::AssistantAudioContent,
        ChunkKind::ToolResponse,
        ChunkKind::User,
        ChunkKind::Usage,
        ChunkKind::Notification,
    ];

    /// The `type` string on the wire.
    pub fn as_str(self) -> &'static str {
        KIND_NAMES[self as usize]
    }

    /// The kind a `type` string names.
    pub fn from_name(name: &str) -> Option<ChunkKind> {
        ChunkKind::ALL
            .into_iter()
            .find(|kind| kind.as_str() == name)
    }

    /// Reads the chunk of this kind from the members after `type`.
    fn read<'de, D: Deserializer<'de>>(self, rest: D) -> Result<AgenticLoopChunk, D::Error> {
        use AgenticLoopChunk as C;
        let chunk = match self {
            ChunkKind::AssistantReasoning => C::AssistantReasoning(Deserialize::deserialize(rest)?),
            ChunkKind::AssistantTextContent => {
                C::AssistantTextContent(Deserialize::deserialize(rest)?)
            }
            ChunkKind::AssistantRefusal => C::AssistantRefusal(Deserialize::deserialize(rest)?),
            ChunkKind::AssistantToolCall => C::AssistantToolCall(Deserialize::deserialize(rest)?),
            ChunkKind::AssistantImageContent => {
                C::AssistantImageContent(Deserialize::deserialize(rest)?)
            }
            ChunkKind::AssistantAudioContent => {
                C::AssistantAudioContent(Deserialize::deserialize(rest)?)
            }
            ChunkKind::ToolResponse => C::ToolResponse(Deserialize::deserialize(rest)?),
            ChunkKind::User => C::User(Deserialize::deserialize(rest)?),
            ChunkKind::Usage => C::Usage(Deserialize::deserialize(rest)?),
            ChunkKind::Notification => C::Notification(Deserialize::deserialize(rest)?),
        };
        check_priorities(&chunk).map_err(de::Error::custom)?;
        Ok(chunk)
    }
}

/// Refuses an annotation priority that does not fit the 32-bit float MCP's
/// model keeps it in.
///
/// [`Annotations`] reads `priority` as a 64-bit number and narrows it, so a
/// number beyond the 32-bit range becomes infinity, which JSON cannot carry:
/// it would be written back as `null` and read back as no priority, and the
/// chunk would not survive its own round trip (which the `run_loop_frame`
/// fuzz target and the round-trip properties check).
pub(super) fn check_priorities(chunk: &AgenticLoopChunk) -> Result<(), &'static str> {
    use AgenticLoopChunk as C;
    let own = match chunk {
        C::AssistantReasoning(c) | C::AssistantTextContent(c) | C::AssistantRefusal(c) => {
            c.annotations.as_ref()
        }
        C::AssistantImageContent(c) | C::AssistantAudioContent(c) => c.annotations.as_ref(),
        _ => None,
    };
    let blocks = match chunk {
        C::ToolResponse(c) => &c.content[..],
        _ => &[],
    };
    let mut all = own
        .into_iter()
        .chain(blocks.iter().filter_map(|block| block.annotations()));
    if all.any(|a| a.priority.is_some_and(|p| !p.is_finite())) {
        return Err("an annotation priority does not fit a 32-bit float");
    }
    Ok(())
}

/// The `type` strings, indexed by [`ChunkKind`].
const KIND_NAMES: [&str; 10] = [
    "assistant_reasoning",
    "assistant_text_content",
    "assistant_refusal",
    "assistant_tool_call",
    "assistant_image_content",
    "assistant_audio_content",
    "tool_response",
    "user",
    "usage",
    "notification",
];

impl<'de> Deserialize<'de> for ChunkKind {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KindVisitor;
        impl Visitor<'_> for KindVisitor {
            type Value = ChunkKind;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a chunk type string")
            }

            fn visit_str<E: de::Error>(self, name: &str) -> Result<ChunkKind, E> {
                ChunkKind::from_name(name).ok_or_else(|| E::unknown_variant(name, &KIND_NAMES))
            }
        }
        deserializer.deserialize_str(KindVisitor)
    }
}

impl fmt::Display for ChunkKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A fragment of reasoning, answer text or refusal.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct TextChunk {
    /// The fragment's text.
    pub text: String,
    /// MCP text-content annotations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<Annotations>,
    /// MCP `_meta`.
    #[serde(rename = "_meta", default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<Meta>,
    /// The tool call whose sub-agent produced this; absent on the main thread.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_tool_call_id: Option<String>,
    /// Log probabilities of this fragment's tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Vec<TokenLogprob>>,
}

/// The log probability of one token.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct TokenLogprob {
    /// The token.
    pub token: String,
    /// The token's UTF-8 bytes, or `null`.
    pub bytes: Option<Vec<u8>>,
    /// Its log probability.
    pub logprob: f64,
    /// The most likely tokens at this position.
    pub top_logprobs: Vec<TopLogprob>,
}

/// One of the most likely tokens at a position.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct TopLogprob {
    /// The token.
    pub token: String,
    /// The token's UTF-8 bytes, or `null`.
    pub bytes: Option<Vec<u8>>,
    /// Its log probability, or `null`.
    pub logprob: Option<f64>,
}

/// A fragment of a tool call; fragments with the same `id` are one call.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ToolCallChunk {
    /// The call's id.
    pub id: String,
    /// The tool's name, on every fragment.
    pub name: String,
    /// A fragment of the arguments' JSON text (not JSON by itself).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
    /// MCP `_meta`.
    #[serde(rename = "_meta", default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<Meta>,
    /// The tool call whose sub-agent produced this; absent on the main thread.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_tool_call_id: Option<String>,
}

/// A whole image or audio clip.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct MediaChunk {
    /// Base64 data.
    pub data: String,
    /// The MIME type.
    #[serde(rename = "mimeType")]
    pub mime_type: String,
    /// MCP annotations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<Annotations>,
    /// MCP `_meta`.
    #[serde(rename = "_meta", default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<Meta>,
    /// The tool call whose sub-agent produced this; absent on the main thread.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_tool_call_id: Option<String>,
}

/// The result of a tool call: MCP's call-tool-result members and the call's id.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ToolResponseChunk {
    /// The id of the call this answers.
    pub id: String,
    /// MCP content blocks.
    pub content: Vec<ContentBlock>,
    /// MCP structured content.
    #[serde(
        rename = "structuredContent",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub structured_content: Option<Value>,
    /// Whether the tool failed.
    #[serde(rename = "isError", default, skip_serializing_if = "Option::is_none")]
    pub is_error: Option<bool>,
    /// MCP `_meta`.
    #[serde(rename = "_meta", default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<Meta>,
    /// The tool call whose sub-agent produced this; absent on the main thread.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_tool_call_id: Option<String>,
}

/// A queued user message that entered the conversation.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct UserChunk {
    /// The message.
    pub prompt: String,
    /// MCP `_meta`.
    #[serde(rename = "_meta", default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<Meta>,
}

/// Token counts since the previous usage chunk; the caller sums them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct UsageCounts {
    /// Tokens the model produced.
    pub completion_tokens: u64,
    /// Tokens the model read.
    pub prompt_tokens: u64,
    /// Both.
    pub total_tokens: u64,
}

/// A usage delta.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct UsageChunk {
    /// Tokens the model produced.
    pub completion_tokens: u64,
    /// Tokens the model read.
    pub prompt_tokens: u64,
    /// Both.
    pub total_tokens: u64,
    /// MCP `_meta`.
    #[serde(rename = "_meta", default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<Meta>,
}

impl UsageChunk {
    /// The three counts.
    pub fn counts(&self) -> UsageCounts {
        UsageCounts {
            completion_tokens: self.completion_tokens,
            prompt_tokens: self.prompt_tokens,
            total_tokens: self.total_tokens,
        }
    }
}

impl std::ops::AddAssign for UsageCounts {
    /// Saturating: a sum of hostile counts never wraps or panics.
    fn add_assign(&mut self, other: UsageCounts) {
        self.completion_tokens = self
            .completion_tokens
            .saturating_add(other.completion_tokens);
        self.prompt_tokens = self.prompt_tokens.saturating_add(other.prompt_tokens);
        self.total_tokens = self.total_tokens.saturating_add(other.total_tokens);
    }
}

/// News from the loop.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct NotificationChunk {
    /// A fatal notification is the loop's last word: it failed.
    pub is_fatal: bool,
    /// Any JSON; the key is required, the value may be `null`.
    #[serde(deserialize_with = "required_value")]
    pub message: Value,
    /// MCP `_meta`.
    #[serde(rename = "_meta", default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<Meta>,
}

/// Reads a [`Value`] that must be present, even as `null`.
///
/// serde treats a missing key of a field whose type can be `null` as `null`;
/// routing through this function makes the derive report the key as missing
/// instead, since a field with `deserialize_with` and no `default` is required.
fn required_value<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Value, D::Error> {
    Value::deserialize(deserializer)
}

impl AgenticLoopChunk {
    /// This chunk's kind.
    pub fn kind(&self) -> ChunkKind {
        match self {
            AgenticLoopChunk::AssistantReasoning(_) => ChunkKind::AssistantReasoning,
            AgenticLoopChunk::AssistantTextContent(_) => ChunkKind::AssistantTextContent,
            AgenticLoopChunk::AssistantRefusal(_) => ChunkKind::AssistantRefusal,
            AgenticLoopChunk::AssistantToolCall(_) => ChunkKind::AssistantToolCall,
            AgenticLoopChunk::AssistantImageContent(_) => ChunkKind::AssistantImageContent,
            AgenticLoopChunk::AssistantAudioContent(_) => ChunkKind::AssistantAudioContent,
            AgenticLoopChunk::ToolResponse(_) => ChunkKind::ToolResponse,
            AgenticLoopChunk::User(_) => ChunkKind::User,
            AgenticLoopChunk::Usage(_) => ChunkKind::Usage,
            AgenticLoopChunk::Notification(_) => ChunkKind::Notification,
        }
    }

    /// The thread this chunk belongs to: `None` for the main thread, else the
    /// id of the tool call whose sub-agent produced it.
    pub fn parent_tool_call_id(&self) -> Option<&str> {
        match self {
            AgenticLoopChunk::AssistantReasoning(c)
            | AgenticLoopChunk::AssistantTextContent(c)
            | AgenticLoopChunk::AssistantRefusal(c) => c.parent_tool_call_id.as_deref(),
            AgenticLoopChunk::AssistantToolCall(c) => c.parent_tool_call_id.as_deref(),
            AgenticLoopChunk::AssistantImageContent(c)
            | AgenticLoopChunk::AssistantAudioContent(c) => c.parent_tool_call_id.as_deref(),
            AgenticLoopChunk::ToolResponse(c) => c.parent_tool_call_id.as_deref(),
            AgenticLoopChunk::User(_)
            | AgenticLoopChunk::Usage(_)
            | AgenticLoopChunk::Notification(_) => None,
        }
    }

    /// The text members of the three text-like kinds.
    pub(crate) fn text_mut(&mut self) -> Option<&mut TextChunk> {
        match self {
            AgenticLoopChunk::AssistantReasoning(c)
            | AgenticLoopChunk::AssistantTextContent(c)
            | AgenticLoopChunk::AssistantRefusal(c) => Some(c),
            _ => None,
        }
    }

    /// Whether this is a fatal notification: the loop's last word, a failure.
    pub fn is_fatal(&self) -> bool {
        matches!(self, AgenticLoopChunk::Notification(n) if n.is_fatal)
    }
}

impl<'de> Deserialize<'de> for AgenticLoopChunk {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(ChunkVisitor)
    }
}

struct ChunkVisitor;

impl<'de> Visitor<'de> for ChunkVisitor {
    type Value = AgenticLoopChunk;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an agentic loop chunk: an object with a `type` member")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<AgenticLoopChunk, A::Error> {
        match map.next_key_seed(FirstKey)? {
            None => Err(de::Error::missing_field("type")),
            Some(FirstKeyIs::Type) => {
                let kind: ChunkKind = map.next_value()?;
                kind.read(de::value::MapAccessDeserializer::new(NoSecondType(map)))
            }
            Some(FirstKeyIs::Other(first)) => slow_path(first, map),
        }
    }
}

/// A chunk whose `type` is not its first member: gather the members, find
/// `type`, and read the rest from the gathered map.
fn slow_path<'de, A: MapAccess<'de>>(
    first: String,
    mut map: A,
) -> Result<AgenticLoopChunk, A::Error> {
    let mut members = serde_json::Map::new();
    members.insert(first, map.next_value()?);
    let mut kind = None;
    while let Some(key) = map.next_key::<String>()? {
        if key == "type" {
            if kind.is_some() {
                return Err(de::Error::duplicate_field("type"));
            }
            kind = Some(map.next_value::<ChunkKind>()?);
        } else {
            let value = map.next_value()?;
            members.insert(key, value);
        }
    }
    let kind = kind.ok_or_else(|| de::Error::missing_field("type"))?;
    kind.read(Value::Object(members)).map_err(de::Error::custom)
}

/// What the first key of a chunk object is.
enum FirstKeyIs {
    Type,
    Other(String),
}

struct FirstKey;

impl<'de> DeserializeSeed<'de> for FirstKey {
    type Value = FirstKeyIs;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<FirstKeyIs, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl Visitor<'_> for FirstKey {
    type Value = FirstKeyIs;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a member name")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<FirstKeyIs, E> {
        Ok(if key == "type" {
            FirstKeyIs::Type
        } else {
            FirstKeyIs::Other(key.to_owned())
        })
    }
}

/// The members after `type`, refusing a second `type`: two kinds in one
/// object is ambiguous, and two readers could disagree about it.
struct NoSecondType<A>(A);

impl<'de, A: MapAccess<'de>> MapAccess<'de> for NoSecondType<A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        self.0.next_key_seed(RefuseType(seed))
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        self.0.next_value_seed(seed)
    }

    fn size_hint(&self) -> Option<usize> {
        self.0.size_hint()
    }
}

/// Looks at a member name on its way to the struct's own field visitor.
struct RefuseType<K>(K);

impl<'de, K: DeserializeSeed<'de>> DeserializeSeed<'de> for RefuseType<K> {
    type Value = K::Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<K::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de, K: DeserializeSeed<'de>> Visitor<'de> for RefuseType<K> {
    type Value = K::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a member name")
    }

    fn visit_borrowed_str<E: de::Error>(self, key: &'de str) -> Result<K::Value, E> {
        if key == "type" {
            return Err(E::duplicate_field("type"));
        }
        self.0
            .deserialize(de::value::BorrowedStrDeserializer::new(key))
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<K::Value, E> {
        if key == "type" {
            return Err(E::duplicate_field("type"));
        }
        self.0.deserialize(de::value::StrDeserializer::new(key))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use serde_json::json;

    use super::*;
    use crate::mcp::Role;

    fn parse(json: &str) -> Result<AgenticLoopChunk, serde_json::Error> {
        serde_json::from_str(json)
    }

    /// One chunk of every kind with every member set.
    pub(crate) fn every_kind_full() -> Vec<AgenticLoopChunk> {
        let meta = || {
            let mut m = serde_json::Map::new();
            m.insert("trace".into(), json!("t-1"));
            Some(Meta(m))
        };
        let annotations = || {
            Some(Annotations {
                audience: Some(vec![Role::User]),
                priority: Some(0.5),
                last_modified: None,
            })
        };
        let logprobs = Some(vec![TokenLogprob {
            token: "Hel".into(),
            bytes: Some(vec![72, 101, 108]),
            logprob: -0.25,
            top_logprobs: vec![
                TopLogprob {
                    token: "Hel".into(),
                    bytes: None,
                    logprob: Some(-0.25),
                },
                TopLogprob {
                    token: "Hi".into(),
                    bytes: Some(vec![72, 105]),
                    logprob: None,
                },
            ],
        }]);
        let text = TextChunk {
            text: "Hel".into(),
            annotations: annotations(),
            meta: meta(),
            parent_tool_call_id: Some("call_1".into()),
            logprobs,
        };
        let media = MediaChunk {
            data: "aGVsbG8=".into(),
            mime_type: "image/png".into(),
            annotations: annotations(),
            meta: meta(),
            parent_tool_call_id: Some("call_2".into()),
        };
        vec![
            AgenticLoopChunk::AssistantReasoning(text.clone()),
            AgenticLoopChunk::AssistantTextContent(text.clone()),
            AgenticLoopChunk::AssistantRefusal(text),
            AgenticLoopChunk::AssistantToolCall(ToolCallChunk {
                id: "call_7".into(),
                name: "read_file".into(),
                arguments: Some("{\"path\":".into()),
                meta: meta(),
                parent_tool_call_id: Some("call_0".into()),
            }),
            AgenticLoopChunk::AssistantImageContent(media.clone()),
            AgenticLoopChunk::AssistantAudioContent(MediaChunk {
                mime_type: "audio/wav".into(),
                ..media
            }),
            AgenticLoopChunk::ToolResponse(ToolResponseChunk {
                id: "call_7".into(),
                content: vec![
                    ContentBlock::text("fn main() {}"),
                    ContentBlock::image("aGk=", "image/png"),
                ],
                structured_content: Some(json!({"lines": 1})),
                is_error: Some(false),
                meta: meta(),
                parent_tool_call_id: Some("call_0".into()),
            }),
            AgenticLoopChunk::User(UserChunk {
                prompt: "and then?".into(),
                meta: meta(),
            }),
            AgenticLoopChunk::Usage(UsageChunk {
                completion_tokens: 42,
                prompt_tokens: 1310,
                total_tokens: 1352,
                meta: meta(),
            }),
            AgenticLoopChunk::Notification(NotificationChunk {
                is_fatal: true,
                message: json!({"detail": "upstream model unavailable"}),
                meta: meta(),
            }),
        ]
    }

    /// One chunk of every kind with only the required members.
    pub(crate) fn every_kind_minimal() -> Vec<AgenticLoopChunk> {
        vec![
            AgenticLoopChunk::AssistantReasoning(TextChunk {
                text: "a".into(),
                ..TextChunk::default()
            }),
            AgenticLoopChunk::AssistantTextContent(TextChunk::default()),
            AgenticLoopChunk::AssistantRefusal(TextChunk {
                text: "no".into(),
                ..TextChunk::default()
            }),
            AgenticLoopChunk::AssistantToolCall(ToolCallChunk {
                id: "c".into(),
                name: "n".into(),
                ..ToolCallChunk::default()
            }),
            AgenticLoopChunk::AssistantImageContent(MediaChunk::default()),
            AgenticLoopChunk::AssistantAudioContent(MediaChunk::default()),
            AgenticLoopChunk::ToolResponse(ToolResponseChunk::default()),
            AgenticLoopChunk::User(UserChunk::default()),
            AgenticLoopChunk::Usage(UsageChunk::default()),
            AgenticLoopChunk::Notification(NotificationChunk::default()),
        ]
    }

    #[test]
    fn every_kind_round_trips_with_type_first() {
        for chunk in every_kind_full().into_iter().chain(every_kind_minimal()) {
            let json = serde_json::to_string(&chunk).expect("serializes");
            let expected_start = format!("{{\"type\":\"{}\"", chunk.kind());
            assert!(json.starts_with(&expected_start), "{json}");
            assert_eq!(parse(&json).expect("parses"), chunk, "{json}");
        }
    }

    #[test]
    fn every_kind_round_trips_through_value_and_type_last() {
        for chunk in every_kind_full().into_iter().chain(every_kind_minimal()) {
            let Value::Object(mut object) = serde_json::to_value(&chunk).expect("serializes")
            else {
                panic!("a chunk is an object");
            };
            let kind = object.remove("type").expect("has type");
            object.insert("type".into(), kind);
            let text = serde_json::to_string(&object).expect("serializes");
            assert_eq!(parse(&text).expect("type last parses"), chunk, "{text}");
            let value = Value::Object(object);
            assert_eq!(
                AgenticLoopChunk::deserialize(&value).expect("from a Value"),
                chunk,
                "{value}"
            );
        }
    }

    #[test]
    fn optional_members_are_not_written_when_absent() {
        let json = serde_json::to_string(&AgenticLoopChunk::AssistantTextContent(TextChunk {
            text: "Hel".into(),
            ..TextChunk::default()
        }))
        .expect("serializes");
        assert_eq!(json, r#"{"type":"assistant_text_content","text":"Hel"}"#);
        let json = serde_json::to_string(&every_kind_minimal()[6]).expect("serializes");
        assert_eq!(json, r#"{"type":"tool_response","id":"","content":[]}"#);
    }

    #[test]
    fn spec_examples_parse() {
        let examples = [
            r#"{"type":"assistant_reasoning","text":"The user wants the file first. "}"#,
            r#"{"type":"assistant_text_content","text":"Hel"}"#,
            r#"{"type":"assistant_tool_call","id":"call_7","name":"read_file","arguments":"{\"path\":"}"#,
            r#"{"type":"assistant_tool_call","id":"call_7","name":"read_file","arguments":"\"/src/main.rs\"}"}"#,
            r#"{"type":"tool_response","id":"call_7","content":[{"type":"text","text":"fn main() {}"}],"isError":false}"#,
            r#"{"type":"usage","completion_tokens":42,"prompt_tokens":1310,"total_tokens":1352}"#,
            r#"{"type":"notification","is_fatal":true,"message":"upstream model unavailable"}"#,
        ];
        for example in examples {
            let chunk = parse(example).expect(example);
            assert_eq!(serde_json::to_string(&chunk).expect("serializes"), example);
        }
    }

    #[test]
    fn unknown_or_missing_type_does_not_parse() {
        let unknown = parse(r#"{"type":"assistant_thought","text":"x"}"#).expect_err("unknown");
        assert!(
            unknown
                .to_string()
                .contains("unknown variant `assistant_thought`"),
            "{unknown}"
        );
        let missing = parse(r#"{"text":"x"}"#).expect_err("missing");
        assert!(
            missing.to_string().contains("missing field `type`"),
            "{missing}"
        );
        let empty = parse("{}").expect_err("empty object");
        assert!(
            empty.to_string().contains("missing field `type`"),
            "{empty}"
        );
        for not_object in ["[]", "\"text\"", "null", "1"] {
            assert!(parse(not_object).is_err(), "{not_object}");
        }
        let not_string = parse(r#"{"type":5}"#).expect_err("type not a string");
        assert!(
            not_string
                .to_string()
                .starts_with("invalid type: integer `5`, expected a chunk type"),
            "{not_string}"
        );
    }

    #[test]
    fn a_second_type_is_refused_on_both_paths() {
        let first = parse(r#"{"type":"usage","completion_tokens":1,"prompt_tokens":1,"total_tokens":2,"type":"user"}"#)
            .expect_err("duplicate");
        assert!(
            first.to_string().contains("duplicate field `type`"),
            "{first}"
        );
        let later = parse(r#"{"prompt":"p","type":"user","type":"user"}"#).expect_err("duplicate");
        assert!(
            later.to_string().contains("duplicate field `type`"),
            "{later}"
        );
    }

    #[test]
    fn unknown_members_are_tolerated() {
        let chunk = parse(r#"{"type":"user","prompt":"p","extra":{"deep":[1,2]},"more":null}"#)
            .expect("extra members");
        assert_eq!(
            chunk,
            AgenticLoopChunk::User(UserChunk {
                prompt: "p".into(),
                meta: None
            })
        );
        let chunk = parse(r#"{"extra":1,"type":"user","prompt":"p"}"#).expect("slow path too");
        assert_eq!(
            chunk,
            AgenticLoopChunk::User(UserChunk {
                prompt: "p".into(),
                meta: None
            })
        );
    }

    #[test]
    fn required_members_are_required() {
        for bad in [
            r#"{"type":"assistant_text_content"}"#,
            r#"{"type":"assistant_tool_call","id":"c"}"#,
            r#"{"type":"assistant_image_content","data":"x"}"#,
            r#"{"type":"tool_response","id":"c"}"#,
            r#"{"type":"user"}"#,
            r#"{"type":"usage","completion_tokens":1,"prompt_tokens":1}"#,
            r#"{"type":"notification","is_fatal":false}"#,
            r#"{"type":"notification","message":null}"#,
            r#"{"type":"usage","completion_tokens":-1,"prompt_tokens":1,"total_tokens":0}"#,
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        let null_message = parse(r#"{"type":"notification","is_fatal":false,"message":null}"#)
            .expect("null message is allowed");
        assert!(!null_message.is_fatal());
    }

    #[test]
    fn a_priority_beyond_f32_is_refused_on_both_paths() {
        for json in [
            r#"{"type":"assistant_text_content","text":"a","annotations":{"priority":1e40}}"#,
            r#"{"annotations":{"priority":-1e39},"type":"assistant_image_content","data":"","mimeType":""}"#,
            r#"{"type":"tool_response","id":"c","content":[{"type":"text","text":"t","annotations":{"priority":4e38}}]}"#,
        ] {
            let error = parse(json).expect_err(json);
            assert!(
                error
                    .to_string()
                    .starts_with("an annotation priority does not fit a 32-bit float"),
                "{error}"
            );
        }
        // The largest 32-bit float is fine, and survives its round trip.
        let largest = parse(
            r#"{"type":"assistant_refusal","text":"a","annotations":{"priority":3.4028235e38}}"#,
        )
        .expect("f32::MAX fits");
        let again = parse(&serde_json::to_string(&largest).expect("serializes")).expect("parses");
        assert_eq!(again, largest);
    }

    #[test]
    fn threads_and_fatality() {
        let full = every_kind_full();
        let parents: Vec<_> = full
            .iter()
            .map(AgenticLoopChunk::parent_tool_call_id)
            .collect();
        assert_eq!(
            parents,
            [
                Some("call_1"),
                Some("call_1"),
                Some("call_1"),
                Some("call_0"),
                Some("call_2"),
                Some("call_2"),
                Some("call_0"),
                None,
                None,
                None
            ]
        );
        assert!(full[9].is_fatal());
        assert!(!every_kind_minimal()[9].is_fatal());
    }

    #[test]
    fn kinds_match_their_names() {
        for ((kind, chunk), name) in ChunkKind::ALL
            .iter()
            .zip(every_kind_minimal())
            .zip(KIND_NAMES)
        {
            assert_eq!(*kind, chunk.kind());
            assert_eq!(kind.as_str(), name);
            let parsed: ChunkKind =
                serde_json::from_value(json!(kind.as_str())).expect("kind name parses");
            assert_eq!(parsed, *kind);
        }
    }
}
