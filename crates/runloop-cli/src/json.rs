//! JSON lines: the machine-readable form of a loop, one object per line.
//!
//! `decode` and `run --json` print the same objects, so one reader handles
//! both; `decode` adds where each line came from (its scope and channel, and
//! the time the capture recorded), and a line for every other frame of the
//! connection.
//!
//! ```text
//! {"time":T,"scope":S,"channel":C,"chunk":<chunk JSON>}   time: decode, when the capture has it
//! {"scope":S,"channel":C,"error":<error JSON>}            scope/channel: decode only
//! {"scope":S,"channel":C,"outcome":"finished"|"unfinished"|"no_loop"|"not_served"|"broken",
//!  "reason":"<why it broke>" (broken only), "fatal":true (finished with a fatal last chunk only)}
//! {"line":N,"malformed":"<what>"}                         decode only
//!
//! decode only, the other frames:
//! {"authorization":"unbrokered"}                           the credential is never shown
//! {"scope":S,"run":<agents::run request JSON>}             {"scope":S,"request":"<what>"} for another
//! {"scope":S,"id":"<the run's id>"}                        {"scope":S,"refused":<error JSON>}
//! {"scope":S,"channel":C,"run_loop":<request JSON>}        {"scope":S,"channel":C,"stop":true}
//! {"scope":S,"channel":C,"channel_request":"<what>"}      a channel runloop does not serve
//! {"scope":S,"finish":true}                                the scope's finish: the run ended
//! ```
//!
//! Chunk and error JSON is written as it came on the wire whenever the
//! caller has those bytes: an inspector must show what was sent, not what a
//! re-encoding makes of it (member order, number spelling, unknown
//! members). The one change is that line breaks, which valid JSON can only
//! hold as whitespace between tokens, become spaces, so that each object
//! stays on its line. The error that goes with an `unfinished` or `no_loop`
//! outcome is the `error` line before it, not repeated in the outcome.

use std::fmt;
use std::io::{self, Write};
use std::time::Duration;

use runloop_proto::error_chain::Chain;
use runloop_proto::observer::ChannelId;
use runloop_proto::run_loop::Outcome;
use serde_json::{Map, Value};

use crate::frames::Frame;

/// Where a line's object comes from: when, and which scope and channel.
/// Each member is left out of the object when it is `None`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct At {
    /// When the capture recorded the message, from its start.
    pub time: Option<Duration>,
    /// The scope.
    pub scope: Option<u32>,
    /// The channel.
    pub channel: Option<u32>,
}

impl At {
    /// A run-loop channel's place, at `time`.
    pub fn channel(id: ChannelId, time: Option<Duration>) -> At {
        At {
            time,
            scope: Some(id.scope),
            channel: Some(id.channel),
        }
    }
}

/// Opens an object with the members of `at`.
fn open(out: &mut impl Write, at: At) -> io::Result<()> {
    out.write_all(b"{")?;
    if let Some(time) = at.time {
        write!(
            out,
            "\"time\":{}.{:06},",
            time.as_secs(),
            time.subsec_micros()
        )?;
    }
    if let Some(scope) = at.scope {
        write!(out, "\"scope\":{scope},")?;
    }
    if let Some(channel) = at.channel {
        write!(out, "\"channel\":{channel},")?;
    }
    Ok(())
}

/// Writes JSON text on one line: its line breaks (whitespace between tokens
/// in valid JSON) become spaces.
fn write_one_line(out: &mut impl Write, json: &[u8]) -> io::Result<()> {
    for piece in json.split_inclusive(|&b| b == b'\n' || b == b'\r') {
        match piece.split_last() {
            Some((b'\n' | b'\r', rest)) => {
                out.write_all(rest)?;
                out.write_all(b" ")?;
            }
            _ => out.write_all(piece)?,
        }
    }
    Ok(())
}

/// `{"chunk":…}` around chunk JSON as it came.
pub fn chunk(out: &mut impl Write, at: At, json: &[u8]) -> io::Result<()> {
    member(out, at, "chunk", json)
}

/// `{"error":…}` around error JSON as it came.
pub fn error(out: &mut impl Write, at: At, json: &[u8]) -> io::Result<()> {
    member(out, at, "error", json)
}

fn member(out: &mut impl Write, at: At, name: &str, json: &[u8]) -> io::Result<()> {
    open(out, at)?;
    write!(out, "\"{name}\":")?;
    write_one_line(out, json)?;
    out.write_all(b"}\n")
}

/// The members that say how a channel ended: `outcome`, with the reason it
/// broke or whether a finished loop's last chunk was fatal.
pub fn ending(outcome: &Outcome) -> Map<String, Value> {
    let mut members = Map::new();
    members.insert("outcome".into(), outcome.name().into());
    match outcome {
        Outcome::Broken(why) => {
            members.insert("reason".into(), Chain(why).to_string().into());
        }
        Outcome::Finished { fatal: true } => {
            members.insert("fatal".into(), true.into());
        }
        _ => {}
    }
    members
}

/// `{"outcome":…}`, with the members of [`ending`].
pub fn outcome(out: &mut impl Write, at: At, outcome: &Outcome) -> io::Result<()> {
    open(out, at)?;
    let members = serde_json::to_string(&ending(outcome)).map_err(io::Error::other)?;
    // The object's members without its braces, after those of `at`.
    out.write_all(&members.as_bytes()[1..])?;
    out.write_all(b"\n")
}

/// `{"line":N,"malformed":"…"}`.
pub fn malformed(out: &mut impl Write, line: u64, what: &dyn fmt::Display) -> io::Result<()> {
    write!(out, "{{\"line\":{line},\"malformed\":")?;
    string(out, what)?;
    out.write_all(b"}\n")
}

/// A JSON string of `text`, escaped by serde_json.
fn string(out: &mut impl Write, text: &dyn fmt::Display) -> io::Result<()> {
    serde_json::to_writer(&mut *out, &text.to_string()).map_err(io::Error::other)
}

/// The line of a frame that is not a run-loop channel's response or
/// finish (those are the observer's chunk, error and outcome lines), if it
/// has one: whether one was written.
pub fn frame(out: &mut impl Write, time: Option<Duration>, frame: &Frame<'_>) -> io::Result<bool> {
    let at = |scope, channel| At {
        time,
        scope: Some(scope),
        channel,
    };
    match *frame {
        Frame::Authorization { mode } => {
            open(
                out,
                At {
                    time,
                    ..At::default()
                },
            )?;
            match mode {
                Some(0) => out.write_all(b"\"authorization\":\"unbrokered\"}\n")?,
                Some(mode) => writeln!(out, "\"authorization\":\"mode {mode}\"}}")?,
                None => out.write_all(b"\"authorization\":\"empty\"}\n")?,
            }
        }
        Frame::Run { scope, json } => member(out, at(scope, None), "run", json)?,
        Frame::Id { scope, ref id } => {
            open(out, at(scope, None))?;
            out.write_all(b"\"id\":")?;
            string(out, id)?;
            out.write_all(b"}\n")?;
        }
        Frame::Refused { scope, json } => member(out, at(scope, None), "refused", json)?,
        Frame::Finish { scope } => {
            open(out, at(scope, None))?;
            out.write_all(b"\"finish\":true}\n")?;
        }
        Frame::RunLoop {
            scope,
            channel,
            json,
        } => member(out, at(scope, Some(channel)), "run_loop", json)?,
        Frame::Stop { scope, channel } => {
            open(out, at(scope, Some(channel)))?;
            out.write_all(b"\"stop\":true}\n")?;
        }
        Frame::Request { scope, .. } | Frame::Response { scope, .. } => {
            open(out, at(scope, None))?;
            let name = if matches!(frame, Frame::Request { .. }) {
                "request"
            } else {
                "response"
            };
            write!(out, "\"{name}\":")?;
            string(out, &frame.what())?;
            out.write_all(b"}\n")?;
        }
        Frame::ChannelRequest { scope, channel, .. } => {
            open(out, at(scope, Some(channel)))?;
            out.write_all(b"\"channel_request\":")?;
            string(out, &frame.what())?;
            out.write_all(b"}\n")?;
        }
        Frame::Chunk { .. }
        | Frame::Error { .. }
        | Frame::ChannelResponse { .. }
        | Frame::ChannelFinish { .. }
        | Frame::Malformed(_) => return Ok(false),
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use runloop_proto::ErrorValue;
    use runloop_proto::capture::Direction;
    use runloop_proto::run_loop::{Broken, ResponseError};

    use super::*;

    fn written(write: impl FnOnce(&mut Vec<u8>) -> io::Result<()>) -> String {
        let mut out = Vec::new();
        write(&mut out).expect("a Vec takes every write");
        String::from_utf8(out).expect("UTF-8")
    }

    const AT: At = At {
        time: None,
        scope: Some(1),
        channel: Some(2),
    };
    const NOWHERE: At = At {
        time: None,
        scope: None,
        channel: None,
    };

    #[test]
    fn chunk_and_error_json_is_kept_as_it_came() {
        let json = br#"{ "text":"Hel", "type" : "assistant_text_content","n":1.50}"#;
        assert_eq!(
            written(|out| chunk(out, AT, json)),
            "{\"scope\":1,\"channel\":2,\"chunk\":{ \"text\":\"Hel\", \"type\" : \"assistant_text_content\",\"n\":1.50}}\n"
        );
        assert_eq!(
            written(|out| error(out, NOWHERE, b"\"gone\"")),
            "{\"error\":\"gone\"}\n"
        );
    }

    #[test]
    fn a_time_comes_first_in_microseconds() {
        let at = At {
            time: Some(Duration::from_nanos(3_000_042_999)),
            ..AT
        };
        assert_eq!(
            written(|out| error(out, at, b"1")),
            "{\"time\":3.000042,\"scope\":1,\"channel\":2,\"error\":1}\n"
        );
    }

    #[test]
    fn line_breaks_in_the_json_become_spaces() {
        let line = written(|out| error(out, NOWHERE, b"{\r\n  \"a\": [1,\n2]\n}\n"));
        assert_eq!(line, "{\"error\":{    \"a\": [1, 2] } }\n");
        let value: serde_json::Value = serde_json::from_str(&line).expect("still JSON");
        assert_eq!(value["error"]["a"][1], 2);
    }

    #[test]
    fn outcomes() {
        let cases = [
            (
                Outcome::Finished { fatal: false },
                r#"{"outcome":"finished"}"#,
            ),
            (
                Outcome::Finished { fatal: true },
                r#"{"outcome":"finished","fatal":true}"#,
            ),
            (
                Outcome::Unfinished(ErrorValue::default()),
                r#"{"outcome":"unfinished"}"#,
            ),
            (
                Outcome::NoLoop(ErrorValue::default()),
                r#"{"outcome":"no_loop"}"#,
            ),
            (Outcome::NotServed, r#"{"outcome":"not_served"}"#),
            (
                Outcome::Broken(Broken::InputEnded),
                r#"{"outcome":"broken","reason":"capture ended"}"#,
            ),
            (
                Outcome::Broken(Broken::Undecodable(
                    ResponseError::Chunk(serde::de::Error::custom("a \"quoted\" thing")).into(),
                )),
                r#"{"outcome":"broken","reason":"a response did not decode: agentic loop chunk did not parse: a \"quoted\" thing"}"#,
            ),
        ];
        for (ending, expected) in cases {
            assert_eq!(
                written(|out| outcome(out, NOWHERE, &ending)),
                format!("{expected}\n")
            );
        }
        assert_eq!(
            written(|out| outcome(out, AT, &Outcome::NotServed)),
            "{\"scope\":1,\"channel\":2,\"outcome\":\"not_served\"}\n"
        );
    }

    #[test]
    fn malformed_lines_escape_their_message() {
        assert_eq!(
            written(|out| malformed(out, 7, &"bad hex digit '\"' at column 3")),
            "{\"line\":7,\"malformed\":\"bad hex digit '\\\"' at column 3\"}\n"
        );
    }

    #[test]
    fn the_other_frames_of_a_connection() {
        use Direction::{ClientToServer as C, ServerToClient as S};
        use runloop_proto::frame::raw as message;
        let time = Some(Duration::from_millis(5));
        let cases = [
            (C, message(0, 0, 0, b"\x00"), r#"{"time":0.005000,"authorization":"unbrokered"}"#),
            (
                C,
                message(1, 1, 0, &[&b"\x00"[..], br#"{"image":{"registry":{"reference":"r.io/a:1"}},"memory":1,"disk":0,"agent":{}}"#].concat()),
                r#"{"time":0.005000,"scope":1,"run":{"image":{"registry":{"reference":"r.io/a:1"}},"memory":1,"disk":0,"agent":{}}}"#,
            ),
            (C, message(1, 2, 0, b"\xc8"), r#"{"time":0.005000,"scope":2,"request":"request [200] (1 bytes)"}"#),
            (S, message(2, 1, 0, &[&b"\x00"[..], br#"{"id":"r\"1"}"#].concat()), r#"{"time":0.005000,"scope":1,"id":"r\"1"}"#),
            (S, message(2, 1, 0, b"\x01[1]"), r#"{"time":0.005000,"scope":1,"refused":[1]}"#),
            (
                C,
                message(4, 1, 3, b"\x05{\"prompt\":\"hi\"}"),
                r#"{"time":0.005000,"scope":1,"channel":3,"run_loop":{"prompt":"hi"}}"#,
            ),
            (C, message(4, 1, 4, b"\x00"), r#"{"time":0.005000,"scope":1,"channel":4,"stop":true}"#),
            (
                C,
                message(4, 1, 5, b"\x02{}"),
                r#"{"time":0.005000,"scope":1,"channel":5,"channel_request":"channel request [2] (3 bytes)"}"#,
            ),
            (S, message(3, 1, 0, b""), r#"{"time":0.005000,"scope":1,"finish":true}"#),
        ];
        for (direction, message, expected) in cases {
            let described = crate::frames::describe(direction, &message);
            let line = written(|out| frame(out, time, &described).map(|wrote| assert!(wrote)));
            assert_eq!(line, format!("{expected}\n"));
            serde_json::from_str::<Value>(&line).expect("JSON");
        }
        let chunk = message(5, 1, 3, b"\x00{}");
        let described = crate::frames::describe(S, &chunk);
        assert_eq!(
            written(|out| frame(out, None, &described).map(|wrote| assert!(!wrote))),
            ""
        );
    }
}
