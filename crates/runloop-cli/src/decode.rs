//! `runloop decode`: a capture read back frame by frame, as JSON lines, or
//! rendered as `runloop run` showed it.
//!
//! The capture is read line by line and each message goes through the
//! [`Observer`], which applies the receiver's rules and the caller's
//! [`Reader`]; this module prints what they say, a line for each of the
//! connection's other frames (the authorization, without its credential;
//! each `agents::run` and its id or refusal; stops; the run's end), and
//! keeps the endings for the exit code. Lines are printed as they are read,
//! so a capture that is still being written can be piped in.
//!
//! A file that is not a capture at all (a log, a README, the JSON of an
//! earlier decode) is refused once, with the first line's fault, rather
//! than reported line by line: malformed lines are held until a line reads
//! as a capture line, and if none of the first [`HELD`] lines does — or
//! none at all — the input is refused and exits `2`. Blank lines and
//! comments are neither.
//!
//! `--scope` and `--channel` keep the lines of one run or one loop (and the
//! malformed ones, which belong to no channel); the exit code then comes
//! from the loops they keep. `--render` prints the loops as `run` renders
//! them for a person, the ending lines included; malformed lines go to
//! stderr, as notes.
//!
//! The exit code is the channel's ending when there is one run-loop channel;
//! with several, `0` when all finished, else the code of the first, in the
//! order they were opened, that did not. A capture without any run-loop
//! channel exits `3` (no loop ran), with a note on stderr: nothing finished,
//! so `0` would be a lie, and nothing broke either. Malformed lines are
//! reported in the output but do not change the exit code, which is about
//! the loops.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Write};
use std::path::PathBuf;
use std::time::Duration;

use anstream::ColorChoice;
use anstream::adapter::strip_bytes;
use runloop_proto::capture::{self, LineError, Payload};
use runloop_proto::observer::{ChannelId, Event, Observer};
use runloop_proto::run_loop::{Outcome, Reader, Step};

use crate::exit::{Exit, Failure};
use crate::frames::{Frame, describe};
use crate::json::{self, At};
use crate::render::{Format, Render};

/// Arguments of `runloop decode`.
#[derive(Debug, clap::Args)]
#[command(after_long_help = FORMAT_HELP)]
pub struct Args {
    /// The capture to read; standard input when absent or `-`.
    pub file: Option<PathBuf>,
    /// Read one run-loop channel's response payloads instead of a capture:
    /// each line is one payload in hex, or the word `finish`.
    #[arg(long, conflicts_with_all = ["scope", "channel"])]
    pub payloads: bool,
    /// Show the loops as `runloop run` renders them for a person, instead of
    /// JSON lines.
    #[arg(long)]
    pub render: bool,
    /// Only the lines of this scope (a run).
    #[arg(long, value_name = "N")]
    pub scope: Option<u32>,
    /// Only the lines of channels with this number (with --scope, of that
    /// scope's channel).
    #[arg(long, value_name = "N")]
    pub channel: Option<u32>,
}

const FORMAT_HELP: &str = "\
Capture format: one WebSocket binary message per line, '>' (client to server)
or '<' (server to client), a space, then the message in hex (whitespace inside
the hex allowed, either case), optionally preceded by the time it was recorded,
'+SECONDS ' from the capture's start. Blank lines and lines starting with '#'
are ignored. With --payloads, each line is one channel response payload in hex
(tag byte first) or the word 'finish'.

Output: one JSON object per line: {\"scope\",\"channel\",\"chunk\"},
{\"scope\",\"channel\",\"error\"}, {\"scope\",\"channel\",\"outcome\"[,\"reason\"][,\"fatal\"]};
for the other frames {\"authorization\"}, {\"scope\",\"run\"}, {\"scope\",\"id\"},
{\"scope\",\"refused\"}, {\"scope\",\"channel\",\"run_loop\"}, {\"scope\",\"channel\",\"stop\"},
{\"scope\",\"finish\"}; each with \"time\" first when the capture has it; and
{\"line\",\"malformed\"} for a line or frame that cannot be used. With --payloads,
the loop's lines without scope and channel.

Exit code: the ending of the run-loop channel; with several, 0 if all
finished, else the code of the first (in order of opening) that did not; 3 if
the capture holds no run-loop channel; 2 if the input is not a capture (no
line of it reads as one).";

/// How many malformed lines are held, at most, waiting for a first line
/// that reads: past that, the input is not a capture.
pub const HELD: usize = 64;

impl Args {
    /// Reads the input and prints what it carried to `out`.
    pub fn execute(&self, out: &mut impl Write) -> Result<Exit, Failure> {
        let input = Input::open(self.file.as_ref())?;
        let mut view = if self.render {
            View::Render {
                renders: HashMap::new(),
                last: None,
                // As `run` decides for its stdout: a terminal, NO_COLOR and
                // CLICOLOR_FORCE.
                styled: anstream::AutoStream::choice(&io::stdout()) != ColorChoice::Never,
            }
        } else {
            View::Json
        };
        if self.payloads {
            payloads(input, out, &mut view)
        } else {
            let filter = Filter {
                scope: self.scope,
                channel: self.channel,
            };
            capture(input, out, &mut view, filter)
        }
    }
}

/// The input, read one line at a time, numbered from 1.
struct Input {
    name: String,
    reader: Box<dyn BufRead>,
    line: Vec<u8>,
    number: u64,
    /// Malformed lines held until one reads; `None` once one has.
    held: Option<Vec<(u64, LineError)>>,
}

impl Input {
    fn open(file: Option<&PathBuf>) -> Result<Input, Failure> {
        let (name, reader): (String, Box<dyn BufRead>) = match file {
            Some(path) if path.as_os_str() != "-" => {
                let name = path.display().to_string();
                let file = File::open(path).map_err(|source| Failure::Input {
                    name: name.clone(),
                    source,
                })?;
                (name, Box::new(BufReader::new(file)))
            }
            _ => ("standard input".to_owned(), Box::new(io::stdin().lock())),
        };
        Ok(Input {
            name,
            reader,
            line: Vec::new(),
            number: 0,
            held: Some(Vec::new()),
        })
    }

    /// The next line and its number, or `None` at the end.
    fn next(&mut self) -> Result<Option<(u64, &[u8])>, Failure> {
        self.line.clear();
        match self.reader.read_until(b'\n', &mut self.line) {
            Ok(0) => Ok(None),
            Ok(_) => {
                self.number += 1;
                Ok(Some((self.number, &self.line)))
            }
            Err(source) => Err(Failure::Input {
                name: self.name.clone(),
                source,
            }),
        }
    }

    /// A line that does not read: held while no line has read yet (the
    /// input is refused when too many are), else printed at once.
    fn malformed(
        &mut self,
        out: &mut impl Write,
        view: &View,
        number: u64,
        error: LineError,
    ) -> Result<(), Failure> {
        match &mut self.held {
            Some(held) => {
                held.push((number, error));
                if held.len() >= HELD {
                    return Err(self.not_a_capture());
                }
                Ok(())
            }
            None => Ok(view.malformed(out, number, &error)?),
        }
    }

    /// A line read: the lines held before it are printed.
    fn read(&mut self, out: &mut impl Write, view: &View) -> Result<(), Failure> {
        for (number, error) in self.held.take().unwrap_or_default() {
            view.malformed(out, number, &error)?;
        }
        Ok(())
    }

    /// The end of the input: refused if lines were held and none read.
    fn end(&mut self) -> Result<(), Failure> {
        match &self.held {
            Some(held) if !held.is_empty() => Err(self.not_a_capture()),
            _ => Ok(()),
        }
    }

    /// The refusal of an input none of whose lines so far reads, with the
    /// first line's fault.
    fn not_a_capture(&self) -> Failure {
        let fault = match self.held.as_ref().and_then(|held| held.first()) {
            Some((number, error)) => format!(" (line {number}: {error})"),
            None => String::new(),
        };
        let lines = match self.number {
            1 => "its one line is not a capture line".to_owned(),
            n => format!("none of its first {n} lines is a capture line"),
        };
        Failure::NotCapture(format!("{} is not a capture: {lines}{fault}", self.name))
    }
}

/// What `--scope` and `--channel` keep.
#[derive(Debug, Clone, Copy, Default)]
struct Filter {
    scope: Option<u32>,
    channel: Option<u32>,
}

impl Filter {
    fn keeps(&self, scope: Option<u32>, channel: Option<u32>) -> bool {
        let matches = |wanted: Option<u32>, got: Option<u32>| wanted.is_none_or(|w| got == Some(w));
        matches(self.scope, scope) && matches(self.channel, channel)
    }

    fn keeps_channel(&self, at: ChannelId) -> bool {
        self.keeps(Some(at.scope), Some(at.channel))
    }
}

/// How the loops are shown: JSON lines, or each loop rendered.
enum View {
    Json,
    Render {
        /// Each loop's rendering so far (`None`: the one of `--payloads`).
        renders: HashMap<Option<ChannelId>, Render<Vec<u8>>>,
        /// The loop whose lines came last, to head a change of loop.
        last: Option<Option<ChannelId>>,
        /// Whether styles reach the output.
        styled: bool,
    },
}

impl View {
    fn malformed(
        &self,
        out: &mut impl Write,
        number: u64,
        what: &dyn std::fmt::Display,
    ) -> io::Result<()> {
        match self {
            View::Json => json::malformed(out, number, what),
            // A note for the person: the data is the loops.
            View::Render { .. } => {
                let _ = writeln!(io::stderr().lock(), "runloop: line {number}: {what}");
                Ok(())
            }
        }
    }

    /// One of a loop's chunk, error or outcome, at `at` (`None`: the one
    /// channel of `--payloads`).
    fn step(
        &mut self,
        out: &mut impl Write,
        at: Option<ChannelId>,
        time: Option<Duration>,
        step: Step,
        json: &[u8],
    ) -> io::Result<()> {
        let place = at.map_or(At::default(), |id| At::channel(id, time));
        let (renders, last, styled) = match self {
            View::Json => {
                return match &step {
                    Step::Chunk(_) => json::chunk(out, place, json),
                    Step::Error(_) => json::error(out, place, json),
                    Step::End(outcome) => json::outcome(out, place, outcome),
                };
            }
            View::Render {
                renders,
                last,
                styled,
            } => (renders, last, *styled),
        };
        // A heading when the lines turn to another loop than the last.
        if let (Some(previous), Some(id)) = (*last, at)
            && previous != at
        {
            if let Some(render) = renders.get_mut(&previous) {
                render.break_line()?;
                write_rendered(out, render, styled)?;
            }
            writeln!(out, "─── {id} ───")?;
        }
        *last = Some(at);
        let render = renders
            .entry(at)
            .or_insert_with(|| Render::new(Vec::new(), Format::Pretty));
        match step {
            Step::Chunk(chunk) => render.chunk(chunk)?,
            Step::Error(error) => render.error(&error)?,
            Step::End(ref outcome) => {
                render.outcome(outcome, None)?;
            }
        }
        write_rendered(out, render, styled)
    }
}

/// What a loop's rendering has made since the last call goes out, with its
/// styles or without.
fn write_rendered(
    out: &mut impl Write,
    render: &mut Render<Vec<u8>>,
    styled: bool,
) -> io::Result<()> {
    let rendered = std::mem::take(render.out_mut());
    if styled {
        out.write_all(&rendered)?;
    } else {
        out.write_all(&strip_bytes(&rendered).into_vec())?;
    }
    out.flush()
}

/// Each run-loop channel's ending, in the order the channels were opened.
#[derive(Default)]
struct Endings {
    endings: Vec<Option<Exit>>,
    /// Where each open channel's ending goes; a number may be reused once
    /// its channel has ended.
    open: HashMap<ChannelId, usize>,
}

impl Endings {
    fn opened(&mut self, at: ChannelId) {
        self.open.insert(at, self.endings.len());
        self.endings.push(None);
    }

    fn ended(&mut self, at: ChannelId, outcome: &Outcome) {
        if let Some(index) = self.open.remove(&at)
            && let Some(slot) = self.endings.get_mut(index)
        {
            *slot = Some(Exit::of(outcome));
        }
    }

    /// The exit code; the observer ends every channel, so each has an ending.
    fn exit(self) -> Option<Exit> {
        Exit::of_all(
            self.endings
                .into_iter()
                .map(|ending| ending.unwrap_or(Exit::Broken)),
        )
    }
}

/// Prints one event of the observer and notes the channel endings.
fn print(
    out: &mut impl Write,
    view: &mut View,
    filter: Filter,
    (line, time): (Option<u64>, Option<Duration>),
    event: Event<'_>,
    endings: &mut Endings,
) -> io::Result<()> {
    match event {
        Event::Request(at) if filter.keeps_channel(at) => {
            endings.opened(at);
            Ok(())
        }
        Event::Chunk { at, chunk, json } if filter.keeps_channel(at) => {
            view.step(out, Some(at), time, Step::Chunk(chunk), json)
        }
        Event::Error { at, error, json } if filter.keeps_channel(at) => {
            view.step(out, Some(at), time, Step::Error(error), json)
        }
        Event::Outcome { at, outcome } if filter.keeps_channel(at) => {
            endings.ended(at, &outcome);
            view.step(out, Some(at), time, Step::End(outcome), b"")
        }
        Event::Malformed(ref what) => view.malformed(out, line.unwrap_or(0), what),
        Event::Request(_) | Event::Chunk { .. } | Event::Error { .. } | Event::Outcome { .. } => {
            Ok(())
        }
    }
}

fn capture(
    mut input: Input,
    out: &mut impl Write,
    view: &mut View,
    filter: Filter,
) -> Result<Exit, Failure> {
    let mut observer = Observer::new();
    let mut endings = Endings::default();
    while let Some((number, line)) = input.next()? {
        let message = match capture::parse_message(line) {
            Ok(None) => continue,
            Ok(Some(message)) => message,
            Err(error) => {
                input.malformed(out, view, number, error)?;
                continue;
            }
        };
        input.read(out, view)?;
        let mut events = Vec::new();
        observer.message(message.direction, &message.bytes, |event| {
            events.push(event)
        });
        let frame = describe(message.direction, &message.bytes);
        let malformed = events
            .iter()
            .any(|event| matches!(event, Event::Malformed(_)));
        if matches!(view, View::Json) && !malformed && frame_kept(&frame, filter) {
            json::frame(out, message.time, &frame)?;
        }
        for event in events {
            print(
                out,
                view,
                filter,
                (Some(number), message.time),
                event,
                &mut endings,
            )?;
        }
    }
    input.end()?;
    let mut result = Ok(());
    observer.end(|event| {
        if result.is_ok() {
            result = print(out, view, filter, (None, None), event, &mut endings);
        }
    });
    result?;
    out.flush()?;
    Ok(endings.exit().unwrap_or_else(|| {
        // A note for the person, not data: stdout stays JSON lines.
        let mut stderr = io::stderr().lock();
        let filtered = if filter.scope.is_some() || filter.channel.is_some() {
            " that --scope and --channel keep"
        } else {
            ""
        };
        // Nothing else can be done if stderr is gone too.
        let _ = writeln!(
            stderr,
            "runloop: the capture holds no run-loop channel{filtered}"
        );
        Exit::NoLoop
    }))
}

/// Whether the filter keeps a frame's line: one with no scope (the
/// authorization) only when nothing is filtered.
fn frame_kept(frame: &Frame<'_>, filter: Filter) -> bool {
    let (scope, channel) = frame.at();
    filter.keeps(scope, channel)
}

fn payloads(mut input: Input, out: &mut impl Write, view: &mut View) -> Result<Exit, Failure> {
    let mut reader = Reader::new();
    let mut outcome = None;
    let mut finished = false;
    while let Some((number, line)) = input.next()? {
        let payload = match capture::parse_payload(line) {
            Ok(None) => continue,
            Ok(Some(_)) if finished => {
                view.malformed(out, number, &"a line after the channel response finish")?;
                continue;
            }
            Ok(Some(payload)) => payload,
            Err(error) => {
                input.malformed(out, view, number, error)?;
                continue;
            }
        };
        input.read(out, view)?;
        match payload {
            Payload::Finish => {
                finished = true;
                if let Some(ending) = reader.finish() {
                    view.step(out, None, None, Step::End(ending.clone()), b"")?;
                    outcome = Some(ending);
                }
            }
            Payload::Response(bytes) => {
                let json = bytes.get(1..).unwrap_or_default();
                if let Some(step) = reader.response(&bytes) {
                    if let Step::End(ending) = &step {
                        outcome = Some(ending.clone());
                    }
                    view.step(out, None, None, step, json)?;
                }
            }
        }
    }
    input.end()?;
    if let Some(ending) = reader.cut(runloop_proto::run_loop::Broken::InputEnded) {
        view.step(out, None, None, Step::End(ending.clone()), b"")?;
        outcome = Some(ending);
    }
    out.flush()?;
    Ok(outcome.as_ref().map_or(Exit::Broken, Exit::of))
}
