//! The fast path for chunk JSON: a reader written for the shapes encoders
//! actually send, tried before the serde path.
//!
//! Nearly every chunk on a run-loop channel is a small flat object whose
//! first member is `type` (every encoder here, the reference implementation
//! and serde's `tag = "type"` write it first) and whose other members are
//! strings, a few counts and flags. For those this module walks the bytes
//! once and builds the chunk directly: strings are copied (and unescaped)
//! straight into the chunk's own `String`, not through serde_json's scratch
//! buffer and a visitor. Long tool output, which is most of a loop's bytes,
//! is mostly escapes (quotes, newlines), so that copy is where it counts.
//!
//! # Giving up is its only answer
//!
//! [`chunk`] never decides that a payload is bad. On anything it does not
//! handle, or anything wrong, it returns `None` and the caller parses the
//! payload with the serde path ([`AgenticLoopChunk`]'s `Deserialize`),
//! which then decides: so what is accepted, what each chunk decodes to and
//! every error message stay those of the serde path. It gives up on: a
//! first member other than `type`; an escape in a member name or in the
//! `type` string; a lone surrogate escape; a control character in a string;
//! a count that is not a plain non-negative integer within `u64`; a
//! duplicate member; a trailing comma; anything after the object.
//!
//! Members whose values are themselves structured (`_meta`, `annotations`,
//! `logprobs`, `structuredContent`, `message`, unknown members, content
//! blocks other than plain text) are handed to serde_json on the exact
//! bytes where they start, with the type the serde path reads them as, so
//! they are read exactly as it reads them. One difference is accounted
//! for: a fresh serde_json reader allows 127 levels of nesting from where
//! it starts, while the whole-payload reader counts the levels around the
//! member too; a value that could reach the limit is measured, and the
//! fast path gives up if the serde path would have refused it.
//!
//! The two paths are held to the same results by the `run_loop_frame` fuzz
//! target (every input through both), the `fast_path` properties, and the
//! unit tests below.

use serde::de::{DeserializeOwned, IgnoredAny};

use super::chunk::{ChunkKind, check_priorities};
use super::{
    AgenticLoopChunk, MediaChunk, NotificationChunk, TextChunk, ToolCallChunk, ToolResponseChunk,
    UsageChunk, UserChunk,
};
use crate::mcp::{ContentBlock, TextContent};

/// The chunk in `json`, or `None` when the serde path must decide.
pub(super) fn chunk(json: &str) -> Option<AgenticLoopChunk> {
    use AgenticLoopChunk as C;
    let mut at = Scanner { text: json, pos: 0 };
    at.whitespace();
    at.byte(b'{')?;
    at.whitespace();
    if at.key()? != "type" {
        return None;
    }
    let kind = ChunkKind::from_name(at.plain()?)?;
    let chunk = match kind {
        ChunkKind::AssistantReasoning => C::AssistantReasoning(at.text_chunk()?),
        ChunkKind::AssistantTextContent => C::AssistantTextContent(at.text_chunk()?),
        ChunkKind::AssistantRefusal => C::AssistantRefusal(at.text_chunk()?),
        ChunkKind::AssistantToolCall => C::AssistantToolCall(at.tool_call()?),
        ChunkKind::AssistantImageContent => C::AssistantImageContent(at.media()?),
        ChunkKind::AssistantAudioContent => C::AssistantAudioContent(at.media()?),
        ChunkKind::ToolResponse => C::ToolResponse(at.tool_response()?),
        ChunkKind::User => C::User(at.user()?),
        ChunkKind::Usage => C::Usage(at.usage()?),
        ChunkKind::Notification => C::Notification(at.notification()?),
    };
    at.whitespace();
    if at.pos != json.len() {
        return None;
    }
    check_priorities(&chunk).ok()?;
    Some(chunk)
}

/// How many containers (objects, arrays) enclose a chunk's own members.
const TOP: usize = 1;
/// How many enclose the members of a tool response's content block.
const IN_BLOCK: usize = 3;
/// serde_json refuses a value nested this deep, counting from the payload.
const DEPTH_LIMIT: usize = 128;
/// The most room reserved at once for an escaped string.
const ROOM: usize = 4096;

/// Fills a member's slot; a member that is already there is a duplicate,
/// which the serde path refuses.
fn put<T>(slot: &mut Option<T>, value: T) -> Option<()> {
    match slot {
        Some(_) => None,
        None => {
            *slot = Some(value);
            Some(())
        }
    }
}

/// A position in chunk JSON that is known to be UTF-8.
struct Scanner<'a> {
    text: &'a str,
    pos: usize,
}

impl<'a> Scanner<'a> {
    fn bytes(&self) -> &'a [u8] {
        self.text.as_bytes()
    }

    fn whitespace(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.bytes().get(self.pos) {
            self.pos += 1;
        }
    }

    /// Consumes `want` if it is the next byte.
    fn byte(&mut self, want: u8) -> Option<()> {
        (*self.bytes().get(self.pos)? == want).then(|| self.pos += 1)
    }

    /// Consumes the next byte.
    fn next_byte(&mut self) -> Option<u8> {
        let byte = *self.bytes().get(self.pos)?;
        self.pos += 1;
        Some(byte)
    }

    /// Consumes `word` (`null`, `true`, `false`) if it comes next.
    fn literal(&mut self, word: &[u8]) -> Option<()> {
        let end = self.pos + word.len();
        (self.bytes().get(self.pos..end)? == word).then(|| self.pos = end)
    }

    /// A string without escapes, borrowed: a member name or the `type`.
    fn plain(&mut self) -> Option<&'a str> {
        self.byte(b'"')?;
        let start = self.pos;
        let end = plain_run(self.bytes(), start)?;
        (self.bytes()[end] == b'"').then_some(())?;
        self.pos = end + 1;
        self.text.get(start..end)
    }

    /// A member name and its colon, leaving the position on the value.
    fn key(&mut self) -> Option<&'a str> {
        let key = self.plain()?;
        self.whitespace();
        self.byte(b':')?;
        self.whitespace();
        Some(key)
    }

    /// A string value, unescaped into a string of its own.
    fn string(&mut self) -> Option<String> {
        self.byte(b'"')?;
        let bytes = self.bytes();
        let start = self.pos;
        let mut end = plain_run(bytes, start)?;
        if bytes[end] == b'"' {
            self.pos = end + 1;
            return self.text.get(start..end).map(str::to_owned);
        }
        // Unescaping never lengthens text, so what is left of the payload
        // is enough room for the whole string; up to a page of it is
        // reserved at once, so that a payload of many short escaped strings
        // does not reserve its own length for each. What is not used is
        // given back at the end.
        let mut out = String::with_capacity((bytes.len() - start).min(ROOM));
        let mut from = start;
        loop {
            out.push_str(self.text.get(from..end)?);
            match bytes[end] {
                b'"' => break,
                b'\\' => from = self.escape(end + 1, &mut out)?,
                _ => return None,
            }
            end = plain_run(bytes, from)?;
        }
        self.pos = end + 1;
        if out.capacity() - out.len() > 64 {
            out.shrink_to_fit();
        }
        Some(out)
    }

    /// Appends the character the escape after a backslash at `at - 1`
    /// stands for; returns where the text resumes.
    fn escape(&self, at: usize, out: &mut String) -> Option<usize> {
        let unescaped = match *self.bytes().get(at)? {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                let unit = self.hex4(at + 1)?;
                let (code, next) = match unit {
                    0xD800..=0xDBFF => {
                        (self.bytes().get(at + 5..at + 7)? == b"\\u").then_some(())?;
                        let low = self.hex4(at + 7)?;
                        (0xDC00..=0xDFFF).contains(&low).then_some(())?;
                        (0x10000 + ((unit - 0xD800) << 10 | (low - 0xDC00)), at + 11)
                    }
                    0xDC00..=0xDFFF => return None,
                    _ => (unit, at + 5),
                };
                out.push(char::from_u32(code)?);
                return Some(next);
            }
            _ => return None,
        };
        out.push(unescaped);
        Some(at + 1)
    }

    /// The four hex digits of a `\u` escape at `at`.
    fn hex4(&self, at: usize) -> Option<u32> {
        self.bytes()
            .get(at..at + 4)?
            .iter()
            .try_fold(0, |code, &digit| {
                Some(code * 16 + char::from(digit).to_digit(16)?)
            })
    }

    /// `null`, or what `read` reads: an optional member's value.
    fn or_null<T>(&mut self, read: impl FnOnce(&mut Self) -> Option<T>) -> Option<Option<T>> {
        if self.bytes().get(self.pos) == Some(&b'n') {
            self.literal(b"null")?;
            return Some(None);
        }
        read(self).map(Some)
    }

    fn boolean(&mut self) -> Option<bool> {
        match self.bytes().get(self.pos)? {
            b't' => self.literal(b"true").map(|()| true),
            b'f' => self.literal(b"false").map(|()| false),
            _ => None,
        }
    }

    /// A count: digits only, no leading zero, within `u64`.
    fn count(&mut self) -> Option<u64> {
        let start = self.pos;
        let mut count: u64 = 0;
        while let Some(&digit @ b'0'..=b'9') = self.bytes().get(self.pos) {
            count = count
                .checked_mul(10)?
                .checked_add(u64::from(digit - b'0'))?;
            self.pos += 1;
        }
        let digits = self.pos - start;
        let leading_zero = digits > 1 && self.bytes()[start] == b'0';
        let fraction = matches!(self.bytes().get(self.pos), Some(b'.' | b'e' | b'E'));
        (digits > 0 && !leading_zero && !fraction).then_some(count)
    }

    /// A structured value read by serde_json as `T`, from where it starts;
    /// `depth` containers enclose it.
    fn nested<T: DeserializeOwned>(&mut self, depth: usize) -> Option<T> {
        let rest = self.text.get(self.pos..)?;
        let mut values = serde_json::Deserializer::from_str(rest).into_iter::<T>();
        let value = values.next()?.ok()?;
        let used = values.byte_offset();
        // Only a value of at least two bytes a level can be nested deep
        // enough for the whole-payload reader to refuse it.
        if used >= 2 * (DEPTH_LIMIT - depth)
            && depth + nesting(&self.bytes()[self.pos..][..used]) >= DEPTH_LIMIT
        {
            return None;
        }
        self.pos += used;
        Some(value)
    }

    /// The members after `type`, each handed to `member` with the position
    /// on its value, up to and including the closing brace.
    fn members(&mut self, mut member: impl FnMut(&mut Self, &'a str) -> Option<()>) -> Option<()> {
        loop {
            self.whitespace();
            match self.next_byte()? {
                b'}' => return Some(()),
                b',' => {
                    self.whitespace();
                    let key = self.key()?;
                    // A second `type` is refused by the serde path.
                    if key == "type" {
                        return None;
                    }
                    member(self, key)?;
                }
                _ => return None,
            }
        }
    }

    fn text_chunk(&mut self) -> Option<TextChunk> {
        let (mut text, mut annotations, mut meta, mut parent, mut logprobs) =
            (None, None, None, None, None);
        self.members(|at, key| match key {
            "text" => put(&mut text, at.string()?),
            "annotations" => put(&mut annotations, at.nested(TOP)?),
            "_meta" => put(&mut meta, at.nested(TOP)?),
            "parent_tool_call_id" => put(&mut parent, at.or_null(Self::string)?),
            "logprobs" => put(&mut logprobs, at.nested(TOP)?),
            _ => at.nested::<IgnoredAny>(TOP).map(drop),
        })?;
        Some(TextChunk {
            text: text?,
            annotations: annotations.flatten(),
            meta: meta.flatten(),
            parent_tool_call_id: parent.flatten(),
            logprobs: logprobs.flatten(),
        })
    }

    fn tool_call(&mut self) -> Option<ToolCallChunk> {
        let (mut id, mut name, mut arguments, mut meta, mut parent) =
            (None, None, None, None, None);
        self.members(|at, key| match key {
            "id" => put(&mut id, at.string()?),
            "name" => put(&mut name, at.string()?),
            "arguments" => put(&mut arguments, at.or_null(Self::string)?),
            "_meta" => put(&mut meta, at.nested(TOP)?),
            "parent_tool_call_id" => put(&mut parent, at.or_null(Self::string)?),
            _ => at.nested::<IgnoredAny>(TOP).map(drop),
        })?;
        Some(ToolCallChunk {
            id: id?,
            name: name?,
            arguments: arguments.flatten(),
            meta: meta.flatten(),
            parent_tool_call_id: parent.flatten(),
        })
    }

    fn media(&mut self) -> Option<MediaChunk> {
        let (mut data, mut mime_type, mut annotations, mut meta, mut parent) =
            (None, None, None, None, None);
        self.members(|at, key| match key {
            "data" => put(&mut data, at.string()?),
            "mimeType" => put(&mut mime_type, at.string()?),
            "annotations" => put(&mut annotations, at.nested(TOP)?),
            "_meta" => put(&mut meta, at.nested(TOP)?),
            "parent_tool_call_id" => put(&mut parent, at.or_null(Self::string)?),
            _ => at.nested::<IgnoredAny>(TOP).map(drop),
        })?;
        Some(MediaChunk {
            data: data?,
            mime_type: mime_type?,
            annotations: annotations.flatten(),
            meta: meta.flatten(),
            parent_tool_call_id: parent.flatten(),
        })
    }

    fn tool_response(&mut self) -> Option<ToolResponseChunk> {
        let (mut id, mut content, mut structured, mut is_error, mut meta, mut parent) =
            (None, None, None, None, None, None);
        self.members(|at, key| match key {
            "id" => put(&mut id, at.string()?),
            "content" => put(&mut content, at.content()?),
            "structuredContent" => put(&mut structured, at.nested(TOP)?),
            "isError" => put(&mut is_error, at.or_null(Self::boolean)?),
            "_meta" => put(&mut meta, at.nested(TOP)?),
            "parent_tool_call_id" => put(&mut parent, at.or_null(Self::string)?),
            _ => at.nested::<IgnoredAny>(TOP).map(drop),
        })?;
        Some(ToolResponseChunk {
            id: id?,
            content: content?,
            structured_content: structured.flatten(),
            is_error: is_error.flatten(),
            meta: meta.flatten(),
            parent_tool_call_id: parent.flatten(),
        })
    }

    fn user(&mut self) -> Option<UserChunk> {
        let (mut prompt, mut meta) = (None, None);
        self.members(|at, key| match key {
            "prompt" => put(&mut prompt, at.string()?),
            "_meta" => put(&mut meta, at.nested(TOP)?),
            _ => at.nested::<IgnoredAny>(TOP).map(drop),
        })?;
        Some(UserChunk {
            prompt: prompt?,
            meta: meta.flatten(),
        })
    }

    fn usage(&mut self) -> Option<UsageChunk> {
        let (mut completion, mut prompt, mut total, mut meta) = (None, None, None, None);
        self.members(|at, key| match key {
            "completion_tokens" => put(&mut completion, at.count()?),
            "prompt_tokens" => put(&mut prompt, at.count()?),
            "total_tokens" => put(&mut total, at.count()?),
            "_meta" => put(&mut meta, at.nested(TOP)?),
            _ => at.nested::<IgnoredAny>(TOP).map(drop),
        })?;
        Some(UsageChunk {
            completion_tokens: completion?,
            prompt_tokens: prompt?,
            total_tokens: total?,
            meta: meta.flatten(),
        })
    }

    fn notification(&mut self) -> Option<NotificationChunk> {
        let (mut is_fatal, mut message, mut meta) = (None, None, None);
        self.members(|at, key| match key {
            "is_fatal" => put(&mut is_fatal, at.boolean()?),
            "message" => put(&mut message, at.nested(TOP)?),
            "_meta" => put(&mut meta, at.nested(TOP)?),
            _ => at.nested::<IgnoredAny>(TOP).map(drop),
        })?;
        Some(NotificationChunk {
            is_fatal: is_fatal?,
            message: message?,
            meta: meta.flatten(),
        })
    }

    /// A tool response's content blocks.
    fn content(&mut self) -> Option<Vec<ContentBlock>> {
        self.byte(b'[')?;
        let mut blocks = Vec::new();
        self.whitespace();
        if self.byte(b']').is_some() {
            return Some(blocks);
        }
        loop {
            self.whitespace();
            blocks.push(self.block()?);
            self.whitespace();
            match self.next_byte()? {
                b',' => {}
                b']' => return Some(blocks),
                _ => return None,
            }
        }
    }

    /// One content block: a text block by hand, any other by serde_json.
    fn block(&mut self) -> Option<ContentBlock> {
        let start = self.pos;
        if let Some(text) = self.text_block() {
            return Some(ContentBlock::Text(text));
        }
        self.pos = start;
        self.nested(TOP + 1)
    }

    /// A block whose first member is `"type":"text"` and whose others are
    /// `text`, `annotations` and `_meta`.
    fn text_block(&mut self) -> Option<TextContent> {
        self.byte(b'{')?;
        self.whitespace();
        if self.key()? != "type" || self.plain()? != "text" {
            return None;
        }
        let (mut text, mut annotations, mut meta) = (None, None, None);
        self.members(|at, key| match key {
            "text" => put(&mut text, at.string()?),
            "annotations" => put(&mut annotations, at.nested(IN_BLOCK)?),
            "_meta" => put(&mut meta, at.nested(IN_BLOCK)?),
            _ => None,
        })?;
        Some(TextContent {
            text: text?,
            meta: meta.flatten(),
            annotations: annotations.flatten(),
        })
    }
}

/// The index of the first quote, backslash or control character at or after
/// `at`: where a run of bytes that stand for themselves in a string ends.
/// `None` if the text ends first.
///
/// Eight bytes at a time: for each byte test, the lowest flagged byte of a
/// word is exactly the first match (a borrow only moves up from a byte that
/// matches), so the lowest flag of the three tests together is the answer.
fn plain_run(bytes: &[u8], mut at: usize) -> Option<usize> {
    const ONES: u64 = u64::from_ne_bytes([1; 8]);
    const HIGH: u64 = ONES << 7;
    const QUOTES: u64 = ONES * b'"' as u64;
    const BACKSLASHES: u64 = ONES * b'\\' as u64;
    const SPACES: u64 = ONES * b' ' as u64;
    while let Some(word) = bytes.get(at..at + 8) {
        let word = u64::from_le_bytes(word.try_into().ok()?);
        let quote = word ^ QUOTES;
        let backslash = word ^ BACKSLASHES;
        let found = (quote.wrapping_sub(ONES) & !quote
            | backslash.wrapping_sub(ONES) & !backslash
            | word.wrapping_sub(SPACES) & !word)
            & HIGH;
        if found != 0 {
            return Some(at + found.trailing_zeros() as usize / 8);
        }
        at += 8;
    }
    let tail = bytes.get(at..)?;
    let found = tail
        .iter()
        .position(|&b| b == b'"' || b == b'\\' || b < b' ')?;
    Some(at + found)
}

/// How deeply a JSON value that serde_json has already read nests.
fn nesting(value: &[u8]) -> usize {
    let (mut depth, mut deepest, mut in_string, mut escaped) = (0usize, 0, false, false);
    for &byte in value {
        if in_string {
            if escaped {
                escaped = false;
            } else if byte == b'\\' {
                escaped = true;
            } else if byte == b'"' {
                in_string = false;
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run_loop::chunk::tests::{every_kind_full, every_kind_minimal};

    /// The serde path's verdict on `json`.
    fn serde_path(json: &str) -> Result<AgenticLoopChunk, serde_json::Error> {
        serde_json::from_str(json)
    }

    /// Both paths agree on `json`, and the fast path takes it (`taken`) or
    /// gives it up (`!taken`).
    #[track_caller]
    fn agree(json: &str, taken: bool) {
        let fast = chunk(json);
        assert_eq!(fast.is_some(), taken, "taken? {json}");
        if let Some(fast) = fast {
            assert_eq!(
                serde_path(json).expect("the serde path decodes it"),
                fast,
                "{json}"
            );
        }
    }

    #[test]
    fn takes_every_kind_as_encoders_write_it() {
        for chunk in every_kind_full().into_iter().chain(every_kind_minimal()) {
            let compact = serde_json::to_string(&chunk).expect("encodes");
            agree(&compact, true);
            let pretty = serde_json::to_string_pretty(&chunk).expect("encodes");
            agree(&pretty, true);
            assert_eq!(super::chunk(&compact), Some(chunk));
        }
    }

    #[test]
    fn strings_unescape_as_serde_json_does() {
        for text in [
            r"plain",
            r"",
            r#"say \"hi\"\n\tthen \\ and \/ \b\f\r"#,
            r"\u0000\u001f\u0041\u00e9\u20ac\uFFFF\uabcd",
            r"pair \ud83d\ude00 and \uD834\uDD1E",
            "na\u{ef}ve \u{2192} \u{1f600} raw",
            r"ends with escape \n",
            r"\n",
            r#"\"\"\"\"\"\"\"\"\"\"\"\"\"\"\"\"\""#,
            r"twenty-four bytes long! then \t an escape after the first words",
        ] {
            let json = format!(r#"{{"type":"assistant_text_content","text":"{text}"}}"#);
            agree(&json, true);
        }
    }

    #[test]
    fn gives_up_on_strings_serde_json_refuses_or_reads_otherwise() {
        for text in [
            r"lone \ud83d high",
            r"lone \ude00 low",
            r"high then other \ud83d\u0041",
            r"high at the end \ud83d",
            r"short \u12",
            r"bad hex \u12g4",
            r"unknown \x41 escape",
            "control \u{1} byte",
            "a tab\tinside",
            "a newline\ninside",
        ] {
            let json = format!(r#"{{"type":"user","prompt":"{text}"}}"#);
            agree(&json, false);
        }
        agree(r#"{"type":"user","prompt":"unterminated"#, false);
        agree(r#"{"type":"user","prompt":"ends in a backslash\"#, false);
    }

    #[test]
    fn counts_are_plain_integers_or_the_serde_path_decides() {
        let usage = |n: &str| {
            format!(
                r#"{{"type":"usage","completion_tokens":{n},"prompt_tokens":2,"total_tokens":3}}"#
            )
        };
        for n in ["0", "7", "1234567890", "18446744073709551615"] {
            agree(&usage(n), true);
        }
        for n in [
            "-0",
            "-1",
            "01",
            "00",
            "1.0",
            "1e2",
            "1E2",
            "18446744073709551616",
            "null",
            "\"1\"",
            "",
            "true",
        ] {
            agree(&usage(n), false);
        }
    }

    #[test]
    fn gives_up_on_shapes_it_does_not_read() {
        for json in [
            // `type` later, or not at all.
            r#"{"text":"a","type":"assistant_reasoning"}"#,
            r#"{}"#,
            r#"[]"#,
            r#""#,
            // Escapes in names or in the kind.
            r#"{"type":"assistant_reasoning","te\u0078t":"a"}"#,
            r#"{"t\u0079pe":"assistant_reasoning","text":"a"}"#,
            r#"{"type":"assistant_re\u0061soning","text":"a"}"#,
            // Unknown kind, second `type`, duplicates, missing members.
            r#"{"type":"nope","text":"a"}"#,
            r#"{"type":"assistant_reasoning","text":"a","type":"user"}"#,
            r#"{"type":"assistant_reasoning","text":"a","text":"b"}"#,
            r#"{"type":"assistant_reasoning","text":"a","_meta":null,"_meta":{}}"#,
            r#"{"type":"assistant_reasoning"}"#,
            r#"{"type":"assistant_tool_call","id":"c"}"#,
            r#"{"type":"notification","is_fatal":false}"#,
            r#"{"type":"tool_response","id":"c","content":null}"#,
            // Punctuation.
            r#"{"type":"assistant_reasoning","text":"a",}"#,
            r#"{"type":"assistant_reasoning","text":"a"} x"#,
            r#"{"type":"assistant_reasoning","text":"a"}{}"#,
            r#"{"type":"assistant_reasoning" "text":"a"}"#,
            r#"{"type":"assistant_reasoning","text" "a"}"#,
            r#"{"type":"assistant_reasoning","text":"a""#,
            r#"{"type":"assistant_reasoning","text":"a","x":tru}"#,
            r#"{"type":"tool_response","id":"c","content":[{"type":"text","text":"a"},]}"#,
            r#"{"type":"tool_response","id":"c","content":[{"type":"text","text":"a"}"#,
            // Wrong types of value.
            r#"{"type":"assistant_reasoning","text":null}"#,
            r#"{"type":"assistant_reasoning","text":"a","parent_tool_call_id":7}"#,
            r#"{"type":"tool_response","id":"c","content":[],"isError":"yes"}"#,
            r#"{"type":"notification","is_fatal":null,"message":1}"#,
            r#"{"type":"assistant_reasoning","text":"a","annotations":{"priority":1e39}}"#,
        ] {
            agree(json, false);
        }
    }

    #[test]
    fn takes_what_serde_json_takes_around_the_members() {
        for json in [
            " \t\r\n{ \"type\" : \"assistant_reasoning\" , \"text\" : \"a\" } \n",
            r#"{"type":"assistant_reasoning","text":"a","parent_tool_call_id":null}"#,
            r#"{"type":"assistant_reasoning","text":"a","unknown":{"deep":[1,2,{"x":null}]}}"#,
            r#"{"type":"assistant_reasoning","text":"a","extra":-1.5e3,"more":true}"#,
            r#"{"type":"assistant_tool_call","id":"c","name":"n","arguments":null}"#,
            r#"{"type":"tool_response","id":"c","content":[],"isError":null}"#,
            r#"{"type":"tool_response","id":"c","content":[ ],"structuredContent":null}"#,
            r#"{"type":"tool_response","id":"c","content":[{"type":"text","text":"a","annotations":{"priority":0.5},"_meta":{"k":1}}]}"#,
            // Blocks the fast path hands to serde_json whole.
            r#"{"type":"tool_response","id":"c","content":[{"text":"a","type":"text"}]}"#,
            r#"{"type":"tool_response","id":"c","content":[{"type":"text","text":"a","extra":1}]}"#,
            r#"{"type":"tool_response","id":"c","content":[{"type":"image","data":"AA==","mimeType":"image/png"},{"type":"text","text":"b"}]}"#,
            r#"{"type":"notification","is_fatal":true,"message":null}"#,
            r#"{"type":"notification","is_fatal":false,"message":[{"a":"\u00e9"}]}"#,
        ] {
            agree(json, true);
        }
        // A block with a second `type`, or a duplicate `text`, is refused by
        // serde_json after the fast path hands it over.
        agree(
            r#"{"type":"tool_response","id":"c","content":[{"type":"text","type":"text","text":"a"}]}"#,
            false,
        );
        agree(
            r#"{"type":"tool_response","id":"c","content":[{"type":"text","text":"a","text":"b"}]}"#,
            false,
        );
    }

    /// A value nested `levels` deep: `[[…[]…]]`.
    fn nested_arrays(levels: usize) -> String {
        format!("{}{}", "[".repeat(levels), "]".repeat(levels))
    }

    #[test]
    fn nesting_is_refused_where_the_whole_payload_reader_refuses_it() {
        // serde_json refuses the 128th level counting the chunk's own object,
        // which a reader starting on the member would not.
        for (levels, accepted) in [(125, true), (126, true), (127, false), (128, false)] {
            let json = format!(
                r#"{{"type":"assistant_reasoning","text":"a","_meta":{{"k":{}}}}}"#,
                nested_arrays(levels - 1)
            );
            assert_eq!(serde_path(&json).is_ok(), accepted, "{levels}");
            agree(&json, accepted);
        }
        // Inside a content block three levels are taken already.
        for (levels, accepted) in [(124, true), (125, false)] {
            let json = format!(
                r#"{{"type":"tool_response","id":"c","content":[{{"type":"text","text":"a","_meta":{{"k":{}}}}}]}}"#,
                nested_arrays(levels - 1)
            );
            assert_eq!(serde_path(&json).is_ok(), accepted, "{levels}");
            agree(&json, accepted);
        }
        // serde_json skips unknown members without a limit; the fast path
        // gives those up (and the serde path takes them).
        let json = format!(
            r#"{{"type":"assistant_reasoning","text":"a","x":{}}}"#,
            nested_arrays(127)
        );
        assert!(serde_path(&json).is_ok());
        agree(&json, false);
    }

    #[test]
    fn nesting_counts_brackets_outside_strings() {
        assert_eq!(nesting(b"1"), 0);
        assert_eq!(nesting(br#"{"a":[1,{"b":"[[[{{"}]}"#), 3);
        assert_eq!(nesting(br#"["\"[", ["\\"], "]"]"#), 2);
        assert_eq!(nesting(br#"[[],[[]],[]]"#), 3);
    }

    #[test]
    fn plain_run_finds_the_first_stop_byte_at_every_alignment() {
        let naive = |bytes: &[u8], at: usize| {
            bytes[at..]
                .iter()
                .position(|&b| b == b'"' || b == b'\\' || b < b' ')
                .map(|i| at + i)
        };
        for stop in [b'"', b'\\', 0, 0x1f] {
            for len in 0..40 {
                for place in 0..=len {
                    // Bytes that are close to the stop bytes but are not
                    // stops, around one stop byte (or none, at `len`).
                    let mut bytes: Vec<u8> = (0..len)
                        .map(|i| {
                            [b' ', b'!', b'#', b'[', b']', 0x7f, 0x80, 0xa2, 0xdc, 0xff][i % 10]
                        })
                        .collect();
                    if place < len {
                        bytes[place] = stop;
                    }
                    for at in 0..=len {
                        assert_eq!(
                            plain_run(&bytes, at),
                            naive(&bytes, at),
                            "{bytes:?} from {at}"
                        );
                    }
                }
            }
        }
    }
}
