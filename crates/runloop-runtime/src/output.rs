//! Agent program output: a child's stdout and stderr, logged line by line
//! (target `runloop::agent_program`) within a budget per run, shared by
//! the runtimes that start processes.
//!
//! A line is bounded ([`MAX_LINE`]): a program that writes without
//! newlines is logged in pieces instead of growing a buffer, and bytes
//! that are not UTF-8 are replaced rather than dropped.
//!
//! The log is the operator's disk, and an agent program is someone else's
//! code: a run's two pipes share one [`OutputLimit`], so many lines and
//! bytes per window, and what is over it is read (the program never
//! blocks on a full pipe) and counted but not logged. Once the window in
//! which lines were dropped is over, one warning says how many; when the
//! program goes quiet it still comes at the window's end, and when its
//! pipes end, at once.
//!
//! ```text
//! stdout ─┐                     ┌─ within the budget: one log line each
//!         ├─ lines ─▶ budget ───┤
//! stderr ─┘   (≤ MAX_LINE)      └─ over it: counted ─▶ "N lines (B bytes) suppressed" per window
//! ```

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::Child;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, info, warn};

/// Text from outside (a caller, a registry, an agent program) made safe to
/// write into a line of a text log: every control character — C0 (`\n`,
/// `\r`, NUL, ESC…), DEL, C1, and the Unicode line and paragraph separators
/// — written as an escape (`\n`, `\r`, `\t`, else `\u00XX`), as the JSON
/// log format writes it, so that no value can end a line or start one that
/// looks like the server's own, nor rewrite a terminal. The text log's
/// field formatter writes every field and message through it.
#[derive(Debug, Clone, Copy)]
pub struct Escaped<'a>(pub &'a str);

impl std::fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut rest = self.0;
        while let Some(at) = rest.find(|c: char| is_escaped(c)) {
            f.write_str(&rest[..at])?;
            let c = rest[at..].chars().next().unwrap_or_default();
            match c {
                '\n' => f.write_str("\\n")?,
                '\r' => f.write_str("\\r")?,
                '\t' => f.write_str("\\t")?,
                other => write!(f, "\\u{:04x}", u32::from(other))?,
            }
            rest = &rest[at + c.len_utf8()..];
        }
        f.write_str(rest)
    }
}

/// Whether [`Escaped`] writes `c` as an escape.
fn is_escaped(c: char) -> bool {
    c.is_control() || c == '\u{2028}' || c == '\u{2029}'
}

/// The longest stdout or stderr line logged as one; longer ones are split.
pub const MAX_LINE: usize = 16 << 10;

/// How much of one run's output is logged, per window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputLimit {
    /// Lines logged per window, at most.
    pub lines: u64,
    /// Bytes logged per window, at most.
    pub bytes: u64,
    /// The window.
    pub window: Duration,
}

impl Default for OutputLimit {
    /// 1000 lines and 1 MiB per 10 s: a program's start-up, a traceback,
    /// a line per request, and at most 100 KiB/s of log for a run that
    /// floods it.
    fn default() -> OutputLimit {
        OutputLimit {
            lines: 1000,
            bytes: 1 << 20,
            window: Duration::from_secs(10),
        }
    }
}

/// What a run may still log in the current window, and what it dropped.
#[derive(Debug)]
struct Budget {
    limit: OutputLimit,
    start: Instant,
    lines: u64,
    bytes: u64,
    dropped_lines: u64,
    dropped_bytes: u64,
}

/// Lines and bytes dropped in a window that is over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Dropped {
    lines: u64,
    bytes: u64,
}

impl Budget {
    fn new(limit: OutputLimit, now: Instant) -> Budget {
        Budget {
            limit,
            start: now,
            lines: 0,
            bytes: 0,
            dropped_lines: 0,
            dropped_bytes: 0,
        }
    }

    /// Starts a new window if the current one is over; what the old one
    /// dropped.
    fn roll(&mut self, now: Instant) -> Option<Dropped> {
        if now < self.start + self.limit.window {
            return None;
        }
        let dropped = Dropped {
            lines: self.dropped_lines,
            bytes: self.dropped_bytes,
        };
        *self = Budget::new(self.limit, now);
        (dropped.lines > 0).then_some(dropped)
    }

    /// What the current window dropped so far, now reported.
    fn take_dropped(&mut self) -> Option<Dropped> {
        let dropped = Dropped {
            lines: std::mem::take(&mut self.dropped_lines),
            bytes: std::mem::take(&mut self.dropped_bytes),
        };
        (dropped.lines > 0).then_some(dropped)
    }

    /// Whether a line of `len` bytes is logged (else it is counted as
    /// dropped).
    fn admit(&mut self, len: usize) -> bool {
        let len = len as u64;
        if self.lines < self.limit.lines && self.bytes + len <= self.limit.bytes {
            self.lines += 1;
            self.bytes += len;
            true
        } else {
            self.dropped_lines += 1;
            self.dropped_bytes += len;
            false
        }
    }

    /// When the current window ends, if it has dropped lines to report.
    fn report_due(&self) -> Option<Instant> {
        (self.dropped_lines > 0).then_some(self.start + self.limit.window)
    }
}

/// Where a run's lines are logged from, and the budget its pipes share.
#[derive(Debug, Clone)]
struct Source {
    program: Arc<str>,
    pid: u32,
    budget: Arc<Mutex<Budget>>,
}

impl Source {
    fn budget(&self) -> std::sync::MutexGuard<'_, Budget> {
        self.budget
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn report(&self, dropped: Dropped) {
        let limit = self.budget().limit;
        warn!(
            target: "runloop::agent_program",
            program = %self.program,
            pid = self.pid,
            "{} lines ({} bytes) of output suppressed: over {} lines or {} bytes per {:?}",
            dropped.lines,
            dropped.bytes,
            limit.lines,
            limit.bytes,
            limit.window
        );
    }

    /// Logs `line` if the budget has room; reports a window that is over.
    fn line(&self, line: &[u8], stream: &'static str) {
        let (dropped, admitted) = {
            let mut budget = self.budget();
            let dropped = budget.roll(Instant::now());
            (dropped, budget.admit(line.len()))
        };
        if let Some(dropped) = dropped {
            self.report(dropped);
        }
        if admitted {
            let text = String::from_utf8_lossy(line);
            info!(target: "runloop::agent_program", program = %self.program, pid = self.pid, stream, "{}", text.trim_end_matches(['\n', '\r']));
        }
    }

    /// Reports the window if it is over and dropped lines.
    fn tick(&self) {
        let dropped = self.budget().roll(Instant::now());
        if let Some(dropped) = dropped {
            self.report(dropped);
        }
    }

    /// Reports what was dropped and not reported yet (a pipe's end).
    fn flush(&self) {
        let dropped = self.budget().take_dropped();
        if let Some(dropped) = dropped {
            self.report(dropped);
        }
    }
}

/// Logs a child's stdout and stderr (whichever are piped) until they end,
/// naming `program` and `pid`, within `limit` for both together; the
/// tasks that do it.
pub fn log_output(
    child: &mut Child,
    program: Arc<str>,
    pid: u32,
    limit: OutputLimit,
) -> Vec<JoinHandle<()>> {
    let source = Source {
        program,
        pid,
        budget: Arc::new(Mutex::new(Budget::new(limit, Instant::now()))),
    };
    let mut tasks = Vec::new();
    if let Some(out) = child.stdout.take() {
        tasks.push(tokio::spawn(log_lines(out, source.clone(), "stdout")));
    }
    if let Some(err) = child.stderr.take() {
        tasks.push(tokio::spawn(log_lines(err, source, "stderr")));
    }
    tasks
}

/// Logs one pipe line by line until it ends; lines over [`MAX_LINE`]
/// bytes are logged in pieces, bytes that are not UTF-8 are replaced.
async fn log_lines(pipe: impl AsyncRead + Unpin, source: Source, stream: &'static str) {
    let mut reader = BufReader::with_capacity(64 << 10, pipe);
    let mut line = Vec::new();
    // One timer for the report of a window that dropped lines, set when
    // the window first drops one.
    let report = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(report);
    let mut armed = None;
    loop {
        let due = source.budget().report_due();
        if due != armed {
            if let Some(due) = due {
                report.as_mut().reset(due);
            }
            armed = due;
        }
        let buffer = tokio::select! {
            read = reader.fill_buf() => match read {
                Ok([]) => break,
                Ok(buffer) => buffer,
                Err(error) => {
                    debug!(pid = source.pid, stream, %error, "pipe read failed");
                    break;
                }
            },
            () = &mut report, if armed.is_some() => {
                source.tick();
                continue;
            }
        };
        // Every line the buffer ends; `line` is emitted whenever it is
        // full, so there is always room.
        let mut used = 0;
        while used < buffer.len() {
            let rest = &buffer[used..];
            let room = MAX_LINE - line.len();
            let newline = memchr::memchr(b'\n', &rest[..rest.len().min(room)]);
            let take = newline.map_or(rest.len().min(room), |end| end + 1);
            line.extend_from_slice(&rest[..take]);
            used += take;
            if newline.is_some() || line.len() == MAX_LINE {
                source.line(&line, stream);
                line.clear();
            }
        }
        reader.consume(used);
    }
    if !line.is_empty() {
        source.line(&line, stream);
    }
    source.flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaped_text_holds_no_control_character() {
        let mut all = String::from("a");
        for c in (0u32..0x20).chain(0x7f..0xa0).chain([0x2028, 0x2029]) {
            all.push(char::from_u32(c).expect("a char"));
        }
        all.push_str("é\\z");
        let escaped = Escaped(&all).to_string();
        assert!(!escaped.chars().any(is_escaped), "{escaped:?}");
        assert!(escaped.starts_with("a\\u0000\\u0001"), "{escaped}");
        assert!(escaped.contains("\\t\\n\\u000b\\u000c\\r"), "{escaped}");
        assert!(
            escaped.contains("\\u001b") && escaped.contains("\\u009f"),
            "{escaped}"
        );
        assert!(escaped.ends_with("\\u2028\\u2029é\\z"), "{escaped}");
        assert_eq!(Escaped("plain text").to_string(), "plain text");
    }

    #[test]
    fn a_budget_admits_lines_and_bytes_up_to_its_limit_per_window() {
        let limit = OutputLimit {
            lines: 3,
            bytes: 100,
            window: Duration::from_secs(10),
        };
        let start = Instant::now();
        let mut budget = Budget::new(limit, start);
        assert!(budget.admit(10));
        assert!(budget.admit(80));
        assert!(!budget.admit(20), "110 bytes is over 100");
        assert!(budget.admit(10));
        assert!(!budget.admit(1), "a fourth line is over 3");
        assert_eq!(budget.report_due(), Some(start + limit.window));
        assert_eq!(budget.roll(start + Duration::from_secs(9)), None);
        assert_eq!(
            budget.roll(start + Duration::from_secs(10)),
            Some(Dropped {
                lines: 2,
                bytes: 21
            })
        );
        assert!(budget.admit(100), "a new window");
        assert_eq!(budget.report_due(), None);
        assert!(!budget.admit(1));
        assert_eq!(budget.take_dropped(), Some(Dropped { lines: 1, bytes: 1 }));
        assert_eq!(budget.take_dropped(), None, "reported once");
        assert_eq!(budget.roll(start + Duration::from_secs(30)), None);
    }
}
