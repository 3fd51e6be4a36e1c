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
//!
//! A run's budget bounds one run; a tenant with many runs would still
//! fill the log many times over (eight flooding runs wrote 8.9 MB in
//! 1.9 s). So every run of one tenant also draws on one bucket of bytes,
//! the tenant's log rate ([`TenantLog`], protocol §12 "fair shares"): a
//! line is logged only when both its run's budget and its tenant's
//! bucket have room, and each line costs the bucket its length and
//! [`LINE_COST`] more, the log line's own timestamp, level and fields, so
//! that many short lines cost what they take of the log. What either
//! drops is counted in the run's "suppressed" line, which says which
//! bound it was, and in the process-wide
//! `runloop_agent_log_dropped_lines_total`.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock, Weak};
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

/// What a tenant's bucket charges a logged line beside its bytes: about
/// what the log line adds to them (time, level, target, program, pid,
/// stream).
pub const LINE_COST: u64 = 128;

/// One tenant's log rate: a bucket of bytes, as many as a second's rate
/// at most and refilled evenly, that every run of the tenant in this
/// process draws on. Made by [`TenantLog::of`], one per tenant name for as
/// long as one of its runs holds it.
#[derive(Debug, Clone)]
pub struct TenantLog {
    name: Arc<str>,
    bucket: Arc<Mutex<Bucket>>,
}

/// A tenant's bucket of bytes.
#[derive(Debug)]
struct Bucket {
    /// Bytes a second, and the most it holds.
    rate: u64,
    /// Bytes in it now.
    bytes: f64,
    /// When it was last refilled.
    at: Instant,
}

impl Bucket {
    /// Takes `cost` bytes if it holds them.
    fn take(&mut self, cost: u64, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.at = now;
        self.bytes = (self.bytes + elapsed * self.rate as f64).min(self.rate as f64);
        if self.bytes >= cost as f64 {
            self.bytes -= cost as f64;
            true
        } else {
            false
        }
    }
}

/// Every tenant's bucket, by name, while a run holds it.
type Buckets = Mutex<HashMap<Arc<str>, Weak<Mutex<Bucket>>>>;

/// This process's [`Buckets`].
fn buckets() -> &'static Buckets {
    static BUCKETS: OnceLock<Buckets> = OnceLock::new();
    BUCKETS.get_or_init(Mutex::default)
}

impl TenantLog {
    /// The log rate of tenant `name`: `rate` bytes a second for all its
    /// runs together, shared with every other run of it that holds one
    /// (the rate of the latest applies to all: a reload that changes it
    /// reaches the runs already there).
    pub fn of(name: &Arc<str>, rate: u64) -> TenantLog {
        let mut all = buckets()
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        all.retain(|_, bucket| bucket.strong_count() > 0);
        let bucket = match all.get(name).and_then(Weak::upgrade) {
            Some(bucket) => {
                bucket
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .rate = rate;
                bucket
            }
            None => {
                let bucket = Arc::new(Mutex::new(Bucket {
                    rate,
                    bytes: rate as f64,
                    at: Instant::now(),
                }));
                all.insert(Arc::clone(name), Arc::downgrade(&bucket));
                bucket
            }
        };
        TenantLog {
            name: Arc::clone(name),
            bucket,
        }
    }

    /// The tenant's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its rate, bytes a second.
    pub fn rate(&self) -> u64 {
        self.lock().rate
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Bucket> {
        self.bucket
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Whether a line of `len` bytes may be logged now (and if so, it is
    /// paid for).
    fn take(&self, len: usize, now: Instant) -> bool {
        self.lock().take(len as u64 + LINE_COST, now)
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
    /// Of the dropped lines, those its tenant's rate dropped.
    dropped_by_tenant: u64,
}

/// Lines and bytes dropped in a window that is over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Dropped {
    lines: u64,
    bytes: u64,
    /// Of the lines, those its tenant's rate dropped.
    by_tenant: u64,
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
            dropped_by_tenant: 0,
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
            by_tenant: self.dropped_by_tenant,
        };
        *self = Budget::new(self.limit, now);
        (dropped.lines > 0).then_some(dropped)
    }

    /// What the current window dropped so far, now reported.
    fn take_dropped(&mut self) -> Option<Dropped> {
        let dropped = Dropped {
            lines: std::mem::take(&mut self.dropped_lines),
            bytes: std::mem::take(&mut self.dropped_bytes),
            by_tenant: std::mem::take(&mut self.dropped_by_tenant),
        };
        (dropped.lines > 0).then_some(dropped)
    }

    /// Whether a line of `len` bytes is logged: it fits this budget and
    /// `tenant`'s bucket has room for it (else it is counted as dropped).
    fn admit(&mut self, len: usize, tenant: Option<&TenantLog>, now: Instant) -> bool {
        let bytes = len as u64;
        let fits = self.lines < self.limit.lines && self.bytes + bytes <= self.limit.bytes;
        let paid = fits && tenant.is_none_or(|tenant| tenant.take(len, now));
        if paid {
            self.lines += 1;
            self.bytes += bytes;
            return true;
        }
        self.dropped_lines += 1;
        self.dropped_bytes += bytes;
        if fits {
            self.dropped_by_tenant += 1;
        }
        runloop_metrics::AGENT_LOG_DROPPED_LINES.fetch_add(1, Ordering::Relaxed);
        false
    }

    /// When the current window ends, if it has dropped lines to report.
    fn report_due(&self) -> Option<Instant> {
        (self.dropped_lines > 0).then_some(self.start + self.limit.window)
    }
}

/// Where a run's lines are logged from, the budget its pipes share, and
/// its tenant's log rate.
#[derive(Debug, Clone)]
struct Source {
    program: Arc<str>,
    pid: u32,
    budget: Arc<Mutex<Budget>>,
    tenant: Option<TenantLog>,
}

impl Source {
    fn budget(&self) -> std::sync::MutexGuard<'_, Budget> {
        self.budget
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn report(&self, dropped: Dropped) {
        let limit = self.budget().limit;
        let tenant = match &self.tenant {
            Some(tenant) if dropped.by_tenant > 0 => format!(
                "; {} of them over tenant {}'s log rate of {} bytes a second",
                dropped.by_tenant,
                tenant.name(),
                tenant.rate()
            ),
            _ => String::new(),
        };
        warn!(
            target: "runloop::agent_program",
            program = %self.program,
            pid = self.pid,
            "{} lines ({} bytes) of output suppressed: over {} lines or {} bytes per {:?}{tenant}",
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
            let now = Instant::now();
            let mut budget = self.budget();
            let dropped = budget.roll(now);
            (dropped, budget.admit(line.len(), self.tenant.as_ref(), now))
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
/// naming `program` and `pid`, within `limit` for both together and
/// `tenant`'s log rate with the tenant's other runs; the tasks that do it.
pub fn log_output(
    child: &mut Child,
    program: Arc<str>,
    pid: u32,
    limit: OutputLimit,
    tenant: Option<TenantLog>,
) -> Vec<JoinHandle<()>> {
    let source = Source {
        program,
        pid,
        budget: Arc::new(Mutex::new(Budget::new(limit, Instant::now()))),
        tenant,
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

    impl Budget {
        fn admit_alone(&mut self, len: usize) -> bool {
            self.admit(len, None, Instant::now())
        }
    }

    #[test]
    fn a_tenant_s_runs_share_one_rate_and_its_drops_are_named() {
        let name: Arc<str> = Arc::from("alice-log-test");
        let limit = OutputLimit::default();
        let start = Instant::now();
        let (one, two) = (TenantLog::of(&name, 1000), TenantLog::of(&name, 1000));
        let (mut a, mut b) = (Budget::new(limit, start), Budget::new(limit, start));
        // 1000 bytes a second: three lines of 200 (328 each with their
        // cost) from two runs together, not a fourth.
        assert!(a.admit(200, Some(&one), start));
        assert!(b.admit(200, Some(&two), start));
        assert!(a.admit(200, Some(&one), start));
        assert!(!b.admit(200, Some(&two), start));
        assert_eq!(b.dropped_by_tenant, 1);
        // Half a second later the bucket holds 500 more.
        let later = start + Duration::from_millis(500);
        assert!(b.admit(200, Some(&two), later));
        assert!(!a.admit(200, Some(&one), later));
        assert_eq!(
            a.take_dropped(),
            Some(Dropped {
                lines: 1,
                bytes: 200,
                by_tenant: 1
            })
        );
        // Another tenant has a bucket of its own.
        let bob = TenantLog::of(&Arc::from("bob-log-test"), 1000);
        assert!(a.admit(200, Some(&bob), later));
        // A rate of zero logs nothing; a run's own budget still holds.
        let mute = TenantLog::of(&Arc::from("mute-log-test"), 0);
        assert!(!a.admit(1, Some(&mute), later));
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
        assert!(budget.admit_alone(10));
        assert!(budget.admit_alone(80));
        assert!(!budget.admit_alone(20), "110 bytes is over 100");
        assert!(budget.admit_alone(10));
        assert!(!budget.admit_alone(1), "a fourth line is over 3");
        assert_eq!(budget.report_due(), Some(start + limit.window));
        assert_eq!(budget.roll(start + Duration::from_secs(9)), None);
        assert_eq!(
            budget.roll(start + Duration::from_secs(10)),
            Some(Dropped {
                lines: 2,
                bytes: 21,
                by_tenant: 0
            })
        );
        assert!(budget.admit_alone(100), "a new window");
        assert_eq!(budget.report_due(), None);
        assert!(!budget.admit_alone(1));
        assert_eq!(
            budget.take_dropped(),
            Some(Dropped {
                lines: 1,
                bytes: 1,
                by_tenant: 0
            })
        );
        assert_eq!(budget.take_dropped(), None, "reported once");
        assert_eq!(budget.roll(start + Duration::from_secs(30)), None);
    }
}
