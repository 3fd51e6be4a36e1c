//! The refusal log: lines about connections turned away or refused, rate
//! limited per address, with an "N lines suppressed" summary per window.
//!
//! Every refusal is worth a line to an operator, but a caller can cause
//! them as fast as it can connect, and the log is the operator's disk. So
//! each address may log [`RefusalLog::LINES`] refusal lines per window;
//! past that its lines are counted, and once the window is over one line
//! says how many were suppressed — on the address's next refusal, or from
//! the server's periodic sweep ([`RefusalLog::sweep`]) when it goes quiet.
//! The addresses remembered are bounded too: past [`MAX_ADDRESSES`], the
//! rest share one entry.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tracing::warn;

/// Addresses remembered at once; the rest share one entry.
const MAX_ADDRESSES: usize = 4096;

/// One address's lines in its current window.
#[derive(Debug)]
struct Window {
    started: Instant,
    logged: u64,
    suppressed: u64,
}

/// Refusal lines per address, rate limited.
#[derive(Debug)]
pub(crate) struct RefusalLog {
    window: Duration,
    /// `None`: connections with no address, and addresses past
    /// [`MAX_ADDRESSES`].
    windows: Mutex<HashMap<Option<IpAddr>, Window>>,
}

impl RefusalLog {
    /// Lines one address may log per window.
    pub(crate) const LINES: u64 = 10;
    /// The window.
    pub(crate) const WINDOW: Duration = Duration::from_secs(10);

    pub(crate) fn new() -> RefusalLog {
        RefusalLog {
            window: Self::WINDOW,
            windows: Mutex::new(HashMap::new()),
        }
    }

    /// Whether a refusal line of `address` may be logged now; when not, it
    /// is counted. A summary of the window before is logged first.
    pub(crate) fn allows(&self, address: Option<IpAddr>) -> bool {
        let now = Instant::now();
        let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        let key = if windows.len() >= MAX_ADDRESSES && !windows.contains_key(&address) {
            None
        } else {
            address
        };
        let window = windows.entry(key).or_insert(Window {
            started: now,
            logged: 0,
            suppressed: 0,
        });
        if now.duration_since(window.started) >= self.window {
            summarize(key, window);
            *window = Window {
                started: now,
                logged: 0,
                suppressed: 0,
            };
        }
        if window.logged < Self::LINES {
            window.logged += 1;
            true
        } else {
            window.suppressed += 1;
            false
        }
    }

    /// Logs the summary of every window that is over and forgets its
    /// address. The server calls it once per window.
    pub(crate) fn sweep(&self) {
        let now = Instant::now();
        let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        windows.retain(|key, window| {
            let over = now.duration_since(window.started) >= self.window;
            if over {
                summarize(*key, window);
            }
            !over
        });
    }
}

/// The "N lines suppressed" line of a window, if it suppressed any.
fn summarize(address: Option<IpAddr>, window: &Window) {
    if window.suppressed == 0 {
        return;
    }
    let suppressed = window.suppressed;
    match address {
        Some(address) => warn!(%address, suppressed, "refusal lines suppressed"),
        None => warn!(suppressed, "refusal lines suppressed (other addresses)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_address_logs_a_few_lines_per_window() {
        let log = RefusalLog {
            window: Duration::from_millis(500),
            windows: Mutex::new(HashMap::new()),
        };
        let one = Some(IpAddr::from([127, 0, 0, 1]));
        let two = Some(IpAddr::from([127, 0, 0, 2]));
        let allowed = (0..100).filter(|_| log.allows(one)).count();
        assert_eq!(allowed, RefusalLog::LINES as usize);
        assert!(log.allows(two), "another address has its own lines");
        std::thread::sleep(log.window);
        assert!(log.allows(one), "a new window");
        log.sweep();
        std::thread::sleep(log.window);
        log.sweep();
        assert!(log.windows.lock().expect("lock").is_empty());
    }
}
