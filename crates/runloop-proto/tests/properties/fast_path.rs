//! `Response::decode` reads chunks through a hand-written fast path first and
//! falls back to the serde path (`AgenticLoopChunk`'s `Deserialize`) on
//! anything it does not handle. These properties hold the two to the same
//! verdict on inputs built to reach the fast path's decisions: members in
//! any order with unknown ones among them, strings escaped every way JSON
//! allows, and chunk JSON with JSON-significant bytes edited in.

use proptest::prelude::*;
use runloop_proto::Decode;
use runloop_proto::run_loop::{AgenticLoopChunk, CHUNK, Response, ResponseError, TextChunk};
use serde_json::{Map, Value};

use crate::strategy;

/// `Response::decode` of chunk JSON behind the chunk tag.
fn decode_chunk(json: &[u8]) -> Result<Response, ResponseError> {
    let mut payload = vec![CHUNK];
    payload.extend_from_slice(json);
    Response::decode(&payload)
}

/// A chunk's members as serde_json writes them, `type` first.
fn members(chunk: &AgenticLoopChunk) -> Vec<(String, Value)> {
    let Ok(Value::Object(members)) = serde_json::to_value(chunk) else {
        panic!("a chunk is an object");
    };
    members.into_iter().collect()
}

/// `Response::decode` and the serde path give the same chunk, or errors with
/// the same message.
pub(crate) fn same_verdict(json: &[u8]) -> Result<(), TestCaseError> {
    let ours = decode_chunk(json);
    let theirs = serde_json::from_slice::<AgenticLoopChunk>(json);
    match (ours, theirs) {
        (Ok(Response::Chunk(ours)), Ok(theirs)) => prop_assert_eq!(ours, theirs),
        (Err(ResponseError::Chunk(ours)), Err(theirs)) => {
            prop_assert_eq!(ours.to_string(), theirs.to_string());
        }
        (ours, theirs) => prop_assert!(false, "ours {:?}, serde path {:?}", ours, theirs),
    }
    Ok(())
}

/// A chunk's JSON with `type` first and the other members rotated, maybe
/// reversed, with an unknown member among them.
fn reordered(
    chunk: &AgenticLoopChunk,
    turn: usize,
    reverse: bool,
    extra: Option<Value>,
) -> Map<String, Value> {
    let mut members = members(chunk);
    let kind = members.remove(0);
    assert_eq!(kind.0, "type");
    if !members.is_empty() {
        let by = turn % members.len();
        members.rotate_left(by);
    }
    if reverse {
        members.reverse();
    }
    if let Some(extra) = extra {
        let at = turn % (members.len() + 1);
        members.insert(at, ("x-unknown".to_owned(), extra));
    }
    std::iter::once(kind).chain(members).collect()
}

/// A byte that matters to JSON's grammar, or any byte.
fn edit_byte() -> impl Strategy<Value = u8> {
    prop_oneof![
        3 => prop::sample::select(b"\"\\,:{}[] \t\n0123456789-+.eEnulltruefalse\x01\x7f".to_vec()),
        1 => any::<u8>(),
    ]
}

/// `text` as a JSON string, each character written the way `how` picks:
/// as itself where JSON allows, as a `\u` escape (lower or upper case hex,
/// a surrogate pair beyond the BMP), or as its short escape.
fn escaped(text: &str, how: &[u8]) -> String {
    let mut out = String::from("\"");
    for (i, c) in text.chars().enumerate() {
        let mode = how.get(i).copied().unwrap_or(0) % 4;
        let short = match c {
            '"' => Some("\\\""),
            '\\' => Some("\\\\"),
            '/' => Some("\\/"),
            '\u{8}' => Some("\\b"),
            '\u{c}' => Some("\\f"),
            '\n' => Some("\\n"),
            '\r' => Some("\\r"),
            '\t' => Some("\\t"),
            _ => None,
        };
        let must_escape = c == '"' || c == '\\' || u32::from(c) < 0x20;
        match (mode, short) {
            (0, _) if !must_escape => out.push(c),
            (3, Some(short)) => out.push_str(short),
            _ => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    if mode == 2 {
                        out.push_str(&format!("\\u{unit:04X}"));
                    } else {
                        out.push_str(&format!("\\u{unit:04x}"));
                    }
                }
            }
        }
    }
    out.push('"');
    out
}

proptest! {
    /// Members in any order after `type`, unknown ones among them, compact
    /// or pretty: the same chunk either way, and the chunk itself.
    #[test]
    fn members_in_any_order(
        chunk in strategy::chunk(),
        turn in any::<usize>(),
        reverse in any::<bool>(),
        extra in prop::option::of(strategy::json_value()),
        pretty in any::<bool>(),
    ) {
        let members = reordered(&chunk, turn, reverse, extra);
        let json = if pretty {
            serde_json::to_vec_pretty(&members)
        } else {
            serde_json::to_vec(&members)
        }
        .expect("serializes");
        same_verdict(&json)?;
        prop_assert_eq!(decode_chunk(&json).expect("decodes"), Response::Chunk(chunk));
    }

    /// A member written twice (`type` included) is refused by both paths
    /// with the same message.
    #[test]
    fn a_member_twice(chunk in strategy::chunk(), which in any::<usize>(), at in any::<usize>()) {
        let mut parts: Vec<String> = members(&chunk)
            .iter()
            .map(|(k, v)| format!("{}:{}", serde_json::to_string(k).expect("a string"), v))
            .collect();
        let twice = parts[which % parts.len()].clone();
        // After the first member, so that `type` stays first.
        let at = 1 + at % parts.len();
        parts.insert(at, twice);
        let json = format!("{{{}}}", parts.join(","));
        same_verdict(json.as_bytes())?;
        prop_assert!(serde_json::from_str::<AgenticLoopChunk>(&json).is_err());
    }

    /// Text escaped every way JSON allows reads back as the text.
    #[test]
    fn strings_escaped_any_way(
        text in strategy::text_up_to(40),
        how in prop::collection::vec(any::<u8>(), 40),
    ) {
        let json = format!(r#"{{"type":"assistant_reasoning","text":{}}}"#, escaped(&text, &how));
        same_verdict(json.as_bytes())?;
        let expected = Response::Chunk(AgenticLoopChunk::AssistantReasoning(TextChunk {
            text,
            ..TextChunk::default()
        }));
        prop_assert_eq!(decode_chunk(json.as_bytes()).expect("decodes"), expected);
    }

    /// Chunk JSON with bytes that matter to JSON replaced, inserted or
    /// removed: the same verdict from both paths.
    #[test]
    fn edited_chunks(
        chunk in strategy::chunk(),
        edits in prop::collection::vec((any::<usize>(), edit_byte(), 0u8..3), 1..4),
    ) {
        let mut json = serde_json::to_vec(&chunk).expect("serializes");
        for (at, byte, how) in edits {
            let len = json.len();
            match how {
                0 if len > 0 => json[at % len] = byte,
                1 => json.insert(at % (len + 1), byte),
                _ if len > 0 => {
                    json.remove(at % len);
                }
                _ => {}
            }
        }
        same_verdict(&json)?;
    }
}
