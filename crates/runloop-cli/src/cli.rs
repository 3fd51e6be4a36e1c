//! The command line: one subcommand per module, parsed with clap's derive.
//!
//! Each subcommand's arguments live beside its code (`decode::Args`,
//! `schema::Args`) and run with stdout handed in, so a new subcommand is one
//! variant here and one module.

use std::io;

use clap::CommandFactory;

use crate::exit::{Exit, Failure};
use crate::{
    agent, bench, check, completions, decode, man, proxy, replay, run, schema, serve, store,
};

/// `runloop`: the run-loop channel of the Diverge Provider Protocol 2.3.0.
#[derive(Debug, clap::Parser)]
#[command(
    name = "runloop",
    version = crate::VERSION,
    propagate_version = true,
    about,
    after_help = EXIT_CODES
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

const EXIT_CODES: &str = "\
Exit codes: 0 finished · 1 ran and ended without finishing · 2 the command
failed · 3 no loop ran · 4 not served · 5 broken · 6 finished, but the last
chunk was a fatal notification · 7 the run was refused · 8 a time limit of
run ran out · 130 interrupted (Ctrl-C)";

/// The subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Run one loop and render it as it streams (no --url: an embedded
    /// server with the demo agent).
    Run(run::Args),
    /// Serve runs: the provider server, with its catalog of agents.
    Serve(Box<serve::Args>),
    /// The container store: `store gc` removes the least recently used
    /// images no run holds.
    Store(store::Args),
    /// The proxy on its own, for beside an agent program in a container.
    Proxy(proxy::Args),
    /// An agent program on its own, on $PORT.
    Agent(agent::Args),
    /// Read a capture and print every frame and what each run-loop channel
    /// carried, as JSON lines (or rendered as `run` shows a loop).
    Decode(decode::Args),
    /// Print the JSON Schema of the chunk vocabulary and of the error value.
    Schema(schema::Args),
    /// Probe a provider server, case by case, against what docs/protocol.md requires of it.
    Check(check::Args),
    /// Measure the relay against a batching WebSocket forwarder and a direct read.
    Bench(bench::Args),
    /// Print the completion script for a shell.
    Completions(completions::Args),
    /// Print the manual page, or write every page to a directory.
    Man(man::Args),
    /// The bench's baseline forwarder (run by `runloop bench` itself).
    #[command(name = "__forward", hide = true)]
    Forward(bench::ForwardArgs),
    /// The bench's SSE agent program (run by `runloop bench --chain`).
    #[command(name = "__sse-agent", hide = true)]
    SseAgent(bench::SseAgentArgs),
    /// The bench's synthetic proxy alone (run by python/bench.py).
    #[command(name = "__synthetic-proxy", hide = true)]
    SyntheticProxy(bench::SyntheticArgs),
    /// The server's side of the corpus's captures, for the clients' tests.
    #[command(name = "__replay", hide = true)]
    Replay(replay::ReplayArgs),
}

impl Command {
    /// Carries out the subcommand, writing its data to stdout.
    pub fn execute(self) -> Result<Exit, Failure> {
        if let Command::Run(args) = &self {
            // Renders to a terminal-aware stream of its own.
            return args.execute();
        }
        let mut out = io::stdout().lock();
        match self {
            Command::Run(_) => unreachable!("handled above"),
            Command::Serve(args) => args.execute(&mut out),
            Command::Store(args) => args.execute(&mut out),
            Command::Proxy(args) => args.execute(&mut out),
            Command::Agent(args) => args.execute(&mut out),
            Command::Decode(args) => args.execute(&mut out),
            Command::Schema(args) => args.execute(&mut out),
            Command::Check(args) => args.execute(&mut out),
            Command::Bench(args) => args.execute(&mut out),
            Command::Completions(args) => args.execute(Cli::command(), &mut out),
            Command::Man(args) => args.execute(Cli::command(), &mut out),
            Command::Forward(args) => args.execute(),
            Command::SseAgent(args) => args.execute(),
            Command::SyntheticProxy(args) => args.execute(&mut out),
            Command::Replay(args) => args.execute(&mut out),
        }
    }
}
