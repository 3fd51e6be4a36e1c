//! `runloop check`: a conformance probe of a provider server, case by case.
//!
//! The check opens runs and run-loop channels on any server that claims to
//! implement protocol §1–§7, sends it well-formed and malformed requests, and
//! reports, one case at a time, what the server did against what docs/protocol.md
//! requires of every server. It is a client, so it can only judge what a
//! client can see: the frames that come back, their order, and whether the
//! connection stays up. That is why "disregarded" is shown with a probe
//! (see the `wire` module) and "nothing follows" with a short wait for stragglers.
//!
//! ```text
//! mod.rs      the arguments, the run of the table, the verdicts
//! cases.rs    the table of cases, one small async function each
//! context.rs  the requests, connections, and what earlier cases learned
//! wire.rs     a raw frame connection with bounded waits, and the probe
//! report.rs   one line (or JSON object) per case, the summary, the exit code
//! ```
//!
//! The happy paths (connect, run, loop) go through the library's client, so
//! the check also proves that the client and the server understand each
//! other; everything a client would never send goes through the raw wire.

mod cases;
mod context;
mod report;
mod wire;

use std::io::Write;
use std::time::Duration;

use runloop_proto::agents_run::ImageRef;
use serde_json::value::RawValue;

use self::context::Ctx;
use self::report::Report;
use self::wire::Wire;
use crate::dial::check_url;
use crate::exit::{Exit, Failure};
use crate::seconds::show as seconds;

/// Arguments of `runloop check`.
#[derive(Debug, clap::Args)]
#[command(after_help = CHECK_HELP)]
pub struct Args {
    /// The provider server to check (`ws://host:port`).
    #[arg(long, env = "RUNLOOP_URL", default_value = "ws://127.0.0.1:7878")]
    pub url: String,
    /// The credential to authorize with. Every local user can read it in
    /// /proc/PID/cmdline: prefer --token-file or RUNLOOP_TOKEN (the
    /// default; empty if unset).
    #[arg(long, value_name = "T")]
    pub token: Option<String>,
    /// A file holding the credential (one line).
    #[arg(long, value_name = "FILE", conflicts_with = "token")]
    pub token_file: Option<std::path::PathBuf>,
    /// The `server` image to run, `NAME[@DIGEST]`; without a digest,
    /// `sha256:` and 64 zeros is sent.
    #[arg(long, value_name = "NAME[@DIGEST]", default_value = "demo", value_parser = crate::run::image)]
    pub image: ImageRef,
    /// The JSON value sent as each run's `agent` (handed to the agent's
    /// registration).
    #[arg(long, value_name = "JSON", default_value = "{}", value_parser = parse_agent)]
    pub agent: Box<RawValue>,
    /// The prompt of the run-loops the check asks for.
    #[arg(long, default_value = "runloop check")]
    pub prompt: String,
    /// How long to wait for each answer, in seconds.
    #[arg(long, value_name = "SECONDS", default_value = "10", value_parser = crate::seconds::parse)]
    pub timeout: Duration,
    /// Also check that a connection that never authorizes is closed
    /// (informational; waits up to 30 s).
    #[arg(long)]
    pub slow: bool,
    /// Print one JSON object per case, then a summary object.
    #[arg(long)]
    pub json: bool,
    /// For wss://, also trust the certificate authorities in FILE (PEM;
    /// repeatable), besides the platform's.
    #[arg(long = "ca", value_name = "FILE")]
    pub authorities: Vec<std::path::PathBuf>,
}

const CHECK_HELP: &str = "\
Each case sends something to the server and compares what comes back with
what protocol §1-§7 requires of every provider server; what §12 calls this
project's policy is never required. FAIL: a MUST does not hold. INFO: an
informational case, or a conformant choice worth knowing (a server that
accepts any credential). SKIP: the case needs something no earlier case could
get (a served connection, a run). Every wait is bounded by --timeout; after a
scope's finish the check also waits 0.25 s for stragglers. Each run asks for
{\"image\":{\"server\":{\"name\",\"digest\"}},\"memory\":1073741824,\"disk\":1073741824,\"agent\"}.

Output: one line per case, 'PASS|FAIL|INFO|SKIP  protocol §N  what: detail', then a
summary line. With --json, one object per case,
{\"case\",\"section\",\"level\":\"must\"|\"info\",\"result\":\"pass\"|\"fail\"|\"info\"|\"skip\",\"detail\"},
then {\"summary\":{\"url\",\"passed\",\"failed\",\"info\",\"skipped\"},\"exit\"}.

Exit codes: 0 every MUST case passed · 1 a MUST case failed · 2 the check
could not be made: bad arguments, the server cannot be reached, or cases were
skipped";

/// How much a case matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Level {
    /// docs/protocol.md requires it of every server: failing it fails the check.
    Must,
    /// Worth knowing, never a failure.
    Info,
}

impl Level {
    fn name(self) -> &'static str {
        match self {
            Level::Must => "must",
            Level::Info => "info",
        }
    }
}

/// What a case found, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Verdict {
    /// It holds.
    Pass(String),
    /// Conformant, and worth knowing; or what an informational case saw.
    Info(String),
    /// It does not hold.
    Fail(String),
    /// It could not be tried.
    Skip(String),
}

impl Verdict {
    fn detail(&self) -> &str {
        match self {
            Verdict::Pass(detail)
            | Verdict::Info(detail)
            | Verdict::Fail(detail)
            | Verdict::Skip(detail) => detail,
        }
    }

    /// The same verdict, its detail prefixed with where it was found.
    fn context(self, prefix: &str) -> Verdict {
        let with = |detail: String| format!("{prefix}: {detail}");
        match self {
            Verdict::Pass(detail) => Verdict::Pass(with(detail)),
            Verdict::Info(detail) => Verdict::Info(with(detail)),
            Verdict::Fail(detail) => Verdict::Fail(with(detail)),
            Verdict::Skip(detail) => Verdict::Skip(with(detail)),
        }
    }
}

/// A case's result: `Err` ends the case early with its verdict, so that
/// `?` can be used on every step; `Ok` is the verdict at the end.
type Checked<T = Verdict> = Result<T, Verdict>;

impl Args {
    /// Checks the server and prints the report to `out`.
    pub fn execute(&self, out: &mut impl Write) -> Result<Exit, Failure> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(Failure::Runtime)?;
        runtime.block_on(self.check(out))
    }

    async fn check(&self, out: &mut impl Write) -> Result<Exit, Failure> {
        let token = crate::token::client(self.token.as_deref(), self.token_file.as_deref())?;
        if self.token.is_some() {
            crate::token::warn_command_line();
        }
        // A server that cannot be reached at all is not a failing case: the
        // check itself could not run.
        check_url(&self.url).map_err(Failure::Dial)?;
        let tls = crate::process::client_tls(&self.authorities)?;
        match Wire::dial(&self.url, tls.as_ref(), self.timeout).await {
            Ok(wire) => wire.close().await,
            Err(error) => return Err(Failure::Dial(error)),
        }
        let mut ctx = Ctx::new(self, token, tls);
        let mut report = Report::new(out, self.json);
        let cases: Vec<&cases::Case> = cases::CASES
            .iter()
            .filter(|case| self.slow || !case.slow)
            .collect();
        for (done, case) in cases.iter().enumerate() {
            let verdict = match (case.run)(&mut ctx).await {
                Ok(verdict) | Err(verdict) => verdict,
            };
            report.case(case, verdict)?;
            if ctx.no_connection() {
                // Every case left needs what is missing, or would only
                // show the same thing again: one line says it.
                report.not_run(cases.len() - done - 1);
                break;
            }
        }
        ctx.close().await;
        Ok(report.summary(&self.url)?)
    }
}

/// Any JSON value, kept as it was written.
fn parse_agent(text: &str) -> Result<Box<RawValue>, String> {
    RawValue::from_string(text.to_owned()).map_err(|error| format!("not JSON: {error}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agents_are_any_json_kept_as_written() {
        let agent = parse_agent("{ \"model\" : 1.50 }").expect("JSON");
        assert_eq!(agent.get(), "{ \"model\" : 1.50 }");
        assert!(parse_agent("{").is_err());
    }

    #[test]
    fn context_prefixes_the_detail_and_keeps_the_kind() {
        let verdict = Verdict::Fail("expected x, got y".into()).context("request [0]{");
        assert_eq!(
            verdict,
            Verdict::Fail("request [0]{: expected x, got y".into())
        );
        assert_eq!(verdict.detail(), "request [0]{: expected x, got y");
    }

    #[test]
    fn case_names_and_sections_are_unique_and_well_formed() {
        let mut names = std::collections::HashSet::new();
        for case in cases::CASES {
            assert!(names.insert(case.name), "{} twice", case.name);
            assert!(case.section.starts_with('§'), "{}", case.section);
            assert!(!case.name.ends_with('.'), "{}", case.name);
            assert_eq!(case.slow, case.level == Level::Info, "{}", case.name);
        }
    }
}
