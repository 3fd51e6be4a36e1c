//! Decoding run-loop response payloads: this crate's `Response::decode` against
//! the reference algorithm and against validation-only parsing.
//!
//! The reference is what a derive-only implementation does: a
//! `#[serde(untagged)]` enum over ten structs, each with a `type` field that
//! must equal its kind's constant, so serde buffers every chunk and then
//! tries the kinds in turn. Validation-only parsing (`IgnoredAny`) reads
//! every byte and builds nothing: no decoder of the chunk vocabulary can be
//! faster than it, so it is the ceiling the ratio is read against.
//!
//! The corpus is generated deterministically (a fixed-seed xorshift) as 25
//! turns of a coding agent's loop: each turn is dozens of small reasoning
//! and text deltas, a tool call streamed in fragments, one tool response of
//! 2–20 KiB (source-like text, so full of escapes), a usage chunk, and now
//! and then a notification. Before anything is timed, the reference and
//! this crate must decode every payload to the same chunk, compared as JSON
//! values, so the comparison is between two decoders that do the same work.
//!
//! `cargo bench -p runloop-proto --bench run_loop_decode` runs the criterion
//! group and then prints the throughput ratios from an interleaved timing
//! loop in the same process: for the whole corpus, and for its two halves by
//! bytes (the small chunks; the tool responses). Strings dominate the tool
//! responses; there the reference spends its time in serde_json's string
//! parser and this crate in its fast path's own (`run_loop::scan`), which
//! unescapes straight into the chunk's string, so that is where the two are
//! closest and where a faster string reader shows.

use std::borrow::Cow;
use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use runloop_proto::mcp::{Annotations, ContentBlock, Meta, TextContent};
use runloop_proto::run_loop::{
    AgenticLoopChunk, NotificationChunk, Response, TextChunk, TokenLogprob, ToolCallChunk,
    ToolResponseChunk, UsageChunk,
};
use runloop_proto::{Decode, Encode};
use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

// ---------------------------------------------------------------------------
// The corpus
// ---------------------------------------------------------------------------

/// A fixed-seed xorshift64*: the same corpus on every run and machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `low..=high`.
    fn range(&mut self, low: usize, high: usize) -> usize {
        let span = u64::try_from(high - low + 1).expect("a small span");
        low + usize::try_from(self.next() % span).expect("less than the span")
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

const WORDS: &[&str] = &[
    "the",
    "file",
    "reads",
    "config",
    "so",
    "we",
    "should",
    "check",
    "first",
    "then",
    "a",
    "function",
    "returns",
    "value",
    "error",
    "path",
    "\"quoted\"",
    "line\n",
    "tab\t",
    "naïve",
    "→",
    "ok",
    "Result<T>",
    "{x}",
    "test",
    "passes",
    "build",
    "crate",
    "because",
    "wait",
];

/// Prose of `low..=high` bytes, with the escapes real model output carries.
fn prose(rng: &mut Rng, low: usize, high: usize) -> String {
    let want = rng.range(low, high);
    let mut text = String::with_capacity(want + 16);
    while text.len() < want {
        if !text.is_empty() {
            text.push(' ');
        }
        text.push_str(WORDS[rng.range(0, WORDS.len() - 1)]);
    }
    text
}

/// Source-like tool output of `low..=high` bytes: lines, indentation, quotes.
fn tool_output(rng: &mut Rng, low: usize, high: usize) -> String {
    let want = rng.range(low, high);
    let mut text = String::with_capacity(want + 80);
    let mut line = 1;
    while text.len() < want {
        let indent = "    ".repeat(rng.range(0, 3));
        let body = prose(rng, 10, 70);
        text.push_str(&format!("{line:>4}  {indent}let x = \"{body}\";\n"));
        line += 1;
    }
    text
}

fn thread(rng: &mut Rng) -> Option<String> {
    rng.chance(10).then(|| format!("call_{}", rng.range(1, 4)))
}

fn text_chunk(rng: &mut Rng) -> TextChunk {
    TextChunk {
        text: prose(rng, 5, 80),
        logprobs: rng.chance(3).then(|| {
            vec![TokenLogprob {
                token: "tok".to_owned(),
                bytes: Some(vec![116, 111, 107]),
                logprob: -0.125,
                top_logprobs: Vec::new(),
            }]
        }),
        ..TextChunk::default()
    }
}

/// A tool call's arguments, streamed as JSON text in fragments.
fn tool_call(rng: &mut Rng, id: &str, parent: &Option<String>) -> Vec<AgenticLoopChunk> {
    let arguments = format!(
        "{{\"path\": \"/src/{}.rs\", \"start_line\": {}, \"end_line\": {}}}",
        prose(rng, 4, 20).replace(' ', "_"),
        rng.range(1, 400),
        rng.range(400, 900)
    );
    let chars: Vec<char> = arguments.chars().collect();
    let mut fragments = Vec::new();
    let mut at = 0;
    while at < chars.len() {
        let end = (at + rng.range(2, 10)).min(chars.len());
        fragments.push(AgenticLoopChunk::AssistantToolCall(ToolCallChunk {
            id: id.to_owned(),
            name: "read_file".to_owned(),
            arguments: Some(chars[at..end].iter().collect()),
            meta: None,
            parent_tool_call_id: parent.clone(),
        }));
        at = end;
    }
    fragments
}

/// One turn of a coding agent's loop: the model reasons and answers in
/// small deltas, calls a tool (its arguments streamed in fragments), the
/// tool answers with a file, and the turn's usage is reported. One tool
/// response per call is what makes them rare among the chunks and still
/// about half of the bytes.
fn turn(rng: &mut Rng, number: usize, chunks: &mut Vec<AgenticLoopChunk>) {
    use AgenticLoopChunk as C;
    let parent = thread(rng);
    for _ in 0..rng.range(20, 120) {
        let mut delta = text_chunk(rng);
        delta.parent_tool_call_id.clone_from(&parent);
        chunks.push(C::AssistantReasoning(delta));
    }
    for _ in 0..rng.range(10, 80) {
        let mut delta = text_chunk(rng);
        delta.parent_tool_call_id.clone_from(&parent);
        chunks.push(C::AssistantTextContent(delta));
    }
    let id = format!("call_{number}");
    chunks.extend(tool_call(rng, &id, &parent));
    let annotations = Annotations {
        priority: Some(0.5),
        ..Annotations::default()
    };
    let text = tool_output(rng, 2048, 20 * 1024);
    let file = TextContent {
        text,
        annotations: rng.chance(30).then_some(annotations),
        meta: None,
    };
    chunks.push(C::ToolResponse(ToolResponseChunk {
        id,
        content: vec![ContentBlock::Text(file)],
        structured_content: rng.chance(20).then(|| json!({"lines": 120, "ok": true})),
        is_error: Some(rng.chance(10)),
        meta: None,
        parent_tool_call_id: parent,
    }));
    chunks.push(C::Usage(UsageChunk {
        completion_tokens: rng.next() % 500,
        prompt_tokens: rng.next() % 20_000,
        total_tokens: rng.next() % 20_500,
        meta: None,
    }));
    if rng.chance(15) {
        chunks.push(C::Notification(NotificationChunk {
            is_fatal: false,
            message: json!({"status": "retrying", "attempt": rng.range(1, 3)}),
            meta: rng.chance(50).then(|| {
                let mut meta = serde_json::Map::new();
                meta.insert("trace".to_owned(), json!("00-4bf92f3577b34da6-01"));
                Meta(meta)
            }),
        }));
    }
}

/// The run-loop payloads of a loop of 25 turns: `[0][chunk JSON]` each.
fn corpus() -> Vec<Vec<u8>> {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut chunks = Vec::new();
    for number in 0..25 {
        turn(&mut rng, number, &mut chunks);
    }
    chunks
        .into_iter()
        .map(|chunk| Response::Chunk(chunk).to_vec().expect("a chunk serializes"))
        .collect()
}

// ---------------------------------------------------------------------------
// The reference algorithm
// ---------------------------------------------------------------------------

/// A `type` value that must be one constant.
macro_rules! type_tag {
    ($name:ident, $value:literal) => {
        #[derive(Debug, Clone, Copy, PartialEq)]
        struct $name;

        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str($value)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let value = Cow::<str>::deserialize(deserializer)?;
                if value == $value {
                    Ok($name)
                } else {
                    Err(serde::de::Error::invalid_value(
                        serde::de::Unexpected::Str(&value),
                        &$value,
                    ))
                }
            }
        }
    };
}

type_tag!(ReasoningType, "assistant_reasoning");
type_tag!(TextContentType, "assistant_text_content");
type_tag!(RefusalType, "assistant_refusal");
type_tag!(ToolCallType, "assistant_tool_call");
type_tag!(ImageType, "assistant_image_content");
type_tag!(AudioType, "assistant_audio_content");
type_tag!(ToolResponseType, "tool_response");
type_tag!(UserType, "user");
type_tag!(UsageType, "usage");
type_tag!(NotificationType, "notification");

#[derive(Serialize, Deserialize)]
struct RefText<T> {
    #[serde(rename = "type")]
    kind: T,
    text: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    annotations: Option<Annotations>,
    #[serde(rename = "_meta", default, skip_serializing_if = "Option::is_none")]
    meta: Option<Meta>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    parent_tool_call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    logprobs: Option<Vec<TokenLogprob>>,
}

#[derive(Serialize, Deserialize)]
struct RefToolCall {
    #[serde(rename = "type")]
    kind: ToolCallType,
    id: String,
    name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    arguments: Option<String>,
    #[serde(rename = "_meta", default, skip_serializing_if = "Option::is_none")]
    meta: Option<Meta>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    parent_tool_call_id: Option<String>,
}

#[derive(Serialize, Deserialize)]
struct RefMedia<T> {
    #[serde(rename = "type")]
    kind: T,
    data: String,
    #[serde(rename = "mimeType")]
    mime_type: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    annotations: Option<Annotations>,
    #[serde(rename = "_meta", default, skip_serializing_if = "Option::is_none")]
    meta: Option<Meta>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    parent_tool_call_id: Option<String>,
}

#[derive(Serialize, Deserialize)]
struct RefToolResponse {
    #[serde(rename = "type")]
    kind: ToolResponseType,
    id: String,
    content: Vec<ContentBlock>,
    #[serde(
        rename = "structuredContent",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    structured_content: Option<Value>,
    #[serde(rename = "isError", default, skip_serializing_if = "Option::is_none")]
    is_error: Option<bool>,
    #[serde(rename = "_meta", default, skip_serializing_if = "Option::is_none")]
    meta: Option<Meta>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    parent_tool_call_id: Option<String>,
}

#[derive(Serialize, Deserialize)]
struct RefUser {
    #[serde(rename = "type")]
    kind: UserType,
    prompt: String,
    #[serde(rename = "_meta", default, skip_serializing_if = "Option::is_none")]
    meta: Option<Meta>,
}

#[derive(Serialize, Deserialize)]
struct RefUsage {
    #[serde(rename = "type")]
    kind: UsageType,
    completion_tokens: u64,
    prompt_tokens: u64,
    total_tokens: u64,
    #[serde(rename = "_meta", default, skip_serializing_if = "Option::is_none")]
    meta: Option<Meta>,
}

#[derive(Serialize, Deserialize)]
struct RefNotification {
    #[serde(rename = "type")]
    kind: NotificationType,
    is_fatal: bool,
    message: Value,
    #[serde(rename = "_meta", default, skip_serializing_if = "Option::is_none")]
    meta: Option<Meta>,
}

/// The reference chunk: the first of the ten shapes that fits.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum RefChunk {
    Reasoning(RefText<ReasoningType>),
    TextContent(RefText<TextContentType>),
    Refusal(RefText<RefusalType>),
    ToolCall(RefToolCall),
    Image(RefMedia<ImageType>),
    Audio(RefMedia<AudioType>),
    ToolResponse(RefToolResponse),
    User(RefUser),
    Usage(RefUsage),
    Notification(RefNotification),
}

/// The reference frame.
enum RefFrame {
    Chunk(RefChunk),
    Error(Value),
}

/// Why a reference payload did not decode.
enum RefError {
    Empty,
    UnknownTag(u8),
    Json(serde_json::Error),
}

/// The reference's payload decoding: the tag byte, then the JSON.
fn reference_decode(payload: &[u8]) -> Result<RefFrame, RefError> {
    let (&tag, json) = payload.split_first().ok_or(RefError::Empty)?;
    match tag {
        0 => serde_json::from_slice(json)
            .map(RefFrame::Chunk)
            .map_err(RefError::Json),
        1 => serde_json::from_slice(json)
            .map(RefFrame::Error)
            .map_err(RefError::Json),
        other => Err(RefError::UnknownTag(other)),
    }
}

/// Validation only: the tag byte, then every byte of the JSON read and
/// nothing built.
fn validate_only(payload: &[u8]) -> Result<IgnoredAny, RefError> {
    let (&tag, json) = payload.split_first().ok_or(RefError::Empty)?;
    match tag {
        0 | 1 => serde_json::from_slice(json).map_err(RefError::Json),
        other => Err(RefError::UnknownTag(other)),
    }
}

// ---------------------------------------------------------------------------
// The comparison
// ---------------------------------------------------------------------------

/// Both decoders must produce the same chunk for every payload.
fn assert_same_decoding(corpus: &[Vec<u8>]) {
    for payload in corpus {
        let Ok(Response::Chunk(ours)) = Response::decode(payload) else {
            panic!("ours did not decode a chunk");
        };
        let Ok(RefFrame::Chunk(reference)) = reference_decode(payload) else {
            panic!("the reference did not decode a chunk");
        };
        let ours = serde_json::to_value(&ours).expect("serializes");
        let reference = serde_json::to_value(&reference).expect("serializes");
        assert_eq!(ours, reference, "the decoders disagree");
        assert!(validate_only(payload).is_ok());
    }
    // An error payload is the same error to both, whatever it looks like,
    // and both refuse the same bad payloads.
    let error = b"\x01{\"type\":\"usage\",\"completion_tokens\":1}";
    let Ok(Response::Error(ours)) = Response::decode(error) else {
        panic!("ours did not decode an error");
    };
    let Ok(RefFrame::Error(reference)) = reference_decode(error) else {
        panic!("the reference did not decode an error");
    };
    assert_eq!(ours.0, reference);
    assert!(matches!(reference_decode(b""), Err(RefError::Empty)));
    assert!(matches!(
        reference_decode(b"\x07{}"),
        Err(RefError::UnknownTag(7))
    ));
    for bad in [&b"\x00{\"type\":\"nope\"}"[..], b"\x00{}", b"\x01{} {}"] {
        assert!(Response::decode(bad).is_err());
        let Err(RefError::Json(why)) = reference_decode(bad) else {
            panic!("the reference accepted a bad payload");
        };
        assert!(!why.to_string().is_empty());
    }
}

fn decode_ours(corpus: &[Vec<u8>]) {
    for payload in corpus {
        let _ = black_box(Response::decode(black_box(payload)));
    }
}

fn decode_reference(corpus: &[Vec<u8>]) {
    for payload in corpus {
        let _ = black_box(reference_decode(black_box(payload)));
    }
}

fn decode_ignored(corpus: &[Vec<u8>]) {
    for payload in corpus {
        let _ = black_box(validate_only(black_box(payload)));
    }
}

/// Decodes a whole corpus.
type Decoder = fn(&[Vec<u8>]);

/// Decoding throughput of `corpus` in MiB/s, best of interleaved rounds,
/// printed under `label` with the two ratios.
fn ratios(label: &str, corpus: &[Vec<u8>], seconds: u64) {
    let bytes: usize = corpus.iter().map(Vec::len).sum();
    let decoders: [(&str, Decoder); 3] = [
        ("ours", decode_ours),
        ("reference", decode_reference),
        ("ignored_any", decode_ignored),
    ];
    let mut best = [Duration::MAX; 3];
    let deadline = Instant::now() + Duration::from_secs(seconds);
    while Instant::now() < deadline {
        for (i, (_, decode)) in decoders.iter().enumerate() {
            let start = Instant::now();
            decode(corpus);
            best[i] = best[i].min(start.elapsed());
        }
    }
    let mib_per_s = |d: Duration| bytes as f64 / d.as_secs_f64() / (1024.0 * 1024.0);
    let ratio = |ours: Duration, other: Duration| other.as_secs_f64() / ours.as_secs_f64();
    println!("{label}: {} payloads, {bytes} bytes", corpus.len());
    for ((name, _), time) in decoders.iter().zip(best) {
        println!("  {name:<12} {:>8.1} MiB/s", mib_per_s(time));
    }
    println!(
        "  ours/reference throughput  = {:.2}x",
        ratio(best[0], best[1])
    );
    println!(
        "  ours/IgnoredAny throughput = {:.2}x",
        ratio(best[0], best[2])
    );
}

/// The ratios for the whole corpus, then for its two halves by bytes: the
/// many small chunks, and the few large tool responses.
fn all_ratios(corpus: &[Vec<u8>]) {
    let is_response = |p: &&Vec<u8>| p.starts_with(b"\x00{\"type\":\"tool_response\"");
    let responses: Vec<Vec<u8>> = corpus.iter().filter(is_response).cloned().collect();
    let small: Vec<Vec<u8>> = corpus.iter().filter(|p| !is_response(p)).cloned().collect();
    println!();
    ratios("run_loop_decode (the corpus)", corpus, 5);
    ratios("  of which: small chunks", &small, 2);
    ratios("  of which: tool responses", &responses, 2);
}

fn main() {
    let corpus = corpus();
    let bytes: usize = corpus.iter().map(Vec::len).sum();
    assert_same_decoding(&corpus);

    let mut criterion = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .configure_from_args();
    {
        let mut group = criterion.benchmark_group("run_loop_decode");
        group.throughput(Throughput::Bytes(
            u64::try_from(bytes).expect("fits in u64"),
        ));
        group.bench_function("ours", |b| b.iter(|| decode_ours(&corpus)));
        group.bench_function("reference_untagged", |b| {
            b.iter(|| decode_reference(&corpus))
        });
        group.bench_function("ignored_any", |b| b.iter(|| decode_ignored(&corpus)));
        group.finish();
    }
    criterion.final_summary();

    // `cargo bench` passes `--bench`; a smoke run (`cargo test --benches`,
    // `cargo bench -- --test`), a listing or a profiling run has no time to
    // spend on ratios.
    let args: Vec<String> = std::env::args().collect();
    let has = |flag: &str| args.iter().any(|a| a == flag);
    if has("--bench") && !has("--test") && !has("--list") && !has("--profile-time") {
        all_ratios(&corpus);
    }
}
