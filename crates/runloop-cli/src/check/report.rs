//! The check's report: one line per case as it finishes, then a summary and
//! the exit code.
//!
//! Lines are written and flushed as each case ends, since a case may wait
//! for as long as the timeout and a person watching should see progress.
//!
//! ```text
//! PASS  protocol §4   unknown endpoint tag 200 gets a bare finish
//! FAIL  protocol §7   a run-loop's response sequence is valid: broken after 1 chunks: a response came after the error
//! INFO  protocol §3   a wrong credential: …: the server accepts any credential: …
//! SKIP  protocol §6   …: needs a run, and none could be opened: …
//! ws://127.0.0.1:7878: 24 passed, 1 failed, 1 info, 2 skipped: a MUST of docs/protocol.md does not hold
//!
//! --json:
//! {"case":"…","section":"§4","level":"must","result":"pass","detail":""}
//! {"summary":{"url":"…","passed":24,"failed":1,"info":1,"skipped":2,"not_run":0},"exit":1}
//! ```
//!
//! When no connection can be served (a refused credential, a server gone),
//! the check stops after the case that found it: that case's line, then the
//! summary, which counts the cases left out as "not run", instead of a
//! line per case that could only say the same thing.

use std::io::{self, Write};

use serde_json::json;

use super::cases::Case;
use super::{Level, Verdict};
use crate::exit::Exit;

/// How many cases ended each way.
#[derive(Debug, Default)]
struct Counts {
    passed: usize,
    failed: usize,
    info: usize,
    skipped: usize,
    /// Cases left out after the check found it could not go on.
    not_run: usize,
}

/// Writes the report to `W`.
pub(super) struct Report<W> {
    out: W,
    json: bool,
    counts: Counts,
}

impl<W: Write> Report<W> {
    pub(super) fn new(out: W, json: bool) -> Self {
        Report {
            out,
            json,
            counts: Counts::default(),
        }
    }

    /// One case's line. An informational case never fails nor counts as
    /// skipped: whatever it found is reported as INFO.
    pub(super) fn case(&mut self, case: &Case, verdict: Verdict) -> io::Result<()> {
        let verdict = match case.level {
            Level::Info => Verdict::Info(verdict.detail().to_owned()),
            Level::Must => verdict,
        };
        let (result, counter) = match verdict {
            Verdict::Pass(_) => ("pass", &mut self.counts.passed),
            Verdict::Fail(_) => ("fail", &mut self.counts.failed),
            Verdict::Info(_) => ("info", &mut self.counts.info),
            Verdict::Skip(_) => ("skip", &mut self.counts.skipped),
        };
        *counter += 1;
        let detail = verdict.detail();
        if self.json {
            let line = json!({
                "case": case.name,
                "section": case.section,
                "level": case.level.name(),
                "result": result,
                "detail": detail,
            });
            serde_json::to_writer(&mut self.out, &line)?;
            self.out.write_all(b"\n")?;
        } else {
            write!(
                self.out,
                "{:<4}  protocol {:<4} {}",
                result.to_uppercase(),
                case.section,
                case.name
            )?;
            if !detail.is_empty() {
                write!(self.out, ": {detail}")?;
            }
            self.out.write_all(b"\n")?;
        }
        self.out.flush()
    }

    /// Notes the cases left out when the check cannot go on; the summary
    /// counts them, and no line is printed for each.
    pub(super) fn not_run(&mut self, cases: usize) {
        self.counts.not_run += cases;
    }

    /// The summary, and the exit code: 1 when a MUST case failed, else 2
    /// when a case was skipped or not run (the check is incomplete), else 0.
    pub(super) fn summary(mut self, url: &str) -> io::Result<Exit> {
        let Counts {
            passed,
            failed,
            info,
            skipped,
            not_run,
        } = self.counts;
        let (exit, verdict) = if failed > 0 {
            (
                Exit::NONCONFORMANT,
                "a MUST of docs/protocol.md does not hold",
            )
        } else if not_run > 0 {
            (
                Exit::Failed,
                "the check could not be made: no connection is served (see above)",
            )
        } else if skipped > 0 {
            (
                Exit::Failed,
                "the check is incomplete: some cases could not be tried",
            )
        } else {
            (Exit::Success, "every MUST case holds")
        };
        if self.json {
            let line = json!({
                "summary": {
                    "url": url,
                    "passed": passed,
                    "failed": failed,
                    "info": info,
                    "skipped": skipped,
                    "not_run": not_run,
                },
                "exit": exit.code(),
            });
            serde_json::to_writer(&mut self.out, &line)?;
            self.out.write_all(b"\n")?;
        } else {
            write!(
                self.out,
                "{url}: {passed} passed, {failed} failed, {info} info, {skipped} skipped"
            )?;
            if not_run > 0 {
                write!(self.out, ", {not_run} not run")?;
            }
            writeln!(self.out, ": {verdict}")?;
        }
        self.out.flush()?;
        Ok(exit)
    }
}
