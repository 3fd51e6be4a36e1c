//! The processes under test: the server (or the forwarder) runs as a child
//! process, so its memory and CPU time are its own and can be read from
//! `/proc`.
//!
//! CPU time is `utime + stime` from `/proc/PID/stat`: every thread of the
//! process, user and kernel, in clock ticks (10 ms on most systems), so a
//! measured round should last a second or more; a round in which the
//! program used fewer than [`MIN_CPU_TICKS`] is reported as unmeasured
//! rather than as a figure that is mostly rounding.

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;

use crate::BenchError;

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

/// How to start the programs under test; the CLI re-runs itself.
pub trait Spawn: Send + Sync {
    /// A provider server on `listen` that accepts `token`, serves the image
    /// `bench` from the proxy at `proxy` (`ws://host:port`), and takes `load`.
    fn server(&self, listen: SocketAddr, proxy: &str, token: &str, load: Load) -> Command;
    /// The raw forwarder on `listen` in front of `upstream`.
    fn forwarder(&self, listen: SocketAddr, upstream: &str) -> Command;
}

/// A child process under test, killed when dropped.
#[derive(Debug)]
pub(crate) struct Child {
    child: tokio::process::Child,
    pid: u32,
}

/// A loopback address that was free a moment ago.
pub(crate) fn free_addr() -> Result<SocketAddr, BenchError> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?)
}

impl Child {
    /// Starts `command` and waits until it accepts connections on `addr`.
    pub(crate) async fn start(command: Command, addr: SocketAddr) -> Result<Child, BenchError> {
        let mut child = Child::spawn(command)?;
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
        Ok(Child { child, pid })
    }

    /// A `/proc/<pid>/status` figure in bytes (`VmRSS`, `VmHWM`).
    pub(crate) fn memory(&self, field: &str) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).ok()?;
        let line = status.lines().find(|line| line.starts_with(field))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    }

    /// The CPU time the child has used so far, user and kernel, all threads.
    pub(crate) fn cpu_time(&self) -> Option<Duration> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).ok()?;
        let ticks = cpu_ticks(&stat)?;
        Some(Duration::from_secs_f64(
            ticks as f64 / clock_ticks_per_second()?,
        ))
    }

    /// The CPU time used between two readings of [`Child::cpu_time`], when
    /// it is long enough to be a figure.
    pub(crate) fn cpu_between(
        before: Option<Duration>,
        after: Option<Duration>,
    ) -> Option<Duration> {
        let used = after?.checked_sub(before?)?;
        let tick = Duration::from_secs_f64(1.0 / clock_ticks_per_second()?);
        (used >= tick * MIN_CPU_TICKS).then_some(used)
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
        let child = Child::spawn(spin).expect("starts");
        let before = child.cpu_time();
        assert!(before.is_some());
        let mut used = None;
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            used = Child::cpu_between(before, child.cpu_time());
            if used.is_some() {
                break;
            }
        }
        assert!(used.is_some(), "ten ticks of CPU time within ten seconds");
        assert_eq!(
            Child::cpu_between(before, before),
            None,
            "too little to be a figure"
        );
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
