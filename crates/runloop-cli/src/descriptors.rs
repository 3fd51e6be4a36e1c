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
//! a run            4         the proxy's listener, the child's stdout and stderr
//!                            pipes, its pidfd
//! a loop           4         its /agent/run path (server and proxy ends), the proxy's
//!                            HTTP connection to the agent (both ends when the agent is
//!                            in-process); a run's /agent/register path before its
//!                            first loop is counted as a loop
//! a run on a       0, and 1  the /agent/* path's server end: the proxy runs elsewhere
//! proxy that runs  a loop    (when every agent of the catalog is a `proxy:` entry)
//! ```
//!
//! Loops at once are bounded by `--max-loops-per-identity` times the
//! identities the server knows (its tokens, or one when it takes any
//! credential on loopback); every run counts as at least one loop, since it
//! registers before it runs any.

use std::io;

/// Descriptors the server holds whatever its load.
pub const RESERVED: u64 = 64;
/// Descriptors one connection holds.
pub const PER_CONNECTION: u64 = 1;
/// Descriptors one run holds besides its loops.
pub const PER_RUN: u64 = 4;
/// Descriptors one loop (or a run's registration) holds.
pub const PER_LOOP: u64 = 4;
/// Descriptors one run on a proxy that already runs holds besides its
/// loops.
pub const PER_ATTACHED_RUN: u64 = 0;
/// Descriptors one loop on a proxy that already runs holds.
pub const PER_ATTACHED_LOOP: u64 = 1;

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
    /// Loops one identity may have at once (`--max-loops-per-identity`).
    pub loops_per_identity: u64,
    /// The identities the server knows.
    pub identities: u64,
    /// What a run holds: [`Holds::CONTAINER`], or [`Holds::ATTACHED`]
    /// when every agent is a proxy that already runs.
    pub holds: Holds,
}

/// Descriptors a run holds besides its loops, and each loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holds {
    /// A run, besides its loops.
    pub per_run: u64,
    /// A loop.
    pub per_loop: u64,
}

impl Holds {
    /// A run whose proxy (and agent program) the server starts.
    pub const CONTAINER: Holds = Holds {
        per_run: PER_RUN,
        per_loop: PER_LOOP,
    };
    /// A run on a proxy that already runs.
    pub const ATTACHED: Holds = Holds {
        per_run: PER_ATTACHED_RUN,
        per_loop: PER_ATTACHED_LOOP,
    };
}

impl Load {
    /// Loops at once, server-wide: every identity's, and at least one per
    /// run.
    pub fn loops(&self) -> u64 {
        self.loops_per_identity
            .saturating_mul(self.identities)
            .max(self.runs)
    }

    /// The descriptors this load needs.
    pub fn descriptors(&self) -> u64 {
        RESERVED
            .saturating_add(
                self.connections
                    .saturating_add(self.unauthorized)
                    .saturating_mul(PER_CONNECTION),
            )
            .saturating_add(self.runs.saturating_mul(self.holds.per_run))
            .saturating_add(self.loops().saturating_mul(self.holds.per_loop))
    }
}

/// Why a load does not fit in the descriptor limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "--max-connections {connections}, --max-unauthorized {unauthorized}, --max-runs {runs} and \
     --max-loops-per-identity {loops_per_identity} ({identities} {identity_word}: {loops} loops) \
     need {needed} descriptors ({PER_CONNECTION} per connection, {per_run} per run, {per_loop} \
     per loop, {RESERVED} for the server itself), but RLIMIT_NOFILE allows {limit} (the hard \
     limit): lower the limits, or raise the hard limit (ulimit -Hn as root, LimitNOFILE= in a \
     systemd unit)",
    connections = load.connections,
    unauthorized = load.unauthorized,
    runs = load.runs,
    loops_per_identity = load.loops_per_identity,
    identities = load.identities,
    identity_word = if load.identities == 1 { "identity" } else { "identities" },
    loops = load.loops(),
    per_run = load.holds.per_run,
    per_loop = load.holds.per_loop,
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
            loops_per_identity: 0,
            identities: 1,
            holds: Holds::CONTAINER,
        };
        assert_eq!(load.descriptors(), 1088);
        assert_eq!(check(load, 1088), Ok(()));
        assert_eq!(
            check(load, 1024).map_err(|e| e.to_string()),
            Err(
                "--max-connections 768, --max-unauthorized 256, --max-runs 0 and \
                 --max-loops-per-identity 0 (1 identity: 0 loops) need 1088 descriptors (1 per \
                 connection, 4 per run, 4 per loop, 64 for the server itself), but RLIMIT_NOFILE \
                 allows 1024 (the hard limit): lower the limits, or raise the hard limit (ulimit \
                 -Hn as root, LimitNOFILE= in a systemd unit)"
                    .to_owned()
            )
        );
        // Fewer loops than runs: each run still counts one.
        let with_runs = Load {
            connections: 10,
            unauthorized: 1,
            runs: 100,
            loops_per_identity: 10,
            identities: 1,
            holds: Holds::CONTAINER,
        };
        assert_eq!(with_runs.loops(), 100);
        assert_eq!(with_runs.descriptors(), 64 + 11 + 400 + 400);
        assert!(
            check(with_runs, 800)
                .expect_err("too few")
                .to_string()
                .starts_with(
                    "--max-connections 10, --max-unauthorized 1, --max-runs 100 and \
                     --max-loops-per-identity 10 (1 identity: 100 loops) need 875 descriptors"
                )
        );
        // More loops than runs: every identity's count.
        let with_loops = Load {
            loops_per_identity: 128,
            identities: 3,
            ..with_runs
        };
        assert_eq!(with_loops.loops(), 384);
        assert_eq!(with_loops.descriptors(), 64 + 11 + 400 + 4 * 384);
        assert!(
            check(with_loops, 1024)
                .expect_err("too few")
                .to_string()
                .contains("(3 identities: 384 loops) need 2011 descriptors")
        );
        let huge = Load {
            connections: u64::MAX,
            unauthorized: u64::MAX,
            runs: u64::MAX,
            loops_per_identity: u64::MAX,
            identities: u64::MAX,
            holds: Holds::CONTAINER,
        };
        assert_eq!(huge.descriptors(), u64::MAX);
        let attached = Load {
            connections: 101,
            unauthorized: 101,
            runs: 10_000,
            loops_per_identity: 10_000,
            identities: 1,
            holds: Holds::ATTACHED,
        };
        assert_eq!(attached.descriptors(), 64 + 202 + 10_000);
        assert!(
            check(attached, 10_000)
                .expect_err("too few")
                .to_string()
                .contains("(1 per connection, 0 per run, 1 per loop, 64 for the server itself)")
        );
    }
}
