//! `runloop decode`: a capture read back as what each run-loop channel
//! carried, one JSON line at a time.
//!
//! The capture is read line by line and each message goes through the
//! [`Observer`], which applies the receiver's rules and the caller's
//! [`Reader`]; this module only prints what they say and keeps the endings
//! for the exit code. Lines are printed as they are read, so a capture that
//! is still being written can be piped in.
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

use runloop_proto::capture::{self, Payload};
use runloop_proto::observer::{ChannelId, Event, Observer};
use runloop_proto::run_loop::{Outcome, Reader, Step};

use crate::exit::{Exit, Failure};
use crate::json;

/// Arguments of `runloop decode`.
#[derive(Debug, clap::Args)]
#[command(after_long_help = FORMAT_HELP)]
pub struct Args {
    /// The capture to read; standard input when absent or `-`.
    pub file: Option<PathBuf>,
    /// Read one run-loop channel's response payloads instead of a capture:
    /// each line is one payload in hex, or the word `finish`.
    #[arg(long)]
    pub payloads: bool,
}

const FORMAT_HELP: &str = "\
Capture format: one WebSocket binary message per line, '>' (client to server)
or '<' (server to client), a space, then the message in hex (whitespace inside
the hex allowed, either case). Blank lines and lines starting with '#' are
ignored. With --payloads, each line is one channel response payload in hex
(tag byte first) or the word 'finish'.

Output: one JSON object per line: {\"scope\",\"channel\",\"chunk\"},
{\"scope\",\"channel\",\"error\"}, {\"scope\",\"channel\",\"outcome\"[,\"reason\"][,\"fatal\"]},
and {\"line\",\"malformed\"} for a line or frame that cannot be used. With
--payloads, the same without scope and channel.

Exit code: the ending of the run-loop channel; with several, 0 if all
finished, else the code of the first (in order of opening) that did not; 3 if
the capture holds no run-loop channel.";

impl Args {
    /// Reads the input and prints what it carried to `out`.
    pub fn execute(&self, out: &mut impl Write) -> Result<Exit, Failure> {
        let input = Input::open(self.file.as_ref())?;
        if self.payloads {
            payloads(input, out)
        } else {
            capture(input, out)
        }
    }
}

/// The input, read one line at a time, numbered from 1.
struct Input {
    name: String,
    reader: Box<dyn BufRead>,
    line: Vec<u8>,
    number: u64,
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

/// Prints one event and notes the channel endings.
fn print(
    out: &mut impl Write,
    line: Option<u64>,
    event: &Event<'_>,
    endings: &mut Endings,
) -> io::Result<()> {
    match *event {
        Event::Request(at) => {
            endings.opened(at);
            Ok(())
        }
        Event::Chunk { at, json, .. } => json::chunk(out, Some(at), json),
        Event::Error { at, json, .. } => json::error(out, Some(at), json),
        Event::Outcome { at, ref outcome } => {
            endings.ended(at, outcome);
            json::outcome(out, Some(at), outcome)
        }
        Event::Malformed(ref what) => json::malformed(out, line.unwrap_or(0), what),
    }
}

fn capture(mut input: Input, out: &mut impl Write) -> Result<Exit, Failure> {
    let mut observer = Observer::new();
    let mut endings = Endings::default();
    while let Some((number, line)) = input.next()? {
        match capture::parse_message(line) {
            Ok(None) => {}
            Ok(Some((direction, message))) => {
                let mut result = Ok(());
                observer.message(direction, &message, |event| {
                    if result.is_ok() {
                        result = print(out, Some(number), &event, &mut endings);
                    }
                });
                result?;
            }
            Err(what) => json::malformed(out, number, &what)?,
        }
    }
    let mut result = Ok(());
    observer.end(|event| {
        if result.is_ok() {
            result = print(out, None, &event, &mut endings);
        }
    });
    result?;
    out.flush()?;
    Ok(endings.exit().unwrap_or_else(|| {
        // A note for the person, not data: stdout stays JSON lines.
        let mut stderr = io::stderr().lock();
        // Nothing else can be done if stderr is gone too.
        let _ = writeln!(stderr, "runloop: the capture holds no run-loop channel");
        Exit::NoLoop
    }))
}

fn payloads(mut input: Input, out: &mut impl Write) -> Result<Exit, Failure> {
    let mut reader = Reader::new();
    let mut outcome = None;
    let mut finished = false;
    while let Some((number, line)) = input.next()? {
        let payload = match capture::parse_payload(line) {
            Ok(None) => continue,
            Ok(Some(_)) if finished => {
                json::malformed(out, number, &"a line after the channel response finish")?;
                continue;
            }
            Ok(Some(payload)) => payload,
            Err(what) => {
                json::malformed(out, number, &what)?;
                continue;
            }
        };
        match payload {
            Payload::Finish => {
                finished = true;
                if let Some(ending) = reader.finish() {
                    json::outcome(out, None, &ending)?;
                    outcome = Some(ending);
                }
            }
            Payload::Response(bytes) => {
                let json = bytes.get(1..).unwrap_or_default();
                match reader.response(&bytes) {
                    Some(Step::Chunk(_)) => json::chunk(out, None, json)?,
                    Some(Step::Error(_)) => json::error(out, None, json)?,
                    Some(Step::End(ending)) => {
                        json::outcome(out, None, &ending)?;
                        outcome = Some(ending);
                    }
                    None => {}
                }
            }
        }
    }
    if let Some(ending) = reader.cut(runloop_proto::run_loop::Broken::InputEnded) {
        json::outcome(out, None, &ending)?;
        outcome = Some(ending);
    }
    out.flush()?;
    Ok(outcome.as_ref().map_or(Exit::Broken, Exit::of))
}
