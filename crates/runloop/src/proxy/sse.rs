//! The agent program's event stream, read as the SSE specification reads
//! it, with two guards the parser does not have.
//!
//! Parsing is eventsource-stream's: fields split across reads, `\r\n`, `\r`
//! and `\n` line ends, multi-line `data:` joined with `\n`, comments, a
//! leading byte-order mark, and an event left incomplete at the end of the
//! stream dropped, all as the specification says. What it does not do is
//! bound its buffer or reject bytes that are not UTF-8 (it would keep
//! buffering after a bad byte), so the body goes through two checks before
//! it reaches the parser:
//!
//! ```text
//! HTTP body ──▶ budget: bytes since the last event ≤ max_event ──▶ UTF-8 check ──▶ parser ──▶ data
//! ```
//!
//! The `data` of each event comes out as bytes, unread: the proxy frames
//! it, it never parses it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use eventsource_stream::{EventStreamError, Eventsource};
use futures_util::future;
use futures_util::stream::{self, Stream, StreamExt};

/// Why the event stream broke before its end.
#[derive(Debug, thiserror::Error)]
pub(super) enum Broke {
    /// The HTTP body failed: the connection dropped, a chunked body was cut.
    #[error("the event stream broke: {0}")]
    Transport(String),
    /// The bytes are not UTF-8, which SSE requires.
    #[error("the event stream is not UTF-8: {0}")]
    Utf8(std::str::Utf8Error),
    /// An event grew past the proxy's bound before it ended.
    #[error("an event of the stream is larger than {0} bytes")]
    TooLarge(usize),
    /// The parser refused a line.
    #[error("the event stream did not parse: {0}")]
    Parse(String),
}

/// The `data` of every event of `body`, in order; the stream ends where the
/// body ends.
pub(super) fn data<S>(body: S, max_event: usize) -> impl Stream<Item = Result<Bytes, Broke>>
where
    S: Stream<Item = Result<Bytes, reqwest::Error>>,
{
    let budget = Arc::new(AtomicUsize::new(0));
    let spent = Arc::clone(&budget);
    let mut bom = LeadingBom::default();
    let mut utf8 = Utf8Carry::default();
    let checked = body.map(move |read| {
        let bytes = read.map_err(|error| Broke::Transport(crate::proxy::chain(&error)))?;
        let used = spent.fetch_add(bytes.len(), Ordering::Relaxed) + bytes.len();
        if used > max_event {
            return Err(Broke::TooLarge(max_event));
        }
        let bytes = bom.strip(bytes);
        utf8.check(&bytes).map_err(Broke::Utf8)?;
        Ok(bytes)
    });
    let first_line = stream::once(future::ready(Ok(Bytes::from_static(b"\n"))));
    first_line
        .chain(checked)
        .eventsource()
        .map(move |event| match event {
            Ok(event) => {
                budget.store(0, Ordering::Relaxed);
                Ok(Bytes::from(event.data.into_bytes()))
            }
            Err(EventStreamError::Transport(broke)) => Err(broke),
            Err(EventStreamError::Utf8(error)) => Err(Broke::Utf8(error.utf8_error())),
            Err(EventStreamError::Parser(error)) => Err(Broke::Parse(error.to_string())),
        })
}

/// Drops one byte-order mark at the very start of the stream, even when
/// it is split between reads.
#[derive(Debug, Default)]
struct LeadingBom {
    matched: usize,
    done: bool,
}

impl LeadingBom {
    const BOM: &'static [u8] = b"\xEF\xBB\xBF";

    fn strip(&mut self, bytes: Bytes) -> Bytes {
        if self.done {
            return bytes;
        }
        let rest = &LeadingBom::BOM[self.matched..];
        let n = rest.len().min(bytes.len());
        if bytes[..n] == rest[..n] {
            self.matched += n;
            self.done = self.matched == LeadingBom::BOM.len();
            return bytes.slice(n..);
        }
        // Not a mark after all: give back the bytes held so far.
        self.done = true;
        if self.matched == 0 {
            bytes
        } else {
            Bytes::from([&LeadingBom::BOM[..self.matched], &bytes[..]].concat())
        }
    }
}

/// UTF-8 validation across reads: a character split between two reads is
/// carried (at most three bytes) until the rest of it comes.
#[derive(Debug, Default)]
struct Utf8Carry {
    carry: Vec<u8>,
}

impl Utf8Carry {
    fn check(&mut self, bytes: &[u8]) -> Result<(), std::str::Utf8Error> {
        let joined;
        let input = if self.carry.is_empty() {
            bytes
        } else {
            joined = [self.carry.as_slice(), bytes].concat();
            joined.as_slice()
        };
        match std::str::from_utf8(input) {
            Ok(_) => {
                self.carry.clear();
                Ok(())
            }
            // Only the end is incomplete: wait for the rest of the character.
            Err(error) if error.error_len().is_none() => {
                self.carry = input[error.valid_up_to()..].to_vec();
                Ok(())
            }
            Err(error) => Err(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn events(reads: &[&[u8]], max_event: usize) -> Vec<Result<Bytes, String>> {
        let body = stream::iter(
            reads
                .iter()
                .map(|read| Ok::<_, reqwest::Error>(Bytes::copy_from_slice(read)))
                .collect::<Vec<_>>(),
        );
        data(body, max_event)
            .map(|item| item.map_err(|broke| broke.to_string()))
            .collect()
            .await
    }

    fn ok(data: &str) -> Result<Bytes, String> {
        Ok(Bytes::copy_from_slice(data.as_bytes()))
    }

    #[tokio::test]
    async fn fields_split_across_reads_and_multi_line_data() {
        let reads: &[&[u8]] = &[
            b"\xEF\xBB\xBF: a comment\r\nda",
            b"ta: {\"a\":\r",
            b"\ndata: 1}\r\n\r\n",
            b"event: x\ndata:two\n",
            b"\n: trailing comment\n\ndata: incomplete",
        ];
        assert_eq!(
            events(reads, 1 << 20).await,
            [ok("{\"a\":\n1}"), ok("two")],
            "the incomplete last event is dropped, as the SSE specification says"
        );
    }

    #[tokio::test]
    async fn byte_order_marks() {
        let bom: &[u8] = b"\xEF\xBB\xBF";
        // A mark split across reads is dropped.
        assert_eq!(
            events(&[&bom[..1], &bom[1..2], b"\xBFdata: x\n\n"], 1 << 20).await,
            [ok("x")]
        );
        // A second mark is part of the first field's name: that line is ignored.
        assert_eq!(
            events(&[bom, bom, b"data: x\n\ndata: y\n\n"], 1 << 20).await,
            [ok("y")]
        );
        // Bytes that start like a mark but are not one are kept.
        let got = events(&[&bom[..2], b"data: x\n\n"], 1 << 20).await;
        assert!(got[0].is_err(), "{got:?}");
        assert_eq!(
            events(&[b"data: \xEF\xBB\xBF\n\n"], 1 << 20).await,
            [ok("\u{feff}")]
        );
    }

    #[tokio::test]
    async fn a_character_split_between_reads_is_whole() {
        let text = "data: é€😀\n\n".as_bytes();
        let reads: Vec<&[u8]> = text.chunks(1).collect();
        assert_eq!(events(&reads, 1 << 20).await, [ok("é€😀")]);
    }

    #[tokio::test]
    async fn bytes_that_are_not_utf8_break_the_stream() {
        let got = events(
            &[b"data: 1\n\n", b"data: \xff\n\n", b"data: 2\n\n"],
            1 << 20,
        )
        .await;
        assert_eq!(got[0], ok("1"));
        let error = got[1].clone().expect_err("not UTF-8");
        assert!(
            error.starts_with("the event stream is not UTF-8"),
            "{error}"
        );
    }

    #[tokio::test]
    async fn an_event_past_the_bound_breaks_the_stream() {
        // 13 bytes make the first event; the second passes 13 before its end.
        let got = events(&[b"data: 12345\n\n", b"data: 1234", b"56789"], 13).await;
        assert_eq!(
            got,
            [
                ok("12345"),
                Err("an event of the stream is larger than 13 bytes".to_owned())
            ]
        );
    }
}
