//! `runloop bench`: the relay measured against a batching WebSocket
//! forwarder and against a direct read, in one run, over real loopback
//! sockets; with `--chain`, the whole chain (server, proxy, an `exec:`
//! agent program) against nginx in front of the same agent program.
//!
//! The programs in the middle run as child processes — this binary again,
//! as `runloop serve` for the relay and the chain and as the hidden
//! `__forward` for the baseline; nginx — so their memory and CPU time are
//! their own. The chain's agent program is this binary again too, as the
//! hidden `__sse-agent`. The figures that
//! matter are the ratios, printed last, one line each; `--json` prints
//! everything as one JSON object on the last line. The command exits 0 when
//! every loop on every side finished with every chunk in order, and 5
//! (broken) otherwise. A debug build measures the optimiser's absence, so
//! it says so on stderr.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use runloop::limits::Limits;
use runloop::server::DEFAULT_MAX_CONNECTIONS;
use runloop_bench::{AgentSource, Load, Mix, Params, SlowParams, Spawn, StartParams};
use runloop_proto::agents_run::{Container, Image, ImageRef, RunRequest};
use serde_json::value::RawValue;
use tokio::process::Command;

use crate::exit::{Exit, Failure};
use crate::process::{block_on, init_logs};
use crate::size::bytes;

/// What `runloop bench --help` says after the flags: the JSON's ratios.
const JSON_KEYS: &str = "\
The JSON's ratios (relay over the other side; null when a side was left out):
  relay_ratio                          throughput, relay / batching forwarder
  relay_cpu_per_chunk_ratio            CPU time per chunk, server / forwarder
  relay_vs_direct                      throughput, relay / direct read (the ceiling)
  latency_p50_ratio                    median latency at saturation (queue depth)
  relay_paced_latency_p50_ratio        median latency at a fixed rate, end to end
  relay_paced_added_latency_p50_ratio  the same, each less the direct read's median
Ratios are medians of per-round ratios; *_range holds the lowest and highest
round. Each side's figures are under relay, baseline, direct and paced.
With --chain (chain over nginx; null when nginx is not installed):
  chain_cpu_per_chunk_ratio            CPU time per chunk, server / nginx
  chain_ratio                          throughput, chain / nginx
  chain_vs_agent                       throughput, chain / direct read of the agent
  chain_paced_cpu_per_chunk_ratio      CPU time per chunk at a fixed rate
  chain_paced_latency_p50_ratio        median latency at a fixed rate, end to end
  chain_paced_added_latency_p50_ratio  the same, each less the direct read's median
Each side's figures are under chain, nginx, agent and paced.";

/// Arguments of `runloop bench`.
#[derive(Debug, clap::Args)]
#[command(after_help = JSON_KEYS)]
pub struct Args {
    /// Concurrent loops.
    #[arg(long, default_value_t = 1)]
    pub loops: usize,
    /// Connections the relay's loops share, one run per loop on them
    /// (default: one per loop). The forwarder and direct sides need one
    /// path per loop; a side whose sockets exceed the descriptor limit is
    /// left out.
    #[arg(long)]
    pub connections: Option<usize>,
    /// Chunks per loop.
    #[arg(long, default_value_t = 2000)]
    pub chunks: u64,
    /// Chunk sizes: MIN-MAX:WEIGHT[,…] in bytes (K/M suffixes).
    #[arg(long, default_value_t = Mix::default())]
    pub mix: Mix,
    /// Seconds each side runs in each round, repeating its loops
    /// (0: one round of loops).
    #[arg(long, default_value_t = 1.0)]
    pub duration: f64,
    /// Rounds per phase; the sides take turns, in an order reversed each
    /// round.
    #[arg(long, default_value_t = 4)]
    pub rounds: usize,
    /// Chunks per second per loop in the paced (latency) phase, which
    /// follows the saturated one; its loops last --duration. 0: no paced
    /// phase.
    #[arg(long, default_value_t = 1000)]
    pub pace: u64,
    /// Print the figures as one JSON object on the last line.
    #[arg(long)]
    pub json: bool,
    /// Instead: the whole chain — this binary's `serve` with an `exec:`
    /// agent program that streams SSE, its proxy in the server — against
    /// nginx as a plain SSE reverse proxy in front of the same program
    /// (when installed), and the program read directly. With
    /// --slow-reader: the large loop through the whole chain.
    #[arg(long)]
    pub chain: bool,
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
    /// Instead: time this many starts, one after another on one
    /// connection to the server at --url (run request → id → loop
    /// request → first chunk), after --warmups not counted; the
    /// credential is RUNLOOP_TOKEN's.
    #[arg(long, value_name = "RUNS", conflicts_with = "slow_reader", requires_all = ["url", "image"])]
    pub starts: Option<usize>,
    /// With --starts: the server (ws://HOST:PORT).
    #[arg(long)]
    pub url: Option<String>,
    /// With --starts: the server image to run, NAME or NAME@DIGEST.
    #[arg(long, value_parser = crate::run::image)]
    pub image: Option<ImageRef>,
    /// With --starts: each run's memory (K/M/G suffixes).
    #[arg(long, default_value = "256M", value_parser = bytes)]
    pub memory: u64,
    /// With --starts: each run's disk (K/M/G suffixes; 0 for exec: images).
    #[arg(long, default_value = "64M", value_parser = bytes)]
    pub disk: u64,
    /// With --starts: runs made first and not counted.
    #[arg(long, default_value_t = 2)]
    pub warmups: usize,
    /// With --starts: seconds to wait between a run's finish and the next
    /// run (a server's warm pool refills meanwhile).
    #[arg(long, default_value_t = 0.0)]
    pub interval: f64,
    /// With --starts: the loops' prompt.
    #[arg(long, default_value = "count these words")]
    pub prompt: String,
    /// With --starts: also spawn this agent program by hand as often
    /// (PROGRAM [ARGS…], split on whitespace) and time it from its spawn
    /// to its first `data:` line, the floor an exec start compares with.
    #[arg(long, value_name = "PROGRAM")]
    pub by_hand: Option<String>,
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

/// Arguments of the hidden `__sse-agent`: the bench's agent program, on
/// `127.0.0.1:$PORT`.
#[derive(Debug, clap::Args)]
pub struct SseAgentArgs {
    /// Chunk sizes: MIN-MAX:WEIGHT[,…] in bytes (K/M suffixes).
    #[arg(long, default_value_t = Mix::default())]
    pub mix: Mix,
}

impl SseAgentArgs {
    /// Serves on `127.0.0.1:$PORT` until killed, on one thread.
    pub fn execute(&self) -> Result<Exit, Failure> {
        let port = std::env::var("PORT")
            .ok()
            .and_then(|port| port.parse::<u16>().ok())
            .ok_or_else(|| Failure::Argument("$PORT must be a port number".into()))?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(Failure::Runtime)?;
        runtime.block_on(async {
            let listen = SocketAddr::from(([127, 0, 0, 1], port));
            let listener = tokio::net::TcpListener::bind(listen)
                .await
                .map_err(|source| Failure::Listen {
                    addr: listen.to_string(),
                    source,
                })?;
            runloop_bench::agent::serve(listener, self.mix.clone())
                .await
                .map_err(Failure::Runtime)?;
            Ok(Exit::Success)
        })
    }
}

/// Arguments of the hidden `__synthetic-proxy`: the bench's synthetic
/// proxy on its own, for load clients outside this binary.
#[derive(Debug, clap::Args)]
pub struct SyntheticArgs {
    /// Chunk sizes: MIN-MAX:WEIGHT[,…] in bytes (K/M suffixes).
    #[arg(long, default_value_t = Mix::default())]
    pub mix: Mix,
}

impl SyntheticArgs {
    /// Prints the proxy's URL (one line), then serves until killed.
    pub fn execute(&self, out: &mut impl Write) -> Result<Exit, Failure> {
        block_on(async {
            let mut printed = Ok(());
            runloop_bench::synthetic_proxy(self.mix.clone(), |url| {
                printed = writeln!(out, "{url}").and_then(|()| out.flush());
            })
            .await
            .map_err(|error| Failure::Runtime(std::io::Error::other(error)))?;
            printed.map_err(Failure::Runtime)?;
            Ok(Exit::Success)
        })?
    }
}

/// Starts this binary again as the programs under test.
struct ThisBinary(PathBuf);

/// A program to start the programs under test through, with this binary
/// and its arguments as its own (a profiler's wrapper script; see
/// crates/runloop-bench/PROFILING.md).
const WRAP: &str = "RUNLOOP_BENCH_WRAP";

/// The room the server the bench starts keeps, in connections and in
/// runs, beyond one round's load (and at most one round's load again):
/// for what it still holds of the last round when the next begins.
const SPARE: usize = 64;

impl ThisBinary {
    /// This binary, through [`WRAP`] if it is set.
    fn command(&self) -> Command {
        match std::env::var_os(WRAP) {
            Some(wrap) => {
                let mut command = Command::new(wrap);
                command.arg(&self.0);
                command
            }
            None => Command::new(&self.0),
        }
    }
}

impl Spawn for ThisBinary {
    fn server(&self, listen: SocketAddr, agent: &AgentSource, token: &str, load: Load) -> Command {
        let mut command = self.command();
        command.args(["serve", "--listen", &listen.to_string()]);
        match agent {
            AgentSource::Proxy(proxy) => {
                command.args(["--agent", &format!("bench=proxy:{proxy}")]);
            }
            AgentSource::Exec(mix) => {
                // The bench's runs ask for no disk, which a host process
                // cannot be held to anyway.
                command
                    .args([
                        "--agent",
                        &format!("bench=exec:{} __sse-agent --mix {mix}", self.0.display()),
                    ])
                    .args(["--exec-disk", "unenforced"]);
            }
        }
        command
            // As the help steers a user: not `--token`, which every local
            // user can read (and the server warns about).
            .env("RUNLOOP_TOKEN", token)
            .env("RUST_LOG", "warn");
        // Defaults stay defaults; only a load past them raises a limit.
        if load.runs_per_connection > Limits::default().max_scopes {
            command.args(["--max-scopes", &load.runs_per_connection.to_string()]);
        }
        // The bench is one token on one address, connecting all at once,
        // with runs whose memory nothing holds, one loop each. The server
        // lets a round's connections and runs go a moment after the bench
        // has closed them (an agent process to reap), so the next round
        // may meet some of the last one's: each limit has room for one
        // round's load again, up to SPARE more (the descriptors a large
        // load needs stay within the machine's limit), and one connection
        // for the probe while the server starts. Every per-address and
        // per-identity limit, and the run budget, fit that; and since the
        // bench's one token is a tenant, which holds half of the server's
        // connections, runs and memory at most (its fair share), the
        // server-wide limits are twice it.
        let with_spare = |n: usize| n + n.min(SPARE);
        let connections = with_spare(load.connections + 1);
        let runs = with_spare((load.connections * load.runs_per_connection).max(1));
        if 2 * connections > DEFAULT_MAX_CONNECTIONS {
            command.args(["--max-connections", &(2 * connections).to_string()]);
        }
        let connections = connections.to_string();
        command
            .args(["--max-unauthorized", &connections])
            .args(["--max-unauthorized-per-address", &connections])
            .args(["--max-connections-per-address", &connections])
            .args(["--max-connections-per-identity", &connections])
            .args(["--max-runs", &(2 * runs).to_string()])
            .args(["--max-runs-per-identity", &runs.to_string()])
            .args(["--max-loops-per-identity", &runs.to_string()])
            .args(["--memory-budget", &format!("{}G", 2 * runs)]);
        command
    }

    fn agent(&self, listen: SocketAddr, mix: &Mix) -> Command {
        let mut command = Command::new(&self.0);
        command
            .args(["__sse-agent", "--mix", &mix.to_string()])
            .env("PORT", listen.port().to_string());
        command
    }

    fn forwarder(&self, listen: SocketAddr, upstream: &str) -> Command {
        let mut command = self.command();
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
        if cfg!(debug_assertions) {
            // Not `eprintln!`: a closed stderr must not panic the command.
            let _ = writeln!(
                std::io::stderr(),
                "warning: this runloop is a debug build, so its figures measure the missing \
                 optimiser; build with `cargo build --release -p runloop-cli` to measure"
            );
        }
        let exe = std::env::current_exe().map_err(Failure::Runtime)?;
        let spawn = ThisBinary(exe);
        let duration = Duration::try_from_secs_f64(self.duration)
            .map_err(|_| Failure::Argument("--duration must be a number of seconds".into()))?;
        if let Some(runs) = self.starts {
            return self.starts(out, runs);
        }
        if self.slow_reader {
            let params = SlowParams {
                bytes: self.bytes,
                chunk_size: usize::try_from(self.chunk_size)
                    .unwrap_or(usize::MAX)
                    .max(64),
                read_rate: self.read_rate.max(1),
                chain: self.chain,
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
        let loops = self.loops.max(1);
        let params = Params {
            loops,
            connections: self.connections.unwrap_or(loops),
            chunks: self.chunks.max(1),
            mix: self.mix.clone(),
            duration,
            rounds: self.rounds.max(1),
            pace: (self.pace > 0).then_some(self.pace),
        };
        if self.chain {
            let report =
                block_on(runloop_bench::chain(&params, &spawn))?.map_err(Failure::Bench)?;
            self.print(out, &report)?;
            return Ok(if report.is_clean() {
                Exit::Success
            } else {
                Exit::Broken
            });
        }
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
    /// `--starts`: the starts, and the program by hand if asked for.
    fn starts(&self, out: &mut impl Write, runs: usize) -> Result<Exit, Failure> {
        let (Some(url), Some(image)) = (&self.url, &self.image) else {
            return Err(Failure::Argument("--starts needs --url and --image".into()));
        };
        let container = Container::new(Image::Server(image.clone()), self.memory, self.disk);
        let agent = RawValue::from_string("{}".to_owned())
            .map_err(|error| Failure::Argument(error.to_string()))?;
        let request = serde_json::to_vec(&RunRequest::new(container, agent))
            .map_err(|error| Failure::Output(error.into()))?;
        let params = StartParams {
            url: url.clone(),
            token: crate::token::client(None, None)?,
            request,
            prompt: self.prompt.clone(),
            runs: runs.max(1),
            warmups: self.warmups,
            interval: Duration::try_from_secs_f64(self.interval)
                .map_err(|_| Failure::Argument("--interval must be a number of seconds".into()))?,
        };
        let mut report = block_on(runloop_bench::starts(&params))?.map_err(Failure::Bench)?;
        if let Some(by_hand) = &self.by_hand {
            let mut words = by_hand.split_whitespace().map(str::to_owned);
            let program = words
                .next()
                .ok_or_else(|| Failure::Argument("--by-hand needs a program".into()))?;
            let args: Vec<String> = words.collect();
            report.by_hand = Some(
                runloop_bench::by_hand(&program, &args, &self.prompt, params.runs, self.warmups)
                    .map_err(Failure::Bench)?,
            );
        }
        self.print(out, &report)?;
        Ok(Exit::Success)
    }

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
