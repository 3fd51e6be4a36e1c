//! Encoding and decoding: two traits and the append-only writer they share.
//!
//! Every payload on the wire is written by an [`Encode`] into a buffer the
//! caller owns, through a [`Writer`] that can only append. A frame is built
//! by writing its header and then its payload into one buffer, so a frame
//! costs one allocation, and a payload encoder can never disturb the header
//! (or anything else) written before it. The writer implements
//! [`std::io::Write`] so `serde_json` serializes straight into the frame
//! instead of into a temporary string that is then copied.
//!
//! Every payload is read by a [`Decode`] from one borrowed message. A
//! decoder may borrow from the message (a credential, a prompt, a frame's
//! payload), so decoding does not copy what the caller only looks at.

use std::error::Error as StdError;
use std::fmt;
use std::io;
use std::sync::Arc;

/// An append-only view of a caller-owned buffer.
///
/// Bytes already in the buffer when the writer was made are out of its
/// reach: it can add bytes after them and nothing else.
#[derive(Debug)]
pub struct Writer<'a> {
    buf: &'a mut Vec<u8>,
    start: usize,
}

impl<'a> Writer<'a> {
    /// A writer that appends to `buf`, after whatever it already holds.
    pub fn new(buf: &'a mut Vec<u8>) -> Self {
        let start = buf.len();
        Writer { buf, start }
    }

    /// Appends `bytes`.
    pub fn extend_from_slice(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// Appends one byte.
    pub fn push(&mut self, byte: u8) {
        self.buf.push(byte);
    }

    /// Makes room for at least `additional` more bytes.
    pub fn reserve(&mut self, additional: usize) {
        self.buf.reserve(additional);
    }

    /// The bytes this writer has appended so far.
    pub fn written(&self) -> &[u8] {
        &self.buf[self.start..]
    }

    /// Drops everything this writer appended, leaving the buffer as it was
    /// when the writer was made.
    pub fn discard(&mut self) {
        self.buf.truncate(self.start);
    }
}

impl io::Write for Writer<'_> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.buf.extend_from_slice(bytes);
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A value that can be written as a wire payload.
pub trait Encode {
    /// Why encoding can fail. For JSON payloads, only serialization fails.
    type Error;

    /// Appends this value's payload.
    fn encode(&self, out: &mut Writer<'_>) -> Result<(), Self::Error>;

    /// A guess at the payload's length, used to reserve the buffer once.
    fn size_hint(&self) -> usize {
        0
    }

    /// Appends this value's payload to `buf`; on failure `buf` is left as
    /// it was.
    fn encode_to(&self, buf: &mut Vec<u8>) -> Result<(), Self::Error> {
        let mut out = Writer::new(buf);
        out.reserve(self.size_hint());
        let result = self.encode(&mut out);
        if result.is_err() {
            out.discard();
        }
        result
    }

    /// This value's payload in a buffer of its own.
    fn to_vec(&self) -> Result<Vec<u8>, Self::Error> {
        let mut buf = Vec::new();
        self.encode_to(&mut buf)?;
        Ok(buf)
    }
}

/// A value that can be read from one wire payload.
pub trait Decode<'a>: Sized {
    /// Why decoding can fail; names what failed.
    type Error;

    /// Reads the value from the whole of `bytes`.
    fn decode(bytes: &'a [u8]) -> Result<Self, Self::Error>;
}

/// Parses a JSON object into `T`, refusing every other JSON type.
///
/// serde_json lets a derived struct be read from an array of its fields in
/// order; on this wire a request is an object, so an array is refused
/// before serde sees it.
pub(crate) fn from_object<'a, T: serde::Deserialize<'a>>(
    json: &'a [u8],
) -> Result<T, serde_json::Error> {
    let first = json
        .iter()
        .find(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'));
    if first == Some(&b'[') {
        return Err(serde::de::Error::invalid_type(
            serde::de::Unexpected::Seq,
            &"a JSON object",
        ));
    }
    serde_json::from_slice(json)
}

/// A decode error, kept whole inside a value that must stay cheap to clone
/// and comparable (an [`Outcome`](crate::run_loop::Outcome), a client's
/// error): it says what the error says, its source is the error's source,
/// and two are equal when they say the same thing.
///
/// It may also quote the payload that did not decode ([`Quote`]): a parser's
/// complaint (`key must be a string at line 1 column 2`) rarely says what
/// came, and the bytes usually do (`[DONE]`, plain text, a stray prefix).
#[derive(Debug)]
pub struct Undecodable<E>(Arc<E>, Option<Arc<Quote>>);

impl<E> Undecodable<E> {
    /// The decode error.
    pub fn error(&self) -> &E {
        &self.0
    }

    /// The error with the start of the payload that caused it.
    pub fn with_payload(error: E, payload: &[u8]) -> Self {
        Undecodable(Arc::new(error), Some(Arc::new(Quote::of(payload))))
    }

    /// The quoted payload, when the error was made with one.
    pub fn payload(&self) -> Option<&Quote> {
        self.1.as_deref()
    }
}

impl<E> From<E> for Undecodable<E> {
    fn from(error: E) -> Self {
        Undecodable(Arc::new(error), None)
    }
}

impl<E> Clone for Undecodable<E> {
    fn clone(&self) -> Self {
        Undecodable(Arc::clone(&self.0), self.1.clone())
    }
}

impl<E: fmt::Display> PartialEq for Undecodable<E> {
    fn eq(&self, other: &Self) -> bool {
        (Arc::ptr_eq(&self.0, &other.0) || self.0.to_string() == other.0.to_string())
            && self.1 == other.1
    }
}

impl<E: fmt::Display> Eq for Undecodable<E> {}

/// The error's words, then the quote when there is one: `…: EOF while
/// parsing an object at line 1 column 1; the payload was "{" (1 byte)`.
impl<E: fmt::Display> fmt::Display for Undecodable<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)?;
        if let Some(quote) = &self.1 {
            write!(f, "; the payload was {quote}")?;
        }
        Ok(())
    }
}

impl<E: StdError> StdError for Undecodable<E> {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.0.source()
    }
}

/// The start of a payload, kept to be shown: its first [`Quote::KEPT`]
/// bytes and its whole length.
///
/// Shown escaped (ASCII, with `\n`, `\"` and `\xNN` for the rest), so a
/// payload of any bytes prints on one line and cannot reach the terminal as
/// control characters, then cut short with `…` and followed by the length:
/// `"[DONE]" (6 bytes)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quote {
    start: Vec<u8>,
    length: usize,
}

impl Quote {
    /// Bytes of a payload kept, at most.
    pub const KEPT: usize = 64;

    /// The quote of `payload`.
    pub fn of(payload: &[u8]) -> Quote {
        Quote {
            start: payload[..payload.len().min(Self::KEPT)].to_vec(),
            length: payload.len(),
        }
    }

    /// The bytes kept: the payload's first [`Quote::KEPT`] at most.
    pub fn start(&self) -> &[u8] {
        &self.start
    }

    /// The payload's whole length in bytes.
    pub fn len(&self) -> usize {
        self.length
    }

    /// Whether the payload was empty.
    pub fn is_empty(&self) -> bool {
        self.length == 0
    }

    /// Whether bytes were left out.
    pub fn is_cut(&self) -> bool {
        self.length > self.start.len()
    }
}

impl fmt::Display for Quote {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cut = if self.is_cut() { "…" } else { "" };
        let unit = if self.length == 1 { "byte" } else { "bytes" };
        write!(
            f,
            "\"{}{cut}\" ({} {unit})",
            self.start.escape_ascii(),
            self.length
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    #[test]
    fn a_quote_is_escaped_cut_short_and_measured() {
        assert_eq!(Quote::of(b"[DONE]").to_string(), r#""[DONE]" (6 bytes)"#);
        assert_eq!(Quote::of(b"").to_string(), r#""" (0 bytes)"#);
        assert_eq!(Quote::of(b"{").to_string(), r#""{" (1 byte)"#);
        let long = "\u{e9}\n\"".repeat(40);
        let quote = Quote::of(long.as_bytes());
        assert!(quote.is_cut());
        let shown = quote.to_string();
        assert!(shown.starts_with(r#""\xc3\xa9\n\"\xc3\xa9\n\""#), "{shown}");
        assert!(shown.ends_with("…\" (160 bytes)"), "{shown}");
        assert_eq!(quote.start().len(), Quote::KEPT);
    }

    #[test]
    fn an_undecodable_says_its_error_then_its_payload() {
        let plain: Undecodable<io::Error> = io::Error::other("bad").into();
        assert_eq!(plain.to_string(), "bad");
        assert!(plain.payload().is_none());
        let quoted = Undecodable::with_payload(io::Error::other("bad"), b"x\x00");
        assert_eq!(
            quoted.to_string(),
            r#"bad; the payload was "x\x00" (2 bytes)"#
        );
        assert_ne!(plain, quoted);
    }

    #[test]
    fn from_object_refuses_arrays() {
        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct One {
            a: u8,
        }
        assert!(from_object::<One>(b"{\"a\":1}").is_ok());
        let error = from_object::<One>(b" [1]").expect_err("array");
        assert_eq!(
            error.to_string(),
            "invalid type: sequence, expected a JSON object"
        );
        assert!(from_object::<One>(b"1").is_err());
    }

    struct Failing;

    impl Encode for Failing {
        type Error = ();

        fn encode(&self, out: &mut Writer<'_>) -> Result<(), ()> {
            out.extend_from_slice(b"partial");
            Err(())
        }
    }

    #[test]
    fn writer_appends_after_existing_bytes() {
        let mut buf = b"head".to_vec();
        let mut out = Writer::new(&mut buf);
        out.push(b'-');
        out.write_all(b"tail").expect("a Vec never fails to grow");
        assert_eq!(out.written(), b"-tail");
        assert_eq!(buf, b"head-tail");
    }

    #[test]
    fn discard_keeps_what_came_before() {
        let mut buf = b"head".to_vec();
        let mut out = Writer::new(&mut buf);
        out.extend_from_slice(b"junk");
        out.discard();
        assert_eq!(buf, b"head");
    }

    #[test]
    fn failed_encode_leaves_the_buffer_untouched() {
        let mut buf = b"frame header".to_vec();
        assert_eq!(Failing.encode_to(&mut buf), Err(()));
        assert_eq!(buf, b"frame header");
    }

    #[test]
    fn serde_json_writes_through_the_writer() {
        let mut buf = vec![0];
        serde_json::to_writer(Writer::new(&mut buf), &[1, 2]).expect("serializes");
        assert_eq!(buf, b"\0[1,2]");
    }
}
