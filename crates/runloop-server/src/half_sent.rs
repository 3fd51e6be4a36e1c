//! Half-sent messages: the bytes of a caller's message that has begun and
//! not ended, counted as they arrive, claimed on the memory budgets, and
//! held to an idle deadline (protocol §12, "memory a tenant pays for
//! includes what it has half sent").
//!
//! The WebSocket layer keeps a message's bytes until its last frame has
//! come: a caller that sends all but the end of a large message, and
//! stops, has the server hold it for as long as the connection lives. So
//! a connection's socket is read through [`Metered`], which follows the
//! WebSocket frames as the bytes go by — the upgrade request up to its
//! blank line, then each frame's header, and its payload skipped by
//! length — and so knows, after every read, how many bytes belong to a
//! message begun and not ended ([`Frames`]). It reads nothing else of
//! them, copies nothing, and costs a header's parse per frame: a message
//! read whole in one read never holds a claim at all.
//!
//! Once the connection has authorized ([`Meter::authorized`]), those bytes
//! are a claim on its tenant's memory share and the server's memory
//! budget ([`HalfSent`]), grown as the message grows and given back when
//! it ends (or the connection does). A message that does not fit fails
//! the read ([`Refused`], naming the limit): the connection is closed. A
//! message that makes no progress for the message-idle deadline fails it
//! too ([`Refused::Idle`]). The deadline runs only while the server waits
//! for the caller's bytes: a server that is not reading (its caller is not
//! reading its answers) does not blame the caller for it.
//!
//! Before authorization the bytes are bounded by the admission's
//! allowance, and the authorization grace is the deadline; nothing is
//! claimed then.
//!
//! ```text
//! socket ─▶ Bounded (before authorization) ─▶ Metered ─▶ Laned ─▶ WebSocket
//!                                              │ frames followed, open bytes counted
//!                                              └▶ HalfSent claim on the ledger, idle deadline
//! ```

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, ReadBuf};
use tokio::time::{Instant, Sleep};

use super::budget::{HalfSent, Ledger, OverMemory};
use super::identity::Identity;

/// Where a connection's stream of WebSocket frames is, read as it goes
/// by; how many bytes belong to a data message begun and not ended.
#[derive(Debug)]
pub(crate) struct Frames {
    state: State,
    /// Whether a data message has begun and not ended.
    in_message: bool,
    /// Its bytes so far, headers included (and any control frame between
    /// its fragments).
    open: u64,
}

#[derive(Debug)]
enum State {
    /// In the HTTP upgrade request: how much of its end (`\r\n\r\n`) the
    /// last bytes were.
    Request { matched: u8 },
    /// In a frame's header: its bytes so far.
    Header {
        bytes: [u8; MAX_HEADER],
        have: usize,
    },
    /// In a frame's payload: how much of it is left, and whether the
    /// frame ends a data message.
    Payload { left: u64, ends_message: bool },
}

/// The longest frame header: 2 bytes, an 8-byte length, a 4-byte mask.
const MAX_HEADER: usize = 14;

impl Default for Frames {
    fn default() -> Self {
        Frames {
            state: State::Request { matched: 0 },
            in_message: false,
            open: 0,
        }
    }
}

impl Frames {
    /// Bytes of the data message begun and not ended (0 when none is).
    pub(crate) fn open(&self) -> u64 {
        if self.in_message { self.open } else { 0 }
    }

    /// Follows `bytes`, the next ones read from the socket.
    pub(crate) fn read(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            match &mut self.state {
                State::Request { matched } => {
                    let mut used = bytes.len();
                    for (at, byte) in bytes.iter().enumerate() {
                        *matched = match (*matched, *byte) {
                            (0 | 2, b'\r') => *matched + 1,
                            (1 | 3, b'\n') => *matched + 1,
                            (_, b'\r') => 1,
                            _ => 0,
                        };
                        if *matched == 4 {
                            used = at + 1;
                            self.state = State::Header {
                                bytes: [0; MAX_HEADER],
                                have: 0,
                            };
                            break;
                        }
                    }
                    bytes = &bytes[used..];
                }
                State::Header {
                    bytes: header,
                    have,
                } => {
                    let needed = if *have < 2 {
                        2
                    } else {
                        header_length(header[1])
                    };
                    let take = (needed - *have).min(bytes.len());
                    header[*have..*have + take].copy_from_slice(&bytes[..take]);
                    *have += take;
                    bytes = &bytes[take..];
                    if *have >= 2 && *have == header_length(header[1]) {
                        let length = *have;
                        let (fin, opcode, payload) = parse(&header[..length]);
                        self.header_read(length as u64, fin, opcode, payload);
                    }
                }
                State::Payload { left, ends_message } => {
                    let take = (*left).min(bytes.len() as u64);
                    *left -= take;
                    let ends = *ends_message && *left == 0;
                    let done = *left == 0;
                    if self.in_message {
                        self.open = self.open.saturating_add(take);
                    }
                    // `take` fits in `bytes.len()`.
                    bytes = &bytes[take as usize..];
                    if done {
                        self.frame_read(ends);
                    }
                }
            }
        }
    }

    /// A frame's header of `length` bytes was read: FIN, the opcode, the
    /// payload's length.
    fn header_read(&mut self, length: u64, fin: bool, opcode: u8, payload: u64) {
        // Control frames (close, ping, pong: opcodes 8 and up) neither
        // begin nor end a message.
        let data = opcode < 8;
        if data && !self.in_message {
            self.in_message = true;
            self.open = 0;
        }
        if self.in_message {
            self.open = self.open.saturating_add(length);
        }
        let ends_message = data && fin;
        if payload == 0 {
            self.frame_read(ends_message);
        } else {
            self.state = State::Payload {
                left: payload,
                ends_message,
            };
        }
    }

    /// A frame was read to its end; `ends` when it ended a message.
    fn frame_read(&mut self, ends: bool) {
        if ends {
            self.in_message = false;
            self.open = 0;
        }
        self.state = State::Header {
            bytes: [0; MAX_HEADER],
            have: 0,
        };
    }
}

/// The length of a frame's header, from its second byte (RFC 6455,
/// section 5.2): 2, the extended length's 2 or 8, the mask's 4.
fn header_length(second: u8) -> usize {
    let extended = match second & 0x7f {
        126 => 2,
        127 => 8,
        _ => 0,
    };
    let mask = if second & 0x80 != 0 { 4 } else { 0 };
    2 + extended + mask
}

/// A whole header's FIN, opcode and payload length.
fn parse(header: &[u8]) -> (bool, u8, u64) {
    let fin = header[0] & 0x80 != 0;
    let opcode = header[0] & 0x0f;
    let payload = match header[1] & 0x7f {
        126 => u64::from(u16::from_be_bytes([header[2], header[3]])),
        127 => {
            let mut length = [0; 8];
            length.copy_from_slice(&header[2..10]);
            u64::from_be_bytes(length)
        }
        short => u64::from(short),
    };
    (fin, opcode, payload)
}

/// Why a read of an authorized connection failed here: the connection
/// is closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refused {
    /// The half-sent message does not fit a memory budget.
    #[error(transparent)]
    Memory(#[from] OverMemory),
    /// It made no progress for the message-idle deadline.
    #[error(
        "a half-sent message of {bytes} bytes made no progress for message-idle-timeout ({idle:?})"
    )]
    Idle {
        /// Its bytes so far.
        bytes: u64,
        /// The deadline.
        idle: Duration,
    },
}

impl Refused {
    /// This error, if `error` is one.
    pub(crate) fn of(error: &io::Error) -> Option<&Refused> {
        error.get_ref().and_then(|inner| inner.downcast_ref())
    }
}

/// Whom a connection's half-sent bytes are claimed for, once it has
/// authorized.
#[derive(Debug)]
struct Payer {
    ledger: Arc<Ledger>,
    identity: Identity,
    idle: Duration,
}

/// The connection's end of its [`Metered`] socket: installs the payer
/// once it has authorized.
#[derive(Debug, Clone)]
pub(crate) struct Meter(Arc<OnceLock<Payer>>);

impl Meter {
    /// The connection authorized as `identity`: its half-sent bytes are
    /// claimed on `ledger` from now on, and held to `idle`.
    pub(crate) fn authorized(&self, ledger: &Arc<Ledger>, identity: &Identity, idle: Duration) {
        let _ = self.0.set(Payer {
            ledger: Arc::clone(ledger),
            identity: identity.clone(),
            idle,
        });
    }
}

/// A connection's socket, read with its half-sent message counted (see the
/// module's docs); written straight through.
pub(crate) struct Metered<S> {
    io: S,
    frames: Frames,
    payer: Arc<OnceLock<Payer>>,
    /// The claim, once the connection has authorized and a message was
    /// left open by a read.
    claim: Option<HalfSent>,
    /// When the open message last grew.
    progress: Instant,
    /// Its idle deadline, armed while the server waits on an open message.
    idle: Option<Pin<Box<Sleep>>>,
}

impl<S> Metered<S> {
    /// `io`, metered; and the meter's handle.
    pub(crate) fn new(io: S) -> (Metered<S>, Meter) {
        let payer = Arc::new(OnceLock::new());
        (
            Metered {
                io,
                frames: Frames::default(),
                payer: Arc::clone(&payer),
                claim: None,
                progress: Instant::now(),
                idle: None,
            },
            Meter(payer),
        )
    }

    /// After a read (`progressed`: one that brought bytes), or before the
    /// server waits for more: the claim follows the open message, grown or
    /// given back; the error when it does not fit. (Bytes read before the
    /// connection authorized are claimed here as soon as it has.)
    fn settle(&mut self, progressed: bool) -> Result<(), Refused> {
        let open = self.frames.open();
        if open == 0 {
            if let Some(claim) = &mut self.claim {
                claim.clear();
            }
            return Ok(());
        }
        if progressed {
            self.progress = Instant::now();
        }
        let Some(payer) = self.payer.get() else {
            return Ok(());
        };
        let claim = self
            .claim
            .get_or_insert_with(|| payer.ledger.half_sent_by(&payer.identity));
        if open > claim.held() {
            claim.grow(open)?;
        }
        Ok(())
    }

    /// While the server waits on an open message: whether its idle
    /// deadline has passed (else it wakes `cx` when it does).
    fn idle(&mut self, cx: &mut Context<'_>) -> Option<Refused> {
        let open = self.frames.open();
        let payer = self.payer.get()?;
        if open == 0 {
            return None;
        }
        let deadline = self.progress + payer.idle;
        let sleep = self
            .idle
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if sleep.deadline() != deadline {
            sleep.as_mut().reset(deadline);
        }
        sleep.as_mut().poll(cx).is_ready().then_some(Refused::Idle {
            bytes: open,
            idle: payer.idle,
        })
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Metered<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let read = &buf.filled()[before..];
                if read.is_empty() {
                    return Poll::Ready(Ok(()));
                }
                this.frames.read(read);
                if let Err(refused) = this.settle(true) {
                    return Poll::Ready(Err(io::Error::other(refused)));
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => {
                if let Err(refused) = this.settle(false) {
                    return Poll::Ready(Err(io::Error::other(refused)));
                }
                match this.idle(cx) {
                    Some(refused) => {
                        Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, refused)))
                    }
                    None => Poll::Pending,
                }
            }
            failed => failed,
        }
    }
}

super::writes_through::writes_through!(Metered, io);

#[cfg(test)]
mod tests {
    use super::*;

    const REQUEST: &[u8] = b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n\r\n";

    /// A masked client frame: FIN or not, the opcode, `payload` bytes.
    fn frame(fin: bool, opcode: u8, payload: usize) -> Vec<u8> {
        let mut bytes = vec![if fin { 0x80 } else { 0 } | opcode];
        match payload {
            0..=125 => bytes.push(0x80 | payload as u8),
            126..=0xffff => {
                bytes.push(0x80 | 126);
                bytes.extend_from_slice(&(payload as u16).to_be_bytes());
            }
            _ => {
                bytes.push(0x80 | 127);
                bytes.extend_from_slice(&(payload as u64).to_be_bytes());
            }
        }
        bytes.extend_from_slice(&[1, 2, 3, 4]);
        bytes.resize(bytes.len() + payload, 7);
        bytes
    }

    #[test]
    fn whole_messages_leave_nothing_open_however_they_are_cut() {
        let mut stream = REQUEST.to_vec();
        for (fin, opcode, size) in [
            (true, 2, 10),
            (true, 2, 0),
            (true, 2, 300),
            (true, 9, 4),
            (false, 2, 70_000),
            (true, 10, 0),
            (false, 0, 5),
            (true, 0, 126),
            (true, 2, 125),
        ] {
            stream.extend(frame(fin, opcode, size));
        }
        // Every cut into two reads, and a byte at a time.
        for cut in 0..stream.len() {
            let mut frames = Frames::default();
            frames.read(&stream[..cut]);
            frames.read(&stream[cut..]);
            assert_eq!(frames.open(), 0, "cut at {cut}");
        }
        let mut frames = Frames::default();
        for byte in &stream {
            frames.read(std::slice::from_ref(byte));
        }
        assert_eq!(frames.open(), 0);
    }

    #[test]
    fn a_message_begun_counts_its_bytes_until_its_last_frame() {
        let mut frames = Frames::default();
        frames.read(REQUEST);
        assert_eq!(frames.open(), 0, "the request is no message");
        let big = frame(true, 2, 100_000);
        frames.read(&big[..50_000]);
        assert_eq!(frames.open(), 50_000);
        frames.read(&big[50_000..99_000]);
        assert_eq!(frames.open(), 99_000);
        frames.read(&big[99_000..]);
        assert_eq!(frames.open(), 0);
        // Fragments, with a ping between them: open from the first byte
        // of the first fragment to the last of the last.
        let first = frame(false, 2, 1000);
        let ping = frame(true, 9, 3);
        let last = frame(true, 0, 1000);
        frames.read(&first);
        assert_eq!(frames.open(), first.len() as u64);
        frames.read(&ping);
        assert_eq!(frames.open(), (first.len() + ping.len()) as u64);
        frames.read(&last[..10]);
        assert_eq!(frames.open(), (first.len() + ping.len() + 10) as u64);
        frames.read(&last[10..]);
        assert_eq!(frames.open(), 0);
        // A ping alone begins nothing.
        frames.read(&ping[..4]);
        assert_eq!(frames.open(), 0);
        frames.read(&ping[4..]);
        // A whole message, then the start of the next, in one read.
        let mut two = frame(true, 2, 10);
        two.extend(&frame(true, 2, 500)[..100]);
        frames.read(&two);
        assert_eq!(frames.open(), 100);
    }

    #[test]
    fn lengths_past_any_buffer_do_not_overflow() {
        let mut frames = Frames::default();
        frames.read(REQUEST);
        let mut header = vec![0x82, 0x80 | 127];
        header.extend_from_slice(&u64::MAX.to_be_bytes());
        header.extend_from_slice(&[0; 4]);
        frames.read(&header);
        frames.read(&[0; 1000]);
        assert_eq!(frames.open(), 1014);
    }
}
