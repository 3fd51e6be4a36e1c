//! The run budget: how many runs the server holds at once, how much memory
//! they may claim together, and the most one run may claim.
//!
//! A run's `memory` and `disk` are the caller's numbers (protocol §5), and
//! the runtime holds the agent to them; left at that, one caller could ask
//! for 2^64−1 bytes, or start as many runs as its connections allow, each
//! with its processes. So before a run starts it is admitted here, and the
//! [`Claim`] it gets is held until its container has stopped:
//!
//! ```text
//! memory > max_run_memory, disk > max_run_disk        refused, always
//! runs held = max_runs                                refused, try again later
//! this identity's runs = max_runs_per_identity        refused, try again later
//! memory claimed + memory > memory_budget             refused, try again later
//! ```
//!
//! Each refusal is the run's error response (kind `policy`), naming the
//! limit and its value.
//!
//! A run's loops are bounded by `max_channels` each, but an identity with
//! many runs could still hold many loops, each with its relay task and its
//! proxy path; so a loop, too, is admitted before its relay starts, and
//! its [`LoopClaim`] is held until its channel's finish:
//!
//! ```text
//! this identity's loops = max_loops_per_identity      refused, try again later
//! ```
//!
//! The refusal is the channel's error and finish (protocol §7: no loop
//! ran), kind `policy`, naming the limit. With any credential accepted
//! every caller is the same identity, and the server-wide limits are its
//! limits: the per-identity ones apply only to token identities.

use std::collections::HashMap;
use std::sync::Arc;

use runloop_proto::{ErrorKind, ErrorValue};

use super::admission::release;
use super::identity::Identity;
use super::shared::Shared;
use runloop_wire::limits::{Limit, LimitError};

/// Runs held at once unless configured otherwise.
pub const DEFAULT_MAX_RUNS: usize = 256;
/// The largest `memory` of one run unless configured otherwise: 4 GiB.
pub const DEFAULT_MAX_RUN_MEMORY: u64 = 4 << 30;
/// The largest `disk` of one run unless configured otherwise: 16 GiB.
pub const DEFAULT_MAX_RUN_DISK: u64 = 16 << 30;
/// Loops one identity holds at once unless configured otherwise: two for
/// each run it may hold (the proxy serves one loop of a run at a time, and
/// the next may be asked for while the last is ending).
pub const DEFAULT_MAX_LOOPS_PER_IDENTITY: usize = DEFAULT_MAX_RUNS / 4 * 2;
/// The memory budget when the machine's memory cannot be read: 4 GiB.
const FALLBACK_MEMORY_BUDGET: u64 = 4 << 30;

/// What runs may claim, each and together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunBudget {
    /// Runs held at once, server-wide, from their admission to their
    /// container's stop. At least one.
    pub max_runs: usize,
    /// Runs one token identity may hold at once. At least one.
    pub max_runs_per_identity: usize,
    /// Run-loop channels one token identity may have served at once, from
    /// the order to the channel's finish, over all its runs. At least one.
    pub max_loops_per_identity: usize,
    /// The largest `memory` one run may ask for, bytes. At least
    /// [`Limit::MIN_RUN_MEMORY`].
    pub max_run_memory: u64,
    /// The largest `disk` one run may ask for, bytes.
    pub max_run_disk: u64,
    /// The most the `memory` of every run held may add up to, bytes. At
    /// least [`Limit::MIN_RUN_MEMORY`].
    pub memory_budget: u64,
}

impl Default for RunBudget {
    /// [`DEFAULT_MAX_RUNS`], a quarter of them per identity,
    /// [`DEFAULT_MAX_LOOPS_PER_IDENTITY`], the default per-run maximums,
    /// and [`default_memory_budget`].
    fn default() -> Self {
        RunBudget {
            max_runs: DEFAULT_MAX_RUNS,
            max_runs_per_identity: DEFAULT_MAX_RUNS / 4,
            max_loops_per_identity: DEFAULT_MAX_LOOPS_PER_IDENTITY,
            max_run_memory: DEFAULT_MAX_RUN_MEMORY,
            max_run_disk: DEFAULT_MAX_RUN_DISK,
            memory_budget: default_memory_budget(),
        }
    }
}

impl RunBudget {
    /// Whether every limit is at least its minimum; the first that is not
    /// is the error.
    pub fn validate(&self) -> Result<(), LimitError> {
        Limit::MaxRuns.check(self.max_runs as u64)?;
        Limit::MaxRunsPerIdentity.check(self.max_runs_per_identity as u64)?;
        Limit::MaxLoopsPerIdentity.check(self.max_loops_per_identity as u64)?;
        Limit::MaxRunMemory.check(self.max_run_memory)?;
        Limit::MemoryBudget.check(self.memory_budget)
    }
}

/// Three quarters of the machine's memory (`MemTotal` in /proc/meminfo),
/// leaving the rest to the server itself and the system; 4 GiB where it
/// cannot be read.
pub fn default_memory_budget() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|meminfo| mem_total(&meminfo))
        .map_or(FALLBACK_MEMORY_BUDGET, |total| total / 4 * 3)
}

/// `MemTotal` of a /proc/meminfo, in bytes.
fn mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line
        .trim_start_matches("MemTotal:")
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

/// What the runs and loops held claim, counted under one lock.
#[derive(Debug, Default)]
pub(crate) struct Claimed {
    runs: usize,
    memory: u64,
    per_identity: HashMap<Identity, usize>,
    loops_per_identity: HashMap<Identity, usize>,
}

/// A run's admission, held until its container has stopped; dropping it
/// gives its place and its memory back.
pub(crate) struct Claim {
    shared: Arc<Shared>,
    identity: Option<Identity>,
    memory: u64,
}

impl Claim {
    /// Admits a run asking for `memory` and `disk`, served as `identity`,
    /// or says which limit refuses it.
    pub(crate) fn admit(
        shared: &Arc<Shared>,
        identity: &Identity,
        memory: u64,
        disk: u64,
    ) -> Result<Claim, ErrorValue> {
        let budget = &shared.config.budget;
        let refuse = |why: String| Err(ErrorValue::kind(ErrorKind::Policy, why));
        if memory > budget.max_run_memory {
            return refuse(format!(
                "memory {memory} is over this server's largest run memory (max_run_memory {} bytes)",
                budget.max_run_memory
            ));
        }
        if disk > budget.max_run_disk {
            return refuse(format!(
                "disk {disk} is over this server's largest run disk (max_run_disk {} bytes)",
                budget.max_run_disk
            ));
        }
        let per_identity = shared.per_identity.then(|| identity.clone());
        let mut claimed = shared.claimed();
        if claimed.runs >= budget.max_runs {
            return refuse(format!(
                "this server holds as many runs as it may (max_runs {}); try again later",
                budget.max_runs
            ));
        }
        if let Some(identity) = &per_identity {
            let held = claimed.per_identity.get(identity).copied().unwrap_or(0);
            if held >= budget.max_runs_per_identity {
                return refuse(format!(
                    "{identity} holds as many runs as one identity may (max_runs_per_identity {}); \
                     try again later",
                    budget.max_runs_per_identity
                ));
            }
        }
        if claimed.memory.saturating_add(memory) > budget.memory_budget {
            return refuse(format!(
                "memory {memory} does not fit this server's memory budget: runs hold {} of \
                 memory_budget {} bytes; try again later",
                claimed.memory, budget.memory_budget
            ));
        }
        claimed.runs += 1;
        claimed.memory += memory;
        if let Some(identity) = &per_identity {
            *claimed.per_identity.entry(identity.clone()).or_default() += 1;
        }
        drop(claimed);
        Ok(Claim {
            shared: Arc::clone(shared),
            identity: per_identity,
            memory,
        })
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut claimed = self.shared.claimed();
        claimed.runs -= 1;
        claimed.memory -= self.memory;
        if let Some(identity) = &self.identity {
            release(&mut claimed.per_identity, identity);
        }
    }
}

/// A run-loop channel's admission, held until its finish; dropping it
/// gives its identity's place back.
pub(crate) struct LoopClaim {
    /// The server and the identity, when identities are tokens; with any
    /// credential accepted nothing is counted.
    held: Option<(Arc<Shared>, Identity)>,
}

impl LoopClaim {
    /// Admits a loop of a run served as `identity`, or says that its
    /// identity holds as many as it may.
    pub(crate) fn admit(
        shared: &Arc<Shared>,
        identity: &Identity,
    ) -> Result<LoopClaim, ErrorValue> {
        if !shared.per_identity {
            return Ok(LoopClaim { held: None });
        }
        let limit = shared.config.budget.max_loops_per_identity;
        let mut claimed = shared.claimed();
        let held = claimed
            .loops_per_identity
            .get(identity)
            .copied()
            .unwrap_or(0);
        if held >= limit {
            return Err(ErrorValue::kind(
                ErrorKind::Policy,
                format!(
                    "{identity} holds as many loops as one identity may \
                     (max_loops_per_identity {limit}); try again later"
                ),
            ));
        }
        *claimed
            .loops_per_identity
            .entry(identity.clone())
            .or_default() += 1;
        drop(claimed);
        Ok(LoopClaim {
            held: Some((Arc::clone(shared), identity.clone())),
        })
    }
}

impl Drop for LoopClaim {
    fn drop(&mut self) {
        if let Some((shared, identity)) = &self.held {
            release(&mut shared.claimed().loops_per_identity, identity);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ServerConfig;
    use crate::identity::Credentials;
    use runloop_runtime::Catalog;

    #[test]
    fn mem_total_is_read_in_bytes() {
        let meminfo = "MemTotal:       24684092 kB\nMemFree:         1000 kB\n";
        assert_eq!(mem_total(meminfo), Some(24684092 * 1024));
        assert_eq!(mem_total("MemFree: 1 kB\n"), None);
        assert_eq!(mem_total("MemTotal: lots\n"), None);
    }

    /// A server's shared state with `credentials` and at most two loops
    /// per identity.
    fn two_loops_each(credentials: Credentials) -> Arc<Shared> {
        let mut config = ServerConfig::new(credentials, Catalog::new());
        config.budget.max_loops_per_identity = 2;
        Arc::new(Shared::new(config))
    }

    #[test]
    fn a_token_holds_its_loops_up_to_the_limit_and_gets_them_back() {
        let shared = two_loops_each(Credentials::Tokens(vec!["a".into(), "b".into()]));
        let accept = |token| shared.config.credentials.accept(token).expect("a token");
        let (alice, bob) = (accept("a"), accept("b"));
        let held = [
            LoopClaim::admit(&shared, &alice).expect("alice's first"),
            LoopClaim::admit(&shared, &alice).expect("alice's second"),
        ];
        let refused = LoopClaim::admit(&shared, &alice)
            .err()
            .expect("alice's third");
        assert_eq!(refused.0["kind"], "policy");
        assert_eq!(
            refused.0["error"],
            "token #1 holds as many loops as one identity may (max_loops_per_identity 2); \
             try again later"
        );
        let bobs = LoopClaim::admit(&shared, &bob).expect("bob's");
        let [first, second] = held;
        drop(first);
        let again = LoopClaim::admit(&shared, &alice).expect("alice's place is back");
        drop((second, again, bobs));
        assert!(shared.claimed().loops_per_identity.is_empty());
    }

    #[test]
    fn without_tokens_loops_are_not_counted_per_identity() {
        let shared = two_loops_each(Credentials::Any);
        let anyone = shared.config.credentials.accept("").expect("any");
        let held: Vec<LoopClaim> = (0..3)
            .map(|_| LoopClaim::admit(&shared, &anyone).expect("not limited"))
            .collect();
        assert!(shared.claimed().loops_per_identity.is_empty());
        drop(held);
    }

    #[test]
    fn the_default_budget_is_a_part_of_the_machine() {
        let budget = default_memory_budget();
        assert!(budget >= Limit::MIN_RUN_MEMORY, "{budget}");
        assert_eq!(RunBudget::default().validate(), Ok(()));
    }
}
