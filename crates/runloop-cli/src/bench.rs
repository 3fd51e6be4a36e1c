//! `runloop bench`: the relay measured against a raw WebSocket forwarder,
//! in one run, over real loopback sockets.
//!
//! The program in the middle runs as a child process — this binary again,
//! as `runloop serve` for the relay and as the hidden `__forward` for the
//! baseline — so its peak memory is its own. The figures that matter are
//! the ratios, printed last; `--json` prints them as one JSON object on the
//! last line. The command exits 0 when every loop on both sides finished
//! with every chunk in order, and 5 (broken) otherwise.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use runloop_bench::{Mix, Params, SlowParams, Spawn};
use tokio::process::Command;

use crate::exit::{Exit, Failure};
use crate::process::{block_on, init_logs};
use crate::serve::bytes;

/// Arguments of `runloop bench`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Concurrent loops, each on its own connection.
    #[arg(long, default_value_t = 1)]
    pub loops: usize,
    /// Chunks per loop.
    #[arg(long, default_value_t = 2000)]
    pub chunks: u64,
    /// Chunk sizes: MIN-MAX:WEIGHT[,…] in bytes (K/M suffixes).
    #[arg(long, default_value_t = Mix::default())]
    pub mix: Mix,
    /// Each side repeats its loops until this many seconds have passed
    /// (0: one round).
    #[arg(long, default_value_t = 5.0)]
    pub duration: f64,
    /// Print the figures as one JSON object on the last line.
    #[arg(long)]
    pub json: bool,
    /// Instead: relay one large loop to a client that reads slowly, and
    /// report the server's memory growth (backpressure at work).
    #[arg(long)]
    pub slow_reader: bool,
    /// With --slow-reader: the loop's size (K/M/G suffixes).
    #[arg(long, default_value = "1G", value_parser = bytes)]
    pub bytes: u64,
    /// With --slow-reader: the size of each chunk.
    #[arg(long, default_value = "64K", value_parser = bytes)]
    pub chunk_size: u64,
    /// With --slow-reader: how fast the client reads, bytes per second.
    #[arg(long, default_value = "64M", value_parser = bytes)]
    pub read_rate: u64,
}

/// Arguments of the hidden `__forward`: the bench's baseline forwarder.
#[derive(Debug, clap::Args)]
pub struct ForwardArgs {
    /// Where to listen.
    #[arg(long)]
    pub listen: SocketAddr,
    /// The proxy to forward to (ws://HOST:PORT).
    #[arg(long)]
    pub upstream: String,
}

/// Starts this binary again as the programs under test.
struct ThisBinary(PathBuf);

impl Spawn for ThisBinary {
    fn server(&self, listen: SocketAddr, proxy: &str, token: &str) -> Command {
        let mut command = Command::new(&self.0);
        command
            .args(["serve", "--listen", &listen.to_string(), "--token", token])
            .args(["--agent", &format!("bench=proxy:{proxy}")])
            .env("RUST_LOG", "warn");
        command
    }

    fn forwarder(&self, listen: SocketAddr, upstream: &str) -> Command {
        let mut command = Command::new(&self.0);
        command.args([
            "__forward",
            "--listen",
            &listen.to_string(),
            "--upstream",
            upstream,
        ]);
        command
    }
}

impl Args {
    /// Runs the measurement and prints its figures.
    pub fn execute(&self, out: &mut impl Write) -> Result<Exit, Failure> {
        let _logs = init_logs("warn");
        let exe = std::env::current_exe().map_err(Failure::Runtime)?;
        let spawn = ThisBinary(exe);
        let duration = Duration::try_from_secs_f64(self.duration)
            .map_err(|_| Failure::Argument("--duration must be a number of seconds".into()))?;
        if self.slow_reader {
            let params = SlowParams {
                bytes: self.bytes,
                chunk_size: usize::try_from(self.chunk_size)
                    .unwrap_or(usize::MAX)
                    .max(64),
                read_rate: self.read_rate.max(1),
            };
            let report =
                block_on(runloop_bench::slow_reader(&params, &spawn))?.map_err(Failure::Bench)?;
            self.print(out, &report)?;
            return Ok(if report.complete && report.disorder == 0 {
                Exit::Success
            } else {
                Exit::Broken
            });
        }
        let params = Params {
            loops: self.loops.max(1),
            chunks: self.chunks.max(1),
            mix: self.mix.clone(),
            duration,
        };
        let report = block_on(runloop_bench::compare(&params, &spawn))?.map_err(Failure::Bench)?;
        self.print(out, &report)?;
        Ok(if report.is_clean() {
            Exit::Success
        } else {
            Exit::Broken
        })
    }
}

impl Args {
    /// The report for people, then with `--json` as one JSON line.
    fn print<R>(&self, out: &mut impl Write, report: &R) -> Result<(), Failure>
    where
        R: std::fmt::Display + serde::Serialize,
    {
        writeln!(out, "{report}")?;
        if self.json {
            let json = serde_json::to_string(report).map_err(|e| Failure::Output(e.into()))?;
            writeln!(out, "{json}")?;
        }
        Ok(())
    }
}

impl ForwardArgs {
    /// Forwards until killed.
    pub fn execute(&self) -> Result<Exit, Failure> {
        block_on(async {
            let listener = tokio::net::TcpListener::bind(self.listen)
                .await
                .map_err(|source| Failure::Listen {
                    addr: self.listen.to_string(),
                    source,
                })?;
            runloop_bench::forward(listener, self.upstream.clone())
                .await
                .map_err(Failure::Runtime)?;
            Ok(Exit::Success)
        })?
    }
}
