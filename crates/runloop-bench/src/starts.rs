//! Starts, as a caller feels them: run request → run id → loop request →
//! first chunk, from outside the server over the framed protocol, one run
//! after another on one connection; and, beside them, the same agent
//! program spawned by hand and answering, the floor a start compares with.
//!
//! ```text
//! framed:  request ──▶ [0]{"id"} ──▶ channel 5 {"prompt"} ──▶ first [0]chunk … finish ──▶ stop
//!          |←── to id ──▶|                                         |
//!          |←────────────── to first chunk ─────────────────────────▶|
//! by hand: spawn (PORT) ──▶ connect until it accepts ──▶ POST /register ──▶ POST /run ──▶ first data:
//! ```
//!
//! Runs go one at a time, each stopped (and its finish read) before the
//! next is asked for, so a start never waits on another run's and the
//! server holds one container at a time (with an `interval` between
//! them, a warm pool has the time to refill). The first `warmups` runs are
//! made and not counted: they take what a first run pays once (an image's
//! pages into the page cache, a cgroup hierarchy, a pool's first fill).
//! Figures are medians and the 90th percentile of the rest; a shared
//! machine moves them a lot, so compare runs made in the same minutes.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use runloop_proto::Decode;
use runloop_proto::frame::{ClientFrame, ServerFrame, to_message};
use serde::Serialize;
use tokio_tungstenite::tungstenite::Message;

use crate::BenchError;
use crate::socket::{self, Dialled};

/// The channel tags of a run scope this module opens (protocol §6).
const STOP: u8 = 0;
const RUN_LOOP: u8 = 5;

/// What to start, and how often.
#[derive(Debug, Clone)]
pub struct StartParams {
    /// The server (`ws://HOST:PORT`).
    pub url: String,
    /// The credential it takes.
    pub token: String,
    /// The run request's JSON (`containers::agents::run`, without its tag).
    pub request: Vec<u8>,
    /// The loop's prompt.
    pub prompt: String,
    /// Runs counted.
    pub runs: usize,
    /// Runs made first and not counted.
    pub warmups: usize,
    /// How long to wait after each run's finish before the next is asked
    /// for (a warm pool refills meanwhile).
    pub interval: Duration,
}

/// Percentiles of one figure, in milliseconds.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Spread {
    /// The median.
    pub p50_ms: f64,
    /// The 90th percentile.
    pub p90_ms: f64,
    /// The fastest.
    pub min_ms: f64,
    /// The slowest.
    pub max_ms: f64,
}

impl Spread {
    /// The spread of `samples` (none: all zero).
    pub fn of(samples: &[Duration]) -> Spread {
        let mut sorted = samples.to_vec();
        sorted.sort();
        let at = |fraction: f64| {
            let Some(last) = sorted.len().checked_sub(1) else {
                return 0.0;
            };
            let index = ((last as f64) * fraction).round() as usize;
            sorted[index.min(last)].as_secs_f64() * 1e3
        };
        Spread {
            p50_ms: at(0.5),
            p90_ms: at(0.9),
            min_ms: at(0.0),
            max_ms: at(1.0),
        }
    }
}

impl std::fmt::Display for Spread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "p50 {:.1} ms, p90 {:.1} ms (min {:.1}, max {:.1})",
            self.p50_ms, self.p90_ms, self.min_ms, self.max_ms
        )
    }
}

/// What the framed starts measured.
#[derive(Debug, Clone, Serialize)]
pub struct StartReport {
    /// Runs counted.
    pub runs: usize,
    /// Run request → run id.
    pub to_id: Spread,
    /// Run request → the loop's first chunk.
    pub to_first_chunk: Spread,
    /// The stop → the scope's finish (the container's teardown, as the
    /// caller waits for it).
    pub stop: Spread,
    /// Each counted run's request → first chunk, ms, in order.
    pub first_chunk_ms: Vec<f64>,
    /// The same program by hand, when it was measured.
    pub by_hand: Option<Spread>,
}

impl std::fmt::Display for StartReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "starts: {} runs, one at a time on one connection",
            self.runs
        )?;
        writeln!(f, "  request → id           {}", self.to_id)?;
        writeln!(f, "  request → first chunk  {}", self.to_first_chunk)?;
        write!(f, "  stop → finish          {}", self.stop)?;
        if let Some(by_hand) = &self.by_hand {
            write!(f, "\n  by hand, spawn → first data  {by_hand}")?;
            if by_hand.p50_ms > 0.0 {
                write!(
                    f,
                    "\n  first chunk / by hand (p50)  {:.2}",
                    self.to_first_chunk.p50_ms / by_hand.p50_ms
                )?;
            }
        }
        Ok(())
    }
}

/// Makes `warmups + runs` runs one after another on one connection and
/// times each.
pub async fn starts(params: &StartParams) -> Result<StartReport, BenchError> {
    let mut ws = socket::connect(&params.url).await?;
    let mut credential = vec![0];
    credential.extend_from_slice(params.token.as_bytes());
    send(
        &mut ws,
        &ClientFrame::Authorization {
            payload: &credential,
        },
    )
    .await?;
    let mut request = vec![0];
    request.extend_from_slice(&params.request);
    let mut ask = vec![RUN_LOOP];
    ask.extend_from_slice(
        &serde_json::to_vec(&serde_json::json!({"prompt": params.prompt}))
            .map_err(std::io::Error::other)?,
    );
    let (mut to_id, mut to_first, mut stops) = (Vec::new(), Vec::new(), Vec::new());
    for run in 0..params.warmups + params.runs {
        let scope = u32::try_from(run % 1024).unwrap_or(0);
        if run > 0 && !params.interval.is_zero() {
            tokio::time::sleep(params.interval).await;
        }
        let timed = one(&mut ws, scope, &request, &ask).await?;
        if run >= params.warmups {
            to_id.push(timed.to_id);
            to_first.push(timed.to_first_chunk);
            stops.push(timed.stop);
        }
    }
    let _ = ws.close(None).await;
    Ok(StartReport {
        runs: to_first.len(),
        to_id: Spread::of(&to_id),
        to_first_chunk: Spread::of(&to_first),
        stop: Spread::of(&stops),
        first_chunk_ms: to_first.iter().map(|d| d.as_secs_f64() * 1e3).collect(),
        by_hand: None,
    })
}

/// One run's times.
struct Timed {
    to_id: Duration,
    to_first_chunk: Duration,
    stop: Duration,
}

/// One run on `scope`: asked for, its loop asked for as soon as its id
/// came, read to its finish, then stopped.
async fn one(
    ws: &mut Dialled,
    scope: u32,
    request: &[u8],
    ask: &[u8],
) -> Result<Timed, BenchError> {
    let asked = Instant::now();
    send(
        ws,
        &ClientFrame::Request {
            scope,
            payload: request,
        },
    )
    .await?;
    let mut to_id = None;
    let mut to_first_chunk = None;
    loop {
        let frame = next(ws).await?;
        match ServerFrame::decode(&frame) {
            Ok(ServerFrame::Response { scope: s, payload }) if s == scope => {
                if payload.first() != Some(&0) {
                    return Err(BenchError::Refused(
                        String::from_utf8_lossy(payload.get(1..).unwrap_or_default()).into_owned(),
                    ));
                }
                to_id = Some(asked.elapsed());
                send(
                    ws,
                    &ClientFrame::ChannelRequest {
                        scope,
                        channel: 1,
                        payload: ask,
                    },
                )
                .await?;
            }
            Ok(ServerFrame::ResponseFinish { scope: s }) if s == scope => {
                return Err(BenchError::Protocol("the run ended before its loop"));
            }
            Ok(ServerFrame::ChannelResponse {
                scope: s,
                channel: 1,
                payload,
            }) if s == scope => {
                if payload.first() != Some(&0) {
                    return Err(BenchError::Refused(
                        String::from_utf8_lossy(payload.get(1..).unwrap_or_default()).into_owned(),
                    ));
                }
                to_first_chunk.get_or_insert_with(|| asked.elapsed());
            }
            Ok(ServerFrame::ChannelResponseFinish {
                scope: s,
                channel: 1,
            }) if s == scope => break,
            _ => {}
        }
    }
    let (Some(to_id), Some(to_first_chunk)) = (to_id, to_first_chunk) else {
        return Err(BenchError::Protocol("the loop finished without a chunk"));
    };
    let stopping = Instant::now();
    send(
        ws,
        &ClientFrame::ChannelRequest {
            scope,
            channel: 2,
            payload: &[STOP],
        },
    )
    .await?;
    loop {
        let frame = next(ws).await?;
        if let Ok(ServerFrame::ResponseFinish { scope: s }) = ServerFrame::decode(&frame)
            && s == scope
        {
            break;
        }
    }
    Ok(Timed {
        to_id,
        to_first_chunk,
        stop: stopping.elapsed(),
    })
}

async fn send(ws: &mut Dialled, frame: &ClientFrame<'_>) -> Result<(), BenchError> {
    ws.send(Message::Binary(to_message(frame).into())).await?;
    Ok(())
}

/// The next binary message; the connection's end is an error.
async fn next(ws: &mut Dialled) -> Result<Vec<u8>, BenchError> {
    loop {
        match ws.next().await {
            Some(Ok(Message::Binary(bytes))) => return Ok(bytes.to_vec()),
            Some(Ok(_)) => {}
            Some(Err(error)) => return Err(error.into()),
            None => return Err(BenchError::Protocol("the server closed the connection")),
        }
    }
}

/// The agent program `program` (with `args`), spawned by hand `warmups +
/// runs` times: each time on a free loopback port as `$PORT`, dialled
/// until it accepts (every 0.2 ms), registered (`POST /register`, `agent`
/// `{}`) and asked for a loop (`POST /run`) on `prompt`; timed from the
/// spawn to the first `data:` line of the answer, then killed.
pub fn by_hand(
    program: &str,
    args: &[String],
    prompt: &str,
    runs: usize,
    warmups: usize,
) -> Result<Spread, BenchError> {
    let mut samples = Vec::new();
    for run in 0..warmups + runs {
        let port = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
            .local_addr()?
            .port();
        let began = Instant::now();
        let mut child = Command::new(program)
            .args(args)
            .env("PORT", port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let answered = answer(port, prompt, &mut child);
        let took = began.elapsed();
        let _ = child.kill();
        let _ = child.wait();
        answered?;
        if run >= warmups {
            samples.push(took);
        }
    }
    Ok(Spread::of(&samples))
}

/// Waits for the program to accept on `port`, registers it and reads its
/// loop's answer up to its first `data:` line.
fn answer(port: u16, prompt: &str, child: &mut std::process::Child) -> Result<(), BenchError> {
    let address = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut first = loop {
        match TcpStream::connect(address) {
            Ok(stream) => break stream,
            Err(_) if Instant::now() < deadline => {
                if let Some(status) = child.try_wait()? {
                    return Err(BenchError::Exited(format!("the agent program ({status})")));
                }
                std::thread::sleep(Duration::from_micros(200));
            }
            Err(error) => return Err(error.into()),
        }
    };
    post(&mut first, "/register", br#"{"agent":{}}"#)?;
    read_until(&mut first, b"\r\n\r\n")?;
    let body = serde_json::to_vec(&serde_json::json!({"prompt": prompt}))
        .map_err(std::io::Error::other)?;
    let mut run = TcpStream::connect(address)?;
    post(&mut run, "/run", &body)?;
    read_until(&mut run, b"data:")?;
    Ok(())
}

fn post(stream: &mut TcpStream, path: &str, body: &[u8]) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let mut request = head.into_bytes();
    request.extend_from_slice(body);
    stream.write_all(&request)
}

/// Reads from `stream` until `marker` has been read.
fn read_until(stream: &mut TcpStream, marker: &[u8]) -> Result<(), BenchError> {
    let mut seen = Vec::new();
    let mut buffer = [0u8; 4096];
    while !seen.windows(marker.len()).any(|window| window == marker) {
        let read = stream.read(&mut buffer)?;
        if read == 0 {
            return Err(BenchError::Protocol(
                "the agent program closed before its answer",
            ));
        }
        seen.extend_from_slice(&buffer[..read]);
        if seen.len() > 1 << 20 {
            return Err(BenchError::Protocol(
                "the agent program's answer has no end",
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spread_reads_its_percentiles_from_the_samples() {
        let samples: Vec<Duration> = (1..=10).map(Duration::from_millis).collect();
        let spread = Spread::of(&samples);
        assert_eq!(spread.min_ms, 1.0);
        assert_eq!(spread.max_ms, 10.0);
        // Index round(9 × 0.5) = 5 of 1..=10 (sorted): 6 ms.
        assert_eq!(spread.p50_ms, 6.0);
        assert_eq!(spread.p90_ms, 9.0);
        assert_eq!(Spread::of(&[]).p50_ms, 0.0);
    }
}
