//! The `runloop` command: run, serve, inspect, check and measure the
//! run-loop channel from a shell.
//!
//! The command is thin on purpose. What bytes mean is decided by
//! [`runloop_proto`]; this crate parses arguments, calls the library, and
//! renders what comes back, for a person or for a script. It is in
//! ripgrep's shape: [`main`] returns an exit code, a failure is printed
//! once to stderr as `runloop: <message>`, a reader that goes away
//! (`runloop … | head`) ends the command quietly, and data goes to stdout
//! while diagnostics go to stderr.
//!
//! ```text
//! cli      the argument types, one subcommand per module
//! run      one loop, end to end, rendered as it streams
//! serve    the provider server and its catalog; serve_file its
//!          configuration file, tenants included; limit_table its limits,
//!          each declared once
//! descriptors  the server's RLIMIT_NOFILE, raised, and its limits checked against it
//! token    credentials from a file or the environment, never needed on the command line
//! store    the container store by hand: `store gc`
//! proxy    the proxy on its own
//! agent    the demo agent program on its own
//! bench    the relay against a raw forwarder (and the hidden forwarder)
//! process  the async runtime, logs, shutdown signals and the admin listener they share
//! decode   a capture → JSON lines, exit code from the loops' endings
//! schema   the JSON Schema of the chunk vocabulary and the error value
//! replay   the server's side of corpus/'s captures, played to a client (hidden)
//! render   one loop for a terminal, as plain text, or as JSON lines
//! json     the JSON lines shared by decode and render
//! check    a provider server probed case by case against protocol §1-§7
//! completions, man   the shell completion scripts and manual pages, from the argument types
//! exit     exit codes, and the one mapping from an outcome to a code
//! frames   what one message is, in words: for run -v and decode
//! dial     a provider server's URL, and each way a connection fails, in words
//! seconds  durations on the command line and in the configuration file
//! size     byte counts on the command line and in the configuration file
//! verbose  run -v: the frames as they pass, and a timing line
//! unparsed run: what a chunk that did not parse should have been
//! notes    the command's own lines on stderr, from a bounded queue
//! ```

pub mod agent;
pub mod bench;
pub mod check;
pub mod cli;
pub mod completions;
pub mod decode;
pub mod descriptors;
pub mod dial;
pub mod exit;
pub mod frames;
pub mod json;
pub mod limit_table;
pub mod man;
pub mod notes;
pub mod process;
pub mod proxy;
pub mod render;
pub mod replay;
pub mod run;
pub mod schema;
pub mod seconds;
pub mod serve;
pub mod serve_args;
pub mod serve_file;
pub mod size;
pub mod store;
pub mod token;
pub mod unparsed;
pub mod verbose;

use std::ffi::OsString;
use std::io::{self, Write};

use clap::Parser;

pub use exit::{Exit, Failure};

/// The version `--version` prints: the package's, and the commit it was
/// built from when the build could ask git (not from a source tarball).
pub const VERSION: &str = env!("RUNLOOP_VERSION");

/// Runs the command line `args` (program name first) and says how to exit.
pub fn main(args: impl IntoIterator<Item = OsString>) -> Exit {
    let args: Vec<OsString> = args.into_iter().collect();
    let mut cli = match cli::Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(usage) => {
            // clap prints help and version to stdout, usage errors to stderr;
            // if that fails too there is nobody left to tell.
            let _ = usage.print();
            return if usage.use_stderr() {
                Exit::Failed
            } else {
                Exit::Success
            };
        }
    };
    if let cli::Command::Serve(serve) = &mut cli.command {
        // What followed `serve`, merged over a configuration file's keys.
        serve.command_line = args.iter().skip(2).cloned().collect();
    }
    match cli.command.execute() {
        Ok(exit) => exit,
        Err(failure) if failure.is_broken_pipe() => Exit::Failed,
        Err(failure) => {
            let _ = writeln!(io::stderr().lock(), "runloop: {}", failure.said());
            failure.exit()
        }
    }
}
