//! The agent program's event stream, read as the SSE specification reads
//! it, with two guards the parser does not have.
//!
//! Parsing is sse-stream's (the parser the MCP Rust SDK's transports use):
//! fields split across reads, `\r\n`, `\r` and `\n` line ends, multi-line
//! `data:` joined with `\n`, comments, a leading byte-order mark, blocks
//! without `data` dispatching nothing, and an event left incomplete at the
//! end of the stream dropped, all as the specification says (the property
//! tests below hold it to that, read in every split). It is incremental: each
//! byte is scanned once, whatever the reads, so one large event costs time
//! linear in its size (eventsource-stream 0.2, used before, rescanned its
//! whole buffer on every read: a 15 MiB event sent in 4 KiB pieces cost a
//! minute of CPU).
//!
//! What it does not do is bound its buffer or reject bytes that are not
//! UTF-8 (SSE's decoder would replace them, and a chunk is JSON, which
//! must be UTF-8), so the body goes through a guard first that hands it on
//! in pieces:
//!
//! ```text
//! HTTP body ──▶ cut at the budget ──▶ cut before bad UTF-8 ──▶ parser ──▶ data of each event
//!               (max_event bytes       (an error, once the
//!                after the last         bytes before it are
//!                event's end)           parsed)
//! ```
//!
//! Both cuts hand on the bytes before them first, so every event that
//! ended before the bad bytes, or within the bound, comes out before the
//! error, and the outcome never depends on how the body was split into
//! reads. For the budget the guard learns where each event ended from the
//! parser itself: each piece counts the bytes the parser consumes
//! ([`Piece`]), and an event comes out right after the bytes that ended it
//! were consumed.
//!
//! The `data` of each event comes out as bytes, unread: the proxy frames
//! it, it never parses it.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use bytes::{Buf, Bytes};
use futures_util::future;
use futures_util::stream::{self, Stream, StreamExt};
use sse_stream::SseByteStream;

use super::upstream::chain;

/// Why the event stream broke before its end.
#[derive(Debug, thiserror::Error)]
pub(super) enum Broke {
    /// The HTTP body failed: the connection dropped, a chunked body was cut.
    #[error("the event stream broke: {}", chain(.0.as_ref()))]
    Transport(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The bytes are not UTF-8, as chunk JSON must be (SSE's own decoder
    /// would replace them, which would change a chunk).
    #[error("the event stream is not UTF-8 (bad bytes at offset {0})")]
    Utf8(u64),
    /// An event grew past the proxy's bound before it ended.
    #[error("an event of the stream is larger than {0} bytes")]
    TooLarge(usize),
    /// The parser refused the stream.
    #[error("the event stream did not parse: {0}")]
    Parse(#[source] sse_stream::Error),
}

/// The `data` of every event of `body`, in order; the stream ends where the
/// body ends.
pub(super) fn data<S>(body: S, max_event: usize) -> impl Stream<Item = Result<Bytes, Broke>>
where
    S: Stream<Item = Result<Bytes, reqwest::Error>> + Send + 'static,
{
    let marks = Arc::new(Marks::default());
    let guard = Guard {
        body: Box::pin(body),
        max_event,
        pending: Bytes::new(),
        utf8: Utf8Carry::default(),
        broke: None,
        fed: 0,
        marks: Arc::clone(&marks),
    };
    let pieces = stream::unfold(guard, |mut guard| async move {
        let piece = guard.next().await?;
        Some((piece, guard))
    });
    SseByteStream::new(pieces).filter_map(move |event| {
        future::ready(match event {
            Ok(event) => {
                marks.event_ended();
                // A block with no `data` field dispatches no event.
                event.data.map(|data| Ok(Bytes::from(data)))
            }
            Err(sse_stream::Error::Body(inner)) => Some(Err(match inner.downcast::<Broke>() {
                Ok(broke) => *broke,
                Err(other) => Broke::Transport(other),
            })),
            Err(other) => Some(Err(Broke::Parse(other))),
        })
    })
}

/// Where the parser is in the stream, shared between the pieces it
/// consumes and the events it yields.
#[derive(Debug, Default)]
struct Marks {
    /// Bytes the parser has consumed.
    parsed: AtomicU64,
    /// Whether the last bytes consumed were `\r\n`.
    crlf: AtomicBool,
    /// Where the last event ended: right after the `\r` or `\n` that ended
    /// it. The `\n` of a `\r\n` counts towards the next event, as it does
    /// when the two come in different reads.
    event_end: AtomicU64,
}

impl Marks {
    /// An event came out: it ended where the parser is.
    fn event_ended(&self) {
        let lf = u64::from(self.crlf.load(Ordering::Relaxed));
        let end = self.parsed.load(Ordering::Relaxed) - lf;
        self.event_end.store(end, Ordering::Relaxed);
    }
}

/// A piece of the body on its way into the parser, which tells the shared
/// [`Marks`] what the parser consumed.
struct Piece {
    bytes: Bytes,
    marks: Arc<Marks>,
}

impl Buf for Piece {
    fn remaining(&self) -> usize {
        self.bytes.len()
    }

    fn chunk(&self) -> &[u8] {
        &self.bytes
    }

    fn advance(&mut self, n: usize) {
        let consumed = &self.bytes[..n];
        self.marks
            .crlf
            .store(consumed.ends_with(b"\r\n"), Ordering::Relaxed);
        self.marks.parsed.fetch_add(n as u64, Ordering::Relaxed);
        self.bytes.advance(n);
    }
}

/// The guard between the body and the parser.
struct Guard<S> {
    body: Pin<Box<S>>,
    max_event: usize,
    /// What is left of the last read.
    pending: Bytes,
    utf8: Utf8Carry,
    /// Bad bytes were found: this goes to the parser once the bytes before
    /// them have.
    broke: Option<Broke>,
    /// Bytes handed to the parser.
    fed: u64,
    marks: Arc<Marks>,
}

impl<S> Guard<S>
where
    S: Stream<Item = Result<Bytes, reqwest::Error>>,
{
    /// The next piece for the parser, or why the stream broke.
    async fn next(&mut self) -> Option<Result<Piece, Broke>> {
        loop {
            if let Some(broke) = self.broke.take() {
                return Some(Err(broke));
            }
            if self.pending.is_empty() {
                match self.body.next().await? {
                    Ok(read) => self.pending = read,
                    Err(error) => {
                        return Some(Err(Broke::Transport(Box::new(error))));
                    }
                }
                continue;
            }
            // The bytes of the event under way, counted from the end of the
            // last one; the parser has consumed all it was given.
            let under_way = self.fed - self.marks.event_end.load(Ordering::Relaxed);
            let room = (self.max_event as u64).saturating_sub(under_way);
            if room == 0 {
                return Some(Err(Broke::TooLarge(self.max_event)));
            }
            let take = usize::try_from(room)
                .map_or(self.pending.len(), |room| room.min(self.pending.len()));
            let mut piece = self.pending.split_to(take);
            let carried = self.utf8.carried();
            if let Err(good) = self.utf8.check(&piece) {
                // Where the bad bytes start, in the stream; they may begin
                // in a character carried from the last piece.
                let at = self.fed + good as u64 - carried as u64;
                self.broke = Some(Broke::Utf8(at));
                piece.truncate(good.saturating_sub(carried));
                self.pending = Bytes::new();
            }
            if piece.is_empty() {
                continue;
            }
            self.fed += piece.len() as u64;
            return Some(Ok(Piece {
                bytes: piece,
                marks: Arc::clone(&self.marks),
            }));
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
    /// How many bytes of an unfinished character are carried.
    fn carried(&self) -> usize {
        self.carry.len()
    }

    /// Checks the next bytes of the stream. `Err(good)`: the carried bytes
    /// and `bytes`, taken together, are UTF-8 up to `good`, and not after.
    fn check(&mut self, bytes: &[u8]) -> Result<(), usize> {
        let joined;
        let input = if self.carry.is_empty() {
            bytes
        } else {
            // One copy of a read that finishes a character: linear still.
            joined = [self.carry.as_slice(), bytes].concat();
            joined.as_slice()
        };
        match std::str::from_utf8(input) {
            Ok(_) => {
                self.carry.clear();
                Ok(())
            }
            // Only the end is unfinished: wait for the rest of the character.
            Err(error) if error.error_len().is_none() => {
                self.carry = input[error.valid_up_to()..].to_vec();
                Ok(())
            }
            Err(error) => Err(error.valid_up_to()),
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

    #[test]
    fn a_transport_break_says_its_whole_chain_and_keeps_it_as_the_source() {
        #[derive(Debug, thiserror::Error)]
        #[error("the body failed")]
        struct Body(#[source] std::io::Error);
        let broke = Broke::Transport(Box::new(Body(std::io::Error::other("reset"))));
        assert_eq!(
            broke.to_string(),
            "the event stream broke: the body failed: reset"
        );
        let source = std::error::Error::source(&broke).expect("the transport's error");
        assert_eq!(source.to_string(), "the body failed");
        assert!(source.source().is_some(), "and what is beneath it");
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
        assert_eq!(
            got,
            [
                ok("1"),
                Err("the event stream is not UTF-8 (bad bytes at offset 15)".to_owned())
            ]
        );
    }

    #[tokio::test]
    async fn a_good_event_in_the_same_read_as_bad_bytes_comes_out_first() {
        let got = events(&[b"data: 1\n\n\xff"], 1 << 20).await;
        assert_eq!(
            got,
            [
                ok("1"),
                Err("the event stream is not UTF-8 (bad bytes at offset 9)".to_owned())
            ]
        );
        // Bad bytes that finish a character begun in the read before.
        let got = events(&[b"data: 1\n\ndata: \xE2\x82", b"x\n\n"], 1 << 20).await;
        assert_eq!(
            got,
            [
                ok("1"),
                Err("the event stream is not UTF-8 (bad bytes at offset 15)".to_owned())
            ]
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

/// The same body split into reads every which way gives the same events
/// and the same ending, and both are what the SSE rules say: every event
/// that ended before bad bytes or within the bound, then the error.
#[cfg(test)]
mod splits {
    use futures_util::FutureExt;
    use proptest::prelude::*;

    use super::*;

    /// Line ends, chosen per line.
    #[derive(Debug, Clone, Copy)]
    enum Eol {
        Lf,
        Cr,
        CrLf,
    }

    /// One line of a block.
    #[derive(Debug, Clone)]
    enum Line {
        /// `data:` then, with or without one space, the text.
        Data { space: bool, text: String },
        /// `data` with no colon: an empty data line.
        BareData,
        /// `event: name`.
        Event,
        /// A field SSE does not know; ignored.
        Unknown,
        /// `:` and a comment.
        Comment(String),
    }

    /// A body: an optional byte-order mark, blocks (each ends with a blank
    /// line), and an optional last block left without its blank line.
    #[derive(Debug, Clone)]
    struct Body {
        bom: bool,
        blocks: Vec<Vec<(Line, Eol)>>,
        blank_eols: Vec<Eol>,
        unfinished: Vec<(Line, Eol)>,
    }

    /// What the SSE rules make of a body: for each block that is an event,
    /// where it ended (right after the first byte of its blank line) and
    /// its data, if it has any.
    struct Expected {
        bytes: Vec<u8>,
        events: Vec<(usize, Option<String>)>,
    }

    fn eol() -> impl Strategy<Value = Eol> {
        prop_oneof![Just(Eol::Lf), Just(Eol::Cr), Just(Eol::CrLf)]
    }

    fn line() -> impl Strategy<Value = Line> {
        let text = "[ a-z0-9:{}\"é€😀]{0,12}";
        prop_oneof![
            6 => (any::<bool>(), text).prop_map(|(space, text)| Line::Data { space, text }),
            1 => Just(Line::BareData),
            1 => Just(Line::Event),
            1 => Just(Line::Unknown),
            2 => text.prop_map(Line::Comment),
        ]
    }

    fn body() -> impl Strategy<Value = Body> {
        let lines = || prop::collection::vec((line(), eol()), 0..4);
        (
            any::<bool>(),
            prop::collection::vec(lines(), 0..6),
            prop::collection::vec(eol(), 6),
            lines(),
        )
            .prop_map(|(bom, blocks, blank_eols, unfinished)| Body {
                bom,
                blocks,
                blank_eols,
                unfinished,
            })
    }

    fn push_eol(bytes: &mut Vec<u8>, eol: Eol) {
        bytes.extend_from_slice(match eol {
            Eol::Lf => b"\n",
            Eol::Cr => b"\r",
            Eol::CrLf => b"\r\n",
        });
    }

    /// Writes one line; returns its data, if it is a data line, and whether
    /// it makes its block an event.
    fn push_line(bytes: &mut Vec<u8>, line: &Line, eol: Eol) -> (Option<String>, bool) {
        let (text, data, fields) = match line {
            Line::Data { space, text } => {
                let written = format!("data:{}{text}", if *space { " " } else { "" });
                let value = if *space {
                    text.clone()
                } else {
                    text.strip_prefix(' ').unwrap_or(text).to_owned()
                };
                (written, Some(value), true)
            }
            Line::BareData => ("data".to_owned(), Some(String::new()), true),
            Line::Event => ("event: named".to_owned(), None, true),
            Line::Unknown => ("note: ignored".to_owned(), None, false),
            Line::Comment(text) => (format!(":{text}"), None, false),
        };
        bytes.extend_from_slice(text.as_bytes());
        push_eol(bytes, eol);
        (data, fields)
    }

    impl Body {
        fn expected(&self) -> Expected {
            let mut bytes = Vec::new();
            if self.bom {
                bytes.extend_from_slice(b"\xEF\xBB\xBF");
            }
            let mut events = Vec::new();
            for (block, blank) in self.blocks.iter().zip(&self.blank_eols) {
                let mut data: Option<String> = None;
                let mut is_event = false;
                let mut last_eol = None;
                for (line, eol) in block {
                    let (line_data, fields) = push_line(&mut bytes, line, *eol);
                    if let Some(line_data) = line_data {
                        data = Some(match data {
                            None => line_data,
                            Some(before) => format!("{before}\n{line_data}"),
                        });
                    }
                    is_event |= fields;
                    last_eol = Some(*eol);
                }
                // A lone CR followed by a blank line's LF would be one CRLF,
                // not a blank line: the blank line ends with CR then.
                let blank = match (last_eol, blank) {
                    (Some(Eol::Cr), Eol::Lf) => Eol::Cr,
                    (_, blank) => *blank,
                };
                push_eol(&mut bytes, blank);
                let end = bytes.len() - usize::from(matches!(blank, Eol::CrLf));
                if is_event {
                    events.push((end, data));
                }
            }
            for (line, eol) in &self.unfinished {
                push_line(&mut bytes, line, *eol);
            }
            Expected { bytes, events }
        }
    }

    /// The events of `bytes` read in the pieces `cuts` makes.
    fn read(bytes: &[u8], cuts: &[usize], max_event: usize) -> Vec<Result<Bytes, String>> {
        let mut reads = Vec::new();
        let mut start = 0;
        for &cut in cuts.iter().chain([&bytes.len()]) {
            let cut = cut.clamp(start, bytes.len());
            reads.push(Ok::<_, reqwest::Error>(Bytes::copy_from_slice(
                &bytes[start..cut],
            )));
            start = cut;
        }
        data(stream::iter(reads), max_event)
            .map(|item| item.map_err(|broke| broke.to_string()))
            .collect::<Vec<_>>()
            .now_or_never()
            .expect("a body that is all there is read at once")
    }

    /// Every way of reading `bytes` this test tries: whole, one byte at a
    /// time, cut in two at every point, and the random cuts given.
    fn every_read(
        bytes: &[u8],
        random: &[usize],
        max_event: usize,
        expected: &[Result<Bytes, String>],
    ) -> Result<(), TestCaseError> {
        let bytewise: Vec<usize> = (1..bytes.len()).collect();
        let mut random = random.to_vec();
        random.sort_unstable();
        let splits = (0..=bytes.len())
            .map(|cut| vec![cut])
            .chain([vec![], bytewise, random]);
        for cuts in splits {
            let got = read(bytes, &cuts, max_event);
            prop_assert_eq!(&got, expected, "read in pieces cut at {:?}", cuts);
        }
        Ok(())
    }

    fn ok(data: &str) -> Result<Bytes, String> {
        Ok(Bytes::copy_from_slice(data.as_bytes()))
    }

    proptest! {
        /// A well-formed body: its events, in order, and a clean end.
        #[test]
        fn a_body_reads_the_same_however_it_is_split(
            body in body(),
            random in prop::collection::vec(any::<prop::sample::Index>(), 0..8),
        ) {
            let Expected { bytes, events } = body.expected();
            let random: Vec<usize> = random.iter().map(|i| i.index(bytes.len() + 1)).collect();
            let expected: Vec<_> = events.iter().filter_map(|(_, data)| data.as_deref().map(ok)).collect();
            every_read(&bytes, &random, 1 << 20, &expected)?;
        }

        /// A bad byte at any character boundary: every event that ended
        /// before it, then the error, naming where it is.
        #[test]
        fn bad_bytes_come_after_every_event_that_ended_before_them(
            body in body(),
            at in any::<prop::sample::Index>(),
            bad in prop_oneof![Just(0xFFu8), Just(0x80), Just(0xC0)],
            random in prop::collection::vec(any::<prop::sample::Index>(), 0..8),
        ) {
            let Expected { mut bytes, events } = body.expected();
            let boundaries: Vec<usize> = (0..=bytes.len())
                .filter(|&i| std::str::from_utf8(&bytes[..i]).is_ok())
                .collect();
            let at = boundaries[at.index(boundaries.len())];
            bytes.insert(at, bad);
            let random: Vec<usize> = random.iter().map(|i| i.index(bytes.len() + 1)).collect();
            let mut expected: Vec<_> = events
                .iter()
                .filter(|(end, _)| *end <= at)
                .filter_map(|(_, data)| data.as_deref().map(ok))
                .collect();
            expected.push(Err(format!("the event stream is not UTF-8 (bad bytes at offset {at})")));
            every_read(&bytes, &random, 1 << 20, &expected)?;
        }

        /// A bound on one event: every event within it, and the error at the
        /// first event (or unfinished tail) past it.
        #[test]
        fn the_bound_on_one_event_does_not_depend_on_the_reads(
            body in body(),
            max_event in 1usize..64,
            random in prop::collection::vec(any::<prop::sample::Index>(), 0..8),
        ) {
            let Expected { bytes, events } = body.expected();
            let random: Vec<usize> = random.iter().map(|i| i.index(bytes.len() + 1)).collect();
            let mut expected = Vec::new();
            let mut start = 0;
            let mut too_large = true;
            for (end, data) in &events {
                if end - start > max_event {
                    break;
                }
                expected.extend(data.as_deref().map(ok));
                start = *end;
            }
            if events.last().is_none_or(|(end, _)| *end == start) {
                too_large = bytes.len() - start > max_event;
            }
            if too_large {
                expected.push(Err(format!("an event of the stream is larger than {max_event} bytes")));
            }
            every_read(&bytes, &random, max_event, &expected)?;
        }
    }
}
