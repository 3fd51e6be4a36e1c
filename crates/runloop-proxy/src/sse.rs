//! The agent program's event stream, read as the SSE specification reads
//! it (WHATWG HTML, "event stream interpretation"), with each event's data
//! handed on in pieces once it is large.
//!
//! The reader is this module's own, because no SSE crate hands out a `data`
//! field before its event ends: sse-stream (used here before, and still the
//! oracle the property tests below compare with) and eventsource-stream
//! both assemble each event whole, so a 15 MiB chunk sat whole in the proxy
//! while a slow server took its time. Here an event's data is held only
//! until it passes [`STREAM_AFTER`] bytes; from then on it leaves in pieces
//! of that size as it arrives, and the proxy sends them as the fragments
//! of one WebSocket message (run.rs):
//!
//! ```text
//! data ≤ 64 KiB at its blank line   Whole(data)
//! data past 64 KiB before it        Begin(64 KiB) More(64 KiB)… End(the rest, 1 to 64 KiB)
//! ```
//!
//! What it reads, and what it does not keep:
//!
//! - a leading byte-order mark is skipped; lines end at `\r\n`, `\r` or
//!   `\n`, and a `\r` and the `\n` after it are one end even when they come
//!   in different reads;
//! - a line that starts with `:` is a comment; otherwise the field name
//!   runs to the first `:` (the whole line if there is none) and one
//!   leading space of the value is dropped;
//! - `data` adds its value and a `\n` to the event's data; every other
//!   field (`event`, `id`, `retry`, unknown names) is skipped as it is read,
//!   never kept, however long its line;
//! - a blank line ends an event: nothing comes out if it had no `data`
//!   line, else its data without the last `\n`; an event the stream leaves
//!   unfinished is dropped (when it had begun to come out, the caller sees
//!   the stream end between a [`Piece::Begin`] and its [`Piece::End`]).
//!
//! Scanning is linear: each byte is looked at once whatever the reads (the
//! runs of a value or a skipped line are found with `memchr`), and a piece
//! is one copy of the bytes it holds.
//!
//! Two guards stand before the parser:
//!
//! ```text
//! HTTP body ──▶ cut at the bound ──▶ cut before bad UTF-8 ──▶ parser ──▶ pieces of each event's data
//!               (max_event bytes      (an error, once the
//!                after the last        bytes before it are
//!                blank line)           parsed)
//! ```
//!
//! The bound counts stream bytes, not data: comments and skipped fields of
//! an event count too, so a stream that never ends an event still breaks.
//! Bytes that are not UTF-8 break the stream (SSE's decoder would replace
//! them, which would change a chunk, and a chunk is JSON). Both cuts hand
//! on the bytes before them first, so every piece of data that came before
//! the bad bytes or within the bound comes out before the error, and the
//! outcome never depends on how the body was split into reads.
//!
//! The data comes out as bytes, unread: the proxy frames it, it never
//! parses it.

use std::pin::Pin;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures_util::stream::Stream;
use runloop_proto::run_loop::{CHUNK, PieceKind};

/// How much of an event's data is held before it starts to come out in
/// pieces: an event whose data fits comes out whole, as one message.
pub(super) const STREAM_AFTER: usize = 64 << 10;

/// Why the event stream broke before its end.
#[derive(Debug, thiserror::Error)]
pub(super) enum Broke {
    /// The HTTP body failed: the connection dropped, a chunked body was cut.
    #[error("the event stream broke")]
    Transport(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The bytes are not UTF-8, as chunk JSON must be (SSE's own decoder
    /// would replace them, which would change a chunk).
    #[error("the event stream is not UTF-8 (bad bytes at offset {0})")]
    Utf8(u64),
    /// An event grew past the proxy's bound before it ended.
    #[error("an event of the stream is larger than {0} bytes")]
    TooLarge(usize),
}

/// What comes out of the stream: an event's data, whole or in pieces.
///
/// From [`Events::poll_tagged`], a piece that opens a message (`Whole`,
/// `Begin`) has the chunk tag `[0]` before its data, in the same buffer:
/// the message is made where the data is read into, not copied behind its
/// tag later. From [`Events::next`], it is the data alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Piece {
    /// The data of an event that ended within [`STREAM_AFTER`] bytes.
    Whole(Bytes),
    /// The first [`STREAM_AFTER`] bytes of a larger event's data.
    Begin(Bytes),
    /// The next [`STREAM_AFTER`] bytes of it.
    More(Bytes),
    /// The rest of it, at most [`STREAM_AFTER`] bytes and never none (a
    /// piece comes out only when more data follows it): the event ended.
    End(Bytes),
}

impl Piece {
    /// The piece without the tag a piece that opens a message has before
    /// its data.
    #[cfg(test)]
    fn untagged(self) -> Piece {
        match self {
            Piece::Whole(mut data) => {
                data.advance(1);
                Piece::Whole(data)
            }
            Piece::Begin(mut data) => {
                data.advance(1);
                Piece::Begin(data)
            }
            more => more,
        }
    }

    /// Which part of its event's data the piece is, and the data.
    pub(super) fn into_parts(self) -> (PieceKind, Bytes) {
        match self {
            Piece::Whole(data) => (PieceKind::Whole, data),
            Piece::Begin(data) => (PieceKind::Begin, data),
            Piece::More(data) => (PieceKind::More, data),
            Piece::End(data) => (PieceKind::End, data),
        }
    }
}

/// The pieces of every event of an HTTP body, in order, read as they are
/// asked for: nothing is read ahead of the caller.
pub(super) struct Events<S> {
    body: Pin<Box<S>>,
    max_event: usize,
    /// What is left of the last read, not yet checked.
    pending: Bytes,
    /// Checked bytes the parser has not consumed yet.
    feeding: Bytes,
    utf8: Utf8Carry,
    /// Bad bytes were found: this comes out once the bytes before them
    /// have been parsed.
    broke: Option<Broke>,
    /// The body ended or failed: nothing more is read from it.
    done: bool,
    parser: Parser,
}

impl<S, E> Events<S>
where
    S: Stream<Item = Result<Bytes, E>>,
    E: std::error::Error + Send + Sync + 'static,
{
    /// Reads `body`, with events bounded at `max_event` stream bytes.
    pub(super) fn new(body: S, max_event: usize) -> Events<S> {
        Events {
            body: Box::pin(body),
            max_event,
            pending: Bytes::new(),
            feeding: Bytes::new(),
            utf8: Utf8Carry::default(),
            broke: None,
            done: false,
            parser: Parser::default(),
        }
    }

    /// The next piece, or why the stream broke; `None` where the body ends.
    /// Cancel-safe: dropped while it waits for the body, it loses nothing.
    #[cfg(test)]
    pub(super) async fn next(&mut self) -> Option<Result<Piece, Broke>> {
        std::future::poll_fn(|cx| self.poll_tagged(cx))
            .await
            .map(|piece| piece.map(Piece::untagged))
    }

    /// The body, as it is read.
    pub(super) fn body(&self) -> &S {
        &self.body
    }

    /// Whether everything read of the body has been parsed.
    pub(super) fn parsed(&self) -> bool {
        self.pending.is_empty() && self.feeding.is_empty() && self.broke.is_none()
    }

    /// The next piece, tagged when it opens a message ([`Piece`]), or why
    /// the stream broke; `None` where the body ends. Pending only while the
    /// body is, and then nothing is lost.
    pub(super) fn poll_tagged(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Piece, Broke>>> {
        use std::task::Poll;
        loop {
            if !self.feeding.is_empty() {
                if let Some(piece) = self.parser.feed(&mut self.feeding) {
                    return Poll::Ready(Some(Ok(piece)));
                }
                continue;
            }
            if let Some(broke) = self.broke.take() {
                self.done = true;
                return Poll::Ready(Some(Err(broke)));
            }
            if self.done {
                return Poll::Ready(None);
            }
            if self.pending.is_empty() {
                match self.body.as_mut().poll_next(cx) {
                    Poll::Ready(Some(Ok(read))) => self.pending = read,
                    Poll::Ready(Some(Err(error))) => {
                        self.done = true;
                        return Poll::Ready(Some(Err(Broke::Transport(Box::new(error)))));
                    }
                    Poll::Ready(None) => {
                        // An event left unfinished is dropped.
                        self.done = true;
                        return Poll::Ready(None);
                    }
                    Poll::Pending => return Poll::Pending,
                }
                continue;
            }
            // The bytes of the event under way, counted from the end of the
            // last blank line; the parser has consumed all it was given.
            let under_way = self.parser.consumed - self.parser.event_start;
            let room = (self.max_event as u64).saturating_sub(under_way);
            if room == 0 {
                self.done = true;
                return Poll::Ready(Some(Err(Broke::TooLarge(self.max_event))));
            }
            let take = usize::try_from(room)
                .map_or(self.pending.len(), |room| room.min(self.pending.len()));
            let mut piece = self.pending.split_to(take);
            let carried = self.utf8.carried();
            if let Err(good) = self.utf8.check(&piece) {
                // Where the bad bytes start, in the stream; they may begin
                // in a character carried from the last piece (which the
                // parser has: it only ever misses an event's end for it).
                let at = self.parser.consumed + good as u64 - carried as u64;
                self.broke = Some(Broke::Utf8(at));
                piece.truncate(good.saturating_sub(carried));
                self.pending = Bytes::new();
            }
            self.feeding = piece;
        }
    }
}

/// The byte-order mark a stream may start with.
const BOM: &[u8] = b"\xEF\xBB\xBF";

/// Where the parser is in a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Line {
    /// At the start of the stream, this many bytes of a byte-order mark in.
    Bom(usize),
    /// At the start of a line.
    Start,
    /// In a field name that is, so far, this many bytes of `data`.
    Name(usize),
    /// Right after `data:`: one space may come, and is dropped.
    DataColon,
    /// In the value of a `data` line.
    Data,
    /// In a line that is skipped to its end: a comment, another field.
    Skip,
}

/// The event stream interpretation, fed bytes and handing out pieces.
#[derive(Debug)]
struct Parser {
    line: Line,
    /// The last byte was a `\r` that ended a line: a `\n` now is part of
    /// that end.
    after_cr: bool,
    /// Data of the event under way that has not come out yet.
    data: BytesMut,
    /// The event under way has a `data` line.
    has_data: bool,
    /// The `\n` the last `data` line adds is still to be added: it is the
    /// one dropped if the event ends now.
    lf_owed: bool,
    /// Part of this event's data has come out ([`Piece::Begin`]).
    streaming: bool,
    /// Bytes consumed since the start of the stream.
    consumed: u64,
    /// Where the event under way began: right after the `\r` or `\n` that
    /// ended the last blank line (the `\n` of a `\r\n` counts towards the
    /// next event, whether or not it came in the same read).
    event_start: u64,
}

impl Default for Parser {
    fn default() -> Parser {
        Parser {
            line: Line::Bom(0),
            after_cr: false,
            data: BytesMut::new(),
            has_data: false,
            lf_owed: false,
            streaming: false,
            consumed: 0,
            event_start: 0,
        }
    }
}

impl Parser {
    /// Consumes `input` up to the next piece that comes out, or all of it.
    fn feed(&mut self, input: &mut Bytes) -> Option<Piece> {
        while let Some(&byte) = input.first() {
            if std::mem::take(&mut self.after_cr) && byte == b'\n' {
                self.consume(input, 1);
                continue;
            }
            match self.line {
                Line::Bom(matched) if byte == BOM[matched] => {
                    self.consume(input, 1);
                    self.line = if matched + 1 == BOM.len() {
                        Line::Start
                    } else {
                        Line::Bom(matched + 1)
                    };
                }
                Line::Bom(0) => self.line = Line::Start,
                // Bytes that began like a mark begin a field name that is
                // not `data` (and are not UTF-8, so the stream breaks).
                Line::Bom(_) => self.line = Line::Skip,
                Line::Start => match byte {
                    b'\r' | b'\n' => {
                        self.end_line(input);
                        self.event_start = self.consumed;
                        if let Some(piece) = self.dispatch() {
                            return Some(piece);
                        }
                    }
                    b':' => self.line = Line::Skip,
                    _ => self.line = Line::Name(0),
                },
                Line::Name(4) if byte == b':' => {
                    self.consume(input, 1);
                    self.has_data = true;
                    self.line = Line::DataColon;
                }
                Line::Name(4) if matches!(byte, b'\r' | b'\n') => {
                    // `data` alone: a data line with an empty value.
                    self.has_data = true;
                    self.line = Line::Data;
                }
                Line::Name(matched) if matched < 4 && byte == b"data"[matched] => {
                    self.consume(input, 1);
                    self.line = Line::Name(matched + 1);
                }
                // Another field: the name may end on this very byte, which
                // is then the colon or the line's end, as skipping reads it.
                Line::Name(_) => self.line = Line::Skip,
                Line::DataColon => {
                    if byte == b' ' {
                        self.consume(input, 1);
                    }
                    self.line = Line::Data;
                }
                Line::Data => {
                    let run = memchr::memchr2(b'\r', b'\n', input).unwrap_or(input.len());
                    if self.lf_owed {
                        // This data line follows another: the `\n` it added
                        // stays.
                        if let Some(piece) = self.spill() {
                            return Some(piece);
                        }
                        self.open(1);
                        self.make_room(1);
                        self.data.put_u8(b'\n');
                        self.lf_owed = false;
                    }
                    if run == 0 {
                        self.lf_owed = true;
                        self.end_line(input);
                        continue;
                    }
                    if let Some(piece) = self.spill() {
                        return Some(piece);
                    }
                    let take = run.min(STREAM_AFTER - self.held());
                    self.open(take);
                    self.make_room(take);
                    self.data.extend_from_slice(&input[..take]);
                    self.consume(input, take);
                }
                Line::Skip => match memchr::memchr2(b'\r', b'\n', input) {
                    Some(0) => self.end_line(input),
                    Some(run) => self.consume(input, run),
                    None => self.consume(input, input.len()),
                },
            }
        }
        None
    }

    fn consume(&mut self, input: &mut Bytes, n: usize) {
        input.advance(n);
        self.consumed += n as u64;
    }

    /// Consumes the `\r` or `\n` that ends a line.
    fn end_line(&mut self, input: &mut Bytes) {
        self.after_cr = input[0] == b'\r';
        self.consume(input, 1);
        self.line = Line::Start;
    }

    /// The tag goes first in the buffer of an event's data (or of its
    /// first piece): with room for `more` bytes after it.
    fn open(&mut self, more: usize) {
        if !self.streaming && self.data.is_empty() {
            self.make_room(1 + more);
            self.data.put_u8(CHUNK);
        }
    }

    /// The bytes of data held, the tag aside.
    fn held(&self) -> usize {
        self.data.len().saturating_sub(usize::from(!self.streaming))
    }

    /// Grows the data's buffer for `more` bytes, doubling it but never past
    /// [`STREAM_AFTER`] and the tag (the buffer's own growth could double
    /// it past that); once an event comes out in pieces, each piece's
    /// buffer is taken at its full size at once.
    fn make_room(&mut self, more: usize) {
        let needed = self.data.len() + more;
        if needed <= self.data.capacity() {
            return;
        }
        let floor = if self.streaming { STREAM_AFTER } else { 0 };
        let capacity = needed
            .max(2 * self.data.capacity())
            .max(floor)
            .min(STREAM_AFTER + usize::from(!self.streaming));
        let mut grown = BytesMut::with_capacity(capacity);
        grown.extend_from_slice(&self.data);
        self.data = grown;
    }

    /// The data held so far, if it is as much as is held: what comes out
    /// before more is added.
    fn spill(&mut self) -> Option<Piece> {
        if self.held() < STREAM_AFTER {
            return None;
        }
        let piece = std::mem::take(&mut self.data).freeze();
        Some(if std::mem::replace(&mut self.streaming, true) {
            Piece::More(piece)
        } else {
            Piece::Begin(piece)
        })
    }

    /// A blank line: the event under way ends.
    fn dispatch(&mut self) -> Option<Piece> {
        if !std::mem::take(&mut self.has_data) {
            return None;
        }
        // The `\n` of the last data line is the one dropped.
        self.lf_owed = false;
        // An event with no data still has its tag.
        self.open(0);
        let data = std::mem::take(&mut self.data).freeze();
        Some(if std::mem::take(&mut self.streaming) {
            Piece::End(data)
        } else {
            Piece::Whole(data)
        })
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

/// The events of `body` put back together from their pieces, with the
/// error last if the stream broke; checks that the pieces come in order
/// (a `Begin`, `More`s, an `End`) and at their sizes.
#[cfg(test)]
async fn assembled<S>(body: S, max_event: usize) -> Vec<Result<Bytes, String>>
where
    S: Stream<Item = Result<Bytes, std::io::Error>>,
{
    let mut events = Events::new(body, max_event);
    let mut out = Vec::new();
    let mut under_way: Option<Vec<u8>> = None;
    while let Some(next) = events.next().await {
        match next {
            Ok(Piece::Whole(data)) => {
                assert!(under_way.is_none(), "a whole event inside another");
                assert!(data.len() <= STREAM_AFTER, "{} bytes whole", data.len());
                out.push(Ok(data));
            }
            Ok(Piece::Begin(data)) => {
                assert!(under_way.is_none(), "an event begun inside another");
                assert_eq!(data.len(), STREAM_AFTER);
                under_way = Some(data.to_vec());
            }
            Ok(Piece::More(data)) => {
                assert_eq!(data.len(), STREAM_AFTER);
                under_way.as_mut().expect("begun").extend_from_slice(&data);
            }
            Ok(Piece::End(data)) => {
                let mut whole = under_way.take().expect("begun");
                whole.extend_from_slice(&data);
                assert!(
                    whole.len() > STREAM_AFTER,
                    "{} bytes in pieces",
                    whole.len()
                );
                out.push(Ok(Bytes::from(whole)));
            }
            Err(broke) => out.push(Err(broke.to_string())),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use futures_util::stream;

    use super::*;

    async fn events(reads: &[&[u8]], max_event: usize) -> Vec<Result<Bytes, String>> {
        let body = stream::iter(
            reads
                .iter()
                .map(|read| Ok::<_, std::io::Error>(Bytes::copy_from_slice(read)))
                .collect::<Vec<_>>(),
        );
        assembled(body, max_event).await
    }

    fn ok(data: &str) -> Result<Bytes, String> {
        Ok(Bytes::copy_from_slice(data.as_bytes()))
    }

    #[test]
    fn a_transport_break_leaves_its_chain_to_the_source() {
        #[derive(Debug, thiserror::Error)]
        #[error("the body failed")]
        struct Body(#[source] std::io::Error);
        let broke = Broke::Transport(Box::new(Body(std::io::Error::other("reset"))));
        assert_eq!(broke.to_string(), "the event stream broke");
        let source = std::error::Error::source(&broke).expect("the transport's error");
        assert_eq!(source.to_string(), "the body failed");
        assert!(source.source().is_some(), "and what is beneath it");
        assert_eq!(
            runloop_proto::error_chain::Chain(&broke).to_string(),
            "the event stream broke: the body failed: reset"
        );
        runloop_testkit::errors::assert_cause_said_once(&broke);
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
    use futures_util::stream;
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

    /// What the SSE rules make of a body: for each block, where it ended
    /// (right after the first byte of its blank line: the bound counts from
    /// there) and its data, if it has any (else it dispatches nothing).
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

    /// Writes one line; returns its data, if it is a data line.
    fn push_line(bytes: &mut Vec<u8>, line: &Line, eol: Eol) -> Option<String> {
        let (text, data) = match line {
            Line::Data { space, text } => {
                let written = format!("data:{}{text}", if *space { " " } else { "" });
                let value = if *space {
                    text.clone()
                } else {
                    text.strip_prefix(' ').unwrap_or(text).to_owned()
                };
                (written, Some(value))
            }
            Line::BareData => ("data".to_owned(), Some(String::new())),
            Line::Event => ("event: named".to_owned(), None),
            Line::Unknown => ("note: ignored".to_owned(), None),
            Line::Comment(text) => (format!(":{text}"), None),
        };
        bytes.extend_from_slice(text.as_bytes());
        push_eol(bytes, eol);
        data
    }

    impl Body {
        fn expected(&self) -> Expected {
            let mut bytes = Vec::new();
            if self.bom {
                bytes.extend_from_slice(b"\xEF\xBB\xBF");
            }
            let mut events = Vec::new();
            // The last line end written, whichever line or blank line it
            // ended: an empty block's blank line follows the one before.
            let mut last_eol = None;
            for (block, blank) in self.blocks.iter().zip(&self.blank_eols) {
                let mut data: Option<String> = None;
                for (line, eol) in block {
                    let line_data = push_line(&mut bytes, line, *eol);
                    if let Some(line_data) = line_data {
                        data = Some(match data {
                            None => line_data,
                            Some(before) => format!("{before}\n{line_data}"),
                        });
                    }
                    last_eol = Some(*eol);
                }
                // A lone CR followed by a blank line's LF would be one CRLF,
                // not a blank line: the blank line ends with CR then.
                let blank = match (last_eol, blank) {
                    (Some(Eol::Cr), Eol::Lf) => Eol::Cr,
                    (_, blank) => *blank,
                };
                push_eol(&mut bytes, blank);
                last_eol = Some(blank);
                let end = bytes.len() - usize::from(matches!(blank, Eol::CrLf));
                events.push((end, data));
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
            reads.push(Ok::<_, std::io::Error>(Bytes::copy_from_slice(
                &bytes[start..cut],
            )));
            start = cut;
        }
        assembled(stream::iter(reads), max_event)
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

/// Large events: when they come out in pieces, what the reader holds, and
/// that they come out as sse-stream (the parser used before, kept as a
/// dev-dependency for this) reads the same stream, in any reads.
#[cfg(test)]
mod pieces {
    use futures_util::FutureExt;
    use futures_util::StreamExt;
    use futures_util::stream;
    use proptest::prelude::*;

    use super::*;

    /// `bytes` read `size` bytes at a time.
    fn reads(bytes: &[u8], size: usize) -> Vec<Result<Bytes, std::io::Error>> {
        bytes
            .chunks(size.max(1))
            .map(|read| Ok(Bytes::copy_from_slice(read)))
            .collect()
    }

    fn pieces(bytes: &[u8], size: usize) -> Vec<Piece> {
        let mut events = Events::new(stream::iter(reads(bytes, size)), 64 << 20);
        let mut out = Vec::new();
        while let Some(next) = events.next().now_or_never().expect("all there") {
            out.push(next.expect("no fault"));
        }
        out
    }

    fn event(data: &[u8]) -> Vec<u8> {
        [b"data: ", data, b"\n\n"].concat()
    }

    #[test]
    fn an_event_of_stream_after_bytes_is_whole_and_one_more_is_in_pieces() {
        let data = vec![b'a'; STREAM_AFTER];
        assert_eq!(
            pieces(&event(&data), 1000),
            [Piece::Whole(Bytes::from(data.clone()))]
        );
        let more = [data.as_slice(), b"b"].concat();
        assert_eq!(
            pieces(&event(&more), 1000),
            [
                Piece::Begin(Bytes::from(data)),
                Piece::End(Bytes::from_static(b"b"))
            ]
        );
    }

    #[test]
    fn a_piece_comes_out_only_once_more_data_follows_it() {
        // Twice the size: the second half is the end, not a `More` and an
        // empty end.
        let data = vec![b'a'; 2 * STREAM_AFTER];
        assert_eq!(
            pieces(&event(&data), 4096),
            [
                Piece::Begin(Bytes::from(data[..STREAM_AFTER].to_vec())),
                Piece::End(Bytes::from(data[STREAM_AFTER..].to_vec())),
            ]
        );
    }

    #[test]
    fn the_line_feed_between_data_lines_may_open_a_piece_and_the_last_is_dropped() {
        // The first line fills a piece exactly: the `\n` that joins it to
        // the second is the next piece's first byte.
        let first = vec![b'a'; STREAM_AFTER];
        let body = [b"data:", first.as_slice(), b"\r\ndata: b\r\n\r\n"].concat();
        for size in [1, 7, body.len()] {
            assert_eq!(
                pieces(&body, size),
                [
                    Piece::Begin(Bytes::from(first.clone())),
                    Piece::End(Bytes::from_static(b"\nb")),
                ],
                "reads of {size}"
            );
        }
    }

    #[test]
    fn fields_other_than_data_are_not_kept_however_long() {
        let long = vec![b'x'; 4 * STREAM_AFTER];
        let body = [
            b"event: ",
            long.as_slice(),
            b"\nid: ",
            &long,
            b"\n:",
            &long,
            b"\ndata: 1\n\n",
        ]
        .concat();
        let mut events = Events::new(stream::iter(reads(&body, 1000)), 64 << 20);
        let mut held = 0;
        while let Some(next) = events.next().now_or_never().expect("all there") {
            assert_eq!(
                next.expect("no fault"),
                Piece::Whole(Bytes::from_static(b"1"))
            );
            held = held.max(events.parser.data.capacity());
        }
        assert!(held < 64, "{held} bytes held for a one-byte event");
    }

    #[test]
    fn a_large_event_is_held_a_piece_and_a_read_at_a_time() {
        // 6 MiB of data in reads of 1000 bytes, joined from two lines.
        let line = vec![b'a'; 3 << 20];
        let body = [b"data: ", line.as_slice(), b"\ndata: ", &line, b"\n\n"].concat();
        let mut events = Events::new(stream::iter(reads(&body, 1000)), 64 << 20);
        let (mut count, mut total) = (0, 0);
        while let Some(next) = events.next().now_or_never().expect("all there") {
            let (Piece::Begin(data) | Piece::More(data) | Piece::End(data)) =
                next.expect("no fault")
            else {
                panic!("a 6 MiB event came out whole");
            };
            assert!(data.len() <= STREAM_AFTER);
            // What the reader holds besides: at most one piece's buffer and
            // the rest of one read.
            assert!(events.parser.data.capacity() <= STREAM_AFTER);
            assert!(events.pending.len() + events.feeding.len() <= 1000);
            count += 1;
            total += data.len();
        }
        assert_eq!(total, 2 * line.len() + 1);
        assert_eq!(count, total.div_ceil(STREAM_AFTER));
    }

    #[tokio::test]
    async fn a_stream_that_ends_or_breaks_mid_event_leaves_its_pieces_unended() {
        let data = vec![b'a'; STREAM_AFTER + 10];
        let body = [b"data: ", data.as_slice()].concat();
        let mut events = Events::new(stream::iter(reads(&body, 4096)), 64 << 20);
        assert!(matches!(events.next().await, Some(Ok(Piece::Begin(_)))));
        assert!(
            events.next().await.is_none(),
            "an unfinished event is dropped"
        );

        let body = [b"data: ", data.as_slice(), b"\xff\n\n"].concat();
        let mut events = Events::new(stream::iter(reads(&body, 4096)), 64 << 20);
        assert!(matches!(events.next().await, Some(Ok(Piece::Begin(_)))));
        let at = body.len() as u64 - 3;
        assert!(matches!(events.next().await, Some(Err(Broke::Utf8(offset))) if offset == at));
        assert!(events.next().await.is_none());

        let mut events = Events::new(stream::iter(reads(&body, 4096)), STREAM_AFTER + 8);
        assert!(matches!(events.next().await, Some(Ok(Piece::Begin(_)))));
        assert!(matches!(
            events.next().await,
            Some(Err(Broke::TooLarge(bound))) if bound == STREAM_AFTER + 8
        ));
    }

    /// A line of the oracle's streams.
    #[derive(Debug, Clone)]
    enum Line {
        /// `data`, a colon or none, the value.
        Data { colon: bool, value: String },
        /// Another field, known or not, and its value.
        Field { name: &'static str, value: String },
        /// `:` and a comment.
        Comment(String),
        /// A blank line: the end of an event.
        Blank,
    }

    fn value() -> impl Strategy<Value = String> {
        prop_oneof![
            8 => "[ a-z0-9:{}\"é€😀\u{feff}]{0,12}",
            1 => (1usize..200_000, "[ a:é]").prop_map(|(n, c)| c.repeat(n)),
        ]
    }

    fn line() -> impl Strategy<Value = Line> {
        let name = prop::sample::select(vec!["event", "id", "retry", "note", "", "dat", "datas"]);
        prop_oneof![
            6 => (any::<bool>(), value()).prop_map(|(colon, value)| Line::Data {
                colon,
                value: if colon { value } else { String::new() },
            }),
            2 => (name, value()).prop_map(|(name, value)| Line::Field { name, value }),
            2 => value().prop_map(Line::Comment),
            3 => Just(Line::Blank),
        ]
    }

    fn body() -> impl Strategy<Value = Vec<u8>> {
        let eol = prop::sample::select(vec!["\n", "\r", "\r\n"]);
        (any::<bool>(), prop::collection::vec((line(), eol), 0..24)).prop_map(|(bom, lines)| {
            let mut bytes = Vec::new();
            if bom {
                bytes.extend_from_slice("\u{feff}".as_bytes());
            }
            for (line, eol) in lines {
                let text = match line {
                    Line::Data { colon: true, value } => format!("data:{value}"),
                    Line::Data { colon: false, .. } => "data".to_owned(),
                    Line::Field { name, value } => format!("{name}:{value}"),
                    Line::Comment(text) => format!(":{text}"),
                    Line::Blank => String::new(),
                };
                bytes.extend_from_slice(text.as_bytes());
                bytes.extend_from_slice(eol.as_bytes());
            }
            bytes
        })
    }

    /// The data of every event sse-stream reads in `bytes`.
    fn oracle(bytes: &[u8]) -> Vec<Result<Bytes, String>> {
        let reads = [Ok::<_, std::io::Error>(Bytes::copy_from_slice(bytes))];
        sse_stream::SseByteStream::new(stream::iter(reads))
            .collect::<Vec<_>>()
            .now_or_never()
            .expect("all there")
            .into_iter()
            .filter_map(|event| {
                let event = event.expect("sse-stream reads it");
                event.data.map(|data| Ok(Bytes::from(data)))
            })
            .collect()
    }

    /// `bytes` read in the pieces `cuts` makes.
    fn cut(bytes: &[u8], cuts: &[usize]) -> Vec<Result<Bytes, std::io::Error>> {
        let mut cuts = cuts.to_vec();
        cuts.sort_unstable();
        let mut out = Vec::new();
        let mut start = 0;
        for cut in cuts.into_iter().chain([bytes.len()]) {
            out.push(Ok(Bytes::copy_from_slice(&bytes[start..cut])));
            start = cut;
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Whatever the stream and its reads, the events the pieces make are
        /// the ones sse-stream assembles.
        #[test]
        fn the_events_the_pieces_make_are_the_ones_sse_stream_reads(
            bytes in body(),
            random in prop::collection::vec(any::<prop::sample::Index>(), 0..16),
            size in 1usize..10_000,
        ) {
            let expected = oracle(&bytes);
            let random: Vec<usize> = random.iter().map(|i| i.index(bytes.len() + 1)).collect();
            for (how, reads) in [
                ("whole", cut(&bytes, &[])),
                ("cut at random", cut(&bytes, &random)),
                ("in reads of a size", reads(&bytes, size)),
            ] {
                let got = assembled(stream::iter(reads), 64 << 20)
                    .now_or_never()
                    .expect("all there");
                prop_assert_eq!(&got, &expected, "read {}", how);
            }
        }
    }
}
