//! The processes under test: the server (or the forwarder) runs as a child
//! process, so its memory and CPU time are its own and can be read from
//! `/proc`.
//!
//! CPU time is `utime + stime` from `/proc/PID/stat`: every thread of the
//! process, user and kernel, in clock ticks (10 ms on most systems), so a
//! measured round should last a second or more; a round in which the
//! program used fewer than [`MIN_CPU_TICKS`] is reported as unmeasured
//! rather than as a figure that is mostly rounding. The whole chain's
//! paced rounds use a few milliseconds of CPU each, so there it is read
//! to the nanosecond instead: the first field of `/proc/PID/task/*/schedstat`
//! (the time each thread ran, user and kernel), summed over the threads
//! (threads that have exited are not counted, which the programs measured,
//! long-lived workers all, do not mind).

use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use tokio::process::Command;

use crate::BenchError;
use crate::mix::Mix;

/// The fewest clock ticks of CPU time a round's figure is made of (at
/// most a tenth off).
pub(crate) const MIN_CPU_TICKS: u32 = 10;

/// What the server must accept at once: the starter raises its limits
/// where their defaults are lower.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Load {
    /// Connections from the load clients.
    pub connections: usize,
    /// Runs (scopes) each connection opens.
    pub runs_per_connection: usize,
}

/// Where the server under test finds the image `bench`'s agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentSource {
    /// Behind a proxy already running at this `ws://host:port` (the
    /// synthetic proxy): the relay alone is measured.
    Proxy(String),
    /// The bench's agent program ([`agent`](crate::agent)), started by the
    /// server for each run (`exec:`) with its proxy in front: the whole
    /// chain is measured.
    Exec(Mix),
}

/// How to start the programs under test; the CLI re-runs itself.
pub trait Spawn: Send + Sync {
    /// A provider server on `listen` that accepts `token`, serves the image
    /// `bench` from `agent`, and takes `load`.
    fn server(&self, listen: SocketAddr, agent: &AgentSource, token: &str, load: Load) -> Command;
    /// The raw forwarder on `listen` in front of `upstream`.
    fn forwarder(&self, listen: SocketAddr, upstream: &str) -> Command;
    /// The bench's agent program alone, on `listen` (its `$PORT`), drawing
    /// chunk sizes from `mix`.
    fn agent(&self, listen: SocketAddr, mix: &Mix) -> Command;
}

/// A child process under test, killed when dropped.
#[derive(Debug)]
pub(crate) struct Child {
    child: tokio::process::Child,
    pid: u32,
    cpu: Cpu,
}

/// How a process's CPU time is read: in clock ticks from its `stat`, or
/// to the nanosecond from its threads' `schedstat` (see the module docs).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cpu {
    pid: u32,
    exact: bool,
}

/// The least CPU time a round's exact figure is made of.
const MIN_EXACT_CPU: Duration = Duration::from_millis(2);

impl Cpu {
    /// The CPU time the process has used so far, user and kernel, all
    /// threads.
    pub(crate) fn read(&self) -> Option<Duration> {
        if self.exact {
            return Some(Duration::from_nanos(schedstat_ns(self.pid)?));
        }
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).ok()?;
        let ticks = cpu_ticks(&stat)?;
        Some(Duration::from_secs_f64(
            ticks as f64 / clock_ticks_per_second()?,
        ))
    }

    /// The CPU time used between two readings, when it is long enough to
    /// be a figure.
    pub(crate) fn between(
        &self,
        before: Option<Duration>,
        after: Option<Duration>,
    ) -> Option<Duration> {
        let used = after?.checked_sub(before?)?;
        let least = if self.exact {
            MIN_EXACT_CPU
        } else {
            Duration::from_secs_f64(1.0 / clock_ticks_per_second()?) * MIN_CPU_TICKS
        };
        (used >= least).then_some(used)
    }
}

/// When a round's measurement starts, and the CPU time of the program in
/// the middle then: set once, by whoever knows the round has begun.
#[derive(Debug)]
pub(crate) struct Mark {
    cpu: Option<Cpu>,
    at: OnceLock<(Instant, Option<Duration>)>,
}

impl Mark {
    pub(crate) fn new(cpu: Option<Cpu>) -> Mark {
        Mark {
            cpu,
            at: OnceLock::new(),
        }
    }

    /// The round starts now (the first call counts).
    pub(crate) fn set(&self) {
        let _ = self
            .at
            .set((Instant::now(), self.cpu.as_ref().and_then(Cpu::read)));
    }

    /// When it started and the CPU time then, if it was set.
    pub(crate) fn get(&self) -> Option<(Instant, Option<Duration>)> {
        self.at.get().copied()
    }
}

/// The time the threads of `pid` have run, in nanoseconds: the first field
/// of each `/proc/PID/task/TID/schedstat`, summed.
fn schedstat_ns(pid: u32) -> Option<u64> {
    let mut total = 0u64;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let Ok(task) = task else { continue };
        // A thread that ended since the listing is not counted.
        let Ok(stat) = std::fs::read_to_string(task.path().join("schedstat")) else {
            continue;
        };
        total += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(total)
}

/// A loopback address that was free a moment ago.
pub(crate) fn free_addr() -> Result<SocketAddr, BenchError> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?)
}

impl Child {
    /// Starts `command` and waits until it accepts connections on `addr`.
    pub(crate) async fn start(command: Command, addr: SocketAddr) -> Result<Child, BenchError> {
        Child::start_with(command, addr, false).await
    }

    /// [`start`](Self::start), its CPU time read to the nanosecond when
    /// `exact`.
    pub(crate) async fn start_with(
        command: Command,
        addr: SocketAddr,
        exact: bool,
    ) -> Result<Child, BenchError> {
        let mut child = Child::spawn(command)?;
        child.cpu.exact = exact;
        loop {
            if tokio::net::TcpStream::connect(addr).await.is_ok() {
                return Ok(child);
            }
            if let Some(status) = child.child.try_wait()? {
                return Err(BenchError::Exited(format!(
                    "the program under test ({status})"
                )));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Starts `command`, its stdin and stdout closed.
    fn spawn(mut command: Command) -> Result<Child, BenchError> {
        command
            .kill_on_drop(true)
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        let child = command.spawn()?;
        let pid = child
            .id()
            .ok_or(BenchError::Exited("the program under test".into()))?;
        Ok(Child {
            child,
            pid,
            cpu: Cpu { pid, exact: false },
        })
    }

    /// How its CPU time is read.
    pub(crate) fn cpu(&self) -> Cpu {
        self.cpu
    }

    /// A `/proc/<pid>/status` figure in bytes (`VmRSS`, `VmHWM`).
    pub(crate) fn memory(&self, field: &str) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).ok()?;
        let line = status.lines().find(|line| line.starts_with(field))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    }

    /// Stops the child and reaps it.
    pub(crate) async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// `utime + stime` (fields 14 and 15) of a `/proc/PID/stat` line.
fn cpu_ticks(stat: &str) -> Option<u64> {
    // The command name (field 2) may hold spaces and parentheses; count
    // from after its closing one.
    let (_, after_name) = stat.rsplit_once(')')?;
    let mut fields = after_name.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

fn clock_ticks_per_second() -> Option<f64> {
    // SAFETY: sysconf reads a constant of the system; it has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (ticks > 0).then_some(ticks as f64)
}

/// Raises this process's soft limit on open descriptors to its hard limit
/// (children inherit it) and returns the limit now in force.
///
/// Each loop holds a socket or two in this process and in the program in
/// the middle; the usual soft limit (1024) would stop a run of a few
/// hundred loops.
pub(crate) fn raise_descriptor_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write the struct given, which
    // lives for the call.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return 1024;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit = raised;
            }
        }
    }
    limit.rlim_cur
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ticks_are_user_plus_system_time() {
        let stat = "4242 (my (odd) prog) S 1 4242 4242 0 -1 4194560 \
                    8123 0 3 0 1500 275 0 0 20 0 9 0 123 456 789";
        assert_eq!(cpu_ticks(stat), Some(1775));
        assert_eq!(cpu_ticks("4242 (prog) S 1"), None);
        let own = std::fs::read_to_string("/proc/self/stat").expect("/proc");
        assert!(cpu_ticks(&own).is_some(), "{own}");
    }

    #[tokio::test]
    async fn a_busy_child_uses_cpu_time_and_an_idle_one_none() {
        let mut spin = Command::new("sh");
        spin.args(["-c", "while :; do :; done"]);
        let mut child = Child::spawn(spin).expect("starts");
        for exact in [false, true] {
            child.cpu.exact = exact;
            let cpu = child.cpu();
            let before = cpu.read();
            assert!(before.is_some());
            let mut used = None;
            for _ in 0..100 {
                tokio::time::sleep(Duration::from_millis(100)).await;
                used = cpu.between(before, cpu.read());
                if used.is_some() {
                    break;
                }
            }
            assert!(
                used.is_some(),
                "enough CPU time within ten seconds ({exact})"
            );
            assert_eq!(
                cpu.between(before, before),
                None,
                "too little to be a figure"
            );
        }
        child.stop().await;
    }

    #[test]
    fn the_descriptor_limit_is_raised_to_the_hard_limit() {
        let limit = raise_descriptor_limit();
        let mut now = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes the struct given, which outlives the call.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut now) }, 0);
        assert_eq!(now.rlim_cur, limit);
        assert_eq!(now.rlim_cur, now.rlim_max);
    }
}
