//! Exit codes: how the command tells a script what became of the loop.
//!
//! The codes are shared by every command that reads or runs loops, and the
//! mapping from a channel's [`Outcome`] to a code lives here and nowhere
//! else, so that `run` and `decode` can never disagree about a loop. Zero is
//! kept for a loop that finished and did not fail: a partial, broken,
//! unserved or fatal loop always exits non-zero.
//!
//! ```text
//! 0  finished                       5  broken (the sequence broke or never ended)
//! 1  ran, ended without finishing   6  finished, but the last chunk was a fatal notification
//! 2  the command itself failed      7  the run was refused: no run, so no loop
//! 3  no loop ran                    8  a time limit of `run` ran out
//! 4  not served (a bare finish)     130  interrupted (Ctrl-C), as shells count SIGINT
//! ```
//!
//! A refused run (7) is not a failed command (2): the arguments were good
//! and the server was reached, and it said no — to the image, the
//! credential, or for want of room — which a script may want to tell from
//! a typo. A limit that ran out (8) is the caller's own deadline, not the
//! server's doing. Both end the command before any loop could end, or cut
//! it short; the loop's own ending is still printed when there was one.
//!
//! `check` judges a server rather than a loop, and reads three of them its
//! own way: `0` every MUST case passed, `1` a MUST case failed
//! ([`Exit::NONCONFORMANT`]), `2` the check could not be made.

use std::io;
use std::process::ExitCode;
use std::time::Duration;

use runloop_proto::error_chain::Chain;
use runloop_proto::run_loop::Outcome;

use crate::seconds;

/// The process's exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Exit {
    /// `0`: the loop finished; for a command that runs no loop, it did its work.
    Success = 0,
    /// `1`: the loop ran and ended without finishing (a partial result).
    Unfinished = 1,
    /// `2`: the command itself failed: bad arguments, unreadable input,
    /// output that could not be written.
    Failed = 2,
    /// `3`: no loop ran.
    NoLoop = 3,
    /// `4`: the loop was not served.
    NotServed = 4,
    /// `5`: the channel's sequence broke or never ended.
    Broken = 5,
    /// `6`: the loop finished, but its last chunk was a fatal notification.
    Fatal = 6,
    /// `7`: the server refused the run (an error answer, a bare finish, or
    /// a close before any answer, as for a refused credential): no loop.
    Refused = 7,
    /// `8`: a time limit of `run` (`--connect-timeout`, `--timeout`,
    /// `--idle-timeout`) ran out.
    TimedOut = 8,
    /// `130`: interrupted by Ctrl-C (128 + SIGINT, as shells report it).
    Interrupted = 130,
}

impl Exit {
    /// `1` for `check`: a MUST case failed. It shares its number with
    /// [`Exit::Unfinished`]: in both, the work ran and something in it did
    /// not hold.
    pub const NONCONFORMANT: Exit = Exit::Unfinished;

    /// The code for how one run-loop channel ended.
    pub fn of(outcome: &Outcome) -> Exit {
        match outcome {
            Outcome::Finished { fatal: false } => Exit::Success,
            Outcome::Finished { fatal: true } => Exit::Fatal,
            Outcome::Unfinished(_) => Exit::Unfinished,
            Outcome::NoLoop(_) => Exit::NoLoop,
            Outcome::NotServed => Exit::NotServed,
            Outcome::Broken(_) => Exit::Broken,
        }
    }

    /// The code for several channels' endings, given in the order the
    /// channels were opened: `0` when every one finished, else the code of
    /// the first that did not. `None` when there were no channels at all.
    pub fn of_all(endings: impl IntoIterator<Item = Exit>) -> Option<Exit> {
        let mut endings = endings.into_iter().peekable();
        endings.peek()?;
        Some(
            endings
                .find(|&exit| exit != Exit::Success)
                .unwrap_or(Exit::Success),
        )
    }

    /// The numeric code.
    pub fn code(self) -> u8 {
        self as u8
    }
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> ExitCode {
        ExitCode::from(exit.code())
    }
}

/// Why a command could not do its work (exit code 2).
///
/// Each says what failed at the command's level and leaves the cause to
/// `source()`; `main` prints the chain once, `runloop: what: why: why`,
/// then the [`Failure::hint`] when there is one.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    /// An argument that parses but cannot be used.
    #[error("{0}")]
    Argument(String),
    /// The server could not be reached, is not a runloop server, or the
    /// credential could not be sent.
    #[error(transparent)]
    Dial(crate::dial::DialError),
    /// The run did not start (refused, not served, credential rejected).
    #[error(transparent)]
    Run(runloop::client::RunError),
    /// A time limit of `run` ran out.
    #[error("{what} within {} ({option} {})", seconds::show(*.after), seconds::value(*.after))]
    TimedOut {
        /// What did not happen in time.
        what: &'static str,
        /// The option that sets the limit.
        option: &'static str,
        /// The limit.
        after: Duration,
    },
    /// An address could not be listened on.
    #[error("cannot listen on {addr}")]
    Listen {
        /// The address.
        addr: String,
        /// What went wrong.
        #[source]
        source: io::Error,
    },
    /// The container host could not be set up, or an image it was given
    /// could not be served.
    #[error(transparent)]
    Containers(runloop_oci::HostError),
    /// The async runtime, or the process around it, failed: the system's
    /// error, or one made with words that say what.
    #[error(transparent)]
    Runtime(io::Error),
    /// The capture file could not be written.
    #[error("cannot write the capture {path}")]
    Capture {
        /// The file.
        path: String,
        /// What went wrong.
        #[source]
        source: io::Error,
    },
    /// A file or directory could not be written.
    #[error("cannot write {name}")]
    Write {
        /// The file or directory.
        name: String,
        /// What went wrong.
        #[source]
        source: io::Error,
    },
    /// The benchmark could not run.
    #[error("the benchmark failed")]
    Bench(#[source] runloop_bench::BenchError),
    /// Standard output could not be written.
    #[error("cannot write the output")]
    Output(#[source] io::Error),
    /// The input is not what the command reads (`decode` given a file that
    /// is not a capture).
    #[error("{0}")]
    NotCapture(String),
    /// The input could not be opened or read.
    #[error("cannot read {name}")]
    Input {
        /// The file, or `standard input`.
        name: String,
        /// What went wrong.
        #[source]
        source: io::Error,
    },
}

impl Failure {
    /// What to try, said after the error's chain (with its own leading
    /// punctuation), for the failures that have a usual fix; else `""`:
    /// where a command takes the credential a server wanted and did not
    /// get, whether a server listens where nothing answered.
    pub fn hint(&self) -> &'static str {
        match self {
            Failure::Run(runloop::client::RunError::NoCredential) => {
                " (pass it with --token-file FILE or RUNLOOP_TOKEN)"
            }
            Failure::Dial(dial) => dial.hint(),
            _ => "",
        }
    }

    /// The failure as a person reads it, on one line: its chain, each
    /// cause once, then its hint.
    pub fn said(&self) -> String {
        format!("{}{}", Chain(self), self.hint())
    }

    /// The exit code: 7 for a refused run, 8 for a time limit, else 2.
    pub fn exit(&self) -> Exit {
        use runloop::client::RunError;
        match self {
            Failure::Run(
                RunError::Refused(_)
                | RunError::NotServed
                | RunError::CredentialRefused
                | RunError::NoCredential
                | RunError::Closed { .. },
            ) => Exit::Refused,
            Failure::TimedOut { .. } => Exit::TimedOut,
            _ => Exit::Failed,
        }
    }

    /// A server that could not be bound at `addr`.
    pub fn bind(addr: impl ToString, error: runloop::server::BindError) -> Failure {
        match error {
            runloop::server::BindError::Listen(source) => Failure::Listen {
                addr: addr.to_string(),
                source,
            },
            // A limit below its minimum: the arguments set it.
            other => Failure::Argument(Chain(&other).to_string()),
        }
    }

    /// Whether this is the reader of our output going away (`runloop … |
    /// head`): the command stops quietly, since nobody is left to tell.
    pub fn is_broken_pipe(&self) -> bool {
        matches!(self, Failure::Output(error) if error.kind() == io::ErrorKind::BrokenPipe)
    }
}

impl From<io::Error> for Failure {
    /// An I/O error while writing the output.
    fn from(error: io::Error) -> Failure {
        Failure::Output(error)
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use runloop_proto::ErrorValue;
    use runloop_proto::run_loop::Broken;

    use super::*;

    #[test]
    fn every_outcome_has_its_code() {
        let cases = [
            (Outcome::Finished { fatal: false }, 0),
            (Outcome::Unfinished(ErrorValue::default()), 1),
            (Outcome::NoLoop(ErrorValue::default()), 3),
            (Outcome::NotServed, 4),
            (Outcome::Broken(Broken::InputEnded), 5),
            (Outcome::Finished { fatal: true }, 6),
        ];
        for (outcome, code) in cases {
            assert_eq!(Exit::of(&outcome).code(), code, "{outcome}");
        }
        assert_eq!(Exit::Failed.code(), 2);
    }

    #[test]
    fn several_channels_report_the_first_that_did_not_finish() {
        assert_eq!(Exit::of_all([]), None);
        assert_eq!(
            Exit::of_all([Exit::Success, Exit::Success]),
            Some(Exit::Success)
        );
        assert_eq!(
            Exit::of_all([Exit::Success, Exit::NotServed, Exit::Broken]),
            Some(Exit::NotServed)
        );
        assert_eq!(Exit::of_all([Exit::Fatal]), Some(Exit::Fatal));
    }

    #[test]
    fn failures_say_what_and_leave_the_cause_to_the_chain() {
        let missing = Failure::Input {
            name: "capture.txt".into(),
            source: io::Error::new(io::ErrorKind::NotFound, "no such file"),
        };
        assert_eq!(missing.to_string(), "cannot read capture.txt");
        assert!(missing.source().is_some());
        assert_eq!(missing.said(), "cannot read capture.txt: no such file");
        assert!(!missing.is_broken_pipe());
        assert!(Failure::from(io::Error::from(io::ErrorKind::BrokenPipe)).is_broken_pipe());
    }

    #[test]
    fn no_failure_says_its_cause_twice() {
        let system = || io::Error::other("no space left on device");
        let refused = crate::dial::DialError::websocket(
            "ws://127.0.0.1:1",
            tokio_tungstenite::tungstenite::Error::Io(io::Error::from(
                io::ErrorKind::ConnectionRefused,
            )),
        );
        let failures = [
            Failure::Dial(refused),
            Failure::Run(runloop::client::RunError::NoCredential),
            Failure::Listen {
                addr: "127.0.0.1:80".into(),
                source: system(),
            },
            Failure::Capture {
                path: "c.txt".into(),
                source: system(),
            },
            Failure::Write {
                name: "out".into(),
                source: system(),
            },
            Failure::Output(system()),
            Failure::Input {
                name: "standard input".into(),
                source: system(),
            },
            Failure::Runtime(system()),
        ];
        for failure in &failures {
            runloop_testkit::errors::assert_cause_said_once(failure);
        }
        assert_eq!(
            failures[0].said(),
            format!(
                "cannot connect to ws://127.0.0.1:1: {}: is a server listening there?",
                io::Error::from(io::ErrorKind::ConnectionRefused)
            )
        );
        assert!(
            failures[1]
                .said()
                .ends_with("none was sent (pass it with --token-file FILE or RUNLOOP_TOKEN)"),
            "{}",
            failures[1].said()
        );
    }
}
