//! JSON lines: the machine-readable form of a loop, one object per line.
//!
//! `decode` and `run --json` print the same objects, so one reader handles
//! both; `decode` adds where each line came from.
//!
//! ```text
//! {"scope":S,"channel":C,"chunk":<chunk JSON>}        scope/channel: decode only
//! {"scope":S,"channel":C,"error":<error JSON>}
//! {"scope":S,"channel":C,"outcome":"finished"|"unfinished"|"no_loop"|"not_served"|"broken",
//!  "reason":"<why it broke>" (broken only), "fatal":true (finished with a fatal last chunk only)}
//! {"line":N,"malformed":"<what>"}                     decode only
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

use runloop_proto::observer::ChannelId;
use runloop_proto::run_loop::Outcome;

/// Opens an object, with the channel's place when there is one.
fn open(out: &mut impl Write, at: Option<ChannelId>) -> io::Result<()> {
    match at {
        Some(ChannelId { scope, channel }) => {
            write!(out, "{{\"scope\":{scope},\"channel\":{channel},")
        }
        None => out.write_all(b"{"),
    }
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
pub fn chunk(out: &mut impl Write, at: Option<ChannelId>, json: &[u8]) -> io::Result<()> {
    member(out, at, "chunk", json)
}

/// `{"error":…}` around error JSON as it came.
pub fn error(out: &mut impl Write, at: Option<ChannelId>, json: &[u8]) -> io::Result<()> {
    member(out, at, "error", json)
}

fn member(out: &mut impl Write, at: Option<ChannelId>, name: &str, json: &[u8]) -> io::Result<()> {
    open(out, at)?;
    write!(out, "\"{name}\":")?;
    write_one_line(out, json)?;
    out.write_all(b"}\n")
}

/// `{"outcome":…}`, with the reason a channel broke and whether a finished
/// loop's last chunk was fatal.
pub fn outcome(out: &mut impl Write, at: Option<ChannelId>, outcome: &Outcome) -> io::Result<()> {
    open(out, at)?;
    write!(out, "\"outcome\":\"{}\"", outcome.name())?;
    match outcome {
        Outcome::Broken(why) => {
            out.write_all(b",\"reason\":")?;
            string(out, why)?;
        }
        Outcome::Finished { fatal: true } => out.write_all(b",\"fatal\":true")?,
        _ => {}
    }
    out.write_all(b"}\n")
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

#[cfg(test)]
mod tests {
    use runloop_proto::ErrorValue;
    use runloop_proto::run_loop::{Broken, ResponseError};

    use super::*;

    fn written(write: impl FnOnce(&mut Vec<u8>) -> io::Result<()>) -> String {
        let mut out = Vec::new();
        write(&mut out).expect("a Vec takes every write");
        String::from_utf8(out).expect("UTF-8")
    }

    const AT: Option<ChannelId> = Some(ChannelId {
        scope: 1,
        channel: 2,
    });

    #[test]
    fn chunk_and_error_json_is_kept_as_it_came() {
        let json = br#"{ "text":"Hel", "type" : "assistant_text_content","n":1.50}"#;
        assert_eq!(
            written(|out| chunk(out, AT, json)),
            "{\"scope\":1,\"channel\":2,\"chunk\":{ \"text\":\"Hel\", \"type\" : \"assistant_text_content\",\"n\":1.50}}\n"
        );
        assert_eq!(
            written(|out| error(out, None, b"\"gone\"")),
            "{\"error\":\"gone\"}\n"
        );
    }

    #[test]
    fn line_breaks_in_the_json_become_spaces() {
        let line = written(|out| error(out, None, b"{\r\n  \"a\": [1,\n2]\n}\n"));
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
                written(|out| outcome(out, None, &ending)),
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
}
