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
#[derive(Debug)]
pub struct Undecodable<E>(Arc<E>);

impl<E> Undecodable<E> {
    /// The decode error.
    pub fn error(&self) -> &E {
        &self.0
    }
}

impl<E> From<E> for Undecodable<E> {
    fn from(error: E) -> Self {
        Undecodable(Arc::new(error))
    }
}

impl<E> Clone for Undecodable<E> {
    fn clone(&self) -> Self {
        Undecodable(Arc::clone(&self.0))
    }
}

impl<E: fmt::Display> PartialEq for Undecodable<E> {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0.to_string() == other.0.to_string()
    }
}

impl<E: fmt::Display> Eq for Undecodable<E> {}

impl<E: fmt::Display> fmt::Display for Undecodable<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<E: StdError> StdError for Undecodable<E> {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.0.source()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

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
