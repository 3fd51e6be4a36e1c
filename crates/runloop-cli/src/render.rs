//! The rendering of one loop: for a person, as JSON lines or a transcript
//! for a script, or as the assistant's text alone.
//!
//! A loop arrives as [`Step`]s and ends with one [`Outcome`]; [`Render`]
//! prints each step as it comes, so text appears while the model writes it.
//!
//! ```text
//! reasoning: The user wants the file first.          dimmed
//! Let me read it.                                    streamed as it arrives
//! tool call read_file (call_7): {"path":"a.rs"}      arguments assembled
//! tool response (call_7): fn main() {}
//! [call_7] reasoning: …                              a sub-agent's thread
//! notification: retrying                             highlighted; fatal ones in red
//! ─── the notes, on their own stream (stderr for `run`) ───
//! usage: 1352 tokens (1310 prompt, 42 completion)    summed over the loop
//! the loop finished                                  the ending, in words, with the error if any
//! ```
//!
//! The data and the notes are apart so that a command's stdout holds only
//! the loop: `run` writes the notes (the summed usage and the ending) to
//! stderr, where a person still sees them under the loop and a pipe does
//! not get them. The loop's error is shown once, in the ending line, not
//! also as a line of its own. Each [`Format`] says what the data is; JSON
//! lines carry their outcome in the data, so they have no notes, and
//! [`Format::Quiet`] has notes only for a loop that did not finish.
//!
//! The fragments of a loop are followed with a [`Transcript`], which says
//! where each chunk went: a text fragment that went into the block being
//! printed is printed right after it, anything else starts a new line. So
//! the rules for what belongs together are the transcript's, not repeated
//! here. Tool-call fragments may interleave, so a call is shown once its
//! arguments have stopped growing, that is when something else is printed
//! or the loop ends; a fragment that arrives for a call already shown shows
//! the call again, whole.
//!
//! The rendering for a person always writes styles; the stream it is given
//! decides whether they reach the screen. The `run` command hands it an
//! `anstream::AutoStream`, which keeps them for a terminal (or `--color
//! always`) and strips them for a pipe, a file, or when `NO_COLOR` is set,
//! so plain text has exactly the content of the terminal rendering. Text
//! from the wire has its control characters (other than line breaks and
//! tabs) replaced, so an agent cannot drive the terminal. The JSON
//! rendering is the same JSON lines as `decode` prints for one channel,
//! without `scope` and `channel`.

use std::io::{self, Write};

use anstyle::{AnsiColor, Style};
use runloop_proto::ErrorValue;
use runloop_proto::mcp::{ContentBlock, ResourceContents};
use runloop_proto::run_loop::{
    AgenticLoopChunk, MediaChunk, NotificationChunk, Outcome, Step, ToolCallChunk,
    ToolResponseChunk, Transcript, UsageCounts,
};
use serde_json::Value;

use crate::json;

/// How a loop is rendered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Every chunk, for a person, with styles (which the stream may strip).
    Pretty,
    /// One JSON object per line: `{"chunk":…}`, `{"error":…}`, then
    /// `{"outcome":…}`.
    Json,
    /// The assistant's text on the main thread, and nothing else, as it
    /// streams; a line break at the end.
    Text,
    /// At the end, one JSON object: the loop coalesced (protocol §11), its
    /// error if any, and its outcome.
    Transcript,
    /// No data at all.
    Quiet,
}

const REASONING: Style = Style::new().dimmed();
const THREAD: Style = Style::new().dimmed();
const LABEL: Style = Style::new().bold();
const REFUSAL: Style = AnsiColor::Yellow.on_default();
const NOTIFICATION: Style = AnsiColor::Yellow.on_default().bold();
const FATAL: Style = AnsiColor::Red.on_default().bold();
const ERROR: Style = AnsiColor::Red.on_default().bold();
const USAGE: Style = Style::new().dimmed();
const FINISHED: Style = AnsiColor::Green.on_default().bold();
const NOT_FINISHED: Style = AnsiColor::Red.on_default().bold();

/// Renders one loop, step by step, to `W`.
#[derive(Debug)]
pub struct Render<W> {
    out: W,
    format: Format,
    transcript: Transcript,
    /// The sum of the usage deltas, once there has been one.
    usage: Option<UsageCounts>,
    /// The transcript index of the text block the last output belongs to,
    /// while its fragments can still be continued in place.
    streaming: Option<usize>,
    /// Whether the cursor is past the start of a line.
    mid_line: bool,
    /// Tool calls (transcript indices) not shown yet, in the order they came.
    pending: Vec<usize>,
    /// The loop's error, for the transcript's document.
    error: Option<ErrorValue>,
}

impl<W: Write> Render<W> {
    /// A renderer writing to `out`.
    pub fn new(out: W, format: Format) -> Self {
        Render {
            out,
            format,
            transcript: Transcript::new(),
            usage: None,
            streaming: None,
            mid_line: false,
            pending: Vec::new(),
            error: None,
        }
    }

    /// The stream, once the loop is rendered.
    pub fn into_inner(self) -> W {
        self.out
    }

    /// Ends the line being written, if any, so that other output can come
    /// between this loop's lines; the loop's next text starts a new block.
    pub fn break_line(&mut self) -> io::Result<()> {
        self.start_line()?;
        self.streaming = None;
        Ok(())
    }

    /// The stream, while the loop is rendered.
    pub fn out_mut(&mut self) -> &mut W {
        &mut self.out
    }

    /// One step of the reader: a chunk, the error, or the ending (its notes
    /// on the data stream).
    pub fn step(&mut self, step: Step) -> io::Result<()> {
        match step {
            Step::Chunk(chunk) => self.chunk(chunk),
            Step::Error(error) => self.error(&error),
            Step::End(outcome) => self.outcome(&outcome, None),
        }
    }

    /// A chunk of the loop.
    pub fn chunk(&mut self, chunk: AgenticLoopChunk) -> io::Result<()> {
        match self.format {
            Format::Json => {
                let json = serde_json::to_vec(&chunk).map_err(io::Error::other)?;
                json::chunk(&mut self.out, json::At::default(), &json)?;
                return self.out.flush();
            }
            Format::Text => return self.text_only(chunk),
            Format::Transcript => {
                self.transcript.push(chunk);
                return Ok(());
            }
            Format::Quiet => return Ok(()),
            Format::Pretty => {}
        }
        match &chunk {
            AgenticLoopChunk::Usage(usage) => {
                *self.usage.get_or_insert_with(UsageCounts::default) += usage.counts();
                self.transcript.push(chunk);
            }
            AgenticLoopChunk::AssistantToolCall(_) => {
                let at = self.transcript.push(chunk);
                if !self.pending.contains(&at) {
                    self.pending.push(at);
                }
            }
            AgenticLoopChunk::AssistantReasoning(fragment)
            | AgenticLoopChunk::AssistantTextContent(fragment)
            | AgenticLoopChunk::AssistantRefusal(fragment) => {
                let (label, style) = match chunk {
                    AgenticLoopChunk::AssistantReasoning(_) => (Some("reasoning:"), REASONING),
                    AgenticLoopChunk::AssistantRefusal(_) => (Some("refusal:"), REFUSAL),
                    _ => (None, Style::new()),
                };
                let text = clean(&fragment.text);
                let thread = fragment.parent_tool_call_id.clone();
                let at = self.transcript.push(chunk);
                self.show_pending()?;
                if self.streaming != Some(at) {
                    self.start_line()?;
                    self.prefix(thread.as_deref(), label, style)?;
                    self.streaming = Some(at);
                }
                write!(self.out, "{style}{text}{style:#}")?;
                if text.ends_with('\n') {
                    self.mid_line = false;
                } else if !text.is_empty() {
                    self.mid_line = true;
                }
            }
            _ => {
                self.show_pending()?;
                self.start_line()?;
                self.whole(&chunk)?;
                self.streaming = None;
                self.transcript.push(chunk);
            }
        }
        self.out.flush()
    }

    /// A chunk and its JSON as it came: JSON lines print that JSON
    /// unchanged, the other formats read the chunk.
    pub fn chunk_with_json(&mut self, chunk: AgenticLoopChunk, raw: &[u8]) -> io::Result<()> {
        if self.format == Format::Json {
            json::chunk(&mut self.out, json::At::default(), raw)?;
            return self.out.flush();
        }
        self.chunk(chunk)
    }

    /// `--text`: a text fragment of the main thread, as it is; a block of
    /// text that other chunks interrupted starts on a line of its own.
    fn text_only(&mut self, chunk: AgenticLoopChunk) -> io::Result<()> {
        let text = match &chunk {
            AgenticLoopChunk::AssistantTextContent(fragment)
                if fragment.parent_tool_call_id.is_none() && !fragment.text.is_empty() =>
            {
                Some(clean(&fragment.text))
            }
            _ => None,
        };
        let at = self.transcript.push(chunk);
        let Some(text) = text else {
            return Ok(());
        };
        if self.streaming != Some(at) {
            self.start_line()?;
            self.streaming = Some(at);
        }
        write!(self.out, "{text}")?;
        self.mid_line = !text.ends_with('\n');
        self.out.flush()
    }

    /// The loop's error: there was no loop, or it did not finish. JSON
    /// lines print it as a line; for a person it is in the ending.
    pub fn error(&mut self, error: &ErrorValue) -> io::Result<()> {
        match self.format {
            Format::Json => {
                let json = serde_json::to_vec(error).map_err(io::Error::other)?;
                json::error(&mut self.out, json::At::default(), &json)?;
                self.out.flush()
            }
            Format::Transcript => {
                self.error = Some(error.clone());
                Ok(())
            }
            Format::Pretty | Format::Text | Format::Quiet => Ok(()),
        }
    }

    /// How the loop ended. JSON lines print the outcome line, a transcript
    /// its document; then the notes — the usage summed over the loop and
    /// the ending in words — go to `notes`, or to the data stream when
    /// there are none.
    pub fn outcome(&mut self, outcome: &Outcome, notes: Option<&mut dyn Write>) -> io::Result<()> {
        match self.format {
            Format::Json => {
                json::outcome(&mut self.out, json::At::default(), outcome)?;
                return self.out.flush();
            }
            Format::Transcript => self.transcript_document(outcome)?,
            Format::Pretty => self.show_pending()?,
            Format::Text | Format::Quiet => {}
        }
        self.start_line()?;
        self.streaming = None;
        self.out.flush()?;
        if self.format == Format::Quiet && outcome.is_success() {
            return Ok(());
        }
        let notes: &mut dyn Write = match notes {
            Some(notes) => notes,
            None => &mut self.out,
        };
        if let Some(usage) = self.usage.filter(|_| self.format == Format::Pretty) {
            writeln!(
                notes,
                "{USAGE}usage: {} tokens ({} prompt, {} completion){USAGE:#}",
                usage.total_tokens, usage.prompt_tokens, usage.completion_tokens
            )?;
        }
        let style = if outcome.is_success() {
            FINISHED
        } else {
            NOT_FINISHED
        };
        writeln!(notes, "{style}{outcome}{style:#}")?;
        notes.flush()
    }

    /// A time limit of the command ran out before the loop's ending: what
    /// came is shown (a tool call whose arguments were still growing, the
    /// line under way), then JSON lines end with `{"outcome":"timeout",
    /// "limit":OPTION,"seconds":N}` and a transcript with those members. The
    /// ending line in words is the command's failure, on stderr.
    pub fn timed_out(&mut self, option: &str, after: std::time::Duration) -> io::Result<()> {
        let mut ending = serde_json::Map::new();
        ending.insert("outcome".into(), "timeout".into());
        ending.insert("limit".into(), option.into());
        ending.insert("seconds".into(), after.as_secs_f64().into());
        match self.format {
            Format::Json => {
                serde_json::to_writer(&mut self.out, &ending).map_err(io::Error::other)?;
                self.out.write_all(b"\n")?;
            }
            Format::Transcript => {
                let mut document = self.transcript_and_error()?;
                document.extend(ending);
                serde_json::to_writer(&mut self.out, &document).map_err(io::Error::other)?;
                self.out.write_all(b"\n")?;
            }
            Format::Pretty => {
                self.show_pending()?;
                self.start_line()?;
            }
            Format::Text | Format::Quiet => self.start_line()?,
        }
        self.streaming = None;
        self.out.flush()
    }

    /// `--transcript`: the coalesced loop, its error and its outcome, as one
    /// JSON object on one line.
    fn transcript_document(&mut self, outcome: &Outcome) -> io::Result<()> {
        let mut document = self.transcript_and_error()?;
        let mut line = Vec::new();
        json::outcome(&mut line, json::At::default(), outcome)?;
        if let Ok(Value::Object(ending)) = serde_json::from_slice::<Value>(&line) {
            document.extend(ending);
        }
        serde_json::to_writer(&mut self.out, &document).map_err(io::Error::other)?;
        self.out.write_all(b"\n")
    }

    /// The `--transcript` document without its outcome: the coalesced loop
    /// (taken) and its error, if one came.
    fn transcript_and_error(&mut self) -> io::Result<serde_json::Map<String, Value>> {
        let mut document = serde_json::Map::new();
        let chunks = std::mem::take(&mut self.transcript).into_chunks();
        let chunks = serde_json::to_value(chunks).map_err(io::Error::other)?;
        document.insert("transcript".into(), chunks);
        if let Some(error) = self.error.take() {
            let error = serde_json::to_value(error).map_err(io::Error::other)?;
            document.insert("error".into(), error);
        }
        Ok(document)
    }

    /// Ends the line being written, if any.
    fn start_line(&mut self) -> io::Result<()> {
        if self.mid_line {
            self.out.write_all(b"\n")?;
            self.mid_line = false;
        }
        Ok(())
    }

    /// The thread of a sub-agent, then the label of the block.
    fn prefix(
        &mut self,
        thread: Option<&str>,
        label: Option<&str>,
        style: Style,
    ) -> io::Result<()> {
        if let Some(thread) = thread {
            write!(self.out, "{THREAD}[{}]{THREAD:#} ", clean(thread))?;
            self.mid_line = true;
        }
        if let Some(label) = label {
            write!(self.out, "{style}{label}{style:#} ")?;
            self.mid_line = true;
        }
        Ok(())
    }

    /// Shows the tool calls whose arguments are complete by now.
    fn show_pending(&mut self) -> io::Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        self.start_line()?;
        for at in std::mem::take(&mut self.pending) {
            if let Some(AgenticLoopChunk::AssistantToolCall(call)) =
                self.transcript.chunks().get(at)
            {
                write_call(&mut self.out, call)?;
            }
        }
        self.streaming = None;
        Ok(())
    }

    /// A chunk that comes whole, on lines of its own.
    fn whole(&mut self, chunk: &AgenticLoopChunk) -> io::Result<()> {
        let out = &mut self.out;
        if let Some(thread) = chunk.parent_tool_call_id() {
            write!(out, "{THREAD}[{}]{THREAD:#} ", clean(thread))?;
        }
        match chunk {
            AgenticLoopChunk::AssistantImageContent(media) => write_media(out, "image", media),
            AgenticLoopChunk::AssistantAudioContent(media) => write_media(out, "audio", media),
            AgenticLoopChunk::ToolResponse(response) => write_response(out, response),
            AgenticLoopChunk::User(user) => {
                writeln!(out, "{LABEL}user:{LABEL:#} {}", clean(&user.prompt))
            }
            AgenticLoopChunk::Notification(note) => write_notification(out, note),
            // Streamed and counted kinds are handled where they arrive.
            AgenticLoopChunk::AssistantReasoning(_)
            | AgenticLoopChunk::AssistantTextContent(_)
            | AgenticLoopChunk::AssistantRefusal(_)
            | AgenticLoopChunk::AssistantToolCall(_)
            | AgenticLoopChunk::Usage(_) => Ok(()),
        }
    }
}

fn write_call(out: &mut impl Write, call: &ToolCallChunk) -> io::Result<()> {
    if let Some(thread) = &call.parent_tool_call_id {
        write!(out, "{THREAD}[{}]{THREAD:#} ", clean(thread))?;
    }
    write!(
        out,
        "{LABEL}tool call{LABEL:#} {} ({})",
        clean(&call.name),
        clean(&call.id)
    )?;
    match &call.arguments {
        Some(arguments) => writeln!(out, ": {}", clean(arguments)),
        None => writeln!(out),
    }
}

fn write_media(out: &mut impl Write, what: &str, media: &MediaChunk) -> io::Result<()> {
    writeln!(
        out,
        "{LABEL}{what}:{LABEL:#} {}, {} characters of base64",
        clean(&media.mime_type),
        media.data.len()
    )
}

fn write_response(out: &mut impl Write, response: &ToolResponseChunk) -> io::Result<()> {
    let (label, style) = if response.is_error == Some(true) {
        ("tool error", ERROR)
    } else {
        ("tool response", LABEL)
    };
    write!(out, "{style}{label}{style:#} ({}):", clean(&response.id))?;
    let mut blocks = response.content.iter().map(content_text).peekable();
    match (blocks.peek(), &response.structured_content) {
        (None, Some(structured)) => write!(out, " {structured}")?,
        _ => {
            for (index, block) in blocks.enumerate() {
                let separator = if index == 0 { " " } else { "\n" };
                write!(out, "{separator}{}", clean(&block))?;
            }
        }
    }
    writeln!(out)
}

/// A content block as text: its text, or what it is.
fn content_text(block: &ContentBlock) -> String {
    match block {
        ContentBlock::Text(text) => text.text.clone(),
        ContentBlock::Image(image) => format!("[image {}]", image.mime_type),
        ContentBlock::Audio(audio) => format!("[audio {}]", audio.mime_type),
        ContentBlock::Resource(embedded) => match &embedded.resource {
            ResourceContents::Text { text, .. } => text.clone(),
            ResourceContents::Blob { uri, .. } => format!("[resource {uri}]"),
        },
        ContentBlock::ResourceLink(link) => format!("[link {}]", link.uri),
    }
}

fn write_notification(out: &mut impl Write, note: &NotificationChunk) -> io::Result<()> {
    let (label, style) = if note.is_fatal {
        ("fatal notification:", FATAL)
    } else {
        ("notification:", NOTIFICATION)
    };
    let message = match &note.message {
        Value::String(text) => clean(text),
        other => other.to_string(),
    };
    writeln!(out, "{style}{label}{style:#} {message}")
}

/// Wire text made safe for a terminal: control characters other than line
/// breaks and tabs become U+FFFD, so escape sequences cannot reach it.
fn clean(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() && c != '\n' && c != '\t' {
                char::REPLACEMENT_CHARACTER
            } else {
                c
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use anstream::{AutoStream, ColorChoice};
    use runloop_proto::run_loop::{TextChunk, UsageChunk};
    use serde_json::json;

    use super::*;

    fn text(text: &str) -> AgenticLoopChunk {
        AgenticLoopChunk::AssistantTextContent(TextChunk {
            text: text.into(),
            ..TextChunk::default()
        })
    }

    fn parse(json: &str) -> AgenticLoopChunk {
        serde_json::from_str(json).expect("a sample chunk")
    }

    /// A loop with every kind a person sees, interleaved tool calls, a
    /// sub-agent's thread, an escape sequence from the wire, and a fatal
    /// last word.
    fn sample() -> (Vec<Step>, Outcome) {
        let steps = [
            r#"{"type":"assistant_reasoning","text":"The user wants "}"#,
            r#"{"type":"assistant_reasoning","text":"the file."}"#,
            r#"{"type":"assistant_text_content","text":"Let me "}"#,
            r#"{"type":"assistant_text_content","text":"read it."}"#,
            r#"{"type":"assistant_tool_call","id":"call_1","name":"read_file","arguments":"{\"path\":"}"#,
            r#"{"type":"assistant_tool_call","id":"call_2","name":"list_dir"}"#,
            r#"{"type":"assistant_tool_call","id":"call_1","name":"read_file","arguments":"\"a.rs\"}"}"#,
            r#"{"type":"usage","completion_tokens":10,"prompt_tokens":100,"total_tokens":110}"#,
            r#"{"type":"tool_response","id":"call_1","content":[{"type":"text","text":"fn main() {}"}]}"#,
            r#"{"type":"tool_response","id":"call_2","content":[{"type":"text","text":"denied"}],"isError":true}"#,
            r#"{"type":"assistant_text_content","text":"sub says hi","parent_tool_call_id":"call_1"}"#,
            r#"{"type":"assistant_image_content","data":"aGk=","mimeType":"image/png"}"#,
            r#"{"type":"user","prompt":"and then?"}"#,
            r#"{"type":"notification","is_fatal":false,"message":"retrying"}"#,
            r#"{"type":"assistant_refusal","text":"No."}"#,
            r#"{"type":"assistant_text_content","text":"Done"}"#,
            r#"{"type":"assistant_text_content","text":"\u001b[31m!"}"#,
            r#"{"type":"usage","completion_tokens":5,"prompt_tokens":50,"total_tokens":55}"#,
            r#"{"type":"notification","is_fatal":true,"message":{"code":503}}"#,
        ]
        .map(|json| Step::Chunk(parse(json)));
        (steps.into(), Outcome::Finished { fatal: true })
    }

    fn render(format: Format, color: ColorChoice, steps: Vec<Step>, outcome: &Outcome) -> String {
        let mut render = Render::new(AutoStream::new(Vec::new(), color), format);
        for step in steps {
            render.step(step).expect("a Vec takes every write");
        }
        render
            .outcome(outcome, None)
            .expect("a Vec takes every write");
        String::from_utf8(render.into_inner().into_inner()).expect("UTF-8")
    }

    /// The loop of `steps`, finished, as plain text.
    fn plain_finished(steps: Vec<Step>) -> String {
        let finished = Outcome::Finished { fatal: false };
        render(Format::Pretty, ColorChoice::Never, steps, &finished)
    }

    /// The loop of `steps` ending with `outcome` is each case's text, in
    /// the case's format and colour choice.
    fn renders_as(
        steps: impl Fn() -> Vec<Step>,
        outcome: &Outcome,
        cases: &[(Format, ColorChoice, &str)],
    ) {
        for &(format, color, expected) in cases {
            let shown = render(format, color, steps(), outcome);
            assert_eq!(shown, expected, "{format:?}, {color:?}");
        }
    }

    const PLAIN: &str = "\
reasoning: The user wants the file.
Let me read it.
tool call read_file (call_1): {\"path\":\"a.rs\"}
tool call list_dir (call_2)
tool response (call_1): fn main() {}
tool error (call_2): denied
[call_1] sub says hi
image: image/png, 4 characters of base64
user: and then?
notification: retrying
refusal: No.
Done\u{fffd}[31m!
fatal notification: {\"code\":503}
usage: 165 tokens (150 prompt, 15 completion)
the loop finished, but its last word was a fatal notification
";

    #[test]
    fn plain_text_of_a_sample_loop() {
        let (steps, outcome) = sample();
        assert_eq!(
            render(Format::Pretty, ColorChoice::Never, steps, &outcome),
            PLAIN
        );
    }

    #[test]
    fn terminal_text_of_a_sample_loop() {
        let (steps, outcome) = sample();
        let expected = "\
\x1b[2mreasoning:\x1b[0m \x1b[2mThe user wants \x1b[0m\x1b[2mthe file.\x1b[0m
Let me read it.
\x1b[1mtool call\x1b[0m read_file (call_1): {\"path\":\"a.rs\"}
\x1b[1mtool call\x1b[0m list_dir (call_2)
\x1b[1mtool response\x1b[0m (call_1): fn main() {}
\x1b[1m\x1b[31mtool error\x1b[0m (call_2): denied
\x1b[2m[call_1]\x1b[0m sub says hi
\x1b[1mimage:\x1b[0m image/png, 4 characters of base64
\x1b[1muser:\x1b[0m and then?
\x1b[1m\x1b[33mnotification:\x1b[0m retrying
\x1b[33mrefusal:\x1b[0m \x1b[33mNo.\x1b[0m
Done\u{fffd}[31m!
\x1b[1m\x1b[31mfatal notification:\x1b[0m {\"code\":503}
\x1b[2musage: 165 tokens (150 prompt, 15 completion)\x1b[0m
\x1b[1m\x1b[31mthe loop finished, but its last word was a fatal notification\x1b[0m
";
        let shown = render(Format::Pretty, ColorChoice::Always, steps, &outcome);
        assert_eq!(shown, expected);
        // The wire's escape byte never reaches the terminal.
        assert_eq!(
            shown.matches('\x1b').count(),
            expected.matches("\x1b[").count()
        );
    }

    #[test]
    fn json_lines_of_a_sample_loop() {
        let (steps, outcome) = sample();
        let shown = render(Format::Json, ColorChoice::Never, steps, &outcome);
        let lines: Vec<&str> = shown.lines().collect();
        assert_eq!(lines.len(), 20);
        assert_eq!(
            lines[0],
            r#"{"chunk":{"type":"assistant_reasoning","text":"The user wants "}}"#
        );
        assert_eq!(
            lines[6],
            r#"{"chunk":{"type":"assistant_tool_call","id":"call_1","name":"read_file","arguments":"\"a.rs\"}"}}"#
        );
        assert_eq!(
            lines[16],
            r#"{"chunk":{"type":"assistant_text_content","text":"\u001b[31m!"}}"#
        );
        assert_eq!(lines[19], r#"{"outcome":"finished","fatal":true}"#);
        let (steps, _) = sample();
        for (line, step) in lines.iter().zip(steps) {
            let Step::Chunk(chunk) = step else {
                panic!("the sample is chunks")
            };
            let value: Value = serde_json::from_str(line).expect("each line is JSON");
            assert_eq!(
                serde_json::from_value::<AgenticLoopChunk>(value["chunk"].clone())
                    .expect("a chunk"),
                chunk
            );
        }
    }

    #[test]
    fn text_is_the_assistants_text_alone() {
        let (steps, outcome) = sample();
        assert_eq!(
            render(Format::Text, ColorChoice::Always, steps, &outcome),
            "Let me read it.\nDone\u{fffd}[31m!\n\
             \x1b[1m\x1b[31mthe loop finished, but its last word was a fatal notification\x1b[0m\n"
        );
    }

    #[test]
    fn a_transcript_is_the_loop_coalesced_then_its_ending() {
        let (steps, outcome) = sample();
        let shown = render(Format::Transcript, ColorChoice::Never, steps, &outcome);
        let (document, ending) = shown.split_once('\n').expect("two lines");
        assert_eq!(
            ending,
            "the loop finished, but its last word was a fatal notification\n"
        );
        let document: Value = serde_json::from_str(document).expect("one JSON object");
        assert_eq!(document["outcome"], "finished");
        assert_eq!(document["fatal"], true);
        assert!(document.get("error").is_none());
        let chunks = document["transcript"].as_array().expect("the chunks");
        // 19 chunks coalesce to 15 (protocol §11): the two reasoning
        // fragments join, so do "Let me " and "read it.", "Done" and "!",
        // and call_1's two pieces.
        assert_eq!(chunks.len(), 15, "{document}");
        assert_eq!(chunks[0]["text"], "The user wants the file.");
        assert_eq!(chunks[2]["arguments"], "{\"path\":\"a.rs\"}");

        let down = ErrorValue::new(json!({"kind": "agent", "error": "down"}));
        let shown = render(
            Format::Transcript,
            ColorChoice::Never,
            vec![Step::Chunk(text("Hel")), Step::Error(down.clone())],
            &Outcome::Unfinished(down),
        );
        let document: Value =
            serde_json::from_str(shown.lines().next().expect("a line")).expect("JSON");
        assert_eq!(
            document,
            json!({
                "transcript": [{"type": "assistant_text_content", "text": "Hel"}],
                "error": {"kind": "agent", "error": "down"},
                "outcome": "unfinished",
            })
        );
    }

    #[test]
    fn quiet_says_nothing_unless_the_loop_did_not_finish() {
        let (steps, outcome) = sample();
        assert_eq!(
            render(Format::Quiet, ColorChoice::Never, steps, &outcome),
            "the loop finished, but its last word was a fatal notification\n"
        );
        let steps = vec![Step::Chunk(text("ok"))];
        let finished = Outcome::Finished { fatal: false };
        assert_eq!(
            render(Format::Quiet, ColorChoice::Never, steps, &finished),
            ""
        );
    }

    #[test]
    fn the_notes_go_to_their_own_stream() {
        let mut render = Render::new(Vec::new(), Format::Pretty);
        render.chunk(text("Hel")).expect("written");
        render
            .chunk(AgenticLoopChunk::Usage(UsageChunk::default()))
            .expect("written");
        let mut notes = Vec::new();
        render
            .outcome(&Outcome::NotServed, Some(&mut notes))
            .expect("written");
        assert_eq!(String::from_utf8_lossy(&render.into_inner()), "Hel\n");
        assert_eq!(
            anstream::adapter::strip_bytes(&notes).into_vec(),
            b"usage: 0 tokens (0 prompt, 0 completion)\nthe proxy did not serve the loop\n"
        );
    }

    #[test]
    fn an_unfinished_loop_in_every_format() {
        let down = ErrorValue::new(json!({"kind": "agent", "error": "down"}));
        let steps = || vec![Step::Chunk(text("Hel")), Step::Error(down.clone())];
        let outcome = Outcome::Unfinished(down.clone());
        renders_as(
            steps,
            &outcome,
            &[
                (
                    Format::Pretty,
                    ColorChoice::Never,
                    "Hel\nthe loop ended without finishing (partial result): {\"kind\":\"agent\",\"error\":\"down\"}\n",
                ),
                (
                    Format::Pretty,
                    ColorChoice::Always,
                    "Hel\n\x1b[1m\x1b[31mthe loop ended without finishing (partial result): {\"kind\":\"agent\",\"error\":\"down\"}\x1b[0m\n",
                ),
                (
                    Format::Json,
                    ColorChoice::Never,
                    "{\"chunk\":{\"type\":\"assistant_text_content\",\"text\":\"Hel\"}}\n\
                     {\"error\":{\"kind\":\"agent\",\"error\":\"down\"}}\n\
                     {\"outcome\":\"unfinished\"}\n",
                ),
            ],
        );
    }

    #[test]
    fn a_finished_loop_ends_in_green_and_a_broken_one_says_why() {
        let steps = || vec![Step::Chunk(text("ok"))];
        renders_as(
            steps,
            &Outcome::Finished { fatal: false },
            &[(
                Format::Pretty,
                ColorChoice::Always,
                "ok\n\x1b[1m\x1b[32mthe loop finished\x1b[0m\n",
            )],
        );
        let broken = Outcome::Broken(runloop_proto::run_loop::Broken::ConnectionEnded);
        renders_as(
            steps,
            &broken,
            &[
                (
                    Format::Pretty,
                    ColorChoice::Never,
                    "ok\nbroken: the connection ended before the channel's finish\n",
                ),
                (
                    Format::Json,
                    ColorChoice::Never,
                    "{\"chunk\":{\"type\":\"assistant_text_content\",\"text\":\"ok\"}}\n\
                     {\"outcome\":\"broken\",\"reason\":\"the connection ended before the channel's finish\"}\n",
                ),
            ],
        );
    }

    #[test]
    fn a_call_that_grows_after_it_was_shown_is_shown_again_whole() {
        let steps = vec![
            Step::Chunk(parse(
                r#"{"type":"assistant_tool_call","id":"c","name":"f","arguments":"{"}"#,
            )),
            Step::Chunk(text("meanwhile")),
            Step::Chunk(parse(
                r#"{"type":"assistant_tool_call","id":"c","name":"f","arguments":"}"}"#,
            )),
            Step::Chunk(AgenticLoopChunk::Usage(UsageChunk::default())),
        ];
        assert_eq!(
            plain_finished(steps),
            "tool call f (c): {\nmeanwhile\ntool call f (c): {}\nusage: 0 tokens (0 prompt, 0 completion)\nthe loop finished\n"
        );
    }

    #[test]
    fn text_blocks_continue_across_line_breaks_and_restart_after_other_output() {
        let steps = vec![
            Step::Chunk(text("one\n")),
            Step::Chunk(text("two")),
            Step::Chunk(parse(
                r#"{"type":"notification","is_fatal":false,"message":null}"#,
            )),
            Step::Chunk(text("three")),
        ];
        assert_eq!(
            plain_finished(steps),
            "one\ntwo\nnotification: null\nthree\nthe loop finished\n"
        );
    }
}
