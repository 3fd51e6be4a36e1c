//! The load clients: one speaks the framed protocol to a runloop server,
//! the other reads a bare `/agent/run` path (through the forwarder, or from
//! the synthetic proxy itself). Both do the same work per chunk — read the
//! stamp, check the sequence, record the latency — so the only difference
//! between the measurements is what sits in the middle.
//!
//! The framed client multiplexes: one task per connection opens a run per
//! loop on it and reads every loop's frames as they come, starting a loop's
//! next round as soon as its finish arrives. So 10,000 loops over 100
//! connections cost 100 tasks, and the relay is measured, not the client.

use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use hdrhistogram::Histogram;
use runloop_proto::Decode;
use runloop_proto::frame::{self, ClientFrame, ServerFrame};
use tokio::sync::Barrier;
use tokio_tungstenite::tungstenite::Message;

use crate::BenchError;
use crate::clock::now_ns;
use crate::process::Mark;
use crate::socket::{self, Dialled as Socket};
use crate::synthetic::{LoopPlan, prompt, stamp};

/// What one or more loops delivered.
#[derive(Debug, Clone)]
pub(crate) struct Tally {
    pub(crate) loops: u64,
    pub(crate) chunks: u64,
    pub(crate) bytes: u64,
    /// Loops that ended with an error, or without their finish.
    pub(crate) failed: u64,
    /// Chunks missing, repeated or out of order.
    pub(crate) disorder: u64,
    /// Nanoseconds from the proxy's send to the client's read.
    pub(crate) latency: Histogram<u64>,
}

impl Tally {
    pub(crate) fn new() -> Tally {
        Tally {
            loops: 0,
            chunks: 0,
            bytes: 0,
            failed: 0,
            disorder: 0,
            latency: Histogram::new(3)
                .unwrap_or_else(|_| unreachable!("3 significant figures is valid")),
        }
    }

    pub(crate) fn merge(&mut self, other: &Tally) {
        self.loops += other.loops;
        self.chunks += other.chunks;
        self.bytes += other.bytes;
        self.failed += other.failed;
        self.disorder += other.disorder;
        // Both auto-resize; adding cannot fail.
        let _ = self.latency.add(&other.latency);
    }

    /// One chunk payload (`[0]` + JSON), read now.
    fn chunk(&mut self, payload: &[u8], expected: &mut u64) {
        self.chunk_json(payload.get(1..).unwrap_or_default(), expected);
    }

    /// One chunk's JSON, read now.
    pub(crate) fn chunk_json(&mut self, json: &[u8], expected: &mut u64) {
        self.chunks += 1;
        self.bytes += json.len() as u64;
        match stamp(json) {
            Some((sent, seq)) => {
                let now = now_ns();
                let _ = self.latency.record(now.saturating_sub(sent).max(1));
                if seq != *expected {
                    self.disorder += 1;
                }
                *expected = seq + 1;
            }
            None => self.disorder += 1,
        }
    }

    /// A loop ended; `complete` when it ended as it should, with all chunks.
    pub(crate) fn loop_end(&mut self, complete: bool, got: u64, planned: u64) {
        self.loops += 1;
        if !complete {
            self.failed += 1;
        }
        self.disorder += planned.abs_diff(got);
    }
}

/// Reads bytes at no more than `rate` bytes per second, when given.
pub(crate) struct Pace {
    rate: Option<u64>,
    start: Instant,
    bytes: u64,
}

impl Pace {
    pub(crate) fn new(rate: Option<u64>) -> Pace {
        Pace {
            rate,
            start: Instant::now(),
            bytes: 0,
        }
    }

    async fn read(&mut self, bytes: usize) {
        let Some(rate) = self.rate else { return };
        self.bytes += bytes as u64;
        let due = Duration::from_secs_f64(self.bytes as f64 / rate.max(1) as f64);
        let elapsed = self.start.elapsed();
        if due > elapsed {
            tokio::time::sleep(due - elapsed).await;
        }
    }
}

async fn feed(ws: &mut Socket, frame: &ClientFrame<'_>) -> Result<(), BenchError> {
    Ok(ws
        .feed(Message::Binary(frame::to_message(frame).into()))
        .await?)
}

async fn next_binary(ws: &mut Socket) -> Result<Option<bytes::Bytes>, BenchError> {
    loop {
        match ws.next().await {
            Some(Ok(Message::Binary(bytes))) => return Ok(Some(bytes)),
            Some(Ok(Message::Close(_))) | None => return Ok(None),
            Some(Ok(_)) => {}
            Some(Err(error)) => return Err(error.into()),
        }
    }
}

/// The `containers::agents::run` payload for the bench image.
fn run_payload() -> Vec<u8> {
    let request = format!(
        r#"{{"image":{{"server":{{"name":"bench","digest":"sha256:{}"}}}},"memory":1073741824,"disk":0,"agent":{{}}}}"#,
        "0".repeat(64)
    );
    let mut payload = vec![0];
    payload.extend_from_slice(request.as_bytes());
    payload
}

/// Where the framed client connects, and with what.
#[derive(Debug, Clone)]
pub(crate) struct Server {
    /// `ws://host:port`.
    pub(crate) url: String,
    /// The credential.
    pub(crate) token: &'static str,
}

/// One run on a framed connection and the loop it is reading (scope =
/// the lane's place on the connection; one loop at a time, as a proxy
/// serves them).
struct Lane {
    /// The loop's index among all loops, which picks its chunks.
    index: usize,
    /// Loops this lane has run, which picks the next one's chunks.
    round: u64,
    /// The open run-loop channel.
    channel: u32,
    expected: u64,
    got: u64,
    errored: bool,
}

impl Lane {
    fn new(index: usize) -> Lane {
        Lane {
            index,
            round: 0,
            channel: 0,
            expected: 0,
            got: 0,
            errored: false,
        }
    }

    /// Asks for the lane's next loop on `scope`.
    async fn ask(&mut self, ws: &mut Socket, scope: u32, plan: LoopPlan) -> Result<(), BenchError> {
        let mut request = vec![5];
        request.extend_from_slice(&prompt(self.index, self.round, plan));
        (self.expected, self.got, self.errored) = (0, 0, false);
        feed(
            ws,
            &ClientFrame::ChannelRequest {
                scope,
                channel: self.channel,
                payload: &request,
            },
        )
        .await
    }

    /// The lane's open loop, when `channel` is it.
    fn reading(&mut self, channel: u32) -> Result<&mut Lane, BenchError> {
        if channel == self.channel {
            Ok(self)
        } else {
            Err(BenchError::Protocol(
                "a frame for a channel that is not open",
            ))
        }
    }
}

/// One framed connection carrying the loops `loops` (one run each), each
/// repeated until `deadline` (at least once), reading at no more than
/// `read_rate` bytes per second when given. The loops start when every
/// connection waiting on `all_open` has opened its runs, so that they all
/// run at once; the last to open sets `started` then, when given (a
/// round measured from there leaves the runs' starts out).
pub(crate) async fn relay_connection(
    server: Server,
    loops: Range<usize>,
    plan: LoopPlan,
    deadline: Deadline,
    read_rate: Option<u64>,
    all_open: Arc<Barrier>,
    started: Option<Arc<Mark>>,
) -> Result<Tally, BenchError> {
    let mut ws = socket::connect(&server.url).await?;
    let mut credential = vec![0];
    credential.extend_from_slice(server.token.as_bytes());
    feed(
        &mut ws,
        &ClientFrame::Authorization {
            payload: &credential,
        },
    )
    .await?;
    // Runs start one at a time, so a connection has at most one
    // registration in flight: thousands at once would need thousands of
    // descriptors more.
    let mut lanes: Vec<Lane> = loops.map(Lane::new).collect();
    for scope in 0..lanes.len() {
        let scope = scope_number(scope)?;
        feed(
            &mut ws,
            &ClientFrame::Request {
                scope,
                payload: &run_payload(),
            },
        )
        .await?;
        ws.flush().await?;
        let answer = next_binary(&mut ws)
            .await?
            .ok_or(BenchError::Protocol("no answer to the run"))?;
        match ServerFrame::decode(&answer) {
            Ok(ServerFrame::Response { scope: s, payload })
                if s == scope && payload.first() == Some(&0) => {}
            _ => return Err(BenchError::Protocol("the run was not started")),
        }
    }
    if all_open.wait().await.is_leader()
        && let Some(started) = &started
    {
        started.set();
    }
    let deadline = deadline.when_started_now();
    for (scope, lane) in lanes.iter_mut().enumerate() {
        lane.ask(&mut ws, scope_number(scope)?, plan).await?;
    }
    ws.flush().await?;
    let mut tally = Tally::new();
    let mut pace = Pace::new(read_rate);
    let mut open = lanes.len();
    while open > 0 {
        let Some(bytes) = next_binary(&mut ws).await? else {
            return Err(BenchError::Protocol("the connection ended mid-loop"));
        };
        pace.read(bytes.len()).await;
        match ServerFrame::decode(&bytes) {
            Ok(ServerFrame::ChannelResponse {
                scope,
                channel,
                payload,
            }) => {
                let lane = lane(&mut lanes, scope)?.reading(channel)?;
                if payload.first() == Some(&0) {
                    lane.got += 1;
                    tally.chunk(payload, &mut lane.expected);
                } else {
                    lane.errored = true;
                }
            }
            Ok(ServerFrame::ChannelResponseFinish { scope, channel }) => {
                let lane = lane(&mut lanes, scope)?.reading(channel)?;
                tally.loop_end(!lane.errored, lane.got, plan.chunks);
                if Instant::now() < deadline {
                    lane.round += 1;
                    lane.channel += 1;
                    lane.ask(&mut ws, scope, plan).await?;
                    ws.flush().await?;
                } else {
                    open -= 1;
                }
            }
            _ => return Err(BenchError::Protocol("an unexpected frame")),
        }
    }
    let _ = ws.close(None).await;
    Ok(tally)
}

/// When a round's loops stop asking for more: a time, or a length of time
/// from when they start (which, for a framed connection, is once every
/// run is open).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Deadline {
    At(Instant),
    After(Duration),
}

impl Deadline {
    fn when_started_now(self) -> Instant {
        match self {
            Deadline::At(at) => at,
            Deadline::After(after) => Instant::now() + after,
        }
    }
}

fn scope_number(place: usize) -> Result<u32, BenchError> {
    u32::try_from(place).map_err(|_| BenchError::Protocol("too many runs on one connection"))
}

fn lane(lanes: &mut [Lane], scope: u32) -> Result<&mut Lane, BenchError> {
    lanes
        .get_mut(scope as usize)
        .ok_or(BenchError::Protocol("a frame for a scope that is not open"))
}

/// Reads loop `index` from a bare `/agent/run` path at `url` (the forwarder
/// or the synthetic proxy itself), again until `deadline` (at least once).
pub(crate) async fn bare_worker(
    url: String,
    index: usize,
    plan: LoopPlan,
    deadline: Instant,
) -> Result<Tally, BenchError> {
    let mut tally = Tally::new();
    let url = format!("{url}/agent/run");
    for round in 0.. {
        let mut ws = socket::connect(&url).await?;
        ws.send(Message::Binary(prompt(index, round, plan).into()))
            .await?;
        let (mut expected, mut got, mut errored) = (0, 0, false);
        while let Some(message) = next_binary(&mut ws).await? {
            if message.first() == Some(&0) {
                got += 1;
                tally.chunk(&message, &mut expected);
            } else {
                errored = true;
            }
        }
        tally.loop_end(!errored, got, plan.chunks);
        if Instant::now() >= deadline {
            break;
        }
    }
    Ok(tally)
}
