//! The load clients: one speaks the framed protocol to a runloop server,
//! the other reads a forwarded `/agent/run` path. Both do the same work per
//! chunk — read the stamp, check the sequence, record the latency — so the
//! only difference between the two measurements is what sits in the middle.

use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use hdrhistogram::Histogram;
use runloop_proto::Decode;
use runloop_proto::frame::{self, ClientFrame, ServerFrame};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::BenchError;
use crate::synthetic::{prompt, stamp};

type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

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

    /// One chunk payload (`[0]` + JSON) read at `now`.
    fn chunk(&mut self, payload: &[u8], epoch: Instant, expected: &mut u64) {
        self.chunks += 1;
        self.bytes += payload.len().saturating_sub(1) as u64;
        match stamp(payload) {
            Some((sent, seq)) => {
                let now = epoch.elapsed().as_nanos() as u64;
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
    fn loop_end(&mut self, complete: bool, got: u64, planned: u64) {
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

async fn send(ws: &mut Socket, frame: &ClientFrame<'_>) -> Result<(), BenchError> {
    Ok(ws
        .send(Message::Binary(frame::to_message(frame).into()))
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

/// An open run on a runloop server, ready for loops.
pub(crate) struct RelayRun {
    ws: Socket,
    next_channel: u32,
}

impl RelayRun {
    /// Connects, authorizes with `token`, and starts a run of the bench image.
    pub(crate) async fn open(url: &str, token: &str) -> Result<RelayRun, BenchError> {
        let (mut ws, _) = tokio_tungstenite::connect_async_with_config(url, None, true).await?;
        let mut credential = vec![0];
        credential.extend_from_slice(token.as_bytes());
        send(
            &mut ws,
            &ClientFrame::Authorization {
                payload: &credential,
            },
        )
        .await?;
        send(
            &mut ws,
            &ClientFrame::Request {
                scope: 0,
                payload: &run_payload(),
            },
        )
        .await?;
        let answer = next_binary(&mut ws)
            .await?
            .ok_or(BenchError::Protocol("no answer to the run"))?;
        match ServerFrame::decode(&answer) {
            Ok(ServerFrame::Response { scope: 0, payload }) if payload.first() == Some(&0) => {
                Ok(RelayRun {
                    ws,
                    next_channel: 0,
                })
            }
            _ => Err(BenchError::Protocol("the run was not started")),
        }
    }

    /// Runs one loop to its finish, reading at `pace`; `prompt` picks the
    /// loop's chunks.
    pub(crate) async fn run_loop(
        &mut self,
        prompt: &[u8],
        planned: u64,
        epoch: Instant,
        tally: &mut Tally,
        pace: &mut Pace,
    ) -> Result<(), BenchError> {
        let channel = self.next_channel;
        self.next_channel += 1;
        let mut request = vec![5];
        request.extend_from_slice(prompt);
        send(
            &mut self.ws,
            &ClientFrame::ChannelRequest {
                scope: 0,
                channel,
                payload: &request,
            },
        )
        .await?;
        let (mut expected, mut got, mut errored) = (0, 0, false);
        loop {
            let Some(bytes) = next_binary(&mut self.ws).await? else {
                tally.loop_end(false, got, planned);
                return Err(BenchError::Protocol("the connection ended mid-loop"));
            };
            pace.read(bytes.len()).await;
            match ServerFrame::decode(&bytes) {
                Ok(ServerFrame::ChannelResponse {
                    channel: c,
                    payload,
                    ..
                }) if c == channel => {
                    if payload.first() == Some(&0) {
                        got += 1;
                        tally.chunk(payload, epoch, &mut expected);
                    } else {
                        errored = true;
                    }
                }
                Ok(ServerFrame::ChannelResponseFinish { channel: c, .. }) if c == channel => {
                    tally.loop_end(!errored, got, planned);
                    return Ok(());
                }
                _ => return Err(BenchError::Protocol("an unexpected frame")),
            }
        }
    }

    pub(crate) async fn close(mut self) {
        let _ = self.ws.close(None).await;
    }
}

/// Loops through the relay until `deadline` (at least one); `index` is the
/// worker's place, which picks its loops' chunks.
pub(crate) async fn relay_worker(
    url: String,
    token: &'static str,
    index: usize,
    planned: u64,
    epoch: Instant,
    deadline: Instant,
) -> Result<Tally, BenchError> {
    let mut tally = Tally::new();
    let mut run = RelayRun::open(&url, token).await?;
    for round in 0.. {
        let prompt = prompt(index, round);
        run.run_loop(&prompt, planned, epoch, &mut tally, &mut Pace::new(None))
            .await?;
        if Instant::now() >= deadline {
            break;
        }
    }
    run.close().await;
    Ok(tally)
}

/// Loops through the raw forwarder until `deadline` (at least one); `index`
/// is the worker's place, which picks its loops' chunks.
pub(crate) async fn baseline_worker(
    url: String,
    index: usize,
    planned: u64,
    epoch: Instant,
    deadline: Instant,
) -> Result<Tally, BenchError> {
    let mut tally = Tally::new();
    for round in 0.. {
        let url = format!("{url}/agent/run");
        let (mut ws, _) = tokio_tungstenite::connect_async_with_config(url, None, true).await?;
        ws.send(Message::Binary(prompt(index, round).into()))
            .await?;
        let (mut expected, mut got) = (0, 0);
        while let Some(message) = next_binary(&mut ws).await? {
            got += 1;
            tally.chunk(&message, epoch, &mut expected);
        }
        tally.loop_end(true, got, planned);
        if Instant::now() >= deadline {
            break;
        }
    }
    Ok(tally)
}
