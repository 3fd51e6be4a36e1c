//! Descriptors: how many the server may open (`RLIMIT_NOFILE`), raised to
//! the hard limit at startup, and whether its configured limits fit.
//!
//! A server that runs out of descriptors fails in the worst places: its
//! `accept` fails (callers wait in the backlog and never see the 1013 that
//! `--max-connections` promises), and a run's sockets or pipes cannot be
//! made. So the limits that decide how many descriptors can be open at
//! once are checked against the limit when the server starts, and a
//! configuration that cannot fit is refused, naming what it needs.
//!
//! What each thing holds, counted from the code (`/proc/PID/fd` of a
//! server with runs agrees):
//!
//! ```text
//! server itself    RESERVED  stdio, the listener, the runtime's epoll, eventfd and
//!                            signal pipe, the log thread, a container store's lock,
//!                            short-lived files (cgroup and /proc reads), headroom
//! a connection     1         its socket (authorized, or being turned away with 1013:
//!                            those are bounded by --max-unauthorized)
//! a run            8         the proxy's listener, the /agent/* path (server and proxy
//!                            ends), the proxy's HTTP connection to the agent (both ends
//!                            when the agent is in-process), the child's stdout and
//!                            stderr pipes, its pidfd
//! a run on a       1         the /agent/* path's server end: the proxy runs elsewhere
//! proxy that runs            (when every agent of the catalog is a `proxy:` entry)
//! ```

use std::io;

/// Descriptors the server holds whatever its load.
pub const RESERVED: u64 = 64;
/// Descriptors one connection holds.
pub const PER_CONNECTION: u64 = 1;
/// Descriptors one run holds, with one loop going.
pub const PER_RUN: u64 = 8;
/// Descriptors one run on a proxy that already runs holds, with one loop
/// going.
pub const PER_ATTACHED_RUN: u64 = 1;

/// What the configured limits allow at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Load {
    /// Connections (`--max-connections`).
    pub connections: u64,
    /// Connections being turned away with 1013 past `connections`, at
    /// most `--max-unauthorized`.
    pub unauthorized: u64,
    /// Runs, server-wide (`--max-runs`).
    pub runs: u64,
    /// Descriptors each run holds: [`PER_RUN`], or [`PER_ATTACHED_RUN`]
    /// when every agent is a proxy that already runs.
    pub per_run: u64,
}

impl Load {
    /// The descriptors this load needs.
    pub fn descriptors(&self) -> u64 {
        RESERVED
            .saturating_add(
                self.connections
                    .saturating_add(self.unauthorized)
                    .saturating_mul(PER_CONNECTION),
            )
            .saturating_add(self.runs.saturating_mul(self.per_run))
    }
}

/// Why a load does not fit in the descriptor limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "--max-connections {connections}, --max-unauthorized {unauthorized} and --max-runs {runs} need \
     {needed} descriptors ({PER_CONNECTION} per connection, {per_run} per run, {RESERVED} for the \
     server itself), but RLIMIT_NOFILE allows {limit} (the hard limit): lower the limits, or \
     raise the hard limit (ulimit -Hn as root, LimitNOFILE= in a systemd unit)",
    connections = load.connections,
    unauthorized = load.unauthorized,
    runs = load.runs,
    per_run = load.per_run,
    needed = load.descriptors()
)]
pub struct TooFew {
    /// The load.
    pub load: Load,
    /// The limit it does not fit in.
    pub limit: u64,
}

/// Whether `load` fits in `limit` descriptors.
pub fn check(load: Load, limit: u64) -> Result<(), TooFew> {
    if load.descriptors() <= limit {
        Ok(())
    } else {
        Err(TooFew { load, limit })
    }
}

/// Raises the soft `RLIMIT_NOFILE` to the hard one; the limit now in force.
pub fn raise() -> io::Result<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: system calls on a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == -1 {
            return Err(io::Error::last_os_error());
        }
        if limit.rlim_cur < limit.rlim_max {
            limit.rlim_cur = limit.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == -1 {
                return Err(io::Error::last_os_error());
            }
        }
    }
    Ok(limit.rlim_cur)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_load_fits_or_says_what_it_needs() {
        let load = Load {
            connections: 768,
            unauthorized: 256,
            runs: 0,
            per_run: PER_RUN,
        };
        assert_eq!(load.descriptors(), 1088);
        assert_eq!(check(load, 1088), Ok(()));
        assert_eq!(
            check(load, 1024).map_err(|e| e.to_string()),
            Err(
                "--max-connections 768, --max-unauthorized 256 and --max-runs 0 need 1088 \
                 descriptors (1 per connection, 8 per run, 64 for the server itself), but \
                 RLIMIT_NOFILE allows 1024 (the hard limit): lower the limits, or raise the hard \
                 limit (ulimit -Hn as root, LimitNOFILE= in a systemd unit)"
                    .to_owned()
            )
        );
        let with_runs = Load {
            connections: 10,
            unauthorized: 1,
            runs: 100,
            per_run: PER_RUN,
        };
        assert_eq!(with_runs.descriptors(), 64 + 11 + 800);
        assert!(
            check(with_runs, 800)
                .expect_err("too few")
                .to_string()
                .starts_with(
                    "--max-connections 10, --max-unauthorized 1 and --max-runs 100 need 875 \
                     descriptors"
                )
        );
        let huge = Load {
            connections: u64::MAX,
            unauthorized: u64::MAX,
            runs: u64::MAX,
            per_run: PER_RUN,
        };
        assert_eq!(huge.descriptors(), u64::MAX);
        let attached = Load {
            connections: 101,
            unauthorized: 101,
            runs: 10_000,
            per_run: PER_ATTACHED_RUN,
        };
        assert_eq!(attached.descriptors(), 64 + 202 + 10_000);
        assert!(
            check(attached, 10_000)
                .expect_err("too few")
                .to_string()
                .contains("(1 per connection, 1 per run, 64 for the server itself)")
        );
    }
}
