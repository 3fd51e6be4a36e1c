//! The agent program's port on the host's network: handed out once, and
//! checked to belong to the run before anything is sent to it.
//!
//! On the host's network ([`ExecNetwork::Host`](super::ExecNetwork), or
//! where no namespace can be made) agent programs take a port number
//! (`$PORT`, protocol §10) and bind it themselves, so between the server's
//! choice and the child's `bind` anyone can take the port. Two things keep
//! one run from ever reaching another's agent program:
//!
//! - **Leases.** A port handed to a run is not handed to another run of
//!   this process while the first one lives, even after the child stops
//!   listening on it.
//! - **The owner check.** Before the server registers, it asks the kernel
//!   for every socket listening on the port where `127.0.0.1` reaches it
//!   (a `sock_diag` query the kernel filters to the one port:
//!   [`Diag`](crate::netns::Diag)) and requires each to be open in a
//!   process of the run (a socket inode among the `/proc/PID/fd` links of
//!   the run's processes: its cgroup's, or the child and, only when it
//!   does not hold them all, its descendants). A port someone else listens
//!   on is given up and the start is tried again on another.

use std::collections::{BTreeSet, HashSet};
use std::io;
use std::net::Ipv4Addr;
use std::sync::Mutex;

/// Ports leased to running children of this process.
static LEASED: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// A port leased to one run until this is dropped.
#[derive(Debug)]
pub(super) struct Lease(u16);

impl Lease {
    /// A loopback port no one listens on now and no run of this process
    /// holds.
    pub(super) fn take() -> io::Result<Lease> {
        for _ in 0..64 {
            let port = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
                .local_addr()?
                .port();
            let mut leased = LEASED
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            if leased.insert(port) {
                return Ok(Lease(port));
            }
        }
        Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            "64 ports in a row were already leased to runs",
        ))
    }

    /// The port.
    pub(super) fn port(&self) -> u16 {
        self.0
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        LEASED
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(&self.0);
    }
}

/// Who listens on a port, as far as `127.0.0.1` is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Listener {
    /// Nobody.
    Nobody,
    /// Only processes of the run.
    Run,
    /// Somebody else (perhaps with the run too).
    Other,
}

/// Who holds the listening sockets `inodes`, as far as the run `hold`
/// is concerned.
pub(super) fn owner(inodes: &[u32], hold: &super::Hold) -> Listener {
    if inodes.is_empty() {
        return Listener::Nobody;
    }
    let all_ours = |pids: &[u32]| {
        let ours = socket_inodes(pids);
        inodes.iter().all(|inode| ours.contains(&u64::from(*inode)))
    };
    let ours = match hold {
        super::Hold::Cgroup(cgroup) => all_ours(&cgroup.procs()),
        // The child itself first: most programs listen in it.
        super::Hold::Group(pid) => all_ours(&[*pid]) || all_ours(&descendants(*pid)),
    };
    if ours { Listener::Run } else { Listener::Other }
}

/// The inodes of the sockets the processes `pids` have open.
fn socket_inodes(pids: &[u32]) -> HashSet<u64> {
    let mut inodes = HashSet::new();
    for pid in pids {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path())
                && let Some(inode) = target
                    .to_str()
                    .and_then(|t| t.strip_prefix("socket:["))
                    .and_then(|t| t.strip_suffix(']'))
                    .and_then(|t| t.parse().ok())
            {
                inodes.insert(inode);
            }
        }
    }
    inodes
}

/// `pid` and every process descended from it (for a run without a
/// cgroup), from the parent links in `/proc/*/stat`.
pub(super) fn descendants(pid: u32) -> Vec<u32> {
    let mut parents = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(child) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let parent = std::fs::read_to_string(entry.path().join("stat"))
                .ok()
                .and_then(|stat| {
                    let (_, rest) = stat.rsplit_once(')')?;
                    rest.split_whitespace().nth(1)?.parse::<u32>().ok()
                });
            if let Some(parent) = parent {
                parents.push((child, parent));
            }
        }
    }
    let mut family = vec![pid];
    let mut grew = true;
    while grew {
        grew = false;
        for &(child, parent) in &parents {
            if family.contains(&parent) && !family.contains(&child) {
                family.push(child);
                grew = true;
            }
        }
    }
    family
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_socket_of_this_process_is_the_run_s_and_no_one_else_s() {
        let socket = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("binds");
        let port = socket.local_addr().expect("address").port();
        let diag = crate::netns::Diag::here().expect("sock_diag");
        let inodes: Vec<u32> = diag
            .listening(port)
            .expect("asked")
            .iter()
            .map(|listening| listening.inode)
            .collect();
        let own = super::super::Hold::Group(std::process::id());
        assert_eq!(owner(&inodes, &own), Listener::Run);
        // A process that holds none of them.
        let mut other = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep starts");
        let theirs = super::super::Hold::Group(other.id());
        assert_eq!(owner(&inodes, &theirs), Listener::Other);
        let _ = other.kill();
        let _ = other.wait();
        assert_eq!(owner(&[], &own), Listener::Nobody);
    }

    #[test]
    fn leases_are_not_handed_out_twice() {
        let a = Lease::take().expect("a port");
        let b = Lease::take().expect("another");
        assert_ne!(a.port(), b.port());
        let port = a.port();
        assert!(LEASED.lock().expect("lock").contains(&port));
        drop(a);
        assert!(!LEASED.lock().expect("lock").contains(&port));
    }

    #[test]
    fn this_process_descends_from_itself() {
        assert_eq!(descendants(std::process::id())[0], std::process::id());
    }
}
