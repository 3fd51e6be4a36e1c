//! The capture format: a connection's messages as lines of hex text.
//!
//! A capture is what a client records with `--capture` and what
//! `runloop decode` reads back. It is text so that a person can write one by
//! hand, annotate it, cut it down to the three lines that matter, and diff it;
//! it is hex so that every byte of a message survives, including the bytes
//! that make a frame malformed, which are exactly the ones worth inspecting.
//!
//! ```text
//! # a comment; blank lines are ignored too
//! > 00 00000000 00000000 00              client to server: one binary message
//! < 05 00000001 00000002 007b2274…7d     server to client: one binary message
//!   │  │        │        └ payload
//!   │  │        └ channel
//!   │  └ scope
//!   └ type
//! ```
//!
//! One binary WebSocket message per line: the direction (`>` or `<`), at
//! least one space or tab, then the message in hex. Whitespace anywhere in
//! the hex is ignored and digits may be of either case, so the grouping the
//! writer puts in (type, scope, channel, payload) is for the eye only. A
//! direction with nothing after it is an empty message.
//!
//! The payload variant (`--payloads`) holds one run-loop channel's responses
//! and nothing around them: each line is one channel response payload in hex
//! (tag byte first), or the word `finish` for the channel response finish.
//! It cannot hold an empty payload, since an empty line is a blank line; the
//! full format can (a channel response frame with nothing after its header).
//!
//! Parsing is one line at a time and does no I/O, so a reader can stream a
//! capture as it grows; numbering the lines is the reader's part. A line
//! that cannot be read is an error that says what is wrong and, where it
//! helps, at which column, so the line can be fixed by hand.

use std::fmt;

use crate::frame::HEADER_LEN;

/// Which way a message went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// `>`: sent by the client, to the server.
    ClientToServer,
    /// `<`: sent by the server, to the client.
    ServerToClient,
}

impl Direction {
    /// The marker that starts a line: `>` or `<`.
    pub fn marker(self) -> char {
        match self {
            Direction::ClientToServer => '>',
            Direction::ServerToClient => '<',
        }
    }

    fn from_marker(byte: u8) -> Option<Direction> {
        match byte {
            b'>' => Some(Direction::ClientToServer),
            b'<' => Some(Direction::ServerToClient),
            _ => None,
        }
    }
}

/// One line of the payload variant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payload {
    /// One channel response payload, tag byte first.
    Response(Vec<u8>),
    /// The word `finish`: the channel response finish.
    Finish,
}

/// The word that stands for a channel response finish in the payload variant.
pub const FINISH: &str = "finish";

/// A byte as a person should read it in an error: the character when it is
/// printable ASCII, else its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found(pub u8);

impl fmt::Display for Found {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_ascii_graphic() {
            write!(f, "'{}'", char::from(self.0))
        } else {
            write!(f, "byte 0x{:02x}", self.0)
        }
    }
}

/// A capture line that cannot be read. Columns count bytes from 1.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LineError {
    /// The line does not start with `>` or `<`.
    #[error("missing direction: expected '>' or '<' at column {column}, found {found}")]
    MissingDirection {
        /// Where the direction should be.
        column: usize,
        /// What is there instead.
        found: Found,
    },
    /// The direction is not followed by a space.
    #[error("expected a space after the direction '{}' at column {column}, found {found}", .direction.marker())]
    MissingSpace {
        /// The direction that was read.
        direction: Direction,
        /// Where the space should be.
        column: usize,
        /// What is there instead.
        found: Found,
    },
    /// A character in the hex that is neither a hex digit nor whitespace.
    #[error("bad hex digit {found} at column {column}")]
    BadDigit {
        /// Where it is.
        column: usize,
        /// What it is.
        found: Found,
    },
    /// An odd number of hex digits: the last byte is missing a digit.
    #[error("odd number of hex digits ({digits}): the last byte is missing a digit")]
    OddDigits {
        /// How many digits the line has.
        digits: usize,
    },
}

/// The line without its line break and surrounding whitespace, and the
/// column its first byte had.
fn trimmed(line: &[u8]) -> (&[u8], usize) {
    let start = line
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(line.len());
    let end = line
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(start, |last| last + 1);
    (&line[start..end], start + 1)
}

/// Whether a trimmed line carries nothing: blank, or a `#` comment.
fn is_ignored(line: &[u8]) -> bool {
    matches!(line.first(), None | Some(b'#'))
}

fn hex_value(byte: u8) -> Option<u8> {
    match byte {
        b'0'..=b'9' => Some(byte - b'0'),
        b'a'..=b'f' => Some(byte - b'a' + 10),
        b'A'..=b'F' => Some(byte - b'A' + 10),
        _ => None,
    }
}

/// Reads hex with whitespace anywhere; `column` is the column of `hex[0]`.
fn parse_hex(hex: &[u8], column: usize) -> Result<Vec<u8>, LineError> {
    let mut bytes = Vec::with_capacity(hex.len() / 2);
    let mut high = None;
    let mut digits = 0;
    for (at, &byte) in hex.iter().enumerate() {
        if byte.is_ascii_whitespace() {
            continue;
        }
        let value = hex_value(byte).ok_or(LineError::BadDigit {
            column: column + at,
            found: Found(byte),
        })?;
        digits += 1;
        match high.take() {
            None => high = Some(value),
            Some(high) => bytes.push(high << 4 | value),
        }
    }
    if high.is_some() {
        return Err(LineError::OddDigits { digits });
    }
    Ok(bytes)
}

/// Reads one line of a capture (with or without its line break).
///
/// `Ok(None)` for a blank line or a comment; otherwise the message's
/// direction and bytes, or what is wrong with the line.
pub fn parse_message(line: &[u8]) -> Result<Option<(Direction, Vec<u8>)>, LineError> {
    let (line, column) = trimmed(line);
    let Some((&marker, rest)) = line.split_first() else {
        return Ok(None);
    };
    if is_ignored(line) {
        return Ok(None);
    }
    let direction = Direction::from_marker(marker).ok_or(LineError::MissingDirection {
        column,
        found: Found(marker),
    })?;
    match rest.first() {
        None => Ok(Some((direction, Vec::new()))),
        Some(b' ' | b'\t') => Ok(Some((direction, parse_hex(rest, column + 1)?))),
        Some(&other) => Err(LineError::MissingSpace {
            direction,
            column: column + 1,
            found: Found(other),
        }),
    }
}

/// Reads one line of the payload variant (with or without its line break).
///
/// `Ok(None)` for a blank line or a comment; otherwise one channel response
/// payload or the finish, or what is wrong with the line.
pub fn parse_payload(line: &[u8]) -> Result<Option<Payload>, LineError> {
    let (line, column) = trimmed(line);
    if is_ignored(line) {
        return Ok(None);
    }
    if line == FINISH.as_bytes() {
        return Ok(Some(Payload::Finish));
    }
    parse_hex(line, column).map(|bytes| Some(Payload::Response(bytes)))
}

/// One message as one capture line, without the line break.
///
/// A message of at least a header's length is grouped as type, scope,
/// channel and payload; a shorter one is written as one run of digits.
///
/// ```
/// use runloop_proto::capture::{Direction, Line};
///
/// let line = Line::new(Direction::ServerToClient, &[6, 0, 0, 0, 1, 0, 0, 0, 2]);
/// assert_eq!(line.to_string(), "< 06 00000001 00000002");
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Line<'a> {
    direction: Direction,
    message: &'a [u8],
}

impl<'a> Line<'a> {
    /// The line for `message`, going `direction`.
    pub fn new(direction: Direction, message: &'a [u8]) -> Self {
        Line { direction, message }
    }
}

fn write_hex(f: &mut fmt::Formatter<'_>, bytes: &[u8]) -> fmt::Result {
    bytes.iter().try_for_each(|byte| write!(f, "{byte:02x}"))
}

impl fmt::Display for Line<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.direction.marker())?;
        if self.message.is_empty() {
            return Ok(());
        }
        f.write_str(" ")?;
        let Some((header, payload)) = self.message.split_first_chunk::<HEADER_LEN>() else {
            return write_hex(f, self.message);
        };
        write_hex(f, &header[..1])?;
        f.write_str(" ")?;
        write_hex(f, &header[1..5])?;
        f.write_str(" ")?;
        write_hex(f, &header[5..])?;
        if !payload.is_empty() {
            f.write_str(" ")?;
            write_hex(f, payload)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_lines() {
        assert_eq!(
            parse_message(b"> 00 00000000 00000000 0074\n"),
            Ok(Some((
                Direction::ClientToServer,
                vec![0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x74]
            )))
        );
        assert_eq!(
            parse_message(b"<\t06 0000 0001  000000 02\r\n"),
            Ok(Some((
                Direction::ServerToClient,
                vec![6, 0, 0, 0, 1, 0, 0, 0, 2]
            )))
        );
        assert_eq!(
            parse_message(b"  > aBcD eF  "),
            Ok(Some((Direction::ClientToServer, vec![0xab, 0xcd, 0xef])))
        );
    }

    #[test]
    fn a_direction_alone_is_an_empty_message() {
        assert_eq!(
            parse_message(b"<"),
            Ok(Some((Direction::ServerToClient, vec![])))
        );
        assert_eq!(
            parse_message(b">   \n"),
            Ok(Some((Direction::ClientToServer, vec![])))
        );
    }

    #[test]
    fn blank_lines_and_comments_are_ignored() {
        for line in [&b""[..], b"\n", b"   \t\r\n", b"# > 00", b"   #x", b"#"] {
            assert_eq!(parse_message(line), Ok(None), "{line:?}");
            assert_eq!(parse_payload(line), Ok(None), "{line:?}");
        }
    }

    #[test]
    fn errors_name_what_and_where() {
        let missing = parse_message(b"  00 11").expect_err("no direction");
        assert_eq!(
            missing,
            LineError::MissingDirection {
                column: 3,
                found: Found(b'0')
            }
        );
        assert_eq!(
            missing.to_string(),
            "missing direction: expected '>' or '<' at column 3, found '0'"
        );

        let space = parse_message(b">00").expect_err("no space");
        assert_eq!(
            space.to_string(),
            "expected a space after the direction '>' at column 2, found '0'"
        );

        let odd = parse_message(b"< 0 12 34").expect_err("odd");
        assert_eq!(odd, LineError::OddDigits { digits: 5 });
        assert_eq!(
            odd.to_string(),
            "odd number of hex digits (5): the last byte is missing a digit"
        );

        let bad = parse_message(b"> 00 0g").expect_err("bad digit");
        assert_eq!(
            bad,
            LineError::BadDigit {
                column: 7,
                found: Found(b'g')
            }
        );
        assert_eq!(bad.to_string(), "bad hex digit 'g' at column 7");

        let non_ascii = parse_message(" > 0é".as_bytes()).expect_err("non-ASCII");
        assert_eq!(non_ascii.to_string(), "bad hex digit byte 0xc3 at column 5");
        let control = parse_message(b"\x01 00").expect_err("control byte");
        assert_eq!(
            control.to_string(),
            "missing direction: expected '>' or '<' at column 1, found byte 0x01"
        );
    }

    #[test]
    fn payload_lines() {
        assert_eq!(
            parse_payload(b"00 7b7d\n"),
            Ok(Some(Payload::Response(vec![0, b'{', b'}'])))
        );
        assert_eq!(parse_payload(b"  finish \r\n"), Ok(Some(Payload::Finish)));
        assert_eq!(
            parse_payload(b"FINISH"),
            Err(LineError::BadDigit {
                column: 2,
                found: Found(b'I')
            })
        );
        assert_eq!(
            parse_payload(b" 0"),
            Err(LineError::OddDigits { digits: 1 })
        );
        assert_eq!(
            parse_payload(b"> 00"),
            Err(LineError::BadDigit {
                column: 1,
                found: Found(b'>')
            })
        );
    }

    #[test]
    fn writer_groups_the_header() {
        let message = b"\x05\x00\x00\x00\x01\x00\x00\x00\x02\x00{}";
        let line = Line::new(Direction::ServerToClient, message).to_string();
        assert_eq!(line, "< 05 00000001 00000002 007b7d");
        assert_eq!(
            Line::new(Direction::ClientToServer, &[1, 2, 0xff]).to_string(),
            "> 0102ff"
        );
        assert_eq!(Line::new(Direction::ClientToServer, &[]).to_string(), ">");
    }

    #[test]
    fn written_lines_read_back() {
        let messages: [&[u8]; 5] = [
            &[],
            &[0xff],
            &[0; HEADER_LEN],
            b"\x04\x00\x00\x00\x01\x00\x00\x00\x02\x05{\"prompt\":\"hi\"}",
            &[0xab; 100],
        ];
        for direction in [Direction::ClientToServer, Direction::ServerToClient] {
            for message in messages {
                let line = Line::new(direction, message).to_string();
                assert_eq!(
                    parse_message(line.as_bytes()),
                    Ok(Some((direction, message.to_vec()))),
                    "{line}"
                );
            }
        }
    }

    proptest::proptest! {
        #[test]
        fn any_message_reads_back_from_its_line(
            from_client in proptest::bool::ANY,
            message in proptest::collection::vec(proptest::num::u8::ANY, 0..64),
        ) {
            let direction = if from_client {
                Direction::ClientToServer
            } else {
                Direction::ServerToClient
            };
            let line = format!("{}\n", Line::new(direction, &message));
            proptest::prop_assert_eq!(
                parse_message(line.as_bytes()),
                Ok(Some((direction, message)))
            );
        }

        #[test]
        fn any_line_is_read_or_refused_pointing_at_the_byte(
            line in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::strategy::Just(b' '),
                    proptest::strategy::Just(b'>'),
                    proptest::strategy::Just(b'a'),
                    proptest::strategy::Just(b'0'),
                    proptest::num::u8::ANY,
                ],
                0..64,
            ),
        ) {
            for result in [
                parse_message(&line).map(|read| read.map(|(_, bytes)| bytes)),
                parse_payload(&line).map(|read| match read {
                    Some(Payload::Response(bytes)) => Some(bytes),
                    _ => None,
                }),
            ] {
                match result {
                    Ok(Some(bytes)) => proptest::prop_assert!(bytes.len() * 2 <= line.len()),
                    Ok(None) => {}
                    Err(
                        LineError::BadDigit { column, found }
                        | LineError::MissingDirection { column, found }
                        | LineError::MissingSpace { column, found, .. },
                    ) => proptest::prop_assert_eq!(line.get(column - 1), Some(&found.0)),
                    Err(LineError::OddDigits { digits }) => proptest::prop_assert!(digits % 2 == 1),
                }
            }
        }
    }
}
