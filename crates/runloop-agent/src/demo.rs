//! The demo agent: a deterministic loop that shows every chunk kind a real
//! model loop produces, and every way a loop can end, with no model behind
//! it.
//!
//! It "reads" the prompt with a `word_count` tool and echoes it back, so
//! the same prompt always gives the same loop:
//!
//! ```text
//! assistant_reasoning      the plan, a few words per delta
//! assistant_tool_call      word_count({"text": <prompt>}), arguments in fragments
//! tool_response            "<w> words, <c> characters" + structuredContent
//! notification             non-fatal: the tool is done
//! assistant_text_content   the prompt read back, one word per delta
//! usage                    prompt_tokens = words, completion_tokens = deltas
//! ```
//!
//! Every chunk carries `_meta: {"runloop/seq": n}`, its index in the loop
//! from 0, so a soak test can check order and loss end to end.
//!
//! A loop is made as it is read: the answer, one chunk per word, comes
//! from one copy of the prompt as the stream is polled, so a prompt of
//! millions of words costs the demo a few copies of the prompt, not a
//! chunk object per word held at once. A `demo:load` chunk is made as it
//! is read too, and whatever its size it holds no text of its own: the
//! agent program sends it as pieces of its JSON
//! ([`Agent::run_loop_json`]), a small head, slices of one `static` run of
//! letters, and a small tail with `_meta`. A loop whose caller stops
//! reading then holds a few slice handles per chunk, not the chunk's
//! SIZE bytes (the demo runs in the server's own process as its default
//! agent). [`Agent::run_loop`] still yields the same chunks, typed.
//!
//! Keywords in the prompt (whole words) show the other endings:
//!
//! | keyword            | the loop                                                        |
//! |--------------------|-----------------------------------------------------------------|
//! | `demo:fatal`       | ends with a fatal notification (finished, but failed)           |
//! | `demo:break`       | breaks mid-loop: chunks, then the SSE stream is cut             |
//! | `demo:refuse`      | refused before any chunk: 503 with a JSON body (no loop)        |
//! | `demo:refuse-text` | refused before any chunk: 500 with a text body (no loop)        |
//! | `demo:load=N`      | N text chunks of 64 bytes, unpaced (load tests)                 |
//! | `demo:load=NxSIZE` | N text chunks of SIZE bytes, unpaced                            |
//! | `demo:pace=MS`     | waits MS milliseconds before each chunk                         |
//!
//! A registration whose `agent` is the string `"demo:refuse"` is refused
//! (403, JSON), so the registration failure can be seen too.

use std::time::Duration;

use axum::body::Bytes;
use axum::http::StatusCode;
use futures_util::future::{self, BoxFuture};
use futures_util::stream::{self, StreamExt};
use runloop_proto::mcp::{ContentBlock, Meta};
use runloop_proto::run_loop::{
    AgenticLoopChunk, NotificationChunk, RunLoopRequest, TextChunk, ToolCallChunk,
    ToolResponseChunk, UsageChunk,
};
use serde_json::{Value, json};

use super::{Agent, Break, ChunkJson, ChunkJsonStream, ChunkStream, Refusal};

/// The `_meta` key that numbers every chunk of a demo loop.
pub const SEQ: &str = "runloop/seq";

/// The largest text a `demo:load` chunk may carry (the proxy's default
/// bound on one event is 16 MiB; the chunk's JSON needs some room).
pub const MAX_LOAD_SIZE: usize = 15 << 20;

/// The demo agent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Demo {
    pace: Duration,
}

impl Demo {
    /// A demo agent that sends its chunks as fast as they are read.
    pub fn new() -> Demo {
        Demo::default()
    }

    /// A demo agent that waits `pace` before each chunk, for a loop a
    /// person can watch stream (`demo:pace=MS` in a prompt overrides it).
    pub fn with_pace(pace: Duration) -> Demo {
        Demo { pace }
    }
}

impl Agent for Demo {
    fn register(&self, agent: Value) -> BoxFuture<'_, Result<(), Refusal>> {
        let answer = if agent.as_str() == Some("demo:refuse") {
            Err(Refusal::json(
                StatusCode::FORBIDDEN,
                &json!({"kind": "demo", "error": "the demo agent refuses this registration (demo:refuse)"}),
            ))
        } else {
            Ok(())
        };
        Box::pin(future::ready(answer))
    }

    fn run_loop(
        &self,
        request: RunLoopRequest<'static>,
    ) -> BoxFuture<'_, Result<ChunkStream, Refusal>> {
        let chunks = self.script(request.prompt()).map(|chunks| match chunks {
            Chunks::Typed(chunks) => chunks,
            Chunks::Load { count, size } => stream::iter(load(count, size)).boxed(),
        });
        Box::pin(future::ready(chunks))
    }

    fn run_loop_json(
        &self,
        request: RunLoopRequest<'static>,
    ) -> BoxFuture<'_, Result<ChunkJsonStream, Refusal>> {
        let chunks = self.script(request.prompt()).map(|chunks| match chunks {
            Chunks::Typed(chunks) => super::serialized(chunks),
            Chunks::Load { count, size } => stream::iter(load_json(count, size).map(Ok)).boxed(),
        });
        Box::pin(future::ready(chunks))
    }
}

/// A loop about to start: typed chunks, or a load run whose chunks are
/// made typed or as JSON pieces, as the caller asks.
enum Chunks {
    Typed(ChunkStream),
    Load { count: u64, size: usize },
}

/// How a demo loop goes, as the prompt's keywords say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plan {
    Finish,
    Fatal,
    Break,
    Refuse,
    RefuseText,
    Load { count: u64, size: usize },
}

/// The keywords the demo knows, for the refusal of an unknown one.
const KEYWORDS: &str =
    "demo:fatal, demo:break, demo:refuse, demo:refuse-text, demo:load=N[xSIZE], demo:pace=MS";

impl Demo {
    fn script(&self, prompt: &str) -> Result<Chunks, Refusal> {
        let (plan, pace) = plan(prompt, self.pace).map_err(|why| {
            Refusal::json(
                StatusCode::BAD_REQUEST,
                &json!({"kind": "demo", "error": why}),
            )
        })?;
        let chunks: Box<dyn Iterator<Item = Result<AgenticLoopChunk, Break>> + Send> = match plan {
            Plan::Refuse => {
                return Err(Refusal::json(
                    StatusCode::SERVICE_UNAVAILABLE,
                    &json!({"kind": "demo", "error": "the demo agent refuses this loop (demo:refuse)"}),
                ));
            }
            Plan::RefuseText => {
                return Err(Refusal::text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the demo agent refuses this loop in plain text (demo:refuse-text)",
                ));
            }
            // Load runs are never paced: they measure the path, not the demo.
            Plan::Load { count, size } => return Ok(Chunks::Load { count, size }),
            Plan::Finish | Plan::Fatal | Plan::Break => conversation(prompt, plan),
        };
        Ok(Chunks::Typed(if pace.is_zero() {
            stream::iter(chunks).boxed()
        } else {
            stream::iter(chunks)
                .then(move |chunk| async move {
                    tokio::time::sleep(pace).await;
                    chunk
                })
                .boxed()
        }))
    }
}

/// Reads the keywords of `prompt`: the plan and the pace.
fn plan(prompt: &str, mut pace: Duration) -> Result<(Plan, Duration), String> {
    let mut plan = Plan::Finish;
    for word in prompt
        .split_whitespace()
        .filter(|word| word.starts_with("demo:"))
    {
        plan = match word {
            "demo:fatal" => Plan::Fatal,
            "demo:break" => Plan::Break,
            "demo:refuse" => Plan::Refuse,
            "demo:refuse-text" => Plan::RefuseText,
            _ => {
                if let Some(ms) = word.strip_prefix("demo:pace=") {
                    let ms = ms
                        .parse::<u64>()
                        .map_err(|_| format!("{word}: the pace is not a number of milliseconds"))?;
                    pace = Duration::from_millis(ms);
                    continue;
                }
                let Some(load) = word.strip_prefix("demo:load=") else {
                    return Err(format!("unknown demo keyword {word}; known: {KEYWORDS}"));
                };
                let (count, size) = load.split_once('x').unwrap_or((load, "64"));
                let count = count
                    .parse::<u64>()
                    .map_err(|_| format!("{word}: the count is not a number"))?;
                let size = size
                    .parse::<usize>()
                    .ok()
                    .filter(|&size| size <= MAX_LOAD_SIZE)
                    .ok_or_else(|| {
                        format!("{word}: the size is not a number up to {MAX_LOAD_SIZE}")
                    })?;
                Plan::Load { count, size }
            }
        };
    }
    Ok((plan, pace))
}

/// `_meta` carrying the chunk's index.
fn seq(n: u64) -> Option<Meta> {
    let mut meta = Meta::new();
    meta.insert(SEQ.to_owned(), Value::from(n));
    Some(meta)
}

/// The letters of a `demo:load` text, in turn: the text of chunk `n`
/// starts at letter `n`.
const LETTERS: &[u8; 26] = b"abcdefghijklmnopqrstuvwxyz";

/// The most text one piece of a load chunk's JSON carries.
const LOAD_PIECE: usize = 64 << 10;

/// The letters in turn from `a`, for a piece's worth of text starting at
/// any of the 26 letters: every load chunk's text is slices of it.
static PATTERN: [u8; LOAD_PIECE + LETTERS.len()] = {
    let mut pattern = [0; LOAD_PIECE + LETTERS.len()];
    let mut i = 0;
    while i < pattern.len() {
        pattern[i] = LETTERS[i % LETTERS.len()];
        i += 1;
    }
    pattern
};

/// Where in [`PATTERN`] the text of chunk `n` at byte `at` of the text
/// starts: the same letter as `LETTERS[(n + at) % 26]`.
fn letter_of(n: u64, at: usize) -> usize {
    // Mod 26 first: no overflow whatever n.
    ((n % LETTERS.len() as u64) as usize + at % LETTERS.len()) % LETTERS.len()
}

/// `count` text chunks of `size` bytes each, typed.
fn load(count: u64, size: usize) -> impl Iterator<Item = Result<AgenticLoopChunk, Break>> + Send {
    (0..count).map(move |n| Ok(load_chunk(n, size)))
}

/// The chunks of [`load`] as pieces of their JSON.
fn load_json(count: u64, size: usize) -> impl Iterator<Item = ChunkJson> + Send {
    (0..count).map(move |n| load_chunk_json(n, size))
}

/// Load chunk `n`: `size` letters from letter `n`, typed.
fn load_chunk(n: u64, size: usize) -> AgenticLoopChunk {
    // Sized once: a text grown by doubling would hold up to twice its
    // size while it grows.
    let mut text = String::with_capacity(size);
    text.extend((0..size).map(|at| char::from(LETTERS[letter_of(n, at)])));
    AgenticLoopChunk::AssistantTextContent(TextChunk {
        text,
        meta: seq(n),
        ..TextChunk::default()
    })
}

/// Load chunk `n` as pieces of its JSON, the same bytes serde writes for
/// [`load_chunk`]: a head, the text as slices of [`PATTERN`] of at most
/// [`LOAD_PIECE`] bytes, and a tail with `_meta`. Only the tail and the
/// list of pieces are allocated.
fn load_chunk_json(n: u64, size: usize) -> ChunkJson {
    let mut pieces = Vec::with_capacity(size.div_ceil(LOAD_PIECE) + 2);
    pieces.push(Bytes::from_static(LOAD_HEAD));
    for at in (0..size).step_by(LOAD_PIECE) {
        let start = letter_of(n, at);
        let len = LOAD_PIECE.min(size - at);
        pieces.push(Bytes::from_static(&PATTERN[start..start + len]));
    }
    // SEQ and a number need no escaping.
    pieces.push(Bytes::from(format!("\",\"_meta\":{{\"{SEQ}\":{n}}}}}")));
    // Letters, the head and the tail hold no line break.
    ChunkJson::from_pieces_unchecked(pieces)
}

/// A load chunk's JSON up to its text.
const LOAD_HEAD: &[u8] = b"{\"type\":\"assistant_text_content\",\"text\":\"";

/// Numbers chunks as they are added.
#[derive(Default)]
struct Script {
    items: Vec<Result<AgenticLoopChunk, Break>>,
}

impl Script {
    fn next_seq(&self) -> Option<Meta> {
        seq(self.items.len() as u64)
    }

    fn reasoning(&mut self, text: String) {
        let meta = self.next_seq();
        self.items
            .push(Ok(AgenticLoopChunk::AssistantReasoning(TextChunk {
                text,
                meta,
                ..TextChunk::default()
            })));
    }

    fn tool_call(&mut self, arguments: String) {
        let meta = self.next_seq();
        self.items
            .push(Ok(AgenticLoopChunk::AssistantToolCall(ToolCallChunk {
                id: "call_1".to_owned(),
                name: "word_count".to_owned(),
                arguments: Some(arguments),
                meta,
                parent_tool_call_id: None,
            })));
    }

    fn chunk(&mut self, build: impl FnOnce(Option<Meta>) -> AgenticLoopChunk) {
        let meta = self.next_seq();
        self.items.push(Ok(build(meta)));
    }
}

/// `n` and the noun, singular for one: "1 word", "3 words".
fn counted(n: usize, noun: &str) -> String {
    let plural = if n == 1 { "" } else { "s" };
    format!("{n} {noun}{plural}")
}

/// Splits `text` after every `words` words, keeping every byte.
fn deltas(text: &str, words: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut count = 0;
    for piece in text.split_inclusive(' ') {
        current.push_str(piece);
        count += 1;
        if count == words {
            out.push(std::mem::take(&mut current));
            count = 0;
        }
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

/// One chunk per word of a text (pieces split after each space), made
/// as they are read.
struct Words {
    text: String,
    at: usize,
    seq: u64,
}

impl Iterator for Words {
    type Item = Result<AgenticLoopChunk, Break>;

    fn next(&mut self) -> Option<Self::Item> {
        let rest = self.text.get(self.at..).filter(|rest| !rest.is_empty())?;
        let end = rest.find(' ').map_or(rest.len(), |space| space + 1);
        let text = rest[..end].to_owned();
        self.at += end;
        let meta = seq(self.seq);
        self.seq += 1;
        Some(Ok(AgenticLoopChunk::AssistantTextContent(TextChunk {
            text,
            meta,
            ..TextChunk::default()
        })))
    }
}

/// The word-count conversation about `prompt`, ending as `plan` says;
/// the answer is made word by word as it is read.
fn conversation(
    prompt: &str,
    plan: Plan,
) -> Box<dyn Iterator<Item = Result<AgenticLoopChunk, Break>> + Send> {
    let words = prompt.split_whitespace().count();
    let characters = prompt.chars().count();
    let mut script = Script::default();
    let mut completion = 0u64;

    let thought = format!(
        "The prompt has {}. I will count them with the word_count tool, then read the prompt back.",
        counted(words, "word")
    );
    for delta in deltas(&thought, 3) {
        script.reasoning(delta);
        completion += 1;
    }

    // The arguments' JSON text, in fragments that are not JSON by themselves.
    let quoted = Value::from(prompt).to_string();
    let middle = quoted
        .char_indices()
        .map(|(i, _)| i)
        .find(|&i| i >= quoted.len() / 2)
        .unwrap_or(quoted.len());
    let (head, tail) = quoted.split_at(middle);
    for fragment in ["{\"text\":", head, tail, "}"] {
        if !fragment.is_empty() {
            script.tool_call(fragment.to_owned());
            completion += 1;
        }
    }
    drop(quoted);
    if plan == Plan::Break {
        script.items.push(Err(Break::new(
            "the demo agent was asked to break the stream (demo:break)",
        )));
        return Box::new(script.items.into_iter());
    }

    script.chunk(|meta| {
        AgenticLoopChunk::ToolResponse(ToolResponseChunk {
            id: "call_1".to_owned(),
            content: vec![ContentBlock::text(format!(
                "{}, {}",
                counted(words, "word"),
                counted(characters, "character")
            ))],
            structured_content: Some(json!({"words": words, "characters": characters})),
            is_error: Some(false),
            meta,
            parent_tool_call_id: None,
        })
    });
    if plan == Plan::Fatal {
        script.chunk(|meta| {
            AgenticLoopChunk::Notification(NotificationChunk {
                is_fatal: true,
                message: json!({"kind": "demo", "error": "the demo agent was asked to fail (demo:fatal)"}),
                meta,
            })
        });
        return Box::new(script.items.into_iter());
    }
    script.chunk(|meta| {
        AgenticLoopChunk::Notification(NotificationChunk {
            is_fatal: false,
            message: json!({"tool": "word_count", "status": "done"}),
            meta,
        })
    });

    let answer = format!(
        "You said: \"{prompt}\". That is {} and {}.",
        counted(words, "word"),
        counted(characters, "character")
    );
    let answer_deltas = answer.split_inclusive(' ').count() as u64;
    completion += answer_deltas;
    let first = script.items.len() as u64;
    let prompt_tokens = words as u64;
    let usage = AgenticLoopChunk::Usage(UsageChunk {
        completion_tokens: completion,
        prompt_tokens,
        total_tokens: completion + prompt_tokens,
        meta: seq(first + answer_deltas),
    });
    let answer = Words {
        text: answer,
        at: 0,
        seq: first,
    };
    Box::new(
        script
            .items
            .into_iter()
            .chain(answer)
            .chain(std::iter::once(Ok(usage))),
    )
}

#[cfg(test)]
mod tests {
    use runloop_proto::run_loop::{ChunkKind, Transcript};

    use super::*;

    async fn run(prompt: &str) -> Result<Vec<Result<AgenticLoopChunk, Break>>, Refusal> {
        let stream = Demo::new().run_loop(RunLoopRequest::new(prompt)).await?;
        Ok(stream.collect().await)
    }

    fn seq_of(chunk: &AgenticLoopChunk) -> Option<u64> {
        let meta = match chunk {
            AgenticLoopChunk::AssistantReasoning(c) | AgenticLoopChunk::AssistantTextContent(c) => {
                &c.meta
            }
            AgenticLoopChunk::AssistantToolCall(c) => &c.meta,
            AgenticLoopChunk::ToolResponse(c) => &c.meta,
            AgenticLoopChunk::Usage(c) => &c.meta,
            AgenticLoopChunk::Notification(c) => &c.meta,
            _ => return None,
        };
        meta.as_ref()?.0.get(SEQ)?.as_u64()
    }

    #[tokio::test]
    async fn a_finished_loop_shows_every_kind_in_order() {
        let items = run("read me back").await.expect("runs");
        let chunks: Vec<AgenticLoopChunk> =
            items.into_iter().map(|c| c.expect("no break")).collect();
        for (n, chunk) in chunks.iter().enumerate() {
            assert_eq!(seq_of(chunk), Some(n as u64), "{chunk:?}");
        }
        let kinds: Vec<ChunkKind> = chunks.iter().map(AgenticLoopChunk::kind).collect();
        let first = |kind| kinds.iter().position(|k| *k == kind).expect("present");
        assert!(first(ChunkKind::AssistantReasoning) < first(ChunkKind::AssistantToolCall));
        assert!(first(ChunkKind::AssistantToolCall) < first(ChunkKind::ToolResponse));
        assert!(first(ChunkKind::ToolResponse) < first(ChunkKind::Notification));
        assert!(first(ChunkKind::Notification) < first(ChunkKind::AssistantTextContent));
        assert_eq!(kinds.last(), Some(&ChunkKind::Usage));
        assert!(!chunks.iter().any(AgenticLoopChunk::is_fatal));

        let mut transcript = Transcript::new();
        for chunk in &chunks {
            transcript.push(chunk.clone());
        }
        let merged = transcript.chunks();
        let call = merged
            .iter()
            .find_map(|c| match c {
                AgenticLoopChunk::AssistantToolCall(call) => Some(call),
                _ => None,
            })
            .expect("a tool call");
        let arguments: Value = serde_json::from_str(call.arguments.as_deref().unwrap_or_default())
            .expect("whole JSON");
        assert_eq!(arguments, json!({"text": "read me back"}));
        let answer = merged
            .iter()
            .find_map(|c| match c {
                AgenticLoopChunk::AssistantTextContent(text) => Some(text.text.as_str()),
                _ => None,
            })
            .expect("an answer");
        assert_eq!(
            answer,
            "You said: \"read me back\". That is 3 words and 12 characters."
        );
        match chunks.last() {
            Some(AgenticLoopChunk::Usage(usage)) => {
                assert_eq!(usage.prompt_tokens, 3);
                assert_eq!(
                    usage.total_tokens,
                    usage.prompt_tokens + usage.completion_tokens
                );
            }
            other => panic!("the last chunk is not usage: {other:?}"),
        }
    }

    #[tokio::test]
    async fn one_word_is_one_word() {
        let items = run("x").await.expect("runs");
        let mut texts = String::new();
        for chunk in items.into_iter().map(|c| c.expect("no break")) {
            match chunk {
                AgenticLoopChunk::AssistantReasoning(c)
                | AgenticLoopChunk::AssistantTextContent(c) => {
                    texts.push_str(&c.text);
                }
                AgenticLoopChunk::ToolResponse(response) => {
                    texts.push_str(&serde_json::to_string(&response.content).expect("JSON"));
                }
                _ => {}
            }
        }
        assert!(texts.contains("The prompt has 1 word."), "{texts}");
        assert!(texts.contains("1 word, 1 character"), "{texts}");
        assert!(texts.contains("That is 1 word and 1 character."), "{texts}");
        assert!(
            !texts.contains("1 words") && !texts.contains("1 characters"),
            "{texts}"
        );
    }

    #[tokio::test]
    async fn the_same_prompt_gives_the_same_loop() {
        let a = run("same é prompt").await.expect("runs");
        let b = run("same é prompt").await.expect("runs");
        assert_eq!(a, b);
    }

    #[tokio::test]
    async fn fatal_ends_with_a_fatal_notification() {
        let items = run("please demo:fatal").await.expect("runs");
        let last = items.last().expect("chunks").clone().expect("no break");
        assert!(last.is_fatal());
        assert!(items.iter().all(Result::is_ok));
    }

    #[tokio::test]
    async fn break_ends_with_a_break_after_chunks() {
        let items = run("demo:break now").await.expect("runs");
        assert!(items.len() > 1);
        assert_eq!(
            items.last(),
            Some(&Err(Break::new(
                "the demo agent was asked to break the stream (demo:break)"
            )))
        );
        assert_eq!(items.iter().filter(|item| item.is_err()).count(), 1);
    }

    #[tokio::test]
    async fn refusals() {
        let refusal = run("demo:refuse").await.expect_err("refused");
        assert_eq!(refusal.status(), StatusCode::SERVICE_UNAVAILABLE);
        let body: Value = serde_json::from_slice(refusal.body()).expect("JSON");
        assert_eq!(body["kind"], "demo");
        let refusal = run("demo:refuse-text").await.expect_err("refused");
        assert_eq!(refusal.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(serde_json::from_slice::<Value>(refusal.body()).is_err());
        let refusal = run("demo:nope").await.expect_err("unknown keyword");
        assert_eq!(refusal.status(), StatusCode::BAD_REQUEST);
        assert!(String::from_utf8_lossy(refusal.body()).contains("unknown demo keyword demo:nope"));
        for bad in [
            "demo:load=x",
            "demo:load=3x",
            "demo:load=3x99999999999",
            "demo:pace=soon",
        ] {
            let refusal = run(bad).await.expect_err(bad);
            assert_eq!(refusal.status(), StatusCode::BAD_REQUEST, "{bad}");
        }
    }

    #[tokio::test]
    async fn load_sends_count_chunks_of_size() {
        let items = run("demo:load=5x10").await.expect("runs");
        assert_eq!(items.len(), 5);
        for (n, item) in items.iter().enumerate() {
            let chunk = item.as_ref().expect("no break");
            assert_eq!(seq_of(chunk), Some(n as u64));
            match chunk {
                AgenticLoopChunk::AssistantTextContent(text) => assert_eq!(text.text.len(), 10),
                other => panic!("not text: {other:?}"),
            }
        }
        assert_eq!(run("demo:load=0").await.expect("runs").len(), 0);
        assert_eq!(run("demo:load=2").await.expect("runs").len(), 2);
    }

    #[tokio::test]
    async fn registration() {
        assert_eq!(Demo::new().register(json!({"any": "thing"})).await, Ok(()));
        let refusal = Demo::new()
            .register(json!("demo:refuse"))
            .await
            .expect_err("refused");
        assert_eq!(refusal.status(), StatusCode::FORBIDDEN);
    }

    /// The bytes of a chunk's JSON pieces, one after the other.
    fn joined(json: &ChunkJson) -> Vec<u8> {
        json.pieces().concat()
    }

    #[test]
    fn a_load_chunk_as_pieces_is_the_typed_chunk() {
        for n in [0, 1, 7, 25, 26, 27, 1000, u64::MAX] {
            for size in [0, 1, 25, 26, 27, 65536, 65537, 200_000] {
                let typed = load_chunk(n, size);
                let json = load_chunk_json(n, size);
                let bytes = joined(&json);
                assert_eq!(
                    bytes,
                    serde_json::to_vec(&typed).expect("serializes"),
                    "n {n}, size {size}"
                );
                let mut payload = vec![runloop_proto::run_loop::CHUNK];
                payload.extend_from_slice(&bytes);
                let decoded =
                    <runloop_proto::run_loop::Response as runloop_proto::Decode>::decode(&payload)
                        .expect("decodes");
                assert_eq!(
                    decoded,
                    runloop_proto::run_loop::Response::Chunk(typed),
                    "n {n}, size {size}"
                );
                assert_eq!(json.len(), bytes.len());
                assert_eq!(json.pieces().len(), size.div_ceil(LOAD_PIECE) + 2);
            }
        }
    }

    #[test]
    fn a_load_chunk_of_the_largest_size_is_slices_of_one_pattern() {
        let n = 12_345;
        let json = load_chunk_json(n, MAX_LOAD_SIZE);
        let typed = load_chunk(n, MAX_LOAD_SIZE);
        let decoded: AgenticLoopChunk = serde_json::from_slice(&joined(&json)).expect("decodes");
        assert_eq!(decoded, typed);

        let pattern = PATTERN.as_ptr_range();
        let pieces = json.pieces();
        assert_eq!(pieces.len(), MAX_LOAD_SIZE / LOAD_PIECE + 2);
        assert_eq!(&pieces[0][..], LOAD_HEAD);
        let (tail, text) = pieces[1..].split_last().expect("a tail");
        assert!(tail.len() < 64, "{tail:?}");
        for piece in text {
            assert!(piece.len() <= LOAD_PIECE);
            let inside = piece.as_ptr_range();
            assert!(
                pattern.start <= inside.start && inside.end <= pattern.end,
                "a piece of text is not a slice of the pattern"
            );
        }
        assert!(pieces.iter().all(|piece| piece.len() <= LOAD_PIECE + 64));

        // On the way out, every slice of text is a body frame as it is.
        let frames = super::super::event(json.clone());
        assert_eq!(frames.len(), text.len() + 2);
        for (frame, piece) in frames[1..].iter().zip(text) {
            assert_eq!(frame.as_ptr(), piece.as_ptr());
        }
    }

    #[tokio::test]
    async fn load_as_json_is_load_typed() {
        let prompt = "demo:load=4x70000 demo:pace=10000";
        let typed: Vec<AgenticLoopChunk> = run(prompt)
            .await
            .expect("runs")
            .into_iter()
            .map(|item| item.expect("no break"))
            .collect();
        let json: Vec<ChunkJson> = Demo::new()
            .run_loop_json(RunLoopRequest::new(prompt))
            .await
            .expect("runs")
            .map(|item| item.expect("no break"))
            .collect()
            .await;
        assert_eq!(typed.len(), 4);
        assert_eq!(json.len(), 4);
        for (typed, json) in typed.iter().zip(&json) {
            assert_eq!(joined(json), serde_json::to_vec(typed).expect("serializes"));
        }
    }

    #[tokio::test]
    async fn other_loops_as_json_are_their_chunks_serialized() {
        for prompt in ["read me back", "demo:fatal", "demo:break"] {
            let typed = run(prompt).await.expect("runs");
            let json: Vec<Result<ChunkJson, Break>> = Demo::new()
                .run_loop_json(RunLoopRequest::new(prompt))
                .await
                .expect("runs")
                .collect()
                .await;
            assert_eq!(typed.len(), json.len(), "{prompt}");
            for (typed, json) in typed.iter().zip(&json) {
                match (typed, json) {
                    (Ok(typed), Ok(json)) => {
                        assert_eq!(joined(json), serde_json::to_vec(typed).expect("serializes"))
                    }
                    (Err(a), Err(b)) => assert_eq!(a, b),
                    other => panic!("{prompt}: {other:?}"),
                }
            }
        }
        let refusal = Demo::new()
            .run_loop_json(RunLoopRequest::new("demo:refuse"))
            .await
            .err()
            .expect("refused");
        assert_eq!(refusal.status(), StatusCode::SERVICE_UNAVAILABLE);
    }

    #[test]
    fn deltas_keep_every_byte() {
        assert_eq!(deltas("a b c d e", 2), ["a b ", "c d ", "e"]);
        assert_eq!(deltas("", 2), Vec::<String>::new());
        assert_eq!(deltas("a  b", 1).concat(), "a  b");
    }
}
