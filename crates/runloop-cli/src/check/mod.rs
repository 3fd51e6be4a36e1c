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

use runloop_proto::agents_run::{ImageRef, is_valid_digest, is_valid_name};
use serde_json::value::RawValue;

use self::context::Ctx;
use self::report::Report;
use self::wire::Wire;
use crate::exit::{Exit, Failure};

/// Arguments of `runloop check`.
#[derive(Debug, clap::Args)]
#[command(after_help = CHECK_HELP)]
pub struct Args {
    /// The provider server to check (`ws://host:port`).
    #[arg(long, default_value = "ws://127.0.0.1:7878")]
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
    #[arg(long, value_name = "NAME[@DIGEST]", default_value = "demo", value_parser = parse_image)]
    pub image: ImageRef,
    /// The JSON value sent as each run's `agent` (handed to the agent's
    /// registration).
    #[arg(long, value_name = "JSON", default_value = "{}", value_parser = parse_agent)]
    pub agent: Box<RawValue>,
    /// The prompt of the run-loops the check asks for.
    #[arg(long, default_value = "runloop check")]
    pub prompt: String,
    /// How long to wait for each answer, in seconds.
    #[arg(long, value_name = "SECONDS", default_value = "10", value_parser = parse_seconds)]
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
        let tls = crate::process::client_tls(&self.authorities)?;
        match Wire::dial(&self.url, tls.as_ref(), self.timeout).await {
            Ok(wire) => wire.close().await,
            Err(source) => {
                return Err(Failure::Connect {
                    url: self.url.clone(),
                    source,
                });
            }
        }
        let mut ctx = Ctx::new(self, token, tls);
        let mut report = Report::new(out, self.json);
        for case in cases::CASES.iter().filter(|case| self.slow || !case.slow) {
            let verdict = match (case.run)(&mut ctx).await {
                Ok(verdict) | Err(verdict) => verdict,
            };
            report.case(case, verdict)?;
        }
        ctx.close().await;
        Ok(report.summary(&self.url)?)
    }
}

/// A duration in words: `10 s`, `0.25 s`.
fn seconds(duration: Duration) -> String {
    format!("{} s", duration.as_secs_f64())
}

/// `NAME[@DIGEST]`, the digest `sha256:` and 64 zeros when absent.
fn parse_image(text: &str) -> Result<ImageRef, String> {
    let (name, digest) = match text.split_once('@') {
        Some((name, digest)) => (name.to_owned(), digest.to_owned()),
        None => (text.to_owned(), format!("sha256:{}", "0".repeat(64))),
    };
    if !is_valid_name(&name) {
        return Err(format!(
            "{name:?} is not an image name (a repository path without a host)"
        ));
    }
    if !is_valid_digest(&digest) {
        return Err(format!("{digest:?} is not a digest (<algorithm>:<hex>)"));
    }
    Ok(ImageRef { name, digest })
}

/// Any JSON value, kept as it was written.
fn parse_agent(text: &str) -> Result<Box<RawValue>, String> {
    RawValue::from_string(text.to_owned()).map_err(|error| format!("not JSON: {error}"))
}

/// Seconds, whole or decimal, optionally followed by `s`; more than zero.
fn parse_seconds(text: &str) -> Result<Duration, String> {
    let number = text.strip_suffix('s').unwrap_or(text).trim();
    let seconds: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a number of seconds"))?;
    if seconds <= 0.0 {
        return Err("the timeout must be more than zero seconds".to_owned());
    }
    Duration::try_from_secs_f64(seconds).map_err(|error| format!("{text:?}: {error}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_take_a_default_digest_and_are_checked() {
        let image = parse_image("demo").expect("a name");
        assert_eq!(image.name, "demo");
        assert_eq!(image.digest, format!("sha256:{}", "0".repeat(64)));
        let digest = format!("sha256:{}", "ab".repeat(32));
        let image = parse_image(&format!("agents/demo@{digest}")).expect("name and digest");
        assert_eq!((image.name.as_str(), image.digest), ("agents/demo", digest));
        assert!(parse_image("Demo").is_err());
        assert!(parse_image("demo@sha256:xyz").is_err());
        assert!(parse_image("registry.example:5000/demo").is_err());
    }

    #[test]
    fn timeouts_are_positive_seconds() {
        assert_eq!(parse_seconds("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_seconds("0.5s"), Ok(Duration::from_millis(500)));
        for bad in ["0", "-1", "ten", "NaN", "inf", ""] {
            assert!(parse_seconds(bad).is_err(), "{bad}");
        }
        assert_eq!(seconds(Duration::from_millis(250)), "0.25 s");
        assert_eq!(seconds(Duration::from_secs(10)), "10 s");
    }

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
