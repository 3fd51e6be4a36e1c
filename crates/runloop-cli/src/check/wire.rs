//! A raw frame connection: the check's own view of the wire, where it can
//! send what a well-behaved client never would and see every server frame
//! exactly as it came.
//!
//! The library's client hides both on purpose (it never sends a malformed
//! frame, and it disregards a server's stray frames), so the cases that
//! judge the server speak through this instead. Every wait here is bounded:
//! a server that says nothing yields [`Next::Silent`], which a case turns
//! into a failure that names the wait, never a hang.
//!
//! Whether a frame was disregarded cannot be seen directly, since the
//! protocol acknowledges nothing. So after such a frame a case sends a
//! **probe** — a request with an endpoint tag no server serves, on a fresh
//! scope, which every server must answer with a bare finish (protocol §4) —
//! and requires that bare finish to be the very next frame: anything the
//! disregarded frame provoked would come before it, and a connection it
//! closed would not answer at all.
//!
//! ```text
//! probe      [1][fresh scope][0] [200]       → the very next frame: [3][fresh scope][0]
//! run probe  [4][run scope][fresh channel] [200]
//!                                           → the very next frame: [6][run scope][that channel]
//! ```

use std::fmt;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use runloop::tls::ClientTls;
use runloop::transport::{self, ClientStream};
use runloop_proto::Decode;
use runloop_proto::agents_run::RunResponse;
use runloop_proto::error_chain::Chain;
use runloop_proto::frame::{self, ClientFrame, ServerFrame};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

use super::{Checked, Verdict, seconds};
use crate::dial::DialError;

/// An endpoint tag and a channel tag no server serves: the probes' requests,
/// and the "unknown tag" of the cases. A bare `[200]` does not decode as
/// any request either, so even a server that one day defines tag 200 must
/// answer it with a bare finish.
pub(super) const UNKNOWN_TAG: u8 = 200;

/// How many bytes of a payload a description shows.
const SHOWN: usize = 120;

/// One server frame, owned, or a message that is not one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Frame {
    /// Type 0.
    Authorization,
    /// Type 2.
    Response { scope: u32, payload: Vec<u8> },
    /// Type 3.
    Finish { scope: u32 },
    /// Type 4, a channel the server opens.
    ChannelRequest { scope: u32, channel: u32 },
    /// Type 5.
    ChannelResponse {
        scope: u32,
        channel: u32,
        payload: Vec<u8>,
    },
    /// Type 6.
    ChannelFinish { scope: u32, channel: u32 },
    /// A binary message that is not a frame a server may send.
    Malformed(String),
}

impl Frame {
    fn read(message: &[u8]) -> Frame {
        match ServerFrame::decode(message) {
            Ok(ServerFrame::Authorization { .. }) => Frame::Authorization,
            Ok(ServerFrame::Response { scope, payload }) => Frame::Response {
                scope,
                payload: payload.to_vec(),
            },
            Ok(ServerFrame::ResponseFinish { scope }) => Frame::Finish { scope },
            Ok(ServerFrame::ChannelRequest { scope, channel, .. }) => {
                Frame::ChannelRequest { scope, channel }
            }
            Ok(ServerFrame::ChannelResponse {
                scope,
                channel,
                payload,
            }) => Frame::ChannelResponse {
                scope,
                channel,
                payload: payload.to_vec(),
            },
            Ok(ServerFrame::ChannelResponseFinish { scope, channel }) => {
                Frame::ChannelFinish { scope, channel }
            }
            Err(error) => Frame::Malformed(error.to_string()),
        }
    }
}

impl fmt::Display for Frame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Frame::Authorization => f.write_str("an authorization frame"),
            Frame::Response { scope, payload } => {
                write!(f, "a response on scope {scope}: {}", show(payload))
            }
            Frame::Finish { scope } => write!(f, "the finish of scope {scope}"),
            Frame::ChannelRequest { scope, channel } => {
                write!(
                    f,
                    "a channel request of the server's on scope {scope}, channel {channel}"
                )
            }
            Frame::ChannelResponse {
                scope,
                channel,
                payload,
            } => write!(
                f,
                "a response on channel {channel} of scope {scope}: {}",
                show(payload)
            ),
            Frame::ChannelFinish { scope, channel } => {
                write!(f, "the finish of channel {channel} of scope {scope}")
            }
            Frame::Malformed(why) => write!(f, "a malformed frame ({why})"),
        }
    }
}

/// A payload for a person: its tag byte, then the rest as text, cut short.
pub(super) fn show(payload: &[u8]) -> String {
    let Some((tag, rest)) = payload.split_first() else {
        return "(empty)".to_owned();
    };
    let text = String::from_utf8_lossy(rest);
    let mut shown: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(SHOWN)
        .collect();
    if text.chars().count() > SHOWN {
        shown.push('…');
    }
    format!("[{tag}]{shown}")
}

/// What came next on the connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Next {
    /// A binary message.
    Frame(Frame),
    /// The connection ended; how.
    Closed(String),
    /// Nothing within this long.
    Silent(Duration),
}

impl fmt::Display for Next {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Next::Frame(frame) => frame.fmt(f),
            Next::Closed(how) => f.write_str(how),
            Next::Silent(wait) => write!(f, "nothing within {}", seconds(*wait)),
        }
    }
}

/// How a run request was answered, when it was answered by the rules.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum RunAnswer {
    /// `[0]{"id"}` first: the run is open.
    Id(String),
    /// `[1]` error, then the finish: refused.
    Refused(runloop_proto::ErrorValue),
}

/// One WebSocket connection, spoken frame by frame.
pub(super) struct Wire {
    ws: WebSocketStream<ClientStream>,
    /// How long any one wait lasts.
    timeout: Duration,
    next_scope: u32,
    next_channel: u32,
}

impl Wire {
    /// Opens a WebSocket to `url` (`wss://` trusting `tls`), sending nothing.
    pub(super) async fn dial(
        url: &str,
        tls: Option<&ClientTls>,
        timeout: Duration,
    ) -> Result<Wire, DialError> {
        let dial = transport::dial(url, tls, WebSocketConfig::default());
        let (ws, _response) = match tokio::time::timeout(timeout, dial).await {
            Ok(dialled) => dialled.map_err(|error| DialError::transport(url, error))?,
            Err(_) => {
                return Err(DialError::Timeout {
                    url: url.to_owned(),
                    what: "no WebSocket handshake",
                    after: timeout,
                    option: "--timeout",
                });
            }
        };
        Ok(Wire {
            ws,
            timeout,
            next_scope: 1,
            next_channel: 1,
        })
    }

    /// Closes the connection, waiting at most the timeout for the close to go.
    pub(super) async fn close(mut self) {
        let _ = tokio::time::timeout(self.timeout, self.ws.close(None)).await;
    }

    /// A scope number this connection has not used yet.
    pub(super) fn fresh_scope(&mut self) -> u32 {
        let scope = self.next_scope;
        self.next_scope = self.next_scope.wrapping_add(1);
        scope
    }

    /// A channel number this connection has not used yet (in any scope).
    pub(super) fn fresh_channel(&mut self) -> u32 {
        let channel = self.next_channel;
        self.next_channel = self.next_channel.wrapping_add(1);
        channel
    }

    /// Sends one binary message as it is.
    pub(super) async fn send(&mut self, message: Vec<u8>) -> Checked<()> {
        self.send_message(Message::Binary(message.into())).await
    }

    /// Sends one text message.
    pub(super) async fn send_text(&mut self, text: String) -> Checked<()> {
        self.send_message(Message::Text(text.into())).await
    }

    /// Sends a message; a server that stopped reading cannot hold it forever.
    async fn send_message(&mut self, message: Message) -> Checked<()> {
        match tokio::time::timeout(self.timeout, self.ws.send(message)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => Err(Verdict::Fail(format!("cannot send: {error}"))),
            Err(_) => Err(Verdict::Fail(format!(
                "cannot send: the server took nothing for {}",
                seconds(self.timeout)
            ))),
        }
    }

    /// Sends one client frame.
    pub(super) async fn send_frame(&mut self, frame: &ClientFrame<'_>) -> Checked<()> {
        self.send(frame::to_message(frame)).await
    }

    /// Sends a type-0 frame with `payload` (mode byte first).
    pub(super) async fn authorize(&mut self, payload: &[u8]) -> Checked<()> {
        self.send_frame(&ClientFrame::Authorization { payload })
            .await
    }

    /// Sends a type-1 request opening `scope`.
    pub(super) async fn request(&mut self, scope: u32, payload: &[u8]) -> Checked<()> {
        self.send_frame(&ClientFrame::Request { scope, payload })
            .await
    }

    /// Sends a type-4 request opening the client's `channel` in `scope`.
    pub(super) async fn channel_request(
        &mut self,
        scope: u32,
        channel: u32,
        payload: &[u8],
    ) -> Checked<()> {
        self.send_frame(&ClientFrame::ChannelRequest {
            scope,
            channel,
            payload,
        })
        .await
    }

    /// The next message, waiting at most the timeout.
    pub(super) async fn next(&mut self) -> Next {
        self.next_within(self.timeout).await
    }

    /// The next message, waiting at most `wait`. Text and control messages
    /// carry nothing (protocol §1) and are skipped.
    pub(super) async fn next_within(&mut self, wait: Duration) -> Next {
        let read = async {
            loop {
                match self.ws.next().await {
                    Some(Ok(Message::Binary(message))) => {
                        return Next::Frame(Frame::read(&message));
                    }
                    Some(Ok(Message::Close(Some(close)))) => {
                        return Next::Closed(format!(
                            "the server closed the connection (close code {})",
                            u16::from(close.code)
                        ));
                    }
                    Some(Ok(Message::Close(None))) => {
                        return Next::Closed("the server closed the connection".to_owned());
                    }
                    Some(Ok(_)) => {}
                    Some(Err(error)) => {
                        return Next::Closed(format!("the connection ended: {error}"));
                    }
                    None => return Next::Closed("the connection ended".to_owned()),
                }
            }
        };
        tokio::time::timeout(wait, read)
            .await
            .unwrap_or(Next::Silent(wait))
    }

    /// Requires the next message to be `want`.
    pub(super) async fn expect(&mut self, want: Frame) -> Checked<()> {
        match self.next().await {
            Next::Frame(frame) if frame == want => Ok(()),
            other => Err(Verdict::Fail(format!("expected {want}, got {other}"))),
        }
    }

    /// Sends the probe and requires its bare finish to be the very next
    /// frame: whatever was sent `after` provoked nothing and left the
    /// connection working.
    pub(super) async fn probe(&mut self, after: &str) -> Checked<()> {
        let scope = self.fresh_scope();
        self.request(scope, &[UNKNOWN_TAG]).await?;
        match self.next().await {
            Next::Frame(Frame::Finish { scope: finished }) if finished == scope => Ok(()),
            other => Err(Verdict::Fail(format!(
                "after {after}, the next frame should have been the probe's bare finish \
                 (unknown endpoint tag {UNKNOWN_TAG} on scope {scope}); got {other}"
            ))),
        }
    }

    /// Requires the run on `scope` to be still open: a channel request with
    /// an unknown tag on it gets a bare channel finish, as the very next frame.
    pub(super) async fn run_probe(&mut self, scope: u32, after: &str) -> Checked<()> {
        let channel = self.fresh_channel();
        self.channel_request(scope, channel, &[UNKNOWN_TAG]).await?;
        match self.next().await {
            Next::Frame(Frame::ChannelFinish {
                scope: s,
                channel: c,
            }) if (s, c) == (scope, channel) => Ok(()),
            other => Err(Verdict::Fail(format!(
                "after {after}, the run on scope {scope} should still be open: a channel request \
                 with unknown tag {UNKNOWN_TAG} on it (channel {channel}) should have got a bare \
                 channel finish next; got {other}"
            ))),
        }
    }

    /// Requires nothing to come for `wait`: stragglers after `after`.
    pub(super) async fn quiet(&mut self, wait: Duration, after: &str) -> Checked<()> {
        match self.next_within(wait).await {
            Next::Silent(_) => Ok(()),
            other => Err(Verdict::Fail(format!("{other} came after {after}"))),
        }
    }

    /// Sends a run request on `scope` and reads its answer: the id first, or
    /// an error and then the finish (protocol §5).
    pub(super) async fn answer_run(&mut self, scope: u32, payload: &[u8]) -> Checked<RunAnswer> {
        self.request(scope, payload).await?;
        let first = match self.next().await {
            Next::Frame(Frame::Response { scope: s, payload }) if s == scope => payload,
            other => {
                return Err(Verdict::Fail(format!(
                    "a run request on scope {scope} should be answered with a response first \
                     (the id or an error); got {other}"
                )));
            }
        };
        match RunResponse::decode(&first) {
            Ok(RunResponse::Id(id)) if id.is_empty() => Err(Verdict::Fail(format!(
                "the run on scope {scope} got an empty id, which anyone can guess"
            ))),
            Ok(RunResponse::Id(id)) => Ok(RunAnswer::Id(id)),
            Ok(RunResponse::Error(error)) => {
                self.expect(Frame::Finish { scope })
                    .await
                    .map_err(|v| v.context(&format!("after the run's error response ({error})")))?;
                Ok(RunAnswer::Refused(error))
            }
            Err(error) => Err(Verdict::Fail(format!(
                "the first response on scope {scope} is neither the id nor an error: {}: {}",
                Chain(&error),
                show(&first)
            ))),
        }
    }

    /// Sends a stop on a fresh channel of `scope` with `payload`.
    pub(super) async fn stop(&mut self, scope: u32, payload: &[u8]) -> Checked<u32> {
        let channel = self.fresh_channel();
        self.channel_request(scope, channel, payload).await?;
        Ok(channel)
    }
}
